"""Consumer group assignors and the ConsumerProtocol bytes they travel in: results the Java client
gives (its Javadoc examples and hand-computed cases), properties over generated groups, and byte
interop with kafka-python's encoders and hand-built Java blobs. No broker needed."""

from __future__ import annotations

import random
import re
import struct
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcore.consumer import assignors
from kcore.consumer.assignors import (
    ASSIGNORS,
    Assignor,
    CooperativeStickyAssignor,
    MemberSubscription,
    StickyAssignor,
    Subscription,
    assignor_for,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from kcore.errors import ConfigError, KcoreError, TruncatedDataError, UnsupportedVersionError
from kcore.types import TopicPartition

Plan = dict[str, list[TopicPartition]]
Group = tuple[dict[str, int], list[MemberSubscription]]


def tps(spec: str) -> list[TopicPartition]:
    """``"t0p0 t1p2"`` (the Javadoc's notation) as TopicPartitions."""
    out = []
    for word in spec.split():
        match = re.fullmatch(r"(.+)p(\d+)", word)
        assert match, word
        out.append(TopicPartition(match[1], int(match[2])))
    return out


def member(
    member_id: str,
    topics: list[str],
    owned: str = "",
    generation: int = -1,
    instance: str | None = None,
    user_data: bytes | None = None,
) -> MemberSubscription:
    sub = Subscription(list(topics), user_data, tps(owned), generation)
    return MemberSubscription(member_id, instance, sub)


def shown(plan: Plan) -> dict[str, str]:
    """A plan in the Javadoc's notation, each member's partitions sorted."""
    return {m: " ".join(f"{tp.topic}p{tp.partition}" for tp in sorted(p)) for m, p in plan.items()}


def all_partitions(
    counts: dict[str, int], members: list[MemberSubscription]
) -> set[TopicPartition]:
    wanted = {t for m in members for t in m.subscription.topics}
    return {TopicPartition(t, p) for t, n in counts.items() if t in wanted for p in range(n)}


def next_round(members: list[MemberSubscription], plan: Plan) -> list[MemberSubscription]:
    """Every member rejoins owning what it was given, one generation later (cooperative)."""
    return [
        MemberSubscription(
            m.member_id,
            m.group_instance_id,
            Subscription(
                m.subscription.topics,
                owned_partitions=list(plan[m.member_id]),
                generation_id=max(m.subscription.generation_id, 0) + 1,
            ),
        )
        for m in members
    ]


# ---------------------------------------------------------------------------------------------
# range


def test_range_javadoc_example() -> None:
    counts = {"t0": 3, "t1": 3}
    plan = assignor_for("range").assign(
        counts, [member("C0", ["t0", "t1"]), member("C1", ["t0", "t1"])]
    )
    assert shown(plan) == {"C0": "t0p0 t0p1 t1p0 t1p1", "C1": "t0p2 t1p2"}


def test_range_three_members_two_topics() -> None:
    counts = {"t0": 3, "t1": 3}
    members = [member(c, ["t0", "t1"]) for c in ("C2", "C0", "C1")]  # input order is irrelevant
    plan = assignor_for("range").assign(counts, members)
    assert shown(plan) == {"C0": "t0p0 t1p0", "C1": "t0p1 t1p1", "C2": "t0p2 t1p2"}


def test_range_uneven_split_and_partial_subscriptions() -> None:
    # t0: 7 over C0, C1, C2 -> 3, 2, 2. t1: only C1 and C2 -> 2, 2 (C1 first).
    counts = {"t0": 7, "t1": 4}
    members = [member("C0", ["t0"]), member("C1", ["t0", "t1"]), member("C2", ["t1", "t0"])]
    assert shown(assignor_for("range").assign(counts, members)) == {
        "C0": "t0p0 t0p1 t0p2",
        "C1": "t0p3 t0p4 t1p0 t1p1",
        "C2": "t0p5 t0p6 t1p2 t1p3",
    }


def test_range_static_members_sort_by_instance_id_and_come_first() -> None:
    # Java's MemberInfo order: members with a group.instance.id first, by it; then the rest by
    # member id. So "a" (dynamic) comes after both static members despite its member id.
    counts = {"t": 4}
    members = [
        member("a", ["t"]),
        member("z", ["t"], instance="I0"),
        member("b", ["t"], instance="I1"),
    ]
    assert shown(assignor_for("range").assign(counts, members)) == {
        "z": "tp0 tp1",
        "b": "tp2",
        "a": "tp3",
    }


def test_range_orders_member_ids_as_java_strings() -> None:
    # Java compares UTF-16 code units: U+FF5E sorts after U+1F600 (a surrogate pair, 0xD83D...),
    # the opposite of Python's code point order.
    high_bmp, astral = "\uff5e", "\U0001f600"
    plan = assignor_for("range").assign({"t": 2}, [member(high_bmp, ["t"]), member(astral, ["t"])])
    assert plan[astral] == tps("tp0") and plan[high_bmp] == tps("tp1")


def test_unknown_topics_and_empty_subscriptions() -> None:
    counts = {"t": 2, "unsubscribed": 5, "empty": 0}
    members = [member("A", ["t", "ghost", "empty"]), member("B", ["ghost"]), member("C", [])]
    for name in ASSIGNORS:
        plan = assignor_for(name).assign(counts, members)
        assert shown(plan) == {"A": "tp0 tp1", "B": "", "C": ""}, name
    for name in ASSIGNORS:
        assert assignor_for(name).assign({}, []) == {}


# ---------------------------------------------------------------------------------------------
# roundrobin


def test_roundrobin_javadoc_examples() -> None:
    rr = assignor_for("roundrobin")
    plan = rr.assign({"t0": 3, "t1": 3}, [member("C0", ["t0", "t1"]), member("C1", ["t0", "t1"])])
    assert shown(plan) == {"C0": "t0p0 t0p2 t1p1", "C1": "t0p1 t1p0 t1p2"}

    members = [member("C0", ["t0"]), member("C1", ["t0", "t1"]), member("C2", ["t0", "t1", "t2"])]
    plan = rr.assign({"t0": 1, "t1": 2, "t2": 3}, members)
    assert shown(plan) == {"C0": "t0p0", "C1": "t1p0", "C2": "t1p1 t2p0 t2p1 t2p2"}


def test_roundrobin_static_members() -> None:
    # The Javadoc's rolling-bounce example: new member ids, same instance ids, same plan.
    counts = {"t0": 3, "t1": 3}
    before = [member(f"C{i}", ["t0", "t1"], instance=f"I{i}") for i in range(3)]
    after = [member(m, ["t0", "t1"], instance=f"I{i}") for i, m in enumerate(["C5", "C3", "C4"])]
    rr = assignor_for("roundrobin")
    assert shown(rr.assign(counts, before)) == {
        "C0": "t0p0 t1p0",
        "C1": "t0p1 t1p1",
        "C2": "t0p2 t1p2",
    }
    assert shown(rr.assign(counts, after)) == {
        "C5": "t0p0 t1p0",
        "C3": "t0p1 t1p1",
        "C4": "t0p2 t1p2",
    }


# ---------------------------------------------------------------------------------------------
# sticky and cooperative-sticky


def test_sticky_javadoc_example_1() -> None:
    topics = ["t0", "t1", "t2", "t3"]
    counts = dict.fromkeys(topics, 2)
    first = {"C0": "t0p0 t1p1 t3p0", "C1": "t0p1 t2p0 t3p1", "C2": "t1p0 t2p1"}
    for name in ("sticky", "cooperative-sticky"):
        plan = assignor_for(name).assign(counts, [member(c, topics) for c in first])
        assert shown(plan) == first, name
    # C1 leaves; the others keep everything and split C1's partitions.
    survivors = [member("C0", topics, first["C0"], 1), member("C2", topics, first["C2"], 1)]
    plan = assignor_for("cooperative-sticky").assign(counts, survivors)
    assert shown(plan) == {"C0": "t0p0 t1p1 t2p0 t3p0", "C2": "t0p1 t1p0 t2p1 t3p1"}


def test_sticky_javadoc_example_2_different_subscriptions() -> None:
    counts = {"t0": 1, "t1": 2, "t2": 3}
    subs = {"C0": ["t0"], "C1": ["t0", "t1"], "C2": ["t0", "t1", "t2"]}
    coop = assignor_for("cooperative-sticky")
    plan = coop.assign(counts, [member(m, t) for m, t in subs.items()])
    assert shown(plan) == {"C0": "t0p0", "C1": "t1p0 t1p1", "C2": "t2p0 t2p1 t2p2"}
    # C0 leaves: its partition goes to C1, the less loaded of those subscribed to t0.
    rest = [member(m, subs[m], shown(plan)[m], 1) for m in ("C1", "C2")]
    assert shown(coop.assign(counts, rest)) == {"C1": "t0p0 t1p0 t1p1", "C2": "t2p0 t2p1 t2p2"}


def test_cooperative_join_withholds_then_hands_over() -> None:
    coop = assignor_for("cooperative-sticky")
    counts = {"t": 6}
    members = [
        member("A", ["t"], "tp0 tp1 tp2", 4),
        member("B", ["t"], "tp3 tp4 tp5", 4),
        member("C", ["t"]),  # joins
    ]
    # The sticky target is A: 0 1, B: 3 4, C: 2 5. Partitions 2 and 5 move, so this round C gets
    # nothing; A and B see them missing and revoke them.
    first = coop.assign(counts, members)
    assert shown(first) == {"A": "tp0 tp1", "B": "tp3 tp4", "C": ""}
    second = coop.assign(counts, next_round(members, first))
    assert shown(second) == {"A": "tp0 tp1", "B": "tp3 tp4", "C": "tp2 tp5"}
    # And then it is stable.
    assert coop.assign(counts, next_round(members, second)) == second


def test_cooperative_leave_moves_nothing_owned() -> None:
    coop = assignor_for("cooperative-sticky")
    counts = {"t": 6}
    members = [member("A", ["t"], "tp0 tp1", 2), member("B", ["t"], "tp2 tp3", 2)]
    # C (owning 4 and 5) has left: its partitions are nobody's, so nothing is withheld.
    assert shown(coop.assign(counts, members)) == {"A": "tp0 tp1 tp4", "B": "tp2 tp3 tp5"}


def test_eager_sticky_hands_over_at_once() -> None:
    # Under the eager protocol everyone revoked everything: no withholding.
    sticky = StickyAssignor()
    counts = {"t": 6}
    members = [
        member("A", ["t"], user_data=sticky.subscription_user_data({"t"}, tps("tp0 tp1 tp2"), 4)),
        member("B", ["t"], user_data=sticky.subscription_user_data({"t"}, tps("tp3 tp4 tp5"), 4)),
        member("C", ["t"], user_data=sticky.subscription_user_data({"t"}, [], -1)),
    ]
    assert members[2].subscription.user_data is None
    assert shown(sticky.assign(counts, members)) == {"A": "tp0 tp1", "B": "tp3 tp4", "C": "tp2 tp5"}


def test_cooperative_stale_claim_loses_to_higher_generation() -> None:
    coop = assignor_for("cooperative-sticky")
    counts = {"t": 4}
    members = [
        member("A", ["t"], "tp0 tp1", 7),
        member("B", ["t"], "tp1 tp2 tp3", 5),  # tp1 is a stale claim from generation 5
    ]
    plan = coop.assign(counts, members)
    # A keeps tp1 (higher generation); B keeps 2 of its valid 2 and 3. Nothing moves.
    assert shown(plan) == {"A": "tp0 tp1", "B": "tp2 tp3"}


def test_cooperative_same_generation_double_claim_is_withheld() -> None:
    coop = assignor_for("cooperative-sticky")
    counts = {"t": 4}
    members = [member("A", ["t"], "tp0 tp1", 3), member("B", ["t"], "tp1 tp2 tp3", 3)]
    first = coop.assign(counts, members)
    # Neither claim on tp1 is trusted: tp1 is handed out but withheld from whoever gets it, and
    # given at the next rebalance (Java's ConstrainedAssignmentBuilder does the same).
    assert TopicPartition("t", 1) not in {tp for p in first.values() for tp in p}
    assert shown(first) == {"A": "tp0", "B": "tp2 tp3"}
    second = coop.assign(counts, next_round(members, first))
    assert shown(second) == {"A": "tp0 tp1", "B": "tp2 tp3"}


def test_cooperative_generation_from_user_data_for_old_subscriptions() -> None:
    # A v1 subscription (Java 2.4 - 3.3) has owned partitions but no generation field: the
    # generation travels in the assignor's user data instead.
    coop = CooperativeStickyAssignor()
    counts = {"t": 2}

    def old(member_id: str, owned: str, generation: int) -> MemberSubscription:
        data = encode_subscription(
            Subscription(
                ["t"], coop.subscription_user_data({"t"}, tps(owned), generation), tps(owned)
            ),
            version=1,
        )
        return MemberSubscription(member_id, None, decode_subscription(data))

    a, b = old("A", "tp0 tp1", 9), old("B", "tp1", 8)
    assert a.subscription.generation_id == -1
    # A's claim on tp1 (generation 9) beats B's (8). Balance moves tp1 to B, and since A still
    # owns it, it is withheld this round.
    assert shown(coop.assign(counts, [a, b])) == {"A": "tp0", "B": ""}


def test_cooperative_user_data_is_java_int32_generation() -> None:
    coop = assignor_for("cooperative-sticky")
    assert coop.subscription_user_data({"t"}, [], 42) == b"\x00\x00\x00\x2a"
    assert coop.subscription_user_data(set(), [], -1) == b"\xff\xff\xff\xff"
    # Unreadable user data means no generation, as Java.
    read = CooperativeStickyAssignor._member_claims
    assert read(Subscription(["t"], b"\x01"))[1] == -1
    assert read(Subscription(["t"], None))[1] == -1
    assert read(Subscription(["t"], b"\x00\x00\x00\x07junk"))[1] == 7
    assert read(Subscription(["t"], b"\x00\x00\x00\x07", generation_id=3))[1] == 3


# ---------------------------------------------------------------------------------------------
# StickyAssignor user data: Java's StickyAssignorUserData v1 (v0 has no generation)

# topics: [("t0", [1]), ("t1", [0, 2])], generation 7, laid out by hand from the schema
STICKY_V1 = bytes.fromhex(
    "00000002"  # 2 topics
    "0002"
    "7430"
    "00000001"
    "00000001"  # "t0": [1]
    "0002"
    "7431"
    "00000002"
    "00000000"
    "00000002"  # "t1": [0, 2]
    "00000007"  # generation
)


def test_sticky_user_data_bytes() -> None:
    data = StickyAssignor().subscription_user_data({"t0", "t1"}, tps("t1p2 t0p1 t1p0"), 7)
    assert data == STICKY_V1
    from kafka.coordinator.assignors.sticky.user_data import StickyAssignorUserData

    theirs = StickyAssignorUserData([("t0", [1]), ("t1", [0, 2])], 7).encode(header=False)
    assert theirs == STICKY_V1


def test_sticky_user_data_decoding() -> None:
    decode = assignors._decode_sticky_user_data
    assert decode(STICKY_V1) == (tps("t0p1 t1p0 t1p2"), 7)
    assert decode(STICKY_V1[:-4]) == (tps("t0p1 t1p0 t1p2"), -1)  # v0
    assert decode(STICKY_V1[:-5]) == ([], -1)  # unreadable: ignored
    assert decode(b"\xff\xff\xff\xff") == ([], -1)
    # Used for ownership: B's previous assignment (generation 7) beats A's stale one.
    sticky = StickyAssignor()
    members = [
        member("A", ["t0", "t1"], user_data=sticky.subscription_user_data(set(), tps("t0p1"), 3)),
        member("B", ["t0", "t1"], user_data=STICKY_V1),
    ]
    assert shown(sticky.assign({"t0": 2, "t1": 3}, members)) == {
        "A": "t0p0 t1p1",
        "B": "t0p1 t1p0 t1p2",
    }


# ---------------------------------------------------------------------------------------------
# the registry


def test_assignor_for() -> None:
    assert set(ASSIGNORS) == {"range", "roundrobin", "sticky", "cooperative-sticky"}
    for name, cls in ASSIGNORS.items():
        a: Assignor = assignor_for(name)
        assert isinstance(a, cls) and a.name == name
        expected = "cooperative" if name == "cooperative-sticky" else "eager"
        assert a.rebalance_protocol == expected
    assert assignor_for("range") is not assignor_for("range")
    with pytest.raises(ConfigError, match="partition.assignment.strategy"):
        assignor_for("org.example.MyAssignor")


# ---------------------------------------------------------------------------------------------
# Properties over generated groups

TOPICS = ["t0", "t1", "t2", "t3"]
MEMBER_IDS = ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "\U0001f600", "\uff5e"]


