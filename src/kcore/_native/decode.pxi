# Decoding record batches: v2 (magic 2) batches, control batches, and the legacy message sets
# of magic 0 and 1 (with their compressed wrapper messages).

DEF LEGACY_HEADER_SIZE = 12  # offset int64 + message size int32
DEF V0_MIN_MESSAGE = 14      # crc, magic, attributes, key length, value length
DEF V1_MIN_MESSAGE = 22      # ... plus the timestamp


cdef struct RecordView:
    int64_t ts_delta
    int32_t offset_delta
    const uint8_t* key
    Py_ssize_t klen
    const uint8_t* value
    Py_ssize_t vlen
    Py_ssize_t headers_pos
    int32_t header_count
    Py_ssize_t end


cdef object _byte_view(object source):
    """A memoryview of ``source`` in bytes (a buffer of wider items would slice by item)."""
    mv = memoryview(source)
    if mv.itemsize != 1 or mv.ndim != 1:
        mv = mv.cast("B")
    return mv


# A v2 record takes at least 7 bytes (length, attributes, timestamp and offset deltas, key
# and value lengths, header count), so a record count above size / 7 is a lie.
DEF MIN_RECORD_SIZE = 7


cdef int check_record_count(int32_t count, Py_ssize_t payload_size,
                            Py_ssize_t position) except -1:
    if count > payload_size // MIN_RECORD_SIZE:
        raise InvalidLengthError(
            f"batch claims {count} records but its {payload_size} bytes hold at most "
            f"{payload_size // MIN_RECORD_SIZE}", position + 57)
    return 0


cdef int record_error(int kind, Py_ssize_t position) except -1:
    # Out of line, so that parse_record stays small enough for the compiler to inline.
    if kind == 0:
        raise TruncatedDataError("record length points past the end of the batch", position)
    if kind == 1:
        raise InvalidLengthError("record key length is out of range", position)
    if kind == 2:
        raise InvalidLengthError("record value length is out of range", position)
    raise InvalidLengthError("header count is negative or more than the record holds", position)


cdef inline int parse_record(const uint8_t* p, Py_ssize_t size, Py_ssize_t* pos,
                             RecordView* r, Py_ssize_t base) except -1:
    """Parse the record at p[pos] (headers are skipped, their position kept)."""
    cdef int32_t body, hlen
    cdef Py_ssize_t end
    read_varint32(p, size, pos, &body, base)
    if body < 0 or body > size - pos[0]:
        return record_error(0, base + pos[0])
    end = pos[0] + body
    pos[0] += 1  # record attributes: unused
    read_varlong64(p, end, pos, &r.ts_delta, base)
    read_varint32(p, end, pos, &r.offset_delta, base)
    read_varint32(p, end, pos, &hlen, base)
    if hlen < -1 or hlen > end - pos[0]:
        return record_error(1, base + pos[0])
    r.key = p + pos[0]
    r.klen = hlen
    if hlen > 0:
        pos[0] += hlen
    read_varint32(p, end, pos, &hlen, base)
    if hlen < -1 or hlen > end - pos[0]:
        return record_error(2, base + pos[0])
    r.value = p + pos[0]
    r.vlen = hlen
    if hlen > 0:
        pos[0] += hlen
    read_varint32(p, end, pos, &r.header_count, base)
    if r.header_count < 0 or r.header_count > (end - pos[0]) // 2:
        return record_error(3, base + pos[0])
    r.headers_pos = pos[0]
    r.end = end
    pos[0] = end
    return 0


cdef inline int parse_header(const uint8_t* p, Py_ssize_t end, Py_ssize_t* pos,
                             const uint8_t** hk, Py_ssize_t* hklen, const uint8_t** hv,
                             Py_ssize_t* hvlen, Py_ssize_t base) except -1:
    cdef int32_t n
    read_varint32(p, end, pos, &n, base)
    if n < 0 or n > end - pos[0]:
        raise InvalidLengthError("header key length is out of range", base + pos[0])
    hk[0] = p + pos[0]
    hklen[0] = n
    pos[0] += n
    read_varint32(p, end, pos, &n, base)
    if n < -1 or n > end - pos[0]:
        raise InvalidLengthError("header value length is out of range", base + pos[0])
    hv[0] = p + pos[0]
    hvlen[0] = n
    if n > 0:
        pos[0] += n
    return 0


