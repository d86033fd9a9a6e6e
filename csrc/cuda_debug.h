/*
 * cuda_debug internal header: the one place that names the process-wide state
 * and the run-time-loaded CUDA entry points.
 *
 * Layout of the C core (one concern per file):
 *   module.c        method table, the scope handle type, PEP 489 init
 *   loader.c        dlopen/dlsym of libcuda, CUPTI, cuBLAS; primary contexts
 *   launch_hooks.c  the CUPTI launch callback (the hot path); taking and giving back CUPTI
 *   scopes.c        per-thread scope stacks, scope entry (drain, subscribe) and exit
 *   watch_ring.c    watch mode: the launch ring, completion markers, culprit search
 *   frames.c        the launching thread's Python frames, read without the GIL
 *   intern.c        the string arena: file names, function names, kernel names
 *   fault_records.c the ring of fault records
 *   fault_report.c  the compact report written to fd 2 at the moment of the fault
 *   stderr_tee.c    the pass-through stderr that catches the device's assert text
 *   driver_log.c    the driver's error log (cuLogsRegisterCallback, CUDA >= 12.9)
 *   demangle.c      C++ symbol demangling and short kernel names
 *   native_ops.c    the PyTorch operators on the launching thread's native stack
 *   fault_kernels.c PTX fault kernels for cuda_debug.testing, launched via the driver
 *   gemm_loops.c    cuBLAS / cuBLASLt GEMM timing loops for cuda_debug.bench
 *   launch_latency.c empty-kernel launch timing loops for cuda_debug.bench
 *   bench_buffers.c the benchmark's device buffers, L2 flush, sample arrays (bench.h)
 *
 * Nothing here links libcuda, CUPTI or cuBLAS: the headers give us types and
 * prototypes (used through __typeof__), the loader fills the function tables.
 * The C layer returns raw values (ints, tuples, bytes); Python names them.
 */
#ifndef CUDA_DEBUG_H
#define CUDA_DEBUG_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdatomic.h>
#include <stdint.h>
#include <pthread.h>

#include <cuda.h>
#include <cupti.h>

#include "cupti_ids.h"

#define CD_STR2(x) #x
#define CD_STR(x) CD_STR2(x)

/* ---------------------------------------------------------------- loader -- */

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
    X(cuEventSynchronize) X(cuMemHostAlloc) X(cuMemHostGetDevicePointer)

/* Entry points whose unversioned export has the same signature as the
 * versioned one of these headers: an older driver that lacks the versioned
 * symbol is served by the plain one. (No such fallback for the others: the
 * plain cuMemAlloc, cuCtxPushCurrent... are the 32-bit legacy ABIs.) */
#define CD_DRIVER_FALLBACK(X) X(cuEventElapsedTime) X(cuStreamWriteValue32)

/* Entry points that older drivers lack: NULL when absent. */
#define CD_DRIVER_OPTIONAL(X) X(cuLogsRegisterCallback)

#define CD_CUPTI_FUNCS(X)                                                       \
    X(cuptiSubscribe) X(cuptiUnsubscribe) X(cuptiEnableCallback)               \
    X(cuptiGetResultString) X(cuptiGetVersion)

#define CD_CUPTI_OPTIONAL(X) X(cuptiSubscribe_v2) X(cuptiGetDeviceId)

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

/* cuBLAS is declared in gemm_loops.c (only the benchmark uses it). */

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
 * Returns 0 on success, -1 with cd_libs[lib].error set. Needs the GIL. */
int cd_load_library(enum cd_lib lib, PyObject *sonames, PyObject *paths);
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

/* The primary context of device `ordinal` (retained once per device for the
 * life of the process, shared with PyTorch/CuPy). Callers push/pop it around
 * their work rather than replacing the thread's current context. */
#define CD_MAX_DEVICES 64
int cd_device_context(int ordinal, CUcontext *ctx);
/* cuCtxSynchronize of the thread's current context or, when none is current,
 * of every device whose primary context is active. Call without the GIL. */
int cd_sync_current_or_active(void);

/* Sticky CUresults: the context is dead after them. */
static inline int cd_is_sticky(int code)
{
    return code == 700 || code == 702 || (code >= 714 && code <= 719) || code == 710 ||
           code == 214;
}

/* ------------------------------------------------------- intern.c --------- */

/* Strings that outlive what they were copied from (file, function and kernel
 * names), in one fixed arena: an id is 1 + the offset, 0 means "none". Never
 * freed; when the arena is full new strings get id 0. Insertion takes a
 * spinlock (cold: once per distinct string); reading an id needs nothing. */
