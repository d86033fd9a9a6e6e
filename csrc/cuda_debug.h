/*
 * cuda_debug internal header: the one place that names the process-wide state
 * and the run-time-loaded CUDA entry points.
 *
 * Layout of the C core (one concern per file):
 *   module.c        method table and PEP 489 init only
 *   loader.c        dlopen/dlsym of libcuda, CUPTI, cuBLAS; "where did it come from"
 *   launch_hooks.c  the CUPTI launch callback (the hot path) and scope bookkeeping
 *   fault_capture.c the fault record, device-assert text capture, driver error log
 *   demangle.c      C++ symbol demangling through the already-loaded libstdc++
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

#define CD_STR2(x) #x
#define CD_STR(x) CD_STR2(x)

/* ---------------------------------------------------------------- loader -- */

/* Driver entry points. cuda.h maps some names to versioned symbols through
 * macros (cuMemAlloc -> cuMemAlloc_v2): CD_STR(name) expands the macro first,
 * so dlsym looks up the real exported symbol. */
#define CD_DRIVER_REQUIRED(X)                                                   \
    X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString)      \
    X(cuDeviceGetCount) X(cuDeviceGet) X(cuDeviceGetName)                      \
    X(cuDeviceGetAttribute) X(cuDeviceTotalMem)                                \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                   \
    X(cuDevicePrimaryCtxGetState)                                              \
    X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuCtxPushCurrent)                  \
    X(cuCtxPopCurrent) X(cuCtxGetDevice) X(cuCtxSynchronize)                   \
    X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                \
    X(cuStreamQuery) X(cuStreamIsCapturing)                                    \
    X(cuModuleLoadData) X(cuModuleUnload) X(cuModuleGetFunction)               \
    X(cuLaunchKernel) X(cuMemAlloc) X(cuMemFree) X(cuMemGetInfo)               \
    X(cuMemcpyHtoD) X(cuMemcpyDtoH) X(cuMemsetD8) X(cuMemsetD32Async)          \
    X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)                        \
    X(cuEventSynchronize) X(cuEventElapsedTime)

/* Entry points that older drivers lack: NULL when absent. */
#define CD_DRIVER_OPTIONAL(X) X(cuLogsRegisterCallback)

#define CD_CUPTI_FUNCS(X)                                                       \
    X(cuptiSubscribe) X(cuptiUnsubscribe) X(cuptiEnableCallback)               \
    X(cuptiGetResultString) X(cuptiGetVersion)

#define CD_CUPTI_OPTIONAL(X) X(cuptiSubscribe_v2) X(cuptiGetDeviceId)

#define CD_DECLARE_PTR(name) __typeof__(name) *name;

typedef struct {
    CD_DRIVER_REQUIRED(CD_DECLARE_PTR)
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
int cd_device_context(int ordinal, CUcontext *ctx);

/* ----------------------------------------------------- scopes and faults -- */

/* A fault seen by the launch callback. Written only on the fault path, under
 * cd_state.fault_lock; read by Python under the same lock. */
typedef struct {
    uint64_t seq;              /* 1, 2, ...; 0 = nothing recorded */
    int code;                  /* CUresult */
    int at_launch;             /* 1: the launch call itself failed; 0: the sync found it */
    int cbid;                  /* CUPTI driver callback id of the launch */
    char kernel[1024];         /* mangled symbol name, "" for graph launches */
    unsigned grid[3], block[3];
    unsigned shared_mem;
    uintptr_t stream;
    int device;                /* ordinal, -1 unknown */
    long thread_id;            /* gettid() of the launching thread */
    char thread_name[16];
    double wall_time;          /* CLOCK_REALTIME seconds */
    char device_message[8192]; /* text the driver printed during the sync */
    size_t device_message_len;
    uint64_t log_end;          /* driver-log lines [.., log_end) precede this fault */
} cd_fault;

/* How the callback waits for the launched work. NONE is for measuring the
 * cost of being subscribed alone (it makes no launch synchronous). */
enum cd_wait_mode { CD_WAIT_SYNC = 0, CD_WAIT_SPIN = 1, CD_WAIT_NONE = 2 };
/* How the device's assert text is captured around the wait. */
enum cd_capture_mode { CD_CAPTURE_OFF = 0, CD_CAPTURE_STDIO = 1, CD_CAPTURE_FD = 2 };

/*
 * Process-wide state of the launch hooks. One struct, one place.
 *   sub_lock     protects subscriber, active, all_threads (writes) and the
 *                subscribe/unsubscribe transitions; taken only on scope entry/exit.
 *   active       number of enabled scopes open in the process; read lock-free by
 *                the callback (relaxed): nonzero means follower threads block.
 *   all_threads  number of open scopes that asked for every thread; read lock-free.
 *   wait_mode, capture_mode: set once at import from the environment.
 *   fault_lock   protects fault and reported_seq (fault path and Python only).
 *   counters     relaxed atomics, statistics only.
 */
typedef struct {
    pthread_mutex_t sub_lock;
    CUpti_SubscriberHandle subscriber;
    atomic_int active;
    atomic_int all_threads;
    int wait_mode;
    int capture_mode;

    pthread_mutex_t fault_lock;
    cd_fault fault;
    atomic_uint_fast64_t fault_seq;

    int profile;                         /* CUDA_DEBUG_PROFILE=1: time the callback */
    int capture_check;                   /* 0 only to measure: skip cuStreamIsCapturing */

    atomic_uint_fast64_t n_synced;       /* launches waited for */
    atomic_uint_fast64_t n_follower;     /* of which on follower threads */
    atomic_uint_fast64_t ns_capture_check, ns_wait, ns_callback;   /* with profile */
    atomic_uint_fast64_t n_skipped_capture;
    atomic_uint_fast64_t n_subscribes;
} cd_state_t;

extern cd_state_t cd_state;

/* launch_hooks.c */
int cd_hooks_init(void);
/* Per-thread scope state: +1 block, -1 opted out, 0 inherit. */
int cd_thread_state_get(void);
int cd_thread_state_set(int state);
/* Take CUPTI (first scope in the process) / give it back (last scope). On
 * failure returns the CUptiResult and fills holder (the other tool's name). */
int cd_scope_acquire(int all_threads, char *holder, size_t holder_len);
void cd_scope_release(int all_threads);

/* fault_capture.c */
void cd_capture_init(void);
void cd_capture_begin(void);               /* around the wait: hot path */
void cd_capture_end(int failed, char *out, size_t cap, size_t *len);
void cd_fault_record(const cd_fault *f);   /* copies, assigns seq */
void cd_driver_log_init(void);
uint64_t cd_driver_log_count(void);
PyObject *cd_driver_log_lines(uint64_t from, uint64_t to);   /* list[bytes] */

/* demangle.c */
PyObject *cd_demangle(const char *mangled);   /* str, or None if not mangled */

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