cdef extern from *:
    """
    /* An instance of a tuple subclass (a NamedTuple) with n empty slots, made the way
       tuple.__new__ makes one for a subclass: through the type's own tp_alloc. */
    static PyObject* kcore_tuple_subtype_alloc(PyObject* cls, Py_ssize_t n) {
        PyTypeObject* t = (PyTypeObject*)cls;
        PyObject* o = t->tp_alloc(t, n);
    #if PY_VERSION_HEX >= 0x030E0000
        /* 3.14 caches a tuple's hash; -1 means "not computed" (tp_alloc zeroes it). */
        if (o != NULL) ((PyTupleObject*)o)->ob_hash = -1;
    #endif
        return o;
    }
    static int kcore_type_has_dict(PyObject* cls) {
        return ((PyTypeObject*)cls)->tp_dictoffset != 0;
    }
    """
    object kcore_tuple_subtype_alloc(object cls, Py_ssize_t n)
    int kcore_type_has_dict(object cls)


cdef inline void set_item(object tup, Py_ssize_t i, object item):
    Py_INCREF(item)
    PyTuple_SET_ITEM(tup, i, item)


cdef object check_record_type(object record_type, Py_ssize_t n=7):
    if (not isinstance(record_type, type) or not issubclass(record_type, tuple)
            or record_type is tuple):
        raise TypeError(f"record_type must be a tuple subclass, not {record_type!r}")
    fields = getattr(record_type, "_fields", None)
    if fields is None or len(fields) != n:
        raise TypeError(f"record_type must be a NamedTuple of {n} fields; "
                        f"{record_type.__name__} has {0 if fields is None else len(fields)}")
    return record_type


cdef object headers_tuple(const uint8_t* p, RecordView* r, Py_ssize_t base):
    cdef Py_ssize_t pos = r.headers_pos, hklen, hvlen
    cdef const uint8_t* hk
    cdef const uint8_t* hv
    cdef int32_t j
    if r.header_count == 0:
        return ()
    out = PyTuple_New(r.header_count)
    for j in range(r.header_count):
        parse_header(p, r.end, &pos, &hk, &hklen, &hv, &hvlen, base)
        try:
            hkey = PyUnicode_DecodeUTF8(<const char*>hk, hklen, NULL)
        except UnicodeDecodeError:
            raise CorruptRecordError("header key is not UTF-8", base + pos) from None
        hval = None if hvlen < 0 else PyBytes_FromStringAndSize(<const char*>hv, hvlen)
        pair = (hkey, hval)
        PyObject_GC_UnTrack(<void*>pair)
        Py_INCREF(pair)
        PyTuple_SET_ITEM(out, j, pair)
    PyObject_GC_UnTrack(<void*>out)
    return out


# A share fetch's gaps are offsets of its acquired ranges: more than this in one batch's span
# is no record batch a broker wrote (its span is a corrupt or hostile header).
MAX_SHARE_GAPS = 1 << 22


cdef void ranged_offsets(list ranges, int64_t lo, int64_t hi, list into) except *:
    """Appends to ``into`` the offsets in [lo, hi] that lie inside ``ranges`` (sorted
    ``(first, last, ...)`` tuples)."""
    cdef int64_t first, last, o
    for rng in ranges:
        first, last = rng[0], rng[1]
        if last < lo:
            continue
        if first > hi:
            break
        if first < lo:
            first = lo
        if last > hi:
            last = hi
        if len(into) + (last - first + 1) > MAX_SHARE_GAPS:
            raise CorruptRecordError(
                f"a batch leaves {last - first + 1} acquired offsets with no record: not a "
                "batch a broker wrote", -1)
        for o in range(first, last + 1):
            into.append(o)


cdef struct AcquiredCursor:
    # Where a walk through one batch's records stands in a ShareFetch's acquired ranges.
    Py_ssize_t ri  # the range the last record was held against (nr: past them all)
    Py_ssize_t nr
    int64_t first  # ranges[ri]'s first and last offsets and delivery count
    int64_t last
    int32_t count
    int64_t expect  # the offset after the last record seen: a record further on leaves a gap


cdef inline int acquired_load(list ranges, AcquiredCursor* c) except -1:
    rng = ranges[c.ri]
    c.first, c.last, c.count = rng[0], rng[1], rng[2]
    return 0


