# Columnar decode: records straight into contiguous column buffers (offsets, timestamps, key and
# value offsets + data, validity bitmaps, headers), which pyarrow wraps without copying. No
# Python object is made per record.

cdef inline int bitmap_append(OutBuf* bm, Py_ssize_t index, bint valid) except -1:
    if (index & 7) == 0:
        out_reserve(bm, 1)
        bm.data[bm.size] = 0
        bm.size += 1
    if valid:
        bm.data[index >> 3] |= <uint8_t>(1 << (index & 7))
    return 0


cdef inline int binary_append(OutBuf* offs, OutBuf* data, OutBuf* bm, Py_ssize_t index,
                              const uint8_t* p, Py_ssize_t n, Py_ssize_t* nulls) except -1:
    cdef int32_t end
    bitmap_append(bm, index, n >= 0)
    if n < 0:
        nulls[0] += 1
    else:
        out_write(data, p, n)
    if data.size > 0x7FFFFFFF:
        raise ValueError("a column's data passed 2 GiB; decode fewer batches at a time")
    end = <int32_t>data.size
    out_write(offs, &end, 4)
    return 0


cdef inline void reserved_binary(OutBuf* offs, OutBuf* data, OutBuf* bm, Py_ssize_t index,
                                 const uint8_t* p, Py_ssize_t n, Py_ssize_t* nulls) noexcept:
    # The caller reserved room (ColumnarRecords.reserve); only the bitmap may need a new byte,
    # and reserve counted that too.
    if (index & 7) == 0:
        bm.data[bm.size] = 0
        bm.size += 1
    if n >= 0:
        bm.data[index >> 3] |= <uint8_t>(1 << (index & 7))
        memcpy(data.data + data.size, p, n)
        data.size += n
    else:
        nulls[0] += 1
    (<int32_t*>(offs.data + offs.size))[0] = <int32_t>data.size
    offs.size += 4


cdef inline int check_utf8(const uint8_t* p, Py_ssize_t n, Py_ssize_t position) except -1:
    """Header keys are strings: ASCII passes at once; anything else must decode as UTF-8."""
    cdef Py_ssize_t i
    for i in range(n):
        if p[i] & 0x80:
            try:
                PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
            except UnicodeDecodeError:
                raise CorruptRecordError("header key is not UTF-8", position) from None
            return 0
    return 0


