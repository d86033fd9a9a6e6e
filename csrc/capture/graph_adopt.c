/*
 * capture/graph_adopt.c: graphs captured before watching, adopted.
 *
 * A graph captured while nothing watched has no node records and no markers.
 * Python adopts it at the end of its capture (cuda_debug/_graphs.py): its
 * kernel nodes, from the driver's graph API, become node records with the
 * line that captured it; its executables are paired with it as Python makes
 * them. Its replay is then reported as such: every kernel node a candidate,
 * none proven (graph_read.c).
 *
 * Each node's own line: nothing sees a launch outside watch() (CUPTI is not
 * ours, the launch hooks are off), so Python follows the capture instead,
 * from its beginning (torch's capture_begin) to its end: a trace function
 * (python/py_capture.c) that calls cd_graph_adopt_event at each event of a
 * user frame (a call, a line, a return; library frames are passed over). At
 * each such event the graph's node count is read (cuGraphGetNodes); nodes
 * made since the last event were made by the user's line of that event (the
 * innermost user frame then: the rule of the watch's records), so each run
 * of nodes gets that line (a span). A node with no span keeps the line that
 * ended the capture, and says why (CD_ADOPT_LINE_*: cd_graph_node_line).
 * The cost is the capture's only (a driver call per user event); replays
 * and launches pay nothing.
 */
#include "capture/graphs.h"

#include <stdlib.h>     /* free, malloc */
#include <string.h>      /* memcpy, memset */

static atomic_int adopt_rc;            /* the last failed graph API call of an adoption */
static atomic_uint_fast64_t n_events;  /* user-frame events seen following captures */

/* ------------------------------------------ following a capture's lines -- */

#define SPANS 4096                     /* runs of nodes with a line, per capture followed */

typedef struct {
    uint32_t first;                    /* the driver's index of its first node */
    uint32_t loc;                      /* the user's line (an interned location), 0 unknown */
} span_t;

/* The capture this thread follows (malloc'd at its beginning, freed at its
 * end or when it is found gone: the capture's own cold path). */
typedef struct {
    CUstream stream;
    uint64_t id;                       /* the driver's capture id */
    size_t count;                      /* the graph's nodes at the last event */
    uint32_t loc;                      /* the user's line since the last event */
    int why;                           /* CD_ADOPT_LINE_* of nodes without a span */
    int lost;                          /* the trace function was replaced: no last run */
    int n_spans;
    span_t spans[SPANS];
} follow_t;

static _Thread_local follow_t *tls_follow;
/* Why the lines of the next capture ended on this thread are not followed,
 * when it was never followed (Python's word: a tracer was set). */
static _Thread_local int tls_unfollowed_why;

/* The graph's node count now, or -1 when s captures no more (or another capture). */
static long node_count(const follow_t *f)
{
    uint64_t id;
    CUgraph graph = NULL;
    size_t n = 0;
    if (cd_gp_capture_id(f->stream, &id, &graph) != 0 || id != f->id || !graph ||
        cd_drv.cuGraphGetNodes(graph, NULL, &n) != CUDA_SUCCESS)
        return -1;
    return (long)n;
}

/* The innermost user frame's location now (skip: the innermost frame is left
 * out: a user frame returning), 0 when none is near. */
static uint32_t user_line(int skip)
{
    uint32_t ids[8];
    int complete;
    int n = cd_frames_read(ids, skip ? 8 : CD_RING_FRAMES, !skip, &complete);
    for (int i = skip ? 1 : n - 1; i < n; i++) {
        cd_location loc;
        if (ids[i] && cd_location_get(ids[i], &loc) == 0 && loc.kind == CD_LOC_USER)
            return ids[i];
    }
    return 0;
}

int cd_graph_adopt_follow(CUstream s, int why)
{
    uint64_t id;
    CUgraph graph = NULL;
    free(tls_follow);              /* one capture at a time per thread: an older one is over */
    tls_follow = NULL;
    tls_unfollowed_why = why;
    if (why)
        return -1;
    if (!cd_drv.cuGraphGetNodes || cd_gp_capture_id(s, &id, &graph) != 0 || !graph) {
        tls_unfollowed_why = CD_ADOPT_LINE_UNSEEN;
        return -1;
    }
    if (cd_gp_find_capture(id) >= 0)
        return -2;                 /* begun while watching: its nodes have their lines */
    if (!cd_reader_ok()) {
        tls_unfollowed_why = CD_ADOPT_LINE_NO_FRAMES;
        return -1;
    }
    follow_t *f = malloc(sizeof *f);
    if (!f) {
        tls_unfollowed_why = CD_ADOPT_LINE_FULL;
        return -1;
    }
    f->stream = s;
    f->id = id;
    f->n_spans = 0;
    f->why = CD_ADOPT_LINE_OWN;
    f->lost = 0;
    f->loc = user_line(0);
    long n = node_count(f);
    f->count = n > 0 ? (size_t)n : 0;
    tls_follow = f;
    return 0;
}

