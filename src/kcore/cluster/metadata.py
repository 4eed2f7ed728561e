"""What the client knows about the cluster: brokers, topics, partitions, leaders, replicas, ISR
and leader epochs. No I/O here: :class:`MetadataCache` takes Metadata responses and leader hints
in, and answers lookups; the cluster client decides when to ask the brokers."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, NamedTuple

from kcore.cluster._metadata_apply import partition_rows, rows_unchanged
from kcore.errors import ErrorCode
from kcore.network.address import address_problem, format_address

__all__ = [
    "STALE_METADATA_CODES",
    "BrokerInfo",
    "ClusterMetadata",
    "MetadataCache",
    "PartitionInfo",
    "TopicInfo",
    "apply_leader_hints",
]

# Error codes that mean our map of the cluster is out of date: refresh, then retry.
STALE_METADATA_CODES = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.INCONSISTENT_TOPIC_ID,
        ErrorCode.FETCH_SESSION_TOPIC_ID_ERROR,
    }
)
# As plain ints: compared with every topic of every answer.
_AUTHORIZATION_FAILED = int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
_INVALID_TOPIC = int(ErrorCode.INVALID_TOPIC_EXCEPTION)
_NO_ERROR = int(ErrorCode.NONE)
# Partitions merged per step of MetadataCache.update_in_steps: a millisecond or two of work.
STEP_ROWS = 5_000

log = logging.getLogger("kcore.cluster")


class BrokerInfo(NamedTuple):
    node_id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> str:
        return format_address(self.host, self.port)


# NamedTuples rather than frozen dataclasses: a full refresh builds one per partition, and a
# tuple is several times cheaper to make.
class PartitionInfo(NamedTuple):
    topic: str
    partition: int
    leader: int  # -1: no leader right now
    leader_epoch: int = -1
    replicas: tuple[int, ...] = ()
    isr: tuple[int, ...] = ()
    offline_replicas: tuple[int, ...] = ()
    error_code: int = 0

    @classmethod
    def from_response(cls, topic: str, p: Any) -> PartitionInfo:
        """From a ``MetadataResponsePartition``."""
        return cls(
            topic,
            p.partition_index,
            p.leader_id,
            p.leader_epoch,
            tuple(p.replica_nodes),
            tuple(p.isr_nodes),
            tuple(p.offline_replicas),
            p.error_code,
        )


@dataclass(frozen=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID | None
    partitions: Mapping[int, PartitionInfo]
    is_internal: bool = False
    error_code: int = 0


@dataclass(frozen=True)
class ClusterMetadata:
    """One immutable view of the cluster; a refresh makes a new one."""

    cluster_id: str | None = None
    controller_id: int = -1
    brokers: Mapping[int, BrokerInfo] = field(default_factory=dict)
    topics: Mapping[str, TopicInfo] = field(default_factory=dict)
    # Topics asked for by name that the broker answered with TOPIC_AUTHORIZATION_FAILED.
    unauthorized_topics: frozenset[str] = frozenset()
    # ... and with INVALID_TOPIC_EXCEPTION (a name Kafka does not allow).
    invalid_topics: frozenset[str] = frozenset()
    # Brokers listed with an address no connection can be made to (a port outside 0-65535, a
    # host name IDNA rejects), by node id, with the reason: left out of ``brokers``, so that
    # nothing dials them and a partition they lead waits for a leader as with an offline one.
    unusable_brokers: Mapping[int, str] = field(default_factory=dict)

    def partition(self, topic: str, partition: int) -> PartitionInfo | None:
        info = self.topics.get(topic)
        return info.partitions.get(partition) if info is not None else None

    def leader_for(self, topic: str, partition: int) -> BrokerInfo | None:
        """The leader's broker, or None when there is no leader or it is not a known broker."""
        part = self.partition(topic, partition)
        if part is None or part.leader < 0:
            return None
        return self.brokers.get(part.leader)

    def partitions_for(self, topic: str) -> list[int]:
        info = self.topics.get(topic)
        return sorted(info.partitions) if info is not None else []

    def topic_names(self) -> list[str]:
        return sorted(self.topics)

    @cached_property
    def topic_names_by_id(self) -> Mapping[uuid.UUID, str]:
        """The names of the topics that have an id, by id: made once a snapshot, for answers
        that name topics by id alone (Produce and Fetch v13+), instead of once an answer."""
        return {t.topic_id: name for name, t in self.topics.items() if t.topic_id}


