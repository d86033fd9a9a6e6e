/*
 * module.c: the one Python face of the C core: the cuda_debug._core method
 * table, the Scope handle type and module init (PEP 489), plus the thin
 * wrappers that only convert values between Python and the layers below
 * (csrc/README.md draws them). Behaviour lives in those layers; policy and
 * messages live in Python.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "hooks/hooks.h"
#include "replay/replay.h"
#include "bench/bench_api.h"
#include "testing/testing.h"

#include <structmember.h>

#include <errno.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------- conversions -- */

/* The UTF-8 texts of a list of str, as a NULL-free array of pointers into
 * the list's own objects (valid while `list` lives): PyMem_Free(*out) after. */
static int str_array(PyObject *list, const char ***out, int *n)
{
    Py_ssize_t k = PyList_GET_SIZE(list);
    *out = PyMem_Calloc((size_t)k + 1, sizeof(char *));
    if (!*out) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        if (!PyUnicode_Check(item)) {
            PyErr_Format(PyExc_TypeError, "expected a list of str, got %.100s",
                         Py_TYPE(item)->tp_name);
            PyMem_Free(*out);
            return -1;
        }
        Py_ssize_t len;
        const char *s = PyUnicode_AsUTF8AndSize(item, &len);
        if (!s || (Py_ssize_t)strlen(s) != len) {
            if (s)
                PyErr_SetString(PyExc_ValueError, "embedded NUL character");
            PyMem_Free(*out);
            return -1;
        }
        (*out)[i] = s;
    }
    *n = (int)k;
    return 0;
}

/* --------------------------------------------------------------- loader -- */

static PyObject *py_load_library(PyObject *self, PyObject *args)
{
    (void)self;
    int lib, n_sonames, n_paths;
    PyObject *sonames, *paths;
    const char **so_v, **path_v;
    if (!PyArg_ParseTuple(args, "iO!O!", &lib, &PyList_Type, &sonames, &PyList_Type, &paths))
        return NULL;
    if (lib < 0 || lib >= CD_LIB_COUNT) {
        PyErr_SetString(PyExc_ValueError, "unknown library id");
        return NULL;
    }
    if (str_array(sonames, &so_v, &n_sonames) < 0)
        return NULL;
    if (str_array(paths, &path_v, &n_paths) < 0) {
        PyMem_Free(so_v);
        return NULL;
    }
    cd_load_library((enum cd_lib)lib, so_v, n_sonames, path_v, n_paths);
    PyMem_Free(so_v);
    PyMem_Free(path_v);
    const cd_library *L = &cd_libs[lib];
    return Py_BuildValue("(Osss)", L->handle ? Py_True : Py_False, L->path, L->how, L->error);
}

static PyObject *py_driver_init(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_driver_ready();
    Py_END_ALLOW_THREADS
    if (rc == 0)
        cd_driver_log_init(cd_on_sticky_logged);
    return PyLong_FromLong(rc);
}

static PyObject *py_driver_version(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    int v = 0;
    if (!cd_libs[CD_LIB_CUDA].handle)
        Py_RETURN_NONE;
    if (CU_CHECK(cd_drv.cuDriverGetVersion(&v)))
        Py_RETURN_NONE;
    return PyLong_FromLong(v);
}

/* CUPTI may be called only once the driver initialised: CUPTI 13 called
 * without a driver (a machine with the nvidia-cuda-cupti wheel and no GPU)
 * recurses until the stack overflows. */
static int cupti_callable(void)
{
    return cd_libs[CD_LIB_CUPTI].handle && cd_driver_ready() == 0;
}

static PyObject *py_cupti_version(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    uint32_t v = 0;
    if (!cupti_callable() || CUPTI_CHECK(cd_cupti.cuptiGetVersion(&v)))
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(v);
}

/* device_info(ordinal) -> (name, total_bytes, cc_major, cc_minor, sm_count,
 * clock_khz, mem_clock_khz, l2_bytes, pci_bus) or an int CUresult. */
static PyObject *py_device_info(PyObject *self, PyObject *args)
{
    (void)self;
    int ordinal, rc;
    if (!PyArg_ParseTuple(args, "i", &ordinal))
        return NULL;
    if ((rc = cd_driver_ready()) != 0)
        return PyLong_FromLong(rc < 0 ? CUDA_ERROR_NOT_INITIALIZED : rc);
    CUdevice dev;
    char name[256] = {0};
    size_t total = 0;
    if ((rc = CU_CHECK(cd_drv.cuDeviceGet(&dev, ordinal))) ||
        (rc = CU_CHECK(cd_drv.cuDeviceGetName(name, sizeof name - 1, dev))) ||
        (rc = CU_CHECK(cd_drv.cuDeviceTotalMem(&total, dev))))
        return PyLong_FromLong(rc);
    static const CUdevice_attribute attrs[] = {
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        CU_DEVICE_ATTRIBUTE_CLOCK_RATE,
        CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE,
        CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE,
        CU_DEVICE_ATTRIBUTE_PCI_BUS_ID,
    };
    int v[7] = {0};
    for (int i = 0; i < 7; i++)
        CU_CHECK(cd_drv.cuDeviceGetAttribute(&v[i], attrs[i], dev));
    return Py_BuildValue("(sniiiiiii)", name, (Py_ssize_t)total, v[0], v[1], v[2], v[3],
                         v[4], v[5], v[6]);
}

static PyObject *py_device_count(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    int rc = cd_driver_ready(), n = 0;
    if (rc != 0)
        return Py_BuildValue("(ii)", rc < 0 ? CUDA_ERROR_NOT_INITIALIZED : rc, 0);
    rc = CU_CHECK(cd_drv.cuDeviceGetCount(&n));
    return Py_BuildValue("(ii)", rc, n);
}

/* synchronize(device) -> CUresult. device < 0: the thread's current context
 * or, when none is current, every device whose primary context is active. */
static PyObject *py_synchronize(PyObject *self, PyObject *args)
{
    (void)self;
    int device, rc;
    if (!PyArg_ParseTuple(args, "i", &device))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    if (device < 0) {
        rc = cd_sync_current_or_active();
    } else {
        rc = cd_driver_ready();
        if (rc == 0)
            rc = cd_sync_device(device);
        if (rc < 0)
            rc = CUDA_ERROR_NOT_INITIALIZED;
    }
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(rc);
}

/* error_string(code) -> the driver's cuGetErrorString text, or None. */
static PyObject *py_error_string(PyObject *self, PyObject *arg)
{
    (void)self;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    const char *s = NULL;
    if (!cd_libs[CD_LIB_CUDA].handle || cd_drv.cuGetErrorString((CUresult)code, &s) || !s)
        Py_RETURN_NONE;
    return PyUnicode_FromString(s);
}

static PyObject *py_last_call(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    if (!cd_last_call.status)
        Py_RETURN_NONE;
    return Py_BuildValue("(isssi)", cd_last_call.status, cd_last_call.lib, cd_last_call.call,
                         cd_last_call.file, cd_last_call.line);
}

/* ------------------------------------------------------------- options -- */

/* set_options(wait, capture, profile, capture_check, graph_markers[, watch_probe,
 * detach, graph_marker_every]): the debug switches, validated by Python
 * (cuda_debug/_options.py) from CUDA_DEBUG_*. */
static PyObject *py_set_options(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"wait", "capture", "profile", "capture_check", "graph_markers",
                             "watch_probe", "detach", "graph_marker_every", NULL};
    int wait = CD_WAIT_SYNC, capture = 1, profile = 0, capture_check = 1,
        graph_markers = CD_MARKERS_KERNEL, watch_probe = CD_PROBE_OFF, detach = 0, every = 8;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$ippiiipi", kwlist, &wait, &capture, &profile,
                                     &capture_check, &graph_markers, &watch_probe, &detach,
                                     &every))
        return NULL;
    if (every < 1 || every > 1024) {
        PyErr_SetString(PyExc_ValueError, "graph_marker_every must be 1 to 1024");
        return NULL;
    }
    if (watch_probe < CD_PROBE_OFF || watch_probe > CD_PROBE_FRAMES) {
        PyErr_SetString(PyExc_ValueError, "watch_probe must be 0 (off) to 3 (frames)");
        return NULL;
    }
    if (graph_markers < CD_MARKERS_OFF || graph_markers > CD_MARKERS_KERNEL) {
        PyErr_SetString(PyExc_ValueError, "graph_markers must be 0 (off), 1 (memop) or 2 (kernel)");
        return NULL;
    }
    if (wait < CD_WAIT_SYNC || wait > CD_WAIT_NONE) {
        PyErr_SetString(PyExc_ValueError, "wait must be 0 (sync), 1 (spin) or 2 (none)");
        return NULL;
    }
    pthread_mutex_lock(&cd_state.sub_lock);
    int busy = cd_state.subscriber != NULL;
    if (!busy) {
        cd_state.wait_mode = wait;
        cd_state.capture_on = capture;
        cd_state.profile = profile;
        cd_state.capture_check = capture_check;
        cd_state.graph_markers = graph_markers;
        cd_state.watch_probe = watch_probe;
        cd_state.detach = detach;
        cd_state.graph_marker_every = every;
    }
    pthread_mutex_unlock(&cd_state.sub_lock);
    if (busy) {
        PyErr_SetString(PyExc_RuntimeError, "options cannot change while a scope or watch is open");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* configure(names, restart, report, prefix, error_file, signals): texts and
 * switches Python owns, handed to the C fault path once. names: {code: (name,
 * what)}. */
static PyObject *py_configure(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"names", "restart", "report", "prefix", "error_file", "signals",
                             NULL};
    PyObject *names, *key, *value;
    const char *restart, *prefix, *error_file;
    int report, signals;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "$O!spszp", kwlist, &PyDict_Type, &names,
                                     &restart, &report, &prefix, &error_file, &signals))
        return NULL;
    Py_ssize_t pos = 0;
    while (PyDict_Next(names, &pos, &key, &value)) {
        const char *name, *what;
        int code = (int)PyLong_AsLong(key);
        if ((code == -1 && PyErr_Occurred()) || !PyArg_ParseTuple(value, "ss", &name, &what))
            return NULL;
        cd_report_name_error(code, name, what);
    }
    cd_report_configure(report, prefix, error_file, restart);
    if (signals && cd_install_signal_handlers() < 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* configure_frames(library_prefixes, user_pseudo): the folders of library
 * code and the pseudo-files of user code (the first call wins). */
static PyObject *py_configure_frames(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *libs, *pseudo;
    const char **lib_v, **pseudo_v;
    int n_libs, n_pseudo;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &libs, &PyList_Type, &pseudo))
        return NULL;
    if (str_array(libs, &lib_v, &n_libs) < 0)
        return NULL;
    if (str_array(pseudo, &pseudo_v, &n_pseudo) < 0) {
        PyMem_Free(lib_v);
        return NULL;
    }
    cd_frames_configure(lib_v, n_libs, pseudo_v, n_pseudo);
    PyMem_Free(lib_v);
    PyMem_Free(pseudo_v);
    Py_RETURN_NONE;
}

