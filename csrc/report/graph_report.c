/*
 * report/graph_report.c: a CUDA graph replay in a block on fd 2. The fault
 * block, the watch culprit (fault_report.c), the hang report and the dump
 * (inflight_report.c) all name a replay the same way: the nodes of its graph
 * the markers leave as the faulting or running one (capture/graph_read.c),
 * each by its kernel (an NCCL kernel by its collective), its node number and
 * the line that captured it, then the line that replayed the graph; or the
 * replay, and why its nodes are not known.
 *
 *   culprit: slow_node (node 6 of a CUDA graph; replay launch #12, stream 0x5, thread 42)
 *     captured at train.py:40 in step
 *     replayed at train.py:52 in main
 *
 * Host memory only: async-signal-safe. The device's assert text (a fault
 * found by a call, never from a signal) names a node of a graph captured
 * before watching, which has no markers; its line is the one that launched it
 * during the capture (capture/graph_adopt.c follows the capture), or, where
 * that is not known, the line that ended the capture, and why:
 *
 *   culprit (named by the device's text): bad (node 3 of a CUDA graph captured before watching; ...)
 *     captured at train.py:40 in step
 *       (the line that ended its capture, not the launch's: a tracer ...)
 */
#include "report/report.h"


#define SHOWN 3                        /* candidates written; the rest counted */

static const char *const why[] = {
    [CD_GRAPH_NO_MARKERS] = "captured before watching: no markers inside it",
    [CD_GRAPH_NOT_CLOSED] = "its capture did not end inside watch(): markers never cleared",
    [CD_GRAPH_NOT_STARTED] = "the replay had not begun",
    [CD_GRAPH_ALL_DONE] = "every node of the graph finished",
    [CD_GRAPH_BROKEN] = "its markers could not be captured",
    [CD_GRAPH_ADOPTED] = "captured before watching: no markers inside it",
};

/* Why a node of a graph captured before watching is not at its own line
 * (CD_ADOPT_LINE_*). */
static const char *const line_why[] = {
    [CD_ADOPT_LINE_UNSEEN] = "the capture's beginning was not seen (it began before cuda_debug "
                             "was imported, or not by torch.cuda.CUDAGraph.capture_begin)",
    [CD_ADOPT_LINE_TRACED] = "a tracer (a debugger, coverage) was set during the capture, so its "
                             "launches' lines were not followed",
    [CD_ADOPT_LINE_FULL] = "the capture made more runs of nodes than are followed (4096)",
    [CD_ADOPT_LINE_NO_USER] = "no frame of the user's made it",
    [CD_ADOPT_LINE_NO_FRAMES] = "this Python's frames cannot be read",
};

/* "    (the line that ended its capture, not the launch's: why)\n" for a node
 * whose record's line is not its launch's. */
static void put_line_why(cd_out *o, uint32_t g)
{
    int why = cd_graph_node_line(g);
    if (why <= CD_ADOPT_LINE_OWN || why >= (int)CD_N_OF(line_why) || !line_why[why])
        return;
    cd_out_puts(o, "    (the line that ended its capture, not the launch's: ");
    cd_out_puts(o, line_why[why]);
    cd_out_puts(o, ")\n");
}

static void put_node_name(cd_out *o, const cd_watch_record *nr, uint32_t index,
                          const char *tail)
{
    cd_out_launch_name(o, nr, 1);
    cd_out_puts(o, " (node ");
    cd_out_u(o, index);
    cd_out_puts(o, " of a CUDA graph");
    cd_out_puts(o, tail);
}

/* The nodes the device's assert text names (or fits), by the one rule
 * (verdict.c) over the assert lines kept (not from a signal: reading them
 * takes the tee's lock); at most max. */
