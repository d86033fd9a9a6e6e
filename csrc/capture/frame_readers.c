/*
 * capture/frame_readers.c: the one reader of the interpreter's frame stack
 * for this Python, chosen once at import (cd_reader_init); frames.c walks
 * with it and interns what it finds.
 *
 *   3.10        the PyFrameObject chain (tstate->frame, f_back, f_lasti)
 *   3.11, 3.12  tstate->cframe->current_frame, from the internal headers
 *   3.13 on     CPython's own table of offsets for debuggers and profilers,
 *               _Py_DebugOffsets at the start of _PyRuntime (cookie
 *               "xdebugpy"): the thread state's current frame, a frame's
 *               previous / executable / instr_ptr / owner, the code
 *               object's co_code_adaptive. No internal header is included.
 *
 * The table is checked once: the cookie, the version (the running
 * interpreter's Py_Version), the free-threaded flag, the sizes and the
 * offsets this module also knows from the public headers (PyObject,
 * PyCodeObject, PyThreadState); then a walk of the importing thread's
 * frames through the table must find the code objects and instruction
 * offsets that PyFrame_GetBack / PyFrame_GetCode / PyFrame_GetLasti give.
 * Anything else: no reader ("none: why"), and reports say so.
 *
 * All reads run without the GIL on a thread blocked in a C call made from
 * Python (see frames.c): its frames cannot change under us.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>           /* first: it sets the feature macros (_GNU_SOURCE) */

#include "capture/capture.h"

#include <dlfcn.h>      /* dlsym, RTLD_DEFAULT, Dl_info, ... */
#include <stdio.h>       /* snprintf */
#include <string.h>      /* memset, memcmp, memcpy */

#if PY_VERSION_HEX >= 0x030D0000
#  define CD_READER_TABLE 1           /* _Py_DebugOffsets */
#elif PY_VERSION_HEX >= 0x030B0000
#  ifndef Py_BUILD_CORE
#    define Py_BUILD_CORE 1
#  endif
#  include "internal/pycore_frame.h"   /* _PyInterpreterFrame */
#  define CD_READER_INTERNAL 1        /* 3.11, 3.12 */
#elif PY_VERSION_HEX >= 0x030A0000
#  include <frameobject.h>     /* PyFrameObject, PyFrame_GetCode */
#  define CD_READER_FRAMEOBJECT 1     /* 3.10 */
#endif

static char reader_name[160] = "none: not chosen yet";
static char python_xy[16] = "?";
static int reader_ok;

const char *cd_reader_name(void) { return reader_name; }
const char *cd_reader_python(void) { return python_xy; }
int cd_reader_ok(void) { return reader_ok; }

/* ------------------------------------------------- the line table (3.11+) -- */

/* The line of instruction `lasti` (code units) from the code object's
 * location table, as _PyCode_CheckLineNumber reads it (Objects/locations.md:
 * an entry is a byte 1CCCCLLL, code C, L+1 code units, then bytes with bit 7
 * clear; code 15 has no line, 13 and 14 start with a signed varint line
 * delta, 10-12 add C-10, 0-9 keep the line). PyCode_Addr2Line reads
 * co->_co_monitoring->lines instead while line events are instrumented
 * (3.12 on), an array another thread fills with the GIL (or, free-threaded,
 * in a stop-the-world this blocked thread takes no part in) after the pointer
 * is set; the table itself is immutable. -1: no line. */
