/*
 * python/py_capture.c: capture/'s Python face: the frames and the user-frame
 * rule, the watch ring, graphs, every stream's oldest unfinished launch, the
 * stderr tee and the driver log.
 */
#include "python/py.h"

#include <dlfcn.h>      /* dlopen, RTLD_LAZY, RTLD_NOLOAD, ... */

/* --------------------------------------------------------------- frames -- */

/* configure_frames(library_prefixes, user_pseudo): the folders of library
 * code and the pseudo-files of user code (the first call wins). */
PyObject *cd_py_configure_frames(PyObject *self, PyObject *args)
{
    PyObject *libs, *pseudo;
    const char **lib_v, **pseudo_v;
    int n_libs, n_pseudo;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &libs, &PyList_Type, &pseudo))
        return NULL;
    if (cd_py_str_lists(libs, &lib_v, &n_libs, pseudo, &pseudo_v, &n_pseudo) < 0)
        return NULL;
    cd_frames_configure(lib_v, n_libs, pseudo_v, n_pseudo);
    PyMem_Free(lib_v);
    PyMem_Free(pseudo_v);
    Py_RETURN_NONE;
}

/* file_kind(filename) -> LOC_USER | LOC_LIBRARY | LOC_PSEUDO: the one
 * user-frame rule (capture/frames.c), as the C fault path applies it. */
PyObject *cd_py_file_kind(PyObject *self, PyObject *arg)
{
    if (!PyUnicode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "file_kind() takes a str");
        return NULL;
    }
    /* The bytes frames.c keeps of a code object's file name. */
    char file[CD_NAME_MAX];
    size_t n = cd_frames_copy_name(arg, file, sizeof file);
    return PyLong_FromLong(cd_file_kind(file, n));
}

/* code_kind(code) -> LOC_USER | LOC_LIBRARY | LOC_PSEUDO | LOC_COMPILED: the
 * kind the launch callback gives this code object's frames. */
PyObject *cd_py_code_kind(PyObject *self, PyObject *arg)
{
    if (!PyCode_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "code_kind() takes a code object");
        return NULL;
    }
    return PyLong_FromLong(cd_code_kind(arg));
}

/* location(id) -> (filename, function, lineno, kind) or None */
CD_PY_ARG(location, unsigned long, id)
{
    cd_location loc;
    if (id > UINT32_MAX || cd_location_get((uint32_t)id, &loc) != 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(NNii)", cd_py_interned_filename(loc.file),
                         cd_py_interned_str(loc.func), loc.lineno, loc.kind);
}

/* _check_debug_offsets(table) -> None, or why the frame reader would refuse
 * this copy of _Py_DebugOffsets (tests feed it corrupted copies). */
