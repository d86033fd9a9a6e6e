"""The pytest plugin (cuda_debug.pytest_plugin), through real pytest runs in
subprocesses (``pytester.runpytest_subprocess``): CUDA state cannot be reset
inside one process.

CPU: the option group, ini option, marker and fixture (a fake scope shows
which phases run in one), the header, the cost when unused, and fail fast on
sticky errors raised as cuda_debug exceptions or as a framework's words, in one
process and under pytest-xdist. GPU: a real device assert in test 2 of 5.
"""
import os

import pytest

from conftest import PKG_PARENT, gpu_unavailable_reason

pytest_plugins = ("pytester",)
from helpers.plugin import INSTALLED, PLUGIN_ARGS


@pytest.fixture
def inner(pytester, monkeypatch):
    """pytester whose subprocesses import this checkout's cuda_debug."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    return pytester


@pytest.fixture
def fake_inner(inner, monkeypatch, fake_cuda_dir):
    """`inner` whose pytest runs with the fake CUDA driver and CUPTI preloaded
    (LD_PRELOAD): the real scopes work without a GPU, and a test file that
    starts with FAKE_IMPORT controls the driver through `fake`."""
    from fake_cuda import LIBCUDA, LIBCUPTI
    monkeypatch.setenv("LD_PRELOAD", " ".join(os.path.join(fake_cuda_dir, n)
                                              for n in (LIBCUDA, LIBCUPTI)))
    monkeypatch.setenv("CD_TEST_FAKE_DIR", fake_cuda_dir)
    monkeypatch.setenv("CD_TEST_FAKE_PRELOAD", "0")
    return inner


FAKE_IMPORT = "import sys; sys.path.insert(0, %r)\nfrom fake_cuda.child import fake\n" % \
    os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# The summary's line for a failed poisoner: its report is shown once, in the failure.
ONCE = "  (its report is in the failure above)"
# The summary's line for a test where a fault surfaced that cuda_debug did not see launched.
SURFACED_LINE = "%s failed: the CUDA context died in it (the fault surfaced here; an earlier " \
                "test may have launched the kernel: --cuda-watch names it):"


def run(pytester, *args, timeout=120):
    return pytester.runpytest_subprocess(*PLUGIN_ARGS, "-p", "no:cacheprovider", *args,
                                         timeout=timeout)


def out(result) -> str:
    return "\n".join(result.outlines + result.errlines)


def without_pytest_summary(text: str) -> str:
    """`text` less pytest's own "short test summary info" lines, which hold each
    failure's whole message when $CI is set (pytest does not cut them there)."""
    kept, in_summary = [], False
    for line in text.splitlines():
        if "short test summary info" in line and line.startswith("="):
            in_summary = True
            continue
        if in_summary and (line.startswith("FAILED ") or line.startswith("ERROR ") or
                           line.startswith("  ") or line.startswith("E ")):
            continue
        in_summary = False
        kept.append(line)
    return "\n".join(kept)


def line_of(source: str, marker: str) -> int:
    """1-based line of `marker` in a file pytester wrote from `source`
    (dedented and stripped, as makepyfile does)."""
    import textwrap
    import conftest
    return conftest.line_of(textwrap.dedent(source).strip(), marker)


# A fault as cuda_debug reports it, without a GPU.
FAKE_ASSERT = '''
import cuda_debug

def fake_device_assert():
    raise cuda_debug.DeviceAssertError(
        code=710, kernel="void cuda_debug_testing::check_index<int>(int const*, int)",
        filename=__file__, lineno=7, function="test_2", line="t.device_assert()",
        device_message="fault_kernels.cu:14: check_index: block: [0,0,0], thread: [3,0,0] "
                       "Assertion `idx[i] >= 0 && idx[i] < limit` failed.")
'''

FIVE_TESTS = '''
from faults import fault

def test_1(): pass
def test_2(): fault()
def test_3(): pass
def test_4(): pass
def test_5(): pass
'''


def five(pytester, fault_body):
    pytester.makepyfile(faults=FAKE_ASSERT + "\n\ndef fault():\n" + fault_body)
    pytester.makepyfile(test_five=FIVE_TESTS)


# -- registration, options, header -----------------------------------------------------

@pytest.mark.skipif(not INSTALLED, reason="cuda_debug is not installed (pip install -e .): "
                                          "no pytest11 entry point to test")
def test_entry_point_loads_the_plugin_without_a_conftest(inner):
    inner.makepyfile("def test_x(): pass")
    result = inner.runpytest_subprocess("--trace-config", "-p", "no:cacheprovider")
    assert result.ret == 0
    # --trace-config lists the plugins registered through entry points
    assert "cuda_debug.pytest_plugin" in out(result), out(result)


@pytest.mark.skipif(not INSTALLED, reason="needs the pytest11 entry point")
def test_p_no_cuda_debug_turns_it_off(inner):
    five(inner, "    fake_device_assert()\n")
    result = inner.runpytest_subprocess("-p", "no:cuda_debug", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, failed=1)           # no fail fast
    assert "launch blocking" not in out(result)


def test_help_shows_option_group_and_ini(inner):
    result = run(inner, "--help")
    assert result.ret == 0
    result.stdout.fnmatch_lines(["cuda_debug: translated CUDA errors*",
                                 "*--cuda-launch-blocking*"])
    result.stdout.fnmatch_lines(["*cuda_launch_blocking (bool)*"])


def test_marker_is_registered(inner):
    result = run(inner, "--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.cuda_launch_blocking(enabled=True, *"])
    # --strict-markers accepts it
    inner.makepyfile("import pytest\n@pytest.mark.cuda_launch_blocking\ndef test_x(): pass\n")
    inner.makeconftest(_FAKE_SCOPE_CONFTEST)
    assert run(inner, "--strict-markers").ret == 0


_NOTHING_LOADED = '''
    import sys
    from cuda_debug import _core, _libraries

    def test_nothing_loaded():
        assert _libraries.status("cuda") is None      # libcuda never opened
        assert _libraries.status("cupti") is None
        assert _core.stats()["subscribes"] == 0
        assert "torch" not in sys.modules
        assert "cupy" not in sys.modules
'''


