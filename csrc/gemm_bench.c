/* gemm_bench.c: placeholder until the GEMM benchmark lands. */
#include "cuda_debug.h"

PyObject *cd_py_gemm(PyObject *self, PyObject *args, PyObject *kw)
{
    PyErr_SetString(PyExc_NotImplementedError, "gemm benchmark not built yet");
    return NULL;
}

PyObject *cd_py_launch_latency(PyObject *self, PyObject *args, PyObject *kw)
{
    PyErr_SetString(PyExc_NotImplementedError, "launch latency benchmark not built yet");
    return NULL;
}
