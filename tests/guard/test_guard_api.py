"""cuda_debug.guard() as an API, without PyTorch: the forms (context manager,
decorator, bare decorator, coroutine), nesting and opting out, threads and
all_threads, the GuardError classes (attributes, message, pickling),
CUDA_DEBUG_GUARD. What the checks find is in guard/test_guard_against_cpu_torch.py (PyTorch)."""
import asyncio
import pickle
import subprocess
import sys
import threading

import pytest

import cuda_debug
from cuda_debug import _options
from conftest import PKG_PARENT


@pytest.fixture(autouse=True)
def no_torch_install(monkeypatch):
    """These tests are about who is guarded: do not import PyTorch for them."""
    from cuda_debug import _guard
    monkeypatch.setattr(_guard, "install", lambda: False)


def test_context_manager_nests_and_opts_out():
    g = cuda_debug.guard
    assert not cuda_debug.is_guarding()
    with g() as outer:
        assert isinstance(outer, g) and cuda_debug.is_guarding()
        with g(False):
            assert not cuda_debug.is_guarding()
            with g():
                assert cuda_debug.is_guarding()
            assert not cuda_debug.is_guarding()
        assert cuda_debug.is_guarding()
    assert not cuda_debug.is_guarding()


def test_state_is_restored_when_the_block_raises():
    with pytest.raises(KeyError):
        with cuda_debug.guard():
            with cuda_debug.guard(False):
                raise KeyError("x")
    assert not cuda_debug.is_guarding()


def test_decorator_forms():
    seen = []

    @cuda_debug.guard
    def bare():
        seen.append(("bare", cuda_debug.is_guarding()))

    @cuda_debug.guard()
    def called(n):
        seen.append(("called", cuda_debug.is_guarding()))
        if n:
            called(n - 1)             # recursion: each call its own region

    @cuda_debug.guard(False)
    def off():
        seen.append(("off", cuda_debug.is_guarding()))

    bare()
    called(2)
    with cuda_debug.guard():
        off()
        seen.append(("after off", cuda_debug.is_guarding()))
    assert seen == [("bare", True), ("called", True), ("called", True), ("called", True),
                    ("off", False), ("after off", True)]
    assert not cuda_debug.is_guarding()
    assert bare.__name__ == "bare"


def test_coroutine_is_guarded_for_its_whole_run_and_generators_are_refused():
    @cuda_debug.guard()
    async def job():
        await asyncio.sleep(0)
        return cuda_debug.is_guarding()

    assert asyncio.run(job()) is True
    assert not cuda_debug.is_guarding()
    with pytest.raises(TypeError, match="generator function"):
        @cuda_debug.guard()
        def gen():
            yield 1


def test_arguments_are_checked():
    with pytest.raises(TypeError, match="guard\\(enabled\\)"):
        cuda_debug.guard(1)
    with pytest.raises(TypeError, match="all_threads"):
        cuda_debug.guard(all_threads="yes")
    assert repr(cuda_debug.guard(all_threads=True)) == "cuda_debug.guard(True, all_threads=True)"
    assert repr(cuda_debug.guard(False, all_threads=True)) == "cuda_debug.guard(False)"


def test_exit_without_enter_is_an_error():
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        cuda_debug.guard().__exit__(None, None, None)


def _in_thread(fn):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()))
    t.start()
    t.join(10)
    assert not t.is_alive()
    return out[0]


def test_other_threads_are_not_guarded_unless_all_threads():
    with cuda_debug.guard():
        assert cuda_debug.is_guarding()
        assert _in_thread(cuda_debug.is_guarding) is False
    with cuda_debug.guard(all_threads=True):
        assert _in_thread(cuda_debug.is_guarding) is True

        def opted_out():
            with cuda_debug.guard(False):
                return cuda_debug.is_guarding()
        assert _in_thread(opted_out) is False
        assert cuda_debug.is_guarding()
    assert _in_thread(cuda_debug.is_guarding) is False
    assert not cuda_debug.is_guarding()


def test_a_thread_guard_does_not_leak_into_the_main_thread():
    entered, leave = threading.Event(), threading.Event()
    seen = []

    def worker():
        with cuda_debug.guard():
            seen.append(cuda_debug.is_guarding())
            entered.set()
            leave.wait(10)
    t = threading.Thread(target=worker)
    t.start()
    assert entered.wait(10)
    try:
        assert not cuda_debug.is_guarding()
    finally:
        leave.set()
        t.join(10)
    assert seen == [True]