def test_unused_it_says_nothing_and_loads_nothing(inner):
    """A project that uses no option, ini setting, marker or fixture of
    cuda_debug: not one cuda_debug line (as pytest-timeout), even with -v and
    -ra, and no library opened, no CUDA initialised, no torch imported."""
    inner.makepyfile(_NOTHING_LOADED)
    for args in ((), ("-v", "-ra")):
        result = run(inner, *args)
        assert result.ret == 0, out(result)
        assert _ours(result) == [], out(result)


_UNTOUCHED = '''
    import sys
    import pytest

    @pytest.mark.xfail(strict=True)
    def test_0_a_failure():
        assert 1 == 2           # the plugin's fail-fast check looks at it: no CUDA in it

    def hooked():
        """The graph-capture hook: a sys.meta_path entry waiting for torch.cuda.graphs,
        or, where torch was imported first, its CUDAGraph wrapped already."""
        graphs = sys.modules.get("torch.cuda.graphs")
        if graphs is not None and getattr(graphs.CUDAGraph.capture_end, "_cuda_debug", False):
            return ["wrapped"]
        return [type(f).__name__ for f in sys.meta_path if "cuda_debug" in type(f).__module__]

    def test_untouched():
        """Nothing of this test touches cuda_debug: what the plugin did by itself."""
        loaded = sorted(m for m in sys.modules if m.startswith("cuda_debug"))
        print("LOADED", loaded, "HOOKS", hooked())
'''


#: a stand-in for an installed torch that the tested project imports before any
#: test: the hook is then the wrapped class, not a meta_path entry
_FAKE_TORCH = {
    "torch/__init__.py": ("from . import cuda, nn\nclass Tensor:\n    def __getitem__(self, i):\n"
                          "        pass\n    def __setitem__(self, i, v):\n        pass\n"),
    "torch/cuda/__init__.py": "from . import graphs\n",
    "torch/cuda/graphs.py": ("class CUDAGraph:\n    def capture_end(self):\n        pass\n"
                             "    def reset(self):\n        pass\n"),
    "torch/nn/__init__.py": "from . import functional\n",
    "torch/nn/functional.py": "",
}


@pytest.mark.parametrize("torch_first", [False, True], ids=["no-torch", "torch-imported"])
@pytest.mark.parametrize("args, marked, armed", [
    ((), False, False),                 # unused: no C extension, no import hook
    (("--cuda-guard",), False, True),   # asked by an option
    ((), True, True),                   # asked by a marker of another test
])
def test_unused_the_plugin_loads_no_extension_and_sets_no_import_hook(inner, args, marked,
                                                                      armed, torch_first):
    """Unused, the plugin (in every pytest run of the environment) loads only its
    own Python modules: not cuda_debug._core, no sys.meta_path entry wrapping
    torch's graph capture. An option, a marker or a fixture
    asks: then the hook is set, as `import cuda_debug` sets it outside pytest:
    a meta_path entry, or where torch was imported already, its class wrapped."""
    if torch_first:
        for name, text in _FAKE_TORCH.items():
            path = inner.path / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        inner.makeconftest("import sys\nsys.path.insert(0, %r)\nimport torch\n"
                           % str(inner.path))
    inner.makepyfile(_UNTOUCHED + ("""
    import pytest

    @pytest.mark.cuda_guard(False)
    def test_marked():
        pass
""" if marked else ""))
    result = run(inner, "-s", *args)
    assert result.ret == 0, out(result)
    (line,) = [l[l.index("LOADED"):] for l in result.outlines if "LOADED [" in l]
    loaded = eval(line.split("LOADED ", 1)[1].split(" HOOKS ")[0])
    hooks = eval(line.split(" HOOKS ", 1)[1])
    # armed: a meta_path entry, or the class wrapped once torch.cuda.graphs was imported
    # (by the project, or by another plugin of the environment: a GPU machine's)
    expected = ([["wrapped"]] if torch_first else [["_TorchGraphsFinder"], ["wrapped"]]) \
        if armed else [[]]
    assert hooks in expected, line
    if not armed:       # (_sticky, _errors: the check of the failure, pure Python)
        assert set(loaded) <= {"cuda_debug", "cuda_debug._options", "cuda_debug.pytest_plugin",
                               "cuda_debug._sticky", "cuda_debug._cuda_errors",
                               "cuda_debug._errors"}, line


@pytest.mark.parametrize("how", ["ini", "pytest -W", "PYTHONWARNINGS", "no filter"])
def test_a_bad_setting_never_stops_another_projects_pytest(inner, monkeypatch, how):
    """A stray CUDA_DEBUG_* variable in a project that makes warnings errors: the
    plugin (loaded in every pytest run of the environment) warns on stderr, pointing
    at the variable (not at pytest's import machinery), and the run goes on (it
    was "Error while loading plugin", exit 3)."""
    monkeypatch.setenv("CUDA_DEBUG_NO_SUCH", "1")
    monkeypatch.setenv("CUDA_DEBUG_WAIT", "bogus")
    args = []
    if how == "ini":
        inner.makeini("[pytest]\nfilterwarnings = error\n")
    elif how == "pytest -W":
        args = ["-W", "error"]
    elif how == "PYTHONWARNINGS":
        monkeypatch.setenv("PYTHONWARNINGS", "error")
    inner.makepyfile("def test_a():\n    pass\n")
    # (pytest-benchmark, where installed, raises its own warning under xdist: not ours)
    result = run(inner, "-p", "no:benchmark", *args)
    assert result.ret == 0, out(result)
    result.assert_outcomes(passed=1)
    # (on stderr; without a filter, pytest lists them in its warnings summary)
    warned = [l.strip() for l in result.errlines + result.outlines
              if "RuntimeWarning: cuda_debug: " in l]
    assert len(warned) == 2, out(result)
    assert warned[0].startswith("<environment CUDA_DEBUG_WAIT>:0: RuntimeWarning: "), warned
    assert warned[1].startswith("<environment CUDA_DEBUG_NO_SUCH>:0: RuntimeWarning: "), warned
    assert "rewrite.py" not in out(result) and "Error while loading" not in out(result)


#: modules that are not yet rewritten for the plugin's import cost (each gets the line)
_DONT_REWRITE_PENDING = set()


