"""Partition assignors for the classic consumer group protocol, and the ConsumerProtocol bytes they
travel in (JoinGroup metadata, SyncGroup assignments). Pure: no I/O, no clock, no randomness.

The group leader decodes every member's subscription, runs one assignor and encodes one
assignment per member. The assignors behave as the Java client's of the same names:

- ``range``: per topic, contiguous ranges over the members subscribed to it.
- ``roundrobin``: every partition of every subscribed topic, dealt over the members in turn.
- ``sticky`` (eager) and ``cooperative-sticky`` (KIP-429): balanced, keeping owned partitions.

Racks (KIP-881) are carried in the subscription but not used: rack-aware assignment needs the
replicas' racks, which ``partitions_per_topic`` (partition counts) does not give.
"""

from __future__ import annotations

import bisect
import heapq
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kcore.cluster.consumer_protocol import (
    CONSUMER_PROTOCOL_VERSION,
    Subscription,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from kcore.errors import ConfigError
from kcore.types import TopicPartition

__all__ = [
    "ASSIGNORS",
    "Assignor",
    "CONSUMER_PROTOCOL_VERSION",
    "CooperativeStickyAssignor",
    "MemberSubscription",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    "Subscription",
    "assignor_for",
    "decode_assignment",
    "decode_subscription",
    "encode_assignment",
    "encode_subscription",
]

# Java's DEFAULT_GENERATION: "no generation known".
_NO_GENERATION = -1

_INT32 = struct.Struct(">i")
_INT16 = struct.Struct(">h")


@dataclass
class MemberSubscription:
    """What the leader's assignor sees per member."""

    member_id: str
    group_instance_id: str | None
    subscription: Subscription


# ---------------------------------------------------------------------------------------------
# The assignor interface


class Assignor(Protocol):
    name: str  # the protocol name in JoinGroup: "range", "roundrobin", "cooperative-sticky", ...
    rebalance_protocol: str  # "eager" or "cooperative"

    def subscription_user_data(
        self, topics: set[str], owned: list[TopicPartition], generation: int
    ) -> bytes | None:
        """The user data this member puts in its subscription."""
        ...

    def assign(
        self, partitions_per_topic: dict[str, int], members: list[MemberSubscription]
    ) -> dict[str, list[TopicPartition]]:
        """The leader's plan: member id -> partitions, with an entry for every member."""
        ...


def _java_order(s: str) -> bytes:
    # Java's String.compareTo compares UTF-16 code units; Python compares code points. The two
    # differ only beyond the BMP, but member ids are client-chosen text, so order as Java does.
    return s.encode("utf-16-be", "surrogatepass")


def _member_order(m: MemberSubscription) -> tuple[int, bytes]:
    # Java's MemberInfo order: static members (group.instance.id) first, by instance id; then
    # dynamic members by member id. Static members thus keep their place across restarts.
    if m.group_instance_id is not None:
        return (0, _java_order(m.group_instance_id))
    return (1, _java_order(m.member_id))


def _existing_topics(members: Sequence[MemberSubscription], counts: dict[str, int]) -> list[str]:
    """Subscribed topics that have partitions, in Java's order; the rest are ignored."""
    topics = {t for m in members for t in m.subscription.topics if counts.get(t, 0) > 0}
    return sorted(topics, key=_java_order)


class RangeAssignor:
    """Per topic, the members subscribed to it (in ``_member_order``) each take a contiguous range
    of partitions; the first ``partitions % members`` take one more. Topics are split
    independently, so co-partitioned topics land on the same members (Java's ``range``)."""

    name = "range"
    rebalance_protocol = "eager"

    def subscription_user_data(
        self, topics: set[str], owned: list[TopicPartition], generation: int
    ) -> bytes | None:
        return None

    def assign(
        self, partitions_per_topic: dict[str, int], members: list[MemberSubscription]
    ) -> dict[str, list[TopicPartition]]:
        plan: dict[str, list[TopicPartition]] = {m.member_id: [] for m in members}
        ordered = sorted(members, key=_member_order)
        for topic in _existing_topics(members, partitions_per_topic):
            subscribers = [m for m in ordered if topic in m.subscription.topics]
            share, extra = divmod(partitions_per_topic[topic], len(subscribers))
            start = 0
            for i, m in enumerate(subscribers):
                end = start + share + (1 if i < extra else 0)
                plan[m.member_id].extend(TopicPartition(topic, p) for p in range(start, end))
                start = end
        return plan


class RoundRobinAssignor:
    """All partitions of all subscribed topics, sorted by topic then partition, dealt in turn over
    the members (in ``_member_order``), skipping a member not subscribed to the partition's topic;
    the turn carries over from one topic to the next (Java's ``roundrobin``)."""

    name = "roundrobin"
    rebalance_protocol = "eager"

    def subscription_user_data(
        self, topics: set[str], owned: list[TopicPartition], generation: int
    ) -> bytes | None:
        return None

    def assign(
        self, partitions_per_topic: dict[str, int], members: list[MemberSubscription]
    ) -> dict[str, list[TopicPartition]]:
        plan: dict[str, list[TopicPartition]] = {m.member_id: [] for m in members}
        ordered = sorted(members, key=_member_order)
        subscribed = [set(m.subscription.topics) for m in ordered]
        turn = 0
        for topic in _existing_topics(members, partitions_per_topic):
            for p in range(partitions_per_topic[topic]):
                # Terminates: the topic came from some member's subscription.
                while topic not in subscribed[turn % len(ordered)]:
                    turn += 1
                plan[ordered[turn % len(ordered)].member_id].append(TopicPartition(topic, p))
                turn += 1
        return plan


# ---------------------------------------------------------------------------------------------
# Sticky assignment


@dataclass
class _Ownership:
    """Who may keep what. ``owner``: each partition's one valid previous owner (the claimer with
    the highest generation). ``claimed``: every partition any member claims, valid or not."""

    owner: dict[TopicPartition, str]
    claimed: set[TopicPartition]


def _resolve_ownership(claims: dict[str, tuple[list[TopicPartition], int]]) -> _Ownership:
    """Settle double claims as Java does: the higher generation wins (the other claim is stale,
    left from a rebalance its member missed); two claims in the same generation cancel out, since
    neither can be trusted."""
    best: dict[TopicPartition, tuple[int, list[str]]] = {}
    for member, (partitions, generation) in claims.items():
        for tp in set(partitions):
            top = best.get(tp)
            if top is None or generation > top[0]:
                best[tp] = (generation, [member])
            elif generation == top[0]:
                top[1].append(member)
    owner = {tp: members[0] for tp, (_, members) in best.items() if len(members) == 1}
    return _Ownership(owner=owner, claimed=set(best))


def _sticky_assign(
    partitions_per_topic: dict[str, int],
    members: list[MemberSubscription],
    ownership: _Ownership,
) -> dict[str, list[TopicPartition]]:
    """A balanced assignment keeping as many valid owned partitions as balance allows.

    A member may keep the partitions it validly owns of topics it still subscribes to. When all
    members subscribe to the same topics (the usual case) each gets a fixed share, as Java's
    constrained path; otherwise shares follow from moving partitions between members (Java's
    general path has the same goal: nobody could take a partition from a member holding two
    more)."""
    plan: dict[str, list[TopicPartition]] = {m.member_id: [] for m in members}
    topics_of: dict[str, set[str]] = {
        m.member_id: {t for t in m.subscription.topics if partitions_per_topic.get(t, 0) > 0}
        for m in members
    }
    # Members with nothing to consume take no part (and get []).
    active = sorted((m.member_id for m in members if topics_of[m.member_id]), key=_java_order)
    if not active:
        return plan
    kept: dict[str, list[TopicPartition]] = {m: [] for m in active}
    for tp, m in ownership.owner.items():
        if (
            m in kept
            and tp.topic in topics_of[m]
            and 0 <= tp.partition < partitions_per_topic[tp.topic]
        ):
            kept[m].append(tp)
    for partitions in kept.values():
        # Java keeps the lowest partition numbers first, across topics, when it must trim.
        partitions.sort(key=lambda tp: (tp.partition, tp.topic))
    if all(topics_of[m] == topics_of[active[0]] for m in active):
        _assign_equal(partitions_per_topic, active, sorted(topics_of[active[0]]), kept, plan)
    else:
        _assign_general(partitions_per_topic, active, topics_of, kept, plan)
    for partitions in plan.values():
        partitions.sort()
    return plan


def _assign_equal(
    counts: dict[str, int],
    active: list[str],
    topics: list[str],
    kept: dict[str, list[TopicPartition]],
    plan: dict[str, list[TopicPartition]],
) -> None:
    """Everyone subscribes to the same topics: quotas are known up front. Each member may hold
    ``total // n`` partitions; ``total % n`` of them one more, and those extra places go to the
    members that own the most, which keeps the most owned partitions."""
    total = sum(counts[t] for t in topics)
    quota, extra = divmod(total, len(active))
    by_owned = sorted(active, key=lambda m: (-len(kept[m]), _java_order(m)))
    cap = {m: quota + (1 if i < extra else 0) for i, m in enumerate(by_owned)}
    taken: set[TopicPartition] = set()
    for m in active:
        plan[m] = kept[m][: cap[m]]
        taken.update(plan[m])
    # Hand out the rest, each to the member holding fewest that still has room.
    room = [(len(plan[m]), _java_order(m), m) for m in active if len(plan[m]) < cap[m]]
    heapq.heapify(room)
    for topic in topics:
        for p in range(counts[topic]):
            tp = TopicPartition(topic, p)
            if tp in taken:
                continue
            held, order, m = heapq.heappop(room)
            plan[m].append(tp)
            if held + 1 < cap[m]:
                heapq.heappush(room, (held + 1, order, m))


def _assign_general(
    counts: dict[str, int],
    active: list[str],
    topics_of: dict[str, set[str]],
    kept: dict[str, list[TopicPartition]],
    plan: dict[str, list[TopicPartition]],
) -> None:
    """Subscriptions differ: no fixed quotas. Fill greedily, then rebalance by single moves until
    no partition could move to a member holding at least two fewer (Java's balance criterion)."""
    subscribers: dict[str, list[str]] = {}
    for m in active:  # already in member order
        for t in topics_of[m]:
            subscribers.setdefault(t, []).append(m)
    order = {m: _java_order(m) for m in active}
    # held[m][topic] = (kept partitions, partitions handed out this round), each ascending (kept
    # is sorted by partition; the fill goes up) so that pop() gives the highest number away.
    held: dict[str, dict[str, tuple[list[int], list[int]]]] = {m: {} for m in active}
    size = {m: len(kept[m]) for m in active}
    taken: set[TopicPartition] = set()
    for m in active:
        for tp in kept[m]:
            held[m].setdefault(tp.topic, ([], []))[0].append(tp.partition)
            taken.add(tp)
    # Topics open to the fewest members first: their partitions have the fewest places to go.
    for topic in sorted(subscribers, key=lambda t: (len(subscribers[t]), t)):
        heap = [(size[m], order[m], m) for m in subscribers[topic]]
        heapq.heapify(heap)
        for p in range(counts[topic]):
            if TopicPartition(topic, p) in taken:
                continue
            n, o, m = heapq.heappop(heap)
            held[m].setdefault(topic, ([], []))[1].append(p)
            size[m] = n + 1
            heapq.heappush(heap, (n + 1, o, m))
    _rebalance(topics_of, subscribers, order, held, size)
    for m in active:
        plan[m] = [
            TopicPartition(t, p) for t, (owned, fresh) in held[m].items() for p in owned + fresh
        ]


def _rebalance(
    topics_of: dict[str, set[str]],
    subscribers: dict[str, list[str]],
    order: dict[str, bytes],
    held: dict[str, dict[str, tuple[list[int], list[int]]]],
    size: dict[str, int],
) -> None:
    """Move partitions one at a time from the fullest member that can give one to the emptiest
    member of its topic holding at least two fewer, until there is no such move. Each move lowers
    the sum of squared sizes, so this ends; giving from the fullest first means a member that
    gave never receives later. Partitions handed out this round move before kept ones.

    Heaps with stale entries (skipped when their size no longer matches) keep each move cheap."""
    fullest = [(-size[m], order[m], m) for m in size]
    emptiest = {t: [(size[m], order[m], m) for m in ms] for t, ms in subscribers.items()}
    heapq.heapify(fullest)
    for h in emptiest.values():
        heapq.heapify(h)

    def emptiest_other(topic: str, src: str) -> str | None:
        h = emptiest[topic]
        while h[0][0] != size[h[0][2]]:
            heapq.heappop(h)
        # If src is itself the emptiest, nobody can take from it.
        return None if h[0][2] == src else h[0][2]

    while True:
        floor = min(size.values())
        seen: set[str] = set()
        passed: list[tuple[int, bytes, str]] = []
        move: tuple[str, str, str] | None = None
        while fullest and move is None:
            entry = heapq.heappop(fullest)
            src = entry[2]
            if -entry[0] != size[src] or src in seen:
                continue  # stale or duplicate
            seen.add(src)
            passed.append(entry)
            if size[src] < floor + 2:
                break  # nobody from here on holds two more than anyone
            best: tuple[bool, int, str] | None = None
            for topic, (owned, fresh) in held[src].items():
                dst = emptiest_other(topic, src) if owned or fresh else None
                if dst is None or size[dst] > size[src] - 2:
                    continue
                rank = (not fresh, size[dst], topic)
                if best is None or rank < best:
                    best, move = rank, (src, topic, dst)
        for entry in passed:
            heapq.heappush(fullest, entry)
        if move is None:
            return
        src, topic, dst = move
        owned, fresh = held[src][topic]
        partition = (fresh or owned).pop()
        bisect.insort(held[dst].setdefault(topic, ([], []))[1], partition)
        for m, delta in ((src, -1), (dst, 1)):
            size[m] += delta
            heapq.heappush(fullest, (-size[m], order[m], m))
            for t in topics_of[m]:
                heapq.heappush(emptiest[t], (size[m], order[m], m))


def _read_generation(user_data: bytes | None) -> int:
    """CooperativeStickyAssignor user data: the generation as a 4-byte int. Unreadable data reads
    as no generation, as Java."""
    if user_data is None or len(user_data) < 4:
        return _NO_GENERATION
    return int(_INT32.unpack_from(user_data, 0)[0])


class CooperativeStickyAssignor:
    """Sticky assignment under the cooperative protocol (KIP-429): a partition moving from one
    member to another is left out of this round's plan, so its old owner revokes it first (it
    sees the partition missing) and the rejoin that follows hands it over. A member thus never
    starts on a partition another may still be consuming."""

    name = "cooperative-sticky"
    rebalance_protocol = "cooperative"

    def subscription_user_data(
        self, topics: set[str], owned: list[TopicPartition], generation: int
    ) -> bytes | None:
        # Subscriptions v2+ carry the generation themselves (KIP-792); Java still writes it here
        # for leaders reading v0/v1.
        return _INT32.pack(generation)

    def assign(
        self, partitions_per_topic: dict[str, int], members: list[MemberSubscription]
    ) -> dict[str, list[TopicPartition]]:
        claims = {m.member_id: self._member_claims(m.subscription) for m in members}
        ownership = _resolve_ownership(claims)
        plan = _sticky_assign(partitions_per_topic, members, ownership)
        for m, partitions in plan.items():
            # Withhold what someone claims and this member is not the valid owner of: a move, or
            # a partition whose claims cancelled out. Its claimers drop it now, so nobody claims
            # it at the next rebalance. (Java's general path hands a partition straight to a member
            # with a stale claim on it; withholding that too is the safe side.)
            plan[m] = [
                tp
                for tp in partitions
                if tp not in ownership.claimed or ownership.owner.get(tp) == m
            ]
        return plan

    @staticmethod
    def _member_claims(sub: Subscription) -> tuple[list[TopicPartition], int]:
        # Owned partitions always come from the subscription (v1+); the generation from it when
        # present (v2+), else from the user data older members put it in.
        generation = sub.generation_id
        if generation < 0:
            generation = _read_generation(sub.user_data)
        return sub.owned_partitions, generation


def _encode_sticky_user_data(partitions: Iterable[TopicPartition], generation: int) -> bytes:
    by_topic: dict[str, list[int]] = {}
    for tp in sorted(partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    out = bytearray(_INT32.pack(len(by_topic)))
    for topic, parts in by_topic.items():
        name = topic.encode()
        out += _INT16.pack(len(name)) + name + _INT32.pack(len(parts))
        out += struct.pack(f">{len(parts)}i", *parts)
    out += _INT32.pack(generation)
    return bytes(out)


def _decode_sticky_user_data(data: bytes) -> tuple[list[TopicPartition], int]:
    """StickyAssignor user data v1 (previous assignment, generation), else v0 (without the
    generation); unreadable data means nothing owned, as Java."""
    try:
        pos = 4
        (n_topics,) = _INT32.unpack_from(data, 0)
        if n_topics < 0:
            raise ValueError("null array")
        partitions: list[TopicPartition] = []
        for _ in range(n_topics):
            (size,) = _INT16.unpack_from(data, pos)
            if size < 0 or pos + 2 + size > len(data):
                raise ValueError("bad topic")
            topic = bytes(data[pos + 2 : pos + 2 + size]).decode()
            pos += 2 + size
            (count,) = _INT32.unpack_from(data, pos)
            if count < 0 or pos + 4 + 4 * count > len(data):
                raise ValueError("bad partitions")
            parts = struct.unpack_from(f">{count}i", data, pos + 4)
            pos += 4 + 4 * count
            partitions.extend(TopicPartition(topic, p) for p in parts)
    except (struct.error, ValueError):
        return [], _NO_GENERATION
    if len(data) - pos >= 4:
        return partitions, int(_INT32.unpack_from(data, pos)[0])
    return partitions, _NO_GENERATION  # v0: no generation


class StickyAssignor:
    """The eager sticky assignor (Java's ``sticky``): the same balanced, sticky plan, with nothing
    withheld since under the eager protocol every member revokes everything before rejoining.
    Its previous assignment therefore travels in the user data, not in the owned partitions:
    pass the partitions of the last assignment received as ``owned``."""

    name = "sticky"
    rebalance_protocol = "eager"

    def subscription_user_data(
        self, topics: set[str], owned: list[TopicPartition], generation: int
    ) -> bytes | None:
        if generation < 0 and not owned:
            return None  # never assigned: Java sends no user data
        return _encode_sticky_user_data(owned, generation)

    def assign(
        self, partitions_per_topic: dict[str, int], members: list[MemberSubscription]
    ) -> dict[str, list[TopicPartition]]:
        claims = {
            m.member_id: (
                _decode_sticky_user_data(m.subscription.user_data)
                if m.subscription.user_data
                else ([], _NO_GENERATION)
            )
            for m in members
        }
        return _sticky_assign(partitions_per_topic, members, _resolve_ownership(claims))


ASSIGNORS: dict[str, type[Assignor]] = {
    "range": RangeAssignor,
    "roundrobin": RoundRobinAssignor,
    "sticky": StickyAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
}


def assignor_for(name: str) -> Assignor:
    """A fresh assignor by its protocol name (a ``partition.assignment.strategy`` entry)."""
    cls = ASSIGNORS.get(name)
    if cls is None:
        raise ConfigError(
            "partition.assignment.strategy",
            f"unknown assignor {name!r}; kcore has {', '.join(sorted(ASSIGNORS))}",
        )
    return cls()
