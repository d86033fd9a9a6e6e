"""The ``launch_blocking`` mode: the same measurements, re-run in a child
process started with ``CUDA_LAUNCH_BLOCKING=1`` (the variable is read once, at
context creation, so a child is the only honest way to measure it).

Protocol: the parent writes one JSON spec on the child's stdin; the child
writes tagged lines on its stdout: ``progress`` events (relayed to the
parent's progress line, so it works in notebooks too) and one ``result``. Its
stderr is the parent's. This module is the parent's side; the child runs
``_child_main.py``. (json and subprocess are imported when a child runs: not
at ``import cuda_debug.bench``.)

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
import os
import sys
from typing import Callable, Optional

import numpy as np

from .. import _errors

TAG = "CUDA_DEBUG_BENCH "
_ERRORS = {"ValueError": ValueError, "TypeError": TypeError, "MemoryError": MemoryError,
           "CudaUnavailableError": _errors.CudaUnavailableError,
           "ToolConflictError": _errors.ToolConflictError}


def command() -> list:
    return [sys.executable, "-c",
            "import sys; from cuda_debug.bench._child_main import main; sys.exit(main())"]


def environment() -> dict:
    env = dict(os.environ)
    env["CUDA_LAUNCH_BLOCKING"] = "1"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run(spec: dict, on_event: Optional[Callable[[str, str], None]] = None,
        timeout: float = 3600) -> dict:
    """Run `spec` in a child with CUDA_LAUNCH_BLOCKING=1 and return its result
    (``env``: the variable as the child saw it, ``pid``, ``results``);
    `on_event(kind, text)` receives its progress events ("show" / "step")."""
    import json
    import subprocess
    proc = subprocess.Popen(command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=None, text=True, env=environment())
    result, other = None, []
    try:
        proc.stdin.write(json.dumps(spec))
        proc.stdin.close()
        for line in proc.stdout:
            if not line.startswith(TAG):
                other.append(line)
                continue
            kind, _, payload = line[len(TAG):].partition(" ")
            doc = json.loads(payload)
            if kind == "progress" and on_event is not None:
                on_event(doc["event"], doc["text"])
            elif kind == "result":
                result = doc
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if result is None:
        raise RuntimeError("cuda_debug.bench: the CUDA_LAUNCH_BLOCKING=1 child exited with %s "
                           "and no result; its output:\n%s"
                           % (proc.returncode, "".join(other)[-4000:]))
    err = result.get("error")
    if err:
        cls = _ERRORS.get(err["type"], RuntimeError)
        raise cls("in the CUDA_LAUNCH_BLOCKING=1 child: %s: %s" % (err["type"], err["message"]))
    for raw in result["results"]:
        for key in ("gpu_ms", "call_ms", "loop_ms", "loop_gpu_ms", "call_us", "loop_us"):
            if key in raw:
                raw[key] = np.asarray(raw[key], dtype=np.float64)
    return result
