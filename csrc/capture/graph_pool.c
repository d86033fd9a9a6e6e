/*
 * capture/graph_pool.c: the graph code's capture entries and node pool.
 *
 * A capture entry per graph being captured, or adopted, until nothing holds
 * it (graph_execs.c); its token (16 bits: the entry and its generation) is
 * what records and executables keep. Node records (and their slots, in the
 * context's buffer) are handed out in chunks of CHUNK to one capture each;
 * a capture's chunks run on where they can, so one memset clears its slots.
 * Taken under cd_gp_lock (cold: captures, adoption); read lock-free.
 */
#include "capture/graphs.h"

#include <string.h>     /* memset */

capture_t cd_gp_caps[MAX_CAPTURES];
atomic_int cd_gp_caps_hw;
static unsigned cap_cursor;                     /* next entry to try (cd_gp_lock) */
cd_watch_record cd_gp_nodes[CD_GRAPH_NODES];
node_info cd_gp_info[CD_GRAPH_NODES];
static _Atomic uint16_t chunk_owner[N_CHUNKS];  /* the capture's token; 0 free */
static _Atomic uint32_t chunk_fill[N_CHUNKS];   /* nodes handed out in it */
static _Atomic uint32_t chunk_gen[N_CHUNKS];    /* moves at each reuse */
static unsigned chunk_cursor;                   /* under cd_gp_lock */
static atomic_uint n_chunks_used;
pthread_mutex_t cd_gp_lock = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint_fast64_t n_captures_freed;
static _Thread_local uint64_t tls_cap_id;
static _Thread_local int tls_cap = -1;

uint16_t cd_gp_token_of(int c, uint32_t gen)
{
    return (uint16_t)(1u + ((gen % TOKEN_GENS) << CAP_BITS | (uint32_t)c));
}

int cd_gp_entry_of(uint32_t token)
{
    if (!token || token > 0xFFFF)
        return -1;
    int c = (int)((token - 1) & (MAX_CAPTURES - 1));
    uint32_t gen = atomic_load_explicit(&cd_gp_caps[c].gen, memory_order_acquire);
    if (cd_gp_token_of(c, gen) != token ||
        atomic_load_explicit(&cd_gp_caps[c].state, memory_order_acquire) == CAP_FREE)
        return -1;
    return c;
}

uint16_t cd_gp_token_now(int c) { return cd_gp_token_of(c, atomic_load(&cd_gp_caps[c].gen)); }

