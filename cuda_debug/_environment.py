"""What this machine has: GPU, driver, CUDA, CUPTI, cuBLAS (pytest header, doctor).

Three depths, so that asking costs only what the caller can afford:

- ``cheap()``: files only (``/proc/driver/nvidia``) and constants compiled into
  cuda_debug: no library is opened, CUDA is not initialised. The pytest
  report header uses it by default, because initialising CUDA in the pytest
  process breaks tests that fork afterwards.
- ``driver()``: opens libcuda and asks its version (``cuDriverGetVersion``
  needs no ``cuInit``): still fork-safe.
- ``full()``: ``cuInit``, every device, CUPTI and cuBLAS located, and whether
  CUPTI can be subscribed now (``doctor``); ``verdict()`` says from them whether
  watch() and launch_blocking() work here.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import glob
import os
import platform
import re
import sys
import sysconfig
from typing import Dict, List, Optional, Tuple

from . import _core, _libraries

ENV_VARS = ("CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES", "CUDA_HOME", "CUDA_PATH",
            "CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH", "CUDA_DEBUG_WAIT",
            "CUDA_DEBUG_CAPTURE")
FRAMEWORKS = ("torch", "cupy-cuda13x", "cupy-cuda12x", "cupy", "triton", "jax", "jaxlib",
              "numba-cuda", "nvidia-cuda-cupti-cu12", "nvidia-cuda-cupti", "nvidia-cublas-cu12",
              "nvidia-cublas")


def cuda_version_str(v: Optional[int]) -> Optional[str]:
    """13000 -> "13.0" (CUDA_VERSION / cuDriverGetVersion encoding)."""
    if not v:
        return None
    return "%d.%d" % (v // 1000, v % 1000 // 10)


def cupti_version_str(v: Optional[int]) -> Optional[str]:
    """CUPTI_API_VERSION: 130001 -> "13.0.1"; the old small integers as "API 18"."""
    if not v:
        return None
    if v >= 10000:
        return "%d.%d.%d" % (v // 10000, v // 100 % 100, v % 100)
    return "API %d" % v


def _read(path: str) -> Optional[str]:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def proc_driver_version() -> Optional[str]:
    """The kernel module's version ("580.159.04") from /proc, or None."""
    text = _read("/proc/driver/nvidia/version") or ""
    for line in text.splitlines():
        if "Kernel Module" in line:
            m = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)?)\s", line + " ")
            if m:
                return m.group(1)
    return None


def proc_gpus() -> List[Dict[str, str]]:
    """GPUs the kernel module knows (all of them, whatever CUDA_VISIBLE_DEVICES
    says), in PCI order: [{"model": "NVIDIA H200", "bus": "0000:19:00.0"}]."""
    out = []
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        d = {"bus": os.path.basename(os.path.dirname(info))}
        for line in (_read(info) or "").splitlines():
            k, _, v = line.partition(":")
            if k.strip() == "Model":
                d["model"] = v.strip()
        out.append(d)
    return out


def _summarise_models(models: List[str]) -> str:
    counts = {}
    for m in models:
        counts[m] = counts.get(m, 0) + 1
    return ", ".join(m if n == 1 else "%d x %s" % (n, m) for m, n in counts.items())


def cheap() -> dict:
    """Facts read from files and constants only: no library opened."""
    gpus = proc_gpus()
    torch = sys.modules.get("torch")       # only if the user already imported it
    torch_cuda = getattr(getattr(torch, "version", None), "cuda", None) if torch else None
    return {
        "driver": proc_driver_version(),
        "gpus": [g.get("model", "?") for g in gpus],
        "cuda_headers": cuda_version_str(_core.CUDA_HEADER_VERSION),
        "cupti_headers": cupti_version_str(_core.CUPTI_HEADER_VERSION),
        "torch_cuda": torch_cuda,
        "env": {k: os.environ[k] for k in ENV_VARS if k in os.environ},
    }


def driver() -> dict:
    """cheap() plus the CUDA version the driver supports (opens libcuda, no cuInit)."""
    d = cheap()
    lib = _libraries.load(_libraries.CUDA)
    d["libcuda"] = _lib_dict(lib)
    d["driver_cuda"] = cuda_version_str(_core.driver_version()) if lib.loaded else None
    return d


def _lib_dict(lib) -> dict:
    return {"found": lib.loaded, "path": lib.path or None,
            "how": _libraries.how_found(lib) if lib.loaded else None,
            "found_via": lib.found_via or None,
            "error": None if lib.loaded else (lib.error or "no candidate"),
            "tried": [] if lib.loaded else list(lib.tried)}


