/*
 * report/inflight_doc.c: the in-flight report as a JSON document, for
 * `cuda-debug dump PID` (hooks/dump_server.c sends it to the caller), its
 * `--json`, `--trace` and `--job`, and CUDA_DEBUG_TRACE at a fault
 * (cuda_debug/_dump.py reads it; `_core.dump_document()` in-process).
 *
 * One search of the watch ring (capture/inflight.c: cd_watch_inflight), so the
 * text block (the one the dump signal writes to fd 2, inflight_report.c), the
 * per-stream records and the last launches agree. The ring's layout stays
 * behind capture/'s functions: this file names fields of records, never slots
 * or ring positions. Raw values only (ids, ns, mangled names, frames with
 * their CD_LOC_* kind): Python names and words them.
 *
 *   {"format": "cuda_debug.dump", "version": 1, "pid", "rank", "world_size",
 *    "time" (CLOCK_REALTIME s), "watching", "hang_after_ns", "dump_signal",
 *    "scanned", "newest_age_ns", "streams_cut", "culprit" (seq or null),
 *    "text" (the block, without the rank prefix), "flight_recorder" (what
 *    Python handed down with cd_report_set_extra, or null),
 *    "streams": [{"seq", "stream", "device", "kernel", "short", "collective",
 *                 "graph", "thread_id", "thread_name", "age_ns", "queued",
 *                 "last_seq", "cbid", "candidates", "open_seq",
 *                 "frames": [[file, line, func, kind]...],
 *                 a graph replay's: "graph_status", "graph_candidates",
 *                 "graph_nodes": [{"node", "kernel", "short", "collective",
 *                 "frames"}]}],
 *    "recent": [{"seq", "stream", "device", "kernel", "short", "collective",
 *                "graph", "thread_id", "thread_name", "age_ns", "done",
 *                "frames"}]}                   (the last `recent` launches)
 *
 * Frames are innermost first. Strings we did not make (file names, kernel
 * names) are escaped: invalid UTF-8 bytes become lone surrogates \udcXX, as
 * Python's os.fsdecode spells them. Not async-signal-safe (malloc): the dump
 * listener's thread and Python call it, never a signal handler.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "report/report.h"

#include <fcntl.h>      /* open, O_RDONLY, O_CLOEXEC */
#include <pthread.h>     /* pthread_mutex_t, PTHREAD_MUTEX_INITIALIZER, pthread_mutex_lock, ... */
#include <stdio.h>       /* snprintf */
#include <stdlib.h>      /* realloc, free, malloc, ... */
#include <string.h>      /* memcpy, memset, strlen */
#include <time.h>        /* timespec, clock_gettime, CLOCK_REALTIME */
#include <unistd.h>      /* read, close, getpid */

