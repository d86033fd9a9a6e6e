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

#include <signal.h>     /* sigset_t, pthread_sigmask, sigemptyset, ... */
#include <stdio.h>       /* snprintf */
#include <string.h>      /* memchr, memmem, strlen, ... */
#include <time.h>        /* timespec, time_t, nanosleep */

#define MAX_NAMES 48
static struct {
    int code;
    char name[48];
    char what[64];
} names[MAX_NAMES];
static int n_names;
static int enabled = 1;
static char restart[160] = "The CUDA context is now unusable: restart the process.";
static atomic_int report_written;       /* the culprit block of watch mode: once */
static atomic_int signal_written;      /* the block of a SIGABRT/SIGTERM: once, apart */
static atomic_int consequences;        /* one-line notes for refusals, a few at most */
static atomic_uint_fast64_t test_pause_ns;  /* tests: a pause inside the watch block's writing */

void cd_report_test_pause(uint64_t ns) { atomic_store(&test_pause_ns, ns); }

/* Called before the first scope (Python: _report.configure_core), while no
 * fault path can run: plain stores. */
void cd_report_configure(int on, const char *pfx, const char *error_file, const char *text)
{
    enabled = on;
    cd_elastic_configure(error_file);
    cd_out_set_prefix(pfx);
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

static void put_error(cd_out *o, int code)
{
    for (int i = 0; i < n_names; i++)
        if (names[i].code == code) {
            cd_out_puts(o, names[i].what);
            cd_out_puts(o, " (");
            cd_out_puts(o, names[i].name);
            cd_out_puts(o, ")");
            return;
        }
    cd_out_puts(o, "CUDA error ");
    cd_out_u(o, (unsigned)code);
}

/* The first device-assert line of text (or the first line). */
static void put_device_text(cd_out *o, const char *text, size_t len, size_t cut)
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
    cd_out_puts(o, "  device: ");
    cd_out_put(o, pick, pick_len > 400 ? 400 : pick_len);
    if (lines > 1) {
        cd_out_puts(o, " (+");
        cd_out_u(o, lines - 1);
        cd_out_puts(o, " more lines)");
    }
    if (cut) {
        cd_out_puts(o, " [");
        cd_out_u(o, cut);
        cd_out_puts(o, " more bytes of device output cut here; all of it went to stderr]");
    }
    cd_out_puts(o, "\n");
}

static void put_kernel(cd_out *o, const char *mangled)
{
    char s[256];
    size_t n = cd_short_kernel_name(mangled, s, sizeof s);
    cd_out_put(o, s, n);
}

/* cd_out_flush() that also feeds the elastic file (before the block is written):
 * to_elastic: 0 no, 1 as a fault's, 2 as a signal's; to_fd: write it to fd 2. */
static void flush_report_to(cd_out *o, int to_elastic, int to_fd)
{
    /* the block without the rank prefixes, for the JSON */
    char plain[sizeof o->buf];
    const char *prefix = cd_out_prefix();
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
    if (to_elastic)
        cd_elastic_write(body, k, to_elastic == 2);
    if (to_fd)
        cd_out_flush(o);
    o->n = 0;
}

static void flush_report(cd_out *o) { flush_report_to(o, 1, 1); }

