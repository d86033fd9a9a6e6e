"""cuda_debug.guard() with CPU PyTorch: the oracle, the errors, the front ends.

The guard checks CUDA tensors only (a CPU op raises by itself). Here an
internal switch (``_guard._CHECK_CPU``) makes it check CPU tensors too, so
that CPU PyTorch is the oracle: on every case of tests/guard_cases.py, the
guard raises exactly when the CPU op raises, and otherwise the result is the
op's own, bit for bit. The same grid runs on CUDA in guard/test_guard_on_cuda.py.
"""
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import cuda_debug                                    # noqa: E402
from cuda_debug import _guard                        # noqa: E402
import guard_cases                                   # noqa: E402
from conftest import PKG_PARENT, line_of             # noqa: E402

CASES = guard_cases.cases(torch)
OPS = sorted({c.op for c in CASES})
HERE = os.path.abspath(__file__)


@pytest.fixture
def cpu_checked(monkeypatch):
    monkeypatch.setattr(_guard, "_CHECK_CPU", True)


def _outcome(fn):
    try:
        return fn(), None
    except Exception as e:               # noqa: BLE001 (the op's own error is the oracle)
        return None, e


@pytest.mark.parametrize("op", OPS)
def test_oracle_guard_raises_exactly_when_cpu_pytorch_does(op, cpu_checked):
    cases = [c for c in CASES if c.op == op]
    wrong, valid, invalid = [], 0, 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # uint8 masks, TracerWarnings...
        for c in cases:
            ref, cpu_error = _outcome(lambda: c.run("cpu"))
            with cuda_debug.guard():
                got, error = _outcome(lambda: c.run("cpu"))
            if cpu_error is None and not c.cuda_asserts:
                valid += 1
                if error is not None:
                    wrong.append((c, "false alarm: %s" % error))
                    continue
                try:
                    guard_cases.compare(torch, ref, got)
                except AssertionError as e:
                    wrong.append((c, "a different result: %s" % e))
            else:
                invalid += 1
                if not isinstance(error, cuda_debug.GuardError):
                    wrong.append((c, "missed: CPU raised %r, guarded: %r" % (cpu_error, error)))
                elif type(error).__name__ != c.error:
                    wrong.append((c, "%s, expected %s" % (type(error).__name__, c.error)))
                elif cpu_error is not None and not isinstance(error, type(cpu_error)) and \
                        c.error == "GuardIndexError" and isinstance(cpu_error, IndexError):
                    wrong.append((c, "CPU raised an IndexError, the guard %r" % error))
    assert not wrong, "%d of %d cases:\n%s" % (len(wrong), len(cases), "\n".join(
        "%r: %s" % w for w in wrong[:30]))
    assert valid and invalid, (valid, invalid)     # the grid has both sides for every op


def test_every_listed_entry_point_is_wrapped():
    assert _guard.install()
    wrapped = [("F", F, _guard._FUNCTIONAL), ("torch", torch, _guard._FUNCTIONS),
               ("Tensor", torch.Tensor, _guard._METHODS + ("__getitem__", "__setitem__"))]
    missing = ["%s.%s" % (where, name) for where, owner, names in wrapped for name in names
               if not getattr(getattr(owner, name), "__cuda_debug_guard__", False)]
    assert not missing
    assert len(_guard._METHODS) == 19 and "index_put_" in _guard._METHODS
    # and nothing else: an unlisted op is PyTorch's own
    assert not hasattr(torch.Tensor.add_, "__cuda_debug_guard__")
    assert not hasattr(F.linear, "__cuda_debug_guard__")
    assert torch.Tensor.gather.__name__ == "gather"
    assert torch.gather.__wrapped__ is not torch.gather


