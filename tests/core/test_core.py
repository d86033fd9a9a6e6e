"""The C core and the Python API without a GPU: the build, import with no driver,
what a scope says when CUDA is missing, thread-local state, the error classes,
the short report, pickling. Real code, no mocks of the GPU path."""
import os
import pickle
import shutil
import subprocess
import sys
import threading
import traceback

import pytest

import cuda_debug
from cuda_debug import _core, _cuda_errors, _errors, _libraries, _locations, _report

from conftest import PKG_PARENT, gpu_unavailable_reason, need_source_tree


def test_extension_is_built_against_cuda_headers():
    assert _core.CUDA_HEADER_VERSION >= 12000
    assert _core.CUPTI_HEADER_VERSION >= 120000
    # The error table and the extension come from the same major CUDA release.
    assert _core.CUDA_HEADER_VERSION // 1000 == _cuda_errors.CUDA_VERSION // 1000


def test_import_needs_no_driver():
    """A fresh interpreter with no way to find libcuda imports cuda_debug fine
    and says what is missing only when a scope is entered."""
    code = (
        "import cuda_debug, sys\n"
        "try:\n"
        "    with cuda_debug.launch_blocking():\n"
        "        pass\n"
        "except cuda_debug.CudaUnavailableError as e:\n"
        "    print('UNAVAILABLE', e.missing, '|', e)\n"
        "else:\n"
        "    print('ENTERED')\n")
    env = dict(os.environ, LD_LIBRARY_PATH="/nonexistent", CUDA_HOME="/nonexistent")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd=PKG_PARENT)
    assert p.returncode == 0, p.stderr
    if gpu_unavailable_reason() is None:
        pytest.skip("this machine has a driver: the no-driver path is not reachable here")
    assert p.stdout.startswith("UNAVAILABLE libcuda"), p.stdout
    assert "libcuda.so.1" in p.stdout and "NVIDIA driver" in p.stdout


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a GPU is present")
def test_everything_that_needs_cuda_says_so():
    import cuda_debug.testing as t
    for fn in (cuda_debug.check, t.device_assert, lambda: cuda_debug.launch_blocking().__enter__()):
        with pytest.raises(cuda_debug.CudaUnavailableError, match="libcuda"):
            fn()
    assert cuda_debug.is_launch_blocking() is False
    assert _core.stats()["active"] == 0


def test_opt_out_needs_no_cuda_and_restores_state():
    assert not cuda_debug.is_launch_blocking()
    assert _core.thread_state() == 0
    with cuda_debug.launch_blocking(False):
        assert _core.thread_state() == -1
        with cuda_debug.launch_blocking(False):
            assert not cuda_debug.is_launch_blocking()
        assert _core.thread_state() == -1
    assert _core.thread_state() == 0


def test_thread_state_is_per_thread():
    seen = {}
    with cuda_debug.launch_blocking(False):
        t = threading.Thread(target=lambda: seen.setdefault("other", _core.thread_state()))
        t.start()
        t.join()
        seen["mine"] = _core.thread_state()
    assert seen == {"other": 0, "mine": -1}


def test_interleaved_scopes_close_by_their_own_token():
    """asyncio tasks on one thread may close scopes out of order: each closes
    its own, and the thread's state is the innermost scope still open."""
    a, b = cuda_debug.launch_blocking(False), cuda_debug.launch_blocking(False)
    a.__enter__()
    b.__enter__()
    a.__exit__(None, None, None)          # closed first, though entered first
    assert _core.thread_state() == -1     # b is still open
    b.__exit__(None, None, None)
    assert _core.thread_state() == 0


def test_strict_arguments_and_balance():
    for bad in ("false", 0, 1, None, [True]):
        with pytest.raises(TypeError, match="must be True or False"):
            cuda_debug.launch_blocking(bad)
        with pytest.raises(TypeError, match="must be True or False"):
            cuda_debug.launch_blocking(True, all_threads=bad)
    with pytest.raises(RuntimeError, match="without a matching __enter__"):
        cuda_debug.launch_blocking(False).__exit__(None, None, None)
    with pytest.raises(TypeError, match="generator function"):
        @cuda_debug.launch_blocking()
        def gen():
            yield 1
    with pytest.raises(TypeError, match="device ordinal"):
        cuda_debug.check("0")


def test_all_threads_needs_a_blocking_scope():
    with pytest.raises(ValueError, match=r"launch_blocking\(False, all_threads=True\): "):
        cuda_debug.launch_blocking(False, all_threads=True)
    assert cuda_debug.launch_blocking(True, all_threads=True).all_threads is True
    assert cuda_debug.launch_blocking(False).all_threads is False


