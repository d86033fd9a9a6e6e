/*
 * capture/graph_execs.c: which captured graph each graph executable runs, and
 * what holds a capture (its graph, its clones, its executables).
 *
 * An executable is paired with the capture that made its graph (CUPTI's
 * GRAPHEXEC_CREATED, or Python for a graph captured before watching:
 * graph_adopt.c) and the pair dropped when the executable is destroyed
 * (GRAPHEXEC_DESTROY_STARTING); watch_ring.c asks, for a cuGraphLaunch's record, which capture the
 * replay runs (cd_graph_replayed: every graph launch while watching).
 *
 * An open-addressed table of EXEC_SLOTS entries keyed by the executable's
 * handle. An executable lives within EXEC_REACH slots of its home slot (the
 * hash); reach[home] is one more than the farthest of the keys of that home,
 * so a lookup reads reach[home] entries and no more: most often one, never more
 * than EXEC_REACH, however many executables came and went. Written under
 * exec_lock (cold: instantiation, destruction); read lock-free: an entry's
 * token is stored before its key (release), and a key is cleared, never
 * moved, so a reader never misses a live entry. A destroyed executable's entry
 * is freed at once, and reach[] shrinks back to what the keys left need.
 * When no slot within reach of a home is free (EXEC_SLOTS / 4 live
 * executables hashing into one region of 32 slots: not seen in practice) the
 * executable is not known (its replays: capture unknown; counted).
 */
#include "capture/graphs.h"

#define EXEC_SLOTS 8192                /* a power of two */
#define EXEC_REACH 32

static struct {
    _Atomic uintptr_t exec;            /* 0: free */
    _Atomic uint32_t token;            /* the capture's token (graph_pool.c) */
} slots[EXEC_SLOTS];
static _Atomic uint8_t reach[EXEC_SLOTS];
static pthread_mutex_t exec_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint n_live, n_refused;

static size_t exec_hash(uintptr_t e)
{
    uint64_t h = (uint64_t)e * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 40) & (EXEC_SLOTS - 1);
}

static size_t at(size_t home, unsigned d) { return (home + d) & (EXEC_SLOTS - 1); }

/* The slot of key, or -1 (exec_lock held, or a reader). */
static long find(uintptr_t key, size_t home)
{
    unsigned r = atomic_load_explicit(&reach[home], memory_order_acquire);
    for (unsigned d = 0; d < r; d++) {
        size_t j = at(home, d);
        if (atomic_load_explicit(&slots[j].exec, memory_order_acquire) == key)
            return (long)j;
    }
    return -1;
}

int cd_graph_exec_set(CUgraphExec exec, uint32_t token, uint32_t *old)
{
    uintptr_t key = (uintptr_t)exec;
    *old = 0;
    if (!key || !token)
        return -1;
    size_t home = exec_hash(key);
    int rc = -1;
    pthread_mutex_lock(&exec_lock);
    long j = find(key, home);
    if (j >= 0) {                      /* known (a destruction we did not see): re-paired */
        *old = atomic_load(&slots[j].token);
        atomic_store_explicit(&slots[j].token, token, memory_order_release);
        rc = 0;
    } else {
        for (unsigned d = 0; d < EXEC_REACH; d++) {
            size_t k = at(home, d);
            if (atomic_load_explicit(&slots[k].exec, memory_order_relaxed))
                continue;
            atomic_store_explicit(&slots[k].token, token, memory_order_relaxed);
            atomic_store_explicit(&slots[k].exec, key, memory_order_release);
            if (atomic_load(&reach[home]) < d + 1)
                atomic_store_explicit(&reach[home], (uint8_t)(d + 1), memory_order_release);
            atomic_fetch_add(&n_live, 1);
            rc = 0;
            break;
        }
        if (rc)
            atomic_fetch_add(&n_refused, 1);
    }
    pthread_mutex_unlock(&exec_lock);
    return rc;
}

uint32_t cd_graph_exec_take(CUgraphExec exec)
{
    uintptr_t key = (uintptr_t)exec;
    if (!key)
        return 0;
    size_t home = exec_hash(key);
    uint32_t token = 0;
    pthread_mutex_lock(&exec_lock);
    long j = find(key, home);
    if (j >= 0) {
        token = atomic_load(&slots[j].token);
        atomic_store_explicit(&slots[j].exec, 0, memory_order_release);
        atomic_store(&slots[j].token, 0);
        atomic_fetch_sub(&n_live, 1);
        /* What the keys left of this home need. */
        unsigned r = atomic_load(&reach[home]), need = 0;
        for (unsigned d = 0; d < r; d++) {
            uintptr_t k = atomic_load(&slots[at(home, d)].exec);
            if (k && exec_hash(k) == home)
                need = d + 1;
        }
        atomic_store_explicit(&reach[home], (uint8_t)need, memory_order_release);
    }
    pthread_mutex_unlock(&exec_lock);
    return token;
}

uint32_t cd_graph_exec_token(CUgraphExec exec)
{
    uintptr_t key = (uintptr_t)exec;
    long j = key ? find(key, exec_hash(key)) : -1;
    return j < 0 ? 0 : atomic_load_explicit(&slots[j].token, memory_order_acquire);
}

