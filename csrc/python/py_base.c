/*
 * python/py_base.c: base/'s Python face (the loader, devices, options, the
 * counters, strings) and the conversions every face of python/ shares.
 */
#include "python/py.h"

#include <errno.h>      /* errno */
#include <stdlib.h>      /* free */
#include <string.h>      /* strlen */

/* ------------------------------------------------------- conversions -- */

int cd_py_ull(PyObject *o, void *out)
{
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred())
        return 0;
    *(unsigned long long *)out = v;
    return 1;
}

int cd_py_ulong(PyObject *o, void *out)
{
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return 0;
    *(unsigned long *)out = v;
    return 1;
}

int cd_py_long(PyObject *o, void *out)
{
    long v = PyLong_AsLong(o);
    if (v == -1 && PyErr_Occurred())
        return 0;
    *(long *)out = v;
    return 1;
}

int cd_py_double(PyObject *o, void *out)
{
    double v = PyFloat_AsDouble(o);
    if (v == -1.0 && PyErr_Occurred())
        return 0;
    *(double *)out = v;
    return 1;
}

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

int cd_py_str_lists(PyObject *a, const char ***a_v, int *n_a, PyObject *b, const char ***b_v,
                    int *n_b)
{
    if (str_array(a, a_v, n_a) < 0)
        return -1;
    if (str_array(b, b_v, n_b) < 0) {
        PyMem_Free(*a_v);
        return -1;
    }
    return 0;
}

void cd_py_append(PyObject **list, PyObject *item)
{
    if (!item || PyList_Append(*list, item) < 0)
        Py_CLEAR(*list);
    Py_XDECREF(item);
}

