# cython: language_level=3
"""The per-partition part of merging a Metadata answer (kcore.cluster.metadata.MetadataCache),
compiled: a 100,000-partition topic is 100,000 rows to build or keep, and in Python that loop
alone stalls the client's event loop for a tenth of a second.

The rules are MetadataCache's (see there); this module only makes them cheap:

* a partition whose answer equals what the cache holds (leader, epoch, replicas, ISR, offline
  replicas, error) keeps the cached row itself, so a refresh that changes nothing allocates
  nothing per partition;
* a partition answered with a leader epoch older than the cached one keeps the cached row (the
  answering broker was behind).

The compiled decoder's partitions (a StructArray) are read from their bytes (the raw fields,
through kcore/protocol/_decoders.pxd), with no partition object made; ``rows_unchanged``
compares them with the cached rows in place, so that an unchanged topic need not be built.
"""

from cpython.bytes cimport PyBytes_AS_STRING
from cpython.dict cimport PyDict_GetItem, PyDict_Next, PyDict_SetItem
from cpython.long cimport PyLong_FromLongLong
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from libc.stdint cimport int64_t, uint8_t

from kcore.protocol._decoders cimport MetadataResponsePartitionRaw, StructArray, raw_int32

from kcore.protocol.messages.metadata_response import MetadataResponsePartition


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    int T_OBJECT_EX
    int READONLY
    object PyType_GenericAlloc(PyTypeObject* type, Py_ssize_t nitems)
    object PyList_AsTuple(object lst)
    long long PyLong_AsLongLongAndOverflow(object o, int* overflow) except? -1
    long long PyLong_AsLongLong(object o) except? -1
    void PyObject_GC_UnTrack(void* op)

# Field positions of PartitionInfo (kcore.cluster.metadata), checked by partition_rows.
ROW_FIELDS = (
    "topic",
    "partition",
    "leader",
    "leader_epoch",
    "replicas",
    "isr",
    "offline_replicas",
    "error_code",
)
cdef enum:
    N_FIELDS = 8


# Rows and their tuples hold only ints and strings: immutable, they can be part of no reference
# cycle, so they are untracked by the cyclic collector at once (CPython untracks such plain
# tuples itself, but only when a collection gets to them, and never a NamedTuple). A cache of
# 100,000 tracked rows would be walked by every full collection.
# The answer's partitions are read straight from their __slots__ (the generated class's, checked
# at import like the compiled decoders do): seven attribute lookups per partition are most of
# the merge's time otherwise. Another class, or an unset slot, takes the getattr way.
cdef Py_ssize_t slot_offset(type cls, str name) except -1:
    descr = cls.__dict__.get(name)
    if type(descr).__name__ != "member_descriptor":
        raise ImportError(f"{cls.__name__}.{name} is not a __slots__ entry")
    cdef PyMemberDef* member = (<PyMemberDescrObject*>descr).d_member
    if member.type != T_OBJECT_EX or member.offset <= 0:
        raise ImportError(f"{cls.__name__}.{name} is not an object slot")
    return member.offset


cdef type PARTITION = MetadataResponsePartition
cdef Py_ssize_t O_INDEX = slot_offset(PARTITION, "partition_index")
cdef Py_ssize_t O_LEADER = slot_offset(PARTITION, "leader_id")
cdef Py_ssize_t O_EPOCH = slot_offset(PARTITION, "leader_epoch")
cdef Py_ssize_t O_ERROR = slot_offset(PARTITION, "error_code")
cdef Py_ssize_t O_REPLICAS = slot_offset(PARTITION, "replica_nodes")
cdef Py_ssize_t O_ISR = slot_offset(PARTITION, "isr_nodes")
cdef Py_ssize_t O_OFFLINE = slot_offset(PARTITION, "offline_replicas")


cdef inline PyObject* slot(object o, Py_ssize_t offset) noexcept:
    return (<PyObject**>((<char*><PyObject*>o) + offset))[0]


# Replica lists repeat: a topic's partitions share a few replica sets (six, with three brokers
# and three replicas). The tuple last made for each of INTERN_SLOTS hash slots is handed out
# again for equal values: fewer objects to make, and a 100,000-partition cache shares them.
cdef enum:
    INTERN_SLOTS = 256
    INTERN_MAX_LEN = 16
cdef list interned = [None] * INTERN_SLOTS
cdef int overflow_flag = 0


cdef inline bint int_value(object o, int64_t* out) noexcept:
    """``o`` as a C integer, if it is an int that fits."""
    cdef long long v
    if type(o) is not int:
        return False
    v = PyLong_AsLongLongAndOverflow(o, &overflow_flag)
    if overflow_flag:
        return False
    out[0] = v
    return True


