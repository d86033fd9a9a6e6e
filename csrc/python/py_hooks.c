/*
 * python/py_hooks.c: hooks/'s Python face: the Scope handle and scopes, giving
 * CUPTI up, the hang watcher, the dump listener, the fork test's locks.
 */
#include "python/py.h"

#include <structmember.h> /* PyMemberDef, T_INT, READONLY */

#include <string.h>     /* strlen */

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

int cd_py_add_scope_type(PyObject *m)
{
    cd_py_state *st = PyModule_GetState(m);
    st->scope_type = (PyTypeObject *)PyType_FromModuleAndSpec(m, &scope_spec, NULL);
    if (!st->scope_type || PyModule_AddType(m, st->scope_type) < 0)
        return -1;
    return 0;
}

/* ---------------------------------------------------------------- scopes -- */

/* scope_open(kind, all_threads, may_drain[, where]) -> (0, Scope, 0 | CUptiResult
 * of a watch opened without CUPTI) | (1, sticky CUresult found by the drain) |
 * (2, CUptiResult, holder) | (3, max depth). */
PyObject *cd_py_scope_open(PyObject *self, PyObject *args)
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
    if (kind != CD_SCOPE_OPT_OUT && !cd_py_cupti_callable()) {
        PyErr_SetString(PyExc_RuntimeError, "CUPTI not loaded, or the driver not initialised");
        return NULL;
    }
    cd_py_state *st = PyModule_GetState(self);
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
                           cd_py_intern_where(where, where_len));
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

PyObject *cd_py_thread_state(PyObject *self, PyObject *noargs)
{
    return PyLong_FromLong(cd_thread_state());
}

PyObject *cd_py_cupti_hand_over(PyObject *self, PyObject *args)
{
    const char *where = NULL;
    Py_ssize_t n = 0;
    if (!PyArg_ParseTuple(args, "|y#", &where, &n))
        return NULL;
    uint32_t w = cd_py_intern_where(where, n);
    int had;
    Py_BEGIN_ALLOW_THREADS
    had = cd_scopes_hand_over(w);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(had);
}

/* cupti_take_back([where]) -> (1 taken back | 0 nothing to take | -CUptiResult, holder). */
PyObject *cd_py_cupti_take_back(PyObject *self, PyObject *args)
{
    const char *where = NULL;
    Py_ssize_t n = 0;
    if (!PyArg_ParseTuple(args, "|y#", &where, &n))
        return NULL;
    if (!cd_py_cupti_callable())
        return Py_BuildValue("(is)", 0, "");
    uint32_t w = cd_py_intern_where(where, n);
    char holder[CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN * 2];
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_scopes_take_back(w, holder, sizeof holder);
    Py_END_ALLOW_THREADS
    holder[sizeof holder - 1] = '\0';
    return Py_BuildValue("(iN)", rc, PyUnicode_DecodeUTF8(holder, (Py_ssize_t)strlen(holder),
                                                          "replace"));
}

PyObject *cd_py_set_launch_hooks(PyObject *self, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    cd_runtime_hooks_want(on);
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- hangs -- */

/* set_hang_after(seconds): the hang watcher's threshold (0: off); the first
 * nonzero one starts its thread. */
CD_PY_ARG(set_hang_after, double, s)
{
    uint64_t ns = s >= 0 && s < 1e9 ? (uint64_t)(s * 1e9) : 0;
    if (!(s >= 0 && s < 1e9) || (s > 0 && ns == 0)) {     /* never 0 (off) by rounding */
        PyErr_SetString(PyExc_ValueError, "hang_after must be 0 (off) or a positive number of seconds");
        return NULL;
    }
    return cd_py_none_or_errno(cd_hang_watch_set(ns));
}

/* hang_state() -> (hang_after_ns, reports written, dump signal installed). */
PyObject *cd_py_hang_state(PyObject *self, PyObject *noargs)
{
    return Py_BuildValue("(KKi)", (unsigned long long)cd_hang_watch_get(),
                         (unsigned long long)cd_hang_reports(), cd_dump_signal());
}

/* ----------------------------------------------------------------- dump -- */

/* dump_listen(rank, world_size): start the dump listener (once per process;
 * rank -1 / world_size 0 unknown); OSError when it cannot listen. */
PyObject *cd_py_dump_listen(PyObject *self, PyObject *args)
{
    int rank, world;
    if (!PyArg_ParseTuple(args, "ii", &rank, &world))
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_dump_server_start(rank, world);
    Py_END_ALLOW_THREADS
    return cd_py_none_or_errno(rc);
}

/* dump_listener() -> (state, name): 1 listening, 0 not started, -errno; the
 * abstract socket name of `pid` (bytes, without the leading NUL). */
CD_PY_ARG(dump_listener, long, pid)
{
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
CD_PY_ARG(dump_document, long, recent)
{
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

/* ----------------------------------------------------------------- fork -- */

/* _test_fork_hold(hold): tests: a thread of ours takes every lock a forked
 * child's handler resets and holds them (True) until given back (False). */
PyObject *cd_py__test_fork_hold(PyObject *self, PyObject *arg)
{
    int hold = PyObject_IsTrue(arg);
    if (hold < 0)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cd_fork_test_hold(hold);
    Py_END_ALLOW_THREADS
    return cd_py_none_or_errno(rc);
}
