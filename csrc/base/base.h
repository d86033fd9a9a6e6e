/*
 * base/base.h: the bottom layer of the C core. Everything above includes it;
 * it includes nothing of ours but cuda_api.h, cupti_ids.h and cuda_errors.h.
 *
 *   state.c          the gates the callback reads, the configuration, fork's
 *                    lock helper
 *   loader.c         dlopen/dlsym of libcuda, CUPTI, cuBLAS
 *   devices.c        each device's primary context (retained once); synchronising
 *                    the current or active ones
 *   launch_params.c  a launch's stream and configuration, from CUPTI's params
 *   subscription.c   taking CUPTI (subscribe, enable the ids), giving it back
 *   intern.c         the string arena: file, function and kernel names
 *   demangle.c       C++ demangling and short kernel names
 *   got.c            pointing other libraries' imports of a function at ours
 *
 * Nothing here links libcuda, CUPTI or cuBLAS: cuda_api.h (generated from the
 * CUDA headers by tools/gen/cuda_api.py, so the build needs no toolkit) gives us types
 * and prototypes (used through __typeof__), the loader fills the function tables.
 * Nothing here knows Python: the layers above hand plain C values down.
 */
#ifndef CD_BASE_H
#define CD_BASE_H

#include <stdatomic.h>  /* atomic_uint_fast64_t, atomic_load, atomic_int, ... */
#include <stddef.h>      /* size_t */
#include <stdint.h>      /* uint64_t, uint32_t, uintptr_t */
#include <pthread.h>     /* pthread_mutex_t */

#include "base/cuda_api.h"   /* the driver, CUPTI, cuBLAS declarations we use (generated) */

#include "base/cupti_ids.h"      /* the CUPTI callback ids we enable (CD_LAUNCH_CBIDS...) */
#include "base/cuda_errors.h"    /* CD_STICKY_CODES (generated) */

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
 * API reads the nodes of a graph captured before watching (capture/graph_adopt.c). */
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

/* -------------------------------------------------------- counters -- */

/* A layer's counters (statistics), listed once as an X-macro of names: its
 * getter's readers see CD_COUNTER_FIELD's plain struct; the file keeps a
 * static `counts` of CD_COUNTER_ATOMIC (relaxed atomics, written by it
 * alone), and its getter, whose argument is `out`, copies them with
 * CD_COUNTER_READ. */
#define CD_COUNTER_FIELD(name) uint64_t name;
#define CD_COUNTER_ATOMIC(name) atomic_uint_fast64_t name;
#define CD_COUNTER_READ(name) out->name = atomic_load(&counts.name);

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

/* --------------------------------------------------------- devices.c -- */

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
void cd_devices_fork(int op);

/* ----------------------------------------------------------- state.c -- */

/* How the callback waits for the launched work. NONE is for measuring the
 * cost of being subscribed alone (it makes no launch synchronous). */
enum cd_wait_mode { CD_WAIT_SYNC = 0, CD_WAIT_SPIN = 1, CD_WAIT_NONE = 2 };
/* Markers of captured graph nodes (watch mode): none, a stream write (a
 * memory-op node), a one-thread kernel node. */
enum cd_graph_markers { CD_MARKERS_OFF = 0, CD_MARKERS_MEMOP = 1, CD_MARKERS_KERNEL = 2 };
/* What a watched launch does, for measuring the cost of each part
 * (benchmarks/always_on.py): everything; only CUPTI's dispatch and our
 * entry (no record); a record without frames or marker; a record with
 * frames, no marker. */
enum cd_watch_probe { CD_PROBE_OFF = 0, CD_PROBE_DISPATCH = 1, CD_PROBE_RECORD = 2,
                      CD_PROBE_FRAMES = 3 };

