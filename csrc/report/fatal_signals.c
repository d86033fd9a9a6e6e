/*
 * report/fatal_signals.c: dying of a signal, and one report at a time.
 *
 * NCCL's watchdog aborts the process (SIGABRT) when it meets the sticky
 * error; torchrun ends the other ranks with SIGTERM. Before that, while
 * watching, write what the ring knows (faulthandler-style: async-signal-safe,
 * then the previous handler, or the default action, runs).
 *
 * The process is about to die when the previous disposition is the default
 * (it is restored and the signal raised again), and at SIGABRT (abort() does
 * not return, whatever the handler does): only then is torchrun's error file
 * written. A handler chained to returns, and the process may go on (Python's
 * handlers run later, in the main thread). errno is kept for the interrupted
 * code; the sibling signals (cd_signal_mask) wait until the report is out:
 * on this thread, by sa_mask; on another thread (a process-directed SIGTERM
 * goes to any thread that does not block it), by cd_report_lock (fault_report.c).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "report/report.h"

#include <errno.h>      /* errno */
#include <signal.h>      /* sigaction, siginfo_t, SA_SIGINFO, ... */
#include <string.h>      /* memset */

static struct sigaction old_abrt, old_term;
static atomic_int handlers_installed;

int cd_signal_chain(const struct sigaction *old, int sig, siginfo_t *info, void *uctx)
{
    if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction) {
        old->sa_sigaction(sig, info, uctx);
        return 1;
    }
    if (!(old->sa_flags & SA_SIGINFO) && old->sa_handler != SIG_DFL &&
        old->sa_handler != SIG_IGN && old->sa_handler != NULL) {
        old->sa_handler(sig);
        return 1;
    }
    return 0;
}

static void on_fatal_signal(int sig, siginfo_t *info, void *uctx)
{
    int saved_errno = errno;
    struct sigaction *old = sig == SIGABRT ? &old_abrt : &old_term;
    int chained = (old->sa_flags & SA_SIGINFO) ? old->sa_sigaction != NULL
                                               : old->sa_handler != SIG_DFL &&
                                                     old->sa_handler != SIG_IGN &&
                                                     old->sa_handler != NULL;
    int dying = sig == SIGABRT || (!chained && old->sa_handler == SIG_DFL);
    int taken = cd_report_lock();
    if (atomic_load(&cd_gates.watching))
        cd_report_watch_culprit(0, sig == SIGABRT ? "SIGABRT" : "SIGTERM",
                                dying ? CD_FROM_DYING_SIGNAL : CD_FROM_SIGNAL);
    cd_report_unlock(taken);
    if (!cd_signal_chain(old, sig, info, uctx)) {
        sigaction(sig, old, NULL);
        raise(sig);                /* delivered when this handler returns */
    }
    errno = saved_errno;
}

int cd_install_signal_handlers(void)
{
    if (atomic_exchange(&handlers_installed, 1))
        return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    cd_signal_mask(&sa.sa_mask);
    if (sigaction(SIGABRT, &sa, &old_abrt) != 0 || sigaction(SIGTERM, &sa, &old_term) != 0)
        return -1;
    return 0;
}
