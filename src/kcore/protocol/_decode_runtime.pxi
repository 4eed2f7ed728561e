# What the generated compiled decoders (_decoders.pyx, written by tools/generate_protocol.py)
# call: bounds-checked big-endian reads, strings, arrays of fixed-width values, and the two
# C-API shortcuts that make them cheap (allocating an instance of a generated class and storing
# into one of its __slots__ by offset). Every reader raises the kcore error the Python reader in
# kcore.protocol.types raises for the same bytes (TruncatedDataError for input that ends early
# or a length past the end, InvalidLengthError for a null where none is allowed), so the two
# decoders fail alike. Rare paths (multi-byte varints, tagged-field sections) call the Python
# helpers themselves.

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject, PyTypeObject
from cpython.ref cimport Py_INCREF, Py_XDECREF
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.string cimport memcpy
from posix.unistd cimport usleep

import collections.abc as _abc
import struct as _struct_module
import uuid as _uuid_module

from kcore._codec import decode_uvarint as _decode_uvarint
from kcore.errors import InvalidLengthError, ProtocolError, TruncatedDataError
from kcore.protocol.types import (
    ZERO_UUID as _ZERO_UUID,
    add_unknown_tag as _add_unknown_tag,
    check_version as _check_version,
    read_unknown_tags as _read_unknown_tags,
    tag_size_mismatch as _tag_size_mismatch,
)

_UUID = _uuid_module.UUID


cdef extern from "Python.h":
    ctypedef struct PyMemberDef:
        int type
        Py_ssize_t offset
        int flags
    ctypedef struct PyMemberDescrObject:
        PyMemberDef* d_member
    object PyType_GenericAlloc(PyTypeObject* type, Py_ssize_t nitems)
    void PyObject_GC_UnTrack(void* op)
    object PyUnicode_DecodeUTF8(const char* s, Py_ssize_t size, const char* errors)
    object PyBytes_FromStringAndSize(const char* v, Py_ssize_t len)
    object PyLong_FromLong(long v)
    object PyLong_FromLongLong(long long v)
    object PyLong_FromUnsignedLong(unsigned long v)
    object PyLong_FromUnsignedLongLong(unsigned long long v)
    object PyFloat_FromDouble(double v)
    int T_OBJECT_EX
    int READONLY


# Reader, StructArray and the raw structs are declared in _decoders.pxd (other compiled
# modules read StructArray's elements through it).


cdef enum:
    GIL_PAUSE_US = 50  # long enough for a waiting thread to wake, on an idle machine


cdef inline int pause_point(Reader* r) except -1:
    """Called after each element of an array of structs. A decoder run on a worker thread
    (``pause_every``) pauses every that many elements so that another thread (an event loop's)
    gets the GIL: a decoder holding it throughout would stall that thread as long as it runs.
    ``pause`` (a callable) is how: it returns once the other thread has had its turn (it waits
    without the GIL). Without one the decoder sleeps a moment without the GIL, which a thread
    already waiting for it gets only if scheduled within that moment. Nothing another thread
    can reach is touched meanwhile: the objects being built are the decoder's alone, and the
    buffer is exported."""
    if r.pause_every:
        r.countdown -= 1
        if r.countdown <= 0:
            r.countdown = r.pause_every
            if r.pause is not NULL:
                (<object>r.pause)()
            else:
                with nogil:
                    # Not a bare release: the GIL would be taken back before a waiting thread
                    # woke (and CPython counts that as a handover, so it never forces one).
                    usleep(GIL_PAUSE_US)
    return 0


# -- instances of the generated classes ------------------------------------------------------

