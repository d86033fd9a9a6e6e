/*
 * base/base.h: the bottom layer of the C core. Everything above includes it;
 * it includes nothing of ours but cuda_api.h, cupti_ids.h and cuda_errors.h.
 *
 *   state.c          the one process-wide state struct (cd_state)
 *   loader.c         dlopen/dlsym of libcuda, CUPTI, cuBLAS
 *   contexts.c       primary contexts; synchronising the current or active ones
 *   launch_params.c  a launch's stream and configuration, from CUPTI's params
 *   subscription.c   taking CUPTI (subscribe, enable the ids), giving it back
 *   intern.c         the string arena: file, function and kernel names
 *   demangle.c       C++ demangling and short kernel names
 *   got.c            pointing other libraries' imports of a function at ours
 *
 * Nothing here links libcuda, CUPTI or cuBLAS: cuda_api.h (generated from the
 * CUDA headers by gen_cuda_api.py, so the build needs no toolkit) gives us types
 * and prototypes (used through __typeof__), the loader fills the function tables.
 * Nothing here knows Python: the layers above hand plain C values down.
 */
#ifndef CD_BASE_H
#define CD_BASE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <pthread.h>

#include "base/cuda_api.h"   /* the driver, CUPTI, cuBLAS declarations we use (generated) */

#include "base/cupti_ids.h"
#include "base/cuda_errors.h"

#define CD_STR2(x) #x
#define CD_STR(x) CD_STR2(x)
#define CD_N_OF(a) (sizeof(a) / sizeof((a)[0]))

/* ---------------------------------------------------------- loader.c -- */

/* Driver entry points. cuda.h maps some names to versioned symbols through
 * macros (cuMemAlloc -> cuMemAlloc_v2): CD_STR(name) expands the macro first,
 * so dlsym looks up the real exported symbol, with the ABI of these headers. */
#define CD_DRIVER_REQUIRED(X)                                                   \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)      \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)                      \
    X(cuDeviceGetAttribute) X(cuDeviceTotalMem)                                \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxGetState)                  \
    X(cuCtxGetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent)                  \
    X(cuCtxSynchronize) X(cuStreamCreate) X(cuStreamDestroy)                   \
    X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamIsCapturing)             \
    X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction) X(cuLaunchKernel) \
    X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo) X(cuMemcpyHtoD) X(cuMemcpyDtoH)  \
    X(cuMemsetD8)                                                              \
    X(cuMemsetD32Async) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)    \
    X(cuEventSynchronize) X(cuMemHostRegister) X(cuMemHostGetDevicePointer)

/* Entry points whose unversioned export has the same signature as the
 * versioned one of these headers: an older driver that lacks the versioned
 * symbol is served by the plain one. (No such fallback for the others: the
 * plain cuMemAlloc, cuCtxPushCurrent... are the 32-bit legacy ABIs.) */
#define CD_DRIVER_FALLBACK(X) X(cuEventElapsedTime) X(cuStreamWriteValue32)

/* Entry points that older drivers lack: NULL when absent. cuStreamGetCaptureInfo
 * is the versioned one of these headers (_v3 for CUDA >= 12.3, _v2 before);
 * cuCtxGetId is CUDA >= 12.0; cuFuncGetName and cuKernelGetName 12.3; the graph
 * API reads the nodes of a graph captured before watching (capture/graph_markers.c). */
#define CD_DRIVER_OPTIONAL(X) X(cuLogsRegisterCallback) X(cuStreamGetCaptureInfo) X(cuCtxGetId) \
    X(cuGraphGetNodes) X(cuGraphNodeGetType) X(cuGraphKernelNodeGetParams) X(cuFuncGetName)    \
    X(cuKernelGetName) X(cuGraphNodeGetToolsId) X(cuGraphExecGetId) X(cuLaunchKernelEx_ptsz) \
    X(cuKernelGetFunction)

/* CUDA 13.1's ids of graph nodes and executables for tools (what
 * torch.cuda.graph_annotations keys its tags by): not in the 13.0 headers
 * cuda_api.h is generated from, so declared here (the driver's documented
 * signatures); NULL in the table where the driver lacks them. */
CUresult cuGraphNodeGetToolsId(CUgraphNode hNode, unsigned long long *toolsNodeId);
/* The per-thread-default-stream twin of cuLaunchKernelEx (cuda.h declares it
 * only under CUDA_API_PER_THREAD_DEFAULT_STREAM): the launch hooks' route. */
CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                               void **extra);
CUresult cuGraphExecGetId(CUgraphExec hGraphExec, unsigned int *graphId);

#define CD_CUPTI_FUNCS(X)                                                       \
    X(cuptiSubscribe) X(cuptiUnsubscribe) X(cuptiEnableCallback)               \
    X(cuptiGetResultString) X(cuptiGetVersion)

#define CD_CUPTI_OPTIONAL(X) X(cuptiSubscribe_v2) X(cuptiGetDeviceId) X(cuptiGetContextId) \
    X(cuptiFinalize)

#define CD_DECLARE_PTR(name) __typeof__(name) *name;

typedef struct {
    CD_DRIVER_REQUIRED(CD_DECLARE_PTR)
    CD_DRIVER_FALLBACK(CD_DECLARE_PTR)
    CD_DRIVER_OPTIONAL(CD_DECLARE_PTR)
} cd_driver_api;

typedef struct {
    CD_CUPTI_FUNCS(CD_DECLARE_PTR)
    CD_CUPTI_OPTIONAL(CD_DECLARE_PTR)
} cd_cupti_api;

/* cuBLAS is declared in bench/gemm_loops.c (only the benchmark uses it). */

enum cd_lib { CD_LIB_CUDA = 0, CD_LIB_CUPTI = 1, CD_LIB_CUBLAS = 2, CD_LIB_COUNT = 3 };

typedef struct {
    void *handle;          /* dlopen handle, NULL until loaded */
    char path[4096];       /* where it was found (dlinfo), "" until loaded */
    char how[32];          /* "already loaded", "system loader", "path" */
    char error[1024];      /* last dlopen/dlsym error text */
} cd_library;

extern cd_driver_api cd_drv;
extern cd_cupti_api cd_cupti;
extern cd_library cd_libs[CD_LIB_COUNT];

/* Try each candidate (bare sonames go to the system loader, paths are opened
 * as given) after first looking for an already-loaded copy of `sonames`.
 * Returns 0 on success, -1 with cd_libs[lib].error set. Callers serialise
 * (Python calls it under the GIL). */
int cd_load_library(enum cd_lib lib, const char *const *sonames, int n_sonames,
                    const char *const *paths, int n_paths);
void *cd_sym(enum cd_lib lib, const char *name);

/* Driver ready: libcuda loaded, cuInit(0) done. Returns the CUresult of cuInit,
 * or -1 when libcuda is not loaded. */
int cd_driver_ready(void);

/* The one checking macro: every CUDA / CUPTI / cuBLAS call made from Python-
 * facing code goes through it. On failure it records the call text, file and
 * line in cd_last_call (read by Python as _core.last_call()) and evaluates to
 * the nonzero status; nothing is printed, nothing exits. */
typedef struct {
    int status;
    const char *lib;       /* "cuda", "cupti", "cublas" */
    const char *call;      /* the call's source text */
    const char *file;
    int line;
} cd_call_record;

extern _Thread_local cd_call_record cd_last_call;

static inline int cd_check_(int status, const char *lib, const char *call,
                            const char *file, int line)
{
    if (status != 0) {
        cd_last_call.status = status;
        cd_last_call.lib = lib;
        cd_last_call.call = call;
        cd_last_call.file = file;
        cd_last_call.line = line;
    }
    return status;
}
#define CD_CHECK(lib, expr) cd_check_((int)(expr), lib, #expr, __FILE__, __LINE__)
#define CU_CHECK(expr) CD_CHECK("cuda", expr)
#define CUPTI_CHECK(expr) CD_CHECK("cupti", expr)

/* Sticky CUresults: the context is dead after them (the table generated from
 * cuda.h, cuda_errors.h, the same one Python's _cuda_errors.py has). */
#define CD_STICKY_CASE(code) case code:
static inline int cd_is_sticky(int code)
{
    switch (code) {
        CD_STICKY_CODES(CD_STICKY_CASE)
        return 1;
    default:
        return 0;
    }
}

/* NCCL's kernels (ncclDevKernel_..., ncclKernel_...; plain or mangled): the
 * name past the mangling prefix when `sym` is one of them, else NULL. Hot
 * path (a scope never waits for a collective): no call, no library. */
