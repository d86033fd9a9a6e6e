"""pytest plugin: translated CUDA errors, scoped launch blocking, fail fast on a dead context.

Registered through the ``pytest11`` entry point (``-p no:cuda_debug`` turns it off)::

    pytest --cuda-watch                      # the whole session inside cuda_debug.watch()
    pytest --cuda-launch-blocking            # every test inside cuda_debug.launch_blocking()
    [pytest] cuda_watch = true               # the same, from the ini file (cuda_launch_blocking)
    @pytest.mark.cuda_watch                  # one test inside watch() (or the cuda_watch fixture)

    pytest --cuda-guard                      # every test inside cuda_debug.guard(): a bad
    [pytest] cuda_guard = true               # index or label fails that test only, with a
    @pytest.mark.cuda_guard(True|False)      # GuardError; the CUDA context lives on
                                             # (also CUDA_DEBUG_GUARD=1)

    @pytest.mark.cuda_launch_blocking        # one test (setup, call and teardown)
    @pytest.mark.cuda_launch_blocking(False) # opt one test out of --cuda-launch-blocking
    def test_loss(cuda_launch_blocking): ... # or request the fixture

Fail fast: a sticky CUDA error (device assert, illegal address, trap...) kills
the CUDA context of the process, and every later GPU test would fail with it.
The first test that fails with one keeps its failure, gains a "cuda_debug"
section with the translated report (kernel, line, assert text), and the session
stops there (like ``-x``, exit status 1); the summary names the test and counts
the tests not run. Under pytest-xdist the poisoned worker reports and exits
after that test, xdist starts a fresh worker for the rest (``--max-worker-restart``
bounds how often), and the controller's summary names the test. The exiting
worker does not tear down its session fixtures nor write its coverage data
(its CUDA context is dead anyway); the poisoned test is counted once, but
``--junitxml`` gets an empty second <testcase> for it (xdist's crash report).

A sticky error is recognised by a cuda_debug ``StickyCudaError`` (made from a
driver's return code); by a fault cuda_debug recorded during the test; or, after
a failure that names one or speaks of CUDA (``torch.AcceleratorError: CUDA
error: device-side assert triggered``, CuPy ``CUDA_ERROR_ASSERT``...), when the
driver confirms it: in a process that already loaded libcuda, synchronising the
current context returns a sticky code. A framework's words alone never stop the
session. The report is printed once: in the test's failure (its "cuda_debug"
section or the error itself), or in the summary when the test did not fail.

Unused (no option, ini setting, CUDA_DEBUG_GUARD=1, marker or fixture of ours) it
does nothing: no C extension loaded, no CUDA call, no import of torch, no import
hook in sys.meta_path (cuda_debug/__init__.py waits for the first use under
pytest); per test one marker lookup and a look in sys.modules for the C core. The report header
reads /proc and constants only, unless every test runs in a scope (the process
will initialise CUDA anyway) or with ``-v`` (libcuda is opened for its version,
without cuInit: CUDA initialised in the pytest process would break tests that
fork).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
from __future__ import annotations     # (pytest's types, for type checkers only)

import os
import sys
from typing import TYPE_CHECKING, Any, Dict, Generator, List, Optional, Tuple

import pytest

if TYPE_CHECKING:
    from pluggy import Result as _Outcome

    from ._errors import CudaError
    from ._guard import guard as _GuardRegion

#: a hookwrapper of the old style (every pluggy): what it yields, gets back, returns
_Wrapper = Generator[None, "_Outcome[Any]", None]


OPTION = "--cuda-launch-blocking"
INI = "cuda_launch_blocking"
MARKER = "cuda_launch_blocking"
FIXTURE = "cuda_launch_blocking"
WATCH_OPTION = "--cuda-watch"
WATCH_INI = "cuda_watch"
WATCH_MARKER = "cuda_watch"
WATCH_FIXTURE = "cuda_watch"
GUARD_OPTION = "--cuda-guard"
GUARD_INI = "cuda_guard"
GUARD_MARKER = "cuda_guard"
SECTION = "cuda_debug"
PROPERTY = "cuda_debug.sticky"       # user_properties keys: they cross xdist to the controller
PROPERTY_DEAD = "cuda_debug.dead_context"
PROPERTY_NOTE = "cuda_debug.note"    # a scope could not be had: said once at the end
PROPERTY_BLAME = "cuda_debug.blame"  # how the poisoner is known: "surfaced", or the launcher's id
WORKER_EXIT_STATUS = 3               # os._exit status of a poisoned xdist worker


class _Culprit:
    """A test after which this process's CUDA context was dead."""

    def __init__(self, nodeid: str, report: str, outcome: str, worker: Optional[str] = None,
                 consequence: bool = False, blame: Optional[str] = None):
        self.nodeid = nodeid
        self.report = report          # the short report, several lines
        self.outcome = outcome        # "failed", "passed", "xfailed", "skipped"
        self.worker = worker          # xdist worker id, None in a single process
        self.consequence = consequence  # it only met a context an earlier test killed
        # None: cuda_debug saw this test's launch fault; SURFACED: the fault only
        # surfaced here (no watch: an earlier test may have launched it); else the
        # node id of the earlier test whose launch watch() named
        self.blame = blame

    def blamed(self) -> Optional[str]:
        """Why this test is named, for the summary's line."""
        if self.blame == SURFACED:
            return "the CUDA context died in it (the fault surfaced here; an earlier test may " \
                   "have launched the kernel: %s names it)" % WATCH_OPTION
        if self.blame:
            return "the CUDA context died in it, poisoned by %s (watch() recorded that test's " \
                   "launch of the faulting kernel)" % self.blame
        return None


