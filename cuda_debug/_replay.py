"""``cuda-debug replay``: re-run a program that died of an address fault, and name
the thread, the address and the allocation it missed.

The replay process subscribes NVIDIA's Sanitizer API (libsanitizer-public.so)
before CUDA starts and counts launches as watch() does. Only the culprit's
launch (its number and kernel, from the report) is instrumented: its module
is patched at that launch (csrc/replay), every global access checked against
the memory the kernel may touch, which for PyTorch is each live tensor's
requested bytes (``torch.cuda.memory._snapshot()``, history on: the line that
allocated it), else every allocation the Sanitizer saw. A bad access is
recorded (address, size, read/write, thread, block) and never made: its warp
exits, the launch call fails with 700 at the launching line, as every later
launch does, so the program stops there. The cost before that launch is the
subscription's alone.

The policy is here: where the library is looked for, which launches to
instrument, what to say when the program ran differently. C returns raw
records (csrc/replay/replay.h); _replay_memory turns addresses into words.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import struct
import sys
import time
import traceback
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from . import _core, _replay_memory as _memory

ENV = "CUDA_DEBUG_SANITIZER"
EXTRA = "cuda_debug[replay]"
LIBRARY = "libsanitizer-public.so"
#: Folders of NVIDIA's wheels and toolkits that hold libsanitizer-public.so,
#: relative to a site-packages folder or a toolkit root.
WHEEL_DIRS = ("nvidia/cu13/compute-sanitizer", "nvidia/cu13/lib",
              "nvidia/cuda_sanitizer_api/compute-sanitizer")
TOOLKIT_DIR = "compute-sanitizer"

#: Launches of the culprit's kernel instrumented at most (each costs a
#: snapshot and a slow instrumented run): the first bad access ends the replay.
DEFAULT_MAX_LAUNCHES = 8
#: With a launch number and a kernel: instrument the kernel's launches from
#: this many launches before the number (a launch order shifted a little).
DEFAULT_WINDOW = 0

HINTS = ("To make the run repeatable: seed every generator (torch.manual_seed, "
         "numpy.random.seed, random.seed), torch.use_deterministic_algorithms(True) and "
         "torch.backends.cudnn.benchmark = False, the same inputs in the same order (shuffle=False "
         "or a seeded DataLoader generator, the same batch size and workers), the same GPUs and "
         "world size.")


class ReplayError(Exception):
    """The replay cannot start or go on: the message says why and what to do."""


# -- the library -------------------------------------------------------------------

class Found(NamedTuple):
    path: Optional[str]
    how: str
    tried: List[str]


def _site_dirs() -> List[str]:
    import site
    dirs = []
    try:
        dirs += site.getsitepackages()
    except AttributeError:
        pass
    try:
        dirs.append(site.getusersitepackages())
    except AttributeError:
        pass
    dirs += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    return list(dict.fromkeys(d for d in dirs if d))


def _toolkit_roots():
    """Where a CUDA toolkit may be: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda."""
    return [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]


def find_library() -> Found:
    """Where libsanitizer-public.so is: ``$CUDA_DEBUG_SANITIZER`` (the file or
    its folder), else next to the compute-sanitizer that cuda.pathfinder finds
    (NVIDIA's wheels, conda, $CUDA_PATH/$CUDA_HOME, the toolkit of the CUDA
    runtime), else in the toolkit folders and NVIDIA's wheel folders."""
    tried = []

    def check(path, how):
        tried.append(path)
        return Found(path, how, tried) if os.path.isfile(path) else None

    env = os.environ.get(ENV)
    if env:
        path = os.path.join(env, LIBRARY) if os.path.isdir(env) else env
        hit = check(path, "$" + ENV)
        return hit or Found(None, "", ["$%s=%s (no such file)" % (ENV, env)])
    from . import _libraries
    pf = _libraries.pathfinder()
    if pf is None:
        tried.append("cuda.pathfinder (not installed)")
    else:
        try:
            exe = pf.find_nvidia_binary_utility("compute-sanitizer")
        except Exception as e:          # an unknown utility name in an old pathfinder
            exe = None
            tried.append("cuda.pathfinder: %s" % e)
        if exe:
            d = os.path.dirname(os.path.realpath(exe))
            for sub in (".", os.path.join("..", "lib"), os.path.join("..", TOOLKIT_DIR)):
                hit = check(os.path.normpath(os.path.join(d, sub, LIBRARY)),
                            "next to %s (cuda.pathfinder)" % exe)
                if hit:
                    return hit
        else:
            tried.append("cuda.pathfinder.find_nvidia_binary_utility('compute-sanitizer'): none")
    for root in dict.fromkeys(r for r in _toolkit_roots() if r):
        hit = check(os.path.join(root, TOOLKIT_DIR, LIBRARY), "the CUDA toolkit in %s" % root)
        if hit:
            return hit
    for site_dir in _site_dirs():
        for sub in WHEEL_DIRS:
            hit = check(os.path.join(site_dir, sub, LIBRARY), "NVIDIA's wheel in %s" % site_dir)
            if hit:
                return hit
    return Found(None, "", tried)


