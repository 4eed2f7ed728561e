"""Checking positions after a leader change (KIP-320): the I/O around :func:`judge`.

When the metadata names a new leader epoch for a partition whose position carries an epoch,
the fetcher stops fetching it and hands the question (a ``ValidationAsk``) to
:class:`PositionValidator`, which asks the leader with OffsetsForLeaderEpoch and applies the
answer to the partition's state: valid, resumed where the logs diverge, reset, or reported
(``LogTruncationError`` under ``auto.offset.reset=none``). A question made moot meanwhile (the
partition sought, unassigned or asked again) is ignored.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from kcore.cluster.client import ClusterClient
from kcore.cluster.metadata import STALE_METADATA_CODES
from kcore.consumer.fetch_buffer import FetchBuffer
from kcore.consumer.positions import PartitionState, Positions
from kcore.consumer.validation import Truncated, ValidationAsk, judge
from kcore.errors import (
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    LogTruncationError,
    UnsupportedVersionError,
    error_for_code,
)
from kcore.protocol import ApiKey
from kcore.protocol.messages import OffsetForLeaderEpochRequest
from kcore.protocol.messages.offset_for_leader_epoch_request import (
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from kcore.types import TopicPartition

__all__ = ["PositionValidator"]

log = logging.getLogger("kcore.consumer")


class PositionValidator:
    def __init__(
        self,
        cluster: ClusterClient,
        positions: Positions,
        buffer: FetchBuffer,
        reset_policy: str,
        back_off: Callable[[PartitionState], None],
        wakeup: Callable[[], None],
    ) -> None:
        self.cluster = cluster
        self.positions = positions
        self.buffer = buffer
        self.reset_policy = reset_policy
        self.back_off = back_off  # the partition is not fetched (nor checked) again before it
        self.wakeup = wakeup  # the fetcher's: a partition may be fetched again
        self.validations = 0  # OffsetsForLeaderEpoch checks of positions made
        self.truncations = 0  # of which found the log truncated below the position

    def _report(self, tp: TopicPartition, error: KcoreError) -> None:
        """For poll, once per partition while one waits."""
        self.buffer.add_error(error, tp, once=True)

    async def validate(self, node: int, asks: dict[TopicPartition, ValidationAsk]) -> None:
        """Ask the leader ``node`` where each position's epoch ends in its log (KIP-320) and
        act on the answers (see validation.py)."""
        try:
            try:
                version = await self.cluster.version_for(
                    node, ApiKey.OFFSET_FOR_LEADER_EPOCH, min_version=3
                )
            except UnsupportedVersionError:
                # As Java: a broker too old to answer consumers (v3, Kafka 2.3) is trusted.
                with self.positions.locked():
                    for st, ask in self._still_asking(asks):
                        st.leader_epoch = ask.current_leader_epoch
                return
            topics: dict[str, list[OffsetForLeaderPartition]] = {}
            for tp, ask in asks.items():
                topics.setdefault(tp.topic, []).append(
                    OffsetForLeaderPartition(
                        partition=tp.partition,
                        current_leader_epoch=ask.current_leader_epoch,
                        leader_epoch=ask.offset_epoch,
                    )
                )
            request = OffsetForLeaderEpochRequest(
                replica_id=-1,
                topics=[OffsetForLeaderTopic(topic=t, partitions=ps) for t, ps in topics.items()],
            )
            response = await self.cluster.send(node, request, version)
            answered: set[TopicPartition] = set()
            for t in response.topics:
                for p in t.partitions:
                    tp = TopicPartition(t.topic, p.partition)
                    if tp in asks:
                        answered.add(tp)
                        self._validated(tp, asks[tp], p.error_code, p.end_offset, p.leader_epoch)
            for tp in asks.keys() - answered:
                self._validated(tp, asks[tp], ErrorCode.UNKNOWN_SERVER_ERROR, -1, -1)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a connection down, a timeout (or a bug): ask again later
            if not isinstance(exc, (BrokerConnectionError, KcoreTimeoutError, KafkaError)):
                log.exception("validating positions at node %s", node)
            else:
                log.debug("validating positions at node %s failed: %s", node, exc)
            with self.positions.locked():
                for st, _ in self._still_asking(asks):
                    self.back_off(st)
        finally:
            self.wakeup()

    def _still_asking(
        self, asks: dict[TopicPartition, ValidationAsk]
    ) -> list[tuple[PartitionState, ValidationAsk]]:
        """(Positions locked.) The partitions still waiting on these questions (not unassigned,
        sought or asked again since), with their questions now closed."""
        out = []
        for tp, ask in asks.items():
            st = self.positions.get(tp)
            if st is not None and st.validating is ask:
                st.validating = None
                out.append((st, ask))
        return out

    def _validated(
        self, tp: TopicPartition, ask: ValidationAsk, code: int, end_offset: int, end_epoch: int
    ) -> None:
        """Apply one partition's OffsetsForLeaderEpoch answer."""
        name = f"{tp.topic}-{tp.partition}"
        with self.positions.locked():
            st = self.positions.get(tp)
            if st is None or st.validating is not ask:
                return  # unassigned, sought (a seek ends the check) or asked again meanwhile
            st.validating = None
            if code:
                err = error_for_code(code)
                if code in STALE_METADATA_CODES:
                    self.cluster.cache.request_update()
                elif (
                    err is not None and not err.retriable and code != ErrorCode.UNKNOWN_SERVER_ERROR
                ):
                    self._report(
                        tp, err.with_message(f"{name}: checking the position: {err.message}")
                    )
                log.debug("%s: position check: %s", name, err.name if err else code)
                self.back_off(st)
                return
            self.validations += 1
            outcome = judge(ask, end_offset, end_epoch, self.reset_policy)
            if outcome is None:
                st.leader_epoch = ask.current_leader_epoch
                st.errors = 0
                return
            self.truncations += 1
            if isinstance(outcome, Truncated):
                # As Java: the position stays unvalidated (not fetched), is checked again
                # after a backoff and reported again, until the caller seeks.
                self.back_off(st)
                div = outcome.divergent
                where = "an unknown offset" if div.offset < 0 else f"offset {div.offset}"
                self._report(
                    tp,
                    LogTruncationError(
                        f"{name}: the log was truncated below position {ask.position} (it "
                        f"diverges at {where}) and auto.offset.reset is none: seek to go on",
                        {tp: ask.position},
                        {tp: None if div.offset < 0 else (div.offset, div.epoch)},
                    ),
                )
                return
            if outcome.offset < 0:
                log.warning(
                    "%s: truncation detected at position %s (the leader does not know epoch "
                    "%s); resetting (%s)",
                    name,
                    ask.position,
                    ask.offset_epoch,
                    self.reset_policy,
                )
                st.seek(None)
                return
            log.warning(
                "%s: truncation detected at position %s; resuming at %s, the first offset "
                "known to diverge",
                name,
                ask.position,
                outcome.offset,
            )
            st.position, st.offset_epoch = outcome.offset, outcome.epoch
            st.leader_epoch = ask.current_leader_epoch
