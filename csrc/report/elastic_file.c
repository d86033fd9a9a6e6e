/*
 * report/elastic_file.c: torchrun's error file (TORCHELASTIC_ERROR_FILE).
 *
 * torch.distributed.elastic reads the file a failed worker leaves there and
 * names its message as the root cause, instead of "Signal 6". The fault
 * path's blocks (fault_report.c) feed it: written once, at the first fault,
 * with open/write only (async-signal-safe); a signal's is kept only until a
 * fault writes its own; a Python report written later (run's exit) replaces
 * it with the full text.
 */
#include "report/report.h"

#include <fcntl.h>      /* open, O_WRONLY, O_CREAT, ... */
#include <stdio.h>       /* snprintf */
#include <string.h>      /* memchr */
#include <time.h>        /* time */
#include <unistd.h>      /* close */

static char elastic_file[1024];        /* TORCHELASTIC_ERROR_FILE, "" when unset */
static atomic_int elastic_written;      /* 0, ELASTIC_BY_SIGNAL or ELASTIC_FINAL */

void cd_elastic_configure(const char *path)
{
    snprintf(elastic_file, sizeof elastic_file, "%s", path ? path : "");
}

void cd_elastic_fork(int op)
{
    if (op == CD_FORK_CHILD)
        atomic_store(&elastic_written, 0);
}

/* The format is ErrorHandler.record_exception's: {"message": {"message": ...,
 * "extraInfo": {"py_callstack": ..., "timestamp": "..."}}}. */
static void json_str(cd_out *o, const char *s, size_t n)
{
    cd_out_put(o, "\"", 1);
    for (size_t i = 0; i < n && s[i]; i++) {
        char c = s[i];
        if (c == '"' || c == '\\') {
            cd_out_put(o, "\\", 1);
            cd_out_put(o, &c, 1);
        } else if (c == '\n') {
            cd_out_put(o, "\\n", 2);
        } else if ((unsigned char)c >= 0x20) {
            cd_out_put(o, &c, 1);
        }
    }
    cd_out_put(o, "\"", 1);
}

/* Written once by a fault (final); a signal's (SIGABRT, or a SIGTERM about to
 * end the process) is kept only until a fault writes its own. */
enum { ELASTIC_BY_SIGNAL = 1, ELASTIC_FINAL = 2 };

void cd_elastic_write(const char *block, size_t n, int by_signal)
{
    if (!elastic_file[0])
        return;
    if (by_signal) {
        int none = 0;
        if (!atomic_compare_exchange_strong(&elastic_written, &none, ELASTIC_BY_SIGNAL))
            return;
    } else if (atomic_exchange(&elastic_written, ELASTIC_FINAL) == ELASTIC_FINAL) {
        return;
    }
    /* the headline: the block's first line, without "cuda_debug: " */
    const char *nl = memchr(block, '\n', n);
    size_t first = nl ? (size_t)(nl - block) : n;
    cd_out o = {.n = 0, .line_start = 0, .raw = 1};
    cd_out_puts(&o, "{\"message\": {\"message\": ");
    json_str(&o, block, first);
    cd_out_puts(&o, ", \"extraInfo\": {\"py_callstack\": ");
    json_str(&o, block, n);
    cd_out_puts(&o, ", \"timestamp\": \"");
    cd_out_u(&o, (unsigned long long)time(NULL));
    cd_out_puts(&o, "\"}}}\n");
    int fd = open(elastic_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0)
        return;
    cd_write_all(fd, o.buf, o.n);
    close(fd);
}
