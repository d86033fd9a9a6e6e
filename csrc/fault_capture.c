/*
 * fault_capture.c: what we keep about a fault, captured cheaply at the event.
 *
 *  - the fault record (one, the latest; Python copies it out);
 *  - the device's own assert text. The driver prints "file:line: kernel: block:
 *    [..], thread: [..] Assertion `...` failed." to stderr while the sync that
 *    finds the fault runs. Two ways to catch it, chosen at import
 *    (CUDA_DEBUG_CAPTURE=stdio|fd|off):
 *      stdio: swap libc's `stderr` FILE pointer for an in-memory stream around
 *             the wait (a pointer store, no system call) - works when the driver
 *             writes through stdio;
 *      fd:    dup2() a pipe onto fd 2 around the wait (three system calls).
 *    Text that was not the fault's (another thread writing meanwhile) is
 *    forwarded to the real stderr, so nothing is lost;
 *  - the driver's error log (cuLogsRegisterCallback, CUDA >= 12.9): a ring of
 *    the last lines, each numbered, so a fault can name the lines before it.
 */
#define _GNU_SOURCE
#include "cuda_debug.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* --------------------------------------------------------- fault record -- */

void cd_fault_record(const cd_fault *f)
{
    pthread_mutex_lock(&cd_state.fault_lock);
    cd_state.fault = *f;
    cd_state.fault.seq = atomic_fetch_add(&cd_state.fault_seq, 1) + 1;
    pthread_mutex_unlock(&cd_state.fault_lock);
}

/* ------------------------------------------------------ stderr capture -- */

static char stdio_buf[64 * 1024];
static FILE *stdio_fp;            /* fmemopen over stdio_buf */
static FILE *real_stderr;          /* libc's stderr at init */
static atomic_int stdio_owner;     /* 1 while one thread has stderr swapped */

static int pipe_fds[2] = {-1, -1};
static atomic_int fd_windows;      /* open fd-2 windows */
static int fd_saved = -1;          /* the real fd 2 while windows are open */

void cd_capture_init(void)
{
    if (cd_state.capture_mode == CD_CAPTURE_STDIO) {
        real_stderr = stderr;
        stdio_fp = fmemopen(stdio_buf, sizeof stdio_buf, "w");
        if (!stdio_fp)
            cd_state.capture_mode = CD_CAPTURE_OFF;
        else
            setvbuf(stdio_fp, NULL, _IONBF, 0);
    } else if (cd_state.capture_mode == CD_CAPTURE_FD) {
        if (pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0)
            cd_state.capture_mode = CD_CAPTURE_OFF;
        else
            fcntl(pipe_fds[1], F_SETPIPE_SZ, 1 << 20);
    }
}

/* Per-thread: did this thread's begin() take the capture? */
static _Thread_local char tls_took;

void cd_capture_begin(void)
{
    tls_took = 0;
    if (cd_state.capture_mode == CD_CAPTURE_STDIO) {
        int expected = 0;
        if (atomic_compare_exchange_strong(&stdio_owner, &expected, 1)) {
            stderr = stdio_fp;
            tls_took = 1;
        }
    } else if (cd_state.capture_mode == CD_CAPTURE_FD) {
        if (atomic_fetch_add(&fd_windows, 1) == 0) {
            fd_saved = dup(2);
            dup2(pipe_fds[1], 2);
        }
        tls_took = 1;
    }
}

static void forward(const char *buf, size_t n)
{
    if (cd_state.capture_mode == CD_CAPTURE_STDIO) {
        fwrite(buf, 1, n, real_stderr);
        fflush(real_stderr);
        return;
    }
    int fd = fd_saved >= 0 ? fd_saved : 2;
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w <= 0 && errno != EINTR)
            break;
        if (w > 0) {
            buf += w;
            n -= (size_t)w;
        }
    }
}

/* Close this thread's window. If `failed`, copy what was captured into `out`
 * (the device's text); everything captured is also forwarded to the real
 * stderr. With out == NULL: just drain and forward (used at release). */
void cd_capture_end(int failed, char *out, size_t cap, size_t *len)
{
    if (len)
        *len = 0;
    if (cd_state.capture_mode == CD_CAPTURE_STDIO) {
        if (!tls_took)
            return;
        stderr = real_stderr;
        long n = ftell(stdio_fp);
        if (n > 0) {
            if (failed && out) {
                size_t c = (size_t)n < cap ? (size_t)n : cap;
                memcpy(out, stdio_buf, c);
                *len = c;
            }
            forward(stdio_buf, (size_t)n);
            rewind(stdio_fp);
        }
        tls_took = 0;
        atomic_store(&stdio_owner, 0);
    } else if (cd_state.capture_mode == CD_CAPTURE_FD) {
        if (tls_took && atomic_fetch_sub(&fd_windows, 1) == 1) {
            dup2(fd_saved, 2);
            close(fd_saved);
            fd_saved = -1;
        }
        tls_took = 0;
        if (!failed && out)
            return;   /* drained lazily: at the next fault or at release */
        char buf[8192];
        ssize_t r;
        size_t got = 0;
        while ((r = read(pipe_fds[0], buf, sizeof buf)) > 0) {
            if (failed && out && got < cap) {
                size_t c = (size_t)r < cap - got ? (size_t)r : cap - got;
                memcpy(out + got, buf, c);
                got += c;
            }
            forward(buf, (size_t)r);
        }
        if (len)
            *len = got;
    }
}

/* ----------------------------------------------------------- driver log -- */

#define LOG_LINES 64
#define LOG_LEN 512
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static char log_ring[LOG_LINES][LOG_LEN];
static atomic_uint_fast64_t log_count;   /* lines ever logged */
static CUlogsCallbackHandle log_handle;

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
}

void cd_driver_log_init(void)
{
    if (!log_handle && cd_drv.cuLogsRegisterCallback)
        CU_CHECK(cd_drv.cuLogsRegisterCallback(on_driver_log, NULL, &log_handle));
}

uint64_t cd_driver_log_count(void) { return atomic_load(&log_count); }

PyObject *cd_driver_log_lines(uint64_t from, uint64_t to)
{
    PyObject *out = PyList_New(0);
    if (!out)
        return NULL;
    pthread_mutex_lock(&log_lock);
    uint64_t n = atomic_load(&log_count);
    if (to > n)
        to = n;
    if (to > LOG_LINES && from < to - LOG_LINES)
        from = to - LOG_LINES;
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
