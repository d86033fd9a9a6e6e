"""``cuda_debug.bench.gemm``: cuBLAS GEMMs timed in each launch mode.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
import math
import os
from typing import Dict, List, Optional, Tuple

import numpy as np

from .. import _core, _libraries
from . import _child, _native
from ._clocks import ClockSampler, Nvml
from ._config import (BASE_MODES, CHECK_AUTO_MAX, STORAGE, STORAGE_TYPES, TOLERANCE,
                      WORKSPACE_BYTES, Config, FlagsArg, NamesArg, SizesArg, check_bool,
                      check_device, check_memory, check_number, check_progress, check_seed, cublas_math, effective_dtype, flush_size,
                      parse_modes, peak_tflops, plan)
from ._progress import Progress, ProgressArg
from ._results import GemmResult, build_gemm_result, decode, relative_error

_API_CODE = {"gemmex": 0, "lt": 1}


def gemm(sizes: SizesArg = (1024, 4096, 8192), dtypes: NamesArg = ("fp32", "tf32", "bf16"),
         modes: NamesArg = BASE_MODES, flags: FlagsArg = None, *, api: NamesArg = "gemmex",
         device: int = 0, warmup: float = 0.1, flush: bool = True,
         repeats: int = 10, loop_ms: float = 20.0, samples: Optional[int] = None,
         sample_ms: float = 200.0, max_samples: int = 200, check: Optional[bool] = None,
         seed: int = 0, lt_algos: int = 1, progress: ProgressArg = None) -> GemmResult:
    """Time cuBLAS GEMMs in each launch mode; the columns of the result are
    described in :mod:`cuda_debug.bench._results`.

    Modes: ``async`` (back-to-back launches, one stream sync at the end of each
    loop), ``sync`` (``cuStreamSynchronize`` after every GEMM), ``scope`` (the
    async loop inside :func:`cuda_debug.launch_blocking`), ``launch_blocking``
    (the async loop in a child process started with ``CUDA_LAUNCH_BLOCKING=1``),
    ``watch`` (the async loop inside ``cuda_debug.watch()``, where it exists).

    sizes: ints (square), ``"MxNxK"`` strings or (m, n, k) tuples.
    dtypes: of ``fp32, tf32, fp16, bf16``. flags: ``torch.backends.cuda.matmul``
    flags (None: the current torch settings if torch is imported, else
    PyTorch's defaults; ``"sweep"``: every combination; a dict; a list of dicts;
    values must be bools). api: ``gemmex`` (cublasGemmEx), ``lt``
    (cublasLtMatmul: the heuristic's choice, like PyTorch's cuBLASLt path, or the
    fastest of ``lt_algos`` candidates), or a list of both.
    warmup: seconds of back-to-back GEMMs before timing each row.
    flush: flush L2 (a buffer >= 2x L2) before each event-timed sample.
    repeats / loop_ms: loops timed for the headline, each about loop_ms long.
    samples (None: sample_ms worth, 10..max_samples): event-timed samples.
    check: compare with a float64 product on the host (None: for m*n*k <= 512^3).
    progress: None (a progress line when stderr is a terminal or in a notebook),
    True / False, or a callable(done, total, text).

    Bad arguments raise ValueError (TypeError for a non-bool flag, `flush`,
    `check` or `progress`) before any GPU work, as do problems that do not fit in the GPU's
    free memory.
    """
    mode_list = parse_modes(modes)
    configs = plan(sizes, dtypes, flags, api)
    check_bool("flush", flush)
    check_bool("check", check, allow_none=True)
    check_number("warmup", warmup, allow_zero=True)
    check_number("repeats", repeats, integer=True)
    check_number("loop_ms", loop_ms, allow_zero=True)
    check_number("sample_ms", sample_ms, allow_zero=True)
    check_number("max_samples", max_samples, integer=True)
    check_number("lt_algos", lt_algos, integer=True)
    if samples is not None:
        check_number("samples", samples, integer=True)
    check_seed(seed)
    check_device(device)
    check_progress(progress)

    what = "cuda_debug.bench.gemm"
    info = _native.device_info(device)
    _libraries.ensure(_libraries.CUBLAS)
    flush_bytes = flush_size(info.l2_bytes) if flush else 0
    _native.release(device, what)
    free_b, total_b = _native.mem_info(device, what)
    check_memory(configs, free_b, total_b, flush_bytes, info.name)

    opts = dict(flush_bytes=flush_bytes, warmup=float(warmup), samples=samples,
                sample_ms=float(sample_ms), max_samples=int(max_samples), repeats=int(repeats),
                loop_ms=float(loop_ms), seed=int(seed), lt_algos=int(lt_algos))
    checks = [(c.m * c.n * c.k <= CHECK_AUTO_MAX) if check is None else bool(check)
              for c in configs]
    handle = Nvml.handle(info.pci_bus)
    if not info.clock_khz:                      # the driver did not say: ask NVML
        info = info._replace(clock_khz=(Nvml.max_sm_mhz(handle) or 0) * 1000)
    local = [m for m in mode_list if m != "launch_blocking"]
    steps = Progress(len(configs) * len(mode_list), progress, prefix="gemm ")
    runs: List[Tuple[Config, str, dict]] = []
    counts: Dict[int, Tuple[int, int]] = {}
    cublas_version, child = 0, None
    try:
        for i, cfg in enumerate(configs):
            for mode in local:
                text = "%s %s" % (cfg.describe(), mode)
                steps.show(text)
                raw = measure(cfg, mode, c_kwargs(cfg, device, opts, counts.get(i), mode == "sync",
                                                  checks[i]), handle)
                counts.setdefault(i, (len(raw["gpu_ms"]), int(raw["loop_n"])))
                cublas_version = raw["cublas_version"] or cublas_version
                runs.append((cfg, mode, raw))
                steps.step(text)
        if "launch_blocking" in mode_list:
            _core.bench_release(device)      # the child needs the memory
            spec = {"kind": "gemm", "device": device,
                    "configs": [dict(cfg._asdict(),
                                     kwargs=c_kwargs(cfg, device, opts, counts.get(i), False,
                                                     checks[i]))
                                for i, cfg in enumerate(configs)]}

            def relay(event, text):
                steps.show(text) if event == "show" else steps.step(text)
            child = _child.run(spec, relay)
            for cfg, raw in zip(configs, child["results"]):
                raw["child_env"] = child["env"]
                runs.append((cfg, "launch_blocking", raw))
                cublas_version = cublas_version or raw.get("cublas_version")
    finally:
        steps.close()
        _core.bench_release(device)
    return build_gemm_result(runs, gemm_meta(info, device, flush_bytes, cublas_version, child))


def c_kwargs(cfg: Config, device: int, opts: dict, counts: Optional[Tuple[int, int]],
             sync_each: bool, check: bool) -> dict:
    """Every argument of ``_core.gemm`` (it has no defaults)."""
    return dict(m=cfg.m, n=cfg.n, k=cfg.k, storage=STORAGE_TYPES[STORAGE[cfg.dtype]][0],
                **cublas_math(cfg.dtype, cfg.flags), device=device, api=_API_CODE[cfg.api],
                sync_each=sync_each, flush_bytes=opts["flush_bytes"],
                workspace_bytes=WORKSPACE_BYTES, warmup_s=opts["warmup"],
                samples=counts[0] if counts else int(opts["samples"] or 0),
                min_samples=min(10, opts["max_samples"]), max_samples=opts["max_samples"],
                sample_ms=opts["sample_ms"], repeats=opts["repeats"],
                loop_n=counts[1] if counts else 0, loop_ms=opts["loop_ms"],
                check=check, seed=opts["seed"], lt_algos=opts["lt_algos"])


def check_product(cfg: Config, check, mode: str) -> float:
    """rel_err of the checked product (NaN when not checked); raises when it
    is beyond the dtype's tolerance."""
    if check is None:
        return math.nan
    a, b, c = (decode(np.asarray(x), cfg.dtype) for x in check)
    err = relative_error(a, b, c)
    eff = effective_dtype(cfg.dtype, cfg.flags)
    if not err <= TOLERANCE[eff]:
        raise RuntimeError(
            "cuda_debug.bench.gemm: wrong product for %s (%s): max error %.3g of "
            "max(|A||B|), tolerance %.3g: these timings would not be of the real GEMM"
            % (cfg.describe(), mode, err, TOLERANCE[eff]))
    return err