@pytest.mark.parametrize("make, error", [
    (lambda: torch.nn.Embedding(4, 2)(torch.tensor([1, 4])), cuda_debug.GuardIndexError),
    (lambda: torch.nn.EmbeddingBag(4, 2)(torch.tensor([1, 4]), torch.tensor([0])),
     cuda_debug.GuardIndexError),
    (lambda: torch.nn.CrossEntropyLoss()(torch.zeros(2, 3), torch.tensor([0, 3])),
     cuda_debug.GuardIndexError),
    (lambda: torch.nn.NLLLoss()(torch.zeros(2, 3, 2), torch.tensor([[0, 1], [2, -1]])),
     cuda_debug.GuardIndexError),
    (lambda: torch.nn.BCELoss()(torch.tensor([0.5, 1.5]), torch.tensor([0.0, 1.0])),
     cuda_debug.GuardValueError),
], ids=["Embedding", "EmbeddingBag", "CrossEntropyLoss", "NLLLoss 2d", "BCELoss"])
def test_modules_reach_the_checked_functions(make, error, cpu_checked):
    with cuda_debug.guard():
        with pytest.raises(error) as info:
            make()
    assert info.value.filename == HERE          # the user's line, not nn.Module's
    assert info.value.function == "<lambda>"


def test_the_message_and_attributes_name_values_positions_range_shapes_and_line(cpu_checked):
    weight = torch.zeros(10, 4)
    tokens = torch.arange(24).view(4, 6) - 3          # -3..20: 14 bad, first at [0, 0]
    with cuda_debug.guard():
        with pytest.raises(cuda_debug.GuardIndexError) as info:
            F.embedding(tokens, weight)               # the user's line
    e = info.value
    assert (e.op, e.argument, e.count, e.numel, e.valid) == ("F.embedding", "input", 14, 24, "[0, 10)")
    assert e.values == [-3, -2, -1, 10, 11]
    assert e.positions == [(0, 0), (0, 1), (0, 2), (2, 1), (2, 2)]
    assert [(s["name"], s["shape"], s["dtype"]) for s in e.shapes] == [
        ("input", (4, 6), "int64"), ("weight", (10, 4), "float32")]
    src = open(HERE).read()
    assert (e.filename, e.lineno, e.function) == (
        HERE, line_of(src, "F.embedding(tokens, weight)               # the user's line"),
        "test_the_message_and_attributes_name_values_positions_range_shapes_and_line")
    assert e.line.startswith("F.embedding(tokens, weight)")
    lines = str(e).splitlines()
    assert lines[0] == ("F.embedding: 14 of 24 values in input are outside [0, 10), the rows of "
                        "weight: -3 at [0, 0], -2 at [0, 1], -1 at [0, 2], 10 at [2, 1], 11 at "
                        "[2, 2] (the first 5)")
    assert lines[1] == "  input: int64[4, 6], weight: float32[10, 4] on cpu"
    assert lines[2].startswith("  at %s:%d in test_the_message" % (HERE, e.lineno))
    back = pickle.loads(pickle.dumps(e))
    assert str(back) == str(e) and back.positions == e.positions


@pytest.mark.parametrize("call, head", [
    (lambda: F.cross_entropy(torch.zeros(3, 4), torch.tensor([1, -100, 7])),
     "F.cross_entropy: 1 of 3 values in target is outside [0, 4), the classes of input "
     "(dimension 1), and not ignore_index -100: 7 at [2]"),
    (lambda: torch.zeros(5, 3)[:, torch.tensor([[0, 3], [-4, 1]])],
     "x[index]: 2 of 4 values in index[1] are outside [-3, 3), dimension 1 of size 3: 3 at [0, 1], "
     "-4 at [1, 0]"),
    (lambda: torch.zeros(5).index_fill_(0, torch.tensor([5]), 1.0),
     "Tensor.index_fill_: 1 of 1 value in index is outside [-5, 5), the size of dimension 0 of "
     "input: 5 at [0]"),
    (lambda: torch.multinomial(torch.tensor([[0.5, 0.5], [0.0, 0.0]]), 1),
     "torch.multinomial: 1 of 2 row sums in input is not positive: 0 at [1]"),
    (lambda: torch.multinomial(torch.tensor([0.5, -1.0, float("nan")]), 1),
     "torch.multinomial: 2 of 3 values in input are negative, inf or nan: -1 at [1], nan at [2]"),
    (lambda: F.binary_cross_entropy(torch.tensor([0.5, 1.25]), torch.tensor([0.0, 1.0])),
     "F.binary_cross_entropy: 1 of 2 values in input is outside [0, 1]: 1.25 at [1]"),
    (lambda: F.one_hot(torch.tensor([0, -2]), 3),
     "F.one_hot: 1 of 2 values in tensor is outside [0, 3), num_classes=3: -2 at [1]"),
    (lambda: F.embedding_bag(torch.tensor([1, 2, 3]), torch.zeros(4, 2), torch.tensor([0, 2, 1])),
     "F.embedding_bag: 1 of 3 values in offsets is smaller than the offset before it (offsets "
     "must not decrease): 1 at [2]"),
    (lambda: F.embedding_bag(torch.tensor([1, 2, 3]), torch.zeros(4, 2), torch.tensor([0, -1])),
     "F.embedding_bag: 1 of 2 values in offsets is outside [0, 3], the length of input: -1 at [1]"),
], ids=["cross_entropy", "x[:, idx]", "index_fill_", "multinomial rows", "multinomial values",
        "binary_cross_entropy", "one_hot", "embedding_bag steps", "embedding_bag negative offsets"])
