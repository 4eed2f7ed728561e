"""The share consumer's logic, shared by ``kcore.ShareConsumer`` (blocking) and
``kcore.AsyncShareConsumer``: membership, fetcher, acknowledgements and what a poll, a commit,
an unsubscribe or a close does with them. The front ends differ only in how they wait: a poll
is a plan (a generator) that yields what must run on the event loop (:class:`Fetch`,
:class:`StartHeartbeat`, :class:`SendPending`) and returns the records; the blocking client
runs each on its loop thread, the asyncio one awaits it on the caller's loop.

Rules kept here: the caller's thread (or loop) and the event loop share the state through
:class:`Acknowledgements` and :class:`ShareBuffer` only (each takes its own lock); the commit
callback runs where the front end drains :meth:`ShareConsumerCore.run_callbacks`."""

from __future__ import annotations

import asyncio
import itertools
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, NamedTuple, TypeVar

from kcore.cluster.client import ClusterClient
from kcore.cluster.coordinator import CoordinatorLink
from kcore.cluster.otel import ClientOTel
from kcore.cluster.telemetry_sender import TelemetrySender
from kcore.config import ClientConfig
from kcore.consumer.fetcher import declare_fetch_metrics
from kcore.consumer.share._acknowledge import RecordAcknowledger
from kcore.consumer.share.acknowledgements import (
    Acknowledgements,
    AcknowledgeType,
    Run,
    ShareRecord,
    run_offsets,
)
from kcore.consumer.share.arrow import (
    batch_offsets,
    pyarrow_module,
    run_records,
    runs_to_arrow,
)
from kcore.consumer.share.fetcher import AckResult, ShareBuffer, ShareFetcher
from kcore.consumer.share.membership import ShareHeartbeat, ShareMembership
from kcore.consumer.share.statistics import ShareConsumerStatistics
from kcore.consumer.tracing import observe_poll
from kcore.errors import AcknowledgementError, KcoreError
from kcore.types import TopicPartition

__all__ = [
    "CLOSE_TIMEOUT_S",
    "AcknowledgementCommitCallback",
    "Fetch",
    "SendPending",
    "ShareConsumerCore",
    "SharePollPlan",
    "StartHeartbeat",
]

T = TypeVar("T")

# Called with the offsets acknowledged together per partition and how that ended (None: done;
# else the error), on the thread that calls poll, commit_sync, commit_async or close.
AcknowledgementCommitCallback = Callable[[dict[TopicPartition, set[int]], Exception | None], None]

CLOSE_TIMEOUT_S = 30.0
# While records are buffered, what is owed waits for the fetch that will carry it rather than
# going in a ShareAcknowledge of its own at every poll: requests to a leader are answered one
# at a time, so each separate one delays the fetches behind it, and each costs the leader a
# write of the share state. It waits at most a tenth of the acquisition lock the leader
# announced (waiting never costs a record its lock) and at most ACK_LINGER_MAX_S (records
# released or rejected go back to the group soon).
ACK_LINGER_MAX_S = 0.5


def ack_linger_s(acquisition_lock_s: float) -> float:
    """How long what is owed waits for a fetch to carry it, under a lock of that length."""
    return min(ACK_LINGER_MAX_S, acquisition_lock_s / 10)


class Fetch(NamedTuple):
    """A poll asks its driver to run a round of fetches for up to ``timeout`` seconds."""

    timeout: float


class StartHeartbeat(NamedTuple):
    """A poll asks its driver to start the heartbeat (join the group again)."""


class SendPending(NamedTuple):
    """A poll asks its driver to send what is owed in the background."""


SharePollPlan = Generator[Fetch | StartHeartbeat | SendPending, None, T]


