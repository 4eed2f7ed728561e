# cython: language_level=3
"""The metrics' recording, compiled (kcore.metrics is the module to read): the network thread
records several values a request (bytes out, request latency, batch sizes, ...), and in Python
that was about a tenth of its time with one batch a request.

``SensorSet`` keeps one client's sensors by name under one lock, taken without a Python call;
``Sensor`` keeps one sensor's total and its time windows in C. The rule the code keeps: under
the lock it runs no Python code of its own (dict lookups by ``str``, C arithmetic), and waiting
for the lock releases the GIL, so a holder that gives up the GIL (a garbage collection that
runs a finalizer) can always go on and release it (src/kcore/_native/pylock.pxi).
"""

cimport cython
from cpython.float cimport PyFloat_AS_DOUBLE, PyFloat_CheckExact
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.pythread cimport PyThread_free_lock, PyThread_release_lock, PyThread_type_lock
from cpython.tuple cimport PyTuple_GET_ITEM, PyTuple_GET_SIZE
from libc.math cimport INFINITY, NAN, floor
from libc.stdlib cimport free, malloc

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


@cython.final
cdef class Sensor:
    """Values recorded over time: their cumulative total, and count, sum and maximum per time
    window (Java's SampledStat with ``samples`` windows of ``window_s``). Not locked itself:
    a SensorSet's lock guards its sensors."""

    cdef readonly str name
    cdef readonly tuple stats
    cdef public double total
    cdef public long long count
    cdef double window_s
    cdef int samples
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

    cdef inline Window *current(self, double now) noexcept:
        """The window ``now`` falls in, a new one when the newest is ``window_s`` old (the
        oldest dropped past ``samples``)."""
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
        return &self.windows[self.held - 1]

    cdef inline void add(self, double value, double now) noexcept:
        cdef Window *w = self.current(now)
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

    cdef int first_live(self, double now) noexcept:
        """The index of the oldest window still inside ``samples`` windows of ``now``."""
        cdef double oldest = now - self.samples * self.window_s
        cdef int i = 0
        while i < self.held and not self.windows[i].start > oldest:
            i += 1
        return i

    cdef double per_second(self, double now, bint counts) noexcept:
        cdef int first = self.first_live(now)
        cdef double elapsed, full, total = 0.0
        if first == self.held:
            return 0.0
        elapsed = now - self.windows[first].start
        # As Java's Rate: never less than (samples - 1) whole windows.
        full = floor(elapsed / self.window_s)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_s
        for i in range(first, self.held):
            total += self.windows[i].count if counts else self.windows[i].sum
        return total / elapsed if elapsed > 0 else 0.0

    def rate(self, double now):
        """The values' sum per second over the windows."""
        return self.per_second(now, False)

    def count_rate(self, double now):
        """How many values per second over the windows."""
        return self.per_second(now, True)

    def avg(self, double now):
        cdef double count = 0.0, total = 0.0
        for i in range(self.first_live(now), self.held):
            count += self.windows[i].count
            total += self.windows[i].sum
        return total / count if count else NAN

    def max(self, double now):
        cdef int first = self.first_live(now)
        cdef double top = -INFINITY
        if first == self.held:
            return NAN
        for i in range(first, self.held):
            if self.windows[i].max > top:
                top = self.windows[i].max
        return top

    def read(self, double now):
        out = {}
        for stat in self.stats:
            if stat == TOTAL:
                out[f"{self.name}-total"] = self.total
            elif stat == RATE:
                out[f"{self.name}-rate"] = self.rate(now)
            elif stat == AVG:
                out[f"{self.name}-avg"] = self.avg(now)
            else:
                out[f"{self.name}-max"] = self.max(now)
        return out


cdef class SensorSet:
    """One client's sensors by name, under one lock (the network thread and the caller's both
    record). ``record_all`` makes a sensor on first use with the stats its name was declared
    with (``declare``), or every stat."""

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

    cdef Sensor sensor(self, str name):
        """``name``'s sensor, made with every stat if it was not declared (lock held)."""
        found = self.sensors.get(name)
        if found is not None:
            return <Sensor>found
        made = Sensor(name, EVERY_STAT, self.window_s, self.samples)
        self.sensors[name] = made
        return made

    def declare(self, str name, *stats):
        made = Sensor(name, tuple(stats), self.window_s, self.samples)
        self.acquire()
        try:
            if name not in self.sensors:
                self.sensors[name] = made
        finally:
            self.release()

    def record(self, str name, value=1.0):
        self.record_all((name, value))

    def record_all(self, *values):
        """``record`` of each (name, value), at one time and under one lock: the producer
        records several per batch and per request. A list of values is each of them recorded
        (a request's batch sizes, say)."""
        cdef double now = _monotonic()
        cdef Py_ssize_t i, j, n
        cdef Sensor sensor
        cdef tuple pair
        cdef list many
        self.acquire()
        try:
            for i in range(PyTuple_GET_SIZE(values)):
                pair = <tuple>PyTuple_GET_ITEM(values, i)
                value = <object>PyTuple_GET_ITEM(pair, 1)
                if type(value) is list:
                    many = <list>value
                    n = PyList_GET_SIZE(many)
                    if n == 0:
                        continue
                    sensor = self.sensor(<str>PyTuple_GET_ITEM(pair, 0))
                    for j in range(n):
                        sensor.add(<object>PyList_GET_ITEM(many, j), now)
                else:
                    sensor = self.sensor(<str>PyTuple_GET_ITEM(pair, 0))
                    if PyFloat_CheckExact(value):
                        sensor.add(PyFloat_AS_DOUBLE(value), now)
                    else:
                        sensor.add(value, now)
        finally:
            self.release()

    def count(self, str name):
        """How many values ``name`` has recorded since the start (Java's CumulativeCount,
        e.g. ``fetch-total`` counted by the fetch-latency sensor)."""
        self.acquire()
        try:
            found = self.sensors.get(name)
            return float((<Sensor>found).count) if found is not None else 0.0
        finally:
            self.release()

    def total(self, str name):
        """The sum of the values ``name`` has recorded since the start (its ``-total``)."""
        self.acquire()
        try:
            found = self.sensors.get(name)
            return (<Sensor>found).total if found is not None else 0.0
        finally:
            self.release()

    def rate_of(self, str name):
        """Values recorded per second over the windows (Java's Rate of a SampledStat count)."""
        cdef double now = _monotonic()
        self.acquire()
        try:
            found = self.sensors.get(name)
            return (<Sensor>found).per_second(now, True) if found is not None else 0.0
        finally:
            self.release()

    def read_sensors(self):
        """Every sensor's statistics now, by metric name (unsorted)."""
        cdef double now = _monotonic()
        out = {}
        self.acquire()
        try:
            for found in self.sensors.values():
                out.update((<Sensor>found).read(now))
        finally:
            self.release()
        return out
