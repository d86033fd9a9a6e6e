/*
 * launch_hooks.c: the CUPTI callback that makes launches synchronous inside
 * launch_blocking() scopes. This is the hot path: every kernel launch in the
 * process passes through on_launch() while any scope is open.
 *
 * At API exit of a launch (cuLaunchKernel, cuLaunchKernelEx, cooperative,
 * cuGraphLaunch, and their _ptsz twins) on a thread that wants blocking:
 *   - the launch already failed (bad configuration): record it, done;
 *   - the stream is being captured into a graph: do nothing (a sync would
 *     invalidate the capture);
 *   - else wait for the stream; if the wait returns an error, record the fault
 *     and write the error into the launch's own return value, so the launcher
 *     (PyTorch, CuPy, Triton, cuBLAS...) fails at the launching call.
 * No allocation, no lock, no GIL on the path without a fault.
 */
#define _GNU_SOURCE
#include "cuda_debug.h"

/* cupti.h brings generated_cuda_meta.h: the launch parameter structs. */
#include <string.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

cd_state_t cd_state = {
    .sub_lock = PTHREAD_MUTEX_INITIALIZER,
    .fault_lock = PTHREAD_MUTEX_INITIALIZER,
};

/* Per-thread scope state: +1 block, -1 opted out, 0 inherit (not in a scope). */
static _Thread_local signed char tls_state;
/* Per-thread kind, computed once: 0 unknown, 1 plain, 2 follower. A follower
 * is a framework worker that launches on behalf of a scoped thread: PyTorch's
 * autograd device threads ("pt_autograd_N") run backward kernels, so
 * loss.backward() inside a scope must block there too. */
static _Thread_local signed char tls_kind;

static const CUpti_CallbackId launch_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
    CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch,
    CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz,
};
#define N_LAUNCH_CBIDS (sizeof launch_cbids / sizeof launch_cbids[0])

/* Calls that can make a stream start capturing: beginning a capture, or
 * waiting on an event (a stream joins a capture by waiting on an event
 * recorded in a capturing stream). Each bumps capture_gen. */
static const CUpti_CallbackId capture_cbids[] = {
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph,
    CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz,
    CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent,
    CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent_ptsz,
};
#define N_CAPTURE_CBIDS (sizeof capture_cbids / sizeof capture_cbids[0])

/* Capture-status cache. Asking the driver whether a stream is capturing
 * costs an API call per launch; instead each thread remembers the last
 * stream it found NOT capturing, and the generation at which it looked.
 * capture_gen moves on every call that can start a capture (above) and on
 * every subscribe (captures begun while we were not subscribed are unknown),
 * which sends every thread back to the driver once. A capturing stream is
 * never cached, so launches on it are always checked. The generation moves at
 * the API's exit: a launch by *another* thread on the very stream whose capture
 * is starting, during that call, could still be synchronised (the capture would
 * then fail with 900); launching on a stream while another thread begins to
 * capture it is already a race in the program. */
static atomic_uint_fast64_t capture_gen = 1;
static _Thread_local CUstream tls_clear_stream;
static _Thread_local uint64_t tls_clear_gen;

int cd_thread_state_get(void) { return tls_state; }

int cd_thread_state_set(int state)
{
    int prev = tls_state;
    tls_state = (signed char)(state > 0 ? 1 : state < 0 ? -1 : 0);
    return prev;
}

static int classify_thread(void)
{
    char name[17] = {0};
    if (prctl(PR_GET_NAME, name, 0, 0, 0) == 0 && strncmp(name, "pt_autograd", 11) == 0)
        return 2;
    return 1;
}

static inline int thread_wants_blocking(void)
{
    int s = tls_state;
    if (s)
        return s > 0;
    if (atomic_load_explicit(&cd_state.all_threads, memory_order_relaxed))
        return 1;
    if (!atomic_load_explicit(&cd_state.active, memory_order_relaxed))
        return 0;
    if (!tls_kind)
        tls_kind = (signed char)classify_thread();
    return tls_kind == 2;
}

static inline int is_ptsz(CUpti_CallbackId cbid)
{
    return cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz;
}

/* The three launch-parameter structs name their dimensions alike. */
#define COPY_LAUNCH_DIMS(f, p)                                                          \
    do {                                                                                \
        if (f) {                                                                        \
            (f)->grid[0] = (p)->gridDimX, (f)->grid[1] = (p)->gridDimY;                 \
            (f)->grid[2] = (p)->gridDimZ;                                               \
            (f)->block[0] = (p)->blockDimX, (f)->block[1] = (p)->blockDimY;             \
            (f)->block[2] = (p)->blockDimZ;                                             \
            (f)->shared_mem = (p)->sharedMemBytes;                                      \
        }                                                                               \
    } while (0)

