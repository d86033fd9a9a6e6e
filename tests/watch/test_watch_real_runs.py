"""The always-on watch() over a real run, against the fake CUDA driver:
Its GPU tests are at the end of this module.

- of two kernels that fit a generic assert line (a lambda's operator()), the
  one whose name holds the words of the assert's source file and message;
- a fault the device does not name leads with the user's (JIT) kernel, and
  a user kernel's launches are bracketed by markers (named exactly);
- a device text that rules out every recorded launch names its kernel as
  not recorded, and why (a profiler held CUPTI from a line);
- a watch() opened while another client holds CUPTI records the runtime's
  launches, and takes CUPTI at its next entry;
- CUDA_DEBUG_LAUNCH_HOOKS is read by one parser; a forked child's launches
  leave the hooks alone.
"""
from helpers.snippets import RT
import pytest
from conftest import Live, needs

L = "1, 1, 1, 32, 1, 1"
# two kernels holding closure types (lambdas), as PyTorch's gather and sum are
GATHER = b"_ZN2at6native34_scatter_gather_elementwise_kernelIZNS0_6gatherEUliE_EEvv"
REDUCE = b"_ZN2at6native13reduce_kernelIZNS0_3sumEUlffE_EEvv"


def test_an_assert_two_lambdas_fit_is_named_by_its_file_and_message(fake_child):
    """ScatterGatherKernel.cu's `operator()` assert, "scatter gather kernel
    index out of bounds": the reduction (launched first) and the gather both
    hold lambdas; the gather's name holds "scatter" and "gather". Exact, in the
    exception and the fd-2 block (launch order alone named the reduction)."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        t.empty()
        G, R = %r, %r
        out = {}
        try:
            with cuda_debug.watch():
                for _ in range(2):                 # past the kernels' first launches
                    fake.fake_launch(R, 0, %s)
                    fake.fake_launch(G, 0, %s)
                cuda_debug.check()
                fake.fake_set_kernel(G, 710, 1,
                                     b'idx < size && "scatter gather kernel index out of bounds"', -1, 0)
                fake.fake_set_assert_site(G, b"/pytorch/aten/src/ATen/native/cuda/ScatterGatherKernel.cu",
                                          163, b"operator()")
                fake.fake_launch(R, 0, %s)
                fake.fake_launch(G, 0, %s)  # CULPRIT
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out = dict(kernel=e.kernel, exact=e.exact, lineno=e.lineno, named=e.named_by_device)
        report(out)
    ''' % (GATHER, REDUCE, L, L, L, L))
    r = c.result
    assert r is not None, c
    assert "scatter_gather" in r["kernel"] and r["exact"] is True and r["named"] is True, r
    assert r["lineno"] == c.line_of("# CULPRIT"), r
    block = c.stderr[c.stderr.index("cuda_debug (watch): device-side assert"):]
    culprit = [line for line in block.splitlines() if line.startswith("  culprit: ")]
    assert len(culprit) == 1 and "scatter_gather" in culprit[0] and "(launch #6," in culprit[0], block


def test_a_fault_without_text_leads_with_the_users_kernel_which_is_bracketed(fake_child):
    """PyTorch-named launches, then a user's (plain-named) kernel with an
    illegal address, then more: the user's kernel got a marker before and
    after it, so it is named exactly; no text needed."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        t.empty()
        fake.fake_set_kernel(b"wild_store", 700, 0, None, 0, 0)
        out = {}
        try:
            with cuda_debug.watch():
                for _ in range(3):
                    fake.fake_launch(at("mul"), 0, %s)
                cuda_debug.check()
                s = _core.stats()
                fake.fake_launch(at("mul"), 0, %s)
                fake.fake_launch(b"wild_store", 0, %s)  # CULPRIT
                out["marked"] = _core.stats()["marked"] - s["marked"]
                out["closed"] = _core.stats()["closed"] - s["closed"]
                fake.fake_launch(at("add"), 0, %s)
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out.update(kernel=e.kernel, exact=e.exact, lineno=e.lineno)
        report(out)
    ''' % (L, L, L, L))
    r = c.result
    assert r is not None, c
    assert (r["kernel"], r["exact"], r["lineno"]) == ("wild_store", True, c.line_of("# CULPRIT")), r
    assert r["marked"] == 1 and r["closed"] == 1, r     # its own marker, and one behind mul


def test_pytorchs_kernels_alone_stay_in_launch_order_and_none_is_named_as_fact(fake_child):
    """A fault without text among three of PyTorch's kernels in one window:
    the candidates in launch order (nothing moved), and, since several kernels
    may be the culprit, .kernel is None and .likely_kernel the first."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        t.empty()
        out = {}
        try:
            with cuda_debug.watch():
                for _ in range(2):
                    for k in (at("a"), at("b"), at("c")):
                        fake.fake_launch(k, 0, %s)
                cuda_debug.check()
                fake.fake_set_kernel(at("b"), 700, 0, None, 0, 0)
                fake.fake_launch(at("a"), 0, %s)
                fake.fake_launch(at("b"), 0, %s)   # the culprit, PyTorch's
                fake.fake_launch(at("c"), 0, %s)
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out.update(kernel=e.kernel, likely=e.likely_kernel, exact=e.exact,
                       cands=[c["short"] for c in e.candidates], first=e.likeliest_first)
        report(out)
    ''' % (L, L, L, L))
    r = c.result
    assert r is not None, c
    # three PyTorch kernels: launch order, nothing moved
    assert (r["kernel"], r["likely"], r["cands"], r["first"]) == \
        (None, "at::native::a()", ["b", "c"], None), r


