/*
 * base/state.c: the gates the callback reads lock-free (cd_gates) and the
 * configuration (cd_config), each written here alone (base.h says who
 * reads them, and under what); fork's lock helper.
 */
#include "base/base.h"

cd_gates_t cd_gates = {
    .capture_gen = 1,
    .capture_cache = 1,
    .watch_every = 1,            /* Python sets it at each watch() entry */
};

cd_config_t cd_config = {
    .wait_mode = CD_WAIT_SYNC,
    .tee_stderr = 1,
    .capture_check = 1,
    .graph_markers = CD_MARKERS_KERNEL,
    .graph_marker_every = 8,     /* Python sets it (CUDA_DEBUG_GRAPH_MARKER_EVERY) */
};

void cd_configure(const cd_config_t *c)
{
    cd_config = *c;
}

void cd_gate_count(enum cd_gate g, int delta)
{
    atomic_int *count = g == CD_GATE_ACTIVE     ? &cd_gates.active
                        : g == CD_GATE_WATCHING ? &cd_gates.watching
                                                : &cd_gates.all_threads;
    if (delta > 0)
        atomic_fetch_add(count, 1);
    else if (atomic_load(count) > 0)
        atomic_fetch_sub(count, 1);
}

void cd_gate_capture_moved(void)
{
    atomic_fetch_add_explicit(&cd_gates.capture_gen, 1, memory_order_relaxed);
}

void cd_gate_capture_cache(int on)
{
    atomic_store_explicit(&cd_gates.capture_cache, on, memory_order_relaxed);
}

void cd_gate_subscribed(void)
{
    atomic_fetch_add(&cd_gates.capture_gen, 1);    /* captures begun meanwhile are unknown */
    atomic_fetch_add(&cd_gates.subscriptions, 1);
}

void cd_gate_watch_every(unsigned every)
{
    atomic_store(&cd_gates.watch_every, every);
}

void cd_gate_in_callback(int delta)
{
    if (delta > 0)
        atomic_fetch_add(&cd_gates.in_callback, 1);
    else
        atomic_fetch_sub(&cd_gates.in_callback, 1);
}

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
    if (op != CD_FORK_CHILD)
        return;
    atomic_store(&cd_gates.active, 0);
    atomic_store(&cd_gates.watching, 0);
    atomic_store(&cd_gates.all_threads, 0);
    atomic_fetch_add(&cd_gates.capture_gen, 1);
}
