# Freed object arenas kept for reuse (see arena_cache.h for why). Off unless asked for: it
# changes how the whole interpreter gives memory back, which a library should not do unasked.

cdef extern from "arena_cache.h":
    ctypedef struct kcore_arena_stats_t:
        size_t limit
        size_t bytes
        size_t count
        unsigned long long reuses
    int kcore_arena_set_limit(size_t limit) except -1
    kcore_arena_stats_t kcore_arena_stats()

import sys as _sys

ARENA_CACHE_ENV = "KCORE_ARENA_CACHE_MB"


def set_arena_cache_limit(limit_bytes):
    """Keep up to ``limit_bytes`` of the interpreter's freed object arenas (and at most 1,024 of
    them) mapped, for new objects to reuse instead of faulting in fresh pages. 0, the default,
    keeps none. ``KCORE_ARENA_CACHE_MB`` in the environment sets it when kcore is imported.
    Process-wide: the first non-zero limit puts kcore's cache under CPython's small-object
    allocator for good (with a limit of 0 it passes every call through); lowering the limit
    gives what is kept over it back to the OS at once."""
    limit = int(limit_bytes)
    if limit < 0:
        raise ValueError(f"limit_bytes must be >= 0, not {limit_bytes}")
    kcore_arena_set_limit(<size_t>min(limit, _sys.maxsize))


def arena_cache_stats():
    """``{"limit_bytes", "cached_bytes", "cached_arenas", "reuses"}``: the limit, what is kept
    now, and how many arenas have been handed out again since the process started."""
    cdef kcore_arena_stats_t s = kcore_arena_stats()
    return {
        "limit_bytes": s.limit,
        "cached_bytes": s.bytes,
        "cached_arenas": s.count,
        "reuses": s.reuses,
    }


def _arena_cache_from_env():
    """Applies ``KCORE_ARENA_CACHE_MB`` (MiB, may be fractional) at import; a value that is not
    a number of MiB >= 0 warns and keeps the cache off (import must not fail over it)."""
    import os
    import warnings

    text = os.environ.get(ARENA_CACHE_ENV)
    if text is None or not text.strip():
        return
    try:
        mib = float(text)
        if not 0 <= mib < float("inf"):  # also NaN
            raise ValueError
    except ValueError:
        warnings.warn(f"{ARENA_CACHE_ENV}={text!r} is not a number of MiB >= 0; "
                      f"kcore keeps no freed arenas", RuntimeWarning, stacklevel=2)
        return
    set_arena_cache_limit(int(mib * 1024 * 1024))


_arena_cache_from_env()
