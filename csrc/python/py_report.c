/*
 * python/py_report.c: report/'s Python face: the fault records, the texts and
 * switches of the C fault path, the dump signal and the dump's extra text.
 */
#include "python/py.h"

#include <string.h>

/* configure(names, restart, report, prefix, error_file, signals): texts and
 * switches Python owns, handed to the C fault path once. names: {code: (name,
 * what)}. */
PyObject *cd_py_configure(PyObject *self, PyObject *args, PyObject *kw)
{
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

PyObject *cd_py_fault_seq(PyObject *self, PyObject *noargs)
{
    return PyLong_FromUnsignedLongLong(cd_fault_seq());
}

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

/* faults(since) -> [record tuple], oldest first; the fields are named by
 * cuda_debug._report.RawFault (the order of cd_fault). */
CD_PY_ARG(faults, unsigned long long, since)
{
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
        cd_py_append(&out, Py_BuildValue(
            "(KiiiiNn(III)(III)IKKil" "NdKNiNnKN" "iKl)",
            (unsigned long long)f->seq, f->code, f->at_launch, f->consequence, f->cbid,
            PyBytes_FromString(f->kernel), (Py_ssize_t)f->kernel_len, f->grid[0], f->grid[1],
            f->grid[2], f->block[0], f->block[1], f->block[2], f->shared_mem,
            (unsigned long long)f->stream, (unsigned long long)f->context, f->device,
            f->thread_id,
            PyBytes_FromStringAndSize(f->thread_name, (Py_ssize_t)strnlen(f->thread_name, 16)),
            f->wall_time, (unsigned long long)f->launch_seq,
            cd_py_ids_tuple(f->frames, f->n_frames), f->frames_complete,
            PyBytes_FromStringAndSize(f->device_message, (Py_ssize_t)f->device_message_len),
            (Py_ssize_t)f->device_message_cut, (unsigned long long)f->log_end,
            ops_tuple(f), f->assert_level, (unsigned long long)f->cause_seq, f->cause_thread));
    }
    PyMem_Free(fs);
    return out;
}

PyObject *cd_py_report_watch_culprit(PyObject *self, PyObject *args)
{
    int code;
    const char *where;
    if (!PyArg_ParseTuple(args, "is", &code, &where))
        return NULL;
    Py_BEGIN_ALLOW_THREADS
    cd_report_watch_culprit(code, where, 0);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* install_dump_signal(signum, python_has_it, python_has_sigint): the
 * in-flight report on that signal, chained to the handler there now (again
 * when Python's signal.signal() replaced ours). */
PyObject *cd_py_install_dump_signal(PyObject *self, PyObject *args)
{
    int sig, mine, sigint;
    if (!PyArg_ParseTuple(args, "ipp", &sig, &mine, &sigint))
        return NULL;
    if (cd_install_dump_signal(sig, mine, sigint) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* dump_set_extra(bytes): the flight recorder's last collectives (JSON made by
 * json.dumps) that every dump document carries from now on. */
PyObject *cd_py_dump_set_extra(PyObject *self, PyObject *arg)
{
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(arg, &p, &n) != 0)
        return NULL;
    if (n > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError, "dump_set_extra: at most 1 MiB");
        return NULL;
    }
    if (n) {                           /* every dump document embeds it: one JSON object */
        PyObject *json = PyImport_ImportModule("json");
        PyObject *v = json ? PyObject_CallMethod(json, "loads", "O", arg) : NULL;
        Py_XDECREF(json);
        int is_object = v && PyDict_Check(v);
        Py_XDECREF(v);
        if (!is_object) {
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "dump_set_extra: not a JSON object");
            return NULL;
        }
    }
    if (cd_report_set_extra(p, (size_t)n) != 0)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* _test_report_pause(seconds): tests: the watch block written from a call
 * pauses that long after claiming the report, before writing it. */
CD_PY_ARG(_test_report_pause, double, s)
{
    cd_report_test_pause(s > 0 ? (uint64_t)(s * 1e9) : 0);
    Py_RETURN_NONE;
}