int cd_gp_capture_info(CUstream s, uint64_t *id, CUgraph *graph, const CUgraphNode **deps,
                        size_t *n_deps)
{
    if (!cd_drv.cuStreamGetCaptureInfo)
        return -1;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t v = 0;
#if CUDA_VERSION >= 12030
    CUresult rc = cd_drv.cuStreamGetCaptureInfo(s, &st, &v, graph, deps, NULL, n_deps);
#else
    CUresult rc = cd_drv.cuStreamGetCaptureInfo(s, &st, &v, graph, deps, n_deps);
#endif
    if (rc != CUDA_SUCCESS || st != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return -1;
    *id = v;
    return 0;
}

int cd_gp_capture_id(CUstream s, uint64_t *id, CUgraph *graph)
{
    return cd_gp_capture_info(s, id, graph, NULL, NULL);
}

int cd_gp_find_capture(uint64_t id)
{
    if (tls_cap >= 0 && tls_cap_id == id && atomic_load(&cd_gp_caps[tls_cap].state) == CAP_OPEN &&
        cd_gp_caps[tls_cap].id == id)
        return tls_cap;
    int n = atomic_load_explicit(&cd_gp_caps_hw, memory_order_acquire);
    for (int c = n - 1; c >= 0; c--)
        if (atomic_load(&cd_gp_caps[c].state) == CAP_OPEN && cd_gp_caps[c].id == id) {
            tls_cap = c;
            tls_cap_id = id;
            return c;
        }
    return -1;
}
/* ------------------------------------------------------------ chunks -- */

/* A free chunk for capture c, the one after `prefer` if free (so a capture's
 * slots run on and one memset clears them), or -1 (cd_gp_lock held). Its node
 * records are unpublished, its slots cleared, its generation moved. */
static int take_chunk(int c, int prefer)
{
    int ch = -1;
    if (prefer >= 0 && prefer < N_CHUNKS && !atomic_load(&chunk_owner[prefer]))
        ch = prefer;
    for (unsigned i = 0; ch < 0 && i < N_CHUNKS; i++) {
        unsigned k = (chunk_cursor + i) % N_CHUNKS;
        if (!atomic_load(&chunk_owner[k]))
            ch = (int)k;
    }
    if (ch < 0)
        return -1;
    chunk_cursor = (unsigned)ch + 1;
    uint32_t gen = atomic_load(&chunk_gen[ch]) + 1;
    cd_slots slots;
    int has_slots = cd_watch_context_slots(cd_gp_caps[c].ctx, cd_gp_caps[c].ctx_gen, &slots) == 0;
    for (int i = 0; i < CHUNK; i++) {
        long g = (long)ch * CHUNK + i;
        atomic_store_explicit(&cd_gp_nodes[g].seq, 0, memory_order_release);
        if (has_slots)
            *cd_node_slot(&slots, (uint32_t)g) = 0;
    }
    atomic_store(&chunk_gen[ch], gen);
    atomic_store(&chunk_fill[ch], 0);
    atomic_store_explicit(&chunk_owner[ch], cd_gp_token_now(c), memory_order_release);
    atomic_fetch_add(&n_chunks_used, 1);
    return ch;
}

/* A node for capture c, or -1 when every chunk is in use (cd_gp_lock held). */
long cd_gp_take_node(int c)
{
    capture_t *k = &cd_gp_caps[c];
    if (k->chunk < 0 || k->chunk_used == CHUNK) {
        int ch = take_chunk(c, k->chunk < 0 ? -1 : k->chunk + 1);
        if (ch < 0)
            return -1;
        k->chunk = ch;
        k->chunk_used = 0;
    }
    long g = (long)k->chunk * CHUNK + k->chunk_used++;
    cd_gp_info[g].gen = atomic_load(&chunk_gen[k->chunk]);
    atomic_store(&chunk_fill[k->chunk], k->chunk_used);
    return g;
}

/* Every chunk of capture c back to the pool, the entry free (cd_gp_lock held). */
void cd_gp_release_locked(int c)
{
    capture_t *k = &cd_gp_caps[c];
    uint16_t token = cd_gp_token_now(c);
    for (int ch = 0; ch < N_CHUNKS; ch++)
        if (atomic_load(&chunk_owner[ch]) == token) {
            atomic_store_explicit(&chunk_owner[ch], 0, memory_order_release);
            atomic_fetch_sub(&n_chunks_used, 1);
        }
    atomic_store(&k->graph, 0);
    for (int i = 0; i < CAP_CLONES; i++)
        atomic_store(&k->clones[i], 0);
    atomic_store_explicit(&k->state, CAP_FREE, memory_order_release);
    atomic_fetch_add(&n_captures_freed, 1);
    if (tls_cap == c)
        tls_cap = -1;
}

void cd_gp_unref_locked(int c)
{
    if (--cd_gp_caps[c].refs <= 0 && !cd_gp_caps[c].pinned)
        cd_gp_release_locked(c);
}

/* A free capture entry, taken (state still FREE), or -1 (cd_gp_lock held). */
int cd_gp_take_entry(void)
{
    for (unsigned i = 0; i < MAX_CAPTURES; i++) {
        unsigned c = (cap_cursor + i) % MAX_CAPTURES;
        if (atomic_load(&cd_gp_caps[c].state) != CAP_FREE)
            continue;
        cap_cursor = c + 1;
        capture_t *k = &cd_gp_caps[c];
        uint32_t gen = atomic_load(&k->gen) + 1;
        memset(k, 0, sizeof *k);
        atomic_store(&k->gen, gen);
        k->chunk = -1;
        if ((int)c >= atomic_load(&cd_gp_caps_hw))
            atomic_store_explicit(&cd_gp_caps_hw, (int)c + 1, memory_order_release);
        return (int)c;
    }
    return -1;
}

void cd_gp_publish(long g)
{
    atomic_store_explicit(&cd_gp_nodes[g].seq, (uint64_t)g + 1, memory_order_release);
}

int cd_gp_chunk_next(uint16_t token, int after)
{
    for (int ch = after + 1; ch < N_CHUNKS; ch++)
        if (atomic_load(&chunk_owner[ch]) == token)
            return ch;
    return -1;
}

uint32_t cd_gp_chunk_fill(int ch) { return atomic_load(&chunk_fill[ch]); }

void cd_gp_pool_stats(cd_graph_counters *out)
{
    out->captures_freed = atomic_load(&n_captures_freed);
    int live = 0, n = atomic_load(&cd_gp_caps_hw);
    for (int c = 0; c < n; c++)
        live += atomic_load(&cd_gp_caps[c].state) != CAP_FREE;
    out->captures = live;
    out->chunks_used = (int)atomic_load(&n_chunks_used);
    out->chunks = N_CHUNKS;
}

void cd_graph_pool_fork(int op)
{
    cd_fork_lock(&cd_gp_lock, op);
    if (op == CD_FORK_CHILD) {
        tls_cap = -1;              /* the forking thread's capture is the parent's */
        tls_cap_id = 0;
    }
}
