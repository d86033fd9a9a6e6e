/*
 * python/py_replay.c: replay/'s Python face: the Sanitizer replay, the hook
 * that asks Python for the valid ranges, the records.
 */
#include "python/py.h"

#include <stdlib.h>     /* malloc */
#include <string.h>      /* memcpy, memset, strlen */

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

PyObject *cd_py_replay_load(PyObject *self, PyObject *arg)
{
    PyObject *b;
    if (!PyUnicode_FSConverter(arg, &b))
        return NULL;
    char error[1024] = "";
    int rc = cd_replay_load(PyBytes_AS_STRING(b), error, sizeof error);
    Py_DECREF(b);
    return Py_BuildValue("(Os)", rc == 0 ? Py_True : Py_False, error);
}

PyObject *cd_py_replay_subscribe(PyObject *self, PyObject *args, PyObject *kw)
{
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

PyObject *cd_py_replay_unsubscribe(PyObject *self, PyObject *noargs)
{
    return PyLong_FromLong(cd_replay_unsubscribe());
}

CD_PY_ARG(replay_result_string, long, rc)
{
    const char *s = cd_replay_result_string((int)rc);
    if (!s)
        Py_RETURN_NONE;
    return PyUnicode_DecodeUTF8(s, (Py_ssize_t)strlen(s), "replace");
}

PyObject *cd_py_replay_status(PyObject *self, PyObject *noargs)
{
    cd_replay_status st;
    cd_replay_get_status(&st);
    return Py_BuildValue("(KKiiKKKniiK)", (unsigned long long)st.launches,
                         (unsigned long long)st.launches_seen, st.n_results, st.violated,
                         (unsigned long long)st.failed_launches, (unsigned long long)st.n_allocs,
                         (unsigned long long)st.n_frees, (Py_ssize_t)st.live_allocs,
                         st.patches_contexts, st.driver_rc,
                         (unsigned long long)st.first_instrumented);
}

CD_PY_ARG(replay_watching, long, d)
{
    cd_replay_watching((int)d);
    Py_RETURN_NONE;
}

PyObject *cd_py_replay_at(PyObject *self, PyObject *noargs)
{
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
        cd_py_append(&recs, Py_BuildValue("(KKIIII(III)(III))", (unsigned long long)a->address,
                                          (unsigned long long)a->pc, a->size, a->flags, a->space,
                                          a->order, a->thread[0], a->thread[1], a->thread[2],
                                          a->block[0], a->block[1], a->block[2]));
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

PyObject *cd_py_replay_results(PyObject *self, PyObject *noargs)
{
    PyObject *out = PyList_New(0);
    cd_replay_launch *r = PyMem_Malloc(sizeof *r);
    if (!r) {
        Py_XDECREF(out);
        return PyErr_NoMemory();
    }
    cd_replay_status st;
    cd_replay_get_status(&st);
    int first = st.n_results > CD_REPLAY_RESULTS ? st.n_results - CD_REPLAY_RESULTS : 0;
    for (int i = first; out && cd_replay_launch_result(i, r) == 0; i++)
        cd_py_append(&out, replay_launch_tuple(r));
    PyMem_Free(r);
    return out;
}

PyObject *cd_py_replay_allocations(PyObject *self, PyObject *noargs)
{
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

PyObject *cd_py_replay_module_image(PyObject *self, PyObject *arg)
{
    unsigned long long launch = PyLong_AsUnsignedLongLong(arg);
    if (launch == (unsigned long long)-1 && PyErr_Occurred())
        return NULL;
    size_t size;
    Py_BEGIN_ALLOW_THREADS
    size = cd_replay_module_image(launch, NULL, 0);
    Py_END_ALLOW_THREADS
    if (!size)
        Py_RETURN_NONE;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!out)
        return NULL;
    size_t got;
    Py_BEGIN_ALLOW_THREADS
    got = cd_replay_module_image(launch, PyBytes_AS_STRING(out), size);
    Py_END_ALLOW_THREADS
    if (got != size) {                 /* unloaded or replaced in between */
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

PyObject *cd_py_replay_image_stats(PyObject *self, PyObject *noargs)
{
    size_t n, bytes;
    cd_replay_image_stats(&n, &bytes);
    return Py_BuildValue("(nn)", (Py_ssize_t)n, (Py_ssize_t)bytes);
}
