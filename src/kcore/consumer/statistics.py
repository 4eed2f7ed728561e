"""The consumer's part of the statistics document (kcore.cluster.statistics): each assigned
partition's offsets and lag (from the positions, and the group's committed offsets), the
records consumed in all (the metrics' records-consumed and bytes-consumed), and the group
(``cgrp``, from the group coordinator). Called on the event loop.

Lag, as librdkafka's: consumer_lag is the end (the high watermark; read_committed: the last
stable offset) minus the committed offset, consumer_lag_stored the end minus the offset a
commit would store now (kcore commits positions: the position)."""

from __future__ import annotations

from typing import Any

from kcore.cluster.group_offsets import GroupOffsets
from kcore.cluster.metadata import MetadataCache
from kcore.consumer.group import GroupCoordinator
from kcore.consumer.positions import OffsetsView, Positions
from kcore.metrics import ClientMetrics

__all__ = ["ConsumerStatistics"]


class ConsumerStatistics:
    def __init__(
        self,
        positions: Positions,
        cache: MetadataCache,
        metrics: ClientMetrics,
        group: GroupCoordinator | None,
        *,
        read_committed: bool,
    ) -> None:
        self.positions = positions
        self.cache = cache
        self.metrics = metrics
        self.group = group
        self.offsets: GroupOffsets | None = group.offsets if group is not None else None
        if self.offsets is not None:
            self.offsets.keep_committed()
        self.read_committed = read_committed

    def __call__(self, document: dict[str, Any]) -> None:
        document["rxmsgs"] = int(self.metrics.total("records-consumed"))
        document["rxmsg_bytes"] = int(self.metrics.total("bytes-consumed"))
        metadata = self.cache.current
        topics: dict[str, dict[str, Any]] = {}
        for view in self.positions.offsets():
            tp = view.tp
            info = metadata.partition(tp.topic, tp.partition)
            entry = topics.setdefault(tp.topic, {"topic": tp.topic, "partitions": {}})
            committed = self.offsets.committed_offset(tp) if self.offsets is not None else None
            entry["partitions"][str(tp.partition)] = self._partition(
                view, -1 if info is None else info.leader, committed
            )
        document["topics"] = topics
        if self.group is not None:
            document["cgrp"] = self.group.statistics()

    def _partition(self, view: OffsetsView, leader: int, committed: int | None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "partition": view.tp.partition,
            "broker": leader,
            "leader": leader,
            "fetchq_size": view.queued_bytes,
            "fetch_state": "offset-query" if view.position is None else "active",
        }
        if view.next_fetch is not None:
            out["next_offset"] = view.next_fetch
        if view.position is not None:
            out["app_offset"] = view.position
            out["stored_offset"] = view.position
        if committed is not None:
            out["committed_offset"] = committed
        if view.high_watermark >= 0:
            out["hi_offset"] = view.high_watermark
        if self.read_committed and view.lag_end >= 0:
            out["ls_offset"] = view.lag_end
        if view.lag_end >= 0:
            if committed is not None:
                out["consumer_lag"] = max(0, view.lag_end - committed)
            if view.position is not None:
                out["consumer_lag_stored"] = max(0, view.lag_end - view.position)
        return out
