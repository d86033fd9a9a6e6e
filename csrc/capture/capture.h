/*
 * capture/capture.h: what is captured at a launch or a fault, cheaply, with
 * no GIL: the recorders. They call only base/; nothing here reports, and
 * nothing here knows about scopes.
 *
 *   frames.c      the launching thread's Python frames, read without the GIL;
 *                 code locations interned once; the user-frame rule
 *   frame_readers.c  the one frame reader for this Python (3.10 frame objects,
 *                 3.11-3.12 internal frames, 3.13 on CPython's _Py_DebugOffsets)
 *   contexts.c    watch mode's context table: the contexts launches were
 *                 seen in (keyed by CUPTI's id), each with its completion slots
 *   watch_ring.c  watch mode: the launch ring, completion markers, the
 *                 search for unfinished launches (host memory only)
 *   graph_*.c     watch mode inside CUDA graphs (their private header:
 *                 graphs.h): graph_capture.c, captured launches get node
 *                 records and markers captured with them; graph_adopt.c,
 *                 graphs captured before watching; graph_execs.c, which
 *                 capture each executable runs; graph_read.c, what a
 *                 replay's capture says; graph_pool.c, entries and nodes
 *   coverage.c    what the watch did not see: the gaps while a profiler held CUPTI
 *   inflight.c    every stream's oldest unfinished launch, its age and queue
 *                 (hangs; host memory only), and the collective an NCCL launch ran
 *   stderr_tee.c  the pass-through stderr that catches the device's assert text
 *   native_ops.c  the PyTorch operators on the launching thread's native stack
 *   driver_log.c  the driver's error log (cuLogsRegisterCallback, CUDA >= 12.9)
 */
#ifndef CD_CAPTURE_H
#define CD_CAPTURE_H

#include "base/base.h"

#include <time.h>       /* timespec, clock_gettime, CLOCK_MONOTONIC */

/* ---------------------------------------------------------- frames.c -- */

#define CD_FAULT_FRAMES 24     /* frames kept with a fault record */
#define CD_RING_FRAMES 4       /* frames kept with a watch ring record */

/* Kinds of code locations: the user-frame rule (cuda_debug/_locations.py
 * documents it; Python asks cd_file_kind, it never re-implements it). */
enum {
    CD_LOC_LIBRARY = 0, CD_LOC_USER = 1, CD_LOC_PSEUDO = 2 /* <string> */,
    /* A user file's code object that TorchDynamo made to run a torch.compile'd
     * function (it calls the graph, __compiled_fn_*): its line is none the
     * user wrote (the def line); the user's line is its caller's. */
    CD_LOC_COMPILED = 3
};

/* The calling thread's Python frames, innermost first, as location ids, read
 * without the GIL (the thread is blocked in a C call made from Python, so its
 * frames cannot change). `max` ids at most; with `to_user`, stop at the first
 * user frame (the last id is then that frame even when deeper than max-1;
 * the frames between are only classified, not interned, but for a
 * CD_LOC_COMPILED frame, which takes the id before it).
 * *complete = 1 when the walk reached the outermost frame, -1 when frames
 * were left out before the last id (the user frame). Returns the count
 * (0: the thread runs no Python, this Python version has no reader, or the
 * interpreter is shutting down: cd_frames_stop). */
int cd_frames_read(uint32_t *ids, int max, int to_user, int *complete);
typedef struct {
    uint32_t file, func;   /* interned */
    int lineno;
    int kind;              /* CD_LOC_* */
} cd_location;
int cd_location_get(uint32_t id, cd_location *out);
/* The library folders and user pseudo-file prefixes (the first call wins;
 * callers serialise). */
void cd_frames_configure(const char *const *library_prefixes, int n_prefixes,
                         const char *const *user_pseudo, int n_pseudo);
/* CD_LOC_* of a file name of n bytes (UTF-8): the one user-frame rule. */
int cd_file_kind(const char *file, size_t n);
/* A code location's file name, as kept: os.fsencode's bytes (UTF-8, a byte
 * os.fsdecode escaped as U+DC80..U+DCFF that byte again, another lone
 * surrogate U+FFFD), whole up to CD_NAME_MAX - 1 bytes (a path of PATH_MAX);
 * a longer one cut visibly: its start, "...", its end. Function names the
 * same, cut at 255 bytes. */
