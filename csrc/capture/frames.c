/*
 * capture/frames.c: the launching thread's Python location, read without the GIL.
 *
 * PyTorch, CuPy and Triton release the GIL around kernel launches, so the
 * CUPTI callback runs on a thread that is blocked inside a C call made from
 * Python: its own frame stack cannot change until the call returns. As
 * faulthandler does (Python/traceback.c, _Py_DumpTracebackThreads), we walk it
 * without the GIL, reading only immutable parts of the code objects.
 *
 * Each (code object, instruction offset) is interned once as a location:
 * file name, function name, line number and kind (user or library code),
 * copied into the string arena (intern.c), so a record keeps 4-byte ids that
 * stay meaningful after the code object is gone (the locations section says
 * how a freed code object's address is told from its successor's). A hit
 * costs a few hash probes per frame; a miss resolves the line from the code
 * object's line table (cd_reader_line) and copies the names.
 *
 * The frame layout is CPython-internal and changes per minor version:
 * frame_readers.c has the one reader for this Python (cd_reader_*). Where
 * none applies, reports take the launching line from the framework's
 * traceback only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>           /* first: it sets the feature macros (_GNU_SOURCE) */

#include "capture/capture.h"

#include <limits.h>     /* PATH_MAX */
#include <sched.h>       /* sched_yield */
#include <stdlib.h>      /* realpath */
#include <string.h>      /* strlen, memcmp, memchr, ... */
#include <time.h>        /* timespec, nanosleep */

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

/* One code point as UTF-8, as os.fsencode writes it (UTF-8, surrogateescape):
 * U+DC80..U+DCFF, which os.fsdecode made of a byte that is not UTF-8 (a
 * file name in Latin-1...), is that byte again; any other lone surrogate,
 * which no file system gives, is U+FFFD. */
static size_t char_bytes(Py_UCS4 c)
{
    if (c >= 0xDC80 && c <= 0xDCFF)
        return 1;
    return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4;
}

static size_t put_char(Py_UCS4 c, char *out)
{
    if (c >= 0xDC80 && c <= 0xDCFF) {
        out[0] = (char)(c - 0xDC00);
        return 1;
    }
    if (c >= 0xD800 && c <= 0xDFFF)
        c = 0xFFFD;
    if (c < 0x80) {
        out[0] = (char)c;
        return 1;
    }
    if (c < 0x800) {
        out[0] = (char)(0xC0 | (c >> 6));
        out[1] = (char)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12));
        out[1] = (char)(0x80 | ((c >> 6) & 0x3F));
        out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18));
    out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F));
    out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

#define CUT_MARK "..."

/* Copy a str object's text as os.fsencode would (char_bytes) without the GIL
 * (compact strings only, which is every str the interpreter makes); returns
 * the length. A text longer than cap - 1 bytes: with `visibly`, its start,
 * "...", and its end (a path's file name is at its end); else its start. */
static size_t copy_unicode(PyObject *u, char *out, size_t cap, int visibly)
{
    if (!u || !PyUnicode_Check(u) || cap < 16)
        return 0;
#if PY_VERSION_HEX < 0x030C0000
    if (!PyUnicode_IS_READY(u))
        return 0;
#endif
    if (!PyUnicode_IS_COMPACT(u))
        return 0;
    const Py_ssize_t len = PyUnicode_GET_LENGTH(u);
    const int kind = PyUnicode_KIND(u);
    const void *data = PyUnicode_DATA(u);
    const size_t room = cap - 1;
    size_t total = 0;
    for (Py_ssize_t i = 0; i < len && total <= room; i++)
        total += char_bytes(PyUnicode_READ(kind, data, i));
    size_t o = 0;
    Py_ssize_t i = 0;
    if (total <= room || !visibly) {
        for (; i < len; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (o + char_bytes(c) > room)
                break;
            o += put_char(c, out + o);
        }
        out[o] = '\0';
        return o;
    }
    const size_t budget = room - (sizeof CUT_MARK - 1);
    for (; i < len; i++) {             /* the start: a quarter */
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (o + char_bytes(c) > budget / 4)
            break;
        o += put_char(c, out + o);
    }
    memcpy(out + o, CUT_MARK, sizeof CUT_MARK - 1);
    o += sizeof CUT_MARK - 1;
    size_t tail = 0;
    Py_ssize_t j = len;                /* the end: what is left */
    while (j > i && o + tail + char_bytes(PyUnicode_READ(kind, data, j - 1)) <= room) {
        tail += char_bytes(PyUnicode_READ(kind, data, j - 1));
        j--;
    }
    for (; j < len; j++)
        o += put_char(PyUnicode_READ(kind, data, j), out + o);
    out[o] = '\0';
    return o;
}

