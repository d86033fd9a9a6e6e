"""Build of cuda_debug's C core, cuda_debug._core.

The build needs a C compiler, Python and NumPy headers, and the CUDA headers
(cuda.h, cupti.h, cublas_api.h) - not nvcc and not a driver: libcuda, CUPTI and
cuBLAS are opened at run time. Where the headers are looked for is said once,
in cuda_debug/_cuda_headers.py.
"""
import glob
import importlib.util
import os
import sys

from setuptools import Extension, setup


def _load_header_search():
    """cuda_debug/_cuda_headers.py, by path: the package itself is not importable yet."""
    spec = importlib.util.spec_from_file_location(
        "_cuda_headers", os.path.join(os.path.dirname(os.path.abspath(__file__)), "cuda_debug",
                                      "_cuda_headers.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cuda_include_dirs():
    """Folders holding cuda.h and cupti.h (and cublas_api.h), first found wins."""
    dirs, tried = _load_header_search().find()
    if dirs:
        return dirs
    sys.exit("cuda_debug: CUDA headers (cuda.h, cupti.h) not found. Set CUDA_HOME to a CUDA "
             "toolkit, or pip install nvidia-cuda-runtime nvidia-cuda-cupti nvidia-cublas "
             "(CUDA 12/13 wheels). Looked in: %s" % ", ".join(tried))


def numpy_include():
    import numpy
    return numpy.get_include()


# csrc/README.md draws the layers: every C file of csrc/ is compiled, in a
# fixed order (by layer, then name).
LAYERS = ["base", "capture", "report", "hooks", "testing", "bench"]
SOURCES = ["csrc/module.c"] + [p for layer in LAYERS
                               for p in sorted(glob.glob(os.path.join("csrc", layer, "*.c")))]

core = Extension(
    "cuda_debug._core",
    sources=SOURCES,
    include_dirs=["csrc"] + cuda_include_dirs() + [numpy_include()],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers"],
    libraries=["dl", "pthread"],
)

setup(ext_modules=[core])
