# Freed object arenas kept for reuse (see arena_cache.h for why). Off unless asked for: it
# changes how the whole interpreter gives memory back, which a library should not do unasked.

cdef extern from "arena_cache.h":
    void kcore_arena_set_limit(size_t limit)
    size_t kcore_arena_limit
    size_t kcore_arena_bytes
    size_t kcore_arena_count
    unsigned long long kcore_arena_reuses

ARENA_CACHE_ENV = "KCORE_ARENA_CACHE_MB"


def set_arena_cache_limit(Py_ssize_t limit_bytes):
    """Keep up to ``limit_bytes`` of the interpreter's freed object arenas mapped, for the next
    objects to reuse instead of faulting in fresh pages (0, the default: none, and CPython's own
    arena allocator is put back). ``KCORE_ARENA_CACHE_MB`` in the environment sets it when kcore
    is imported. Process-wide; lowering it gives the excess back to the OS at once."""
    if limit_bytes < 0:
        raise ValueError(f"limit_bytes must be >= 0, not {limit_bytes}")
    kcore_arena_set_limit(<size_t>limit_bytes)


def arena_cache_stats():
    """``{"limit_bytes", "cached_bytes", "cached_arenas", "reuses"}``: the limit, what is kept
    now, and how many arenas have been handed out again since the process started."""
    return {
        "limit_bytes": kcore_arena_limit,
        "cached_bytes": kcore_arena_bytes,
        "cached_arenas": kcore_arena_count,
        "reuses": kcore_arena_reuses,
    }


def _arena_cache_from_env():
    """Applies ``KCORE_ARENA_CACHE_MB`` (MiB, may be fractional) at import."""
    import os
    import warnings

    text = os.environ.get(ARENA_CACHE_ENV)
    if text is None or not text.strip():
        return
    try:
        mib = float(text)
        if mib < 0 or mib != mib or mib == float("inf"):
            raise ValueError
    except ValueError:
        warnings.warn(f"{ARENA_CACHE_ENV}={text!r} is not a number of MiB >= 0; "
                      f"kcore keeps no freed arenas", RuntimeWarning, stacklevel=2)
        return
    set_arena_cache_limit(int(mib * 1024 * 1024))


_arena_cache_from_env()
