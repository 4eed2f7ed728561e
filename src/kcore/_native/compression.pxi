# Kafka's compression framing around the codecs cramjam provides (it releases the GIL):
# gzip streams, snappy in Java's xerial framing (raw snappy is read too), LZ4 frames written as
# Java writes them (64 KiB independent blocks), zstd streams (several frames, or frames without
# a content size, decode as one stream). Decompression is bounded: a batch may not expand past
# ``max_decompressed_size`` bytes.

import cramjam as _cramjam

DEF CODEC_NONE = 0
DEF CODEC_GZIP = 1
DEF CODEC_SNAPPY = 2
DEF CODEC_LZ4 = 3
DEF CODEC_ZSTD = 4

COMPRESSION_CODECS = {"none": CODEC_NONE, "gzip": CODEC_GZIP, "snappy": CODEC_SNAPPY,
                      "lz4": CODEC_LZ4, "zstd": CODEC_ZSTD}
_CODEC_NAMES = {v: k for k, v in COMPRESSION_CODECS.items()}

# The default cap on how far one compressed batch may expand.
DEFAULT_MAX_DECOMPRESSED_SIZE = 256 * 1024 * 1024

XERIAL_MAGIC = b"\x82SNAPPY\x00"
cdef const char* XERIAL_MAGIC_C = b"\x82SNAPPY\x00"
DEF XERIAL_HEADER_SIZE = 16
DEF XERIAL_BLOCK_SIZE = 32768
DEF LZ4_BLOCK_SIZE = 65536
DEF LZ4_DEFAULT_LEVEL = 9  # compression.lz4.level's default: the fast compressor
# "The codec's default level" (gzip 6, lz4 fast, zstd 3): not a level of any codec, since -1
# is one of zstd's (a faster one) and gzip's own name for its default.
DEF LEVEL_DEFAULT = -2147483648
DEFAULT_COMPRESSION_LEVEL = LEVEL_DEFAULT
DEF LZ4_MAGIC = 0x184D2204
DEF LZ4_SMALL_FRAME = 65536  # (one block of Java's; python-lz4 reads frames up to it)
DEF LZ4_SKIPPABLE_MAGIC = 0x184D2A50  # (0x184D2A50-5F)
DEF LZ4_TRAILING_BYTES = -3  # lz4_frame_bound: a whole frame, then bytes that are none
# FLG: version 01, independent blocks, no checksums, no content size. BD: 64 KiB blocks.
DEF LZ4_FLG = 0x60
DEF LZ4_BD = 0x40

_DecompressionError = _cramjam.DecompressionError


cdef int codec_id(str name) except -1:
    try:
        return COMPRESSION_CODECS[name]
    except KeyError:
        raise ValueError(
            f"unknown compression {name!r}; one of {', '.join(COMPRESSION_CODECS)}") from None


def compress(str codec, object data, int level=LEVEL_DEFAULT):
    """Compress ``data`` with Kafka's framing for ``codec`` at ``level``, as Java's producer:
    by default gzip 6, zstd 3 and lz4's fast compressor; gzip's -1 is its default too, zstd's
    negative levels are its faster ones, and lz4 at a level other than 9 (Java's default, the
    fast compressor) is LZ4 HC, which needs the ``lz4`` package."""
    return compress_payload(codec_id(codec), data, level)


def decompress(str codec, object data, Py_ssize_t max_size=DEFAULT_MAX_DECOMPRESSED_SIZE):
    """Undo :func:`compress` (or what Java, librdkafka and other producers write)."""
    cdef int cid = codec_id(codec)
    if max_size < 0:
        raise ValueError("max_size must not be negative")
    if cid == CODEC_NONE:
        return bytes(data)
    return bytes(decompress_payload(cid, data, max_size, 0, False))


