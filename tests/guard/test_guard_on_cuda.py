"""cuda_debug.guard() on a real GPU, in child processes (a missed check would
kill the child's CUDA context, not the test session's):

- for each checked op, a bad input under guard() raises the right GuardError
  subclass naming the values and the line, nothing faults, and a large valid
  computation on the same device succeeds afterwards, in the same process;
  guard composes with watch() and launch_blocking(); a CUDA graph captured
  inside a guard stays valid (no host read during the capture);
- the oracle grid of tests/guard_cases.py on CUDA: every CPU-valid case gives
  the same result guarded and unguarded, every CPU-invalid case raises its
  GuardError subclass without launching;
- a notebook (nbclient, a real kernel): a cell with a bad token under
  ``%cuda_guard on`` fails with GuardIndexError, the next cell with the token
  fixed succeeds, no restart;
- pytest: a 5-test suite whose second test has a bad label gives 1 failed, 4
  passed with --cuda-guard; without it the session stops after test 2.
"""
import os

import pytest

from conftest import PKG_PARENT, ROOT, needs

pytestmark = pytest.mark.gpu

PER_OP = '''
import torch, cuda_debug, torch.nn.functional as F
d = "cuda"
x = torch.arange(15.0, device=d).view(5, 3)
i = torch.tensor([0, 7, 1, -9], device=d)             # 7 and -9 are outside [-5, 5)
g = torch.tensor([[0, 5, 1]], device=d)               # 5 is outside [0, 5)
seen = []

def attempt(op, fn):
    try:
        with cuda_debug.guard():
            fn()
        seen.append(dict(op=op, cls=None))
    except cuda_debug.GuardError as e:
        seen.append(dict(op=op, cls=type(e).__name__, values=e.values, count=e.count,
                         lineno=e.lineno, first=str(e).splitlines()[0]))

attempt("embedding", lambda: torch.nn.Embedding(5, 3).to(d)(i))                   # L:embedding;
attempt("embedding_bag", lambda: F.embedding_bag(i, x, torch.tensor([0, 2], device=d)))  # L:embedding_bag;
attempt("index_select", lambda: x.index_select(0, i))                          # L:index_select;
attempt("x[i]", lambda: x[i])                                                  # L:x[i];
attempt("x[i] = v", lambda: x.__setitem__(i, 1.0))                             # L:x[i] = v;
attempt("index_put_", lambda: x.index_put_((i,), torch.tensor(1.0, device=d))) # L:index_put_;
attempt("gather", lambda: torch.gather(x, 0, g))                               # L:gather;
attempt("scatter", lambda: x.clone().scatter_(0, g, 1.0))                      # L:scatter;
attempt("scatter_add", lambda: x.clone().scatter_add_(0, g, torch.ones(1, 3, device=d)))  # L:scatter_add;
attempt("scatter_reduce", lambda: x.clone().scatter_reduce(0, g, torch.ones(1, 3, device=d), "amax"))  # L:scatter_reduce;
attempt("take", lambda: torch.take(x, i * 3))                                  # L:take;
attempt("take_along_dim", lambda: torch.take_along_dim(x, g * 3))              # L:take_along_dim;
attempt("index_add_", lambda: x.clone().index_add_(0, i, torch.ones(4, 3, device=d)))  # L:index_add_;
attempt("index_copy_", lambda: x.clone().index_copy_(0, i, torch.ones(4, 3, device=d)))  # L:index_copy_;
attempt("index_fill_", lambda: x.clone().index_fill_(0, i, 2.0))               # L:index_fill_;
attempt("nll_loss", lambda: F.nll_loss(x.log_softmax(1), torch.tensor([0, 1, 3, -100, 2], device=d)))  # L:nll_loss;
attempt("nll_loss2d", lambda: F.nll_loss(torch.zeros(2, 3, 4, 4, device=d), torch.full((2, 4, 4), 3, device=d)))  # L:nll_loss2d;
attempt("cross_entropy", lambda: torch.nn.CrossEntropyLoss(label_smoothing=0.1)(x, torch.tensor([0, 1, 2, 3, 1], device=d)))  # L:cross_entropy;
attempt("binary_cross_entropy", lambda: F.binary_cross_entropy(torch.tensor([0.5, 1.5], device=d), torch.ones(2, device=d)))  # L:binary_cross_entropy;
attempt("multinomial", lambda: torch.multinomial(torch.tensor([[0.5, -0.5], [1.0, 1.0]], device=d), 4, True))  # L:multinomial;
attempt("one_hot", lambda: F.one_hot(torch.tensor([0, 2, -1], device=d), 3))  # L:one_hot;

# composes with watch() and launch_blocking(): the guard raises first
for name, region in (("watch", cuda_debug.watch), ("launch_blocking", cuda_debug.launch_blocking)):
    try:
        with region(), cuda_debug.guard():
            torch.nn.Embedding(5, 3).to(d)(i)
        seen.append(dict(op=name, cls=None))
    except Exception as e:
        seen.append(dict(op=name, cls=type(e).__name__))

# the context is healthy: a large valid computation on the same device
a = torch.randn(4096, 4096, device=d)
emb = torch.nn.Embedding(32000, 512).to(d)
tokens = torch.randint(0, 32000, (16, 256), device=d)
with cuda_debug.guard():
    h = emb(tokens) @ a[:512, :512]
    loss = F.cross_entropy(h.view(-1, 512), tokens.view(-1) % 512)
    big = (a @ a).sum()
torch.cuda.synchronize()
report(dict(seen=seen, loss=float(loss.detach()), finite=bool(torch.isfinite(big)), check=cuda_debug.check()))
'''