/* file_kind(filename) -> LOC_USER | LOC_LIBRARY | LOC_PSEUDO: the one
 * user-frame rule (capture/frames.c), as the C fault path applies it. */
static PyObject *py_file_kind(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "file_kind() takes a str");
        return NULL;
    }
    /* The bytes frames.c keeps of a code object's file name. */
    char file[CD_NAME_MAX];
    size_t n = cd_frames_copy_name(arg, file, sizeof file);
    return PyLong_FromLong(cd_file_kind(file, n));
}

/* _check_debug_offsets(table) -> None, or why the frame reader would refuse
 * this copy of _Py_DebugOffsets (tests feed it corrupted copies). */
static PyObject *py__check_debug_offsets(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "_check_debug_offsets() takes bytes");
        return NULL;
    }
#if PY_VERSION_HEX >= 0x030B0000
    unsigned long running = Py_Version;
#else
    unsigned long running = PY_VERSION_HEX;
#endif
    char why[160];
    if (cd_reader_check_table(PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg), running,
                              NULL, why, sizeof why) == 0)
        Py_RETURN_NONE;
    return PyUnicode_FromString(why);
}

/* _debug_offsets() -> the live _Py_DebugOffsets, as many bytes as the reader
 * reads (this version's layout), or None (before 3.13, or no layout). */
static PyObject *py__debug_offsets(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    const void *t;
    size_t n = cd_reader_live_table(&t);
    if (!t || !n)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(t, (Py_ssize_t)n);
}

/* _line_of(code, lasti) -> the line frames.c records for instruction lasti
 * (code units) of a code object (tests compare it with co_lines()). */
static PyObject *py__line_of(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *code;
    int lasti;
    if (!PyArg_ParseTuple(args, "O!i", &PyCode_Type, &code, &lasti))
        return NULL;
    return PyLong_FromLong(cd_reader_line(code, lasti));
}

/* _frame_walk() -> [(code, lasti)] of the calling thread, innermost first,
 * as the launch callback reads them (tests compare it with sys._getframe). */
static PyObject *py__frame_walk(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    PyObject *out = PyList_New(0);
    int depth = 0;
    for (void *f = cd_reader_first(); out && f && depth < 1024; f = cd_reader_next(f), depth++) {
        int lasti = 0;
        PyObject *code = cd_reader_code(f, &lasti);
        if (!code)
            continue;
        PyObject *item = Py_BuildValue("(Oi)", code, lasti);
        if (!item || PyList_Append(out, item) < 0)
            Py_CLEAR(out);
        Py_XDECREF(item);
    }
    return out;
}

/* ---------------------------------------------------------- scope handle -- */

/* A scope or watch held open; close() (or being freed unclosed, e.g. when a
 * KeyboardInterrupt lands between opening and recording it) gives it back. */
typedef struct {
    PyObject_HEAD
    int kind, all_threads, open;
    uint32_t token;
    unsigned long long fault_mark, watch_mark;
} ScopeObject;

static void scope_do_close(ScopeObject *so)
{
    if (!so->open)
        return;
    so->open = 0;
    Py_BEGIN_ALLOW_THREADS
    cd_scope_close(so->kind, so->all_threads, so->token);
    Py_END_ALLOW_THREADS
}

static PyObject *scope_close(PyObject *self, PyObject *noargs)
{
    (void)noargs;
    scope_do_close((ScopeObject *)self);
    Py_RETURN_NONE;
}

static void scope_dealloc(PyObject *self)
{
    scope_do_close((ScopeObject *)self);
    PyTypeObject *tp = Py_TYPE(self);
    tp->tp_free(self);
    Py_DECREF(tp);
}

static PyMemberDef scope_members[] = {
    {"kind", T_INT, offsetof(ScopeObject, kind), READONLY, "1 block, 2 opt-out, 3 watch"},
    {"open", T_INT, offsetof(ScopeObject, open), READONLY, "1 until closed"},
    {"fault_mark", T_ULONGLONG, offsetof(ScopeObject, fault_mark), READONLY,
     "fault_seq() when the scope opened (after its drain)"},
    {"watch_mark", T_ULONGLONG, offsetof(ScopeObject, watch_mark), READONLY,
     "watch_seq() when the scope opened"},
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef scope_methods[] = {
    {"close", scope_close, METH_NOARGS, "close the scope (idempotent)"},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot scope_slots[] = {
    {Py_tp_dealloc, scope_dealloc},
    {Py_tp_members, scope_members},
    {Py_tp_methods, scope_methods},
    {Py_tp_doc, "An open launch_blocking() scope or watch() block (cuda_debug._core)."},
    {0, NULL},
};

static PyType_Spec scope_spec = {
    .name = "cuda_debug._core.Scope",
    .basicsize = sizeof(ScopeObject),
    .flags = Py_TPFLAGS_DEFAULT,
    .slots = scope_slots,
};

typedef struct {
    PyTypeObject *scope_type;
} core_state;

/* scope_open(kind, all_threads, may_drain) -> (0, Scope) | (1, sticky CUresult
 * found by the drain) | (2, CUptiResult, holder) | (3, max depth). */
/* An interned "file:line" from bytes (0 for None or b""). */
static uint32_t intern_where(const char *w, Py_ssize_t n)
{
    return w && n > 0 ? cd_intern(w, (size_t)(n > 4095 ? 4095 : n)) : 0;
}

static PyObject *py_scope_open(PyObject *self, PyObject *args)
{
    int kind, all, may_drain;
    const char *where = NULL;
    Py_ssize_t where_len = 0;
    if (!PyArg_ParseTuple(args, "ipp|y#", &kind, &all, &may_drain, &where, &where_len))
        return NULL;
    if (kind < CD_SCOPE_BLOCK || kind > CD_SCOPE_WATCH) {
        PyErr_SetString(PyExc_ValueError, "unknown scope kind");
        return NULL;
    }
    if (kind != CD_SCOPE_OPT_OUT && !cupti_callable()) {
        PyErr_SetString(PyExc_RuntimeError, "CUPTI not loaded, or the driver not initialised");
        return NULL;
    }
    core_state *st = PyModule_GetState(self);
    ScopeObject *so = PyObject_New(ScopeObject, st->scope_type);
    if (!so)
        return NULL;
    so->open = 0;
    so->kind = kind;
    so->all_threads = all;
    char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN * 2];
    uint32_t token;
    int code, status;
    Py_BEGIN_ALLOW_THREADS
    status = cd_scope_open(kind, all, may_drain, &token, &code, holder, sizeof holder,
                           intern_where(where, where_len));
    Py_END_ALLOW_THREADS
    holder[sizeof holder - 1] = '\0';
    if (status != 0) {
        Py_DECREF(so);
        if (status == 2)
            return Py_BuildValue("(iiN)", status, code,
                                 PyUnicode_DecodeUTF8(holder, (Py_ssize_t)strlen(holder), "replace"));
        return Py_BuildValue("(ii)", status, code);
    }
    so->token = token;
    so->open = 1;
    so->fault_mark = cd_fault_seq();
    so->watch_mark = cd_watch_seq();
    return Py_BuildValue("(iNi)", 0, (PyObject *)so, code);
}

static PyObject *py_thread_state(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromLong(cd_thread_state());
}

static PyObject *py_cupti_result_string(PyObject *self, PyObject *arg)
{
    (void)self;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    const char *s = NULL;
    if (!cupti_callable() ||
        cd_cupti.cuptiGetResultString((CUptiResult)code, &s) != CUPTI_SUCCESS || !s)
        Py_RETURN_NONE;
    return PyUnicode_FromString(s);
}

/* --------------------------------------------------------------- faults -- */

static PyObject *py_fault_seq(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromUnsignedLongLong(cd_fault_seq());
}

static PyObject *ids_tuple(const uint32_t *ids, int n)
{
    PyObject *t = PyTuple_New(n < 0 ? 0 : n);
    for (int i = 0; t && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(ids[i]);
        if (!v) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, v);
    }
    return t;
}

/* faults(since) -> [record tuple], oldest first; the fields are named by
 * cuda_debug._report.RawFault (the order of cd_fault). */
static PyObject *ops_tuple(const cd_fault *f)
{
    PyObject *t = PyTuple_New(f->n_ops);
    for (int i = 0; t && i < f->n_ops; i++) {
        PyObject *s = PyUnicode_DecodeUTF8(f->ops[i], (Py_ssize_t)strlen(f->ops[i]), "replace");
        if (!s) {
            Py_CLEAR(t);
            break;
        }
        PyTuple_SET_ITEM(t, i, s);
    }
    return t;
}