void cd_report_fault(const cd_fault *f)
{
    if (!enabled)
        return;
    cd_out o = {.n = 0, .line_start = 1};
    if (f->consequence) {
        if (atomic_fetch_add(&consequences, 1) >= 3)
            return;
        cd_out_puts(&o, "cuda_debug: ");
        put_error(&o, f->code);
        cd_out_puts(&o, f->at_launch ? ": a launch of " : ": a wait after ");
        put_kernel(&o, f->kernel[0] ? f->kernel : "a graph");
        cd_out_puts(&o, " failed because the CUDA context was already dead (thread tid ");
        cd_out_u(&o, (unsigned long long)f->thread_id);
        char cause[CD_KERNEL_NAME];
        if (f->cause_seq && f->cause_thread != f->thread_id &&
            cd_fault_kernel_of(f->cause_seq, cause, sizeof cause)) {
            /* another thread's fault: name it (its own block is above) */
            cd_out_puts(&o, "): it met the fault of ");
            put_kernel(&o, cause);
            cd_out_puts(&o, " (thread tid ");
            cd_out_u(&o, (unsigned long long)f->cause_thread);
            cd_out_puts(&o, "), reported in that thread's block\n");
        } else {
            cd_out_puts(&o, "); the cause is reported above\n");
        }
        cd_out_flush(&o);
        return;
    }
    cd_out_puts(&o, "cuda_debug: ");
    put_error(&o, f->code);
    if (f->at_launch && !cd_is_sticky(f->code)) {
        cd_out_puts(&o, ": the launch of ");
        put_kernel(&o, f->kernel);
        cd_out_puts(&o, " was refused\n");
    } else if (f->kernel[0]) {
        cd_out_puts(&o, " in ");
        put_kernel(&o, f->kernel);
        cd_out_puts(&o, "\n");
    } else {
        cd_out_puts(&o, " in a CUDA graph replay\n");
    }
    cd_out_location(&o, f->frames, f->n_frames, f->frames_complete);
    cd_out_puts(&o, "  grid ");
    cd_out_dims(&o, f->grid);
    cd_out_puts(&o, " block ");
    cd_out_dims(&o, f->block);
    cd_out_puts(&o, " shared ");
    cd_out_u(&o, f->shared_mem);
    cd_out_puts(&o, " B, stream ");
    cd_out_hex(&o, f->stream);
    cd_out_puts(&o, ", device ");
    if (f->device >= 0)
        cd_out_u(&o, (unsigned)f->device);
    else
        cd_out_puts(&o, "?");
    cd_out_puts(&o, ", thread ");
    cd_out_put(&o, f->thread_name, strnlen(f->thread_name, sizeof f->thread_name));
    cd_out_puts(&o, " (tid ");
    cd_out_u(&o, (unsigned long long)f->thread_id);
    cd_out_puts(&o, ")\n");
    put_device_text(&o, f->device_message, f->device_message_len, f->device_message_cut);
    if (cd_is_sticky(f->code)) {
        cd_out_puts(&o, "  ");
        cd_out_puts(&o, restart);
        cd_out_puts(&o, "\n");
        flush_report(&o);
    } else {
        cd_out_flush(&o);
    }
}

/* The ops are read from the native stack after the block is out (the walk
 * could meet stale frames: the block must be written before it runs). */
void cd_report_fault_ops(const cd_fault *f)
{
    if (!enabled || f->consequence || !f->n_ops)
        return;
    cd_out o = {.n = 0, .line_start = 1};
    cd_out_puts(&o, "cuda_debug: op aten::");       /* outermost first, as the user called them */
    cd_out_put(&o, f->ops[f->n_ops - 1], strnlen(f->ops[f->n_ops - 1], CD_OP_NAME));
    for (int i = f->n_ops - 2; i >= 0; i--) {
        cd_out_puts(&o, " > aten::");
        cd_out_put(&o, f->ops[i], strnlen(f->ops[i], CD_OP_NAME));
    }
    cd_out_puts(&o, " (the fault above, thread tid ");
    cd_out_u(&o, (unsigned long long)f->thread_id);
    cd_out_puts(&o, ")\n");
    cd_out_flush(&o);
}

/* ----------------------------------------------------- watch mode -------- */

static void put_launch_ids(cd_out *o, uint64_t seq, uintptr_t stream, int32_t tid)
{
    cd_out_puts(o, "launch #");
    cd_out_u(o, seq);
    cd_out_puts(o, ", stream ");
    cd_out_hex(o, stream);
    cd_out_puts(o, ", thread ");
    cd_out_u(o, (unsigned)tid);
}

/* How the culprit's candidates were chosen (culprit_candidates). */
typedef struct {
    int proven;                /* a marker is missing: the candidates are unfinished */
    uint32_t total;            /* candidates in all (some may not be in out[]) */
    cd_verdict v;              /* verdict.c's */
} cd_culprit_pick;

/* A graph replay judged by the device's text: the best CD_ASSERT_* level (and
 * words) of the nodes it may have been running, as the Python report judges
 * the nodes it expands the replay into. 0 when its nodes are unknown. */
static int graph_level(const cd_watch_record *r, const char *text, size_t tlen, int *level,
                       int *words)
{
    uint32_t all[256];
    int status, capture;
    int n = cd_graph_unfinished(r, all, 256, &status, &capture);
    *level = CD_ASSERT_NONE;
    *words = 0;
    if (n <= 0)
        return 0;
    for (int i = 0; i < n && i < 256; i++) {
        cd_watch_record nr;
        uint32_t index;
        int done;
        const char *kernel;
        if (cd_graph_node(all[i], &nr, &index, &done) != 0 || !(kernel = cd_interned(nr.kernel)) ||
            !kernel[0])
            continue;
        int lv = cd_tee_text_level(text, tlen, kernel, NULL);
        int w = cd_tee_text_affinity(text, tlen, kernel);
        if (lv > *level)
            *level = lv;
        if (w > *words)
            *words = w;
    }
    return 1;
}

