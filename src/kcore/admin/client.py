"""The synchronous admin client: :class:`AsyncAdminClient` run on a private event loop thread
(what scripts, tests and Spark executors use)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from kcore.admin.acls import AclBinding, AclBindingFilter
from kcore.admin.async_client import AsyncAdminClient
from kcore.admin.describe_groups import ConsumerGroupDescription
from kcore.admin.groups import ConsumerGroupListing
from kcore.admin.scram import (
    UserScramCredentialDeletion,
    UserScramCredentialsDescription,
    UserScramCredentialUpsertion,
)
from kcore.admin.types import (
    ClusterDescription,
    ConfigEntry,
    ConfigResource,
    ListOffsetsResult,
    NewTopic,
    TopicDescription,
    TopicPartition,
)
from kcore.errors import KafkaError
from kcore.network.loop_thread import LoopThread
from kcore.network.process_local import ProcessLocal

__all__ = ["AdminClient"]


class AdminClient(ProcessLocal):
    """``kcore.AdminClient({"bootstrap.servers": "host:9092"})``: the Java AdminClient's
    operations, blocking. Bootstraps on construction (raising ``BootstrapError`` if no server
    answers within ``default.api.timeout.ms``); use as a context manager or call
    :meth:`close`. Each method's ``timeout`` (seconds) defaults to ``default.api.timeout.ms``.
    Pickles as its config; a forked child's copy rebuilds itself on first use.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._process_local(config)
        self._loop = LoopThread("kcore-admin")
        try:
            self._async = self._loop.run(_make(config))
        except BaseException:
            self._loop.close()
            raise

    @property
    def cluster(self) -> Any:
        """The shared :class:`~kcore.cluster.ClusterClient` (its metadata cache is readable)."""
        return self._async.cluster

    def close(self) -> None:
        if self._loop.is_running:
            try:
                self._loop.run(self._async.close(), 10)
            finally:
                self._loop.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        loop = getattr(self, "_loop", None)
        if loop is not None and loop.is_running:
            loop.close(1.0)

    def _run(self, coro: Any) -> Any:
        return self._loop.run(coro)

    def create_topics(
        self,
        new_topics: Iterable[NewTopic | str],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> dict[str, TopicDescription | None]:
        return self._run(
            self._async.create_topics(new_topics, validate_only=validate_only, timeout=timeout)
        )

    def delete_topics(self, names: Iterable[str], *, timeout: float | None = None) -> None:
        self._run(self._async.delete_topics(names, timeout=timeout))

    def create_partitions(
        self,
        new_totals: Mapping[str, int],
        *,
        assignments: Mapping[str, list[list[int]]] | None = None,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        self._run(
            self._async.create_partitions(
                new_totals, assignments=assignments, validate_only=validate_only, timeout=timeout
            )
        )

    # -- consumer groups and records ---------------------------------------------------------

    def list_consumer_groups(self, *, timeout: float | None = None) -> list[ConsumerGroupListing]:
        """Every group of the cluster (ListGroups on every broker), as Java's."""
        return self._run(self._async.list_consumer_groups(timeout=timeout))  # type: ignore[no-any-return]

    def describe_consumer_groups(
        self, group_ids: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, ConsumerGroupDescription]:
        """Each group's state, assignor and members with their partitions (see
        :meth:`AsyncAdminClient.describe_consumer_groups`)."""
        return self._run(  # type: ignore[no-any-return]
            self._async.describe_consumer_groups(group_ids, timeout=timeout)
        )

    def list_consumer_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        *,
        require_stable: bool = False,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offsets: of ``partitions`` (None where nothing is committed),
        or of every partition it has one for."""
        return self._run(  # type: ignore[no-any-return]
            self._async.list_consumer_group_offsets(
                group_id, partitions, require_stable=require_stable, timeout=timeout
            )
        )

    def alter_consumer_group_offsets(
        self,
        group_id: str,
        offsets: Mapping[TopicPartition | tuple[str, int], int],
        *,
        timeout: float | None = None,
    ) -> None:
        """Set the group's committed offsets (the next offset to read per partition), e.g. to
        reset or rewind it; the broker takes it only while the group has no active member."""
        self._run(self._async.alter_consumer_group_offsets(group_id, offsets, timeout=timeout))

    def delete_consumer_groups(
        self, group_ids: Iterable[str], *, timeout: float | None = None
    ) -> None:
        """Delete groups (and their offsets); one with members fails with NON_EMPTY_GROUP."""
        self._run(self._async.delete_consumer_groups(group_ids, timeout=timeout))

    def delete_consumer_group_offsets(
        self,
        group_id: str,
        partitions: Iterable[TopicPartition | tuple[str, int]],
        *,
        timeout: float | None = None,
    ) -> None:
        """Delete the group's committed offsets of these partitions (see
        :meth:`AsyncAdminClient.delete_consumer_group_offsets`)."""
        self._run(self._async.delete_consumer_group_offsets(group_id, partitions, timeout=timeout))

    def delete_records(
        self,
        before: Mapping[TopicPartition | tuple[str, int], int],
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, int]:
        """Delete the records before each offset (-1: all); the partitions' new low
        watermarks."""
        return self._run(self._async.delete_records(before, timeout=timeout))  # type: ignore[no-any-return]

    def list_topics(
        self, *, include_internal: bool = False, timeout: float | None = None
    ) -> list[str]:
        return self._run(
            self._async.list_topics(include_internal=include_internal, timeout=timeout)
        )

    def describe_topics(
        self, names: Iterable[str], *, timeout: float | None = None
    ) -> dict[str, TopicDescription]:
        return self._run(self._async.describe_topics(names, timeout=timeout))

    def describe_cluster(self, *, timeout: float | None = None) -> ClusterDescription:
        return self._run(self._async.describe_cluster(timeout=timeout))

    def list_offsets(
        self,
        specs: Mapping[TopicPartition | tuple[str, int], str | int],
        *,
        isolation_level: str = "read_uncommitted",
        timeout: float | None = None,
    ) -> dict[TopicPartition, ListOffsetsResult]:
        return self._run(
            self._async.list_offsets(specs, isolation_level=isolation_level, timeout=timeout)
        )

    def describe_configs(
        self, resources: Iterable[ConfigResource | tuple[str, str]], *, timeout: float | None = None
    ) -> dict[ConfigResource, dict[str, ConfigEntry]]:
        return self._run(self._async.describe_configs(resources, timeout=timeout))

    def alter_configs(
        self,
        changes: Mapping[
            ConfigResource | tuple[str, str], Mapping[str, str | None | tuple[str, str | None]]
        ],
        *,
        validate_only: bool = False,
        timeout: float | None = None,
    ) -> None:
        """As :meth:`AsyncAdminClient.alter_configs`: a value sets, None deletes,
        ``("append", v)`` / ``("subtract", v)`` edit a list-valued key."""
        self._run(self._async.alter_configs(changes, validate_only=validate_only, timeout=timeout))

    def elect_leaders(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        *,
        election_type: str = "preferred",
        timeout: float | None = None,
    ) -> dict[TopicPartition, KafkaError | None]:
        return self._run(
            self._async.elect_leaders(partitions, election_type=election_type, timeout=timeout)
        )

    def alter_partition_reassignments(
        self,
        reassignments: Mapping[TopicPartition | tuple[str, int], list[int] | None],
        *,
        timeout: float | None = None,
    ) -> None:
        self._run(self._async.alter_partition_reassignments(reassignments, timeout=timeout))

    def list_partition_reassignments(
        self,
        partitions: Iterable[TopicPartition | tuple[str, int]] | None = None,
        *,
        timeout: float | None = None,
    ) -> dict[TopicPartition, dict[str, list[int]]]:
        return self._run(self._async.list_partition_reassignments(partitions, timeout=timeout))

    # -- ACLs (see kcore.admin.acls) ---------------------------------------------------------------

    def create_acls(self, bindings: Iterable[AclBinding], *, timeout: float | None = None) -> None:
        """Create the ACLs; ``AdminOperationError`` maps each one that failed to its error."""
        self._run(self._async.create_acls(bindings, timeout=timeout))

    def describe_acls(
        self, acl_filter: AclBindingFilter | None = None, *, timeout: float | None = None
    ) -> list[AclBinding]:
        """The ACLs matching ``acl_filter`` (default: every ACL)."""
        return self._run(self._async.describe_acls(acl_filter, timeout=timeout))  # type: ignore[no-any-return]

    def delete_acls(
        self, filters: Iterable[AclBindingFilter], *, timeout: float | None = None
    ) -> dict[AclBindingFilter, list[AclBinding]]:
        """Delete the ACLs each filter matches; returns what each deleted."""
        return self._run(self._async.delete_acls(filters, timeout=timeout))  # type: ignore[no-any-return]

    # -- SCRAM users (see kcore.admin.scram) -------------------------------------------------

    def describe_user_scram_credentials(
        self, users: Iterable[str] | None = None, *, timeout: float | None = None
    ) -> dict[str, UserScramCredentialsDescription]:
        """Each user's SCRAM mechanisms and iterations (default: every user)."""
        return self._run(  # type: ignore[no-any-return]
            self._async.describe_user_scram_credentials(users, timeout=timeout)
        )

    def alter_user_scram_credentials(
        self,
        alterations: Iterable[UserScramCredentialUpsertion | UserScramCredentialDeletion],
        *,
        timeout: float | None = None,
    ) -> None:
        """Create, replace or remove users' SCRAM credentials (the password is salted here)."""
        self._run(self._async.alter_user_scram_credentials(alterations, timeout=timeout))


async def _make(config: Mapping[str, Any]) -> AsyncAdminClient:
    client = AsyncAdminClient(config)
    try:
        return await client.start()
    except BaseException:
        await client.close()
        raise
