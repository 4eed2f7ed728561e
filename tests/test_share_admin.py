"""Share groups (KIP-932) through the admin client, against a real broker: the group's members
are Kafka's own console share consumer (a JVM per member), and Kafka's own
``kafka-share-groups`` is the oracle for start offsets and lag (KIP-1226)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import pytest
from share_helpers import total_lag, unique
from share_helpers import wait_for as wait_until

import kcore as kc
from kcore.admin import (
    AdminOperationError,
    AsyncAdminClient,
    NewTopic,
    ShareGroupDescription,
    SharePartitionOffsetInfo,
    TopicPartition,
)
from kcore.errors import GroupIdNotFoundError, KcoreError, NonEmptyGroupError

WAIT_S = 90.0  # bound on waiting for the broker to show what a member did


def wait_for(check: Callable[[], Any], what: str, timeout: float = WAIT_S) -> Any:
    return wait_until(check, what, timeout)


def share_topic(admin: kc.AdminClient, bootstrap: str, partitions: int, per_partition: int):
    """A topic with ``per_partition`` records on each partition, and a share group (its id)
    configured to start at the earliest record (the default is the latest)."""
    topic, group = unique("share-t"), unique("share-g")
    admin.create_topics([NewTopic(topic, partitions, 1)])
    with kc.Producer({"bootstrap.servers": bootstrap}) as producer:
        for p in range(partitions):
            for i in range(per_partition):
                producer.send(topic, b"%d-%d" % (p, i), partition=p)
        producer.flush(30)
    admin.alter_configs({("group", group): {"share.auto.offset.reset": "earliest"}})
    return topic, group


def java_offsets(cluster, group: str) -> dict[TopicPartition, tuple[int | None, int | None]]:
    """(start offset, lag) per partition as Kafka's own kafka-share-groups prints them."""
    out = cluster.run_tool(
        "kafka-share-groups",
        "--bootstrap-server",
        cluster.bootstrap_servers,
        "--describe",
        "--offsets",
        "--group",
        group,
        check=True,
    ).stdout
    rows = {}
    for m in re.finditer(
        rf"^{re.escape(group)}\s+(\S+)\s+(\d+)\s+(-|\d+)\s+(-|\d+)\s*$", out, re.MULTILINE
    ):
        start, lag = (None if v == "-" else int(v) for v in (m[3], m[4]))
        rows[TopicPartition(m[1], int(m[2]))] = (start, lag)
    assert rows, out
    return rows


def ours(offsets: dict[TopicPartition, SharePartitionOffsetInfo | None]):
    return {
        tp: (None, None) if info is None else (info.start_offset, info.lag)
        for tp, info in offsets.items()
    }


def test_share_group_listed_described_and_its_offsets_and_lag(kafka_cluster, share_members):
    """A share group with one member that read 7 of the 10 records: it is listed (type share,
    Stable) and described (its member, assigned both partitions); its start offsets and lag
    (KIP-1226) agree with kafka-share-groups; with the member gone the group is Empty and a
    later record raises the lag. The async client sees the same."""
    bootstrap = kafka_cluster.bootstrap_servers
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        topic, group = share_topic(admin, bootstrap, partitions=2, per_partition=5)
        member = share_members(bootstrap, topic, group)
        member.wait_for_records(10)

        listed = {g.group_id: g for g in admin.list_share_groups()}
        assert (listed[group].type, listed[group].protocol_type) == ("share", "share")
        assert listed[group].state == "Stable"
        assert group in {g.group_id for g in admin.list_groups(types=["share"])}
        assert group in {g.group_id for g in admin.list_groups()}
        assert group not in {g.group_id for g in admin.list_groups(types=["consumer"])}
        # As Java's listConsumerGroups: consumer groups only.
        assert group not in {g.group_id for g in admin.list_consumer_groups()}
        assert group in {g.group_id for g in admin.list_share_groups(states=["stable"])}
        assert group not in {g.group_id for g in admin.list_share_groups(states=["Empty"])}

        desc = admin.describe_share_groups([group])[group]
        assert isinstance(desc, ShareGroupDescription)
        assert (desc.group_id, desc.state, desc.type) == (group, "Stable", "share")
        assert desc.coordinator in kafka_cluster.node_ids
        assert desc.partition_assignor == "simple" and desc.group_epoch >= 1
        (m,) = desc.members
        assert m.client_id == "console-share-consumer" and m.subscribed_topics == (topic,)
        assert m.assignment == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        assert m.member_epoch >= 1

        # Every record was read and acknowledged: nothing is left to deliver.
        wait_for(lambda: total_lag(admin, group) == 0, "the lag to fall to 0")
        offsets = admin.list_share_group_offsets(group)
        assert set(offsets) == {TopicPartition(topic, 0), TopicPartition(topic, 1)}
        assert all(info is not None and info.leader_epoch == 0 for info in offsets.values())
        assert ours(offsets) == java_offsets(kafka_cluster, group)

        member.stop()
        wait_for(lambda: admin.describe_share_groups([group])[group].state == "Empty", "Empty")
        assert admin.describe_share_groups([group])[group].members == ()
        with kc.Producer({"bootstrap.servers": bootstrap}) as producer:
            for _ in range(3):
                producer.send(topic, b"late", partition=1)
            producer.flush(30)
        # Three records nobody read yet: the lag says so, as Kafka's own tool does.
        wait_for(lambda: total_lag(admin, group) == 3, "the lag to count the 3 new records")
        offsets = admin.list_share_group_offsets(group)
        assert offsets[TopicPartition(topic, 1)].lag == 3  # type: ignore[union-attr]
        assert ours(offsets) == java_offsets(kafka_cluster, group)
        # Named partitions (a partition that does not exist keeps the broker retrying its
        # state store until the request times out: not asked here).
        some = admin.list_share_group_offsets(group, [(topic, 1)])
        assert some == {TopicPartition(topic, 1): offsets[TopicPartition(topic, 1)]}

    async def with_async_client() -> None:
        async with AsyncAdminClient({"bootstrap.servers": bootstrap}) as a:
            assert group in {g.group_id for g in await a.list_share_groups()}
            assert (await a.describe_share_groups([group]))[group].state == "Empty"
            assert await a.list_share_group_offsets(group) == offsets

    asyncio.run(with_async_client())


