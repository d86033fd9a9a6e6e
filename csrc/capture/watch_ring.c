/*
 * capture/watch_ring.c: watch mode. Name the faulting launch while kernels run asynchronously.
 *
 * At each launch's API exit (hooks/launch_callback.c's pipeline calls
 * cd_watch_record_launch, then cd_watch_mark), without
 * the GIL, a lock, or an allocation:
 *   1. take a sequence number; write a record into the ring (stream, interned
 *      kernel name, grid/block, thread, the launching Python location as
 *      interned frame ids), publishing its seq last;
 *   2. enqueue cuStreamWriteValue32(stream, slot[seq % SLOTS], seq) behind the
 *      kernel: the slot, in host memory mapped into the launch's context,
 *      gets the number when the kernel has completed.
 * A sticky fault stops the context: the faulting kernel's marker never
 * arrives. Per stream, the first launch whose slot lacks its number is that
 * stream's culprit, readable from host memory after the context died, with no
 * CUDA call (so also from a signal handler). Launches on a capturing stream
 * become graph nodes with markers of their own (graph_markers.c); a graph
 * replay is one record here.
 *
 * Memory: CD_WATCH_RING records (96 bytes each, 6 MiB) and, per context, one
 * buffer of CD_WATCH_SLOTS + CD_GRAPH_NODES 32-bit slots (768 KiB), mapped
 * at the first launch seen in that context (cold path, once), registered with
 * it, and never unmapped (the contexts section below). A fault can be named
 * while it is among the last 65,536 launches of the process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "capture/capture.h"

#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static cd_watch_record ring[CD_WATCH_RING];
static atomic_uint_fast64_t watch_seq;
/* A forked child's first seq of its own: the launches before it are the
 * parent's (cd_watch_fork), never read in the child. Written only there. */
static uint64_t fork_floor;
static _Thread_local uint64_t tls_last_seq;
static _Thread_local int32_t tls_tid;
_Thread_local uint32_t cd_tls_op;

/* ------------------------------------------------------- contexts -- */

/* The context table. A context is known by CUPTI's contextUid (unique in
 * the process), never by its CUcontext pointer: after cuDevicePrimaryCtxReset
 * (cudaDeviceReset) the driver hands back the same pointer for a new context.
 *
 * Each entry has one buffer of slots: CD_WATCH_SLOTS for launches, then
 * CD_GRAPH_NODES for nodes of captured graphs (graph_markers.c). The buffer
 * is our own memory (mmap), registered with the context (cuMemHostRegister,
 * portable, device-mapped): the driver never frees it, so reading slots never
 * faults - after the context died, after a reset, from a signal handler.
 * A buffer is never unmapped; a retired entry's buffer is reused (zeroed,
 * registered again) by the next context that takes the entry.
 *
 * An entry is retired when its context is destroyed (CUPTI's resource
 * callback CONTEXT_DESTROY_STARTING), or, when that callback was missed (a
 * reset while nothing was subscribed), when watch() opens and finds the
 * context's pointer behind another id. A retired entry's records are never
 * read (cd_watch_done: -2). Records keep the entry's generation: an entry
 * taken by another context is a new generation, the old records stay retired.
 * The table has CD_MAX_CONTEXTS entries: more live contexts than that get no
 * markers (counted in n_unmarked). */
typedef struct {
    _Atomic int state;             /* CTX_FREE, CTX_LIVE, CTX_RETIRED */
    _Atomic uint32_t uid;          /* CUPTI contextUid */
    _Atomic uint32_t gen;          /* moves each time the entry is taken */
    uintptr_t ctx;                 /* its CUcontext (to match destroy callbacks) */
    volatile uint32_t *host;       /* the buffer; NULL: no markers (allocation failed) */
    size_t bytes;
    CUdeviceptr dev;               /* its device address in this context */
    int device;
} ctx_slots;
enum { CTX_FREE = 0, CTX_LIVE = 1, CTX_RETIRED = 2 };
#define SLOTS_BYTES (((size_t)CD_WATCH_SLOTS + CD_GRAPH_NODES) * sizeof(uint32_t))
static ctx_slots ctxs[CD_MAX_CONTEXTS];
static pthread_mutex_t ctx_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint ctx_epoch;      /* moves at every retirement: per-thread caches drop */
static atomic_int ids_agree;       /* cuptiGetContextId == contextUid: 1 yes, -1 no, 0 unknown */
static _Thread_local uint32_t tls_uid;
static _Thread_local unsigned tls_epoch;
static _Thread_local int tls_ctx_index = -1;

