"""Markers inside CUDA graphs, and a context reset, on a real GPU.

Each program runs in its own Python (a sticky fault kills the CUDA context of
its process), with a timeout, and reports what it caught as JSON. The fault in
a graph is made the way users meet it: the graph is captured and replayed
with good data, then a bad index is copied into its static input and the
graph replayed again.
"""
import pytest

from conftest import needs

pytestmark = pytest.mark.gpu

CATCH = """
import cuda_debug
from cuda_debug import _core
def describe(e):
    return dict(cls=type(e).__name__, code=e.code, kernel=e.kernel, node=e.graph_node,
                captured_at=e.captured_at, replayed_at=e.replayed_at, exact=e.exact,
                filename=e.filename, lineno=e.lineno, note=e.graph_note, text=str(e),
                candidates=[(c.get("kernel"), c.get("graph_node")) for c in e.candidates or ()],
                graph_stats=_core.graph_stats(), device_message=e.device_message)
"""

TORCH = CATCH + """
import torch
w = torch.randn(100, 8, device="cuda")
idx = torch.zeros(1, dtype=torch.long, device="cuda")
o = torch.empty(1, 8, device="cuda")
torch.index_select(w, 0, idx, out=o)           # warm-up: kernels loaded before any capture
torch.zeros(16, device="cuda").add_(1)
torch.cuda.synchronize()
"""


# A graph `g` captured before watch(), replayed inside watch().
REPLAY_IN_WATCH = """
try:
    with cuda_debug.watch():
        g.replay()  # REPLAY
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
"""


def _where(c, marker):
    return "%s:%d" % (c.script, c.line_of(marker))


@pytest.mark.parametrize("markers, every", [("memop", "1"), ("kernel", "1"), ("kernel", None)])
def test_fault_in_node_37_of_a_60_kernel_graph_is_named_exactly(child, markers, every):
    """One kernel per op: x.add_(1) (vectorized elementwise), index_select
    with out= (indexSelectSmallIndex). Node 37 faults at the fourth replay.
    Markers as stream writes or as kernels of cuda_debug's (the default), behind
    every node or (the default) every 8th: then nodes 32..39 are the candidates
    and the device's assert text names node 37, exactly."""
    needs("torch")
    c = child(TORCH + """
xs = [torch.zeros(16, device="cuda") for _ in range(60)]
g = torch.cuda.CUDAGraph()
out = {}
try:
    with cuda_debug.watch():
        with torch.cuda.graph(g):
            for i in range(60):
                if i == 37:
                    torch.index_select(w, 0, idx, out=o)  # NODE37
                else:
                    xs[i].add_(1)
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        out["after_3"] = [float(xs[0][0]), float(xs[59][0])]
        idx.fill_(1000)                        # the bad index, into the static input
        g.replay()  # REPLAY
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""", env=dict({"CUDA_DEBUG_GRAPH_MARKERS": markers},
                **({"CUDA_DEBUG_GRAPH_MARKER_EVERY": every} if every else {})))
    r = c.result
    assert r is not None, c
    assert r["after_3"] == [3.0, 3.0], r
    assert r["cls"] == "DeviceAssertError", r
    assert r["node"] == 37, r
    assert "indexSelect" in r["kernel"], r
    assert r["exact"] is True, r
    assert r["filename"] == c.script and r["lineno"] == c.line_of("# NODE37"), r
    assert r["captured_at"] == _where(c, "# NODE37"), r
    assert r["replayed_at"] == _where(c, "# REPLAY"), r
    assert "node 37 of a CUDA graph" in r["text"], r["text"]
    assert r["graph_stats"]["nodes_marked"] == (60 if every else 7), r
    assert r["graph_stats"]["clear_rc"] == 0, r
    assert r["graph_stats"]["write_rc"] == 0 and r["graph_stats"]["kernel_rc"] == 0, r
    # the block on fd 2, written at the fault (with sparse markers: the candidates)
    assert "(node 37 of a CUDA graph; replay launch #" in c.stderr, c.stderr[-3000:]
    if not every:
        assert "culprit (one of 8 nodes after the last marker written; a marker every 8 " \
               "nodes): " in c.stderr, c.stderr[-3000:]
    assert "captured at %s in <module>" % _where(c, "# NODE37") in c.stderr, c.stderr[-3000:]
    assert "replayed at %s in <module>" % _where(c, "# REPLAY") in c.stderr, c.stderr[-3000:]


