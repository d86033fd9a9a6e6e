"""Result objects and their formats: the structured schema (one NumPy dtype per
kind, defined here and nowhere else), rows built from raw samples, and
table / CSV / JSON / plot output.

Columns of :attr:`GemmResult.array`
-----------------------------------
``m, n, k``
    C (m x n) = A (m x k) @ B (k x n), row-major and contiguous, like
    ``torch.matmul(a, b, out=c)`` (the same cuBLAS call PyTorch makes).
``dtype``
    ``fp32`` (TF32 only when ``allow_tf32``), ``tf32`` (fp32 in and out on TF32
    tensor cores, what PyTorch does for fp32 with ``allow_tf32=True``), ``fp16``,
    ``bf16`` (16-bit in and out, fp32 accumulation).
``mode``, ``api``
    how launches were made (see :func:`cuda_debug.bench.gemm`); ``gemmex``
    (``cublasGemmEx``) or ``lt`` (``cublasLtMatmul``).
``allow_tf32, allow_fp16_reduced, allow_bf16_reduced``
    the ``torch.backends.cuda.matmul`` flags the row ran with (a flag that does
    not apply to the row's dtype is recorded as given and has no effect).
``flush``
    whether L2 was flushed before each event-timed sample.
``ms, p10_ms, p90_ms``
    **the headline**: wall milliseconds per GEMM of a loop of ``loop_n``
    back-to-back GEMMs with one stream sync at the end (``sync``: a sync after
    each), median / 10th / 90th percentile over ``loops`` loops.
``tflops``, ``pct_peak``
    ``2*m*n*k / ms``; as a percentage of the dense peak of the row's effective
    dtype (NaN for unknown GPUs).
``slowdown``
    ``ms`` / ``ms`` of the ``async`` row of the same problem (NaN without one).
``gpu_ms, gpu_p10_ms, gpu_p90_ms``
    CUDA-event time of one GEMM, timed one at a time (``samples`` of them). In
    blocking modes the end event is recorded after the blocking launch returned.
``call_ms, call_p90_ms``
    host time of one GEMM call in the same samples, including the mode's sync.
``samples, loops, loop_n``
    event-timed samples; loops; GEMMs per loop (the same in every mode).
``rel_err``
    ``max|C - A@B| / max(|A|@|B|)`` against a float64 product, NaN when not checked.
``sm_mhz``
    median SM clock seen through NVML while the row ran, NaN without NVML.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import math
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:
    import numpy.typing as npt

from ._config import MODES, Config, effective_dtype, flags_label, size_label, unique

#: The row layouts. Strings are fixed-width unicode so ``arr["dtype"] == "bf16"`` works.
GEMM_FIELDS = [
    ("m", "<i8"), ("n", "<i8"), ("k", "<i8"),
    ("dtype", "<U4"), ("mode", "<U15"), ("api", "<U6"),
    ("allow_tf32", "?"), ("allow_fp16_reduced", "?"), ("allow_bf16_reduced", "?"),
    ("flush", "?"),
    ("ms", "<f8"), ("p10_ms", "<f8"), ("p90_ms", "<f8"),
    ("tflops", "<f8"), ("pct_peak", "<f8"), ("slowdown", "<f8"),
    ("gpu_ms", "<f8"), ("gpu_p10_ms", "<f8"), ("gpu_p90_ms", "<f8"),
    ("call_ms", "<f8"), ("call_p90_ms", "<f8"),
    ("samples", "<i8"), ("loops", "<i8"), ("loop_n", "<i8"),
    ("rel_err", "<f8"), ("sm_mhz", "<f8"),
]
LATENCY_FIELDS = [
    ("mode", "<U15"),
    ("us", "<f8"), ("p10_us", "<f8"), ("p90_us", "<f8"),
    ("call_us", "<f8"), ("call_p10_us", "<f8"), ("call_p90_us", "<f8"),
    ("extra_us", "<f8"), ("slowdown", "<f8"),
    ("samples", "<i8"), ("loops", "<i8"), ("loop_n", "<i8"),
]
SCHEMAS = {"gemm": np.dtype(GEMM_FIELDS), "latency": np.dtype(LATENCY_FIELDS)}


def records(kind: str, rows: Sequence[dict]) -> np.ndarray:
    """Rows (dicts keyed by field name) -> the structured array of `kind`
    ("gemm" or "latency"). A missing field is a KeyError, a wrong type a
    TypeError/ValueError."""
    try:
        dtype = SCHEMAS[kind]
    except KeyError:
        raise ValueError("unknown record kind %r: expected gemm or latency" % (kind,)) from None
    names = dtype.names
    return np.array([tuple(r[n] for n in names) for r in rows], dtype=dtype)


# ------------------------------------------------------------------ numbers --

def summarize(samples: Sequence[float]) -> Tuple[float, float, float]:
    """(median, 10th percentile, 90th percentile), linear interpolation
    (NumPy's default); NaNs for no samples."""
    a = np.asarray(samples, dtype=np.float64)
    if a.size == 0:
        return (math.nan, math.nan, math.nan)
    p10, med, p90 = np.percentile(a, [10, 50, 90])
    return (float(med), float(p10), float(p90))


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


def gemm_row(cfg: Config, mode: str, raw: dict, flush: bool, peaks: dict) -> dict:
    """One row of the schema from one run's raw samples: ``loop_ms``,
    ``gpu_ms``, ``call_ms`` (arrays, ms), ``loop_n``, optional ``rel_err`` and
    ``sm_mhz``."""
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


def fill_slowdown(rows: List[dict]) -> None:
    """slowdown = ms / ms of the async row of the same problem (in place)."""
    base = {_problem_key(r): r["ms"] for r in rows if r["mode"] == "async"}
    for r in rows:
        b = base.get(_problem_key(r))
        r["slowdown"] = r["ms"] / b if b and b > 0 else math.nan


def build_gemm_result(runs: Sequence[Tuple[Config, str, dict]], meta: dict) -> "GemmResult":
    """The result of (config, mode, raw samples) runs, ordered by config then
    :data:`MODES`; fills slowdowns and the clocks seen into `meta`."""
    order = {m: i for i, m in enumerate(MODES)}
    def key(cfg):
        return (cfg.m, cfg.n, cfg.k, cfg.dtype, tuple(sorted(cfg.flags.items())), cfg.api)
    cfg_order = {}
    for cfg, _, _ in runs:
        cfg_order.setdefault(key(cfg), len(cfg_order))
    ranked = sorted(runs, key=lambda r: (cfg_order[key(r[0])], order.get(r[1], len(order))))
    flush = bool(meta.get("flush_bytes"))
    rows = [gemm_row(cfg, mode, raw, flush, meta.get("peak_tflops") or {})
            for cfg, mode, raw in ranked]
    fill_slowdown(rows)
    seen = [r["sm_mhz"] for r in rows if math.isfinite(r["sm_mhz"])]
    meta["sm_clock_seen_mhz"] = ({"min": float(min(seen)), "median": float(np.median(seen)),
                                  "max": float(max(seen))} if seen else None)
    samples = [dict(raw, mode=mode, config=cfg) for cfg, mode, raw in ranked]
    return GemmResult(records("gemm", rows), meta, samples)


def latency_row(mode: str, raw: dict) -> dict:
    us, p10, p90 = summarize(raw["loop_us"])
    call, c10, c90 = summarize(raw["call_us"])
    return {"mode": mode, "us": us, "p10_us": p10, "p90_us": p90, "call_us": call,
            "call_p10_us": c10, "call_p90_us": c90, "extra_us": math.nan,
            "slowdown": math.nan, "samples": len(raw["call_us"]),
            "loops": len(raw["loop_us"]), "loop_n": int(raw["loop_n"])}


def fill_latency_derived(rows: List[dict]) -> None:
    base = next((r["us"] for r in rows if r["mode"] == "async"), None)
    for r in rows:
        if base:
            r["extra_us"] = r["us"] - base
            r["slowdown"] = r["us"] / base


def build_latency_result(runs: Sequence[Tuple[str, dict]], meta: dict) -> "LatencyResult":
    order = {m: i for i, m in enumerate(MODES)}
    ranked = sorted(runs, key=lambda r: order.get(r[0], len(order)))
    rows = [latency_row(mode, raw) for mode, raw in ranked]
    fill_latency_derived(rows)
    return LatencyResult(records("latency", rows), meta,
                         [dict(raw, mode=mode) for mode, raw in ranked])


# ------------------------------------------------------------------ formats --

def jsonable(obj):
    if isinstance(obj, np.ndarray):
        return [jsonable(x) for x in obj.tolist()]
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, (np.floating, float)):
        f = float(obj)
        return f if math.isfinite(f) else None
    if isinstance(obj, np.integer):
        return int(obj)
    if isinstance(obj, np.bool_):
        return bool(obj)
    return obj


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