/* The entry's buffer registered with the current context (ctx_lock held).
 * 0, or the CUresult of the failure (the entry then has no markers). */
static int map_slots(ctx_slots *e)
{
    int rc = CUDA_ERROR_OUT_OF_MEMORY;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (!e->host) {
            void *p = mmap(NULL, SLOTS_BYTES, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
            if (p == MAP_FAILED)
                return CUDA_ERROR_OUT_OF_MEMORY;
            e->host = p;
            e->bytes = SLOTS_BYTES;
        } else {
            memset((void *)e->host, 0, e->bytes);  /* a reused buffer: no old numbers */
        }
        rc = CU_CHECK(cd_drv.cuMemHostRegister((void *)e->host, e->bytes,
                                               CU_MEMHOSTREGISTER_PORTABLE |
                                                   CU_MEMHOSTREGISTER_DEVICEMAP));
        if (rc == 0 && (rc = CU_CHECK(cd_drv.cuMemHostGetDevicePointer(&e->dev,
                                                                      (void *)e->host, 0))) == 0)
            return 0;
        /* Still registered by a context that lives on (an entry retired by
         * mistake), or refused: keep that buffer mapped, take a fresh one. */
        e->host = NULL;
    }
    return rc;
}

/* Cold: a context seen for the first time; it is current on this thread.
 * From the launch callback (its first launch), or from watch entry for the
 * contexts that exist then. Never while the thread's stream is capturing (a
 * registration would invalidate the capture). Returns the entry's index, or
 * -1 when every entry holds a live context. */
static __attribute__((noinline, cold)) int register_context(CUcontext context, uint32_t uid)
{
    pthread_mutex_lock(&ctx_lock);
    int pick = -1;
    for (int i = 0; i < CD_MAX_CONTEXTS; i++) {
        int st = atomic_load(&ctxs[i].state);
        if (st == CTX_LIVE && atomic_load(&ctxs[i].uid) == uid) {
            pthread_mutex_unlock(&ctx_lock);
            return i;
        }
        if (st == CTX_FREE && (pick < 0 || atomic_load(&ctxs[pick].state) != CTX_FREE))
            pick = i;
        else if (st == CTX_RETIRED && pick < 0)
            pick = i;
    }
    if (pick < 0) {
        pthread_mutex_unlock(&ctx_lock);
        return -1;
    }
    ctx_slots *e = &ctxs[pick];
    atomic_store(&e->state, CTX_FREE);            /* readers: not this generation yet */
    atomic_fetch_add(&e->gen, 1);
    int rc = map_slots(e);
    if (rc) {
        atomic_store(&cd_state.watch_alloc_rc, rc);
        e->host = NULL;
    }
    e->ctx = (uintptr_t)context;
    e->device = -1;
    uint32_t d;
    if (cd_cupti.cuptiGetDeviceId && cd_cupti.cuptiGetDeviceId(context, &d) == CUPTI_SUCCESS)
        e->device = (int)d;
    atomic_store(&e->uid, uid);
    atomic_store(&e->state, CTX_LIVE);
    pthread_mutex_unlock(&ctx_lock);
    return pick;
}

/* ctx_lock held. The entry's records are never read again; every thread's
 * cache of its last context drops. */
static void retire_locked(int i)
{
    atomic_store(&ctxs[i].state, CTX_RETIRED);
    atomic_fetch_add(&ctx_epoch, 1);
}

void cd_watch_context_destroyed(CUcontext context)
{
    pthread_mutex_lock(&ctx_lock);
    for (int i = 0; i < CD_MAX_CONTEXTS; i++)
        if (atomic_load(&ctxs[i].state) == CTX_LIVE && ctxs[i].ctx == (uintptr_t)context)
            retire_locked(i);
    pthread_mutex_unlock(&ctx_lock);
}

