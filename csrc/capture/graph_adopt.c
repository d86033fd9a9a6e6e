/*
 * capture/graph_adopt.c: graphs captured before watching, adopted.
 *
 * A graph captured while nothing watched has no node records and no markers.
 * Python adopts it at the end of its capture (cuda_debug/_graphs.py): its
 * kernel nodes, from the driver's graph API, become node records with the
 * line that captured it; its executables are paired with it as Python makes
 * them. Its replay is then reported as such: every kernel node a candidate,
 * none proven (graph_read.c).
 */
#include "capture/graphs.h"

#include <stdlib.h>
#include <string.h>

static atomic_int adopt_rc;            /* the last failed graph API call of an adoption */

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
    size_t n = 0;
    CUresult rc = cd_drv.cuGraphGetNodes(graph, NULL, &n);
    if (rc != CUDA_SUCCESS) {
        atomic_store(&adopt_rc, (int)rc);
        return 0;
    }
    uint32_t frames[CD_RING_FRAMES];
    int complete = 0;
    int n_frames = cd_frames_capture(frames, CD_RING_FRAMES, 1, &complete);
    pthread_mutex_lock(&cd_gp_lock);
    int c = cd_gp_take_entry();
    if (c < 0) {
        pthread_mutex_unlock(&cd_gp_lock);
        return -1;
    }
    capture_t *k = &cd_gp_caps[c];
    k->id = id;
    k->ctx = -1;
    k->origin = (uintptr_t)s;
    k->every = 0;
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
        memcpy(r->frames, frames, sizeof frames);
        r->n_frames = (uint8_t)n_frames;
        r->flags = CD_WATCH_CAPTURED | (complete < 0 ? CD_WATCH_USER_LAST : 0);
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
}