def test_interleaved_regions_close_by_their_own_entry():
    a, b = cuda_debug.guard(), cuda_debug.guard(False)
    a.__enter__()
    b.__enter__()
    assert not cuda_debug.is_guarding()
    a.__exit__(None, None, None)          # the outer one first (interleaved tasks)
    assert not cuda_debug.is_guarding()   # b (opted out) is still open
    b.__exit__(None, None, None)
    assert not cuda_debug.is_guarding()


# -- the errors -------------------------------------------------------------------------

FIELDS = dict(op="F.embedding", argument="input", values=[10, -1, 12, 13, 14],
              positions=[(0, 1), (1, 0), (1, 2), (2, 2), (3, 0)], count=7, numel=12,
              valid="[0, 10)", rule=("value", "outside [0, 10), the rows of weight"),
              shapes=[{"name": "input", "shape": (4, 3), "dtype": "int64", "device": "cuda:0"},
                      {"name": "weight", "shape": (10, 4), "dtype": "float32", "device": "cuda:0"}],
              filename="/work/train.py", lineno=42, function="step", line="out = emb(tokens)")


def test_guard_errors_are_index_and_value_errors():
    assert issubclass(cuda_debug.GuardIndexError, IndexError)
    assert issubclass(cuda_debug.GuardValueError, ValueError)
    for cls in (cuda_debug.GuardIndexError, cuda_debug.GuardValueError):
        assert issubclass(cls, cuda_debug.GuardError) and cls.__module__ == "cuda_debug"
        assert not issubclass(cls, cuda_debug.CudaError)


def test_message_names_op_values_positions_count_range_shapes_and_line():
    err = cuda_debug.GuardIndexError(**FIELDS)
    assert str(err).splitlines() == [
        "F.embedding: 7 of 12 values in input are outside [0, 10), the rows of weight: "
        "10 at [0, 1], -1 at [1, 0], 12 at [1, 2], 13 at [2, 2], 14 at [3, 0] (the first 5)",
        "  input: int64[4, 3], weight: float32[10, 4] on cuda:0",
        "  at /work/train.py:42 in step:  out = emb(tokens)",
        "  Checked by cuda_debug.guard() before launching: nothing ran, the CUDA context is "
        "still usable."]
    one = cuda_debug.GuardValueError(**dict(FIELDS, values=[1.5], positions=[()], count=1, numel=1,
                                           rule=("value", "outside [0, 1]"), shapes=None,
                                           filename=None))
    assert str(one).splitlines()[0] == \
        "F.embedding: 1 of 1 value in input is outside [0, 1]: 1.5 at []"
    assert len(str(one).splitlines()) == 2        # no shapes, no line: not made up


def test_guard_errors_pickle_with_their_fields():
    for cls in (cuda_debug.GuardIndexError, cuda_debug.GuardValueError):
        err = cls(**FIELDS)
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is cls and str(back) == str(err)
        for k, v in FIELDS.items():
            assert getattr(back, k) == v, k
    assert str(pickle.loads(pickle.dumps(cuda_debug.GuardError("plain words")))) == "plain words"


def test_unknown_fields_are_refused():
    with pytest.raises(TypeError, match="kernel"):
        cuda_debug.GuardError(kernel="k")


def test_a_guard_error_is_not_a_sticky_cuda_error():
    from cuda_debug import _sticky
    err = cuda_debug.GuardIndexError(**dict(FIELDS, op="torch.gather",
                                            line="CUDA error: device-side assert triggered"))
    assert not _sticky.is_gpu_exception(err)
    assert _sticky.sticky_code(err) is None


def test_cuda_debug_guard_option():
    assert _options.read({}).guard is False
    assert _options.read({"CUDA_DEBUG_GUARD": "1"}).guard is True
    with pytest.warns(RuntimeWarning, match="CUDA_DEBUG_GUARD"):
        assert _options.read({"CUDA_DEBUG_GUARD": "sometimes"}).guard is False


def test_guard_without_pytorch_installed_still_works():
    code = ("import sys; sys.modules['torch'] = None\n"
            "import cuda_debug\n"
            "with cuda_debug.guard():\n"
            "    assert cuda_debug.is_guarding()\n"
            "assert not cuda_debug.is_guarding()\n"
            "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "print('ok')\n")
    env = {"PYTHONPATH": PKG_PARENT, "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_import_cuda_debug_imports_neither_the_guard_nor_torch():
    code = ("import sys, cuda_debug\n"
            "print(sorted(m for m in ('torch', 'cuda_debug._guard') if m in sys.modules))\n"
            "cuda_debug.GuardError, cuda_debug.guard\n"
            "print('torch' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={"PYTHONPATH": PKG_PARENT, "PATH": "/usr/bin:/bin"}, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["[]", "False"]