cdef bytes compress_payload(int codec, object data, int level):
    if codec == CODEC_NONE:
        return bytes(data)
    if codec == CODEC_GZIP:
        return bytes(_cramjam.gzip.compress(data, level=6 if level < 0 else level))  # -1: 6
    if codec == CODEC_SNAPPY:
        return xerial_compress(data)
    if codec == CODEC_LZ4:
        return lz4_frame_compress(data, level)
    if codec == CODEC_ZSTD:
        return zstd_compress(data, 3 if level == LEVEL_DEFAULT else level)
    raise UnsupportedCodecError(f"compression codec {codec} is not known")


# zstd with a context kept per thread and level, when the zstandard package is installed
# (kcore[zstd]): cramjam makes a context each call, which for a 16 KiB batch costs about as
# much as compressing it (51.8 against 28.5 us a batch; decompressing 26.7 against 9.0 us).
# Both let go of the GIL while they work. The output is the same: one frame with its content
# size. A context is not safe to share between threads, hence one set per thread.
cdef object _zstandard = None  # the module; False when it is not installed
cdef object _zstd_contexts = None  # threading.local: .compressors {level: ...}, .decompressor


cdef object zstandard_module():
    global _zstandard, _zstd_contexts
    if _zstandard is None:
        import importlib
        import threading
        try:
            # (importlib: Cython's own import takes a None in sys.modules for the module)
            _zstandard = importlib.import_module("zstandard")
        except ImportError:
            _zstandard = False
        else:
            # decompress(allow_extra_data=...) is 0.18's; kcore[zstd] asks for 0.22
            if zstandard_version(getattr(_zstandard, "__version__", "")) < (0, 22):
                _zstandard = False
            else:
                _zstd_contexts = threading.local()
    return _zstandard


cdef tuple zstandard_version(str text):
    parts = []
    for part in text.split(".")[:2]:
        if not part.isdigit():
            return (0, 0)
        parts.append(int(part))
    return tuple(parts) if len(parts) == 2 else (0, 0)


def zstd_context_reuse_available():
    """Whether zstd batches are compressed and decompressed with contexts kept per thread
    (the zstandard package: pip install kcore[zstd]) rather than one made per batch."""
    return zstandard_module() is not False


cdef bytes zstd_compress(object data, int level):
    zstandard = zstandard_module()
    if zstandard is False or not 1 <= level <= 22:  # (negative levels: cramjam's, as before)
        return bytes(_cramjam.zstd.compress(data, level=level))
    compressors = getattr(_zstd_contexts, "compressors", None)
    if compressors is None:
        compressors = _zstd_contexts.compressors = {}
    compressor = compressors.get(level)
    if compressor is None:
        compressor = compressors[level] = zstandard.ZstdCompressor(level=level)
    return compressor.compress(data)


