/*
 * driver_log.c: the driver's own error log (cuLogsRegisterCallback, CUDA >= 12.9).
 *
 * The driver logs lines such as "Returning 710 (CUDA_ERROR_ASSERT) from
 * cuStreamSynchronize". We keep the last LOG_LINES of them, numbered, so a
 * fault record can say which lines preceded it (its log_end). A line that
 * reports a sticky error is also the earliest moment watch mode hears of a
 * fault found by somebody else's call: the culprit report is written then.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "cuda_debug.h"

#include <stdlib.h>
#include <string.h>

#define LOG_LINES 64
#define LOG_LEN 512
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_ring[LOG_LINES][LOG_LEN];
static atomic_uint_fast64_t log_count;   /* lines ever logged */
static CUlogsCallbackHandle log_handle;

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
    if (cd_is_sticky(code) && atomic_load_explicit(&cd_state.watching, memory_order_relaxed))
        cd_report_watch_culprit(code, "driver log", 0);
}

void cd_driver_log_init(void)
{
    if (!log_handle && cd_drv.cuLogsRegisterCallback)
        CU_CHECK(cd_drv.cuLogsRegisterCallback(on_driver_log, NULL, &log_handle));
}

uint64_t cd_driver_log_count(void) { return atomic_load(&log_count); }

/* Lines [from, to) still in the ring: a line is gone once LOG_LINES newer
 * ones were logged after it (its slot holds a newer line). */
PyObject *cd_driver_log_lines(uint64_t from, uint64_t to)
{
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    pthread_mutex_lock(&log_lock);
    uint64_t n = atomic_load(&log_count);
    if (to > n)
        to = n;
    if (n > LOG_LINES && from < n - LOG_LINES)
        from = n - LOG_LINES;
    for (uint64_t i = from; i < to; i++) {
        PyObject *b = PyBytes_FromString(log_ring[i % LOG_LINES]);
        if (!b || PyList_Append(out, b) < 0) {
            Py_XDECREF(b);
            Py_DECREF(out);
            pthread_mutex_unlock(&log_lock);
            return NULL;
        }
        Py_DECREF(b);
    }
    pthread_mutex_unlock(&log_lock);
    return out;
}
