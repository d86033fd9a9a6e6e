"""The house: layers you can see from the file tree, no circles.

- csrc/: every file is in a layer folder (csrc/README.md draws them); the
  include graph and the call graph (read from each object file's symbols:
  what it defines, what it needs) point down only, and the graph of C files is
  acyclic.
- cuda_debug/: the import graph of the package's modules, function-level
  imports included, is acyclic.
- One writer for each piece of process-wide state: the gates the launch
  callback reads (cd_gates) and the configuration (cd_config) are written by
  base/state.c alone; each layer's counters are static in their file, read
  through its getter (base.h says who owns what).
- One implementation of each rule: the user-frame rule (C's and Python's
  answers are the same function's), the CUDA header search, the sticky set.
"""
import ast
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile

import pytest

from conftest import need_source_tree

# Which layers each layer may call or include (its own included).
ALLOWED = {
    "base": {"base"},
    "capture": {"base", "capture"},
    "report": {"base", "capture", "report"},
    "hooks": {"base", "capture", "report", "hooks"},
    "replay": {"base", "replay"},
    "testing": {"base", "testing"},
    "bench": {"base", "testing", "bench"},
    # python/: the faces of the layers below (python/py_<layer>.c), the top
    # layer with module.c, which assembles them; nothing calls up into either.
    "python": {"base", "capture", "report", "hooks", "replay", "testing", "bench", "python"},
    "module": {"base", "capture", "report", "hooks", "replay", "testing", "bench", "python",
               "module"},
}
PYTHON_H_ALLOWED = {"module", "python", "bench", "testing", "capture/frames.c",
                    "capture/frame_readers.c"}


def _layer(rel):
    """csrc-relative path -> layer name."""
    return "module" if rel == "module.c" else rel.split("/", 1)[0]


def _csrc_files(root):
    out = []
    for d, _, files in os.walk(os.path.join(root, "csrc")):
        for f in files:
            if "__pycache__" not in d:
                out.append(os.path.relpath(os.path.join(d, f), os.path.join(root, "csrc"))
                           .replace(os.sep, "/"))
    return sorted(out)


def test_every_c_file_is_in_a_layer():
    root = need_source_tree("the layout of csrc/")
    files = _csrc_files(root)
    loose = [f for f in files if "/" not in f and f not in ("module.c", "README.md")]
    assert not loose, "files outside the layer folders: %s" % loose
    unknown = {f.split("/")[0] for f in files if "/" in f} - set(ALLOWED)
    assert not unknown, "folders that are no layer: %s (add them to csrc/README.md)" % unknown
    readme = open(os.path.join(root, "csrc", "README.md")).read()
    assert 20 <= len(readme.splitlines()) <= 45
    for layer in ALLOWED:
        if layer != "module":
            assert layer + "/" in readme
    # one face a layer, named for it; module.c assembles them and binds nothing itself
    faces = [f for f in files if f.startswith("python/") and f.endswith(".c")]
    assert faces and all(re.fullmatch(r"python/py_(\w+)\.c", f).group(1) in ALLOWED
                         for f in faces), faces
    module_c = open(os.path.join(root, "csrc", "module.c"), encoding="utf-8").read()
    assert not re.search(r"^(static )?PyObject \*(cd_)?py_\w+\(", module_c, re.M), \
        "a _core function in module.c: it goes to python/py_<layer>.c"


def _c_sources(root):
    """(csrc-relative path, text) of every C source and header."""
    for rel in _csrc_files(root):
        if rel.endswith((".c", ".h")):
            yield rel, open(os.path.join(root, "csrc", rel), encoding="utf-8").read()


def test_includes_point_down():
    root = need_source_tree("the includes of csrc/")
    bad = []
    for rel, text in _c_sources(root):
        for inc in re.findall(r'^\s*#\s*include\s+"([^"]+)"', text, re.M):
            if not os.path.exists(os.path.join(root, "csrc", inc)):
                assert "/" in inc, "%s includes %s by a bare name: write its layer" % (rel, inc)
                continue                # the interpreter's own headers (internal/...)
            target = inc.split("/", 1)[0]
            if target not in ALLOWED[_layer(rel)]:
                bad.append("%s includes %s" % (rel, inc))
        if "<Python.h>" in text and _layer(rel) not in PYTHON_H_ALLOWED and \
                rel not in PYTHON_H_ALLOWED:
            bad.append("%s includes Python.h (only %s may)" % (rel, sorted(PYTHON_H_ALLOWED)))
    assert not bad, "\n".join(bad)