int cd_reader_line(struct _object *code_obj, int lasti)
{
    PyCodeObject *co = (PyCodeObject *)code_obj;
    if (lasti < 0)
        return co->co_firstlineno;
#if PY_VERSION_HEX < 0x030B0000
    return PyCode_Addr2Line(co, lasti * CD_CODE_UNIT_BYTES);   /* no instrumentation in 3.10 */
#else
    PyObject *lt = co->co_linetable;
    if (!lt || !PyBytes_Check(lt))
        return -1;
    const uint8_t *p = (const uint8_t *)PyBytes_AS_STRING(lt);
    const uint8_t *end = p + PyBytes_GET_SIZE(lt);
    int line = co->co_firstlineno, addr = 0;
    while (p < end) {
        uint8_t first = *p;
        int kind = (first >> 3) & 15, len = (first & 7) + 1;
        if (kind == 13 || kind == 14) {           /* signed varint: 6 bits a byte, bit 6 more */
            const uint8_t *q = p + 1;
            unsigned v = 0, shift = 0;
            while (q < end && shift < 30) {
                v |= (unsigned)(*q & 63) << shift;
                shift += 6;
                if (!(*q++ & 64))
                    break;
            }
            line += (v & 1) ? -(int)(v >> 1) : (int)(v >> 1);
        } else if (kind >= 10 && kind <= 12) {
            line += kind - 10;
        }
        if (lasti < addr + len)
            return kind == 15 ? -1 : line;
        addr += len;
        do
            p++;
        while (p < end && !(*p & 128));
    }
    return -1;
#endif
}

/* -------------------------------------------------------- 3.10 - 3.12 -- */

#if defined(CD_READER_FRAMEOBJECT)

static inline void *rd_first(void)
{
    PyThreadState *ts = PyGILState_GetThisThreadState();
    return ts && reader_ok ? ts->frame : NULL;
}

static inline void *rd_next(void *f) { return ((PyFrameObject *)f)->f_back; }

static inline PyObject *rd_code(void *fp, int *lasti)
{
    PyFrameObject *f = fp;
    *lasti = f->f_lasti < 0 ? 0 : f->f_lasti;
    return (PyObject *)f->f_code;
}

#elif defined(CD_READER_INTERNAL)

static inline void *rd_first(void)
{
    PyThreadState *ts = PyGILState_GetThisThreadState();
    return ts && ts->cframe && reader_ok ? ts->cframe->current_frame : NULL;
}

static inline void *rd_next(void *f) { return ((_PyInterpreterFrame *)f)->previous; }

/* NULL for frames that run no Python code yet (C-stack shims, frames still
 * being set up). */
static inline PyObject *rd_code(void *fp, int *lasti)
{
    _PyInterpreterFrame *f = fp;
#  if PY_VERSION_HEX >= 0x030C0000
    if (f->owner == FRAME_OWNED_BY_CSTACK)
        return NULL;
#  endif
    if (_PyFrame_IsIncomplete(f))
        return NULL;
    *lasti = _PyInterpreterFrame_LASTI(f);
    return (PyObject *)f->f_code;
}

#endif

/* ------------------------------------------------- 3.13 on: the table -- */

#ifdef CD_READER_TABLE

/* The table's first members, per layout, copied from CPython's headers
 * (3.13: Include/internal/pycore_runtime.h; 3.14 and 3.15:
 * Include/internal/pycore_debug_offsets.h), up to the PyObject offsets: the
 * table goes on, we read no further. The layout is fixed within a minor
 * version and changes between them. */
#define TABLE_HEAD                                                                        \
    char cookie[8];                                                                       \
    uint64_t version;                                                                     \
    uint64_t free_threaded;                                                               \
    struct { uint64_t size, finalizing, interpreters_head; } runtime_state

typedef struct {
    TABLE_HEAD;
    struct {
        uint64_t size, id, next, threads_head, gc, imports_modules, sysdict, builtins,
            ceval_gil, gil_runtime_state, gil_runtime_state_enabled, gil_runtime_state_locked,
            gil_runtime_state_holder;
    } interpreter_state;
    struct {
        uint64_t size, prev, next, interp, current_frame, thread_id, native_thread_id,
            datastack_chunk, status;
    } thread_state;
    struct { uint64_t size, previous, executable, instr_ptr, localsplus, owner; } interpreter_frame;
    struct {
        uint64_t size, filename, name, qualname, linetable, firstlineno, argcount,
            localsplusnames, localspluskinds, co_code_adaptive;
    } code_object;
    struct { uint64_t size, ob_type; } pyobject;
} offsets_313;

