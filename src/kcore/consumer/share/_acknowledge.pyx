# cython: language_level=3
"""A share consumer's acknowledgement state (``Acknowledgements`` in acknowledgements.py is
its Python subclass, with the methods) and the per-record ``acknowledge`` of explicit mode,
compiled: every record goes through that call, and in Python (three frames and a lock) it cost
~0.5 us a record, more than decoding the record.

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
from cpython.set cimport PySet_Contains, PySet_Discard, PySet_GET_SIZE
from cpython.pythread cimport (
    NOWAIT_LOCK,
    WAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_free_lock,
    PyThread_release_lock,
    PyThread_type_lock,
)
from cpython.tuple cimport PyTuple_GET_ITEM


cdef class StateLock:
    """A plain lock (as ``threading.Lock``) that compiled code takes without a Python call.
    Waiting for it releases the GIL, so that its holder can go on and release it."""

    cdef PyThread_type_lock lock
    # Moved on each time Python code leaves the lock (``with``): what compiled code found in
    # the state under an earlier epoch may have changed since.
    cdef public unsigned long long epoch

    def __cinit__(self):
        self.lock = PyThread_allocate_lock()
        if self.lock is NULL:
            raise MemoryError("no lock")

    def __dealloc__(self):
        if self.lock is not NULL:
            PyThread_free_lock(self.lock)

    cdef inline bint try_acquire(self) noexcept:
        return PyThread_acquire_lock(self.lock, NOWAIT_LOCK) == 1

    cdef void acquire_waiting(self) noexcept:
        if PyThread_acquire_lock(self.lock, NOWAIT_LOCK) == 1:
            return
        with nogil:
            PyThread_acquire_lock(self.lock, WAIT_LOCK)

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
    """Offsets by ``(topic, partition)``: ``_delivered`` (handed out by a poll, owed),
    ``_pending`` (offset to acknowledgement type, waiting to go out), ``_renewing`` (a RENEW
    under way); ``_lock`` guards all three."""

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
    cdef object last_owed
    cdef object last_pending
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
        topic = <object>PyTuple_GET_ITEM(record, 0)
        partition = <object>PyTuple_GET_ITEM(record, 1)
        offset = <object>PyTuple_GET_ITEM(record, 2)
        if (
            self.last_owed is not None
            and self.last_epoch == state._lock.epoch
            and topic is self.last_topic
            and partition is self.last_partition
        ):
            owed = self.last_owed
            pending = self.last_pending
            if not PySet_Contains(owed, offset):
                return False
        else:
            tp = (topic, partition)
            found = PyDict_GetItem(state._delivered, tp)
            if found is NULL or not PySet_Contains(<object>found, offset):
                return False
            owed = <object>found
            found = PyDict_GetItem(state._pending, tp)
            if found is NULL:
                pending = {}
                PyDict_SetItem(state._pending, tp, pending)
            else:
                pending = <object>found
            self.last_topic = topic
            self.last_partition = partition
            self.last_owed = owed
            self.last_pending = pending
            self.last_epoch = state._lock.epoch
        PySet_Discard(owed, offset)
        if PySet_GET_SIZE(owed) == 0:
            PyDict_DelItem(state._delivered, (topic, partition))
            self.last_owed = None
        PyDict_SetItem(pending, offset, kind)
        return True