int cd_graph_adopt_event(int event)
{
    follow_t *f = tls_follow;
    if (!f)
        return -1;
    atomic_fetch_add_explicit(&n_events, 1, memory_order_relaxed);
    long n = node_count(f);
    if (n < 0) {                   /* the capture is over (invalidated, ended elsewhere) */
        free(f);
        tls_follow = NULL;
        return -1;
    }
    if ((size_t)n > f->count) {    /* made by the line in progress since the last event */
        if (f->n_spans < SPANS) {
            f->spans[f->n_spans].first = (uint32_t)f->count;
            f->spans[f->n_spans].loc = f->loc;
            f->n_spans++;
            f->count = (size_t)n;
        } else {                   /* the nodes from the last span's end on: no line */
            f->why = CD_ADOPT_LINE_FULL;
        }
    }
    /* the line in progress from now on: a returning frame's caller's */
    f->loc = user_line(event == CD_ADOPT_RETURN);
    return 0;
}

void cd_graph_adopt_lost(void)
{
    if (tls_follow) {
        tls_follow->lost = 1;
        tls_follow->why = CD_ADOPT_LINE_TRACED;
    }
}

/* Node i's (the driver's index) span's line, or 0 and *why. */
static uint32_t line_of(const follow_t *f, size_t i, int *why)
{
    *why = f ? f->why : tls_unfollowed_why ? tls_unfollowed_why : CD_ADOPT_LINE_UNSEEN;
    if (!f)
        return 0;
    int lo = 0, hi = f->n_spans - 1, at = -1;
    while (lo <= hi) {             /* the last span that begins at or before i */
        int mid = (lo + hi) / 2;
        if (f->spans[mid].first <= i)
            at = mid, lo = mid + 1;
        else
            hi = mid - 1;
    }
    if (at < 0 || (at == f->n_spans - 1 && i >= f->count)) {
        *why = at < 0 ? CD_ADOPT_LINE_UNSEEN : f->why;
        return 0;                  /* before the first event, or after the last */
    }
    if (!f->spans[at].loc)
        *why = CD_ADOPT_LINE_NO_USER;
    return f->spans[at].loc;
}

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
    if (!cd_drv.cuGraphGetNodes || !cd_drv.cuGraphNodeGetType ||
        !cd_drv.cuGraphKernelNodeGetParams ||
        !cd_drv.cuFuncGetName) {
        atomic_store(&adopt_rc, CUDA_ERROR_NOT_SUPPORTED);
        return 0;
    }
    if (cd_gp_capture_id(s, &id, &graph) != 0 || !graph) {
        atomic_store(&adopt_rc, CUDA_ERROR_ILLEGAL_STATE);
        return 0;
    }
    if (cd_gp_find_capture(id) >= 0)
        return -2;                 /* begun while watching: its launches are nodes already */
    follow_t *f = tls_follow && tls_follow->id == id ? tls_follow : NULL;
    if (f && !f->lost)
        cd_graph_adopt_event(CD_ADOPT_LINE);   /* the nodes of the line that ends it */
    f = tls_follow && tls_follow->id == id ? tls_follow : NULL;
    size_t n = 0;
    CUresult rc = cd_drv.cuGraphGetNodes(graph, NULL, &n);
    if (rc != CUDA_SUCCESS) {
        atomic_store(&adopt_rc, (int)rc);
        cd_graph_adopt_follow(NULL, CD_ADOPT_LINE_UNSEEN);   /* forget it */
        return 0;
    }
    uint32_t frames[CD_RING_FRAMES];
    int complete = 0;
    int n_frames = cd_frames_read(frames, CD_RING_FRAMES, 1, &complete);
    pthread_mutex_lock(&cd_gp_lock);
    int c = cd_gp_take_entry();
    if (c < 0) {
        pthread_mutex_unlock(&cd_gp_lock);
        cd_graph_adopt_follow(NULL, CD_ADOPT_LINE_UNSEEN);
        return -1;
    }
    capture_t *k = &cd_gp_caps[c];
    k->id = id;
    k->ctx = -1;
    k->origin = (uintptr_t)s;
    k->every = 0;
    memcpy(k->ended_at, frames, sizeof frames);
    k->n_ended_at = (uint8_t)n_frames;
    uint16_t token = cd_gp_token_now(c);
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
        long g = cd_gp_take_node(c);
        if (g < 0) {
            atomic_fetch_add(&k->unmarked, 1);
            index++;
            continue;
        }
        cd_watch_record *r = &cd_gp_nodes[g];
        memset(r, 0, sizeof *r);
        int origin;
        r->kernel = cd_intern_kernel(name ? name : "", &r->kernel_short, &origin, NULL);
        r->origin = (uint8_t)origin;
        r->grid[0] = p.gridDimX, r->grid[1] = p.gridDimY, r->grid[2] = p.gridDimZ;
        r->block[0] = p.blockDimX, r->block[1] = p.blockDimY, r->block[2] = p.blockDimZ;
        r->shared_mem = p.sharedMemBytes;
        r->stream = (uintptr_t)s;
        int why;
        uint32_t line = line_of(f, i, &why);
        if (line) {                /* the user's line that launched it */
            r->frames[0] = line;
            r->n_frames = 1;
            r->flags = CD_WATCH_CAPTURED;
        } else {                   /* the line that ended the capture */
            memcpy(r->frames, frames, sizeof frames);
            r->n_frames = (uint8_t)n_frames;
            r->flags = CD_WATCH_CAPTURED | (complete < 0 ? CD_WATCH_USER_LAST : 0);
        }
        cd_gp_info[g].line_why = (uint8_t)(line ? CD_ADOPT_LINE_OWN : why);
        r->graph = token;
        r->ctx = 0xFFFF;
        cd_gp_info[g].index = index++;
        cd_gp_info[g].start = 0;
        cd_gp_info[g].n_deep = 0;
        cd_gp_info[g].tools_id = 0;
        if (cd_drv.cuGraphNodeGetToolsId &&
            cd_drv.cuGraphNodeGetToolsId(list[i], &cd_gp_info[g].tools_id) != CUDA_SUCCESS)
            cd_gp_info[g].tools_id = 0;
        cd_gp_publish(g);
    }
    free(list);
    cd_graph_adopt_follow(NULL, CD_ADOPT_LINE_UNSEEN);   /* followed no more */
    atomic_store(&k->n_nodes, index);
    k->start = UINT32_MAX;
    k->refs = 0;                   /* its executables hold it (cd_graph_adopt_exec) */
    atomic_store_explicit(&k->state, CAP_ADOPTED, memory_order_release);
    pthread_mutex_unlock(&cd_gp_lock);
    return token;
}

