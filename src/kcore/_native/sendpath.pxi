# The producer's per-record path, compiled: choose the partition (murmur2 for keys, the sticky
# partition otherwise), append the record to its partition's open batch, make the future. The
# producer (kcore.producer) owns everything else and takes over, through `slow`, whenever a
# record needs a new batch, the topic's metadata, a serializer, a custom partitioner or a
# callback. The GIL is held throughout (nothing here calls back into Python on the fast path),
# which is what keeps it consistent with the sender thread: the sender closes a batch before it
# builds it, and a closed batch is never appended to here.

from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from random import choice as _random_choice


cdef class RecordFutureBase:
    """Fields of kcore.producer.DeliveryFuture (its methods are Python)."""
    cdef public object _batch
    cdef public Py_ssize_t _index
    cdef public object topic
    cdef public int32_t partition
    cdef public int64_t timestamp


cdef inline int64_t now_ms() noexcept:
    cdef timespec t
    clock_gettime(CLOCK_REALTIME, &t)
    return <int64_t>t.tv_sec * 1000 + t.tv_nsec // 1000000


cdef class SendPath:
    """``send(topic, value, key, partition, timestamp_ms, headers)`` for the common case, or
    the result of ``slow(...)`` with the same arguments."""

    cdef public object slow       # the producer's Python send, for everything else
    cdef object future_type       # DeliveryFuture (a subclass of RecordFutureBase)
    cdef object tp_type           # TopicPartition
    cdef object queues            # the accumulator's {TopicPartition: deque[ProducerBatch]}
    cdef object cache             # the MetadataCache; its `current` changes on refresh
    cdef object seen_metadata
    cdef dict topics              # topic -> list of TopicPartition, one per partition
    cdef dict sticky              # topic -> [partition, bytes sent to it]
    cdef Py_ssize_t batch_size
    cdef public bint enabled      # off: always the slow path (closed, or custom settings)

    def __init__(self, slow, future_type, tp_type, queues, cache, Py_ssize_t batch_size,
                 bint enabled=True):
        self.slow = slow
        self.future_type = future_type
        self.tp_type = tp_type
        self.queues = queues
        self.cache = cache
        self.seen_metadata = None
        self.topics = {}
        self.sticky = {}
        self.batch_size = batch_size
        self.enabled = enabled

    def sticky_partition(self, str topic, int32_t count, object available, Py_ssize_t size):
        """The uniform sticky partitioner (KIP-794): the topic's current partition until about
        ``batch.size`` bytes went to it, then another at random among ``available`` (those
        with a leader). One state for send, send_batch and this fast path."""
        cdef list state = <list>self.sticky.get(topic)
        if state is None or <int32_t>state[0] >= count or <Py_ssize_t>state[1] >= self.batch_size:
            choices = [q for q in available if q < count] or list(range(count))
            if state is not None and len(choices) > 1:
                choices = [q for q in choices if q != state[0]] or choices
            state = [_random_choice(choices), 0]
            self.sticky[topic] = state
        state[1] = <Py_ssize_t>state[1] + size
        return state[0]

    def send(self, topic, value, key=None, partition=None, timestamp_ms=None, headers=None,
             on_delivery=None):
        cdef list tps
        cdef int32_t p, count
        cdef int64_t ts
        cdef Py_ssize_t klen = -1, vlen = -1, size_before, index
        cdef const uint8_t* kp = NULL
        cdef const uint8_t* vp = NULL
        cdef RecordBatchBuilder builder
        cdef RecordFutureBase future
        cdef list state
        if (not self.enabled or on_delivery is not None or headers
                or (key is not None and type(key) is not bytes)
                or (value is not None and type(value) is not bytes)
                or type(topic) is not str):
            return self.slow(topic, value, key, partition, timestamp_ms, headers, on_delivery)
        md = self.cache.current
        if md is not self.seen_metadata:  # a refresh: partition counts may have changed
            self.seen_metadata = md
            self.topics.clear()
        tps = <list>self.topics.get(topic)
        if tps is None:
            info = md.topics.get(topic)
            if info is None or not info.partitions:
                return self.slow(topic, value, key, partition, timestamp_ms, headers, on_delivery)
            tps = [self.tp_type(topic, i) for i in range(len(info.partitions))]
            self.topics[topic] = tps
        count = <int32_t>len(tps)
        if key is not None:
            kp = <const uint8_t*>PyBytes_AS_STRING(key)
            klen = PyBytes_GET_SIZE(key)
        if value is not None:
            vp = <const uint8_t*>PyBytes_AS_STRING(value)
            vlen = PyBytes_GET_SIZE(value)
        if partition is not None:
            p = partition
            if p < 0 or p >= count:
                return self.slow(topic, value, key, partition, timestamp_ms, headers, on_delivery)
        elif kp != NULL:
            p = (murmur2_c(kp, klen) & 0x7FFFFFFF) % count
        else:
            state = <list>self.sticky.get(topic)
            if state is None or <int32_t>state[0] >= count or <Py_ssize_t>state[1] >= self.batch_size:
                info = md.topics.get(topic)
                available = [q for q, pi in info.partitions.items() if pi.leader >= 0]
                p = self.sticky_partition(topic, count, available, 21 + max(vlen, 0))
            else:
                p = state[0]
                state[1] = <Py_ssize_t>state[1] + 21 + max(vlen, 0)
        tp = tps[p]
        queue = self.queues.get(tp)
        if not queue:
            return self.slow(topic, value, key, p, timestamp_ms, headers, on_delivery)
        batch = queue[len(queue) - 1]  # (wraparound is off: no negative index)
        if batch.closed:
            return self.slow(topic, value, key, p, timestamp_ms, headers, on_delivery)
        builder = <RecordBatchBuilder>batch.builder
        index = batch.records
        if index > 0 and builder.out.size + 21 + max(klen, 0) + max(vlen, 0) > self.batch_size:
            return self.slow(topic, value, key, p, timestamp_ms, headers, on_delivery)
        ts = now_ms() if timestamp_ms is None else <int64_t>timestamp_ms
        builder.write_record(kp, klen, vp, vlen, ts, None, 0, 0)
        batch.records = index + 1
        if builder.out.size >= self.batch_size:
            batch.closed = True  # full: the sender takes it at its next look
        future = <RecordFutureBase>self.future_type.__new__(self.future_type)
        future._batch = batch.result
        future._index = index
        future.topic = topic
        future.partition = p
        future.timestamp = ts
        return future
