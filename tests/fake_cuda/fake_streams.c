/*
 * fake_streams.c: Streams, stream capture, graphs (instantiate, destroy,
 * nodes, ids), function names, cuStreamWaitEvent.
 * Part of the fake libcuda.so.1: fake_driver.h says what it emulates.
 */
#include "fake_driver.h"

/* ------------------------------------------------ driver: streams ------ */

CUresult CUDAAPI cuStreamCreate(CUstream *ph, unsigned int flags)
{
    (void)flags;
    ALIVE("cuStreamCreate");
    fake_stream *s = calloc(1, sizeof *s);
    s->magic = MAGIC_STREAM;
    pthread_mutex_lock(&dev_lock);
    s->id = next_stream_id++;
    /* append: cuCtxSynchronize drains in creation order */
    fake_stream **p = &all_streams;
    while (*p)
        p = &(*p)->next_all;
    *p = s;
    ensure_worker(s);
    pthread_mutex_unlock(&dev_lock);
    *ph = (CUstream)(void *)s;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream h)
{
    if (!resolve(h) || !h)
        RET("cuStreamDestroy", CUDA_ERROR_INVALID_HANDLE);
    return CUDA_SUCCESS;   /* kept: its queued work still runs, like the real one */
}

static CUresult stream_sync_body(void *a)
{
    fake_stream *s = a;
    atomic_fetch_add(&st_syncs, 1);
    pthread_mutex_lock(&dev_lock);
    if (s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {   /* invalidates the capture */
        s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        pthread_mutex_unlock(&dev_lock);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    drain_locked(s);
    pthread_mutex_unlock(&dev_lock);
    return sync_result();
}

CUresult CUDAAPI cuStreamSynchronize(CUstream h)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamSynchronize", CUDA_ERROR_INVALID_HANDLE);
    cuStreamSynchronize_params p = {h};
    return traced(CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize, "cuStreamSynchronize", &p, NULL,
                  stream_sync_body, s);
}

CUresult CUDAAPI cuStreamQuery(CUstream h)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamQuery", CUDA_ERROR_INVALID_HANDLE);
    pthread_mutex_lock(&dev_lock);
    if (async_on && !sticky && (s->head || s->running)) {
        pthread_mutex_unlock(&dev_lock);
        return CUDA_ERROR_NOT_READY;
    }
    drain_locked(s);     /* sync mode: the "device" runs what is queued now */
    pthread_mutex_unlock(&dev_lock);
    RET("cuStreamQuery", sync_result());
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamIsCapturing", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuStreamIsCapturing");
    pthread_mutex_lock(&dev_lock);
    *st = (CUstreamCaptureStatus)s->capture;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream h, CUcontext *pctx)
{
    if (!resolve(h))
        RET("cuStreamGetCtx", CUDA_ERROR_INVALID_HANDLE);
    *pctx = CTX;
    return CUDA_SUCCESS;
}

typedef struct {
    const void *params;
    fake_stream *s;
    CUstreamCaptureMode mode;
    CUgraph *graph_out;
} capture_arg;

static CUresult begin_capture_body(void *a)
{
    capture_arg *c = a;
    int st = current_sticky();
    if (st)
        return (CUresult)st;
    pthread_mutex_lock(&dev_lock);
    CUresult rc = CUDA_SUCCESS;
    if (c->s->capture != CU_STREAM_CAPTURE_STATUS_NONE)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    else {
        c->s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        c->s->cap_origin = c->s;
        c->s->cap_last = NULL;
        c->s->cap_id = next_capture_id++;
        c->s->cap_head = c->s->cap_tail = NULL;
        c->s->cap_graph = calloc(1, sizeof *c->s->cap_graph);
        c->s->cap_graph->magic = MAGIC_GRAPH;
        c->s->cap_graph->capturing = c->s;
        c->s->cap_graph->serial = ++next_graph_serial;
    }
    pthread_mutex_unlock(&dev_lock);
    return rc;
}

