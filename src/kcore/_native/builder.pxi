# Record batch v2 (magic 2) encoding. Records are written straight into a C buffer: appending
# makes no Python object per record, and the bulk path reads keys and values from lists,
# numpy or pyarrow arrays without touching Python objects at all for the array cases.

DEF BATCH_HEADER_SIZE = 61

from array import array as _array
from numbers import Integral as _Integral
DEF CRC_OFFSET = 17
DEF ATTRIBUTES_OFFSET = 21
# How far an uncompressed batch's record checksum may lag its writes (RecordBatchBuilder's
# records_crc): small enough that the bytes are still in the L1 cache, large enough that the
# call costs little per record.
DEF CRC_STEP = 2048
DEF ATTR_TIMESTAMP_TYPE = 0x08
DEF ATTR_TRANSACTIONAL = 0x10
DEF ATTR_CONTROL = 0x20

# append_many's up-front reservation is an estimate; never more than this in one go.
DEF RESERVE_CAP = 64 * 1024 * 1024
DEF KEEP_SLACK_FROM = 1024 * 1024  # build() keeps a large batch's slack (see there)

# Kinds of column append_many reads.
DEF COL_NULL = 0      # None: every value null
DEF COL_OBJECTS = 1   # a sequence of bytes-like objects or None
DEF COL_ARROW32 = 2   # pyarrow binary/string (int32 offsets)
DEF COL_ARROW64 = 3   # pyarrow large_binary/large_string (int64 offsets)
DEF COL_FIXED = 4     # numpy fixed-width bytes ('S'): trailing NULs dropped, as numpy does


# Column (one column append_many reads) and HeaderColumns are declared in _codec.pxd.


# Four are made per append_many call (a chunk of send_batch): untracked by the collector (only
# the call's locals refer to one, so it is in no cycle) and its list made only when a view is
# kept, they add nothing to what triggers a collection.
@cython.no_gc
@cython.freelist(8)
cdef class _ColumnHolder:
    """Keeps the Python objects and buffers a Column points into alive for one call."""
    cdef object seq
    cdef list views

    cdef int keep(self, object view) except -1:
        if self.views is None:
            self.views = [view]
        else:
            self.views.append(view)
        return 0


cdef object _buffer_of(object buf, _ColumnHolder holder):
    if buf is None:
        return None
    mv = memoryview(buf)
    holder.keep(mv)
    return mv


cdef int column_open(object values, Column* col, _ColumnHolder holder) except -1:
    col.validity = NULL
    col.offsets32 = NULL
    col.offsets64 = NULL
    col.data = NULL
    col.items = NULL
    col.seq = NULL
    col.is_list = False
    col.array_offset = 0
    col.itemsize = 0
    if values is None:
        col.kind = COL_NULL
        col.length = -1
        return 0
    module = type(values).__module__ or ""
    if module.startswith("pyarrow"):
        if hasattr(values, "combine_chunks"):  # ChunkedArray: one contiguous array
            values = values.combine_chunks()
        type_name = str(values.type)
        if type_name in ("binary", "string"):
            col.kind = COL_ARROW32
        elif type_name in ("large_binary", "large_string"):
            col.kind = COL_ARROW64
        else:
            raise TypeError(f"append_many takes binary or string arrays, not {type_name}")
        holder.keep(values)
        validity, offsets, data = values.buffers()[:3]
        col.length = len(values)
        col.array_offset = values.offset
        mv = _buffer_of(validity, holder)
        if mv is not None and values.null_count:
            col.validity = <const uint8_t*><Py_ssize_t>_address_of(mv)
        mv = _buffer_of(offsets, holder)
        if col.kind == COL_ARROW32:
            col.offsets32 = <const int32_t*><Py_ssize_t>_address_of(mv)
        else:
            col.offsets64 = <const int64_t*><Py_ssize_t>_address_of(mv)
        mv = _buffer_of(data, holder)
        col.data = <const uint8_t*><Py_ssize_t>_address_of(mv) if mv is not None else NULL
        return 0
    dtype = getattr(values, "dtype", None)
    if dtype is not None and dtype.kind == "U":  # numpy str arrays: UTF-8, like pyarrow strings
        values = values.astype(object)
        dtype = values.dtype
    if dtype is not None and dtype.kind == "S":
        contiguous = values if values.flags.c_contiguous else values.copy()
        mv = _buffer_of(contiguous, holder)
        col.kind = COL_FIXED
        col.length = len(values)
        col.itemsize = dtype.itemsize
        col.data = <const uint8_t*><Py_ssize_t>_address_of(mv)
        return 0
    # A caller's list is read item by item through the list itself (never a saved pointer to
    # its item array, which a resize would free), with its size checked each time; anything
    # else that is not a tuple becomes a private list first.
    if isinstance(values, (list, tuple)):
        holder.seq = values
    else:
        holder.seq = PySequence_Fast(values, "append_many takes a sequence")
    col.kind = COL_OBJECTS
    col.is_list = isinstance(values, list)
    col.length = PySequence_Fast_GET_SIZE(holder.seq)
    col.seq = <PyObject*>holder.seq
    col.items = PySequence_Fast_ITEMS(holder.seq)
    return 0


cdef Py_ssize_t _address_of(memoryview mv) except? -1:
    cdef Py_buffer* pb = PyMemoryView_GET_BUFFER(mv)
    return <Py_ssize_t>pb.buf


cdef int header_columns_open(object headers, Py_ssize_t n, HeaderColumns* hc,
                             _ColumnHolder kh, _ColumnHolder vh) except -1:
    hc.present = True
    if hasattr(headers, "combine_chunks"):
        headers = headers.combine_chunks()
    type_name = str(headers.type)
    if not type_name.startswith(("list<", "large_list<")):
        raise TypeError(f"headers as an array must be list<struct<key, value>>, not {type_name}")
    if len(headers) != n:
        raise ValueError(f"{len(headers)} header lists for {n} values")
    entries = headers.values  # the whole child: the list offsets index into it
    if not str(entries.type).startswith("struct<") or entries.type.num_fields != 2:
        raise TypeError(f"header entries must be struct<key, value>, not {entries.type}")
    kh.keep(headers)
    validity, offsets = headers.buffers()[:2]
    hc.array_offset = headers.offset
    hc.validity = NULL
    hc.offsets32 = NULL
    hc.offsets64 = NULL
    mv = _buffer_of(validity, kh)
    if mv is not None and headers.null_count:
        hc.validity = <const uint8_t*><Py_ssize_t>_address_of(mv)
    mv = _buffer_of(offsets, kh)
    if type_name.startswith("list<"):
        hc.offsets32 = <const int32_t*><Py_ssize_t>_address_of(mv)
    else:
        hc.offsets64 = <const int64_t*><Py_ssize_t>_address_of(mv)
    # Fields named key and value (Spark's), else the first is the key and the second the value.
    names = [entries.type.field(i).name for i in range(2)]
    k = names.index("key") if "key" in names and "value" in names else 0
    # flatten(): the fields with the struct's own nulls merged in (a null entry has a null key).
    fields = entries.flatten()
    column_open(fields[k], &hc.keys, kh)
    column_open(fields[1 - k], &hc.values, vh)
    return 0


