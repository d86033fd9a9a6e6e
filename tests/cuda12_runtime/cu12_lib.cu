// A library built as an extension built against CUDA 12's shared runtime is:
// each <<<...>>> a call of libcudart.so.12's __cudaLaunchKernel (CUDA >= 12.4:
// the handle a cudaKernel_t, i.e. a CUkernel, from __cudaGetKernel) through
// this library's GOT. Loaded with ctypes beside a CUDA 13 PyTorch by
// tests/hooks/test_cuda12_runtime.py; built by build.sh.
#include <assert.h>
#include <cuda_runtime.h>

__global__ void cu12_scale(float *x, int n, float a)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * a + 1.0f;
}

__global__ void cu12_check_index(const float *x, int n, int idx)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        assert(idx >= 0 && idx < n);   // idx = n + 7 on demand: a device-side assert
        if (idx < n)
            (void)x[idx];
    }
}

__global__ void cu12_poke(float *x, long long off)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        x[off] = 1.0f;                  // off far past the allocation: an illegal address
}

extern "C" int cu12_runtime_version(void)
{
    int v = 0;
    return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : -1;
}

// x[i] = x[i] * a + 1 for i < n, on `stream` (0: the legacy stream); the launch's error.
extern "C" int cu12_scale_launch(float *x, int n, float a, void *stream)
{
    cu12_scale<<<(n + 255) / 256, 256, 0, (cudaStream_t)stream>>>(x, n, a);
    return (int)cudaGetLastError();
}

// mode 1: an out-of-bounds device assert; 2: an illegal address. The launch's error.
extern "C" int cu12_fault(int mode, float *x, int n, void *stream)
{
    if (mode == 1)
        cu12_check_index<<<1, 32, 0, (cudaStream_t)stream>>>(x, n, n + 7);
    else
        cu12_poke<<<1, 32, 0, (cudaStream_t)stream>>>(x, 1ll << 40);
    return (int)cudaGetLastError();
}

extern "C" int cu12_sync(void) { return (int)cudaDeviceSynchronize(); }

// Memory through this runtime (in the thread's current context: a second
// context's when one is current), and a stream of it; NULL / an error code.
extern "C" void *cu12_alloc(size_t bytes)
{
    void *p = NULL;
    return cudaMalloc(&p, bytes) == cudaSuccess ? p : NULL;
}
extern "C" int cu12_free(void *p) { return (int)cudaFree(p); }
extern "C" int cu12_h2d(void *dst, const void *src, size_t bytes)
{
    return (int)cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
}
extern "C" int cu12_d2h(void *dst, const void *src, size_t bytes)
{
    return (int)cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
}
extern "C" void *cu12_stream(void)
{
    cudaStream_t s = NULL;
    return cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess ? (void *)s : NULL;
}
