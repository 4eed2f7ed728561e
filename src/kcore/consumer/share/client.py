"""``kcore.ShareConsumer`` (blocking): a member of a share group (KIP-932, "queues for Kafka").

Members of a share group read the same partitions together; the broker hands each record to
one member at a time (it *acquires* it for that member, under a lock that times out) and
counts its deliveries. The member acknowledges each record: ACCEPT (done), RELEASE (deliver
again), REJECT (never again), RENEW (keep the lock). With ``share.acknowledgement.mode=implicit``
(the default) what a poll returned is accepted at the next poll or commit; ``explicit`` needs
:meth:`ShareConsumer.acknowledge` for each record before the next poll.

The heartbeat and the fetches run on the client's event loop (its own thread); ``poll`` runs on
the caller's thread and hands out what the fetches acquired."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from kcore.cluster.client import ClusterClient
from kcore.cluster.coordinator import CoordinatorLink
from kcore.config import ClientConfig
from kcore.consumer.share.acknowledgements import Acknowledgements, AcknowledgeType, ShareRecord
from kcore.consumer.share.arrow import batch_positions, records_to_arrow
from kcore.consumer.share.fetcher import AckResult, ShareBuffer, ShareFetcher
from kcore.consumer.share.membership import ShareHeartbeat, ShareMembership
from kcore.errors import AcknowledgementError, KcoreError, WakeupError
from kcore.network.loop_thread import start_on_loop_thread
from kcore.types import TopicPartition

__all__ = ["AcknowledgementCommitCallback", "ShareConsumer"]

# Called with the offsets acknowledged together per partition and how that ended (None: done;
# else the error), on the thread that calls poll, commit_sync, commit_async or close.
AcknowledgementCommitCallback = Callable[[dict[TopicPartition, set[int]], Exception | None], None]

_CLOSE_TIMEOUT_S = 30.0


class ShareConsumer:
    """``kcore.ShareConsumer({"bootstrap.servers": ..., "group.id": ...})``: subscribe, poll,
    acknowledge. Java's config names and defaults (its ShareConsumer's keys)."""

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
        self.acks = Acknowledgements()
        self.buffer = ShareBuffer()
        self._callback: AcknowledgementCommitCallback | None = None
        self._woken = threading.Event()
        self._closed = False
        self._fetcher: ShareFetcher | None = None
        self._heartbeat: ShareHeartbeat | None = None
        self._loop = start_on_loop_thread("kcore-share-consumer", self._start)

    async def _start(self) -> None:
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

    async def _give_back(self) -> None:
        """Before leaving for not polling: every record held is released (delivered or read
        ahead; not processed, as far as anyone knows) and the share sessions close."""
        self._settle_for_leaving(AcknowledgeType.RELEASE)
        self.fetcher.results.extend(await self.fetcher.acknowledge(final=True))

    @property
    def fetcher(self) -> ShareFetcher:
        assert self._fetcher is not None
        return self._fetcher

    @property
    def member_id(self) -> str:
        return self.membership.member_id

    # -- subscription -------------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str] | str) -> None:
        """Join the share group and read ``topics`` (names). ``subscribe([])`` unsubscribes."""
        self._check_open()
        names = [topics] if isinstance(topics, str) else list(topics)
        if not names:
            self.unsubscribe()
            return
        if not all(isinstance(t, str) and t for t in names):
            raise KcoreError(f"subscribe() takes topic names, got {names!r}")
        self.membership.subscribe(names)
        self.cluster.add_topics(names)
        assert self._heartbeat is not None
        self._heartbeat.polled()  # the poll interval counts from here
        self._start_heartbeat()

    def _start_heartbeat(self) -> None:
        async def start() -> None:
            assert self._heartbeat is not None
            self._heartbeat.start()

        self._loop.run(start())

    def subscription(self) -> set[str]:
        return set(self.membership.topics or [])

    def assignment(self) -> set[TopicPartition]:
        """The partitions the group assigned this member (others may read them too)."""
        return set(self._heartbeat.assigned) if self._heartbeat is not None else set()

    def unsubscribe(self) -> None:
        """Leave the group; records acquired and not acknowledged go back to the group."""
        self._check_open()
        if self.membership.topics is None:
            return
        self._settle_for_leaving()
        self._run_callbacks(self._loop.run(self.fetcher.acknowledge(final=True), _CLOSE_TIMEOUT_S))
        self.membership.unsubscribe()
        assert self._heartbeat is not None
        self._loop.run(self._heartbeat.leave(5.0), _CLOSE_TIMEOUT_S)

    # -- polling ------------------------------------------------------------------------------

    def poll(self, timeout: float = 1.0) -> list[ShareRecord]:
        """Records acquired for this member, waiting up to ``timeout`` seconds for some. In
        implicit mode the previous poll's records are accepted first; in explicit mode each of
        them must have been acknowledged. At most ``max.poll.records`` records."""
        return self._poll(timeout, self.max_poll_records)

    def poll_arrow(self, timeout: float = 1.0, max_records: int | None = None) -> Any:
        """As :meth:`poll`, the records as one ``pyarrow.RecordBatch``: the columns of
        ``Consumer.poll_arrow`` (key, value, topic, partition, offset, timestamp,
        timestampType, headers) and ``delivery_count``; at most ``max_records`` rows
        (default ``max.poll.records``). Acknowledge its rows with :meth:`acknowledge_batch`
        or :meth:`acknowledge_offset`."""
        limit = _record_limit(max_records, self.max_poll_records)
        return records_to_arrow(self._poll(timeout, limit))

    def _poll(self, timeout: float, max_records: int) -> list[ShareRecord]:
        self._check_open()
        self._raise_if_woken()
        if self.membership.topics is None:
            raise KcoreError("poll() on a share consumer with no subscription: subscribe() first")
        heartbeat = self._heartbeat
        assert heartbeat is not None
        if heartbeat.polled():
            # It left the group for not polling within max.poll.interval.ms: what it held
            # went back to the group, so nothing is owed any more; it joins again.
            self.acks.forget()
            self.buffer.drain()
            self._start_heartbeat()
        self._settle_previous()
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            self._raise_errors()
            self._run_callbacks()
            records = self.buffer.take(max_records)
            if records:
                # No fetch goes out to carry what is owed: it goes on its own, so that
                # records read ahead do not hold acknowledgements back.
                if self.acks.has_pending():
                    self._send_pending()
                self.acks.delivered(records)
                return records
            left = deadline - time.monotonic()
            self._loop.run(self.fetcher.fetch(max(left, 0.0)), interrupt=self._woken)
            if not len(self.buffer) and deadline - time.monotonic() <= 0:
                self._raise_errors()
                self._run_callbacks()
                return []

    def __iter__(self) -> Iterator[ShareRecord]:
        while True:
            yield from self.poll(1.0)

    def _settle_previous(self) -> None:
        if not self.explicit:
            self.acks.settle_all(AcknowledgeType.ACCEPT)
        elif self.acks.unacknowledged():
            raise AcknowledgementError(
                f"explicit acknowledgement mode: {self.acks.unacknowledged()} record(s) of the "
                "previous poll are not acknowledged; acknowledge() each before polling again"
            )

    # -- acknowledging ------------------------------------------------------------------------

    def acknowledge(
        self, record: ShareRecord, type: AcknowledgeType | int = AcknowledgeType.ACCEPT
    ) -> None:
        """Explicit mode: end ``record``'s delivery as ``type`` (ACCEPT by default). Sent with
        the next poll's fetch to its leader, or by ``commit_sync``/``commit_async``."""
        kind = self._check_acknowledge("acknowledge", type)
        if not isinstance(record, ShareRecord):
            raise AcknowledgementError(
                f"acknowledge() takes a record this consumer's poll returned, got {record!r}"
            )
        self.acks.acknowledge(TopicPartition(record.topic, record.partition), record.offset, kind)

    def acknowledge_offset(
        self,
        topic: str,
        partition: int,
        offset: int,
        type: AcknowledgeType | int = AcknowledgeType.ACCEPT,
    ) -> None:
        """As :meth:`acknowledge`, the record named by topic, partition and offset (a row of a
        :meth:`poll_arrow` batch)."""
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

    def acknowledge_batch(
        self, batch: Any, type: AcknowledgeType | int = AcknowledgeType.ACCEPT
    ) -> None:
        """As :meth:`acknowledge`, every row of ``batch`` (a :meth:`poll_arrow` record batch,
        or rows of one): all of them, or none when a row's record is not this consumer's to
        acknowledge."""
        kind = self._check_acknowledge("acknowledge_batch", type)
        self.acks.acknowledge_many(batch_positions(batch), kind)

    def _check_acknowledge(self, method: str, type: AcknowledgeType | int) -> AcknowledgeType:
        self._check_open()
        if not self.explicit:
            raise AcknowledgementError(
                f"{method}() needs share.acknowledgement.mode=explicit (in implicit mode a "
                "poll's records are accepted at the next poll or commit)"
            )
        try:
            return AcknowledgeType(type)
        except ValueError:
            raise AcknowledgementError(f"not an acknowledgement type: {type!r}") from None

    def commit_sync(self, timeout: float | None = None) -> dict[TopicPartition, Exception | None]:
        """Send the acknowledgements made so far (implicit mode: of the last poll's records)
        and wait for the brokers: how each partition's ended (None: done)."""
        self._check_open()
        if not self.explicit:
            self.acks.settle_all(AcknowledgeType.ACCEPT)
        t = self.api_timeout_s if timeout is None else timeout
        results = self._loop.run(self.fetcher.acknowledge(), t)
        self._run_callbacks(results)
        out: dict[TopicPartition, Exception | None] = {}
        for tp, _, err in results:
            if out.get(tp) is None:
                out[tp] = err
        return out

    def commit_async(self) -> None:
        """As :meth:`commit_sync` without waiting: the outcome goes to the acknowledgement
        commit callback, at a later poll or commit."""
        self._check_open()
        if not self.explicit:
            self.acks.settle_all(AcknowledgeType.ACCEPT)
        self._send_pending()

    def _send_pending(self) -> None:
        """ShareAcknowledge in the background; the outcome goes to the commit callback."""
        fetcher = self.fetcher

        async def send() -> None:
            fetcher.results.extend(await fetcher.acknowledge())

        self._loop.submit(send())

    def set_acknowledgement_commit_callback(
        self, callback: AcknowledgementCommitCallback | None
    ) -> None:
        """``callback(offsets_by_partition, error)`` once per partition's acknowledgements
        sent together, on the thread of a later poll, commit or close."""
        self._callback = callback

    def _run_callbacks(self, results: list[AckResult] | None = None) -> None:
        if results is None:
            results = []
            pending = self.fetcher.results if self._fetcher is not None else None
            while pending:
                results.append(pending.popleft())
        callback = self._callback
        if callback is None:
            return
        for tp, offsets, err in results:
            callback({tp: set(offsets)}, err)

    # -- errors, wakeup, close ----------------------------------------------------------------

    def _raise_errors(self) -> None:
        if self.membership.fatal is not None:
            raise self.membership.fatal
        hb = self._heartbeat
        if hb is not None and hb.connect_error is not None:
            raise hb.connect_error
        fetcher = self._fetcher
        if fetcher is not None and fetcher.error is not None:
            err, fetcher.error = fetcher.error, None
            raise err

    def wakeup(self) -> None:
        """From another thread: the blocking ``poll`` under way, or the next one, raises
        ``WakeupError``."""
        self._woken.set()

    def _raise_if_woken(self) -> None:
        if self._woken.is_set():
            self._woken.clear()
            raise WakeupError("wakeup() was called")

    def _check_open(self) -> None:
        if self._closed:
            raise KcoreError("the share consumer is closed")

    def _settle_for_leaving(self, kind: AcknowledgeType | None = None) -> None:
        """Implicit mode: the last poll's records are accepted; explicit mode: those not
        acknowledged are released (or all ``kind``). Records fetched but never handed out are
        released."""
        if kind is None:
            kind = AcknowledgeType.RELEASE if self.explicit else AcknowledgeType.ACCEPT
        self.acks.settle_all(kind)
        by_tp: dict[TopicPartition, list[int]] = {}
        for r in self.buffer.drain():
            by_tp.setdefault(TopicPartition(r.topic, r.partition), []).append(r.offset)
        for tp, offsets in by_tp.items():
            self.acks.add(tp, offsets, AcknowledgeType.RELEASE)

    def close(self, timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Send what is owed (implicit mode: the last poll's records accepted; explicit: the
        unacknowledged ones released; fetched but not handed out: released), close the share
        sessions, leave the group and close the connections. The commit callback runs here
        for the last acknowledgements."""
        if self._closed:
            return
        self._closed = True
        if not self._loop.is_running:
            return
        try:
            if self._fetcher is not None and self._heartbeat is not None:
                self._settle_for_leaving()
                try:
                    results = self._loop.run(self._finish(timeout), timeout + 5)
                    self._run_callbacks()
                    self._run_callbacks(results)
                except KcoreError:
                    pass  # closing goes on: the connections must be released
            self._loop.run(self.cluster.close(), 15)
        finally:
            self.acks.forget()
            self._loop.close()

    async def _finish(self, timeout: float) -> list[AckResult]:
        fetcher, heartbeat = self.fetcher, self._heartbeat
        assert heartbeat is not None
        # Fetches under way finish first (what they acquire is released with the rest).
        await fetcher.stop(fetcher.max_wait_ms / 1000 + 1)
        self._settle_for_leaving()
        try:
            results = await asyncio.wait_for(fetcher.acknowledge(final=True), timeout)
        except asyncio.TimeoutError:
            results = []
        await heartbeat.leave(min(5.0, timeout))
        return results

    def __enter__(self) -> ShareConsumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _record_limit(max_records: int | None, default: int) -> int:
    if max_records is None:
        return default
    if not isinstance(max_records, int) or isinstance(max_records, bool) or max_records < 1:
        raise KcoreError(f"max_records must be a positive int, got {max_records!r}")
    return max_records
