# cython: language_level=3
"""A share consumer's acknowledgement state (``Acknowledgements`` in acknowledgements.py is
its Python subclass, with the methods), the offsets it holds (``OffsetSpans``) and the
per-record ``acknowledge`` of explicit mode, compiled: every record goes through that call,
and in Python (three frames and a lock) it cost ~0.5 us a record, more than decoding the
record.

Rules kept:

* the state (delivered, pending and renewing offsets by partition) changes only with ``_lock``
  held, here as in the subclass's methods: the caller's thread and the event loop both change
  it;
* the compiled path takes only the common case: the consumer open in explicit mode, a
  ``ShareRecord``, a type other than RENEW, the record delivered and not acknowledged yet, and
  the lock free at once. Anything else goes to the checked Python path (``fallback``), which
  does the same or raises what it raises;
* what the compiled path found for a partition (its owed and pending offsets) serves the next
  records of that partition only while no Python code has taken the lock since (its epoch).
"""

from cpython.dict cimport PyDict_DelItem, PyDict_GetItem, PyDict_SetItem
from cpython.object cimport Py_TYPE, PyObject, PyTypeObject
from cpython.pythread cimport (
    NOWAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from cpython.long cimport PyLong_Check
from cpython.tuple cimport PyTuple_GET_ITEM
from libc.stdint cimport int64_t
from libc.stdlib cimport free, realloc
from libc.string cimport memmove

include "../../_native/pylock.pxi"


cdef struct Span:
    int64_t first
    int64_t last
    int kind


cdef bint as_offset(object offset, int64_t* out) noexcept:
    """``offset`` as a C offset; False when it is not an int of 64 bits."""
    if not PyLong_Check(offset):
        return False
    try:
        out[0] = offset
    except OverflowError:
        return False
    return True


cdef class OffsetSpans:
    """Offsets of one partition, each with a kind (an acknowledgement type; 0 where it means
    nothing), kept as sorted, disjoint spans of consecutive offsets of one kind. A poll's
    records, their acknowledgements and implicit mode's settling all come in offset order, so
    adding an offset extends the last span and taking one away shortens the first: no hashing
    and no object per offset, and the protocol's acknowledgement batches are read off the
    spans. Rules kept: two spans of one kind never touch (they are merged); ``count`` is the
    number of offsets held. Read as a set of offsets (``in``, iteration, ``len``) and as a
    mapping of offset to kind (``get``, ``items``); equal to a ``dict`` or ``set`` holding the
    same."""

    cdef Span* spans
    cdef Py_ssize_t start  # the live spans are spans[start:stop]
    cdef Py_ssize_t stop
    cdef Py_ssize_t cap
    cdef readonly Py_ssize_t count

    def __dealloc__(self):
        free(self.spans)

    # -- compiled operations ---------------------------------------------------------------

    cdef int reserve(self) except -1:
        """Room for one more span at the end (the dead head reclaimed first)."""
        cdef Py_ssize_t n = self.stop - self.start
        cdef Span* grown
        if self.stop < self.cap:
            return 0
        if self.start:
            memmove(self.spans, self.spans + self.start, n * sizeof(Span))
            self.start, self.stop = 0, n
            if n < self.cap:
                return 0
        grown = <Span*>realloc(self.spans, max(8, 2 * self.cap) * sizeof(Span))
        if grown is NULL:
            raise MemoryError("no room for offset spans")
        self.spans = grown
        self.cap = max(8, 2 * self.cap)
        return 0

    cdef int insert_at(self, Py_ssize_t i, int64_t first, int64_t last, int kind) except -1:
        cdef Py_ssize_t rel = i - self.start
        self.reserve()
        i = self.start + rel
        memmove(self.spans + i + 1, self.spans + i, (self.stop - i) * sizeof(Span))
        self.spans[i].first = first
        self.spans[i].last = last
        self.spans[i].kind = kind
        self.stop += 1
        return 0

    cdef void remove_at(self, Py_ssize_t i) noexcept:
        if i == self.start:
            self.start += 1
            if self.start == self.stop:
                self.start = self.stop = 0
        else:
            memmove(self.spans + i, self.spans + i + 1, (self.stop - i - 1) * sizeof(Span))
            self.stop -= 1

    cdef Py_ssize_t locate(self, int64_t offset) noexcept:
        """The first live span whose last offset is ``offset`` or above (``stop``: none)."""
        cdef Py_ssize_t lo = self.start, hi = self.stop, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.spans[mid].last < offset:
                lo = mid + 1
            else:
                hi = mid
        return lo

    cdef Py_ssize_t find(self, int64_t offset) noexcept:
        """The live span holding ``offset``, -1 when none does."""
        cdef Py_ssize_t i
        if self.start == self.stop or offset < self.spans[self.start].first:
            return -1
        if offset > self.spans[self.stop - 1].last:
            return -1
        i = self.locate(offset)
        return i if self.spans[i].first <= offset else -1

    cdef int kind_of(self, int64_t offset) noexcept:
        """``offset``'s kind, -1 when not held."""
        cdef Py_ssize_t i = self.find(offset)
        return self.spans[i].kind if i >= 0 else -1

    cdef int take_out(self, Py_ssize_t i, int64_t offset) except -1:
        """``offset`` (held by span ``i``) no longer held."""
        cdef Span s = self.spans[i]
        if s.first == s.last:
            self.remove_at(i)
        elif offset == s.first:
            self.spans[i].first += 1
        elif offset == s.last:
            self.spans[i].last -= 1
        else:
            self.spans[i].last = offset - 1
            self.insert_at(i + 1, offset + 1, s.last, s.kind)
        self.count -= 1
        return 0

    cdef bint discard_offset(self, int64_t offset) except -1:
        """``offset`` no longer held; False if it was not."""
        cdef Py_ssize_t i
        if self.start != self.stop and offset == self.spans[self.start].first:
            i = self.start  # in order: the first span shortens, no search
        else:
            i = self.find(offset)
            if i < 0:
                return False
        self.take_out(i, offset)
        return True

    cdef int put(self, int64_t offset, int kind) except -1:
        """``offset`` held with ``kind`` (replacing the kind it had)."""
        cdef Py_ssize_t i
        cdef Span* last
        cdef bint joins_prev, joins_next
        if self.start == self.stop:
            self.insert_at(self.stop, offset, offset, kind)
            self.count += 1
            return 0
        last = &self.spans[self.stop - 1]
        if offset > last.last:  # in order: the last span grows, or a new one follows it
            if offset == last.last + 1 and kind == last.kind:
                last.last = offset
            else:
                self.insert_at(self.stop, offset, offset, kind)
            self.count += 1
            return 0
        i = self.locate(offset)
        if self.spans[i].first <= offset:  # held: a new kind splits its span
            if self.spans[i].kind == kind:
                return 0
            self.take_out(i, offset)
            return self.put(offset, kind)
        joins_prev = (i > self.start and self.spans[i - 1].last + 1 == offset
                      and self.spans[i - 1].kind == kind)
        joins_next = self.spans[i].first == offset + 1 and self.spans[i].kind == kind
        if joins_prev and joins_next:
            self.spans[i - 1].last = self.spans[i].last
            self.remove_at(i)
        elif joins_prev:
            self.spans[i - 1].last = offset
        elif joins_next:
            self.spans[i].first = offset
        else:
            self.insert_at(i, offset, offset, kind)
        self.count += 1
        return 0

    cdef int put_span(self, int64_t first, int64_t last, int kind) except -1:
        """Every offset from ``first`` to ``last`` held with ``kind``."""
        cdef int64_t offset
        cdef Span* end
        if first > last:
            return 0
        if self.start == self.stop or first > self.spans[self.stop - 1].last:
            end = &self.spans[self.stop - 1] if self.start != self.stop else NULL
            if end is not NULL and first == end.last + 1 and kind == end.kind:
                end.last = last
            else:
                self.insert_at(self.stop, first, last, kind)
            self.count += last - first + 1
            return 0
        for offset in range(first, last + 1):  # out of order (rare): one at a time
            self.put(offset, kind)
        return 0

    # -- Python interface ------------------------------------------------------------------
    # An offset asked about that is not an int (or beyond 64 bits) is simply not held.

    def add(self, offset, kind=0):
        self.put(offset, kind)

    def add_span(self, first, last, kind=0):
        self.put_span(first, last, kind)

    def add_spans(self, OffsetSpans other, int kind):
        """Every offset ``other`` holds, with ``kind``."""
        cdef Py_ssize_t i
        for i in range(other.start, other.stop):
            self.put_span(other.spans[i].first, other.spans[i].last, kind)

    def update(self, offsets, int kind=0):
        for offset in offsets:
            self.put(offset, kind)

    def discard(self, offset):
        cdef int64_t o
        return as_offset(offset, &o) and self.discard_offset(o)

    def difference_update(self, offsets):
        for offset in offsets:
            self.discard_offset(offset)

    def issuperset(self, offsets):
        cdef int64_t o
        for offset in offsets:
            if not as_offset(offset, &o) or self.kind_of(o) < 0:
                return False
        return True

    def __contains__(self, offset):
        cdef int64_t o
        return as_offset(offset, &o) and self.kind_of(o) >= 0

    def get(self, offset, default=None):
        cdef int64_t o
        cdef int kind = self.kind_of(o) if as_offset(offset, &o) else -1
        return default if kind < 0 else kind

    def __getitem__(self, offset):
        cdef int64_t o
        cdef int kind = self.kind_of(o) if as_offset(offset, &o) else -1
        if kind < 0:
            raise KeyError(offset)
        return kind

    def __len__(self):
        return self.count

    def span_list(self):
        """The spans, as ``(first, last, kind)`` in offset order."""
        return [(self.spans[i].first, self.spans[i].last, self.spans[i].kind)
                for i in range(self.start, self.stop)]

    def __iter__(self):
        return iter([offset for first, last, _ in self.span_list()
                     for offset in range(first, last + 1)])

    def items(self):
        return [(offset, kind) for first, last, kind in self.span_list()
                for offset in range(first, last + 1)]

    def values(self):
        return [kind for first, last, kind in self.span_list() for _ in range(first, last + 1)]

    def kinds(self):
        return {self.spans[i].kind for i in range(self.start, self.stop)}

    def count_of(self, int kind):
        cdef Py_ssize_t i, n = 0
        for i in range(self.start, self.stop):
            if self.spans[i].kind == kind:
                n += self.spans[i].last - self.spans[i].first + 1
        return n

    def batches(self, batch_type):
        """The protocol's acknowledgement batches (``batch_type``: the ShareFetch or the
        ShareAcknowledge message's): one per run of consecutive offsets, with one type when
        the whole run has it, else one type per offset."""
        cdef Py_ssize_t i = self.start, j
        cdef list out = []
        while i < self.stop:
            j = i + 1
            uniform = True
            while j < self.stop and self.spans[j].first == self.spans[j - 1].last + 1:
                uniform = uniform and self.spans[j].kind == self.spans[i].kind
                j += 1
            if uniform:
                kinds = [self.spans[i].kind]
            else:
                kinds = [self.spans[k].kind for k in range(i, j)
                         for _ in range(self.spans[k].first, self.spans[k].last + 1)]
            out.append(batch_type(first_offset=self.spans[i].first,
                                  last_offset=self.spans[j - 1].last,
                                  acknowledge_types=kinds))
            i = j
        return out

    def __eq__(self, other):
        if isinstance(other, OffsetSpans):
            return self.span_list() == other.span_list()
        if isinstance(other, dict):
            return dict(self.items()) == other
        if isinstance(other, (set, frozenset)):
            return set(self) == other
        return NotImplemented

    def __ne__(self, other):
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq

    __hash__ = None

    def __repr__(self):
        return f"OffsetSpans({self.span_list()!r})"


cdef class StateLock:
    """A plain lock (as ``threading.Lock``) that compiled code takes without a Python call.
    Waiting for it releases the GIL, so that its holder can go on and release it."""

    cdef PyThread_type_lock lock
    # Moved on each time Python code leaves the lock (``with``): what compiled code found in
    # the state under an earlier epoch may have changed since.
    cdef public unsigned long long epoch

    def __cinit__(self):
        self.lock = lock_new()

    def __dealloc__(self):
        if self.lock is not NULL:
            PyThread_free_lock(self.lock)

    cdef inline bint try_acquire(self) noexcept:
        return PyThread_acquire_lock(self.lock, NOWAIT_LOCK) == 1

    cdef void acquire_waiting(self) noexcept:
        lock_acquire(self.lock)

    cdef inline void release_held(self) noexcept:
        PyThread_release_lock(self.lock)

    def __enter__(self):
        self.acquire_waiting()
        return self

    def __exit__(self, *exc):
        self.epoch += 1
        PyThread_release_lock(self.lock)
        return False


cdef class AcknowledgementState:
    """Offsets by ``(topic, partition)``: ``_delivered`` (handed out by a poll, owed; an
    ``OffsetSpans``), ``_pending`` (offsets with their acknowledgement types, waiting to go
    out; an ``OffsetSpans``), ``_renewing`` (a set: a RENEW under way); ``_lock`` guards all
    three. A partition with nothing left is removed from its dict."""

    cdef public StateLock _lock
    cdef public dict _delivered
    cdef public dict _pending
    cdef public dict _renewing

    def __init__(self):
        self._lock = StateLock()
        self._delivered = {}
        self._pending = {}
        self._renewing = {}


cdef object DEFAULT = object()  # acknowledge()'s type when none is given: ACCEPT


cdef class RecordAcknowledger:
    """``acknowledge(record, type=ACCEPT)`` for one share consumer (its front ends bind their
    ``acknowledge`` to it). ``open``: explicit mode and not closed, kept by the consumer's
    core; ``kinds``: each acknowledgement type (and its number) to the int sent."""

    cdef AcknowledgementState state
    cdef PyTypeObject* record_type
    cdef object record_class  # keeps record_type alive
    cdef dict kinds
    cdef object renew
    cdef object accept
    cdef object fallback
    cdef public bint open
    # The partition acknowledged last (a poll's records come in runs of one partition): its
    # owed offsets and pending acknowledgements, found under the lock's epoch ``last_epoch``
    # and used again while the epoch stands (``last_owed`` None: nothing kept).
    cdef object last_topic
    cdef object last_partition
    cdef OffsetSpans last_owed
    cdef OffsetSpans last_pending
    cdef unsigned long long last_epoch

    def __init__(
        self,
        AcknowledgementState state,
        type record_type,
        dict kinds,
        object renew,
        object accept,
        object fallback,
        bint open,
    ):
        self.state = state
        self.record_class = record_type
        self.record_type = <PyTypeObject*>record_type
        self.kinds = kinds
        self.renew = renew
        self.accept = accept
        self.fallback = fallback
        self.open = open

    def acknowledge(self, record, type=DEFAULT):
        if type is DEFAULT:
            type = self.accept
        if self.open and Py_TYPE(record) is self.record_type:
            found = PyDict_GetItem(self.kinds, type)
            if (
                found is not NULL
                and <object>found != self.renew
                and self.state._lock.try_acquire()
            ):
                try:
                    if self.first_acknowledgement(record, <object>found):
                        return
                finally:
                    self.state._lock.release_held()
        self.fallback(record, type)

    cdef bint first_acknowledgement(self, object record, object kind) except -1:
        """A delivered record's (a ShareRecord: a tuple) first acknowledgement, as
        ``Acknowledgements.acknowledge`` does it (the lock is held); False when the record is
        not owed (the checked path then says why)."""
        cdef AcknowledgementState state = self.state
        cdef OffsetSpans owed, pending
        cdef int64_t offset
        topic = <object>PyTuple_GET_ITEM(record, 0)
        partition = <object>PyTuple_GET_ITEM(record, 1)
        if not as_offset(<object>PyTuple_GET_ITEM(record, 2), &offset):
            return False
        if (
            self.last_owed is not None
            and self.last_epoch == state._lock.epoch
            and topic is self.last_topic
            and partition is self.last_partition
        ):
            owed = self.last_owed
            pending = self.last_pending
            if not owed.discard_offset(offset):
                return False
        else:
            tp = (topic, partition)
            found = PyDict_GetItem(state._delivered, tp)
            if found is NULL or not (<OffsetSpans>found).discard_offset(offset):
                return False
            owed = <OffsetSpans>found
            found = PyDict_GetItem(state._pending, tp)
            if found is NULL:
                pending = OffsetSpans()
                PyDict_SetItem(state._pending, tp, pending)
            else:
                pending = <OffsetSpans>found
            self.last_topic = topic
            self.last_partition = partition
            self.last_owed = owed
            self.last_pending = pending
            self.last_epoch = state._lock.epoch
        if owed.count == 0:
            PyDict_DelItem(state._delivered, (topic, partition))
            self.last_owed = None
        pending.put(offset, kind)
        return True
