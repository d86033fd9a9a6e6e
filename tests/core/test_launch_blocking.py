"""launch_blocking() on a real GPU: every fault kind x launcher, in child processes.

Each faulting program runs in its own Python (a sticky fault kills the CUDA
context of its process) and reports what it caught as JSON.
"""
import pickle

import pytest

pytestmark = pytest.mark.gpu

CATCH = """
import cuda_debug, traceback
def describe(e):
    return dict(cls=type(e).__name__, code=e.code, sticky=e.sticky, kernel=e.kernel,
                filename=e.filename, lineno=e.lineno, function=e.function,
                device_message=e.device_message, driver_log=e.driver_log, text=str(e),
                cause=type(e.__cause__).__name__ if e.__cause__ is not None else None,
                grid=list(e.grid) if e.grid else None, block=list(e.block) if e.block else None,
                found_at=e.found_at, stack_len=len(e.launch_stack or []))
"""


def _check_common(r, child, cls, code):
    assert r is not None, child
    assert r["cls"] == cls, child
    assert r["code"] == code
    assert r["filename"] == child.script, r
    assert r["lineno"] == child.line_of("# LAUNCH"), r
    assert r["stack_len"] >= 1


# -- cuda_debug's own fault kernels -------------------------------------------

OWN = [
    ("device_assert", "DeviceAssertError", 710, "check_index<int>"),
    ("illegal_address", "IllegalAddressError", 700, "write_wild"),
    ("trap", "LaunchFailureError", 719, "trap"),
    ("misaligned_address", "MisalignedAddressError", 716, "write_misaligned"),
]


@pytest.mark.parametrize("fault,cls,code,kernel", OWN, ids=[o[0] for o in OWN])
def test_own_kernels_raise_at_launch_line(child, fault, cls, code, kernel):
    c = child(CATCH + """
import cuda_debug.testing as t
try:
    with cuda_debug.launch_blocking():
        t.%s()  # LAUNCH
        print("not reached")
except cuda_debug.CudaError as e:
    report(describe(e))
""" % fault)
    r = c.result
    _check_common(r, c, cls, code)
    assert r["sticky"] is True
    assert kernel in r["kernel"], r
    assert kernel in r["text"] and "restart the process" in r["text"]
    assert "not reached" not in c.stdout
    assert r["grid"] == [1, 1, 1]
    if fault == "device_assert":
        assert "Assertion" in r["device_message"], r
        assert "thread [3,0,0]" in r["text"], r["text"]


def test_bad_launch_is_not_sticky_and_context_survives(child):
    c = child(CATCH + """
import cuda_debug.testing as t
out = {}
try:
    with cuda_debug.launch_blocking():
        t.bad_launch()  # LAUNCH
except cuda_debug.CudaError as e:
    out = describe(e)
t.empty()
cuda_debug.check()              # raises if the context were dead
with cuda_debug.launch_blocking():
    t.spin(0.01)
out["after"] = "usable"
report(out)
""")
    r = c.result
    _check_common(r, c, "LaunchError", 1)
    assert r["sticky"] is False
    assert r["block"] == [4096, 1, 1]
    assert "still usable" in r["text"]
    assert r["after"] == "usable"


def test_without_scope_the_fault_surfaces_later_and_check_names_it(child):
    c = child(CATCH + """
import cuda_debug.testing as t
t.device_assert()
x = 1                            # the launch returned: the fault is asynchronous
try:
    cuda_debug.check()  # LAUNCH
except cuda_debug.CudaError as e:
    r = describe(e)
    r["last"] = type(cuda_debug.last_error()).__name__
    report(r)
""")
    r = c.result
    _check_common(r, c, "DeviceAssertError", 710)
    assert r["found_at"] == "check"
    assert "launch_blocking()" in r["text"]       # tells how to find the kernel
    assert r["last"] == "DeviceAssertError"


