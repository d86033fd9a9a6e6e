/*
 * gemm_bench.c: the timing loops behind cuda_debug.bench, and the NumPy
 * structured arrays their results are returned in.
 *
 *   _core.gemm(...)            cuBLAS GEMM (cublasGemmEx or cublasLtMatmul)
 *   _core.launch_latency(...)  empty-kernel launches (the embedded PTX kernel)
 *   _core.bench_records(kind, rows)   rows -> NumPy structured array
 *   _core.bench_release(device)       free the cached operands / flush buffer
 *   _core.mem_info(device)            (CUresult, free bytes, total bytes)
 *
 * Policy (which sizes, how many samples, what the columns mean, which flags
 * map to what) lives in cuda_debug/bench.py; this file runs what it is told
 * and returns raw numbers: per-sample milliseconds as float64 arrays.
 *
 * Row-major semantics, like torch.matmul: C (m x n) = A (m x k) @ B (k x n),
 * all contiguous. cuBLAS is column-major, so we compute C^T = B^T A^T: the same
 * call (transa = transb = N, "m" = n, "n" = m) PyTorch makes for contiguous
 * tensors, so the same kernels run.
 *
 * Two timed passes per call, after a warm-up by time:
 *   samples  one GEMM at a time: [L2 flush memset] event, GEMM, event,
 *            [stream sync when sync_each]; gives the CUDA-event time of each
 *            GEMM and the host time of each call (+ its sync).
 *   loops    `repeats` loops of `loop_n` back-to-back GEMMs ([sync after each
 *            when sync_each]) and one stream sync at the end; gives wall time
 *            per GEMM (what torch.matmul users see) and event time per GEMM.
 * Under cuda_debug.launch_blocking() (CUPTI hook) or CUDA_LAUNCH_BLOCKING=1
 * the same loops run unchanged: the launches themselves become blocking.
 *
 * NumPy's C API is imported lazily (first call of a function here that makes
 * arrays), so `import cuda_debug` never needs it. This is the one translation
 * unit that defines the API table (PY_ARRAY_UNIQUE_SYMBOL cd_ARRAY_API); any
 * other file that uses NumPy must define NO_IMPORT_ARRAY before including it.
 */
#define _GNU_SOURCE
#include "cuda_debug.h"

#define PY_ARRAY_UNIQUE_SYMBOL cd_ARRAY_API
#include <numpy/arrayobject.h>

#include <cublas_api.h>
#include <cublasLt.h>

/* For CD_KERNEL_EMPTY only: the PTX text itself lives in fault_kernels.c. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-const-variable"
#pragma GCC diagnostic ignored "-Wunused-variable"
#include "fault_kernels_ptx.h"
#pragma GCC diagnostic pop

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BENCH_MAX_DEVICES 64
#define BENCH_MAX_SAMPLES 1000000
#define BENCH_MAX_LOOP_N 1000000
#define BENCH_LT_MAX_ALGOS 16
#define BENCH_FILL_TILE (1u << 20)        /* random host tile, elements */
#define BENCH_MEM_MARGIN ((size_t)64 << 20)

/* ------------------------------------------------------------- cuBLAS -- */

#define CD_CUBLAS_FUNCS(X)                                                      \
    X(cublasCreate_v2) X(cublasDestroy_v2) X(cublasSetStream_v2)                \
    X(cublasSetWorkspace_v2) X(cublasSetMathMode) X(cublasGemmEx)               \
    X(cublasGetProperty)

#define CD_CUBLASLT_FUNCS(X)                                                    \
    X(cublasLtCreate) X(cublasLtMatmulDescCreate) X(cublasLtMatmulDescDestroy)  \
    X(cublasLtMatrixLayoutCreate) X(cublasLtMatrixLayoutDestroy)                \
    X(cublasLtMatmulPreferenceCreate) X(cublasLtMatmulPreferenceDestroy)        \
    X(cublasLtMatmulPreferenceSetAttribute) X(cublasLtMatmulAlgoGetHeuristic)   \
    X(cublasLtMatmul)

/* Bound once from the loaded libcublas (cd_sym searches its dependencies,
 * so the cuBLASLt entry points come from the libcublasLt it pulled in).
 * Written with the GIL held, before any timing call; read-only afterwards. */
static struct {
    CD_CUBLAS_FUNCS(CD_DECLARE_PTR)
    CD_CUBLASLT_FUNCS(CD_DECLARE_PTR)
    int bound;       /* 1: cuBLAS entry points present */
    int lt_bound;    /* 1: cuBLASLt entry points present */
    int version;     /* major*10000 + minor*100 + patch, 0 unknown */
} blas;

#define BLAS_CHECK(expr) CD_CHECK("cublas", expr)

/* -1 with a Python error set when cuBLAS is not loaded or lacks a symbol. */
static int bind_cublas(void)
{
    if (blas.bound)
        return 0;
    if (!cd_libs[CD_LIB_CUBLAS].handle) {
        PyErr_SetString(PyExc_RuntimeError, "cuBLAS is not loaded (call _libraries.ensure)");
        return -1;
    }
#define BIND_REQ(name)                                                        \
    if (!(blas.name = (__typeof__(blas.name))cd_sym(CD_LIB_CUBLAS, CD_STR(name)))) { \
        PyErr_Format(PyExc_RuntimeError, "cuBLAS (%s) has no symbol %s",       \
                     cd_libs[CD_LIB_CUBLAS].path, CD_STR(name));               \
        return -1;                                                            \
    }
#define BIND_LT(name)                                                         \
    if (!(blas.name = (__typeof__(blas.name))cd_sym(CD_LIB_CUBLAS, CD_STR(name)))) \
        lt_ok = 0;
    int lt_ok = 1;
    CD_CUBLAS_FUNCS(BIND_REQ)
    CD_CUBLASLT_FUNCS(BIND_LT)
#undef BIND_REQ
#undef BIND_LT
    int major = 0, minor = 0, patch = 0;
    if (blas.cublasGetProperty(MAJOR_VERSION, &major) == CUBLAS_STATUS_SUCCESS &&
        blas.cublasGetProperty(MINOR_VERSION, &minor) == CUBLAS_STATUS_SUCCESS &&
        blas.cublasGetProperty(PATCH_LEVEL, &patch) == CUBLAS_STATUS_SUCCESS)
        blas.version = major * 10000 + minor * 100 + patch;
    blas.lt_bound = lt_ok;
    blas.bound = 1;
    return 0;
}

