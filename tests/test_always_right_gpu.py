"""The always-on watch() over a real run, on a real GPU (SPEC section 15):
profiler windows are gaps in its coverage, not its end; a hang names its stuck
kernel first; of two kernels that fit an assert, the device's words pick; a
fault without text leads with the user's kernel; a kernel the device's text
names but the watch did not record is named as such, with why.

Each program runs in its own Python (a sticky fault kills its CUDA context) and
reports what it caught as JSON. All of them run the DEFAULT watch() (sparse
markers), as users leave it on.
"""
import pytest

from conftest import Live, needs

pytestmark = pytest.mark.gpu

CATCH = """
import warnings
warnings.simplefilter("ignore")
import cuda_debug
from cuda_debug import _core
def describe(e):
    return dict(cls=type(e).__name__, kernel=e.kernel, likely=e.likely_kernel,
                filename=e.filename, lineno=e.lineno, exact=e.exact, text=str(e),
                candidates=[c.get("kernel") for c in (e.candidates or ())],
                not_covered=e.not_covered, not_recorded=e.not_recorded,
                ruled_out=len(e.ruled_out or ()))
"""

TORCH = CATCH + """
import torch
from torch.profiler import profile, ProfilerActivity, schedule
A = [ProfilerActivity.CPU, ProfilerActivity.CUDA]
emb = torch.nn.Embedding(10, 4).cuda()
bad = torch.tensor([12], device="cuda")
x = torch.ones(1000, device="cuda")
torch.cuda.synchronize()
def gpu_events(prof):
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
def step(n=5):
    global x
    for _ in range(n):
        x = x * 1.0001 + 1
"""


def _named_exactly(r, c, marker="# CULPRIT"):
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError", r
    assert r["lineno"] == c.line_of(marker) and r["exact"] is True, r
    assert "index" in r["kernel"].lower(), r


@pytest.mark.parametrize("how, teardown", [("with", "0"), ("start_stop", "0")])
def test_a_profiler_window_is_a_gap_and_a_later_fault_is_named(child, how, teardown):
    """Ten profiled steps inside one watch(), then an out-of-range index: named
    at its line, and the profiler's trace has its GPU events, as without
    cuda_debug. Kineto keeps CUPTI after it stops (measured on the H200,
    PyTorch 2.11, with TEARDOWN_CUPTI=1 too, for 15 s after the stop):
    PyTorch's launches stay recorded by the launch hooks (their record mode)."""
    needs("torch")
    window = ("with profile(activities=A) as p:\n            for _ in range(10): step()\n"
              "            torch.cuda.synchronize()" if how == "with" else
              "p = profile(activities=A)\n        p.start()\n        for _ in range(10): step()\n"
              "        torch.cuda.synchronize()\n        p.stop()")
    c = child(TORCH + """
out = {}
try:
    with cuda_debug.watch():
        step()
        %s
        out["events"] = gpu_events(p)
        import time
        for _ in range(60 if %r == "1" else 0):    # Kineto's teardown: a moment later
            if _core.stats()["subscribed"]:
                break
            time.sleep(0.25)
        s = _core.stats()
        out.update(subscribed=s["subscribed"], hooks=s["launch_hooks"]["on"],
                   recording=s["launch_hooks"]["recording"], take_backs=s["take_backs"])
        step()
        y = emb(bad)  # CULPRIT
        y.sum().item()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""" % (window, teardown), env={"TEARDOWN_CUPTI": teardown})
    r = c.result
    _named_exactly(r, c)
    assert r["events"] > 0, r
    if teardown == "1":
        assert (r["subscribed"], r["hooks"], r["recording"]) == (True, 1, 0), r
        assert r["take_backs"] >= 1, r
    else:
        assert (r["subscribed"], r["hooks"], r["recording"]) == (False, 1, 1), r


def test_a_profiler_schedule_over_1000_steps_keeps_the_watch(child):
    """schedule= with on_trace_ready over 1,000 steps: every window's trace has
    GPU events, the watch counts launches through all of them, and a fault at
    the end is named."""
    needs("torch")
    c = child(TORCH + """
out = {"traces": []}
try:
    with cuda_debug.watch():
        w0 = _core.stats()["watched"]
        with profile(activities=A, schedule=schedule(wait=150, warmup=2, active=3, repeat=6),
                     on_trace_ready=lambda p: out["traces"].append(gpu_events(p))) as p:
            for i in range(1000):
                step(2)
                p.step()
        torch.cuda.synchronize()
        s = _core.stats()
        out.update(watched=s["watched"] - w0, hand_overs=s["hand_overs"], take_backs=s["take_backs"],
                   subscribed=s["subscribed"])
        y = emb(bad)  # CULPRIT
        y.sum().item()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""", timeout=300)
    r = c.result
    _named_exactly(r, c)
    assert len(r["traces"]) == 6 and all(n > 0 for n in r["traces"]), r
    # 2 launches (mul, add) a step, each recorded: through the windows too
    assert r["watched"] >= 2 * 2 * 1000, r
    assert r["hand_overs"] >= 1, r


