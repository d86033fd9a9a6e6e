"""One verdict, wherever the error surfaces: against the fake CUDA driver.

- the rule that names the culprit is decided once, in C (report/verdict.c):
  the fd-2 block and the exception name the same candidates in the same
  order, and the block says "named by the device's assert text" where it is;
- a CUDA error raised outside the watch's own ``with`` (another thread,
  caught and logged, re-raised by an executor, uncaught in a thread, raised
  by an outer context manager on its way out) carries the verdict as a note
  (``cuda_debug: DeviceAssertError: ...``) and as ``cuda_debug_error``;
- no note is added to errors that are not CUDA's, and leaving the last watch
  with no fault gives the raise hook back.

Its GPU tests are at the end of this module (torch's own errors, on the device).
"""
import pytest
from conftest import needs

L = "1, 1, 1, 32, 1, 1"

# A "framework": a wait that fails as torch's does (its own exception class and
# words), after the fake driver says the context died.
FRAMEWORK = '''
import cuda_debug, cuda_debug.testing as t
from cuda_debug import _core

class AcceleratorError(RuntimeError):      # torch.AcceleratorError's shape
    pass

def framework_sync():
    rc = _core.synchronize(0)
    if rc:
        raise AcceleratorError("CUDA error: device-side assert triggered\\n"
                               "Search for `cudaErrorAssert' ...")

def bad_request():
    fake.fake_launch(b"embedding_lookup", 0, %s)     # LAUNCH
    framework_sync()

t.empty()
fake.fake_set_kernel(b"embedding_lookup", 710, 1, b"idx < vocab", -1, 0)
''' % L


def _assert_note(text, c):
    assert "cuda_debug: DeviceAssertError: device-side assert in embedding_lookup" in text, text
    assert "%s:%d" % (c.script, c.line_of("# LAUNCH")) in text, text


