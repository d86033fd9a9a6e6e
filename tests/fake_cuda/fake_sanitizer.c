/*
 * fake_sanitizer.c: a fake NVIDIA Sanitizer API (libsanitizer-public.so) for the
 * CPU tests of cuda-debug replay (tests/fake_cuda/sanitizer.py builds it).
 *
 * It keeps one subscriber and calls it as the real library would: RESOURCE
 * callbacks for the allocations a test announces, and for each launch a test
 * asks for (fake_san_launch) the driver-API enter, LAUNCH_BEGIN, the kernel's
 * accesses, LAUNCH_END and the driver-API exit, whose return value the
 * subscriber may rewrite. "Device memory" is host memory (sanitizerAlloc is
 * malloc). A launch whose module was patched (sanitizerPatchInstructions for
 * global accesses, then sanitizerPatchModule) and given a state
 * (sanitizerSetLaunchCallbackData) runs its accesses through the same check
 * the device patch runs (csrc/replay/check.h), warps exiting on a bad access
 * when the state says so; an unpatched launch whose access lies outside every
 * allocation faults for real: 700, and every later launch fails (a dead context).
 * Test-only code.
 */
#define _GNU_SOURCE
#include "replay/check.h"
#include "replay/sanitizer_api.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_KERNELS 64
#define MAX_ALLOCS 4096

static struct {
    Sanitizer_CallbackFunc cb;
    void *ud;
    int subscribed;
    unsigned char domains[16];
    unsigned char cbids[16][1024];
    int patches_loaded;
    struct {
        char name[256];
        int patched_global, patched_async, patched_shared, patched;
    } kernels[MAX_KERNELS];
    int n_kernels;
    struct { uint64_t a, size; } allocs[MAX_ALLOCS];
    int n_allocs;
    const void *launch_data;       /* set for the launch in flight */
    const void *function_data[MAX_KERNELS];
    uint64_t next_launch;
    int sticky;                    /* a real fault happened: every call fails */
    char fail_fn[64];
    int fail_rc;
    long long stats[32];
} F;

enum { S_SUBSCRIBE, S_UNSUBSCRIBE, S_ADD_PATCHES, S_PATCH_INSTR, S_PATCH_MODULE, S_UNPATCH,
       S_SET_DATA, S_ALLOC, S_FREE, S_H2D, S_D2H, S_SYNC, S_LAUNCHES, S_REAL_FAULTS, S_BAD,
       S_CALLBACKS, S_DRIVER_CALLBACKS, S_N };

static SanitizerResult failing(const char *fn)
{
    return F.fail_fn[0] && !strcmp(F.fail_fn, fn) ? F.fail_rc : 0;
}

static void fire(int domain, uint32_t cbid, const void *data)
{
    if (F.subscribed && F.cb && (F.domains[domain] || F.cbids[domain][cbid & 1023])) {
        F.stats[S_CALLBACKS]++;
        if (domain == CD_SAN_DOMAIN_DRIVER_API)
            F.stats[S_DRIVER_CALLBACKS]++;
        F.cb(F.ud, domain, cbid, data);
    }
}

static int kernel_index(const char *name)
{
    for (int i = 0; i < F.n_kernels; i++)
        if (!strcmp(F.kernels[i].name, name))
            return i;
    if (F.n_kernels == MAX_KERNELS)
        return MAX_KERNELS - 1;
    snprintf(F.kernels[F.n_kernels].name, sizeof F.kernels[0].name, "%s", name);
    return F.n_kernels++;
}

/* A kernel's module and function handles: fake pointers, one module per kernel. */
#define MODULE_OF(i) ((CUmodule)(uintptr_t)(0x20000 + 16 * (i)))
#define FUNCTION_OF(i) ((CUfunction)(uintptr_t)(0x30000 + 16 * (i)))
#define CONTEXT ((CUcontext)(uintptr_t)0x1000)
static int index_of_module(CUmodule m)
{
    uintptr_t v = (uintptr_t)m;
    if (v < 0x20000 || v >= 0x20000 + 16 * MAX_KERNELS)
        return -1;
    return (int)((v - 0x20000) / 16);
}

/* ------------------------------------------------------ the API -- */

