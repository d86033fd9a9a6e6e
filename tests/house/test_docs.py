"""The README and docs/*.md: what a strict documentation build would check, and
that the examples run or say why not.

- the README is a first screen (at most 250 lines); every page of docs/ is
  reachable from it; every relative link and #anchor resolves;
- every page whose examples need a GPU (or PyTorch, or your own code) says so
  in a "To run the examples" line;
- every Python example parses, and every ``cuda_debug.NAME`` it uses exists;
- every documented command line is run (``cuda-debug run/doctor``, with an
  empty script in place of yours) or parsed by the real parser (``bench``), and
  every pytest option it shows is registered;
- the README's ``>>>`` session runs, against the fake CUDA driver, and prints
  the exception text the README shows.

The pages are plain Markdown (GitHub and the sdist render them; no site build)."""
import ast
import glob
import importlib.util
import os
import re
import shlex
import subprocess
import sys
import textwrap

import pytest

import cuda_debug

from conftest import PKG_PARENT, SOURCE_TREE

MAX_README_LINES = 250


def _root():
    if SOURCE_TREE is None or not os.path.isdir(os.path.join(SOURCE_TREE, "docs")):
        pytest.skip("the README and docs/ are not next to the tests")
    return SOURCE_TREE


def _pages():
    root = _root()
    pages = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
    return {os.path.relpath(p, root): open(p, encoding="utf-8").read() for p in pages}


FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.M | re.S)


def blocks(text):
    """(info string, body) of every fenced code block."""
    return [(m.group(1).strip(), m.group(2)) for m in FENCE.finditer(text)]


def _prose(text):
    """The text outside code blocks and inline code."""
    return re.sub(r"`[^`\n]*`", "", FENCE.sub("", text))


def slug(heading):
    """GitHub's anchor for a heading."""
    h = re.sub(r"[`*_]", "", heading.strip().lower())
    h = re.sub(r"[^\w\- ]", "", h)
    return h.replace(" ", "-")


def anchors(text):
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", FENCE.sub("", text), re.M)}


def links(text):
    return re.findall(r"\]\(([^)\s]+)\)", _prose(text))


def test_the_readme_is_a_first_screen():
    readme = _pages()["README.md"]
    n = readme.count("\n")
    assert n <= MAX_README_LINES, "README.md has %d lines (at most %d: the reference goes to " \
        "docs/)" % (n, MAX_README_LINES)
    first = blocks(readme)[0]
    assert first[0] == "bash" and "pip install -e '.[test]'" in first[1] and \
        "python3 -m pytest" in first[1], first      # the two commands come first


def test_every_link_and_anchor_resolves():
    root = _root()
    pages = _pages()
    bad = []
    for name, text in pages.items():
        for target in links(text):
            if re.match(r"[a-z]+:", target):            # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            full = os.path.normpath(os.path.join(root, os.path.dirname(name), path)) if path \
                else os.path.join(root, name)
            if not os.path.exists(full):
                bad.append("%s: %s (no such file)" % (name, target))
            elif anchor:
                rel = os.path.relpath(full, root)
                if rel not in pages or anchor not in anchors(pages[rel]):
                    bad.append("%s: %s (no such heading)" % (name, target))
    assert bad == []


def test_every_page_is_reachable_from_the_readme():
    root = _root()
    pages = _pages()
    seen, todo = set(), ["README.md"]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for target in links(pages[name]):
            path = target.partition("#")[0]
            if path and not re.match(r"[a-z]+:", path):
                rel = os.path.relpath(os.path.normpath(os.path.join(root, os.path.dirname(name),
                                                                    path)), root)
                if rel in pages:
                    todo.append(rel)
    assert sorted(set(pages) - seen) == []


def test_pages_with_examples_say_what_they_need():
    """An example that cannot run here (no GPU, no PyTorch, your own model) says why."""
    missing = [name for name, text in _pages().items()
               if name != "docs/building.md" and any(
                   info in ("python", "bash") for info, _ in blocks(text))
               and "**To run the examples**" not in text]
    assert missing == []


# -- Python examples -----------------------------------------------------------------------

def python_examples():
    out = []
    for name, text in _pages().items():
        for info, body in blocks(text):
            if info != "python":
                continue
            if body.lstrip().startswith(">>>"):             # a session: its input lines
                body = "\n".join(line[4:] for line in body.splitlines()
                                 if line.startswith((">>> ", "... ")) or line in (">>>", "..."))
            out.append((name, body))
    return out