SURFACED = "surfaced"                    # _Culprit.blame: the test where the fault surfaced
_SEQ = pytest.StashKey[int]()            # fault_seq() when the test started
_WANT = pytest.StashKey[bool]()          # the fixture was requested (maybe dynamically)
_WANT_WATCH = pytest.StashKey[bool]()    # the cuda_watch fixture was requested
_BAD_MARK = pytest.StashKey[bool]()      # a marker's arguments were refused (at setup)
_SEEN = pytest.StashKey[bool]()          # this test's poisoning is already handled
_PLUGIN = pytest.StashKey["CudaDebugPlugin"]()


# -- configuration ----------------------------------------------------------------

def pytest_addoption(parser: pytest.Parser) -> None:
    """The option group, its ini settings."""
    group = parser.getgroup("cuda_debug", "cuda_debug: translated CUDA errors, fail fast "
                                          "on a dead CUDA context")
    group.addoption(
        OPTION, action="store_true", default=False, dest="cuda_launch_blocking",
        help="run every test (setup, call, teardown) inside cuda_debug.launch_blocking(): "
             "kernel launches are synchronous and a faulting kernel raises at its launching "
             "line, named, with the device's assert text. Opt one test out with "
             "@pytest.mark.cuda_launch_blocking(False).")
    parser.addini(INI, type="bool", default=False,
                  help="like --cuda-launch-blocking: every test inside "
                       "cuda_debug.launch_blocking()")
    group.addoption(
        WATCH_OPTION, action="store_true", default=False, dest="cuda_watch",
        help="run the session inside cuda_debug.watch(): kernels stay asynchronous, and a "
             "test that faults is reported with the faulting kernel and its launching line.")
    parser.addini(WATCH_INI, type="bool", default=False,
                  help="like --cuda-watch: the session inside cuda_debug.watch()")
    group.addoption(
        GUARD_OPTION, action="store_true", default=False, dest="cuda_guard",
        help="run every test (setup, call, teardown) inside cuda_debug.guard(): an index, "
             "class label or probability that would make a CUDA kernel assert fails that test "
             "with a GuardError before anything is launched, and the next tests run. Also "
             "CUDA_DEBUG_GUARD=1; opt one test out with @pytest.mark.cuda_guard(False).")
    parser.addini(GUARD_INI, type="bool", default=False,
                  help="like --cuda-guard: every test inside cuda_debug.guard()")


def pytest_configure(config: pytest.Config) -> None:
    """The markers, and the session's part of the plugin (state in config.stash)."""
    config.addinivalue_line(
        "markers",
        "cuda_launch_blocking(enabled=True, *, all_threads=False): run this test inside "
        "cuda_debug.launch_blocking(); False opts it out of --cuda-launch-blocking")
    config.addinivalue_line(
        "markers", "cuda_watch(enabled=True, *, hang_after=None, exact=None): run this test "
                   "inside cuda_debug.watch(hang_after=, exact=); False: no watch of its own")
    config.addinivalue_line(
        "markers", "cuda_guard(enabled=True): run this test inside cuda_debug.guard(); False "
                   "opts it out of --cuda-guard")
    plugin = CudaDebugPlugin(config)
    config.stash[_PLUGIN] = plugin
    config.pluginmanager.register(plugin, "cuda_debug-session")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session's part taken away."""
    plugin = config.stash.get(_PLUGIN, None)
    if plugin is not None:
        config.pluginmanager.unregister(plugin)