def test_system_includes_say_what_they_bring():
    """`#include <string.h>   /* memcpy, strlen */`, as CPython's faulthandler
    writes them: a reader sees why each is there, and one left unused shows."""
    root = need_source_tree("the includes of csrc/")
    bare = []
    for rel, text in _c_sources(root):
        if "do not edit" in text.split("\n", 1)[0].lower():
            continue                    # generated (tools/gen/)
        bare += ["%s: %s" % (rel, line.strip()) for line in text.splitlines()
                 if re.match(r"\s*#\s*include\s*<[^>]+>\s*$", line)]
    assert not bare, "say what each brings (/* name, ... */):\n" + "\n".join(bare)


def _compile_flags():
    # csrc/ reads no CUDA header (csrc/base/cuda_api.h declares what it uses;
    # house/test_cuda_api.py checks): it compiles where no toolkit is.
    try:
        import numpy
    except ImportError:
        pytest.skip("no NumPy headers here")
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    root = need_source_tree("compiling csrc/")
    return cc, ["-std=gnu11", "-O0", "-fPIC", "-c", "-I" + os.path.join(root, "csrc"),
                "-I" + sysconfig.get_paths()["include"], "-I" + numpy.get_include(),
                "-DNPY_NO_DEPRECATED_API=NPY_1_7_API_VERSION"]


