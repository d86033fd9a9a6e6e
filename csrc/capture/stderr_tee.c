/*
 * capture/stderr_tee.c: catch the device's assert text without holding back anyone's output.
 *
 * When a kernel fails an assert, the driver prints "file:line: kernel: block:
 * [..], thread: [..] Assertion `...` failed." with fprintf(stderr, ...) (seen
 * from a thread of its own on the H200). libcuda reads libc's `stderr`
 * variable through its own GOT slot (its R_X86_64_GLOB_DAT / R_AARCH64_GLOB_DAT
 * relocation for the data symbol `stderr`). At the first scope or watch that
 * one slot, and nothing else, is pointed (once, for the rest of the process)
 * at a variable of ours holding a pass-through stream (fopencookie): the
 * driver's writes go straight to fd 2 with write(2), in the order they were
 * made, nothing buffered; and
 *   - a thread with an open window (the launch callback, around its wait)
 *     also gets a copy of its own text, up to its buffer, the rest counted as
 *     cut (the report says so; all of it still reached fd 2);
 *   - lines that look like device asserts are also kept in a small ring,
 *     numbered by the bytes ever kept: the driver may print them from another
 *     thread than the one whose wait found the fault, and in watch mode they
 *     come out at whichever call finds the fault. A fault takes, from the
 *     ring, the assert lines written since its wait began that name its own
 *     kernel (cd_tee_asserts_since).
 * A forked child starts with no window and none of the parent's lines
 * (cd_tee_fork).
 * libc's own `stderr` stays what it was, for everyone else: freopen, fileno,
 * isatty, dup2 and Py_FatalError behave as without us. (Replacing libc's
 * `stderr` itself broke all of those.) When libcuda has no such relocation
 * (or its page cannot be made writable), nothing is captured: the text still
 * reaches fd 2, the reports go without it, and cd_tee_installed() says -1.
 * CUDA_DEBUG_CAPTURE=off leaves libcuda alone too.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE 1
#endif
#include "capture/capture.h"

#include <dlfcn.h>      /* dlinfo, RTLD_DI_LINKMAP */
#include <elf.h>         /* R_X86_64_GLOB_DAT, R_AARCH64_GLOB_DAT, DT_RELA, ... */
#include <errno.h>       /* errno, EINTR */
#include <link.h>        /* ElfW, link_map, dl_phdr_info, ... */
#include <stdio.h>       /* FILE, stderr, setvbuf, ... */
#include <string.h>      /* memchr, memmem, memmove, ... */
#include <sys/mman.h>    /* mprotect, PROT_READ, PROT_WRITE */
#include <unistd.h>      /* write, sysconf, _SC_PAGESIZE, ... */

#if defined(__x86_64__)
#  define R_DATA_SLOT R_X86_64_GLOB_DAT
#  define R_DATA_ABS R_X86_64_64
#elif defined(__aarch64__)
#  define R_DATA_SLOT R_AARCH64_GLOB_DAT
#  define R_DATA_ABS R_AARCH64_ABS64
#endif

/* What libcuda's `stderr` reads once its slot is patched: the tee (never
 * closed: the driver may print from any thread, at any time). */
static FILE *driver_stderr;
static atomic_int installed;       /* 0 not yet, 1 patched, -1 not possible */
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

static pthread_mutex_t install_lock = PTHREAD_MUTEX_INITIALIZER;

void cd_tee_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        tls_window = NULL;         /* the forking thread's window is the parent's */
        tls_line_len = 0;
        recent_len = 0;            /* the parent's assert lines are not the child's */
        atomic_flag_clear(&recent_lock);
        install_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
        break;
    case CD_FORK_TEST_TAKE:
        pthread_mutex_lock(&install_lock);
        while (atomic_flag_test_and_set_explicit(&recent_lock, memory_order_acquire))
            ;
        break;
    case CD_FORK_TEST_GIVE:
        atomic_flag_clear_explicit(&recent_lock, memory_order_release);
        pthread_mutex_unlock(&install_lock);
        break;
    }
}

