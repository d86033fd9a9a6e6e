/*
 * report/inflight_report.c: what is still running, on fd 2, with the process left alive.
 *
 * A kernel that never finishes raises nothing: a spin on a flag, a deadlock, a
 * collective that one rank never joins. The hang watcher (hooks/hang_watcher.c)
 * and the dump signal (SIGUSR1 by default) write the same block:
 *
 *   [rank 0] cuda_debug (watch): possible hang: a launch unfinished for longer than hang_after=5.0 s
 *   [rank 0]   oldest unfinished launch per stream, oldest first:
 *   [rank 0]   all_reduce (ncclDevKernel_AllReduce_Sum_f32_RING_LL) on stream 0x55d0c2a0,
 *                device 0: unfinished for 7.1 s, 0 launches queued behind it (launch #311,
 *                thread 4242)                                       (one line each)
 *   [rank 0]     launched at /work/train.py:40 in main
 *   [rank 0]   spin (node 4 of a CUDA graph) on stream 0x5, device 0: unfinished for ...
 *   [rank 0]     captured at /work/train.py:33 in step    (a graph replay: its node
 *   [rank 0]     replayed at /work/train.py:41 in main     still running, graph_report.c)
 *   [rank 0]   The process goes on (one report per stuck launch); `python -m cuda_debug
 *                dump 4242` prints this again in the terminal it runs in.
 *
 * `cuda-debug dump PID` gets the same block (headline "unfinished launches of
 * pid N") inside the document of inflight_doc.c, from the listener thread
 * (hooks/dump_server.c): no signal, nothing on fd 2.
 *
 * Async-signal-safe, as faulthandler: the watch ring and the completion slots
 * are read from host memory (capture/inflight.c), the text is built in a
 * static buffer and written with write(2); no CUDA call, no malloc, no lock
 * another thread may hold (cd_report_lock is ours, and bounded). So it runs
 * while a Python thread is stuck inside cuStreamSynchronize.
 *
 * The dump signal is installed with sigaction at the first watch(), chained
 * to the handler it replaces (Python's own, faulthandler's...), never to the
 * default action (that would end the process). Python's signal.signal()
 * replaces it in turn: watch() installs it again, chained, at its next entry.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "report/report.h"

#include <errno.h>      /* errno */
#include <signal.h>      /* SIGUSR1, SIGUSR2, sigset_t, ... */
#include <string.h>      /* memset */
#include <sys/syscall.h> /* SYS_gettid */
#include <unistd.h>      /* getpid, syscall */

/* Under cd_report_lock (or, when it could not be had in 3 s, shared at worst
 * with a report being written: text may mix, nothing worse). */
static cd_inflight table[CD_INFLIGHT_MAX];
static cd_stream_scan scan[CD_INFLIGHT_MAX];
static cd_out out;
static atomic_int dump_signal;     /* the dump signal installed, 0 none */

#define SHOWN_MAX 32               /* streams written; the rest counted */

/* "5.2 s" (one decimal; whole seconds from 100 s). */
static void put_secs(cd_out *o, uint64_t ns)
{
    uint64_t tenths = (ns + 50000000u) / 100000000u;
    if (tenths >= 1000) {
        cd_out_u(o, tenths / 10);
    } else {
        cd_out_u(o, tenths / 10);
        cd_out_puts(o, ".");
        cd_out_u(o, tenths % 10);
    }
    cd_out_puts(o, " s");
}

typedef struct {
    const cd_inflight *e;
    uint64_t now_ns;
} entry_arg;

/* The rest of an entry's first line: " on stream ..., device d: unfinished
 * for 7.1 s, 0 launches queued behind it (launch #311, thread 4242)\n". */
