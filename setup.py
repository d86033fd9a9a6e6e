"""Build of cuda_debug's C core, cuda_debug._core.

The build needs a C compiler and the Python and NumPy headers, nothing of
CUDA: the few driver, CUPTI and cuBLAS declarations the C core uses are in
csrc/base/cuda_api.h (generated from the CUDA headers by
tools/gen/cuda_api.py, committed), and libcuda, CUPTI and cuBLAS are
opened at run time.
"""
import glob
import os
import shlex
import shutil
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def missing_build_pieces():
    """What the build lacks, each with where it was looked for ([] if nothing)."""
    missing = []
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    cc_exe = shlex.split(cc)[0] if cc.strip() else "cc"
    if not shutil.which(cc_exe):
        missing.append("a C compiler: %r (from %s) is not on PATH (apt-get install gcc, or set CC)"
                       % (cc_exe, "$CC" if os.environ.get("CC") else "sysconfig's CC"))
    inc = [sysconfig.get_paths().get(k) for k in ("include", "platinclude")]
    inc = [d for d in dict.fromkeys(inc) if d]
    if not any(os.path.exists(os.path.join(d, "Python.h")) for d in inc):
        missing.append("the Python headers: no Python.h in %s (apt-get install python3-dev, "
                       "or your Python's -dev/-devel package)" % ", ".join(inc))
    try:
        import numpy
        if not os.path.exists(os.path.join(numpy.get_include(), "numpy", "arrayobject.h")):
            missing.append("NumPy's headers: no numpy/arrayobject.h in %s" % numpy.get_include())
    except ImportError as e:
        missing.append("NumPy (a build requirement, pip installs it): %s" % e)
    return missing


def without_rpath(args):
    """The link command less the run-time search paths the interpreter's own
    LDSHARED/LDFLAGS carry (pyenv, a Python built with --enable-shared:
    ``-Wl,-rpath,/root/.pyenv/versions/3.11.7/lib``): the extension links only
    libc, and a RUNPATH would name the build machine's Python in every wheel."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("-rpath", "-R") or a == "-Wl,-rpath" or a == "-Wl,-R":
            skip = True                          # the path is the next word
        elif a.startswith(("-Wl,-rpath", "-Wl,-R", "-Wl,--enable-new-dtags")):
            pass
        else:
            out.append(a)
    return out


class BuildExt(build_ext):
    """Checks what the build needs first. A wheel's (and `pip install .`'s)
    extension is built without debug info (-g0: it was three quarters of the
    file); an editable or in-place build (`pip install -e .`, the sanitizer job)
    keeps the interpreter's -g, for gdb and the sanitizers' stacks. No RUNPATH
    either way (.ci/run checks the wheel's with readelf)."""

    def run(self):
        missing = missing_build_pieces()
        if missing:
            raise SystemExit(
                "cuda_debug: cannot build the C extension. It needs a C compiler, the Python "
                "headers and NumPy (no CUDA toolkit, no NVIDIA wheel). Missing:\n  - "
                + "\n  - ".join(missing))
        import numpy
        # (setuptools' build_ext.run builds with inplace reset to 0, then copies)
        keep_debug = bool(self.inplace or getattr(self, "editable_mode", False))
        for ext in self.extensions:
            ext.include_dirs.append(numpy.get_include())
            if not keep_debug and "-g0" not in ext.extra_compile_args:
                ext.extra_compile_args.append("-g0")
        super().run()

    def build_extensions(self):
        self.compiler.linker_so = without_rpath(self.compiler.linker_so)
        super().build_extensions()


# csrc/README.md draws the layers: every C file of csrc/ is compiled, in a
# fixed order (by layer, then name).
LAYERS = ["base", "capture", "report", "hooks", "replay", "testing", "bench", "python"]
SOURCES = ["csrc/module.c"] + [p for layer in LAYERS
                               for p in sorted(glob.glob(os.path.join("csrc", layer, "*.c")))]

core = Extension(
    "cuda_debug._core",
    sources=SOURCES,
    include_dirs=["csrc"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=["-std=gnu11", "-O2", "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers"],
    libraries=["dl", "pthread"],
)

# license: see pyproject.toml (dynamic = ["license"]): a `License: MIT` field.
setup(ext_modules=[core], cmdclass={"build_ext": BuildExt}, license="MIT")