class _Model:
    """A callable object, as a torch.nn.Module instance is."""

    def __call__(self, x):
        return x


@pytest.mark.parametrize("make,message", [
    (lambda: cuda_debug.watch(_Model()),
     r"^watch\(\) decorates functions and takes enabled=True\|False and the keywords ops=, "
     r"hang_after= and exact=, not a _Model object: to cover "
     r"a model or another callable object, call it inside `with cuda_debug.watch\(\):`$"),
    (lambda: cuda_debug.launch_blocking(_Model()),
     r"^launch_blocking\(\) decorates functions and takes enabled=True\|False and "
     r"all_threads=True\|False, not a _Model object: "),
    (lambda: cuda_debug.launch_blocking(_Model),
     r"^launch_blocking\(\) decorates functions .*, not the class _Model: decorate its "
     r"methods, or put `with cuda_debug.launch_blocking\(\):` around the code$"),
    (lambda: cuda_debug.watch(_Model), r"^watch\(\) decorates functions .*not the class _Model"),
    (lambda: cuda_debug.watch()(_Model()), r"^watch\(\) decorates functions .*a _Model object"),
    (lambda: cuda_debug.launch_blocking(True)(_Model), r"not the class _Model"),
    (lambda: cuda_debug.watch()("text"), r"not a str object$"),
])
def test_decorators_take_functions_only(make, message):
    with pytest.raises(TypeError, match=message):
        make()


def test_decorators_still_take_every_kind_of_function():
    import functools

    class K:
        @cuda_debug.launch_blocking
        def method(self):
            return "m"

    for func in (K().method, len, functools.partial(max, 1), lambda: None):
        wrapped = cuda_debug.launch_blocking(False)(func)
        assert callable(wrapped) and wrapped is not func
    assert K.method.__wrapped__(K()) == "m"
    assert cuda_debug.launch_blocking(False)(functools.partial(max, 1))(5) == 5


@pytest.mark.parametrize("device", [-1, -7])
def test_check_rejects_negative_ordinals(device):
    """-1 would be the current context for the C core: not what check(-1) means."""
    with pytest.raises(ValueError, match=r"check\(device=%d\): a device ordinal is >= 0" % device):
        cuda_debug.check(device)


def test_bare_decorator_and_coroutines_are_covered():
    import asyncio

    @cuda_debug.launch_blocking
    def plain(x):
        return x + 1

    assert plain.__name__ == "plain" and plain.__wrapped__(1) == 2   # wrapped, not replaced
    seen = []

    @cuda_debug.launch_blocking(False)
    async def coro():
        seen.append(_core.thread_state())
        await asyncio.sleep(0)
        seen.append(_core.thread_state())
        return 5

    assert asyncio.run(coro()) == 5
    assert seen == [-1, -1]               # the whole run, across the await
    assert _core.thread_state() == 0


def test_the_driver_is_never_a_toolkit_stub():
    assert _libraries.SONAMES["cuda"] == ["libcuda.so.1"]
    assert not any("/" in p for p in _libraries._DRIVER_PATHS)   # the system loader only
    assert _libraries.SONAMES["cupti"][0] == "libcupti.so.13"


def test_loading_a_missing_library_reports_where_it_looked(tmp_path, monkeypatch):
    if gpu_unavailable_reason() is None:
        pytest.skip("libcuda is present here")
    lib = _libraries.load("cuda")
    assert not lib.loaded and lib.error
    assert "libcuda.so.1" in _libraries.describe(lib)


# -- the error classes ---------------------------------------------------------

def test_classes_match_the_spec_and_the_table():
    expected = {700: "IllegalAddressError", 702: "LaunchTimeoutError", 710: "DeviceAssertError",
                714: "HardwareStackError", 715: "IllegalInstructionError",
                716: "MisalignedAddressError", 717: "InvalidAddressSpaceError",
                718: "InvalidPcError", 719: "LaunchFailureError"}
    for code, name in expected.items():
        cls = _errors.class_for(code)
        assert cls.__name__ == name and issubclass(cls, cuda_debug.StickyCudaError)
        assert cls.__module__ == "cuda_debug" and getattr(cuda_debug, name) is cls
        assert _cuda_errors.is_sticky(code)
    assert _errors.class_for(1, at_launch=True) is cuda_debug.LaunchError
    assert _errors.class_for(2) is cuda_debug.CudaError
    assert _errors.class_for(214) is cuda_debug.StickyCudaError      # sticky, no own class
    assert issubclass(cuda_debug.CudaError, RuntimeError)
    for c in (cuda_debug.CudaUnavailableError, cuda_debug.ToolConflictError,
              cuda_debug.LaunchError, cuda_debug.StickyCudaError):
        assert issubclass(c, cuda_debug.CudaError)


