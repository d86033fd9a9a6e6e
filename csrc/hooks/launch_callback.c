/*
 * hooks/launch_callback.c: the launch pipeline, the hot path of every kernel
 * launch in the process while a launch_blocking() scope or a watch() is open,
 * and CUPTI's callback, one of its two sources.
 *
 * A launch (base.h's cd_launch) comes from CUPTI's callback at the API exit
 * of a launch entry point (cuLaunchKernel, cuLaunchKernelEx, cooperative,
 * cuGraphLaunch, and their _ptsz twins; cupti_ids.h), or from the launch
 * hooks (hooks/runtime_launch.c) after the runtime's launch returned. Both
 * call cd_launch_entering before the launch (a marker bracketing a kernel
 * that gets its own) and cd_launch_exited after it, which reads in order:
 *   - neither watching nor blocking this thread: return (two relaxed loads);
 *   - the launch was refused: record it if this thread blocks (a sticky code
 *     means an earlier kernel killed the context); while watching, a sticky
 *     refusal is the moment to write the culprit report;
 *   - the stream is being captured into a graph: no wait (a sync would
 *     break the capture); while watching, a graph node record and a marker
 *     captured behind the kernel (capture/graph_capture.c);
 *   - record, then mark, while watching: a ring record and, where one is due,
 *     a completion marker (capture/watch_ring.c);
 *   - check, if this thread blocks: wait for the stream, the thread's stderr
 *     window open; if the wait fails, record the fault, write the report to
 *     fd 2, and write the error into the launch's own return value, so the
 *     launcher (PyTorch, CuPy, Triton, cuBLAS...) fails at the launching call.
 * No allocation, no lock, no GIL on the path without a fault. The capture
 * APIs (begin, end), the host's waits and CUPTI's resource events (a context
 * destroyed, graph executables) take cold paths of their own, off the launch
 * path.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "hooks/hooks.h"

#include <string.h>     /* memcpy */
#include <sched.h>       /* sched_yield */
#include <time.h>        /* timespec, nanosleep */

/* Capture-status cache. Asking the driver whether a stream is capturing
 * costs an API call per launch; instead each thread remembers the last
 * stream it found NOT capturing, and the generation at which it looked.
 * cd_gates.capture_gen moves on every call that can start a capture (CD_CAPTURE_CBIDS)
 * and on every subscribe (captures begun while we were not subscribed are
 * unknown), which sends every thread back to the driver once. A capturing
 * stream is never cached. The generation moves at the API's exit: a launch by
 * *another* thread on the very stream whose capture is starting, during that
 * call, could still be synchronised (the capture then fails with 900);
 * launching on a stream while another thread begins to capture it is already
 * a race in the program. */
static _Thread_local CUstream tls_clear_stream;
static _Thread_local uint64_t tls_clear_gen;
/* Inside a runtime launch that the launch hooks' record mode makes (they
 * record it themselves, after it returns): CUPTI's callback leaves it. */
static _Thread_local int tls_hook_records;

/* The pipeline's counters (hooks.h). */
static struct {
    CD_LAUNCH_COUNTS(CD_COUNTER_ATOMIC)
} counts;

void cd_launch_stats(cd_launch_counts *out)
{
    CD_LAUNCH_COUNTS(CD_COUNTER_READ)
}

void cd_launch_recorded_by_hook(int on) { tls_hook_records = on; }

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#else
    sched_yield();
#endif
}

static inline CUresult wait_stream(CUstream s)
{
    if (cd_config.wait_mode == CD_WAIT_NONE)
        return CUDA_SUCCESS;
    if (cd_config.wait_mode == CD_WAIT_SPIN) {
        CUresult rc;
        while ((rc = cd_drv.cuStreamQuery(s)) == CUDA_ERROR_NOT_READY)
            cpu_relax();
        return rc;
    }
    return cd_drv.cuStreamSynchronize(s);
}

/* 1: its stream is capturing (or it is the legacy stream while another
 * stream captures in global mode): no wait, no ring record. */
