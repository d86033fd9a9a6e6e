/*
 * fake_control.c: The control API (fake_*), called by the tests through
 * ctypes.
 * Part of the fake libcuda.so.1: fake_driver.h says what it emulates.
 */
#include "fake_driver.h"

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