def test_the_order_of_the_likeliest_and_the_origin_of_kernel_names(fake_child):
    """The order rule (the C core's cd_origin_rank: user and JIT kernels, then
    generated ones, then PyTorch's and the vendors'; launch order within each)
    and where a name puts a kernel: a plain name is a user's (Triton's @jit,
    CuPy's RawKernel, the driver's callers); Inductor's and CuPy's own are
    generated; at:: is PyTorch's; cuBLAS's and NCCL's are a vendor's; another
    C++ name is unknown by its name alone (the launch hooks tell by its caller)."""
    c = fake_child('''
        from cuda_debug import _core, _report
        cands = [dict(seq=1, origin=_core.ORIGIN_FRAMEWORK), dict(seq=2, origin=_core.ORIGIN_VENDOR),
                 dict(seq=3, origin=_core.ORIGIN_USER), dict(seq=4, origin=_core.ORIGIN_GENERATED)]
        v = _report.decide(cands, "")
        report(dict(order=[c["seq"] for c in v.candidates], moved=v.reordered,
                    origins=[_core.kernel_origin(n) for n in (
                        b"wild_store", b"triton_poi_fused_add_0", b"cupy_multiply",
                        b"_ZN2at6native29vectorized_elementwise_kernelEv",
                        b"sm90_xmma_gemm_f16", b"_Z10my_ext_kerPf", b"ncclDevKernel_AllReduce")]))
    ''')
    r = c.result
    assert r is not None, c
    assert r["order"] == [3, 4, 1, 2] and r["moved"] is True, r
    assert r["origins"] == [1, 2, 2, 3, 4, 0, 4], r


