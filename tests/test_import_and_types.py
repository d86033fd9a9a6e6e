"""What ``import cuda_debug`` costs and shows: the modules it loads (none that a
report does not need: no typing, NumPy, torch, C extension), the public names
that type checkers and IDEs see (py.typed, the imports under TYPE_CHECKING, the
same names as the lazy table), where the CUDA_DEBUG_* warnings point (the line
that imported cuda_debug), and what the README documents of the command line.
Timing lives in benchmarks/import_cost.py; nothing here is timed."""
import ast
import importlib.util
import json
import os
import subprocess
import sys
import textwrap

import pytest

import cuda_debug
from cuda_debug import _errors, _options

from conftest import PKG_PARENT, SOURCE_TREE, need_source_tree

INIT = os.path.join(os.path.dirname(os.path.abspath(cuda_debug.__file__)), "__init__.py")


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDA_DEBUG_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")]))
    env.update(extra)
    return env


# -- what `import cuda_debug` loads -------------------------------------------------------

#: what a bare interpreter's `site` has imported already (os and what os needs)
_SITE = {"os", "os.path", "posixpath", "genericpath", "stat", "_stat", "_collections_abc"}
#: never at `import cuda_debug` (each costs milliseconds, or initialises something)
_HEAVY = ("typing", "numpy", "torch", "ctypes", "cuda_debug._core", "cuda.pathfinder",
          "importlib.util", "contextlib", "inspect", "re", "warnings", "threading",
          "cuda_debug._errors", "cuda_debug._scope", "cuda_debug._libraries")


def test_import_loads_only_cuda_debug_and_its_options():
    """In an interpreter without `site` (-S: nothing preloaded, so nothing hides
    what cuda_debug itself imports)."""
    code = ("import sys\nbefore = set(sys.modules)\nimport cuda_debug\n"
            "added = sorted(set(sys.modules) - before)\n"
            "print(repr(added))\n")
    p = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                       env=_env(), cwd=PKG_PARENT, timeout=60)
    assert p.returncode == 0, p.stderr
    added = set(ast.literal_eval(p.stdout.strip()))
    assert [m for m in _HEAVY if m in added] == []
    assert added - _SITE == {"cuda_debug", "cuda_debug._options"}


def test_bench_import_loads_no_process_or_file_machinery():
    """`import cuda_debug.bench` costs NumPy; subprocess (the CUDA_LAUNCH_BLOCKING=1
    child), json and csv (output files) come when they are used."""
    numpy = importlib.util.find_spec("numpy")
    code = ("import sys, numpy\nbefore = set(sys.modules)\nimport cuda_debug.bench\n"
            "print(repr(sorted(set(sys.modules) - before)))\n")
    env = _env()
    env["PYTHONPATH"] += os.pathsep + os.path.dirname(os.path.dirname(numpy.origin))
    p = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                       env=env, cwd=PKG_PARENT, timeout=120)
    assert p.returncode == 0, p.stderr
    added = set(ast.literal_eval(p.stdout.strip()))
    assert "cuda_debug.bench._gemm" in added
    assert sorted(added & {"subprocess", "json", "csv", "importlib.util", "torch"}) == []


def test_a_bad_setting_is_warned_about_without_importing_more(tmp_path):
    """The warning itself needs `warnings`: imported then, and only then."""
    code = "import sys\nimport cuda_debug\nprint('warnings' in sys.modules)\n"
    p = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                       env=_env(CUDA_DEBUG_WAIT="bogus"), cwd=PKG_PARENT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "True" and "CUDA_DEBUG_WAIT='bogus'" in p.stderr


# -- where setting warnings point ------------------------------------------------------------