def test_fork_join_capture_gives_the_frontier(child):
    """A side stream forked from the capture and joined back: the first
    unfinished node of each stream; the assert text picks the faulting node,
    which makes it exact."""
    needs("torch")
    c = child(TORCH + """
a, b, cc, d = (torch.zeros(16, device="cuda") for _ in range(4))
side = torch.cuda.Stream()
g = torch.cuda.CUDAGraph()
out = {}
try:
    with cuda_debug.watch():
        with torch.cuda.graph(g):
            a.add_(1)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                torch.index_select(w, 0, idx, out=o)  # SIDE
                b.add_(1)
            cc.add_(1)
            torch.cuda.current_stream().wait_stream(side)
            d.add_(1)
        g.replay()
        torch.cuda.synchronize()
        out["good"] = [float(a[0]), float(b[0]), float(cc[0]), float(d[0])]
        idx.fill_(1000)
        g.replay()  # REPLAY
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""", env={"CUDA_DEBUG_GRAPH_MARKER_EVERY": "1"})
    r = c.result
    assert r is not None, c
    assert r["good"] == [1.0, 1.0, 1.0, 1.0], r
    assert r["node"] == 1 and "indexSelect" in r["kernel"], r
    assert r["lineno"] == c.line_of("# SIDE"), r
    # the device's text names the kernel: the main stream's first unfinished node
    # (3 or 4) is no candidate (as on the fake driver, test_graphs.py)
    assert r["exact"] is True and r["candidates"] == [], r
    assert r["replayed_at"] == _where(c, "# REPLAY"), r


def test_torch_compile_reduce_overhead_names_the_call_and_the_source_line(child):
    """cudagraph trees (mode="reduce-overhead") replayed with a bad
    index: the kernel and node; "replayed at" the call that replayed the graph
    (not the compiled function's def line); "captured at" the source line the
    kernel fused (Inductor's line map, as the eager torch.compile path gives),
    with the call that recorded the graph."""
    needs("torch", "triton")
    c = child(CATCH + """
import torch
@torch.compile(mode="reduce-overhead")
def f(w, i):
    return w[i] * 2  # SOURCE
w = torch.randn(100, 8, device="cuda")
good = torch.zeros(4, dtype=torch.long, device="cuda")
bad = torch.full((4,), 1000, dtype=torch.long, device="cuda")
out = {}
try:
    with cuda_debug.watch():
        for _ in range(4):                     # warm-up, record, replays
            y = f(w, good)  # CALL
        torch.cuda.synchronize()
        out["captures"] = _core.graph_stats()["captures"]
        y = f(w, bad)  # BAD CALL
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e), recorded_at=e.recorded_at, provenance=e.provenance)
report(out)
""", timeout=300)
    r = c.result
    assert r is not None, c
    assert r["captures"] >= 1, r                      # cudagraph trees captured inside watch()
    assert r["node"] is not None and r["kernel"].startswith("triton_"), r
    assert r["replayed_at"] == _where(c, "# BAD CALL"), r
    assert r["captured_at"] == "%s in f" % _where(c, "# SOURCE"), r
    assert r["filename"] == c.script and r["lineno"] == c.line_of("# SOURCE"), r
    assert r["recorded_at"] == _where(c, "# CALL"), r
    assert "fused up to %s in f" % _where(c, "# SOURCE") in r["provenance"], r
    for marker in ("@torch.compile", "def f(w, i)"):
        assert "%s:%d" % (c.script, c.line_of(marker)) not in r["replayed_at"] + r["captured_at"]


