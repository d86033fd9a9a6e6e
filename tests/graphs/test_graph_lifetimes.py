"""Many graphs, for days, on the fake driver (CPU): the executable table and the
marker pool stay bounded and right.

Serving engines keep a graph per batch size and recapture (recompiles, new
shapes) for as long as they run. The executable table (csrc/capture/
graph_execs.c) frees an entry when its executable is destroyed and finds one
in a few reads however many came and went; a capture's markers
(csrc/capture/graph_pool.c) go back to the pool when its graph and every
executable made from it are destroyed, so a process that captures and
destroys graphs for ever stays watched. In the fake driver a graph is its own
executable; it is freed once both are destroyed.
"""
import pytest

PRE = '''
import ctypes
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core
t.empty()
L = (1, 1, 1, 32, 1, 1)
def end_capture(s):
    g = ctypes.c_size_t()
    assert fake.fake_end_capture(s, ctypes.byref(g)) == 0
    return g.value
def destroy(g):                        # as torch does: the graph after instantiation, then the exec
    assert fake.fake_graph_destroy(g) == 0 and fake.fake_graph_exec_destroy(g) == 0
def describe(e):
    return dict(cls=type(e).__name__, kernel=e.kernel, node=e.graph_node, exact=e.exact,
                lineno=e.lineno, note=e.graph_note, replayed_at=e.replayed_at)
s = fake.fake_stream_create()
'''

ENV = {"CUDA_DEBUG_GRAPH_MARKERS": "memop", "CUDA_DEBUG_GRAPH_MARKER_EVERY": "1"}


def test_a_hundred_graphs_replayed_in_turn_each_names_its_own_node(fake_child):
    """100 graphs (one per "batch size"), replayed round after round; the
    fault is in graph 73's node 5: that node, exactly, with its own replay line;
    the table holds 100 executables, each found within a few entries."""
    c = fake_child(PRE + '''
graphs = []
with cuda_debug.watch():
    for b in range(100):
        fake.fake_begin_capture(s)
        for i in range(8):
            fake.fake_launch(b"k_b%d_n%d" % (b, i), s, *L)
        graphs.append(end_capture(s))
    for rnd in range(3):
        for g in graphs:
            fake.fake_graph_launch(g, s)
    assert fake.fake_stream_sync(s) == 0
    stats = _core.graph_stats()
    fake.fake_set_kernel(b"k_b73_n5", 700, 0, None, 0, 0)
    out = dict(stats={k: stats.get(k) for k in ("execs", "exec_reach", "captures", "execs_refused")})
    try:
        for g in graphs[:74]:
            fake.fake_graph_launch(g, s)  # REPLAYED
        cuda_debug.check()
    except cuda_debug.CudaError as e:
        out.update(describe(e))
report(out)
''', env=ENV)
    r = c.result
    assert r is not None, c
    assert r["stats"]["execs"] == 100 and r["stats"]["captures"] == 100, r
    assert r["stats"]["execs_refused"] == 0 and 1 <= r["stats"]["exec_reach"] <= 4, r
    assert r["kernel"] == "k_b73_n5" and r["node"] == 5 and r["exact"] is True, r
    assert r["note"] is None and r["replayed_at"] == "%s:%d" % (c.script, c.line_of("# REPLAYED"))


def test_executables_are_freed_so_the_ten_thousandth_graph_is_named(fake_child):
    """A destroyed executable's entry is freed (once it was kept: after 4,096
    executables new graphs went unnamed and every graph launch read all 4,096
    entries). 10,000 graphs made and destroyed in turn, then one faults."""
    c = fake_child(PRE + '''
out = {}
with cuda_debug.watch():
    for b in range(10000):
        fake.fake_begin_capture(s)
        fake.fake_launch(b"k", s, *L)
        g = end_capture(s)
        fake.fake_graph_launch(g, s)
        fake.fake_stream_sync(s)
        destroy(g)
    st = _core.graph_stats()
    out["after"] = {k: st.get(k) for k in ("execs", "exec_reach", "captures", "captures_freed",
                                       "chunks_used", "execs_refused")}
    fake.fake_begin_capture(s)
    for i in range(6):
        fake.fake_launch(b"bad_node" if i == 4 else b"ok_node", s, *L)
    g = end_capture(s)
    fake.fake_set_kernel(b"bad_node", 700, 0, None, 0, 0)
    try:
        fake.fake_graph_launch(g, s)
        cuda_debug.check()
    except cuda_debug.CudaError as e:
        out.update(describe(e))
report(out)
''', env=ENV, timeout=180)
    r = c.result
    assert r is not None, c
    assert r["after"] == {"execs": 0, "exec_reach": 0, "captures": 0, "captures_freed": 10000,
                          "chunks_used": 0, "execs_refused": 0}, r
    assert r["kernel"] == "bad_node" and r["node"] == 4, r
    assert r["exact"] is True and r["note"] is None, r        # found by its executable