#define CD_NAME_MAX 4096
/* The same copy of a str (a PyObject *; compact) into out: its length. */
size_t cd_frames_copy_name(void *str, char *out, size_t cap);
/* CD_LOC_* of a code object (a PyCodeObject *): its file's kind, or
 * CD_LOC_COMPILED. Safe without the GIL while the code object is alive. */
int cd_code_kind(void *code);
/* The same from the table of code objects (the kind found at its first sight:
 * a lookup, where cd_code_kind reads the file name each time). */
int cd_code_kind_cached(void *code);

/* With the GIL, at module init: retire the cached entries of code objects as
 * they are freed (a code watcher on Python 3.12+, the code type's deallocator
 * wrapped before): 0, or -1 when no watcher could be added (freed code
 * objects are then told apart by their contents). */
int cd_frames_watch_code(void);
int cd_frames_code_watched(void);
/* Frames are read no more (the interpreter's atexit hooks run, before it
 * frees thread states); waits, briefly, for the reads under way. */
void cd_frames_stop(void);
/* The child: loc_lock free, no reader of the parent's counted (base.h). */
void cd_frames_fork(int op);

/* ---------------------------------------------------- frame_readers.c -- */

#define CD_CODE_UNIT_BYTES 2   /* sizeof(_Py_CODEUNIT), internal since 3.13 */
struct _object;                /* PyObject */

/* Choose the reader, once, at module exec (under the GIL, from the importing
 * thread, whose frames it checks the reader against). `force` non-empty: no
 * reader, with that reason (tests). Returns cd_reader_name(). */
const char *cd_reader_init(const char *force);
/* "3.12 internal frames", "_Py_DebugOffsets v3.14", or "none: why". */
const char *cd_reader_name(void);
int cd_reader_ok(void);                /* 1: frames can be read */
const char *cd_reader_python(void);    /* the running Python, "3.14" */
/* No GIL: the calling thread's innermost frame (NULL: none, or no reader),
 * the next one out, and a frame's code object with the instruction offset in
 * code units (-1 when it cannot be placed), NULL for frames that run no
 * Python code (C-stack and interpreter shims, frames being set up). */
void *cd_reader_first(void);
void *cd_reader_next(void *frame);
struct _object *cd_reader_code(void *frame, int *lasti);
/* The same, a batch at a time (the launch callback's walk: one call, not
 * three, per frame): up to max Python frames from *cursor on (a frame from
 * cd_reader_first), innermost first; *cursor becomes the frame to go on
 * from, NULL once the outermost was read. Returns the count. */
typedef struct {
    struct _object *code;
    int lasti;
} cd_pyframe;
int cd_reader_frames(void **cursor, cd_pyframe *out, int max);
/* The line of instruction `lasti` of a code object, from its line table
 * (immutable; PyCode_Addr2Line may read instrumentation data another thread
 * is writing). -1: no line. */
int cd_reader_line(struct _object *code, int lasti);
/* Tests: the checks on a copy of _Py_DebugOffsets (0, or -1 and why), the
 * live table (its bytes for this version's layout, 0 where there is none). */
int cd_reader_check_table(const void *table, size_t n, unsigned long running,
                          void *view, char *why, size_t cap);
size_t cd_reader_live_table(const void **table);
size_t cd_reader_table_bytes(int minor);

/* ------------------------------------------------------ stderr_tee.c -- */

/* While installed, libcuda's `stderr` (its own GOT slot; libc's `stderr` is
 * left alone) is a pass-through stream: every write goes straight to fd 2,
 * and a thread with an open window also keeps a copy of its own text (the
 * device's assert lines, printed by the thread that syncs). */
typedef struct {
    char *buf;
    size_t cap, len;
    size_t cut;            /* bytes that did not fit */
} cd_window;
int cd_tee_install(void);              /* once; 0 ok, -1 nothing can be captured */
/* The child: the locks free, no window open, none of the parent's assert lines. */
void cd_tee_fork(int op);
/* 1 installed, 0 not yet, -1 not possible (libcuda has no `stderr` slot). */
int cd_tee_installed(void);
/* How many slots of the loaded object `handle` (a dlopen handle) hold the
 * address of libc's `stderr`; -1 when it cannot be read. */