@pytest.fixture(name=FIXTURE)
def _cuda_launch_blocking_fixture(request: pytest.FixtureRequest) -> Generator[None, None, None]:
    """Run this test inside ``cuda_debug.launch_blocking()``: its kernels launch
    synchronously and a faulting kernel raises at the launching line, translated
    (DeviceAssertError, IllegalAddressError...). Requesting it is enough."""
    request.node.stash[_WANT] = True
    yield None


@pytest.fixture(name=WATCH_FIXTURE)
def _cuda_watch_fixture(request: pytest.FixtureRequest) -> Generator[None, None, None]:
    """Run this test inside ``cuda_debug.watch()``: a kernel fault that surfaces
    later is reported with the faulting kernel and its launching line."""
    request.node.stash[_WANT_WATCH] = True
    yield None


# -- helpers ------------------------------------------------------------------------

def _indent(text: str, pad: str = "  ") -> str:
    return "\n".join(pad + line for line in text.splitlines())


def _force_exception(outcome: Any, exc: BaseException) -> None:
    """Replace a hookwrapper's outcome by `exc` (pluggy >= 1.1, and before)."""
    force = getattr(outcome, "force_exception", None)
    if force is not None:
        force(exc)
    else:
        outcome._excinfo = (type(exc), exc, exc.__traceback__)


def _at_test_frames(translated: BaseException, exc: BaseException) -> Any:
    """The traceback of `translated` (a scope's translation of `exc`) from the
    frame where `exc`'s begins (the test's own), without this hook and the
    scope's __exit__; `exc`'s own when it does not pass there."""
    start = exc.__traceback__.tb_frame if exc.__traceback__ is not None else None
    tb = translated.__traceback__
    while tb is not None and tb.tb_frame is not start:
        tb = tb.tb_next
    return tb or exc.__traceback__


def _outcome(report: pytest.TestReport) -> str:
    return "xfailed" if hasattr(report, "wasxfail") and report.skipped else report.outcome


def _plural(n: int, word: str = "test") -> str:
    return "%d %s%s" % (n, word, "" if n == 1 else "s")


def _marker_call(item: pytest.Item, mark: Any, keywords: Tuple[str, ...]
                 ) -> Tuple[bool, Dict[str, Any]]:
    """(enabled, the other keywords) of ``@pytest.mark.NAME(enabled=True, **keywords)``:
    the test fails at its setup for anything else (a keyword the marker does not
    take, a second argument, an `enabled` that is not True or False), rather than
    being silently ignored; its later phases then run without a scope."""
    if item.stash.get(_BAD_MARK, False):
        return False, {}
    item.stash[_BAD_MARK] = True
    name = "@pytest.mark.%s" % mark.name
    unknown = sorted(k for k in mark.kwargs if k != "enabled" and k not in keywords)
    if unknown:
        pytest.fail("%s: unknown keyword%s %s (it takes enabled%s)" % (
            name, "s" if len(unknown) > 1 else "", ", ".join(unknown),
            "".join(", " + k for k in keywords)), pytrace=False)
    if len(mark.args) > 1 or (mark.args and "enabled" in mark.kwargs):
        pytest.fail("%s takes one argument, enabled (True or False); the others are "
                    "keywords" % name, pytrace=False)
    enabled = mark.args[0] if mark.args else mark.kwargs.get("enabled", True)
    if not isinstance(enabled, bool):
        pytest.fail("%s(%r): enabled is True or False" % (name, enabled), pytrace=False)
    item.stash[_BAD_MARK] = False
    return enabled, {k: v for k, v in mark.kwargs.items() if k != "enabled"}


def _fault_seq() -> int:
    """The C core's count of recorded faults; 0 while the core is not loaded
    (nothing of cuda_debug's ran, so nothing was recorded): unused, the plugin
    loads neither the C extension nor anything else of cuda_debug's."""
    core = sys.modules.get("cuda_debug._core")
    return core.fault_seq() if core is not None else 0


def _arm() -> None:
    """Asked (an option, a marker, a fixture): cuda_debug as `import cuda_debug`
    makes it outside pytest (the torch graph-capture hook: cuda_debug/__init__.py)."""
    import cuda_debug
    cuda_debug._arm()


