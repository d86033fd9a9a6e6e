"""What a user installs: the sdist's contents, where CUPTI and cuBLAS come from
(cuda.pathfinder; an already-loaded copy first), and that pathfinder is
imported only when a library is needed. CPU only; library loading happens in
child processes (a library, once loaded, stays loaded)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap

import pytest

from conftest import PKG_PARENT, need_source_tree
from cuda12_wheel import cupti12  # noqa: F401  (fixture)


def py(code, env=None, timeout=120):
    """Run `code` in a fresh Python; the JSON it prints last."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")]))
    full_env.update(env or {})
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                       text=True, env=full_env, cwd=PKG_PARENT, timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def pathfinder_finds(name):
    """(abs_path, found_via) of `name` as cuda.pathfinder alone finds it, or skip."""
    r = py("""
        import json
        try:
            import cuda.pathfinder as pf
        except ImportError as e:
            print(json.dumps({"skip": "cuda-pathfinder is not installed: %%s" %% e})); raise SystemExit
        try:
            dl = pf.load_nvidia_dynamic_lib(%r)
        except pf.DynamicLibNotFoundError as e:
            print(json.dumps({"skip": "cuda.pathfinder finds no %s here: %%s" %% e})); raise SystemExit
        print(json.dumps({"path": dl.abs_path, "via": dl.found_via}))
    """ % (name, name))
    if "skip" in r:
        pytest.skip(r["skip"])
    return r["path"], r["via"]


def test_import_and_plugin_do_not_import_pathfinder():
    r = py("""
        import json, sys
        import cuda_debug, cuda_debug.pytest_plugin, cuda_debug._libraries, cuda_debug._environment
        cuda_debug._environment.header_line("off", depth="driver")   # opens libcuda, if any
        print(json.dumps("cuda.pathfinder" in sys.modules))
    """)
    assert r is False


@pytest.mark.parametrize("name", ["cupti", "cublas"])
def test_found_through_pathfinder(name):
    path, via = pathfinder_finds(name)
    r = py("""
        import json, os, sys
        from cuda_debug import _libraries as L
        lib = L.load(%r)
        import cuda.pathfinder as pf
        dl = pf.load_nvidia_dynamic_lib(%r)      # cached: what pathfinder gave us
        maps = {l.split()[-1] for l in open("/proc/self/maps") if "lib%s.so" in l}
        print(json.dumps({"lib": lib._asdict(), "dl": [dl.abs_path, dl.found_via],
                          "describe": L.describe(lib), "maps": sorted(maps)}))
    """ % (name, name, name))
    lib = r["lib"]
    assert lib["loaded"] and lib["how"] == "cuda.pathfinder", lib
    assert lib["found_via"] == r["dl"][1] == via
    assert os.path.samefile(lib["path"], r["dl"][0])
    # The C loader bound the copy pathfinder loaded: one lib<name> in the process.
    assert [os.path.realpath(m) for m in r["maps"]] == [os.path.realpath(path)], r["maps"]
    assert r["describe"] == "%s (cuda.pathfinder, via %s)" % (lib["path"], via)


def test_an_already_loaded_copy_wins(tmp_path):
    """A CUPTI that a framework loaded first (here: ctypes, from elsewhere) is the
    one used; pathfinder is not even imported."""
    path, _ = pathfinder_finds("cupti")
    copy = tmp_path / os.path.basename(path)
    shutil.copyfile(os.path.realpath(path), copy)
    r = py("""
        import ctypes, json, os, sys
        ctypes.CDLL(%r, mode=os.RTLD_GLOBAL)
        from cuda_debug import _libraries as L
        lib = L.load("cupti")
        maps = {l.split()[-1] for l in open("/proc/self/maps") if "libcupti.so" in l}
        print(json.dumps({"lib": lib._asdict(), "pf": "cuda.pathfinder" in sys.modules,
                          "maps": sorted(maps)}))
    """ % str(copy))
    lib = r["lib"]
    assert lib["loaded"] and lib["how"] == "already loaded", lib
    assert os.path.samefile(lib["path"], copy)
    assert r["maps"] == [str(copy)] and r["pf"] is False