def test_pytest_does_not_rewrite_the_asserts_of_cuda_debugs_modules():
    """pytest marks every module of a pytest11 plugin's distribution for assert
    rewriting; with PYTHONDONTWRITEBYTECODE=1 it redid that at every start (25 ms).
    PYTEST_DONT_REWRITE in a module's docstring is pytest's opt-out."""
    import ast
    import glob
    root = os.path.dirname(os.path.abspath(__import__("cuda_debug").__file__))
    missing = []
    for path in sorted(glob.glob(os.path.join(root, "*.py")) +
                       glob.glob(os.path.join(root, "bench", "*.py"))):
        doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read()), clean=False)
        name = os.path.splitext(os.path.relpath(path, root))[0].replace(os.sep, ".")
        if "PYTEST_DONT_REWRITE" not in (doc or "") and name not in _DONT_REWRITE_PENDING:
            missing.append(name)
    assert missing == []


def test_outside_pytest_import_sets_the_hook_at_once(tmp_path):
    """Elsewhere `import cuda_debug` sets it at import (graphs captured before
    the first watch() are read at their end: docs/graphs.md)."""
    import subprocess
    import sys
    code = ("import sys, cuda_debug\n"
            "print([type(f).__name__ for f in sys.meta_path if 'cuda_debug' in type(f).__module__])")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       cwd=str(tmp_path), env=dict(os.environ, PYTHONPATH=PKG_PARENT))
    assert p.stdout.strip() == "['_TorchGraphsFinder']", p.stderr


def test_under_pytest_the_first_use_of_cuda_debug_sets_the_hook(inner):
    inner.makepyfile(_UNTOUCHED + '''
    def test_1_used():
        import cuda_debug
        assert hooked() == []
        cuda_debug.is_watching                  # a public name: cuda_debug is used
        assert hooked() == ["_TorchGraphsFinder"]
''')
    result = run(inner, "-p", "no:randomly")
    result.assert_outcomes(passed=2, xfailed=1)


def _ours(result):
    """The lines of a run that cuda_debug wrote (pytest's own header lines name
    every plugin, and the interpreter's path, which may hold the word)."""
    return [line for line in out(result).splitlines()
            if "cuda_debug" in line and not line.startswith(
                ("platform ", "plugins:", "rootdir:", "cachedir:", "configfile:"))]


def test_a_marked_test_brings_the_cheap_header_line(inner):
    """Tests that use a cuda_debug marker: the one line, after collection,
    cheap (no library opened) and not under -q."""
    inner.makepyfile(_NOTHING_LOADED + '''
    import pytest

    @pytest.mark.cuda_guard(False)
    def test_marked():
        pass
''')
    result = run(inner)
    assert result.ret == 0, out(result)
    result.stdout.fnmatch_lines(["cuda_debug 0.1.0: *built with CUDA * headers*"
                                 "launch blocking: off (marked tests only)*"])
    assert len(_ours(result)) == 1, out(result)
    assert _ours(run(inner, "-q")) == []


NO_GPU = gpu_unavailable_reason() is not None


def test_header_names_option_and_ini(inner):
    """Where no GPU can be had, what was asked for is not said to be on (the
    summary says why the tests ran without it)."""
    inner.makeconftest(_FAKE_SCOPE_CONFTEST)
    inner.makepyfile("def test_x(): pass")
    for args, ini, how in (("--cuda-launch-blocking",), "", "--cuda-launch-blocking"), \
            ((), "cuda_launch_blocking = true\n", "ini cuda_launch_blocking"):
        inner.makeini("[pytest]\n" + ini)
        result = run(inner, *args)
        result.stdout.fnmatch_lines([
            "cuda_debug *launch blocking: off (%s asks for it, and it cannot work here: the "
            "tests run without it)" % how if NO_GPU else
            "cuda_debug *launch blocking: on, every test (%s)*" % how])
    for args, ini, how in (("--cuda-watch",), "", "--cuda-watch"), \
            ((), "cuda_watch = true\n", "ini cuda_watch"):
        inner.makeini("[pytest]\n" + ini)
        result = run(inner, *args)
        text = out(result)
        if NO_GPU:
            assert "on for the session" not in text, text
            result.stdout.fnmatch_lines([
                "cuda_debug *launch blocking: off; watch(): %s asks for it, and it cannot work "
                "here (the tests run without it)" % how,
                "cuda_debug: watch() is unavailable here, tests ran without it: *"])
        else:
            result.stdout.fnmatch_lines(["cuda_debug *watch() on for the session*"])


def test_header_reports_cuda_launch_blocking_env(inner, monkeypatch):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    inner.makepyfile("def test_x(): pass")
    result = run(inner, "--cuda-guard")
    result.stdout.fnmatch_lines(["cuda_debug *CUDA_LAUNCH_BLOCKING=1*"])


# -- option, marker, fixture: which phases run in a scope ------------------------------------

# A stand-in for cuda_debug.launch_blocking that records what the plugin does.
_FAKE_SCOPE_CONFTEST = '''
import pytest
import cuda_debug._scope as scope_module

ACTIVE = []     # the stack of open fake scopes: [(enabled, all_threads)]
LOG = []

class FakeScope:
    def __init__(self, enabled=True, *, all_threads=False):
        self.enabled, self.all_threads = enabled, all_threads
    def __enter__(self):
        ACTIVE.append((self.enabled, self.all_threads)); LOG.append("enter")
        return self
    def __exit__(self, *exc):
        ACTIVE.pop(); LOG.append("exit")
        return False

scope_module.launch_blocking = FakeScope

@pytest.fixture
def in_scope_at_setup():
    return bool(ACTIVE)

@pytest.fixture
def scope_checked_at_teardown():
    yield
    assert ACTIVE, "teardown ran outside the scope"
'''

