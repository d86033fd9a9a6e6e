/*
 * capture/graph_markers.c: completion markers inside CUDA graphs (watch mode).
 *
 * A graph replay is one cuGraphLaunch: one ring record (watch_ring.c). To
 * name the node that faulted, each launch captured into a graph while
 * watching gets a marker of its own, captured into the graph right behind it:
 *
 *   capture begins (API exit of cuStreamBeginCapture*, the stream now
 *     capturing): an entry for the capture (the driver's capture id), and a
 *     start marker, cuStreamWriteValue32 on the capturing stream: the root
 *     node of the graph, written first at every replay;
 *   a launch on a capturing stream (hooks/launch_callback.c): a node record,
 *     like a ring record (kernel, grid, the capturing thread's frames), kept
 *     here for the life of the process, and its marker, a cuStreamWriteValue32
 *     on the launch's stream: a memory-op node right after the kernel node
 *     (written at every replay when that kernel has completed);
 *   capture ends (API enter of cuStreamEndCapture, still capturing): a memset
 *     of every slot of the capture to 0, captured last on the origin stream,
 *     where every forked stream has joined again: the last node of the graph.
 *
 * Markers are constants fixed at capture, so each replay must find its
 * slots clear: the memset at the end of the previous replay cleared them, and
 * replays of one graph executable never overlap (the driver orders each
 * launch of an executable behind its previous one). Between replays every
 * slot is 0; during a replay the start slot is set and each finished node's
 * slot; after a fault the stream stops, and the first node of each stream of
 * the capture whose slot is 0 did not finish: one node for a capture made on
 * one stream (a chain), a frontier for a fork/join capture. (Two executables
 * instantiated from one captured graph and replayed at once would share the
 * slots: not supported.)
 *
 * Which capture a replay runs: CUPTI's resource callback GRAPHEXEC_CREATED
 * pairs each executable with its graph, the end of the capture gave the
 * graph; cuGraphLaunch's record keeps the capture (graph_execs.c). A
 * graph captured before watching (or built by hand) has no entry: its
 * replay is reported as such, unless a capture of its context was running
 * (start marker set, nodes not all done): the replay is then paired with it,
 * and the report says it was matched so (the way when CUPTI refused the
 * resource ids).
 *
 * Memory: slots are the graph part of the context's buffer (watch_ring.c:
 * mapped once, never freed, so a graph executable may replay for the life of
 * the process); CD_GRAPH_NODES nodes in all, handed out in chunks of
 * CHUNK to one capture each; node records and capture entries are static and
 * never reused. Captures beyond that get no markers (counted). Everything a
 * report reads (cd_graph_unfinished, cd_graph_node) is static memory or
 * slots: no CUDA call, no lock, safe in a signal handler.
 */
#include "capture/capture.h"

#include <string.h>

#define CHUNK 64
#define N_CHUNKS (CD_GRAPH_NODES / CHUNK)
#define MAX_CAPTURES N_CHUNKS          /* each holds a chunk at least */

enum { CAP_OPEN = 1, CAP_CLOSING = 2, CAP_CLOSED = 3, CAP_BROKEN = 4 };

typedef struct {
    _Atomic int state;             /* CAP_*; 0 while being made */
    uint64_t id;                   /* the driver's capture id */
    int ctx;                       /* watch_ring.c's context entry, and its generation */
    uint32_t ctx_gen;
    uintptr_t origin;              /* the stream that began it */
    _Atomic uintptr_t graph;       /* its CUgraph, from the end of the capture */
    uint32_t start;                /* node of the start marker */
    _Atomic uint32_t n_nodes;      /* kernel nodes */
    _Atomic int multi;             /* nodes captured on more than one stream */
    _Atomic uint32_t unmarked;     /* kernel nodes without a marker */
    int chunk;                     /* the chunk being filled (-1 none), and its use */
    uint32_t chunk_used;
} capture_t;

typedef struct {
    uint32_t index;                /* kernel node number in its capture (0, 1, ...) */
    uint8_t start;                 /* the start marker, not a kernel */
} node_info;

static capture_t caps[MAX_CAPTURES];
static atomic_int n_caps;
static cd_watch_record nodes[CD_GRAPH_NODES];   /* seq = node + 1 once written */
static node_info info[CD_GRAPH_NODES];
static _Atomic uint16_t chunk_owner[N_CHUNKS];  /* 1 + capture; 0 free */
static _Atomic uint32_t chunk_fill[N_CHUNKS];   /* nodes handed out in it */
static unsigned next_chunk;                     /* under graph_lock */
static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint_fast64_t n_nodes_marked, n_nodes_unmarked, n_captures_untracked;
static atomic_int clear_rc, write_rc;  /* the last refused memset / stream write */
static _Thread_local uint64_t tls_cap_id;
static _Thread_local int tls_cap = -1;

