/*
 * base/subscription.c: taking CUPTI and giving it back.
 *
 * One CUPTI subscriber per process: the first scope or watch subscribes
 * (with the callback the layer above hands in) and enables the driver launch
 * ids, then the capture ids, the end-of-capture ids and the resource ids
 * (context destroyed, graph executables; all optional: an older CUPTI lacks
 * some); the last
 * one to close unsubscribes, so profilers can take CUPTI between. A profiler
 * starting while scopes are open is given CUPTI at once (hand-over).
 *
 * Leaving nothing behind: an unsubscribed CUPTI still sits in the driver's
 * API dispatch (a host-bound loop of tiny launches measured 1.06-1.09x after a
 * watch() was left: issue 45), so by default the last scope to close detaches
 * CUPTI from the process (cuptiFinalize, at the next launch's API exit: the
 * place CUPTI's documentation gives for it) and the next entry subscribes
 * again (CUPTI initialises anew). Not when another client has used CUPTI in
 * this process (a profiler: Kineto keeps its CUPTI state between windows and
 * finalizes it itself), nor in a forked child; stats()["cupti_residue"] says
 * why the dispatch stays then (cd_cupti_residue).
 */
#include "base/base.h"

#include <string.h>     /* memset */
#include <time.h>        /* timespec, nanosleep */

#define CD_ID_ENTRY(id, ptsz) id,
static const CUpti_CallbackId launch_cbids[] = {CD_LAUNCH_CBIDS(CD_ID_ENTRY)};
static const CUpti_CallbackId capture_cbids[] = {CD_CAPTURE_CBIDS(CD_ID_ENTRY)};
static const CUpti_CallbackId graph_cbids[] = {CD_GRAPH_CBIDS(CD_ID_ENTRY)};
static const CUpti_CallbackId resource_cbids[] = {CD_RESOURCE_CBIDS(CD_ID_ENTRY)};
static const CUpti_CallbackId wait_cbids[] = {CD_WAIT_CBIDS(CD_ID_ENTRY)};
#define CD_ROUTE_CBID CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz

pthread_mutex_t cd_sub_lock = PTHREAD_MUTEX_INITIALIZER;
/* Under cd_sub_lock (read bare by stats()). */
static CUpti_SubscriberHandle subscriber;
static int waits_enabled;              /* CD_WAIT_CBIDS on (while watching) */
static int inherited;                  /* a forked child: `subscriber` is the parent's */
/* The runtime's launches routed past CUPTI (hooks/runtime_launch.c):
 * cuLaunchKernelEx_ptsz's callback off meanwhile. */
static int route_off;
/* Another client used CUPTI in this process (CD_SHARED_*, the first seen;
 * 0 none): CUPTI is then never finalized by us (a profiler's next window
 * would find its CUPTI state gone), so its dispatch stays armed after the
 * last scope. Set once (under cd_sub_lock), read by stats(). */
static atomic_int cupti_shared;
static struct {
    CD_SUBSCRIPTION_COUNTS(CD_COUNTER_ATOMIC)
    atomic_uint_fast64_t graph_ids_refused;
} counts;

/* Whether `subscriber` is set, for readers without cd_sub_lock (stats(), a
 * scope's entry): written with it, under the lock. */
static atomic_int subscribed_now;

static void set_subscriber(CUpti_SubscriberHandle s)
{
    subscriber = s;
    atomic_store_explicit(&subscribed_now, s != NULL, memory_order_release);
}

int cd_cupti_subscribed(void) { return atomic_load_explicit(&subscribed_now, memory_order_acquire); }
int cd_cupti_inherited(void) { return inherited; }
int cd_cupti_route_off(void) { return route_off; }
void cd_cupti_route_forget(void) { route_off = 0; }

void cd_subscription_stats(cd_subscription_counts *out)
{
    CD_SUBSCRIPTION_COUNTS(CD_COUNTER_READ)
    out->graph_ids_refused = atomic_load(&counts.graph_ids_refused);
}