EXPECT = {
    "embedding": ("GuardIndexError", [7, -9]),
    "embedding_bag": ("GuardIndexError", [7, -9]),
    "index_select": ("GuardIndexError", [7, -9]),
    "x[i]": ("GuardIndexError", [7, -9]),
    "x[i] = v": ("GuardIndexError", [7, -9]),
    "index_put_": ("GuardIndexError", [7, -9]),
    "gather": ("GuardIndexError", [5]),
    "scatter": ("GuardIndexError", [5]),
    "scatter_add": ("GuardIndexError", [5]),
    "scatter_reduce": ("GuardIndexError", [5]),
    "take": ("GuardIndexError", [21, -27]),
    "take_along_dim": ("GuardIndexError", [15]),
    "index_add_": ("GuardIndexError", [7, -9]),
    "index_copy_": ("GuardIndexError", [7, -9]),
    "index_fill_": ("GuardIndexError", [7, -9]),
    "nll_loss": ("GuardIndexError", [3]),
    "nll_loss2d": ("GuardIndexError", [3, 3, 3, 3, 3]),
    "cross_entropy": ("GuardIndexError", [3]),
    "binary_cross_entropy": ("GuardValueError", [1.5]),
    "multinomial": ("GuardValueError", [-0.5]),
    "one_hot": ("GuardIndexError", [-1]),
}


def test_gpu_each_op_raises_its_guard_error_and_the_context_lives_on(child):
    c = child(PER_OP, timeout=240)
    r = c.result
    assert r is not None and c.returncode == 0, c
    seen = {s["op"]: s for s in r["seen"]}
    assert set(seen) == set(EXPECT) | {"watch", "launch_blocking"}, c
    for op, (cls, values) in EXPECT.items():
        s = seen[op]
        assert s["cls"] == cls, (op, s, c)
        assert s["values"] == values, (op, s)
        assert s["lineno"] == c.line_of("# L:%s;" % op), (op, s)
    assert seen["watch"]["cls"] == "GuardIndexError", seen["watch"]
    assert seen["launch_blocking"]["cls"] == "GuardIndexError", seen["launch_blocking"]
    assert r["finite"] and r["check"] is None
    assert "device-side assert" not in c.stderr and "CUDA error" not in c.stderr, c


def test_gpu_oracle_guarded_equals_unguarded(child):
    c = child('''
import sys, warnings
sys.path.insert(0, %r)
warnings.simplefilter("ignore")
import torch, cuda_debug, guard_cases
wrong, valid, invalid, cuda_refuses = [], 0, 0, []
for case in guard_cases.cases(torch):
    try:
        case.run("cpu")
        cpu_ok = not case.cuda_asserts         # CPU takes it; CUDA's kernel would assert
    except Exception:
        cpu_ok = False
    try:
        with cuda_debug.guard():
            got = case.run("cuda")
        err = None
    except cuda_debug.GuardError as e:
        err = e
    except Exception as e:
        if "CUDA error" in str(e) or "AcceleratorError" in type(e).__name__:
            wrong.append("%%r: guarded on CUDA raised %%r" %% (case, e))
            break                              # a missed check killed the context
        if cpu_ok:                             # CUDA refuses it on the host, guard or not?
            try:
                case.run("cuda")
            except Exception as e2:
                if type(e2) is type(e) and str(e2) == str(e):
                    cuda_refuses.append(repr(case))
                    continue
        wrong.append("%%r: guarded on CUDA raised %%r" %% (case, e))
        continue
    if cpu_ok:
        valid += 1
        if err is not None:
            wrong.append("%%r: false alarm on CUDA: %%s" %% (case, str(err).splitlines()[0]))
            continue
        ref = case.run("cuda")
        try:
            guard_cases.compare(torch, ref, got)
        except AssertionError as e:
            wrong.append("%%r: guarded differs: %%s" %% (case, str(e)[:200]))
    else:
        invalid += 1
        if err is None or type(err).__name__ != case.error:
            wrong.append("%%r: expected %%s, got %%r" %% (case, case.error, err))
torch.cuda.synchronize()
report(dict(wrong=wrong[:40], n_wrong=len(wrong), valid=valid, invalid=invalid,
            cuda_refuses=cuda_refuses[:20], n_cuda_refuses=len(cuda_refuses)))
''' % os.path.join(ROOT, "tests"), timeout=480)
    r = c.result
    assert r is not None and c.returncode == 0, c
    assert r["n_wrong"] == 0, "\n".join(r["wrong"])
    assert r["valid"] > 1000 and r["invalid"] > 1000, r
    assert r["n_cuda_refuses"] < 50, r          # (inputs CUDA PyTorch rejects on the host)


