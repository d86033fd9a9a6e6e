"""A fake CUDA driver and CUPTI, built by the test session, for CPU-only CI.

``fake_cuda.c`` and the other files of its API areas (``fake_driver.h``
lists them) become a ``libcuda.so.1`` and ``fake_cupti.c`` a
``libcupti.so.13`` (same sonames as the real ones), compiled with ``cc`` against
the project's own CUDA declarations, ``csrc/base/cuda_api.h`` (the header the C
core is built with: generated from the real cuda.h / cupti.h, which it matches
in ABI, tests/house/test_cuda_api.py), so that the fakes, like the package, build
where no CUDA toolkit is. Once per source hash, into a folder under the temp
dir. A fake that names a CUDA type, constant or function the header lacks
fails to build: rerun ``tools/gen/cuda_api.py`` (it reads tests/fake_cuda/
too). A child process preloads them
(``ctypes.CDLL(path, RTLD_GLOBAL)``) before importing cuda_debug; cuda_debug's
loader first asks for an already-loaded ``libcuda.so.1`` / ``libcupti.so.13``
(``RTLD_NOLOAD``) and so binds the fakes, and the REAL cuda_debug CUPTI
callback then runs on every fake launch, exactly as CUPTI would call it.

Usage, in a test (fixtures in ``fake_cuda/fixtures.py``, re-exported by
``tests/conftest.py``)::

    def test_something(fake_child):
        c = fake_child('''
            import cuda_debug, cuda_debug.testing as t
            fake.fake_set_kernel(b"my_kernel", 710, -1, b"x < n", -1, 0)
            with cuda_debug.launch_blocking():
                t.device_assert()          # the real cuda_debug.testing kernel
        ''')
        assert "DeviceAssertError" in c.stderr

In the child, ``fake`` is the ctypes handle of the fake driver (argtypes set,
see ``child.py``); ``fake_stats()``, ``cbid(name)``, ``FAKE_DIR`` come with it.
``PRELUDE`` is the code that does this, for scripts run some other way.

This module imports nothing but the standard library: the child imports it.
"""
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
#: the fake libcuda.so.1's files, one API area each (fake_driver.h lists them)
LIBCUDA_SOURCES = ("fake_cuda.c", "fake_callbacks.c", "fake_device.c", "fake_context.c",
                   "fake_streams.c", "fake_launch.c", "fake_memory.c", "fake_events.c",
                   "fake_control.c")
SOURCES = ("fake_common.h", "fake_driver.h") + LIBCUDA_SOURCES + (
    "fake_cupti.c", "fake_cudart.c", "fake_rt_user.c")
LIBCUDA = "libcuda.so.1"
LIBCUPTI = "libcupti.so.13"
#: the runtime's launch entry point, and a library calling it as nvcc's stubs do
LIBCUDART = "libfake_cudart.so"
LIBRTUSER = "libfake_rt_user.so"

#: Paste at the top of a child script (after ``import sys``): preloads the
#: fakes from $CD_TEST_FAKE_DIR and defines ``fake``, ``fake_stats``, ``cbid``.
PRELUDE = ("import sys as _fk_sys; _fk_sys.path.insert(0, %r)\n"
           "from fake_cuda.child import fake, fake_stats, cbid, refuse_cbids, at, FAKE_DIR  # preloads the fakes\n"
           % TESTS)


class Unavailable(Exception):
    """The fakes cannot be built here (no C compiler, no csrc/base/cuda_api.h)."""


def _header_search():
    """cuda_debug/_cuda_headers.py (the one search), by path: this module is
    imported by children before cuda_debug, and must not import the package."""
    import importlib.util
    spec = importlib.util.find_spec("cuda_debug")
    folder = os.path.dirname(spec.origin) if spec and spec.origin else \
        os.path.join(os.path.dirname(TESTS), "cuda_debug")
    hs = importlib.util.spec_from_file_location("_cuda_headers", os.path.join(folder,
                                                                             "_cuda_headers.py"))
    module = importlib.util.module_from_spec(hs)
    hs.loader.exec_module(module)
    return module


def cuda_include_dirs():
    """Folders holding the real cuda.h and cupti.h (cuda_debug/_cuda_headers.py);
    None if none. (Not needed to build the fakes.)"""
    return _header_search().find()[0]


#: csrc/ of the checkout or unpacked sdist the tests belong to
CSRC = os.path.join(os.path.dirname(TESTS), "csrc")
CUDA_API_H = os.path.join(CSRC, "base", "cuda_api.h")


def include_dirs():
    """The include path of the fakes' build: this folder (fake_common.h) and
    csrc/ (base/cuda_api.h). Unavailable when csrc/ is not next to tests/."""
    if not os.path.isfile(CUDA_API_H):
        raise Unavailable("the project's CUDA declarations (%s) are not next to the tests"
                          % os.path.relpath(CUDA_API_H, os.path.dirname(TESTS)))
    return [HERE, CSRC]


def compiler():
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc) or shutil.which("gcc") or shutil.which("clang")


def _digest(cc):
    h = hashlib.sha256()
    for path in [os.path.join(HERE, name) for name in SOURCES] + [CUDA_API_H]:
        with open(path, "rb") as f:
            h.update(os.path.basename(path).encode() + b"\0" + f.read())
    h.update(cc.encode() + b"\0" + " ".join(extra_cflags()).encode())
    h.update(repr(commands(cc, "W")).encode())       # how they are built, too
    return h.hexdigest()[:16]