def test_a_profiler_opened_before_the_watch(child):
    """A watch() opened inside a profiler window: PyTorch's launches are
    recorded without CUPTI (an assert in the window is named exactly), and the
    profiler's stop gives the watch CUPTI (a Triton/cuBLAS launch is then seen)."""
    needs("torch")
    c = child(TORCH + """
out = {}
p = profile(activities=A)
p.start()
try:
    with cuda_debug.watch():
        s = _core.stats()
        out.update(subscribed=s["subscribed"], recording=s["launch_hooks"]["recording"])
        step()
        p.stop()
        out["events"] = gpu_events(p)
        out.update(gaps=[g[1] for g in _core.coverage_gaps()])
        y = emb(bad)  # CULPRIT
        y.sum().item()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""")
    r = c.result
    _named_exactly(r, c)
    assert (r["subscribed"], r["recording"]) == (False, 1), r
    assert r["gaps"] == [_GAP_HELD], r
    assert r["events"] > 0, r


_GAP_HELD = 2


def test_an_assert_in_a_profiler_window_is_named_from_the_hooks_records(child):
    """A fault inside the window, in one of PyTorch's own kernels: the launch
    hooks recorded it (no CUPTI), so the device's text names it exactly."""
    needs("torch")
    c = child(TORCH + """
out = {}
try:
    with cuda_debug.watch():
        step()
        with profile(activities=A) as p:
            step()
            y = emb(bad)  # CULPRIT
            y.sum().item()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""")
    _named_exactly(c.result, c)


def test_a_kernel_the_device_names_that_was_not_recorded_is_named_with_why(child):
    """A CuPy kernel asserts inside a profiler window (CuPy launches through the
    driver: not recorded without CUPTI); PyTorch's launches around it were. The
    report names CuPy's kernel from the device's text, says its launch was not
    recorded because a profiler held CUPTI from the window's line, and blames
    none of the recorded launches."""
    needs("torch", "cupy")
    c = child(TORCH + """
import cupy
k = cupy.RawKernel(r'''
extern "C" __global__ void checked_gather(const int *i, float *out) {
    assert(i[0] < 4);
    out[0] = 1.0f;
}''', "checked_gather")
idx = cupy.array([9], dtype=cupy.int32)
o = cupy.zeros(1, dtype=cupy.float32)
out = {}
try:
    with cuda_debug.watch():
        step()
        with profile(activities=A) as p:  # WINDOW
            step()
            k((1,), (1,), (idx, o))
            cupy.cuda.runtime.deviceSynchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
except Exception as e:
    out.update(other=repr(e)[:300])
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r.get("cls") == "DeviceAssertError", r
    assert r["kernel"] == "checked_gather" and r["exact"] is False, r
    why = " ".join(r["not_recorded"] or [])
    assert "a profiler held CUPTI from %s:%d" % (c.script, c.line_of("# WINDOW")) in why, r
    assert "not recorded" in r["text"] and "multi_tensor" not in r["text"], r


HANG = TORCH + """
import threading, time
seen = {}
def look():
    time.sleep(3.5)
    f = cuda_debug.in_flight()
    seen.update(short=f[0].short if f else None, n=len(f))
with cuda_debug.watch(hang_after=2):
    th = threading.Thread(target=look)
    th.start()
    y = x * 2
    %s  # SPIN
    z = y + 1; w = z * 3
    torch.cuda.synchronize()
    th.join()
report(seen)
"""


@pytest.mark.parametrize("spin", ["torch", "cupy"])
def test_a_plain_hang_in_the_default_mode_names_the_stuck_kernel_first(child, spin):
    """Inside watch(hang_after=2): y = x * 2, a kernel spinning 5 s, two more
    ops, synchronize(): the hang report (and in_flight()) lead with the spinning
    kernel, at its line."""
    needs("torch", *(["cupy"] if spin == "cupy" else []))
    if spin == "cupy":
        pre = """
import cupy
slow = cupy.RawKernel(r'''
extern "C" __global__ void slow_spin(long long cycles) {
    long long t0 = clock64(); while (clock64() - t0 < cycles) {}
}''', "slow_spin")
"""
        call, name = "slow((1,), (1,), (cupy.int64(10**10),))", "slow_spin"
    else:
        pre, call, name = "", "torch.cuda._sleep(int(10**10))", "spin_kernel"
    c = child(pre + HANG % call, timeout=300)   # the spin is 5 s alone; longer beside other work
    r = c.result
    assert r is not None, c
    assert r["short"] == name, r
    err = c.stderr
    head = "cuda_debug (watch): possible hang"
    assert head in err, err[-3000:]
    block = err[err.index(head):].splitlines()
    assert block[2].startswith("  %s on stream" % name), block
    assert "launched at %s:%d" % (c.script, c.line_of("# SPIN")) in block[3], block


def test_an_assert_two_kernels_fit_is_named_by_the_devices_words(child):
    """A gather on a side stream inside a fork/join graph, replayed 500 times,
    then once with a bad index: the device's text (ScatterGatherKernel.cu,
    "scatter gather kernel index out of bounds") fits the gather and the
    reduction's lambda; its words pick the gather."""
    needs("torch")
    c = child(CATCH + """
import torch
src = torch.randn(64, 8, device="cuda")
idx = torch.zeros(64, 8, dtype=torch.long, device="cuda")
side = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
out = {}
try:
    with cuda_debug.watch():
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(3):
                y = src * 2
        torch.cuda.synchronize()
        with torch.cuda.graph(g):
            y = src * 2
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                z = torch.gather(src, 0, idx)  # GATHER
            torch.cuda.current_stream().wait_stream(side)
            t = y.sum() + z.sum()
        for _ in range(500):
            g.replay()
        torch.cuda.synchronize()
        idx.fill_(1000)
        g.replay()  # REPLAY
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""")
    r = c.result
    assert r is not None and r["cls"] == "DeviceAssertError", c
    lead = r["kernel"] or r["likely"]
    assert "gather" in lead.lower() and "reduce" not in lead.lower(), r
    if not r["exact"]:
        assert "one of" in r["text"].splitlines()[0], r


