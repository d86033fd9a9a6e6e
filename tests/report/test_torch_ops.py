"""PyTorch-aware reports and living with profilers, without PyTorch or a GPU.

- The ATen operators of a faulting launch, read from the native stack by the
  C fault path (csrc/capture/native_ops.c): the fake driver launches from inside
  functions exported under libtorch's mangled names.
- The call-expression reader that names the tensors of the faulting call
  (_torch_ops.call_inputs), on objects that stand in for tensors.
- Handing CUPTI over to a profiler that starts inside a scope, and the
  ToolConflictError that code without PyTorch still gets.
The GPU side (real torch ops, the dispatch fallback) is at the end of this module.
"""
import pickle
import sys
import types

import pytest

from cuda_debug import _torch_ops
import cuda_debug
from conftest import needs


def test_aten_ops_on_the_native_stack_name_the_op(fake_child):
    c = fake_child('''
        import cuda_debug
        fake.fake_set_kernel(b"indexSelectSmallIndex", 710, 1, b"srcIndex < srcSelectDimSize", -1, 0)
        try:
            with cuda_debug.launch_blocking():
                fake.fake_aten_embedding(b"indexSelectSmallIndex")      # LAUNCH
        except cuda_debug.DeviceAssertError as e:
            report(dict(op=e.op, op_stack=e.op_stack, inputs=e.inputs, text=str(e),
                        lineno=e.lineno, mechanism=e.mechanism))
    ''')
    r = c.result
    assert r is not None, c
    # outermost first; call and redispatch of one op are one entry; the
    # exported look-alike without ::call (at::_ops::embedding::schema) is not an op
    assert r["op_stack"] == ["aten::embedding", "aten::index_select"], r
    assert r["op"] == "aten::embedding" and r["mechanism"] == "cupti"
    assert r["lineno"] == c.line_of("# LAUNCH")
    assert r["inputs"] is None            # no exception passed through the call: nothing to read
    lines = r["text"].splitlines()
    assert lines[0] == "device-side assert in indexSelectSmallIndex"
    assert lines[1] == "  op aten::embedding > aten::index_select", lines
    # on fd 2, the fault-time block, then the ops (the native stack is walked
    # once the block is out: core/test_robust.py says why)
    after = c.stderr[c.stderr.index("cuda_debug: device-side assert"):].splitlines()
    tid = after[2].rsplit("(tid ", 1)[1].rstrip(")")        # the block's thread line
    assert [l for l in after if l.startswith("cuda_debug: op ")] == [
        "cuda_debug: op aten::embedding > aten::index_select (the fault above, thread tid %s)"
        % tid], after


