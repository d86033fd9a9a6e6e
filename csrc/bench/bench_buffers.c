/*
 * bench_buffers.c: the benchmark's per-device state and buffers: the timed
 * stream, the L2-flush buffer, random operands, events, and the sample
 * arrays handed to NumPy without a copy.
 *
 *   _core.gemm_types()          (("fp32", 4), ("fp16", 2), ("bf16", 2)): storage
 *                               codes (position) and element sizes
 *   _core.bench_release(device) free the cached operands / flush buffer
 *   _core.mem_info(device)      (CUresult, free bytes, total bytes)
 *
 * This is the one translation unit that defines NumPy's API table
 * (PY_ARRAY_UNIQUE_SYMBOL cd_ARRAY_API); the other bench files include it
 * with NO_IMPORT_ARRAY (bench.h does that).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#define BENCH_DEFINE_ARRAY_API
#include "bench/bench.h"

#include <stdlib.h>     /* malloc, free, calloc */
#include <time.h>        /* timespec, clock_gettime, CLOCK_MONOTONIC */

#define BENCH_FILL_TILE (1u << 20)        /* random host tile, elements */

#define BENCH_ST_TYPE(name, type, bytes) type,
#define BENCH_ST_BYTES(name, type, bytes) bytes,
#define BENCH_ST_NAME(name, type, bytes) #name,
const cudaDataType bench_storage_type[ST_COUNT] = {BENCH_STORAGE_TYPES(BENCH_ST_TYPE)};
const size_t bench_storage_bytes[ST_COUNT] = {BENCH_STORAGE_TYPES(BENCH_ST_BYTES)};
static const char *const storage_name[ST_COUNT] = {BENCH_STORAGE_TYPES(BENCH_ST_NAME)};

pthread_mutex_t bench_lock = PTHREAD_MUTEX_INITIALIZER;
bench_dev bench_devs[BENCH_MAX_DEVICES];
static int devs_init;

void cd_bench_fork(int op)
{
    cd_fork_lock(&bench_lock, op);
}

void bench_devs_init_once(void)
{
    if (devs_init)
        return;
    for (int i = 0; i < BENCH_MAX_DEVICES; i++)
        bench_devs[i].storage = -1;
    devs_init = 1;
}

double bench_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

int bench_ensure_stream(bench_dev *d)
{
    if (d->stream)
        return 0;
    return CU_CHECK(cd_drv.cuStreamCreate(&d->stream, CU_STREAM_NON_BLOCKING));
}

int bench_ensure_flush(bench_dev *d, size_t bytes)
{
    int rc;
    if (bytes <= d->flush_bytes)
        return 0;
    if (d->flush) {
        if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
            return rc;
        CU_CHECK(cd_drv.cuMemFree(d->flush));
        d->flush = 0;
        d->flush_bytes = 0;
    }
    if ((rc = CU_CHECK(cd_drv.cuMemAlloc(&d->flush, bytes))))
        return rc;
    d->flush_bytes = bytes;
    return 0;
}

static void free_operands(bench_dev *d)
{
    if (d->a) CU_CHECK(cd_drv.cuMemFree(d->a));
    if (d->b) CU_CHECK(cd_drv.cuMemFree(d->b));
    if (d->c) CU_CHECK(cd_drv.cuMemFree(d->c));
    d->a = d->b = d->c = 0;
    d->a_bytes = d->b_bytes = d->c_bytes = 0;
    d->storage = -1;
}

/* splitmix64 */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Random values built from bits: random sign, random mantissa, magnitude in
 * [2^-7, 1) (exponent uniform over 7 binades). No zeros, no denormals, no
 * overflow in the products or their sums at any k cuBLAS accepts. */