def test_an_error_caught_and_logged_in_another_thread_carries_the_verdict(fake_child):
    """A server: the main thread watches, a request thread's wait meets the
    fault and the framework raises its own error; the thread catches it and
    logs it with logging.exception: the log names the kernel and the line."""
    c = fake_child(FRAMEWORK + '''
import io, logging, threading
log = io.StringIO()
logging.basicConfig(stream=log, level=logging.INFO)
out = {}
def serve():
    try:
        bad_request()
    except AcceleratorError as e:
        logging.exception("request failed")
        out.update(cls=type(e).__name__, attr=type(getattr(e, "cuda_debug_error", None)).__name__)
with cuda_debug.watch():
    th = threading.Thread(target=serve)
    th.start(); th.join()
out["log"] = log.getvalue()
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["cls"] == "AcceleratorError" and r["attr"] == "DeviceAssertError", r
    _assert_note(r["log"], c)


def test_an_executors_result_and_an_uncaught_thread_error_carry_the_verdict(fake_child):
    """ThreadPoolExecutor.result() re-raises a worker's error in the caller;
    an uncaught error in a plain thread goes to threading.excepthook."""
    c = fake_child(FRAMEWORK + '''
import concurrent.futures, threading, traceback
out = {}
with cuda_debug.watch():
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        try:
            ex.submit(bad_request).result()
        except AcceleratorError as e:
            out["result"] = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    th = threading.Thread(target=framework_sync)      # UNCAUGHT
    th.start(); th.join()
report(out)
''')
    r = c.result
    assert r is not None, c
    _assert_note(r["result"], c)
    hook = c.stderr[c.stderr.index("Exception in thread"):]
    _assert_note(hook, c)


def test_an_outer_context_manager_that_syncs_on_its_way_out_keeps_the_verdict(fake_child):
    """A timer opened before the watch synchronises in its finally and raises
    the framework's error again, replacing the one the watch translated: the
    error that reaches the user still names the kernel and the line."""
    c = fake_child(FRAMEWORK + '''
import contextlib, traceback
@contextlib.contextmanager
def timer():
    try:
        yield
    finally:
        framework_sync()
out = {}
try:
    with timer():
        with cuda_debug.watch():
            bad_request()
except BaseException as e:
    out.update(cls=type(e).__name__,
               text="".join(traceback.format_exception(type(e), e, e.__traceback__)))
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["cls"] == "AcceleratorError", r
    _assert_note(r["text"], c)


def test_no_note_on_other_errors_and_the_hook_is_given_back(fake_child):
    """A RuntimeError that is not CUDA's gets no note while watching; after the
    last watch closes with no fault, nothing is armed."""
    c = fake_child('''
import cuda_debug
from cuda_debug import _notes
out = {}
with cuda_debug.watch():
    out["in"] = _notes.armed()
    try:
        raise RuntimeError("not a CUDA error")
    except RuntimeError as e:
        out["notes"] = getattr(e, "__notes__", None)
out["after"] = _notes.armed()
report(out)
''')
    r = c.result
    assert r is not None, c
    assert r["in"] in ("monitoring", "surfaces") and r["notes"] is None, r
    if r["in"] == "monitoring":
        assert r["after"] is None, r


def test_the_block_and_the_exception_render_one_verdict(fake_child):
    """Four launches, a marker behind every 4th: the culprit is one of them.
    The device's text fits two lambdas; its words pick the gather. The fd-2
    block and the exception name the same kernel first, and the rest in the
    same order."""
    G = b"_ZN2at6native34_scatter_gather_elementwise_kernelIZNS0_6gatherEUliE_EEvv"
    R = b"_ZN2at6native13reduce_kernelIZNS0_3sumEUlffE_EEvv"
    c = fake_child('''
import re
import cuda_debug, cuda_debug.testing as t
t.empty()
fake.fake_set_kernel(%r, 710, 1, b'idx < size && "scatter gather kernel index out of bounds"', -1, 0)
out = {}
try:
    with cuda_debug.watch():
        fake.fake_launch(b"user_k", 0, %s)
        fake.fake_launch(%r, 0, %s)
        fake.fake_launch(%r, 0, %s)
        fake.fake_launch(b"other_k", 0, %s)
        cuda_debug.check()
except cuda_debug.CudaError as e:
    out.update(kernel=e.kernel, named=e.named_by_device)
report(out)
''' % (G, L, R, L, G, L, L))
    r = c.result
    assert r is not None, c
    assert r["named"] is True and "scatter_gather" in (r["kernel"] or ""), r
    block = c.stderr[c.stderr.index("cuda_debug (watch)"):]
    first = [ln for ln in block.splitlines() if "culprit" in ln][0]
    assert "scatter_gather" in first, block
    assert "a guess" not in block, block


@pytest.mark.parametrize("text,expect", [
    (b"k.cu:3: picked: block: [0,0,0], thread: [0,0,0] Assertion `x` failed.", ["picked"]),
    (b"", ["user_k", "triton_k", "at_k", "picked"]),
])
def test_the_c_rule_and_the_python_caller_agree(fake_child, text, expect):
    """_core.verdict (the Python face of report/verdict.c) over dict
    candidates: named by the text, else the likeliest first (user, JIT, then
    the frameworks'), stable."""
    c = fake_child('''
from cuda_debug import _core, _report
cands = [dict(mangled="_ZN2at6native4at_kEv", origin=_core.ORIGIN_FRAMEWORK, seq=0),
         dict(mangled="user_k", origin=_core.ORIGIN_USER, seq=0),
         dict(mangled="picked", origin=_core.ORIGIN_FRAMEWORK, seq=0),
         dict(mangled="triton_k", origin=_core.ORIGIN_USER, seq=0)]
v = _report.decide(cands, %r.decode())
report([c["mangled"] for c in v.candidates])
''' % text)
    r = c.result
    assert r is not None, c
    assert [m.replace("_ZN2at6native4", "").replace("Ev", "") for m in r] == expect, r


def test_watches_entered_and_left_from_threads_leave_nothing_armed(fake_child):
    """4 threads enter and leave a watch 300 times each: the count of open
    watches the raise hook keeps comes back to 0, and (3.12+) the raise event
    is given back, whatever the interleaving."""
    c = fake_child('''
import threading, sys
import cuda_debug
from cuda_debug import _notes
def loop():
    for _ in range(300):
        with cuda_debug.watch():
            pass
ts = [threading.Thread(target=loop) for _ in range(4)]
for t in ts: t.start()
for t in ts: t.join()
report(dict(open=_notes._open, armed=_notes.armed(), monitoring=hasattr(sys, "monitoring")))
''')
    r = c.result
    assert r is not None, c
    assert r["open"] == 0, r
    if r["monitoring"]:
        assert r["armed"] is None, r


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# One verdict, wherever the error surfaces, on a real GPU (SPEC section 17).
#
# cuda_debug knows the culprit; the exception a user, a log or an error tracker
# sees must name it too, whatever thread it surfaced in and whoever raised it
# last: torch's own ``AcceleratorError`` carries the verdict as a note
# (``cuda_debug: DeviceAssertError: device-side assert in <kernel>``, then the
# launching line) and as ``cuda_debug_error``. Each program runs in its own
# Python (a sticky fault kills its CUDA context) and hands back what it caught.
# ======================================================================================


TORCH = """
import warnings
warnings.simplefilter("ignore")
import traceback
import cuda_debug
import torch
emb = torch.nn.Embedding(100, 16).cuda()
torch.cuda.synchronize()
def full(e):
    return "".join(traceback.format_exception(type(e), e, e.__traceback__))
def serve(tokens, stream):
    with torch.cuda.stream(stream):
        y = emb(tokens)                      # CULPRIT
        return float(y.sum())
"""


def _names_culprit(text, c):
    assert "cuda_debug: DeviceAssertError: device-side assert in" in text, text
    assert "indexSelect" in text or "index" in text.lower(), text
    assert "%s:%d" % (c.script, c.line_of("# CULPRIT")) in text, text


@pytest.mark.gpu
def test_eight_request_threads_under_one_watch_each_name_the_culprit(child):
    """The main thread opens one watch() and starts 8 request threads, each on
    its own stream; request 5 has a token past the vocabulary. Every thread
    catches torch's AcceleratorError; each one's printed traceback (what a
    framework logs) names the embedding kernel and its line."""
    needs("torch")
    c = child(TORCH + """
import threading
out = {"errors": {}}
def request(i):
    s = torch.cuda.Stream()
    tok = torch.tensor([i, 200 if i == 5 else i + 1], device="cuda")
    try:
        for _ in range(3):
            serve(tok, s)
    except Exception as e:
        out["errors"][i] = dict(cls=type(e).__name__, text=full(e),
                                attr=type(getattr(e, "cuda_debug_error", None)).__name__)
with cuda_debug.watch():
    ts = [threading.Thread(target=request, args=(i,)) for i in range(8)]
    for t in ts: t.start()
    for t in ts: t.join()
report(out)
""")
    r = c.result
    assert r is not None, c
    errs = r["errors"]
    assert "5" in errs, r
    for i, e in errs.items():
        assert e["cls"] in ("AcceleratorError", "RuntimeError", "DeviceAssertError"), (i, e)
        if e["cls"] != "DeviceAssertError":
            assert e["attr"] == "DeviceAssertError", (i, e)
        _names_culprit(e["text"], c)


@pytest.mark.gpu
def test_a_profiler_opened_before_the_watch_keeps_the_culprit(child):
    """torch.profiler opened first, the watch inside it, nll_loss's label out of
    range: the profiler's own exit synchronises and raises torch's error again,
    replacing the one the watch translated; the error the user gets still
    names the kernel and the line, and its text is not called a guess."""
    needs("torch")
    c = child("""
import warnings
warnings.simplefilter("ignore")
import traceback
import cuda_debug, torch
from torch.profiler import profile, ProfilerActivity
logits = torch.randn(4, 10, device="cuda")
labels = torch.tensor([1, 2, 30, 3], device="cuda")
torch.cuda.synchronize()
out = {}
try:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
        with cuda_debug.watch():
            loss = torch.nn.functional.nll_loss(logits, labels)     # CULPRIT
            print(float(loss))
except BaseException as e:
    out.update(cls=type(e).__name__, text="".join(traceback.format_exception(type(e), e, e.__traceback__)))
report(out)
""")
    r = c.result
    assert r is not None, c
    text = r["text"]
    assert "nll_loss" in text, text
    assert "%s:%d" % (c.script, c.line_of("# CULPRIT")) in text, text
    assert "a guess" not in text, text


@pytest.mark.gpu
@pytest.mark.parametrize("how", ["logging", "executor", "asyncio", "timer", "uncaught"])
def test_the_verdict_reaches_an_error_however_it_surfaces(child, how):
    """A caught error logged with logging.exception in a worker; an executor's
    result() re-raising a worker's error; asyncio's run_in_executor; an outer
    timer whose finally synchronises; an uncaught error in a thread
    (threading.excepthook): each printed error names the kernel and the line."""
    needs("torch")
    body = {
        "logging": """
import io, logging, threading
log = io.StringIO()
logging.basicConfig(stream=log)
def worker():
    try:
        serve(bad, torch.cuda.Stream())
    except Exception:
        logging.exception("request failed")
with cuda_debug.watch():
    t = threading.Thread(target=worker); t.start(); t.join()
out["text"] = log.getvalue()
""",
        "executor": """
import concurrent.futures
with cuda_debug.watch():
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        try:
            ex.submit(serve, bad, torch.cuda.Stream()).result()
        except Exception as e:
            out["text"] = full(e)
""",
        "asyncio": """
import asyncio
async def main():
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, serve, bad, torch.cuda.Stream())
with cuda_debug.watch():
    try:
        asyncio.run(main())
    except Exception as e:
        out["text"] = full(e)
""",
        "timer": """
import contextlib, time
@contextlib.contextmanager
def timer():
    t0 = time.perf_counter()
    try:
        yield
    finally:
        torch.cuda.synchronize()
        print("took", time.perf_counter() - t0)
try:
    with timer():
        with cuda_debug.watch():
            serve(bad, torch.cuda.current_stream())
except BaseException as e:
    out["text"] = full(e)
""",
        "uncaught": """
import threading
with cuda_debug.watch():
    t = threading.Thread(target=serve, args=(bad, torch.cuda.Stream())); t.start(); t.join()
""",
    }[how]
    c = child(TORCH + "out = {}\nbad = torch.tensor([3, 500], device='cuda')\n" + body +
              "report(out)\n")
    r = c.result
    assert r is not None, c
    text = c.stderr[c.stderr.index("Exception in thread"):] if how == "uncaught" else r["text"]
    _names_culprit(text, c)


@pytest.mark.gpu
def test_the_fd2_block_and_the_exception_name_one_culprit(child):
    """A fault with no assert text among launches of several kernels: the
    block on fd 2 and the exception lead with the same kernel (the one rule)."""
    needs("torch")
    c = child("""
import warnings
warnings.simplefilter("ignore")
import cuda_debug, torch
from cuda_debug import testing as t
x = torch.ones(1 << 16, device="cuda")
out = {}
try:
    with cuda_debug.watch():
        for _ in range(3):
            x = x * 1.5 + 1
        t.illegal_address()                      # CULPRIT
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    out.update(likely=e.likely_kernel or e.kernel)
report(out)
""")
    r = c.result
    assert r is not None, c
    assert "cuda_debug (watch)" in c.stderr, c.stderr[-3000:]
    block = c.stderr[c.stderr.index("cuda_debug (watch)"):]
    first = next(ln for ln in block.splitlines() if " (launch #" in ln)
    named = first.split(" (launch #")[0].split(": ")[-1].strip()

    def base(name):                      # the function's own name, no scope or template
        import re
        return re.match(r"[\w:~]+", name).group(0).split("::")[-1]
    from cuda_debug._errors import short_kernel_name
    assert base(named) == base(short_kernel_name(r["likely"])), (r, block)
