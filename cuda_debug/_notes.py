"""The verdict on every CUDA error, wherever it surfaces.

A sticky fault surfaces wherever the next CUDA call happens to be: in another
thread than the watch's, inside a framework that catches and logs it, in an
outer context manager's ``__exit__`` that synchronises again (a profiler, a
timer) and replaces the error the watch translated, uncaught in a thread, at
interpreter exit. The exception a user, a log or an error tracker sees is then
the framework's own (``torch.AcceleratorError``, CuPy's, Triton's), not the
watch's translated one.

So, while a watch is open and once a sticky fault was seen in the process,
every CUDA error raised carries the one verdict (csrc/report/verdict.c,
rendered by _errors.format_report) as an exception note
(``BaseException.add_note``: tracebacks, ``logging``, ``traceback``,
``threading.excepthook`` and error trackers print notes), and the
cuda_debug exception itself as its ``cuda_debug_error`` attribute. The class
stays the framework's: code that catches ``torch.AcceleratorError`` goes on
catching it. Where the watch's own ``with`` sees the error, it is translated
into cuda_debug's class, as before.

How: on Python 3.12+, ``sys.monitoring``'s RAISE event, which fires in every
thread for every exception raised or propagated through Python code. Its
callback is C (``_core.on_raise``): one C call a raised exception, returning at
once unless a sticky fault was seen, or a watch is open and the exception is a
RuntimeError (what torch, CuPy, Triton and JAX raise CUDA errors as); only
then is Python called. It is armed by the first watch() and disarmed when the
last watch closes with no fault seen, so a process that leaves its watches
pays nothing. Chosen over wrapping frameworks' raise sites (there are many,
and they change) and over making the profiler's exit keep our exception
(one wrapper of many: a timer, Lightning's, Accelerate's).

On Python 3.10/3.11 there is no process-wide raise event (``sys.setprofile``
costs every call). There the verdict is added where an exception is printed:
``traceback.TracebackException`` (``traceback.print_exc``,
``format_exception``, ``logging``), ``sys.excepthook`` and
``threading.excepthook`` (3.10 prints no notes: the text follows the
traceback); an exception only inspected in code (``str(e)``) has no note there.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import sys
import threading
from typing import Any, Callable, Optional

from . import _core

_MONITORING = hasattr(sys, "monitoring")
_TOOL_IDS = (4, 3)             # unassigned by sys.monitoring (DEBUGGER 0 ... OPTIMIZER 5)
_lock = threading.Lock()
_tool: Optional[int] = None    # the sys.monitoring tool id held, while armed
_surfaces = False              # the 3.10/3.11 hooks installed
_busy = threading.local()      # this thread is inside the hook (no re-entry)
HEAD = "cuda_debug: "          # every note starts with it (one note an exception)


def _note_text(err) -> str:
    """The verdict as a note: the report without where it surfaced (the
    exception the note is on may have surfaced elsewhere)."""
    lines = [ln for ln in str(err).splitlines() if not ln.startswith("  surfaced at ")]
    return "%s%s: %s" % (HEAD, type(err).__name__, "\n".join(lines))


_build: Optional[Callable[[BaseException], Any]] = None


def configure(build: Callable[[BaseException], Any]) -> None:
    """`build(exc)`: the cuda_debug exception carrying the verdict on the
    sticky fault `exc` speaks of, or None (_report.verdict_error)."""
    global _build
    _build = build


def annotate(exc: Optional[BaseException]) -> bool:
    """Put the verdict on `exc` (a note and ``cuda_debug_error``), once. True
    when it carries it now."""
    if exc is None or getattr(_busy, "on", False):
        return False
    _busy.on = True
    try:
        notes = getattr(exc, "__notes__", None) or ()
        if any(isinstance(n, str) and n.startswith(HEAD) for n in notes):
            return True
        err = _build(exc) if _build is not None else None
        if err is None:
            return False
        try:
            exc.cuda_debug_error = err            # type: ignore[attr-defined]
        except (AttributeError, TypeError):
            pass                                  # a class with __slots__
        text = _note_text(err)
        if hasattr(exc, "add_note"):
            exc.add_note(text)
        else:                                     # 3.10: read by the surfaces below
            try:
                exc.__notes__ = list(notes) + [text]    # type: ignore[attr-defined]
            except (AttributeError, TypeError):
                return False
        return True
    except Exception:                             # never in place of the user's error
        return False
    finally:
        _busy.on = False


def _on_raise(exc: BaseException) -> None:
    annotate(exc)


# -- arming ----------------------------------------------------------------------------


_open = 0                      # watches open (entered() - left()), under _lock


def entered() -> None:
    """A watch opened: armed while any is open."""
    global _open
    with _lock:
        _open += 1
        _arm_locked()


def left() -> None:
    """A watch closed: when none is open and no sticky fault was seen, the
    raise event is given back (nothing left behind)."""
    global _open, _tool
    with _lock:
        _open = max(0, _open - 1)
        if _open or _tool is None or _core.sticky_seen(False):
            return
        mon = sys.monitoring
        mon.set_events(_tool, 0)
        mon.register_callback(_tool, mon.events.RAISE, None)
        mon.free_tool_id(_tool)
        _tool = None


def arm() -> None:
    """A sticky fault was seen: armed for good (every later CUDA error is its
    consequence)."""
    if _tool is None and not _surfaces:
        with _lock:
            _arm_locked()


def _arm_locked() -> None:
    global _tool
    if _tool is not None or _surfaces:
        return
    _core.set_raise_hook(_on_raise)
    if _MONITORING:
        mon = sys.monitoring
        for tid in _TOOL_IDS:
            try:
                if mon.get_tool(tid) is not None:
                    continue
                mon.use_tool_id(tid, "cuda_debug")
            except ValueError:                    # taken meanwhile by another tool
                continue
            try:
                mon.register_callback(tid, mon.events.RAISE, _core.on_raise)
                mon.set_events(tid, mon.events.RAISE)
            except Exception:                     # never in the way of watch()
                mon.free_tool_id(tid)
                break
            _tool = tid
            return
    _install_surfaces()                           # 3.10/3.11, or every tool id taken


def armed() -> Optional[str]:
    """How the verdict reaches errors now: "monitoring", "surfaces" or None."""
    return "monitoring" if _tool is not None else "surfaces" if _surfaces else None


# -- 3.10/3.11: at the surfaces --------------------------------------------------------


def _appended(exc: Optional[BaseException]) -> str:
    """3.10 prints no notes: the text to append after a traceback."""
    if exc is None or hasattr(exc, "add_note"):
        return ""
    notes = getattr(exc, "__notes__", None) or ()
    return "".join("\n" + n for n in notes if isinstance(n, str) and n.startswith(HEAD))


def _install_surfaces() -> None:
    """Python's own printers of exceptions: ``traceback.TracebackException``
    (``traceback.print_exc``/``format_exception``, ``logging``), and the two
    excepthooks (C's printer, for uncaught errors)."""
    import traceback
    global _surfaces
    _surfaces = True
    previous_sys = sys.excepthook
    previous_thread = threading.excepthook
    TE = traceback.TracebackException
    previous_init, previous_format = TE.__init__, TE.format

    def init(self, exc_type, exc_value, *args, **kwargs):
        annotate(exc_value)
        previous_init(self, exc_type, exc_value, *args, **kwargs)
        self._cuda_debug_tail = _appended(exc_value)

    def format(self, *args, **kwargs):
        yield from previous_format(self, *args, **kwargs)
        tail = getattr(self, "_cuda_debug_tail", "")
        if tail:
            yield tail.lstrip("\n") + "\n"

    def excepthook(typ, value, tb):
        annotate(value)
        previous_sys(typ, value, tb)
        tail = _appended(value)
        if tail:
            sys.stderr.write(tail.lstrip("\n") + "\n")

    def thread_excepthook(args):
        annotate(args.exc_value)
        previous_thread(args)
        tail = _appended(args.exc_value)
        if tail:
            sys.stderr.write(tail.lstrip("\n") + "\n")

    TE.__init__ = init                                      # type: ignore[method-assign]
    TE.format = format                                      # type: ignore[method-assign]
    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook


def _after_fork_in_child() -> None:
    global _lock, _open
    _lock = threading.Lock()
    _open = 0                     # the parent's watches are not open here


os.register_at_fork(after_in_child=_after_fork_in_child)
