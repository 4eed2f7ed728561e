"""The admin client, sync and asyncio, against a real cluster."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
from conftest import read_records

from kcore import AdminClient
from kcore.admin import AdminOperationError, AsyncAdminClient, ConfigResource, NewTopic
from kcore.errors import (
    KcoreError,
    KcoreTimeoutError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)


def name(prefix: str = "admin") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def admin(kafka_cluster3):
    with AdminClient({"bootstrap.servers": kafka_cluster3.bootstrap_servers}) as client:
        yield client


def test_topic_lifecycle(admin, kafka_cluster3):
    topic = name()
    assert admin.create_topics([NewTopic(topic, 2, 3, config={"cleanup.policy": "compact"})]) == {
        topic: None
    }
    desc = admin.describe_topics([topic])[topic]
    assert [p.partition for p in desc.partitions] == [0, 1]
    assert all(len(p.replicas) == 3 and p.leader in p.replicas for p in desc.partitions)
    assert desc.topic_id is not None and not desc.is_internal
    assert topic in admin.list_topics()
    assert "__consumer_offsets" not in admin.list_topics()

    admin.create_partitions({topic: 4})
    assert len(admin.describe_topics([topic])[topic].partitions) == 4

    configs = admin.describe_configs([ConfigResource("topic", topic)])
    entry = configs[ConfigResource("topic", topic)]["cleanup.policy"]
    assert entry.value == "compact" and entry.source == "dynamic_topic"
    admin.alter_configs({("topic", topic): {"retention.ms": "60000", "cleanup.policy": None}})
    # Brokers apply a config change moments after the controller accepts it (as with Java's
    # admin client, a describe right after may see the old value on another broker).
    deadline = time.monotonic() + 30
    while True:
        configs = admin.describe_configs([("topic", topic)])[ConfigResource("topic", topic)]
        if configs["retention.ms"].value == "60000" or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert configs["retention.ms"].value == "60000"
    assert configs["cleanup.policy"].is_default

    # APPEND / SUBTRACT on a list-valued key (Java's AlterConfigOp), no read-modify-write
    def policy() -> str | None:
        return admin.describe_configs([("topic", topic)])[ConfigResource("topic", topic)][
            "cleanup.policy"
        ].value

    for change, want in (
        (("append", "compact"), "delete,compact"),
        (("subtract", "delete"), "compact"),
    ):
        admin.alter_configs({("topic", topic): {"cleanup.policy": change}})
        deadline = time.monotonic() + 30
        while policy() != want and time.monotonic() < deadline:
            time.sleep(0.2)
        assert policy() == want
    with pytest.raises(KcoreError, match="unknown operation 'merge'"):
        admin.alter_configs({("topic", topic): {"cleanup.policy": ("merge", "x")}})

    admin.delete_topics([topic])
    assert topic not in admin.list_topics()


def test_errors_name_the_item(admin):
    topic = name()
    admin.create_topics([topic])
    with pytest.raises(AdminOperationError) as info:
        admin.create_topics([NewTopic(topic, 1, 1)])
    assert isinstance(info.value.errors[topic], TopicAlreadyExistsError)
    assert topic in str(info.value)
    missing = name("missing")
    with pytest.raises(AdminOperationError) as info:
        admin.describe_topics([missing])
    assert isinstance(info.value.errors[missing], UnknownTopicOrPartitionError)
    with pytest.raises(AdminOperationError, match="partitions"):
        admin.create_partitions({topic: 1})  # cannot shrink
    # An unknown topic is an answer, not a hiccup to retry until default.api.timeout.ms.
    with pytest.raises(AdminOperationError) as info:
        admin.delete_topics([missing], timeout=30)
    assert isinstance(info.value.errors[missing], UnknownTopicOrPartitionError)
    with pytest.raises(AdminOperationError) as info:
        admin.alter_configs({("topic", missing): {"retention.ms": "1000"}}, timeout=30)
    assert info.value.results == {}  # a dict, also for operations with nothing per item
    # Offsets of a topic that does not exist (yet) are waited for; the timeout names it.
    with pytest.raises(KcoreTimeoutError, match=f"within 2s.*topics not available.*{missing}"):
        admin.list_offsets({(missing, 0): "latest"}, timeout=2)
    admin.delete_topics([topic])


def test_cluster_and_broker_configs(admin, kafka_cluster3):
    cluster = admin.describe_cluster()
    assert [b.node_id for b in cluster.brokers] == kafka_cluster3.node_ids
    assert cluster.controller_id in kafka_cluster3.node_ids and cluster.cluster_id
    broker = ConfigResource("broker", "2")
    configs = admin.describe_configs([broker])[broker]
    assert configs["node.id"].value == "2"


def test_list_offsets(admin, kafka_cluster3):
    topic = name()
    admin.create_topics([NewTopic(topic, 3, 2)])
    offsets = admin.list_offsets({(topic, p): "latest" for p in range(3)})
    assert {tp.partition: r.offset for tp, r in offsets.items()} == {0: 0, 1: 0, 2: 0}
    earliest = admin.list_offsets(
        {(topic, 0): "earliest", (topic, 1): 0, (topic, 2): "max_timestamp"}
    )
    assert earliest[(topic, 0)].offset == 0
    with pytest.raises(Exception, match="offset spec"):
        admin.list_offsets({(topic, 0): "newest"})


def test_async_admin_client(kafka_cluster3):
    topic = name("async")

    async def main():
        async with AsyncAdminClient({"bootstrap.servers": kafka_cluster3.bootstrap_servers}) as a:
            await a.create_topics([NewTopic(topic, 2, 1)])
            described, offsets = await asyncio.gather(
                a.describe_topics([topic]), a.list_offsets({(topic, 0): "latest"})
            )
            assert len(described[topic].partitions) == 2
            assert offsets[(topic, 0)].offset == 0
            await a.delete_topics([topic])

    asyncio.run(main())


def test_a_change_that_timed_out_at_the_broker_and_then_exists_succeeded():
    """No broker: CreateTopics answers REQUEST_TIMED_OUT for a topic (the controller may still
    create it), and the retry finds it there; DeleteTopics likewise finds it gone. Those are
    this call's own doing, not TopicAlreadyExists / UnknownTopicOrPartition errors. The
    broker's timeout_ms is at most request.timeout.ms (the client gave up first before and
    sent the request again while the first was still being carried out)."""
    from kcore.protocol.messages.create_topics_response import (
        CreatableTopicResult,
        CreateTopicsResponse,
    )
    from kcore.protocol.messages.delete_topics_response import (
        DeletableTopicResult,
        DeleteTopicsResponse,
    )

    client = AsyncAdminClient({"bootstrap.servers": "127.0.0.1:1", "request.timeout.ms": 5000})
    asked: list = []
    answers = [
        CreateTopicsResponse(topics=[CreatableTopicResult(name="t", error_code=7)]),
        CreateTopicsResponse(topics=[CreatableTopicResult(name="t", error_code=36)]),
        DeleteTopicsResponse(responses=[DeletableTopicResult(name="t", error_code=7)]),
        DeleteTopicsResponse(responses=[DeletableTopicResult(name="t", error_code=3)]),
    ]

    async def send_any(build, api_key):
        asked.append(build(7 if api_key == 19 else 6))
        return answers.pop(0)

    async def settle(*args):
        pass

    client._send_any = send_any  # type: ignore[method-assign]
    client._settle = settle  # type: ignore[method-assign]
    client.cluster.retry_backoff.backoff_s = lambda attempt: 0.0  # type: ignore[method-assign]

    async def main() -> None:
        assert await client.create_topics(["t"], timeout=60) == {"t": None}
        await client.delete_topics(["t"], timeout=60)

    asyncio.run(main())
    assert not answers
    assert all(0 < request.timeout_ms <= 5000 for request in asked)


def test_consumer_group_operations(kafka_cluster):
    """Java Admin's group and record operations against a real broker: list groups, read and
    reset a group's committed offsets (refused while it has members), delete records, delete
    the group (refused while it has members, GROUP_ID_NOT_FOUND after)."""
    import kcore
    from kcore.admin import TopicPartition

    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("grp-admin"), name("g")
    tp0, tp1, tp5 = (TopicPartition(topic, p) for p in (0, 1, 5))
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
        with kcore.Producer({"bootstrap.servers": bootstrap}) as p:
            for part in (0, 1):
                p.send_batch(topic, [b"%d" % i for i in range(10)], partition=part).result(30)
        config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
        with kcore.Consumer(config) as c:
            c.subscribe([topic])
            got = read_records(c, 20, 60)
            c.commit()
            listed = {g.group_id: g for g in admin.list_consumer_groups()}
            assert listed[group].protocol_type == "consumer"
            with pytest.raises(KcoreError, match="active members"):
                admin.alter_consumer_group_offsets(group, {tp0: 3})
            with pytest.raises(AdminOperationError, match="NON_EMPTY_GROUP"):
                admin.delete_consumer_groups([group])
        assert admin.list_consumer_group_offsets(group) == {tp0: 10, tp1: 10}
        admin.alter_consumer_group_offsets(group, {tp0: 3})
        assert admin.list_consumer_group_offsets(group, [tp0, tp1, tp5]) == {
            tp0: 3,
            tp1: 10,
            tp5: None,
        }
        with kcore.Consumer(config) as c:  # starts where the offsets were set
            c.subscribe([topic])
            got = read_records(c, 7, 60)
            assert sorted((r.partition, r.offset) for r in got) == [(0, o) for o in range(3, 10)]
        assert admin.delete_records({tp1: 4}) == {tp1: 4}
        assert admin.list_offsets({tp1: "earliest"})[tp1].offset == 4
        admin.delete_consumer_groups([group])
        assert group not in {g.group_id for g in admin.list_consumer_groups()}
        with pytest.raises(AdminOperationError, match="GROUP_ID_NOT_FOUND"):
            admin.delete_consumer_groups([group])


def test_delete_consumer_group_offsets(kafka_cluster):
    """As Java's deleteConsumerGroupOffsets: a group's offsets of some partitions go, the
    others stay; while a member consumes the topic its partitions are refused one by one
    (GROUP_SUBSCRIBED_TO_TOPIC); a group that does not exist fails the call."""
    import kcore
    from kcore.admin import TopicPartition
    from kcore.errors import GroupIdNotFoundError, GroupSubscribedToTopicError

    bootstrap = kafka_cluster.bootstrap_servers
    topic, group = name("del-offsets"), name("g")
    tp0, tp1 = TopicPartition(topic, 0), TopicPartition(topic, 1)
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 2, 1)])
        config = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
        with kcore.Consumer(config) as c:
            c.subscribe([topic])
            deadline = time.monotonic() + 60
            while len(c.assignment()) < 2 and time.monotonic() < deadline:
                c.poll(0.2)
            c.commit({tp0: 5, tp1: 7})
            with pytest.raises(AdminOperationError) as info:
                admin.delete_consumer_group_offsets(group, [tp0])
            assert isinstance(info.value.errors[tp0], GroupSubscribedToTopicError)
        assert admin.list_consumer_group_offsets(group) == {tp0: 5, tp1: 7}
        admin.delete_consumer_group_offsets(group, [(topic, 0)])
        assert admin.list_consumer_group_offsets(group, [tp0, tp1]) == {tp0: None, tp1: 7}
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_consumer_group_offsets(name("none"), [tp0])


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_describe_consumer_groups(kafka_cluster, protocol):
    """As Java's describeConsumerGroups: a live group's state, assignor, type and members with
    the partitions each holds (a classic member's decoded from its ConsumerProtocol
    assignment; a KIP-848 member's from ConsumerGroupDescribe, with its target), an empty
    group after its members left, and a group that does not exist failing alone."""
    import kcore
    from kcore.admin import ConsumerGroupDescription, TopicPartition
    from kcore.errors import GroupIdNotFoundError

    bootstrap = kafka_cluster.bootstrap_servers
    topic, group, missing = name("describe"), name("g"), name("none")
    with AdminClient({"bootstrap.servers": bootstrap}) as admin:
        admin.create_topics([NewTopic(topic, 3, 1)])
        config = {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "group.protocol": protocol,
            "client.id": "describer",
        }
        with kcore.Consumer(config) as c:
            c.subscribe([topic])
            deadline = time.monotonic() + 60
            while len(c.assignment()) < 3 and time.monotonic() < deadline:
                c.poll(0.2)
            assert len(c.assignment()) == 3
            member_id = c.group_metadata().member_id
            with pytest.raises(AdminOperationError) as e:
                admin.describe_consumer_groups([group, missing])
            assert isinstance(e.value.errors[missing], GroupIdNotFoundError)
            desc = e.value.results[group]
            assert isinstance(desc, ConsumerGroupDescription)
            assert (desc.group_id, desc.type, desc.state) == (group, protocol, "Stable")
            assert not desc.is_simple_consumer_group
            assert desc.coordinator in {b.node_id for b in admin.describe_cluster().brokers}
            assert desc.partition_assignor in ("range", "uniform", "cooperative-sticky")
            (member,) = desc.members
            assert member.member_id == member_id and member.client_id == "describer"
            assert member.assignment == {TopicPartition(topic, p) for p in range(3)}
            if protocol == "consumer":
                assert member.target_assignment == member.assignment
                assert member.member_epoch and desc.group_epoch
            else:
                assert member.target_assignment is None
        # close() waits for its LeaveGroup, so the group is empty at once; the wait only covers
        # a leave that timed out on a loaded machine (the session timeout then empties it).
        deadline = time.monotonic() + 60
        after = admin.describe_consumer_groups([group])[group]
        while after.state != "Empty" and time.monotonic() < deadline:
            time.sleep(0.5)
            after = admin.describe_consumer_groups([group])[group]
        assert after.state == "Empty" and after.members == ()
