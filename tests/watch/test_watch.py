"""The always-on watch(), against the fake CUDA driver.

watch() puts a completion marker behind every K-th launch of a stream
(CUDA_DEBUG_WATCH_EVERY, default 16), behind a stream's newest launch when the
host waits for it (cuStreamSynchronize, cuCtxSynchronize, an event's
synchronisation, a synchronous copy), and behind every graph replay and NCCL
kernel (the NCCL kernel also after one put behind the stream's newest launch
first). A fault lies among the launches of its stream from the last marker
that came back to the first that did not: the culprit is exact when the
device's assert text names one of them, else the candidates (at most K) are
named, the likeliest first (user and JIT kernels before PyTorch's and the vendor
libraries' own), else in launch order. watch(exact=True) keeps a marker behind
every launch. A kernel's first launches (CD_EARLY_LAUNCHES) and every launch of
a user or JIT kernel (a plain, extern "C" name) get markers of their own: the
tests of the sparse markers launch kernels named as PyTorch's (``at(name)``).

On a real GPU: the tests at the end of this module (marked gpu).
"""
import pytest
from conftest import needs

L = "1, 1, 1, 32, 1, 1"


def test_a_marker_behind_every_kth_launch_and_behind_the_newest_at_a_wait(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        t.empty()
        out = {}
        with cuda_debug.watch():
            for _ in range(100):
                fake.fake_launch(at("k"), 0, %s)
            s = _core.stats()
            out["marked"], out["closed"], out["every"] = s["marked"], s["closed"], s["watch_every"]
            out["pending"] = [st[5] for st in _core.watch_streams(0)]
            cuda_debug.check()                     # a host wait: a marker behind launch 100
            s = _core.stats()
            out["closed_after"] = s["closed"]
            out["pending_after"] = _core.watch_streams(0)
            with cuda_debug.watch(exact=True):     # nested: a marker behind each launch
                for _ in range(10):
                    fake.fake_launch(at("k"), 0, %s)
                out["marked_exact"] = _core.stats()["marked"] - s["marked"]
                out["every_exact"] = _core.stats()["watch_every"]
            out["every_back"] = _core.stats()["watch_every"]
        report(out)
    ''' % (L, L))
    r = c.result
    assert r is not None, c
    # the kernel's first 2 launches, then every 16th since: 18, 34, ... 98
    assert (r["marked"], r["closed"], r["every"]) == (8, 0, 16), r
    assert r["pending"] == [1], r      # nothing ran yet (the fake runs work at a sync)
    assert r["closed_after"] == 1 and r["pending_after"] == [], r
    assert (r["marked_exact"], r["every_exact"], r["every_back"]) == (10, 1, 16), r


@pytest.mark.parametrize("every", [None, "4"])
def test_a_fault_the_device_does_not_name_gives_the_candidates_in_launch_order(fake_child,
                                                                              every):
    """An illegal address (no assert text) at launch 21 of 40 on one stream: the
    marker behind launch 16 came back, the one behind 32 did not: launches 17 to
    32 are the candidates (K=16), in launch order, each named; exact False. With
    K=4: launches 21 to 24."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        t.empty()                                  # the primary context: check() synchronises it
        fake.fake_set_kernel(at("bad_k"), 700, 0, None, 0, 0)
        names = [at("bad_k") if i == 20 else at("ok_%%d" %% i) for i in range(40)]
        out = {}
        try:
            with cuda_debug.watch():
                fake.fake_set_kernel(at("bad_k"), 0, 0, None, 0, 0)
                for _ in range(2):                 # past each kernel's first launches
                    for i in range(40):
                        fake.fake_launch(names[i], 0, %s)
                cuda_debug.check()
                fake.fake_set_kernel(at("bad_k"), 700, 0, None, 0, 0)
                for i in range(40):
                    fake.fake_launch(names[i], 0, %s)  # LAUNCH
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out = dict(kernel=e.kernel, likely=e.likely_kernel, exact=e.exact, lineno=e.lineno,
                       cands=[c["short"] for c in e.candidates], count=e.candidate_count,
                       every=e.markers_every, text=str(e))
        report(out)
    ''' % (L, L), env={"CUDA_DEBUG_WATCH_EVERY": every} if every else None)
    r = c.result
    assert r is not None, c
    if every is None:
        names = ["ok_%d" % i for i in range(16, 32)]
        names[4] = "bad_k"
        assert (r["count"], r["every"]) == (16, 16), r
    else:
        names = ["bad_k", "ok_21", "ok_22", "ok_23"]
        assert (r["count"], r["every"]) == (4, 4), r
    # several kernels may be the culprit: none is named as the fact, the first the likeliest
    assert r["kernel"] is None and r["likely"] == "at::native::%s()" % names[0], r
    assert r["cands"] == names[1:], r
    assert r["exact"] is False and r["lineno"] == c.line_of("# LAUNCH"), r
    assert "in one of %d launches, the likeliest %s" % (len(names), names[0]) in r["text"], r
    assert "one of %d launches not known to have finished" % len(names) in r["text"], r["text"]
    assert "or %s launched at %s:%d" % (names[1], c.script, c.line_of("# LAUNCH")) in r["text"]
    assert "watch(exact=True) names every launch" in r["text"], r["text"]
    # the fd-2 block, written at the fault: the same candidates
    block = c.stderr[c.stderr.index("cuda_debug (watch): illegal"):]
    assert "culprit: one of %d launches, in launch order" % len(names) in block, block
    assert "    %s (launch #" % names[0] in block and "    %s (launch #" % names[1] in block


