/*
 * base/intern.c: one arena of strings that outlive what they were copied from.
 *
 * File and function names of Python code objects, and kernel names, are
 * copied here the first time they are seen (like tracemalloc interns its
 * filename/line pairs), so that ring records hold 4-byte ids instead of
 * copies, and a report can still name a code object or a module that was
 * freed since. Fixed size (CD_ARENA bytes): when full, new strings get id 0
 * ("unknown") and nothing else breaks. Never freed.
 *
 * Concurrency: inserts take `lock` (a spinlock: the critical section is a
 * memcpy; inserts happen once per distinct string). A published id is never
 * rewritten, so readers need no lock.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "base/base.h"

#include <string.h>     /* memcpy, memcmp, strcmp, ... */
#include <sched.h>       /* sched_yield */

#define CD_ARENA (4u << 20)
#define STR_TABLE 32768            /* dedup table of strings (power of two) */
#define KERNEL_TABLE 16384         /* symbolName pointer -> ids (power of two) */
#define KEPT_MAX 4095              /* the longest string kept (longer ones are cut) */

static char arena[CD_ARENA];
static size_t arena_used = 1;      /* offset 0 is "none" */
static atomic_flag lock = ATOMIC_FLAG_INIT;

static void lock_take(void)
{
    while (atomic_flag_test_and_set_explicit(&lock, memory_order_acquire))
        sched_yield();
}

static void lock_give(void) { atomic_flag_clear_explicit(&lock, memory_order_release); }

static uint64_t hash_bytes(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;      /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ? h : 1;
}

static struct {
    uint64_t hash;
    uint32_t id;
    uint32_t len;
} strs[STR_TABLE];

/* Under `lock`. */
static uint32_t intern_locked(const char *s, size_t n)
{
    if (n > KEPT_MAX)
        n = KEPT_MAX;
    uint64_t h = hash_bytes(s, n);
    for (uint32_t i = (uint32_t)h & (STR_TABLE - 1), probes = 0; probes < STR_TABLE;
         i = (i + 1) & (STR_TABLE - 1), probes++) {
        if (!strs[i].id) {
            if (arena_used + n + 1 > CD_ARENA || probes > STR_TABLE / 2)
                return 0;
            uint32_t id = (uint32_t)arena_used;
            memcpy(arena + arena_used, s, n);
            arena[arena_used + n] = '\0';
            arena_used += n + 1;
            strs[i].hash = h;
            strs[i].len = (uint32_t)n;
            strs[i].id = id;
            return id;
        }
        if (strs[i].hash == h && strs[i].len == n && !memcmp(arena + strs[i].id, s, n))
            return strs[i].id;
    }
    return 0;
}

uint32_t cd_intern(const char *s, size_t n)
{
    if (!s)
        return 0;
    lock_take();
    uint32_t id = intern_locked(s, n);
    lock_give();
    return id;
}

const char *cd_interned(uint32_t id)
{
    return id && id < CD_ARENA ? arena + id : NULL;
}

size_t cd_intern_used(void) { return arena_used; }

/* A parent's thread inside an insert at the fork: its half-written entry has
 * no id yet, so nothing reads it; the child may reuse the slot. */
void cd_intern_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        atomic_flag_clear(&lock);
        break;
    case CD_FORK_TEST_TAKE:
        lock_take();
        break;
    case CD_FORK_TEST_GIVE:
        lock_give();
        break;
    }
}

/* ------------------------------------------------------------ kernels -- */

/* CUPTI's symbolName points into the driver's copy of the module, stable
 * while the module is loaded. The key is the pointer; a hit is checked
 * against the whole name kept (a module unloaded and another loaded at the
 * same address: its kernels' names often share their first hundred bytes,
 * `_ZN2at6native...`), and a different name there replaces the entry. The
 * value is one atomic word (id << 32 | origin << 28 | short id): a reader never sees half
 * of a replacement. */
static struct {
    _Atomic uintptr_t key;         /* written last on insertion */
    _Atomic uint64_t ids;          /* id << 32 | origin << 28 | short id */
    _Atomic uint32_t epoch;        /* kernel_epoch when the name was last checked */
    _Atomic uint32_t early;        /* launches counted, up to CD_EARLY_LAUNCHES */
} kernels[KERNEL_TABLE];
/* Short ids are arena offsets (< CD_ARENA = 2^22): the top bits of the low
 * word hold the kernel's origin. */
#define SID_MASK 0x0FFFFFFFu

/* One of the first CD_EARLY_LAUNCHES counted for entry i (a load once past them). */
static int early_launch(int i)
{
    uint32_t n = atomic_load_explicit(&kernels[i].early, memory_order_relaxed);
    if (n >= CD_EARLY_LAUNCHES)
        return 0;
    return atomic_fetch_add_explicit(&kernels[i].early, 1, memory_order_relaxed) <
           CD_EARLY_LAUNCHES;
}

/* The whole-name check costs a strcmp of the mangled name (often 150 bytes)
 * per launch. While CUPTI tells us of every module unload (its resource
 * callback MODULE_UNLOAD_STARTING, enabled with the subscription), an entry
 * checked in the current epoch needs no check: a pointer can only name
 * another kernel after an unload, which moves the epoch (as does every new
 * subscription: unloads while unsubscribed are unseen). */
static atomic_uint kernel_epoch = 1;
static atomic_int epoch_trusted;

void cd_intern_kernels_unloaded(void) { atomic_fetch_add(&kernel_epoch, 1); }

unsigned cd_intern_kernel_epoch(void)
{
    return (unsigned)atomic_load_explicit(&kernel_epoch, memory_order_relaxed);
}

