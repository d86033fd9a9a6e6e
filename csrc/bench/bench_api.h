/*
 * bench/bench_api.h: the benchmark's Python-facing functions, for module.c's
 * method table (the rest of bench/ is private to it: bench.h). A side layer:
 * bench/ calls base/ and testing/ only.
 */
#ifndef CD_BENCH_API_H
#define CD_BENCH_API_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>      /* the C API: PyObject, PyArg_ParseTuple... */

#include "base/base.h"

PyObject *cd_py_gemm(PyObject *self, PyObject *args, PyObject *kw);
PyObject *cd_py_launch_latency(PyObject *self, PyObject *args, PyObject *kw);
PyObject *cd_py_gemm_types(PyObject *self, PyObject *unused);
PyObject *cd_py_bench_release(PyObject *self, PyObject *arg);
PyObject *cd_py_mem_info(PyObject *self, PyObject *arg);
/* A forked child: bench_lock free (base.h: CD_FORK_*); handed to cd_fork_init. */
void cd_bench_fork(int op);

#endif
