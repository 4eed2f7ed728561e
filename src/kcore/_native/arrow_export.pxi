# A ColumnarRecords handed to pyarrow through the Arrow C data interface (its PyCapsule form):
# one struct array whose children are the columns, their buffers the columns' own memory. One
# import makes the whole pyarrow.RecordBatch, where wrapping each buffer and column took a
# pyarrow call apiece (a dozen, ~50 µs: most of what a 500-row poll_arrow cost in Arrow).
#
# The rules kept here: the exported ArrowArray holds a reference to the ColumnarRecords (and to
# the extra column's buffer), dropped by its release callback, which takes the GIL for it (Arrow
# may release an array on any thread); the columns are not appended to once exported (a
# ColumnarRecords is filled, then converted); a buffer pointer is never NULL (older pyarrow
# releases refuse one even for an empty buffer).

from cpython.pycapsule cimport (
    PyCapsule_GetPointer,
    PyCapsule_IsValid,
    PyCapsule_New,
)

cdef extern from *:
    """
    #ifndef ARROW_C_DATA_INTERFACE
    #define ARROW_C_DATA_INTERFACE
    struct ArrowSchema {
      const char* format;
      const char* name;
      const char* metadata;
      int64_t flags;
      int64_t n_children;
      struct ArrowSchema** children;
      struct ArrowSchema* dictionary;
      void (*release)(struct ArrowSchema*);
      void* private_data;
    };
    struct ArrowArray {
      int64_t length;
      int64_t null_count;
      int64_t offset;
      int64_t n_buffers;
      int64_t n_children;
      const void** buffers;
      struct ArrowArray** children;
      struct ArrowArray* dictionary;
      void (*release)(struct ArrowArray*);
      void* private_data;
    };
    #endif
    """
    struct ArrowArray:
        int64_t length
        int64_t null_count
        int64_t offset
        int64_t n_buffers
        int64_t n_children
        const void** buffers
        ArrowArray** children
        ArrowArray* dictionary
        void (*release)(ArrowArray*) noexcept nogil
        void* private_data


cdef enum:
    EXPORT_NODES = 16  # arrays below the top one: 9 columns, the headers' struct and its 2
    EXPORT_BUFFERS = 40


# Everything an exported batch points to, in one block freed by the top array's release.
ctypedef struct ExportBlock:
    ArrowArray nodes[EXPORT_NODES]
    ArrowArray* child_slots[EXPORT_NODES]
    const void* buffers[EXPORT_BUFFERS]
    int n_nodes
    int n_child_slots
    int n_buffers
    PyObject* owner  # the ColumnarRecords
    PyObject* extra_owner  # the extra column's ColumnBuffer, or NULL


cdef void release_children(ArrowArray* a) noexcept nogil:
    cdef int64_t i
    cdef ArrowArray* child
    for i in range(a.n_children):
        child = a.children[i]
        if child.release != NULL:
            child.release(child)


cdef void release_child(ArrowArray* a) noexcept nogil:
    # A child's memory is the block's, freed with the top array.
    release_children(a)
    a.release = NULL


cdef void release_top(ArrowArray* a) noexcept nogil:
    cdef ExportBlock* block = <ExportBlock*>a.private_data
    release_children(a)
    with gil:
        Py_XDECREF(block.owner)
        Py_XDECREF(block.extra_owner)
    free(block)
    a.release = NULL


cdef void array_capsule_destructor(object capsule) noexcept:
    # The consumer moved the array out (and owns its release) or never took it.
    cdef ArrowArray* a = <ArrowArray*>PyCapsule_GetPointer(capsule, "arrow_array")
    if a == NULL:
        return
    if a.release != NULL:
        a.release(a)
    free(a)


cdef const void* buffer_of(ColumnBuffer b) except NULL:
    if b.buf.data == NULL:
        out_reserve(&b.buf, 8)
    return b.buf.data


cdef ArrowArray* export_node(
    ExportBlock* block, ArrowArray* node, int64_t length, int64_t null_count, int n_buffers,
    int n_children
) noexcept:
    """Fill ``node`` (NULL: the block's next one) with room for its buffer and child pointers."""
    if node == NULL:
        node = &block.nodes[block.n_nodes]
        block.n_nodes += 1
        node.release = release_child
        node.private_data = NULL
    node.length = length
    node.null_count = null_count
    node.offset = 0
    node.n_buffers = n_buffers
    node.n_children = n_children
    node.buffers = &block.buffers[block.n_buffers]
    block.n_buffers += n_buffers
    node.children = &block.child_slots[block.n_child_slots] if n_children else NULL
    block.n_child_slots += n_children
    node.dictionary = NULL
    return node


cdef int export_binary(
    ExportBlock* block, ArrowArray* parent, int slot, int64_t n, Py_ssize_t nulls,
    ColumnBuffer validity, ColumnBuffer offsets, ColumnBuffer data
) except -1:
    """A binary or utf8 column: validity (only with nulls), int32 offsets, data."""
    cdef ArrowArray* node = export_node(block, NULL, n, nulls, 3, 0)
    node.buffers[0] = buffer_of(validity) if nulls else NULL
    node.buffers[1] = buffer_of(offsets)
    node.buffers[2] = buffer_of(data)
    parent.children[slot] = node
    return 0


cdef int export_fixed(
    ExportBlock* block, ArrowArray* parent, int slot, int64_t n, ColumnBuffer values
) except -1:
    cdef ArrowArray* node = export_node(block, NULL, n, 0, 2, 0)
    node.buffers[0] = NULL
    node.buffers[1] = buffer_of(values)
    parent.children[slot] = node
    return 0