cdef Py_ssize_t slot_offset(type cls, str name) except -1:
    """Where ``cls`` keeps the ``__slots__`` entry ``name``: a writable object slot (checked, so
    that a class changed by hand fails at import rather than corrupting memory)."""
    descr = cls.__dict__.get(name)
    if type(descr).__name__ != "member_descriptor":
        raise ImportError(f"{cls.__name__}.{name} is not a __slots__ entry")
    cdef PyMemberDef* member = (<PyMemberDescrObject*>descr).d_member
    if member.type != T_OBJECT_EX or member.flags & READONLY or member.offset <= 0:
        raise ImportError(f"{cls.__name__}.{name} is not a writable object slot")
    return member.offset


# The collector and decoded responses. A decoded response is a tree of new objects (instances of
# the generated classes, lists, strings, ints): it holds no reference cycle, so the cyclic
# collector can never free anything in it, only spend time walking it. A 100,000-partition
# Metadata answer is 400,000 such containers; tracked, they trigger collections while they are
# built and make every collection until they are freed walk them (tenths of a second in all).
# So the containers a compiled decoder makes are left untracked (as CPython itself untracks
# tuples and dicts that hold no containers) and are freed by reference counting when the caller
# drops the response. The rule this relies on: decoded responses are read, not made part of a
# reference cycle (a caller that stores a response inside itself makes a cycle that is freed
# only with the process).
cdef inline object new_instance(type cls):
    # object.__new__(cls) without its argument checks: the generated classes take none.
    o = PyType_GenericAlloc(<PyTypeObject*>cls, 0)
    PyObject_GC_UnTrack(<void*>o)
    return o


cdef inline list new_list(Py_ssize_t n):
    cdef list out = PyList_New(n)
    PyObject_GC_UnTrack(<void*>out)
    return out


cdef inline void set_slot(object o, Py_ssize_t offset, object value):
    cdef PyObject** p = <PyObject**>((<char*><PyObject*>o) + offset)
    cdef PyObject* old = p[0]
    Py_INCREF(value)
    p[0] = <PyObject*>value
    Py_XDECREF(old)


# -- bounds and fixed-width values -----------------------------------------------------------

cdef int ends_early(Py_ssize_t pos, Py_ssize_t need, Py_ssize_t size) except -1:
    raise TruncatedDataError(
        f"input ends early (needs {need} bytes at {pos}, has {max(size - pos, 0)})", pos
    )


cdef inline int need(Reader* r, Py_ssize_t pos, Py_ssize_t n) except -1:
    if n > r.size - pos:
        ends_early(pos, n, r.size)
    return 0


cdef int past_end(Py_ssize_t pos, Py_ssize_t end) except -1:
    raise TruncatedDataError(f"a length of {end - pos} runs past the end of the input", pos)


cdef int array_too_long(Py_ssize_t n, Py_ssize_t pos) except -1:
    raise TruncatedDataError(f"an array of {n} elements cannot fit in the rest of the input", pos)


cdef int null_in(str what, Py_ssize_t pos) except -1:
    raise InvalidLengthError(what, pos)


cdef inline uint16_t be16(const uint8_t* p) noexcept nogil:
    return (<uint16_t>p[0] << 8) | p[1]


cdef inline uint32_t be32(const uint8_t* p) noexcept nogil:
    return <uint32_t>raw_int32(p)


cdef inline uint64_t be64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>be32(p) << 32) | be32(p + 4)


# Each of these reads one value whose bytes the caller has checked are there.
cdef inline object fixed_int8(const uint8_t* p):
    return PyLong_FromLong(<int8_t>p[0])


cdef inline object fixed_int16(const uint8_t* p):
    return PyLong_FromLong(<int16_t>be16(p))


cdef inline object fixed_uint16(const uint8_t* p):
    return PyLong_FromLong(be16(p))


cdef inline object fixed_int32(const uint8_t* p):
    return PyLong_FromLong(<int32_t>be32(p))


cdef inline object fixed_uint32(const uint8_t* p):
    return PyLong_FromUnsignedLong(be32(p))


cdef inline object fixed_int64(const uint8_t* p):
    return PyLong_FromLongLong(<int64_t>be64(p))