_WIRING_TESTS = '''
import pytest
from conftest import ACTIVE

def test_plain(in_scope_at_setup):
    assert bool(ACTIVE) == EVERY_TEST
    assert in_scope_at_setup == EVERY_TEST

@pytest.mark.cuda_launch_blocking
def test_marked(in_scope_at_setup, scope_checked_at_teardown):
    assert ACTIVE == [(True, False)]
    assert in_scope_at_setup

@pytest.mark.cuda_launch_blocking(all_threads=True)
def test_marked_all_threads():
    assert ACTIVE == [(True, True)]

@pytest.mark.cuda_launch_blocking(False)
def test_opted_out():
    assert ACTIVE == []

def test_fixture(cuda_launch_blocking, in_scope_at_setup):
    assert cuda_launch_blocking is None
    assert ACTIVE == [(True, False)]
    assert in_scope_at_setup

class TestClass:
    pytestmark = pytest.mark.cuda_launch_blocking
    def test_in_marked_class(self):
        assert ACTIVE == [(True, False)]
'''


@pytest.mark.parametrize("every_test", [False, True], ids=["per-test", "option"])
def test_option_marker_fixture_open_scopes(inner, every_test):
    inner.makeconftest(_FAKE_SCOPE_CONFTEST)
    inner.makepyfile(test_wiring="EVERY_TEST = %r\n" % every_test + _WIRING_TESTS)
    result = run(inner, "-v", *(["--cuda-launch-blocking"] if every_test else []))
    result.assert_outcomes(passed=6)


_FAKE_WATCH_CONFTEST = '''
import cuda_debug._scope as scope_module

WATCHES = []     # the keywords of each open fake watch

class FakeWatch:
    def __init__(self, **keywords):
        self.keywords = keywords
    def __enter__(self):
        WATCHES.append(self.keywords)
        return self
    def __exit__(self, *exc):
        WATCHES.pop()
        return False

scope_module.watch = FakeWatch
'''


def test_watch_marker_false_opts_out_and_keywords_reach_watch(inner):
    """``cuda_watch(False)`` is no watch (it turned watching on), as the two other
    markers' False; keywords reach watch() (they were ignored); a keyword a marker
    does not take fails the test, naming it (it was ignored)."""
    inner.makeconftest(_FAKE_WATCH_CONFTEST)
    inner.makepyfile('''
        import pytest
        from conftest import WATCHES

        @pytest.mark.cuda_watch
        def test_on():
            assert WATCHES == [{}]

        @pytest.mark.cuda_watch(False)
        def test_off():
            assert WATCHES == []

        @pytest.mark.cuda_watch(enabled=False)
        def test_off_keyword():
            assert WATCHES == []

        @pytest.mark.cuda_watch(hang_after=60, exact=True)
        def test_keywords():
            assert WATCHES == [{"hang_after": 60, "exact": True}]

        @pytest.mark.cuda_watch(bogus=1)
        def test_unknown_keyword():
            pass

        @pytest.mark.cuda_launch_blocking(hang_after=60)
        def test_keyword_of_another_marker():
            pass

        @pytest.mark.cuda_guard("yes")
        def test_not_a_bool():
            pass
    ''')
    result = run(inner, "-rE")
    result.assert_outcomes(passed=4, errors=3)
    result.stdout.fnmatch_lines_random([
        "@pytest.mark.cuda_watch: unknown keyword bogus (it takes enabled, hang_after, exact)",
        "@pytest.mark.cuda_launch_blocking: unknown keyword hang_after (it takes enabled, "
        "all_threads)",
        "@pytest.mark.cuda_guard('yes'): enabled is True or False",
    ])


def test_ini_option_opens_scopes(inner):
    inner.makeconftest(_FAKE_SCOPE_CONFTEST)
    inner.makeini("[pytest]\ncuda_launch_blocking = true\n")
    inner.makepyfile(test_wiring="EVERY_TEST = True\n" + _WIRING_TESTS)
    run(inner).assert_outcomes(passed=6)


def test_scope_wraps_setup_call_and_teardown_separately(inner):
    inner.makeconftest(_FAKE_SCOPE_CONFTEST)
    inner.makepyfile('''
        import pytest
        from conftest import LOG

        @pytest.mark.cuda_launch_blocking
        def test_marked(): pass

        def test_after():
            assert LOG == ["enter", "exit"] * 3     # setup, call, teardown
    ''')
    run(inner).assert_outcomes(passed=2)


def test_scope_translation_replaces_the_test_exception(inner):
    """The real scope turns a framework's error into a cuda_debug one at exit
    (``raise err from exc``): that error becomes the test's, located at the
    test's own line, and fails fast."""
    inner.makeconftest(_FAKE_SCOPE_CONFTEST + '''
import cuda_debug

class TranslatingScope(FakeScope):
    def __exit__(self, etype, exc, tb):
        super().__exit__(etype, exc, tb)
        if isinstance(exc, RuntimeError) and "CUDA error" in str(exc):
            raise cuda_debug.DeviceAssertError(
                code=710, kernel="void k<float>(float*)", filename="test_t.py", lineno=5,
                function="test_2", line="launch()") from exc
        return False

scope_module.launch_blocking = TranslatingScope
''')
    source = '''
        def launch():
            raise RuntimeError("CUDA error: device-side assert triggered")
        def test_1(): pass
        def test_2(cuda_launch_blocking):
            launch()
        def test_3(): pass
    '''
    inner.makepyfile(test_t=source)
    result = run(inner)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*RuntimeError: CUDA error: device-side assert triggered",
        "*The above exception was the direct cause of the following exception:*",
        "*def test_2(cuda_launch_blocking):",
        ">       launch()",
        "*",
        "E       cuda_debug.DeviceAssertError: device-side assert in k<float>",
    ])
    result.stdout.fnmatch_lines(["test_t.py::test_2 failed: it poisoned the CUDA context:",
                                 "pytest stopped after test_t.py::test_2: 1 test not run*"])
    assert "_scope.py" not in out(result) and "__exit__" not in out(result).split(
        "The above exception")[1], out(result)


