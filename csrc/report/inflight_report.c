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
 *   [rank 0]   The process goes on (one report per stuck launch); `python -m cuda_debug
 *                dump 4242` (SIGUSR1) writes this again.
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

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

/* Under cd_report_lock (or, when it could not be had in 3 s, shared at worst
 * with a report being written: text may mix, nothing worse). */
static cd_inflight table[CD_INFLIGHT_MAX];
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

static void put_entry(cd_out *o, const cd_inflight *e, uint64_t now_ns)
{
    const cd_watch_record *r = &e->rec;
    char coll[96];
    size_t cl = cd_collective_name(r, coll, sizeof coll);
    const char *kernel = cd_interned(r->kernel_short);
    cd_out_puts(o, "  ");
    if (r->flags & CD_WATCH_GRAPH) {
        cd_out_puts(o, "a CUDA graph replay");
    } else if (cl) {
        cd_out_put(o, coll, cl);
        cd_out_puts(o, " (");
        cd_out_puts(o, kernel ? kernel : "?");
        cd_out_puts(o, ")");
    } else {
        cd_out_puts(o, kernel ? kernel : "?");
    }
    cd_out_puts(o, " on stream ");
    cd_out_hex(o, r->stream);
    int device = cd_watch_context_device(r->ctx);
    if (device >= 0) {
        cd_out_puts(o, ", device ");
        cd_out_u(o, (unsigned)device);
    }
    cd_out_puts(o, ": unfinished for ");
    put_secs(o, now_ns > r->t_ns ? now_ns - r->t_ns : 0);
    cd_out_puts(o, ", ");
    cd_out_u(o, e->queued);
    cd_out_puts(o, e->queued == 1 ? " launch queued behind it" : " launches queued behind it");
    cd_out_puts(o, " (launch #");
    cd_out_u(o, (unsigned long long)r->seq);
    cd_out_puts(o, ", thread ");
    cd_out_u(o, (unsigned)r->thread_id);
    cd_out_puts(o, ")\n  ");
    cd_out_location(o, r->frames, r->n_frames, 0);
}

static const char *signal_name(int sig)
{
    return sig == SIGUSR1 ? "SIGUSR1" : sig == SIGUSR2 ? "SIGUSR2" : "a signal";
}

/* The block. hang_after_ns: the watcher's threshold (0: asked by `sig`). */
static void write_inflight(uint64_t hang_after_ns, int sig)
{
    cd_out *o = &out;
    o->n = 0;
    o->line_start = 1;
    o->raw = 0;
    cd_inflight_summary sum;
    int n = cd_watch_inflight(table, CD_INFLIGHT_MAX, &sum);
    cd_out_puts(o, "cuda_debug (watch): ");
    if (hang_after_ns) {
        cd_out_puts(o, "possible hang: a launch unfinished for longer than hang_after=");
        put_secs(o, hang_after_ns);
    } else {
        cd_out_puts(o, signal_name(sig));
        cd_out_puts(o, " (pid ");
        cd_out_u(o, (unsigned long long)getpid());
        cd_out_puts(o, ")");
        if (!atomic_load(&cd_state.watching))
            cd_out_puts(o, ", no watch() open now (launches since it closed are not recorded)");
    }
    cd_out_puts(o, "\n");
    if (n == 0) {
        cd_out_puts(o, "  no unfinished launch");
        if (sum.scanned) {
            cd_out_puts(o, " (the last of the ");
            cd_out_u(o, sum.scanned);
            cd_out_puts(o, " launches in the watch ring was ");
            put_secs(o, sum.now_ns > sum.newest_ns ? sum.now_ns - sum.newest_ns : 0);
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
        put_entry(o, &table[i], sum.now_ns);
    }
    if (n > SHOWN_MAX) {
        cd_out_puts(o, "  and ");
        cd_out_u(o, (unsigned)(n - SHOWN_MAX));
        cd_out_puts(o, " more streams\n");
    }
    if (sum.streams_cut) {
        cd_out_puts(o, "  and ");
        cd_out_u(o, sum.streams_cut);
        cd_out_puts(o, " unfinished launches on streams beyond the ");
        cd_out_u(o, CD_INFLIGHT_MAX);
        cd_out_puts(o, " followed\n");
    }
    if (hang_after_ns) {
        cd_out_puts(o, "  The process goes on (one report per stuck launch)");
        int dump = atomic_load(&dump_signal);
        if (dump) {
            cd_out_puts(o, "; `python -m cuda_debug dump ");
            cd_out_u(o, (unsigned long long)getpid());
            cd_out_puts(o, "` (");
            cd_out_puts(o, signal_name(dump));
            cd_out_puts(o, ") writes this again");
        }
        cd_out_puts(o, ".\n");
    }
    cd_out_flush(o);
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

static atomic_int in_handler;

static void on_dump_signal(int sig, siginfo_t *info, void *uctx)
{
    /* A handler installed after ours that chains back to us (faulthandler.
     * register(chain=True)), which we chain to after re-installing: once round. */
    if (atomic_exchange(&in_handler, 1))
        return;
    int saved_errno = errno;
    int taken = cd_report_lock();
    write_inflight(0, sig);
    cd_report_unlock(taken);
    cd_signal_chain(&old_dump, sig, info, uctx);  /* never the default: it ends the process */
    atomic_store(&in_handler, 0);
    errno = saved_errno;
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
    } else if (!python_trampoline || handler_of(&cur) != python_trampoline) {
        /* A C handler replaced ours (faulthandler.register...): left alone;
         * if it chains, it chains to ours, and chaining back would loop. */
        return 0;
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
        atomic_store(&in_handler, 0);
        break;
    case CD_FORK_TEST_TAKE:
        atomic_store(&in_handler, 1);       /* another thread inside the dump handler */
        break;
    case CD_FORK_TEST_GIVE:
        atomic_store(&in_handler, 0);
        break;
    }
}
