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
 * A watch() that finds CUPTI held by another client (a profiler) opens
 * without it: the launch hooks record the runtime's launches meanwhile, and a
 * coverage gap (capture/coverage.c) says what is not seen until CUPTI comes
 * back (cd_scopes_take_back, when the profiler stops; or a later entry).
 *
 * A profiler that starts while scopes are open gets CUPTI at once
 * (cd_scopes_hand_over): the hooks switch to their record mode, the
 * subscription is given up, and the gap opens, all under cd_sub_lock (a watch()
 * entered on another thread meanwhile sees one state or the other).
 */
#include "hooks/hooks.h"

static atomic_uint next_token = 1;
static uint32_t fork_token;        /* a forked child: tokens below it are the parent's */
static atomic_uint_fast64_t n_take_backs;   /* CUPTI taken back after a profiler */

uint64_t cd_scopes_take_backs(void)
{
    return atomic_load(&n_take_backs);
}

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
                  char *holder, size_t holder_len, uint32_t where)
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
                                   (kind == CD_SCOPE_WATCH && atomic_load(&cd_gates.watching) == 0));
    if (need_drain && (*code = drain()) != 0)
        return 1;
    if (kind != CD_SCOPE_OPT_OUT) {
        pthread_mutex_lock(&cd_sub_lock);
        int fresh = 0;
        int rc = cd_cupti_acquire(cd_on_launch, &fresh, holder, holder_len);
        if (rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED && kind == CD_SCOPE_WATCH &&
            !cd_cupti_inherited()) {
            /* A profiler holds CUPTI: watch without it (what is not seen is a gap),
             * the device's assert text caught as with it. */
            if (cd_config.tee_stderr)
                cd_tee_install();
            cd_gate_count(CD_GATE_WATCHING, 1);
            cd_runtime_hooks_on();
            cd_hook_stats h;
            cd_runtime_hooks_stats(&h);
            cd_coverage_gap_open(CD_GAP_HELD, where, h.recording);
            pthread_mutex_unlock(&cd_sub_lock);
            cd_watch_prepare();
            *token = atomic_fetch_add(&next_token, 1);
            *code = rc;                /* opened, without CUPTI */
            return 0;
        }
        if (rc) {
            pthread_mutex_unlock(&cd_sub_lock);
            /* A dead context makes CUPTI refuse too (NOT_INITIALIZED): say
             * what really happened. */
            int dead = may_drain ? drain() : 0;
            *code = dead ? dead : rc;
            return dead ? 1 : 2;
        }
        if (fresh) {
            if (cd_config.tee_stderr)
                cd_tee_install();
            cd_native_ops_warm();
            cd_coverage_gap_close(where);     /* CUPTI is ours again */
        }
        if (kind == CD_SCOPE_WATCH)
            cd_gate_count(CD_GATE_WATCHING, 1);
        else
            cd_gate_count(CD_GATE_ACTIVE, 1);
        if (all_threads)
            cd_gate_count(CD_GATE_ALL_THREADS, 1);
        if (atomic_load(&cd_gates.watching)) {
            cd_cupti_watch_waits(1);   /* also after a hand-over and a new subscription */
            if (kind == CD_SCOPE_WATCH)
                cd_runtime_hooks_on();
        }
        pthread_mutex_unlock(&cd_sub_lock);
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
    pthread_mutex_lock(&cd_sub_lock);
    if (all_threads)
        cd_gate_count(CD_GATE_ALL_THREADS, -1);
    cd_gate_count(kind == CD_SCOPE_WATCH ? CD_GATE_WATCHING : CD_GATE_ACTIVE, -1);
    if (kind == CD_SCOPE_WATCH && atomic_load(&cd_gates.watching) == 0) {
        cd_runtime_hooks_off();
        cd_cupti_watch_waits(0);
        cd_coverage_gap_close(0);      /* the watch ended inside it */
    }
    cd_cupti_release();
    pthread_mutex_unlock(&cd_sub_lock);
}

int cd_scopes_hand_over(uint32_t where)
{
    /* The profiler sees the runtime's launches as without us: the hooks, while
     * a watch is open, launch the runtime's way and record after it (PyTorch's
     * launches stay covered); else they are off (the entries written back).
     * Then CUPTI is given up; captures begun from now on are not seen (every
     * launch asks the driver). */
    pthread_mutex_lock(&cd_sub_lock);
    cd_cupti_shared(CD_SHARED_PROFILER);   /* never finalized under the profiler's feet */
    const int watching = atomic_load(&cd_gates.watching) > 0;
    if (watching)
        cd_runtime_hooks_record();
    else
        cd_runtime_hooks_off();
    int had = cd_cupti_hand_over_locked();
    if (had) {
        cd_gate_capture_cache(0);
        cd_gate_capture_moved();
        if (watching) {
            cd_hook_stats h;
            cd_runtime_hooks_stats(&h);
            cd_coverage_gap_open(CD_GAP_PROFILER, where, h.recording);
        }
    }
    pthread_mutex_unlock(&cd_sub_lock);
    return had;
}

int cd_scopes_take_back(uint32_t where, char *holder, size_t holder_len)
{
    pthread_mutex_lock(&cd_sub_lock);
    if (holder_len)
        holder[0] = '\0';
    if (cd_cupti_subscribed() || cd_cupti_inherited() ||
        (atomic_load(&cd_gates.watching) == 0 && atomic_load(&cd_gates.active) == 0)) {
        pthread_mutex_unlock(&cd_sub_lock);
        return 0;
    }
    int fresh = 0;
    int rc = cd_cupti_acquire(cd_on_launch, &fresh, holder, holder_len);
    if (rc) {
        pthread_mutex_unlock(&cd_sub_lock);
        return -rc;
    }
    if (fresh && cd_config.tee_stderr)
        cd_tee_install();
    if (atomic_load(&cd_gates.watching)) {
        cd_cupti_watch_waits(1);
        cd_runtime_hooks_on();         /* the record mode becomes the direct route */
    }
    cd_coverage_gap_close(where);
    atomic_fetch_add(&n_take_backs, 1);
    pthread_mutex_unlock(&cd_sub_lock);
    return 1;
}

void cd_scopes_fork(int op)
{
    if (op == CD_FORK_CHILD)
        fork_token = atomic_load(&next_token);
}
