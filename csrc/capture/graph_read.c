/*
 * capture/graph_read.c: what a replay's capture says, for reports.
 *
 * Everything here reads static memory or slots: no CUDA call, no lock, no
 * allocation; safe in a signal handler and after the context died.
 */
#include "capture/graphs.h"

#include <string.h>     /* memcpy */

/* 1 when node g's marker is in its slot, 0 when not, -1 unknown (no marker,
 * or its context is gone). */
static int node_done(long g, uint16_t token)
{
    const cd_watch_record *r = &cd_gp_nodes[g];
    if (atomic_load_explicit(&r->seq, memory_order_acquire) != (uint64_t)g + 1 ||
        r->graph != token)
        return -1;
    int c = cd_gp_entry_of(token);
    if (c < 0)
        return -1;
    if (!cd_gp_info[g].start && !(r->flags & CD_WATCH_MARKED))
        return -1;
    cd_slots slots;
    if (cd_watch_context_slots(cd_gp_caps[c].ctx, cd_gp_caps[c].ctx_gen, &slots) != 0)
        return -1;
    return *cd_node_slot(&slots, (uint32_t)g) == MARK(g, cd_gp_info[g].gen);
}

/* Capture c's candidates: per stream (nodes of a stream ran in capture
 * order), the nodes after the last one known finished (its marker set), up
 * to the first marked one whose marker is missing; into out (at most max),
 * stream by stream, in capture order. The count. */
