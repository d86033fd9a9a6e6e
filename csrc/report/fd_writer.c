/*
 * report/fd_writer.c: the writer of every block cuda_debug puts on fd 2.
 *
 * As faulthandler does: text is built in a fixed buffer (cd_out, on the
 * caller's stack or static), then written with write(2). No malloc, no
 * stdio, no lock: usable in a signal handler and while another thread holds
 * whatever lock it holds. Every line starts with the rank prefix ("[rank k] "
 * under torchrun); text we did not make is sanitised (control characters
 * become '?', invalid UTF-8 is escaped \xe5), so a reader decoding stderr as
 * UTF-8 never fails.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "report/report.h"

#include <errno.h>      /* errno, EINTR */
#include <stdio.h>       /* snprintf */
#include <string.h>      /* memcpy, strlen */
#include <unistd.h>      /* write */

static char prefix[32];

void cd_out_set_prefix(const char *pfx) { snprintf(prefix, sizeof prefix, "%s", pfx ? pfx : ""); }

const char *cd_out_prefix(void) { return prefix; }

size_t cd_utf8_seq(const unsigned char *s, size_t n)
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

void cd_out_put(cd_out *o, const char *s, size_t len)
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
        size_t k = cd_utf8_seq((const unsigned char *)s + i, len - i);
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

void cd_out_puts(cd_out *o, const char *s) { cd_out_put(o, s, strlen(s)); }

void cd_out_u(cd_out *o, unsigned long long v)
{
    char t[24];
    int i = 0;
    do {
        t[i++] = (char)('0' + v % 10);
        v /= 10;
    } while (v && i < 23);
    while (i)
        cd_out_put(o, &t[--i], 1);
}

void cd_out_hex(cd_out *o, unsigned long long v)
{
    char t[20];
    int i = 0;
    do {
        t[i++] = "0123456789abcdef"[v & 15];
        v >>= 4;
    } while (v && i < 19);
    cd_out_puts(o, "0x");
    while (i)
        cd_out_put(o, &t[--i], 1);
}

void cd_out_dims(cd_out *o, const unsigned *d)
{
    cd_out_puts(o, "[");
    cd_out_u(o, d[0]);
    cd_out_puts(o, ",");
    cd_out_u(o, d[1]);
    cd_out_puts(o, ",");
    cd_out_u(o, d[2]);
    cd_out_puts(o, "]");
}

void cd_write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        p += w;
        n -= (size_t)w;
    }
}

void cd_out_drain(cd_out *o)
{
    if (o->sink)
        o->sink(o->sink_ctx, o->buf, o->n);
    else
        cd_write_all(2, o->buf, o->n);
    o->n = 0;
}

void cd_out_flush(cd_out *o)
{
    if (o->n && o->buf[o->n - 1] != '\n')
        o->buf[o->n++] = '\n';
    cd_out_drain(o);
}

/* "<verb> at file:line in func" ("launched", "captured", "replayed") from
 * location ids, innermost first: the innermost user frame; else the outermost
 * pseudo-file (python -c); else the innermost frame. A frame TorchDynamo ran
 * inside it is named. */
void cd_out_location_as(cd_out *o, const char *verb, const uint32_t *ids, int n, int complete)
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
    cd_out_puts(o, "  ");
    if (pick < 0 || cd_location_get(ids[pick], &loc) != 0) {
        if (!cd_reader_ok()) {
            cd_out_puts(o, "no frame reader for this Python (");
            cd_out_puts(o, cd_reader_python());
            cd_out_puts(o, ")\n");
        } else {
            cd_out_puts(o, verb);
            cd_out_puts(o, " from no Python frame (a framework thread, or C code)\n");
        }
        return;
    }
    cd_out_puts(o, verb);
    const char *file = cd_interned(loc.file), *func = cd_interned(loc.func);
    cd_out_puts(o, " at ");
    cd_out_puts(o, file ? file : "?");
    cd_out_puts(o, ":");
    cd_out_u(o, (unsigned)(loc.lineno < 0 ? 0 : loc.lineno));
    cd_out_puts(o, " in ");
    cd_out_puts(o, func ? func : "?");
    if (loc.kind != CD_LOC_USER)
        cd_out_puts(o, " (library code: no frame of yours was found)");
    for (int i = pick - 1; i >= 0; i--) {         /* a frame TorchDynamo ran inside it */
        cd_location inner;
        if (cd_location_get(ids[i], &inner) == 0 && inner.kind == CD_LOC_COMPILED) {
            const char *name = cd_interned(inner.func);
            cd_out_puts(o, ", inside torch.compile'd ");
            cd_out_puts(o, name ? name : "?");
            cd_out_puts(o, " (its source line is unknown)");
            break;
        }
    }
    cd_out_puts(o, "\n");
}

void cd_out_location(cd_out *o, const uint32_t *ids, int n, int complete)
{
    cd_out_location_as(o, "launched", ids, n, complete);
}

void cd_out_launch_name(cd_out *o, const cd_watch_record *r, int empty_unknown)
{
    char coll[96];
    size_t cl = cd_collective_name(r, coll, sizeof coll);
    const char *kernel = cd_interned(r->kernel_short);
    if (cl) {
        cd_out_put(o, coll, cl);
        cd_out_puts(o, " (");
        cd_out_puts(o, kernel ? kernel : "?");
        cd_out_puts(o, ")");
    } else {
        cd_out_puts(o, kernel && (kernel[0] || !empty_unknown) ? kernel : "?");
    }
}