static inline const char *cd_nccl_kernel(const char *sym)
{
    if (!sym)
        return NULL;
    if (sym[0] == '_' && sym[1] == 'Z') {
        sym += 2;
        while (*sym >= '0' && *sym <= '9')
            sym++;
    }
    return sym[0] == 'n' && sym[1] == 'c' && sym[2] == 'c' && sym[3] == 'l' ? sym : NULL;
}

/* ------------------------------------------------------------ fork -- */

/* Each file that keeps a lock or per-process state has one cd_<file>_fork(op):
 *   CD_FORK_CHILD      in a forked child (pthread_atfork's child handler, the
 *                      child's one thread, before anything else runs): its
 *                      locks free again, whatever a thread of the parent held
 *                      at the fork, and its state the child's (nothing of the
 *                      parent's launches, faults or scopes; hooks/after_fork.c
 *                      defines the child's state and calls them all, bottom up);
 *   CD_FORK_TEST_TAKE  tests: take its locks (and hold them: a thread of the
 *   CD_FORK_TEST_GIVE  parent in the middle of them), then give them back. */
enum { CD_FORK_CHILD = 0, CD_FORK_TEST_TAKE = 1, CD_FORK_TEST_GIVE = 2 };
/* The op on a file's mutexes (state.c): made new (free) in the child, taken in
 * this order, given back in the reverse. The caller then resets its state. */
void cd_fork_locks(pthread_mutex_t *const *locks, size_t n, int op);
void cd_fork_lock(pthread_mutex_t *lock, int op);

/* -------------------------------------------------------- contexts.c -- */

/* The primary context of device `ordinal` (retained once per device for the
 * life of the process, shared with PyTorch/CuPy). Callers push/pop it around
 * their work rather than replacing the thread's current context. */
#define CD_MAX_DEVICES 64
int cd_device_context(int ordinal, CUcontext *ctx);
/* cuCtxSynchronize of the thread's current context or, when none is current,
 * of every device whose primary context is active. Call without the GIL. */
int cd_sync_current_or_active(void);
/* cuCtxSynchronize of one device's primary context (pushed, then popped). */
int cd_sync_device(int ordinal);
void cd_contexts_fork(int op);

/* ----------------------------------------------------------- state.c -- */

/* How the callback waits for the launched work. NONE is for measuring the
 * cost of being subscribed alone (it makes no launch synchronous). */
enum cd_wait_mode { CD_WAIT_SYNC = 0, CD_WAIT_SPIN = 1, CD_WAIT_NONE = 2 };
/* Markers of captured graph nodes (watch mode): none, a stream write (a
 * memory-op node), a one-thread kernel node. */
enum cd_graph_markers { CD_MARKERS_OFF = 0, CD_MARKERS_MEMOP = 1, CD_MARKERS_KERNEL = 2 };

/*
 * Process-wide state of the launch hooks. One struct, one place.
 *   sub_lock     protects subscriber and the subscribe/unsubscribe transitions,
 *                and the writes of active, watching, all_threads; taken only at
 *                scope/watch entry and exit, never by the callback.
 *   active       open launch_blocking() scopes in the process (enabled ones);
 *                read lock-free (relaxed) by the callback: nonzero means
 *                follower threads (PyTorch autograd workers) block.
 *   watching     open watch() blocks; read lock-free by the callback.
 *   all_threads  open scopes that asked for every thread; read lock-free.
 *   capture_gen  moves on every call that can start a stream capture and on
 *                every subscribe: the callback's capture-status cache is valid
 *                for one generation (hooks/launch_callback.c).
 *   wait_mode, capture_on, profile, capture_check: set at
 *                import from the environment (Python validates them), under
 *                sub_lock and only while nothing is subscribed.
 *   capture_cache: 0 when CUPTI refused a capture-begin id (ask every launch);
 *                atomic: written at a subscription (under sub_lock) while
 *                another thread's callback reads it.
 *   counters     relaxed atomics, statistics only.
 */