def not_found_message(found: Found) -> str:
    return ("NVIDIA's Sanitizer API (%s) was not found, and replay needs it. Install "
            "it with `pip install '%s'` (the nvidia-cuda-sanitizer-api wheel; "
            "nvidia-cuda-sanitizer-api-cu12 for CUDA 12), or with the CUDA toolkit (then set "
            "CUDA_HOME), or point %s at the file. Looked in: %s"
            % (LIBRARY, EXTRA, ENV, "; ".join(found.tried) or "nowhere"))


# -- what to instrument ------------------------------------------------------------

class Target(NamedTuple):
    launch: Optional[int]            # the culprit's launch number (watch's count)
    kernel: Optional[str]            # its kernel: a mangled name (prefix) or a substring
    max_launches: int = DEFAULT_MAX_LAUNCHES
    window: int = DEFAULT_WINDOW
    from_watch: bool = False         # numbers count from the script's own watch()
    launches: Tuple[int, ...] = ()   # several candidates (watch() could not tell): each one

    def describe(self) -> str:
        """``launch #1,234 (vectorized_elementwise_kernel<4, …>)``."""
        if len(self.launches) > 1:
            return "the %d candidate launches %s" % (len(self.launches), _numbers(self.launches))
        if self.launch and self.kernel:
            return "launch #{:,} ({})".format(self.launch, _short(self.kernel))
        if self.launch:
            return "launch #{:,}".format(self.launch)
        return "the launches of %s" % _short(self.kernel)


def _numbers(seqs) -> str:
    seqs = list(seqs)
    s = ", ".join("#{:,}".format(q) for q in seqs[:6])
    return s + (" ... #{:,}".format(seqs[-1]) if len(seqs) > 6 else "")


def match_mode(kernel: str) -> int:
    """A mangled C++ name is matched as a prefix of the launch's mangled name
    (the report's copy may be cut); anything else as a substring of the
    mangled or demangled name (a short name, a Triton or extern "C" kernel)."""
    return _core.REPLAY_MATCH_MANGLED_PREFIX if kernel.startswith("_Z") else \
        _core.REPLAY_MATCH_SUBSTRING


def _short(kernel: Optional[str]) -> str:
    if not kernel:
        return "?"
    from ._errors import short_kernel_name
    return short_kernel_name(_core.demangle(kernel) or kernel) or kernel


# -- the session (the replay process) -------------------------------------------------

#: Tests: a callable returning a PyTorch-shaped memory snapshot (else torch's own).
snapshot_provider: Optional[Callable[[], dict]] = None
#: The driver-API callbacks that make the calls fail, enabled from the start
#: instead of when a bad access is found (probes: they cost a step ~15%).
DRIVER_ALWAYS = False

_target: Optional[Target] = None
_library: Optional[Found] = None
_launches: Dict[int, dict] = {}      # launch number -> the memory and stack at that launch
_torch_note: Optional[str] = None    # why PyTorch's blocks are not known, when they are not
warm_seconds: Optional[float] = None # the first snapshot, taken at the start


def active() -> bool:
    return _target is not None