static PyObject *py_faults(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long long since = PyLong_AsUnsignedLongLong(arg);
    if (since == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    cd_fault *fs = PyMem_Malloc(sizeof(cd_fault) * CD_FAULT_RING);
    if (!fs)
        return PyErr_NoMemory();
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = cd_faults_since(since, fs, CD_FAULT_RING);
    Py_END_ALLOW_THREADS
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < n; i++) {
        const cd_fault *f = &fs[i];
        PyObject *r = Py_BuildValue(
            "(KiiiiNn(III)(III)IKKil" "NdKNiNnKN" "iKl)",
            (unsigned long long)f->seq, f->code, f->at_launch, f->consequence, f->cbid,
            PyBytes_FromString(f->kernel), (Py_ssize_t)f->kernel_len, f->grid[0], f->grid[1],
            f->grid[2], f->block[0], f->block[1], f->block[2], f->shared_mem,
            (unsigned long long)f->stream, (unsigned long long)f->context, f->device,
            f->thread_id,
            PyBytes_FromStringAndSize(f->thread_name, (Py_ssize_t)strnlen(f->thread_name, 16)),
            f->wall_time, (unsigned long long)f->launch_seq,
            ids_tuple(f->frames, f->n_frames), f->frames_complete,
            PyBytes_FromStringAndSize(f->device_message, (Py_ssize_t)f->device_message_len),
            (Py_ssize_t)f->device_message_cut, (unsigned long long)f->log_end,
            ops_tuple(f), f->assert_level, (unsigned long long)f->cause_seq, f->cause_thread);
        if (!r || PyList_Append(out, r) < 0)
            Py_CLEAR(out);
        Py_XDECREF(r);
    }
    PyMem_Free(fs);
    return out;
}

static PyObject *str_or_none(uint32_t id)
{
    const char *s = cd_interned(id);
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

/* A file name as frames.c kept it, as os.fsdecode spells it (surrogateescape). */
static PyObject *filename_or_none(uint32_t id)
{
    const char *s = cd_interned(id);
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
}

/* code_kind(code) -> LOC_USER | LOC_LIBRARY | LOC_PSEUDO | LOC_COMPILED: the
 * kind the launch callback gives this code object's frames. */
static PyObject *py_code_kind(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyCode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "code_kind() takes a code object");
        return NULL;
    }
    return PyLong_FromLong(cd_code_kind(arg));
}

/* location(id) -> (filename, function, lineno, kind) or None */
static PyObject *py_location(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long id = PyLong_AsUnsignedLong(arg);
    if (id == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    cd_location loc;
    if (id > UINT32_MAX || cd_location_get((uint32_t)id, &loc) != 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(NNii)", filename_or_none(loc.file), str_or_none(loc.func), loc.lineno,
                         loc.kind);
}

/* driver_log(from, to) -> [bytes]: the driver-log lines [from, to) still kept. */
static PyObject *py_driver_log(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long from, to;
    if (!PyArg_ParseTuple(args, "KK", &from, &to))
        return NULL;
    uint64_t n = cd_driver_log_count();
    if (to > n)
        to = n;
    PyObject *out = PyList_New(0);
    char line[512];
    for (uint64_t i = from; out && i < to; i++) {
        long len = cd_driver_log_line(i, line, sizeof line);
        if (len < 0)
            continue;              /* gone: newer lines took its slot */
        PyObject *b = PyBytes_FromStringAndSize(line, len);
        if (!b || PyList_Append(out, b) < 0)
            Py_CLEAR(out);
        Py_XDECREF(b);
    }
    return out;
}

static PyObject *py_demangle(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s)
        return NULL;
    char *d = cd_demangle(s);
    if (!d)
        Py_RETURN_NONE;
    PyObject *r = PyUnicode_DecodeUTF8(d, (Py_ssize_t)strlen(d), "replace");
    free(d);
    return r;
}

static PyObject *py_short_kernel_name(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s)
        return NULL;
    char out[512];
    size_t n = cd_short_kernel_name(s, out, sizeof out);
    return PyUnicode_DecodeUTF8(out, (Py_ssize_t)n, "replace");
}

/* ---------------------------------------------------------------- watch -- */

static PyObject *py_watch_seq(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromUnsignedLongLong(cd_watch_seq());
}

/* A watch record as the tuple cuda_debug._report.WatchRecord names: (seq,
 * stream, kernel, grid, block, shared_mem, thread_id, device, frames, flags,
 * cbid, done, op, graph, origin). */
static PyObject *record_tuple(unsigned long long seq, const cd_watch_record *r, int done)
{
    return Py_BuildValue("(KKN(III)(III)Iii" "NiiNIii)", seq, (unsigned long long)r->stream,
                         PyBytes_FromString(cd_interned(r->kernel) ? cd_interned(r->kernel) : ""),
                         r->grid[0], r->grid[1], r->grid[2], r->block[0], r->block[1],
                         r->block[2], r->shared_mem, (int)r->thread_id,
                         cd_watch_context_device(r->ctx), ids_tuple(r->frames, r->n_frames),
                         (int)r->flags, (int)r->cbid, PyBool_FromLong(done == 1), r->op,
                         (int)r->graph, (int)r->origin);
}

/* watch_record(seq) -> record tuple, or None when gone. */
static PyObject *py_watch_record(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long long seq = PyLong_AsUnsignedLongLong(arg);
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    cd_watch_record r;
    if (cd_watch_get(seq, &r) != 0)
        Py_RETURN_NONE;
    return record_tuple(seq, &r, cd_watch_done(&r, seq));
}

/* graph_replay(seq) -> None (gone, or not a graph launch), or (status,
 * capture, [node]): the replay's unfinished nodes (CD_GRAPH_* status; capture
 * -1 unknown; the nodes for graph_node). Host memory only. */
static PyObject *py_graph_replay(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long long seq = PyLong_AsUnsignedLongLong(arg);
    if (seq == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    cd_watch_record r;
    if (cd_watch_get(seq, &r) != 0 || !(r.flags & CD_WATCH_GRAPH))
        Py_RETURN_NONE;
    uint32_t nodes[64];
    int status, capture;
    int n = cd_graph_unfinished(&r, nodes, 64, &status, &capture);
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i < n; i++) {
        PyObject *v = PyLong_FromUnsignedLong(nodes[i]);
        if (!v || PyList_Append(list, v) < 0)
            Py_CLEAR(list);
        Py_XDECREF(v);
    }
    return list ? Py_BuildValue("(iiN)", status, capture, list) : NULL;
}

/* graph_node(node) -> (record tuple, index in its capture, collective or None,
 * tools id, innermost frame ids) or None (the collective: an NCCL kernel's,
 * inflight.c; the tools id: the driver's id of the node, 0 unknown; the frames:
 * the capturing thread's innermost, of any kind, innermost first). */
