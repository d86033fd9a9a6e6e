/*
 * report/report.h: what happened, kept and told. Reads what capture/ keeps;
 * never calls up into hooks/ (the callback and scopes call it).
 *
 *   fd_writer.c      the writer of every fd-2 block: fixed buffer, write(2),
 *                    the rank prefix, text sanitised (async-signal-safe)
 *   fault_records.c  the ring of fault records (the first fault wins; echoes of
 *                    a dead context are marked consequences)
 *   verdict.c        which launch is guilty: the one rule every report renders
 *   fault_report.c   the compact block written to fd 2 at the moment of the
 *                    fault; watch mode's culprit block
 *   elastic_file.c   torchrun's error file, fed by those blocks
 *   fatal_signals.c  the SIGABRT/SIGTERM handlers
 *   inflight_report.c  the hang report: every stream's oldest unfinished launch
 *                    (age, queue, collective); the dump signal (SIGUSR1)
 *   graph_report.c   a CUDA graph replay in any of those blocks: its node(s), the
 *                    capture and replay lines
 *   inflight_doc.c   the same as a JSON document, with the last launches (dump)
 */
#ifndef CD_REPORT_H
#define CD_REPORT_H

#include "capture/capture.h"

#include <signal.h>     /* sigset_t, sigaction, siginfo_t */

/* ------------------------------------------------------- fd_writer.c -- */

typedef struct {
    char buf[6144];
    size_t n;
    int line_start;
    int raw;                       /* 1: no rank prefix (the JSON) */
    /* Where a flush goes: NULL, fd 2 (every block of the fault path); else
     * sink(sink_ctx, bytes, n) (the dump answer, built off the fault path). */
    void (*sink)(void *sink_ctx, const char *p, size_t n);
    void *sink_ctx;
} cd_out;

void cd_out_set_prefix(const char *prefix);   /* "[rank k] " or "" (configure time) */
const char *cd_out_prefix(void);
void cd_out_put(cd_out *o, const char *s, size_t len);     /* sanitised, cut when full */
void cd_out_puts(cd_out *o, const char *s);
void cd_out_u(cd_out *o, unsigned long long v);
void cd_out_hex(cd_out *o, unsigned long long v);
void cd_out_dims(cd_out *o, const unsigned *d);
/* "  launched at file:line in func\n" of the innermost user frame of ids. */
void cd_out_location(cd_out *o, const uint32_t *ids, int n, int complete);
/* A launch's name: "collective (kernel)" for an NCCL kernel, else the
 * kernel's short name; "?" when it has none (and, empty_unknown, when the
 * name is empty). */
void cd_out_launch_name(cd_out *o, const cd_watch_record *r, int empty_unknown);
void cd_out_location_as(cd_out *o, const char *verb, const uint32_t *ids, int n, int complete);
void cd_out_flush(cd_out *o);      /* write(2) to fd 2 (or the sink), then empty */
void cd_out_drain(cd_out *o);      /* the same, without ending the text with a newline */
void cd_write_all(int fd, const char *p, size_t n);   /* write(2) until done or an error */
/* The length of the valid UTF-8 sequence at s (of n bytes), 0 if invalid. */
size_t cd_utf8_seq(const unsigned char *s, size_t n);

/* --------------------------------------------------- fault_records.c -- */

#define CD_FAULT_RING 32
#define CD_KERNEL_NAME 1024
#define CD_DEVICE_MESSAGE 8192
#define CD_FAULT_OPS 8             /* ATen operators kept with a fault record */