/* ------------------------------------------------------ per-device state -- */

/* cuBLASLt algorithm chosen for one problem, reused across calls (modes). */
typedef struct {
    int used;
    int dtype, math, m, n, k;
    size_t ws_bytes;
    cublasLtMatmulAlgo_t algo;
} lt_choice;

#define LT_CACHE 32

/*
 * Process-wide benchmark state, one slot per device, created on first use and
 * kept for the life of the process (like PyTorch's cuBLAS handle pool: the
 * handles are never destroyed, the primary context outlives them).
 *   bench_lock  serialises whole timing calls (all devices): it is taken after
 *               the GIL is released and protects every field of every slot
 *               and the cuBLASLt algorithm cache.
 */
typedef struct {
    CUstream stream;            /* non-blocking: the timed work only */
    cublasHandle_t handle;      /* stream set once, then the workspace */
    cublasLtHandle_t lt;
    CUdeviceptr workspace;      /* shared by cublasGemmEx and cublasLtMatmul */
    size_t ws_bytes;
    CUdeviceptr flush;          /* memset between samples to evict L2 */
    size_t flush_bytes;
    CUdeviceptr a, b, c;        /* operands of the last problem, kept for reuse */
    size_t a_bytes, b_bytes, c_bytes;
    int elt_kind;               /* 0 fp32 storage, 2 fp16, 3 bf16; -1 none */
    int m, n, k;
    unsigned long long seed;
} bench_dev;

static pthread_mutex_t bench_lock = PTHREAD_MUTEX_INITIALIZER;
static bench_dev devs[BENCH_MAX_DEVICES];
static int devs_init;
static lt_choice lt_cache[LT_CACHE];
static int lt_cache_next;

static void devs_init_once(void)
{
    if (devs_init)
        return;
    for (int i = 0; i < BENCH_MAX_DEVICES; i++)
        devs[i].elt_kind = -1;
    devs_init = 1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int ensure_stream(bench_dev *d)
{
    if (d->stream)
        return 0;
    return CU_CHECK(cd_drv.cuStreamCreate(&d->stream, CU_STREAM_NON_BLOCKING));
}

/* cublasSetStream resets the workspace to cuBLAS's default pool, so the stream
 * is set once at creation and the workspace after it. */
static int ensure_blas(bench_dev *d, size_t ws_bytes)
{
    int rc;
    if (!d->handle) {
        cublasHandle_t h;
        if ((rc = BLAS_CHECK(blas.cublasCreate_v2(&h))))
            return rc;
        if ((rc = BLAS_CHECK(blas.cublasSetStream_v2(h, (cudaStream_t)d->stream)))) {
            blas.cublasDestroy_v2(h);
            return rc;
        }
        d->handle = h;
    }
    if (ws_bytes > d->ws_bytes) {
        CUdeviceptr ws;
        if ((rc = CU_CHECK(cd_drv.cuMemAlloc(&ws, ws_bytes))))
            return rc;
        if ((rc = BLAS_CHECK(blas.cublasSetWorkspace_v2(d->handle, (void *)(uintptr_t)ws,
                                                         ws_bytes)))) {
            cd_drv.cuMemFree(ws);
            return rc;
        }
        if (d->workspace) {
            if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
                return rc;
            CU_CHECK(cd_drv.cuMemFree(d->workspace));
        }
        d->workspace = ws;
        d->ws_bytes = ws_bytes;
    }
    return 0;
}

static int ensure_flush(bench_dev *d, size_t bytes)
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
    d->elt_kind = -1;
}

/* ------------------------------------------------------------- dtypes -- */

enum { DT_FP32 = 0, DT_TF32 = 1, DT_FP16 = 2, DT_BF16 = 3, DT_COUNT = 4 };
enum { MATH_ALLOW_TF32 = 1, MATH_DISALLOW_REDUCED = 2 };
enum { API_GEMMEX = 0, API_LT = 1 };

