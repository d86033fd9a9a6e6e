"""Reports you can trust (SPEC 6), on a real GPU, in child processes: the
traceback ends at the launching line, swallowed faults keep their line, two
threads each get their own report, hostile thread names, faults before a
scope, the report written at fault time, generated code is library code."""
import pytest

from conftest import needs

pytestmark = pytest.mark.gpu

CATCH = """
import cuda_debug, traceback
def describe(e):
    tb = traceback.extract_tb(e.__traceback__)
    return dict(cls=type(e).__name__, code=e.code, kernel=e.kernel, filename=e.filename,
                lineno=e.lineno, text=str(e), before=e.before_scope,
                tb_last=[tb[-1].filename, tb[-1].lineno] if tb else None,
                tb_lines=[f.lineno for f in tb if f.filename == __file__],
                device_message=e.device_message, consequences=e.consequences)
"""


@pytest.mark.parametrize("form", ["with", "decorator"])
def test_traceback_ends_at_the_launching_line(child, form):
    needs("torch")
    body = """
import torch, torch.nn.functional as F
logits = torch.randn(4, 3, device="cuda")
target = torch.tensor([0, 1, 7, 2], device="cuda")
torch.cuda.synchronize()
def step():
    return F.cross_entropy(logits, target)  # LAUNCH
"""
    if form == "with":
        body += """
try:
    with cuda_debug.launch_blocking():
        step()
except cuda_debug.CudaError as e:
    report(describe(e))
"""
    else:
        body += """
step = cuda_debug.launch_blocking()(step)
try:
    step()
except cuda_debug.CudaError as e:
    report(describe(e))
"""
    c = child(CATCH + body)
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError" and r["lineno"] == c.line_of("# LAUNCH"), r
    assert c.line_of("# LAUNCH") == r["tb_lines"][-1], r      # the printed traceback ends there


