"""``cuda_debug.bench.launch_latency``: the cost of one launch in each mode.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
from .. import _core, _libraries
from . import _child, _native
from ._clocks import Nvml
from ._config import BASE_MODES, NamesArg, check_device, check_number, check_progress, parse_modes
from ._progress import Progress, ProgressArg
from ._results import LatencyResult, build_latency_result


def launch_latency(modes: NamesArg = BASE_MODES, *, device: int = 0, launches: int = 1000,
                   repeats: int = 20, samples: int = 2000, warmup: float = 0.05,
                   progress: ProgressArg = None) -> LatencyResult:
    """Cost of launching an empty kernel (1 block of 1 thread) in each mode:
    ``us`` = wall microseconds per launch of a loop of `launches` launches with
    one sync at the end (``sync``: a sync after each), median/p10/p90 over
    `repeats` loops; ``call_us`` = host time of one launch (+ its sync) over
    `samples` single launches; ``extra_us`` = ``us`` minus async's. This is the
    per-launch cost behind the GEMM table's slowdowns."""
    mode_list = parse_modes(modes)
    for name, v in (("launches", launches), ("repeats", repeats), ("samples", samples)):
        check_number(name, v, integer=True)
    check_number("warmup", warmup, allow_zero=True)
    check_device(device)
    check_progress(progress)
    info = _native.device_info(device)
    kwargs = dict(device=device, samples=int(samples), repeats=int(repeats),
                  loop_n=int(launches), warmup_s=float(warmup))
    steps = Progress(len(mode_list), progress, prefix="latency ")
    runs, child = [], None
    try:
        for mode in mode_list:
            steps.show(mode)
            if mode == "launch_blocking":
                def relay(event, text):
                    steps.show(text) if event == "show" else steps.step(text)
                child = _child.run({"kind": "latency", "device": device,
                                    "kwargs": dict(kwargs, sync_each=False)}, relay)
                runs.append((mode, dict(child["results"][0], child_env=child["env"])))
                continue
            runs.append((mode, measure(mode, kwargs)))
            steps.step(mode)
    finally:
        steps.close()
    meta = {"gpu": info.name, "device": device, "compute_capability": "%d.%d" % info.cc,
            "driver": Nvml.driver_version(),
            "driver_cuda": _native.driver_string(_core.driver_version()),
            "kernel": "empty (1 block x 1 thread), non-blocking stream",
            "launch_blocking_child": ({"CUDA_LAUNCH_BLOCKING": child["env"], "pid": child["pid"]}
                                      if child else None)}
    return build_latency_result(runs, meta)


def measure(mode: str, kwargs: dict) -> dict:
    what = "cuda_debug.bench.launch_latency(mode=%s)" % mode
    kw = dict(kwargs, sync_each=(mode == "sync"))
    if mode == "scope":
        from .._scope import launch_blocking
        with launch_blocking():
            s = _native.launch_latency(what, **kw)
    elif mode == "watch":
        from .._scope import watch
        with watch():
            s = _native.launch_latency(what, **kw)
    else:
        s = _native.launch_latency(what, **kw)
    return {"call_us": s.call_us, "loop_us": s.loop_us, "loop_n": kwargs["loop_n"]}


def child_runs(spec: dict):
    _libraries.ensure(_libraries.CUDA)
    _native.device_info(spec["device"])
    kw = spec["kwargs"]
    yield "launch_blocking", lambda: measure("launch_blocking",
                                             {k: v for k, v in kw.items() if k != "sync_each"})
