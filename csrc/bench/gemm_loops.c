/*
 * gemm_loops.c: cuBLAS / cuBLASLt GEMM timing loops behind cuda_debug.bench.gemm.
 *
 *   _core.gemm(**every keyword required)   -> raw samples (see cd_py_gemm)
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
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "bench/bench.h"

#include <math.h>       /* round, isnan, isfinite, ... */
#include <stdlib.h>      /* calloc, free */
#include <string.h>      /* memset */

#define BENCH_LT_MAX_ALGOS 16
#define LT_CACHE 64
#define LT_TIME_MS 4.0        /* time each cuBLASLt candidate for about this long */

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

/* ---------------------------------------------------------- GEMM job -- */

enum { API_GEMMEX = 0, API_LT = 1 };

typedef struct {
    /* in: every field comes from Python (no defaults here) */
    int device, storage, tf32, disallow_reduced, api, sync_each, lt_algos;
    int m, n, k;
    size_t flush_bytes, ws_bytes;
    double warmup_ms, sample_ms, loop_ms;
    int samples, min_samples, max_samples, repeats, loop_n;
    unsigned long long seed;
    void *check_a, *check_b, *check_c;    /* host destinations, or NULL */
    /* out: the sample buffers are handed to NumPy (bench_samples) */
    double *gpu_ms, *call_ms, *loop_wall_ms, *loop_gpu_ms;
    double est_ms;
    int n_samples, n_loop, lt_tried, host_oom;
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

/* The one cublasLtMatmul call. cuBLASLt's "A" is our B (n x k, column-major,
 * ld n), its "B" our A (k x m, ld k), C/D our C (n x m, ld n). */
static cublasStatus_t lt_matmul(const gemm_op *g)
{
    return blas.cublasLtMatmul(g->lt, g->desc, &f_one, g->B, g->la, g->A, g->lb, &f_zero, g->C,
                               g->lc, g->C, g->lc, &g->algo, g->ws, g->ws_bytes,
                               (cudaStream_t)g->stream);
}

/* One GEMM, enqueued on the op's stream. */
static int run_gemm(const gemm_op *g)
{
    if (g->api == API_LT)
        return BLAS_CHECK(lt_matmul(g));
    return BLAS_CHECK(blas.cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->m, g->k, &f_one,
                                        g->B, g->type, g->n, g->A, g->type, g->k, &f_zero, g->C,
                                        g->type, g->n, g->compute, CUBLAS_GEMM_DEFAULT));
}

/* -------------------------------------------------- cuBLASLt algorithms -- */

/* The algorithm chosen for one problem on one device, reused across calls
 * (modes). Protected by bench_lock. */
typedef struct {
    int used;
    int device, storage, tf32, disallow_reduced, lt_algos, m, n, k;
    size_t ws_bytes;
    cublasLtMatmulAlgo_t algo;
} lt_choice;

static lt_choice lt_cache[LT_CACHE];
static int lt_cache_next;

static int lt_same(const lt_choice *c, const gemm_job *j)
{
    return c->used && c->device == j->device && c->storage == j->storage && c->tf32 == j->tf32 &&
           c->disallow_reduced == j->disallow_reduced && c->lt_algos == j->lt_algos &&
           c->m == j->m && c->n == j->n && c->k == j->k && c->ws_bytes == j->ws_bytes;
}

/* Events around `reps` back-to-back runs of the op's algorithm: ms per run;
 * +inf when the algorithm refuses the problem, NaN when CUDA failed. */
static double lt_time_algo(const gemm_op *g, CUevent e0, CUevent e1, int reps)
{
    float ms = 0;
    if (CU_CHECK(cd_drv.cuEventRecord(e0, g->stream)))
        return NAN;
    for (int r = 0; r < reps; r++)
        if (lt_matmul(g) != CUBLAS_STATUS_SUCCESS)
            return INFINITY;
    if (CU_CHECK(cd_drv.cuEventRecord(e1, g->stream)) ||
        CU_CHECK(cd_drv.cuEventSynchronize(e1)) ||
        CU_CHECK(cd_drv.cuEventElapsedTime(&ms, e0, e1)))
        return NAN;
    return ms / reps;
}