/* The members 3.15 kept as 3.14 had them. */
typedef struct {
    uint64_t size, id, next, threads_head, threads_main, gc, imports_modules, sysdict,
        builtins, ceval_gil, gil_runtime_state, gil_runtime_state_enabled,
        gil_runtime_state_locked, gil_runtime_state_holder, code_object_generation,
        tlbc_generation;
} interpreter_state_314;
typedef struct {
    uint64_t size, previous, executable, instr_ptr, localsplus, owner, stackpointer,
        tlbc_index;
} interpreter_frame_314;
typedef struct {
    uint64_t size, filename, name, qualname, linetable, firstlineno, argcount,
        localsplusnames, localspluskinds, co_code_adaptive, co_tlbc;
} code_object_314;

typedef struct {
    TABLE_HEAD;
    interpreter_state_314 interpreter_state;
    struct {
        uint64_t size, prev, next, interp, current_frame, thread_id, native_thread_id,
            datastack_chunk, status;
    } thread_state;
    interpreter_frame_314 interpreter_frame;
    code_object_314 code_object;
    struct { uint64_t size, ob_type; } pyobject;
} offsets_314;

typedef struct {
    TABLE_HEAD;
    interpreter_state_314 interpreter_state;
    struct {
        uint64_t size, prev, next, interp, current_frame, base_frame, last_profiled_frame,
            last_profiled_frame_seq, thread_id, native_thread_id, datastack_chunk, status,
            holds_gil, gil_requested, current_exception, exc_state;
    } thread_state;
    struct { uint64_t exc_value; } err_stackitem;
    interpreter_frame_314 interpreter_frame;
    code_object_314 code_object;
    struct { uint64_t size, ob_type; } pyobject;
} offsets_315;

/* What the reader uses, from any layout. */
typedef struct {
    uint64_t version, free_threaded;
    uint64_t ts_size, ts_current_frame;
    uint64_t fr_size, fr_previous, fr_executable, fr_instr_ptr, fr_owner, fr_tlbc_index;
    uint64_t co_size, co_filename, co_qualname, co_linetable, co_firstlineno, co_adaptive,
        co_tlbc;
    uint64_t ob_size, ob_type;
    int stackref;        /* f_executable is a tagged _PyStackRef (3.14 on) */
    int foreign_owner;   /* owner >= this: a frame of the C stack or the interpreter */
} table_view;

#define VIEW_COMMON(T, v)                                                                 \
    do {                                                                                  \
        (v)->version = (T)->version;                                                      \
        (v)->free_threaded = (T)->free_threaded;                                          \
        (v)->ts_size = (T)->thread_state.size;                                            \
        (v)->ts_current_frame = (T)->thread_state.current_frame;                          \
        (v)->fr_size = (T)->interpreter_frame.size;                                       \
        (v)->fr_previous = (T)->interpreter_frame.previous;                               \
        (v)->fr_executable = (T)->interpreter_frame.executable;                           \
        (v)->fr_instr_ptr = (T)->interpreter_frame.instr_ptr;                             \
        (v)->fr_owner = (T)->interpreter_frame.owner;                                     \
        (v)->co_size = (T)->code_object.size;                                             \
        (v)->co_filename = (T)->code_object.filename;                                     \
        (v)->co_qualname = (T)->code_object.qualname;                                     \
        (v)->co_linetable = (T)->code_object.linetable;                                   \
        (v)->co_firstlineno = (T)->code_object.firstlineno;                               \
        (v)->co_adaptive = (T)->code_object.co_code_adaptive;                             \
        (v)->ob_size = (T)->pyobject.size;                                                \
        (v)->ob_type = (T)->pyobject.ob_type;                                             \
    } while (0)

