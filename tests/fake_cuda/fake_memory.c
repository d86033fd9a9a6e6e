/*
 * fake_memory.c: Device and pinned host memory, registrations, copies,
 * memsets, cuStreamWriteValue32.
 * Part of the fake libcuda.so.1: fake_driver.h says what it emulates.
 */
#include "fake_driver.h"

/* ------------------------------------------------ driver: memory ------- */

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t size)
{
    ALIVE("cuMemAlloc");
    void *p = calloc(1, size ? size : 1);
    if (!p)
        RET("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
    ALIVE("cuMemFree");
    free((void *)(uintptr_t)dptr);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_b, size_t *total)
{
    ALIVE("cuMemGetInfo");
    *free_b = (size_t)140 << 30;
    *total = (size_t)141 << 30;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)
{
    ALIVE("cuMemcpyHtoD");
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

typedef struct {
    void *dst;
    CUdeviceptr src;
    size_t n;
} copy_arg;

static CUresult dtoh_body(void *a)
{
    copy_arg *c = a;
    atomic_fetch_add(&st_syncs, 1);
    pthread_mutex_lock(&dev_lock);
    drain_locked(&legacy_stream);         /* synchronous copy on the legacy stream */
    pthread_mutex_unlock(&dev_lock);
    CUresult rc = sync_result();
    if (rc)
        return rc;
    memcpy(c->dst, (const void *)(uintptr_t)c->src, c->n);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
    copy_arg c = {dst, src, n};
    return traced(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2", NULL, NULL,
                  dtoh_body, &c);
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n)
{
    ALIVE("cuMemsetD8");
    memset((void *)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream h)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuMemsetD32Async", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuMemsetD32Async");
    op *o = calloc(1, sizeof *o);
    o->kind = OP_MEMSET32;
    o->addr = (volatile uint32_t *)(uintptr_t)dst;
    o->value = v;
    o->count = n;
    pthread_mutex_lock(&dev_lock);
    if (refuse_capture_memset && s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        pthread_mutex_unlock(&dev_lock);
        free(o);
        RET("cuMemsetD32Async", CUDA_ERROR_INVALID_VALUE);
    }
    int captured = capture_append(s, o);
    if (!captured)
        enqueue(s, o);
    pthread_mutex_unlock(&dev_lock);
    return captured < 0 ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    (void)flags;
    ALIVE("cuMemHostAlloc");
    size_t n = size ? size : 1;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        RET("cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY);
    host_range *r = calloc(1, sizeof *r);
    r->p = p;
    r->n = n;
    pthread_mutex_lock(&dev_lock);
    r->next = host_ranges;
    host_ranges = r;
    pthread_mutex_unlock(&dev_lock);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
    (void)flags;
    ALIVE("cuMemHostGetDevicePointer");
    *pdptr = (CUdeviceptr)(uintptr_t)p;   /* UVA: the same address */
    return CUDA_SUCCESS;
}

/* Forget the range starting at p (dev_lock held); returns it, unlinked, or NULL. */
static host_range *unlink_range(const void *p, int registered)
{
    for (host_range **r = &host_ranges; *r; r = &(*r)->next)
        if ((*r)->p == p && (*r)->registered == registered) {
            host_range *found = *r;
            *r = found->next;
            return found;
        }
    return NULL;
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
    ALIVE("cuMemFreeHost");
    pthread_mutex_lock(&dev_lock);
    host_range *r = unlink_range(p, 0);
    pthread_mutex_unlock(&dev_lock);
    if (!r)
        RET("cuMemFreeHost", CUDA_ERROR_INVALID_VALUE);
    munmap(r->p, r->n);
    free(r);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostRegister(void *p, size_t n, unsigned int flags)
{
    (void)flags;
    ALIVE("cuMemHostRegister_v2");
    if (!p || !n)
        RET("cuMemHostRegister_v2", CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&dev_lock);
    for (host_range *r = host_ranges; r; r = r->next)
        if ((char *)p < r->p + r->n && r->p < (char *)p + n) {
            pthread_mutex_unlock(&dev_lock);
            RET("cuMemHostRegister_v2", CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
    host_range *r = calloc(1, sizeof *r);
    r->p = p;
    r->n = n;
    r->registered = 1;
    r->next = host_ranges;
    host_ranges = r;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    pthread_mutex_lock(&dev_lock);
    host_range *r = unlink_range(p, 1);
    pthread_mutex_unlock(&dev_lock);
    if (!r)
        RET("cuMemHostUnregister", CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    free(r);
    return CUDA_SUCCESS;
}

/* Is [a, a+n) inside pinned memory the context knows? (dev_lock held) */
static int host_mapped(uintptr_t a, size_t n)
{
    for (host_range *r = host_ranges; r; r = r->next)
        if (a >= (uintptr_t)r->p && a + n <= (uintptr_t)r->p + r->n)
            return 1;
    return 0;
}

CUresult CUDAAPI cuStreamWriteValue32(CUstream h, CUdeviceptr addr, cuuint32_t value,
                                      unsigned int flags)
{
    (void)flags;
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamWriteValue32_v2", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuStreamWriteValue32_v2");
    op *o = calloc(1, sizeof *o);
    o->kind = OP_WRITE32;
    o->addr = (volatile uint32_t *)(uintptr_t)addr;
    o->value = value;
    pthread_mutex_lock(&dev_lock);
    if (!host_mapped((uintptr_t)addr, sizeof(uint32_t))) {
        /* freed (a reset) or never mapped: the real driver refuses it */
        pthread_mutex_unlock(&dev_lock);
        free(o);
        RET("cuStreamWriteValue32_v2", CUDA_ERROR_INVALID_VALUE);
    }
    int captured = capture_append(s, o);
    if (!captured)
        enqueue(s, o);
    pthread_mutex_unlock(&dev_lock);
    return captured < 0 ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}
