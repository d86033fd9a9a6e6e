"""The cuda_debug exception hierarchy.

::

    CudaError(RuntimeError)             .code .name .description .sticky
      CudaUnavailableError              no driver / no GPU / library missing
      ToolConflictError                 CUPTI held by another tool
      LaunchError                       the launch was refused; the context is fine
      StickyCudaError                   the context is dead: restart the process
        DeviceAssertError        710
        IllegalAddressError      700
        LaunchFailureError       719
        MisalignedAddressError   716
        IllegalInstructionError  715
        InvalidAddressSpaceError 717
        InvalidPcError           718
        HardwareStackError       714
        LaunchTimeoutError       702

Every error carries the report fields (``kernel``, ``grid``, ``block``, ``filename``,
``lineno``, ``device_message`` ...), None where unknown. ``str(exc)`` is the short
report; errors pickle (pytest-xdist, multiprocessing).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import re
import traceback
from typing import Any, Dict, List, Optional, Tuple

from . import _cuda_errors

REPORT_FIELDS = (
    "kernel", "kernel_mangled", "grid", "block", "shared_mem", "stream", "device",
    "filename", "lineno", "function", "line", "launch_stack", "device_message",
    "driver_log", "op", "inputs", "thread", "launch_api", "found_at", "launch_refused",
    "device_message_cut", "consequences", "before_scope", "mechanism", "exact", "candidates",
    "recent_launches", "surfaced_at", "provenance", "op_stack", "later_exception",
    "compiled_function", "graph_node", "captured_at", "replayed_at", "graph_note", "met_by",
    "markers_every", "candidate_count", "named_by_device", "graph_annotation", "recorded_at",
    # the launch's number as watch() counted it, and the command that replays it
    "launch_seq", "replay_command",
    # watch(): the likeliest culprit where several may be (then .kernel is None); what the
    # watch did not see; the recorded launches the device's text rules out; why the
    # culprit's launch was not recorded; whether user and JIT kernels were put first
    "likely_kernel", "not_covered", "ruled_out", "not_recorded", "likeliest_first",
    # cuda-debug replay: the bad access and the memory it missed
    "address", "access", "access_size", "fault_thread", "fault_block", "allocation",
    "access_text", "bad_accesses", "replay",
    # cuda-debug replay: where in the kernel (file, line, source, inline chain, or the
    # function, offset and instruction with how to get a line): _kernel_lines.KernelLine
    "kernel_line",
)

RESTART = ("The CUDA context is now unusable: restart the process "
           "(in a notebook, restart the kernel).")


#: the error kinds by CUresult, filled by the classes' own statements (below)
BY_CODE: Dict[int, "type[CudaError]"] = {}


class CudaError(RuntimeError):
    """A CUDA error, translated. Base of every cuda_debug error."""

    def __init_subclass__(cls, code: Optional[int] = None, what: Optional[str] = None,
                          **kwargs: Any) -> None:
        """One statement per error kind says it all: ``class
        DeviceAssertError(StickyCudaError, code=710, what="device-side assert")``
        is the class of CUresult 710 (BY_CODE, class_for), "device-side assert"
        in its report, and ``cuda_debug.DeviceAssertError`` by name."""
        super().__init_subclass__(**kwargs)
        cls.__module__ = "cuda_debug"
        if what is not None:
            cls.what = what
        if code is not None:
            BY_CODE[code] = cls

    #: what happened, in a few words; subclasses refine it
    what: Optional[str] = None

    #: the CUresult (700, 710, ...), its name (CUDA_ERROR_ASSERT), the driver's
    #: description of it, and whether it killed the CUDA context
    code: Optional[int]
    name: Optional[str]
    description: Optional[str]
    sticky: bool
    #: the text given to the constructor (None: the short report), and the
    #: constructor's other keywords (missing=, tried=, holder=)
    message: Optional[str]
    extra: Dict[str, Any]

    # The report fields (REPORT_FIELDS), None where unknown: declared for type
    # checkers and IDEs (__init__ sets them all).
    kernel_line: Optional[Dict[str, Any]]
    kernel: Optional[str]
    kernel_mangled: Optional[str]
    grid: Optional[Tuple[int, int, int]]
    block: Optional[Tuple[int, int, int]]
    shared_mem: Optional[int]
    stream: Optional[int]
    device: Optional[int]
    filename: Optional[str]
    lineno: Optional[int]
    function: Optional[str]
    line: Optional[str]
    launch_stack: Optional[traceback.StackSummary]
    device_message: Optional[str]
    driver_log: Optional[List[str]]
    op: Optional[str]
    inputs: Optional[List[Dict[str, Any]]]
    thread: Optional[str]
    launch_api: Optional[str]
    found_at: Optional[str]
    launch_refused: Optional[bool]
    device_message_cut: Optional[int]
    consequences: Optional[int]
    before_scope: Optional[bool]
    mechanism: Optional[str]
    exact: Optional[bool]
    candidates: Optional[List[Any]]
    recent_launches: Optional[List[Any]]
    surfaced_at: Optional[str]
    provenance: Optional[str]
    op_stack: Optional[List[str]]
    later_exception: Optional[str]
    compiled_function: Optional[str]
    graph_node: Optional[int]
    captured_at: Optional[str]
    replayed_at: Optional[str]
    graph_note: Optional[str]
    met_by: Optional[str]          # another thread's fault: where this thread met it
    markers_every: Optional[int]
    candidate_count: Optional[int]
    named_by_device: Optional[bool]
    graph_annotation: Optional[Dict[str, Any]]   # torch.cuda.graph_annotations' tag of the node
    recorded_at: Optional[str]     # a node torch.compile captured: the call that recorded it
    launch_seq: Optional[int]
    replay_command: Optional[str]
    likely_kernel: Optional[str]
    not_covered: Optional[List[str]]
    ruled_out: Optional[List[Any]]
    not_recorded: Optional[List[str]]
    likeliest_first: Optional[bool]
    address: Optional[int]
    access: Optional[str]
    access_size: Optional[int]
    fault_thread: Optional[Tuple[int, int, int]]
    fault_block: Optional[Tuple[int, int, int]]
    allocation: Optional[Any]
    access_text: Optional[str]
    bad_accesses: Optional[List[Dict[str, Any]]]
    replay: Optional[Dict[str, Any]]

    def __init__(self, message: Optional[str] = None, *, code: Optional[int] = None,
                 **fields: Any):
        self.code = code
        self.name = _cuda_errors.name(code) if code is not None else None
        self.description = _cuda_errors.description(code) if code is not None else None
        self.sticky = _cuda_errors.is_sticky(code) if code is not None else False
        for f in REPORT_FIELDS:
            setattr(self, f, fields.pop(f, None))
        self.extra = fields            # anything else (missing=, tried=, holder=)
        self.message = message
        super().__init__(message if message is not None else format_report(self))

    def __str__(self) -> str:
        if self.message is not None:
            return self.message
        return format_report(self)

    # -- pickling -------------------------------------------------------------
    def __reduce__(self) -> Tuple[Any, ...]:
        state = {f: getattr(self, f, None) for f in REPORT_FIELDS}
        if state["launch_stack"] is not None:
            state["launch_stack"] = [tuple(fs[:4]) if isinstance(fs, tuple) else
                                     (fs.filename, fs.lineno, fs.name, fs.line)
                                     for fs in state["launch_stack"]]
        state.update(self.extra)
        return (_rebuild, (type(self), self.message, self.code, state))


def _rebuild(cls: "type[CudaError]", message: Optional[str], code: Optional[int],
             state: Dict[str, Any]) -> "CudaError":
    stack = state.get("launch_stack")
    if stack is not None:
        state["launch_stack"] = traceback.StackSummary.from_list(stack)
    return cls(message, code=code, **state)


class CudaUnavailableError(CudaError):
    """No driver, no GPU, or a library (CUPTI, cuBLAS) missing: the message says which."""

    @property
    def missing(self) -> Optional[str]:
        """What is missing: "driver", "gpu", "cupti", "cublas" (None: not said)."""
        return self.extra.get("missing")


class ToolConflictError(CudaError):
    """CUPTI is held by another tool (a profiler, Nsight, cuda-gdb)."""

    @property
    def holder(self) -> Optional[str]:
        """The tool holding CUPTI, when CUPTI names it."""
        return self.extra.get("holder")


class LaunchError(CudaError, what="launch refused"):
    """The launch was refused (bad configuration, too many resources); the
    context is still usable."""


class StickyCudaError(CudaError, what="kernel fault"):
    """A kernel fault that killed the CUDA context: the process must restart."""


class DeviceAssertError(StickyCudaError, code=710, what="device-side assert"):
    """A kernel's ``assert`` failed (CUDA_ERROR_ASSERT): PyTorch's index and label
    checks, ``tl.device_assert``, your own."""


class IllegalAddressError(StickyCudaError, code=700, what="illegal memory access"):
    """A load or store outside the memory the kernel may touch
    (CUDA_ERROR_ILLEGAL_ADDRESS): ``cuda-debug replay`` names the thread and
    the address."""


class LaunchFailureError(StickyCudaError, code=719,
                         what="kernel failure (trap or unspecified launch failure)"):
    """A trap, or the driver's unspecified launch failure (CUDA_ERROR_LAUNCH_FAILED)."""