#define FRONTIER_STREAMS 64
static int frontier(int c, uint32_t *out, int max)
{
    uint16_t token = cd_gp_token_now(c);
    uintptr_t streams[FRONTIER_STREAMS];
    int32_t threads[FRONTIER_STREAMS];
    int64_t last_done[FRONTIER_STREAMS], first_missing[FRONTIER_STREAMS];
    int n_streams = 0, n = 0;
    for (int pass = 0; pass < 3; pass++) {
        for (int ch = cd_gp_chunk_next(token, -1); ch >= 0 && n < max;
             ch = cd_gp_chunk_next(token, ch)) {
            uint32_t fill = cd_gp_chunk_fill(ch);
            for (uint32_t i = 0; i < fill && n < max; i++) {
                long g = (long)ch * CHUNK + i;
                const cd_watch_record *r = &cd_gp_nodes[g];
                if (cd_gp_info[g].start || atomic_load_explicit(&r->seq, memory_order_acquire) !=
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
                int64_t index = cd_gp_info[g].index;
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
                        const cd_watch_record *p = &cd_gp_nodes[out[j - 1]];
                        int32_t ptid = p->stream == (uintptr_t)CU_STREAM_PER_THREAD ?
                                           p->thread_id : 0;
                        int ps = 0;
                        while (ps < n_streams && !(streams[ps] == p->stream && threads[ps] == ptid))
                            ps++;
                        if (ps < s || (ps == s && cd_gp_info[out[j - 1]].index < index))
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
    uint32_t g = cd_gp_caps[c].start;
    return g < CD_GRAPH_NODES && node_done(g, cd_gp_token_now(c)) == 1;
}

int cd_graph_unfinished(const cd_watch_record *replay, uint32_t *out, int max, int *status,
                        int *capture)
{
    *status = CD_GRAPH_NO_MARKERS;
    *capture = -1;
    int c = cd_gp_entry_of(replay->graph);
    int n_all = atomic_load_explicit(&cd_gp_caps_hw, memory_order_acquire);
    if (c < 0) {
        /* CUPTI did not say which graph this executable runs (resource ids
         * refused; or it was not captured while watching): the capture of
         * this context whose replay started and did not finish, if any */
        for (int k = n_all - 1; k >= 0 && c < 0; k--) {
            const capture_t *cap = &cd_gp_caps[k];
            if (atomic_load(&cap->state) == CAP_CLOSED && cap->ctx == replay->ctx &&
                cap->ctx_gen == replay->ctx_gen && started(k) && frontier(k, out, 1) > 0)
                c = k;
        }
        if (c >= 0)
            *status = CD_GRAPH_MATCHED;
    }
    if (c < 0)
        return 0;
    *capture = c;
    int state = atomic_load(&cd_gp_caps[c].state);
    if (state == CAP_ADOPTED) {
        /* captured before watching: its nodes are known, none has a marker */
        *status = CD_GRAPH_ADOPTED;
        uint16_t token = cd_gp_token_now(c);
        int n = 0;
        for (int ch = cd_gp_chunk_next(token, -1); ch >= 0 && n < max;
             ch = cd_gp_chunk_next(token, ch)) {
            uint32_t fill = cd_gp_chunk_fill(ch);
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
    if (g >= CD_GRAPH_NODES || cd_gp_info[g].start)
        return -1;
    const cd_watch_record *r = &cd_gp_nodes[g];
    if (atomic_load_explicit(&r->seq, memory_order_acquire) != (uint64_t)g + 1)
        return -1;
    uint16_t token = r->graph;
    int ch = (int)(g / CHUNK);
    if (cd_gp_entry_of(token) < 0 || cd_gp_chunk_next(token, ch - 1) != ch)
        return -1;                 /* its capture was freed */
    memcpy((char *)out + sizeof out->seq, (const char *)r + sizeof r->seq,
           sizeof *r - sizeof r->seq);
    atomic_thread_fence(memory_order_acquire);
    if (atomic_load_explicit(&r->seq, memory_order_relaxed) != (uint64_t)g + 1)
        return -1;                 /* taken again while we copied */
    atomic_store_explicit(&out->seq, (uint64_t)g + 1, memory_order_relaxed);
    *index = cd_gp_info[g].index;
    *done = node_done(g, token);
    return 0;
}

unsigned long long cd_graph_node_tools_id(uint32_t g)
{
    return g < CD_GRAPH_NODES ? cd_gp_info[g].tools_id : 0;
}

int cd_graph_node_frames(uint32_t g, uint32_t *ids, int max)
{
    if (g >= CD_GRAPH_NODES)
        return 0;
    int n = cd_gp_info[g].n_deep < max ? cd_gp_info[g].n_deep : max;
    memcpy(ids, cd_gp_info[g].deep, (size_t)n * sizeof *ids);
    return n;
}

int cd_graph_node_line(uint32_t g)
{
    return g < CD_GRAPH_NODES ? cd_gp_info[g].line_why : CD_ADOPT_LINE_OWN;
}

int cd_graph_capture(int c, cd_graph_capture_info *out)
{
    if (c < 0 || c >= atomic_load_explicit(&cd_gp_caps_hw, memory_order_acquire))
        return -1;
    const capture_t *k = &cd_gp_caps[c];
    out->id = k->id;
    out->n_nodes = atomic_load(&k->n_nodes);
    out->multi_stream = atomic_load(&k->multi);
    out->unmarked = atomic_load(&k->unmarked);
    out->state = atomic_load(&k->state);
    out->origin = k->origin;
    out->every = k->every;
    out->token = cd_gp_token_now(c);
    for (int i = 0; i < CAP_CLONES; i++)
        out->exec_ids[i] = atomic_load(&k->exec_ids[i]);
    return out->state == CAP_FREE ? -1 : 0;
}

int cd_graph_capture_ended_at(int c, uint32_t *ids, int max)
{
    if (c < 0 || c >= atomic_load_explicit(&cd_gp_caps_hw, memory_order_acquire) ||
        atomic_load(&cd_gp_caps[c].state) != CAP_ADOPTED)
        return 0;
    int n = cd_gp_caps[c].n_ended_at < max ? cd_gp_caps[c].n_ended_at : max;
    memcpy(ids, cd_gp_caps[c].ended_at, (size_t)n * sizeof *ids);
    return n;
}

void cd_graph_stats(cd_graph_counters *out)
{
    cd_gp_pool_stats(out);
    cd_gp_capture_stats(out);
    cd_gp_adopt_stats(out);
    cd_graph_exec_stats(&out->execs, &out->execs_refused, &out->exec_reach);
}