cdef int acquired_start(list ranges, int64_t base_offset, AcquiredCursor* c) except -1:
    """A walk through the records of a batch starting at ``base_offset``, against ``ranges``
    (sorted, disjoint ``(first, last, delivery_count)`` offset ranges)."""
    c.ri = 0
    c.nr = len(ranges)
    c.first, c.last, c.count = 0, -1, 0
    c.expect = base_offset
    if c.nr:
        acquired_load(ranges, c)
    return 0


cdef inline int acquired_step(list ranges, AcquiredCursor* c, int64_t o, list gaps) except -2:
    """The record at offset ``o`` (records come in offset order): 1 when it is inside a range
    (``c.count`` its delivery count), 0 when it is in none (another member's), -1 when it is
    past the last range (so is the rest of the batch). The acquired offsets skipped since
    the last record go to ``gaps``."""
    if o > c.expect:
        ranged_offsets(ranges, c.expect, o - 1, gaps)
    if o >= c.expect:
        c.expect = o + 1
    while c.ri < c.nr and c.last < o:
        c.ri += 1
        if c.ri < c.nr:
            acquired_load(ranges, c)
    if c.ri == c.nr:
        return -1
    return 1 if o >= c.first else 0


cdef int acquired_finish(list ranges, AcquiredCursor* c, int64_t span_last, list gaps) except -1:
    """The walk's end: the acquired offsets after the last record, up to the batch's last
    offset (``span_last``), go to ``gaps``."""
    if c.expect <= span_last:
        ranged_offsets(ranges, c.expect, span_last, gaps)
    return 0