int cd_tee_stderr_references(void *handle);
void cd_tee_open(cd_window *w, char *buf, size_t cap);    /* this thread */
void cd_tee_close(void);
/* The most recent device-assert lines written by any thread (watch mode,
 * where the text comes out at whichever call finds the fault). */
size_t cd_tee_recent_asserts(char *out, size_t cap);
/* How an assert line belongs to a kernel: it names another one (or none of
 * the lines is an assert); its function names no kernel (a lambda's
 * "operator()", Triton's "unknown") and this kernel's name does not fit it;
 * it names none but fits (a kernel holding a closure type, resp. a kernel
 * that is not C++); it names this kernel. */
enum { CD_ASSERT_NONE = 0, CD_ASSERT_GENERIC = 1, CD_ASSERT_FITS = 2, CD_ASSERT_NAMES = 3 };
/* The ring's byte count now; then the assert lines kept since that belong
 * best to `kernel` (every line when kernel is NULL or ""): those of the best
 * CD_ASSERT_* level any line has for it, none at CD_ASSERT_NONE; up to cap,
 * the rest counted in *cut; the level in *level (when not NULL). */
uint64_t cd_tee_assert_mark(void);
size_t cd_tee_asserts_since(uint64_t mark, const char *kernel, char *out, size_t cap,
                            size_t *cut, int *level);
/* The best CD_ASSERT_* level of the assert lines of `text` for `kernel`, and
 * how many assert lines it holds (*asserts, when not NULL). */
int cd_tee_text_level(const char *text, size_t n, const char *kernel, int *asserts);
/* Where the text names no kernel but several fit it (two kernels holding
 * lambdas, for an `operator()` line): how many of the other words of its
 * assert lines (the source file's name, the message) the kernel's name holds
 * ("ScatterGatherKernel.cu ... scatter gather kernel index out of bounds" and
 * _scatter_gather_elementwise_kernel: 2). */
int cd_tee_text_affinity(const char *text, size_t n, const char *kernel);
/* The function the text's first assert line names (not operator(), not
 * unknown), as an identifier, into out: its length, 0 when none. */
size_t cd_tee_text_function(const char *text, size_t n, char *out, size_t cap);

/* -------------------------------------------------------- contexts.c -- */

#define CD_MAX_CONTEXTS 64         /* contexts with slots at one time */
#define CD_WATCH_SLOTS 65536       /* completion slots per context for launches (by seq) */
#define CD_GRAPH_NODES 131072      /* captured graph nodes with markers, per process */

/* Completion slots for the contexts that exist now (watch entry, no GIL);
 * retires a context found behind another id than its entry's. */
void cd_watch_prepare(void);
/* CUPTI's CONTEXT_DESTROY_STARTING: the context's slots are never read again. */
void cd_watch_context_destroyed(CUcontext context);
/* The launch's context entry (registered on first sight: never call it while
 * the launch's stream captures), or -1. */
int cd_watch_context_index(CUcontext context, uint32_t uid);
/* Moves each time a context entry retires (a context destroyed or reset):
 * a per-thread cache of a context's id is good while it has not moved. */
unsigned cd_watch_context_epoch(void);
/* The live entry of a context id, or -1; registers nothing. */
int cd_watch_context_find(uint32_t uid);
/* The entry's generation, as records keep it (16 bits); its device (-1). */
uint32_t cd_watch_context_gen(int ctx_index);
int cd_watch_context_device(int ctx_index);
/* 1 when entry ci no longer holds generation gen's context (retired, taken
 * again), 0 while it does. */
int cd_watch_context_retired(int ctx_index, uint32_t gen);
int cd_watch_contexts_live(void);
/* The last failed allocation of a context's completion slots (0: none). */
int cd_watch_alloc_rc(void);
/* An entry's completion slots: host memory (readable after the context
 * died, from a signal handler) and the same memory's address in the context. */
typedef struct {
    volatile uint32_t *host;
    CUdeviceptr dev;
} cd_slots;
/* The slots of entry ci in generation gen: 0 with *out set, -1 when the
 * entry is gone, of another generation, or has none. */
int cd_watch_context_slots(int ci, uint32_t gen, cd_slots *out);
/* Where a launch's marker goes (its seq's slot), and a graph node's (node g
 * of the graph pool): the only places that know the buffer's layout. */