class _Steps:
    """How much of an answer a merge handles between two turns of the caller's loop: about
    ``step_rows`` partitions (None: everything at once), each topic counting one more."""

    def __init__(self, step_rows: int | None) -> None:
        self.step_rows = step_rows
        self.left = step_rows

    def end(self, start: int, count: int) -> int:
        """Where the step that starts at partition ``start`` of ``count`` ends."""
        return count if self.left is None else min(count, start + self.left)

    def spend(self, partitions: int) -> bool:
        """Count a step of ``partitions`` done; whether the merge yields now."""
        if self.left is None or self.step_rows is None:
            return False
        self.left -= partitions + 1  # (+1: a topic's own cost)
        if self.left > 0:
            return False
        self.left = self.step_rows
        return True


def _result(generator: Generator[None, None, Any]) -> Any:
    """The return value of a generator run to its end."""
    try:
        while True:
            next(generator)
    except StopIteration as stop:
        return stop.value


# Topic ids compared by value without uuid.UUID's Python-level __eq__ (several per topic of
# every answer otherwise).
def _uuid_set(u: uuid.UUID | None) -> bool:
    """Not None and not the all-zero id (an answer's "no id")."""
    return u is not None and u.int != 0


def _same_uuid(a: uuid.UUID | None, b: uuid.UUID | None, *, unset_matches: bool = False) -> bool:
    if a is b:
        return True
    if a is None or b is None:
        return unset_matches
    return bool(a.int == b.int)