static const cudaDataType dt_type[DT_COUNT] = {CUDA_R_32F, CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
static const size_t dt_size[DT_COUNT] = {4, 4, 2, 2};
/* fp32 and tf32 share fp32 storage, hence the same operands */
static const int dt_storage[DT_COUNT] = {DT_FP32, DT_FP32, DT_FP16, DT_BF16};

static cublasComputeType_t dt_compute(int dtype, int math)
{
    if (dtype == DT_TF32 || (dtype == DT_FP32 && (math & MATH_ALLOW_TF32)))
        return CUBLAS_COMPUTE_32F_FAST_TF32;
    return CUBLAS_COMPUTE_32F;
}

static cublasMath_t dt_math_mode(int dtype, int math)
{
    int mode = CUBLAS_DEFAULT_MATH;
    if (dtype == DT_TF32 || (dtype == DT_FP32 && (math & MATH_ALLOW_TF32)))
        mode = CUBLAS_TF32_TENSOR_OP_MATH;
    if (math & MATH_DISALLOW_REDUCED)
        mode |= CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    return (cublasMath_t)mode;
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
 * overflow in the products or their sums at any k we accept. */
static void fill_tile(void *buf, size_t count, int storage, uint64_t *state)
{
    if (storage == DT_FP32) {
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
            if (storage == DT_FP16)   /* exponent field 8..14: 2^-7 .. 2^-1 */
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
    fill_tile(tile, tile_bytes / dt_size[storage], storage, &state);
    for (size_t off = 0; off < bytes; off += tile_bytes) {
        size_t len = bytes - off < tile_bytes ? bytes - off : tile_bytes;
        if ((rc = CU_CHECK(cd_drv.cuMemcpyHtoD(dst + off, tile, len))))
            return rc;
    }
    return 0;
}

/* ---------------------------------------------------------- GEMM job -- */

typedef struct {
    /* in */
    int device, dtype, math, api, sync_each, lt_algos;
    int m, n, k;
    size_t flush_bytes, ws_bytes;
    double warmup_ms, sample_ms, loop_ms;
    int samples, min_samples, max_samples, repeats, loop_n;
    unsigned long long seed;
    void *check_a, *check_b, *check_c;    /* host destinations, or NULL */
    /* out */
    double *gpu_ms, *call_ms, *loop_wall_ms, *loop_gpu_ms;
    double est_ms;
    int n_samples, n_loop, lt_tried;
    size_t need_bytes, free_bytes;         /* set when rc is out of memory */
    const char *where;                     /* "memory", "host", "unsupported"; else NULL */
} gemm_job;

typedef struct {
    int api;
    cublasHandle_t h;
    cublasLtHandle_t lt;
    cudaDataType type;
    cublasComputeType_t compute;
    int m, n, k;
    const void *A, *B;
    void *C;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
    void *ws;
    size_t ws_bytes;
    CUstream stream;
} gemm_op;

static const float f_one = 1.0f, f_zero = 0.0f;

/* One GEMM, enqueued on the op's stream. cuBLASLt's "A" is our B (n x k,
 * column-major, ld n), its "B" our A (k x m, ld k), C/D our C (n x m, ld n). */
static int run_gemm(const gemm_op *g)
{
    if (g->api == API_LT)
        return BLAS_CHECK(blas.cublasLtMatmul(g->lt, g->desc, &f_one, g->B, g->la, g->A, g->lb,
                                              &f_zero, g->C, g->lc, g->C, g->lc, &g->algo,
                                              g->ws, g->ws_bytes, (cudaStream_t)g->stream));
    return BLAS_CHECK(blas.cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->m, g->k, &f_one,
                                        g->B, g->type, g->n, g->A, g->type, g->k, &f_zero, g->C,
                                        g->type, g->n, g->compute, CUBLAS_GEMM_DEFAULT));
}

static int ensure_operands(bench_dev *d, gemm_job *j)
{
    int rc, storage = dt_storage[j->dtype];
    size_t elt = dt_size[j->dtype];
    if (d->elt_kind == storage && d->m == j->m && d->n == j->n && d->k == j->k &&
        d->seed == j->seed)
        return 0;
    if (d->elt_kind >= 0) {
        if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
            return rc;
        free_operands(d);
    }
    size_t a = (size_t)j->m * j->k * elt, b = (size_t)j->k * j->n * elt,
           c = (size_t)j->m * j->n * elt;
    size_t free_b = 0, total_b = 0;
    if ((rc = CU_CHECK(cd_drv.cuMemGetInfo(&free_b, &total_b))))
        return rc;
    if (a + b + c + BENCH_MEM_MARGIN > free_b) {
        j->need_bytes = a + b + c + BENCH_MEM_MARGIN;
        j->free_bytes = free_b;
        j->where = "memory";
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
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
        j->where = "host";
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* different seeds for A and B; the copies are on the legacy stream and
     * may still be in flight: the context sync orders them before our
     * non-blocking stream's work */
    if ((rc = fill_random(d->a, a, storage, j->seed * 2 + 1, tile, tile_bytes)) ||
        (rc = fill_random(d->b, b, storage, j->seed * 2 + 2, tile, tile_bytes)) ||
        (rc = CU_CHECK(cd_drv.cuMemsetD8(d->c, 0, c))) ||
        (rc = CU_CHECK(cd_drv.cuCtxSynchronize()))) {
        free(tile);
        free_operands(d);
        return rc;
    }
    free(tile);
    d->elt_kind = storage;
    d->m = j->m;
    d->n = j->n;
    d->k = j->k;
    d->seed = j->seed;
    return 0;
}

static lt_choice *lt_lookup(const gemm_job *j)
{
    for (int i = 0; i < LT_CACHE; i++) {
        lt_choice *c = &lt_cache[i];
        if (c->used && c->dtype == j->dtype && c->math == j->math && c->m == j->m &&
            c->n == j->n && c->k == j->k && c->ws_bytes == j->ws_bytes)
            return c;
    }
    return NULL;
}

/* Events around `reps` runs of one cuBLASLt algorithm; +inf when it fails. */
static double lt_time_algo(gemm_op *g, CUevent e0, CUevent e1, int reps)
{
    if (blas.cublasLtMatmul(g->lt, g->desc, &f_one, g->B, g->la, g->A, g->lb, &f_zero, g->C,
                            g->lc, g->C, g->lc, &g->algo, g->ws, g->ws_bytes,
                            (cudaStream_t)g->stream) != CUBLAS_STATUS_SUCCESS)
        return INFINITY;
    if (CU_CHECK(cd_drv.cuEventRecord(e0, g->stream)))
        return NAN;
    for (int r = 0; r < reps; r++)
        if (blas.cublasLtMatmul(g->lt, g->desc, &f_one, g->B, g->la, g->A, g->lb, &f_zero,
                                g->C, g->lc, g->C, g->lc, &g->algo, g->ws, g->ws_bytes,
                                (cudaStream_t)g->stream) != CUBLAS_STATUS_SUCCESS)
            return INFINITY;
    float ms = 0;
    if (CU_CHECK(cd_drv.cuEventRecord(e1, g->stream)) ||
        CU_CHECK(cd_drv.cuEventSynchronize(e1)) ||
        CU_CHECK(cd_drv.cuEventElapsedTime(&ms, e0, e1)))
        return NAN;
    return ms / reps;
}

/* Descriptors for cuBLASLt and the algorithm: the cached choice, or the
 * heuristic's candidates timed here (fastest wins) when lt_algos > 1. */
static int lt_prepare(gemm_op *g, gemm_job *j)
{
    int rc;
    cublasLtMatmulPreference_t pref = NULL;
    CUevent e0 = NULL, e1 = NULL;
    if ((rc = BLAS_CHECK(blas.cublasLtMatmulDescCreate(&g->desc, g->compute, CUDA_R_32F))) ||
        (rc = BLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&g->la, g->type, j->n, j->k, j->n))) ||
        (rc = BLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&g->lb, g->type, j->k, j->m, j->k))) ||
        (rc = BLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&g->lc, g->type, j->n, j->m, j->n))))
        return rc;
    lt_choice *cached = lt_lookup(j);
    if (cached) {
        g->algo = cached->algo;
        return 0;
    }
    cublasLtMatmulHeuristicResult_t res[BENCH_LT_MAX_ALGOS];
    int want = j->lt_algos < 1 ? 1 : j->lt_algos > BENCH_LT_MAX_ALGOS ? BENCH_LT_MAX_ALGOS
                                                                       : j->lt_algos;
    int got = 0;
    uint64_t ws = g->ws_bytes;
    memset(res, 0, sizeof res);
    if ((rc = BLAS_CHECK(blas.cublasLtMatmulPreferenceCreate(&pref))) ||
        (rc = BLAS_CHECK(blas.cublasLtMatmulPreferenceSetAttribute(
             pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws))))
        goto done;
    if (j->math & MATH_DISALLOW_REDUCED) {
        /* split-k partial sums only in the compute type (fp32), never in the
         * output type: what CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION
         * means for cublasGemmEx */
        uint32_t mask = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
        if ((rc = BLAS_CHECK(blas.cublasLtMatmulPreferenceSetAttribute(
                 pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &mask, sizeof mask))))
            goto done;
    }
    if ((rc = BLAS_CHECK(blas.cublasLtMatmulAlgoGetHeuristic(g->lt, g->desc, g->la, g->lb,
                                                             g->lc, g->lc, pref, want, res,
                                                             &got))))
        goto done;
    int best = -1;
    double best_ms = INFINITY;
    if (got > 1) {
        if ((rc = CU_CHECK(cd_drv.cuEventCreate(&e0, CU_EVENT_DEFAULT))) ||
            (rc = CU_CHECK(cd_drv.cuEventCreate(&e1, CU_EVENT_DEFAULT))))
            goto done;
    }
    for (int i = 0; i < got; i++) {
        if (res[i].state != CUBLAS_STATUS_SUCCESS)
            continue;
        if (got == 1) {
            best = i;
            break;
        }
        g->algo = res[i].algo;
        double ms = lt_time_algo(g, e0, e1, 3);
        if (isnan(ms)) {
            rc = cd_last_call.status ? cd_last_call.status : CUDA_ERROR_UNKNOWN;
            goto done;
        }
        j->lt_tried++;
        if (ms < best_ms) {
            best_ms = ms;
            best = i;
        }
    }
    if (best < 0) {
        rc = cd_check_(CUBLAS_STATUS_NOT_SUPPORTED, "cublas",
                       "cublasLtMatmulAlgoGetHeuristic: no usable algorithm", __FILE__,
                       __LINE__);
        goto done;
    }
    g->algo = res[best].algo;
    lt_choice *c = &lt_cache[lt_cache_next];
    lt_cache_next = (lt_cache_next + 1) % LT_CACHE;
    c->used = 1;
    c->dtype = j->dtype;
    c->math = j->math;
    c->m = j->m;
    c->n = j->n;
    c->k = j->k;
    c->ws_bytes = j->ws_bytes;
    c->algo = g->algo;