static CUresult begin_capture(CUpti_CallbackId cbid, const char *api, CUstream h,
                              CUstreamCaptureMode mode)
{
    fake_stream *s = resolve(h);
    if (!s || s == &legacy_stream)
        RET(api, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cuStreamBeginCapture_v2_params p = {h, mode};
    capture_arg a = {&p, s, mode, NULL};
    return traced(cbid, api, &p, NULL, begin_capture_body, &a);
}

CUresult CUDAAPI cuStreamBeginCapture(CUstream h, CUstreamCaptureMode mode)
{
    return begin_capture(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,
                         "cuStreamBeginCapture_v2", h, mode);
}

CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode)
{
    return begin_capture(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
                         "cuStreamBeginCapture_v2_ptsz", h, mode);
}

/* Ends the capture of its origin stream: every stream that joined it stops
 * capturing too (the real driver demands that they rejoined first). */
static CUresult end_capture_body(void *a)
{
    capture_arg *c = a;
    fake_stream *s = c->s;
    pthread_mutex_lock(&dev_lock);
    int st = s->capture;
    if (st != CU_STREAM_CAPTURE_STATUS_NONE && s->cap_origin != s) {
        pthread_mutex_unlock(&dev_lock);
        return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;      /* not the origin stream */
    }
    op *ops = s->cap_head;
    fake_graph *g = s->cap_graph;
    s->cap_graph = NULL;
    for (fake_stream *o = all_streams; o; o = o->next_all)
        if (o->cap_origin == s) {
            o->capture = CU_STREAM_CAPTURE_STATUS_NONE;
            o->cap_origin = NULL;
        }
    s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    s->cap_head = s->cap_tail = NULL;
    pthread_mutex_unlock(&dev_lock);
    if (st == CU_STREAM_CAPTURE_STATUS_NONE)
        return CUDA_ERROR_ILLEGAL_STATE;
    if (st == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    pthread_mutex_lock(&dev_lock);
    g->capturing = NULL;
    g->ops = ops;
    pthread_mutex_unlock(&dev_lock);
    *c->graph_out = (CUgraph)(void *)g;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream h, CUgraph *phGraph)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamEndCapture", CUDA_ERROR_INVALID_HANDLE);
    cuStreamEndCapture_params p = {h, phGraph};
    capture_arg a = {&p, s, 0, phGraph};
    return traced(CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture, "cuStreamEndCapture", &p, NULL,
                  end_capture_body, &a);
}

CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus *status,
                                        cuuint64_t *id, CUgraph *graph,
                                        const CUgraphNode **deps, const CUgraphEdgeData **edges,
                                        size_t *n_deps)
{
    fake_stream *s = resolve(h);
    if (!s || !status)
        RET("cuStreamGetCaptureInfo_v3", s ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE);
    pthread_mutex_lock(&dev_lock);
    *status = (CUstreamCaptureStatus)s->capture;
    if (id)
        *id = s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE && s->cap_origin ?
                  s->cap_origin->cap_id : 0;
    if (graph)
        *graph = s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE && s->cap_origin ?
                     (CUgraph)(void *)s->cap_origin->cap_graph : NULL;
    pthread_mutex_unlock(&dev_lock);
    static _Thread_local CUgraphNode dep;
    pthread_mutex_lock(&dev_lock);
    dep = s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE ? (CUgraphNode)(void *)s->cap_last : NULL;
    pthread_mutex_unlock(&dev_lock);
    if (deps)
        *deps = dep ? &dep : NULL;
    if (edges)
        *edges = NULL;
    if (n_deps)
        *n_deps = dep ? 1 : 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phExec, CUgraph g, unsigned long long flags)
{
    (void)flags;
    ALIVE("cuGraphInstantiateWithFlags");
    if (!g || ((fake_graph *)g)->magic != MAGIC_GRAPH)
        RET("cuGraphInstantiateWithFlags", CUDA_ERROR_INVALID_VALUE);
    *phExec = (CUgraphExec)(void *)g;      /* the graph is its own executable */
    CUpti_GraphData gd;
    memset(&gd, 0, sizeof gd);
    gd.graph = g;
    gd.graphExec = *phExec;
    fire_resource(CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED, &gd);
    return CUDA_SUCCESS;
}