/* A context current on this thread, at watch entry: retire an entry that
 * holds its pointer under another id (destroyed while nothing was
 * subscribed), then register it. */
static void prepare_context(CUcontext c)
{
    uint32_t uid;
    if (!cd_cupti.cuptiGetContextId || cd_cupti.cuptiGetContextId(c, &uid) != CUPTI_SUCCESS ||
        atomic_load(&ids_agree) < 0)
        return;
    if (atomic_load(&ids_agree) > 0) {
        pthread_mutex_lock(&ctx_lock);
        for (int i = 0; i < CD_MAX_CONTEXTS; i++)
            if (atomic_load(&ctxs[i].state) == CTX_LIVE && ctxs[i].ctx == (uintptr_t)c &&
                atomic_load(&ctxs[i].uid) != uid)
                retire_locked(i);
        pthread_mutex_unlock(&ctx_lock);
    }
    register_context(c, uid);
}

void cd_watch_prepare(void)
{
    if (cd_driver_ready() != 0)
        return;
    CUcontext ctx = NULL;
    if (cd_drv.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS && ctx)
        prepare_context(ctx);
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
        prepare_context(c);
        cd_drv.cuCtxPopCurrent(&popped);
    }
}

/* A launch tells whether CUPTI's two ids of a context (the callback's
 * contextUid, cuptiGetContextId) are the same numbers; watch entry relies on
 * the second only when they are. Asked until known (cold: per-thread cache
 * misses only). */
static __attribute__((noinline, cold)) void learn_ids(CUcontext context, uint32_t uid)
{
    uint32_t id;
    if (cd_cupti.cuptiGetContextId && context &&
        cd_cupti.cuptiGetContextId(context, &id) == CUPTI_SUCCESS)
        atomic_store(&ids_agree, id == uid ? 1 : -1);
}

/* The live entry of a context id, or -1 (no registration: safe while capturing). */
int cd_watch_context_find(uint32_t uid)
{
    for (int i = 0; i < CD_MAX_CONTEXTS; i++)
        if (atomic_load_explicit(&ctxs[i].state, memory_order_acquire) == CTX_LIVE &&
            atomic_load_explicit(&ctxs[i].uid, memory_order_relaxed) == uid)
            return i;
    return -1;
}

unsigned cd_watch_context_epoch(void)
{
    return atomic_load_explicit(&ctx_epoch, memory_order_acquire);
}

/* The launch's context entry, registered on first sight (hot: a per-thread
 * cache of the last id, valid until any entry retires). */
int cd_watch_context_index(CUcontext context, uint32_t uid)
{
    unsigned epoch = atomic_load_explicit(&ctx_epoch, memory_order_relaxed);
    if (uid == tls_uid && epoch == tls_epoch && tls_ctx_index >= 0)
        return tls_ctx_index;
    if (!atomic_load_explicit(&ids_agree, memory_order_relaxed))
        learn_ids(context, uid);
    int i = cd_watch_context_find(uid);
    if (i < 0)
        i = register_context(context, uid);
    tls_uid = uid;
    tls_epoch = epoch;
    tls_ctx_index = i;
    return i;
}

int cd_watch_context_slots(int ci, uint32_t gen, volatile uint32_t **host, CUdeviceptr *dev)
{
    if (ci < 0 || ci >= CD_MAX_CONTEXTS)
        return -1;
    const ctx_slots *e = &ctxs[ci];
    if (atomic_load_explicit(&e->state, memory_order_acquire) != CTX_LIVE ||
        ((atomic_load_explicit(&e->gen, memory_order_relaxed) ^ gen) & 0xFFFF) || !e->host)
        return -1;
    *host = e->host;
    if (dev)
        *dev = e->dev;
    return 0;
}

/* The entry's generation, as records keep it (16 bits). */
uint32_t cd_watch_context_gen(int ci)
{
    return ci >= 0 && ci < CD_MAX_CONTEXTS ? atomic_load(&ctxs[ci].gen) & 0xFFFF : 0;
}

int cd_watch_contexts_live(void)
{
    int n = 0;
    for (int i = 0; i < CD_MAX_CONTEXTS; i++)
        n += atomic_load(&ctxs[i].state) == CTX_LIVE;
    return n;
}

