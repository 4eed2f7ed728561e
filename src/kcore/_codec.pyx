# cython: language_level=3
"""kcore's compiled codec: every per-record and per-byte cost of the client lives here.

Varints (the protocol layer's compact lengths and the record format's fields), CRC32C, murmur2
and record batch v2 encode/decode. Inputs are any object with the buffer protocol; ``bytes`` take
a fast path that avoids acquiring a buffer.
"""

from cpython.buffer cimport PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytes cimport (
    PyBytes_AS_STRING,
    PyBytes_Check,
    PyBytes_FromStringAndSize,
    PyBytes_GET_SIZE,
)
from libc.stdint cimport int8_t, int16_t, int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from kcore.errors import (
    CrcMismatchError,
    InvalidLengthError,
    TruncatedDataError,
    UnsupportedCodecError,
    UnsupportedMagicError,
    VarintOverflowError,
)


# ---------------------------------------------------------------------------------------------
# Buffers: a read-only view of bytes-like input without a typed-memoryview per call.

cdef struct ByteView:
    const uint8_t* data
    Py_ssize_t size
    bint acquired


cdef inline int view_open(object obj, ByteView* v, Py_buffer* pybuf) except -1:
    if PyBytes_Check(obj):
        v.data = <const uint8_t*>PyBytes_AS_STRING(obj)
        v.size = PyBytes_GET_SIZE(obj)
        v.acquired = False
        return 0
    PyObject_GetBuffer(obj, pybuf, PyBUF_SIMPLE)
    v.data = <const uint8_t*>pybuf.buf
    v.size = pybuf.len
    v.acquired = True
    return 0


cdef inline void view_close(ByteView* v, Py_buffer* pybuf):
    if v.acquired:
        PyBuffer_Release(pybuf)
        v.acquired = False


# ---------------------------------------------------------------------------------------------
# Varints. Kafka's unsigned varint is at most 5 bytes (32 bits), its varlong at most 10.