def test_swallowed_fault_raises_at_scope_exit_and_last_error_keeps_it(child):
    c = child(CATCH + """
import cuda_debug._core as core, cuda_debug.testing as t
try:
    with cuda_debug.launch_blocking():
        rc = core.fault_launch("assert")   # a launcher that ignores the return code
        pass
except cuda_debug.CudaError as e:
    r = describe(e)
    r["rc"] = rc
    r["last"] = str(cuda_debug.last_error()) == str(e)
    report(r)
""")
    r = c.result
    assert r["cls"] == "DeviceAssertError" and r["rc"] == 710
    assert r["found_at"] == "scope exit"
    assert r["last"] is True


def test_exceptions_pickle_across_processes(child):
    c = child(CATCH + """
import pickle, cuda_debug.testing as t
try:
    with cuda_debug.launch_blocking():
        t.device_assert()
except cuda_debug.CudaError as e:
    report(dict(blob=pickle.dumps(e).hex(), text=str(e)))
""")
    err = pickle.loads(bytes.fromhex(c.result["blob"]))
    import cuda_debug
    assert isinstance(err, cuda_debug.DeviceAssertError)
    assert str(err) == c.result["text"]
    assert err.lineno is not None
    assert any(fs.lineno == err.lineno and fs.filename == err.filename for fs in err.launch_stack)


def test_fault_to_exception_is_fast(child):
    c = child(CATCH + """
import time, cuda_debug.testing as t
t.empty(); cuda_debug.check()
with cuda_debug.launch_blocking():
    t.empty()                       # CUPTI subscribed, module loaded
t0 = time.perf_counter()
try:
    with cuda_debug.launch_blocking():
        t.device_assert()
except cuda_debug.CudaError:
    report(dict(ms=(time.perf_counter() - t0) * 1e3))
""")
    assert c.result is not None, c
    assert c.result["ms"] < 1000, c.result


def test_driver_log_lines_when_the_driver_has_them(child):
    c = child(CATCH + """
import cuda_debug._core as core, cuda_debug.testing as t
try:
    with cuda_debug.launch_blocking():
        t.illegal_address()
except cuda_debug.CudaError as e:
    r = describe(e); r["driver"] = core.driver_version(); report(r)
""")
    r = c.result
    if r["driver"] < 12090:
        pytest.skip("driver %d has no error log API (needs CUDA 12.9)" % r["driver"])
    assert r["driver_log"], r
    assert any("700" in line or "ILLEGAL" in line for line in r["driver_log"]), r["driver_log"]


# -- scopes: threads, nesting, opt-out, decorator ------------------------------

