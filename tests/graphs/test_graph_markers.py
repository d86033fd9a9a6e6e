"""Markers inside CUDA graphs, on the fake driver.

While watching, a launch captured into a graph gets a node record and a
completion marker captured right behind it (csrc/capture/graph_capture.c);
the capture gets a start marker first and a memset of its slots last, so
every replay starts clear. The fake driver (tests/fake_cuda) records stream
writes and memsets into the graph and runs them at replay, in capture order;
a stream that waits for an event recorded in a capturing stream joins the
capture (fork/join). A kernel's behaviour is looked up at replay, so a "bad
index" can be set between replays, as a bad token copied into a static input.

On a real GPU: the tests at the end of this module (marked gpu).
"""
import signal

import pytest
from conftest import needs

PRE = '''
import ctypes
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()                              # the primary context retained: check() syncs it
L = (1, 1, 1, 32, 1, 1)                # grid, block (called directly: a helper would be
                                       # the innermost frame of the user's)
def end_capture(s):
    g = ctypes.c_size_t()
    assert fake.fake_end_capture(s, ctypes.byref(g)) == 0
    return g.value
def graph_ops(g):
    ops = (ctypes.c_int * 3)()
    fake.fake_graph_ops(g, ops)
    return list(ops)                   # kernels, stream writes, memsets
def describe(e):
    return dict(cls=type(e).__name__, kernel=e.kernel, node=e.graph_node,
                captured_at=e.captured_at, replayed_at=e.replayed_at, exact=e.exact,
                filename=e.filename, lineno=e.lineno, note=e.graph_note, text=str(e),
                candidates=[(c.get("kernel"), c.get("graph_node")) for c in e.candidates or ()])
s = fake.fake_stream_create()
'''


def _memop(fake_child):
    """Most tests here count the graph's memory-op marker nodes, one behind every
    node, so they ask for them (CUDA_DEBUG_GRAPH_MARKERS=memop,
    CUDA_DEBUG_GRAPH_MARKER_EVERY=1); the default, one-thread kernel nodes behind
    every 8th node, is test_marker_kernels_instead_of_stream_writes's,
    graphs/test_graph_lifetimes.py's sparse test's and the GPU tests'."""
    def run(code, env=None, **kw):
        return fake_child(code, env=dict({"CUDA_DEBUG_GRAPH_MARKERS": "memop",
                                          "CUDA_DEBUG_GRAPH_MARKER_EVERY": "1"},
                                         **(env or {})), **kw)
    return run


CHAIN = PRE + '''
BAD = int(sys.argv[1])
out = {}
try:
    with cuda_debug.watch():
        fake.fake_begin_capture(s)
        for i in range(60):
            if i == BAD:
                fake.fake_launch(b"bad_node", s, *L)  # CAPTURED
            else:
                fake.fake_launch(b"ok_node", s, *L)
        g = end_capture(s)
        out["ops"] = graph_ops(g)
        for r in range(3):             # good replays, back to back: each clears its markers
            fake.fake_graph_launch(g, s)
        out["good"] = fake.fake_stream_sync(s)
        fake.fake_set_kernel(b"bad_node", 700, 0, None, 0, 0)
        fake.fake_graph_launch(g, s)  # REPLAYED
        fake.fake_launch(b"after", s, *L)
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
'''


@pytest.mark.parametrize("bad", [0, 37, 59])
def test_fault_in_a_node_of_a_captured_chain_is_named_exactly(fake_child, bad):
    c = _memop(fake_child)(CHAIN, args=[str(bad)])
    r = c.result
    assert r is not None, c
    assert r["ops"] == [60, 61, 1], r          # 60 kernels; a start marker and 60; one memset
    assert r["good"] == 0
    assert r["cls"] == "IllegalAddressError", r
    assert r["kernel"] == "bad_node" and r["node"] == bad, r
    assert r["exact"] is True, r
    cap, rep = c.line_of("# CAPTURED"), c.line_of("# REPLAYED")
    assert r["filename"] == c.script and r["lineno"] == cap, r
    assert r["captured_at"] == "%s:%d" % (c.script, cap), r
    assert r["replayed_at"] == "%s:%d" % (c.script, rep), r
    assert r["text"].startswith("illegal memory access in bad_node, node %d of a CUDA graph"
                                % bad), r["text"]
    assert "captured at %s:%d" % (c.script, cap) in r["text"], r["text"]
    assert "replayed at %s:%d" % (c.script, rep) in r["text"], r["text"]
    # the block on fd 2, written when the driver logged the fault
    assert "culprit: bad_node (node %d of a CUDA graph; replay launch #" % bad in c.stderr, \
        c.stderr
    assert "captured at %s:%d in <module>" % (c.script, cap) in c.stderr, c.stderr
    assert "replayed at %s:%d in <module>" % (c.script, rep) in c.stderr, c.stderr