/* Under cd_sub_lock. */
static int subscribe(CUpti_CallbackFunc callback, char *holder, size_t holder_len)
{
    CUpti_SubscriberHandle sub = NULL;
    int rc;
    if (cd_cupti.cuptiSubscribe_v2) {
        CUpti_SubscriberParams p;
        memset(&p, 0, sizeof p);
        p.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
        p.subscriberName = "cuda_debug";
        p.oldSubscriberName = holder;
        p.oldSubscriberSize = holder_len;
        rc = CUPTI_CHECK(cd_cupti.cuptiSubscribe_v2(&sub, callback, NULL, &p));
    } else {
        rc = CUPTI_CHECK(cd_cupti.cuptiSubscribe(&sub, callback, NULL));
    }
    if (rc)
        return rc;
    for (size_t i = 0; i < CD_N_OF(launch_cbids); i++) {
        if (route_off && launch_cbids[i] == CD_ROUTE_CBID)
            continue;                  /* the launch hooks' route: not dispatched */
        rc = CUPTI_CHECK(cd_cupti.cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API,
                                                      launch_cbids[i]));
        if (rc) {
            cd_cupti.cuptiUnsubscribe(sub);
            return rc;
        }
    }
    /* Without all capture ids the capture-status cache cannot be trusted:
     * the callback then asks every launch. */
    int refused = 0;
    for (size_t i = 0; i < CD_N_OF(capture_cbids); i++)
        if (cd_cupti.cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, capture_cbids[i]))
            refused++;
    cd_gate_capture_cache(refused == 0);
    atomic_store(&counts.capture_ids_refused, (uint_fast64_t)refused);
    /* The end of captures, and resource events: optional. A resource callback
     * is a separate domain: it never runs on the launch path. */
    refused = 0;
    for (size_t i = 0; i < CD_N_OF(graph_cbids); i++)
        if (cd_cupti.cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_DRIVER_API, graph_cbids[i]))
            refused++;
    int unloads_seen = 0;
    for (size_t i = 0; i < CD_N_OF(resource_cbids); i++) {
        if (cd_cupti.cuptiEnableCallback(1, sub, CUPTI_CB_DOMAIN_RESOURCE, resource_cbids[i]))
            refused++;
        else if (resource_cbids[i] == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING)
            unloads_seen = 1;
    }
    cd_intern_kernels_trust_unloads(unloads_seen);
    atomic_store(&counts.graph_ids_refused, (uint_fast64_t)refused);
    waits_enabled = 0;
    set_subscriber(sub);
    cd_gate_subscribed();              /* captures begun meanwhile are unknown */
    return 0;
}

/* Detaching (CUDA_DEBUG_CUPTI_DETACH, on by default): when the last scope
 * closes, the subscription stays until the next launch's API exit, where the
 * callback calls cuptiFinalize (CUPTI's documented place for it; Kineto
 * moved its own teardown there after a cuptiFinalize from elsewhere raced
 * other threads' CUPTI calls): CUPTI is then gone from the process and its
 * API dispatch costs nothing. 0 none, 1 asked for, 2 the callback is
 * detaching (under cd_sub_lock, taken without waiting). A scope that opens
 * while it is asked for takes the subscription back (1 -> 0); one that opens
 * while the callback detaches waits for cd_sub_lock. */
static atomic_int detach_state;
/* Written by the detaching callback, read by stats(): atomics. */
static atomic_int detached;            /* the last one gave CUPTI up by cuptiFinalize */
static atomic_int finalize_failed;     /* cuptiFinalize refused (unsubscribed instead) */

void cd_subscription_fork(int op)
{
    cd_fork_lock(&cd_sub_lock, op);
    if (op != CD_FORK_CHILD)
        return;
    atomic_store(&detach_state, 0);        /* never a cuptiFinalize into the parent's CUPTI */
    if (subscriber)
        inherited = 1;
    route_off = 0;                         /* the child's launches go the runtime's way */
}

int cd_cupti_detach_asked(void) { return atomic_load_explicit(&detach_state, memory_order_relaxed) == 1; }

/* In the callback (a launch's API exit): under cd_sub_lock, taken without
 * waiting (a scope opening or closing on another thread holds it: a later
 * launch detaches), so that the subscription changes only under it. */
void cd_cupti_detach_now(void)
{
    if (pthread_mutex_trylock(&cd_sub_lock) != 0)
        return;
    int expect = 1;
    if (!atomic_compare_exchange_strong(&detach_state, &expect, 2) || !subscriber) {
        if (expect == 1)
            atomic_store(&detach_state, 0);
        pthread_mutex_unlock(&cd_sub_lock);
        return;
    }
    if (cd_cupti.cuptiFinalize && CUPTI_CHECK(cd_cupti.cuptiFinalize()) == 0) {
        atomic_fetch_add(&counts.detaches, 1);
        atomic_store(&detached, 1);
    } else if (subscriber) {
        CUPTI_CHECK(cd_cupti.cuptiUnsubscribe(subscriber));
        atomic_store(&finalize_failed, 1);
    }
    set_subscriber(NULL);
    waits_enabled = 0;
    atomic_store(&detach_state, 0);
    pthread_mutex_unlock(&cd_sub_lock);
}

/* Under cd_sub_lock: a detach asked for is taken back (1: the subscription is
 * still ours), or waited for (0: it is gone). */