def measure(cfg: Config, mode: str, kwargs: dict, nvml_handle) -> dict:
    """One in-process run (async, sync, scope or watch; ``launch_blocking`` is
    ``async`` in the child): raw samples plus rel_err and the clock seen."""
    what = "cuda_debug.bench.gemm(%s, mode=%s)" % (cfg.describe(), mode)
    extra = {}
    with ClockSampler(nvml_handle) as clocks:
        if mode == "scope":
            from .._scope import launch_blocking
            before = _core.stats()["synced"]
            with launch_blocking():
                s = _native.gemm(what, **kwargs)
            extra["hook_syncs"] = _core.stats()["synced"] - before
        elif mode == "watch":
            from .._scope import watch
            with watch():
                s = _native.gemm(what, **kwargs)
        else:
            s = _native.gemm(what, **kwargs)
    raw = {"gpu_ms": s.gpu_ms, "call_ms": s.call_ms, "loop_ms": s.loop_ms,
           "loop_gpu_ms": s.loop_gpu_ms, "est_ms": s.est_ms, "loop_n": s.loop_n,
           "lt_tried": s.lt_tried, "cublas_version": s.cublas_version}
    raw.update(extra)
    raw["rel_err"] = check_product(cfg, s.check, mode)
    raw["sm_mhz"] = clocks.median()
    return raw