/* The owners, per version (Include/internal/pycore_frame.h in 3.13,
 * pycore_interpframe_structs.h later): THREAD 0, GENERATOR 1, FRAME_OBJECT 2;
 * 3.13 CSTACK 3; 3.14 INTERPRETER 3, CSTACK 4; 3.15 INTERPRETER 3. */
#define OWNED_BY_GENERATOR 1

static const struct {
    int minor;
    size_t bytes;
} layouts[] = {{13, sizeof(offsets_313)}, {14, sizeof(offsets_314)}, {15, sizeof(offsets_315)}};

/* A layout of 3.14 on: the members of the tagged frames too. */
#define VIEW_TAGGED(T, v)                                                                 \
    do {                                                                                  \
        VIEW_COMMON(T, v);                                                                \
        (v)->fr_tlbc_index = (T)->interpreter_frame.tlbc_index;                           \
        (v)->co_tlbc = (T)->code_object.co_tlbc;                                          \
        (v)->stackref = 1;                                                                \
    } while (0)

/* Read a layout into v; the layout's size, 0 when this minor has none. */
static size_t view_of(const void *table, size_t n, int minor, table_view *v)
{
    memset(v, 0, sizeof *v);
    size_t bytes = cd_reader_table_bytes(minor);
    if (!bytes || n < bytes)
        return 0;
    if (minor == 13)
        VIEW_COMMON((const offsets_313 *)table, v);
    else if (minor == 14)
        VIEW_TAGGED((const offsets_314 *)table, v);
    else
        VIEW_TAGGED((const offsets_315 *)table, v);
    v->foreign_owner = 3;
    return bytes;
}

size_t cd_reader_table_bytes(int minor)
{
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++)
        if (layouts[i].minor == minor)
            return layouts[i].bytes;
    return 0;
}

#ifdef Py_GIL_DISABLED
#  define CD_FREE_THREADED 1
#else
#  define CD_FREE_THREADED 0
#endif

/* The checks on a copy of the table (n bytes) against the running
 * interpreter's version `running` (Py_Version): 0 and *out filled, or -1
 * with the reason in why. Pure: the tests feed it corrupted copies. */