def devices() -> (int, List[dict]):
    """(CUresult of cuInit/cuDeviceGetCount, [device facts]); initialises CUDA."""
    rc = _core.driver_init()
    if rc != 0:
        return rc, []
    rc, n = _core.device_count()
    out = []
    for i in range(n if rc == 0 else 0):
        info = _core.device_info(i)
        if isinstance(info, int):
            out.append({"index": i, "error": info})
            continue
        name, total, major, minor, sms, clock_khz, mem_khz, l2, bus = info
        out.append({"index": i, "name": name, "sm": "sm_%d%d" % (major, minor),
                    "memory_gib": round(total / 2**30, 1), "sms": sms,
                    "clock_mhz": clock_khz // 1000, "l2_mib": round(l2 / 2**20, 1)})
    return rc, out


def cupti_free() -> dict:
    """Subscribe to CUPTI and let go at once: {"free": True} or why not."""
    from . import _scope
    from ._errors import CudaUnavailableError, ToolConflictError
    scope = _scope.launch_blocking()
    try:
        scope.__enter__()
    except ToolConflictError as e:
        return {"free": False, "holder": e.holder, "error": str(e)}
    except CudaUnavailableError as e:
        return {"free": None, "error": str(e)}
    scope.__exit__(None, None, None)
    return {"free": True}


def frameworks() -> Dict[str, str]:
    """Installed versions of the GPU frameworks (package metadata: nothing imported)."""
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover (Python < 3.8)
        return {}
    out = {}
    for name in FRAMEWORKS:
        try:
            out[name] = metadata.version(name)
        except Exception:
            pass
    return out


def full(probe_cupti: bool = True) -> dict:
    """Everything doctor reports. Initialises CUDA (in this process)."""
    from . import __version__
    d = driver()
    d.update(cuda_debug=__version__, python=platform.python_version(),
             executable=sys.executable, platform=platform.platform(),
             toolkits=_libraries._cuda_roots(), frameworks=frameworks(),
             pathfinder=_libraries.pathfinder_version(), frame_reader=_core.FRAME_READER,
             free_threaded=bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
             gil_enabled=sys._is_gil_enabled() if hasattr(sys, "_is_gil_enabled") else True)
    d["init"] = None
    d["devices"] = []
    d["cupti"] = d["cublas"] = None
    d["cupti_version"] = None
    d["cupti_free"] = None
    if d["libcuda"]["found"]:
        rc, devs = devices()
        d["init"] = {"code": rc, "name": _cuda_name(rc)}
        d["devices"] = devs
    d["cupti"] = _lib_dict(_libraries.load(_libraries.CUPTI))
    if d["cupti"]["found"]:      # None without an initialised driver (csrc/python/py_base.c)
        d["cupti_version"] = cupti_version_str(_core.cupti_version())
    d["cublas"] = _lib_dict(_libraries.load(_libraries.CUBLAS))
    d["assert_text"] = assert_text_capture(d)
    if probe_cupti and d["devices"] and d["cupti"]["found"]:
        d["cupti_free"] = cupti_free()
    return d


#: doctor's "problem" values: why watch() and launch_blocking() cannot work here
PROBLEMS = ("no_driver", "no_gpu", "no_cupti", "cupti_held", "cupti_error")


def verdict(d: dict) -> Tuple[Optional[str], str]:
    """(problem, verdict) of full()'s facts `d`: problem is None when watch() and
    launch_blocking() work here, else one of PROBLEMS; the verdict says it in
    words, and what to do (``doctor``'s last line)."""
    if not d["libcuda"]["found"]:
        found = [name for name, key in (("CUPTI", "cupti"), ("cuBLAS", "cublas"))
                 if (d.get(key) or {}).get("found")]
        return "no_driver", (
            "not usable here: no NVIDIA driver (libcuda.so.1 not found): watch() and "
            "launch_blocking() need an NVIDIA GPU and its driver%s. cuda_debug still "
            "imports, and translates the CUDA errors that frameworks raise."
            % (" (%s %s installed)" % (" and ".join(found), "are" if len(found) > 1 else "is")
               if found else ""))
    init = d.get("init") or {}
    if init.get("code") or not d["devices"]:
        return "no_gpu", ("not usable here: no usable GPU (cuInit: %s), so watch() and "
                          "launch_blocking() cannot work; they need an NVIDIA GPU."
                          % (init.get("name") or "no device"))
    if not d["cupti"]["found"]:
        return "no_cupti", ("not usable here: CUPTI was not found, and watch() and "
                            "launch_blocking() need it. Install the CUDA toolkit or the "
                            "nvidia-cuda-cupti wheel, or set CUDA_HOME.")
    free = d.get("cupti_free") or {}
    if free.get("free") is False:
        return "cupti_held", (
            "not usable now: CUPTI is held by another tool (%s): watch() and launch_blocking() "
            "would raise ToolConflictError, or with PyTorch imported synchronise after every "
            "op instead." % (free.get("holder") or "a profiler"))
    if free.get("free") is None:
        return "cupti_error", "not usable here: CUPTI could not be subscribed: %s" % \
            free.get("error")
    return None, "watch() and launch_blocking() work here."



def assert_text_capture(d: dict) -> dict:
    """Can the device's assert text be caught for reports here? It is, from
    libcuda's writes to its own reference to libc's `stderr` (csrc/capture/
    stderr_tee.c): how many such references libcuda has, and whether
    CUDA_DEBUG_CAPTURE leaves capture on."""
    from . import _options
    n = _core.stderr_references(d["libcuda"]["path"]) if d["libcuda"]["found"] else None
    on = bool(_options.OPTIONS.capture)
    return {"state": assert_text_state(on, n), "capture_setting": "on" if on else "off",
            "stderr_references": n}


#: assert_text_capture()'s "state": what doctor's `assert text` row says
ASSERT_TEXT_STATES = ("captured", "not_captured", "off", "not_checked")


def assert_text_state(on: bool, stderr_references: Optional[int]) -> str:
    """``captured`` (libcuda writes the text through a stderr reference that
    cuda_debug redirects), ``not_captured`` (libcuda has none), ``off``
    (CUDA_DEBUG_CAPTURE=off) or ``not_checked`` (no libcuda to look at)."""
    if not on:
        return "off"
    if stderr_references is None or stderr_references < 0:
        return "not_checked"
    return "captured" if stderr_references > 0 else "not_captured"


def _cuda_name(rc: int) -> str:
    from . import _cuda_errors
    return _cuda_errors.name(rc)


def header_line(blocking: str, depth: str = "cheap", unusable: Optional[str] = None) -> str:
    """One line for the pytest report header.

    `blocking` says what the plugin will do ("on (every test)", "off"...);
    `depth` is "cheap" (files only), "driver" (libcuda opened, no cuInit) or
    "full" (cuInit: only when every test runs in a scope anyway). `unusable`:
    said instead of `blocking` when "full" finds no usable GPU (what was asked
    for cannot be had: the tests run without it)."""
    from . import __version__
    d = driver() if depth in ("driver", "full") else cheap()
    parts = []
    gpus = d["gpus"]
    usable = depth != "full"
    if depth == "full" and d.get("libcuda", {}).get("found"):
        rc, devs = devices()
        names = [x.get("name", "?") for x in devs]
        usable = bool(names)
        if names:
            gpus = names
        elif rc:
            parts.append("no usable GPU (cuInit: %s)" % _cuda_name(rc))
    if not usable and unusable:
        blocking = unusable
    if gpus:
        parts.append("GPU %s" % _summarise_models(gpus))
    elif not parts:
        parts.append("no NVIDIA GPU found")
    drv = d["driver"]
    if d.get("driver_cuda"):
        parts.append("driver %s (CUDA %s)" % (drv or "?", d["driver_cuda"]))
    elif drv:
        parts.append("driver %s" % drv)
    elif depth != "cheap" and not d["libcuda"]["found"]:
        parts.append("no CUDA driver (libcuda.so.1 not found)")
    parts.append("built with CUDA %s headers" % d["cuda_headers"])
    if d.get("torch_cuda"):
        parts.append("torch CUDA %s" % d["torch_cuda"])
    parts.append("launch blocking: %s" % blocking)
    if "CUDA_LAUNCH_BLOCKING" in d["env"]:
        parts.append("CUDA_LAUNCH_BLOCKING=%s" % d["env"]["CUDA_LAUNCH_BLOCKING"])
    if "CUDA_VISIBLE_DEVICES" in d["env"]:
        parts.append("CUDA_VISIBLE_DEVICES=%s" % d["env"]["CUDA_VISIBLE_DEVICES"])
    return "cuda_debug %s: %s" % (__version__, ", ".join(parts))


def libcuda_mapped() -> bool:
    """Has something (a framework, or cuda_debug) loaded libcuda into this
    process? Read from /proc/self/maps: loading nothing, initialising nothing."""
    st = _libraries.status(_libraries.CUDA)
    if st is not None and st.loaded:
        return True
    try:
        with open("/proc/self/maps") as f:
            return any("libcuda.so" in line for line in f)
    except OSError:
        return False


def context_dead() -> Optional[int]:
    """After a failure that speaks of CUDA, in a process that already loaded
    libcuda: is the current (or an active primary) context dead? The sticky code
    cuCtxSynchronize returns, else None. A framework's words are not enough (a
    program may raise them, or relay a child process's): only the driver, asked
    now, says whether the context is dead (pytest's fail fast and `run`'s exit
    status 3 both ask it here)."""
    if not libcuda_mapped():
        return None
    if not _libraries.load(_libraries.CUDA).loaded or _core.driver_init() != 0:
        return None
    from . import _cuda_errors
    rc = _core.synchronize(-1)
    return rc if _cuda_errors.is_sticky(rc) else None
