"""GEMM and launch-latency microbenchmarks: what does synchronous launching cost?

::

    >>> from cuda_debug import bench
    >>> res = bench.gemm(sizes=[1024, 4096, 8192], dtypes=["fp32", "tf32", "bf16"])
    >>> print(res.table())              # ms, TFLOP/s, % of peak, slowdown vs async
    >>> res.array["slowdown"]           # NumPy structured array, one row per configuration
    >>> res.to_csv("gemm.csv"); res.to_json("gemm.json"); res.plot("gemm.png")
    >>> print(bench.launch_latency().table())   # why: the cost of one synchronised launch

The timing loops are C (``csrc/gemm_bench.c``) calling cuBLAS, loaded at run time
like the rest of cuda_debug; nothing here imports PyTorch.

Modes
-----
``async``
    launches back to back, one stream sync at the end of each loop.
``sync``
    ``cuStreamSynchronize`` after every GEMM (what ``torch.cuda.synchronize()``
    after each matmul does).
``scope``
    the ``async`` loop run inside :func:`cuda_debug.launch_blocking`: the CUPTI
    hook makes each kernel launch made by cuBLAS wait for its kernel.
``launch_blocking``
    the ``async`` loop run again in a child process started with
    ``CUDA_LAUNCH_BLOCKING=1`` (the variable is read once, at context creation,
    so a child is the only honest way to measure it); the child reports the
    variable's value back (``meta["launch_blocking_child"]``).

Columns of :attr:`GemmResult.array`
-----------------------------------
``m, n, k``
    C (m x n) = A (m x k) @ B (k x n), row-major and contiguous, like
    ``torch.matmul(a, b, out=c)`` (the same cuBLAS call PyTorch makes).
``dtype``
    ``fp32`` (fp32 in, fp32 out; TF32 only when ``allow_tf32``), ``tf32`` (fp32
    in and out, TF32 tensor cores: ``CUBLAS_COMPUTE_32F_FAST_TF32``, what PyTorch
    does for fp32 with ``allow_tf32=True``), ``fp16``, ``bf16`` (16-bit in and
    out, fp32 accumulation: ``CUBLAS_COMPUTE_32F``).
``mode``, ``api``
    the mode above; ``gemmex`` (``cublasGemmEx``) or ``lt`` (``cublasLtMatmul``
    with the fastest of the heuristic's first ``lt_algos`` algorithms, timed once
    per problem and process).
``allow_tf32, allow_fp16_reduced, allow_bf16_reduced``
    the ``torch.backends.cuda.matmul`` flags the row ran with:
    ``allow_tf32`` -> ``CUBLAS_TF32_TENSOR_OP_MATH`` (and the FAST_TF32 compute
    type) for fp32; ``allow_{fp16,bf16}_reduced_precision_reduction=False`` ->
    ``CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION`` (cuBLASLt: split-k
    reduction only in the compute type). A flag that does not apply to the
    row's dtype is recorded as given and has no effect.
``flush``
    whether L2 was flushed (a memset of a buffer at least twice the L2) before
    each of the event-timed samples.
``ms, p10_ms, p90_ms``
    **the headline**: wall-clock milliseconds per GEMM of a loop of ``loop_n``
    back-to-back GEMMs with one stream sync at the end (in ``sync`` mode, a sync
    after each), median / 10th / 90th percentile over ``loops`` loops. This is
    what a user's loop of matmuls experiences in each mode (the measurement of
    "ms per torch.matmul(out=) call" in the seed articles).
``tflops``
    ``2*m*n*k / ms``. ``pct_peak``: ``tflops`` as a percentage of the GPU's dense
    peak for the row's effective dtype (see :data:`PEAK_FLOP_PER_CLOCK_PER_SM`),
    NaN for unknown architectures.
``slowdown``
    ``ms`` / ``ms`` of the ``async`` row of the same problem (NaN without one).
``gpu_ms, gpu_p10_ms, gpu_p90_ms``
    CUDA-event time of one GEMM, timed one at a time (``samples`` of them), L2
    flushed before each when ``flush``. In ``async`` and ``sync`` modes this is
    the kernel time; in ``scope`` and ``launch_blocking`` modes the end event is
    recorded after the blocking launch returned, so it also holds the idle GPU
    time of that round trip.
``call_ms, call_p90_ms``
    host time of one GEMM call in the same samples, including the mode's sync:
    what one call costs the calling thread.
``samples, loops, loop_n``
    event-timed samples; loops; GEMMs per loop (chosen by the first mode run,
    then reused by the others so every mode times the same work).
``rel_err``
    ``max|C - A@B| / max(|A|@|B|)`` against a float64 reference on the host,
    NaN when not checked (``check``); above :data:`TOLERANCE` raises.
``sm_mhz``
    median SM clock seen through NVML while the row ran, NaN when NVML is absent.

Random inputs: random sign and mantissa, magnitude in [2^-7, 1), generated once
per shape on the host and copied to the device (never zeros).
"""
import csv
import io
import json
import math
import os
import platform
import subprocess
import sys
import threading
import time
import warnings
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _core, _errors, _libraries

DTYPES = ("fp32", "tf32", "fp16", "bf16")
MODES = ("async", "sync", "scope", "launch_blocking")
APIS = ("gemmex", "lt")

_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
                  "bfloat16": "bf16"}
_DTYPE_CODE = {"fp32": 0, "tf32": 1, "fp16": 2, "bf16": 3}
_ELEMENT_BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2}
_API_CODE = {"gemmex": 0, "lt": 1}

#: the ``torch.backends.cuda.matmul`` flags, and PyTorch's defaults for them
FLAG_NAMES = ("allow_tf32", "allow_fp16_reduced_precision_reduction",
              "allow_bf16_reduced_precision_reduction")
TORCH_DEFAULT_FLAGS = {"allow_tf32": False, "allow_fp16_reduced_precision_reduction": True,
                       "allow_bf16_reduced_precision_reduction": True}
_FLAG_ALIASES = {"tf32": "allow_tf32", "fp16_reduced": "allow_fp16_reduced_precision_reduction",
                 "bf16_reduced": "allow_bf16_reduced_precision_reduction",
                 "fp16_rr": "allow_fp16_reduced_precision_reduction",
                 "bf16_rr": "allow_bf16_reduced_precision_reduction"}

#: Dense (no sparsity) FLOP per clock per SM, by compute capability. Peak TFLOP/s =
#: SM count x the maximum SM clock the device reports x this. Sources: NVIDIA's
#: architecture whitepapers and datasheets (V100 15.7 TF fp32 / 125 TF fp16 at
#: 1530 MHz x 80 SMs; A100 19.5 / 156 tf32 / 312 fp16 at 1410 MHz x 108; A10/A40/
#: L40S class: 128 fp32 cores, tf32 = half of fp16; H100/H200 66.9 TF fp32 at
#: 1980 MHz x 132, 989 TF bf16 = 4096 FLOP/clk/SM at 1830 MHz; B200 2.25 PF bf16
#: x 148 SMs). NVIDIA quotes tensor peaks at a lower clock than the maximum, so
#: 100% is out of reach; GeForce cards run fp16 with fp32 accumulation at half the
#: rate listed here, so their % of peak reads low.
PEAK_FLOP_PER_CLOCK_PER_SM = {
    (7, 0): {"fp32": 128, "fp16": 1024},
    (8, 0): {"fp32": 128, "tf32": 1024, "fp16": 2048, "bf16": 2048},
    (8, 6): {"fp32": 256, "tf32": 512, "fp16": 1024, "bf16": 1024},
    (8, 9): {"fp32": 256, "tf32": 512, "fp16": 1024, "bf16": 1024},
    (9, 0): {"fp32": 256, "tf32": 2048, "fp16": 4096, "bf16": 4096},
    (10, 0): {"fp32": 256, "tf32": 4096, "fp16": 8192, "bf16": 8192},
}

