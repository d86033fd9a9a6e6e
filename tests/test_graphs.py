"""Markers inside CUDA graphs, on the fake driver: CPU only.

While watching, a launch captured into a graph gets a node record and a
completion marker captured right behind it (csrc/capture/graph_markers.c);
the capture gets a start marker first and a memset of its slots last, so
every replay starts clear. The fake driver (tests/fake_cuda) records stream
writes and memsets into the graph and runs them at replay, in capture order;
a stream that waits for an event recorded in a capturing stream joins the
capture (fork/join). A kernel's behaviour is looked up at replay, so a "bad
index" can be set between replays, as a bad token copied into a static input.
"""
import signal

import pytest

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
    """Most tests here count the graph's memory-op marker nodes, so they ask for
    them (CUDA_DEBUG_GRAPH_MARKERS=memop); the default, one-thread kernel nodes,
    is test_marker_kernels_instead_of_stream_writes's (and the GPU tests')."""
    def run(code, env=None, **kw):
        return fake_child(code, env=dict({"CUDA_DEBUG_GRAPH_MARKERS": "memop"}, **(env or {})), **kw)
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
    assert r["refused"] == 5, r        # the end-of-capture ids and the resource ids
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