static inline int capturing(CUstream s)
{
    uint64_t gen = atomic_load_explicit(&cd_gates.capture_gen, memory_order_relaxed);
    if (!cd_config.capture_check ||
        (atomic_load_explicit(&cd_gates.capture_cache, memory_order_relaxed) &&
         s == tls_clear_stream && gen == tls_clear_gen))
        return 0;
    CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
    CUresult rc = cd_drv.cuStreamIsCapturing(s, &cap);
    if (rc == CUDA_SUCCESS && cap == CU_STREAM_CAPTURE_STATUS_NONE) {
        tls_clear_stream = s;
        tls_clear_gen = gen;
        return 0;
    }
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT ||
        rc == CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
        return 1;
    return 0;   /* the query failed otherwise (dead context): the wait will say */
}

/* Up to 5 ms for another thread's wait, in this context, whose kernel the
 * assert text belongs to (CD_ASSERT_FITS or NAMES) to be recorded: 1 if it was. */
static int cause_recorded_elsewhere(uint32_t context_uid)
{
    for (int i = 0; i < 50 && cd_fault_context_level(context_uid) < CD_ASSERT_FITS; i++) {
        struct timespec ts = {0, 100000};
        nanosleep(&ts, NULL);
    }
    return cd_fault_context_level(context_uid) >= CD_ASSERT_FITS;
}

/* The fault path: cold.
 *
 * Which kernel faulted: the one the device's assert text belongs to
 * (cd_tee_asserts_since: named by it, or, for a line naming no kernel -- a
 * lambda's "operator()", Triton's "unknown" -- one whose name fits it). A wait
 * whose own kernel the text does not belong to (it names another function, or
 * names none and this kernel does not fit it) may have met another thread's
 * fault in the same context: when that thread's record comes (up to 5 ms),
 * this one is a consequence, without the other's text; else the text is this
 * kernel's after all (an assert in a __device__ helper names the helper). */
