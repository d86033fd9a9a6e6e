"""What to run: validated sizes, dtypes, modes and matmul flags; the rules that
map them to cuBLAS (the TF32 rule, storage types and their sizes); whether a
problem fits in memory; peak rates and tolerances.

Each rule is written here once. Element sizes come from the C core's one table
(``_core.gemm_types()``); everything else (defaults, validation, units) is
Python's.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
import math
import sys
import warnings
from typing import Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from .. import _core

DTYPES = ("fp32", "tf32", "fp16", "bf16")

# What gemm() and launch_latency() accept (checked at run time, before any GPU work):
#: one problem size: 1024 (square), "4096x1024x512" or (m, n, k)
Size = Union[int, str, Tuple[int, int, int]]
#: sizes: a list of them, one int, or "256,1024" (a comma-separated string)
SizesArg = Union[Size, Sequence[Size]]
#: dtypes, modes, apis: a list of names, or one comma-separated string
NamesArg = Union[str, Sequence[str]]
#: torch.backends.cuda.matmul flags: None or "torch" (torch's now), "default", "sweep",
#: one dict of flag -> bool, or a list of them
FlagsArg = Union[None, str, Mapping[str, bool], Sequence[Mapping[str, bool]]]
BASE_MODES = ("async", "sync", "scope", "launch_blocking")
#: ``watch`` runs the async loop inside ``cuda_debug.watch()`` where that exists
MODES = BASE_MODES + ("watch",)
APIS = ("gemmex", "lt")

DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16",
                 "bfloat16": "bf16"}

#: storage type of each dtype (tf32 is fp32 storage run on TF32 tensor cores)
STORAGE = {"fp32": "fp32", "tf32": "fp32", "fp16": "fp16", "bf16": "bf16"}
#: storage name -> (code for _core.gemm, element bytes): the C core's table
STORAGE_TYPES = {name: (code, size) for code, (name, size) in enumerate(_core.gemm_types())}

#: the ``torch.backends.cuda.matmul`` flags, and PyTorch's defaults for them
FLAG_NAMES = ("allow_tf32", "allow_fp16_reduced_precision_reduction",
              "allow_bf16_reduced_precision_reduction")
TORCH_DEFAULT_FLAGS = {"allow_tf32": False, "allow_fp16_reduced_precision_reduction": True,
                       "allow_bf16_reduced_precision_reduction": True}
FLAG_ALIASES = {"tf32": "allow_tf32", "fp16_reduced": "allow_fp16_reduced_precision_reduction",
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

#: Largest accepted rel_err (``max|C - A@B| / max(|A|@|B|)``) per effective
#: dtype: a few units of the input (tf32) or output rounding, far below a wrong product.
TOLERANCE = {"fp32": 1e-5, "tf32": 2e-3, "fp16": 2e-3, "bf16": 1e-2}

WORKSPACE_BYTES = 32 << 20   # cuBLAS/cuBLASLt workspace: NVIDIA's Hopper advice, PyTorch's too
MEM_MARGIN = 64 << 20        # left free beyond what a problem needs
CHECK_AUTO_MAX = 512 ** 3    # check=None checks problems up to this m*n*k
_MAX_DIM = 2 ** 31 - 1


# ----------------------------------------------------------- argument checks --

def check_bool(name: str, value, allow_none: bool = False) -> None:
    """TypeError unless `value` is a bool (or None when allowed)."""
    if value is None and allow_none:
        return
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError("%s=%r: expected True or False%s"
                        % (name, value, " or None" if allow_none else ""))


def check_number(name, value, integer=False, allow_zero=False):
    ok_type = (isinstance(value, (int, np.integer)) if integer
               else isinstance(value, (int, float, np.integer, np.floating)))
    if isinstance(value, (bool, np.bool_)) or not ok_type or not math.isfinite(value) or \
            value < 0 or (value == 0 and not allow_zero):
        raise ValueError("%s=%r: expected a %s %s" % (
            name, value, "non-negative" if allow_zero else "positive",
            "integer" if integer else "number"))


def check_device(device) -> None:
    if isinstance(device, (bool, np.bool_)) or not isinstance(device, (int, np.integer)) \
            or device < 0:
        raise ValueError("device=%r: expected a device ordinal >= 0" % (device,))


def check_progress(progress) -> None:
    """TypeError unless `progress` is None, True / False or a callable(done, total, text)."""
    if progress is None or callable(progress) or isinstance(progress, (bool, np.bool_)):
        return
    raise TypeError("progress=%r: expected None (a progress line on a terminal or in a "
                    "notebook), True, False or a callable(done, total, text)" % (progress,))


def check_seed(seed) -> None:
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or \
            not 0 <= seed < 2 ** 62:
        raise ValueError("seed=%r: expected an integer in [0, 2^62)" % (seed,))


# --------------------------------------------------------------------- sizes --

def parse_size(size: Size) -> Tuple[int, int, int]:
    """``1024`` / ``"1024"`` -> (1024, 1024, 1024); ``"4096x1024x512"`` or a
    3-sequence -> (m, n, k). Raises ValueError for anything else."""
    if isinstance(size, str):
        parts = size.strip().lower().split("x")
        if len(parts) not in (1, 3) or not all(p.strip().lstrip("+").isdigit() for p in parts):
            raise ValueError("size %r: expected N or MxNxK with positive integers" % size)
        dims = tuple(int(p) for p in parts)
    elif isinstance(size, (bool, np.bool_)):
        raise ValueError("size %r: expected a positive integer, not a bool" % (size,))
    elif isinstance(size, (int, np.integer)):
        dims = (int(size),)
    elif isinstance(size, (tuple, list)) and len(size) == 3:
        for d in size:
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
                raise ValueError("size %r: m, n, k must be integers" % (size,))
        dims = tuple(int(d) for d in size)
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


def as_list(value, what) -> list:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, (int, np.integer)) and what == "sizes":
        return [value]
    try:
        return list(value)
    except TypeError:
        raise ValueError("%s: expected a list, got %r" % (what, value)) from None


def unique(seq):
    return list(dict.fromkeys(seq))


def parse_sizes(sizes) -> List[Tuple[int, int, int]]:
    """A list of sizes (a tuple of three ints is three square sizes: write a
    non-square problem as ``[(m, n, k)]`` or ``"MxNxK"``)."""
    items = as_list(sizes, "sizes")
    if not items:
        raise ValueError("sizes: at least one size is needed")
    return unique(parse_size(s) for s in items)


def parse_choice(values, allowed, what, aliases=None) -> list:
    items = as_list(values, what)
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
    return unique(out)


def parse_modes(modes) -> list:
    """Modes in the order given; ``watch`` only where ``cuda_debug.watch`` exists."""
    out = parse_choice(modes, MODES, "modes")
    if "watch" in out and not watch_available():
        raise ValueError("mode 'watch': cuda_debug.watch is not available in this build")
    return out


def watch_available() -> bool:
    from .. import _scope       # (not the package: cuda_debug names bench for type checkers)
    return hasattr(_scope, "watch")


# --------------------------------------------------------------------- flags --

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
                if name != "allow_tf32":
                    continue
                try:
                    value = getattr(matmul, "fp32_precision") == "tf32"
                except Exception:
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
        name = FLAG_ALIASES.get(key, key)
        if name not in FLAG_NAMES:
            raise ValueError("unknown flag %r: expected %s" % (key, ", ".join(FLAG_NAMES)))
        check_bool("flag %s" % key, value)
        out[name] = bool(value)
    return out


def _unique_dicts(items):
    out, seen = [], set()
    for d in items:
        key = tuple(sorted(d.items()))
        if key not in seen:
            seen.add(key)
            out.append(d)
    return out


def resolve_flags(flags: FlagsArg = None) -> List[Dict[str, bool]]:
    """The flag sets to run: ``None`` or ``"torch"`` -> [the current torch
    settings (defaults when torch is not imported)]; ``"default"`` -> [PyTorch's
    defaults]; ``"sweep"`` -> every combination; a dict (missing keys from the
    current settings) or a list of dicts. A flag value that is not a bool is a
    TypeError."""
    current = torch_flags()
    if flags is None or flags in ("torch", "current"):
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


# ------------------------------------------------- the rules, written once --

def effective_dtype(dtype: str, flags: Dict[str, bool]) -> str:
    """The TF32 rule: what the tensor cores compute in. ``tf32``, and ``fp32``
    with ``allow_tf32``, are tf32; every other dtype is itself."""
    if dtype == "tf32" or (dtype == "fp32" and flags.get("allow_tf32")):
        return "tf32"
    return dtype


def reduced_reduction_flag(dtype: str) -> Optional[str]:
    """The ``allow_*_reduced_precision_reduction`` flag that applies to `dtype`."""
    return {"fp16": "allow_fp16_reduced_precision_reduction",
            "bf16": "allow_bf16_reduced_precision_reduction"}.get(dtype)


def cublas_math(dtype: str, flags: dict) -> Dict[str, bool]:
    """The C core's math switches for `dtype` under `flags`: ``tf32`` (FAST_TF32
    compute, TF32 tensor-op math) and ``disallow_reduced``
    (CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)."""
    rr = reduced_reduction_flag(dtype)
    return {"tf32": effective_dtype(dtype, flags) == "tf32",
            "disallow_reduced": bool(rr and not flags.get(rr, True))}


def element_bytes(dtype: str) -> int:
    return STORAGE_TYPES[STORAGE[dtype]][1]


def relevant_flags(dtype: str, flags: dict) -> tuple:
    """The flag values that change `dtype`'s GEMM."""
    m = cublas_math(dtype, flags)
    return (m["tf32"], m["disallow_reduced"])


