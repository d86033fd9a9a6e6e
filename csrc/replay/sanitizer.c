/*
 * replay/sanitizer.c: the Sanitizer API in this process, for cuda-debug replay.
 *
 * One subscriber, made before CUDA initialises (the Sanitizer wants to see
 * every allocation), with these callbacks:
 *   RESOURCE  device / host / async allocations and frees, reserved address
 *             ranges: the allocation table (under alloc_lock; cold: the
 *             frameworks cache memory, so cudaMalloc calls are rare);
 *   LAUNCH    BEGIN counts the launch (the number a watch() report names) and,
 *             for the culprit, instruments it (instrument()); END waits for it,
 *             reads the bad accesses back and unpatches (finish());
 *   DRIVER    at the exit of a launch API: the launch that had a bad access,
 *             and every later one, returns 700 (an illegal address).
 * Everything but the count and the target test is cold: it runs for the few
 * instrumented launches only. Nothing here knows Python: the ranges hook
 * (python/py_replay.c) does.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "replay/replay.h"
#include "replay/sanitizer_api.h"   /* the Sanitizer API declarations we use */
#include "replay/patches_fatbin.h"  /* cd_replay_patches, CD_PATCH_* (generated) */

#include <dlfcn.h>      /* dlopen, RTLD_NOW, RTLD_GLOBAL, ... */
#include <stdio.h>       /* snprintf, fprintf, stderr */
#include <stdlib.h>      /* getenv, realloc, qsort, ... */
#include <string.h>      /* memset, strcmp, strlen, ... */
#include <time.h>        /* timespec, clock_gettime, CLOCK_MONOTONIC */

#define CD_ILLEGAL_ADDRESS 700     /* CUDA_ERROR_ILLEGAL_ADDRESS */

#define SAN_TYPEDEF(name, params) typedef SanitizerResult (*name##_fn) params;
CD_SANITIZER_FUNCS(SAN_TYPEDEF)
#define SAN_FIELD(name, params) name##_fn name;

/* Optional entry points (NULL where the library lacks them). */
typedef SanitizerResult (*sanitizerSetCallbackData_fn)(CUfunction kernel, const void *userdata);
typedef SanitizerResult (*sanitizerAllocHost_fn)(CUcontext ctx, void **ptr, size_t size);

typedef struct {
    uint64_t address, size;
    uint32_t flags, cbid;
} alloc_entry;

/*
 * The replay's state. Written by Python (load, subscribe) before the program
 * starts, under the GIL; then:
 *   target, ranges   read-only while subscribed;
 *   launches ...     relaxed atomics (counters);
 *   allocs           alloc_lock;
 *   results, n_results, patched_ctx, at: inst_lock (the instrumented launches,
 *                    which the Sanitizer wants serialised anyway); results is a
 *                    ring of the last CD_REPLAY_RESULTS, n_results counts them all;
 *   violated         atomic: once set, stays set;
 *   images           image_lock: module images kept at module load (the
 *                    culprit's line table), bounded (replay.h).
 */
static struct {
    void *lib;
    struct { CD_SANITIZER_FUNCS(SAN_FIELD) } f;
    sanitizerSetCallbackData_fn set_callback_data;
    sanitizerAllocHost_fn alloc_host;
    int trace;                     /* CUDA_DEBUG_REPLAY_TRACE: each step's result on stderr */
    Sanitizer_SubscriberHandle sub;
    int subscribed;
    cd_replay_target target;
    cd_replay_ranges_fn ranges;

    atomic_uint_fast64_t launches, launches_seen, failed_launches, n_allocs, n_frees;
    atomic_int violated;
    atomic_int watching;           /* the script's open watch() blocks (while_watching) */
    atomic_int driver_on;          /* the driver-API callbacks are enabled */
    int driver_rc;

    pthread_mutex_t alloc_lock;
    alloc_entry *allocs;
    size_t n_live, cap;

    pthread_mutex_t inst_lock;
    cd_replay_launch results[CD_REPLAY_RESULTS];
    int n_results;
    int n_instrumented;
    uint64_t first_instrumented;   /* the number of the first launch instrumented */
    CUcontext patched_ctx[64];
    int n_patched_ctx;
    cd_replay_at at;

    void *pinned;                  /* the Sanitizer's pinned host memory for reads (inst_lock) */
    size_t pinned_size;
    CUcontext pinned_ctx;
    int read_pinned;               /* read_state() reads through it first (inst_lock) */
    pthread_mutex_t match_lock;    /* the name-match cache */
    struct { CUfunction fn; int match; } cache[512];

    pthread_mutex_t image_lock;
    struct { CUmodule module; char *bytes; size_t size; uint64_t age; } images[CD_REPLAY_IMAGES];
    size_t image_bytes;            /* their sizes, summed */
    uint64_t image_age;
    char image_needle[CD_REPLAY_NAME];  /* the text a kept image holds ("" any image) */
} rp = {
    .alloc_lock = PTHREAD_MUTEX_INITIALIZER,
    .image_lock = PTHREAD_MUTEX_INITIALIZER,
    .inst_lock = PTHREAD_MUTEX_INITIALIZER,
    .match_lock = PTHREAD_MUTEX_INITIALIZER,
};