static __attribute__((noinline, cold)) void
fault_found(const cd_launch *l, CUresult code, int at_launch, const cd_window *w,
            uint64_t assert_mark)
{
    cd_fault f;
    cd_fault_fill(&f, l);
    f.code = (int)code;
    f.at_launch = at_launch;
    int asserts = 0;
    if (w && w->len) {                 /* printed by this thread, in its own wait */
        memcpy(f.device_message, w->buf, w->len);
        f.device_message_len = w->len;
        f.device_message_cut = w->cut;
        f.assert_level = cd_tee_text_level(w->buf, w->len, f.kernel, &asserts);
    } else if (w && cd_is_sticky((int)code)) {
        /* The driver printed the assert from another thread: take the lines
         * written since the wait began that belong best to this kernel (for
         * an assert, give that thread up to 2 ms to print them). */
        for (int i = 0; code == CUDA_ERROR_ASSERT && i < 20 &&
                        cd_tee_assert_mark() == assert_mark; i++) {
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
        f.device_message_len = cd_tee_asserts_since(assert_mark, f.kernel, f.device_message,
                                                    sizeof f.device_message,
                                                    &f.device_message_cut, &f.assert_level);
        if (!f.device_message_len)     /* none belongs to it: every line since */
            f.device_message_len = cd_tee_asserts_since(assert_mark, NULL, f.device_message,
                                                        sizeof f.device_message,
                                                        &f.device_message_cut, NULL);
        asserts = f.device_message_len > 0;
    }
    if (code == CUDA_ERROR_ASSERT && asserts && f.assert_level < CD_ASSERT_FITS &&
        cause_recorded_elsewhere(f.context_uid)) {
        f.consequence = 1;             /* it met another thread's fault */
        f.device_message_len = 0;
        f.device_message_cut = 0;
    }
    cd_fault_record(&f);
    cd_report_fault(&f);           /* before the op walk: written whatever happens next */
    if (cd_fault_add_ops(&f))
        cd_report_fault_ops(&f);
}

static __attribute__((noinline, cold)) void
launch_refused(const cd_launch *l, CUresult code, int block, int watching)
{
    if (cd_is_sticky((int)code)) {
        atomic_fetch_add_explicit(&counts.refused, 1, memory_order_relaxed);
        if (watching)
            cd_report_watch_culprit((int)code, "a launch refused by the dead context", 0);
    }
    if (block)
        fault_found(l, code, 1, NULL, 0);
}

static __attribute__((noinline)) void
wait_and_check(const cd_launch *l)
{
    const int profile = cd_config.profile;
    uint64_t t1 = profile ? cd_clock_ns() : 0;
    char msg[CD_DEVICE_MESSAGE];
    cd_window w = {0};
    uint64_t assert_mark = 0;
    if (cd_config.tee_stderr) {
        assert_mark = cd_tee_assert_mark();
        cd_tee_open(&w, msg, sizeof msg);
    }
    CUresult rc = wait_stream(l->stream);
    if (cd_config.tee_stderr)
        cd_tee_close();
    atomic_fetch_add_explicit(&counts.synced, 1, memory_order_relaxed);
    if (rc != CUDA_SUCCESS) {              /* the kernel faulted (or the query did) */
        fault_found(l, rc, 0, cd_config.tee_stderr ? &w : NULL, assert_mark);
        *l->ret = rc;                      /* the launcher fails at the launching call */
    }
    if (profile) {
        uint64_t t2 = cd_clock_ns();
        atomic_fetch_add_explicit(&counts.ns_wait, t2 - t1, memory_order_relaxed);
    }
}


/* The capture APIs, at enter and exit (cold): a capture beginning while
 * watching is tracked, its end closes it (capture/graph_capture.c). Every
 * one of these calls takes the capturing stream first in its params. */
static __attribute__((noinline, cold)) void
capture_api(const CUpti_CallbackData *cb, CUpti_CallbackId cbid, int at_exit)
{
    int ptsz = 0, begin = 0;
    switch (cbid) {
#define CD_BEGIN_CASE(id, p) case id: begin = 1; ptsz = p; break;
#define CD_END_CASE(id, p) case id: ptsz = p; break;
        CD_BEGIN_CAPTURE_CBIDS(CD_BEGIN_CASE)
        CD_GRAPH_CBIDS(CD_END_CASE)
#undef CD_BEGIN_CASE
#undef CD_END_CASE
    default:
        return;                    /* cuStreamWaitEvent: the generation only */
    }
    CUstream s = *(CUstream const *)cb->functionParams;
    if (ptsz && !s)
        s = CU_STREAM_PER_THREAD;
    const int ok = !at_exit || *(const CUresult *)cb->functionReturnValue == CUDA_SUCCESS;
    if (begin) {
        if (!atomic_load_explicit(&cd_gates.watching, memory_order_relaxed) ||
            !cd_config.graph_markers)
            return;
        if (!at_exit)
            cd_graph_capture_beginning(cb);
        else if (ok)
            cd_graph_capture_begun(cb, s);
    } else if (!at_exit) {
        cd_graph_capture_ending(cb, s);     /* whether watching or not: a tracked capture */
    } else {
        CUgraph *out = ((const cuStreamEndCapture_params *)cb->functionParams)->phGraph;
        cd_graph_capture_ended(cb, ok && out ? *out : NULL);
    }
}

/* CUPTI's resource domain (cold, never on the launch path). */
static __attribute__((noinline, cold)) void resource_event(CUpti_CallbackId cbid,
                                                           const CUpti_ResourceData *rd)
{
    const CUpti_GraphData *g = rd->resourceDescriptor;
    switch (cbid) {
    case CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING:
        cd_watch_context_destroyed(rd->context);
        break;
    case CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED:
        if (g)
            cd_graph_exec_created(g->graph, g->graphExec);
        break;
    case CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING:
        if (g)
            cd_graph_exec_destroyed(g->graphExec);
        break;
    case CUPTI_CBID_RESOURCE_GRAPH_DESTROY_STARTING:
        if (g)
            cd_graph_destroyed(g->graph);
        break;
    case CUPTI_CBID_RESOURCE_GRAPH_CLONED:
        if (g)
            cd_graph_cloned(g->originalGraph, g->graph);
        break;
    case CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING:
        cd_intern_kernels_unloaded();
        break;
    default:
        break;
    }
}

/* At the entry of a call in which the host waits (CD_WAIT_CBIDS), while
 * watching with sparse markers: a marker behind the newest launch of the
 * stream it waits for (of every stream of its context, for a context
 * synchronisation, an event's, or a synchronous copy), so that what the host
 * waits on is bracketed: a hang there, or the fault the wait finds, lies
 * among the launches since the stream's last returned marker. Cold: these
 * calls block anyway. */
static __attribute__((noinline, cold)) void host_waits(const CUpti_CallbackData *cb,
                                                        CUpti_CallbackId cbid)
{
    CUstream s;
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize:
    case CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz:
        s = ((const cuStreamSynchronize_params *)cb->functionParams)->hStream;
        if (!s && cbid == CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz)
            s = CU_STREAM_PER_THREAD;
        if (s)                     /* the legacy stream waits for every blocking stream */
            cd_watch_close(cb->contextUid, 0, (uintptr_t)s, 0);
        else
            cd_watch_close(cb->contextUid, 1, 0, 1);
        return;
    default:
        cd_watch_close(cb->contextUid, 1, 0, 1);
        return;
    }
}