cdef inline void header_range(HeaderColumns* hc, Py_ssize_t i, Py_ssize_t* start,
                              Py_ssize_t* end) noexcept:
    cdef Py_ssize_t j = i + hc.array_offset
    if hc.validity != NULL and not (hc.validity[j >> 3] & (1 << (j & 7))):
        start[0] = 0
        end[0] = 0
    elif hc.offsets32 != NULL:
        start[0] = hc.offsets32[j]
        end[0] = hc.offsets32[j + 1]
    else:
        start[0] = <Py_ssize_t>hc.offsets64[j]
        end[0] = <Py_ssize_t>hc.offsets64[j + 1]


cdef Py_ssize_t header_columns_size(HeaderColumns* hc, Py_ssize_t start,
                                    Py_ssize_t end) except -1:
    """Encoded size of entries start..end (arrow columns: nothing to release)."""
    cdef Py_ssize_t j, size = 0, n
    cdef const uint8_t* ptr = NULL
    cdef Py_buffer unused
    cdef bint acquired = False
    if end - start > 0x7FFFFFFF:
        raise ValueError("a record has more than 2**31 - 1 headers")
    for j in range(start, end):
        column_get(&hc.keys, j, &ptr, &n, &unused, &acquired)
        if n < 0:
            raise ValueError("a header key is null (Kafka header keys are strings)")
        if n > 0x7FFFFFFF:
            raise ValueError("a header key is larger than 2 GiB")
        size += uvarint_size(zigzag32(<int32_t>n)) + n
        column_get(&hc.values, j, &ptr, &n, &unused, &acquired)
        if n > 0x7FFFFFFF:
            raise ValueError("a header value is larger than 2 GiB")
        size += uvarint_size(zigzag32(<int32_t>n)) + (n if n > 0 else 0)
    return size


cdef uint8_t* write_header_columns(uint8_t* p, HeaderColumns* hc, Py_ssize_t start,
                                   Py_ssize_t end) except NULL:
    cdef Py_ssize_t j, n
    cdef const uint8_t* ptr = NULL
    cdef Py_buffer unused
    cdef bint acquired = False
    for j in range(start, end):
        column_get(&hc.keys, j, &ptr, &n, &unused, &acquired)
        p += put_uvarint64(p, zigzag32(<int32_t>n))
        memcpy(p, ptr, n)
        p += n
        column_get(&hc.values, j, &ptr, &n, &unused, &acquired)
        p += put_uvarint64(p, zigzag32(<int32_t>n))
        if n > 0:
            memcpy(p, ptr, n)
            p += n
    return p


cdef extern from *:
    """
    /* append_many's common case read without a Python reference: item i of a list or tuple
       column when it is exactly bytes or None. Returns 0 for anything else (and for an index
       past a list that shrank), which the general column_get then takes. */
    static inline int kcore_plain_item(PyObject* seq, int is_list, PyObject** items,
                                       Py_ssize_t i, const uint8_t** p, Py_ssize_t* n) {
        PyObject* o;
        if (is_list) {
            if (i >= PyList_GET_SIZE(seq)) return 0;
            o = PyList_GET_ITEM(seq, i);
        } else {
            o = items[i];
        }
        if (PyBytes_CheckExact(o)) {
            *p = (const uint8_t*)PyBytes_AS_STRING(o);
            *n = PyBytes_GET_SIZE(o);
            return 1;
        }
        if (o == Py_None) {
            *n = -1;
            return 1;
        }
        return 0;
    }
    /* An exact non-negative int of up to two 30-bit digits (below 2**60: any ms timestamp)
       read from its digits: PyLong_AsLongLongAndOverflow's checks cost more than the read.
       Returns 0 for anything else (negative ints too), and on Pythons whose ints are laid out
       in a way not read here: the caller then takes the API. Two layouts: before 3.12 the
       digit count is the object's size; 3.12 and 3.13 (the newest tested) keep it in
       long_value.lv_tag, above 3 flag bits whose low two are the sign (0 positive, 1 zero). */
    static inline int kcore_small_long(PyObject* o, int64_t* out) {
    #if !defined(PYPY_VERSION) && PyLong_SHIFT == 30 && PY_VERSION_HEX < 0x030C0000
        if (PyLong_CheckExact(o)) {
            Py_ssize_t size = Py_SIZE(o);
            const digit* d = ((PyLongObject*)o)->ob_digit;
            if (size == 2) { *out = ((int64_t)d[1] << 30) | (int64_t)d[0]; return 1; }
            if (size == 1) { *out = (int64_t)d[0]; return 1; }
            if (size == 0) { *out = 0; return 1; }
        }
    #elif !defined(PYPY_VERSION) && PyLong_SHIFT == 30 && PY_VERSION_HEX < 0x030E0000
        if (PyLong_CheckExact(o)) {
            uintptr_t tag = ((PyLongObject*)o)->long_value.lv_tag;
            uintptr_t sign = tag & 3;
            uintptr_t ndigits = tag >> 3;
            const digit* d = ((PyLongObject*)o)->long_value.ob_digit;
            if (sign == 1) { *out = 0; return 1; }
            if (sign == 0 && ndigits == 2) {
                *out = ((int64_t)d[1] << 30) | (int64_t)d[0];
                return 1;
            }
            if (sign == 0 && ndigits == 1) { *out = (int64_t)d[0]; return 1; }
        }
    #endif
        (void)o; (void)out;
        return 0;
    }
    """
    int kcore_plain_item(PyObject* seq, int is_list, PyObject** items, Py_ssize_t i,
                         const uint8_t** p, Py_ssize_t* n) noexcept
    int kcore_small_long(PyObject* o, int64_t* out) noexcept
    PyObject* kcore_list_item "PyList_GET_ITEM" (object lst, Py_ssize_t i) noexcept