int cd_reader_check_table(const void *table, size_t n, unsigned long running,
                          void *out_view, char *why, size_t cap)
{
    table_view v;
    const char *cookie = table;
    if (!table || n < 24) {
        snprintf(why, cap, "no _Py_DebugOffsets table (%zu bytes)", n);
        return -1;
    }
    if (memcmp(cookie, "xdebugpy", 8) != 0) {
        snprintf(why, cap, "_PyRuntime does not start with the \"xdebugpy\" cookie");
        return -1;
    }
    uint64_t version;
    memcpy(&version, cookie + 8, sizeof version);
    if (version != (uint64_t)running) {
        snprintf(why, cap, "the table is for version 0x%08llx, the interpreter is 0x%08lx",
                 (unsigned long long)version, running);
        return -1;
    }
    int major = (int)(version >> 24), minor = (int)((version >> 16) & 0xFF);
    if (major != PY_MAJOR_VERSION || minor != PY_MINOR_VERSION) {
        snprintf(why, cap, "the table is for Python %d.%d, this module was built for %d.%d",
                 major, minor, PY_MAJOR_VERSION, PY_MINOR_VERSION);
        return -1;
    }
    size_t need = cd_reader_table_bytes(minor);
    if (!need) {
        snprintf(why, cap, "no _Py_DebugOffsets layout known for Python %d.%d (known: "
                 "3.13-3.15)", major, minor);
        return -1;
    }
    if (!view_of(table, n, minor, &v)) {
        snprintf(why, cap, "the table is %zu bytes, the %d.%d layout has %zu", n, major, minor,
                 need);
        return -1;
    }
    if (v.free_threaded != CD_FREE_THREADED) {
        snprintf(why, cap, "the table says free_threaded=%llu, this module was built %s",
                 (unsigned long long)v.free_threaded,
                 CD_FREE_THREADED ? "free-threaded" : "with the GIL");
        return -1;
    }
    /* What the public headers also say must agree. */
    const struct {
        const char *what;
        uint64_t table, ours;
    } same[] = {
        {"sizeof(PyObject)", v.ob_size, sizeof(PyObject)},
        {"PyObject.ob_type", v.ob_type, offsetof(PyObject, ob_type)},
        {"sizeof(PyThreadState)", v.ts_size, sizeof(PyThreadState)},
        {"sizeof(PyCodeObject)", v.co_size, sizeof(PyCodeObject)},
        {"PyCodeObject.co_filename", v.co_filename, offsetof(PyCodeObject, co_filename)},
        {"PyCodeObject.co_qualname", v.co_qualname, offsetof(PyCodeObject, co_qualname)},
        {"PyCodeObject.co_linetable", v.co_linetable, offsetof(PyCodeObject, co_linetable)},
        {"PyCodeObject.co_firstlineno", v.co_firstlineno, offsetof(PyCodeObject, co_firstlineno)},
        {"PyCodeObject.co_code_adaptive", v.co_adaptive, offsetof(PyCodeObject, co_code_adaptive)},
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030E0000
        {"PyCodeObject.co_tlbc", v.co_tlbc, offsetof(PyCodeObject, co_tlbc)},
#endif
    };
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        if (same[i].table != same[i].ours) {
            snprintf(why, cap, "the table's %s is %llu, the headers say %llu", same[i].what,
                     (unsigned long long)same[i].table, (unsigned long long)same[i].ours);
            return -1;
        }
    /* The frame's fields must lie inside the frame, the thread's in the thread. */
    uint64_t fields[] = {v.fr_previous, v.fr_executable, v.fr_instr_ptr};
    int bad = v.fr_size < 32 || v.fr_size > 4096 || v.ts_current_frame + 8 > v.ts_size ||
              v.fr_owner + 1 > v.fr_size;
    for (size_t i = 0; i < 3; i++)
        bad |= fields[i] + 8 > v.fr_size || fields[i] % 8;
    if (v.free_threaded && v.stackref)
        bad |= v.fr_tlbc_index == 0 || v.fr_tlbc_index + 4 > v.fr_size;
    if (bad) {
        snprintf(why, cap, "the table's frame offsets do not fit a %llu-byte frame",
                 (unsigned long long)v.fr_size);
        return -1;
    }
    if (out_view)
        memcpy(out_view, &v, sizeof v);
    return 0;
}

static table_view tv;      /* written once at import, before any launch can be seen */

static inline void *load_ptr(const void *base, uint64_t off)
{
    void *p;
    memcpy(&p, (const char *)base + off, sizeof p);
    return p;
}

static inline void *rd_first(void)
{
    PyThreadState *ts = PyGILState_GetThisThreadState();
    return ts && reader_ok ? load_ptr(ts, tv.ts_current_frame) : NULL;
}

static inline void *rd_next(void *f) { return load_ptr(f, tv.fr_previous); }

