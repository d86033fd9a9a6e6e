/*
 * fake_launch.c: Kernel launches (cuLaunchKernel*, cooperative, Ex), graph
 * launches, modules.
 * Part of the fake libcuda.so.1: fake_driver.h says what it emulates.
 */
#include "fake_driver.h"

/* ------------------------------------------------ driver: launches ----- */

typedef struct {
    fake_func *fn;
    fake_stream *s;
    CUstream h;
    unsigned grid[3], block[3];
    void **kernelParams;
    fake_graph *graph;
} launch_arg;

static CUresult launch_body(void *a)
{
    launch_arg *L = a;
    atomic_fetch_add(&st_launch_calls, 1);
    if (!current_ctx())
        return CUDA_ERROR_INVALID_CONTEXT;
    int st = current_sticky();
    if (st)
        return (CUresult)st;
    if (!L->s)
        return CUDA_ERROR_INVALID_HANDLE;
    op *o = calloc(1, sizeof *o);
    if (L->graph) {
        if (L->graph->magic != MAGIC_GRAPH) {
            free(o);
            return CUDA_ERROR_INVALID_HANDLE;
        }
        o->kind = OP_GRAPH;
        o->graph = L->graph;
    } else {
        if (!L->fn || L->fn->magic != MAGIC_FUNC) {
            free(o);
            return CUDA_ERROR_INVALID_HANDLE;
        }
        unsigned long long threads = (unsigned long long)L->block[0] * L->block[1] * L->block[2];
        if (threads == 0 || threads > 1024 || !L->grid[0] || !L->grid[1] || !L->grid[2]) {
            free(o);
            atomic_fetch_add(&st_refused, 1);
            return CUDA_ERROR_INVALID_VALUE;   /* refused, not sticky */
        }
        o->kind = OP_KERNEL;
        o->fn = L->fn;
        memcpy(o->grid, L->grid, sizeof o->grid);
        memcpy(o->block, L->block, sizeof o->block);
        pthread_mutex_lock(&dev_lock);
        o->cfg = lookup_cfg(L->fn->name);
        pthread_mutex_unlock(&dev_lock);
        if (L->kernelParams && L->kernelParams[0] && strstr(L->fn->name, "spin") &&
            o->cfg->code == 0)
            o->extra_ns = *(long long *)L->kernelParams[0];   /* spin(ns) */
        if (L->kernelParams && !strcmp(L->fn->name, "cd_graph_marker")) {
            /* cuda_debug's marker kernel (csrc/capture/graph_capture.c): stores v at p */
            o->addr = (volatile uint32_t *)(uintptr_t)*(CUdeviceptr *)L->kernelParams[0];
            o->value = *(uint32_t *)L->kernelParams[1];
        }
    }
    pthread_mutex_lock(&dev_lock);
    int captured = L->graph ? 0 : capture_append(L->s, o);   /* o is freed on -1 */
    if (captured > 0)
        atomic_fetch_add(&st_captured, 1);    /* recorded into the graph, not run */
    else if (!captured)
        enqueue(L->s, o);
    pthread_mutex_unlock(&dev_lock);
    return captured < 0 ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

static void fill_launch(launch_arg *L, CUfunction f, CUstream h, unsigned gx, unsigned gy,
                        unsigned gz, unsigned bx, unsigned by, unsigned bz, void **kp)
{
    memset(L, 0, sizeof *L);
    L->fn = (fake_func *)f;
    L->h = h;
    L->s = resolve(h);
    L->grid[0] = gx, L->grid[1] = gy, L->grid[2] = gz;
    L->block[0] = bx, L->block[1] = by, L->block[2] = bz;
    L->kernelParams = kp;
}

static const char *fn_name(CUfunction f)
{
    fake_func *fn = (fake_func *)f;
    return fn && fn->magic == MAGIC_FUNC ? fn->name : NULL;
}

#define LAUNCH_KERNEL_IMPL(NAME, CBID, PTYPE)                                              \
    CUresult CUDAAPI NAME(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,      \
                          unsigned int gridDimZ, unsigned int blockDimX,                   \
                          unsigned int blockDimY, unsigned int blockDimZ,                  \
                          unsigned int sharedMemBytes, CUstream hStream,                   \
                          void **kernelParams, void **extra)                               \
    {                                                                                      \
        PTYPE p = {f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,       \
                   sharedMemBytes, hStream, kernelParams, extra};                          \
        launch_arg L;                                                                      \
        fill_launch(&L, f, hStream, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,    \
                    blockDimZ, kernelParams);                                              \
        return traced(CBID, #NAME, &p, fn_name(f), launch_body, &L);                       \
    }

LAUNCH_KERNEL_IMPL(cuLaunchKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, cuLaunchKernel_params)
CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                                     unsigned, unsigned, CUstream, void **, void **);
LAUNCH_KERNEL_IMPL(cuLaunchKernel_ptsz, CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
                   cuLaunchKernel_ptsz_params)

#define LAUNCH_COOP_IMPL(NAME, CBID, PTYPE)                                                \
    CUresult CUDAAPI NAME(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,      \
                          unsigned int gridDimZ, unsigned int blockDimX,                   \
                          unsigned int blockDimY, unsigned int blockDimZ,                  \
                          unsigned int sharedMemBytes, CUstream hStream,                   \
                          void **kernelParams)                                             \
    {                                                                                      \
        PTYPE p = {f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,       \
                   sharedMemBytes, hStream, kernelParams};                                 \
        launch_arg L;                                                                      \
        fill_launch(&L, f, hStream, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY,    \
                    blockDimZ, kernelParams);                                              \
        return traced(CBID, #NAME, &p, fn_name(f), launch_body, &L);                       \
    }

LAUNCH_COOP_IMPL(cuLaunchCooperativeKernel, CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
                 cuLaunchCooperativeKernel_params)
CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction, unsigned, unsigned, unsigned,
                                                unsigned, unsigned, unsigned, unsigned,
                                                CUstream, void **);
LAUNCH_COOP_IMPL(cuLaunchCooperativeKernel_ptsz,
                 CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
                 cuLaunchCooperativeKernel_ptsz_params)

static CUresult launch_ex(CUpti_CallbackId cbid, const char *api, const CUlaunchConfig *config,
                          CUfunction f, void **kernelParams, void **extra)
{
    cuLaunchKernelEx_params p = {config, f, kernelParams, extra};
    launch_arg L;
    if (!config)
        RET(api, CUDA_ERROR_INVALID_VALUE);
    fill_launch(&L, f, config->hStream, config->gridDimX, config->gridDimY, config->gridDimZ,
                config->blockDimX, config->blockDimY, config->blockDimZ, kernelParams);
    return traced(cbid, api, &p, fn_name(f), launch_body, &L);
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                                  void **extra)
{
    return launch_ex(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, "cuLaunchKernelEx", config, f,
                     kernelParams, extra);
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *, CUfunction, void **, void **);
CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                       void **kernelParams, void **extra)
{
    return launch_ex(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz, "cuLaunchKernelEx_ptsz",
                     config, f, kernelParams, extra);
}

