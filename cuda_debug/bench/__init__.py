"""GEMM and launch-latency microbenchmarks: what does synchronous launching cost?

::

    >>> from cuda_debug import bench
    >>> res = bench.gemm(sizes=[1024, 4096, 8192], dtypes=["fp32", "tf32", "bf16"])
    >>> print(res.table())              # ms, TFLOP/s, % of peak, slowdown vs async
    >>> res.array["slowdown"]           # NumPy structured array, one row per configuration
    >>> res.to_csv("gemm.csv"); res.to_json("gemm.json"); res.plot("gemm.png")
    >>> print(bench.launch_latency().table())   # why: the cost of one synchronised launch

The parts:

=================  ==============================================================
``_gemm.py``       :func:`gemm` (and its in-process runs)
``_latency.py``    :func:`launch_latency`
``_config.py``     sizes, dtypes, modes, matmul flags; the TF32 rule, storage
                   types, the memory check, peaks, tolerances
``_native.py``     the calls into the C core and the names of its raw tuples
``_results.py``    the result schema, result objects, table / CSV / JSON / plot
``_child.py``      the ``launch_blocking`` mode: starts a ``CUDA_LAUNCH_BLOCKING=1`` child
``_child_main.py`` that child's side: runs the spec, reports on stdout
``_clocks.py``     SM clocks and the driver version through NVML
``_progress.py``   the progress line
``_cli.py``        ``python -m cuda_debug bench``
=================  ==============================================================

The timing loops are C (``csrc/bench/gemm_loops.c``, ``csrc/bench/launch_latency.c``,
``csrc/bench/bench_buffers.c``) calling cuBLAS, loaded at run time like the rest of
cuda_debug; they return raw per-repeat samples. Nothing here imports PyTorch.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
from ._config import (APIS, BASE_MODES, DTYPES, FLAG_NAMES, MODES, TOLERANCE,
                      TORCH_DEFAULT_FLAGS, WORKSPACE_BYTES, Config, effective_dtype,
                      flags_label, parse_size, plan, resolve_flags, torch_flags)
from ._gemm import gemm
from ._latency import launch_latency
from ._results import GemmResult, LatencyResult, summarize

__all__ = ["gemm", "launch_latency", "GemmResult", "LatencyResult", "DTYPES", "MODES",
           "BASE_MODES", "APIS", "FLAG_NAMES", "TORCH_DEFAULT_FLAGS", "TOLERANCE",
           "WORKSPACE_BYTES", "Config", "plan", "parse_size", "resolve_flags", "torch_flags",
           "effective_dtype", "flags_label", "summarize"]