/* The launch this thread is instrumenting (between its BEGIN and END). */
static _Thread_local int tls_slot = -1;
static _Thread_local void *tls_state;
static _Thread_local CUmodule tls_module;
static _Thread_local CUfunction tls_function;   /* set per kernel, not per launch */
static _Thread_local int tls_fail;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

/* A forked child starts with its locks free (hooks/after_fork.c calls this,
 * through module.c, beside the layers it knows): a thread of the parent may
 * have held one at the fork. The instrumented launch of that thread is not
 * the child's. */
void cd_replay_fork(int op)
{
    pthread_mutex_t *const locks[] = {&rp.alloc_lock, &rp.inst_lock, &rp.match_lock,
                                      &rp.image_lock};
    cd_fork_locks(locks, CD_N_OF(locks), op);
    if (op != CD_FORK_CHILD)
        return;
    tls_slot = -1;
    tls_state = NULL;
    tls_module = NULL;
    tls_function = NULL;
    tls_fail = 0;
}

/* ------------------------------------------------------- loading -- */

int cd_replay_load(const char *path, char *error, size_t error_len)
{
    if (rp.lib)
        return 0;
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!h) {
        snprintf(error, error_len, "dlopen: %s", dlerror());
        return -1;
    }
#define SAN_BIND(name, params)                                                  \
    if (!(rp.f.name = (name##_fn)dlsym(h, #name))) {                            \
        snprintf(error, error_len, "%s lacks %s: not NVIDIA's Sanitizer API", path, #name); \
        dlclose(h);                                                             \
        memset(&rp.f, 0, sizeof rp.f);                                          \
        return -1;                                                              \
    }
    CD_SANITIZER_FUNCS(SAN_BIND)
    rp.set_callback_data = (sanitizerSetCallbackData_fn)dlsym(h, "sanitizerSetCallbackData");
    rp.alloc_host = (sanitizerAllocHost_fn)dlsym(h, "sanitizerAllocHost");
    const char *tr = getenv("CUDA_DEBUG_REPLAY_TRACE");
    rp.trace = tr && *tr && strcmp(tr, "0") != 0;
    rp.lib = h;
    return 0;
}

const char *cd_replay_result_string(int rc)
{
    const char *s = NULL;
    if (rp.lib && rp.f.sanitizerGetResultString(rc, &s) == CD_SANITIZER_SUCCESS && s)
        return s;
    return NULL;
}

/* ------------------------------------------------ allocation table -- */

static void alloc_add(uint64_t address, uint64_t size, uint32_t flags, uint32_t cbid)
{
    atomic_fetch_add_explicit(&rp.n_allocs, 1, memory_order_relaxed);
    pthread_mutex_lock(&rp.alloc_lock);
    if (rp.n_live == rp.cap && rp.cap < CD_REPLAY_MAX_ALLOCS) {
        size_t cap = rp.cap ? 2 * rp.cap : 4096;
        alloc_entry *p = realloc(rp.allocs, cap * sizeof *p);
        if (p) {
            rp.allocs = p;
            rp.cap = cap;
        }
    }
    if (rp.n_live < rp.cap)
        rp.allocs[rp.n_live++] = (alloc_entry){address, size, flags, cbid};
    pthread_mutex_unlock(&rp.alloc_lock);
}

static void alloc_remove(uint64_t address)
{
    atomic_fetch_add_explicit(&rp.n_frees, 1, memory_order_relaxed);
    pthread_mutex_lock(&rp.alloc_lock);
    for (size_t i = rp.n_live; i-- > 0;)
        if (rp.allocs[i].address == address) {
            rp.allocs[i] = rp.allocs[--rp.n_live];
            break;
        }
    pthread_mutex_unlock(&rp.alloc_lock);
}

size_t cd_replay_allocation_count(void)
{
    pthread_mutex_lock(&rp.alloc_lock);
    size_t n = rp.n_live;
    pthread_mutex_unlock(&rp.alloc_lock);
    return n;
}

size_t cd_replay_allocations(uint64_t *out, size_t max)
{
    pthread_mutex_lock(&rp.alloc_lock);
    size_t n = rp.n_live < max ? rp.n_live : max;
    for (size_t i = 0; i < n; i++) {
        out[4 * i] = rp.allocs[i].address;
        out[4 * i + 1] = rp.allocs[i].size;
        out[4 * i + 2] = rp.allocs[i].flags;
        out[4 * i + 3] = rp.allocs[i].cbid;
    }
    pthread_mutex_unlock(&rp.alloc_lock);
    return n;
}

static int cmp_range(const void *a, const void *b)
{
    const cd_replay_range *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* Sort and merge in place; returns the count kept. */
static size_t merge_ranges(cd_replay_range *r, size_t n)
{
    qsort(r, n, sizeof *r, cmp_range);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (r[i].hi <= r[i].lo)
            continue;
        if (m && r[i].lo <= r[m - 1].hi) {
            if (r[i].hi > r[m - 1].hi)
                r[m - 1].hi = r[i].hi;
        } else {
            r[m++] = r[i];
        }
    }
    return m;
}

/* Every allocation the Sanitizer reported, as ranges (malloc'd). */
static cd_replay_range *table_ranges(size_t *n)
{
    pthread_mutex_lock(&rp.alloc_lock);
    size_t count = rp.n_live;
    cd_replay_range *r = malloc((count ? count : 1) * sizeof *r);
    size_t k = 0;
    /* A reserved address range (cuMemAddressReserve: the driver reserves large
     * ones for its own allocations) is not memory: mapped or not, it cannot tell. */
    for (size_t i = 0; r && i < count; i++)
        if (rp.allocs[i].cbid != CD_SAN_RESOURCE_VIRTUAL_RESERVE)
            r[k++] = (cd_replay_range){rp.allocs[i].address,
                                       rp.allocs[i].address + rp.allocs[i].size};
    pthread_mutex_unlock(&rp.alloc_lock);
    *n = r ? merge_ranges(r, k) : 0;
    return r;
}

/* --------------------------------------------------- module images -- */

/* The text an image of the target's module must hold: the kernel name when it
 * is a plain identifier or a mangled prefix (it is in the image's symbol
 * table as is); else its longest identifier run ("FillFunctor" of
 * "FillFunctor<float>"); "" (every image) without a kernel name. */
static void set_image_needle(const cd_replay_target *t)
{
    const char *k = t->kernel, *best = k;
    size_t best_len = 0;
    rp.image_needle[0] = 0;
    if (!k[0])
        return;
    for (const char *p = k; *p;) {
        const char *q = p;
        while (*q == '_' || *q == '$' || (*q >= '0' && *q <= '9') || (*q >= 'a' && *q <= 'z') ||
               (*q >= 'A' && *q <= 'Z'))
            q++;
        if ((size_t)(q - p) > best_len) {
            best = p;
            best_len = (size_t)(q - p);
        }
        p = *q ? q + 1 : q;
    }
    if (t->match == CD_MATCH_MANGLED_PREFIX || best_len < 3)
        best = k, best_len = strlen(k);
    if (best_len >= sizeof rp.image_needle)
        best_len = sizeof rp.image_needle - 1;
    memcpy(rp.image_needle, best, best_len);
    rp.image_needle[best_len] = 0;
}

static void image_drop(int i)   /* image_lock held */
{
    rp.image_bytes -= rp.images[i].size;
    free(rp.images[i].bytes);
    rp.images[i].bytes = NULL;
    rp.images[i].module = NULL;
    rp.images[i].size = 0;
}

/* MODULE_LOADED: keep a copy of the image when it may hold the target's
 * kernel (cold: once per module). A copy, as the pointer is the driver's. */
static void image_loaded(const Sanitizer_ResourceModuleData *m)
{
    if (!m->pCubin || !m->cubinSize || m->cubinSize > CD_REPLAY_IMAGE_MAX)
        return;
    if (rp.image_needle[0] ?
            !memmem(m->pCubin, m->cubinSize, rp.image_needle, strlen(rp.image_needle)) :
            m->cubinSize > CD_REPLAY_IMAGE_ANY_MAX)
        return;
    char *copy = malloc(m->cubinSize);
    if (!copy)
        return;
    memcpy(copy, m->pCubin, m->cubinSize);
    pthread_mutex_lock(&rp.image_lock);
    for (int i = 0; i < CD_REPLAY_IMAGES; i++)      /* a module handle used again */
        if (rp.images[i].bytes && rp.images[i].module == m->module)
            image_drop(i);
    for (;;) {                                       /* room: a free slot, the bytes */
        int free_slot = -1, oldest = -1;
        for (int i = 0; i < CD_REPLAY_IMAGES; i++) {
            if (!rp.images[i].bytes)
                free_slot = free_slot < 0 ? i : free_slot;
            else if (oldest < 0 || rp.images[i].age < rp.images[oldest].age)
                oldest = i;
        }
        if (free_slot >= 0 && rp.image_bytes + m->cubinSize <= CD_REPLAY_IMAGE_BYTES) {
            rp.images[free_slot].module = m->module;
            rp.images[free_slot].bytes = copy;
            rp.images[free_slot].size = m->cubinSize;
            rp.images[free_slot].age = ++rp.image_age;
            rp.image_bytes += m->cubinSize;
            copy = NULL;
            break;
        }
        if (oldest < 0)
            break;
        image_drop(oldest);
    }
    pthread_mutex_unlock(&rp.image_lock);
    free(copy);
}

static void image_unloading(const Sanitizer_ResourceModuleData *m)
{
    pthread_mutex_lock(&rp.image_lock);
    for (int i = 0; i < CD_REPLAY_IMAGES; i++)
        if (rp.images[i].bytes && rp.images[i].module == m->module)
            image_drop(i);
    pthread_mutex_unlock(&rp.image_lock);
}

size_t cd_replay_module_image(uint64_t launch, void *out, size_t max)
{
    uintptr_t module = 0;
    pthread_mutex_lock(&rp.inst_lock);
    int first = rp.n_results > CD_REPLAY_RESULTS ? rp.n_results - CD_REPLAY_RESULTS : 0;
    for (int i = first; i < rp.n_results; i++)
        if (rp.results[i % CD_REPLAY_RESULTS].launch == launch)
            module = rp.results[i % CD_REPLAY_RESULTS].module;
    pthread_mutex_unlock(&rp.inst_lock);
    size_t size = 0;
    pthread_mutex_lock(&rp.image_lock);
    for (int i = 0; module && i < CD_REPLAY_IMAGES; i++)
        if (rp.images[i].bytes && (uintptr_t)rp.images[i].module == module) {
            size = rp.images[i].size;
            if (out)
                memcpy(out, rp.images[i].bytes, size < max ? size : max);
            break;
        }
    pthread_mutex_unlock(&rp.image_lock);
    return size;
}

void cd_replay_image_stats(size_t *count, size_t *bytes)
{
    pthread_mutex_lock(&rp.image_lock);
    size_t n = 0;
    for (int i = 0; i < CD_REPLAY_IMAGES; i++)
        n += rp.images[i].bytes != NULL;
    *count = n;
    *bytes = rp.image_bytes;
    pthread_mutex_unlock(&rp.image_lock);
}

/* ------------------------------------------------------ the target -- */

static int name_matches_uncached(const char *name)
{
    const cd_replay_target *t = &rp.target;
    if (!name)
        return 0;
    if (t->match == CD_MATCH_MANGLED_PREFIX)
        return strncmp(name, t->kernel, strlen(t->kernel)) == 0;
    if (strstr(name, t->kernel))
        return 1;
    char *d = cd_demangle(name);
    int hit = d && strstr(d, t->kernel) != NULL;
    free(d);
    return hit;
}

static int name_matches(const Sanitizer_LaunchData *ld)
{
    if (!rp.target.kernel[0])
        return 1;
    size_t h = ((uintptr_t)ld->function >> 4) % CD_N_OF(rp.cache);
    pthread_mutex_lock(&rp.match_lock);
    if (ld->function && rp.cache[h].fn == ld->function) {
        int m = rp.cache[h].match;
        pthread_mutex_unlock(&rp.match_lock);
        return m;
    }
    pthread_mutex_unlock(&rp.match_lock);
    int m = name_matches_uncached(ld->functionName);
    pthread_mutex_lock(&rp.match_lock);
    rp.cache[h].fn = ld->function;
    rp.cache[h].match = m;
    pthread_mutex_unlock(&rp.match_lock);
    return m;
}

static void copy_name(char *dst, const char *src)
{
    snprintf(dst, CD_REPLAY_NAME, "%s", src ? src : "");
}

/* Is launch n (this LAUNCH_BEGIN) one to instrument? */
static int is_target(uint64_t n, const Sanitizer_LaunchData *ld)
{
    const cd_replay_target *t = &rp.target;
    if (t->launch && n == t->launch) {
        pthread_mutex_lock(&rp.inst_lock);
        rp.at.launch = n;
        copy_name(rp.at.kernel, ld->functionName);
        rp.at.grid[0] = ld->gridDim_x; rp.at.grid[1] = ld->gridDim_y; rp.at.grid[2] = ld->gridDim_z;
        rp.at.block[0] = ld->blockDim_x; rp.at.block[1] = ld->blockDim_y;
        rp.at.block[2] = ld->blockDim_z;
        rp.at.seen = 1;
        pthread_mutex_unlock(&rp.inst_lock);
    }
    if (atomic_load_explicit(&rp.violated, memory_order_relaxed))
        return 0;
    if (t->n_set) {
        for (int i = 0; i < t->n_set; i++)
            if (n == t->set[i])
                return 1;
        return 0;
    }
    if (t->launch && !t->kernel[0])
        return n == t->launch;
    if (t->launch && n < t->from)
        return 0;
    return name_matches(ld);
}

/* ------------------------------------------------ failing the calls -- */

/* Enable the driver-API callbacks of the launches and waits (once): from the
 * start (target.driver_always), or when the first bad access is found. */
static int enable_driver_callbacks(void)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(&rp.driver_on, &expected, 1))
        return rp.driver_rc;
    int rc = 0;
#define SAN_ENABLE(name, id)                                                    \
    if (!rc)                                                                    \
        rc = rp.f.sanitizerEnableCallback(1, rp.sub, CD_SAN_DOMAIN_DRIVER_API, id);
    CD_SAN_LAUNCH_CBIDS(SAN_ENABLE)
    CD_SAN_SYNC_CBIDS(SAN_ENABLE)
#undef SAN_ENABLE
    rp.driver_rc = rc;
    return rc;
}

