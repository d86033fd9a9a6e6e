/*
 * report/verdict.c: which launch is guilty. The one rule, in one place.
 *
 * Every renderer asks here: the block written to fd 2 at the fault
 * (fault_report.c), a graph replay's nodes in any block (graph_report.c), and,
 * through _core.verdict, the Python exception, last_error(), in_flight(),
 * dump, pytest and the notebook (cuda_debug/_report.py: watch_culprit). None
 * of them decides again; Python hands down only what needs Python (the
 * candidates' graph nodes, expanded, and the Triton hint below).
 *
 * The candidates are launches that may have faulted: per stream, those from
 * its last returned completion marker up to the first marker missing (proven
 * unfinished), or, when no marker is missing, those whose completion is not
 * known (a guess). Then, in order:
 *
 *   1. named by the device: where the device's assert text names a kernel
 *      (CD_ASSERT_NAMES), or fits some (CD_ASSERT_FITS: a lambda's
 *      operator(), Triton's "unknown"), the candidates of the best level are
 *      kept; of several that fit, for Triton's "unknown", those named after
 *      the function around the asserting source line (the hint: Python reads
 *      that file), then those whose names hold most of the words of the
 *      text's file and message ("ScatterGatherKernel.cu ... scatter gather
 *      kernel": the scatter/gather kernel, not a reduction's lambda);
 *   2. ruled out: where the text names a function none of the candidates is,
 *      and no candidate's name holds a word of its file or message, every
 *      candidate is ruled out and the function it names is the culprit (its
 *      launch unrecorded); a candidate the text cannot judge (a graph replay
 *      whose nodes are unknown, an unnamed launch) keeps them all in;
 *   3. the likeliest first: user and JIT kernels before generated ones, before
 *      PyTorch's and the vendor libraries' own (cd_origin_rank), each kernel
 *      this watch never saw finish before one it did, then launch order
 *      (cd_watch_likeliness, capture/inflight.c: the hang report's lead too).
 *
 * Host memory only, no lock, no allocation: usable at the fault without the
 * GIL (the text is read by the caller; from a signal there is none).
 */
#include "report/report.h"

#include <string.h>     /* strlen, strstr, memset, ... */

/* Is `word` an identifier inside `name` (a kernel's name, mangled or not):
 * not preceded by a letter or '_' (a mangled length prefix's digits may
 * precede it), not followed by a letter, digit or '_'? */
static int holds_word(const char *name, const char *word)
{
    size_t w = strlen(word);
    if (!name || !w)
        return 0;
    for (const char *p = strstr(name, word); p; p = strstr(p + 1, word)) {
        char before = p > name ? p[-1] : '\0', after = p[w];
        int id_before = before == '_' || (before >= 'a' && before <= 'z') ||
                        (before >= 'A' && before <= 'Z');
        int id_after = after == '_' || (after >= 'a' && after <= 'z') ||
                       (after >= 'A' && after <= 'Z') || (after >= '0' && after <= '9');
        if (!id_before && !id_after)
            return 1;
    }
    return 0;
}

/* What keeps a candidate at a step of the rule. */
enum { KEEP_LEVEL, KEEP_HINT, KEEP_WORDS };

static int kept_by(const cd_verdict_cand *c, int how, int value, const char *hint)
{
    switch (how) {
    case KEEP_LEVEL: return c->level == value;
    case KEEP_HINT: return holds_word(c->mangled, hint);
    default: return c->words == value;
    }
}

/* Keep, in order, the candidates `how` keeps; returns the count. No scratch:
 * any n (a graph's nodes). */
static int compact(cd_verdict_cand *c, int n, int how, int value, const char *hint)
{
    int m = 0;
    for (int i = 0; i < n; i++)
        if (kept_by(&c[i], how, value, hint))
            c[m++] = c[i];
    return m;
}

int cd_verdict_decide(cd_verdict_cand *c, int n, const char *text, size_t tlen,
                      const char *hint, cd_verdict *v)
{
    memset(v, 0, sizeof *v);
    if (n < 0)
        n = 0;
    int best = CD_ASSERT_NONE, any_unjudged = 0, any_words = 0;
    for (int i = 0; i < n; i++) {
        if (c[i].level < 0) {
            int judged = tlen && c[i].mangled && c[i].mangled[0] && !c[i].graph;
            c[i].level = judged ? cd_tee_text_level(text, tlen, c[i].mangled, NULL)
                                : CD_ASSERT_NONE;
            c[i].words = judged ? cd_tee_text_affinity(text, tlen, c[i].mangled) : 0;
            any_unjudged |= !judged;
        }
        any_words |= c[i].words > 0;
        if (c[i].level > best)
            best = c[i].level;
    }
    if (tlen && best >= CD_ASSERT_FITS) {
        /* 1. named by the device's text */
        int m = compact(c, n, KEEP_LEVEL, best, NULL);
        if (best == CD_ASSERT_FITS && hint && hint[0] && m > 1) {
            int hits = 0;
            for (int i = 0; i < m; i++)
                hits += kept_by(&c[i], KEEP_HINT, 0, hint);
            if (hits) {
                m = compact(c, m, KEEP_HINT, 0, hint);
                v->by_hint = 1;
            }
        }
        if (best == CD_ASSERT_FITS && m > 1) {
            int most = 0;
            for (int i = 0; i < m; i++)
                if (c[i].words > most)
                    most = c[i].words;
            if (most > 0) {
                int kept = compact(c, m, KEEP_WORDS, most, NULL);
                v->by_words = kept < m;
                m = kept;
            }
        }
        v->named = 1;
        v->kept = (uint32_t)m;
        return m;
    }
    if (tlen && !any_unjudged && !any_words) {
        /* 2. the text names a function none of the candidates is */
        size_t fl = cd_tee_text_function(text, tlen, v->function, sizeof v->function);
        if (!fl && hint && hint[0]) {
            fl = strnlen(hint, sizeof v->function - 1);
            memcpy(v->function, hint, fl);
            v->function[fl] = '\0';
        }
        if (fl) {
            v->ruled_out = 1;
            v->kept = (uint32_t)n;
            return n;
        }
    }
    /* 3. the likeliest first (stable) */
    uint64_t first = 0;
    for (int i = 0; i < n; i++)
        if (c[i].seq && (!first || c[i].seq < first))
            first = c[i].seq;
    for (int i = 0; i < n; i++) {
        cd_watch_record r;
        c[i].rank = c[i].seq && !c[i].graph && cd_watch_get(c[i].seq, &r) == 0
                        ? cd_watch_likeliness(&r, first)
                        : cd_origin_rank(c[i].origin) * 2;
    }
    for (int i = 1; i < n; i++) {
        cd_verdict_cand t = c[i];
        int j = i - 1;
        while (j >= 0 && c[j].rank > t.rank) {
            c[j + 1] = c[j];
            j--;
            v->reordered = 1;
        }
        c[j + 1] = t;
    }
    v->kept = (uint32_t)n;
    return n;
}
