"""The runtime's launches seen past CUPTI while watching (csrc/hooks/runtime_launch.c),
against the fake CUDA driver.

fake_cuda/fake_rt_user.c launches the way nvcc's stubs do (libtorch_cuda.so):
each launch a call of the runtime's __cudaLaunchKernel through the library's GOT.
While a watch() is open those GOT entries point at cuda_debug's function, which
launches with cuLaunchKernelEx_ptsz (CUPTI's callback for it off meanwhile) and
records the launch as the callback would. A blocking thread's launches, and
every launch once the watch closes, go to the runtime's own function again.

On a real GPU: the tests at the end of this module (marked gpu).
"""
import os

import pytest

from helpers.snippets import RT
from conftest import needs


def test_watched_runtime_launches_bypass_cupti_and_are_recorded(fake_child):
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
out = {}
rt.fake_rt_launch(b"k", 0, 5)                      # before: the runtime's own function
out["before"] = cudart.fake_runtime_calls()
out["hooks_before"] = _core.stats()["launch_hooks"]["on"]
with cuda_debug.watch():
    s0, f0 = _core.stats(), fake_stats()
    rt.fake_rt_launch(b"k", 0, 100)
    s1, f1 = _core.stats(), fake_stats()
    out["hooks"] = s1["launch_hooks"]
    out["watched"] = s1["watched"] - s0["watched"]
    out["callbacks"] = f1["callbacks"] - f0["callbacks"]
    out["kernels"] = f1["launch_calls"] - f0["launch_calls"]
    out["runtime_in_watch"] = cudart.fake_runtime_calls() - out["before"]
    with cuda_debug.launch_blocking():             # a blocking thread: the runtime's path
        rt.fake_rt_launch(b"k", 0, 3)
    out["runtime_blocking"] = cudart.fake_runtime_calls() - out["before"]
    out["synced"] = _core.stats()["synced"] - s1["synced"]
after = _core.stats()["launch_hooks"]
out["after_on"], out["after_entries"] = after["on"], after["entries"]
rt.fake_rt_launch(b"k", 0, 2)
out["runtime_after"] = cudart.fake_runtime_calls() - out["before"]
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["before"] == 5 and r["hooks_before"] == 0, r
    h = r["hooks"]
    assert h["on"] == 1 and h["entries"] >= 1 and h["routed"] == 100, h
    assert r["watched"] == 100 and r["kernels"] >= 100, r
    # CUPTI dispatched none of the 100 launches (2 callbacks each when it does):
    # only the markers' writes and the like, far fewer.
    assert r["callbacks"] < 40, r
    assert r["runtime_in_watch"] == 0, r
    assert r["runtime_blocking"] == 3 and r["synced"] == 3, r
    assert (r["after_on"], r["after_entries"]) == (0, 0), r
    assert r["runtime_after"] == 5, r


def test_a_fault_in_a_routed_launch_is_named_with_its_line(fake_child):
    """A device assert in the 30th of 40 routed launches: the culprit is the kernel
    the assert names, launched from the script's line."""
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
t.empty()
fake.fake_set_kernel(b"bad_k", 710, -1, b"idx < n", -1, 0)
out = {}
try:
    with cuda_debug.watch():
        for i in range(40):
            rt.fake_rt_launch(b"bad_k" if i == 29 else b"ok_k", 0, 1)  # LAUNCH
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out = dict(kernel=e.kernel, exact=e.exact, line=e.lineno, text=str(e))
out["routed"] = cuda_debug._core.stats()["launch_hooks"]["routed"]
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r.get("kernel") == "bad_k" and r["exact"] is True, r
    launch_line = c.line_of("# LAUNCH")
    assert r["line"] == launch_line, (r, launch_line)
    assert r["routed"] >= 30, r