NLL = ("void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d"
       "<float, float, long>(float*, float*, float const*, long const*, float const*, bool, "
       "long, long, long, long)")
ASSERT_TEXT = ("/pytorch/aten/src/ATen/native/cuda/Loss.cu:245: "
               "nll_loss_forward_reduce_cuda_kernel_2d: block: [0,0,0], thread: [3,0,0] "
               "Assertion `t >= 0 && t < n_classes` failed.\n")


def _spec_error():
    stack = traceback.StackSummary.from_list([("train.py", 42, "step",
                                               "loss = criterion(logits, target)")])
    return cuda_debug.DeviceAssertError(
        code=710, kernel=NLL, filename="train.py", lineno=42, function="step",
        line="loss = criterion(logits, target)", device_message=ASSERT_TEXT,
        launch_stack=stack, grid=(1, 1, 1), block=(32, 1, 1), device=0, found_at="launch")


def test_short_report_reads_like_the_spec():
    assert str(_spec_error()) == (
        "device-side assert in nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>\n"
        "  at train.py:42 in step:  loss = criterion(logits, target)\n"
        "  device: Loss.cu:245 block [0,0,0] thread [3,0,0]: Assertion "
        "`t >= 0 && t < n_classes` failed.\n"
        "  The CUDA context is now unusable: restart the process (in a notebook, restart "
        "the kernel).")


def test_report_variants():
    launch = cuda_debug.LaunchError(code=1, kernel="k(int)", grid=(1, 1, 1),
                                    block=(4096, 1, 1), shared_mem=0)
    assert "launch refused in k: CUDA_ERROR_INVALID_VALUE" in str(launch)
    assert "block [4096, 1, 1]" in str(launch) and "still usable" in str(launch)
    unknown = cuda_debug.IllegalAddressError(code=700, found_at="check")
    assert "kernel unknown" in str(unknown) and "launch_blocking()" in str(unknown)
    dead = cuda_debug.DeviceAssertError(code=710, kernel="void k(int)", launch_refused=True)
    assert str(dead).startswith("device-side assert in an earlier kernel (launched outside "
                                "launch_blocking(); the CUDA context was already dead when k "
                                "was launched)")
    graph = cuda_debug.LaunchFailureError(code=719, launch_api="cuGraphLaunch")
    assert "in a CUDA graph replay" in str(graph)
    two = ASSERT_TEXT + ASSERT_TEXT.replace("[3,0,0]", "[4,0,0]")
    assert "(+1 more thread)" in str(cuda_debug.DeviceAssertError(code=710, device_message=two))


@pytest.mark.parametrize("demangled,short", [
    (NLL, "nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>"),
    ("void cuda_debug_testing::check_index<int>(int const*, int, int)", "check_index<int>"),
    ("cupy_checks", "cupy_checks"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
     "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
     "vectorized_elementwise_kernel<4, …>"),
    ("void (anonymous namespace)::k<(void (*)(int))&f>(int)", "k<…>"),
    ("void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<"
     "at::native::index_kernel_impl<at::native::OpaqueType<4> >(at::TensorIteratorBase&)::"
     "{lambda(char*, char const*, long)#1}>(at::TensorIteratorBase&)::{lambda(int)#1}>"
     "(long, at::native::gpu_index_kernel<at::native::index_kernel_impl<at::native::"
     "OpaqueType<4> >(at::TensorIteratorBase&)::{lambda(char*, char const*, long)#1}>"
     "(at::TensorIteratorBase&)::{lambda(int)#1})", "index_elementwise_kernel<128, 4, …>"),
    ("_ZN18cuda_debug_testing11check_indexIiEEvPKT_iS1_", "check_index<int>"),
    ("triton_per_fused_index_mul_sum_0", "triton_per_fused_index_mul_sum_0"),
])
def test_short_kernel_name(demangled, short):
    assert _errors.short_kernel_name(demangled) == short


def test_demangle_uses_the_real_demangler():
    out = _core.demangle("_ZN18cuda_debug_testing11check_indexIiEEvPKT_iS1_")
    if out is None:
        pytest.skip("no libstdc++ __cxa_demangle in this process")
    assert out == "void cuda_debug_testing::check_index<int>(int const*, int, int)"
    assert _core.demangle("cupy_checks") is None


@pytest.mark.parametrize("cls", [cuda_debug.DeviceAssertError, cuda_debug.LaunchError,
                                 cuda_debug.CudaError, cuda_debug.StickyCudaError])
