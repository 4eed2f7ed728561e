# cython: language_level=3
"""The producer's per-record path, compiled: ``SendPath.send`` chooses the partition (murmur2 for
keys, the sticky partition otherwise), appends the record to its partition's open batch and
makes the ``DeliveryFuture``. The producer (kcore.producer) owns everything else: it makes a
record's new batch (``new_batch``), and takes the whole send over (``slow``) whenever a record
needs the topic's metadata, a serializer, a custom partitioner, headers or a callback. The
batch builder and the key hash are the codec's, cimported through src/kcore/_codec.pxd (C
calls, no Python-level lookup).

The GIL rule
============

The send path takes no lock: holding the GIL is what keeps it consistent with the threads that
send, drain and build at the same time. This is the one place that states the rule; the code
that relies on it refers here.

The rule. From reading a batch's ``closed`` flag to writing the record into that batch's
builder, ``SendPath.send`` runs no other Python code and never releases the GIL: no call into
Python, and no allocation the garbage collector could act on (``RecordBatchBuilder.
write_record`` is one C call that only copies into its buffer, growing it with bytes objects,
which the collector does not track). So no other thread runs in between. With two invariants
the accumulator keeps under its own lock,

  (a) a partition's open batch is the last in its queue: the accumulator closes it before it
      queues another (``RecordAccumulator._new_batch``), and queues a chunk's batch closed
      (``append_chunk``);
  (b) every batch taken out of a queue is closed as it is taken (``drain``, to be sent;
      ``expire``; ``abort_all``), and the sender builds a batch only after ``drain`` took it,

a batch this path appends to is still the one the sender will take, and every record written
to it is in the bytes the sender builds. A batch is never appended to once closed.

Shared state the rule protects (read and written here without the accumulator's lock):

- the accumulator's queues, ``{TopicPartition: deque[ProducerBatch]}``
  (``RecordAccumulator.queues``): read here (a queue's last batch); changed by the
  accumulator under its lock (new batches, drain, expire, abort, requeue, split; empty queues
  dropped in ``drain``, after which this path goes the slow way);
- each batch's C fields (``ProducerBatchBase``): ``closed``, ``builder`` (its buffer,
  ``out.size``, ``record_count``) and ``result``. This path appends and sets ``closed`` when
  the batch is full or its builder lost its buffer; ``RecordAccumulator.append`` appends under
  its lock, which does not exclude this path, so it takes a record's index from the append
  itself (one C call); the accumulator and the sender close batches, the sender builds them;
- this module's own state, shared by every thread calling ``send`` (a Producer is
  thread-safe) and ``sticky_partition``: ``SendPath.seen_metadata``, ``routes`` (each
  ``TopicRoute`` with the open batch seen last per partition), ``last_topic`` and
  ``last_route``, ``metadata_changed`` and ``sticky`` (one ``StickyState`` per topic); and
  ``DeliveryFuture``'s free list (``cython.freelist``);
- ``MetadataCache.current``, read after its ``on_update`` said it changed (the cache swaps the
  reference, then calls ``on_update``).

Code that relies on it:

- here: ``SendPath.send``; ``SendPath.route`` (making TopicPartitions runs Python code, so a
  route is kept only if the snapshot is still the current one); ``next_sticky`` and
  ``sticky_partition``;
- kcore._codec: ``RecordBatchBuilder.write_record``, which ``append`` calls too (a write that
  succeeds runs no Python code and keeps the GIL);
- kcore.producer.accumulator: ``ProducerBatch`` (``records`` is the builder's count),
  ``RecordAccumulator._new_batch``, ``append``, ``append_chunk``, ``drain``, ``expire``,
  ``abort_all`` (invariants (a) and (b); tests/test_accumulator.py checks them);
- kcore.producer.sender: it builds a batch (``_payload``) only after ``drain`` closed it.

Without a GIL (a free-threaded build) each item above needs its own guard: the check-then-write
on a batch made atomic (a per-batch lock, or ``closed`` and the append under one), the queues
read under the accumulator's lock or through a per-partition handle, the SendPath's dicts
locked or per thread, and no free list for futures.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_ITEM
from libc.stdint cimport int32_t, int64_t, uint8_t, uint64_t
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from kcore._codec cimport RecordBatchBuilder, key_partition

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX

import asyncio as _asyncio
from asyncio import _get_running_loop
from collections import namedtuple as _namedtuple
from random import getrandbits as _random_bits

from kcore.errors import KcoreError, KcoreTimeoutError


RecordMetadata = _namedtuple("RecordMetadata", ["topic", "partition", "offset", "timestamp"])
RecordMetadata.__module__ = "kcore.producer"
RecordMetadata.__doc__ = """Where a record landed: ``timestamp`` is the record's (or the broker's,
with LogAppendTime) timestamp in ms; ``offset`` is -1 with ``acks=0``."""


@cython.final
@cython.freelist(512)
cdef class DeliveryFuture:
    """What ``send`` returns: ``result(timeout)`` gives the :class:`RecordMetadata` or raises
    the delivery error; ``await``-able too. It points at its batch's shared result (a
    kcore.producer.results.BatchResult) and its index in the batch: one small object per
    record, made from a free list by the compiled send path.

    Awaiting
    ========

    What an awaited future costs: no wake-up of its own. A batch's awaited records are
    handed to each waiting loop at once (``BatchResult.watch``): one ``call_soon`` per batch
    and loop (``call_soon_threadsafe`` from another thread), however many records wait.

    The rules it keeps:

    - Which loop it belongs to. An AsyncProducer's future belongs to the producer's loop
      (``_loop``): on that loop it is an asyncio future (``asyncio.isfuture``; ``gather``
      and ``wait`` take it as it is, no task per record), its done callbacks run on that
      loop, and it is used from that loop's thread, as any asyncio future. A sync Producer's
      future belongs to no loop: it is a plain awaitable on any loop, and so is an
      AsyncProducer's future on any other loop (each await there waits on a future of the
      awaiting loop).
    - A cancelled awaiting task. The record is not taken back: it is delivered (or fails),
      and ``on_delivery`` is called with its outcome, whatever became of the future. On any
      other loop, only that await is cancelled. On its own loop, the task cancels the future,
      as with any asyncio future: it is then done and cancelled (``result()`` raises
      ``asyncio.CancelledError``), and so is every other await of it.
    - A loop closed before delivery. The hand-over to it is dropped (nothing can wait on a
      closed loop, and the record's outcome is still there for ``result()``, for a callback,
      or for an await on another loop); the delivery goes on. No hang, no exception from
      the thread that completes the batch. (An AsyncProducer's own loop is another matter:
      its sender runs there, so it must be closed before that loop is; its records are not
      sent otherwise, and ``result(timeout)`` raises KcoreTimeoutError.)
    """

    cdef readonly object _batch
    cdef readonly Py_ssize_t _index
    cdef readonly str topic
    cdef readonly int32_t partition
    cdef readonly int64_t timestamp
    cdef readonly object _loop     # the AsyncProducer's loop; None for the sync Producer's
    # A loop's future: its done callbacks until they run, the first one inline (most futures
    # have one: the task or gather waiting for it), so registering allocates nothing.
    cdef object _fn0
    cdef object _context0
    cdef list _more_callbacks      # (fn, context) after the first
    cdef bint _watching            # registered with its batch (BatchResult.watch)
    cdef bint _blocking            # asyncio's _asyncio_future_blocking (a loop's future)
    cdef bint _cancelled
    cdef object _cancel_message

    def __init__(self, batch, Py_ssize_t index, str topic, int32_t partition,
                 int64_t timestamp, loop=None):
        self._batch = batch
        self._index = index
        self.topic = topic
        self.partition = partition
        self.timestamp = timestamp
        self._loop = loop

    cdef tuple _located(self):
        """(the result that answers for this record, its index there): the batch's own, or,
        if the batch was split, its part's (each part may be done before the rest)."""
        b = self._batch
        if b.parts is None:
            return b, self._index
        return b.locate(self._index)

    def done(self):
        return self._cancelled or self._located()[0].done

    def cancelled(self):
        return self._cancelled

    def _metadata(self):
        b, index = self._located()
        if b.error is not None:
            raise b.error_at(index)
        base = b.base_offset
        offset = base + index if base >= 0 else -1
        log_append = b.log_append_time
        return RecordMetadata(self.topic, self.partition, offset,
                              log_append if log_append >= 0 else self.timestamp)

    def result(self, timeout=None):
        if self._cancelled:
            raise self._make_cancelled_error()
        if not self._batch.wait_record(self._index, timeout):
            raise KcoreTimeoutError(
                f"record to {self.topic}-{self.partition} not delivered within {timeout:g}s")
        return self._metadata()

    def exception(self, timeout=None):
        if self._cancelled:
            raise self._make_cancelled_error()
        if not self._batch.wait_record(self._index, timeout):
            raise KcoreTimeoutError(f"record to {self.topic}-{self.partition} still pending")
        b, index = self._located()
        return b.error_at(index) if b.error is not None else None

    def when_delivered(self, fn):
        """Call ``fn(error, metadata)`` once the record is delivered (``error`` None) or failed
        (``metadata`` None), on the thread that completes it (the network thread; the
        AsyncProducer's loop), even if the future was cancelled meanwhile: what
        ``on_delivery`` is called from."""
        self._batch.add_callback(lambda _b: self._deliver_to(fn), self._index)

    cdef _deliver_to(self, fn):
        try:
            metadata = self._metadata()
        except BaseException as exc:  # the delivery error goes to the callback
            return fn(exc, None)
        return fn(None, metadata)

    def add_done_callback(self, fn, *, context=None):
        """A sync Producer's future: ``fn(self)`` once the record is delivered or failed, on
        the thread that completes it. A loop's future: as an asyncio future's, ``fn(self)``
        soon on its loop once it is done or cancelled."""
        loop = self._loop
        if loop is None:
            self._batch.add_callback(lambda _b: fn(self), self._index)
            return
        if self.done():
            _call_soon(loop, _run_one, (fn, context, self))
            return
        if self._fn0 is None:
            self._fn0 = fn
            self._context0 = context
        elif self._more_callbacks is None:
            self._more_callbacks = [(fn, context)]
        else:
            self._more_callbacks.append((fn, context))
        if not self._watching:
            self._watching = True
            b, index = self._located()
            if not b.watch(loop, self, index):  # done meanwhile (on another thread)
                _call_soon(loop, _future_done, self)

    def remove_done_callback(self, fn):
        """A loop's future: as an asyncio future's (how many were removed). A sync Producer's
        callbacks cannot be removed: 0."""
        removed = 0
        if self._fn0 is not None and self._fn0 == fn:
            self._fn0 = self._context0 = None
            removed = 1
        if self._more_callbacks:
            kept = [entry for entry in self._more_callbacks if entry[0] != fn]
            removed += len(self._more_callbacks) - len(kept)
            self._more_callbacks[:] = kept
        return removed

    def cancel(self, msg=None):
        """A loop's future, not done yet: cancelled (its callbacks are scheduled), and True.
        The record is still delivered: a queued record cannot be taken back. Otherwise
        False (a sync Producer's future cannot be cancelled)."""
        if self._loop is None or self.done():
            return False
        self._cancelled = True
        self._cancel_message = msg
        if self._fn0 is not None or self._more_callbacks:
            _call_soon(self._loop, _future_done, self)
        return True

    def _make_cancelled_error(self):
        if self._cancel_message is None:
            return _asyncio.CancelledError()
        return _asyncio.CancelledError(self._cancel_message)

    cdef _run_callbacks(self):
        fn, context, more = self._fn0, self._context0, self._more_callbacks
        self._fn0 = self._context0 = self._more_callbacks = None
        if fn is not None:
            _run_one((fn, context, self))
        for fn, context in more or ():
            _run_one((fn, context, self))

    def _loop_done(self):
        """(BatchResult's hand-over, on the loop) The record is done: run the callbacks."""
        self._run_callbacks()

    def _record_result(self):
        """(BatchResult.split) The result that answers for the record now, and its index."""
        return self._located()

    def get_loop(self):
        """The loop this future belongs to (an AsyncProducer's); a sync Producer's future
        belongs to none (KcoreError)."""
        if self._loop is None:
            raise KcoreError(
                "a sync Producer's future belongs to no event loop: await it on any")
        return self._loop

    @property
    def _asyncio_future_blocking(self):
        # None (not an asyncio future) except on its own loop: elsewhere ``gather`` and
        # ``ensure_future`` wrap it in a task of their loop, which awaits it as a plain
        # awaitable, instead of refusing a future of another loop.
        if self._loop is None or _get_running_loop() is not self._loop:
            return None
        return self._blocking

    @_asyncio_future_blocking.setter
    def _asyncio_future_blocking(self, value):
        self._blocking = bool(value)

    def __await__(self):
        if not self.done():
            loop = _asyncio.get_running_loop()
            if loop is self._loop:
                self._blocking = True
                yield self  # the task waits with add_done_callback (an asyncio future)
            else:
                waiter = loop.create_future()
                b, index = self._located()
                if b.watch(loop, waiter, index):
                    yield from waiter.__await__()
        return self.result()

    def __repr__(self):
        if self._cancelled:
            state = "cancelled"
        else:
            b = self._located()[0]
            state = "pending" if not b.done else "failed" if b.error is not None else "done"
        return f"<DeliveryFuture {self.topic}-{self.partition} {state}>"