def test_python_examples_parse_and_use_real_names():
    import cuda_debug.bench                                 # noqa: F401  (NumPy: fine in tests)
    bad = []
    for name, body in python_examples():
        try:
            tree = ast.parse(textwrap.dedent(body))
        except SyntaxError as e:
            bad.append("%s: %s\n%s" % (name, e, body))
            continue
        for node in ast.walk(tree):
            chain = []
            while isinstance(node, ast.Attribute):
                chain.append(node.attr)
                node = node.value
            if not (isinstance(node, ast.Name) and node.id == "cuda_debug" and chain):
                continue
            obj = cuda_debug
            for attr in reversed(chain):
                if attr in ("array",):                  # a result's attribute, not the API's
                    break
                if not hasattr(obj, attr):
                    bad.append("%s: cuda_debug.%s does not exist" % (name, ".".join(reversed(chain))))
                    break
                obj = getattr(obj, attr)
    assert bad == []


# -- one set of cost figures ------------------------------------------------------------------

#: a measured ratio (1.043x); a target (<= 1.05x) is no measurement
_RATIO = re.compile(r"(?<!<= )(?<!<=)\b\d+\.\d+x\b")
#: pages whose own subject is a measurement that is no mode's cost: GEMMs under
#: CUDA_LAUNCH_BLOCKING=1 (bench.md)
_OWN_FIGURES = {"docs/bench.md"}


def test_cost_figures_live_in_costs_md_only():
    """What a mode costs is written once, in docs/costs.md; every other page links
    there (once watch() on a tiny op was 1.04x in the README, 1.14 in costs.md,
    1.043x and 1.009x in watch.md), so one edit updates them all."""
    bad = []
    for name, text in _pages().items():
        if name == "docs/costs.md" or name in _OWN_FIGURES:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if _RATIO.search(line) or re.search(r"\bhalve", line):
                bad.append("%s:%d: %s" % (name, n, line.strip()))
    assert bad == []


def test_costs_md_cites_the_results_it_takes_its_figures_from():
    """Every figure of the table names its source, a section of
    benchmarks/RESULTS.md that exists (the numbers are measured, not written)."""
    root = _root()
    costs = _pages()["docs/costs.md"]
    results = open(os.path.join(root, "benchmarks", "RESULTS.md"), encoding="utf-8").read()
    headings = re.findall(r"^## (.+)$", results, re.M)
    table = costs.split("## The table", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    assert len(rows) >= 6, rows
    used = set()
    for row in rows:
        for cell in row.split("|")[2:-1]:
            if cell.strip():
                m = re.fullmatch(r"\s*\d+\.\d+ \(([a-z])\)\s*", cell)
                assert m, (row, cell)           # a number and its source, nothing else
                used.add(m.group(1))
    notes = dict(re.findall(r'^- \(([a-z])\) "([^"]+)"', table, re.M))
    assert sorted(used - set(notes)) == []
    for letter, section in notes.items():
        assert any(h.startswith(section) for h in headings), (letter, section, headings)


def test_the_readmes_gemm_rows_are_measured_ones():
    """The README's `bench gemm` rows are rows of benchmarks/RESULTS.md, under the
    same dtype (real measured rows, never written by hand), and
    it shows the picture."""
    root = _root()
    readme = _pages()["README.md"]
    section = readme.split("cuda-debug bench gemm`", 1)[1].split("\n## ", 1)[0]
    results = open(os.path.join(root, "benchmarks", "RESULTS.md"), encoding="utf-8").read()
    seed = results[results.index("### Every dtype, flag and mode"):]
    rows = 0
    for part in section.split("**")[1::2]:              # **fp32**, **bf16**
        dtype = part.split()[0]
        table = section.split("**%s**" % part, 1)[1].split("**", 1)[0]
        block = seed[seed.index("**%s" % dtype):]
        block = block[:block.index("\n**", 1)] if "\n**" in block[1:] else block
        for line in table.splitlines():
            if re.match(r"\| \d", line):
                assert line in block, (dtype, line)
                rows += 1
    assert rows >= 4
    assert "](benchmarks/seed_question.png)" in section


# -- command lines ---------------------------------------------------------------------------

def command_lines():
    """(page, argv after `cuda_debug`/`cuda-debug`) of every documented command."""
    out = []
    for name, text in _pages().items():
        for info, body in blocks(text):
            if info != "bash":
                continue
            for line in body.splitlines():
                code = line.split("  #", 1)[0].split(" # ", 1)[0].strip()
                m = re.search(r"(?:-m cuda_debug|^cuda-debug)\s+(.*)$", code)
                if m:
                    out.append((name, shlex.split(m.group(1))))
    return out


def test_documented_run_and_doctor_commands_run(tmp_path):
    """`run` with an empty script (and module) in place of yours: the options
    are accepted (exit 0, no usage error); `doctor`: 0, or 1 without a GPU."""
    script = tmp_path / "train.py"
    script.write_text("def main():\n    pass\n")
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "train.py").write_text("pass\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [
        PKG_PARENT, str(tmp_path), os.environ.get("PYTHONPATH")])))
    env.pop("CUDA_DEBUG_HANG_AFTER", None)
    ran = 0
    for name, argv in command_lines():
        if argv[0] not in ("run", "doctor"):
            continue
        stdin = None
        if "<" in argv:                                    # run - < train.py
            i = argv.index("<")
            stdin = open(os.path.join(tmp_path, argv[i + 1]), "rb")
            argv = argv[:i]
        p = subprocess.run([sys.executable, "-m", "cuda_debug"] + argv, stdin=stdin,
                           capture_output=True, text=True, cwd=str(tmp_path), env=env,
                           timeout=120)
        if stdin:
            stdin.close()
        ok = p.returncode in ((0, 1) if argv[0] == "doctor" else (0,))
        assert ok, "%s: `cuda-debug %s` exited %d:\n%s" % (name, " ".join(argv), p.returncode,
                                                            p.stderr[-2000:])
        ran += 1
    assert ran >= 10


