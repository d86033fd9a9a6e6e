/*
 * scopes.c: opening and closing launch_blocking() scopes and watch() blocks.
 *
 * Per thread, a small stack of open scopes (token, state); the thread's state
 * is its most recently opened scope still open (+1 block, -1 opted out, 0
 * none). A scope closes by its token, wherever it is in the stack, so that
 * asyncio tasks interleaving scopes on one thread never leave a thread
 * unblocked while one of them is still inside a scope (they may block each
 * other's launches meanwhile: over-blocking, never under-blocking).
 * watch() is process-wide and leaves the thread stacks alone.
 *
 * Opening, in one C call (no Python bytecode in between, so a
 * KeyboardInterrupt cannot fall between taking CUPTI and recording it):
 *   1. drain: wait for the work already queued (cuCtxSynchronize of the
 *      current context, or of every active primary context when none is
 *      current), unless this thread already blocks or the process already
 *      watches; a sticky error found there happened before the scope;
 *   2. take CUPTI (subscribe) if nothing holds it yet;
 *   3. count the scope and push the thread state.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "cuda_debug.h"

#include <string.h>
#include <sys/prctl.h>

#define MAX_DEPTH 64

static _Thread_local struct {
    uint32_t token;
    signed char state;
} tls_stack[MAX_DEPTH];
static _Thread_local int tls_depth;
static _Thread_local signed char tls_state;   /* tls_stack's top state, cached */
/* Per-thread kind, computed once: 0 unknown, 1 plain, 2 follower. A follower
 * is a framework worker that launches on behalf of a scoped thread: PyTorch's
 * autograd device threads ("pt_autograd_N") run backward kernels, so
 * loss.backward() inside a scope must block there too. */
static _Thread_local signed char tls_kind;
static atomic_uint next_token = 1;

int cd_thread_state(void) { return tls_state; }

static int classify_thread(void)
{
    char name[17] = {0};
    if (prctl(PR_GET_NAME, name, 0, 0, 0) == 0 && strncmp(name, "pt_autograd", 11) == 0)
        return 2;
    return 1;
}

int cd_thread_wants_blocking(void)
{
    int s = tls_state;
    if (s)
        return s > 0;
    if (atomic_load_explicit(&cd_state.all_threads, memory_order_relaxed))
        return 1;
    if (!atomic_load_explicit(&cd_state.active, memory_order_relaxed))
        return 0;
    if (!tls_kind)
        tls_kind = (signed char)classify_thread();
    return tls_kind == 2;
}

static int sync_context(CUcontext ctx)
{
    CUcontext popped;
    int rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc == 0) {
        rc = CU_CHECK(cd_drv.cuCtxSynchronize());
        cd_drv.cuCtxPopCurrent(&popped);
    }
    return rc;
}

int cd_sync_current_or_active(void)
{
    int rc = cd_driver_ready();
    if (rc != 0)
        return rc < 0 ? CUDA_ERROR_NOT_INITIALIZED : rc;
    CUcontext ctx = NULL;
    if ((rc = CU_CHECK(cd_drv.cuCtxGetCurrent(&ctx))))
        return rc;
    if (ctx)
        return CU_CHECK(cd_drv.cuCtxSynchronize());
    int n = 0;
    rc = CU_CHECK(cd_drv.cuDeviceGetCount(&n));
    for (int i = 0; rc == 0 && i < n; i++) {
        CUdevice dev;
        unsigned flags;
        int active = 0;
        if ((rc = CU_CHECK(cd_drv.cuDeviceGet(&dev, i))) ||
            (rc = CU_CHECK(cd_drv.cuDevicePrimaryCtxGetState(dev, &flags, &active))) || !active)
            continue;
        if ((rc = cd_device_context(i, &ctx)) == 0)
            rc = sync_context(ctx);
    }
    return rc;
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
                  char *holder, size_t holder_len)
{
    *code = 0;
    *token = 0;
    if (holder_len)
        holder[0] = '\0';
    if (kind != CD_SCOPE_WATCH && tls_depth >= MAX_DEPTH) {
        *code = MAX_DEPTH;
        return 3;
    }
    int need_drain = may_drain && ((kind == CD_SCOPE_BLOCK && tls_state <= 0) ||
                                   (kind == CD_SCOPE_WATCH && atomic_load(&cd_state.watching) == 0));
    if (need_drain && (*code = drain()) != 0)
        return 1;
    if (kind != CD_SCOPE_OPT_OUT) {
        pthread_mutex_lock(&cd_state.sub_lock);
        int rc = cd_cupti_acquire(holder, holder_len);
        if (rc) {
            pthread_mutex_unlock(&cd_state.sub_lock);
            /* A dead context makes CUPTI refuse too (NOT_INITIALIZED): say
             * what really happened. */
            int dead = may_drain ? drain() : 0;
            *code = dead ? dead : rc;
            return dead ? 1 : 2;
        }
        if (kind == CD_SCOPE_WATCH)
            atomic_fetch_add(&cd_state.watching, 1);
        else
            atomic_fetch_add(&cd_state.active, 1);
        if (all_threads)
            atomic_fetch_add(&cd_state.all_threads, 1);
        pthread_mutex_unlock(&cd_state.sub_lock);
    }
    if (kind == CD_SCOPE_WATCH)
        cd_watch_prepare();
    *token = atomic_fetch_add(&next_token, 1);
    if (kind != CD_SCOPE_WATCH) {
        tls_stack[tls_depth].token = *token;
        tls_stack[tls_depth].state = kind == CD_SCOPE_BLOCK ? 1 : -1;
        tls_depth++;
        tls_state = kind == CD_SCOPE_BLOCK ? 1 : -1;
    }
    return 0;
}

void cd_scope_close(int kind, int all_threads, uint32_t token)
{
    if (kind != CD_SCOPE_WATCH) {
        for (int i = tls_depth - 1; i >= 0; i--) {
            if (tls_stack[i].token == token) {
                memmove(&tls_stack[i], &tls_stack[i + 1],
                        (size_t)(tls_depth - i - 1) * sizeof tls_stack[0]);
                tls_depth--;
                break;
            }
        }
        tls_state = tls_depth ? tls_stack[tls_depth - 1].state : 0;
    }
    if (kind == CD_SCOPE_OPT_OUT)
        return;
    pthread_mutex_lock(&cd_state.sub_lock);
    if (all_threads && atomic_load(&cd_state.all_threads) > 0)
        atomic_fetch_sub(&cd_state.all_threads, 1);
    atomic_int *count = kind == CD_SCOPE_WATCH ? &cd_state.watching : &cd_state.active;
    if (atomic_load(count) > 0)
        atomic_fetch_sub(count, 1);
    cd_cupti_release();
    pthread_mutex_unlock(&cd_state.sub_lock);
}
