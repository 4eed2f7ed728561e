# cython: language_level=3
"""The metrics' recording, compiled (kcore.metrics is the module to read): the network thread
records several values a request (bytes out, request latency, batch sizes, ...), and in Python
that was about a tenth of its time with one batch a request.

``SensorSet`` keeps one client's sensors by name under one lock, taken without a Python call;
``Sensor`` keeps one sensor's total and its time windows in C.

The rule the lock keeps: while it is held, no Python code runs and no object the garbage
collector tracks is made (a collection may run finalizers, which are Python code, and one that
records a metric would wait for the lock for ever). So values are checked and converted to C
doubles, and missing sensors made, before the lock is taken; under it there are only dict
lookups and inserts by exact ``str`` (their hash and comparison are C) and C arithmetic, and
readers copy a sensor's numbers out under it and build their results after. Waiting for the
lock releases the GIL (src/kcore/_native/pylock.pxi).
"""

cimport cython
from cpython.dict cimport PyDict_GetItem, PyDict_SetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject
from cpython.pythread cimport PyThread_free_lock, PyThread_release_lock, PyThread_type_lock
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.math cimport INFINITY, NAN, copysign, floor, fmod
from libc.stdlib cimport free, malloc, realloc
from libc.string cimport memcpy

from time import monotonic as _monotonic

include "_native/pylock.pxi"

# The statistics a sensor reports, each as "<sensor name>-<stat>".
TOTAL, RATE, AVG, MAX = "total", "rate", "avg", "max"
cdef tuple EVERY_STAT = (TOTAL, RATE, AVG, MAX)


cdef struct Window:
    double start
    double count
    double sum
    double max


cdef double floor_div(double a, double b) noexcept:
    """``a // b`` as Python computes it for floats (not ``floor(a / b)``, which differs at
    exact multiples: 1.0 // 0.1 is 9.0)."""
    cdef double mod = fmod(a, b), div, whole
    div = (a - mod) / b
    if mod and (b < 0) != (mod < 0):
        div -= 1.0
    if not div:
        return copysign(0.0, a / b)
    whole = floor(div)
    if div - whole > 0.5:
        whole += 1.0
    return whole


cdef int first_live(const Window *windows, int held, int samples, double window_s,
                    double now) noexcept:
    """The index of the oldest window still inside ``samples`` windows of ``now``."""
    cdef double oldest = now - samples * window_s
    cdef int i = 0
    while i < held and not windows[i].start > oldest:
        i += 1
    return i


cdef double per_second(const Window *windows, int held, int samples, double window_s,
                       double now, bint counts) noexcept:
    cdef int first = first_live(windows, held, samples, window_s, now)
    cdef double elapsed, full, total = 0.0
    if first == held:
        return 0.0
    elapsed = now - windows[first].start
    # As Java's Rate: never less than (samples - 1) whole windows.
    full = floor_div(elapsed, window_s)
    if full < samples - 1:
        elapsed += (samples - 1 - full) * window_s
    for i in range(first, held):
        total += windows[i].count if counts else windows[i].sum
    return total / elapsed if elapsed > 0 else 0.0


cdef double average(const Window *windows, int held, int samples, double window_s,
                    double now) noexcept:
    cdef double count = 0.0, total = 0.0
    for i in range(first_live(windows, held, samples, window_s, now), held):
        count += windows[i].count
        total += windows[i].sum
    return total / count if count else NAN


cdef double maximum(const Window *windows, int held, int samples, double window_s,
                    double now) noexcept:
    cdef int first = first_live(windows, held, samples, window_s, now)
    cdef double top = -INFINITY
    if first == held:
        return NAN
    for i in range(first, held):
        if windows[i].max > top:
            top = windows[i].max
    return top