class MisalignedAddressError(StickyCudaError, code=716, what="misaligned address"):
    """An access not aligned to its size (CUDA_ERROR_MISALIGNED_ADDRESS)."""


class IllegalInstructionError(StickyCudaError, code=715, what="illegal instruction"):
    """The kernel ran an illegal instruction (CUDA_ERROR_ILLEGAL_INSTRUCTION)."""


class InvalidAddressSpaceError(StickyCudaError, code=717, what="invalid address space"):
    """An instruction used memory of the wrong address space
    (CUDA_ERROR_INVALID_ADDRESS_SPACE)."""


class InvalidPcError(StickyCudaError, code=718, what="invalid program counter"):
    """The program counter left the kernel's code (CUDA_ERROR_INVALID_PC)."""


class HardwareStackError(StickyCudaError, code=714, what="hardware stack error"):
    """The device's call stack overflowed or was corrupted (CUDA_ERROR_HARDWARE_STACK_ERROR)."""


class LaunchTimeoutError(StickyCudaError, code=702, what="kernel timed out"):
    """The kernel ran past the display watchdog's limit (CUDA_ERROR_LAUNCH_TIMEOUT)."""


__all__ = ["CudaError", "CudaUnavailableError", "ToolConflictError", "LaunchError",
           "StickyCudaError"] + sorted(c.__name__ for c in BY_CODE.values())
