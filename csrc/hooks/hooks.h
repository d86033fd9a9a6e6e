/*
 * hooks/hooks.h: the top of the C runtime, what runs at each launch and at
 * each scope's entry and exit. Calls report/, capture/ and base/; only
 * module.c and python/ call it.
 *
 *   thread_state.c     per-thread scope stacks: does this thread block now?
 *   launch_callback.c  the CUPTI launch callback (the hot path)
 *   runtime_launch.c   the runtime's launches while watching, past CUPTI
 *                      (the calling libraries' GOT entries point there)
 *   scopes.c           opening and closing launch_blocking() scopes and
 *                      watch() blocks: drain, take CUPTI, push the state
 *   hang_watcher.c     watch(hang_after=s): the thread that reports stuck
 *                      launches, the process left alive
 *   after_fork.c       a forked child's state: every lock free, nothing of
 *                      the parent's reported (pthread_atfork)
 *   dump_server.c      `cuda-debug dump PID`: the thread that answers with the
 *                      in-flight report, on a socket (no signal)
 */
#ifndef CD_HOOKS_H
#define CD_HOOKS_H

#include "report/report.h"

/* --------------------------------------------------- thread_state.c -- */

/* Scope kinds. */
enum { CD_SCOPE_BLOCK = 1, CD_SCOPE_OPT_OUT = 2, CD_SCOPE_WATCH = 3 };
#define CD_MAX_SCOPE_DEPTH 64
/* This thread's innermost open scope: +1 block, -1 opted out, 0 none. */
int cd_thread_state(void);
/* Should this thread's launch be waited for (its state, else the all-threads
 * count, else: a follower thread while any scope is open)? Hot path. */
int cd_thread_wants_blocking(void);
/* Push a scope (state +1 or -1) with its token: 0, or -1 when the stack is full. */
int cd_thread_push(uint32_t token, int state);
void cd_thread_pop(uint32_t token);
int cd_thread_depth(void);
void cd_thread_fork(int op);       /* the child's thread: no scope open */

/* ------------------------------------------------ launch_callback.c -- */

/* The CUPTI callback, for cd_cupti_acquire. */
void CUPTIAPI cd_on_launch(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                           const void *data);
/* The driver log's hook (cd_driver_log_init): a sticky error logged while
 * watching writes the culprit block. */
void cd_on_sticky_logged(int code);

/* The launch pipeline, shared by CUPTI's callback and the launch hooks
 * (base.h's cd_launch): before a launch, the bracket of a kernel that gets a
 * marker of its own; at its API exit, record it and mark it while watching,
 * wait for it and check it if this thread blocks. */
void cd_launch_entering(const cd_launch *l);
void cd_launch_exited(cd_launch *l);
/* The launch hooks' record mode, around the runtime launch it makes (on 1,
 * then 0): CUPTI's callback inside it records nothing (the hook records it). */
void cd_launch_recorded_by_hook(int on);
/* The pipeline's counters: launches waited for (of which on follower
 * threads), on a capturing stream and not tracked, refused with a sticky
 * error; with CUDA_DEBUG_PROFILE, ns in the capture check, the wait, the
 * whole callback, and record + mark (cd_watch_record_launch, cd_watch_mark). */
#define CD_LAUNCH_COUNTS(X)                                                         \
    X(synced) X(follower) X(skipped_capture) X(refused) X(ns_capture_check)         \
    X(ns_wait) X(ns_callback) X(ns_watch)
typedef struct {
    CD_LAUNCH_COUNTS(CD_COUNTER_FIELD)
} cd_launch_counts;
void cd_launch_stats(cd_launch_counts *out);

/* ---------------------------------------------------- runtime_launch.c -- */

/* Why the launch hooks are off (0: on). */
enum { CD_HOOKS_NEVER = 0, CD_HOOKS_OFF = 1, CD_HOOKS_NO_CUPTI = 2, CD_HOOKS_OLD_DRIVER = 3,
       CD_HOOKS_CLASH = 4, CD_HOOKS_NO_IMPORTS = 5, CD_HOOKS_FORKED = 6 };
typedef struct {
    int on, recording, entries, why_off;
    uint64_t routed, recorded, handed_back, asked;   /* asked: the driver asked for a kernel */
    /* launches left to the runtime's own function because the driver did not
     * take the runtime's handle for a kernel (cuKernelGetFunction, or no
     * name), and the last CUresult it gave (0: none failed) */
    uint64_t unresolved;
    int unresolved_rc;
    /* CUDA_DEBUG_PROFILE=1: ns in the route's look-up (context, its id, the
     * kernel's function) and in the driver's own launch (cuLaunchKernelEx_ptsz) */
    uint64_t ns_lookup, ns_launch;
    uint64_t other_runtimes;       /* imports left alone: another runtime's */
    /* the library whose __cudaLaunchKernel the entries lead to; one whose
     * importers were left alone (another runtime); "" for none */
    char runtime[256], other_runtime[256];
} cd_hook_stats;
/* Under cd_sub_lock, while a watch opens or CUPTI comes back: the runtime's
 * launches (__cudaLaunchKernel imports) routed past CUPTI when it is ours,
 * else launched the runtime's way and recorded after (the record mode: a
 * profiler holds CUPTI); again at each watch entry for objects loaded since.
 * Off when the last watch closes. */
