"""What ``import cuda_debug`` costs and shows: the modules it loads (none that a
report does not need: no typing, NumPy, torch, C extension), the public names
that type checkers and IDEs see (py.typed, the imports under TYPE_CHECKING, the
same names as the lazy table), where the CUDA_DEBUG_* warnings point (the line
that imported cuda_debug), and what the README and docs/ document of the command line.
Timing lives in benchmarks/import_cost.py; nothing here is timed."""
import ast
import importlib.util
import json
import os
import shutil
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
    what cuda_debug itself imports), after `os` (which `site` imports anyway;
    without it, 3.14 starts with neither `os` nor the `abc` and `errno` it brings)."""
    code = ("import sys, os\nbefore = set(sys.modules)\nimport cuda_debug\n"
            "added = sorted(set(sys.modules) - before)\n"
            "print(repr(added))\n")
    p = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True,
                       env=_env(), cwd=PKG_PARENT, timeout=60)
    assert p.returncode == 0, p.stderr
    added = set(ast.literal_eval(p.stdout.strip()))
    assert [m for m in _HEAVY if m in added] == []
    assert added - _SITE == {"cuda_debug", "cuda_debug._options"}


#: what only a report (or a decorator, or the replay command) needs: not at the first watch()
_REPORT_ONLY = ("inspect", "shutil", "bz2", "lzma", "ast")


def _report_only_added(code_before: str) -> "list[str]":
    """The modules of _REPORT_ONLY that ``cuda_debug.watch()`` (made, decorating
    nothing) brings itself: those the interpreter had at start (`site`, .pth
    files), and those the other modules it imported bring by themselves (on
    3.14 `traceback` imports `inspect` and `ast`; torch imports both), are not
    cuda_debug's doing. A second interpreter imports those other modules alone."""
    code = (code_before + "import sys\nbefore = set(sys.modules)\nimport cuda_debug\n"
            "w = cuda_debug.watch()\nprint(repr(sorted(set(sys.modules) - before)))\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=_env(), cwd=PKG_PARENT, timeout=60)
    assert p.returncode == 0, p.stderr
    added = ast.literal_eval(p.stdout.strip())
    others = [m for m in added if m.split(".")[0] != "cuda_debug" and m not in _REPORT_ONLY]
    code = ("import sys, importlib\nbefore = set(sys.modules)\n"
            "for m in %r:\n    try:\n        importlib.import_module(m)\n"
            "    except Exception:\n        pass\n"
            "print(repr(sorted(set(sys.modules) - before)))\n" % (others,))
    p = subprocess.run([sys.executable, "-c", code_before + code], capture_output=True,
                       text=True, env=_env(), cwd=PKG_PARENT, timeout=60)
    assert p.returncode == 0, p.stderr
    brought = set(ast.literal_eval(p.stdout.strip()))
    return sorted(m for m in _REPORT_ONLY if m in added and m not in brought)


def test_the_first_watch_imports_what_a_report_needs_only_when_reporting():
    """``cuda_debug.watch()``, made and decorating nothing: inspect (the
    decorator's checks), shutil (the replay command's which), ast (a report's
    call inputs) come later (with them, the first watch() once cost 39 ms).
    What cuda_debug adds is measured, not what the interpreter or a library
    brings (Python 3.14's traceback imports inspect and ast)."""
    assert _report_only_added("") == []


def test_the_import_measure_counts_cuda_debugs_own_imports():
    """The measure above is not blind: inspect and ast imported while cuda_debug
    imports its own modules are counted; imported before it (as `site` or a
    .pth file may), they are not."""
    assert _report_only_added("import inspect, ast\n") == []
    # cuda_debug itself importing them after `before`: counted
    # (where `site` or a .pth file imported them already, they are imported afresh)
    code = ("import sys\nsys.modules.pop('inspect', None)\nsys.modules.pop('ast', None)\n"
            "class F:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'cuda_debug._scope':\n"
            "            import inspect, ast\n"
            "        return None\n"
            "sys.meta_path.insert(0, F())\n")
    assert _report_only_added(code) == ["ast", "inspect"]


def test_the_import_measure_excuses_what_the_standard_library_brings():
    """As on Python 3.14, where `traceback` imports `inspect` and `ast` itself: the
    watch's own imports bring them, cuda_debug does not (the old measure said
    ['ast', 'inspect'] there)."""
    code = ("import sys\nsys.modules.pop('traceback', None)\nclass F:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'traceback':\n"
            "            import inspect, ast\n"
            "        return None\n"
            "sys.meta_path.insert(0, F())\n")
    check = code + ("import cuda_debug\nw = cuda_debug.watch()\n"
                    "print(sorted(m for m in ('inspect', 'ast', 'traceback') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                       env=_env(), cwd=PKG_PARENT, timeout=60)
    assert p.stdout.strip() == "['ast', 'inspect', 'traceback']", p.stdout + p.stderr
    assert _report_only_added(code) == []


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


def test_a_bad_setting_under_w_error_is_said_not_raised():
    """``python -W error``: the setting warning is written as a warning would be,
    and the program goes on: a setting never stops a program."""
    code = "import cuda_debug  # line 1\nprint('lived')\n"
    p = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True,
                       text=True, env=_env(CUDA_DEBUG_WAIT="bogus"), cwd=PKG_PARENT, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "lived"
    assert p.stderr.startswith("<string>:1: RuntimeWarning: cuda_debug: CUDA_DEBUG_WAIT='bogus'"), \
        p.stderr


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


@pytest.mark.parametrize("name, says", [
    ("CUDA_DEBUG_WATCH", "unknown setting CUDA_DEBUG_WATCH: to watch a whole program, run it "
                         "with `cuda-debug run script.py`"),
    ("CUDA_DEBUG_LAUNCH_BLOCKING", "unknown setting CUDA_DEBUG_LAUNCH_BLOCKING: for synchronous "
                                   "launches in a whole program, run it with `cuda-debug run "
                                   "--launch-blocking script.py`"),
])
def test_a_setting_guessed_from_pythonfaulthandler_says_what_does_it(name, says):
    """faulthandler's habit (PYTHONFAULTHANDLER=1): CUDA_DEBUG_WATCH=1 is no setting
    (docs/settings.md says why); its warning names the command that watches."""
    with pytest.warns(RuntimeWarning) as rec:
        _options.read({name: "1"})
    assert [str(w.message) for w in rec if says in str(w.message)], [str(w.message) for w in rec]


#: CUDA_DEBUG_ names in the sources that are not settings, and why
NOT_SETTINGS = {"CUDA_DEBUG_BENCH": "the tag of the bench child's result line on stdout "
                                    "(cuda_debug/bench/_child.py)"}


def _names_in_the_sources():
    """Every CUDA_DEBUG_* name in cuda_debug/ and csrc/, header guards aside
    (``#ifndef CUDA_DEBUG_X_H`` and its generator's)."""
    import glob
    import re
    root = need_source_tree("the sources")
    names = {}
    for path in glob.glob(os.path.join(root, "cuda_debug", "**", "*.py"), recursive=True) + \
            glob.glob(os.path.join(root, "csrc", "**", "*.[ch]"), recursive=True) + \
            glob.glob(os.path.join(root, "csrc", "**", "*.py"), recursive=True):
        text = open(path, encoding="utf-8", errors="replace").read()
        guards = set(re.findall(r"#\s*(?:ifndef|define)\s+(CUDA_DEBUG_\w+)", text))
        for name in set(re.findall(r"CUDA_DEBUG_[A-Z0-9_]*[A-Z0-9]", text)) - guards:
            names.setdefault(name, os.path.relpath(path, root))
    return names


def test_settings_md_documents_every_setting_the_code_reads():
    """docs/settings.md names every CUDA_DEBUG_* that cuda_debug/ or csrc/ reads
    (CUDA_DEBUG_DUMP, _TRACE, _GRAPH_MARKER_EVERY, _GRAPH_ADOPT were once
    missing), and each is one the import's check knows (no "unknown setting"
    warning for a switch the code reads)."""
    names = _names_in_the_sources()
    # and the names the warning says are none (CUDA_DEBUG_WATCH: use `cuda-debug run`)
    not_settings = set(NOT_SETTINGS) | set(_options._GUESSES)
    page = open(os.path.join(SOURCE_TREE, "docs", "settings.md"), encoding="utf-8").read()
    missing = sorted("%s (%s)" % (n, where) for n, where in names.items()
                     if n not in not_settings and "`%s" % n not in page)
    assert missing == []
    known = set(_options._CHOICES) | set(_options._FREE) | set(_options._SPECIAL)
    assert sorted(set(names) - not_settings - known) == []
    assert sorted(known - set(names)) == []
    assert len(names) >= 20, names


def test_read_warns_at_its_caller():
    with pytest.warns(RuntimeWarning, match="CUDA_DEBUG_REPORT='maybe'") as rec:
        opts = _options.read({"CUDA_DEBUG_REPORT": "maybe"})
    assert opts.report is True                           # the default
    assert rec[0].filename == __file__


def test_a_bad_graph_markers_value_names_the_real_default():
    with pytest.warns(RuntimeWarning, match=r"CUDA_DEBUG_GRAPH_MARKERS='bogus' is not one of "
                                            r"kernel\|memop\|1\|0.*; using the default \(kernel\)"):
        assert _options.read({"CUDA_DEBUG_GRAPH_MARKERS": "bogus"}).graph_markers == 2


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
        assert isinstance(node, ast.ImportFrom), ast.dump(node)
        if node.level == 0:             # the annotations' own (typing, importlib.machinery)
            continue
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
    assert sorted(cuda_debug.__all__) == sorted(cuda_debug._WHERE)       # the literal list
    tree = ast.parse(open(INIT, encoding="utf-8").read())
    (node,) = [n for n in tree.body if isinstance(n, ast.Assign) and
               [getattr(t, "id", None) for t in n.targets] == ["__all__"]]
    assert isinstance(node.value, ast.List) and all(
        isinstance(e, ast.Constant) for e in node.value.elts)     # mypy reads only a literal
    for name in cuda_debug.__all__:
        assert getattr(cuda_debug, name) is not None


def test_every_report_field_is_declared_for_type_checkers():
    declared = set(_errors.CudaError.__annotations__)
    assert [f for f in _errors.REPORT_FIELDS if f not in declared] == []


def test_py_typed_is_in_the_package_and_the_wheel(tmp_path, build_python):
    """With the build requirements (setuptools >= 77), as pip builds the wheel:
    not the venv's own setuptools, which may be older or absent."""
    assert os.path.isfile(os.path.join(os.path.dirname(INIT), "py.typed"))
    root = need_source_tree("building the package")
    # build_py is what bdist_wheel copies the pure-Python files with.
    p = subprocess.run([build_python, "setup.py", "-q", "build_py", "--build-lib",
                        str(tmp_path / "lib")], cwd=root, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    assert (tmp_path / "lib" / "cuda_debug" / "py.typed").is_file()
    assert (tmp_path / "lib" / "cuda_debug" / "_core.pyi").is_file()       # the C core's stub
    assert (tmp_path / "lib" / "cuda_debug" / "bench" / "_gemm.py").is_file()


USER_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "typing_user_script.py")
TYPO = "import cuda_debug\n\ncuda_debug.no_such_name\n"
#: `from cuda_debug import *`: mypy sees every public name as defined
STAR = """from typing_extensions import assert_type
from cuda_debug import *

with watch(), guard(), launch_blocking(False):
    assert_type(is_watching(), bool)
try:
    check()
except DeviceAssertError as e:
    assert_type(e.kernel, "str | None")
except CudaError:
    pass
err = last_error()
records = in_flight()
"""


def _installed_env(tmp_path):
    """The environment a user's type checker runs in: no PYTHONPATH, so that
    cuda_debug is found the way the install put it there (the README's
    `pip install -e`: a .pth file naming the checkout); skip where this
    interpreter has cuda_debug only on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items()
           if k != "PYTHONPATH" and not k.startswith("CUDA_DEBUG_")}
    p = subprocess.run([sys.executable, "-c", "import cuda_debug; print(cuda_debug.__file__)"],
                       cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=60)
    if p.returncode:
        pytest.skip("cuda_debug is not installed in this interpreter (only on PYTHONPATH)")
    return env


def _user_files(tmp_path):
    shutil.copy(USER_SCRIPT, str(tmp_path / "user.py"))
    (tmp_path / "typo.py").write_text(TYPO)
    (tmp_path / "star.py").write_text(STAR)
    return ["user.py", "typo.py", "star.py"]


def test_the_user_script_uses_every_public_name():
    tree = ast.parse(open(USER_SCRIPT, encoding="utf-8").read())
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and
            isinstance(n.value, ast.Name) and n.value.id == "cuda_debug"}
    used |= {a.name.split(".", 1)[1] for n in ast.walk(tree) if isinstance(n, ast.Import)
             for a in n.names if a.name.startswith("cuda_debug.")}
    assert sorted((set(cuda_debug.__all__) | set(cuda_debug._SUBMODULES)) - used) == []


def test_mypy_strict_accepts_every_public_name_as_the_docs_use_it(tmp_path):
    """tests/house/typing_user_script.py: no error under --strict; the one mistake of
    typo.py is found, so the names are checked, not taken as Any."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (it is in the [dev] extra)")
    env = _installed_env(tmp_path)
    p = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--cache-dir", str(tmp_path / "cache")] + _user_files(tmp_path),
                       cwd=str(tmp_path), capture_output=True, text=True, env=env, timeout=600)
    errors = [line for line in p.stdout.splitlines() if ": error:" in line]
    assert errors == ['typo.py:3: error: Module has no attribute "no_such_name"  '
                      '[attr-defined]'], p.stdout + p.stderr