class ShareConsumerCore:
    """Owns the share consumer's state; its coroutines run on the event loop, its plain
    methods on the caller's thread."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        cfg = (
            config
            if isinstance(config, ClientConfig) and config.role == "share_consumer"
            else ClientConfig(config, role="share_consumer")
        )
        self.config = cfg
        self.explicit = cfg["share.acknowledgement.mode"] == "explicit"
        self.max_poll_records = int(cfg["max.poll.records"])
        self.api_timeout_s = int(cfg["default.api.timeout.ms"]) / 1000
        self.cluster = ClusterClient(cfg, auto_create=bool(cfg["allow.auto.create.topics"]))
        self.membership = ShareMembership(str(cfg["group.id"]))
        self.acks = Acknowledgements(whole_polls=not self.explicit)
        # acknowledge(record, type) compiled for its common case (the front ends bind theirs
        # to it); the rest comes back to acknowledge() below.
        self.record_acknowledger = RecordAcknowledger(
            self.acks,
            ShareRecord,
            _KINDS,
            int(AcknowledgeType.RENEW),
            int(AcknowledgeType.ACCEPT),
            self.acknowledge,
            self.explicit,
        )
        self.buffer = ShareBuffer()
        self.callback: AcknowledgementCommitCallback | None = None
        self.closed = False
        self._fetcher: ShareFetcher | None = None
        self._owed_sent_at = 0.0  # when a poll last sent what was owed (or a fetch took it)
        self._last_poll: float | None = None
        # The runs the last poll handed out, and the last poll_arrow batch made of them: an
        # acknowledge_batch of that very batch takes its offsets from the runs rather than
        # reading its columns back.
        self._handed_out: list[tuple[TopicPartition, Run]] = []
        self._arrow_batch: weakref.ref[Any] | None = None
        _declare_metrics(self)
        self._heartbeat: ShareHeartbeat | None = None
        # KIP-714: the metrics a client-metrics subscription asks for, pushed on a timer (as
        # Java's share consumer, under its consumer-share metric groups).
        self.telemetry = TelemetrySender(self.cluster, "share_consumer", cfg)
        if self.cluster.statistics is not None:  # statistics.interval.ms, as the consumer's
            self.cluster.statistics.add_section(
                ShareConsumerStatistics(
                    self.membership,
                    self.assignment,
                    self.buffer,
                    self.cluster.cache,
                    self.cluster.metrics,
                )
            )
        # OpenTelemetry (otel.metrics.enable / otel.traces.enable): None while both are off.
        self.otel = ClientOTel.of_client(
            "share_consumer", cfg, self.cluster, self.metrics, group_id=self.membership.group_id
        )

    async def start(self) -> None:
        try:
            await self.cluster.start()
        except BaseException:
            await self.cluster.close()
            raise
        self._fetcher = ShareFetcher(
            self.cluster,
            self.membership.group_id,
            lambda: self.membership.member_id,
            self.acks,
            self.buffer,
            self.config,
        )
        link = CoordinatorLink(self.cluster, self.membership.group_id)
        self._heartbeat = ShareHeartbeat(
            self.cluster,
            link,
            self.membership,
            self._fetcher.set_assignment,
            max_poll_interval_s=int(self.config["max.poll.interval.ms"]) / 1000,
            before_poll_timeout_leave=self._give_back,
        )
        self.telemetry.start()
        if self.otel is not None:
            self.otel.start()

    @property
    def started(self) -> bool:
        return self._heartbeat is not None

    async def _give_back(self) -> None:
        """Before leaving for not polling: every record held is released (delivered or read
        ahead; not processed, as far as anyone knows) and the share sessions close."""
        self.settle_for_leaving(AcknowledgeType.RELEASE)
        self.fetcher.results.extend(await self.fetcher.acknowledge(final=True))

    @property
    def fetcher(self) -> ShareFetcher:
        assert self._fetcher is not None
        return self._fetcher

    @property
    def heartbeat(self) -> ShareHeartbeat:
        assert self._heartbeat is not None
        return self._heartbeat

    # -- subscription -------------------------------------------------------------------------

    def subscribe(self, names: list[str]) -> None:
        """Join with ``names`` (then start the heartbeat on the loop: :meth:`start_heartbeat`)."""
        self.check_open()
        if not all(isinstance(t, str) and t for t in names):
            raise KcoreError(f"subscribe() takes topic names, got {names!r}")
        self.membership.subscribe(names)
        self.cluster.add_topics(names)
        self.heartbeat.polled()  # the poll interval counts from here

    def start_heartbeat(self) -> None:
        """On the event loop."""
        self.heartbeat.start()

    def subscription(self) -> set[str]:
        return set(self.membership.topics or [])

    def assignment(self) -> set[TopicPartition]:
        return set(self._heartbeat.assigned) if self._heartbeat is not None else set()

    async def leave(self) -> list[AckResult]:
        """Unsubscribe, on the event loop: what is owed sent (see :meth:`settle_for_leaving`),
        the share sessions closed, the group left. The outcomes are returned for the
        callback."""
        self.settle_for_leaving()
        results = await self.fetcher.acknowledge(final=True)
        self.membership.unsubscribe()
        await self.heartbeat.leave(5.0)
        return results

    # -- polling ------------------------------------------------------------------------------

    def poll_plan(
        self, timeout: float, max_records: int | None
    ) -> SharePollPlan[list[ShareRecord]]:
        """One poll: at most ``max_records`` (default ``max.poll.records``) records acquired
        for this member, waiting up to ``timeout`` seconds for some."""
        return self._poll(timeout, max_records, False, _records_of)

    def poll_arrow_plan(self, timeout: float, max_records: int | None) -> SharePollPlan[Any]:
        """As :meth:`poll_plan`, the records as one Arrow record batch (``poll_arrow``)."""
        pyarrow_module()  # missing: refused here, before a fetch decodes into Arrow columns
        return self._poll(timeout, max_records, True, self._arrow_of)

    def _arrow_of(self, runs: list[tuple[TopicPartition, Run]]) -> Any:
        batch = runs_to_arrow(runs)
        self._arrow_batch = weakref.ref(batch) if runs else None
        return batch

    def _poll(
        self,
        timeout: float,
        max_records: int | None,
        columnar: bool,
        convert: Callable[[list[tuple[TopicPartition, Run]]], T],
    ) -> SharePollPlan[T]:
        """A poll handing out what ``convert`` makes of the runs it took; ``columnar``: the
        caller reads Arrow batches (the fetches that follow decode into columns)."""
        self.check_open()
        self._arrow_batch = None  # a batch of an earlier poll is acknowledged by its columns
        self.buffer.columnar = columnar
        limit = record_limit(max_records, self.max_poll_records)
        now = time.monotonic()
        otel, started = self.otel, now
        started_ns = time.time_ns() if otel is not None else 0
        if self._last_poll is not None:
            self.cluster.metrics.record("time-between-poll", (now - self._last_poll) * 1000)
        self._last_poll = now
        if self.membership.topics is None:
            raise KcoreError("poll() on a share consumer with no subscription: subscribe() first")
        if self.heartbeat.polled():
            # It left the group for not polling within max.poll.interval.ms: what it held
            # went back to the group, so nothing is owed any more; it joins again.
            self.acks.forget()
            self.buffer.drain()
            yield StartHeartbeat()
        self._settle_previous()
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            self.raise_errors()
            self.run_callbacks()
            runs = self.buffer.take(limit)
            if runs:
                now = time.monotonic()
                linger = ack_linger_s(self.fetcher.acquisition_lock_s)
                if self.acks.has_pending() and now - self._owed_sent_at >= linger:
                    # No fetch goes out soon to carry what is owed: it goes on its own, so
                    # that records read ahead do not hold acknowledgements back for long.
                    self._owed_sent_at = now
                    yield SendPending()
                self.acks.delivered(runs)
                self._handed_out = runs
                result = convert(runs)
                taken = sum(len(r) for _, r in runs)
                self.fetcher.sizing.taken(now, taken, len(self.buffer))
                self.cluster.metrics.record("records-consumed", taken)
                if otel is not None:
                    if otel.metrics_on:
                        for tp, run in runs:
                            otel.records_taken(tp.topic, tp.partition, len(run))
                    observe_poll(otel, result, started, started_ns)
                return result
            self._owed_sent_at = time.monotonic()
            yield Fetch(max(deadline - time.monotonic(), 0.0))
            if not len(self.buffer) and deadline - time.monotonic() <= 0:
                self.raise_errors()
                self.run_callbacks()
                return convert([])

    def _settle_previous(self) -> None:
        if not self.explicit:
            self.acks.settle_all(AcknowledgeType.ACCEPT)
        elif self.acks.unacknowledged():
            raise AcknowledgementError(
                f"explicit acknowledgement mode: {self.acks.unacknowledged()} record(s) of the "
                "previous poll are not acknowledged; acknowledge() each before polling again"
            )

    # -- acknowledging ------------------------------------------------------------------------

    def acknowledge(self, record: ShareRecord, type: AcknowledgeType | int) -> None:
        # What the compiled RecordAcknowledger does not take (see _acknowledge.pyx): the same
        # checks as the other acknowledge methods', and the same outcome.
        try:
            kind = _KINDS[type] if self.explicit and not self.closed else None
        except (KeyError, TypeError):
            kind = None
        if kind is None:
            kind = self._check_acknowledge("acknowledge", type)
        if record.__class__ is not ShareRecord and not isinstance(record, ShareRecord):
            raise AcknowledgementError(
                f"acknowledge() takes a record this consumer's poll returned, got {record!r}"
            )
        self.acks.acknowledge((record[0], record[1]), record[2], kind)

    def acknowledge_offset(
        self, topic: str, partition: int, offset: int, type: AcknowledgeType | int
    ) -> None:
        kind = self._check_acknowledge("acknowledge_offset", type)
        if not (
            isinstance(topic, str)
            and all(isinstance(n, int) and not isinstance(n, bool) for n in (partition, offset))
        ):
            raise AcknowledgementError(
                "acknowledge_offset() takes a topic name, a partition and an offset, got "
                f"{topic!r}, {partition!r}, {offset!r}"
            )
        self.acks.acknowledge(TopicPartition(topic, partition), offset, kind)

    def acknowledge_batch(self, batch: Any, type: AcknowledgeType | int) -> None:
        kind = self._check_acknowledge("acknowledge_batch", type)
        made = self._arrow_batch
        if made is not None and made() is batch:
            offsets: dict[TopicPartition, list[int]] = {}
            for tp, run in self._handed_out:
                offsets.setdefault(tp, []).extend(run_offsets(run))
        else:
            offsets = batch_offsets(batch)
        self.acks.acknowledge_many(offsets, kind)

    def _check_acknowledge(self, method: str, type: AcknowledgeType | int) -> int:
        self.check_open()
        if not self.explicit:
            raise AcknowledgementError(
                f"{method}() needs share.acknowledgement.mode=explicit (in implicit mode a "
                "poll's records are accepted at the next poll or commit)"
            )
        kind = _KINDS.get(type) if isinstance(type, int) else None
        if kind is None:
            raise AcknowledgementError(f"not an acknowledgement type: {type!r}")
        return kind

    def prepare_commit(self) -> tuple[float, int]:
        """Before a commit: implicit mode accepts the last poll's records. Returns when the
        commit started (time.monotonic(), time.time_ns()), for :meth:`commit_results`."""
        self.check_open()
        if not self.explicit:
            self.acks.settle_all(AcknowledgeType.ACCEPT)
        return time.monotonic(), time.time_ns()

    def commit_results(
        self, results: list[AckResult], started: tuple[float, int] | None = None
    ) -> dict[TopicPartition, Exception | None]:
        """A commit's acknowledgement outcomes: the callback hears of them, OpenTelemetry of
        the commit (one that sent something); how each partition's ended (None: done)."""
        self.run_callbacks(results)
        out: dict[TopicPartition, Exception | None] = {}
        for tp, _, err in results:
            if out.get(tp) is None:
                out[tp] = err
        otel = self.otel
        if otel is not None and started is not None and results:
            otel.commit_done(
                *started,
                topics=sorted({tp.topic for tp in out}),
                count=sum(len(offsets) for _, offsets, _ in results),
                error=next((err for err in out.values() if err is not None), None),
            )
        return out

    async def send_pending(self) -> None:
        """ShareAcknowledge in the background; the outcome goes to the commit callback."""
        await self.fetcher.send_pending()

    def run_callbacks(self, results: list[AckResult] | None = None) -> None:
        """The commit callback for ``results``, or (None) for the outcomes queued so far."""
        if results is None:
            results = self.fetcher.take_results() if self._fetcher is not None else []
        callback = self.callback
        if callback is None:
            return
        for tp, offsets, err in results:
            callback({tp: set(offsets)}, err)

    def metrics(self) -> dict[str, float]:
        """The client's metrics (see :func:`_declare_metrics`)."""
        return self.cluster.metrics.snapshot()

    # -- errors, close ------------------------------------------------------------------------

    def raise_errors(self) -> None:
        if self.membership.fatal is not None:
            raise self.membership.fatal
        hb = self._heartbeat
        if hb is not None and hb.connect_error is not None:
            raise hb.connect_error
        fetcher = self._fetcher
        if fetcher is not None and fetcher.error is not None:
            err, fetcher.error = fetcher.error, None
            raise err

    def mark_closed(self) -> None:
        """The front end is closing: every call but close refuses from now on."""
        self.closed = True
        self.record_acknowledger.open = False

    def check_open(self) -> None:
        if self.closed:
            raise KcoreError("the share consumer is closed")

    def settle_for_leaving(self, kind: AcknowledgeType | None = None) -> None:
        """Implicit mode: the last poll's records are accepted; explicit mode: those not
        acknowledged are released (or all ``kind``). Records fetched but never handed out are
        released."""
        if kind is None:
            kind = AcknowledgeType.RELEASE if self.explicit else AcknowledgeType.ACCEPT
        self.acks.settle_all(kind)
        for tp, run in self.buffer.drain():
            self.acks.add(tp, run_offsets(run), AcknowledgeType.RELEASE)

    async def finish(self, timeout: float) -> list[AckResult]:
        """Close, on the event loop: fetches under way end, what is owed is sent (see
        :meth:`settle_for_leaving`), the share sessions close and the member leaves. The
        outcomes are returned for the callback; the connections stay (:meth:`close_cluster`)."""
        fetcher, heartbeat = self.fetcher, self.heartbeat
        # Fetches under way finish first (what they acquire is released with the rest).
        await fetcher.stop(fetcher.max_wait_ms / 1000 + 1)
        self.settle_for_leaving()
        try:
            results = await asyncio.wait_for(fetcher.acknowledge(final=True), timeout)
        except asyncio.TimeoutError:
            results = []
        await heartbeat.leave(min(5.0, timeout))
        return results

    async def close_cluster(self) -> None:
        await self.telemetry.close()  # (its terminating push needs the connections)
        await self.cluster.close()