typedef struct {
    uint64_t seq;              /* 1, 2, ...; 0 = empty */
    int code;                  /* CUresult */
    int at_launch;             /* 1: the launch call itself failed; 0: the wait found it */
    int consequence;           /* a sticky fault was recorded before: this is its echo */
    int assert_level;          /* CD_ASSERT_*: how the assert text belongs to this kernel */
    uint64_t cause_seq;        /* a consequence: the record of its context's cause, 0 unknown */
    long cause_thread;         /* and that record's thread (gettid) */
    int cbid;                  /* CUPTI driver callback id of the launch */
    char kernel[CD_KERNEL_NAME];   /* mangled symbol name (cut), "" for graph launches */
    size_t kernel_len;         /* its full length */
    unsigned grid[3], block[3];
    unsigned shared_mem;
    uintptr_t stream;
    uintptr_t context;
    uint32_t context_uid;      /* CUPTI's contextUid: unique, unlike the pointer */
    int device;                /* ordinal, -1 unknown */
    long thread_id;            /* gettid() of the launching thread */
    char thread_name[16];      /* raw bytes: may be cut inside a UTF-8 character */
    double wall_time;          /* CLOCK_REALTIME seconds */
    uint64_t launch_seq;       /* watch-ring seq of this launch, 0 none */
    uint32_t frames[CD_FAULT_FRAMES];  /* location ids, innermost first */
    int n_frames, frames_complete;
    char ops[CD_FAULT_OPS][CD_OP_NAME];   /* at::_ops::<name> on the native stack, innermost first */
    int n_ops;
    char device_message[CD_DEVICE_MESSAGE]; /* the text this thread got during the wait */
    size_t device_message_len;
    size_t device_message_cut; /* bytes that did not fit */
    uint64_t log_end;          /* driver-log lines [.., log_end) precede this fault */
} cd_fault;

/* Fill the identity fields of `f` from a launch callback (kernel, dims,
 * stream, device, thread, time, frames). Cold path. */
void cd_fault_fill(cd_fault *f, const cd_launch *l);
/* Copy into the ring, assign seq, `consequence` and its cause; returns the
 * seq. A sticky record is a consequence when its context had a sticky record
 * before, unless its assert text belongs to it better (CD_ASSERT_FITS or
 * NAMES) than the text of that context's cause so far did: then it is the
 * cause (another thread's wait was recorded first). */
uint64_t cd_fault_record(cd_fault *f);
/* The best assert level of the cause recorded for a context (CUPTI's id) so
 * far; -1 when none was. */
int cd_fault_context_level(uint32_t context_uid);
/* The kernel (mangled, cut to cap) of record `seq` while it is in the ring: its length, 0 when gone. */
size_t cd_fault_kernel_of(uint64_t seq, char *out, size_t cap);
uint64_t cd_fault_seq(void);
/* Has a sticky error been seen in this process (a record, or Python's word)? */
void cd_fault_note_sticky(void);
int cd_fault_sticky_seen(void);
/* Then, for the first records, the PyTorch ops of the native stack (slow,
 * and the walk can meet stale frames: after recording, so other threads see
 * the fault at once, and after the report). Returns how many. */
int cd_fault_add_ops(cd_fault *f);
/* Copy the records with seq > since, oldest first, into out (at most n). */
int cd_faults_since(uint64_t since, cd_fault *out, int n);
/* The child: fault_lock free; the parent's records are never read there. */
void cd_faults_fork(int op);

/* --------------------------------------------------------- verdict.c -- */

/* Which launch is guilty: the one rule (verdict.c's head says it). */
#define CD_VERDICT_MAX 64
typedef struct {
    uint64_t seq;              /* watch-ring seq, 0 none: for the likeliness */
    const char *mangled;       /* the kernel's name, NULL unknown */
    int origin;                /* CD_ORIGIN_* (with no seq) */
    int graph;                 /* a graph replay whose nodes are unknown: not judged by text */
    int level, words;          /* the text's CD_ASSERT_* level and words for it; level -1:
                                * computed from `mangled` (a caller fills them for a graph
                                * replay from its nodes) */
    int tag;                   /* the caller's (an index) */
    int rank;                  /* scratch: the likeliness (cd_watch_likeliness) */
} cd_verdict_cand;

typedef struct {
    uint32_t kept;             /* the candidates kept, first in c[] */
    int named;                 /* the device's text names (or fits) the ones kept */
    int by_hint;               /* ... narrowed to the function around Triton's asserting line */
    int by_words;              /* ... narrowed by its file's and message's words */
    int reordered;             /* the likeliest were put first */
    int ruled_out;             /* the text names `function`, none of them: all kept, as ruled out */
    char function[128];
} cd_verdict;