done:
    if (pref)
        blas.cublasLtMatmulPreferenceDestroy(pref);
    if (e0)
        cd_drv.cuEventDestroy(e0);
    if (e1)
        cd_drv.cuEventDestroy(e1);
    return rc;
}

static void lt_release(gemm_op *g)
{
    if (g->la) blas.cublasLtMatrixLayoutDestroy(g->la);
    if (g->lb) blas.cublasLtMatrixLayoutDestroy(g->lb);
    if (g->lc) blas.cublasLtMatrixLayoutDestroy(g->lc);
    if (g->desc) blas.cublasLtMatmulDescDestroy(g->desc);
    g->la = g->lb = g->lc = NULL;
    g->desc = NULL;
}

static void destroy_events(CUevent *ev, int n)
{
    if (!ev)
        return;
    for (int i = 0; i < n; i++)
        if (ev[i])
            cd_drv.cuEventDestroy(ev[i]);
    free(ev);
}

static int create_events(CUevent **out, int n)
{
    int rc;
    CUevent *ev = calloc((size_t)n, sizeof *ev);
    if (!ev)
        return CUDA_ERROR_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++)
        if ((rc = CU_CHECK(cd_drv.cuEventCreate(&ev[i], CU_EVENT_DEFAULT)))) {
            destroy_events(ev, n);
            return rc;
        }
    *out = ev;
    return 0;
}

static int clampi(double v, int lo, int hi)
{
    if (!(v >= lo))   /* also NaN */
        return lo;
    if (v > hi)
        return hi;
    return (int)v;
}

/* Warm-up by time: batches of back-to-back GEMMs, doubling while short, until
 * warmup_ms has passed (at least 2 GEMMs). est_ms = wall per GEMM of the last
 * batch. */
static int warm_up(const gemm_op *g, gemm_job *j)
{
    int rc, batch = 1, done = 0;
    double start = now_ms();
    for (;;) {
        double t0 = now_ms();
        for (int i = 0; i < batch; i++)
            if ((rc = run_gemm(g)))
                return rc;
        if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(g->stream))))
            return rc;
        double t1 = now_ms();
        done += batch;
        j->est_ms = (t1 - t0) / batch;
        if (t1 - start >= j->warmup_ms && done >= 2)
            return 0;
        if (t1 - t0 < 20.0 && batch < 4096)
            batch *= 2;
    }
}

