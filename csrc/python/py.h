/*
 * python/py.h: the Python face of the C core, one file a layer below, each a
 * thin binding that only converts values (Python owns the API, the layers the
 * behaviour: csrc/README.md). The lists here name every function of a face
 * once: module.c makes the method table of cuda_debug._core from them, this
 * header declares them. Nothing below calls up into this folder.
 *
 *   py_base.c     the loader, devices, options, counters, strings; and the
 *                 conversions every face shares (below)
 *   py_capture.c  frames, the watch ring, graphs, in-flight launches, the
 *                 stderr tee, the driver log
 *   py_report.c   fault records, the C fault path's texts, the dump signal
 *   py_hooks.c    the Scope handle and scopes, the hang watcher, the dump
 *                 listener
 *   py_replay.c   the Sanitizer replay and the hook that asks Python
 *
 * (bench/ and testing/ keep their few Python-facing functions beside their
 * C: bench/bench_api.h, testing/testing.h.)
 */
#ifndef CD_PY_H
#define CD_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>      /* the C API: PyObject, PyArg_ParseTuple... */

#include "hooks/hooks.h"         /* hooks/ and, through it, report/, capture/, base/ */
#include "replay/replay.h"       /* the replay's Sanitizer API side */

/* ------------------------------------------------------------ the faces -- */

/* X(name, kind, doc): _core.name is cd_py_name, called as kind says (NOARGS,
 * O, VARARGS, KEYWORDS: METH_VARARGS | METH_KEYWORDS, FASTCALL). */
#define CD_PY_BASE(X) \
    X(load_library, VARARGS, "load_library(lib, sonames, paths) -> (loaded, path, how, error)") \
    X(driver_init, NOARGS, "cuInit(0) once -> CUresult") \
    X(driver_version, NOARGS, "cuDriverGetVersion or None") \
    X(cupti_version, NOARGS, "cuptiGetVersion or None") \
    X(device_count, NOARGS, "-> (CUresult, count)") \
    X(device_info, VARARGS, "device_info(ordinal) -> tuple or CUresult") \
    X(synchronize, VARARGS, "synchronize(device) -> CUresult") \
    X(error_string, O, "cuGetErrorString text or None") \
    X(last_call, NOARGS, "this thread's last failed CUDA call, or None") \
    X(set_options, KEYWORDS, "the CUDA_DEBUG_* switches") \
    X(cupti_result_string, O, "CUPTI result text") \
    X(demangle, O, "demangle a C++ symbol, or None") \
    X(short_kernel_name, O, "the short readable name of a kernel") \
    X(stats, NOARGS, "launch-hook counters") \
    X(kernel_origin, O, "kernel_origin(name) -> ORIGIN_* by the kernel's name")

#define CD_PY_CAPTURE(X) \
    X(configure_frames, VARARGS, "configure_frames(library_prefixes, user_pseudo)") \
    X(file_kind, O, "file_kind(filename) -> LOC_USER | LOC_LIBRARY | LOC_PSEUDO") \
    X(code_kind, O, "code_kind(code) -> LOC_USER | LOC_LIBRARY | LOC_PSEUDO | LOC_COMPILED") \
    X(_check_debug_offsets, O, "tests: why a _Py_DebugOffsets copy is refused, or None") \
    X(_debug_offsets, NOARGS, "tests: the live _Py_DebugOffsets bytes the reader reads") \
    X(_line_of, VARARGS, "tests: _line_of(code, lasti) -> line, from the line table") \
    X(_frame_walk, NOARGS, "tests: [(code, lasti)] of this thread, through the reader") \
    X(location, O, "location(id) -> (filename, function, lineno, kind) or None") \
    X(driver_log, VARARGS, "driver_log(from, to) -> [bytes]") \
    X(watch_seq, NOARGS, "launches put in the watch ring so far") \
    X(watch_record, O, "watch_record(seq) -> record tuple or None") \
    X(seen_finished, VARARGS, "seen_finished(seq, before) -> did a launch of record seq's kernel " \
      "before launch `before` finish") \
    X(watch_streams, O, "watch_streams(since) -> [per-stream scan]: launches not known finished") \
    X(set_watch_markers, O, "set_watch_markers(every): a marker behind every every-th launch " \
      "of a stream") \
    X(graph_replay, O, "graph_replay(seq) -> (status, capture, [node]) or None") \
    X(graph_node, O, "graph_node(node) -> (record tuple, index, collective) or None") \
    X(graph_capture, O, "graph_capture(c) -> (id, nodes, multi_stream, unmarked, state)") \
    X(graph_stats, NOARGS, "graph-marker and context-table counters") \
    X(graph_adopt, O, "graph_adopt(stream) -> token: a graph captured before watching") \
    X(graph_adopt_exec, VARARGS, "graph_adopt_exec(token, exec) -> bool") \
    X(graph_adopt_follow, VARARGS, "graph_adopt_follow(stream, why) -> 0 following the " \
      "capture's lines, -1 not, -2 tracked") \
    X(graph_node_line, O, "graph_node_line(node) -> ADOPT_LINE_*: its line is its launch's, " \
      "or why not") \
    X(graph_adopt_drop, O, "graph_adopt_drop(token): an adopted capture no executable holds") \
    X(graph_release_exec, O, "graph_release_exec(exec) -> bool: an executable is gone") \
    X(graph_exec_token, O, "graph_exec_token(exec) -> the token of its capture, 0 unknown") \
    X(recent_asserts, NOARGS, "the latest device-assert lines written to stderr") \
    X(assert_level, VARARGS, "assert_level(text, kernel) -> how the assert lines belong to it") \
    X(assert_affinity, VARARGS, "assert_affinity(text, kernel) -> file/message words the " \
      "kernel's name holds") \
    X(assert_function, O, "assert_function(text) -> the function an assert line names, or None") \
    X(coverage_gaps, NOARGS, "coverage_gaps() -> [(number, why, from_seq, to_seq, from_where, " \
      "to_where, hooks_recording, closed)]") \
    X(asserts_for, O, "asserts_for(kernel) -> (the assert lines kept that belong best to it, " \
      "ASSERT_* level)") \
    X(set_op, O, "set_op(token): this thread's current op for watch(ops=True)") \
    X(install_tee, NOARGS, "install the pass-through stderr (once) -> 0 ok") \
    X(in_flight, NOARGS, "every stream's oldest unfinished launch -> ([record], " \
      "(newest_age_ns, scanned))") \
    X(stderr_references, O, "stderr_references(path) -> libc stderr slots of a loaded library") \
    X(frames_stop, NOARGS, "stop reading Python frames (atexit, before thread states go)")

