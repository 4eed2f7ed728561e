"""The layer the producer, consumer and admin client share: bootstrap, one connection per
broker, the metadata lifecycle, and sending a request to a given broker or partition leader.

Asyncio, single loop. The synchronous APIs run it on a :class:`~kcore.network.LoopThread`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace
from functools import partial
from typing import Any

from kcore.cluster.metadata import BrokerInfo, ClusterMetadata, MetadataCache
from kcore.config import ClientConfig
from kcore.errors import (
    BootstrapError,
    BrokerConnectionError,
    ErrorCode,
    InvalidTopicError,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    TopicAuthorizationFailedError,
    error_for_code,
)
from kcore.metrics import ClientMetrics
from kcore.network.address import canonical_names, format_address, parse_address
from kcore.network.backoff import ExponentialBackoff
from kcore.network.connection import BrokerConnection, ConnectionSettings
from kcore.network.events import wait_event
from kcore.network.tls import build_ssl_context
from kcore.protocol import ApiKey
from kcore.protocol.messages import FindCoordinatorRequest, MetadataRequest
from kcore.protocol.messages.metadata_request import MetadataRequestTopic

__all__ = ["ClusterClient", "connection_settings"]

log = logging.getLogger("kcore.cluster")

# Failures that retrying cannot fix (a certificate not trusted, a name mismatch, a TLS or
# SASL setting the listener rejects): bootstrap reports them at once instead of at its timeout.
FATAL_STAGES = frozenset({"tls", "authentication"})


def connection_settings(
    config: Mapping[str, Any], metrics: ClientMetrics | None = None
) -> ConnectionSettings:
    """The per-connection settings of a client config (a :class:`kcore.config.ClientConfig`)."""
    protocol = str(config.get("security.protocol") or "PLAINTEXT").upper()
    sasl_factory = None
    sasl_prepare = None
    mechanism = None
    if protocol.startswith("SASL_") and str(config.get("sasl.mechanism")) == "OAUTHBEARER":
        from kcore.network.oauthbearer import login_from_config

        mechanism = "OAUTHBEARER"
        # One login per client: its connections share the token and its refreshes.
        login = login_from_config(config)
        sasl_factory = login.mechanism
        sasl_prepare = login.prepare
    elif protocol.startswith("SASL_"):
        from kcore.network.sasl import create_mechanism

        mechanism = str(config.get("sasl.mechanism") or "GSSAPI").upper()
        credentials = config.sasl_credentials() if hasattr(config, "sasl_credentials") else None
        if credentials is None:
            user, password = config.get("sasl.username"), config.get("sasl.password")
            credentials = (user, password) if user is not None else None
        if credentials is None:
            from kcore.errors import ConfigError

            raise ConfigError(
                "sasl.jaas.config",
                f"security.protocol {protocol} needs credentials: set sasl.username and "
                "sasl.password, or sasl.jaas.config",
            )
        user, password = str(credentials[0]), str(credentials[1])
        mech_name = mechanism

        def sasl_factory() -> Any:
            return create_mechanism(mech_name, user, password)

        sasl_factory()  # fail now on a mechanism kcore does not support, not at first connect
    return ConnectionSettings(
        client_id=str(config.get("client.id") or "kcore"),
        request_timeout_s=int(config.get("request.timeout.ms", 30000)) / 1000,
        setup_timeout_s=int(config.get("socket.connection.setup.timeout.ms", 10000)) / 1000,
        max_in_flight=int(config.get("max.in.flight.requests.per.connection", 5)),
        # Both values Java 3.0+ takes dial every address of a broker's name;
        # resolve_canonical_bootstrap_servers_only changes only how the bootstrap list expands.
        all_dns_ips=True,
        send_buffer_bytes=int(config.get("send.buffer.bytes", -1)),
        receive_buffer_bytes=int(config.get("receive.buffer.bytes", 65536)),
        ssl_context=build_ssl_context(config),
        sasl_mechanism=mechanism,
        sasl_factory=sasl_factory,
        sasl_prepare=sasl_prepare,
        metrics=metrics,
    )


class _NodeState:
    """Reconnect bookkeeping for one broker."""

    __slots__ = ("failures", "connect_failures", "retry_at", "last_error")

    def __init__(self) -> None:
        self.failures = 0  # in a row, connecting or connected: the reconnect backoff grows
        self.connect_failures = 0  # attempts to connect in a row: the setup timeout grows
        self.retry_at = 0.0
        self.last_error: BaseException | None = None


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
        self.cache = MetadataCache(int(config.get("metadata.max.age.ms", 300000)) / 1000)
        self.reconnect_backoff = ExponentialBackoff(
            int(config.get("reconnect.backoff.ms", 50)),
            int(config.get("reconnect.backoff.max.ms", 1000)),
        )
        self.retry_backoff = ExponentialBackoff(
            int(config.get("retry.backoff.ms", 100)), int(config.get("retry.backoff.max.ms", 1000))
        )
        self.idle_timeout_s = int(config.get("connections.max.idle.ms", 540000)) / 1000
        self.setup_timeout_max_s = (
            int(config.get("socket.connection.setup.timeout.max.ms", 30000)) / 1000
        )
        self.rebootstrap = config.get("metadata.recovery.strategy", "rebootstrap") == "rebootstrap"
        self.rebootstrap_trigger_s = (
            int(config.get("metadata.recovery.rebootstrap.trigger.ms", 300000)) / 1000
        )
        self.dns_lookup = str(config.get("client.dns.lookup", "use_all_dns_ips"))
        # Topics the periodic refresh asks about; ``all_topics`` asks for every topic.
        self.all_topics = all_topics
        # Metadata requests let the broker create the topics they name (if the broker's
        # auto.create.topics.enable allows): Java's producer always asks so, its consumer per
        # allow.auto.create.topics, its admin client never.
        self.auto_create = auto_create
        self.topics: set[str] = set()
        # A producer's metadata.max.idle.ms: a tracked topic not written to for that long
        # (``touch_topic``) and not ``topic_in_use`` is forgotten at the next full refresh, as
        # Java's ProducerMetadata forgets it. None: topics are tracked until the client closes.
        self.topic_idle_s: float | None = None
        self.topic_in_use: Callable[[str], bool] = lambda topic: False
        self._topic_used: dict[str, float] = {}
        self._waited_on: dict[str, int] = {}  # topics a wait_for_topics/refresh_until is for
        self._conns: dict[int, BrokerConnection] = {}
        self.metrics.gauge(
            "connection-count", lambda: sum(1 for c in list(self._conns.values()) if c.is_ready)
        )
        self._connecting: dict[int, asyncio.Task[BrokerConnection]] = {}
        self._nodes: dict[int, _NodeState] = {}
        self._refresh_task: asyncio.Task[ClusterMetadata] | None = None
        self._maintainer: asyncio.Task[None] | None = None
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()  # other refreshes under way, for close()
        self.bootstrapped = False
        self.rebootstraps = 0

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self, timeout: float | None = None) -> ClusterMetadata:
        """Bootstrap (within ``timeout`` seconds, default ``default.api.timeout.ms``) and start
        the background refresh. Raises ``BootstrapError`` when no bootstrap server answers."""
        metadata = await self.bootstrap(timeout)
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
        return metadata

    async def close(self) -> None:
        self._closed = True
        tasks: list[asyncio.Task[Any]] = [
            t for t in (self._maintainer, self._refresh_task) if t is not None
        ]
        tasks += list(self._connecting.values()) + list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    async def __aenter__(self) -> ClusterClient:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def metadata(self) -> ClusterMetadata:
        return self.cache.current

    def _check_open(self) -> None:
        if self._closed:
            raise KcoreError("the client is closed")

    def _track(self, task: asyncio.Task[Any]) -> None:
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _default_timeout(self) -> float:
        return int(self.config.get("default.api.timeout.ms", 60000)) / 1000

    # -- bootstrap --------------------------------------------------------------------------------

    async def _bootstrap_addresses(self) -> list[str]:
        addresses = list(self.bootstrap_servers)
        if self.dns_lookup == "resolve_canonical_bootstrap_servers_only":
            expanded: list[str] = []
            for address in addresses:
                host, port = parse_address(address)
                try:
                    names = await canonical_names(host, port)
                except OSError:
                    names = [host]  # the connect attempt will report the DNS failure
                expanded += [format_address(n, port) for n in names]
            addresses = expanded
        random.shuffle(addresses)  # spread clients over the list, as Java does
        return addresses

    async def bootstrap(
        self, timeout: float | None = None, topics: Iterable[str] | None = ()
    ) -> ClusterMetadata:
        """Ask the bootstrap servers, in random order, for the cluster's metadata until one
        answers; the brokers it lists replace the bootstrap list from then on. ``topics``:
        extra topics to ask about (``None``: all), as for :meth:`refresh_metadata`."""
        self._check_open()
        timeout = self._default_timeout() if timeout is None else timeout
        deadline = time.monotonic() + timeout
        attempts: list[tuple[str, str]] = []
        round_ = 0
        while True:
            # Per failure this round: whether waiting cannot fix it (TLS trust, credentials).
            fatal: list[bool] = []
            for address in await self._bootstrap_addresses():
                host, port = parse_address(address)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                conn = BrokerConnection(host, port, self.settings)
                try:
                    await asyncio.wait_for(conn.open(), remaining)
                    request, version = self._metadata_request(conn, topics)
                    # request.timeout.ms, as Java's: a server that takes the request and never
                    # answers must not use up the time the next one would have had.
                    wait = min(deadline - time.monotonic(), self.settings.request_timeout_s)
                    response = await conn.request(request, version, timeout=max(wait, 0.001))
                    _check_brokers(response, address)
                except KafkaError as exc:  # e.g. authentication failed: no point going on
                    if not exc.retriable:
                        raise
                    attempts.append((address, str(exc)))
                    fatal.append(False)
                    continue
                except (BrokerConnectionError, KcoreTimeoutError) as exc:
                    # (before TimeoutError: a KcoreTimeoutError is one, with its own reason)
                    reason = exc.reason if isinstance(exc, BrokerConnectionError) else str(exc)
                    if isinstance(exc, BrokerConnectionError):
                        reason = f"{exc.stage}: {exc.reason}"
                    fatal.append(  # (a hang-up mid-handshake is retried, as Java's)
                        isinstance(exc, BrokerConnectionError)
                        and exc.stage in FATAL_STAGES
                        and not exc.transient
                    )
                    attempts.append((address, reason))
                    log.info("bootstrap server %s failed: %s", address, reason)
                    continue
                except asyncio.TimeoutError:
                    # The deadline cut this attempt short: an earlier attempt's reason for the
                    # same address says more than "no answer" (a token source that hangs, say).
                    if not any(a == address for a, _ in attempts):
                        attempts.append((address, f"no answer within {timeout:g}s"))
                    break
                finally:
                    # Closed either way (also when cancelled): its node id is unknown until
                    # now, and the client reconnects by node id on demand.
                    conn.close()
                self.cache.update(response, all_topics=self.all_topics or topics is None)
                self._check_top_level_error(response)
                self.bootstrapped = True
                self._nodes.clear()
                log.info("bootstrapped from %s: %s", address, self._brokers_text())
                return self.cache.current
            round_ += 1
            remaining = deadline - time.monotonic()
            if fatal and all(fatal):
                raise BootstrapError(_dedupe(attempts))
            if remaining <= 0:
                raise BootstrapError(_dedupe(attempts), timeout)
            await asyncio.sleep(min(remaining, self.reconnect_backoff.backoff_s(round_)))

    def _brokers_text(self) -> str:
        return ", ".join(f"{b.node_id}@{b.address}" for b in self.cache.current.brokers.values())

    def _metadata_request(
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

    def _check_top_level_error(self, response: Any) -> None:
        # KIP-1102: the broker tells the client to re-bootstrap.
        if getattr(response, "error_code", ErrorCode.NONE) == ErrorCode.REBOOTSTRAP_REQUIRED:
            self.cache.request_update()
            self.bootstrapped = False

    # -- connections ------------------------------------------------------------------------------

    async def connection(self, node_id: int) -> BrokerConnection:
        """The ready connection to ``node_id``, opening one (after any reconnect backoff) if
        needed. Raises ``BrokerConnectionError`` if it cannot be set up."""
        self._check_open()
        conn = self._conns.get(node_id)
        if conn is not None and conn.is_ready:
            return conn
        task = self._connecting.get(node_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._open(node_id))
            self._connecting[node_id] = task
            task.add_done_callback(partial(self._connect_done, node_id))
        return await asyncio.shield(task)

    def _connect_done(self, node_id: int, _task: asyncio.Task[BrokerConnection]) -> None:
        self._connecting.pop(node_id, None)

    async def _open(self, node_id: int) -> BrokerConnection:
        broker = self.cache.current.brokers.get(broker_id(node_id))
        if broker is None:
            self.cache.request_update()
            raise BrokerConnectionError(
                f"node {node_id}", "connect", "the broker is not in the cluster metadata"
            )
        state = self._nodes.setdefault(node_id, _NodeState())
        wait = state.retry_at - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        old = self._conns.pop(node_id, None)
        if old is not None:
            old.close()
        conn = BrokerConnection(
            broker.host,
            broker.port,
            self._settings_for(state.connect_failures),
            node_id=broker.node_id,
        )
        try:
            await conn.open()
        except (BrokerConnectionError, KafkaError) as exc:
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
        self, node_id: int, error: BaseException, conn: BrokerConnection | None = None
    ) -> None:
        """A request to ``node_id`` failed at the connection level: drop the connection and
        refresh the metadata (the broker may be gone, or leadership moved). The requests in
        flight on one connection all fail together; only the first counts as a failure."""
        current = self._conns.get(node_id)
        if conn is not None and current is not conn:
            return  # that connection was already dropped and counted
        self._conns.pop(node_id, None)
        if current is not None:
            current.close(error)
        state = self._nodes.setdefault(node_id, _NodeState())
        state.failures += 1
        state.last_error = error
        state.retry_at = time.monotonic() + self.reconnect_backoff.backoff_s(state.failures - 1)
        self.cache.request_update()

    def is_blacked_out(self, node_id: int) -> bool:
        state = self._nodes.get(node_id)
        return state is not None and state.retry_at > time.monotonic()

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

    # -- requests ---------------------------------------------------------------------------------

    async def send(
        self,
        node_id: int,
        request: Any,
        version: int | None = None,
        *,
        timeout: float | None = None,
    ) -> Any:
        """Send ``request`` to broker ``node_id`` and return the response body. A connection
        failure drops the connection, asks for a metadata refresh, and is raised."""
        conn = await self.connection(node_id)
        try:
            return await conn.request(request, version, timeout=timeout)
        except (BrokerConnectionError, KcoreTimeoutError) as exc:
            self.node_failed(node_id, exc, conn)
            raise

    async def version_for(self, node_id: int, api_key: int, **limits: Any) -> int:
        return (await self.connection(node_id)).version_for(api_key, **limits)

    async def finalized_features(self, node_id: int) -> dict[str, int]:
        """The cluster-wide finalized feature levels broker ``node_id`` advertised in its
        ApiVersions answer (e.g. ``{"transaction.version": 2, "metadata.version": 30}``)."""
        return dict((await self.connection(node_id)).finalized_features)

    # -- metadata ---------------------------------------------------------------------------------

    def add_topics(self, topics: Iterable[str], refresh: bool = True) -> None:
        """Track ``topics`` from now on: they are part of every full refresh, the next of which
        comes at once unless ``refresh`` is False (the caller fetches them itself)."""
        new = set(topics) - self.topics
        if new:
            self.topics |= new
            now = time.monotonic()
            for topic in new:
                self._topic_used[topic] = now
            if refresh:
                self.cache.request_update()

    def touch_topic(self, topic: str, now: float) -> None:
        """``topic`` was written to at ``now``: tracked, and not idle (``topic_idle_s``)."""
        self._topic_used[topic] = now
        self.topics.add(topic)

    @contextlib.contextmanager
    def _waiting_for(self, topics: Iterable[str]) -> Iterator[None]:
        """Topics a wait is for are not idle while it lasts (a send waiting for a topic's
        metadata is a use, as Java's waitOnMetadata marks it), nor just after."""
        names = list(topics)
        for topic in names:
            self._waited_on[topic] = self._waited_on.get(topic, 0) + 1
        try:
            yield
        finally:
            now = time.monotonic()
            for topic in names:
                left = self._waited_on.pop(topic) - 1
                if left:
                    self._waited_on[topic] = left
                if topic in self._topic_used:
                    self._topic_used[topic] = now

    def _forget_idle_topics(self) -> None:
        if self.topic_idle_s is None:
            return
        now = time.monotonic()
        idle = [
            t
            for t in self.topics
            if now - self._topic_used.get(t, now) >= self.topic_idle_s
            and t not in self._waited_on
            and not self.topic_in_use(t)
        ]
        if not idle:
            return
        for topic in idle:
            log.debug("forgetting topic %s: not written to for metadata.max.idle.ms", topic)
            self.topics.discard(topic)
            self._topic_used.pop(topic, None)
        # Out of the cache too: its next use fetches it again, and a topic deleted meanwhile
        # is not asked about (with auto-creation on, asking would create it again).
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
                request, version = self._metadata_request(conn, topics, named_only)
                response = await conn.request(request, version)
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                if node in self._conns:
                    self.node_failed(node, exc, self._conns[node])
                log.debug("metadata from node %s failed: %s", node, exc)
                continue
            if not response.brokers:  # a broker still starting: ask another (see _check_brokers)
                log.debug("metadata from node %s listed no broker", node)
                continue
            self.cache.update(
                response, all_topics=self.all_topics or topics is None, partial=named_only
            )
            self._check_top_level_error(response)
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
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
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
        with self._waiting_for(names):
            return await self._wait_for_topics(names, only, timeout)

    async def _wait_for_topics(
        self, names: set[str], only: dict[str, set[int]] | None, timeout: float | None
    ) -> ClusterMetadata:
        timeout = self._default_timeout() if timeout is None else timeout
        deadline = time.monotonic() + timeout
        attempt = 0
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
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise KcoreTimeoutError(
                    f"topics not available within {timeout:.3g}s: {', '.join(missing)}"
                )
            if attempt:
                await asyncio.sleep(min(remaining, self.retry_backoff.backoff_s(attempt - 1)))
            attempt += 1
            try:
                await asyncio.wait_for(self.refresh_metadata(names), max(remaining, 0.001))
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
        with self._waiting_for(names):
            attempt = 0
            while True:
                remaining = deadline - time.monotonic()
                self._check_open()
                try:
                    md = await asyncio.wait_for(self.refresh_metadata(names), max(remaining, 0.001))
                except (KcoreError, asyncio.TimeoutError):
                    md = None  # judged by the next answer, or the deadline
                if md is not None and done(md):
                    return md
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                await asyncio.sleep(min(remaining, self.retry_backoff.backoff_s(attempt)))
                attempt += 1

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
        """The coordinator broker of group ``key`` (``key_type`` 0) or transactional id (1),
        retrying while the broker says it is not available yet (e.g. ``__consumer_offsets``
        being created) until ``timeout`` (default ``default.api.timeout.ms``)."""
        timeout = self._default_timeout() if timeout is None else timeout
        deadline = time.monotonic() + timeout
        attempt = 0
        while True:
            try:
                return await self._find_coordinator_once(key, key_type)
            except (KafkaError, BrokerConnectionError, KcoreTimeoutError) as exc:
                if isinstance(exc, KafkaError) and not exc.retriable:
                    raise
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise
                await asyncio.sleep(min(remaining, self.retry_backoff.backoff_s(attempt)))
                attempt += 1

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
        return self.cache.current.brokers.get(node_id) or BrokerInfo(node_id, host, port)

    # -- background upkeep ------------------------------------------------------------------------

    async def _maintain(self, wanted: asyncio.Event) -> None:
        """Refresh the metadata every ``metadata.max.age.ms`` (or at once when asked to:
        ``wanted`` is set), and close connections idle for ``connections.max.idle.ms``."""
        attempt = 0
        while not self._closed:
            wait = self.cache.seconds_until_update()
            if attempt:
                wait = max(wait, self.retry_backoff.backoff_s(attempt - 1))
            wanted.clear()
            if wait > 0:
                await wait_event(wanted, min(wait, 1.0, max(self.idle_timeout_s / 4, 0.01)))
            self._close_idle()
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

    def _close_idle(self) -> None:
        now = time.monotonic()
        for node_id, conn in list(self._conns.items()):
            if conn.in_flight == 0 and now - conn.last_active > self.idle_timeout_s:
                log.debug("closing idle connection to node %s", node_id)
                conn.close()
                del self._conns[node_id]


# A coordinator gets a connection of its own, as in the Java client (which keys it the same
# way): on the shared one, a JoinGroup or heartbeat would wait behind a fetch that the broker
# holds for up to fetch.max.wait.ms, since a broker answers one request per connection at a time.
_COORDINATOR_IDS = 2**31 - 1


def coordinator_connection_id(node_id: int) -> int:
    """The id under which ``ClusterClient`` keeps the coordinator connection to ``node_id``;
    pass it wherever a node id goes (``send``, ``connection``, ``version_for``)."""
    return _COORDINATOR_IDS - node_id


def broker_id(connection_id: int) -> int:
    """The broker a connection id (a node id, or a coordinator connection's id) leads to."""
    if connection_id > _COORDINATOR_IDS // 2:
        return _COORDINATOR_IDS - connection_id
    return connection_id


def _dedupe(attempts: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """Each address once, with its last reason, in first-tried order."""
    last: dict[str, str] = {}
    for address, reason in attempts:
        last[address] = reason
    return list(last.items())


def _check_brokers(response: Any, source: str) -> None:
    """A Metadata answer that lists no broker (one from a broker still starting) is not
    applied, as Java's NetworkClient ignores it: it would leave the client knowing nobody."""
    if not response.brokers:
        raise BrokerConnectionError(source, "metadata", "the answer listed no broker (starting?)")