def test_a_fault_the_device_names_is_exact_among_the_candidates(fake_child):
    """A device assert at launch 21 of 40: the assert text names bad_k, the only
    candidate of that name: exact, in the exception and in the fd-2 block."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        t.empty()                                  # the primary context: check() synchronises it
        fake.fake_set_kernel(at("bad_k"), 710, 1, b"idx < n", -1, 0)
        out = {}
        try:
            with cuda_debug.watch():
                for i in range(40):
                    if i == 20:
                        fake.fake_launch(at("bad_k"), 0, %s)  # CULPRIT
                    else:
                        fake.fake_launch(at("ok_k"), 0, %s)
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out = dict(kernel=e.kernel, exact=e.exact, lineno=e.lineno, cands=e.candidates,
                       named=e.named_by_device, text=str(e))
        report(out)
    ''' % (L, L))
    r = c.result
    assert r is not None, c
    assert (r["kernel"], r["exact"], r["cands"], r["named"]) == \
        ("at::native::bad_k()", True, [], True), r
    assert r["lineno"] == c.line_of("# CULPRIT"), r
    assert "not known to have finished" not in r["text"], r["text"]
    block = c.stderr[c.stderr.index("cuda_debug (watch): device-side assert"):]
    assert "  culprit: bad_k (launch #21," in block, block


def test_a_fault_named_in_a_kernel_launched_twice_in_the_window_stays_inexact(fake_child):
    """The named kernel twice among the candidates: both are the candidates,
    the first of them first; not exact (the device does not say which launch)."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        t.empty()                                  # the primary context: check() synchronises it
        fake.fake_set_kernel(at("bad_k"), 710, 1, b"idx < n", -1, 0)
        out = {}
        try:
            with cuda_debug.watch():
                for i in range(2):                 # past the kernels' first launches
                    fake.fake_launch(at("ok_k"), 0, %s)
                cuda_debug.check()
                fake.fake_set_kernel(at("bad_k"), 0, 0, None, -1, 0)
                for i in range(2):
                    fake.fake_launch(at("bad_k"), 0, %s)
                cuda_debug.check()
                fake.fake_set_kernel(at("bad_k"), 710, 1, b"idx < n", -1, 0)
                for i in range(8):
                    fake.fake_launch(at("bad_k") if i in (2, 5) else at("ok_k"), 0, %s)
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out = dict(kernel=e.kernel, exact=e.exact, cands=[c["seq"] for c in e.candidates],
                       count=e.candidate_count)
        report(out)
    ''' % (L, L, L))
    r = c.result
    assert r is not None, c
    # one kernel, two launches: the kernel is a fact, the launch is not
    assert (r["kernel"], r["exact"], r["cands"], r["count"]) == \
        ("at::native::bad_k()", False, [10], 2), r


def test_a_triton_assert_names_its_kernel_by_the_source_line(fake_child, tmp_path):
    """Triton prints `unknown` as the function: the asserting line of the
    kernel's source file names it (the function defined around that line)."""
    src = tmp_path / "ckernel.py"
    src.write_text("import triton\n\n@triton.jit\ndef triton_poi_fused_index_0(x):\n"
                   "    tl.device_assert(x < 10, 'index out of bounds')\n")
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        t.empty()
        fake.fake_set_kernel(b"triton_poi_fused_index_0", 710, 1, b"index out of bounds", -1, 0)
        fake.fake_set_assert_site(b"triton_poi_fused_index_0", %r, 5, b"unknown")
        out = {}
        try:
            with cuda_debug.watch():
                for i in range(6):
                    fake.fake_launch(b"triton_poi_fused_index_0" if i == 3 else b"ok_k", 0, %s)
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out = dict(kernel=e.kernel, exact=e.exact)
        report(out)
    ''' % (str(src).encode(), L))
    assert c.result == {"kernel": "triton_poi_fused_index_0", "exact": True}, c