size_t cd_frames_copy_name(void *str, char *out, size_t cap)
{
    return copy_unicode((PyObject *)str, out, cap, 1);
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
        if (copy_unicode(PyTuple_GET_ITEM(names, i), name, sizeof name, 0) >= 13 &&
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
    char file[CD_NAME_MAX];
    PyCodeObject *c = (PyCodeObject *)code;
    return kind_of(c, file, copy_unicode(c->co_filename, file, sizeof file, 1));
}

/* ----------------------------------------------------------- locations -- */

/*
 * Three fixed tables, written under loc_lock (cold: the first sight of a code
 * location), read without any lock by the launch callback:
 *   loc_store  the locations, append-only: id -> (file, function, line, kind).
 *              An id kept in a ring or fault record names the same file:line
 *              forever; equal locations share one id (loc_dedup).
 *   codes      code object -> (epoch, kind, content check). An epoch numbers
 *              one code object's life at its address: a freed code object's
 *              address is soon reused by a new one, often with the same file
 *              name object and first line (an edited notebook cell run
 *              again), so the address alone names nothing.
 *   index      (epoch, instruction offset) -> location id.
 * A freed code object's entry is retired as it is freed (a code watcher on
 * 3.12+; before, a wrapper of the code type's deallocator), and its epoch
 * with it: index entries of a retired epoch never match again and are
 * overwritten in time. Where no watcher slot is free (3.12+: eight per
 * interpreter) each lookup checks the code object's content instead (file
 * and function names, first line, line table, length; O(line table), so only
 * then): new content at an old address gets a new epoch.
 * A reader reads a slot's key, its value (acquire), then the key again: a slot
 * rewritten meanwhile (another key evicting it) reads as a miss, never as a
 * mix of two entries. Each table's value is one atomic word.
 */

#define LOC_MAX 65536              /* location ids 1 .. LOC_MAX-1 */
#define DEDUP_TABLE (2 * LOC_MAX)  /* power of two, never more than half full */
#define INDEX_TABLE 65536          /* power of two */
#define CODE_TABLE 16384           /* power of two */
#define PROBES 16
#define KEY_FREE 0u
#define KEY_DEAD 1u                /* a retired entry, or one being rewritten */

typedef struct {
    uint32_t file, func;           /* interned */
    int32_t lineno;
    int32_t kind;
} loc_rec;

typedef struct {
    _Atomic uint64_t key;          /* KEY_FREE, KEY_DEAD or a key */
    _Atomic uint64_t val;
} slot_t;

static loc_rec loc_store[LOC_MAX];
static atomic_uint n_locs = 1;     /* ids handed out: [1, n_locs); release-stored */
static uint32_t loc_dedup[DEDUP_TABLE];   /* under loc_lock */
/* codes: key = the code object's address; val = epoch << 32 | check << 2 | kind */
static slot_t codes[CODE_TABLE];
/* index: key = epoch << 32 | offset; val = the location id */
static slot_t loc_index[INDEX_TABLE];
static uint32_t next_epoch = 1;    /* under loc_lock */
static atomic_int code_watcher_on; /* 1: freed code objects are retired */
static atomic_flag loc_lock = ATOMIC_FLAG_INIT;

static void loc_lock_take(void)
{
    while (atomic_flag_test_and_set_explicit(&loc_lock, memory_order_acquire))
        sched_yield();
}

static void loc_lock_give(void) { atomic_flag_clear_explicit(&loc_lock, memory_order_release); }

static inline uint32_t mix64(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    return (uint32_t)x;
}

/* The value stored under `key` among the probes from `start`; 0 when none
 * (or when its slot changed while it was read). Lock-free. */
static uint64_t slot_find(slot_t *t, uint32_t mask, uint32_t start, uint64_t key)
{
    for (uint32_t i = start, p = 0; p < PROBES; p++, i = (i + 1) & mask) {
        uint64_t k = atomic_load_explicit(&t[i].key, memory_order_acquire);
        if (k == key) {
            uint64_t v = atomic_load_explicit(&t[i].val, memory_order_acquire);
            return atomic_load_explicit(&t[i].key, memory_order_relaxed) == key ? v : 0;
        }
        if (k == KEY_FREE)
            return 0;
    }
    return 0;
}

/* key -> val (under loc_lock): the key's own slot, else the first free or
 * retired one, else the first probe's (evicted: a miss for its key later). */
static void slot_put(slot_t *t, uint32_t mask, uint32_t start, uint64_t key, uint64_t val)
{
    uint32_t spot = start;
    int found = 0;
    for (uint32_t i = start, p = 0; p < PROBES; p++, i = (i + 1) & mask) {
        uint64_t k = atomic_load_explicit(&t[i].key, memory_order_relaxed);
        if (k == key) {
            atomic_store_explicit(&t[i].val, val, memory_order_release);
            return;
        }
        if (!found && (k == KEY_FREE || k == KEY_DEAD)) {
            spot = i;
            found = 1;
        }
        if (k == KEY_FREE)
            break;
    }
    slot_t *s = &t[spot];
    if (atomic_load_explicit(&s->key, memory_order_relaxed) != KEY_FREE)
        atomic_store_explicit(&s->key, KEY_DEAD, memory_order_relaxed);
    atomic_store_explicit(&s->val, val, memory_order_release);   /* after KEY_DEAD */
    atomic_store_explicit(&s->key, key, memory_order_release);   /* last */
}

/* The id of location (file, func, lineno, kind), added on first sight;
 * 0 when the store is full. Under loc_lock. */
static uint32_t loc_add(uint32_t file, uint32_t func, int lineno, int kind)
{
    uint32_t h = mix64(((uint64_t)file << 32 | func) ^ ((uint64_t)(uint32_t)lineno << 2 | (uint32_t)kind) *
                       0x9E3779B97F4A7C15ull);
    for (uint32_t i = h & (DEDUP_TABLE - 1);; i = (i + 1) & (DEDUP_TABLE - 1)) {
        uint32_t id = loc_dedup[i];
        if (!id) {
            uint32_t n = atomic_load_explicit(&n_locs, memory_order_relaxed);
            if (n >= LOC_MAX)
                return 0;
            loc_store[n] = (loc_rec){file, func, lineno, kind};
            loc_dedup[i] = n;
            atomic_store_explicit(&n_locs, n + 1, memory_order_release);
            return n;
        }
        const loc_rec *r = &loc_store[id];
        if (r->file == file && r->func == func && r->lineno == lineno && r->kind == kind)
            return id;
    }
}

int cd_location_get(uint32_t id, cd_location *out)
{
    if (id == 0 || id >= atomic_load_explicit(&n_locs, memory_order_acquire))
        return -1;
    const loc_rec *r = &loc_store[id];
    out->file = r->file;
    out->func = r->func;
    out->lineno = r->lineno;
    out->kind = r->kind;
    return 0;
}

static inline uint32_t code_slot(const PyCodeObject *code)
{
    return mix64((uintptr_t)code) & (CODE_TABLE - 1);
}

/* With the GIL: `code` is being freed; its entry (if any) is retired. */
static void retire_code(PyCodeObject *code)
{
    uint32_t start = code_slot(code);
    if (!slot_find(codes, CODE_TABLE - 1, start, (uintptr_t)code))
        return;                    /* never on a launching stack (most code objects) */
    loc_lock_take();
    for (uint32_t i = start, p = 0; p < PROBES; p++, i = (i + 1) & (CODE_TABLE - 1))
        if (atomic_load_explicit(&codes[i].key, memory_order_relaxed) == (uintptr_t)code) {
            atomic_store_explicit(&codes[i].key, KEY_DEAD, memory_order_release);
            break;
        }
    loc_lock_give();
}

#if PY_VERSION_HEX >= 0x030C0000
static int on_code_event(PyCodeEvent event, PyCodeObject *code)
{
    if (event == PY_CODE_EVENT_DESTROY)
        retire_code(code);
    return 0;
}
#else
/* Before 3.12 there are no code watchers: the code type's deallocator is
 * wrapped instead (every code object is freed through it). */
static destructor code_dealloc;

static void code_dealloc_retiring(PyObject *code)
{
    retire_code((PyCodeObject *)code);
    code_dealloc(code);
}
#endif

int cd_frames_watch_code(void)
{
    if (atomic_load(&code_watcher_on))
        return 0;
#if PY_VERSION_HEX >= 0x030C0000
    if (PyCode_AddWatcher(on_code_event) < 0) {
        PyErr_Clear();             /* every watcher slot taken: check contents instead */
        return -1;
    }
#else
    code_dealloc = PyCode_Type.tp_dealloc;
    PyCode_Type.tp_dealloc = code_dealloc_retiring;
#endif
    atomic_store(&code_watcher_on, 1);
    return 0;
}

/* A 64-bit hash of n bytes, eight at a time. */
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (; n >= 8; b += 8, n -= 8) {
        uint64_t w;
        memcpy(&w, b, 8);
        h = (h ^ w) * 0x9E3779B97F4A7C15ull;
        h ^= h >> 29;
    }
    uint64_t w = n;
    memcpy(&w, b, n);
    h = (h ^ w ^ ((uint64_t)n << 59)) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 31);
}