def test_a_later_exception_is_shown_at_the_launching_line(fake_inner):
    """A test whose except block raises again after the launch failed (as a
    framework's teardown does): the failure is the translated error, with the
    traceback through the launching line, and the later error named as a
    consequence."""
    source = FAKE_IMPORT + '''
fake.fake_set_kernel(b"bad_label", 710, -1, b"t < n_classes", -1, 0)

def check(rc):
    if rc:
        raise RuntimeError("CUDA error: device-side assert triggered")

def test_fit():
    try:
        check(fake.fake_launch(b"bad_label", 0, 1, 1, 1, 32, 1, 1))    # LAUNCH
    except RuntimeError:
        raise ValueError("teardown failed too")
'''
    fake_inner.makepyfile(test_t=source)
    result = run(fake_inner, "--cuda-launch-blocking")
    result.assert_outcomes(failed=1)
    text = out(result)
    result.stdout.fnmatch_lines([
        "*The above exception was the direct cause of the following exception:*",
        "    def test_fit():",
        "        try:",
        ">           check(fake.fake_launch(b\"bad_label\", 0, 1, 1, 1, 32, 1, 1))    # LAUNCH",
        "*",
        "E *cuda_debug.DeviceAssertError: device-side assert in bad_label",
        "E *at *test_t.py:%d in test_fit:*" % line_of(source, "# LAUNCH"),
        "E *later: ValueError: teardown failed too, raised at *test_t.py:%d in test_fit, "
        "while handling this fault: a consequence, not the cause"
        % line_of(source, "raise ValueError"),
    ])
    assert "_scope.py" not in text.split("direct cause")[1], text


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a GPU is usable here")
@pytest.mark.parametrize("option,what", [("--cuda-launch-blocking", "launch_blocking()"),
                                         ("--cuda-watch", "watch()")])
@pytest.mark.parametrize("strict", ["-W error", "ini"])
def test_without_a_gpu_the_option_says_so_once_and_tests_run(inner, option, what, strict):
    """No GPU: said once, in the terminal summary, not as a warning inside a
    test, so a CPU-only CI with `filterwarnings = error` passes (the
    first test must not fail with the plugin's PytestWarning)."""
    inner.makepyfile('''
        import pytest, cuda_debug
        def test_a(): assert not cuda_debug.is_launch_blocking()
        def test_b(): pass
        @pytest.mark.cuda_launch_blocking
        def test_c(): pass
        @pytest.mark.cuda_watch
        def test_d(): pass
    ''')
    if strict == "ini":
        inner.makeini("[pytest]\nfilterwarnings = error\n")
    result = run(inner, option, *(["-W", "error"] if strict != "ini" else []))
    result.assert_outcomes(passed=4)
    text = out(result)
    assert text.count("is unavailable here") == 1, text
    result.stdout.fnmatch_lines(["cuda_debug: %s is unavailable here, tests ran without it: "
                                 "no CUDA driver*" % what])
    assert "Warning" not in text, text


# -- fail fast --------------------------------------------------------------------------------

def test_sticky_cuda_debug_error_stops_the_session(inner):
    five(inner, "    fake_device_assert()\n")
    result = run(inner, "-v")
    result.assert_outcomes(passed=1, failed=1)
    assert result.ret == 1                   # tests failed (like -x), not "interrupted"
    text = out(result)
    for t in ("test_3", "test_4", "test_5"):
        assert "test_five.py::%s" % t not in text, text
    result.stdout.fnmatch_lines([
        "*- cuda_debug -*",
        "This test poisoned the CUDA context of this process*",
        "pytest stops here: 3 tests not run.",
    ])
    result.stdout.fnmatch_lines([
        "*= cuda_debug: sticky CUDA error =*",
        "test_five.py::test_2 failed: it poisoned the CUDA context:",
        "  DeviceAssertError: device-side assert in check_index<int>" + ONCE,
        "pytest stopped after test_five.py::test_2: 3 tests not run*",
    ])
    result.stdout.fnmatch_lines(["*cuda_debug: test_five.py::test_2 poisoned the CUDA context "
                                 "(DeviceAssertError): stopping, 3 tests not run*"])
    # the report once: in the failure (the error itself), not again in the summary
    assert without_pytest_summary(text).count("thread [3,0,0]: Assertion `idx[i] >= 0") == 1, text
    assert without_pytest_summary(text).count("faults.py:7 in test_2") == 1, text


def test_the_summary_holds_the_report_where_the_failure_does_not(inner):
    five(inner, "    fake_device_assert()\n")
    result = run(inner, "--tb=no")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "test_five.py::test_2 failed: it poisoned the CUDA context:",
        "  DeviceAssertError: device-side assert in check_index<int>",
        "    at *faults.py:7 in test_2:  t.device_assert()",
        "    device: fault_kernels.cu:14 block [[]0,0,0] thread [[]3,0,0]: Assertion `idx[[]i] >= 0*",
        "    The CUDA context is now unusable*",
    ])
    assert without_pytest_summary(out(result)).count(
        "thread [3,0,0]: Assertion `idx[i] >= 0") == 1, out(result)


_WORDS = [
    ("CUDA error: device-side assert triggered\\nCUDA kernel errors might be asynchronously "
     "reported at some other API call", "CUDA_ERROR_ASSERT", "device_assert"),
    ("CUDA error: an illegal memory access was encountered", "CUDA_ERROR_ILLEGAL_ADDRESS",
     "illegal_address"),
    ("Triton Error [CUDA]: unspecified launch failure", "CUDA_ERROR_LAUNCH_FAILED", "trap"),
    ("CUDA_ERROR_MISALIGNED_ADDRESS: misaligned address", "CUDA_ERROR_MISALIGNED_ADDRESS",
     "misaligned_address"),
]


@pytest.mark.parametrize("message,name,fault", _WORDS)
def test_framework_words_alone_do_not_stop_the_session(inner, message, name, fault):
    """No option, no CUDA in the process: a test raising a framework's words
    is an ordinary failure, which does not stop the session."""
    five(inner, "    raise RuntimeError(%r)\n" % message.replace("\\n", "\n"))
    result = run(inner)
    result.assert_outcomes(passed=4, failed=1)
    assert "- cuda_debug -" not in out(result), out(result)     # no section
    assert "sticky CUDA error" not in out(result), out(result)


