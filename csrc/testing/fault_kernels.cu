// Kernels that fault on purpose, for cuda_debug.testing and the test suite.
// Built to PTX by tools/gen/fault_kernels.py (nvcc, once, by a developer); the
// PTX is embedded in csrc/testing/fault_kernels_ptx.h so users need no nvcc.
// NDEBUG must stay undefined here: it would compile the assert away.
#undef NDEBUG
#include <assert.h>      /* assert */

namespace cuda_debug_testing {

// Device assert (710): thread i checks idx[i] is a valid class index.
template <typename T>
__global__ void check_index(const T *idx, int n, T limit) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) assert(idx[i] >= 0 && idx[i] < limit);
}
template __global__ void check_index<int>(const int *, int, int);

// Illegal address (700): store through a pointer nothing maps.
__global__ void write_wild(int *base, long long offset) {
    if (threadIdx.x == 0) base[offset] = 1;
}

// Trap (719, unspecified launch failure).
__global__ void trap() { __trap(); }

// Misaligned address (716): a 4-byte store one byte past an aligned pointer.
__global__ void write_misaligned(char *p) {
    if (threadIdx.x == 0) *reinterpret_cast<volatile int *>(p + 1) = 1;
}

// Harmless kernels: nothing, a busy wait, an increment.
__global__ void empty() {}

__global__ void spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}

__global__ void add_one(int *p, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) p[i] += 1;
}

}  // namespace cuda_debug_testing