#: Largest accepted rel_err (see the module docstring) per effective dtype:
#: a few units of the input (tf32) or output rounding, far below a wrong product.
TOLERANCE = {"fp32": 1e-5, "tf32": 2e-3, "fp16": 2e-3, "bf16": 1e-2}

WORKSPACE_BYTES = 32 << 20          # cuBLAS/cuBLASLt workspace (NVIDIA's Hopper advice)
_MEM_MARGIN = 64 << 20
_CHECK_AUTO_MAX = 512 ** 3          # check=None checks problems up to this m*n*k
_MAX_DIM = 2 ** 31 - 1
_CHILD_TAG = "CUDA_DEBUG_BENCH_RESULT "

_CUBLAS_STATUS = {0: "CUBLAS_STATUS_SUCCESS", 1: "CUBLAS_STATUS_NOT_INITIALIZED",
                  3: "CUBLAS_STATUS_ALLOC_FAILED", 7: "CUBLAS_STATUS_INVALID_VALUE",
                  8: "CUBLAS_STATUS_ARCH_MISMATCH", 11: "CUBLAS_STATUS_MAPPING_ERROR",
                  13: "CUBLAS_STATUS_EXECUTION_FAILED", 14: "CUBLAS_STATUS_INTERNAL_ERROR",
                  15: "CUBLAS_STATUS_NOT_SUPPORTED", 16: "CUBLAS_STATUS_LICENSE_ERROR"}


# ---------------------------------------------------------------- arguments --

def parse_size(size) -> Tuple[int, int, int]:
    """``1024`` / ``"1024"`` -> (1024, 1024, 1024); ``"4096x1024x512"`` or a
    3-sequence -> (m, n, k). Raises ValueError for anything else."""
    if isinstance(size, str):
        text = size.strip().lower()
        parts = text.split("x")
        if len(parts) not in (1, 3) or not all(p.strip().lstrip("+").isdigit() for p in parts):
            raise ValueError("size %r: expected N or MxNxK with positive integers" % size)
        dims = tuple(int(p) for p in parts)
    elif isinstance(size, (bool, np.bool_)):
        raise ValueError("size %r: expected a positive integer, not a bool" % (size,))
    elif isinstance(size, (int, np.integer)):
        dims = (int(size),)
    elif isinstance(size, (tuple, list)) and len(size) == 3:
        dims = tuple(size)
        for d in dims:
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
                raise ValueError("size %r: m, n, k must be integers" % (size,))
        dims = tuple(int(d) for d in dims)
    else:
        raise ValueError("size %r: expected N, 'MxNxK' or (m, n, k)" % (size,))
    if len(dims) == 1:
        dims = dims * 3
    for d in dims:
        if d <= 0:
            raise ValueError("size %r: sizes must be > 0" % (size,))
        if d > _MAX_DIM:
            raise ValueError("size %r: %d is larger than cuBLAS's int dimension (2^31-1)"
                             % (size, d))
    return dims


def _as_list(value, what) -> list:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (int, np.integer)) and what == "sizes":
        return [value]
    try:
        return list(value)
    except TypeError:
        raise ValueError("%s: expected a list, got %r" % (what, value)) from None


def _unique(seq):
    return list(dict.fromkeys(seq))


def _parse_sizes(sizes) -> List[Tuple[int, int, int]]:
    """A list of sizes (a tuple of three ints is three square sizes: write a
    non-square problem as ``[(m, n, k)]`` or ``"MxNxK"``)."""
    items = _as_list(sizes, "sizes")
    if not items:
        raise ValueError("sizes: at least one size is needed")
    return _unique(parse_size(s) for s in items)


def _parse_choice(values, allowed, what, aliases=None) -> list:
    items = _as_list(values, what)
    if not items:
        raise ValueError("%s: at least one is needed (one of %s)" % (what, ", ".join(allowed)))
    out = []
    for v in items:
        if not isinstance(v, str):
            raise ValueError("%s: %r is not one of %s" % (what, v, ", ".join(allowed)))
        key = v.strip().lower()
        key = (aliases or {}).get(key, key)
        if key not in allowed:
            raise ValueError("unknown %s %r: expected one of %s"
                             % (what[:-1] if what.endswith("s") else what, v, ", ".join(allowed)))
        out.append(key)
    return _unique(out)


def torch_flags() -> Dict[str, bool]:
    """The current ``torch.backends.cuda.matmul`` flags when torch is imported,
    else PyTorch's defaults. Never imports torch."""
    flags = dict(TORCH_DEFAULT_FLAGS)
    torch = sys.modules.get("torch")
    if torch is None:
        return flags
    try:
        matmul = torch.backends.cuda.matmul
    except AttributeError:
        return flags
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in FLAG_NAMES:
            try:
                value = getattr(matmul, name)
            except Exception:        # newer torch may refuse mixed legacy/new TF32 APIs
                if name == "allow_tf32":
                    try:
                        value = getattr(matmul, "fp32_precision") == "tf32"
                    except Exception:
                        continue
                else:
                    continue
            if isinstance(value, tuple):   # (allow, allow_splitk) in some versions
                value = value[0] if value else True
            flags[name] = bool(value)
    return flags


def _check_flags(flags: dict, base: dict) -> dict:
    if not isinstance(flags, dict):
        raise ValueError("flags: expected a dict of %s, got %r" % (", ".join(FLAG_NAMES), flags))
    out = dict(base)
    for key, value in flags.items():
        name = _FLAG_ALIASES.get(key, key)
        if name not in FLAG_NAMES:
            raise ValueError("unknown flag %r: expected %s" % (key, ", ".join(FLAG_NAMES)))
        if not isinstance(value, (bool, np.bool_, int)) or value not in (0, 1):
            raise ValueError("flag %s=%r: expected True or False" % (key, value))
        out[name] = bool(value)
    return out


def resolve_flags(flags=None) -> List[Dict[str, bool]]:
    """The flag sets to run: ``None`` or ``"torch"`` -> [the current torch
    settings (defaults when torch is not imported)]; ``"default"`` -> [PyTorch's
    defaults]; ``"sweep"`` -> every combination; a dict (missing keys from the
    current settings) or a list of dicts."""
    current = torch_flags()
    if flags is None or flags == "torch" or flags == "current":
        return [current]
    if flags == "default":
        return [dict(TORCH_DEFAULT_FLAGS)]
    if flags == "sweep":
        return [{"allow_tf32": t, "allow_fp16_reduced_precision_reduction": r,
                 "allow_bf16_reduced_precision_reduction": r}
                for t in (False, True) for r in (True, False)]
    if isinstance(flags, dict):
        return [_check_flags(flags, current)]
    if isinstance(flags, (list, tuple)) and flags:
        return _unique_dicts(_check_flags(f, current) for f in flags)
    raise ValueError("flags: expected None, 'torch', 'default', 'sweep', a dict or a list "
                     "of dicts, got %r" % (flags,))


def _unique_dicts(items):
    out, seen = [], set()
    for d in items:
        key = tuple(sorted(d.items()))
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def effective_dtype(dtype: str, flags: dict) -> str:
    """What the tensor cores compute in: fp32 with ``allow_tf32`` is tf32."""
    if dtype == "fp32" and flags.get("allow_tf32"):
        return "tf32"
    return dtype


def math_bits(dtype: str, flags: dict) -> int:
    """The C layer's math word: bit 0 TF32 for fp32, bit 1 disallow
    reduced-precision (output-type) reduction for fp16/bf16."""
    bits = 0
    if dtype == "fp32" and flags.get("allow_tf32"):
        bits |= 1
    if dtype == "fp16" and not flags.get("allow_fp16_reduced_precision_reduction", True):
        bits |= 2
    if dtype == "bf16" and not flags.get("allow_bf16_reduced_precision_reduction", True):
        bits |= 2
    return bits


