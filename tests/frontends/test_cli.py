"""``python -m cuda_debug run|doctor|bench`` as subprocesses, on CPU and GPU."""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import conftest
from conftest import PKG_PARENT, gpu_unavailable_reason
from helpers.cli import NO_GPU, cli, cli_env  # noqa: F401


def script(tmp_path, source, name="user_script.py"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(source).lstrip())
    return p


def report_start(lines, head):
    """Index of the short report's first line in stderr."""
    for i, line in enumerate(lines):
        if line.startswith(head):
            return i
    raise AssertionError("no line starting with %r in:\n%s" % (head, "\n".join(lines)))


def line_of(path, marker):
    return conftest.line_of(path.read_text(), marker)


FAKE_ASSERT = '''
import cuda_debug

def fault():
    raise cuda_debug.DeviceAssertError(
        code=710, kernel="void cuda_debug_testing::check_index<int>(int const*, int)",
        filename=__file__, lineno=9, function="<module>", line="fault()",
        device_message="fault_kernels.cu:14: check_index: block: [0,0,0], thread: [3,0,0] "
                       "Assertion `idx[i] >= 0 && idx[i] < limit` failed.")

fault()
'''


# -- the command word -------------------------------------------------------------------

def test_no_command_prints_usage_and_fails():
    r = cli()
    assert r.returncode == 2
    assert "usage: python -m cuda_debug <command>" in r.stderr


def test_help_and_version():
    r = cli("--help")
    assert r.returncode == 0 and "doctor" in r.stdout and "run" in r.stdout
    r = cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("cuda_debug 0.")


def test_unknown_command():
    r = cli("frobnicate")
    assert r.returncode == 2 and "unknown command 'frobnicate'" in r.stderr


def test_bench_is_dispatched_or_said_missing():
    r = cli("bench", "--help")
    assert "Traceback" not in r.stderr, r.stderr
    try:
        import cuda_debug.bench._cli  # noqa: F401
    except ModuleNotFoundError:
        assert r.returncode == 1
        assert "the bench command is not available in this build" in r.stderr
    else:
        assert r.returncode == 0, r.stderr


def test_console_script():
    exe = shutil.which("cuda-debug")
    if exe is None:
        pytest.skip("cuda-debug console script not installed (pip install -e .)")
    r = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("cuda_debug ")


def test_help_lists_every_top_level_option():
    out = cli("--help").stdout
    for option in ("--help", "--version"):
        assert re.search(r"^  (-h, )?%s\s" % option, out, re.M), out


ENTRY_POINT = """\
import re, sys
from cuda_debug.__main__ import main
if __name__ == "__main__":
    sys.argv[0] = re.sub(r"(-script\\.pyw|\\.exe)?$", "", sys.argv[0])
    sys.exit(main())
"""


@pytest.mark.parametrize("args,usage", [
    (("--help",), "usage: cuda-debug <command>"),
    (("run", "--help"), "usage: cuda-debug run "),
    (("doctor", "--help"), "usage: cuda-debug doctor "),
    (("bench", "--help"), "usage: cuda-debug bench "),
    (("bench", "gemm", "--help"), "usage: cuda-debug bench gemm "),
    (("bench", "latency", "--help"), "usage: cuda-debug bench latency "),
])
def test_help_names_the_console_script(tmp_path, args, usage):
    """Under the `cuda-debug` console script (the file pip writes for the entry
    point), help and usage say `cuda-debug`, not `python -m cuda_debug`."""
    exe = tmp_path / "bin" / "cuda-debug"
    exe.parent.mkdir()
    exe.write_text(ENTRY_POINT)
    r = cli(*args, command=[sys.executable, str(exe)])
    assert r.returncode == 0, r.stderr
    assert usage in r.stdout, r.stdout
    assert "python -m cuda_debug" not in r.stdout, r.stdout


