"""Drives a client's KIP-714 telemetry (:class:`kcore.cluster.telemetry.ClientTelemetry`) over
its :class:`~kcore.cluster.client.ClusterClient`: one task on the client's event loop that
sleeps until the next request is due, so the send and fetch paths never do telemetry work.

The requests go to one broker, kept while it answers (KIP-714: the least loaded one; another
after a failure). A broker whose ApiVersions lacks the telemetry APIs (it has no telemetry
receiver) ends the telemetry, quietly. The metrics are those the client's ``metrics()``
returns: its metrics registry (``ClientMetrics.snapshot``) unless the client hands over a
reader of its own (the consumer's adds each partition's lag, a tagged key per partition).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from kcore.cluster.client import ClusterClient
from kcore.cluster.telemetry import ClientTelemetry, resource_attributes
from kcore.errors import KcoreError, UnsupportedVersionError
from kcore.network.retry import is_retriable
from kcore.protocol import ApiKey

__all__ = ["TelemetrySender"]

log = logging.getLogger("kcore.telemetry")

# The longest close() waits for the terminating push: to a live broker it takes milliseconds,
# and a broker that does not answer must not hold up a close (a blocking consumer's gives its
# whole closing 15 s, the group's leave up to 8 of them).
TERMINATING_PUSH_BOUND_S = 5.0


class TelemetrySender:
    """Pushes ``cluster``'s metrics as a ``kind`` client ("producer", "consumer", "admin")
    when ``enable.metrics.push`` is on in ``config``. ``read_metrics``: the client's metrics
    by key (tagged keys as :func:`kcore.metrics.metric_key` writes them), called on the
    client's event loop at each push; by default ``cluster.metrics.snapshot``."""

    def __init__(
        self,
        cluster: ClusterClient,
        kind: str,
        config: Mapping[str, Any],
        *,
        read_metrics: Callable[[], Mapping[str, float]] | None = None,
    ) -> None:
        self.cluster = cluster
        self.read_metrics = read_metrics if read_metrics is not None else cluster.metrics.snapshot
        self.enabled = bool(config.get("enable.metrics.push", True))
        self.state = ClientTelemetry(
            kind,
            resource_attributes(kind, config),
            cluster.retry_backoff,
            now=time.monotonic(),
            start_ns=time.time_ns(),
        )
        self.request_timeout_s = float(config.get("request.timeout.ms", 30000)) / 1000
        self._node: int | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start pushing (on the client's running loop); nothing when disabled."""
        if self.enabled and self._task is None and not self.state.finished:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def close(self, timeout: float | None = None) -> None:
        """Stop, after one terminating push when there is a subscription with metrics (bounded
        by ``timeout``, ``request.timeout.ms`` and ``TERMINATING_PUSH_BOUND_S``); never raises
        for a failed push."""
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        if not self.state.close(time.monotonic()):
            return
        bound = min(self.request_timeout_s, TERMINATING_PUSH_BOUND_S)
        if timeout is not None:
            bound = min(bound, timeout)
        try:
            await asyncio.wait_for(self._exchange(), max(bound, 0.0))
        except (asyncio.TimeoutError, KcoreError) as exc:
            log.debug("terminating telemetry push failed: %s", exc)
        if not self.state.finished:
            self.state.on_no_answer(time.monotonic(), "closed")

    async def _run(self) -> None:
        try:
            if not await self._wait_for_cluster():
                self.state.stop()
                return
            while True:
                wait = self.state.wait_s(time.monotonic())
                if wait is None:
                    return  # finished (or the broker has no telemetry receiver)
                if wait > 0:
                    await asyncio.sleep(wait)
                await self._exchange()
        except asyncio.CancelledError:
            raise
        except Exception:  # a bug here must not touch the client: telemetry stops
            log.exception("client telemetry stopped unexpectedly")

    async def _wait_for_cluster(self) -> bool:
        """Until the first bootstrap succeeds (True), or fails in a way waiting cannot fix
        (False: TLS trust, credentials; the client's calls raise it)."""
        pause = 0
        while True:
            try:
                await self.cluster.ready()
                return True
            except KcoreError as exc:
                if not is_retriable(exc):
                    return False
                log.debug("telemetry waits for the cluster: %s", exc)
                await asyncio.sleep(self.cluster.retry_backoff.backoff_s(pause))
                pause += 1

    def _pick_node(self) -> int | None:
        node = self._node
        if node is None or node not in self.cluster.metadata.brokers:
            node = self._node = self.cluster.least_loaded_node()
        return node

    async def _exchange(self) -> None:
        """Send the request that is due, if any, and apply its answer."""
        state = self.state
        node = self._pick_node()
        if node is None:
            state.on_no_answer(time.monotonic(), "no broker known")
            return
        try:
            conn = await self.cluster.connection(node)
        except KcoreError as exc:
            self._node = None
            state.on_no_answer(time.monotonic(), str(exc))
            return
        try:
            versions: dict[int, int] = {
                key: conn.version_for(key)
                for key in (ApiKey.GET_TELEMETRY_SUBSCRIPTIONS, ApiKey.PUSH_TELEMETRY)
            }
        except UnsupportedVersionError:
            log.debug("broker %s has no client telemetry receiver: not pushing metrics", node)
            state.stop()
            return
        request = state.next_request(time.monotonic(), time.time_ns(), self.read_metrics)
        if request is None:
            return
        assert request.API_KEY is not None
        try:
            response = await self.cluster.send(node, request, versions[request.API_KEY])
        except KcoreError as exc:
            self._node = None
            state.on_no_answer(time.monotonic(), str(exc))
            return
        state.on_response(response, time.monotonic())
