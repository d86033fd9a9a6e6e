/*
 * replay/sanitizer_api.h: the part of NVIDIA's Compute Sanitizer API (sanitizer.h,
 * shipped with the CUDA toolkit and the nvidia-cuda-sanitizer-api wheel) that
 * replay/ uses, so that building cuda_debug needs neither; libsanitizer-public.so
 * is opened at run time. Written from the CUDA 13.0 headers (Compute Sanitizer
 * 2025.3); the structs are only the parts that are the same in 13.0 and 13.5
 * (Sanitizer_LaunchData, _CallbackData, _ResourceMemoryData, _ResourceModuleData,
 * _ResourceVirtualRange; _ResourceContextData and _ResourceStreamData changed in
 * between and are not read). tests/replay/test_replay.py compiles offset and value
 * checks of every declaration here against the real headers where they are found.
 * CUDA types come from base/cuda_api.h; the ones it lacks are void * here.
 */
#ifndef CD_REPLAY_SANITIZER_API_H
#define CD_REPLAY_SANITIZER_API_H

#include "base/cuda_api.h"

/* CD_SANITIZER_HEADERS_TEXT (replay/replay.h) names these headers. */

typedef int SanitizerResult;               /* 0: SANITIZER_SUCCESS */
#define CD_SANITIZER_SUCCESS 0
#define CD_SANITIZER_ERROR_NOT_INITIALIZED 13
#define CD_SANITIZER_ERROR_NOT_COMPATIBLE 12

/* Sanitizer_CallbackDomain */
enum {
    CD_SAN_DOMAIN_DRIVER_API = 1,
    CD_SAN_DOMAIN_RESOURCE = 3,
    CD_SAN_DOMAIN_LAUNCH = 5,
    CD_SAN_DOMAIN_GRAPHS = 10,
};
/* Sanitizer_ApiCallbackSite */
enum { CD_SAN_API_ENTER = 0, CD_SAN_API_EXIT = 1 };
/* Sanitizer_CallbackIdResource */
enum {
    CD_SAN_RESOURCE_MODULE_LOADED = 9,
    CD_SAN_RESOURCE_MODULE_UNLOAD_STARTING = 10,
    CD_SAN_RESOURCE_DEVICE_MEMORY_ALLOC = 11,
    CD_SAN_RESOURCE_DEVICE_MEMORY_FREE = 12,
    CD_SAN_RESOURCE_HOST_MEMORY_ALLOC = 13,
    CD_SAN_RESOURCE_HOST_MEMORY_FREE = 14,
    CD_SAN_RESOURCE_MEMORY_ALLOC_ASYNC = 15,
    CD_SAN_RESOURCE_MEMORY_FREE_ASYNC = 16,
    CD_SAN_RESOURCE_VIRTUAL_RESERVE = 26,
    CD_SAN_RESOURCE_VIRTUAL_RELEASE = 27,
};
/* Sanitizer_CallbackIdLaunch */
enum { CD_SAN_LAUNCH_BEGIN = 1, CD_SAN_LAUNCH_END = 3 };
/* Sanitizer_CallbackIdGraphs */
enum { CD_SAN_GRAPHS_LAUNCH_BEGIN = 6 };
/* Sanitizer_InstructionId */
enum {
    CD_SAN_INSTRUCTION_GLOBAL_MEMORY_ACCESS = 3,
    CD_SAN_INSTRUCTION_SHARED_MEMORY_ACCESS = 4,
    CD_SAN_INSTRUCTION_MEMCPY_ASYNC = 14,
};
/* Sanitizer_ResourceMemoryFlags */
enum { CD_SAN_MEMORY_FLAG_MODULE = 0x1, CD_SAN_MEMORY_FLAG_MANAGED = 0x2 };

/* The driver-API launch callbacks (sanitizer_driver_cbid.h; CUPTI's numbers),
 * named in strings: the names are cuda.h's, which base/cuda_api.h must not pull in. */
#define CD_SAN_LAUNCH_CBIDS(X)                                                  \
    X("cuLaunchKernel", 307) X("cuLaunchKernel_ptsz", 442)                      \
    X("cuLaunchKernelEx", 652) X("cuLaunchKernelEx_ptsz", 653)                  \
    X("cuLaunchCooperativeKernel", 477) X("cuLaunchCooperativeKernel_ptsz", 478)
/* ... and the waits a framework makes after a launch (they fail too once a bad
 * access was found, as they would on a dead context). */
