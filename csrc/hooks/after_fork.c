/*
 * hooks/after_fork.c: a forked child starts clean.
 *
 * fork() copies the memory of the parent and one thread, the one that forked:
 * a lock another thread of the parent held stays held in the child for good,
 * the hang watcher's thread is gone, and the watch ring, the fault records,
 * the open scopes and the assert lines are the parent's. multiprocessing's
 * "fork" start method, PyTorch's DataLoader workers, os.fork() all do this.
 * (CUDA itself does not survive a fork: a child of a process that initialised
 * CUDA cannot use the GPU; with a driver that can, the child's own launches
 * are recorded as the child's.)
 *
 * The child's state, set by one pthread_atfork child handler, before anything
 * else runs in the child (bottom layer first):
 *   - every lock free: sub_lock, the contexts' retain_lock, the string
 *     arena's, loc_lock, ctx_lock, graph_lock, exec_lock, the tee's locks,
 *     log_lock, fault_lock, the report lock, the hang watcher's mutex (and its
 *     condition variable made anew), the dump listener's mutex, and the flags a handler running in
 *     another thread would have left set;
 *   - not watching, not blocking: no scope or watch() open, none on the
 *     child's thread; a scope opened before the fork closes nothing there; a
 *     CUPTI subscription the parent held is left as it is (never given back
 *     from the child: no CUPTI call into a forked CUDA);
 *   - nothing of the parent's is ever reported as the child's: the parent's
 *     launches (watch ring, its contexts' completion slots) and fault records
 *     are never read again, its assert lines are dropped, the reports and
 *     torchrun's error file count as not written; so the signal handlers
 *     (SIGTERM, SIGABRT, the dump signal) have nothing of the parent's to say;
 *   - no hang watcher thread, hang_after 0: the next watch(hang_after=)
 *     starts a thread of the child's own; no dump listener (the parent's
 *     socket closed): the next watch() starts the child's, under its pid.
 * Python's own state follows (os.register_at_fork in cuda_debug/_report.py,
 * _hangs.py).
 *
 * The child handler only stores into our own variables (and initialises a
 * condition variable): async-signal-safe in practice, as POSIX asks of a
 * child handler after a multi-threaded fork. One prepare/parent pair: the
 * dump listener's accept_mu, held by fork, so that a caller's socket accepted
 * just before it is listed (and closed by the child's handler), never copied
 * into the child unseen.
 */
#include "hooks/hooks.h"

#include <errno.h>      /* errno, EINTR, EINVAL */
#include <semaphore.h>   /* sem_t, sem_post, sem_wait, ... */

static void (*beside)(int op);     /* a layer beside hooks/: the benchmarks' lock */

/* Every file's cd_*_fork, bottom layer first (the order of taking, for the
 * tests; giving back goes the other way). */
static void (*const forks[])(int op) = {
    cd_state_fork, cd_subscription_fork, cd_devices_fork, cd_intern_fork,   /* base */
    cd_frames_fork, cd_contexts_fork, cd_watch_fork, cd_graph_pool_fork, cd_graph_execs_fork,
    cd_graph_adopt_fork, cd_tee_fork, cd_driver_log_fork, cd_coverage_fork, /* capture */
    cd_faults_fork, cd_report_fork, cd_inflight_report_fork, cd_inflight_doc_fork, /* report */
    cd_scopes_fork, cd_thread_fork, cd_hang_watch_fork, cd_dump_server_fork, /* hooks */
    cd_runtime_hooks_fork,
};

static void in_child(void)
{
    for (size_t i = 0; i < CD_N_OF(forks); i++)
        forks[i](CD_FORK_CHILD);
    if (beside)
        beside(CD_FORK_CHILD);
}

/* Around the fork itself, in the parent: the dump listener lists a caller's
 * fd before a fork may copy it (cd_dump_server_fork_prepare). */
static void before_fork(void) { cd_dump_server_fork_prepare(1); }
static void in_parent(void) { cd_dump_server_fork_prepare(0); }

int cd_fork_init(void (*more)(int op))
{
    static atomic_int done;
    if (atomic_exchange(&done, 1))
        return 0;
    beside = more;
    return pthread_atfork(before_fork, in_parent, in_child);
}

/* ---------------------------------------------------------- tests -- */

static pthread_t holder;
static sem_t held, release;
static int holding;                /* under the GIL (Python calls cd_fork_test_hold) */

static void *hold_main(void *arg)
{
    (void)arg;
    for (size_t i = 0; i < CD_N_OF(forks); i++)
        forks[i](CD_FORK_TEST_TAKE);
    if (beside)
        beside(CD_FORK_TEST_TAKE);
    sem_post(&held);
    while (sem_wait(&release) != 0 && errno == EINTR)
        ;
    if (beside)
        beside(CD_FORK_TEST_GIVE);
    for (size_t i = CD_N_OF(forks); i-- > 0;)
        forks[i](CD_FORK_TEST_GIVE);
    return NULL;
}

int cd_fork_test_hold(int hold)
{
    if (hold == holding)
        return EINVAL;
    if (hold) {
        sem_init(&held, 0, 0);
        sem_init(&release, 0, 0);
        int rc = pthread_create(&holder, NULL, hold_main, NULL);
        if (rc)
            return rc;
        while (sem_wait(&held) != 0 && errno == EINTR)
            ;
    } else {
        sem_post(&release);
        pthread_join(holder, NULL);
        sem_destroy(&held);
        sem_destroy(&release);
    }
    holding = hold;
    return 0;
}