def _relevant_flags(dtype: str, flags: dict) -> tuple:
    if dtype == "fp32":
        return (bool(flags["allow_tf32"]),)
    if dtype == "fp16":
        return (bool(flags["allow_fp16_reduced_precision_reduction"]),)
    if dtype == "bf16":
        return (bool(flags["allow_bf16_reduced_precision_reduction"]),)
    return ()


class Config(NamedTuple):
    m: int
    n: int
    k: int
    dtype: str
    flags: Dict[str, bool]
    api: str

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def label(self) -> str:
        return size_label(self.m, self.n, self.k)


def size_label(m, n, k) -> str:
    return str(m) if m == n == k else "%dx%dx%d" % (m, n, k)


def plan(sizes, dtypes, flags=None, apis=("gemmex",)) -> List[Config]:
    """Validated configurations, in run order (dtype, flags, api, size);
    flag sets that do not change a dtype's GEMM are run once."""
    shapes = _parse_sizes(sizes)
    dts = _parse_choice(dtypes, DTYPES, "dtypes", _DTYPE_ALIASES)
    flag_sets = resolve_flags(flags)
    out, seen = [], set()
    for dtype in dts:
        for f in flag_sets:
            f = dict(f)
            if dtype == "tf32":
                f["allow_tf32"] = True
            for api in apis:
                for (m, n, k) in shapes:
                    key = (dtype, _relevant_flags(dtype, f), api, m, n, k)
                    if key in seen:
                        continue
                    seen.add(key)
                    out.append(Config(m, n, k, dtype, f, api))
    return out


def _check_positive(name, value, integer=False, allow_zero=False):
    ok_type = (isinstance(value, (int, np.integer)) if integer
               else isinstance(value, (int, float, np.integer, np.floating)))
    if isinstance(value, (bool, np.bool_)) or not ok_type or not math.isfinite(value) or \
            value < 0 or (value == 0 and not allow_zero):
        raise ValueError("%s=%r: expected a %s number" % (
            name, value, "non-negative" if allow_zero else "positive"))


# ------------------------------------------------------------------ numbers --

def summarize(samples) -> Tuple[float, float, float]:
    """(median, 10th percentile, 90th percentile), linear interpolation
    (NumPy's default); NaNs for no samples."""
    a = np.asarray(samples, dtype=np.float64)
    if a.size == 0:
        return (math.nan, math.nan, math.nan)
    p10, med, p90 = np.percentile(a, [10, 50, 90])
    return (float(med), float(p10), float(p90))


def peak_tflops(cc: Tuple[int, int], sm_count: int, clock_khz: int) -> Dict[str, Optional[float]]:
    """Dense peak TFLOP/s per dtype at the maximum SM clock; None when unknown."""
    table = PEAK_FLOP_PER_CLOCK_PER_SM.get(tuple(cc), {})
    out = {}
    for dt in DTYPES:
        per = table.get(dt)
        out[dt] = per * sm_count * clock_khz * 1e3 / 1e12 if per and sm_count and clock_khz \
            else None
    return out


