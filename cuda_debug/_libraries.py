"""Where libcuda, CUPTI and cuBLAS come from: the search policy.

The C loader (csrc/base/loader.c) opens what this module tells it to:

- the driver, ``libcuda.so.1``: through the system loader only (``ldconfig``,
  ``LD_LIBRARY_PATH``). It comes with the NVIDIA driver, never with a toolkit
  or a wheel (a toolkit's ``lib64/stubs/libcuda.so`` loads and then fails
  every call). cuda.pathfinder does the same for the driver (system search
  only), so it is not asked: the pytest header opens libcuda, and importing
  pathfinder there would cost more than the rest of the plugin.
- CUPTI and cuBLAS:

  1. a copy already loaded in the process wins (PyTorch and CuPy bring CUPTI
     and cuBLAS with them: sharing their copy avoids two CUPTIs fighting);
     the C loader checks each soname with ``dlopen(RTLD_NOLOAD)``;
  2. otherwise NVIDIA's ``cuda.pathfinder`` (the ``cuda-pathfinder``
     package, imported only here, when a library is first needed) finds and
     loads it: NVIDIA's pip wheels, conda, the system loader, ``$CUDA_PATH``
     / ``$CUDA_HOME``, the toolkit next to a system-loadable CUDA library;
     then the C loader opens the very file pathfinder loaded, so its
     function tables bind to that copy. ``Library.found_via`` says which
     of pathfinder's steps found it.

Nothing is linked at build time, so ``import cuda_debug`` works on a machine
with no driver; what is missing is said when it is needed.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import threading
from typing import List, NamedTuple, Optional

from . import _core

CUDA, CUPTI, CUBLAS = "cuda", "cupti", "cublas"
_IDS = {CUDA: _core.LIB_CUDA, CUPTI: _core.LIB_CUPTI, CUBLAS: _core.LIB_CUBLAS}

# The sonames looked for among the libraries already loaded (and, for the
# driver, given to the system loader), newest CUDA major first.
SONAMES = {
    CUDA: ["libcuda.so.1"],
    CUPTI: ["libcupti.so.13", "libcupti.so.12", "libcupti.so"],
    CUBLAS: ["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
}
# libcuda.so (unversioned) only as a last resort: some containers ship just that link.
_DRIVER_PATHS = ["libcuda.so.1", "libcuda.so"]

ALREADY_LOADED = "already loaded"
SYSTEM_LOADER = "system loader"
PATHFINDER = "cuda.pathfinder"


class Library(NamedTuple):
    name: str             # "cuda", "cupti", "cublas"
    loaded: bool
    path: str             # the file that was opened, "" if none
    how: str              # "already loaded", "system loader", "cuda.pathfinder", ""
    error: str            # why it could not be opened
    tried: List[str]      # what was looked at, in order
    found_via: str = ""   # pathfinder's own word for where it found it ("site-packages",
    #                       "conda", "system-search", "CUDA_PATH", "system-ctk-root", ...)


_lock = threading.Lock()
_cache = {}


def _after_fork_in_child():
    global _lock
    _lock = threading.Lock()       # another thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)


def _cuda_roots() -> List[str]:
    """Toolkit folders named by the environment (doctor reports them): those that
    hold a toolkit (its include/ or lib64/), not an empty folder of that name."""
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    return [r for r in dict.fromkeys(roots) if r and
            any(os.path.isdir(os.path.join(r, d)) for d in ("include", "lib64", "bin"))]


def pathfinder():
    """The cuda.pathfinder module, imported on first use (it costs ~0.1 s); None if absent."""
    try:
        import cuda.pathfinder as pf
    except ImportError:
        return None
    return pf


def pathfinder_version() -> Optional[str]:
    try:
        from importlib import metadata
        return metadata.version("cuda-pathfinder")
    except Exception:
        return None


def _open_driver() -> Library:
    ok, path, how, error = _core.load_library(_IDS[CUDA], SONAMES[CUDA], _DRIVER_PATHS)
    how = {"path": SYSTEM_LOADER}.get(how, how)
    return Library(CUDA, bool(ok), path, how if ok else "", error, list(_DRIVER_PATHS),
                   ALREADY_LOADED if how == ALREADY_LOADED else SYSTEM_LOADER if ok else "")


def _open_toolkit_lib(name: str) -> Library:
    sonames = SONAMES[name]
    tried = ["%s: %s" % (ALREADY_LOADED, ", ".join(sonames)),
             "%s.load_nvidia_dynamic_lib(%r)" % (PATHFINDER, name)]
    # 1. A copy already in the process wins (no pathfinder import needed).
    ok, path, how, error = _core.load_library(_IDS[name], sonames, [])
    if ok:
        return Library(name, True, path, ALREADY_LOADED, "", tried[:1], ALREADY_LOADED)
    # 2. cuda.pathfinder finds and loads it; the C loader opens that same file.
    pf = pathfinder()
    if pf is None:
        return Library(name, False, "", "", "cuda-pathfinder is not installed (it is a "
                       "dependency of cuda_debug: pip install cuda-pathfinder)", tried)
    try:
        dl = pf.load_nvidia_dynamic_lib(name)
    except pf.DynamicLibNotFoundError as e:     # also: unknown to this pathfinder version
        return Library(name, False, "", "", "cuda.pathfinder %s: %s"
                       % (pathfinder_version() or "?", " ".join(str(e).split())), tried)
    except (RuntimeError, OSError) as e:        # found, but dlopen failed
        return Library(name, False, "", "", "cuda.pathfinder: %s" % e, tried)
    if not dl.abs_path:
        return Library(name, False, "", "", "cuda.pathfinder loaded %s but cannot say from "
                       "which file" % name, tried)
    ok, path, how, error = _core.load_library(_IDS[name], [], [dl.abs_path])
    found_via = getattr(dl, "found_via", None) or "?"
    if not ok:
        return Library(name, False, "", "", "%s (found by cuda.pathfinder via %s): %s"
                       % (dl.abs_path, found_via, error), tried, found_via)
    return Library(name, True, path, PATHFINDER, "", tried, found_via)


def _open(name: str) -> Library:
    """Open `name` unless already open; the caller holds _lock."""
    lib = _cache.get(name)
    if lib is None or not lib.loaded:
        lib = _cache[name] = _open_driver() if name == CUDA else _open_toolkit_lib(name)
    return lib


def load(name: str) -> Library:
    """Open `name` once (first success is kept); never raises. The driver is
    opened first."""
    if name not in _IDS:
        raise ValueError("unknown library %r: one of %s" % (name, ", ".join(_IDS)))
    lib = _cache.get(name)
    if lib is not None and lib.loaded:
        return lib          # no lock once loaded: scope entry must not wait on one
    with _lock:
        if name != CUDA:
            _open(CUDA)
        return _open(name)


def describe(lib: Library) -> str:
    if lib.loaded:
        return "%s (%s)" % (lib.path, how_found(lib))
    return "not found (%s); looked for: %s" % (lib.error or "no candidate", ", ".join(lib.tried))


def how_found(lib: Library) -> str:
    """"cuda.pathfinder, via site-packages", "already loaded", "system loader"."""
    if lib.how == PATHFINDER:
        return "%s, via %s" % (PATHFINDER, lib.found_via)
    return lib.how


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
            "nvidia-cuda-cupti nvidia-cublas` (CUDA 13 wheels; -cu12 for CUDA 12); or set "
            "CUDA_HOME. Looked for: %s" % (what, lib.error or "no candidate", "; ".join(lib.tried)),
            missing="lib" + name, tried=lib.tried)
    return lib


def status(name: str) -> Optional[Library]:
    """What is known of `name` so far, without loading anything."""
    return _cache.get(name)