PyObject *cd_py_none_or_errno(int rc)
{
    if (rc) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

PyObject *cd_py_ids_tuple(const uint32_t *ids, int n)
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

PyObject *cd_py_ids_list(const uint32_t *ids, int n)
{
    PyObject *list = PyList_New(0);
    for (int i = 0; list && i < n; i++)
        cd_py_append(&list, PyLong_FromUnsignedLong(ids[i]));
    return list;
}

PyObject *cd_py_interned_str(uint32_t id)
{
    const char *s = cd_interned(id);
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

PyObject *cd_py_interned_filename(uint32_t id)
{
    const char *s = cd_interned(id);
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "surrogateescape");
}

/* CUPTI 13 called without a driver (a machine with the nvidia-cuda-cupti
 * wheel and no GPU) recurses until the stack overflows. */
int cd_py_cupti_callable(void)
{
    return cd_libs[CD_LIB_CUPTI].handle && cd_driver_ready() == 0;
}

/* --------------------------------------------------------------- loader -- */

PyObject *cd_py_load_library(PyObject *self, PyObject *args)
{
    int lib, n_sonames, n_paths;
    PyObject *sonames, *paths;
    const char **so_v, **path_v;
    if (!PyArg_ParseTuple(args, "iO!O!", &lib, &PyList_Type, &sonames, &PyList_Type, &paths))
        return NULL;
    if (lib < 0 || lib >= CD_LIB_COUNT) {
        PyErr_SetString(PyExc_ValueError, "unknown library id");
        return NULL;
    }
    if (cd_py_str_lists(sonames, &so_v, &n_sonames, paths, &path_v, &n_paths) < 0)
        return NULL;
    cd_load_library((enum cd_lib)lib, so_v, n_sonames, path_v, n_paths);
    PyMem_Free(so_v);
    PyMem_Free(path_v);
    const cd_library *L = &cd_libs[lib];
    return Py_BuildValue("(Osss)", L->handle ? Py_True : Py_False, L->path, L->how, L->error);
}

PyObject *cd_py_driver_init(PyObject *self, PyObject *noargs)
{
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_driver_ready();
    Py_END_ALLOW_THREADS
    if (rc == 0)
        cd_driver_log_init(cd_on_sticky_logged);
    return PyLong_FromLong(rc);
}

PyObject *cd_py_driver_version(PyObject *self, PyObject *noargs)
{
    int v = 0;
    if (!cd_libs[CD_LIB_CUDA].handle)
        Py_RETURN_NONE;
    if (CU_CHECK(cd_drv.cuDriverGetVersion(&v)))
        Py_RETURN_NONE;
    return PyLong_FromLong(v);
}

PyObject *cd_py_cupti_version(PyObject *self, PyObject *noargs)
{
    uint32_t v = 0;
    if (!cd_py_cupti_callable() || CUPTI_CHECK(cd_cupti.cuptiGetVersion(&v)))
        Py_RETURN_NONE;
    return PyLong_FromUnsignedLong(v);
}

CD_PY_ARG(cupti_result_string, long, code)
{
    const char *s = NULL;
    if (!cd_py_cupti_callable() ||
        cd_cupti.cuptiGetResultString((CUptiResult)code, &s) != CUPTI_SUCCESS || !s)
        Py_RETURN_NONE;
    return PyUnicode_FromString(s);
}

/* device_info(ordinal) -> (name, total_bytes, cc_major, cc_minor, sm_count,
 * clock_khz, mem_clock_khz, l2_bytes, pci_bus) or an int CUresult. */
PyObject *cd_py_device_info(PyObject *self, PyObject *args)
{
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

PyObject *cd_py_device_count(PyObject *self, PyObject *noargs)
{
    int rc = cd_driver_ready(), n = 0;
    if (rc != 0)
        return Py_BuildValue("(ii)", rc < 0 ? CUDA_ERROR_NOT_INITIALIZED : rc, 0);
    rc = CU_CHECK(cd_drv.cuDeviceGetCount(&n));
    return Py_BuildValue("(ii)", rc, n);
}

/* synchronize(device) -> CUresult. device < 0: the thread's current context
 * or, when none is current, every device whose primary context is active. */
PyObject *cd_py_synchronize(PyObject *self, PyObject *args)
{
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
CD_PY_ARG(error_string, long, code)
{
    const char *s = NULL;
    if (!cd_libs[CD_LIB_CUDA].handle || cd_drv.cuGetErrorString((CUresult)code, &s) || !s)
        Py_RETURN_NONE;
    return PyUnicode_FromString(s);
}

PyObject *cd_py_last_call(PyObject *self, PyObject *noargs)
{
    if (!cd_last_call.status)
        Py_RETURN_NONE;
    return Py_BuildValue("(isssi)", cd_last_call.status, cd_last_call.lib, cd_last_call.call,
                         cd_last_call.file, cd_last_call.line);
}

/* ------------------------------------------------------------- options -- */

/* set_options(wait, tee_stderr, profile, capture_check, graph_markers[, watch_probe,
 * detach, graph_marker_every]): the debug switches (base.h's cd_config),
 * validated by Python (cuda_debug/_options.py) from CUDA_DEBUG_*. */
PyObject *cd_py_set_options(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"wait", "tee_stderr", "profile", "capture_check", "graph_markers",
                             "watch_probe", "detach", "graph_marker_every", NULL};
    cd_config_t c = {.wait_mode = CD_WAIT_SYNC, .tee_stderr = 1, .profile = 0,
                     .capture_check = 1, .graph_markers = CD_MARKERS_KERNEL,
                     .watch_probe = CD_PROBE_OFF, .detach = 0, .graph_marker_every = 8};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|$ippiiipi", kwlist, &c.wait_mode, &c.tee_stderr,
                                     &c.profile, &c.capture_check, &c.graph_markers,
                                     &c.watch_probe, &c.detach, &c.graph_marker_every))
        return NULL;
    if (c.graph_marker_every < 1 || c.graph_marker_every > 1024) {
        PyErr_SetString(PyExc_ValueError, "graph_marker_every must be 1 to 1024");
        return NULL;
    }
    if (c.watch_probe < CD_PROBE_OFF || c.watch_probe > CD_PROBE_FRAMES) {
        PyErr_SetString(PyExc_ValueError, "watch_probe must be 0 (off) to 3 (frames)");
        return NULL;
    }
    if (c.graph_markers < CD_MARKERS_OFF || c.graph_markers > CD_MARKERS_KERNEL) {
        PyErr_SetString(PyExc_ValueError, "graph_markers must be 0 (off), 1 (memop) or 2 (kernel)");
        return NULL;
    }
    if (c.wait_mode < CD_WAIT_SYNC || c.wait_mode > CD_WAIT_NONE) {
        PyErr_SetString(PyExc_ValueError, "wait must be 0 (sync), 1 (spin) or 2 (none)");
        return NULL;
    }
    pthread_mutex_lock(&cd_sub_lock);
    int busy = cd_cupti_subscribed();
    if (!busy)
        cd_configure(&c);
    pthread_mutex_unlock(&cd_sub_lock);
    if (busy) {
        PyErr_SetString(PyExc_RuntimeError, "options cannot change while a scope or watch is open");
        return NULL;
    }
    Py_RETURN_NONE;
}

