/*
 * capture/graph_capture.c: completion markers inside CUDA graphs captured
 * while watching (graphs.h: the graph code's rooms).
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
 * capture gives candidates on each stream (graph_read.c). (Two executables
 * instantiated from one captured graph and replayed at once would share the
 * slots: not supported.)
 */
#include "capture/graphs.h"

#include <string.h>     /* memset */

static atomic_uint_fast64_t n_nodes_marked, n_nodes_unmarked, n_captures_untracked,
    n_nodes_recorded;
static atomic_int clear_rc, write_rc;  /* the last refused memset / stream write */


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
    if (ci < 0 || cd_config.graph_markers != CD_MARKERS_KERNEL)
        return;
    uint32_t gen = cd_watch_context_gen(ci);
    pthread_mutex_lock(&cd_gp_lock);
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
    pthread_mutex_unlock(&cd_gp_lock);
}

/* Enqueue node g's marker on s (captured as a node): 0 or the CUresult. */
static CUresult write_marker(const capture_t *k, CUstream s, long g)
{
    cd_slots slots;
    if (cd_watch_context_slots(k->ctx, k->ctx_gen, &slots) != 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    CUdeviceptr at = cd_node_slot_dev(&slots, (uint32_t)g);
    uint32_t v = MARK(g, cd_gp_info[g].gen);
    CUfunction fn = marker_kernels[k->ctx].gen == k->ctx_gen ? marker_kernels[k->ctx].fn : NULL;
    if (cd_config.graph_markers == CD_MARKERS_KERNEL && fn) {
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
/* ------------------------------------------------------- the capture -- */

void cd_graph_capture_begun(const CUpti_CallbackData *cb, CUstream s)
{
    uint64_t id;
    int ci = cd_watch_context_find(cb->contextUid);
    if (cd_gp_capture_id(s, &id, NULL) != 0 || ci < 0) {
        atomic_fetch_add(&n_captures_untracked, 1);
        return;
    }
    pthread_mutex_lock(&cd_gp_lock);
    int c = cd_gp_take_entry();
    long g = -1;
    if (c >= 0) {
        capture_t *k = &cd_gp_caps[c];
        k->id = id;
        k->ctx = ci;
        k->ctx_gen = cd_watch_context_gen(ci);
        k->origin = (uintptr_t)s;
        /* watch(exact=True) (a marker behind every launch): every node too */
        k->every = atomic_load(&cd_gates.watch_every) == 1 || cd_config.graph_marker_every < 1
                       ? 1 : (uint32_t)cd_config.graph_marker_every;
        g = cd_gp_take_node(c);
    }
    if (g < 0) {
        pthread_mutex_unlock(&cd_gp_lock);
        atomic_fetch_add(&n_captures_untracked, 1);
        return;
    }
    capture_t *k = &cd_gp_caps[c];
    k->start = (uint32_t)g;
    cd_gp_info[g].start = 1;
    cd_gp_info[g].index = 0;
    memset(&cd_gp_nodes[g], 0, sizeof cd_gp_nodes[g]);
    cd_gp_nodes[g].stream = (uintptr_t)s;
    cd_gp_nodes[g].graph = cd_gp_token_now(c);
    CUresult rc = write_marker(k, s, g);
    if (rc != CUDA_SUCCESS) {      /* no start marker: its replays could not be told apart */
        atomic_store(&write_rc, (int)rc);
        atomic_store(&k->state, CAP_BROKEN);
        cd_gp_release_locked(c);
        pthread_mutex_unlock(&cd_gp_lock);
        atomic_fetch_add(&n_captures_untracked, 1);
        return;
    }
    cd_gp_publish(g);
    atomic_store_explicit(&k->state, CAP_OPEN, memory_order_release);
    pthread_mutex_unlock(&cd_gp_lock);
}

/* Capture c's launches so far on stream s, this one counted (cd_gp_lock
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
    if (cd_gp_capture_info(s, &id, NULL, cd_drv.cuGraphNodeGetToolsId ? &deps : NULL,
                     cd_drv.cuGraphNodeGetToolsId ? &n_deps : NULL) != 0 ||
        (c = cd_gp_find_capture(id)) < 0)
        return 0;                   /* begun before watching, or not tracked */
    capture_t *k = &cd_gp_caps[c];
    pthread_mutex_lock(&cd_gp_lock);
    long g = cd_gp_take_node(c);
    uint32_t index = atomic_fetch_add(&k->n_nodes, 1);
    if ((uintptr_t)s != k->origin)
        atomic_store(&k->multi, 1);
    uint32_t n = stream_count(k, (uintptr_t)s);
    /* every K-th launch of the stream, and every NCCL kernel (the hang suspects) */
    int marked = k->every <= 1 || n == 0 || n % k->every == 0 || cd_nccl_kernel(l->symbol);
    uint16_t token = cd_gp_token_now(c);
    pthread_mutex_unlock(&cd_gp_lock);
    if (g < 0) {                    /* every node handed out: this one has no record */
        atomic_fetch_add(&k->unmarked, 1);
        atomic_fetch_add(&n_nodes_unmarked, 1);
        return 1;
    }
    cd_watch_record *r = &cd_gp_nodes[g];
    cd_watch_fill(r, l, 1, NULL);
    r->graph = token;
    r->ctx = (uint16_t)k->ctx;
    r->ctx_gen = (uint16_t)k->ctx_gen;
    r->flags |= CD_WATCH_CAPTURED;
    node_info *ni = &cd_gp_info[g];
    ni->index = index;
    ni->start = 0;
    ni->line_why = CD_ADOPT_LINE_OWN;
    /* The record keeps the innermost frames and the user's; the frames between
     * (a torch.compile'd graph's generated code, whose line Inductor's line map
     * turns into the source line the kernel fused) are kept here. */
    int complete;
    ni->n_deep = (uint8_t)cd_frames_read(ni->deep, CD_NODE_FRAMES, 0, &complete);
    ni->tools_id = 0;
    if (n_deps == 1 && deps && deps[0] &&      /* the kernel's node: its id for tools */
        cd_drv.cuGraphNodeGetToolsId(deps[0], &ni->tools_id) != CUDA_SUCCESS)
        ni->tools_id = 0;
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
    cd_gp_publish(g);
    return 1;
}

/* Every slot of capture c set to 0 on stream s, the chunks that follow one
 * another in one memset each: 0, or the first failure (cd_gp_lock held). */
static CUresult clear_slots(int c, CUstream s)
{
    const capture_t *k = &cd_gp_caps[c];
    uint16_t token = cd_gp_token_now(c);
    cd_slots slots;
    if (cd_watch_context_slots(k->ctx, k->ctx_gen, &slots) != 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    for (int ch = cd_gp_chunk_next(token, -1); ch >= 0; ch = cd_gp_chunk_next(token, ch)) {
        int first = ch;
        size_t n = 0;
        for (;;) {                     /* the full chunks of its own that follow */
            uint32_t fill = cd_gp_chunk_fill(ch);
            n += fill;
            if (fill < CHUNK || cd_gp_chunk_next(token, ch) != ch + 1)
                break;
            ch++;
        }
        CUdeviceptr at = cd_node_slot_dev(&slots, (uint32_t)first * CHUNK);
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
    if (!atomic_load(&cd_gp_caps_hw) || cd_gp_capture_id(s, &id, NULL) != 0 ||
        (c = cd_gp_find_capture(id)) < 0)
        return;
    pthread_mutex_lock(&cd_gp_lock);   /* no node is being added while the chunks are read */
    CUresult rc = clear_slots(c, s);
    atomic_store(&cd_gp_caps[c].state, rc == CUDA_SUCCESS ? CAP_CLOSING : CAP_BROKEN);
    *cb->correlationData = cd_gp_token_now(c);    /* for the exit callback */
    pthread_mutex_unlock(&cd_gp_lock);
}

void cd_graph_capture_ended(const CUpti_CallbackData *cb, CUgraph graph)
{
    int c = cd_gp_entry_of((uint32_t)*cb->correlationData);
    if (c < 0)
        return;
    pthread_mutex_lock(&cd_gp_lock);
    capture_t *k = &cd_gp_caps[c];
    int ok = *(const CUresult *)cb->functionReturnValue == CUDA_SUCCESS && graph;
    if (ok) {                       /* the graph holds the markers, broken or not */
        atomic_store(&k->graph, (uintptr_t)graph);
        k->refs = 1;
        atomic_store(&k->state, atomic_load(&k->state) == CAP_CLOSING ? CAP_CLOSED : CAP_BROKEN);
    } else {
        cd_gp_release_locked(c);          /* no graph: nothing holds its slots */
    }
    pthread_mutex_unlock(&cd_gp_lock);
}

void cd_gp_capture_stats(cd_graph_counters *out)
{
    out->nodes_marked = atomic_load(&n_nodes_marked);
    out->nodes_unmarked = atomic_load(&n_nodes_unmarked);
    out->nodes_recorded = atomic_load(&n_nodes_recorded);
    out->captures_untracked = atomic_load(&n_captures_untracked);
    out->clear_rc = atomic_load(&clear_rc);
    out->write_rc = atomic_load(&write_rc);
    out->kernel_rc = atomic_load(&kernel_rc);
}