def _csv(array: np.ndarray) -> str:
    import csv                 # (csv, io, json: when a file is written, not at import)
    import io
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(array.dtype.names)
    for row in array.tolist():
        w.writerow(["" if isinstance(v, float) and not math.isfinite(v) else
                    repr(v) if isinstance(v, float) else v for v in row])
    return buf.getvalue()


def _json(doc) -> str:
    import json
    return json.dumps(jsonable(doc), indent=1)


def _write(path: Optional[str], text: str) -> str:
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return text


class _Result:
    """A benchmark's structured ``array``, its ``meta`` and the raw ``samples``."""

    array: "npt.NDArray[np.void]"        # structured: one row per configuration
    meta: Dict[str, Any]
    samples: List[Any]

    def __init__(self, array: "npt.NDArray[np.void]", meta: Dict[str, Any],
                 samples: Optional[List[Any]] = None):
        self.array = array
        self.meta = meta
        self.samples = samples or []

    def __len__(self) -> int:
        return len(self.array)

    def rows(self) -> List[Dict[str, Any]]:
        """The array's rows, each a dict of column name to value."""
        names = self.array.dtype.names
        return [dict(zip(names, r)) for r in self.array.tolist()]


class GemmResult(_Result):
    """What :func:`gemm` measured: ``array`` (NumPy structured, one row per
    size, dtype, flags, api and mode; columns in the module docstring),
    ``meta`` (GPU, driver, CUDA, cuBLAS, peaks, clocks seen) and ``samples``
    (the raw per-sample arrays of each row, same order)."""

    def __repr__(self) -> str:
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
        return _write(path, _json(doc))

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
        styles = {"sync": "-", "scope": "--", "launch_blocking": ":", "watch": "-."}
        problems = unique((d, api, t, f, b) for d, api, t, f, b in zip(
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


class LatencyResult(_Result):
    """What :func:`launch_latency` measured: ``array`` (one row per mode:
    us, p10_us, p90_us, call_us, call_p10_us, call_p90_us, extra_us, slowdown,
    samples, loops, loop_n), ``meta`` and the raw ``samples``."""

    def __repr__(self) -> str:
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
        return _write(path, _json({"meta": self.meta, "rows": self.rows()}))
