/*
 * hooks/runtime_launch.c: the runtime's kernel launches, seen without CUPTI.
 *
 * Why: CUPTI's dispatch alone (a callback that returns at once) costs a
 * host-bound loop of tiny PyTorch ops about 9% (benchmarks/RESULTS.md), more
 * than the always-on watch may cost in all. Most launches of a PyTorch
 * program come from code nvcc compiled: since CUDA 12.4 each `<<<...>>>` is a
 * call of the runtime's `__cudaLaunchKernel(kernel, grid, block, args, shmem,
 * stream)`, through the calling library's GOT (libtorch_cuda.so has one such
 * entry for all its kernels).
 *
 * While a watch() is open, those GOT entries point here (base/got.c). A
 * launch from a thread that does not block goes to the driver directly, as
 * cuLaunchKernelEx_ptsz -- the one launch entry point whose CUPTI callback is
 * off meanwhile (base/subscription.c), so CUPTI does not dispatch it -- and
 * then goes through the launch pipeline CUPTI's callback uses
 * (hooks/launch_callback.c: cd_launch_entering before, cd_launch_exited
 * after, with the cd_launch of the call it made). Every
 * other launch (a blocking thread's, Triton's, cuBLAS's, CuPy's, the
 * driver's callers', libraries loaded after the watch opened) still reaches
 * CUPTI's callback as before. A launch the driver refuses here is handed to
 * the runtime's own function, which launches it (or fails) as if we were not
 * there: its error, its last-error state, CUPTI's refused-launch path.
 *
 * What the direct launch relies on: the runtime's kernel handle is a CUkernel
 * (its function in the current context: cuKernelGetFunction, kept); the runtime
 * uses the thread's current context (CUDA 12+ keeps it current from
 * cudaSetDevice on; none current: the runtime's path); the legacy stream is
 * handle 0 for the runtime, CU_STREAM_LEGACY for a _ptsz driver call.
 * While a profiler holds CUPTI (a torch.profiler window: scopes.c's hand-over;
 * a watch() opened inside one), the entries stay ours and each launch goes
 * the runtime's way (so the profiler sees what it would see without us) and
 * is recorded after it returned: PyTorch's launches stay covered with no
 * CUPTI at all (the record mode). A CUPTI callback that runs inside such a
 * launch, at the hand-over's edges, leaves the launch to the hook (no launch
 * recorded twice).
 *
 * Each kernel's origin (base.h's CD_ORIGIN_*) is told by the library whose
 * code called: PyTorch's own libraries, or another (an extension's kernel:
 * USER, bracketed by markers while watching). Off with
 * CUDA_DEBUG_LAUNCH_HOOKS=0 (Python's reading of it). A launcher calling cuLaunchKernelEx_ptsz
 * itself (code built for the per-thread default stream calling
 * cudaLaunchKernelEx) would go unrecorded while the hooks are on: when an
 * object that imports it is loaded, the hooks stay off.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "hooks/hooks.h"

#include <dlfcn.h>      /* Dl_info, dladdr */
#include <stdio.h>       /* snprintf */
#include <string.h>      /* strrchr, strncmp, strstr */

typedef struct {
    unsigned x, y, z;
} cd_dim3;
typedef int (*rt_launch_fn)(void *kernel, cd_dim3 grid, cd_dim3 block, void **args,
                            size_t shmem, void *stream);

#define CD_HOOK_SLOTS 64
static cd_got_patch patches[CD_HOOK_SLOTS];
static int n_patches;                  /* under sub_lock: entries written now */
static int n_known;                    /* entries found by the last walk (written or not) */
static unsigned long long known_gen;   /* the loader's generation at that walk; 0 none */
static int known_clash;                /* that walk found an import of the route */
/* The runtime's __cudaLaunchKernel: one, chosen at the first walk (the one
 * PyTorch's own libraries import, else the first found), for the process's
 * life (a thread may still be on its way in through an entry just restored).
 * Only entries bound to it are written: an object importing another
 * runtime's (an extension built against libcudart.so.12 beside a CUDA 13
 * PyTorch) is left alone, its launches its runtime's and CUPTI's as without
 * the hooks (counted: n_other_runtimes; that runtime:
 * other_launch; stats() names both). */
