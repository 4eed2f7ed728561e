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
"""

from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_SET_ITEM


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


# Replica lists repeat: a topic's partitions share a few replica sets (six, with three brokers
# and three replicas). The tuple last made for each of INTERN_SLOTS hash slots is handed out
# again for an equal list: fewer objects to make, and a 100,000-partition cache shares them.
cdef enum:
    INTERN_SLOTS = 256
    INTERN_MAX_LEN = 16
cdef list interned = [None] * INTERN_SLOTS


cdef tuple shared_tuple(object values):
    if type(values) is not list:
        return as_tuple(values)
    cdef list l = <list>values
    cdef Py_ssize_t n = len(l), i
    if n == 0:
        return ()
    if n > INTERN_MAX_LEN:
        return as_tuple(values)
    cdef long long v
    cdef unsigned long long h = <unsigned long long>n
    for i in range(n):
        item = l[i]
        if type(item) is not int:
            return as_tuple(values)
        v = PyLong_AsLongLongAndOverflow(item, &overflow_flag)
        if overflow_flag:
            return as_tuple(values)
        h = (h ^ <unsigned long long>v) * 1099511628211ULL
    cdef Py_ssize_t slot = <Py_ssize_t>((h ^ (h >> 29)) % INTERN_SLOTS)
    found = interned[slot]
    cdef tuple t
    if found is not None:
        t = <tuple>found
        if PyTuple_GET_SIZE(t) == n:
            for i in range(n):
                if PyLong_AsLongLong(<object>PyTuple_GET_ITEM(t, i)) != PyLong_AsLongLong(l[i]):
                    break
            else:
                return t
    t = as_tuple(values)
    interned[slot] = t
    return t


cdef int overflow_flag = 0


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


cdef inline void put(object row_obj, Py_ssize_t i, object value):
    Py_INCREF(value)
    PyTuple_SET_ITEM(row_obj, i, value)


cdef inline object new_row(
    type row, str topic, object index, object leader, object epoch, object replicas,
    object isr, object offline, object error
):
    """``row(topic, index, ...)`` without the Python-level ``__new__`` of a NamedTuple."""
    obj = PyType_GenericAlloc(<PyTypeObject*>row, N_FIELDS)
    put(obj, 0, topic)
    put(obj, 1, index)
    put(obj, 2, leader)
    put(obj, 3, epoch)
    put(obj, 4, shared_tuple(replicas))
    put(obj, 5, shared_tuple(isr))
    put(obj, 6, shared_tuple(offline))
    put(obj, 7, error)
    if type(topic) is str and type(index) is int and type(leader) is int and (
        type(epoch) is int and type(error) is int
    ):
        PyObject_GC_UnTrack(<void*>obj)
    return obj


cdef object checked_row = None  # the last row class found to have ROW_FIELDS


def partition_rows(
    str topic, list partitions, object cached, type row, dict out, Py_ssize_t start, Py_ssize_t end
):
    """Put the rows of ``partitions[start:end]`` (``MetadataResponsePartition`` objects of one
    topic of a Metadata answer) into ``out``, by partition; return whether every one of them is
    the cached row. ``cached``: the rows the cache holds for the topic (a mapping, or None);
    ``row``: the row class (``PartitionInfo``)."""
    global checked_row
    if row is not checked_row:
        if not issubclass(row, tuple) or tuple(getattr(row, "_fields", ())) != ROW_FIELDS:
            raise TypeError(f"{row!r} is not a row class with the fields {ROW_FIELDS}")
        checked_row = row
    start = max(0, start)
    end = min(end, len(partitions))
    cdef dict cached_dict = cached if type(cached) is dict else None
    cdef bint unchanged = cached is not None
    cdef tuple before
    cdef PyObject* found
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
        before = None
        if cached_dict is not None:
            found = PyDict_GetItem(cached_dict, index)
            if found is not NULL:
                before = <tuple?>found
        elif cached is not None:
            before = cached.get(index)
        if before is not None and PyTuple_GET_SIZE(before) != N_FIELDS:
            before = None  # not a row of ours: build a new one
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
        PyDict_SetItem(out, index, new_row(row, topic, index, leader, epoch, replicas, isr,
                                           offline, error))
    # The mapping too: it holds rows (untracked, see above) by int. A full collection would
    # otherwise walk it, touching every row (100,000 of them: tens of milliseconds, with the
    # GIL held). A dict tracks itself again when a container is put in it.
    PyObject_GC_UnTrack(<void*>out)
    return unchanged
