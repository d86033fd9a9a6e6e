/*
 * fake_cuda.c: a fake CUDA driver (libcuda.so.1) for CPU-only CI.
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
 * Control API: the fake_* functions at the end (called from Python by ctypes).
 */
#define _GNU_SOURCE
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

/* ------------------------------------------------------------ state ---- */

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

static struct { uint32_t magic; } the_ctx = {MAGIC_CTX};
static struct { uint32_t magic; } the_module = {MAGIC_MOD};
#define CTX ((CUcontext)(void *)&the_ctx)

static pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dev_cv = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

static fake_stream legacy_stream = {MAGIC_STREAM, 0};
static fake_stream *all_streams = &legacy_stream;
static int next_stream_id = 1;
static int async_on;
static int sticky;                   /* the context's sticky error, 0 while alive */
static pending_print *pending_head, **pending_tail = &pending_head;
static kcfg *configs;                /* newest first; never freed (ops point at them) */
static fake_func *funcs;
static int primary_retained;
/* The primary context's id (cuCtxGetId, CUPTI's contextUid): a reset makes
 * a new context behind the same CUcontext pointer, with the next id. */
static atomic_uint ctx_uid = 1;
static unsigned long long next_capture_id = 1;
static unsigned next_graph_serial, next_op_serial;

/* Pinned host memory the context knows: its own allocations (cuMemHostAlloc,
 * each its own mapping, made inaccessible at a reset and never reused, so a
 * reader of freed slots faults as on the real driver) and registrations (cuMemHostRegister: the
 * memory is the caller's, only forgotten at a reset). Under dev_lock. */
typedef struct host_range {
    char *p;
    size_t n;
    int registered;
    struct host_range *next;
} host_range;
static host_range *host_ranges;

static _Thread_local CUcontext tls_ctx_stack[32];
static _Thread_local int tls_ctx_depth;

/* statistics (fake_stats / fake_stat) */
static atomic_llong st_callbacks, st_launch_calls, st_kernels_run, st_writes, st_dropped,
    st_syncs, st_lines_printed, st_log_lines, st_captured, st_refused;

/* ----------------------------------------------------- CUPTI registry --- */

static struct {
    atomic_int in_use;
    _Atomic(CUpti_CallbackFunc) cb;
    void *userdata;
    char name[256];
    atomic_uchar enabled[CUPTI_DRIVER_TRACE_CBID_SIZE];
    atomic_uchar res_enabled[CUPTI_CBID_RESOURCE_SIZE];
} sub;
static int refuse_resource;          /* fake_refuse_resource: an older CUPTI */
static int refuse_capture_memset;    /* fake_refuse_capture_memset: memsets not capturable */
static char external_holder[256];    /* fake_hold_cupti: another tool holds CUPTI */
static pthread_mutex_t sub_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned char refused[CUPTI_DRIVER_TRACE_CBID_SIZE];
static int cupti_fail_when_dead = 1;
static atomic_uint next_correlation = 1;

/* ------------------------------------------------------ driver log ----- */

#define MAX_LOG_CBS 8
static struct {
    CUlogsCallback fn;
    void *data;
} log_cbs[MAX_LOG_CBS];
static int n_log_cbs;

