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
    """torch.profiler takes CUPTI (the hand-over): the hooks go to their record
    mode (the runtime's own launch, then the record), so the profiler records
    the runtime's launch calls and their kernels, as without cuda_debug."""
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
    # the hooks stay on through the window, in their record mode (the runtime's own
    # launch, then the record): the profiler sees the runtime's launch calls
    assert r["on_before"] == 1 and r["on_after"] == 1, r
    assert r["launch_calls"] >= 5 and r["gpu_events"] >= 5, r
    assert r["x"] == 6.0, r


def test_routed_kernels_compute_what_unwatched_ones_do(child):
    """Kernels with large dynamic shared memory set through the runtime
    (cudaFuncSetAttribute: flash attention, reductions), on side streams and in
    a second watch after the first closed (the kernel cache's new epoch): the
    same bits inside watch() as outside."""
    needs("torch")
    c = child(CATCH + """
import torch
import torch.nn.functional as F
torch.manual_seed(0)
q, k, v = (torch.randn(4, 16, 1024, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(
    512, 8, 2048, dropout=0.0, batch_first=True), 2).cuda().eval()
xb = torch.randn(8, 256, 512, device="cuda")
side = torch.cuda.Stream()
def work():
    with torch.no_grad():
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        b = enc(xb)
        with torch.cuda.stream(side):
            c = torch.softmax(xb * 3, dim=-1).cumsum(-1)
        torch.cuda.current_stream().wait_stream(side)
        return a, b, c, xb.norm(dim=-1)
ref = work()
torch.cuda.synchronize()
same = []
for _ in range(2):
    with cuda_debug.watch():
        got = work()
        torch.cuda.synchronize()
        routed = _core.stats()["launch_hooks"]["routed"]
    same.append([bool(torch.equal(x, y)) for x, y in zip(ref, got)])
report(dict(same=same, routed=routed, asked=_core.stats()["launch_hooks"]["asked"],
            handed_back=_core.stats()["launch_hooks"]["handed_back"]))
""")
    r = c.result
    assert r is not None, c
    assert r["same"] == [[True] * 4, [True] * 4], r
    assert r["routed"] >= 10 and r["handed_back"] == 0, r