EXPORT SanitizerResult sanitizerSubscribe(Sanitizer_SubscriberHandle *s, Sanitizer_CallbackFunc cb,
                                          void *ud)
{
    F.stats[S_SUBSCRIBE]++;
    if (failing("sanitizerSubscribe"))
        return failing("sanitizerSubscribe");
    if (F.subscribed)
        return 10;                 /* SANITIZER_ERROR_MAX_LIMIT_REACHED: one subscriber */
    F.cb = cb;
    F.ud = ud;
    F.subscribed = 1;
    *s = (Sanitizer_SubscriberHandle)(uintptr_t)0x5000;
    return 0;
}

EXPORT SanitizerResult sanitizerUnsubscribe(Sanitizer_SubscriberHandle s)
{
    F.stats[S_UNSUBSCRIBE]++;
    F.subscribed = 0;
    F.cb = NULL;
    memset(F.domains, 0, sizeof F.domains);
    memset(F.cbids, 0, sizeof F.cbids);
    return 0;
}

EXPORT SanitizerResult sanitizerEnableDomain(uint32_t enable, Sanitizer_SubscriberHandle s, int d)
{
    if (d <= 0 || d >= 16)
        return 4;                  /* SANITIZER_ERROR_INVALID_DOMAIN_ID */
    F.domains[d] = (unsigned char)enable;
    return failing("sanitizerEnableDomain");
}

EXPORT SanitizerResult sanitizerEnableCallback(uint32_t enable, Sanitizer_SubscriberHandle s,
                                               int d, uint32_t cbid)
{
    if (d <= 0 || d >= 16 || cbid >= 1024)
        return 5;
    F.cbids[d][cbid] = (unsigned char)enable;
    return failing("sanitizerEnableCallback");
}

EXPORT SanitizerResult sanitizerAddPatches(const void *image, CUcontext ctx)
{
    F.stats[S_ADD_PATCHES]++;
    if (failing("sanitizerAddPatches"))
        return failing("sanitizerAddPatches");
    /* the image must be a fatbin (magic 0xBA55ED50) */
    uint32_t magic;
    memcpy(&magic, image, sizeof magic);
    if (magic != 0xBA55ED50u)
        return 1;
    F.patches_loaded = 1;
    return 0;
}

EXPORT SanitizerResult sanitizerPatchInstructions(int id, CUmodule module, const char *name)
{
    F.stats[S_PATCH_INSTR]++;
    int k = index_of_module(module);
    if (!F.patches_loaded || k < 0 || !name || strncmp(name, "cd_replay_", 10))
        return 1;                  /* SANITIZER_ERROR_INVALID_PARAMETER */
    if (failing("sanitizerPatchInstructions"))
        return failing("sanitizerPatchInstructions");
    if (id == CD_SAN_INSTRUCTION_GLOBAL_MEMORY_ACCESS)
        F.kernels[k].patched_global = 1;
    else if (id == CD_SAN_INSTRUCTION_MEMCPY_ASYNC)
        F.kernels[k].patched_async = 1;
    else if (id == CD_SAN_INSTRUCTION_SHARED_MEMORY_ACCESS)
        F.kernels[k].patched_shared = 1;
    return 0;
}

EXPORT SanitizerResult sanitizerPatchModule(CUmodule module)
{
    F.stats[S_PATCH_MODULE]++;
    int k = index_of_module(module);
    if (k < 0)
        return 1;
    if (failing("sanitizerPatchModule"))
        return failing("sanitizerPatchModule");
    F.kernels[k].patched = F.kernels[k].patched_global;
    return 0;
}

EXPORT SanitizerResult sanitizerUnpatchModule(CUmodule module)
{
    F.stats[S_UNPATCH]++;
    int k = index_of_module(module);
    if (k < 0)
        return 1;
    F.kernels[k].patched = F.kernels[k].patched_global = F.kernels[k].patched_async = 0;
    F.kernels[k].patched_shared = 0;
    return 0;
}

EXPORT SanitizerResult sanitizerSetLaunchCallbackData(Sanitizer_LaunchHandle l, CUfunction fn,
                                                      Sanitizer_StreamHandle s, const void *d)
{
    F.stats[S_SET_DATA]++;
    if (failing("sanitizerSetLaunchCallbackData"))
        return failing("sanitizerSetLaunchCallbackData");
    F.launch_data = d;
    return 0;
}

EXPORT SanitizerResult sanitizerSetCallbackData(CUfunction fn, const void *d)
{
    uintptr_t v = (uintptr_t)fn;
    int k = v >= 0x30000 ? (int)((v - 0x30000) / 16) : -1;
    if (k < 0 || k >= MAX_KERNELS)
        return 1;
    F.function_data[k] = d;
    return 0;
}