/* -------------------------------------------- the instrumented launch -- */

static const int patch_ids[] = {CD_SAN_INSTRUCTION_GLOBAL_MEMORY_ACCESS,
                                CD_SAN_INSTRUCTION_MEMCPY_ASYNC,
                                CD_SAN_INSTRUCTION_SHARED_MEMORY_ACCESS};
static const char *const patch_names[] = {CD_PATCH_GLOBAL, CD_PATCH_ASYNC_COPY, CD_PATCH_SHARED};

static int add_patches(CUcontext ctx)
{
    for (int i = 0; i < rp.n_patched_ctx; i++)
        if (rp.patched_ctx[i] == ctx)
            return 0;
    int rc = rp.f.sanitizerAddPatches(cd_replay_patches, ctx);
    if (rc == 0 && rp.n_patched_ctx < (int)CD_N_OF(rp.patched_ctx))
        rp.patched_ctx[rp.n_patched_ctx++] = ctx;
    return rc;
}

static __attribute__((noinline, cold)) void instrument(uint64_t n, const Sanitizer_LaunchData *ld)
{
    double t0 = now_s();
    pthread_mutex_lock(&rp.inst_lock);
    if (rp.n_instrumented >= rp.target.max_launches) {
        pthread_mutex_unlock(&rp.inst_lock);
        return;
    }
    if (!rp.n_instrumented++)
        rp.first_instrumented = n;
    int slot = rp.n_results++ % CD_REPLAY_RESULTS;     /* the last ones kept, in a ring */
    cd_replay_launch *r = &rp.results[slot];
    memset(r, 0, sizeof *r);
    r->launch = n;
    copy_name(r->kernel, ld->functionName);
    r->grid[0] = ld->gridDim_x; r->grid[1] = ld->gridDim_y; r->grid[2] = ld->gridDim_z;
    r->block[0] = ld->blockDim_x; r->block[1] = ld->blockDim_y; r->block[2] = ld->blockDim_z;
    r->context = (uintptr_t)ld->context;
    r->stream = (uintptr_t)ld->stream;
    r->device = (int)ld->device;
    r->module = (uintptr_t)ld->module;

    int rc, step = CD_STEP_ADD_PATCHES, patched = 0;
    void *dstate = NULL;
    cd_replay_range *ranges = NULL;
    size_t n_ranges = 0;
    if ((rc = add_patches(ld->context)))
        goto failed;
    step = CD_STEP_PATCH_INSTRUCTIONS;
    int n_ids = rp.target.check_shared ? 3 : 2;
    for (int i = 0; i < n_ids; i++)
        if ((rc = rp.f.sanitizerPatchInstructions(patch_ids[i], ld->module, patch_names[i])))
            goto failed;
    step = CD_STEP_PATCH_MODULE;
    if ((rc = rp.f.sanitizerPatchModule(ld->module)))
        goto failed;
    patched = 1;
    if (rp.f.sanitizerGetFunctionPcAndSize(ld->module, ld->functionName, &r->function_pc,
                                           &r->function_size))
        r->function_pc = r->function_size = 0;
    pthread_mutex_unlock(&rp.inst_lock);

    /* The valid ranges: Python's (PyTorch's live blocks), else the table. */
    double t1 = now_s();
    if (!rp.ranges || rp.ranges(r, &ranges, &n_ranges) != 0 || !ranges) {
        free(ranges);
        ranges = table_ranges(&n_ranges);
    } else {
        n_ranges = merge_ranges(ranges, n_ranges);
    }
    r->seconds_ranges = now_s() - t1;

    pthread_mutex_lock(&rp.inst_lock);
    size_t bytes = sizeof(cd_replay_state) + (n_ranges ? n_ranges : 1) * sizeof(cd_replay_range) +
                   CD_REPLAY_DEVICE_RECORDS * sizeof(cd_replay_access);
    step = CD_STEP_ALLOC;
    if ((rc = rp.f.sanitizerAlloc(ld->context, &dstate, bytes)))
        goto failed;
    char *img = calloc(1, bytes);
    if (!img) {
        rc = -1;
        goto failed;
    }
    cd_replay_state *st = (cd_replay_state *)img;
    st->version = CD_REPLAY_STATE_VERSION;
    st->n_ranges = (uint32_t)n_ranges;
    st->max_records = CD_REPLAY_DEVICE_RECORDS;
    st->exit_warp = (uint32_t)rp.target.exit_warp;
    st->ranges = (const cd_replay_range *)((char *)dstate + sizeof(cd_replay_state));
    st->records = (cd_replay_access *)((char *)dstate + sizeof(cd_replay_state) +
                                       (n_ranges ? n_ranges : 1) * sizeof(cd_replay_range));
    if (n_ranges)
        memcpy(img + sizeof(cd_replay_state), ranges, n_ranges * sizeof(cd_replay_range));
    r->n_ranges = (uint32_t)n_ranges;
    step = CD_STEP_UPLOAD;
    rc = rp.f.sanitizerMemcpyHostToDeviceAsync(dstate, img, bytes, ld->hStream);
    if (rc == 0)   /* the image is freed next: wait for the copy to have read it */
        rc = rp.f.sanitizerStreamSynchronize(ld->hStream);
    free(img);
    if (rc)
        goto failed;
    step = CD_STEP_SET_DATA;
    rc = rp.f.sanitizerSetLaunchCallbackData(ld->hLaunch, ld->function, ld->hStream, dstate);
    if (rc && rp.set_callback_data && rp.set_callback_data(ld->function, dstate) == 0) {
        rc = 0;                    /* per kernel instead of per launch: cleared at the end */
        tls_function = ld->function;
    }
    if (rc)
        goto failed;
    free(ranges);
    if (rp.trace)
        fprintf(stderr, "cuda_debug replay trace: launch %llu instrumented: ctx %p stream %p "
                "hStream %p hApiStream %p state %p (%zu bytes, %zu ranges)\n",
                (unsigned long long)n, (void *)ld->context, (void *)ld->stream,
                (void *)ld->hStream, (void *)ld->hApiStream, dstate, bytes, n_ranges);
    tls_slot = slot;
    tls_state = dstate;
    tls_module = ld->module;
    r->seconds_prepare = now_s() - t0 - r->seconds_ranges;
    pthread_mutex_unlock(&rp.inst_lock);
    return;

failed:
    r->failed_step = step;
    r->rc = rc;
    if (dstate)
        rp.f.sanitizerFree(ld->context, dstate);
    if (patched)
        rp.f.sanitizerUnpatchModule(ld->module);
    free(ranges);
    pthread_mutex_unlock(&rp.inst_lock);
}

