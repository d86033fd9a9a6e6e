/*
 * hooks/thread_state.c: per-thread scope stacks, read by the launch callback.
 *
 * Per thread, a small stack of open scopes (token, state); the thread's state
 * is its most recently opened scope still open (+1 block, -1 opted out, 0
 * none). A scope closes by its token, wherever it is in the stack, so that
 * asyncio tasks interleaving scopes on one thread never leave a thread
 * unblocked while one of them is still inside a scope (they may block each
 * other's launches meanwhile: over-blocking, never under-blocking).
 * watch() is process-wide and leaves the thread stacks alone.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "hooks/hooks.h"

#include <string.h>     /* strncmp, memmove */
#include <sys/prctl.h>   /* prctl, PR_GET_NAME */

static _Thread_local struct {
    uint32_t token;
    signed char state;
} tls_stack[CD_MAX_SCOPE_DEPTH];
static _Thread_local int tls_depth;
static _Thread_local signed char tls_state;   /* tls_stack's top state, cached */
/* Per-thread kind, computed once: 0 unknown, 1 plain, 2 follower. A follower
 * is a framework worker that launches on behalf of a scoped thread: PyTorch's
 * autograd device threads ("pt_autograd_N") run backward kernels, so
 * loss.backward() inside a scope must block there too. */
static _Thread_local signed char tls_kind;

int cd_thread_state(void) { return tls_state; }

int cd_thread_depth(void) { return tls_depth; }

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
    if (atomic_load_explicit(&cd_gates.all_threads, memory_order_relaxed))
        return 1;
    if (!atomic_load_explicit(&cd_gates.active, memory_order_relaxed))
        return 0;
    if (!tls_kind)
        tls_kind = (signed char)classify_thread();
    return tls_kind == 2;
}

int cd_thread_push(uint32_t token, int state)
{
    if (tls_depth >= CD_MAX_SCOPE_DEPTH)
        return -1;
    tls_stack[tls_depth].token = token;
    tls_stack[tls_depth].state = (signed char)state;
    tls_depth++;
    tls_state = (signed char)state;
    return 0;
}

void cd_thread_pop(uint32_t token)
{
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

/* The forking thread's scopes are the parent's: the child's thread has none
 * (closing them later in the child pops nothing). */
void cd_thread_fork(int op)
{
    if (op == CD_FORK_CHILD) {
        tls_depth = 0;
        tls_state = 0;
    }
}
