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
 * Only blocks of at least KCORE_ARENA_MIN_BLOCK are kept: the interpreter also takes its frame
 * stack chunks (16 KiB) from this allocator. A kept block is handed out only for a request of
 * exactly its size, and every block not kept goes back through the previous allocator, which
 * made it. Arena calls come with the GIL held, but 3.12's subinterpreters with their own GIL
 * share this one allocator, hence the lock (taken once per arena, so its cost is nil).
 */
#ifndef KCORE_ARENA_CACHE_H
#define KCORE_ARENA_CACHE_H

#include <Python.h>
#include <stddef.h>

#ifdef _WIN32
#include <windows.h>
static SRWLOCK kcore_arena_lock = SRWLOCK_INIT;
#define KCORE_ARENA_LOCK() AcquireSRWLockExclusive(&kcore_arena_lock)
#define KCORE_ARENA_UNLOCK() ReleaseSRWLockExclusive(&kcore_arena_lock)
#else
#include <pthread.h>
static pthread_mutex_t kcore_arena_lock = PTHREAD_MUTEX_INITIALIZER;
#define KCORE_ARENA_LOCK() pthread_mutex_lock(&kcore_arena_lock)
#define KCORE_ARENA_UNLOCK() pthread_mutex_unlock(&kcore_arena_lock)
#endif

#define KCORE_ARENA_SLOTS 1024                /* 1 GiB of 1 MiB arenas */
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
    KCORE_ARENA_LOCK();
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
    KCORE_ARENA_UNLOCK();
    if (block != NULL) return block;
    return kcore_arena_previous.alloc(kcore_arena_previous.ctx, size);
}

static void kcore_arena_free(void *ctx, void *block, size_t size) {
    (void)ctx;
    if (block != NULL && size >= KCORE_ARENA_MIN_BLOCK) {
        KCORE_ARENA_LOCK();
        if (kcore_arena_count < KCORE_ARENA_SLOTS && kcore_arena_bytes + size <= kcore_arena_limit) {
            kcore_arena_blocks[kcore_arena_count] = block;
            kcore_arena_sizes[kcore_arena_count] = size;
            kcore_arena_count++;
            kcore_arena_bytes += size;
            KCORE_ARENA_UNLOCK();
            return;
        }
        KCORE_ARENA_UNLOCK();
    }
    kcore_arena_previous.free(kcore_arena_previous.ctx, block, size);
}

/* Keep at most `limit` bytes of freed arenas (0: none, and the previous allocator is put back
 * if nothing was installed over this one since). Called with the GIL held. */
static void kcore_arena_set_limit(size_t limit) {
    PyObjectArenaAllocator current;
    void *block;
    size_t size;
    if (!kcore_arena_installed && limit > 0) {
        PyObjectArenaAllocator mine = {NULL, kcore_arena_alloc, kcore_arena_free};
        PyObject_GetArenaAllocator(&kcore_arena_previous);
        PyObject_SetArenaAllocator(&mine);
        kcore_arena_installed = 1;
    }
    KCORE_ARENA_LOCK();
    kcore_arena_limit = limit;
    KCORE_ARENA_UNLOCK();
    for (;;) { /* give back what is over the new limit */
        KCORE_ARENA_LOCK();
        if (kcore_arena_bytes <= limit || kcore_arena_count == 0) {
            KCORE_ARENA_UNLOCK();
            break;
        }
        block = kcore_arena_blocks[0];
        size = kcore_arena_sizes[0];
        kcore_arena_count--;
        kcore_arena_blocks[0] = kcore_arena_blocks[kcore_arena_count];
        kcore_arena_sizes[0] = kcore_arena_sizes[kcore_arena_count];
        kcore_arena_bytes -= size;
        KCORE_ARENA_UNLOCK();
        kcore_arena_previous.free(kcore_arena_previous.ctx, block, size);
    }
    if (kcore_arena_installed && limit == 0) {
        PyObject_GetArenaAllocator(&current);
        if (current.alloc == kcore_arena_alloc) {
            PyObject_SetArenaAllocator(&kcore_arena_previous);
            kcore_arena_installed = 0;
        }
    }
}

#endif /* KCORE_ARENA_CACHE_H */