uint32_t cd_intern(const char *s, size_t n);
const char *cd_interned(uint32_t id);
size_t cd_intern_used(void);
/* A kernel's name by CUPTI's symbolName pointer: lock-free lookup, copied
 * (and its short name computed) on first sight. 0 for NULL/"" or full. */
uint32_t cd_intern_kernel(const char *symbol, uint32_t *short_id);

/* ------------------------------------------------------- frames.c --------- */

#define CD_FAULT_FRAMES 24     /* frames kept with a fault record */
#define CD_RING_FRAMES 4       /* frames kept with a watch ring record */

/* Kinds of code locations (the policy is Python's: _report.is_user_file; the
 * prefixes it gives are applied here, when a location is first seen). */
enum { CD_LOC_LIBRARY = 0, CD_LOC_USER = 1, CD_LOC_PSEUDO = 2 /* <string>, <stdin> */ };

/* The calling thread's Python frames, innermost first, as location ids, read
 * without the GIL (the thread is blocked in a C call made from Python, so its
 * frames cannot change). `max` ids at most; with `to_user`, stop at the first
 * user frame (the last id is then that frame even when deeper than max-1;
 * the frames between are only classified, not interned).
 * *complete = 1 when the walk reached the outermost frame, -1 when frames
 * were left out before the last id (the user frame). Returns the count
 * (0: the thread runs no Python, or this Python version has no reader). */
int cd_frames_capture(uint32_t *ids, int max, int to_user, int *complete);
typedef struct {
    uint32_t file, func;   /* interned */
    int lineno;
    int kind;              /* CD_LOC_* */
} cd_location;
int cd_location_get(uint32_t id, cd_location *out);
/* Library prefixes and pseudo-file rules from Python (needs the GIL). */
int cd_frames_configure(PyObject *library_prefixes, PyObject *user_pseudo);
extern const int cd_frames_supported;

/* ----------------------------------------------------- stderr_tee.c ------- */

/* While installed, libc's `stderr` is a pass-through stream: every write goes
 * straight to fd 2, and a thread with an open window also keeps a copy of its
 * own text (the device's assert lines, printed by the thread that syncs). */
typedef struct {
    char *buf;
    size_t cap, len;
    size_t cut;            /* bytes that did not fit */
} cd_window;
int cd_tee_install(void);              /* once; 0 ok */
void cd_tee_open(cd_window *w, char *buf, size_t cap);    /* this thread */
void cd_tee_close(void);
/* The most recent device-assert lines written by any thread (watch mode,
 * where the text comes out at whichever call finds the fault). */
size_t cd_tee_recent_asserts(char *out, size_t cap);
/* The ring's byte count now; then the assert lines kept since that naming
 * `kernel` (any when kernel is NULL or ""), up to cap, the rest counted in *cut. */
uint64_t cd_tee_assert_mark(void);
size_t cd_tee_asserts_since(uint64_t mark, const char *kernel, char *out, size_t cap,
                            size_t *cut);
int cd_tee_installed(void);

/* ---------------------------------------------------- fault_records.c ----- */

#define CD_FAULT_RING 32
#define CD_KERNEL_NAME 1024
#define CD_DEVICE_MESSAGE 8192
#define CD_FAULT_OPS 8             /* ATen operators kept with a fault record */
#define CD_OP_NAME 64

typedef struct {
    uint64_t seq;              /* 1, 2, ...; 0 = empty */
    int code;                  /* CUresult */
    int at_launch;             /* 1: the launch call itself failed; 0: the wait found it */
    int consequence;           /* a sticky fault was recorded before: this is its echo */
    int cbid;                  /* CUPTI driver callback id of the launch */
    char kernel[CD_KERNEL_NAME];   /* mangled symbol name (cut), "" for graph launches */
    size_t kernel_len;         /* its full length */
    unsigned grid[3], block[3];
    unsigned shared_mem;
    uintptr_t stream;
    uintptr_t context;
    int device;                /* ordinal, -1 unknown */
    long thread_id;            /* gettid() of the launching thread */
    char thread_name[16];      /* raw bytes: may be cut inside a UTF-8 character */
    double wall_time;          /* CLOCK_REALTIME seconds */
    uint64_t launch_seq;       /* watch-ring seq of this launch, 0 none */
    uint32_t frames[CD_FAULT_FRAMES];  /* location ids, innermost first */
    int n_frames, frames_complete;
    char ops[CD_FAULT_OPS][CD_OP_NAME];   /* at::_ops::<name> on the native stack, innermost first */
    int n_ops;
    char device_message[CD_DEVICE_MESSAGE]; /* the text this thread got during the wait */
    size_t device_message_len;
    size_t device_message_cut; /* bytes that did not fit */
    uint64_t log_end;          /* driver-log lines [.., log_end) precede this fault */
} cd_fault;