#define CD_SAN_SYNC_CBIDS(X)                                                    \
    X("cuCtxSynchronize", 17) X("cuCtxSynchronize_v2", 800)                     \
    X("cuStreamSynchronize", 126) X("cuStreamSynchronize_ptsz", 440)            \
    X("cuEventSynchronize", 121)

typedef struct Sanitizer_Subscriber_st *Sanitizer_SubscriberHandle;
typedef struct Sanitizer_Stream_st *Sanitizer_StreamHandle;
typedef struct Sanitizer_Launch_st *Sanitizer_LaunchHandle;
typedef void (*Sanitizer_CallbackFunc)(void *userdata, int domain, uint32_t cbid,
                                       const void *cbdata);

typedef struct {
    int callbackSite;                      /* Sanitizer_ApiCallbackSite */
    const char *functionName;
    const void *functionParams;
    const void *functionReturnValue;
    const char *symbolName;
    CUcontext context;
} Sanitizer_CallbackData;

typedef struct {                           /* the fields CUDA 13.0 and 13.5 share */
    CUcontext context;
    CUstream stream;
    Sanitizer_StreamHandle hStream;
    CUmodule module;
    CUfunction function;
    const char *functionName;
    uint32_t gridDim_x, gridDim_y, gridDim_z;
    uint32_t blockDim_x, blockDim_y, blockDim_z;
    uint32_t clusterDim_x, clusterDim_y, clusterDim_z;
    uint64_t gridId;
    Sanitizer_LaunchHandle hLaunch;
    CUdevice device;
    CUcontext apiContext;
    CUstream apiStream;
    Sanitizer_StreamHandle hApiStream;
} Sanitizer_LaunchData;

typedef struct {
    uint64_t address;
    uint64_t size;
    CUcontext context;
    CUdevice device;
    CUstream stream;
    Sanitizer_StreamHandle hStream;
    void *memoryPool;                      /* CUmemoryPool */
    uint32_t flags;                        /* Sanitizer_ResourceMemoryFlags */
    uint32_t permissions;
    int visibility;                        /* Sanitizer_MemoryVisibility */
    CUdevice sourceDevice;
} Sanitizer_ResourceMemoryData;

typedef struct {
    CUcontext context;
    CUmodule module;
    size_t cubinSize;
    const char *pCubin;
    void *library;                         /* CUlibrary */
} Sanitizer_ResourceModuleData;

typedef struct {
    uint64_t address;
    uint64_t size;
} Sanitizer_ResourceVirtualRange;

/* The entry points replay/ binds: X(name, return, parameters). */
#define CD_SANITIZER_FUNCS(X)                                                   \
    X(sanitizerSubscribe, (Sanitizer_SubscriberHandle *subscriber,              \
                           Sanitizer_CallbackFunc callback, void *userdata))    \
    X(sanitizerUnsubscribe, (Sanitizer_SubscriberHandle subscriber))            \
    X(sanitizerEnableDomain, (uint32_t enable, Sanitizer_SubscriberHandle subscriber, \
                              int domain))                                      \
    X(sanitizerEnableCallback, (uint32_t enable, Sanitizer_SubscriberHandle subscriber, \
                                int domain, uint32_t cbid))                     \
    X(sanitizerAddPatches, (const void *image, CUcontext ctx))                  \
    X(sanitizerPatchInstructions, (int instructionId, CUmodule module,          \
                                   const char *deviceCallbackName))             \
    X(sanitizerPatchModule, (CUmodule module))                                  \
    X(sanitizerUnpatchModule, (CUmodule module))                                \
    X(sanitizerSetLaunchCallbackData, (Sanitizer_LaunchHandle launch, CUfunction kernel, \
                                       Sanitizer_StreamHandle stream, const void *userdata)) \
    X(sanitizerAlloc, (CUcontext ctx, void **devPtr, size_t size))              \
    X(sanitizerFree, (CUcontext ctx, void *devPtr))                             \
    X(sanitizerMemcpyHostToDeviceAsync, (void *dst, void *src, size_t count,    \
                                         Sanitizer_StreamHandle stream))        \
    X(sanitizerMemcpyDeviceToHost, (void *dst, void *src, size_t count,         \
                                    Sanitizer_StreamHandle stream))             \
    X(sanitizerStreamSynchronize, (Sanitizer_StreamHandle stream))              \
    X(sanitizerGetFunctionPcAndSize, (CUmodule module, const char *functionName, \
                                      uint64_t *pc, uint64_t *size))            \
    X(sanitizerGetResultString, (SanitizerResult result, const char **str))

#endif