def test_pyright_strict_accepts_every_public_name_as_the_docs_use_it(tmp_path):
    if importlib.util.find_spec("pyright") is None:
        pytest.skip("pyright is not installed (it is in the [dev] extra)")
    if not shutil.which("node"):
        pytest.skip("pyright needs Node.js on PATH (without it, the pyright wheel downloads one)")
    env = _installed_env(tmp_path)
    files = [f for f in _user_files(tmp_path) if f != "star.py"]    # (strict: no star imports)
    (tmp_path / "pyrightconfig.json").write_text(json.dumps({"typeCheckingMode": "strict"}))
    p = subprocess.run([sys.executable, "-m", "pyright", "--outputjson", "--pythonpath",
                        sys.executable] + files, cwd=str(tmp_path), capture_output=True,
                       text=True, env=env, timeout=600)
    try:
        report = json.loads(p.stdout)
    except ValueError:
        pytest.fail("pyright did not run (exit %d):\n%s" % (p.returncode, (p.stdout + p.stderr)[-3000:]))
    found = ["%s:%d: %s" % (os.path.basename(d["file"]), d["range"]["start"]["line"] + 1,
                            d["message"].splitlines()[0])
             for d in report["generalDiagnostics"] if d["severity"] == "error"]
    assert [f for f in found if not f.startswith("typo.py:")] == []
    assert 'typo.py:3: "no_such_name" is not a known attribute of module "cuda_debug"' in found