def test_off_by_environment_and_the_runtime_path_still_records(fake_child):
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
with cuda_debug.watch():
    s0 = _core.stats()
    rt.fake_rt_launch(b"k", 0, 50)
    s1 = _core.stats()
report(dict(hooks=s1["launch_hooks"], watched=s1["watched"] - s0["watched"],
            runtime=cudart.fake_runtime_calls()))
''', env={"CUDA_DEBUG_LAUNCH_HOOKS": "0"})
    r = c.result
    assert r is not None, c
    assert r["hooks"]["on"] == 0 and r["hooks"]["why_off"] == "CUDA_DEBUG_LAUNCH_HOOKS=0", r
    assert r["watched"] == 50 and r["runtime"] == 50, r


def test_a_library_loaded_while_watching_is_taken_at_the_next_watch(fake_child):
    """Loaded after the watch opened, its launches still reach CUPTI (recorded);
    the next watch entry points its GOT at the hook too."""
    c = fake_child('''
import ctypes, os
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
out = {}
with cuda_debug.watch():
    out["first"] = _core.stats()["launch_hooks"]["why_off"]
    rt = ctypes.CDLL(os.path.join(FAKE_DIR, "libfake_rt_user.so"))
    rt.fake_rt_launch.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long]
    s0 = _core.stats()
    rt.fake_rt_launch(b"k", 0, 20)
    s1 = _core.stats()
    out["watched"] = s1["watched"] - s0["watched"]
    out["routed"] = s1["launch_hooks"]["routed"]
    with cuda_debug.watch():
        rt.fake_rt_launch(b"k", 0, 20)
        out["routed2"] = _core.stats()["launch_hooks"]["routed"]
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["first"] == "no library imports __cudaLaunchKernel", r
    assert r["watched"] == 20 and r["routed"] == 0, r
    assert r["routed2"] == 20, r


def test_the_exact_mode_launches_the_runtime_way(fake_child):
    """watch(exact=True) puts a marker behind every launch: its launches go to the
    runtime's function (CUPTI's callback writes the marker inside the launch's
    call), also when nested in an always-on watch, and are recorded."""
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
out = {}
with cuda_debug.watch():
    rt.fake_rt_launch(b"k", 0, 10)
    with cuda_debug.watch(exact=True):
        s0 = _core.stats()
        rt.fake_rt_launch(b"k", 0, 10)
        s1 = _core.stats()
    rt.fake_rt_launch(b"k", 0, 10)
    s2 = _core.stats()
out = dict(routed_exact=s1["launch_hooks"]["routed"] - s0["launch_hooks"]["routed"],
           marked_exact=s1["marked"] - s0["marked"], watched_exact=s1["watched"] - s0["watched"],
           routed_total=s2["launch_hooks"]["routed"], runtime=cudart.fake_runtime_calls())
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["routed_exact"] == 0 and r["watched_exact"] == 10 and r["marked_exact"] == 10, r
    assert r["routed_total"] == 20 and r["runtime"] == 10, r


def test_a_watch_entered_again_and_again_takes_the_same_entries(fake_child):
    """A watch() per step: each entry points the entries found by the first walk at
    the hook again (nothing was loaded since), each exit writes them back."""
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
seen = []
for step in range(5):
    with cuda_debug.watch():
        rt.fake_rt_launch(b"k", 0, 10)
        h = _core.stats()["launch_hooks"]
        seen.append((h["on"], h["entries"], h["routed"]))
    seen.append(tuple(_core.stats()["launch_hooks"][k] for k in ("on", "entries", "routed")))
report(dict(seen=seen, runtime=cudart.fake_runtime_calls(),
            asked=_core.stats()["launch_hooks"]["asked"]))