#define CD_PY_REPORT(X) \
    X(configure, KEYWORDS, "texts and switches for the C fault path") \
    X(fault_seq, NOARGS, "number of faults recorded") \
    X(faults, O, "faults(since) -> [raw fault record]") \
    X(report_watch_culprit, VARARGS, "write the watch culprit block to fd 2 (once)") \
    X(verdict, VARARGS, "verdict(candidates, text, hint) -> (order, named, by_hint, by_words, " \
      "reordered, ruled_out, function): which launch is guilty (report/verdict.c)") \
    X(set_raise_hook, O, "set_raise_hook(fn | None): what on_raise calls once it matters") \
    X(on_raise, FASTCALL, "sys.monitoring's RAISE callback: the verdict onto CUDA errors") \
    X(sticky_seen, O, "sticky_seen(set) -> has a sticky fault been seen in this process") \
    X(dump_set_extra, O, "dump_set_extra(json bytes): the flight recorder, in every dump") \
    X(install_dump_signal, VARARGS, "install_dump_signal(signum, python_has_it, " \
      "python_has_sigint): the in-flight report on a signal") \
    X(_test_report_pause, O, "tests: the watch block from a call pauses this long before it is " \
      "written")

#define CD_PY_HOOKS(X) \
    X(scope_open, VARARGS, "scope_open(kind, all_threads) -> (status, Scope | code[, holder])") \
    X(thread_state, NOARGS, "this thread's scope state: +1 block, -1 opted out, 0") \
    X(cupti_hand_over, VARARGS, "cupti_hand_over([where]): give CUPTI up to a starting " \
      "profiler -> was it held") \
    X(cupti_take_back, VARARGS, "cupti_take_back([where]) -> (1 taken | 0 not needed | " \
      "-CUptiResult, holder): CUPTI back after a profiler") \
    X(set_launch_hooks, O, "set_launch_hooks(on): CUDA_DEBUG_LAUNCH_HOOKS as Python reads it") \
    X(set_hang_after, O, "set_hang_after(seconds): the hang watcher's threshold, 0 off") \
    X(hang_state, NOARGS, "-> (hang_after_ns, reports, dump signal)") \
    X(dump_listen, VARARGS, "dump_listen(rank, world_size): answer `cuda-debug dump PID`") \
    X(dump_listener, O, "dump_listener(pid) -> (state, abstract socket name)") \
    X(dump_document, O, "dump_document(recent) -> the in-flight document (JSON bytes)") \
    X(_test_fork_hold, O, "tests: hold (True) or give back (False) every lock a forked child " \
      "resets, from a thread of ours")

#define CD_PY_REPLAY(X) \
    X(replay_load, O, "replay_load(path) -> (ok, error): open libsanitizer-public.so") \
    X(replay_unsubscribe, NOARGS, "give the Sanitizer subscription up -> rc") \
    X(replay_result_string, O, "a SanitizerResult's text, or None") \
    X(replay_status, NOARGS, "replay counters: (launches, seen, results, violated, " \
      "failed_launches, allocs, frees, live_allocs, contexts, driver_rc, first_instrumented)") \
    X(replay_at, NOARGS, "what the culprit's launch number was, or None") \
    X(replay_watching, O, "replay_watching(+1 | -1): the script entered / left watch()") \
    X(replay_results, NOARGS, "the instrumented launches, each a tuple") \
    X(replay_allocations, NOARGS, "the Sanitizer's allocation table: [(address, size, flags, " \
      "cbid)]") \
    X(replay_module_image, O, "replay_module_image(launch) -> the cubin of an instrumented " \
      "launch's module (bytes), or None when it was not kept") \
    X(replay_image_stats, NOARGS, "module images kept: (count, bytes)") \
    X(replay_subscribe, KEYWORDS, "subscribe the Sanitizer API for a replay -> 0 or rc")