cdef class RecordBatch:
    """One v2 record batch: its header fields, and ``records()``."""

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
    cdef readonly Py_ssize_t position   # where the batch starts in the decoded buffer
    cdef readonly Py_ssize_t size_in_bytes
    cdef object _source                 # the buffer the batch lives in (not copied)
    cdef Py_ssize_t _max_decompressed
    cdef int64_t _ts                    # the last record timestamp made, and its int object
    cdef object _ts_obj

    def __repr__(self):
        return (f"RecordBatch(base_offset={self.base_offset}, records={self.record_count}, "
                f"compression={self.compression!r}, control={self.is_control})")

    @property
    def compression(self):
        return _CODEC_NAMES.get(self.attributes & 0x07, "unknown")

    @property
    def timestamp_type(self):
        """0 for CreateTime, 1 for LogAppendTime."""
        return (self.attributes >> 3) & 1

    @property
    def is_transactional(self):
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self):
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def last_offset(self):
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self):
        return self.base_offset + self.last_offset_delta + 1

    def control_type(self):
        """For a control batch, ``"abort"`` or ``"commit"`` (from its marker's key); else None."""
        if not self.is_control:
            return None
        for _, _, key, _, _ in self.records():
            if key is None or len(key) < 4:
                raise CorruptRecordError("control record key is too short", self.position)
            kind = get_i16(<const uint8_t*>PyBytes_AS_STRING(key) + 2)
            return {0: "abort", 1: "commit"}.get(kind, f"unknown({kind})")
        return None

    cdef object payload(self):
        """The records section, decompressed if need be."""
        cdef Py_ssize_t start = self.position + BATCH_HEADER_SIZE
        cdef Py_ssize_t end = self.position + self.size_in_bytes
        cdef int codec = self.attributes & 0x07
        if self.record_count == 0:  # as Java: an empty batch has no records to decompress
            return b""
        src = _byte_view(self._source)[start:end]
        if codec == CODEC_NONE:
            return src
        if codec > CODEC_ZSTD:
            raise UnsupportedCodecError(f"compression codec {codec} is not known", self.position)
        return decompress_payload(codec, src, self._max_decompressed, self.position, False)

    def records(self):
        """The records as a list of ``(offset, timestamp_ms, key, value, headers)`` tuples;
        ``headers`` is a tuple of ``(str, bytes | None)`` pairs."""
        return self.collect(None, None, None, -1, False)

    def records_as(self, object record_type, object topic, object partition,
                   int64_t min_offset=-1):
        """The records at or after ``min_offset`` (all when it is negative), each made directly as
        ``record_type(topic, partition, offset, timestamp_ms, key, value, headers)``;
        ``record_type`` is a tuple subclass of 7 fields (a NamedTuple such as kcore's
        ConsumerRecord), so a consumer pays for one object per record, not two."""
        check_record_type(record_type)
        # As records(): only str, int, bytes, None and such tuples inside, so a record can never
        # be part of a cycle and the garbage collector need not walk it (unless the type gives
        # its instances a dict).
        untrack = ((topic is None or PyUnicode_Check(topic))
                   and (partition is None or PyLong_CheckExact(partition))
                   and not kcore_type_has_dict(record_type))
        return self.collect(record_type, topic, partition, min_offset, untrack)

    def acquired_records(self, object record_type, object topic, object partition,
                         list ranges, list gaps):
        """The records inside ``ranges`` (sorted, disjoint ``(first, last, delivery_count)``
        offset ranges, as a ShareFetch acquires them), each made directly as
        ``record_type(topic, partition, offset, timestamp_ms, key, value, headers,
        delivery_count, timestamp_type)`` (a NamedTuple of 9 fields). The offsets of this
        batch's span inside ``ranges`` that hold no record (compacted away) are appended to
        ``gaps``: a share consumer acknowledges them all the same."""
        check_record_type(record_type, 9)
        untrack = ((topic is None or PyUnicode_Check(topic))
                   and (partition is None or PyLong_CheckExact(partition))
                   and not kcore_type_has_dict(record_type))
        cdef ByteView v
        cdef Py_buffer pybuf
        cdef Py_ssize_t pos = 0, base, extra_range = -1
        cdef int32_t i
        cdef int where
        cdef RecordView r
        cdef AcquiredCursor c
        cdef list out = []
        cdef tuple extra = None
        ts_type = (self.attributes >> 3) & 1
        acquired_start(ranges, self.base_offset, &c)
        payload = self.payload()
        base = self.position + BATCH_HEADER_SIZE
        view_open(payload, &v, &pybuf)
        try:
            check_record_count(self.record_count, v.size, self.position)
            for i in range(self.record_count):
                parse_record(v.data, v.size, &pos, &r, base)
                where = acquired_step(ranges, &c, self.base_offset + r.offset_delta, gaps)
                if where < 0:
                    break  # past the last range: the rest is another member's
                if where:
                    if c.ri != extra_range:  # (delivery count, timestamp type) a range
                        extra_range = c.ri
                        extra = (c.count, ts_type)
                    out.append(self.make_record_as(record_type, topic, partition, v.data, &r,
                                                   base, untrack, extra))
            else:
                if pos != v.size:
                    raise CorruptRecordError(
                        f"{v.size - pos} bytes left after the batch's {self.record_count} "
                        "records", base + pos)
        finally:
            view_close(&v, &pybuf)
        acquired_finish(ranges, &c, self.base_offset + self.last_offset_delta, gaps)
        return out

    cdef list collect(self, object record_type, object topic, object partition,
                      int64_t min_offset, bint untrack):
        """records() (``record_type`` None) and records_as(): one pass over the batch."""
        cdef ByteView v
        cdef Py_buffer pybuf
        cdef Py_ssize_t pos = 0, base
        cdef int32_t i
        cdef RecordView r
        cdef list out = None
        cdef bint every = min_offset < 0  # no filter: the list's length is known up front
        payload = self.payload()
        base = self.position + BATCH_HEADER_SIZE
        view_open(payload, &v, &pybuf)
        try:
            check_record_count(self.record_count, v.size, self.position)
            out = PyList_New(self.record_count) if every and self.record_count > 0 else []
            # Out of the garbage collector's sight while it fills: the record allocations set
            # off collections, and each would walk this young list of up to every record.
            # (Its items cannot form a cycle with it; tracked again below, also on error.)
            PyObject_GC_UnTrack(<void*>out)
            for i in range(self.record_count):
                parse_record(v.data, v.size, &pos, &r, base)
                if not every and self.base_offset + r.offset_delta < min_offset:
                    continue
                if record_type is None:
                    record = self.make_record(v.data, &r, base)
                else:
                    record = self.make_record_as(record_type, topic, partition, v.data, &r, base,
                                                 untrack)
                if every:
                    Py_INCREF(record)
                    PyList_SET_ITEM(out, i, record)
                else:
                    out.append(record)
            if pos != v.size:
                raise CorruptRecordError(
                    f"{v.size - pos} bytes left after the batch's {self.record_count} records",
                    base + pos)
        finally:
            if out is not None and not PyObject_GC_IsTracked(out):
                PyObject_GC_Track(<void*>out)
            view_close(&v, &pybuf)
        return out

    def __iter__(self):
        """Iterate the records one at a time (memory stays flat for large batches)."""
        return RecordIterator(self)

    cdef object timestamp_of(self, RecordView* r):
        cdef int64_t ts
        if self.attributes & ATTR_TIMESTAMP_TYPE:  # LogAppendTime: the batch's max timestamp
            ts = self.max_timestamp
        else:
            ts = self.base_timestamp + r.ts_delta
        # Records of a batch often share a timestamp: reuse its int instead of making another.
        if self._ts_obj is None or ts != self._ts:
            self._ts = ts
            self._ts_obj = ts
        return self._ts_obj

    cdef object make_record(self, const uint8_t* data, RecordView* r, Py_ssize_t base):
        ts = self.timestamp_of(r)
        key = None if r.klen < 0 else PyBytes_FromStringAndSize(<const char*>r.key, r.klen)
        value = None if r.vlen < 0 else PyBytes_FromStringAndSize(<const char*>r.value, r.vlen)
        record = (self.base_offset + r.offset_delta, ts, key, value,
                  headers_tuple(data, r, base))
        # Only ints, bytes, None and tuples of str/bytes: it can never be part of a cycle, so
        # keep the garbage collector from walking (and re-walking) every record.
        PyObject_GC_UnTrack(<void*>record)
        return record

    cdef object make_record_as(self, object record_type, object topic, object partition,
                               const uint8_t* data, RecordView* r, Py_ssize_t base,
                               bint untrack, tuple extra=None):
        """``extra``: the values of fields past the seventh (a share record's delivery count
        and timestamp type)."""
        cdef Py_ssize_t j, n_extra = 0 if extra is None else len(extra)
        ts = self.timestamp_of(r)
        key = None if r.klen < 0 else PyBytes_FromStringAndSize(<const char*>r.key, r.klen)
        value = None if r.vlen < 0 else PyBytes_FromStringAndSize(<const char*>r.value, r.vlen)
        headers = headers_tuple(data, r, base)
        record = kcore_tuple_subtype_alloc(record_type, 7 + n_extra)
        for j in range(n_extra):
            set_item(record, 7 + j, extra[j])
        set_item(record, 0, topic)
        set_item(record, 1, partition)
        set_item(record, 2, self.base_offset + r.offset_delta)
        set_item(record, 3, ts)
        set_item(record, 4, key)
        set_item(record, 5, value)
        set_item(record, 6, headers)
        if untrack:
            PyObject_GC_UnTrack(<void*>record)
        return record