def test_graph_captured_before_watch_is_named_by_the_device_text(child):
    """A graph torch captured before watch() (no markers) is read at the end of
    its capture (the driver's graph API, no CUPTI); its replay inside watch()
    with a bad index is named by the device's assert text: the kernel, node 3,
    the line that launched it during the capture (not the `with` line), the
    replay line."""
    needs("torch")
    c = child(TORCH + """
xs = [torch.zeros(16, device="cuda") for _ in range(5)]
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):  # CAPTURED
    for i in range(5):
        if i == 3:
            torch.index_select(w, 0, idx, out=o)  # BAD LAUNCH
        else:
            xs[i].add_(1)
g.replay()
torch.cuda.synchronize()
out = {"subscribes": _core.stats()["subscribes"], "adopted": cuda_debug._graphs.stats()}
idx.fill_(1000)
""" + REPLAY_IN_WATCH)
    r = c.result
    assert r is not None, c
    assert r["subscribes"] == 0, r                           # CUPTI untouched before watch()
    assert r["adopted"]["adopted"] == 1 and r["adopted"]["paired"] == 1, r
    assert r["node"] == 3 and "indexSelect" in r["kernel"], r
    assert r["exact"] is True and "captured before watching" in r["note"], r
    assert r["captured_at"] == _where(c, "# BAD LAUNCH"), r
    assert r["replayed_at"] == _where(c, "# REPLAY") and r["lineno"] == c.line_of("# BAD LAUNCH")
    # the block on fd 2 (written when the driver logs the fault, maybe before the
    # device's text is in): the node, or why not
    assert "captured before watching" in c.stderr, c.stderr[-3000:]


def test_graph_captured_before_watch_names_the_line_in_the_users_function(child):
    """Each node of a graph captured before watch() gets the user's line that
    launched it while capturing (a trace function follows the capture outside
    watch()): kernels launched by operators (`x + 1`, no call event) before the
    faulting one do not shift it; the faulting index_select is named inside
    pick(), where it was called, not at the `with` line or pick()'s caller."""
    needs("torch")
    c = child(TORCH + """
xs = [torch.zeros(16, device="cuda") for _ in range(2)]
def pick():
    torch.index_select(w, 0, idx, out=o)  # PICK
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):  # CAPTURED
    y = xs[0] + 1
    z = y * 2
    pick()  # CALLS PICK
    xs[1].add_(z)
g.replay()
torch.cuda.synchronize()
out = {"events": _core.graph_stats()["adopt_events"]}
idx.fill_(1000)
""" + REPLAY_IN_WATCH)
    r = c.result
    assert r is not None, c
    assert r["events"] > 0, r
    assert r["node"] == 2 and "indexSelect" in r["kernel"], r
    assert r["captured_at"] == _where(c, "# PICK") + " in pick", r
    assert r["replayed_at"] == _where(c, "# REPLAY"), r
    assert "the line that ended its capture" not in c.stderr, c.stderr[-3000:]


def test_graph_captured_before_watch_without_device_text_says_why(child):
    """A fault with no assert text (an illegal address) in a graph captured
    before watch(): no node can be named; the report says why, with the line
    that captured the graph and the replay line."""
    needs("torch")
    c = child(TORCH + """
import cuda_debug.testing as t
x = torch.zeros(16, device="cuda")
t.empty(stream=torch.cuda.current_stream().cuda_stream)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):  # CAPTURED
    x.add_(1)
    t.illegal_address(stream=torch.cuda.current_stream().cuda_stream)
    x.add_(1)
torch.cuda.synchronize()
out = {}
""" + REPLAY_IN_WATCH)
    r = c.result
    assert r is not None, c
    assert r["cls"] == "IllegalAddressError" and r["node"] is None, r
    assert "names none of its 3 kernel nodes" in r["note"], r
    assert r["lineno"] == c.line_of("# REPLAY"), r
    assert "captured at %s in <module>" % _where(c, "# CAPTURED") in c.stderr, c.stderr[-3000:]


