"""The always-on watch() over a real run, against the fake CUDA driver:
CPU only. Its GPU twin is tests/test_always_right_gpu.py.

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