static inline volatile uint32_t *cd_launch_slot(const cd_slots *s, uint64_t seq)
{
    return s->host + (seq & (CD_WATCH_SLOTS - 1));
}
static inline CUdeviceptr cd_launch_slot_dev(const cd_slots *s, uint64_t seq)
{
    return s->dev + (seq & (CD_WATCH_SLOTS - 1)) * sizeof(uint32_t);
}
static inline volatile uint32_t *cd_node_slot(const cd_slots *s, uint32_t g)
{
    return s->host + CD_WATCH_SLOTS + g;
}
static inline CUdeviceptr cd_node_slot_dev(const cd_slots *s, uint32_t g)
{
    return s->dev + ((size_t)CD_WATCH_SLOTS + g) * sizeof(uint32_t);
}
/* The child: ctx_lock free, every entry retired (the parent's contexts). */
void cd_contexts_fork(int op);

/* ------------------------------------------------------ watch_ring.c -- */

#define CD_WATCH_RING 65536        /* launch records kept (a power of two) */
#define CD_NODE_FRAMES 16          /* innermost frames kept with a node, besides its record's */

typedef struct {
    _Atomic uint64_t seq;      /* written last (release); 0 while being written */
    uintptr_t stream;
    uint64_t t_ns;             /* CLOCK_MONOTONIC at the launch (cd_clock_ns) */
    uint32_t kernel, kernel_short; /* interned */
    uint32_t frames[CD_RING_FRAMES];
    uint32_t grid[3], block[3];
    uint32_t shared_mem;
    int32_t thread_id;
    uint16_t ctx;              /* index into the context table */
    uint8_t n_frames;
    uint8_t flags;             /* CD_WATCH_* */
    uint16_t cbid;
    uint16_t graph;            /* a replay: the token of the capture it replays (0 unknown); a node: its capture's */
    uint32_t op;               /* the thread's current PyTorch op token (watch(ops=True)), 0 none */
    uint16_t ctx_gen;          /* the context entry's generation when recorded */
    uint8_t origin;            /* CD_ORIGIN_* (base.h): whose kernel, for the culprit's order */
} cd_watch_record;

/* MARKED: a marker of its own, enqueued behind it at the launch; CLOSED: one
 * put behind it later, when the host waited for its stream (it was then the
 * stream's newest launch). Either way its slot gets its seq when it and every
 * earlier launch of its stream have finished. */
enum { CD_WATCH_MARKED = 1, CD_WATCH_GRAPH = 2, CD_WATCH_USER_LAST = 4, CD_WATCH_CAPTURED = 8,
       CD_WATCH_CLOSED = 16 };

/* The hot path, at a launch's API exit, while watching (hooks/launch_callback.c's
 * pipeline): record, then mark. cd_watch_record_launch writes the launch's
 * record into the ring, unpublished, and decides whether it gets a marker of
 * its own: one of its kernel's first launches (CD_EARLY_LAUNCHES), a USER
 * kernel's (cd_launch's origin, else its name's), a graph replay, an NCCL
 * kernel, or the stream's watch_every-th launch since its last marker; 0:
 * nothing to mark (the dispatch probe). cd_watch_mark writes that marker
 * behind the kernel and publishes the record. */
typedef struct {
    cd_watch_record *r;        /* the ring's record, its seq still 0 */
    uint64_t seq;
    void *stream;              /* its stream's entry in the stream table, or NULL */
    int ctx_index;             /* its context's entry, or -1 */
    int want;                  /* 1: a marker is due; -1: due, a probe writes none; 0 */
} cd_watch_pending;
int cd_watch_record_launch(const cd_launch *l, cd_watch_pending *p);
void cd_watch_mark(const cd_launch *l, cd_watch_pending *p);
/* The launch's own fields of a record (all but seq, ctx, ctx_gen, MARKED);
 * the launching thread's frames when `frames`; the origin: l's, else by the
 * kernel's name; *early (when not NULL): one of its kernel's first launches. */
void cd_watch_fill(cd_watch_record *r, const cd_launch *l, int frames, int *early);
/* Cold (the host waits, or an NCCL kernel is about to be launched): a marker
 * behind the newest launch of stream `stream` of context `uid` (every stream
 * of it when `all`; only streams not capturing when `check_capture`), where
 * that launch has none. Returns the markers written. */