def test_the_host_wait_brackets_a_hang_and_the_stuck_kernel_leads(fake_child):
    """Three quick launches and a spinning kernel, then the host waits: the
    spin's own marker (its kernel's first launch) does not come back, the
    empty kernel's first two did; the third empty launch and the spin are the
    candidates, and the report leads with the spin (a kernel never seen to
    finish) before the empty kernel (seen to finish twice); in_flight() too."""
    c = fake_child('''
        import threading, time, cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        seen = {}
        def look():
            time.sleep(1.6)
            r = cuda_debug.in_flight()
            seen.update(n=len(r), short=r[0].short if r else None,
                        cands=r[0].candidates if r else None)
        with cuda_debug.watch(hang_after=1):
            for _ in range(3):
                t.empty()
            t.spin(2.5)                            # SPIN
            th = threading.Thread(target=look)
            th.start()
            cuda_debug.check()
            th.join()
        report(seen)
    ''')
    assert c.returncode == 0, c
    assert c.result == {"n": 1, "short": "spin", "cands": 2}, c
    report = c.stderr[c.stderr.index("cuda_debug (watch): possible hang"):]
    lines = report.splitlines()
    assert lines[2].startswith("  spin on stream 0x0"), report
    assert lines[3] == "    launched at %s:%d in <module>" % (c.script, c.line_of("# SPIN")), report
    assert "(the likeliest of 2 launches, #3 to #4" in report, report
    assert "    or empty (launch #3)" in report, report


def test_an_nccl_kernel_is_bracketed_and_named_exactly(fake_child):
    """Launches, then an NCCL kernel that does not finish (a rank that never
    joins): the marker put before it came back, its own did not: it alone is
    unfinished."""
    c = fake_child('''
        import time, cuda_debug
        fake.fake_set_async(1)
        fake.fake_set_kernel(b"ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 0, b"", -1, 3000000)
        s = fake.fake_stream_create()
        with cuda_debug.watch():
            for _ in range(5):
                fake.fake_launch(b"ok_k", s, %s)
            fake.fake_launch(b"ncclDevKernel_AllReduce_Sum_f32_RING_LL", s, %s)  # NCCL
            time.sleep(0.3)                        # the five finish
            r = cuda_debug.in_flight()
            out = [(x.collective, x.candidates, x.lineno) for x in r]
            fake.fake_stream_sync(s)
        report(out)
    ''' % (L, L))
    assert c.result == [["all_reduce", 1, c.line_of("# NCCL")]], c