void cd_buf_sink(void *ctx, const char *p, size_t n)
{
    cd_buf *b = ctx;
    if (b->failed || !n)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 16384;
        while (cap < b->n + n)
            cap *= 2;
        char *q = cap <= CD_DOC_MAX ? realloc(b->p, cap) : NULL;
        if (!q) {
            b->failed = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

void cd_buf_free(cd_buf *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* What Python hands down to go with every document (NCCL's flight
 * recorder: Python made it with json.dumps, so it is JSON), under extra_mu. */
static pthread_mutex_t extra_mu = PTHREAD_MUTEX_INITIALIZER;
static char *extra;
static size_t extra_n;

/* The child: extra_mu free (a listener of the parent's may have held it),
 * the parent's flight recorder dropped (the child's own comes from its Python). */
void cd_inflight_doc_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        extra_mu = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
        extra = NULL;              /* the parent's copy: left, never freed here */
        extra_n = 0;
        break;
    case CD_FORK_TEST_TAKE:
        pthread_mutex_lock(&extra_mu);
        break;
    case CD_FORK_TEST_GIVE:
        pthread_mutex_unlock(&extra_mu);
        break;
    }
}

int cd_report_set_extra(const char *json, size_t n)
{
    char *copy = n ? malloc(n) : NULL;
    if (n && !copy)
        return -1;
    if (n)
        memcpy(copy, json, n);
    pthread_mutex_lock(&extra_mu);
    free(extra);
    extra = copy;
    extra_n = n;
    pthread_mutex_unlock(&extra_mu);
    return 0;
}

/* ------------------------------------------------------------- JSON -- */

static void raw(cd_out *o, const char *s, size_t n)
{
    if (o->n + n > sizeof o->buf - 8)
        cd_out_drain(o);
    cd_out_put(o, s, n);
}

static void lit(cd_out *o, const char *s) { raw(o, s, strlen(s)); }

static void num(cd_out *o, unsigned long long v)
{
    if (o->n > sizeof o->buf - 32)
        cd_out_drain(o);
    cd_out_u(o, v);
}

static void snum(cd_out *o, long long v)
{
    if (v < 0) {
        lit(o, "-");
        num(o, (unsigned long long)(-(v + 1)) + 1);
    } else {
        num(o, (unsigned long long)v);
    }
}

/* A JSON string of n bytes we did not make (NUL ends it early). */
static void jstr(cd_out *o, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    lit(o, "\"");
    for (size_t i = 0; i < n && s[i];) {
        unsigned char c = (unsigned char)s[i];
        char e[8];
        if (c == '"' || c == '\\') {
            e[0] = '\\';
            e[1] = (char)c;
            raw(o, e, 2);
            i++;
        } else if (c == '\n') {
            raw(o, "\\n", 2);
            i++;
        } else if (c < 0x20 || c == 0x7F) {
            memcpy(e, "\\u00", 4);
            e[4] = hex[c >> 4];
            e[5] = hex[c & 15];
            raw(o, e, 6);
            i++;
        } else if (c < 0x80) {
            size_t k = 1;
            while (i + k < n && s[i + k] && (unsigned char)s[i + k] >= 0x20 &&
                   (unsigned char)s[i + k] < 0x7F && s[i + k] != '"' && s[i + k] != '\\' &&
                   k < 256)
                k++;
            raw(o, s + i, k);
            i += k;
        } else {
            size_t k = cd_utf8_seq((const unsigned char *)s + i, n - i);
            if (k) {
                raw(o, s + i, k);
                i += k;
            } else {           /* surrogateescape: byte 0xXY -> U+DCXY */
                memcpy(e, "\\udc", 4);
                e[4] = hex[c >> 4];
                e[5] = hex[c & 15];
                raw(o, e, 6);
                i++;
            }
        }
    }
    lit(o, "\"");
}

static void jcstr(cd_out *o, const char *s)
{
    if (s)
        jstr(o, s, strlen(s));
    else
        lit(o, "null");
}

static void key(cd_out *o, const char *k, int first)
{
    if (!first)
        lit(o, ", ");
    lit(o, "\"");
    lit(o, k);
    lit(o, "\": ");
}

/* ---------------------------------------------------------- records -- */

/* The OS name of thread `tid` of this process (its comm), cached per document. */
typedef struct {
    int32_t tid[64];
    char name[64][16];
    int n;
} names_cache;

static const char *thread_name(names_cache *c, int32_t tid)
{
    for (int i = 0; i < c->n; i++)
        if (c->tid[i] == tid)
            return c->name[i][0] ? c->name[i] : NULL;
    char path[64], buf[32];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    ssize_t k = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (k < 0)
        k = 0;
    while (k > 0 && (buf[k - 1] == '\n' || buf[k - 1] == '\0'))
        k--;
    if (k > 15)
        k = 15;
    if (c->n == 64)
        c->n = 0;                  /* more threads than the cache: start over */
    int i = c->n++;
    c->tid[i] = tid;
    memcpy(c->name[i], buf, (size_t)k);
    c->name[i][k] = '\0';
    return k ? c->name[i] : NULL;
}

static void put_frames(cd_out *o, const cd_watch_record *r)
{
    lit(o, "[");
    int shown = 0;
    for (int i = 0; i < r->n_frames && i < CD_RING_FRAMES; i++) {
        cd_location loc;
        if (cd_location_get(r->frames[i], &loc) != 0)
            continue;
        lit(o, shown++ ? ", [" : "[");
        jcstr(o, cd_interned(loc.file));
        lit(o, ", ");
        snum(o, loc.lineno);
        lit(o, ", ");
        jcstr(o, cd_interned(loc.func));
        lit(o, ", ");
        snum(o, loc.kind);
        lit(o, "]");
    }
    lit(o, "]");
}

/* The fields a stream entry and a recent launch share. */
static void put_launch(cd_out *o, const cd_watch_record *r, uint64_t now_ns, names_cache *names)
{
    char coll[96];
    size_t cl = cd_collective_name(r, coll, sizeof coll);
    key(o, "seq", 1);
    num(o, r->seq);
    key(o, "stream", 0);
    num(o, r->stream);
    key(o, "device", 0);
    snum(o, cd_watch_context_device(r->ctx));
    key(o, "kernel", 0);
    jcstr(o, cd_interned(r->kernel));
    key(o, "short", 0);
    jcstr(o, cd_interned(r->kernel_short));
    key(o, "collective", 0);
    if (cl)
        jstr(o, coll, cl);
    else
        lit(o, "null");
    key(o, "graph", 0);
    lit(o, r->flags & CD_WATCH_GRAPH ? "true" : "false");
    key(o, "thread_id", 0);
    snum(o, r->thread_id);
    key(o, "thread_name", 0);
    jcstr(o, thread_name(names, r->thread_id));
    key(o, "age_ns", 0);
    num(o, now_ns > r->t_ns ? now_ns - r->t_ns : 0);
    key(o, "cbid", 0);
    num(o, r->cbid);
    key(o, "frames", 0);
    put_frames(o, r);
}

/* A graph replay's candidates (graph_report.c: the node still running, or the
 * nodes after the last marker written): "graph_status" (CD_GRAPH_*),
 * "graph_candidates" (how many), "graph_nodes": [{"node", "kernel", "short",
 * "collective", "frames" (where it was captured)}] (the first 16). */
static void put_graph_nodes(cd_out *o, const cd_watch_record *r)
{
    uint32_t nodes[16];
    int status, capture;
    int k = cd_graph_report_nodes(r, nodes, 16, &status, &capture, 1);
    key(o, "graph_status", 0);
    snum(o, status);
    key(o, "graph_candidates", 0);
    num(o, (unsigned)(k > 0 ? k : 0));
    key(o, "graph_nodes", 0);
    lit(o, "[");
    int shown = 0;
    for (int j = 0; j < k && j < 16; j++) {
        cd_watch_record nr;
        uint32_t index;
        int done;
        char coll[96];
        if (cd_graph_node(nodes[j], &nr, &index, &done) != 0)
            continue;
        size_t cl = cd_collective_name(&nr, coll, sizeof coll);
        lit(o, shown++ ? ", {" : "{");
        key(o, "node", 1);
        num(o, index);
        key(o, "kernel", 0);
        jcstr(o, cd_interned(nr.kernel));
        key(o, "short", 0);
        jcstr(o, cd_interned(nr.kernel_short));
        key(o, "collective", 0);
        if (cl)
            jstr(o, coll, cl);
        else
            lit(o, "null");
        key(o, "frames", 0);
        put_frames(o, &nr);
        lit(o, "}");
    }
    lit(o, "]");
}

static void put_text(cd_out *o, const cd_inflight *t, int n, const cd_inflight_summary *sum,
                     cd_buf *text)
{
    cd_out *w = malloc(sizeof *w);
    if (!w) {
        lit(o, "null");
        return;
    }
    memset(w, 0, sizeof *w);
    w->line_start = 1;
    w->raw = 1;                    /* the caller prefixes ranks itself */
    w->sink = cd_buf_sink;
    w->sink_ctx = text;
    cd_report_inflight_text(w, t, n, sum);
    free(w);
    if (text->failed)
        lit(o, "null");
    else
        jstr(o, text->p ? text->p : "", text->n);
}

int cd_report_dump_doc(cd_buf *b, const cd_dump_params *p)
{
    cd_inflight *t = calloc(CD_INFLIGHT_MAX, sizeof *t);
    cd_stream_scan *scan = calloc(CD_INFLIGHT_MAX, sizeof *scan);
    cd_out *o = malloc(sizeof *o);
    names_cache *names = calloc(1, sizeof *names);
    cd_buf text = {0};
    if (!t || !scan || !o || !names) {
        free(t);
        free(scan);
        free(o);
        free(names);
        return -1;
    }
    memset(o, 0, sizeof *o);
    o->raw = 1;
    o->sink = cd_buf_sink;
    o->sink_ctx = b;
    cd_inflight_summary sum;
    int n = cd_watch_inflight(t, CD_INFLIGHT_MAX, &sum, scan);
    struct timespec wall;
    clock_gettime(CLOCK_REALTIME, &wall);
    char tbuf[48];
    snprintf(tbuf, sizeof tbuf, "%lld.%06ld", (long long)wall.tv_sec, wall.tv_nsec / 1000);

    lit(o, "{\"format\": \"cuda_debug.dump\", \"version\": ");
    num(o, CD_DOC_VERSION);
    key(o, "pid", 0);
    num(o, (unsigned long long)getpid());
    key(o, "rank", 0);
    if (p->rank >= 0)
        num(o, (unsigned)p->rank);
    else
        lit(o, "null");
    key(o, "world_size", 0);
    if (p->world_size > 0)
        num(o, (unsigned)p->world_size);
    else
        lit(o, "null");
    key(o, "time", 0);
    lit(o, tbuf);
    key(o, "watching", 0);
    lit(o, atomic_load(&cd_gates.watching) ? "true" : "false");
    key(o, "hang_after_ns", 0);
    num(o, p->hang_after_ns);
    key(o, "dump_signal", 0);
    num(o, (unsigned)cd_dump_signal());
    key(o, "scanned", 0);
    num(o, sum.scanned);
    key(o, "newest_age_ns", 0);
    num(o, sum.scanned && sum.now_ns > sum.newest_ns ? sum.now_ns - sum.newest_ns : 0);
    key(o, "streams_cut", 0);
    num(o, sum.streams_cut);
    key(o, "culprit", 0);
    if (n)
        num(o, t[0].rec.seq);
    else
        lit(o, "null");
    key(o, "text", 0);
    put_text(o, t, n, &sum, &text);
    key(o, "flight_recorder", 0);
    pthread_mutex_lock(&extra_mu);
    if (extra_n) {
        for (size_t i = 0; i < extra_n; i += 1024)
            raw(o, extra + i, extra_n - i < 1024 ? extra_n - i : 1024);
    } else {
        lit(o, "null");
    }
    pthread_mutex_unlock(&extra_mu);
    key(o, "streams", 0);
    lit(o, "[");
    for (int i = 0; i < n; i++) {
        lit(o, i ? ", {" : "{");
        put_launch(o, &t[i].rec, sum.now_ns, names);
        key(o, "queued", 0);
        num(o, t[i].queued);
        key(o, "last_seq", 0);
        num(o, t[i].last_seq);
        key(o, "candidates", 0);
        num(o, t[i].candidates);
        key(o, "open_seq", 0);
        num(o, t[i].open_seq);
        if (t[i].rec.flags & CD_WATCH_GRAPH)
            put_graph_nodes(o, &t[i].rec);
        lit(o, "}");
    }
    lit(o, "]");
    key(o, "recent", 0);
    lit(o, "[");
    uint64_t newest = cd_watch_seq();
    int want = p->recent > CD_WATCH_RING ? CD_WATCH_RING : p->recent;
    uint64_t first = want > 0 && newest > (uint64_t)want ? newest - (uint64_t)want + 1 : 1;
    int shown = 0;
    for (uint64_t seq = first; want > 0 && seq <= newest; seq++) {
        cd_watch_record r;
        if (cd_watch_get(seq, &r) != 0 || (r.flags & CD_WATCH_CAPTURED))
            continue;
        lit(o, shown++ ? ", {" : "{");
        put_launch(o, &r, sum.now_ns, names);
        key(o, "done", 0);
        snum(o, cd_watch_done(&r, seq));
        lit(o, "}");
    }
    lit(o, "]}\n");
    cd_out_drain(o);
    cd_buf_free(&text);
    free(t);
    free(scan);
    free(o);
    free(names);
    return b->failed ? -1 : 0;
}
