"""The producer's part of the statistics document (kcore.cluster.statistics): the records
queued and delivered, per partition and in all (from the accumulator and the sender), and the
idempotent and transactional state (``eos``, from the producer id's and the transaction's
owners). Called on the event loop."""

from __future__ import annotations

import time
from typing import Any

from kcore.cluster.metadata import MetadataCache
from kcore.producer.accumulator import RecordAccumulator
from kcore.producer.idempotence import IdempotenceState
from kcore.producer.sender import Sender
from kcore.producer.txn_state import TransactionStateMachine, TxnState
from kcore.types import TopicPartition

__all__ = ["ProducerStatistics"]

# kcore's transaction states under librdkafka's names for them.
TXN_STATE_NAMES = {
    TxnState.UNINITIALIZED: "Init",
    TxnState.READY: "Ready",
    TxnState.IN_TRANSACTION: "InTransaction",
    TxnState.COMMITTING: "CommittingTransaction",
    TxnState.ABORTING: "AbortingTransaction",
    TxnState.ABORTABLE_ERROR: "AbortableError",
    TxnState.FATAL_ERROR: "FatalError",
}


class ProducerStatistics:
    def __init__(
        self,
        accumulator: RecordAccumulator,
        sender: Sender,
        cache: MetadataCache,
        *,
        buffer_memory: int,
        identity: IdempotenceState | None,
        txn: TransactionStateMachine | None,
    ) -> None:
        self.accumulator = accumulator
        self.sender = sender
        self.cache = cache
        self.buffer_memory = buffer_memory
        self.identity = identity
        self.txn = txn
        self.created = time.monotonic()
        sender.count_deliveries()

    def __call__(self, document: dict[str, Any]) -> None:
        queued = self.accumulator.queued()
        delivered = self.sender.delivered or {}
        in_flight_records, in_flight_bytes = self.sender.in_flight_records()
        document["msg_cnt"] = sum(n for n, _ in queued.values()) + in_flight_records
        document["msg_size"] = sum(b for _, b in queued.values()) + in_flight_bytes
        document["msg_size_max"] = self.buffer_memory
        document["txmsgs"] = sum(n for n, _ in delivered.values())
        document["txmsg_bytes"] = sum(b for _, b in delivered.values())
        metadata = self.cache.current
        topics: dict[str, dict[str, Any]] = {}
        for tp in sorted(set(queued) | set(delivered)):
            info = metadata.partition(tp.topic, tp.partition)
            entry = topics.setdefault(tp.topic, {"topic": tp.topic, "partitions": {}})
            entry["partitions"][str(tp.partition)] = _partition(
                tp, -1 if info is None else info.leader, queued, delivered
            )
        document["topics"] = topics
        eos = self._eos()
        if eos:
            document["eos"] = eos

    def _eos(self) -> dict[str, Any]:
        now = time.monotonic()
        out: dict[str, Any] = {}
        identity = self.identity
        if identity is not None:
            assigned = identity.assigned_at is not None and identity.producer_id >= 0
            since = identity.assigned_at if assigned else self.created
            assert since is not None
            out["idemp_state"] = "Assigned" if assigned else "Init"
            out["idemp_stateage"] = int((now - since) * 1000)
            out["producer_id"] = identity.producer_id
            out["producer_epoch"] = identity.epoch
            out["epoch_cnt"] = identity.assignments
        txn = self.txn
        if txn is not None:
            out["txn_state"] = TXN_STATE_NAMES[txn.state]
            out["txn_stateage"] = int((now - txn.state_since) * 1000)
            out["txn_may_enq"] = txn.state is TxnState.IN_TRANSACTION
        return out


def _partition(
    tp: TopicPartition,
    leader: int,
    queued: dict[TopicPartition, tuple[int, int]],
    delivered: dict[TopicPartition, list[int]],
) -> dict[str, Any]:
    msgq_cnt, msgq_bytes = queued.get(tp, (0, 0))
    txmsgs, txbytes = delivered.get(tp, (0, 0))
    return {
        "partition": tp.partition,
        "broker": leader,
        "leader": leader,
        "msgq_cnt": msgq_cnt,
        "msgq_bytes": msgq_bytes,
        "txmsgs": txmsgs,
        "txbytes": txbytes,
    }