# The acknowledgement types as the plain ints they are sent as (an AcknowledgeType or its
# number looks itself up).
_KINDS: dict[int, int] = {int(k): int(k) for k in AcknowledgeType}


def _declare_metrics(core: ShareConsumerCore) -> None:
    """The share consumer's metrics, named as Java's share-fetch-manager-metrics and
    consumer-share-metrics groups have them (beside the connection metrics every client
    has). Recorded per fetch, per acknowledgement answer and per poll, never per record."""
    metrics = core.cluster.metrics
    declare_fetch_metrics(metrics)
    metrics.declare("records-per-request", "avg", "max")
    metrics.declare("acknowledgements-send", "total", "rate")
    metrics.declare("acknowledgements-error", "total", "rate")
    metrics.declare("time-between-poll", "avg", "max")
    metrics.gauge(
        "last-poll-seconds-ago",
        lambda: -1.0 if core._last_poll is None else time.monotonic() - core._last_poll,
    )
    metrics.gauge("assigned-partitions", lambda: len(core.assignment()))


def _records_of(runs: list[tuple[TopicPartition, Run]]) -> list[ShareRecord]:
    """What a poll took, as one list of records."""
    if len(runs) == 1:
        return run_records(runs[0][1])
    return list(itertools.chain.from_iterable(run_records(run) for _, run in runs))


def record_limit(max_records: int | None, default: int) -> int:
    if max_records is None:
        return default
    if not isinstance(max_records, int) or isinstance(max_records, bool) or max_records < 1:
        raise KcoreError(f"max_records must be a positive int, got {max_records!r}")
    return max_records


def topic_names(topics: Iterable[str] | str) -> list[str]:
    return [topics] if isinstance(topics, str) else list(topics)