static int named_by_asserts(const uint32_t *all, int n, uint32_t *out, int max)
{
    char text_buf[2048];
    cd_verdict_cand c[256];
    size_t tlen = cd_tee_recent_asserts(text_buf, sizeof text_buf);
    if (!tlen)
        return 0;
    int k = 0;
    for (int i = 0; i < n && i < 256; i++) {
        cd_watch_record nr;
        uint32_t index;
        int done;
        c[k] = (cd_verdict_cand){.level = -1, .tag = (int)all[i]};
        if (cd_graph_node(all[i], &nr, &index, &done) == 0)
            c[k].mangled = cd_interned(nr.kernel);
        k++;
    }
    cd_verdict v;
    int kept = cd_verdict_decide(c, k, text_buf, tlen, NULL, &v);
    int o = 0;
    for (int i = 0; v.named && i < kept && o < max; i++)
        out[o++] = (uint32_t)c[i].tag;
    return o;
}

int cd_graph_report_nodes(const cd_watch_record *r, uint32_t *nodes, int max, int *status,
                          int *capture, int from_signal)
{
    uint32_t all[256];
    int n = cd_graph_unfinished(r, all, 256, status, capture);
    if (*status == CD_GRAPH_ADOPTED)
        return from_signal ? 0 : named_by_asserts(all, n, nodes, max);
    int k = 0, o = 0, have = n < 256 ? n : 256;
    uint32_t named[256];
    if (n > 1 && !from_signal)         /* candidates the device's text names go first */
        k = named_by_asserts(all, have, named, 256);
    for (int i = 0; i < k && o < max; i++)
        nodes[o++] = named[i];
    for (int i = 0; i < have && o < max; i++) {
        int dup = 0;
        for (int j = 0; j < k && !dup; j++)
            dup = named[j] == all[i];
        if (!dup)
            nodes[o++] = all[i];
    }
    return n;                          /* all of them; nodes[] holds the first max */
}

void cd_out_graph_why(cd_out *o, int status, int capture)
{
    cd_out_puts(o, status >= 0 && status < (int)CD_N_OF(why) && why[status] ? why[status]
                                                                            : "nodes unknown");
    cd_graph_capture_info k;
    if (status == CD_GRAPH_ADOPTED && cd_graph_capture(capture, &k) == 0) {
        cd_out_puts(o, " (");
        cd_out_u(o, k.n_nodes);
        cd_out_puts(o, k.n_nodes == 1 ? " kernel node" : " kernel nodes");
        cd_out_puts(o, ", none named by the device's text)");
    }
}

void cd_out_graph_label(cd_out *o, int n, int status, int capture)
{
    cd_graph_capture_info k;
    int every = cd_graph_capture(capture, &k) == 0 ? (int)k.every : 1;
    if (status == CD_GRAPH_ADOPTED) {
        cd_out_puts(o, n > 1 ? "  culprit (one of the nodes the device's text names): "
                             : "  culprit (named by the device's text): ");
    } else if (every > 1) {
        cd_out_puts(o, "  culprit (one of ");
        cd_out_u(o, (unsigned)n);
        cd_out_puts(o, " nodes after the last marker written; a marker every ");
        cd_out_u(o, (unsigned)every);
        cd_out_puts(o, " nodes): ");
    } else {
        cd_out_puts(o, "  culprit (one of the first unfinished nodes per stream of the graph): ");
    }
}

/* "launch #N, stream S, thread T)": the replay's own launch, closing its line. */
static void put_replay_launch(cd_out *o, const cd_watch_record *r, uint64_t seq)
{
    cd_out_puts(o, "launch #");
    cd_out_u(o, seq);
    cd_out_puts(o, ", stream ");
    cd_out_hex(o, r->stream);
    cd_out_puts(o, ", thread ");
    cd_out_u(o, (unsigned)r->thread_id);
    cd_out_puts(o, ")\n");
}