def test_marker_kernels_instead_of_stream_writes(fake_child):
    """CUDA_DEBUG_GRAPH_MARKERS=kernel: each marker is a one-thread kernel node
    of cuda_debug's own (loaded at the capture's beginning), not a node of the
    user's: node 37 is named, exactly, after good replays."""
    c = _memop(fake_child)(CHAIN.replace("report(out)", "report(dict(out, stats=_core.graph_stats()))"),
                   args=["37"], env={"CUDA_DEBUG_GRAPH_MARKERS": "kernel"})
    r = c.result
    assert r is not None, c
    assert r["ops"] == [60 + 61, 0, 1], r             # 61 marker kernels, no stream write
    assert r["stats"]["kernel_rc"] == 0 and r["stats"]["nodes_marked"] == 60, r
    assert r["kernel"] == "bad_node" and r["node"] == 37 and r["exact"] is True, r
    assert r["lineno"] == c.line_of("# CAPTURED"), r


def test_fork_join_capture_gives_the_frontier(fake_child):
    """A capture over two streams (an event recorded on the origin, waited for
    by the side stream, and back): the first unfinished node of each stream;
    the device's assert text picks the one it names, which makes it exact (the
    device named the kernel: the other stream's frontier is no candidate)."""
    c = _memop(fake_child)(PRE + '''
out = {}
side = fake.fake_stream_create()
fork, join = fake.fake_event_create(), fake.fake_event_create()
fake.fake_set_kernel(b"side_bad", 0, 0, None, 0, 0)
try:
    with cuda_debug.watch():
        fake.fake_begin_capture(s)
        fake.fake_launch(b"head", s, *L)
        fake.fake_event_record(fork, s)
        fake.fake_stream_wait_event(side, fork)
        out["joined"] = fake.fake_capture_status(side)
        fake.fake_launch(b"side_ok", side, *L)
        fake.fake_launch(b"side_bad", side, *L)  # SIDE
        fake.fake_launch(b"main_ok", s, *L)  # MAIN
        fake.fake_event_record(join, side)
        fake.fake_stream_wait_event(s, join)
        fake.fake_launch(b"tail", s, *L)
        g = end_capture(s)
        out["ops"] = graph_ops(g)
        fake.fake_graph_launch(g, s)
        out["good"] = fake.fake_stream_sync(s)
        fake.fake_set_kernel(b"side_bad", 710, 1, b"i < n", -1, 0)
        fake.fake_graph_launch(g, s)  # REPLAYED
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["joined"] == 1 and r["good"] == 0, r
    assert r["ops"] == [5, 6, 1], r
    assert r["cls"] == "DeviceAssertError", r
    assert r["kernel"] == "side_bad" and r["node"] == 2, r       # named by the assert text
    assert r["exact"] is True, r
    assert r["candidates"] == [], r
    assert r["lineno"] == c.line_of("# SIDE"), r
    assert r["replayed_at"] == "%s:%d" % (c.script, c.line_of("# REPLAYED")), r
    assert "unfinished nodes" not in r["text"], r["text"]
    assert "culprit (one of the first unfinished nodes per stream of the graph): side_ok" \
        not in c.stderr
    assert "side_bad (node 2 of a CUDA graph" in c.stderr and \
        "main_ok (node 3 of a CUDA graph" in c.stderr, c.stderr


def test_graph_captured_before_watching_says_so(fake_child):
    c = _memop(fake_child)(PRE + '''
out = {}
fake.fake_begin_capture(s)
for i in range(5):
    fake.fake_launch((b"pre_bad" if i == 3 else b"pre_ok"), s, *L)
g = end_capture(s)
out["ops"] = graph_ops(g)
fake.fake_set_kernel(b"pre_bad", 700, 0, None, 0, 0)
try:
    with cuda_debug.watch():
        fake.fake_graph_launch(g, s)  # REPLAYED
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["ops"] == [5, 0, 0], r                # nothing added to a graph not watched
    assert r["kernel"] is None and r["node"] is None, r
    assert "captured before watching" in r["note"], r
    assert r["lineno"] == c.line_of("# REPLAYED"), r
    assert r["text"].startswith("illegal memory access in a CUDA graph replay (captured "
                                "before watching"), r["text"]
    assert "replayed at %s:%d" % (c.script, c.line_of("# REPLAYED")) in r["text"], r["text"]
    assert "a CUDA graph replay (captured before watching: no markers inside it" in c.stderr
    assert "replayed at %s:%d" % (c.script, c.line_of("# REPLAYED")) in c.stderr, c.stderr


def test_markers_change_no_kernel_of_the_graph_and_keep_the_capture_valid(fake_child):
    """The same capture with and without watch(): the same kernels in the same
    order, every replay runs them all; watched, only memory-op nodes are added."""
    c = _memop(fake_child)(PRE + '''
out = {}
def capture_and_replay(n_replays):
    st = fake.fake_stream_create()
    assert fake.fake_begin_capture(st) == 0
    for i in range(8):
        fake.fake_launch(b"k%d" % i, st, *L)
    g = end_capture(st)
    before = fake_stats()["kernels_run"]
    for _ in range(n_replays):
        assert fake.fake_graph_launch(g, st) == 0
    assert fake.fake_stream_sync(st) == 0
    return graph_ops(g), fake_stats()["kernels_run"] - before
out["plain"] = capture_and_replay(4)
with cuda_debug.watch():
    out["watched"] = capture_and_replay(4)
    out["writes_per_replay"] = None
    w0 = fake_stats()["writes"]
    st2 = fake.fake_stream_create()
    fake.fake_begin_capture(st2)
    fake.fake_launch(b"x", st2, *L)
    g2 = end_capture(st2)
    fake.fake_graph_launch(g2, st2)
    fake.fake_stream_sync(st2)
    out["writes_one_replay"] = fake_stats()["writes"] - w0
out["graph_stats"] = _core.graph_stats()
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["plain"] == [[8, 0, 0], 32], r
    assert r["watched"] == [[8, 9, 1], 32], r        # same kernels, all run at every replay
    # a start marker, a node marker, the replay's own ring marker
    assert r["writes_one_replay"] == 3, r
    assert r["graph_stats"]["nodes_marked"] == 9 and r["graph_stats"]["captures"] == 2, r


def test_without_cupti_resource_ids_the_replay_is_paired_by_its_running_markers(fake_child):
    c = _memop(fake_child)(PRE.replace("t.empty()", "fake.fake_refuse_resource(1)\nt.empty()") + '''
out = {}
try:
    with cuda_debug.watch():
        fake.fake_begin_capture(s)
        for i in range(6):
            fake.fake_launch((b"bad_node" if i == 4 else b"ok_node"), s, *L)
        g = end_capture(s)
        fake.fake_set_kernel(b"bad_node", 700, 0, None, 0, 0)
        fake.fake_graph_launch(g, s)
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e))
out["refused"] = _core.graph_stats()["graph_ids_refused"]
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["refused"] == 6, r        # the resource ids (cupti_ids.h)
    assert r["kernel"] == "bad_node" and r["node"] == 4, r
    assert r["exact"] is False and "paired with the graph" in r["note"], r


