/*
 * capture/graphs.h: the graph code's private header (capture/graph_*.c only;
 * the rest of the core reads capture.h's graph sections).
 *
 * A graph replay is one cuGraphLaunch: one ring record (watch_ring.c). To
 * name the node that faulted, or the one still running in a hang, each launch
 * captured into a graph while watching gets a node record, and every K-th
 * launch of each stream of the capture (K = CUDA_DEBUG_GRAPH_MARKER_EVERY,
 * default 8: benchmarks/RESULTS.md has its cost), and every NCCL kernel, a
 * marker captured into the graph right behind it (graph_capture.c says how).
 * Which capture a replay runs: the executables' table (graph_execs.c). A
 * graph captured before watching has no markers: it is known only when Python
 * adopted it at the end of its capture (graph_adopt.c). A report reads all of
 * it with no CUDA call and no lock (graph_read.c).
 *
 *   graph_pool.c     the capture entries, their tokens, and the pool of node
 *                    records handed out in chunks (cd_gp_lock)
 *   graph_capture.c  captures begun while watching: node records and markers
 *   graph_execs.c    executables and graphs: which capture each executable
 *                    runs; a capture freed when nothing holds it any more
 *   graph_adopt.c    graphs captured before watching, adopted
 *   graph_read.c     what a replay's capture says, for reports
 *
 * Memory: a node's slot is in its capture's context's buffer (contexts.c:
 * cd_node_slot, mapped once, never freed); CD_GRAPH_NODES node records (96
 * bytes, and 88 bytes of node info: the deeper frames) and slots in all, zero
 * pages until used, handed out in chunks of CHUNK to one capture each. A
 * capture, its chunks and its entry are freed when its graph, its clones and
 * every executable made from them are destroyed, and taken again by later
 * captures: a process that captures and destroys graphs for days stays
 * watched. Each reuse moves the chunk's generation, which is part of every
 * marker value and of the capture's token, so a stale graph still running,
 * or a stale record, never passes for a new one. When every chunk is in use,
 * nodes get no record (counted).
 */
#ifndef CD_GRAPHS_H
#define CD_GRAPHS_H

#include "capture/capture.h"

#define CHUNK 64
#define N_CHUNKS (CD_GRAPH_NODES / CHUNK)
#define MAX_CAPTURES N_CHUNKS          /* each holds a chunk at least */
#define CAP_BITS 11                    /* MAX_CAPTURES == 1 << CAP_BITS */
#define TOKEN_GENS 31                  /* a token: 1 + ((gen % 31) << CAP_BITS | entry) */
#define CAP_STREAMS 16                 /* streams a capture spaces markers on; more: every node */
#define CAP_CLONES 4                   /* clones followed; more: the capture is never freed */

_Static_assert(MAX_CAPTURES == 1 << CAP_BITS, "capture tokens");
_Static_assert((TOKEN_GENS - 1) * MAX_CAPTURES + MAX_CAPTURES <= 65535, "tokens fit 16 bits");

enum { CAP_FREE = 0, CAP_OPEN = 1, CAP_CLOSING = 2, CAP_CLOSED = 3, CAP_BROKEN = 4,
       CAP_ADOPTED = 5 };

typedef struct {
    _Atomic int state;             /* CAP_*; FREE while being made */
    _Atomic uint32_t gen;          /* moves each time the entry is taken */
    uint64_t id;                   /* the driver's capture id */
    int ctx;                       /* the context table's entry, and its generation */
    uint32_t ctx_gen;
    uintptr_t origin;              /* the stream that began it */
    _Atomic uintptr_t graph;       /* its CUgraph, from the end of the capture; 0 destroyed */
    _Atomic uintptr_t clones[CAP_CLONES];
    int refs;                      /* graph, clones, executables alive (cd_gp_lock) */
    int pinned;                    /* a clone not followed: never freed */
    uint32_t start;                /* node of the start marker */
    uint32_t every;                /* marker spacing (K) when captured */
    _Atomic uint32_t n_nodes;      /* kernel nodes */
    _Atomic int multi;             /* nodes captured on more than one stream */
    _Atomic uint32_t unmarked;     /* kernel nodes without a record (no room, a refused write) */
    int chunk;                     /* the chunk being filled (-1 none), and its use */
    uint32_t chunk_used;
    struct {
        uintptr_t stream;
        uint32_t n;                /* its launches so far */
    } streams[CAP_STREAMS];
    int n_streams;
    _Atomic uint32_t exec_ids[CAP_CLONES];  /* its executables' ids for tools (CUDA 13.1) */
    uint32_t ended_at[CD_RING_FRAMES];      /* adopted: the frames that ended the capture */
    uint8_t n_ended_at;
} capture_t;