static CUresult graph_launch(CUpti_CallbackId cbid, const char *api, CUgraphExec g, CUstream h)
{
    cuGraphLaunch_params p = {g, h};
    launch_arg L;
    memset(&L, 0, sizeof L);
    L.h = h;
    L.s = resolve(h);
    L.graph = (fake_graph *)g;
    if (!g)
        RET(api, CUDA_ERROR_INVALID_VALUE);
    return traced(cbid, api, &p, NULL, launch_body, &L);
}

CUresult CUDAAPI cuGraphLaunch(CUgraphExec g, CUstream h)
{
    return graph_launch(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, "cuGraphLaunch", g, h);
}

CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec g, CUstream h);
CUresult CUDAAPI cuGraphLaunch_ptsz(CUgraphExec g, CUstream h)
{
    return graph_launch(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz, "cuGraphLaunch_ptsz", g, h);
}

/* ------------------------------------------------ driver: modules ------ */

fake_func *function_named(const char *name)   /* dev_lock held */
{
    for (fake_func *f = funcs; f; f = f->next)
        if (!strcmp(f->name, name))
            return f;
    fake_func *f = calloc(1, sizeof *f);
    f->magic = MAGIC_FUNC;
    f->name = strdup(name);
    f->next = funcs;
    funcs = f;
    return f;
}

CUresult CUDAAPI cuModuleLoadData(CUmodule *mod, const void *image)
{
    (void)image;
    ALIVE("cuModuleLoadData");
    *mod = (CUmodule)(void *)&the_module;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleUnload(CUmodule mod)
{
    (void)mod;
    fire_resource(CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING, NULL);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction *hfunc, CUmodule mod, const char *name)
{
    ALIVE("cuModuleGetFunction");
    if (!mod || !name)
        RET("cuModuleGetFunction", CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&dev_lock);
    *hfunc = (CUfunction)(void *)function_named(name);
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}