/* Decide over c[0..n) (any n; the callers' arrays hold CD_VERDICT_MAX launches
 * or a graph's nodes) with the device's assert text
 * (text, tlen; none: tlen 0) and the hint (the function Python found around a
 * Triton assert's source line, or NULL): c[] reordered in place, the verdict's
 * candidates first, in order; returns how many. Host memory only, no lock. */
int cd_verdict_decide(cd_verdict_cand *c, int n, const char *text, size_t tlen,
                      const char *hint, cd_verdict *v);

/* ---------------------------------------------------- fault_report.c -- */

/* The compact block written to fd 2 at the moment a fault is found, before
 * control returns to the framework (CUDA_DEBUG_REPORT=0 turns it off). Uses
 * write(2) and fixed buffers only. */
void cd_report_fault(const cd_fault *f);
/* The line that follows it once the PyTorch ops are known ("cuda_debug: op
 * aten::embedding > aten::index_select (the fault above, thread tid 42)"). */
void cd_report_fault_ops(const cd_fault *f);
/* Watch mode: the culprit launch, from the ring, when a fault is found outside
 * any wait of ours (a launch refused, the driver log, a signal). Async-signal-
 * safe when `from_signal` (CD_FROM_*). Writes at most once per process for a
 * fault, and once for a signal (code 0); torchrun's error file from a signal
 * only when it is CD_FROM_DYING_SIGNAL. From a call it holds cd_report_lock
 * (and this thread's sibling signals) until the block is out: a dying signal
 * on another thread meanwhile waits for it. */
enum { CD_FROM_CALL = 0, CD_FROM_SIGNAL = 1, CD_FROM_DYING_SIGNAL = 2 };
void cd_report_watch_culprit(int code, const char *found_at, int from_signal);
/* The texts and switches Python owns, handed down once: the block on or off,
 * the line prefix ("[rank k] "), torchrun's error file (NULL: none), the
 * restart sentence (NULL: keep the default). */
void cd_report_configure(int enabled, const char *prefix, const char *error_file,
                         const char *restart);
/* One error's name and what it means ("CUDA_ERROR_ASSERT", "device-side assert"). */
void cd_report_name_error(int code, const char *name, const char *what);
/* SIGABRT/SIGTERM: write the watch culprit, then the previous handler. */
int cd_install_signal_handlers(void);
/* The signals held back while a report is being written (sa_mask of every
 * handler of ours): SIGABRT, SIGTERM, SIGUSR1, SIGUSR2. */
void cd_signal_mask(sigset_t *set);
/* One report from a signal handler or the hang watcher at a time, across
 * threads: waits (nanosleep) up to 3 s for the one being written; returns
 * whether it took the lock (hand that to cd_report_unlock). */
int cd_report_lock(void);
void cd_report_unlock(int taken);
/* Call the handler `old` was (1), or 0 when it is SIG_DFL or SIG_IGN. */
int cd_signal_chain(const struct sigaction *old, int sig, siginfo_t *info, void *uctx);
/* Tests: the watch block written from a call (not a signal) pauses this long
 * once it has claimed the report, before it is built and written (0: never). */
void cd_report_test_pause(uint64_t ns);
/* The child: nothing written yet, no report being written, no handler running. */
void cd_report_fork(int op);

/* ---------------------------------------------------- elastic_file.c -- */

/* TORCHELASTIC_ERROR_FILE's path (NULL or "": none), at configure time. */
void cd_elastic_configure(const char *path);
/* The block (no rank prefixes) as torchrun's error file: once by a fault
 * (final); a signal's (by_signal) only until a fault writes its own.
 * open/write only: async-signal-safe. */
void cd_elastic_write(const char *block, size_t n, int by_signal);
void cd_elastic_fork(int op);

/* ----------------------------------------------------- graph_report.c -- */

