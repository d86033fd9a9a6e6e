/*
 * capture/watch_ring.c: watch mode. Name the faulting launch while kernels run asynchronously.
 *
 * At each launch's API exit (hooks/launch_callback.c calls cd_watch_launch), without
 * the GIL, a lock, or an allocation:
 *   1. take a sequence number; write a record into the ring (stream, interned
 *      kernel name, grid/block, thread, the launching Python location as
 *      interned frame ids), publishing its seq last;
 *   2. enqueue cuStreamWriteValue32(stream, slot[seq % SLOTS], seq) behind the
 *      kernel: the slot, in pinned host-mapped memory of the launch's
 *      context, gets the number when the kernel has completed.
 * A sticky fault stops the context: the faulting kernel's marker never
 * arrives. Per stream, the first launch whose slot lacks its number is that
 * stream's culprit, readable from host memory after the context died, with no
 * CUDA call (so also from a signal handler). Launches on a capturing stream
 * are skipped (hooks/launch_callback.c); a graph replay is one record.
 *
 * Memory: CD_WATCH_RING records (96 bytes each, 6 MiB) and, per context, one
 * pinned buffer of CD_WATCH_SLOTS 32-bit slots (256 KiB), allocated at the
 * first launch seen in that context (cold path, once) and kept for the life
 * of the process. A fault can be named while it is among the last 65,536
 * launches of the process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "capture/capture.h"

#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static cd_watch_record ring[CD_WATCH_RING];
static atomic_uint_fast64_t watch_seq;
static _Thread_local uint64_t tls_last_seq;
static _Thread_local int32_t tls_tid;
_Thread_local uint32_t cd_tls_op;

#define MAX_CTX 64
typedef struct {
    _Atomic uintptr_t ctx;         /* written last */
    volatile uint32_t *host;       /* NULL: the allocation failed, no markers */
    CUdeviceptr dev;
    int device;
} ctx_slots;
static ctx_slots ctxs[MAX_CTX];
static atomic_int n_ctxs;
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local uintptr_t tls_ctx;
static _Thread_local int tls_ctx_index = -1;

/* Cold: a context seen for the first time; it is current on this thread.
 * From the launch callback (its first launch), or from watch entry for the
 * contexts that exist then. Returns its index, or -1 when the table is full. */
static __attribute__((noinline, cold)) int register_context(CUcontext context)
{
    uintptr_t key = (uintptr_t)context;
    pthread_mutex_lock(&ctx_lock);
    int n = atomic_load(&n_ctxs);
    for (int i = 0; i < n; i++)
        if (atomic_load(&ctxs[i].ctx) == key) {
            pthread_mutex_unlock(&ctx_lock);
            return i;
        }
    if (n == MAX_CTX) {
        pthread_mutex_unlock(&ctx_lock);
        return -1;
    }
    void *host = NULL;
    CUdeviceptr dev = 0;
    int rc = CU_CHECK(cd_drv.cuMemHostAlloc(&host, CD_WATCH_SLOTS * sizeof(uint32_t),
                                            CU_MEMHOSTALLOC_PORTABLE |
                                                CU_MEMHOSTALLOC_DEVICEMAP));
    if (rc == 0 && (rc = CU_CHECK(cd_drv.cuMemHostGetDevicePointer(&dev, host, 0))) != 0)
        host = NULL;               /* kept (freeing it here is not worth the risk) */
    if (rc == 0)
        memset(host, 0, CD_WATCH_SLOTS * sizeof(uint32_t));
    else
        atomic_store(&cd_state.watch_alloc_rc, rc);
    ctxs[n].host = rc == 0 ? host : NULL;
    ctxs[n].dev = dev;
    ctxs[n].device = -1;
    uint32_t d;
    if (cd_cupti.cuptiGetDeviceId && cd_cupti.cuptiGetDeviceId(context, &d) == CUPTI_SUCCESS)
        ctxs[n].device = (int)d;
    atomic_store(&ctxs[n].ctx, key);
    atomic_store(&n_ctxs, n + 1);
    pthread_mutex_unlock(&ctx_lock);
    return n;
}

