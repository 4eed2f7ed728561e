"""Cluster metadata and the client core every kcore client shares."""

from .client import ClusterClient, connection_settings
from .metadata import (
    STALE_METADATA_CODES,
    BrokerInfo,
    ClusterMetadata,
    MetadataCache,
    PartitionInfo,
    TopicInfo,
    apply_leader_hints,
)

__all__ = [
    "STALE_METADATA_CODES",
    "BrokerInfo",
    "ClusterClient",
    "ClusterMetadata",
    "MetadataCache",
    "PartitionInfo",
    "TopicInfo",
    "apply_leader_hints",
    "connection_settings",
]