cdef inline int column_get(Column* col, Py_ssize_t i, const uint8_t** ptr, Py_ssize_t* n,
                           Py_buffer* pybuf, bint* acquired) except -1:
    cdef object item
    cdef Py_ssize_t j, start, end
    acquired[0] = False
    if col.kind == COL_NULL:
        n[0] = -1
        return 0
    if col.kind == COL_ARROW32 or col.kind == COL_ARROW64:
        j = i + col.array_offset
        if col.validity != NULL and not (col.validity[j >> 3] & (1 << (j & 7))):
            n[0] = -1
            return 0
        if col.kind == COL_ARROW32:
            start = col.offsets32[j]
            end = col.offsets32[j + 1]
        else:
            start = <Py_ssize_t>col.offsets64[j]
            end = <Py_ssize_t>col.offsets64[j + 1]
        ptr[0] = col.data + start
        n[0] = end - start
        return 0
    if col.kind == COL_FIXED:
        ptr[0] = col.data + i * col.itemsize
        end = col.itemsize
        while end > 0 and ptr[0][end - 1] == 0:
            end -= 1
        n[0] = end
        return 0
    if col.is_list:
        if i >= PyList_GET_SIZE(<object>col.seq):
            raise RuntimeError("the list changed size during append_many")
        item = <object>PyList_GET_ITEM(<object>col.seq, i)
    else:
        item = <object>col.items[i]
    if item is None:
        n[0] = -1
        return 0
    if PyBytes_Check(item):
        ptr[0] = <const uint8_t*>PyBytes_AS_STRING(item)
        n[0] = PyBytes_GET_SIZE(item)
        return 0
    if PyUnicode_Check(item):  # str: its UTF-8 form (cached in the str object, not copied)
        ptr[0] = <const uint8_t*>PyUnicode_AsUTF8AndSize(item, n)
        return 0
    PyObject_GetBuffer(item, pybuf, PyBUF_SIMPLE)
    acquired[0] = True
    ptr[0] = <const uint8_t*>pybuf.buf
    n[0] = pybuf.len
    return 0


cdef extern from *:
    """
    /* A bytes object's length set within its allocation, which a pooled batch buffer keeps
       whole: the NUL after the data and "not hashed yet", as for any new bytes object. */
    static void kcore_bytes_set_length(PyObject* o, Py_ssize_t n) {
        Py_SET_SIZE(o, n);
        PyBytes_AS_STRING(o)[n] = '\\0';
    #if defined(_Py_COMP_DIAG_PUSH)
        _Py_COMP_DIAG_PUSH
        _Py_COMP_DIAG_IGNORE_DEPR_DECLS
    #endif
        ((PyBytesObject*)o)->ob_shash = -1;
    #if defined(_Py_COMP_DIAG_POP)
        _Py_COMP_DIAG_POP
    #endif
    }
    static Py_ssize_t kcore_refcount(PyObject* o) { return Py_REFCNT(o); }
    """
    void kcore_bytes_set_length(PyObject* o, Py_ssize_t n)
    Py_ssize_t kcore_refcount(PyObject* o)


cdef class BatchBufferPool:
    """Batch buffers a producer hands from delivered batches to new ones, as Java's producer
    keeps a free list of ``batch.size`` buffers (its BufferPool): a new 1 MB batch then
    writes into pages already faulted in, instead of fresh ones from the OS (on a VM a fault
    costs about a microsecond, ~250 per MB). Only a buffer nothing else references comes
    back (``RecordBatchBuilder.release``), whole, between ``min_buffer`` and ``max_buffer``
    bytes, and only while ``held_bytes`` stays within ``limit``, which the producer sets so
    that batches and pooled buffers together stay within ``buffer.memory``. Not thread-safe:
    the producer's accumulator lock covers it."""

    # (its C fields are declared in _codec.pxd)

    def __cinit__(self, Py_ssize_t min_buffer=65536, Py_ssize_t max_buffer=PY_SSIZE_T_MAX,
                  Py_ssize_t limit=0):
        self._free = []
        self.held_bytes = 0
        self.limit = limit
        self.min_buffer = min_buffer
        self.max_buffer = max_buffer
        self.reuses = 0

    def __len__(self):
        return len(self._free)

    cdef object take(self, Py_ssize_t min_size, Py_ssize_t max_size):
        """The most recently pooled buffer of ``min_size`` to ``max_size`` bytes (its pages
        are the warmest), or None; others on the way are let go (a buffer larger than the
        batch's reservation would take memory outside buffer.memory)."""
        cdef Py_ssize_t size
        while self._free:
            buf = self._free.pop()
            size = PyBytes_GET_SIZE(buf)
            self.held_bytes -= size
            if min_size <= size <= max_size:
                self.reuses += 1
                return buf
        return None

    cdef bint give(self, PyObject* buf, Py_ssize_t allocated) noexcept:
        """Keep ``buf`` (a bytes object only its caller references, ``allocated`` bytes of
        data long) if it fits; the list takes its own reference."""
        if (allocated < self.min_buffer or allocated > self.max_buffer
                or self.held_bytes + allocated > self.limit):
            return False
        kcore_bytes_set_length(buf, allocated)
        try:
            self._free.append(<object>buf)
        except BaseException:  # out of memory growing the list: keep nothing
            return False
        self.held_bytes += allocated
        return True

    def trim(self, Py_ssize_t keep=0):
        """Let buffers go, oldest first, until at most ``keep`` bytes are held."""
        cdef Py_ssize_t n = 0
        while self.held_bytes > keep and n < len(self._free):
            self.held_bytes -= PyBytes_GET_SIZE(self._free[n])
            n += 1
        del self._free[:n]


cdef inline Py_ssize_t framed_size(Py_ssize_t body) noexcept:
    """A record's bytes in the batch: its body and the varint of its length before it."""
    return uvarint_size(zigzag32(<int32_t>body)) + body