cdef class ColumnarRecords:
    """The records of one or more batches, column by column. Every buffer exposes the buffer
    protocol; :meth:`to_arrow` wraps them in a ``pyarrow.RecordBatch`` without copying."""

    cdef readonly Py_ssize_t num_rows
    cdef readonly ColumnBuffer offset, timestamp, timestamp_type
    cdef readonly ColumnBuffer key_offsets, key_data, key_validity
    cdef readonly ColumnBuffer value_offsets, value_data, value_validity
    cdef readonly ColumnBuffer header_offsets, header_key_offsets, header_key_data
    cdef readonly ColumnBuffer header_value_offsets, header_value_data, header_value_validity
    cdef readonly Py_ssize_t key_nulls, value_nulls, header_value_nulls, num_headers
    cdef readonly bint include_headers
    cdef int64_t ts_scale
    # With_source (append_from): each row's topic and partition too, as Spark's columns.
    cdef readonly bint with_source
    cdef readonly ColumnBuffer partition, topic_offsets, topic_data

    def __cinit__(self):
        self.offset = ColumnBuffer()
        self.timestamp = ColumnBuffer()
        self.timestamp_type = ColumnBuffer()
        self.key_offsets = ColumnBuffer()
        self.key_data = ColumnBuffer()
        self.key_validity = ColumnBuffer()
        self.value_offsets = ColumnBuffer()
        self.value_data = ColumnBuffer()
        self.value_validity = ColumnBuffer()
        self.header_offsets = ColumnBuffer()
        self.header_key_offsets = ColumnBuffer()
        self.header_key_data = ColumnBuffer()
        self.header_value_offsets = ColumnBuffer()
        self.header_value_data = ColumnBuffer()
        self.header_value_validity = ColumnBuffer()
        self.partition = ColumnBuffer()
        self.topic_offsets = ColumnBuffer()
        self.topic_data = ColumnBuffer()
        cdef int32_t zero = 0
        out_write(&self.key_offsets.buf, &zero, 4)
        out_write(&self.value_offsets.buf, &zero, 4)
        out_write(&self.header_offsets.buf, &zero, 4)
        out_write(&self.header_key_offsets.buf, &zero, 4)
        out_write(&self.header_value_offsets.buf, &zero, 4)
        out_write(&self.topic_offsets.buf, &zero, 4)
        self.ts_scale = 1

    cdef int presize(self, list batches) except -1:
        """One (pooled) allocation per column for all of ``batches``, sized from their headers
        (uncompressed sizes are known; compressed batches grow the buffers later)."""
        cdef Py_ssize_t records = 0, data = 0
        for b in batches:
            if isinstance(b, RecordBatch):
                # Counts are checked against the bytes later; do not pre-allocate for a lie.
                records += min((<RecordBatch>b).record_count,
                               (<RecordBatch>b).size_in_bytes // MIN_RECORD_SIZE)
                data += (<RecordBatch>b).size_in_bytes
            else:
                records += 1
                data += (<LegacyBatch>b).size_in_bytes
        buf_presize(&self.offset.buf, records * 8)
        buf_presize(&self.timestamp.buf, records * 8)
        buf_presize(&self.timestamp_type.buf, records * 4)
        buf_presize(&self.key_offsets.buf, records * 4 + 4)
        buf_presize(&self.value_offsets.buf, records * 4 + 4)
        buf_presize(&self.key_validity.buf, records // 8 + 1)
        buf_presize(&self.value_validity.buf, records // 8 + 1)
        buf_presize(&self.value_data.buf, data)
        return 0

    cdef int reserve(self, Py_ssize_t records, Py_ssize_t payload_size) except -1:
        """Grow every buffer once for a batch, so the per-record appends do not reallocate:
        keys and values together are no larger than the batch's records section."""
        if max(self.key_data.buf.size, self.value_data.buf.size) + payload_size > 0x7FFFFFFF:
            raise ValueError("a column's data passed 2 GiB; decode fewer batches at a time")
        buf_grow(&self.offset.buf, records * 8)
        buf_grow(&self.timestamp.buf, records * 8)
        buf_grow(&self.timestamp_type.buf, records * 4)
        buf_grow(&self.key_offsets.buf, records * 4)
        buf_grow(&self.value_offsets.buf, records * 4)
        buf_grow(&self.key_validity.buf, records // 8 + 1)
        buf_grow(&self.value_validity.buf, records // 8 + 1)
        buf_grow(&self.value_data.buf, payload_size)
        buf_grow(&self.key_data.buf, payload_size)
        if self.include_headers:
            buf_grow(&self.header_offsets.buf, records * 4)
        return 0

    cdef inline void add_reserved(self, int64_t offset, int64_t ts, int32_t ts_type,
                                  const uint8_t* key, Py_ssize_t klen, const uint8_t* value,
                                  Py_ssize_t vlen) noexcept:
        """Append one record, for which ``reserve`` has made room: plain stores, no capacity
        checks (keys and values fit the reserved size)."""
        cdef Py_ssize_t row = self.num_rows
        (<int64_t*>self.offset.buf.data)[row] = offset
        (<int64_t*>self.timestamp.buf.data)[row] = ts * self.ts_scale if ts >= 0 else ts
        (<int32_t*>self.timestamp_type.buf.data)[row] = ts_type
        self.offset.buf.size += 8
        self.timestamp.buf.size += 8
        self.timestamp_type.buf.size += 4
        reserved_binary(&self.key_offsets.buf, &self.key_data.buf, &self.key_validity.buf, row,
                        key, klen, &self.key_nulls)
        reserved_binary(&self.value_offsets.buf, &self.value_data.buf, &self.value_validity.buf,
                        row, value, vlen, &self.value_nulls)
        self.num_rows = row + 1

    cdef inline int add_parsed(self, const uint8_t* data, RecordView* r, int64_t offset,
                               int64_t ts, int32_t ts_type, Py_ssize_t base) except -1:
        """Append one record ``parse_record`` read from ``data`` (its batch reserved for),
        with its headers when the columns have them."""
        self.add_reserved(offset, ts, ts_type, r.key, r.klen, r.value, r.vlen)
        if self.include_headers:
            if r.header_count == 0:
                # Most records carry no headers: their list offset repeats, and reserve() made
                # room for it.
                (<int32_t*>(self.header_offsets.buf.data
                            + self.header_offsets.buf.size))[0] = <int32_t>self.num_headers
                self.header_offsets.buf.size += 4
            else:
                self.add_headers(data, r, base)
        return 0

    cdef int add_headers(self, const uint8_t* p, RecordView* r, Py_ssize_t base) except -1:
        cdef Py_ssize_t pos = r.headers_pos, hklen, hvlen
        cdef const uint8_t* hk
        cdef const uint8_t* hv
        cdef int32_t j, end
        for j in range(r.header_count):
            parse_header(p, r.end, &pos, &hk, &hklen, &hv, &hvlen, base)
            check_utf8(hk, hklen, base + pos)
            out_write(&self.header_key_data.buf, hk, hklen)
            end = <int32_t>self.header_key_data.buf.size
            out_write(&self.header_key_offsets.buf, &end, 4)
            binary_append(&self.header_value_offsets.buf, &self.header_value_data.buf,
                          &self.header_value_validity.buf, self.num_headers, hv, hvlen,
                          &self.header_value_nulls)
            self.num_headers += 1
        end = <int32_t>self.num_headers
        out_write(&self.header_offsets.buf, &end, 4)
        return 0

    cdef int add_header_objects(self, object headers) except -1:
        cdef int32_t end
        for hkey, hval in headers:
            hk = hkey.encode("utf-8")
            out_write(&self.header_key_data.buf, PyBytes_AS_STRING(hk), len(hk))
            end = <int32_t>self.header_key_data.buf.size
            out_write(&self.header_key_offsets.buf, &end, 4)
            if hval is None:
                binary_append(&self.header_value_offsets.buf, &self.header_value_data.buf,
                              &self.header_value_validity.buf, self.num_headers, NULL, -1,
                              &self.header_value_nulls)
            else:
                binary_append(&self.header_value_offsets.buf, &self.header_value_data.buf,
                              &self.header_value_validity.buf, self.num_headers,
                              <const uint8_t*>PyBytes_AS_STRING(hval), len(hval),
                              &self.header_value_nulls)
            self.num_headers += 1
        end = <int32_t>self.num_headers
        out_write(&self.header_offsets.buf, &end, 4)
        return 0

    cdef void mark(self, Py_ssize_t* m) noexcept:
        """Every size and count that appending changes, for :meth:`rewind`."""
        cdef ColumnBuffer b
        cdef int i = 0
        for b in (self.offset, self.timestamp, self.timestamp_type, self.key_offsets,
                  self.key_data, self.key_validity, self.value_offsets, self.value_data,
                  self.value_validity, self.header_offsets, self.header_key_offsets,
                  self.header_key_data, self.header_value_offsets, self.header_value_data,
                  self.header_value_validity, self.partition, self.topic_offsets,
                  self.topic_data):
            m[i] = b.buf.size
            i += 1
        m[18] = self.num_rows
        m[19] = self.key_nulls
        m[20] = self.value_nulls
        m[21] = self.header_value_nulls
        m[22] = self.num_headers

    cdef void rewind(self, Py_ssize_t* m) noexcept:
        """Back to a :meth:`mark`: the rows appended since are gone (their validity bits
        cleared, as the next appends expect)."""
        cdef ColumnBuffer b
        cdef int i = 0
        for b in (self.offset, self.timestamp, self.timestamp_type, self.key_offsets,
                  self.key_data, self.key_validity, self.value_offsets, self.value_data,
                  self.value_validity, self.header_offsets, self.header_key_offsets,
                  self.header_key_data, self.header_value_offsets, self.header_value_data,
                  self.header_value_validity, self.partition, self.topic_offsets,
                  self.topic_data):
            b.buf.size = m[i]
            i += 1
        self.num_rows = m[18]
        self.key_nulls = m[19]
        self.value_nulls = m[20]
        self.header_value_nulls = m[21]
        self.num_headers = m[22]
        for b, i in ((self.key_validity, self.num_rows), (self.value_validity, self.num_rows),
                     (self.header_value_validity, self.num_headers)):
            if i & 7 and b.buf.size:
                b.buf.data[i >> 3] &= <uint8_t>((1 << (i & 7)) - 1)

    cdef int add_source(self, Py_ssize_t rows, const uint8_t* topic, Py_ssize_t tlen,
                        int32_t partition) except -1:
        """The topic and partition of the last ``rows`` rows."""
        cdef Py_ssize_t i
        cdef int32_t end
        buf_grow(&self.partition.buf, rows * 4)
        buf_grow(&self.topic_offsets.buf, rows * 4)
        buf_grow(&self.topic_data.buf, rows * tlen)
        if self.topic_data.buf.size + rows * tlen > 0x7FFFFFFF:
            raise ValueError("a column's data passed 2 GiB; decode fewer batches at a time")
        for i in range(rows):
            (<int32_t*>(self.partition.buf.data + self.partition.buf.size))[0] = partition
            self.partition.buf.size += 4
            memcpy(self.topic_data.buf.data + self.topic_data.buf.size, topic, tlen)
            self.topic_data.buf.size += tlen
            end = <int32_t>self.topic_data.buf.size
            (<int32_t*>(self.topic_offsets.buf.data + self.topic_offsets.buf.size))[0] = end
            self.topic_offsets.buf.size += 4
        return 0

    cdef Py_ssize_t append_batch(self, RecordBatch batch, int64_t min_offset, Py_ssize_t room,
                                 int64_t* stopped_at) except -1:
        """The records of ``batch`` (decompressed first if need be), as
        :meth:`append_records`."""
        cdef ByteView v
        cdef Py_buffer pybuf
        payload = batch.payload()
        view_open(payload, &v, &pybuf)
        try:
            return self.append_records(
                v.data, v.size, batch.position + BATCH_HEADER_SIZE, batch.position,
                batch.base_offset, batch.record_count, batch.base_timestamp,
                batch.max_timestamp, batch.attributes & ATTR_TIMESTAMP_TYPE, min_offset, room,
                stopped_at)
        finally:
            view_close(&v, &pybuf)

    cdef Py_ssize_t append_records(self, const uint8_t* data, Py_ssize_t size, Py_ssize_t base,
                                   Py_ssize_t batch_position, int64_t base_offset,
                                   int32_t record_count, int64_t base_timestamp,
                                   int64_t max_timestamp, bint log_append, int64_t min_offset,
                                   Py_ssize_t room, int64_t* stopped_at) except -1:
        """The records of a v2 batch's (uncompressed) records section ``data`` (at ``base``
        in the input, for error positions) at or after ``min_offset``, at most ``room`` of
        them; ``stopped_at``: the offset of the first one left out for want of room (else
        -1)."""
        cdef Py_ssize_t pos = 0, added = 0
        cdef int32_t i, ts_type = 1 if log_append else 0
        cdef int64_t ts, offset
        cdef RecordView r
        stopped_at[0] = -1
        check_record_count(record_count, size, batch_position)
        self.reserve(min(record_count, room), size)
        for i in range(record_count):
            parse_record(data, size, &pos, &r, base)
            offset = base_offset + r.offset_delta
            if min_offset >= 0 and offset < min_offset:
                continue
            if added == room:
                stopped_at[0] = offset
                return added
            ts = max_timestamp if log_append else base_timestamp + r.ts_delta
            self.add_parsed(data, &r, offset, ts, ts_type, base)
            added += 1
        if pos != size:
            raise CorruptRecordError(
                f"{size - pos} bytes left after the batch's {record_count} records", base + pos)
        return added

    cdef Py_ssize_t append_plain(self, const uint8_t* p, Py_ssize_t pos, Py_ssize_t length,
                                 bint skip_control, int64_t min_offset, Py_ssize_t room,
                                 int64_t* stopped_at) except -1:
        """An uncompressed v2 batch at ``p`` (``pos`` in the input, ``length`` bytes, checked
        by check_batch_at), as :meth:`append_batch`."""
        cdef int16_t attributes = get_i16(p + 21)
        cdef int64_t base_offset = get_i64(p)
        cdef int32_t record_count = get_i32(p + 57)
        stopped_at[0] = -1
        if record_count < 0:
            raise InvalidLengthError("negative record count", pos + 57)
        if skip_control and attributes & ATTR_CONTROL:
            return 0
        if min_offset >= 0 and base_offset + get_i32(p + 23) + 1 <= min_offset:
            return 0
        if record_count == 0:  # as RecordBatch.payload: an empty batch has no records
            return 0
        return self.append_records(
            p + BATCH_HEADER_SIZE, length - BATCH_HEADER_SIZE, pos + BATCH_HEADER_SIZE, pos,
            base_offset, record_count, get_i64(p + 27), get_i64(p + 35),
            attributes & ATTR_TIMESTAMP_TYPE, min_offset, room, stopped_at)

    def reserve_values(self, Py_ssize_t nbytes):
        """Room for ``nbytes`` more value bytes in one allocation, for the append_from calls
        to come (growing as they go would copy what is there at every doubling). Rounded up
        to a power of two: the pool then holds few sizes, and a call wanting a little more
        than the last still finds a block whose pages are already faulted in."""
        cdef Py_ssize_t want = self.value_data.buf.size + nbytes, cap = 4096
        if nbytes <= 0:
            return
        while cap < want and cap < (PY_SSIZE_T_MAX >> 1):
            cap <<= 1
        buf_presize(&self.value_data.buf, max(cap, want))

    def append_from(self, object buf, Py_ssize_t start=0, *, int64_t min_offset=-1,
                    Py_ssize_t max_rows=-1, str topic="", int32_t partition=0,
                    bint skip_control=True, bint check_crcs=True,
                    Py_ssize_t max_decompressed_size=DEFAULT_MAX_DECOMPRESSED_SIZE):
        """Append the records of the batches in ``buf`` from byte ``start`` on (a trailing
        partial batch is left alone) at or after ``min_offset``, at most ``max_rows`` of them
        (all when negative), each with ``topic`` and ``partition`` (Spark's columns: from now
        on :meth:`to_arrow` has them). Each batch's CRC32C is checked as it is reached.

        Returns ``(rows, position, stopped_at, last_offset)``: ``stopped_at`` is -1 when every
        record was appended; else the offset of the first left out, and ``position`` where
        its batch starts (the next call goes on from there); ``last_offset``: the offset of
        the last row appended (-1: none). On an error, the rows of the batch at
        fault are taken out again, and the error gets ``resume_position`` (where that batch
        starts) and ``resume_offset`` (the offset after the rows appended before it, or
        ``min_offset``) attributes: a call from there raises it again."""
        cdef ByteView v
        cdef Py_buffer pybuf
        cdef Py_ssize_t pos = start, length, added = 0, n
        cdef Py_ssize_t mark[23]
        cdef const uint8_t* p
        cdef int64_t stopped = -1, next_offset = min_offset
        cdef RecordBatch batch
        cdef bytes topic_bytes = topic.encode("utf-8")
        if not self.with_source:
            raise ValueError("append_from is for the records of columnar_records()")
        if max_rows < 0:
            max_rows = PY_SSIZE_T_MAX
        view_open(buf, &v, &pybuf)
        try:
            if start < 0 or start > v.size:
                raise ValueError("start is outside the buffer")
            while pos < v.size:
                self.mark(mark)
                try:
                    length = check_batch_at(v.data, v.size, pos, True, check_crcs)
                    if length < 0:
                        pos = v.size
                        break
                    p = v.data + pos
                    if p[16] != 2:
                        n = self.append_legacy(buf, pos, length, min_offset, max_rows - added,
                                               max_decompressed_size, &stopped)
                    elif get_i16(p + 21) & 0x07 == CODEC_NONE:
                        # Uncompressed (most fetched data): straight from the input, no
                        # batch object or view made per batch.
                        n = self.append_plain(p, pos, length, skip_control, min_offset,
                                              max_rows - added, &stopped)
                    else:
                        batch = batch_at(buf, p, pos, length, max_decompressed_size)
                        if skip_control and batch.attributes & ATTR_CONTROL:
                            n = 0
                        elif min_offset >= 0 and batch.next_offset <= min_offset:
                            n = 0
                        else:
                            n = self.append_batch(batch, min_offset, max_rows - added, &stopped)
                    if n:
                        self.add_source(n, <const uint8_t*>PyBytes_AS_STRING(topic_bytes),
                                        len(topic_bytes), partition)
                except BaseException as exc:
                    self.rewind(mark)
                    if isinstance(exc, Exception):
                        exc.resume_position = pos
                        exc.resume_offset = next_offset
                    raise
                added += n
                if n:
                    next_offset = self.last_offset() + 1
                if stopped >= 0:
                    return added, pos, stopped, next_offset - 1 if added else -1
                pos += length
        finally:
            view_close(&v, &pybuf)
        return added, pos, -1, next_offset - 1 if added else -1

    def append_acquired(self, RecordBatch batch, list ranges, list gaps, ColumnBuffer counts,
                        str topic, int32_t partition):
        """The records of ``batch`` inside ``ranges`` (as ``RecordBatch.acquired_records``
        takes them: what a ShareFetch acquired), appended as rows with ``topic`` and
        ``partition``, each one's delivery count appended to ``counts`` (int32, for
        :meth:`to_arrow`'s extra column). The offsets of the batch's span inside ``ranges``
        that hold no record are appended to ``gaps``. Returns the number of rows appended;
        on an error, none of this batch's rows (nor their counts) are."""
        cdef ByteView v
        cdef Py_buffer pybuf
        cdef Py_ssize_t pos = 0, base, added = 0, counts_size = counts.buf.size
        cdef Py_ssize_t gaps_size = len(gaps)
        cdef Py_ssize_t mark[23]
        cdef int32_t i, ts_type = 1 if batch.attributes & ATTR_TIMESTAMP_TYPE else 0
        cdef int where
        cdef int64_t ts, o
        cdef RecordView r
        cdef AcquiredCursor c
        cdef bytes topic_bytes = topic.encode("utf-8")
        if not self.with_source:
            raise ValueError("append_acquired is for the records of columnar_records()")
        self.mark(mark)
        acquired_start(ranges, batch.base_offset, &c)
        try:
            payload = batch.payload()
            base = batch.position + BATCH_HEADER_SIZE
            view_open(payload, &v, &pybuf)
            try:
                check_record_count(batch.record_count, v.size, batch.position)
                self.reserve(batch.record_count, v.size)
                buf_grow(&counts.buf, <Py_ssize_t>batch.record_count * 4)
                for i in range(batch.record_count):
                    parse_record(v.data, v.size, &pos, &r, base)
                    o = batch.base_offset + r.offset_delta
                    where = acquired_step(ranges, &c, o, gaps)
                    if where < 0:
                        break  # past the last range: the rest is another member's
                    if not where:
                        continue
                    ts = batch.max_timestamp if ts_type else batch.base_timestamp + r.ts_delta
                    self.add_parsed(v.data, &r, o, ts, ts_type, base)
                    (<int32_t*>(counts.buf.data + counts.buf.size))[0] = c.count
                    counts.buf.size += 4
                    added += 1
                else:
                    if pos != v.size:
                        raise CorruptRecordError(
                            f"{v.size - pos} bytes left after the batch's {batch.record_count} "
                            "records", base + pos)
            finally:
                view_close(&v, &pybuf)
            acquired_finish(ranges, &c, batch.base_offset + batch.last_offset_delta, gaps)
            if added:
                self.add_source(added, <const uint8_t*>PyBytes_AS_STRING(topic_bytes),
                                len(topic_bytes), partition)
        except BaseException:
            self.rewind(mark)
            counts.buf.size = counts_size
            del gaps[gaps_size:]
            raise
        return added

    cdef int64_t last_offset(self) noexcept:
        return (<int64_t*>self.offset.buf.data)[self.num_rows - 1]

    cdef Py_ssize_t append_legacy(self, object buf, Py_ssize_t pos, Py_ssize_t length,
                                  int64_t min_offset, Py_ssize_t room,
                                  Py_ssize_t max_decompressed_size,
                                  int64_t* stopped_at) except -1:
        """A magic 0/1 message (or compressed wrapper) of ``buf`` at ``pos``, as
        :meth:`append_batch`."""
        cdef LegacyBatch b = LegacyBatch.__new__(LegacyBatch)
        cdef Py_ssize_t added = 0, klen, vlen
        cdef const uint8_t* p
        cdef ByteView v
        cdef Py_buffer pybuf
        stopped_at[0] = -1
        view_open(buf, &v, &pybuf)
        try:
            p = v.data + pos
            b.last_offset = get_i64(p)
            b.crc = <uint32_t>get_i32(p + 12)
            b.magic = <int8_t>p[16]
            b.attributes = <int8_t>p[17]
            b.timestamp = get_i64(p + 18) if b.magic == 1 else -1
        finally:
            view_close(&v, &pybuf)
        b.position = pos
        b.size_in_bytes = length
        b._source = buf
        b._max_decompressed = max_decompressed_size
        if min_offset >= 0 and b.next_offset <= min_offset:
            return 0
        ts_type = b.timestamp_type
        for offset, ts, key, value, headers in b.records():
            if min_offset >= 0 and offset < min_offset:
                continue
            if added == room:
                stopped_at[0] = offset
                return added
            klen = -1 if key is None else len(key)
            vlen = -1 if value is None else len(value)
            self.reserve(1, max(klen, 0) + max(vlen, 0))
            self.add_reserved(
                offset, ts, ts_type,
                NULL if key is None else <const uint8_t*>PyBytes_AS_STRING(key), klen,
                NULL if value is None else <const uint8_t*>PyBytes_AS_STRING(value), vlen)
            self.add_header_objects(())
            added += 1
        return added

    def to_arrow(self, ColumnBuffer extra=None, str extra_name=None):
        """A ``pyarrow.RecordBatch`` with the columns of Spark's Kafka source that the records
        themselves carry: key, value, offset, timestamp, timestampType (and headers, and topic
        and partition after value when ``with_source``), then ``extra_name``: the int32 values
        of ``extra`` (one a row), if given. One import through the Arrow C data interface
        (ArrowColumns); the buffers are not copied."""
        import pyarrow as pa

        return pa.record_batch(ArrowColumns(self, extra, extra_name))

    def to_arrow_by_columns(self):
        """:meth:`to_arrow` made the other way, a pyarrow call per buffer and column: the
        reference the export is tested against."""
        import pyarrow as pa

        n = self.num_rows
        ts_unit = "ms" if self.ts_scale == 1 else "us"
        key = pa.Array.from_buffers(
            pa.binary(), n,
            [pa.py_buffer(self.key_validity) if self.key_nulls else None,
             pa.py_buffer(self.key_offsets), pa.py_buffer(self.key_data)],
            null_count=self.key_nulls)
        value = pa.Array.from_buffers(
            pa.binary(), n,
            [pa.py_buffer(self.value_validity) if self.value_nulls else None,
             pa.py_buffer(self.value_offsets), pa.py_buffer(self.value_data)],
            null_count=self.value_nulls)
        offset = pa.Array.from_buffers(pa.int64(), n, [None, pa.py_buffer(self.offset)])
        timestamp = pa.Array.from_buffers(pa.timestamp(ts_unit, tz="UTC"), n,
                                          [None, pa.py_buffer(self.timestamp)])
        ts_type = pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(self.timestamp_type)])
        arrays = [key, value, offset, timestamp, ts_type]
        names = ["key", "value", "offset", "timestamp", "timestampType"]
        if self.with_source:  # Spark's order: key, value, topic, partition, offset, ...
            arrays[2:2] = [
                pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(self.topic_offsets),
                                                      pa.py_buffer(self.topic_data)]),
                pa.Array.from_buffers(pa.int32(), n, [None, pa.py_buffer(self.partition)]),
            ]
            names[2:2] = ["topic", "partition"]
        if self.include_headers:
            h = self.num_headers
            hkey = pa.Array.from_buffers(
                pa.string(), h,
                [None, pa.py_buffer(self.header_key_offsets), pa.py_buffer(self.header_key_data)])
            hval = pa.Array.from_buffers(
                pa.binary(), h,
                [pa.py_buffer(self.header_value_validity) if self.header_value_nulls else None,
                 pa.py_buffer(self.header_value_offsets), pa.py_buffer(self.header_value_data)],
                null_count=self.header_value_nulls)
            pairs = pa.StructArray.from_arrays([hkey, hval], names=["key", "value"])
            headers = pa.ListArray.from_arrays(
                pa.Array.from_buffers(pa.int32(), n + 1, [None, pa.py_buffer(self.header_offsets)]),
                pairs)
            arrays.append(headers)
            names.append("headers")
        return pa.RecordBatch.from_arrays(arrays, names=names)


def columnar_records():
    """An empty :class:`ColumnarRecords` for :meth:`ColumnarRecords.append_from`: its
    ``to_arrow`` has Spark's Kafka source columns (key, value, topic, partition, offset,
    timestamp, timestampType, headers), with no rows as with many."""
    cdef ColumnarRecords cols = ColumnarRecords()
    cols.with_source = True
    cols.include_headers = True
    return cols


def record_columns(list records, Py_ssize_t count_field=-1):
    """Records already made, as ``records_as`` and ``acquired_records`` make them (tuples of
    topic, partition, offset, timestamp_ms, key, value, headers, then for a share record its
    delivery count and timestamp type), as a :class:`ColumnarRecords` with the source
    columns (``to_arrow`` as :func:`columnar_records`'), in one pass with no Python object
    per value. Returns ``(columns, counts)``: ``counts`` holds the int32 field
    ``count_field`` of each record (none when it is negative). A record's ninth field, when
    it has one, is its timestamp type (else 0)."""
    cdef ColumnarRecords cols = columnar_records()
    cdef ColumnBuffer counts = ColumnBuffer()
    cdef Py_ssize_t n = len(records), total = 0, klen, vlen, run = 0, i
    cdef Py_ssize_t min_fields = max(7, count_field + 1)
    cdef int32_t ts_type, count, run_partition = 0
    cdef object run_topic = None
    cdef bytes topic_bytes = b""
    for rec in records:  # checked first: a bad record leaves nothing half-appended
        if not PyTuple_Check(rec) or PyTuple_GET_SIZE(rec) < min_fields:
            raise TypeError(f"record_columns takes records of at least {min_fields} fields, "
                            f"got {type(rec).__name__}")
        key = <object>PyTuple_GET_ITEM(rec, 4)
        value = <object>PyTuple_GET_ITEM(rec, 5)
        if not ((key is None or PyBytes_Check(key)) and (value is None or PyBytes_Check(value))
                and PyUnicode_Check(<object>PyTuple_GET_ITEM(rec, 0))):
            raise TypeError("record_columns: a record's topic must be a str, its key and "
                            "value bytes or None")
        total += (0 if key is None else PyBytes_GET_SIZE(key)) + (
            0 if value is None else PyBytes_GET_SIZE(value))
    cols.reserve(n, total)
    if count_field >= 0:
        buf_presize(&counts.buf, n * 4)
    for i in range(n):
        rec = <object>PyList_GET_ITEM(records, i)
        topic = <object>PyTuple_GET_ITEM(rec, 0)
        partition = <object>PyTuple_GET_ITEM(rec, 1)
        if run and (topic is not run_topic or partition != run_partition):
            cols.add_source(run, <const uint8_t*>PyBytes_AS_STRING(topic_bytes),
                            len(topic_bytes), run_partition)
            run = 0
        if topic is not run_topic:
            run_topic = topic
            topic_bytes = topic.encode("utf-8")
        run_partition = partition
        run += 1
        key = <object>PyTuple_GET_ITEM(rec, 4)
        value = <object>PyTuple_GET_ITEM(rec, 5)
        klen = -1 if key is None else PyBytes_GET_SIZE(key)
        vlen = -1 if value is None else PyBytes_GET_SIZE(value)
        ts_type = <object>PyTuple_GET_ITEM(rec, 8) if PyTuple_GET_SIZE(rec) > 8 else 0
        cols.add_reserved(
            <object>PyTuple_GET_ITEM(rec, 2), <object>PyTuple_GET_ITEM(rec, 3), ts_type,
            NULL if key is None else <const uint8_t*>PyBytes_AS_STRING(key), klen,
            NULL if value is None else <const uint8_t*>PyBytes_AS_STRING(value), vlen)
        cols.add_header_objects(<object>PyTuple_GET_ITEM(rec, 6))
        if count_field >= 0:
            count = <object>PyTuple_GET_ITEM(rec, count_field)
            out_write(&counts.buf, &count, 4)
    if run:
        cols.add_source(run, <const uint8_t*>PyBytes_AS_STRING(topic_bytes), len(topic_bytes),
                        run_partition)
    return cols, counts


def decode_columns(object buf, *, int64_t min_offset=-1, bint skip_control=True,
                   bint include_headers=True, bint allow_partial=True, str timestamp_unit="ms",
                   Py_ssize_t max_decompressed_size=DEFAULT_MAX_DECOMPRESSED_SIZE,
                   bint check_crcs=True):
    """Decode every record in ``buf`` into a :class:`ColumnarRecords` (no Python object per
    record). Records before ``min_offset`` and, by default, control batches are skipped;
    ``check_crcs`` (Java's check.crcs) verifies each v2 batch's CRC32C first."""
    cdef ColumnarRecords cols = ColumnarRecords()
    cdef RecordBatch batch
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef Py_ssize_t pos, base, klen, vlen
    cdef int32_t i, ts_type
    cdef int64_t ts, offset
    cdef RecordView r
    cdef bint log_append
    if timestamp_unit not in ("ms", "us"):
        raise ValueError("timestamp_unit is 'ms' or 'us'")
    cols.ts_scale = 1 if timestamp_unit == "ms" else 1000
    cols.include_headers = include_headers
    batches = decode_batches(buf, allow_partial, check_crcs=check_crcs,
                             max_decompressed_size=max_decompressed_size)
    cols.presize(batches)
    for b in batches:
        if skip_control and b.is_control:
            continue
        if min_offset >= 0 and b.next_offset <= min_offset:
            continue
        if isinstance(b, LegacyBatch):
            ts_type = b.timestamp_type  # -1 for magic 0 (no timestamp), as Java and Spark
            for offset, ts, key, value, headers in b.records():
                if min_offset >= 0 and offset < min_offset:
                    continue
                klen = -1 if key is None else len(key)
                vlen = -1 if value is None else len(value)
                cols.reserve(1, max(klen, 0) + max(vlen, 0))
                cols.add_reserved(
                    offset, ts, ts_type,
                    NULL if key is None else <const uint8_t*>PyBytes_AS_STRING(key), klen,
                    NULL if value is None else <const uint8_t*>PyBytes_AS_STRING(value), vlen)
                if include_headers:
                    cols.add_header_objects(())
            continue
        batch = <RecordBatch>b
        payload = batch.payload()
        base = batch.position + BATCH_HEADER_SIZE
        log_append = batch.attributes & ATTR_TIMESTAMP_TYPE
        ts_type = 1 if log_append else 0
        pos = 0
        view_open(payload, &v, &pybuf)
        try:
            check_record_count(batch.record_count, v.size, batch.position)
            cols.reserve(batch.record_count, v.size)
            for i in range(batch.record_count):
                parse_record(v.data, v.size, &pos, &r, base)
                offset = batch.base_offset + r.offset_delta
                if min_offset >= 0 and offset < min_offset:
                    continue
                ts = batch.max_timestamp if log_append else batch.base_timestamp + r.ts_delta
                cols.add_parsed(v.data, &r, offset, ts, ts_type, base)
            if pos != v.size:
                raise CorruptRecordError(
                    f"{v.size - pos} bytes left after the batch's {batch.record_count} records",
                    base + pos)
        finally:
            view_close(&v, &pybuf)
    return cols


def decode_to_arrow(object buf, **options):
    """:func:`decode_columns` as a ``pyarrow.RecordBatch`` (needs pyarrow)."""
    return decode_columns(buf, **options).to_arrow()