/* --------------------------------------------------------- launches -- */

static inline int32_t thread_id(void)
{
    if (!tls_tid)
        tls_tid = (int32_t)syscall(SYS_gettid);
    return tls_tid;
}

/* What a launch's record says of the launch itself, shared by the ring and
 * the captured graph nodes (graph_markers.c): configuration, stream, kernel,
 * thread, op, the launching thread's frames; flags USER_LAST and GRAPH. */
void cd_watch_fill(cd_watch_record *r, const cd_launch *l, int frames, int *early)
{
    cd_launch_dims dims = {{0, 0, 0}, {0, 0, 0}, 0};
    cd_launch_stream(l->cbid, l->params, &dims);
    memcpy(r->grid, dims.grid, sizeof r->grid);
    memcpy(r->block, dims.block, sizeof r->block);
    r->shared_mem = dims.shared_mem;
    r->stream = (uintptr_t)l->stream;
    r->t_ns = cd_clock_ns();
    int by_name;
    r->kernel = cd_intern_kernel(l->symbol, &r->kernel_short, &by_name, early);
    r->origin = (uint8_t)(l->origin ? l->origin : by_name);
    r->thread_id = thread_id();
    r->cbid = (uint16_t)l->cbid;
    r->op = cd_tls_op;
    r->graph = 0;
    int complete = 0;
    r->n_frames = frames ? (uint8_t)cd_frames_capture(r->frames, CD_RING_FRAMES, 1, &complete) : 0;
    r->flags = complete < 0 ? CD_WATCH_USER_LAST : 0;
    if (cd_is_graph_launch(l->cbid))
        r->flags |= CD_WATCH_GRAPH;
}

/* ---------------------------------------------------------- streams -- */

/* The stream table: per (context, stream), how many launches went by since
 * its last marker, and its newest launch. It decides which launches get a
 * marker of their own (every watch_every-th of a stream), and lets a host
 * wait put one behind a stream's newest launch (cd_watch_host_waits).
 *
 * A stream completes its work in order, so a marker that came back says that
 * its launch and every earlier launch of its stream finished, and a marker
 * that did not says that its launch or an earlier one of the window since
 * the stream's last returned marker did not (capture/watch_ring.c's scan).
 * With markers every K launches, a fault is placed among at most K launches
 * of its stream; the device's assert text names which (Python, the fd-2
 * block).
 *
 * Lock-free: an entry is claimed by a compare-exchange, filled, then
 * published (state READY). Readers match (uid, stream, tid) on every use, so
 * an entry taken over by another stream (the table full: the stalest of the
 * probed entries is reused) is never mistaken for the old one. Counts are
 * plain relaxed loads and stores: two threads launching on one stream at
 * once may miscount a launch, which moves a marker by one, never a result. */
#define CD_WATCH_STREAMS 256           /* a power of two */
#define STREAM_PROBES 16
typedef struct {
    _Atomic int state;                 /* 0 free, 1 being written, 2 ready */
    _Atomic uint32_t uid;              /* CUPTI contextUid */
    _Atomic uintptr_t stream;
    _Atomic int32_t tid;               /* the per-thread default stream: its thread; else 0 */
    _Atomic uint32_t unmarked;         /* launches since its last marker */
    _Atomic uint64_t last_seq;         /* its newest launch in the ring */
} stream_entry;
enum { ST_FREE = 0, ST_BUSY = 1, ST_READY = 2 };
static stream_entry streams[CD_WATCH_STREAMS];

static inline uint32_t stream_slot(uint32_t uid, uintptr_t s, int32_t tid)
{
    uint64_t k = ((uint64_t)s ^ ((uint64_t)uid << 40) ^ (uint64_t)(uint32_t)tid) *
                 0x9E3779B97F4A7C15ull;
    return (uint32_t)(k >> 40) & (CD_WATCH_STREAMS - 1);
}

static inline int stream_is(const stream_entry *e, uint32_t uid, uintptr_t s, int32_t tid)
{
    return atomic_load_explicit(&e->state, memory_order_acquire) == ST_READY &&
           atomic_load_explicit(&e->stream, memory_order_relaxed) == s &&
           atomic_load_explicit(&e->uid, memory_order_relaxed) == uid &&
           atomic_load_explicit(&e->tid, memory_order_relaxed) == tid;
}

