/*
 * capture/graph_execs.c: which captured graph each graph executable runs.
 *
 * graph_markers.c pairs an executable with the capture that made its graph
 * (CUPTI's GRAPHEXEC_CREATED); watch_ring.c asks, for a cuGraphLaunch's
 * record, which capture the replay runs. An open-addressed table of
 * EXEC_MAP executables: written under a lock (cold: instantiation,
 * destruction), read lock-free (a graph launch while watching: one probe
 * or a few). A destroyed executable keeps its key with capture 0, so a new
 * executable at the same address finds its own entry. When every entry is
 * taken, new executables are not known (their replays: capture unknown).
 */
#include "capture/capture.h"

#define EXEC_MAP 4096                  /* a power of two */

static struct {
    _Atomic uintptr_t exec;
    _Atomic uint32_t capture;          /* 1 + capture; 0 not ours */
} execs[EXEC_MAP];
static pthread_mutex_t exec_lock = PTHREAD_MUTEX_INITIALIZER;

static size_t exec_hash(uintptr_t e)
{
    uint64_t h = (uint64_t)e * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 40) & (EXEC_MAP - 1);
}

void cd_graph_exec_set(CUgraphExec exec, uint32_t capture1)
{
    uintptr_t key = (uintptr_t)exec;
    if (!key)
        return;
    size_t h = exec_hash(key);
    pthread_mutex_lock(&exec_lock);
    for (size_t i = 0; i < EXEC_MAP; i++) {
        size_t j = (h + i) & (EXEC_MAP - 1);
        uintptr_t k = atomic_load(&execs[j].exec);
        if (k == key || k == 0) {
            atomic_store(&execs[j].capture, capture1);
            atomic_store_explicit(&execs[j].exec, key, memory_order_release);
            break;
        }
    }
    pthread_mutex_unlock(&exec_lock);
}

uint16_t cd_graph_replayed(const void *launch_params)
{
    uintptr_t key = (uintptr_t)((const cuGraphLaunch_params *)launch_params)->hGraph;
    size_t h = exec_hash(key);
    for (size_t i = 0; key && i < EXEC_MAP; i++) {
        size_t j = (h + i) & (EXEC_MAP - 1);
        uintptr_t k = atomic_load_explicit(&execs[j].exec, memory_order_acquire);
        if (k == key)
            return (uint16_t)atomic_load_explicit(&execs[j].capture, memory_order_relaxed);
        if (k == 0)
            return 0;
    }
    return 0;
}

void cd_graph_execs_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        exec_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
        break;
    case CD_FORK_TEST_TAKE:
        pthread_mutex_lock(&exec_lock);
        break;
    case CD_FORK_TEST_GIVE:
        pthread_mutex_unlock(&exec_lock);
        break;
    }
}
