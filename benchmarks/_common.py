"""What every benchmark script records its results with: the machine
(GPU, driver, CUDA, cuBLAS, PyTorch), the git commit, and the results-file
section writer. Imported by the scripts in this folder (not part of the package)."""
import os
import platform
import subprocess
import sys
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def environment(device: int = 0) -> dict:
    """GPU, driver, CUDA, cuBLAS path, Python, NumPy, PyTorch (when imported) and the
    git commit: what a benchmark result must be recorded with."""
    import numpy as np

    import cuda_debug
    from cuda_debug import _core, _libraries
    from cuda_debug.bench import _native
    from cuda_debug.bench._clocks import Nvml
    env = {"cuda_debug": cuda_debug.__version__, "python": platform.python_version(),
           "numpy": np.__version__, "platform": platform.platform()}
    try:
        info = _native.device_info(device)
        env.update(gpu=info.name, device=device, compute_capability="%d.%d" % info.cc,
                   sm_count=info.sm_count, max_sm_clock_mhz=info.clock_khz // 1000,
                   memory_gib=round(info.total_bytes / 2 ** 30, 1),
                   l2_mib=round(info.l2_bytes / 2 ** 20, 1))
    except Exception as e:  # no GPU: say so, still record the rest
        env["gpu"] = "unavailable (%s)" % e
    env["driver"] = Nvml.driver_version()
    env["driver_cuda"] = _native.driver_string(_core.driver_version())
    env["cuda_headers"] = _native.driver_string(_core.CUDA_HEADER_VERSION)
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
    """Short commit of the checkout holding `path` (this repository by default),
    with ``-dirty`` when it has uncommitted changes; None outside git.
    ``$CUDA_DEBUG_COMMIT`` wins: a copy of the tree without .git (a GPU machine)
    is told which commit it is."""
    if os.environ.get("CUDA_DEBUG_COMMIT"):
        return os.environ["CUDA_DEBUG_COMMIT"]
    folder = path or ROOT
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


def child_result(cmd, env: dict, timeout: float, what: str) -> dict:
    """Run a benchmark child; the JSON it printed on its ``RESULT `` line."""
    import json
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError("child %s failed:\n%s" % (what, p.stderr[-3000:]))