/* lt_algos == 1: the heuristic's first choice (what PyTorch's cuBLASLt path
 * runs). lt_algos > 1: its first lt_algos candidates, each run once untimed,
 * then timed for about LT_TIME_MS in two interleaved rounds (best of the two);
 * a candidate replaces the heuristic's first only when it is more than 1%
 * faster, so short-burst noise does not pick a kernel that loses sustained. */
static int lt_pick(gemm_op *g, gemm_job *j, const cublasLtMatmulHeuristicResult_t *res, int got,
                   int *best)
{
    int rc = 0;
    CUevent e0 = NULL, e1 = NULL;
    double ms[BENCH_LT_MAX_ALGOS];
    int reps[BENCH_LT_MAX_ALGOS];
    *best = -1;
    for (int i = 0; i < got; i++) {
        ms[i] = INFINITY;
        reps[i] = 0;
        if (res[i].state == CUBLAS_STATUS_SUCCESS && *best < 0)
            *best = i;
    }
    if (*best < 0 || got == 1)
        return 0;
    if ((rc = CU_CHECK(cd_drv.cuEventCreate(&e0, CU_EVENT_DEFAULT))) ||
        (rc = CU_CHECK(cd_drv.cuEventCreate(&e1, CU_EVENT_DEFAULT))))
        goto done;
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < got; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS)
                continue;
            g->algo = res[i].algo;
            if (round == 0) {          /* untimed first run, then an estimate */
                double est = lt_time_algo(g, e0, e1, 1);
                if (isnan(est)) {
                    rc = cd_last_call.status ? cd_last_call.status : CUDA_ERROR_UNKNOWN;
                    goto done;
                }
                if (isinf(est))
                    continue;
                est = lt_time_algo(g, e0, e1, 1);
                reps[i] = isfinite(est) && est > 0 ? (int)(LT_TIME_MS / est) : 1;
                reps[i] = reps[i] < 1 ? 1 : reps[i] > 1000 ? 1000 : reps[i];
                j->lt_tried++;
                continue;
            }
            if (!reps[i])
                continue;
            double t = lt_time_algo(g, e0, e1, reps[i]);
            if (isnan(t)) {
                rc = cd_last_call.status ? cd_last_call.status : CUDA_ERROR_UNKNOWN;
                goto done;
            }
            if (t < ms[i])
                ms[i] = t;
        }
    }
    int first = *best;
    for (int i = 0; i < got; i++)
        if (ms[i] < ms[*best])
            *best = i;
    if (!(ms[*best] < 0.99 * ms[first]))
        *best = first;
done:
    if (e0)
        cd_drv.cuEventDestroy(e0);
    if (e1)
        cd_drv.cuEventDestroy(e1);
    return rc;
}