def test_a_refused_memset_is_replaced_by_stream_writes(fake_child):
    """If the driver refuses to capture the memset that clears a graph's
    markers, stream writes of 0 clear them (one node each): replays back to
    back still name the right node."""
    c = _memop(fake_child)(PRE.replace("t.empty()", "fake.fake_refuse_capture_memset(1)\nt.empty()") +
                   CHAIN.split(PRE, 1)[1] + 'report(dict(out, stats=_core.graph_stats()))\n',
                   args=["37"])
    r = c.result
    assert r is not None, c
    assert r["ops"] == [60, 61 + 61, 0], r
    assert r["stats"]["clear_rc"] == 1, r                 # CUDA_ERROR_INVALID_VALUE, seen
    assert r["kernel"] == "bad_node" and r["node"] == 37 and r["exact"] is True, r


def test_graph_markers_can_be_turned_off(fake_child):
    c = _memop(fake_child)(PRE + '''
with cuda_debug.watch():
    fake.fake_begin_capture(s)
    for i in range(3):
        fake.fake_launch(b"k", s, *L)
    g = end_capture(s)
report(dict(ops=graph_ops(g), skipped=_core.stats()["skipped_capture"]))
''', env={"CUDA_DEBUG_GRAPH_MARKERS": "0"})
    r = c.result
    assert r is not None, c
    assert r["ops"] == [3, 0, 0] and r["skipped"] == 3, r


