/*
 * fake_callbacks.c: The CUPTI callback registry (fake_cupti.c forwards to it),
 * firing the API and resource callbacks.
 * Part of the fake libcuda.so.1: fake_driver.h says what it emulates.
 */
#include "fake_driver.h"

/* ----------------------------------------------------- CUPTI registry --- */

struct fake_sub sub;
int refuse_resource;
int refuse_capture_memset;
char external_holder[256];
pthread_mutex_t sub_lock = PTHREAD_MUTEX_INITIALIZER;
unsigned char refused[CUPTI_DRIVER_TRACE_CBID_SIZE];
int cupti_fail_when_dead = 1;
static atomic_uint next_correlation = 1;

/* ------------------------------------------------------ CUPTI side ----- */

/* Inside a driver-domain callback at an API's exit (this thread): the one
 * place CUPTI's documentation gives for cuptiFinalize. */
static _Thread_local int tls_at_exit;
/* cuptiFinalize as the real one: CUPTI leaves the process (every
 * subscription gone, no callback from then on); any CUPTI call afterwards
 * initialises it anew (counted by the next subscribe: st_inits). Counted
 * apart: finalizes called outside an API-exit callback (st_finalizes_outside). */
static atomic_int st_finalizes, st_finalizes_outside, st_inits;
static int finalized;                  /* under sub_lock */

static void fire(CUpti_CallbackId cbid, CUpti_CallbackData *cb)
{
    if (!atomic_load(&sub.in_use) || cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE ||
        !atomic_load(&sub.enabled[cbid]))
        return;
    CUpti_CallbackFunc f = atomic_load(&sub.cb);
    if (!f)
        return;
    atomic_fetch_add(&st_callbacks, 1);
    const int was = tls_at_exit;
    tls_at_exit = cb->callbackSite == CUPTI_API_EXIT;
    f(sub.userdata, CUPTI_CB_DOMAIN_DRIVER_API, cbid, cb);
    tls_at_exit = was;
}

/* A resource-domain callback (CUpti_ResourceData; for graph events its
 * resourceDescriptor is a CUpti_GraphData, as the real CUPTI passes it). */
void fire_resource(CUpti_CallbackId cbid, CUpti_GraphData *graph)
{
    if (!atomic_load(&sub.in_use) || cbid >= CUPTI_CBID_RESOURCE_SIZE ||
        !atomic_load(&sub.res_enabled[cbid]))
        return;
    CUpti_CallbackFunc f = atomic_load(&sub.cb);
    if (!f)
        return;
    CUpti_ResourceData rd;
    memset(&rd, 0, sizeof rd);
    rd.context = CTX;
    rd.resourceDescriptor = graph;
    atomic_fetch_add(&st_callbacks, 1);
    f(sub.userdata, CUPTI_CB_DOMAIN_RESOURCE, cbid, &rd);
}

/* One API call seen by CUPTI: enter callback, body, exit callback (which may
 * rewrite the result); returns the (possibly rewritten) result. */

CUresult traced(CUpti_CallbackId cbid, const char *api, const void *params,
                       const char *symbol, body_fn body, void *arg)
{
    CUresult ret = CUDA_SUCCESS;
    uint64_t correlation_data = 0;
    CUpti_CallbackData cb;
    memset(&cb, 0, sizeof cb);
    cb.callbackSite = CUPTI_API_ENTER;
    cb.functionName = api;
    cb.functionParams = params;
    cb.functionReturnValue = &ret;
    cb.symbolName = symbol;
    cb.context = current_ctx() ? current_ctx() : CTX;
    cb.contextUid = atomic_load(&ctx_uid);
    cb.correlationData = &correlation_data;
    cb.correlationId = atomic_fetch_add(&next_correlation, 1);
    fire(cbid, &cb);
    ret = logret(api, body(arg));
    cb.callbackSite = CUPTI_API_EXIT;
    fire(cbid, &cb);
    return ret;
}