int cd_watch_close(uint32_t uid, int all, uintptr_t stream, int check_capture);
uint64_t cd_watch_seq(void);
/* The ring's counters: launches put in the ring (of which a marker was due
 * and none was written), launches that got a marker of their own, markers
 * put behind a stream's last launch at a wait; with CUDA_DEBUG_PROFILE, ns
 * in cuStreamWriteValue32. write_rc: its last failure (0: none). */
#define CD_WATCH_COUNTS(X) X(watched) X(unmarked) X(marked) X(closed) X(ns_marker)
typedef struct {
    CD_WATCH_COUNTS(CD_COUNTER_FIELD)
    int write_rc;
} cd_watch_counts;
void cd_watch_stats(cd_watch_counts *out);
/* The watch-ring seq of this thread's last launch (to tie a fault to it). */
uint64_t cd_watch_thread_last(void);
/* 1 when the record's completion slot holds its seq, 0 when not, -1 unknown,
 * -2 its context is gone (retired: not a candidate any more). */
int cd_watch_done(const cd_watch_record *r, uint64_t seq);
/* Copy record `seq` if it is still in the ring; 0 on success. */
int cd_watch_get(uint64_t seq, cd_watch_record *out);
/* What the ring says of one stream (cd_watch_scan). */
#define CD_SCAN_CANDIDATES 32      /* candidates kept per stream (the rest counted) */
typedef struct {
    uintptr_t stream;
    int32_t tid;                   /* the per-thread default stream: its thread; else 0 */
    uint16_t ctx, ctx_gen;
    uint64_t last_done;            /* the newest launch known finished; 0: none */
    uint64_t open;                 /* the first launch whose marker did not come back; 0: none */
    uint64_t newest;               /* the stream's newest launch */
    uint32_t pending;              /* launches after last_done, up to open (to newest if none) */
    uint32_t after;                /* launches after open (waiting behind it) */
    uint64_t cand[CD_SCAN_CANDIDATES];   /* the first of the pending, oldest first */
} cd_stream_scan;
/* Per stream with launches after `since` not known to have finished: out[]
 * sorted by first candidate; returns the count; *streams_cut: streams that
 * did not fit. Host memory only: async-signal-safe. */
int cd_watch_scan(uint64_t since, cd_stream_scan *out, int max, uint32_t *streams_cut);
/* The child: the parent's launches are never read again
 * (cd_watch_get refuses them: their markers would never come, the device
 * writes the parent's memory, not the child's copy). */
void cd_watch_fork(int op);
/* CLOCK_MONOTONIC in ns (vDSO: ~25 ns; async-signal-safe). */
static inline uint64_t cd_clock_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
/* watch(ops=True): the op the calling thread is in (a token Python hands out
 * per op call, 0 when none), copied into each watch record. */
void cd_watch_set_op(uint32_t op);

/* -------------------------------------------------------- coverage.c -- */

/* A stretch of the watch in which CUPTI was not ours (coverage.c says what
 * that leaves out). */
enum { CD_GAP_PROFILER = 1,        /* a profiler took CUPTI from the open watch (hand-over) */
       CD_GAP_HELD = 2 };          /* the watch opened while another client held CUPTI */
#define CD_GAPS 16
typedef struct {
    uint64_t from_seq, to_seq;     /* the first and last watch-ring seq in it (to: 0 while open) */
    uint64_t from_ns, to_ns;
    uint32_t from_where, to_where; /* interned "file:line" of the Python call, 0 unknown */
    uint32_t number;               /* 1 for the process's first gap */
    uint8_t why;                   /* CD_GAP_* */
    uint8_t hooks_recording;       /* the runtime's launches (PyTorch's) were recorded */
    uint8_t closed;
} cd_gap;
/* Under cd_sub_lock (cold). Opening while one is open keeps that one. */
void cd_coverage_gap_open(int why, uint32_t where, int hooks_recording);
void cd_coverage_gap_close(uint32_t where);
int cd_coverage_gap_is_open(void);
/* The last gaps, oldest first: the count; *total: gaps ever opened. Host
 * memory only: async-signal-safe. */
int cd_coverage_gaps(cd_gap *out, int max, unsigned *total);
void cd_coverage_fork(int op);

/* -------------------------------------------------------- inflight.c -- */

