# Buffers: read-only views of bytes-like input without a typed memoryview per call, big-endian
# integer access, and a growable output buffer.

cdef extern from *:
    """
    #if defined(__linux__)
    #include <sys/mman.h>
    #endif
    /* Ask for transparent huge pages over the 2 MiB-aligned middle of a large buffer the
       caller is about to fill: one page fault per 2 MiB instead of one per 4 KiB (on a VM a
       fault costs ~0.5 us, which is most of the cost of writing a fresh 12 MB batch). Only a
       hint; where THP is off or the call fails nothing changes. */
    static void kcore_hint_huge_pages(void* start, Py_ssize_t size) {
    #if defined(__linux__) && defined(MADV_HUGEPAGE)
        const uintptr_t huge = (uintptr_t)2 << 20;
        uintptr_t lo = ((uintptr_t)start + huge - 1) & ~(huge - 1);
        uintptr_t hi = ((uintptr_t)start + (uintptr_t)size) & ~(huge - 1);
        if (size >= (Py_ssize_t)(4 << 20) && hi > lo) {
            (void)madvise((void*)lo, hi - lo, MADV_HUGEPAGE);
        }
    #else
        (void)start; (void)size;
    #endif
    }
    """
    void kcore_hint_huge_pages(void* start, Py_ssize_t size) nogil


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


cdef inline void view_close(ByteView* v, Py_buffer* pybuf) noexcept:
    if v.acquired:
        PyBuffer_Release(pybuf)
        v.acquired = False


cdef inline void put_i16(uint8_t* p, int16_t v) noexcept nogil:
    p[0] = <uint8_t>(<uint16_t>v >> 8)
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


cdef inline uint32_t get_le32(const uint8_t* p) noexcept nogil:
    """Little-endian (the codecs' frame headers, murmur2's words); the getters above are
    Kafka's big-endian."""
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))


# OutBuf, the growable output buffer, is declared in _codec.pxd.


cdef inline int out_reserve(OutBuf* b, Py_ssize_t extra) except -1:
    cdef Py_ssize_t need = b.size + extra
    cdef Py_ssize_t cap = b.cap if b.cap > 0 else 256
    cdef uint8_t* nd
    if need <= b.cap:
        return 0
    while cap < need:
        cap *= 2
    nd = <uint8_t*>realloc(b.data, cap)
    if nd == NULL:
        raise MemoryError()
    b.data = nd
    b.cap = cap
    return 0


cdef inline int out_write(OutBuf* b, const void* src, Py_ssize_t n) except -1:
    if n > 0:
        out_reserve(b, n)
        memcpy(b.data + b.size, src, n)
        b.size += n
    return 0


# A small pool of large blocks, so that a consumer decoding fetch after fetch reuses memory it
# has already touched instead of faulting in fresh pages every call (on some VMs a page fault
# costs microseconds: more than parsing the records in it). Only the GIL guards it: every
# caller holds the GIL.
DEF POOL_SLOTS = 32
DEF POOL_MIN_BLOCK = 65536
cdef uint8_t* pool_blocks[POOL_SLOTS]
cdef Py_ssize_t pool_caps[POOL_SLOTS]
cdef Py_ssize_t pool_bytes = 0
cdef Py_ssize_t pool_limit = 256 * 1024 * 1024


cdef uint8_t* pool_take(Py_ssize_t want, Py_ssize_t* cap):
    """The smallest pooled block of at least ``want`` bytes, or a new one (NULL: no memory)."""
    global pool_bytes
    cdef int i, best = -1
    cdef uint8_t* block
    for i in range(POOL_SLOTS):
        if pool_blocks[i] != NULL and pool_caps[i] >= want:
            if best < 0 or pool_caps[i] < pool_caps[best]:
                best = i
    if best >= 0:
        block = pool_blocks[best]
        cap[0] = pool_caps[best]
        pool_blocks[best] = NULL
        pool_bytes -= cap[0]
        return block
    cap[0] = want
    block = <uint8_t*>malloc(want if want > 0 else 1)
    if block != NULL:
        # A fresh block (a consumer's first calls, or a fetch larger than any before): its
        # pages are faulted in as the records land, thousands for a 10 MB poll_arrow.
        kcore_hint_huge_pages(block, want)
    return block


