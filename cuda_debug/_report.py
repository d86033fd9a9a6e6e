"""Turn a raw fault record from the C core into a cuda_debug exception.

Capture is cheap at the event (the callback copies a few numbers and the
driver's text, without the GIL); everything Python-shaped is built here, only
when a fault is reported: the demangled kernel name, the launching thread's
stack, the innermost frame of *user* code, the driver-log lines.

The launching Python line comes from the traceback of the framework's own
exception: the launch call fails at the launching line (the callback rewrites
its return value), so that traceback ends exactly there.
"""
import os
import site
import sys
import sysconfig
import threading
import traceback
from typing import List, NamedTuple, Optional

from . import _core, _cuda_errors
from ._errors import CudaError, class_for

_LAUNCH_APIS = {
    307: "cuLaunchKernel", 442: "cuLaunchKernel_ptsz",
    652: "cuLaunchKernelEx", 653: "cuLaunchKernelEx_ptsz",
    477: "cuLaunchCooperativeKernel", 478: "cuLaunchCooperativeKernel_ptsz",
    514: "cuGraphLaunch", 515: "cuGraphLaunch_ptsz",
}


class RawFault(NamedTuple):
    """The C record, named (csrc/cuda_debug.h: cd_fault)."""
    seq: int
    code: int
    at_launch: int
    cbid: int
    kernel: bytes
    grid: tuple
    block: tuple
    shared_mem: int
    stream: int
    device: int
    thread_id: int
    thread_name: str
    wall_time: float
    device_message: bytes
    log_end: int


def raw_fault() -> Optional[RawFault]:
    r = _core.fault()
    return RawFault(*r) if r is not None else None


# -- which frames are the user's ------------------------------------------------

def _library_prefixes() -> List[str]:
    paths = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            paths.add(os.path.realpath(p))
    try:
        paths.update(os.path.realpath(p) for p in site.getsitepackages())
    except AttributeError:
        pass
    paths.add(os.path.realpath(os.path.dirname(__file__)))   # cuda_debug itself
    return sorted(paths, key=len, reverse=True)


_PREFIXES = None


def is_user_file(filename: str) -> bool:
    """False for the standard library, site-packages (torch, triton, cupy...),
    cuda_debug itself and pseudo-files such as ``<frozen ...>``."""
    global _PREFIXES
    if not filename:
        return False
    if filename.startswith("<"):   # interactive code is the user's; <frozen ...> is not
        return filename in ("<stdin>", "<string>") or filename.startswith("<ipython")
    if "site-packages" in filename or "dist-packages" in filename:
        return False
    # Cython modules report relative paths (cupy_backends/cuda/api/driver.pyx);
    # scripts run by Python always have absolute ones.
    if filename.endswith((".pyx", ".pxd", ".pxi")) or not os.path.isabs(filename):
        return False
    if _PREFIXES is None:
        _PREFIXES = _library_prefixes()
    real = os.path.realpath(filename)
    return not any(real == p or real.startswith(p + os.sep) for p in _PREFIXES)


def stack_from(tb=None, frame=None) -> traceback.StackSummary:
    """The launching thread's stack, outermost first: the frames above the
    traceback's first frame, then the traceback down to where it was raised.
    Without a traceback: the stack of `frame`."""
    pairs = []
    if tb is not None:
        outer = list(traceback.walk_stack(tb.tb_frame.f_back))
        pairs = outer[::-1] + list(traceback.walk_tb(tb))
    elif frame is not None:
        pairs = list(traceback.walk_stack(frame))[::-1]
    return traceback.StackSummary.extract(pairs, lookup_lines=True)


def user_frame(stack: traceback.StackSummary):
    """The innermost frame of user code (the last one if all are library)."""
    for fs in reversed(stack):
        if is_user_file(fs.filename):
            return fs
    return stack[-1] if len(stack) else None


# -- building the exception -----------------------------------------------------

def _text(b: bytes) -> str:
    return b.decode("utf-8", "replace")


def build(raw: Optional[RawFault], *, code: Optional[int] = None, tb=None, frame=None,
          found_at: str = "launch") -> CudaError:
    """A cuda_debug exception for `raw` (or just `code` when no record is known),
    located by the traceback `tb` or, failing that, by the stack of `frame`."""
    if raw is not None:
        code = raw.code
    stack = stack_from(tb=tb, frame=frame) if (tb is not None or frame is not None) else None
    user = user_frame(stack) if stack else None
    fields = dict(found_at=found_at)
    if stack is not None:
        fields["launch_stack"] = stack
    if user is not None:
        fields.update(filename=user.filename, lineno=user.lineno, function=user.name,
                      line=user.line)
    if raw is not None:
        mangled = _text(raw.kernel)
        fields.update(
            kernel=(_core.demangle(mangled) or mangled) if mangled else None,
            kernel_mangled=mangled,
            grid=raw.grid, block=raw.block, shared_mem=raw.shared_mem,
            stream=raw.stream, device=raw.device if raw.device >= 0 else None,
            device_message=_text(raw.device_message) or None,
            thread="%s (tid %d)" % (raw.thread_name, raw.thread_id),
            launch_api=_LAUNCH_APIS.get(raw.cbid),
            launch_refused=bool(raw.at_launch),
            driver_log=[_text(b).rstrip() for b in
                        _core.driver_log(_previous_log_end(raw), raw.log_end)] or None,
        )
    cls = class_for(code, at_launch=bool(raw.at_launch) if raw is not None else False)
    return cls(code=code, **fields)


_log_marks = {}   # fault seq -> log_end, to cut the driver log between faults


def _previous_log_end(raw: RawFault) -> int:
    prev = max((v for k, v in _log_marks.items() if k < raw.seq), default=0)
    _log_marks[raw.seq] = raw.log_end
    return max(prev, raw.log_end - 16)


# -- bookkeeping: which faults were already reported ----------------------------

_state_lock = threading.Lock()
_reported_seq = 0
_last_error: Optional[CudaError] = None


def claim(raw: RawFault) -> bool:
    """True the first time a fault is claimed for reporting."""
    global _reported_seq
    with _state_lock:
        if raw.seq <= _reported_seq:
            return False
        _reported_seq = raw.seq
        return True


def remember(err: CudaError) -> CudaError:
    global _last_error
    _last_error = err
    return err


def last_error() -> Optional[CudaError]:
    """The last fault report, even when the exception that carried it was
    swallowed: the newest of the last raised report and the last record."""
    raw = raw_fault()
    err = _last_error
    if raw is not None and (err is None or _reported_seq < raw.seq):
        err = build(raw, found_at="record")
    return err


def mentions(exc: BaseException, code: int) -> bool:
    """Does a framework exception speak of this CUDA error? (By code, by name, or
    by the runtime's own description, as torch/CuPy/Triton word it.)"""
    if any(getattr(exc, a, None) == code for a in ("code", "status", "error_code")):
        return True
    text = "%s %s" % (type(exc).__name__, exc)
    name = _cuda_errors.name(code)
    words = [name, "cudaError" + name[len("CUDA_ERROR_"):].title().replace("_", "")]
    driver_text = _core.error_string(code)
    if driver_text:
        words.append(driver_text)
    if code >= 100:
        words.append(str(code))
    return any(w in text for w in words)


def current_frame(depth: int = 1):
    return sys._getframe(depth + 1)