cdef class RecordIterator:
    """Iterates one batch's records, decoding each as it is asked for."""

    cdef RecordBatch batch
    cdef object payload
    cdef ByteView view
    cdef Py_buffer pybuf
    cdef Py_ssize_t pos
    cdef Py_ssize_t base
    cdef int32_t index

    def __cinit__(self, RecordBatch batch):
        self.view.acquired = False
        self.batch = batch
        self.payload = batch.payload()
        self.base = batch.position + BATCH_HEADER_SIZE
        view_open(self.payload, &self.view, &self.pybuf)
        check_record_count(batch.record_count, self.view.size, batch.position)

    def __dealloc__(self):
        view_close(&self.view, &self.pybuf)

    def __iter__(self):
        return self

    def __next__(self):
        cdef RecordView r
        if self.index >= self.batch.record_count:
            if self.pos != self.view.size:
                raise CorruptRecordError(
                    f"{self.view.size - self.pos} bytes left after the batch's "
                    f"{self.batch.record_count} records", self.base + self.pos)
            raise StopIteration
        parse_record(self.view.data, self.view.size, &self.pos, &r, self.base)
        self.index += 1
        return self.batch.make_record(self.view.data, &r, self.base)


cdef class LegacyBatch:
    """One top-level message of a magic 0 or 1 message set: a single record, or a compressed
    wrapper whose value holds an inner message set. ``last_offset`` is the wrapper's offset."""

    cdef readonly int64_t last_offset
    cdef readonly int8_t magic
    cdef readonly uint32_t crc
    cdef readonly int8_t attributes
    cdef readonly int64_t timestamp
    cdef readonly Py_ssize_t position
    cdef readonly Py_ssize_t size_in_bytes
    cdef object _source
    cdef Py_ssize_t _max_decompressed

    def __repr__(self):
        return (f"LegacyBatch(magic={self.magic}, last_offset={self.last_offset}, "
                f"compression={self.compression!r})")

    @property
    def compression(self):
        return _CODEC_NAMES.get(self.attributes & 0x07, "unknown")

    @property
    def timestamp_type(self):
        return (self.attributes >> 3) & 1 if self.magic > 0 else -1

    @property
    def is_control(self):
        return False

    @property
    def is_transactional(self):
        return False

    @property
    def producer_id(self):
        return -1

    @property
    def next_offset(self):
        return self.last_offset + 1

    def records_as(self, object record_type, object topic, object partition,
                   int64_t min_offset=-1):
        """As RecordBatch.records_as (legacy formats are rare: made the plain way)."""
        check_record_type(record_type)
        return [record_type(topic, partition, *r) for r in self.records()
                if min_offset < 0 or r[0] >= min_offset]

    def records(self):
        """The records as ``(offset, timestamp_ms, key, value, headers)`` tuples (no headers
        in these formats: always ``()``)."""
        cdef list out = []
        cdef int codec = self.attributes & 0x07
        cdef Py_ssize_t n, pos
        cdef int64_t shift, ts
        cdef bint log_append
        message = decode_legacy_message(self._source, self.position)
        if codec == CODEC_NONE:
            offset, ts, key, value, _ = message
            return [(offset, ts, key, value, ())]
        if codec > CODEC_LZ4:
            raise UnsupportedCodecError(
                f"compression codec {codec} is not allowed in magic {self.magic} messages",
                self.position)
        value = message[3]
        if value is None:
            raise CorruptRecordError("compressed wrapper message has no value", self.position)
        inner = decompress_payload(codec, value, self._max_decompressed, self.position,
                                   self.magic == 0)
        pos = 0
        n = len(inner)
        inner_view = memoryview(inner)
        while pos < n:
            if n - pos < LEGACY_HEADER_SIZE:
                raise TruncatedDataError("inner message is truncated", self.position)
            record = decode_legacy_message(inner, pos)
            out.append(record)
            pos += LEGACY_HEADER_SIZE + int.from_bytes(inner_view[pos + 8:pos + 12], "big",
                                                       signed=True)
        if not out:
            return out
        log_append = self.magic == 1 and (self.attributes & ATTR_TIMESTAMP_TYPE)
        if self.magic == 1:
            # Inner offsets are relative; the wrapper carries the last one's absolute offset.
            shift = self.last_offset - out[len(out) - 1][0]
        else:
            shift = 0
        return [(o + shift, self.timestamp if log_append else t, k, v, ())
                for o, t, k, v, _ in out]


