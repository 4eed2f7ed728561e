# Buffers: read-only views of bytes-like input without a typed memoryview per call, big-endian
# integer access, and a growable output buffer.

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


cdef struct OutBuf:
    uint8_t* data
    Py_ssize_t size
    Py_ssize_t cap


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


cdef class ColumnBuffer:
    """A C buffer that exposes the buffer protocol, so pyarrow and numpy wrap it without
    copying (and keep it alive as long as they use it)."""

    cdef OutBuf buf
    cdef Py_ssize_t exports

    def __dealloc__(self):
        free(self.buf.data)

    def __len__(self):
        return self.buf.size

    def __getbuffer__(self, Py_buffer* view, int flags):
        # A valid pointer even for an empty buffer (pyarrow dislikes NULL).
        if self.buf.data == NULL:
            out_reserve(&self.buf, 8)
        PyBuffer_FillInfo(view, self, self.buf.data, self.buf.size, 1, flags)
        self.exports += 1

    def __releasebuffer__(self, Py_buffer* view):
        self.exports -= 1
