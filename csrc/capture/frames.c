/*
 * capture/frames.c: the launching thread's Python location, read without the GIL.
 *
 * PyTorch, CuPy and Triton release the GIL around kernel launches, so the
 * CUPTI callback runs on a thread that is blocked inside a C call made from
 * Python: its own frame stack cannot change until the call returns. As
 * faulthandler does (Python/traceback.c, _Py_DumpTracebackThreads), we walk it
 * without the GIL, reading only immutable parts of the code objects.
 *
 * Each (code object, instruction offset) is interned once in `locs` as a
 * location: file name, function name, line number and kind (user or library
 * code), copied into the string arena (intern.c), so a record keeps 4-byte
 * ids that stay meaningful after the code object is gone. A hit costs a hash
 * probe per frame; a miss resolves the line from the code object's line
 * table (cd_reader_line) and copies the names.
 *
 * The frame layout is CPython-internal and changes per minor version:
 * frame_readers.c has the one reader for this Python (cd_reader_*). Where
 * none applies, reports take the launching line from the framework's
 * traceback only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>           /* first: it sets the feature macros (_GNU_SOURCE) */

#include "capture/capture.h"

#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ------------------------------------------------------- configuration -- */

#define MAX_PREFIXES 32
#define PREFIX_LEN 1024
static char lib_prefixes[MAX_PREFIXES][PREFIX_LEN];
static int n_lib_prefixes;
static char user_pseudo[8][64];
static int n_user_pseudo;
static atomic_int configured;

void cd_frames_configure(const char *const *library_prefixes, int n_prefixes,
                         const char *const *pseudo, int n_pseudo)
{
    if (atomic_load(&configured))
        return;
    int n = 0, m = 0;
    for (int i = 0; i < n_prefixes && n < MAX_PREFIXES; i++)
        if (library_prefixes[i][0] && strlen(library_prefixes[i]) + 1 < PREFIX_LEN)
            snprintf(lib_prefixes[n++], PREFIX_LEN, "%s", library_prefixes[i]);
    for (int i = 0; i < n_pseudo && m < 8; i++)
        snprintf(user_pseudo[m++], sizeof user_pseudo[0], "%s", pseudo[i]);
    n_lib_prefixes = n;
    n_user_pseudo = m;
    atomic_store(&configured, 1);
}

static int ends_with(const char *s, size_t n, const char *suffix)
{
    size_t k = strlen(suffix);
    return n >= k && !memcmp(s + n - k, suffix, k);
}

/* The user-frame rule, the one implementation (cuda_debug/_locations.py says
 * it in words; Python calls this through _core.file_kind). Applied once per
 * code location, on the cold path. */
int cd_file_kind(const char *file, size_t n)
{
    if (n == 0 || memchr(file, '\0', n))
        return CD_LOC_LIBRARY;
    if (file[0] == '<') {
        for (int i = 0; i < n_user_pseudo; i++)
            if (!strncmp(file, user_pseudo[i], strlen(user_pseudo[i])))
                return CD_LOC_USER;
        return n == 8 && memcmp(file, "<string>", 8) == 0 ? CD_LOC_PSEUDO : CD_LOC_LIBRARY;
    }
    /* Cython modules report relative source paths (cupy_backends/cuda/api/driver.pyx). */
    if (ends_with(file, n, ".pyx") || ends_with(file, n, ".pxd") || ends_with(file, n, ".pxi"))
        return CD_LOC_LIBRARY;
    if (memmem(file, n, "site-packages", 13) || memmem(file, n, "dist-packages", 13))
        return CD_LOC_LIBRARY;
    /* A relative path (runpy.run_path("train.py"), exec of compile(src, "x.py"))
     * is relative to the current folder, as linecache reads it. */
    char joined[PATH_MAX], real[PATH_MAX];
    const char *path = file;
    if (file[0] != '/') {
        size_t k;
        if (!getcwd(joined, sizeof joined) || (k = strlen(joined)) + 1 + n + 1 > sizeof joined)
            return CD_LOC_USER;
        joined[k] = '/';
        memcpy(joined + k + 1, file, n);
        joined[k + 1 + n] = '\0';
        path = joined;
    }
    if (realpath(path, real))
        path = real;
    for (int i = 0; i < n_lib_prefixes; i++) {
        size_t k = strlen(lib_prefixes[i]);
        if (!strncmp(path, lib_prefixes[i], k) && (path[k] == '/' || path[k] == '\0'))
            return CD_LOC_LIBRARY;
    }
    return CD_LOC_USER;
}

/* Copy a str object's text as UTF-8 without the GIL (compact strings only,
 * which is every str the interpreter makes); returns the length. */