/* Copy device memory back (inst_lock held): into `dst` on the launch's stream,
 * else through pinned host memory of the Sanitizer's own, kept for the next
 * reads of that context. On the H200 (Compute Sanitizer 2025.3) the first
 * refused every pageable destination for the tests' launches (invalid
 * parameter, on any stream handle), the second worked; once it has, it goes
 * first. */
static int read_state(const Sanitizer_LaunchData *ld, void *dst, void *src, size_t bytes)
{
    int first = 0;
    for (int k = 0; k < 2; k++) {
        int pinned = k != rp.read_pinned;    /* 0 then 1, or 1 then 0 */
        int rc;
        if (!pinned) {
            rc = rp.f.sanitizerMemcpyDeviceToHost(dst, src, bytes, ld->hStream);
        } else {
            if (!rp.alloc_host)
                continue;
            if (rp.pinned_size < bytes || rp.pinned_ctx != ld->context) {
                void *p = NULL;   /* (the old one is not freed: sanitizerFreeHost is not bound) */
                if (rp.alloc_host(ld->context, &p, bytes) != 0 || !p)
                    continue;
                rp.pinned = p;
                rp.pinned_size = bytes;
                rp.pinned_ctx = ld->context;
            }
            rc = rp.f.sanitizerMemcpyDeviceToHost(rp.pinned, src, bytes, ld->hStream);
            if (rc == 0)
                memcpy(dst, rp.pinned, bytes);
        }
        if (rp.trace)
            fprintf(stderr, "cuda_debug replay trace: copy %zu bytes %p -> %p by %s: %d\n",
                    bytes, src, dst, pinned ? "pinned host memory" : "the launch's stream", rc);
        if (rc == 0) {
            rp.read_pinned = pinned;
            return 0;
        }
        if (!first)
            first = rc;
    }
    return first;
}