/* The nodes of a replay's graph a report names (cd_graph_unfinished; for a
 * graph captured before watching, those whose kernel the device's assert text
 * names, never from a signal): the count (nodes[] holds the first max of
 * them), *status (CD_GRAPH_*), *capture. */
int cd_graph_report_nodes(const cd_watch_record *r, uint32_t *nodes, int max, int *status,
                          int *capture, int from_signal);
/* Why a replay's nodes are not named ("captured before watching: ..."). */
void cd_out_graph_why(cd_out *o, int status, int capture);
/* "  culprit (one of N nodes after the last marker written...): " */
void cd_out_graph_label(cd_out *o, int n, int status, int capture);
/* A replay as a culprit: its node(s) ("<label>kernel (node N of a CUDA graph;
 * replay launch #seq, stream, thread)", "captured at"), "replayed at". */
void cd_out_graph_replay(cd_out *o, const cd_watch_record *r, uint64_t seq, const char *label,
                         int from_signal);
/* A replay as a hang report's unfinished launch: the running node's name,
 * then details(o, arg) (the rest of the first line, its newline included),
 * "captured at", the other candidates, "replayed at". */
void cd_out_graph_inflight(cd_out *o, const cd_watch_record *r,
                           void (*details)(cd_out *, const void *), const void *arg);

/* -------------------------------------------------- inflight_report.c -- */

/* The hang watcher's report: every stream's oldest unfinished launch (kernel
 * or collective, stream, age, queue depth, launching line), to fd 2. Not from
 * a signal handler (blocks this thread's signals while it writes). */
void cd_report_hang(uint64_t hang_after_ns);
/* Install the dump signal (SIGUSR1/SIGUSR2), chained to the handler there
 * now; again when Python's signal.signal() replaced ours (a C handler that
 * replaced it is left alone). sig_is_python / sigint_is_python: Python has a
 * handler of its own for `sig` / for SIGINT (how Python's C-level handler is
 * recognised). 0, or -1 with errno (EBUSY: another dump signal is installed). */
int cd_install_dump_signal(int sig, int sig_is_python, int sigint_is_python);
int cd_dump_signal(void);          /* the one installed, 0 none */
/* 1 when the dump signal's disposition now is our handler. */
int cd_dump_handler_is_ours(void);
/* The block (headline "unfinished launches of pid N") from one search, into o. */
void cd_report_inflight_text(cd_out *o, const cd_inflight *t, int n,
                             const cd_inflight_summary *sum);
/* The dump listener answers (the hang report then names `cuda_debug dump PID`). */
void cd_report_dump_listening(int on);

/* ----------------------------------------------------- inflight_doc.c -- */

#define CD_DOC_VERSION 1           /* cuda_debug/_dump.py checks it: bump on a change */
#define CD_DOC_MAX (64u << 20)     /* a document's bytes at most */

/* A growable buffer (malloc: not for signal handlers); a cd_out sink. */
typedef struct {
    char *p;
    size_t n, cap;
    int failed;                    /* out of memory or over CD_DOC_MAX: p holds a prefix */
} cd_buf;
void cd_buf_sink(void *ctx, const char *p, size_t n);
void cd_buf_free(cd_buf *b);

typedef struct {
    int rank, world_size;          /* -1 / 0: unknown */
    uint64_t hang_after_ns;        /* the watcher's threshold now, 0 off */
    int recent;                    /* the last launches to list, 0 none */
} cd_dump_params;
/* The in-flight report as JSON (inflight_doc.c says what it holds), appended
 * to b. 0, or -1 (out of memory). */
int cd_report_dump_doc(cd_buf *b, const cd_dump_params *p);
/* JSON (made by Python's json.dumps) that every document carries as
 * "flight_recorder" from now on (n 0: null again). 0, or -1 out of memory. */
int cd_report_set_extra(const char *json, size_t n);
void cd_inflight_report_fork(int op);   /* the child: no dump handler running */
void cd_inflight_doc_fork(int op);      /* the child: the document's lock free */

#endif