static inline PyObject *rd_code(void *f, int *lasti)
{
    int owner = *((const char *)f + tv.fr_owner);
    if (owner >= tv.foreign_owner || owner < 0)
        return NULL;
    uintptr_t ex = (uintptr_t)load_ptr(f, tv.fr_executable);
    if (tv.stackref) {
        /* Py_TAG_REFCNT (deferred / immortal: the object's address | 1);
         * a tagged int (bits 11) is no object (3.14 pycore_stackref.h). */
        if ((ex & 3) == 3)
            return NULL;
        ex &= ~(uintptr_t)1;
    }
    if (!ex || (ex & 7) || Py_TYPE((PyObject *)ex) != &PyCode_Type)
        return NULL;
    PyCodeObject *code = (PyCodeObject *)ex;
    const char *ip = load_ptr(f, tv.fr_instr_ptr);
    const char *base = (const char *)code + tv.co_adaptive;
    Py_ssize_t units = Py_SIZE(code);
#if defined(Py_GIL_DISABLED) && PY_VERSION_HEX >= 0x030E0000
    /* Free-threaded 3.14 on: a thread may run its own copy of the bytecode,
     * entries[f->tlbc_index] of the code's co_tlbc array (entry 0 is
     * co_code_adaptive itself). */
    if (ip < base || ip > base + units * CD_CODE_UNIT_BYTES) {
        int32_t idx;
        memcpy(&idx, (const char *)f + tv.fr_tlbc_index, sizeof idx);
        const _PyCodeArray *tlbc = load_ptr(code, tv.co_tlbc);
        if (tlbc && idx > 0 && idx < tlbc->size && tlbc->entries[idx])
            base = tlbc->entries[idx];
    }
#endif
    if (ip < base || ip > base + units * CD_CODE_UNIT_BYTES) {
        *lasti = -1;                     /* an instruction we cannot place: the def line */
        return (PyObject *)code;
    }
    int at = (int)((ip - base) / CD_CODE_UNIT_BYTES);
    /* _PyFrame_IsIncomplete: not a generator's, and before RESUME. */
    if (owner != OWNED_BY_GENERATOR && at < code->_co_firsttraceable)
        return NULL;
    *lasti = at;
    return (PyObject *)code;
}

/* The table, wherever libpython is (the executable or a shared library
 * loaded RTLD_LOCAL by an embedding program). */
