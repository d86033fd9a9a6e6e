/*
 * fake_context.c: cuInit, the device, the primary context (retain, release,
 * reset), the context stack.
 * Part of the fake libcuda.so.1: fake_driver.h says what it emulates.
 */
#include "fake_driver.h"

/* ------------------------------------------------ driver: basics ------- */

/* fake_set_init_result(100): cuInit fails as on a machine with a driver and no
 * GPU; nothing counts as initialised then (fakecuda_initialised). */
static int init_result, initialised;
FAKE_EXPORT void fake_set_init_result(int rc) { init_result = rc; }
int fakecuda_initialised(void) { return initialised; }
CUresult CUDAAPI cuInit(unsigned int flags)
{
    (void)flags;
    if (init_result == 0)
        initialised = 1;
    return (CUresult)init_result;
}

CUresult CUDAAPI cuDriverGetVersion(int *v)
{
    if (!v)
        RET("cuDriverGetVersion", CUDA_ERROR_INVALID_VALUE);
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) { *count = 1; return CUDA_SUCCESS; }

CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal)
{
    if (ordinal != 0)
        RET("cuDeviceGet", CUDA_ERROR_INVALID_DEVICE);
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    if (dev != 0)
        RET("cuDeviceGetName", CUDA_ERROR_INVALID_DEVICE);
    snprintf(name, (size_t)len, "%s", "Fake CUDA Device (cuda_debug tests)");
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    if (dev != 0)
        RET("cuDeviceGetAttribute", CUDA_ERROR_INVALID_DEVICE);
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *pi = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *pi = 60 << 20; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x18; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *pi = 1; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
    if (dev != 0)
        RET("cuDeviceTotalMem", CUDA_ERROR_INVALID_DEVICE);
    *bytes = (size_t)141 << 30;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (dev != 0)
        RET("cuDevicePrimaryCtxRetain", CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&dev_lock);
    primary_retained++;
    pthread_mutex_unlock(&dev_lock);
    *pctx = CTX;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    if (dev != 0)
        RET("cuDevicePrimaryCtxRelease", CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&dev_lock);
    if (primary_retained > 0)
        primary_retained--;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

/* Drop every queued operation and capture, wait for what runs (dev_lock held). */
void drop_all_work(void)
{
    for (fake_stream *s = all_streams; s; s = s->next_all) {
        while (s->running)
            pthread_cond_wait(&dev_cv, &dev_lock);
        while (s->head) {
            op *o = s->head;
            s->head = o->next;
            free(o);
        }
        s->tail = NULL;
        s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
        s->cap_origin = NULL;
        s->cap_head = s->cap_tail = NULL;
    }
    sticky = 0;
    while (pending_head) {
        pending_print *p = pending_head;
        pending_head = p->next;
        free(p);
    }
    pending_tail = &pending_head;
}

/* cudaDeviceReset: the context is destroyed (CUPTI says so first), its work
 * dropped, its pinned allocations freed (unreadable), its registrations forgotten; the
 * next use gets a new context behind the same pointer, with a new id. */
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    if (dev != 0)
        RET("cuDevicePrimaryCtxReset_v2", CUDA_ERROR_INVALID_DEVICE);
    fire_resource(CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING, NULL);
    pthread_mutex_lock(&dev_lock);
    drop_all_work();
    while (host_ranges) {
        host_range *r = host_ranges;
        host_ranges = r->next;
        if (!r->registered)      /* freed: reading it faults (kept inaccessible, never reused) */
            mprotect(r->p, r->n, PROT_NONE);
        free(r);
    }
    atomic_fetch_add(&ctx_uid, 1);
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    if (dev != 0)
        RET("cuDevicePrimaryCtxGetState", CUDA_ERROR_INVALID_DEVICE);
    *flags = 0;
    pthread_mutex_lock(&dev_lock);
    *active = primary_retained > 0;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) { *pctx = current_ctx(); return CUDA_SUCCESS; }

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    if (ctx && ctx != CTX)
        RET("cuCtxSetCurrent", CUDA_ERROR_INVALID_CONTEXT);
    if (tls_ctx_depth)
        tls_ctx_stack[tls_ctx_depth - 1] = ctx;
    else if (ctx)
        tls_ctx_stack[tls_ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
    if (ctx != CTX || tls_ctx_depth >= 32)
        RET("cuCtxPushCurrent", CUDA_ERROR_INVALID_CONTEXT);
    tls_ctx_stack[tls_ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
    if (!tls_ctx_depth)
        RET("cuCtxPopCurrent", CUDA_ERROR_INVALID_CONTEXT);
    CUcontext c = tls_ctx_stack[--tls_ctx_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *dev)
{
    if (!current_ctx())
        RET("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT);
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    if (!ctx)
        ctx = current_ctx();
    if (ctx != CTX)
        RET("cuCtxGetId", CUDA_ERROR_INVALID_CONTEXT);
    *id = atomic_load(&ctx_uid);
    return CUDA_SUCCESS;
}

/* The host's waits are traced (CUPTI's ids for them): the always-on watch
 * puts a marker behind a stream's newest launch at their entry. */
static CUresult ctx_sync_body(void *a)
{
    (void)a;
    if (!current_ctx())
        return CUDA_ERROR_INVALID_CONTEXT;
    atomic_fetch_add(&st_syncs, 1);
    pthread_mutex_lock(&dev_lock);
    for (fake_stream *s = all_streams; s; s = s->next_all)
        drain_locked(s);
    pthread_mutex_unlock(&dev_lock);
    return sync_result();
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
    return traced(CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, "cuCtxSynchronize", NULL, NULL,
                  ctx_sync_body, NULL);
}
