/*
 * hooks/hang_watcher.c: watch(hang_after=s). A thread that notices a launch
 * stuck for longer than s and writes the in-flight report (report/
 * inflight_report.c) once per stuck launch, the process left alive.
 *
 * Started by the first cd_hang_watch_set with s > 0 (never otherwise); it
 * makes no CUDA call and touches host memory only (the watch ring and the
 * completion slots, through capture/inflight.c), holds every signal blocked
 * (so the dump and fatal signals land on the program's threads), and sleeps
 * in steps of s/4 (50 ms to 1 s), never spinning. A step in which nothing was
 * unfinished and nothing was launched costs a load and a compare.
 *
 * Stuck: a stream's oldest unfinished launch, launched more than s ago, while
 * either later launches queue behind it on the same stream, or no launch at
 * all was recorded, on any stream, for s (the host waits: a synchronize, a
 * .item(), a collective's wait). A kernel left running on a side stream while
 * the program goes on launching elsewhere is not a hang. Each stuck launch is
 * reported once, for as long as it stays its stream's oldest unfinished one;
 * a launch found stuck later (the next one, on any stream) reports again.
 *
 * A forked child has no watcher thread (threads do not survive fork): its
 * mutex and condition variable are made anew (the parent's watcher may have
 * been waiting on the condition variable: glibc's pthread_cond_signal then
 * blocks in the child for good), hang_after is 0, and the next nonzero
 * cd_hang_watch_set starts a thread of the child's own (cd_hang_watch_fork).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "hooks/hooks.h"

#include <signal.h>     /* sigset_t, sigfillset, pthread_sigmask */
#include <sys/prctl.h>   /* prctl, PR_SET_NAME */
#include <time.h>        /* timespec, clock_gettime, CLOCK_MONOTONIC, ... */

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv;                       /* CLOCK_MONOTONIC; made by init_cv */
static int cv_made;                             /* under mu */
static atomic_uint_fast64_t hang_after_ns;     /* 0: off */
static int started;                             /* under mu */
static atomic_uint_fast64_t n_reports;

/* The watcher thread's own. */
static cd_inflight table[CD_INFLIGHT_MAX];
static cd_stream_scan scan[CD_INFLIGHT_MAX];
static uint64_t reported[CD_INFLIGHT_MAX];
static int n_reported;
static uint64_t last_seq;
static int last_unfinished;

static int was_reported(uint64_t seq)
{
    for (int i = 0; i < n_reported; i++)
        if (reported[i] == seq)
            return 1;
    return 0;
}

/* One look: report when a launch is newly stuck. */
static void look(uint64_t h)
{
    if (!atomic_load(&cd_gates.watching))
        return;
    uint64_t seq = cd_watch_seq();
    if (seq == last_seq && !last_unfinished)
        return;                    /* nothing launched, nothing running */
    cd_inflight_summary sum;
    int n = cd_watch_inflight(table, CD_INFLIGHT_MAX, &sum, scan);
    last_seq = seq;
    last_unfinished = n;
    uint64_t quiet = sum.now_ns > sum.newest_ns ? sum.now_ns - sum.newest_ns : 0;
    int fresh = 0;
    uint8_t stuck[CD_INFLIGHT_MAX], known[CD_INFLIGHT_MAX];
    for (int i = 0; i < n; i++) {
        const cd_inflight *e = &table[i];
        uint64_t age = sum.now_ns > e->first_ns ? sum.now_ns - e->first_ns : 0;
        stuck[i] = age > h && (e->queued > 0 || quiet > h);
        known[i] = (uint8_t)was_reported(e->rec.seq);
        fresh |= stuck[i] && !known[i];
    }
    if (fresh) {
        cd_report_hang(h);
        atomic_fetch_add(&n_reports, 1);
    }
    /* Reported: the launches a report named as stuck, for as long as they
     * stay their stream's oldest unfinished one. */
    int k = 0;
    for (int i = 0; i < n; i++)
        if (known[i] || (fresh && stuck[i]))
            reported[k++] = table[i].rec.seq;
    n_reported = k;
}

static void *watcher_main(void *arg)
{
    (void)arg;
    prctl(PR_SET_NAME, "cuda_debug-hang", 0, 0, 0);
    pthread_mutex_lock(&mu);
    for (;;) {
        uint64_t h = atomic_load(&hang_after_ns);
        if (!h) {
            pthread_cond_wait(&cv, &mu);
            continue;
        }
        uint64_t step = h / 4;
        if (step < CD_HANG_STEP_MIN_NS)
            step = CD_HANG_STEP_MIN_NS;
        if (step > 1000000000u)
            step = 1000000000u;
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += (time_t)(step / 1000000000u);
        until.tv_nsec += (long)(step % 1000000000u);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&cv, &mu, &until);
        h = atomic_load(&hang_after_ns);
        if (!h)
            continue;
        pthread_mutex_unlock(&mu);
        look(h);
        pthread_mutex_lock(&mu);
    }
    return NULL;
}

static void init_cv(void)
{
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cv, &ca);
    pthread_condattr_destroy(&ca);
    cv_made = 1;
}

void cd_hang_watch_fork(int op)
{
    cd_fork_lock(&mu, op);
    if (op != CD_FORK_CHILD)
        return;
    cv_made = 0;                   /* made anew at the child's first start */
    started = 0;
    atomic_store(&hang_after_ns, 0);
    n_reported = 0;                /* the watcher's own: the parent's thread is gone */
    last_seq = 0;
    last_unfinished = 0;
}

static int start_locked(void)
{
    if (!cv_made)
        init_cv();
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);  /* the thread inherits it */
    pthread_attr_t a;
    pthread_attr_init(&a);
    pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
    pthread_t t;
    int rc = pthread_create(&t, &a, watcher_main, NULL);
    pthread_attr_destroy(&a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc == 0)
        started = 1;
    return rc;
}

int cd_hang_watch_set(uint64_t ns)
{
    pthread_mutex_lock(&mu);
    atomic_store(&hang_after_ns, ns);
    int rc = 0;
    if (ns && !started)
        rc = start_locked();
    if (started)
        pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    return rc;
}

uint64_t cd_hang_watch_get(void) { return atomic_load(&hang_after_ns); }

uint64_t cd_hang_reports(void) { return atomic_load(&n_reports); }