static const void *find_table(void)
{
    const void *t = dlsym(RTLD_DEFAULT, "_PyRuntime");
    Dl_info info;
    if (!t && dladdr((void *)&PyCode_Addr2Line, &info) && info.dli_fname) {
        void *h = dlopen(info.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
        if (h) {
            t = dlsym(h, "_PyRuntime");
            dlclose(h);
        }
    }
    return t;
}

size_t cd_reader_live_table(const void **table)
{
    *table = find_table();
    return *table ? cd_reader_table_bytes(PY_MINOR_VERSION) : 0;
}

/* The importing thread's frames through the table against the public API:
 * NULL when they agree. */
static const char *self_test(char *why, size_t cap)
{
    PyThreadState *ts = PyThreadState_Get();
    if (PyGILState_GetThisThreadState() != ts)
        return NULL;                     /* a thread state of its own making: nothing to compare */
    PyFrameObject *pf = PyThreadState_GetFrame(ts);
    void *f = cd_reader_first();
    int n = 0;
    const char *bad = NULL;
    while (pf && !bad && n < 64) {
        int lasti = 0;
        PyObject *ours = NULL;
        for (; f && !(ours = cd_reader_code(f, &lasti)); f = cd_reader_next(f))
            ;
        PyCodeObject *code = PyFrame_GetCode(pf);
        int api_lasti = PyFrame_GetLasti(pf);
        if (!ours)
            snprintf(why, cap, "the walk through the table ended after %d frames, "
                     "PyFrame_GetBack's did not", n), bad = why;
        else if (ours != (PyObject *)code)
            snprintf(why, cap, "frame %d: the table's walk found another code object than "
                     "PyFrame_GetCode", n), bad = why;
        else if (api_lasti >= 0 && api_lasti != lasti * CD_CODE_UNIT_BYTES)
            snprintf(why, cap, "frame %d: instruction offset %d through the table, %d from "
                     "PyFrame_GetLasti", n, lasti * CD_CODE_UNIT_BYTES, api_lasti), bad = why;
        Py_DECREF(code);
        PyFrameObject *back = PyFrame_GetBack(pf);
        Py_DECREF(pf);
        pf = back;
        f = f ? cd_reader_next(f) : NULL;
        n++;
    }
    Py_XDECREF(pf);
    if (!bad) {
        int lasti;
        for (; f; f = cd_reader_next(f))
            if (cd_reader_code(f, &lasti)) {
                snprintf(why, cap, "the walk through the table found more frames than "
                         "PyFrame_GetBack's %d", n);
                return why;
            }
    }
    return bad;
}


#else  /* no table before 3.13 */

#  if !defined(CD_READER_INTERNAL) && !defined(CD_READER_FRAMEOBJECT)
static inline void *rd_first(void) { return NULL; }
static inline void *rd_next(void *f) { (void)f; return NULL; }
static inline PyObject *rd_code(void *f, int *lasti) { (void)f; (void)lasti; return NULL; }
#  endif
size_t cd_reader_live_table(const void **table)
{
    *table = NULL;
    return 0;
}
size_t cd_reader_table_bytes(int minor) { (void)minor; return 0; }
int cd_reader_check_table(const void *table, size_t n, unsigned long running,
                          void *view, char *why, size_t cap)
{
    (void)table, (void)n, (void)running, (void)view;
    snprintf(why, cap, "no _Py_DebugOffsets before Python 3.13");
    return -1;
}

#endif

/* ---------------------------------------------------------- the interface -- */

void *cd_reader_first(void) { return rd_first(); }
void *cd_reader_next(void *f) { return rd_next(f); }
struct _object *cd_reader_code(void *f, int *lasti) { return rd_code(f, lasti); }

/* The hot path's walk: one call per batch of frames, the reader inlined. */
int cd_reader_frames(void **cursor, cd_pyframe *out, int max)
{
    void *f = *cursor;
    int n = 0;
    while (f && n < max) {
        int lasti = 0;
        PyObject *code = rd_code(f, &lasti);
        if (code) {
            out[n].code = code;
            out[n].lasti = lasti;
            n++;
        }
        f = rd_next(f);
    }
    *cursor = f;
    return n;
}

const char *cd_reader_init(const char *force)
{
#if PY_VERSION_HEX >= 0x030B0000
    unsigned long running = Py_Version;
#else
    unsigned long running = PY_VERSION_HEX;
#endif
    snprintf(python_xy, sizeof python_xy, "%d.%d", (int)(running >> 24) & 0xFF,
             (int)(running >> 16) & 0xFF);
    reader_ok = 0;
    if (force && *force) {
        snprintf(reader_name, sizeof reader_name, "none: %s", force);
        return reader_name;
    }
#if defined(CD_READER_FRAMEOBJECT)
    snprintf(reader_name, sizeof reader_name, "3.10 frame objects");
    reader_ok = 1;
#elif defined(CD_READER_INTERNAL)
    snprintf(reader_name, sizeof reader_name, "%s internal frames", python_xy);
    reader_ok = 1;
#elif defined(CD_READER_TABLE)
    char why[128];
    const void *t;
    size_t n = cd_reader_live_table(&t);
    if (!t) {
        snprintf(reader_name, sizeof reader_name, "none: _PyRuntime not found");
        return reader_name;
    }
    /* The first 24 bytes (cookie, version, flag) are the same in every layout. */
    if (cd_reader_check_table(t, n ? n : 24, running, &tv, why, sizeof why) < 0) {
        snprintf(reader_name, sizeof reader_name, "none: %s", why);
        return reader_name;
    }
    reader_ok = 1;
    if (self_test(why, sizeof why)) {
        reader_ok = 0;
        snprintf(reader_name, sizeof reader_name, "none: %s", why);
        return reader_name;
    }
    snprintf(reader_name, sizeof reader_name, "_Py_DebugOffsets v%s%s", python_xy,
             tv.free_threaded ? " (free-threaded)" : "");
#else
    snprintf(reader_name, sizeof reader_name, "none: no reader for Python %s (3.10 on)",
             python_xy);
#endif
    return reader_name;
}
