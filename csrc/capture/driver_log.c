/*
 * capture/driver_log.c: the driver's own error log (cuLogsRegisterCallback, CUDA >= 12.9).
 *
 * The driver logs lines such as "Returning 710 (CUDA_ERROR_ASSERT) from
 * cuStreamSynchronize". We keep the last LOG_LINES of them, numbered, so a
 * fault record can say which lines preceded it (its log_end). A line that
 * reports a sticky error is also the earliest moment watch mode hears of a
 * fault found by somebody else's call: the hook the layer above registered
 * (cd_driver_log_init) is called then, after the line is kept.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "capture/capture.h"

#include <string.h>     /* memmem, memcpy, strnlen */

#define LOG_LINES 64
#define LOG_LEN 512
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_ring[LOG_LINES][LOG_LEN];
static atomic_uint_fast64_t log_count;   /* lines ever logged */
static CUlogsCallbackHandle log_handle;
static cd_sticky_logged_fn on_sticky_hook;

/* "... Returning 710 (CUDA_ERROR_ASSERT) ..." -> 710, else 0. */
static int returned_code(const char *msg, size_t n)
{
    const char *p = memmem(msg, n, "Returning ", 10);
    if (!p)
        return 0;
    p += 10;
    int code = 0;
    while (p < msg + n && *p >= '0' && *p <= '9' && code < 100000)
        code = code * 10 + (*p++ - '0');
    return code;
}

static void on_driver_log(void *data, CUlogLevel level, char *message, size_t length)
{
    (void)data;
    (void)level;
    pthread_mutex_lock(&log_lock);
    uint64_t i = atomic_load(&log_count);
    size_t n = length < LOG_LEN - 1 ? length : LOG_LEN - 1;
    memcpy(log_ring[i % LOG_LINES], message, n);
    log_ring[i % LOG_LINES][n] = '\0';
    atomic_store(&log_count, i + 1);
    pthread_mutex_unlock(&log_lock);
    int code = returned_code(message, n);
    cd_sticky_logged_fn hook = on_sticky_hook;
    if (cd_is_sticky(code) && hook)
        hook(code);
}

void cd_driver_log_init(cd_sticky_logged_fn on_sticky)
{
    on_sticky_hook = on_sticky;
    if (!log_handle && cd_drv.cuLogsRegisterCallback)
        CU_CHECK(cd_drv.cuLogsRegisterCallback(on_driver_log, NULL, &log_handle));
}

uint64_t cd_driver_log_count(void) { return atomic_load(&log_count); }

long cd_driver_log_line(uint64_t i, char *out, size_t cap)
{
    long n = -1;
    if (!cap)
        return -1;
    pthread_mutex_lock(&log_lock);
    uint64_t count = atomic_load(&log_count);
    if (i < count && count - i <= LOG_LINES) {   /* else overwritten by a newer line */
        size_t len = strnlen(log_ring[i % LOG_LINES], LOG_LEN);
        if (len >= cap)
            len = cap - 1;
        memcpy(out, log_ring[i % LOG_LINES], len);
        out[len] = '\0';
        n = (long)len;
    }
    pthread_mutex_unlock(&log_lock);
    return n;
}

void cd_driver_log_fork(int op)
{
    cd_fork_lock(&log_lock, op);
}