def extra_cflags():
    """$CD_TEST_FAKE_CFLAGS: more flags for the fakes (.ci/sanitize.sh builds
    them with the sanitizers too)."""
    import shlex
    return shlex.split(os.environ.get("CD_TEST_FAKE_CFLAGS", ""))


def cflags():
    """The fakes' compiler flags (the include path: include_dirs())."""
    # A function cuda_api.h does not declare is an error, not a guessed prototype.
    return (["-std=gnu11", "-O1", "-g", "-fPIC", "-Wall", "-Wextra", "-Wno-unused-parameter",
             "-Wno-missing-field-initializers", "-Werror=implicit-function-declaration"] +
            ["-I" + d for d in include_dirs()] +
            extra_cflags())


def commands(cc, work):
    """The compiler commands that build the fakes into `work`."""
    flags = cflags() + ["-shared"]
    return [
        [cc] + flags + ["-Wl,-soname," + LIBCUDA, "-o", os.path.join(work, LIBCUDA),
                        *[os.path.join(HERE, n) for n in LIBCUDA_SOURCES], "-lpthread"],
        [cc] + flags + ["-Wl,-soname," + LIBCUPTI, "-o", os.path.join(work, LIBCUPTI),
                        os.path.join(HERE, "fake_cupti.c"), os.path.join(work, LIBCUDA),
                        "-Wl,-rpath,$ORIGIN", "-lpthread"],
        [cc] + flags + ["-Wl,-soname," + LIBCUDART, "-o", os.path.join(work, LIBCUDART), os.path.join(HERE, "fake_cudart.c"),
                        os.path.join(work, LIBCUDA), "-Wl,-rpath,$ORIGIN"],
        [cc] + flags + ["-Wl,-soname," + LIBRTUSER, "-o", os.path.join(work, LIBRTUSER), os.path.join(HERE, "fake_rt_user.c"),
                        os.path.join(work, LIBCUDART), os.path.join(work, LIBCUDA),
                        "-Wl,-rpath,$ORIGIN"],
    ]


def build():
    """Compile the fakes (once per source hash; cached in the temp dir) and
    return the folder holding libcuda.so.1 and libcupti.so.13. Raises
    Unavailable saying why when this machine cannot build them."""
    cc = compiler()
    if not cc:
        raise Unavailable("no C compiler (cc/gcc/clang) to build the fake CUDA driver")
    include_dirs()
    out = os.path.join(tempfile.gettempdir(), "cuda_debug_fake_%s" % _digest(cc))
    if all(os.path.exists(os.path.join(out, n)) for n in (LIBCUDA, LIBCUPTI, LIBCUDART, LIBRTUSER)):
        return out
    work = tempfile.mkdtemp(prefix="cuda_debug_fake_build_")
    for cmd in commands(cc, work):
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            shutil.rmtree(work, ignore_errors=True)
            hint = ("\n(a CUDA name the fakes use is missing from csrc/base/cuda_api.h? "
                    "Rerun tools/gen/cuda_api.py: it reads tests/fake_cuda/ too)"
                    if any(w in p.stderr for w in ("undeclared", "unknown type name",
                                                   "implicit declaration")) else "")
            raise RuntimeError("building the fake CUDA driver failed:\n%s\n%s%s"
                               % (" ".join(cmd), p.stderr, hint))
    # beside the fake libcuda, as the driver installs it: what cuda_debug._warps looks
    # for before a cuda-gdb (a stand-in, in the tests) may attach; never loaded
    open(os.path.join(work, "libcudadebugger.so.1"), "w").close()
    try:                      # atomic publish: concurrent sessions (xdist) race harmlessly
        os.rename(work, out)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not os.path.exists(os.path.join(out, LIBCUPTI)):
            raise
    return out


_CBIDS = None


def cbids():
    """CUPTI driver callback ids by API name, read from the csrc/base/cuda_api.h
    the fakes (and the C core) were built with: ``cbids()["cuLaunchKernel"] == 307``."""
    global _CBIDS
    if _CBIDS is None:
        _CBIDS = {}
        with open(CUDA_API_H) as f:
            for m in re.finditer(r"CUPTI_DRIVER_TRACE_CBID_(\w+)\s*=\s*(\d+)", f.read()):
                _CBIDS[m.group(1)] = int(m.group(2))
    return _CBIDS


def real_cuda_found_first():
    """Why LD_LIBRARY_PATH's fakes would not be found here (a real driver, or
    NVIDIA's CUPTI wheel, comes first in cuda_debug's search), or None."""
    from conftest import gpu_unavailable_reason
    if gpu_unavailable_reason() is None:
        return ("a real driver and CUPTI are installed here: the system search finds them "
                "before LD_LIBRARY_PATH's fakes (the preloading tests cover this machine)")
    import glob
    import site
    wheels = [p for d in site.getsitepackages() for p in glob.glob(d + "/nvidia/*/lib/libcupti.so*")]
    if wheels:
        return ("NVIDIA's CUPTI wheel is installed (%s): cuda.pathfinder finds it before "
                "LD_LIBRARY_PATH's fake (the preloading tests cover this machine)" % wheels[0])
    return None


def child_env(folder, preload=True, ld_library_path=False):
    """Environment for a child: $CD_TEST_FAKE_DIR (the prelude preloads from
    there unless preload is False) and, if asked, LD_LIBRARY_PATH so that
    cuda_debug's loader finds the fakes by soname through the system loader."""
    env = {"CD_TEST_FAKE_DIR": folder, "CD_TEST_FAKE_PRELOAD": "1" if preload else "0"}
    if ld_library_path:
        old = os.environ.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = folder + (os.pathsep + old if old else "")
    return env
