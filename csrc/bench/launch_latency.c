/*
 * bench/launch_latency.c: empty-kernel launch timing loops behind
 * cuda_debug.bench.launch_latency (the per-launch price behind the GEMM
 * slowdowns).
 *
 *   _core.launch_latency(**every keyword required)   -> raw samples
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "bench/bench.h"

/* For CD_KERNEL_EMPTY only: the PTX text itself lives in testing/fault_kernels.c. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-const-variable"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include "testing/fault_kernels_ptx.h"   /* CD_KERNEL_EMPTY */
#pragma GCC diagnostic pop

#include <stdlib.h>     /* calloc, free */
#include <string.h>      /* memset */

typedef struct {
    int device, sync_each, samples, repeats, loop_n;
    double warmup_ms;
    CUfunction fn;
    double *call_us, *loop_us;
} latency_job;

static int launch_empty(const latency_job *j, CUstream s)
{
    return CU_CHECK(cd_drv.cuLaunchKernel(j->fn, 1, 1, 1, 1, 1, 1, 0, s, NULL, NULL));
}

static int latency_body(latency_job *j)
{
    int rc;
    bench_dev *d = &bench_devs[j->device];
    if ((rc = bench_ensure_stream(d)))
        return rc;
    CUstream s = d->stream;
    double start = bench_now_ms();
    int done = 0;
    while (bench_now_ms() - start < j->warmup_ms || done < 100) {
        for (int i = 0; i < 100; i++)
            if ((rc = launch_empty(j, s)))
                return rc;
        if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
            return rc;
        done += 100;
    }
    for (int i = 0; i < j->samples; i++) {
        double t0 = bench_now_ms();
        if ((rc = launch_empty(j, s)))
            return rc;
        if (j->sync_each && (rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
            return rc;
        j->call_us[i] = (bench_now_ms() - t0) * 1e3;
        /* async: keep the queue from filling up, off the clock */
        if (!j->sync_each && (i % 256) == 255 && (rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
            return rc;
    }
    if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
        return rc;
    for (int r = 0; r < j->repeats; r++) {
        double t0 = bench_now_ms();
        for (int i = 0; i < j->loop_n; i++) {
            if ((rc = launch_empty(j, s)))
                return rc;
            if (j->sync_each && (rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
                return rc;
        }
        if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
            return rc;
        j->loop_us[r] = (bench_now_ms() - t0) * 1e3 / j->loop_n;
    }
    return 0;
}

/*
 * _core.launch_latency(*, device, sync_each, samples, repeats, loop_n,
 *                      warmup_s)           every keyword required
 * Empty kernel (1 block of 1 thread) on the benchmark's non-blocking stream.
 * Returns (0, None, call_us[samples], loop_us[repeats]): host microseconds of
 * each launch (+ its stream sync when sync_each), and wall microseconds per
 * launch of loops of loop_n launches with one sync at the end (arrays that own
 * the C buffers); or, on failure, (CUresult, "cuda").
 */
PyObject *cd_py_launch_latency(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"device", "sync_each", "samples", "repeats", "loop_n", "warmup_s",
                             NULL};
    latency_job j;
    memset(&j, 0, sizeof j);
    double warmup_s;
    if (bench_keywords_only("launch_latency", args) < 0)
        return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "ipiiid", kwlist, &j.device, &j.sync_each,
                                     &j.samples, &j.repeats, &j.loop_n, &warmup_s))
        return NULL;
    if (j.samples < 1 || j.samples > BENCH_MAX_SAMPLES || j.repeats < 1 ||
        j.repeats > BENCH_MAX_SAMPLES || j.loop_n < 1 || j.loop_n > BENCH_MAX_LOOP_N ||
        !(warmup_s >= 0) || j.device < 0 || j.device >= BENCH_MAX_DEVICES) {
        PyErr_SetString(PyExc_ValueError, "launch_latency: argument out of range");
        return NULL;
    }
    j.warmup_ms = warmup_s * 1e3;
    if (bench_numpy_ready() < 0)
        return NULL;
    CUcontext ctx = NULL, popped;
    int rc = bench_context(j.device, &ctx);
    if (rc == 0)
        rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc)
        return Py_BuildValue("(is)", rc, "cuda");
    /* the module of embedded kernels is loaded under the GIL */
    rc = cd_fault_kernel(j.device, CD_KERNEL_EMPTY, &j.fn);
    if (rc) {
        cd_drv.cuCtxPopCurrent(&popped);
        return Py_BuildValue("(is)", rc, "cuda");
    }
    j.call_us = calloc((size_t)j.samples, sizeof(double));
    j.loop_us = calloc((size_t)j.repeats, sizeof(double));
    if (!j.call_us || !j.loop_us) {
        cd_drv.cuCtxPopCurrent(&popped);
        free(j.call_us);
        free(j.loop_us);
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&bench_lock);
    bench_devs_init_once();
    rc = latency_body(&j);
    if (rc)
        cd_drv.cuStreamSynchronize(bench_devs[j.device].stream);
    pthread_mutex_unlock(&bench_lock);
    cd_drv.cuCtxPopCurrent(&popped);
    Py_END_ALLOW_THREADS
    if (rc) {
        free(j.call_us);
        free(j.loop_us);
        return Py_BuildValue("(is)", rc, "cuda");
    }
    PyObject *r = NULL;
    PyObject *c = bench_samples(j.call_us, j.samples), *l = bench_samples(j.loop_us, j.repeats);
    if (c && l)
        r = Py_BuildValue("(iOOO)", 0, Py_None, c, l);
    Py_XDECREF(c);
    Py_XDECREF(l);
    return r;
}