#: the modules a user imports by name, and the one that defines the errors they catch
PUBLIC_MODULES = ("cuda_debug", "cuda_debug.__main__", "cuda_debug.testing",
                  "cuda_debug.pytest_plugin", "cuda_debug.bench", "cuda_debug._errors")


def test_mypy_strict_is_clean_on_the_public_modules(tmp_path):
    """`mypy --strict` finds no error in the public modules (it once said 1,036
    errors of the package) (the private modules they import are read, not checked: --follow-imports
    silent)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (it is in the [dev] extra)")
    env = _installed_env(tmp_path)
    args = [a for m in PUBLIC_MODULES for a in ("-m", m)]
    p = subprocess.run([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                        "--follow-imports=silent", "--cache-dir", str(tmp_path / "cache")] + args,
                       cwd=str(tmp_path), capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0 and "Success: no issues found" in p.stdout, p.stdout + p.stderr


def test_pyright_verifytypes_scores_at_least_90_percent(tmp_path):
    """`pyright --verifytypes cuda_debug --ignoreexternal` (the completeness of
    cuda_debug's own public types: pytest's and NumPy's are theirs) scored 47%."""
    if importlib.util.find_spec("pyright") is None:
        pytest.skip("pyright is not installed (it is in the [dev] extra)")
    if not shutil.which("node"):
        pytest.skip("pyright needs Node.js on PATH (without it, the pyright wheel downloads one)")
    env = _installed_env(tmp_path)
    # (--verifytypes finds the package through the `python` on PATH, not --pythonpath)
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])
    p = subprocess.run([sys.executable, "-m", "pyright", "--verifytypes", "cuda_debug",
                        "--ignoreexternal", "--outputjson"],
                       cwd=str(tmp_path), capture_output=True, text=True, env=env, timeout=600)
    try:
        score = json.loads(p.stdout)["typeCompleteness"]["completenessScore"]
    except (ValueError, KeyError):
        pytest.fail("pyright did not run (exit %d):\n%s" % (p.returncode,
                                                           (p.stdout + p.stderr)[-3000:]))
    assert score >= 0.90, score