@st.composite
def groups(draw: st.DrawFn, same_topics: bool = False, valid_claims: bool = False) -> Group:
    """(partition counts, members). Claims are random: overlapping, stale, or on partitions that
    no longer exist, unless ``valid_claims`` (each partition claimed once, same generation)."""
    sizes = draw(st.lists(st.integers(0, 9), min_size=1, max_size=len(TOPICS)))
    counts = dict(zip(TOPICS[: len(sizes)], sizes, strict=True))
    ids = draw(st.lists(st.sampled_from(MEMBER_IDS), min_size=1, max_size=7, unique=True))
    pool = [*TOPICS, "ghost"]
    subscription = st.lists(st.sampled_from(pool), max_size=len(pool), unique=True)
    common = draw(subscription.filter(bool))
    existing = [TopicPartition(t, p) for t, n in counts.items() for p in range(n)]
    owner = draw(
        st.lists(st.sampled_from([None, *ids]), min_size=len(existing), max_size=len(existing))
    )
    claim = st.builds(TopicPartition, st.sampled_from(TOPICS), st.integers(0, 10))
    members = []
    for member_id in ids:
        topics = common if same_topics else draw(subscription)
        if valid_claims:
            owned = [tp for tp, o in zip(existing, owner, strict=True) if o == member_id]
            generation = 5
        else:
            owned = list(dict.fromkeys(draw(st.lists(claim, max_size=10))))
            generation = draw(st.integers(-1, 3))
        static = draw(st.booleans())
        sub = Subscription(list(topics), owned_partitions=owned, generation_id=generation)
        members.append(MemberSubscription(member_id, f"i-{member_id}" if static else None, sub))
    return counts, members