def child_runs(spec: dict):
    """In the CUDA_LAUNCH_BLOCKING=1 child: (progress text, run) per config."""
    device = spec["device"]
    _libraries.ensure(_libraries.CUBLAS)
    info = _native.device_info(device)
    handle = Nvml.handle(info.pci_bus)
    for item in spec["configs"]:
        cfg = Config(item["m"], item["n"], item["k"], item["dtype"], item["flags"], item["api"])
        yield ("%s launch_blocking" % cfg.describe(),
               lambda cfg=cfg, kw=item["kwargs"]: measure(cfg, "launch_blocking", kw, handle))


def gemm_meta(info, device: int, flush_bytes: int, cublas_version, child) -> dict:
    lib = _libraries.status(_libraries.CUBLAS)
    return {
        "gpu": info.name, "device": device, "compute_capability": "%d.%d" % info.cc,
        "sm_count": info.sm_count, "max_sm_clock_mhz": info.clock_khz // 1000,
        "memory_bytes": info.total_bytes, "l2_bytes": info.l2_bytes,
        "driver": Nvml.driver_version(),
        "driver_cuda": _native.driver_string(_core.driver_version()),
        "cuda_headers": _native.driver_string(_core.CUDA_HEADER_VERSION),
        "cublas": _native.version_string(cublas_version),
        "cublas_path": lib.path if lib is not None and lib.loaded else None,
        "peak_tflops": peak_tflops(info.cc, info.sm_count, info.clock_khz),
        "flush_bytes": flush_bytes, "workspace_bytes": WORKSPACE_BYTES,
        "parent_CUDA_LAUNCH_BLOCKING": os.environ.get("CUDA_LAUNCH_BLOCKING"),
        "launch_blocking_child": ({"CUDA_LAUNCH_BLOCKING": child["env"], "pid": child["pid"]}
                                  if child else None),
    }
