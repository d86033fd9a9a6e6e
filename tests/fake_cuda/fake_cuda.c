/*
 * fake_cuda.c: State (kernels, streams, graphs, events, pinned memory,
 * statistics), error names, the error log and cuLogs*, shared helpers.
 * Part of the fake libcuda.so.1: fake_driver.h says what it emulates.
 */
#include "fake_driver.h"

/* ------------------------------------------------------------ state ---- */

struct fake_the_ctx the_ctx = {MAGIC_CTX};
struct fake_the_module the_module = {MAGIC_MOD};

pthread_mutex_t dev_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t dev_cv = PTHREAD_COND_INITIALIZER;
pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;

fake_stream legacy_stream = {MAGIC_STREAM, 0};
fake_stream *all_streams = &legacy_stream;
int next_stream_id = 1;
int async_on;
int sticky;
pending_print *pending_head, **pending_tail = &pending_head;
kcfg *configs;
fake_func *funcs;
int primary_retained;
/* The primary context's id (cuCtxGetId, CUPTI's contextUid): a reset makes
 * a new context behind the same CUcontext pointer, with the next id. */
atomic_uint ctx_uid = 1;
unsigned long long next_capture_id = 1;
unsigned next_graph_serial, next_op_serial;

/* Pinned host memory the context knows: its own allocations (cuMemHostAlloc,
 * each its own mapping, made inaccessible at a reset and never reused, so a
 * reader of freed slots faults as on the real driver) and registrations (cuMemHostRegister: the
 * memory is the caller's, only forgotten at a reset). Under dev_lock. */
host_range *host_ranges;

_Thread_local CUcontext tls_ctx_stack[32];
_Thread_local int tls_ctx_depth;

/* statistics (fake_stats / fake_stat) */
atomic_llong st_callbacks, st_launch_calls, st_kernels_run, st_writes, st_dropped,
    st_syncs, st_lines_printed, st_log_lines, st_captured, st_refused;

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

CUresult logret(const char *api, CUresult rc)
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

/* ----------------------------------------------------- helpers --------- */

double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

void sleep_ns(long long ns)
{
    if (ns <= 0)
        return;
    struct timespec ts = {ns / 1000000000LL, ns % 1000000000LL};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

int current_sticky(void)
{
    pthread_mutex_lock(&dev_lock);
    int s = sticky;
    pthread_mutex_unlock(&dev_lock);
    return s;
}

CUcontext current_ctx(void)
{
    return tls_ctx_depth ? tls_ctx_stack[tls_ctx_depth - 1] : NULL;
}

/* Stream handle -> stream (NULL, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD: the
 * one default stream); NULL for a bad handle. */
fake_stream *resolve(CUstream h)
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
const kcfg *lookup_cfg(const char *name)
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
