/*
 * hooks/scopes.c: opening and closing launch_blocking() scopes and watch() blocks.
 *
 * Opening, in one C call (no Python bytecode in between, so a
 * KeyboardInterrupt cannot fall between taking CUPTI and recording it):
 *   1. drain: wait for the work already queued (cuCtxSynchronize of the
 *      current context, or of every active primary context when none is
 *      current), unless this thread already blocks or the process already
 *      watches; a sticky error found there happened before the scope;
 *   2. take CUPTI (subscribe, with the launch callback) if nothing holds it
 *      yet; on a fresh subscription install the stderr tee and warm the
 *      native-stack unwinder, outside any fault;
 *   3. count the scope and push the thread state (hooks/thread_state.c).
 */
#include "hooks/hooks.h"

static atomic_uint next_token = 1;
static uint32_t fork_token;        /* a forked child: tokens below it are the parent's */

/* The drain before a scope: 0, or the sticky error found. The caller skips
 * it while this thread captures a CUDA graph (a synchronisation would
 * invalidate the capture; Python asks the frameworks, which know their
 * current stream). Nothing to drain before anyone initialised CUDA. */
static int drain(void)
{
    if (cd_driver_ready() != 0)
        return 0;
    int rc = cd_sync_current_or_active();
    return cd_is_sticky(rc) ? rc : 0;
}

int cd_scope_open(int kind, int all_threads, int may_drain, uint32_t *token, int *code,
                  char *holder, size_t holder_len)
{
    *code = 0;
    *token = 0;
    if (holder_len)
        holder[0] = '\0';
    if (kind != CD_SCOPE_WATCH && cd_thread_depth() >= CD_MAX_SCOPE_DEPTH) {
        *code = CD_MAX_SCOPE_DEPTH;
        return 3;
    }
    const int state = cd_thread_state();
    int need_drain = may_drain && ((kind == CD_SCOPE_BLOCK && state <= 0) ||
                                   (kind == CD_SCOPE_WATCH && atomic_load(&cd_state.watching) == 0));
    if (need_drain && (*code = drain()) != 0)
        return 1;
    if (kind != CD_SCOPE_OPT_OUT) {
        pthread_mutex_lock(&cd_state.sub_lock);
        int fresh = 0;
        int rc = cd_cupti_acquire(cd_on_launch, &fresh, holder, holder_len);
        if (rc) {
            pthread_mutex_unlock(&cd_state.sub_lock);
            /* A dead context makes CUPTI refuse too (NOT_INITIALIZED): say
             * what really happened. */
            int dead = may_drain ? drain() : 0;
            *code = dead ? dead : rc;
            return dead ? 1 : 2;
        }
        if (fresh) {
            if (cd_state.capture_on)
                cd_tee_install();
            cd_native_ops_warm();
        }
        if (kind == CD_SCOPE_WATCH)
            atomic_fetch_add(&cd_state.watching, 1);
        else
            atomic_fetch_add(&cd_state.active, 1);
        if (all_threads)
            atomic_fetch_add(&cd_state.all_threads, 1);
        if (atomic_load(&cd_state.watching)) {
            cd_cupti_watch_waits(1);   /* also after a hand-over and a new subscription */
            if (kind == CD_SCOPE_WATCH)
                cd_runtime_hooks_on();
        }
        pthread_mutex_unlock(&cd_state.sub_lock);
    }
    if (kind == CD_SCOPE_WATCH)
        cd_watch_prepare();
    *token = atomic_fetch_add(&next_token, 1);
    if (kind != CD_SCOPE_WATCH)
        cd_thread_push(*token, kind == CD_SCOPE_BLOCK ? 1 : -1);
    return 0;
}

void cd_scope_close(int kind, int all_threads, uint32_t token)
{
    if (kind != CD_SCOPE_WATCH)
        cd_thread_pop(token);
    if (kind == CD_SCOPE_OPT_OUT || token < fork_token)
        return;                    /* opted out, or the parent's (counted there, not here) */
    pthread_mutex_lock(&cd_state.sub_lock);
    if (all_threads && atomic_load(&cd_state.all_threads) > 0)
        atomic_fetch_sub(&cd_state.all_threads, 1);
    atomic_int *count = kind == CD_SCOPE_WATCH ? &cd_state.watching : &cd_state.active;
    if (atomic_load(count) > 0)
        atomic_fetch_sub(count, 1);
    if (kind == CD_SCOPE_WATCH && atomic_load(&cd_state.watching) == 0) {
        cd_runtime_hooks_off();
        cd_cupti_watch_waits(0);
    }
    cd_cupti_release();
    pthread_mutex_unlock(&cd_state.sub_lock);
}

int cd_scopes_hand_over(void)
{
    /* A profiler gets the runtime's launches too: the hooks off first (the
     * entries written back, CUPTI dispatching their route again), then CUPTI
     * given up. The next watch() entry takes them again. */
    pthread_mutex_lock(&cd_state.sub_lock);
    cd_runtime_hooks_off();
    pthread_mutex_unlock(&cd_state.sub_lock);
    return cd_cupti_hand_over();
}

void cd_scopes_fork(int op)
{
    if (op == CD_FORK_CHILD)
        fork_token = atomic_load(&next_token);
}