def _new_report(item: pytest.Item, exc: Optional[BaseException]) -> Optional[CudaError]:
    """The cuda_debug report for what happened during this test: a sticky fault
    cuda_debug recorded (in a scope), or named by the watch ring; else None."""
    seq0 = item.stash.get(_SEQ, None)
    if seq0 is None or "cuda_debug._core" not in sys.modules:
        return None                     # (no core: nothing of cuda_debug's recorded a fault)
    from . import _report
    from ._scope import watch_epoch
    if exc is None and _fault_seq() <= seq0:
        return None
    err = _report.error_for(exc, mark=seq0, watch_mark=watch_epoch(), found_at="test",
                            include_claimed=True)
    return err if err is not None and err.sticky else None


def _probe_context(exc: BaseException) -> Optional[int]:
    """After a failure that speaks of CUDA: the driver's word
    (_environment.context_dead; `run` asks the same)."""
    from . import _environment
    return _environment.context_dead()


def _cudaish(exc: Optional[BaseException]) -> bool:
    from . import _sticky
    return exc is not None and _sticky.is_gpu_exception(exc) and _sticky.speaks_of_cuda(exc)


def _report_text(item: pytest.Item, exc: Optional[BaseException], tb: Any, may_probe: bool
                 ) -> Tuple[Optional[str], bool, Optional[CudaError]]:
    """(short report, located, the cuda_debug error) when the CUDA context died
    in this test, else (None, False, None). `located`: cuda_debug saw the fault
    (kernel and line known), rather than a framework saying so later."""
    from . import _sticky
    errors = sys.modules.get("cuda_debug._errors")     # (not loaded: exc is none of ours)
    CudaError = errors.CudaError if errors is not None else ()
    if isinstance(exc, CudaError) and exc.sticky:
        return "%s: %s" % (type(exc).__name__, exc), True, exc
    err = _new_report(item, exc)
    if err is not None:
        text = "%s: %s" % (type(err).__name__, err)
        if exc is not None and not isinstance(exc, CudaError):
            text += "\n  (raised as %s)" % _sticky.first_line(exc)
        return text, True, err
    if exc is None or not may_probe:
        return None, False, None
    # A framework's words are not enough (a test may raise them, or a child
    # process's): only the driver, asked now, says whether the context is dead.
    named = _sticky.sticky_code(exc)
    if named is None and not _cudaish(exc):
        return None, False, None
    code = _probe_context(exc)
    if code is None:
        return None, False, None
    how = None if code == named else \
        "cuCtxSynchronize after this failure returned " + _sticky.describe(code)
    return "\n".join([
        _sticky.first_line(exc),
        "  %s: a sticky CUDA error." % (how or _sticky.describe(code)),
        "  Kernels run asynchronously: the faulting one may have been launched before the "
        "line that reported it.",
        "  To name the kernel, the launching line and the assert text, run with %s (kernels "
        "stay asynchronous) or the test inside cuda_debug.launch_blocking() (%s, "
        "@pytest.mark.%s or the %s fixture)." % (WATCH_OPTION, OPTION, MARKER, FIXTURE),
    ]), False, None


def _launching_test(session: Optional[pytest.Session], item: pytest.Item,
                    err: Optional[CudaError]) -> Optional[str]:
    """With watch(): the node id of the earlier test whose function is on the
    recorded stack of the faulting launch (the fault launched there surfaced in
    `item`), or None (this test's own launch, or not known)."""
    stack = getattr(err, "launch_stack", None)
    if session is None or getattr(err, "mechanism", None) != "watch" or not stack:
        return None
    frames = {(os.path.realpath(f.filename), f.name) for f in stack}

    def runs(it: pytest.Item) -> bool:
        code = getattr(getattr(it, "obj", None), "__code__", None)
        return code is not None and (os.path.realpath(code.co_filename), code.co_name) in frames

    if runs(item):
        return None
    items = session.items
    earlier = items[:items.index(item)] if item in items else []
    return next((it.nodeid for it in reversed(earlier) if runs(it)), None)


def _marked(item: pytest.Item) -> bool:
    """Does the test use a marker or a fixture of cuda_debug's?"""
    return any(item.get_closest_marker(m) is not None
               for m in (MARKER, WATCH_MARKER, GUARD_MARKER)) or \
        FIXTURE in getattr(item, "fixturenames", ()) or \
        WATCH_FIXTURE in getattr(item, "fixturenames", ())