/* The launch's stream, and (when wanted) its configuration. */
static CUstream launch_stream(CUpti_CallbackId cbid, const void *params, cd_fault *f)
{
    CUstream s = NULL;
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: {
        const cuLaunchKernel_params *p = params;
        s = p->hStream;
        COPY_LAUNCH_DIMS(f, p);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: {
        const cuLaunchCooperativeKernel_params *p = params;
        s = p->hStream;
        COPY_LAUNCH_DIMS(f, p);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
        const CUlaunchConfig *c = ((const cuLaunchKernelEx_params *)params)->config;
        if (c) {
            s = c->hStream;
            COPY_LAUNCH_DIMS(f, c);
        }
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz: {
        const cuGraphLaunch_params *p = params;
        s = p->hStream;
        break;
    }
    default:
        break;
    }
    if (!s && is_ptsz(cbid))
        s = CU_STREAM_PER_THREAD;
    return s;
}

static inline uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline CUresult wait_stream(CUstream s)
{
    if (cd_state.wait_mode == CD_WAIT_NONE)
        return CUDA_SUCCESS;
    if (cd_state.wait_mode == CD_WAIT_SPIN) {
        CUresult rc;
        while ((rc = cd_drv.cuStreamQuery(s)) == CUDA_ERROR_NOT_READY)
            __builtin_ia32_pause();
        return rc;
    }
    return cd_drv.cuStreamSynchronize(s);
}

/* The fault path: cold, may take a lock and copy strings. */
static __attribute__((noinline, cold)) void
record_fault(const CUpti_CallbackData *cb, CUpti_CallbackId cbid, CUresult code,
             int at_launch, const char *message, size_t message_len)
{
    cd_fault f;
    memset(&f, 0, sizeof f);
    f.code = (int)code;
    f.at_launch = at_launch;
    f.cbid = (int)cbid;
    f.device = -1;
    f.stream = (uintptr_t)launch_stream(cbid, cb->functionParams, &f);
    if (cb->symbolName)
        snprintf(f.kernel, sizeof f.kernel, "%s", cb->symbolName);
    if (cb->context && cd_cupti.cuptiGetDeviceId) {
        uint32_t dev;
        if (cd_cupti.cuptiGetDeviceId(cb->context, &dev) == CUPTI_SUCCESS)
            f.device = (int)dev;
    }
    f.thread_id = (long)syscall(SYS_gettid);
    prctl(PR_GET_NAME, f.thread_name, 0, 0, 0);
    f.thread_name[sizeof f.thread_name - 1] = '\0';
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    f.wall_time = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    if (message_len > sizeof f.device_message)
        message_len = sizeof f.device_message;
    memcpy(f.device_message, message, message_len);
    f.device_message_len = message_len;
    f.log_end = cd_driver_log_count();
    cd_fault_record(&f);
}

static void CUPTIAPI on_launch(void *userdata, CUpti_CallbackDomain domain,
                               CUpti_CallbackId cbid, const void *data)
{
    (void)userdata;
    (void)domain;
    const CUpti_CallbackData *cb = data;
    if (cb->callbackSite != CUPTI_API_EXIT)
        return;
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent_ptsz:
        atomic_fetch_add_explicit(&capture_gen, 1, memory_order_relaxed);
        return;
    default:
        break;
    }
    if (!thread_wants_blocking())
        return;

    CUresult *ret = (CUresult *)cb->functionReturnValue;
    if (*ret != CUDA_SUCCESS) {            /* the launch itself was refused */
        record_fault(cb, cbid, *ret, 1, "", 0);
        return;
    }
    const int profile = cd_state.profile;
    uint64_t t0 = profile ? now_ns() : 0, t1 = 0, t2 = 0;
    CUstream s = launch_stream(cbid, cb->functionParams, NULL);
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult rc = CUDA_SUCCESS;
    uint64_t gen = atomic_load_explicit(&capture_gen, memory_order_relaxed);
    if (cd_state.capture_check && (s != tls_clear_stream || gen != tls_clear_gen)) {
        rc = cd_drv.cuStreamIsCapturing(s, &cap);
        if (rc == CUDA_SUCCESS && cap == CU_STREAM_CAPTURE_STATUS_NONE) {
            tls_clear_stream = s;
            tls_clear_gen = gen;
        }
    }
    if (rc == CUDA_SUCCESS && cap != CU_STREAM_CAPTURE_STATUS_NONE) {
        atomic_fetch_add_explicit(&cd_state.n_skipped_capture, 1, memory_order_relaxed);
        return;
    }
    if (rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT || rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        return;   /* the legacy stream while another stream captures in global mode */

    char msg[8192];
    size_t len = 0;
    if (rc == CUDA_SUCCESS) {
        if (profile)
            t1 = now_ns();
        if (cd_state.capture_mode)
            cd_capture_begin();
        rc = wait_stream(s);
        if (cd_state.capture_mode)
            cd_capture_end(rc != CUDA_SUCCESS, msg, sizeof msg, &len);
        if (profile)
            t2 = now_ns();
        atomic_fetch_add_explicit(&cd_state.n_synced, 1, memory_order_relaxed);
        if (tls_kind == 2)
            atomic_fetch_add_explicit(&cd_state.n_follower, 1, memory_order_relaxed);
    }
    if (rc != CUDA_SUCCESS) {              /* the kernel faulted (or the query did) */
        record_fault(cb, cbid, rc, 0, msg, len);
        *ret = rc;
    }
    if (profile && t2) {
        uint64_t t3 = now_ns();
        atomic_fetch_add_explicit(&cd_state.ns_capture_check, t1 - t0, memory_order_relaxed);
        atomic_fetch_add_explicit(&cd_state.ns_wait, t2 - t1, memory_order_relaxed);
        atomic_fetch_add_explicit(&cd_state.ns_callback, t3 - t0, memory_order_relaxed);
    }
}

static int enable_callbacks(CUpti_SubscriberHandle sub, const CUpti_CallbackId *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = CUPTI_CHECK(cd_cupti.cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API,
                                                          ids[i]));
        if (rc)
            return rc;
    }
    return 0;
}

