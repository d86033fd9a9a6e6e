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

#include <string.h>
#include <sched.h>

#define CD_ARENA (4u << 20)
#define STR_TABLE 32768            /* dedup table of strings (power of two) */
#define KERNEL_TABLE 16384         /* symbolName pointer -> ids (power of two) */

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
    if (n > 4095)
        n = 4095;
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

/* ------------------------------------------------------------ kernels -- */

/* CUPTI's symbolName points into the driver's copy of the module, stable
 * while the module is loaded. The key is the pointer plus a check of the
 * first bytes (a module unloaded and another loaded at the same address). */
static struct {
    _Atomic uintptr_t key;         /* written last */
    uint64_t check;
    uint32_t id, short_id;
} kernels[KERNEL_TABLE];

static inline uint64_t head_check(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < 32 && s[i]; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

uint32_t cd_intern_kernel(const char *symbol, uint32_t *short_id)
{
    *short_id = 0;
    if (!symbol || !symbol[0])
        return 0;
    uintptr_t key = (uintptr_t)symbol;
    uint64_t check = head_check(symbol);
    uint32_t start = (uint32_t)((key >> 4) * 0x9E3779B1u) & (KERNEL_TABLE - 1);
    for (uint32_t i = start, probes = 0; probes < 64; i = (i + 1) & (KERNEL_TABLE - 1), probes++) {
        uintptr_t k = atomic_load_explicit(&kernels[i].key, memory_order_acquire);
        if (k == key && kernels[i].check == check) {
            *short_id = kernels[i].short_id;
            return kernels[i].id;
        }
        if (k == 0)
            break;
    }
    /* Cold: first sight of this kernel. */
    char short_name[256];
    size_t sn = cd_short_kernel_name(symbol, short_name, sizeof short_name);
    lock_take();
    uint32_t id = intern_locked(symbol, strlen(symbol));
    uint32_t sid = intern_locked(short_name, sn);
    for (uint32_t i = start, probes = 0; probes < 64; i = (i + 1) & (KERNEL_TABLE - 1), probes++) {
        uintptr_t k = atomic_load_explicit(&kernels[i].key, memory_order_relaxed);
        if (k == 0) {
            kernels[i].check = check;
            kernels[i].id = id;
            kernels[i].short_id = sid;
            atomic_store_explicit(&kernels[i].key, key, memory_order_release);
            break;
        }
        if (k == key && kernels[i].check == check)
            break;                 /* another thread was first */
    }
    lock_give();
    *short_id = sid;
    return id;
}