#define SLOT(g) (CD_WATCH_SLOTS + (size_t)(g))
#define MARK(g) ((uint32_t)(g) + 1u)

/* The capture's id of a stream capturing now: 0, or -1. */
static int capture_id(CUstream s, uint64_t *id)
{
    if (!cd_drv.cuStreamGetCaptureInfo)
        return -1;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t v = 0;
#if CUDA_VERSION >= 12030
    CUresult rc = cd_drv.cuStreamGetCaptureInfo(s, &st, &v, NULL, NULL, NULL, NULL);
#else
    CUresult rc = cd_drv.cuStreamGetCaptureInfo(s, &st, &v, NULL, NULL, NULL);
#endif
    if (rc != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return -1;
    *id = v;
    return 0;
}

/* The open capture of a capture id, or -1. */
static int find_capture(uint64_t id)
{
    if (tls_cap >= 0 && tls_cap_id == id && atomic_load(&caps[tls_cap].state) == CAP_OPEN)
        return tls_cap;
    int n = atomic_load_explicit(&n_caps, memory_order_acquire);
    for (int c = n - 1; c >= 0; c--)
        if (caps[c].id == id && atomic_load(&caps[c].state) == CAP_OPEN) {
            tls_cap = c;
            tls_cap_id = id;
            return c;
        }
    return -1;
}

/* A node for capture c, or -1 when all are handed out (graph_lock held). */
static long take_node(int c)
{
    capture_t *k = &caps[c];
    if (k->chunk < 0 || k->chunk_used == CHUNK) {
        if (next_chunk >= N_CHUNKS)
            return -1;
        k->chunk = (int)next_chunk++;
        k->chunk_used = 0;
        atomic_store(&chunk_owner[k->chunk], (uint16_t)(c + 1));
    }
    long g = (long)k->chunk * CHUNK + k->chunk_used++;
    atomic_store(&chunk_fill[k->chunk], k->chunk_used);
    return g;
}

/* CUDA_DEBUG_GRAPH_MARKERS=kernel: the marker is a one-thread kernel node
 * that stores the number and fences at system scope, instead of a stream
 * write (a memory-op node). Loaded per context at the entry of a capture's
 * beginning (the stream not capturing yet; cold), from this PTX (JIT-compiled
 * by the driver once). */
static const char marker_ptx[] =
    ".version 7.0\n.target sm_70\n.address_size 64\n"
    ".visible .entry cd_graph_marker(.param .u64 p, .param .u32 v)\n{\n"
    "  .reg .b32 %r<2>;\n  .reg .b64 %rd<2>;\n"
    "  ld.param.u64 %rd1, [p];\n  ld.param.u32 %r1, [v];\n"
    "  st.volatile.u32 [%rd1], %r1;\n  membar.sys;\n  ret;\n}\n";
static struct {
    CUfunction fn;
    uint32_t gen;                  /* of the context entry it was loaded for */
} marker_kernels[CD_MAX_CONTEXTS];
static _Thread_local int tls_marking;   /* our own marker launch: not a node */
static atomic_int kernel_rc;            /* the last failed load or launch */

void cd_graph_capture_beginning(const CUpti_CallbackData *cb)
{
    int ci = cd_watch_context_index(cb);    /* slots for the context, before it captures */
    if (ci < 0 || cd_state.graph_markers != CD_MARKERS_KERNEL)
        return;
    uint32_t gen = cd_watch_context_gen(ci);
    pthread_mutex_lock(&graph_lock);
    if (!marker_kernels[ci].fn || marker_kernels[ci].gen != gen) {
        CUmodule mod;
        CUfunction fn = NULL;
        int rc = CU_CHECK(cd_drv.cuModuleLoadData(&mod, marker_ptx));
        if (rc == 0 && (rc = CU_CHECK(cd_drv.cuModuleGetFunction(&fn, mod, "cd_graph_marker"))))
            fn = NULL;
        if (rc)
            atomic_store(&kernel_rc, rc);
        marker_kernels[ci].fn = fn;
        marker_kernels[ci].gen = gen;
    }
    pthread_mutex_unlock(&graph_lock);
}

/* Enqueue node g's marker on s (captured as a node): 0 or the CUresult. */
static CUresult write_marker(const capture_t *k, CUstream s, long g)
{
    volatile uint32_t *host;
    CUdeviceptr dev;
    if (cd_watch_context_slots(k->ctx, k->ctx_gen, &host, &dev) != 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUdeviceptr at = dev + SLOT(g) * sizeof(uint32_t);
    CUfunction fn = marker_kernels[k->ctx].gen == k->ctx_gen ? marker_kernels[k->ctx].fn : NULL;
    if (cd_state.graph_markers == CD_MARKERS_KERNEL && fn) {
        uint32_t v = MARK(g);
        void *params[2] = {&at, &v};
        tls_marking = 1;            /* its own launch callback must not make it a node */
        CUresult rc = cd_drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
        tls_marking = 0;
        if (rc == CUDA_SUCCESS)
            return rc;
        atomic_store(&kernel_rc, (int)rc);  /* refused: a stream write instead */
    }
    return cd_drv.cuStreamWriteValue32(s, at, MARK(g), CU_STREAM_WRITE_VALUE_DEFAULT);
}

static void publish(long g, cd_watch_record *r)
{
    atomic_store_explicit(&r->seq, (uint64_t)g + 1, memory_order_release);
}

/* ------------------------------------------------------- the capture -- */

void cd_graph_capture_begun(const CUpti_CallbackData *cb, CUstream s)
{
    uint64_t id;
    int ci = cd_watch_context_find(cb->contextUid);
    if (capture_id(s, &id) != 0 || ci < 0) {
        atomic_fetch_add(&n_captures_untracked, 1);
        return;
    }
    pthread_mutex_lock(&graph_lock);
    int c = atomic_load(&n_caps);
    long g = -1;
    if (c < MAX_CAPTURES) {
        capture_t *k = &caps[c];
        memset(k, 0, sizeof *k);
        k->id = id;
        k->ctx = ci;
        k->ctx_gen = cd_watch_context_gen(ci);
        k->origin = (uintptr_t)s;
        k->chunk = -1;
        g = take_node(c);
    }
    if (g < 0) {
        pthread_mutex_unlock(&graph_lock);
        atomic_fetch_add(&n_captures_untracked, 1);
        return;
    }
    capture_t *k = &caps[c];
    k->start = (uint32_t)g;
    info[g].start = 1;
    info[g].index = 0;
    memset(&nodes[g], 0, sizeof nodes[g]);
    nodes[g].stream = (uintptr_t)s;
    nodes[g].graph = (uint16_t)(c + 1);
    CUresult rc = write_marker(k, s, g);
    if (rc != CUDA_SUCCESS)
        atomic_store(&write_rc, (int)rc);
    atomic_store(&k->state, rc == CUDA_SUCCESS ? CAP_OPEN : CAP_BROKEN);
    publish(g, &nodes[g]);
    atomic_store_explicit(&n_caps, c + 1, memory_order_release);
    pthread_mutex_unlock(&graph_lock);
}

int cd_graph_launch_captured(const CUpti_CallbackData *cb, CUpti_CallbackId cbid, CUstream s)
{
    uint64_t id;
    int c;
    if (tls_marking)
        return 1;                   /* a marker kernel of ours */
    if (capture_id(s, &id) != 0 || (c = find_capture(id)) < 0)
        return 0;                   /* begun before watching, or not tracked */
    capture_t *k = &caps[c];
    pthread_mutex_lock(&graph_lock);
    long g = take_node(c);
    uint32_t index = atomic_fetch_add(&k->n_nodes, 1);
    if ((uintptr_t)s != k->origin)
        atomic_store(&k->multi, 1);
    pthread_mutex_unlock(&graph_lock);
    if (g < 0) {                    /* every node handed out: this one has no marker */
        atomic_fetch_add(&k->unmarked, 1);
        atomic_fetch_add(&n_nodes_unmarked, 1);
        return 1;
    }
    cd_watch_record *r = &nodes[g];
    cd_watch_fill(r, cb, cbid, s);
    r->graph = (uint16_t)(c + 1);
    r->ctx = (uint16_t)k->ctx;
    r->ctx_gen = (uint16_t)k->ctx_gen;
    r->flags |= CD_WATCH_CAPTURED;
    info[g].index = index;
    info[g].start = 0;
    CUresult rc = write_marker(k, s, g);
    if (rc == CUDA_SUCCESS) {
        r->flags |= CD_WATCH_MARKED;
        atomic_fetch_add(&n_nodes_marked, 1);
    } else {
        atomic_store(&write_rc, (int)rc);
        atomic_fetch_add(&k->unmarked, 1);
        atomic_fetch_add(&n_nodes_unmarked, 1);
    }
    publish(g, r);
    return 1;
}

/* Every slot of capture c set to 0 on stream s, the chunks that follow one
 * another in one memset each: 0, or the first failure. */
static CUresult clear_slots(int c, CUstream s)
{
    const capture_t *k = &caps[c];
    volatile uint32_t *host;
    CUdeviceptr dev;
    if (cd_watch_context_slots(k->ctx, k->ctx_gen, &host, &dev) != 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (unsigned ch = 0; ch < N_CHUNKS; ch++) {
        if (atomic_load(&chunk_owner[ch]) != c + 1)
            continue;
        unsigned first = ch;
        size_t n = 0;
        while (ch < N_CHUNKS && atomic_load(&chunk_owner[ch]) == c + 1) {
            n += atomic_load(&chunk_fill[ch]);
            if (atomic_load(&chunk_fill[ch]) < CHUNK)
                break;
            ch++;
        }
        CUdeviceptr at = dev + SLOT((size_t)first * CHUNK) * sizeof(uint32_t);
        CUresult rc = cd_drv.cuMemsetD32Async(at, 0, n, s);
        if (rc != CUDA_SUCCESS) {
            /* A memset refused here: stream writes of 0 (a node each: slower
             * replays, still correct). */
            atomic_store(&clear_rc, (int)rc);
            for (size_t i = 0; i < n; i++)
                if ((rc = cd_drv.cuStreamWriteValue32(s, at + i * sizeof(uint32_t), 0,
                                                      CU_STREAM_WRITE_VALUE_DEFAULT)))
                    return rc;
        }
    }
    return CUDA_SUCCESS;
}

void cd_graph_capture_ending(const CUpti_CallbackData *cb, CUstream s)
{
    uint64_t id;
    int c;
    *cb->correlationData = 0;
    if (!atomic_load(&n_caps) || capture_id(s, &id) != 0 || (c = find_capture(id)) < 0)
        return;
    pthread_mutex_lock(&graph_lock);   /* no node is being added while the chunks are read */
    CUresult rc = clear_slots(c, s);
    pthread_mutex_unlock(&graph_lock);
    atomic_store(&caps[c].state, rc == CUDA_SUCCESS ? CAP_CLOSING : CAP_BROKEN);
    *cb->correlationData = (uint64_t)c + 1;    /* for the exit callback */
}

void cd_graph_capture_ended(const CUpti_CallbackData *cb, CUgraph graph)
{
    uint64_t c1 = *cb->correlationData;
    if (!c1 || c1 > MAX_CAPTURES)
        return;
    capture_t *k = &caps[c1 - 1];
    int ok = *(const CUresult *)cb->functionReturnValue == CUDA_SUCCESS && graph &&
             atomic_load(&k->state) == CAP_CLOSING;
    if (ok)
        atomic_store(&k->graph, (uintptr_t)graph);
    atomic_store(&k->state, ok ? CAP_CLOSED : CAP_BROKEN);
}

/* --------------------------------------------- executables and replays -- */

void cd_graph_exec_created(CUgraph graph, CUgraphExec exec)
{
    if (!exec)
        return;
    uint32_t c1 = 0;
    int n = atomic_load(&n_caps);
    for (int c = n - 1; c >= 0 && graph; c--)          /* the newest holder of the handle */
        if (atomic_load(&caps[c].graph) == (uintptr_t)graph &&
            atomic_load(&caps[c].state) == CAP_CLOSED) {
            c1 = (uint32_t)c + 1;
            break;
        }
    cd_graph_exec_set(exec, c1);
}

void cd_graph_exec_destroyed(CUgraphExec exec) { cd_graph_exec_set(exec, 0); }

void cd_graph_destroyed(CUgraph graph)
{
    int n = atomic_load(&n_caps);
    for (int c = 0; c < n && graph; c++)
        atomic_compare_exchange_strong(&caps[c].graph, &(uintptr_t){(uintptr_t)graph}, 0);
}

/* ------------------------------------------------ reading (no CUDA call) -- */

/* 1 when node g's marker is in its slot, 0 when not, -1 unknown (no marker,
 * or its context is gone). */
static int node_done(long g)
{
    const cd_watch_record *r = &nodes[g];
    if (atomic_load_explicit(&r->seq, memory_order_acquire) != (uint64_t)g + 1)
        return -1;
    int c = r->graph - 1;
    if (c < 0 || c >= MAX_CAPTURES)
        return -1;
    if (!info[g].start && !(r->flags & CD_WATCH_MARKED))
        return -1;
    volatile uint32_t *host;
    if (cd_watch_context_slots(caps[c].ctx, caps[c].ctx_gen, &host, NULL) != 0)
        return -1;
    return host[SLOT(g)] == MARK(g);
}

/* Per stream of capture c, the first kernel node (capture order) whose
 * marker is missing, into out (at most max); the count. */
static int frontier(int c, uint32_t *out, int max)
{
    uintptr_t streams[64];
    int n_streams = 0, n = 0;
    for (unsigned ch = 0; ch < N_CHUNKS && n < max; ch++) {
        if (atomic_load(&chunk_owner[ch]) != c + 1)
            continue;
        uint32_t fill = atomic_load(&chunk_fill[ch]);
        for (uint32_t i = 0; i < fill && n < max; i++) {
            long g = (long)ch * CHUNK + i;
            if (info[g].start || node_done(g) != 0)
                continue;
            uintptr_t st = nodes[g].stream;
            int seen = 0;
            for (int j = 0; j < n_streams; j++)
                seen |= streams[j] == st;
            if (seen)
                continue;
            if (n_streams < 64)
                streams[n_streams++] = st;
            out[n++] = (uint32_t)g;
        }
    }
    return n;
}

static int started(int c) { return node_done(caps[c].start) == 1; }

int cd_graph_unfinished(const cd_watch_record *replay, uint32_t *out, int max, int *status,
                        int *capture)
{
    *status = CD_GRAPH_NO_MARKERS;
    *capture = -1;
    int c = replay->graph - 1;
    int n_all = atomic_load_explicit(&n_caps, memory_order_acquire);
    if (c < 0) {
        /* CUPTI did not say which graph this executable runs (resource ids
         * refused; or it was not captured while watching): the capture of
         * this context whose replay started and did not finish, if any */
        for (int k = n_all - 1; k >= 0 && c < 0; k--)
            if (caps[k].ctx == replay->ctx && caps[k].ctx_gen == replay->ctx_gen &&
                atomic_load(&caps[k].state) == CAP_CLOSED && started(k) &&
                frontier(k, out, 1) > 0)
                c = k;
        if (c >= 0)
            *status = CD_GRAPH_MATCHED;
    }
    if (c < 0 || c >= n_all)
        return 0;
    *capture = c;
    int state = atomic_load(&caps[c].state);
    if (state != CAP_CLOSED) {
        *status = state == CAP_BROKEN ? CD_GRAPH_BROKEN : CD_GRAPH_NOT_CLOSED;
        return 0;
    }
    if (!started(c)) {
        *status = CD_GRAPH_NOT_STARTED;
        return 0;
    }
    int n = frontier(c, out, max);
    if (*status != CD_GRAPH_MATCHED)
        *status = n ? CD_GRAPH_FOUND : CD_GRAPH_ALL_DONE;
    return n;
}

int cd_graph_node(uint32_t g, cd_watch_record *out, uint32_t *index, int *done)
{
    if (g >= CD_GRAPH_NODES || info[g].start)
        return -1;
    const cd_watch_record *r = &nodes[g];
    if (atomic_load_explicit(&r->seq, memory_order_acquire) != (uint64_t)g + 1)
        return -1;
    *out = *r;
    *index = info[g].index;
    *done = node_done(g);
    return 0;
}

int cd_graph_capture(int c, cd_graph_capture_info *out)
{
    if (c < 0 || c >= atomic_load_explicit(&n_caps, memory_order_acquire))
        return -1;
    const capture_t *k = &caps[c];
    out->id = k->id;
    out->n_nodes = atomic_load(&k->n_nodes);
    out->multi_stream = atomic_load(&k->multi);
    out->unmarked = atomic_load(&k->unmarked);
    out->state = atomic_load(&k->state);
    out->origin = k->origin;
    return 0;
}

void cd_graph_stats(cd_graph_counters *out)
{
    out->nodes_marked = atomic_load(&n_nodes_marked);
    out->nodes_unmarked = atomic_load(&n_nodes_unmarked);
    out->captures_untracked = atomic_load(&n_captures_untracked);
    out->captures = atomic_load(&n_caps);
    out->clear_rc = atomic_load(&clear_rc);
    out->write_rc = atomic_load(&write_rc);
    out->kernel_rc = atomic_load(&kernel_rc);
}

void cd_graph_markers_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        graph_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
        tls_cap = -1;              /* the forking thread's capture is the parent's */
        tls_cap_id = 0;
        break;
    case CD_FORK_TEST_TAKE:
        pthread_mutex_lock(&graph_lock);
        break;
    case CD_FORK_TEST_GIVE:
        pthread_mutex_unlock(&graph_lock);
        break;
    }
}
