"""The layer the producer, consumer and admin client share: the metadata lifecycle (bootstrap,
refreshes, re-bootstrap, waiting for topics), coordinator lookup, and sending a request to a
given broker. Its parts have modules of their own: :mod:`.bootstrap`, :mod:`.connections` (one
connection per broker), :mod:`.topics` (what is tracked), :mod:`.settings` (TLS, SASL,
socket settings), :mod:`.metadata` (the cache).

Asyncio, single loop. The synchronous APIs run it on a :class:`~kcore.network.LoopThread`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from kcore.cluster.bootstrap import first_metadata_answer, lists_usable_broker
from kcore.cluster.connections import (
    ConnectionKey,
    ConnectionPool,
    CoordinatorKey,
    broker_id,
    coordinator_connection_id,
)
from kcore.cluster.metadata import BrokerInfo, ClusterMetadata, MetadataCache
from kcore.cluster.settings import connection_settings
from kcore.cluster.statistics import StatisticsReporter
from kcore.cluster.topics import TrackedTopics
from kcore.config import ClientConfig
from kcore.errors import (
    BootstrapError,
    BrokerConnectionError,
    ErrorCode,
    InvalidTopicError,
    KcoreError,
    KcoreTimeoutError,
    TopicAuthorizationFailedError,
    error_for_code,
)
from kcore.metrics import ClientMetrics
from kcore.network.backoff import ExponentialBackoff
from kcore.network.connection import BrokerConnection
from kcore.network.events import wait_event
from kcore.network.retry import Deadline, RetryPacing, retry
from kcore.protocol import ApiKey
from kcore.protocol.messages import FindCoordinatorRequest, MetadataRequest
from kcore.protocol.messages.metadata_request import MetadataRequestTopic

__all__ = [
    "ClusterClient",
    "ConnectionKey",
    "CoordinatorKey",
    "broker_id",
    "connection_settings",
    "coordinator_connection_id",
]

log = logging.getLogger("kcore.cluster")


class ClusterClient:
    """Discovers the cluster from ``bootstrap.servers`` and keeps a connection per broker and a
    current :class:`~kcore.cluster.metadata.ClusterMetadata`.

    ``config`` is a :class:`kcore.config.ClientConfig` (or a mapping with the same keys)."""

    def __init__(
        self, config: Mapping[str, Any], *, all_topics: bool = False, auto_create: bool = False
    ) -> None:
        if not isinstance(config, ClientConfig):
            config = ClientConfig(config, role="common")
        self.config = config
        # The client's metrics: the network layer's here, the producer's or consumer's own
        # recorded by them (Producer.metrics(), Consumer.metrics()).
        self.metrics = ClientMetrics.from_config(config)
        self.metrics.declare("request", "total", "rate")
        self.metrics.declare("outgoing-byte", "total", "rate")
        self.metrics.declare("incoming-byte", "total", "rate")
        self.settings = connection_settings(config, self.metrics)
        servers = config.get("bootstrap.servers")
        if isinstance(servers, str):
            servers = [s for s in (x.strip() for x in servers.split(",")) if s]
        self.bootstrap_servers: list[str] = list(servers or [])
        self.cache = MetadataCache(config.seconds("metadata.max.age.ms"))
        self.reconnect_backoff = ExponentialBackoff(
            int(config["reconnect.backoff.ms"]), int(config["reconnect.backoff.max.ms"])
        )
        self.retry_backoff = ExponentialBackoff(
            int(config["retry.backoff.ms"]), int(config["retry.backoff.max.ms"])
        )
        self.rebootstrap = config["metadata.recovery.strategy"] == "rebootstrap"
        self.rebootstrap_trigger_s = config.seconds("metadata.recovery.rebootstrap.trigger.ms")
        self.dns_lookup = str(config["client.dns.lookup"])
        self.default_timeout_s = config.seconds("default.api.timeout.ms")
        # Topics the periodic refresh asks about; ``all_topics`` asks for every topic.
        self.all_topics = all_topics
        # Metadata requests let the broker create the topics they name (if the broker's
        # auto.create.topics.enable allows): Java's producer always asks so, its consumer per
        # allow.auto.create.topics, its admin client never.
        self.auto_create = auto_create
        self.tracked = TrackedTopics()
        self.connections = ConnectionPool(
            self.settings,
            self.cache,
            self.reconnect_backoff,
            setup_timeout_max_s=config.seconds("socket.connection.setup.timeout.max.ms"),
            idle_timeout_s=config.seconds("connections.max.idle.ms"),
            count=int(config["statistics.interval.ms"]) > 0,
        )
        # librdkafka's statistics (statistics.interval.ms > 0; the config requires stats_cb
        # then); None when off, and then nothing is counted for them anywhere.
        self.statistics: StatisticsReporter | None = None
        if int(config["statistics.interval.ms"]) > 0:
            self.statistics = StatisticsReporter(
                role=config.role,
                client_id=self.settings.client_id,
                interval_s=int(config["statistics.interval.ms"]) / 1000,
                callback=config["stats_cb"],
                pool=self.connections,
                cache=self.cache,
                metrics=self.metrics,
            )
        self.metrics.gauge("connection-count", self.connections.ready_count)
        self._refresh_task: asyncio.Task[ClusterMetadata] | None = None
        self._maintainer: asyncio.Task[None] | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()  # other refreshes under way, for close()
        self.bootstrapped = False
        self.rebootstraps = 0
        # The first bootstrap, in the background from start() until a server answers (or a
        # failure waiting cannot fix ends it); ready() waits for it. Each address's last
        # failure so far, in first-tried order: what a wait that runs out names.
        self._first_bootstrap: asyncio.Task[None] | None = None
        self._bootstrap_failures: dict[str, str] = {}
        self._bootstrap_failure_tb: TracebackType | None = None

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the first bootstrap and the background refresh, and return at once (as Java's
        clients do: nothing here waits on the network). The calls that need the cluster wait
        for it within their own bounds (:meth:`ready`)."""
        self._check_open()
        if self._first_bootstrap is None:
            task = asyncio.get_running_loop().create_task(self._bootstrap_in_background())
            # Its failure is each waiting caller's to raise; none may be waiting.
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
            self._first_bootstrap = task
        if self._maintainer is None:
            loop = asyncio.get_running_loop()
            wanted = asyncio.Event()

            def wake_maintainer() -> None:
                # request_update may come from the caller's thread (the event is not safe there).
                try:
                    on_loop = asyncio.get_running_loop() is loop
                except RuntimeError:
                    on_loop = False
                if on_loop:
                    wanted.set()
                elif not loop.is_closed():
                    loop.call_soon_threadsafe(wanted.set)

            self.cache.on_request = wake_maintainer
            self._maintainer = loop.create_task(self._maintain(wanted))
        if self.statistics is not None:
            self.statistics.start()

    async def ready(self, timeout: float | None = None) -> ClusterMetadata:
        """The cluster's metadata once the first bootstrap has succeeded, waiting for it up to
        ``timeout`` seconds (default ``default.api.timeout.ms``). Raises ``BootstrapError``
        naming each address tried and its last failure when the wait runs out, and at once the
        failure that ended the bootstrap when waiting cannot fix it (TLS trust, credentials).
        A client not started has nothing to wait for (its requests bootstrap it, as before)."""
        self._check_open()
        timeout = self._default_timeout() if timeout is None else timeout
        task = self._first_bootstrap
        if task is None:
            return self.cache.current
        if not task.done():
            await asyncio.wait({task}, timeout=max(timeout, 0.0))
        self._check_open()
        if not task.done():
            attempts = list(self._bootstrap_failures.items()) or [
                (address, f"no answer within {timeout:g}s") for address in self.bootstrap_servers
            ]
            # (the caller's bound as it was given: what is left of it reads 0.999999s)
            raise BootstrapError(attempts, round(timeout, 2))
        failure = task.exception()
        if failure is not None:
            # Raised again at every wait: from its own traceback each time (a raise adds the
            # raising frames to it, which would otherwise grow and keep them alive).
            if self._bootstrap_failure_tb is None:
                self._bootstrap_failure_tb = failure.__traceback__
            raise failure.with_traceback(self._bootstrap_failure_tb)
        return self.cache.current

    def _first_bootstrap_succeeded(self) -> bool:
        task = self._first_bootstrap
        return task is not None and task.done() and not task.cancelled() and not task.exception()

    async def _bootstrap_in_background(self) -> None:
        """Rounds over the bootstrap servers, paced by reconnect.backoff.ms, until one answers
        (or a failure waiting cannot fix; :meth:`ready` raises it to each caller)."""

        def failed(address: str, reason: str) -> None:
            self._bootstrap_failures[address] = reason  # (a dict keeps first-tried order)

        try:
            await self._bootstrap_from(None, (), failed)
        except KcoreError as exc:
            log.error("bootstrap failed for good: %s", exc)
            raise

    async def close(self) -> None:
        self._closed = True
        if self.statistics is not None:
            await self.statistics.stop()
        tasks: list[asyncio.Task[Any]] = [
            t
            for t in (self._maintainer, self._refresh_task, self._first_bootstrap)
            if t is not None
        ]
        tasks += self.connections.connecting_tasks() + list(self._tasks)
        # Cancelled until each has ended: on Python 3.11 asyncio.wait_for swallows a
        # cancellation that arrives as the awaited call finishes (a refused connect, say), and
        # the bootstrap's rounds then went on, so close() never returned.
        pending = set(tasks)
        while pending:
            for task in pending:
                task.cancel()
            _, pending = await asyncio.wait(pending, timeout=0.05)
        await asyncio.gather(*tasks, return_exceptions=True)
        self.connections.close_all()

    async def __aenter__(self) -> ClusterClient:
        await self.start()
        try:
            await self.ready()
        except BaseException:
            await self.close()  # nothing of this client keeps running
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def metadata(self) -> ClusterMetadata:
        return self.cache.current

    # The tracked topics, as the producer and the tests read and set them.
    @property
    def topics(self) -> set[str]:
        return self.tracked.names

    @property
    def topic_idle_s(self) -> float | None:
        """A producer's metadata.max.idle.ms (see :class:`~kcore.cluster.topics.TrackedTopics`)."""
        return self.tracked.idle_s

    @topic_idle_s.setter
    def topic_idle_s(self, value: float | None) -> None:
        self.tracked.idle_s = value

    @property
    def topic_in_use(self) -> Callable[[str], bool]:
        return self.tracked.in_use

    @topic_in_use.setter
    def topic_in_use(self, value: Callable[[str], bool]) -> None:
        self.tracked.in_use = value

    def _check_open(self) -> None:
        if self._closed:
            raise KcoreError("the client is closed")

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _default_timeout(self) -> float:
        return self.default_timeout_s

    # -- bootstrap --------------------------------------------------------------------------------

    async def bootstrap(
        self, timeout: float | None = None, topics: Iterable[str] | None = ()
    ) -> ClusterMetadata:
        """Ask the bootstrap servers, in random order, for the cluster's metadata until one
        answers; the brokers it lists replace the bootstrap list from then on. ``topics``:
        extra topics to ask about (``None``: all), as for :meth:`refresh_metadata`."""
        self._check_open()
        timeout = self._default_timeout() if timeout is None else timeout
        return await self._bootstrap_from(Deadline(timeout), topics)

    async def _bootstrap_from(
        self,
        deadline: Deadline | None,
        topics: Iterable[str] | None,
        on_failure: Callable[[str, str], None] | None = None,
    ) -> ClusterMetadata:
        address, response = await first_metadata_answer(
            self.bootstrap_servers,
            self.dns_lookup,
            self.settings,
            lambda conn: self.metadata_request(conn, topics),
            deadline,
            self.reconnect_backoff,
            on_failure,
            self.connections.bootstrap_counters,
        )
        await self._merge(response, all_topics=self.all_topics or topics is None)
        self.check_metadata_answer(response)
        self.bootstrapped = True
        self.connections.forget_failures()
        log.info("bootstrapped from %s: %s", address, self._brokers_text())
        return self.cache.current

    async def _merge(self, response: Any, *, all_topics: bool, partial: bool = False) -> None:
        """Merge a Metadata answer into the cache a step at a time, letting the loop run
        between steps: a 100,000-partition answer must not stall every produce and fetch for
        the time it takes (see MetadataCache.update_in_steps; a small answer is one step)."""
        for _ in self.cache.update_in_steps(response, all_topics=all_topics, partial=partial):
            await asyncio.sleep(0)

    def _brokers_text(self) -> str:
        return ", ".join(f"{b.node_id}@{b.address}" for b in self.cache.current.brokers.values())

    def metadata_request(
        self, conn: BrokerConnection, topics: Iterable[str] | None = (), named_only: bool = False
    ) -> tuple[Any, int]:
        """A Metadata request: ``topics=None`` asks for every topic, otherwise the ones named
        and the tracked ones, or with ``named_only`` the ones named only (``all_topics``
        clients always ask for all)."""
        names: list[str] | None
        if self.all_topics or topics is None:
            names = None
        elif named_only:
            names = sorted(set(topics))
        else:
            names = sorted(set(topics) | self.topics)
        version = conn.version_for(ApiKey.METADATA)
        request_topics = None if names is None else [MetadataRequestTopic(name=n) for n in names]
        return MetadataRequest(
            topics=request_topics,
            allow_auto_topic_creation=self.auto_create and names is not None,
            include_topic_authorized_operations=False,
        ), version

    def check_metadata_answer(self, response: Any) -> None:
        """Act on a Metadata answer's top-level error, whoever asked for the answer: KIP-1102's
        REBOOTSTRAP_REQUIRED (the broker tells the client to re-bootstrap) makes the next
        refresh a bootstrap."""
        if getattr(response, "error_code", ErrorCode.NONE) == ErrorCode.REBOOTSTRAP_REQUIRED:
            self.cache.request_update()
            self.bootstrapped = False

    # -- connections ------------------------------------------------------------------------------

    async def connection(self, node_id: ConnectionKey) -> BrokerConnection:
        """The ready connection to ``node_id``, opening one (after any reconnect backoff) if
        needed. Raises ``BrokerConnectionError`` if it cannot be set up."""
        self._check_open()
        return await self.connections.connection(node_id)

    def node_failed(
        self, node_id: ConnectionKey, error: BaseException, conn: BrokerConnection | None = None
    ) -> None:
        """A request to ``node_id`` failed at the connection level: see
        :meth:`ConnectionPool.node_failed`."""
        self.connections.node_failed(node_id, error, conn)

    def is_blacked_out(self, node_id: ConnectionKey) -> bool:
        return self.connections.is_blacked_out(node_id)

    def open_soon(self, node_id: ConnectionKey, on_done: Callable[[bool], None]) -> None:
        """Start opening the connection to ``node_id`` without waiting for it; ``on_done`` is
        told whether it opened (see :meth:`ConnectionPool.open_soon`)."""
        self._check_open()
        self.connections.open_soon(node_id, on_done)

    def last_failure(self, node_id: ConnectionKey) -> BaseException | None:
        """Why the connection to ``node_id`` last failed, unless it opened since."""
        return self.connections.last_failure(node_id)

    def least_loaded_node(self, exclude: Iterable[int] = ()) -> int | None:
        return self.connections.least_loaded_node(exclude)

    # -- requests ---------------------------------------------------------------------------------

    async def send(
        self,
        node_id: ConnectionKey,
        request: Any,
        version: int | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Send ``request`` to broker ``node_id`` and return the response body. A connection
        failure drops the connection, asks for a metadata refresh, and is raised."""
        conn = await self.connection(node_id)
        return await self.send_on(conn, node_id, request, version, timeout=timeout)

    async def send_on(
        self,
        conn: BrokerConnection,
        node_id: ConnectionKey,
        request: Any,
        version: int | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """As :meth:`send`, on ``conn``, the connection to ``node_id`` a caller already has
        (from :meth:`connection`: e.g. to pick the request's version from it first)."""
        try:
            return await conn.request(request, version, timeout=timeout)
        except (BrokerConnectionError, KcoreTimeoutError) as exc:
            self.node_failed(node_id, exc, conn)
            raise

    def ready_connection(self, node_id: ConnectionKey) -> BrokerConnection | None:
        """The connection to ``node_id`` if it is open and ready now (None: use
        :meth:`connection`, which opens one)."""
        conn = self.connections.current(node_id)
        return conn if conn is not None and conn.is_ready else None

    def send_now(
        self,
        conn: BrokerConnection,
        node_id: ConnectionKey,
        request: Any,
        version: int,
        on_answer: Callable[[Any, BaseException | None], None],
    ) -> bool:
        """As :meth:`send_on`, from a callback: sends ``request`` on ``conn`` if it can go
        without waiting (see :meth:`BrokerConnection.send_now`) and returns True; the answer
        or error goes to ``on_answer(body, error)``, a connection failure having been handled
        as :meth:`send_on` handles it. False: nothing was sent."""

        def answered(body: Any, error: BaseException | None) -> None:
            if isinstance(error, BrokerConnectionError | KcoreTimeoutError):
                self.node_failed(node_id, error, conn)
            on_answer(body, error)

        return conn.send_now(request, version, answered)

    async def version_for(self, node_id: ConnectionKey, api_key: int, **limits: Any) -> int:
        return (await self.connection(node_id)).version_for(api_key, **limits)

    async def finalized_features(self, node_id: ConnectionKey) -> dict[str, int]:
        """The cluster-wide finalized feature levels broker ``node_id`` advertised in its
        ApiVersions answer (e.g. ``{"transaction.version": 2, "metadata.version": 30}``)."""
        return dict((await self.connection(node_id)).finalized_features)

    # -- metadata ---------------------------------------------------------------------------------

    def add_topics(self, topics: Iterable[str], refresh: bool = True) -> None:
        """Track ``topics`` from now on: they are part of every full refresh, the next of which
        comes at once unless ``refresh`` is False (the caller fetches them itself)."""
        if self.tracked.add(topics) and refresh:
            self.cache.request_update()

    def touch_topic(self, topic: str, now: float) -> None:
        """``topic`` was written to at ``now``: tracked, and not idle (``topic_idle_s``)."""
        self.tracked.touch(topic, now)

    def _forget_idle_topics(self) -> None:
        idle = self.tracked.take_idle()
        if idle:
            log.debug("forgetting topics not written to for metadata.max.idle.ms: %s", idle)
            # Out of the cache too: its next use fetches it again, and a topic deleted
            # meanwhile is not asked about (with auto-creation on, asking would create it).
            self.cache.forget(idle)

    async def refresh_metadata(self, topics: Iterable[str] | None = ()) -> ClusterMetadata:
        """Fetch metadata now. ``()``: the tracked topics (joining a refresh of them already
        under way); ``None``: every topic; named topics: only those, merged into the cache (a
        partial refresh: as Java's producer asks about a new topic alone, KIP-526, so that a
        new topic costs neither the broker nor the wait a refresh of everything else)."""
        self._check_open()
        if topics is not None and topics != ():
            topics = list(topics)
            if not topics:
                topics = ()
        if topics == () and self._refresh_task is not None and not self._refresh_task.done():
            return await asyncio.shield(self._refresh_task)
        task = asyncio.get_running_loop().create_task(self._refresh(topics))
        if topics == ():
            self._refresh_task = task
        else:
            self._track(task)
        return await asyncio.shield(task)

    async def _refresh(self, topics: Iterable[str] | None) -> ClusterMetadata:
        """One refresh from the brokers already known; when none of them answers, and
        ``metadata.recovery.strategy`` is ``rebootstrap``, from the bootstrap list (KIP-899)."""
        if not self.bootstrapped:
            first = self._first_bootstrap
            if first is not None and not self._first_bootstrap_succeeded():
                # The first bootstrap, under way in the background (or ended by a failure
                # waiting cannot fix, which ready raises: it is not tried again on its own).
                await self.ready()
            else:
                await self.bootstrap()
        named_only = topics is not None and topics != () and not self.all_topics
        if not named_only:
            self._forget_idle_topics()
        tried: list[int] = []
        while True:
            node = self.least_loaded_node(exclude=tried)
            if node is None:
                break
            tried.append(node)
            try:
                conn = await self.connection(node)
                request, version = self.metadata_request(conn, topics, named_only)
                response = await conn.request(request, version)
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                current = self.connections.current(node)
                if current is not None:
                    self.node_failed(node, exc, current)
                log.debug("metadata from node %s failed: %s", node, exc)
                continue
            if not lists_usable_broker(response):
                # A broker still starting (or listing only addresses that cannot be dialled):
                # ask another (see bootstrap.check_brokers).
                log.debug("metadata from node %s listed no broker to connect to", node)
                continue
            await self._merge(
                response, all_topics=self.all_topics or topics is None, partial=named_only
            )
            self.check_metadata_answer(response)
            if not self.bootstrapped:
                return await self._rebootstrap(topics)
            return self.cache.current
        self.cache.refresh_failed()
        if self.rebootstrap:
            return await self._rebootstrap(topics)
        raise BrokerConnectionError(
            "cluster", "connect", "no known broker answered a metadata request"
        )

    async def _rebootstrap(self, topics: Iterable[str] | None = ()) -> ClusterMetadata:
        log.warning("no known broker answers; re-bootstrapping from %s", self.bootstrap_servers)
        self.rebootstraps += 1
        self.connections.close_all()
        self.bootstrapped = False
        return await self.bootstrap(topics=topics)

    async def wait_for_topics(
        self,
        topics: Iterable[str],
        timeout: float | None = None,
        partitions: Iterable[tuple[str, int]] | None = None,
    ) -> ClusterMetadata:
        """Refresh until every topic in ``topics`` is in the metadata with leaders for all its
        partitions, or with ``partitions`` only for those of them that exist (one partition's
        offline leader must not hold up a lookup of another's). Raises ``KcoreTimeoutError``
        naming the missing ones, and at once ``TopicAuthorizationFailedError`` naming those a
        refresh said this client may not access, ``InvalidTopicError`` those it said are not
        valid names."""
        names = set(topics)
        only: dict[str, set[int]] | None = None
        if partitions is not None:
            only = {}
            for topic, partition in partitions:  # (a TopicPartition is such a pair)
                only.setdefault(topic, set()).add(partition)
        # Tracked from now on, but fetched here, alone: a full refresh besides would be a
        # second request to wait behind.
        self.add_topics(names, refresh=False)
        with self.tracked.waiting_for(names):
            return await self._wait_for_topics(names, only, timeout)

    async def _wait_for_topics(
        self, names: set[str], only: dict[str, set[int]] | None, timeout: float | None
    ) -> ClusterMetadata:
        timeout = self._default_timeout() if timeout is None else timeout
        deadline = Deadline(timeout)
        await self.ready(deadline.remaining())
        pacing = RetryPacing(deadline, self.retry_backoff)
        asked = False
        refreshed = False  # judge authorization by an answer to this call, not an older one

        def led(topic: str, md: ClusterMetadata) -> bool:
            parts = md.topics[topic].partitions
            wanted = parts.keys() if only is None else only.get(topic, set()) & parts.keys()
            return all(parts[p].leader >= 0 for p in wanted)

        while True:
            md = self.cache.current
            missing = sorted(t for t in names if t not in md.topics or not led(t, md))
            if not missing:
                return md
            denied = [t for t in missing if t in md.unauthorized_topics]
            if refreshed and denied:
                raise TopicAuthorizationFailedError(
                    f"not authorized to access topics: {', '.join(denied)}"
                )
            invalid = [t for t in missing if t in md.invalid_topics]
            if refreshed and invalid:  # as Java's waitOnMetadata: at once, not after the wait
                raise InvalidTopicError(
                    "not valid topic names (at most 249 of a-z, A-Z, 0-9, '.', '_', '-'; "
                    f"not '.' or '..'): {', '.join(repr(t) for t in invalid)}"
                )
            if not (await pacing.pause() if asked else not deadline.expired()):
                raise KcoreTimeoutError(
                    f"topics not available within {timeout:.3g}s: {', '.join(missing)}"
                )
            asked = True
            try:
                await asyncio.wait_for(
                    self.refresh_metadata(names), max(deadline.remaining(), 0.001)
                )
                refreshed = True
            except (BrokerConnectionError, asyncio.TimeoutError):
                continue

    async def refresh_until(
        self,
        topics: Iterable[str],
        done: Callable[[ClusterMetadata], bool],
        deadline: float,
    ) -> ClusterMetadata | None:
        """Refresh the metadata of ``topics`` until ``done`` holds for a fresh answer (the
        metadata is returned) or ``deadline`` (``time.monotonic()``) passes (None),
        ``retry.backoff.ms`` apart and growing. A failed refresh is not judged (the cache may
        be older than the change waited for); a closed client raises."""
        names = list(topics)
        until = Deadline.at_time(deadline)
        pacing = RetryPacing(until, self.retry_backoff)
        with self.tracked.waiting_for(names):
            while True:
                self._check_open()
                try:
                    md = await asyncio.wait_for(
                        self.refresh_metadata(names), max(until.remaining(), 0.001)
                    )
                except (KcoreError, asyncio.TimeoutError):
                    md = None  # judged by the next answer, or the deadline
                if md is not None and done(md):
                    return md
                if not await pacing.pause():
                    return None

    async def leader_for(
        self, topic: str, partition: int, timeout: float | None = None
    ) -> BrokerInfo:
        """The current leader of ``topic``/``partition``, refreshing the metadata until there
        is one (or ``timeout``)."""
        md = await self.wait_for_topics([topic], timeout, [(topic, partition)])
        leader = md.leader_for(topic, partition)
        if leader is None:
            raise KcoreError(f"{topic} has no partition {partition}")
        return leader

    def handle_error_code(self, error_code: int) -> bool:
        """Ask for a refresh if ``error_code`` means the metadata is stale; returns whether."""
        return self.cache.handle_error(error_code)

    async def find_coordinator(
        self, key: str, key_type: int = 0, timeout: float | None = None
    ) -> BrokerInfo:
        """The coordinator broker of group ``key`` (``key_type`` 0) or transactional id (1), at
        the address the answer names (:func:`coordinator_connection_id` keys its connection),
        retrying while the broker says it is not available yet (e.g. ``__consumer_offsets``
        being created) until ``timeout`` (default ``default.api.timeout.ms``)."""
        timeout = self._default_timeout() if timeout is None else timeout
        deadline = Deadline(timeout)
        await self.ready(deadline.remaining())
        return await retry(
            f"finding the coordinator of {key!r}",
            lambda: self._find_coordinator_once(key, key_type),
            deadline=deadline,
            backoff=self.retry_backoff,
            bound_attempts=False,  # each request keeps request.timeout.ms
        )

    async def _find_coordinator_once(self, key: str, key_type: int) -> BrokerInfo:
        node = self.least_loaded_node()
        if node is None:
            await self.refresh_metadata()
            node = self.least_loaded_node()
        assert node is not None
        version = await self.version_for(node, ApiKey.FIND_COORDINATOR)
        if version >= 4:  # KIP-699: batched keys
            request = FindCoordinatorRequest(key_type=key_type, coordinator_keys=[key])
        else:
            request = FindCoordinatorRequest(key_type=key_type, key=key)
        response = await self.send(node, request, version)
        entries = getattr(response, "coordinators", None)
        if entries:
            entry = entries[0]
            code, message = entry.error_code, entry.error_message
            node_id, host, port = entry.node_id, entry.host, entry.port
        else:
            code, message = response.error_code, response.error_message
            node_id, host, port = response.node_id, response.host, response.port
        if code != ErrorCode.NONE:
            err = error_for_code(code)
            assert err is not None
            raise err.with_message(f"coordinator of {key!r}: {message or err.message}")
        # Where FindCoordinator says, as Java's client: a coordinator the metadata does not
        # list (yet) is still reached (its connection checks the address when it dials).
        return BrokerInfo(node_id, host, port)

    # -- background upkeep ------------------------------------------------------------------------

    async def _maintain(self, wanted: asyncio.Event) -> None:
        """Refresh the metadata every ``metadata.max.age.ms`` (or at once when asked to:
        ``wanted`` is set), and close connections idle for ``connections.max.idle.ms``. From
        the first bootstrap's end: until then there is nothing to refresh or close (and a
        refresh would only be a second Metadata request right behind it)."""
        if self._first_bootstrap is not None:
            await asyncio.wait({self._first_bootstrap})
            if not self._first_bootstrap_succeeded():
                return  # ended by a failure waiting cannot fix, which each call raises (ready)
        attempt = 0
        while not self._closed:
            wait = self.cache.seconds_until_update()
            if attempt:
                wait = max(wait, self.retry_backoff.backoff_s(attempt - 1))
            wanted.clear()
            if wait > 0:
                await wait_event(
                    wanted, min(wait, 1.0, max(self.connections.idle_timeout_s / 4, 0.01))
                )
            self.connections.close_idle()
            if not self.cache.needs_update():
                continue
            # At most one refresh per retry.backoff.ms, however often one is asked for.
            gap = self.cache.last_refresh_attempt + self.retry_backoff.initial_ms / 1000
            if gap > time.monotonic():
                await asyncio.sleep(gap - time.monotonic())
            try:
                await self.refresh_metadata()
                attempt = 0
            except asyncio.CancelledError:
                raise
            except KcoreError as exc:
                attempt += 1
                log.info("metadata refresh failed: %s", exc)
            except Exception:  # a bug must not stop the refreshes for good
                attempt += 1
                log.exception("metadata refresh failed unexpectedly")
            if (
                self.rebootstrap
                and time.monotonic() - self.cache.last_refresh > self.rebootstrap_trigger_s
            ):
                try:
                    await self._rebootstrap()
                except KcoreError as exc:
                    log.info("re-bootstrap failed: %s", exc)