def test_gpu_graph_capture_inside_a_guard_stays_valid(child):
    c = child('''
import torch, cuda_debug, torch.nn.functional as F
w = torch.randn(100, 8, device="cuda")
tok = torch.randint(0, 100, (64,), device="cuda")
s = torch.cuda.Stream()
with torch.cuda.stream(s):
    F.embedding(tok, w)                         # warm-up outside the capture
torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
with cuda_debug.guard():
    with torch.cuda.graph(graph):
        out = F.embedding(tok, w) * 2           # not checked: a host read would end the capture
    graph.replay()
    torch.cuda.synchronize()
    ok = torch.equal(out, F.embedding(tok, w) * 2)
    try:
        F.embedding(tok + 100, w)                # outside the capture: checked
        after = None
    except cuda_debug.GuardIndexError as e:
        after = e.count
report(dict(ok=ok, after=after))
''', timeout=180)
    assert c.result == {"ok": True, "after": 64}, c


# -- notebook ---------------------------------------------------------------------------------

def test_gpu_notebook_bad_token_then_fixed_token(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    needs("torch")
    from helpers.notebook import Cell
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    sources = [
        "import torch\n%load_ext cuda_debug\n%cuda_guard on",                       # 1
        "model = torch.nn.Sequential(torch.nn.Embedding(1000, 64), torch.nn.Linear(64, 10)).cuda()\n"
        "tokens = torch.tensor([[3, 999, 1000]], device='cuda')",                   # 2
        "logits = model(tokens)",                                                   # 3: bad
        "tokens[0, 2] = 7\nlogits = model(tokens)\n"
        "torch.cuda.synchronize()\nlogits.shape",                                   # 4: fixed
        "(torch.randn(4096, 4096, device='cuda') @ torch.randn(4096, 4096, device='cuda'))"
        ".isfinite().all().item()",                                                 # 5
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    c = [Cell(x) for x in nb.cells]
    assert c[0].ename is None and "cuda_guard: on" in c[0].stdout, c[0]
    assert c[1].ename is None, c[1]
    assert c[2].ename == "GuardIndexError", c[2]
    assert c[2].traceback[0].startswith(
        "GuardIndexError: F.embedding: 1 of 3 values in input is outside [0, 1000), the rows of "
        "weight: 1000 at [0, 2]"), c[2]
    assert "at Cell In[3], line 1:  logits = model(tokens)" in c[2].tb_text, c[2]
    assert c[3].ename is None and c[3].result == "torch.Size([1, 3, 10])", c[3]
    assert c[4].ename is None and c[4].result == "True", c[4]


# -- pytest -------------------------------------------------------------------------------------

pytest_plugins = ("pytester",)

FIVE = '''
import torch
import torch.nn.functional as F

def work():
    assert (torch.ones(64, device="cuda") * 2).sum().item() == 128

def test_1(): work()
def test_2():
    logits = torch.zeros(4, 3, device="cuda")
    F.cross_entropy(logits, torch.tensor([0, 1, 3, 2], device="cuda")).item()   # bad label 3
def test_3(): work()
def test_4(): work()
def test_5(): work()
'''


@pytest.fixture
def inner(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    monkeypatch.delenv("CUDA_DEBUG_GUARD", raising=False)
    needs("torch")
    return pytester


def _run(pytester, *args):
    from helpers.plugin import PLUGIN_ARGS
    return pytester.runpytest_subprocess(*PLUGIN_ARGS, "-p", "no:cacheprovider", *args,
                                         timeout=300)


def test_gpu_pytest_cuda_guard_one_failed_four_passed(inner):
    inner.makepyfile(test_five=FIVE)
    result = _run(inner, "--cuda-guard")
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines([
        "*cuda_debug.GuardIndexError: F.cross_entropy: 1 of 4 values in target is outside [[]0, 3)*",
        "*1 failed, 4 passed*"])
    assert "poisoned" not in "\n".join(result.outlines)


def test_gpu_pytest_without_guard_still_stops_early(inner):
    inner.makepyfile(test_five=FIVE)
    result = _run(inner)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["pytest stopped after test_five.py::test_2: 3 tests not run*"])