static void *real_launch;
static void *other_launch;             /* the last walk's first other definition, or NULL */
/* The hot path's switch: ROUTE_OFF, ROUTE_DIRECT (launched past CUPTI, whose
 * callback for the route is off), ROUTE_RECORD (launched the runtime's way,
 * then recorded: CUPTI is not ours). Written under sub_lock. */
enum { ROUTE_OFF = 0, ROUTE_DIRECT = 1, ROUTE_RECORD = 2 };
static atomic_int route_on;
static atomic_uint_fast64_t n_routed, n_recorded, n_handed_back, n_asked, n_unresolved;
static atomic_uint_fast64_t n_other_runtimes;   /* imports left alone: another runtime's */
static atomic_uint_fast64_t ns_lookup, ns_launch;   /* CUDA_DEBUG_PROFILE=1 */
static atomic_int unresolved_rc;       /* the driver's last refusal of a handle */
static int refused_why;                /* CD_HOOKS_*: why the hooks are not on */
/* Python's reading of CUDA_DEBUG_LAUNCH_HOOKS, written at each watch() entry
 * (any thread, before sub_lock): an atomic. */
static atomic_int hooks_wanted = 1;
/* A forked child never walks the loaded objects (dl_iterate_phdr): glibc's
 * fork resets the loader's dl_load_lock in the child, not dl_load_write_lock,
 * which dl_iterate_phdr, dlopen and dlclose take; another thread of the
 * parent inside one at the fork leaves it held in the child for good. Set by
 * the child handler, never cleared (the child's children are forked too). */
static int forked;

/* What a runtime kernel handle (a CUkernel) is in a context: its function
 * (cuKernelGetFunction: what the runtime launches), name and origin.
 * Lock-free, filled on first sight of (kernel, context); an entry filled
 * before the last module unload (base/intern.c's epoch) is not used (the
 * handle may name another kernel now). A slot is claimed by its key,
 * written, then published (ready = 1 + epoch); a reader copies it and checks
 * `ready` again (a seqlock: the slot may be taken back for a new epoch while
 * it reads). A kernel has a slot per context it is launched in (probed on
 * from its hash: a second context's launches are not asked each time); one
 * filled in an older epoch is asked again once. */
#define KERNEL_SLOTS 4096              /* a power of two */
typedef struct {
    _Atomic(void *) key;
    atomic_uint ready;                 /* 1 + epoch when published, 0 while written */
    _Atomic(CUcontext) ctx;
    _Atomic(CUfunction) func;
    _Atomic(const char *) name;
    atomic_int origin;
} kernel_slot;
static kernel_slot kernels[KERNEL_SLOTS];

/* PyTorch's own libraries (the caller of a launch): libtorch*, libc10*, or
 * anything of torch's own lib/ folder. */
static int framework_object(const char *path)
{
    const char *base = path ? strrchr(path, '/') : NULL;
    base = base ? base + 1 : path;
    return base && (!strncmp(base, "libtorch", 8) || !strncmp(base, "libc10", 6) ||
                    !strncmp(base, "libcaffe2", 9) || strstr(path, "/torch/lib/"));
}

/* Cold: the origin of a kernel launched from code at `caller`: its name's,
 * where the name places it; else (a C++ name of no known library) its
 * caller's: PyTorch's own libraries, or another's (an extension: USER). */
static int origin_of_caller(const void *caller, const char *name)
{
    int by_name = cd_kernel_origin_of_name(name);
    if (by_name != CD_ORIGIN_UNKNOWN)
        return by_name;
    Dl_info di;
    if (caller && dladdr(caller, &di) && di.dli_fname)
        return framework_object(di.dli_fname) ? CD_ORIGIN_FRAMEWORK : CD_ORIGIN_USER;
    return by_name;
}

/* Not a handle the driver takes here (its answer; -1: no function, -2: no
 * name): the runtime's own function launches it, where CUPTI's callback
 * records it; counted for stats(). Returns -1. */
