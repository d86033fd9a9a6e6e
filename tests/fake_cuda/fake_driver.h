/*
 * fake_driver.h: the fake CUDA driver (libcuda.so.1) for CPU-only CI: what its
 * files share.
 *
 * Built by the test session (tests/fake_cuda/__init__.py) against the REAL
 * cuda.h / cupti.h, so every function defined here gets the exported name the
 * real driver has (cuMemAlloc -> cuMemAlloc_v2 ...) and the CUPTI callback data
 * and launch parameter structs have the real layouts.
 *
 * What it emulates (one device, ordinal 0, one primary context):
 *   - streams: a FIFO of operations each (kernel, stream-write-value, event
 *     record, graph replay). Operations run when the stream is synchronised
 *     (on the synchronising thread), or - after fake_set_async(1) - on one
 *     "device" thread per stream, so host and device really run concurrently;
 *   - kernels behave by name (fake_set_kernel, defaults below); a faulting
 *     kernel kills the context with its code: later operations are dropped,
 *     later API calls return the sticky code, and the synchronising call that
 *     discovers the fault prints the device's assert text with
 *     fprintf(stderr, ...) (libc's global `stderr`, read at call time, like
 *     the real driver) in the real driver's format;
 *   - the CUPTI callback registry (fake_cupti.c forwards to it): every launch
 *     API calls the subscribed callback at API enter and exit with a real
 *     CUpti_CallbackData; the callback may rewrite *functionReturnValue at
 *     exit and the API returns the rewritten value;
 *   - stream capture (begin/end, a capturing stream records launches, stream
 *     writes and memsets, a sync on it invalidates the capture and fails with
 *     900; fork/join: an event recorded in a capturing stream and waited for
 *     by another stream makes that stream join the capture), graphs replayed
 *     by cuGraphLaunch in capture order (a kernel's behaviour is looked up
 *     at replay, so a "bad index" can be set between replays), pinned host
 *     memory (device pointer == host pointer; cuMemHostAlloc memory is its
 *     own mapping, made inaccessible by a reset), cuMemHostRegister, cuStreamWriteValue32
 *     (refused for an address no live allocation or registration holds, as
 *     the real driver refuses a freed one), the driver error log callback;
 *   - the primary context's reset (cuDevicePrimaryCtxReset): CUPTI's resource
 *     callback CONTEXT_DESTROY_STARTING fires, queued work is dropped, the
 *     context's pinned allocations are unmapped and its registrations
 *     forgotten, and the SAME CUcontext pointer comes back with a new id
 *     (cuCtxGetId, CUPTI's contextUid), as the H200 does;
 *   - CUPTI's resource domain: CONTEXT_DESTROY_STARTING, GRAPHEXEC_CREATED
 *     (cuGraphInstantiate), GRAPHEXEC_DESTROY_STARTING (cuGraphExecDestroy),
 *     GRAPH_DESTROY_STARTING (cuGraphDestroy).
 * Control API: the fake_* functions of fake_control.c (called from Python by ctypes).
 *
 * Its files, one API area each:
 *   fake_cuda.c       state (kernels, streams, graphs, events, pinned memory,
 *                     statistics), error names, the error log and cuLogs*,
 *                     shared helpers
 *   fake_callbacks.c  the CUPTI callback registry (fake_cupti.c forwards to it),
 *                     firing the API and resource callbacks
 *   fake_device.c     the device: stream queues, worker threads (async mode),
 *                     running operations, assert text at discovery
 *   fake_context.c    cuInit, the device, the primary context (retain, release,
 *                     reset), the context stack
 *   fake_streams.c    streams, stream capture, graphs (instantiate, destroy,
 *                     nodes, ids), function names, cuStreamWaitEvent
 *   fake_launch.c     kernel launches (cuLaunchKernel*, cooperative, Ex), graph
 *                     launches, modules
 *   fake_memory.c     device and pinned host memory, registrations, copies,
 *                     memsets, cuStreamWriteValue32
 *   fake_events.c     events
 *   fake_control.c    the control API (fake_*), called by the tests through
 *                     ctypes
 *
 * Shared state and helpers are hidden (not exported from libcuda.so.1).
 */
#ifndef FAKE_DRIVER_H
#define FAKE_DRIVER_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "fake_common.h"

#include <errno.h>
#include <error.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#define MAGIC_CTX 0xC0C0C7A1u
#define MAGIC_STREAM 0x57AEA4u
#define MAGIC_FUNC 0xF0BC7u
#define MAGIC_MOD 0x40D0u
#define MAGIC_EVENT 0xE7E47u
#define MAGIC_GRAPH 0x6A4Fu
#include <signal.h>

#pragma GCC visibility push(hidden)

typedef struct kcfg {                /* behaviour of kernels whose name contains `name` */
    char *name;
    int code;                        /* 0 = runs fine; else the sticky code it dies with */
    int lines;                       /* assert lines printed at discovery */
    char *cond;                      /* the text inside Assertion `...` (may hold NULs) */
    size_t cond_len;
    char *file, *func;
    int line;
    long long duration_us;
    struct kcfg *next;
} kcfg;

typedef struct fake_func {
    uint32_t magic;
    char *name;
    struct fake_func *next;
} fake_func;

