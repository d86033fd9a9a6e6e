/*
 * capture/stderr_tee.c: catch the device's assert text without holding back anyone's output.
 *
 * When a kernel fails an assert, the driver prints "file:line: kernel: block:
 * [..], thread: [..] Assertion `...` failed." through libc's `stderr` FILE,
 * from the thread whose synchronising call finds the fault. At the first scope
 * or watch, `stderr` is pointed, once and for the rest of the process, at a
 * pass-through stream (fopencookie): every write goes straight to fd 2 with
 * write(2), in the order it was made, nothing buffered; and
 *   - a thread with an open window (the launch callback, around its wait)
 *     also gets a copy of its own text, up to its buffer, the rest counted as
 *     cut (the report says so; all of it still reached fd 2);
 *   - lines that look like device asserts are also kept in a small ring,
 *     numbered by the bytes ever kept: the driver may print them from another
 *     thread than the one whose wait found the fault (seen on the H200), and
 *     in watch mode they come out at whichever call finds the fault. A fault
 *     takes, from the ring, the assert lines written since its wait began
 *     that name its own kernel (cd_tee_asserts_since).
 * Other threads' text never lands in a window; writes through this FILE are
 * serialised by its stdio lock. The global pointer is swapped once, not per
 * launch: a per-launch swap could leave `stderr` locked forever (glibc's
 * error() locks one FILE and unlocks the other when the swap falls between).
 * CUDA_DEBUG_CAPTURE=off leaves `stderr` alone (no assert text in reports).
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "capture/capture.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static FILE *tee_fp;
static atomic_int installed;
static _Thread_local cd_window *tls_window;

#define RECENT 16384
static char recent[RECENT];
static size_t recent_len;
static _Atomic uint64_t recent_total;   /* bytes ever kept: recent[] ends at this count */
static atomic_flag recent_lock = ATOMIC_FLAG_INIT;

static void write_all(int fd, const char *buf, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return;
        }
        buf += w;
        n -= (size_t)w;
    }
}

/* Keep the device-assert lines of buf in the recent ring (oldest dropped). */
static void remember_asserts(const char *buf, size_t n)
{
    const char *end = buf + n, *line = buf;
    while (line < end) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t len = (size_t)((nl ? nl + 1 : end) - line);
        if (len > 20 && memmem(line, len, "Assertion `", 11) && memmem(line, len, "block: [", 8)) {
            if (len > RECENT / 4)
                len = RECENT / 4;
            while (atomic_flag_test_and_set_explicit(&recent_lock, memory_order_acquire))
                ;
            if (recent_len + len > RECENT) {       /* drop the oldest half */
                size_t keep = recent_len / 2;
                memmove(recent, recent + recent_len - keep, keep);
                recent_len = keep;
            }
            memcpy(recent + recent_len, line, len);
            recent_len += len;
            atomic_store_explicit(&recent_total, recent_total + len, memory_order_release);
            atomic_flag_clear_explicit(&recent_lock, memory_order_release);
        }
        line += len;
        if (!nl)
            break;
    }
}

/* The driver writes one line in several pieces (seen on the H200): each
 * thread's pieces are joined into whole lines before they are looked at. */
#define LINE_MAX_KEPT 1024
static _Thread_local char tls_line[LINE_MAX_KEPT];
static _Thread_local size_t tls_line_len;

static void collect_lines(const char *buf, size_t n)
{
    while (n > 0) {
        const char *nl = memchr(buf, '\n', n);
        size_t piece = nl ? (size_t)(nl - buf) + 1 : n;
        size_t room = LINE_MAX_KEPT - tls_line_len, c = piece < room ? piece : room;
        memcpy(tls_line + tls_line_len, buf, c);
        tls_line_len += c;
        if (nl) {
            if (tls_line[tls_line_len - 1] != '\n')      /* cut: keep the line whole-ish */
                tls_line[tls_line_len - 1] = '\n';
            remember_asserts(tls_line, tls_line_len);
            tls_line_len = 0;
        }
        buf += piece;
        n -= piece;
    }
}

static ssize_t tee_write(void *cookie, const char *buf, size_t n)
{
    (void)cookie;
    cd_window *w = tls_window;
    if (w) {
        size_t room = w->cap - w->len, c = n < room ? n : room;
        memcpy(w->buf + w->len, buf, c);
        w->len += c;
        w->cut += n - c;
    }
    collect_lines(buf, n);
    write_all(2, buf, n);
    return (ssize_t)n;             /* never stall stdio on an fd-2 error */
}