static stream_entry *stream_fill(stream_entry *e, uint32_t uid, uintptr_t s, int32_t tid)
{
    atomic_store(&e->uid, uid);
    atomic_store(&e->stream, s);
    atomic_store(&e->tid, tid);
    atomic_store(&e->unmarked, 0);
    atomic_store(&e->last_seq, 0);
    atomic_store_explicit(&e->state, ST_READY, memory_order_release);
    return e;
}

/* Cold: first launch on a stream (or its entry was taken over). NULL when
 * every probed entry is being written: that launch gets a marker. */
static __attribute__((noinline, cold)) stream_entry *stream_add(uint32_t uid, uintptr_t s,
                                                                 int32_t tid, uint32_t start)
{
    stream_entry *stalest = NULL;
    for (uint32_t p = 0; p < STREAM_PROBES; p++) {
        stream_entry *e = &streams[(start + p) & (CD_WATCH_STREAMS - 1)];
        int expect = ST_FREE;
        if (atomic_compare_exchange_strong(&e->state, &expect, ST_BUSY))
            return stream_fill(e, uid, s, tid);
        if (stream_is(e, uid, s, tid))
            return e;                  /* another thread was first */
        if (expect == ST_READY && (!stalest || atomic_load(&e->last_seq) <
                                               atomic_load(&stalest->last_seq)))
            stalest = e;
    }
    int expect = ST_READY;
    if (stalest && atomic_compare_exchange_strong(&stalest->state, &expect, ST_BUSY))
        return stream_fill(stalest, uid, s, tid);
    return NULL;
}

static inline stream_entry *stream_of(uint32_t uid, uintptr_t s, int32_t tid)
{
    uint32_t start = stream_slot(uid, s, tid);
    for (uint32_t p = 0; p < 4; p++) {
        stream_entry *e = &streams[(start + p) & (CD_WATCH_STREAMS - 1)];
        if (stream_is(e, uid, s, tid))
            return e;
        if (atomic_load_explicit(&e->state, memory_order_relaxed) == ST_FREE)
            break;
    }
    return stream_add(uid, s, tid, start);
}

/* 1. Record: the launch's record in the ring's next slot, not yet published
 * (its seq stays 0 until cd_watch_mark), and whether a marker of its own is
 * due: every launch in the exact mode; a graph replay, an NCCL kernel (hangs
 * across ranks are about collectives); a kernel's first launches and every
 * launch of a USER kernel (where faults and hangs are likeliest: the launch
 * before it was given one at its API entry, so the pair brackets it); else
 * every watch_every-th launch of its stream. 0: nothing to mark or publish
 * (the dispatch probe). */
int cd_watch_record_launch(const cd_launch *l, cd_watch_pending *p)
{
    const int probe = cd_state.watch_probe;
    if (probe == CD_PROBE_DISPATCH)
        return 0;
    uint64_t seq = atomic_fetch_add_explicit(&watch_seq, 1, memory_order_relaxed) + 1;
    cd_watch_record *r = &ring[seq & (CD_WATCH_RING - 1)];
    atomic_store_explicit(&r->seq, 0, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);

    int early = 0;
    cd_watch_fill(r, l, probe != CD_PROBE_RECORD, &early);
    if (r->flags & CD_WATCH_GRAPH)
        r->graph = cd_graph_replayed(l->params);
    int ci = cd_watch_context_index(l->context, l->context_uid);
    r->ctx = (uint16_t)(ci < 0 ? 0xFFFF : ci);
    r->ctx_gen = (uint16_t)cd_watch_context_gen(ci);

    const unsigned every = atomic_load_explicit(&cd_state.watch_every, memory_order_relaxed);
    stream_entry *e = stream_of(l->context_uid, (uintptr_t)l->stream,
                                l->stream == CU_STREAM_PER_THREAD ? r->thread_id : 0);
    int want = every <= 1 || !e || (r->flags & CD_WATCH_GRAPH) || early ||
               r->origin == CD_ORIGIN_USER || cd_nccl_kernel(l->symbol);
    if (!want) {
        uint32_t u = atomic_load_explicit(&e->unmarked, memory_order_relaxed) + 1;
        want = u >= every;
        if (!want)
            atomic_store_explicit(&e->unmarked, u, memory_order_relaxed);
    }
    p->r = r;
    p->seq = seq;
    p->stream = e;
    p->ctx_index = ci;
    p->want = !want ? 0 : probe == CD_PROBE_OFF ? 1 : -1;   /* -1: due, but a probe writes none */
    return 1;
}