def check_launches(target: Target) -> None:
    """The launch numbers of `target` are what C can take: each 1 to LAUNCH_MAX
    (a larger one would wrap), the candidates each once, at most MAX_CANDIDATES
    (ReplayError). The command line says the same, as usage errors."""
    from ._replay_command import LAUNCH_MAX, MAX_CANDIDATES
    numbers = ([target.launch] if target.launch is not None else []) + list(target.launches)
    bad = [n for n in numbers if isinstance(n, bool) or not isinstance(n, int) or
           not 1 <= n <= LAUNCH_MAX]
    if bad:
        raise ReplayError("launch %r: a launch number is a whole number from 1 to %d"
                          % (bad[0], LAUNCH_MAX))
    if len(set(target.launches)) != len(target.launches) or \
            len(target.launches) > MAX_CANDIDATES:
        raise ReplayError("the candidate launches %s: each once, at most %d of them"
                          % (",".join(map(str, target.launches)), MAX_CANDIDATES))


def start(target: Target, found: Found) -> None:
    """Open the library and subscribe, before CUDA starts in this process."""
    global _target, _library
    if not target.launch and not target.kernel:
        raise ReplayError("name the culprit: --launch N and/or --kernel NAME, as the report "
                          "that printed the replay command has them")
    check_launches(target)
    ok, error = _core.replay_load(found.path)
    if not ok:
        raise ReplayError("cannot open NVIDIA's Sanitizer API at %s (found: %s): %s"
                          % (found.path, found.how, error))
    start_at = max(1, (target.launch or 1) - target.window) if target.kernel else 0
    several = len(target.launches) > 1
    rc = _core.replay_subscribe(
        launch=target.launch or 0, start=start_at,
        kernel="" if several else target.kernel or "",
        match=match_mode(target.kernel) if target.kernel and not several else
        _core.REPLAY_MATCH_ANY,
        max_launches=len(target.launches) if several else
        target.max_launches if target.kernel else 1, exit_warp=1, fail_launches=1,
        while_watching=1 if target.from_watch else 0, check_shared=0, ranges=_ranges_hook,
        driver_always=1 if DRIVER_ALWAYS else 0,
        launches=list(target.launches) if several else None)
    if rc:
        step, code = divmod(rc, 1000)
        raise ReplayError("NVIDIA's Sanitizer API (%s) refused the subscription: %s (%s)%s"
                          % (found.path, _result_text(code), {1: "sanitizerSubscribe",
                             2: "the launch callbacks", 3: "the memory callbacks",
                             4: "the launch-API callbacks"}.get(step, "?"),
                             ": another tool (compute-sanitizer, a profiler) holds it"
                             if code == 10 else ""))
    _target, _library = target, found


class ScopeStandIn:
    """What watch() and launch_blocking() open in a replay: nothing. The Sanitizer
    API holds the tools interface CUPTI would need (measured: CUPTI refuses a
    second client), and the replay itself stops at the culprit. A watch() is
    counted, so that launch numbers can count from the script's first one
    (``--from-watch``)."""

    def __init__(self, kind: int):
        self.kind = kind
        self.open = 1
        self.fault_mark = _core.fault_seq()
        self.watch_mark = 0
        if kind == _core.SCOPE_WATCH:
            _core.replay_watching(1)

    def close(self):
        if self.open:
            self.open = 0
            if self.kind == _core.SCOPE_WATCH:
                _core.replay_watching(-1)


def _result_text(rc: int) -> str:
    return _core.replay_result_string(rc) or "SanitizerResult %d" % rc


def record_torch_history() -> Optional[str]:
    """Make PyTorch's allocator keep each live block's allocating Python stack
    (``_record_memory_history``, state only: no trace of frees); None, or why
    not. Imports torch when it is installed (the program will, anyway)."""
    global _torch_note
    import importlib.util
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        _torch_note = "PyTorch is not installed"
        return _torch_note
    global warm_seconds
    try:
        import torch
        record = torch.cuda.memory._record_memory_history
        try:
            record(enabled="state", context="state", stacks="python")
        except TypeError:                       # PyTorch < 2.1: the boolean API
            record(True)
    except Exception as e:
        _torch_note = "PyTorch's memory history could not be recorded (%s: %s)" % (
            type(e).__name__, e)
        return _torch_note
    # The first snapshot of a process was measured at 5.5 s (the next at 0.3-1
    # ms): take it now, not inside the culprit's launch.
    t0 = time.perf_counter()
    try:
        torch.cuda.memory._snapshot()
        warm_seconds = time.perf_counter() - t0
    except Exception:
        pass
    return None