static const struct {
    int code;
    const char *name, *text;
} errors[] = {
    {0, "CUDA_SUCCESS", "no error"},
    {1, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {2, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {3, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {4, "CUDA_ERROR_DEINITIALIZED", "driver shutting down"},
    {100, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {101, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {200, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {201, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {400, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {500, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {600, "CUDA_ERROR_NOT_READY", "device not ready"},
    {700, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {701, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {702, "CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"},
    {710, "CUDA_ERROR_ASSERT", "device-side assert triggered"},
    {714, "CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"},
    {715, "CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"},
    {716, "CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"},
    {717, "CUDA_ERROR_INVALID_ADDRESS_SPACE", "operation not supported on global/shared address space"},
    {718, "CUDA_ERROR_INVALID_PC", "invalid program counter"},
    {719, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {900, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED", "operation not permitted when stream is capturing"},
    {901, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {999, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const char *err_name(int code)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == code)
            return errors[i].name;
    return NULL;
}

/* fake_set_driver_log(0): the driver logs nothing (a driver older than
 * 12.9, which has no error log: the registration succeeds, no line comes). */
static atomic_int log_off;
FAKE_EXPORT void fake_set_driver_log(int on) { atomic_store(&log_off, !on); }

static CUresult logret(const char *api, CUresult rc)
{
    if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_NOT_READY || !n_log_cbs || atomic_load(&log_off))
        return rc;
    char msg[256];
    const char *n = err_name(rc);
    int len = snprintf(msg, sizeof msg, "Returning %d (%s) from %s", (int)rc, n ? n : "?", api);
    for (int i = 0; i < n_log_cbs; i++)
        if (log_cbs[i].fn) {
            atomic_fetch_add(&st_log_lines, 1);
            log_cbs[i].fn(log_cbs[i].data, CU_LOG_LEVEL_ERROR, msg, (size_t)len);
        }
    return rc;
}
#define RET(api, expr) return logret(api, (expr))

/* ----------------------------------------------------- helpers --------- */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static void sleep_ns(long long ns)
{
    if (ns <= 0)
        return;
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static int current_sticky(void)
{
    pthread_mutex_lock(&dev_lock);
    int s = sticky;
    pthread_mutex_unlock(&dev_lock);
    return s;
}

static CUcontext current_ctx(void)
{
    return tls_ctx_depth ? tls_ctx_stack[tls_ctx_depth - 1] : NULL;
}

/* Stream handle -> stream (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: the
 * one default stream); NULL for a bad handle. */
static fake_stream *resolve(CUstream h)
{
    if (h == NULL || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return &legacy_stream;
    fake_stream *s = (fake_stream *)h;
    return s->magic == MAGIC_STREAM ? s : NULL;
}

static kcfg builtin[6];

static void init_builtins(void)
{
    static int done;
    if (done)
        return;
    done = 1;
    static char cond[] = "idx[i] >= 0 && idx[i] < limit";
    builtin[0] = (kcfg){"check_index", 710, 1, cond, sizeof cond - 1, "fault_kernels.cu",
                        "check_index", 14, 0, NULL};
    builtin[1] = (kcfg){"write_wild", 700, 0, NULL, 0, NULL, NULL, 0, 0, NULL};
    builtin[2] = (kcfg){"trap", 719, 0, NULL, 0, NULL, NULL, 0, 0, NULL};
    builtin[3] = (kcfg){"write_misaligned", 716, 0, NULL, 0, NULL, NULL, 0, 0, NULL};
    builtin[4] = (kcfg){"spin", 0, 0, NULL, 0, NULL, NULL, 0, 0, NULL};
    builtin[5] = (kcfg){"", 0, 0, NULL, 0, NULL, NULL, 0, 0, NULL};   /* anything else */
}

/* dev_lock held */
static const kcfg *lookup_cfg(const char *name)
{
    init_builtins();
    for (kcfg *c = configs; c; c = c->next)
        if (c->name && strstr(name, c->name))
            return c;
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (strstr(name, builtin[i].name))
            return &builtin[i];
    return &builtin[5];
}

/* ------------------------------------------------------ the device ----- */

static void push_pending(const kcfg *c)   /* dev_lock held */
{
    pending_print *p = calloc(1, sizeof *p);
    p->cfg = c;
    *pending_tail = p;
    pending_tail = &p->next;
}

static void exec_kernel(const op *o)      /* dev_lock NOT held */
{
    const kcfg *c = o->cfg;
    sleep_ns(c->duration_us * 1000 + o->extra_ns);
    atomic_fetch_add(&st_kernels_run, 1);
    if (o->addr)                          /* cd_graph_marker(p, v): *p = v */
        atomic_store((_Atomic uint32_t *)o->addr, o->value);
    if (!c->code)
        return;
    pthread_mutex_lock(&dev_lock);
    if (!sticky)
        sticky = c->code;
    if (c->lines > 0)
        push_pending(c);
    pthread_mutex_unlock(&dev_lock);
}

static void exec_op(const op *o)          /* dev_lock NOT held; the context was alive */
{
    switch (o->kind) {
    case OP_KERNEL:
        exec_kernel(o);
        break;
    case OP_WRITE32:
        atomic_store((_Atomic uint32_t *)o->addr, o->value);
        atomic_fetch_add(&st_writes, 1);
        break;
    case OP_MEMSET32:
        for (size_t i = 0; i < o->count; i++)
            o->addr[i] = o->value;
        break;
    case OP_EVENT:
        pthread_mutex_lock(&dev_lock);
        o->ev->done = 1;
        o->ev->t_ms = now_ms();
        pthread_mutex_unlock(&dev_lock);
        break;
    case OP_GRAPH:
        for (const op *k = o->graph->ops; k; k = k->next) {
            if (current_sticky()) {
                atomic_fetch_add(&st_dropped, 1);
                continue;
            }
            if (k->kind == OP_KERNEL) {
                /* the behaviour now: the data may have changed since the
                 * capture (a bad index copied into the static input) */
                op now = *k;
                pthread_mutex_lock(&dev_lock);
                now.cfg = lookup_cfg(k->fn->name);
                pthread_mutex_unlock(&dev_lock);
                exec_op(&now);
                continue;
            }
            exec_op(k);
        }
        break;
    }
}

/* Run the head op of `s`. dev_lock held on entry and exit; released while
 * the op executes. An op whose context is dead when it starts is dropped. */
static void run_head(fake_stream *s)
{
    op *o = s->head;
    s->head = o->next;
    if (!s->head)
        s->tail = NULL;
    s->running = 1;
    int dead = sticky;
    pthread_mutex_unlock(&dev_lock);
    if (dead)
        atomic_fetch_add(&st_dropped, 1);
    else
        exec_op(o);
    pthread_mutex_lock(&dev_lock);
    s->running = 0;
    free(o);
    pthread_cond_broadcast(&dev_cv);
}

static void *stream_worker(void *arg)
{
    fake_stream *s = arg;
    char name[16];
    snprintf(name, sizeof name, "fake-dev-s%d", s->id);
    prctl(PR_SET_NAME, name, 0, 0, 0);
    pthread_mutex_lock(&dev_lock);
    for (;;) {
        while (!(async_on && s->head && !s->running))
            pthread_cond_wait(&dev_cv, &dev_lock);
        run_head(s);
    }
    return NULL;
}

static void ensure_worker(fake_stream *s)   /* dev_lock held */
{
    if (async_on && !s->has_worker) {
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&s->worker, &a, stream_worker, s) == 0)
            s->has_worker = 1;
        pthread_attr_destroy(&a);
    }
}

static void enqueue(fake_stream *s, op *o)  /* dev_lock held */
{
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    ensure_worker(s);
    pthread_cond_broadcast(&dev_cv);
}

/* An operation enqueued on a capturing stream goes into its capture (the
 * origin stream's list: a joined stream's operations too), in capture order.
 * 1: captured; -1: the capture was invalidated (o is freed); 0: not capturing.
 * dev_lock held. */
static int capture_append(fake_stream *s, op *o)
{
    if (s->capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
        free(o);
        return -1;
    }
    if (s->capture != CU_STREAM_CAPTURE_STATUS_ACTIVE)
        return 0;
    fake_stream *origin = s->cap_origin ? s->cap_origin : s;
    o->next = NULL;
    o->serial = ++next_op_serial;
    o->graph_serial = origin->cap_graph ? origin->cap_graph->serial : 0;
    s->cap_last = o;
    if (origin->cap_tail)
        origin->cap_tail->next = o;
    else
        origin->cap_head = o;
    origin->cap_tail = o;
    return 1;
}

/* Wait until `s` has nothing queued or running (executing its ops on this
 * thread unless the device threads do). dev_lock held. */
static void drain_locked(fake_stream *s)
{
    for (;;) {
        if (s->head && !s->running && !async_on) {
            run_head(s);
            continue;
        }
        if (!s->head && !s->running)
            return;
        if (sticky && !s->running) {        /* dead: the rest never runs */
            while (s->head) {
                op *o = s->head;
                s->head = o->next;
                free(o);
                atomic_fetch_add(&st_dropped, 1);
            }
            s->tail = NULL;
            return;
        }
        pthread_cond_wait(&dev_cv, &dev_lock);
    }
}

/* fake_set_print_thread(1): printed by a thread of the driver's own, in pieces. */
static int print_from_thread;

/* The synchronising call discovers the fault: the driver prints the device's
 * assert text, through stdio, to whatever libc's `stderr` is now. */
static void print_pending(void)
{
    pthread_mutex_lock(&print_lock);
    pthread_mutex_lock(&dev_lock);
    pending_print *p = pending_head;
    pending_head = NULL;
    pending_tail = &pending_head;
    pthread_mutex_unlock(&dev_lock);
    while (p) {
        const kcfg *c = p->cfg;
        for (int i = 0; i < c->lines; i++) {
            int t = 3 + i;
            if (print_from_thread) {        /* in pieces, as the real driver writes */
                fprintf(stderr, "%s:%d: ", c->file ? c->file : "fake_kernels.cu", c->line);
                fprintf(stderr, "%s: block: [%d,%d,%d], thread: [%d,%d,%d] ",
                        c->func ? c->func : c->name, t / 1024, 0, 0, t % 1024, 0, 0);
                fprintf(stderr, "Assertion `%s` failed.\n", c->cond ? c->cond : "false");
            } else {
                fprintf(stderr,
                        "%s:%d: %s: block: [%d,%d,%d], thread: [%d,%d,%d] Assertion `%s` failed.\n",
                        c->file ? c->file : "fake_kernels.cu", c->line,
                        c->func ? c->func : c->name, t / 1024, 0, 0, t % 1024, 0, 0,
                        c->cond ? c->cond : "false");
            }
            atomic_fetch_add(&st_lines_printed, 1);
        }
        pending_print *n = p->next;
        free(p);
        p = n;
    }
    pthread_mutex_unlock(&print_lock);
}

/* fake_set_print_thread(1): the text is printed by a thread of the driver's
 * own, not by the synchronising one (what the real driver was seen doing on
 * an H200); the synchronising call waits for it, as the real one does. */
static void *print_thread_main(void *arg)
{
    (void)arg;
    print_pending();
    return NULL;
}

FAKE_EXPORT void fake_set_print_thread(int on) { print_from_thread = on; }

/* After a drain: the call's result; prints pending text when dead. */
static CUresult sync_result(void)
{
    int s = current_sticky();
    if (s) {
        pthread_t t;
        if (print_from_thread && pthread_create(&t, NULL, print_thread_main, NULL) == 0)
            pthread_join(t, NULL);
        else
            print_pending();
    }
    return (CUresult)s;
}

/* ------------------------------------------------------ CUPTI side ----- */

/* Inside a driver-domain callback at an API's exit (this thread): the one
 * place CUPTI's documentation gives for cuptiFinalize. */
static _Thread_local int tls_at_exit;
/* cuptiFinalize as the real one: CUPTI leaves the process (every
 * subscription gone, no callback from then on); any CUPTI call afterwards
 * initialises it anew (counted by the next subscribe: st_inits). Counted
 * apart: finalizes called outside an API-exit callback (st_finalizes_outside). */
static atomic_int st_finalizes, st_finalizes_outside, st_inits;
static int finalized;                  /* under sub_lock */

static void fire(CUpti_CallbackId cbid, CUpti_CallbackData *cb)
{
    if (!atomic_load(&sub.in_use) || cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE ||
        !atomic_load(&sub.enabled[cbid]))
        return;
    CUpti_CallbackFunc f = atomic_load(&sub.cb);
    if (!f)
        return;
    atomic_fetch_add(&st_callbacks, 1);
    const int was = tls_at_exit;
    tls_at_exit = cb->callbackSite == CUPTI_API_EXIT;
    f(sub.userdata, CUPTI_CB_DOMAIN_DRIVER_API, cbid, cb);
    tls_at_exit = was;
}

/* A resource-domain callback (CUpti_ResourceData; for graph events its
 * resourceDescriptor is a CUpti_GraphData, as the real CUPTI passes it). */
static void fire_resource(CUpti_CallbackId cbid, CUpti_GraphData *graph)
{
    if (!atomic_load(&sub.in_use) || cbid >= CUPTI_CBID_RESOURCE_SIZE ||
        !atomic_load(&sub.res_enabled[cbid]))
        return;
    CUpti_CallbackFunc f = atomic_load(&sub.cb);
    if (!f)
        return;
    CUpti_ResourceData rd;
    memset(&rd, 0, sizeof rd);
    rd.context = CTX;
    rd.resourceDescriptor = graph;
    atomic_fetch_add(&st_callbacks, 1);
    f(sub.userdata, CUPTI_CB_DOMAIN_RESOURCE, cbid, &rd);
}

/* One API call seen by CUPTI: enter callback, body, exit callback (which may
 * rewrite the result); returns the (possibly rewritten) result. */
typedef CUresult (*body_fn)(void *arg);

static CUresult traced(CUpti_CallbackId cbid, const char *api, const void *params,
                       const char *symbol, body_fn body, void *arg)
{
    CUresult ret = CUDA_SUCCESS;
    uint64_t correlation_data = 0;
    CUpti_CallbackData cb;
    memset(&cb, 0, sizeof cb);
    cb.callbackSite = CUPTI_API_ENTER;
    cb.functionName = api;
    cb.functionParams = params;
    cb.functionReturnValue = &ret;
    cb.symbolName = symbol;
    cb.context = current_ctx() ? current_ctx() : CTX;
    cb.contextUid = atomic_load(&ctx_uid);
    cb.correlationData = &correlation_data;
    cb.correlationId = atomic_fetch_add(&next_correlation, 1);
    fire(cbid, &cb);
    ret = logret(api, body(arg));
    cb.callbackSite = CUPTI_API_EXIT;
    fire(cbid, &cb);
    return ret;
}

CUptiResult fakecuda_cupti_subscribe(CUpti_SubscriberHandle *handle, CUpti_CallbackFunc cb,
                                     void *ud, const char *name, char *old, size_t oldsize)
{
    if (!handle)
        return CUPTI_ERROR_INVALID_PARAMETER;
    pthread_mutex_lock(&sub_lock);
    const char *holder = external_holder[0] ? external_holder
                         : atomic_load(&sub.in_use) ? sub.name : NULL;
    if (holder) {
        if (old && oldsize) {
            strncpy(old, holder, oldsize - 1);
            old[oldsize - 1] = '\0';
        }
        pthread_mutex_unlock(&sub_lock);
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    }
    if (finalized) {
        finalized = 0;                 /* CUPTI initialised again */
        atomic_fetch_add(&st_inits, 1);
    }
    for (size_t i = 0; i < CUPTI_DRIVER_TRACE_CBID_SIZE; i++)
        atomic_store(&sub.enabled[i], 0);
    for (size_t i = 0; i < CUPTI_CBID_RESOURCE_SIZE; i++)
        atomic_store(&sub.res_enabled[i], 0);
    snprintf(sub.name, sizeof sub.name, "%s", name ? name : "unnamed CUPTI subscriber");
    sub.userdata = ud;
    atomic_store(&sub.cb, cb);
    atomic_store(&sub.in_use, 1);
    *handle = (CUpti_SubscriberHandle)(void *)&sub;
    pthread_mutex_unlock(&sub_lock);
    return CUPTI_SUCCESS;
}

CUptiResult fakecuda_cupti_unsubscribe(CUpti_SubscriberHandle handle)
{
    pthread_mutex_lock(&sub_lock);
    if (handle != (CUpti_SubscriberHandle)(void *)&sub || !atomic_load(&sub.in_use)) {
        pthread_mutex_unlock(&sub_lock);
        return CUPTI_ERROR_INVALID_PARAMETER;
    }
    atomic_store(&sub.in_use, 0);
    for (size_t i = 0; i < CUPTI_DRIVER_TRACE_CBID_SIZE; i++)
        atomic_store(&sub.enabled[i], 0);
    for (size_t i = 0; i < CUPTI_CBID_RESOURCE_SIZE; i++)
        atomic_store(&sub.res_enabled[i], 0);
    pthread_mutex_unlock(&sub_lock);
    return CUPTI_SUCCESS;
}


CUptiResult fakecuda_cupti_finalize(void)
{
    pthread_mutex_lock(&sub_lock);
    if (!tls_at_exit)
        atomic_fetch_add(&st_finalizes_outside, 1);
    finalized = 1;
    atomic_store(&sub.in_use, 0);
    for (size_t i = 0; i < CUPTI_DRIVER_TRACE_CBID_SIZE; i++)
        atomic_store(&sub.enabled[i], 0);
    for (size_t i = 0; i < CUPTI_CBID_RESOURCE_SIZE; i++)
        atomic_store(&sub.res_enabled[i], 0);
    atomic_fetch_add(&st_finalizes, 1);
    pthread_mutex_unlock(&sub_lock);
    return CUPTI_SUCCESS;
}

FAKE_EXPORT int fake_cupti_finalizes(void) { return atomic_load(&st_finalizes); }
FAKE_EXPORT int fake_cupti_finalizes_outside_exit(void) { return atomic_load(&st_finalizes_outside); }
FAKE_EXPORT int fake_cupti_inits(void) { return atomic_load(&st_inits); }

CUptiResult fakecuda_cupti_enable(uint32_t enable, CUpti_SubscriberHandle handle,
                                  CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
{
    if (handle != (CUpti_SubscriberHandle)(void *)&sub || !atomic_load(&sub.in_use))
        return CUPTI_ERROR_INVALID_PARAMETER;
    if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
        if (refuse_resource || cbid >= CUPTI_CBID_RESOURCE_SIZE)
            return CUPTI_ERROR_INVALID_PARAMETER;
        atomic_store(&sub.res_enabled[cbid], enable ? 1 : 0);
        return CUPTI_SUCCESS;
    }
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API)
        return CUPTI_SUCCESS;               /* other domains: accepted, never fire */
    if (cbid >= CUPTI_DRIVER_TRACE_CBID_SIZE || refused[cbid])
        return CUPTI_ERROR_INVALID_PARAMETER;
    /* Seen on the H200: entering a scope while a kernel had just faulted made
     * CUPTI refuse with NOT_INITIALIZED. Emulated: a dead context (discovered
     * or not) makes enabling fail. */
    if (cupti_fail_when_dead && current_sticky())
        return CUPTI_ERROR_NOT_INITIALIZED;
    atomic_store(&sub.enabled[cbid], enable ? 1 : 0);
    return CUPTI_SUCCESS;
}

int fakecuda_ctx_valid(CUcontext ctx) { return ctx == CTX; }
unsigned fakecuda_ctx_uid(CUcontext ctx) { return ctx == CTX ? atomic_load(&ctx_uid) : 0; }

/* ------------------------------------------------ driver: basics ------- */

#define ALIVE(api)                                                            \
    do {                                                                      \
        int s_ = current_sticky();                                            \
        if (s_)                                                               \
            return logret(api, (CUresult)s_);                                 \
    } while (0)

/* fake_set_init_result(100): cuInit fails as on a machine with a driver and no
 * GPU; nothing counts as initialised then (fakecuda_initialised). */
static int init_result, initialised;
FAKE_EXPORT void fake_set_init_result(int rc) { init_result = rc; }
int fakecuda_initialised(void) { return initialised; }
CUresult CUDAAPI cuInit(unsigned int flags)
{
    (void)flags;
    if (init_result == 0)
        initialised = 1;
    return (CUresult)init_result;
}

CUresult CUDAAPI cuDriverGetVersion(int *v)
{
    if (!v)
        RET("cuDriverGetVersion", CUDA_ERROR_INVALID_VALUE);
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    const char *n = err_name((int)error);
    if (pStr)
        *pStr = n;
    return n ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == (int)error) {
            if (pStr)
                *pStr = errors[i].text;
            return CUDA_SUCCESS;
        }
    if (pStr)
        *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuDeviceGetCount(int *count) { *count = 1; return CUDA_SUCCESS; }

CUresult CUDAAPI cuDeviceGet(CUdevice *dev, int ordinal)
{
    if (ordinal != 0)
        RET("cuDeviceGet", CUDA_ERROR_INVALID_DEVICE);
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    if (dev != 0)
        RET("cuDeviceGetName", CUDA_ERROR_INVALID_DEVICE);
    snprintf(name, (size_t)len, "%s", "Fake CUDA Device (cuda_debug tests)");
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    if (dev != 0)
        RET("cuDeviceGetAttribute", CUDA_ERROR_INVALID_DEVICE);
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 132; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1980000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *pi = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *pi = 60 << 20; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x18; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: *pi = 1; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev)
{
    if (dev != 0)
        RET("cuDeviceTotalMem", CUDA_ERROR_INVALID_DEVICE);
    *bytes = (size_t)141 << 30;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    if (dev != 0)
        RET("cuDevicePrimaryCtxRetain", CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&dev_lock);
    primary_retained++;
    pthread_mutex_unlock(&dev_lock);
    *pctx = CTX;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    if (dev != 0)
        RET("cuDevicePrimaryCtxRelease", CUDA_ERROR_INVALID_DEVICE);
    pthread_mutex_lock(&dev_lock);
    if (primary_retained > 0)
        primary_retained--;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

/* Drop every queued operation and capture, wait for what runs (dev_lock held). */
static void drop_all_work(void)
{
    for (fake_stream *s = all_streams; s; s = s->next_all) {
        while (s->running)
            pthread_cond_wait(&dev_cv, &dev_lock);
        while (s->head) {
            op *o = s->head;
            s->head = o->next;
            free(o);
        }
        s->tail = NULL;
        s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
        s->cap_origin = NULL;
        s->cap_head = s->cap_tail = NULL;
    }
    sticky = 0;
    while (pending_head) {
        pending_print *p = pending_head;
        pending_head = p->next;
        free(p);
    }
    pending_tail = &pending_head;
}

/* cudaDeviceReset: the context is destroyed (CUPTI says so first), its work
 * dropped, its pinned allocations freed (unreadable), its registrations forgotten; the
 * next use gets a new context behind the same pointer, with a new id. */
CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
{
    if (dev != 0)
        RET("cuDevicePrimaryCtxReset_v2", CUDA_ERROR_INVALID_DEVICE);
    fire_resource(CUPTI_CBID_RESOURCE_CONTEXT_DESTROY_STARTING, NULL);
    pthread_mutex_lock(&dev_lock);
    drop_all_work();
    while (host_ranges) {
        host_range *r = host_ranges;
        host_ranges = r->next;
        if (!r->registered)      /* freed: reading it faults (kept inaccessible, never reused) */
            mprotect(r->p, r->n, PROT_NONE);
        free(r);
    }
    atomic_fetch_add(&ctx_uid, 1);
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    if (dev != 0)
        RET("cuDevicePrimaryCtxGetState", CUDA_ERROR_INVALID_DEVICE);
    *flags = 0;
    pthread_mutex_lock(&dev_lock);
    *active = primary_retained > 0;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) { *pctx = current_ctx(); return CUDA_SUCCESS; }

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    if (ctx && ctx != CTX)
        RET("cuCtxSetCurrent", CUDA_ERROR_INVALID_CONTEXT);
    if (tls_ctx_depth)
        tls_ctx_stack[tls_ctx_depth - 1] = ctx;
    else if (ctx)
        tls_ctx_stack[tls_ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
    if (ctx != CTX || tls_ctx_depth >= 32)
        RET("cuCtxPushCurrent", CUDA_ERROR_INVALID_CONTEXT);
    tls_ctx_stack[tls_ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
    if (!tls_ctx_depth)
        RET("cuCtxPopCurrent", CUDA_ERROR_INVALID_CONTEXT);
    CUcontext c = tls_ctx_stack[--tls_ctx_depth];
    if (pctx)
        *pctx = c;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *dev)
{
    if (!current_ctx())
        RET("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT);
    *dev = 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxGetId(CUcontext ctx, unsigned long long *id)
{
    if (!ctx)
        ctx = current_ctx();
    if (ctx != CTX)
        RET("cuCtxGetId", CUDA_ERROR_INVALID_CONTEXT);
    *id = atomic_load(&ctx_uid);
    return CUDA_SUCCESS;
}

/* The host's waits are traced (CUPTI's ids for them): the always-on watch
 * puts a marker behind a stream's newest launch at their entry. */
static CUresult ctx_sync_body(void *a)
{
    (void)a;
    if (!current_ctx())
        return CUDA_ERROR_INVALID_CONTEXT;
    atomic_fetch_add(&st_syncs, 1);
    pthread_mutex_lock(&dev_lock);
    for (fake_stream *s = all_streams; s; s = s->next_all)
        drain_locked(s);
    pthread_mutex_unlock(&dev_lock);
    return sync_result();
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
    return traced(CUPTI_DRIVER_TRACE_CBID_cuCtxSynchronize, "cuCtxSynchronize", NULL, NULL,
                  ctx_sync_body, NULL);
}

/* ------------------------------------------------ driver: streams ------ */

CUresult CUDAAPI cuStreamCreate(CUstream *ph, unsigned int flags)
{
    (void)flags;
    ALIVE("cuStreamCreate");
    fake_stream *s = calloc(1, sizeof *s);
    s->magic = MAGIC_STREAM;
    pthread_mutex_lock(&dev_lock);
    s->id = next_stream_id++;
    /* append: cuCtxSynchronize drains in creation order */
    fake_stream **p = &all_streams;
    while (*p)
        p = &(*p)->next_all;
    *p = s;
    ensure_worker(s);
    pthread_mutex_unlock(&dev_lock);
    *ph = (CUstream)(void *)s;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy(CUstream h)
{
    if (!resolve(h) || !h)
        RET("cuStreamDestroy", CUDA_ERROR_INVALID_HANDLE);
    return CUDA_SUCCESS;   /* kept: its queued work still runs, like the real one */
}

static CUresult stream_sync_body(void *a)
{
    fake_stream *s = a;
    atomic_fetch_add(&st_syncs, 1);
    pthread_mutex_lock(&dev_lock);
    if (s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {   /* invalidates the capture */
        s->capture = CU_STREAM_CAPTURE_STATUS_INVALIDATED;
        pthread_mutex_unlock(&dev_lock);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    drain_locked(s);
    pthread_mutex_unlock(&dev_lock);
    return sync_result();
}

CUresult CUDAAPI cuStreamSynchronize(CUstream h)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamSynchronize", CUDA_ERROR_INVALID_HANDLE);
    cuStreamSynchronize_params p = {h};
    return traced(CUPTI_DRIVER_TRACE_CBID_cuStreamSynchronize, "cuStreamSynchronize", &p, NULL,
                  stream_sync_body, s);
}

CUresult CUDAAPI cuStreamQuery(CUstream h)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamQuery", CUDA_ERROR_INVALID_HANDLE);
    pthread_mutex_lock(&dev_lock);
    if (async_on && !sticky && (s->head || s->running)) {
        pthread_mutex_unlock(&dev_lock);
        return CUDA_ERROR_NOT_READY;
    }
    drain_locked(s);     /* sync mode: the "device" runs what is queued now */
    pthread_mutex_unlock(&dev_lock);
    RET("cuStreamQuery", sync_result());
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream h, CUstreamCaptureStatus *st)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamIsCapturing", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuStreamIsCapturing");
    pthread_mutex_lock(&dev_lock);
    *st = (CUstreamCaptureStatus)s->capture;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream h, CUcontext *pctx)
{
    if (!resolve(h))
        RET("cuStreamGetCtx", CUDA_ERROR_INVALID_HANDLE);
    *pctx = CTX;
    return CUDA_SUCCESS;
}

typedef struct {
    const void *params;
    fake_stream *s;
    CUstreamCaptureMode mode;
    CUgraph *graph_out;
} capture_arg;

static CUresult begin_capture_body(void *a)
{
    capture_arg *c = a;
    int st = current_sticky();
    if (st)
        return (CUresult)st;
    pthread_mutex_lock(&dev_lock);
    CUresult rc = CUDA_SUCCESS;
    if (c->s->capture != CU_STREAM_CAPTURE_STATUS_NONE)
        rc = CUDA_ERROR_ILLEGAL_STATE;
    else {
        c->s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        c->s->cap_origin = c->s;
        c->s->cap_last = NULL;
        c->s->cap_id = next_capture_id++;
        c->s->cap_head = c->s->cap_tail = NULL;
        c->s->cap_graph = calloc(1, sizeof *c->s->cap_graph);
        c->s->cap_graph->magic = MAGIC_GRAPH;
        c->s->cap_graph->capturing = c->s;
        c->s->cap_graph->serial = ++next_graph_serial;
    }
    pthread_mutex_unlock(&dev_lock);
    return rc;
}

static CUresult begin_capture(CUpti_CallbackId cbid, const char *api, CUstream h,
                              CUstreamCaptureMode mode)
{
    fake_stream *s = resolve(h);
    if (!s || s == &legacy_stream)
        RET(api, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    cuStreamBeginCapture_v2_params p = {h, mode};
    capture_arg a = {&p, s, mode, NULL};
    return traced(cbid, api, &p, NULL, begin_capture_body, &a);
}

CUresult CUDAAPI cuStreamBeginCapture(CUstream h, CUstreamCaptureMode mode)
{
    return begin_capture(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2,
                         "cuStreamBeginCapture_v2", h, mode);
}

CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream h, CUstreamCaptureMode mode)
{
    return begin_capture(CUPTI_DRIVER_TRACE_CBID_cuStreamBeginCapture_v2_ptsz,
                         "cuStreamBeginCapture_v2_ptsz", h, mode);
}

/* Ends the capture of its origin stream: every stream that joined it stops
 * capturing too (the real driver demands that they rejoined first). */
static CUresult end_capture_body(void *a)
{
    capture_arg *c = a;
    fake_stream *s = c->s;
    pthread_mutex_lock(&dev_lock);
    int st = s->capture;
    if (st != CU_STREAM_CAPTURE_STATUS_NONE && s->cap_origin != s) {
        pthread_mutex_unlock(&dev_lock);
        return CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;      /* not the origin stream */
    }
    op *ops = s->cap_head;
    fake_graph *g = s->cap_graph;
    s->cap_graph = NULL;
    for (fake_stream *o = all_streams; o; o = o->next_all)
        if (o->cap_origin == s) {
            o->capture = CU_STREAM_CAPTURE_STATUS_NONE;
            o->cap_origin = NULL;
        }
    s->capture = CU_STREAM_CAPTURE_STATUS_NONE;
    s->cap_head = s->cap_tail = NULL;
    pthread_mutex_unlock(&dev_lock);
    if (st == CU_STREAM_CAPTURE_STATUS_NONE)
        return CUDA_ERROR_ILLEGAL_STATE;
    if (st == CU_STREAM_CAPTURE_STATUS_INVALIDATED)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    pthread_mutex_lock(&dev_lock);
    g->capturing = NULL;
    g->ops = ops;
    pthread_mutex_unlock(&dev_lock);
    *c->graph_out = (CUgraph)(void *)g;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream h, CUgraph *phGraph)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamEndCapture", CUDA_ERROR_INVALID_HANDLE);
    cuStreamEndCapture_params p = {h, phGraph};
    capture_arg a = {&p, s, 0, phGraph};
    return traced(CUPTI_DRIVER_TRACE_CBID_cuStreamEndCapture, "cuStreamEndCapture", &p, NULL,
                  end_capture_body, &a);
}

CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream h, CUstreamCaptureStatus *status,
                                        cuuint64_t *id, CUgraph *graph,
                                        const CUgraphNode **deps, const CUgraphEdgeData **edges,
                                        size_t *n_deps)
{
    fake_stream *s = resolve(h);
    if (!s || !status)
        RET("cuStreamGetCaptureInfo_v3", s ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_INVALID_HANDLE);
    pthread_mutex_lock(&dev_lock);
    *status = (CUstreamCaptureStatus)s->capture;
    if (id)
        *id = s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE && s->cap_origin ?
                  s->cap_origin->cap_id : 0;
    if (graph)
        *graph = s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE && s->cap_origin ?
                     (CUgraph)(void *)s->cap_origin->cap_graph : NULL;
    pthread_mutex_unlock(&dev_lock);
    static _Thread_local CUgraphNode dep;
    pthread_mutex_lock(&dev_lock);
    dep = s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE ? (CUgraphNode)(void *)s->cap_last : NULL;
    pthread_mutex_unlock(&dev_lock);
    if (deps)
        *deps = dep ? &dep : NULL;
    if (edges)
        *edges = NULL;
    if (n_deps)
        *n_deps = dep ? 1 : 0;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphInstantiate(CUgraphExec *phExec, CUgraph g, unsigned long long flags)
{
    (void)flags;
    ALIVE("cuGraphInstantiateWithFlags");
    if (!g || ((fake_graph *)g)->magic != MAGIC_GRAPH)
        RET("cuGraphInstantiateWithFlags", CUDA_ERROR_INVALID_VALUE);
    *phExec = (CUgraphExec)(void *)g;      /* the graph is its own executable */
    CUpti_GraphData gd;
    memset(&gd, 0, sizeof gd);
    gd.graph = g;
    gd.graphExec = *phExec;
    fire_resource(CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED, &gd);
    return CUDA_SUCCESS;
}

/* The graph is its own executable in the fake: CUPTI is told of each
 * destruction, and the operations are freed once both the graph and its
 * executable are destroyed (the caller has let its replays finish). */
static void graph_free_if_done(fake_graph *g)
{
    if (!g || g->magic != MAGIC_GRAPH || !g->graph_destroyed || !g->exec_destroyed)
        return;
    pthread_mutex_lock(&dev_lock);
    g->magic = 0;
    op *o = g->ops;
    g->ops = NULL;
    pthread_mutex_unlock(&dev_lock);
    while (o) {
        op *next = o->next;
        free(o);
        o = next;
    }
    free(g);
}

CUresult CUDAAPI cuGraphDestroy(CUgraph g)
{
    CUpti_GraphData gd;
    memset(&gd, 0, sizeof gd);
    gd.graph = g;
    fire_resource(CUPTI_CBID_RESOURCE_GRAPH_DESTROY_STARTING, &gd);
    if (g && ((fake_graph *)g)->magic == MAGIC_GRAPH) {
        ((fake_graph *)g)->graph_destroyed = 1;
        graph_free_if_done((fake_graph *)g);
    }
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec e)
{
    CUpti_GraphData gd;
    memset(&gd, 0, sizeof gd);
    gd.graphExec = e;
    fire_resource(CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING, &gd);
    if (e && ((fake_graph *)e)->magic == MAGIC_GRAPH) {
        ((fake_graph *)e)->exec_destroyed = 1;
        graph_free_if_done((fake_graph *)e);
    }
    return CUDA_SUCCESS;
}

/* The graph API that reads a graph (cuda_debug reads a graph being captured
 * before watching): nodes are the captured operations, in capture order. */
static op *graph_ops_of(fake_graph *g)       /* dev_lock held */
{
    return g->capturing ? g->capturing->cap_head : g->ops;
}

CUresult CUDAAPI cuGraphGetNodes(CUgraph hGraph, CUgraphNode *nodes, size_t *numNodes)
{
    fake_graph *g = (fake_graph *)hGraph;
    if (!g || g->magic != MAGIC_GRAPH || !numNodes)
        RET("cuGraphGetNodes", CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&dev_lock);
    size_t n = 0;
    for (op *o = graph_ops_of(g); o; o = o->next, n++)
        if (nodes && n < *numNodes)
            nodes[n] = (CUgraphNode)(void *)o;
    pthread_mutex_unlock(&dev_lock);
    if (nodes && n > *numNodes)
        n = *numNodes;
    *numNodes = n;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphNodeGetType(CUgraphNode hNode, CUgraphNodeType *type)
{
    const op *o = (const op *)hNode;
    if (!o || !type)
        RET("cuGraphNodeGetType", CUDA_ERROR_INVALID_VALUE);
    *type = o->kind == OP_KERNEL ? CU_GRAPH_NODE_TYPE_KERNEL :
            o->kind == OP_MEMSET32 ? CU_GRAPH_NODE_TYPE_MEMSET :
            o->kind == OP_EVENT ? CU_GRAPH_NODE_TYPE_EVENT_RECORD : CU_GRAPH_NODE_TYPE_BATCH_MEM_OP;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphKernelNodeGetParams_v2(CUgraphNode hNode, CUDA_KERNEL_NODE_PARAMS *p)
{
    const op *o = (const op *)hNode;
    if (!o || !p || o->kind != OP_KERNEL)
        RET("cuGraphKernelNodeGetParams_v2", CUDA_ERROR_INVALID_VALUE);
    memset(p, 0, sizeof *p);
    p->func = (CUfunction)(void *)o->fn;
    p->gridDimX = o->grid[0], p->gridDimY = o->grid[1], p->gridDimZ = o->grid[2];
    p->blockDimX = o->block[0], p->blockDimY = o->block[1], p->blockDimZ = o->block[2];
    return CUDA_SUCCESS;
}

/* CUDA 13.1's ids for tools: a node's is its graph's id above its local id;
 * an executable's id is its graph's plus 1000 (the driver mints both from one
 * counter). fake_tools_ids(0) makes them refused (an older driver). */
static int tools_ids = 1;
FAKE_EXPORT void fake_tools_ids(int on) { tools_ids = on; }

CUresult CUDAAPI cuGraphNodeGetToolsId(CUgraphNode hNode, unsigned long long *id);
CUresult CUDAAPI cuGraphNodeGetToolsId(CUgraphNode hNode, unsigned long long *id)
{
    const op *o = (const op *)hNode;
    if (!tools_ids)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!o || !id)
        RET("cuGraphNodeGetToolsId", CUDA_ERROR_INVALID_VALUE);
    *id = (unsigned long long)o->graph_serial << 32 | o->serial;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGraphExecGetId(CUgraphExec hExec, unsigned int *id);
CUresult CUDAAPI cuGraphExecGetId(CUgraphExec hExec, unsigned int *id)
{
    const fake_graph *g = (const fake_graph *)hExec;
    if (!tools_ids)
        return CUDA_ERROR_NOT_SUPPORTED;
    if (!g || g->magic != MAGIC_GRAPH || !id)
        RET("cuGraphExecGetId", CUDA_ERROR_INVALID_VALUE);
    *id = g->serial + 1000;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuFuncGetName(const char **name, CUfunction hfunc)
{
    fake_func *f = (fake_func *)hfunc;
    if (!name || !f || f->magic != MAGIC_FUNC)
        RET("cuFuncGetName", CUDA_ERROR_INVALID_HANDLE);
    *name = f->name;
    return CUDA_SUCCESS;
}

/* The runtime's kernel handles are CUkernels: here the same fake functions. */
CUresult CUDAAPI cuKernelGetName(const char **name, CUkernel hfunc)
{
    return cuFuncGetName(name, (CUfunction)(void *)hfunc);
}

/* As a driver that does not take a runtime's kernel handles (the H200 with
 * CUDA 12.8's runtime beside driver 580: cuKernelGetFunction refused them):
 * the launch hooks must leave such launches to the runtime, and say so. */
static int refuse_kernel_handles;
FAKE_EXPORT void fake_refuse_kernel_handles(int on) { refuse_kernel_handles = on; }

CUresult CUDAAPI cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel)
{
    if (refuse_kernel_handles)
        RET("cuKernelGetFunction", CUDA_ERROR_INVALID_HANDLE);
    fake_func *f = (fake_func *)(void *)kernel;
    if (!pFunc || !f || f->magic != MAGIC_FUNC)
        RET("cuKernelGetFunction", CUDA_ERROR_INVALID_HANDLE);
    if (!current_ctx())
        RET("cuKernelGetFunction", CUDA_ERROR_INVALID_CONTEXT);
    *pFunc = (CUfunction)(void *)f;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags);

typedef struct {
    fake_stream *s;
    fake_event *e;
} wait_arg;

/* A stream waiting for an event recorded in a capturing stream joins that
 * capture (fork); otherwise the fake orders nothing: streams of this device
 * are drained on demand. */
static CUresult wait_event_body(void *a)
{
    wait_arg *w = a;
    pthread_mutex_lock(&dev_lock);
    fake_stream *origin = w->e && w->e->magic == MAGIC_EVENT ? w->e->cap_origin : NULL;
    if (origin && origin->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE &&
        w->s->capture == CU_STREAM_CAPTURE_STATUS_NONE && w->s != &legacy_stream) {
        w->s->capture = CU_STREAM_CAPTURE_STATUS_ACTIVE;
        w->s->cap_origin = origin;
        w->s->cap_last = NULL;
    }
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream h, CUevent ev, unsigned int flags)
{
    cuStreamWaitEvent_params p = {h, ev, flags};
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamWaitEvent", CUDA_ERROR_INVALID_HANDLE);
    wait_arg w = {s, (fake_event *)ev};
    /* Traced: cuda_debug watches it as a possible capture join. */
    return traced(CUPTI_DRIVER_TRACE_CBID_cuStreamWaitEvent, "cuStreamWaitEvent", &p, NULL,
                  wait_event_body, &w);
}

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

static fake_func *function_named(const char *name)   /* dev_lock held */
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

/* ------------------------------------------------ driver: memory ------- */

CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t size)
{
    ALIVE("cuMemAlloc");
    void *p = calloc(1, size ? size : 1);
    if (!p)
        RET("cuMemAlloc", CUDA_ERROR_OUT_OF_MEMORY);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemFree(CUdeviceptr dptr)
{
    ALIVE("cuMemFree");
    free((void *)(uintptr_t)dptr);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemGetInfo(size_t *free_b, size_t *total)
{
    ALIVE("cuMemGetInfo");
    *free_b = (size_t)140 << 30;
    *total = (size_t)141 << 30;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)
{
    ALIVE("cuMemcpyHtoD");
    memcpy((void *)(uintptr_t)dst, src, n);
    return CUDA_SUCCESS;
}

typedef struct {
    void *dst;
    CUdeviceptr src;
    size_t n;
} copy_arg;

static CUresult dtoh_body(void *a)
{
    copy_arg *c = a;
    atomic_fetch_add(&st_syncs, 1);
    pthread_mutex_lock(&dev_lock);
    drain_locked(&legacy_stream);         /* synchronous copy on the legacy stream */
    pthread_mutex_unlock(&dev_lock);
    CUresult rc = sync_result();
    if (rc)
        return rc;
    memcpy(c->dst, (const void *)(uintptr_t)c->src, c->n);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
    copy_arg c = {dst, src, n};
    return traced(CUPTI_DRIVER_TRACE_CBID_cuMemcpyDtoH_v2, "cuMemcpyDtoH_v2", NULL, NULL,
                  dtoh_body, &c);
}

CUresult CUDAAPI cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n)
{
    ALIVE("cuMemsetD8");
    memset((void *)(uintptr_t)dst, v, n);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dst, unsigned int v, size_t n, CUstream h)
{
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuMemsetD32Async", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuMemsetD32Async");
    op *o = calloc(1, sizeof *o);
    o->kind = OP_MEMSET32;
    o->addr = (volatile uint32_t *)(uintptr_t)dst;
    o->value = v;
    o->count = n;
    pthread_mutex_lock(&dev_lock);
    if (refuse_capture_memset && s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        pthread_mutex_unlock(&dev_lock);
        free(o);
        RET("cuMemsetD32Async", CUDA_ERROR_INVALID_VALUE);
    }
    int captured = capture_append(s, o);
    if (!captured)
        enqueue(s, o);
    pthread_mutex_unlock(&dev_lock);
    return captured < 0 ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t size, unsigned int flags)
{
    (void)flags;
    ALIVE("cuMemHostAlloc");
    size_t n = size ? size : 1;
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        RET("cuMemHostAlloc", CUDA_ERROR_OUT_OF_MEMORY);
    host_range *r = calloc(1, sizeof *r);
    r->p = p;
    r->n = n;
    pthread_mutex_lock(&dev_lock);
    r->next = host_ranges;
    host_ranges = r;
    pthread_mutex_unlock(&dev_lock);
    *pp = p;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostGetDevicePointer(CUdeviceptr *pdptr, void *p, unsigned int flags)
{
    (void)flags;
    ALIVE("cuMemHostGetDevicePointer");
    *pdptr = (CUdeviceptr)(uintptr_t)p;   /* UVA: the same address */
    return CUDA_SUCCESS;
}

/* Forget the range starting at p (dev_lock held); returns it, unlinked, or NULL. */
static host_range *unlink_range(const void *p, int registered)
{
    for (host_range **r = &host_ranges; *r; r = &(*r)->next)
        if ((*r)->p == p && (*r)->registered == registered) {
            host_range *found = *r;
            *r = found->next;
            return found;
        }
    return NULL;
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
    ALIVE("cuMemFreeHost");
    pthread_mutex_lock(&dev_lock);
    host_range *r = unlink_range(p, 0);
    pthread_mutex_unlock(&dev_lock);
    if (!r)
        RET("cuMemFreeHost", CUDA_ERROR_INVALID_VALUE);
    munmap(r->p, r->n);
    free(r);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostRegister(void *p, size_t n, unsigned int flags)
{
    (void)flags;
    ALIVE("cuMemHostRegister_v2");
    if (!p || !n)
        RET("cuMemHostRegister_v2", CUDA_ERROR_INVALID_VALUE);
    pthread_mutex_lock(&dev_lock);
    for (host_range *r = host_ranges; r; r = r->next)
        if ((char *)p < r->p + r->n && r->p < (char *)p + n) {
            pthread_mutex_unlock(&dev_lock);
            RET("cuMemHostRegister_v2", CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
        }
    host_range *r = calloc(1, sizeof *r);
    r->p = p;
    r->n = n;
    r->registered = 1;
    r->next = host_ranges;
    host_ranges = r;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuMemHostUnregister(void *p)
{
    pthread_mutex_lock(&dev_lock);
    host_range *r = unlink_range(p, 1);
    pthread_mutex_unlock(&dev_lock);
    if (!r)
        RET("cuMemHostUnregister", CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
    free(r);
    return CUDA_SUCCESS;
}

/* Is [a, a+n) inside pinned memory the context knows? (dev_lock held) */
static int host_mapped(uintptr_t a, size_t n)
{
    for (host_range *r = host_ranges; r; r = r->next)
        if (a >= (uintptr_t)r->p && a + n <= (uintptr_t)r->p + r->n)
            return 1;
    return 0;
}

CUresult CUDAAPI cuStreamWriteValue32(CUstream h, CUdeviceptr addr, cuuint32_t value,
                                      unsigned int flags)
{
    (void)flags;
    fake_stream *s = resolve(h);
    if (!s)
        RET("cuStreamWriteValue32_v2", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuStreamWriteValue32_v2");
    op *o = calloc(1, sizeof *o);
    o->kind = OP_WRITE32;
    o->addr = (volatile uint32_t *)(uintptr_t)addr;
    o->value = value;
    pthread_mutex_lock(&dev_lock);
    if (!host_mapped((uintptr_t)addr, sizeof(uint32_t))) {
        /* freed (a reset) or never mapped: the real driver refuses it */
        pthread_mutex_unlock(&dev_lock);
        free(o);
        RET("cuStreamWriteValue32_v2", CUDA_ERROR_INVALID_VALUE);
    }
    int captured = capture_append(s, o);
    if (!captured)
        enqueue(s, o);
    pthread_mutex_unlock(&dev_lock);
    return captured < 0 ? CUDA_ERROR_STREAM_CAPTURE_INVALIDATED : CUDA_SUCCESS;
}

/* ------------------------------------------------ driver: events ------- */

CUresult CUDAAPI cuEventCreate(CUevent *ph, unsigned int flags)
{
    (void)flags;
    ALIVE("cuEventCreate");
    fake_event *e = calloc(1, sizeof *e);
    e->magic = MAGIC_EVENT;
    *ph = (CUevent)(void *)e;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventDestroy(CUevent h) { (void)h; return CUDA_SUCCESS; }

CUresult CUDAAPI cuEventRecord(CUevent h, CUstream hs)
{
    fake_event *e = (fake_event *)h;
    fake_stream *s = resolve(hs);
    if (!e || e->magic != MAGIC_EVENT || !s)
        RET("cuEventRecord", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuEventRecord");
    op *o = calloc(1, sizeof *o);
    o->kind = OP_EVENT;
    o->ev = e;
    pthread_mutex_lock(&dev_lock);
    if (s->capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        e->cap_origin = s->cap_origin;      /* a join point of the capture, not run */
        free(o);
    } else {
        e->cap_origin = NULL;
        e->stream = s;
        e->done = 0;
        enqueue(s, o);
    }
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuEventQuery(CUevent h)
{
    fake_event *e = (fake_event *)h;
    if (!e || e->magic != MAGIC_EVENT)
        RET("cuEventQuery", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuEventQuery");
    pthread_mutex_lock(&dev_lock);
    int done = e->done || !e->stream;
    pthread_mutex_unlock(&dev_lock);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

static CUresult event_sync_body(void *a)
{
    fake_event *e = a;
    atomic_fetch_add(&st_syncs, 1);
    pthread_mutex_lock(&dev_lock);
    if (e->stream)
        drain_locked(e->stream);
    pthread_mutex_unlock(&dev_lock);
    return sync_result();
}

CUresult CUDAAPI cuEventSynchronize(CUevent h)
{
    fake_event *e = (fake_event *)h;
    if (!e || e->magic != MAGIC_EVENT)
        RET("cuEventSynchronize", CUDA_ERROR_INVALID_HANDLE);
    return traced(CUPTI_DRIVER_TRACE_CBID_cuEventSynchronize, "cuEventSynchronize", NULL, NULL,
                  event_sync_body, e);
}

CUresult CUDAAPI cuEventElapsedTime(float *ms, CUevent a, CUevent b)
{
    fake_event *s = (fake_event *)a, *e = (fake_event *)b;
    if (!s || !e || s->magic != MAGIC_EVENT || e->magic != MAGIC_EVENT)
        RET("cuEventElapsedTime_v2", CUDA_ERROR_INVALID_HANDLE);
    ALIVE("cuEventElapsedTime_v2");
    if (!s->done || !e->done)
        RET("cuEventElapsedTime_v2", CUDA_ERROR_NOT_READY);
    *ms = (float)(e->t_ms - s->t_ms);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------ driver: logs --------- */

CUresult CUDAAPI cuLogsRegisterCallback(CUlogsCallback fn, void *data, CUlogsCallbackHandle *out)
{
    pthread_mutex_lock(&dev_lock);
    if (n_log_cbs >= MAX_LOG_CBS) {
        pthread_mutex_unlock(&dev_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    log_cbs[n_log_cbs].fn = fn;
    log_cbs[n_log_cbs].data = data;
    if (out)
        *out = (CUlogsCallbackHandle)(uintptr_t)(n_log_cbs + 1);
    n_log_cbs++;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuLogsUnregisterCallback(CUlogsCallbackHandle h)
{
    uintptr_t i = (uintptr_t)h;
    if (i < 1 || i > MAX_LOG_CBS)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&dev_lock);
    log_cbs[i - 1].fn = NULL;
    pthread_mutex_unlock(&dev_lock);
    return CUDA_SUCCESS;
}

/* ================================================== control API ========= */

/* A forked child (os.fork, multiprocessing's fork): the device threads are
 * the parent's and do not exist here; a lock one of them (or another thread)
 * held is free; the op a device thread was running, and the ops queued behind
 * it, are the parent's work on the parent's device: gone here (in async mode a
 * queued op no device thread of the child's would ever take kept the child's
 * first synchronising call waiting for good: the dump fork test hung so under
 * load, 8 of 48 runs). The next launch in async mode starts a device thread of
 * the child's. (The real driver is unusable after a fork; this one goes on
 * working, so tests can tell what cuda_debug records of the child's own
 * launches.) */
static void fake_after_fork_child(void)
{
    dev_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    dev_cv = (pthread_cond_t)PTHREAD_COND_INITIALIZER;
    print_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    sub_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
    for (fake_stream *s = all_streams; s; s = s->next_all) {
        s->has_worker = 0;
        s->running = 0;
        s->head = s->tail = NULL;      /* (not freed: a worker of the parent's held them) */
    }
}

__attribute__((constructor)) static void fake_register_atfork(void)
{
    pthread_atfork(NULL, NULL, fake_after_fork_child);
}

/* Alive again, nothing queued, default kernel behaviours, no refused ids.
 * Waits for the device threads to finish what runs now. Keeps subscriptions,
 * log callbacks and statistics (fake_reset_stats clears those). */
FAKE_EXPORT void fake_reset(void)
{
    pthread_mutex_lock(&dev_lock);
    drop_all_work();
    configs = NULL;                          /* leaked on purpose: ops may point at them */
    memset(refused, 0, sizeof refused);
    cupti_fail_when_dead = 1;
    refuse_resource = 0;
    refuse_capture_memset = 0;
    pthread_mutex_unlock(&dev_lock);
}

FAKE_EXPORT void fake_reset_stats(void)
{
    atomic_store(&st_callbacks, 0), atomic_store(&st_launch_calls, 0);
    atomic_store(&st_kernels_run, 0), atomic_store(&st_writes, 0);
    atomic_store(&st_dropped, 0), atomic_store(&st_syncs, 0);
    atomic_store(&st_lines_printed, 0), atomic_store(&st_log_lines, 0);
    atomic_store(&st_captured, 0), atomic_store(&st_refused, 0);
}

/* Kernels whose (mangled) name contains `name` (newest setting wins):
 *   code         0 = fine, else the sticky CUresult it kills the context with;
 *   assert_lines assert lines the driver prints at discovery (-1: 1 for 710,
 *                else 0); up to 100000;
 *   assert_text  the text inside Assertion `...` failed. (NULL: a default);
 *                text_len bytes are kept, NULs included, so printf's %s cuts
 *                at an embedded NUL like the real driver would;
 *   duration_us  how long the kernel runs. */
FAKE_EXPORT void fake_set_kernel(const char *name, int code, int assert_lines,
                                 const char *assert_text, long text_len, long long duration_us)
{
    kcfg *c = calloc(1, sizeof *c);
    c->name = strdup(name ? name : "");
    c->code = code;
    if (assert_lines < 0)
        assert_lines = code == 710 ? 1 : 0;
    if (assert_lines > 100000)
        assert_lines = 100000;
    c->lines = assert_lines;
    if (assert_text) {
        size_t n = text_len < 0 ? strlen(assert_text) : (size_t)text_len;
        c->cond = malloc(n + 1);
        memcpy(c->cond, assert_text, n);
        c->cond[n] = '\0';
        c->cond_len = n;
    } else if (code == 710) {
        c->cond = strdup("false");
        c->cond_len = 5;
    }
    c->file = strdup("fake_kernels.cu");
    c->line = 42;
    c->func = strdup(c->name);
    c->duration_us = duration_us;
    pthread_mutex_lock(&dev_lock);
    c->next = configs;
    configs = c;
    pthread_mutex_unlock(&dev_lock);
}

/* Where the assert lines of the newest setting for `name` say they come from. */
FAKE_EXPORT int fake_set_assert_site(const char *name, const char *file, int line,
                                     const char *func)
{
    pthread_mutex_lock(&dev_lock);
    kcfg *c = configs;
    while (c && strcmp(c->name, name))
        c = c->next;
    if (c) {
        c->file = strdup(file);
        c->line = line;
        c->func = strdup(func);
    }
    pthread_mutex_unlock(&dev_lock);
    return c ? 0 : -1;
}

FAKE_EXPORT void fake_set_async(int on)
{
    pthread_mutex_lock(&dev_lock);
    async_on = on != 0;
    for (fake_stream *s = all_streams; s; s = s->next_all)
        ensure_worker(s);
    pthread_cond_broadcast(&dev_cv);
    pthread_mutex_unlock(&dev_lock);
}

static fake_func *func_for(const char *name)
{
    pthread_mutex_lock(&dev_lock);
    fake_func *f = function_named(name);
    pthread_mutex_unlock(&dev_lock);
    return f;
}

/* The handle of kernel `name` (the fake runtime's cudaKernel_t). */
FAKE_EXPORT void *fake_function(const char *name) { return func_for(name); }

/* Launch kernel `name` through the public cuLaunchKernel (the callback fires),
 * with the primary context pushed around it. */
FAKE_EXPORT int fake_launch(const char *name, uintptr_t stream, unsigned gx, unsigned gy,
                            unsigned gz, unsigned bx, unsigned by, unsigned bz)
{
    fake_func *f = func_for(name);
    cuCtxPushCurrent(CTX);
    CUresult rc = cuLaunchKernel((CUfunction)(void *)f, gx, gy, gz, bx, by, bz, 0,
                                 (CUstream)stream, NULL, NULL);
    CUcontext c;
    cuCtxPopCurrent(&c);
    return (int)rc;
}

/* PyTorch's operator entry points, as libtorch exports them
 * (at::_ops::index_select::call, at::_ops::embedding::call and ::redispatch):
 * fake_aten_embedding launches `name` from inside them, so the native stack at
 * the launch holds the frames cuda_debug's fault path reads (csrc/capture/native_ops.c).
 * Mangled names are plain C identifiers. Each does work after its call, so
 * the compiler cannot turn the call into a jump and drop the frame. */
static volatile int aten_depth;
FAKE_EXPORT __attribute__((noinline)) int _ZN2at4_ops12index_select4callERKNS_6TensorElS4_(
    const char *name)
{
    aten_depth++;
    int rc = fake_launch(name, 0, 1, 1, 1, 4, 1, 1);
    aten_depth--;
    return rc;
}
FAKE_EXPORT __attribute__((noinline)) int _ZN2at4_ops9embedding10redispatchEN3c1014DispatchKeySetERKNS_6TensorES6_lbb(
    const char *name)
{
    aten_depth++;
    int rc = _ZN2at4_ops12index_select4callERKNS_6TensorElS4_(name);
    aten_depth--;
    return rc;
}
FAKE_EXPORT __attribute__((noinline)) int _ZN2at4_ops9embedding4callERKNS_6TensorES4_lbb(
    const char *name)
{
    aten_depth++;
    int rc = _ZN2at4_ops9embedding10redispatchEN3c1014DispatchKeySetERKNS_6TensorES6_lbb(name);
    aten_depth--;
    return rc;
}
/* Not an operator entry point: a look-alike without the ::call suffix. */
FAKE_EXPORT __attribute__((noinline)) int _ZN2at4_ops9embedding6schemaEv(const char *name)
{
    aten_depth++;
    int rc = _ZN2at4_ops9embedding4callERKNS_6TensorES4_lbb(name);
    aten_depth--;
    return rc;
}
FAKE_EXPORT int fake_aten_embedding(const char *name)
{
    return _ZN2at4_ops9embedding6schemaEv(name);
}

FAKE_EXPORT int fake_launch_ex(const char *name, uintptr_t stream, unsigned gx, unsigned gy,
                               unsigned gz, unsigned bx, unsigned by, unsigned bz)
{
    fake_func *f = func_for(name);
    CUlaunchConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.gridDimX = gx, cfg.gridDimY = gy, cfg.gridDimZ = gz;
    cfg.blockDimX = bx, cfg.blockDimY = by, cfg.blockDimZ = bz;
    cfg.hStream = (CUstream)stream;
    cuCtxPushCurrent(CTX);
    CUresult rc = cuLaunchKernelEx(&cfg, (CUfunction)(void *)f, NULL, NULL);
    CUcontext c;
    cuCtxPopCurrent(&c);
    return (int)rc;
}

FAKE_EXPORT int fake_launch_cooperative(const char *name, uintptr_t stream, unsigned gx,
                                        unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                        unsigned bz)
{
    fake_func *f = func_for(name);
    cuCtxPushCurrent(CTX);
    CUresult rc = cuLaunchCooperativeKernel((CUfunction)(void *)f, gx, gy, gz, bx, by, bz, 0,
                                            (CUstream)stream, NULL);
    CUcontext c;
    cuCtxPopCurrent(&c);
    return (int)rc;
}

/* A new stream (0 on failure). */
FAKE_EXPORT uintptr_t fake_stream_create(void)
{
    CUstream s = NULL;
    if (cuStreamCreate(&s, 0) != CUDA_SUCCESS)
        return 0;
    return (uintptr_t)s;
}

FAKE_EXPORT int fake_stream_sync(uintptr_t stream) { return (int)cuStreamSynchronize((CUstream)stream); }

FAKE_EXPORT int fake_ctx_sync(void)
{
    cuCtxPushCurrent(CTX);
    CUresult rc = cuCtxSynchronize();
    CUcontext c;
    cuCtxPopCurrent(&c);
    return (int)rc;
}

FAKE_EXPORT int fake_begin_capture(uintptr_t stream)
{
    cuCtxPushCurrent(CTX);            /* as the runtime has it, current */
    CUresult rc = cuStreamBeginCapture((CUstream)stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    CUcontext c;
    cuCtxPopCurrent(&c);
    return (int)rc;
}

/* End the capture and instantiate: *exec_out is the graph to fake_graph_launch. */
FAKE_EXPORT int fake_end_capture(uintptr_t stream, uintptr_t *exec_out)
{
    CUgraph g = NULL;
    CUcontext c;
    cuCtxPushCurrent(CTX);
    CUresult rc = cuStreamEndCapture((CUstream)stream, &g);
    cuCtxPopCurrent(&c);
    if (rc)
        return (int)rc;
    CUgraphExec e = NULL;
    rc = cuGraphInstantiate(&e, g, 0);
    if (!rc && exec_out)
        *exec_out = (uintptr_t)e;
    return (int)rc;
}

FAKE_EXPORT int fake_graph_launch(uintptr_t exec, uintptr_t stream)
{
    cuCtxPushCurrent(CTX);
    CUresult rc = cuGraphLaunch((CUgraphExec)exec, (CUstream)stream);
    CUcontext c;
    cuCtxPopCurrent(&c);
    return (int)rc;
}

/* cuDevicePrimaryCtxReset(0), what cudaDeviceReset does. */
FAKE_EXPORT int fake_primary_ctx_reset(void) { return (int)cuDevicePrimaryCtxReset(0); }

/* The primary context's id now (cuCtxGetId). */
FAKE_EXPORT unsigned fake_ctx_uid(void) { return atomic_load(&ctx_uid); }

/* cuMemsetD32Async refused (INVALID_VALUE) on a capturing stream. */
FAKE_EXPORT void fake_refuse_capture_memset(int on) { refuse_capture_memset = on != 0; }

/* CUPTI: refuse to enable resource-domain callbacks (an older CUPTI). */
FAKE_EXPORT void fake_refuse_resource(int on) { refuse_resource = on != 0; }

/* Events, for fork/join capture: create, record on a stream, make a stream wait. */
FAKE_EXPORT uintptr_t fake_event_create(void)
{
    CUevent e = NULL;
    return cuEventCreate(&e, 0) == CUDA_SUCCESS ? (uintptr_t)e : 0;
}

FAKE_EXPORT int fake_event_record(uintptr_t ev, uintptr_t stream)
{
    return (int)cuEventRecord((CUevent)ev, (CUstream)stream);
}

FAKE_EXPORT int fake_stream_wait_event(uintptr_t stream, uintptr_t ev)
{
    cuCtxPushCurrent(CTX);
    CUresult rc = cuStreamWaitEvent((CUstream)stream, (CUevent)ev, 0);
    CUcontext c;
    cuCtxPopCurrent(&c);
    return (int)rc;
}

FAKE_EXPORT int fake_graph_exec_destroy(uintptr_t exec) { return (int)cuGraphExecDestroy((CUgraphExec)exec); }
FAKE_EXPORT int fake_graph_destroy(uintptr_t graph) { return (int)cuGraphDestroy((CUgraph)graph); }

/* What a graph holds, by kind: out[0] kernels, out[1] stream writes, out[2] memsets. */
FAKE_EXPORT int fake_graph_ops(uintptr_t exec, int *out)
{
    fake_graph *g = (fake_graph *)exec;
    out[0] = out[1] = out[2] = 0;
    if (!g || g->magic != MAGIC_GRAPH)
        return -1;
    pthread_mutex_lock(&dev_lock);
    for (const op *o = g->ops; o; o = o->next)
        if (o->kind == OP_KERNEL)
            out[0]++;
        else if (o->kind == OP_WRITE32)
            out[1]++;
        else if (o->kind == OP_MEMSET32)
            out[2]++;
    pthread_mutex_unlock(&dev_lock);
    return 0;
}

/* The capture status of `stream` (CUstreamCaptureStatus), or -CUresult. */
FAKE_EXPORT int fake_capture_status(uintptr_t stream)
{
    fake_stream *s = resolve((CUstream)stream);
    if (!s)
        return -CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&dev_lock);
    int st = s->capture;
    pthread_mutex_unlock(&dev_lock);
    return st;
}

/* CUPTI: make cuptiEnableCallback refuse these driver callback ids with
 * CUPTI_ERROR_INVALID_PARAMETER, as an older CUPTI that does not know them
 * (n == 0 clears the list). */
FAKE_EXPORT void fake_refuse_cbids(const int *ids, int n)
{
    pthread_mutex_lock(&dev_lock);
    if (n <= 0)
        memset(refused, 0, sizeof refused);
    for (int i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < CUPTI_DRIVER_TRACE_CBID_SIZE)
            refused[ids[i]] = 1;
    pthread_mutex_unlock(&dev_lock);
}

/* CUPTI: another tool holds CUPTI (name reported by cuptiSubscribe_v2);
 * NULL or "" releases it. */
FAKE_EXPORT void fake_hold_cupti(const char *name)
{
    pthread_mutex_lock(&sub_lock);
    snprintf(external_holder, sizeof external_holder, "%s", name ? name : "");
    pthread_mutex_unlock(&sub_lock);
}

/* CUPTI: whether cuptiEnableCallback fails with NOT_INITIALIZED while the
 * context is dead (default 1, as measured on the H200). */
FAKE_EXPORT void fake_cupti_fail_when_dead(int on) { cupti_fail_when_dead = on != 0; }

/* Subscribed and enabled right now? (cbid < 0: subscribed at all) */
FAKE_EXPORT int fake_cupti_enabled(int cbid)
{
    if (!atomic_load(&sub.in_use))
        return 0;
    if (cbid < 0)
        return 1;
    return cbid < CUPTI_DRIVER_TRACE_CBID_SIZE && atomic_load(&sub.enabled[cbid]);
}

/* The context's sticky error (0 alive), as the device sees it (the host may
 * not have discovered it yet). */
FAKE_EXPORT int fake_sticky(void) { return current_sticky(); }

/* Name this OS thread with raw bytes (cut at 15 bytes, like the kernel does). */
FAKE_EXPORT int fake_set_thread_name(const char *bytes, int len)
{
    char buf[16];
    memset(buf, 0, sizeof buf);
    if (len > 15)
        len = 15;
    if (len > 0)
        memcpy(buf, bytes, (size_t)len);
    return prctl(PR_SET_NAME, buf, 0, 0, 0);
}

static pthread_t error_thread;
static int error_thread_started;
static atomic_int error_thread_done;

static void *error_loop(void *arg)
{
    long n = (long)(intptr_t)arg;
    prctl(PR_SET_NAME, "fake-glibc-err", 0, 0, 0);
    for (long i = 0; i < n; i++)
        error(0, 0, "fake glibc error %ld of %ld", i + 1, n);   /* locks/unlocks stderr */
    atomic_store(&error_thread_done, 1);
    return NULL;
}

/* Start a thread that calls glibc's error(0, 0, ...) n times (it takes and
 * releases the lock of whatever `stderr` is at each step). */
FAKE_EXPORT int fake_glibc_error_from_thread(long n)
{
    atomic_store(&error_thread_done, 0);
    error_thread_started = 1;
    return pthread_create(&error_thread, NULL, error_loop, (void *)(intptr_t)n);
}

/* 1 when the error() thread has finished (join it), 0 while it runs. */
FAKE_EXPORT int fake_glibc_error_done(int join)
{
    int done = atomic_load(&error_thread_done);
    if (join && error_thread_started) {
        pthread_join(error_thread, NULL);
        error_thread_started = 0;
        done = 1;
    }
    return done;
}

/* A module unloaded and another loaded at the same address: the function
 * named `old` takes the name `new` in place (same buffer, so CUPTI's
 * symbolName pointer stays the same). 0 on success, -1 if `new` is longer. */
FAKE_EXPORT int fake_rename_function(const char *old, const char *new_name)
{
    fire_resource(CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING, NULL);   /* as an unload does */
    pthread_mutex_lock(&dev_lock);
    fake_func *f = function_named(old);
    int ok = strlen(new_name) <= strlen(f->name);
    if (ok)
        strcpy(f->name, new_name);
    pthread_mutex_unlock(&dev_lock);
    return ok ? 0 : -1;
}

/* Launch `name` again and again for `ms` milliseconds, in one C call (a
 * framework's launch loop that never returns to Python, e.g. a daemon
 * thread's during interpreter shutdown); the number of launches. */
FAKE_EXPORT long fake_launch_loop(const char *name, long ms)
{
    double end = now_ms() + (double)ms;
    long n = 0;
    while (now_ms() < end) {
        fake_launch(name, 0, 1, 1, 1, 32, 1, 1);
        n++;
    }
    return n;
}

/* Launch kernel `name` n times on `stream` (a capture of n nodes without n
 * calls from Python): the first failure's CUresult, or 0. */
FAKE_EXPORT int fake_launch_n(const char *name, uintptr_t stream, long n)
{
    for (long i = 0; i < n; i++) {
        int rc = fake_launch(name, stream, 1, 1, 1, 32, 1, 1);
        if (rc)
            return rc;
    }
    return 0;
}

/* ---- a stale frame chain above the launch: what unwinding meets across a
 * switched stack (greenlet, a fiber). fake_stale_call(fn, arg, frame, sp)
 * calls fn(arg) with the frame pointer set to `frame` (and, when sp is not
 * NULL, the stack switched to sp): its own unwind rule says "my caller's frame
 * is at rbp", so an unwinder walking up from fn reads frame[1] as a return
 * address (pointing back into fake_stale_call) and frame[0] as the caller's
 * frame pointer: a garbage value, where the next read faults. */
#if defined(__x86_64__)
void fake_stale_call(void (*fn)(void *), void *arg, void *frame, void *sp);
extern char fake_stale_call_body[];
__asm__(
    ".text\n"
    ".globl fake_stale_call\n"
    ".type fake_stale_call, @function\n"
    "fake_stale_call:\n"
    ".cfi_startproc\n"
    "    pushq %rbp\n"
    ".cfi_def_cfa_offset 16\n"
    ".cfi_offset %rbp, -16\n"
    "    movq %rsp, %rbp\n"
    ".cfi_def_cfa_register %rbp\n"
    "    pushq %rbx\n"
    "    pushq %r12\n"
    "    movq %rsp, %r12\n"            /* our stack, to come back to */
    "    movq %rbp, %rbx\n"            /* our frame */
    "    testq %rcx, %rcx\n"
    "    jz 1f\n"
    "    movq %rcx, %rsp\n"            /* the switched stack (16-byte aligned) */
    "1:  movq %rdx, %rbp\n"            /* the stale frame */
    "    movq %rdi, %rax\n"
    "    movq %rsi, %rdi\n"
    "    callq *%rax\n"
    ".globl fake_stale_call_body\n"
    "fake_stale_call_body:\n"
    "    nop\n"
    "    movq %r12, %rsp\n"
    "    movq %rbx, %rbp\n"
    "    popq %r12\n"
    "    popq %rbx\n"
    "    popq %rbp\n"
    ".cfi_def_cfa %rsp, 8\n"
    "    ret\n"
    ".cfi_endproc\n"
    ".size fake_stale_call, .-fake_stale_call\n");

static void stale_frame(uintptr_t frame[2])
{
    frame[0] = 0x10;                                   /* the caller's "frame pointer" */
    frame[1] = (uintptr_t)fake_stale_call_body + 1;    /* back inside fake_stale_call */
}
#endif

typedef struct {
    const char *name;
    int rc;
} launch_job;

static void launch_job_run(void *arg)
{
    launch_job *j = arg;
    j->rc = fake_aten_embedding(j->name);
}

/* Launch `name` (from inside the fake ATen ops) on a stack of its own, a
 * fiber's, whose base frame is stale. -1000 where not supported (not x86-64). */
FAKE_EXPORT int fake_launch_on_fiber(const char *name)
{
#if defined(__x86_64__)
    size_t size = 1u << 20;
    char *stack = malloc(size);
    if (!stack)
        return -1001;
    uintptr_t *frame = (uintptr_t *)(((uintptr_t)stack + size - 64) & ~(uintptr_t)15);
    stale_frame(frame);
    launch_job j = {name, -1002};
    fake_stale_call(launch_job_run, &j, frame, frame - 2);
    free(stack);
    return j.rc;
#else
    (void)name;
    return -1000;
#endif
}

/* Call fn() (a ctypes callback: Python code) below a stale frame on this
 * thread's own stack, as greenlet runs a greenlet's Python code: 0, or -1000
 * where not supported. */
FAKE_EXPORT int fake_call_below_stale_frame(void (*fn)(void))
{
#if defined(__x86_64__)
    uintptr_t frame[4];
    stale_frame(frame);
    fake_stale_call((void (*)(void *))(void *)fn, NULL, frame, NULL);
    return 0;
#else
    (void)fn;
    return -1000;
#endif
}

/* Statistics: fills out[0..n) with callbacks, launch_calls, kernels_run,
 * writes, dropped, syncs, lines_printed, log_lines, captured, refused. */
FAKE_EXPORT int fake_stats(long long *out, int n)
{
    long long v[] = {atomic_load(&st_callbacks), atomic_load(&st_launch_calls),
                     atomic_load(&st_kernels_run), atomic_load(&st_writes),
                     atomic_load(&st_dropped), atomic_load(&st_syncs),
                     atomic_load(&st_lines_printed), atomic_load(&st_log_lines),
                     atomic_load(&st_captured), atomic_load(&st_refused)};
    int m = (int)(sizeof v / sizeof v[0]);
    for (int i = 0; i < n && i < m; i++)
        out[i] = v[i];
    return m;
}

/* ------------------------------------------------ signal chaining tests -- */

#include <signal.h>

/* fake_count_signal(sig, sleep_us): a C handler for `sig` (installed before
 * cuda_debug's, which then chains to it) that counts its calls and sleeps
 * sleep_us in each: a window in which another thread's signal arrives. */
static atomic_int sig_calls;
static long sig_sleep_us;

static void counting_handler(int sig)
{
    (void)sig;
    atomic_fetch_add(&sig_calls, 1);
    struct timespec ts = {sig_sleep_us / 1000000, (sig_sleep_us % 1000000) * 1000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

FAKE_EXPORT int fake_count_signal(int sig, long sleep_us)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = counting_handler;
    sigemptyset(&sa.sa_mask);
    sig_sleep_us = sleep_us;
    return sigaction(sig, &sa, NULL);
}

FAKE_EXPORT int fake_signal_calls(void) { return atomic_load(&sig_calls); }