static void put_details(cd_out *o, const void *arg)
{
    const entry_arg *a = arg;
    const cd_watch_record *r = &a->e->rec;
    cd_out_puts(o, " on stream ");
    cd_out_hex(o, r->stream);
    int device = cd_watch_context_device(r->ctx);
    if (device >= 0) {
        cd_out_puts(o, ", device ");
        cd_out_u(o, (unsigned)device);
    }
    cd_out_puts(o, ": unfinished for ");
    put_secs(o, a->now_ns > r->t_ns ? a->now_ns - r->t_ns : 0);
    cd_out_puts(o, ", ");
    cd_out_u(o, a->e->queued);
    cd_out_puts(o, a->e->queued == 1 ? " launch queued behind it" : " launches queued behind it");
    cd_out_puts(o, " (launch #");
    cd_out_u(o, (unsigned long long)r->seq);
    cd_out_puts(o, ", thread ");
    cd_out_u(o, (unsigned)r->thread_id);
    cd_out_puts(o, ")\n");
}

static void put_entry(cd_out *o, const cd_inflight *e, uint64_t now_ns)
{
    const cd_watch_record *r = &e->rec;
    entry_arg a = {e, now_ns};
    if (r->flags & CD_WATCH_GRAPH) {   /* the node(s) of its graph still running */
        cd_out_graph_inflight(o, r, put_details, &a);
        return;
    }
    cd_out_puts(o, "  ");
    cd_out_launch_name(o, r, 0);
    put_details(o, &a);
    cd_out_puts(o, "  ");
    cd_out_location(o, r->frames, r->n_frames, 0);
    if (e->candidates > 1) {
        /* Sparse markers: the unfinished one is this launch (the likeliest:
         * capture/inflight.c) or another of the candidates of its stream,
         * launches #first to #open; each named, the first few. */
        cd_out_puts(o, "    (the likeliest of ");
        cd_out_u(o, e->candidates);
        cd_out_puts(o, " launches, #");
        cd_out_u(o, (unsigned long long)e->first_seq);
        cd_out_puts(o, " to #");
        cd_out_u(o, (unsigned long long)e->open_seq);
        cd_out_puts(o, ", user and JIT kernels and kernels not seen to finish first: watch() "
                       "puts a completion marker behind every ");
        cd_out_u(o, atomic_load(&cd_gates.watch_every));
        cd_out_puts(o, "th launch of a stream; watch(exact=True) behind each)\n");
        uint64_t shown = 0;
        for (uint64_t seq = e->first_seq; seq <= e->open_seq && shown < 3; seq++) {
            cd_watch_record c;
            if (seq == r->seq)
                continue;
            if (cd_watch_get(seq, &c) != 0 || c.stream != r->stream || c.ctx != r->ctx ||
                (c.flags & CD_WATCH_CAPTURED))
                continue;
            const char *k = cd_interned(c.kernel_short);
            cd_out_puts(o, "    or ");
            cd_out_puts(o, k ? k : "?");
            cd_out_puts(o, " (launch #");
            cd_out_u(o, (unsigned long long)seq);
            cd_out_puts(o, ")\n    ");
            cd_out_location(o, c.frames, c.n_frames, 0);
            shown++;
        }
    }
}

static const char *signal_name(int sig)
{
    return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGUSR2 ? "SIGUSR2" : "a signal";
}

static atomic_int dump_listening;  /* the dump listener (hooks/dump_server.c) answers */

void cd_report_dump_listening(int on) { atomic_store(&dump_listening, on); }

/* The block, from one search (table, n, sum). hang_after_ns: the watcher's
 * threshold; else asked by `sig`; else (both 0) asked by `cuda_debug dump`. */