int cd_scope_acquire(int all_threads, char *holder, size_t holder_len)
{
    int rc = 0;
    if (holder_len)
        holder[0] = '\0';
    pthread_mutex_lock(&cd_state.sub_lock);
    if (atomic_load(&cd_state.active) == 0) {
        CUpti_SubscriberHandle sub = NULL;
        if (cd_cupti.cuptiSubscribe_v2) {
            CUpti_SubscriberParams p;
            memset(&p, 0, sizeof p);
            p.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
            p.subscriberName = "cuda_debug";
            p.oldSubscriberName = holder;
            p.oldSubscriberSize = holder_len;
            rc = CUPTI_CHECK(cd_cupti.cuptiSubscribe_v2(&sub, on_launch, NULL, &p));
        } else {
            rc = CUPTI_CHECK(cd_cupti.cuptiSubscribe(&sub, on_launch, NULL));
        }
        if (rc == 0 && ((rc = enable_callbacks(sub, launch_cbids, N_LAUNCH_CBIDS)) != 0 ||
                        (rc = enable_callbacks(sub, capture_cbids, N_CAPTURE_CBIDS)) != 0))
            cd_cupti.cuptiUnsubscribe(sub);
        if (rc) {
            pthread_mutex_unlock(&cd_state.sub_lock);
            return rc;
        }
        cd_state.subscriber = sub;
        atomic_fetch_add(&capture_gen, 1);
        atomic_fetch_add(&cd_state.n_subscribes, 1);
    }
    atomic_fetch_add(&cd_state.active, 1);
    if (all_threads)
        atomic_fetch_add(&cd_state.all_threads, 1);
    pthread_mutex_unlock(&cd_state.sub_lock);
    return 0;
}

void cd_scope_release(int all_threads)
{
    pthread_mutex_lock(&cd_state.sub_lock);
    if (all_threads && atomic_load(&cd_state.all_threads) > 0)
        atomic_fetch_sub(&cd_state.all_threads, 1);
    if (atomic_load(&cd_state.active) > 0 && atomic_fetch_sub(&cd_state.active, 1) == 1) {
        CUPTI_CHECK(cd_cupti.cuptiUnsubscribe(cd_state.subscriber));
        cd_state.subscriber = NULL;
        if (cd_state.capture_mode)
            cd_capture_end(0, NULL, 0, NULL);   /* flush anything held back */
    }
    pthread_mutex_unlock(&cd_state.sub_lock);
}