# -- the README and docs/ document the command line -------------------------------------------

def test_readme_documents_every_option_and_setting():
    """Every option of the command line, every doctor problem and every
    CUDA_DEBUG_* setting is named in the README or a page of docs/."""
    if SOURCE_TREE is None or not os.path.isdir(os.path.join(SOURCE_TREE, "docs")):
        pytest.skip("the README and docs/ are not next to the tests")
    import glob
    readme = "".join(open(p, encoding="utf-8").read() for p in
                     [os.path.join(SOURCE_TREE, "README.md")] +
                     sorted(glob.glob(os.path.join(SOURCE_TREE, "docs", "*.md"))))
    from cuda_debug import _environment
    from cuda_debug._cli import doctor, run
    from cuda_debug.bench import _cli as bench_cli
    wanted = ["run -m", "run - <", "doctor --json", '"ok"', '"problem"']
    wanted += [o for p in (run._run_parser(), doctor._doctor_parser()) for a in p._actions
               for o in a.option_strings if o.startswith("--") and o != "--help"]
    for sub in ("gemm", "latency"):
        p = bench_cli.parser()._subparsers._group_actions[0].choices[sub]
        shared = ("--json", "--csv", "--plot", "--force", "--progress", "--no-progress")
        wanted += [o for a in p._actions for o in a.option_strings if o in shared]
    wanted += list(_environment.PROBLEMS)
    wanted += ["%s=" % name for name in _options._CHOICES]
    missing = sorted({w for w in wanted if w not in readme})
    assert missing == []


