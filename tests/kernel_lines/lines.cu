// A kernel with a known line table: built with nvcc -lineinfo -cubin -arch=sm_90.
__device__ __forceinline__ void put(float *p, int i, float v)
{
    p[i] = v;                                   // line 4: the store, inlined
}

extern "C" __global__ void write_at(float *p, int n, int k)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        put(p, i * k, 1.0f);                    // line 11: the call
}

extern "C" __global__ void read_at(const float *p, float *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = p[i * 7] * 2.0f;               // line 18
}