@cython.no_gc  # its only object fields (a buffer pool, a reason string) cannot lead back to it
cdef class RecordBatchBuilder:
    """Builds one v2 record batch.

    ``append`` copies a record's key, value and headers straight into a C buffer;
    ``append_many`` does the same for whole columns; ``build`` compresses (if asked), fills in
    the header and CRC32C, and returns the batch's bytes.
    """

    # Its C fields, with what each holds, are declared in _codec.pxd (other compiled modules
    # cimport this class).

    def __cinit__(self, str compression="none", *, int64_t base_offset=0,
                  int64_t producer_id=-1, int producer_epoch=-1, int32_t base_sequence=-1,
                  bint transactional=False, bint is_control=False,
                  int compression_level=LEVEL_DEFAULT,
                  int partition_leader_epoch=-1, bint log_append_time=False,
                  BatchBufferPool pool=None, Py_ssize_t capacity=0,
                  Py_ssize_t max_capacity=0):
        self.codec = codec_id(compression)
        self.level = compression_level
        self._batch = NULL
        self._handed_out = False
        self._ended = None
        self._pool = pool
        self._alloc = 0
        self._keep_slack = pool is None and max_capacity <= 0
        self.out.data = NULL
        self.out.size = 0
        self.out.cap = 0
        if pool is not None:
            # (the pool's reference goes with ``taken``: the builder's is then the only one)
            self.own(pool.take(capacity, max_capacity if max_capacity > 0 else capacity))
        if self._batch == NULL:
            if capacity > 4096:
                # Exactly that (reserve() would double past it, to the next power of two).
                self.own(PyBytes_FromStringAndSize(NULL, capacity))
                kcore_hint_huge_pages(self.out.data, capacity)
            else:
                self.reserve(4096)
        self.out.size = BATCH_HEADER_SIZE
        self.records_crc = 0
        self.crc_upto = BATCH_HEADER_SIZE
        self.record_count = 0
        self.base_offset = base_offset
        self.producer_id = producer_id
        self.producer_epoch = <int16_t>producer_epoch
        self.base_sequence = base_sequence
        self.transactional = transactional
        self.is_control = is_control
        self.partition_leader_epoch = partition_leader_epoch
        self.timestamp_type = 1 if log_append_time else 0
        self.base_timestamp = 0
        self.max_timestamp = -1

    def __dealloc__(self):
        Py_XDECREF(self._batch)

    cdef void own(self, object buf):
        """Write into ``buf`` (a bytes object no one else holds; None: nothing to own), all of
        its length the buffer's capacity."""
        if buf is None:
            return
        Py_INCREF(buf)
        self._batch = <PyObject*>buf
        self._alloc = self.out.cap = PyBytes_GET_SIZE(buf)
        self.out.data = <uint8_t*>PyBytes_AS_STRING(buf)

    cdef int reserve(self, Py_ssize_t extra, bint exact=False) except -1:
        """Room for ``extra`` more bytes in the batch object (``exact``: that much, not the
        next doubling past it)."""
        cdef Py_ssize_t need = self.out.size + extra
        cdef Py_ssize_t cap
        if need <= self.out.cap and not self._handed_out:
            return 0
        if self._ended is not None:
            self.raise_ended()
        cap = self.out.cap if self.out.cap > 0 else 4096
        if exact and cap < need:
            cap = need
        while cap < need:
            cap *= 2
        if self._batch == NULL or self._handed_out:
            # New, or the last one was returned by build(): start a private copy.
            fresh = PyBytes_FromStringAndSize(NULL, cap)
            if self._batch != NULL:
                memcpy(PyBytes_AS_STRING(fresh), self.out.data, self.out.size)
            Py_XDECREF(self._batch)
            Py_INCREF(fresh)
            self._batch = <PyObject*>fresh
            self._handed_out = False
        else:
            self.resize(cap)  # sole owner: grows in place (realloc)
        self.out.data = <uint8_t*>PyBytes_AS_STRING(<object>self._batch)
        self.out.cap = self._alloc = cap
        kcore_hint_huge_pages(self.out.data + self.out.size, cap - self.out.size)
        return 0

    cdef void checksum_records(self) noexcept:
        """Bring ``records_crc`` up to every record written (``crc_upto`` to ``out.size``)."""
        self.records_crc = kcore_crc32c(self.records_crc, self.out.data + self.crc_upto,
                                        self.out.size - self.crc_upto)
        self.crc_upto = self.out.size

    cdef int resize(self, Py_ssize_t size) except -1:
        """_PyBytes_Resize of the sole-owned batch object. When it fails it has freed the
        object (the records with it): the builder then refuses every later write and build
        rather than use the freed buffer."""
        try:
            _PyBytes_Resize(&self._batch, size)
        except BaseException:  # (it has freed the object whatever it raised)
            self.end("out of memory")
            raise
        return 0

    cdef void end(self, str why) noexcept:
        Py_CLEAR(self._batch)
        self.out.data = NULL
        self.out.cap = self._alloc = 0
        self._handed_out = False
        self._ended = why

    cdef int raise_ended(self) except -1:
        if self._ended == "released":
            raise ValueError("this batch builder was released; it takes no more records")
        raise MemoryError(
            f"this batch builder ran out of memory; its {self.record_count} record(s) are lost")

    def release(self):
        """Free the buffer now (the batch's records were delivered or failed for good);
        ``record_count`` stays. Later appends and builds raise ValueError."""
        if self._ended is None:
            # Back to the pool only if nothing else holds it (a request still being written,
            # a caller's reference to what build() returned): no one may see it written again.
            if (self._pool is not None and self._batch != NULL
                    and kcore_refcount(self._batch) == 1):
                self._pool.give(self._batch, self._alloc)
            self.end("released")

    @property
    def capacity(self):
        """Bytes the batch's buffer holds (written or not), header included."""
        return self._alloc

    def __len__(self):
        return self.record_count

    def set_producer(self, int64_t producer_id, int producer_epoch, int32_t base_sequence,
                     bint transactional=False):
        """Set the idempotent/transactional producer fields; they go into the header at the
        next build(), so a producer assigns sequences when a batch is sent (and again after an
        epoch bump) without rewriting the records."""
        self.producer_id = producer_id
        self.producer_epoch = <int16_t>producer_epoch
        self.base_sequence = base_sequence
        self.transactional = transactional

    @property
    def size_in_bytes(self):
        """Bytes written so far, uncompressed, header included."""
        return self.out.size

    @property
    def compression(self):
        return _CODEC_NAMES[self.codec]

    cdef inline Py_ssize_t body_size(self, Py_ssize_t klen, Py_ssize_t vlen, int64_t ts,
                                     int32_t header_count, Py_ssize_t headers_size) noexcept:
        """The encoded size of the next record, its length prefix not included."""
        cdef int64_t ts_delta = ts - self.base_timestamp if self.record_count else 0
        return (1 + uvarint_size(zigzag64(ts_delta))
                + uvarint_size(zigzag32(self.record_count))
                + uvarint_size(zigzag32(<int32_t>klen)) + (klen if klen > 0 else 0)
                + uvarint_size(zigzag32(<int32_t>vlen)) + (vlen if vlen > 0 else 0)
                + uvarint_size(zigzag32(header_count)) + headers_size)

    cdef inline int write_record(self, const uint8_t* key, Py_ssize_t klen,
                                 const uint8_t* value, Py_ssize_t vlen, int64_t ts,
                                 object headers, Py_ssize_t headers_size,
                                 int32_t header_count, HeaderColumns* hc,
                                 Py_ssize_t h_start) except -1:
        """Append one record. Its ``header_count`` headers are the normalised list
        ``headers``, or when ``hc`` is not NULL entries from ``h_start`` of those columns.
        A write that succeeds runs no Python code and keeps the GIL: the producer's send path
        relies on it (the GIL rule in kcore/producer/_sendpath.pyx)."""
        return self.write_sized(self.body_size(klen, vlen, ts, header_count, headers_size),
                                key, klen, value, vlen, ts, headers, headers_size,
                                header_count, hc, h_start)

    cdef inline int write_sized(self, Py_ssize_t body, const uint8_t* key, Py_ssize_t klen,
                                const uint8_t* value, Py_ssize_t vlen, int64_t ts,
                                object headers, Py_ssize_t headers_size,
                                int32_t header_count, HeaderColumns* hc,
                                Py_ssize_t h_start) except -1:
        """write_record with the record's ``body_size`` known already (append_many's
        ``max_bytes`` check computes it)."""
        cdef int64_t ts_delta
        cdef int32_t offset_delta = self.record_count
        cdef Py_ssize_t need
        cdef uint8_t* p
        if klen > 0x7FFFFFFF or vlen > 0x7FFFFFFF:
            raise ValueError("a record's key or value is larger than 2 GiB")
        if self.record_count == 0:
            self.base_timestamp = ts
        ts_delta = ts - self.base_timestamp
        if body > 0x7FFFFFFF:
            raise ValueError("a record is larger than 2 GiB")
        # Exactly what is written (not body + 5): a batch filled to max_bytes in a buffer of
        # that size must not be reallocated for its last record.
        need = framed_size(body)
        if self.out.size + need > self.out.cap or self._handed_out:
            self.reserve(need)
        p = self.out.data + self.out.size
        p += put_uvarint64(p, zigzag32(<int32_t>body))
        p[0] = 0  # record attributes: unused
        p += 1
        p += put_uvarint64(p, zigzag64(ts_delta))
        p += put_uvarint64(p, zigzag32(offset_delta))
        p += put_uvarint64(p, zigzag32(<int32_t>klen))
        if klen > 0:
            memcpy(p, key, klen)
            p += klen
        p += put_uvarint64(p, zigzag32(<int32_t>vlen))
        if vlen > 0:
            memcpy(p, value, vlen)
            p += vlen
        p += put_uvarint64(p, zigzag32(header_count))
        if header_count:
            if hc != NULL:
                p = write_header_columns(p, hc, h_start, h_start + header_count)
            else:
                p = write_headers(p, headers)
        self.out.size = p - self.out.data
        self.record_count += 1
        if ts > self.max_timestamp:
            self.max_timestamp = ts
        if self.out.size - self.crc_upto >= CRC_STEP and self.codec == CODEC_NONE:
            self.checksum_records()
        return 0

    def append(self, object key, object value, int64_t timestamp_ms, object headers=None):
        """Add one record; returns its index in the batch (its offset delta). ``key`` and
        ``value`` are bytes-like or None (None and b"" differ); ``headers`` a sequence of
        ``(str | bytes, bytes | None)`` pairs."""
        cdef int32_t index
        cdef ByteView kv, vv
        cdef Py_buffer kb, vb
        cdef Py_ssize_t klen = -1, vlen = -1, hsize = 0
        cdef int32_t hcount = 0
        cdef const uint8_t* kp = NULL
        cdef const uint8_t* vp = NULL
        kv.acquired = False
        vv.acquired = False
        if headers:
            headers = normalise_headers(headers)
            hcount = <int32_t>len(headers)
            hsize = headers_size(headers)
        try:
            if key is not None:
                view_open(key, &kv, &kb)
                kp = kv.data
                klen = kv.size
            if value is not None:
                view_open(value, &vv, &vb)
                vp = vv.data
                vlen = vv.size
            index = self.record_count  # (read and written within this C call)
            self.write_record(kp, klen, vp, vlen, timestamp_ms, headers, hsize, hcount, NULL, 0)
        finally:
            view_close(&kv, &kb)
            view_close(&vv, &vb)
        return index

    def append_many(self, object keys, object values, object timestamp_ms,
                    object headers=None, Py_ssize_t start=0, Py_ssize_t stop=-1,
                    Py_ssize_t max_bytes=0, object rows=None):
        """Add many records in one call. ``values`` (and ``keys``, or None for no keys) are
        sequences of bytes-like objects, str (written as UTF-8) or None, numpy fixed-width
        bytes or str arrays, or pyarrow binary/string arrays; ``timestamp_ms`` one int for
        all, or a sequence/int64 array; ``headers`` None, a pyarrow
        ``list<struct<key, value>>`` array (as Spark's ``headers`` column), or a sequence
        with one entry per record: None or ``(key, value)`` pairs as ``append`` takes.
        ``start``/``stop`` (``stop`` -1: the end) pick rows of those columns, which all
        keep their full length: a slice of a list would take and drop a reference per
        item. A range costs nothing extra for lists, tuples, arrays and an int timestamp;
        other input (a list of timestamps, numpy str or object arrays, chunked arrow, Python
        headers) is checked or converted whole on each call, so slice those instead.
        ``max_bytes`` (0: no limit) ends the call before a record that would take the batch
        past that size, as a producer fills a batch up to ``batch.size`` (a batch still
        empty takes its first record whatever its size). ``rows`` (an int64 array, or None)
        reorders: record ``i`` of the call is row ``rows[i]`` of the columns, and
        ``start``/``stop`` then pick entries of ``rows`` (send_batch's partitions, each a
        range of one sort of the rows, read without copying the columns into that order).
        Returns how many records were added."""
        cdef Column kc, vc
        cdef _ColumnHolder kh = _ColumnHolder(), vh = _ColumnHolder()
        cdef _ColumnHolder hkh = _ColumnHolder(), hvh = _ColumnHolder()
        cdef HeaderColumns hcols
        cdef list prepared = None
        cdef Py_ssize_t h_start = 0, h_end = 0, hsize = 0
        cdef int32_t hcount = 0
        cdef Py_ssize_t i, n, klen, vlen
        cdef const uint8_t* kp = NULL
        cdef const uint8_t* vp = NULL
        cdef Py_buffer kb, vb
        cdef bint kacq = False, vacq = False
        cdef int64_t ts = 0
        cdef const int64_t* ts_array = NULL
        cdef object ts_list = None
        cdef object ts_view = None
        cdef int ovf = 0
        cdef PyObject* ts_item
        cdef Py_ssize_t added = 0, body
        cdef HeaderColumns* row_hc = NULL
        cdef object entry = None
        cdef object rows_view = None
        cdef const int64_t* row_of = NULL
        cdef Py_ssize_t r, count
        column_open(values, &vc, vh)
        column_open(keys, &kc, kh)
        if vc.kind == COL_NULL:
            raise TypeError("values must be a sequence or array (use [None] * n for nulls)")
        n = vc.length
        if kc.kind != COL_NULL and kc.length != n:
            raise ValueError(f"{kc.length} keys for {n} values")
        count = n  # entries start:stop index: the rows, or rows' entries
        if rows is not None:
            rows_view = _int64_view(rows)
            if rows_view is None:
                raise TypeError("rows must be a contiguous int64 array")
            row_of = <const int64_t*><Py_ssize_t>_address_of(rows_view)
            count = len(rows_view)
        if stop == -1:
            stop = count
        if not 0 <= start <= stop <= count:
            raise ValueError(f"rows {start}:{stop} of a column of {count}")
        if row_of != NULL:
            for i in range(start, stop):
                if not 0 <= row_of[i] < n:
                    raise IndexError(f"row {row_of[i]} of a column of {n}")
        hcols.present = False
        if headers is not None:
            if (type(headers).__module__ or "").startswith("pyarrow"):
                header_columns_open(headers, n, &hcols, hkh, hvh)
            else:
                # Python pairs: normalised (private copies) and sized before the loop, which
                # must run no Python code.
                if row_of != NULL or start != 0 or stop != n:  # only the rows taken
                    if len(headers) != n:
                        raise ValueError(f"{len(headers)} header lists for {n} values")
                    if row_of != NULL:  # in their order
                        headers = [headers[row_of[i]] for i in range(start, stop)]
                    else:  # send_batch's chunks
                        headers = headers[start:stop]
                prepared = [None if row is None else (row, headers_size(row), len(row))
                            for row in prepare_headers(headers, stop - start)]
        # (an exact int first: the ABC check runs Python code, ~2 us a call)
        if type(timestamp_ms) is int or isinstance(timestamp_ms, _Integral):
            ts = timestamp_ms  # an int, or a numpy integer scalar
        else:
            ts_view = _int64_view(timestamp_ms)
            if ts_view is not None:
                if len(ts_view) != n:
                    raise ValueError(f"{len(ts_view)} timestamps for {n} values")
                ts_array = <const int64_t*><Py_ssize_t>_address_of(ts_view)
            elif isinstance(timestamp_ms, list) and _exact_ints(timestamp_ms):
                # Plain ints convert in C with no Python code running: read them in the loop.
                if PyList_GET_SIZE(timestamp_ms) != n:
                    raise ValueError(f"{PyList_GET_SIZE(timestamp_ms)} timestamps for {n} values")
                ts_list = timestamp_ms
            else:
                # Anything else converts up front: no Python code may run inside the loop.
                ts_view = memoryview(_array("q", timestamp_ms))
                if len(ts_view) != n:
                    raise ValueError(f"{len(ts_view)} timestamps for {n} values")
                ts_array = <const int64_t*><Py_ssize_t>_address_of(ts_view)
        if row_of == NULL:  # (the sample would read rows in order: only without rows)
            self.reserve_for(&kc, &vc, start, stop, max_bytes)
        for r in range(start, stop):
            i = r
            if row_of != NULL:
                i = row_of[r]
                if not 0 <= i < n:  # checked above; again, in case the array changed since
                    raise IndexError(f"row {i} of a column of {n}")
            if ts_array != NULL:
                ts = ts_array[i]
            elif ts_list is not None:
                if i >= PyList_GET_SIZE(ts_list):
                    raise RuntimeError("the timestamp list changed size during append_many")
                # ...AndOverflow reads the digits directly; PyLong_AsLongLong goes through
                # _PyLong_AsByteArray for any int above 2**30, as every ms timestamp is.
                ts_item = kcore_list_item(ts_list, i)
                if not kcore_small_long(ts_item, &ts):
                    ts = PyLong_AsLongLongAndOverflow(<object>ts_item, &ovf)
                    if ovf:
                        raise OverflowError(f"timestamp {ts_list[i]} does not fit in 64 bits")
            # Lists or tuples of bytes (the common case) are read inline, the rest by
            # column_get.
            if kc.kind == COL_NULL:
                klen = -1
            elif not (kc.kind == COL_OBJECTS
                      and kcore_plain_item(kc.seq, kc.is_list, kc.items, i, &kp, &klen)):
                column_get(&kc, i, &kp, &klen, &kb, &kacq)
            try:
                if not (vc.kind == COL_OBJECTS
                        and kcore_plain_item(vc.seq, vc.is_list, vc.items, i, &vp, &vlen)):
                    if kc.kind == COL_OBJECTS and not kacq and klen >= 0:
                        # kp borrows from the keys' item, and reading the value may run code
                        # (a buffer exporter) that replaces it: hold it until it is copied.
                        key_keep = <object>(kcore_list_item(<object>kc.seq, i) if kc.is_list
                                            else kc.items[i])
                    column_get(&vc, i, &vp, &vlen, &vb, &vacq)
                try:
                    entry, hsize, hcount = None, 0, 0
                    if hcols.present:
                        header_range(&hcols, i, &h_start, &h_end)
                        hcount = <int32_t>(h_end - h_start)
                        hsize = header_columns_size(&hcols, h_start, h_end) if hcount else 0
                        row_hc = &hcols
                    elif (prepared is not None
                          and PyList_GET_ITEM(prepared, r - start) != <PyObject*>None):
                        entry, hsize, hcount = <tuple>PyList_GET_ITEM(prepared, r - start)
                    body = self.body_size(klen, vlen, ts, hcount, hsize)
                    if (max_bytes > 0 and self.record_count > 0
                            and self.out.size + framed_size(body) > max_bytes):
                        break  # (the finally clauses release the record's buffers)
                    self.write_sized(body, kp, klen, vp, vlen, ts, entry, hsize, hcount, row_hc,
                                     h_start)
                    added += 1
                finally:
                    if vacq:
                        PyBuffer_Release(&vb)
                        vacq = False
            finally:
                if kacq:
                    PyBuffer_Release(&kb)
                    kacq = False
        return added

    cdef int reserve_for(self, Column* kc, Column* vc, Py_ssize_t start,
                         Py_ssize_t stop, Py_ssize_t max_bytes) except -1:
        """Room for rows ``start:stop`` if they are like the first few (and the batch no
        larger than ``max_bytes``, if given), in one go: one allocation instead of a chain of
        doublings, and a large one is hinted to use huge pages throughout."""
        cdef Py_ssize_t n = stop - start
        cdef Py_ssize_t i, sample = n if n < 32 else 32, total = 0, klen, vlen, want, slack
        cdef const uint8_t* p = NULL
        cdef Py_buffer b
        cdef bint acq = False
        if n < 1024:
            return 0
        for i in range(start, start + sample):
            column_get(kc, i, &p, &klen, &b, &acq)
            if acq:
                PyBuffer_Release(&b)
                acq = False
            column_get(vc, i, &p, &vlen, &b, &acq)
            if acq:
                PyBuffer_Release(&b)
                acq = False
            total += (klen if klen > 0 else 0) + (vlen if vlen > 0 else 0) + 16
        want = total // sample * n
        slack = want // 8  # a little slack beats a doubling of the whole buffer
        if max_bytes > 0:  # no more than a limited call can write
            want = min(want, max_bytes - self.out.size)
            slack = min(slack, max_bytes - self.out.size - want)
        if want <= 0 or self.out.size + want <= self.out.cap:
            return 0  # the buffer (a pooled one, say) already holds what the sample says
        # Capped: a sample of large records ahead of many small ones must not ask for GBs
        # (past the cap the buffer grows by doubling, as without the estimate).
        self.reserve(min(want + slack, RESERVE_CAP), True)
        return 0

    def build(self):
        """Finish the batch: compress the records if asked, fill in the header and CRC."""
        cdef Py_ssize_t records_size = self.out.size - BATCH_HEADER_SIZE
        cdef bytes payload = None
        cdef Py_ssize_t payload_size = records_size
        cdef int16_t attributes = <int16_t>self.codec
        cdef bytes result
        cdef uint8_t* p
        cdef uint32_t crc
        if self._ended is not None:
            self.raise_ended()
        if self.codec != CODEC_NONE and self.record_count > 0:
            # A view of the records where they are (no copy, and the framings' per-block
            # slices of a memoryview copy nothing either).
            payload = compress_payload(
                self.codec,
                memoryview(<object>self._batch)[BATCH_HEADER_SIZE:self.out.size],
                self.level)
            payload_size = len(payload)
        if self.timestamp_type:
            attributes |= ATTR_TIMESTAMP_TYPE
        if self.transactional:
            attributes |= ATTR_TRANSACTIONAL
        if self.is_control:
            attributes |= ATTR_CONTROL
        if payload is None:
            # Uncompressed: finish the batch in place and hand the object over (shrinking a
            # sole-owned bytes object is a realloc, not a copy).
            self.reserve(0)  # a private object if the last build() handed the previous out
            if self._pool is not None:
                # Only the length shrinks: the allocation stays whole for the next batch.
                kcore_bytes_set_length(self._batch, self.out.size)
            elif (self._keep_slack and self._alloc >= KEEP_SLACK_FROM
                  and self._alloc - self.out.size <= self._alloc // 4):
                # A large batch keeps its little slack (reserve_for asks 1/8 more than its
                # sample, which counts 16 bytes of framing a record, more than most take).
                # Shrinking it (glibc: an mremap) lowers the size glibc remembers
                # for its mmap threshold below the next such batch, so every batch got fresh
                # pages, each faulted in; unshrunk, the next one reuses the freed memory.
                kcore_bytes_set_length(self._batch, self.out.size)
            else:
                self.resize(self.out.size)
                self._alloc = self.out.size
            self.out.cap = self.out.size
            self.out.data = <uint8_t*>PyBytes_AS_STRING(<object>self._batch)
            result = <bytes>self._batch
            self._handed_out = True
        else:
            result = PyBytes_FromStringAndSize(NULL, BATCH_HEADER_SIZE + payload_size)
        p = <uint8_t*>PyBytes_AS_STRING(result)
        put_i64(p, self.base_offset)
        put_i32(p + 8, <int32_t>(BATCH_HEADER_SIZE + payload_size - 12))
        put_i32(p + 12, self.partition_leader_epoch)
        p[16] = 2
        put_i16(p + 21, attributes)
        put_i32(p + 23, self.record_count - 1 if self.record_count > 0 else -1)
        put_i64(p + 27, self.base_timestamp if self.record_count > 0 else -1)
        put_i64(p + 35, self.max_timestamp)
        put_i64(p + 43, self.producer_id)
        put_i16(p + 51, self.producer_epoch)
        put_i32(p + 53, self.base_sequence)
        put_i32(p + 57, self.record_count)
        if payload is not None:
            memcpy(p + BATCH_HEADER_SIZE, PyBytes_AS_STRING(payload), payload_size)
            crc = kcore_crc32c(0, p + ATTRIBUTES_OFFSET,
                               BATCH_HEADER_SIZE + payload_size - ATTRIBUTES_OFFSET)
        else:
            self.checksum_records()  # the records in place: only those after crc_upto
            crc = kcore_crc32c_join(
                kcore_crc32c(0, p + ATTRIBUTES_OFFSET, BATCH_HEADER_SIZE - ATTRIBUTES_OFFSET),
                self.records_crc, records_size)
        put_i32(p + CRC_OFFSET, <int32_t>crc)
        return result


cdef bint _exact_ints(list values):
    cdef Py_ssize_t i
    for i in range(PyList_GET_SIZE(values)):
        if not PyLong_CheckExact(<object>PyList_GET_ITEM(values, i)):
            return False
    return True


cdef object _int64_view(object values):
    """A 1-d int64 memoryview of ``values`` if it exposes one (numpy, pyarrow), else None."""
    if isinstance(values, (list, tuple)):
        return None
    try:
        mv = memoryview(values)
    except TypeError:
        if type(values).__module__.startswith("pyarrow") and hasattr(values, "to_numpy"):
            return _int64_view(values.to_numpy(zero_copy_only=False))
        return None
    if mv.ndim != 1 or mv.format not in ("q", "l", "<q", "<l", "=q", "=l") or mv.itemsize != 8:
        return None
    if not mv.c_contiguous:
        return None
    return mv


cdef list normalise_headers(object headers):
    cdef list out = []
    for item in headers:
        hkey, hval = item
        if isinstance(hkey, str):
            hkey = (<str>hkey).encode("utf-8")
        elif not isinstance(hkey, bytes):
            hkey = bytes(hkey)
        if hval is not None and not isinstance(hval, bytes):
            if isinstance(hval, str):
                raise TypeError("header values are bytes or None, not str")
            hval = bytes(hval)
        out.append((hkey, hval))
    return out


cdef Py_ssize_t headers_size(list headers) except -1:
    cdef Py_ssize_t size = 0, n
    for hkey, hval in headers:
        n = PyBytes_GET_SIZE(hkey)
        size += uvarint_size(zigzag32(<int32_t>n)) + n
        if hval is None:
            size += 1
        else:
            n = PyBytes_GET_SIZE(hval)
            size += uvarint_size(zigzag32(<int32_t>n)) + n
    return size


cdef uint8_t* write_headers(uint8_t* p, list headers) except NULL:
    cdef Py_ssize_t n
    for hkey, hval in headers:
        n = PyBytes_GET_SIZE(hkey)
        p += put_uvarint64(p, zigzag32(<int32_t>n))
        memcpy(p, PyBytes_AS_STRING(hkey), n)
        p += n
        if hval is None:
            p += put_uvarint64(p, zigzag32(-1))
        else:
            n = PyBytes_GET_SIZE(hval)
            p += put_uvarint64(p, zigzag32(<int32_t>n))
            memcpy(p, PyBytes_AS_STRING(hval), n)
            p += n
    return p


def prepare_headers(object headers, Py_ssize_t n):
    """Check the headers of ``n`` records as ``append_many`` takes them, before any is
    written: a pyarrow ``list<struct<key, value>>`` array (returned as one contiguous array:
    type, length and null keys checked) or one entry per record, None or ``(key, value)``
    pairs (returned normalised: str keys as UTF-8 bytes). Raises TypeError or ValueError."""
    cdef HeaderColumns hc
    cdef _ColumnHolder kh = _ColumnHolder(), vh = _ColumnHolder()
    cdef Py_ssize_t i, start = 0, end = 0
    if headers is None:
        return None
    if (type(headers).__module__ or "").startswith("pyarrow"):
        if hasattr(headers, "combine_chunks"):
            headers = headers.combine_chunks()
        header_columns_open(headers, n, &hc, kh, vh)
        for i in range(n):  # sizes every row's headers: null keys and oversized ones raise
            header_range(&hc, i, &start, &end)
            header_columns_size(&hc, start, end)
        return headers
    rows = [normalise_headers(row) if row else None for row in headers]
    if len(rows) != n:
        raise ValueError(f"{len(rows)} header lists for {n} values")
    return rows


def partitions_for_keys(object keys, int32_t num_partitions):
    """:func:`partition_for_key` for a whole column of keys (a list/tuple of bytes-like or str,
    a numpy fixed-width bytes array, or a pyarrow binary array) in one call: an ``array('i')``
    of partitions, -1 where a key is null (the caller picks those as for unkeyed records)."""
    cdef Column col
    cdef _ColumnHolder holder = _ColumnHolder()
    cdef Py_ssize_t i, n
    cdef const uint8_t* p = NULL
    cdef Py_ssize_t klen
    cdef Py_buffer kb
    cdef bint kacq = False
    cdef int32_t* out
    if num_partitions <= 0:
        raise ValueError("num_partitions must be positive")
    column_open(keys, &col, holder)
    if col.kind == COL_NULL:
        raise TypeError("keys must be a sequence or array")
    n = col.length
    result = _array("i", bytes(4 * n))
    view = memoryview(result)  # kept alive while out points into it
    out = <int32_t*><Py_ssize_t>_address_of(view) if n > 0 else NULL
    for i in range(n):
        column_get(&col, i, &p, &klen, &kb, &kacq)
        try:
            if klen < 0:
                out[i] = -1
            else:
                out[i] = key_partition(p, klen, num_partitions)
        finally:
            if kacq:
                PyBuffer_Release(&kb)
                kacq = False
    return result


cdef Py_ssize_t field_size(object data) except -1:
    """A length-prefixed record field as Java sizes it: its zigzag length varint and its bytes,
    a null one byte. What is neither text nor a contiguous buffer counts as empty (the append
    that follows refuses it, with its own message)."""
    cdef ByteView v
    cdef Py_buffer pybuf
    cdef Py_ssize_t n = 0
    if data is None:
        return 1
    if PyUnicode_Check(data):  # a header key
        PyUnicode_AsUTF8AndSize(data, &n)
    else:
        try:
            view_open(data, &v, &pybuf)
        except (TypeError, BufferError):
            pass
        else:
            n = v.size
            view_close(&v, &pybuf)
    return uvarint_size(<uint64_t>n << 1) + n


def record_size_upper_bound(key, value, headers=None):
    """Java's AbstractRecords.estimateSizeInBytesUpperBound for one record alone in a v2 batch
    (what its producer compares with max.request.size and buffer.memory): the batch header, the
    record's fixed overhead, each field with its length varint (a null is one byte), the header
    count and each header's key and value."""
    cdef Py_ssize_t size = BATCH_HEADER_SIZE + 21 + field_size(key) + field_size(value)
    if not headers:
        return size + 1  # a header count of 0
    size += uvarint_size(<uint64_t>len(headers) << 1)
    for hkey, hvalue in headers:
        size += field_size(hkey) + field_size(hvalue)
    return size