CudaError.__module__ = "cuda_debug"


def class_for(code: int, at_launch: bool = False) -> type:
    """The exception class for a CUresult."""
    if code in BY_CODE:
        return BY_CODE[code]
    if _cuda_errors.is_sticky(code):
        return StickyCudaError
    if at_launch:
        return LaunchError
    return CudaError


# -- the short report ----------------------------------------------------------

def short_kernel_name(name: Optional[str]) -> Optional[str]:
    """``void at::native::(anonymous namespace)::k<float, long>(float*, long)`` ->
    ``k<float, long>``: no return type, namespaces or parameter list; long
    template arguments abbreviated (``index_elementwise_kernel<128, 4, …>``).
    The rule lives in C (csrc/base/demangle.c), shared with the fault-time report."""
    if not name:
        return name
    from . import _core
    return _core.short_kernel_name(name) or name


_ASSERT_LINE = re.compile(
    r"^(?P<file>.*?):(?P<line>\d+): (?P<func>.*?): block: \[(?P<block>[^\]]*)\], "
    r"thread: \[(?P<thread>[^\]]*)\] (?P<text>Assertion .*)$")


def parse_device_message(text: Optional[str]) -> List[Dict[str, str]]:
    """The assert lines the driver printed, as dicts (file, line, func, block,
    thread, text); lines that are not asserts are left out."""
    out = []
    for line in (text or "").splitlines():
        m = _ASSERT_LINE.match(line.strip())
        if m:
            out.append(m.groupdict())
    return out


def _where(err: "CudaError | GuardError") -> Optional[str]:
    if not err.filename:
        return None
    s = "at %s:%s" % (err.filename, err.lineno)
    if err.function:
        s += " in %s" % err.function
    if err.line:
        s += ":  %s" % err.line.strip()
    return s


def _device_line(err: CudaError) -> Optional[str]:
    asserts = parse_device_message(err.device_message)
    if asserts:
        a = asserts[0]
        s = "device: %s:%s block [%s] thread [%s]: %s" % (
            a["file"].rsplit("/", 1)[-1], a["line"], a["block"].replace(" ", ""),
            a["thread"].replace(" ", ""), a["text"])
        if len(asserts) > 1:
            s += " (+%d more thread%s)" % (len(asserts) - 1, "s" if len(asserts) > 2 else "")
        if err.device_message_cut:
            s += " [%d more bytes of device output cut; all of it went to stderr]" \
                 % err.device_message_cut
        return s
    if err.device_message and err.device_message.strip():
        return "device: " + err.device_message.strip().splitlines()[0]
    return None


