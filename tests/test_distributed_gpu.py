"""torchrun on two GPUs: a device assert on rank 1, in a scope and under watch,
is reported on rank 1's stderr ([rank 1], kernel, launching line), torchrun's
failure summary names it as the root cause, and the job ends (no hang)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT, needs

pytestmark = pytest.mark.gpu

SCRIPT = os.path.join(ROOT, "benchmarks", "ddp_step.py")


def _two_gpus():
    needs("torch")
    from cuda_debug import _core
    rc, n = _core.device_count()
    if rc or n < 2:
        pytest.skip("needs 2 GPUs (%d here)" % n)
    if not os.path.exists(SCRIPT):
        pytest.skip("benchmarks/ddp_step.py is not here (installed package)")


def _fault_line():
    with open(SCRIPT) as f:
        for i, line in enumerate(f, 1):
            if "# FAULT" in line:
                return i
    raise AssertionError("no # FAULT line")


@pytest.mark.parametrize("mode", ["watch", "launch-blocking"])
def test_rank1_device_assert_is_the_root_cause(mode, tmp_path):
    _two_gpus()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", "-m", "cuda_debug", "run"] + (["--launch-blocking"] if mode != "watch" else []) \
        + [SCRIPT, "async", "--fault", "--steps", "10"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-4000:]
    assert "[rank 1]" in out and "device-side assert" in out, out[-4000:]
    assert "ddp_step.py:%d" % _fault_line() in out, out[-4000:]
    root = out[out.find("Root Cause"):]
    assert "Root Cause" in out and "device-side assert" in root, out[-4000:]
