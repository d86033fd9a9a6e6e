/*
 * module.c: cuda_debug._core, assembled (PEP 489): the method table, made
 * from the lists of every layer's Python face (python/py.h) and the few
 * functions bench/ and testing/ keep beside their C; the constants; init.
 * The faces only convert values; behaviour lives in the layers (csrc/README.md
 * draws them), policy and messages in Python.
 */
#include "python/py.h"           /* the faces' functions, their method rows */
#include "bench/bench_api.h"     /* cd_py_gemm, cd_py_launch_latency, cd_bench_fork... */
#include "testing/testing.h"     /* cd_py_fault_launch */

#include <errno.h>      /* errno */
#include <stdlib.h>      /* getenv, atexit */
#include <string.h>      /* strcmp */

/* --------------------------------------------------------- the methods -- */

#define CD_PY_FLAGS_NOARGS METH_NOARGS
#define CD_PY_FLAGS_O METH_O
#define CD_PY_FLAGS_VARARGS METH_VARARGS
#define CD_PY_FLAGS_KEYWORDS (METH_VARARGS | METH_KEYWORDS)
#define CD_PY_FLAGS_FASTCALL METH_FASTCALL
#define CD_PY_ROW(name, kind, doc) \
    {#name, (PyCFunction)(void (*)(void))cd_py_##name, CD_PY_FLAGS_##kind, doc},

static PyMethodDef core_methods[] = {
    CD_PY_FACES(CD_PY_ROW)
    CD_PY_BESIDE(CD_PY_ROW)
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------- the constants -- */

typedef struct {
    const char *name;
    long value;
} named_int;

/* One family a line: C(NAME) is CD_NAME, R(NAME) REPLAY_NAME (CD_NAME). */
#define C(name) {#name, CD_##name}
#define R(name) {"REPLAY_" #name, CD_##name}
static const named_int int_constants[] = {
    C(LIB_CUDA), C(LIB_CUPTI), C(LIB_CUBLAS),
    {"CUDA_HEADER_VERSION", CUDA_VERSION}, {"CUPTI_HEADER_VERSION", CUPTI_API_VERSION},
    C(SCOPE_BLOCK), C(SCOPE_OPT_OUT), C(SCOPE_WATCH),
    C(LOC_LIBRARY), C(LOC_USER), C(LOC_PSEUDO), C(LOC_COMPILED),
    C(FAULT_RING), C(FAULT_FRAMES),
    C(WATCH_RING), C(WATCH_SLOTS), {"WATCH_RECORD_BYTES", sizeof(cd_watch_record)},
    C(RING_FRAMES),
    C(WATCH_GRAPH), C(WATCH_MARKED), C(WATCH_CLOSED), C(WATCH_USER_LAST), C(WATCH_CAPTURED),
    C(GRAPH_FOUND), C(GRAPH_MATCHED), C(GRAPH_NO_MARKERS), C(GRAPH_NOT_CLOSED),
    C(GRAPH_NOT_STARTED), C(GRAPH_ALL_DONE), C(GRAPH_BROKEN), C(GRAPH_ADOPTED), C(GRAPH_NODES),
    C(ADOPT_LINE_OWN), C(ADOPT_LINE_UNSEEN), C(ADOPT_LINE_TRACED), C(ADOPT_LINE_FULL),
    C(ADOPT_LINE_NO_USER), C(ADOPT_LINE_NO_FRAMES),
    {"FRAMES_SUPPORTED", 0}, C(HANG_STEP_MIN_NS),
    C(ASSERT_NONE), C(ASSERT_GENERIC), C(ASSERT_FITS), C(ASSERT_NAMES),
    C(ORIGIN_UNKNOWN), C(ORIGIN_USER), C(ORIGIN_GENERATED), C(ORIGIN_FRAMEWORK),
    C(ORIGIN_VENDOR), C(GAP_PROFILER), C(GAP_HELD), C(EARLY_LAUNCHES),
    R(MATCH_ANY), R(MATCH_MANGLED_PREFIX), R(MATCH_SUBSTRING),
    C(REPLAY_RECORDS), C(REPLAY_RESULTS), C(REPLAY_NAME), C(REPLAY_LAUNCHES),
    R(SPACE_GLOBAL), R(SPACE_SHARED), R(SPACE_ASYNC_COPY), R(SPACE_LOCAL),
    R(ACCESS_READ), R(ACCESS_WRITE), R(ACCESS_ATOMSYS),
};
#undef C
#undef R

/* The CUPTI callbacks the C core enables (base/cupti_ids.h), the launches' first. */
#define CD_CBID_ROW(id, ptsz) {&(#id)[sizeof "CUPTI_DRIVER_TRACE_CBID_" - 1], id},
static const named_int launch_cbids[] = {CD_LAUNCH_CBIDS(CD_CBID_ROW)};
static const named_int cbids[] = {CD_LAUNCH_CBIDS(CD_CBID_ROW) CD_CAPTURE_CBIDS(CD_CBID_ROW)};
#undef CD_CBID_ROW

#define CD_STEP_ROW(name, number, what) {what, number},
static const named_int replay_steps[] = {CD_REPLAY_STEPS(CD_STEP_ROW)};
#undef CD_STEP_ROW

#define CD_STICKY_ROW(code) {NULL, code},
static const named_int sticky_codes[] = {CD_STICKY_CODES(CD_STICKY_ROW)};
#undef CD_STICKY_ROW

/* m.name = a new reference (or NULL), given to m: 0, or -1. */
static int add_object(PyObject *m, const char *name, PyObject *value)
{
    if (!value || PyModule_AddObject(m, name, value) < 0) {
        Py_XDECREF(value);
        return -1;
    }
    return 0;
}

/* (value, ...) of the rows. */
static PyObject *int_tuple(const named_int *rows, size_t n)
{
    PyObject *t = PyTuple_New((Py_ssize_t)n);
    for (size_t i = 0; t && i < n; i++) {
        PyObject *v = PyLong_FromLong(rows[i].value);
        if (!v)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, (Py_ssize_t)i, v);
    }
    return t;
}

/* {value: name} of the rows. */
static PyObject *int_dict(const named_int *rows, size_t n)
{
    PyObject *d = PyDict_New();
    for (size_t i = 0; d && i < n; i++) {
        PyObject *k = PyLong_FromLong(rows[i].value), *v = PyUnicode_FromString(rows[i].name);
        if (!k || !v || PyDict_SetItem(d, k, v) < 0)
            Py_CLEAR(d);
        Py_XDECREF(k);
        Py_XDECREF(v);
    }
    return d;
}

static int add_constants(PyObject *m)
{
    for (size_t i = 0; i < CD_N_OF(int_constants); i++) {
        long v = int_constants[i].value;
        if (!strcmp(int_constants[i].name, "FRAMES_SUPPORTED"))
            v = cd_reader_ok();
        if (PyModule_AddIntConstant(m, int_constants[i].name, v) < 0)
            return -1;
    }
    if (add_object(m, "STICKY_CODES", int_tuple(sticky_codes, CD_N_OF(sticky_codes))) < 0 ||
        add_object(m, "CALLBACK_IDS", int_dict(cbids, CD_N_OF(cbids))) < 0 ||
        add_object(m, "LAUNCH_CALLBACK_IDS", int_tuple(launch_cbids, CD_N_OF(launch_cbids))) < 0 ||
        add_object(m, "REPLAY_STEPS", int_dict(replay_steps, CD_N_OF(replay_steps))) < 0)
        return -1;
    return PyModule_AddStringConstant(m, "SANITIZER_HEADERS", CD_SANITIZER_HEADERS_TEXT);
}

/* ---------------------------------------------------------------- init -- */

/* The layers beside hooks/ (the benchmarks', the replay's) in a forked child. */
static void beside_fork(int op)
{
    cd_bench_fork(op);
    cd_replay_fork(op);
}

static int core_exec(PyObject *m)
{
    /* The frame reader, chosen once, here, from the importing thread (whose
     * frames it is checked against); CUDA_DEBUG_TEST_FRAME_READER=none: as if
     * this Python had none (tests). */
    const char *force = getenv("CUDA_DEBUG_TEST_FRAME_READER");
    const char *reader = cd_reader_init(force && !strcmp(force, "none")
                                        ? "disabled by CUDA_DEBUG_TEST_FRAME_READER=none" : NULL);
    if (PyModule_AddStringConstant(m, "FRAME_READER", reader) < 0)
        return -1;
    if (cd_py_add_scope_type(m) < 0 || add_constants(m) < 0)
        return -1;
    cd_frames_watch_code();
    /* A forked child starts clean (hooks/after_fork.c). */
    int frc = cd_fork_init(beside_fork);
    if (frc) {
        errno = frc;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    /* Frame reads stop before the finalizer frees thread states: an atexit
     * hook, registered now, runs before that (and after those registered
     * later). */
    PyObject *atexit = PyImport_ImportModule("atexit");
    PyObject *stop = atexit ? PyObject_GetAttrString(m, "frames_stop") : NULL;
    PyObject *r = stop ? PyObject_CallMethod(atexit, "register", "O", stop) : NULL;
    Py_XDECREF(atexit);
    Py_XDECREF(stop);
    if (!r)
        return -1;
    Py_DECREF(r);
    return 0;
}

static int core_traverse(PyObject *m, visitproc visit, void *arg)
{
    cd_py_state *st = PyModule_GetState(m);
    Py_VISIT(st->scope_type);
    return 0;
}

static int core_clear(PyObject *m)
{
    cd_py_state *st = PyModule_GetState(m);
    Py_CLEAR(st->scope_type);
    return 0;
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, core_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* Process-wide CUDA/CUPTI state: one interpreter only. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cuda_debug._core",
    .m_doc = "cuda_debug C core: launch hooks, watch ring, fault records, loaders, timing loops.",
    .m_size = sizeof(cd_py_state),
    .m_methods = core_methods,
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&core_module); }