@pytest.mark.parametrize("message,name,fault", _WORDS)
def test_framework_words_on_a_dead_context_stop_the_session(fake_inner, message, name, fault):
    """The fake driver's context really dead (a faulting kernel launched
    outside any scope), then the framework's words: the driver confirms, the
    session stops, and the report is printed once."""
    fake_inner.makepyfile(faults=FAKE_IMPORT + '''
import cuda_debug.testing as t

def fault():
    t.%s()
    raise RuntimeError(%r)
''' % (fault, message.replace("\\n", "\n")))
    fake_inner.makepyfile(test_five=FIVE_TESTS)
    result = run(fake_inner)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*- cuda_debug -*",
        "RuntimeError: %s" % message.split("\\n")[0].replace("[", "[[]"),
        "  %s (*): a sticky CUDA error." % name,
        "*run with --cuda-watch (kernels stay asynchronous) or the test inside "
        "cuda_debug.launch_blocking() (--cuda-launch-blocking, "
        "@pytest.mark.cuda_launch_blocking or the cuda_launch_blocking fixture).",
        "The CUDA context of this process died during this test: every later CUDA call in it "
        "fails. The fault surfaced in this test; an earlier test may have launched the faulting "
        "kernel (the previous one was test_five.py::test_1). To name the test, the kernel and "
        "the line that launched it, run with --cuda-watch.",
        "pytest stops here: 3 tests not run.",
    ])
    result.stdout.fnmatch_lines([SURFACED_LINE % "test_five.py::test_2", "  RuntimeError: *" + ONCE])
    assert out(result).count("a sticky CUDA error.") == 1, out(result)


# test_c launches a kernel that faults asynchronously and passes; test_d's next
# CUDA call meets the dead context (the framework raises its words, as torch does).
SURFACES_LATER = FAKE_IMPORT + '''
import cuda_debug.testing as t

def test_b(): pass

def test_c():
    t.device_assert()                  # LAUNCHED_IN_C: returns at once, faults on the device

def test_d():
    fake.fake_ctx_sync()
    raise RuntimeError("CUDA error: device-side assert triggered")

def test_e(): pass
'''


def test_a_fault_that_surfaces_later_is_not_blamed_on_the_test_it_surfaced_in(fake_inner):
    """Plain pytest (no option): test_c launches a bad kernel
    asynchronously and passes, test_d meets the dead context. The plugin said
    "test_d poisoned the CUDA context"; without watch it cannot know which test
    launched the kernel. Now it says the fault surfaced in test_d, that an
    earlier test may have launched it, and that --cuda-watch names it."""
    fake_inner.makepyfile(test_t=SURFACES_LATER)
    result = run(fake_inner)
    result.assert_outcomes(passed=2, failed=1)
    text = without_pytest_summary(out(result))
    assert "poisoned" not in text, text
    result.stdout.fnmatch_lines([
        "*The fault surfaced in this test; an earlier test may have launched the faulting "
        "kernel (the previous one was test_t.py::test_c). To name the test, the kernel and the "
        "line that launched it, run with --cuda-watch.",
        "pytest stops here: 1 test not run.",
    ])
    result.stdout.fnmatch_lines([SURFACED_LINE % "test_t.py::test_d"])
    result.stdout.fnmatch_lines(["*cuda_debug: the CUDA context died in test_t.py::test_d "
                                 "(RuntimeError; it surfaced there, an earlier test may have "
                                 "launched the kernel: --cuda-watch names it): stopping, 1 test "
                                 "not run*"])


def test_with_watch_a_fault_that_surfaces_later_names_the_test_that_launched_it(fake_inner):
    """The same suite with --cuda-watch: watch() recorded the launch in test_c,
    so the plugin names test_c as the poisoner, the fault surfacing in test_d."""
    fake_inner.makepyfile(test_t=SURFACES_LATER)
    result = run(fake_inner, "--cuda-watch")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "DeviceAssertError: device-side assert in check_index<int>",
        "  launched at *test_t.py:%d in test_c:  t.device_assert()*"
        % line_of(SURFACES_LATER, "# LAUNCHED_IN_C"),
    ])
    result.stdout.fnmatch_lines([
        "*The fault surfaced in this test; test_t.py::test_c launched the faulting kernel "
        "(watch() recorded the launch, above): every later CUDA call in this process fails.",
    ])
    result.stdout.fnmatch_lines([
        "test_t.py::test_d failed: the CUDA context died in it, poisoned by test_t.py::test_c "
        "(watch() recorded that test's launch of the faulting kernel):",
    ])
    result.stdout.fnmatch_lines(["*cuda_debug: test_t.py::test_c poisoned the CUDA context "
                                 "(*, surfaced in test_t.py::test_d): stopping, 1 test not run*"])


def test_xfail_on_a_dead_context_is_named_from_the_driver(fake_inner):
    fake_inner.makepyfile(FAKE_IMPORT + '''
import pytest
import cuda_debug.testing as t

def test_1(): pass

@pytest.mark.xfail(strict=True)
def test_2():
    t.device_assert()
    raise RuntimeError("CUDA error: device-side assert triggered")

def test_3(): pass
''')
    result = run(fake_inner)
    result.assert_outcomes(passed=2, xfailed=1)
    result.stdout.fnmatch_lines([(SURFACED_LINE % "test_*::test_2").replace(" failed:", " xfailed:"),
                                 "  RuntimeError: CUDA error: device-side assert triggered",
                                 "    CUDA_ERROR_ASSERT (*): a sticky CUDA error."])


def test_framework_words_on_a_live_context_do_not_stop(fake_inner):
    """CUDA in the process, its context alive: the words are not enough."""
    fake_inner.makepyfile(faults=FAKE_IMPORT + '''
import cuda_debug.testing as t

def fault():
    t.empty()
    raise RuntimeError("CUDA error: device-side assert triggered")
''')
    fake_inner.makepyfile(test_five=FIVE_TESTS)
    result = run(fake_inner)
    result.assert_outcomes(passed=4, failed=1)
    assert "sticky CUDA error" not in out(result), out(result)


def test_framework_exception_with_an_error_code(fake_inner):
    fake_inner.makepyfile(faults=FAKE_IMPORT + '''
import cuda_debug.testing as t

class AcceleratorError(RuntimeError):
    def __init__(self, msg, code):
        super().__init__(msg)
        self.error_code = code

def fault():
    t.illegal_address()
    raise AcceleratorError("CUDA error: something the runtime said", 700)
''')
    fake_inner.makepyfile(test_five=FIVE_TESTS)
    result = run(fake_inner)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["  CUDA_ERROR_ILLEGAL_ADDRESS (*): a sticky CUDA error."])


