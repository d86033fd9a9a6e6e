/*
 * bench/bench.h: what the benchmark's C files share (and nothing else includes).
 *
 *   bench_buffers.c   per-device slots (stream, L2-flush buffer, random
 *                     operands), the lock, sample arrays handed to NumPy,
 *                     bench_release / mem_info / gemm_types
 *   gemm_loops.c      cuBLAS / cuBLASLt binding, handles, the GEMM timing loops
 *   launch_latency.c  empty-kernel launch timing loops
 *
 * The C side runs what Python tells it and returns raw samples (NumPy float64
 * arrays that own their C buffer) and plain scalars. Every keyword argument of
 * the Python-facing functions is required: defaults, validation of policy,
 * units and the result schema live in cuda_debug/bench/ only.
 */
#ifndef CUDA_DEBUG_BENCH_H
#define CUDA_DEBUG_BENCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>      /* the C API: PyObject, PyArg_ParseTuple... */

#include "bench/bench_api.h"     /* the bench functions _core binds */
#include "testing/testing.h"     /* cd_fault_kernel (the empty kernel) */

#ifndef BENCH_DEFINE_ARRAY_API
#define NO_IMPORT_ARRAY
#endif
#define PY_ARRAY_UNIQUE_SYMBOL cd_ARRAY_API
#include <numpy/arrayobject.h>   /* PyArray_SimpleNew, PyArray_DATA */

/* cuBLAS and cuBLASLt come with the rest of the CUDA declarations, in
 * base/cuda_api.h (through base.h). */

#define BENCH_MAX_DEVICES 64
#define BENCH_MAX_SAMPLES 1000000
#define BENCH_MAX_LOOP_N 1000000

/* Operand storage types: the one table of element types and sizes. Python
 * reads it through _core.gemm_types() (storage code = position). Whether
 * fp32 storage runs on TF32 tensor cores is not a storage type: Python
 * decides it and passes tf32=True. */
#define BENCH_STORAGE_TYPES(X)                                                  \
    X(fp32, CUDA_R_32F, 4)                                                      \
    X(fp16, CUDA_R_16F, 2)                                                      \
    X(bf16, CUDA_R_16BF, 2)

#define BENCH_ST_ENUM(name, type, bytes) ST_##name,
enum { BENCH_STORAGE_TYPES(BENCH_ST_ENUM) ST_COUNT };
#undef BENCH_ST_ENUM

extern const cudaDataType bench_storage_type[ST_COUNT];
extern const size_t bench_storage_bytes[ST_COUNT];

/*
 * One slot per device, created on first use and kept for the life of the
 * process (like PyTorch's cuBLAS handle pool: the primary context outlives
 * them). Every field of every slot is protected by bench_lock, which a timing
 * call takes after releasing the GIL and holds for the whole call.
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
    int storage;                /* ST_*, -1 none */
    int m, n, k;
    unsigned long long seed;
} bench_dev;

extern pthread_mutex_t bench_lock;
extern bench_dev bench_devs[BENCH_MAX_DEVICES];

/* bench_buffers.c; all but the Python-facing ones need bench_lock held and the
 * device's context current. */
void bench_devs_init_once(void);
double bench_now_ms(void);
int bench_ensure_stream(bench_dev *d);
int bench_ensure_flush(bench_dev *d, size_t bytes);
/* A, B random (seeded), C zero, for an m x k @ k x n problem in `storage`;
 * reused while unchanged. Sets *host_oom when malloc failed. */
int bench_ensure_operands(bench_dev *d, int storage, int m, int n, int k,
                          unsigned long long seed, int *host_oom);
int bench_create_events(CUevent **out, int n);
void bench_destroy_events(CUevent *ev, int n);
/* The primary context of `device` (0 <= device < BENCH_MAX_DEVICES). */
int bench_context(int device, CUcontext *ctx);
/* NumPy's C API, imported on first use (import cuda_debug never needs it). */
int bench_numpy_ready(void);
/* float64[n] NumPy array that owns `buf` (freed by a capsule, its base
 * object); buf is freed here on failure. NULL with an exception set. */
PyObject *bench_samples(double *buf, Py_ssize_t n);
/* -1 with TypeError when positional arguments were given: keywords only. */
int bench_keywords_only(const char *fn, PyObject *args);

#endif