cdef tuple decode_legacy_message(object source, Py_ssize_t position):
    """(offset, timestamp, key, value, attributes) of the message at ``position``, its CRC
    checked; bounds were checked by the caller for the top level and here for the inside."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef const uint8_t* p
    cdef int32_t size, klen, vlen
    cdef Py_ssize_t pos, end
    cdef int8_t magic
    cdef int64_t ts = -1
    cdef uint32_t crc, computed
    view_open(source, &v, &pybuf)
    try:
        if position < 0 or v.size - position < LEGACY_HEADER_SIZE + V0_MIN_MESSAGE:
            raise TruncatedDataError("message runs past the end of the buffer", position)
        p = v.data + position
        size = get_i32(p + 8)
        if size < V0_MIN_MESSAGE or size > v.size - position - LEGACY_HEADER_SIZE:
            raise InvalidLengthError(f"message size {size} is out of range", position)
        end = position + LEGACY_HEADER_SIZE + size
        magic = <int8_t>p[16]
        if magic > 1 or magic < 0:
            raise UnsupportedMagicError(f"message magic {magic} inside a legacy message set",
                                        position)
        if magic == 1 and size < V1_MIN_MESSAGE:
            raise InvalidLengthError(f"message size {size} is too small for magic 1", position)
        crc = <uint32_t>get_i32(p + 12)
        computed = kcore_crc32_ieee(0, p + 16, size - 4)
        if crc != computed:
            raise CrcMismatchError(
                f"message CRC is {crc:#010x} but its bytes give {computed:#010x}", position)
        pos = position + 18
        if magic == 1:
            ts = get_i64(v.data + pos)
            pos += 8
        klen = get_i32(v.data + pos)
        pos += 4
        if klen < -1 or klen > end - pos:
            raise InvalidLengthError("message key length is out of range", pos - 4)
        key = None if klen < 0 else PyBytes_FromStringAndSize(<const char*>v.data + pos, klen)
        if klen > 0:
            pos += klen
        if end - pos < 4:
            raise TruncatedDataError("message value length is truncated", pos)
        vlen = get_i32(v.data + pos)
        pos += 4
        if vlen < -1 or vlen > end - pos:
            raise InvalidLengthError("message value length is out of range", pos - 4)
        value = None if vlen < 0 else PyBytes_FromStringAndSize(<const char*>v.data + pos, vlen)
        return (get_i64(p), ts, key, value, p[17])
    finally:
        view_close(&v, &pybuf)


cdef Py_ssize_t check_batch_at(const uint8_t* data, Py_ssize_t size, Py_ssize_t pos,
                               bint allow_partial, bint check_crc) except -2:
    """The length of the batch or message starting at ``pos``, validated (CRC included);
    -1 for a partial trailing one when ``allow_partial``."""
    cdef const uint8_t* p = data + pos
    cdef int32_t length
    cdef uint32_t stored, computed
    cdef int magic
    if size - pos < 17:
        if allow_partial:
            return -1
        raise TruncatedDataError("record batch header is truncated", pos)
    length = get_i32(p + 8)
    magic = p[16]
    if magic == 2:
        if length < BATCH_HEADER_SIZE - 12:
            raise InvalidLengthError(f"record batch length {length} is too small", pos)
    elif magic == 0 or magic == 1:
        if length < (V0_MIN_MESSAGE if magic == 0 else V1_MIN_MESSAGE):
            raise InvalidLengthError(f"message size {length} is too small", pos)
    else:
        raise UnsupportedMagicError(f"record batch magic {magic} is not supported", pos)
    if length > size - pos - 12:
        if allow_partial:
            return -1
        raise TruncatedDataError(
            f"record batch of {length + 12} bytes runs past the end of the buffer", pos)
    if magic == 2 and check_crc:
        stored = <uint32_t>get_i32(p + CRC_OFFSET)
        computed = kcore_crc32c(0, p + ATTRIBUTES_OFFSET, length + 12 - ATTRIBUTES_OFFSET)
        if stored != computed:
            raise CrcMismatchError(
                f"record batch CRC is {stored:#010x} but its bytes give {computed:#010x}", pos)
    return length + 12


cdef RecordBatch batch_at(object buf, const uint8_t* p, Py_ssize_t pos, Py_ssize_t length,
                          Py_ssize_t max_decompressed_size):
    """The v2 batch at ``p`` (``pos`` in ``buf``), ``length`` bytes, checked by
    check_batch_at."""
    cdef RecordBatch batch = RecordBatch.__new__(RecordBatch)
    batch.base_offset = get_i64(p)
    batch.partition_leader_epoch = get_i32(p + 12)
    batch.magic = 2
    batch.crc = <uint32_t>get_i32(p + CRC_OFFSET)
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
    batch.position = pos
    batch.size_in_bytes = length
    batch._source = buf
    batch._max_decompressed = max_decompressed_size
    return batch


DEF MIN_ENTRY_LENGTH = 14  # the shortest length field of a batch or message (magic 0, empty)


def scan_complete_batches(object buf, list epochs=None):
    """``(end, size)``: the offset after the last complete batch (or legacy message) at the
    start of ``buf`` (-1: none) and the bytes the complete ones take, read from their headers
    alone (base offset, length, magic and, in magic 2, the last offset delta; a magic 0/1
    entry ends at its own offset). ``epochs`` gets (last offset, leader epoch) of each run of
    batches with one partition leader epoch (-1 for magic 0/1). A length no batch has ends the
    scan (the decoder reports it). None when an offset is too near the int64 limits to add to
    (garbage; the caller may scan in Python)."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef Py_ssize_t pos = 0, n
    cdef const uint8_t* p
    cdef int32_t length, epoch
    cdef int64_t base, last, end = -1
    view_open(buf, &v, &pybuf)
    try:
        while v.size - pos >= 12:
            p = v.data + pos
            length = get_i32(p + 8)
            if length < MIN_ENTRY_LENGTH or length > v.size - pos - 12:
                break
            base = get_i64(p)
            if base > INT64_MAX - 0x80000001 or base < INT64_MIN + 0x80000001:
                return None
            epoch = -1
            if length >= 15 and p[16] == 2:  # magic 2: lastOffsetDelta at 23
                last = base + get_i32(p + 23)
                epoch = get_i32(p + 12)
            else:
                last = base
            if last + 1 > end:
                end = last + 1
            if epochs is not None:
                n = len(epochs)
                if n and epochs[n - 1][1] == epoch:
                    epochs[n - 1] = (end - 1, epoch)
                else:
                    epochs.append((end - 1, epoch))
            pos += 12 + length
    finally:
        view_close(&v, &pybuf)
    return end, pos