def _future_done(future):
    (<DeliveryFuture>future)._run_callbacks()


def _run_one(entry):
    """``fn(future)`` in its context, as an asyncio Handle runs it: an error goes to the
    loop's exception handler, and the other callbacks still run."""
    fn, context, future = entry
    try:
        if context is None:
            fn(future)
        else:
            context.run(fn, future)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:
        (<DeliveryFuture>future)._loop.call_exception_handler({
            "message": f"exception in a done callback of {future!r}",
            "exception": exc,
            "future": future,
        })


def _call_soon(loop, fn, arg):
    """``fn(arg)`` soon on ``loop``, from any thread; dropped if that loop is closed."""
    try:
        if _get_running_loop() is loop:
            loop.call_soon(fn, arg)
        else:
            loop.call_soon_threadsafe(fn, arg)
    except RuntimeError:  # closed: nothing waits there any more
        pass


cdef class ProducerBatchBase:
    """Fields of kcore.producer.accumulator.ProducerBatch that the compiled send path reads and
    writes per record (C fields: no attribute lookup). The rest of the batch is Python."""
    cdef public RecordBatchBuilder builder
    cdef public object result
    cdef public bint closed

    @property
    def records(self):
        """Records in the batch: the builder's count, which each append moves inside one C
        call (a separate counter could be moved by another thread between two lines)."""
        return self.builder.record_count