/* ------------------------------------------ libcuda's `stderr` slot -- */

#ifdef R_DATA_SLOT
/* A pointer of the dynamic section: glibc relocates them in place on these
 * machines; an unrelocated one is an offset from the load address. */
static uintptr_t dyn_ptr(const ElfW(Dyn) *d, uintptr_t base)
{
    return d->d_un.d_ptr < base ? base + d->d_un.d_ptr : d->d_un.d_ptr;
}

/* The slots of the object `lm` that hold the address of libc's `stderr`
 * (its GLOB_DAT or absolute relocations against the symbol), at most max;
 * returns how many. Reads only. */
static int stderr_slots(const struct link_map *lm, void ***out, int max)
{
    const uintptr_t base = lm->l_addr;
    const ElfW(Rela) *rela = NULL, *jmprel = NULL;
    size_t relasz = 0, pltrelsz = 0, strsz = 0;
    long pltrel = 0;
    const ElfW(Sym) *symtab = NULL;
    const char *strtab = NULL;
    for (const ElfW(Dyn) *d = lm->l_ld; d && d->d_tag != DT_NULL; d++) {
        switch (d->d_tag) {
        case DT_RELA: rela = (const ElfW(Rela) *)dyn_ptr(d, base); break;
        case DT_RELASZ: relasz = d->d_un.d_val; break;
        case DT_JMPREL: jmprel = (const ElfW(Rela) *)dyn_ptr(d, base); break;
        case DT_PLTRELSZ: pltrelsz = d->d_un.d_val; break;
        case DT_PLTREL: pltrel = (long)d->d_un.d_val; break;
        case DT_SYMTAB: symtab = (const ElfW(Sym) *)dyn_ptr(d, base); break;
        case DT_STRTAB: strtab = (const char *)dyn_ptr(d, base); break;
        case DT_STRSZ: strsz = d->d_un.d_val; break;
        default: break;
        }
    }
    if (!symtab || !strtab)
        return 0;
    const struct { const ElfW(Rela) *r; size_t n; } tables[2] = {
        {rela, rela ? relasz / sizeof(ElfW(Rela)) : 0},
        {jmprel, jmprel && pltrel == DT_RELA ? pltrelsz / sizeof(ElfW(Rela)) : 0},
    };
    int k = 0;
    for (int t = 0; t < 2; t++)
        for (size_t i = 0; i < tables[t].n && k < max; i++) {
            const ElfW(Rela) *r = &tables[t].r[i];
            unsigned type = (unsigned)ELF64_R_TYPE(r->r_info);
            size_t sym = ELF64_R_SYM(r->r_info);
            if ((type != R_DATA_SLOT && type != R_DATA_ABS) || !sym || r->r_addend)
                continue;
            size_t name = symtab[sym].st_name;
            if (name >= strsz || strcmp(strtab + name, "stderr") != 0)
                continue;
            void **slot = (void **)(base + r->r_offset);
            if (*slot == (void *)&stderr)      /* bound to libc's, as we see it */
                out[k++] = slot;
        }
    return k;
}

typedef struct {
    uintptr_t base, lo, hi;        /* the object; its RELRO pages */
} relro_t;

static int find_relro(struct dl_phdr_info *info, size_t size, void *arg)
{
    (void)size;
    relro_t *r = arg;
    if (info->dlpi_addr != r->base)
        return 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
            r->lo = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
            r->hi = r->lo + info->dlpi_phdr[i].p_memsz;
        }
    return 1;
}

/* *slot = value; the page made writable for it when it is read-only after
 * relocation (RELRO), then read-only again. 0 on success. */
static int write_slot(void **slot, void *value, const relro_t *relro)
{
    uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t page = (uintptr_t)slot & ~(page_size - 1);
    int read_only = page >= (relro->lo & ~(page_size - 1)) && page < (relro->hi & ~(page_size - 1));
    if (read_only && mprotect((void *)page, page_size, PROT_READ | PROT_WRITE) != 0)
        return -1;
    __atomic_store_n(slot, value, __ATOMIC_RELEASE);
    if (read_only)
        mprotect((void *)page, page_size, PROT_READ);
    return 0;
}
#endif