/* Fill the identity fields of `f` from a launch callback (kernel, dims,
 * stream, device, thread, time, frames). Cold path. */
void cd_fault_fill(cd_fault *f, const CUpti_CallbackData *cb, CUpti_CallbackId cbid);
/* Copy into the ring, assign seq and `consequence`; returns the seq. */
uint64_t cd_fault_record(cd_fault *f);
uint64_t cd_fault_seq(void);
/* Then, for the first records, the PyTorch ops of the native stack (slow:
 * after recording, so other threads see the fault at once). */
void cd_fault_add_ops(cd_fault *f);
/* Copy the records with seq > since, oldest first, into out (at most n). */
int cd_faults_since(uint64_t since, cd_fault *out, int n);

/* ----------------------------------------------------- fault_report.c ----- */

/* The compact block written to fd 2 at the moment a fault is found, before
 * control returns to the framework (CUDA_DEBUG_REPORT=0 turns it off). Uses
 * write(2) and fixed buffers only. */
void cd_report_fault(const cd_fault *f);
/* Watch mode: the culprit launch, from the ring, when a fault is found outside
 * any wait of ours (a launch refused, the driver log, a signal). Async-signal-
 * safe when `from_signal`. Writes at most once per process. */
void cd_report_watch_culprit(int code, const char *found_at, int from_signal);
int cd_report_configure(PyObject *names, int enabled, PyObject *prefix, const char *error_file);
/* SIGABRT/SIGTERM: write the watch culprit, then the previous handler. */
int cd_install_signal_handlers(void);
extern atomic_int cd_report_written;

/* ------------------------------------------------------- driver_log.c ----- */

void cd_driver_log_init(void);
uint64_t cd_driver_log_count(void);
PyObject *cd_driver_log_lines(uint64_t from, uint64_t to);   /* list[bytes] */

/* ------------------------------------------------------- watch_ring.c ----- */

#define CD_WATCH_RING 65536        /* launch records kept (a power of two) */
#define CD_WATCH_SLOTS 65536       /* completion slots per context */

typedef struct {
    _Atomic uint64_t seq;      /* written last (release); 0 while being written */
    uintptr_t stream;
    uint32_t kernel, kernel_short; /* interned */
    uint32_t frames[CD_RING_FRAMES];
    uint32_t grid[3], block[3];
    uint32_t shared_mem;
    int32_t thread_id;
    uint16_t ctx;              /* index into the context table */
    uint8_t n_frames;
    uint8_t flags;             /* CD_WATCH_* */
    uint16_t cbid;
    uint32_t op;               /* the thread's current PyTorch op token (watch(ops=True)), 0 none */
} cd_watch_record;

enum { CD_WATCH_MARKED = 1, CD_WATCH_GRAPH = 2, CD_WATCH_USER_LAST = 4 };

/* Completion slots for the contexts that exist now (watch entry, no GIL). */
void cd_watch_prepare(void);
/* Hot path, at a launch's API exit, while watching. */
void cd_watch_launch(const CUpti_CallbackData *cb, CUpti_CallbackId cbid, CUstream s);
uint64_t cd_watch_seq(void);
/* The watch-ring seq of this thread's last launch (to tie a fault to it). */
uint64_t cd_watch_thread_last(void);
/* 1 when the record's completion slot holds its seq, 0 when not, -1 unknown. */
int cd_watch_done(const cd_watch_record *r, uint64_t seq);
/* Copy record `seq` if it is still in the ring; 0 on success. */
int cd_watch_get(uint64_t seq, cd_watch_record *out);
/* Per stream, the first launch after `since` whose marker never came back:
 * out[] sorted by seq; returns the count. */
int cd_watch_incomplete(uint64_t since, uint64_t *out, int max);
int cd_watch_context_device(int ctx_index);
/* watch(ops=True): the op the calling thread is in (a token Python hands out
 * per op call, 0 when none), copied into each watch record. */
extern _Thread_local uint32_t cd_tls_op;

/* ------------------------------------------------ launch_hooks.c --------- */

/* How the callback waits for the launched work. NONE is for measuring the
 * cost of being subscribed alone (it makes no launch synchronous). */
enum cd_wait_mode { CD_WAIT_SYNC = 0, CD_WAIT_SPIN = 1, CD_WAIT_NONE = 2 };

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
 *   wait_mode, capture_on, profile, capture_check: set at
 *                import from the environment (Python validates them).
 *   capture_cache: 0 when CUPTI refused a capture-begin id (ask every launch).
 *   counters     relaxed atomics, statistics only.
 */