static uint64_t hash_str(uint64_t h, PyObject *u)
{
    if (!u || !PyUnicode_Check(u) || !PyUnicode_IS_COMPACT(u))
        return h * 31 + 7;
    return hash_bytes(h, PyUnicode_DATA(u),
                      (size_t)PyUnicode_GET_LENGTH(u) * (size_t)PyUnicode_KIND(u));
}

/* What a location depends on, of a code object (its immutable parts): the
 * file and function names, the first line, the line table, the length. */
static uint32_t code_check(PyCodeObject *code)
{
#if PY_VERSION_HEX >= 0x030B0000
    uint64_t h = hash_str(hash_str(0, code->co_filename), code->co_qualname);
    Py_ssize_t len = Py_SIZE(code);
#else
    uint64_t h = hash_str(hash_str(0, code->co_filename), code->co_name);
    Py_ssize_t len = code->co_code && PyBytes_Check(code->co_code) ?
                     PyBytes_GET_SIZE(code->co_code) : -1;
#endif
    PyObject *lt = code->co_linetable;
    if (lt && PyBytes_Check(lt))
        h = hash_bytes(h, PyBytes_AS_STRING(lt), (size_t)PyBytes_GET_SIZE(lt));
    h = hash_bytes(h ^ (uint64_t)code->co_firstlineno, &len, sizeof len);
    return (uint32_t)(h >> 34);    /* 30 bits */
}