static void atfork_child(void)
{
    tls_window = NULL;
    tls_line_len = 0;
    atomic_flag_clear(&recent_lock);
}

int cd_tee_install(void)
{
    if (atomic_load(&installed))
        return 0;
    cookie_io_functions_t io = {.read = NULL, .write = tee_write, .seek = NULL, .close = NULL};
    FILE *fp = fopencookie(NULL, "w", io);
    if (!fp)
        return -1;
    setvbuf(fp, NULL, _IONBF, 0);
    int expected = 0;
    if (!atomic_compare_exchange_strong(&installed, &expected, 1)) {
        fclose(fp);
        return 0;
    }
    fflush(stderr);
    tee_fp = fp;
    pthread_atfork(NULL, NULL, atfork_child);
    stderr = tee_fp;
    return 0;
}

int cd_tee_installed(void) { return atomic_load(&installed); }

void cd_tee_open(cd_window *w, char *buf, size_t cap)
{
    w->buf = buf;
    w->cap = cap;
    w->len = 0;
    w->cut = 0;
    tls_window = w;
}

void cd_tee_close(void) { tls_window = NULL; }

size_t cd_tee_recent_asserts(char *out, size_t cap)
{
    while (atomic_flag_test_and_set_explicit(&recent_lock, memory_order_acquire))
        ;
    size_t n = recent_len < cap ? recent_len : cap;
    memcpy(out, recent + recent_len - n, n);
    atomic_flag_clear_explicit(&recent_lock, memory_order_release);
    return n;
}

uint64_t cd_tee_assert_mark(void)
{
    return atomic_load_explicit(&recent_total, memory_order_acquire);   /* hot path: no lock */
}

/* Does an assert line ("file:line: FUNC: block: [..]...") name `kernel`?
 * FUNC is the device function as the compiler printed it: a plain name
 * (`nll_loss_forward_reduce_cuda_kernel_2d`) or a pretty signature (`void
 * ns::check_index(const T *, int, T) [with T = int]`). Its identifier (before
 * the parameters and template arguments, after the last "::" or space) is
 * found verbatim in the mangled or plain kernel name. */
static int names_kernel(const char *line, size_t len, const char *kernel)
{
    if (!kernel || !kernel[0])
        return 1;
    const char *b = memmem(line, len, ": block: [", 10);
    if (!b)
        return 0;
    const char *f = line;          /* FUNC starts after the second ": " (file:line: ) */
    const char *c1 = memmem(line, (size_t)(b - line), ": ", 2);
    if (!c1)
        return 0;
    f = c1 + 2;
    const char *end = b;
    for (const char *p = f; p < b; p++)
        if (*p == '(' || *p == '<' || *p == '[') {
            end = p;
            break;
        }
    while (end > f && end[-1] == ' ')
        end--;
    const char *start = end;
    while (start > f && start[-1] != ' ' && start[-1] != ':')
        start--;
    size_t n = (size_t)(end - start);
    if (n == 0 || n > 200)
        return 0;
    if (n == 8 && !memcmp(start, "operator", 8))
        return 1;                  /* a lambda's operator(): it names no kernel */
    char ident[201];
    memcpy(ident, start, n);
    ident[n] = '\0';
    return strstr(kernel, ident) != NULL;
}

size_t cd_tee_asserts_since(uint64_t mark, const char *kernel, char *out, size_t cap,
                            size_t *cut)
{
    size_t o = 0;
    *cut = 0;
    while (atomic_flag_test_and_set_explicit(&recent_lock, memory_order_acquire))
        ;
    uint64_t first = recent_total - recent_len;
    const char *p = recent + (mark > first ? mark - first : 0), *end = recent + recent_len;
    if (mark <= recent_total) {
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t len = (size_t)((nl ? nl + 1 : end) - p);
            if (names_kernel(p, len, kernel)) {
                size_t c = len < cap - o ? len : cap - o;
                memcpy(out + o, p, c);
                o += c;
                *cut += len - c;
            }
            p += len;
        }
    }
    atomic_flag_clear_explicit(&recent_lock, memory_order_release);
    return o;
}