cdef tuple new_ints_tuple(const int64_t* values, Py_ssize_t n):
    cdef tuple t = PyTuple_New(n)
    cdef Py_ssize_t i
    for i in range(n):
        put(t, i, PyLong_FromLongLong(values[i]))
    PyObject_GC_UnTrack(<void*>t)
    return t


cdef tuple ints_tuple(const int64_t* values, Py_ssize_t n):
    """A tuple of ``values[:n]``: the interned one when it holds the same values."""
    cdef Py_ssize_t i
    cdef int64_t v
    if n == 0:
        return ()
    if n > INTERN_MAX_LEN:
        return new_ints_tuple(values, n)
    cdef unsigned long long h = <unsigned long long>n
    for i in range(n):
        h = (h ^ <unsigned long long>values[i]) * 1099511628211ULL
    cdef Py_ssize_t slot = <Py_ssize_t>((h ^ (h >> 29)) % INTERN_SLOTS)
    found = interned[slot]
    cdef tuple t
    if found is not None:
        t = <tuple>found
        if PyTuple_GET_SIZE(t) == n:
            for i in range(n):
                if not int_value(<object>PyTuple_GET_ITEM(t, i), &v) or v != values[i]:
                    break
            else:
                return t
    t = new_ints_tuple(values, n)
    interned[slot] = t
    return t


cdef inline tuple as_tuple(object values):
    cdef tuple out
    if type(values) is tuple:
        out = <tuple>values
    elif type(values) is list:
        out = PyList_AsTuple(values)
    else:
        out = tuple(values)
    if all_atomic(out):
        PyObject_GC_UnTrack(<void*>out)
    return out


cdef tuple shared_tuple(object values):
    """``values`` (a decoded list of ints) as a tuple, interned when short."""
    cdef int64_t buf[INTERN_MAX_LEN]
    cdef Py_ssize_t n, i
    if type(values) is not list:
        return as_tuple(values)
    cdef list l = <list>values
    n = len(l)
    if n > INTERN_MAX_LEN:
        return as_tuple(values)
    for i in range(n):
        if not int_value(l[i], &buf[i]):
            return as_tuple(values)
    return ints_tuple(buf, n)


cdef tuple raw_tuple(const uint8_t* data, Py_ssize_t at, Py_ssize_t n):
    """The ``n`` big-endian int32 values at ``data + at`` as a tuple, interned when short."""
    cdef int64_t buf[INTERN_MAX_LEN]
    cdef Py_ssize_t i
    cdef tuple t
    if n > INTERN_MAX_LEN:
        t = PyTuple_New(n)
        for i in range(n):
            put(t, i, PyLong_FromLongLong(raw_int32(data + at + 4 * i)))
        PyObject_GC_UnTrack(<void*>t)
        return t
    for i in range(n):
        buf[i] = raw_int32(data + at + 4 * i)
    return ints_tuple(buf, n)


cdef inline bint all_atomic(tuple t):
    for value in t:
        if type(value) is not int:
            return False
    return True


cdef inline bint same_ints(object row_value, object values) except -1:
    """``row_value`` (a tuple) holds the same elements as ``values`` (a list, usually)."""
    cdef tuple t = <tuple>row_value
    cdef Py_ssize_t n = PyTuple_GET_SIZE(t), i
    if type(values) is not list:
        return t == tuple(values)
    cdef list l = <list>values
    if len(l) != n:
        return False
    for i in range(n):
        a = <object>PyTuple_GET_ITEM(t, i)
        b = l[i]
        if a is not b and a != b:
            return False
    return True


cdef inline bint same_raw_ints(object row_value, const uint8_t* data, Py_ssize_t at, Py_ssize_t n):
    """``row_value`` (a tuple) holds the ``n`` big-endian int32 values at ``data + at``."""
    cdef tuple t = <tuple>row_value
    cdef Py_ssize_t i
    cdef int64_t v
    if PyTuple_GET_SIZE(t) != n:
        return False
    for i in range(n):
        if not int_value(<object>PyTuple_GET_ITEM(t, i), &v) or v != raw_int32(data + at + 4 * i):
            return False
    return True


cdef inline void put(object row_obj, Py_ssize_t i, object value):
    Py_INCREF(value)
    PyTuple_SET_ITEM(row_obj, i, value)