def check_complete(plan: Plan, counts: dict[str, int], members: list[MemberSubscription]) -> None:
    assert set(plan) == {m.member_id for m in members}
    given = [tp for p in plan.values() for tp in p]
    assert Counter(given) == Counter(all_partitions(counts, members))
    for m in members:
        for tp in plan[m.member_id]:
            assert tp.topic in m.subscription.topics


def check_java_balanced(plan: Plan, members: list[MemberSubscription]) -> None:
    """AbstractStickyAssignor's isBalanced: no partition could move to a member subscribed to
    its topic that holds at least two fewer."""
    sizes = {m: len(p) for m, p in plan.items()}
    for m in members:
        for other, partitions in plan.items():
            if sizes[other] >= sizes[m.member_id] + 2:
                assert not any(tp.topic in m.subscription.topics for tp in partitions)


def optimum_kept(counts: dict[str, int], members: list[MemberSubscription]) -> int:
    """How many owned partitions a balanced plan can keep at best, all members subscribing to the
    same topics: the ``total % n`` larger shares go to those owning the most."""
    total = len(all_partitions(counts, members))
    quota, extra = divmod(total, len(members))
    owned = sorted((len(valid_owned(counts, m)) for m in members), reverse=True)
    return sum(min(n, quota + (i < extra)) for i, n in enumerate(owned))