cdef class StickyState:
    """The uniform sticky partitioner's state for one topic: the partition records without a
    key go to, and the bytes sent to it since it was chosen."""
    cdef int32_t partition
    cdef Py_ssize_t sent


cdef class TopicRoute:
    """What the send path knows of one topic under one metadata snapshot: its partitions, and
    for each the open batch last seen (None until looked up)."""
    cdef int32_t count
    cdef list tps          # TopicPartition per partition (the accumulator's queue keys)
    cdef list open_batches # ProducerBatchBase or None per partition
    cdef object info       # the TopicInfo (leaders, for the sticky partitioner's choice)
    cdef list available    # its partitions with a leader, listed when first needed
    cdef StickyState sticky


cdef inline list route_available(TopicRoute route):
    if route.available is None:
        route.available = [q for q, pi in route.info.partitions.items() if pi.leader >= 0]
    return route.available


# The sticky partitioner's draws: xorshift64, seeded once from the random module. Its state is
# shared by every thread that sends, which the GIL rule above keeps consistent.
cdef uint64_t draw_state = (<uint64_t>_random_bits(63)) | 1


cdef inline uint64_t draw() noexcept:
    global draw_state
    cdef uint64_t x = draw_state
    x ^= x << 13
    x ^= x >> 7
    x ^= x << 17
    draw_state = x
    return x