void cd_watch_prepare(void)
{
    if (cd_driver_ready() != 0)
        return;
    CUcontext ctx = NULL;
    if (cd_drv.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx)
        register_context(ctx);
    int n = 0;
    if (cd_drv.cuDeviceGetCount(&n) != CUDA_SUCCESS)
        return;
    for (int i = 0; i < n && i < CD_MAX_DEVICES; i++) {
        CUdevice dev;
        unsigned flags;
        int active = 0;
        CUcontext c, popped;
        if (cd_drv.cuDeviceGet(&dev, i) || cd_drv.cuDevicePrimaryCtxGetState(dev, &flags, &active) ||
            !active || cd_device_context(i, &c) || cd_drv.cuCtxPushCurrent(c))
            continue;
        register_context(c);
        cd_drv.cuCtxPopCurrent(&popped);
    }
}

static inline int context_index(const CUpti_CallbackData *cb)
{
    uintptr_t key = (uintptr_t)cb->context;
    if (key == tls_ctx && tls_ctx_index >= 0)
        return tls_ctx_index;
    int n = atomic_load_explicit(&n_ctxs, memory_order_acquire), i;
    for (i = 0; i < n; i++)
        if (atomic_load_explicit(&ctxs[i].ctx, memory_order_relaxed) == key)
            break;
    if (i == n)
        i = register_context(cb->context);
    tls_ctx = key;
    tls_ctx_index = i;
    return i;
}

void cd_watch_launch(const CUpti_CallbackData *cb, CUpti_CallbackId cbid, CUstream s)
{
    uint64_t seq = atomic_fetch_add_explicit(&watch_seq, 1, memory_order_relaxed) + 1;
    cd_watch_record *r = &ring[seq & (CD_WATCH_RING - 1)];
    atomic_store_explicit(&r->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);

    cd_launch_dims dims = {{0, 0, 0}, {0, 0, 0}, 0};
    cd_launch_stream(cbid, cb->functionParams, &dims);
    memcpy(r->grid, dims.grid, sizeof r->grid);
    memcpy(r->block, dims.block, sizeof r->block);
    r->shared_mem = dims.shared_mem;
    r->stream = (uintptr_t)s;
    r->t_ns = cd_clock_ns();
    r->kernel = cd_intern_kernel(cb->symbolName, &r->kernel_short);
    if (!tls_tid)
        tls_tid = (int32_t)syscall(SYS_gettid);
    r->thread_id = tls_tid;
    r->cbid = (uint16_t)cbid;
    r->op = cd_tls_op;
    int complete = 0;
    r->n_frames = (uint8_t)cd_frames_capture(r->frames, CD_RING_FRAMES, 1, &complete);
    uint8_t flags = complete < 0 ? CD_WATCH_USER_LAST : 0;
    if (cd_is_graph_launch(cbid))
        flags |= CD_WATCH_GRAPH;

    int ci = context_index(cb);
    r->ctx = (uint16_t)(ci < 0 ? 0xFFFF : ci);
    if (ci >= 0 && ctxs[ci].host) {
        CUdeviceptr slot = ctxs[ci].dev + (seq & (CD_WATCH_SLOTS - 1)) * sizeof(uint32_t);
        /* Default flags: the _v2 API refuses NO_MEMORY_BARRIER (seen: 1, INVALID_VALUE). */
        struct timespec t0, t1;
        if (cd_state.profile)
            clock_gettime(CLOCK_MONOTONIC, &t0);
        CUresult wrc = cd_drv.cuStreamWriteValue32(s, slot, (cuuint32_t)seq,
                                                   CU_STREAM_WRITE_VALUE_DEFAULT);
        if (cd_state.profile) {
            clock_gettime(CLOCK_MONOTONIC, &t1);
            atomic_fetch_add_explicit(&cd_state.ns_marker,
                                      (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000000000LL +
                                                 (t1.tv_nsec - t0.tv_nsec)),
                                      memory_order_relaxed);
        }
        if (wrc == CUDA_SUCCESS)
            flags |= CD_WATCH_MARKED;
        else
            atomic_store_explicit(&cd_state.watch_write_rc, (int)wrc, memory_order_relaxed);
    }
    if (!(flags & CD_WATCH_MARKED))
        atomic_fetch_add_explicit(&cd_state.n_unmarked, 1, memory_order_relaxed);
    r->flags = flags;
    atomic_store_explicit(&r->seq, seq, memory_order_release);
    tls_last_seq = seq;
    atomic_fetch_add_explicit(&cd_state.n_watched, 1, memory_order_relaxed);
}