#define CD_INFLIGHT_MAX 64         /* streams one search follows */

typedef struct {
    cd_watch_record rec;       /* the likeliest stuck launch of the stream (the lead) */
    uint32_t queued;           /* launches recorded on that stream after the oldest candidate */
    uint64_t last_seq;         /* the stream's newest launch */
    uint32_t candidates;       /* launches that may be the unfinished one (1: rec) */
    uint64_t open_seq;         /* the last of them: the first whose marker did not come back */
    uint64_t first_seq;        /* the first of them (the oldest launch not known finished) */
    uint64_t first_ns;         /* when it was launched */
} cd_inflight;

typedef struct {
    uint64_t now_ns;           /* cd_clock_ns() when the search ended */
    uint64_t newest_seq, newest_ns;    /* the newest launch recorded, on any stream */
    uint32_t scanned;          /* records read */
    uint32_t unknown;          /* of which with no completion marker (skipped) */
    uint32_t streams_cut;      /* launches of streams that did not fit in out[] */
} cd_inflight_summary;

/* Per stream with a marker that has not come back, the launches that may be
 * the unfinished one (from its oldest launch not known to have finished to
 * the one whose marker is missing) and the likeliest of them (rec): a user
 * or JIT kernel's first, then one of a kernel this watch never saw finish
 * (its first launches have markers of their own), then the oldest; with the
 * launches queued behind: out[] oldest first; returns the count (at most max). `scratch` holds max stream scans
 * (the caller's: static in a signal handler). Host memory only:
 * async-signal-safe. */
int cd_watch_inflight(cd_inflight *out, int max, cd_inflight_summary *sum,
                      cd_stream_scan *scratch);
/* Has a launch of `kernel` (interned id) before seq `before` finished (its
 * marker came back), among the 4096 launches before it? Host memory only. */
int cd_watch_seen_finished(uint32_t kernel, uint64_t before);
/* How likely a recorded launch is to be the one that faulted or hangs, lower
 * likelier: its origin's rank (cd_origin_rank: user and JIT kernels first) * 2,
 * + 1 when a launch of its kernel before `first` (the oldest candidate) was
 * seen to finish. The one ranking of report/verdict.c and the hang report. */
int cd_watch_likeliness(const cd_watch_record *r, uint64_t first);
/* The collective an NCCL launch ran ("all_reduce", or the torch.distributed
 * function that issued it; "collective" when neither says): its length, 0
 * (and "") when the kernel is not NCCL's. Async-signal-safe. */
size_t cd_collective_name(const cd_watch_record *r, char *out, size_t cap);

/* ---------------------------------------------------- graph_*.c -- */

/* graph_capture.c. The hooks call these on the capturing thread (cold paths):
 * at the entry of a capture's beginning (the context's slots, and its marker
 * kernel, made while nothing captures yet); at its exit (s now capturing); for a launch on a capturing stream (1 when
 * recorded as a node of a tracked capture, 0 when not tracked); at the entry
 * of cuStreamEndCapture (s still capturing: the memset that clears the slots
 * is captured) and at its exit (the graph made, or NULL). */
void cd_graph_capture_beginning(const CUpti_CallbackData *cb);    /* API entry */
void cd_graph_capture_begun(const CUpti_CallbackData *cb, CUstream s);
int cd_graph_launch_captured(const cd_launch *l);
void cd_graph_capture_ending(const CUpti_CallbackData *cb, CUstream s);
void cd_graph_capture_ended(const CUpti_CallbackData *cb, CUgraph graph);
/* graph_execs.c. CUPTI's resource callbacks: executables made and destroyed,
 * graphs destroyed and cloned. A capture's chunks and entry are freed when its graph, its
 * clones and its executables are all gone. */
void cd_graph_exec_created(CUgraph graph, CUgraphExec exec);
void cd_graph_exec_destroyed(CUgraphExec exec);
void cd_graph_destroyed(CUgraph graph);
void cd_graph_cloned(CUgraph original, CUgraph clone);
/* Python's word that an executable is gone (its torch.cuda.CUDAGraph was
 * freed or reset, perhaps while nothing was subscribed): as
 * cd_graph_exec_destroyed; 0, or -1 when it was not known. */