/* Descriptors for cuBLASLt and the algorithm: the cached choice, or a new one. */
static int lt_prepare(gemm_op *g, gemm_job *j)
{
    int rc;
    cublasLtMatmulPreference_t pref = NULL;
    if ((rc = BLAS_CHECK(blas.cublasLtMatmulDescCreate(&g->desc, g->compute, CUDA_R_32F))) ||
        (rc = BLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&g->la, g->type, j->n, j->k, j->n))) ||
        (rc = BLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&g->lb, g->type, j->k, j->m, j->k))) ||
        (rc = BLAS_CHECK(blas.cublasLtMatrixLayoutCreate(&g->lc, g->type, j->n, j->m, j->n))))
        return rc;
    for (int i = 0; i < LT_CACHE; i++)
        if (lt_same(&lt_cache[i], j)) {
            g->algo = lt_cache[i].algo;
            return 0;
        }
    cublasLtMatmulHeuristicResult_t res[BENCH_LT_MAX_ALGOS];
    int want = j->lt_algos > BENCH_LT_MAX_ALGOS ? BENCH_LT_MAX_ALGOS : j->lt_algos;
    int got = 0, best = -1;
    uint64_t ws = g->ws_bytes;
    memset(res, 0, sizeof res);
    if ((rc = BLAS_CHECK(blas.cublasLtMatmulPreferenceCreate(&pref))) ||
        (rc = BLAS_CHECK(blas.cublasLtMatmulPreferenceSetAttribute(
             pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws))))
        goto done;
    if (j->disallow_reduced) {
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
    if ((rc = lt_pick(g, j, res, got, &best)))
        goto done;
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
    c->device = j->device;
    c->storage = j->storage;
    c->tf32 = j->tf32;
    c->disallow_reduced = j->disallow_reduced;
    c->lt_algos = j->lt_algos;
    c->m = j->m;
    c->n = j->n;
    c->k = j->k;
    c->ws_bytes = j->ws_bytes;
    c->algo = g->algo;
done:
    if (pref)
        blas.cublasLtMatmulPreferenceDestroy(pref);
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

/* ---------------------------------------------------------- the loops -- */

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
    double start = bench_now_ms();
    for (;;) {
        double t0 = bench_now_ms();
        for (int i = 0; i < batch; i++)
            if ((rc = run_gemm(g)))
                return rc;
        if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(g->stream))))
            return rc;
        double t1 = bench_now_ms();
        done += batch;
        j->est_ms = (t1 - t0) / batch;
        if (t1 - start >= j->warmup_ms && done >= 2)
            return 0;
        if (t1 - t0 < 20.0 && batch < 4096)
            batch *= 2;
    }
}