static int gemm_body(gemm_job *j)
{
    int rc;
    bench_dev *d = &devs[j->device];
    gemm_op g;
    CUevent *ev = NULL, *lev = NULL;
    int n_ev = 0, n_lev = 0;
    memset(&g, 0, sizeof g);

    if ((rc = ensure_stream(d)) || (rc = ensure_blas(d, j->ws_bytes)))
        return rc;
    if (j->flush_bytes && (rc = ensure_flush(d, j->flush_bytes)))
        return rc;
    if ((rc = ensure_operands(d, j)))
        return rc;

    g.api = j->api;
    g.h = d->handle;
    g.type = dt_type[j->dtype];
    g.compute = dt_compute(j->dtype, j->math);
    g.m = j->m;
    g.n = j->n;
    g.k = j->k;
    g.A = (const void *)(uintptr_t)d->a;
    g.B = (const void *)(uintptr_t)d->b;
    g.C = (void *)(uintptr_t)d->c;
    g.ws = (void *)(uintptr_t)d->workspace;
    g.ws_bytes = d->ws_bytes;
    g.stream = d->stream;

    if ((rc = BLAS_CHECK(blas.cublasSetMathMode(d->handle, dt_math_mode(j->dtype, j->math)))))
        return rc;
    if (j->api == API_LT) {
        if (!d->lt && (rc = BLAS_CHECK(blas.cublasLtCreate(&d->lt))))
            return rc;
        g.lt = d->lt;
        if ((rc = lt_prepare(&g, j)))
            goto done;
    }

    if ((rc = warm_up(&g, j)))
        goto done;

    /* -- samples: one GEMM at a time, events around it -- */
    j->n_samples = j->samples > 0 ? clampi(j->samples, 1, BENCH_MAX_SAMPLES)
                                  : clampi(floor(j->sample_ms / (j->est_ms > 1e-6 ? j->est_ms
                                                                                  : 1e-6) + 0.5),
                                           j->min_samples, j->max_samples);
    n_ev = 2 * j->n_samples;
    j->gpu_ms = calloc((size_t)j->n_samples, sizeof(double));
    j->call_ms = calloc((size_t)j->n_samples, sizeof(double));
    if (!j->gpu_ms || !j->call_ms) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        j->where = "host";
        goto done;
    }
    if ((rc = create_events(&ev, n_ev)))
        goto done;
    for (int i = 0; i < j->n_samples; i++) {
        /* the memset (>= 2x L2) both evicts the operands from L2 and keeps
         * the GPU busy while the host enqueues the GEMM, so the start event
         * does not time the launch gap */
        if (j->flush_bytes &&
            (rc = CU_CHECK(cd_drv.cuMemsetD32Async(d->flush, (unsigned)i, j->flush_bytes / 4,
                                                   d->stream))))
            goto done;
        if ((rc = CU_CHECK(cd_drv.cuEventRecord(ev[2 * i], d->stream))))
            goto done;
        double t0 = now_ms();
        if ((rc = run_gemm(&g)))
            goto done;
        double t1 = now_ms();
        if ((rc = CU_CHECK(cd_drv.cuEventRecord(ev[2 * i + 1], d->stream))))
            goto done;
        if (j->sync_each) {
            if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
                goto done;
            t1 = now_ms();
        }
        j->call_ms[i] = t1 - t0;
    }
    if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
        goto done;
    for (int i = 0; i < j->n_samples; i++) {
        float ms = 0;
        if ((rc = CU_CHECK(cd_drv.cuEventElapsedTime(&ms, ev[2 * i], ev[2 * i + 1]))))
            goto done;
        j->gpu_ms[i] = ms;
    }

    /* -- loops: loop_n back-to-back GEMMs, one sync at the end -- */
    j->n_loop = j->loop_n > 0 ? clampi(j->loop_n, 1, BENCH_MAX_LOOP_N)
                              : clampi(ceil(j->loop_ms / (j->est_ms > 1e-6 ? j->est_ms : 1e-6)),
                                       1, BENCH_MAX_LOOP_N);
    n_lev = 2 * j->repeats;
    j->loop_wall_ms = calloc((size_t)j->repeats, sizeof(double));
    j->loop_gpu_ms = calloc((size_t)j->repeats, sizeof(double));
    if (!j->loop_wall_ms || !j->loop_gpu_ms) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
        j->where = "host";
        goto done;
    }
    if ((rc = create_events(&lev, n_lev)))
        goto done;
    for (int r = 0; r < j->repeats; r++) {
        if ((rc = CU_CHECK(cd_drv.cuEventRecord(lev[2 * r], d->stream))))
            goto done;
        double t0 = now_ms();
        for (int i = 0; i < j->n_loop; i++) {
            if ((rc = run_gemm(&g)))
                goto done;
            if (j->sync_each && (rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
                goto done;
        }
        if ((rc = CU_CHECK(cd_drv.cuEventRecord(lev[2 * r + 1], d->stream))) ||
            (rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
            goto done;
        j->loop_wall_ms[r] = (now_ms() - t0) / j->n_loop;
        float ms = 0;
        if ((rc = CU_CHECK(cd_drv.cuEventElapsedTime(&ms, lev[2 * r], lev[2 * r + 1]))))
            goto done;
        j->loop_gpu_ms[r] = (double)ms / j->n_loop;
    }

    /* -- the operands and the product, for the correctness check -- */
    if (j->check_c) {
        if ((rc = CU_CHECK(cd_drv.cuMemcpyDtoH(j->check_a, d->a, d->a_bytes))) ||
            (rc = CU_CHECK(cd_drv.cuMemcpyDtoH(j->check_b, d->b, d->b_bytes))) ||
            (rc = CU_CHECK(cd_drv.cuMemcpyDtoH(j->check_c, d->c, d->c_bytes))))
            goto done;
    }
done:
    if (rc) {
        /* leave nothing of ours queued behind an error */
        cd_drv.cuStreamSynchronize(d->stream);
    }
    destroy_events(ev, n_ev);
    destroy_events(lev, n_lev);
    lt_release(&g);
    return rc;
}

static PyObject *doubles(const double *v, int n)
{
    npy_intp dims[1] = {n};
    PyObject *a = PyArray_SimpleNew(1, dims, NPY_FLOAT64);
    if (a && n)
        memcpy(PyArray_DATA((PyArrayObject *)a), v, (size_t)n * sizeof(double));
    return a;
}

static int numpy_ready(void)
{
    if (PyArray_API)
        return 0;
    return _import_array();
}

/* The primary context of `device` (range-checked by the callers): CUresult. */
static int get_context(int device, CUcontext *ctx)
{
    if (!cd_libs[CD_LIB_CUDA].handle)
        return CUDA_ERROR_NOT_INITIALIZED;
    return cd_device_context(device, ctx);
}

static const char *failed_where(int rc, const char *where)
{
    if (where)
        return where;
    if (cd_last_call.status == rc && cd_last_call.lib)
        return cd_last_call.lib;
    return "cuda";
}

/*
 * _core.gemm(m, n, k, dtype, math=0, device=0, api=0, sync_each=False,
 *            flush_bytes=0, workspace_bytes=32 MiB, warmup_s=0.1, samples=0,
 *            min_samples=10, max_samples=200, sample_ms=200.0, repeats=10,
 *            loop_n=0, loop_ms=20.0, check=False, seed=0, lt_algos=8)
 *
 * dtype: 0 fp32, 1 tf32, 2 fp16, 3 bf16. math: bit 0 allow TF32 for fp32,
 * bit 1 disallow reduced-precision (output-type) split-k reduction.
 * api: 0 cublasGemmEx, 1 cublasLtMatmul (lt_algos > 1: the heuristic's first
 * lt_algos candidates are timed and the fastest is kept for this problem).
 * samples/loop_n = 0: chosen from the warm-up's time per GEMM (sample_ms of
 * samples within [min_samples, max_samples]; loop_ms per loop).
 *
 * Returns (0, None, gpu_ms, call_ms, loop_wall_ms, loop_gpu_ms, est_ms,
 *          loop_n, cublas_version, check, lt_tried)
 *   gpu_ms, call_ms: float64[samples]; loop_*: float64[repeats] (per GEMM);
 *   check: None or (A, B, C) host copies (float32, or uint16 bits of
 *   fp16/bf16), shapes (m, k), (k, n), (m, n).
 * or, on failure, (CUresult or cublasStatus_t, "cuda" | "cublas" | "memory"
 * (device memory too small: need_bytes, free_bytes) | "host" (malloc failed)
 * | "unsupported" (no cuBLASLt), need_bytes, free_bytes); _core.last_call()
 * says which call failed.
 */
PyObject *cd_py_gemm(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"m", "n", "k", "dtype", "math", "device", "api", "sync_each",
                             "flush_bytes", "workspace_bytes", "warmup_s", "samples",
                             "min_samples", "max_samples", "sample_ms", "repeats", "loop_n",
                             "loop_ms", "check", "seed", "lt_algos", NULL};
    gemm_job j;
    memset(&j, 0, sizeof j);
    Py_ssize_t flush_bytes = 0, ws_bytes = (Py_ssize_t)32 << 20;
    double warmup_s = 0.1;
    int check = 0;
    j.min_samples = 10;
    j.max_samples = 200;
    j.sample_ms = 200.0;
    j.repeats = 10;
    j.loop_ms = 20.0;
    j.lt_algos = 8;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiii|iiipnndiiidiidpKi", kwlist, &j.m, &j.n,
                                     &j.k, &j.dtype, &j.math, &j.device, &j.api, &j.sync_each,
                                     &flush_bytes, &ws_bytes, &warmup_s, &j.samples,
                                     &j.min_samples, &j.max_samples, &j.sample_ms, &j.repeats,
                                     &j.loop_n, &j.loop_ms, &check, &j.seed, &j.lt_algos))
        return NULL;
    if (j.m <= 0 || j.n <= 0 || j.k <= 0 || j.dtype < 0 || j.dtype >= DT_COUNT || j.device < 0 ||
        (j.api != API_GEMMEX && j.api != API_LT) || j.repeats < 1 ||
        j.repeats > BENCH_MAX_SAMPLES || j.samples < 0 || j.loop_n < 0 ||
        j.min_samples < 1 || j.max_samples < j.min_samples || j.max_samples > BENCH_MAX_SAMPLES ||
        flush_bytes < 0 || ws_bytes < 0 || !(warmup_s >= 0) || !(j.sample_ms >= 0) ||
        !(j.loop_ms >= 0)) {
        PyErr_SetString(PyExc_ValueError, "gemm: argument out of range");
        return NULL;
    }
    j.flush_bytes = (size_t)flush_bytes & ~(size_t)3;
    j.ws_bytes = (size_t)ws_bytes;
    j.warmup_ms = warmup_s * 1e3;
    if (numpy_ready() < 0 || bind_cublas() < 0)
        return NULL;
    if (j.api == API_LT && !blas.lt_bound)
        return Py_BuildValue("(iskk)", CUBLAS_STATUS_NOT_SUPPORTED, "unsupported", 0ul, 0ul);

    if (j.device >= BENCH_MAX_DEVICES)
        return Py_BuildValue("(iskk)", CUDA_ERROR_INVALID_DEVICE, "cuda", 0ul, 0ul);
    CUcontext ctx = NULL, popped;
    int rc = get_context(j.device, &ctx);
    if (rc)
        return Py_BuildValue("(iskk)", rc, "cuda", 0ul, 0ul);

    PyObject *chk[3] = {NULL, NULL, NULL};
    if (check) {
        int typenum = dt_size[j.dtype] == 4 ? NPY_FLOAT32 : NPY_UINT16;
        npy_intp da[2] = {j.m, j.k}, db[2] = {j.k, j.n}, dc[2] = {j.m, j.n};
        if (!(chk[0] = PyArray_SimpleNew(2, da, typenum)) ||
            !(chk[1] = PyArray_SimpleNew(2, db, typenum)) ||
            !(chk[2] = PyArray_SimpleNew(2, dc, typenum))) {
            Py_XDECREF(chk[0]);
            Py_XDECREF(chk[1]);
            return NULL;
        }
        j.check_a = PyArray_DATA((PyArrayObject *)chk[0]);
        j.check_b = PyArray_DATA((PyArrayObject *)chk[1]);
        j.check_c = PyArray_DATA((PyArrayObject *)chk[2]);
    }

    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&bench_lock);
    devs_init_once();
    rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc == 0) {
        rc = gemm_body(&j);
        cd_drv.cuCtxPopCurrent(&popped);
    }
    pthread_mutex_unlock(&bench_lock);
    Py_END_ALLOW_THREADS

    PyObject *r = NULL;
    if (rc) {
        r = Py_BuildValue("(isKK)", rc, failed_where(rc, j.where),
                          (unsigned long long)j.need_bytes, (unsigned long long)j.free_bytes);
    } else {
        PyObject *g = doubles(j.gpu_ms, j.n_samples), *c = doubles(j.call_ms, j.n_samples);
        PyObject *lw = doubles(j.loop_wall_ms, j.repeats), *lg = doubles(j.loop_gpu_ms, j.repeats);
        PyObject *ck;
        if (check) {
            ck = Py_BuildValue("(OOO)", chk[0], chk[1], chk[2]);
        } else {
            Py_INCREF(Py_None);
            ck = Py_None;
        }
        if (g && c && lw && lg && ck)
            r = Py_BuildValue("(iOOOOOdiiOi)", 0, Py_None, g, c, lw, lg, j.est_ms, j.n_loop,
                              blas.version, ck, j.lt_tried);
        Py_XDECREF(g);
        Py_XDECREF(c);
        Py_XDECREF(lw);
        Py_XDECREF(lg);
        Py_XDECREF(ck);
    }
    for (int i = 0; i < 3; i++)
        Py_XDECREF(chk[i]);
    free(j.gpu_ms);
    free(j.call_ms);
    free(j.loop_wall_ms);
    free(j.loop_gpu_ms);
    return r;
}