static int unresolved(int rc)
{
    atomic_fetch_add_explicit(&n_unresolved, 1, memory_order_relaxed);
    atomic_store_explicit(&unresolved_rc, rc, memory_order_relaxed);
    return -1;
}

static int ask_kernel(void *k, const void *caller, CUfunction *f, const char **name, int *origin)
{
    atomic_fetch_add_explicit(&n_asked, 1, memory_order_relaxed);
    *name = NULL;
    CUresult rc = cd_drv.cuKernelGetFunction(f, (CUkernel)k);
    if (rc != CUDA_SUCCESS || !*f)
        return unresolved(rc ? (int)rc : -1);
    if (!(cd_drv.cuKernelGetName && cd_drv.cuKernelGetName(name, (CUkernel)k) == CUDA_SUCCESS &&
          *name) &&
        !(cd_drv.cuFuncGetName && cd_drv.cuFuncGetName(name, *f) == CUDA_SUCCESS && *name))
        return unresolved(-2);
    *origin = origin_of_caller(caller, *name);
    return 0;
}

static void slot_write(kernel_slot *e, CUcontext ctx, CUfunction f, const char *name, int origin,
                       unsigned ready)
{
    atomic_store_explicit(&e->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&e->func, f, memory_order_relaxed);
    atomic_store_explicit(&e->name, name, memory_order_relaxed);
    atomic_store_explicit(&e->origin, origin, memory_order_relaxed);
    atomic_store_explicit(&e->ready, ready, memory_order_release);
}

static int kernel_of(void *k, const void *caller, CUcontext ctx, CUfunction *f, const char **name,
                     int *origin)
{
    const unsigned want = 1u + cd_intern_kernel_epoch();
    uintptr_t h = ((uintptr_t)k >> 4) * 0x9E3779B97F4A7C15ull;
    uint32_t i = (uint32_t)(h >> 40) & (KERNEL_SLOTS - 1);
    for (int p = 0; p < 8; p++, i = (i + 1) & (KERNEL_SLOTS - 1)) {
        kernel_slot *e = &kernels[i];
        void *key = atomic_load_explicit(&e->key, memory_order_acquire);
        if (key == k) {
            unsigned r = atomic_load_explicit(&e->ready, memory_order_acquire);
            CUcontext c = atomic_load_explicit(&e->ctx, memory_order_relaxed);
            if (r && c != ctx)
                continue;              /* another context's: this one's is further on */
            if (r == want) {
                *f = atomic_load_explicit(&e->func, memory_order_relaxed);
                *name = atomic_load_explicit(&e->name, memory_order_relaxed);
                *origin = atomic_load_explicit(&e->origin, memory_order_relaxed);
                atomic_thread_fence(memory_order_acquire);
                if (atomic_load_explicit(&e->ready, memory_order_relaxed) == r)
                    return 0;
                break;                 /* taken back while read: ask (cold) */
            }
            /* Filled before the last unload or subscription (the epoch moves
             * at each: a second watch() after the first closed): asked again
             * once, by the thread that takes the slot back. */
            if (r && r != want && atomic_compare_exchange_strong(&e->ready, &r, 0)) {
                if (ask_kernel(k, caller, f, name, origin)) {
                    atomic_store(&e->ready, r);
                    return -1;
                }
                slot_write(e, ctx, *f, *name, *origin, want);
                return 0;
            }
            break;                     /* being written */
        }
        if (!key) {
            if (ask_kernel(k, caller, f, name, origin))
                return -1;
            void *expect = NULL;
            if (atomic_compare_exchange_strong(&e->key, &expect, k))
                slot_write(e, ctx, *f, *name, *origin, want);
            return 0;
        }
    }
    return ask_kernel(k, caller, f, name, origin);   /* cold: crowded, stale or a second context */
}

/* The context's CUPTI id, per thread for the last context seen, under the
 * subscription it was asked in (CUPTI detached and initialised again may
 * number the contexts anew), and while no context entry has retired since
 * (capture/contexts.c's epoch): a reset hands back the same CUcontext pointer
 * with a new id, and a launch recorded under the old one split its stream in
 * two in the hang report. */
