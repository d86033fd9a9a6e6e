/*
 * fake_events.c: Events.
 * Part of the fake libcuda.so.1: fake_driver.h says what it emulates.
 */
#include "fake_driver.h"

/* ------------------------------------------------ driver: events ------- */

CUresult CUDAAPI cuEventCreate(CUevent *ph, unsigned int flags)
{
    (void)flags;
    ALIVE("cuEventCreate");
    fake_event *e = calloc(1, sizeof *e);
    e->magic = MAGIC_EVENT;
    *ph = (CUevent)(void *)e;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent h) { (void)h; return CUDA_SUCCESS; }

CUresult CUDAAPI cuEventRecord(CUevent h, CUstream hs)
{
    fake_event *e = (fake_event *)h;
    fake_stream *s = resolve(hs);
    if (!e || e->magic != MAGIC_EVENT || !s)
        RET("cuEventRecord", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuEventRecord");
    op *o = calloc(1, sizeof *o);
    o->kind = OP_EVENT;
    o->ev = e;
    pthread_mutex_lock(&dev_lock);
    if (s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        e->cap_origin = s->cap_origin;      /* a join point of the capture, not run */
        free(o);
    } else {
        e->cap_origin = NULL;
        e->stream = s;
        e->done = 0;
        enqueue(s, o);
    }
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent h)
{
    fake_event *e = (fake_event *)h;
    if (!e || e->magic != MAGIC_EVENT)
        RET("cuEventQuery", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuEventQuery");
    pthread_mutex_lock(&dev_lock);
    int done = e->done || !e->stream;
    pthread_mutex_unlock(&dev_lock);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult event_sync_body(void *a)
{
    fake_event *e = a;
    atomic_fetch_add(&st_syncs, 1);
    pthread_mutex_lock(&dev_lock);
    if (e->stream)
        drain_locked(e->stream);
    pthread_mutex_unlock(&dev_lock);
    return sync_result();
}

CUresult CUDAAPI cuEventSynchronize(CUevent h)
{
    fake_event *e = (fake_event *)h;
    if (!e || e->magic != MAGIC_EVENT)
        RET("cuEventSynchronize", CUDA_ERROR_INVALID_HANDLE);
    return traced(CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize, "cuEventSynchronize", NULL, NULL,
                  event_sync_body, e);
}

CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    fake_event *s = (fake_event *)a, *e = (fake_event *)b;
    if (!s || !e || s->magic != MAGIC_EVENT || e->magic != MAGIC_EVENT)
        RET("cuEventElapsedTime_v2", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuEventElapsedTime_v2");
    if (!s->done || !e->done)
        RET("cuEventElapsedTime_v2", CUDA_ERROR_NOT_READY);
    *ms = (float)(e->t_ms - s->t_ms);
    return CUDA_SUCCESS;
}