typedef struct {
    pthread_mutex_t sub_lock;
    CUpti_SubscriberHandle subscriber;
    atomic_int active;
    atomic_int watching;
    atomic_int all_threads;
    atomic_uint_fast64_t capture_gen;
    int wait_mode;
    int capture_on;
    int profile;                         /* CUDA_DEBUG_PROFILE=1: time the callback */
    int capture_check;                   /* 0 only to measure: skip cuStreamIsCapturing */
    atomic_int capture_cache;            /* written under sub_lock, read by callbacks */

    atomic_uint_fast64_t n_synced;       /* launches waited for */
    atomic_uint_fast64_t n_follower;     /* of which on follower threads */
    atomic_uint_fast64_t ns_capture_check, ns_wait, ns_callback;   /* with profile */
    atomic_uint_fast64_t n_skipped_capture;
    atomic_uint_fast64_t n_subscribes;
    atomic_uint_fast64_t n_refused;      /* launches refused with a sticky error */
    atomic_uint_fast64_t n_watched;      /* launches put in the watch ring */
    atomic_uint_fast64_t n_unmarked;     /* of which without a completion marker */
    atomic_uint_fast64_t n_capture_ids_refused;
    atomic_uint_fast64_t n_graph_ids_refused;   /* end-of-capture and resource ids */
    int graph_markers;                   /* CD_MARKERS_*: CUDA_DEBUG_GRAPH_MARKERS */
    int graph_marker_every;              /* a marker every K launches of a capture's stream */
    atomic_uint_fast64_t n_hand_overs;   /* CUPTI given to a starting profiler */
    atomic_uint_fast64_t ns_watch;       /* with profile: time in cd_watch_launch */
    atomic_uint_fast64_t ns_marker;      /* with profile: of which in cuStreamWriteValue32 */
    atomic_int watch_alloc_rc;           /* last failed completion-slot allocation */
    atomic_int watch_write_rc;           /* last failed cuStreamWriteValue32 */
    int inherited;                       /* a forked child: `subscriber` is the parent's
                                            (never unsubscribed here; under sub_lock) */
    /* watch(): a completion marker behind every watch_every-th launch of a
     * stream (1: behind every launch, the exact mode), and behind the last
     * launch of a stream when the host waits for it (capture/watch_ring.c).
     * Written by Python at watch entry, read relaxed by the callback. */
    atomic_uint watch_every;
    int watch_probe;                     /* CD_PROBE_*: CUDA_DEBUG_WATCH_PROBE, measuring only */
    atomic_uint_fast64_t n_marked;       /* launches that got a marker of their own */
    atomic_uint_fast64_t n_closed;       /* markers put behind a stream's last launch at a wait */
    atomic_uint_fast64_t n_wait_ids_refused;   /* CD_WAIT_CBIDS that CUPTI refused */
    int waits_enabled;                   /* CD_WAIT_CBIDS on (while watching); under sub_lock */
    int detach;                          /* CUDA_DEBUG_CUPTI_DETACH: cuptiFinalize after the last scope */
    atomic_uint_fast64_t n_detaches;     /* cuptiFinalize calls that succeeded */
    /* The runtime's launches routed past CUPTI (hooks/runtime_launch.c):
     * cuLaunchKernelEx_ptsz's callback off meanwhile. Under sub_lock. */
    int launch_hooks;
    atomic_uint_fast64_t n_hook_other_runtimes;   /* imports left alone: another runtime's */
    /* Threads inside our CUPTI callback for long (a launch_blocking() wait,
     * the fault path): CUPTI is not given to a profiler (which finalizes it
     * at its end) until they are out (subscription.c). Cold paths only. */
    atomic_int in_callback;
    atomic_uint_fast64_t n_hand_overs_busy;   /* hand-overs that could not wait for them */
    atomic_uint_fast64_t n_take_backs;        /* CUPTI taken back after a profiler */
} cd_state_t;

/* What a watched launch does, for measuring the cost of each part
 * (benchmarks/always_on.py): everything; only CUPTI's dispatch and our
 * entry (no record); a record without frames or marker; a record with
 * frames, no marker. */
enum cd_watch_probe { CD_PROBE_OFF = 0, CD_PROBE_DISPATCH = 1, CD_PROBE_RECORD = 2,
                      CD_PROBE_FRAMES = 3 };

extern cd_state_t cd_state;
/* The child's state: no scope, no watch, sub_lock free; a subscription the
 * parent held stays (CUPTI's copy in the child has it) but is never given back
 * from the child (hands no CUPTI call to a forked CUDA). */
void cd_state_fork(int op);

/* --------------------------------------------------- launch_params.c -- */

