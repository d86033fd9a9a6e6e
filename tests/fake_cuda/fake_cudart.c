/*
 * fake_cudart.c: the one entry point of the CUDA runtime that nvcc's launch
 * stubs call (CUDA >= 12.4: `<<<...>>>` becomes __cudaLaunchKernel(kernel,
 * grid, block, args, shmem, stream)), over the fake driver, as the real
 * runtime does: the kernel handle is the driver's, the launch a
 * cuLaunchKernel (CUPTI's callback fires for it).
 *
 * fake_rt_user.c is the library that calls it the way libtorch_cuda.so does,
 * through its GOT: what cuda_debug's launch hooks (csrc/hooks/runtime_launch.c)
 * point at their own function while a watch() is open.
 */
#include "fake_common.h"

#include <stdatomic.h>

typedef struct {
    unsigned x, y, z;
} fake_dim3;

static atomic_long runtime_calls;

FAKE_EXPORT int __cudaLaunchKernel(void *kernel, fake_dim3 grid, fake_dim3 block, void **args,
                                   size_t shmem, void *stream)
{
    atomic_fetch_add(&runtime_calls, 1);
    return (int)cuLaunchKernel((CUfunction)kernel, grid.x, grid.y, grid.z, block.x, block.y,
                               block.z, (unsigned)shmem, (CUstream)stream, args, NULL);
}

/* How often the runtime's own function ran (not the hook's). */
FAKE_EXPORT long fake_runtime_calls(void) { return atomic_load(&runtime_calls); }