cdef object zstd_decompress_framed(object data, Py_ssize_t limit):
    """One zstd frame, decompressed with this thread's context into at most ``limit`` bytes,
    in one pass: into its stated size, or for a frame that states none (as Java's producer
    writes them) into the most its blocks can hold (``zstd_frame_bound``). None for anything
    else (no zstandard, several frames, past the limit, bad data): the bounded cramjam path
    takes those, and names what is wrong."""
    zstandard = zstandard_module()
    if zstandard is False:
        return None
    try:
        size = zstandard.frame_content_size(data)
        if size > limit:  # (the bounded path says so)
            return None
        if size < 0:  # not stated
            size = zstd_frame_bound(data)
            if size < 0:
                return None
            # (past the limit: decompress fails at it, and the bounded path says so)
            size = max(1, min(size, limit))  # (0 would mean no bound at all)
        decompressor = getattr(_zstd_contexts, "decompressor", None)
        if decompressor is None:
            decompressor = _zstd_contexts.decompressor = zstandard.ZstdDecompressor()
        return decompressor.decompress(data, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError:
        return None


# A zstd frame's magic number, and the most one block regenerates (RFC 8878: the smaller of
# the window and 128 KiB).
DEF ZSTD_MAGIC = 0xFD2FB528
DEF ZSTD_BLOCK_MAX = 131072
cdef Py_ssize_t[4] ZSTD_DICT_ID_SIZES = [0, 1, 2, 4]


cdef Py_ssize_t zstd_frame_bound(object data) except -2:
    """The most a zstd frame's blocks regenerate, read from its block headers (RFC 8878):
    a raw or RLE block its stated size, a compressed one at most ZSTD_BLOCK_MAX. Without a
    stated content size, a guess of the output (too small: decompressed again, larger) cost
    a 256 KiB batch of log lines 2.7x the time. -1 unless ``data`` is exactly one well-formed
    frame: the bounded path takes the rest (several frames, skippable frames, bad data)."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef Py_ssize_t pos, bound = 0, block_size
    cdef uint32_t header
    cdef uint8_t descriptor, block_type
    cdef bint last = False
    view_open(data, &v, &pybuf)
    try:
        if v.size < 5 or get_le32(v.data) != ZSTD_MAGIC:
            return -1
        descriptor = v.data[4]
        if descriptor & 0x08:  # the reserved bit
            return -1
        pos = 5
        if not descriptor & 0x20:  # not a single segment: a window descriptor
            pos += 1
        pos += ZSTD_DICT_ID_SIZES[descriptor & 0x03]
        if descriptor >> 6:  # the content size: 2, 4 or 8 bytes
            pos += 1 << (descriptor >> 6)
        elif descriptor & 0x20:  # (a single segment states it in 1 byte at least)
            pos += 1
        while not last:
            if v.size - pos < 3:
                return -1
            header = v.data[pos] | (v.data[pos + 1] << 8) | (<uint32_t>v.data[pos + 2] << 16)
            pos += 3
            last = header & 1
            block_type = (header >> 1) & 3
            block_size = header >> 3
            if block_type == 0:  # raw
                bound += block_size
                pos += block_size
            elif block_type == 1:  # RLE: one byte, repeated block_size times
                bound += block_size
                pos += 1
            elif block_type == 2:  # compressed
                bound += ZSTD_BLOCK_MAX
                pos += block_size
            else:
                return -1
            if pos > v.size:
                return -1
        if descriptor & 0x04:  # a content checksum
            pos += 4
        return bound if pos == v.size else -1
    finally:
        view_close(&v, &pybuf)


cdef bytes xerial_compress(object data):
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef OutBuf out
    cdef Py_ssize_t pos = 0, n
    cdef uint8_t header[8]
    out.data = NULL
    out.size = 0
    out.cap = 0
    view_open(data, &v, &pybuf)
    try:
        mem = memoryview(data).cast("B") if not PyBytes_Check(data) else data
        out_write(&out, XERIAL_MAGIC_C, 8)
        put_i32(header, 1)  # version
        put_i32(header + 4, 1)  # minimum compatible version
        out_write(&out, header, 8)
        while pos < v.size:
            n = min(XERIAL_BLOCK_SIZE, v.size - pos)
            block = bytes(_cramjam.snappy.compress_raw(mem[pos:pos + n]))
            put_i32(header, <int32_t>len(block))
            out_write(&out, header, 4)
            out_write(&out, PyBytes_AS_STRING(block), len(block))
            pos += n
        return PyBytes_FromStringAndSize(<char*>out.data, out.size)
    finally:
        view_close(&v, &pybuf)
        free(out.data)


cdef object _lz4_block = None  # python-lz4's block module, for LZ4 HC (cramjam has no HC)


def lz4_high_compression_available():
    """Whether lz4 levels other than the default can be written (the ``lz4`` package)."""
    try:
        lz4_hc_module()
    except ConfigError:
        return False
    return True


cdef object lz4_hc_module():
    global _lz4_block
    if _lz4_block is None:
        try:
            import lz4.block as block
        except ImportError:
            raise ConfigError(
                "compression.lz4.level",
                "a level other than 9 (Java's default, the fast compressor) is LZ4 HC, "
                "which kcore writes with the lz4 package: pip install lz4 (or kcore[lz4])"
            ) from None
        _lz4_block = block
    return _lz4_block


cdef object _lz4_frame = None  # python-lz4's frame module (kcore[lz4]); False without it


cdef object lz4_frame_decompress(object data):
    """One small LZ4 frame, with python-lz4 when it is installed: its decoder costs ~1.7 us
    less a call than cramjam's (a 16 KiB batch of log lines: 3.4 against 5.1 us). Only for a
    frame whose headers bound its output within the limit. None without the
    package or when it refuses the frame: the cramjam path takes it, and names what is wrong."""
    global _lz4_frame
    if _lz4_frame is None:
        try:
            import lz4.frame as frame
        except ImportError:
            _lz4_frame = False
        else:
            _lz4_frame = frame
    if _lz4_frame is False:
        return None
    try:
        return _lz4_frame.decompress(data)
    except (RuntimeError, ValueError):
        return None


cdef bytes lz4_frame_compress(object data, int level=LEVEL_DEFAULT):
    # As Java's producer: its default level (9, compression.lz4.level) is LZ4's fast
    # compressor; any other level is LZ4 HC at that level.
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef OutBuf out
    cdef Py_ssize_t pos = 0, n, clen
    cdef uint8_t header[7]
    cdef uint32_t word
    out.data = NULL
    out.size = 0
    out.cap = 0
    view_open(data, &v, &pybuf)
    try:
        mem = memoryview(data).cast("B") if not PyBytes_Check(data) else data
        header[0] = 0x04
        header[1] = 0x22
        header[2] = 0x4D
        header[3] = 0x18
        header[4] = LZ4_FLG
        header[5] = LZ4_BD
        header[6] = <uint8_t>((kcore_xxh32(header + 4, 2, 0) >> 8) & 0xFF)
        out_write(&out, header, 7)
        while pos < v.size:
            n = min(LZ4_BLOCK_SIZE, v.size - pos)
            if level < 0 or level == LZ4_DEFAULT_LEVEL:
                block = bytes(_cramjam.lz4.compress_block(mem[pos:pos + n], store_size=False))
            else:
                block = lz4_hc_module().compress(
                    mem[pos:pos + n], mode="high_compression", compression=level,
                    store_size=False)
            clen = len(block)
            out_reserve(&out, 4 + n)
            if clen >= n:  # incompressible: store the block as is, flagged by the high bit
                word = <uint32_t>n | 0x80000000u
                put_le32(out.data + out.size, word)
                out.size += 4
                out_write(&out, v.data + pos, n)
            else:
                put_le32(out.data + out.size, <uint32_t>clen)
                out.size += 4
                out_write(&out, PyBytes_AS_STRING(block), clen)
            pos += n
        out_reserve(&out, 4)
        put_le32(out.data + out.size, 0)  # end mark
        out.size += 4
        return PyBytes_FromStringAndSize(<char*>out.data, out.size)
    finally:
        view_close(&v, &pybuf)
        free(out.data)


cdef inline void put_le32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>v
    p[1] = <uint8_t>(v >> 8)
    p[2] = <uint8_t>(v >> 16)
    p[3] = <uint8_t>(v >> 24)


cdef object decompress_payload(int codec, object data, Py_ssize_t limit, Py_ssize_t position,
                               bint legacy_lz4):
    """Decompress one batch's payload; errors name ``position`` (the batch's start)."""
    cdef Py_ssize_t bound
    try:
        if codec == CODEC_GZIP:
            return decompress_bounded(_cramjam.gzip.decompress_into, data, limit, position,
                                      gzip_stated_size(data))
        if codec == CODEC_SNAPPY:
            return snappy_decompress(data, limit, position)
        if codec == CODEC_LZ4:
            if legacy_lz4:
                data = fix_legacy_lz4_header(data)
            bound = lz4_frame_bound(data)
            if bound == LZ4_TRAILING_BYTES:
                raise CorruptRecordError("lz4 data does not decompress: bytes after the frame "
                                         "are not an LZ4 frame", position)
            # python-lz4 has no bound of its own: this is it. Past one block cramjam's decoder,
            # into a buffer of the bound, is as fast or faster (256 KiB: 43 against 47 us).
            if 0 <= bound <= min(limit, LZ4_SMALL_FRAME):
                out = lz4_frame_decompress(data)
                if out is not None:
                    return out
            return decompress_bounded(_cramjam.lz4.decompress_into, data, limit, position, bound)
        if codec == CODEC_ZSTD:
            out = zstd_decompress_framed(data, limit)
            if out is not None:
                return out
            return decompress_bounded(_cramjam.zstd.decompress_into, data, limit, position, -1)
    except _DecompressionError as exc:
        raise CorruptRecordError(
            f"{_CODEC_NAMES[codec]} data does not decompress: {exc}", position) from None
    raise UnsupportedCodecError(f"compression codec {codec} is not known", position)


cdef object decompress_bounded(object decompress_into, object data, Py_ssize_t limit,
                               Py_ssize_t position, Py_ssize_t stated):
    """``data`` decompressed into a buffer of at most ``limit`` bytes. The codecs fail rather
    than write past the output buffer, so a buffer too small is grown (4x a step) and the
    batch decompressed again. ``stated``: what the frame's own headers say it holds (exactly,
    or at most), tried first; -1 when they say nothing (the first guess is 4x the input)."""
    cdef Py_ssize_t size, guess
    if limit < 0:
        raise ValueError("the decompression limit must not be negative")
    guess = min(limit, max(len(data) * 4, 65536))
    # A stated size past the limit (or a lie) is not believed: the guess and the growth below
    # then reach the limit, and say so, as for a frame that states nothing.
    size = stated if 0 < stated <= limit else guess
    cdef Py_ssize_t n
    cdef ColumnBuffer out
    while True:
        out = scratch_buffer(size)
        try:
            n = decompress_into(data, out)
        except _DecompressionError as exc:
            if "whole buffer" not in str(exc):
                raise
            if size >= limit:
                raise DecompressionLimitError(
                    f"a compressed batch expands past the limit of {limit} bytes", position
                ) from None
            size = min(limit, max(size * 4, guess))
            continue
        out.buf.size = n
        out.writable = False
        return out


cdef Py_ssize_t gzip_stated_size(object data) except -2:
    """A gzip member's size before compression, from its trailer (ISIZE, RFC 1952: the size
    modulo 2**32); -1 if ``data`` is no gzip data. Exact for one member (what Java's
    GZIPOutputStream writes); for several it is the last one's, too small, and the buffer grows
    as for a guess. Before it, a batch of log lines (10x) was decompressed twice."""
    cdef ByteView v
    cdef Py_buffer pybuf
    view_open(data, &v, &pybuf)
    try:
        if v.size < 18 or v.data[0] != 0x1F or v.data[1] != 0x8B:
            return -1
        return get_le32(v.data + v.size - 4)
    finally:
        view_close(&v, &pybuf)


cdef Py_ssize_t lz4_frame_bound(object data) except -2:
    """The most an LZ4 frame holds, from its headers (the LZ4 frame format): its content size
    when it states one its blocks can hold, else each block's size (stored) or the frame's
    block maximum (compressed). -1 unless ``data`` is exactly one well-formed frame. Java's
    producer states no content size and writes 64 KiB blocks; a batch that shrank past the 4x
    guess (log lines: 4.5x) was decompressed twice. LZ4_TRAILING_BYTES for a whole frame
    followed by bytes that do not start another."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef Py_ssize_t pos, bound = 0, stated = -1, block_max, block_size
    cdef uint32_t word
    cdef uint8_t flags, descriptor
    view_open(data, &v, &pybuf)
    try:
        if v.size < 7 or get_le32(v.data) != LZ4_MAGIC:
            return -1
        flags = v.data[4]
        descriptor = v.data[5]
        if flags >> 6 != 1 or flags & 0x02 or descriptor & 0x8F:  # version 01, reserved bits
            return -1
        if (descriptor >> 4) < 4:
            return -1
        block_max = 1 << (8 + 2 * (descriptor >> 4))  # 4: 64 KiB, 5: 256 KiB, 6: 1 MiB, 7: 4 MiB
        pos = 6
        if flags & 0x08:  # the content size, stated: exact (if the blocks can hold it)
            if v.size - pos < 8 or v.data[pos + 7]:  # (the top byte: past any batch)
                return -1
            stated = 0
            for i in range(7):
                stated |= (<Py_ssize_t>v.data[pos + i]) << (8 * i)
            pos += 8
        if flags & 0x01:  # a dictionary id
            pos += 4
        pos += 1  # the header checksum
        while True:
            if v.size - pos < 4:
                return -1
            word = get_le32(v.data + pos)
            pos += 4
            if word == 0:  # the end mark
                break
            block_size = word & 0x7FFFFFFF
            if block_size > block_max:
                return -1
            bound += block_size if word & 0x80000000 else block_max
            pos += block_size
            if flags & 0x10:  # a checksum after each block
                pos += 4
            if pos > v.size:
                return -1
        if flags & 0x04:  # the content checksum
            pos += 4
        if pos > v.size:
            return -1
        if pos < v.size:
            # More frames (cramjam reads them all), or bytes that are no frame: refused here,
            # as cramjam versions differ on them (older ones ignore them).
            if v.size - pos < 4:
                return LZ4_TRAILING_BYTES
            word = get_le32(v.data + pos)
            if word == LZ4_MAGIC or (word & 0xFFFFFFF0) == LZ4_SKIPPABLE_MAGIC:
                return -1
            return LZ4_TRAILING_BYTES
        return stated if 0 <= stated <= bound else bound
    finally:
        view_close(&v, &pybuf)