int cd_graph_adopt_exec(uint32_t token, CUgraphExec exec)
{
    pthread_mutex_lock(&cd_gp_lock);
    int c = cd_gp_entry_of(token), rc = -1;
    if (c >= 0 && atomic_load(&cd_gp_caps[c].state) == CAP_ADOPTED)
        rc = cd_gp_pair_exec(c, exec);
    pthread_mutex_unlock(&cd_gp_lock);
    return rc;
}

void cd_graph_adopt_drop(uint32_t token)
{
    pthread_mutex_lock(&cd_gp_lock);
    int c = cd_gp_entry_of(token);
    if (c >= 0 && atomic_load(&cd_gp_caps[c].state) == CAP_ADOPTED && cd_gp_caps[c].refs <= 0)
        cd_gp_release_locked(c);
    pthread_mutex_unlock(&cd_gp_lock);
}

void cd_gp_adopt_stats(cd_graph_counters *out)
{
    out->adopt_rc = atomic_load(&adopt_rc);
    out->adopt_events = atomic_load(&n_events);
}

void cd_graph_adopt_fork(int op)
{
    if (op == CD_FORK_CHILD) {
        tls_follow = NULL;         /* the parent's (its copy stays allocated) */
        tls_unfollowed_why = CD_ADOPT_LINE_UNSEEN;
    }
}