EXPORT SanitizerResult sanitizerAlloc(CUcontext ctx, void **p, size_t size)
{
    F.stats[S_ALLOC]++;
    if (failing("sanitizerAlloc"))
        return failing("sanitizerAlloc");
    *p = calloc(1, size);
    return *p ? 0 : 7;
}

EXPORT SanitizerResult sanitizerFree(CUcontext ctx, void *p)
{
    F.stats[S_FREE]++;
    free(p);
    return 0;
}

EXPORT SanitizerResult sanitizerMemcpyHostToDeviceAsync(void *dst, void *src, size_t n,
                                                        Sanitizer_StreamHandle s)
{
    F.stats[S_H2D]++;
    memcpy(dst, src, n);
    return 0;
}

/* sanitizerAllocHost's blocks: the only destinations the copy back takes. */
static struct { char *p; size_t n; } pinned[16];
static int n_pinned;

EXPORT SanitizerResult sanitizerAllocHost(CUcontext ctx, void **p, size_t size)
{
    if (n_pinned == 16 || !(*p = calloc(1, size)))
        return 7;
    pinned[n_pinned].p = *p;
    pinned[n_pinned++].n = size;
    return 0;
}

static int is_pinned(const void *p, size_t n)
{
    for (int i = 0; i < n_pinned; i++)
        if ((const char *)p >= pinned[i].p && (const char *)p + n <= pinned[i].p + pinned[i].n)
            return 1;
    return 0;
}

/* The real one (Compute Sanitizer 2025.3, H200) refused every pageable
 * destination, on the stack or static, for the launches of the replay GPU tests
 * (SANITIZER_ERROR_INVALID_PARAMETER; pinned memory from sanitizerAllocHost it
 * took): so does this one. */
EXPORT SanitizerResult sanitizerMemcpyDeviceToHost(void *dst, void *src, size_t n,
                                                   Sanitizer_StreamHandle s)
{
    F.stats[S_D2H]++;
    if (!is_pinned(dst, n))
        return 1;
    memcpy(dst, src, n);
    return 0;
}

EXPORT SanitizerResult sanitizerStreamSynchronize(Sanitizer_StreamHandle s)
{
    F.stats[S_SYNC]++;
    return failing("sanitizerStreamSynchronize");
}

EXPORT SanitizerResult sanitizerGetFunctionPcAndSize(CUmodule m, const char *name, uint64_t *pc,
                                                     uint64_t *size)
{
    int k = index_of_module(m);
    if (k < 0)
        return 1;
    *pc = 0x7000000 + 0x10000 * (uint64_t)k;
    *size = 0x1000;
    return 0;
}

static const char *const results[] = {
    [0] = "SANITIZER_SUCCESS", [1] = "SANITIZER_ERROR_INVALID_PARAMETER",
    [7] = "SANITIZER_ERROR_OUT_OF_MEMORY", [10] = "SANITIZER_ERROR_MAX_LIMIT_REACHED",
    [12] = "SANITIZER_ERROR_NOT_COMPATIBLE", [13] = "SANITIZER_ERROR_NOT_INITIALIZED",
    [14] = "SANITIZER_ERROR_NOT_SUPPORTED",
};

EXPORT SanitizerResult sanitizerGetResultString(SanitizerResult r, const char **s)
{
    if (r < 0 || r >= (int)(sizeof results / sizeof *results) || !results[r])
        return 1;
    *s = results[r];
    return 0;
}

/* ------------------------------------------------- test controls -- */

/* FAKE_SAN_FAIL=fn:rc makes `fn` return rc from the start (for the calls made
 * before a test script runs: the subscription). */
__attribute__((constructor)) static void fail_from_env(void)
{
    const char *e = getenv("FAKE_SAN_FAIL");
    const char *colon = e ? strchr(e, ':') : NULL;
    if (!colon || colon - e >= (long)sizeof F.fail_fn)
        return;
    memcpy(F.fail_fn, e, (size_t)(colon - e));
    F.fail_fn[colon - e] = 0;
    F.fail_rc = atoi(colon + 1);
}