def decode(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Host copy from the C layer -> float64 (fp16/bf16 arrive as uint16 bits)."""
    if dtype in ("fp32", "tf32"):
        return bits.astype(np.float64)
    if dtype == "fp16":
        return bits.view(np.float16).astype(np.float64)
    if dtype == "bf16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    raise ValueError("unknown dtype %r" % dtype)


def relative_error(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
    """``max|c - a@b| / max(|a|@|b|)`` in float64."""
    ref = a @ b
    scale = float(np.max(np.abs(a) @ np.abs(b)))
    if scale == 0.0:
        return float(np.max(np.abs(c - ref)))
    return float(np.max(np.abs(c - ref)) / scale)


def memory_needed(m: int, n: int, k: int, dtype: str, flush_bytes: int,
                  workspace_bytes: int = WORKSPACE_BYTES) -> int:
    """Device bytes one problem needs: A, B, C, workspace, flush buffer, margin."""
    return ((m * k + k * n + m * n) * _ELEMENT_BYTES[dtype] + flush_bytes + workspace_bytes
            + _MEM_MARGIN)


def check_memory(configs: Sequence[Config], free_bytes: int, total_bytes: int,
                 flush_bytes: int, gpu: str = "the GPU") -> None:
    """ValueError naming every problem that cannot fit in `free_bytes`."""
    bad = []
    for c in configs:
        need = memory_needed(c.m, c.n, c.k, c.dtype, flush_bytes)
        if need > free_bytes:
            bad.append("%s %s needs %.2f GiB" % (c.label, c.dtype, need / 2 ** 30))
    if bad:
        raise ValueError("too large for %s's memory (%.2f GiB free of %.2f GiB): %s"
                         % (gpu, free_bytes / 2 ** 30, total_bytes / 2 ** 30,
                            "; ".join(_unique(bad))))


def flush_size(l2_bytes: int) -> int:
    """An L2-flush buffer at least twice the L2, whole MiB, at least 8 MiB."""
    mib = 1 << 20
    return max(8 * mib, -(-2 * max(int(l2_bytes), 0) // mib) * mib)


# ------------------------------------------------------------------- device --

class DeviceInfo(NamedTuple):
    ordinal: int
    name: str
    total_bytes: int
    cc: Tuple[int, int]
    sm_count: int
    clock_khz: int
    mem_clock_khz: int
    l2_bytes: int
    pci_bus: int


def _cuda_error(code: int, what: str) -> _errors.CudaError:
    from . import _cuda_errors
    where = ""
    last = _core.last_call()
    if last and last[0] == code:
        where = ": %s at %s:%d" % (last[2], last[3], last[4])
    cls = _errors.class_for(code)
    return cls("%s: %s (%d): %s%s" % (what, _cuda_errors.name(code), code,
                                       _cuda_errors.description(code), where), code=code)


def _check_device(device) -> None:
    if isinstance(device, (bool, np.bool_)) or not isinstance(device, (int, np.integer)) \
            or device < 0:
        raise ValueError("device=%r: expected a device ordinal >= 0" % (device,))


def device_info(device: int = 0) -> DeviceInfo:
    """Driver up, `device` exists: its properties (raises otherwise)."""
    _check_device(device)
    _libraries.ensure(_libraries.CUDA)
    rc, count = _core.device_count()
    if rc:
        raise _cuda_error(rc, "cuDeviceGetCount")
    if device >= count:
        raise ValueError("device=%d: this machine has %d CUDA device%s"
                         % (device, count, "" if count == 1 else "s"))
    info = _core.device_info(int(device))
    if isinstance(info, int):
        raise _cuda_error(info, "device_info(%d)" % device)
    name, total, major, minor, sms, clock, mclock, l2, bus = info
    return DeviceInfo(int(device), name, total, (major, minor), sms, clock, mclock, l2, bus)


class _Nvml:
    """SM clocks and the driver version through NVML (libnvidia-ml), if present.
    Everything here fails soft: None when NVML cannot answer."""

    _lib = None
    _tried = False
    _lock = threading.Lock()

    @classmethod
    def lib(cls):
        with cls._lock:
            if not cls._tried:
                cls._tried = True
                try:
                    import ctypes
                    lib = ctypes.CDLL("libnvidia-ml.so.1")
                    if lib.nvmlInit_v2() == 0:
                        cls._lib = lib
                except Exception:
                    cls._lib = None
            return cls._lib

    @classmethod
    def handle(cls, pci_bus: int):
        lib = cls.lib()
        if lib is None:
            return None
        import ctypes

        class PciInfo(ctypes.Structure):
            # nvmlPciInfo_t, padded: NVML writes no more than the real struct
            _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint),
                        ("bus", ctypes.c_uint), ("device", ctypes.c_uint),
                        ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                        ("busId", ctypes.c_char * 32), ("_pad", ctypes.c_char * 64)]
        try:
            count = ctypes.c_uint(0)
            if lib.nvmlDeviceGetCount_v2(ctypes.byref(count)) != 0:
                return None
            for i in range(count.value):
                h = ctypes.c_void_p()
                if lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)) != 0:
                    continue
                pci = PciInfo()
                if lib.nvmlDeviceGetPciInfo_v3(h, ctypes.byref(pci)) == 0 and pci.bus == pci_bus:
                    return h
        except Exception:
            return None
        return None

    @classmethod
    def sm_mhz(cls, handle) -> Optional[int]:
        lib = cls.lib()
        if lib is None or handle is None:
            return None
        import ctypes
        mhz = ctypes.c_uint(0)
        try:
            if lib.nvmlDeviceGetClockInfo(handle, 1, ctypes.byref(mhz)) != 0:  # NVML_CLOCK_SM
                return None
        except Exception:
            return None
        return int(mhz.value)

    @classmethod
    def max_sm_mhz(cls, handle) -> Optional[int]:
        lib = cls.lib()
        if lib is None or handle is None:
            return None
        import ctypes
        mhz = ctypes.c_uint(0)
        try:
            if lib.nvmlDeviceGetMaxClockInfo(handle, 1, ctypes.byref(mhz)) != 0:
                return None
        except Exception:
            return None
        return int(mhz.value) or None

    @classmethod
    def driver_version(cls) -> Optional[str]:
        lib = cls.lib()
        if lib is None:
            return None
        import ctypes
        buf = ctypes.create_string_buffer(96)
        try:
            if lib.nvmlSystemGetDriverVersion(buf, 96) != 0:
                return None
        except Exception:
            return None
        return buf.value.decode(errors="replace")


class _ClockSampler:
    """Polls the SM clock every `interval` seconds while the timed C call runs
    (it releases the GIL)."""

    def __init__(self, handle, interval: float = 0.01):
        self.handle = handle
        self.interval = interval
        self.values: List[int] = []
        self._stop = threading.Event()
        self._thread = None

    def _run(self):
        while not self._stop.is_set():
            v = _Nvml.sm_mhz(self.handle)
            if v:
                self.values.append(v)
            self._stop.wait(self.interval)

    def __enter__(self):
        if self.handle is not None:
            self._thread = threading.Thread(target=self._run, name="cuda_debug-clocks",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        v = _Nvml.sm_mhz(self.handle)
        if v:
            self.values.append(v)
        return False

    def median(self) -> float:
        return float(np.median(self.values)) if self.values else math.nan


def _driver_string(v: Optional[int]) -> Optional[str]:
    return "%d.%d" % (v // 1000, (v % 1000) // 10) if v else None


def _version_string(v: Optional[int], base: int = 100) -> Optional[str]:
    if not v:
        return None
    return "%d.%d.%d" % (v // (base * base), (v // base) % base, v % base)


def environment(device: int = 0) -> dict:
    """GPU, driver, CUDA, cuBLAS, Python, NumPy, PyTorch (when imported) and the
    git commit of this checkout: what a benchmark result must be recorded with."""
    from . import __version__
    env = {"cuda_debug": __version__, "python": platform.python_version(),
           "numpy": np.__version__, "platform": platform.platform()}
    try:
        info = device_info(device)
        env.update(gpu=info.name, device=device, compute_capability="%d.%d" % info.cc,
                   sm_count=info.sm_count, max_sm_clock_mhz=info.clock_khz // 1000,
                   memory_gib=round(info.total_bytes / 2 ** 30, 1),
                   l2_mib=round(info.l2_bytes / 2 ** 20, 1))
    except Exception as e:  # no GPU: say so, still record the rest
        env["gpu"] = "unavailable (%s)" % e
    env["driver"] = _Nvml.driver_version()
    env["driver_cuda"] = _driver_string(_core.driver_version())
    env["cuda_headers"] = _driver_string(_core.CUDA_HEADER_VERSION)
    lib = _libraries.status(_libraries.CUBLAS)
    env["cublas_path"] = lib.path if lib is not None and lib.loaded else None
    torch = sys.modules.get("torch")
    if torch is not None:
        env["torch"] = getattr(torch, "__version__", "?")
        env["torch_cuda"] = getattr(getattr(torch, "version", None), "cuda", None)
    env["git_commit"] = git_commit()
    env["CUDA_LAUNCH_BLOCKING"] = os.environ.get("CUDA_LAUNCH_BLOCKING")
    return env


def git_commit(path: Optional[str] = None) -> Optional[str]:
    """Short commit of the checkout holding `path` (this package by default),
    with ``-dirty`` when it has uncommitted changes; None outside git.
    ``$CUDA_DEBUG_COMMIT`` wins: a copy of the tree without .git (a GPU machine)
    is told which commit it is."""
    if os.environ.get("CUDA_DEBUG_COMMIT"):
        return os.environ["CUDA_DEBUG_COMMIT"]
    folder = path or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=folder,
                              capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=folder, capture_output=True, text=True, timeout=10)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def write_results_section(path: str, name: str, title: str, body: str) -> None:
    """Replace (or append) the section `name` of a results Markdown file: the
    text between ``<!-- BEGIN name -->`` and ``<!-- END name -->`` under a
    ``## title`` heading. Other sections are left as they are."""
    begin, end = "<!-- BEGIN %s -->" % name, "<!-- END %s -->" % name
    block = "%s\n%s\n%s" % (begin, body.rstrip("\n"), end)
    text = ""
    if os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            text = f.read()
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        if not text:
            text = "# cuda_debug benchmark results\n"
        text = text.rstrip("\n") + "\n\n## %s\n\n%s\n" % (title, block)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


# ------------------------------------------------------------------ running --

class _Progress:
    """One line per step on stderr (redrawn in place on a terminal)."""

    def __init__(self, total: int, progress, start: int = 0, elapsed: float = 0.0):
        self.total = total
        self.done = start
        self.callback = progress if callable(progress) else None
        self.enabled = bool(progress) and not self.callback
        self.tty = self.enabled and hasattr(sys.stderr, "isatty") and sys.stderr.isatty()
        self.t0 = time.monotonic() - elapsed

    def spec(self) -> dict:
        """What a child needs to continue this progress line."""
        return {"total": self.total, "start": self.done, "enabled": self.enabled,
                "elapsed": time.monotonic() - self.t0}

    def step(self, text: str) -> None:
        self.done += 1
        if self.callback is not None:
            self.callback(self.done, self.total, text)
        elif self.enabled:
            line = "[%d/%d %5.1fs] %s" % (self.done, self.total, time.monotonic() - self.t0, text)
            if self.tty:
                sys.stderr.write("\r\x1b[2K" + line)
                if self.done >= self.total:
                    sys.stderr.write("\n")
            else:
                sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty and self.done < self.total:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _failure(out: tuple, what: str) -> Exception:
    """The exception for a failure tuple (code, where, need, free) from C."""
    code, where, need, free = out
    if where == "memory":
        return ValueError("%s: too large for the GPU's memory: needs %.2f GiB, %.2f GiB free"
                          % (what, need / 2 ** 30, free / 2 ** 30))
    if where == "host":
        return MemoryError("%s: out of host memory" % what)
    if where == "unsupported":
        lib = _libraries.status(_libraries.CUBLAS)
        return _errors.CudaUnavailableError(
            "%s: cuBLASLt entry points were not found next to %s: use api='gemmex'"
            % (what, lib.path if lib else "libcublas"), missing="libcublasLt")
    if where == "cublas":
        last = _core.last_call()
        at = ": %s at %s:%d" % (last[2], last[3], last[4]) if last and last[1] == "cublas" else ""
        return _errors.CudaError("%s: cuBLAS failed: %s (%d)%s" % (
            what, _CUBLAS_STATUS.get(code, "cublasStatus_t"), code, at), cublas_status=code)
    return _cuda_error(code, what)


def _unpack_gemm(out: tuple, what: str) -> dict:
    if out[0] != 0:
        raise _failure(out, what)
    (_, _, gpu, call, loop_wall, loop_gpu, est, loop_n, cublas_version, check, lt_tried) = out
    return {"gpu_ms": gpu, "call_ms": call, "loop_ms": loop_wall, "loop_gpu_ms": loop_gpu,
            "est_ms": est, "loop_n": loop_n, "cublas_version": cublas_version, "check": check,
            "lt_tried": lt_tried}


def _gemm_kwargs(cfg: Config, device: int, opts: dict, counts: Optional[Tuple[int, int]],
                 sync_each: bool, check: bool) -> dict:
    return dict(m=cfg.m, n=cfg.n, k=cfg.k, dtype=_DTYPE_CODE[cfg.dtype],
                math=math_bits(cfg.dtype, cfg.flags), device=device, api=_API_CODE[cfg.api],
                sync_each=sync_each, flush_bytes=opts["flush_bytes"],
                workspace_bytes=WORKSPACE_BYTES, warmup_s=float(opts["warmup"]),
                samples=counts[0] if counts else int(opts["samples"] or 0),
                min_samples=min(10, opts["max_samples"]), max_samples=opts["max_samples"],
                sample_ms=float(opts["sample_ms"]), repeats=int(opts["repeats"]),
                loop_n=counts[1] if counts else 0, loop_ms=float(opts["loop_ms"]),
                check=check, seed=int(opts["seed"]), lt_algos=int(opts["lt_algos"]))


def _check_result(cfg: Config, raw: dict, mode: str) -> float:
    """rel_err of the checked product (NaN when not checked); raises when it
    is beyond the dtype's tolerance."""
    if raw.get("check") is None:
        return math.nan
    a, b, c = (decode(np.asarray(x), cfg.dtype) for x in raw["check"])
    err = relative_error(a, b, c)
    eff = effective_dtype(cfg.dtype, cfg.flags)
    if not err <= TOLERANCE[eff]:
        raise RuntimeError(
            "cuda_debug.bench.gemm: wrong product for %s %s (%s, %s): max error %.3g of "
            "max(|A||B|), tolerance %.3g: these timings would not be of the real GEMM"
            % (cfg.label, cfg.dtype, mode, cfg.api, err, TOLERANCE[eff]))
    return err


def _run_gemm_inprocess(cfg: Config, mode: str, device: int, opts: dict, counts, check: bool,
                        nvml_handle) -> dict:
    what = "cuda_debug.bench.gemm(%s %s, mode=%s)" % (cfg.label, cfg.dtype, mode)
    kwargs = _gemm_kwargs(cfg, device, opts, counts, mode == "sync", check)
    extra = {}
    with _ClockSampler(nvml_handle) as clocks:
        if mode == "scope":
            from ._scope import launch_blocking
            before = _core.stats()["synced"]
            with launch_blocking():
                out = _core.gemm(**kwargs)
            extra["hook_syncs"] = _core.stats()["synced"] - before
        else:
            out = _core.gemm(**kwargs)
    raw = _unpack_gemm(out, what)
    raw.update(extra)
    raw["rel_err"] = _check_result(cfg, raw, mode)
    raw["sm_mhz"] = clocks.median()
    raw.pop("check", None)
    return raw


def _child_command() -> List[str]:
    return [sys.executable, "-c",
            "import sys; from cuda_debug.bench import _child_main; sys.exit(_child_main())"]


def _child_env() -> dict:
    env = dict(os.environ)
    env["CUDA_LAUNCH_BLOCKING"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _run_child(spec: dict, timeout: float = 3600) -> dict:
    """Run `spec` in a child with CUDA_LAUNCH_BLOCKING=1; its stdout carries one
    tagged JSON line; its stderr (progress) goes to ours."""
    proc = subprocess.run(_child_command(), input=json.dumps(spec), stdout=subprocess.PIPE,
                          stderr=None, text=True, env=_child_env(), timeout=timeout)
    result = None
    for line in proc.stdout.splitlines():
        if line.startswith(_CHILD_TAG):
            result = json.loads(line[len(_CHILD_TAG):])
    if result is None:
        raise RuntimeError("cuda_debug.bench: the CUDA_LAUNCH_BLOCKING=1 child exited with %d "
                           "and no result; its output:\n%s"
                           % (proc.returncode, proc.stdout[-4000:]))
    err = result.get("error")
    if err:
        cls = {"ValueError": ValueError, "CudaUnavailableError": _errors.CudaUnavailableError,
               "ToolConflictError": _errors.ToolConflictError}.get(err["type"], RuntimeError)
        raise cls("in the CUDA_LAUNCH_BLOCKING=1 child: %s: %s" % (err["type"], err["message"]))
    return result


def _jsonable(obj):
    if isinstance(obj, np.ndarray):
        return [_jsonable(x) for x in obj.tolist()]
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


def _child_main(argv=None) -> int:
    """Entry point of the CUDA_LAUNCH_BLOCKING=1 child: a JSON spec on stdin,
    one tagged JSON line of results on stdout."""
    out = {"env": os.environ.get("CUDA_LAUNCH_BLOCKING"), "pid": os.getpid(), "results": [],
           "error": None}
    try:
        spec = json.loads(sys.stdin.read())
        device = spec["device"]
        p = spec["progress"]
        progress = _Progress(p["total"], p["enabled"], p["start"], p.get("elapsed", 0.0))
        if spec["kind"] == "gemm":
            _libraries.ensure(_libraries.CUBLAS)
            info = device_info(device)
            handle = _Nvml.handle(info.pci_bus)
            for item in spec["configs"]:
                cfg = Config(item["m"], item["n"], item["k"], item["dtype"], item["flags"],
                             item["api"])
                kwargs = item["kwargs"]
                what = "cuda_debug.bench.gemm(%s %s, mode=launch_blocking)" % (cfg.label,
                                                                              cfg.dtype)
                with _ClockSampler(handle) as clocks:
                    o = _core.gemm(**kwargs)
                raw = _unpack_gemm(o, what)
                raw["rel_err"] = _check_result(cfg, raw, "launch_blocking")
                raw["sm_mhz"] = clocks.median()
                raw.pop("check", None)
                out["results"].append(_jsonable(raw))
                progress.step("gemm %s %s launch_blocking: %.4f ms"
                              % (cfg.label, cfg.dtype, float(np.median(raw["loop_ms"]))))
        elif spec["kind"] == "latency":
            _libraries.ensure(_libraries.CUDA)
            device_info(device)
            o = _core.launch_latency(**spec["kwargs"])
            out["results"].append(_jsonable(_unpack_latency(o)))
            progress.step("latency launch_blocking")
        else:
            raise ValueError("unknown child kind %r" % spec["kind"])
        progress.close()
    except Exception as e:
        out["error"] = {"type": type(e).__name__, "message": str(e)}
    sys.stdout.write(_CHILD_TAG + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


def gemm(sizes=(1024, 4096, 8192), dtypes=("fp32", "tf32", "bf16"), modes=MODES, flags=None, *,
         api="gemmex", device: int = 0, warmup: float = 0.1, flush: bool = True,
         repeats: int = 10, loop_ms: float = 20.0, samples: Optional[int] = None,
         sample_ms: float = 200.0, max_samples: int = 200, check: Optional[bool] = None,
         seed: int = 0, lt_algos: int = 8,
         progress: Union[None, bool, Callable[[int, int, str], None]] = None) -> "GemmResult":
    """Time cuBLAS GEMMs in each launch mode; see the module docstring for the
    modes and every column of the result.

    sizes: ints (square), ``"MxNxK"`` strings or (m, n, k) tuples.
    dtypes: of ``fp32, tf32, fp16, bf16``. modes: of ``async, sync, scope,
    launch_blocking``. flags: ``torch.backends.cuda.matmul`` flags (None: the
    current torch settings if torch is imported, else PyTorch's defaults;
    ``"sweep"``: every combination; a dict; a list of dicts).
    api: ``gemmex`` (cublasGemmEx), ``lt`` (cublasLtMatmul, fastest of
    ``lt_algos`` heuristic candidates), or a list of both.
    warmup: seconds of back-to-back GEMMs before timing each row.
    flush: flush L2 (a buffer >= 2x L2) before each event-timed sample.
    repeats / loop_ms: loops timed for the headline, each about loop_ms long.
    samples (None: sample_ms worth, 10..max_samples): event-timed samples.
    check: compare with a float64 product on the host (None: for m*n*k <= 512^3).
    progress: True for a progress line on stderr, or a callable(done, total, text).

    Bad arguments raise ValueError before any GPU work, as do problems that do
    not fit in the GPU's free memory.
    """
    mode_list = _parse_choice(modes, MODES, "modes")
    api_list = _parse_choice(api, APIS, "apis")
    configs = plan(sizes, dtypes, flags, api_list)
    _check_positive("warmup", warmup, allow_zero=True)
    _check_positive("repeats", repeats, integer=True)
    _check_positive("loop_ms", loop_ms, allow_zero=True)
    _check_positive("sample_ms", sample_ms, allow_zero=True)
    _check_positive("max_samples", max_samples, integer=True)
    _check_positive("lt_algos", lt_algos, integer=True)
    if samples is not None:
        _check_positive("samples", samples, integer=True)
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or \
            not 0 <= seed < 2 ** 62:
        raise ValueError("seed=%r: expected an integer in [0, 2^62)" % (seed,))
    if check not in (None, True, False):
        raise ValueError("check=%r: expected None, True or False" % (check,))
    _check_device(device)

    info = device_info(device)
    _libraries.ensure(_libraries.CUBLAS)
    flush_bytes = flush_size(info.l2_bytes) if flush else 0
    rc = _core.bench_release(device)
    if rc:
        raise _cuda_error(rc, "cuda_debug.bench.gemm: releasing the previous buffers")
    rc, free_b, total_b = _core.mem_info(device)
    if rc:
        raise _cuda_error(rc, "cuda_debug.bench.gemm: cuMemGetInfo")
    check_memory(configs, free_b, total_b, flush_bytes, info.name)

    opts = dict(flush_bytes=flush_bytes, warmup=warmup, samples=samples, sample_ms=sample_ms,
                max_samples=int(max_samples), repeats=int(repeats), loop_ms=loop_ms,
                seed=int(seed), lt_algos=int(lt_algos))
    checks = [(c.m * c.n * c.k <= _CHECK_AUTO_MAX) if check is None else bool(check)
              for c in configs]
    handle = _Nvml.handle(info.pci_bus)
    if not info.clock_khz:                      # the driver did not say: ask NVML
        info = info._replace(clock_khz=(_Nvml.max_sm_mhz(handle) or 0) * 1000)
    local = [m for m in MODES if m in mode_list and m != "launch_blocking"]
    steps = _Progress(len(configs) * len(mode_list), progress)
    raws: Dict[Tuple[int, str], dict] = {}
    counts: Dict[int, Tuple[int, int]] = {}
    cublas_version = None
    child = None
    try:
        for i, cfg in enumerate(configs):
            for mode in local:
                raw = _run_gemm_inprocess(cfg, mode, device, opts, counts.get(i), checks[i],
                                          handle)
                counts.setdefault(i, (len(raw["gpu_ms"]), int(raw["loop_n"])))
                cublas_version = raw["cublas_version"]
                raws[(i, mode)] = raw
                steps.step("gemm %s %s %s%s: %.4f ms" % (
                    cfg.label, cfg.dtype, mode, "" if cfg.api == "gemmex" else " (lt)",
                    float(np.median(raw["loop_ms"]))))
        if "launch_blocking" in mode_list:
            _core.bench_release(device)      # the child needs the memory
            spec = {"kind": "gemm", "device": device,
                    "progress": steps.spec(),
                    "configs": [dict(m=c.m, n=c.n, k=c.k, dtype=c.dtype, flags=c.flags,
                                     api=c.api,
                                     kwargs=_gemm_kwargs(c, device, opts, counts.get(i), False,
                                                         checks[i]))
                                for i, c in enumerate(configs)]}
            child = _run_child(spec)
            for i, raw in enumerate(child["results"]):
                raw["child_env"] = child["env"]
                raws[(i, "launch_blocking")] = raw
                if callable(progress):
                    steps.step("gemm %s %s launch_blocking" % (configs[i].label, configs[i].dtype))
                cublas_version = cublas_version or raw.get("cublas_version")
    finally:
        steps.close()
        _core.bench_release(device)

    meta = _gemm_meta(info, device, flush_bytes, cublas_version, child)
    rows, samples_out = [], []
    for i, cfg in enumerate(configs):
        for mode in MODES:
            raw = raws.get((i, mode))
            if raw is None:
                continue
            rows.append(_gemm_row(cfg, mode, raw, flush_bytes > 0, meta["peak_tflops"]))
            samples_out.append(dict(raw, mode=mode, config=cfg))
    _fill_slowdown(rows)
    seen = [r["sm_mhz"] for r in rows if math.isfinite(r["sm_mhz"])]
    meta["sm_clock_seen_mhz"] = ({"min": float(min(seen)), "median": float(np.median(seen)),
                                  "max": float(max(seen))} if seen else None)
    return GemmResult(records("gemm", rows), meta, samples_out)


def records(kind: str, rows: Sequence[dict]) -> np.ndarray:
    """Rows (dicts keyed by field name) -> the NumPy structured array the C
    core builds for `kind` ("gemm" or "latency")."""
    names = _core.bench_records(kind, []).dtype.names
    return _core.bench_records(kind, [tuple(r[n] for n in names) for r in rows])


def _gemm_row(cfg: Config, mode: str, raw: dict, flush: bool, peaks: dict) -> dict:
    ms, p10, p90 = summarize(raw["loop_ms"])
    gpu, g10, g90 = summarize(raw["gpu_ms"])
    call, _, c90 = summarize(raw["call_ms"])
    tflops = cfg.flops / (ms * 1e-3) / 1e12 if ms > 0 else math.nan
    peak = peaks.get(effective_dtype(cfg.dtype, cfg.flags))
    return {"m": cfg.m, "n": cfg.n, "k": cfg.k, "dtype": cfg.dtype, "mode": mode, "api": cfg.api,
            "allow_tf32": bool(cfg.flags["allow_tf32"]),
            "allow_fp16_reduced": bool(cfg.flags["allow_fp16_reduced_precision_reduction"]),
            "allow_bf16_reduced": bool(cfg.flags["allow_bf16_reduced_precision_reduction"]),
            "flush": bool(flush), "ms": ms, "p10_ms": p10, "p90_ms": p90, "tflops": tflops,
            "pct_peak": 100.0 * tflops / peak if peak else math.nan, "slowdown": math.nan,
            "gpu_ms": gpu, "gpu_p10_ms": g10, "gpu_p90_ms": g90, "call_ms": call,
            "call_p90_ms": c90, "samples": len(raw["gpu_ms"]), "loops": len(raw["loop_ms"]),
            "loop_n": int(raw["loop_n"]),
            "rel_err": math.nan if raw.get("rel_err") is None else float(raw["rel_err"]),
            "sm_mhz": math.nan if raw.get("sm_mhz") is None else float(raw["sm_mhz"])}


def _problem_key(r: dict) -> tuple:
    return (r["m"], r["n"], r["k"], r["dtype"], r["api"], r["allow_tf32"],
            r["allow_fp16_reduced"], r["allow_bf16_reduced"])


def _fill_slowdown(rows: List[dict]) -> None:
    """slowdown = ms / ms of the async row of the same problem (in place)."""
    base = {_problem_key(r): r["ms"] for r in rows if r["mode"] == "async"}
    for r in rows:
        b = base.get(_problem_key(r))
        r["slowdown"] = r["ms"] / b if b and b > 0 else math.nan


def _gemm_meta(info: DeviceInfo, device: int, flush_bytes: int, cublas_version, child) -> dict:
    lib = _libraries.status(_libraries.CUBLAS)
    return {
        "gpu": info.name, "device": device, "compute_capability": "%d.%d" % info.cc,
        "sm_count": info.sm_count, "max_sm_clock_mhz": info.clock_khz // 1000,
        "memory_bytes": info.total_bytes, "l2_bytes": info.l2_bytes,
        "driver": _Nvml.driver_version(), "driver_cuda": _driver_string(_core.driver_version()),
        "cuda_headers": _driver_string(_core.CUDA_HEADER_VERSION),
        "cublas": _version_string(cublas_version),
        "cublas_path": lib.path if lib is not None and lib.loaded else None,
        "peak_tflops": peak_tflops(info.cc, info.sm_count, info.clock_khz),
        "flush_bytes": flush_bytes, "workspace_bytes": WORKSPACE_BYTES,
        "parent_CUDA_LAUNCH_BLOCKING": os.environ.get("CUDA_LAUNCH_BLOCKING"),
        "launch_blocking_child": ({"CUDA_LAUNCH_BLOCKING": child["env"], "pid": child["pid"]}
                                  if child else None),
    }


# ------------------------------------------------------------------- results --

def _fmt(v, spec: str, nan: str = "-") -> str:
    try:
        if v is None or (isinstance(v, float) and not math.isfinite(v)):
            return nan
    except TypeError:
        pass
    return format(v, spec)


def _render(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(c.rjust(w) if rt else c.ljust(w)
                         for c, w, rt in zip(cells, widths, right)).rstrip()
    return "\n".join([line(headers), line(["-" * w for w in widths])] + [line(r) for r in rows])


def flags_label(dtype: str, allow_tf32: bool, fp16_reduced: bool, bf16_reduced: bool) -> str:
    """The flag that matters for `dtype`, shortly: tf32=on/off, rr=on/off."""
    if dtype == "fp32":
        return "tf32=on" if allow_tf32 else "tf32=off"
    if dtype == "fp16":
        return "rr=on" if fp16_reduced else "rr=off"
    if dtype == "bf16":
        return "rr=on" if bf16_reduced else "rr=off"
    return ""


def _csv(array: np.ndarray) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(array.dtype.names)
    for row in array.tolist():
        w.writerow(["" if isinstance(v, float) and not math.isfinite(v) else
                    repr(v) if isinstance(v, float) else v for v in row])
    return buf.getvalue()


def _write(path: Optional[str], text: str) -> str:
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return text


class _Result:
    """A benchmark's structured ``array``, its ``meta`` and the raw ``samples``."""

    def __init__(self, array: np.ndarray, meta: dict, samples: Optional[list] = None):
        self.array = array
        self.meta = meta
        self.samples = samples or []

    def __len__(self):
        return len(self.array)

    def rows(self) -> List[dict]:
        names = self.array.dtype.names
        return [dict(zip(names, r)) for r in self.array.tolist()]


class GemmResult(_Result):
    """What :func:`gemm` measured: ``array`` (NumPy structured, one row per
    size, dtype, flags, api and mode; columns in the module docstring),
    ``meta`` (GPU, driver, CUDA, cuBLAS, peaks, clocks seen) and ``samples``
    (the raw per-sample arrays of each row, same order)."""

    def __repr__(self):
        return "<GemmResult %d rows on %s>" % (len(self.array), self.meta.get("gpu", "?"))

    def header(self) -> str:
        m = self.meta
        clocks = m.get("sm_clock_seen_mhz")
        parts = ["cuda_debug.bench.gemm on %s (sm_%s, %s SMs, max SM clock %s MHz)" % (
            m.get("gpu", "?"), str(m.get("compute_capability", "?")).replace(".", ""),
            m.get("sm_count", "?"), m.get("max_sm_clock_mhz", "?"))]
        parts.append("driver %s (CUDA %s), cuBLAS %s, L2 flush %s" % (
            m.get("driver") or "?", m.get("driver_cuda") or "?", m.get("cublas") or "?",
            "%d MiB" % (m["flush_bytes"] >> 20) if m.get("flush_bytes") else "off"))
        if clocks:
            parts.append("SM clock seen %.0f-%.0f MHz (median %.0f)" % (
                clocks["min"], clocks["max"], clocks["median"]))
        return "\n".join(parts)

    def table(self, legend: bool = True) -> str:
        """The comparison table (text): per problem, each mode's ms per GEMM,
        TFLOP/s, % of peak, slowdown vs async, GPU (event) and host call time."""
        a = self.array
        show_api = len(set(a["api"].tolist())) > 1
        headers = ["dtype", "flags", "size"] + (["api"] if show_api else []) + [
            "mode", "ms", "p10", "p90", "TFLOP/s", "%peak", "slowdown", "gpu ms", "call ms"]
        right = [False, False, True] + ([False] if show_api else []) + [False] + [True] * 8
        body = []
        for r in self.rows():
            body.append([r["dtype"], flags_label(r["dtype"], r["allow_tf32"],
                                                 r["allow_fp16_reduced"], r["allow_bf16_reduced"]),
                         size_label(r["m"], r["n"], r["k"])] + ([r["api"]] if show_api else []) + [
                r["mode"], _fmt(r["ms"], ".4f"), _fmt(r["p10_ms"], ".4f"), _fmt(r["p90_ms"], ".4f"),
                _fmt(r["tflops"], ".1f" if r["tflops"] >= 10 else ".3g"),
                _fmt(r["pct_peak"], ".1f"),
                _fmt(r["slowdown"], ".2f") + ("x" if math.isfinite(r["slowdown"]) else ""),
                _fmt(r["gpu_ms"], ".4f"), _fmt(r["call_ms"], ".4f")])
        text = _render(headers, body, right)
        if legend:
            text = self.header() + "\n\n" + text + "\n\n" + (
                "ms: wall time per GEMM in a loop of back-to-back GEMMs (median; p10/p90 over "
                "loops).\ngpu ms: CUDA-event time of one GEMM%s. call ms: host time of one call "
                "with its sync.\nslowdown: ms / ms of async. rr: reduced-precision reduction "
                "allowed." % (", L2 flushed" if self.meta.get("flush_bytes") else ""))
        return text

    def to_csv(self, path: Optional[str] = None) -> str:
        """CSV of the array (header row of field names; NaN as empty)."""
        return _write(path, _csv(self.array))

    def to_json(self, path: Optional[str] = None, samples: bool = False) -> str:
        """JSON: {"meta": ..., "rows": [...]} (NaN as null); with samples=True,
        also each row's raw per-sample arrays."""
        doc = {"meta": self.meta, "rows": self.rows()}
        if samples:
            doc["samples"] = [{k: v for k, v in s.items() if k != "config"} for s in self.samples]
        return _write(path, json.dumps(_jsonable(doc), indent=1))

    def plot(self, path: str) -> str:
        """PNG at `path`: slowdown vs size for each dtype and blocking mode (left)
        and async TFLOP/s (right). Needs matplotlib."""
        try:
            from matplotlib.figure import Figure
        except ImportError:
            raise ImportError("GemmResult.plot() needs matplotlib: pip install matplotlib") \
                from None
        a = self.array
        fig = Figure(figsize=(12, 4.8), dpi=110)
        ax1, ax2 = fig.subplots(1, 2)
        styles = {"sync": "-", "scope": "--", "launch_blocking": ":"}
        problems = _unique((d, api, t, f, b) for d, api, t, f, b in zip(
            a["dtype"].tolist(), a["api"].tolist(), a["allow_tf32"].tolist(),
            a["allow_fp16_reduced"].tolist(), a["allow_bf16_reduced"].tolist()))
        colors = {}
        for p in problems:
            colors[p] = "C%d" % (len(colors) % 10)
            sel = ((a["dtype"] == p[0]) & (a["api"] == p[1]) & (a["allow_tf32"] == p[2])
                   & (a["allow_fp16_reduced"] == p[3]) & (a["allow_bf16_reduced"] == p[4]))
            name = p[0] + ("" if len(problems) <= len(set(a["dtype"].tolist()))
                           else " " + flags_label(*p[:1], *p[2:]) + " " + p[1])
            for mode, ls in styles.items():
                s = sel & (a["mode"] == mode)
                if s.any():
                    x = np.cbrt(a["m"][s] * a["n"][s] * a["k"][s].astype(np.float64))
                    order = np.argsort(x)
                    ax1.plot(x[order], a["slowdown"][s][order], ls, marker="o", color=colors[p],
                             label="%s %s" % (name, mode))
            s = sel & (a["mode"] == "async")
            if s.any():
                x = np.cbrt(a["m"][s] * a["n"][s] * a["k"][s].astype(np.float64))
                order = np.argsort(x)
                ax2.plot(x[order], a["tflops"][s][order], "-", marker="o", color=colors[p],
                         label=name)
        ticks = sorted(set(np.cbrt(a["m"] * a["n"] * a["k"].astype(np.float64)).round(1)))
        for ax in (ax1, ax2):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ticks)
            ax.set_xticklabels(["%g" % t for t in ticks])
            ax.minorticks_off()
            ax.set_xlabel("size (cube root of m*n*k)")
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
        ax1.axhline(1.0, color="gray", lw=0.8)
        ax1.set_ylabel("slowdown vs async (ms per GEMM)")
        ax1.set_title("What synchronous launching costs")
        ax2.set_ylabel("TFLOP/s (async)")
        ax2.set_title(self.meta.get("gpu", ""))
        fig.tight_layout()
        fig.savefig(path)
        return path


# ------------------------------------------------------------ launch latency --

def _unpack_latency(out: tuple) -> dict:
    if out[0] != 0:
        raise _failure(out, "cuda_debug.bench.launch_latency")
    return {"call_us": out[2], "loop_us": out[3]}


def launch_latency(modes=MODES, *, device: int = 0, launches: int = 1000, repeats: int = 20,
                   samples: int = 2000, warmup: float = 0.05,
                   progress: Union[None, bool, Callable[[int, int, str], None]] = None
                   ) -> "LatencyResult":
    """Cost of launching an empty kernel (1 block of 1 thread) in each mode:
    ``us`` = wall microseconds per launch of a loop of `launches` launches with
    one sync at the end (``sync``: a sync after each), median/p10/p90 over
    `repeats` loops; ``call_us`` = host time of one launch (+ its sync) over
    `samples` single launches; ``extra_us`` = ``us`` minus async's. This is the
    per-launch cost behind the GEMM table's slowdowns."""
    mode_list = _parse_choice(modes, MODES, "modes")
    for name, v in (("launches", launches), ("repeats", repeats), ("samples", samples)):
        _check_positive(name, v, integer=True)
    _check_positive("warmup", warmup, allow_zero=True)
    _check_device(device)
    device_info(device)
    kwargs = dict(device=device, samples=int(samples), repeats=int(repeats),
                  loop_n=int(launches), warmup_s=float(warmup))
    steps = _Progress(len(mode_list), progress)
    raws = {}
    child = None
    try:
        for mode in MODES:
            if mode not in mode_list:
                continue
            if mode == "launch_blocking":
                spec = {"kind": "latency", "device": device,
                        "kwargs": dict(kwargs, sync_each=False),
                        "progress": steps.spec()}
                child = _run_child(spec)
                raws[mode] = dict(child["results"][0], child_env=child["env"])
                if callable(progress):
                    steps.step("latency launch_blocking")
                continue
            if mode == "scope":
                from ._scope import launch_blocking
                with launch_blocking():
                    out = _core.launch_latency(sync_each=False, **kwargs)
            else:
                out = _core.launch_latency(sync_each=(mode == "sync"), **kwargs)
            raws[mode] = _unpack_latency(out)
            steps.step("latency %s: %.2f us" % (mode, float(np.median(raws[mode]["loop_us"]))))
    finally:
        steps.close()
    rows = []
    for mode in MODES:
        raw = raws.get(mode)
        if raw is None:
            continue
        us, p10, p90 = summarize(raw["loop_us"])
        call, c10, c90 = summarize(raw["call_us"])
        rows.append({"mode": mode, "us": us, "p10_us": p10, "p90_us": p90, "call_us": call,
                     "call_p10_us": c10, "call_p90_us": c90, "extra_us": math.nan,
                     "slowdown": math.nan, "samples": len(raw["call_us"]),
                     "loops": len(raw["loop_us"]), "loop_n": int(launches)})
    _fill_latency_derived(rows)
    info = device_info(device)
    meta = {"gpu": info.name, "device": device, "compute_capability": "%d.%d" % info.cc,
            "driver": _Nvml.driver_version(), "driver_cuda": _driver_string(_core.driver_version()),
            "kernel": "empty (1 block x 1 thread), non-blocking stream",
            "launch_blocking_child": ({"CUDA_LAUNCH_BLOCKING": child["env"], "pid": child["pid"]}
                                      if child else None)}
    return LatencyResult(records("latency", rows), meta, [dict(raws[r["mode"]], mode=r["mode"])
                                                          for r in rows])


def _fill_latency_derived(rows: List[dict]) -> None:
    base = next((r["us"] for r in rows if r["mode"] == "async"), None)
    for r in rows:
        if base:
            r["extra_us"] = r["us"] - base
            r["slowdown"] = r["us"] / base


class LatencyResult(_Result):
    """What :func:`launch_latency` measured: ``array`` (one row per mode:
    us, p10_us, p90_us, call_us, call_p10_us, call_p90_us, extra_us, slowdown,
    samples, loops, loop_n), ``meta`` and the raw ``samples``."""

    def __repr__(self):
        return "<LatencyResult %d modes on %s>" % (len(self.array), self.meta.get("gpu", "?"))

    def table(self, legend: bool = True) -> str:
        headers = ["mode", "us/launch", "p10", "p90", "extra us", "slowdown", "call us",
                   "call p90"]
        body = [[r["mode"], _fmt(r["us"], ".2f"), _fmt(r["p10_us"], ".2f"),
                 _fmt(r["p90_us"], ".2f"), _fmt(r["extra_us"], "+.2f"),
                 _fmt(r["slowdown"], ".2f") + ("x" if math.isfinite(r["slowdown"]) else ""),
                 _fmt(r["call_us"], ".2f"), _fmt(r["call_p90_us"], ".2f")]
                for r in self.rows()]
        text = _render(headers, body, [False] + [True] * 7)
        if legend:
            text = ("cuda_debug.bench.launch_latency on %s: empty kernel, %s launches per loop\n\n"
                    % (self.meta.get("gpu", "?"), self.array["loop_n"][0] if len(self) else "?")
                    + text + "\n\nus/launch: wall time per launch in a loop (median; p10/p90 "
                    "over loops). extra us: minus async.\ncall us: host time of one launch "
                    "with its sync.")
        return text

    def to_csv(self, path: Optional[str] = None) -> str:
        return _write(path, _csv(self.array))

    def to_json(self, path: Optional[str] = None) -> str:
        return _write(path, json.dumps(_jsonable({"meta": self.meta, "rows": self.rows()}),
                                       indent=1))
