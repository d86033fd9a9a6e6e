"""The child of the ``launch_blocking`` mode (``_child.py`` starts it): a JSON
spec on stdin, tagged lines on stdout.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
import json
import os
import sys

from ._child import TAG


def _emit(kind: str, doc: dict) -> None:
    sys.stdout.write(TAG + kind + " " + json.dumps(doc) + "\n")
    sys.stdout.flush()


def main() -> int:
    """The child: a JSON spec on stdin, tagged lines on stdout."""
    from ._results import jsonable
    out = {"env": os.environ.get("CUDA_LAUNCH_BLOCKING"), "pid": os.getpid(), "results": [],
           "error": None}
    try:
        spec = json.loads(sys.stdin.read())
        if spec["kind"] == "gemm":
            from ._gemm import child_runs
            runs = child_runs(spec)
        elif spec["kind"] == "latency":
            from ._latency import child_runs
            runs = child_runs(spec)
        else:
            raise ValueError("unknown child kind %r" % spec["kind"])
        for text, thunk in runs:
            _emit("progress", {"event": "show", "text": text})
            out["results"].append(jsonable(thunk()))
            _emit("progress", {"event": "step", "text": text})
    except Exception as e:
        out["error"] = {"type": type(e).__name__, "message": str(e)}
    _emit("result", out)
    return 0
