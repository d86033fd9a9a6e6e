"""watch() on a real GPU: the faulting launch named while kernels run asynchronously.

Each faulting program runs in its own Python (a sticky fault kills the CUDA
context of its process) and reports what it caught as JSON.
"""
import pytest

from conftest import needs

pytestmark = pytest.mark.gpu
pytest_plugins = ("pytester",)

CATCH = """
import cuda_debug, traceback
def describe(e):
    return dict(cls=type(e).__name__, code=e.code, kernel=e.kernel, likely=e.likely_kernel,
                filename=e.filename,
                lineno=e.lineno, exact=e.exact, mechanism=e.mechanism, text=str(e),
                surfaced_at=e.surfaced_at, candidates=len(e.candidates or ()),
                recent=len(e.recent_launches or ()), device_message=e.device_message)
"""

TORCH = CATCH + """
import torch
emb = torch.nn.Embedding(10, 4).cuda()
bad = torch.tensor([12], device="cuda")
x = torch.ones(1000, device="cuda")
torch.cuda.synchronize()
"""


@pytest.mark.parametrize("after", [1, 3, 50])
def test_fault_surfacing_later_names_the_launch(child, after):
    needs("torch")
    c = child(TORCH + """
try:
    with cuda_debug.watch():
        y = emb(bad)  # CULPRIT
        for _ in range(%d):
            x = x + 1
        y.sum().item()  # SURFACES
except cuda_debug.CudaError as e:
    report(describe(e))
""" % after)
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError", r
    assert r["mechanism"] == "watch"
    assert r["lineno"] == c.line_of("# CULPRIT") and r["filename"] == c.script, r
    assert "index" in r["kernel"].lower(), r
    assert r["exact"] is True, r
    # surfaced where the framework raised: at the first launch after the fault, at the latest
    # at .item()
    surfaced = int((r["surfaced_at"] or "x:0").split(":")[1].split()[0])
    assert c.line_of("# CULPRIT") < surfaced <= c.line_of("# SURFACES"), r
    assert "launched at %s:%d" % (c.script, c.line_of("# CULPRIT")) in r["text"], r["text"]
    # the C block written at the fault, before Python saw anything
    assert "cuda_debug (watch): device-side assert" in c.stderr, c.stderr[-2000:]