def valid_owned(counts: dict[str, int], m: MemberSubscription) -> set[TopicPartition]:
    return {
        tp
        for tp in m.subscription.owned_partitions
        if tp.topic in m.subscription.topics and tp.partition < counts.get(tp.topic, 0)
    }


def as_eager(members: list[MemberSubscription]) -> list[MemberSubscription]:
    sticky = StickyAssignor()
    return [
        MemberSubscription(
            m.member_id,
            m.group_instance_id,
            Subscription(
                m.subscription.topics,
                sticky.subscription_user_data(
                    set(), m.subscription.owned_partitions, m.subscription.generation_id
                ),
            ),
        )
        for m in members
    ]


FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(groups())
def test_eager_assignors_give_every_partition_once_sticky_balanced(group: Group) -> None:
    counts, members = group
    for name in ("range", "roundrobin", "sticky"):
        check_complete(assignor_for(name).assign(counts, members), counts, members)
    check_java_balanced(StickyAssignor().assign(counts, as_eager(members)), members)


@FAST
@given(groups(), st.randoms(use_true_random=False))
def test_deterministic_whatever_the_member_order(group: Group, rnd: random.Random) -> None:
    counts, members = group
    shuffled = list(members)
    rnd.shuffle(shuffled)
    for name in ASSIGNORS:
        assert assignor_for(name).assign(counts, members) == assignor_for(name).assign(
            counts, shuffled
        ), name