def test_graph_results_are_the_same_with_and_without_watch(child):
    """A small training-like step (matmuls, a softmax, a reduction) captured
    twice, unwatched and watched, replayed on the same inputs: the outputs are
    bit for bit equal; the watched graph had markers (and a clear memset)."""
    needs("torch")
    c = child(CATCH + """
import torch
torch.manual_seed(0)
lin = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
                          torch.nn.Linear(128, 10)).cuda()
x = torch.randn(32, 64, device="cuda")
def step():
    return torch.softmax(lin(x), dim=-1).sum(0)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        step()                                  # warm-up outside the captures
torch.cuda.current_stream().wait_stream(s)
eager = step()
def capture():
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = step()
    return g, y
g0, y0 = capture()
with cuda_debug.watch():
    g1, y1 = capture()
    outs = []
    for g, y in ((g0, y0), (g1, y1)):
        for _ in range(5):
            g.replay()
        torch.cuda.synchronize()
        outs.append(y.clone())
report(dict(same=bool(torch.equal(outs[0], outs[1])), eager=bool(torch.equal(outs[0], eager)),
            marked=_core.graph_stats()["nodes_marked"], clear_rc=_core.graph_stats()["clear_rc"]))
""", env={"CUDA_DEBUG_GRAPH_MARKER_EVERY": "1"})   # a marker behind every node
    r = c.result
    assert r is not None, c
    assert r["same"] is True, r
    assert r["marked"] >= 4 and r["clear_rc"] == 0, r


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "default"])
def test_fault_after_a_context_reset_is_named_and_nothing_crashes(child, exact):
    """cuDevicePrimaryCtxReset (what cudaDeviceReset does) between two watch()
    blocks, then a real fault in the new context: the slots of the old one are
    never read (this segfaulted), and the fault is the cause, named -- exactly
    in the default mode too (a kernel's first launches get a marker each)."""
    c = child(CATCH + """
import ctypes
import cuda_debug.testing as t
cuda = ctypes.CDLL("libcuda.so.1")
def primary():
    ctx = ctypes.c_void_p()
    assert cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
    cuda.cuDevicePrimaryCtxRelease_v2(0)
    return ctx.value
out = {}
t.empty()                                      # a context before watch(): its entry is made there
with cuda_debug.watch():
    for _ in range(3):
        t.empty()
    cuda_debug.check()
    out["contexts_before"] = _core.graph_stats()["contexts"]
before = primary()
out["reset"] = cuda.cuDevicePrimaryCtxReset_v2(0)
out["same_pointer"] = primary() == before
try:
    with cuda_debug.watch(exact=EXACT):                   # an illegal address: named by markers
        t.empty()
        out["incomplete"] = len(_core.watch_streams(0))      # read the slots: no SIGSEGV
        t.illegal_address()  # CULPRIT
        t.empty()
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e))
out["contexts_after"] = _core.graph_stats()["contexts"]
out["write_rc"] = _core.stats()["watch_write_rc"]
report(out)
""".replace("EXACT", repr(exact)))
    assert c.returncode == 0, c
    r = c.result
    assert r is not None, c
    assert r["reset"] == 0, r
    # made at watch() entry by cuptiGetContextId, found by the launches' contextUid:
    # CUPTI's two ids of a context agree
    assert r["contexts_before"] == 1, r
    assert r["cls"] == "IllegalAddressError" and "write_wild" in r["kernel"], r
    assert r["lineno"] == c.line_of("# CULPRIT") and r["exact"] is True, r
    assert r["write_rc"] == 0, r                   # every marker of the new context written
    assert r["contexts_after"] == 1, r             # the old context's slots retired
    assert "already dead" not in c.stderr, c.stderr[-3000:]