class CudaDebugPlugin:
    """The per-session part: scopes around tests, fail fast, header and summary."""

    every_test: bool
    watch_session: bool
    worker: Optional[str]
    session: Optional[pytest.Session]
    warned_conflict: bool
    not_run: int
    guard: "_Guard"

    def __init__(self, config: pytest.Config):
        self.config = config
        self.every_test = bool(config.getoption("cuda_launch_blocking")) or bool(config.getini(INI))
        self.watch_session = bool(config.getoption("cuda_watch")) or bool(config.getini(WATCH_INI))
        self.session_watch: Any = None            # the session's watch(), once entered
        self.worker = config.workerinput.get("workerid") if hasattr(config, "workerinput") \
            else None
        self.session = None
        self.unavailable: Optional[str] = None   # why launch_blocking() cannot be had here
        self.warned_conflict = False
        self.notes: List[str] = []                # said once, in the terminal summary
        self.poisoner: Optional[_Culprit] = None  # the first test that poisoned this process
        self.culprits: List[_Culprit] = []        # as reported (on the xdist controller too)
        self.stopped_at: Optional[str] = None
        self.not_run = 0
        self.exit_after: Optional[str] = None     # xdist worker: exit after this test
        self.previous: Optional[str] = None       # the test that ran before this one
        self.guard = _Guard(config)
        if self.asked():
            _arm()

    def asked(self) -> bool:
        """An option, an ini setting or CUDA_DEBUG_GUARD=1 asks for every test."""
        return self.every_test or self.watch_session or self.guard.every_test

    # -- session --------------------------------------------------------------------

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """The session, for its items (fail fast counts the tests not run)."""
        self.session = session

    def pytest_report_header(self, config: pytest.Config) -> Optional[str]:
        """One line when an option, ini setting or CUDA_DEBUG_GUARD=1 asks."""
        # Quiet unless asked (as pytest-timeout): a project that uses no option, ini
        # setting or CUDA_DEBUG_* switch of cuda_debug gets no line here; one whose
        # tests use its markers or fixtures gets it after collection (below).
        if not self.asked():
            return None
        return self._header_line(config)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        """A marker or a fixture of cuda_debug's asks."""
        if any(_marked(item) for item in session.items):
            _arm()                          # asked by a marker or a fixture

    def pytest_report_collectionfinish(self, config: pytest.Config,
                                       items: List[pytest.Item]) -> Optional[str]:
        """The header's line after collection, when only markers or fixtures ask."""
        if self.asked():
            return None                     # said in the header already
        if (config.option.verbose or 0) < 0 or config.getoption("no_header", False):
            return None                     # as the header: not under -q or --no-header
        if not any(_marked(item) for item in items):
            return None
        return self._header_line(config)

    def _header_line(self, config: pytest.Config) -> str:
        unusable = None             # said instead where the header finds no usable GPU
        if self.every_test:
            how = OPTION if config.getoption("cuda_launch_blocking") else "ini %s" % INI
            blocking, depth = "on, every test (%s)" % how, "full"
            unusable = "off (%s asks for it, and it cannot work here: the tests run " \
                       "without it)" % how
        elif self.watch_session:
            how = WATCH_OPTION if config.getoption("cuda_watch") else "ini %s" % WATCH_INI
            blocking, depth = "off; watch() on for the session", "full"
            unusable = "off; watch(): %s asks for it, and it cannot work here (the tests run " \
                       "without it)" % how
        else:
            blocking = "off (marked tests only)"
            depth = "driver" if (config.getoption("verbose") or 0) > 0 else "cheap"
        try:
            from . import _environment
            return _environment.header_line(blocking, depth, unusable)
        except Exception as e:  # a header must never break a run
            return "cuda_debug: environment unknown (%s: %s), launch blocking: %s" % (
                type(e).__name__, e, blocking)

    # -- scopes -----------------------------------------------------------------------

    def _wanted(self, item: pytest.Item) -> Optional[Tuple[str, bool, Dict[str, Any]]]:
        """("block", all_threads, {}) or ("watch", False, watch()'s keywords) when
        this test runs in a scope of its own, else None."""
        m = item.get_closest_marker(MARKER)
        if m is not None:
            enabled, kw = _marker_call(item, m, ("all_threads",))
            return ("block", bool(kw.get("all_threads", False)), {}) if enabled else None
        if self.every_test or item.stash.get(_WANT, False) or \
                FIXTURE in getattr(item, "fixturenames", ()):
            return ("block", False, {})
        m = item.get_closest_marker(WATCH_MARKER)
        if m is not None:
            # cuda_watch(False): no watch of this test's own (as watch(False) is none;
            # the session's, with --cuda-watch, goes on: watch is process-wide)
            enabled, kw = _marker_call(item, m, ("hang_after", "exact"))
            if enabled:
                return ("watch", False, kw)
        if item.stash.get(_WANT_WATCH, False) or \
                WATCH_FIXTURE in getattr(item, "fixturenames", ()):
            return ("watch", False, {})
        return None

    def _enter(self, item: pytest.Item, kind: str, all_threads: bool,
               watch_keywords: Optional[Dict[str, Any]] = None) -> Any:
        """An entered scope, or None where it cannot be had (said once, as a
        warning; the test then runs as it would without the plugin: the rule of
        every cuda_debug entry point), or after a test poisoned the context."""
        if self.unavailable is not None or self.poisoner is not None:
            return None
        _arm()                          # (a fixture may be asked for at run time)
        from . import _scope
        from ._errors import CudaUnavailableError, ToolConflictError
        scope = _scope.watch(**(watch_keywords or {})) if kind == "watch" else \
            _scope.launch_blocking(True, all_threads=all_threads)
        try:
            scope.__enter__()
        except CudaUnavailableError as e:
            self.unavailable = str(e)
            self._say(item, "cuda_debug: %s is unavailable here, tests ran without it: %s"
                      % (scope._what, e))
            return None
        except ToolConflictError as e:
            if not self.warned_conflict:
                self.warned_conflict = True
                self._say(item, "cuda_debug: %s skipped for %s (and later tests, while the "
                                "tool holds CUPTI): %s" % (scope._what, item.nodeid, e))
            return None
        return scope

    @staticmethod
    def _say(item: pytest.Item, text: str) -> None:
        """Say `text` once, in the terminal summary (not as a warning inside a
        test: `filterwarnings = error` would fail it). It travels with the
        test's reports (user_properties), so an xdist controller says it too."""
        item.user_properties.append((PROPERTY_NOTE, text))

    def _phase(self, item: pytest.Item) -> _Wrapper:
        """Run one phase (setup, call, teardown) of `item` in a scope if wanted.

        An old-style hookwrapper (every pluggy): the phase's exception reaches
        the scope's __exit__, which may translate it (a framework's error into
        DeviceAssertError...); the translation replaces the phase's outcome."""
        want = self._wanted(item)
        scope = self._enter(item, *want) if want else None
        region = self.guard.enter(item)
        outcome = yield
        if region is not None:
            region.__exit__(None, None, None)
        if scope is None:
            return
        excinfo = outcome.excinfo
        exc = excinfo[1] if excinfo else None
        try:
            scope.__exit__(type(exc) if exc is not None else None, exc,
                           exc.__traceback__ if exc is not None else None)
        except BaseException as translated:
            if exc is not None and exc.__traceback__ is not None and \
                    exc in (translated.__cause__, translated.__context__):
                # Show the translated error at the test's own frames (where the
                # launch failed), not at this hook and the scope's __exit__.
                translated = translated.with_traceback(_at_test_frames(translated, exc))
            _force_exception(outcome, translated)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """The session's watch() left."""
        scope, self.session_watch = self.session_watch, None
        if scope is not None:
            try:
                scope.__exit__(None, None, None)
            except Exception:   # the tests' failures already said it
                pass

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> _Wrapper:
        """The session's watch() entered at the first test; this phase in a scope."""
        item.stash[_SEQ] = _fault_seq()
        if self.watch_session and self.session_watch is None and self.unavailable is None:
            # Entered at the first test, in the process that runs it (an xdist
            # controller runs none and never initialises CUDA).
            self.session_watch = self._enter(item, "watch", False)
        yield from self._phase(item)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> _Wrapper:
        """The test's call in a scope, where one is wanted."""
        yield from self._phase(item)

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item,
                                nextitem: Optional[pytest.Item]) -> _Wrapper:
        """The teardown in a scope, where one is wanted."""
        yield from self._phase(item)

    # -- fail fast ----------------------------------------------------------------------

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item,
                                  call: pytest.CallInfo[None]) -> _Wrapper:
        """Fail fast: did the CUDA context die in this phase?"""
        outcome = yield
        rep = outcome.get_result()
        try:
            self._check(item, call, rep)
        except Exception as e:  # never let the plugin break a run
            rep.sections.append((SECTION, "cuda_debug could not check this test for a sticky "
                                          "CUDA error: %s: %s" % (type(e).__name__, e)))

    def _check(self, item: pytest.Item, call: pytest.CallInfo[None],
               rep: pytest.TestReport) -> None:
        exc = call.excinfo.value if call.excinfo is not None else None
        if item.stash.get(_SEEN, False):
            return
        if exc is None and _fault_seq() <= item.stash.get(_SEQ, 1 << 62):
            return                          # the common case: nothing happened
        tb = call.excinfo.tb if call.excinfo is not None else None
        may_probe = (rep.failed or hasattr(rep, "wasxfail")) and self.poisoner is None
        text, located, err = _report_text(item, exc, tb, may_probe=may_probe)
        if text is None:
            if not (rep.failed and self.poisoner is not None and _cudaish(exc)):
                return
            # A CUDA failure after an earlier test poisoned the context: its
            # consequence. Stop here, naming the culprit.
        item.stash[_SEEN] = True
        culprit = self.poisoner
        if culprit is None:
            assert text is not None         # (no report is only a consequence of a culprit)
            blame = _launching_test(self.session, item, err) if located else SURFACED
            culprit = self.poisoner = _Culprit(item.nodeid, text, _outcome(rep), self.worker,
                                               blame=blame)
            rep.user_properties.append((PROPERTY, text))
            if blame:
                rep.user_properties.append((PROPERTY_BLAME, blame))
        else:
            from . import _sticky
            rep.user_properties.append((PROPERTY_DEAD, "%s\n  (the CUDA context was already "
                                        "dead: %s poisoned it)" % (
                                            _sticky.first_line(exc) if exc is not None
                                            else (text or "?").splitlines()[0],
                                            culprit.nodeid)))
        if self.worker is not None:
            self.exit_after = item.nodeid   # see pytest_runtest_logfinish
        if not rep.failed:
            return      # passed (pytest.raises), xfailed: the context is dead all the same
        from ._errors import StickyCudaError
        lines = []
        if text is not None and not isinstance(exc, StickyCudaError):
            lines.append(text)              # the traceback above does not show it
        if culprit.nodeid != item.nodeid:
            lines.append("The CUDA context of this process was already dead: %s:" % (
                "it died in %s" % culprit.nodeid if culprit.blame == SURFACED else
                "%s poisoned it" % (culprit.blame or culprit.nodeid)))
            lines.append(_indent(culprit.report))
        elif culprit.blame == SURFACED:
            # No watch: which test launched the kernel is not known (kernels run
            # asynchronously). Say where it surfaced, and how to name the launch.
            lines.append("The CUDA context of this process died during this test: every later "
                         "CUDA call in it fails. The fault surfaced in this test; an earlier "
                         "test may have launched the faulting kernel%s. To name the test, the "
                         "kernel and the line that launched it, run with %s." % (
                             " (the previous one was %s)" % self.previous if self.previous
                             else "", WATCH_OPTION))
        elif culprit.blame:
            lines.append("The fault surfaced in this test; %s launched the faulting kernel "
                         "(watch() recorded the launch, above): every later CUDA call in this "
                         "process fails." % culprit.blame)
        else:
            lines.append("This test poisoned the CUDA context of this process: every later "
                         "CUDA call in it fails.")
        if self.worker is not None:
            lines.append("pytest-xdist worker %s exits after this test; a fresh worker runs "
                         "the rest." % self.worker)
        elif self.session is not None:
            items = self.session.items
            self.not_run = len(items) - items.index(item) - 1 if item in items else 0
            self.stopped_at = item.nodeid
            lines.append("pytest stops here: %s not run." % _plural(self.not_run))
            kind = culprit.report.splitlines()[0].split(":")[0]
            if culprit.blame == SURFACED:
                self.session.shouldfail = "cuda_debug: the CUDA context died in %s (%s; it " \
                    "surfaced there, an earlier test may have launched the kernel: %s names " \
                    "it): stopping, %s not run" % (culprit.nodeid, kind, WATCH_OPTION,
                                                   _plural(self.not_run))
            elif culprit.blame:
                self.session.shouldfail = "cuda_debug: %s poisoned the CUDA context (%s, " \
                    "surfaced in %s): stopping, %s not run" % (
                        culprit.blame, kind, culprit.nodeid, _plural(self.not_run))
            else:
                self.session.shouldfail = "cuda_debug: %s poisoned the CUDA context (%s): " \
                    "stopping, %s not run" % (culprit.nodeid, kind, _plural(self.not_run))
        rep.sections.append((SECTION, "\n".join(lines)))

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_logfinish(self, nodeid: str, location: Tuple[str, Optional[int], str]
                                 ) -> None:
        """An xdist worker whose test poisoned its context exits here."""
        self.previous = nodeid
        if self.exit_after == nodeid:
            # xdist worker after a poisoning test: its reports are sent (execnet
            # writes synchronously). Exit, so that the controller starts a fresh
            # worker, with a live CUDA context, for the tests still to run.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(WORKER_EXIT_STATUS)

    # -- reports: the controller side (and the single process) ----------------------------

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """The culprits and notes a report carries (also from xdist's workers)."""
        props = getattr(report, "user_properties", None) or ()
        blame = next((v for k, v in props if k == PROPERTY_BLAME), None)
        for key, value in props:
            if key == PROPERTY_NOTE and value not in self.notes:
                self.notes.append(value)
            if key in (PROPERTY, PROPERTY_DEAD) and \
                    not any(c.nodeid == report.nodeid for c in self.culprits):
                node = getattr(report, "node", None)
                worker = getattr(getattr(node, "gateway", None), "id", None) or self.worker
                self.culprits.append(_Culprit(report.nodeid, value, _outcome(report), worker,
                                              consequence=key == PROPERTY_DEAD,
                                              blame=blame if key == PROPERTY else None))

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport,
                               sched: Any) -> None:
        """xdist controller: a worker that we made exit 'crashed' while running
        its poisoning test, which has its own report already: don't count it twice."""
        if any(c.nodeid == crashitem and c.worker for c in self.culprits):
            report.outcome = "passed"
            report.when = "teardown"
            report.longrepr = None

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter,
                                exitstatus: int, config: pytest.Config) -> None:
        """The notes, the culprits and why the session stopped."""
        tr = terminalreporter
        for note in self.notes:
            tr.write_line(note, yellow=True)
        if not self.culprits:
            return
        tr.write_sep("=", "cuda_debug: sticky CUDA error", red=True, bold=True)
        controller = self.worker is None and config.pluginmanager.getplugin("dsession") is not None
        shown = getattr(config.option, "tbstyle", "auto") not in ("no", "line")
        for c in self.culprits:
            where = " (xdist worker %s)" % c.worker if controller and c.worker else ""
            if c.consequence:
                tr.write_line("%s%s failed on the dead CUDA context:" % (c.nodeid, where))
            elif c.blamed():
                tr.write_line("%s%s %s: %s:" % (c.nodeid, where, c.outcome, c.blamed()))
            else:
                tr.write_line("%s%s %s the CUDA context:" % (
                    c.nodeid, where, "failed: it poisoned" if c.outcome == "failed"
                    else "%s, but poisoned" % c.outcome))
            if c.outcome == "failed" and not c.consequence and shown:
                # its failure above holds the report: once is enough
                tr.write_line("  %s  (its report is in the failure above)"
                              % c.report.splitlines()[0])
            else:
                tr.write_line(_indent(c.report))
            if controller and c.worker:
                tr.write_line("  Worker %s exited after it; xdist replaced it and ran the "
                              "remaining tests on workers with a live context." % c.worker)
        if self.stopped_at is not None:
            tr.write_line("pytest stopped after %s: %s not run (a dead CUDA context fails every "
                          "later CUDA call in the process)." % (self.stopped_at, _plural(self.not_run)))