static void put_inflight(cd_out *o, const cd_inflight *t, int n, const cd_inflight_summary *sum,
                         uint64_t hang_after_ns, int sig)
{
    cd_out_puts(o, "cuda_debug (watch): ");
    if (hang_after_ns) {
        cd_out_puts(o, "possible hang: a launch unfinished for longer than hang_after=");
        put_secs(o, hang_after_ns);
    } else {
        if (sig) {
            cd_out_puts(o, signal_name(sig));
            cd_out_puts(o, " (pid ");
        } else {
            cd_out_puts(o, "unfinished launches of pid ");
        }
        cd_out_u(o, (unsigned long long)getpid());
        if (sig)
            cd_out_puts(o, ")");
        if (!atomic_load(&cd_gates.watching))
            cd_out_puts(o, ", no watch() open now (launches since it closed are not recorded)");
    }
    cd_out_puts(o, "\n");
    if (n == 0) {
        cd_out_puts(o, "  no unfinished launch");
        if (sum->scanned) {
            cd_out_puts(o, " (the last of the ");
            cd_out_u(o, sum->scanned);
            cd_out_puts(o, " launches in the watch ring was ");
            put_secs(o, sum->now_ns > sum->newest_ns ? sum->now_ns - sum->newest_ns : 0);
            cd_out_puts(o, " ago)");
        } else {
            cd_out_puts(o, ": no launch recorded (watch() records the launches made while it is open)");
        }
        cd_out_puts(o, "\n");
    } else {
        cd_out_puts(o, "  oldest unfinished launch per stream, oldest first:\n");
    }
    for (int i = 0; i < n && i < SHOWN_MAX; i++) {
        if (o->n > sizeof o->buf - 1024)
            cd_out_flush(o);
        put_entry(o, &t[i], sum->now_ns);
    }
    if (n > SHOWN_MAX) {
        cd_out_puts(o, "  and ");
        cd_out_u(o, (unsigned)(n - SHOWN_MAX));
        cd_out_puts(o, " more streams\n");
    }
    if (sum->streams_cut) {
        cd_out_puts(o, "  and ");
        cd_out_u(o, sum->streams_cut);
        cd_out_puts(o, " unfinished launches on streams beyond the ");
        cd_out_u(o, CD_INFLIGHT_MAX);
        cd_out_puts(o, " followed\n");
    }
    if (hang_after_ns) {
        cd_out_puts(o, "  The process goes on (one report per stuck launch)");
        int dump = atomic_load(&dump_signal);
        if (atomic_load(&dump_listening)) {
            cd_out_puts(o, "; `python -m cuda_debug dump ");
            cd_out_u(o, (unsigned long long)getpid());
            cd_out_puts(o, "` prints this again in the terminal it runs in");
        } else if (dump) {
            cd_out_puts(o, "; ");
            cd_out_puts(o, signal_name(dump));
            cd_out_puts(o, " writes this again");
        }
        cd_out_puts(o, ".\n");
    }
    cd_out_flush(o);
}

/* The block on fd 2 (static buffers, under cd_report_lock). */
static void write_inflight(uint64_t hang_after_ns, int sig)
{
    cd_out *o = &out;
    o->n = 0;
    o->line_start = 1;
    o->raw = 0;
    cd_inflight_summary sum;
    int n = cd_watch_inflight(table, CD_INFLIGHT_MAX, &sum, scan);
    put_inflight(o, table, n, &sum, hang_after_ns, sig);
}

void cd_report_inflight_text(cd_out *o, const cd_inflight *t, int n,
                             const cd_inflight_summary *sum)
{
    put_inflight(o, t, n, sum, 0, 0);
}

