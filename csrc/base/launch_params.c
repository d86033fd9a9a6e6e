/*
 * base/launch_params.c: a launch's stream and configuration, read from the
 * CUPTI callback's functionParams of each launch API (cupti_ids.h). The one
 * parser of launch parameters: the callback, the fault records and the watch
 * ring all ask it.
 */
#include "base/base.h"

#define CD_IS_PTSZ_CASE(id, ptsz) case id: return ptsz;
static inline int is_ptsz(CUpti_CallbackId cbid)
{
    switch (cbid) {
        CD_LAUNCH_CBIDS(CD_IS_PTSZ_CASE)
    default:
        return 0;
    }
}

int cd_is_graph_launch(CUpti_CallbackId cbid)
{
    return cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch ||
           cbid == CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz;
}

/* The three launch-parameter structs name their stream and dimensions alike. */
#define READ_LAUNCH(s, f, p)                                                            \
    do {                                                                                \
        (s) = (p)->hStream;                                                             \
        if (f) {                                                                        \
            (f)->grid[0] = (p)->gridDimX, (f)->grid[1] = (p)->gridDimY;                 \
            (f)->grid[2] = (p)->gridDimZ;                                               \
            (f)->block[0] = (p)->blockDimX, (f)->block[1] = (p)->blockDimY;             \
            (f)->block[2] = (p)->blockDimZ;                                             \
            (f)->shared_mem = (p)->sharedMemBytes;                                      \
        }                                                                               \
    } while (0)

CUstream cd_launch_stream(CUpti_CallbackId cbid, const void *params, cd_launch_dims *f)
{
    CUstream s = NULL;
    switch (cbid) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
        READ_LAUNCH(s, f, (const cuLaunchKernel_params *)params);
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz:
        READ_LAUNCH(s, f, (const cuLaunchCooperativeKernel_params *)params);
        break;
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
        const CUlaunchConfig *c = ((const cuLaunchKernelEx_params *)params)->config;
        if (c)
            READ_LAUNCH(s, f, c);
        break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch:
    case CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz:
        s = ((const cuGraphLaunch_params *)params)->hStream;
        break;
    default:
        break;
    }
    if (!s && is_ptsz(cbid))
        s = CU_STREAM_PER_THREAD;
    else if (s == CU_STREAM_LEGACY)
        s = NULL;                      /* one stream, one name: the runtime's 0 */
    return s;
}