cdef inline int64_t now_ms() noexcept:
    cdef timespec t
    clock_gettime(CLOCK_REALTIME, &t)
    return <int64_t>t.tv_sec * 1000 + t.tv_nsec // 1000000


cdef class SendPath:
    """``send(topic, value, key, partition, timestamp_ms, headers)`` for the common case, or
    the result of ``slow(...)`` with the same arguments."""

    cdef public object slow       # the producer's Python send, for everything else
    # (tp, key, value, timestamp) -> (batch, index): the record appended to a new batch, or
    # None to take ``slow`` (ProducerCore.new_batch); None: ``slow`` makes new batches too.
    cdef public object new_batch
    cdef object tp_type           # TopicPartition
    cdef object queues            # the accumulator's {TopicPartition: deque[ProducerBatch]}
    cdef object cache             # the MetadataCache; its `current` changes on refresh
    cdef object seen_metadata
    # Set by the cache's on_update (any change of `current`), cleared where `current` is
    # read again: a record costs a C flag's test, not an attribute lookup.
    cdef bint metadata_changed
    cdef dict routes              # topic -> TopicRoute under seen_metadata
    # The last topic sent to and its route (a dict lookup saved when the topic is the same
    # str object, as in a loop): forgotten with `routes`.
    cdef object last_topic
    cdef TopicRoute last_route
    cdef dict sticky              # topic -> StickyState (kept across metadata refreshes)
    cdef Py_ssize_t batch_size
    cdef Py_ssize_t max_payload   # key + value bytes above which the slow path checks the size
    cdef public bint enabled      # off: always the slow path (closed, or custom settings)
    cdef public object loop       # the loop the futures belong to (AsyncProducer), or None

    def __init__(self, slow, tp_type, queues, cache, Py_ssize_t batch_size,
                 bint enabled=True, Py_ssize_t max_payload=PY_SSIZE_T_MAX, new_batch=None):
        self.slow = slow
        self.new_batch = new_batch
        self.tp_type = tp_type
        self.queues = queues
        self.cache = cache
        self.seen_metadata = None
        self.metadata_changed = True
        self.routes = {}
        self.last_topic = None
        self.last_route = None
        self.sticky = {}
        self.batch_size = batch_size
        self.max_payload = max_payload
        self.enabled = enabled
        self.loop = None
        if cache is not None:
            cache.on_update.append(self.metadata_updated)

    def metadata_updated(self):
        """The cache's `current` was replaced (a refresh, a leader hint, a topic forgotten):
        routes are made afresh from the next record on."""
        self.metadata_changed = True

    cdef StickyState sticky_state(self, str topic):
        cdef StickyState state = <StickyState>self.sticky.get(topic)
        if state is None:
            state = StickyState.__new__(StickyState)
            state.partition = -1
            self.sticky[topic] = state
        return state

    cdef int32_t next_sticky(self, StickyState state, int32_t count, object available,
                             Py_ssize_t size) except -1:
        """The partition for ``size`` more bytes; a new one is chosen among ``available`` (the
        topic's partitions with a leader)."""
        cdef Py_ssize_t n, attempt
        cdef int32_t q
        if state.partition < 0 or state.partition >= count or state.sent >= self.batch_size:
            # Uniform among the available partitions but the current one: a few draws from
            # the list as it is (each rejected one leaves the rest uniform), and only when
            # they all miss, the list of what qualifies (no partition with a leader: any).
            n = len(available)
            for attempt in range(8 if n > 1 else 0):
                q = <int32_t>available[<Py_ssize_t>(draw() % <uint64_t>n)]
                if 0 <= q < count and q != state.partition:
                    state.partition = q
                    break
            else:
                choices = [q for q in available if q < count] or list(range(count))
                if state.partition >= 0 and len(choices) > 1:
                    choices = [q for q in choices if q != state.partition] or choices
                state.partition = choices[<Py_ssize_t>(draw() % <uint64_t>len(choices))]
            state.sent = 0
        state.sent += size
        return state.partition

    def sticky_partition(self, str topic, int32_t count, object available, Py_ssize_t size):
        """The uniform sticky partitioner (KIP-794): the topic's current partition until about
        ``batch.size`` bytes went to it, then another at random among ``available`` (those
        with a leader). One state for send, send_batch and the compiled path."""
        return self.next_sticky(self.sticky_state(topic), count, available, size)

    cdef TopicRoute route(self, object md, str topic):
        """The topic's route under snapshot ``md`` (None if the topic is not in it)."""
        cdef TopicRoute route
        cdef Py_ssize_t i, n
        info = md.topics.get(topic)
        if info is None or not info.partitions:
            return None
        n = len(info.partitions)
        route = TopicRoute.__new__(TopicRoute)
        route.count = <int32_t>n
        route.tps = [self.tp_type(topic, i) for i in range(n)]
        route.open_batches = [None] * n
        route.info = info
        route.sticky = self.sticky_state(topic)
        # Making the TopicPartitions ran Python code, so another thread may have seen newer
        # metadata meanwhile: keep the route only if it still describes the current snapshot.
        if self.seen_metadata is md:
            self.routes[topic] = route
        return route

    def send(self, topic, value, key=None, partition=None, timestamp_ms=None, headers=None,
             on_delivery=None):
        cdef int32_t p
        cdef int64_t ts
        cdef Py_ssize_t klen = -1, vlen = -1, index
        cdef const uint8_t* kp = NULL
        cdef const uint8_t* vp = NULL
        cdef RecordBatchBuilder builder
        cdef ProducerBatchBase batch
        cdef DeliveryFuture future
        cdef TopicRoute route
        if (not self.enabled or on_delivery is not None or headers
                or (key is not None and type(key) is not bytes)
                or (value is not None and type(value) is not bytes)
                or type(topic) is not str
                or (timestamp_ms is not None and type(timestamp_ms) is not int)):
            return self.slow(topic, value, key, partition, timestamp_ms, headers, on_delivery)
        # (An exact int converts without running Python code; see the write below.)
        ts = now_ms() if timestamp_ms is None else <int64_t>timestamp_ms
        if self.metadata_changed:  # partition counts and leaders may have changed
            # Cleared before `current` is read: an update after the read sets it again.
            self.metadata_changed = False
            self.seen_metadata = self.cache.current
            self.routes.clear()
            self.last_topic = None
            self.last_route = None
        if topic is self.last_topic:
            route = self.last_route
        else:
            md = self.seen_metadata
            route = <TopicRoute>self.routes.get(topic)
            if route is None:
                route = self.route(md, topic)
                if route is None:
                    return self.slow(topic, value, key, partition, timestamp_ms, headers,
                                     on_delivery)
            if self.seen_metadata is md:  # (as in `route`: kept only under the snapshot read)
                self.last_topic = topic
                self.last_route = route
        if key is not None:
            kp = <const uint8_t*>PyBytes_AS_STRING(key)
            klen = PyBytes_GET_SIZE(key)
        if value is not None:
            vp = <const uint8_t*>PyBytes_AS_STRING(value)
            vlen = PyBytes_GET_SIZE(value)
        if max(klen, 0) + max(vlen, 0) > self.max_payload:  # maybe too large: checked there
            return self.slow(topic, value, key, partition, timestamp_ms, headers, on_delivery)
        if partition is not None:
            p = partition
            if p < 0 or p >= route.count:
                return self.slow(topic, value, key, partition, timestamp_ms, headers, on_delivery)
        elif kp != NULL:
            p = key_partition(kp, klen, route.count)
        else:
            p = self.next_sticky(route.sticky, route.count, route_available(route),
                                 21 + max(vlen, 0))
        # The partition's open batch: the one seen last time unless it was closed since
        # (invariant (a) of the GIL rule above), if the record fits it.
        batch = <ProducerBatchBase><object>PyList_GET_ITEM(route.open_batches, p)
        if batch is None or batch.closed:
            batch = None
            queue = self.queues.get(<object>PyList_GET_ITEM(route.tps, p))
            if queue:
                batch = <ProducerBatchBase?>queue[len(queue) - 1]  # (wraparound is off)
                if batch.closed:
                    batch = None
        if batch is not None:
            builder = batch.builder
            index = builder.record_count
            if index > 0 and builder.out.size + 21 + max(klen, 0) + max(vlen, 0) > self.batch_size:
                batch = None
        if batch is None:
            # A new batch: the accumulator makes it and appends the record under its lock
            # (Python code: the GIL rule does not cover this branch, nor need to).
            if self.new_batch is None:
                return self.slow(topic, value, key, p, timestamp_ms, headers, on_delivery)
            opened = self.new_batch(<object>PyList_GET_ITEM(route.tps, p), key, value, ts)
            if opened is None:  # only the full path can take it (see ProducerCore.new_batch)
                return self.slow(topic, value, key, p, timestamp_ms, headers, on_delivery)
            batch = <ProducerBatchBase?>opened[0]
            index = <Py_ssize_t>opened[1]
        else:
            # The GIL rule above: from the closed check through the write no other Python
            # code runs, so the sender cannot take this batch in between.
            try:
                builder.write_record(kp, klen, vp, vlen, ts, None, 0, 0, NULL, 0)
            except MemoryError:
                # The builder may have lost its buffer (RecordBatchBuilder.resize): no more
                # appends; the sender fails the batch when it cannot build it.
                batch.closed = True
                raise
            if builder.out.size >= self.batch_size:
                batch.closed = True  # full: the sender takes it at its next look
        # Remembered after the write: dropping the batch kept before may free objects.
        route.open_batches[p] = batch
        future = DeliveryFuture.__new__(DeliveryFuture)
        future._batch = batch.result
        future._index = index
        future.topic = topic
        future.partition = p
        future.timestamp = ts
        future._loop = self.loop
        return future