def test_first_lines(call, head, cpu_checked):
    with cuda_debug.guard():
        with pytest.raises(cuda_debug.GuardError) as info:
            call()
    assert str(info.value).splitlines()[0] == head


def test_nothing_runs_on_a_violation(cpu_checked):
    x = torch.zeros(4, 2)
    with cuda_debug.guard():
        with pytest.raises(IndexError):
            x.index_fill_(0, torch.tensor([1, 9]), 7.0)
        with pytest.raises(IndexError):
            x[torch.tensor([0, 4])] = 3.0
        with pytest.raises(IndexError):
            x.scatter_(0, torch.tensor([[0, 0], [5, 0]]), 2.0)
    assert torch.equal(x, torch.zeros(4, 2))


def test_embedding_bag_offsets_zero_is_left_to_pytorch(cpu_checked):
    """offsets[0] != 0: CPU PyTorch refuses it, the CUDA kernel starts bag 0 at 0."""
    with cuda_debug.guard():
        with pytest.raises(RuntimeError, match="offsets\\[0\\] has to be 0") as info:
            F.embedding_bag(torch.tensor([1, 2]), torch.zeros(4, 2), torch.tensor([1]))
    assert not isinstance(info.value, cuda_debug.GuardError)


def test_cpu_tensors_are_not_checked_by_default():
    with cuda_debug.guard():
        with pytest.raises(IndexError) as info:
            F.embedding(torch.tensor([7]), torch.zeros(3, 2))
    assert not isinstance(info.value, cuda_debug.GuardError)   # PyTorch's own


def test_semantics_are_asked_of_cpu_pytorch_whatever_mode_is_on(monkeypatch):
    """The probes run on CPU tensors made explicitly so: a default device (here
    meta, on a GPU machine possibly cuda) or a FakeTensorMode changes nothing."""
    _guard.install()
    monkeypatch.setattr(_guard, "_bounds_cache", {})
    clean = {op: _guard._semantics(op) for op in _guard._DEFAULT_BOUNDS}
    assert clean["index_select"] == ("0", "n") and clean["index"] == ("-n", "n")
    assert clean["take"] == ("-n", "n") and clean["nll_loss"] == ("0", "n")
    from torch._subclasses import FakeTensorMode
    for mode in (torch.device("meta"), FakeTensorMode()):
        monkeypatch.setattr(_guard, "_bounds_cache", {})
        with mode:
            assert {op: _guard._semantics(op) for op in _guard._DEFAULT_BOUNDS} == clean, mode


def test_a_probe_that_cannot_run_falls_back_to_the_table(monkeypatch):
    _guard.install()
    monkeypatch.setattr(_guard, "_bounds_cache", {})
    broken = {op: (lambda v: 1 / 0) for op in _guard._DEFAULT_BOUNDS}
    monkeypatch.setattr(_guard, "_probes", lambda: broken)
    assert _guard._bounds("index_fill", 5) == (-5, 5)
    assert _guard._bounds("gather", 5) == (0, 5)
    assert _guard._bounds("take_along_dim", 5) == (None, None)


