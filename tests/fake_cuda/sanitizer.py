"""A fake NVIDIA Sanitizer API (libsanitizer-public.so) for the CPU tests of
cuda-debug replay, built like the fake driver but on its own (it needs no CUDA
header: csrc/replay/sanitizer_api.h and base/cuda_api.h declare what it uses).

``build_sanitizer()`` compiles ``fake_sanitizer.c`` once per source hash into a
folder under the temp dir and returns the library's path; a replay child is
pointed at it with ``CUDA_DEBUG_SANITIZER=<path>``. In the child,
``fake_sanitizer()`` gives the ctypes handle with the test controls typed
(the library is the copy cuda_debug loaded: same path, one instance).
"""
import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile

from . import HERE, Unavailable, compiler, extra_cflags

ROOT = os.path.dirname(os.path.dirname(HERE))
CSRC = os.path.join(ROOT, "csrc")
SOURCES = [os.path.join(HERE, "fake_sanitizer.c")] + [
    os.path.join(CSRC, "replay", n) for n in ("check.h", "sanitizer_api.h")] + [
    os.path.join(CSRC, "base", "cuda_api.h")]
NAME = "libsanitizer-public.so"


def build_sanitizer() -> str:
    """The fake's path (built once per source hash); Unavailable when no C
    compiler or no source tree is here."""
    cc = compiler()
    if not cc:
        raise Unavailable("no C compiler to build the fake Sanitizer API")
    if not os.path.isdir(CSRC):
        raise Unavailable("no source tree (csrc/) next to the tests")
    h = hashlib.sha256()
    for p in SOURCES:
        with open(p, "rb") as f:
            h.update(p.encode() + b"\0" + f.read())
    h.update(cc.encode() + " ".join(extra_cflags()).encode())
    out = os.path.join(tempfile.gettempdir(), "cuda_debug_fake_san_%s" % h.hexdigest()[:16])
    lib = os.path.join(out, NAME)
    if os.path.exists(lib):
        return lib
    work = tempfile.mkdtemp(prefix="cuda_debug_fake_san_build_")
    cmd = [cc, "-std=gnu11", "-O1", "-g", "-fPIC", "-shared", "-Wall", "-Wextra",
           "-Wno-unused-parameter", "-pthread", "-I" + CSRC, "-o", os.path.join(work, NAME),
           SOURCES[0]] + extra_cflags()
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError("building the fake Sanitizer API failed:\n%s\n%s"
                           % (" ".join(cmd), p.stderr))
    try:
        os.rename(work, out)
    except OSError:
        shutil.rmtree(work, ignore_errors=True)
        if not os.path.exists(lib):
            raise
    return lib


_SIGNATURES = {
    "fake_san_reset": (None, []),
    "fake_san_fail": (None, [ctypes.c_char_p, ctypes.c_int]),
    "fake_san_stats": (ctypes.c_int, [ctypes.POINTER(ctypes.c_longlong), ctypes.c_int]),
    "fake_san_alloc": (None, [ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint32]),
    "fake_san_free": (None, [ctypes.c_uint64, ctypes.c_uint32]),
    "fake_san_launch": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_uint32,
                                       ctypes.POINTER(ctypes.c_uint64), ctypes.c_int]),
    "fake_san_sync": (ctypes.c_int, []),
    "fake_san_module": (None, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t]),
}
#: fake_san_stats() indexes
STATS = ("subscribe", "unsubscribe", "add_patches", "patch_instructions", "patch_module",
         "unpatch", "set_data", "alloc", "free", "h2d", "d2h", "sync", "launches",
         "real_faults", "bad", "callbacks", "driver_callbacks")


def fake_sanitizer(path=None):
    """The ctypes handle of the fake (typed), plus .stats() and .launch()."""
    lib = ctypes.CDLL(path or os.environ["CUDA_DEBUG_SANITIZER"])
    for name, (res, args) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args

    def stats():
        buf = (ctypes.c_longlong * 32)()
        n = lib.fake_san_stats(buf, 32)
        return dict(zip(STATS, buf[:n]))

    def launch(name, accesses=(), grid=1, block=32):
        """accesses: (address, size, flags, thread) each; flags 1 read, 2 write."""
        flat = [int(v) for a in accesses for v in a]
        arr = (ctypes.c_uint64 * max(len(flat), 1))(*flat)
        return lib.fake_san_launch(name.encode(), grid, block, arr, len(accesses))

    lib.stats = stats
    lib.launch = launch
    return lib
