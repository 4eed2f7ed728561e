# CRC32C (hardware where the CPU has it), murmur2 and the Java default partitioner's key hash.

cdef extern from "crc32c.h" nogil:
    void kcore_crc32c_init(int force_sw)
    uint32_t kcore_crc32c(uint32_t crc, const uint8_t* p, size_t n)
    uint32_t kcore_crc32c_sw(uint32_t crc, const uint8_t* p, size_t n)
    uint32_t kcore_crc32c_join(uint32_t crc_a, uint32_t crc_b, uint64_t len_b)
    int kcore_crc_use_hw

cdef extern from "checksums.h" nogil:
    void kcore_crc32_init()
    uint32_t kcore_crc32_ieee(uint32_t crc, const uint8_t* p, size_t n)
    uint32_t kcore_xxh32(const uint8_t* p, size_t n, uint32_t seed)

kcore_crc32c_init(0)
kcore_crc32_init()

# Below this size the GIL round trip costs more than the checksum.
DEF GIL_RELEASE_BYTES = 65536


def crc32c(object data, uint32_t value=0):
    """CRC32C of ``data`` (any bytes-like object), continuing from ``value``."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef uint32_t out
    view_open(data, &v, &pybuf)
    try:
        if v.size >= GIL_RELEASE_BYTES:
            with nogil:
                out = kcore_crc32c(value, v.data, v.size)
        else:
            out = kcore_crc32c(value, v.data, v.size)
    finally:
        view_close(&v, &pybuf)
    return out


def crc32c_software(object data, uint32_t value=0):
    """CRC32C by the table-driven path only (to test it against the hardware path)."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef uint32_t out
    view_open(data, &v, &pybuf)
    try:
        out = kcore_crc32c_sw(value, v.data, v.size)
    finally:
        view_close(&v, &pybuf)
    return out


def crc32c_join(uint32_t crc_a, uint32_t crc_b, uint64_t length_b):
    """The CRC32C of A followed by B, from ``crc32c(A)``, ``crc32c(B)`` and B's length."""
    return kcore_crc32c_join(crc_a, crc_b, length_b)


def crc32c_implementation():
    """``"hardware"`` when the CPU's CRC32C instructions are used, else ``"software"``."""
    return "hardware" if kcore_crc_use_hw else "software"


def xxhash32(object data, uint32_t seed=0):
    """xxHash32 (used for LZ4 frame header checksums)."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef uint32_t out
    view_open(data, &v, &pybuf)
    try:
        out = kcore_xxh32(v.data, v.size, seed)
    finally:
        view_close(&v, &pybuf)
    return out


cdef int32_t murmur2_c(const uint8_t* data, Py_ssize_t length) noexcept nogil:
    # As org.apache.kafka.common.utils.Utils.murmur2: seed 0x9747b28c, little-endian words.
    cdef uint32_t m = 0x5bd1e995
    cdef uint32_t seed = 0x9747b28c
    cdef uint32_t h = seed ^ <uint32_t>length
    cdef Py_ssize_t length4 = length // 4
    cdef Py_ssize_t i, i4
    cdef uint32_t k
    for i in range(length4):
        i4 = i * 4
        k = get_le32(data + i4)
        k *= m
        k ^= k >> 24
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


cdef int32_t key_partition(const uint8_t* key, Py_ssize_t length, int32_t count) noexcept nogil:
    # As Java's default partitioner for a keyed record: toPositive(murmur2(key)) % count.
    return (murmur2_c(key, length) & 0x7FFFFFFF) % count


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
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef int32_t out
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    view_open(key, &v, &pybuf)
    try:
        out = key_partition(v.data, v.size, num_partitions)
    finally:
        view_close(&v, &pybuf)
    return out

