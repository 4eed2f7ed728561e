"""What the admin client takes and returns."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from kcore.cluster.metadata import BrokerInfo, PartitionInfo
from kcore.errors import AdminOperationError
from kcore.types import ConsumerGroupMetadata, ListOffsetsResult, OffsetSpec, TopicPartition

__all__ = [
    "AdminOperationError",
    "ClusterDescription",
    "ConfigEntry",
    "ConfigResource",
    "ConsumerGroupMetadata",
    "ListOffsetsResult",
    "NewTopic",
    "OffsetSpec",
    "TopicDescription",
    "TopicPartition",
]


@dataclass(frozen=True)
class NewTopic:
    """A topic to create. ``num_partitions``/``replication_factor`` of -1 take the broker's
    defaults; ``replica_assignment`` ({partition: [broker ids]}) replaces both."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    config: Mapping[str, str] = field(default_factory=dict)
    replica_assignment: Mapping[int, list[int]] | None = None


@dataclass(frozen=True)
class TopicDescription:
    name: str
    topic_id: uuid.UUID | None
    is_internal: bool
    partitions: list[PartitionInfo]


@dataclass(frozen=True)
class ClusterDescription:
    cluster_id: str | None
    controller_id: int
    brokers: list[BrokerInfo]


class ConfigResource(NamedTuple):
    """``type`` is ``"topic"``, ``"broker"`` or ``"broker_logger"``; a broker's name is its id."""

    type: str
    name: str


RESOURCE_TYPES = {"topic": 2, "broker": 4, "broker_logger": 8, "group": 32}
RESOURCE_NAMES = {v: k for k, v in RESOURCE_TYPES.items()}


@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str | None  # None for a sensitive value (the broker does not return it)
    source: str
    is_read_only: bool
    is_sensitive: bool
    is_default: bool


# Sources of a config value, as DescribeConfigs numbers them.
CONFIG_SOURCES = {
    -1: "unknown",
    1: "dynamic_topic",
    2: "dynamic_broker",
    3: "dynamic_default_broker",
    4: "static_broker",
    5: "default",
    6: "dynamic_broker_logger",
    7: "client_metrics",
    8: "group",
}