@FAST
@given(groups(same_topics=True))
def test_balanced_when_subscriptions_are_the_same(group: Group) -> None:
    counts, members = group
    if not all_partitions(counts, members):
        return
    for name in ("roundrobin", "sticky"):
        plan = assignor_for(name).assign(counts, members)
        sizes = [len(p) for p in plan.values()]
        assert max(sizes) - min(sizes) <= 1, name


@FAST
@given(groups(same_topics=True, valid_claims=True))
def test_sticky_keeps_as_much_as_balance_allows(group: Group) -> None:
    counts, members = group
    if not all_partitions(counts, members):
        return
    plan = StickyAssignor().assign(counts, as_eager(members))
    kept = sum(len(valid_owned(counts, m) & set(plan[m.member_id])) for m in members)
    assert kept == optimum_kept(counts, members)


@FAST
@given(groups(same_topics=True, valid_claims=True))
def test_general_algorithm_is_as_sticky_on_equal_subscriptions(group: Group) -> None:
    # The general path (used when subscriptions differ) must not be worse where both apply.
    counts, members = group
    if not all_partitions(counts, members):
        return
    topics = sorted({t for t in members[0].subscription.topics if counts.get(t, 0) > 0})
    active = sorted((m.member_id for m in members), key=assignors._java_order)
    kept = {
        m.member_id: sorted(valid_owned(counts, m), key=lambda tp: (tp.partition, tp.topic))
        for m in members
    }
    plan: Plan = {}
    topics_of = {m: set(topics) for m in active}
    assignors._assign_general(counts, active, topics_of, kept, plan)
    sizes = [len(p) for p in plan.values()]
    assert max(sizes) - min(sizes) <= 1
    assert sum(len(set(kept[m]) & set(plan[m])) for m in active) == optimum_kept(counts, members)