/* ---------------------------------------------------- launch latency -- */

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
    bench_dev *d = &devs[j->device];
    if ((rc = ensure_stream(d)))
        return rc;
    CUstream s = d->stream;
    double start = now_ms();
    int done = 0;
    while (now_ms() - start < j->warmup_ms || done < 100) {
        for (int i = 0; i < 100; i++)
            if ((rc = launch_empty(j, s)))
                return rc;
        if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
            return rc;
        done += 100;
    }
    for (int i = 0; i < j->samples; i++) {
        double t0 = now_ms();
        if ((rc = launch_empty(j, s)))
            return rc;
        if (j->sync_each && (rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
            return rc;
        j->call_us[i] = (now_ms() - t0) * 1e3;
        /* async: keep the queue from filling up, off the clock */
        if (!j->sync_each && (i % 256) == 255 && (rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
            return rc;
    }
    if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
        return rc;
    for (int r = 0; r < j->repeats; r++) {
        double t0 = now_ms();
        for (int i = 0; i < j->loop_n; i++) {
            if ((rc = launch_empty(j, s)))
                return rc;
            if (j->sync_each && (rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
                return rc;
        }
        if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(s))))
            return rc;
        j->loop_us[r] = (now_ms() - t0) * 1e3 / j->loop_n;
    }
    return 0;
}

/*
 * _core.launch_latency(device=0, sync_each=False, samples=1000, repeats=10,
 *                      loop_n=1000, warmup_s=0.05)
 * Empty kernel (1 block of 1 thread) on the benchmark's non-blocking stream.
 * Returns (0, None, call_us[samples], loop_us[repeats]): host time of each
 * launch (+ its stream sync when sync_each), and wall time per launch of
 * loops of loop_n launches with one sync at the end; or, on failure,
 * (CUresult, "cuda", 0, 0).
 */
PyObject *cd_py_launch_latency(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"device", "sync_each", "samples", "repeats", "loop_n", "warmup_s",
                             NULL};
    latency_job j;
    memset(&j, 0, sizeof j);
    j.samples = 1000;
    j.repeats = 10;
    j.loop_n = 1000;
    double warmup_s = 0.05;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|ipiiid", kwlist, &j.device, &j.sync_each,
                                     &j.samples, &j.repeats, &j.loop_n, &warmup_s))
        return NULL;
    if (j.samples < 1 || j.samples > BENCH_MAX_SAMPLES || j.repeats < 1 ||
        j.repeats > BENCH_MAX_SAMPLES || j.loop_n < 1 || j.loop_n > BENCH_MAX_LOOP_N ||
        !(warmup_s >= 0)) {
        PyErr_SetString(PyExc_ValueError, "launch_latency: argument out of range");
        return NULL;
    }
    j.warmup_ms = warmup_s * 1e3;
    if (numpy_ready() < 0)
        return NULL;
    if (j.device < 0 || j.device >= BENCH_MAX_DEVICES)
        return Py_BuildValue("(iskk)", CUDA_ERROR_INVALID_DEVICE, "cuda", 0ul, 0ul);
    CUcontext ctx = NULL, popped;
    int rc = get_context(j.device, &ctx);
    if (rc == 0)
        rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc)
        return Py_BuildValue("(iskk)", rc, "cuda", 0ul, 0ul);
    /* the module of embedded kernels is loaded under the GIL */
    rc = cd_fault_kernel(j.device, CD_KERNEL_EMPTY, &j.fn);
    if (rc) {
        cd_drv.cuCtxPopCurrent(&popped);
        return Py_BuildValue("(iskk)", rc, "cuda", 0ul, 0ul);
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
    devs_init_once();
    rc = latency_body(&j);
    if (rc)
        cd_drv.cuStreamSynchronize(devs[j.device].stream);
    pthread_mutex_unlock(&bench_lock);
    cd_drv.cuCtxPopCurrent(&popped);
    Py_END_ALLOW_THREADS
    PyObject *r = NULL;
    if (rc) {
        r = Py_BuildValue("(iskk)", rc, "cuda", 0ul, 0ul);
    } else {
        PyObject *c = doubles(j.call_us, j.samples), *l = doubles(j.loop_us, j.repeats);
        if (c && l)
            r = Py_BuildValue("(iOOO)", 0, Py_None, c, l);
        Py_XDECREF(c);
        Py_XDECREF(l);
    }
    free(j.call_us);
    free(j.loop_us);
    return r;
}

