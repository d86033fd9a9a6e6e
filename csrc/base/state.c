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
    .watch_every = 1,            /* Python sets it at each watch() entry */
};