static inline int sparse_markers(void)
{
    return atomic_load_explicit(&cd_gates.watching, memory_order_relaxed) &&
           atomic_load_explicit(&cd_gates.watch_every, memory_order_relaxed) > 1;
}

/* A kernel that gets a marker of its own with sparse markers: an NCCL
 * kernel; a USER kernel (its source's origin, else its name's). */
static inline int bracketed(const char *symbol, int origin)
{
    return cd_nccl_kernel(symbol) ||
           (origin ? origin : cd_kernel_origin(symbol)) == CD_ORIGIN_USER;
}

/* ------------------------------------------------------- the pipeline -- */

/* Before the launch (CUPTI's API entry; the launch hooks, before they
 * launch), while watching with sparse markers: a bracketed kernel gets a
 * marker behind its stream's newest launch first (cd_watch_mark puts one
 * behind it), so that a rank stuck in a collective, a user's kernel that
 * faults or hangs, is named exactly. Not while the stream captures. */
void cd_launch_entering(const cd_launch *l)
{
    if (!sparse_markers() || !bracketed(l->symbol, l->origin))
        return;
    CUstream s = cd_launch_stream(l->cbid, l->params, NULL);
    if (!capturing(s))
        cd_watch_close(l->context_uid, 0, (uintptr_t)s, 0);
}

/* The launch, from either source, at its API exit; what each launch costs,
 * in order:
 *   gate     neither watching nor blocking this thread: return (two loads);
 *   refused  the driver refused it: cold (launch_refused);
 *   capture  its stream captures: a graph node (capture/graph_capture.c), no wait;
 *   record   its record in the watch ring (capture/watch_ring.c);
 *   mark     a completion marker behind it where one is due; the record published;
 *   check    this thread blocks: wait for the stream; only a failed wait goes
 *            on (cold, fault_found) to the fault's record and its report. */
