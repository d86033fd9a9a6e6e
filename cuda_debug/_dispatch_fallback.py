"""launch_blocking() without CUPTI, for PyTorch: synchronise after every op.

CUPTI serves one client per process, and torch.profiler (Kineto) keeps it for
the rest of the process once it ran (even a CPU-only profile). A scope entered
after that cannot see kernel launches. If PyTorch is imported, the scope then
falls back to a TorchDispatchMode that waits for the device after every ATen
op of this thread (and of the autograd threads working for it), so a fault
raises at the op that launched it, with the op's name and input shapes
(``exc.mechanism == "dispatch"``). What it cannot see: kernel names (unless
the device's assert text names one), launches that do not go through
PyTorch's dispatcher (Triton, CuPy, raw driver, the kernels torch.compile
generates), and other threads. A warning says so, once.

Without PyTorch imported there is nothing to fall back to: entering raises
ToolConflictError naming the holder.

Also here: a profiler started while a scope holds CUPTI. Kineto would get no
GPU events, and never again in this process; the wrapper around
torch.autograd.profiler's _prepare_profiler/_enable_profiler (installed while
torch is imported and a scope is open) hands CUPTI over first
(csrc/hooks/scopes.c: cd_scopes_hand_over), and the wrapper around its
_disable_profiler asks for it back when the profiler stops (cd_scopes_take_back;
PyTorch 2.11's Kineto keeps it, so the launch hooks go on recording PyTorch's launches):
a torch.profiler window, with or without a schedule, is a gap in the watch's
coverage, not its end. Meanwhile an open watch() keeps recording PyTorch's
own launches through the launch hooks (they need no CUPTI), and a report of a
fault says what was not covered and since which line; open launch_blocking()
scopes stop synchronising until CUPTI is back. A watch() opened while a
profiler holds CUPTI opens the same way (watch_without_cupti).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import sys
import threading
import warnings
from typing import Optional

from . import _core, _locations, _sticky, _torch_ops

_local = threading.local()
_faults = []                    # (thread id, record dict): dispatch-level faults
_lock = threading.Lock()
_warned_fallback = False


def _after_fork_in_child():
    """A forked child: a free lock, none of the parent's faults."""
    global _lock
    _lock = threading.Lock()
    del _faults[:]


os.register_at_fork(after_in_child=_after_fork_in_child)
_hand_over_where = None          # "file:line" where a profiler took CUPTI from open scopes
_mode_cls = None


def available() -> bool:
    """Can the fallback serve? (PyTorch imported, with CUDA.)"""
    torch = sys.modules.get("torch")
    return torch is not None and hasattr(torch, "cuda") and hasattr(torch, "utils")


def _mode_class():
    global _mode_cls
    if _mode_cls is not None:
        return _mode_cls
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class SyncEveryOp(TorchDispatchMode):
        """Waits for the device after every ATen op; records the op that faulted."""

        @classmethod
        def ignore_compile_internals(cls):
            # torch.compile keeps compiling inside the scope (a mode without
            # this makes Dynamo run the function eagerly, or fail fullgraph).
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            try:
                out = func(*args, **kwargs)
                # not inside launch_blocking(False) (a C scope: no CUPTI needed)
                if _core.thread_state() >= 0 and torch.cuda.is_initialized():
                    torch.cuda.synchronize()
            except BaseException as e:
                # The caller's frame; none in an autograd thread running a C++ backward.
                _record(func, args, kwargs, e, sys._getframe().f_back)
                raise
            return out

    _mode_cls = SyncEveryOp
    return _mode_cls


def _record(func, args, kwargs, exc, frame) -> None:
    code = _sticky.sticky_code(exc)
    if code is None:
        return
    tid = threading.get_native_id()
    with _lock:
        if any(t == tid and not r["claimed"] for t, r in _faults):
            return                   # the op that faulted first is the one to report
    pairs = [(_torch_ops.arg_name(func, i), a) for i, a in enumerate(args)]
    pairs += list(kwargs.items())
    rec = {"code": code, "op": _torch_ops.schema_name(func), "inputs": _torch_ops.metas(pairs),
           "stack": _locations.stack_from(frame=frame) if frame else None,   # outermost first
           "device_message": _core.recent_asserts().decode("utf-8", "replace") or None,
           "thread": "%s (tid %d)" % (threading.current_thread().name, tid),
           "claimed": False}
    with _lock:
        _faults.append((tid, rec))
        del _faults[:-32]


def take(thread_id: Optional[int] = None) -> Optional[dict]:
    """This thread's unreported dispatch-level fault (else any thread's), once."""
    tid = threading.get_native_id() if thread_id is None else thread_id
    with _lock:
        pending = [(t, r) for t, r in _faults if not r["claimed"]]
        mine = [r for t, r in pending if t == tid]
        rec = mine[0] if mine else (pending[0][1] if pending else None)
        if rec is not None:
            rec["claimed"] = True
        return rec


class DispatchScope:
    """The scope handle when CUPTI is held elsewhere: the mode on this thread
    (nested scopes share the outermost one's: one sync per op)."""

    mechanism = "dispatch"

    def __init__(self):
        self.fault_mark = _core.fault_seq()
        self.watch_mark = _core.watch_seq()
        self._hold = _torch_ops.ThreadMode(_mode_class(), _local)

    def close(self):
        if self._hold is not None:
            self._hold.close()
            self._hold = None


def thread_blocking() -> bool:
    """Is a dispatch-level scope open in this thread?"""
    return getattr(_local, "depth", 0) > 0