static int by_address(const void *a, const void *b)
{
    const cd_replay_access *x = a, *y = b;
    return x->address < y->address ? -1 : x->address > y->address;
}

/* The bad accesses the device recorded (up to CD_REPLAY_DEVICE_RECORDS, in
 * the device's order): r->records keeps them all when they fit, else the
 * CD_REPLAY_RECORDS / 2 lowest and highest addresses, the two ends of the run
 * (an overrun starts at the end of what it overran; an underrun ends at the
 * start). Cold: a launch that had bad accesses. */
static int read_records(const Sanitizer_LaunchData *ld, cd_replay_launch *r,
                        const cd_replay_state *st)
{
    size_t n = st->n_bad < CD_REPLAY_DEVICE_RECORDS ? (size_t)st->n_bad : CD_REPLAY_DEVICE_RECORDS;
    r->n_records = 0;
    if (!n)
        return 0;
    cd_replay_access *all = malloc(n * sizeof *all);
    if (!all)
        return -1;
    int rc = read_state(ld, all, (void *)st->records, n * sizeof *all);
    if (rc == 0) {
        if (n <= CD_REPLAY_RECORDS) {
            memcpy(r->records, all, n * sizeof *all);
            r->n_records = (int)n;
        } else {
            qsort(all, n, sizeof *all, by_address);
            size_t half = CD_REPLAY_RECORDS / 2;
            memcpy(r->records, all, half * sizeof *all);
            memcpy(r->records + half, all + n - half, half * sizeof *all);
            r->n_records = CD_REPLAY_RECORDS;
        }
    }
    free(all);
    return rc;
}