cdef void pool_give(uint8_t* block, Py_ssize_t cap):
    global pool_bytes
    cdef int i, smallest = -1
    if block == NULL:
        return
    if cap < POOL_MIN_BLOCK or cap > pool_limit:
        free(block)
        return
    for i in range(POOL_SLOTS):
        if pool_blocks[i] == NULL:
            smallest = i
            break
        if smallest < 0 or pool_caps[i] < pool_caps[smallest]:
            smallest = i
    if pool_blocks[smallest] != NULL:  # full: drop the smallest block if this one is larger
        if pool_caps[smallest] >= cap:
            free(block)
            return
        pool_bytes -= pool_caps[smallest]
        free(pool_blocks[smallest])
    pool_blocks[smallest] = block
    pool_caps[smallest] = cap
    pool_bytes += cap
    while pool_bytes > pool_limit:  # over budget: free the smallest blocks first
        smallest = -1
        for i in range(POOL_SLOTS):
            if pool_blocks[i] != NULL and (smallest < 0 or pool_caps[i] < pool_caps[smallest]):
                smallest = i
        pool_bytes -= pool_caps[smallest]
        free(pool_blocks[smallest])
        pool_blocks[smallest] = NULL


def set_buffer_pool_limit(Py_ssize_t limit_bytes):
    """How many bytes of freed decode buffers kcore keeps for reuse (default 256 MiB; 0: none)."""
    global pool_limit, pool_bytes
    cdef int i
    pool_limit = max(0, limit_bytes)
    for i in range(POOL_SLOTS):
        if pool_bytes <= pool_limit:
            break
        if pool_blocks[i] != NULL:
            pool_bytes -= pool_caps[i]
            free(pool_blocks[i])
            pool_blocks[i] = NULL


cdef inline int buf_presize(OutBuf* b, Py_ssize_t capacity) except -1:
    """Give an empty buffer at least ``capacity`` bytes, from the pool when it has a block."""
    cdef Py_ssize_t cap
    cdef uint8_t* block
    if capacity <= b.cap:
        return 0
    block = pool_take(capacity, &cap)
    if block == NULL:
        raise MemoryError()
    if b.data != NULL:
        memcpy(block, b.data, b.size)
        pool_give(b.data, b.cap)
    b.data = block
    b.cap = cap
    return 0


cdef class ColumnBuffer:
    """A C buffer that exposes the buffer protocol, so pyarrow and numpy wrap it without
    copying (and keep it alive as long as they use it). Its memory goes back to the pool."""

    cdef OutBuf buf
    cdef Py_ssize_t exports
    cdef bint writable

    def __dealloc__(self):
        pool_give(self.buf.data, self.buf.cap)

    def __len__(self):
        return self.buf.size

    def __getbuffer__(self, Py_buffer* view, int flags):
        # A valid pointer even for an empty buffer (pyarrow dislikes NULL).
        if self.buf.data == NULL:
            out_reserve(&self.buf, 8)
        PyBuffer_FillInfo(view, self, self.buf.data, self.buf.size, 0 if self.writable else 1,
                          flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1


cdef ColumnBuffer scratch_buffer(Py_ssize_t size):
    """A writable, uninitialised buffer of ``size`` bytes (from the pool): decompression
    writes into it without the zero-filling a bytearray would cost."""
    cdef ColumnBuffer b = ColumnBuffer.__new__(ColumnBuffer)
    buf_presize(&b.buf, size)
    b.buf.size = size
    b.writable = True
    return b


cdef class ReceiveBuffer:
    """A writable, uninitialised buffer for a socket to read one response into (``recv_into``):
    no zero-filling as a bytearray's. Its memory is malloc's and goes straight back to it once
    nothing refers to the buffer (the records decoded from it dropped), not to the decode pool:
    the C library sees large blocks come and go, and keeps enough of its heap mapped for the
    records' own objects (with the blocks held in the pool instead, it went on returning its
    heap top to the OS after every poll, and faulted it in again at the next)."""

    cdef uint8_t* data
    cdef Py_ssize_t size

    def __cinit__(self, Py_ssize_t size):
        if size < 0:
            raise ValueError("size must not be negative")
        self.data = <uint8_t*>malloc(size if size > 0 else 1)
        if self.data == NULL:
            raise MemoryError()
        self.size = size

    def __dealloc__(self):
        free(self.data)

    def __len__(self):
        return self.size

    def __getbuffer__(self, Py_buffer* view, int flags):
        PyBuffer_FillInfo(view, self, self.data, self.size, 0, flags)

    def __releasebuffer__(self, Py_buffer* view):
        pass


def receive_buffer(Py_ssize_t size):
    """A :class:`ReceiveBuffer` of ``size`` bytes."""
    return ReceiveBuffer(size)


cdef inline int buf_grow(OutBuf* b, Py_ssize_t extra) except -1:
    """``out_reserve`` for column buffers: grow (at least doubling) through the pool."""
    if b.size + extra <= b.cap:
        return 0
    return buf_presize(b, max(b.size + extra, 2 * b.cap))