def test_scope_blocks_only_this_thread_and_nests(child):
    c = child("""
import threading, time, cuda_debug, cuda_debug.testing as t
t.empty(); cuda_debug.check()
def launch_time(fn):
    t0 = time.perf_counter(); fn(); return time.perf_counter() - t0
out = {}
with cuda_debug.launch_blocking():
    out["in_scope"] = launch_time(lambda: t.spin(0.2))
    out["blocking"] = cuda_debug.is_launch_blocking()
    with cuda_debug.launch_blocking(False):
        out["opted_out"] = launch_time(lambda: t.spin(0.2))
        out["blocking_inner"] = cuda_debug.is_launch_blocking()
        cuda_debug.check()
    out["back_in_scope"] = launch_time(lambda: t.spin(0.2))
    box = {}
    def other():
        box["blocking"] = cuda_debug.is_launch_blocking()
        box["t"] = launch_time(lambda: t.spin(0.2))
        cuda_debug.check()
    th = threading.Thread(target=other); th.start(); th.join()
    out["other_thread"] = box["t"]; out["other_blocking"] = box["blocking"]
cuda_debug.check()
out["outside"] = launch_time(lambda: t.spin(0.2)); cuda_debug.check()
out["blocking_after"] = cuda_debug.is_launch_blocking()

@cuda_debug.launch_blocking()
def decorated():
    return launch_time(lambda: t.spin(0.2)), cuda_debug.is_launch_blocking()
out["decorated"], out["decorated_blocking"] = decorated()
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["in_scope"] >= 0.19 and r["back_in_scope"] >= 0.19 and r["decorated"] >= 0.19, r
    assert r["opted_out"] < 0.05 and r["other_thread"] < 0.05 and r["outside"] < 0.05, r
    assert r["blocking"] and r["decorated_blocking"]
    assert not r["blocking_inner"] and not r["other_blocking"] and not r["blocking_after"]


def test_all_threads_scope_blocks_other_threads(child):
    c = child("""
import threading, time, cuda_debug, cuda_debug.testing as t
t.empty(); cuda_debug.check()
box = {}
def other():
    t0 = time.perf_counter(); t.spin(0.2); box["t"] = time.perf_counter() - t0
with cuda_debug.launch_blocking(all_threads=True):
    th = threading.Thread(target=other); th.start(); th.join()
report(box)
""")
    assert c.result["t"] >= 0.19, c


def test_no_deadlock_when_another_thread_holds_the_gil(child):
    """The fault is found and recorded while another thread holds the GIL: the
    launch callback never needs it. The scoped thread waits on a 0.5 s kernel
    (GIL released); meanwhile a second thread takes the GIL and keeps it 1.5 s
    (a PyDLL call keeps the GIL). The fault record's time falls inside that
    hold; the exception follows once the GIL is free."""
    c = child(CATCH + """
import ctypes, threading, time, cuda_debug.testing as t
from cuda_debug import _report
libc = ctypes.PyDLL(None)           # PyDLL: the GIL stays held during the call
go = threading.Event()
hold = {}
def hog():
    go.wait()
    time.sleep(0.1)                 # the scoped thread is inside its launch by now
    hold["start"] = time.time()
    libc.usleep(1500000)            # 1.5 s with the GIL held
    hold["end"] = time.time()
t.empty(); cuda_debug.check()
with cuda_debug.launch_blocking():  # CUPTI loaded: entering the next scope is quick
    t.empty()
th = threading.Thread(target=hog); th.start()
t0 = time.perf_counter()
try:
    with cuda_debug.launch_blocking():
        with cuda_debug.launch_blocking(False):
            t.spin(0.5)             # asynchronous: queued ahead of the assert
        go.set()
        t.device_assert()  # LAUNCH
except cuda_debug.CudaError as e:
    r = describe(e); r["s"] = time.perf_counter() - t0
th.join()
r["fault_time"] = _report.faults(0)[0].wall_time
r.update(hold)
report(r)
""", timeout=60)
    r = c.result
    _check_common(r, c, "DeviceAssertError", 710)
    assert r["start"] < r["fault_time"] < r["end"], r
    assert r["s"] < 10, r


def test_ten_thousand_scopes_leak_nothing(child):
    c = child("""
import gc, time, cuda_debug, cuda_debug._core as core, cuda_debug.testing as t
t.empty(); cuda_debug.check()
def rss_kb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4
for _ in range(500):
    with cuda_debug.launch_blocking():
        pass
gc.collect(); before = rss_kb(); s0 = core.stats()["subscribes"]
t0 = time.perf_counter()
for _ in range(10000):
    with cuda_debug.launch_blocking():
        t.empty()
dt = time.perf_counter() - t0
gc.collect()
report(dict(growth_kb=rss_kb() - before, subscribes=core.stats()["subscribes"] - s0,
            active=core.stats()["active"], us_per_cycle=dt / 10000 * 1e6))
""", timeout=300)
    r = c.result
    assert r is not None, c
    assert r["active"] == 0
    assert r["subscribes"] == 10000
    assert r["growth_kb"] < 4096, r
    print("scope enter+exit with one launch: %.1f us" % r["us_per_cycle"])


# -- PyTorch -------------------------------------------------------------------

TORCH = CATCH + """
import torch
try:
    import torch.nn.functional as F
except ImportError:
    pass
"""


def _torch():
    pytest.importorskip("torch")


def test_torch_cross_entropy_assert(child):
    _torch()
    c = child(TORCH + """
logits = torch.randn(8, 5, device="cuda")
target = torch.tensor([0, 1, 2, 7, 4, 0, 1, 2], device="cuda")   # 7 >= 5 classes
torch.cuda.synchronize()
try:
    with cuda_debug.launch_blocking():
        loss = F.cross_entropy(logits, target)  # LAUNCH
        loss.item()
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    _check_common(r, c, "DeviceAssertError", 710)
    assert "nll_loss" in r["kernel"], r
    assert "Assertion" in (r["device_message"] or ""), r
    assert r["cause"] in ("AcceleratorError", "RuntimeError"), r
    assert "Assertion" in r["text"] and "restart" in r["text"]


def test_torch_index_out_of_bounds(child):
    _torch()
    c = child(TORCH + """
x = torch.randn(100, device="cuda")
idx = torch.tensor([1, 2, 500], device="cuda")
torch.cuda.synchronize()
try:
    with cuda_debug.launch_blocking():
        y = x[idx]  # LAUNCH
        z = y * 2
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    _check_common(r, c, "DeviceAssertError", 710)
    assert "index" in r["kernel"].lower(), r
    assert "out of bounds" in (r["device_message"] or "") or "Assertion" in (r["device_message"] or "")


def test_torch_backward_runs_blocking_on_autograd_threads(child):
    _torch()
    c = child("""
import torch, cuda_debug, cuda_debug._core as core
m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)).cuda()
x = torch.randn(32, 64, device="cuda")
m(x).sum().backward(); torch.cuda.synchronize()
with cuda_debug.launch_blocking():
    loss = m(x).sum()
    s0 = core.stats()["synced"]
    loss.backward()
    s1 = core.stats()["synced"]