def test_side_stream_fault_while_main_stream_is_busy(child):
    needs("torch")
    c = child(TORCH + """
import cuda_debug.testing as t
side = torch.cuda.Stream()
try:
    with cuda_debug.watch():
        t.spin(0.3)                       # the main (legacy) stream is busy
        with torch.cuda.stream(side):
            y = emb(bad)  # CULPRIT
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    assert r is not None, c
    assert r["lineno"] == c.line_of("# CULPRIT"), r      # the assert text names the kernel
    assert "index" in r["kernel"].lower(), r


def test_worker_thread_launch_surfacing_in_main_thread(child):
    needs("torch")
    c = child(TORCH + """
import threading
import cuda_debug.testing as t
def work():
    t.device_assert()  # CULPRIT
with cuda_debug.watch():
    th = threading.Thread(target=work)
    th.start(); th.join()
    try:
        cuda_debug.check()
    except cuda_debug.CudaError as e:
        report(describe(e))
""")
    r = c.result
    assert r is not None, c
    assert r["lineno"] == c.line_of("# CULPRIT"), r
    assert "check_index" in r["kernel"], r


def test_graph_replay_is_one_record(child):
    needs("torch")
    c = child(TORCH + """
idx = torch.tensor([1], device="cuda")
g = torch.cuda.CUDAGraph()
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    emb(idx)                                   # warm-up outside the capture
    torch.cuda.synchronize()
    with torch.cuda.graph(g):  # CAPTURED
        out = emb(idx)
idx.fill_(12)
torch.cuda.synchronize()
try:
    with cuda_debug.watch():
        g.replay()  # CULPRIT
        out.sum().item()
except cuda_debug.CudaError as e:
    r = describe(e)
    r.update(replayed_at=e.replayed_at, graph_node=e.graph_node)
    report(r)
""")
    r = c.result
    assert r is not None, c
    # captured before watch(): the node the device's assert text names, at the line that
    # captured the graph (docs/graphs.md), replayed at the replay's line
    assert r["lineno"] == c.line_of("# CAPTURED") and r["graph_node"] is not None, r
    assert r["replayed_at"].startswith("%s:%d" % (c.script, c.line_of("# CULPRIT"))), r


def test_swallowed_exception_then_check(child):
    needs("torch")
    c = child(TORCH + """
with cuda_debug.watch():
    y = emb(bad)  # CULPRIT
    try:
        y.sum().item()
    except Exception:
        pass
try:
    cuda_debug.check()
except cuda_debug.CudaError as e:
    r = describe(e)
    r["last"] = cuda_debug.last_error() is not None
    report(r)
""")
    r = c.result
    assert r is not None, c
    assert r["lineno"] == c.line_of("# CULPRIT"), r


def test_triton_launcher_is_named(child):
    needs("triton")
    c = child(CATCH + """
import torch, triton, triton.language as tl
@triton.jit
def wild(p):
    tl.store(p + (1 << 40), 1.0)
x = torch.zeros(4, device="cuda")
torch.cuda.synchronize()
try:
    with cuda_debug.watch():
        wild[(1,)](x)  # CULPRIT
        x.sum().item()
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    assert r is not None, c
    assert r["lineno"] == c.line_of("# CULPRIT"), r
    assert "wild" in r["kernel"], r


def test_cupy_launcher_is_named(child):
    needs("cupy")
    c = child(CATCH + """
import cupy
k = cupy.RawKernel(r'''
extern "C" __device__ void __assertfail(const char*, const char*, unsigned, const char*, size_t);
extern "C" __global__ void cupy_checks(int n) {
    if (threadIdx.x == 1 && n > 0) __assertfail("n <= 0", "cupy.cu", 7, "cupy_checks", 1);
}''', "cupy_checks")
try:
    with cuda_debug.watch():
        k((1,), (32,), (cupy.int32(1),))  # CULPRIT
        cupy.cuda.Device().synchronize()
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    assert r is not None, c
    assert r["lineno"] == c.line_of("# CULPRIT"), r
    assert "cupy_checks" in r["kernel"], r


def test_run_watches_by_default(tmp_path):
    needs("torch")
    import subprocess, sys
    p = tmp_path / "train.py"
    p.write_text("import torch\nemb = torch.nn.Embedding(10, 4).cuda()\n"
                 "bad = torch.tensor([12], device='cuda')\n"
                 "y = emb(bad)\n"                  # line 4: the culprit
                 "z = y * 2\n"
                 "print(z.sum().item())\n")
    r = subprocess.run([sys.executable, "-m", "cuda_debug", "run", str(p)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    assert "launched at %s:4" % p in r.stderr, r.stderr
    assert "surfaced at %s:5" % p in r.stderr or "surfaced at %s:6" % p in r.stderr, r.stderr


def test_pytest_cuda_watch_names_kernel_and_line(pytester):
    needs("torch")
    pytester.makepyfile(test_w='''
import torch
def test_1():
    emb = torch.nn.Embedding(10, 4).cuda()
    y = emb(torch.tensor([12], device="cuda"))  # line 5
    assert y.sum().item() > -1
def test_2():
    pass
''')
    result = pytester.runpytest_subprocess("--cuda-watch", "-p", "no:cacheprovider")
    out = result.stdout.str()
    assert "DeviceAssertError" in out, out
    assert "test_w.py:5" in out, out
    assert "1 test not run" in out, out


def test_no_false_culprit_after_10000_launches(child):
    needs("torch")
    c = child(CATCH + """
import torch
from cuda_debug import _core
x = torch.zeros(16, device="cuda")
with cuda_debug.watch():
    for _ in range(10000):
        x.add_(1)
    torch.cuda.synchronize()
    st = _core.stats()
    report(dict(incomplete=_core.watch_streams(0), watched=st["watched"],
                unmarked=st["unmarked"], value=float(x[0].item())))
""")
    r = c.result
    assert r is not None, c
    assert r["incomplete"] == [], r
    assert r["watched"] >= 10000 and r["unmarked"] == 0, r
    assert r["value"] == 10000.0


# -- the always-on watch: sparse markers -------------------------------------------

def test_always_on_names_an_assert_among_many_launches_exactly(child):
    """100 launches, the asserting embedding, 30 more, then the host waits: the
    device's text names the kernel, the only one of that name among the
    candidates: exact, at its line; markers were sparse."""
    needs("torch")
    c = child(TORCH + """
from cuda_debug import _core
try:
    with cuda_debug.watch():
        for _ in range(100):
            x.add_(1)
        y = emb(bad)  # CULPRIT
        for _ in range(30):
            x.add_(1)
        y.sum().item()
except cuda_debug.CudaError as e:
    r = describe(e)
    st = _core.stats()
    r.update(marked=st["marked"], watched=st["watched"], every=e.markers_every,
             named=e.named_by_device)
    report(r)
""")
    r = c.result
    assert r is not None, c
    assert (r["cls"], r["exact"], r["named"], r["every"]) == ("DeviceAssertError", True, True, 16), r
    assert r["lineno"] == c.line_of("# CULPRIT"), r
    assert r["marked"] <= r["watched"] // 8, r          # one marker per 16 launches, not per launch


@pytest.mark.parametrize("exact", [False, True])
def test_always_on_illegal_address_gives_at_most_16_candidates_or_exact(child, exact):
    """An illegal address from a raw kernel (no assert text) among 40 empty
    kernels: the always-on watch names at most 16 candidates in launch order,
    the culprit among them with its line; watch(exact=True) names it."""
    c = child(CATCH + """
import cuda_debug.testing as t
t.empty()
try:
    with cuda_debug.watch(exact=%r):
        for i in range(40):
            if i == 21:
                t.illegal_address()  # CULPRIT
            else:
                t.empty()
        cuda_debug.check()
except cuda_debug.CudaError as e:
    r = describe(e)
    r.update(lines=[c["lineno"] for c in (e.candidates or [])], count=e.candidate_count,
             kernels=[c["kernel"] for c in (e.candidates or [])])
    report(r)
""" % exact)
    r = c.result
    assert r is not None, c
    assert r["cls"] == "IllegalAddressError", r
    if exact:
        assert r["exact"] is True and r["lineno"] == c.line_of("# CULPRIT"), r
        assert "write_wild" in r["kernel"], r
    else:
        assert r["exact"] is False and 2 <= r["count"] <= 16, r
        assert c.line_of("# CULPRIT") in [r["lineno"]] + r["lines"], r
        # cuda_debug.testing's write_wild: its first launch, never seen to finish,
        # leads the empty kernels seen finishing before it
        assert r["kernel"] is None and "write_wild" in r["likely"], r
        assert "one of %d launches not known to have finished" % r["count"] in r["text"], r


def test_always_on_triton_device_assert_is_exact(child):
    """Triton prints `unknown` as the asserting function: the kernel is named by
    the source line of its assert (its function), among sparse-marker candidates."""
    needs("triton")
    c = child(CATCH + """
import os
import torch, triton, triton.language as tl
@triton.jit(debug=True)
def checked(p, n):
    i = tl.arange(0, 32)
    tl.device_assert(i < n, "i < n")
    tl.store(p + i, 1.0)
x = torch.zeros(64, device="cuda")
torch.cuda.synchronize()
try:
    with cuda_debug.watch():
        for _ in range(5):
            x.add_(1)
        checked[(1,)](x, 4)  # CULPRIT
        for _ in range(5):
            x.add_(1)
        x.sum().item()
except cuda_debug.CudaError as e:
    r = describe(e)
    r["named"] = e.named_by_device
    report(r)
""")
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError", r
    assert r["lineno"] == c.line_of("# CULPRIT") and "checked" in r["kernel"], r
    assert r["exact"] is True and r["named"] is True, r