#: a command of cuda_debug's, where a line or a span of a page names one; in the
#: prose also without the prefix when an option follows (`run --replay`)
_COMMAND = re.compile(r"(?:^|(?<=[\s(]))(?:cuda-debug|-m cuda_debug)\s+(\S.*)$")
_BARE = re.compile(r"^()((?:run|replay|dump|doctor|bench) --.*)$")
#: the pages' placeholders, as a value that the parsers take
_PLACEHOLDERS = {"PID": "4242", "TORCHRUN_PID": "4242", "N": "12", "N[,N2,...]": "12",
                 "N1,N2,...": "12,15", "M": "3", "W": "2", "NAME": "gather_rows", "S": "60",
                 "HOST:PORT": "node0:29500", "module": "mypkg.train"}


def _commands_in(code, prose=False):
    """(argv after the command) of each command in one line of code (or a
    span), unless it is an example of output (``cuda-debug run: error: ...``),
    a list (``run / dump``) or elided (``dump ...``)."""
    spans = re.findall(r"`([^`]+)`", code) or [code]
    out = []
    for text in spans:
        text = text.split("  #", 1)[0].split(" # ", 1)[0].strip()
        m = _COMMAND.search(text) or (_BARE.match(text) if prose else None)
        if not m:
            continue
        try:                                             # run -c 'import train'
            words = shlex.split(m.group(m.lastindex))
        except ValueError:
            words = m.group(m.lastindex).split()
        if not words:
            continue
        if words[0].endswith(":") or "/" in words[:2] or "..." in words:
            continue
        argv = []
        for w in words:
            if w == "<":                                 # run - < train.py
                break
            if w.startswith("[") and w.endswith("]") and not w.startswith("[-") and \
                    w not in _PLACEHOLDERS:
                continue                                 # an optional positional: left out
            w = w if w in _PLACEHOLDERS else w.strip("[]")
            if w in _PLACEHOLDERS:
                argv.append(_PLACEHOLDERS[w])
            elif not w.endswith("..."):                  # args...: the program's own
                argv.append(w)
        out.append(argv)
    return out


def documented_commands():
    """(page, text, argv) of every cuda-debug / python -m cuda_debug command line
    of the README and docs/: in code blocks of any kind (commands, and the ones
    reports print), a shell prompt's (``$ ``), lines continued with ``\\``, and
    inline code in the prose."""
    out = []
    for name, text in _pages().items():
        for info, body in blocks(text):
            body = body.replace("\\\n", " ")
            for line in body.splitlines():
                line = line[2:] if line.startswith("$ ") else line
                out += [(name, line.strip(), argv, False) for argv in _commands_in(line)]
        prose = FENCE.sub("", text)
        for span in re.findall(r"`([^`]+)`", prose.replace("\n", " ")):
            out += [(name, span, argv, True) for argv in _commands_in("`%s`" % span, True)]
    return out


def _check_command(argv, prose):
    """Parse `argv` as the command line does. In the prose a mention of a
    command (`cuda-debug dump`) or of its option (`run --replay`) may leave out
    the program or the PID: one is put in."""
    from cuda_debug import _cli
    if prose and len(argv) == 1:
        argv = argv + ["--help"]
    try:
        _cli.check_command_line(argv)
    except _cli.UsageError as e:
        if not (prose and "is required" in str(e)):
            raise
        _cli.check_command_line(argv + (["4242"] if argv[0] == "dump" else ["train.py"]))