/* The culprit's candidates, from host memory: the launches of each stream
 * whose marker did not come back, from its last returned marker on (one
 * launch per stream when every launch has its marker); when no marker is
 * missing, the launches whose completion is unknown (proven 0); in launch
 * order, then decided by the one rule (verdict.c). Returns the count kept in
 * out[]. */
static int culprit_candidates(cd_stream_scan *scan, uint64_t *out, int max, const char *asserts,
                              size_t alen, cd_culprit_pick *pick)
{
    int n = cd_watch_scan(0, scan, CD_INFLIGHT_MAX, NULL), any_open = 0;
    for (int i = 0; i < n; i++)
        any_open |= scan[i].open != 0;
    memset(pick, 0, sizeof *pick);
    pick->proven = any_open;
    if (max > CD_VERDICT_MAX)
        max = CD_VERDICT_MAX;
    int k = 0;
    for (int i = 0; i < n; i++) {
        if (any_open && !scan[i].open)
            continue;
        pick->total += scan[i].pending;
        for (uint32_t j = 0; j < scan[i].pending && j < CD_SCAN_CANDIDATES && k < max; j++)
            out[k++] = scan[i].cand[j];
    }
    for (int i = 1; i < k; i++) {          /* launch order */
        uint64_t t = out[i];
        int j = i - 1;
        while (j >= 0 && out[j] > t) {
            out[j + 1] = out[j];
            j--;
        }
        out[j + 1] = t;
    }
    cd_verdict_cand c[CD_VERDICT_MAX];
    for (int i = 0; i < k; i++) {
        cd_watch_record r;
        int got = cd_watch_get(out[i], &r) == 0;
        c[i] = (cd_verdict_cand){.seq = out[i], .level = -1, .tag = i,
                                 .mangled = got ? cd_interned(r.kernel) : NULL,
                                 .origin = got ? r.origin : CD_ORIGIN_UNKNOWN};
        if (got && (r.flags & CD_WATCH_GRAPH)) {
            c[i].mangled = NULL;
            c[i].graph = !(alen && graph_level(&r, asserts, alen, &c[i].level, &c[i].words));
            if (c[i].graph)
                c[i].level = -1;
        }
    }
    int kept = cd_verdict_decide(c, k, asserts, alen, NULL, &pick->v);
    for (int i = 0; i < kept; i++)
        out[i] = c[i].seq;
    if (pick->v.named || pick->v.ruled_out)
        pick->total = (uint32_t)kept;
    return kept;
}

static cd_stream_scan culprit_scan[2][CD_INFLIGHT_MAX];   /* [from a signal]: once each */

#define CULPRITS_SHOWN 8

static void put_where(cd_out *o, uint32_t where, const char *none)
{
    const char *w = cd_interned(where);
    cd_out_puts(o, w && w[0] ? w : none);
}

/* What the watch did not see (capture/coverage.c), where the culprit may lie
 * in it: every gap since `since` (a watch-ring seq). 1 when one was put. */
static int put_gaps(cd_out *o, uint64_t since, const char *lead)
{
    cd_gap g[CD_GAPS];
    unsigned total;
    int n = cd_coverage_gaps(g, CD_GAPS, &total), put = 0;
    for (int i = 0; i < n; i++) {
        if (g[i].closed && g[i].to_seq < since)
            continue;
        cd_out_puts(o, lead);
        cd_out_puts(o, g[i].why == CD_GAP_PROFILER ? "a profiler held CUPTI from "
                                                   : "another tool held CUPTI when watch() opened, at ");
        put_where(o, g[i].from_where, "?");
        cd_out_puts(o, " (launch #");
        cd_out_u(o, g[i].from_seq);
        if (g[i].closed) {
            cd_out_puts(o, ") to ");
            put_where(o, g[i].to_where, "the end of the watch");
            cd_out_puts(o, " (launch #");
            cd_out_u(o, g[i].to_seq);
            cd_out_puts(o, ")");
        } else {
            cd_out_puts(o, ") on, still (torch.profiler keeps CUPTI after it stops)");
        }
        cd_out_puts(o, g[i].hooks_recording
                           ? ": launches outside PyTorch's runtime (Triton, cuBLAS/cuDNN, CuPy, "
                             "the driver's callers) were not recorded then\n"
                           : ": no launch was recorded then\n");
        put++;
    }
    return put;
}