cdef inline object fixed_float64(const uint8_t* p):
    cdef uint64_t bits = be64(p)
    cdef double d
    memcpy(&d, &bits, 8)
    return PyFloat_FromDouble(d)


cdef inline object fixed_bool(const uint8_t* p):
    return True if p[0] else False


# The same values as C integers, for the raw readers (see StructArray).
cdef inline int64_t c_int8(const uint8_t* p) noexcept nogil:
    return <int8_t>p[0]


cdef inline int64_t c_int16(const uint8_t* p) noexcept nogil:
    return <int16_t>be16(p)


cdef inline int64_t c_uint16(const uint8_t* p) noexcept nogil:
    return be16(p)


cdef inline int64_t c_int32(const uint8_t* p) noexcept nogil:
    return raw_int32(p)


cdef inline int64_t c_uint32(const uint8_t* p) noexcept nogil:
    return be32(p)


cdef inline int64_t c_int64(const uint8_t* p) noexcept nogil:
    return <int64_t>be64(p)


# -- lengths ---------------------------------------------------------------------------------

cdef inline int64_t read_i16_length(Reader* r, Py_ssize_t* pos) except? -2:
    need(r, pos[0], 2)
    cdef int64_t n = <int16_t>be16(r.data + pos[0])
    pos[0] += 2
    return n


cdef inline int64_t read_i32_length(Reader* r, Py_ssize_t* pos) except? -2:
    need(r, pos[0], 4)
    cdef int64_t n = <int32_t>be32(r.data + pos[0])
    pos[0] += 4
    return n


cdef inline int64_t read_uvarint(Reader* r, Py_ssize_t* pos) except -1:
    """An unsigned varint (the one-byte case inline, longer ones by the codec's reader, whose
    errors are the Python decoder's too)."""
    if pos[0] >= r.size:
        ends_early(pos[0], 1, r.size)
    cdef uint8_t b = r.data[pos[0]]
    if b < 0x80:
        pos[0] += 1
        return b
    value, next_pos = _decode_uvarint(<object>r.obj, pos[0])
    pos[0] = next_pos
    return value


# -- strings, bytes, uuids -------------------------------------------------------------------

cdef inline object utf8(Reader* r, Py_ssize_t pos, int64_t n):
    if n > r.size - pos:
        past_end(pos, pos + n)
    return PyUnicode_DecodeUTF8(<const char*>r.data + pos, <Py_ssize_t>n, NULL)


cdef inline object read_string(Reader* r, Py_ssize_t* pos, bint nullable):
    cdef int64_t n = read_i16_length(r, pos)
    if n < 0:
        if nullable:
            return None
        null_in("null in a non-nullable string", pos[0] - 2)
    s = utf8(r, pos[0], n)
    pos[0] += n
    return s


cdef inline object read_compact_string(Reader* r, Py_ssize_t* pos, bint nullable):
    cdef int64_t n = read_uvarint(r, pos)
    if n == 0:
        if nullable:
            return None
        null_in("null in a non-nullable compact string", pos[0] - 1)
    s = utf8(r, pos[0], n - 1)
    pos[0] += n - 1
    return s


cdef inline object take_bytes(Reader* r, Py_ssize_t* pos, int64_t n):
    if n > r.size - pos[0]:
        past_end(pos[0], pos[0] + n)
    b = PyBytes_FromStringAndSize(<const char*>r.data + pos[0], <Py_ssize_t>n)
    pos[0] += n
    return b


cdef inline object read_bytes(Reader* r, Py_ssize_t* pos, bint nullable):
    cdef int64_t n = read_i32_length(r, pos)
    if n < 0:
        if nullable:
            return None
        null_in("null in a non-nullable bytes field", pos[0] - 4)
    return take_bytes(r, pos, n)