cdef object snappy_decompress(object data, Py_ssize_t limit, Py_ssize_t position):
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef Py_ssize_t pos, blen, total = 0, n
    cdef list blocks = []
    cdef ColumnBuffer out
    view_open(data, &v, &pybuf)
    try:
        mem = memoryview(data).cast("B") if not PyBytes_Check(data) else data
        # Xerial framing: only the magic is checked (producers write different versions).
        if v.size >= XERIAL_HEADER_SIZE and memcmp(v.data, XERIAL_MAGIC_C, 8) == 0:
            pos = XERIAL_HEADER_SIZE
            while pos < v.size:
                if v.size - pos < 4:
                    raise TruncatedDataError("xerial snappy block length is truncated", position)
                blen = get_i32(v.data + pos)
                pos += 4
                if blen < 0 or blen > v.size - pos:
                    raise InvalidLengthError("xerial snappy block length is out of range",
                                             position)
                blocks.append(mem[pos:pos + blen])
                pos += blen
        else:
            blocks.append(mem)
        sizes = []
        for block in blocks:
            n = _cramjam.snappy.decompress_raw_len(block)
            total += n
            if total > limit:
                raise DecompressionLimitError(
                    f"a compressed batch expands past the limit of {limit} bytes", position)
            sizes.append(n)
        # (not a bytearray: its zero-filling cost a 1 MiB batch ~8% of its decompression)
        out = scratch_buffer(total)
        view = memoryview(out)
        pos = 0
        try:
            for block, n in zip(blocks, sizes):
                if _cramjam.snappy.decompress_raw_into(block, view[pos:pos + n]) != n:
                    raise CorruptRecordError("snappy block decompressed to an unexpected size",
                                             position)
                pos += n
        finally:
            view.release()
        out.writable = False
        return out
    finally:
        view_close(&v, &pybuf)


cdef object fix_legacy_lz4_header(object data):
    # Magic v0 messages were written with the LZ4 header checksum computed over the magic
    # number too (KAFKA-3160); recompute it over the descriptor so a standard reader accepts it.
    cdef bytearray fixed = bytearray(data)
    cdef Py_ssize_t hc_pos
    cdef uint8_t flg
    cdef uint8_t* p
    if len(fixed) < 7:
        return fixed
    p = <uint8_t*>PyByteArray_AS_STRING(fixed)
    flg = p[4]
    hc_pos = 6 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
    if hc_pos < len(fixed):
        p[hc_pos] = <uint8_t>((kcore_xxh32(p + 4, hc_pos - 4, 0) >> 8) & 0xFF)
    return fixed