@FAST
@given(groups())
def test_sticky_plans_are_stable(group: Group) -> None:
    # A plan fed back as what everyone owns comes back unchanged.
    counts, members = group
    sticky = StickyAssignor()
    plan = sticky.assign(counts, as_eager(members))
    assert sticky.assign(counts, as_eager(next_round(members, plan))) == plan


@FAST
@given(groups())
def test_cooperative_rounds_settle(group: Group) -> None:
    """Rejoining with what was given, the group reaches a complete plan, which then stays. With
    equal subscriptions that takes one extra round, in which nobody loses what it was given."""
    counts, members = group
    coop = CooperativeStickyAssignor()
    plans = [coop.assign(counts, members)]
    while sum(map(len, plans[-1].values())) < len(all_partitions(counts, members)):
        assert len(plans) < 4, plans
        plans.append(coop.assign(counts, next_round(members, plans[-1])))
    check_complete(plans[-1], counts, members)
    check_java_balanced(plans[-1], members)
    assert coop.assign(counts, next_round(members, plans[-1])) == plans[-1]
    if len({frozenset(m.subscription.topics) for m in members}) == 1:
        assert len(plans) <= 2
        for m, partitions in plans[0].items():
            assert set(partitions) <= set(plans[-1][m])


@FAST
@given(groups())
def test_cooperative_never_gives_what_another_member_may_still_consume(group: Group) -> None:
    counts, members = group
    plan = CooperativeStickyAssignor().assign(counts, members)
    given_out = [tp for p in plan.values() for tp in p]
    assert len(given_out) == len(set(given_out))
    assert set(given_out) <= all_partitions(counts, members)
    claims = {m.member_id: m.subscription for m in members}
    for member_id, partitions in plan.items():
        for tp in partitions:
            rivals = [
                s.generation_id
                for other, s in claims.items()
                if other != member_id and tp in s.owned_partitions
            ]
            if rivals:
                mine = claims[member_id]
                assert tp in mine.owned_partitions and mine.generation_id > max(rivals)


def test_large_groups_are_quick() -> None:
    # One member owned everything; 99 join; one subscribes to an extra topic, which takes the
    # general (unequal subscriptions) path. Must stay well under a second or two.
    import time

    counts = {f"t{i}": 500 for i in range(10)} | {"x": 5}
    everything = [TopicPartition(t, p) for t in counts if t != "x" for p in range(500)]
    members = [
        member(f"m{i:03d}", [*(t for t in counts if t != "x"), *(["x"] if i == 99 else [])])
        for i in range(100)
    ]
    members[0].subscription.owned_partitions = everything
    members[0].subscription.generation_id = 1
    start = time.perf_counter()
    plan = StickyAssignor().assign(counts, as_eager(members))
    assert time.perf_counter() - start < 10
    check_complete(plan, counts, members)
    check_java_balanced(plan, members)


# ---------------------------------------------------------------------------------------------
# ConsumerProtocol bytes