uint64_t cd_watch_seq(void) { return atomic_load(&watch_seq); }

uint64_t cd_watch_thread_last(void) { return tls_last_seq; }

int cd_watch_context_device(int ci)
{
    return ci >= 0 && ci < atomic_load(&n_ctxs) ? ctxs[ci].device : -1;
}

/* Reads host memory only: safe after the context died, and in a signal handler. */
int cd_watch_done(const cd_watch_record *r, uint64_t seq)
{
    if (!(r->flags & CD_WATCH_MARKED) || r->ctx >= MAX_CTX)
        return -1;
    volatile uint32_t *host = ctxs[r->ctx].host;
    if (!host)
        return -1;
    return host[seq & (CD_WATCH_SLOTS - 1)] == (uint32_t)seq;
}

int cd_watch_get(uint64_t seq, cd_watch_record *out)
{
    uint64_t now = atomic_load(&watch_seq);
    if (seq == 0 || seq > now || now - seq >= CD_WATCH_RING)
        return -1;
    const cd_watch_record *r = &ring[seq & (CD_WATCH_RING - 1)];
    if (atomic_load_explicit(&r->seq, memory_order_acquire) != seq)
        return -1;
    memcpy((char *)out + sizeof out->seq, (const char *)r + sizeof r->seq,
           sizeof *r - sizeof r->seq);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&r->seq, memory_order_relaxed) != seq)
        return -1;                 /* overwritten while we copied */
    atomic_store_explicit(&out->seq, seq, memory_order_relaxed);
    return 0;
}

/* Per stream, the first launch after `since` whose marker never came back.
 * When no launch has a missing marker but some have none at all (their
 * completion is unknown: a slot allocation or a write failed), the last of
 * those is returned instead, as a guess the caller reports as inexact. */
int cd_watch_incomplete(uint64_t since, uint64_t *out, int max)
{
    uint64_t now = atomic_load(&watch_seq);
    uint64_t window = CD_WATCH_RING < CD_WATCH_SLOTS ? CD_WATCH_RING : CD_WATCH_SLOTS;
    uint64_t first = since + 1;
    if (now >= window && first < now - window + 1)
        first = now - window + 1;
    uintptr_t streams[64];
    int32_t threads[64];
    int n_streams = 0, n = 0;
    uint64_t last_unknown = 0;
    for (uint64_t seq = first; seq <= now && n < max; seq++) {
        cd_watch_record r;
        if (cd_watch_get(seq, &r) != 0)
            continue;
        int done = cd_watch_done(&r, seq);
        if (done < 0)
            last_unknown = seq;
        if (done != 0)
            continue;
        /* The per-thread default stream is one stream per thread. */
        int32_t tid = r.stream == (uintptr_t)CU_STREAM_PER_THREAD ? r.thread_id : 0;
        int seen = 0;
        for (int i = 0; i < n_streams; i++)
            if (streams[i] == r.stream && threads[i] == tid)
                seen = 1;
        if (seen)
            continue;
        if (n_streams < 64) {
            streams[n_streams] = r.stream;
            threads[n_streams] = tid;
            n_streams++;
        }
        out[n++] = seq;
    }
    if (n == 0 && last_unknown && max > 0) {
        out[0] = last_unknown;
        return -1;                 /* a guess: completion unknown */
    }
    return n;
}