def test_an_already_loaded_cupti12_is_bound_and_doctor_names_it(cupti12):
    """CUDA 12's CUPTI (libcupti.so.12 of nvidia-cuda-cupti-cu12), loaded
    first as a PyTorch cu12 build loads it: the loader binds that copy
    (SONAMES lists libcupti.so.12), and doctor shows it. On a GPU,
    tests/house/test_cupti12.py runs scopes with it."""
    r = py("""
        import contextlib, ctypes, io, json, os, sys
        ctypes.CDLL(%r, mode=os.RTLD_GLOBAL)
        from cuda_debug import _libraries as L, _cli
        lib = L.load("cupti")
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = _cli.main(["doctor"])
        print(json.dumps({"lib": lib._asdict(), "pf": "cuda.pathfinder" in sys.modules,
                          "doctor": out.getvalue(), "rc": rc}))
    """ % cupti12.lib)
    lib = r["lib"]
    assert lib["loaded"] and lib["how"] == "already loaded", lib
    assert os.path.samefile(lib["path"], cupti12.lib)
    rows = [line for line in r["doctor"].splitlines() if line.startswith("CUPTI  ")]
    assert len(rows) == 1 and rows[0].endswith("%s (already loaded)" % cupti12.lib), r["doctor"]


def test_without_pathfinder_says_so():
    r = py("""
        import json, sys
        sys.modules["cuda.pathfinder"] = None          # import cuda.pathfinder fails
        from cuda_debug import _libraries as L
        lib = L.load("cupti")
        print(json.dumps([lib.loaded, lib.error, L.describe(lib)]))
    """)
    assert r[0] is False
    assert "cuda-pathfinder is not installed" in r[1] and "pip install cuda-pathfinder" in r[1]


def test_what_pathfinder_could_not_find_is_said():
    r = py("""
        import json
        import cuda.pathfinder as pf
        def nothing(name):
            raise pf.DynamicLibNotFoundError('Failure finding "libcublas.so": no such file')
        pf.load_nvidia_dynamic_lib = nothing
        from cuda_debug import _libraries as L
        lib = L.load("cublas")
        print(json.dumps([lib.loaded, lib.error, lib.tried]))
    """)
    loaded, error, tried = r
    assert loaded is False
    assert error.startswith("cuda.pathfinder ") and 'Failure finding "libcublas.so"' in error
    assert tried == ["already loaded: libcublas.so.13, libcublas.so.12, libcublas.so",
                     "cuda.pathfinder.load_nvidia_dynamic_lib('cublas')"]


def test_unknown_library_name_is_refused():
    from cuda_debug import _libraries
    with pytest.raises(ValueError, match="unknown library 'cudnn'"):
        _libraries.load("cudnn")


@pytest.fixture(scope="module")
def sdist(tmp_path_factory):
    """The sdist `python -m build` makes of this checkout (isolated build, as pip)."""
    root = need_source_tree("building the sdist")
    tmp_path = tmp_path_factory.mktemp("sdist")
    # (asked from outside the tree: a build/ folder there would pass for the package)
    if subprocess.run([sys.executable, "-c", "import build.__main__"], cwd=str(tmp_path),
                      capture_output=True).returncode:
        pytest.skip("the `build` package (in the [test] extra) builds the sdist")
    # From a copy without the working tree's build products: setuptools would
    # otherwise re-add every file an old *.egg-info/SOURCES.txt lists.
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        "*.egg-info", "build", "dist", ".git", "__pycache__", "*.so", ".pytest_cache", ".venv",
        "venv"))
    p = subprocess.run([sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path),
                        str(src)], capture_output=True, text=True, timeout=300, cwd=str(tmp_path))
    if p.returncode and any(w in p.stdout + p.stderr for w in (
            "No matching distribution", "Could not find a version", "NewConnectionError",
            "Network is unreachable", "Temporary failure in name resolution")):
        pytest.skip("no package index here: the isolated build cannot fetch setuptools")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    (path,) = tmp_path.glob("cuda_debug-*.tar.gz")
    return path