# -- what help() and IDEs show -------------------------------------------------------------

def _public_callables():
    """Each public callable of cuda_debug, cuda_debug.testing and cuda_debug.bench,
    and each public method of their public classes: (name, object)."""
    import inspect
    import cuda_debug.testing
    modules = [cuda_debug, cuda_debug.testing]
    if importlib.util.find_spec("numpy") is not None:
        import cuda_debug.bench
        modules.append(cuda_debug.bench)
    for mod in modules:
        names = getattr(mod, "__all__", None) or [n for n in vars(mod) if not n.startswith("_")]
        for name in names:
            obj = getattr(mod, name)
            if inspect.ismodule(obj) or not callable(obj):
                continue
            yield "%s.%s" % (mod.__name__, name), obj
            if isinstance(obj, type):
                for attr, value in vars(obj).items():
                    if not attr.startswith("_") and callable(value):
                        yield "%s.%s.%s" % (mod.__name__, name, attr), getattr(obj, attr)


def _unnamed(sig) -> bool:
    """A signature that hides what the callable takes: *args, or **kwargs alone."""
    import inspect
    kinds = [p.kind for p in sig.parameters.values()]
    return inspect.Parameter.VAR_POSITIONAL in kinds or \
        kinds == [inspect.Parameter.VAR_KEYWORD]


def test_every_public_callable_names_its_parameters():
    """help(cuda_debug.watch) and inspect.signature() (IDEs, notebooks) show the
    parameters, not (*args, **kwargs)."""
    import inspect
    hidden = []
    for name, obj in _public_callables():
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError) as e:
            hidden.append("%s: no signature (%s)" % (name, e))
            continue
        if _unnamed(sig):
            hidden.append("%s%s" % (name, sig))
    assert hidden == []
    sig = inspect.signature(cuda_debug.watch)
    assert list(sig.parameters) == ["enabled", "ops", "hang_after", "exact"], sig
    assert list(inspect.signature(cuda_debug.launch_blocking).parameters) == \
        ["enabled", "all_threads"]
    assert list(inspect.signature(cuda_debug.guard).parameters) == ["enabled", "all_threads"]


def test_the_signature_check_sees_args_and_kwargs():
    import inspect

    def hidden(*args, **kwargs):
        pass

    def named(a, *, b=1, **fields):
        pass
    assert _unnamed(inspect.signature(hidden))
    assert not _unnamed(inspect.signature(named))