cdef inline int read_uvarint32(const uint8_t* p, Py_ssize_t size, Py_ssize_t* pos,
                               uint32_t* out) except -1:
    cdef uint32_t value = 0
    cdef int shift = 0
    cdef uint8_t b
    cdef Py_ssize_t start = pos[0]
    while True:
        if pos[0] >= size:
            raise TruncatedDataError("varint runs past the end of the buffer", start)
        b = p[pos[0]]
        pos[0] += 1
        if shift == 28 and (b & 0xF0):
            raise VarintOverflowError("varint longer than 5 bytes or over 32 bits", start)
        value |= (<uint32_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            out[0] = value
            return 0
        shift += 7


cdef inline int read_uvarint64(const uint8_t* p, Py_ssize_t size, Py_ssize_t* pos,
                               uint64_t* out) except -1:
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef uint8_t b
    cdef Py_ssize_t start = pos[0]
    while True:
        if pos[0] >= size:
            raise TruncatedDataError("varlong runs past the end of the buffer", start)
        b = p[pos[0]]
        pos[0] += 1
        if shift == 63 and (b & 0xFE):
            raise VarintOverflowError("varlong longer than 10 bytes or over 64 bits", start)
        value |= (<uint64_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            out[0] = value
            return 0
        shift += 7


cdef inline int32_t unzigzag32(uint32_t v) noexcept nogil:
    return <int32_t>((v >> 1) ^ (-(<int32_t>(v & 1))))


cdef inline int64_t unzigzag64(uint64_t v) noexcept nogil:
    return <int64_t>((v >> 1) ^ (-(<int64_t>(v & 1))))


cdef inline uint32_t zigzag32(int32_t v) noexcept nogil:
    return (<uint32_t>v << 1) ^ <uint32_t>(v >> 31)


cdef inline uint64_t zigzag64(int64_t v) noexcept nogil:
    return (<uint64_t>v << 1) ^ <uint64_t>(v >> 63)


cdef inline Py_ssize_t put_uvarint64(uint8_t* out, uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 0
    while v >= 0x80:
        out[n] = <uint8_t>((v & 0x7F) | 0x80)
        v >>= 7
        n += 1
    out[n] = <uint8_t>v
    return n + 1


cdef inline Py_ssize_t uvarint_size(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


def decode_uvarint(object buf, Py_ssize_t pos=0):
    """Read an unsigned varint (at most 32 bits) at ``pos``; return ``(value, next_pos)``."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef uint32_t out
    if pos < 0:
        raise InvalidLengthError("negative position", pos)
    view_open(buf, &v, &pybuf)
    try:
        read_uvarint32(v.data, v.size, &pos, &out)
    finally:
        view_close(&v, &pybuf)
    return out, pos


def decode_varint(object buf, Py_ssize_t pos=0):
    """Read a zigzag varint (signed 32 bits) at ``pos``; return ``(value, next_pos)``."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef uint32_t out
    if pos < 0:
        raise InvalidLengthError("negative position", pos)
    view_open(buf, &v, &pybuf)
    try:
        read_uvarint32(v.data, v.size, &pos, &out)
    finally:
        view_close(&v, &pybuf)
    return unzigzag32(out), pos


def decode_varlong(object buf, Py_ssize_t pos=0):
    """Read a zigzag varlong (signed 64 bits) at ``pos``; return ``(value, next_pos)``."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef uint64_t out
    if pos < 0:
        raise InvalidLengthError("negative position", pos)
    view_open(buf, &v, &pybuf)
    try:
        read_uvarint64(v.data, v.size, &pos, &out)
    finally:
        view_close(&v, &pybuf)
    return unzigzag64(out), pos


def encode_uvarint(uint32_t value):
    """Encode an unsigned 32-bit varint."""
    cdef uint8_t tmp[10]
    cdef Py_ssize_t n = put_uvarint64(tmp, value)
    return PyBytes_FromStringAndSize(<char*>tmp, n)


def encode_varint(int32_t value):
    """Encode a zigzag (signed 32-bit) varint."""
    cdef uint8_t tmp[10]
    cdef Py_ssize_t n = put_uvarint64(tmp, zigzag32(value))
    return PyBytes_FromStringAndSize(<char*>tmp, n)


def encode_varlong(int64_t value):
    """Encode a zigzag (signed 64-bit) varlong."""
    cdef uint8_t tmp[10]
    cdef Py_ssize_t n = put_uvarint64(tmp, zigzag64(value))
    return PyBytes_FromStringAndSize(<char*>tmp, n)


# ---------------------------------------------------------------------------------------------
# CRC32C (Castagnoli), table-driven slicing-by-8.

cdef uint32_t CRC_TABLE[8][256]


cdef void crc_init_tables():
    cdef uint32_t poly = 0x82F63B78
    cdef uint32_t crc, i, k
    for i in range(256):
        crc = i
        for k in range(8):
            crc = (crc >> 1) ^ (poly if (crc & 1) else 0)
        CRC_TABLE[0][i] = crc
    for i in range(256):
        crc = CRC_TABLE[0][i]
        for k in range(1, 8):
            crc = CRC_TABLE[0][crc & 0xFF] ^ (crc >> 8)
            CRC_TABLE[k][i] = crc


crc_init_tables()


cdef uint32_t crc32c_update(uint32_t crc, const uint8_t* p, Py_ssize_t n) noexcept nogil:
    crc = ~crc
    cdef uint32_t lo, hi
    while n >= 8:
        lo = (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
              | (<uint32_t>p[3] << 24)) ^ crc
        hi = <uint32_t>p[4] | (<uint32_t>p[5] << 8) | (<uint32_t>p[6] << 16) | (<uint32_t>p[7] << 24)
        crc = (CRC_TABLE[7][lo & 0xFF] ^ CRC_TABLE[6][(lo >> 8) & 0xFF]
               ^ CRC_TABLE[5][(lo >> 16) & 0xFF] ^ CRC_TABLE[4][lo >> 24]
               ^ CRC_TABLE[3][hi & 0xFF] ^ CRC_TABLE[2][(hi >> 8) & 0xFF]
               ^ CRC_TABLE[1][(hi >> 16) & 0xFF] ^ CRC_TABLE[0][hi >> 24])
        p += 8
        n -= 8
    while n > 0:
        crc = CRC_TABLE[0][(crc ^ p[0]) & 0xFF] ^ (crc >> 8)
        p += 1
        n -= 1
    return ~crc


def crc32c(object data, uint32_t value=0):
    """CRC32C of ``data`` (any bytes-like object), continuing from ``value``."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef uint32_t out
    view_open(data, &v, &pybuf)
    try:
        if v.size >= 65536:
            with nogil:
                out = crc32c_update(value, v.data, v.size)
        else:
            out = crc32c_update(value, v.data, v.size)
    finally:
        view_close(&v, &pybuf)
    return out


# ---------------------------------------------------------------------------------------------
# murmur2, exactly as org.apache.kafka.common.utils.Utils.murmur2 (seed 0x9747b28c).

cdef int32_t murmur2_c(const uint8_t* data, Py_ssize_t length) noexcept nogil:
    cdef uint32_t m = 0x5bd1e995
    cdef int r = 24
    cdef uint32_t seed = 0x9747b28c
    cdef uint32_t h = seed ^ <uint32_t>length
    cdef Py_ssize_t length4 = length // 4
    cdef Py_ssize_t i, i4
    cdef uint32_t k
    for i in range(length4):
        i4 = i * 4
        k = (<uint32_t>data[i4] | (<uint32_t>data[i4 + 1] << 8) | (<uint32_t>data[i4 + 2] << 16)
             | (<uint32_t>data[i4 + 3] << 24))
        k *= m
        k ^= k >> r
        k *= m
        h *= m
        h ^= k
    cdef Py_ssize_t rest = length % 4
    cdef Py_ssize_t tail = length & ~(<Py_ssize_t>3)
    if rest == 3:
        h ^= (<uint32_t>data[tail + 2]) << 16
    if rest >= 2:
        h ^= (<uint32_t>data[tail + 1]) << 8
    if rest >= 1:
        h ^= <uint32_t>data[tail]
        h *= m
    h ^= h >> 13
    h *= m
    h ^= h >> 15
    return <int32_t>h


def murmur2(object data):
    """murmur2 of ``data`` as a signed 32-bit int, equal to the Java client's ``Utils.murmur2``."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef int32_t out
    view_open(data, &v, &pybuf)
    try:
        out = murmur2_c(v.data, v.size)
    finally:
        view_close(&v, &pybuf)
    return out


def partition_for_key(object key, int32_t num_partitions):
    """The Java default partitioner's choice for a keyed record: toPositive(murmur2(key)) % n."""
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    return (murmur2(key) & 0x7FFFFFFF) % num_partitions


# ---------------------------------------------------------------------------------------------
# Record batch v2 (magic 2).

DEF BATCH_HEADER_SIZE = 61
DEF CRC_OFFSET = 17
DEF ATTRIBUTES_OFFSET = 21

cdef inline void put_i16(uint8_t* p, int16_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 8)
    p[1] = <uint8_t>v


cdef inline void put_i32(uint8_t* p, int32_t v) noexcept nogil:
    cdef uint32_t u = <uint32_t>v
    p[0] = <uint8_t>(u >> 24)
    p[1] = <uint8_t>(u >> 16)
    p[2] = <uint8_t>(u >> 8)
    p[3] = <uint8_t>u


cdef inline void put_i64(uint8_t* p, int64_t v) noexcept nogil:
    put_i32(p, <int32_t>(<uint64_t>v >> 32))
    put_i32(p + 4, <int32_t><uint32_t><uint64_t>v)


cdef inline int16_t get_i16(const uint8_t* p) noexcept nogil:
    return <int16_t>((<uint16_t>p[0] << 8) | p[1])


cdef inline int32_t get_i32(const uint8_t* p) noexcept nogil:
    return <int32_t>((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8)
                     | <uint32_t>p[3])


cdef inline int64_t get_i64(const uint8_t* p) noexcept nogil:
    return <int64_t>((<uint64_t><uint32_t>get_i32(p) << 32) | <uint64_t><uint32_t>get_i32(p + 4))


from libc.stdint cimport uint16_t

COMPRESSION_CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
_CODEC_NAMES = {v: k for k, v in COMPRESSION_CODECS.items()}


cdef class RecordBatchBuilder:
    """Accumulates records into one v2 record batch. ``append`` copies the key, value and
    headers straight into a C buffer: no Python object is made per record."""

    cdef uint8_t* buf
    cdef Py_ssize_t size
    cdef Py_ssize_t capacity
    cdef readonly int32_t record_count
    cdef int64_t base_timestamp
    cdef int64_t max_timestamp
    cdef readonly int64_t base_offset
    cdef readonly int64_t producer_id
    cdef readonly int16_t producer_epoch
    cdef readonly int32_t base_sequence
    cdef readonly bint transactional
    cdef readonly int codec

    def __cinit__(self, str compression="none", *, int64_t base_offset=0,
                  int64_t producer_id=-1, int producer_epoch=-1, int32_t base_sequence=-1,
                  bint transactional=False):
        if compression not in COMPRESSION_CODECS:
            raise ValueError(f"unknown compression {compression!r}; one of {list(COMPRESSION_CODECS)}")
        self.codec = COMPRESSION_CODECS[compression]
        if self.codec != 0:
            raise NotImplementedError("compressed batches are not implemented yet")
        self.capacity = 4096
        self.buf = <uint8_t*>malloc(self.capacity)
        if self.buf == NULL:
            raise MemoryError()
        self.size = BATCH_HEADER_SIZE
        self.record_count = 0
        self.base_offset = base_offset
        self.producer_id = producer_id
        self.producer_epoch = <int16_t>producer_epoch
        self.base_sequence = base_sequence
        self.transactional = transactional
        self.base_timestamp = 0
        self.max_timestamp = -1

    def __dealloc__(self):
        free(self.buf)

    cdef int reserve(self, Py_ssize_t extra) except -1:
        cdef Py_ssize_t need = self.size + extra
        cdef Py_ssize_t cap = self.capacity
        cdef uint8_t* nb
        if need <= cap:
            return 0
        while cap < need:
            cap *= 2
        nb = <uint8_t*>realloc(self.buf, cap)
        if nb == NULL:
            raise MemoryError()
        self.buf = nb
        self.capacity = cap
        return 0

    def __len__(self):
        return self.record_count

    @property
    def size_in_bytes(self):
        return self.size

    def append(self, object key, object value, int64_t timestamp_ms, object headers=None):
        """Add one record. ``key`` and ``value`` are bytes-like or None (None and b"" differ);
        ``headers`` a sequence of ``(str | bytes, bytes | None)`` pairs."""
        cdef ByteView kv, vv, hk, hv
        cdef Py_buffer kb, vb, hkb, hvb
        cdef Py_ssize_t klen = -1, vlen = -1, body, hcount = 0
        cdef Py_ssize_t hsize = 0
        cdef int64_t ts_delta
        cdef int32_t offset_delta = self.record_count
        cdef uint8_t* p
        cdef list encoded_headers = None
        kv.acquired = False
        vv.acquired = False
        if self.record_count == 0:
            self.base_timestamp = timestamp_ms
        ts_delta = timestamp_ms - self.base_timestamp
        if headers:
            encoded_headers = []
            for hkey, hval in headers:
                if isinstance(hkey, str):
                    hkey = (<str>hkey).encode("utf-8")
                encoded_headers.append((hkey, hval))
                hcount += 1
        try:
            if key is not None:
                view_open(key, &kv, &kb)
                klen = kv.size
            if value is not None:
                view_open(value, &vv, &vb)
                vlen = vv.size
            # record body size (everything after the length varint)
            body = 1 + uvarint_size(zigzag64(ts_delta)) + uvarint_size(zigzag32(offset_delta))
            body += uvarint_size(zigzag32(<int32_t>klen)) + (klen if klen > 0 else 0)
            body += uvarint_size(zigzag32(<int32_t>vlen)) + (vlen if vlen > 0 else 0)
            body += uvarint_size(zigzag32(<int32_t>hcount))
            if encoded_headers is not None:
                for hkey, hval in encoded_headers:
                    hsize = len(hkey)
                    body += uvarint_size(zigzag32(<int32_t>hsize)) + hsize
                    if hval is None:
                        body += 1
                    else:
                        hsize = len(hval)
                        body += uvarint_size(zigzag32(<int32_t>hsize)) + hsize
            self.reserve(body + 5)
            p = self.buf + self.size
            p += put_uvarint64(p, zigzag32(<int32_t>body))
            p[0] = 0  # record attributes: unused
            p += 1
            p += put_uvarint64(p, zigzag64(ts_delta))
            p += put_uvarint64(p, zigzag32(offset_delta))
            p += put_uvarint64(p, zigzag32(<int32_t>klen))
            if klen > 0:
                memcpy(p, kv.data, klen)
                p += klen
            p += put_uvarint64(p, zigzag32(<int32_t>vlen))
            if vlen > 0:
                memcpy(p, vv.data, vlen)
                p += vlen
            p += put_uvarint64(p, zigzag32(<int32_t>hcount))
            if encoded_headers is not None:
                for hkey, hval in encoded_headers:
                    view_open(hkey, &hk, &hkb)
                    try:
                        p += put_uvarint64(p, zigzag32(<int32_t>hk.size))
                        memcpy(p, hk.data, hk.size)
                        p += hk.size
                    finally:
                        view_close(&hk, &hkb)
                    if hval is None:
                        p += put_uvarint64(p, zigzag32(-1))
                    else:
                        view_open(hval, &hv, &hvb)
                        try:
                            p += put_uvarint64(p, zigzag32(<int32_t>hv.size))
                            memcpy(p, hv.data, hv.size)
                            p += hv.size
                        finally:
                            view_close(&hv, &hvb)
            self.size = p - self.buf
        finally:
            view_close(&kv, &kb)
            view_close(&vv, &vb)
        self.record_count += 1
        if timestamp_ms > self.max_timestamp:
            self.max_timestamp = timestamp_ms

    def build(self):
        """Finish the batch: fill in the header and CRC, return its bytes."""
        cdef uint8_t* p = self.buf
        cdef int16_t attributes = <int16_t>self.codec
        if self.transactional:
            attributes |= 0x10
        put_i64(p, self.base_offset)
        put_i32(p + 8, <int32_t>(self.size - 12))
        put_i32(p + 12, -1)  # partition leader epoch: set by the broker
        p[16] = 2
        put_i16(p + 21, attributes)
        put_i32(p + 23, self.record_count - 1 if self.record_count > 0 else 0)
        put_i64(p + 27, self.base_timestamp)
        put_i64(p + 35, self.max_timestamp if self.record_count > 0 else -1)
        put_i64(p + 43, self.producer_id)
        put_i16(p + 51, self.producer_epoch)
        put_i32(p + 53, self.base_sequence)
        put_i32(p + 57, self.record_count)
        put_i32(p + CRC_OFFSET, <int32_t>crc32c_update(0, p + ATTRIBUTES_OFFSET,
                                                         self.size - ATTRIBUTES_OFFSET))
        return PyBytes_FromStringAndSize(<char*>self.buf, self.size)


cdef class RecordBatch:
    """One decoded v2 batch header; ``records()`` decodes its records."""

    cdef readonly int64_t base_offset
    cdef readonly int32_t partition_leader_epoch
    cdef readonly int8_t magic
    cdef readonly uint32_t crc
    cdef readonly int16_t attributes
    cdef readonly int32_t last_offset_delta
    cdef readonly int64_t base_timestamp
    cdef readonly int64_t max_timestamp
    cdef readonly int64_t producer_id
    cdef readonly int16_t producer_epoch
    cdef readonly int32_t base_sequence
    cdef readonly int32_t record_count
    cdef object _payload  # bytes of the records section
    cdef Py_ssize_t _position  # where the batch starts in the input

    @property
    def compression(self):
        return _CODEC_NAMES.get(self.attributes & 0x07, "unknown")

    @property
    def timestamp_type(self):
        """0 for CreateTime, 1 for LogAppendTime."""
        return (self.attributes >> 3) & 1

    @property
    def is_transactional(self):
        return bool(self.attributes & 0x10)

    @property
    def is_control(self):
        return bool(self.attributes & 0x20)

    @property
    def last_offset(self):
        return self.base_offset + self.last_offset_delta

    def records(self):
        """The records as ``(offset, timestamp_ms, key, value, headers)`` tuples."""
        cdef ByteView v
        cdef Py_buffer pybuf
        cdef Py_ssize_t pos = 0, end, klen, vlen, hlen
        cdef uint32_t u32
        cdef uint64_t u64
        cdef int32_t body, offset_delta, hcount, i, j
        cdef int64_t ts_delta, ts
        cdef list out = []
        cdef list headers
        cdef Py_ssize_t base = self._position + BATCH_HEADER_SIZE
        if self.attributes & 0x07:
            raise UnsupportedCodecError(
                f"compression codec {self.attributes & 0x07} is not implemented yet", self._position)
        view_open(self._payload, &v, &pybuf)
        try:
            for i in range(self.record_count):
                read_uvarint32(v.data, v.size, &pos, &u32)
                body = unzigzag32(u32)
                if body < 0 or pos + body > v.size:
                    raise TruncatedDataError("record length points past the end of the batch",
                                             base + pos)
                end = pos + body
                pos += 1  # attributes
                read_uvarint64(v.data, end, &pos, &u64)
                ts_delta = unzigzag64(u64)
                read_uvarint32(v.data, end, &pos, &u32)
                offset_delta = unzigzag32(u32)
                read_uvarint32(v.data, end, &pos, &u32)
                klen = unzigzag32(u32)
                if klen < -1 or pos + klen > end:
                    raise InvalidLengthError("record key length is out of range", base + pos)
                key = None if klen < 0 else PyBytes_FromStringAndSize(<char*>v.data + pos, klen)
                if klen > 0:
                    pos += klen
                read_uvarint32(v.data, end, &pos, &u32)
                vlen = unzigzag32(u32)
                if vlen < -1 or pos + vlen > end:
                    raise InvalidLengthError("record value length is out of range", base + pos)
                value = None if vlen < 0 else PyBytes_FromStringAndSize(<char*>v.data + pos, vlen)
                if vlen > 0:
                    pos += vlen
                read_uvarint32(v.data, end, &pos, &u32)
                hcount = unzigzag32(u32)
                if hcount < 0:
                    raise InvalidLengthError("negative header count", base + pos)
                headers = []
                for j in range(hcount):
                    read_uvarint32(v.data, end, &pos, &u32)
                    hlen = unzigzag32(u32)
                    if hlen < 0 or pos + hlen > end:
                        raise InvalidLengthError("header key length is out of range", base + pos)
                    hkey = PyBytes_FromStringAndSize(<char*>v.data + pos, hlen).decode("utf-8")
                    pos += hlen
                    read_uvarint32(v.data, end, &pos, &u32)
                    hlen = unzigzag32(u32)
                    if hlen < -1 or pos + hlen > end:
                        raise InvalidLengthError("header value length is out of range", base + pos)
                    if hlen < 0:
                        hval = None
                    else:
                        hval = PyBytes_FromStringAndSize(<char*>v.data + pos, hlen)
                        pos += hlen
                    headers.append((hkey, hval))
                if self.attributes & 0x08:  # LogAppendTime: every record has max_timestamp
                    ts = self.max_timestamp
                else:
                    ts = self.base_timestamp + ts_delta
                out.append((self.base_offset + offset_delta, ts, key, value, headers))
                pos = end
        finally:
            view_close(&v, &pybuf)
        return out


def decode_batches(object buf, bint allow_partial=False):
    """Decode every v2 batch in ``buf``. A trailing partial batch (as Fetch responses may end
    with) is ignored when ``allow_partial`` is true and raises otherwise."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef Py_ssize_t pos = 0
    cdef int32_t batch_length
    cdef const uint8_t* p
    cdef RecordBatch batch
    cdef uint32_t computed
    cdef list out = []
    view_open(buf, &v, &pybuf)
    try:
        while pos < v.size:
            if v.size - pos < 17:
                if allow_partial:
                    break
                raise TruncatedDataError("record batch header is truncated", pos)
            p = v.data + pos
            batch_length = get_i32(p + 8)
            if batch_length < BATCH_HEADER_SIZE - 12:
                raise InvalidLengthError(f"record batch length {batch_length} is too small", pos)
            if p[16] != 2:
                raise UnsupportedMagicError(f"record batch magic {p[16]} is not supported", pos)
            if batch_length > v.size - pos - 12:
                if allow_partial:
                    break
                raise TruncatedDataError("record batch length points past the end", pos)
            batch = RecordBatch.__new__(RecordBatch)
            batch.base_offset = get_i64(p)
            batch.partition_leader_epoch = get_i32(p + 12)
            batch.magic = <int8_t>p[16]
            batch.crc = <uint32_t>get_i32(p + CRC_OFFSET)
            computed = crc32c_update(0, p + ATTRIBUTES_OFFSET, batch_length + 12 - ATTRIBUTES_OFFSET)
            if computed != batch.crc:
                raise CrcMismatchError(
                    f"record batch CRC is {batch.crc:#010x} but its bytes give {computed:#010x}", pos)
            batch.attributes = get_i16(p + 21)
            batch.last_offset_delta = get_i32(p + 23)
            batch.base_timestamp = get_i64(p + 27)
            batch.max_timestamp = get_i64(p + 35)
            batch.producer_id = get_i64(p + 43)
            batch.producer_epoch = get_i16(p + 51)
            batch.base_sequence = get_i32(p + 53)
            batch.record_count = get_i32(p + 57)
            if batch.record_count < 0:
                raise InvalidLengthError("negative record count", pos + 57)
            batch._position = pos
            batch._payload = PyBytes_FromStringAndSize(<char*>p + BATCH_HEADER_SIZE,
                                                       batch_length + 12 - BATCH_HEADER_SIZE)
            out.append(batch)
            pos += batch_length + 12
    finally:
        view_close(&v, &pybuf)
    return out