cdef inline object new_row(
    type row, str topic, object index, object leader, object epoch, tuple replicas, tuple isr,
    tuple offline, object error
):
    """``row(topic, index, ...)`` without the Python-level ``__new__`` of a NamedTuple."""
    obj = PyType_GenericAlloc(<PyTypeObject*>row, N_FIELDS)
    put(obj, 0, topic)
    put(obj, 1, index)
    put(obj, 2, leader)
    put(obj, 3, epoch)
    put(obj, 4, replicas)
    put(obj, 5, isr)
    put(obj, 6, offline)
    put(obj, 7, error)
    if type(topic) is str and type(index) is int and type(leader) is int and (
        type(epoch) is int and type(error) is int
    ):
        PyObject_GC_UnTrack(<void*>obj)
    return obj


cdef object checked_row = None  # the last row class found to have ROW_FIELDS


cdef inline tuple cached_row(object cached, dict cached_dict, object index):
    """The cached row of partition ``index``, or None (also for a value not a row of ours)."""
    cdef PyObject* found
    cdef tuple before = None
    if cached_dict is not None:
        found = PyDict_GetItem(cached_dict, index)
        if found is not NULL:
            before = <tuple?>found
    elif cached is not None:
        before = cached.get(index)
    if before is not None and PyTuple_GET_SIZE(before) != N_FIELDS:
        return None
    return before


cdef bint object_rows(
    str topic, object partitions, object cached, type row, dict out, Py_ssize_t start,
    Py_ssize_t end
) except -1:
    """partition_rows for partition objects (a list, or any sequence)."""
    cdef dict cached_dict = cached if type(cached) is dict else None
    cdef bint unchanged = cached is not None
    cdef tuple before
    cdef Py_ssize_t i
    for i in range(start, end):
        p = partitions[i]
        if (
            type(p) is PARTITION
            and slot(p, O_INDEX) is not NULL
            and slot(p, O_LEADER) is not NULL
            and slot(p, O_EPOCH) is not NULL
            and slot(p, O_ERROR) is not NULL
            and slot(p, O_REPLICAS) is not NULL
            and slot(p, O_ISR) is not NULL
            and slot(p, O_OFFLINE) is not NULL
        ):
            index = <object>slot(p, O_INDEX)
            leader = <object>slot(p, O_LEADER)
            epoch = <object>slot(p, O_EPOCH)
            error = <object>slot(p, O_ERROR)
            replicas = <object>slot(p, O_REPLICAS)
            isr = <object>slot(p, O_ISR)
            offline = <object>slot(p, O_OFFLINE)
        else:
            index = p.partition_index
            leader = p.leader_id
            epoch = p.leader_epoch
            error = p.error_code
            replicas = p.replica_nodes
            isr = p.isr_nodes
            offline = p.offline_replicas
        before = cached_row(cached, cached_dict, index)
        if before is not None and (
            (0 <= epoch < before[3])  # a stale answer: keep what we know
            or (
                before[2] == leader
                and before[3] == epoch
                and before[7] == error
                and same_ints(before[4], replicas)
                and same_ints(before[5], isr)
                and same_ints(before[6], offline)
            )
        ):
            PyDict_SetItem(out, index, before)
            continue
        unchanged = False
        PyDict_SetItem(out, index, new_row(
            row, topic, index, leader, epoch, shared_tuple(replicas), shared_tuple(isr),
            shared_tuple(offline), error
        ))
    return unchanged


cdef inline bint same_int(object o, int64_t value) noexcept:
    cdef int64_t v
    return int_value(o, &v) and v == value


cdef bint keeps_row(
    tuple before, const MetadataResponsePartitionRaw* raw, const uint8_t* data
) except -1:
    """The rule for a partition read raw: the cached row ``before`` stays when the answer is
    stale (an older leader epoch: the broker was behind) or says what the row holds."""
    cdef int64_t epoch
    if not int_value(before[3], &epoch):
        return False
    if 0 <= raw.leader_epoch < epoch:
        return True
    return (
        epoch == raw.leader_epoch
        and same_int(before[2], raw.leader_id)
        and same_int(before[7], raw.error_code)
        and same_raw_ints(before[4], data, raw.replica_nodes_at, raw.replica_nodes_n)
        and same_raw_ints(before[5], data, raw.isr_nodes_at, raw.isr_nodes_n)
        and same_raw_ints(before[6], data, raw.offline_replicas_at, raw.offline_replicas_n)
    )