def test_usage_errors_name_the_console_script(tmp_path):
    exe = tmp_path / "cuda-debug"
    exe.write_text(ENTRY_POINT)
    r = cli("run", "--bogus", "x.py", command=[sys.executable, str(exe)])
    assert r.returncode == 2 and r.stderr.startswith("usage: cuda-debug run "), r.stderr
    # the error names the command as typed too, in argparse's form (as doctor's and bench's)
    assert "\ncuda-debug run: error: unknown option --bogus" in r.stderr, r.stderr
    for args, head in ((("frobnicate",), "cuda-debug: error: unknown command 'frobnicate'"),
                       (("--version", "x"), "cuda-debug: error: --version takes no arguments"),
                       (("doctor", "--bogus"), "cuda-debug doctor: error: unrecognized arguments"),
                       (("bench", "frob"), "cuda-debug bench: error: argument {gemm,latency}")):
        r = cli(*args, command=[sys.executable, str(exe)])
        assert r.returncode == 2, r.stderr
        assert [l for l in r.stderr.splitlines() if l.startswith(head)], (head, r.stderr)
        assert "cuda_debug" not in r.stderr.replace("cuda_debug.", ""), r.stderr
    r = cli("run", "--bogus", "x.py")
    assert "\npython -m cuda_debug run: error: unknown option --bogus" in r.stderr, r.stderr


def test_bench_usage_error_says_the_command_once():
    r = cli("bench", "frob")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    usage, error = r.stderr.rstrip("\n").splitlines()
    assert usage.startswith("usage: python -m cuda_debug bench "), r.stderr
    assert error.startswith("python -m cuda_debug bench: error: argument {gemm,latency}: "
                            "invalid choice: 'frob'"), r.stderr
    assert "bench" not in error[len("python -m cuda_debug bench: "):], r.stderr


def _all_parsers():
    """Every argparse parser of the command line: run, doctor, bench and its subcommands."""
    import argparse
    from cuda_debug._cli import doctor, run
    from cuda_debug.bench import _cli as bench_cli
    todo = [run._run_parser(), doctor._doctor_parser(), bench_cli.parser()]
    seen = []
    while todo:
        p = todo.pop()
        seen.append(p)
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
    return seen


def test_no_parser_accepts_abbreviations():
    parsers = _all_parsers()
    assert sorted(p.prog for p in parsers) == [
        "python -m cuda_debug bench", "python -m cuda_debug bench gemm",
        "python -m cuda_debug bench latency", "python -m cuda_debug doctor",
        "python -m cuda_debug run"]
    assert [p.prog for p in parsers if p.allow_abbrev] == []


@pytest.mark.parametrize("args,unknown", [
    (("bench", "gemm", "--size", "64"), "--size 64"),
    (("bench", "gemm", "--dtype", "fp32"), "--dtype fp32"),
    (("bench", "latency", "--mode", "async"), "--mode async"),
    (("doctor", "--js"), "--js"),
])
def test_abbreviated_options_are_refused(args, unknown):
    r = cli(*args)
    assert (r.returncode, r.stdout) == (2, ""), r.stdout + r.stderr
    assert "unrecognized arguments: %s" % unknown in r.stderr, r.stderr


def test_every_option_has_help():
    missing = ["%s %s" % (p.prog, "/".join(a.option_strings)) for p in _all_parsers()
               for a in p._actions if a.option_strings and not (a.help or "").strip()]
    assert missing == []


# -- run --------------------------------------------------------------------------------

