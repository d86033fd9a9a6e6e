import cupy as cp, os, sys
src = r'''
extern "C" __global__ void barrier_wait(float *out, long long cycles)
{
    float acc = 0.0f;
    if (threadIdx.x >= 64) {
        long long t0 = clock64();
        while (clock64() - t0 < cycles) {
            acc += 1.0f;
        }
    }
    __syncthreads();
    out[threadIdx.x] = acc;
}
'''
k = cp.RawKernel(src, "barrier_wait", options=("-lineinfo",))
out = cp.zeros(256, dtype=cp.float32)
k((2,), (128,), (out, cp.int64(int(sys.argv[1]) * 1_800_000_000)))
open(sys.argv[2], "w").write(str(os.getpid()))
cp.cuda.Device().synchronize()
print("barrier done")
