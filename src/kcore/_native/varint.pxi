# Varints. Kafka's unsigned varint is at most 5 bytes (32 bits), its varlong at most 10; the
# record format uses their zigzag (signed) forms.

cdef int read_uvarint32(const uint8_t* p, Py_ssize_t size, Py_ssize_t* pos,
                        uint32_t* out, Py_ssize_t base=0) except -1:
    cdef uint32_t value = 0
    cdef int shift = 0
    cdef uint8_t b
    cdef Py_ssize_t start = pos[0]
    while True:
        if pos[0] >= size:
            raise TruncatedDataError("varint runs past the end of the buffer", base + start)
        b = p[pos[0]]
        pos[0] += 1
        if shift == 28 and (b & 0xF0):
            raise VarintOverflowError("varint longer than 5 bytes or over 32 bits", base + start)
        value |= (<uint32_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            out[0] = value
            return 0
        shift += 7


cdef int read_uvarint64(const uint8_t* p, Py_ssize_t size, Py_ssize_t* pos,
                        uint64_t* out, Py_ssize_t base=0) except -1:
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef uint8_t b
    cdef Py_ssize_t start = pos[0]
    while True:
        if pos[0] >= size:
            raise TruncatedDataError("varlong runs past the end of the buffer", base + start)
        b = p[pos[0]]
        pos[0] += 1
        if shift == 63 and (b & 0xFE):
            raise VarintOverflowError("varlong longer than 10 bytes or over 64 bits", base + start)
        value |= (<uint64_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            out[0] = value
            return 0
        shift += 7


cdef inline int read_varint32(const uint8_t* p, Py_ssize_t size, Py_ssize_t* pos,
                              int32_t* out, Py_ssize_t base) except -1:
    # Inlined loop for well-formed input; anything odd (truncation, overflow) goes to the
    # out-of-line reader, which raises the right error.
    cdef uint32_t value = 0
    cdef int shift = 0
    cdef Py_ssize_t i = pos[0]
    cdef uint8_t b
    while i < size and shift < 28:
        b = p[i]
        i += 1
        value |= (<uint32_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            pos[0] = i
            out[0] = unzigzag32(value)
            return 0
        shift += 7
    read_uvarint32(p, size, pos, &value, base)
    out[0] = unzigzag32(value)
    return 0


cdef inline int read_varlong64(const uint8_t* p, Py_ssize_t size, Py_ssize_t* pos,
                               int64_t* out, Py_ssize_t base) except -1:
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef Py_ssize_t i = pos[0]
    cdef uint8_t b
    while i < size and shift < 63:
        b = p[i]
        i += 1
        value |= (<uint64_t>(b & 0x7F)) << shift
        if not (b & 0x80):
            pos[0] = i
            out[0] = unzigzag64(value)
            return 0
        shift += 7
    read_uvarint64(p, size, pos, &value, base)
    out[0] = unzigzag64(value)
    return 0


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