uint16_t cd_graph_replayed(const void *launch_params)
{
    return (uint16_t)cd_graph_exec_token(((const cuGraphLaunch_params *)launch_params)->hGraph);
}

void cd_graph_exec_stats(unsigned *live, unsigned *refused, unsigned *max_reach)
{
    *live = atomic_load(&n_live);
    *refused = atomic_load(&n_refused);
    unsigned m = 0;
    for (size_t i = 0; i < EXEC_SLOTS; i++)
        if (atomic_load_explicit(&reach[i], memory_order_relaxed) > m)
            m = atomic_load_explicit(&reach[i], memory_order_relaxed);
    *max_reach = m;
}

/* ---------------------------------------- what holds a capture -- */

/* Executable exec runs capture c's graph (cd_gp_lock held). */
int cd_gp_pair_exec(int c, CUgraphExec exec)
{
    uint16_t token = cd_gp_token_now(c);
    uint32_t old = 0;
    if (cd_graph_exec_set(exec, token, &old) != 0)
        return -1;
    cd_gp_caps[c].refs++;
    int was = cd_gp_entry_of(old); /* a destruction we did not see: that capture's hold goes */
    if (old && old != token && was >= 0)
        cd_gp_unref_locked(was);
    unsigned id;
    if (cd_drv.cuGraphExecGetId && cd_drv.cuGraphExecGetId(exec, &id) == CUDA_SUCCESS)
        for (int i = 0; i < CAP_CLONES; i++)
            if (!atomic_load(&cd_gp_caps[c].exec_ids[i]) || i == CAP_CLONES - 1) {
                atomic_store(&cd_gp_caps[c].exec_ids[i], id);
                break;
            }
    return 0;
}


/* The live capture whose graph (or a clone of it) is `graph`, newest first,
 * or -1 (cd_gp_lock held). */
static int capture_of_graph(uintptr_t graph)
{
    int n = atomic_load(&cd_gp_caps_hw);
    for (int c = n - 1; c >= 0 && graph; c--) {
        int st = atomic_load(&cd_gp_caps[c].state);
        if (st != CAP_CLOSED && st != CAP_BROKEN)
            continue;
        if (atomic_load(&cd_gp_caps[c].graph) == graph)
            return c;
        for (int i = 0; i < CAP_CLONES; i++)
            if (atomic_load(&cd_gp_caps[c].clones[i]) == graph)
                return c;
    }
    return -1;
}

void cd_graph_exec_created(CUgraph graph, CUgraphExec exec)
{
    if (!exec)
        return;
    pthread_mutex_lock(&cd_gp_lock);
    int c = capture_of_graph((uintptr_t)graph);
    if (c >= 0)
        cd_gp_pair_exec(c, exec);
    pthread_mutex_unlock(&cd_gp_lock);
}

void cd_graph_exec_destroyed(CUgraphExec exec)
{
    uint32_t token = cd_graph_exec_take(exec);
    if (!token)
        return;
    pthread_mutex_lock(&cd_gp_lock);
    int c = cd_gp_entry_of(token);
    if (c >= 0)
        cd_gp_unref_locked(c);
    pthread_mutex_unlock(&cd_gp_lock);
}

void cd_graph_destroyed(CUgraph graph)
{
    if (!graph)
        return;
    pthread_mutex_lock(&cd_gp_lock);
    int c = capture_of_graph((uintptr_t)graph);
    if (c >= 0) {
        if (atomic_load(&cd_gp_caps[c].graph) == (uintptr_t)graph)
            atomic_store(&cd_gp_caps[c].graph, 0);
        for (int i = 0; i < CAP_CLONES; i++)
            if (atomic_load(&cd_gp_caps[c].clones[i]) == (uintptr_t)graph)
                atomic_store(&cd_gp_caps[c].clones[i], 0);
        cd_gp_unref_locked(c);
    }
    pthread_mutex_unlock(&cd_gp_lock);
}

void cd_graph_cloned(CUgraph original, CUgraph clone)
{
    if (!original || !clone)
        return;
    pthread_mutex_lock(&cd_gp_lock);
    int c = capture_of_graph((uintptr_t)original);
    if (c >= 0) {
        int i = 0;
        while (i < CAP_CLONES && atomic_load(&cd_gp_caps[c].clones[i]))
            i++;
        if (i < CAP_CLONES) {
            atomic_store(&cd_gp_caps[c].clones[i], (uintptr_t)clone);
            cd_gp_caps[c].refs++;
        } else {
            cd_gp_caps[c].pinned = 1;     /* a holder of its markers we do not follow */
        }
    }
    pthread_mutex_unlock(&cd_gp_lock);
}

int cd_graph_release_exec(CUgraphExec exec)
{
    uint32_t token = cd_graph_exec_token(exec);
    if (!token)
        return -1;
    cd_graph_exec_destroyed(exec);
    return 0;
}

void cd_graph_execs_fork(int op)
{
    cd_fork_lock(&exec_lock, op);
}