def record_torch_history_at_import() -> Optional[str]:
    """Record PyTorch's allocations from its import on (record_torch_history,
    run right after ``import torch`` completes, in the program): the program's
    own settings made before it imports torch (CUDA_VISIBLE_DEVICES,
    PYTORCH_CUDA_ALLOC_CONF) still count. None, or why not."""
    global _torch_note
    import importlib.abc
    import importlib.util
    if "torch" in sys.modules:
        return record_torch_history()
    if importlib.util.find_spec("torch") is None:
        _torch_note = "PyTorch is not installed"
        return _torch_note

    class AfterTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "torch":
                return None
            try:
                sys.meta_path.remove(self)
            except ValueError:
                pass
            spec = importlib.util.find_spec("torch")
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec
            run = loader.exec_module

            def exec_module(module):
                run(module)
                record_torch_history()
            loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, AfterTorch())
    return None


def _snapshot():
    if snapshot_provider is not None:
        return snapshot_provider()
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_initialized():
            return None
    except Exception:
        return None
    return torch.cuda.memory._snapshot()


def _ranges_hook(launch, kernel, grid, block, context, stream, device) -> Optional[bytes]:
    """C calls this (the GIL taken, on the launching thread) for an instrumented
    launch: the valid ranges, packed as little-endian uint64 pairs; the memory
    and the launching stack are kept for the report."""
    t0 = time.perf_counter()
    try:                       # the launching thread's Python frames (none on a C++ thread)
        stack = traceback.extract_stack(sys._getframe(1))
    except ValueError:
        stack = []
    entry = {"stack": stack, "error": None, "torch": False}
    try:
        san = _memory.sanitizer_allocations(_core.replay_allocations())
        entry["sanitizer"] = san
        live = free = segs = []
        try:
            snap = _snapshot()
            if snap is not None:
                live, free, segs = _memory.torch_allocations(snap)
                entry.update(live=live, free=free, segments=segs, torch=True)
        except Exception as e:  # the allocations the Sanitizer saw, then
            entry["error"] = "%s: %s" % (type(e).__name__, e)
            live = free = segs = []
        ranges = _memory.valid_ranges(san, live, segs)
    except Exception as e:     # never into C: the launch is checked against C's table
        entry["error"] = "%s: %s" % (type(e).__name__, e)
        entry["seconds"] = time.perf_counter() - t0
        _keep(launch, entry)
        return None
    entry["seconds"] = time.perf_counter() - t0
    _keep(launch, entry)
    return struct.pack("<%dQ" % (2 * len(ranges)), *[v for r in ranges for v in r])


def _keep(launch: int, entry: dict) -> None:
    _launches[launch] = entry
    while len(_launches) > _core.REPLAY_RESULTS:
        del _launches[min(_launches)]


# -- what the C side found ----------------------------------------------------------

class BadAccess(NamedTuple):
    address: int
    size: int
    access: str                      # "read", "write", "atomic"
    space: str                       # "global", "shared", "cp.async"
    misaligned: bool
    thread: Tuple[int, int, int]
    block: Tuple[int, int, int]
    pc_offset: Optional[int]         # from the kernel's first instruction
    order: int


class Instrumented(NamedTuple):
    launch: int
    kernel: str                      # mangled, as the launch had it
    grid: Tuple[int, int, int]
    block: Tuple[int, int, int]
    context: int
    stream: int
    device: int
    failed_step: int                 # 0, or which step the Sanitizer refused (_core.REPLAY_STEPS)
    rc: int
    n_ranges: int
    n_bad: int
    n_checked: int
    accesses: List[BadAccess]
    seconds_prepare: float
    seconds_ranges: float
    seconds_wait: float


_SPACES = {1: "global", 2: "shared", 3: "cp.async", 4: "local"}


def access_kind(flags: int) -> str:
    read, write = flags & _core.REPLAY_ACCESS_READ, flags & _core.REPLAY_ACCESS_WRITE
    if (read and write) or flags & _core.REPLAY_ACCESS_ATOMSYS:
        return "atomic"
    return "write" if write else "read"


def _text(b) -> str:
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else str(b)


