/*
 * capture/graph_markers.c: completion markers inside CUDA graphs (watch mode).
 *
 * A graph replay is one cuGraphLaunch: one ring record (watch_ring.c). To
 * name the node that faulted, or the one still running in a hang, each launch
 * captured into a graph while watching gets a node record, and every K-th
 * launch of each stream of the capture (K = CUDA_DEBUG_GRAPH_MARKER_EVERY,
 * default 8: 1.008x a transformer step's replay on the H200, against 1.051x
 * with K = 1), and every NCCL kernel, a marker captured into the graph right
 * behind it:
 *
 *   capture begins (API exit of cuStreamBeginCapture*, the stream now
 *     capturing): an entry for the capture (the driver's capture id), and a
 *     start marker on the capturing stream: the root node of the graph,
 *     written first at every replay;
 *   a launch on a capturing stream (hooks/launch_callback.c): a node record,
 *     like a ring record (kernel, grid, the capturing thread's frames, and its
 *     innermost CD_NODE_FRAMES of any kind: torch.compile's generated code); for
 *     every K-th launch of its stream, its marker (a one-thread kernel node,
 *     or a stream write: CUDA_DEBUG_GRAPH_MARKERS) right after the kernel node
 *     (written at every replay once that kernel, and every node before it on
 *     that stream, has completed);
 *   capture ends (API enter of cuStreamEndCapture, still capturing): a memset
 *     of every slot of the capture to 0, captured last on the origin stream,
 *     where every forked stream has joined again: the last node of the graph.
 *
 * Markers are constants fixed at capture, so each replay must find its
 * slots clear: the memset at the end of the previous replay cleared them, and
 * replays of one graph executable never overlap (the driver orders each
 * launch of an executable behind its previous one). After a fault the stream
 * stops. Per stream of the capture (nodes of a stream run in capture order),
 * the nodes after the last one whose marker is set, up to the first marked
 * node whose marker is missing, are the candidates: the faulting or running
 * node is one of them (K at most; exactly one with K = 1). A fork/join
 * capture gives candidates on each stream. (Two executables instantiated from
 * one captured graph and replayed at once would share the slots: not
 * supported.)
 *
 * Which capture a replay runs: CUPTI's resource callback GRAPHEXEC_CREATED
 * pairs each executable with its graph (the end of the capture gave the
 * graph, GRAPH_CLONED its clones); cuGraphLaunch's record keeps the capture's
 * token (graph_execs.c). A graph captured before watching has no markers: it
 * is known only when Python adopted it at the end of its capture
 * (cd_graph_adopt: its kernels, from the driver's graph API, and the line
 * that captured it); its replay is reported as such. When CUPTI refused the
 * resource ids, a replay of an unknown executable is paired with the capture
 * of its context whose replay started and did not finish, if any, and the
 * report says it was matched so.
 *
 * Memory: slots are the graph part of the context's buffer (watch_ring.c:
 * mapped once, never freed); CD_GRAPH_NODES node records (96 bytes, and 88
 * bytes of node_info: the deeper frames) and slots in all, zero pages until used,
 * handed out in chunks of CHUNK to one capture each. A capture, its chunks and
 * its entry are freed when its graph, its clones and every executable made
 * from them are destroyed (CUPTI's resource callbacks while watching; Python,
 * for the graphs of torch.cuda.CUDAGraph objects, when the object goes), and
 * taken again by later captures: a process that captures and destroys graphs
 * for days stays watched. Each reuse moves the chunk's generation, which is
 * part of every marker value and of the capture's token, so a stale graph
 * still running, or a stale record, never passes for a new one. When every
 * chunk is in use, nodes get no record (counted). Everything a report reads
 * (cd_graph_unfinished, cd_graph_node, cd_graph_capture) is static memory or
 * slots: no CUDA call, no lock, safe in a signal handler.
 */
#include "capture/capture.h"

#include <stdlib.h>
#include <string.h>

#define CHUNK 64
#define N_CHUNKS (CD_GRAPH_NODES / CHUNK)
#define MAX_CAPTURES N_CHUNKS          /* each holds a chunk at least */
#define CAP_BITS 11                    /* MAX_CAPTURES == 1 << CAP_BITS */
#define TOKEN_GENS 31                  /* a token: 1 + ((gen % 31) << CAP_BITS | entry) */
#define CAP_STREAMS 16                 /* streams a capture spaces markers on; more: every node */
#define CAP_CLONES 4                   /* clones followed; more: the capture is never freed */

_Static_assert(MAX_CAPTURES == 1 << CAP_BITS, "capture tokens");
_Static_assert((TOKEN_GENS - 1) * MAX_CAPTURES + MAX_CAPTURES <= 65535, "tokens fit 16 bits");

enum { CAP_FREE = 0, CAP_OPEN = 1, CAP_CLOSING = 2, CAP_CLOSED = 3, CAP_BROKEN = 4,
       CAP_ADOPTED = 5 };