def test_exceptions_pickle(cls):
    e = _spec_error()
    e = cls(code=e.code if cls is not cuda_debug.LaunchError else 1,
            **{f: getattr(e, f) for f in _errors.REPORT_FIELDS})
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is cls
    assert str(e2) == str(e)
    assert e2.launch_stack[0].lineno == 42 and e2.launch_stack[0].filename == "train.py"
    assert (e2.code, e2.name, e2.sticky, e2.kernel) == (e.code, e.name, e.sticky, e.kernel)


def test_tool_conflict_and_unavailable_pickle_with_their_extras():
    t = pickle.loads(pickle.dumps(cuda_debug.ToolConflictError("held", holder="Nsight")))
    assert t.holder == "Nsight" and str(t) == "held"
    u = pickle.loads(pickle.dumps(cuda_debug.CudaUnavailableError("no", missing="libcupti")))
    assert u.missing == "libcupti"


def test_user_frames_skip_libraries():
    assert not _locations.is_user_file(traceback.__file__)
    assert not _locations.is_user_file(_report.__file__)
    assert not _locations.is_user_file("/x/site-packages/torch/nn/functional.py")
    assert not _locations.is_user_file("<frozen runpy>")
    assert not _locations.is_user_file("cupy_backends/cuda/api/driver.pyx")
    assert _locations.is_user_file(__file__)
    assert _locations.is_user_file("<ipython-input-3-abc>")
    assert _locations.is_user_file("<stdin>")
    assert _locations.is_user_file("<string>", outermost=True)      # python -c
    assert not _locations.is_user_file("<string>")                  # exec'd code (Inductor)
    assert not _locations.is_user_file("<eval_with_key>.3")         # torch.fx
    inductor = [p for p in _locations.library_prefixes() if "torchinductor_" in p]
    assert inductor and not _locations.is_user_file(os.path.join(inductor[0], "ab", "cab.py"))


def test_scope_exit_translation_rules():
    """Without any record, nothing is translated; an unrelated exception passes."""
    mark = _core.fault_seq()
    assert _translate_none(mark)
    with pytest.raises(KeyError):
        with cuda_debug.launch_blocking(False):
            raise KeyError("x")


def _translate_none(mark):
    return _report.error_for(None, mark=mark) is None and \
        _report.error_for(KeyError("x"), mark=mark) is None