def _symbols(obj):
    """(defined, undefined) global symbol names of an object file."""
    out = subprocess.run(["nm", "-P", obj], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRV" or kind in "W":
            defined.add(name)
    return defined, undefined


@pytest.fixture(scope="module")
def call_graph():
    """{file: {file it calls or reads}} from the symbols of each compiled csrc/ file."""
    root = need_source_tree("compiling csrc/")
    if not shutil.which("nm"):
        pytest.skip("no nm (binutils)")
    cc, flags = _compile_flags()
    sources = [f for f in _csrc_files(root) if f.endswith(".c")]
    work = tempfile.mkdtemp(prefix="cuda_debug_arch_")

    def build(rel):
        obj = os.path.join(work, rel.replace("/", "__") + ".o")
        p = subprocess.run([cc] + flags + [os.path.join(root, "csrc", rel), "-o", obj],
                           capture_output=True, text=True)
        assert p.returncode == 0, "%s does not compile:\n%s" % (rel, p.stderr)
        return rel, _symbols(obj)

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            syms = dict(pool.map(build, sources))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    owner = {}
    for rel, (defined, _) in syms.items():
        for name in defined:
            owner.setdefault(name, rel)
    return {rel: {owner[n] for n in undefined if n in owner and owner[n] != rel}
            for rel, (_, undefined) in syms.items()}


def test_calls_point_down(call_graph):
    bad = ["%s -> %s" % (a, b) for a, targets in sorted(call_graph.items()) for b in sorted(targets)
           if _layer(b) not in ALLOWED[_layer(a)]]
    assert not bad, "calls up a layer:\n" + "\n".join(bad)
    # the graph reads what it should: the callback calls into report/ and capture/
    assert "report/fault_records.c" in call_graph["hooks/launch_callback.c"]
    assert "capture/watch_ring.c" in call_graph["hooks/launch_callback.c"]
    # python/py_<layer>.c is that layer's face: it calls into it
    for face in (f for f in call_graph if f.startswith("python/")):
        layer = face[len("python/py_"):-len(".c")]
        assert any(_layer(t) == layer for t in call_graph[face]), face


# -- one writer for each piece of state ---------------------------------------

#: The shared state of base.h, and the one file that writes it.
STATE_OWNERS = {"cd_gates": "base/state.c", "cd_config": "base/state.c"}


def _strip_c_comments(text):
    return re.sub(r"/\*.*?\*/|//[^\n]*", lambda m: re.sub(r"[^\n]", " ", m.group()), text,
                  flags=re.S)


def _state_writes(text, name):
    """The places (line, text) where C source `text` writes `name` or a field
    of it: an assignment, ++/--, or its address taken other than for an atomic
    load (an atomic store, add, exchange; a pointer that escapes)."""
    text = _strip_c_comments(text)
    ref = r"\b%s\b(?:\s*(?:\.|->)\s*\w+|\s*\[[^\]]*\])*" % re.escape(name)
    patterns = [ref + r"\s*(?:[-+*/%&|^]|<<|>>)?=(?!=)", ref + r"\s*(?:\+\+|--)",
                r"(?:\+\+|--)\s*" + ref,
                # &x as an operand (not a && b, not a & b), but for an atomic load
                r"(?:(?<=[(,=!?:;{])|(?<=[(,=!?:;{]\s))(?<!atomic_load\()"
                r"(?<!atomic_load_explicit\()&(?!&)\s*" + ref]
    out = []
    for pat in patterns:
        for m in re.finditer(pat, text):
            out.append((text.count("\n", 0, m.start()) + 1, m.group().strip()))
    return sorted(set(out))


def test_state_write_finder():
    src = """
        x = cd_gates.active;              /* a read */
        if (cd_config.detach == 1) y = atomic_load(&cd_gates.watching);
        n = atomic_load_explicit(&cd_gates.capture_gen, memory_order_relaxed);
        cd_config.detach = 1;
        cd_gates.watch_every++;
        atomic_fetch_add(&cd_gates.active, 1);
        cd_config = c;
        if (a && cd_config.profile && (b & cd_gates.active)) p = &x;
        // cd_config.profile = 1;  (a comment)
        f(1, &cd_gates.in_callback);
    """
    got = _state_writes(src, "cd_gates") + _state_writes(src, "cd_config")
    assert [line for line, _ in sorted(got)] == [5, 6, 7, 8, 11], got


def test_state_has_one_writer():
    """The gates and the configuration are written where they are defined
    (base/state.c's cd_gate_* and cd_configure), nowhere else."""
    root = need_source_tree("the sources of csrc/")
    bad = []
    for rel, text in _c_sources(root):
        for name, owner in STATE_OWNERS.items():
            if rel != owner:
                bad += ["%s:%d writes %s" % (rel, line, what)
                        for line, what in _state_writes(text, name)]
    assert not bad, "state written outside its owner:\n" + "\n".join(bad)
    state_c = open(os.path.join(root, "csrc", "base", "state.c"), encoding="utf-8").read()
    assert all(_state_writes(state_c, name) for name in STATE_OWNERS)   # the finder sees them
    base_h = open(os.path.join(root, "csrc", "base", "base.h"), encoding="utf-8").read()
    assert not re.search(r"\bcd_state(_t)?\b", base_h), "one struct for all of it again"


def _cycles(graph):
    """The strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]
    sys.setrecursionlimit(max(10000, sys.getrecursionlimit()))

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def test_c_files_call_no_circle(call_graph):
    assert _cycles(call_graph) == []


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _python_imports(pkg_dir):
    """{module: {cuda_debug module it imports}}, function-level imports included."""
    mods = {}
    for d, _, files in os.walk(pkg_dir):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(d, f), os.path.dirname(pkg_dir))[:-3]
                name = rel.replace(os.sep, ".")
                mods[name[:-len(".__init__")] if name.endswith(".__init__") else name] = \
                    os.path.join(d, f)
    known = set(mods) | {"cuda_debug._core"}
    graph = {}
    for mod, path in mods.items():
        is_pkg = path.endswith("__init__.py")
        deps = set()
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in known}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
                    base = base[:len(base) - node.level + 1]
                    target = ".".join(base + ([node.module] if node.module else []))
                else:
                    target = node.module or ""
                subs = {target + "." + a.name for a in node.names} & known
                deps |= subs
                if len(subs) < len(node.names) and target in known:
                    deps.add(target)
        deps.discard(mod)
        deps.discard("cuda_debug._core")
        graph[mod] = deps
    return graph


def test_python_modules_import_no_circle():
    import cuda_debug
    graph = _python_imports(os.path.dirname(os.path.abspath(cuda_debug.__file__)))
    assert "cuda_debug._report" in graph and "cuda_debug.bench._gemm" in graph
    assert _cycles(graph) == []


def test_the_replay_commands_settings_are_written_by_its_configure_alone():
    """The command line says what it runs through _replay_command.configure():
    no module assigns that module's globals from outside."""
    import cuda_debug
    pkg = os.path.dirname(os.path.abspath(cuda_debug.__file__))
    writes = []
    for d, _, files in os.walk(pkg):
        for f in sorted(files):
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                writes += ["%s:%d" % (os.path.relpath(path, pkg), node.lineno) for t in targets
                           if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                           and t.value.id == "_replay_command"]
    assert writes == []


# -- one implementation of each rule ------------------------------------------

def test_one_header_search():
    """The generators, the fake driver and the tests that read the CUDA headers
    use cuda_debug/_cuda_headers.py; the build itself reads none (setup.py)."""
    root = need_source_tree("setup.py")
    users = ["tools/gen/_gen_common.py", "tests/fake_cuda/__init__.py",
             "tests/house/test_error_table.py", "tests/house/test_cuda_api.py"]
    # the generators that read the headers, through their shared part
    for rel in ("tools/gen/cuda_api.py", "tools/gen/cuda_errors.py"):
        text = open(os.path.join(root, rel), encoding="utf-8").read()
        assert "_gen_common.header_search()" in text and "spec_from_file" not in text, rel
    for rel in users:
        text = open(os.path.join(root, rel), encoding="utf-8").read()
        assert "_cuda_headers.py" in text, rel
        assert "nvidia/cu13" not in text and '"cu13"' not in text and not (
            rel.startswith("tools/") and re.search(r"/usr/local/cuda(?!/bin/nvcc)", text)), \
            "%s spells out a header folder of its own" % rel
    setup_py = open(os.path.join(root, "setup.py"), encoding="utf-8").read()
    code = "\n".join(line for line in setup_py.splitlines() if not line.lstrip().startswith("#"))
    for needle in ("_cuda_headers", "cuda.h", "cupti.h", "CUDA_HOME", "include_dirs=[\"csrc\"]"):
        assert (needle in code) == (needle == "include_dirs=[\"csrc\"]"), \
            "setup.py: %r (the build needs no CUDA header: csrc/base/cuda_api.h)" % needle
    for rel in ("base/base.h", "bench/bench.h"):
        text = open(os.path.join(root, "csrc", rel), encoding="utf-8").read()
        assert '#include "base/cuda_api.h"' in text or rel != "base/base.h"
    bad = [rel for rel in _csrc_files(root) if rel.endswith((".c", ".h")) and re.search(
        r"^\s*#\s*include\s*<(cuda|cupti|cublas_api|cublasLt|cublas_v2)\.h>",
        open(os.path.join(root, "csrc", rel), encoding="utf-8").read(), re.M)]
    assert not bad, "include base/cuda_api.h, not the CUDA headers: %s" % bad


def test_sticky_set_is_one_table():
    from cuda_debug import _core, _cuda_errors
    assert set(_core.STICKY_CODES) == set(_cuda_errors.STICKY)


def test_user_frame_rule_is_one_rule(fake_child):
    """The same file names, seen by the C launch callback (the kind it gave each
    code location while watching) and by Python (_locations.is_user_file), give
    the same answer, and the expected one: relative, absolute, pseudo-files,
    site-packages, the Inductor cache, Cython, symlinks into a library folder,
    a relative name resolved against the current folder."""
    c = fake_child('''
        import os, tempfile
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core, _locations, _report
        tmp = tempfile.mkdtemp()
        stdlib = os.path.dirname(os.__file__)
        os.symlink(stdlib, os.path.join(tmp, "lib_link"))
        inductor = [p for p in _locations.library_prefixes() if "torchinductor_" in p][0]
        L, U, P = _core.LOC_LIBRARY, _core.LOC_USER, _core.LOC_PSEUDO
        cases = [
            ("train.py", U, None),                    # runpy.run_path("train.py")
            ("sub/model.py", U, None),
            (os.path.join(tmp, "user.py"), U, None),
            ("<stdin>", U, None), ("<ipython-input-3-abc>", U, None),
            ("<string>", P, None), ("<frozen runpy>", L, None), ("<eval_with_key>.3", L, None),
            ("/x/site-packages/torch/nn/functional.py", L, None),
            ("/usr/lib/python3/dist-packages/numpy/core.py", L, None),
            (os.path.join(inductor, "ab", "cab.py"), L, None),
            ("cupy_backends/cuda/api/driver.pyx", L, None),
            (os.path.join(tmp, "lib_link", "json", "decoder.py"), L, None),
            (os.path.join(os.path.dirname(cuda_debug.__file__), "_scope.py"), L, None),
            ("json/decoder.py", L, stdlib),           # relative, resolved against the cwd
            ("json/decoder.py", U, tmp),
        ]
        out = []
        with cuda_debug.watch():
            for name, want, cwd in cases:
                old = os.getcwd()
                if cwd:
                    os.chdir(cwd)
                try:
                    before = _core.watch_seq()
                    exec(compile("t.empty()\\n", name, "exec"), {"t": t})   # then freed
                    rec = _report.watch_record(before + 1)
                    kinds = [loc[3] for loc in map(_core.location, rec.frames)
                             if loc and loc[0] == name]
                    out.append(dict(name=name, want=want, c=kinds[0] if kinds else None,
                                    py=_core.file_kind(name),
                                    user=_locations.is_user_file(name)))
                finally:
                    os.chdir(old)
        report(out)
    ''')
    assert c.result is not None, c
    assert len(c.result) == 16
    for r in c.result:
        assert r["c"] == r["want"], r           # what the callback recorded
        assert r["py"] == r["want"], r          # what Python is told
        assert r["user"] == (r["want"] == 1), r
