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
 * become graph nodes with markers of their own (graph_capture.c); a graph
 * replay is one record here.
 *
 * Memory: CD_WATCH_RING records (96 bytes each, 6 MiB) and, per context, one
 * buffer of CD_WATCH_SLOTS + CD_GRAPH_NODES 32-bit slots (768 KiB), mapped
 * at the first launch seen in that context (cold path, once), registered with
 * it, and never unmapped (the context table: contexts.c). A fault can be named
 * while it is among the last 65,536 launches of the process.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "capture/capture.h"

#include <string.h>     /* memcpy, memset */
#include <sys/syscall.h> /* SYS_gettid */
#include <unistd.h>      /* syscall */

static cd_watch_record ring[CD_WATCH_RING];
static atomic_uint_fast64_t watch_seq;
/* The ring's counters (capture.h). */
static struct {
    CD_WATCH_COUNTS(CD_COUNTER_ATOMIC)
    atomic_int write_rc;
} counts;

void cd_watch_stats(cd_watch_counts *out)
{
    CD_WATCH_COUNTS(CD_COUNTER_READ)
    out->write_rc = atomic_load(&counts.write_rc);
}
/* A forked child's first seq of its own: the launches before it are the
 * parent's (cd_watch_fork), never read in the child. Written only there. */
static uint64_t fork_floor;
static _Thread_local uint64_t tls_last_seq;
static _Thread_local int32_t tls_tid;
static _Thread_local uint32_t tls_op;

void cd_watch_set_op(uint32_t op) { tls_op = op; }

/* --------------------------------------------------------- launches -- */

static inline int32_t thread_id(void)
{
    if (!tls_tid)
        tls_tid = (int32_t)syscall(SYS_gettid);
    return tls_tid;
}

/* What a launch's record says of the launch itself, shared by the ring and
 * the captured graph nodes (graph_capture.c): configuration, stream, kernel,
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
    r->op = tls_op;
    r->graph = 0;
    int complete = 0;
    r->n_frames = frames ? (uint8_t)cd_frames_read(r->frames, CD_RING_FRAMES, 1, &complete) : 0;
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
    const int probe = cd_config.watch_probe;
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

    const unsigned every = atomic_load_explicit(&cd_gates.watch_every, memory_order_relaxed);
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
    cd_slots slots;
    if (p->want > 0 && cd_watch_context_slots(p->ctx_index, r->ctx_gen, &slots) == 0) {
        CUdeviceptr slot = cd_launch_slot_dev(&slots, p->seq);
        /* Default flags: the _v2 API refuses NO_MEMORY_BARRIER (seen: 1, INVALID_VALUE). */
        uint64_t t0 = cd_config.profile ? cd_clock_ns() : 0;
        CUresult wrc = cd_drv.cuStreamWriteValue32(l->stream, slot, (cuuint32_t)p->seq,
                                                   CU_STREAM_WRITE_VALUE_DEFAULT);
        if (cd_config.profile)
            atomic_fetch_add_explicit(&counts.ns_marker, cd_clock_ns() - t0,
                                      memory_order_relaxed);
        if (wrc == CUDA_SUCCESS) {
            flags |= CD_WATCH_MARKED;
            if (e)
                atomic_store_explicit(&e->unmarked, 0, memory_order_relaxed);
            atomic_fetch_add_explicit(&counts.marked, 1, memory_order_relaxed);
        } else {
            atomic_store_explicit(&counts.write_rc, (int)wrc, memory_order_relaxed);
        }
    }
    if (p->want && !(flags & CD_WATCH_MARKED))
        atomic_fetch_add_explicit(&counts.unmarked, 1, memory_order_relaxed);
    r->flags = flags;
    atomic_store_explicit(&r->seq, p->seq, memory_order_release);
    if (e)
        atomic_store_explicit(&e->last_seq, p->seq, memory_order_release);
    tls_last_seq = p->seq;
    atomic_fetch_add_explicit(&counts.watched, 1, memory_order_relaxed);
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
    cd_slots slots;
    if (cd_watch_context_slots(r.ctx, r.ctx_gen, &slots) != 0)
        return 0;
    if (check_capture) {               /* never a write into somebody's capture */
        CUstreamCaptureStatus cap = CU_STREAM_CAPTURE_STATUS_NONE;
        if (cd_drv.cuStreamIsCapturing((CUstream)r.stream, &cap) != CUDA_SUCCESS ||
            cap != CU_STREAM_CAPTURE_STATUS_NONE)
            return 0;
    }
    CUresult wrc = cd_drv.cuStreamWriteValue32((CUstream)r.stream, cd_launch_slot_dev(&slots, last),
                                               (cuuint32_t)last, CU_STREAM_WRITE_VALUE_DEFAULT);
    if (wrc != CUDA_SUCCESS) {
        atomic_store_explicit(&counts.write_rc, (int)wrc, memory_order_relaxed);
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
    atomic_fetch_add_explicit(&counts.closed, 1, memory_order_relaxed);
    return 1;
}

int cd_watch_close(uint32_t uid, int all, uintptr_t stream, int check_capture)
{
    if (atomic_load_explicit(&cd_gates.watch_every, memory_order_relaxed) <= 1)
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

/* Reads host memory only: safe after the context died, and in a signal handler. */
int cd_watch_done(const cd_watch_record *r, uint64_t seq)
{
    cd_slots slots;
    if (r->ctx >= CD_MAX_CONTEXTS)
        return -1;
    if (cd_watch_context_slots(r->ctx, r->ctx_gen, &slots) != 0)
        return cd_watch_context_retired(r->ctx, r->ctx_gen) ? -2 : -1;
    if (!(r->flags & (CD_WATCH_MARKED | CD_WATCH_CLOSED)))
        return -1;
    return *cd_launch_slot(&slots, seq) == (uint32_t)seq;
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
    if (op != CD_FORK_CHILD)
        return;                    /* no lock here (the contexts': cd_contexts_fork) */
    fork_floor = atomic_load(&watch_seq);
    tls_last_seq = 0;
    tls_tid = 0;                   /* the child's thread has its own id */
    memset(streams, 0, sizeof streams);   /* the parent's streams */
}

/* Per stream, in one pass over the ring's window after `since`, oldest first
 * (host memory only: no CUDA call, no lock, no allocation; safe in a signal
 * handler): the newest launch known to have finished (its marker came back,
 * or a later one of its stream did), the first launch whose marker did not
 * come back (`open`), and the launches in between (the candidates: the first
 * of them that did not finish is the stream's culprit). A returned marker
 * after an open one means the open one's marker was lost (a refused write):
 * the stream starts again from there. Records of captured graph nodes are not
 * launches of a stream (graph_capture.c); records of retired contexts are
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