/* ------------------------------------------------------ housekeeping -- */

/* _core.bench_release(device) -> CUresult: free the cached operands and the
 * flush buffer of `device` (the handle, stream and workspace stay). */
PyObject *cd_py_bench_release(PyObject *self, PyObject *arg)
{
    (void)self;
    long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred())
        return NULL;
    if (device < 0 || device >= BENCH_MAX_DEVICES)
        return PyLong_FromLong(CUDA_ERROR_INVALID_DEVICE);
    CUcontext ctx = NULL, popped;
    int rc = get_context((int)device, &ctx);
    if (rc)
        return PyLong_FromLong(rc);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&bench_lock);
    devs_init_once();
    bench_dev *d = &devs[device];
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
    long device = PyLong_AsLong(arg);
    if (device == -1 && PyErr_Occurred())
        return NULL;
    if (device < 0 || device >= BENCH_MAX_DEVICES)
        return Py_BuildValue("(ikk)", CUDA_ERROR_INVALID_DEVICE, 0ul, 0ul);
    CUcontext ctx = NULL, popped;
    size_t free_b = 0, total_b = 0;
    int rc = get_context((int)device, &ctx);
    if (rc == 0)
        rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc == 0) {
        rc = CU_CHECK(cd_drv.cuMemGetInfo(&free_b, &total_b));
        cd_drv.cuCtxPopCurrent(&popped);
    }
    return Py_BuildValue("(iKK)", rc, (unsigned long long)free_b, (unsigned long long)total_b);
}

