"""CoordinatorLink's shared FindCoordinator lookup, without a broker: a lookup whose callers all
left (a close cancelling them) fails without asyncio reporting an exception no one retrieved,
and a caller still waiting gets its error."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from kcore.cluster.coordinator import CoordinatorLink
from kcore.errors import KcoreError


class ClosingCluster:
    """A cluster whose FindCoordinator fails after a moment, as a closed client's does."""

    async def find_coordinator(self, key: str, key_type: int, timeout: float | None) -> Any:
        await asyncio.sleep(0.05)
        raise KcoreError("the client is closed")


def test_a_lookup_whose_callers_left_fails_quietly() -> None:
    reported: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: reported.append(ctx))
        link = CoordinatorLink(ClosingCluster(), "g")  # type: ignore[arg-type]
        waiter = asyncio.ensure_future(link.node())
        await asyncio.sleep(0.01)
        waiter.cancel()  # the lookup goes on (shielded), then fails with no one waiting
        await asyncio.sleep(0.1)
        with pytest.raises(KcoreError, match="closed"):
            await link.node()  # a new lookup, which replaces (and frees) the old one
        del link
        gc.collect()

    asyncio.run(main())
    assert reported == []