cdef inline object read_compact_bytes(Reader* r, Py_ssize_t* pos, bint nullable):
    cdef int64_t n = read_uvarint(r, pos)
    if n == 0:
        if nullable:
            return None
        null_in("null in a non-nullable bytes field", pos[0] - 1)
    return take_bytes(r, pos, n - 1)


# uuid.UUID(bytes=...) runs Python code (a topic id per topic of every Metadata answer); the
# same object is made here from its two slots, ``int`` and ``is_safe``, when the running
# Python's UUID has them (every CPython since 3.8), else by calling UUID.
cdef object _UUID_UNKNOWN = _uuid_module.SafeUUID.unknown
cdef Py_ssize_t _UUID_INT = -1
cdef Py_ssize_t _UUID_SAFE = -1
try:
    _UUID_INT = slot_offset(_UUID, "int")
    _UUID_SAFE = slot_offset(_UUID, "is_safe")
except ImportError:
    _UUID_INT = _UUID_SAFE = -1


cdef inline object read_uuid(Reader* r, Py_ssize_t* pos):
    if 16 > r.size - pos[0]:
        past_end(pos[0], pos[0] + 16)
    cdef const uint8_t* p = r.data + pos[0]
    pos[0] += 16
    if _UUID_INT < 0:
        return _UUID(bytes=PyBytes_FromStringAndSize(<const char*>p, 16))
    value = (PyLong_FromUnsignedLongLong(be64(p)) << 64) | PyLong_FromUnsignedLongLong(be64(p + 8))
    u = PyType_GenericAlloc(<PyTypeObject*>_UUID, 0)
    set_slot(u, _UUID_INT, value)
    set_slot(u, _UUID_SAFE, _UUID_UNKNOWN)
    return u


# -- arrays of fixed-width values ------------------------------------------------------------

ctypedef object (*FixedReader)(const uint8_t*)


cdef inline list read_fixed_array(
    Reader* r, Py_ssize_t* pos, int64_t n, Py_ssize_t size, FixedReader read
):
    if n > (r.size - pos[0]) // size:
        past_end(pos[0], pos[0] + n * size)
    cdef list out = new_list(<Py_ssize_t>n)
    cdef const uint8_t* p = r.data + pos[0]
    cdef Py_ssize_t i
    for i in range(<Py_ssize_t>n):
        v = read(p + i * size)
        Py_INCREF(v)
        PyList_SET_ITEM(out, i, v)
    pos[0] += n * size
    return out


cdef inline Py_ssize_t skip_fixed_array(
    Reader* r, Py_ssize_t* pos, int64_t n, Py_ssize_t size
) except -1:
    """read_fixed_array's checks without the list: where the ``n`` values start."""
    if n > (r.size - pos[0]) // size:
        past_end(pos[0], pos[0] + n * size)
    cdef Py_ssize_t start = pos[0]
    pos[0] += n * size
    return start


# -- running a decoder -----------------------------------------------------------------------

cdef inline int open_reader(
    Reader* r, Py_buffer* view, object buf, Py_ssize_t pos, Py_ssize_t pause_every, object pause
) except -1:
    if pos < 0:
        raise InvalidLengthError("negative position", pos)
    PyObject_GetBuffer(buf, view, PyBUF_SIMPLE)
    r.data = <const uint8_t*>view.buf
    r.size = view.len
    r.obj = <PyObject*>buf
    r.pause_every = max(pause_every, 0)
    r.countdown = r.pause_every
    r.pause = NULL if pause is None else <PyObject*>pause  # the caller's reference keeps it
    return 0


# -- arrays of structs decoded on demand -----------------------------------------------------

