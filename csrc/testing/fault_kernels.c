/*
 * testing/fault_kernels.c: launch the embedded PTX kernels (fault_kernels.cu)
 * through the driver, asynchronously, like any framework would. Used by
 * cuda_debug.testing, the test suite, the README demo and the latency bench.
 */
#include "testing/testing.h"
#include "testing/fault_kernels_ptx.h"   /* cd_fault_kernels_ptx, CD_KERNEL_* (generated) */

#include <string.h>     /* strcmp */

/* Per-device module and scratch buffer; guarded by the GIL (created from
 * Python-facing calls only, before the GIL is released for the launch). */
static struct {
    CUmodule module;
    CUdeviceptr scratch;       /* 256 bytes: class indices for check_index */
    unsigned long long ctx_id; /* the context they belong to (cuCtxGetId; 0 unknown) */
} per_device[CD_MAX_DEVICES];

#define SCRATCH_BYTES 256       /* the per-device buffer (write_past writes past its end) */
#define N_INDICES 32
#define N_CLASSES 5
#define BAD_THREAD 3           /* idx[3] is out of range: thread [3,0,0] asserts */

/* The device's primary context must be current. After a reset of that
 * context (cudaDeviceReset: a new context behind the same pointer, with a
 * new id) the old module and buffer are gone with it: loaded again. */
static int ensure_module(int device)
{
    int rc;
    unsigned long long id = 0;
    if (cd_drv.cuCtxGetId && cd_drv.cuCtxGetId(NULL, &id) != CUDA_SUCCESS)
        id = 0;
    if (per_device[device].module && per_device[device].ctx_id == id)
        return 0;
    CUmodule mod;
    if ((rc = CU_CHECK(cd_drv.cuModuleLoadData(&mod, cd_fault_kernels_ptx))))
        return rc;
    CUdeviceptr buf;
    if ((rc = CU_CHECK(cd_drv.cuMemAlloc(&buf, SCRATCH_BYTES)))) {
        cd_drv.cuModuleUnload(mod);
        return rc;
    }
    int idx[N_INDICES];
    for (int i = 0; i < N_INDICES; i++)
        idx[i] = i % N_CLASSES;
    idx[BAD_THREAD] = N_CLASSES + 2;
    if ((rc = CU_CHECK(cd_drv.cuMemcpyHtoD(buf, idx, sizeof idx)))) {
        cd_drv.cuMemFree(buf);
        cd_drv.cuModuleUnload(mod);
        return rc;
    }
    per_device[device].module = mod;
    per_device[device].scratch = buf;
    per_device[device].ctx_id = id;
    return 0;
}

int cd_fault_kernel(int device, const char *mangled, CUfunction *out)
{
    int rc = ensure_module(device);
    if (rc)
        return rc;
    return CU_CHECK(cd_drv.cuModuleGetFunction(out, per_device[device].module, mangled));
}

/* _core.fault_launch(kind, device=0, stream=0, arg=0) -> CUresult of the launch.
 * kinds: assert, illegal_address, trap, misaligned, bad_config (non-sticky:
 * 4096 threads per block), empty, spin (arg = nanoseconds), write_past (a
 * store arg bytes past the end of the 256-byte scratch buffer). Returns without
 * waiting: the fault, if any, happens on the device later. */
PyObject *cd_py_fault_launch(PyObject *self, PyObject *args, PyObject *kw)
{
    (void)self;
    static char *kwlist[] = {"kind", "device", "stream", "arg", NULL};
    const char *kind;
    int device = 0;
    unsigned long long stream = 0;
    long long arg = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "s|iKL", kwlist, &kind, &device, &stream, &arg))
        return NULL;
    if (device < 0 || device >= CD_MAX_DEVICES)
        return PyLong_FromLong(CUDA_ERROR_INVALID_DEVICE);
    if (!cd_libs[CD_LIB_CUDA].handle)
        return PyLong_FromLong(CUDA_ERROR_NOT_INITIALIZED);

    const char *sym;
    unsigned block = 32;
    int n = N_INDICES, limit = N_CLASSES;
    CUdeviceptr ptr = 0, null_base = 0;
    char *misaligned = NULL;
    long long offset = 64, ns = arg;
    void *params[3] = {NULL, NULL, NULL};

    if (!strcmp(kind, "assert") || !strcmp(kind, "bad_config")) {
        sym = CD_KERNEL_CHECK_INDEX;
        params[0] = &ptr; params[1] = &n; params[2] = &limit;
        if (kind[0] == 'b')
            block = 4096;
    } else if (!strcmp(kind, "illegal_address")) {
        sym = CD_KERNEL_WRITE_WILD;
        params[0] = &null_base; params[1] = &offset;
    } else if (!strcmp(kind, "write_past")) {
        /* 4 bytes `arg` bytes past the end of the scratch buffer */
        sym = CD_KERNEL_WRITE_WILD;
        params[0] = &ptr; params[1] = &offset;
        offset = (long long)(SCRATCH_BYTES + arg) / 4;
    } else if (!strcmp(kind, "trap")) {
        sym = CD_KERNEL_TRAP;
    } else if (!strcmp(kind, "misaligned")) {
        sym = CD_KERNEL_WRITE_MISALIGNED;
        params[0] = &misaligned;
    } else if (!strcmp(kind, "empty")) {
        sym = CD_KERNEL_EMPTY;
    } else if (!strcmp(kind, "spin")) {
        sym = CD_KERNEL_SPIN;
        params[0] = &ns;
        block = 1;
    } else {
        PyErr_Format(PyExc_ValueError, "unknown fault kernel kind '%s'", kind);
        return NULL;
    }
    CUcontext ctx;
    CUfunction fn;
    int rc = cd_device_context(device, &ctx);
    if (rc)
        return PyLong_FromLong(rc);
    if ((rc = CU_CHECK(cd_drv.cuCtxPushCurrent(ctx))))
        return PyLong_FromLong(rc);
    rc = cd_fault_kernel(device, sym, &fn);
    if (rc == 0) {
        ptr = per_device[device].scratch;
        misaligned = (char *)(uintptr_t)per_device[device].scratch;
        Py_BEGIN_ALLOW_THREADS
        rc = CU_CHECK(cd_drv.cuLaunchKernel(fn, 1, 1, 1, block, 1, 1, 0,
                                            (CUstream)(uintptr_t)stream,
                                            params[0] ? params : NULL, NULL));
        Py_END_ALLOW_THREADS
    }
    CUcontext popped;
    cd_drv.cuCtxPopCurrent(&popped);
    return PyLong_FromLong(rc);
}
