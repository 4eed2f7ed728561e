"""The base of the AsyncAdminClient's parts (group, share group, ACL and SCRAM operations,
each a base class of it in a file of its own): what they call on the client, declared once for
the type checker."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

__all__ = ["AdminClientPart"]


class AdminClientPart:
    if TYPE_CHECKING:  # AsyncAdminClient's

        async def _retrying(
            self, what: str, attempt_fn: Callable[[], Awaitable[Any]], timeout: float | None
        ) -> Any: ...

        async def _send_any(self, build: Callable[[int], Any], api_key: int) -> Any: ...

        def _server_timeout_ms(self, deadline: float) -> int: ...

        def _timeout(self, timeout: float | None) -> float: ...

        async def _delete_groups(
            self, what: str, group_ids: Iterable[str], timeout: float | None
        ) -> None: ...