def test_every_documented_command_line_parses(capsys):
    """Every command line a page shows is parsed by the command's own parser
    (nothing runs): a page cannot show a command or an option that does not
    exist (a `dump --signal` the command refuses), nor one it refuses."""
    from cuda_debug import _cli
    found = documented_commands()
    bad = []
    for name, text, argv, prose in found:
        try:
            _check_command(argv, prose)
        except _cli.UsageError as e:
            bad.append("%s: `%s`: %s" % (name, text, e))
        except SystemExit as e:
            if e.code:
                bad.append("%s: `%s`: %s" % (name, text, capsys.readouterr().err.strip()))
    assert bad == []
    commands = {argv[0] for _, _, argv, _ in found}
    assert commands >= {"run", "replay", "dump", "doctor", "bench"}, commands
    assert len(found) >= 40, len(found)


@pytest.mark.parametrize("line, refused", [
    ("cuda-debug dump --signal SIGUSR2 4242", "unrecognized arguments: --signal"),
    ("python -m cuda_debug run --launch-blocking --no-watch train.py", "exclude each other"),
    ("cuda-debug replay --launch 2,2 train.py", "more than once"),
    ("cuda-debug frobnicate", "unknown command"),
    ("`dump --signal SIGUSR2`", "unrecognized arguments: --signal"),       # in the prose
])
def test_a_command_line_the_cli_refuses_fails_the_docs_test(line, refused, capsys):
    """The check above finds what it must: a line the command refuses."""
    from cuda_debug import _cli
    prose = line.startswith("`")
    (argv,) = _commands_in(line, prose)
    with pytest.raises((_cli.UsageError, SystemExit)) as e:
        _check_command(argv, prose)
    assert refused in str(e.value) + capsys.readouterr().err


