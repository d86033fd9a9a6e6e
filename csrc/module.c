/*
 * module.c: the cuda_debug._core method table and module init (PEP 489), plus
 * the thin Python-facing wrappers that only convert values. Behaviour lives in
 * the other files; policy and messages live in Python.
 */
#include "cuda_debug.h"

#include <stdlib.h>
#include <string.h>

/* --------------------------------------------------------------- loader -- */

static PyObject *py_load_library(PyObject *self, PyObject *args)
{
    (void)self;
    int lib;
    PyObject *sonames, *paths;
    if (!PyArg_ParseTuple(args, "iO!O!", &lib, &PyList_Type, &sonames, &PyList_Type, &paths))
        return NULL;
    if (lib < 0 || lib >= CD_LIB_COUNT) {
        PyErr_SetString(PyExc_ValueError, "unknown library id");
        return NULL;
    }
    if (cd_load_library((enum cd_lib)lib, sonames, paths) < 0 && PyErr_Occurred())
        return NULL;
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
        cd_driver_log_init();
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

static PyObject *py_cupti_version(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    uint32_t v = 0;
    if (!cd_libs[CD_LIB_CUPTI].handle || CUPTI_CHECK(cd_cupti.cuptiGetVersion(&v)))
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

static int sync_context(CUcontext ctx)
{
    int rc;
    CUcontext popped;
    Py_BEGIN_ALLOW_THREADS
    rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx));
    if (rc == 0) {
        rc = CU_CHECK(cd_drv.cuCtxSynchronize());
        cd_drv.cuCtxPopCurrent(&popped);
    }
    Py_END_ALLOW_THREADS
    return rc;
}

static PyObject *sync_active_devices(void)
{
    int n = 0, rc = CU_CHECK(cd_drv.cuDeviceGetCount(&n));
    for (int i = 0; rc == 0 && i < n; i++) {
        CUdevice dev;
        unsigned flags;
        int active = 0;
        CUcontext ctx;
        if ((rc = CU_CHECK(cd_drv.cuDeviceGet(&dev, i))) ||
            (rc = CU_CHECK(cd_drv.cuDevicePrimaryCtxGetState(dev, &flags, &active))) || !active)
            continue;
        if ((rc = cd_device_context(i, &ctx)) == 0)
            rc = sync_context(ctx);
    }
    return PyLong_FromLong(rc);
}

/* synchronize(device) -> CUresult. device < 0: the thread's current context
 * or, when none is current, every device whose primary context is active. */
static PyObject *py_synchronize(PyObject *self, PyObject *args)
{
    (void)self;
    int device, rc;
    if (!PyArg_ParseTuple(args, "i", &device))
        return NULL;
    if ((rc = cd_driver_ready()) != 0)
        return PyLong_FromLong(rc < 0 ? CUDA_ERROR_NOT_INITIALIZED : rc);
    CUcontext ctx = NULL;
    if (device < 0) {
        if ((rc = CU_CHECK(cd_drv.cuCtxGetCurrent(&ctx))))
            return PyLong_FromLong(rc);
        if (!ctx)   /* nothing current here: every device whose primary context is active */
            return sync_active_devices();
    } else if ((rc = cd_device_context(device, &ctx))) {
        return PyLong_FromLong(rc);
    }
    return PyLong_FromLong(sync_context(ctx));
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

/* --------------------------------------------------------------- scopes -- */

static PyObject *py_thread_state(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromLong(cd_thread_state_get());
}

static PyObject *py_set_thread_state(PyObject *self, PyObject *arg)
{
    (void)self;
    long s = PyLong_AsLong(arg);
    if (s == -1 && PyErr_Occurred())
        return NULL;
    return PyLong_FromLong(cd_thread_state_set((int)s));
}

/* scope_acquire(all_threads) -> (CUptiResult, holder name or "") */
static PyObject *py_scope_acquire(PyObject *self, PyObject *arg)
{
    (void)self;
    int all = PyObject_IsTrue(arg);
    if (all < 0)
        return NULL;
    if (!cd_libs[CD_LIB_CUPTI].handle) {
        PyErr_SetString(PyExc_RuntimeError, "CUPTI not loaded");
        return NULL;
    }
    char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN * 2];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_scope_acquire(all, holder, sizeof holder);
    Py_END_ALLOW_THREADS
    holder[sizeof holder - 1] = '\0';
    return Py_BuildValue("(is)", rc, holder);
}