def test_alter_share_group_offsets_only_while_empty(kafka_cluster, share_members):
    """Altering the start offsets of a group with an active member fails with a clear
    NonEmptyGroupError (and so do deleting its offsets and the group); once the member left,
    the start offsets move (as describe and kafka-share-groups show) and a new member reads
    from there: exactly the records from the new start offsets."""
    bootstrap = kafka_cluster.bootstrap_servers
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        topic, group = share_topic(admin, bootstrap, partitions=2, per_partition=5)
        member = share_members(bootstrap, topic, group)
        member.wait_for_records(10)
        with pytest.raises(NonEmptyGroupError, match="has active members"):
            admin.alter_share_group_offsets(group, {(topic, 0): 1})
        with pytest.raises(AdminOperationError) as deleting:
            admin.delete_share_groups([group])
        assert isinstance(deleting.value.errors[group], NonEmptyGroupError)
        with pytest.raises(NonEmptyGroupError, match="has active members"):
            admin.delete_share_group_offsets(group, [topic])
        assert group in {g.group_id for g in admin.list_share_groups()}

        member.stop()
        wait_for(lambda: admin.describe_share_groups([group])[group].state == "Empty", "Empty")
        admin.alter_share_group_offsets(group, {(topic, 0): 2, TopicPartition(topic, 1): 4})
        offsets = admin.list_share_group_offsets(group)
        assert {tp: info.start_offset for tp, info in offsets.items() if info} == {
            TopicPartition(topic, 0): 2,
            TopicPartition(topic, 1): 4,
        }
        assert ours(offsets) == java_offsets(kafka_cluster, group)
        # What is left to read: offsets 2-4 of partition 0 and offset 4 of partition 1.
        wait_for(lambda: total_lag(admin, group) == 4, "the lag of the records after the reset")

        again = share_members(bootstrap, topic, group)
        assert sorted(again.wait_for_records(4)) == ["0-2", "0-3", "0-4", "1-4"]

        with pytest.raises(KcoreError, match="must be 0 or more"):
            admin.alter_share_group_offsets(group, {(topic, 0): -1})


def test_delete_share_group_offsets_and_the_group(kafka_cluster, share_members):
    """Deleting the group's offsets of a topic removes its state of every partition of it;
    deleting the group removes it (it is no longer listed, and describing it says it does
    not exist)."""
    bootstrap = kafka_cluster.bootstrap_servers
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        topic, group = share_topic(admin, bootstrap, partitions=2, per_partition=3)
        member = share_members(bootstrap, topic, group)
        member.wait_for_records(6)
        wait_for(lambda: total_lag(admin, group) == 0, "the lag to fall to 0")
        member.stop()
        wait_for(lambda: admin.describe_share_groups([group])[group].state == "Empty", "Empty")

        with pytest.raises(AdminOperationError) as failed:
            admin.delete_share_group_offsets(group, [topic, "no-such-topic-x"])
        assert set(failed.value.errors) == {"no-such-topic-x"}
        assert admin.list_share_group_offsets(group) == {}

        admin.delete_share_groups([group])
        assert group not in {g.group_id for g in admin.list_share_groups()}
        with pytest.raises(AdminOperationError) as describing:
            admin.describe_share_groups([group])
        assert isinstance(describing.value.errors[group], GroupIdNotFoundError)


def test_share_group_errors(kafka_cluster):
    """A group that does not exist, or is a consumer group, is no share group to describe or
    delete; a partition that does not exist fails alone when altering."""
    bootstrap = kafka_cluster.bootstrap_servers
    with kc.AdminClient({"bootstrap.servers": bootstrap}) as admin:
        topic, group = share_topic(admin, bootstrap, partitions=1, per_partition=1)
        missing = unique("no-such-share-group")
        with pytest.raises(AdminOperationError) as describing:
            admin.describe_share_groups([missing])
        assert isinstance(describing.value.errors[missing], GroupIdNotFoundError)
        assert describing.value.results == {}
        with pytest.raises(AdminOperationError) as deleting:
            admin.delete_share_groups([missing])
        assert isinstance(deleting.value.errors[missing], GroupIdNotFoundError)
        assert admin.list_share_group_offsets(missing) == {}

        consumer_group = unique("consumer-g")
        admin.alter_consumer_group_offsets(consumer_group, {(topic, 0): 0})
        with pytest.raises(AdminOperationError) as not_share:
            admin.describe_share_groups([consumer_group])
        error = not_share.value.errors[consumer_group]
        assert isinstance(error, GroupIdNotFoundError)
        assert "not a share group" in str(error)
        assert consumer_group not in {g.group_id for g in admin.list_share_groups()}
        # A group that only committed offsets (no protocol type) is a consumer group.
        assert consumer_group in {g.group_id for g in admin.list_consumer_groups()}

        # A group that does not exist is made by altering its offsets, as Kafka does.
        with pytest.raises(AdminOperationError) as altering:
            admin.alter_share_group_offsets(group, {(topic, 0): 1, (topic, 9): 0})
        assert set(altering.value.errors) == {TopicPartition(topic, 9)}
        offsets = admin.list_share_group_offsets(group)
        assert offsets[TopicPartition(topic, 0)].start_offset == 1  # type: ignore[union-attr]