def _tracked(root):
    """The files the repository tracks (`git ls-files`), or, where there is no
    git checkout (an unpacked sdist), every file of the folders it ships."""
    p = subprocess.run(["git", "-C", root, "ls-files", "-z"], capture_output=True)
    if p.returncode == 0 and p.stdout and os.path.isdir(os.path.join(root, ".git")):
        files = set(p.stdout.decode().split("\0")) - {""}
        return {f for f in files if os.path.exists(os.path.join(root, f))}    # not deleted
    out = set()
    for folder in (".ci", "csrc", "cuda_debug", "docs", "tests", "benchmarks", "tools"):
        for d, dirs, files in os.walk(os.path.join(root, folder)):
            dirs[:] = [x for x in dirs if x != "__pycache__"]
            out |= {os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/") for f in files
                    if not f.endswith((".so", ".pyc", ".o"))}
    return out | {f for f in ("setup.py", "pyproject.toml", "README.md", "LICENSE", "MANIFEST.in")
                  if os.path.exists(os.path.join(root, f))}


def test_sdist_has_every_tracked_file(sdist):
    """What the build needs and what the whole test suite needs: every source,
    header, test (the fake driver's C sources), doc page and CI script."""
    root = need_source_tree("building the sdist")
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    wanted = _tracked(root) - {".gitignore"}
    assert {"csrc/base/base.h", "csrc/testing/fault_kernels_ptx.h", "csrc/base/cuda_api.h",
            "tests/conftest.py", "tests/fake_cuda/fake_cuda.c", "tests/fake_cuda/fake_common.h",
            ".ci/sanitize.sh", "docs/index.md", "cuda_debug/py.typed", "cuda_debug/README.md",
            "csrc/python/py.h", "benchmarks/probes/README.md", "tools/gen/cuda_api.py",
            "tools/gen/_gen_common.py"} <= wanted
    assert sorted(wanted - names) == [], "missing from the sdist"
    assert not [n for n in names if n.endswith((".so", ".pyc", ".o"))]


def _metadata(sdist):
    import email.parser
    with tarfile.open(sdist) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.count("/") == 1 and
                     m.name.endswith("/PKG-INFO")]
        return email.parser.Parser().parsestr(tar.extractfile(member).read().decode())


def test_sdist_metadata_names_licence_author_urls_and_classifiers(sdist):
    root = need_source_tree("reading the metadata")
    meta = _metadata(sdist)
    # `License:` is what pip < 25.0 shows (`pip show`); it excludes License-Expression.
    assert meta["License"] == "MIT" and meta["License-Expression"] is None
    assert meta.get_all("License-File") == ["LICENSE"]
    assert meta["Author"]
    urls = dict(u.split(", ", 1) for u in meta.get_all("Project-URL"))
    assert {"Homepage", "Documentation", "Source", "Issues"} <= set(urls)
    doc = urls["Documentation"].split("/blob/main/", 1)
    assert len(doc) == 2 and os.path.isfile(os.path.join(root, doc[1])), urls
    classifiers = meta.get_all("Classifier")
    assert "Typing :: Typed" in classifiers and "Operating System :: POSIX :: Linux" in classifiers
    assert [c for c in classifiers if c.startswith("Development Status :: ")]
    versions = sorted(c.rsplit(" ", 1)[1] for c in classifiers
                      if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c))
    assert meta["Requires-Python"] == ">=%s" % versions[0]
    assert versions == ["3.%d" % n for n in range(10, 10 + len(versions))]      # none skipped
    assert not [c for c in classifiers if c.startswith("License :: ")]
    try:
        from trove_classifiers import classifiers as known
    except ImportError:
        return                                   # (the [test] extra has trove-classifiers)
    assert sorted(set(classifiers) - set(known)) == []


