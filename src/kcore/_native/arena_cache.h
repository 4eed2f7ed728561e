/* A cache of the interpreter's freed object arenas.
 *
 * CPython's small-object allocator (pymalloc) takes memory from the OS in arenas (1 MiB on
 * 64-bit 3.10+, 256 KiB before) and hands an arena back as soon as it empties. Decoding a
 * fetch into records makes hundreds of thousands of small objects at once; when they are
 * dropped the arenas go back to the OS, and the next decode faults every page in again. On
 * virtual machines a page fault costs microseconds, more than parsing the record that lands on
 * the page (about half of a 100,000-record decode here). This sits between pymalloc and the
 * allocator it had (PyObject_SetArenaAllocator), keeps up to a limit of freed arenas mapped,
 * and gives them back on the next request of the same size.
 *
 * - Only blocks of at least KCORE_ARENA_MIN_BLOCK are kept; smaller requests (the frame stack
 *   chunks the interpreter also takes from this allocator, 16 KiB and up) pass straight
 *   through without touching the lock. A kept block is handed out only for a request of
 *   exactly its size; nothing relies on fresh blocks being zeroed (pymalloc initialises each
 *   pool header, the frame stack its chunk header). Every block not kept goes back through
 *   the previous allocator, which made it (also those made before this was installed).
 * - Installed once, on the first non-zero limit, and never taken out: a limit of 0 keeps
 *   nothing and passes every call through. Taking it out again would race with callers still
 *   inside it, and another allocator may have been installed over it since.
 * - Arena calls come with the GIL held, but 3.12's subinterpreters with their own GIL (and
 *   free-threaded builds) share this one allocator, hence the lock around the cache (taken
 *   only for arena-sized blocks) and the fork handlers that keep a child from inheriting it
 *   held.
 */
#ifndef KCORE_ARENA_CACHE_H
#define KCORE_ARENA_CACHE_H

#include <Python.h>
#include <stddef.h>

#ifdef _WIN32
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
static SRWLOCK kcore_arena_lock = SRWLOCK_INIT;
static SRWLOCK kcore_arena_install_lock = SRWLOCK_INIT;
#define KCORE_LOCK(l) AcquireSRWLockExclusive(&(l))
#define KCORE_UNLOCK(l) ReleaseSRWLockExclusive(&(l))
#else
#include <pthread.h>
static pthread_mutex_t kcore_arena_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t kcore_arena_install_lock = PTHREAD_MUTEX_INITIALIZER;
#define KCORE_LOCK(l) pthread_mutex_lock(&(l))
#define KCORE_UNLOCK(l) pthread_mutex_unlock(&(l))
#endif

#define KCORE_ARENA_SLOTS 1024                /* at most this many blocks kept (1 GiB of 1 MiB) */
#define KCORE_ARENA_MIN_BLOCK (256u * 1024u) /* pymalloc's smallest arena size */

static PyObjectArenaAllocator kcore_arena_previous;
static int kcore_arena_installed = 0;
static void *kcore_arena_blocks[KCORE_ARENA_SLOTS];
static size_t kcore_arena_sizes[KCORE_ARENA_SLOTS];
static size_t kcore_arena_count = 0;
static size_t kcore_arena_bytes = 0;
static size_t kcore_arena_limit = 0;
static unsigned long long kcore_arena_reuses = 0;

static void *kcore_arena_alloc(void *ctx, size_t size) {
    void *block = NULL;
    size_t i;
    (void)ctx;
    if (size >= KCORE_ARENA_MIN_BLOCK) {
        KCORE_LOCK(kcore_arena_lock);
        for (i = kcore_arena_count; i-- > 0;) { /* newest first: its pages are the warmest */
            if (kcore_arena_sizes[i] == size) {
                block = kcore_arena_blocks[i];
                kcore_arena_count--;
                kcore_arena_blocks[i] = kcore_arena_blocks[kcore_arena_count];
                kcore_arena_sizes[i] = kcore_arena_sizes[kcore_arena_count];
                kcore_arena_bytes -= size;
                kcore_arena_reuses++;
                break;
            }
        }
        KCORE_UNLOCK(kcore_arena_lock);
        if (block != NULL) return block;
    }
    return kcore_arena_previous.alloc(kcore_arena_previous.ctx, size);
}