def flags_label(dtype: str, allow_tf32: bool, fp16_reduced: bool, bf16_reduced: bool) -> str:
    """The flag that matters for `dtype`, shortly: tf32=on/off, rr=on/off."""
    if dtype == "fp32":
        return "tf32=on" if allow_tf32 else "tf32=off"
    if dtype == "fp16":
        return "rr=on" if fp16_reduced else "rr=off"
    if dtype == "bf16":
        return "rr=on" if bf16_reduced else "rr=off"
    return ""


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

    @property
    def flags_label(self) -> str:
        f = self.flags
        return flags_label(self.dtype, f["allow_tf32"], f["allow_fp16_reduced_precision_reduction"],
                           f["allow_bf16_reduced_precision_reduction"])

    def describe(self) -> str:
        """``bf16 rr=on 4096`` (`` lt`` for cuBLASLt): for progress lines and errors."""
        return " ".join(p for p in (self.dtype, self.flags_label, self.label,
                                    "" if self.api == "gemmex" else self.api) if p)


def size_label(m, n, k) -> str:
    return str(m) if m == n == k else "%dx%dx%d" % (m, n, k)


def plan(sizes: SizesArg, dtypes: NamesArg, flags: FlagsArg = None,
         apis: NamesArg = ("gemmex",)) -> List[Config]:
    """Validated configurations, in run order (dtype, flags, api, size);
    flag sets that do not change a dtype's GEMM are run once."""
    shapes = parse_sizes(sizes)
    dts = parse_choice(dtypes, DTYPES, "dtypes", DTYPE_ALIASES)
    api_list = parse_choice(apis, APIS, "apis")
    flag_sets = resolve_flags(flags)
    out, seen = [], set()
    for dtype in dts:
        for f in flag_sets:
            f = dict(f)
            if dtype == "tf32":
                f["allow_tf32"] = True
            for api in api_list:
                for (m, n, k) in shapes:
                    key = (dtype, relevant_flags(dtype, f), api, m, n, k)
                    if key in seen:
                        continue
                    seen.add(key)
                    out.append(Config(m, n, k, dtype, f, api))
    return out