def test_sigterm_during_a_replay_names_the_running_node(fake_child):
    """The signal handler reads the graph's markers from host memory: the node
    still running when the process is killed."""
    c = _memop(fake_child)(PRE + '''
import os, time
with cuda_debug.watch():
    fake.fake_begin_capture(s)
    for i in range(10):
        fake.fake_launch((b"slow_node" if i == 6 else b"ok_node"), s, *L)  # CAPTURED
    g = end_capture(s)
    fake.fake_set_kernel(b"slow_node", 0, 0, None, 0, 3000000)
    fake.fake_set_async(1)
    fake.fake_graph_launch(g, s)  # REPLAYED
    time.sleep(0.3)
    os.kill(os.getpid(), signal.SIGTERM)
'''.replace("import os, time", "import os, signal, time"))
    assert c.returncode == -signal.SIGTERM, c
    assert "culprit: slow_node (node 6 of a CUDA graph" in c.stderr, c.stderr
    assert "captured at %s:%d" % (c.script, c.line_of("# CAPTURED")) in c.stderr, c.stderr
    assert "replayed at %s:%d" % (c.script, c.line_of("# REPLAYED")) in c.stderr, c.stderr


HANG = PRE.replace("import ctypes", "import ctypes, os, signal, time") + '''
SLOW = sys.argv[1].encode()
with cuda_debug.watch(hang_after=0.5):
    fake.fake_begin_capture(s)
    for i in range(10):
        fake.fake_launch((SLOW if i == 6 else b"ok_node"), s, *L)  # CAPTURED
    g = end_capture(s)
    fake.fake_graph_launch(g, s)
    fake.fake_stream_sync(s)
    fake.fake_set_kernel(SLOW, 0, 0, None, 0, 2500000)
    fake.fake_set_async(1)
    fake.fake_graph_launch(g, s)  # REPLAYED
    time.sleep(1.3)                                # the hang watcher's report
    rec = cuda_debug.in_flight()
    from cuda_debug import _dump                   # what `dump PID` (--json) gets
    doc = _dump.local_document()
    d = _dump.records(doc)[0]
    os.kill(os.getpid(), signal.SIGUSR1)           # the dump signal's
    fake.fake_stream_sync(s)
r = rec[0]
report(dict(n=len(rec), graph=r.graph, kernel=r.kernel, short=r.short, node=r.graph_node,
            collective=r.collective, captured_at=r.captured_at, lineno=r.lineno,
            nodes=r.graph_nodes, note=r.graph_note,
            doc=[d.graph_node, d.short, d.captured_at, d.graph_nodes == r.graph_nodes],
            doc_text=doc["text"]))
'''


@pytest.mark.parametrize("slow, name", [
    ("slow_node", "slow_node"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL",
     "all_reduce (ncclDevKernel_AllReduce_Sum_f32_RING_LL)")])
def test_a_hang_inside_a_replay_names_the_running_node_in_every_report(fake_child, slow, name):
    """The hang watcher, the dump signal and in_flight() name the
    node of the replayed graph that still runs (kernel, or an NCCL kernel's
    collective; node number; capture line; replay line), not "a CUDA graph
    replay"."""
    c = _memop(fake_child)(HANG, args=[slow])
    r = c.result
    assert r is not None, c
    cap, rep = c.line_of("# CAPTURED"), c.line_of("# REPLAYED")
    assert r["n"] == 1 and r["graph"] is True and r["node"] == 6, r
    assert r["short"] == slow and r["kernel"] == slow, r
    assert r["collective"] == ("all_reduce" if "nccl" in slow else None), r
    assert r["captured_at"] == "%s:%d" % (c.script, cap) and r["lineno"] == rep, r
    assert r["nodes"] == [[6, slow, r["collective"], "%s:%d" % (c.script, cap)]], r
    assert r["note"] is None, r
    assert r["doc"] == [6, slow, "%s:%d" % (c.script, cap), True], r   # dump's document
    head = "  %s (node 6 of a CUDA graph) on stream " % name
    assert head in r["doc_text"], r["doc_text"]
    assert c.stderr.count(head) == 2, c.stderr           # the watcher's and the dump's
    for block in c.stderr.split("cuda_debug (watch): ")[1:]:
        lines = block.splitlines()
        i = next(k for k, line in enumerate(lines) if line.startswith(head))
        assert "unfinished for " in lines[i] and "(launch #2, thread " in lines[i], lines
        assert lines[i + 1] == "    captured at %s:%d in <module>" % (c.script, cap), lines
        assert lines[i + 2] == "    replayed at %s:%d in <module>" % (c.script, rep), lines
    assert "a CUDA graph replay" not in c.stderr, c.stderr