/* The process-wide state is owned piece by piece: each piece is written by
 * one file (tests/house/test_architecture.py::test_state_has_one_writer reads the
 * tree for it), the others read it.
 *   cd_gates     (state.c) what the callback reads lock-free, first thing at
 *                each launch; written only through the cd_gate_* calls below.
 *   cd_config    (state.c) the debug switches: written by cd_configure()
 *                alone, before the first scope; read like constants.
 *   the subscription (subscription.c: the subscriber, cd_sub_lock) and each
 *                layer's counters (static in their file, read through its
 *                *_stats getter: launch_callback.c, watch_ring.c, scopes.c,
 *                runtime_launch.c, subscription.c, contexts.c).
 *
 * The gates: plain atomics, read relaxed by the callback.
 *   active       open launch_blocking() scopes in the process (enabled ones):
 *                nonzero means follower threads (PyTorch autograd workers) block.
 *   watching     open watch() blocks.
 *   all_threads  open scopes that asked for every thread.
 *   capture_gen  moves on every call that can start a stream capture and on
 *                every subscribe: the callback's capture-status cache is valid
 *                for one generation (hooks/launch_callback.c).
 *   capture_cache  0 when CUPTI refused a capture-begin id (ask every launch).
 *   subscriptions  CUPTI subscriptions taken so far (CUPTI detached and
 *                initialised again may number contexts anew).
 *   watch_every  watch(): a completion marker behind every watch_every-th
 *                launch of a stream (1: behind every launch, the exact mode),
 *                and behind the last launch of a stream when the host waits
 *                for it (capture/watch_ring.c). Set by Python at watch entry.
 *   in_callback  threads inside our CUPTI callback for long (a
 *                launch_blocking() wait, the fault path): CUPTI is not given
 *                to a profiler (which finalizes it at its end) until they are
 *                out (subscription.c). Cold paths only.
 * active, watching, all_threads change under cd_sub_lock (scope entry and
 * exit), never in the callback. */
typedef struct {
    atomic_int active;
    atomic_int watching;
    atomic_int all_threads;
    atomic_uint_fast64_t capture_gen;
    atomic_int capture_cache;
    atomic_uint_fast64_t subscriptions;
    atomic_uint watch_every;
    atomic_int in_callback;
} cd_gates_t;
extern cd_gates_t cd_gates;

enum cd_gate { CD_GATE_ACTIVE = 0, CD_GATE_WATCHING = 1, CD_GATE_ALL_THREADS = 2 };
/* Under cd_sub_lock: one more (+1) or one fewer (-1, never below 0) of a count. */
void cd_gate_count(enum cd_gate g, int delta);
/* A call that can start a capture (or a subscription, or a hand-over): the
 * capture-status caches are stale. */
void cd_gate_capture_moved(void);
/* Under cd_sub_lock: whether the callback may trust its capture-status cache. */
void cd_gate_capture_cache(int on);
/* Under cd_sub_lock, at a subscription: counted, and the caches stale. */
void cd_gate_subscribed(void);
void cd_gate_watch_every(unsigned every);
/* A thread enters (+1) or leaves (-1) a long stay in the callback. */
void cd_gate_in_callback(int delta);

/* The debug switches, validated by Python (cuda_debug/_options.py) from
 * CUDA_DEBUG_*: written by cd_configure() alone, under cd_sub_lock while
 * nothing is subscribed (before the first scope), so the callback reads them
 * as constants. */
typedef struct {
    int wait_mode;             /* CD_WAIT_*: CUDA_DEBUG_WAIT */
    int tee_stderr;            /* the stderr tee (capture/stderr_tee.c): CUDA_DEBUG_CAPTURE */
    int profile;               /* CUDA_DEBUG_PROFILE=1: time the callback */
    int capture_check;         /* 0 only to measure: skip cuStreamIsCapturing */
    int graph_markers;         /* CD_MARKERS_*: CUDA_DEBUG_GRAPH_MARKERS */
    int graph_marker_every;    /* a marker every K launches of a capture's stream */
    int watch_probe;           /* CD_PROBE_*: CUDA_DEBUG_WATCH_PROBE, measuring only */
    int detach;                /* CUDA_DEBUG_CUPTI_DETACH: cuptiFinalize after the last scope */
} cd_config_t;
extern cd_config_t cd_config;
void cd_configure(const cd_config_t *c);

/* The child's gates: no scope, no watch, the capture caches stale. */
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

