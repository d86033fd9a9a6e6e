/*
 * report/fault_report.c: write the report at the moment of the fault, before we may die.
 *
 * A process can be killed a millisecond after a fault is found: NCCL's
 * watchdog aborts it, torchrun sends SIGTERM, a notebook kernel is restarted.
 * So, as faulthandler does, the C fault path writes one compact block to fd 2
 * with write(2), from fixed buffers, before control returns to the framework:
 *
 *   cuda_debug: device-side assert (CUDA_ERROR_ASSERT) in check_index<int>
 *     launched at /home/me/train.py:42 in step
 *     grid [1,1,1] block [32,1,1] shared 0 B, stream 0x0, device 0, thread python (tid 4242)
 *     device: fault_kernels.cu:14: check_index: block: [0,0,0], thread: [3,0,0] Assertion ...
 *     The CUDA context is now unusable: restart the process.
 *
 * The Python exception follows as usual when the process lives on. Texts that
 * Python owns (error names, what each error is) are handed over once by
 * cd_report_configure. CUDA_DEBUG_REPORT=0 (Python) turns the block off; with
 * RANK set, every line starts with "[rank k] ".
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "report/report.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_NAMES 48
static struct {
    int code;
    char name[48];
    char what[64];
} names[MAX_NAMES];
static int n_names;
static int enabled = 1;
static char prefix[32];
static char restart[160] = "The CUDA context is now unusable: restart the process.";
static char elastic_file[1024];        /* TORCHELASTIC_ERROR_FILE, "" when unset */
static atomic_int elastic_written;
atomic_int cd_report_written;          /* the culprit block of watch mode: once */
static atomic_int consequences;        /* one-line notes for refusals, a few at most */

/* Called before the first scope (Python: _report.configure_core), while no
 * fault path can run: plain stores. */
void cd_report_configure(int on, const char *pfx, const char *error_file, const char *text)
{
    enabled = on;
    snprintf(elastic_file, sizeof elastic_file, "%s", error_file ? error_file : "");
    snprintf(prefix, sizeof prefix, "%s", pfx ? pfx : "");
    if (text)
        snprintf(restart, sizeof restart, "%s", text);
}

void cd_report_name_error(int code, const char *name, const char *what)
{
    int i = 0;
    while (i < n_names && names[i].code != code)
        i++;
    if (i == MAX_NAMES)
        return;
    names[i].code = code;
    snprintf(names[i].name, sizeof names[i].name, "%s", name);
    snprintf(names[i].what, sizeof names[i].what, "%s", what);
    if (i == n_names)
        n_names++;
}

/* ---------------------------------------------- a writer with no malloc -- */

typedef struct {
    char buf[6144];
    size_t n;
    int line_start;
    int raw;                       /* 1: no rank prefix (the JSON) */
} out_t;

/* The length of the valid UTF-8 sequence at s (of n bytes), 0 if invalid. */
static size_t utf8_seq(const unsigned char *s, size_t n)
{
    size_t k;
    unsigned min;
    if (s[0] >= 0xC2 && s[0] <= 0xDF)
        k = 2, min = 0x80;
    else if (s[0] >= 0xE0 && s[0] <= 0xEF)
        k = 3, min = 0x800;
    else if (s[0] >= 0xF0 && s[0] <= 0xF4)
        k = 4, min = 0x10000;
    else
        return 0;
    if (n < k)
        return 0;
    unsigned c = s[0] & (0x7F >> k);
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80)
            return 0;
        c = (c << 6) | (s[i] & 0x3F);
    }
    if (c < min || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF))
        return 0;
    return k;
}

/* Never trust text we did not make: control characters become '?', bytes
 * that are not valid UTF-8 (a thread name cut inside a character, a binary
 * kernel name) are written escaped, \xe5, so that a reader decoding stderr as
 * UTF-8 never fails. */
static void put(out_t *o, const char *s, size_t len)
{
    const size_t room = sizeof o->buf - 6;
    for (size_t i = 0; i < len && o->n < room;) {
        if (o->line_start && prefix[0] && !o->raw) {
            for (const char *p = prefix; *p && o->n < room; p++)
                o->buf[o->n++] = *p;
        }
        unsigned char c = (unsigned char)s[i];
        o->line_start = c == '\n';
        if (c < 0x80) {
            o->buf[o->n++] = c != '\n' && c != '\t' && (c < 0x20 || c == 0x7F) ? '?' : (char)c;
            i++;
            continue;
        }
        size_t k = utf8_seq((const unsigned char *)s + i, len - i);
        if (k && o->n + k <= room) {
            memcpy(o->buf + o->n, s + i, k);
            o->n += k;
            i += k;
        } else if (!k) {
            o->buf[o->n++] = '\\';
            o->buf[o->n++] = 'x';
            o->buf[o->n++] = "0123456789abcdef"[c >> 4];
            o->buf[o->n++] = "0123456789abcdef"[c & 15];
            i++;
        } else {
            break;
        }
    }
}

