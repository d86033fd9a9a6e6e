/*
 * capture/inflight.c: what is still running. For hangs: per stream, the oldest
 * launch whose completion marker has not come back, how long ago it was
 * launched, and how many launches queue behind it.
 *
 * One pass over the watch ring's window (cd_watch_scan, watch_ring.c), reading
 * host memory only: the ring records and the pinned completion slots. No CUDA
 * call, no lock, no allocation: safe in a signal handler (the dump signal),
 * from the hang watcher's thread, and while another thread is stuck inside a
 * CUDA call. A stream completes its work in order, so a marker that did not
 * come back says that its launch, or one of the launches since the stream's
 * last returned marker, has not finished, and every later launch waits behind
 * it: the stream's oldest unfinished launch is the first of those candidates
 * (exactly it when every launch has its marker, watch(exact=True)). A stream
 * whose newest launches have no marker yet is not reported: their completion
 * is unknown (the host's next wait on it puts a marker behind them).
 *
 * The collective of an NCCL launch, for reports across ranks: the
 * torch.distributed function that issued it (the innermost frame in
 * distributed_c10d.py: all_reduce, all_gather_into_tensor, barrier...), else
 * the collective its kernel is named after (ncclDevKernel_AllReduce_Sum_f32_
 * RING_LL: all_reduce). NCCL's generic kernels (ncclDevKernel_Generic_*) name
 * none: "collective".
 */
#include "capture/capture.h"

#include <string.h>     /* memset, memcpy, strlen, ... */

int cd_watch_seen_finished(uint32_t kernel, uint64_t before)
{
    for (uint64_t seq = before - 1, n = 0; seq && n < 4096; seq--, n++) {
        cd_watch_record r;
        if (cd_watch_get(seq, &r) != 0)
            break;
        if (r.kernel == kernel && !(r.flags & CD_WATCH_CAPTURED) && cd_watch_done(&r, seq) == 1)
            return 1;
    }
    return 0;
}

int cd_watch_likeliness(const cd_watch_record *r, uint64_t first)
{
    return cd_origin_rank(r->origin) * 2 + cd_watch_seen_finished(r->kernel, first);
}

/* The likeliest stuck launch of a stream's candidates (see capture.h). */
static uint64_t likeliest(const cd_stream_scan *e)
{
    uint64_t best = e->cand[0];
    int best_score = 1 << 30;
    uint32_t n = e->pending < CD_SCAN_CANDIDATES ? e->pending : CD_SCAN_CANDIDATES;
    for (uint32_t j = 0; j < n; j++) {
        cd_watch_record r;
        if (cd_watch_get(e->cand[j], &r) != 0)
            continue;
        int score = n > 1 ? cd_watch_likeliness(&r, e->cand[0]) : 0;
        if (score < best_score) {
            best_score = score;
            best = e->cand[j];
        }
    }
    return best;
}

int cd_watch_inflight(cd_inflight *out, int max, cd_inflight_summary *sum,
                      cd_stream_scan *scratch)
{
    memset(sum, 0, sizeof *sum);
    uint64_t now = cd_watch_seq();
    int n = cd_watch_scan(0, scratch, max, &sum->streams_cut);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const cd_stream_scan *e = &scratch[i];
        if (!e->open) {            /* no marker missing: its last launches' completion is unknown */
            sum->unknown += e->pending;
            continue;
        }
        cd_watch_record first;
        const uint64_t lead = likeliest(e);
        if (cd_watch_get(e->cand[0], &first) != 0 || cd_watch_get(lead, &out[k].rec) != 0)
            continue;              /* overwritten since the scan */
        uint32_t at = 0;           /* the lead's place among the candidates */
        while (at + 1 < e->pending && at + 1 < CD_SCAN_CANDIDATES && e->cand[at] != lead)
            at++;
        out[k].first_seq = e->cand[0];
        out[k].first_ns = first.t_ns;
        out[k].queued = e->pending + e->after - 1 - at;   /* behind the lead */
        out[k].last_seq = e->newest;
        out[k].candidates = e->pending;
        out[k].open_seq = e->open;
        k++;
    }
    /* The newest launch recorded, on any stream. */
    cd_watch_record r;
    for (uint64_t seq = now; seq && seq + 64 > now; seq--)
        if (cd_watch_get(seq, &r) == 0) {
            sum->newest_seq = seq;
            sum->newest_ns = r.t_ns;
            break;
        }
    uint64_t window = CD_WATCH_RING < CD_WATCH_SLOTS ? CD_WATCH_RING : CD_WATCH_SLOTS;
    sum->scanned = (uint32_t)(now < window ? now : window);
    sum->now_ns = cd_clock_ns();
    return k;
}

/* ------------------------------------------------------- collectives -- */

static const struct {
    const char *nccl, *name;
} collectives[] = {
    {"AllReduce", "all_reduce"},     {"AllGather", "all_gather"},
    {"ReduceScatter", "reduce_scatter"}, {"Broadcast", "broadcast"},
    {"Reduce", "reduce"},            {"SendRecv", "send/recv"},
    {"Send", "send"},                {"Recv", "recv"},
    {"AllToAll", "all_to_all"},      {"AlltoAll", "all_to_all"},
};

static size_t copy_out(const char *s, size_t n, char *out, size_t cap)
{
    if (n >= cap)
        n = cap - 1;
    memcpy(out, s, n);
    out[n] = '\0';
    return n;
}

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

/* "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ncclKernel_AllReduce_RING_LL_Sum_float",
 * mangled or not: the collective's name, NULL when it names none; *is_nccl
 * says whether the kernel is NCCL's at all. */
static const char *kernel_collective(const char *k, int *is_nccl)
{
    *is_nccl = 0;
    if (!(k = cd_nccl_kernel(k)))
        return NULL;
    *is_nccl = 1;
    const char *p = strstr(k, "Kernel_");
    if (!p)
        return NULL;
    p += 7;
    size_t len = 0;
    while (p[len] && p[len] != '_' && p[len] != '(' && p[len] != '<' && len < 32)
        len++;
    for (size_t i = 0; i < sizeof collectives / sizeof collectives[0]; i++)
        if (strlen(collectives[i].nccl) == len && !memcmp(p, collectives[i].nccl, len))
            return collectives[i].name;
    return NULL;
}

size_t cd_collective_name(const cd_watch_record *r, char *out, size_t cap)
{
    if (cap == 0)
        return 0;
    out[0] = '\0';
    int is_nccl;
    const char *from_kernel = kernel_collective(cd_interned(r->kernel_short), &is_nccl);
    if (!is_nccl)
        return 0;
    for (int i = 0; i < r->n_frames && i < CD_RING_FRAMES; i++) {
        cd_location loc;
        const char *file, *func;
        if (cd_location_get(r->frames[i], &loc) != 0 || !(file = cd_interned(loc.file)) ||
            !(func = cd_interned(loc.func)))
            continue;
        if (ends_with(file, "torch/distributed/distributed_c10d.py") && func[0] != '_' &&
            func[0] != '<')
            return copy_out(func, strlen(func), out, cap);
    }
    const char *name = from_kernel ? from_kernel : "collective";
    return copy_out(name, strlen(name), out, cap);
}