# ---------------------------------------------------------- memory, peaks --

def memory_needed(m: int, n: int, k: int, dtype: str, flush_bytes: int,
                  workspace_bytes: int = WORKSPACE_BYTES) -> int:
    """Device bytes one problem needs: A, B, C, workspace, flush buffer, margin."""
    return ((m * k + k * n + m * n) * element_bytes(dtype) + flush_bytes + workspace_bytes
            + MEM_MARGIN)


def check_memory(configs, free_bytes: int, total_bytes: int, flush_bytes: int,
                 gpu: str = "the GPU") -> None:
    """ValueError naming every problem that cannot fit in `free_bytes` (the one
    memory check: the C core only reports a failed allocation)."""
    bad = []
    for c in configs:
        need = memory_needed(c.m, c.n, c.k, c.dtype, flush_bytes)
        if need > free_bytes:
            bad.append("%s %s needs %.2f GiB" % (c.label, c.dtype, need / 2 ** 30))
    if bad:
        raise ValueError("too large for %s's memory (%.2f GiB free of %.2f GiB): %s"
                         % (gpu, free_bytes / 2 ** 30, total_bytes / 2 ** 30,
                            "; ".join(unique(bad))))


def flush_size(l2_bytes: int) -> int:
    """An L2-flush buffer at least twice the L2, whole MiB, at least 8 MiB."""
    mib = 1 << 20
    return max(8 * mib, -(-2 * max(int(l2_bytes), 0) // mib) * mib)


def peak_tflops(cc: Tuple[int, int], sm_count: int, clock_khz: int) -> Dict[str, Optional[float]]:
    """Dense peak TFLOP/s per dtype at the maximum SM clock; None when unknown."""
    table = PEAK_FLOP_PER_CLOCK_PER_SM.get(tuple(cc), {})
    out = {}
    for dt in DTYPES:
        per = table.get(dt)
        out[dt] = per * sm_count * clock_khz * 1e3 / 1e12 if per and sm_count and clock_khz \
            else None
    return out