@cython.final
cdef class Sensor:
    """Values recorded over time: their cumulative total, and count, sum and maximum per time
    window (Java's SampledStat with ``samples`` windows of ``window_s``). Not locked itself:
    a SensorSet's lock guards its sensors."""

    cdef readonly str name
    cdef readonly tuple stats
    cdef public double total
    cdef public long long count
    cdef readonly double window_s
    cdef readonly int samples
    # The windows, oldest first: ``held`` of them, at most ``samples``.
    cdef Window *windows
    cdef int held

    def __cinit__(self, str name, tuple stats, double window_s, int samples):
        self.name = name
        self.stats = stats
        self.window_s = window_s
        self.samples = max(1, samples)
        self.windows = <Window *>malloc(self.samples * sizeof(Window))
        if self.windows is NULL:
            raise MemoryError("no memory for a sensor's windows")

    def __dealloc__(self):
        free(self.windows)

    cdef inline void add(self, double value, double now) noexcept:
        """One value at ``now``, in the window it falls in: a new one when the newest is
        ``window_s`` old (the oldest dropped past ``samples``)."""
        cdef Window *w
        if self.held == 0 or now - self.windows[self.held - 1].start >= self.window_s:
            if self.held == self.samples:
                for i in range(self.held - 1):
                    self.windows[i] = self.windows[i + 1]
                self.held -= 1
            w = &self.windows[self.held]
            w.start = now
            w.count = 0.0
            w.sum = 0.0
            w.max = -INFINITY
            self.held += 1
        w = &self.windows[self.held - 1]
        self.total += value
        self.count += 1
        w.count += 1.0
        w.sum += value
        if value > w.max:
            w.max = value

    def record(self, double value, double now):
        self.add(value, now)

    def record_many(self, values, double now):
        """``record`` of each of ``values``, all at ``now``."""
        for value in values:
            self.add(value, now)

    def rate(self, double now):
        """The values' sum per second over the windows."""
        return per_second(self.windows, self.held, self.samples, self.window_s, now, False)

    def count_rate(self, double now):
        """How many values per second over the windows."""
        return per_second(self.windows, self.held, self.samples, self.window_s, now, True)

    def avg(self, double now):
        return average(self.windows, self.held, self.samples, self.window_s, now)

    def max(self, double now):
        return maximum(self.windows, self.held, self.samples, self.window_s, now)

    def read(self, double now):
        return stats_of(self, self.total, self.windows, self.held, now)


cdef dict stats_of(Sensor sensor, double total, const Window *windows, int held, double now):
    """``sensor``'s statistics from its numbers (its own, or a copy taken under a lock)."""
    cdef int samples = sensor.samples
    cdef double window_s = sensor.window_s
    cdef str name = sensor.name
    out = {}
    for stat in sensor.stats:
        if stat == TOTAL:
            out[f"{name}-total"] = total
        elif stat == RATE:
            out[f"{name}-rate"] = per_second(windows, held, samples, window_s, now, False)
        elif stat == AVG:
            out[f"{name}-avg"] = average(windows, held, samples, window_s, now)
        else:
            out[f"{name}-max"] = maximum(windows, held, samples, window_s, now)
    return out


cdef inline str sensor_name(object name):
    # Exactly a str: a subclass's hash or comparison would be Python code under the lock.
    if type(name) is not str:
        raise TypeError(f"a sensor's name is a str, not {type(name).__name__}")
    return <str>name


# What SensorSet.sensor_number reads.
cdef enum:
    COUNT
    SUM
    COUNT_RATE


cdef struct Numbers:
    double *data
    Py_ssize_t used
    Py_ssize_t cap
    bint on_heap


cdef int push(Numbers *numbers, double value) except -1:
    cdef double *grown
    if numbers.used == numbers.cap:
        if numbers.on_heap:
            grown = <double *>realloc(numbers.data, 2 * numbers.cap * sizeof(double))
        else:
            grown = <double *>malloc(2 * numbers.cap * sizeof(double))
            if grown is not NULL:
                memcpy(grown, numbers.data, numbers.used * sizeof(double))
        if grown is NULL:
            raise MemoryError("no memory for the values to record")
        numbers.data = grown
        numbers.cap *= 2
        numbers.on_heap = True
    numbers.data[numbers.used] = value
    numbers.used += 1
    return 0