static size_t copy_unicode(PyObject *u, char *out, size_t cap)
{
    size_t o = 0;
    if (!u || !PyUnicode_Check(u) || cap < 8)
        return 0;
#if PY_VERSION_HEX < 0x030C0000
    if (!PyUnicode_IS_READY(u))
        return 0;
#endif
    if (!PyUnicode_IS_COMPACT(u))
        return 0;
    Py_ssize_t len = PyUnicode_GET_LENGTH(u);
    int kind = PyUnicode_KIND(u);
    const void *data = PyUnicode_DATA(u);
    for (Py_ssize_t i = 0; i < len && o + 4 < cap; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80) {
            out[o++] = (char)c;
        } else if (c < 0x800) {
            out[o++] = (char)(0xC0 | (c >> 6));
            out[o++] = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x10000) {
            if (c >= 0xD800 && c <= 0xDFFF)   /* lone surrogate: not UTF-8 */
                c = 0xFFFD;
            out[o++] = (char)(0xE0 | (c >> 12));
            out[o++] = (char)(0x80 | ((c >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (c & 0x3F));
        } else {
            out[o++] = (char)(0xF0 | (c >> 18));
            out[o++] = (char)(0x80 | ((c >> 12) & 0x3F));
            out[o++] = (char)(0x80 | ((c >> 6) & 0x3F));
            out[o++] = (char)(0x80 | (c & 0x3F));
        }
    }
    out[o] = '\0';
    return o;
}

/* TorchDynamo runs a torch.compile'd function as a code object of its own
 * (the function's name, file and first line; the user's lines gone) that calls
 * the compiled graph through a global named __compiled_fn_<n>...: such a
 * frame is CD_LOC_COMPILED, not the user's. Reads the code's tuple of names
 * (immutable interned str) without the GIL. */
static int calls_compiled_graph(PyCodeObject *code)
{
    PyObject *names = code->co_names;
    if (!names || !PyTuple_Check(names))
        return 0;
    Py_ssize_t n = PyTuple_GET_SIZE(names);
    for (Py_ssize_t i = 0; i < n && i < 4096; i++) {
        char name[24];
        if (copy_unicode(PyTuple_GET_ITEM(names, i), name, sizeof name) >= 13 &&
            !memcmp(name, "__compiled_fn", 13))
            return 1;
    }
    return 0;
}

static int kind_of(PyCodeObject *code, const char *file, size_t n)
{
    int kind = cd_file_kind(file, n);
    return kind == CD_LOC_USER && calls_compiled_graph(code) ? CD_LOC_COMPILED : kind;
}

int cd_code_kind(void *code)
{
    char file[1024];
    PyCodeObject *c = (PyCodeObject *)code;
    return kind_of(c, file, copy_unicode(c->co_filename, file, sizeof file));
}

/* ----------------------------------------------------------- locations -- */

#define LOC_TABLE 65536            /* power of two */

typedef struct {
    _Atomic uintptr_t code;        /* key part 1; written last; 0 = empty */
    int32_t offset;                /* key part 2: instruction offset (code units) */
    uintptr_t check;               /* co_filename pointer ^ co_firstlineno */
    int32_t lineno;
    uint32_t file, func;
    int32_t kind;
} loc_entry;

static loc_entry locs[LOC_TABLE];
static atomic_flag loc_lock = ATOMIC_FLAG_INIT;

int cd_location_get(uint32_t id, cd_location *out)
{
    if (id == 0 || id >= LOC_TABLE)
        return -1;
    const loc_entry *e = &locs[id];
    if (!atomic_load_explicit(&e->code, memory_order_acquire))
        return -1;
    out->file = e->file;
    out->func = e->func;
    out->lineno = e->lineno;
    out->kind = e->kind;
    return 0;
}

static inline uint32_t loc_hash(uintptr_t code, int offset)
{
    uint64_t h = ((uint64_t)code >> 4) * 0x9E3779B97F4A7C15ull ^ (uint64_t)offset * 0xC2B2AE3Du;
    uint32_t i = (uint32_t)(h >> 40) & (LOC_TABLE - 1);
    return i ? i : 1;              /* id 0 means "none" */
}

static uint32_t intern_location(PyCodeObject *code, int offset)
{
    uintptr_t key = (uintptr_t)code;
    uintptr_t check = (uintptr_t)code->co_filename ^ (uintptr_t)code->co_firstlineno;
    uint32_t start = loc_hash(key, offset);
    uint32_t i = start;
    for (int probes = 0; probes < 32; probes++) {
        uintptr_t k = atomic_load_explicit(&locs[i].code, memory_order_acquire);
        if (k == 0)
            break;
        if (k == key && locs[i].offset == offset && locs[i].check == check)
            return i;
        i = (i + 1) & (LOC_TABLE - 1);
        if (!i)
            i = 1;
    }
    /* Miss: resolve while the code object is certainly alive (its frame is
     * on this blocked thread's stack). */
    char file[1024], func[256];
    size_t fn = copy_unicode(code->co_filename, file, sizeof file);
#if PY_VERSION_HEX >= 0x030B0000
    size_t un = copy_unicode(code->co_qualname, func, sizeof func);
#else
    size_t un = copy_unicode(code->co_name, func, sizeof func);
#endif
    int lineno = cd_reader_line((PyObject *)code, offset);
    int kind = kind_of(code, file, fn);
    uint32_t file_id = cd_intern(file, fn), func_id = cd_intern(func, un);

    while (atomic_flag_test_and_set_explicit(&loc_lock, memory_order_acquire))
        sched_yield();
    uint32_t found = 0;
    i = start;
    for (int probes = 0; probes < 32; probes++) {
        uintptr_t k = atomic_load_explicit(&locs[i].code, memory_order_relaxed);
        if (k == 0) {
            locs[i].offset = offset;
            locs[i].check = check;
            locs[i].lineno = lineno;
            locs[i].file = file_id;
            locs[i].func = func_id;
            locs[i].kind = kind;
            atomic_store_explicit(&locs[i].code, key, memory_order_release);
            found = i;
            break;
        }
        if (k == key && locs[i].offset == offset && locs[i].check == check) {
            found = i;
            break;
        }
        i = (i + 1) & (LOC_TABLE - 1);
        if (!i)
            i = 1;
    }
    atomic_flag_clear_explicit(&loc_lock, memory_order_release);
    return found;                  /* 0 when the neighbourhood is full */
}

/* Code objects' kinds (user or library), by code object: a walk that looks
 * for the first user frame classifies the frames above the innermost ones
 * without interning their locations. Same key check as the locations. */
#define CODE_TABLE 16384
static struct {
    _Atomic uintptr_t code;        /* written last */
    uintptr_t check;
    int kind;
} codes[CODE_TABLE];

static int code_kind(PyCodeObject *code)
{
    uintptr_t key = (uintptr_t)code;
    uintptr_t check = (uintptr_t)code->co_filename ^ (uintptr_t)code->co_firstlineno;
    uint32_t i = (uint32_t)((key >> 4) * 0x9E3779B1u) & (CODE_TABLE - 1);
    for (int probes = 0; probes < 16; probes++, i = (i + 1) & (CODE_TABLE - 1)) {
        uintptr_t k = atomic_load_explicit(&codes[i].code, memory_order_acquire);
        if (k == key && codes[i].check == check)
            return codes[i].kind;
        if (k == 0) {
            char file[1024];
            size_t fn = copy_unicode(code->co_filename, file, sizeof file);
            int kind = kind_of(code, file, fn);
            uintptr_t expected = 0;
            codes[i].check = check;          /* a racing reader sees key 0 until below */
            codes[i].kind = kind;
            atomic_compare_exchange_strong(&codes[i].code, &expected, key);
            return kind;
        }
    }
    char file[1024];
    return kind_of(code, file, copy_unicode(code->co_filename, file, sizeof file));
}

/* ----------------------------------------------------------- the walk -- */

int cd_frames_capture(uint32_t *ids, int max, int to_user, int *complete)
{
    *complete = 0;
    if (max <= 0)
        return 0;
    void *f = cd_reader_first();
    cd_pyframe batch[16];
    int n = 0, depth = 0, skipped = 0, want = 4;   /* most walks end at the first few */
    while (f && depth < 256) {
        int got = cd_reader_frames(&f, batch, want);
        want = 16;
        for (int b = 0; b < got; b++) {
            PyCodeObject *code = (PyCodeObject *)batch[b].code;
            int offset = batch[b].lasti, kind = CD_LOC_LIBRARY;
            if (n < max - (to_user ? 1 : 0)) {
                uint32_t id = intern_location(code, offset);
                ids[n++] = id;
                if ((to_user && id && locs[id].kind == CD_LOC_USER) || (!to_user && n == max))
                    return n;
            } else if (to_user && (kind = code_kind(code)) == CD_LOC_USER) {
                ids[n++] = intern_location(code, offset);   /* the user frame */
                *complete = skipped ? -1 : 0;
                return n;
            } else {
                if (to_user && kind == CD_LOC_COMPILED && n > 0)
                    ids[n - 1] = intern_location(code, offset);  /* names the compiled function */
                skipped++;
            }
            if (++depth >= (to_user ? 64 : 256))
                return n;
        }
    }
    if (!f)
        *complete = 1;
    return n;
}