def decode_batches(object buf, bint allow_partial=False, *, bint check_crcs=True,
                   Py_ssize_t max_decompressed_size=DEFAULT_MAX_DECOMPRESSED_SIZE):
    """Decode every batch in ``buf`` (v2 batches and magic 0/1 messages, as a Fetch response's
    records hold them). A trailing partial batch (which Fetch responses may end with) is
    ignored when ``allow_partial`` is true and raises otherwise. The batches refer to ``buf``
    without copying it. ``check_crcs`` (Java's check.crcs) verifies each v2 batch's CRC32C;
    legacy messages' CRCs are checked when their records are read."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef Py_ssize_t pos = 0, length
    cdef const uint8_t* p
    cdef LegacyBatch legacy
    cdef list out = []
    if max_decompressed_size < 0:
        raise ValueError("max_decompressed_size must not be negative")
    view_open(buf, &v, &pybuf)
    try:
        while pos < v.size:
            length = check_batch_at(v.data, v.size, pos, allow_partial, check_crcs)
            if length < 0:
                break
            p = v.data + pos
            if p[16] == 2:
                out.append(batch_at(buf, p, pos, length, max_decompressed_size))
            else:
                legacy = LegacyBatch.__new__(LegacyBatch)
                legacy.last_offset = get_i64(p)
                legacy.crc = <uint32_t>get_i32(p + 12)
                legacy.magic = <int8_t>p[16]
                legacy.attributes = <int8_t>p[17]
                legacy.timestamp = get_i64(p + 18) if legacy.magic == 1 else -1
                legacy.position = pos
                legacy.size_in_bytes = length
                legacy._source = buf
                legacy._max_decompressed = max_decompressed_size
                out.append(legacy)
            pos += length
    finally:
        view_close(&v, &pybuf)
    return out


def decode_records(object buf, bint allow_partial=True, int64_t min_offset=-1,
                   bint skip_control=True,
                   Py_ssize_t max_decompressed_size=DEFAULT_MAX_DECOMPRESSED_SIZE, *,
                   bint check_crcs=True, object record_type=None, object topic=None,
                   object partition=None):
    """Every record in ``buf`` as ``(offset, timestamp_ms, key, value, headers)``, skipping
    records before ``min_offset`` and (by default) control batches. With ``record_type`` (a
    tuple subclass of 7 fields), each record is made as ``record_type(topic, partition,
    offset, timestamp_ms, key, value, headers)`` instead."""
    cdef list out = []
    for batch in decode_batches(buf, allow_partial, check_crcs=check_crcs,
                                max_decompressed_size=max_decompressed_size):
        if skip_control and batch.is_control:
            continue
        if min_offset >= 0 and batch.next_offset <= min_offset:
            continue
        if record_type is not None:
            out.extend(batch.records_as(record_type, topic, partition, min_offset))
            continue
        records = batch.records()
        if min_offset >= 0 and records and records[0][0] < min_offset:
            records = [r for r in records if r[0] >= min_offset]
        if not out:
            out = records  # the first batch's list is the result: no copy of it
        else:
            out.extend(records)
    return out