def test_sticky_error_in_a_fixture_setup_stops_too(fake_inner):
    fake_inner.makepyfile(FAKE_IMPORT + '''
import pytest
import cuda_debug.testing as t

@pytest.fixture
def model():
    t.trap()
    raise RuntimeError("CUDA error: unspecified launch failure")

def test_1(): pass
def test_2(model): pass
def test_3(): pass
''')
    result = run(fake_inner)
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(["pytest stops here: 1 test not run."])


@pytest.mark.parametrize("exc", [
    "AssertionError('child printed: CUDA error: device-side assert triggered')",
    "RuntimeError('misaligned address')",                 # not about CUDA
    "ValueError('CUDA error: device-side assert triggered')",   # not a framework error type
    "RuntimeError('CUBLAS_STATUS_NOT_SUPPORTED')",         # not sticky
])
def test_other_failures_do_not_stop(inner, exc):
    five(inner, "    raise %s\n" % exc)
    result = run(inner)
    result.assert_outcomes(passed=4, failed=1)
    assert "cuda_debug: sticky CUDA error" not in out(result)


def test_xfail_on_a_sticky_error_is_named_but_does_not_stop(inner):
    inner.makepyfile(faults=FAKE_ASSERT + "\n\ndef fault():\n    fake_device_assert()\n")
    inner.makepyfile('''
        import pytest
        from faults import fault
        def test_1(): pass
        @pytest.mark.xfail(strict=True)
        def test_2(): fault()
        def test_3(): pass
    ''')
    result = run(inner)
    result.assert_outcomes(passed=2, xfailed=1)
    result.stdout.fnmatch_lines(["test_*::test_2 xfailed, but poisoned the CUDA context:"])


def test_xdist_replaces_the_poisoned_worker(inner):
    pytest.importorskip("xdist")
    five(inner, "    fake_device_assert()\n")
    result = run(inner, "-n", "2", "-v")
    result.assert_outcomes(passed=4, failed=1)          # test 2 counted once
    text = out(result)
    assert "replacing crashed worker" in text, text
    result.stdout.fnmatch_lines([
        "*= cuda_debug: sticky CUDA error =*",
        "test_five.py::test_2 (xdist worker gw*) failed: it poisoned the CUDA context:",
        "  DeviceAssertError: device-side assert in check_index<int>" + ONCE,
        "  Worker gw* exited after it; xdist replaced it*",
    ])
    result.stdout.fnmatch_lines(["*pytest-xdist worker gw* exits after this test*"])
    assert "crashed while running" not in text


# -- GPU: a real device assert ----------------------------------------------------------------

GPU_FIVE = '''
import cuda_debug
import cuda_debug.testing as t

def work():
    t.empty()
    cuda_debug.check()

def test_1(): work()
def test_2():
    with cuda_debug.launch_blocking():
        t.device_assert()
def test_3(): work()
def test_4(): work()
def test_5(): work()
'''


@pytest.mark.gpu
def test_gpu_device_assert_stops_the_session(inner):
    inner.makepyfile(test_gpu_five=GPU_FIVE)
    result = run(inner, "-v")
    result.assert_outcomes(passed=1, failed=1)
    text = out(result)
    for t in ("test_3", "test_4", "test_5"):
        assert "test_gpu_five.py::%s " % t not in text, text
    result.stdout.fnmatch_lines([      # the report, once: in the failure
        "E *cuda_debug.DeviceAssertError: device-side assert in check_index<int>",
        "E *at *test_gpu_five.py:%d in test_2:  t.device_assert()"
        % line_of(GPU_FIVE, "t.device_assert()"),
        "E *device: *Assertion*",
        "E *The CUDA context is now unusable*",
        "*= cuda_debug: sticky CUDA error =*",
        "test_gpu_five.py::test_2 failed: it poisoned the CUDA context:",
        "  DeviceAssertError: device-side assert in check_index<int>" + ONCE,
        "pytest stopped after test_gpu_five.py::test_2: 3 tests not run*",
    ])


@pytest.mark.gpu
def test_gpu_device_assert_under_xdist_runs_the_rest(inner):
    pytest.importorskip("xdist")
    inner.makepyfile(test_gpu_five=GPU_FIVE)
    result = run(inner, "-n", "2", timeout=180)
    result.assert_outcomes(passed=4, failed=1)
    result.stdout.fnmatch_lines([
        "E *cuda_debug.DeviceAssertError: device-side assert in check_index<int>",
        "E *at *test_gpu_five.py:%d in test_2:  t.device_assert()"
        % line_of(GPU_FIVE, "t.device_assert()"),
        "E *device: *Assertion*",
        "test_gpu_five.py::test_2 (xdist worker gw*) failed: it poisoned the CUDA context:",
        "  DeviceAssertError: device-side assert in check_index<int>" + ONCE,
    ])


@pytest.mark.gpu
def test_gpu_option_marker_fixture_and_header(inner):
    source = '''
        import pytest, cuda_debug
        import cuda_debug.testing as t

        def test_blocking(): assert cuda_debug.is_launch_blocking()

        @pytest.mark.cuda_launch_blocking(False)
        def test_opted_out(): assert not cuda_debug.is_launch_blocking()

        def test_fault():
            t.device_assert()

        def test_not_run(): pass
    '''
    inner.makepyfile(test_gpu_opt=source)
    result = run(inner, "--cuda-launch-blocking")
    result.stdout.fnmatch_lines(["cuda_debug 0.1.0: GPU *, driver * (CUDA *), built with "
                                 "CUDA * headers*launch blocking: on, every test*"])
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "E *at *test_gpu_opt.py:%d in test_fault:  t.device_assert()"
        % line_of(source, "t.device_assert()"),
        "test_gpu_opt.py::test_fault failed: it poisoned the CUDA context:",
        "  DeviceAssertError: device-side assert in check_index<int>" + ONCE,
        "pytest stopped after test_gpu_opt.py::test_fault: 1 test not run*",
    ])