def _op_line(err: CudaError) -> Optional[str]:
    """``op aten::embedding(weight: float32[10, 4], input: int64[2] on cuda:0) >
    aten::index_select``: the PyTorch op the launching call entered, its tensor
    inputs, then the ops it called down to the faulting kernel."""
    if not err.op:
        return None
    from ._torch_ops import format_inputs
    s = "op " + err.op
    if err.inputs:
        s += "(%s)" % format_inputs(err.inputs)
    inner = list(err.op_stack or [])[1:]
    if inner:
        s += " > " + " > ".join(inner)
    return s


def annotation_text(tag: Dict[str, Any]) -> str:
    """"marked 'attention' {layer=3}" for a torch.cuda.graph_annotations tag."""
    name = tag.get("name")
    rest = ", ".join("%s=%r" % (k, v) for k, v in sorted(tag.items(), key=lambda kv: str(kv[0]))
                     if k != "name")
    return " ".join(["marked"] + (["%r" % (name,)] if name is not None else []) +
                    (["{%s}" % rest] if rest else []))


def _candidate_lines(err: CudaError, count: int, shown: int = 4) -> List[str]:
    """The other candidates of an inexact watch culprit, one line each, and what
    would name the launch."""
    out = []
    for c in (err.candidates or [])[:shown]:
        name = short_kernel_name(c.get("kernel")) if c.get("kernel") else "?"
        at = "%s:%s in %s" % (c.get("filename"), c.get("lineno"), c.get("function")) \
            if c.get("filename") else "line unknown"
        out.append("  or %s launched at %s" % (name, at))
    if count - 1 > shown:
        out.append("  ... and %d more" % (count - 1 - shown))
    every = err.markers_every or 1
    if every > 1:
        out.append("  (the always-on watch() puts a completion marker behind every %dth launch "
                   "of a stream and names the launch when the device names the kernel; "
                   "watch(exact=True) names every launch)" % every)
    return out


