# cython: language_level=3
"""kcore's compiled codec: every per-record and per-byte cost of the client lives here.

Varints, CRC32C (hardware where the CPU has it), murmur2, record batch v2 encode/decode, the
legacy magic 0/1 message sets, compression framing, and a columnar decode for Arrow. Inputs are
any object with the buffer protocol; ``bytes`` take a fast path that avoids acquiring a buffer.
The parts live in ``_native/`` (one job a file) and are included here as one module;
``_codec.pxd`` declares what other compiled modules cimport (the producer's send path,
kcore/producer/_sendpath.pyx, cimports the batch builder and the key hash).
"""

cimport cython
from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_FillInfo, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING
from cpython.bytes cimport (
    _PyBytes_Resize,
    PyBytes_AS_STRING,
    PyBytes_Check,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New, PyList_SET_ITEM
from cpython.long cimport PyLong_AsLongLong, PyLong_AsLongLongAndOverflow, PyLong_CheckExact
from cpython.memoryview cimport PyMemoryView_GET_BUFFER
from cpython.object cimport PyObject

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX
    void PyObject_GC_UnTrack(void* op)
    void PyObject_GC_Track(void* op)
    int PyObject_GC_IsTracked(object op)
from cpython.ref cimport Py_CLEAR, Py_INCREF, Py_XDECREF
from cpython.sequence cimport PySequence_Fast, PySequence_Fast_GET_SIZE, PySequence_Fast_ITEMS
from cpython.tuple cimport PyTuple_Check, PyTuple_GET_ITEM, PyTuple_GET_SIZE, PyTuple_New, PyTuple_SET_ITEM
from cpython.unicode cimport PyUnicode_Check, PyUnicode_DecodeUTF8

cdef extern from "Python.h":
    const char* PyUnicode_AsUTF8AndSize(object unicode, Py_ssize_t* size) except NULL
from libc.stdint cimport (
    INT64_MAX,
    INT64_MIN,
    int8_t,
    int16_t,
    int32_t,
    int64_t,
    uint8_t,
    uint16_t,
    uint32_t,
    uint64_t,
)
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcmp, memcpy

from kcore.errors import (
    ConfigError,
    CorruptRecordError,
    CrcMismatchError,
    DecompressionLimitError,
    InvalidLengthError,
    TruncatedDataError,
    UnsupportedCodecError,
    UnsupportedMagicError,
    VarintOverflowError,
)

include "_native/buffers.pxi"
include "_native/arena_cache.pxi"
include "_native/varint.pxi"
include "_native/hashing.pxi"
include "_native/compression.pxi"
include "_native/builder.pxi"
include "_native/decode.pxi"
include "_native/columnar.pxi"
include "_native/arrow_export.pxi"