class _Guard:
    """--cuda-guard, ini cuda_guard, CUDA_DEBUG_GUARD=1, marker cuda_guard: each
    phase of a test inside cuda_debug.guard(). A GuardError is an ordinary
    failure of that test (nothing was launched): no fail fast."""

    every_test: bool
    how: str

    def __init__(self, config: pytest.Config):
        from . import _options
        option, ini = bool(config.getoption("cuda_guard")), bool(config.getini(GUARD_INI))
        self.every_test = option or ini or _options.OPTIONS.guard
        self.how = GUARD_OPTION if option else "ini %s" % GUARD_INI if ini else "CUDA_DEBUG_GUARD=1"

    def header(self) -> Optional[str]:
        return "cuda_debug guard: on, every test (%s)" % self.how if self.every_test else None

    def enter(self, item: pytest.Item) -> Optional[_GuardRegion]:
        """The entered guard() for this phase of `item`, or None."""
        m = item.get_closest_marker(GUARD_MARKER)
        on = _marker_call(item, m, ())[0] if m is not None else self.every_test
        if not on:
            return None
        from ._guard import guard
        region = guard()
        region.__enter__()
        return region


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    """guard()'s line of the report header, when it is on for every test."""
    plugin = config.stash.get(_PLUGIN, None)
    return plugin.guard.header() if plugin is not None else None