def test_fault_kernels_header_is_up_to_date():
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc"
                                    if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None or subprocess.run([nvcc, "--version"], capture_output=True).returncode:
        pytest.skip("no nvcc here to rebuild the PTX")     # (or one that does not run)
    root = need_source_tree("regenerating the fault kernels' PTX")
    p = subprocess.run([sys.executable, os.path.join(root, "tools", "gen", "fault_kernels.py"),
                        "--check", "--nvcc", nvcc], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr


def test_import_is_lazy():
    """``import cuda_debug`` (pytest does it at every start, through the plugin's
    entry point) loads neither NumPy nor the error machinery until used."""
    code = ("import sys, cuda_debug\n"
            "before = [m for m in ('numpy', 'cuda_debug._errors', 'cuda_debug._scope',\n"
            "                      'cuda_debug._core') if m in sys.modules]\n"
            "cuda_debug.DeviceAssertError\n"
            "print(before, 'cuda_debug._errors' in sys.modules, 'numpy' in sys.modules)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PKG_PARENT)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["[]", "True", "False"], p.stdout


def test_inductor_provenance_is_read_from_the_generated_code(tmp_path):
    gen = tmp_path / "torchinductor_me" / "ab"
    gen.mkdir(parents=True)
    code = gen / "cabc123.py"
    code.write_text(
        "# kernel path: /tmp/torchinductor_me/xy/cxy.py\n"
        "# Topologically Sorted Source Nodes: [getitem, mul, sum_1], Original ATen: "
        "[aten.index, aten.mul, aten.sum]\n"
        "# Source node to ATen node mapping:\n#   getitem => index\n"
        "triton_per_fused_index_mul_sum_0 = async_compile.triton('triton_per_fused_index_mul_"
        "sum_0', '''\n'''\n"
        "def call(args):\n    triton_per_fused_index_mul_sum_0.run()\n")
    stack = traceback.StackSummary.from_list([("/home/me/train.py", 3, "<module>", None),
                                              (str(code), 9, "call", None)])
    p = _report.inductor_provenance("triton_per_fused_index_mul_sum_0", stack)
    assert p.startswith("Topologically Sorted Source Nodes: [getitem, mul, sum_1], "
                        "Original ATen: [aten.index, aten.mul, aten.sum]"), p
    assert "not known" in _report.inductor_provenance("triton_poi_other_1", stack)
    assert _report.inductor_provenance("void k<float>(float*)", stack) is None
    e = cuda_debug.DeviceAssertError(code=710, kernel="triton_per_fused_index_mul_sum_0",
                                     provenance=p)
    assert "\n  torch.compile: Topologically Sorted Source Nodes" in str(e)


def test_doctor_names_no_toolkit_for_an_empty_folder(tmp_path, monkeypatch):
    """An empty /usr/local/cuda (a container's mount point, CI's hidden toolkit) or
    CUDA_HOME is no toolkit: doctor said "CUDA toolkit /usr/local/cuda" there."""
    empty, real = tmp_path / "empty", tmp_path / "cuda"
    empty.mkdir()
    (real / "include").mkdir(parents=True)
    monkeypatch.setenv("CUDA_HOME", str(empty))
    monkeypatch.setenv("CUDA_PATH", str(real))
    roots = _libraries._cuda_roots()
    assert str(empty) not in roots and str(real) in roots


def test_a_graph_partition_without_a_line_map_is_named_by_cudagraph_trees(tmp_path, monkeypatch):
    """torch.compile(mode="reduce-overhead") on PyTorch 2.11: the kernel is launched
    from a graph partition (``partition_0``), for which Inductor writes no line
    map; the tree's node of that partition keeps its outputs' stack traces, and
    their innermost user frame is the source line. Several nodes that disagree:
    not guessed."""
    import types
    gen = tmp_path / "torchinductor_me" / "ur"
    gen.mkdir(parents=True)
    code = gen / "cur43.py"
    code.write_text(
        "# Topologically Sorted Source Nodes: [getitem, mul], Original ATen: [aten.index, aten.mul]\n"
        "triton_poi_fused_index_mul_0 = None\n"
        "def partition_0(args):\n"
        "    triton_poi_fused_index_mul_0.run()\n")
    user = tmp_path / "train.py"
    user.write_text("import torch\n\ndef f(w, i):\n    return w[i] * 2\n")
    ns = {}
    exec(compile(code.read_text(), str(code), "exec"), ns)
    trees = types.ModuleType("torch._inductor.cudagraph_trees")

    class CUDAGraphNode:
        def __init__(self, model, traces):
            self.wrapped_function = types.SimpleNamespace(model=model)
            self.stack_traces = traces

    trees.CUDAGraphNode = CUDAGraphNode
    monkeypatch.setitem(sys.modules, "torch._inductor.cudagraph_trees", trees)
    trace = ('  File "%s", line 4, in f\n    return w[i] * 2\n' % user)
    outer = '  File "/usr/lib/python3/site-packages/torch/_dynamo/eval_frame.py", line 9, in _fn\n'
    keep = [CUDAGraphNode(ns["partition_0"], [outer + trace, None]),
            CUDAGraphNode(lambda a: a, ['  File "%s", line 1, in <module>\n' % user])]
    stack = traceback.StackSummary.from_list([(str(user), 9, "<module>", None),
                                              (str(code), 4, "partition_0", None)])
    compiled = traceback.FrameSummary(str(user), 3, "f", lookup_line=False)
    p = _report.inductor_provenance("triton_poi_fused_index_mul_0", stack, compiled)
    assert ("fused up to %s:4 in f:  return w[i] * 2 (the graph's output, as cudagraph trees "
            "keep it)" % user) in p, p
    # a second node of the same partition with another output line: not guessed
    keep.append(CUDAGraphNode(ns["partition_0"], ['  File "%s", line 1, in f\n' % user]))
    p = _report.inductor_provenance("triton_poi_fused_index_mul_0", stack, compiled)
    assert "fused up to" not in p and "source line unknown" in p, p
    del keep


def test_children_import_the_cuda_debug_under_test(child, fake_child, fake_live):
    """A child script (its own folder is its sys.path[0]) imports the same
    cuda_debug as the test session, not another copy the interpreter would
    find first (an editable install of another checkout): run_child's children
    and Live's, which runs while the test talks to it."""
    import json
    from conftest import PKG_PARENT
    want = os.path.join(PKG_PARENT, "cuda_debug", "__init__.py")
    code = "import cuda_debug\nreport(cuda_debug.__file__)\n"
    for run in (child, fake_child):
        c = run(code)
        assert c.result is not None, c
        assert os.path.samefile(c.result, want), (c.result, want)
    with fake_live(code) as live:
        _, line = live.wait_for("RESULT ", name="stdout")
        assert live.finish() == 0, live.text()
    got = json.loads(line.split("RESULT ", 1)[1])
    assert os.path.samefile(got, want), (got, want)
