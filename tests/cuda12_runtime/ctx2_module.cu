// A module for a second context (tests/hooks/test_cuda12_runtime.py,
// benchmarks/second_context.py): loaded with cuModuleLoad, launched with
// cuLaunchKernel. extern "C": found by these names. Built by build.sh (cubin, sm_90).
#include <assert.h>

extern "C" __global__ void ctx2_scale(float *x, int n, float a)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * a + 1.0f;
}

extern "C" __global__ void ctx2_check_index(int idx, int n)
{
    if (blockIdx.x == 0 && threadIdx.x == 0)
        assert(idx >= 0 && idx < n);
}

extern "C" __global__ void ctx2_empty(void) {}