static void write_watch_culprit(int code, const char *found_at, int from_signal)
{
    static char assert_buf[2][2048];
    char *asserts = assert_buf[from_signal ? 1 : 0];
    size_t alen = from_signal ? 0 : cd_tee_recent_asserts(asserts, sizeof assert_buf[0]);
    uint64_t seqs[CULPRITS_SHOWN * 8];
    cd_culprit_pick pick;
    int n = culprit_candidates(culprit_scan[from_signal ? 1 : 0], seqs, (int)CD_N_OF(seqs),
                               asserts, alen, &pick);
    const int proven = pick.proven, named = pick.v.named;
    const uint32_t total = pick.total;
    if (code == 0 && !n)
        return;                    /* a signal, and nothing unfinished: nothing to say */
    if (code && cd_is_sticky(code))
        cd_fault_note_sticky();
    int to_fd = 1;
    if (from_signal) {
        /* A fault's block (and error file) said it all. A signal's block is
         * written once, with its own flag: a handled SIGTERM must not use up
         * the fault's. Its error file only when the process is about to die. */
        if (atomic_load(&report_written))
            return;
        to_fd = !atomic_exchange(&signal_written, 1);
        if (!to_fd && from_signal != CD_FROM_DYING_SIGNAL)
            return;
    } else if (atomic_exchange(&report_written, 1)) {
        return;
    }
    uint64_t pause = from_signal ? 0 : atomic_load(&test_pause_ns);
    if (pause) {
        struct timespec ts = {(time_t)(pause / 1000000000u), (long)(pause % 1000000000u)};
        nanosleep(&ts, NULL);
    }
    cd_out o = {.n = 0, .line_start = 1};
    cd_out_puts(&o, "cuda_debug (watch): ");
    if (code) {
        put_error(&o, code);
        cd_out_puts(&o, ", found at ");
        cd_out_puts(&o, found_at);
    } else {
        cd_out_puts(&o, found_at);
        cd_out_puts(&o, proven ? " while watching, and no CUDA error seen yet: the launches still "
                                 "unfinished (a kernel fault makes them so; so does a hang)"
                               : " while watching, and no CUDA error seen yet: the launches not "
                                 "known to have finished (the always-on watch() puts completion "
                                 "markers behind a few of them)");
    }
    cd_out_puts(&o, "\n");
    const unsigned every = atomic_load(&cd_gates.watch_every);
    uint64_t oldest = n ? seqs[0] : cd_watch_seq();
    for (int i = 1; i < n; i++)
        if (seqs[i] < oldest)
            oldest = seqs[i];
    if (pick.v.ruled_out) {
        /* The device names a kernel none of the launches recorded is. */
        cd_out_puts(&o, "  culprit: ");
        cd_out_puts(&o, pick.v.function);
        cd_out_puts(&o, " (named by the device's assert text; its launch was not recorded)\n");
        if (!put_gaps(&o, 0, "    not recorded: ")) {
            if (cd_watch_seq() >= CD_WATCH_RING)
                cd_out_puts(&o, "    not recorded: launched more than 65536 launches ago (the "
                                "watch ring wrapped), ");
            else
                cd_out_puts(&o, "    not recorded: ");
            cd_out_puts(&o, "launched before watch() opened, or by a caller cuda_debug does "
                            "not see\n");
        }
        if (n)
            cd_out_puts(&o, "  recorded and not known to have finished, ruled out by the device's "
                            "text:\n");
    } else if (n > 1 || total > 1) {
        cd_out_puts(&o, proven ? "  culprit: one of " : "  culprit (no marker is missing yet: "
                                                        "one of the launches not known to "
                                                        "have finished): one of ");
        cd_out_u(&o, total);
        cd_out_puts(&o, named ? (pick.v.by_words ? " launches of the kernels the device's text fits best"
                                               : " launches of the kernel the device names")
                              : pick.v.reordered ? " launches, the likeliest first (user and JIT "
                                                 "kernels before PyTorch's and the vendor "
                                                 "libraries' own)"
                                               : " launches, in launch order");
        if (every > 1) {
            cd_out_puts(&o, " (watch() puts a completion marker behind every ");
            cd_out_u(&o, every);
            cd_out_puts(&o, "th launch of a stream; watch(exact=True) behind each)");
        }
        cd_out_puts(&o, ":\n");
    }
    int shown = 0;
    for (int i = 0; i < n && shown < CULPRITS_SHOWN; i++) {
        cd_watch_record r;
        if (cd_watch_get(seqs[i], &r) != 0)
            continue;
        const char *kernel = cd_interned(r.kernel_short);
        const char *label = pick.v.ruled_out || n > 1 || total > 1
                                ? "    "
                                : proven ? "  culprit: "
                                : named  ? "  culprit (named by the device's assert text): "
                                         : "  culprit (a guess: no marker is missing; the last "
                                           "launch recorded): ";
        shown++;
        if (r.flags & CD_WATCH_GRAPH) {
            cd_out_graph_replay(&o, &r, seqs[i], label, from_signal);
            continue;
        }
        cd_out_puts(&o, label);
        cd_out_puts(&o, kernel ? kernel : "?");
        cd_out_puts(&o, " (");
        put_launch_ids(&o, seqs[i], r.stream, r.thread_id);
        cd_out_puts(&o, ")\n");
        cd_out_location(&o, r.frames, r.n_frames, 0);
    }
    if (total > (uint32_t)shown && shown) {
        cd_out_puts(&o, "    and ");
        cd_out_u(&o, total - (uint32_t)shown);
        cd_out_puts(&o, " more\n");
    }
    if (!shown && !pick.v.ruled_out)
        cd_out_puts(&o, "  no unfinished launch in the watch ring: the faulting kernel was launched "
                  "before watch(), more than 65536 launches ago, or while the watch did not "
                  "see it\n");
    /* Where the culprit may be a launch the watch did not see. */
    if (!pick.v.ruled_out && (!shown || !proven || !named))
        put_gaps(&o, oldest, "  not covered: ");
    put_device_text(&o, asserts, alen, 0);
    if (code) {
        cd_out_puts(&o, "  ");
        cd_out_puts(&o, restart);
        cd_out_puts(&o, "\n");
    }
    if (from_signal)
        flush_report_to(&o, from_signal == CD_FROM_DYING_SIGNAL ? 2 : 0, to_fd);
    else
        flush_report(&o);
}