static int detach_taken_back(void)
{
    int expect = 1;
    if (atomic_compare_exchange_strong(&detach_state, &expect, 0))
        return 1;
    for (int i = 0; i < 100000 && atomic_load(&detach_state) == 2; i++) {
        struct timespec ts = {0, 10000};
        nanosleep(&ts, NULL);          /* cuptiFinalize on another thread: ~ms */
    }
    return subscriber != NULL;
}

int cd_cupti_acquire(CUpti_CallbackFunc callback, int *fresh, char *holder, size_t holder_len)
{
    if (holder_len)
        holder[0] = '\0';
    *fresh = 0;
    if (subscriber && detach_taken_back())
        return 0;
    int rc = subscribe(callback, holder, holder_len);
    *fresh = rc == 0;
    if (rc == 0)
        atomic_store(&detached, 0);
    else if (rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        cd_cupti_shared(CD_SHARED_HELD);
    return rc;
}

void cd_cupti_shared(int why)
{
    int none = CD_SHARED_NONE;
    atomic_compare_exchange_strong(&cupti_shared, &none, why);
}

int cd_cupti_residue(void)
{
    if (atomic_load(&cd_gates.watching) || atomic_load(&cd_gates.active))
        return CD_RESIDUE_NONE;        /* a scope is open: CUPTI is in use, not left behind */
    if (inherited)
        return CD_RESIDUE_INHERITED;
    if (atomic_load(&detach_state))
        return CD_RESIDUE_PENDING;
    const int shared = atomic_load(&cupti_shared);
    if (shared == CD_SHARED_PROFILER)
        return CD_RESIDUE_PROFILER;
    if (shared == CD_SHARED_HELD)
        return CD_RESIDUE_HELD;
    if (atomic_load(&detached) || atomic_load(&cd_gates.subscriptions) == 0)
        return CD_RESIDUE_NONE;
    if (!cd_config.detach)
        return CD_RESIDUE_OFF;
    if (!cd_cupti.cuptiFinalize)
        return CD_RESIDUE_NO_FINALIZE;
    return atomic_load(&finalize_failed) ? CD_RESIDUE_FAILED : CD_RESIDUE_NONE;
}

void cd_cupti_watch_waits(int on)
{
    if (!subscriber || waits_enabled == on)
        return;
    int refused = 0;
    for (size_t i = 0; i < CD_N_OF(wait_cbids); i++)
        if (cd_cupti.cuptiEnableCallback((uint32_t)on, subscriber,
                                         CUPTI_CB_DOMAIN_DRIVER_API, wait_cbids[i]))
            refused++;
    if (on)
        atomic_store(&counts.wait_ids_refused, (uint_fast64_t)refused);
    waits_enabled = on;
}

int cd_cupti_route(int off)
{
    int rc = 0;
    if (subscriber)                    /* else the next subscription reads route_off */
        rc = CUPTI_CHECK(cd_cupti.cuptiEnableCallback(off ? 0 : 1, subscriber,
                                                      CUPTI_CB_DOMAIN_DRIVER_API, CD_ROUTE_CBID));
    if (!off || !rc)
        route_off = off;
    return rc;
}

/* A profiler finalizes CUPTI when it ends (Kineto: cuptiUnsubscribe, then
 * cuptiFinalize): a thread still inside our callback then (a launch_blocking()
 * thread waiting for its kernel) would return into a CUPTI that is gone. The
 * callback counts its long stays (cd_gates.in_callback); they are waited for
 * here, up to 5 s (a kernel that hangs keeps its thread inside: the profiler
 * is not kept waiting for good). */
static int drain_callbacks(void)
{
    for (int i = 0; i < 5000 && atomic_load(&cd_gates.in_callback) > 0; i++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return atomic_load(&cd_gates.in_callback) == 0;
}

int cd_cupti_hand_over_locked(void)
{
    int had = subscriber != NULL && !inherited && detach_taken_back();
    if (had) {
        if (!drain_callbacks())
            atomic_fetch_add(&counts.hand_overs_busy, 1);
        CUPTI_CHECK(cd_cupti.cuptiUnsubscribe(subscriber));
        set_subscriber(NULL);
        waits_enabled = 0;
        atomic_fetch_add(&counts.hand_overs, 1);
    }
    return had;
}

void cd_cupti_release(void)
{
    /* A forked child keeps the subscription it inherited: CUPTI and the
     * driver are the parent's copies there (CUDA does not survive a fork). */
    if (subscriber && !inherited && atomic_load(&cd_gates.active) == 0 &&
        atomic_load(&cd_gates.watching) == 0) {
        if (cd_config.detach && cd_cupti.cuptiFinalize && !atomic_load(&cupti_shared)) {
            atomic_store(&detach_state, 1);    /* the next launch's callback detaches */
            return;
        }
        CUPTI_CHECK(cd_cupti.cuptiUnsubscribe(subscriber));
        set_subscriber(NULL);
        waits_enabled = 0;
    }
}