CUptiResult fakecuda_cupti_subscribe(CUpti_SubscriberHandle *handle, CUpti_CallbackFunc cb,
                                     void *ud, const char *name, char *old, size_t oldsize)
{
    if (!handle)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&sub_lock);
    const char *holder = external_holder[0] ? external_holder
                         : atomic_load(&sub.in_use) ? sub.name : NULL;
    if (holder) {
        if (old && oldsize) {
            strncpy(old, holder, oldsize - 1);
            old[oldsize - 1] = '\0';
        }
        pthread_mutex_unlock(&sub_lock);
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    }
    if (finalized) {
        finalized = 0;                 /* CUPTI initialised again */
        atomic_fetch_add(&st_inits, 1);
    }
    for (size_t i = 0; i < CUPTI_DRIVER_TRACE_CBID_SIZE; i++)
        atomic_store(&sub.enabled[i], 0);
    for (size_t i = 0; i < CUPTI_CBID_RESOURCE_SIZE; i++)
        atomic_store(&sub.res_enabled[i], 0);
    snprintf(sub.name, sizeof sub.name, "%s", name ? name : "unnamed CUPTI subscriber");
    sub.userdata = ud;
    atomic_store(&sub.cb, cb);
    atomic_store(&sub.in_use, 1);
    *handle = (CUpti_SubscriberHandle)(void *)&sub;
    pthread_mutex_unlock(&sub_lock);
    return CUPTI_SUCCESS;
}

CUptiResult fakecuda_cupti_unsubscribe(CUpti_SubscriberHandle handle)
{
    pthread_mutex_lock(&sub_lock);
    if (handle != (CUpti_SubscriberHandle)(void *)&sub || !atomic_load(&sub.in_use)) {
        pthread_mutex_unlock(&sub_lock);
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    atomic_store(&sub.in_use, 0);
    for (size_t i = 0; i < CUPTI_DRIVER_TRACE_CBID_SIZE; i++)
        atomic_store(&sub.enabled[i], 0);
    for (size_t i = 0; i < CUPTI_CBID_RESOURCE_SIZE; i++)
        atomic_store(&sub.res_enabled[i], 0);
    pthread_mutex_unlock(&sub_lock);
    return CUPTI_SUCCESS;
}


CUptiResult fakecuda_cupti_finalize(void)
{
    pthread_mutex_lock(&sub_lock);
    if (!tls_at_exit)
        atomic_fetch_add(&st_finalizes_outside, 1);
    finalized = 1;
    atomic_store(&sub.in_use, 0);
    for (size_t i = 0; i < CUPTI_DRIVER_TRACE_CBID_SIZE; i++)
        atomic_store(&sub.enabled[i], 0);
    for (size_t i = 0; i < CUPTI_CBID_RESOURCE_SIZE; i++)
        atomic_store(&sub.res_enabled[i], 0);
    atomic_fetch_add(&st_finalizes, 1);
    pthread_mutex_unlock(&sub_lock);
    return CUPTI_SUCCESS;
}

FAKE_EXPORT int fake_cupti_finalizes(void) { return atomic_load(&st_finalizes); }
FAKE_EXPORT int fake_cupti_finalizes_outside_exit(void) { return atomic_load(&st_finalizes_outside); }
FAKE_EXPORT int fake_cupti_inits(void) { return atomic_load(&st_inits); }

CUptiResult fakecuda_cupti_enable(uint32_t enable, CUpti_SubscriberHandle handle,
                                  CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    if (handle != (CUpti_SubscriberHandle)(void *)&sub || !atomic_load(&sub.in_use))
        return CUPTI_ERROR_INVALID_PARAMETER;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
        if (refuse_resource || cbid >= CUPTI_CBID_RESOURCE_SIZE)
            return CUPTI_ERROR_INVALID_PARAMETER;
        atomic_store(&sub.res_enabled[cbid], enable ? 1 : 0);
        return CUPTI_SUCCESS;
    }
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API)
        return CUPTI_SUCCESS;               /* other domains: accepted, never fire */
    if (cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE || refused[cbid])
        return CUPTI_ERROR_INVALID_PARAMETER;
    /* Seen on the H200: entering a scope while a kernel had just faulted made
     * CUPTI refuse with NOT_INITIALIZED. Emulated: a dead context (discovered
     * or not) makes enabling fail. */
    if (cupti_fail_when_dead && current_sticky())
        return CUPTI_ERROR_NOT_INITIALIZED;
    atomic_store(&sub.enabled[cbid], enable ? 1 : 0);
    return CUPTI_SUCCESS;
}

int fakecuda_ctx_valid(CUcontext ctx) { return ctx == CTX; }
unsigned fakecuda_ctx_uid(CUcontext ctx) { return ctx == CTX ? atomic_load(&ctx_uid) : 0; }