void cd_intern_kernels_trust_unloads(int on)
{
    atomic_fetch_add(&kernel_epoch, 1);
    atomic_store(&epoch_trusted, on);
}

/* Is `symbol` the name kept at `id` (which is cut at KEPT_MAX bytes)? */
static int is_kept_name(const char *symbol, uint32_t id)
{
    const char *kept = arena + id;
    int r = strcmp(symbol, kept);
    return r == 0 || (r > 0 && strlen(kept) == KEPT_MAX && !strncmp(symbol, kept, KEPT_MAX));
}

static void put_ids(uint64_t ids, uint32_t *short_id, int *origin)
{
    *short_id = (uint32_t)ids & SID_MASK;
    if (origin)
        *origin = (int)(((uint32_t)ids >> 28) & 0xF);
}

uint32_t cd_intern_kernel(const char *symbol, uint32_t *short_id, int *origin, int *early)
{
    *short_id = 0;
    if (origin)
        *origin = CD_ORIGIN_UNKNOWN;
    if (early)
        *early = 0;
    if (!symbol || !symbol[0])
        return 0;
    uintptr_t key = (uintptr_t)symbol;
    uint32_t start = (uint32_t)((key >> 4) * 0x9E3779B1u) & (KERNEL_TABLE - 1);
    for (uint32_t i = start, probes = 0; probes < 64; i = (i + 1) & (KERNEL_TABLE - 1), probes++) {
        uintptr_t k = atomic_load_explicit(&kernels[i].key, memory_order_acquire);
        if (k == key) {
            const uint32_t epoch = atomic_load_explicit(&kernel_epoch, memory_order_acquire);
            const int fresh = atomic_load_explicit(&epoch_trusted, memory_order_relaxed) &&
                              atomic_load_explicit(&kernels[i].epoch, memory_order_acquire) == epoch;
            uint64_t ids = atomic_load_explicit(&kernels[i].ids, memory_order_acquire);
            if ((uint32_t)(ids >> 32) && (fresh || is_kept_name(symbol, (uint32_t)(ids >> 32)))) {
                if (!fresh)
                    atomic_store_explicit(&kernels[i].epoch, epoch, memory_order_release);
                put_ids(ids, short_id, origin);
                if (early)
                    *early = early_launch((int)i);
                return (uint32_t)(ids >> 32);
            }
            break;
        }
        if (k == 0)
            break;
    }
    /* Cold: first sight of this kernel (at this address). */
    char short_name[256];
    size_t sn = cd_short_kernel_name(symbol, short_name, sizeof short_name);
    const int from_name = cd_kernel_origin_of_name(symbol);
    lock_take();
    uint32_t id = intern_locked(symbol, strlen(symbol));
    uint32_t sid = intern_locked(short_name, sn);
    uint64_t ids = (uint64_t)id << 32 | (uint32_t)from_name << 28 | (sid & SID_MASK);
    const uint32_t epoch = atomic_load(&kernel_epoch);
    int slot = -1;
    for (uint32_t i = start, probes = 0; id && probes < 64;
         i = (i + 1) & (KERNEL_TABLE - 1), probes++) {
        uintptr_t k = atomic_load_explicit(&kernels[i].key, memory_order_relaxed);
        if (k == key) {            /* another thread was first, or another module was here */
            atomic_store_explicit(&kernels[i].ids, ids, memory_order_release);
            atomic_store_explicit(&kernels[i].epoch, epoch, memory_order_release);
            atomic_store_explicit(&kernels[i].early, 0, memory_order_relaxed);
            slot = (int)i;
            break;
        }
        if (k == 0) {
            atomic_store_explicit(&kernels[i].ids, ids, memory_order_relaxed);
            atomic_store_explicit(&kernels[i].epoch, epoch, memory_order_relaxed);
            atomic_store_explicit(&kernels[i].early, 0, memory_order_relaxed);
            atomic_store_explicit(&kernels[i].key, key, memory_order_release);
            slot = (int)i;
            break;
        }
    }
    lock_give();
    put_ids(ids, short_id, origin);
    if (early)
        *early = slot >= 0 ? early_launch(slot) : 1;
    return id;
}

int cd_kernel_origin(const char *symbol)
{
    if (!symbol || !symbol[0])
        return CD_ORIGIN_UNKNOWN;
    uintptr_t key = (uintptr_t)symbol;
    uint32_t start = (uint32_t)((key >> 4) * 0x9E3779B1u) & (KERNEL_TABLE - 1);
    for (uint32_t i = start, probes = 0; probes < 64; i = (i + 1) & (KERNEL_TABLE - 1), probes++) {
        uintptr_t k = atomic_load_explicit(&kernels[i].key, memory_order_acquire);
        if (k == key) {
            /* The pointer may name another kernel after an unload: trusted when
             * checked in this epoch, else checked, as cd_intern_kernel does. */
            uint64_t ids = atomic_load_explicit(&kernels[i].ids, memory_order_acquire);
            const int fresh = atomic_load_explicit(&epoch_trusted, memory_order_relaxed) &&
                              atomic_load_explicit(&kernels[i].epoch, memory_order_acquire) ==
                                  atomic_load_explicit(&kernel_epoch, memory_order_acquire);
            if ((uint32_t)(ids >> 32) && (fresh || is_kept_name(symbol, (uint32_t)(ids >> 32))))
                return (int)(((uint32_t)ids >> 28) & 0xF);
            break;
        }
        if (k == 0)
            break;
    }
    return cd_kernel_origin_of_name(symbol);   /* cold: a kernel not seen (or checked) yet */
}