int cd_tee_stderr_references(void *handle)
{
#ifdef R_DATA_SLOT
    struct link_map *lm = NULL;
    void **slots[8];
    if (!handle || dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm)
        return -1;
    return stderr_slots(lm, slots, 8);
#else
    (void)handle;
    return -1;
#endif
}

/* Point libcuda's `stderr` at the tee: 1 done, -1 not possible. */
static int patch_driver_stderr(void)
{
#ifdef R_DATA_SLOT
    struct link_map *lm = NULL;
    void **slots[8];
    void *handle = cd_libs[CD_LIB_CUDA].handle;
    if (!handle || dlinfo(handle, RTLD_DI_LINKMAP, &lm) != 0 || !lm)
        return -1;
    int n = stderr_slots(lm, slots, 8);
    if (n == 0)
        return -1;
    relro_t relro = {lm->l_addr, 0, 0};
    dl_iterate_phdr(find_relro, &relro);
    int done = 0;
    for (int i = 0; i < n; i++)
        done += write_slot(slots[i], (void *)&driver_stderr, &relro) == 0;
    return done ? 1 : -1;
#else
    return -1;
#endif
}

/* Once, under install_lock: 1 patched, -1 not possible. */
static int install(void)
{
    cookie_io_functions_t io = {.read = NULL, .write = tee_write, .seek = NULL, .close = NULL};
    FILE *fp = fopencookie(NULL, "w", io);
    if (!fp)
        return -1;
    setvbuf(fp, NULL, _IONBF, 0);
    driver_stderr = fp;            /* before the slot points here */
    fflush(stderr);                /* what libcuda wrote into libc's stderr before */
    return patch_driver_stderr();
}