class _Reads:
    def __init__(self, monkeypatch):
        self.n = 0
        real = _guard._read

        def counting(scalars):
            self.n += 1
            return real(scalars)
        monkeypatch.setattr(_guard, "_read", counting)


@pytest.mark.parametrize("op", OPS)
def test_one_host_read_per_checked_call(op, cpu_checked, monkeypatch):
    """A valid call costs one small reduction read on the host, no more."""
    valid = [c for c in CASES if c.op == op and not c.cuda_asserts and
             _outcome(lambda c=c: c.run("cpu"))[1] is None]
    for c in valid[:3]:                       # the probes ran: semantics are cached
        with cuda_debug.guard():
            c.run("cpu")
    reads = _Reads(monkeypatch)
    for c in valid[:40]:
        before = reads.n
        with cuda_debug.guard():
            c.run("cpu")
        assert reads.n - before <= 1, c
    assert reads.n > 0


def test_plain_indexing_inside_a_guard_does_not_check(cpu_checked, monkeypatch):
    calls = []
    real = _guard._run
    monkeypatch.setattr(_guard, "_run", lambda *a: calls.append(a[0].__name__) or real(*a))
    x = torch.arange(12.0).view(3, 4)
    with cuda_debug.guard():
        x[0], x[1:, 2], x[None], x[...], x[0, 1]
        x[0] = 1.0
        assert calls == []
        x[torch.tensor([0])]
    assert calls == ["_check_getitem"]


def test_outside_a_guard_nothing_is_checked(cpu_checked, monkeypatch):
    _guard.install()
    calls = []
    monkeypatch.setattr(_guard, "_run", lambda *a: calls.append(a))
    with pytest.raises(IndexError):
        torch.zeros(3)[torch.tensor([5])]
    F.embedding(torch.tensor([1]), torch.zeros(3, 2))
    assert calls == []


def test_other_threads_are_not_checked_unless_all_threads(cpu_checked):
    def in_thread():
        out = []

        def run():
            try:
                F.embedding(torch.tensor([9]), torch.zeros(3, 2))
                out.append(None)
            except Exception as e:       # noqa: BLE001
                out.append(e)
        t = threading.Thread(target=run)
        t.start()
        t.join(30)
        return out[0]
    with cuda_debug.guard():
        e = in_thread()
        assert isinstance(e, IndexError) and not isinstance(e, cuda_debug.GuardError)
    with cuda_debug.guard(all_threads=True):
        assert isinstance(in_thread(), cuda_debug.GuardIndexError)


def test_guard_false_turns_the_checks_off_inside(cpu_checked):
    with cuda_debug.guard():
        with cuda_debug.guard(False):
            with pytest.raises(IndexError) as info:
                torch.zeros(3)[torch.tensor([3])]
            assert not isinstance(info.value, cuda_debug.GuardError)
        with pytest.raises(cuda_debug.GuardIndexError):
            torch.zeros(3)[torch.tensor([3])]


def test_torchscript_and_tracing_see_pytorch_not_the_wrappers(cpu_checked):
    _guard.install()
    from torch.jit import _builtins
    import torch._prims_common
    assert _builtins._find_builtin(torch.gather) == "aten::gather"
    assert torch.Tensor.__getitem__ in torch._prims_common.torch_function_passthrough
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in (torch.nn.Embedding(5, 3), torch.nn.CrossEntropyLoss(), torch.nn.NLLLoss(),
                  torch.nn.EmbeddingBag(5, 3), torch.nn.BCELoss()):
            torch.jit.script(m)                   # compiles PyTorch's own function
        with cuda_debug.guard():
            traced = torch.jit.trace(torch.nn.Embedding(5, 3), torch.tensor([1, 2]))
    nodes = [n.kind() for n in traced.graph.nodes()]
    assert "aten::embedding" in nodes
    assert "aten::aminmax" not in nodes and "aten::stack" not in nodes   # no check recorded