void cd_out_graph_replay(cd_out *o, const cd_watch_record *r, uint64_t seq, const char *label,
                         int from_signal)
{
    uint32_t nodes[SHOWN + 1];
    int status, capture;
    int k = cd_graph_report_nodes(r, nodes, SHOWN + 1, &status, &capture, from_signal);
    int shown = 0;
    for (int j = 0; j < k && j < SHOWN + 1 && shown < SHOWN; j++) {
        cd_watch_record nr;
        uint32_t index;
        int done;
        if (cd_graph_node(nodes[j], &nr, &index, &done) != 0)
            continue;
        if (shown)
            cd_out_puts(o, "  or: ");
        else if (k > 1 || status == CD_GRAPH_ADOPTED)
            cd_out_graph_label(o, k, status, capture);
        else
            cd_out_puts(o, label);
        put_node_name(o, &nr, index, status == CD_GRAPH_ADOPTED ? " captured before watching; replay "
                                                                : "; replay ");
        put_replay_launch(o, r, seq);
        cd_out_location_as(o, "captured", nr.frames, nr.n_frames, 0);
        put_line_why(o, nodes[j]);
        shown++;
    }
    if (k > shown && shown) {
        cd_out_puts(o, "  and ");
        cd_out_u(o, (unsigned)(k - shown));
        cd_out_puts(o, " more\n");
    }
    if (!shown) {
        cd_out_puts(o, label);
        cd_out_puts(o, "a CUDA graph replay (");
        cd_out_graph_why(o, status, capture);
        cd_out_puts(o, "; ");
        put_replay_launch(o, r, seq);
        uint32_t ended_at[CD_RING_FRAMES];
        int n = status == CD_GRAPH_ADOPTED ? cd_graph_capture_ended_at(capture, ended_at,
                                                                       CD_RING_FRAMES) : 0;
        if (n > 0)                     /* the graph's own line: its capture's end */
            cd_out_location_as(o, "captured", ended_at, n, 0);
    }
    cd_out_location_as(o, "replayed", r->frames, r->n_frames, 0);
}

/* A replay among a hang report's unfinished launches: the node still running
 * (with markers behind every K-th node, one of the candidates: an NCCL kernel
 * among them first, the likeliest to wait), then the in-flight details (the
 * caller's `details`, written after the first line's name), the others. */
void cd_out_graph_inflight(cd_out *o, const cd_watch_record *r,
                           void (*details)(cd_out *, const void *), const void *arg)
{
    uint32_t nodes[64];
    int status, capture;
    int k = cd_graph_report_nodes(r, nodes, 64, &status, &capture, 1);
    int have = k < 64 ? k : 64, first = -1;
    cd_watch_record nr, best;
    uint32_t index, best_index = 0;
    int done;
    for (int j = 0; j < have; j++) {
        char coll[8];
        if (cd_graph_node(nodes[j], &nr, &index, &done) != 0)
            continue;
        int nccl = cd_collective_name(&nr, coll, sizeof coll) > 0;
        if (first < 0 || nccl) {
            first = j;
            best = nr;
            best_index = index;
        }
        if (nccl)
            break;
    }
    cd_out_puts(o, "  ");
    if (first >= 0) {
        put_node_name(o, &best, best_index, "");
        if (k > 1) {
            cd_graph_capture_info ci;
            cd_out_puts(o, "; one of ");
            cd_out_u(o, (unsigned)k);
            cd_out_puts(o, " nodes after the last marker written");
            if (cd_graph_capture(capture, &ci) == 0 && ci.every > 1) {
                cd_out_puts(o, ", a marker every ");
                cd_out_u(o, ci.every);
                cd_out_puts(o, " nodes");
            }
        }
        cd_out_puts(o, ")");
    } else {
        cd_out_puts(o, "a CUDA graph replay (");
        cd_out_graph_why(o, status, capture);
        cd_out_puts(o, ")");
    }
    details(o, arg);
    if (first >= 0) {
        cd_out_location_as(o, "  captured", best.frames, best.n_frames, 0);
        int shown = 1;
        for (int j = 0; j < have && shown < SHOWN; j++) {
            if (j == first || cd_graph_node(nodes[j], &nr, &index, &done) != 0)
                continue;
            cd_out_puts(o, "    or: ");
            put_node_name(o, &nr, index, ")\n");
            cd_out_location_as(o, "    captured", nr.frames, nr.n_frames, 0);
            shown++;
        }
        if (k > shown) {
            cd_out_puts(o, "    and ");
            cd_out_u(o, (unsigned)(k - shown));
            cd_out_puts(o, " more nodes\n");
        }
    }
    cd_out_location_as(o, "  replayed", r->frames, r->n_frames, 0);
}
