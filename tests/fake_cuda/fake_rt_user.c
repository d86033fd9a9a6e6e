/*
 * fake_rt_user.c: a library with kernels, as nvcc builds them (libtorch_cuda.so,
 * an extension): each launch is a call of the runtime's __cudaLaunchKernel
 * through this library's GOT, with the primary context current (the runtime
 * keeps it so from cudaSetDevice on).
 */
#include "fake_common.h"

#include <stdint.h>

typedef struct {
    unsigned x, y, z;
} fake_dim3;

int __cudaLaunchKernel(void *kernel, fake_dim3 grid, fake_dim3 block, void **args, size_t shmem,
                       void *stream);
void *fake_function(const char *name);

/* Written at every call (.data, next to .got.plt in this small library): a
 * page the launch hooks wrote must still take the library's own writes. */
static volatile long calls = 1;

/* `name` on `stream` (0: the legacy stream), n times; the first error, else 0. */
FAKE_EXPORT int fake_rt_launch(const char *name, uintptr_t stream, long n)
{
    CUcontext c = NULL, popped;
    calls++;
    cuDevicePrimaryCtxRetain(&c, 0);
    cuCtxPushCurrent(c);
    int rc = 0;
    for (long i = 0; i < n && !rc; i++) {
        fake_dim3 g = {1, 1, 1}, b = {32, 1, 1};
        rc = __cudaLaunchKernel(fake_function(name), g, b, NULL, 0, (void *)stream);
    }
    cuCtxPopCurrent(&popped);
    return rc;
}

/* 1 + how often fake_rt_launch ran; its address (where the library writes). */
FAKE_EXPORT long fake_rt_calls(void) { return calls; }
FAKE_EXPORT void *fake_rt_data(void) { return (void *)&calls; }