void cd_report_hang(uint64_t hang_after_ns)
{
    if (!hang_after_ns)
        return;
    /* Not from a handler: keep this thread's own dump and fatal signals
     * from landing in the middle (they would wait for the lock we hold). */
    sigset_t block, old;
    cd_signal_mask(&block);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int taken = cd_report_lock();
    write_inflight(hang_after_ns, 0);
    cd_report_unlock(taken);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* ------------------------------------------------- the dump signal --- */

static struct sigaction old_dump;

/* The threads inside on_dump_signal now (their tids; 0 free). A handler
 * installed after ours that chains back to us (faulthandler.register(chain=
 * True)), which we chain to after re-installing, re-enters on the same
 * thread: that round returns. Another thread's signal is its own: it writes
 * its report and chains too (one flag for the whole process made the second
 * of two simultaneous signals return without chaining). */
#define HANDLER_THREADS 16
static atomic_int in_handler[HANDLER_THREADS];

static int enter_handler(int tid)
{
    for (int i = 0; i < HANDLER_THREADS; i++)
        if (atomic_load(&in_handler[i]) == tid)
            return -1;             /* this thread is inside already: a chain came back */
    for (int i = 0; i < HANDLER_THREADS; i++) {
        int free_ = 0;
        if (atomic_compare_exchange_strong(&in_handler[i], &free_, tid))
            return i;
    }
    return HANDLER_THREADS;        /* more threads than slots at once: not tracked */
}

static void on_dump_signal(int sig, siginfo_t *info, void *uctx)
{
    int saved_errno = errno;
    int tid = (int)syscall(SYS_gettid);
    int slot = enter_handler(tid);
    if (slot < 0) {
        errno = saved_errno;
        return;
    }
    int taken = cd_report_lock();
    write_inflight(0, sig);
    cd_report_unlock(taken);
    cd_signal_chain(&old_dump, sig, info, uctx);  /* never the default: it ends the process */
    if (slot < HANDLER_THREADS)
        atomic_store(&in_handler[slot], 0);
    errno = saved_errno;
}

int cd_dump_handler_is_ours(void)
{
    int sig = atomic_load(&dump_signal);
    struct sigaction cur;
    if (!sig || sigaction(sig, NULL, &cur) != 0)
        return 0;
    return (cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_dump_signal;
}

static uintptr_t python_trampoline;      /* Python's C-level signal handler, if known */

static uintptr_t handler_of(const struct sigaction *sa)
{
    return (sa->sa_flags & SA_SIGINFO) ? (uintptr_t)sa->sa_sigaction : (uintptr_t)sa->sa_handler;
}

int cd_install_dump_signal(int sig, int sig_is_python, int sigint_is_python)
{
    if (sig <= 0)
        return 0;
    int had = atomic_load(&dump_signal);
    if (had && had != sig) {
        errno = EBUSY;             /* one dump signal per process */
        return -1;
    }
    struct sigaction cur;
    if (sigaction(sig, NULL, &cur) != 0)
        return -1;
    if ((cur.sa_flags & SA_SIGINFO) && cur.sa_sigaction == on_dump_signal)
        return 0;                  /* still ours */
    if (!had) {
        /* Python's own handler (one C function for every signal that has a
         * Python handler): there now, or on SIGINT. */
        struct sigaction q;
        if (sig_is_python)
            python_trampoline = handler_of(&cur);
        else if (sigint_is_python && sigaction(SIGINT, NULL, &q) == 0)
            python_trampoline = handler_of(&q);
    } else {
        /* Python's handler, learnt now if it could not be at the first watch()
         * (SIGINT not Python's then: ignored, as in a background job). */
        if (!python_trampoline && sig_is_python)
            python_trampoline = handler_of(&cur);
        if (!python_trampoline || handler_of(&cur) != python_trampoline)
            return 0;   /* a C handler replaced ours (faulthandler.register...): left
                         * alone; if it chains, it chains to ours, and chaining back
                         * would loop */
    }
    /* Never installed, or Python's signal.signal() replaced ours: chain to
     * what is there now. With no handler to chain to, restart the system
     * calls we interrupt; with one, keep its choice (Python's wants EINTR). */
    int handler = (cur.sa_flags & SA_SIGINFO) ? cur.sa_sigaction != NULL
                                              : cur.sa_handler != SIG_DFL &&
                                                    cur.sa_handler != SIG_IGN;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_dump_signal;
    sa.sa_flags = SA_SIGINFO | (handler ? (cur.sa_flags & SA_RESTART) : SA_RESTART);
    cd_signal_mask(&sa.sa_mask);
    old_dump = cur;                /* before the handler can run */
    if (sigaction(sig, &sa, NULL) != 0)
        return -1;
    atomic_store(&dump_signal, sig);
    return 0;
}

int cd_dump_signal(void) { return atomic_load(&dump_signal); }

void cd_inflight_report_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        for (int i = 0; i < HANDLER_THREADS; i++)
            atomic_store(&in_handler[i], 0);
        atomic_store(&dump_listening, 0);   /* the child's listener starts at its watch() */
        break;
    case CD_FORK_TEST_TAKE:
        atomic_store(&in_handler[0], -1);   /* another thread inside the dump handler */
        break;
    case CD_FORK_TEST_GIVE:
        atomic_store(&in_handler[0], 0);
        break;
    }
}