def test_a_missing_build_piece_is_named_with_where_it_was_looked_for(tmp_path, build_python):
    """The build needs a C compiler, Python's headers and NumPy, no CUDA: with
    the compiler missing, setup.py says so, names the rest, and builds nothing
    (run with the build requirements, as pip runs it)."""
    root = need_source_tree("setup.py")
    src = tmp_path / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(
        "*.egg-info", "build", "dist", ".git", "__pycache__", "*.so", ".pytest_cache"))
    env = dict(os.environ, CC="/nonexistent/cc-for-the-test")
    p = subprocess.run([build_python, "setup.py", "build_ext", "--inplace"], cwd=str(src),
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode != 0
    assert ("cuda_debug: cannot build the C extension. It needs a C compiler, the Python headers "
            "and NumPy (no CUDA toolkit, no NVIDIA wheel). Missing:\n  - a C compiler: "
            "'/nonexistent/cc-for-the-test' (from $CC) is not on PATH") in p.stderr, p.stderr
    assert not list(src.glob("cuda_debug/_core*.so"))


def _setup_function(name):
    """A function of setup.py, without running setup()."""
    import ast
    root = need_source_tree("setup.py")
    path = os.path.join(root, "setup.py")
    tree = ast.parse(open(path, encoding="utf-8").read())
    (node,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    scope = {}
    exec(compile(ast.Module([node], type_ignores=[]), path, "exec"), scope)
    return scope[name]


def test_the_link_drops_the_interpreters_rpath():
    """pyenv's LDSHARED (and a Python built with --enable-shared) carries
    -Wl,-rpath,<its lib>: it became the wheel's RUNPATH, naming the build
    machine's Python; the wheel has no RUNPATH (.ci/run checks the built wheel)."""
    drop = _setup_function("without_rpath")
    ld = ["gcc", "-shared", "-L/root/.pyenv/versions/3.11.7/lib",
          "-Wl,-rpath,/root/.pyenv/versions/3.11.7/lib", "-Wl,-rpath=/opt/py/lib",
          "-Wl,-R,/x", "-Wl,--enable-new-dtags", "-Wl,-rpath", "-Wl,/y", "-Wl,-O1", "-lm"]
    assert drop(ld) == ["gcc", "-shared", "-L/root/.pyenv/versions/3.11.7/lib", "-Wl,-O1",
                        "-lm"]


def test_every_subpackage_is_packaged():
    """A subpackage missing from [tool.setuptools] packages is left out of the
    wheel (an installed cuda_debug then lacks cuda_debug.bench)."""
    root = need_source_tree("reading pyproject.toml")
    try:
        import tomllib
    except ImportError:                      # Python 3.10
        pytest.skip("tomllib needs Python 3.11")
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        listed = set(tomllib.load(f)["tool"]["setuptools"]["packages"])
    found = {os.path.relpath(d, root).replace(os.sep, ".")
             for d, _, files in os.walk(os.path.join(root, "cuda_debug"))
             if "__init__.py" in files and "__pycache__" not in d}
    assert found == listed, (found, listed)


def _extras():
    root = need_source_tree("reading pyproject.toml")
    try:
        import tomllib
    except ImportError:
        pytest.skip("tomllib needs Python 3.11")
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)["project"]["optional-dependencies"]


def _names(requirements):
    import re
    return {re.split(r"[<>=!~\[ ;]", r, 1)[0].lower().replace("_", "-") for r in requirements}


def test_the_test_extra_holds_what_the_tests_need_and_no_type_checker():
    """The README installs `.[test]`: what the suite needs to run (pytest, xdist,
    the notebook kernel, build, the schema and classifier checks); the type
    checkers (mypy; pyright and the Node.js it fetches) are in `.[dev]`, and
    their tests skip without them (with them, `.[test]` was 57 packages, 315 MB)."""
    extras = _extras()
    test, dev = _names(extras["test"]), _names(extras["dev"])
    assert not test & {"mypy", "pyright", "nodeenv"}, test
    assert {"pytest", "pytest-xdist", "ipython", "ipykernel", "nbclient", "nbformat", "build",
            "trove-classifiers", "jsonschema"} <= test
    assert {"mypy", "pyright", "cuda-debug"} <= dev        # dev: the test extra and both


def test_every_optional_import_of_the_tests_is_in_an_extra():
    """Each package a test imports or skips without is in `.[test]` or `.[dev]`."""
    import glob
    import re
    extras = _extras()
    listed = _names(extras["test"]) | _names(extras["dev"]) | {"numpy", "cuda-pathfinder"}
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    wanted = set()
    for path in glob.glob(os.path.join(here, "*.py")):
        text = open(path, encoding="utf-8").read()
        wanted |= set(re.findall(r'importorskip\("([\w.]+)"', text))
        wanted |= set(re.findall(r'find_spec\("([\w.]+)"\) is None', text))
    # the frameworks and the GPU's own packages: tested where installed, never required
    optional = {"torch", "cupy", "triton", "matplotlib", "IPython", "nvidia", "cuda"}
    dist = {"IPython": "ipython", "trove_classifiers": "trove-classifiers", "xdist": "pytest-xdist"}
    missing = sorted(m for m in wanted if m.split(".")[0] not in optional and
                     dist.get(m.split(".")[0], m.split(".")[0]).lower().replace("_", "-")
                     not in listed)
    assert missing == []