typedef struct {
    pthread_mutex_t sub_lock;
    CUpti_SubscriberHandle subscriber;
    atomic_int active;
    atomic_int watching;
    atomic_int all_threads;
    int wait_mode;
    int capture_on;
    int profile;                         /* CUDA_DEBUG_PROFILE=1: time the callback */
    int capture_check;                   /* 0 only to measure: skip cuStreamIsCapturing */
    int capture_cache;

    atomic_uint_fast64_t n_synced;       /* launches waited for */
    atomic_uint_fast64_t n_follower;     /* of which on follower threads */
    atomic_uint_fast64_t ns_capture_check, ns_wait, ns_callback;   /* with profile */
    atomic_uint_fast64_t n_skipped_capture;
    atomic_uint_fast64_t n_subscribes;
    atomic_uint_fast64_t n_refused;      /* launches refused with a sticky error */
    atomic_uint_fast64_t n_watched;      /* launches put in the watch ring */
    atomic_uint_fast64_t n_unmarked;     /* of which without a completion marker */
    atomic_uint_fast64_t n_capture_ids_refused;
    atomic_uint_fast64_t n_hand_overs;   /* CUPTI given to a starting profiler */
    atomic_uint_fast64_t ns_watch;       /* with profile: time in cd_watch_launch */
    atomic_uint_fast64_t ns_marker;      /* with profile: of which in cuStreamWriteValue32 */
    atomic_int watch_alloc_rc;           /* last failed completion-slot allocation */
    atomic_int watch_write_rc;           /* last failed cuStreamWriteValue32 */
} cd_state_t;

extern cd_state_t cd_state;

/* Take CUPTI (first scope or watch in the process) / give it back (last). On
 * failure returns the CUptiResult and fills holder (the other tool's name). */
int cd_cupti_acquire(char *holder, size_t holder_len);
void cd_cupti_release(void);
int cd_cupti_hand_over(void);
/* The launch's stream, and (when d is not NULL) its configuration. */
typedef struct {
    unsigned grid[3], block[3], shared_mem;
} cd_launch_dims;
CUstream cd_launch_stream(CUpti_CallbackId cbid, const void *params, cd_launch_dims *d);

/* ------------------------------------------------------- scopes.c --------- */

/* Scope kinds. */
enum { CD_SCOPE_BLOCK = 1, CD_SCOPE_OPT_OUT = 2, CD_SCOPE_WATCH = 3 };
/* Per-thread: does this thread's innermost open scope block? (+1 block,
 * -1 opted out, 0 none) */
int cd_thread_state(void);
int cd_thread_wants_blocking(void);
/* Open a scope: drain (blocking/watch), take CUPTI, push the thread state.
 * may_drain: 0 while this thread captures a CUDA graph.
 * Returns 0 and a token, or: 1 = the drain found a sticky error (*code),
 * 2 = CUPTI refused (*code = CUptiResult, holder filled). Call without the GIL. */
int cd_scope_open(int kind, int all_threads, int may_drain, uint32_t *token, int *code,
                  char *holder, size_t holder_len);
void cd_scope_close(int kind, int all_threads, uint32_t token);

/* native_ops.c: the at::_ops::<name>::call|redispatch frames of the calling
 * thread's native stack, innermost first (cold: the fault path). */
int cd_native_ops(char ops[][CD_OP_NAME], int max);
void cd_native_ops_warm(void);
/* The operator name of one such symbol into out; 0 if it is not one. */
size_t cd_aten_op_of_symbol(const char *sym, char *out, size_t cap);

/* demangle.c */
PyObject *cd_demangle(const char *mangled);   /* str, or None if not mangled */
/* The short readable name of a mangled or plain kernel name, into out:
 * `void at::native::k<float, ...>(...)` -> `k<float, …>`. Fault path. */
size_t cd_short_kernel_name(const char *name, char *out, size_t cap);

/* fault_kernels.c: the named embedded kernel on `device` (module loaded on
 * first use; the context must be current). */
int cd_fault_kernel(int device, const char *mangled, CUfunction *out);

/* fault_kernels.c, gemm_loops.c, launch_latency.c, bench_buffers.c: Python-facing functions */
PyObject *cd_py_fault_launch(PyObject *self, PyObject *args, PyObject *kw);
PyObject *cd_py_gemm(PyObject *self, PyObject *args, PyObject *kw);
PyObject *cd_py_launch_latency(PyObject *self, PyObject *args, PyObject *kw);
PyObject *cd_py_gemm_types(PyObject *self, PyObject *unused);
PyObject *cd_py_bench_release(PyObject *self, PyObject *arg);
PyObject *cd_py_mem_info(PyObject *self, PyObject *arg);

#endif
