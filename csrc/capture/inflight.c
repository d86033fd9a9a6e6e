/*
 * capture/inflight.c: what is still running. For hangs: per stream, the oldest
 * launch whose completion marker has not come back, how long ago it was
 * launched, and how many launches queue behind it.
 *
 * One pass over the watch ring's window (the last CD_WATCH_RING launches),
 * oldest first, reading host memory only: the ring records and the pinned
 * completion slots. No CUDA call, no lock, no allocation: safe in a signal
 * handler (the dump signal), from the hang watcher's thread, and while
 * another thread is stuck inside a CUDA call. A stream completes its work in
 * order, so per stream the first launch without its marker is the oldest
 * unfinished one and every later launch on that stream waits behind it; a
 * completed launch after it means the marker was lost (the record is then
 * dropped, never reported). Launches without a marker (an allocation or a
 * write failed) are skipped: their completion is unknown.
 *
 * The collective of an NCCL launch, for reports across ranks: the
 * torch.distributed function that issued it (the innermost frame in
 * distributed_c10d.py: all_reduce, all_gather_into_tensor, barrier...), else
 * the collective its kernel is named after (ncclDevKernel_AllReduce_Sum_f32_
 * RING_LL: all_reduce). NCCL's generic kernels (ncclDevKernel_Generic_*) name
 * none: "collective".
 */
#include "capture/capture.h"

#include <string.h>

/* Flags this search knows. A record with any other flag (launches captured
 * into a graph, whose markers come only at replay) is not an unfinished
 * launch of a stream. */
#define KNOWN_FLAGS (CD_WATCH_MARKED | CD_WATCH_GRAPH | CD_WATCH_USER_LAST)

static int same_stream(const cd_watch_record *a, const cd_watch_record *b)
{
    if (a->stream != b->stream || a->ctx != b->ctx)
        return 0;
    /* The per-thread default stream is one stream per thread. */
    return a->stream != (uintptr_t)CU_STREAM_PER_THREAD || a->thread_id == b->thread_id;
}

int cd_watch_inflight(cd_inflight *out, int max, cd_inflight_summary *sum)
{
    memset(sum, 0, sizeof *sum);
    uint64_t now = cd_watch_seq();
    uint64_t window = CD_WATCH_RING < CD_WATCH_SLOTS ? CD_WATCH_RING : CD_WATCH_SLOTS;
    uint64_t first = now >= window ? now - window + 1 : 1;
    int n = 0;
    for (uint64_t seq = first; seq <= now; seq++) {
        cd_watch_record r;
        if (cd_watch_get(seq, &r) != 0)
            continue;
        sum->scanned++;
        sum->newest_seq = seq;
        sum->newest_ns = r.t_ns;
        if (r.flags & ~KNOWN_FLAGS)
            continue;
        int done = cd_watch_done(&r, seq);
        if (done < 0) {
            sum->unknown++;
            continue;
        }
        int i = 0;
        while (i < n && !(out[i].last_seq && same_stream(&out[i].rec, &r)))
            i++;
        if (done) {                /* the stream got this far: nothing before it waits */
            if (i < n)
                out[i].last_seq = 0;
            continue;
        }
        if (i == n) {
            int free_slot = 0;     /* an entry emptied by a completed launch */
            while (free_slot < n && out[free_slot].last_seq)
                free_slot++;
            if (free_slot == n && n == max) {
                sum->streams_cut++;
                continue;
            }
            i = free_slot;
            if (i == n)
                n++;
            memcpy(&out[i].rec, &r, sizeof r);
            out[i].queued = 0;
        } else {
            out[i].queued++;
        }
        out[i].last_seq = seq;
    }
    /* Drop the emptied entries; oldest unfinished launch first. */
    int k = 0;
    for (int i = 0; i < n; i++)
        if (out[i].last_seq) {
            if (k != i)
                memcpy(&out[k], &out[i], sizeof out[i]);
            k++;
        }
    for (int i = 1; i < k; i++) {
        cd_inflight t;
        memcpy(&t, &out[i], sizeof t);
        int j = i - 1;
        while (j >= 0 && out[j].rec.seq > t.rec.seq) {
            memcpy(&out[j + 1], &out[j], sizeof t);
            j--;
        }
        memcpy(&out[j + 1], &t, sizeof t);
    }
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