''')
    r = c.result
    assert r is not None, c
    # each entry is a new subscription (a new epoch): the kernel is asked for
    # once per watch, not at every launch of it
    assert r["asked"] == 5, r
    entries = r["seen"][0][1]
    assert entries >= 1, r
    want = []
    for step in range(5):
        want += [[1, entries, 10 * (step + 1)], [0, 0, 10 * (step + 1)]]
    assert r["seen"] == want and r["runtime"] == 0, r


def test_a_profiler_window_keeps_the_runtime_launches_recorded_and_coverage_comes_back(fake_child):
    """The hand-over (a profiler starting while watching): the hooks go to their
    record mode (the runtime's own function launches, where a profiler sees it,
    and the launch is recorded after it returned), CUPTI is given up and a
    coverage gap opens at the profiler's line. When the profiler stops
    (here: the fake's other holder lets go) CUPTI is taken back, the hooks route
    past it again, the gap closes: no launch recorded twice, none lost."""
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core, _dispatch_fallback
t.empty()
def hooks():
    h = _core.stats()["launch_hooks"]
    return [h["on"], h["recording"], h["entries"] > 0, cudart.fake_runtime_calls()]
with cuda_debug.watch():
    rt.fake_rt_launch(b"k", 0, 10)
    before = hooks()
    w0 = _core.stats()["watched"]
    had = _dispatch_fallback.hand_over()                         # PROFILER STARTS
    fake.fake_hold_cupti(b"Kineto")                              # the profiler subscribes
    rt.fake_rt_launch(b"k", 0, 10)
    during = hooks() + [_core.stats()["watched"] - w0, _core.stats()["subscribed"]]
    refused = _dispatch_fallback.take_back()                     # still held: refused
    fake.fake_hold_cupti(None)                                   # the profiler lets go
    back = _dispatch_fallback.take_back()                        # PROFILER STOPS
    rt.fake_rt_launch(b"k", 0, 10)
    after = hooks() + [_core.stats()["watched"] - w0, _core.stats()["subscribed"]]
    gaps = [(g[1], g[2], g[3], g[4], g[5], g[6], g[7]) for g in _core.coverage_gaps()]
report(dict(before=before, had=had, during=during, refused=refused, back=back, after=after,
            gaps=gaps))
''')
    r = c.result
    assert r is not None, c
    assert r["before"] == [1, 0, True, 0] and r["had"] is True, r
    # record mode: the runtime's own function launched all 10, each recorded once
    assert r["during"] == [1, 1, True, 10, 10, 0], r
    assert r["refused"] == -39 and r["back"] == 1, r
    # routed again: the runtime's function not called, 10 more recorded
    assert r["after"] == [1, 0, True, 10, 20, 1], r
    (why, frm, to, frm_where, to_where, recording, closed), = r["gaps"]
    assert (why, frm, to, recording, closed) == (1, 11, 20, 1, 1), r
    assert frm_where == "%s:%d" % (c.script, c.line_of("# PROFILER STARTS")), r
    assert to_where == "%s:%d" % (c.script, c.line_of("# PROFILER STOPS")), r