/* 2. Mark: where one is due, a completion marker behind the kernel (the
 * context's slot for seq gets seq when it completed); then the record is
 * published. */
void cd_watch_mark(const cd_launch *l, cd_watch_pending *p)
{
    cd_watch_record *r = p->r;
    stream_entry *e = p->stream;
    uint8_t flags = r->flags;
    volatile uint32_t *host;
    CUdeviceptr base;
    if (p->want > 0 && cd_watch_context_slots(p->ctx_index, r->ctx_gen, &host, &base) == 0) {
        CUdeviceptr slot = base + (p->seq & (CD_WATCH_SLOTS - 1)) * sizeof(uint32_t);
        /* Default flags: the _v2 API refuses NO_MEMORY_BARRIER (seen: 1, INVALID_VALUE). */
        uint64_t t0 = cd_state.profile ? cd_clock_ns() : 0;
        CUresult wrc = cd_drv.cuStreamWriteValue32(l->stream, slot, (cuuint32_t)p->seq,
                                                   CU_STREAM_WRITE_VALUE_DEFAULT);
        if (cd_state.profile)
            atomic_fetch_add_explicit(&cd_state.ns_marker, cd_clock_ns() - t0,
                                      memory_order_relaxed);
        if (wrc == CUDA_SUCCESS) {
            flags |= CD_WATCH_MARKED;
            if (e)
                atomic_store_explicit(&e->unmarked, 0, memory_order_relaxed);
            atomic_fetch_add_explicit(&cd_state.n_marked, 1, memory_order_relaxed);
        } else {
            atomic_store_explicit(&cd_state.watch_write_rc, (int)wrc, memory_order_relaxed);
        }
    }
    if (p->want && !(flags & CD_WATCH_MARKED))
        atomic_fetch_add_explicit(&cd_state.n_unmarked, 1, memory_order_relaxed);
    r->flags = flags;
    atomic_store_explicit(&r->seq, p->seq, memory_order_release);
    if (e)
        atomic_store_explicit(&e->last_seq, p->seq, memory_order_release);
    tls_last_seq = p->seq;
    atomic_fetch_add_explicit(&cd_state.n_watched, 1, memory_order_relaxed);
}

/* Cold: a marker behind entry e's newest launch, if that launch has none (a
 * marker of its own, or one put behind it before). 1 when one was written. */