int cd_tee_install(void)
{
    pthread_mutex_lock(&install_lock);
    if (!atomic_load(&installed))
        atomic_store(&installed, install());
    pthread_mutex_unlock(&install_lock);
    return atomic_load(&installed) == 1 ? 0 : -1;
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

/* Does the kernel's (mangled) name hold a closure type: a lambda (Itanium
 * "EUl<params>E[n]_", or nvcc's extended-lambda wrappers)? Its operator() is
 * what a generic "operator()" assert line ran. */
static int has_closure(const char *k)
{
    if (strstr(k, "__nv_dl_wrapper_t") || strstr(k, "__nv_hdl_wrapper_t"))
        return 1;
    for (const char *p = strstr(k, "EUl"); p; p = strstr(p + 3, "EUl")) {
        const char *e = p + 3;
        for (int i = 0; *e && i < 96; e++, i++)
            if (e[0] == 'E' && (e[1] == '_' || (e[1] >= '0' && e[1] <= '9')))
                return 1;
    }
    return 0;
}

/* How an assert line ("file:line: FUNC: block: [..]...") belongs to `kernel`
 * (CD_ASSERT_*). FUNC is the device function as the compiler printed it: a
 * plain name (`nll_loss_forward_reduce_cuda_kernel_2d`) or a pretty signature
 * (`void ns::check_index(const T *, int, T) [with T = int]`); its identifier
 * (before the parameters and template arguments, after the last "::" or
 * space) found verbatim in the mangled or plain kernel name names it. Two
 * FUNCs name no kernel: a lambda's `operator()` (PyTorch's index and many
 * elementwise asserts) and Triton's `unknown`; such a line fits a kernel
 * whose name holds a closure type, resp. a kernel that is not C++ (no _Z:
 * Triton's, an extern "C" one), and is merely generic for any other.
 * A NULL or "" kernel: every line names it. */
static int assert_level(const char *line, size_t len, const char *kernel)
{
    if (!kernel || !kernel[0])
        return CD_ASSERT_NAMES;
    const char *b = memmem(line, len, ": block: [", 10);
    if (!b)
        return CD_ASSERT_NONE;
    const char *f = line;          /* FUNC starts after the second ": " (file:line: ) */
    const char *c1 = memmem(line, (size_t)(b - line), ": ", 2);
    if (!c1)
        return CD_ASSERT_NONE;
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
        return CD_ASSERT_NONE;
    if (n == 8 && !memcmp(start, "operator", 8))
        return has_closure(kernel) ? CD_ASSERT_FITS : CD_ASSERT_GENERIC;
    if (n == 7 && !memcmp(start, "unknown", 7))
        return kernel[0] == '_' && kernel[1] == 'Z' ? CD_ASSERT_GENERIC : CD_ASSERT_FITS;
    char ident[201];
    memcpy(ident, start, n);
    ident[n] = '\0';
    return strstr(kernel, ident) != NULL ? CD_ASSERT_NAMES : CD_ASSERT_NONE;
}

/* --------------------------------------------- the text's other words -- */

static int lower(int c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }
static int alnum(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'); }

/* Does hay hold the word w (n bytes, lower case), case-insensitively? */
static int holds_word(const char *hay, const char *w, size_t n)
{
    for (const char *p = hay; *p; p++) {
        size_t i = 0;
        while (i < n && p[i] && lower((unsigned char)p[i]) == w[i])
            i++;
        if (i == n)
            return 1;
    }
    return 0;
}

/* Words that say nothing of which kernel ran. */
static int common_word(const char *w, size_t n)
{
    static const char *const skip[] = {"kernel", "kernels", "cuda", "cuh", "utils", "util",
                                       "impl", "native", "aten", "src", "the", "and", "for",
                                       "failed", "assertion", "block", "thread", "out",
                                       "not", "must", "should", "than", "less", "with"};
    for (size_t i = 0; i < sizeof skip / sizeof skip[0]; i++)
        if (strlen(skip[i]) == n && !memcmp(skip[i], w, n))
            return 1;
    return 0;
}

/* The distinct words (3+ letters, CamelCase split, lower case, common ones
 * left out) of s[0..n) that kernel's name holds: their count, at most 16
 * words looked at. */
static int words_held(const char *s, size_t n, const char *kernel, char seen[16][32], int *n_seen)
{
    int held = 0;
    size_t i = 0;
    while (i < n && *n_seen < 16) {
        while (i < n && !((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z')))
            i++;
        char w[32];
        size_t k = 0;
        /* one word: an upper-case letter starts a new one after a lower-case one */
        while (i < n && alnum((unsigned char)s[i])) {
            if (k && s[i] >= 'A' && s[i] <= 'Z' && s[i - 1] >= 'a' && s[i - 1] <= 'z')
                break;
            if (k < sizeof w - 1)
                w[k++] = (char)lower((unsigned char)s[i]);
            i++;
        }
        if (k < 3 || common_word(w, k))
            continue;
        int dup = 0;
        for (int j = 0; j < *n_seen && !dup; j++)
            dup = strlen(seen[j]) == k && !memcmp(seen[j], w, k);
        if (dup)
            continue;
        memcpy(seen[*n_seen], w, k);
        seen[*n_seen][k] = '\0';
        (*n_seen)++;
        held += holds_word(kernel, w, k);
    }
    return held;
}

/* How well an assert line's other words fit kernel: those of its source
 * file's name and of its message ("ScatterGatherKernel.cu:163: operator():
 * ... Assertion `scatter gather kernel index out of bounds` failed") that the
 * kernel's (mangled) name holds. */
static int line_affinity(const char *line, size_t len, const char *kernel)
{
    char seen[16][32];
    int n_seen = 0, held = 0;
    const char *colon = memchr(line, ':', len);
    if (colon) {                       /* the file: its base name, without the extension */
        const char *b = colon;
        while (b > line && b[-1] != '/')
            b--;
        const char *dot = memchr(b, '.', (size_t)(colon - b));
        held += words_held(b, (size_t)((dot ? dot : colon) - b), kernel, seen, &n_seen);
    }
    const char *a = memmem(line, len, "Assertion `", 11);
    if (a) {
        a += 11;
        const char *e = memchr(a, '`', (size_t)(line + len - a));
        if (!e)
            e = line + len;
        held += words_held(a, (size_t)(e - a), kernel, seen, &n_seen);
    }
    return held;
}

int cd_tee_text_affinity(const char *text, size_t n, const char *kernel)
{
    int best = 0;
    if (!kernel || !kernel[0])
        return 0;
    for (const char *p = text, *end = text + n; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl ? nl + 1 : end) - p);
        if (len > 20 && memmem(p, len, "Assertion `", 11) && memmem(p, len, "block: [", 8)) {
            int a = line_affinity(p, len, kernel);
            if (a > best)
                best = a;
        }
        p += len;
    }
    return best;
}

/* The function the first assert line names (its FUNC), when it names one
 * (not a lambda's operator(), not Triton's unknown): its length, 0 if none. */
size_t cd_tee_text_function(const char *text, size_t n, char *out, size_t cap)
{
    for (const char *p = text, *end = text + n; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl ? nl + 1 : end) - p);
        const char *b;
        if (len > 20 && memmem(p, len, "Assertion `", 11) && (b = memmem(p, len, ": block: [", 10))) {
            const char *c1 = memmem(p, (size_t)(b - p), ": ", 2);
            if (!c1)
                return 0;
            const char *f = c1 + 2, *e = b;
            for (const char *q = f; q < b; q++)
                if (*q == '(' || *q == '<' || *q == '[') {
                    e = q;
                    break;
                }
            while (e > f && e[-1] == ' ')
                e--;
            const char *st = e;
            while (st > f && st[-1] != ' ' && st[-1] != ':')
                st--;
            size_t k = (size_t)(e - st);
            if (!k || k >= cap || (k == 8 && !memcmp(st, "operator", 8)) ||
                (k == 7 && !memcmp(st, "unknown", 7)))
                return 0;
            for (size_t i = 0; i < k; i++)
                if (!alnum((unsigned char)st[i]) && st[i] != '_')
                    return 0;
            memcpy(out, st, k);
            out[k] = '\0';
            return k;
        }
        p += len;
    }
    return 0;
}

int cd_tee_text_level(const char *text, size_t n, const char *kernel, int *asserts)
{
    int best = CD_ASSERT_NONE, k = 0;
    for (const char *p = text, *end = text + n; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t len = (size_t)((nl ? nl + 1 : end) - p);
        if (len > 20 && memmem(p, len, "Assertion `", 11) && memmem(p, len, "block: [", 8)) {
            int lv = assert_level(p, len, kernel);
            k++;
            if (lv > best)
                best = lv;
        }
        p += len;
    }
    if (asserts)
        *asserts = k;
    return best;
}

size_t cd_tee_asserts_since(uint64_t mark, const char *kernel, char *out, size_t cap,
                            size_t *cut, int *level)
{
    size_t o = 0;
    int best = CD_ASSERT_NONE;
    *cut = 0;
    while (atomic_flag_test_and_set_explicit(&recent_lock, memory_order_acquire))
        ;
    uint64_t first = recent_total - recent_len;
    const char *from = recent + (mark > first ? mark - first : 0), *end = recent + recent_len;
    for (int pass = 0; pass < 2 && mark <= recent_total; pass++) {
        /* pass 0: the best level of any line; pass 1: the lines of that level */
        for (const char *p = from; p < end;) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t len = (size_t)((nl ? nl + 1 : end) - p);
            int lv = assert_level(p, len, kernel);
            if (pass == 0 && lv > best)
                best = lv;
            if (pass == 1 && lv == best && best != CD_ASSERT_NONE) {
                size_t c = len < cap - o ? len : cap - o;
                memcpy(out + o, p, c);
                o += c;
                *cut += len - c;
            }
            p += len;
        }
    }
    atomic_flag_clear_explicit(&recent_lock, memory_order_release);
    if (level)
        *level = best;
    return o;
}