static _Thread_local CUcontext tls_ctx;
static _Thread_local uint32_t tls_uid;
static _Thread_local uint64_t tls_uid_sub;
static _Thread_local unsigned tls_ctx_epoch;

static int context_uid(CUcontext c, uint32_t *uid)
{
    const uint64_t sub = atomic_load_explicit(&cd_gates.subscriptions, memory_order_relaxed);
    const unsigned epoch = cd_watch_context_epoch();
    if (c == tls_ctx && tls_uid && sub == tls_uid_sub && epoch == tls_ctx_epoch) {
        *uid = tls_uid;
        return 0;
    }
    uint32_t id = 0;
    if (!cd_cupti.cuptiGetContextId || cd_cupti.cuptiGetContextId(c, &id) != CUPTI_SUCCESS || !id)
        return -1;
    tls_ctx = c;
    tls_uid = id;
    tls_uid_sub = sub;
    tls_ctx_epoch = epoch;
    *uid = id;
    return 0;
}

/* The record mode's refusal of a launch it could not resolve (the dead
 * context refuses the kernel's handle as well): the pipeline's refusal path
 * (counted, the fd-2 block), which reads nothing of the launch but its code.
 * CUPTI, the profiler's now, does not call ours. The runtime's sticky codes
 * are the driver's numbers (700-720); its other codes are none of them. */
static __attribute__((noinline, cold)) void record_refusal(int rrc)
{
    CUresult rc = (CUresult)rrc;
    cd_launch l = {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz, NULL, &rc, NULL, NULL, 0,
                   CD_ORIGIN_UNKNOWN, NULL};
    cd_launch_exited(&l);
}

static int hooked_launch(void *kernel, cd_dim3 grid, cd_dim3 block, void **args, size_t shmem,
                         void *stream)
{
    rt_launch_fn real = (rt_launch_fn)real_launch;
    const int mode = atomic_load_explicit(&route_on, memory_order_relaxed);
    /* The exact mode's marker after every launch costs a GPU-bound step more
     * written after the launch's call than inside it (CUPTI's callback):
     * benchmarks/RESULTS.md. Its launches go the runtime's way, to CUPTI
     * (while CUPTI is ours: in the record mode every launch is recorded here). */
    if (!mode || !atomic_load_explicit(&cd_gates.watching, memory_order_relaxed) ||
        (mode == ROUTE_DIRECT &&
         atomic_load_explicit(&cd_gates.watch_every, memory_order_relaxed) <= 1) ||
        cd_thread_wants_blocking() || shmem > 0xFFFFFFFFu)
        return real(kernel, grid, block, args, shmem, stream);
    const int profile = cd_config.profile;
    const uint64_t t0 = profile ? cd_clock_ns() : 0;
    CUcontext ctx = NULL;
    CUfunction f;
    uint32_t uid = 0;
    const char *name;
    int origin = CD_ORIGIN_UNKNOWN;
    if (cd_drv.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || !ctx || context_uid(ctx, &uid) ||
        kernel_of(kernel, __builtin_return_address(0), ctx, &f, &name, &origin)) {
        const int rrc = real(kernel, grid, block, args, shmem, stream);
        if (rrc != 0 && mode == ROUTE_RECORD)
            record_refusal(rrc);       /* a dead context refuses the kernel's handle too */
        return rrc;
    }
    CUlaunchConfig cfg = {grid.x, grid.y, grid.z, block.x, block.y, block.z,
                          (unsigned)shmem, stream ? (CUstream)stream : CU_STREAM_LEGACY, NULL, 0};
    /* The launch as the pipeline reads it (hooks/launch_callback.c): the
     * cuLaunchKernelEx_ptsz this route makes, or the runtime's equivalent. */
    cuLaunchKernelEx_params params = {&cfg, f, args, NULL};
    CUresult rc = CUDA_SUCCESS;
    cd_launch l = {CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz, &params, &rc, name, ctx, uid,
                   origin, NULL};
    cd_launch_entering(&l);            /* an NCCL or USER kernel: bracketed */
    if (mode == ROUTE_RECORD) {
        cd_launch_recorded_by_hook(1);   /* a CUPTI callback inside leaves it to us */
        int rrc = real(kernel, grid, block, args, shmem, stream);
        cd_launch_recorded_by_hook(0);
        if (rrc == 0)
            atomic_fetch_add_explicit(&n_recorded, 1, memory_order_relaxed);
        /* a refusal: the pipeline's refusal path too (record_refusal) */
        rc = (CUresult)rrc;
        cd_launch_exited(&l);
        return rrc;
    }
    const uint64_t t1 = profile ? cd_clock_ns() : 0;
    rc = cd_drv.cuLaunchKernelEx_ptsz(&cfg, f, args, NULL);
    if (profile) {
        const uint64_t t2 = cd_clock_ns();
        atomic_fetch_add_explicit(&ns_lookup, t1 - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&ns_launch, t2 - t1, memory_order_relaxed);
    }
    if (rc != CUDA_SUCCESS) {
        atomic_fetch_add_explicit(&n_handed_back, 1, memory_order_relaxed);
        return real(kernel, grid, block, args, shmem, stream);
    }
    atomic_fetch_add_explicit(&n_routed, 1, memory_order_relaxed);
    cd_launch_exited(&l);
    return 0;
}