/* The graph is its own executable in the fake: CUPTI is told of each
 * destruction, and the operations are freed once both the graph and its
 * executable are destroyed (the caller has let its replays finish). */
static void graph_free_if_done(fake_graph *g)
{
    if (!g || g->magic != MAGIC_GRAPH || !g->graph_destroyed || !g->exec_destroyed)
        return;
    pthread_mutex_lock(&dev_lock);
    g->magic = 0;
    op *o = g->ops;
    g->ops = NULL;
    pthread_mutex_unlock(&dev_lock);
    while (o) {
        op *next = o->next;
        free(o);
        o = next;
    }
    free(g);
}

CUresult CUDAAPI cuGraphDestroy(CUgraph g)
{
    CUpti_GraphData gd;
    memset(&gd, 0, sizeof gd);
    gd.graph = g;
    fire_resource(CUPTI_CBID_RESOURCE_GRAPH_DESTROY_STARTING, &gd);
    if (g && ((fake_graph *)g)->magic == MAGIC_GRAPH) {
        ((fake_graph *)g)->graph_destroyed = 1;
        graph_free_if_done((fake_graph *)g);
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec e)
{
    CUpti_GraphData gd;
    memset(&gd, 0, sizeof gd);
    gd.graphExec = e;
    fire_resource(CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING, &gd);
    if (e && ((fake_graph *)e)->magic == MAGIC_GRAPH) {
        ((fake_graph *)e)->exec_destroyed = 1;
        graph_free_if_done((fake_graph *)e);
    }
    return CUDA_SUCCESS;
}

/* The graph API that reads a graph (cuda_debug reads a graph being captured
 * before watching): nodes are the captured operations, in capture order. */
static op *graph_ops_of(fake_graph *g)       /* dev_lock held */
{
    return g->capturing ? g->capturing->cap_head : g->ops;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    fake_graph *g = (fake_graph *)hGraph;
    if (!g || g->magic != MAGIC_GRAPH || !numNodes)
        RET("cuGraphGetNodes", CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&dev_lock);
    size_t n = 0;
    for (op *o = graph_ops_of(g); o; o = o->next, n++)
        if (nodes && n < *numNodes)
            nodes[n] = (CUgraphNode)(void *)o;
    pthread_mutex_unlock(&dev_lock);
    if (nodes && n > *numNodes)
        n = *numNodes;
    *numNodes = n;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    const op *o = (const op *)hNode;
    if (!o || !type)
        RET("cuGraphNodeGetType", CUDA_ERROR_INVALID_VALUE);
    *type = o->kind == OP_KERNEL ? CU_GRAPH_NODE_TYPE_KERNEL :
            o->kind == OP_MEMSET32 ? CU_GRAPH_NODE_TYPE_MEMSET :
            o->kind == OP_EVENT ? CU_GRAPH_NODE_TYPE_EVENT_RECORD : CU_GRAPH_NODE_TYPE_BATCH_MEM_OP;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *p)
{
    const op *o = (const op *)hNode;
    if (!o || !p || o->kind != OP_KERNEL)
        RET("cuGraphKernelNodeGetParams_v2", CUDA_ERROR_INVALID_VALUE);
    memset(p, 0, sizeof *p);
    p->func = (CUfunction)(void *)o->fn;
    p->gridDimX = o->grid[0], p->gridDimY = o->grid[1], p->gridDimZ = o->grid[2];
    p->blockDimX = o->block[0], p->blockDimY = o->block[1], p->blockDimZ = o->block[2];
    return CUDA_SUCCESS;
}

/* CUDA 13.1's ids for tools: a node's is its graph's id above its local id;
 * an executable's id is its graph's plus 1000 (the driver mints both from one
 * counter). fake_tools_ids(0) makes them refused (an older driver). */
static int tools_ids = 1;
FAKE_EXPORT void fake_tools_ids(int on) { tools_ids = on; }

CUresult CUDAAPI cuGraphNodeGetToolsId(CUgraphNode hNode, unsigned long long *id);
CUresult CUDAAPI cuGraphNodeGetToolsId(CUgraphNode hNode, unsigned long long *id)
{
    const op *o = (const op *)hNode;
    if (!tools_ids)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!o || !id)
        RET("cuGraphNodeGetToolsId", CUDA_ERROR_INVALID_VALUE);
    *id = (unsigned long long)o->graph_serial << 32 | o->serial;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecGetId(CUgraphExec hExec, unsigned int *id);
CUresult CUDAAPI cuGraphExecGetId(CUgraphExec hExec, unsigned int *id)
{
    const fake_graph *g = (const fake_graph *)hExec;
    if (!tools_ids)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!g || g->magic != MAGIC_GRAPH || !id)
        RET("cuGraphExecGetId", CUDA_ERROR_INVALID_VALUE);
    *id = g->serial + 1000;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetName(const char **name, CUfunction hfunc)
{
    fake_func *f = (fake_func *)hfunc;
    if (!name || !f || f->magic != MAGIC_FUNC)
        RET("cuFuncGetName", CUDA_ERROR_INVALID_HANDLE);
    *name = f->name;
    return CUDA_SUCCESS;
}

/* The runtime's kernel handles are CUkernels: here the same fake functions. */
CUresult CUDAAPI cuKernelGetName(const char **name, CUkernel hfunc)
{
    return cuFuncGetName(name, (CUfunction)(void *)hfunc);
}

/* As a driver that does not take a runtime's kernel handles (the H200 with
 * CUDA 12.8's runtime beside driver 580: cuKernelGetFunction refused them):
 * the launch hooks must leave such launches to the runtime, and say so. */
static int refuse_kernel_handles;
FAKE_EXPORT void fake_refuse_kernel_handles(int on) { refuse_kernel_handles = on; }

CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    if (refuse_kernel_handles)
        RET("cuKernelGetFunction", CUDA_ERROR_INVALID_HANDLE);
    fake_func *f = (fake_func *)(void *)kernel;
    if (!pFunc || !f || f->magic != MAGIC_FUNC)
        RET("cuKernelGetFunction", CUDA_ERROR_INVALID_HANDLE);
    if (!current_ctx())
        RET("cuKernelGetFunction", CUDA_ERROR_INVALID_CONTEXT);
    *pFunc = (CUfunction)(void *)f;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags);

typedef struct {
    fake_stream *s;
    fake_event *e;
} wait_arg;

/* A stream waiting for an event recorded in a capturing stream joins that
 * capture (fork); otherwise the fake orders nothing: streams of this device
 * are drained on demand. */
static CUresult wait_event_body(void *a)
{
    wait_arg *w = a;
    pthread_mutex_lock(&dev_lock);
    fake_stream *origin = w->e && w->e->magic == MAGIC_EVENT ? w->e->cap_origin : NULL;
    if (origin && origin->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE &&
        w->s->capture == CU_STREAM_CAPTURE_STATUS_NONE && w->s != &legacy_stream) {
        w->s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        w->s->cap_origin = origin;
        w->s->cap_last = NULL;
    }
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags)
{
    cuStreamWaitEvent_params p = {h, ev, flags};
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamWaitEvent", CUDA_ERROR_INVALID_HANDLE);
    wait_arg w = {s, (fake_event *)ev};
    /* Traced: cuda_debug watches it as a possible capture join. */
    return traced(CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent, "cuStreamWaitEvent", &p, NULL,
                  wait_event_body, &w);
}
