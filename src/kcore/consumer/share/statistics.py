"""The share consumer's part of the statistics document (kcore.cluster.statistics), in
librdkafka's names where a share consumer has the same thing: the records consumed in all
(``rxmsgs``, ``rxmsg_bytes``), each assigned partition with its leader and the records waiting
for ``poll`` (``fetchq_cnt``), and the share group (``cgrp``: the member's state, epoch and
assignment). A share group has no offsets a member owns (the broker tracks delivery), so the
partitions carry no offsets or lag. Called on the event loop."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kcore.cluster.metadata import MetadataCache
from kcore.consumer.share.fetcher import ShareBuffer
from kcore.consumer.share.membership import ShareMembership
from kcore.metrics import ClientMetrics
from kcore.types import TopicPartition

__all__ = ["ShareConsumerStatistics"]


class ShareConsumerStatistics:
    def __init__(
        self,
        membership: ShareMembership,
        assignment: Callable[[], set[TopicPartition]],
        buffer: ShareBuffer,
        cache: MetadataCache,
        metrics: ClientMetrics,
    ) -> None:
        self.membership = membership
        self.assignment = assignment
        self.buffer = buffer
        self.cache = cache
        self.metrics = metrics

    def __call__(self, document: dict[str, Any]) -> None:
        document["rxmsgs"] = int(self.metrics.total("records-consumed"))
        document["rxmsg_bytes"] = int(self.metrics.total("bytes-consumed"))
        metadata = self.cache.current
        waiting = self.buffer.counts()
        assigned = sorted(self.assignment())
        topics: dict[str, dict[str, Any]] = {}
        for tp in assigned:
            info = metadata.partition(tp.topic, tp.partition)
            entry = topics.setdefault(tp.topic, {"topic": tp.topic, "partitions": {}})
            entry["partitions"][str(tp.partition)] = {
                "partition": tp.partition,
                "leader": -1 if info is None else info.leader,
                "desired": True,
                "fetchq_cnt": waiting.get(tp, 0),
            }
        document["topics"] = topics
        member = self.membership
        document["cgrp"] = {
            "type": "share",
            "group_id": member.group_id,
            "member_id": member.member_id,
            "member_epoch": member.epoch,
            "state": "up" if member.joined else "init",
            "join_state": "steady" if member.has_partitions else "init",
            "assignment_size": len(assigned),
            "subscription": list(member.topics or []),
        }