/* The launch entry points no loaded object may import while the route is on
 * (their launches would reach the driver as cuLaunchKernelEx_ptsz, unseen). */
static const char *const route_users[] = {"cuLaunchKernelEx_ptsz", "cudaLaunchKernelExC_ptsz"};

static int route_clash(void)
{
    for (size_t i = 0; i < CD_N_OF(route_users); i++) {
        cd_got_patch probe[1];
        void *orig = NULL;
        int others = 0;
        /* Looking only: hook with the entry's own value is not possible
         * without writing, so ask for zero entries and count definitions. */
        void *other = NULL;
        if (cd_got_hook(route_users[i], (void *)hooked_launch, &orig, NULL, probe, 0, &others,
                        &other) ||
            orig || others)
            return 1;
    }
    return 0;
}

void cd_runtime_hooks_want(int on) { atomic_store(&hooks_wanted, on != 0); }

/* Under sub_lock: the entries ours (written again, or found by a walk when
 * something was loaded or unloaded since the last one). 0 when some are. */
static int take_entries(void)
{
    const unsigned long long gen = cd_got_generation();
    const int same = gen != 0 && gen == known_gen;
    if (same && n_patches)
        return 0;                      /* ours, nothing new to take */
    if (!same) {
        known_clash = route_clash();
        known_gen = gen;
        if (!known_clash)
            n_known = -1;              /* walk below */
    }
    if (known_clash) {
        refused_why = CD_HOOKS_CLASH;
        return -1;
    }
    if (n_known == 0) {
        refused_why = CD_HOOKS_NO_IMPORTS;
        return -1;
    }
    if (n_known > 0 && !n_patches) {
        cd_got_reapply(patches, n_known, (void *)hooked_launch);
        n_patches = n_known;
    } else {
        int others = 0;
        n_patches += cd_got_hook("__cudaLaunchKernel", (void *)hooked_launch, &real_launch,
                                 framework_object, patches + n_patches,
                                 CD_HOOK_SLOTS - n_patches, &others, &other_launch);
        n_known = n_patches;
        atomic_store(&n_other_runtimes, (uint_fast64_t)others);
    }
    if (!n_patches) {
        refused_why = CD_HOOKS_NO_IMPORTS;
        return -1;
    }
    return 0;
}

/* Under sub_lock, while a watch opens or CUPTI comes back: the route on. With
 * a subscription, launched past CUPTI (its callback for the route off first:
 * no launch is recorded twice); without one (a profiler holds CUPTI), in the
 * record mode. On each watch entry: objects loaded since the last walk are
 * taken too; when nothing was loaded or unloaded since (the loader's
 * generation), the entries the last walk found are written again without a
 * walk (a watch() entered per training step costs no walk of every library's
 * relocations). */