def kp_subscription(version: int, sub: Subscription) -> Any:
    """The same subscription built with kafka-python's ConsumerProtocolSubscription."""
    from kafka.protocol.consumer.metadata import ConsumerProtocolSubscription as KS

    grouped: dict[str, list[int]] = {}
    for tp in sorted(sub.owned_partitions):
        grouped.setdefault(tp.topic, []).append(tp.partition)
    fields: dict[str, Any] = {"topics": sorted(sub.topics), "user_data": sub.user_data}
    if version >= 1:
        fields["owned_partitions"] = [
            KS.TopicPartition(topic=t, partitions=p) for t, p in grouped.items()
        ]
    if version >= 2:
        fields["generation_id"] = sub.generation_id
    if version >= 3:
        fields["rack_id"] = sub.rack_id
    return KS(version=version, **fields)


SAMPLE = Subscription(
    topics=["orders", "audit"],
    user_data=b"\x00\x00\x00\x05",
    owned_partitions=tps("ordersp1 auditp0 ordersp0"),
    generation_id=5,
    rack_id="rack-a",
)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_subscription_bytes_match_kafka_python(version: int) -> None:
    theirs = kp_subscription(version, SAMPLE).encode()
    assert encode_subscription(SAMPLE, version) == theirs
    back = decode_subscription(theirs)
    assert back.topics == ["audit", "orders"]
    assert back.user_data == SAMPLE.user_data
    assert back.owned_partitions == (tps("auditp0 ordersp0 ordersp1") if version >= 1 else [])
    assert back.generation_id == (5 if version >= 2 else -1)
    assert back.rack_id == ("rack-a" if version >= 3 else None)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_bytes_match_kafka_python(version: int) -> None:
    from kafka.protocol.consumer.metadata import ConsumerProtocolAssignment as KA

    # Java groups by topic in first-appearance order and keeps each topic's partition order.
    partitions = tps("bp2 ap0 bp0 ap1")
    theirs = KA(
        version=version,
        assigned_partitions=[
            KA.TopicPartition(topic="b", partitions=[2, 0]),
            KA.TopicPartition(topic="a", partitions=[0, 1]),
        ],
        user_data=b"ud",
    ).encode()
    assert encode_assignment(partitions, b"ud", version) == theirs
    assert decode_assignment(theirs) == (tps("bp2 bp0 ap0 ap1"), b"ud")
    assert KA.decode(encode_assignment(partitions, None, version)).user_data is None


def test_kafka_python_v0_structs() -> None:
    from kafka.protocol.old.consumer_protocol import (
        ConsumerProtocolMemberAssignment_v0,
        ConsumerProtocolMemberMetadata_v0,
    )

    meta = ConsumerProtocolMemberMetadata_v0(0, ["a", "b"], b"").encode()
    assert decode_subscription(meta) == Subscription(["a", "b"], b"")
    assert encode_subscription(Subscription(["b", "a"], b""), 0) == meta
    blob = ConsumerProtocolMemberAssignment_v0(0, [("t", [3, 1])], None).encode()
    assert decode_assignment(blob) == (tps("tp3 tp1"), None)
    assert encode_assignment(tps("tp3 tp1"), None, 0) == blob


# A Java 2.3 consumer (RangeAssignor, no user data) subscribing to "events" and "logs", written
# from the ConsumerProtocolSubscription v0 schema: version, topics, nullable user data.
JAVA_V0_SUBSCRIPTION = bytes.fromhex(
    "0000"  # version 0
    "00000002"  # 2 topics, sorted as Java writes them
    "0006" + b"events".hex() + "0004" + b"logs".hex() + "ffffffff"  # user data: null
)

# A Java 2.4 cooperative-sticky member of generation 3 owning events-0 and events-2 (v1: owned
# partitions added; the generation only in the user data, as a 4-byte int).
JAVA_V1_SUBSCRIPTION = bytes.fromhex(
    "0001"  # version 1
    "00000001"
    + "0006"
    + b"events".hex()  # topics
    + "00000004"
    + "00000003"  # user data: generation 3
    + "00000001"  # owned: 1 topic
    + "0006"
    + b"events".hex()
    + "00000002"
    + "00000000"
    + "00000002"
)

# A Java assignment v0: events-1, events-0; null user data.
JAVA_V0_ASSIGNMENT = bytes.fromhex(
    "0000" + "00000001" + "0006" + b"events".hex() + "00000002" + "00000001" + "00000000ffffffff"
)


