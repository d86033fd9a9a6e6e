/*
 * cupti_ids.h: the CUPTI driver-API callback ids cuda_debug subscribes to,
 * written once. C expands these lists into its enable tables and switch
 * cases; Python gets them as _core.CALLBACK_IDS ({id: name}) and
 * _core.LAUNCH_CALLBACK_IDS, never as raw numbers of its own.
 *
 * X(id, ptsz): id is the CUPTI enum name, spelled out in full (the short
 * names are macros of cuda.h: cuStreamBeginCapture would expand to
 * cuStreamBeginCapture_v2 before any pasting); ptsz is 1 for the
 * per-thread-default-stream twin, where a NULL stream means
 * CU_STREAM_PER_THREAD.
 */
#ifndef CD_CUPTI_IDS_H
#define CD_CUPTI_IDS_H

/* Launches: every launcher in the process ends in one of these. */
#define CD_LAUNCH_CBIDS(X)                                                      \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, 0) X(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz, 1)                             \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, 0) X(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz, 1)                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel, 0) X(CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz, 1)       \
    X(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch, 0) X(CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch_ptsz, 1)

/* Calls that can make a stream start capturing (beginning a capture, or a
 * stream joining one by waiting on an event recorded in a capturing stream).
 * Optional: an older CUPTI may lack some (cuStreamBeginCaptureToGraph is
 * CUDA 12.3+); the ones it refuses are left out and the capture-status cache
 * is switched off (every launch then asks cuStreamIsCapturing). */
#define CD_BEGIN_CAPTURE_CBIDS(X)                                               \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture, 0) X(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_ptsz, 1)                 \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2, 0) X(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz, 1)           \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph, 0) X(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCaptureToGraph_ptsz, 1)
#define CD_CAPTURE_CBIDS(X)                                                     \
    CD_BEGIN_CAPTURE_CBIDS(X)                                                   \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent, 0) X(CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent_ptsz, 1)

/* The end of a capture (graph_capture.c: at API enter, the memset that clears
 * the graph's markers is captured as its last node; at exit, the graph
 * handle). Optional, like the capture ids; without them a capture is never
 * closed and its replays are reported without nodes. */
#define CD_GRAPH_CBIDS(X)                                                       \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture, 0) X(CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture_ptsz, 1)

/* Calls in which the host waits for a stream (or for every stream of its
 * context): at their API entry, while watching with sparse markers, a marker
 * goes behind each stream's last unmarked launch (capture/watch_ring.c,
 * cd_watch_host_waits), so that a stream the host waits for, or hangs on, has
 * its last launches bracketed. Optional: refused ones are left out (the
 * markers then come only every watch_every-th launch). */
#define CD_WAIT_CBIDS(X)                                                        \
    X(CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize, 0) X(CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize_ptsz, 1)                   \
    X(CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, 0) X(CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize_v2, 0)                           \
    X(CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize, 0)                                                                           \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2, 0) X(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2_ptds, 1)                         \
    X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy, 0) X(CUPTI_DRIVER_TRACE_CBID_cuMemcpy_ptds, 1)

/* Resource events (CUPTI_CB_DOMAIN_RESOURCE, a numbering of its own): a
 * context about to be destroyed (its completion slots retire), graph
 * executables made and destroyed, graphs destroyed and cloned (which captured
 * graph a replay runs; when a capture's markers are free again), a module
 * about to be unloaded (a kernel name's pointer may name another kernel after
 * it: base/intern.c).
 * Optional: refused ones are left out (then a reset is noticed only at the
 * next watch() entry, and replays are matched to their graphs by which
 * graph's markers were running). */
#define CD_RESOURCE_CBIDS(X)                                                    \
    X(CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING, 0)                         \
    X(CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED, 0) X(CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING, 0) \
    X(CUPTI_CBID_RESOURCE_GRAPH_DESTROY_STARTING, 0) X(CUPTI_CBID_RESOURCE_GRAPH_CLONED, 0)    \
    X(CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING, 0)

#endif