typedef struct fake_graph fake_graph;

typedef struct fake_event fake_event;

enum { OP_KERNEL = 1, OP_WRITE32, OP_EVENT, OP_GRAPH, OP_MEMSET32 };

typedef struct op {
    int kind;
    fake_func *fn;
    const kcfg *cfg;
    long long extra_ns;              /* spin kernels: their argument */
    volatile uint32_t *addr;
    uint32_t value;
    size_t count;
    fake_event *ev;
    fake_graph *graph;
    unsigned grid[3], block[3];      /* kernels: their configuration */
    unsigned serial;                 /* the node's local id (cuGraphNodeGetToolsId) */
    unsigned graph_serial;           /* in a capture: its graph's id */
    struct op *next;
} op;

typedef struct fake_stream {
    uint32_t magic;
    int id;
    op *head, *tail;
    int running;                     /* an op is executing now */
    int capture;                     /* CUstreamCaptureStatus */
    struct fake_stream *cap_origin;  /* the stream that began the capture (self for it) */
    unsigned long long cap_id;       /* the capture's id (cuStreamGetCaptureInfo) */
    op *cap_head, *cap_tail;         /* the origin's: every joined stream appends here */
    fake_graph *cap_graph;           /* the origin's: the graph being captured */
    struct op *cap_last;             /* the last node this stream captured (its dependency) */
    int has_worker;
    pthread_t worker;
    struct fake_stream *next_all;
} fake_stream;

struct fake_graph {
    uint32_t magic;
    unsigned serial;                 /* cuGraphGetId's; the executable's is 1000 more */
    op *ops;                         /* captured operations, in capture order */
    struct fake_stream *capturing;   /* while captured: the origin stream (its list) */
    int graph_destroyed, exec_destroyed;   /* both: its operations are freed */
};

struct fake_event {
    uint32_t magic;
    fake_stream *stream;             /* where it was last recorded */
    fake_stream *cap_origin;         /* recorded in a capturing stream: that capture */
    int done;
    double t_ms;
};

typedef struct pending_print {       /* assert text not yet printed by the driver */
    const kcfg *cfg;
    struct pending_print *next;
} pending_print;

struct fake_the_ctx { uint32_t magic; };

struct fake_the_module { uint32_t magic; };

#define CTX ((CUcontext)(void *)&the_ctx)

typedef struct host_range {
    char *p;
    size_t n;
    int registered;
    struct host_range *next;
} host_range;

struct fake_sub {
    atomic_int in_use;
    _Atomic(CUpti_CallbackFunc) cb;
    void *userdata;
    char name[256];
    atomic_uchar enabled[CUPTI_DRIVER_TRACE_CBID_SIZE];
    atomic_uchar res_enabled[CUPTI_CBID_RESOURCE_SIZE];
};

#define RET(api, expr) return logret(api, (expr))

typedef CUresult (*body_fn)(void *arg);

#define ALIVE(api)                                                            \
    do {                                                                      \
        int s_ = current_sticky();                                            \
        if (s_)                                                               \
            return logret(api, (CUresult)s_);                                 \
    } while (0)

/* state (fake_cuda.c, fake_callbacks.c ...) */
extern struct fake_the_ctx the_ctx;
extern struct fake_the_module the_module;
extern pthread_mutex_t dev_lock;
extern pthread_cond_t dev_cv;
extern pthread_mutex_t print_lock;
extern fake_stream legacy_stream;
extern fake_stream *all_streams;
extern int next_stream_id;
extern int async_on;
extern int sticky;
extern pending_print *pending_head, **pending_tail;
extern kcfg *configs;
extern fake_func *funcs;
extern int primary_retained;
extern atomic_uint ctx_uid;
extern unsigned long long next_capture_id;
extern unsigned next_graph_serial, next_op_serial;
extern host_range *host_ranges;
extern _Thread_local CUcontext tls_ctx_stack[32];
extern _Thread_local int tls_ctx_depth;
extern atomic_llong st_callbacks, st_launch_calls, st_kernels_run, st_writes, st_dropped, st_syncs, st_lines_printed, st_log_lines, st_captured, st_refused;
extern struct fake_sub sub;
extern int refuse_resource;
extern int refuse_capture_memset;
extern char external_holder[256];
extern pthread_mutex_t sub_lock;
extern unsigned char refused[CUPTI_DRIVER_TRACE_CBID_SIZE];
extern int cupti_fail_when_dead;

/* helpers shared by the areas */
CUresult logret(const char *api, CUresult rc);
double now_ms(void);
void sleep_ns(long long ns);
int current_sticky(void);
CUcontext current_ctx(void);
fake_stream *resolve(CUstream h);
const kcfg *lookup_cfg(const char *name);
void ensure_worker(fake_stream *s);
void enqueue(fake_stream *s, op *o);
int capture_append(fake_stream *s, op *o);
void drain_locked(fake_stream *s);
CUresult sync_result(void);
void fire_resource(CUpti_CallbackId cbid, CUpti_GraphData *graph);
CUresult traced(CUpti_CallbackId cbid, const char *api, const void *params, const char *symbol, body_fn body, void *arg);
void drop_all_work(void);
fake_func *function_named(const char *name);

#pragma GCC visibility pop

#endif
