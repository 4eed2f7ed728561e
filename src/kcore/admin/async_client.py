"""The admin client's asyncio core: topics, partitions, cluster, offsets, configs, leader
elections and reassignments, on the shared :class:`~kcore.cluster.ClusterClient`.

Requests any broker can answer (KRaft brokers forward controller work) go to the least loaded
broker; ListOffsets goes to each partition's leader, DescribeConfigs of a broker to that broker.
Retriable errors (leader moved, controller changing, broker down) are retried after a metadata
refresh until ``default.api.timeout.ms``; the caller sees only what does not heal.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from kcore.admin.acls import AclOperations
from kcore.admin.groups import GroupOperations
from kcore.admin.scram import ScramOperations
from kcore.admin.share_groups import ShareGroupOperations
from kcore.admin.types import (
    CONFIG_SOURCES,
    RESOURCE_NAMES,
    RESOURCE_TYPES,
    AdminOperationError,
    ClusterDescription,
    ConfigEntry,
    ConfigResource,
    ListOffsetsResult,
    NewTopic,
    TopicDescription,
    TopicPartition,
)
from kcore.cluster.client import ClusterClient
from kcore.cluster.metadata import BrokerInfo, ClusterMetadata, PartitionInfo
from kcore.cluster.offsets import ISOLATION_LEVELS, list_offsets
from kcore.cluster.telemetry_sender import TelemetrySender
from kcore.config import ClientConfig
from kcore.errors import (
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    error_for_code,
)
from kcore.network.retry import Deadline, retry
from kcore.protocol import ApiKey
from kcore.protocol.messages import (
    AlterPartitionReassignmentsRequest,
    CreatePartitionsRequest,
    CreateTopicsRequest,
    DeleteTopicsRequest,
    DescribeClusterRequest,
    DescribeConfigsRequest,
    ElectLeadersRequest,
    IncrementalAlterConfigsRequest,
    ListPartitionReassignmentsRequest,
)
from kcore.protocol.messages.alter_partition_reassignments_request import (
    ReassignablePartition,
    ReassignableTopic,
)
from kcore.protocol.messages.create_partitions_request import (
    CreatePartitionsAssignment,
    CreatePartitionsTopic,
)
from kcore.protocol.messages.create_topics_request import (
    CreatableReplicaAssignment,
    CreatableTopic,
    CreatableTopicConfig,
)
from kcore.protocol.messages.delete_topics_request import DeleteTopicState
from kcore.protocol.messages.describe_configs_request import DescribeConfigsResource
from kcore.protocol.messages.elect_leaders_request import TopicPartitions
from kcore.protocol.messages.incremental_alter_configs_request import (
    AlterableConfig,
    AlterConfigsResource,
)
from kcore.protocol.messages.list_partition_reassignments_request import (
    ListPartitionReassignmentsTopics,
)

__all__ = ["AsyncAdminClient"]

T = TypeVar("T")

ELECTION_TYPES = {"preferred": 0, "unclean": 1}
CONFIG_OPS = {"set": 0, "delete": 1, "append": 2, "subtract": 3}


def _config_op(key: str, change: str | None | tuple[str, str | None]) -> tuple[str, str | None]:
    """(operation, value) of one ``alter_configs`` change."""
    if change is None:
        return "delete", None
    if isinstance(change, tuple):
        op, value = change
        if op not in CONFIG_OPS:
            raise KcoreError(
                f"alter_configs {key}: unknown operation {op!r} (one of {', '.join(CONFIG_OPS)})"
            )
        return op, value
    return "set", str(change)


def _admin_config(config: Mapping[str, Any]) -> ClientConfig:
    return config if isinstance(config, ClientConfig) else ClientConfig(config, role="admin")


class AsyncAdminClient(GroupOperations, ShareGroupOperations, AclOperations, ScramOperations):
    """``await AsyncAdminClient(config).start()``, or ``async with``. ``config`` uses the Java
    client's names (``bootstrap.servers``, ``request.timeout.ms``, ``security.protocol``...)."""

    def __init__(self, config: Mapping[str, Any], *, cluster: ClusterClient | None = None) -> None:
        """``cluster``: share another client's cluster connection (e.g. a consumer's, for its
        offset lookups) instead of making one."""
        self.config = cluster.config if cluster is not None else _admin_config(config)
        self.cluster = cluster if cluster is not None else ClusterClient(self.config)
        self.default_timeout = self.config.seconds("default.api.timeout.ms")
        # KIP-714 pushes, as Java's admin client: only for a cluster connection of its own (a
        # shared one belongs to the client that made it).
        self.telemetry = (
            TelemetrySender(self.cluster, "admin", self.config) if cluster is None else None
        )

    async def start(self) -> AsyncAdminClient:
        """Start bootstrapping in the background and return at once (as Java's
        ``Admin.create``); each call waits for the cluster within its own timeout."""
        await self.cluster.start()
        if self.telemetry is not None:
            self.telemetry.start()
        return self

    async def wait_until_ready(self, timeout: float | None = None) -> None:
        """Wait until the cluster has answered (the first bootstrap succeeded), for a caller who
        wants to fail fast at start-up. Raises ``BootstrapError`` naming each bootstrap address
        and why it failed, at ``timeout``, or at once when waiting cannot help (TLS trust,
        credentials). Starts the client if it was not started (a wait for nothing would say
        nothing)."""
        await self.cluster.start()
        await self.cluster.ready(self._timeout(timeout))

    async def close(self) -> None:
        if self.telemetry is not None:
            await self.telemetry.close()
        await self.cluster.close()

    async def __aenter__(self) -> AsyncAdminClient:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- retrying ---------------------------------------------------------------------------------

    async def _retrying(
        self, what: str, attempt_fn: Callable[[], Awaitable[T]], timeout: float | None
    ) -> T:
        """Run ``attempt_fn`` until it returns, retrying retriable failures with backoff and a
        metadata refresh, until ``timeout`` (default ``default.api.timeout.ms``)."""
        deadline = Deadline(self._timeout(timeout))
        await self.cluster.ready(deadline.remaining())  # BootstrapError at the call's bound
        return await retry(
            what,
            attempt_fn,
            deadline=deadline,
            backoff=self.cluster.retry_backoff,
            before_retry=lambda _exc: self.cluster.cache.request_update(),
        )

    async def _any_node(self) -> int:
        node = self.cluster.least_loaded_node()
        if node is None:
            await self.cluster.refresh_metadata()
            node = self.cluster.least_loaded_node()
            if node is None:
                raise BrokerConnectionError("cluster", "connect", "no broker is known")
        return node

    async def _send_any(self, build: Callable[[int], Any], api_key: int) -> Any:
        node = await self._any_node()
        version = await self.cluster.version_for(node, api_key)
        return await self.cluster.send(node, build(version), version)

    async def _settle(
        self,
        topics: Iterable[str],
        done: Callable[[ClusterMetadata], bool],
        deadline: float,
    ) -> None:
        """After a change the controller accepted, refresh until the brokers' metadata shows it
        (they apply it moments later), so the caller's next call sees it. Gives up quietly at
        the call's deadline, never past it: the change itself succeeded."""
        names = list(topics)
        if names and deadline > time.monotonic():
            await self.cluster.refresh_until(names, done, deadline)

    def _server_timeout_ms(self, deadline: float) -> int:
        """How long the broker may take (a request's ``timeout_ms``): at most request.timeout.ms
        and what is left of the call, as Java's; longer, the client gave up first and sent the
        request again while the first one was still being carried out."""
        limit = self.cluster.settings.request_timeout_s
        # A margin under the client's own request timeout, so that the broker's answer (even
        # REQUEST_TIMED_OUT) arrives before the client gives up on the request.
        left = min(deadline - time.monotonic(), limit - max(0.5, limit / 10))
        return max(int(left * 1000), 0)

    @staticmethod
    def _check(code: int, message: str | None, item: Any, errors: dict[Any, KafkaError]) -> bool:
        if code == ErrorCode.NONE:
            return True
        err = error_for_code(code)
        assert err is not None
        errors[item] = err.with_message(message or err.message)
        return False

    @staticmethod
    def _raise_retriable(errors: Mapping[Any, KafkaError]) -> None:
        """If every failure is worth another attempt, raise one so the call is retried."""
        if errors and all(_retry_item(e) for e in errors.values()):
            raise next(iter(errors.values()))

    # -- topics -----------------------------------------------------------------------------------

    async def create_topics(
        self,
        new_topics: Iterable[NewTopic | str],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> dict[str, TopicDescription | None]:
        """Create topics; returns ``{name: None}`` once the controller accepted them (the
        topics then show up in metadata within moments; see ``describe_topics``)."""
        topics = [t if isinstance(t, NewTopic) else NewTopic(t) for t in new_topics]
        deadline_at = self._deadline(timeout)
        pending = {t.name: t for t in topics}
        done: dict[str, TopicDescription | None] = {}
        final_errors: dict[Any, KafkaError] = {}
        timed_out: set[str] = set()  # REQUEST_TIMED_OUT: the controller may still create it

        async def attempt() -> None:
            def build(version: int) -> Any:
                return CreateTopicsRequest(
                    topics=[_creatable(t) for t in pending.values()],
                    timeout_ms=self._server_timeout_ms(deadline_at),
                    validate_only=validate_only,
                )

            try:
                response = await self._send_any(build, ApiKey.CREATE_TOPICS)
            except KcoreTimeoutError:
                timed_out.update(pending)  # the controller may be creating them still
                raise
            errors: dict[Any, KafkaError] = {}
            for result in response.topics:
                code = result.error_code
                if code == ErrorCode.TOPIC_ALREADY_EXISTS and result.name in timed_out:
                    code = 0  # created by this call's attempt that timed out at the broker
                if self._check(code, result.error_message, result.name, errors):
                    done[result.name] = None
                    pending.pop(result.name, None)
                elif code == ErrorCode.REQUEST_TIMED_OUT:
                    timed_out.add(result.name)
            retriable = {k: v for k, v in errors.items() if _retry_item(v)}
            for name, err in errors.items():
                if not _retry_item(err):
                    final_errors[name] = err
                    pending.pop(name, None)
            self._raise_retriable(retriable)

        if pending:
            await self._retrying("create_topics", attempt, timeout)
        if final_errors:
            raise AdminOperationError("create_topics", final_errors, done)
        if done and not validate_only:
            await self._settle(done, lambda md: all(_has_leaders(md, n) for n in done), deadline_at)
        return done

    async def delete_topics(self, names: Iterable[str], *, timeout: float | None = None) -> None:
        pending = list(dict.fromkeys(names))
        deadline_at = self._deadline(timeout)
        final_errors: dict[Any, KafkaError] = {}
        timed_out: set[str] = set()  # REQUEST_TIMED_OUT: the controller may still delete it

        async def attempt() -> None:
            def build(version: int) -> Any:
                if version >= 6:
                    states = [DeleteTopicState(name=n) for n in pending]
                    return DeleteTopicsRequest(
                        topics=states, timeout_ms=self._server_timeout_ms(deadline_at)
                    )
                return DeleteTopicsRequest(
                    topic_names=list(pending), timeout_ms=self._server_timeout_ms(deadline_at)
                )

            try:
                response = await self._send_any(build, ApiKey.DELETE_TOPICS)
            except KcoreTimeoutError:
                timed_out.update(pending)  # the controller may be deleting them still
                raise
            errors: dict[Any, KafkaError] = {}
            for result in response.responses:
                code = result.error_code
                if code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and result.name in timed_out:
                    code = 0  # deleted by this call's attempt that timed out at the broker
                if self._check(code, result.error_message, result.name, errors):
                    pending.remove(result.name)
                elif code == ErrorCode.REQUEST_TIMED_OUT:
                    timed_out.add(result.name)
            for name, err in list(errors.items()):
                if not _retry_item(err):
                    final_errors[name] = errors.pop(name)
                    pending.remove(name)
            self._raise_retriable(errors)

        if pending:
            await self._retrying("delete_topics", attempt, timeout)
        gone = [n for n in dict.fromkeys(names) if n not in final_errors]
        await self._settle(gone, lambda md: not any(n in md.topics for n in gone), deadline_at)
        if final_errors:
            raise AdminOperationError("delete_topics", final_errors)

    async def create_partitions(
        self,
        new_totals: Mapping[str, int],
        *,
        assignments: Mapping[str, list[list[int]]] | None = None,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Grow each topic to ``new_totals[topic]`` partitions."""
        pending = dict(new_totals)
        deadline_at = self._deadline(timeout)
        final_errors: dict[Any, KafkaError] = {}

        async def attempt() -> None:
            def build(version: int) -> Any:
                return CreatePartitionsRequest(
                    topics=[
                        CreatePartitionsTopic(
                            name=name,
                            count=count,
                            assignments=(
                                [
                                    CreatePartitionsAssignment(broker_ids=a)
                                    for a in assignments[name]
                                ]
                                if assignments and name in assignments
                                else None
                            ),
                        )
                        for name, count in pending.items()
                    ],
                    timeout_ms=self._server_timeout_ms(deadline_at),
                    validate_only=validate_only,
                )

            response = await self._send_any(build, ApiKey.CREATE_PARTITIONS)
            errors: dict[Any, KafkaError] = {}
            for result in response.results:
                if self._check(result.error_code, result.error_message, result.name, errors):
                    pending.pop(result.name, None)
            for name, err in list(errors.items()):
                if not _retry_item(err):
                    final_errors[name] = errors.pop(name)
                    pending.pop(name, None)
            self._raise_retriable(errors)

        if pending:
            await self._retrying("create_partitions", attempt, timeout)
        grown = {n: c for n, c in new_totals.items() if n not in final_errors}
        if not validate_only:
            await self._settle(
                grown,
                lambda md: all(
                    len(md.partitions_for(n)) >= c and _has_leaders(md, n) for n, c in grown.items()
                ),
                deadline_at,
            )
        if final_errors:
            raise AdminOperationError("create_partitions", final_errors)

    async def list_topics(
        self, *, include_internal: bool = False, timeout: float | None = None
    ) -> list[str]:
        async def attempt() -> list[str]:
            # As Java's listTopics: the names come from the answer; the cluster's metadata
            # cache (and its merge of every topic) is left to its own refreshes.
            response = await self._metadata_answer(None)
            return sorted(t.name for t in response.topics if include_internal or not t.is_internal)

        return await self._retrying("list_topics", attempt, timeout)

    async def _metadata_answer(self, topics: list[str] | None) -> Any:
        """A Metadata answer about ``topics`` (None: every topic) from any broker."""
        node = await self._any_node()
        conn = await self.cluster.connection(node)
        request, version = self.cluster.metadata_request(conn, topics)
        response = await self.cluster.send(node, request, version)
        code = getattr(response, "error_code", ErrorCode.NONE)
        if code != ErrorCode.NONE:
            # (KIP-1102: REBOOTSTRAP_REQUIRED) The answer is void, not an empty cluster; the
            # cluster rebootstraps before its next refresh.
            self.cluster.check_metadata_answer(response)
            err = error_for_code(code, getattr(response, "error_message", None))
            assert err is not None
            raise err.with_message(f"Metadata from node {node}: {err.message}")
        return response

    async def describe_topics(
        self, names: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, TopicDescription]:
        """Partitions, leaders, replicas and ISR of each topic. A topic that does not exist
        raises ``AdminOperationError`` (UNKNOWN_TOPIC_OR_PARTITION)."""
        wanted = list(dict.fromkeys(names))

        async def attempt() -> dict[str, TopicDescription]:
            response = await self._metadata_answer(wanted)
            out: dict[str, TopicDescription] = {}
            errors: dict[Any, KafkaError] = {}
            by_name = {t.name: t for t in response.topics}
            for name in wanted:
                t = by_name.get(name)
                if t is None:
                    continue
                if not self._check(t.error_code, None, name, errors):
                    continue
                parts = sorted(
                    (PartitionInfo.from_response(name, p) for p in t.partitions),
                    key=lambda p: p.partition,
                )
                topic_id = t.topic_id if t.topic_id and t.topic_id.int else None
                out[name] = TopicDescription(name, topic_id, bool(t.is_internal), parts)
            # A topic being created (LEADER_NOT_AVAILABLE) heals by itself: retry it. An
            # unknown topic is an answer, not a hiccup.
            self._raise_retriable(errors)
            if errors:
                raise AdminOperationError("describe_topics", errors, out)
            return out

        return await self._retrying("describe_topics", attempt, timeout)

    # -- cluster ----------------------------------------------------------------------------------

    async def describe_cluster(self, *, timeout: float | None = None) -> ClusterDescription:
        async def attempt() -> ClusterDescription:
            response = await self._send_any(
                lambda v: DescribeClusterRequest(), ApiKey.DESCRIBE_CLUSTER
            )
            if response.error_code:
                err = error_for_code(response.error_code)
                assert err is not None
                raise err.with_message(response.error_message or err.message)
            brokers = [
                BrokerInfo(b.broker_id, b.host, b.port, b.rack)
                for b in sorted(response.brokers, key=lambda b: b.broker_id)
            ]
            return ClusterDescription(response.cluster_id, response.controller_id, brokers)

        return await self._retrying("describe_cluster", attempt, timeout)

    # -- offsets ----------------------------------------------------------------------------------

    async def list_offsets(
        self,
        specs: Mapping[TopicPartition | tuple[str, int], str | int],
        *,
        isolation_level: str = "read_uncommitted",
        timeout: float | None = None,
        partial: bool = False,
    ) -> dict[TopicPartition, ListOffsetsResult]:
        """The offset each spec names, asked of each partition's leader (see
        :func:`kcore.cluster.offsets.list_offsets`): a leader that moved mid-call is found
        again and asked; partitions without a leader are retried while the others are asked at
        once. Partitions that failed raise ``AdminOperationError`` with the answers in
        ``results``. ``partial``: one round; retriable failures are raised too, not waited
        out."""
        level = ISOLATION_LEVELS[isolation_level]
        found = await list_offsets(
            self.cluster,
            specs,
            isolation_level=level,
            timeout=self._timeout(timeout),
            partial=partial,
        )
        if found.errors:
            raise AdminOperationError("list_offsets", found.errors, found.offsets)
        return found.offsets

    # -- configs ----------------------------------------------------------------------------------

    async def describe_configs(
        self, resources: Iterable[ConfigResource | tuple[str, str]], *, timeout: float | None = None
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        """Every config of each resource. Broker configs are asked of that broker (only it
        knows its static settings); topic configs of any broker."""
        wanted = [ConfigResource(*r) for r in resources]
        for r in wanted:
            if r.type not in RESOURCE_TYPES:
                raise KcoreError(f"unknown config resource type {r.type!r}")
        out: dict[ConfigResource, dict[str, ConfigEntry]] = {}
        final_errors: dict[Any, KafkaError] = {}

        async def one_node(node: int | None, group: list[ConfigResource]) -> None:
            def build(version: int) -> Any:
                return DescribeConfigsRequest(
                    resources=[
                        DescribeConfigsResource(
                            resource_type=RESOURCE_TYPES[r.type],
                            resource_name=r.name,
                            configuration_keys=None,
                        )
                        for r in group
                    ]
                )

            if node is None:
                response = await self._send_any(build, ApiKey.DESCRIBE_CONFIGS)
            else:
                version = await self.cluster.version_for(node, ApiKey.DESCRIBE_CONFIGS)
                response = await self.cluster.send(node, build(version), version)
            errors: dict[Any, KafkaError] = {}
            for result in response.results:
                resource = ConfigResource(
                    RESOURCE_NAMES[result.resource_type], result.resource_name
                )
                if self._check(result.error_code, result.error_message, resource, errors):
                    out[resource] = {
                        c.name: ConfigEntry(
                            c.name,
                            c.value,
                            CONFIG_SOURCES.get(c.config_source, "unknown"),
                            bool(c.read_only),
                            bool(c.is_sensitive),
                            c.config_source == 5,
                        )
                        for c in result.configs
                    }
            for item, err in list(errors.items()):
                if not _retry_item(err):
                    final_errors[item] = errors.pop(item)
            self._raise_retriable(errors)

        async def attempt() -> None:
            todo = [r for r in wanted if r not in out and r not in final_errors]
            groups: dict[int | None, list[ConfigResource]] = defaultdict(list)
            for r in todo:
                node = int(r.name) if r.type in ("broker", "broker_logger") and r.name else None
                groups[node].append(r)
            await asyncio.gather(*(one_node(n, g) for n, g in groups.items()))

        await self._retrying("describe_configs", attempt, timeout)
        if final_errors:
            raise AdminOperationError("describe_configs", final_errors, out)
        return out

    async def alter_configs(
        self,
        changes: Mapping[
            ConfigResource | tuple[str, str], Mapping[str, str | None | tuple[str, str | None]]
        ],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        """Incrementally change config keys of each resource (IncrementalAlterConfigs; other
        keys keep their values): a value sets the key, None deletes it (back to its default),
        and ``("append", v)`` / ``("subtract", v)`` add or remove ``v`` in a list-valued key
        (``cleanup.policy``, ``leader.replication.throttled.replicas``), as Java's
        ``AlterConfigOp`` APPEND / SUBTRACT (no read-modify-write race)."""
        wanted = {
            ConfigResource(*r): {k: _config_op(k, v) for k, v in c.items()}
            for r, c in changes.items()
        }
        final_errors: dict[Any, KafkaError] = {}
        done: set[ConfigResource] = set()

        def build_for(group: list[ConfigResource]) -> Callable[[int], Any]:
            def build(version: int) -> Any:
                return IncrementalAlterConfigsRequest(
                    resources=[
                        AlterConfigsResource(
                            resource_type=RESOURCE_TYPES[r.type],
                            resource_name=r.name,
                            configs=[
                                AlterableConfig(name=k, config_operation=CONFIG_OPS[op], value=v)
                                for k, (op, v) in wanted[r].items()
                            ],
                        )
                        for r in group
                    ],
                    validate_only=validate_only,
                )

            return build

        async def one_node(node: int | None, group: list[ConfigResource]) -> None:
            if node is None:
                response = await self._send_any(build_for(group), ApiKey.INCREMENTAL_ALTER_CONFIGS)
            else:
                version = await self.cluster.version_for(node, ApiKey.INCREMENTAL_ALTER_CONFIGS)
                response = await self.cluster.send(node, build_for(group)(version), version)
            errors: dict[Any, KafkaError] = {}
            for result in response.responses:
                resource = ConfigResource(
                    RESOURCE_NAMES[result.resource_type], result.resource_name
                )
                if self._check(result.error_code, result.error_message, resource, errors):
                    done.add(resource)
            for item, err in list(errors.items()):
                if not _retry_item(err):
                    final_errors[item] = errors.pop(item)
            self._raise_retriable(errors)

        async def attempt() -> None:
            groups: dict[int | None, list[ConfigResource]] = defaultdict(list)
            for r in wanted:
                if r in done or r in final_errors:
                    continue
                node = int(r.name) if r.type in ("broker", "broker_logger") and r.name else None
                groups[node].append(r)
            await asyncio.gather(*(one_node(n, g) for n, g in groups.items()))

        await self._retrying("alter_configs", attempt, timeout)
        if final_errors:
            raise AdminOperationError("alter_configs", final_errors)

    # -- leadership -------------------------------------------------------------------------------

    async def elect_leaders(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        *,
        election_type: str = "preferred",
        timeout: float | None = None,
    ) -> dict[TopicPartition, KafkaError | None]:
        """Run a leader election; ``None`` partitions means all. Returns each partition's
        outcome: None when elected, else the error (ELECTION_NOT_NEEDED when the preferred
        leader already leads counts as success and maps to None)."""
        if election_type not in ELECTION_TYPES:
            raise KcoreError(f"election_type must be preferred or unclean, got {election_type!r}")
        tps = None if partitions is None else [TopicPartition(*tp) for tp in partitions]
        deadline_at = self._deadline(timeout)

        def build(version: int) -> Any:
            grouped: dict[str, list[int]] | None = None
            if tps is not None:
                grouped = defaultdict(list)
                for tp in tps:
                    grouped[tp.topic].append(tp.partition)
            return ElectLeadersRequest(
                election_type=ELECTION_TYPES[election_type],
                topic_partitions=(
                    None
                    if grouped is None
                    else [TopicPartitions(topic=t, partitions=p) for t, p in grouped.items()]
                ),
                timeout_ms=self._server_timeout_ms(deadline_at),
            )

        async def attempt() -> dict[TopicPartition, KafkaError | None]:
            response = await self._send_any(build, ApiKey.ELECT_LEADERS)
            if response.error_code:
                err = error_for_code(response.error_code)
                assert err is not None
                raise err
            out: dict[TopicPartition, KafkaError | None] = {}
            for result in response.replica_election_results:
                for p in result.partition_result:
                    tp = TopicPartition(result.topic, p.partition_id)
                    if p.error_code in (ErrorCode.NONE, ErrorCode.ELECTION_NOT_NEEDED):
                        out[tp] = None
                    else:
                        err = error_for_code(p.error_code)
                        assert err is not None
                        out[tp] = err.with_message(p.error_message or err.message)
            return out

        result = await self._retrying("elect_leaders", attempt, timeout)
        self.cluster.cache.request_update()
        return result

    async def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition | tuple[str, int], list[int] | None],
        *,
        timeout: float | None = None,
    ) -> None:
        """Move each partition to the given replica list (the first replica is the preferred
        leader); ``None`` cancels an ongoing reassignment."""
        wanted = {TopicPartition(*tp): r for tp, r in reassignments.items()}
        deadline_at = self._deadline(timeout)

        def build(version: int) -> Any:
            grouped: dict[str, list[ReassignablePartition]] = defaultdict(list)
            for tp, replicas in wanted.items():
                grouped[tp.topic].append(
                    ReassignablePartition(partition_index=tp.partition, replicas=replicas)
                )
            return AlterPartitionReassignmentsRequest(
                timeout_ms=self._server_timeout_ms(deadline_at),
                topics=[ReassignableTopic(name=t, partitions=p) for t, p in grouped.items()],
            )

        async def attempt() -> None:
            response = await self._send_any(build, ApiKey.ALTER_PARTITION_REASSIGNMENTS)
            if response.error_code:
                err = error_for_code(response.error_code)
                assert err is not None
                raise err.with_message(response.error_message or err.message)
            errors: dict[Any, KafkaError] = {}
            for topic in response.responses:
                for p in topic.partitions:
                    tp = TopicPartition(topic.name, p.partition_index)
                    self._check(p.error_code, p.error_message, tp, errors)
            self._raise_retriable(errors)
            if errors:
                raise AdminOperationError("alter_partition_reassignments", errors)

        await self._retrying("alter_partition_reassignments", attempt, timeout)
        self.cluster.cache.request_update()

    async def list_partition_reassignments(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, dict[str, list[int]]]:
        """Ongoing reassignments: ``{tp: {"replicas": [...], "adding": [...], "removing":
        [...]}}``."""
        tps = None if partitions is None else [TopicPartition(*tp) for tp in partitions]

        def build(version: int) -> Any:
            topics = None
            if tps is not None:
                grouped: dict[str, list[int]] = defaultdict(list)
                for tp in tps:
                    grouped[tp.topic].append(tp.partition)
                topics = [
                    ListPartitionReassignmentsTopics(name=t, partition_indexes=p)
                    for t, p in grouped.items()
                ]
            return ListPartitionReassignmentsRequest(topics=topics)

        async def attempt() -> dict[TopicPartition, dict[str, list[int]]]:
            response = await self._send_any(build, ApiKey.LIST_PARTITION_REASSIGNMENTS)
            if response.error_code:
                err = error_for_code(response.error_code)
                assert err is not None
                raise err.with_message(response.error_message or err.message)
            return {
                TopicPartition(t.name, p.partition_index): {
                    "replicas": list(p.replicas),
                    "adding": list(p.adding_replicas),
                    "removing": list(p.removing_replicas),
                }
                for t in response.topics
                for p in t.partitions
            }

        return await self._retrying("list_partition_reassignments", attempt, timeout)


# Per-item errors worth another attempt: the controller moving, a quota, a broker still loading
# or a partition between leaders. Anything else (an unknown topic, an existing one, a bad config
# value) is the answer and fails the item at once, as in the Java admin client; the connection
# and whole-request failures are retried by _retrying.
ITEM_RETRY_CODES = frozenset(
    {
        ErrorCode.LEADER_NOT_AVAILABLE,  # a topic being created
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.THROTTLING_QUOTA_EXCEEDED,
    }
)


def _retry_item(err: KafkaError) -> bool:
    return err.code in ITEM_RETRY_CODES


def _has_leaders(md: ClusterMetadata, topic: str) -> bool:
    info = md.topics.get(topic)
    return (
        info is not None
        and bool(info.partitions)
        and all(p.leader >= 0 for p in info.partitions.values())
    )


def _creatable(topic: NewTopic) -> CreatableTopic:
    assignments = []
    partitions, replication = topic.num_partitions, topic.replication_factor
    if topic.replica_assignment:
        assignments = [
            CreatableReplicaAssignment(partition_index=p, broker_ids=list(b))
            for p, b in sorted(topic.replica_assignment.items())
        ]
        partitions, replication = -1, -1  # the assignment says both
    return CreatableTopic(
        name=topic.name,
        num_partitions=partitions,
        replication_factor=replication,
        assignments=assignments,
        configs=[CreatableTopicConfig(name=k, value=str(v)) for k, v in topic.config.items()],
    )
