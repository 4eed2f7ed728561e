"""The driver's view of Kafka: which partitions a read covers and their offsets, asked of the
brokers with kcore's :class:`~kcore.admin.AdminClient` (as the JVM source uses Kafka's Admin)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from kcore.admin.client import AdminClient
from kcore.errors import ConfigError, KcoreError, UnknownTopicOrPartitionError
from kcore.types import TopicPartition

from .offsets import EARLIEST, LATEST, PartitionOffsets
from .options import OffsetLimit, ReadOptions

__all__ = ["OffsetResolver", "report_data_loss"]

log = logging.getLogger("kcore.spark")

T = TypeVar("T")

DATA_LOSS_FAIL = (
    "Some data may have been lost because it is not available in Kafka any more: either it "
    "was aged out by Kafka or the topic was deleted before all its data was processed. If you "
    "don't want the query to fail in such cases, set the source option 'failOnDataLoss' to "
    "'false'."
)
DATA_LOSS_WARN = (
    "Some data may have been lost because it is not available in Kafka any more: either it "
    "was aged out by Kafka or the topic was deleted before all its data was processed. If you "
    "want the query to fail in such cases, set the source option 'failOnDataLoss' to 'true'."
)


def report_data_loss(message: str, fail: bool) -> None:
    """Raise (``failOnDataLoss`` true) or log a warning, as the JVM source does."""
    if fail:
        raise KcoreError(f"{message}. {DATA_LOSS_FAIL}")
    log.warning("%s. %s", message, DATA_LOSS_WARN)


def _names(tps: Iterable[TopicPartition]) -> str:
    return ", ".join(f"{tp.topic}-{tp.partition}" for tp in sorted(tps))


class OffsetResolver:
    """Partitions and offsets for one source. The admin client is made on first use (a reader
    is built and pickled where no broker may be reachable) and closed by :meth:`close`."""

    def __init__(self, opts: ReadOptions) -> None:
        self._opts = opts
        self._admin: AdminClient | None = None

    def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            admin.close()

    def __enter__(self) -> OffsetResolver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _client(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(self._opts.admin_config())
        return self._admin

    def _retrying(self, what: str, body: Callable[[], T]) -> T:
        """``fetchOffset.numRetries`` attempts ``fetchOffset.retryIntervalMs`` apart, each with
        a fresh admin client (as the JVM source does: a broken client may stay broken)."""
        attempts = self._opts.fetch_offset_num_retries
        for attempt in range(1, attempts + 1):
            try:
                return body()
            except ConfigError:
                raise  # the options are wrong: no retry makes them right
            except KcoreError as exc:
                if attempt == attempts:
                    raise
                log.warning("%s: attempt %d of %d failed: %s", what, attempt, attempts, exc)
                self.close()
                time.sleep(self._opts.fetch_offset_retry_interval_ms / 1000)
        raise AssertionError("unreachable")

    # -- partitions -------------------------------------------------------------------------

    def topic_partitions(self) -> set[TopicPartition]:
        """The partitions the strategy covers now, internal topics left out (as the JVM source
        leaves them out). A topic that ``subscribe`` or ``assign`` names and that does not
        exist is an error (after ``fetchOffset.numRetries`` attempts), as in the JVM source;
        ``subscribePattern`` covers the topics that exist."""
        return self._retrying("listing partitions", self._topic_partitions)

    def _topic_partitions(self) -> set[TopicPartition]:
        strategy = self._opts.strategy
        admin = self._client()
        if strategy.kind == "subscribePattern":
            # Kept when the pattern is found anywhere in the name (Scala's findFirstIn, as the
            # JVM source since Spark 3.4): ^...$ anchors it to whole names.
            pattern = re.compile(strategy.pattern)
            wanted = [t for t in admin.list_topics() if pattern.search(t)]
        else:
            if strategy.kind == "subscribe":
                wanted = list(strategy.topics)
            else:
                wanted = list(dict.fromkeys(tp.topic for tp in strategy.partitions))
            existing = set(admin.list_topics(include_internal=True))
            missing = [t for t in wanted if t not in existing]
            if missing:
                raise UnknownTopicOrPartitionError(
                    f"{strategy.kind}: topic{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(repr(t) for t in missing)} "
                    f"{'do' if len(missing) > 1 else 'does'} not exist"
                )
        if not wanted:
            return set()
        described = admin.describe_topics(wanted)
        internal = sorted(d.name for d in described.values() if d.is_internal)
        if internal:
            log.warning("%s: internal topics are not read: %s", strategy.kind, ", ".join(internal))
        tps = {
            TopicPartition(d.name, p.partition)
            for d in described.values()
            if not d.is_internal
            for p in d.partitions
        }
        if strategy.kind == "assign":
            tps &= set(strategy.partitions)
        return tps

    # -- a consumer group's offsets ----------------------------------------------------------

    def commit_group_offsets(self, group_id: str, offsets: PartitionOffsets) -> None:
        """Commit ``offsets`` (next offset to read per partition) to ``group_id`` from outside
        the group, with the driver's admin client. Not retried: the caller judges a failure
        (a group with active members refuses it)."""
        wanted: dict[TopicPartition | tuple[str, int], int] = {}  # (invariant keys)
        wanted.update(offsets.items())
        self._client().alter_consumer_group_offsets(group_id, wanted)

    # -- offsets ----------------------------------------------------------------------------

    def _list(self, specs: Mapping[TopicPartition, str | int]) -> PartitionOffsets:
        if not specs:
            return {}
        wanted: dict[TopicPartition | tuple[str, int], str | int] = {}  # (invariant keys)
        wanted.update(specs.items())
        found = self._client().list_offsets(wanted, isolation_level=self._opts.isolation_level)
        return {TopicPartition(*tp): r.offset for tp, r in found.items()}

    def earliest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        specs: dict[TopicPartition, str | int] = {tp: "earliest" for tp in tps}
        return self._retrying("fetching earliest offsets", lambda: self._list(specs))

    def latest(self, tps: Iterable[TopicPartition]) -> PartitionOffsets:
        specs: dict[TopicPartition, str | int] = {tp: "latest" for tp in tps}
        return self._retrying("fetching latest offsets", lambda: self._list(specs))

    def fetch_latest(self, known: PartitionOffsets | None = None) -> PartitionOffsets:
        """The latest offsets of every partition covered now. A latest offset below one already
        ``known`` is asked again (a broker that just became leader may lag, KAFKA-7703) up to
        ``fetchOffset.numRetries`` times; what then remains is for the caller to judge."""
        tps = self.topic_partitions()
        latest = self.latest(tps)
        for attempt in range(1, self._opts.fetch_offset_num_retries):
            behind = [tp for tp, off in latest.items() if known and off < known.get(tp, off)]
            if not behind:
                break
            log.warning(
                "latest offsets went backwards for %s; asking again (%d)", _names(behind), attempt
            )
            time.sleep(self._opts.fetch_offset_retry_interval_ms / 1000)
            latest = self.latest(tps)
        return latest

    def resolve(self, limit: OffsetLimit, *, is_starting: bool) -> PartitionOffsets:
        """Concrete offsets for every partition covered, from an offset option."""
        tps = self.topic_partitions()
        if limit.kind == "earliest":
            return self.earliest(tps)
        if limit.kind == "latest":
            return self.latest(tps)
        if limit.kind in ("offsets", "timestamps"):
            if set(limit.offsets) != tps:
                raise ConfigError(
                    limit.option,
                    "must name every partition the query reads (use -2 for earliest, -1 for "
                    f"latest): given [{_names(limit.offsets)}], read [{_names(tps)}]",
                )
        if limit.kind == "offsets":
            ends = {tp: off for tp, off in limit.offsets.items() if off in (EARLIEST, LATEST)}
            resolved = {
                **self.earliest(tp for tp, off in ends.items() if off == EARLIEST),
                **self.latest(tp for tp, off in ends.items() if off == LATEST),
            }
            return {tp: resolved.get(tp, off) for tp, off in limit.offsets.items()}
        stamps = (
            limit.offsets if limit.kind == "timestamps" else dict.fromkeys(tps, limit.timestamp)
        )
        return self._by_timestamp(stamps, limit, is_starting)

    def _by_timestamp(
        self, stamps: PartitionOffsets, limit: OffsetLimit, is_starting: bool
    ) -> PartitionOffsets:
        """The first offset at or after each timestamp; where there is none, latest (the end
        of a batch read, or ``startingOffsetsByTimestampStrategy=latest``) or an error."""
        specs: dict[TopicPartition, str | int] = dict(stamps)
        found = self._retrying("fetching offsets by timestamp", lambda: self._list(specs))
        unmatched = [tp for tp, off in found.items() if off < 0]
        if unmatched and is_starting and self._opts.no_match_strategy == "error":
            tp = min(unmatched)
            raise KcoreError(
                f"{limit.option}: no offset matched timestamp {stamps[tp]} in "
                f"{tp.topic}-{tp.partition} (set startingOffsetsByTimestampStrategy=latest to "
                "start such partitions at their latest offset)"
            )
        return {**found, **self.latest(unmatched)}