def format_report(err: CudaError) -> str:
    """The short report: what happened and where, then the device's words, then
    whether the context survived."""
    what = err.what or (err.name or "CUDA error")
    kernel = short_kernel_name(err.kernel) if err.kernel else None
    if err.before_scope:
        head = "%s before this scope: a kernel launched before it was entered faulted " \
               "(found by the drain at the scope's entry)" % what
    elif err.launch_refused and err.sticky:
        # The launch was refused because the context had died already: the fault
        # is an earlier kernel's, launched outside any scope.
        head = "%s in an earlier kernel (launched outside launch_blocking(); the CUDA " \
               "context was already dead when %s was launched)" % (what, kernel or "this kernel")
    elif err.graph_node is not None:
        head = "%s in %s, node %d of a CUDA graph" % (what, kernel or "a kernel", err.graph_node)
        if err.graph_annotation:
            head += " (%s)" % annotation_text(err.graph_annotation)
    elif (err.launch_api or "").startswith("cuGraphLaunch"):
        head = "%s in a CUDA graph replay" % what
        if err.graph_note:
            head += " (%s)" % err.graph_note
    elif kernel and err.not_recorded:
        head = "%s in %s (the device's assert text names it; its launch was not recorded)" \
            % (what, kernel)
    elif kernel:
        head = "%s in %s" % (what, kernel)
    elif err.mechanism == "watch" and err.likely_kernel:
        count = max(err.candidate_count or 0, 1 + len(err.candidates or []))
        head = "%s in one of %d launches, the likeliest %s" % (
            what, count, short_kernel_name(err.likely_kernel))
    elif err.op:
        head = "%s in a kernel of %s" % (what, err.op)
    elif err.found_at == "check":
        head = "%s (kernel unknown: it ran outside cuda_debug.launch_blocking() and " \
               "cuda_debug.watch(); run it inside one to name the kernel and the line)" % what
    else:
        head = what
    lines = [head]
    op = _op_line(err)
    if op:
        lines.append("  " + op)
    if isinstance(err, LaunchError) or not isinstance(err, StickyCudaError):
        lines[0] += ": %s (%s)" % (err.name, err.description) if err.code is not None else ""
        if err.grid is not None and err.block is not None:
            lines.append("  grid %s block %s shared %s bytes" % (
                list(err.grid), list(err.block), err.shared_mem))
    where = _where(err)
    if where:
        if err.mechanism == "watch":
            graph = err.graph_node is not None
            replay = not graph and (err.launch_api or "").startswith("cuGraphLaunch")
            where = where.replace("at ", "captured at " if graph else
                                  "replayed at " if replay else "launched at ", 1)
            if graph and err.captured_at and "source line unknown" in err.captured_at:
                where += "  (source line unknown: torch.compile generated the kernel)"
            elif graph and err.recorded_at:
                where += "  (Inductor fused this line into the kernel; torch.compile " \
                         "recorded the graph in the call at %s)" % err.recorded_at
            others = []
            if err.exact is False and err.candidates:
                count = max(err.candidate_count or 0, 1 + len(err.candidates))
                if graph and err.graph_note:
                    where += "  (%s: see .candidates)" % err.graph_note
                elif graph:
                    where += "  (one of %d unfinished nodes or launches (a graph captured on " \
                             "several streams): see .candidates)" % count
                else:
                    where += "  (one of %d launches not known to have finished: see " \
                             ".candidates)" % count
                    others = _candidate_lines(err, count)
                    if err.likeliest_first:
                        others.append("  (user and JIT kernels first: Triton's, CuPy's, "
                                      "extensions', the driver's callers' fault more often than "
                                      "PyTorch's and the vendor libraries' own)")
            elif err.exact is False and graph and err.graph_note:
                where += "  (not exact: %s)" % err.graph_note
            elif err.exact is False:
                where += "  (a guess: no completion marker is missing; the first launch not " \
                         "known to have finished)"
        elif err.mechanism == "replay":
            where = where.replace("at ", "launched at ", 1)
        lines.append("  " + where)
        if err.mechanism == "watch":
            lines.extend(others)
    if err.not_recorded:
        lines.extend("  not recorded: " + why for why in err.not_recorded)
        if err.ruled_out:
            lines.append("  ruled out by the device's text: %s" % ", ".join(
                "%s at %s:%s" % (short_kernel_name(c.get("kernel")) if c.get("kernel") else "?",
                                 c.get("filename"), c.get("lineno"))
                for c in err.ruled_out[:3]) + (" and %d more" % (len(err.ruled_out) - 3)
                                                if len(err.ruled_out) > 3 else ""))
    elif err.not_covered:
        lines.extend("  not covered: " + why for why in err.not_covered)
    if err.graph_node is not None and err.replayed_at:
        lines.append("  replayed at %s" % err.replayed_at)
    if err.met_by:
        lines.append("  met by %s: the fault is the kernel above, launched by %s" % (
            err.met_by, "thread %s" % err.thread if err.thread else "another thread"))
    if err.mechanism == "watch" and err.surfaced_at:
        lines.append("  surfaced at %s (kernels run asynchronously; watch() named the launch)"
                     % err.surfaced_at)
    if err.later_exception:
        lines.append("  later: %s, while handling this fault: a consequence, not the cause"
                     % err.later_exception)
    if err.provenance:
        lines.append("  torch.compile: " + err.provenance)
    dev = _device_line(err)
    if dev:
        lines.append("  " + dev)
    if err.mechanism == "replay":
        from ._replay_memory import report_lines
        lines += ["  " + line for line in report_lines(err)]
        return "\n".join(lines)
    if err.consequences:
        lines.append("  (%d later launch%s failed on the dead context: consequences, not causes)"
                     % (err.consequences, "" if err.consequences == 1 else "es"))
    if err.replay_command:
        lines.append("  to find the thread, the address and the tensor: " + err.replay_command)
    if err.sticky:
        lines.append("  " + RESTART)
    elif isinstance(err, LaunchError):
        lines.append("  The CUDA context is still usable.")
    return "\n".join(lines)


# -- guard(): the checks that run before a kernel could assert ------------------

GUARD_FIELDS = ("op", "argument", "values", "positions", "count", "numel", "valid", "rule",
                "shapes", "filename", "lineno", "function", "line")

GUARD_TAIL = ("Checked by cuda_debug.guard() before launching: nothing ran, the CUDA "
              "context is still usable.")


