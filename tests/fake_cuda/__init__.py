"""A fake CUDA driver and CUPTI, built by the test session, for CPU-only CI.

``fake_cuda.c`` becomes a ``libcuda.so.1`` and ``fake_cupti.c`` a
``libcupti.so.13`` (same sonames as the real ones), compiled with ``cc`` against
the REAL ``cuda.h`` / ``cupti.h`` (found like ``setup.py`` finds them), once per
source hash, into a folder under the temp dir. A child process preloads them
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
SOURCES = ("fake_common.h", "fake_cuda.c", "fake_cupti.c")
LIBCUDA = "libcuda.so.1"
LIBCUPTI = "libcupti.so.13"

#: Paste at the top of a child script (after ``import sys``): preloads the
#: fakes from $CD_TEST_FAKE_DIR and defines ``fake``, ``fake_stats``, ``cbid``.
PRELUDE = ("import sys as _fk_sys; _fk_sys.path.insert(0, %r)\n"
           "from fake_cuda.child import fake, fake_stats, cbid, refuse_cbids, FAKE_DIR  # preloads the fakes\n"
           % TESTS)


class Unavailable(Exception):
    """The fakes cannot be built here (no C compiler, no CUDA headers)."""


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
    """Folders holding cuda.h and cupti.h (cuda_debug/_cuda_headers.py); None if none."""
    return _header_search().find()[0]


def compiler():
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc) or shutil.which("gcc") or shutil.which("clang")


def _digest(cc, incs):
    h = hashlib.sha256()
    for name in SOURCES:
        with open(os.path.join(HERE, name), "rb") as f:
            h.update(name.encode() + b"\0" + f.read())
    for d in incs:
        for hdr in ("cuda.h", "cupti.h", "cupti_callbacks.h", "generated_cuda_meta.h"):
            p = os.path.join(d, hdr)
            if os.path.exists(p):
                st = os.stat(p)
                h.update(("%s:%d:%d" % (p, st.st_size, st.st_mtime_ns)).encode())
    h.update(cc.encode() + b"\0" + " ".join(extra_cflags()).encode())
    return h.hexdigest()[:16]


def extra_cflags():
    """$CD_TEST_FAKE_CFLAGS: more flags for the fakes (.ci/sanitize.sh builds
    them with the sanitizers too)."""
    import shlex
    return shlex.split(os.environ.get("CD_TEST_FAKE_CFLAGS", ""))


def build():
    """Compile the fakes (once per source hash; cached in the temp dir) and
    return the folder holding libcuda.so.1 and libcupti.so.13. Raises
    Unavailable saying why when this machine cannot build them."""
    cc = compiler()
    if not cc:
        raise Unavailable("no C compiler (cc/gcc/clang) to build the fake CUDA driver")
    incs = cuda_include_dirs()
    if not incs:
        raise Unavailable("CUDA headers (cuda.h, cupti.h) not found: set CUDA_HOME")
    out = os.path.join(tempfile.gettempdir(), "cuda_debug_fake_%s" % _digest(cc, incs))
    if all(os.path.exists(os.path.join(out, n)) for n in (LIBCUDA, LIBCUPTI)):
        return out
    work = tempfile.mkdtemp(prefix="cuda_debug_fake_build_")
    flags = ["-std=gnu11", "-O1", "-g", "-fPIC", "-shared", "-Wall", "-Wextra",
             "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
    flags += ["-I" + d for d in incs] + extra_cflags()
    cmds = [
        [cc] + flags + ["-Wl,-soname," + LIBCUDA, "-o", os.path.join(work, LIBCUDA),
                        os.path.join(HERE, "fake_cuda.c"), "-lpthread"],
        [cc] + flags + ["-Wl,-soname," + LIBCUPTI, "-o", os.path.join(work, LIBCUPTI),
                        os.path.join(HERE, "fake_cupti.c"), os.path.join(work, LIBCUDA),
                        "-Wl,-rpath,$ORIGIN", "-lpthread"],
    ]
    for cmd in cmds:
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError("building the fake CUDA driver failed:\n%s\n%s"
                               % (" ".join(cmd), p.stderr))
    try:                      # atomic publish: concurrent sessions (xdist) race harmlessly
        os.rename(work, out)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not os.path.exists(os.path.join(out, LIBCUPTI)):
            raise
    return out


_CBIDS = None


def cbids():
    """CUPTI driver callback ids by API name, read from the cupti_driver_cbid.h
    the fakes were built with: ``cbids()["cuLaunchKernel"] == 307``."""
    global _CBIDS
    if _CBIDS is None:
        _CBIDS = {}
        for d in cuda_include_dirs() or []:
            p = os.path.join(d, "cupti_driver_cbid.h")
            if os.path.exists(p):
                with open(p) as f:
                    for m in re.finditer(r"CUPTI_DRIVER_TRACE_CBID_(\w+)\s*=\s*(\d+)", f.read()):
                        _CBIDS[m.group(1)] = int(m.group(2))
                break
    return _CBIDS


def child_env(folder, preload=True, ld_library_path=False):
    """Environment for a child: $CD_TEST_FAKE_DIR (the prelude preloads from
    there unless preload is False) and, if asked, LD_LIBRARY_PATH so that
    cuda_debug's loader finds the fakes by soname through the system loader."""
    env = {"CD_TEST_FAKE_DIR": folder, "CD_TEST_FAKE_PRELOAD": "1" if preload else "0"}
    if ld_library_path:
        old = os.environ.get("LD_LIBRARY_PATH")
        env["LD_LIBRARY_PATH"] = folder + (os.pathsep + old if old else "")
    return env