def test_an_nccl_kernel_launched_through_the_hooks_is_bracketed(fake_child):
    """A kernel that gets a marker of its own with sparse markers (an NCCL
    kernel) gets one behind its stream's newest launch first, whichever path
    launched it: the launch hooks share the pipeline's entry with CUPTI's
    callback (hooks/launch_callback.c cd_launch_entering). Before, the hooks
    bracketed only an extension's kernels: a rank stuck in a collective that
    PyTorch launched through them was placed among the launches before it."""
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
out = {}
with cuda_debug.watch():
    rt.fake_rt_launch(at("gather"), 0, 10)          # first 2 marked, then unmarked
    s0 = _core.stats()
    rt.fake_rt_launch(b"ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 1)
    s1 = _core.stats()
    out["closed"] = s1["closed"] - s0["closed"]
    out["marked"] = s1["marked"] - s0["marked"]
    out["routed"] = s1["launch_hooks"]["routed"]
    rt.fake_rt_launch(at("gather"), 0, 1)           # the one after it: no bracket
    out["closed_after"] = _core.stats()["closed"] - s1["closed"]
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["routed"] == 11, r                      # both went through the hooks
    assert r["closed"] == 1, r                       # the bracket behind the 10th gather
    assert r["marked"] == 1, r                       # and the NCCL kernel's own marker
    assert r["closed_after"] == 0, r


@pytest.fixture(scope="module")
def two_runtimes(fake_cuda_dir, tmp_path_factory):
    """Two copies of the runtime, each its soname and its symbols' version as
    the real ones have them (``__cudaLaunchKernel@@libcudart.so.12``: an
    import binds to its own runtime's, whatever is loaded first): an extension
    bound to the "12" one, PyTorch's library (in a torch/lib/ folder) bound to
    the "13" one."""
    import subprocess
    from fake_cuda import HERE, LIBCUDA, LIBRTUSER, cflags, compiler
    work = tmp_path_factory.mktemp("two_runtimes")
    (work / "torch" / "lib").mkdir(parents=True)
    cc, flags = compiler(), cflags() + ["-shared"]
    libcuda = os.path.join(fake_cuda_dir, LIBCUDA)
    out = {}
    for v in ("12", "13"):
        name = "libfake_cudart.so." + v
        script = work / (name + ".map")
        script.write_text("%s { global: *; };\n" % name)
        out["rt" + v] = str(work / name)
        out["user" + v] = str(work / ("libext12.so" if v == "12" else "torch/lib/" + LIBRTUSER))
        for cmd in ([cc] + flags + ["-Wl,-soname," + name, "-Wl,--version-script=%s" % script,
                                    "-o", out["rt" + v], os.path.join(HERE, "fake_cudart.c"),
                                    libcuda],
                    [cc] + flags + ["-o", out["user" + v], os.path.join(HERE, "fake_rt_user.c"),
                                    out["rt" + v], libcuda]):
            p = subprocess.run(cmd, capture_output=True, text=True)
            assert p.returncode == 0, p.stderr
    return out


def test_two_runtimes_only_pytorchs_is_routed_the_other_left_alone_and_named(fake_child,
                                                                             two_runtimes):
    """The extension bound to the other runtime is loaded first (the load
    order's pick before): PyTorch's library is still the one routed (the
    runtime its own libraries import), the extension's launches go to its own
    runtime, every one, and stats() names both runtimes. Every launch of both
    is recorded and computes as without the hooks."""
    c = fake_child('''
import ctypes, os, sys
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
RT13, RT12, EXT, FW = sys.argv[1:5]
rt13 = ctypes.CDLL(RT13, ctypes.RTLD_GLOBAL)   # PyTorch's, global (found first by an unversioned lookup)
rt12 = ctypes.CDLL(RT12)
ext = ctypes.CDLL(EXT)                          # before PyTorch's library in the loader's list
fw = ctypes.CDLL(FW)
for lib in (rt13, rt12):
    lib.fake_runtime_calls.restype = ctypes.c_long
for lib in (ext, fw):
    lib.fake_rt_launch.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long]
t.empty()
out = {}
with cuda_debug.watch():
    s0 = _core.stats()
    a13, a12 = rt13.fake_runtime_calls(), rt12.fake_runtime_calls()
    out["rc"] = [fw.fake_rt_launch(b"k", 0, 30), ext.fake_rt_launch(b"k", 0, 20)]
    s1 = _core.stats()
    out["hooks"] = s1["launch_hooks"]
    out["routed"] = s1["launch_hooks"]["routed"] - s0["launch_hooks"]["routed"]
    out["watched"] = s1["watched"] - s0["watched"]
    out["rt13_calls"] = rt13.fake_runtime_calls() - a13
    out["rt12_calls"] = rt12.fake_runtime_calls() - a12
report(out)
''', args=[two_runtimes[k] for k in ("rt13", "rt12", "user12", "user13")])
    r = c.result
    assert r is not None, c
    h = r["hooks"]
    assert r["rc"] == [0, 0], r
    # PyTorch's 30 routed, none through its runtime's own function
    assert h["on"] == 1 and h["entries"] >= 1 and r["routed"] == 30 and r["rt13_calls"] == 0, r
    # the extension's 20 went to its own runtime (CUPTI's callback recorded them)
    assert r["rt12_calls"] == 20 and r["watched"] == 50, r
    assert h["other_runtimes"] >= 1, h
    assert os.path.basename(h["runtime"]) == "libfake_cudart.so.13", h
    assert os.path.basename(h["other_runtime"]) == "libfake_cudart.so.12", h


def test_a_kernel_handle_the_driver_refuses_is_left_to_the_runtime_and_counted(fake_child):
    """A runtime whose kernel handles the driver does not take
    (cuKernelGetFunction refuses them): every launch goes the runtime's own way,
    where CUPTI's callback records it, and stats() says how many and the
    driver's answer (before, only "asked" grew, once a launch)."""
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
out = {}
fake.fake_refuse_kernel_handles(1)
with cuda_debug.watch():
    s0, n0 = _core.stats(), cudart.fake_runtime_calls()
    rt.fake_rt_launch(at("gather"), 0, 20)
    s1 = _core.stats()
    h = s1["launch_hooks"]
    out.update(routed=h["routed"], unresolved=h["unresolved"] - s0["launch_hooks"]["unresolved"],
               rc=h["unresolved_rc"], watched=s1["watched"] - s0["watched"],
               runtime=cudart.fake_runtime_calls() - n0, on=h["on"])
fake.fake_refuse_kernel_handles(0)
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["on"] == 1 and r["routed"] == 0, r
    assert r["unresolved"] == 20 and r["rc"] == 400, r     # CUDA_ERROR_INVALID_HANDLE
    assert r["runtime"] == 20 and r["watched"] == 20, r    # the runtime's way, recorded by CUPTI


def test_a_launch_through_the_hooks_names_its_stream_as_cuptis_callback_does(fake_child):
    """The legacy stream is one stream whichever path launched on it: the hooks
    launch with CU_STREAM_LEGACY (a _ptsz entry point's name for it), CUPTI's
    callback sees the runtime's 0; the pipeline reads both as NULL
    (cd_launch_stream). Two names would split one stream's launches in the
    stream table: its newest launch, its markers, a fault's candidates."""
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core, _report
t.empty()
with cuda_debug.watch():
    q0 = _core.watch_seq()
    rt.fake_rt_launch(at("gather"), 0, 3)             # the hooks, on the legacy stream
    fake.fake_launch(at("gather"), 0, 1, 1, 1, 32, 1, 1)   # CUPTI's callback, the same stream
    q1 = _core.watch_seq()
    recs = [_report.watch_record(q) for q in range(q0 + 1, q1 + 1)]
    routed = _core.stats()["launch_hooks"]["routed"]
report(dict(streams=[r.stream for r in recs if r is not None], routed=routed))
''')
    r = c.result
    assert r is not None, c
    assert r["routed"] == 3, r
    assert r["streams"] == [0, 0, 0, 0], r


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# The runtime launch hooks on a real GPU (csrc/hooks/runtime_launch.c).
#
# While a watch() is open, libtorch_cuda.so's calls of the runtime's
# __cudaLaunchKernel go to cuda_debug, which launches them with
# cuLaunchKernelEx_ptsz (CUPTI not dispatching it) and records them as the
# CUPTI callback would. These check that PyTorch's launches take that way,
# that the reports stay exact, and that what must still go through CUPTI does.
# ======================================================================================


CATCH = """
import cuda_debug
from cuda_debug import _core
def describe(e):
    return dict(cls=type(e).__name__, kernel=e.kernel, lineno=e.lineno, exact=e.exact,
                text=str(e))
"""


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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