def test_java_blobs() -> None:
    assert decode_subscription(JAVA_V0_SUBSCRIPTION) == Subscription(["events", "logs"])
    assert encode_subscription(Subscription(["logs", "events"]), 0) == JAVA_V0_SUBSCRIPTION

    v1 = decode_subscription(JAVA_V1_SUBSCRIPTION)
    assert v1 == Subscription(["events"], b"\x00\x00\x00\x03", tps("eventsp0 eventsp2"))
    assert CooperativeStickyAssignor._member_claims(v1) == (tps("eventsp0 eventsp2"), 3)
    coop = CooperativeStickyAssignor()
    written = encode_subscription(
        Subscription(
            ["events"], coop.subscription_user_data({"events"}, [], 3), v1.owned_partitions
        ),
        1,
    )
    assert written == JAVA_V1_SUBSCRIPTION

    assert decode_assignment(JAVA_V0_ASSIGNMENT) == (tps("eventsp1 eventsp0"), None)
    assert encode_assignment(tps("eventsp1 eventsp0"), version=0) == JAVA_V0_ASSIGNMENT


def test_newer_versions_read_as_the_newest_known() -> None:
    # A v4 writer would append fields; Java reads what v3 knows and ignores the rest.
    v3 = encode_subscription(SAMPLE, 3)
    assert decode_subscription(b"\x00\x04" + v3[2:] + b"future fields") == decode_subscription(v3)
    a3 = encode_assignment(tps("tp0"), b"u")
    assert decode_assignment(b"\x00\x09" + a3[2:] + b"\x00\x01")[0] == tps("tp0")
    # Writing a newer version than known writes the newest known, header included (as Java).
    assert encode_subscription(SAMPLE, 9) == v3
    assert encode_assignment(tps("tp0"), b"u", 9) == a3


def test_malformed_bytes() -> None:
    for data in (b"", b"\x00"):
        with pytest.raises(TruncatedDataError):
            decode_subscription(data)
        with pytest.raises(TruncatedDataError):
            decode_assignment(data)
    with pytest.raises(UnsupportedVersionError):
        decode_subscription(b"\xff\xff" + encode_subscription(SAMPLE)[2:])
    with pytest.raises(UnsupportedVersionError):
        encode_assignment([], version=-1)
    full = encode_subscription(SAMPLE)
    for cut in range(2, len(full)):
        with pytest.raises(KcoreError):
            decode_subscription(full[:cut])


def test_empty_rack_reads_as_none() -> None:
    data = encode_subscription(Subscription(["t"], rack_id=""))
    assert data.endswith(b"\x00\x00")  # an empty string, not null
    assert decode_subscription(data).rack_id is None


def test_owned_partitions_are_sorted_and_grouped_as_java() -> None:
    sub = Subscription(["t"], owned_partitions=tps("bp1 ap2 bp0 ap0"))
    body = encode_subscription(sub)[2:]
    expected = (
        struct.pack(">i", 1)
        + b"\x00\x01t"
        + struct.pack(">i", -1)
        + struct.pack(">i", 2)
        + b"\x00\x01a"
        + struct.pack(">3i", 2, 0, 2)
        + b"\x00\x01b"
        + struct.pack(">3i", 2, 0, 1)
        + struct.pack(">i", -1)
        + b"\xff\xff"
    )
    assert body == expected


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=5), max_size=4),
    st.none() | st.binary(max_size=8),
    st.lists(
        st.tuples(st.sampled_from(TOPICS), st.integers(0, 2**31 - 1)), max_size=6, unique=True
    ),
    st.integers(-(2**31), 2**31 - 1),
    st.none() | st.text(min_size=1, max_size=5),
)
def test_subscription_round_trip(
    topics: list[str],
    user_data: bytes | None,
    owned: list[tuple[str, int]],
    generation: int,
    rack: str | None,
) -> None:
    partitions = [TopicPartition(*o) for o in owned]
    sub = Subscription(topics, user_data, partitions, generation, rack)
    back = decode_subscription(encode_subscription(sub))
    assert back == Subscription(sorted(topics), user_data, sorted(partitions), generation, rack)
    # Assignments come back grouped by topic, topics in first-appearance order.
    first_seen = list(dict.fromkeys(tp.topic for tp in partitions))
    grouped = sorted(partitions, key=lambda tp: first_seen.index(tp.topic))
    assert decode_assignment(encode_assignment(partitions, user_data)) == (grouped, user_data)