typedef struct {
    uint32_t index;                /* kernel node number in its capture (0, 1, ...) */
    uint32_t gen;                  /* the chunk's generation when written */
    uint8_t start;                 /* the start marker, not a kernel */
    uint8_t n_deep;
    uint8_t line_why;              /* CD_ADOPT_LINE_*: its record's line is its launch's, or why not */
    uint32_t deep[CD_NODE_FRAMES]; /* the capturing thread's innermost frames, all kinds */
    unsigned long long tools_id;   /* the driver's id of its node for tools (CUDA 13.1), 0 */
} node_info;

/* ---------------------------------------------------- graph_pool.c -- */

/* The state the graph files share. Entries [0, cd_gp_caps_hw) may be in use;
 * node g's record has seq g + 1 once written (cd_gp_publish). Written under
 * cd_gp_lock; read lock-free (reports). */
extern capture_t cd_gp_caps[MAX_CAPTURES];
extern atomic_int cd_gp_caps_hw;
extern cd_watch_record cd_gp_nodes[CD_GRAPH_NODES];
extern node_info cd_gp_info[CD_GRAPH_NODES];
extern pthread_mutex_t cd_gp_lock;

/* Node g's marker value in a chunk of generation gen: never 0. */
#define MARK(g, gen) ((((uint32_t)(gen) & 0x3FFFu) << 17 | (uint32_t)(g)) + 1u)

/* Entry c's token in generation gen; the token it has now; the entry of a
 * live capture's token, or -1 (gone, or another generation). */
uint16_t cd_gp_token_of(int c, uint32_t gen);
uint16_t cd_gp_token_now(int c);
int cd_gp_entry_of(uint32_t token);
/* The chunk after `after` (-1: the first) that capture `token` owns, or -1;
 * how many of its nodes are handed out. Lock-free. */
int cd_gp_chunk_next(uint16_t token, int after);
uint32_t cd_gp_chunk_fill(int ch);
/* The capture's id of a stream capturing now: 0, or -1; with `deps`, the
 * nodes the stream's next node would depend on (after a launch: its node). */
int cd_gp_capture_info(CUstream s, uint64_t *id, CUgraph *graph, const CUgraphNode **deps,
                       size_t *n_deps);
int cd_gp_capture_id(CUstream s, uint64_t *id, CUgraph *graph);
/* The open capture of a capture id, or -1. */
int cd_gp_find_capture(uint64_t id);
/* Under cd_gp_lock: a free entry, taken (state still FREE), or -1; a node
 * for capture c, or -1 when every chunk is in use; every chunk of capture c
 * back to the pool and the entry free; one hold of capture c dropped (freed
 * at the last, unless pinned). */
int cd_gp_take_entry(void);
long cd_gp_take_node(int c);
void cd_gp_release_locked(int c);
void cd_gp_unref_locked(int c);
/* Node g's record published: readers take it from now on. */
void cd_gp_publish(long g);
/* Each file's counters into the stats (cd_graph_stats, graph_read.c). */
void cd_gp_pool_stats(cd_graph_counters *out);
void cd_gp_capture_stats(cd_graph_counters *out);
void cd_gp_adopt_stats(cd_graph_counters *out);

/* --------------------------------------------------- graph_execs.c -- */

/* Executable exec runs capture c's graph (cd_gp_lock held): the table's pair
 * made, the capture held, an older pair's capture let go, its id for tools
 * kept. 0, or -1 when the table had no room. */
int cd_gp_pair_exec(int c, CUgraphExec exec);

#endif
