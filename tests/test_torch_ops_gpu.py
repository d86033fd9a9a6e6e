"""PyTorch-aware reports and living with profilers (SPEC 9), on a real GPU, in
child processes (each fault kills its process's CUDA context).

- A fault in embedding, gather, cross-entropy and indexing names the ATen op
  (from the native stack at the fault) and the shapes of the tensors the
  launching call passed (from its live frame), with no per-op hook.
- After torch.profiler ran (Kineto keeps CUPTI for the rest of the process), a
  scope falls back to synchronising after every op at the dispatch level and
  still reports the fault at its line, with the op (``mechanism == "dispatch"``).
- A profiler started inside a scope records GPU events (CUPTI handed over).
"""
import pytest

from conftest import needs

pytestmark = pytest.mark.gpu

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