cdef bint raw_rows(
    str topic, StructArray partitions, object cached, type row, dict out, Py_ssize_t start,
    Py_ssize_t end
) except -1:
    """partition_rows for a StructArray of partitions: the same rules, read from its bytes; a
    partition whose answer equals the cached row costs no object but its index."""
    cdef dict cached_dict = cached if type(cached) is dict else None
    cdef bint unchanged = cached is not None
    cdef MetadataResponsePartitionRaw raw
    cdef const uint8_t* data = <const uint8_t*>PyBytes_AS_STRING(partitions.data)
    cdef tuple before
    cdef Py_ssize_t i
    for i in range(start, end):
        partitions.raw_at(i, &raw)
        index = PyLong_FromLongLong(raw.partition_index)
        before = cached_row(cached, cached_dict, index)
        if before is not None and keeps_row(before, &raw, data):
            PyDict_SetItem(out, index, before)
            continue
        unchanged = False
        PyDict_SetItem(out, index, new_row(
            row,
            topic,
            index,
            PyLong_FromLongLong(raw.leader_id),
            PyLong_FromLongLong(raw.leader_epoch),
            raw_tuple(data, raw.replica_nodes_at, raw.replica_nodes_n),
            raw_tuple(data, raw.isr_nodes_at, raw.isr_nodes_n),
            raw_tuple(data, raw.offline_replicas_at, raw.offline_replicas_n),
            PyLong_FromLongLong(raw.error_code),
        ))
    return unchanged


cdef Py_ssize_t raw_unchanged(
    StructArray partitions, dict cached, type row, Py_ssize_t start, Py_ssize_t end,
    Py_ssize_t cursor
) except -2:
    cdef MetadataResponsePartitionRaw raw
    cdef const uint8_t* data = <const uint8_t*>PyBytes_AS_STRING(partitions.data)
    cdef PyObject* key
    cdef PyObject* found
    cdef tuple before
    cdef Py_ssize_t i
    for i in range(start, end):
        partitions.raw_at(i, &raw)
        if not PyDict_Next(cached, &cursor, &key, &found):
            return -1
        if type(<object>found) is not row or PyTuple_GET_SIZE(<object>found) != N_FIELDS:
            return -1
        before = <tuple>found
        if not same_int(before[1], raw.partition_index) or not keeps_row(before, &raw, data):
            return -1
    return cursor


def rows_unchanged(
    object partitions, object cached, type row, Py_ssize_t start, Py_ssize_t end,
    Py_ssize_t cursor
):
    """Whether each of ``partitions[start:end]`` would keep, by partition_rows' rules, the
    cached row in the same position of ``cached`` (the topic's rows in the cache, by
    partition, in their order): the cursor to pass with the next ``start`` (0 with the
    first), or -1 at the first that would not or is another partition. Makes no object, so
    a refresh that changes nothing need not build the topic's rows at all. Compares the
    compiled decoder's StructArray against a dict only: for anything else -1 (the caller then
    builds the rows, and partition_rows tells whether they are the cached ones)."""
    if cursor < 0 or type(cached) is not dict:
        return -1
    start = max(0, start)
    end = min(end, len(partitions))
    if type(partitions) is StructArray and (<StructArray>partitions).item_type is PARTITION:
        return raw_unchanged(<StructArray>partitions, cached, row, start, end, cursor)
    return -1


def partition_rows(
    str topic, object partitions, object cached, type row, dict out, Py_ssize_t start,
    Py_ssize_t end
):
    """Put the rows of ``partitions[start:end]`` (the partitions of one topic of a Metadata
    answer: ``MetadataResponsePartition`` objects, or the compiled decoder's StructArray of
    them) into ``out``, by partition; return whether every one of them is the cached row.
    ``cached``: the rows the cache holds for the topic (a mapping, or None); ``row``: the row
    class (``PartitionInfo``)."""
    global checked_row
    if row is not checked_row:
        if not issubclass(row, tuple) or tuple(getattr(row, "_fields", ())) != ROW_FIELDS:
            raise TypeError(f"{row!r} is not a row class with the fields {ROW_FIELDS}")
        checked_row = row
    start = max(0, start)
    end = min(end, len(partitions))
    cdef bint unchanged
    if type(partitions) is StructArray and (<StructArray>partitions).item_type is PARTITION:
        unchanged = raw_rows(topic, <StructArray>partitions, cached, row, out, start, end)
    else:
        unchanged = object_rows(topic, partitions, cached, row, out, start, end)
    # The mapping too: it holds rows (untracked, see above) by int. A full collection would
    # otherwise walk it, touching every row (100,000 of them: tens of milliseconds, with the
    # GIL held). A dict tracks itself again when a container is put in it.
    PyObject_GC_UnTrack(<void*>out)
    return unchanged
