"""Shared test helpers.

GPU tests carry ``@pytest.mark.gpu`` and are skipped, with the reason, where no
GPU and driver are usable. A sticky CUDA error kills the CUDA context of its
process, so tests that cause one run the faulting code in a child process
(``run_child``) and assert on what it printed or raised.
"""
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The tests run against whichever cuda_debug is imported: this checkout (an
# editable install, or PYTHONPATH), or an installed copy when tests/ runs from
# elsewhere. Subprocesses get PKG_PARENT, the folder that copy was imported from,
# on PYTHONPATH (never ROOT: a checkout shadows an installed copy).
import cuda_debug  # noqa: E402  (cheap: the package imports lazily)

PKG_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(cuda_debug.__file__)))
# The source tree (csrc/: generators, headers), or None when tests/ runs without it.
SOURCE_TREE = ROOT if os.path.isfile(os.path.join(ROOT, "csrc", "base", "base.h")) else None


def need_source_tree(what):
    """Skip, saying why, where the tests run without the source tree."""
    if SOURCE_TREE is None:
        pytest.skip("%s needs the source tree (csrc/ next to tests/)." % what)
    return SOURCE_TREE


def short_reason(text):
    """A skip reason as one short sentence: the first clause of `text`, without
    its parenthesised detail (`pytest -ra` prints it once per skipped group)."""
    first = re.split(r"(?<=[a-z0-9)])\. ", text.strip(), maxsplit=1)[0].rstrip(".")
    first = re.sub(r" \([^()]*(\([^()]*\)[^()]*)*\)", "", first)
    return (first if len(first) <= 100 else first[:97] + "...") + "."


@pytest.fixture(scope="session")
def build_python():
    """An interpreter that can run this checkout's setup.py: this one, or a venv
    holding pyproject.toml's build requirements (tests/build_env.py); the test
    is skipped, saying why, where they cannot be had (no package index)."""
    root = need_source_tree("running setup.py")
    import build_env
    try:
        return build_env.python(root)
    except build_env.Unavailable as e:
        pytest.skip(str(e))


def gpu_unavailable_reason():
    """None if a GPU is usable here, else why not (said in the skip reason)."""
    try:
        from cuda_debug import _libraries, _core
        from cuda_debug import CudaUnavailableError
    except Exception as e:  # the build itself is broken: that is a failure elsewhere
        return "cuda_debug does not import: %r" % e
    try:
        _libraries.ensure(_libraries.CUDA)
    except CudaUnavailableError as e:
        return short_reason(str(e))
    rc, n = _core.device_count()
    if rc or n == 0:
        return "no CUDA device (cuDeviceGetCount: %d, %d devices)." % (rc, n)
    return None


_REASON = []


def pytest_collection_modifyitems(config, items):
    if not any(item.get_closest_marker("gpu") for item in items):
        return
    if not _REASON:
        _REASON.append(gpu_unavailable_reason())
    if _REASON[0] is None:
        return
    skip = pytest.mark.skip(reason="no usable GPU: %s" % _REASON[0])
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(skip)


def line_of(text, marker):
    """1-based number of the first line of `text` that holds `marker`."""
    for i, line in enumerate(text.splitlines(), 1):
        if marker in line:
            return i
    raise AssertionError("marker %r not found" % marker)


class Child:
    def __init__(self, proc, script, source):
        self.script = script
        self.source = source
        self.returncode = proc.returncode
        self.stdout_bytes, self.stderr_bytes = proc.stdout, proc.stderr   # raw, as written
        # errors="replace": a driver may print undecodable bytes (hostile assert text)
        self.stdout, self.stderr = _text(proc.stdout), _text(proc.stderr)
        self.result = None
        for line in self.stdout.splitlines():
            if line.startswith("RESULT "):
                self.result = json.loads(line[len("RESULT "):])

    def line_of(self, marker):
        """1-based line number in the script of the line holding `marker`."""
        return line_of(self.source, marker)

    def __repr__(self):
        return "<child rc=%s>\n--- stdout\n%s\n--- stderr\n%s" % (
            self.returncode, self.stdout[-4000:], self.stderr[-4000:])


def _text(b):
    """Bytes a child wrote, as text mode would read them (universal newlines)."""
    return b.decode("utf-8", "replace").replace("\r\n", "\n").replace("\r", "\n")


#: What a sanitizer prints when it finds something (.ci/sanitize.sh runs the suite
#: against an extension built with them): a child whose stderr has one fails its
#: test, whatever its exit status (a report from a daemon thread can race the
#: process's exit).
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                     "WARNING: ThreadSanitizer")


def sanitizer_report(stderr):
    """The sanitizer report in a child's stderr, or None."""
    for marker in SANITIZER_REPORTS:
        i = (stderr or "").find(marker)
        if i >= 0:
            return stderr[max(0, i - 200):i + 6000]
    return None