class MetadataCache:
    """The client's current :class:`ClusterMetadata` plus the bookkeeping of when to refresh.

    Partition updates whose leader epoch is older than what the cache holds are ignored (the
    broker that answered was behind), as in the Java client."""

    def __init__(self, max_age_s: float = 300.0) -> None:
        self.max_age_s = max_age_s
        self.current = ClusterMetadata()
        self.last_refresh = 0.0  # monotonic time of the last successful refresh
        self.last_refresh_attempt = 0.0
        self.updates = 0  # answers merged so far, partial ones too
        self._update_requested = True
        # Called after each update (on the client's event loop), so work that waits for a
        # leader, like the fetcher, goes on at once rather than at its next timer.
        self.on_update: list[Callable[[], None]] = []
        # Called (from any thread) when an update is requested: wakes the refresher.
        self.on_request: Callable[[], None] | None = None
        # Unusable broker entries already logged, (node id, host, port): once each.
        self._reported_unusable: set[tuple[int, str, int]] = set()
        # address_problem of each (host, port) seen: the same few in every answer.
        self._address_problems: dict[tuple[str, int], str | None] = {}

    # -- when to refresh --------------------------------------------------------------------------

    def request_update(self) -> None:
        """Something showed the map is stale: refresh at the next opportunity."""
        self._update_requested = True
        if self.on_request is not None:
            self.on_request()

    @property
    def update_requested(self) -> bool:
        return self._update_requested

    def needs_update(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return self._update_requested or now - self.last_refresh >= self.max_age_s

    def seconds_until_update(self, now: float | None = None) -> float:
        now = time.monotonic() if now is None else now
        if self._update_requested:
            return 0.0
        return max(0.0, self.last_refresh + self.max_age_s - now)

    def refresh_failed(self, now: float | None = None) -> None:
        self.last_refresh_attempt = time.monotonic() if now is None else now

    # -- updates ----------------------------------------------------------------------------------

    def update(
        self, response: Any, *, all_topics: bool, partial: bool = False, now: float | None = None
    ) -> ClusterMetadata:
        """Merge a ``MetadataResponse``. With ``all_topics`` the response is the full list and
        topics missing from it are dropped; otherwise it updates only the topics it names.
        ``partial``: the answer to a request for some topics only (new ones), which leaves a
        requested refresh requested and the ``metadata.max.age.ms`` clock running."""
        for _ in self.update_in_steps(
            response, all_topics=all_topics, partial=partial, now=now, step_rows=None
        ):
            pass
        return self.current

    def update_in_steps(
        self,
        response: Any,
        *,
        all_topics: bool,
        partial: bool = False,
        now: float | None = None,
        step_rows: int | None = STEP_ROWS,
    ) -> Iterator[None]:
        """:meth:`update` cut into steps of about ``step_rows`` partitions each (None: one
        step): a caller on an event loop runs one step per turn of the loop, so that merging a
        100,000-partition answer never holds the loop up for long.

        The cache changes at the end of the last merging step only. If it changed meanwhile
        (a leader hint, a topic forgotten, another answer), the answer is merged again, at
        once, into what the cache holds then. The steps after that empty the answer's
        partition lists a slice at a time, so that freeing a huge answer is spread out too:
        the caller must not need them afterwards."""
        now = time.monotonic() if now is None else now
        old = self.current
        merged = yield from self._merge_topics(response, old, step_rows)
        if self.current is not old:
            old = self.current
            merged = _result(self._merge_topics(response, old, None))
        self._commit(response, old, merged, all_topics=all_topics, partial=partial, now=now)
        if step_rows is not None:
            for t in response.topics:
                partitions = t.partitions
                # (The compiled decoder's StructArray holds bytes, freed at once.)
                while type(partitions) is list and len(partitions) > step_rows:
                    del partitions[-step_rows:]
                    yield

    def _merge_topics(
        self, response: Any, old: ClusterMetadata, step_rows: int | None
    ) -> Generator[None, None, list[tuple[str, int, TopicInfo | None]]]:
        """Each named topic of ``response`` merged with what ``old`` holds: ``(name, error
        code, TopicInfo or None)``, None meaning the topic is not there (any more); yields
        after about every ``step_rows`` partitions."""
        merged: list[tuple[str, int, TopicInfo | None]] = []
        steps = _Steps(step_rows)
        for t in response.topics:
            name = t.name
            if name is None:  # a topic-id-only answer; kcore asks by name
                continue
            partitions = t.partitions
            if t.error_code != _NO_ERROR and not partitions:
                # UNKNOWN_TOPIC_OR_PARTITION and friends: the topic is gone or not there yet.
                merged.append((name, t.error_code, None))
                continue
            topic_id = t.topic_id if _uuid_set(t.topic_id) else None
            prev = old.topics.get(name)
            if prev is not None and not _same_uuid(prev.topic_id, topic_id, unset_matches=True):
                prev = None  # deleted and re-created: its epochs start again from 0
            cached = prev.partitions if prev is not None else None
            is_internal = bool(t.is_internal)
            count = len(partitions)
            same_topic = (  # what the entry says besides its partitions
                prev is not None
                and prev.is_internal == is_internal
                and prev.error_code == t.error_code
                and _same_uuid(prev.topic_id, topic_id)
            )
            if (
                same_topic
                and prev is not None
                and not isinstance(partitions, list)  # objects: built and compared below
                and len(prev.partitions) == count
            ):
                # The usual refresh changes nothing: compared first (compiled, no object made),
                # an unchanged topic keeps its cached entry without its rows being built.
                start, cursor = 0, 0
                while cursor >= 0 and start < count:
                    end = steps.end(start, count)
                    cursor = rows_unchanged(
                        partitions, prev.partitions, PartitionInfo, start, end, cursor
                    )
                    if steps.spend(end - start):
                        yield
                    start = end
                if cursor >= 0:
                    merged.append((name, t.error_code, prev))
                    continue
            # Compiled (a topic can have 100,000 partitions): each partition's row is the cached
            # one when the answer equals it or is stale (an older leader epoch: the broker was
            # behind), else a new PartitionInfo.
            rows: dict[int, PartitionInfo] = {}
            unchanged = True
            start = 0
            while True:
                end = steps.end(start, count)
                if not partition_rows(name, partitions, cached, PartitionInfo, rows, start, end):
                    unchanged = False
                if steps.spend(end - start):
                    yield
                start = end
                if start >= count:
                    break
            if unchanged and same_topic and prev is not None and len(rows) == len(prev.partitions):
                merged.append((name, t.error_code, prev))  # nothing changed: the cached entry
            else:
                merged.append(
                    (name, t.error_code, TopicInfo(name, topic_id, rows, is_internal, t.error_code))
                )
        return merged

    def _commit(
        self,
        response: Any,
        old: ClusterMetadata,
        merged: list[tuple[str, int, TopicInfo | None]],
        *,
        all_topics: bool,
        partial: bool,
        now: float,
    ) -> None:
        brokers, unusable = self._usable(
            BrokerInfo(b.node_id, b.host, b.port, b.rack) for b in response.brokers
        )
        topics: dict[str, TopicInfo] = {} if all_topics else dict(old.topics)
        unauthorized = set() if all_topics else set(old.unauthorized_topics)
        invalid = set() if all_topics else set(old.invalid_topics)
        for name, error_code, info in merged:
            if error_code == _AUTHORIZATION_FAILED:
                unauthorized.add(name)
            elif unauthorized:
                unauthorized.discard(name)
            if error_code == _INVALID_TOPIC:
                invalid.add(name)
            elif invalid:
                invalid.discard(name)
            if info is None:
                topics.pop(name, None)
            else:
                topics[name] = info
        self.current = ClusterMetadata(
            cluster_id=response.cluster_id,
            controller_id=response.controller_id,
            brokers=brokers,
            topics=topics,
            unauthorized_topics=frozenset(unauthorized),
            invalid_topics=frozenset(invalid),
            unusable_brokers=unusable,
        )
        if not partial:
            self.last_refresh = self.last_refresh_attempt = now
            self._update_requested = False
        self.updates += 1
        self._updated()

    def _usable(self, listed: Iterable[BrokerInfo]) -> tuple[dict[int, BrokerInfo], dict[int, str]]:
        """Broker entries from a peer split into those that can be dialled and why the others
        cannot (each such entry logged once): a flipped byte in an answer must not reach the
        network layer as an address."""
        brokers: dict[int, BrokerInfo] = {}
        unusable: dict[int, str] = {}
        checked = self._address_problems
        for broker in listed:
            address = (broker.host, broker.port)
            if address in checked:
                problem = checked[address]
            else:
                problem = address_problem(broker.host, broker.port)
                if len(checked) >= 1024:  # brokers come and go; the table stays small
                    checked.clear()
                checked[address] = problem
            if problem is None:
                brokers[broker.node_id] = broker
                continue
            unusable[broker.node_id] = problem
            key = (broker.node_id, broker.host, broker.port)
            if key not in self._reported_unusable:
                self._reported_unusable.add(key)
                log.warning(
                    "broker %s is listed at an address no connection can be made to (%s); "
                    "it is treated as unreachable",
                    broker.node_id,
                    problem,
                )
        return brokers, unusable

    def forget(self, topics: Iterable[str]) -> None:
        """Drop ``topics`` from the map (no longer tracked)."""
        old = self.current
        gone = set(topics)
        self.current = replace(
            old,
            topics={n: t for n, t in old.topics.items() if n not in gone},
            unauthorized_topics=old.unauthorized_topics - gone,
            invalid_topics=old.invalid_topics - gone,
        )
        self._updated()

    def _updated(self) -> None:
        for callback in self.on_update:
            callback()

    def update_leader(
        self,
        topic: str,
        partition: int,
        leader_id: int,
        leader_epoch: int,
        brokers: Iterable[BrokerInfo] = (),
    ) -> bool:
        """KIP-951: a Produce or Fetch response named the new leader of a partition. Apply it if
        it is newer than what we hold; returns whether it was applied."""
        old = self.current
        info = old.topics.get(topic)
        part = info.partitions.get(partition) if info is not None else None
        if info is None or part is None or leader_id < 0 or leader_epoch <= part.leader_epoch:
            return False
        known = dict(old.brokers)
        hinted, _ = self._usable(brokers)
        known.update(hinted)
        if leader_id not in known:
            self.request_update()
            return False
        parts = dict(info.partitions)
        parts[partition] = part._replace(leader=leader_id, leader_epoch=leader_epoch)
        topics = dict(old.topics)
        topics[topic] = replace(info, partitions=parts)
        self.current = replace(old, brokers=known, topics=topics)
        self._updated()
        return True

    def handle_error(self, error_code: int) -> bool:
        """Request a refresh when ``error_code`` means the map is stale; returns whether it
        did."""
        if error_code in STALE_METADATA_CODES:
            self.request_update()
            return True
        return False


def apply_leader_hints(cache: MetadataCache, response: Any) -> int:
    """KIP-951: apply the ``current_leader`` hints and ``node_endpoints`` of a Produce (v10+)
    or Fetch (v16+) response to ``cache``. Topics named only by id are matched through the
    cache's topic ids. Returns how many partitions got a new leader."""
    brokers = [
        BrokerInfo(n.node_id, n.host, n.port, n.rack)
        for n in getattr(response, "node_endpoints", ())
    ]
    applied = 0
    for topic in response.responses:
        partitions = getattr(topic, "partition_responses", None)
        if partitions is None:
            partitions = topic.partitions
        # The topic's name is looked up at its first hint: most answers carry none.
        name: str | None = None
        for p in partitions:
            leader = getattr(p, "current_leader", None)
            if leader is None or leader.leader_id < 0:
                continue
            if name is None:
                name = getattr(topic, "name", None) or getattr(topic, "topic", None)
                if not name and getattr(topic, "topic_id", None) is not None:
                    name = cache.current.topic_names_by_id.get(topic.topic_id)
                name = name or ""
            if not name:
                break
            index = p.index if hasattr(p, "index") else p.partition_index
            if cache.update_leader(name, index, leader.leader_id, leader.leader_epoch, brokers):
                applied += 1
    return applied
