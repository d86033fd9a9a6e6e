/*
 * capture/coverage.c: what the watch did not see. A watch() covers every
 * launch while CUPTI's callback is ours; a profiler that takes CUPTI (a
 * torch.profiler window: hooks/scopes.c's hand-over), or one that held it
 * when the watch opened, leaves a gap until CUPTI comes back. In a gap the
 * launch hooks still record the runtime's launches (PyTorch's own:
 * hooks/runtime_launch.c's record mode) where they are on; the launches of
 * every other caller of the driver (Triton, cuBLAS/cuDNN, CuPy, raw driver
 * code) are not recorded.
 *
 * The last CD_GAPS gaps, each with the watch-ring seq and the Python line
 * ("file:line", interned) of its start and end: the reports say what was not
 * covered, and since when, where a fault's culprit may lie in one. Written
 * under cd_sub_lock (cold: a profiler starts or stops); read from host memory
 * only (a fault path, a signal handler): a gap is published by its `state`
 * word last, and a reader that sees it change while copying drops the copy.
 */
#include "capture/capture.h"

#include <string.h>     /* memset, memcpy */

static cd_gap gaps[CD_GAPS];
static _Atomic uint32_t gap_state[CD_GAPS];   /* 2 * generation + 1 while written */
static atomic_uint n_gaps;                    /* gaps ever opened */
static atomic_int open_now;                   /* 1 + index of the open gap, 0 none */

void cd_coverage_gap_open(int why, uint32_t where, int hooks_recording)
{
    if (atomic_load(&open_now))
        return;                               /* one gap at a time: the open one goes on */
    unsigned n = atomic_fetch_add(&n_gaps, 1);
    int i = (int)(n % CD_GAPS);
    atomic_fetch_add(&gap_state[i], 1);       /* odd: being written */
    cd_gap *g = &gaps[i];
    memset(g, 0, sizeof *g);
    g->from_seq = cd_watch_seq() + 1;        /* the first launch in it */
    g->from_ns = cd_clock_ns();
    g->from_where = where;
    g->why = (uint8_t)why;
    g->hooks_recording = (uint8_t)(hooks_recording != 0);
    g->number = n + 1;
    atomic_fetch_add(&gap_state[i], 1);       /* even: published */
    atomic_store(&open_now, i + 1);
}

void cd_coverage_gap_close(uint32_t where)
{
    int i = atomic_load(&open_now) - 1;
    if (i < 0)
        return;
    atomic_fetch_add(&gap_state[i], 1);
    gaps[i].to_seq = cd_watch_seq();         /* the last launch in it */
    gaps[i].to_ns = cd_clock_ns();
    gaps[i].to_where = where;
    gaps[i].closed = 1;
    atomic_fetch_add(&gap_state[i], 1);
    atomic_store(&open_now, 0);
}

int cd_coverage_gap_is_open(void) { return atomic_load(&open_now) != 0; }

int cd_coverage_gaps(cd_gap *out, int max, unsigned *total)
{
    unsigned n = atomic_load(&n_gaps);
    if (total)
        *total = n;
    int k = 0;
    unsigned first = n > CD_GAPS ? n - CD_GAPS : 0;
    for (unsigned j = first; j < n && k < max; j++) {
        int i = (int)(j % CD_GAPS);
        uint32_t s0 = atomic_load_explicit(&gap_state[i], memory_order_acquire);
        if (s0 & 1)
            continue;
        memcpy(&out[k], &gaps[i], sizeof out[k]);
        atomic_thread_fence(memory_order_acquire);
        if (atomic_load_explicit(&gap_state[i], memory_order_relaxed) != s0 ||
            out[k].number != j + 1)
            continue;
        k++;
    }
    return k;
}

void cd_coverage_fork(int op)
{
    if (op == CD_FORK_CHILD) {                /* the child watches nothing of the parent's */
        atomic_store(&open_now, 0);
        atomic_store(&n_gaps, 0);
        memset(gaps, 0, sizeof gaps);
        for (int i = 0; i < CD_GAPS; i++)
            atomic_store(&gap_state[i], 0);
    }
}