EXPORT void fake_san_reset(void)
{
    Sanitizer_CallbackFunc cb = F.cb;
    void *ud = F.ud;
    int sub = F.subscribed;
    unsigned char domains[16];
    memcpy(domains, F.domains, sizeof domains);
    static unsigned char cbids[16][1024];
    memcpy(cbids, F.cbids, sizeof cbids);
    memset(&F, 0, sizeof F);
    F.cb = cb;
    F.ud = ud;
    F.subscribed = sub;
    memcpy(F.domains, domains, sizeof domains);
    memcpy(F.cbids, cbids, sizeof cbids);
}

EXPORT void fake_san_fail(const char *fn, int rc)
{
    snprintf(F.fail_fn, sizeof F.fail_fn, "%s", fn ? fn : "");
    F.fail_rc = rc;
}

EXPORT int fake_san_stats(long long *out, int n)
{
    int k = n < S_N ? n : S_N;
    memcpy(out, F.stats, k * sizeof *out);
    return k;
}

/* An allocation (cbid 11 device, 13 host, 15 async, 26 a reserved range). */
EXPORT void fake_san_alloc(uint64_t address, uint64_t size, uint32_t flags, uint32_t cbid)
{
    if (F.n_allocs < MAX_ALLOCS) {
        F.allocs[F.n_allocs].a = address;
        F.allocs[F.n_allocs].size = size;
        F.n_allocs++;
    }
    if (cbid == CD_SAN_RESOURCE_VIRTUAL_RESERVE) {
        Sanitizer_ResourceVirtualRange v = {address, size};
        fire(CD_SAN_DOMAIN_RESOURCE, cbid, &v);
        return;
    }
    Sanitizer_ResourceMemoryData m;
    memset(&m, 0, sizeof m);
    m.address = address;
    m.size = size;
    m.context = CONTEXT;
    m.flags = flags;
    fire(CD_SAN_DOMAIN_RESOURCE, cbid, &m);
}

EXPORT void fake_san_free(uint64_t address, uint32_t cbid)
{
    for (int i = 0; i < F.n_allocs; i++)
        if (F.allocs[i].a == address) {
            F.allocs[i] = F.allocs[--F.n_allocs];
            break;
        }
    if (cbid == CD_SAN_RESOURCE_VIRTUAL_RELEASE) {
        Sanitizer_ResourceVirtualRange v = {address, 0};
        fire(CD_SAN_DOMAIN_RESOURCE, cbid, &v);
        return;
    }
    Sanitizer_ResourceMemoryData m;
    memset(&m, 0, sizeof m);
    m.address = address;
    m.context = CONTEXT;
    fire(CD_SAN_DOMAIN_RESOURCE, cbid, &m);
}

static int mapped(uint64_t a, uint32_t size)
{
    for (int i = 0; i < F.n_allocs; i++)
        if (F.allocs[i].a <= a && a + size <= F.allocs[i].a + F.allocs[i].size)
            return 1;
    return 0;
}

/* The module of kernel `name` loaded (RESOURCE MODULE_LOADED, with its image
 * `image` of `size` bytes), or, `size` 0, about to be unloaded. */
EXPORT void fake_san_module(const char *name, const void *image, size_t size)
{
    int k = kernel_index(name);
    Sanitizer_ResourceModuleData m;
    memset(&m, 0, sizeof m);
    m.context = CONTEXT;
    m.module = MODULE_OF(k);
    m.cubinSize = size;
    m.pCubin = image;
    fire(CD_SAN_DOMAIN_RESOURCE, size ? CD_SAN_RESOURCE_MODULE_LOADED
                                      : CD_SAN_RESOURCE_MODULE_UNLOAD_STARTING, &m);
}

/* One launch of `name` with grid (gx,1,1) and block (bx,1,1), whose threads
 * make the `n` accesses of `acc` (address, size, flags, linear thread id), in
 * order. Returns the launch call's result, as the framework would get it. */