def test_swallowed_fault_names_its_line(child):
    needs("torch")
    c = child(CATCH + """
import torch
x = torch.zeros(4, device="cuda")
i = torch.tensor([9], device="cuda")
torch.cuda.synchronize()
try:
    with cuda_debug.launch_blocking():
        try:
            y = x[i]  # LAUNCH
        except Exception:
            pass
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    assert r is not None, c
    assert r["lineno"] == c.line_of("# LAUNCH"), r


def test_two_threads_in_scopes_each_get_their_report(child):
    needs("torch")
    c = child(CATCH + """
import threading, time, torch
import cuda_debug.testing as t
out = {}
go = threading.Event()
def faulty():
    try:
        with cuda_debug.launch_blocking():
            go.wait()
            t.device_assert()  # LAUNCH
    except BaseException as e:
        out["faulty"] = describe(e) if isinstance(e, cuda_debug.CudaError) else repr(e)
def healthy():
    x = torch.ones(1 << 20, device="cuda")
    try:
        with cuda_debug.launch_blocking():
            go.set()
            for _ in range(2000):
                x.add_(1)
    except BaseException as e:
        out["healthy"] = describe(e) if isinstance(e, cuda_debug.CudaError) else repr(e)
a, b = threading.Thread(target=faulty), threading.Thread(target=healthy)
a.start(); b.start(); a.join(); b.join()
report(out)
""")
    r = c.result
    assert r is not None, c
    f = r["faulty"]
    assert isinstance(f, dict) and f["cls"] == "DeviceAssertError", r
    assert "check_index" in f["kernel"] and f["lineno"] == c.line_of("# LAUNCH"), f
    assert "Assertion" in (f["device_message"] or ""), f
    h = r.get("healthy")
    assert isinstance(h, dict) and h["cls"] == "DeviceAssertError", r   # the cause, named
    assert "check_index" in (h["kernel"] or ""), h


def test_a_thread_meeting_another_threads_index_assert_names_that_kernel(child):
    """Another thread's fault is named (3 of 3 runs named ours before): thread A in launch_blocking() indexes
    out of range (PyTorch's index kernel: its assert prints "operator()");
    thread B, in its own launch_blocking(), runs x * 2 until its wait finds
    the context dead. B's report names A's index kernel and A's line and says
    where B met it, never B's MulFunctor kernel with A's text."""
    needs("torch")
    c = child(CATCH + """
import threading, torch
out = {}
go = threading.Event()
x = torch.zeros(1 << 20, device="cuda")
i = torch.tensor([1 << 22], device="cuda")
y = torch.ones(1 << 24, device="cuda")
torch.cuda.synchronize()
def faulty():
    try:
        with cuda_debug.launch_blocking():
            go.wait()
            x[i]  # LAUNCH_A
    except BaseException as e:
        out["A"] = describe(e) if isinstance(e, cuda_debug.CudaError) else repr(e)
def healthy():
    try:
        with cuda_debug.launch_blocking():
            go.set()
            for _ in range(20000):
                y * 2  # LAUNCH_B
    except BaseException as e:
        out["B"] = dict(describe(e), met_by=e.met_by) if isinstance(e, cuda_debug.CudaError) \
            else repr(e)
a, b = threading.Thread(target=faulty), threading.Thread(target=healthy)
a.start(); b.start(); a.join(); b.join()
report(out)
""")
    r = c.result
    assert r is not None, c
    a, b = r.get("A"), r.get("B")
    assert isinstance(a, dict) and a["cls"] == "DeviceAssertError", r
    assert "index" in a["kernel"] and a["lineno"] == c.line_of("# LAUNCH_A"), a
    assert isinstance(b, dict) and b["cls"] == "DeviceAssertError", r
    assert "MulFunctor" not in (b["kernel"] or ""), b
    assert b["kernel"] == a["kernel"] and b["lineno"] == c.line_of("# LAUNCH_A"), b
    assert "index out of bounds" in (b["device_message"] or ""), b
    assert "user_script.py:%d" % c.line_of("# LAUNCH_B") in (b["met_by"] or ""), b
    print(b["text"])                  # the two-thread report, for the lead's note


def test_thread_name_cut_inside_utf8(child):
    c = child(CATCH + """
import ctypes, threading
import cuda_debug.testing as t
libc = ctypes.CDLL(None)
out = {}
def work():
    libc.prctl(15, "ééééééé€".encode()[:15])    # PR_SET_NAME, cut inside a character
    try:
        with cuda_debug.launch_blocking():
            t.device_assert()  # LAUNCH
    except cuda_debug.CudaError as e:
        out.update(describe(e)); out["thread"] = "\\ufffd" in e.thread or "é" in e.thread
th = threading.Thread(target=work); th.start(); th.join()
report(out)
""")
    r = c.result
    assert r is not None and r["cls"] == "DeviceAssertError", c
    assert r["lineno"] == c.line_of("# LAUNCH") and r["thread"], r


def test_fault_before_a_scope_is_not_blamed_on_it(child):
    c = child(CATCH + """
import cuda_debug.testing as t
t.spin(0.2)
t.device_assert()  # EARLIER
try:
    with cuda_debug.launch_blocking():  # ENTER
        t.empty()
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError" and r["before"] is True, r
    assert "before this scope" in r["text"], r["text"]
    assert "CUPTI" not in r["text"]


def test_report_written_at_fault_time_survives_os_exit(child):
    c = child("""
import os, cuda_debug, cuda_debug.testing as t
with cuda_debug.launch_blocking():
    try:
        t.device_assert()  # LAUNCH
    except Exception:
        os._exit(7)
""")
    assert c.returncode == 7, c
    assert "cuda_debug: device-side assert (CUDA_ERROR_ASSERT) in check_index<int>" in c.stderr, c
    assert "launched at %s:%d" % (c.script, c.line_of("# LAUNCH")) in c.stderr, c.stderr
    assert "Assertion `idx[i] >= 0 && idx[i] < limit` failed." in c.stderr
    silenced = child(c.source.split("\n", 2)[2], env={"CUDA_DEBUG_REPORT": "0"})
    assert "cuda_debug: device-side assert" not in silenced.stderr, silenced


COMPILED = """
import torch
@torch.compile
def f(x, i):
    return (x[i] * 2).sum()  # SOURCE
x = torch.randn(100, device="cuda")
i = torch.tensor([5], device="cuda")
f(x, i)
torch.cuda.synchronize()
i.fill_(500)
try:
    with cuda_debug.%s():
        f(x, i)  # LAUNCH
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    report(dict(describe(e), compiled=e.compiled_function))
"""


@pytest.mark.parametrize("scope", ["launch_blocking", "watch"])
def test_torch_compile_names_the_call_and_the_compiled_function(child, scope):
    """A bad index inside a torch.compile'd function is located at the call
    line (once: the @torch.compile line, TorchDynamo's frame), the compiled
    function named, and the source line Inductor's line map gives (the last
    node the kernel fused: the same line here) or "source line unknown"; never the decorator or def line, never Inductor's generated code."""
    needs("torch")
    c = child(CATCH + COMPILED % scope, timeout=300)
    r = c.result
    assert r is not None, c
    assert r["kernel"].startswith("triton_"), r
    assert r["filename"] == c.script and r["lineno"] == c.line_of("# LAUNCH"), r
    assert r["compiled"] == "f", r
    head = "\n  torch.compile: inside torch.compile'd f (%s:" % c.script
    assert head in r["text"], r["text"]
    source = "fused up to %s:%d in f:  return (x[i] * 2).sum()  # SOURCE (Inductor's line map)" \
        % (c.script, c.line_of("# SOURCE"))
    assert source in r["text"] or "source line unknown" in r["text"], r["text"]
    # Inductor's source nodes: from the generated module in the launching stack
    # (launch_blocking); the watch ring keeps 4 frames, so there the loaded
    # module that defines the kernel is looked up (or its absence said)
    assert "Source Nodes: [" in r["text"] or (
        scope == "watch" and "generated code for this kernel was not found" in r["text"]), \
        r["text"]
    for marker in ("@torch.compile", "def f(x, i)"):
        assert "%s:%d in " % (c.script, c.line_of(marker)) not in r["text"] + c.stderr, \
            (marker, r["text"], c.stderr)
    # the fd-2 block written at the fault names the call too
    assert "launched at %s:%d in <module>, inside torch.compile'd f" % (
        c.script, c.line_of("# LAUNCH")) in c.stderr, c.stderr


LATER = """
import torch, torch.nn.functional as F
logits = torch.randn(4, 3, device="cuda")
target = torch.tensor([0, 1, 7, 2], device="cuda")
torch.cuda.synchronize()
def training_step():
    return F.cross_entropy(logits, target)  # LAUNCH
def fit():
    try:
        training_step()
    except BaseException:
        torch.cuda.synchronize()  # TEARDOWN: the dead context raises again
        raise
try:
    with cuda_debug.launch_blocking():
        fit()
except cuda_debug.CudaError as e:
    report(dict(describe(e), later=e.later_exception, cause=type(e.__cause__).__name__,
                context=type(e.__context__).__name__))
"""


def test_a_later_exception_from_teardown_is_a_consequence(child):
    """A second error in a teardown, as Lightning's trainer.fit raises it: the teardown in
    the except block meets the dead context and raises again. The traceback
    still ends at the launching line; the cause is torch's error from the
    launch; the later one is named as a consequence."""
    needs("torch")
    c = child(CATCH + LATER)
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError" and r["lineno"] == c.line_of("# LAUNCH"), r
    assert c.line_of("# LAUNCH") in r["tb_lines"], r
    assert c.line_of("# TEARDOWN") not in r["tb_lines"], r
    assert r["cause"] == "AcceleratorError" and r["context"] == "AcceleratorError", r
    # named where it was raised: torch.cuda.synchronize, called by the teardown
    assert r["later"] and r["later"].startswith("torch.AcceleratorError: CUDA error"), r
    assert r["later"].endswith(" in synchronize"), r
    assert "\n  later: torch.AcceleratorError: CUDA error" in r["text"], r["text"]
    assert " in synchronize, while handling this fault: a consequence, not the cause" in \
        r["text"], r["text"]
