"""launch_blocking(): synchronous kernel launches for one region, at run time.

Entering the first scope in the process subscribes to CUPTI's driver launch
callbacks (csrc/launch_hooks.c); leaving the last one unsubscribes, so
profilers (torch.profiler / Kineto, Nsight) can take CUPTI again.

Per thread, the C core keeps one small state: +1 block, -1 opted out, 0 not in
a scope. Scopes save and restore it, so they nest. Threads outside any scope
launch asynchronously, except framework workers that launch for a scoped
thread: PyTorch's autograd device threads (``loss.backward()``) block while
any scope is open. ``launch_blocking(all_threads=True)`` blocks every thread
(JAX and other runtimes that launch from their own threads).
"""
import contextlib
import threading

from . import _core, _cuda_errors, _libraries, _report
from ._errors import CudaError, CudaUnavailableError, ToolConflictError

CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39

_tls = threading.local()


def _stack():
    s = getattr(_tls, "stack", None)
    if s is None:
        s = _tls.stack = []
    return s


def _acquire(all_threads: bool) -> None:
    _libraries.ensure(_libraries.CUPTI)
    rc, holder = _core.scope_acquire(all_threads)
    if rc == 0:
        return
    text = _core.cupti_result_string(rc) or "CUPTI error %d" % rc
    if rc == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
        who = holder or "another CUPTI client (a profiler such as torch.profiler/Kineto, " \
                        "Nsight Systems/Compute, or cuda-gdb)"
        raise ToolConflictError(
            "launch_blocking() needs CUPTI, which is held by %s: leave the profiler "
            "(or run without the tool) and enter the scope again" % who, holder=holder or None)
    raise CudaUnavailableError("CUPTI refused the launch callbacks: %s (%d)" % (text, rc),
                               missing="cupti", cupti_result=rc)


class launch_blocking(contextlib.ContextDecorator):
    """Make kernel launches synchronous inside the block (or the decorated
    function), for this thread, switched on at run time.

    A kernel that faults makes its own launch call fail, so the framework raises
    at the launching line, and the exception that leaves the block is a
    cuda_debug error (DeviceAssertError, IllegalAddressError, ...) chained to
    the framework's. ``launch_blocking(False)`` opts out inside a blocking region.

    Launches on a stream being captured into a CUDA graph are not synchronised
    (the capture stays valid). Copies and memsets are not synchronised.
    """

    def __init__(self, enabled: bool = True, *, all_threads: bool = False):
        self.enabled = bool(enabled)
        self.all_threads = bool(all_threads) and self.enabled

    def __enter__(self):
        if self.enabled:
            _acquire(self.all_threads)
        prev = _core.set_thread_state(1 if self.enabled else -1)
        _stack().append((prev, _core.fault_seq()))
        return self

    def __exit__(self, exc_type, exc, tb):
        prev, mark = _stack().pop()
        _core.set_thread_state(prev)
        if self.enabled:
            _core.scope_release(self.all_threads)
        err = _translate(mark, exc, tb)
        if err is None:
            return False
        if exc is not None:
            raise err from exc
        raise err

    def __repr__(self):
        return "cuda_debug.launch_blocking(%s%s)" % (
            self.enabled, ", all_threads=True" if self.all_threads else "")


def _translate(mark: int, exc, tb):
    """The cuda_debug error to raise at scope exit, or None to let `exc` go.

    A fault recorded after the scope was entered and not yet reported is
    translated when: it is sticky (the context is dead, whatever exception is
    passing is its consequence, and with no exception passing the framework
    swallowed it), or the passing exception speaks of it.
    """
    if _core.fault_seq() <= mark:
        return None
    raw = _report.raw_fault()
    if raw is None or raw.seq <= mark:
        return None
    if isinstance(exc, CudaError):          # already ours (inner scope, cuda_debug.testing)
        _report.claim(raw)
        return None
    sticky = _cuda_errors.is_sticky(raw.code)
    if exc is None and not sticky:
        return None
    if exc is not None and not sticky and not _report.mentions(exc, raw.code):
        return None
    if not _report.claim(raw):
        return None
    if exc is not None:
        return _report.remember(_report.build(raw, tb=tb, found_at="launch"))
    # No exception came through: locate the scope itself (our caller's caller).
    return _report.remember(_report.build(raw, frame=_report.current_frame(2),
                                          found_at="scope exit"))


def is_launch_blocking() -> bool:
    """Whether kernels launched by this thread, now, are synchronous."""
    s = _core.thread_state()
    if s:
        return s > 0
    return _core.stats()["all_threads"] > 0


def check(device=None) -> None:
    """Synchronise (the current context, or `device`'s) and raise the translated
    error if a fault is pending. Named kernel and line when the fault happened
    inside a scope; otherwise the error kind, and how to find the kernel."""
    _libraries.ensure(_libraries.CUDA)
    rc = _core.synchronize(-1 if device is None else int(device))
    if rc == 0:
        return
    raw = _report.raw_fault()
    frame = _report.current_frame(1)
    if raw is not None and raw.code == rc and _report.claim(raw):
        raise _report.remember(_report.build(raw, frame=frame, found_at="launch"))
    raise _report.remember(_report.build(None, code=rc, frame=frame, found_at="check"))


def last_error():
    """The last fault report (a cuda_debug exception), even if the exception
    that carried it was swallowed; None if no fault was recorded."""
    return _report.last_error()