@pytest.mark.parametrize("every", ["1", None])
def test_a_hang_inside_a_replayed_graph_names_the_running_node(child, every):
    """A kernel node that runs for seconds inside a replay: the
    hang watcher's report, in_flight() and the dump signal name it (kernel, node
    number, capture line, replay line), not "a CUDA graph replay". With the
    default markers (every 8th node) the six nodes are the candidates, named so."""
    needs("torch")
    c = child(TORCH + """
import os, signal, time
import cuda_debug.testing as t
xs = [torch.zeros(16, device="cuda") for _ in range(6)]
s = lambda: torch.cuda.current_stream().cuda_stream
t.spin(0.001, stream=s())
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with cuda_debug.watch(hang_after=1):
    with torch.cuda.graph(g):
        for i in range(6):
            if i == 4:
                t.spin(4, stream=s())  # SPIN
            else:
                xs[i].add_(1)
    g.replay()  # REPLAY
    time.sleep(2.5)
    rec = cuda_debug.in_flight()
    from cuda_debug import _dump                  # what `dump PID` gets
    doc = [x.graph_node for x in _dump.records(_dump.local_document()) if x.graph]
    os.kill(os.getpid(), signal.SIGUSR1)
    torch.cuda.synchronize()
r = [x for x in rec if x.graph]
report(dict(n=len(r), kernel=r[0].kernel if r else None, node=r[0].graph_node if r else None,
            captured_at=r[0].captured_at if r else None, lineno=r[0].lineno if r else None,
            nodes=[(n[0], n[1], n[3]) for n in r[0].graph_nodes] if r else None, doc=doc))
""", timeout=120, env={"CUDA_DEBUG_GRAPH_MARKER_EVERY": every} if every else None)
    r = c.result
    assert r is not None, c
    if not every:                                 # no marker inside: every node a candidate
        assert r["n"] == 1 and [n[0] for n in r["nodes"]] == [0, 1, 2, 3, 4, 5], r
        assert r["nodes"][4][1] == "spin" and r["nodes"][4][2] == _where(c, "# SPIN"), r
        assert "; one of 6 nodes after the last marker written, a marker every 8 nodes) on " \
               "stream " in c.stderr, c.stderr[-4000:]
        assert "    replayed at %s in <module>" % _where(c, "# REPLAY") in c.stderr
        return
    assert r["n"] == 1 and r["node"] == 4 and "spin" in r["kernel"], r
    assert r["captured_at"] == _where(c, "# SPIN") and r["lineno"] == c.line_of("# REPLAY"), r
    assert r["doc"] == [4], r
    head = "  spin (node 4 of a CUDA graph) on stream "
    assert c.stderr.count(head) == 2, c.stderr[-4000:]        # the watcher's, the dump's
    assert "    captured at %s in <module>" % _where(c, "# SPIN") in c.stderr, c.stderr[-4000:]
    assert "    replayed at %s in <module>" % _where(c, "# REPLAY") in c.stderr, c.stderr[-4000:]
    assert "a CUDA graph replay" not in c.stderr, c.stderr[-4000:]


def test_a_hundred_graphs_replayed_in_turn_and_graphs_recaptured_past_the_pool(child):
    """Many graphs on the GPU: 100 graphs (one per batch size) replayed in
    turn, then 70 graphs of 2,000 kernels captured and destroyed (140,000 marked
    nodes: more than the pool of 131,072), then a bad index in graph 73: its
    node, exactly; the pool and the executable table back to what lives."""
    needs("torch")
    c = child(TORCH + """
import gc
out = {}
try:
    with cuda_debug.watch():
        xs = [torch.zeros(b + 1, device="cuda") for b in range(100)]
        graphs = []
        for b in range(100):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                xs[b].add_(1)
                if b == 73:
                    torch.index_select(w, 0, idx, out=o)  # NODE
                xs[b].mul_(2)
            graphs.append(g)
        for _ in range(3):
            for g in graphs:
                g.replay()
        torch.cuda.synchronize()
        y = torch.zeros(16, device="cuda")
        for _ in range(70):
            g2 = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g2):
                for _ in range(2000):
                    y.add_(1)
            g2.replay()
            torch.cuda.synchronize()
            del g2
            gc.collect()
        st = _core.graph_stats()
        out["stats"] = {k: st[k] for k in ("execs", "captures", "nodes_unmarked", "execs_refused",
                                           "nodes_recorded", "exec_reach")}
        idx.fill_(1000)
        for g in graphs[:74]:
            g.replay()  # REPLAY
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""", timeout=300)
    r = c.result
    assert r is not None, c
    st = r["stats"]
    assert st["captures"] == 100 and st["execs"] == 100 and st["execs_refused"] == 0, r
    assert st["nodes_unmarked"] == 0 and st["nodes_recorded"] >= 140000, r
    assert st["exec_reach"] <= 8, r
    assert r["node"] == 1 and "indexSelect" in r["kernel"] and r["exact"] is True, r
    assert r["captured_at"] == _where(c, "# NODE") and r["replayed_at"] == _where(c, "# REPLAY")