static int close_stream(stream_entry *e, int check_capture)
{
    if (!atomic_load_explicit(&e->unmarked, memory_order_relaxed))
        return 0;                      /* its newest launch has its marker */
    const uint64_t last = atomic_load_explicit(&e->last_seq, memory_order_acquire);
    cd_watch_record r;
    if (!last || cd_watch_get(last, &r) != 0 || r.stream != atomic_load(&e->stream) ||
        (r.flags & (CD_WATCH_MARKED | CD_WATCH_CLOSED)))
        return 0;
    volatile uint32_t *host;
    CUdeviceptr base;
    if (cd_watch_context_slots(r.ctx, r.ctx_gen, &host, &base) != 0)
        return 0;
    if (check_capture) {               /* never a write into somebody's capture */
        CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
        if (cd_drv.cuStreamIsCapturing((CUstream)r.stream, &cap) != CUDA_SUCCESS ||
            cap != CU_STREAM_CAPTURE_STATUS_NONE)
            return 0;
    }
    CUresult wrc = cd_drv.cuStreamWriteValue32((CUstream)r.stream,
                                               base + (last & (CD_WATCH_SLOTS - 1)) *
                                                          sizeof(uint32_t),
                                               (cuuint32_t)last, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (wrc != CUDA_SUCCESS) {
        atomic_store_explicit(&cd_state.watch_write_rc, (int)wrc, memory_order_relaxed);
        return 0;
    }
    /* The record says so (CLOSED: a marker behind it, put there later). If
     * the ring slot was taken by a newer launch meanwhile (65,536 launches
     * during this call), the flag is taken back from it: it never claims a
     * marker it does not have. */
    cd_watch_record *slot = &ring[last & (CD_WATCH_RING - 1)];
    __atomic_fetch_or(&slot->flags, (uint8_t)CD_WATCH_CLOSED, __ATOMIC_RELEASE);
    if (atomic_load(&slot->seq) != last)
        __atomic_fetch_and(&slot->flags, (uint8_t)~CD_WATCH_CLOSED, __ATOMIC_RELEASE);
    atomic_store_explicit(&e->unmarked, 0, memory_order_relaxed);
    atomic_fetch_add_explicit(&cd_state.n_closed, 1, memory_order_relaxed);
    return 1;
}

int cd_watch_close(uint32_t uid, int all, uintptr_t stream, int check_capture)
{
    if (atomic_load_explicit(&cd_state.watch_every, memory_order_relaxed) <= 1)
        return 0;                      /* every launch has its marker */
    const int32_t tid = thread_id();
    int n = 0;
    if (!all) {
        int32_t key = stream == (uintptr_t)CU_STREAM_PER_THREAD ? tid : 0;
        uint32_t start = stream_slot(uid, stream, key);
        for (uint32_t p = 0; p < STREAM_PROBES; p++) {
            stream_entry *e = &streams[(start + p) & (CD_WATCH_STREAMS - 1)];
            if (stream_is(e, uid, stream, key))
                n += close_stream(e, check_capture);   /* duplicates too (a race at insert) */
        }
        return n;
    }
    for (int i = 0; i < CD_WATCH_STREAMS; i++) {
        stream_entry *e = &streams[i];
        if (atomic_load_explicit(&e->state, memory_order_acquire) != ST_READY ||
            atomic_load(&e->uid) != uid)
            continue;
        int32_t t = atomic_load(&e->tid);
        if (t && t != tid)
            continue;                  /* another thread's per-thread default stream */
        n += close_stream(e, 1);
    }
    return n;
}

uint64_t cd_watch_seq(void) { return atomic_load(&watch_seq); }

uint64_t cd_watch_thread_last(void) { return tls_last_seq; }

int cd_watch_context_device(int ci)
{
    return ci >= 0 && ci < CD_MAX_CONTEXTS ? ctxs[ci].device : -1;
}

/* Reads host memory only: safe after the context died, and in a signal handler. */
int cd_watch_done(const cd_watch_record *r, uint64_t seq)
{
    volatile uint32_t *host;
    if (r->ctx >= CD_MAX_CONTEXTS)
        return -1;
    if (cd_watch_context_slots(r->ctx, r->ctx_gen, &host, NULL) != 0)
        return atomic_load(&ctxs[r->ctx].state) == CTX_LIVE &&
               cd_watch_context_gen(r->ctx) == r->ctx_gen ? -1 : -2;
    if (!(r->flags & (CD_WATCH_MARKED | CD_WATCH_CLOSED)))
        return -1;
    return host[seq & (CD_WATCH_SLOTS - 1)] == (uint32_t)seq;
}

int cd_watch_get(uint64_t seq, cd_watch_record *out)
{
    uint64_t now = atomic_load(&watch_seq);
    if (seq <= fork_floor || seq > now || now - seq >= CD_WATCH_RING)
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

void cd_watch_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        ctx_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
        fork_floor = atomic_load(&watch_seq);
        /* The contexts are the parent's (the child's copies of the slots never
         * get a marker): retired, so that a launch of the child's own (a driver
         * that works after fork) registers its context afresh. */
        for (int i = 0; i < CD_MAX_CONTEXTS; i++)
            if (atomic_load(&ctxs[i].state) == CTX_LIVE)
                atomic_store(&ctxs[i].state, CTX_RETIRED);
        atomic_fetch_add(&ctx_epoch, 1);
        tls_last_seq = 0;
        tls_tid = 0;               /* the child's thread has its own id */
        memset(streams, 0, sizeof streams);   /* the parent's streams */
        break;
    case CD_FORK_TEST_TAKE:
        pthread_mutex_lock(&ctx_lock);
        break;
    case CD_FORK_TEST_GIVE:
        pthread_mutex_unlock(&ctx_lock);
        break;
    }
}