/* The code object's entry (epoch << 32 | check << 2 | kind), added on first
 * sight (the kind from its file name and calls: kind_of, the cold part) or when
 * its content is not the one recorded at its address. */
static uint64_t code_entry(PyCodeObject *code)
{
    const uint32_t check = atomic_load_explicit(&code_watcher_on, memory_order_relaxed) ?
                           0 : code_check(code);
    const uint32_t start = code_slot(code);
    uint64_t v = slot_find(codes, CODE_TABLE - 1, start, (uintptr_t)code);
    if (v && (uint32_t)v >> 2 == check)
        return v;
    char file[CD_NAME_MAX];
    size_t fn = copy_unicode(code->co_filename, file, sizeof file, 1);
    int kind = kind_of(code, file, fn);    /* 2 bits: CD_LOC_* */
    loc_lock_take();
    v = slot_find(codes, CODE_TABLE - 1, start, (uintptr_t)code);
    if (!(v && (uint32_t)v >> 2 == check)) {   /* not added by another thread meanwhile */
        uint32_t epoch = next_epoch++;
        if (!next_epoch)
            next_epoch = 1;
        v = (uint64_t)epoch << 32 | (uint64_t)check << 2 | (uint64_t)kind;
        slot_put(codes, CODE_TABLE - 1, start, (uintptr_t)code, v);
    }
    loc_lock_give();
    return v;
}

