"""``CoordinatorLink``: requests to the coordinator broker of one group or transactional id,
found with FindCoordinator and found again when it moves (the article's recovery table:
NOT_COORDINATOR and COORDINATOR_NOT_AVAILABLE re-discover; COORDINATOR_LOAD_IN_PROGRESS backs
off on the same coordinator)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from kcore.cluster.client import ClusterClient, coordinator_connection_id
from kcore.cluster.metadata import BrokerInfo
from kcore.errors import BrokerConnectionError, ErrorCode, KcoreTimeoutError, error_name
from kcore.network.connection import BrokerConnection

log = logging.getLogger("kcore.coordinator")

# The coordinator moved or is gone: find it again.
REDISCOVER_CODES = frozenset({ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR})

GROUP = 0
TRANSACTION = 1


class CoordinatorLink:
    def __init__(self, cluster: ClusterClient, key: str, key_type: int = GROUP) -> None:
        self.cluster = cluster
        self.key = key
        self.key_type = key_type
        # The coordinator as the last FindCoordinator answer named it (None: look it up).
        self.coordinator: BrokerInfo | None = None
        self._lookup: asyncio.Task[BrokerInfo] | None = None

    def __repr__(self) -> str:
        kind = "group" if self.key_type == GROUP else "transactional id"
        return f"coordinator of {kind} {self.key!r} (node {self.node_id})"

    @property
    def node_id(self) -> int | None:
        return self.coordinator.node_id if self.coordinator is not None else None

    async def node(self, timeout: float | None = None) -> int:
        """The coordinator's node id, looked up once for all the callers waiting on it."""
        return (await self._coordinator(timeout)).node_id

    async def _coordinator(self, timeout: float | None = None) -> BrokerInfo:
        if self.coordinator is not None:
            return self.coordinator
        if self._lookup is None or self._lookup.done():
            self._lookup = asyncio.get_running_loop().create_task(self._find(timeout))
            # The lookup outlives a caller that was cancelled meanwhile (a close): its failure
            # then reaches no one, and is no news (asyncio would log it as never retrieved).
            self._lookup.add_done_callback(_retrieve)
        return await asyncio.shield(self._lookup)

    async def _find(self, timeout: float | None) -> BrokerInfo:
        broker = await self.cluster.find_coordinator(self.key, self.key_type, timeout)
        self.coordinator = broker
        log.debug("%r found at %s", self, broker.address)
        return broker

    def mark_dead(self, why: str) -> None:
        if self.coordinator is not None:
            log.info("%r lost: %s", self, why)
        self.coordinator = None

    def handle_error(self, code: int) -> bool:
        """Whether ``code`` is a coordinator error that a retry recovers from (re-discovering
        first when the coordinator moved)."""
        if code in REDISCOVER_CODES:
            self.mark_dead(error_name(code))
            return True
        return code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS

    async def send(
        self,
        request: Any,
        version: int | None = None,
        *,
        timeout: float | None = None,
        **limits: Any,
    ) -> Any:
        """One request to the coordinator. A connection failure forgets the coordinator (it is
        looked up again next time) and is raised."""
        conn_id = coordinator_connection_id(await self._coordinator())
        try:
            if version is None:
                version = await self.cluster.version_for(conn_id, request.API_KEY, **limits)
            started = time.monotonic()
            response = await self.cluster.send(conn_id, request, version, timeout=timeout)
            log.debug(
                "%r: %s v%d answered in %.0f ms",
                self,
                type(request).__name__,
                version,
                (time.monotonic() - started) * 1000,
            )
            return response
        except (BrokerConnectionError, KcoreTimeoutError) as exc:
            self.mark_dead(str(exc))
            raise

    async def version(self, api_key: int, **limits: Any) -> int:
        return (await self.connection()).version_for(api_key, **limits)

    async def connection(self) -> BrokerConnection:
        """The coordinator's own connection (not the one fetches and produces use)."""
        coordinator = await self._coordinator()
        try:
            return await self.cluster.connection(coordinator_connection_id(coordinator))
        except (BrokerConnectionError, KcoreTimeoutError) as exc:
            self.mark_dead(str(exc))
            raise


def _retrieve(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()