/* --------------------------------------------------------------- stats -- */

/* stats(): each layer's counters under their own names (their X-macro
 * lists: CD_LAUNCH_COUNTS, CD_WATCH_COUNTS, CD_SUBSCRIPTION_COUNTS), then
 * one row a key for the rest: (the dict, the key, its kind, its value).
 * The values are read first, into the snapshots of cd_py_stats: the
 * counters through each layer's getter, the gates as they are. Kinds: U an
 * unsigned count, I an int, S a str. */
#define CD_STATS(X)                                                                         \
    X(top, "subscribes", U, atomic_load(&cd_gates.subscriptions))                           \
    X(top, "active", I, atomic_load(&cd_gates.active))                                      \
    X(top, "watching", I, atomic_load(&cd_gates.watching))                                  \
    X(top, "all_threads", I, atomic_load(&cd_gates.all_threads))                            \
    X(top, "in_callback", I, atomic_load(&cd_gates.in_callback))                            \
    X(top, "watch_every", U, atomic_load(&cd_gates.watch_every))                            \
    X(top, "watch_alloc_rc", I, cd_watch_alloc_rc())                                        \
    X(top, "watch_write_rc", I, ring.write_rc)                                              \
    X(top, "subscribed", I, cd_cupti_subscribed())                                          \
    X(top, "interned_bytes", U, cd_intern_used())                                           \
    X(top, "stderr_tee", I, cd_tee_installed())                                             \
    X(top, "code_watcher", I, cd_frames_code_watched())                                     \
    X(top, "take_backs", U, cd_scopes_take_backs())                                         \
    X(top, "coverage_gap_open", I, cd_coverage_gap_is_open())                               \
    X(top, "cupti_residue", S, residue)                                                     \
    X(hooks, "on", I, h.on) X(hooks, "recording", I, h.recording)                           \
    X(hooks, "entries", I, h.entries)                                                       \
    X(hooks, "routed", U, h.routed) X(hooks, "recorded", U, h.recorded)                     \
    X(hooks, "handed_back", U, h.handed_back) X(hooks, "asked", U, h.asked)                 \
    X(hooks, "why_off", S, why_off)                                                         \
    X(hooks, "other_runtimes", U, h.other_runtimes)                                         \
    X(hooks, "runtime", S, h.runtime) X(hooks, "other_runtime", S, h.other_runtime)         \
    X(hooks, "unresolved", U, h.unresolved) X(hooks, "unresolved_rc", I, h.unresolved_rc)   \
    X(hooks, "ns_lookup", U, h.ns_lookup) X(hooks, "ns_launch", U, h.ns_launch)

#define CD_STAT_U(v) PyLong_FromUnsignedLongLong((unsigned long long)(v))
#define CD_STAT_I(v) PyLong_FromLong((long)(v))
#define CD_STAT_S(v) PyUnicode_FromString(v)