def test_run_runs_the_script_as_main(tmp_path):
    p = script(tmp_path, '''
        import json, sys
        print(json.dumps({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
                          "file": __file__}))
    ''')
    r = cli("run", str(p), "a", "--launch-blocking", "-x", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["name"] == "__main__"
    assert d["argv"] == [str(p), "a", "--launch-blocking", "-x"]   # the script's own options
    assert d["path0"] == str(tmp_path)
    assert os.path.samefile(d["file"], str(p))


def test_run_passes_the_exit_status(tmp_path):
    p = script(tmp_path, "import sys\nsys.exit(7)\n")
    assert cli("run", str(p)).returncode == 7
    p = script(tmp_path, "import sys\nsys.exit('bye')\n", "s2.py")
    r = cli("run", str(p))
    assert r.returncode == 1 and "bye" in r.stderr


def test_run_prints_the_script_traceback_without_the_runner(tmp_path):
    p = script(tmp_path, '''
        def f():
            raise ValueError("boom")
        f()
    ''')
    r = cli("run", str(p))
    assert r.returncode == 1
    assert "ValueError: boom" in r.stderr
    assert 'line 2, in f' in r.stderr
    assert "runpy" not in r.stderr and "_cli" not in r.stderr, r.stderr


def test_run_reports_a_sticky_cuda_debug_error_short(tmp_path):
    p = script(tmp_path, FAKE_ASSERT)
    r = cli("run", str(p))
    assert r.returncode == 3, r.stderr
    lines = [l for l in r.stderr.splitlines()
             if not l.startswith("python -m cuda_debug run: running without")]
    assert lines[0] == "DeviceAssertError: device-side assert in check_index<int>"
    assert "Traceback" not in r.stderr
    assert "Assertion `idx[i] >= 0 && idx[i] < limit` failed." in r.stderr
    assert "restart the process" in r.stderr


def test_run_traceback_option_adds_the_traceback(tmp_path):
    p = script(tmp_path, FAKE_ASSERT)
    r = cli("run", "--traceback", str(p))
    assert r.returncode == 3
    assert "Traceback" in r.stderr
    assert r.stderr.rstrip().splitlines()[-4] == \
        "DeviceAssertError: device-side assert in check_index<int>"


def test_run_module(tmp_path):
    (tmp_path / "mymod.py").write_text(
        "import sys, json\nprint(json.dumps([__name__, sys.argv[1:]]))\n")
    r = cli("run", "-m", "mymod", "--help", "x", cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == ["__main__", ["--help", "x"]]


STDIN_SCRIPT = """\
import json, sys
print(json.dumps({"argv": sys.argv, "name": __name__, "file": __file__, "path0": sys.path[0]}))
"""


def test_run_reads_the_script_from_stdin(tmp_path):
    """`run -` runs the program read from stdin, as `python -` does."""
    r = cli("run", "-", "a", "--help", cwd=str(tmp_path), input=STDIN_SCRIPT)
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d == {"argv": ["-", "a", "--help"], "name": "__main__", "file": "<stdin>",
                 "path0": ""}
    r = cli("run", "--no-watch", "--", "-", cwd=str(tmp_path), input=STDIN_SCRIPT)
    assert r.returncode == 0 and json.loads(r.stdout)["argv"] == ["-"], r.stderr


def test_run_stdin_tracebacks_show_the_lines(tmp_path):
    r = cli("run", "--no-watch", "-", input="x = 1\nraise ValueError('from stdin')\n")
    assert r.returncode == 1
    assert 'File "<stdin>", line 2, in <module>' in r.stderr, r.stderr
    assert "raise ValueError('from stdin')" in r.stderr and "_cli" not in r.stderr
    r = cli("run", "--no-watch", "-", input="def f(:\n")
    assert r.returncode == 1 and "SyntaxError" in r.stderr, r.stderr
    r = cli("run", "--no-watch", "-", input="import sys\nsys.exit(5)\n")
    assert r.returncode == 5


def test_run_words_alone_do_not_kill_the_context(tmp_path):
    """No CUDA here: a program raising a framework's words is an ordinary
    exception (exit 1), as under pytest; only the driver says the context is
    dead (it was once exit 3, "the CUDA context is dead")."""
    r = cli("run", "-", input='raise RuntimeError("CUDA error: an illegal memory '
                              'access was encountered")\n')
    assert r.returncode == 1, r.stderr
    assert "RuntimeError: CUDA error: an illegal memory access" in r.stderr
    assert "context is dead" not in r.stderr and "sticky" not in r.stderr, r.stderr


_WORDS_AFTER = '''
    from cuda_debug import _cli
    rc = _cli.main(["run", %s"-c", "import cuda_debug.testing as t\\n%s"
                    "raise RuntimeError('CUDA error: an illegal memory access was encountered')"])
    report(dict(rc=rc))
'''


def test_run_words_on_a_dead_context_exit_3(fake_child):
    """The fake driver's context really dead (a faulting kernel launched
    outside any scope, not watched), then the framework's words: the driver
    confirms, exit 3, with the advice to watch."""
    c = fake_child(_WORDS_AFTER % ('"--no-watch", ', "t.illegal_address()\\n"))
    assert c.result == {"rc": 3}, c
    assert "CUDA_ERROR_ILLEGAL_ADDRESS (an illegal memory access was encountered) is a sticky " \
           "CUDA error: the CUDA context is dead." in c.stderr, c.stderr
    assert "python -m cuda_debug run -c import cuda_debug.testing as t" in c.stderr, c.stderr
    assert "(watch, the default) or --launch-blocking" in c.stderr, c.stderr


def test_run_words_on_a_live_context_exit_1(fake_child):
    c = fake_child(_WORDS_AFTER % ('"--no-watch", ', ""))
    assert c.result == {"rc": 1}, c
    assert "context is dead" not in c.stderr, c.stderr


@pytest.mark.parametrize("args,message", [
    ((), "a script (or -m module) is required"),
    (("-c",), "-c needs the program's text"),
    (("--bogus", "x.py"), "unknown option --bogus"),
    (("no_such_script.py",), "no such file: no_such_script.py"),
    # Options are spelled in full: no underscores, abbreviations or values.
    (("--launch_blocking", "x.py"), "unknown option --launch_blocking"),
    (("--launch", "x.py"), "unknown option --launch"),
    (("--traceback=1", "x.py"), "unknown option --traceback=1"),
    (("--all-threads", "x.py"), "--all-threads goes with --launch-blocking"),
    (("-m",), "-m needs a module name"),
    (("-m", "pkg/mod.py"), "-m pkg/mod.py: not a module name"),
    (("-m", "1abc"), "-m 1abc: not a module name"),
])
def test_run_usage_errors(tmp_path, args, message):
    (tmp_path / "x.py").write_text("print('ran')\n")
    r = cli("run", *args, cwd=str(tmp_path))
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert message in r.stderr


def test_run_a_folder_with_main(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text("import sys; print('app', sys.argv[1:])\n")
    r = cli("run", "app", "a", cwd=str(tmp_path))
    assert (r.returncode, r.stdout) == (0, "app ['a']\n"), r.stderr


# -- `run X` is `python X` (docs/cli.md) -----------------------------------------------

#: what a program sees of how it was started
_SEES = '''
import json, sys
g = globals()
print(json.dumps({"argv": sys.argv, "path0": sys.path[0], "file": g.get("__file__"),
                  "builtins": type(__builtins__).__name__,
                  "loader": [getattr(__loader__, "__name__", type(__loader__).__name__),
                             getattr(__loader__, "name", None), getattr(__loader__, "path", None)],
                  "spec": repr(__spec__), "package": __package__,
                  "names": sorted(g)}))
'''


def _ours(stderr: str) -> str:
    """stderr less run's one line saying it runs without watch() (no GPU here)."""
    return "".join(l for l in stderr.splitlines(True)
                   if not l.startswith("python -m cuda_debug run: running without"))


def python_and_run(*args, cwd, input=None):
    """(``python args``, ``python -m cuda_debug run args``), each in a subprocess."""
    return (subprocess.run([sys.executable] + list(args), cwd=cwd, env=cli_env(),
                           capture_output=True, text=True, timeout=120, input=input or ""),
            cli("run", *args, cwd=cwd, input=input))


def test_run_leaves_argv0_as_typed(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "s.py").write_text(_SEES)
    py, run = python_and_run(os.path.join("sub", "s.py"), "a", cwd=str(tmp_path))
    assert py.returncode == run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["argv"] == json.loads(py.stdout)["argv"] == \
        [os.path.join("sub", "s.py"), "a"]


def test_run_a_symlinked_script_gets_its_targets_folder(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "s.py").write_text(_SEES)
    (tmp_path / "link.py").symlink_to(os.path.join("real", "s.py"))
    (tmp_path / "real" / "helper.py").write_text("")
    py, run = python_and_run("link.py", cwd=str(tmp_path))
    assert py.returncode == run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == json.loads(py.stdout)
    assert json.loads(run.stdout)["path0"] == str((tmp_path / "real").resolve())


def test_run_main_globals_are_pythons(tmp_path):
    """``__builtins__`` the module (runpy's was a dict), ``__loader__`` a
    SourceFileLoader (runpy's was None), the same names, no spec, no package."""
    (tmp_path / "s.py").write_text(_SEES)
    py, run = python_and_run("s.py", cwd=str(tmp_path))
    assert py.returncode == run.returncode == 0, run.stderr
    ours, theirs = json.loads(run.stdout), json.loads(py.stdout)
    assert ours == theirs
    assert ours["builtins"] == "module" and ours["loader"][0] == "SourceFileLoader"


def test_run_c_code_is_python_c(tmp_path):
    py, run = python_and_run("-c", _SEES, "x", "-y", cwd=str(tmp_path))
    assert py.returncode == run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == json.loads(py.stdout)
    assert json.loads(run.stdout)["argv"] == ["-c", "x", "-y"]
    py, run = python_and_run("-c", "def f():\n    1/0\nf()", cwd=str(tmp_path))
    assert py.returncode == run.returncode == 1, run.stderr
    assert _ours(run.stderr) == py.stderr


def test_run_stdin_is_python_stdin(tmp_path):
    py, run = python_and_run("-", "x", cwd=str(tmp_path), input=_SEES)
    assert py.returncode == run.returncode == 0, run.stderr
    assert json.loads(run.stdout) == json.loads(py.stdout)


def test_run_a_script_from_a_pipe_is_read_once(tmp_path):
    """``run <(...)``: a script that is a pipe is read once, as python reads it."""
    outs = []
    for command in ([sys.executable], [sys.executable, "-m", "cuda_debug", "run"]):
        r, w = os.pipe()
        os.write(w, b"import sys; print('piped', sys.argv[1:])\n")
        os.close(w)
        p = subprocess.run(command + ["/dev/fd/%d" % r, "x"], pass_fds=(r,), cwd=str(tmp_path),
                           env=cli_env(), capture_output=True, text=True, timeout=120)
        os.close(r)
        outs.append((p.returncode, p.stdout))
    assert outs[0] == outs[1] == (0, "piped ['x']\n"), outs


def test_run_ctrl_c_dies_of_sigint_as_python_does(tmp_path):
    """The program's traceback (not the runner's frames), then death by SIGINT
    (exit status 130 in a shell), where it exited 130 showing runpy's frames."""
    import signal
    (tmp_path / "k.py").write_text(textwrap.dedent('''
        import os, signal, time
        def interrupt():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)
        interrupt()
    ''').lstrip())
    py, run = python_and_run("k.py", cwd=str(tmp_path))
    assert py.returncode == run.returncode == -signal.SIGINT, run.stderr
    assert _ours(run.stderr) == py.stderr
    assert "KeyboardInterrupt" in py.stderr and "runpy" not in run.stderr


def test_run_a_folder_without_main_fails_as_python_does(tmp_path):
    (tmp_path / "d").mkdir()
    py, run = python_and_run("d", cwd=str(tmp_path))
    assert py.returncode == run.returncode == 1, run.stderr
    assert "can't find '__main__' module in" in py.stderr
    assert "can't find '__main__' module in" in run.stderr
    assert run.stdout == ""


# -- habits: other tools' usage gets a hint, not a bare error --------------------------

def test_run_and_replay_take_option_equals_value(tmp_path):
    """``--opt=value``, as dump and bench take it (it was refused)."""
    from cuda_debug import _cli
    p = _cli.parse_run(["--hang-after=60", "train.py", "--x=1"])
    assert (p.opts["hang_after"], p.target, p.args) == (60.0, "train.py", ["--x=1"])
    p = _cli.parse_replay(["--kernel-name=gather", "--launch=3", "train.py"])
    assert (p.opts["kernel"], p.opts["launch"], p.target) == ("gather", 3, "train.py")
    (tmp_path / "s.py").write_text("print('ran')\n")
    r = cli("run", "--hang-after=60", "s.py", cwd=str(tmp_path))
    assert (r.returncode, r.stdout) == (0, "ran\n"), r.stderr
    r = cli("run", "--hang-after=0.0001", "s.py", cwd=str(tmp_path))
    assert r.returncode == 2 and "--hang-after 0.0001: " in r.stderr, r.stderr
    r = cli("run", "--traceback=1", "s.py", cwd=str(tmp_path))      # a flag takes no value
    assert r.returncode == 2 and "unknown option --traceback=1" in r.stderr, r.stderr


@pytest.mark.parametrize("args, said", [
    (("train.py", "--epochs", "1"),
     "unknown command 'train.py' (a script: python -m cuda_debug run train.py --epochs 1)"),
    (("-m", "mypkg.train"),
     "unknown command '-m' (a module: python -m cuda_debug run -m mypkg.train)"),
    (("run", "python", "train.py", "-x"),
     "error: python: run runs the program with this Python itself: leave it out "
     "(run train.py -x)"),
    (("run", "python3", "train.py"), "error: python3: run runs the program with this Python"),
    (("help", "nope"), "help takes a command (run, replay, dump, doctor, bench), not nope"),
])
def test_habits_get_a_hint_and_status_2(args, said):
    r = cli(*args)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert said in r.stderr, r.stderr


def test_bench_subcommand_errors_name_it_and_the_option_meant():
    pytest.importorskip("numpy")
    r = cli("bench", "gemm", "--size", "256")
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr.startswith("usage: python -m cuda_debug bench gemm "), r.stderr
    assert "python -m cuda_debug bench gemm: error: unrecognized arguments: --size 256 " \
           "(--size: did you mean --sizes?)" in r.stderr, r.stderr


@pytest.mark.parametrize("command", ["run", "replay", "dump", "doctor"])
def test_help_command_prints_that_commands_help(command):
    r = cli("help", command)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("usage: python -m cuda_debug %s " % command), r.stdout
    assert r.stdout == cli(command, "--help").stdout


@pytest.mark.parametrize("args,message", [
    (("doctor", "--js"), "unrecognized arguments: --js"),      # no abbreviations
    (("doctor", "now"), "unrecognized arguments: now"),
    (("--version", "x"), "--version takes no arguments"),
])
def test_other_usage_errors(args, message):
    r = cli(*args)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert message in r.stderr


def test_usage_errors_are_returned_not_raised(capsys):
    from cuda_debug import _cli
    assert _cli.main(["doctor", "--bogus"]) == 2
    assert _cli.main(["run", "--bogus"]) == 2
    assert "--bogus" in capsys.readouterr().err


def test_run_help():
    r = cli("run", "--help")
    assert r.returncode == 0 and "--launch-blocking" in r.stdout


@pytest.mark.skipif(not NO_GPU, reason="a GPU is usable here")
@pytest.mark.parametrize("option,what", [("--launch-blocking", "launch_blocking()"),
                                          (None, "watch()")])
def test_run_without_a_gpu_says_why_once_and_runs(tmp_path, option, what):
    if gpu_unavailable_reason() is None:
        pytest.skip("a GPU is present here")
    p = script(tmp_path, "print('ran')\n")
    r = cli("run", *([option] if option else []), str(p))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ran"
    assert r.stderr.count("python -m cuda_debug run: running without %s: no CUDA driver"
                          % what) == 1
    assert "Traceback" not in r.stderr


def test_run_options_exclude_each_other(tmp_path):
    p = script(tmp_path, "print('ran')\n")
    r = cli("run", "--launch-blocking", "--no-watch", str(p))
    assert r.returncode == 2 and "exclude each other" in r.stderr
    r = cli("run", "--all-threads", str(p))
    assert r.returncode == 2 and "--all-threads goes with --launch-blocking" in r.stderr
    r = cli("run", "--no-watch", str(p))
    assert r.returncode == 0 and "running without" not in r.stderr


# -- doctor -----------------------------------------------------------------------------

def test_doctor_text():
    r = cli("doctor")
    assert r.returncode == (1 if NO_GPU else 0), r.stdout + r.stderr
    for row in ("cuda_debug", "built with", "driver", "libcuda", "CUPTI", "cuBLAS",
                "CUPTI free", "CUDA_LAUNCH_BLOCKING"):
        assert re.search(r"^%s\s" % row, r.stdout, re.M), r.stdout
    assert re.search(r"^CUDA_LAUNCH_BLOCKING\s+not set$", r.stdout, re.M), r.stdout
    assert "verdict: " in r.stdout
    if NO_GPU:
        assert "verdict: not usable here: no " in r.stdout, r.stdout


def test_doctor_json_and_cuda_launch_blocking(tmp_path):
    r = cli("doctor", "--json", env={"CUDA_LAUNCH_BLOCKING": "1"})
    assert r.returncode == (1 if NO_GPU else 0), r.stderr
    d = json.loads(r.stdout)
    assert d["env"]["CUDA_LAUNCH_BLOCKING"] == "1"
    for key in ("libcuda", "cupti", "cublas", "devices", "cupti_free", "verdict", "ok",
                "problem", "cuda_headers", "driver"):
        assert key in d
    assert "gpus" not in d            # one list of GPUs: devices
    if NO_GPU:
        assert d["devices"] == [] and d["ok"] is False and d["cupti_free"] is None
        assert d["problem"] in ("no_driver", "no_gpu")
    # the JSON says what the text says: the assert text's state is the row's
    from cuda_debug._cli import doctor
    text = cli("doctor").stdout
    (row,) = [l for l in text.splitlines() if l.startswith("assert text")]
    assert row.split(None, 2)[2] == doctor._ASSERT_TEXT[d["assert_text"]["state"]], (row, d)
    assert "on" not in d["assert_text"]
    r = cli("doctor", env={"CUDA_LAUNCH_BLOCKING": "1"})
    assert re.search(r"^CUDA_LAUNCH_BLOCKING\s+'1': every launch", r.stdout, re.M), r.stdout


def test_run_stdin_names_the_launching_line(fake_child):
    """A fault launched by the program on stdin is located at `<stdin>:LINE`, with
    the line's text (fake driver: the real callback, a fake device assert)."""
    c = fake_child('''
        import io, sys
        from cuda_debug import _cli
        sys.stdin = io.StringIO("import cuda_debug.testing as t\\nx = 1\\nt.device_assert()\\n")
        rc = _cli.main(["run", "--launch-blocking", "-"])
        report(dict(rc=rc))
    ''')
    assert c.result == {"rc": 3}, c
    lines = c.stderr.splitlines()
    i = report_start(lines, "DeviceAssertError: ")
    assert lines[i + 1].strip() == "at <stdin>:3 in <module>:  t.device_assert()", c.stderr


def _doctor_in(fake_child, setup=""):
    """`doctor --json` and `doctor` in a child with the fake driver: their statuses,
    ok, problem, verdict and the text."""
    return fake_child(setup + textwrap.dedent('''
        import contextlib, io, json
        from cuda_debug import _cli
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = _cli.main(["doctor", "--json"])
        d = json.loads(out.getvalue())
        with contextlib.redirect_stdout(io.StringIO()) as text:
            text_rc = _cli.main(["doctor"])
        report(dict(rc=rc, text_rc=text_rc, ok=d["ok"], problem=d["problem"],
                    verdict=d["verdict"], text=text.getvalue()))
    '''))


def test_doctor_without_a_driver_is_not_usable():
    """No libcuda: a script reading `ok` or the exit status must see "not usable"."""
    env = {"LD_LIBRARY_PATH": "/nonexistent"}
    if conftest.run_child("from cuda_debug import _libraries\n"
                          "_libraries.ensure(_libraries.CUDA)\n", env=env).returncode == 0:
        pytest.skip("a driver is installed here: the no-driver case is not reachable")
    r = cli("doctor", "--json", env=env)
    d = json.loads(r.stdout)
    assert (r.returncode, d["ok"], d["problem"]) == (1, False, "no_driver"), r.stdout
    assert d["verdict"].startswith("not usable here: no NVIDIA driver (libcuda.so.1 not found)")
    r = cli("doctor", env=env)
    assert r.returncode == 1
    verdict = r.stdout.rstrip().splitlines()[-1]
    assert verdict == "verdict: " + d["verdict"]
    found = [name for name, key in (("CUPTI", "cupti"), ("cuBLAS", "cublas")) if d[key]["found"]]
    if found:      # e.g. PyTorch's NVIDIA wheels without a GPU: say what is there
        assert "(%s " % " and ".join(found) in verdict, verdict


def test_doctor_with_a_working_driver_is_usable(fake_child):
    c = _doctor_in(fake_child)
    assert c.returncode == 0, c
    r = c.result
    assert (r["rc"], r["text_rc"], r["ok"], r["problem"]) == (0, 0, True, None), r
    assert r["text"].rstrip().endswith("verdict: watch() and launch_blocking() work here."), r


def test_doctor_with_a_driver_but_no_gpu_is_not_usable(fake_child):
    c = _doctor_in(fake_child, "fake.fake_set_init_result(100)\n")   # CUDA_ERROR_NO_DEVICE
    assert c.returncode == 0, c
    r = c.result
    assert (r["rc"], r["text_rc"], r["ok"], r["problem"]) == (1, 1, False, "no_gpu"), r
    assert r["verdict"].startswith("not usable here: no usable GPU (cuInit: "
                                   "CUDA_ERROR_NO_DEVICE)"), r


# -- GPU --------------------------------------------------------------------------------

@pytest.mark.gpu
def test_gpu_run_launch_blocking_names_kernel_and_line(tmp_path):
    p = script(tmp_path, '''
        import cuda_debug.testing as t
        print("before", flush=True)
        t.device_assert()
        print("not reached")
    ''')
    r = cli("run", "--launch-blocking", str(p))
    assert r.returncode == 3, r.stdout + r.stderr
    assert "before" in r.stdout and "not reached" not in r.stdout
    lines = r.stderr.splitlines()
    i = report_start(lines, "DeviceAssertError: ")
    assert lines[i] == "DeviceAssertError: device-side assert in check_index<int>", r.stderr
    assert lines[i + 1].strip() == "at %s:%d in <module>:  t.device_assert()" % (
        p, line_of(p, "t.device_assert()")), r.stderr
    assert "Assertion" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.gpu
@pytest.mark.parametrize("option", ["--launch-blocking", None])
def test_gpu_run_stdin_names_kernel_and_line(option):
    """`run -`: the program read from stdin, its launch named at <stdin>:LINE, in
    both modes (watch: launched at; launch_blocking: at)."""
    source = "import cuda_debug, cuda_debug.testing as t\nt.device_assert()\ncuda_debug.check()\n"
    r = cli("run", *([option] if option else []), "-", input=source, timeout=60)
    assert r.returncode == 3, r.stdout + r.stderr
    lines = r.stderr.splitlines()
    i = report_start(lines, "DeviceAssertError: ")
    assert lines[i] == "DeviceAssertError: device-side assert in check_index<int>", r.stderr
    where = "at" if option else "launched at"
    assert lines[i + 1].strip() == "%s <stdin>:2 in <module>:  t.device_assert()" % where, \
        r.stderr


@pytest.mark.gpu
def test_gpu_run_without_blocking_reports_the_sticky_error(tmp_path):
    p = script(tmp_path, '''
        import cuda_debug, cuda_debug.testing as t
        t.device_assert()
        cuda_debug.check()
    ''')
    r = cli("run", str(p))
    assert r.returncode == 3, r.stdout + r.stderr
    # (the device's own assert line and the fault-time block come first)
    i = report_start(r.stderr.splitlines(), "DeviceAssertError: device-side assert")
    report = "\n".join(r.stderr.splitlines()[i:])
    # run watches by default: the launch is named, not only where it surfaced
    assert "launched at %s:2" % p in report, report
    assert "surfaced at %s:3" % p in report, report
    assert "check_index" in report.splitlines()[0]


@pytest.mark.gpu
def test_gpu_run_launch_blocking_torch(tmp_path):
    pytest.importorskip("torch")
    p = script(tmp_path, '''
        import torch
        x = torch.zeros(4, device="cuda")
        i = torch.tensor([10], device="cuda")
        y = x[i]
        print(y.sum().item())
    ''')
    r = cli("run", "--launch-blocking", str(p))
    assert r.returncode == 3, r.stdout + r.stderr
    report_start(r.stderr.splitlines(), "DeviceAssertError: device-side assert in ")
    assert "at %s:%d in <module>:  y = x[i]" % (p, line_of(p, "y = x[i]")) in r.stderr
    assert "Assertion" in r.stderr


@pytest.mark.gpu
def test_gpu_doctor():
    r = cli("doctor")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "GPU 0" in r.stdout
    assert re.search(r"^CUPTI free\s+yes", r.stdout, re.M), r.stdout
    assert "verdict: watch() and launch_blocking() work here." in r.stdout
    # libcuda.so.1 refers to libc's stderr (U stderr@GLIBC_2.2.5 on the H200)
    assert re.search(r"^assert text\s+captured from libcuda's writes", r.stdout, re.M), r.stdout
    d = json.loads(cli("doctor", "--json").stdout)
    assert d["devices"] and d["devices"][0]["name"]
    assert d["libcuda"]["found"] and d["cupti"]["found"]
    assert d["cupti_free"] == {"free": True}
    assert d["driver_cuda"]
