"""Leaving the last watch() detaches CUPTI (cuptiFinalize), on a real GPU.

Each program runs in its own Python (a sticky fault kills the CUDA context).
The CPU tests of the same cycle: tests/test_cupti_detach_cpu.py.
"""
import pytest

from conftest import needs

pytestmark = pytest.mark.gpu


def test_watches_after_detaches_name_a_fault_at_its_line(child):
    """20 cycles of a watch() with PyTorch (routed) and cuBLAS (CUPTI) launches,
    a launch outside after each (CUPTI detached, initialised again at the next
    entry); then a fault in a watch is named at its line, the kernel exact."""
    needs("torch")
    c = child("""
import torch, cuda_debug
from cuda_debug import _core
emb = torch.nn.Embedding(10, 4).cuda()
bad = torch.tensor([12], device="cuda")
a = torch.randn(64, 64, device="cuda")
x = torch.zeros(1, device="cuda")
torch.cuda.synchronize()
out = {}
for i in range(20):
    with cuda_debug.watch():
        x.add_(1)
        a = (a @ a).clamp_(-1, 1)
    x.add_(1)                                  # its callback detaches CUPTI
    torch.cuda.synchronize()
s = _core.stats()
out.update(detaches=s["detaches"], subscribed=s["subscribed"], residue=s["cupti_residue"],
           routed=s["launch_hooks"]["routed"], x=x.item())
try:
    with cuda_debug.watch():
        y = emb(bad)  # CULPRIT
        for _ in range(40):
            x.add_(1)
        y.sum().item()
except cuda_debug.CudaError as e:
    out.update(kernel=e.kernel, lineno=e.lineno, exact=e.exact)
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["detaches"] == 20 and not r["subscribed"] and r["residue"] == "", r
    assert r["routed"] >= 20 and r["x"] == 40.0, r
    assert "index" in r["kernel"].lower() and r["exact"] is True, r
    assert r["lineno"] == c.line_of("# CULPRIT"), r


def test_after_a_profiler_window_cupti_stays_and_the_next_window_records(child):
    """A torch.profiler window inside a watch: leaving the watch does not
    finalize CUPTI under Kineto (stats() says why), and a second window, after
    the watch, still records GPU events."""
    needs("torch")
    c = child("""
import warnings, torch, cuda_debug
from cuda_debug import _core
from torch.profiler import profile, ProfilerActivity
x = torch.zeros(1, device="cuda")
torch.cuda.synchronize()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with cuda_debug.watch():
        x.add_(1)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            x.add_(1)
            torch.cuda.synchronize()
        x.add_(1)
x.add_(1)
torch.cuda.synchronize()
s = _core.stats()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(5):
        x.add_(1)
    torch.cuda.synchronize()
gpu = len([e for e in p.events() if e.device_type.name == "CUDA"])
report(dict(detaches=s["detaches"], residue=s["cupti_residue"], gpu_events=gpu, x=x.item()))
""")
    r = c.result
    assert r is not None, c
    assert r["detaches"] == 0, r
    assert r["residue"].startswith("a profiler (torch.profiler/Kineto) used CUPTI"), r
    assert r["gpu_events"] >= 5 and r["x"] == 9.0, r