int cd_frames_code_watched(void) { return atomic_load(&code_watcher_on); }

static inline int loc_kind(uint32_t id) { return loc_store[id].kind; }

static uint32_t intern_location(PyCodeObject *code, int offset)
{
    const uint64_t entry = code_entry(code);
    const uint64_t key = (entry >> 32) << 32 | (uint32_t)offset;
    const uint32_t start = mix64(key) & (INDEX_TABLE - 1);
    uint64_t v = slot_find(loc_index, INDEX_TABLE - 1, start, key);
    if (v)
        return (uint32_t)v;
    /* Miss: resolve while the code object is certainly alive (its frame is
     * on this blocked thread's stack). */
    char file[CD_NAME_MAX], func[256];
    size_t fn = copy_unicode(code->co_filename, file, sizeof file, 1);
#if PY_VERSION_HEX >= 0x030B0000
    size_t un = copy_unicode(code->co_qualname, func, sizeof func, 1);
#else
    size_t un = copy_unicode(code->co_name, func, sizeof func, 1);
#endif
    int lineno = cd_reader_line((PyObject *)code, offset);
    uint32_t file_id = cd_intern(file, fn), func_id = cd_intern(func, un);
    loc_lock_take();
    uint32_t id = loc_add(file_id, func_id, lineno, (int)(entry & 3));
    if (id)
        slot_put(loc_index, INDEX_TABLE - 1, start, key, id);
    loc_lock_give();
    return id;                     /* 0 when the store is full */
}

/* Code objects' kinds (user or library): a walk that looks for the first
 * user frame classifies the frames above the innermost ones without interning
 * their locations. */
static int code_kind(PyCodeObject *code) { return (int)(code_entry(code) & 3); }

int cd_code_kind_cached(void *code) { return code_kind((PyCodeObject *)code); }

/* ----------------------------------------------------------- the walk -- */

static int walk(uint32_t *ids, int max, int to_user, int *complete)
{
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
                if ((to_user && id && loc_kind(id) == CD_LOC_USER) || (!to_user && n == max))
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

/* --------------------------------------------- interpreter shutdown -- */

/* The finalizer frees the other threads' states (Py_FinalizeEx:
 * _PyThreadState_DeleteExcept) while a daemon thread may still be inside a
 * CUDA call, launching: its frames must not be read from then on. Frame
 * reads stop when the interpreter's atexit hooks run (cd_frames_stop, which
 * waits for the reads under way, briefly), or once it says it is finalizing.
 * A reader counts itself in before it looks at the flag, the hook sets the
 * flag before it looks at the count (both sequentially consistent): either
 * the reader sees the flag, or the hook waits for that reader. */
static atomic_int frames_stopped;
static _Alignas(64) atomic_int frames_readers;

static int interpreter_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

void cd_frames_stop(void)
{
    atomic_store(&frames_stopped, 1);
    for (int i = 0; i < 2000 && atomic_load(&frames_readers) > 0; i++) {
        struct timespec ts = {0, 50000};       /* up to 100 ms in all */
        nanosleep(&ts, NULL);
    }
}

int cd_frames_read(uint32_t *ids, int max, int to_user, int *complete)
{
    *complete = 0;
    if (max <= 0)
        return 0;
    atomic_fetch_add(&frames_readers, 1);
    int n = 0;
    if (!atomic_load(&frames_stopped) && !interpreter_finalizing())
        n = walk(ids, max, to_user, complete);
    atomic_fetch_sub(&frames_readers, 1);
    return n;
}

void cd_frames_fork(int op)
{
    switch (op) {
    case CD_FORK_CHILD:
        /* A parent's thread mid-insert: its entry is published last (key,
         * n_locs), so what it left half-written is never read. */
        atomic_flag_clear(&loc_lock);
        atomic_store(&frames_readers, 0);      /* the parent's readers are not here */
        break;
    case CD_FORK_TEST_TAKE:
        loc_lock_take();
        atomic_fetch_add(&frames_readers, 1);
        break;
    case CD_FORK_TEST_GIVE:
        atomic_fetch_sub(&frames_readers, 1);
        loc_lock_give();
        break;
    }
}