EXPORT int fake_san_launch(const char *name, uint32_t gx, uint32_t bx, const uint64_t *acc, int n)
{
    F.stats[S_LAUNCHES]++;
    int k = kernel_index(name);
    uint32_t cbid = 307;           /* cuLaunchKernel */
    CUresult ret = F.sticky ? (CUresult)700 : CUDA_SUCCESS;
    Sanitizer_CallbackData cd;
    memset(&cd, 0, sizeof cd);
    cd.functionName = "cuLaunchKernel";
    cd.symbolName = F.kernels[k].name;
    cd.functionReturnValue = &ret;
    cd.context = CONTEXT;
    cd.callbackSite = CD_SAN_API_ENTER;
    fire(CD_SAN_DOMAIN_DRIVER_API, cbid, &cd);
    if (!F.sticky) {
        Sanitizer_LaunchData ld;
        memset(&ld, 0, sizeof ld);
        ld.context = CONTEXT;
        ld.stream = (CUstream)(uintptr_t)0x10;
        ld.hStream = (Sanitizer_StreamHandle)(uintptr_t)0x11;
        ld.module = MODULE_OF(k);
        ld.function = FUNCTION_OF(k);
        ld.functionName = F.kernels[k].name;
        ld.gridDim_x = gx; ld.gridDim_y = 1; ld.gridDim_z = 1;
        ld.blockDim_x = bx; ld.blockDim_y = 1; ld.blockDim_z = 1;
        ld.hLaunch = (Sanitizer_LaunchHandle)(uintptr_t)(0x900000 + ++F.next_launch);
        F.launch_data = NULL;
        fire(CD_SAN_DOMAIN_LAUNCH, CD_SAN_LAUNCH_BEGIN, &ld);
        cd_replay_state *st = (cd_replay_state *)(F.launch_data ? F.launch_data
                                                                : F.function_data[k]);
        if (!F.kernels[k].patched)
            st = NULL;
        /* warps that exited, as (block, warp) pairs: at most 64 tracked */
        uint64_t dead[64];
        int n_dead = 0;
        for (int i = 0; i < n && !F.sticky; i++) {
            uint64_t a = acc[4 * i], t = acc[4 * i + 3];
            uint32_t size = (uint32_t)acc[4 * i + 1], flags = (uint32_t)acc[4 * i + 2];
            uint32_t tx = bx ? (uint32_t)(t % bx) : 0, bk = bx ? (uint32_t)(t / bx) : 0;
            uint64_t warp = ((uint64_t)bk << 32) | (tx / 32);
            int gone = 0;
            for (int j = 0; j < n_dead; j++)
                gone |= dead[j] == warp;
            if (gone)
                continue;
            if (st) {
                if (st->count)
                    st->n_checked++;
                uint32_t space = 0;
                if (!cd_replay_inside(st, a, size))
                    space = CD_SPACE_GLOBAL;
                else if (cd_replay_misaligned(a, size))
                    space = CD_SPACE_GLOBAL | CD_BAD_MISALIGNED;
                if (space) {
                    F.stats[S_BAD]++;
                    unsigned long long r = st->n_bad++;
                    if (r < st->max_records) {
                        cd_replay_access *rec = &st->records[r];
                        rec->address = a;
                        rec->pc = 0x7000000 + 0x10000 * (uint64_t)k + 0x40 + 16 * (uint64_t)i;
                        rec->size = size;
                        rec->flags = flags;
                        rec->space = space;
                        rec->order = (uint32_t)r;
                        rec->thread[0] = tx; rec->thread[1] = rec->thread[2] = 0;
                        rec->block[0] = bk; rec->block[1] = rec->block[2] = 0;
                    }
                    if (st->exit_warp && n_dead < 64)
                        dead[n_dead++] = warp;
                    continue;
                }
            } else if (!mapped(a, size)) {
                F.sticky = 1;      /* the real thing: the context dies */
                F.stats[S_REAL_FAULTS]++;
            }
        }
        fire(CD_SAN_DOMAIN_LAUNCH, CD_SAN_LAUNCH_END, &ld);
    }
    cd.callbackSite = CD_SAN_API_EXIT;
    fire(CD_SAN_DOMAIN_DRIVER_API, cbid, &cd);
    return (int)ret;
}

/* cuCtxSynchronize: 700 once the context is dead; through the driver-API
 * callbacks (17), whose exit may rewrite it. */
EXPORT int fake_san_sync(void)
{
    CUresult ret = F.sticky ? (CUresult)700 : CUDA_SUCCESS;
    Sanitizer_CallbackData cd;
    memset(&cd, 0, sizeof cd);
    cd.functionName = "cuCtxSynchronize";
    cd.functionReturnValue = &ret;
    cd.context = CONTEXT;
    cd.callbackSite = CD_SAN_API_ENTER;
    fire(CD_SAN_DOMAIN_DRIVER_API, 17, &cd);
    cd.callbackSite = CD_SAN_API_EXIT;
    fire(CD_SAN_DOMAIN_DRIVER_API, 17, &cd);
    return (int)ret;
}
