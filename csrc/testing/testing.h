/*
 * testing/testing.h: kernels that fault on purpose, embedded as PTX
 * (fault_kernels.cu -> fault_kernels_ptx.h by tools/gen/fault_kernels.py) and
 * launched through the driver like any framework would: cuda_debug.testing,
 * the test suite, the README demo and the latency benchmark use them.
 * A side layer: it calls base/ only.
 */
#ifndef CD_TESTING_H
#define CD_TESTING_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>      /* the C API: PyObject, PyArg_ParseTuple... */

#include "base/base.h"

/* The named embedded kernel on `device` (module loaded on first use; the
 * context must be current). */
int cd_fault_kernel(int device, const char *mangled, CUfunction *out);

/* _core.fault_launch(kind, device, ...) -> CUresult (module.c's table). */
PyObject *cd_py_fault_launch(PyObject *self, PyObject *args, PyObject *kw);

#endif