static PyObject *py_scope_release(PyObject *self, PyObject *arg)
{
    (void)self;
    int all = PyObject_IsTrue(arg);
    if (all < 0)
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    cd_scope_release(all);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *py_cupti_result_string(PyObject *self, PyObject *arg)
{
    (void)self;
    long code = PyLong_AsLong(arg);
    if (code == -1 && PyErr_Occurred())
        return NULL;
    const char *s = NULL;
    if (!cd_libs[CD_LIB_CUPTI].handle ||
        cd_cupti.cuptiGetResultString((CUptiResult)code, &s) != CUPTI_SUCCESS || !s)
        Py_RETURN_NONE;
    return PyUnicode_FromString(s);
}

/* --------------------------------------------------------------- faults -- */

static PyObject *py_fault_seq(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromUnsignedLongLong(atomic_load(&cd_state.fault_seq));
}

/* fault() -> None or (seq, code, at_launch, cbid, kernel, grid, block,
 * shared_mem, stream, device, thread_id, thread_name, wall_time,
 * device_message: bytes, log_end) */
static PyObject *py_fault(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    cd_fault *f = PyMem_Malloc(sizeof *f);
    if (!f)
        return PyErr_NoMemory();
    pthread_mutex_lock(&cd_state.fault_lock);
    *f = cd_state.fault;
    pthread_mutex_unlock(&cd_state.fault_lock);
    PyObject *r;
    if (!f->seq) {
        Py_INCREF(Py_None);
        r = Py_None;
    } else {
        r = Py_BuildValue("(Kiiiy(III)(III)IKilsdy#K)", (unsigned long long)f->seq, f->code,
                          f->at_launch, f->cbid, f->kernel, f->grid[0], f->grid[1], f->grid[2],
                          f->block[0], f->block[1], f->block[2], f->shared_mem,
                          (unsigned long long)f->stream, f->device, f->thread_id,
                          f->thread_name, f->wall_time, f->device_message,
                          (Py_ssize_t)f->device_message_len, (unsigned long long)f->log_end);
    }
    PyMem_Free(f);
    return r;
}

static PyObject *py_driver_log(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long from, to;
    if (!PyArg_ParseTuple(args, "KK", &from, &to))
        return NULL;
    return cd_driver_log_lines(from, to);
}

static PyObject *py_driver_log_count(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return PyLong_FromUnsignedLongLong(cd_driver_log_count());
}

static PyObject *py_demangle(PyObject *self, PyObject *arg)
{
    (void)self;
    const char *s = PyUnicode_AsUTF8(arg);
    if (!s)
        return NULL;
    return cd_demangle(s);
}

/* ------------------------------------------------------ modes and stats -- */

static const char *const wait_names[] = {"sync", "spin", "none"};
static const char *const capture_names[] = {"off", "stdio", "fd"};

static int parse_mode(const char *s, const char *const *names, int n)
{
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i]))
            return i;
    return -1;
}

/* modes() -> (wait, capture); set_modes(wait, capture): for benchmarks that
 * compare strategies in one process; only while no scope is open. */
static PyObject *py_modes(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
    return Py_BuildValue("(ss)", wait_names[cd_state.wait_mode],
                         capture_names[cd_state.capture_mode]);
}

static PyObject *py_set_modes(PyObject *self, PyObject *args)
{
    (void)self;
    const char *w, *c;
    if (!PyArg_ParseTuple(args, "ss", &w, &c))
        return NULL;
    int wi = parse_mode(w, wait_names, 3), ci = parse_mode(c, capture_names, 3);
    if (wi < 0 || ci < 0) {
        PyErr_Format(PyExc_ValueError, "unknown mode %s/%s", w, c);
        return NULL;
    }
    if (atomic_load(&cd_state.active)) {
        PyErr_SetString(PyExc_RuntimeError, "cannot change modes inside a launch_blocking scope");
        return NULL;
    }
    cd_state.wait_mode = wi;
    cd_state.capture_mode = ci;
    cd_capture_init();
    Py_RETURN_NONE;
}