/* The launch's stream, and (when d is not NULL) its configuration, from the
 * params of one of the CD_LAUNCH_CBIDS; NULL stream of a _ptsz id is
 * CU_STREAM_PER_THREAD. */
typedef struct {
    unsigned grid[3], block[3], shared_mem;
} cd_launch_dims;
CUstream cd_launch_stream(CUpti_CallbackId cbid, const void *params, cd_launch_dims *d);
int cd_is_graph_launch(CUpti_CallbackId cbid);

/* One kernel launch (or graph launch), as every step of the launch pipeline
 * (hooks/launch_callback.c: record, mark, check) reads it. Two sources fill
 * it: CUPTI's callback, from its callback data at the API exit of one of the
 * CD_LAUNCH_CBIDS; the launch hooks (hooks/runtime_launch.c), after the
 * runtime's launch returned, with the cuLaunchKernelEx parameters of the
 * launch they made or watched. On the caller's stack; nothing in it is kept. */
typedef struct {
    CUpti_CallbackId cbid;     /* the entry point (cupti_ids.h): how to read params */
    const void *params;        /* its parameters (cu<entry point>_params) */
    CUresult *ret;             /* its return value: a wait's error is written here */
    const char *symbol;        /* the kernel's mangled name; NULL for a graph launch */
    CUcontext context;
    uint32_t context_uid;      /* CUPTI's id of the context */
    int origin;                /* CD_ORIGIN_* where the source knows it; 0: by its name */
    /* Read from params by the pipeline after its gate (cd_launch_stream: one name
     * per stream, the legacy stream NULL); the sources leave it. */
    CUstream stream;
} cd_launch;

/* ---------------------------------------------------- subscription.c -- */

/* Take CUPTI for `callback` (the driver launch and capture ids of
 * cupti_ids.h), unless it is already held by us: 0, or the CUptiResult with
 * `holder` filled (the other tool's name). Under cd_state.sub_lock. Returns 0
 * with *fresh = 1 when this call subscribed. */
int cd_cupti_acquire(CUpti_CallbackFunc callback, int *fresh, char *holder, size_t holder_len);
/* Under sub_lock: unsubscribe when no scope or watch needs the callback. */
void cd_cupti_release(void);
/* Under sub_lock: the host-wait ids (CD_WAIT_CBIDS) on while a watch() is
 * open, off otherwise (a launch_blocking() scope's own waits are not
 * dispatched to us twice). */
void cd_cupti_watch_waits(int on);
/* Under sub_lock: give CUPTI up now, whatever is open, once no thread is
 * inside the callback for long (up to 5 s: else counted in
 * n_hand_overs_busy); 1 if it was held. */
int cd_cupti_hand_over_locked(void);
/* The callback, at a launch's API exit: is a detach asked for; then do it
 * (cuptiFinalize; the subscription is gone). */
int cd_cupti_detach_asked(void);
void cd_subscription_fork(int op);      /* the child: no detach pending */
void cd_cupti_detach_now(void);
/* Under sub_lock: CUPTI's callback for the launch hooks' route
 * (cuLaunchKernelEx_ptsz) off (1) or on again (0); subscribing meanwhile
 * leaves it off. 0, or the CUptiResult. */
int cd_cupti_route(int off);

/* ---------------------------------------------------------- intern.c -- */

/* Strings that outlive what they were copied from (file, function and kernel
 * names), in one fixed arena: an id is 1 + the offset, 0 means "none". Never
 * freed; when the arena is full new strings get id 0. Insertion takes a
 * spinlock (cold: once per distinct string); reading an id needs nothing. */
uint32_t cd_intern(const char *s, size_t n);
const char *cd_interned(uint32_t id);
size_t cd_intern_used(void);
void cd_intern_fork(int op);
/* A kernel's name by CUPTI's symbolName pointer: lock-free lookup, copied
 * (and its short name and origin computed) on first sight. 0 for NULL/"" or
 * full. *origin (when not NULL): CD_ORIGIN_* by its name. *early (when not
 * NULL): 1 for the first CD_EARLY_LAUNCHES calls with it for this kernel
 * (these launches get a completion marker of their own: a kernel new to the
 * program is where faults and hangs are likeliest), else 0; counted only
 * where early is asked for. */
#define CD_EARLY_LAUNCHES 2
uint32_t cd_intern_kernel(const char *symbol, uint32_t *short_id, int *origin, int *early);
/* The origin of a kernel by its symbol pointer (the table when it was seen,
 * else by its name): for the API entry of a launch (hot: a lookup). */
