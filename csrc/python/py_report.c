/*
 * python/py_report.c: report/'s Python face: the fault records, the texts and
 * switches of the C fault path, the dump signal and the dump's extra text.
 */
#include "python/py.h"

#include <string.h>     /* strlen, strnlen */

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

/* verdict(candidates, text, hint) -> (order, named, by_hint, by_words, reordered,
 * ruled_out, function): the one rule (report/verdict.c) over the candidates
 * Python gathered (the watch ring's, graph replays expanded into their nodes),
 * each (mangled: str | None, origin, seq, graph); order: the indices of the
 * candidates kept, in the verdict's order; function: what the text names
 * when it rules them all out, else None. */
PyObject *cd_py_verdict(PyObject *self, PyObject *args)
{
    PyObject *seq;
    const char *text, *hint = NULL;
    Py_ssize_t tlen;
    if (!PyArg_ParseTuple(args, "Oy#z", &seq, &text, &tlen, &hint))
        return NULL;
    PyObject *fast = PySequence_Fast(seq, "verdict: candidates must be a sequence");
    if (!fast)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    if (n > CD_VERDICT_MAX)
        n = CD_VERDICT_MAX;            /* the rest are past what any report lists */
    cd_verdict_cand c[CD_VERDICT_MAX];
    PyObject *names[CD_VERDICT_MAX] = {0};
    int ok = 1;
    for (Py_ssize_t i = 0; i < n && ok; i++) {
        PyObject *name;
        int origin, graph;
        unsigned long long s;
        ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "OiKp", &name, &origin, &s,
                              &graph);
        if (!ok)
            break;
        c[i] = (cd_verdict_cand){.seq = s, .origin = origin, .graph = graph, .level = -1,
                                 .tag = (int)i};
        if (name != Py_None) {
            names[i] = PyUnicode_AsEncodedString(name, "utf-8", "surrogateescape");
            ok = names[i] != NULL;
            if (ok)
                c[i].mangled = PyBytes_AS_STRING(names[i]);
        }
    }
    PyObject *result = NULL;
    if (ok) {
        cd_verdict v;
        int kept = cd_verdict_decide(c, (int)n, text, (size_t)tlen, hint, &v);
        PyObject *order = PyTuple_New(kept);
        for (int i = 0; order && i < kept; i++)
            PyTuple_SET_ITEM(order, i, PyLong_FromLong(c[i].tag));
        if (order)
            result = Py_BuildValue("(Niiiiiz)", order, v.named, v.by_hint, v.by_words,
                                   v.reordered, v.ruled_out,
                                   v.ruled_out && v.function[0] ? v.function : NULL);
    }
    for (Py_ssize_t i = 0; i < n; i++)
        Py_XDECREF(names[i]);
    Py_DECREF(fast);
    return result;
}

/* The verdict on every CUDA error, wherever it is raised (cuda_debug/_notes.py).
 * on_raise(code, offset, exception) is sys.monitoring's RAISE callback (3.12+):
 * it costs one C call a raised exception, and calls Python (the hook set by
 * set_raise_hook) only once a sticky fault was seen, or, while watching, for a
 * RuntimeError (what torch, CuPy, Triton and JAX raise CUDA errors as). */
static PyObject *raise_hook;

PyObject *cd_py_set_raise_hook(PyObject *self, PyObject *hook)
{
    Py_XSETREF(raise_hook, hook == Py_None ? NULL : Py_NewRef(hook));
    Py_RETURN_NONE;
}

PyObject *cd_py_on_raise(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !raise_hook)
        Py_RETURN_NONE;
    PyObject *exc = args[2];
    if (!cd_fault_sticky_seen() &&
        !(atomic_load_explicit(&cd_gates.watching, memory_order_relaxed) &&
          PyObject_TypeCheck(exc, (PyTypeObject *)PyExc_RuntimeError)))
        Py_RETURN_NONE;
    PyObject *r = PyObject_CallOneArg(raise_hook, exc);
    if (!r)
        PyErr_WriteUnraisable(raise_hook);   /* never in place of the user's exception */
    Py_XDECREF(r);
    Py_RETURN_NONE;
}

PyObject *cd_py_sticky_seen(PyObject *self, PyObject *arg)
{
    if (PyObject_IsTrue(arg) == 1)
        cd_fault_note_sticky();
    return PyBool_FromLong(cd_fault_sticky_seen());
}