def test_the_stream_table_keeps_the_culprit_past_its_size(fake_child):
    """More streams than the table holds (256): entries are taken over, never
    confused: a fault on the 300th stream is still among its own launches."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        t.empty()                                  # the primary context: check() synchronises it
        fake.fake_set_kernel(at("bad_k"), 700, 0, None, 0, 0)
        streams = [fake.fake_stream_create() for _ in range(300)]
        out = {}
        try:
            with cuda_debug.watch():
                for s in streams:
                    fake.fake_launch(at("ok_k"), s, %s)
                    fake.fake_stream_sync(s)       # each stream done, its launch closed
                fake.fake_launch(at("ok_k"), streams[-1], %s)
                fake.fake_launch(at("bad_k"), streams[-1], %s)  # CULPRIT
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out = dict(kernel=e.likely_kernel, stream=e.stream == streams[-1],
                       cands=[c["short"] for c in e.candidates])
        report(out)
    ''' % (L, L, L))
    r = c.result
    assert r is not None, c
    # bad_k, never seen to finish, leads ok_k, which finished 300 times before
    assert r == {"kernel": "at::native::bad_k()", "stream": True, "cands": ["ok_k"]}, r


def test_probe_levels_take_the_cost_apart(fake_child):
    """CUDA_DEBUG_WATCH_PROBE (measurements only): dispatch records nothing;
    record keeps no frames and writes no marker; frames keeps the frames."""
    code = '''
        import cuda_debug
        from cuda_debug import _core
        with cuda_debug.watch():
            for _ in range(40):
                fake.fake_launch(at("k"), 0, %s)
            s = _core.stats()
            rec = _core.watch_record(_core.watch_seq())
            report(dict(watched=s["watched"], marked=s["marked"],
                        frames=len(rec[8]) if rec else None))
    ''' % L
    got = {p: fake_child(code, env={"CUDA_DEBUG_WATCH_PROBE": p}).result
           for p in ("dispatch", "record", "frames", "off")}
    assert got["dispatch"] == {"watched": 0, "marked": 0, "frames": None}, got
    assert got["record"] == {"watched": 40, "marked": 0, "frames": 0}, got
    assert got["frames"]["marked"] == 0 and got["frames"]["frames"] >= 1, got
    # the kernel's first two launches, then the 16th launch after each marker: 18, 34
    assert got["off"]["marked"] == 4 and got["off"]["frames"] >= 1, got


def test_cupti_detach_after_the_last_watch_and_a_new_watch_works(fake_child):
    """CUDA_DEBUG_CUPTI_DETACH=1: the launch after the last watch() closed
    detaches CUPTI (cuptiFinalize, at its API exit); the next watch() takes it
    again and names a fault."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        t.empty()
        fake.fake_set_kernel(b"bad_k", 710, 1, b"idx < n", -1, 0)
        out = {}
        with cuda_debug.watch():
            fake.fake_launch(b"ok_k", 0, %s)
        out["subscribed_after_exit"] = _core.stats()["subscribed"]
        fake.fake_launch(b"ok_k", 0, %s)          # its callback detaches
        out["finalizes"] = fake.fake_cupti_finalizes()
        out["subscribed"] = _core.stats()["subscribed"]
        out["detaches"] = _core.stats()["detaches"]
        try:
            with cuda_debug.watch():
                fake.fake_launch(b"bad_k", 0, %s)
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out["kernel"] = e.kernel
        report(out)
    ''' % (L, L, L), env={"CUDA_DEBUG_CUPTI_DETACH": "1"})
    assert c.result == {"subscribed_after_exit": True, "finalizes": 1, "subscribed": False,
                        "detaches": 1, "kernel": "bad_k"}, c


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# watch() on a real GPU: the faulting launch named while kernels run asynchronously.
#
# Each faulting program runs in its own Python (a sticky fault kills the CUDA
# context of its process) and reports what it caught as JSON.
# ======================================================================================


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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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
        out = emb(idx)                         # NODE
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
    # launched it during the capture (docs/graphs.md), replayed at the replay's line
    assert r["lineno"] == c.line_of("# NODE") and r["graph_node"] is not None, r
    assert r["replayed_at"].startswith("%s:%d" % (c.script, c.line_of("# CULPRIT"))), r


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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

@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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