report(dict(backward_synced=s1 - s0))
""")
    assert c.result["backward_synced"] > 0, c


def test_cuda_graph_captured_in_scope_stays_valid(child):
    _torch()
    c = child("""
import torch, cuda_debug, cuda_debug._core as core
x = torch.zeros(1024, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        x.add_(1)                   # warm-up outside capture
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
x.zero_()
g = torch.cuda.CUDAGraph()
with cuda_debug.launch_blocking():
    skipped0 = core.stats()["skipped_capture"]
    with torch.cuda.graph(g):
        x.add_(1)
        x.mul_(2)
    skipped = core.stats()["skipped_capture"] - skipped0
    synced0 = core.stats()["synced"]
    for _ in range(3):
        g.replay()
    replays_synced = core.stats()["synced"] - synced0
torch.cuda.synchronize()
report(dict(value=x[0].item(), skipped=skipped, replays_synced=replays_synced))
""")
    r = c.result
    assert r is not None, c
    # x: 0 -> replay 3 times of (x+1)*2: 2, 6, 14
    assert r["value"] == 14.0, r
    assert r["skipped"] >= 2, r
    assert r["replays_synced"] >= 3, r


def test_scope_inside_a_capture_and_a_side_stream_joining_it(child):
    """A capture begun before any scope (we were not subscribed), and a side
    stream that was used (so known not capturing) joining a later capture
    through an event wait: neither may be synchronised, both graphs replay."""
    _torch()
    c = child("""
import torch, cuda_debug, cuda_debug._core as core
x = torch.zeros(1024, device="cuda"); y = torch.zeros(1024, device="cuda")
side = torch.cuda.Stream()
for _ in range(2):
    x.add_(1)
    with torch.cuda.stream(side):
        y.add_(1)
torch.cuda.synchronize(); x.zero_(); y.zero_(); torch.cuda.synchronize()
g1 = torch.cuda.CUDAGraph()
with torch.cuda.graph(g1):
    with cuda_debug.launch_blocking():
        x.add_(1)
g2 = torch.cuda.CUDAGraph()
with cuda_debug.launch_blocking():
    with torch.cuda.stream(side):
        y.add_(1)                       # side is now known "not capturing"
    torch.cuda.synchronize()
    with torch.cuda.graph(g2):
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            y.mul_(3)                   # side joined the capture
        torch.cuda.current_stream().wait_stream(side)
g1.replay(); g2.replay(); torch.cuda.synchronize()
report(dict(x=x[0].item(), y=y[0].item()))
""")
    assert c.result == {"x": 1.0, "y": 3.0}, c


def test_profiler_conflict_both_orders(child):
    _torch()
    c = child("""
import torch, cuda_debug
from torch.profiler import profile, ProfilerActivity
x = torch.randn(256, 256, device="cuda")
torch.cuda.synchronize()
out = {}
# Order 1: our scope first, then the profiler, once the scope has exited.
with cuda_debug.launch_blocking():
    (x @ x).sum().item()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    (x @ x).sum().item()
    torch.cuda.synchronize()
out["gpu_events_after_scope"] = sum(1 for e in prof.events()
                                    if e.device_type == torch.autograd.DeviceType.CUDA)
# Order 2: the profiler holds CUPTI, then a scope is entered: with PyTorch
# imported it falls back to the dispatch level (tests/report/test_torch_ops.py
# has its faults), warning once; ToolConflictError is for code without torch.
import warnings
with profile(activities=[ProfilerActivity.CUDA]):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with cuda_debug.launch_blocking():
                out["blocking"] = cuda_debug.is_launch_blocking()
                with cuda_debug.launch_blocking(False):
                    out["opted_out"] = cuda_debug.is_launch_blocking()
            out["conflict"] = None
        except cuda_debug.ToolConflictError as e:
            out["conflict"] = str(e)
    out["warnings"] = [str(w.message) for w in caught if "cuda_debug" in str(w.message)]
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["gpu_events_after_scope"] > 0, r
    assert r["conflict"] is None, r
    assert r["blocking"] is True and r["opted_out"] is False, r
    assert len(r["warnings"]) == 1 and "CUPTI" in r["warnings"][0], r


# -- CuPy and Triton -----------------------------------------------------------

def test_cupy_raw_kernel_assert_and_illegal_address(child):
    pytest.importorskip("cupy")
    c = child(CATCH + """
import cupy as cp
# NVRTC has no <assert.h>: call the device runtime's __assertfail, as assert() does.
k = cp.RawKernel(r'''
extern "C" __device__ void __assertfail(const char *, const char *, unsigned int,
                                        const char *, unsigned long);
extern "C" __global__ void cupy_checks(const int* x, int n) {
    int i = threadIdx.x;
    if (i < n && !(x[i] < 10))
        __assertfail("x[i] < 10", "cupy_checks.cu", 6, "cupy_checks", 1);
}''', "cupy_checks")
x = cp.arange(32, dtype=cp.int32)
cp.cuda.Device().synchronize()
try:
    with cuda_debug.launch_blocking():
        k((1,), (32,), (x, cp.int32(32)))  # LAUNCH
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    _check_common(r, c, "DeviceAssertError", 710)
    assert r["kernel"] == "cupy_checks"
    assert "Assertion" in (r["device_message"] or ""), r
    assert r["cause"] is not None


def test_triton_kernel_illegal_address(child):
    pytest.importorskip("triton")
    pytest.importorskip("torch")
    c = child(CATCH + """
import torch, triton, triton.language as tl

@triton.jit
def wild_store(ptr, far, BLOCK: tl.constexpr):
    tl.store(ptr + far + tl.arange(0, BLOCK), 1.0)

x = torch.zeros(16, device="cuda")
torch.cuda.synchronize()
try:
    with cuda_debug.launch_blocking():
        wild_store[(1,)](x, 1 << 40, BLOCK=16)  # LAUNCH
except cuda_debug.CudaError as e:
    report(describe(e))
""", timeout=240)
    r = c.result
    _check_common(r, c, "IllegalAddressError", 700)
    assert "wild_store" in r["kernel"], r