static PyObject *py_stats(PyObject *self, PyObject *noargs)
{
    (void)self;
    (void)noargs;
#define U(x) (unsigned long long)atomic_load(&cd_state.x)
    return Py_BuildValue("{sKsKsKsKsisisKsKsK}", "synced", U(n_synced), "follower",
                         U(n_follower), "skipped_capture", U(n_skipped_capture), "subscribes",
                         U(n_subscribes), "active", atomic_load(&cd_state.active),
                         "all_threads", atomic_load(&cd_state.all_threads),
                         "ns_capture_check", U(ns_capture_check), "ns_wait", U(ns_wait),
                         "ns_callback", U(ns_callback));
#undef U
}

/* ----------------------------------------------------------------- init -- */

static PyMethodDef core_methods[] = {
    {"load_library", py_load_library, METH_VARARGS,
     "load_library(lib, sonames, paths) -> (loaded, path, how, error)"},
    {"driver_init", py_driver_init, METH_NOARGS, "cuInit(0) once -> CUresult"},
    {"driver_version", py_driver_version, METH_NOARGS, "cuDriverGetVersion or None"},
    {"cupti_version", py_cupti_version, METH_NOARGS, "cuptiGetVersion or None"},
    {"device_count", py_device_count, METH_NOARGS, "-> (CUresult, count)"},
    {"device_info", py_device_info, METH_VARARGS, "device_info(ordinal) -> tuple or CUresult"},
    {"synchronize", py_synchronize, METH_VARARGS, "synchronize(device) -> CUresult"},
    {"error_string", py_error_string, METH_O, "cuGetErrorString text or None"},
    {"last_call", py_last_call, METH_NOARGS, "this thread's last failed CUDA call, or None"},
    {"thread_state", py_thread_state, METH_NOARGS, "this thread's scope state"},
    {"set_thread_state", py_set_thread_state, METH_O, "set it, return the previous"},
    {"scope_acquire", py_scope_acquire, METH_O, "-> (CUptiResult, holder)"},
    {"scope_release", py_scope_release, METH_O, "release one scope"},
    {"cupti_result_string", py_cupti_result_string, METH_O, "CUPTI result text"},
    {"fault_seq", py_fault_seq, METH_NOARGS, "number of faults recorded"},
    {"fault", py_fault, METH_NOARGS, "the last fault record (raw tuple) or None"},
    {"driver_log", py_driver_log, METH_VARARGS, "driver_log(from, to) -> [bytes]"},
    {"driver_log_count", py_driver_log_count, METH_NOARGS, "driver log lines so far"},
    {"demangle", py_demangle, METH_O, "demangle a C++ symbol, or None"},
    {"modes", py_modes, METH_NOARGS, "(wait, capture) modes"},
    {"set_modes", py_set_modes, METH_VARARGS, "set_modes(wait, capture)"},
    {"stats", py_stats, METH_NOARGS, "launch-hook counters"},
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

static int core_exec(PyObject *m)
{
    const char *w = getenv("CUDA_DEBUG_WAIT");
    const char *c = getenv("CUDA_DEBUG_CAPTURE");
    int wi = w ? parse_mode(w, wait_names, 3) : CD_WAIT_SYNC;
    int ci = c ? parse_mode(c, capture_names, 3) : CD_CAPTURE_STDIO;
    cd_state.wait_mode = wi < 0 ? CD_WAIT_SYNC : wi;
    cd_state.capture_mode = ci < 0 ? CD_CAPTURE_STDIO : ci;
    cd_capture_init();
    const char *p = getenv("CUDA_DEBUG_PROFILE");
    cd_state.profile = p && p[0] == '1';
    const char *cc = getenv("CUDA_DEBUG_CAPTURE_CHECK");
    cd_state.capture_check = !(cc && cc[0] == '0');
    if (PyModule_AddIntConstant(m, "LIB_CUDA", CD_LIB_CUDA) < 0 ||
        PyModule_AddIntConstant(m, "LIB_CUPTI", CD_LIB_CUPTI) < 0 ||
        PyModule_AddIntConstant(m, "LIB_CUBLAS", CD_LIB_CUBLAS) < 0 ||
        PyModule_AddIntConstant(m, "CUDA_HEADER_VERSION", CUDA_VERSION) < 0 ||
        PyModule_AddIntConstant(m, "CUPTI_HEADER_VERSION", CUPTI_API_VERSION) < 0)
        return -1;
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
    .m_doc = "cuda_debug C core: launch hooks, fault records, loaders, timing loops.",
    .m_size = 0,
    .m_methods = core_methods,
    .m_slots = core_slots,
};

PyMODINIT_FUNC PyInit__core(void) { return PyModuleDef_Init(&core_module); }