int cd_graph_release_exec(CUgraphExec exec);
/* graph_adopt.c. A graph captured while nothing watched, adopted by Python at the end of
 * its capture (s still capturing): its kernel nodes from the driver's graph
 * API (cuGraphGetNodes, cuGraphKernelNodeGetParams, cuFuncGetName), the
 * calling thread's frames as where it was captured, no markers. The
 * capture's token, 0 when it could not be read, -1 when no room, -2 when the
 * capture is tracked already (begun while watching). Then each
 * executable made from it (cd_graph_adopt_exec: 0, or -1), and the capture
 * dropped if none came (cd_graph_adopt_drop). */
long cd_graph_adopt(CUstream s);
int cd_graph_adopt_exec(uint32_t token, CUgraphExec exec);
void cd_graph_adopt_drop(uint32_t token);
/* Each node's own line in such a graph: the capture is followed from its
 * beginning (s now capturing; why 0) on the calling thread, or why it is not
 * (why: CD_ADOPT_LINE_*; s is then not read): 0 following, -1 not, -2 the
 * capture is tracked (begun while watching). Then Python's trace function
 * calls cd_graph_adopt_event at each event of a user frame on that thread
 * (CD_ADOPT_CALL, _LINE, _RETURN): 0, or -1 when the capture is over (stop
 * tracing). cd_graph_adopt gives each node the user's line that made it.
 * Why a node's line is not its own (cd_graph_node_line): the capture's
 * beginning was not seen (it began before cuda_debug was imported, or not
 * through torch.cuda.CUDAGraph.capture_begin); a tracer (a debugger,
 * coverage) was set then; more runs of nodes than followed; no user frame
 * launched it; this Python's frames cannot be read. */
enum { CD_ADOPT_LINE_OWN = 0, CD_ADOPT_LINE_UNSEEN = 1, CD_ADOPT_LINE_TRACED = 2,
       CD_ADOPT_LINE_FULL = 3, CD_ADOPT_LINE_NO_USER = 4, CD_ADOPT_LINE_NO_FRAMES = 5 };
enum { CD_ADOPT_CALL = 0, CD_ADOPT_LINE = 1, CD_ADOPT_RETURN = 2 };
int cd_graph_adopt_follow(CUstream s, int why);
int cd_graph_adopt_event(int event);
/* The trace function was replaced (a debugger): the nodes made since the last
 * event it saw have no line (CD_ADOPT_LINE_TRACED). */
void cd_graph_adopt_lost(void);
/* The child: no capture followed (the parent's is not the child's; its trace
 * function stops at its next event). */
void cd_graph_adopt_fork(int op);


/* graph_read.c. What a replay's capture says (reads host memory only: no CUDA call, no
 * lock; safe in a signal handler). */
enum {
    CD_GRAPH_FOUND = 0,            /* out[] holds the candidates */
    CD_GRAPH_MATCHED = 1,          /* found, the capture matched by its running markers */
    CD_GRAPH_NO_MARKERS = 2,       /* not captured while watching (or not tracked) */
    CD_GRAPH_NOT_CLOSED = 3,       /* its capture's end was not seen: slots never cleared */
    CD_GRAPH_NOT_STARTED = 4,      /* its start marker is not set: this replay never began */
    CD_GRAPH_ALL_DONE = 5,         /* every node's marker is set */
    CD_GRAPH_BROKEN = 6,           /* its markers could not be captured (a write or memset refused) */
    CD_GRAPH_ADOPTED = 7,          /* captured before watching: out[] holds every kernel node, no markers */
};
/* The replay's candidates: per stream of the capture, the nodes after the
 * last one whose marker is set up to the first marked one whose marker is
 * missing, in capture order (node numbers for cd_graph_node); the count,
 * *status (CD_GRAPH_*), *capture (-1 unknown). */
int cd_graph_unfinished(const cd_watch_record *replay, uint32_t *out, int max, int *status,
                        int *capture);
/* Node g's record (seq = g + 1), its number in the capture, done (1, 0, -1): 0 ok. */
int cd_graph_node(uint32_t g, cd_watch_record *out, uint32_t *index, int *done);
/* The driver's id of node g for tools (cuGraphNodeGetToolsId, CUDA 13.1: the
 * key of torch.cuda.graph_annotations' tags), 0 unknown. */