static __attribute__((noinline, cold)) void finish(const Sanitizer_LaunchData *ld)
{
    pthread_mutex_lock(&rp.inst_lock);
    cd_replay_launch *r = &rp.results[tls_slot];
    void *dstate = tls_state;
    tls_slot = -1;
    tls_state = NULL;
    double t0 = now_s();
    int rc = rp.f.sanitizerStreamSynchronize(ld->hStream);
    r->seconds_wait = now_s() - t0;
    if (rp.trace)
        fprintf(stderr, "cuda_debug replay trace: launch %llu END: hStream %p state %p wait %d\n",
                (unsigned long long)r->launch, (void *)ld->hStream, dstate, rc);
    cd_replay_state st;
    if (rc) {
        r->failed_step = CD_STEP_WAIT;
        r->rc = rc;
    } else if ((rc = read_state(ld, &st, dstate, sizeof st))) {
        r->failed_step = CD_STEP_READ;
        r->rc = rc;
    } else {
        r->n_bad = st.n_bad;
        r->n_checked = st.n_checked;
        if ((rc = read_records(ld, r, &st))) {
            r->failed_step = CD_STEP_READ;
            r->rc = rc;
        }
        if (st.n_bad) {
            atomic_store(&rp.violated, 1);
            tls_fail = 1;
            enable_driver_callbacks();     /* this launch's API exit comes after */
        }
    }
    if (tls_function) {
        rp.set_callback_data(tls_function, NULL);
        tls_function = NULL;
    }
    rp.f.sanitizerUnpatchModule(tls_module);
    rp.f.sanitizerFree(ld->context, dstate);
    tls_module = NULL;
    pthread_mutex_unlock(&rp.inst_lock);
}

