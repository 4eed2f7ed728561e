"""Transactions (KIP-98): the transactional producer's requests to the transaction coordinator
(InitProducerId, AddPartitionsToTxn, AddOffsetsToTxn, EndTxn) and to a group's coordinator
(TxnOffsetCommit, KIP-447), which drive its state machine (``kcore.producer.txn_state``) and
give its producer id and epoch (``kcore.producer.idempotence``). They run on the producer's
event loop.

With transaction protocol v1 a partition must be registered before its first batch
(AddPartitionsToTxn, the partitions a drain found unregistered in one request); with protocol
v2 (KIP-890 part 2: ``transaction.version`` >= 2, EndTxn v5, Produce v12) the broker registers
a partition on the first Produce, TxnOffsetCommit goes to the group coordinator without
AddOffsetsToTxn, and the coordinator bumps the producer epoch at every EndTxn (its answer
carries the new one).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kcore.cluster.client import ClusterClient
from kcore.cluster.coordinator import GROUP, TRANSACTION, CoordinatorLink
from kcore.errors import (
    BrokerConnectionError,
    ErrorCode,
    KafkaError,
    KcoreError,
    KcoreTimeoutError,
    error_for_code,
)
from kcore.network.retry import Deadline, retry
from kcore.producer.idempotence import IdempotenceState
from kcore.producer.txn_state import FENCED_CODES, TransactionStateMachine
from kcore.protocol import ApiKey
from kcore.protocol.messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    TxnOffsetCommitRequest,
)
from kcore.protocol.messages.add_partitions_to_txn_request import AddPartitionsToTxnTopic
from kcore.protocol.messages.txn_offset_commit_request import (
    TxnOffsetCommitRequestPartition,
    TxnOffsetCommitRequestTopic,
)
from kcore.types import ConsumerGroupMetadata, TopicPartition

__all__ = ["TransactionManager", "transaction_version"]

log = logging.getLogger("kcore.producer.transactions")

TRANSACTION_VERSION_FEATURE = "transaction.version"
# Highest versions of transaction protocol v1. AddPartitionsToTxn v4+ is for brokers only.
V1_MAX = {
    ApiKey.PRODUCE: 11,
    ApiKey.ADD_PARTITIONS_TO_TXN: 3,
    ApiKey.END_TXN: 4,
    ApiKey.TXN_OFFSET_COMMIT: 4,
}
V2_MIN = {ApiKey.PRODUCE: 12, ApiKey.END_TXN: 5, ApiKey.TXN_OFFSET_COMMIT: 5}
CONCURRENT_TXN_BACKOFF_S = 0.02  # Java's for the first AddPartitionsToTxn of a transaction

# Error codes by what they mean for a transactional request.
REFIND_CODES = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
FATAL_CODES = frozenset(
    {
        *FENCED_CODES,
        ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
        ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
        ErrorCode.INVALID_TXN_STATE,
        ErrorCode.TRANSACTION_COORDINATOR_FENCED,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.INVALID_TRANSACTION_TIMEOUT,
        ErrorCode.UNSUPPORTED_FOR_MESSAGE_FORMAT,
    }
)
ABORTABLE_CODES = frozenset(
    {
        ErrorCode.TRANSACTION_ABORTABLE,
        ErrorCode.TOPIC_AUTHORIZATION_FAILED,
        ErrorCode.GROUP_AUTHORIZATION_FAILED,
        ErrorCode.UNKNOWN_MEMBER_ID,
        ErrorCode.ILLEGAL_GENERATION,
        ErrorCode.FENCED_INSTANCE_ID,
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.OPERATION_NOT_ATTEMPTED,
    }
)
# The coordinator lost the producer id: abortable if the epoch can be bumped (KIP-360).
BUMP_CODES = frozenset({ErrorCode.UNKNOWN_PRODUCER_ID, ErrorCode.INVALID_PRODUCER_ID_MAPPING})


class _Again(KafkaError):
    """The request goes again, after ``pause_s`` (None: the backoff's next pause); ``refind``:
    to the coordinator looked up anew. (A KafkaError so that ``retry`` takes it as a failure
    to retry; nothing outside ``_request`` sees it.)"""

    retriable = True

    def __init__(self, why: str, *, refind: bool, pause_s: float | None = None) -> None:
        super().__init__(why)
        self.why = why
        self.refind = refind
        self.pause_s = pause_s


def transaction_version(
    features: Mapping[str, int], api_versions: Mapping[int, tuple[int, int]]
) -> int:
    """2 when a broker offers transaction protocol v2 (KIP-890 part 2): ``transaction.version``
    finalized at 2 or more, EndTxn v5+ and Produce v12+; otherwise 1."""
    if features.get(TRANSACTION_VERSION_FEATURE, 0) < 2:
        return 1
    if api_versions.get(ApiKey.END_TXN, (0, -1))[1] < V2_MIN[ApiKey.END_TXN]:
        return 1
    if api_versions.get(ApiKey.PRODUCE, (0, -1))[1] < V2_MIN[ApiKey.PRODUCE]:
        return 1
    return 2


class TransactionManager:
    """One transactional producer's requests to its coordinators, driving its
    :class:`~kcore.producer.txn_state.TransactionStateMachine` (see the module docstring). The
    producer id and epoch the requests carry, and the ones the coordinator gives, are the
    :class:`~kcore.producer.idempotence.IdempotenceState`'s. ``renumber_waiting()`` gives the
    batches waiting to be sent new sequences (a new producer id or epoch); ``wake_sender()``
    tells the sender that registered partitions may be sent."""

    def __init__(
        self,
        machine: TransactionStateMachine,
        identity: IdempotenceState,
        cluster: ClusterClient,
        transaction_timeout_ms: int,
        *,
        renumber_waiting: Callable[[], object],
        wake_sender: Callable[[], object],
    ) -> None:
        self.machine = machine
        self.identity = identity
        self.transactional_id = machine.transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        self.cluster = cluster
        self.renumber_waiting = renumber_waiting
        self.wake_sender = wake_sender
        self._txn_link = CoordinatorLink(cluster, self.transactional_id, TRANSACTION)
        self._group_links: dict[str, CoordinatorLink] = {}  # TxnOffsetCommit under v2
        self._add_task: asyncio.Task[None] | None = None
        # The latest send_offsets of this transaction, as a task of its own: a caller's
        # timeout does not stop it (Java keeps the request queued), and EndTxn(commit) waits
        # for it, so a commit never goes out without offsets the caller handed over.
        self._offsets_task: asyncio.Task[None] | None = None
        # Why the latest coordinator request is being retried (None once one went through):
        # what a transactional call that runs out of time names.
        self.retrying: str | None = None

    def _new_producer(self, producer_id: int, epoch: int) -> None:
        """A producer id and epoch from the transaction coordinator (InitProducerId, or EndTxn
        v5's bumped epoch): sequences start again at 0, for waiting batches too."""
        self.identity.reset(producer_id, epoch)
        self.renumber_waiting()

    def _classify(self, call: str, codes: Iterable[int]) -> None:
        """Raise what the worst of ``codes`` means: _Again, or the fatal/abortable error (after
        the state transition). Returns for no error."""
        codes = [c for c in codes if c]
        if not codes:
            return
        machine = self.machine
        exceptions = {c: error_for_code(c) for c in codes}
        for code in codes:
            if code in FATAL_CODES:
                err = exceptions[code]
                assert err is not None
                hint = ""
                if code == ErrorCode.INVALID_TXN_STATE and call == "EndTxn(commit)" and machine.v2:
                    # (from the coordinator found anew, see _request): it aborted the
                    # transaction on its own (KAFKA-20785; later brokers answer PRODUCER_FENCED)
                    hint = (
                        " (the coordinator has no such open transaction: most likely it aborted "
                        "it after transaction.timeout.ms while this commit was being retried)"
                    )
                err = err.with_message(f"{call}: {err.message}{hint}")
                machine.fatal(err)
                raise machine.fatal_error()
        if any(c in REFIND_CODES for c in codes):
            raise _Again("the coordinator moved", refind=True)
        if any(c in BUMP_CODES for c in codes):
            code = next(c for c in codes if c in BUMP_CODES)
            err = exceptions[code]
            assert err is not None
            err = err.with_message(f"{call}: {err.message}")
            machine.producer_id_lost(err)  # abortable if the epoch can be bumped, else fatal
            if machine.can_bump_epoch:
                raise err
            raise machine.fatal_error()
        others = [exceptions[c] for c in codes if c not in ABORTABLE_CODES]
        if others and all(e is not None and e.retriable for e in others):
            pause = None
            if (
                ErrorCode.CONCURRENT_TRANSACTIONS in codes
                and call == "AddPartitionsToTxn"
                and not machine.added
            ):
                pause = CONCURRENT_TXN_BACKOFF_S  # the previous transaction is finishing
            names = ", ".join(sorted({e.name for e in others if e is not None}))
            raise _Again(names, refind=False, pause_s=pause)
        picked = next((c for c in codes if c != ErrorCode.OPERATION_NOT_ATTEMPTED), codes[0])
        err = exceptions[picked]
        assert err is not None
        err = err.with_message(f"{call}: {err.message}")
        if picked in ABORTABLE_CODES:
            machine.abortable(err)
            raise err
        machine.fatal(err)  # an error Java does not expect either
        raise machine.fatal_error()

    def _link(self, group: str | None) -> CoordinatorLink:
        """The transaction coordinator, or ``group``'s coordinator."""
        if group is None:
            return self._txn_link
        link = self._group_links.get(group)
        if link is None:
            link = self._group_links[group] = CoordinatorLink(self.cluster, group, GROUP)
        return link

    async def _request(
        self,
        call: str,
        api_key: int,
        build: Callable[[int], Any],
        codes: Callable[[Any], Iterable[int]],
        *,
        group: str | None = None,
        alive: Callable[[], bool] | None = None,
        min_version: int | None = None,
        max_version: int | None = None,
    ) -> Any:
        """Send a request to the transaction coordinator (or ``group``'s coordinator) until an
        answer without a retriable error: NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE and lost
        connections look the coordinator up again; COORDINATOR_LOAD_IN_PROGRESS and
        CONCURRENT_TRANSACTIONS back off and retry on the same one. Runs until it succeeds,
        fails, or its caller's timeout cancels it; ``alive()`` false stops it."""
        # A former coordinator back from a network partition can answer EndTxn from its stale
        # state (INVALID_TXN_STATE: it never saw the transaction's partitions) before it learns
        # it was replaced. So that answer is first taken to the coordinator looked up anew,
        # once: EndTxn is idempotent there, and the same answer from it is final.
        recheck_invalid_state = api_key == ApiKey.END_TXN

        async def attempt() -> Any:
            nonlocal recheck_invalid_state
            if alive is not None and not alive():
                raise KcoreError(f"{call}: no longer needed")
            link = self._link(group)
            try:
                version = await link.version(
                    api_key, min_version=min_version, max_version=max_version
                )
                response = await link.send(build(version), version)
            except (BrokerConnectionError, KcoreTimeoutError) as exc:
                log.debug("%s: %s; retrying", call, exc)
                raise _Again(str(exc), refind=True) from exc
            except KafkaError as exc:  # from the coordinator lookup, or no common version
                if not exc.retriable:
                    self._classify(call, [exc.code])  # raises
                    raise
                raise _Again(str(exc), refind=True) from exc
            answered = list(codes(response))
            if recheck_invalid_state and ErrorCode.INVALID_TXN_STATE in answered:
                recheck_invalid_state = False
                raise _Again("INVALID_TXN_STATE; asking the coordinator found anew", refind=True)
            self._classify(call, answered)
            return response

        def before_retry(again: BaseException) -> None:
            assert isinstance(again, _Again)
            self.retrying = f"{call}: {again.why}"
            if again.refind:
                self._link(group).mark_dead(again.why)
            log.debug("%s: retrying (%s)", call, "refind" if again.refind else "backoff")

        response = await retry(
            call,
            attempt,
            deadline=Deadline(math.inf),  # (the caller's timeout bounds it)
            backoff=self.cluster.retry_backoff,
            retriable=lambda exc: isinstance(exc, _Again),
            before_retry=before_retry,
            pause_for=lambda again: getattr(again, "pause_s", None),
            bound_attempts=False,  # each request keeps request.timeout.ms
        )
        self.retrying = None
        return response

    async def _init_producer_id(self, bump: bool) -> None:
        identity = self.identity

        def build(version: int) -> Any:
            request = InitProducerIdRequest(
                transactional_id=self.transactional_id,
                transaction_timeout_ms=self.transaction_timeout_ms,
            )
            if bump and version >= 3:
                request.producer_id = identity.producer_id
                request.producer_epoch = identity.epoch
            return request

        response = await self._request(
            "InitProducerId", ApiKey.INIT_PRODUCER_ID, build, lambda r: [r.error_code]
        )
        self._new_producer(response.producer_id, response.producer_epoch)
        log.info(
            "transactional id %s: producer id %s epoch %s",
            self.transactional_id,
            response.producer_id,
            response.producer_epoch,
        )

    async def initialize(self) -> None:
        """init_transactions: InitProducerId with the transactional id at its coordinator (which
        fences older producers of the id and finishes their open transaction), and the choice
        of transaction protocol from the coordinator's ApiVersions."""
        self.machine.check_initializable()
        await self._init_producer_id(bump=False)
        conn = await self._txn_link.connection()
        version = transaction_version(conn.finalized_features, conn.api_versions)
        log.info("transactional id %s: transaction protocol v%s", self.transactional_id, version)
        # Protocol v1 keeps Produce at v11 or below (v12+ would have the broker register
        # partitions, which is protocol v2).
        self.machine.initialized(
            version,
            can_bump_epoch=conn.api_versions.get(ApiKey.INIT_PRODUCER_ID, (0, -1))[1] >= 3,
            produce_versions=(
                {"min_version": V2_MIN[ApiKey.PRODUCE]}
                if version >= 2
                else {"max_version": V1_MAX[ApiKey.PRODUCE]}
            ),
        )

    def ensure_adding(self) -> None:
        """Start an AddPartitionsToTxn for the partitions the sender found, unless one is in
        flight (it picks up new ones when it is done). Called by the sender after a drain."""
        if not self.machine.new or self.machine.v2:
            return
        if self._add_task is not None and not self._add_task.done():
            return
        self._add_task = asyncio.get_running_loop().create_task(self._add_partitions())

    async def _add_partitions(self) -> None:
        machine = self.machine
        try:
            while machine.new and machine.sending:
                tps = machine.take_new_partitions()
                try:
                    await self._add(tps)
                finally:
                    machine.adding_ended(tps)
        except KcoreError as exc:  # the state says what happened; batches wait or are failed
            log.debug("AddPartitionsToTxn: %s", exc)
        except Exception as exc:  # a bug: fail the transaction rather than leave it waiting
            log.exception("AddPartitionsToTxn")
            machine.abortable(KcoreError(f"registering partitions failed: {exc!r}"))
        finally:
            self.wake_sender()

    async def _add(self, tps: list[TopicPartition]) -> None:
        identity = self.identity
        by_topic: dict[str, list[int]] = {}
        for tp in tps:
            by_topic.setdefault(tp.topic, []).append(tp.partition)

        def build(version: int) -> Any:
            return AddPartitionsToTxnRequest(
                v3_and_below_transactional_id=self.transactional_id,
                v3_and_below_producer_id=identity.producer_id,
                v3_and_below_producer_epoch=identity.epoch,
                v3_and_below_topics=[
                    AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in by_topic.items()
                ],
            )

        def codes(response: Any) -> list[int]:
            out = [response.error_code]
            for topic in response.results_by_topic_v3_and_below:
                out += [p.partition_error_code for p in topic.results_by_partition]
            return out

        await self._request(
            "AddPartitionsToTxn",
            ApiKey.ADD_PARTITIONS_TO_TXN,
            build,
            codes,
            alive=lambda: self.machine.sending,
            max_version=V1_MAX[ApiKey.ADD_PARTITIONS_TO_TXN],
        )
        self.machine.partitions_added(tps)

    def queue_offsets(
        self, offsets: Mapping[TopicPartition, int], group: ConsumerGroupMetadata
    ) -> asyncio.Task[None]:
        """:meth:`send_offsets` as a task that runs after the one queued before it and goes on
        when its caller stops waiting (await it through ``asyncio.shield``)."""
        self.machine.check_in_transaction("send_offsets_to_transaction")
        before = self._offsets_task

        async def in_order() -> None:
            if before is not None and not before.done():
                await asyncio.wait([before])  # its failure is its own caller's to see
            await self.send_offsets(offsets, group)

        task = asyncio.get_running_loop().create_task(in_order())
        task.add_done_callback(_retrieved)
        self._offsets_task = task
        return task

    async def send_offsets(
        self, offsets: Mapping[TopicPartition, int], group: ConsumerGroupMetadata
    ) -> None:
        """The consumed offsets of ``group``, committed with the transaction (KIP-98, KIP-447):
        v1 registers the group's offsets partition first (AddOffsetsToTxn); both then send
        TxnOffsetCommit to the group's coordinator."""
        machine = self.machine
        machine.check_in_transaction("send_offsets_to_transaction")
        identity = self.identity
        if not machine.v2:

            def build_add(version: int) -> Any:
                return AddOffsetsToTxnRequest(
                    transactional_id=self.transactional_id,
                    producer_id=identity.producer_id,
                    producer_epoch=identity.epoch,
                    group_id=group.group_id,
                )

            await self._request(
                f"AddOffsetsToTxn (group {group.group_id!r})",
                ApiKey.ADD_OFFSETS_TO_TXN,
                build_add,
                lambda r: [r.error_code],
            )
        machine.offsets_added()
        by_topic: dict[str, list[TxnOffsetCommitRequestPartition]] = {}
        for tp, offset in offsets.items():
            by_topic.setdefault(tp.topic, []).append(
                TxnOffsetCommitRequestPartition(
                    partition_index=tp.partition, committed_offset=offset
                )
            )

        def build_commit(version: int) -> Any:
            return TxnOffsetCommitRequest(
                transactional_id=self.transactional_id,
                group_id=group.group_id,
                producer_id=identity.producer_id,
                producer_epoch=identity.epoch,
                generation_id=group.generation_id,
                member_id=group.member_id,
                group_instance_id=group.group_instance_id,
                topics=[
                    TxnOffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()
                ],
            )

        def codes(response: Any) -> list[int]:
            return [p.error_code for t in response.topics for p in t.partitions]

        await self._request(
            f"TxnOffsetCommit (group {group.group_id!r})",  # errors name the group, as Java's
            ApiKey.TXN_OFFSET_COMMIT,
            build_commit,
            codes,
            group=group.group_id,
            min_version=V2_MIN[ApiKey.TXN_OFFSET_COMMIT] if machine.v2 else None,
            max_version=None if machine.v2 else V1_MAX[ApiKey.TXN_OFFSET_COMMIT],
        )

    async def end(self, commit: bool) -> None:
        """EndTxn (when anything was registered), then READY. Protocol v2's EndTxn answer
        carries the epoch the coordinator bumped to. After an abort that left sequence numbers
        unknown (a batch failed after it was numbered) or that the coordinator could not place
        (UNKNOWN_PRODUCER_ID, INVALID_PRODUCER_ID_MAPPING), and that no EndTxn bumped, the epoch
        is bumped with InitProducerId (KIP-360)."""
        machine = self.machine
        identity = self.identity
        bumped = False
        offsets, self._offsets_task = self._offsets_task, None
        if offsets is not None and not offsets.done() and not commit:
            offsets.cancel()  # the transaction's offsets go with it
        elif offsets is not None and commit:
            try:
                await asyncio.shield(offsets)  # raises what failed it: no commit without them
            except BaseException:
                self._offsets_task = offsets  # a commit called again waits again
                raise
        # INVALID_PRODUCER_ID_MAPPING: the coordinator has no transaction to end (as Java:
        # straight to the epoch bump, which aborts whatever is left).
        lost = (
            isinstance(machine.last_error, KafkaError)
            and machine.last_error.code == ErrorCode.INVALID_PRODUCER_ID_MAPPING
        )
        if machine.started and not (lost and not commit):

            def build(version: int) -> Any:
                return EndTxnRequest(
                    transactional_id=self.transactional_id,
                    producer_id=identity.producer_id,
                    producer_epoch=identity.epoch,
                    committed=commit,
                )

            try:
                response = await self._request(
                    "EndTxn(commit)" if commit else "EndTxn(abort)",
                    ApiKey.END_TXN,
                    build,
                    lambda r: [r.error_code],
                    min_version=V2_MIN[ApiKey.END_TXN] if machine.v2 else None,
                    max_version=None if machine.v2 else V1_MAX[ApiKey.END_TXN],
                )
            except KafkaError as exc:
                if commit or exc.code not in BUMP_CODES or not machine.can_bump_epoch:
                    raise
                machine.require_epoch_bump()  # an abort the coordinator cannot place
            else:
                if response.producer_id >= 0:  # v5: the epoch the coordinator bumped to
                    self._new_producer(response.producer_id, response.producer_epoch)
                    bumped = True
        elif machine.started:
            machine.require_epoch_bump()
        if not commit and machine.epoch_bump_required and not bumped:
            if not machine.can_bump_epoch:
                err = KcoreError(
                    "the aborted transaction left sequence numbers unknown and the coordinator "
                    "cannot bump the epoch (it needs InitProducerId v3+)"
                )
                machine.fatal(err)
                raise machine.fatal_error()
            await self._init_producer_id(bump=True)
        machine.complete()


def _retrieved(task: asyncio.Task[None]) -> None:
    """Mark a queued send_offsets' failure as seen: its caller (or the commit) raised it, or
    stopped waiting on purpose."""
    if not task.cancelled():
        task.exception()