static PyObject *py_graph_node(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long g = PyLong_AsUnsignedLong(arg);
    if (g == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    cd_watch_record r;
    uint32_t index;
    int done;
    if (g > UINT32_MAX || cd_graph_node((uint32_t)g, &r, &index, &done) != 0)
        Py_RETURN_NONE;
    char coll[96];
    size_t cl = cd_collective_name(&r, coll, sizeof coll);
    uint32_t deep[CD_NODE_FRAMES];
    int n_deep = cd_graph_node_frames((uint32_t)g, deep, CD_NODE_FRAMES);
    return Py_BuildValue("(NINKN)", record_tuple(g + 1, &r, done), index,
                         cl ? PyUnicode_DecodeUTF8(coll, (Py_ssize_t)cl, "replace")
                            : Py_NewRef(Py_None),
                         cd_graph_node_tools_id((uint32_t)g), ids_tuple(deep, n_deep));
}

/* graph_capture(c) -> (capture id, kernel nodes, multi_stream, unmarked, state,
 * every, token, (executable ids for tools)) or None. */
static PyObject *py_graph_capture(PyObject *self, PyObject *arg)
{
    (void)self;
    long c = PyLong_AsLong(arg);
    if (c == -1 && PyErr_Occurred())
        return NULL;
    cd_graph_capture_info k;
    if (c < 0 || c > INT32_MAX || cd_graph_capture((int)c, &k) != 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(KIiIiII(IIII))", (unsigned long long)k.id, k.n_nodes, k.multi_stream,
                         k.unmarked, k.state, k.every, k.token, k.exec_ids[0], k.exec_ids[1],
                         k.exec_ids[2], k.exec_ids[3]);
}

static PyObject *py_graph_stats(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    cd_graph_counters g;
    cd_graph_stats(&g);
    return Py_BuildValue(
        "{sKsKsKsKsKsisisisisKsisisisisIsIsI}", "nodes_marked",
        (unsigned long long)g.nodes_marked, "nodes_unmarked", (unsigned long long)g.nodes_unmarked,
        "nodes_recorded", (unsigned long long)g.nodes_recorded, "captures_untracked",
        (unsigned long long)g.captures_untracked, "captures_freed",
        (unsigned long long)g.captures_freed, "captures", g.captures, "chunks_used",
        g.chunks_used, "chunks", g.chunks, "contexts", cd_watch_contexts_live(),
        "graph_ids_refused", (unsigned long long)atomic_load(&cd_state.n_graph_ids_refused),
        "clear_rc", g.clear_rc, "write_rc", g.write_rc, "kernel_rc", g.kernel_rc, "adopt_rc",
        g.adopt_rc, "execs", g.execs, "execs_refused", g.execs_refused, "exec_reach",
        g.exec_reach);
}

/* graph_adopt(stream) -> token (0: not read, -1: no room): a graph captured while
 * nothing watched, at the end of its capture (the stream still capturing). */
static PyObject *py_graph_adopt(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long long s = PyLong_AsUnsignedLongLong(arg);
    if (s == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    long token;
    Py_BEGIN_ALLOW_THREADS
    token = cd_driver_ready() == 0 ? cd_graph_adopt((CUstream)(uintptr_t)s) : 0;
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(token);
}

/* graph_adopt_exec(token, exec) -> bool; graph_adopt_drop(token). */
static PyObject *py_graph_adopt_exec(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned token;
    unsigned long long exec;
    if (!PyArg_ParseTuple(args, "IK", &token, &exec))
        return NULL;
    return PyBool_FromLong(cd_graph_adopt_exec(token, (CUgraphExec)(uintptr_t)exec) == 0);
}

static PyObject *py_graph_adopt_drop(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long token = PyLong_AsUnsignedLong(arg);
    if (token == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    cd_graph_adopt_drop((uint32_t)token);
    Py_RETURN_NONE;
}

/* graph_release_exec(exec) -> bool: an executable Python saw go (its
 * torch.cuda.CUDAGraph freed or reset): its capture's hold on its markers. */
static PyObject *py_graph_release_exec(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long long exec = PyLong_AsUnsignedLongLong(arg);
    if (exec == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(cd_graph_release_exec((CUgraphExec)(uintptr_t)exec) == 0);
}

/* graph_exec_token(exec) -> the token of the capture an executable runs, 0 unknown. */
static PyObject *py_graph_exec_token(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long long exec = PyLong_AsUnsignedLongLong(arg);
    if (exec == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromUnsignedLong(cd_graph_exec_token((CUgraphExec)(uintptr_t)exec));
}

/* set_op(token): this thread's current op for watch(ops=True); 0 clears. Per
 * PyTorch op while recording ops: a thread-local store, nothing else. */
static PyObject *py_set_op(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long v = PyLong_AsUnsignedLongMask(arg);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    cd_tls_op = (uint32_t)v;
    Py_RETURN_NONE;
}

/* watch_streams(since) -> [(stream, tid, last_done, open, newest, pending,
 * after, (candidate seq, ...))]: per stream with launches after `since` not
 * known to have finished, by first candidate (capture/watch_ring.c,
 * cd_watch_scan). Host memory only. */
static PyObject *py_watch_streams(PyObject *self, PyObject *arg)
{
    (void)self;
    unsigned long long since = PyLong_AsUnsignedLongLong(arg);
    if (since == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    cd_stream_scan *t = PyMem_Calloc(CD_INFLIGHT_MAX, sizeof *t);
    if (!t)
        return PyErr_NoMemory();
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = cd_watch_scan(since, t, CD_INFLIGHT_MAX, NULL);
    Py_END_ALLOW_THREADS
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        const cd_stream_scan *e = &t[i];
        uint32_t kept = e->pending < CD_SCAN_CANDIDATES ? e->pending : CD_SCAN_CANDIDATES;
        PyObject *c = PyTuple_New(kept);
        for (uint32_t j = 0; c && j < kept; j++) {
            PyObject *v = PyLong_FromUnsignedLongLong(e->cand[j]);
            if (!v)
                Py_CLEAR(c);
            else
                PyTuple_SET_ITEM(c, j, v);
        }
        PyObject *v = c ? Py_BuildValue("(KiKKKIIN)", (unsigned long long)e->stream, (int)e->tid,
                                        (unsigned long long)e->last_done,
                                        (unsigned long long)e->open,
                                        (unsigned long long)e->newest, e->pending, e->after, c)
                        : NULL;
        if (!v) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    PyMem_Free(t);
    return out;
}

/* set_watch_markers(every): a completion marker behind every `every`-th
 * launch of a stream (1: behind each), from the next launch on. */
static PyObject *py_set_watch_markers(PyObject *self, PyObject *arg)
{
    (void)self;
    long every = PyLong_AsLong(arg);
    if (every == -1 && PyErr_Occurred())
        return NULL;
    if (every < 1 || every > 65536) {
        PyErr_SetString(PyExc_ValueError, "markers every 1 to 65536 launches");
        return NULL;
    }
    atomic_store(&cd_state.watch_every, (unsigned)every);
    Py_RETURN_NONE;
}

static PyObject *py_recent_asserts(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    char buf[16384];
    size_t n = cd_tee_recent_asserts(buf, sizeof buf);
    return PyBytes_FromStringAndSize(buf, (Py_ssize_t)n);
}

/* asserts_for(kernel) -> (bytes, level): the device-assert lines kept that
 * belong best to `kernel`, and how (ASSERT_NONE: none; ASSERT_GENERIC, _FITS,
 * _NAMES: capture/capture.h). */
static PyObject *py_asserts_for(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *k = PyUnicode_AsUTF8(arg);
    if (!k)
        return NULL;
    char buf[8192];
    int level = CD_ASSERT_NONE;
    size_t cut = 0, n = cd_tee_asserts_since(0, k, buf, sizeof buf, &cut, &level);
    return Py_BuildValue("(y#i)", buf, (Py_ssize_t)n, level);
}

/* assert_level(text, kernel) -> level: how the device-assert lines of `text`
 * belong to `kernel` (mangled or plain), the best CD_ASSERT_* of them: the
 * rule the C fault path applies (capture/stderr_tee.c). */
static PyObject *py_assert_level(PyObject *self, PyObject *args)
{
    (void)self;
    const char *text, *kernel;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y#s", &text, &n, &kernel))
        return NULL;
    return PyLong_FromLong(cd_tee_text_level(text, (size_t)n, kernel, NULL));
}

/* assert_affinity(text, kernel) -> how many of the assert lines' file and
 * message words the kernel's name holds (capture/stderr_tee.c). */
static PyObject *py_assert_affinity(PyObject *self, PyObject *args)
{
    (void)self;
    const char *text, *kernel;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y#s", &text, &n, &kernel))
        return NULL;
    return PyLong_FromLong(cd_tee_text_affinity(text, (size_t)n, kernel));
}

/* assert_function(text) -> the function the first assert line names, or None
 * (none, a lambda's operator(), Triton's unknown). */
static PyObject *py_assert_function(PyObject *self, PyObject *arg)
{
    (void)self;
    char *text;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &text, &n) != 0)
        return NULL;
    char out[256];
    size_t k = cd_tee_text_function(text, (size_t)n, out, sizeof out);
    if (!k)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(out, (Py_ssize_t)k, "replace");
}

/* kernel_origin(name) -> ORIGIN_*, by the kernel's name (base/demangle.c). */
static PyObject *py_kernel_origin(PyObject *self, PyObject *arg)
{
    (void)self;
    char *name;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &name, &n) != 0)
        return NULL;
    return PyLong_FromLong(cd_kernel_origin_of_name(name));
}

static PyObject *py_report_watch_culprit(PyObject *self, PyObject *args)
{
    (void)self;
    int code;
    const char *where;
    if (!PyArg_ParseTuple(args, "is", &code, &where))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    cd_report_watch_culprit(code, where, 0);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- hangs -- */

/* in_flight() -> ([(seq, stream, kernel, short, collective, thread_id, device,
 * frames, flags, age_ns, queued, last_seq, cbid, candidates, open_seq, graph)],
 * (newest_age_ns, scanned)): every stream's oldest unfinished launch, oldest first (host
 * memory only); graph: None, or for a graph replay (status, capture, [node]),
 * the nodes of its graph still running (graph_replay's). */
static PyObject *py_in_flight(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    cd_inflight *t = PyMem_Calloc(CD_INFLIGHT_MAX, sizeof *t);
    cd_stream_scan *scan = PyMem_Calloc(CD_INFLIGHT_MAX, sizeof *scan);
    if (!t || !scan) {
        PyMem_Free(t);
        PyMem_Free(scan);
        return PyErr_NoMemory();
    }
    cd_inflight_summary sum;
    int n;
    Py_BEGIN_ALLOW_THREADS
    n = cd_watch_inflight(t, CD_INFLIGHT_MAX, &sum, scan);
    Py_END_ALLOW_THREADS
    PyMem_Free(scan);
    PyObject *out = PyList_New(n);
    for (int i = 0; out && i < n; i++) {
        const cd_watch_record *r = &t[i].rec;
        char coll[96];
        size_t cl = cd_collective_name(r, coll, sizeof coll);
        const char *k = cd_interned(r->kernel), *ks = cd_interned(r->kernel_short);
        PyObject *graph = Py_NewRef(Py_None);
        if (r->flags & CD_WATCH_GRAPH) {
            uint32_t nodes[64];
            int status, capture;
            int m = cd_graph_unfinished(r, nodes, 64, &status, &capture);
            PyObject *list = PyList_New(0);
            for (int j = 0; list && j < m; j++) {
                PyObject *g = PyLong_FromUnsignedLong(nodes[j]);
                if (!g || PyList_Append(list, g) < 0)
                    Py_CLEAR(list);
                Py_XDECREF(g);
            }
            Py_DECREF(graph);
            graph = list ? Py_BuildValue("(iiN)", status, capture, list) : NULL;
            if (!graph) {
                Py_CLEAR(out);
                break;
            }
        }
        PyObject *v = Py_BuildValue(
            "(KKy" "sNiiNiKIKiIKN)", (unsigned long long)r->seq, (unsigned long long)r->stream,
            k ? k : "", ks ? ks : "",
            cl ? PyUnicode_DecodeUTF8(coll, (Py_ssize_t)cl, "replace") : Py_NewRef(Py_None),
            (int)r->thread_id, cd_watch_context_device(r->ctx), ids_tuple(r->frames, r->n_frames),
            (int)r->flags, (unsigned long long)(sum.now_ns > r->t_ns ? sum.now_ns - r->t_ns : 0),
            (unsigned)t[i].queued, (unsigned long long)t[i].last_seq, (int)r->cbid,
            (unsigned)t[i].candidates, (unsigned long long)t[i].open_seq, graph);
        if (!v) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, i, v);
    }
    PyMem_Free(t);
    if (!out)
        return NULL;
    unsigned long long newest_age =
        sum.scanned && sum.now_ns > sum.newest_ns ? sum.now_ns - sum.newest_ns : 0;
    return Py_BuildValue("(N(KI))", out, newest_age, sum.scanned);
}

/* set_hang_after(seconds): the hang watcher's threshold (0: off); the first
 * nonzero one starts its thread. */
static PyObject *py_set_hang_after(PyObject *self, PyObject *arg)
{
    (void)self;
    double s = PyFloat_AsDouble(arg);
    if (s == -1.0 && PyErr_Occurred())
        return NULL;
    uint64_t ns = s >= 0 && s < 1e9 ? (uint64_t)(s * 1e9) : 0;
    if (!(s >= 0 && s < 1e9) || (s > 0 && ns == 0)) {     /* never 0 (off) by rounding */
        PyErr_SetString(PyExc_ValueError, "hang_after must be 0 (off) or a positive number of seconds");
        return NULL;
    }
    int rc = cd_hang_watch_set(ns);
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* hang_state() -> (hang_after_ns, reports written, dump signal installed). */
static PyObject *py_hang_state(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return Py_BuildValue("(KKi)", (unsigned long long)cd_hang_watch_get(),
                         (unsigned long long)cd_hang_reports(), cd_dump_signal());
}

/* install_dump_signal(signum, python_has_it, python_has_sigint): the
 * in-flight report on that signal, chained to the handler there now (again
 * when Python's signal.signal() replaced ours). */
static PyObject *py_install_dump_signal(PyObject *self, PyObject *args)
{
    (void)self;
    int sig, mine, sigint;
    if (!PyArg_ParseTuple(args, "ipp", &sig, &mine, &sigint))
        return NULL;
    if (cd_install_dump_signal(sig, mine, sigint) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* dump_listen(rank, world_size): start the dump listener (once per process;
 * rank -1 / world_size 0 unknown); OSError when it cannot listen. */
static PyObject *py_dump_listen(PyObject *self, PyObject *args)
{
    (void)self;
    int rank, world;
    if (!PyArg_ParseTuple(args, "ii", &rank, &world))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_dump_server_start(rank, world);
    Py_END_ALLOW_THREADS
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

/* dump_listener() -> (state, name): 1 listening, 0 not started, -errno; the
 * abstract socket name of `pid` (bytes, without the leading NUL). */
static PyObject *py_dump_listener(PyObject *self, PyObject *arg)
{
    (void)self;
    long pid = PyLong_AsLong(arg);
    if (pid == -1 && PyErr_Occurred())
        return NULL;
    if (pid <= 0 || pid > INT_MAX) {
        PyErr_SetString(PyExc_ValueError, "a pid is a positive int");
        return NULL;
    }
    char name[108];
    int k = cd_dump_server_name((int)pid, name, sizeof name);
    return Py_BuildValue("(iy#)", cd_dump_server_state(), name, (Py_ssize_t)k);
}

/* dump_document(recent) -> bytes: the in-flight document (JSON) the dump
 * listener sends, with the last `recent` launches; built without the GIL. */
static PyObject *py_dump_document(PyObject *self, PyObject *arg)
{
    (void)self;
    long recent = PyLong_AsLong(arg);
    if (recent == -1 && PyErr_Occurred())
        return NULL;
    if (recent < 0 || recent > CD_WATCH_RING)
        recent = recent < 0 ? 0 : CD_WATCH_RING;
    cd_buf b = {0};
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_dump_document(&b, (int)recent);
    Py_END_ALLOW_THREADS
    if (rc != 0) {
        cd_buf_free(&b);
        return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize(b.p ? b.p : "", (Py_ssize_t)b.n);
    cd_buf_free(&b);
    return out;
}

/* dump_set_extra(bytes): the flight recorder's last collectives (JSON made by
 * json.dumps) that every dump document carries from now on. */
static PyObject *py_dump_set_extra(PyObject *self, PyObject *arg)
{
    (void)self;
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &p, &n) != 0)
        return NULL;
    if (n > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "dump_set_extra: at most 1 MiB");
        return NULL;
    }
    if (cd_report_set_extra(p, (size_t)n) != 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* --------------------------------------------------------------- stats -- */

static PyObject *py_stats(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
#define U(x) (unsigned long long)atomic_load(&cd_state.x)
    PyObject *d = Py_BuildValue(
        "{sKsKsKsKsisisisKsKsKsKsKsKsKsKsKsisisisnsisKsisKsKsIsKsK}", "synced", U(n_synced), "follower",
        U(n_follower), "skipped_capture", U(n_skipped_capture), "subscribes", U(n_subscribes),
        "active", atomic_load(&cd_state.active), "watching", atomic_load(&cd_state.watching),
        "all_threads", atomic_load(&cd_state.all_threads), "ns_capture_check",
        U(ns_capture_check), "ns_wait", U(ns_wait), "ns_callback", U(ns_callback), "refused",
        U(n_refused), "watched", U(n_watched), "unmarked", U(n_unmarked),
        "capture_ids_refused", U(n_capture_ids_refused), "ns_watch", U(ns_watch), "ns_marker", U(ns_marker),
        "watch_alloc_rc", atomic_load(&cd_state.watch_alloc_rc), "watch_write_rc",
        atomic_load(&cd_state.watch_write_rc), "subscribed",
        cd_state.subscriber != NULL, "interned_bytes", (Py_ssize_t)cd_intern_used(),
        "stderr_tee", cd_tee_installed(), "hand_overs", U(n_hand_overs), "code_watcher",
        cd_frames_code_watched(), "marked", U(n_marked), "closed", U(n_closed),
        "watch_every", (unsigned)atomic_load(&cd_state.watch_every), "wait_ids_refused",
        U(n_wait_ids_refused), "detaches", U(n_detaches));
    if (d) {
        PyObject *more = Py_BuildValue("{sKsKsisi}", "hand_overs_busy", U(n_hand_overs_busy),
                                       "take_backs", U(n_take_backs), "in_callback",
                                       atomic_load(&cd_state.in_callback), "coverage_gap_open",
                                       cd_coverage_gap_is_open());
        if (!more || PyDict_Update(d, more) < 0) {
            Py_XDECREF(more);
            Py_DECREF(d);
            return NULL;
        }
        Py_DECREF(more);
    }
    if (!d)
        return NULL;
    cd_hook_stats h;
    cd_runtime_hooks_stats(&h);
    static const char *const why[] = {"never on", "CUDA_DEBUG_LAUNCH_HOOKS=0", "no CUPTI",
                                      "driver too old", "a library imports the route",
                                      "no library imports __cudaLaunchKernel"};
    PyObject *v = Py_BuildValue("{sisisisKsKsKsKsssK}", "on", h.on, "recording", h.recording,
                                "entries", h.entries, "routed",
                                (unsigned long long)h.routed, "recorded",
                                (unsigned long long)h.recorded, "handed_back",
                                (unsigned long long)h.handed_back, "asked",
                                (unsigned long long)h.asked, "why_off",
                                h.on ? "" : why[h.why_off >= 0 && h.why_off < 6 ? h.why_off : 0],
                                "other_runtimes", U(n_hook_other_runtimes));
    if (!v || PyDict_SetItemString(d, "launch_hooks", v) < 0) {
        Py_XDECREF(v);
        Py_DECREF(d);
        return NULL;
    }
    Py_DECREF(v);
    return d;
#undef U
}

static PyObject *py_cupti_hand_over(PyObject *self, PyObject *args)
{
    (void)self;
    const char *where = NULL;
    Py_ssize_t n = 0;
    if (!PyArg_ParseTuple(args, "|y#", &where, &n))
        return NULL;
    uint32_t w = intern_where(where, n);
    int had;
    Py_BEGIN_ALLOW_THREADS
    had = cd_scopes_hand_over(w);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(had);
}

/* cupti_take_back(where) -> (1 taken back | 0 nothing to take | -CUptiResult, holder). */
static PyObject *py_cupti_take_back(PyObject *self, PyObject *args)
{
    (void)self;
    const char *where = NULL;
    Py_ssize_t n = 0;
    if (!PyArg_ParseTuple(args, "|y#", &where, &n))
        return NULL;
    if (!cupti_callable())
        return Py_BuildValue("(is)", 0, "");
    uint32_t w = intern_where(where, n);
    char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN * 2];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_scopes_take_back(w, holder, sizeof holder);
    Py_END_ALLOW_THREADS
    holder[sizeof holder - 1] = '\0';
    return Py_BuildValue("(iN)", rc, PyUnicode_DecodeUTF8(holder, (Py_ssize_t)strlen(holder),
                                                          "replace"));
}

static PyObject *py_set_launch_hooks(PyObject *self, PyObject *arg)
{
    (void)self;
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    cd_runtime_hooks_want(on);
    Py_RETURN_NONE;
}

static PyObject *where_str(uint32_t id)
{
    const char *w = cd_interned(id);
    if (!w)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(w, (Py_ssize_t)strlen(w), "surrogateescape");
}

/* coverage_gaps() -> [(number, why, from_seq, to_seq, from_where, to_where,
 * hooks_recording, closed)], oldest first. */
static PyObject *py_coverage_gaps(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    cd_gap g[CD_GAPS];
    int n = cd_coverage_gaps(g, CD_GAPS, NULL);
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < n; i++) {
        PyObject *t = Py_BuildValue("(IiKKNNii)", g[i].number, (int)g[i].why,
                                    (unsigned long long)g[i].from_seq,
                                    (unsigned long long)g[i].to_seq, where_str(g[i].from_where),
                                    where_str(g[i].to_where), (int)g[i].hooks_recording,
                                    (int)g[i].closed);
        if (!t || PyList_Append(out, t) < 0)
            Py_CLEAR(out);
        Py_XDECREF(t);
    }
    return out;
}

/* frames_stop(): the atexit hook registered at import (before the interpreter
 * frees thread states, frame reads stop). */
static PyObject *py_frames_stop(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    Py_BEGIN_ALLOW_THREADS
    cd_frames_stop();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* stderr_references(path) -> how many of the loaded library's relocations
 * bind libc's `stderr` (where the tee can be put), -1 when it is not loaded. */
static PyObject *py_stderr_references(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *b;
    if (!PyUnicode_FSConverter(arg, &b))
        return NULL;
    void *h = dlopen(PyBytes_AS_STRING(b), RTLD_LAZY | RTLD_NOLOAD);
    Py_DECREF(b);
    int n = cd_tee_stderr_references(h);
    if (h)
        dlclose(h);
    return PyLong_FromLong(n);
}

/* _test_report_pause(seconds): tests: the watch block written from a call
 * pauses that long after claiming the report, before writing it. */
static PyObject *py__test_report_pause(PyObject *self, PyObject *arg)
{
    (void)self;
    double s = PyFloat_AsDouble(arg);
    if (s == -1.0 && PyErr_Occurred())
        return NULL;
    cd_report_test_pause(s > 0 ? (uint64_t)(s * 1e9) : 0);
    Py_RETURN_NONE;
}

/* _test_fork_hold(hold): tests: a thread of ours takes every lock a forked
 * child's handler resets and holds them (True) until given back (False). */
static PyObject *py__test_fork_hold(PyObject *self, PyObject *arg)
{
    (void)self;
    int hold = PyObject_IsTrue(arg);
    if (hold < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_fork_test_hold(hold);
    Py_END_ALLOW_THREADS
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *py_install_tee(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromLong(cd_tee_install());
}

/* --------------------------------------------------------------- replay -- */

/* The Python callable that gives an instrumented launch its valid ranges
 * (cuda_debug._replay: PyTorch's live blocks). Process-wide, like the one
 * Sanitizer subscription it serves: set once, before the program starts, and
 * kept (a strong reference) for the life of the process. */
static PyObject *replay_ranges_callable;

#if PY_VERSION_HEX >= 0x030D0000
#define CD_FINALIZING() Py_IsFinalizing()
#else
#define CD_FINALIZING() _Py_IsFinalizing()
#endif

/* Called by replay/ on the launching thread, inside the Sanitizer's launch
 * callback, for an instrumented launch only: takes the GIL (the frameworks
 * released it around the launch) and asks Python. 0 with *out (malloc'd
 * ranges) filled; -1: use the allocation table. */
static int replay_ranges_hook(const cd_replay_launch *l, cd_replay_range **out, size_t *n)
{
    if (!replay_ranges_callable || !Py_IsInitialized() || CD_FINALIZING())
        return -1;
    PyGILState_STATE g = PyGILState_Ensure();
    int rc = -1;
    PyObject *res = PyObject_CallFunction(
        replay_ranges_callable, "(Ky(III)(III)KKi)", (unsigned long long)l->launch, l->kernel,
        l->grid[0], l->grid[1], l->grid[2], l->block[0], l->block[1], l->block[2],
        (unsigned long long)l->context, (unsigned long long)l->stream, l->device);
    if (!res) {
        PyErr_WriteUnraisable(replay_ranges_callable);
    } else if (PyBytes_Check(res)) {
        size_t k = (size_t)PyBytes_GET_SIZE(res) / sizeof(cd_replay_range);
        *out = malloc((k ? k : 1) * sizeof **out);
        if (*out) {
            memcpy(*out, PyBytes_AS_STRING(res), k * sizeof **out);
            *n = k;
            rc = 0;
        }
    }
    Py_XDECREF(res);
    PyGILState_Release(g);
    return rc;
}

static PyObject *py_replay_load(PyObject *self, PyObject *arg)
{
    (void)self;
    PyObject *b;
    if (!PyUnicode_FSConverter(arg, &b))
        return NULL;
    char error[1024] = "";
    int rc = cd_replay_load(PyBytes_AS_STRING(b), error, sizeof error);
    Py_DECREF(b);
    return Py_BuildValue("(Os)", rc == 0 ? Py_True : Py_False, error);
}

static PyObject *py_replay_subscribe(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"launch", "start", "kernel", "match", "max_launches", "exit_warp",
                             "fail_launches", "while_watching", "check_shared", "ranges",
                             "driver_always", "launches", NULL};
    cd_replay_target t;
    memset(&t, 0, sizeof t);
    unsigned long long launch = 0, start = 0;
    const char *kernel = "";
    PyObject *ranges = Py_None, *set = Py_None;
    t.max_launches = 1;
    t.exit_warp = t.fail_launches = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|KKsiiiiiiOiO", kwlist, &launch, &start,
                                     &kernel, &t.match, &t.max_launches, &t.exit_warp,
                                     &t.fail_launches, &t.while_watching, &t.check_shared,
                                     &ranges, &t.driver_always, &set))
        return NULL;
    if (set != Py_None) {
        PyObject *seq = PySequence_Fast(set, "launches must be a sequence of launch numbers");
        if (!seq)
            return NULL;
        Py_ssize_t k = PySequence_Fast_GET_SIZE(seq);
        if (k > CD_REPLAY_LAUNCHES) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_ValueError, "at most %d launches", CD_REPLAY_LAUNCHES);
        }
        for (Py_ssize_t i = 0; i < k; i++) {
            unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
            if (v == (unsigned long long)-1 && PyErr_Occurred()) {
                Py_DECREF(seq);
                return NULL;
            }
            t.set[t.n_set++] = v;
        }
        Py_DECREF(seq);
    }
    if (strlen(kernel) >= sizeof t.kernel) {
        PyErr_Format(PyExc_ValueError, "kernel name longer than %d bytes", CD_REPLAY_NAME - 1);
        return NULL;
    }
    if (ranges != Py_None && !PyCallable_Check(ranges)) {
        PyErr_SetString(PyExc_TypeError, "ranges must be callable or None");
        return NULL;
    }
    t.launch = launch;
    t.from = start;
    snprintf(t.kernel, sizeof t.kernel, "%s", kernel);
    if (ranges != Py_None) {
        Py_XSETREF(replay_ranges_callable, Py_NewRef(ranges));
    }
    int rc = cd_replay_subscribe(&t, ranges != Py_None ? replay_ranges_hook : NULL);
    return PyLong_FromLong(rc);
}

static PyObject *py_replay_unsubscribe(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromLong(cd_replay_unsubscribe());
}

static PyObject *py_replay_result_string(PyObject *self, PyObject *arg)
{
    (void)self;
    long rc = PyLong_AsLong(arg);
    if (rc == -1 && PyErr_Occurred())
        return NULL;
    const char *s = cd_replay_result_string((int)rc);
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

static PyObject *py_replay_status(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    cd_replay_status st;
    cd_replay_get_status(&st);
    return Py_BuildValue("(KKiiKKKniiK)", (unsigned long long)st.launches,
                         (unsigned long long)st.launches_seen, st.n_results, st.violated,
                         (unsigned long long)st.failed_launches, (unsigned long long)st.n_allocs,
                         (unsigned long long)st.n_frees, (Py_ssize_t)st.live_allocs,
                         st.patches_contexts, st.driver_rc,
                         (unsigned long long)st.first_instrumented);
}

static PyObject *py_replay_watching(PyObject *self, PyObject *arg)
{
    (void)self;
    long d = PyLong_AsLong(arg);
    if (d == -1 && PyErr_Occurred())
        return NULL;
    cd_replay_watching((int)d);
    Py_RETURN_NONE;
}

static PyObject *py_replay_at(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    cd_replay_at at;
    cd_replay_get_at(&at);
    if (!at.seen)
        Py_RETURN_NONE;
    return Py_BuildValue("(Ky(III)(III))", (unsigned long long)at.launch, at.kernel, at.grid[0],
                         at.grid[1], at.grid[2], at.block[0], at.block[1], at.block[2]);
}

static PyObject *replay_launch_tuple(const cd_replay_launch *r)
{
    PyObject *recs = PyList_New(0);
    for (int i = 0; recs && i < r->n_records; i++) {
        const cd_replay_access *a = &r->records[i];
        PyObject *t = Py_BuildValue("(KKIIII(III)(III))", (unsigned long long)a->address,
                                    (unsigned long long)a->pc, a->size, a->flags, a->space,
                                    a->order, a->thread[0], a->thread[1], a->thread[2],
                                    a->block[0], a->block[1], a->block[2]);
        if (!t || PyList_Append(recs, t) < 0)
            Py_CLEAR(recs);
        Py_XDECREF(t);
    }
    if (!recs)
        return NULL;
    return Py_BuildValue("(Ky(III)(III)KKiKKiiIKKNddd)", (unsigned long long)r->launch, r->kernel,
                         r->grid[0], r->grid[1], r->grid[2], r->block[0], r->block[1],
                         r->block[2], (unsigned long long)r->context,
                         (unsigned long long)r->stream, r->device,
                         (unsigned long long)r->function_pc, (unsigned long long)r->function_size,
                         r->failed_step, r->rc, r->n_ranges, r->n_bad, r->n_checked, recs,
                         r->seconds_prepare, r->seconds_ranges, r->seconds_wait);
}

static PyObject *py_replay_results(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    PyObject *out = PyList_New(0);
    cd_replay_launch *r = PyMem_Malloc(sizeof *r);
    if (!r) {
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    cd_replay_status st;
    cd_replay_get_status(&st);
    int first = st.n_results > CD_REPLAY_RESULTS ? st.n_results - CD_REPLAY_RESULTS : 0;
    for (int i = first; out && cd_replay_launch_result(i, r) == 0; i++) {
        PyObject *t = replay_launch_tuple(r);
        if (!t || PyList_Append(out, t) < 0)
            Py_CLEAR(out);
        Py_XDECREF(t);
    }
    PyMem_Free(r);
    return out;
}

static PyObject *py_replay_allocations(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    size_t cap = cd_replay_allocation_count() + 64;
    uint64_t *buf = PyMem_Malloc(cap * 4 * sizeof(uint64_t));
    if (!buf)
        return PyErr_NoMemory();
    size_t n = cd_replay_allocations(buf, cap);
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; out && i < n; i++) {
        PyObject *t = Py_BuildValue("(KKKK)", (unsigned long long)buf[4 * i],
                                    (unsigned long long)buf[4 * i + 1],
                                    (unsigned long long)buf[4 * i + 2],
                                    (unsigned long long)buf[4 * i + 3]);
        if (!t) {
            Py_CLEAR(out);
            break;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    PyMem_Free(buf);
    return out;
}

static int add_replay_constants(PyObject *m)
{
    PyObject *steps = PyDict_New();
    if (!steps)
        return -1;
#define CD_STEP_ITEM(name, number, what)                                        \
    {                                                                           \
        PyObject *k = PyLong_FromLong(number), *v = PyUnicode_FromString(what); \
        int bad = !k || !v || PyDict_SetItem(steps, k, v) < 0;                  \
        Py_XDECREF(k);                                                          \
        Py_XDECREF(v);                                                          \
        if (bad) {                                                              \
            Py_DECREF(steps);                                                   \
            return -1;                                                          \
        }                                                                       \
    }
    CD_REPLAY_STEPS(CD_STEP_ITEM)
#undef CD_STEP_ITEM
    if (PyModule_AddObject(m, "REPLAY_STEPS", steps) < 0) {
        Py_DECREF(steps);
        return -1;
    }
    static const struct {
        const char *name;
        long value;
    } ints[] = {
        {"REPLAY_MATCH_ANY", CD_MATCH_ANY}, {"REPLAY_MATCH_MANGLED_PREFIX", CD_MATCH_MANGLED_PREFIX},
        {"REPLAY_MATCH_SUBSTRING", CD_MATCH_SUBSTRING}, {"REPLAY_RECORDS", CD_REPLAY_RECORDS},
        {"REPLAY_RESULTS", CD_REPLAY_RESULTS}, {"REPLAY_NAME", CD_REPLAY_NAME},
        {"REPLAY_LAUNCHES", CD_REPLAY_LAUNCHES},
        {"REPLAY_SPACE_GLOBAL", CD_SPACE_GLOBAL}, {"REPLAY_SPACE_SHARED", CD_SPACE_SHARED},
        {"REPLAY_SPACE_ASYNC_COPY", CD_SPACE_ASYNC_COPY}, {"REPLAY_SPACE_LOCAL", CD_SPACE_LOCAL},
        {"REPLAY_ACCESS_READ", CD_ACCESS_READ}, {"REPLAY_ACCESS_WRITE", CD_ACCESS_WRITE},
        {"REPLAY_ACCESS_ATOMSYS", CD_ACCESS_ATOMSYS},
    };
    for (size_t i = 0; i < CD_N_OF(ints); i++)
        if (PyModule_AddIntConstant(m, ints[i].name, ints[i].value) < 0)
            return -1;
    return PyModule_AddStringConstant(m, "SANITIZER_HEADERS", CD_SANITIZER_HEADERS_TEXT);
}

/* ----------------------------------------------------------------- init -- */

#define METH(name, flags, doc) {#name, (PyCFunction)(void (*)(void))py_##name, flags, doc}
static PyMethodDef core_methods[] = {
    METH(load_library, METH_VARARGS, "load_library(lib, sonames, paths) -> (loaded, path, how, error)"),
    METH(driver_init, METH_NOARGS, "cuInit(0) once -> CUresult"),
    METH(driver_version, METH_NOARGS, "cuDriverGetVersion or None"),
    METH(cupti_version, METH_NOARGS, "cuptiGetVersion or None"),
    METH(device_count, METH_NOARGS, "-> (CUresult, count)"),
    METH(device_info, METH_VARARGS, "device_info(ordinal) -> tuple or CUresult"),
    METH(synchronize, METH_VARARGS, "synchronize(device) -> CUresult"),
    METH(error_string, METH_O, "cuGetErrorString text or None"),
    METH(last_call, METH_NOARGS, "this thread's last failed CUDA call, or None"),
    METH(set_options, METH_VARARGS | METH_KEYWORDS, "the CUDA_DEBUG_* switches"),
    METH(configure, METH_VARARGS | METH_KEYWORDS, "texts and switches for the C fault path"),
    METH(configure_frames, METH_VARARGS, "configure_frames(library_prefixes, user_pseudo)"),
    METH(file_kind, METH_O, "file_kind(filename) -> LOC_USER | LOC_LIBRARY | LOC_PSEUDO"),
    METH(code_kind, METH_O, "code_kind(code) -> LOC_USER | LOC_LIBRARY | LOC_PSEUDO | "
                            "LOC_COMPILED"),
    METH(_check_debug_offsets, METH_O, "tests: why a _Py_DebugOffsets copy is refused, or None"),
    METH(_debug_offsets, METH_NOARGS, "tests: the live _Py_DebugOffsets bytes the reader reads"),
    METH(_line_of, METH_VARARGS, "tests: _line_of(code, lasti) -> line, from the line table"),
    METH(_frame_walk, METH_NOARGS, "tests: [(code, lasti)] of this thread, through the reader"),
    METH(scope_open, METH_VARARGS, "scope_open(kind, all_threads) -> (status, Scope | code[, holder])"),
    METH(thread_state, METH_NOARGS, "this thread's scope state: +1 block, -1 opted out, 0"),
    METH(cupti_result_string, METH_O, "CUPTI result text"),
    METH(fault_seq, METH_NOARGS, "number of faults recorded"),
    METH(faults, METH_O, "faults(since) -> [raw fault record]"),
    METH(location, METH_O, "location(id) -> (filename, function, lineno, kind) or None"),
    METH(driver_log, METH_VARARGS, "driver_log(from, to) -> [bytes]"),
    METH(demangle, METH_O, "demangle a C++ symbol, or None"),
    METH(short_kernel_name, METH_O, "the short readable name of a kernel"),
    METH(watch_seq, METH_NOARGS, "launches put in the watch ring so far"),
    METH(watch_record, METH_O, "watch_record(seq) -> record tuple or None"),
    METH(watch_streams, METH_O, "watch_streams(since) -> [per-stream scan]: launches not known finished"),
    METH(set_watch_markers, METH_O, "set_watch_markers(every): a marker behind every every-th launch of a stream"),
    METH(graph_replay, METH_O, "graph_replay(seq) -> (status, capture, [node]) or None"),
    METH(graph_node, METH_O, "graph_node(node) -> (record tuple, index, collective) or None"),
    METH(graph_capture, METH_O, "graph_capture(c) -> (id, nodes, multi_stream, unmarked, state)"),
    METH(graph_stats, METH_NOARGS, "graph-marker and context-table counters"),
    METH(graph_adopt, METH_O, "graph_adopt(stream) -> token: a graph captured before watching"),
    METH(graph_adopt_exec, METH_VARARGS, "graph_adopt_exec(token, exec) -> bool"),
    METH(graph_adopt_drop, METH_O, "graph_adopt_drop(token): an adopted capture no executable holds"),
    METH(graph_release_exec, METH_O, "graph_release_exec(exec) -> bool: an executable is gone"),
    METH(graph_exec_token, METH_O, "graph_exec_token(exec) -> the token of its capture, 0 unknown"),
    METH(recent_asserts, METH_NOARGS, "the latest device-assert lines written to stderr"),
    METH(assert_level, METH_VARARGS, "assert_level(text, kernel) -> how the assert lines belong to it"),
    METH(asserts_for, METH_O, "asserts_for(kernel) -> (the assert lines kept that belong best "
                              "to it, ASSERT_* level)"),
    METH(report_watch_culprit, METH_VARARGS, "write the watch culprit block to fd 2 (once)"),
    METH(stats, METH_NOARGS, "launch-hook counters"),
    METH(set_op, METH_O, "set_op(token): this thread's current op for watch(ops=True)"),
    METH(cupti_hand_over, METH_VARARGS, "cupti_hand_over([where]): give CUPTI up to a starting "
                                        "profiler -> was it held"),
    METH(cupti_take_back, METH_VARARGS, "cupti_take_back([where]) -> (1 taken | 0 not needed | "
                                        "-CUptiResult, holder): CUPTI back after a profiler"),
    METH(set_launch_hooks, METH_O, "set_launch_hooks(on): CUDA_DEBUG_LAUNCH_HOOKS as Python reads it"),
    METH(coverage_gaps, METH_NOARGS, "coverage_gaps() -> [(number, why, from_seq, to_seq, "
                                     "from_where, to_where, hooks_recording, closed)]"),
    METH(assert_affinity, METH_VARARGS, "assert_affinity(text, kernel) -> file/message words the "
                                        "kernel's name holds"),
    METH(assert_function, METH_O, "assert_function(text) -> the function an assert line names, or None"),
    METH(kernel_origin, METH_O, "kernel_origin(name) -> ORIGIN_* by the kernel's name"),
    METH(install_tee, METH_NOARGS, "install the pass-through stderr (once) -> 0 ok"),
    METH(in_flight, METH_NOARGS, "every stream's oldest unfinished launch -> ([record], (newest_age_ns, scanned))"),
    METH(set_hang_after, METH_O, "set_hang_after(seconds): the hang watcher's threshold, 0 off"),
    METH(hang_state, METH_NOARGS, "-> (hang_after_ns, reports, dump signal)"),
    METH(dump_listen, METH_VARARGS, "dump_listen(rank, world_size): answer `cuda-debug dump PID`"),
    METH(dump_listener, METH_O, "dump_listener(pid) -> (state, abstract socket name)"),
    METH(dump_set_extra, METH_O, "dump_set_extra(json bytes): the flight recorder, in every dump"),
    METH(dump_document, METH_O, "dump_document(recent) -> the in-flight document (JSON bytes)"),
    METH(install_dump_signal, METH_VARARGS,
         "install_dump_signal(signum, python_has_it, python_has_sigint): the in-flight report on a signal"),
    METH(stderr_references, METH_O, "stderr_references(path) -> libc stderr slots of a loaded library"),
    METH(frames_stop, METH_NOARGS, "stop reading Python frames (atexit, before thread states go)"),
    METH(replay_load, METH_O, "replay_load(path) -> (ok, error): open libsanitizer-public.so"),
    {"replay_subscribe", (PyCFunction)(void (*)(void))py_replay_subscribe,
     METH_VARARGS | METH_KEYWORDS, "subscribe the Sanitizer API for a replay -> 0 or rc"},
    METH(replay_unsubscribe, METH_NOARGS, "give the Sanitizer subscription up -> rc"),
    METH(replay_result_string, METH_O, "a SanitizerResult's text, or None"),
    METH(replay_status, METH_NOARGS, "replay counters: (launches, seen, results, violated, "
                                     "failed_launches, allocs, frees, live_allocs, contexts, "
                                     "driver_rc, first_instrumented)"),
    METH(replay_at, METH_NOARGS, "what the culprit's launch number was, or None"),
    METH(replay_watching, METH_O, "replay_watching(+1 | -1): the script entered / left watch()"),
    METH(replay_results, METH_NOARGS, "the instrumented launches, each a tuple"),
    METH(replay_allocations, METH_NOARGS, "the Sanitizer's allocation table: [(address, size, "
                                          "flags, cbid)]"),
    METH(_test_report_pause, METH_O, "tests: the watch block from a call pauses this long "
                                     "before it is written"),
    METH(_test_fork_hold, METH_O, "tests: hold (True) or give back (False) every lock a forked "
                                  "child resets, from a thread of ours"),
    {"fault_launch", (PyCFunction)(void (*)(void))cd_py_fault_launch,
     METH_VARARGS | METH_KEYWORDS, "launch an embedded test kernel -> CUresult"},
    {"gemm", (PyCFunction)(void (*)(void))cd_py_gemm, METH_VARARGS | METH_KEYWORDS,
     "cuBLAS GEMM timing loop"},
    {"launch_latency", (PyCFunction)(void (*)(void))cd_py_launch_latency,
     METH_VARARGS | METH_KEYWORDS, "empty-kernel launch timing loop"},
    {"gemm_types", cd_py_gemm_types, METH_NOARGS, "((storage name, element bytes), ...)"},
    {"bench_release", cd_py_bench_release, METH_O, "free the benchmark's cached buffers"},
    {"mem_info", cd_py_mem_info, METH_O, "mem_info(device) -> (CUresult, free, total)"},
    {NULL, NULL, 0, NULL},
};

static int add_callback_ids(PyObject *m)
{
    PyObject *ids = PyDict_New(), *launch = PyList_New(0);
    if (!ids || !launch)
        goto fail;
#define CD_ADD_ID(id, ptsz)                                                           \
    {                                                                                 \
        PyObject *k = PyLong_FromLong(id);                                            \
        PyObject *v = PyUnicode_FromString(&(#id)[sizeof "CUPTI_DRIVER_TRACE_CBID_" - 1]); \
        int bad = !k || !v || PyDict_SetItem(ids, k, v) < 0;                          \
        if (!bad && IS_LAUNCH)                                                        \
            bad = PyList_Append(launch, k) < 0;                                       \
        Py_XDECREF(k);                                                                \
        Py_XDECREF(v);                                                                \
        if (bad)                                                                      \
            goto fail;                                                                \
    }
#define IS_LAUNCH 1
    CD_LAUNCH_CBIDS(CD_ADD_ID)
#undef IS_LAUNCH
#define IS_LAUNCH 0
    CD_CAPTURE_CBIDS(CD_ADD_ID)
#undef IS_LAUNCH
#undef CD_ADD_ID
    if (PyModule_AddObject(m, "CALLBACK_IDS", ids) < 0)
        goto fail;
    ids = NULL;
    PyObject *t = PyList_AsTuple(launch);
    Py_DECREF(launch);
    launch = NULL;
    if (!t || PyModule_AddObject(m, "LAUNCH_CALLBACK_IDS", t) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    return 0;
fail:
    Py_XDECREF(ids);
    Py_XDECREF(launch);
    return -1;
}

/* The layers beside hooks/ (the benchmarks', the replay's) in a forked child. */
static void beside_fork(int op)
{
    cd_bench_fork(op);
    cd_replay_fork(op);
}

static int core_exec(PyObject *m)
{
    core_state *st = PyModule_GetState(m);
    /* The frame reader, chosen once, here, from the importing thread (whose
     * frames it is checked against); CUDA_DEBUG_TEST_FRAME_READER=none: as if
     * this Python had none (tests). */
    const char *force = getenv("CUDA_DEBUG_TEST_FRAME_READER");
    const char *reader = cd_reader_init(force && !strcmp(force, "none")
                                        ? "disabled by CUDA_DEBUG_TEST_FRAME_READER=none" : NULL);
    if (PyModule_AddStringConstant(m, "FRAME_READER", reader) < 0)
        return -1;
    st->scope_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &scope_spec, NULL);
    if (!st->scope_type || PyModule_AddType(m, st->scope_type) < 0)
        return -1;
    static const struct {
        const char *name;
        long value;
    } ints[] = {
        {"LIB_CUDA", CD_LIB_CUDA}, {"LIB_CUPTI", CD_LIB_CUPTI}, {"LIB_CUBLAS", CD_LIB_CUBLAS},
        {"CUDA_HEADER_VERSION", CUDA_VERSION}, {"CUPTI_HEADER_VERSION", CUPTI_API_VERSION},
        {"SCOPE_BLOCK", CD_SCOPE_BLOCK}, {"SCOPE_OPT_OUT", CD_SCOPE_OPT_OUT},
        {"SCOPE_WATCH", CD_SCOPE_WATCH}, {"LOC_LIBRARY", CD_LOC_LIBRARY},
        {"LOC_USER", CD_LOC_USER}, {"LOC_PSEUDO", CD_LOC_PSEUDO},
        {"LOC_COMPILED", CD_LOC_COMPILED},
        {"FAULT_RING", CD_FAULT_RING}, {"FAULT_FRAMES", CD_FAULT_FRAMES},
        {"WATCH_RING", CD_WATCH_RING}, {"WATCH_SLOTS", CD_WATCH_SLOTS},
        {"WATCH_RECORD_BYTES", sizeof(cd_watch_record)}, {"RING_FRAMES", CD_RING_FRAMES},
        {"WATCH_GRAPH", CD_WATCH_GRAPH}, {"WATCH_MARKED", CD_WATCH_MARKED},
        {"WATCH_CLOSED", CD_WATCH_CLOSED},
        {"WATCH_USER_LAST", CD_WATCH_USER_LAST}, {"WATCH_CAPTURED", CD_WATCH_CAPTURED},
        {"GRAPH_FOUND", CD_GRAPH_FOUND}, {"GRAPH_MATCHED", CD_GRAPH_MATCHED},
        {"GRAPH_NO_MARKERS", CD_GRAPH_NO_MARKERS}, {"GRAPH_NOT_CLOSED", CD_GRAPH_NOT_CLOSED},
        {"GRAPH_NOT_STARTED", CD_GRAPH_NOT_STARTED}, {"GRAPH_ALL_DONE", CD_GRAPH_ALL_DONE},
        {"GRAPH_BROKEN", CD_GRAPH_BROKEN}, {"GRAPH_ADOPTED", CD_GRAPH_ADOPTED},
        {"GRAPH_NODES", CD_GRAPH_NODES}, {"FRAMES_SUPPORTED", 0},
        {"HANG_STEP_MIN_NS", CD_HANG_STEP_MIN_NS},
        {"ASSERT_NONE", CD_ASSERT_NONE}, {"ASSERT_GENERIC", CD_ASSERT_GENERIC},
        {"ASSERT_FITS", CD_ASSERT_FITS}, {"ASSERT_NAMES", CD_ASSERT_NAMES},
        {"ORIGIN_UNKNOWN", CD_ORIGIN_UNKNOWN}, {"ORIGIN_USER", CD_ORIGIN_USER},
        {"ORIGIN_GENERATED", CD_ORIGIN_GENERATED}, {"ORIGIN_FRAMEWORK", CD_ORIGIN_FRAMEWORK},
        {"ORIGIN_VENDOR", CD_ORIGIN_VENDOR}, {"GAP_PROFILER", CD_GAP_PROFILER},
        {"GAP_HELD", CD_GAP_HELD}, {"EARLY_LAUNCHES", CD_EARLY_LAUNCHES},
    };
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        long v = ints[i].value;
        if (!strcmp(ints[i].name, "FRAMES_SUPPORTED"))
            v = cd_reader_ok();
        if (PyModule_AddIntConstant(m, ints[i].name, v) < 0)
            return -1;
    }
#define CD_STICKY_ITEM(code) code,
    static const int sticky[] = {CD_STICKY_CODES(CD_STICKY_ITEM)};
    PyObject *t = PyTuple_New((Py_ssize_t)CD_N_OF(sticky));
    for (size_t i = 0; t && i < CD_N_OF(sticky); i++) {
        PyObject *v = PyLong_FromLong(sticky[i]);
        if (!v)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, (Py_ssize_t)i, v);
    }
    if (!t || PyModule_AddObject(m, "STICKY_CODES", t) < 0) {
        Py_XDECREF(t);
        return -1;
    }
    if (add_callback_ids(m) < 0)
        return -1;
    if (add_replay_constants(m) < 0)
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
    core_state *st = PyModule_GetState(m);
    Py_VISIT(st->scope_type);
    return 0;
}

static int core_clear(PyObject *m)
{
    core_state *st = PyModule_GetState(m);
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
    .m_size = sizeof(core_state),
    .m_methods = core_methods,
    .m_slots = core_slots,
    .m_traverse = core_traverse,
    .m_clear = core_clear,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&core_module); }