@pytest.mark.gpu
def test_gpu_passing_poisoner_is_named_by_the_next_failure(inner):
    inner.makepyfile(test_gpu_raises='''
        import pytest, cuda_debug
        import cuda_debug.testing as t

        def test_expects_the_assert():
            with pytest.raises(cuda_debug.DeviceAssertError):
                with cuda_debug.launch_blocking():
                    t.device_assert()

        def test_next():
            t.empty()
            cuda_debug.check()

        def test_not_run(): pass
    ''')
    result = run(inner)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*The CUDA context of this process was already dead: "
        "test_gpu_raises.py::test_expects_the_assert poisoned it:",
    ])
    result.stdout.fnmatch_lines([
        "test_gpu_raises.py::test_expects_the_assert passed, but poisoned the CUDA context:",
        "  DeviceAssertError: device-side assert in check_index<int>",
    ])


_TORCH_FAULT = '''
import pytest, torch

def test_1():
    torch.ones(2, device="cuda").sum().item()

def test_2(%s):
    x = torch.zeros(4, device="cuda")
    i = torch.tensor([10], device="cuda")
    y = x[i]
    torch.cuda.synchronize()

def test_3():
    torch.ones(2, device="cuda").sum().item()
'''


@pytest.mark.gpu
def test_gpu_torch_device_assert_with_the_fixture(inner):
    pytest.importorskip("torch")
    inner.makepyfile(test_torch=_TORCH_FAULT % "cuda_launch_blocking")
    result = run(inner)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "E *cuda_debug.DeviceAssertError: device-side assert in *",
        "E *at *test_torch.py:%d in test_2:  y = x[[]i]" % line_of(_TORCH_FAULT, "y = x[i]"),
        "E *device: *Assertion*",
        "test_torch.py::test_2 failed: it poisoned the CUDA context:",
        "  DeviceAssertError: device-side assert in *" + ONCE,
    ])


@pytest.mark.gpu
def test_gpu_torch_device_assert_without_a_scope(inner):
    pytest.importorskip("torch")
    inner.makepyfile(test_torch=_TORCH_FAULT % "")
    result = run(inner)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        "*- cuda_debug -*",
        "*CUDA error: device-side assert triggered",
        "  CUDA_ERROR_ASSERT (device-side assert triggered): a sticky CUDA error.",
        "*--cuda-launch-blocking*",
    ])
    result.stdout.fnmatch_lines(["pytest stopped after test_torch.py::test_2: 1 test not run*"])
    assert out(result).count("a sticky CUDA error.") == 1, out(result)     # said once


# test_c launches an out-of-range index and passes (nothing synchronises in it);
# test_d's synchronize meets the dead context.
_TORCH_SURFACES_LATER = '''
import torch

def test_b():
    torch.ones(2, device="cuda").sum().item()

def test_c():
    x = torch.zeros(4, device="cuda")
    i = torch.tensor([10], device="cuda")
    y = x[i]  # LAUNCHED_IN_C

def test_d():
    torch.cuda.synchronize()

def test_e():
    torch.ones(2, device="cuda").sum().item()
'''


@pytest.mark.gpu
def test_gpu_torch_fault_surfacing_in_a_later_test_is_not_blamed_on_it(inner):
    pytest.importorskip("torch")
    inner.makepyfile(test_torch=_TORCH_SURFACES_LATER)
    result = run(inner)
    result.assert_outcomes(passed=2, failed=1)
    assert "poisoned" not in without_pytest_summary(out(result)), out(result)
    result.stdout.fnmatch_lines([
        "*The fault surfaced in this test; an earlier test may have launched the faulting "
        "kernel (the previous one was test_torch.py::test_c). To name the test, the kernel and "
        "the line that launched it, run with --cuda-watch.",
    ])
    result.stdout.fnmatch_lines([SURFACED_LINE % "test_torch.py::test_d"])


@pytest.mark.gpu
def test_gpu_torch_fault_surfacing_later_with_watch_names_the_launching_test(inner):
    pytest.importorskip("torch")
    inner.makepyfile(test_torch=_TORCH_SURFACES_LATER)
    result = run(inner, "--cuda-watch")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines([
        "  launched at *test_torch.py:%d in test_c:  y = x[[]i]*"
        % line_of(_TORCH_SURFACES_LATER, "# LAUNCHED_IN_C"),
    ])
    result.stdout.fnmatch_lines([
        "test_torch.py::test_d failed: the CUDA context died in it, poisoned by "
        "test_torch.py::test_c (watch() recorded that test's launch of the faulting kernel):",
    ])


# -- recognising a framework's sticky error (cuda_debug._sticky), in process -------------------

class _CUDADriverError(RuntimeError):      # as CuPy names it
    pass


_CUDADriverError.__module__ = "cupy_backends.cuda.api.driver"


class _CudaAPIError(Exception):            # as Numba names it (not a RuntimeError)
    pass


_CudaAPIError.__module__ = "numba.cuda.cudadrv.driver"


@pytest.mark.parametrize("exc,code", [
    (RuntimeError("CUDA error: device-side assert triggered"), 710),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), 700),
    (RuntimeError("Search for `cudaErrorLaunchFailure' in the docs"), 719),
    (_CUDADriverError("CUDA_ERROR_ASSERT: device-side assert triggered"), 710),
    (_CudaAPIError("[700] Call to cuMemcpyDtoH results in CUDA_ERROR_ILLEGAL_ADDRESS"), 700),
    (RuntimeError("INTERNAL: CUDA error: misaligned address"), 716),
    (RuntimeError("CUDA error: out of memory"), None),
    (RuntimeError("misaligned address"), None),
    (AssertionError("CUDA error: device-side assert triggered"), None),
    (ValueError("CUDA_ERROR_ASSERT"), None),
])
def test_sticky_code_of_framework_exceptions(exc, code):
    from cuda_debug import _sticky
    assert _sticky.sticky_code(exc) == code


def test_sticky_code_follows_the_cause_and_knows_its_own():
    import cuda_debug
    from cuda_debug import _sticky
    try:
        try:
            raise RuntimeError("CUDA error: unspecified launch failure")
        except RuntimeError as e:
            raise KeyError("wrapped") from e
    except KeyError as wrapped:
        assert _sticky.sticky_code(wrapped) == 719
    assert _sticky.sticky_code(cuda_debug.IllegalAddressError(code=700)) == 700
    assert _sticky.sticky_code(cuda_debug.LaunchError(code=1)) is None
    assert _sticky.first_line(RuntimeError("a\nb")) == "RuntimeError: a"