/* Protects the subscription and its transitions, and the writes of the
 * scope counts (cd_gates: active, watching, all_threads); taken only at
 * scope/watch entry and exit (and without waiting by the detaching
 * callback), never on a launch's way. */
extern pthread_mutex_t cd_sub_lock;
/* Under cd_sub_lock (or for a statistic): CUPTI is subscribed by us; the
 * subscription is a forked child's copy of its parent's (never given back
 * from the child: no CUPTI call into a forked CUDA). */
int cd_cupti_subscribed(void);
int cd_cupti_inherited(void);
/* The counters of subscription.c: capture ids CUPTI refused, host-wait
 * ids it refused, CUPTI given to a starting profiler (of which could not
 * wait for the callback's long stays), cuptiFinalize calls that succeeded
 * (stats() shows them under these names); end-of-capture and resource ids
 * it refused (graph_stats()). */
#define CD_SUBSCRIPTION_COUNTS(X)                                                   \
    X(capture_ids_refused) X(wait_ids_refused) X(hand_overs) X(hand_overs_busy)     \
    X(detaches)
typedef struct {
    CD_SUBSCRIPTION_COUNTS(CD_COUNTER_FIELD)
    uint64_t graph_ids_refused;
} cd_subscription_counts;
void cd_subscription_stats(cd_subscription_counts *out);

/* Take CUPTI for `callback` (the driver launch and capture ids of
 * cupti_ids.h), unless it is already held by us: 0, or the CUptiResult with
 * `holder` filled (the other tool's name). Under cd_sub_lock. Returns 0
 * with *fresh = 1 when this call subscribed. */
int cd_cupti_acquire(CUpti_CallbackFunc callback, int *fresh, char *holder, size_t holder_len);
/* Under cd_sub_lock: unsubscribe when no scope or watch needs the callback. */
void cd_cupti_release(void);
/* Under cd_sub_lock: the host-wait ids (CD_WAIT_CBIDS) on while a watch() is
 * open, off otherwise (a launch_blocking() scope's own waits are not
 * dispatched to us twice). */
void cd_cupti_watch_waits(int on);
/* Under cd_sub_lock: give CUPTI up now, whatever is open, once no thread is
 * inside the callback for long (up to 5 s: else counted in
 * n_hand_overs_busy); 1 if it was held. */
int cd_cupti_hand_over_locked(void);
/* The callback, at a launch's API exit: is a detach asked for; then do it
 * (cuptiFinalize; the subscription is gone). */
int cd_cupti_detach_asked(void);
/* The child: cd_sub_lock free, no detach pending, a subscription the parent
 * held kept (CUPTI's copy in the child has it) but marked inherited. */
void cd_subscription_fork(int op);
void cd_cupti_detach_now(void);
enum { CD_SHARED_NONE = 0, CD_SHARED_HELD = 1, CD_SHARED_PROFILER = 2 };
/* Under cd_sub_lock: another client used CUPTI (CD_SHARED_*): no detach from now on. */
void cd_cupti_shared(int why);
/* Why CUPTI's dispatch stays armed now that nothing is open (CD_RESIDUE_*;
 * CD_RESIDUE_NONE: nothing of ours left, or a scope is open). */
enum { CD_RESIDUE_NONE = 0, CD_RESIDUE_PENDING = 1, CD_RESIDUE_OFF = 2, CD_RESIDUE_HELD = 3,
       CD_RESIDUE_PROFILER = 4, CD_RESIDUE_NO_FINALIZE = 5, CD_RESIDUE_INHERITED = 6,
       CD_RESIDUE_FAILED = 7 };
int cd_cupti_residue(void);
/* Under cd_sub_lock: CUPTI's callback for the launch hooks' route
 * (cuLaunchKernelEx_ptsz) off (1) or on again (0); subscribing meanwhile
 * leaves it off. 0, or the CUptiResult (a refused "off" leaves it on).
 * cd_cupti_route_off: whether it is off now; cd_cupti_route_forget: the next
 * subscription dispatches it (CUPTI is about to be given up: no CUPTI call). */
int cd_cupti_route(int off);
int cd_cupti_route_off(void);
void cd_cupti_route_forget(void);

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