def results(raw: Optional[Sequence[tuple]] = None) -> List[Instrumented]:
    """The instrumented launches (``_core.replay_results()``, or `raw`), named."""
    out = []
    for t in (_core.replay_results() if raw is None else raw):
        (launch, kernel, grid, block, context, stream, device, fpc, fsize, step, rc, n_ranges,
         n_bad, n_checked, recs, t_prep, t_ranges, t_wait) = t
        accesses = []
        for (address, pc, size, flags, space, order, thread, blk) in recs:
            off = pc - fpc if fpc and fpc <= pc < fpc + (fsize or 1 << 62) else None
            accesses.append(BadAccess(address, size, access_kind(flags),
                                      _SPACES.get(space & 0xFF, "global"), bool(space & 0x100),
                                      tuple(thread), tuple(blk), off, order))
        accesses.sort(key=lambda a: a.order)
        out.append(Instrumented(launch, _text(kernel), tuple(grid), tuple(block), context, stream,
                                device, step, rc, n_ranges, n_bad, n_checked, accesses, t_prep,
                                t_ranges, t_wait))
    return out


class Status(NamedTuple):
    launches: int
    launches_seen: int
    n_results: int
    violated: bool
    failed_launches: int
    n_allocs: int
    n_frees: int
    live_allocs: int
    contexts: int
    driver_rc: int                   # enabling the callbacks that fail the calls: 0 or why not
    first_instrumented: int          # the first launch instrumented (0 none)


def status() -> Status:
    s = _core.replay_status()
    return Status(s[0], s[1], s[2], bool(s[3]), *s[4:])


# -- the report -------------------------------------------------------------------

def _pick(accesses: List[BadAccess], locate=None) -> BadAccess:
    """The access to lead with: an end of the run of bad addresses (C keeps the
    lowest and the highest). The lowest, where it lies past the end of (or runs
    over) the allocation below it: an overrun starts at the end of what it
    overran. Else the highest, where it lies before the start of the allocation
    above it (an underrun). Else the lowest. A misaligned access leads only when
    there is nothing else. `locate(a)`: the access's Where (None: by address only)."""
    pool = [a for a in accesses if not a.misaligned] or list(accesses)
    lowest = min(pool, key=lambda a: (a.address, a.order))
    if locate is None:
        return lowest
    highest = max(pool, key=lambda a: (a.address + a.size, -a.order))
    if locate(lowest).relation in ("past_end", "overlaps_end"):
        return lowest
    if locate(highest).relation == "before_start":
        return highest
    return lowest


def where(inst: Instrumented, a: BadAccess, entry: Optional[dict] = None, tensor=True):
    """(Where, Allocation with shape/dtype when found) for access `a`; without
    the shape and dtype when not `tensor` (no search of the live tensors)."""
    entry = entry if entry is not None else _launches.get(inst.launch, {})
    if "sanitizer" not in entry:         # the hook failed: the allocations of now
        try:
            entry = dict(entry,
                         sanitizer=_memory.sanitizer_allocations(_core.replay_allocations()))
        except Exception:
            pass
    w = _memory.locate(a.address, a.size, entry.get("live", ()), entry.get("free", ()),
                       entry.get("segments", ()), entry.get("sanitizer", ()))
    if tensor and w.allocation is not None:
        w = w._replace(allocation=_memory.with_tensor(w.allocation))
    return w


def access_line(inst: Instrumented, a: BadAccess, entry: Optional[dict] = None) -> str:
    w = where(inst, a, entry)
    line = _memory.describe(a.access, a.size, a.address, w, a.thread, a.block)
    if a.misaligned:
        line = "misaligned: " + line
    if a.space != "global":
        line += " (%s)" % ("a cp.async copy's source" if a.space == "cp.async" else
                           a.space + " memory")
    return line


def _more_line(inst: Instrumented, lead: BadAccess) -> Optional[str]:
    others = [a for a in inst.accesses if a is not lead]
    extra = inst.n_bad - len(inst.accesses)
    if not others and extra <= 0:
        return None
    threads = {(a.block, a.thread) for a in inst.accesses}
    lo = min(a.address for a in inst.accesses)
    hi = max(a.address + a.size for a in inst.accesses)
    return "(%s bad access%s in all, by %s%d thread%s seen, at 0x%x..0x%x)" % (
        "{:,}".format(inst.n_bad), "" if inst.n_bad == 1 else "es",
        "at least " if extra > 0 else "", len(threads), "" if len(threads) == 1 else "s", lo, hi)