cdef inline object struct_array(
    Reader* r, Py_ssize_t* pos, int64_t n, int version, type item_type, ItemDecoder decode_item,
    RawReader read_raw
):
    """The ``n`` elements at ``pos`` as a StructArray: each is read once here, with every check
    its decoder makes (so bad bytes fail now, with the same error), but no object is made; the
    bytes they span are copied."""
    cdef Py_ssize_t start = pos[0], i
    cdef Py_ssize_t* offsets = <Py_ssize_t*>PyMem_Malloc(max(<Py_ssize_t>n, 1) * sizeof(Py_ssize_t))
    if offsets is NULL:
        raise MemoryError()
    cdef char scratch[RAW_SCRATCH]
    try:
        for i in range(<Py_ssize_t>n):
            offsets[i] = pos[0] - start
            read_raw(r, pos, version, scratch)
            pause_point(r)
    except BaseException:
        PyMem_Free(offsets)
        raise
    cdef StructArray out = StructArray.__new__(StructArray)
    out.data = PyBytes_FromStringAndSize(<const char*>r.data + start, pos[0] - start)
    out.n = <Py_ssize_t>n
    out.version = version
    out.offsets = offsets
    out.item_type = item_type
    out.decode_item = decode_item
    out.read_raw = read_raw
    return out


cdef inline void bytes_reader(Reader* r, bytes data) noexcept:
    """``r`` reading ``data`` (a StructArray's own bytes), never pausing."""
    r.data = <const uint8_t*>PyBytes_AS_STRING(data)
    r.size = PyBytes_GET_SIZE(data)
    r.obj = <PyObject*>data
    r.pause_every = 0
    r.countdown = 0
    r.pause = NULL


@cython.no_gc  # holds bytes and, once asked for, a list of untracked decoded objects: no cycle
@cython.final
cdef class StructArray:
    """An array of structs of a decoded message (a MetadataResponseTopic's partitions): a
    read-only sequence equal to the list the Python decoder makes, whose elements are made
    only when first asked for (all at once). Compiled code reads the fields without them
    (``raw_at``): merging a 100,000-partition answer into a cache that already holds it then
    allocates nothing per partition."""

    def __cinit__(self):
        self.offsets = NULL

    def __dealloc__(self):
        PyMem_Free(self.offsets)

    cdef int raw_at(self, Py_ssize_t i, void* out) except -1:
        if i < 0 or i >= self.n:
            raise IndexError(f"element {i} of {self.n}")
        cdef Reader r
        bytes_reader(&r, self.data)
        cdef Py_ssize_t pos = self.offsets[i]
        self.read_raw(&r, &pos, self.version, out)
        return 0

    cdef list materialized(self):
        if self.items is not None:
            return self.items
        cdef Reader r
        bytes_reader(&r, self.data)
        cdef list items = new_list(self.n)
        cdef Py_ssize_t i, pos
        for i in range(self.n):
            pos = self.offsets[i]
            item = self.decode_item(&r, &pos, self.version)
            Py_INCREF(item)
            PyList_SET_ITEM(items, i, item)
        self.items = items
        return items

    @property
    def element_type(self):
        return self.item_type

    @property
    def elements_made(self):
        """Whether the elements have been made as objects (they are, on first use)."""
        return self.items is not None

    def __len__(self):
        return self.n

    def __getitem__(self, index):
        return self.materialized()[index]

    def __iter__(self):
        return iter(self.materialized())

    def __reversed__(self):
        return reversed(self.materialized())

    def __contains__(self, value):
        return value in self.materialized()

    def index(self, value, *args):
        return self.materialized().index(value, *args)

    def count(self, value):
        return self.materialized().count(value)

    def __eq__(self, other):
        if isinstance(other, StructArray):
            return self.materialized() == (<StructArray>other).materialized()
        if isinstance(other, list):
            return self.materialized() == other
        return NotImplemented

    def __ne__(self, other):
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    __hash__ = None

    def __add__(self, other):
        return list(self) + list(other)

    def __radd__(self, other):
        return list(other) + list(self)

    def __repr__(self):
        return repr(self.materialized())

    def __reduce__(self):
        return (list, (self.materialized(),))


_abc.Sequence.register(StructArray)