cdef object export_columns(ColumnarRecords cols, ColumnBuffer extra):
    """``cols`` (and ``extra``, an int32 column, or None) as an "arrow_array" capsule holding
    a struct array of the columns in ``to_arrow``'s order."""
    cdef int64_t n = cols.num_rows
    cdef int n_columns = 5 + (2 if cols.with_source else 0) + (1 if cols.include_headers else 0)
    n_columns += 1 if extra is not None else 0
    cdef ArrowArray* top = <ArrowArray*>malloc(sizeof(ArrowArray))
    if top == NULL:
        raise MemoryError()
    top.release = NULL
    cdef ExportBlock* block = <ExportBlock*>malloc(sizeof(ExportBlock))
    if block == NULL:
        free(top)
        raise MemoryError()
    block.n_nodes = block.n_child_slots = block.n_buffers = 0
    block.owner = block.extra_owner = NULL
    cdef int slot = 0
    cdef ArrowArray* headers
    cdef ArrowArray* pairs
    try:
        export_node(block, top, n, 0, 1, n_columns)
        top.buffers[0] = NULL
        export_binary(block, top, slot, n, cols.key_nulls, cols.key_validity, cols.key_offsets,
                      cols.key_data)
        slot += 1
        export_binary(block, top, slot, n, cols.value_nulls, cols.value_validity,
                      cols.value_offsets, cols.value_data)
        slot += 1
        if cols.with_source:
            export_binary(block, top, slot, n, 0, cols.topic_offsets, cols.topic_offsets,
                          cols.topic_data)
            slot += 1
            export_fixed(block, top, slot, n, cols.partition)
            slot += 1
        export_fixed(block, top, slot, n, cols.offset)
        slot += 1
        export_fixed(block, top, slot, n, cols.timestamp)
        slot += 1
        export_fixed(block, top, slot, n, cols.timestamp_type)
        slot += 1
        if cols.include_headers:
            headers = export_node(block, NULL, n, 0, 2, 1)
            headers.buffers[0] = NULL
            headers.buffers[1] = buffer_of(cols.header_offsets)
            top.children[slot] = headers
            slot += 1
            pairs = export_node(block, NULL, cols.num_headers, 0, 1, 2)
            pairs.buffers[0] = NULL
            headers.children[0] = pairs
            export_binary(block, pairs, 0, cols.num_headers, 0, cols.header_key_offsets,
                          cols.header_key_offsets, cols.header_key_data)
            export_binary(block, pairs, 1, cols.num_headers, cols.header_value_nulls,
                          cols.header_value_validity, cols.header_value_offsets,
                          cols.header_value_data)
        if extra is not None:
            if len(extra) < n * 4:
                raise ValueError(f"the extra column holds {len(extra) // 4} values, not {n}")
            export_fixed(block, top, slot, n, extra)
            slot += 1
    except BaseException:
        free(block)
        free(top)
        raise
    # From here on the block is the top array's: its release frees it.
    Py_INCREF(cols)
    block.owner = <PyObject*>cols
    if extra is not None:
        Py_INCREF(extra)
        block.extra_owner = <PyObject*>extra
    top.private_data = block
    top.release = release_top
    return PyCapsule_New(top, "arrow_array", array_capsule_destructor)


# Schemas by (timestamp unit, with_source, include_headers, extra column's name).
cdef dict arrow_schemas = {}


cdef object arrow_schema(ColumnarRecords cols, str extra_name):
    key = (cols.ts_scale, cols.with_source, cols.include_headers, extra_name)
    found = arrow_schemas.get(key)
    if found is not None:
        return found
    import pyarrow as pa

    fields = [pa.field("key", pa.binary()), pa.field("value", pa.binary())]
    if cols.with_source:
        fields += [pa.field("topic", pa.string()), pa.field("partition", pa.int32())]
    unit = "ms" if cols.ts_scale == 1 else "us"
    fields += [
        pa.field("offset", pa.int64()),
        pa.field("timestamp", pa.timestamp(unit, tz="UTC")),
        pa.field("timestampType", pa.int32()),
    ]
    if cols.include_headers:
        pair = pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())])
        fields.append(pa.field("headers", pa.list_(pa.field("item", pair))))
    if extra_name is not None:
        fields.append(pa.field(extra_name, pa.int32()))
    schema = pa.schema(fields)
    arrow_schemas[key] = schema
    return schema


cdef class ArrowColumns:
    """A ColumnarRecords (and an extra int32 column) as Arrow data: ``__arrow_c_array__`` is the
    Arrow PyCapsule interface, so ``pyarrow.record_batch(ArrowColumns(...))`` (or any library
    that takes the interface) reads the columns without copying them."""

    cdef ColumnarRecords cols
    cdef ColumnBuffer extra
    cdef str extra_name

    def __cinit__(self, ColumnarRecords cols, ColumnBuffer extra=None, str extra_name=None):
        if (extra is None) != (extra_name is None):
            raise ValueError("an extra column needs both its values and its name")
        self.cols = cols
        self.extra = extra
        self.extra_name = extra_name

    def __arrow_c_array__(self, requested_schema=None):
        """``(schema capsule, array capsule)``: a struct array of the columns. A requested
        schema is not applied (the interface lets the producer give its own)."""
        schema = arrow_schema(self.cols, self.extra_name)
        return schema.__arrow_c_schema__(), export_columns(self.cols, self.extra)
