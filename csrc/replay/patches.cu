// replay/patches.cu: the device functions the Sanitizer API calls before each
// memory access of the one instrumented launch (replay/sanitizer.c patches only
// that launch's module). Built by tools/gen/replay_patches.py (nvcc
// --compile-as-tools-patch, once, by a developer) into replay/patches_fatbin.h,
// so that installing cuda_debug needs no nvcc.
//
// An access outside every valid range, or misaligned, is recorded (address, size, read/write,
// thread, block, pc) and its warp is exited (SANITIZER_PATCH_ERROR) when the
// state says so: the fault never happens, the context stays usable, and the
// host reads the records after the launch.
#define CD_CHECK_FN static __device__ __forceinline__
#include "check.h"

#define PATCH_SUCCESS 0            // SanitizerPatchResult
#define PATCH_ERROR 1              // the whole warp exits

static __device__ int bad(cd_replay_state *s, uint64_t pc, uint64_t a, uint32_t size,
                          uint32_t flags, uint32_t space)
{
    unsigned long long i = atomicAdd(&s->n_bad, 1ULL);
    if (i < s->max_records) {
        cd_replay_access *r = &s->records[i];
        r->address = a;
        r->pc = pc;
        r->size = size;
        r->flags = flags;
        r->space = space;
        r->order = (uint32_t)i;
        r->thread[0] = threadIdx.x; r->thread[1] = threadIdx.y; r->thread[2] = threadIdx.z;
        r->block[0] = blockIdx.x; r->block[1] = blockIdx.y; r->block[2] = blockIdx.z;
        __threadfence_system();
    }
    return s->exit_warp ? PATCH_ERROR : PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ int
cd_replay_global(void *ud, uint64_t pc, void *ptr, uint32_t size, uint32_t flags, const void *)
{
    cd_replay_state *s = (cd_replay_state *)ud;
    if (!s)
        return PATCH_SUCCESS;
    if (s->count)
        atomicAdd(&s->n_checked, 1ULL);
    uint64_t a = (uint64_t)(uintptr_t)ptr;
    if (!cd_replay_inside(s, a, size))
        return bad(s, pc, a, size, flags, CD_SPACE_GLOBAL);
    if (cd_replay_misaligned(a, size))
        return bad(s, pc, a, size, flags, CD_SPACE_GLOBAL | CD_BAD_MISALIGNED);
    return PATCH_SUCCESS;
}

extern "C" __device__ __noinline__ int
cd_replay_shared(void *ud, uint64_t pc, void *ptr, uint32_t size, uint32_t flags, const void *)
{
    cd_replay_state *s = (cd_replay_state *)ud;
    if (!s || !s->shared_limit)
        return PATCH_SUCCESS;
    uint64_t a = (uint64_t)(uintptr_t)ptr;
    if (a + size <= s->shared_limit)
        return PATCH_SUCCESS;
    return bad(s, pc, a, size, flags, CD_SPACE_SHARED);
}

// cp.async (global -> shared): the global source is checked; zfill bytes are
// not read (a masked load of zeros reads nothing).
extern "C" __device__ __noinline__ int
cd_replay_async_copy(void *ud, uint64_t pc, void *src, uint32_t dst, uint32_t size,
                     uint32_t zfill)
{
    cd_replay_state *s = (cd_replay_state *)ud;
    if (!s || !src || zfill >= size)
        return PATCH_SUCCESS;
    uint64_t a = (uint64_t)(uintptr_t)src;
    if (cd_replay_inside(s, a, size - zfill))
        return PATCH_SUCCESS;
    return bad(s, pc, a, size - zfill, CD_ACCESS_READ, CD_SPACE_ASYNC_COPY);
}