static void kcore_arena_free(void *ctx, void *block, size_t size) {
    (void)ctx;
    /* NULL: 3.13 frees a subinterpreter's unused arena slots with address 0; pass it on. */
    if (block != NULL && size >= KCORE_ARENA_MIN_BLOCK) {
        KCORE_LOCK(kcore_arena_lock);
        if (kcore_arena_count < KCORE_ARENA_SLOTS && size <= kcore_arena_limit &&
            kcore_arena_bytes <= kcore_arena_limit - size) {
            kcore_arena_blocks[kcore_arena_count] = block;
            kcore_arena_sizes[kcore_arena_count] = size;
            kcore_arena_count++;
            kcore_arena_bytes += size;
            KCORE_UNLOCK(kcore_arena_lock);
            return;
        }
        KCORE_UNLOCK(kcore_arena_lock);
    }
    kcore_arena_previous.free(kcore_arena_previous.ctx, block, size);
}

#ifndef _WIN32
static void kcore_arena_before_fork(void) { KCORE_LOCK(kcore_arena_lock); }
static void kcore_arena_after_fork(void) { KCORE_UNLOCK(kcore_arena_lock); }
#endif

/* Put the cache under pymalloc, once. 0 on success, -1 (Python error set) if not. */
static int kcore_arena_install(void) {
    PyObjectArenaAllocator previous, mine = {NULL, kcore_arena_alloc, kcore_arena_free};
    int failed = 0;
    KCORE_LOCK(kcore_arena_install_lock);
    if (!kcore_arena_installed) {
        PyObject_GetArenaAllocator(&previous);
        if (previous.alloc == kcore_arena_alloc) {
            failed = 1; /* cannot be: only this function installs it */
        } else {
#ifndef _WIN32
            if (pthread_atfork(kcore_arena_before_fork, kcore_arena_after_fork,
                               kcore_arena_after_fork) != 0) {
                failed = 2;
            }
#endif
            if (!failed) {
                kcore_arena_previous = previous; /* written before anyone can call us */
                PyObject_SetArenaAllocator(&mine);
                kcore_arena_installed = 1;
            }
        }
    }
    KCORE_UNLOCK(kcore_arena_install_lock);
    if (failed) {
        PyErr_SetString(PyExc_RuntimeError, failed == 1
                                                 ? "kcore's arena cache is installed already"
                                                 : "pthread_atfork failed");
        return -1;
    }
    return 0;
}

/* Keep at most `limit` bytes of freed arenas; what is kept over it goes back at once. */
static int kcore_arena_set_limit(size_t limit) {
    void *block;
    size_t size;
    if (limit > 0 && kcore_arena_install() < 0) return -1;
    KCORE_LOCK(kcore_arena_lock);
    kcore_arena_limit = limit;
    KCORE_UNLOCK(kcore_arena_lock);
    for (;;) { /* give back what is over the new limit, one block at a time */
        KCORE_LOCK(kcore_arena_lock);
        if (kcore_arena_bytes <= limit || kcore_arena_count == 0) {
            KCORE_UNLOCK(kcore_arena_lock);
            break;
        }
        kcore_arena_count--;
        block = kcore_arena_blocks[kcore_arena_count];
        size = kcore_arena_sizes[kcore_arena_count];
        kcore_arena_bytes -= size;
        KCORE_UNLOCK(kcore_arena_lock);
        kcore_arena_previous.free(kcore_arena_previous.ctx, block, size);
    }
    return 0;
}

typedef struct {
    size_t limit, bytes, count;
    unsigned long long reuses;
} kcore_arena_stats_t;

static kcore_arena_stats_t kcore_arena_stats(void) {
    kcore_arena_stats_t s;
    KCORE_LOCK(kcore_arena_lock);
    s.limit = kcore_arena_limit;
    s.bytes = kcore_arena_bytes;
    s.count = kcore_arena_count;
    s.reuses = kcore_arena_reuses;
    KCORE_UNLOCK(kcore_arena_lock);
    return s;
}

#endif /* KCORE_ARENA_CACHE_H */