class GuardError(Exception):
    """An input that would have made a kernel fault (a device-side assert),
    found by ``cuda_debug.guard()`` before the launch: nothing ran and the CUDA
    context is still usable. Also an ``IndexError`` (GuardIndexError) or a
    ``ValueError`` (GuardValueError), as Python would raise.

    ``op``, ``argument``: the op and its offending argument; ``values`` and
    ``positions``: up to 5 offending values and where they are in ``argument``;
    ``count`` of them in all, out of ``numel``; ``valid``: the valid range;
    ``shapes``: the op's tensors (name, shape, dtype, device);
    ``filename``/``lineno``/``function``/``line``: the user's line."""

    # The fields (GUARD_FIELDS), declared for type checkers and IDEs (__init__ sets
    # them all, None where not given: a GuardError that guard() raises has each one
    # typed so, the shapes and the user's line where known).
    op: str                            # "F.embedding", "Tensor.index_select", "x[idx]"
    argument: str                      # "input", "target", "index"
    values: List[Any]                  # up to 5 offending values (int or float)
    positions: List[Tuple[int, ...]]   # where each is in the argument
    count: int                         # how many offending values in all
    numel: int                         # out of how many
    valid: str                         # the valid range: "[0, 32000)"
    rule: Tuple[str, str]              # (what is counted, the rule): ("value", "outside [0, 10)")
    shapes: Optional[List[Dict[str, Any]]]   # the op's tensors: name, shape, dtype, device
    filename: Optional[str]            # the user's line (innermost frame of user code)
    lineno: Optional[int]
    function: Optional[str]
    line: Optional[str]
    message: Optional[str]

    def __init__(self, message: Optional[str] = None, **fields: Any):
        for f in GUARD_FIELDS:
            setattr(self, f, fields.pop(f, None))
        if fields:
            raise TypeError("GuardError got unknown fields %s" % ", ".join(sorted(fields)))
        self.message = message
        super().__init__(message if message is not None else format_guard(self))

    def __str__(self) -> str:
        return self.message if self.message is not None else format_guard(self)

    def __reduce__(self) -> Tuple[Any, ...]:
        return (_rebuild_guard, (type(self), self.message,
                                 {f: getattr(self, f, None) for f in GUARD_FIELDS}))


def _rebuild_guard(cls: "type[GuardError]", message: Optional[str],
                   fields: Dict[str, Any]) -> "GuardError":
    return cls(message, **fields)


class GuardIndexError(GuardError, IndexError):
    """An index, class label or target outside the range the op accepts."""


class GuardValueError(GuardError, ValueError):
    """A value the op cannot take (a probability outside [0, 1], a negative or
    non-finite sampling weight, offsets that go backwards)."""


for _cls in (GuardError, GuardIndexError, GuardValueError):
    _cls.__module__ = "cuda_debug"

__all__ += ["GuardError", "GuardIndexError", "GuardValueError"]


def _number(v: object) -> str:
    if isinstance(v, float):
        return "%.6g" % v
    return str(v)


def _position(p: Tuple[int, ...]) -> str:
    return "[%s]" % ", ".join(str(i) for i in p)


def format_guard(err: GuardError) -> str:
    """``F.embedding: 2 of 6 values in input are outside [0, 10), the rows of
    weight: 10 at [1], -1 at [4]``, then the tensors, the user's line, and
    that nothing ran."""
    count = err.count or 0
    samples = ", ".join("%s at %s" % (_number(v), _position(p))
                        for v, p in zip(err.values or (), err.positions or ()))
    if count > len(err.values or ()) and samples:
        samples += " (the first %d)" % len(err.values)
    noun_one, noun_many = _NOUNS.get(err.rule[0] if err.rule else None, _NOUNS["value"])
    head = "%s: %d of %s %s in %s %s %s" % (
        err.op or "?", count, err.numel if err.numel is not None else "?",
        noun_one if err.numel == 1 else noun_many, err.argument or "?",
        "is" if count == 1 else "are",
        err.rule[1] if err.rule else "outside %s" % err.valid)
    lines = [head + (": " + samples if samples else "")]
    if err.shapes:
        from ._torch_ops import format_inputs
        lines.append("  " + format_inputs(err.shapes))
    where = _where(err)
    if where:
        lines.append("  " + where)
    lines.append("  " + GUARD_TAIL)
    return "\n".join(lines)


#: what a rule counts -> (singular, plural)
_NOUNS = {"value": ("value", "values"), "row sum": ("row sum", "row sums")}
