"""Where libcuda, CUPTI and cuBLAS come from: the search policy.

The C loader (csrc/loader.c) opens what this module tells it to, in order:

1. a copy already loaded in the process (PyTorch and CuPy bring CUPTI and
   cuBLAS with them: sharing their copy avoids two CUPTIs fighting);
2. the system loader (``ldconfig``, ``LD_LIBRARY_PATH``) by soname;
3. NVIDIA's pip wheels in every site-packages folder: CUDA 13 layout
   ``nvidia/cu13/lib``, CUDA 12 layout ``nvidia/cuda_cupti/lib``, ``nvidia/cublas/lib``;
4. ``$CUDA_HOME`` / ``$CUDA_PATH`` / ``/usr/local/cuda``: ``lib64``,
   ``targets/*/lib`` (toolkit 13 keeps CUPTI there) and ``extras/CUPTI/lib64`` (toolkit 12).

Nothing is linked at build time, so ``import cuda_debug`` works on a machine
with no driver; what is missing is said when it is needed.
"""
import glob
import os
import site
import sysconfig
import threading
from typing import List, NamedTuple, Optional

from . import _core

CUDA, CUPTI, CUBLAS = "cuda", "cupti", "cublas"
_IDS = {CUDA: _core.LIB_CUDA, CUPTI: _core.LIB_CUPTI, CUBLAS: _core.LIB_CUBLAS}


class Library(NamedTuple):
    name: str             # "cuda", "cupti", "cublas"
    loaded: bool
    path: str             # the file that was opened, "" if none
    how: str              # "already loaded", "system loader", "path", ""
    error: str            # why the last candidate failed
    tried: List[str]      # candidates in the order tried


_lock = threading.Lock()
_cache = {}


def _site_dirs() -> List[str]:
    dirs = []
    for key in ("purelib", "platlib"):
        dirs.append(sysconfig.get_paths().get(key))
    try:
        dirs += site.getsitepackages()
        dirs.append(site.getusersitepackages())
    except AttributeError:  # virtualenv's old site.py
        pass
    return [d for d in dict.fromkeys(dirs) if d and os.path.isdir(d)]


def _cuda_roots() -> List[str]:
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return [r for r in dict.fromkeys(roots) if r and os.path.isdir(r)]


def _majors() -> List[str]:
    """CUDA major versions to try, the driver's own first."""
    majors = ["13", "12"]
    drv = _cache.get(CUDA)
    if drv is not None and drv.loaded:
        v = _core.driver_version()
        if v and str(v // 1000) in majors:
            majors.remove(str(v // 1000))
            majors.insert(0, str(v // 1000))
    return majors


def candidates(name: str) -> (List[str], List[str]):
    """(sonames, paths) for `name`, in the order they are tried."""
    if name == CUDA:
        # Never a toolkit's lib64/stubs/libcuda.so: it loads and then fails every call.
        return ["libcuda.so.1"], ["libcuda.so.1", "libcuda.so"]
    base = {CUPTI: "libcupti", CUBLAS: "libcublas"}[name]
    wheel_dir = {CUPTI: "cuda_cupti", CUBLAS: "cublas"}[name]
    sonames = ["%s.so.%s" % (base, m) for m in _majors()] + [base + ".so"]
    paths = list(sonames)
    for sp in _site_dirs():
        for m in _majors():
            sub = "cu%s" % m if m != "12" else wheel_dir
            paths.append(os.path.join(sp, "nvidia", sub, "lib", "%s.so.%s" % (base, m)))
    for root in _cuda_roots():
        for d in ([os.path.join(root, "lib64")] + glob.glob(os.path.join(root, "targets", "*", "lib"))
                  + [os.path.join(root, "extras", "CUPTI", "lib64")]):
            for so in sonames:
                paths.append(os.path.join(d, so))
    seen = set()
    paths = [p for p in paths if not (p in seen or seen.add(p))]
    return sonames, [p for p in paths if "/" not in p or os.path.exists(p)]


def _open(name: str) -> Library:
    """Open `name` unless already open; the caller holds _lock."""
    lib = _cache.get(name)
    if lib is None or not lib.loaded:
        sonames, paths = candidates(name)
        ok, path, how, error = _core.load_library(_IDS[name], sonames, paths)
        lib = _cache[name] = Library(name, bool(ok), path, how, error, paths)
    return lib


def load(name: str) -> Library:
    """Open `name` once (first success is kept); never raises. The driver is
    opened first: its version decides which CUDA major to look for."""
    lib = _cache.get(name)
    if lib is not None and lib.loaded:
        return lib          # no lock once loaded: scope entry must not wait on one
    with _lock:
        if name != CUDA:
            _open(CUDA)
        return _open(name)


def describe(lib: Library) -> str:
    if lib.loaded:
        return "%s (%s)" % (lib.path, lib.how)
    return "not found (%s); looked for: %s" % (lib.error or "no candidate", ", ".join(lib.tried))


def ensure(name: str) -> Library:
    """Load `name` and, for the driver, initialise it; raise CudaUnavailableError
    saying what is missing and where we looked."""
    from ._errors import CudaUnavailableError

    drv = load(CUDA)
    if not drv.loaded:
        raise CudaUnavailableError(
            "no CUDA driver: libcuda.so.1 could not be opened (%s). Is an NVIDIA driver "
            "installed, and is this a machine (or container) with a GPU?" % (drv.error or "?"),
            missing="libcuda", tried=drv.tried)
    rc = _core.driver_init()
    if rc != 0:
        from . import _cuda_errors as t
        raise CudaUnavailableError(
            "the CUDA driver did not initialise: cuInit returned %s (%s)%s"
            % (t.name(rc), t.description(rc),
               ": no GPU is visible" if rc == 100 else ""),
            missing="gpu" if rc == 100 else "driver", code=rc)
    if name == CUDA:
        return drv
    lib = load(name)
    if not lib.loaded:
        what = {CUPTI: "CUPTI (libcupti), needed for launch_blocking()",
                CUBLAS: "cuBLAS (libcublas), needed for cuda_debug.bench.gemm"}[name]
        raise CudaUnavailableError(
            "%s was not found (%s). Install it with the CUDA toolkit, or `pip install "
            "nvidia-cuda-cupti nvidia-cublas` (CUDA 12) / the cu13 wheels; or set CUDA_HOME. "
            "Looked for: %s" % (what, lib.error or "no candidate", ", ".join(lib.tried)),
            missing="lib" + name, tried=lib.tried)
    return lib


def status(name: str) -> Optional[Library]:
    """What is known of `name` so far, without loading anything."""
    return _cache.get(name)
