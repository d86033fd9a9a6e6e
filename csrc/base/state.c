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

void cd_state_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        cd_state.sub_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
        atomic_store(&cd_state.active, 0);
        atomic_store(&cd_state.watching, 0);
        atomic_store(&cd_state.all_threads, 0);
        atomic_fetch_add(&cd_state.capture_gen, 1);
        if (cd_state.subscriber)
            cd_state.inherited = 1;
        break;
    case CD_FORK_TEST_TAKE:
        pthread_mutex_lock(&cd_state.sub_lock);
        break;
    case CD_FORK_TEST_GIVE:
        pthread_mutex_unlock(&cd_state.sub_lock);
        break;
    }
}