void cd_runtime_hooks_on(void);
/* Under cd_sub_lock, before CUPTI is given to a profiler: the record mode. */
void cd_runtime_hooks_record(void);
void cd_runtime_hooks_off(void);
/* Python's reading of CUDA_DEBUG_LAUNCH_HOOKS (one parser), before a watch opens. */
void cd_runtime_hooks_want(int on);
void cd_runtime_hooks_stats(cd_hook_stats *s);
/* The child: the route off, nothing of the parent's subscription touched. */
void cd_runtime_hooks_fork(int op);

/* ----------------------------------------------------------- scopes.c -- */

/* Open a scope: drain (blocking/watch), take CUPTI, push the thread state.
 * may_drain: 0 while this thread captures a CUDA graph.
 * Returns 0 and a token (*code 0, or, for a watch opened while another
 * client holds CUPTI, CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED), or:
 * 1 = the drain found a sticky error (*code), 2 = CUPTI refused (*code =
 * CUptiResult, holder filled), 3 = too deep (*code = the depth). `where`:
 * the interned "file:line" of the entry (a coverage gap's start). Call
 * without the GIL. */
int cd_scope_open(int kind, int all_threads, int may_drain, uint32_t *token, int *code,
                  char *holder, size_t holder_len, uint32_t where);
void cd_scope_close(int kind, int all_threads, uint32_t token);
/* A profiler takes CUPTI (`where`: the interned "file:line" that started
 * it): the launch hooks in their record mode while watching (else off),
 * CUPTI given up (1 if held), a coverage gap opened. */
int cd_scopes_hand_over(uint32_t where);
/* The profiler stopped: CUPTI taken back while scopes or watches are open,
 * the hooks routing again, the gap closed. 1 taken back, 0 nothing to take
 * (not needed, or ours), -CUptiResult refused (holder: who holds it). */
int cd_scopes_take_back(uint32_t where, char *holder, size_t holder_len);
/* The child: a scope opened before the fork (its token) closes nothing there. */
void cd_scopes_fork(int op);
/* CUPTI taken back after a profiler (cd_scopes_take_back): a statistic. */
uint64_t cd_scopes_take_backs(void);

/* ----------------------------------------------------- hang_watcher.c -- */

/* The watcher looks every hang_after/4, this often at the shortest (Python
 * refuses a hang_after shorter than two steps: cuda_debug/_options.py). */
#define CD_HANG_STEP_MIN_NS 50000000u
/* hang_after in ns (0: off). The first nonzero value starts the watcher
 * thread: 0, or pthread_create's error. */
int cd_hang_watch_set(uint64_t ns);
uint64_t cd_hang_watch_get(void);
uint64_t cd_hang_reports(void);    /* reports the watcher wrote */
/* The child: no watcher thread (the next nonzero cd_hang_watch_set starts
 * one), hang_after 0, the mutex and condition variable made anew. */
void cd_hang_watch_fork(int op);

/* ------------------------------------------------------- after_fork.c -- */

/* Once, at module init: the child handler (pthread_atfork) that gives a
 * forked child its own state, every layer's (and `more`'s: a layer beside
 * this one, the benchmarks) cd_*_fork(CD_FORK_CHILD). 0, or pthread_atfork's error. */
/* dump_server.c: pthread_atfork's prepare (1) and parent (0) handlers. */
void cd_dump_server_fork_prepare(int before);
int cd_fork_init(void (*more)(int op));
/* Tests: a thread of ours takes every lock the child handler resets (1),
 * and holds them until given back (0): a fork meanwhile is a fork while
 * another thread holds them. 0, or an errno. */
int cd_fork_test_hold(int hold);

/* ------------------------------------------------------ dump_server.c -- */

/* `cuda-debug dump PID`: a thread that answers on the abstract Unix socket
 * "@cuda_debug-dump-<pid>" (taken by another process: "...-<pid>-<random hex>")
 * with its length, then the in-flight document (report/inflight_doc.c).
 * Started once per process (again in a forked child); rank / world_size go
 * into the document (-1 / 0 unknown). 0, or an errno. */
int cd_dump_server_start(int rank, int world_size);
/* 1 listening, 0 not started, -errno: the start failed. */
int cd_dump_server_state(void);
/* The abstract name's bytes after the NUL, for pid. */
int cd_dump_server_name(int pid, char *out, size_t cap);
/* The document, in-process (the same as the listener sends); 0 or -1. */
int cd_dump_document(cd_buf *b, int recent);
void cd_dump_server_fork(int op);

#endif