typedef struct {
    _Atomic int state;             /* CAP_*; FREE while being made */
    _Atomic uint32_t gen;          /* moves each time the entry is taken */
    uint64_t id;                   /* the driver's capture id */
    int ctx;                       /* watch_ring.c's context entry, and its generation */
    uint32_t ctx_gen;
    uintptr_t origin;              /* the stream that began it */
    _Atomic uintptr_t graph;       /* its CUgraph, from the end of the capture; 0 destroyed */
    _Atomic uintptr_t clones[CAP_CLONES];
    int refs;                      /* graph, clones, executables alive (graph_lock) */
    int pinned;                    /* a clone not followed: never freed */
    uint32_t start;                /* node of the start marker */
    uint32_t every;                /* marker spacing (K) when captured */
    _Atomic uint32_t n_nodes;      /* kernel nodes */
    _Atomic int multi;             /* nodes captured on more than one stream */
    _Atomic uint32_t unmarked;     /* kernel nodes without a record (no room, a refused write) */
    int chunk;                     /* the chunk being filled (-1 none), and its use */
    uint32_t chunk_used;
    struct {
        uintptr_t stream;
        uint32_t n;                /* its launches so far */
    } streams[CAP_STREAMS];
    int n_streams;
    _Atomic uint32_t exec_ids[CAP_CLONES];  /* its executables' ids for tools (CUDA 13.1) */
} capture_t;

typedef struct {
    uint32_t index;                /* kernel node number in its capture (0, 1, ...) */
    uint32_t gen;                  /* the chunk's generation when written */
    uint8_t start;                 /* the start marker, not a kernel */
    uint8_t n_deep;
    uint32_t deep[CD_NODE_FRAMES]; /* the capturing thread's innermost frames, all kinds */
    unsigned long long tools_id;   /* the driver's id of its node for tools (CUDA 13.1), 0 */
} node_info;

static capture_t caps[MAX_CAPTURES];
static atomic_int caps_hw;                      /* entries [0, caps_hw) may be in use */
static unsigned cap_cursor;                     /* next entry to try (graph_lock) */
static cd_watch_record nodes[CD_GRAPH_NODES];   /* seq = node + 1 once written */
static node_info info[CD_GRAPH_NODES];
static _Atomic uint16_t chunk_owner[N_CHUNKS];  /* the capture's token; 0 free */
static _Atomic uint32_t chunk_fill[N_CHUNKS];   /* nodes handed out in it */
static _Atomic uint32_t chunk_gen[N_CHUNKS];    /* moves at each reuse */
static unsigned chunk_cursor;                   /* under graph_lock */
static atomic_uint n_chunks_used;
static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint_fast64_t n_nodes_marked, n_nodes_unmarked, n_captures_untracked,
    n_captures_freed, n_nodes_recorded;
static atomic_int clear_rc, write_rc;  /* the last refused memset / stream write */
static atomic_int adopt_rc;            /* the last failed graph API call of an adoption */
static _Thread_local uint64_t tls_cap_id;
static _Thread_local int tls_cap = -1;

#define SLOT(g) (CD_WATCH_SLOTS + (size_t)(g))
/* Node g's marker value in a chunk of generation gen: never 0. */
#define MARK(g, gen) ((((uint32_t)(gen) & 0x3FFFu) << 17 | (uint32_t)(g)) + 1u)

static uint16_t token_of(int c, uint32_t gen)
{
    return (uint16_t)(1u + ((gen % TOKEN_GENS) << CAP_BITS | (uint32_t)c));
}

/* The entry of a live capture's token, or -1 (gone, or another generation). */
static int entry_of(uint32_t token)
{
    if (!token || token > 0xFFFF)
        return -1;
    int c = (int)((token - 1) & (MAX_CAPTURES - 1));
    if (token_of(c, atomic_load_explicit(&caps[c].gen, memory_order_acquire)) != token ||
        atomic_load_explicit(&caps[c].state, memory_order_acquire) == CAP_FREE)
        return -1;
    return c;
}

static uint16_t token_now(int c) { return token_of(c, atomic_load(&caps[c].gen)); }

/* The capture's id of a stream capturing now: 0, or -1; with `deps`, the
 * nodes the stream's next node would depend on (after a launch: its node). */