def test_the_hang_report_of_hangs_md_is_the_one_watch_writes(fake_child):
    """hangs.md's sample report, as the fake driver makes it write: the same
    lines, but for the numbers, the script and the pids."""
    page = _pages()["docs/hangs.md"]
    (sample,) = [b for info, b in blocks(page) if "possible hang" in b]
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        with cuda_debug.watch(hang_after=0.3):
            t.spin(1.2)
            t.empty()
            t.empty()
            cuda_debug.check()
    ''', env={"CUDA_DEBUG_WATCH_EXACT": "1"})
    assert c.returncode == 0, c
    written = c.stderr[c.stderr.index("cuda_debug (watch): possible hang"):].splitlines()[:5]

    def shape(lines):
        return [re.sub(r"\d+(\.\d+)?", "N", re.sub(r"at \S+\.py:", "at FILE:", line))
                for line in lines]

    assert shape(sample.strip().splitlines()) == shape(written)


def test_the_index_names_every_command_of_cli_md():
    """docs/index.md's line for cli.md names each command (it left replay out)."""
    from cuda_debug import _cli
    (row,) = [line for line in _pages()["docs/index.md"].splitlines()
              if line.startswith("| [cli.md]")]
    assert [c for c in _cli.COMMANDS if "`%s`" % c not in row] == []
    assert [c for c in _cli.COMMANDS if "\n  %s " % c not in _cli.USAGE] == []


def test_documented_pytest_options_exist():
    shown = set()
    for name, text in _pages().items():
        for info, body in blocks(text):
            if info == "bash":
                shown |= set(re.findall(r"^\s*pytest .*?(--cuda[\w-]+)", body, re.M))
    assert len(shown) >= 3
    p = subprocess.run([sys.executable, "-m", "pytest", "--help", "-p", "no:cacheprovider"],
                       capture_output=True, text=True, timeout=120, cwd=PKG_PARENT)
    assert p.returncode == 0, p.stderr
    assert sorted(o for o in shown if o not in p.stdout) == []


# -- the README's session, run ------------------------------------------------------------

def test_the_readme_session_runs_and_prints_what_the_readme_shows(fake_child):
    """The fake driver's check_index<int> fails the assert the real kernel does,
    so the README's >>> session, typed into an interactive console, must end
    with the exception text the README shows."""
    readme = _pages()["README.md"]
    (session,) = [b for info, b in blocks(readme) if info == "python" and b.startswith(">>>")]
    typed = [line[4:] for line in session.splitlines() if line.startswith((">>> ", "... "))]
    shown = session.split("  ...\n", 1)[1].rstrip("\n")          # after the elided frames
    c = fake_child('''
        import code, sys
        console = code.InteractiveConsole(filename="<stdin>")
        for line in %r:
            console.push(line)
        console.push("")
    ''' % (typed,))
    assert c.returncode == 0, c
    assert shown in c.stderr, c


# -- every public name, flag and variable is on a page -------------------------------------

def _inline_code(text):
    """The text of the pages' code: fenced blocks and inline spans."""
    fences = [body for _, body in blocks(text)]
    prose = FENCE.sub("", text)
    return "\n".join(fences + re.findall(r"`([^`]+)`", prose))


def _public_surface():
    """(what, the word a page must show, kind) of everything a user can name: the
    public names of cuda_debug, cuda_debug.testing and cuda_debug.bench and the
    parameters of their callables; every option of every command; the pytest
    options, ini settings, markers and fixtures; the CUDA_DEBUG_* variables; the
    attributes of the errors (those of CudaError in reports.md, GuardError's in
    guard.md). kind: "flag" (found anywhere), "name" (in code), or a page's name."""
    import argparse
    import inspect
    import cuda_debug.testing
    from cuda_debug import _errors, _options, pytest_plugin
    from cuda_debug._cli import doctor, dump, replay, run
    out = []
    modules = [cuda_debug, cuda_debug.testing]
    if importlib.util.find_spec("numpy") is not None:
        import cuda_debug.bench
        modules.append(cuda_debug.bench)
    for mod in modules:
        for n in mod.__all__:
            out.append(("%s.%s" % (mod.__name__, n), n, "name"))
            obj = getattr(mod, n)
            if not callable(obj):
                continue
            try:
                params = inspect.signature(obj).parameters.values()
            except (TypeError, ValueError):
                continue
            out += [("%s.%s(%s=)" % (mod.__name__, n, p.name), p.name, "name") for p in params
                    if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]

    def flags(p, where):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sub, sp in a.choices.items():
                    yield from flags(sp, where + " " + sub)
            for o in a.option_strings:
                if o.startswith("--") and o != "--help":
                    yield ("%s %s" % (where, o), o, "flag")
    parsers = [("run", run._run_parser()), ("replay", replay._replay_parser()),
               ("dump", dump._dump_parser()), ("doctor", doctor._doctor_parser())]
    if importlib.util.find_spec("numpy") is not None:
        from cuda_debug.bench import _cli as bench_cli
        parsers.append(("bench", bench_cli.parser()))
    for command, parser in parsers:
        out += list(flags(parser, command))
    pp = pytest_plugin
    out += [(w, w, "flag") for w in (pp.OPTION, pp.WATCH_OPTION, pp.GUARD_OPTION)]
    out += [(w, w, "name") for w in (pp.INI, pp.MARKER, pp.FIXTURE, pp.WATCH_INI,
                                     pp.WATCH_MARKER, pp.WATCH_FIXTURE, pp.GUARD_INI,
                                     pp.GUARD_MARKER)]
    known = set(_options._CHOICES) | set(_options._FREE) | set(_options._SPECIAL)
    out += [(v, v, "flag") for v in sorted(known)]
    out += [("CudaError." + f, f, "reports.md") for f in _errors.REPORT_FIELDS]
    out += [("GuardError." + f, f, "guard.md") for f in _errors.GUARD_FIELDS]
    return out


def _unmentioned(surface, pages):
    text = "\n".join(pages.values())
    code = _inline_code(text)
    missing = []
    for what, word, kind in surface:
        if kind == "flag":
            where = text
            pattern = r"(?<![\w-])%s(?![\w-])"
        else:
            where = code if kind == "name" else _inline_code(pages["docs/" + kind])
            pattern = r"(?<!\w)%s(?!\w)"
        if not re.search(pattern % re.escape(word), where):
            missing.append(what)
    return missing


def test_every_public_name_flag_and_variable_is_on_a_page():
    """What the code offers a user (a name, a parameter, an option, a variable, an
    error's attribute) is said on some page of docs/ or the README, or it is
    private (55 were once on no page)."""
    surface = _public_surface()
    assert len(surface) > 250, len(surface)
    assert _unmentioned(surface, _pages()) == []


def test_the_public_surface_check_finds_what_no_page_says():
    pages = dict(_pages())
    pages["docs/reports.md"] = pages["docs/reports.md"].replace("`kernel_mangled`", "")
    surface = [("run --no-such-flag", "--no-such-flag", "flag"),
               ("cuda_debug.no_such_name", "no_such_name", "name"),
               ("CudaError.kernel_mangled", "kernel_mangled", "reports.md"),
               ("run --hang-after", "--hang-after", "flag")]
    assert _unmentioned(surface, pages) == ["run --no-such-flag", "cuda_debug.no_such_name",
                                            "CudaError.kernel_mangled"]