/* ------------------------------------------------- structured results -- */

typedef struct {
    const char *name;
    const char *format;
} field_spec;

/* The row layouts of cuda_debug.bench results; bench.py documents each
 * column. Strings are fixed-width unicode so `arr["dtype"] == "bf16"` works. */
static const field_spec gemm_fields[] = {
    {"m", "<i8"}, {"n", "<i8"}, {"k", "<i8"},
    {"dtype", "<U4"}, {"mode", "<U15"}, {"api", "<U6"},
    {"allow_tf32", "?"}, {"allow_fp16_reduced", "?"}, {"allow_bf16_reduced", "?"},
    {"flush", "?"},
    {"ms", "<f8"}, {"p10_ms", "<f8"}, {"p90_ms", "<f8"},
    {"tflops", "<f8"}, {"pct_peak", "<f8"}, {"slowdown", "<f8"},
    {"gpu_ms", "<f8"}, {"gpu_p10_ms", "<f8"}, {"gpu_p90_ms", "<f8"},
    {"call_ms", "<f8"}, {"call_p90_ms", "<f8"},
    {"samples", "<i8"}, {"loops", "<i8"}, {"loop_n", "<i8"},
    {"rel_err", "<f8"}, {"sm_mhz", "<f8"},
    {NULL, NULL},
};

static const field_spec latency_fields[] = {
    {"mode", "<U15"},
    {"us", "<f8"}, {"p10_us", "<f8"}, {"p90_us", "<f8"},
    {"call_us", "<f8"}, {"call_p10_us", "<f8"}, {"call_p90_us", "<f8"},
    {"extra_us", "<f8"}, {"slowdown", "<f8"},
    {"samples", "<i8"}, {"loops", "<i8"}, {"loop_n", "<i8"},
    {NULL, NULL},
};

static PyArray_Descr *make_descr(const field_spec *f)
{
    PyObject *spec = PyList_New(0);
    if (!spec)
        return NULL;
    for (; f->name; f++) {
        PyObject *t = Py_BuildValue("(ss)", f->name, f->format);
        if (!t || PyList_Append(spec, t) < 0) {
            Py_XDECREF(t);
            Py_DECREF(spec);
            return NULL;
        }
        Py_DECREF(t);
    }
    PyArray_Descr *descr = NULL;
    int ok = PyArray_DescrConverter(spec, &descr);
    Py_DECREF(spec);
    return ok ? descr : NULL;
}

/* _core.bench_records(kind, rows) -> numpy structured array, kind "gemm" or
 * "latency"; each row a sequence with one value per field, in field order. */
PyObject *cd_py_bench_records(PyObject *self, PyObject *args)
{
    (void)self;
    const char *kind;
    PyObject *rows;
    if (!PyArg_ParseTuple(args, "sO", &kind, &rows))
        return NULL;
    const field_spec *fields;
    if (!strcmp(kind, "gemm"))
        fields = gemm_fields;
    else if (!strcmp(kind, "latency"))
        fields = latency_fields;
    else {
        PyErr_Format(PyExc_ValueError, "unknown record kind %s", kind);
        return NULL;
    }
    if (numpy_ready() < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(rows, "rows must be a sequence");
    if (!seq)
        return NULL;
    Py_ssize_t nfields = 0;
    while (fields[nfields].name)
        nfields++;
    PyArray_Descr *descr = make_descr(fields);
    if (!descr) {
        Py_DECREF(seq);
        return NULL;
    }
    npy_intp dims[1] = {PySequence_Fast_GET_SIZE(seq)};
    /* steals descr */
    PyObject *arr = PyArray_NewFromDescr(&PyArray_Type, descr, 1, dims, NULL, NULL, 0, NULL);
    if (!arr) {
        Py_DECREF(seq);
        return NULL;
    }
    memset(PyArray_DATA((PyArrayObject *)arr), 0, (size_t)PyArray_NBYTES((PyArrayObject *)arr));
    for (npy_intp i = 0; i < dims[0]; i++) {
        PyObject *row = PySequence_Tuple(PySequence_Fast_GET_ITEM(seq, i));
        if (!row)
            goto fail;
        if (PyTuple_GET_SIZE(row) != nfields) {
            PyErr_Format(PyExc_ValueError, "%s row %zd has %zd values, expected %zd", kind,
                         (Py_ssize_t)i, PyTuple_GET_SIZE(row), nfields);
            Py_DECREF(row);
            goto fail;
        }
        int bad = PyArray_SETITEM((PyArrayObject *)arr, PyArray_GETPTR1((PyArrayObject *)arr, i),
                                  row);
        Py_DECREF(row);
        if (bad < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return arr;
fail:
    Py_DECREF(seq);
    Py_DECREF(arr);
    return NULL;
}