PyObject *cd_py__check_debug_offsets(PyObject *self, PyObject *arg)
{
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
PyObject *cd_py__debug_offsets(PyObject *self, PyObject *unused)
{
    const void *t;
    size_t n = cd_reader_live_table(&t);
    if (!t || !n)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize(t, (Py_ssize_t)n);
}

/* _line_of(code, lasti) -> the line frames.c records for instruction lasti
 * (code units) of a code object (tests compare it with co_lines()). */
PyObject *cd_py__line_of(PyObject *self, PyObject *args)
{
    PyObject *code;
    int lasti;
    if (!PyArg_ParseTuple(args, "O!i", &PyCode_Type, &code, &lasti))
        return NULL;
    return PyLong_FromLong(cd_reader_line(code, lasti));
}

/* _frame_walk() -> [(code, lasti)] of the calling thread, innermost first,
 * as the launch callback reads them (tests compare it with sys._getframe). */
PyObject *cd_py__frame_walk(PyObject *self, PyObject *unused)
{
    PyObject *out = PyList_New(0);
    int depth = 0;
    for (void *f = cd_reader_first(); out && f && depth < 1024; f = cd_reader_next(f), depth++) {
        int lasti = 0;
        PyObject *code = cd_reader_code(f, &lasti);
        if (!code)
            continue;
        cd_py_append(&out, Py_BuildValue("(Oi)", code, lasti));
    }
    return out;
}

/* frames_stop(): the atexit hook registered at import (before the interpreter
 * frees thread states, frame reads stop). */
PyObject *cd_py_frames_stop(PyObject *self, PyObject *noargs)
{
    Py_BEGIN_ALLOW_THREADS
    cd_frames_stop();
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- watch -- */

PyObject *cd_py_watch_seq(PyObject *self, PyObject *noargs)
{
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
                         cd_watch_context_device(r->ctx), cd_py_ids_tuple(r->frames, r->n_frames),
                         (int)r->flags, (int)r->cbid, PyBool_FromLong(done == 1), r->op,
                         (int)r->graph, (int)r->origin);
}

/* watch_record(seq) -> record tuple, or None when gone. */
CD_PY_ARG(watch_record, unsigned long long, seq)
{
    cd_watch_record r;
    if (cd_watch_get(seq, &r) != 0)
        Py_RETURN_NONE;
    return record_tuple(seq, &r, cd_watch_done(&r, seq));
}

/* watch_streams(since) -> [(stream, tid, last_done, open, newest, pending,
 * after, (candidate seq, ...))]: per stream with launches after `since` not
 * known to have finished, by first candidate (capture/watch_ring.c,
 * cd_watch_scan). Host memory only. */
CD_PY_ARG(watch_streams, unsigned long long, since)
{
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
CD_PY_ARG(set_watch_markers, long, every)
{
    if (every < 1 || every > 65536) {
        PyErr_SetString(PyExc_ValueError, "markers every 1 to 65536 launches");
        return NULL;
    }
    cd_gate_watch_every((unsigned)every);
    Py_RETURN_NONE;
}

/* set_op(token): this thread's current op for watch(ops=True); 0 clears. Per
 * PyTorch op while recording ops: a thread-local store, nothing else. */
PyObject *cd_py_set_op(PyObject *self, PyObject *arg)
{
    unsigned long v = PyLong_AsUnsignedLongMask(arg);
    if (v == (unsigned long)-1 && PyErr_Occurred())
        return NULL;
    cd_watch_set_op((uint32_t)v);
    Py_RETURN_NONE;
}

/* --------------------------------------------------------------- graphs -- */

/* (status, capture, [node]) of a graph replay: its unfinished nodes (CD_GRAPH_*
 * status; capture -1 unknown; the nodes for graph_node), or NULL. */
static PyObject *unfinished_tuple(const cd_watch_record *r)
{
    uint32_t nodes[64];
    int status, capture;
    int n = cd_graph_unfinished(r, nodes, 64, &status, &capture);
    PyObject *list = cd_py_ids_list(nodes, n);
    return list ? Py_BuildValue("(iiN)", status, capture, list) : NULL;
}

/* graph_replay(seq) -> None (gone, or not a graph launch), or (status,
 * capture, [node]): the replay's unfinished nodes (CD_GRAPH_* status; capture
 * -1 unknown; the nodes for graph_node). Host memory only. */
CD_PY_ARG(graph_replay, unsigned long long, seq)
{
    cd_watch_record r;
    if (cd_watch_get(seq, &r) != 0 || !(r.flags & CD_WATCH_GRAPH))
        Py_RETURN_NONE;
    return unfinished_tuple(&r);
}

/* graph_node(node) -> (record tuple, index in its capture, collective or None,
 * tools id, innermost frame ids) or None (the collective: an NCCL kernel's,
 * inflight.c; the tools id: the driver's id of the node, 0 unknown; the frames:
 * the capturing thread's innermost, of any kind, innermost first). */
CD_PY_ARG(graph_node, unsigned long, g)
{
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
                         cd_graph_node_tools_id((uint32_t)g), cd_py_ids_tuple(deep, n_deep));
}

/* graph_capture(c) -> (capture id, kernel nodes, multi_stream, unmarked, state,
 * every, token, (executable ids for tools)) or None. */
CD_PY_ARG(graph_capture, long, c)
{
    cd_graph_capture_info k;
    if (c < 0 || c > INT32_MAX || cd_graph_capture((int)c, &k) != 0)
        Py_RETURN_NONE;
    return Py_BuildValue("(KIiIiII(IIII))", (unsigned long long)k.id, k.n_nodes, k.multi_stream,
                         k.unmarked, k.state, k.every, k.token, k.exec_ids[0], k.exec_ids[1],
                         k.exec_ids[2], k.exec_ids[3]);
}

PyObject *cd_py_graph_stats(PyObject *self, PyObject *noargs)
{
    cd_graph_counters g;
    cd_graph_stats(&g);
    cd_subscription_counts sub;
    cd_subscription_stats(&sub);
    return Py_BuildValue(
        "{sKsKsKsKsKsisisisisKsisisisisIsIsIsK}", "nodes_marked",
        (unsigned long long)g.nodes_marked, "nodes_unmarked", (unsigned long long)g.nodes_unmarked,
        "nodes_recorded", (unsigned long long)g.nodes_recorded, "captures_untracked",
        (unsigned long long)g.captures_untracked, "captures_freed",
        (unsigned long long)g.captures_freed, "captures", g.captures, "chunks_used",
        g.chunks_used, "chunks", g.chunks, "contexts", cd_watch_contexts_live(),
        "graph_ids_refused", (unsigned long long)sub.graph_ids_refused,
        "clear_rc", g.clear_rc, "write_rc", g.write_rc, "kernel_rc", g.kernel_rc, "adopt_rc",
        g.adopt_rc, "execs", g.execs, "execs_refused", g.execs_refused, "exec_reach",
        g.exec_reach, "adopt_events", (unsigned long long)g.adopt_events);
}

/* Following a capture made while nothing watched (capture/graph_adopt.c): a
 * trace function on the capturing thread, from the capture's beginning to its
 * end, that hands each event of a user frame to cd_graph_adopt_event. Library
 * frames cost a code-kind lookup (the code objects' table: ~0.1 us). */
static int adopt_trace(PyObject *obj, PyFrameObject *frame, int what, PyObject *arg)
{
    int event = what == PyTrace_CALL ? CD_ADOPT_CALL : what == PyTrace_LINE ? CD_ADOPT_LINE
              : what == PyTrace_RETURN ? CD_ADOPT_RETURN : -1;
    if (event < 0)
        return 0;
    PyCodeObject *code = PyFrame_GetCode(frame);
    int kind = cd_code_kind_cached(code);
    Py_DECREF(code);
    if (kind == CD_LOC_USER && cd_graph_adopt_event(event) < 0)
        PyEval_SetTrace(NULL, NULL);            /* the capture is over */
    return 0;
}

static int adopt_tracing(void) { return PyThreadState_Get()->c_tracefunc == adopt_trace; }

/* graph_adopt_follow(stream, why) -> 0 following, -1 not (why: ADOPT_LINE_*,
 * recorded for its nodes), -2 the capture is tracked. At the beginning of a
 * capture (the stream capturing), on the capturing thread; no other tracer. */
PyObject *cd_py_graph_adopt_follow(PyObject *self, PyObject *args)
{
    unsigned long long s;
    int why, rc;
    if (!PyArg_ParseTuple(args, "Ki", &s, &why))
        return NULL;
    if (!why && PyThreadState_Get()->c_tracefunc && !adopt_tracing())
        why = CD_ADOPT_LINE_TRACED;
    if (adopt_tracing())
        PyEval_SetTrace(NULL, NULL);            /* an older capture's, never ended */
    rc = cd_driver_ready() == 0 ? cd_graph_adopt_follow((CUstream)(uintptr_t)s, why)
                                : cd_graph_adopt_follow(NULL, CD_ADOPT_LINE_UNSEEN);
    if (rc == 0)
        PyEval_SetTrace(adopt_trace, NULL);
    return PyLong_FromLong(rc);
}

CD_PY_ARG(graph_node_line, unsigned long, g)
{
    return PyLong_FromLong(g > UINT32_MAX ? CD_ADOPT_LINE_OWN : cd_graph_node_line((uint32_t)g));
}

/* graph_adopt(stream) -> token (0: not read, -1: no room): a graph captured while
 * nothing watched, at the end of its capture (the stream still capturing). */
CD_PY_ARG(graph_adopt, unsigned long long, s)
{
    long token;
    if (adopt_tracing())
        PyEval_SetTrace(NULL, NULL);
    else
        cd_graph_adopt_lost();                  /* another tracer took over: lines since unknown */
    Py_BEGIN_ALLOW_THREADS
    token = cd_driver_ready() == 0 ? cd_graph_adopt((CUstream)(uintptr_t)s) : 0;
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(token);
}

/* graph_adopt_exec(token, exec) -> bool; graph_adopt_drop(token). */
PyObject *cd_py_graph_adopt_exec(PyObject *self, PyObject *args)
{
    unsigned token;
    unsigned long long exec;
    if (!PyArg_ParseTuple(args, "IK", &token, &exec))
        return NULL;
    return PyBool_FromLong(cd_graph_adopt_exec(token, (CUgraphExec)(uintptr_t)exec) == 0);
}

CD_PY_ARG(graph_adopt_drop, unsigned long, token)
{
    cd_graph_adopt_drop((uint32_t)token);
    Py_RETURN_NONE;
}

/* graph_release_exec(exec) -> bool: an executable Python saw go (its
 * torch.cuda.CUDAGraph freed or reset): its capture's hold on its markers. */
CD_PY_ARG(graph_release_exec, unsigned long long, exec)
{
    return PyBool_FromLong(cd_graph_release_exec((CUgraphExec)(uintptr_t)exec) == 0);
}

/* graph_exec_token(exec) -> the token of the capture an executable runs, 0 unknown. */
CD_PY_ARG(graph_exec_token, unsigned long long, exec)
{
    return PyLong_FromUnsignedLong(cd_graph_exec_token((CUgraphExec)(uintptr_t)exec));
}

/* ------------------------------------------------------------ in flight -- */

/* in_flight() -> ([(seq, stream, kernel, short, collective, thread_id, device,
 * frames, flags, age_ns, queued, last_seq, cbid, candidates, open_seq, graph)],
 * (newest_age_ns, scanned)): every stream's oldest unfinished launch, oldest first (host
 * memory only); graph: None, or for a graph replay (status, capture, [node]),
 * the nodes of its graph still running (graph_replay's). */
PyObject *cd_py_in_flight(PyObject *self, PyObject *noargs)
{
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
        PyObject *graph = r->flags & CD_WATCH_GRAPH ? unfinished_tuple(r) : Py_NewRef(Py_None);
        if (!graph) {
            Py_CLEAR(out);
            break;
        }
        PyObject *v = Py_BuildValue(
            "(KKy" "sNiiNiKIKiIKN)", (unsigned long long)r->seq, (unsigned long long)r->stream,
            k ? k : "", ks ? ks : "",
            cl ? PyUnicode_DecodeUTF8(coll, (Py_ssize_t)cl, "replace") : Py_NewRef(Py_None),
            (int)r->thread_id, cd_watch_context_device(r->ctx),
            cd_py_ids_tuple(r->frames, r->n_frames), (int)r->flags,
            (unsigned long long)(sum.now_ns > r->t_ns ? sum.now_ns - r->t_ns : 0),
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

/* ---------------------------------------------------- stderr, driver log -- */

PyObject *cd_py_recent_asserts(PyObject *self, PyObject *noargs)
{
    char buf[16384];
    size_t n = cd_tee_recent_asserts(buf, sizeof buf);
    return PyBytes_FromStringAndSize(buf, (Py_ssize_t)n);
}

/* asserts_for(kernel) -> (bytes, level): the device-assert lines kept that
 * belong best to `kernel`, and how (ASSERT_NONE: none; ASSERT_GENERIC, _FITS,
 * _NAMES: capture/capture.h). */
PyObject *cd_py_asserts_for(PyObject *self, PyObject *arg)
{
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
/* assert_affinity(text, kernel) -> how many of the assert lines' file and
 * message words the kernel's name holds (capture/stderr_tee.c). */
PyObject *cd_py_assert_affinity(PyObject *self, PyObject *args)
{
    const char *text, *kernel;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y#s", &text, &n, &kernel))
        return NULL;
    return PyLong_FromLong(cd_tee_text_affinity(text, (size_t)n, kernel));
}

/* assert_function(text) -> the function the first assert line names, or None
 * (none, a lambda's operator(), Triton's unknown). */
PyObject *cd_py_assert_function(PyObject *self, PyObject *arg)
{
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

/* coverage_gaps() -> [(number, why, from_seq, to_seq, from_where, to_where,
 * hooks_recording, closed)], oldest first (capture/coverage.c). */
PyObject *cd_py_coverage_gaps(PyObject *self, PyObject *noargs)
{
    cd_gap g[CD_GAPS];
    int n = cd_coverage_gaps(g, CD_GAPS, NULL);
    PyObject *out = PyList_New(0);
    for (int i = 0; out && i < n; i++)
        cd_py_append(&out, Py_BuildValue("(IiKKNNii)", g[i].number, (int)g[i].why,
                                         (unsigned long long)g[i].from_seq,
                                         (unsigned long long)g[i].to_seq,
                                         cd_py_interned_filename(g[i].from_where),
                                         cd_py_interned_filename(g[i].to_where),
                                         (int)g[i].hooks_recording, (int)g[i].closed));
    return out;
}

PyObject *cd_py_seen_finished(PyObject *self, PyObject *args)
{
    unsigned long long seq, before;
    if (!PyArg_ParseTuple(args, "KK", &seq, &before))
        return NULL;
    cd_watch_record r;
    if (cd_watch_get(seq, &r) != 0)
        Py_RETURN_FALSE;
    return PyBool_FromLong(cd_watch_seen_finished(r.kernel, before));
}

PyObject *cd_py_assert_level(PyObject *self, PyObject *args)
{
    const char *text, *kernel;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "y#s", &text, &n, &kernel))
        return NULL;
    return PyLong_FromLong(cd_tee_text_level(text, (size_t)n, kernel, NULL));
}

PyObject *cd_py_install_tee(PyObject *self, PyObject *noargs)
{
    return PyLong_FromLong(cd_tee_install());
}

/* stderr_references(path) -> how many of the loaded library's relocations
 * bind libc's `stderr` (where the tee can be put), -1 when it is not loaded. */
PyObject *cd_py_stderr_references(PyObject *self, PyObject *arg)
{
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

/* driver_log(from, to) -> [bytes]: the driver-log lines [from, to) still kept. */
PyObject *cd_py_driver_log(PyObject *self, PyObject *args)
{
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
        cd_py_append(&out, PyBytes_FromStringAndSize(line, len));
    }
    return out;
}
