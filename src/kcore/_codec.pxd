# cython: language_level=3
# What other compiled modules of kcore cimport from the codec (kcore._codec): the batch
# builder's type and the key hash. Only declarations live here; the code is in
# src/kcore/_native/*.pxi. A class declared here has all its C fields and C methods declared
# here (its layout and method table are shared with the modules that cimport it), so a field
# added to RecordBatchBuilder or BatchBufferPool goes here, not in builder.pxi.

from cpython.object cimport PyObject
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint32_t


# A growable output buffer (buffers.pxi): ``size`` bytes written of ``cap``.
cdef struct OutBuf:
    uint8_t* data
    Py_ssize_t size
    Py_ssize_t cap


# One column append_many reads (builder.pxi: column_open, column_get).
cdef struct Column:
    int kind
    Py_ssize_t length
    PyObject** items          # COL_OBJECTS over a tuple (borrowed from `holder`)
    PyObject* seq             # COL_OBJECTS: the sequence itself (borrowed from `holder`)
    bint is_list
    const uint8_t* validity   # arrow validity bitmap, or NULL
    const int32_t* offsets32
    const int64_t* offsets64
    const uint8_t* data
    Py_ssize_t itemsize       # COL_FIXED
    Py_ssize_t array_offset   # arrow slice offset


cdef struct HeaderColumns:
    # append_many's headers given as a pyarrow list<struct<key, value>> array (Spark's
    # ``headers`` column): row i's headers are entries offsets[i]..offsets[i+1] of the two
    # child columns. (Headers given as Python sequences are normalised up front instead.)
    bint present
    const uint8_t* validity   # the list array's validity bitmap, or NULL
    const int32_t* offsets32
    const int64_t* offsets64
    Py_ssize_t array_offset
    Column keys
    Column values


cdef class BatchBufferPool:
    cdef list _free
    cdef readonly Py_ssize_t held_bytes
    cdef public Py_ssize_t limit
    cdef readonly Py_ssize_t min_buffer
    cdef readonly Py_ssize_t max_buffer
    cdef readonly unsigned long long reuses

    cdef object take(self, Py_ssize_t min_size, Py_ssize_t max_size)
    cdef bint give(self, PyObject* buf, Py_ssize_t allocated) noexcept


cdef class RecordBatchBuilder:
    # ``out`` writes straight into a bytes object (``_batch``, an owned reference) that grows
    # with _PyBytes_Resize, so build() of an uncompressed batch returns it without copying the
    # records. Once handed out it is never written again: the next write copies (see _own).
    # ``out.size`` is the batch's size so far, header included.
    cdef OutBuf out
    cdef PyObject* _batch
    cdef bint _handed_out
    # The producer's pool the buffer came from and goes back to (None: plain allocations),
    # and how many data bytes ``_batch``'s allocation holds: with a pool, build() shortens
    # the object's length but keeps the allocation whole for the next batch.
    cdef BatchBufferPool _pool
    cdef Py_ssize_t _alloc
    # build() may hand out a large batch with its slack (see there); not for the producer's
    # batches (a pool, or a max_capacity), whose memory is counted against buffer.memory.
    cdef bint _keep_slack
    # Why the builder takes no more writes: None, or "released" (its batch was delivered or
    # failed: memory back) or "out of memory" (a resize failed and freed the records).
    cdef object _ended
    cdef readonly int32_t record_count
    cdef int64_t base_timestamp
    cdef int64_t max_timestamp
    cdef readonly int64_t base_offset
    cdef readonly int64_t producer_id
    cdef readonly int16_t producer_epoch
    cdef readonly int32_t base_sequence
    cdef readonly bint transactional
    cdef readonly bint is_control
    cdef readonly int codec
    cdef int level
    cdef int partition_leader_epoch
    cdef int timestamp_type
    # An uncompressed batch's records are checksummed as they are written, a few KiB at a
    # time while their bytes are still in the writing thread's cache: ``records_crc`` is the
    # CRC32C of bytes BATCH_HEADER_SIZE..``crc_upto``. build() checksums only the rest and the
    # header and joins them (kcore_crc32c_join), instead of reading the whole batch again on
    # the producer's network thread. Records are never rewritten once written.
    cdef uint32_t records_crc
    cdef Py_ssize_t crc_upto

    cdef void own(self, object buf)
    cdef int reserve(self, Py_ssize_t extra, bint exact=*) except -1
    cdef void checksum_records(self) noexcept
    cdef int resize(self, Py_ssize_t size) except -1
    cdef void end(self, str why) noexcept
    cdef int raise_ended(self) except -1
    cdef Py_ssize_t body_size(self, Py_ssize_t klen, Py_ssize_t vlen, int64_t ts,
                              int32_t header_count, Py_ssize_t headers_size) noexcept
    # Appends one record in one C call; the producer's send path relies on what a successful
    # write does not do (the GIL rule in kcore/producer/_sendpath.pyx).
    cdef int write_record(self, const uint8_t* key, Py_ssize_t klen,
                          const uint8_t* value, Py_ssize_t vlen, int64_t ts,
                          object headers, Py_ssize_t headers_size,
                          int32_t header_count, HeaderColumns* hc,
                          Py_ssize_t h_start) except -1
    cdef int write_sized(self, Py_ssize_t body, const uint8_t* key, Py_ssize_t klen,
                         const uint8_t* value, Py_ssize_t vlen, int64_t ts,
                         object headers, Py_ssize_t headers_size,
                         int32_t header_count, HeaderColumns* hc,
                         Py_ssize_t h_start) except -1
    cdef int reserve_for(self, Column* kc, Column* vc, Py_ssize_t start,
                         Py_ssize_t stop, Py_ssize_t max_bytes) except -1


# murmur2 as the Java client's Utils.murmur2 (hashing.pxi).
cdef int32_t murmur2_c(const uint8_t* data, Py_ssize_t length) noexcept nogil
# The Java default partitioner's partition for a key: toPositive(murmur2(key)) % count
# (count > 0).
cdef int32_t key_partition(const uint8_t* key, Py_ssize_t length, int32_t count) noexcept nogil
