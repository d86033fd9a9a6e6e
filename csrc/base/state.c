/*
 * base/state.c: the one process-wide state struct of the launch hooks
 * (cd_state; base.h says what protects each field).
 */
#include "base/base.h"

cd_state_t cd_state = {
    .sub_lock = PTHREAD_MUTEX_INITIALIZER,
    .capture_gen = 1,
    .capture_on = 1,
    .capture_check = 1,
    .capture_cache = 1,
    .graph_markers = CD_MARKERS_KERNEL,
    .graph_marker_every = 8,          /* Python sets it (CUDA_DEBUG_GRAPH_MARKER_EVERY) */
    .watch_every = 1,            /* Python sets it at each watch() entry */
};

void cd_fork_locks(pthread_mutex_t *const *locks, size_t n, int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        for (size_t i = 0; i < n; i++)
            *locks[i] = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
        break;
    case CD_FORK_TEST_TAKE:
        for (size_t i = 0; i < n; i++)
            pthread_mutex_lock(locks[i]);
        break;
    case CD_FORK_TEST_GIVE:
        for (size_t i = n; i-- > 0;)
            pthread_mutex_unlock(locks[i]);
        break;
    }
}

void cd_fork_lock(pthread_mutex_t *lock, int op)
{
    cd_fork_locks(&lock, 1, op);
}

void cd_state_fork(int op)
{
    cd_fork_lock(&cd_state.sub_lock, op);
    if (op != CD_FORK_CHILD)
        return;
    atomic_store(&cd_state.active, 0);
    atomic_store(&cd_state.watching, 0);
    atomic_store(&cd_state.all_threads, 0);
    atomic_fetch_add(&cd_state.capture_gen, 1);
    if (cd_state.subscriber)
        cd_state.inherited = 1;
}