/* Per stream, in one pass over the ring's window after `since`, oldest first
 * (host memory only: no CUDA call, no lock, no allocation; safe in a signal
 * handler): the newest launch known to have finished (its marker came back,
 * or a later one of its stream did), the first launch whose marker did not
 * come back (`open`), and the launches in between (the candidates: the first
 * of them that did not finish is the stream's culprit). A returned marker
 * after an open one means the open one's marker was lost (a refused write):
 * the stream starts again from there. Records of captured graph nodes are not
 * launches of a stream (graph_markers.c); records of retired contexts are
 * never read. Streams with nothing pending are left out; the rest sorted by
 * their first candidate. */
int cd_watch_scan(uint64_t since, cd_stream_scan *out, int max, uint32_t *streams_cut)
{
    uint64_t now = atomic_load(&watch_seq);
    uint64_t window = CD_WATCH_RING < CD_WATCH_SLOTS ? CD_WATCH_RING : CD_WATCH_SLOTS;
    uint64_t first = since + 1;
    if (now >= window && first < now - window + 1)
        first = now - window + 1;
    int n = 0, last = -1;
    uint32_t cut = 0;
    for (uint64_t seq = first; seq <= now; seq++) {
        cd_watch_record r;
        if (cd_watch_get(seq, &r) != 0 || (r.flags & CD_WATCH_CAPTURED))
            continue;
        int done = cd_watch_done(&r, seq);
        if (done == -2)
            continue;                  /* its context is gone */
        int32_t tid = r.stream == (uintptr_t)CU_STREAM_PER_THREAD ? r.thread_id : 0;
        int i = last;
        if (i < 0 || !out[i].pending || out[i].stream != r.stream || out[i].ctx != r.ctx ||
            out[i].ctx_gen != r.ctx_gen || out[i].tid != tid) {
            int free_slot = -1;
            for (i = 0; i < n; i++) {
                if (!out[i].pending) {
                    if (free_slot < 0)
                        free_slot = i;
                } else if (out[i].stream == r.stream && out[i].ctx == r.ctx &&
                           out[i].ctx_gen == r.ctx_gen && out[i].tid == tid) {
                    break;
                }
            }
            if (i == n) {
                if (done == 1)
                    continue;          /* finished, nothing of its stream pending */
                if (free_slot < 0) {
                    if (n == max) {
                        cut++;
                        continue;
                    }
                    free_slot = n++;
                }
                i = free_slot;
                memset(&out[i], 0, sizeof out[i]);
                out[i].stream = r.stream;
                out[i].tid = tid;
                out[i].ctx = r.ctx;
                out[i].ctx_gen = r.ctx_gen;
            }
            last = i;
        }
        cd_stream_scan *e = &out[i];
        e->newest = seq;
        if (done == 1) {               /* finished: so did everything before it; the entry
                                        * is free for another stream (pending 0) */
            e->last_done = seq;
            e->open = 0;
            e->pending = e->after = 0;
            continue;
        }
        if (e->open) {
            e->after++;
            continue;
        }
        if (e->pending < CD_SCAN_CANDIDATES)
            e->cand[e->pending] = seq;
        e->pending++;
        if (done == 0)
            e->open = seq;             /* its marker never came: the window ends here */
    }
    int k = 0;
    for (int i = 0; i < n; i++)
        if (out[i].pending) {
            if (k != i)
                memcpy(&out[k], &out[i], sizeof out[i]);
            k++;
        }
    for (int i = 1; i < k; i++) {      /* by first candidate (insertion sort: few streams) */
        cd_stream_scan t;
        memcpy(&t, &out[i], sizeof t);
        int j = i - 1;
        while (j >= 0 && out[j].cand[0] > t.cand[0]) {
            memcpy(&out[j + 1], &out[j], sizeof t);
            j--;
        }
        memcpy(&out[j + 1], &t, sizeof t);
    }
    if (streams_cut)
        *streams_cut = cut;
    return k;
}