def child_environ(env=None):
    """os.environ for a child, PKG_PARENT first on its PYTHONPATH (a script's
    own folder, not the cwd, is its sys.path[0]: without it the child would
    import whichever cuda_debug the interpreter finds, such as another
    checkout's editable install), then `env` on top."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")]))
    full_env.update(env or {})
    return full_env


_PRELUDE = "import json, sys\ndef report(obj): print('RESULT ' + json.dumps(obj), flush=True)\n"


def run_child(code, env=None, timeout=120, args=(), prelude=""):
    """Run `code` as a script file (user code, as far as cuda_debug can tell) in
    a fresh Python; it may call ``report(obj)`` to hand a JSON result back
    (``Child.result``). ``Child.line_of(marker)`` finds a line of the script.
    `prelude` is more code put before `code` (fake_cuda.PRELUDE preloads the
    fake driver)."""
    import tempfile
    source = _PRELUDE + prelude + textwrap.dedent(code)
    folder = tempfile.mkdtemp(prefix="cuda_debug_child_")
    script = os.path.join(folder, "user_script.py")
    with open(script, "w") as f:
        f.write(source)
    full_env = child_environ(env)
    try:
        proc = subprocess.run([sys.executable, script] + list(args), capture_output=True,
                              timeout=timeout, env=full_env, cwd=ROOT)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    found = sanitizer_report(_text(proc.stderr))
    if found:
        pytest.fail("a sanitizer reported in the child (rc=%s):\n%s" % (proc.returncode, found))
    return Child(proc, script, source)


@pytest.fixture
def child():
    return run_child


def run_no_hang(runner, code, timeout=60, **kw):
    """runner(code, timeout=..., **kw) (the child or fake_child fixture), a
    hang reported as a failure with the tail of what the child printed."""
    try:
        return runner(code, timeout=timeout, **kw)
    except subprocess.TimeoutExpired as e:
        tail = (e.stderr or b"")[-3000:]
        pytest.fail("the child hung (no exit within %ss); stderr tail:\n%s"
                    % (timeout, tail.decode("utf-8", "replace") if isinstance(tail, bytes) else tail))


# The fake CUDA driver + CUPTI for CPU-only runs (tests/fake_cuda): the
# session-scoped build and the fake_child runner.
from fake_cuda.fixtures import fake_child, fake_cuda_dir, fake_live  # noqa: E402,F401


def needs(*modules):
    """Skip unless `modules` are installed; without importing them here (a
    framework imported, or half-imported, in the pytest process breaks later
    imports of it; the tests use them in child processes)."""
    import importlib.util
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        pytest.skip("needs %s" % ", ".join(missing))


class Live:
    """A child process that runs while the test talks to it (signals, ``dump
    PID``): its output is read as it comes, each line with the time it came.
    ``wait_for(text)`` waits for a line holding `text`; ``finish()`` waits for the
    exit (killing the process group at the deadline). Use it as a context
    manager: the process group is killed on the way out, whatever happened.
    With ``read_stderr=False`` nobody reads fd 2 until ``start_reading()``
    (a test that needs the child's stderr pipe to fill up). `launcher`: what
    runs the script, after the interpreter (``["-m", "torch.distributed.run",
    ...]``)."""

    def __init__(self, code, env=None, prelude="", args=(), read_stderr=True, launcher=()):
        import tempfile
        import threading
        import time
        self._time = time
        self.source = _PRELUDE + prelude + textwrap.dedent(code)
        self.folder = tempfile.mkdtemp(prefix="cuda_debug_live_")
        self.script = os.path.join(self.folder, "user_script.py")
        with open(self.script, "w") as f:
            f.write(self.source)
        full_env = child_environ(env)
        self.proc = subprocess.Popen([sys.executable] + list(launcher) + [self.script] +
                                     list(args), cwd=ROOT,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=full_env, start_new_session=True)
        self.pid = self.proc.pid
        self.lines = {"stdout": [], "stderr": []}
        self._cond = threading.Condition()
        self._threads = []
        self._threading = threading
        self._start("stdout")
        if read_stderr:
            self._start("stderr")

    def _start(self, name):
        def pump(f=getattr(self.proc, name), out=self.lines[name]):
            for raw in iter(f.readline, b""):
                with self._cond:
                    out.append((self._time.monotonic(), raw.decode("utf-8", "replace")))
                    self._cond.notify_all()
        t = self._threading.Thread(target=pump, daemon=True)
        t.start()
        self._threads.append(t)

    def start_reading(self):
        """Begin reading stderr (after read_stderr=False)."""
        self._start("stderr")

    def line_of(self, marker):
        return line_of(self.source, marker)

    def text(self, name="stderr"):
        with self._cond:
            return "".join(line for _, line in self.lines[name])

    def wait_for(self, text, name="stderr", timeout=30.0, count=1):
        """(time, line) of the `count`-th line of `name` holding `text`; an
        AssertionError with the output so far at the deadline."""
        deadline = self._time.monotonic() + timeout
        with self._cond:
            while True:
                hits = [(t, l) for t, l in self.lines[name] if text in l]
                if len(hits) >= count:
                    return hits[count - 1]
                left = deadline - self._time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(min(left, 0.2))
        raise AssertionError("no line with %r in the child's %s within %.0f s:\n%r" %
                             (text, name, timeout, self))

    def finish(self, timeout=30.0):
        """The exit status (negative: the signal); the group is killed at the deadline."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.proc.wait(10)
        for t in self._threads:
            t.join(5)
        return self.proc.returncode

    def kill(self):
        import signal
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.proc.poll() is None:
            self.kill()
        self.proc.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)
        return False

    def __repr__(self):
        return "<live child pid %d rc=%s>\n--- stdout\n%s\n--- stderr\n%s" % (
            self.pid, self.proc.returncode, self.text("stdout")[-4000:],
            self.text("stderr")[-4000:])