@pytest.mark.parametrize("slow", ["slow_node", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"])
def test_a_hang_with_a_marker_every_8_nodes_names_the_candidates(fake_child, slow):
    """The default markers (behind every 8th launch, and every NCCL kernel): the
    hang report and in_flight() give the nodes after the last marker written
    (node 6 among them); an NCCL kernel among them is named first."""
    c = fake_child(HANG, args=[slow], env={"CUDA_DEBUG_GRAPH_MARKERS": "memop"})
    r = c.result
    assert r is not None, c
    nccl = "nccl" in slow
    nodes = [n[0] for n in r["nodes"]]
    assert nodes == list(range(7 if nccl else 8)), r       # (node 7 carries a marker)
    if nccl:
        assert r["node"] == 6 and r["collective"] == "all_reduce", r
        head = "  all_reduce (%s) (node 6 of a CUDA graph; one of 7 nodes after the last " \
               "marker written, a marker every 8 nodes) on stream " % slow
    else:
        assert r["node"] == 0 and r["short"] == "ok_node", r
        head = "  ok_node (node 0 of a CUDA graph; one of 8 nodes after the last marker " \
               "written, a marker every 8 nodes) on stream "
    assert c.stderr.count(head) == 2, c.stderr
    assert "    or: " in c.stderr and "more nodes" in c.stderr, c.stderr


# A stand-in for PyTorch's CUDA graphs on the fake driver (the real torch cannot
# load beside the fake CUPTI): torch.cuda.CUDAGraph captures on the current
# stream, instantiates at capture_end and destroys its template, as torch does
# with keep_graph=False; its folder is under "site-packages" (library code, as
# torch's is).
FAKE_TORCH = {
    "torch/__init__.py": "from . import cuda\n",
    "torch/cuda/__init__.py": '''
from .graphs import CUDAGraph, graph
class _Stream:
    def __init__(self, h):
        self.cuda_stream = h
current = [0]
def current_stream():
    return _Stream(current[0])
''',
    "torch/cuda/graphs.py": '''
import ctypes
from fake_cuda.child import fake
import torch.cuda as _cuda
class CUDAGraph:
    def __init__(self, keep_graph=False):
        self._exec = 0
    def capture_begin(self):
        assert fake.fake_begin_capture(_cuda.current[0]) == 0
    def capture_end(self):
        g = ctypes.c_size_t()
        assert fake.fake_end_capture(_cuda.current[0], ctypes.byref(g)) == 0
        self._exec = g.value
        fake.fake_graph_destroy(g.value)
    def raw_cuda_graph_exec(self):
        return self._exec
    def replay(self):
        return fake.fake_graph_launch(self._exec, _cuda.current[0])
    def reset(self):
        if self._exec:
            fake.fake_graph_exec_destroy(self._exec)
        self._exec = 0
    def __del__(self):
        self.reset()
class graph:
    def __init__(self, g):
        self.g = g
    def __enter__(self):
        self.g.capture_begin()
    def __exit__(self, *exc):
        self.g.capture_end()
''',
}


def _fake_torch(tmp_path):
    root = tmp_path / "site-packages"
    for name, text in FAKE_TORCH.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(root)


ADOPT = PRE + '''
FAULT = sys.argv[2]
sys.path.insert(0, sys.argv[1])
import gc
import torch                                  # after cuda_debug: the import hook wraps it
torch.cuda.current[0] = s
out = {"wrapped": getattr(torch.cuda.CUDAGraph.capture_end, "_cuda_debug", False)}
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):  # CAPTURED
    for i in range(3):
        fake.fake_launch(b"pre_ok_%d" % i, s, *L)
    fake.fake_launch(b"pre_bad", s, *L)  # BAD LAUNCH
    fake.fake_launch(b"pre_ok_4", s, *L)
g.replay()
assert fake.fake_stream_sync(s) == 0
out["subscribes"] = _core.stats()["subscribes"]          # CUPTI untouched outside watch()
out["graphs"] = cuda_debug._graphs.stats()
if FAULT == "assert":
    fake.fake_set_kernel(b"pre_bad", 710, 1, b"idx < n", -1, 0)
elif FAULT == "address":
    fake.fake_set_kernel(b"pre_bad", 700, 0, None, 0, 0)
try:
    with cuda_debug.watch():
        g.replay()  # REPLAYED
        cuda_debug.check()
        out["token"] = _core.graph_exec_token(g.raw_cuda_graph_exec())
except cuda_debug.CudaError as e:
    out.update(describe(e))
if FAULT == "none":
    del g
    gc.collect()
    st = _core.graph_stats()
    out["after"] = dict(captures=st["captures"], execs=st["execs"],
                        released=cuda_debug._graphs.stats()["released"])
report(out)
'''


def test_a_torch_graph_captured_before_watch_is_named_by_the_device_text(fake_child, tmp_path):
    """A graph torch captured while nothing watched (no markers, no CUPTI):
    its kernels are read at the end of its capture (the driver's graph API), so
    the device's assert text names the node: kernel, node number, the line that
    launched it during the capture (not the capture's `with` line), the replay
    line."""
    c = _memop(fake_child)(ADOPT, args=[_fake_torch(tmp_path), "assert"])
    r = c.result
    assert r is not None, c
    assert r["wrapped"] is True and r["subscribes"] == 0, r
    assert r["graphs"] == {"adopted": 1, "paired": 1, "released": 0, "failed": 0}, r
    assert r["cls"] == "DeviceAssertError" and r["kernel"] == "pre_bad" and r["node"] == 3, r
    assert r["exact"] is True, r
    bad, rep = c.line_of("# BAD LAUNCH"), c.line_of("# REPLAYED")
    assert r["captured_at"] == "%s:%d" % (c.script, bad), r
    assert r["filename"] == c.script and r["lineno"] == bad, r
    assert r["replayed_at"] == "%s:%d" % (c.script, rep), r
    assert "captured before watching" in r["note"] and "device's text" in r["note"], r
    assert "culprit (named by the device's text): pre_bad (node 3 of a CUDA graph captured " \
           "before watching; replay launch #" in c.stderr, c.stderr
    assert "captured at %s:%d in <module>\n" % (c.script, bad) in c.stderr, c.stderr
    assert "captured at %s:%d" % (c.script, c.line_of("# CAPTURED")) not in c.stderr, c.stderr
    assert "the line that ended its capture" not in c.stderr, c.stderr


def test_a_torch_graph_captured_before_watch_without_device_text_says_why(fake_child, tmp_path):
    c = _memop(fake_child)(ADOPT, args=[_fake_torch(tmp_path), "address"])
    r = c.result
    assert r is not None, c
    assert r["kernel"] is None and r["node"] is None, r
    assert "names none of its 5 kernel nodes" in r["note"], r
    assert r["lineno"] == c.line_of("# REPLAYED"), r
    assert "a CUDA graph replay (captured before watching: no markers inside it (5 kernel " \
           "nodes, none named by the device's text)" in c.stderr, c.stderr
    # no node named: the graph's own line, where its capture ended
    assert "captured at %s:%d in <module>" % (c.script, c.line_of("# CAPTURED")) in c.stderr


FOLLOW = PRE + '''
HOW = sys.argv[2]
sys.path.insert(0, sys.argv[1])
import torch
torch.cuda.current[0] = s
def layer(i):
    fake.fake_launch(b"pre_ok_%d" % i, s, *L)
def head():
    fake.fake_launch(b"pre_bad", s, *L)  # IN HEAD
tracer = lambda *a: None
out = {}
g = torch.cuda.CUDAGraph()
if HOW == "traced":
    sys.settrace(tracer)
elif HOW == "unseen":                         # its beginning not through capture_begin
    torch.cuda.CUDAGraph.capture_begin.__wrapped__(g)
if HOW != "unseen":
    g.capture_begin()
for i in range(3):
    layer(i)
head()  # CALLS HEAD
g.capture_end()  # ENDED
if HOW == "traced":
    out["tracer_kept"] = sys.gettrace() is tracer
    sys.settrace(None)
out["events"] = _core.graph_stats()["adopt_events"]
for i in range(50):                           # after the capture: not followed
    layer_free = i * 2
out["events_after"] = _core.graph_stats()["adopt_events"]
fake.fake_set_kernel(b"pre_bad", 710, 1, b"idx < n", -1, 0)
try:
    with cuda_debug.watch():
        g.replay()  # REPLAYED
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e))
out["lines"] = [_core.graph_node_line(n) for n in range(4)   # the only capture: nodes 0-3
                if _core.graph_node(n) is not None]
out["note"] = cuda_debug._graph_names.line_note(3)
report(out)
'''


def test_each_node_of_a_graph_captured_before_watch_has_its_own_launch_line(fake_child,
                                                                             tmp_path):
    """The capture is followed from torch's capture_begin to capture_end (a
    trace function on the capturing thread reads the graph's node count at each
    event of a user frame): the faulting node is named at the line that launched
    it, the innermost user frame then (inside the user's function head(), not
    the line that called it, nor where the capture ended); once the capture
    ends nothing is followed."""
    c = _memop(fake_child)(FOLLOW, args=[_fake_torch(tmp_path), "followed"])
    r = c.result
    assert r is not None, c
    assert r["kernel"] == "pre_bad" and r["node"] == 3 and r["exact"] is True, r
    inside = "%s:%d" % (c.script, c.line_of("# IN HEAD"))
    assert r["captured_at"] == inside + " in head", r
    assert "captured at %s in head\n" % inside in c.stderr, c.stderr
    assert r["events"] > 0 and r["events_after"] == r["events"], r
    assert r["lines"] == [0] * 4 and r["note"] is None, r    # ADOPT_LINE_OWN, every node


@pytest.mark.parametrize("how, why", [("traced", "a tracer (a debugger, coverage) was set"),
                                      ("unseen", "the capture's beginning was not seen")])
def test_a_node_whose_launch_line_is_unknown_says_why(fake_child, tmp_path, how, why):
    """With a tracer set (a debugger, coverage: never replaced), or a capture
    begun other than by torch's capture_begin, no launch line is followed: the
    node keeps the line that ended the capture, and the report says why."""
    c = _memop(fake_child)(FOLLOW, args=[_fake_torch(tmp_path), how])
    r = c.result
    assert r is not None, c
    assert r["kernel"] == "pre_bad" and r["node"] == 3, r
    ended = "%s:%d" % (c.script, c.line_of("# ENDED"))
    assert r["captured_at"] == "%s  (%s)" % (ended, r["note"]), r      # the exception says why too
    assert r.get("tracer_kept", True) is True, r
    from cuda_debug import _core
    code = _core.ADOPT_LINE_TRACED if how == "traced" else _core.ADOPT_LINE_UNSEEN
    assert r["lines"] == [code] * 4, r
    assert r["note"].startswith("the line that ended its capture, not the launch's: " + why), r
    assert "captured at %s in <module>\n    (the line that ended its capture, not the " \
           "launch's: %s" % (ended, why) in c.stderr, c.stderr


def test_an_adopted_graph_is_forgotten_when_its_torch_object_goes(fake_child, tmp_path):
    c = _memop(fake_child)(ADOPT, args=[_fake_torch(tmp_path), "none"])
    r = c.result
    assert r is not None, c
    assert r["token"] > 0, r                                 # its executable was known
    assert r["after"] == {"captures": 0, "execs": 0, "released": 1}, r


def test_torch_graph_annotations_tags_are_in_the_report_when_present(fake_child):
    """A node that torch.cuda.graph_annotations.mark_kernels
    tagged (PyTorch 2.12+, keyed by the driver's node ids for tools, CUDA 13.1+)
    carries its tag in the report; without the tags (or the driver's ids),
    nothing is required and nothing changes."""
    code = PRE + '''
import types
TOOLS = sys.argv[1] == "tools"
fake.fake_tools_ids(1 if TOOLS else 0)
table = {}
mod = types.ModuleType("torch.cuda.graph_annotations")
mod.get_kernel_annotations = lambda: table
sys.modules["torch.cuda.graph_annotations"] = mod
out = {}
try:
    with cuda_debug.watch():
        fake.fake_begin_capture(s)
        for i in range(4):
            fake.fake_launch(b"bad_node" if i == 2 else b"ok_node", s, *L)
        g = end_capture(s)
        got = [_core.graph_node(n) for n in range(64)]
        tid = next(x[3] for x in got if x and x[1] == 2)
        out["tid"] = tid
        if tid:    # remapped to the executable's id, as torch does at instantiation
            table[((tid >> 32) + 1000) << 32 | (tid & 0xFFFFFFFF)] = [{"name": "attention",
                                                                      "layer": 3}]
        fake.fake_set_kernel(b"bad_node", 700, 0, None, 0, 0)
        fake.fake_graph_launch(g, s)
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e), tag=e.graph_annotation)
report(out)
'''
    c = _memop(fake_child)(code, args=["tools"])
    r = c.result
    assert r is not None, c
    assert r["node"] == 2 and r["tid"] > 0, r
    assert r["tag"] == {"name": "attention", "layer": 3}, r
    assert r["text"].startswith("illegal memory access in bad_node, node 2 of a CUDA graph "
                                "(marked 'attention' {layer=3})"), r["text"]
    plain = _memop(fake_child)(code, args=["none"]).result
    assert plain["node"] == 2 and plain["tid"] == 0 and plain["tag"] is None, plain
    assert plain["text"].startswith("illegal memory access in bad_node, node 2 of a CUDA graph\n")


# torch.compile(mode="reduce-overhead") on the fake driver: a stand-in for
# TorchDynamo's frame (`f`, whose code calls __compiled_fn_1), Inductor's
# generated module (in its cache folder: library code; its `call` launches the
# kernel through library frames deeper than a ring record keeps) and Inductor's
# line map (PyCodeCache.stack_frames_for_code), with cudagraph trees' way:
# the graph is recorded during a call of the compiled function.
COMPILED_GRAPH = PRE + '''
import os, types
CACHE = os.environ["TORCHINDUCTOR_CACHE_DIR"]
GEN = os.path.join(CACHE, "ab", "cabcdef.py")
os.makedirs(os.path.dirname(GEN), exist_ok=True)
with open(GEN, "w") as fh:
    fh.write("triton_poi_fused_index_mul_0 = object()\\n"
             "def call(launch):\\n"
             "    return launch(b'triton_poi_fused_index_mul_0')\\n")
gen = {}
exec(compile(open(GEN).read(), GEN, "exec"), gen)
LIB = """
def launcher(name, depth=4):
    if depth:
        return launcher(name, depth - 1)
    return fake.fake_launch(name, S, 1, 1, 1, 32, 1, 1)
def compiled_fn():
    return GEN["call"](launcher)
def replay_fn(g):                              # cudagraph trees' run: the replay
    return fake.fake_graph_launch(g, S)
"""
lib = {"fake": fake, "S": s, "GEN": gen}
exec(compile(LIB, os.path.join(CACHE, "runtime_like.py"), "exec"), lib)
globals()["__compiled_fn_1"] = lib["compiled_fn"]
globals()["__compiled_fn_2"] = lib["replay_fn"]
def f_again(g):                                # what Dynamo runs for f, once recorded
    return __compiled_fn_2(g)                  # RUN
def f():
    return w_index_mul()  # SOURCE
def w_index_mul():
    pass
def f():                                       # DEF: what Dynamo runs for f
    return __compiled_fn_1()                   # GRAPH
linemap = types.ModuleType("torch._inductor.codecache")
class PyCodeCache:
    @staticmethod
    def stack_frames_for_code(path, lineno):
        assert path == GEN and lineno == 3, (path, lineno)
        return [{"filename": __file__, "line": SOURCE_LINE, "name": "f"}]
linemap.PyCodeCache = PyCodeCache
sys.modules["torch._inductor.codecache"] = linemap
SOURCE_LINE = next(i for i, line in enumerate(open(__file__), 1) if "# SOURCE" in line)
out = {}
try:
    with cuda_debug.watch():
        fake.fake_begin_capture(s)
        f()                                    # CALL: the recording
        g = end_capture(s)
        fake.fake_graph_launch(g, s)
        fake.fake_stream_sync(s)
        fake.fake_set_kernel(b"triton_poi_fused_index_mul_0", 710, 1,
                             b"index out of bounds: 0 <= tmp4 < 100", -1, 0)
        f_again(g)  # REPLAYED
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e), recorded_at=e.recorded_at, provenance=e.provenance)
report(out)
'''


def test_a_node_torch_compile_captured_names_the_source_line_inductor_fused(fake_child, tmp_path):
    """A node of a graph that torch.compile's cudagraph trees recorded keeps its
    innermost frames: the generated code's line, Inductor's line map, the source
    line. (It was once "captured at" the call that recorded it, with "Inductor's
    generated code for this kernel was not found": the ring record keeps 4
    frames; the generated module's is deeper.)"""
    cache = tmp_path / "torchinductor_test"
    cache.mkdir()
    c = _memop(fake_child)(COMPILED_GRAPH, env={"TORCHINDUCTOR_CACHE_DIR": str(cache)})
    src = c.line_of("# SOURCE")
    r = c.result
    assert r is not None, c
    assert r["kernel"] == "triton_poi_fused_index_mul_0" and r["node"] == 0, r
    assert r["filename"] == c.script and r["lineno"] == src, r
    assert r["captured_at"] == "%s:%d in f" % (c.script, src), r
    assert r["recorded_at"] == "%s:%d" % (c.script, c.line_of("# CALL")), r
    assert r["replayed_at"] == "%s:%d" % (c.script, c.line_of("# REPLAYED")), r
    assert "fused up to %s:%d in f" % (c.script, src) in r["provenance"], r
    assert "Inductor fused this line into the kernel; torch.compile recorded the graph in " \
           "the call at %s:%d" % (c.script, c.line_of("# CALL")) in r["text"], r["text"]
    # never the line of the frame TorchDynamo ran (its file is the user's)
    assert "%s:%d" % (c.script, c.line_of("# GRAPH")) not in r["recorded_at"] + r["replayed_at"]
    assert "%s:%d" % (c.script, c.line_of("# RUN")) not in r["text"], r["text"]


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# Markers inside CUDA graphs, and a context reset, on a real GPU.
#
# Each program runs in its own Python (a sticky fault kills the CUDA context of
# its process), with a timeout, and reports what it caught as JSON. The fault in
# a graph is made the way users meet it: the graph is captured and replayed
# with good data, then a bad index is copied into its static input and the
# graph replayed again.
# ======================================================================================


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


@pytest.mark.gpu
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


@pytest.mark.gpu
def test_fork_join_capture_gives_the_frontier_on_a_gpu(child):
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
    # (3 or 4) is no candidate (as on the fake driver, graphs/test_graph_markers.py)
    assert r["exact"] is True and r["candidates"] == [], r
    assert r["replayed_at"] == _where(c, "# REPLAY"), r


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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