cdef class SensorSet:
    """One client's sensors by name, under one lock (the network thread and the caller's both
    record). ``record_all`` makes a sensor on first use with the stats its name was declared
    with (``declare``), or every stat. Names are ``str``."""

    cdef dict sensors
    cdef readonly double window_s
    cdef readonly int samples
    cdef PyThread_type_lock lock

    def __cinit__(self, double window_s=30.0, int samples=2, *args, **kwargs):
        self.sensors = {}
        self.window_s = window_s
        self.samples = samples
        self.lock = lock_new()

    def __dealloc__(self):
        if self.lock is not NULL:
            PyThread_free_lock(self.lock)

    cdef inline void acquire(self) noexcept:
        lock_acquire(self.lock)

    cdef inline void release(self) noexcept:
        PyThread_release_lock(self.lock)

    def declare(self, name, *stats):
        cdef str key = sensor_name(name)
        made = Sensor(key, tuple(stats), self.window_s, self.samples)
        self.acquire()
        try:
            if PyDict_GetItem(self.sensors, key) is NULL:
                PyDict_SetItem(self.sensors, key, made)
        finally:
            self.release()

    def record(self, name, value=1.0):
        self.record_all((name, value))

    def record_all(self, *values):
        """``record`` of each (name, value), at one time and under one lock: the producer
        records several per batch and per request. A list of values is each of them recorded
        (a request's batch sizes, say); an empty one records nothing. Nothing is recorded if
        any pair is not a (str, number or list of numbers) pair."""
        cdef double now = _monotonic()
        cdef Py_ssize_t pairs = PyTuple_GET_SIZE(values), i, j, k = 0
        cdef double small[32]
        cdef Py_ssize_t small_counts[8]
        cdef Numbers numbers
        cdef Py_ssize_t *counts = small_counts
        cdef PyObject *found
        cdef Sensor sensor
        cdef dict missing = None
        numbers.data = small
        numbers.used = 0
        numbers.cap = 32
        numbers.on_heap = False
        try:
            if pairs > 8:
                counts = <Py_ssize_t *>malloc(pairs * sizeof(Py_ssize_t))
                if counts is NULL:
                    raise MemoryError("no memory for the values to record")
            # Checked and converted without the lock: a number's __float__ is Python code, and
            # may change the list it is in (so its length is read again at each step).
            for i in range(pairs):
                pair = <object>PyTuple_GET_ITEM(values, i)
                if type(pair) is not tuple or PyTuple_GET_SIZE(pair) != 2:
                    raise TypeError(f"record_all takes (name, value) pairs, not {pair!r}")
                name = sensor_name(<object>PyTuple_GET_ITEM(pair, 0))
                value = <object>PyTuple_GET_ITEM(pair, 1)
                if type(value) is list:
                    j = 0
                    while j < PyList_GET_SIZE(value):
                        item = <object>PyList_GET_ITEM(value, j)
                        push(&numbers, item)
                        j += 1
                    counts[i] = j
                else:
                    push(&numbers, value)
                    counts[i] = 1
                if counts[i] and PyDict_GetItem(self.sensors, name) is NULL:
                    if missing is None:
                        missing = {}
                    if name not in missing:
                        missing[name] = Sensor(name, EVERY_STAT, self.window_s, self.samples)
            self.acquire()
            try:
                for i in range(pairs):
                    if not counts[i]:
                        continue
                    name = <object>PyTuple_GET_ITEM(<object>PyTuple_GET_ITEM(values, i), 0)
                    found = PyDict_GetItem(self.sensors, name)
                    if found is NULL:  # (sensors are never removed: one was made above)
                        PyDict_SetItem(self.sensors, name, missing[name])
                        found = PyDict_GetItem(self.sensors, name)
                    sensor = <Sensor>found
                    for j in range(counts[i]):
                        sensor.add(numbers.data[k], now)
                        k += 1
            finally:
                self.release()
        finally:
            if counts is not small_counts:
                free(counts)
            if numbers.on_heap:
                free(numbers.data)

    cdef double sensor_number(self, object name, int which) except? -1:
        """``name``'s count, total or count rate now (``which``), read under the lock; 0.0
        for a name never recorded."""
        cdef double now = _monotonic() if which == COUNT_RATE else 0.0, number = 0.0
        cdef PyObject *found
        cdef str key = sensor_name(name)
        self.acquire()
        found = PyDict_GetItem(self.sensors, key)
        if found is not NULL:
            if which == COUNT:
                number = (<Sensor>found).count
            elif which == SUM:
                number = (<Sensor>found).total
            else:
                number = per_second((<Sensor>found).windows, (<Sensor>found).held,
                                    (<Sensor>found).samples, (<Sensor>found).window_s, now,
                                    True)
        self.release()
        return number

    def count(self, name):
        """How many values ``name`` has recorded since the start (Java's CumulativeCount,
        e.g. ``fetch-total`` counted by the fetch-latency sensor)."""
        return self.sensor_number(name, COUNT)

    def total(self, name):
        """The sum of the values ``name`` has recorded since the start (its ``-total``)."""
        return self.sensor_number(name, SUM)

    def rate_of(self, name):
        """Values recorded per second over the windows (Java's Rate of a SampledStat count)."""
        return self.sensor_number(name, COUNT_RATE)

    def read_sensors(self):
        """Every sensor's statistics now, by metric name (unsorted)."""
        cdef double now = _monotonic(), total
        cdef int held
        cdef Sensor sensor
        cdef Window *copy = <Window *>malloc(max(1, self.samples) * sizeof(Window))
        if copy is NULL:
            raise MemoryError("no memory to read the sensors")
        out = {}
        try:
            for found in list(self.sensors.values()):  # (sensors are never removed)
                sensor = <Sensor>found
                self.acquire()
                total = sensor.total
                held = sensor.held
                memcpy(copy, sensor.windows, held * sizeof(Window))
                self.release()
                out.update(stats_of(sensor, total, copy, held, now))
        finally:
            free(copy)
        return out