void cd_launch_exited(cd_launch *l)
{
    const int watching = atomic_load_explicit(&cd_gates.watching, memory_order_relaxed);
    const int block = cd_thread_wants_blocking();
    if (!watching && !block) {
        if (cd_cupti_detach_asked())
            cd_cupti_detach_now();     /* the last scope closed: CUPTI leaves the process */
        return;
    }
    if (*l->ret != CUDA_SUCCESS) {
        cd_gate_in_callback(1);        /* cold: counted (subscription.c) */
        launch_refused(l, *l->ret, block, watching);
        cd_gate_in_callback(-1);
        return;
    }
    const int profile = cd_config.profile;
    uint64_t t0 = profile ? cd_clock_ns() : 0;
    l->stream = cd_launch_stream(l->cbid, l->params, NULL);
    if (capturing(l->stream)) {
        if (!(watching && cd_config.graph_markers && cd_graph_launch_captured(l)))
            atomic_fetch_add_explicit(&counts.skipped_capture, 1, memory_order_relaxed);
        return;
    }
    if (profile)
        atomic_fetch_add_explicit(&counts.ns_capture_check, cd_clock_ns() - t0,
                                  memory_order_relaxed);
    cd_watch_pending rec;
    if (watching) {
        uint64_t tw = profile ? cd_clock_ns() : 0;
        if (cd_watch_record_launch(l, &rec))       /* record */
            cd_watch_mark(l, &rec);                /* mark */
        if (profile)
            atomic_fetch_add_explicit(&counts.ns_watch, cd_clock_ns() - tw, memory_order_relaxed);
    }
    /* NCCL's kernels are not waited for inside a scope: a collective completes
     * only when every rank (or, with several GPUs per process, every GPU's
     * launch of the group) has joined, and a wait after the first launch of a
     * group would never return. The next launch on the stream waits for it. */
    if (block && !cd_nccl_kernel(l->symbol)) {                 /* check */
        if (cd_thread_state() <= 0)
            atomic_fetch_add_explicit(&counts.follower, 1, memory_order_relaxed);
        /* A wait can last (a long kernel): counted, so that CUPTI is not given
         * to a profiler, which finalizes it at its end, while we are inside. */
        cd_gate_in_callback(1);
        wait_and_check(l);
        cd_gate_in_callback(-1);
    }
    if (profile)
        atomic_fetch_add_explicit(&counts.ns_callback, cd_clock_ns() - t0, memory_order_relaxed);
}

/* CUPTI's callback data of a launch entry point, as the pipeline reads it. */
static inline cd_launch launch_of(const CUpti_CallbackData *cb, CUpti_CallbackId cbid)
{
    cd_launch l = {cbid, cb->functionParams, (CUresult *)cb->functionReturnValue, cb->symbolName,
                   cb->context, cb->contextUid, CD_ORIGIN_UNKNOWN, NULL};
    return l;
}

#define CD_CAPTURE_CASE(id, ptsz) case id:
void CUPTIAPI cd_on_launch(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                           const void *data)
{
    (void)userdata;
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API) {
        resource_event(cbid, data);
        return;
    }
    const CUpti_CallbackData *cb = data;
    if (cb->callbackSite != CUPTI_API_EXIT) {
        switch (cbid) {
            CD_BEGIN_CAPTURE_CBIDS(CD_CAPTURE_CASE)
            CD_GRAPH_CBIDS(CD_CAPTURE_CASE)
            capture_api(cb, cbid, 0);
            break;
            CD_WAIT_CBIDS(CD_CAPTURE_CASE)
            if (sparse_markers())
                host_waits(cb, cbid);
            break;
        default:
            if (sparse_markers() && bracketed(cb->symbolName, CD_ORIGIN_UNKNOWN)) {
                cd_launch l = launch_of(cb, cbid);
                cd_launch_entering(&l);
            }
            break;
        }
        return;
    }
    switch (cbid) {
        CD_WAIT_CBIDS(CD_CAPTURE_CASE)
        return;
        CD_CAPTURE_CBIDS(CD_CAPTURE_CASE)
        cd_gate_capture_moved();
        capture_api(cb, cbid, 1);
        return;
        CD_GRAPH_CBIDS(CD_CAPTURE_CASE)
        capture_api(cb, cbid, 1);
        return;
    default:
        break;
    }
    if (tls_hook_records)
        return;                    /* inside the launch hooks' record mode: the hook records it */
    cd_launch l = launch_of(cb, cbid);
    cd_launch_exited(&l);
}

void cd_on_sticky_logged(int code)
{
    if (atomic_load_explicit(&cd_gates.watching, memory_order_relaxed))
        cd_report_watch_culprit(code, "driver log", 0);
}