def test_markers_of_destroyed_graphs_are_recycled_through_ten_pools(fake_child):
    """Ten times the node pool (1,310,720 marked nodes) captured, replayed and
    destroyed in turn, 32,768 at a time: every node marked; then a fault in a
    new graph is named exactly. Before: after 131,072 marked nodes per process
    new captures replayed unmarked."""
    c = fake_child(PRE + '''
NODES = _core.GRAPH_NODES
out = {}
with cuda_debug.watch():
    for rnd in range(40):
        fake.fake_begin_capture(s)
        assert fake.fake_launch_n(b"k", s, NODES // 4) == 0
        g = end_capture(s)
        fake.fake_graph_launch(g, s)
        assert fake.fake_stream_sync(s) == 0
        destroy(g)
    st = _core.graph_stats()
    out["stats"] = {k: st.get(k) for k in ("nodes_marked", "nodes_unmarked", "captures",
                                       "chunks_used", "captures_untracked")}
    fake.fake_begin_capture(s)
    for i in range(100):
        fake.fake_launch(b"bad_node" if i == 77 else b"ok_node", s, *L)
    g = end_capture(s)
    fake.fake_set_kernel(b"bad_node", 700, 0, None, 0, 0)
    try:
        fake.fake_graph_launch(g, s)
        cuda_debug.check()
    except cuda_debug.CudaError as e:
        out.update(describe(e))
out["nodes"] = NODES
report(out)
''', env=ENV, timeout=600)
    r = c.result
    assert r is not None, c
    assert r["stats"] == {"nodes_marked": 10 * r["nodes"], "nodes_unmarked": 0, "captures": 0,
                          "chunks_used": 0, "captures_untracked": 0}, r
    assert r["kernel"] == "bad_node" and r["node"] == 77 and r["exact"] is True, r


def test_a_live_graph_keeps_its_markers_while_others_come_and_go(fake_child):
    """A graph captured first and kept is still named after the pool was
    recycled around it many times (its chunks are never handed out again),
    and a graph whose executable lives on after its graph was destroyed keeps
    its markers too."""
    c = fake_child(PRE + '''
NODES = _core.GRAPH_NODES
out = {}
with cuda_debug.watch():
    fake.fake_begin_capture(s)
    for i in range(10):
        fake.fake_launch(b"keep_bad" if i == 3 else b"keep_ok", s, *L)
    kept = end_capture(s)
    assert fake.fake_graph_destroy(kept) == 0         # the graph goes, its executable stays
    for rnd in range(12):
        fake.fake_begin_capture(s)
        assert fake.fake_launch_n(b"churn", s, NODES // 4) == 0
        g = end_capture(s)
        fake.fake_graph_launch(g, s)
        fake.fake_stream_sync(s)
        destroy(g)
    fake.fake_graph_launch(kept, s)
    assert fake.fake_stream_sync(s) == 0
    fake.fake_set_kernel(b"keep_bad", 700, 0, None, 0, 0)
    try:
        fake.fake_graph_launch(kept, s)
        cuda_debug.check()
    except cuda_debug.CudaError as e:
        out.update(describe(e))
report(out)
''', env=ENV, timeout=300)
    r = c.result
    assert r is not None, c
    assert r["kernel"] == "keep_bad" and r["node"] == 3 and r["exact"] is True, r


def test_sparse_markers_name_the_k_candidates_and_the_device_text_picks(fake_child):
    """CUDA_DEBUG_GRAPH_MARKER_EVERY=8: a marker behind every 8th launch; a
    fault in node 21 leaves nodes 16..23 as candidates (the markers of 15 set,
    of 23 missing), in capture order, not exact; with the device's assert text
    naming the kernel, that node, exactly."""
    code = PRE + '''
import sys
ASSERT = sys.argv[1] == "assert"
out = {}
try:
    with cuda_debug.watch():
        fake.fake_begin_capture(s)
        for i in range(30):
            fake.fake_launch(b"bad_node" if i == 21 else b"ok_%d" % i, s, *L)  # CAPTURED
        g = end_capture(s)
        out["marked"] = _core.graph_stats()["nodes_marked"]
        fake.fake_graph_launch(g, s)
        fake.fake_stream_sync(s)
        if ASSERT:
            fake.fake_set_kernel(b"bad_node", 710, 1, b"idx < n", -1, 0)
        else:
            fake.fake_set_kernel(b"bad_node", 700, 0, None, 0, 0)
        fake.fake_graph_launch(g, s)
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(describe(e), candidates=[c["graph_node"] for c in e.candidates], text=str(e))
report(out)
'''
    env = dict(ENV, CUDA_DEBUG_GRAPH_MARKER_EVERY="8")
    plain = fake_child(code, env=env, args=["plain"])
    r = plain.result
    assert r is not None, plain
    assert r["marked"] == 3, r                     # after launches 8, 16, 24 (nodes 7, 15, 23)
    assert r["exact"] is False and r["node"] == 16, r
    assert r["candidates"] == [17, 18, 19, 20, 21, 22, 23], r
    assert "culprit (one of 8 nodes after the last marker written; a marker every 8 nodes)" \
        in plain.stderr, plain.stderr
    named = fake_child(code, env=env, args=["assert"]).result
    assert named is not None
    assert named["kernel"] == "bad_node" and named["node"] == 21 and named["exact"] is True, named
    assert named["lineno"] == plain.line_of("# CAPTURED"), named