/* ------------------------------------------------------ the callback -- */

/* is_launch_cbid(cbid), is_sync_cbid(cbid): one of the list's ids. */
#define SAN_CBID_CASE(name, id) case id:
#define SAN_CBID_TEST(fn, LIST)                                                   \
    static int fn(uint32_t cbid)                                                  \
    {                                                                             \
        switch (cbid) {                                                           \
            LIST(SAN_CBID_CASE)                                                   \
            return 1;                                                             \
        default:                                                                  \
            return 0;                                                             \
        }                                                                         \
    }
SAN_CBID_TEST(is_launch_cbid, CD_SAN_LAUNCH_CBIDS)
SAN_CBID_TEST(is_sync_cbid, CD_SAN_SYNC_CBIDS)

static void on_event(void *userdata, int domain, uint32_t cbid, const void *data)
{
    (void)userdata;
    if (domain == CD_SAN_DOMAIN_LAUNCH) {
        const Sanitizer_LaunchData *ld = data;
        if (cbid == CD_SAN_LAUNCH_BEGIN) {
            atomic_fetch_add_explicit(&rp.launches_seen, 1, memory_order_relaxed);
            if (rp.target.while_watching &&
                atomic_load_explicit(&rp.watching, memory_order_relaxed) <= 0)
                return;
            uint64_t n = atomic_fetch_add_explicit(&rp.launches, 1, memory_order_relaxed) + 1;
            if (is_target(n, ld))
                instrument(n, ld);
        } else if (cbid == CD_SAN_LAUNCH_END && tls_state) {
            finish(ld);
        }
        return;
    }
    if (domain == CD_SAN_DOMAIN_DRIVER_API) {
        const Sanitizer_CallbackData *cb = data;
        if (cb->callbackSite != CD_SAN_API_EXIT || !rp.target.fail_launches ||
            !(is_launch_cbid(cbid) || is_sync_cbid(cbid)))
            return;
        if (tls_fail || atomic_load_explicit(&rp.violated, memory_order_relaxed)) {
            CUresult *ret = (CUresult *)cb->functionReturnValue;
            tls_fail = 0;
            if (ret && *ret == CUDA_SUCCESS) {
                *ret = (CUresult)CD_ILLEGAL_ADDRESS;
                atomic_fetch_add_explicit(&rp.failed_launches, 1, memory_order_relaxed);
            }
        }
        return;
    }
    if (domain != CD_SAN_DOMAIN_RESOURCE)
        return;
    switch (cbid) {
    case CD_SAN_RESOURCE_DEVICE_MEMORY_ALLOC:
    case CD_SAN_RESOURCE_HOST_MEMORY_ALLOC:
    case CD_SAN_RESOURCE_MEMORY_ALLOC_ASYNC: {
        const Sanitizer_ResourceMemoryData *m = data;
        alloc_add(m->address, m->size, m->flags, cbid);
        break;
    }
    case CD_SAN_RESOURCE_DEVICE_MEMORY_FREE:
    case CD_SAN_RESOURCE_HOST_MEMORY_FREE:
    case CD_SAN_RESOURCE_MEMORY_FREE_ASYNC:
        alloc_remove(((const Sanitizer_ResourceMemoryData *)data)->address);
        break;
    case CD_SAN_RESOURCE_VIRTUAL_RESERVE: {
        const Sanitizer_ResourceVirtualRange *v = data;
        alloc_add(v->address, v->size, 0, cbid);
        break;
    }
    case CD_SAN_RESOURCE_VIRTUAL_RELEASE:
        alloc_remove(((const Sanitizer_ResourceVirtualRange *)data)->address);
        break;
    case CD_SAN_RESOURCE_MODULE_LOADED:
        image_loaded(data);
        break;
    case CD_SAN_RESOURCE_MODULE_UNLOAD_STARTING:
        image_unloading(data);
        break;
    default:
        break;
    }
}