int cd_kernel_origin(const char *symbol);
/* Module unloads: CUPTI's MODULE_UNLOAD_STARTING (a pointer may name another
 * kernel from now on); whether those callbacks come (set at each subscribe:
 * then a checked name needs no check again until the next unload). */
void cd_intern_kernels_unloaded(void);
void cd_intern_kernels_trust_unloads(int on);
/* Moves at every module unload CUPTI reports, and at every subscription. */
unsigned cd_intern_kernel_epoch(void);

/* -------------------------------------------------------- demangle.c -- */

/* The demangled name of a mangled C++ symbol, malloc'd (free() it), or NULL
 * when it is not mangled or cannot be demangled. Cold paths only. */
char *cd_demangle(const char *mangled);
/* The short readable name of a mangled or plain kernel name, into out:
 * `void at::native::k<float, ...>(...)` -> `k<float, …>`. Fault path. */
size_t cd_short_kernel_name(const char *name, char *out, size_t cap);
/* Where a kernel comes from, by its name (cold: once per kernel): USER, a
 * kernel the program's author wrote or JIT-compiled (Triton's @jit, CuPy's
 * RawKernel, a module loaded through the driver: plain extern "C" names; an
 * extension's C++ kernel when the launch hooks saw its caller); GENERATED,
 * compiled for the program (Inductor's triton_poi_..., CuPy's cupy_...);
 * FRAMEWORK, PyTorch's own (at::, c10::); VENDOR, cuBLAS, cuDNN, CUTLASS,
 * NCCL...; UNKNOWN, a C++ kernel its name does not place. Reports lead with
 * the likeliest culprit: USER first, then GENERATED, then the rest
 * (cd_origin_rank: 0, 1, 2); the always-on watch() brackets every USER launch
 * with markers. */
enum { CD_ORIGIN_UNKNOWN = 0, CD_ORIGIN_USER = 1, CD_ORIGIN_GENERATED = 2,
       CD_ORIGIN_FRAMEWORK = 3, CD_ORIGIN_VENDOR = 4 };
int cd_kernel_origin_of_name(const char *kernel);
int cd_origin_rank(int origin);

/* ------------------------------------------------------------- got.c -- */

/* One GOT entry written: where, what it held, and the object it is in (its
 * load address, program headers, name: checked before each later write, so
 * that nothing is written into an object unloaded or replaced since). */
typedef struct {
    void **slot;                 /* NULL: dropped (its object is gone) */
    void *old;                   /* what it held before ours */
    void *target;                /* the definition it leads to */
    void *wrote;                 /* what we wrote there */
    uintptr_t base;              /* the object: dl_iterate_phdr's dlpi_addr, */
    const void *phdr;            /* dlpi_phdr, */
    uint32_t name_hash;          /* a hash of dlpi_name, */
    int phnum;                   /* dlpi_phnum */
    int prot;                    /* the page's protection (PROT_*), put back after each write */
    int done;                    /* scratch: written by the last pass */
} cd_got_patch;
/* Point every loaded object's imports of `symbol` (JUMP_SLOT, GLOB_DAT; not
 * our own) that lead to one definition at `replacement`: at most max entries,
 * into out; returns how many. *original: in, the definition already taken
 * (NULL the first time: the one an entry of an object `prefer` (may be NULL)
 * says yes to leads to, else the first one found); out, the one taken.
 * *other_targets: entries left alone because they lead to another definition;
 * *other_target: the first of those definitions (NULL: none).
 * Cold, from Python (takes the loader's lock). */
int cd_got_hook(const char *symbol, void *replacement, void **original,
                int (*prefer)(const char *object), cd_got_patch *out, int max, int *other_targets,
                void **other_target);
/* Write back what the entries held, into those that still hold ours, in
 * objects still loaded where they were found; the others are dropped. */
void cd_got_restore(cd_got_patch *p, int n);
/* Point the same entries at `replacement` again (nothing loaded or unloaded
 * since they were found: cd_got_generation() unchanged; checked again per
 * object all the same). */
void cd_got_reapply(cd_got_patch *p, int n, void *replacement);
/* The loader's count of objects loaded and unloaded, as one number (0 where
 * the loader does not say); cheap. */
unsigned long long cd_got_generation(void);

#endif