/* d[key] = v (a new reference, NULL: the error set); 0, or -1. */
static int stat_put(PyObject *d, const char *key, PyObject *v)
{
    if (!v)
        return -1;
    const int rc = PyDict_SetItemString(d, key, v);
    Py_DECREF(v);
    return rc;
}

static const char *const residue_text[] = {
    "", "pending: the next launch's callback detaches CUPTI (cuptiFinalize)",
    "CUDA_DEBUG_CUPTI_DETACH=0: CUPTI stays loaded, unsubscribed",
    "another client held CUPTI in this process: it is not finalized under it",
    ("a profiler (torch.profiler/Kineto) used CUPTI in this process: it is not finalized "
     "under it"),
    "this libcupti has no cuptiFinalize", "a forked child: the parent's CUPTI",
    "cuptiFinalize failed: CUPTI stays loaded, unsubscribed"};
static const char *const hooks_off_text[] = {
    "never on", "CUDA_DEBUG_LAUNCH_HOOKS=0", "no CUPTI", "driver too old",
    "a library imports the route", "no library imports __cudaLaunchKernel", "a forked child"};

PyObject *cd_py_stats(PyObject *self, PyObject *noargs)
{
    cd_launch_counts launch;
    cd_launch_stats(&launch);
    cd_watch_counts ring;
    cd_watch_stats(&ring);
    cd_subscription_counts sub;
    cd_subscription_stats(&sub);
    cd_hook_stats h;
    cd_runtime_hooks_stats(&h);
    const int rs = cd_cupti_residue();
    const char *residue = residue_text[rs >= 0 && rs < (int)CD_N_OF(residue_text) ? rs : 0];
    const int wo = h.why_off >= 0 && h.why_off < (int)CD_N_OF(hooks_off_text) ? h.why_off : 0;
    const char *why_off = h.on ? "" : hooks_off_text[wo];
    PyObject *top = PyDict_New(), *hooks = PyDict_New();
    if (!top || !hooks)
        goto fail;
#define PUT(dict, key, kind, value)                                                         \
    if (stat_put(dict, key, CD_STAT_##kind(value)) < 0)                                    \
        goto fail;
#define PUT_LAUNCH(name) PUT(top, #name, U, launch.name)
#define PUT_RING(name) PUT(top, #name, U, ring.name)
#define PUT_SUB(name) PUT(top, #name, U, sub.name)
    CD_LAUNCH_COUNTS(PUT_LAUNCH)
    CD_WATCH_COUNTS(PUT_RING)
    CD_SUBSCRIPTION_COUNTS(PUT_SUB)
    CD_STATS(PUT)
#undef PUT_SUB
#undef PUT_RING
#undef PUT_LAUNCH
#undef PUT
    if (PyDict_SetItemString(top, "launch_hooks", hooks) < 0)
        goto fail;
    Py_DECREF(hooks);
    return top;
fail:
    Py_XDECREF(top);
    Py_XDECREF(hooks);
    return NULL;
}

/* ------------------------------------------------------------- strings -- */

uint32_t cd_py_intern_where(const char *w, Py_ssize_t n)
{
    return w && n > 0 ? cd_intern(w, (size_t)(n > 4095 ? 4095 : n)) : 0;
}

/* kernel_origin(name) -> ORIGIN_*, by the kernel's name (base/demangle.c). */
PyObject *cd_py_kernel_origin(PyObject *self, PyObject *arg)
{
    char *name;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &name, &n) != 0)
        return NULL;
    return PyLong_FromLong(cd_kernel_origin_of_name(name));
}

PyObject *cd_py_demangle(PyObject *self, PyObject *arg)
{
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

PyObject *cd_py_short_kernel_name(PyObject *self, PyObject *arg)
{
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s)
        return NULL;
    char out[512];
    size_t n = cd_short_kernel_name(s, out, sizeof out);
    return PyUnicode_DecodeUTF8(out, (Py_ssize_t)n, "replace");
}
