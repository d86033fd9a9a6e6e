"""Build of cuda_debug's C core, cuda_debug._core.

The build needs a C compiler, Python and NumPy headers, and the CUDA headers
(cuda.h, cupti.h, cublas_api.h) - not nvcc and not a driver: libcuda, CUPTI and
cuBLAS are opened at run time. The headers are looked for, in order, in
$CUDA_HOME (or $CUDA_PATH), /usr/local/cuda, and NVIDIA's pip wheels
(nvidia/cu13/include, or nvidia/cuda_runtime + cuda_cupti + cublas includes).
"""
import glob
import os
import site
import sys
import sysconfig

from setuptools import Extension, setup


def _site_dirs():
    dirs = [sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    try:
        dirs += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:
        pass
    return [d for d in dict.fromkeys(dirs) if d and os.path.isdir(d)]


def cuda_include_dirs():
    """Folders holding cuda.h and cupti.h (and cublas_api.h), first found wins."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    candidates = []
    for root in filter(None, roots):
        candidates.append([os.path.join(root, "include"),
                           os.path.join(root, "extras", "CUPTI", "include")])
        candidates.append(glob.glob(os.path.join(root, "targets", "*", "include")))
    for sp in _site_dirs():
        nv = os.path.join(sp, "nvidia")
        candidates.append([os.path.join(nv, "cu13", "include")])
        candidates.append([os.path.join(nv, p, "include")
                           for p in ("cuda_runtime", "cuda_cupti", "cublas", "cuda_nvcc")])
    tried = []
    for dirs in candidates:
        dirs = [d for d in dirs if os.path.isdir(d)]
        have = lambda h: any(os.path.exists(os.path.join(d, h)) for d in dirs)  # noqa: E731
        tried.append(dirs)
        if dirs and have("cuda.h") and have("cupti.h"):
            return dirs
    sys.exit("cuda_debug: CUDA headers (cuda.h, cupti.h) not found. Set CUDA_HOME to a CUDA "
             "toolkit, or pip install nvidia-cuda-runtime nvidia-cuda-cupti nvidia-cublas "
             "(CUDA 12/13 wheels). Looked in: %s" % tried)


def numpy_include():
    import numpy
    return numpy.get_include()


SOURCES = ["module.c", "loader.c", "launch_hooks.c", "scopes.c", "watch_ring.c", "frames.c",
           "intern.c", "fault_records.c", "fault_report.c", "stderr_tee.c", "driver_log.c",
           "demangle.c", "native_ops.c", "fault_kernels.c", "bench_buffers.c", "gemm_loops.c", "launch_latency.c"]

core = Extension(
    "cuda_debug._core",
    sources=[os.path.join("csrc", s) for s in SOURCES],
    include_dirs=["csrc"] + cuda_include_dirs() + [numpy_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers"],
    libraries=["dl", "pthread"],
)

setup(ext_modules=[core])