static void puts_(out_t *o, const char *s) { put(o, s, strlen(s)); }

static void put_u(out_t *o, unsigned long long v)
{
    char t[24];
    int i = 0;
    do {
        t[i++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && i < 23);
    while (i)
        put(o, &t[--i], 1);
}

static void put_hex(out_t *o, unsigned long long v)
{
    char t[20];
    int i = 0;
    do {
        t[i++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v && i < 19);
    puts_(o, "0x");
    while (i)
        put(o, &t[--i], 1);
}

static void put_dims(out_t *o, const unsigned *d)
{
    puts_(o, "[");
    put_u(o, d[0]);
    puts_(o, ",");
    put_u(o, d[1]);
    puts_(o, ",");
    put_u(o, d[2]);
    puts_(o, "]");
}

static void flush(out_t *o)
{
    if (o->n && o->buf[o->n - 1] != '\n')
        o->buf[o->n++] = '\n';
    const char *p = o->buf;
    size_t n = o->n;
    while (n > 0) {
        ssize_t w = write(2, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        p += w;
        n -= (size_t)w;
    }
    o->n = 0;
}

static void put_error(out_t *o, int code)
{
    for (int i = 0; i < n_names; i++)
        if (names[i].code == code) {
            puts_(o, names[i].what);
            puts_(o, " (");
            puts_(o, names[i].name);
            puts_(o, ")");
            return;
        }
    puts_(o, "CUDA error ");
    put_u(o, (unsigned)code);
}

/* "launched at file:line in func" from location ids, innermost first: the
 * innermost user frame; else the outermost pseudo-file (python -c); else the
 * innermost frame. */
static void put_location(out_t *o, const uint32_t *ids, int n, int complete)
{
    int pick = -1;
    cd_location loc;
    for (int i = 0; i < n && pick < 0; i++)
        if (cd_location_get(ids[i], &loc) == 0 && loc.kind == CD_LOC_USER)
            pick = i;
    if (pick < 0 && complete == 1 && n > 0 && cd_location_get(ids[n - 1], &loc) == 0 &&
        loc.kind == CD_LOC_PSEUDO)
        pick = n - 1;
    if (pick < 0 && n > 0)
        pick = 0;
    if (pick < 0 || cd_location_get(ids[pick], &loc) != 0) {
        puts_(o, "  launched from no Python frame (a framework thread, or C code)\n");
        return;
    }
    const char *file = cd_interned(loc.file), *func = cd_interned(loc.func);
    puts_(o, "  launched at ");
    puts_(o, file ? file : "?");
    puts_(o, ":");
    put_u(o, (unsigned)(loc.lineno < 0 ? 0 : loc.lineno));
    puts_(o, " in ");
    puts_(o, func ? func : "?");
    if (loc.kind != CD_LOC_USER)
        puts_(o, " (library code: no frame of yours was found)");
    puts_(o, "\n");
}

/* The first device-assert line of text (or the first line). */
static void put_device_text(out_t *o, const char *text, size_t len, size_t cut)
{
    if (!len)
        return;
    const char *end = text + len, *line = text, *pick = NULL;
    size_t pick_len = 0, lines = 0;
    while (line < end) {
        const char *nl = memchr(line, '\n', (size_t)(end - line));
        size_t l = (size_t)((nl ? nl : end) - line);
        if (l) {
            lines++;
            if (!pick || (!memmem(pick, pick_len, "Assertion", 9) && memmem(line, l, "Assertion", 9))) {
                pick = line;
                pick_len = l;
            }
        }
        line += l + 1;
    }
    if (!pick)
        return;
    puts_(o, "  device: ");
    put(o, pick, pick_len > 400 ? 400 : pick_len);
    if (lines > 1) {
        puts_(o, " (+");
        put_u(o, lines - 1);
        puts_(o, " more lines)");
    }
    if (cut) {
        puts_(o, " [");
        put_u(o, cut);
        puts_(o, " more bytes of device output cut here; all of it went to stderr]");
    }
    puts_(o, "\n");
}

static void put_kernel(out_t *o, const char *mangled)
{
    char s[256];
    size_t n = cd_short_kernel_name(mangled, s, sizeof s);
    put(o, s, n);
}

/* ------------------------------------------ torchrun's error file --- */

/* torch.distributed.elastic reads TORCHELASTIC_ERROR_FILE when a worker
 * fails and names its message as the root cause, instead of "Signal 6". The
 * format is ErrorHandler.record_exception's: {"message": {"message": ...,
 * "extraInfo": {"py_callstack": ..., "timestamp": "..."}}}. Written once, at
 * the first fault, with open/write only (async-signal-safe); a Python report
 * written later (run's exit) replaces it with the full text. */
static void json_str(out_t *o, const char *s, size_t n)
{
    put(o, "\"", 1);
    for (size_t i = 0; i < n && s[i]; i++) {
        char c = s[i];
        if (c == '"' || c == '\\') {
            put(o, "\\", 1);
            put(o, &c, 1);
        } else if (c == '\n') {
            put(o, "\\n", 2);
        } else if ((unsigned char)c >= 0x20) {
            put(o, &c, 1);
        }
    }
    put(o, "\"", 1);
}

static void write_elastic(const char *block, size_t n)
{
    if (!elastic_file[0] || atomic_exchange(&elastic_written, 1))
        return;
    /* the headline: the block's first line, without "cuda_debug: " */
    const char *nl = memchr(block, '\n', n);
    size_t first = nl ? (size_t)(nl - block) : n;
    out_t o = {.n = 0, .line_start = 0, .raw = 1};
    puts_(&o, "{\"message\": {\"message\": ");
    json_str(&o, block, first);
    puts_(&o, ", \"extraInfo\": {\"py_callstack\": ");
    json_str(&o, block, n);
    puts_(&o, ", \"timestamp\": \"");
    put_u(&o, (unsigned long long)time(NULL));
    puts_(&o, "\"}}}\n");
    int fd = open(elastic_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    const char *p = o.buf;
    size_t left = o.n;
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        p += w;
        left -= (size_t)w;
    }
    close(fd);
}

/* flush() that also feeds the elastic file (before the block is written). */
static void flush_report(out_t *o)
{
    /* the block without the rank prefixes, for the JSON */
    char plain[sizeof o->buf];
    size_t k = 0, pl = strlen(prefix);
    for (size_t i = 0; i < o->n && k < sizeof plain; ) {
        if (pl && (i == 0 || o->buf[i - 1] == '\n') && o->n - i >= pl &&
            !memcmp(o->buf + i, prefix, pl)) {
            i += pl;
            continue;
        }
        plain[k++] = o->buf[i++];
    }
    const char *body = plain;
    if (k > 12 && !memcmp(body, "cuda_debug", 10)) {    /* headline without our name */
        const char *c = memchr(body, ':', k);
        if (c && c - body < 24 && c + 2 < body + k) {
            k -= (size_t)(c + 2 - body);
            body = c + 2;
        }
    }
    write_elastic(body, k);
    flush(o);
}

void cd_report_fault(const cd_fault *f)
{
    if (!enabled)
        return;
    out_t o = {.n = 0, .line_start = 1};
    if (f->consequence) {
        if (atomic_fetch_add(&consequences, 1) >= 3)
            return;
        puts_(&o, "cuda_debug: ");
        put_error(&o, f->code);
        puts_(&o, f->at_launch ? ": a launch of " : ": a wait after ");
        put_kernel(&o, f->kernel[0] ? f->kernel : "a graph");
        puts_(&o, " failed because the CUDA context was already dead (thread tid ");
        put_u(&o, (unsigned long long)f->thread_id);
        puts_(&o, "); the cause is reported above\n");
        flush(&o);
        return;
    }
    puts_(&o, "cuda_debug: ");
    put_error(&o, f->code);
    if (f->at_launch && !cd_is_sticky(f->code)) {
        puts_(&o, ": the launch of ");
        put_kernel(&o, f->kernel);
        puts_(&o, " was refused\n");
    } else if (f->kernel[0]) {
        puts_(&o, " in ");
        put_kernel(&o, f->kernel);
        puts_(&o, "\n");
    } else {
        puts_(&o, " in a CUDA graph replay\n");
    }
    put_location(&o, f->frames, f->n_frames, f->frames_complete);
    puts_(&o, "  grid ");
    put_dims(&o, f->grid);
    puts_(&o, " block ");
    put_dims(&o, f->block);
    puts_(&o, " shared ");
    put_u(&o, f->shared_mem);
    puts_(&o, " B, stream ");
    put_hex(&o, f->stream);
    puts_(&o, ", device ");
    if (f->device >= 0)
        put_u(&o, (unsigned)f->device);
    else
        puts_(&o, "?");
    puts_(&o, ", thread ");
    put(&o, f->thread_name, strnlen(f->thread_name, sizeof f->thread_name));
    puts_(&o, " (tid ");
    put_u(&o, (unsigned long long)f->thread_id);
    puts_(&o, ")\n");
    put_device_text(&o, f->device_message, f->device_message_len, f->device_message_cut);
    if (cd_is_sticky(f->code)) {
        puts_(&o, "  ");
        puts_(&o, restart);
        puts_(&o, "\n");
        flush_report(&o);
    } else {
        flush(&o);
    }
}

/* The ops are read from the native stack after the block is out (the walk
 * could meet stale frames: the block must be written before it runs). */
void cd_report_fault_ops(const cd_fault *f)
{
    if (!enabled || f->consequence || !f->n_ops)
        return;
    out_t o = {.n = 0, .line_start = 1};
    puts_(&o, "cuda_debug: op aten::");       /* outermost first, as the user called them */
    put(&o, f->ops[f->n_ops - 1], strnlen(f->ops[f->n_ops - 1], CD_OP_NAME));
    for (int i = f->n_ops - 2; i >= 0; i--) {
        puts_(&o, " > aten::");
        put(&o, f->ops[i], strnlen(f->ops[i], CD_OP_NAME));
    }
    puts_(&o, " (the fault above, thread tid ");
    put_u(&o, (unsigned long long)f->thread_id);
    puts_(&o, ")\n");
    flush(&o);
}

/* ----------------------------------------------------- watch mode -------- */

void cd_report_watch_culprit(int code, const char *found_at, int from_signal)
{
    if (!enabled)
        return;
    uint64_t seqs[8];
    int n = cd_watch_incomplete(0, seqs, 8), guess = n < 0;
    if (guess)
        n = 1;
    if (code == 0 && n == 0)
        return;                    /* a signal, and nothing unfinished: nothing to say */
    if (atomic_exchange(&cd_report_written, 1))
        return;
    out_t o = {.n = 0, .line_start = 1};
    puts_(&o, "cuda_debug (watch): ");
    if (code) {
        put_error(&o, code);
        puts_(&o, ", found at ");
        puts_(&o, found_at);
    } else {
        puts_(&o, found_at);
        puts_(&o, " while watching, and no CUDA error seen yet: the launches still unfinished "
                  "(a kernel fault makes them so; so does a hang)");
    }
    puts_(&o, "\n");
    char asserts[2048];
    size_t alen = from_signal ? 0 : cd_tee_recent_asserts(asserts, sizeof asserts);
    int shown = 0;
    for (int i = 0; i < n && shown < 3; i++) {
        cd_watch_record r;
        if (cd_watch_get(seqs[i], &r) != 0)
            continue;
        const char *kernel = cd_interned(r.kernel_short);
        puts_(&o, shown ? "  or: " : guess ? "  culprit (a guess: completion markers missing; "
                                              "the last launch recorded): "
                                  : (n == 1 ? "  culprit: " : "  culprit (one of the first "
                                                              "unfinished launches per stream): "));
        if (r.flags & CD_WATCH_GRAPH)
            puts_(&o, "a CUDA graph replay");
        else
            puts_(&o, kernel ? kernel : "?");
        puts_(&o, " (launch #");
        put_u(&o, seqs[i]);
        puts_(&o, ", stream ");
        put_hex(&o, r.stream);
        puts_(&o, ", thread ");
        put_u(&o, (unsigned)r.thread_id);
        puts_(&o, ")\n");
        put_location(&o, r.frames, r.n_frames, 0);
        shown++;
    }
    if (!shown)
        puts_(&o, "  no unfinished launch in the watch ring: the faulting kernel was launched "
                  "before watch() or more than 65536 launches ago\n");
    put_device_text(&o, asserts, alen, 0);
    if (code) {
        puts_(&o, "  ");
        puts_(&o, restart);
        puts_(&o, "\n");
    }
    flush_report(&o);
}

/* ------------------------------------------------ dying of a signal --- */

/* NCCL's watchdog aborts the process (SIGABRT) when it meets the sticky
 * error; torchrun ends the other ranks with SIGTERM. Before that, while
 * watching, write what the ring knows (faulthandler-style: async-signal-safe,
 * then the previous handler, or the default action, runs). */
static struct sigaction old_abrt, old_term;
static atomic_int handlers_installed;

static void on_fatal_signal(int sig, siginfo_t *info, void *uctx)
{
    if (atomic_load(&cd_state.watching))
        cd_report_watch_culprit(0, sig == SIGABRT ? "SIGABRT" : "SIGTERM", 1);
    struct sigaction *old = sig == SIGABRT ? &old_abrt : &old_term;
    if ((old->sa_flags & SA_SIGINFO) && old->sa_sigaction) {
        old->sa_sigaction(sig, info, uctx);
    } else if (old->sa_handler != SIG_DFL && old->sa_handler != SIG_IGN &&
               old->sa_handler != NULL) {
        old->sa_handler(sig);
    } else {
        sigaction(sig, old, NULL);
        raise(sig);
    }
}

int cd_install_signal_handlers(void)
{
    if (atomic_exchange(&handlers_installed, 1))
        return 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fatal_signal;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGABRT, &sa, &old_abrt) != 0 || sigaction(SIGTERM, &sa, &old_term) != 0)
        return -1;
    return 0;
}