/* ------------------------------------------------- subscribe / status -- */

static const uint32_t resource_cbids[] = {
    CD_SAN_RESOURCE_DEVICE_MEMORY_ALLOC, CD_SAN_RESOURCE_DEVICE_MEMORY_FREE,
    CD_SAN_RESOURCE_HOST_MEMORY_ALLOC, CD_SAN_RESOURCE_HOST_MEMORY_FREE,
    CD_SAN_RESOURCE_MEMORY_ALLOC_ASYNC, CD_SAN_RESOURCE_MEMORY_FREE_ASYNC,
    CD_SAN_RESOURCE_VIRTUAL_RESERVE, CD_SAN_RESOURCE_VIRTUAL_RELEASE,
    CD_SAN_RESOURCE_MODULE_LOADED, CD_SAN_RESOURCE_MODULE_UNLOAD_STARTING,
};

/* 0, or the SanitizerResult plus 1000 x the step: 1 subscribe, 2 the launch
 * domain, 3 a resource callback, 4 a driver-API launch callback. */
int cd_replay_subscribe(const cd_replay_target *target, cd_replay_ranges_fn ranges)
{
    if (!rp.lib)
        return -1;
    if (rp.subscribed)
        return 0;
    rp.target = *target;
    rp.target.kernel[CD_REPLAY_NAME - 1] = 0;
    if (rp.target.max_launches <= 0)
        rp.target.max_launches = 1;
    rp.ranges = ranges;
    set_image_needle(&rp.target);
    int rc;
    if ((rc = rp.f.sanitizerSubscribe(&rp.sub, on_event, NULL)))
        return 1000 + rc;
    rp.subscribed = 1;
    if ((rc = rp.f.sanitizerEnableDomain(1, rp.sub, CD_SAN_DOMAIN_LAUNCH)))
        return 2000 + rc;
    for (size_t i = 0; i < CD_N_OF(resource_cbids); i++)
        if ((rc = rp.f.sanitizerEnableCallback(1, rp.sub, CD_SAN_DOMAIN_RESOURCE,
                                               resource_cbids[i])))
            return 3000 + rc;
    if (rp.target.driver_always && (rc = enable_driver_callbacks()))
        return 4000 + rc;
    return 0;
}

void cd_replay_watching(int delta)
{
    atomic_fetch_add(&rp.watching, delta);
}

int cd_replay_unsubscribe(void)
{
    if (!rp.subscribed)
        return 0;
    rp.subscribed = 0;
    return rp.f.sanitizerUnsubscribe(rp.sub);
}

void cd_replay_get_status(cd_replay_status *out)
{
    out->launches = atomic_load(&rp.launches);
    out->launches_seen = atomic_load(&rp.launches_seen);
    out->failed_launches = atomic_load(&rp.failed_launches);
    out->n_allocs = atomic_load(&rp.n_allocs);
    out->n_frees = atomic_load(&rp.n_frees);
    out->violated = atomic_load(&rp.violated);
    out->live_allocs = cd_replay_allocation_count();
    out->driver_rc = rp.driver_rc;
    pthread_mutex_lock(&rp.inst_lock);
    out->n_results = rp.n_results;
    out->first_instrumented = rp.first_instrumented;
    out->patches_contexts = rp.n_patched_ctx;
    pthread_mutex_unlock(&rp.inst_lock);
}

void cd_replay_get_at(cd_replay_at *out)
{
    pthread_mutex_lock(&rp.inst_lock);
    *out = rp.at;
    pthread_mutex_unlock(&rp.inst_lock);
}

int cd_replay_launch_result(int i, cd_replay_launch *out)
{
    pthread_mutex_lock(&rp.inst_lock);
    int ok = i >= 0 && i < rp.n_results && i >= rp.n_results - CD_REPLAY_RESULTS;
    if (ok)
        *out = rp.results[i % CD_REPLAY_RESULTS];
    pthread_mutex_unlock(&rp.inst_lock);
    return ok ? 0 : -1;
}
