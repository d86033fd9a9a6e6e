"""launch_blocking() and watch(): the two ways to find a faulting kernel.

``launch_blocking()``: kernels launched by this thread inside the block run
synchronously; a fault raises at its launching line. ``watch()``: every
thread's kernels keep running asynchronously; each launch leaves a record and
a completion marker (csrc/capture/watch_ring.c), so a fault that surfaces later,
anywhere, names its launch.

Both take CUPTI's driver launch callbacks when the first of them opens and
give them back when the last one closes (profilers can take CUPTI between).
Opening, draining the work queued before it, taking CUPTI and recording the
open scope are one C call (csrc/hooks/scopes.c): a KeyboardInterrupt cannot leave
CUPTI held. Per thread, the C core keeps a small stack of open scopes; a scope
closes by its own token, so asyncio tasks interleaving scopes on one thread
never unblock each other early.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import contextlib
import os
import functools
import sys
import warnings
from types import TracebackType
from typing import (TYPE_CHECKING, Any, Callable, List, Literal, NoReturn, Optional, Type, TypeVar,
                    overload)

from . import (_core, _cuda_errors, _dispatch_fallback, _hangs, _libraries, _locations, _notes,
               _options, _report, _torch_ops)
from ._errors import CudaError, CudaUnavailableError, ToolConflictError

CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39

_watch_epoch = None            # watch_seq() when the first watch() opened
_exact_lock = None             # threading.Lock, made at the first watch()
_exact_open = 0                # open watch(exact=True) blocks: any makes every launch marked


def _set_markers(exact_delta: int) -> None:
    """Count an exact watch() in or out, and set the C core's marker spacing:
    a marker behind every launch while any watch(exact=True) is open, else
    behind every CUDA_DEBUG_WATCH_EVERY-th launch of a stream."""
    global _exact_lock, _exact_open
    if _exact_lock is None:
        import threading
        _exact_lock = threading.Lock()
    with _exact_lock:
        _exact_open = max(0, _exact_open + exact_delta)
        _core.set_watch_markers(1 if _exact_open else _options.OPTIONS.watch_every)


def _after_fork_in_child() -> None:
    """A forked child: the lock free (another thread may have held it at the
    fork: the child's own watch() waited for it for good), no exact watch of
    the parent's open here."""
    global _exact_lock, _exact_open
    _exact_lock = None
    _exact_open = 0


os.register_at_fork(after_in_child=_after_fork_in_child)

# Regions entered and not yet exited, kept alive until they are: a block entered
# without a reference kept (``cuda_debug.watch().__enter__()``, the notebook idiom
# of ``torch.no_grad().__enter__()``) stays open until its __exit__ (the object
# __enter__ returned) or the end of the process, instead of closing when the
# object is freed, on the next line (issue 25 item 6).
_entered: "set[_Region]" = set()

_F = TypeVar("_F", bound=Callable[..., Any])
# `with` on a scope never swallows the exception: its __exit__ returns False or raises.
_ExcType = Optional[Type[BaseException]]


def _is_bool(value: object) -> bool:
    """True or False (NumPy's too: numpy.bool_, numpy.bool in NumPy 2)."""
    return isinstance(value, bool) or (type(value).__name__ in ("bool_", "bool") and
                                       type(value).__module__ == "numpy")


def _check_bool(name: str, value: object) -> bool:
    if not _is_bool(value):
        raise TypeError("%s must be True or False, not %r" % (name, value))
    return bool(value)


# A CUDA error raised anywhere, outside a watch's own `with`, carries the verdict.
_notes.configure(lambda exc: _report.verdict_error(exc, _watch_epoch))


def watch_epoch() -> Optional[int]:
    """The watch-ring seq before the first watch() of the process, or None."""
    return _watch_epoch


def _capturing() -> bool:
    """Is this thread capturing a CUDA graph (by the frameworks that know their
    current stream)? Then entering must not drain: a synchronisation would
    invalidate the capture."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized() and \
                torch.cuda.is_current_stream_capturing():
            return True
    except Exception:
        pass
    cupy = sys.modules.get("cupy")
    try:
        if cupy is not None and cupy.cuda.get_current_stream().is_capturing():
            return True
    except Exception:
        pass
    return False


def _open(kind: int, all_threads: bool, what: str, caller):
    """Open a scope in C; raise the cuda_debug error for what prevents it."""
    replay = sys.modules.get("cuda_debug._replay")
    if replay is not None and replay.active():      # cuda-debug replay: scopes do nothing
        return replay.ScopeStandIn(kind)
    if kind != _core.SCOPE_OPT_OUT:
        _libraries.ensure(_libraries.CUPTI)
        _options.apply()
        _report.configure_core()
    if kind == _core.SCOPE_WATCH:
        _core.set_launch_hooks(_options.launch_hooks_wanted())
    where = _dispatch_fallback.where_of(caller)
    status, *rest = _core.scope_open(kind, all_threads, kind != _core.SCOPE_OPT_OUT and
                                     not _capturing(), where.encode("utf-8", "surrogateescape"))
    if status == 0:
        if kind != _core.SCOPE_OPT_OUT and "torch" in sys.modules:
            _dispatch_fallback.install_profiler_guard()
        if len(rest) > 1 and rest[1] == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
            _dispatch_fallback.watch_without_cupti(where)
        return rest[0]
    if status == 1:
        err = _report.error_for(None, code=rest[0], watch_mark=_watch_epoch,
                                found_at="%s entry" % what, frame=caller)
        err.before_scope = True
        raise err
    if status == 3:
        raise RuntimeError("cuda_debug: more than %d scopes open in one thread" % rest[0])
    rc, holder = rest
    text = _core.cupti_result_string(rc) or "CUPTI error %d" % rc
    if rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        if holder and "<not provided>" in holder:
            holder = None                # a client that gave no name (Kineto does not)
        if _dispatch_fallback.available():
            return _dispatch_fallback.open_fallback(what, holder)
        who = holder or "another CUPTI client (a profiler such as torch.profiler/Kineto, " \
                        "Nsight Systems/Compute, or cuda-gdb)"
        raise ToolConflictError(
            "%s needs CUPTI, which is held by %s: leave the profiler (or run without the "
            "tool) and enter again" % (what, who), holder=holder or None)
    raise CudaUnavailableError("CUPTI refused the launch callbacks: %s (%d)" % (text, rc),
                               missing="cupti", cupti_result=rc)


class _Region(contextlib.ContextDecorator):
    """What launch_blocking() and watch() share: strict arguments, the bare
    decorator, coroutine functions covered for their whole run, generator
    functions refused, balanced enter/exit."""

    _what = "region"
    _handles: List[Any]             # the open C scopes of this object (nested entries)

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        # @cuda_debug.launch_blocking without parentheses: the argument is the function
        # (anything else callable is refused by __call__, saying what is accepted).
        if len(args) == 1 and not kwargs and callable(args[0]) and \
                not isinstance(args[0], (bool, int)):
            return cls()(args[0])
        return super().__new__(cls)

    _takes = "True or False"

    def _refuse(self, obj: object) -> TypeError:
        """TypeError for an object that is neither a function nor an argument."""
        import inspect          # (here, not at import: the first watch() is cheaper)
        if inspect.isclass(obj):
            what = "the class %s" % obj.__qualname__
            hint = ": decorate its methods, or put `with cuda_debug.%s:` around the code" \
                % self._what
        else:
            what = "a %s object" % type(obj).__qualname__
            hint = (": to cover a model or another callable object, call it inside "
                    "`with cuda_debug.%s:`" % self._what) if callable(obj) else ""
        return TypeError("%s decorates functions and takes %s, not %s%s"
                         % (self._what, self._takes, what, hint))

    def _copy(self) -> Any:
        raise NotImplementedError           # (each region makes its own copy)

    def _recreate_cm(self) -> Any:
        # Each decorated call gets its own object: one function may run in two
        # threads (or recursively) at once.
        return self._copy()

    def __call__(self, func: _F) -> _F:
        import inspect
        if not (inspect.isroutine(func) or isinstance(func, functools.partial)):
            raise self._refuse(func)
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                "%s cannot decorate the generator function %s: the scope would cover only "
                "the creation of the generator, not its run. Put `with %s:` inside it."
                % (self._what, getattr(func, "__qualname__", func), self._what))
        if inspect.iscoroutinefunction(func):
            @functools.wraps(func)
            async def run_coroutine(*args: Any, **kwargs: Any) -> Any:
                with self._recreate_cm():
                    return await func(*args, **kwargs)
            return run_coroutine  # type: ignore[return-value]  # (functools.wraps keeps _F)
        return super().__call__(func)

    def _exit_handle(self) -> Any:
        if not self._handles:
            raise RuntimeError("%s: __exit__ without a matching __enter__" % self._what)
        handle = self._handles.pop()
        if not self._handles:
            _entered.discard(self)
        handle.close()
        return handle

    @staticmethod
    def _raise(err: CudaError, exc: Optional[BaseException]) -> NoReturn:
        if exc is None:
            raise err
        launch = _report.raised_at_launch(exc, err)
        if launch is None:
            # The frames of the faulting call, as contextlib re-raises: the
            # printed traceback ends at the launching line, not at __exit__.
            raise err.with_traceback(exc.__traceback__) from exc
        # `exc` was raised later, while the exception from the launch was
        # handled (a framework's teardown): the traceback goes through the
        # launching line, the cause is the exception raised there, and `exc`
        # stays the context (the report names it as a consequence).
        err.__context__ = exc
        raise err.with_traceback(_locations.traceback_through(
            exc.__traceback__, launch.__traceback__)) from launch


class launch_blocking(_Region):
    """Make kernel launches synchronous inside the block (or the decorated
    function), for this thread, switched on at run time.

    A kernel that faults makes its own launch call fail, so the framework raises
    at the launching line, and the exception that leaves the block is a
    cuda_debug error (DeviceAssertError, IllegalAddressError, ...) chained to
    the framework's, with its traceback. ``launch_blocking(False)`` opts out
    inside a blocking region. Entering waits for the work already queued: a
    fault found there is reported as having happened before the scope.

    Launches on a stream being captured into a CUDA graph are not synchronised
    (the capture stays valid). Copies and memsets are not synchronised.
    """

    _what = "launch_blocking()"
    _takes = "enabled=True|False and all_threads=True|False"
    enabled: bool
    all_threads: bool

    if TYPE_CHECKING:
        # What type checkers see: the bare decorator (@cuda_debug.launch_blocking)
        # returns the function, the call an instance. (A type checker prefers
        # __init__ to __new__ when a class has both: it sees no __init__.)
        @overload
        def __new__(cls, enabled: _F) -> _F: ...  # type: ignore[misc]
        @overload
        def __new__(cls, enabled: bool = True, *, all_threads: bool = False
                    ) -> "launch_blocking": ...
        def __new__(cls, *args: Any, **kwargs: Any) -> Any: ...
    else:
        def __init__(self, enabled: bool = True, *, all_threads: bool = False):
            self.enabled = _check_bool("launch_blocking(enabled)", enabled)
            self.all_threads = _check_bool("launch_blocking(all_threads)", all_threads)
            if self.all_threads and not self.enabled:
                raise ValueError(
                    "launch_blocking(False, all_threads=True): all_threads=True blocks every "
                    "thread's launches, and launch_blocking(False) blocks none (it opts this "
                    "thread out): pass one of them")
            self._handles = []

    def _copy(self) -> "launch_blocking":
        return launch_blocking(self.enabled, all_threads=self.all_threads)

    def __enter__(self) -> "launch_blocking":
        kind = _core.SCOPE_BLOCK if self.enabled else _core.SCOPE_OPT_OUT
        self._handles.append(_open(kind, self.all_threads, self._what, _locations.current_frame(1)))
        try:      # kept open until exited (_entered); in one line: an interrupt before it frees
            return _entered.add(self) or self      # the region, and the handle closes
        except BaseException:
            _entered.discard(self)
            raise

    def __exit__(self, exc_type: _ExcType, exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> Literal[False]:
        handle = self._exit_handle()
        if not self.enabled:
            return False
        found_at = "launch" if exc is not None else "scope exit"
        dispatch = isinstance(handle, _dispatch_fallback.DispatchScope)
        code = None
        if exc is None and dispatch:
            # Ops the dispatch level did not see (another thread's, a launcher
            # outside PyTorch): what they left pending is found here.
            rc = _core.synchronize(-1)
            code = rc if _cuda_errors.is_sticky(rc) else None
        err = _report.error_for(exc, mark=handle.fault_mark, watch_mark=_watch_epoch,
                                found_at=found_at, code=code,
                                frame=_locations.current_frame(1) if exc is None else None)
        if err is None:
            return False
        if dispatch:
            err.mechanism = "dispatch"
        self._raise(err, exc)

    def __repr__(self) -> str:
        return "cuda_debug.launch_blocking(%s%s)" % (
            self.enabled, ", all_threads=True" if self.all_threads else "")


_no_reader_warned = False


def _warn_once_if_no_frame_reader() -> None:
    """watch() records each launch's line by reading the launching thread's
    frames in C; where this Python has no reader for them, say so once."""
    global _no_reader_warned
    if _core.FRAMES_SUPPORTED or _no_reader_warned:
        return
    _no_reader_warned = True
    warnings.warn("cuda_debug: no frame reader for this Python (%d.%d): %s: watch() reports "
                  "will name the launching line only where the framework's exception carries it"
                  % (sys.version_info[0], sys.version_info[1],
                     _core.FRAME_READER.split(": ", 1)[-1]), RuntimeWarning, stacklevel=3)


class watch(_Region):
    """Name the faulting kernel and its launching line while kernels keep
    running asynchronously: every thread, every stream, while the block (or
    the decorated function) runs.

    Each launch leaves a record (kernel, grid/block, stream, thread, launching
    Python line) and a completion marker written by the GPU behind it. When a
    sticky error surfaces (here, at ``.item()``, in another thread, at
    ``check()``), the exception names the launch whose marker never came:
    ``kernel``, ``filename``/``lineno``, ``exact`` and ``candidates``,
    ``surfaced_at``, ``recent_launches``. Costs a few percent of a training
    step, not the 2x of ``CUDA_LAUNCH_BLOCKING=1``; use ``launch_blocking()``
    to raise at the launching line itself and to keep the process going after
    non-sticky errors.

    A CUDA graph captured inside the block gets a marker behind every kernel
    node: a fault during a replay names the node (``graph_node``, its
    ``kernel``), ``captured_at`` and ``replayed_at`` (csrc/capture/graph_capture.c).

    Always on by default: a launch gets a marker of its own only every 16th
    launch of its stream (``CUDA_DEBUG_WATCH_EVERY``), and the stream the host
    waits for gets one behind its newest launch, so watch() costs about a
    percent of a training step (benchmarks/RESULTS.md). The culprit is exact
    when the device names the kernel (device asserts: PyTorch's, Triton's);
    otherwise it is among at most 16 launches of its stream, each named
    (``exact`` False, ``candidates``, ``markers_every``). ``exact=True`` (or
    ``CUDA_DEBUG_WATCH_EXACT=1``) puts a marker behind every launch: every
    fault names its launch, for a few percent more; for reproductions.

    ``ops=True`` (or ``CUDA_DEBUG_WATCH_OPS=1``) also records, for launches
    made by PyTorch ops of this thread and its autograd threads, the op and
    its input shapes (``op``, ``inputs``): a Python call per op, so it costs
    more than watch() alone (benchmarks/RESULTS.md); without it ``op`` is None.

    ``watch(False)`` is no watch (as ``guard(False)`` and ``launch_blocking(False)``
    are off): its block opens nothing, and a watch() open around it goes on
    watching (watch is process-wide). ``ops``, ``hang_after`` and ``exact`` are
    keywords.

    ``hang_after=s`` (or ``CUDA_DEBUG_HANG_AFTER=s``; 0 turns it off): when a
    launch has stayed unfinished for s seconds while later launches queue
    behind it on its stream, or while the program launches nothing (it waits),
    every stream's oldest unfinished launch (kernel or NCCL collective,
    launching line, age, queue depth) is written to stderr, once per stuck
    launch, and the program goes on. ``python -m cuda_debug dump PID`` prints
    the same report in the terminal it runs in, at any time (``SIGUSR1`` writes
    it to this process's stderr); ``cuda_debug.in_flight()`` returns it as
    records.
    """

    _what = "watch()"
    _takes = "enabled=True|False and the keywords ops=, hang_after= and exact="
    enabled: bool
    ops: bool
    hang_after: Optional[float]
    exact: bool
    _recorders: List[Any]
    _hang: List[Optional[float]]

    if TYPE_CHECKING:             # as launch_blocking's: @cuda_debug.watch returns the function
        @overload
        def __new__(cls, enabled: _F) -> _F: ...  # type: ignore[misc]
        @overload
        def __new__(cls, enabled: bool = True, *, ops: Optional[bool] = None,
                    hang_after: Optional[float] = None, exact: Optional[bool] = None
                    ) -> "watch": ...
        def __new__(cls, *args: Any, **kwargs: Any) -> Any: ...
    else:
        def __new__(cls, enabled=True, *, ops=None, hang_after=None, exact=None):
            # watch(False) is no watch: an object whose block opens nothing
            # (_WatchOff), checked by the same __init__. (Parameters named, not
            # *args: inspect.signature and help() read them from here.)
            if cls is watch and _is_bool(enabled) and not enabled:
                return _Region.__new__(_WatchOff)
            given = {k: v for k, v in (("ops", ops), ("hang_after", hang_after),
                                       ("exact", exact)) if v is not None}
            return _Region.__new__(cls, enabled, **given)

        def __init__(self, enabled: bool = True, *, ops: Optional[bool] = None,
                     hang_after=None, exact=None):
            self.enabled = _check_bool("watch(enabled)", enabled)
            self.ops = _options.OPTIONS.watch_ops if ops is None else \
                _check_bool("watch(ops)", ops)
            self.hang_after = _hangs.check_hang_after(hang_after)
            self.exact = _options.OPTIONS.watch_exact if exact is None else \
                _check_bool("watch(exact)", exact)
            if not self.enabled:
                given = [a for a, on in (("ops=True", ops), ("hang_after=%s" % hang_after,
                                                             hang_after), ("exact=True", exact))
                         if on]
                if given:
                    raise ValueError(
                        "watch(False, %s): %s configure%s a watch, and watch(False) is none "
                        "(a watch() open around it goes on: watch is process-wide): pass one "
                        "or the other" % (", ".join(given), " and ".join(given),
                                          "" if len(given) > 1 else "s"))
                self.ops = self.exact = False
                self.hang_after = None
            self._handles = []
            self._recorders = []
            self._hang = []

    def _copy(self) -> "watch":
        return watch(self.enabled, ops=self.ops, hang_after=self.hang_after or 0,
                     exact=self.exact)

    def __enter__(self) -> "watch":
        global _watch_epoch
        if "torch" in sys.modules:
            from . import _graphs
            _graphs.pair_pending()     # adopted graphs instantiated since their capture
        _set_markers(1 if self.exact else 0)     # before the first launch is recorded
        try:
            handle = _open(_core.SCOPE_WATCH, False, self._what, _locations.current_frame(1))
        except BaseException:
            if self.exact:
                _set_markers(-1)
            raise
        self._handles.append(handle)
        _warn_once_if_no_frame_reader()
        recorder = None
        if self.ops and "torch" in sys.modules and \
                not isinstance(handle, _dispatch_fallback.DispatchScope):
            try:
                recorder = _torch_ops.start_recording()
            except BaseException:
                self._handles.pop().close()
                raise
        self._recorders.append(recorder)
        hang = None
        if not isinstance(handle, _dispatch_fallback.DispatchScope):   # a ring to watch
            hang = self.hang_after
            _hangs.enter(hang)
        self._hang.append(hang)
        if _watch_epoch is None:       # no lock: two first watches differ by a few launches
            _watch_epoch = handle.watch_mark
        _notes.entered()               # the verdict onto CUDA errors raised anywhere
        try:                           # kept open until exited (see launch_blocking)
            return _entered.add(self) or self
        except BaseException:
            _entered.discard(self)
            raise

    def __exit__(self, exc_type: _ExcType, exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> Literal[False]:
        recorder = self._recorders.pop() if self._recorders else None
        if recorder is not None:
            recorder.close()
        if self._hang:
            _hangs.leave(self._hang.pop())
        handle = self._exit_handle()
        _notes.left()
        if self.exact:
            _set_markers(-1)
        if exc is None:
            return False
        err = _report.error_for(exc, mark=handle.fault_mark, watch_mark=_watch_epoch,
                                found_at="watch()")
        if err is None:
            return False
        self._raise(err, exc)

    def __repr__(self) -> str:
        args = (["False"] if not self.enabled else []) + (["ops=True"] if self.ops else []) + \
            (["hang_after=%g" % self.hang_after] if self.hang_after else []) + \
            (["exact=True"] if self.exact else [])
        return "cuda_debug.watch(%s)" % ", ".join(args)


class _WatchOff(watch):
    """``watch(False)``: no watch. Its block opens nothing and closes nothing; a
    watch() open around it (watch is process-wide) goes on watching, so
    ``is_watching()`` is what it was outside."""

    def __enter__(self) -> "watch":
        return self

    def __exit__(self, exc_type: _ExcType, exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> Literal[False]:
        return False


def is_launch_blocking() -> bool:
    """Whether kernels launched by this thread, now, are synchronous."""
    s = _core.thread_state()
    if s:
        return bool(s > 0)
    if _dispatch_fallback.thread_blocking():
        return True
    return bool(_core.stats()["all_threads"] > 0)


def is_watching() -> bool:
    """Whether a watch() is open in the process (launches are being recorded)."""
    return bool(_core.stats()["watching"] > 0)


_INT_MAX = 2 ** 31 - 1           # the C int a device ordinal is (CUdevice)


def check(device: Optional[int] = None) -> None:
    """Synchronise (the current context, or `device`'s) and raise the translated
    error if a fault is pending. Named kernel and line when the fault happened
    inside a scope or while watching; otherwise the error kind, and how to find
    the kernel."""
    if device is not None and (isinstance(device, bool) or not isinstance(device, int)):
        raise TypeError("check(device) takes a device ordinal (int), not %r" % (device,))
    if device is not None and not 0 <= device <= _INT_MAX:
        raise ValueError("check(device=%d): a device ordinal is %s" % (
            device, ">= 0" if device < 0 else "a GPU's number, 0 to the GPUs there are - 1"))
    _libraries.ensure(_libraries.CUDA)
    rc = _core.synchronize(-1 if device is None else device)
    if rc == 0:
        return
    err = _report.error_for(None, code=rc, watch_mark=_watch_epoch, found_at="check",
                            frame=_locations.current_frame(1))
    assert err is not None          # (a failed synchronisation is always reported)
    raise err


def last_error() -> Optional[CudaError]:
    """The last fault report (a cuda_debug exception), even if the exception
    that carried it was swallowed; None if no fault was recorded."""
    return _report.last_error()
