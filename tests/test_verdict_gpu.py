"""One verdict, wherever the error surfaces, on a real GPU (SPEC section 17).

cuda_debug knows the culprit; the exception a user, a log or an error tracker
sees must name it too, whatever thread it surfaced in and whoever raised it
last: torch's own ``AcceleratorError`` carries the verdict as a note
(``cuda_debug: DeviceAssertError: device-side assert in <kernel>``, then the
launching line) and as ``cuda_debug_error``. Each program runs in its own
Python (a sticky fault kills its CUDA context) and hands back what it caught.
"""
import pytest

from conftest import needs

pytestmark = pytest.mark.gpu

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