unsigned long long cd_graph_node_tools_id(uint32_t g);
/* Node g's innermost frames of any kind (CD_NODE_FRAMES at most; its record
 * keeps the innermost few and the user's): the count. */
int cd_graph_node_frames(uint32_t g, uint32_t *ids, int max);
/* Node g's line (its record's user frame): CD_ADOPT_LINE_OWN when it is the
 * line that launched it, else why it is the line that ended its capture (a
 * graph captured before watching). */
int cd_graph_node_line(uint32_t g);
typedef struct {
    uint64_t id;                   /* the driver's capture id */
    uint32_t n_nodes, unmarked;    /* kernel nodes; of which without a record or marker */
    int multi_stream;              /* captured on more than one stream (fork/join) */
    int state;                     /* 1 open, 2 closing, 3 closed, 4 broken, 5 adopted */
    uintptr_t origin;              /* the stream that began it */
    uint32_t every;                /* a marker every `every` nodes of a stream (0: none) */
    uint32_t token;
    uint32_t exec_ids[4];          /* its executables' ids for tools (cuGraphExecGetId), 0 */
} cd_graph_capture_info;
int cd_graph_capture(int capture, cd_graph_capture_info *out);
/* An adopted capture's line: the frames that ended it (the `with` of
 * torch.cuda.graph), into ids (max): the count, 0 none. */
int cd_graph_capture_ended_at(int capture, uint32_t *ids, int max);
typedef struct {
    uint64_t nodes_marked, nodes_unmarked, nodes_recorded, captures_untracked, captures_freed;
    int captures;                  /* live now */
    int chunks_used, chunks;       /* of CD_GRAPH_NODES / 64 */
    int clear_rc, write_rc;        /* the last refused memset (then cleared by writes) / write */
    int kernel_rc;                 /* the last failed marker-kernel load or launch */
    int adopt_rc;                  /* the last failed graph API call of an adoption */
    uint64_t adopt_events;         /* user-frame events seen following captures' lines */
    unsigned execs, execs_refused, exec_reach;  /* graph_execs.c */
} cd_graph_counters;
void cd_graph_stats(cd_graph_counters *out);
/* graph_pool.c. The child: cd_gp_lock free, this thread in no capture (base.h). */
void cd_graph_pool_fork(int op);

/* graph_execs.c, the executables' table: */
/* Executable -> the token of the capture whose graph it runs: 0, or -1 when
 * no slot is free near its home; *old the token it had (0 none). */
int cd_graph_exec_set(CUgraphExec exec, uint32_t token, uint32_t *old);
/* Its entry freed: the token it had, 0 when unknown. */
uint32_t cd_graph_exec_take(CUgraphExec exec);
uint32_t cd_graph_exec_token(CUgraphExec exec);       /* lock-free; 0 unknown */
/* For a cuGraphLaunch's ring record: the token of the capture its executable
 * runs, 0 unknown (hot path: reads a few entries at most). */
uint16_t cd_graph_replayed(const void *launch_params);
void cd_graph_exec_stats(unsigned *live, unsigned *refused, unsigned *max_reach);
/* The child: exec_lock free (base.h). */
void cd_graph_execs_fork(int op);

/* ------------------------------------------------------ native_ops.c -- */

#define CD_OP_NAME 64
/* The at::_ops::<name>::call|redispatch frames of the calling thread's
 * native stack, innermost first (cold: the fault path). Walked only on the
 * thread's own stack, and only up to the Python interpreter (native_ops.c
 * says why). */
int cd_native_ops(char ops[][CD_OP_NAME], int max);
void cd_native_ops_warm(void);
/* The operator name of one such symbol into out; 0 if it is not one. */
size_t cd_aten_op_of_symbol(const char *sym, char *out, size_t cap);

/* ------------------------------------------------------ driver_log.c -- */

/* Called with the code when the driver logs a sticky error (the earliest
 * moment watch mode hears of a fault found by somebody else's call). */
typedef void (*cd_sticky_logged_fn)(int code);
void cd_driver_log_init(cd_sticky_logged_fn on_sticky);
uint64_t cd_driver_log_count(void);
/* Line i (0-based, of all ever logged) into out: its length, or -1 when it
 * is gone from the ring (or not logged yet). */
long cd_driver_log_line(uint64_t i, char *out, size_t cap);
void cd_driver_log_fork(int op);      /* the child: log_lock free */

#endif
