"""The runtime launch hooks on a real GPU (csrc/hooks/runtime_launch.c).

While a watch() is open, libtorch_cuda.so's calls of the runtime's
__cudaLaunchKernel go to cuda_debug, which launches them with
cuLaunchKernelEx_ptsz (CUPTI not dispatching it) and records them as the
CUPTI callback would. These check that PyTorch's launches take that way,
that the reports stay exact, and that what must still go through CUPTI does.
"""
import pytest

from conftest import needs

pytestmark = pytest.mark.gpu

CATCH = """
import cuda_debug
from cuda_debug import _core
def describe(e):
    return dict(cls=type(e).__name__, kernel=e.kernel, lineno=e.lineno, exact=e.exact,
                text=str(e))
"""


def test_pytorch_launches_take_the_hooks_and_run_right(child):
    needs("torch")
    c = child(CATCH + """
import torch
x = torch.arange(1000, device="cuda", dtype=torch.float32)
ref = ((x * 2 + 1).sin().sum()).item()
with cuda_debug.watch():
    s0 = _core.stats()
    y = ((x * 2 + 1).sin().sum()).item()
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    s1 = _core.stats()
out = dict(hooks=s1["launch_hooks"], routed=s1["launch_hooks"]["routed"] - s0["launch_hooks"]["routed"],
           watched=s1["watched"] - s0["watched"], same=y == ref, x0=x[0].item(),
           after=_core.stats()["launch_hooks"]["on"])
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["hooks"]["on"] == 1 and r["hooks"]["entries"] >= 1, r
    assert r["routed"] >= 100 and r["watched"] >= r["routed"], r
    assert r["same"] is True and r["x0"] == 100.0, r
    assert r["after"] == 0, r


def test_a_pytorch_assert_through_the_hooks_is_exact_with_its_line(child):
    needs("torch")
    c = child(CATCH + """
import torch
emb = torch.nn.Embedding(10, 4).cuda()
bad = torch.tensor([12], device="cuda")
x = torch.ones(1000, device="cuda")
torch.cuda.synchronize()
out = {}
try:
    with cuda_debug.watch():
        for _ in range(40):
            x = x + 1
        y = emb(bad)  # CULPRIT
        for _ in range(40):
            x = x + 1
        y.sum().item()
except cuda_debug.CudaError as e:
    out = describe(e)
out["routed"] = _core.stats()["launch_hooks"]["routed"]
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r.get("cls") == "DeviceAssertError" and r["exact"] is True, r
    assert "index" in r["kernel"].lower() and r["lineno"] == c.line_of("# CULPRIT"), r
    assert r["routed"] >= 40, r


def test_launch_blocking_inside_a_watch_still_stops_at_the_launch(child):
    """A blocking thread's launches go to the runtime's own function (CUPTI's
    callback waits for them): the fault is raised at its launching line."""
    needs("torch")
    c = child(CATCH + """
import torch
emb = torch.nn.Embedding(10, 4).cuda()
bad = torch.tensor([12], device="cuda")
torch.cuda.synchronize()
out = {}
try:
    with cuda_debug.watch():
        with cuda_debug.launch_blocking():
            y = emb(bad)  # CULPRIT
            out["not_raised"] = True
except Exception as e:
    import traceback
    tb = traceback.extract_tb(e.__traceback__)
    out = dict(cls=type(e).__name__, raised_at=tb[-1].lineno if tb else None,
               lines=[f.lineno for f in tb])
report(out)
""")
    r = c.result
    assert r is not None, c
    assert "not_raised" not in r, r
    assert c.line_of("# CULPRIT") in r["lines"], r


def test_triton_and_cublas_launches_still_reach_cupti(child):
    needs("torch")
    c = child(CATCH + """
import torch
a = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
with cuda_debug.watch():
    s0 = _core.stats()
    for _ in range(20):
        b = a @ a
    torch.cuda.synchronize()
    s1 = _core.stats()
report(dict(watched=s1["watched"] - s0["watched"],
            routed=s1["launch_hooks"]["routed"] - s0["launch_hooks"]["routed"]))
""")
    r = c.result
    assert r is not None, c
    # cuBLAS launches through its own runtime copy: CUPTI records them
    assert r["watched"] >= 20 and r["watched"] - r["routed"] >= 20, r


def test_a_profiler_started_inside_a_watch_sees_the_runtime_launches(child):
    """torch.profiler takes CUPTI (the hand-over): the hooks go off first, so the
    profiler records the runtime's launch calls and their kernels."""
    needs("torch")
    c = child(CATCH + """
import warnings, torch
from torch.profiler import profile, ProfilerActivity
x = torch.zeros(1, device="cuda")
torch.cuda.synchronize()
out = {}
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    with cuda_debug.watch():
        x.add_(1)
        out["on_before"] = _core.stats()["launch_hooks"]["on"]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
            for _ in range(5):
                x.add_(1)
            torch.cuda.synchronize()
        out["on_after"] = _core.stats()["launch_hooks"]["on"]
names = [e.name for e in p.events()]
out["launch_calls"] = len([n for n in names if "LaunchKernel" in n])
out["gpu_events"] = len([e for e in p.events() if e.device_type.name == "CUDA"])
out["x"] = x.item()
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["on_before"] == 1 and r["on_after"] == 0, r
    assert r["launch_calls"] >= 5 and r["gpu_events"] >= 5, r
    assert r["x"] == 6.0, r