def build_error(inst: Instrumented, tb=None):
    """The cuda_debug exception for an instrumented launch that had bad
    accesses: IllegalAddressError (or MisalignedAddressError), mechanism
    "replay", with the address, the access, the device thread and block, and
    the allocation it missed."""
    from . import _locations
    from ._errors import class_for
    entry = _launches.get(inst.launch, {})
    lead = _pick(inst.accesses, lambda a: where(inst, a, entry, tensor=False))
    w = where(inst, lead, entry)
    code = 716 if lead.misaligned else 700
    stack = traceback.StackSummary.from_list(list(entry.get("stack") or ()))
    fs = _locations.user_frame(stack) if stack else None
    if (fs is None or not _locations.is_user_frame(fs)) and tb is not None:
        stack = _locations.stack_from(tb=tb)
        fs = _locations.user_frame(stack)
    mangled = inst.kernel
    t_line = time.perf_counter()
    kline = kernel_line(inst, lead)
    t_line = time.perf_counter() - t_line
    provenance = None
    if mangled.startswith("triton_"):     # an Inductor kernel: the model line it came from
        try:
            from ._report import inductor_provenance
            provenance = inductor_provenance(mangled, stack)
        except Exception:
            provenance = None
    fields = dict(
        mechanism="replay", found_at="replay", exact=True,
        kernel=(_core.demangle(mangled) or mangled) if mangled else None, kernel_mangled=mangled,
        grid=inst.grid, block=inst.block, stream=inst.stream, device=inst.device,
        launch_stack=stack or None,
        filename=fs.filename if fs else None, lineno=fs.lineno if fs else None,
        function=fs.name if fs else None, line=(fs.line or None) if fs else None,
        address=lead.address, access=lead.access, access_size=lead.size,
        fault_thread=lead.thread, fault_block=lead.block, allocation=w.allocation,
        access_text=access_line(inst, lead, entry), launch_seq=inst.launch,
        bad_accesses=[a._asdict() for a in inst.accesses], provenance=provenance,
        kernel_line=kline.as_dict() if kline else None,
        replay={"kernel_line": kline.as_dict() if kline else None,
                "kernel_line_seconds": round(t_line, 4), "launch": inst.launch, "original_launch": _target.launch if _target else None,
                "n_bad": inst.n_bad, "more": _more_line(inst, lead),
                "torch": bool(entry.get("torch")), "torch_note": _torch_note,
                "hook_error": entry.get("error")},
    )
    return class_for(code)(code=code, **fields)


def kernel_line(inst: Instrumented, a: BadAccess):
    """The source line of access `a` in the kernel (_kernel_lines.KernelLine),
    from its PC offset and the module image C kept; None without an offset."""
    if a.pc_offset is None:
        return None
    from . import _kernel_lines
    try:
        image = _core.replay_module_image(inst.launch)
    except Exception:
        image = None
    try:
        k = _kernel_lines.lookup(image, inst.kernel, a.pc_offset)
        return _triton_moved(k) if k is not None and (k.file or "").endswith(".py") else k
    except Exception as e:             # never instead of the report
        return _kernel_lines.KernelLine(inst.kernel, a.pc_offset, None, None, None, (), None,
                                        "", "the line lookup failed: %s: %s"
                                        % (type(e).__name__, e))


def _def_line(path: str, name: str, start: int = 1) -> Optional[int]:
    from ._kernel_lines import SOURCE_MAX
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            rows = f.read(SOURCE_MAX).splitlines()
    except OSError:
        return None
    for i in range(max(start, 1) - 1, len(rows)):
        if rows[i].lstrip().startswith("def %s(" % name):
            return i + 1
    return None