static int capture_info(CUstream s, uint64_t *id, CUgraph *graph, const CUgraphNode **deps,
                        size_t *n_deps)
{
    if (!cd_drv.cuStreamGetCaptureInfo)
        return -1;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t v = 0;
#if CUDA_VERSION >= 12030
    CUresult rc = cd_drv.cuStreamGetCaptureInfo(s, &st, &v, graph, deps, NULL, n_deps);
#else
    CUresult rc = cd_drv.cuStreamGetCaptureInfo(s, &st, &v, graph, deps, n_deps);
#endif
    if (rc != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return -1;
    *id = v;
    return 0;
}

static int capture_id(CUstream s, uint64_t *id, CUgraph *graph)
{
    return capture_info(s, id, graph, NULL, NULL);
}

/* The open capture of a capture id, or -1. */
static int find_capture(uint64_t id)
{
    if (tls_cap >= 0 && tls_cap_id == id && atomic_load(&caps[tls_cap].state) == CAP_OPEN &&
        caps[tls_cap].id == id)
        return tls_cap;
    int n = atomic_load_explicit(&caps_hw, memory_order_acquire);
    for (int c = n - 1; c >= 0; c--)
        if (atomic_load(&caps[c].state) == CAP_OPEN && caps[c].id == id) {
            tls_cap = c;
            tls_cap_id = id;
            return c;
        }
    return -1;
}

/* ------------------------------------------------------------ chunks -- */

/* A free chunk for capture c, the one after `prefer` if free (so a capture's
 * slots run on and one memset clears them), or -1 (graph_lock held). Its node
 * records are unpublished, its slots cleared, its generation moved. */
static int take_chunk(int c, int prefer)
{
    int ch = -1;
    if (prefer >= 0 && prefer < N_CHUNKS && !atomic_load(&chunk_owner[prefer]))
        ch = prefer;
    for (unsigned i = 0; ch < 0 && i < N_CHUNKS; i++) {
        unsigned k = (chunk_cursor + i) % N_CHUNKS;
        if (!atomic_load(&chunk_owner[k]))
            ch = (int)k;
    }
    if (ch < 0)
        return -1;
    chunk_cursor = (unsigned)ch + 1;
    uint32_t gen = atomic_load(&chunk_gen[ch]) + 1;
    volatile uint32_t *host = NULL;
    cd_watch_context_slots(caps[c].ctx, caps[c].ctx_gen, &host, NULL);
    for (int i = 0; i < CHUNK; i++) {
        long g = (long)ch * CHUNK + i;
        atomic_store_explicit(&nodes[g].seq, 0, memory_order_release);
        if (host)
            host[SLOT(g)] = 0;
    }
    atomic_store(&chunk_gen[ch], gen);
    atomic_store(&chunk_fill[ch], 0);
    atomic_store_explicit(&chunk_owner[ch], token_now(c), memory_order_release);
    atomic_fetch_add(&n_chunks_used, 1);
    return ch;
}

/* A node for capture c, or -1 when every chunk is in use (graph_lock held). */
static long take_node(int c)
{
    capture_t *k = &caps[c];
    if (k->chunk < 0 || k->chunk_used == CHUNK) {
        int ch = take_chunk(c, k->chunk < 0 ? -1 : k->chunk + 1);
        if (ch < 0)
            return -1;
        k->chunk = ch;
        k->chunk_used = 0;
    }
    long g = (long)k->chunk * CHUNK + k->chunk_used++;
    info[g].gen = atomic_load(&chunk_gen[k->chunk]);
    atomic_store(&chunk_fill[k->chunk], k->chunk_used);
    return g;
}

/* Every chunk of capture c back to the pool, the entry free (graph_lock held). */
static void release_locked(int c)
{
    capture_t *k = &caps[c];
    uint16_t token = token_now(c);
    for (int ch = 0; ch < N_CHUNKS; ch++)
        if (atomic_load(&chunk_owner[ch]) == token) {
            atomic_store_explicit(&chunk_owner[ch], 0, memory_order_release);
            atomic_fetch_sub(&n_chunks_used, 1);
        }
    atomic_store(&k->graph, 0);
    for (int i = 0; i < CAP_CLONES; i++)
        atomic_store(&k->clones[i], 0);
    atomic_store_explicit(&k->state, CAP_FREE, memory_order_release);
    atomic_fetch_add(&n_captures_freed, 1);
    if (tls_cap == c)
        tls_cap = -1;
}

static void unref_locked(int c)
{
    if (--caps[c].refs <= 0 && !caps[c].pinned)
        release_locked(c);
}

/* A free capture entry, taken (state still FREE), or -1 (graph_lock held). */
static int take_entry(void)
{
    for (unsigned i = 0; i < MAX_CAPTURES; i++) {
        unsigned c = (cap_cursor + i) % MAX_CAPTURES;
        if (atomic_load(&caps[c].state) != CAP_FREE)
            continue;
        cap_cursor = c + 1;
        capture_t *k = &caps[c];
        uint32_t gen = atomic_load(&k->gen) + 1;
        memset(k, 0, sizeof *k);
        atomic_store(&k->gen, gen);
        k->chunk = -1;
        if ((int)c >= atomic_load(&caps_hw))
            atomic_store_explicit(&caps_hw, (int)c + 1, memory_order_release);
        return (int)c;
    }
    return -1;
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
    int ci = cd_watch_context_index(cb->context, cb->contextUid);  /* slots, before it captures */
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
    uint32_t v = MARK(g, info[g].gen);
    CUfunction fn = marker_kernels[k->ctx].gen == k->ctx_gen ? marker_kernels[k->ctx].fn : NULL;
    if (cd_state.graph_markers == CD_MARKERS_KERNEL && fn) {
        void *params[2] = {&at, &v};
        tls_marking = 1;            /* its own launch callback must not make it a node */
        CUresult rc = cd_drv.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, s, params, NULL);
        tls_marking = 0;
        if (rc == CUDA_SUCCESS)
            return rc;
        atomic_store(&kernel_rc, (int)rc);  /* refused: a stream write instead */
    }
    return cd_drv.cuStreamWriteValue32(s, at, v, CU_STREAM_WRITE_VALUE_DEFAULT);
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
    if (capture_id(s, &id, NULL) != 0 || ci < 0) {
        atomic_fetch_add(&n_captures_untracked, 1);
        return;
    }
    pthread_mutex_lock(&graph_lock);
    int c = take_entry();
    long g = -1;
    if (c >= 0) {
        capture_t *k = &caps[c];
        k->id = id;
        k->ctx = ci;
        k->ctx_gen = cd_watch_context_gen(ci);
        k->origin = (uintptr_t)s;
        /* watch(exact=True) (a marker behind every launch): every node too */
        k->every = atomic_load(&cd_state.watch_every) == 1 || cd_state.graph_marker_every < 1
                       ? 1 : (uint32_t)cd_state.graph_marker_every;
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
    nodes[g].graph = token_now(c);
    CUresult rc = write_marker(k, s, g);
    if (rc != CUDA_SUCCESS) {      /* no start marker: its replays could not be told apart */
        atomic_store(&write_rc, (int)rc);
        atomic_store(&k->state, CAP_BROKEN);
        release_locked(c);
        pthread_mutex_unlock(&graph_lock);
        atomic_fetch_add(&n_captures_untracked, 1);
        return;
    }
    publish(g, &nodes[g]);
    atomic_store_explicit(&k->state, CAP_OPEN, memory_order_release);
    pthread_mutex_unlock(&graph_lock);
}

/* Capture c's launches so far on stream s, this one counted (graph_lock
 * held); with more streams than followed, every launch of the others counts
 * as a K-th one. */
static uint32_t stream_count(capture_t *k, uintptr_t s)
{
    for (int i = 0; i < k->n_streams; i++)
        if (k->streams[i].stream == s)
            return ++k->streams[i].n;
    if (k->n_streams == CAP_STREAMS)
        return 0;
    k->streams[k->n_streams].stream = s;
    k->streams[k->n_streams].n = 1;
    k->n_streams++;
    return 1;
}

int cd_graph_launch_captured(const cd_launch *l)
{
    CUstream s = l->stream;
    uint64_t id;
    int c;
    const CUgraphNode *deps = NULL;
    size_t n_deps = 0;
    if (tls_marking)
        return 1;                   /* a marker kernel of ours */
    if (capture_info(s, &id, NULL, cd_drv.cuGraphNodeGetToolsId ? &deps : NULL,
                     cd_drv.cuGraphNodeGetToolsId ? &n_deps : NULL) != 0 ||
        (c = find_capture(id)) < 0)
        return 0;                   /* begun before watching, or not tracked */
    capture_t *k = &caps[c];
    pthread_mutex_lock(&graph_lock);
    long g = take_node(c);
    uint32_t index = atomic_fetch_add(&k->n_nodes, 1);
    if ((uintptr_t)s != k->origin)
        atomic_store(&k->multi, 1);
    uint32_t n = stream_count(k, (uintptr_t)s);
    /* every K-th launch of the stream, and every NCCL kernel (the hang suspects) */
    int marked = k->every <= 1 || n == 0 || n % k->every == 0 || cd_nccl_kernel(l->symbol);
    uint16_t token = token_now(c);
    pthread_mutex_unlock(&graph_lock);
    if (g < 0) {                    /* every node handed out: this one has no record */
        atomic_fetch_add(&k->unmarked, 1);
        atomic_fetch_add(&n_nodes_unmarked, 1);
        return 1;
    }
    cd_watch_record *r = &nodes[g];
    cd_watch_fill(r, l, 1, NULL);
    r->graph = token;
    r->ctx = (uint16_t)k->ctx;
    r->ctx_gen = (uint16_t)k->ctx_gen;
    r->flags |= CD_WATCH_CAPTURED;
    info[g].index = index;
    info[g].start = 0;
    /* The record keeps the innermost frames and the user's; the frames between
     * (a torch.compile'd graph's generated code, whose line Inductor's line map
     * turns into the source line the kernel fused) are kept here. */
    int complete;
    info[g].n_deep = (uint8_t)cd_frames_capture(info[g].deep, CD_NODE_FRAMES, 0, &complete);
    info[g].tools_id = 0;
    if (n_deps == 1 && deps && deps[0] &&      /* the kernel's node: its id for tools */
        cd_drv.cuGraphNodeGetToolsId(deps[0], &info[g].tools_id) != CUDA_SUCCESS)
        info[g].tools_id = 0;
    atomic_fetch_add(&n_nodes_recorded, 1);
    if (marked) {
        CUresult rc = write_marker(k, s, g);
        if (rc == CUDA_SUCCESS) {
            r->flags |= CD_WATCH_MARKED;
            atomic_fetch_add(&n_nodes_marked, 1);
        } else {
            atomic_store(&write_rc, (int)rc);
            atomic_fetch_add(&k->unmarked, 1);
            atomic_fetch_add(&n_nodes_unmarked, 1);
        }
    }
    publish(g, r);
    return 1;
}

/* Every slot of capture c set to 0 on stream s, the chunks that follow one
 * another in one memset each: 0, or the first failure (graph_lock held). */
static CUresult clear_slots(int c, CUstream s)
{
    const capture_t *k = &caps[c];
    uint16_t token = token_now(c);
    volatile uint32_t *host;
    CUdeviceptr dev;
    if (cd_watch_context_slots(k->ctx, k->ctx_gen, &host, &dev) != 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (unsigned ch = 0; ch < N_CHUNKS; ch++) {
        if (atomic_load(&chunk_owner[ch]) != token)
            continue;
        unsigned first = ch;
        size_t n = 0;
        while (ch < N_CHUNKS && atomic_load(&chunk_owner[ch]) == token) {
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
    if (!atomic_load(&caps_hw) || capture_id(s, &id, NULL) != 0 || (c = find_capture(id)) < 0)
        return;
    pthread_mutex_lock(&graph_lock);   /* no node is being added while the chunks are read */
    CUresult rc = clear_slots(c, s);
    atomic_store(&caps[c].state, rc == CUDA_SUCCESS ? CAP_CLOSING : CAP_BROKEN);
    *cb->correlationData = token_now(c);    /* for the exit callback */
    pthread_mutex_unlock(&graph_lock);
}

void cd_graph_capture_ended(const CUpti_CallbackData *cb, CUgraph graph)
{
    int c = entry_of((uint32_t)*cb->correlationData);
    if (c < 0)
        return;
    pthread_mutex_lock(&graph_lock);
    capture_t *k = &caps[c];
    int ok = *(const CUresult *)cb->functionReturnValue == CUDA_SUCCESS && graph;
    if (ok) {                       /* the graph holds the markers, broken or not */
        atomic_store(&k->graph, (uintptr_t)graph);
        k->refs = 1;
        atomic_store(&k->state, atomic_load(&k->state) == CAP_CLOSING ? CAP_CLOSED : CAP_BROKEN);
    } else {
        release_locked(c);          /* no graph: nothing holds its slots */
    }
    pthread_mutex_unlock(&graph_lock);
}

/* --------------------------------------------- executables and replays -- */

/* The live capture whose graph (or a clone of it) is `graph`, newest first,
 * or -1 (graph_lock held). */
static int capture_of_graph(uintptr_t graph)
{
    int n = atomic_load(&caps_hw);
    for (int c = n - 1; c >= 0 && graph; c--) {
        int st = atomic_load(&caps[c].state);
        if (st != CAP_CLOSED && st != CAP_BROKEN)
            continue;
        if (atomic_load(&caps[c].graph) == graph)
            return c;
        for (int i = 0; i < CAP_CLONES; i++)
            if (atomic_load(&caps[c].clones[i]) == graph)
                return c;
    }
    return -1;
}

void cd_graph_exec_created(CUgraph graph, CUgraphExec exec)
{
    if (!exec)
        return;
    pthread_mutex_lock(&graph_lock);
    int c = capture_of_graph((uintptr_t)graph);
    uint32_t old = 0;
    if (c >= 0 && cd_graph_exec_set(exec, token_now(c), &old) == 0) {
        caps[c].refs++;
        int was = entry_of(old);   /* a destruction we did not see: that capture's hold goes */
        if (old && old != token_now(c) && was >= 0)
            unref_locked(was);
        unsigned id;
        if (cd_drv.cuGraphExecGetId && cd_drv.cuGraphExecGetId(exec, &id) == CUDA_SUCCESS)
            for (int i = 0; i < CAP_CLONES; i++)
                if (!atomic_load(&caps[c].exec_ids[i]) || i == CAP_CLONES - 1) {
                    atomic_store(&caps[c].exec_ids[i], id);
                    break;
                }
    }
    pthread_mutex_unlock(&graph_lock);
}

void cd_graph_exec_destroyed(CUgraphExec exec)
{
    uint32_t token = cd_graph_exec_take(exec);
    if (!token)
        return;
    pthread_mutex_lock(&graph_lock);
    int c = entry_of(token);
    if (c >= 0)
        unref_locked(c);
    pthread_mutex_unlock(&graph_lock);
}

void cd_graph_destroyed(CUgraph graph)
{
    if (!graph)
        return;
    pthread_mutex_lock(&graph_lock);
    int c = capture_of_graph((uintptr_t)graph);
    if (c >= 0) {
        if (atomic_load(&caps[c].graph) == (uintptr_t)graph)
            atomic_store(&caps[c].graph, 0);
        for (int i = 0; i < CAP_CLONES; i++)
            if (atomic_load(&caps[c].clones[i]) == (uintptr_t)graph)
                atomic_store(&caps[c].clones[i], 0);
        unref_locked(c);
    }
    pthread_mutex_unlock(&graph_lock);
}

void cd_graph_cloned(CUgraph original, CUgraph clone)
{
    if (!original || !clone)
        return;
    pthread_mutex_lock(&graph_lock);
    int c = capture_of_graph((uintptr_t)original);
    if (c >= 0) {
        int i = 0;
        while (i < CAP_CLONES && atomic_load(&caps[c].clones[i]))
            i++;
        if (i < CAP_CLONES) {
            atomic_store(&caps[c].clones[i], (uintptr_t)clone);
            caps[c].refs++;
        } else {
            caps[c].pinned = 1;     /* a holder of its markers we do not follow */
        }
    }
    pthread_mutex_unlock(&graph_lock);
}

int cd_graph_release_exec(CUgraphExec exec)
{
    uint32_t token = cd_graph_exec_token(exec);
    if (!token)
        return -1;
    cd_graph_exec_destroyed(exec);
    return 0;
}

/* ----------------------------------------- graphs captured before watch -- */

/* A capture made while nothing watched: its kernel nodes, from the graph being
 * captured on s (cuStreamGetCaptureInfo's graph; called by Python at the end
 * of the capture, s still capturing), each a node record with the kernel's name
 * and the frames of the calling thread (where it was captured); no markers.
 * Returns the capture's token (for cd_graph_adopt_exec), 0 when it could not
 * be read (adopt_rc says why), -1 when no capture entry is free, -2 when the
 * capture began while watching (tracked: nothing to adopt). */
long cd_graph_adopt(CUstream s)
{
    uint64_t id;
    CUgraph graph = NULL;
    if (!cd_drv.cuGraphGetNodes || !cd_drv.cuGraphNodeGetType || !cd_drv.cuGraphKernelNodeGetParams ||
        !cd_drv.cuFuncGetName) {
        atomic_store(&adopt_rc, CUDA_ERROR_NOT_SUPPORTED);
        return 0;
    }
    if (capture_id(s, &id, &graph) != 0 || !graph) {
        atomic_store(&adopt_rc, CUDA_ERROR_ILLEGAL_STATE);
        return 0;
    }
    if (find_capture(id) >= 0)
        return -2;                 /* begun while watching: its launches are nodes already */
    size_t n = 0;
    CUresult rc = cd_drv.cuGraphGetNodes(graph, NULL, &n);
    if (rc != CUDA_SUCCESS) {
        atomic_store(&adopt_rc, (int)rc);
        return 0;
    }
    uint32_t frames[CD_RING_FRAMES];
    int complete = 0;
    int n_frames = cd_frames_capture(frames, CD_RING_FRAMES, 1, &complete);
    pthread_mutex_lock(&graph_lock);
    int c = take_entry();
    if (c < 0) {
        pthread_mutex_unlock(&graph_lock);
        return -1;
    }
    capture_t *k = &caps[c];
    k->id = id;
    k->ctx = -1;
    k->origin = (uintptr_t)s;
    k->every = 0;
    uint16_t token = token_now(c);
    /* Nodes in the driver's order (the order they were captured in). */
    CUgraphNode *list = n ? malloc(n * sizeof *list) : NULL;
    size_t got = n;
    if (list && (rc = cd_drv.cuGraphGetNodes(graph, list, &got)) != CUDA_SUCCESS) {
        atomic_store(&adopt_rc, (int)rc);
        got = 0;
    }
    if (got > n)
        got = n;
    uint32_t index = 0;
    for (size_t i = 0; i < got; i++) {
        CUgraphNodeType type;
        if (cd_drv.cuGraphNodeGetType(list[i], &type) != CUDA_SUCCESS ||
            type != CU_GRAPH_NODE_TYPE_KERNEL)
            continue;
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        const char *name = NULL;
        if (cd_drv.cuGraphKernelNodeGetParams(list[i], &p) == CUDA_SUCCESS) {
            if (p.func)
                cd_drv.cuFuncGetName(&name, p.func);
            else if (p.kern && cd_drv.cuKernelGetName)
                cd_drv.cuKernelGetName(&name, p.kern);
        }
        long g = take_node(c);
        if (g < 0) {
            atomic_fetch_add(&k->unmarked, 1);
            index++;
            continue;
        }
        cd_watch_record *r = &nodes[g];
        memset(r, 0, sizeof *r);
        int origin;
        r->kernel = cd_intern_kernel(name ? name : "", &r->kernel_short, &origin, NULL);
        r->origin = (uint8_t)origin;
        r->grid[0] = p.gridDimX, r->grid[1] = p.gridDimY, r->grid[2] = p.gridDimZ;
        r->block[0] = p.blockDimX, r->block[1] = p.blockDimY, r->block[2] = p.blockDimZ;
        r->shared_mem = p.sharedMemBytes;
        r->stream = (uintptr_t)s;
        memcpy(r->frames, frames, sizeof frames);
        r->n_frames = (uint8_t)n_frames;
        r->flags = CD_WATCH_CAPTURED | (complete < 0 ? CD_WATCH_USER_LAST : 0);
        r->graph = token;
        r->ctx = 0xFFFF;
        info[g].index = index++;
        info[g].start = 0;
        info[g].n_deep = 0;
        info[g].tools_id = 0;
        if (cd_drv.cuGraphNodeGetToolsId &&
            cd_drv.cuGraphNodeGetToolsId(list[i], &info[g].tools_id) != CUDA_SUCCESS)
            info[g].tools_id = 0;
        publish(g, r);
    }
    free(list);
    atomic_store(&k->n_nodes, index);
    k->start = UINT32_MAX;
    k->refs = 0;                   /* its executables hold it (cd_graph_adopt_exec) */
    atomic_store_explicit(&k->state, CAP_ADOPTED, memory_order_release);
    pthread_mutex_unlock(&graph_lock);
    return token;
}

int cd_graph_adopt_exec(uint32_t token, CUgraphExec exec)
{
    pthread_mutex_lock(&graph_lock);
    int c = entry_of(token), rc = -1;
    uint32_t old = 0;
    if (c >= 0 && atomic_load(&caps[c].state) == CAP_ADOPTED &&
        cd_graph_exec_set(exec, token, &old) == 0) {
        caps[c].refs++;
        int was = entry_of(old);
        if (old && old != token && was >= 0)
            unref_locked(was);
        unsigned id;
        if (cd_drv.cuGraphExecGetId && cd_drv.cuGraphExecGetId(exec, &id) == CUDA_SUCCESS)
            for (int i = 0; i < CAP_CLONES; i++)
                if (!atomic_load(&caps[c].exec_ids[i]) || i == CAP_CLONES - 1) {
                    atomic_store(&caps[c].exec_ids[i], id);
                    break;
                }
        rc = 0;
    }
    pthread_mutex_unlock(&graph_lock);
    return rc;
}

void cd_graph_adopt_drop(uint32_t token)
{
    pthread_mutex_lock(&graph_lock);
    int c = entry_of(token);
    if (c >= 0 && atomic_load(&caps[c].state) == CAP_ADOPTED && caps[c].refs <= 0)
        release_locked(c);
    pthread_mutex_unlock(&graph_lock);
}

/* ------------------------------------------------ reading (no CUDA call) -- */

/* 1 when node g's marker is in its slot, 0 when not, -1 unknown (no marker,
 * or its context is gone). */
static int node_done(long g, uint16_t token)
{
    const cd_watch_record *r = &nodes[g];
    if (atomic_load_explicit(&r->seq, memory_order_acquire) != (uint64_t)g + 1 ||
        r->graph != token)
        return -1;
    int c = entry_of(token);
    if (c < 0)
        return -1;
    if (!info[g].start && !(r->flags & CD_WATCH_MARKED))
        return -1;
    volatile uint32_t *host;
    if (cd_watch_context_slots(caps[c].ctx, caps[c].ctx_gen, &host, NULL) != 0)
        return -1;
    return host[SLOT(g)] == MARK(g, info[g].gen);
}

/* Capture c's candidates: per stream (nodes of a stream ran in capture
 * order), the nodes after the last one known finished (its marker set), up
 * to the first marked one whose marker is missing; into out (at most max),
 * stream by stream, in capture order. The count. */
#define FRONTIER_STREAMS 64
static int frontier(int c, uint32_t *out, int max)
{
    uint16_t token = token_now(c);
    uintptr_t streams[FRONTIER_STREAMS];
    int32_t threads[FRONTIER_STREAMS];
    int64_t last_done[FRONTIER_STREAMS], first_missing[FRONTIER_STREAMS];
    int n_streams = 0, n = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (unsigned ch = 0; ch < N_CHUNKS && n < max; ch++) {
            if (atomic_load(&chunk_owner[ch]) != token)
                continue;
            uint32_t fill = atomic_load(&chunk_fill[ch]);
            for (uint32_t i = 0; i < fill && n < max; i++) {
                long g = (long)ch * CHUNK + i;
                const cd_watch_record *r = &nodes[g];
                if (info[g].start || atomic_load_explicit(&r->seq, memory_order_acquire) !=
                                         (uint64_t)g + 1 || r->graph != token)
                    continue;
                int32_t tid = r->stream == (uintptr_t)CU_STREAM_PER_THREAD ? r->thread_id : 0;
                int s = 0;
                while (s < n_streams && !(streams[s] == r->stream && threads[s] == tid))
                    s++;
                if (s == n_streams) {
                    if (pass || n_streams == FRONTIER_STREAMS)
                        continue;
                    streams[s] = r->stream;
                    threads[s] = tid;
                    last_done[s] = first_missing[s] = -1;
                    n_streams++;
                }
                int64_t index = info[g].index;
                if (pass == 0) {
                    if (node_done(g, token) == 1 && index > last_done[s])
                        last_done[s] = index;
                } else if (pass == 1) {
                    if (index > last_done[s] && node_done(g, token) == 0 &&
                        (first_missing[s] < 0 || index < first_missing[s]))
                        first_missing[s] = index;
                } else if (index > last_done[s] &&
                           (first_missing[s] < 0 || index <= first_missing[s])) {
                    /* in capture order within its stream: insertion */
                    int j = n++;
                    while (j > 0) {
                        const cd_watch_record *p = &nodes[out[j - 1]];
                        int32_t ptid = p->stream == (uintptr_t)CU_STREAM_PER_THREAD ?
                                           p->thread_id : 0;
                        int ps = 0;
                        while (ps < n_streams && !(streams[ps] == p->stream && threads[ps] == ptid))
                            ps++;
                        if (ps < s || (ps == s && info[out[j - 1]].index < index))
                            break;
                        out[j] = out[j - 1];
                        j--;
                    }
                    out[j] = (uint32_t)g;
                }
            }
        }
    }
    return n;
}

static int started(int c)
{
    uint32_t g = caps[c].start;
    return g < CD_GRAPH_NODES && node_done(g, token_now(c)) == 1;
}

int cd_graph_unfinished(const cd_watch_record *replay, uint32_t *out, int max, int *status,
                        int *capture)
{
    *status = CD_GRAPH_NO_MARKERS;
    *capture = -1;
    int c = entry_of(replay->graph);
    int n_all = atomic_load_explicit(&caps_hw, memory_order_acquire);
    if (c < 0) {
        /* CUPTI did not say which graph this executable runs (resource ids
         * refused; or it was not captured while watching): the capture of
         * this context whose replay started and did not finish, if any */
        for (int k = n_all - 1; k >= 0 && c < 0; k--)
            if (atomic_load(&caps[k].state) == CAP_CLOSED && caps[k].ctx == replay->ctx &&
                caps[k].ctx_gen == replay->ctx_gen && started(k) && frontier(k, out, 1) > 0)
                c = k;
        if (c >= 0)
            *status = CD_GRAPH_MATCHED;
    }
    if (c < 0)
        return 0;
    *capture = c;
    int state = atomic_load(&caps[c].state);
    if (state == CAP_ADOPTED) {
        /* captured before watching: its nodes are known, none has a marker */
        *status = CD_GRAPH_ADOPTED;
        uint16_t token = token_now(c);
        int n = 0;
        for (unsigned ch = 0; ch < N_CHUNKS && n < max; ch++) {
            if (atomic_load(&chunk_owner[ch]) != token)
                continue;
            uint32_t fill = atomic_load(&chunk_fill[ch]);
            for (uint32_t i = 0; i < fill && n < max; i++)
                out[n++] = (uint32_t)(ch * CHUNK + i);
        }
        return n;
    }
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
    uint16_t token = r->graph;
    if (entry_of(token) < 0 || atomic_load(&chunk_owner[g / CHUNK]) != token)
        return -1;                 /* its capture was freed */
    memcpy((char *)out + sizeof out->seq, (const char *)r + sizeof r->seq,
           sizeof *r - sizeof r->seq);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&r->seq, memory_order_relaxed) != (uint64_t)g + 1)
        return -1;                 /* taken again while we copied */
    atomic_store_explicit(&out->seq, (uint64_t)g + 1, memory_order_relaxed);
    *index = info[g].index;
    *done = node_done(g, token);
    return 0;
}

unsigned long long cd_graph_node_tools_id(uint32_t g)
{
    return g < CD_GRAPH_NODES ? info[g].tools_id : 0;
}

int cd_graph_node_frames(uint32_t g, uint32_t *ids, int max)
{
    if (g >= CD_GRAPH_NODES)
        return 0;
    int n = info[g].n_deep < max ? info[g].n_deep : max;
    memcpy(ids, info[g].deep, (size_t)n * sizeof *ids);
    return n;
}

int cd_graph_capture(int c, cd_graph_capture_info *out)
{
    if (c < 0 || c >= atomic_load_explicit(&caps_hw, memory_order_acquire))
        return -1;
    const capture_t *k = &caps[c];
    out->id = k->id;
    out->n_nodes = atomic_load(&k->n_nodes);
    out->multi_stream = atomic_load(&k->multi);
    out->unmarked = atomic_load(&k->unmarked);
    out->state = atomic_load(&k->state);
    out->origin = k->origin;
    out->every = k->every;
    out->token = token_now(c);
    for (int i = 0; i < CAP_CLONES; i++)
        out->exec_ids[i] = atomic_load(&k->exec_ids[i]);
    return out->state == CAP_FREE ? -1 : 0;
}

void cd_graph_stats(cd_graph_counters *out)
{
    out->nodes_marked = atomic_load(&n_nodes_marked);
    out->nodes_unmarked = atomic_load(&n_nodes_unmarked);
    out->nodes_recorded = atomic_load(&n_nodes_recorded);
    out->captures_untracked = atomic_load(&n_captures_untracked);
    out->captures_freed = atomic_load(&n_captures_freed);
    int live = 0, n = atomic_load(&caps_hw);
    for (int c = 0; c < n; c++)
        live += atomic_load(&caps[c].state) != CAP_FREE;
    out->captures = live;
    out->chunks_used = (int)atomic_load(&n_chunks_used);
    out->chunks = N_CHUNKS;
    out->clear_rc = atomic_load(&clear_rc);
    out->write_rc = atomic_load(&write_rc);
    out->kernel_rc = atomic_load(&kernel_rc);
    out->adopt_rc = atomic_load(&adopt_rc);
    cd_graph_exec_stats(&out->execs, &out->execs_refused, &out->exec_reach);
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