/* From a call (a refused launch, the driver log, Python): the block is
 * claimed, built and written under the report lock, with this thread's
 * sibling signals held back. A SIGABRT or SIGTERM on another thread meanwhile
 * (NCCL's watchdog, torchrun) waits in its handler for the lock, finds the
 * block written and lets the process die only after it; one on this thread
 * waits until the block is out. (Claimed first and written unlocked, a signal
 * in between found the report claimed, wrote nothing, and the process died
 * with no report.) From a signal handler: the handler holds the lock. */
void cd_report_watch_culprit(int code, const char *found_at, int from_signal)
{
    if (!enabled)
        return;
    if (from_signal) {
        write_watch_culprit(code, found_at, from_signal);
        return;
    }
    if (atomic_load(&report_written))
        return;                    /* said already (every launch the dead context refuses) */
    sigset_t block, old;
    cd_signal_mask(&block);
    pthread_sigmask(SIG_BLOCK, &block, &old);
    int taken = cd_report_lock();
    write_watch_culprit(code, found_at, 0);
    cd_report_unlock(taken);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* ------------------------------------------------ one report at a time -- */

static atomic_int report_busy;

int cd_report_lock(void)
{
    for (int i = 0; i < 3000; i++) {          /* 3 s, in 1 ms sleeps */
        int free_ = 0;
        if (atomic_compare_exchange_strong(&report_busy, &free_, 1))
            return 1;
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

void cd_report_unlock(int taken)
{
    if (taken)
        atomic_store(&report_busy, 0);
}

void cd_signal_mask(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGABRT);
    sigaddset(set, SIGTERM);
    sigaddset(set, SIGUSR1);
    sigaddset(set, SIGUSR2);
}

void cd_report_fork(int op)
{
    cd_elastic_fork(op);
    switch (op) {
    case CD_FORK_CHILD:
        atomic_store(&report_busy, 0);
        atomic_store(&report_written, 0);
        atomic_store(&signal_written, 0);
        atomic_store(&consequences, 0);
        break;
    case CD_FORK_TEST_TAKE:
        atomic_store(&report_busy, 1);      /* a report being written by another thread */
        break;
    case CD_FORK_TEST_GIVE:
        atomic_store(&report_busy, 0);
        break;
    }
}
