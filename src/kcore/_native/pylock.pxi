# A plain lock (as threading.Lock) for compiled state, taken without a Python call. Waiting for
# it releases the GIL, so that a holder which gave the GIL up (a garbage collection running a
# finalizer, say) can go on and release it: a thread never waits for the lock holding the GIL.

from cpython.pythread cimport (
    NOWAIT_LOCK,
    PyThread_acquire_lock,
    PyThread_allocate_lock,
    PyThread_type_lock,
    WAIT_LOCK,
)


cdef inline PyThread_type_lock lock_new() except NULL:
    cdef PyThread_type_lock lock = PyThread_allocate_lock()
    if lock is NULL:
        raise MemoryError("no lock")
    return lock


cdef inline void lock_acquire(PyThread_type_lock lock) noexcept:
    if PyThread_acquire_lock(lock, NOWAIT_LOCK) == 1:
        return
    with nogil:
        PyThread_acquire_lock(lock, WAIT_LOCK)