static void fill_tile(void *buf, size_t count, int storage, uint64_t *state)
{
    if (storage == ST_fp32) {
        uint32_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            uint64_t r = rng_next(state);
            uint32_t sign = (uint32_t)(r >> 63) << 31;
            uint32_t exp = (uint32_t)(120 + (r >> 32) % 7) << 23;
            p[i] = sign | exp | (uint32_t)(r & 0x7FFFFFu);
        }
    } else {
        uint16_t *p = buf;
        for (size_t i = 0; i < count; i++) {
            uint64_t r = rng_next(state);
            uint16_t sign = (uint16_t)((r >> 63) << 15);
            uint16_t v;
            if (storage == ST_fp16)   /* exponent field 8..14: 2^-7 .. 2^-1 */
                v = (uint16_t)(((8 + (r >> 32) % 7) << 10) | (r & 0x3FFu));
            else                      /* bf16: exponent field 120..126 */
                v = (uint16_t)(((120 + (r >> 32) % 7) << 7) | (r & 0x7Fu));
            p[i] = sign | v;
        }
    }
}

/* Fill `bytes` of device memory by repeating a random host tile. */
static int fill_random(CUdeviceptr dst, size_t bytes, int storage, uint64_t seed, void *tile,
                       size_t tile_bytes)
{
    int rc;
    uint64_t state = seed;
    fill_tile(tile, tile_bytes / bench_storage_bytes[storage], storage, &state);
    for (size_t off = 0; off < bytes; off += tile_bytes) {
        size_t len = bytes - off < tile_bytes ? bytes - off : tile_bytes;
        if ((rc = CU_CHECK(cd_drv.cuMemcpyHtoD(dst + off, tile, len))))
            return rc;
    }
    return 0;
}

/* Whether the problem fits is Python's question (bench/_config.py
 * check_memory, before any GPU work); here a failed cuMemAlloc is just its
 * CUresult. */
int bench_ensure_operands(bench_dev *d, int storage, int m, int n, int k,
                          unsigned long long seed, int *host_oom)
{
    int rc;
    size_t elt = bench_storage_bytes[storage];
    if (d->storage == storage && d->m == m && d->n == n && d->k == k && d->seed == seed)
        return 0;
    if (d->storage >= 0 || d->a || d->b || d->c) {
        if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
            return rc;
        free_operands(d);
    }
    size_t a = (size_t)m * k * elt, b = (size_t)k * n * elt, c = (size_t)m * n * elt;
    if ((rc = CU_CHECK(cd_drv.cuMemAlloc(&d->a, a))) ||
        (rc = CU_CHECK(cd_drv.cuMemAlloc(&d->b, b))) ||
        (rc = CU_CHECK(cd_drv.cuMemAlloc(&d->c, c)))) {
        free_operands(d);
        return rc;
    }
    d->a_bytes = a;
    d->b_bytes = b;
    d->c_bytes = c;
    size_t tile_bytes = (size_t)BENCH_FILL_TILE * elt;
    void *tile = malloc(tile_bytes);
    if (!tile) {
        free_operands(d);
        *host_oom = 1;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* different seeds for A and B; the copies are on the legacy stream and
     * may still be in flight: the context sync orders them before our
     * non-blocking stream's work */
    if ((rc = fill_random(d->a, a, storage, seed * 2 + 1, tile, tile_bytes)) ||
        (rc = fill_random(d->b, b, storage, seed * 2 + 2, tile, tile_bytes)) ||
        (rc = CU_CHECK(cd_drv.cuMemsetD8(d->c, 0, c))) ||
        (rc = CU_CHECK(cd_drv.cuCtxSynchronize()))) {
        free(tile);
        free_operands(d);
        return rc;
    }
    free(tile);
    d->storage = storage;
    d->m = m;
    d->n = n;
    d->k = k;
    d->seed = seed;
    return 0;
}

void bench_destroy_events(CUevent *ev, int n)
{
    if (!ev)
        return;
    for (int i = 0; i < n; i++)
        if (ev[i])
            cd_drv.cuEventDestroy(ev[i]);
    free(ev);
}

int bench_create_events(CUevent **out, int n)
{
    int rc;
    CUevent *ev = calloc((size_t)(n > 0 ? n : 1), sizeof *ev);
    if (!ev)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++)
        if ((rc = CU_CHECK(cd_drv.cuEventCreate(&ev[i], CU_EVENT_DEFAULT)))) {
            bench_destroy_events(ev, n);
            return rc;
        }
    *out = ev;
    return 0;
}

int bench_context(int device, CUcontext *ctx)
{
    if (!cd_libs[CD_LIB_CUDA].handle)
        return CUDA_ERROR_NOT_INITIALIZED;
    return cd_device_context(device, ctx);
}