def _warned_at(tmp_path, files, main, env):
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text).lstrip())
    p = subprocess.run([sys.executable, "-W", "always::RuntimeWarning", main],
                       capture_output=True, text=True, cwd=str(tmp_path), env=_env(**env),
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return [line.split(": RuntimeWarning: ")[0] for line in p.stderr.splitlines()
            if ": RuntimeWarning: cuda_debug: " in line], p.stderr


@pytest.mark.parametrize("files,where", [
    ({"main.py": """
        import os
        import cuda_debug              # line 2
     """}, "main.py:2"),
    ({"main.py": """
        import helper
     """, "helper.py": """
        x = 1
        y = 2
        from cuda_debug import testing   # line 3: a submodule first
     """}, "helper.py:3"),
    ({"main.py": """
        import importlib

        mod = importlib.import_module("cuda_debug")     # line 3
     """}, "main.py:3"),
])
def test_setting_warnings_point_at_the_import_line(tmp_path, files, where):
    lines, err = _warned_at(tmp_path, files, "main.py",
                            {"CUDA_DEBUG_WAIT": "bogus", "CUDA_DEBUG_NO_SUCH": "1"})
    assert len(lines) == 2, err
    assert {os.path.basename(line) for line in lines} == {where}, err
    assert "CUDA_DEBUG_WAIT='bogus' is not one of sync|spin|none" in err
    assert "unknown setting CUDA_DEBUG_NO_SUCH" in err


def test_read_warns_at_its_caller():
    with pytest.warns(RuntimeWarning, match="CUDA_DEBUG_REPORT='maybe'") as rec:
        opts = _options.read({"CUDA_DEBUG_REPORT": "maybe"})
    assert opts.report is True                           # the default
    assert rec[0].filename == __file__


def test_capture_stdio_is_gone():
    """CUDA_DEBUG_CAPTURE=stdio was a left-over spelling of `on` (from when capture
    had stdio|fd modes): now warned about like any unknown value."""
    with pytest.warns(RuntimeWarning, match=r"CUDA_DEBUG_CAPTURE='stdio' is not one of "
                                            r"1\|0\|on\|off\|true\|false\|yes\|no"):
        assert _options.read({"CUDA_DEBUG_CAPTURE": "stdio"}).capture is True


# -- what type checkers see -----------------------------------------------------------------

def _static_imports():
    """{module: [names]} imported under `if TYPE_CHECKING:` in cuda_debug/__init__.py,
    and whether each is the explicit re-export form (`name as name`)."""
    tree = ast.parse(open(INIT).read())
    (block,) = [n for n in tree.body if isinstance(n, ast.If) and
                isinstance(n.test, ast.Name) and n.test.id == "TYPE_CHECKING"]
    out, not_reexported = {}, []
    for node in block.body:
        assert isinstance(node, ast.ImportFrom) and node.level == 1, ast.dump(node)
        for alias in node.names:
            if alias.asname != alias.name:
                not_reexported.append(alias.name)
            out.setdefault("." + node.module if node.module else ".", []).append(alias.name)
    return out, not_reexported


def test_static_and_lazy_public_names_agree():
    """The names type checkers read (under TYPE_CHECKING) are the names __getattr__
    imports at run time (_PUBLIC, _SUBMODULES): adding a public name is one entry in
    each, and this fails when one is missing."""
    static, not_reexported = _static_imports()
    assert not_reexported == []          # `from . import x as x`: exported under --strict
    assert sorted(static.pop(".")) == sorted(cuda_debug._SUBMODULES)
    assert {m: sorted(n) for m, n in static.items()} == \
        {m: sorted(n) for m, n in cuda_debug._PUBLIC.items()}
    assert "TYPE_CHECKING" not in dir(cuda_debug)
    for name in cuda_debug.__all__:
        assert getattr(cuda_debug, name) is not None


def test_every_report_field_is_declared_for_type_checkers():
    declared = set(_errors.CudaError.__annotations__)
    assert [f for f in _errors.REPORT_FIELDS if f not in declared] == []


def test_py_typed_is_in_the_package_and_the_wheel(tmp_path):
    assert os.path.isfile(os.path.join(os.path.dirname(INIT), "py.typed"))
    root = need_source_tree("building the package")
    # build_py is what bdist_wheel copies the pure-Python files with.
    p = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib",
                        str(tmp_path / "lib")], cwd=root, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert (tmp_path / "lib" / "cuda_debug" / "py.typed").is_file()
    assert (tmp_path / "lib" / "cuda_debug" / "bench" / "_gemm.py").is_file()


USER_CODE = '''\
import cuda_debug
import cuda_debug.bench


@cuda_debug.watch
def step(n: int) -> int:
    with cuda_debug.watch(ops=False):
        return n


@cuda_debug.launch_blocking(all_threads=True)
def blocked(n: int) -> int:
    return n


try:
    total: int = step(1) + blocked(2)
    cuda_debug.check(0)
except cuda_debug.DeviceAssertError as e:
    print(e.kernel, e.lineno, e.device_message, e.code, e.sticky)
res = cuda_debug.bench.gemm(sizes=[64], progress=False)
print(res.table())
reveal_type(cuda_debug.watch)
reveal_type(step)
reveal_type(cuda_debug.DeviceAssertError)
reveal_type(cuda_debug.bench.gemm)
cuda_debug.no_such_name
'''


def test_mypy_sees_the_public_names(tmp_path):
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install mypy)")
    (tmp_path / "user.py").write_text(USER_CODE)
    p = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--cache-dir",
                        os.devnull, "--strict", "user.py"], cwd=str(tmp_path),
                       capture_output=True, text=True, env=_env(), timeout=300)
    out = p.stdout
    errors = [line for line in out.splitlines() if ": error:" in line]
    # The one mistake in the file is found, so names are checked, not taken as Any:
    typo = USER_CODE.splitlines().index("cuda_debug.no_such_name") + 1
    assert errors == ['user.py:%d: error: Module has no attribute "no_such_name"  '
                      '[attr-defined]' % typo], out
    notes = [line.split("Revealed type is ", 1)[1] for line in out.splitlines()
             if "Revealed type is" in line]
    assert len(notes) == 4, out
    assert "cuda_debug._scope.watch" in notes[0], out
    assert notes[1].replace("builtins.", "") == '"def (n: int) -> int"', out  # bare decorator
    assert "cuda_debug._errors.DeviceAssertError" in notes[2], out
    assert "cuda_debug.bench._results.GemmResult" in notes[3], out


# -- the README documents the command line ---------------------------------------------------

def test_readme_documents_every_option_and_setting():
    if SOURCE_TREE is None:
        pytest.skip("the README is not next to the tests")
    readme = open(os.path.join(SOURCE_TREE, "README.md"), encoding="utf-8").read()
    import glob            # the reference moves to docs/*.md (issue 24): there counts too
    for page in sorted(glob.glob(os.path.join(SOURCE_TREE, "docs", "*.md"))):
        readme += open(page, encoding="utf-8").read()
    from cuda_debug import _cli
    from cuda_debug.bench import _cli as bench_cli
    wanted = ["run -m", "run - <", "doctor --json", '"ok"', '"problem"']
    wanted += [o for p in (_cli._run_parser(), _cli._doctor_parser()) for a in p._actions
               for o in a.option_strings if o.startswith("--") and o != "--help"]
    for sub in ("gemm", "latency"):
        p = bench_cli.parser()._subparsers._group_actions[0].choices[sub]
        shared = ("--json", "--csv", "--plot", "--force", "--progress", "--no-progress")
        wanted += [o for a in p._actions for o in a.option_strings if o in shared]
    wanted += list(_cli.PROBLEMS)
    wanted += ["%s=" % name for name in _options._CHOICES]
    missing = sorted({w for w in wanted if w not in readme})
    assert missing == []
