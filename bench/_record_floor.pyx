# cython: language_level=3, boundscheck=False, wraparound=False
"""The floor of "decode to records": the record objects alone, made from columns that are
already parsed, with no batch to read, no varint, no CRC and no bounds check.

Any decoder that returns these records (a tuple of offset int, timestamp int, key bytes,
value bytes and headers per record) makes at least these objects, and the benchmark frees
them too, so none can be faster than this. bench/test_codec_bench.py times it beside the real
decoders; report.py shows how far ahead of aiokafka even this floor is. Compiled at run time
(pyximport), so it never ships in the wheel.
"""

from cpython.bytes cimport PyBytes_FromStringAndSize
from cpython.list cimport PyList_New, PyList_SET_ITEM
from cpython.ref cimport Py_INCREF
from libc.stdint cimport int64_t


cdef extern from "Python.h":
    void PyObject_GC_UnTrack(void*)


def make_records(const unsigned char[::1] keys, Py_ssize_t key_size,
                 const unsigned char[::1] values, Py_ssize_t value_size,
                 const int64_t[::1] timestamps):
    """``(offset, timestamp_ms, key, value, ())`` for every record, as kcore's
    ``decode_records`` returns them, with its two savings (a timestamp equal to the last
    record's shares its int; records are not tracked by the garbage collector)."""
    cdef Py_ssize_t n = timestamps.shape[0], i
    cdef const char* k = <const char*>&keys[0]
    cdef const char* v = <const char*>&values[0]
    cdef int64_t last_ts = 0
    cdef list out = PyList_New(n)
    no_headers = ()
    ts = None
    for i in range(n):
        if ts is None or timestamps[i] != last_ts:
            last_ts = timestamps[i]
            ts = last_ts
        record = (i, ts, PyBytes_FromStringAndSize(k + i * key_size, key_size),
                  PyBytes_FromStringAndSize(v + i * value_size, value_size), no_headers)
        PyObject_GC_UnTrack(<void*>record)
        Py_INCREF(record)
        PyList_SET_ITEM(out, i, record)
    return out