def test_a_text_that_rules_out_every_recorded_launch_names_its_kernel_unrecorded(fake_child):
    """A profiler holds CUPTI (the hand-over at a line); a driver-API kernel
    launched meanwhile is not recorded; it asserts, its text naming it: the
    report names it, says its launch was not recorded because a profiler held
    CUPTI from that line, and lists the recorded launches as ruled out."""
    c = fake_child(RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _dispatch_fallback
t.empty()
fake.fake_set_kernel(b"checked_gather", 710, 1, b"i < n", -1, 0)
out = {}
try:
    with cuda_debug.watch():
        rt.fake_rt_launch(b"k", 0, 3)
        _dispatch_fallback.hand_over()                   # WINDOW
        fake.fake_hold_cupti(b"Kineto")
        rt.fake_rt_launch(b"k", 0, 3)                    # recorded by the hooks
        fake.fake_launch(b"checked_gather", 0, 1, 1, 1, 32, 1, 1)   # not recorded
        rt.fake_rt_launch(b"k", 0, 3)
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out = dict(kernel=e.kernel, exact=e.exact, why=e.not_recorded, ruled_out=len(e.ruled_out or ()),
               text=str(e))
report(out)
''')
    r = c.result
    assert r is not None, c
    assert (r["kernel"], r["exact"]) == ("checked_gather", False), r
    assert r["ruled_out"] >= 1, r
    why = " ".join(r["why"])
    assert "a profiler held CUPTI from %s:%d" % (c.script, c.line_of("# WINDOW")) in why, r
    assert "(the device's assert text names it; its launch was not recorded)" in r["text"], r
    block = c.stderr[c.stderr.index("cuda_debug (watch): device-side assert"):]
    assert "  culprit: checked_gather (named by the device's assert text; its launch was not " \
           "recorded)" in block, block
    assert "    not recorded: a profiler held CUPTI from %s:%d" % (
        c.script, c.line_of("# WINDOW")) in block, block


def test_a_watch_opened_while_another_tool_holds_cupti_records_and_takes_it_later(fake_child):
    c = fake_child(RT + '''
import warnings
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
fake.fake_hold_cupti(b"Kineto")
out = {}
with warnings.catch_warnings(record=True) as w:
    warnings.simplefilter("always")
    with cuda_debug.watch():                                  # OPENED
        s = _core.stats()
        out.update(subscribed=s["subscribed"], recording=s["launch_hooks"]["recording"],
                   gap_open=s["coverage_gap_open"])
        rt.fake_rt_launch(b"k", 0, 5)
        out["watched"] = _core.stats()["watched"]
        fake.fake_hold_cupti(None)                            # the tool let go
        with cuda_debug.watch():                              # AGAIN
            s = _core.stats()
            out.update(again=s["subscribed"], recording_again=s["launch_hooks"]["recording"],
                       gap_again=s["coverage_gap_open"])
    out["warned"] = [str(x.message)[:120] for x in w if "holds CUPTI" in str(x.message)]
    out["gaps"] = [(g[1], g[4], g[5], g[7]) for g in _core.coverage_gaps()]
report(out)
''')
    r = c.result
    assert r is not None, c
    assert (r["subscribed"], r["recording"], r["gap_open"]) == (False, 1, 1), r
    assert r["watched"] == 5, r
    assert (r["again"], r["recording_again"], r["gap_again"]) == (True, 0, 0), r
    assert len(r["warned"]) == 1 and "watch() opened at %s:%d" % (
        c.script, c.line_of("# OPENED")) in r["warned"][0], r
    (why, frm, to, closed), = r["gaps"]
    assert why == 2 and closed == 1 and frm.endswith(":%d" % c.line_of("# OPENED")), r
    assert to.endswith(":%d" % c.line_of("# AGAIN")), r


def test_the_launch_hooks_switch_is_read_by_one_parser(fake_child):
    """' 0', 'off ', 'No\\n': Python's reading (strip, lower) turns the hooks off;
    the C core no longer parses the variable itself."""
    code = RT + '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
with cuda_debug.watch():
    h = _core.stats()["launch_hooks"]
report(dict(on=h["on"], why=h["why_off"]))
'''
    for value, on in ((" 0", 0), ("off ", 0), ("No\n", 0), ("1", 1), (" yes ", 1)):
        r = fake_child(code, env={"CUDA_DEBUG_LAUNCH_HOOKS": value}).result
        assert r is not None and r["on"] == on, (value, r)
        if not on:
            assert r["why"] == "CUDA_DEBUG_LAUNCH_HOOKS=0", (value, r)


def test_a_forked_child_launches_the_runtimes_way_and_touches_no_subscription(fake_child):
    """A fork while the hooks are on: the child's launches go to the runtime's
    own function (its copy of the entries still points at cuda_debug), nothing
    is recorded there, and the parent's hooks and CUPTI are untouched."""
    c = fake_child(RT + '''
import os, json
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
with cuda_debug.watch():
    rt.fake_rt_launch(b"k", 0, 2)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        before = cudart.fake_runtime_calls()
        rt.fake_rt_launch(b"k", 0, 4)
        h = _core.stats()["launch_hooks"]
        os.write(w, json.dumps([cudart.fake_runtime_calls() - before, h["on"]]).encode())
        os._exit(0)
    os.close(w)
    child = json.loads(os.read(r, 200))
    os.waitpid(pid, 0)
    rt.fake_rt_launch(b"k", 0, 2)
    parent = [_core.stats()["launch_hooks"]["on"], _core.stats()["watched"], _core.stats()["subscribed"]]
report(dict(child=child, parent=parent))
''')
    r = c.result
    assert r is not None, c
    assert r["child"] == [4, 0], r
    assert r["parent"] == [1, 4, True], r


def test_the_hand_over_waits_for_a_thread_inside_the_callback(fake_child):
    """A profiler finalizes CUPTI when it ends: a thread still inside our
    callback then (a launch_blocking() thread waiting 0.6 s for its kernel)
    would return into a CUPTI that is gone (the SIGSEGV seen once in
    test_hand_over_while_another_thread_launches_in_its_scope). The hand-over
    waits for it (base/subscription.c drain_callbacks): when it returns, no
    thread is inside, and it took about the kernel's remaining time."""
    c = fake_child('''
        import threading, time
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core, _dispatch_fallback
        t.empty()
        fake.fake_set_kernel(b"slow", 0, -1, None, -1, 600000)
        inside = threading.Event()
        def blocking():
            with cuda_debug.launch_blocking():
                inside.set()
                fake.fake_launch(b"slow", 0, %s)        # waits for it in the callback
        with cuda_debug.watch():
            th = threading.Thread(target=blocking)
            th.start()
            inside.wait()
            time.sleep(0.15)
            in_before = _core.stats()["in_callback"]
            t0 = time.monotonic()
            had = _dispatch_fallback.hand_over()
            took = time.monotonic() - t0
            in_after = _core.stats()["in_callback"]
            th.join()
            busy = _core.stats()["hand_overs_busy"]
        report(dict(had=had, in_before=in_before, in_after=in_after, took=took, busy=busy))
    ''' % L)
    r = c.result
    assert r is not None, c
    assert r["had"] is True and r["in_before"] == 1, r
    assert r["in_after"] == 0 and r["busy"] == 0, r
    assert 0.2 < r["took"] < 5.0, r


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# The always-on watch() over a real run, on a real GPU (SPEC section 15):
# profiler windows are gaps in its coverage, not its end; a hang names its stuck
# kernel first; of two kernels that fit an assert, the device's words pick; a
# fault without text leads with the user's kernel; a kernel the device's text
# names but the watch did not record is named as such, with why.
#
# Each program runs in its own Python (a sticky fault kills its CUDA context) and
# reports what it caught as JSON. All of them run the DEFAULT watch() (sparse
# markers), as users leave it on.
# ======================================================================================


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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
@pytest.mark.slow
def test_a_short_soak_names_the_fault_at_its_end():
    """benchmarks/soak.py for half a minute: a training loop with a DataLoader,
    profiler windows, graph captures and threads under one watch(), beside the
    same loop unwatched; the fault at its end is named exactly, at its line."""
    needs("torch")
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p = subprocess.run([sys.executable, os.path.join(root, "benchmarks", "soak.py"),
                        "--minutes", "0.5"], capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    last = p.stdout.strip().splitlines()[-1]
    assert "the fault named exactly at its line" in last, p.stdout
    assert "profiler windows" in last and " 0 profiler windows" not in last, p.stdout