def test_launches_outside_aten_have_no_op(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        try:
            with cuda_debug.launch_blocking():
                t.device_assert()
        except cuda_debug.DeviceAssertError as e:
            report(dict(op=e.op, op_stack=e.op_stack, inputs=e.inputs, text=str(e)))
    ''')
    r = c.result
    assert r is not None, c
    assert r["op"] is None and r["op_stack"] is None and r["inputs"] is None
    assert "  op " not in r["text"] and "  op aten" not in c.stderr


def test_aten_struct_names_without_torch_keep_the_struct(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)   # (imported by other tests)
    assert _torch_ops.aten_name("add_Tensor") == "aten::add_Tensor"
    assert _torch_ops.op_stack(("index_select", "embedding")) == \
        ["aten::embedding", "aten::index_select"]
    assert _torch_ops.op_stack(()) is None


def test_aten_struct_names_resolve_against_the_registry(monkeypatch):
    class Packet:
        def __init__(self, *overloads):
            self._o = list(overloads)

        def overloads(self):
            return self._o

    aten = types.SimpleNamespace(add=Packet("Tensor", "Scalar", "out"), add_=Packet("Tensor"),
                                 index_select=Packet("default"), index=Packet("Tensor"),
                                 sum=Packet("default", "dim_IntList"))
    fake_torch = types.SimpleNamespace(ops=types.SimpleNamespace(aten=aten))
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    assert _torch_ops.aten_name("add_Tensor") == "aten::add.Tensor"
    assert _torch_ops.aten_name("add__Tensor") == "aten::add_.Tensor"
    assert _torch_ops.aten_name("index_select") == "aten::index_select"   # not index.select
    assert _torch_ops.aten_name("sum_dim_IntList") == "aten::sum.dim_IntList"
    assert _torch_ops.aten_name("no_such_op") == "aten::no_such_op"


# -- the tensors of the faulting call ------------------------------------------

class FakeTensor:
    def __init__(self, *shape, dtype="float32"):
        self.shape, self.dtype, self.device = shape, dtype, "cuda:0"


def fake_meta(name, value):
    if isinstance(value, FakeTensor):
        return {"name": name, "shape": value.shape, "dtype": value.dtype, "device": value.device}
    return None


class Module:                              # nn.Module keeps parameters in a table
    def __init__(self):
        self._parameters = {"weight": FakeTensor(10, 4)}

    def __getattr__(self, name):
        try:
            return self.__dict__["_parameters"][name]
        except KeyError:
            raise AttributeError(name) from None


def _tb_of(fn):
    try:
        fn()
    except Exception as e:
        return e.__traceback__
    raise AssertionError("did not raise")


needs_positions = pytest.mark.skipif(sys.version_info < (3, 11),
                                     reason="instruction positions (co_positions) are Python 3.11+")


@needs_positions
@pytest.mark.parametrize("case", ["call", "method_attr", "subscript", "binop", "starred",
                                  "multiline", "keywords"])
def test_call_inputs_reads_the_operands_of_the_faulting_call(monkeypatch, case):
    monkeypatch.setattr(_torch_ops, "tensor_meta", fake_meta)
    m = Module()
    idx = FakeTensor(2, dtype="int64")
    pair = (m._parameters["weight"], idx)
    w = m._parameters["weight"]
    calls = {
        # builtins that raise from C: the traceback's innermost frame is this one
        "call": lambda: divmod(m.weight, idx),
        "method_attr": lambda: divmod(m.weight, 3),
        "subscript": lambda: w[idx],
        "binop": lambda: w + idx,
        "starred": lambda: divmod(*pair),
        "multiline": lambda: divmod(
            w,
            idx),
        "keywords": lambda: sorted(w, key=idx),
    }
    got = _torch_ops.call_inputs(_tb_of(calls[case]))
    names = [(i["name"], i["shape"], i["dtype"]) for i in got or []]
    want = {
        "call": [("m.weight", (10, 4), "float32"), ("idx", (2,), "int64")],
        "method_attr": [("m.weight", (10, 4), "float32")],
        "subscript": [("w", (10, 4), "float32"), ("idx", (2,), "int64")],
        "binop": [("w", (10, 4), "float32"), ("idx", (2,), "int64")],
        "starred": [("*pair[0]", (10, 4), "float32"), ("*pair[1]", (2,), "int64")],
        "multiline": [("w", (10, 4), "float32"), ("idx", (2,), "int64")],
        "keywords": [("w", (10, 4), "float32"), ("idx", (2,), "int64")],
    }[case]
    assert names == want, (case, got)


@needs_positions
def test_call_inputs_runs_no_code(monkeypatch):
    monkeypatch.setattr(_torch_ops, "tensor_meta", fake_meta)
    calls = []

    class Holder:
        @property
        def tensor(self):
            calls.append(1)
            return FakeTensor(3)

    h = Holder()
    idx = FakeTensor(2, dtype="int64")
    got = _torch_ops.call_inputs(_tb_of(lambda: divmod(h.tensor, idx.shape[0] + len(calls))))
    assert calls == [1]                    # only the faulting call itself ran the property
    assert [i["name"] for i in got or []] == []


def test_call_inputs_without_a_traceback_is_none():
    assert _torch_ops.call_inputs(None) is None


def test_short_report_has_the_op_line_after_the_kernel():
    inputs = [{"name": "weight", "shape": (10, 4), "dtype": "float32", "device": "cuda:0"},
              {"name": "input", "shape": (2,), "dtype": "int64", "device": "cuda:0"}]
    e = cuda_debug.DeviceAssertError(code=710, kernel="void k<float>(float*)",
                                     op="aten::embedding",
                                     op_stack=["aten::embedding", "aten::index_select"],
                                     inputs=inputs, filename="/x/train.py", lineno=3)
    lines = str(e).splitlines()
    assert lines[0] == "device-side assert in k<float>"
    assert lines[1] == "  op aten::embedding(weight: float32[10, 4], input: int64[2] on cuda:0)" \
                       " > aten::index_select"
    back = pickle.loads(pickle.dumps(e))
    assert back.op_stack == e.op_stack and back.inputs == inputs and str(back) == str(e)
    two = [dict(inputs[0]), dict(inputs[1], device="cpu")]
    assert _torch_ops.format_inputs(two) == "weight: float32[10, 4] cuda:0, input: int64[2] cpu"
    # dispatch mechanism: no kernel known, the op is the head
    d = cuda_debug.DeviceAssertError(code=710, op="aten::gather", op_stack=["aten::gather"],
                                     mechanism="dispatch")
    assert str(d).splitlines()[:2] == ["device-side assert in a kernel of aten::gather",
                                       "  op aten::gather"]


# -- CUPTI held, handed over ---------------------------------------------------

def test_without_torch_a_held_cupti_is_still_a_tool_conflict(fake_child):
    c = fake_child('''
        import cuda_debug
        fake.fake_hold_cupti(b"CUPTI for <not provided>")      # how Kineto shows up
        try:
            with cuda_debug.launch_blocking():
                pass
        except cuda_debug.ToolConflictError as e:
            report(dict(text=str(e), holder=e.holder, torch="torch" in sys.modules))
    ''')
    r = c.result
    assert r is not None, c
    assert r["torch"] is False
    assert r["holder"] is None                 # a client with no name is not named "<not provided>"
    assert "torch.profiler" in r["text"] and "<not provided>" not in r["text"]


def test_a_profiler_starting_inside_a_scope_gets_cupti(fake_child):
    # torch.autograd.profiler stands in for torch's: the guard wraps its entry
    # points into Kineto while a scope holds CUPTI.
    c = fake_child('''
        import types, warnings
        calls = []
        prof = types.ModuleType("torch.autograd.profiler")
        prof._prepare_profiler = lambda *a: calls.append(("prepare", fake.fake_cupti_enabled(-1)))
        prof._enable_profiler = lambda *a: calls.append(("enable", fake.fake_cupti_enabled(-1)))
        torch = types.ModuleType("torch")
        sys.modules.update({"torch": torch, "torch.autograd.profiler": prof})
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        out = {}
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with cuda_debug.launch_blocking():
                t.empty()
                out["held"] = fake.fake_cupti_enabled(-1)
                prof._prepare_profiler("config", "activities")      # PROFILER
                prof._enable_profiler("config", "activities")
                t.empty()                      # not seen: CUPTI belongs to the profiler now
        out.update(calls=calls, synced=_core.stats()["synced"],
                   hand_overs=_core.stats()["hand_overs"],
                   subscribed_after=fake.fake_cupti_enabled(-1),
                   warnings=[str(w.message) for w in caught])
        report(out)
    ''')
    r = c.result
    assert r is not None, c
    assert r["held"] == 1
    # CUPTI was free when the profiler's own code ran, both times
    assert r["calls"] == [["prepare", 0], ["enable", 0]], r
    assert r["synced"] == 1 and r["hand_overs"] == 1
    assert r["subscribed_after"] == 0
    assert len(r["warnings"]) == 1, r["warnings"]
    w = r["warnings"][0]
    assert "handed to the profiler" in w and "user_script.py:%d" % c.line_of("# PROFILER") in w


# -- watch(ops=True) ----------------------------------------------------------

def test_watch_records_carry_the_threads_op_token(fake_child):
    c = fake_child('''
        import cuda_debug
        from cuda_debug import _core, _report
        with cuda_debug.watch(ops=True):          # no torch here: no recorder, no error
            _core.set_op(1234)
            fake.fake_launch(b"in_an_op", 0, 1, 1, 1, 1, 1, 1)
            _core.set_op(0)
            fake.fake_launch(b"outside_ops", 0, 1, 1, 1, 1, 1, 1)
        fake.fake_ctx_sync()
        recs = [_report.watch_record(s) for s in range(1, _core.watch_seq() + 1)]
        report([(r.kernel.decode(), r.op) for r in recs if r is not None])
    ''')
    assert c.result == [["in_an_op", 1234], ["outside_ops", 0]], c


def test_recorded_op_reads_the_ring_and_knows_when_it_was_overwritten():
    class Arg:
        def __init__(self, name):
            self.name = name

    schema = types.SimpleNamespace(name="aten::embedding", overload_name="",
                                   arguments=[Arg("weight"), Arg("indices"), Arg("padding_idx")])
    func = types.SimpleNamespace(_schema=schema)
    token = 5
    saved = _torch_ops._op_ring[token]
    try:
        _torch_ops._op_ring[token] = (token, func, [(0, (10, 4), "torch.float32", "cuda:0"),
                                                    (1, (2,), "torch.int64", "cuda:0")])
        op, inputs = _torch_ops.recorded_op(token)
        assert op == "aten::embedding"
        assert inputs == [
            {"name": "weight", "shape": (10, 4), "dtype": "float32", "device": "cuda:0"},
            {"name": "indices", "shape": (2,), "dtype": "int64", "device": "cuda:0"}]
        assert _torch_ops.recorded_op(token + _torch_ops._OP_RING) is None   # slot reused
        assert _torch_ops.recorded_op(0) is None
    finally:
        _torch_ops._op_ring[token] = saved


def test_watch_ops_argument_is_strict():
    with pytest.raises(TypeError):
        cuda_debug.watch(ops="yes")
    assert repr(cuda_debug.watch(ops=True)) == "cuda_debug.watch(ops=True)"
    assert repr(cuda_debug.watch()) == "cuda_debug.watch()"


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# PyTorch-aware reports and living with profilers (SPEC 9), on a real GPU, in
# child processes (each fault kills its process's CUDA context).
#
# - A fault in embedding, gather, cross-entropy and indexing names the ATen op
#   (from the native stack at the fault) and the shapes of the tensors the
#   launching call passed (from its live frame), with no per-op hook.
# - After torch.profiler ran (Kineto keeps CUPTI for the rest of the process), a
#   scope falls back to synchronising after every op at the dispatch level and
#   still reports the fault at its line, with the op (``mechanism == "dispatch"``).
# - A profiler started inside a scope records GPU events (CUPTI handed over).
# ======================================================================================


CATCH = """
import warnings
import cuda_debug, torch, torch.nn.functional as F
def describe(e):
    return dict(cls=type(e).__name__, op=e.op, op_stack=e.op_stack, inputs=e.inputs,
                lineno=e.lineno, text=str(e), mechanism=e.mechanism, kernel=e.kernel)
"""

FAULTS = {
    "embedding": ("""
emb = torch.nn.Embedding(10, 4).cuda()
tokens = torch.tensor([1, 12], device="cuda")
def run():
    return emb(tokens)  # LAUNCH
""", "aten::embedding", "aten::index_select", [([10, 4], "float32"), ([2], "int64")]),
    "gather": ("""
x = torch.randn(4, 5, device="cuda")
idx = torch.tensor([[0, 1], [2, 9], [1, 1], [0, 0]], device="cuda")
def run():
    return torch.gather(x, 1, idx)  # LAUNCH
""", "aten::gather", "aten::gather", [([4, 5], "float32"), ([4, 2], "int64")]),
    "cross_entropy": ("""
logits = torch.randn(8, 5, device="cuda")
target = torch.tensor([0, 1, 2, 3, 4, 9, 0, 1], device="cuda")
def run():
    return F.cross_entropy(logits, target)  # LAUNCH
""", None, "aten::nll_loss_forward", [([8, 5], "float32"), ([8], "int64")]),
    "index": ("""
x = torch.randn(10, device="cuda")
idx = torch.tensor([1, 20, 3], device="cuda")
def run():
    return x[idx]  # LAUNCH
""", "aten::index.Tensor", "aten::index.Tensor", [([10], "float32"), ([3], "int64")]),
}


def _check(r, c, outer, inner, shapes):
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError", r
    assert r["lineno"] == c.line_of("# LAUNCH"), r
    if outer:
        assert r["op"] == outer, r
    assert inner in r["op_stack"], r
    got = [(i["shape"], i["dtype"]) for i in r["inputs"] or []]
    for s in shapes:
        assert s in got, (s, r["inputs"])
    assert all(i["device"] == "cuda:0" for i in r["inputs"]), r["inputs"]
    line = r["text"].splitlines()[1]
    assert line.startswith("  op %s(" % r["op"]), r["text"]
    for shape, dtype in shapes:
        assert "%s[%s]" % (dtype, ", ".join(map(str, shape))) in line, line


@pytest.mark.gpu
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_fault_names_the_op_and_input_shapes(child, fault):
    needs("torch")
    body, outer, inner, shapes = FAULTS[fault]
    c = child(CATCH + body + """
torch.cuda.synchronize()
try:
    with cuda_debug.launch_blocking():
        run()
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    _check(r, c, outer, inner, shapes)
    assert r["mechanism"] == "cupti"
    assert "cuda_debug: op aten::" in c.stderr   # the fault-time report names the op too


@pytest.mark.gpu
def test_after_a_profiler_ran_a_scope_falls_back_to_the_dispatch_level(child):
    needs("torch")
    body, outer, inner, shapes = FAULTS["embedding"]
    c = child(CATCH + body + """
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
    emb(torch.tensor([1, 2], device="cuda"))
    torch.cuda.synchronize()
out = {}
@torch.compile
def compiled(a):
    return a.sin() + 1
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with cuda_debug.launch_blocking():          # CUPTI is Kineto's now: falls back
        compiled(torch.randn(8, device="cuda"))
    from torch._dynamo.utils import counters
    out["graphs"] = counters["stats"]["unique_graphs"]
    try:
        with cuda_debug.launch_blocking():
            run()
    except cuda_debug.CudaError as e:
        out.update(describe(e))
out["warnings"] = [str(w.message) for w in caught if "cuda_debug" in str(w.message)]
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["mechanism"] == "dispatch", r
    assert r["cls"] == "DeviceAssertError" and r["lineno"] == c.line_of("# LAUNCH"), r
    assert r["op"] == "aten::embedding", r
    got = [(i["shape"], i["dtype"]) for i in r["inputs"] or []]
    assert ([10, 4], "float32") in got and ([2], "int64") in got, r["inputs"]
    assert "indexSelect" in (r["kernel"] or ""), r          # named by the device's assert text
    assert r["graphs"] >= 1, r                   # torch.compile still compiled inside the scope
    assert len(r["warnings"]) == 1, r["warnings"]           # once per process
    assert "synchronises after every op" in r["warnings"][0]


@pytest.mark.gpu
def test_a_profiler_started_inside_a_scope_records_gpu_events(child):
    needs("torch")
    body, outer, inner, shapes = FAULTS["embedding"]
    c = child(CATCH + body + """
from torch.profiler import profile, ProfilerActivity
from cuda_debug import _core
x = torch.zeros(1, device="cuda")
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with cuda_debug.launch_blocking():
        x.add_(1)
        out["synced_before"] = _core.stats()["synced"]
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:  # PROFILER
            for _ in range(5):
                x.add_(1)
            torch.cuda.synchronize()
    out["gpu_events"] = len([e for e in p.events() if e.device_type.name == "CUDA"])
    try:
        with cuda_debug.launch_blocking():
            run()
    except cuda_debug.CudaError as e:
        out.update(describe(e))
out["warnings"] = [str(w.message) for w in caught if "cuda_debug" in str(w.message)]
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["synced_before"] >= 1, r
    assert r["gpu_events"] >= 5, r
    assert any("handed to the profiler" in w and "user_script.py:%d" % c.line_of("# PROFILER") in w
               for w in r["warnings"]), r["warnings"]
    assert r["mechanism"] == "dispatch" and r["op"] == "aten::embedding", r
    assert r["lineno"] == c.line_of("# LAUNCH"), r


@pytest.mark.gpu
@pytest.mark.parametrize("ops", [True, False])
def test_watch_with_ops_names_the_op_of_the_culprit_launch(child, ops):
    needs("torch")
    body, outer, inner, shapes = FAULTS["embedding"]
    c = child(CATCH + body + """
ops = sys.argv[1] == "1"
y = torch.zeros(4, device="cuda")
try:
    with cuda_debug.watch(ops=ops):
        z = run()
        for _ in range(3):
            y = y * 2 + 1                      # later launches: the fault surfaces below
        y.sum().item()
except cuda_debug.CudaError as e:
    r = describe(e)
    r.update(exact=e.exact)
    report(r)
""", args=["1" if ops else "0"])
    r = c.result
    assert r is not None, c
    assert r["mechanism"] == "watch" and r["exact"] is True, r
    assert r["lineno"] == c.line_of("# LAUNCH"), r
    if not ops:
        assert r["op"] is None and r["inputs"] is None, r
        return
    assert r["op"] == "aten::embedding", r
    got = [(i["name"], i["shape"], i["dtype"]) for i in r["inputs"] or []]
    assert ("weight", [10, 4], "float32") in got and ("indices", [2], "int64") in got, got
    assert r["text"].splitlines()[1].startswith("  op aten::embedding(weight: float32[10, 4]"), \
        r["text"]


@pytest.mark.gpu
def test_dispatch_fallback_reports_a_fault_in_the_backward_thread(child):
    # index_select's backward (index_add_) runs in the autograd thread, with no
    # Python frame; its saved index is made bad after the forward, through
    # .data (no version bump), so only the backward faults.
    needs("torch")
    c = child(CATCH + """
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]):
    torch.zeros(1, device="cuda").add_(1)
warnings.simplefilter("ignore")
x = torch.randn(10, device="cuda", requires_grad=True)
idx = torch.tensor([1, 2], device="cuda")
try:
    with cuda_debug.launch_blocking():
        y = x.index_select(0, idx)
        idx.data[1] = 99
        y.sum().backward()  # LAUNCH
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    assert r is not None, c
    assert r["mechanism"] == "dispatch" and r["cls"] == "DeviceAssertError", r
    assert r["lineno"] == c.line_of("# LAUNCH"), r
    assert r["op"].startswith("aten::index_add"), r


@pytest.mark.gpu
def test_hand_over_while_another_thread_launches_in_its_scope(child):
    # CUPTI is taken away while a worker thread's launches are going through
    # the callback: nothing may crash, hang or lose a launch, and the profiler
    # still records GPU events.
    needs("torch")
    body, outer, inner, shapes = FAULTS["embedding"]
    c = child(CATCH + body + """
import threading, time
from torch.profiler import profile, ProfilerActivity
warnings.simplefilter("ignore")
stop, out = threading.Event(), {}
def worker():
    y, n = torch.zeros(1, device="cuda"), 0
    with cuda_debug.launch_blocking():
        while not stop.is_set():
            y.add_(1)
            n += 1
    torch.cuda.synchronize()
    out.update(n=n, y=y.item())
t = threading.Thread(target=worker)
t.start()
time.sleep(0.3)
x = torch.zeros(1, device="cuda")
with cuda_debug.launch_blocking():
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
        for _ in range(5):
            x.add_(1)
        torch.cuda.synchronize()
time.sleep(0.2)
stop.set()
t.join(60)
out["alive"] = t.is_alive()
out["gpu_events"] = len([e for e in p.events() if e.device_type.name == "CUDA"])
try:
    with cuda_debug.launch_blocking():
        run()
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""", timeout=120)
    r = c.result
    assert r is not None, c
    assert r["alive"] is False and r["n"] > 100 and r["y"] == r["n"], r
    assert r["gpu_events"] >= 5, r
    assert r["mechanism"] == "dispatch" and r["op"] == "aten::embedding", r
    assert r["lineno"] == c.line_of("# LAUNCH"), r