static int alloc_doubles(double **out, int n, gemm_job *j)
{
    *out = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    if (!*out) {
        j->host_oom = 1;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return 0;
}

/* A timing phase's n results, in two arrays, and the 2n events around them. */
static int alloc_phase(double **a, double **b, int n, CUevent **ev, gemm_job *j)
{
    int rc;
    if ((rc = alloc_doubles(a, n, j)) || (rc = alloc_doubles(b, n, j)))
        return rc;
    return bench_create_events(ev, 2 * n);
}

static int gemm_body(gemm_job *j)
{
    int rc;
    bench_dev *d = &bench_devs[j->device];
    gemm_op g;
    CUevent *ev = NULL, *lev = NULL;
    int n_ev = 0, n_lev = 0;
    memset(&g, 0, sizeof g);

    if ((rc = bench_ensure_stream(d)) || (rc = ensure_blas(d, j->ws_bytes)))
        return rc;
    if (j->flush_bytes && (rc = bench_ensure_flush(d, j->flush_bytes)))
        return rc;
    if ((rc = bench_ensure_operands(d, j->storage, j->m, j->n, j->k, j->seed, &j->host_oom)))
        return rc;

    int math = j->tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH;
    if (j->disallow_reduced)
        math |= CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    g.api = j->api;
    g.h = d->handle;
    g.type = bench_storage_type[j->storage];
    g.compute = j->tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    g.m = j->m;
    g.n = j->n;
    g.k = j->k;
    g.A = (const void *)(uintptr_t)d->a;
    g.B = (const void *)(uintptr_t)d->b;
    g.C = (void *)(uintptr_t)d->c;
    g.ws = (void *)(uintptr_t)d->workspace;
    g.ws_bytes = d->ws_bytes;
    g.stream = d->stream;

    if ((rc = BLAS_CHECK(blas.cublasSetMathMode(d->handle, (cublasMath_t)math))))
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
    if ((rc = alloc_phase(&j->gpu_ms, &j->call_ms, j->n_samples, &ev, j)))
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
        double t0 = bench_now_ms();
        if ((rc = run_gemm(&g)))
            goto done;
        double t1 = bench_now_ms();
        if ((rc = CU_CHECK(cd_drv.cuEventRecord(ev[2 * i + 1], d->stream))))
            goto done;
        if (j->sync_each) {
            if ((rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
                goto done;
            t1 = bench_now_ms();
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
    if ((rc = alloc_phase(&j->loop_wall_ms, &j->loop_gpu_ms, j->repeats, &lev, j)))
        goto done;
    for (int r = 0; r < j->repeats; r++) {
        if ((rc = CU_CHECK(cd_drv.cuEventRecord(lev[2 * r], d->stream))))
            goto done;
        double t0 = bench_now_ms();
        for (int i = 0; i < j->n_loop; i++) {
            if ((rc = run_gemm(&g)))
                goto done;
            if (j->sync_each && (rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
                goto done;
        }
        if ((rc = CU_CHECK(cd_drv.cuEventRecord(lev[2 * r + 1], d->stream))) ||
            (rc = CU_CHECK(cd_drv.cuStreamSynchronize(d->stream))))
            goto done;
        j->loop_wall_ms[r] = (bench_now_ms() - t0) / j->n_loop;
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
    bench_destroy_events(ev, n_ev);
    bench_destroy_events(lev, n_lev);
    lt_release(&g);
    return rc;
}

static const char *failed_where(int rc, const gemm_job *j)
{
    if (j->host_oom)
        return "host";
    if (cd_last_call.status == rc && cd_last_call.lib)
        return cd_last_call.lib;
    return "cuda";
}

/*
 * _core.gemm(*, m, n, k, storage, tf32, disallow_reduced, device, api,
 *            sync_each, flush_bytes, workspace_bytes, warmup_s, samples,
 *            min_samples, max_samples, sample_ms, repeats, loop_n, loop_ms,
 *            check, seed, lt_algos)            every keyword required
 *
 * storage: code from gemm_types() (0 fp32, 1 fp16, 2 bf16). tf32: fp32 on
 * TF32 tensor cores (CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_TF32_TENSOR_OP_MATH).
 * disallow_reduced: CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION (cuBLASLt:
 * split-k reduction in the compute type only). api: 0 cublasGemmEx, 1
 * cublasLtMatmul (lt_algos: 1 = the heuristic's choice; more = timed, see
 * lt_pick). samples / loop_n = 0: chosen from the warm-up's time per GEMM
 * (sample_ms of samples within [min_samples, max_samples]; loop_ms per loop).
 *
 * Returns (0, None, gpu_ms, call_ms, loop_wall_ms, loop_gpu_ms, est_ms,
 *          loop_n, lt_tried, cublas_version, check)
 *   gpu_ms, call_ms: float64[samples]; loop_*: float64[repeats] (per GEMM);
 *   milliseconds, arrays that own the C buffers they were measured into;
 *   check: None or (A, B, C) host copies (float32, or uint16 bits of
 *   fp16/bf16), shapes (m, k), (k, n), (m, n).
 * or, on failure, (status, "cuda" | "cublas" | "host" (malloc failed) |
 * "unsupported" (no cuBLASLt)); _core.last_call() says which call failed.
 */
PyObject *cd_py_gemm(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"m", "n", "k", "storage", "tf32", "disallow_reduced", "device",
                             "api", "sync_each", "flush_bytes", "workspace_bytes", "warmup_s",
                             "samples", "min_samples", "max_samples", "sample_ms", "repeats",
                             "loop_n", "loop_ms", "check", "seed", "lt_algos", NULL};
    gemm_job j;
    memset(&j, 0, sizeof j);
    Py_ssize_t flush_bytes, ws_bytes;
    double warmup_s;
    int check;
    if (bench_keywords_only("gemm", args) < 0)
        return NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "iiiippiipnndiiidiidpKi", kwlist, &j.m, &j.n,
                                     &j.k, &j.storage, &j.tf32, &j.disallow_reduced, &j.device,
                                     &j.api, &j.sync_each, &flush_bytes, &ws_bytes, &warmup_s,
                                     &j.samples, &j.min_samples, &j.max_samples, &j.sample_ms,
                                     &j.repeats, &j.loop_n, &j.loop_ms, &check, &j.seed,
                                     &j.lt_algos))
        return NULL;
    /* memory safety only: policy (sizes, dtypes, counts) is checked in Python */
    if (j.m <= 0 || j.n <= 0 || j.k <= 0 || j.storage < 0 || j.storage >= ST_COUNT ||
        (j.tf32 && j.storage != ST_fp32) || j.device < 0 || j.device >= BENCH_MAX_DEVICES ||
        (j.api != API_GEMMEX && j.api != API_LT) || j.repeats < 1 ||
        j.repeats > BENCH_MAX_SAMPLES || j.samples < 0 || j.loop_n < 0 ||
        j.min_samples < 1 || j.max_samples < j.min_samples || j.max_samples > BENCH_MAX_SAMPLES ||
        j.lt_algos < 1 || flush_bytes < 0 || ws_bytes < 0 || !(warmup_s >= 0) ||
        !(j.sample_ms >= 0) || !(j.loop_ms >= 0)) {
        PyErr_SetString(PyExc_ValueError, "gemm: argument out of range");
        return NULL;
    }
    j.flush_bytes = (size_t)flush_bytes & ~(size_t)3;
    j.ws_bytes = (size_t)ws_bytes;
    j.warmup_ms = warmup_s * 1e3;
    if (bench_numpy_ready() < 0 || bind_cublas() < 0)
        return NULL;
    if (j.api == API_LT && !blas.lt_bound)
        return Py_BuildValue("(is)", CUBLAS_STATUS_NOT_SUPPORTED, "unsupported");

    CUcontext ctx = NULL, popped;
    int rc = bench_context(j.device, &ctx);
    if (rc)
        return Py_BuildValue("(is)", rc, "cuda");

    PyObject *chk[3] = {NULL, NULL, NULL};
    if (check) {
        int typenum = bench_storage_bytes[j.storage] == 4 ? NPY_FLOAT32 : NPY_UINT16;
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
    bench_devs_init_once();
    rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc == 0) {
        rc = gemm_body(&j);
        cd_drv.cuCtxPopCurrent(&popped);
    }
    pthread_mutex_unlock(&bench_lock);
    Py_END_ALLOW_THREADS

    PyObject *r = NULL;
    if (rc) {
        r = Py_BuildValue("(is)", rc, failed_where(rc, &j));
        free(j.gpu_ms);
        free(j.call_ms);
        free(j.loop_wall_ms);
        free(j.loop_gpu_ms);
    } else {
        /* each call hands its buffer to NumPy (or frees it) */
        PyObject *g = bench_samples(j.gpu_ms, j.n_samples);
        PyObject *c = bench_samples(j.call_ms, j.n_samples);
        PyObject *lw = bench_samples(j.loop_wall_ms, j.repeats);
        PyObject *lg = bench_samples(j.loop_gpu_ms, j.repeats);
        PyObject *ck;
        if (check) {
            ck = Py_BuildValue("(OOO)", chk[0], chk[1], chk[2]);
        } else {
            Py_INCREF(Py_None);
            ck = Py_None;
        }
        if (g && c && lw && lg && ck)
            r = Py_BuildValue("(iOOOOOdiiiO)", 0, Py_None, g, c, lw, lg, j.est_ms, j.n_loop,
                              j.lt_tried, blas.version, ck);
        Py_XDECREF(g);
        Py_XDECREF(c);
        Py_XDECREF(lw);
        Py_XDECREF(lg);
        Py_XDECREF(ck);
    }
    for (int i = 0; i < 3; i++)
        Py_XDECREF(chk[i]);
    return r;
}