def test_a_wild_triton_store_leads_before_pytorchs_kernel(child):
    """a = x * 2, then a Triton store at a wild offset (no device text): the
    report leads with the Triton kernel (a user's), not PyTorch's multiply."""
    needs("torch", "triton")
    c = child(CATCH + """
import torch, triton, triton.language as tl
@triton.jit
def wild_store(p, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(p + i + (1 << 40), i.to(tl.float32), mask=i < n)
x = torch.ones(1024, device="cuda")
torch.cuda.synchronize()
out = {}
try:
    with cuda_debug.watch():
        for _ in range(3):
            a = x * 2
        torch.cuda.synchronize()
        a = x * 2
        wild_store[(1,)](a, 1024, BLOCK=1024)  # CULPRIT
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""")
    r = c.result
    assert r is not None and r["cls"] == "IllegalAddressError", c
    lead = r["kernel"] or r["likely"]
    assert lead == "wild_store" and r["lineno"] == c.line_of("# CULPRIT"), r


def test_make_graphed_callables_a_fault_in_a_replay_is_named(child):
    """torch.cuda.make_graphed_callables: the forward and backward graphs are
    captured inside watch(); an out-of-range index at a later call is named
    at the embedding's node and the graphed call's line."""
    needs("torch")
    c = child(CATCH + """
import torch
class M(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(10, 4)
        self.lin = torch.nn.Linear(4, 4)
    def forward(self, i):
        return self.lin(self.emb(i))  # EMB
m = M().cuda()
i = torch.zeros(8, dtype=torch.long, device="cuda")
out = {}
try:
    with cuda_debug.watch():
        g = torch.cuda.make_graphed_callables(m, (i,))
        for _ in range(5):
            g(i).sum().backward()
        torch.cuda.synchronize()
        i.fill_(12)
        g(i).sum().backward()  # CALL
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e), node=e.graph_node, replayed=e.replayed_at)
report(out)
""")
    r = c.result
    assert r is not None and r["cls"] == "DeviceAssertError", c
    assert "index" in (r["kernel"] or r["likely"]).lower(), r
    assert r["replayed"] and ":%d" % c.line_of("# CALL") in r["replayed"], r


@pytest.mark.slow
def test_a_short_soak_names_the_fault_at_its_end():
    """benchmarks/soak.py for half a minute: a training loop with a DataLoader,
    profiler windows, graph captures and threads under one watch(), beside the
    same loop unwatched; the fault at its end is named exactly, at its line."""
    needs("torch")
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "soak.py"),
                        "--minutes", "0.5"], capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    assert "the fault named exactly at its line" in last, p.stdout
    assert "profiler windows" in last and " 0 profiler windows" not in last, p.stdout