void cd_runtime_hooks_on(void)
{
    if (forked) {
        refused_why = CD_HOOKS_FORKED;
        return;
    }
    if (cd_cupti_inherited()) {
        refused_why = CD_HOOKS_NO_CUPTI;
        return;
    }
    if (!atomic_load(&hooks_wanted)) {
        refused_why = CD_HOOKS_OFF;
        return;
    }
    if (!cd_drv.cuLaunchKernelEx_ptsz || !cd_drv.cuKernelGetFunction || !cd_cupti.cuptiGetContextId) {
        refused_why = CD_HOOKS_OLD_DRIVER;
        return;
    }
    const int direct = cd_cupti_subscribed();
    if (direct && !cd_cupti_route_off()) {
        if (cd_cupti_route(1)) {
            refused_why = CD_HOOKS_NO_CUPTI;
            return;
        }
    }
    if (take_entries()) {
        if (cd_cupti_route_off())
            cd_cupti_route(0);
        atomic_store(&route_on, ROUTE_OFF);
        return;
    }
    refused_why = 0;
    atomic_store(&route_on, direct ? ROUTE_DIRECT : ROUTE_RECORD);
}

/* Under sub_lock, CUPTI about to be given to a profiler (unsubscribed next):
 * the route goes the runtime's way and records after it (the entries stay). */
void cd_runtime_hooks_record(void)
{
    if (atomic_load(&route_on) == ROUTE_DIRECT)
        atomic_store(&route_on, ROUTE_RECORD);
    cd_cupti_route_forget();           /* the next subscription dispatches the route */
}

/* Under sub_lock: the route off, every entry as it was, CUPTI dispatching
 * cuLaunchKernelEx_ptsz again. */
void cd_runtime_hooks_off(void)
{
    atomic_store(&route_on, ROUTE_OFF);
    if (!forked)                       /* a child's copies stay ours: no walk (`forked`) */
        cd_got_restore(patches, n_patches);
    n_patches = 0;
    if (cd_cupti_route_off())
        cd_cupti_route(0);
}

/* A forked child: its launches go the runtime's way (its copy of the entries
 * still points here, for good: nothing recorded, no call into the parent's
 * CUPTI subscription, which is not the child's), and no walk of the loaded
 * objects from now on (`forked`): the hooks stay off there. */
void cd_runtime_hooks_fork(int op)
{
    if (op != CD_FORK_CHILD)
        return;
    forked = 1;
    atomic_store(&route_on, ROUTE_OFF);   /* the route's CUPTI side: cd_subscription_fork */
    tls_ctx = NULL;
    tls_uid = 0;
}

void cd_runtime_hooks_stats(cd_hook_stats *s)
{
    int mode = atomic_load(&route_on);
    s->on = mode != ROUTE_OFF;
    s->recording = mode == ROUTE_RECORD;
    s->entries = n_patches;
    s->routed = atomic_load(&n_routed);
    s->recorded = atomic_load(&n_recorded);
    s->handed_back = atomic_load(&n_handed_back);
    s->asked = atomic_load(&n_asked);
    s->unresolved = atomic_load(&n_unresolved);
    s->unresolved_rc = atomic_load(&unresolved_rc);
    s->why_off = refused_why;
    s->ns_lookup = atomic_load(&ns_lookup);
    s->ns_launch = atomic_load(&ns_launch);
    s->other_runtimes = atomic_load(&n_other_runtimes);
    /* Cold (stats()): the libraries defining the runtime routed through and
     * the one left alone, as the loader names them; "" for none. */
    Dl_info di;
    s->runtime[0] = s->other_runtime[0] = '\0';
    if (real_launch && dladdr(real_launch, &di) && di.dli_fname)
        snprintf(s->runtime, sizeof s->runtime, "%s", di.dli_fname);
    if (other_launch && dladdr(other_launch, &di) && di.dli_fname)
        snprintf(s->other_runtime, sizeof s->other_runtime, "%s", di.dli_fname);
}