/* bench/ and testing/ keep theirs beside their C (bench/bench_api.h,
 * testing/testing.h declare them). */
#define CD_PY_BESIDE(X) \
    X(fault_launch, KEYWORDS, "launch an embedded test kernel -> CUresult") \
    X(gemm, KEYWORDS, "cuBLAS GEMM timing loop") \
    X(launch_latency, KEYWORDS, "empty-kernel launch timing loop") \
    X(gemm_types, NOARGS, "((storage name, element bytes), ...)") \
    X(bench_release, O, "free the benchmark's cached buffers") \
    X(mem_info, O, "mem_info(device) -> (CUresult, free, total)")

#define CD_PY_FACES(X) CD_PY_BASE(X) CD_PY_CAPTURE(X) CD_PY_REPORT(X) CD_PY_HOOKS(X) \
    CD_PY_REPLAY(X)

#define CD_PY_SIGNATURE_NOARGS(name) PyObject *cd_py_##name(PyObject *self, PyObject *unused)
#define CD_PY_SIGNATURE_O(name) PyObject *cd_py_##name(PyObject *self, PyObject *arg)
#define CD_PY_SIGNATURE_VARARGS(name) PyObject *cd_py_##name(PyObject *self, PyObject *args)
#define CD_PY_SIGNATURE_KEYWORDS(name) \
    PyObject *cd_py_##name(PyObject *self, PyObject *args, PyObject *kw)
#define CD_PY_SIGNATURE_FASTCALL(name) \
    PyObject *cd_py_##name(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
#define CD_PY_DECLARE(name, kind, doc) CD_PY_SIGNATURE_##kind(name);
CD_PY_FACES(CD_PY_DECLARE)
#undef CD_PY_DECLARE

/* The module's state (PEP 489): the Python objects the C core holds. */
typedef struct {
    PyTypeObject *scope_type;
} cd_py_state;

/* py_hooks.c: the Scope type, made for module m and kept in its state: 0, or -1. */
int cd_py_add_scope_type(PyObject *m);

/* ---------------------------------------------------- the conversions -- */

/* "O&" converters: 1 with *out set, 0 with the exception set, reading as
 * PyLong_AsUnsignedLongLong, PyLong_AsUnsignedLong, PyLong_AsLong and
 * PyFloat_AsDouble do (OverflowError for a value out of range). */
int cd_py_ull(PyObject *o, void *out);
int cd_py_ulong(PyObject *o, void *out);
int cd_py_long(PyObject *o, void *out);
int cd_py_double(PyObject *o, void *out);
#define CD_PY_CONVERTER(p) _Generic((p), unsigned long long *: cd_py_ull, \
                                         unsigned long *: cd_py_ulong,    \
                                         long *: cd_py_long,              \
                                         double *: cd_py_double)

/* A METH_O face whose one argument arrives converted (as Argument Clinic's
 * parsing wrapper hands its _impl the C value):
 *     CD_PY_ARG(faults, unsigned long long, since) { ...since... }  */
#define CD_PY_ARG(name, type, var)                                                 \
    static PyObject *cd_py_##name##_impl(type var);                                \
    CD_PY_SIGNATURE_O(name)                                                        \
    {                                                                              \
        type var;                                                                  \
        return CD_PY_CONVERTER(&var)(arg, &var) ? cd_py_##name##_impl(var) : NULL; \
    }                                                                              \
    static PyObject *cd_py_##name##_impl(type var)

/* The texts of two lists of str (each a NULL-ended array of pointers into
 * the list's own objects, valid while it lives): 0, PyMem_Free both after;
 * -1 with nothing to free. */
int cd_py_str_lists(PyObject *a, const char ***a_v, int *n_a, PyObject *b, const char ***b_v,
                    int *n_b);
/* Appends item (a new reference, or NULL) to *list and drops it; *list is
 * cleared when item is NULL or the append fails. */
void cd_py_append(PyObject **list, PyObject *item);
/* None when rc is 0, else OSError(rc) (NULL). */
PyObject *cd_py_none_or_errno(int rc);
/* (id, ...) and [id, ...] of n uint32 ids. */
PyObject *cd_py_ids_tuple(const uint32_t *ids, int n);
PyObject *cd_py_ids_list(const uint32_t *ids, int n);
/* An interned string (base/intern.c) as str, or None; a file name as
 * os.fsdecode spells it (surrogateescape). */
PyObject *cd_py_interned_str(uint32_t id);
PyObject *cd_py_interned_filename(uint32_t id);
/* An interned "file:line" from bytes (0 for NULL or empty). */
uint32_t cd_py_intern_where(const char *w, Py_ssize_t n);
/* CUPTI may be called only once the driver initialised. */
int cd_py_cupti_callable(void);

#endif