def test_torch_compile_traces_through_without_graph_breaks(cpu_checked):
    def fn(x, i):
        return torch.gather(x, 0, i) * 2 + x[i[0]].sum() + F.embedding(i[0], x).sum()
    with cuda_debug.guard():
        explained = torch._dynamo.explain(fn)(torch.randn(3, 2), torch.tensor([[0, 1]]))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


# -- front ends -------------------------------------------------------------------------

def _env(**extra):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")]))
    env.pop("CUDA_DEBUG_GUARD", None)
    env.update(extra)
    return env


BAD_SCRIPT = '''\
import torch
from cuda_debug import _guard
_guard._CHECK_CPU = True          # (tests only: CPU tensors stand for CUDA ones)
emb = torch.nn.Embedding(10, 4)
tokens = torch.tensor([[1, 2, 10], [3, -1, 4]])
out = emb(tokens)                 # the bad line
print("not reached")
'''


@pytest.mark.parametrize("how", ["--guard", "CUDA_DEBUG_GUARD=1"])
def test_run_guard(tmp_path, how):
    (tmp_path / "train.py").write_text(BAD_SCRIPT)
    args = [sys.executable, "-m", "cuda_debug", "run", "--no-watch"] + \
        (["--guard"] if how == "--guard" else []) + ["train.py"]
    env = _env(**({"CUDA_DEBUG_GUARD": "1"} if how != "--guard" else {}))
    p = subprocess.run(args, cwd=str(tmp_path), capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 1, p.stderr
    lines = p.stderr.splitlines()
    assert lines[0] == ("GuardIndexError: F.embedding: 2 of 6 values in input are outside [0, 10), "
                        "the rows of weight: 10 at [0, 2], -1 at [1, 1]"), p.stderr
    assert lines[2] == "  at %s:6 in <module>:  out = emb(tokens)                 # the bad line" % (
        tmp_path / "train.py")
    assert "Traceback" not in p.stderr and "not reached" not in p.stdout


def test_run_without_guard_is_pytorch_own_error(tmp_path):
    (tmp_path / "train.py").write_text(BAD_SCRIPT)
    p = subprocess.run([sys.executable, "-m", "cuda_debug", "run", "--no-watch", "train.py"],
                       cwd=str(tmp_path), capture_output=True, text=True, env=_env(), timeout=120)
    assert p.returncode == 1
    assert p.stderr.rstrip().splitlines()[-1] == "IndexError: index out of range in self"


pytest_plugins = ("pytester",)

FIVE = '''
import pytest, torch, cuda_debug
import torch.nn.functional as F

def test_1(): assert torch.zeros(2).sum() == 0
def test_2():
    F.cross_entropy(torch.zeros(2, 3), torch.tensor([0, 3]))   # the bad label
def test_3(): pass
@pytest.mark.cuda_guard(False)
def test_4(): assert not cuda_debug.is_guarding()
def test_5(): assert cuda_debug.is_guarding() == GUARDED
'''
CONFTEST = '''
from cuda_debug import _guard
_guard._CHECK_CPU = True          # (tests only: CPU tensors stand for CUDA ones)
'''


@pytest.fixture
def inner(pytester, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("CUDA_DEBUG_GUARD", raising=False)
    pytester.makeconftest(CONFTEST)
    return pytester


def _runpytest(pytester, *args):
    from helpers.plugin import PLUGIN_ARGS
    return pytester.runpytest_subprocess(*PLUGIN_ARGS, "-p", "no:cacheprovider", *args,
                                         timeout=180)


@pytest.mark.parametrize("how", ["option", "ini", "env"])
def test_pytest_cuda_guard_fails_one_test_and_runs_the_rest(inner, how, monkeypatch):
    inner.makepyfile(test_five=FIVE.replace("GUARDED", "True"))
    args = []
    if how == "option":
        args.append("--cuda-guard")
    elif how == "ini":
        inner.makeini("[pytest]\ncuda_guard = true\n")
    else:
        monkeypatch.setenv("CUDA_DEBUG_GUARD", "1")
    result = _runpytest(inner, "-v", *args)
    result.assert_outcomes(passed=4, failed=1)
    text = "\n".join(result.outlines)
    assert "test_five.py::test_2 FAILED" in text
    result.stdout.fnmatch_lines([
        ">       F.cross_entropy(torch.zeros(2, 3), torch.tensor([0, 3]))   # the bad label",
        "*^^^^*",          # pytest shows the test's line: the guard's own frame is hidden
        "E       cuda_debug.GuardIndexError: F.cross_entropy: 1 of 2 values in target is outside "
        "[0, 3), the classes of input (dimension 1), and not ignore_index -100: 3 at [1]",
        "E         input: float32[2, 3], target: int64[2] on cpu",
        "E         at *test_five.py:6 in test_2:  F.cross_entropy(*"])
    assert "cuda_debug guard: on, every test" in text
    assert "poisoned" not in text and "stops here" not in text


def test_pytest_marker_guards_one_test(inner):
    inner.makepyfile(test_marked='''
        import pytest, torch, cuda_debug
        @pytest.mark.cuda_guard
        def test_marked():
            assert cuda_debug.is_guarding()
            torch.zeros(3)[torch.tensor([3])]
        def test_plain():
            assert not cuda_debug.is_guarding()
            torch.zeros(3)[torch.tensor([3])]
    ''')
    result = _runpytest(inner, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.cuda_guard(enabled=True)*"])
    result = _runpytest(inner)
    result.assert_outcomes(failed=2)
    text = "\n".join(result.outlines)
    assert "GuardIndexError: x[index]" in text and "IndexError: index 3 is out of bounds" in text
    assert "cuda_debug guard: on" not in text


def test_pytest_help_lists_the_option_and_ini(inner):
    result = _runpytest(inner, "--help")
    result.stdout.fnmatch_lines(["*--cuda-guard*"])
    result.stdout.fnmatch_lines(["*cuda_guard (bool)*"])


# -- notebooks ----------------------------------------------------------------------------

def test_notebook_cuda_guard(tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    from helpers.notebook import Cell
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")])))
    sources = [
        "import torch\nfrom cuda_debug import _guard\n_guard._CHECK_CPU = True\n"
        "%load_ext cuda_debug",                                               # 1
        "%cuda_guard on",                                                     # 2
        "emb = torch.nn.Embedding(10, 4)\ntokens = torch.tensor([[1, 12]])\n"
        "out = emb(tokens)",                                                  # 3: bad
        "tokens[0, 1] = 9\nout = emb(tokens)\nout.shape",                     # 4: fixed
        "%cuda_guard",                                                        # 5: switches
        "%cuda_guard off",                                                    # 6
        "emb(torch.tensor([10]))",                                            # 7: PyTorch's own
        "%%cuda_guard\nx = torch.zeros(3)\nx[torch.tensor([5])]",             # 8
        "%cuda_guard sideways",                                               # 9
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in sources])
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    c = [Cell(x) for x in nb.cells]
    assert c[0].ename is None, c[0]
    assert c[1].stdout.strip() == "cuda_guard: on"
    assert c[2].ename == "GuardIndexError", c[2]
    assert c[2].traceback[0].startswith("GuardIndexError: F.embedding: 1 of 2 values in input is "
                                        "outside [0, 10), the rows of weight: 12 at [0, 1]"), c[2]
    assert "at Cell In[3], line 3:  out = emb(tokens)" in c[2].tb_text, c[2]
    assert len(c[2].traceback) == 4, c[2]                  # the short report, not 60 lines
    assert c[3].ename is None and c[3].result == "torch.Size([1, 2, 4])", c[3]
    assert c[4].stdout.strip() == "cuda_guard: off"       # alone: switched off, as %pdb
    assert c[5].stdout.strip() == "cuda_guard: off"
    assert c[6].ename == "IndexError", c[6]
    assert c[7].ename == "GuardIndexError" and "Cell In[8], line 3" in c[7].tb_text, c[7]
    assert "UsageError: usage: %cuda_guard [on|off]" in c[8].stderr, c[8]