def open_fallback(what: str, holder: Optional[str]) -> DispatchScope:
    """Enter the dispatch fallback; warn once per process, saying why and what is lost."""
    global _warned_fallback
    _core.install_tee()                # the device's assert text, as in CUPTI scopes
    if not _warned_fallback:
        _warned_fallback = True
        who = holder or "another CUPTI client (torch.profiler keeps CUPTI for the rest of " \
                        "the process once it ran)"
        if _hand_over_where:
            who = "torch.profiler, started at %s inside a scope" % _hand_over_where
        warnings.warn(
            "cuda_debug: %s cannot take CUPTI, held by %s. For PyTorch it synchronises "
            "after every op instead (exc.mechanism == 'dispatch'), in this thread and its "
            "autograd threads: a fault raises at the op, with its name and input shapes. Not "
            "covered: kernel names (unless the device's assert names one), launches outside "
            "PyTorch's dispatcher (Triton, CuPy, raw driver, torch.compile's kernels) and "
            "other threads. To get all of it back, restart the process without the profiler."
            % (what, who), RuntimeWarning, stacklevel=4)
    return DispatchScope()


# -- a profiler started while scopes hold CUPTI --------------------------------

_installed = False
_warned_hand_over = False


def install_profiler_guard() -> None:
    """Wrap torch.autograd.profiler's entry points into Kineto (once, when a
    scope takes CUPTI with torch imported)."""
    global _installed
    if _installed:
        return
    prof = sys.modules.get("torch.autograd.profiler")
    if prof is None:
        return
    _installed = True
    for name in ("_prepare_profiler", "_enable_profiler", "_disable_profiler"):
        orig = getattr(prof, name, None)
        if orig is None or getattr(orig, "_cuda_debug_guard", False):
            continue
        setattr(prof, name, _guarded(orig, stop=name == "_disable_profiler"))


def _guarded(orig, stop: bool = False):
    if stop:
        def guard(*args, **kwargs):
            try:
                return orig(*args, **kwargs)
            finally:
                take_back()              # Kineto gave CUPTI up as it stopped
    else:
        def guard(*args, **kwargs):
            hand_over()
            return orig(*args, **kwargs)
    guard._cuda_debug_guard = True
    guard.__wrapped__ = orig
    guard.__name__ = getattr(orig, "__name__", "profiler_entry")
    return guard


def _caller_where() -> Optional[str]:
    f = sys._getframe(2)
    while f is not None:
        if _locations.is_user_file(f.f_code.co_filename):
            return "%s:%d" % (f.f_code.co_filename, f.f_lineno)
        f = f.f_back
    return None


def where_of(frame) -> str:
    """"file:line" of a frame (a scope's entry), "" for None: cheap (no walk)."""
    if frame is None:
        return ""
    return "%s:%d" % (frame.f_code.co_filename, frame.f_lineno or 0)


def _where_bytes(where: Optional[str]) -> bytes:
    return (where or "").encode("utf-8", "surrogateescape")


def hand_over() -> bool:
    """Give CUPTI to a profiler that is starting; warn once. True if it was held."""
    global _warned_hand_over, _hand_over_where
    where = _caller_where() or "?"
    if not _core.cupti_hand_over(_where_bytes(where)):
        return False
    _hand_over_where = where
    if not _warned_hand_over:
        _warned_hand_over = True
        hooks = _core.stats()["launch_hooks"]
        kept = ("watch() keeps recording PyTorch's own launches (the launch hooks need no "
                "CUPTI), not those of Triton, cuBLAS/cuDNN, CuPy or other callers of the driver"
                if hooks["recording"] else "watch() records no launch")
        warnings.warn(
            "cuda_debug: torch.profiler started at %s while launch_blocking()/watch() held "
            "CUPTI (one client per process). CUPTI was handed to the profiler, so it records "
            "GPU events; cuda_debug asks for it back when the profiler stops (PyTorch's profiler "
            "keeps it for the rest of the process). Until then %s, and "
            "open launch_blocking() scopes do not synchronise. A fault meanwhile is reported "
            "with what was not covered." % (_hand_over_where, kept),
            RuntimeWarning, stacklevel=3)
    return True


_warned_held = False


def take_back() -> int:
    """The profiler stopped: CUPTI back for the open scopes and watches.
    1 taken back, 0 nothing to take, < 0 still held (-CUptiResult). PyTorch
    2.11's Kineto keeps CUPTI after it stops, with TEARDOWN_CUPTI=1 too
    (benchmarks/RESULTS.md, "Kineto and CUPTI"): then the watch goes on with the
    launch hooks alone, and a later watch() entry takes CUPTI if it is free by then."""
    status, _holder = _core.cupti_take_back(_where_bytes(_caller_where() or "?"))
    return status


def watch_without_cupti(where: str) -> None:
    """A watch() opened while another client (a profiler) holds CUPTI: say once
    what it covers until CUPTI is free (the profiler's stop takes it)."""
    global _warned_held
    if _warned_held:
        return
    _warned_held = True
    hooks = _core.stats()["launch_hooks"]
    kept = ("PyTorch's own launches are recorded (the launch hooks need no CUPTI); those of "
            "Triton, cuBLAS/cuDNN, CuPy and other callers of the driver are not"
            if hooks["recording"] else "no launch is recorded (%s)" % (hooks["why_off"] or "the "
                                                                       "launch hooks are off"))
    warnings.warn(
        "cuda_debug: watch() opened at %s while another tool (a profiler) holds CUPTI, "
        "which serves one client: %s until it is free; cuda_debug asks for it when a "
        "torch.profiler stops, or at the next watch() entry. A fault meanwhile is reported "
        "with what was not covered." % (where or "?", kept), RuntimeWarning, stacklevel=4)
