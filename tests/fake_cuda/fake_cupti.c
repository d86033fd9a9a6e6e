/*
 * fake_cupti.c: a fake CUPTI (libcupti.so.13) for CPU-only CI. Linked against
 * the fake libcuda.so.1 (like the real CUPTI needs the driver), which owns the
 * subscriber registry and fires the callbacks from its launch APIs.
 * Only the entry points cuda_debug binds (CD_CUPTI_FUNCS / CD_CUPTI_OPTIONAL).
 */
#define _GNU_SOURCE
#include "fake_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *subscriber,
                                    CUpti_CallbackFunc callback, void *userdata)
{
    return fakecuda_cupti_subscribe(subscriber, callback, userdata, NULL, NULL, 0);
}

CUptiResult CUPTIAPI cuptiSubscribe_v2(CUpti_SubscriberHandle *subscriber,
                                       CUpti_CallbackFunc callback, void *userdata,
                                       CUpti_SubscriberParams *p)
{
    if (p && p->structSize < CUpti_SubscriberParams_STRUCT_SIZE)
        return CUPTI_ERROR_INVALID_PARAMETER;
    return fakecuda_cupti_subscribe(subscriber, callback, userdata,
                                    p ? p->subscriberName : NULL,
                                    p ? p->oldSubscriberName : NULL,
                                    p ? p->oldSubscriberSize : 0);
}

CUptiResult CUPTIAPI cuptiUnsubscribe(CUpti_SubscriberHandle subscriber)
{
    return fakecuda_cupti_unsubscribe(subscriber);
}

/* Detach: every subscriber goes (the real one frees all of CUPTI's state). */
CUptiResult CUPTIAPI cuptiFinalize(void)
{
    return fakecuda_cupti_finalize();
}

CUptiResult CUPTIAPI cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
                                         CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    return fakecuda_cupti_enable(enable, subscriber, domain, cbid);
}

static const struct {
    CUptiResult r;
    const char *s;
} results[] = {
    {CUPTI_SUCCESS, "CUPTI_SUCCESS"},
    {CUPTI_ERROR_INVALID_PARAMETER, "CUPTI_ERROR_INVALID_PARAMETER"},
    {CUPTI_ERROR_INVALID_DEVICE, "CUPTI_ERROR_INVALID_DEVICE"},
    {CUPTI_ERROR_INVALID_CONTEXT, "CUPTI_ERROR_INVALID_CONTEXT"},
    {CUPTI_ERROR_NOT_INITIALIZED, "CUPTI_ERROR_NOT_INITIALIZED"},
    {CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
     "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"},
    {CUPTI_ERROR_NOT_SUPPORTED, "CUPTI_ERROR_NOT_SUPPORTED"},
    {CUPTI_ERROR_UNKNOWN, "CUPTI_ERROR_UNKNOWN"},
};

/* The real CUPTI 13 called before the driver initialised (no GPU, or no
 * cuInit yet) recurses inside cuptiGetVersion/cuptiGetResultString until the
 * stack overflows (seen with the nvidia-cuda-cupti wheel on a machine without
 * a driver): the fake dies as loudly. */
static void need_driver(const char *fn)
{
    if (!fakecuda_initialised()) {
        /* to fd 2, not through `stderr`: the fake CUPTI has no relocation
         * for `stderr` (tests/core/test_robust.py counts them) */
        dprintf(2, "fake CUPTI: %s called before the driver initialised\n", fn);
        abort();
    }
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **str)
{
    need_driver("cuptiGetResultString");
    for (size_t i = 0; i < sizeof results / sizeof results[0]; i++)
        if (results[i].r == result) {
            *str = results[i].s;
            return CUPTI_SUCCESS;
        }
    *str = NULL;
    return CUPTI_ERROR_INVALID_PARAMETER;
}

CUptiResult CUPTIAPI cuptiGetVersion(uint32_t *version)
{
    need_driver("cuptiGetVersion");
    *version = CUPTI_API_VERSION;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetDeviceId(CUcontext context, uint32_t *deviceId)
{
    if (!fakecuda_ctx_valid(context))
        return CUPTI_ERROR_INVALID_CONTEXT;
    *deviceId = 0;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetContextId(CUcontext context, uint32_t *contextId)
{
    if (!contextId)
        return CUPTI_ERROR_INVALID_PARAMETER;
    unsigned id = fakecuda_ctx_uid(context);
    if (!id)
        return CUPTI_ERROR_INVALID_CONTEXT;
    *contextId = id;
    return CUPTI_SUCCESS;
}
