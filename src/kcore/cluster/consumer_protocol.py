"""The ConsumerProtocol bytes of classic consumer groups: a member's subscription (JoinGroup
metadata) and assignment (SyncGroup; DescribeGroups shows it), with a 2-byte version header,
byte for byte as Java's ``ConsumerProtocol``. Used by the consumer's group member and
assignors, and by the admin client's ``describe_consumer_groups``."""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from kcore.errors import TruncatedDataError
from kcore.protocol.messages.consumer_protocol_assignment import ConsumerProtocolAssignment
from kcore.protocol.messages.consumer_protocol_assignment import TopicPartition as _AssignedTopic
from kcore.protocol.messages.consumer_protocol_subscription import ConsumerProtocolSubscription
from kcore.protocol.messages.consumer_protocol_subscription import TopicPartition as _OwnedTopic
from kcore.types import TopicPartition

__all__ = [
    "CONSUMER_PROTOCOL_VERSION",
    "Subscription",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
]

# The newest ConsumerProtocolSubscription / ConsumerProtocolAssignment version (Kafka 3.5+).
CONSUMER_PROTOCOL_VERSION = 3

_VERSION = struct.Struct(">h")


@dataclass
class Subscription:
    """One member's JoinGroup metadata, decoded."""

    topics: list[str]
    user_data: bytes | None = None
    owned_partitions: list[TopicPartition] = field(default_factory=list)
    generation_id: int = -1
    rack_id: str | None = None


# ---------------------------------------------------------------------------------------------
# ConsumerProtocol: a 2-byte version, then the struct of that version


def _clamp(version: int) -> int:
    # As Java's ConsumerProtocol: a version above the newest is written (and read) as the newest;
    # a negative one is left for the generated code to reject (UnsupportedVersionError).
    return min(version, CONSUMER_PROTOCOL_VERSION)


def _read_version(data: bytes | bytearray | memoryview) -> int:
    if len(data) < 2:
        raise TruncatedDataError("consumer protocol header: fewer than 2 bytes", len(data))
    return int(_VERSION.unpack_from(data, 0)[0])


def encode_subscription(sub: Subscription, version: int = CONSUMER_PROTOCOL_VERSION) -> bytes:
    """``ConsumerProtocolSubscription`` with its version header, byte for byte as Java's
    ``ConsumerProtocol.serializeSubscription``: topics sorted, owned partitions sorted and grouped
    by topic. Fields a lower version lacks are dropped (they are ignorable)."""
    version = _clamp(version)
    owned: list[_OwnedTopic] = []
    for tp in sorted(sub.owned_partitions):
        if not owned or owned[-1].topic != tp.topic:
            owned.append(_OwnedTopic(topic=tp.topic))
        owned[-1].partitions.append(tp.partition)
    msg = ConsumerProtocolSubscription(
        topics=sorted(sub.topics),
        user_data=sub.user_data,
        owned_partitions=owned,
        generation_id=sub.generation_id,
        rack_id=sub.rack_id,
    )
    out = bytearray(_VERSION.pack(version))
    msg.encode_into(out, version)
    return bytes(out)


def decode_subscription(data: bytes | bytearray | memoryview) -> Subscription:
    """Any version; a newer one is read as the newest known and its extra bytes ignored (Java
    does the same, which is what lets the format grow). An empty rack reads as none, as Java."""
    version = _read_version(data)
    msg, _ = ConsumerProtocolSubscription.decode(data, _clamp(version), 2)
    owned: list[_OwnedTopic] = msg.owned_partitions
    return Subscription(
        topics=list(msg.topics),
        user_data=msg.user_data,
        owned_partitions=[TopicPartition(t.topic, p) for t in owned for p in t.partitions],
        generation_id=msg.generation_id,
        rack_id=msg.rack_id or None,
    )


def encode_assignment(
    partitions: Iterable[TopicPartition],
    user_data: bytes | None = None,
    version: int = CONSUMER_PROTOCOL_VERSION,
) -> bytes:
    """``ConsumerProtocolAssignment`` with its version header. As Java: topics in the order they
    first appear, each topic's partitions in the order given."""
    version = _clamp(version)
    by_topic: dict[str, _AssignedTopic] = {}
    for tp in partitions:
        entry = by_topic.get(tp.topic)
        if entry is None:
            entry = by_topic[tp.topic] = _AssignedTopic(topic=tp.topic)
        entry.partitions.append(tp.partition)
    msg = ConsumerProtocolAssignment(
        assigned_partitions=list(by_topic.values()), user_data=user_data
    )
    out = bytearray(_VERSION.pack(version))
    msg.encode_into(out, version)
    return bytes(out)


def decode_assignment(
    data: bytes | bytearray | memoryview,
) -> tuple[list[TopicPartition], bytes | None]:
    """The partitions and user data of an assignment of any version (newer ones as the newest)."""
    version = _read_version(data)
    msg, _ = ConsumerProtocolAssignment.decode(data, _clamp(version), 2)
    assigned: list[_AssignedTopic] = msg.assigned_partitions
    partitions = [TopicPartition(t.topic, p) for t in assigned for p in t.partitions]
    return partitions, msg.user_data