int bench_numpy_ready(void)
{
    if (PyArray_API)
        return 0;
    return _import_array();
}

static void free_samples(PyObject *capsule)
{
    free(PyCapsule_GetPointer(capsule, "cuda_debug.bench.samples"));
}

PyObject *bench_samples(double *buf, Py_ssize_t n)
{
    if (!buf) {                        /* n == 0 and nothing allocated */
        buf = malloc(sizeof(double));
        if (!buf)
            return PyErr_NoMemory();
        n = 0;
    }
    PyObject *cap = PyCapsule_New(buf, "cuda_debug.bench.samples", free_samples);
    if (!cap) {
        free(buf);
        return NULL;
    }
    npy_intp dims[1] = {n};
    PyObject *arr = PyArray_SimpleNewFromData(1, dims, NPY_FLOAT64, buf);
    if (!arr) {
        Py_DECREF(cap);                /* frees buf */
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)arr, cap) < 0) {   /* steals cap */
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

int bench_keywords_only(const char *fn, PyObject *args)
{
    if (args && PyTuple_GET_SIZE(args) != 0) {
        PyErr_Format(PyExc_TypeError, "%s() takes keyword arguments only, all required", fn);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------ Python-facing functions -- */

/* _core.gemm_types() -> ((name, element bytes), ...) by storage code */
PyObject *cd_py_gemm_types(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *t = PyTuple_New(ST_COUNT);
    if (!t)
        return NULL;
    for (int i = 0; i < ST_COUNT; i++) {
        PyObject *item = Py_BuildValue("(sn)", storage_name[i],
                                       (Py_ssize_t)bench_storage_bytes[i]);
        if (!item) {
            Py_DECREF(t);
            return NULL;
        }
        PyTuple_SET_ITEM(t, i, item);
    }
    return t;
}

/* The device number `arg`: 0; 1 when it is none of ours; -1 with the
 * exception set. */
static int device_arg(PyObject *arg, long *device)
{
    *device = PyLong_AsLong(arg);
    if (*device == -1 && PyErr_Occurred())
        return -1;
    return *device < 0 || *device >= BENCH_MAX_DEVICES;
}

/* _core.bench_release(device) -> CUresult: free the cached operands and the
 * flush buffer of `device` (the handles, stream and workspace stay). */
PyObject *cd_py_bench_release(PyObject *self, PyObject *arg)
{
    (void)self;
    long device;
    int bad = device_arg(arg, &device);
    if (bad)
        return bad < 0 ? NULL : PyLong_FromLong(CUDA_ERROR_INVALID_DEVICE);
    CUcontext ctx = NULL, popped;
    int rc = bench_context((int)device, &ctx);
    if (rc)
        return PyLong_FromLong(rc);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&bench_lock);
    bench_devs_init_once();
    bench_dev *d = &bench_devs[device];
    rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc == 0) {
        if (d->stream)
            rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream));
        if (rc == 0) {
            free_operands(d);
            if (d->flush)
                CU_CHECK(cd_drv.cuMemFree(d->flush));
            d->flush = 0;
            d->flush_bytes = 0;
        }
        cd_drv.cuCtxPopCurrent(&popped);
    }
    pthread_mutex_unlock(&bench_lock);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* _core.mem_info(device) -> (CUresult, free_bytes, total_bytes) */
PyObject *cd_py_mem_info(PyObject *self, PyObject *arg)
{
    (void)self;
    long device;
    int bad = device_arg(arg, &device);
    if (bad)
        return bad < 0 ? NULL : Py_BuildValue("(ikk)", CUDA_ERROR_INVALID_DEVICE, 0ul, 0ul);
    CUcontext ctx = NULL, popped;
    size_t free_b = 0, total_b = 0;
    int rc = bench_context((int)device, &ctx);
    if (rc == 0)
        rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc == 0) {
        rc = CU_CHECK(cd_drv.cuMemGetInfo(&free_b, &total_b));
        cd_drv.cuCtxPopCurrent(&popped);
    }
    return Py_BuildValue("(iKK)", rc, (unsigned long long)free_b, (unsigned long long)total_b);
}
