"""One connection per broker: opening it on demand, reconnect backoff, idle close, and the
choice of the least loaded broker.

``ConnectionPool`` owns the connections and each broker's reconnect bookkeeping; the rest of
the client goes through its methods. It reads broker addresses from the metadata cache and asks
the cache for a refresh when a broker cannot be reached (the broker may be gone, or leadership
moved).
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from functools import partial

from kcore.cluster.metadata import BrokerInfo, MetadataCache
from kcore.errors import BrokerConnectionError
from kcore.metrics import ConnectionCounters
from kcore.network.address import address_problem, format_address
from kcore.network.backoff import ExponentialBackoff
from kcore.network.connection import BrokerConnection, ConnectionSettings

__all__ = [
    "ConnectionKey",
    "ConnectionView",
    "ConnectionPool",
    "CoordinatorKey",
    "broker_id",
    "coordinator_connection_id",
]

log = logging.getLogger("kcore.cluster")


@dataclass(frozen=True, slots=True)
class CoordinatorKey:
    """The key of the connection to broker ``node_id`` kept for its coordinator role, at the
    address FindCoordinator named (``host``, ``port``).

    A coordinator gets a connection of its own, as in the Java client: on the shared one, a
    JoinGroup or heartbeat would wait behind a fetch that the broker holds for up to
    fetch.max.wait.ms, since a broker answers one request per connection at a time. A key of
    its own type, not an int: node ids are any int32 (negative for bootstrap entries), so no
    arithmetic on them can make a key that no node id equals. It carries the address because
    the coordinator is dialled where FindCoordinator says, as Java does: the metadata need not
    list it (yet)."""

    node_id: int
    host: str
    port: int

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)

    def __str__(self) -> str:
        return f"{self.node_id} at {self.address} (coordinator connection)"


# A connection's key in the pool: a broker's node id, or a coordinator connection's key.
ConnectionKey = int | CoordinatorKey


def coordinator_connection_id(coordinator: BrokerInfo) -> CoordinatorKey:
    """The key under which ``ClusterClient`` keeps the connection to ``coordinator`` (as
    FindCoordinator named it); pass it wherever a node id goes (``send``, ``connection``,
    ``version_for``)."""
    return CoordinatorKey(coordinator.node_id, coordinator.host, coordinator.port)


def broker_id(connection_id: ConnectionKey) -> int:
    """The broker a connection key (a node id, or a coordinator connection's key) leads to."""
    if isinstance(connection_id, CoordinatorKey):
        return connection_id.node_id
    return connection_id


@dataclass(frozen=True)
class ConnectionView:
    """One connection key's statistics as the pool sees them now (read-only)."""

    key: ConnectionKey | None  # None: a bootstrap server's connection
    host: str
    port: int
    counters: ConnectionCounters
    in_flight: int  # requests sent and not answered yet, on the current connection


class NodeState:
    """Reconnect bookkeeping for one broker."""

    __slots__ = ("failures", "connect_failures", "retry_at", "last_error")

    def __init__(self) -> None:
        self.failures = 0  # in a row, connecting or connected: the reconnect backoff grows
        self.connect_failures = 0  # attempts to connect in a row: the setup timeout grows
        self.retry_at = 0.0
        self.last_error: BaseException | None = None


class ConnectionPool:
    """The client's connections, by key: a broker's node id, or a coordinator connection's key
    (:func:`coordinator_connection_id`)."""

    def __init__(
        self,
        settings: ConnectionSettings,
        cache: MetadataCache,
        reconnect_backoff: ExponentialBackoff,
        *,
        setup_timeout_max_s: float,
        idle_timeout_s: float,
        count: bool = False,
    ) -> None:
        """``count``: keep :class:`ConnectionCounters` per connection key (statistics on)."""
        self.settings = settings
        self.cache = cache
        self.reconnect_backoff = reconnect_backoff
        self.setup_timeout_max_s = setup_timeout_max_s
        self.idle_timeout_s = idle_timeout_s
        self._conns: dict[ConnectionKey, BrokerConnection] = {}
        self._connecting: dict[ConnectionKey, asyncio.Task[BrokerConnection]] = {}
        self._nodes: dict[ConnectionKey, NodeState] = {}
        # Per connection key, over reconnects; None when statistics are off.
        self._counters: dict[ConnectionKey, ConnectionCounters] | None = {} if count else None
        self._addresses: dict[ConnectionKey, tuple[str, int]] = {}
        # The bootstrap servers' connections (closed once asked), by (host, port).
        self._bootstrap: dict[tuple[str, int], ConnectionCounters] = {}

    def ready_count(self) -> int:
        return sum(1 for c in list(self._conns.values()) if c.is_ready)

    def ready_connections(self) -> list[BrokerConnection]:
        return [c for c in self._conns.values() if c.is_ready]

    def current(self, node_id: ConnectionKey) -> BrokerConnection | None:
        """The connection to ``node_id`` as it is now (maybe not ready), without opening one."""
        return self._conns.get(node_id)

    async def connection(self, node_id: ConnectionKey) -> BrokerConnection:
        """The ready connection to ``node_id``, opening one (after any reconnect backoff) if
        needed. Raises ``BrokerConnectionError`` if it cannot be set up."""
        conn = self._conns.get(node_id)
        if conn is not None and conn.is_ready:
            return conn
        return await asyncio.shield(self._opening(node_id))

    def open_soon(self, node_id: ConnectionKey, on_done: Callable[[bool], None]) -> None:
        """Start opening the connection to ``node_id`` (after any reconnect backoff) unless it
        is open or being opened, without waiting for it: ``on_done(True)`` once it is ready,
        ``on_done(False)`` if the attempt failed (handled as :meth:`connection` handles it:
        backoff, metadata refresh)."""
        conn = self._conns.get(node_id)
        if conn is not None and conn.is_ready:
            asyncio.get_running_loop().call_soon(on_done, True)
            return

        def done(task: asyncio.Task[BrokerConnection]) -> None:
            on_done(not task.cancelled() and task.exception() is None)

        self._opening(node_id).add_done_callback(done)

    def _opening(self, node_id: ConnectionKey) -> asyncio.Task[BrokerConnection]:
        """The attempt to open ``node_id``'s connection under way, or a new one."""
        task = self._connecting.get(node_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._open(node_id))
            self._connecting[node_id] = task
            task.add_done_callback(partial(self._connect_done, node_id))
        return task

    def _connect_done(self, node_id: ConnectionKey, _task: asyncio.Task[BrokerConnection]) -> None:
        self._connecting.pop(node_id, None)

    def _dial_target(self, node_id: ConnectionKey) -> BrokerInfo:
        """Where the connection of ``node_id`` goes: a coordinator's to the address
        FindCoordinator named, a broker's to the one the metadata lists. Raises
        ``BrokerConnectionError`` when there is none that can be dialled (an address no DNS
        answer could make valid is never handed to the network layer)."""
        if isinstance(node_id, CoordinatorKey):
            problem = address_problem(node_id.host, node_id.port)
            if problem is not None:
                # (a metadata refresh cannot mend it: the caller finds the coordinator again)
                raise BrokerConnectionError(
                    f"node {node_id.node_id} (coordinator connection)",
                    "connect",
                    f"FindCoordinator named an address that cannot be dialled: {problem}",
                )
            return BrokerInfo(node_id.node_id, node_id.host, node_id.port)
        md = self.cache.current
        broker = md.brokers.get(node_id)
        if broker is None:
            self.cache.request_update()
            problem = md.unusable_brokers.get(node_id)
            reason = "the broker is not in the cluster metadata"
            if problem is not None:
                reason = (
                    f"the cluster metadata lists it at an address that cannot be dialled: {problem}"
                )
            raise BrokerConnectionError(f"node {node_id}", "connect", reason)
        return broker

    async def _open(self, node_id: ConnectionKey) -> BrokerConnection:
        broker = self._dial_target(node_id)
        state = self._nodes.setdefault(node_id, NodeState())
        wait = state.retry_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        old = self._conns.pop(node_id, None)
        if old is not None:
            old.close()
        counters = None
        if self._counters is not None:
            counters = self._counters.get(node_id)
            if counters is None:
                counters = self._counters[node_id] = ConnectionCounters()
            self._addresses[node_id] = (broker.host, broker.port)
        conn = BrokerConnection(
            broker.host,
            broker.port,
            self._settings_for(state.connect_failures),
            node_id=broker.node_id,
            counters=counters,
        )
        try:
            await conn.open()
        except Exception as exc:  # (a SASL callback's own error too: backed off, recorded)
            if counters is not None:
                counters.set_state("DOWN")
            state.failures += 1
            # As Java's: only failed connection attempts lengthen the next setup timeout (an
            # established connection that broke, or rejected credentials, do not).
            if isinstance(exc, BrokerConnectionError) and exc.stage in ("connect", "dns", "tls"):
                state.connect_failures += 1
            state.last_error = exc
            state.retry_at = time.monotonic() + self.reconnect_backoff.backoff_s(state.failures - 1)
            self.cache.request_update()
            raise
        state.failures = state.connect_failures = 0
        state.last_error = None
        conn.on_lost = self.cache.request_update
        self._conns[node_id] = conn
        return conn

    def _settings_for(self, failures: int) -> ConnectionSettings:
        """Java's connection setup timeout grows per failed attempt (doubling, with jitter) from
        ``socket.connection.setup.timeout.ms`` to ``socket.connection.setup.timeout.max.ms``."""
        if failures == 0 or self.setup_timeout_max_s <= self.settings.setup_timeout_s:
            return self.settings
        backoff = ExponentialBackoff(
            self.settings.setup_timeout_s * 1000, self.setup_timeout_max_s * 1000
        )
        return replace(self.settings, setup_timeout_s=backoff.backoff_s(failures))

    def node_failed(
        self, node_id: ConnectionKey, error: BaseException, conn: BrokerConnection | None = None
    ) -> None:
        """A request to ``node_id`` failed at the connection level: drop the connection and
        refresh the metadata. The requests in flight on one connection all fail together;
        only the first counts as a failure."""
        current = self._conns.get(node_id)
        if conn is not None and current is not conn:
            return  # that connection was already dropped and counted
        self._conns.pop(node_id, None)
        if current is not None:
            current.close(error)
        state = self._nodes.setdefault(node_id, NodeState())
        state.failures += 1
        state.last_error = error
        state.retry_at = time.monotonic() + self.reconnect_backoff.backoff_s(state.failures - 1)
        self.cache.request_update()

    def is_blacked_out(self, node_id: ConnectionKey) -> bool:
        state = self._nodes.get(node_id)
        return state is not None and state.retry_at > time.monotonic()

    def last_failure(self, node_id: ConnectionKey) -> BaseException | None:
        """Why the last connection to ``node_id`` failed or broke, if it has not been opened
        since (None: it has never failed, or opened again after)."""
        state = self._nodes.get(node_id)
        return state.last_error if state is not None else None

    def least_loaded_node(self, exclude: Iterable[int] = ()) -> int | None:
        """The broker to send a request that any broker can answer: a connected one with the
        fewest requests in flight, else one not in reconnect backoff, else any."""
        excluded = set(exclude)
        brokers = [n for n in self.cache.current.brokers if n not in excluded]
        if not brokers:
            return None
        random.shuffle(brokers)
        connected = [n for n in brokers if n in self._conns and self._conns[n].is_ready]
        if connected:
            return min(connected, key=lambda n: self._conns[n].in_flight)
        ready = [n for n in brokers if not self.is_blacked_out(n)]
        if ready:
            return ready[0]
        return min(brokers, key=lambda n: self._nodes[n].retry_at)

    def close_idle(self) -> None:
        """Close connections idle for ``connections.max.idle.ms``."""
        now = time.monotonic()
        for node_id, conn in list(self._conns.items()):
            if conn.in_flight == 0 and now - conn.last_active > self.idle_timeout_s:
                log.debug("closing idle connection to node %s", node_id)
                conn.close()
                del self._conns[node_id]

    def forget_failures(self) -> None:
        """A fresh start (after bootstrap): no broker is in reconnect backoff."""
        self._nodes.clear()

    def close_all(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def bootstrap_counters(self, host: str, port: int) -> ConnectionCounters | None:
        """The counters of the bootstrap server at ``host:port`` (None: statistics are off)."""
        if self._counters is None:
            return None
        counters = self._bootstrap.get((host, port))
        if counters is None:
            counters = self._bootstrap[(host, port)] = ConnectionCounters()
        return counters

    def statistics(self) -> list[ConnectionView]:
        """Every connection key dialled so far, with its counters (empty when statistics are
        off). On the event loop."""
        if self._counters is None:
            return []
        out = []
        for key, counters in self._counters.items():
            conn = self._conns.get(key)
            host, port = self._addresses[key]
            in_flight = conn.in_flight if conn is not None else 0
            out.append(ConnectionView(key, host, port, counters, in_flight))
        for (host, port), counters in self._bootstrap.items():
            out.append(ConnectionView(None, host, port, counters, 0))
        return out

    def connecting_tasks(self) -> list[asyncio.Task[BrokerConnection]]:
        return list(self._connecting.values())