def _triton_moved(k):
    """A Triton kernel's line, as this run defines it: Triton's cache keys a
    compiled kernel by its source, not its file, so a cubin compiled for the
    same function elsewhere (another script, the lines above it edited) names
    that file and line. Where exactly one loaded JITFunction has the kernel's
    name, the line is moved by the distance between the two ``def`` lines."""
    jit = sys.modules.get("triton.runtime.jit")
    cls = getattr(jit, "JITFunction", None)
    if cls is None:
        return k
    name = k.function
    found = set()
    for m in list(sys.modules.values()):
        try:                            # (a module's own __getattr__ may raise anything)
            obj = getattr(m, name, None) if m is not None else None
        except Exception:
            continue
        if isinstance(obj, cls):
            code = getattr(getattr(obj, "fn", None), "__code__", None)
            if code is not None:
                found.add((code.co_filename, code.co_firstlineno))
    if len(found) != 1:
        return k
    path, first = found.pop()
    new_def = _def_line(path, name, first)
    old_def = _def_line(k.file, name)
    if new_def is None or (os.path.realpath(path) == os.path.realpath(k.file) and
                           old_def == new_def):
        return k
    if old_def is None:                 # the file it was compiled from is gone
        return k._replace(note="compiled from %s (Triton's cache): the line may have moved"
                          % k.file)
    from ._kernel_lines import source_line
    line = k.line - old_def + new_def
    return k._replace(file=path, line=line, source=source_line(path, line))


# -- outcomes -----------------------------------------------------------------------

def found() -> Optional[Instrumented]:
    for inst in results():
        if inst.n_bad:
            return inst
    return None


def outcome_text(target: Target, finished: str, prog: str = "cuda-debug") -> str:
    """What to say when the replay found no bad access. `finished`: how the
    program ended ("returned", "raised X", "faulted: ..."); `prog`: the command
    as typed (``cuda-debug``, ``python -m cuda_debug``)."""
    said = "%s replay: " % prog
    st = status()
    insts = results()
    at = _core.replay_at()
    lines = []
    refused = [i for i in insts if i.failed_step]
    for i in refused:
        lines.append(said + "NVIDIA's Sanitizer API could not instrument launch "
                     "#{:,} ({}): {} failed: {}.".format(
                         i.launch, _short(i.kernel), _core.REPLAY_STEPS.get(i.failed_step, "?"),
                         _result_text(i.rc)))
    clean = [i for i in insts if not i.failed_step]
    what = target.describe()
    several = len(target.launches) > 1
    if several and not clean and not refused:
        lines.append(said + "the program %s after {:,} launches: none of the "
                     "candidates {} came, so the original run did not repeat itself (it is not "
                     "deterministic, or its inputs or arguments differ).".format(
                         st.launches, _numbers(target.launches)) % finished)
    elif several and clean:
        lines.append(said + "the candidates {} ran instrumented ({} of {}) and made "
                     "no bad access: their inputs differ from the original run's (the program "
                     "is not deterministic), or the fault was not an access the check sees "
                     "(shared or local memory, a device-side malloc, texture or tensor-map "
                     "loads).".format(_numbers(i.launch for i in clean), st.n_results,
                                      len(target.launches)))
    elif target.launch and st.launches < target.launch and not clean:
        lines.append(said + "the program %s after {:,} launches: launch #{:,} was "
                     "never reached, so the original run did not repeat itself (it is not "
                     "deterministic, or its inputs or arguments differ).".format(
                         st.launches, target.launch) % finished)
    elif target.launch and at is not None and target.kernel and not clean and \
            not any(i.launch == target.launch for i in refused):
        got = _text(at[1])
        lines.append(said + "launch #{:,} was {} (grid {} block {}), not {}, and no "
                     "later launch of {} came: the launches came in another order than in the "
                     "original run (not deterministic).".format(
                         target.launch, _short(got), list(at[2]), list(at[3]),
                         _short(target.kernel), _short(target.kernel)))
    elif clean:
        i = clean[0]
        n = st.n_results - len(refused)
        lines.append(said + "{} ran instrumented ({} launch{}, from #{:,}, grid {} "
                     "block {}) and made no bad access: its inputs differ from the original "
                     "run's (the program is not deterministic), or the fault was not an access "
                     "the check sees (shared or local memory, a device-side malloc, texture "
                     "or tensor-map loads).".format(
                         _short(i.kernel), n, "" if n == 1 else "es",
                         st.first_instrumented or i.launch, list(i.grid), list(i.block)))
    elif target.kernel and not refused:
        lines.append(said + "no launch of %s came (%s launches made, the program %s): "
                     "the kernel name does not match what this run launched, or the run took "
                     "another path." % (_short(target.kernel), "{:,}".format(st.launches),
                                        finished))
    if not lines:
        lines.append(said + "%s was not instrumented (the program %s)." % (what,
                                                                                      finished))
    if refused:
        lines.append("The original report stands.")
    else:
        lines.append(HINTS + " The original report stands.")
    return "\n".join(lines)
