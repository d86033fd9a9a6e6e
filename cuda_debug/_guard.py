"""guard(): the usual device-side asserts become ordinary Python errors.

    with cuda_debug.guard():
        loss = F.cross_entropy(logits, target)   # a label outside [0, C) raises
                                                 # GuardIndexError here, and nothing ran

Inside a guard, the PyTorch ops whose CUDA kernels assert on bad inputs
(embedding, gather, nll_loss, x[idx]...: the table ``CHECKS`` below) check
those inputs first: one small reduction and one read of its result on the host
per call. A violation raises GuardIndexError or GuardValueError, naming the
values, their positions, the valid range, the shapes and the user's line; the
kernel is never launched and the CUDA context stays usable.

How: the Python entry points of exactly those ops (``torch.nn.functional.*``,
``torch.*``, ``torch.Tensor.*``) are wrapped, once, at the first guard()
(process-wide patches). Outside every guard a wrapper costs one read of a
module global; inside one, a thread-local read, then the check. Every other op
is untouched: a dispatch-level hook would see every ATen op (a pass-through
TorchDispatchMode costs 1.35-1.6x on a training step).

The valid ranges are PyTorch's own: whether an op wraps negative indices is
asked of CPU PyTorch once per op (``_bounds``: a CPU op raises exactly where
its CUDA kernel would assert), so the guard follows the PyTorch it runs with.
Only CUDA tensors are checked (CPU ops raise by themselves); nothing is checked
while torch.compile traces or a CUDA graph is being captured (a host read would
break the capture).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import functools
import os
import sys
import threading
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, Optional, Type, overload

from ._errors import GuardError, GuardIndexError, GuardValueError
from ._scope import _F, _Region, _check_bool, _entered

# -- who is guarded, now ------------------------------------------------------------

_lock = threading.Lock()


def _after_fork_in_child():
    global _lock
    _lock = threading.Lock()       # another thread of the parent may have held it


os.register_at_fork(after_in_child=_after_fork_in_child)
_open = 0             # enabled guard()s open in the process (every thread): the wrappers' gate
_all_threads = 0      # of which all_threads=True
_installed = False
_CHECK_CPU = False    # tests only: check CPU tensors too (the CPU op is the oracle)


class _ThreadState(threading.local):
    state = 0         # 1: guarded; -1: guard(False), or inside a check; 0: no guard() of its own

    def __init__(self):
        self.stack = []


_tls = _ThreadState()


def _guarded() -> bool:
    s = _tls.state
    return s > 0 or (s == 0 and _all_threads > 0)


def is_guarding() -> bool:
    """Whether the listed ops called by this thread, now, check their inputs."""
    return _open > 0 and _guarded()


class _Entry:
    """One open guard() of one thread."""

    def __init__(self, enabled: bool, all_threads: bool):
        global _open, _all_threads
        self.enabled, self.all_threads = enabled, all_threads
        self.stack = _tls.stack
        with _lock:
            _open += enabled
            _all_threads += all_threads
        self.stack.append(self)
        _tls.state = 1 if enabled else -1

    def close(self):
        global _open, _all_threads
        stack = self.stack
        for i in range(len(stack) - 1, -1, -1):      # by identity: interleaved tasks
            if stack[i] is self:
                del stack[i]
                break
        with _lock:
            _open -= self.enabled
            _all_threads -= self.all_threads
        if stack is _tls.stack:
            _tls.state = (1 if stack[-1].enabled else -1) if stack else 0


class guard(_Region):
    """Check the inputs of the ops that would make a CUDA kernel assert, before
    they launch, for this thread (every thread with ``all_threads=True``),
    inside the block or the decorated function.

    A bad input raises :class:`GuardIndexError` (an ``IndexError``: an index,
    class label or target out of range) or :class:`GuardValueError` (a
    ``ValueError``: a probability outside [0, 1], bad sampling weights)
    naming the op, the argument, up to 5 offending values with their positions,
    how many in all, the valid range, the shapes and the line. Nothing is
    launched: the CUDA context stays usable, and the next cell or test runs.

    Covered: ``F.embedding``, ``F.embedding_bag``, ``F.nll_loss`` (and 2-D),
    ``F.cross_entropy``, ``F.binary_cross_entropy``, ``F.one_hot``,
    ``index_select``, ``gather``, ``scatter``/``scatter_add``/``scatter_reduce``,
    ``take``, ``take_along_dim``, ``index_add``/``index_copy``/``index_fill``,
    ``index_put_``, ``x[idx]`` and ``x[idx] = v``, ``multinomial`` (as functions
    and Tensor methods, in-place variants too; nn.Embedding, nn.CrossEntropyLoss
    and friends call them). Not covered: custom CUDA or Triton kernels,
    torch.compile'd graphs. Each checked call reads a small result on the host
    (a synchronisation); every other op costs nothing.

    ``guard(False)`` turns the checks off inside a guarded region. Composes
    with ``watch()`` and ``launch_blocking()``.
    """

    _what = "guard()"
    _takes = "enabled=True|False and all_threads=True|False"
    enabled: bool
    all_threads: bool

    if TYPE_CHECKING:             # as launch_blocking's: @cuda_debug.guard returns the function
        @overload
        def __new__(cls, enabled: _F) -> _F: ...  # type: ignore[misc]
        @overload
        def __new__(cls, enabled: bool = True, *, all_threads: bool = False) -> "guard": ...
        def __new__(cls, *args: Any, **kwargs: Any) -> Any: ...
    else:
        def __init__(self, enabled: bool = True, *, all_threads: bool = False):
            self.enabled = _check_bool("guard(enabled)", enabled)
            self.all_threads = _check_bool("guard(all_threads)", all_threads) and self.enabled
            self._handles = []

    def _copy(self) -> "guard":
        return guard(self.enabled, all_threads=self.all_threads)

    def __enter__(self) -> "guard":
        if self.enabled:
            install()
        self._handles.append(_Entry(self.enabled, self.all_threads))
        try:                           # kept until exited (cuda_debug/_scope.py: _entered)
            return _entered.add(self) or self
        except BaseException:
            _entered.discard(self)
            raise

    def __exit__(self, exc_type: Optional[Type[BaseException]], exc: Optional[BaseException],
                 tb: Optional[TracebackType]) -> Literal[False]:
        self._exit_handle()
        return False

    def __repr__(self) -> str:
        return "cuda_debug.guard(%s%s)" % (self.enabled,
                                           ", all_threads=True" if self.all_threads else "")


# -- the patches ----------------------------------------------------------------------

torch = None          # the torch module, once installed
_compiling = None     # torch.compiler.is_compiling


def install() -> bool:
    """Wrap the listed ops' entry points (once per process). False when
    PyTorch is not installed (then there is nothing to guard)."""
    global _installed, torch, _compiling
    if _installed:
        return torch is not None
    with _lock:
        if _installed:
            return torch is not None
        try:
            import torch as torch_module
        except ImportError:
            _installed = True
            return False
        torch = torch_module
        compiler = getattr(torch, "compiler", None)
        _compiling = getattr(compiler, "is_compiling", None) or (lambda: False)
        import torch.nn.functional as F
        patched = []
        for owner, names in ((F, _FUNCTIONAL), (torch, _FUNCTIONS), (torch.Tensor, _METHODS)):
            for name in names:
                orig = getattr(owner, name, None)
                if orig is None or getattr(orig, "__cuda_debug_guard__", False):
                    continue
                check = CHECKS[name.rstrip("_")]
                patched.append((owner, name, orig, _wrap(orig, check, _op_name(owner, name))))
        for name, make in (("__getitem__", _getitem_wrapper), ("__setitem__", _setitem_wrapper)):
            orig = getattr(torch.Tensor, name)
            if not getattr(orig, "__cuda_debug_guard__", False):
                patched.append((torch.Tensor, name, orig, make(orig)))
        for owner, name, orig, wrapper in patched:
            setattr(owner, name, wrapper)
        _known_to_torch(patched)
        _installed = True
    return True


def _op_name(owner, name: str) -> str:
    if owner is torch.Tensor:
        return "Tensor." + name
    if owner is torch:
        return "torch." + name
    return "F." + name


def _known_to_torch(patched):
    """Where PyTorch knows its functions by identity, the wrappers are the same:
    torch.jit.script's builtins (torch.<op>), and the refs' pass-through set
    (torch._prims_common, built at import: Tensor.__getitem__)."""
    try:
        from torch.jit import _builtins
        for owner, name, _, wrapper in patched:
            if owner is torch:
                _builtins._register_builtin(wrapper, "aten::" + name)
    except Exception:
        pass
    passthrough = getattr(sys.modules.get("torch._prims_common"), "torch_function_passthrough", None)
    if isinstance(passthrough, set):
        passthrough.update(w for _, _, orig, w in patched if orig in passthrough)


def _run(check, args, kwargs):
    """The check's finding (a dict of GuardError fields), or None. Inside it the
    thread is unguarded (the check's own tensor ops are not checked). A check
    that cannot run (arguments PyTorch will reject, a tensor without data)
    leaves the op to say what is wrong."""
    tls = _tls
    saved = tls.state
    tls.state = -1
    try:
        with torch.no_grad():
            return check(*args, **kwargs)
    except Exception:
        return None
    finally:
        tls.state = saved


def _error(found: dict, frame) -> GuardError:
    """The GuardError for a finding, located at the innermost frame of user code."""
    from . import _report
    cls = found.pop("cls")
    try:
        fs = _report.user_frame(_report.stack_from(frame=frame))
    except Exception:
        fs = None
    if fs is not None:
        found.update(filename=fs.filename, lineno=fs.lineno, function=fs.name, line=fs.line)
    return cls(**found)


def _wrap(orig, check, op):
    def guarded(*args, **kwargs):
        if _open and not _compiling() and _guarded():
            found = _run(check, args, kwargs)
            if found is not None:
                __tracebackhide__ = True      # pytest: the error is at the caller's line
                found["op"] = found.get("op") or op
                raise _error(found, sys._getframe(1))
        return orig(*args, **kwargs)
    return _mark(guarded, orig)


def _mark(wrapper, orig):
    """The wrapper passes for the original: its name and docs, and for
    torch.jit.script the original itself (TorchScript compiles that one)."""
    functools.update_wrapper(wrapper, orig)
    wrapper.__cuda_debug_guard__ = True
    wrapper.__prepare_scriptable__ = lambda: orig
    return wrapper


_PLAIN = frozenset((int, slice, type(None), type(Ellipsis)))


def _plain(index) -> bool:
    """x[0], x[1:, 2], x[..., None]: nothing to check, decided without a call."""
    t = type(index)
    if t is tuple:
        for part in index:
            if type(part) not in _PLAIN:
                return False
        return True
    return t in _PLAIN


def _getitem_wrapper(orig):
    def __getitem__(self, index):
        if _open and not _plain(index) and not _compiling() and _guarded():
            found = _run(_check_getitem, (self, index), {})
            if found is not None:
                __tracebackhide__ = True
                raise _error(found, sys._getframe(1))
        return orig(self, index)
    return _mark(__getitem__, orig)


def _setitem_wrapper(orig):
    def __setitem__(self, index, value):
        if _open and not _plain(index) and not _compiling() and _guarded():
            found = _run(_check_getitem, (self, index), {"op": "x[index] = value"})
            if found is not None:
                __tracebackhide__ = True
                raise _error(found, sys._getframe(1))
        return orig(self, index, value)
    return _mark(__setitem__, orig)


# -- PyTorch's semantics, asked of CPU PyTorch ------------------------------------------

# Which indices each op takes on a dimension of size n: (lowest, highest + 1),
# "-n" where negative indices wrap, None where any value goes (the op wraps it).
# Asked of CPU PyTorch on a dimension of size 2 (accepts 0? -1? -3? 2?); these
# are the answers of PyTorch 2.15, used if a probe cannot run at all.
_DEFAULT_BOUNDS = {
    "embedding": ("0", "n"), "embedding_bag": ("0", "n"), "index_select": ("0", "n"),
    "gather": ("0", "n"), "scatter": ("0", "n"), "scatter_add": ("0", "n"),
    "scatter_reduce": ("0", "n"), "take": ("-n", "n"), "take_along_dim": (None, None),
    "take_along_dim_flat": ("0", "n"), "index_add": ("0", "n"), "index_copy": ("0", "n"),
    "index_fill": ("-n", "n"), "index": ("-n", "n"), "index_put": ("-n", "n"),
    "nll_loss": ("0", "n"), "bce_target": ("0", "n"),
}


def _probes():
    """One call per op on a CPU dimension of size 2, the index value left open.
    Every tensor is made on the CPU explicitly (a default device of "cuda"
    would make a probe assert on the GPU)."""
    F = torch.nn.functional
    cpu = torch.device("cpu")
    z, one, table = torch.zeros(2, device=cpu), torch.ones(1, device=cpu), torch.zeros(2, 1, device=cpu)

    def idx(v):
        return torch.tensor([v], device=cpu)
    return {
        "embedding": lambda v: F.embedding(idx(v), table),
        "embedding_bag": lambda v: F.embedding_bag(idx(v), table, idx(0)),
        "index_select": lambda v: z.index_select(0, idx(v)),
        "gather": lambda v: z.gather(0, idx(v)),
        "scatter": lambda v: z.scatter(0, idx(v), 1.0),
        "scatter_add": lambda v: z.scatter_add(0, idx(v), one),
        "scatter_reduce": lambda v: z.scatter_reduce(0, idx(v), one, "sum"),
        "take": lambda v: torch.take(z, idx(v)),
        "take_along_dim": lambda v: torch.take_along_dim(table, idx(v).view(1, 1), 0),
        "take_along_dim_flat": lambda v: torch.take_along_dim(z, idx(v)),
        "index_add": lambda v: z.index_add(0, idx(v), one),
        "index_copy": lambda v: z.index_copy(0, idx(v), one),
        "index_fill": lambda v: z.index_fill(0, idx(v), 1.0),
        "index": lambda v: z[idx(v)],
        "index_put": lambda v: z.clone().index_put_((idx(v),), one),
        "nll_loss": lambda v: F.nll_loss(table.view(1, 2), idx(v)),
        "bce_target": lambda v: F.binary_cross_entropy(one / 2, torch.tensor([float(v)], device=cpu)),
    }


def _modes_off():
    """No TorchDispatchMode (a FakeTensorMode would accept any index) while probing."""
    try:
        from torch.utils._python_dispatch import _disable_current_modes
    except ImportError:
        import contextlib
        return contextlib.nullcontext()
    return _disable_current_modes()


_bounds_cache = {}


def _accepts(probe, v) -> bool:
    try:
        probe(v)
        return True
    except Exception:
        return False


def _semantics(op: str):
    sem = _bounds_cache.get(op)
    if sem is None:
        with _modes_off():
            probe = _probes()[op]
            if not _accepts(probe, 0):          # the probe itself is broken: the table says
                sem = _DEFAULT_BOUNDS[op]
            else:
                lo = None if _accepts(probe, -3) else "-n" if _accepts(probe, -1) else "0"
                sem = (lo, None if _accepts(probe, 2) else "n")
        _bounds_cache[op] = sem
    return sem


def _bounds(op: str, n: int):
    """(lo, hi) for a dimension of size n: valid indices lo <= i < hi (None: unbounded)."""
    lo, hi = _semantics(op)
    return ({"0": 0, "-n": -n, None: None}[lo], n if hi == "n" else None)


def _bce_checks_target() -> bool:
    """Does binary_cross_entropy refuse a target outside [0, 1] (2.15 does)?"""
    return _semantics("bce_target")[1] == "n"


# -- the checks -----------------------------------------------------------------------

def _on(t) -> bool:
    """Check this op? Its tensor is on a CUDA device, no CUDA graph is being
    captured (a host read would break the capture) and torch.jit.trace is not
    recording (the checks would land in the trace)."""
    if not isinstance(t, torch.Tensor) or torch._C._get_tracing_state() is not None:
        return False                  # (torch.fx's proxies are not tensors)
    if t.is_cuda:
        return not torch.cuda.is_current_stream_capturing()
    return _CHECK_CPU


def _read(scalars):
    """Python numbers of 0-d tensors, with one host read."""
    if not scalars:
        return []
    floating = any(s.is_floating_point() for s in scalars)
    dtype = torch.float64 if floating else torch.int64
    device = next((s.device for s in scalars if s.is_cuda), scalars[0].device)
    return torch.stack([s.to(device, dtype) for s in scalars]).tolist()


def _interval(lo, hi) -> str:
    if hi is None:
        return ">= %s" % lo
    if lo is None:
        return "< %s" % hi
    return "[%s, %s)" % (lo, hi)


def _finding(cls, argument, t, bad, kind, rule, valid, shapes):
    """GuardError fields for tensor `t` whose elements `bad` (a bool tensor) are
    wrong: how many, the first 5 with their positions."""
    count = int(bad.sum())
    positions = [tuple(p) for p in torch.nonzero(bad)[:5].tolist()]
    values = torch.masked_select(t, bad)[:5].tolist()
    from ._torch_ops import metas
    return {"cls": cls, "argument": argument, "values": values, "positions": positions,
            "count": count, "numel": t.numel(), "valid": valid, "rule": (kind, rule),
            "shapes": metas(shapes)}


class _Range:
    """One integer tensor that must lie in [lo, hi) (None: unbounded), except
    the value `exempt` (ignore_index)."""

    def __init__(self, argument, t, lo, hi, kind="value", why="", exempt=None):
        self.argument, self.t, self.lo, self.hi = argument, t, lo, hi
        self.kind, self.why = kind, why
        self.exempt = exempt if exempt is not None and not self.within(exempt) else None

    def scalars(self):
        t = self.t
        if self.exempt is not None and _representable(t, self.exempt):
            t = t.masked_fill(t == self.exempt, self.lo if self.lo is not None else self.hi - 1)
        return list(torch.aminmax(t))

    def within(self, v) -> bool:
        return (self.lo is None or v >= self.lo) and (self.hi is None or v < self.hi)

    def bad(self):
        t = self.t.long()        # compared with int64 scalars: no wrap-around (uint8 < -5)
        bad = torch.zeros_like(t, dtype=torch.bool)
        if self.lo is not None:
            bad |= t < self.lo
        if self.hi is not None:
            bad |= t >= self.hi
        if self.exempt is not None:
            bad &= t != self.exempt
        return bad

    def finding(self, shapes, cls):
        return _finding(cls, self.argument, self.t, self.bad(), self.kind, self.rule(),
                        self.valid(), shapes)

    def valid(self) -> str:
        s = _interval(self.lo, self.hi)
        if self.exempt is not None:
            s += " or %s (ignore_index)" % self.exempt
        return s

    def rule(self) -> str:
        s = "outside " + _interval(self.lo, self.hi)
        if self.why:
            s += ", " + self.why
        if self.exempt is not None:
            s += ", and not ignore_index %s" % self.exempt
        return s


def _representable(t, v) -> bool:
    info = torch.iinfo(t.dtype)
    return info.min <= v <= info.max


class _Steps(_Range):
    """Offsets that must not decrease: their steps (offsets[k + 1] - offsets[k]) >= 0."""

    def __init__(self, argument, offsets, first):
        super().__init__(argument, offsets[first + 1:] - offsets[first:-1], 0, None)
        self.offsets, self.first = offsets, first

    def finding(self, shapes, cls):
        o = self.offsets.long()
        bad = torch.zeros_like(o, dtype=torch.bool)
        bad[self.first + 1:] = o[self.first + 1:] < o[self.first:-1]
        return _finding(GuardValueError, self.argument, self.offsets, bad, "value",
                        "smaller than the offset before it (offsets must not decrease)",
                        "non-decreasing", shapes)


def _ranges(items, shapes, cls=GuardIndexError):
    """Check integer tensors against their ranges with one host read; the
    finding for the first one out of range, or None."""
    items = [r for r in items if r.t.numel() and (r.lo is not None or r.hi is not None)]
    if not items:
        return None
    scalars = []
    for r in items:
        scalars += r.scalars()
    values = _read(scalars)
    for k, r in enumerate(items):
        lo, hi = values[2 * k], values[2 * k + 1]
        if not (r.within(lo) and r.within(hi)):
            return r.finding(shapes, cls)
    return None


def _dim_size(t, dim) -> int:
    return t.size(dim) if t.dim() else 1


def _index_op(op):
    """gather, scatter*, index_select, index_add/copy/fill: (input, dim, index, ...)."""
    def check(input, dim, index, *args, **kwargs):
        if not _on(input):
            return None
        lo, hi = _bounds(op, _dim_size(input, dim))
        return _ranges([_Range("index", index, lo, hi,
                               why="the size of dimension %d of input" % dim)],
                       [("input", input), ("index", index)])
    return check


def _check_take(input, index, *args, **kwargs):
    if not _on(input):
        return None
    lo, hi = _bounds("take", input.numel())
    return _ranges([_Range("index", index, lo, hi, why="the number of elements of input")],
                   [("input", input), ("index", index)])


def _check_take_along_dim(input, indices, dim=None, *args, **kwargs):
    if not _on(input):
        return None
    if dim is None:
        lo, hi = _bounds("take_along_dim_flat", input.numel())
        why = "the number of elements of input (dim=None)"
    else:
        lo, hi = _bounds("take_along_dim", _dim_size(input, dim))
        why = "the size of dimension %d of input" % dim
    return _ranges([_Range("indices", indices, lo, hi, why=why)],
                   [("input", input), ("indices", indices)])


def _check_embedding(input, weight, *args, **kwargs):
    if not _on(weight):
        return None
    lo, hi = _bounds("embedding", weight.size(0))
    return _ranges([_Range("input", input, lo, hi, why="the rows of weight")],
                   [("input", input), ("weight", weight)])


def _check_embedding_bag(input, weight, offsets=None, max_norm=None, norm_type=2,
                         scale_grad_by_freq=False, mode="mean", sparse=False,
                         per_sample_weights=None, include_last_offset=False, padding_idx=None):
    if weight.dtype in (torch.int32, torch.int64) and input.is_floating_point():
        input, weight = weight, input             # F.embedding_bag's legacy argument order
    if not _on(weight):
        return None
    lo, hi = _bounds("embedding_bag", weight.size(0))
    items = [_Range("input", input, lo, hi, why="the rows of weight")]
    shapes = [("input", input), ("weight", weight)]
    if offsets is not None and input.dim() == 1 and offsets.dim() == 1 and offsets.numel() > 1:
        # The CUDA kernel takes bag b as input[offsets[b]:offsets[b + 1]] (bag 0
        # from 0, whatever offsets[0] says): offsets past the end of input read
        # out of bounds, decreasing ones assert.
        n = input.numel()
        shapes.append(("offsets", offsets))
        items.append(_Offsets("offsets", offsets, n))
        items.append(_Steps("offsets", offsets, 1))
    return _ranges(items, shapes)


class _Offsets(_Range):
    """offsets[1:] within [0, len(input)]; positions reported in offsets itself."""

    def __init__(self, argument, offsets, n):
        super().__init__(argument, offsets[1:], 0, n + 1, why="the length of input")
        self.offsets = offsets

    def finding(self, shapes, cls):
        found = super().finding(shapes, cls)
        found["positions"] = [(p[0] + 1,) for p in found["positions"]]
        found["numel"] = self.offsets.numel()
        found["valid"] = "[0, %d]" % (self.hi - 1)
        found["rule"] = ("value", "outside [0, %d], the length of input" % (self.hi - 1))
        return found


def _classes(input) -> int:
    return input.size(1) if input.dim() >= 2 else input.size(0)


def _check_nll_loss(input, target, weight=None, size_average=None, ignore_index=-100,
                    reduce=None, reduction="mean", *args, **kwargs):
    if not _on(input) or target.is_floating_point():
        return None                                # probabilities (cross_entropy): no index
    lo, hi = _bounds("nll_loss", _classes(input))
    return _ranges([_Range("target", target, lo, hi,
                           why="the classes of input (dimension %d)" % (1 if input.dim() >= 2 else 0),
                           exempt=ignore_index)],
                   [("input", input), ("target", target)])


def _check_one_hot(tensor, num_classes=-1):
    if not _on(tensor):
        return None
    hi = None if num_classes == -1 else num_classes
    why = "num_classes=%d" % num_classes if hi is not None else "class values must not be negative"
    return _ranges([_Range("tensor", tensor, 0, hi, why=why)], [("tensor", tensor)])


def _unit_interval(items, shapes):
    """Floating tensors that must lie in [0, 1] (nan is not), with one host read."""
    items = [(name, t) for name, t in items if t.numel()]
    if not items:
        return None
    scalars = []
    for _, t in items:
        scalars += list(torch.aminmax(t))
    values = _read(scalars)
    for k, (name, t) in enumerate(items):
        lo, hi = values[2 * k], values[2 * k + 1]
        if not (0 <= lo and hi <= 1):
            bad = ~((t >= 0) & (t <= 1))
            return _finding(GuardValueError, name, t, bad, "value", "outside [0, 1]", "[0, 1]",
                            shapes)
    return None


def _check_binary_cross_entropy(input, target, *args, **kwargs):
    if not _on(input):
        return None
    items = [("input", input)]
    if _bce_checks_target():
        items.append(("target", target))
    return _unit_interval(items, [("input", input), ("target", target)])


def _check_multinomial(input, num_samples, replacement=False, *args, **kwargs):
    if not _on(input) or not input.is_floating_point() or num_samples <= 0 or not input.numel():
        return None
    mn, mx = torch.aminmax(input)
    sums = input.sum(-1)
    lo, hi, least, most = _read([mn, mx, sums.min(), sums.max()])
    shapes = [("input", input)]
    if not (lo >= 0 and hi < float("inf")):
        bad = ~((input >= 0) & (input < float("inf")))
        return _finding(GuardValueError, "input", input, bad, "value", "negative, inf or nan",
                        "finite and >= 0", shapes)
    if not least > 0:
        return _finding(GuardValueError, "input", sums, ~(sums > 0), "row sum",
                        "not positive",
                        "each row's sum > 0", shapes)
    if not most < float("inf"):            # CUDA's kernel divides by the sum: 0 everywhere
        return _finding(GuardValueError, "input", sums, ~(sums < float("inf")), "row sum",
                        "inf (overflows %s)" % str(input.dtype).replace("torch.", ""),
                        "each row's sum finite", shapes)
    return None


# -- indexing: x[index], x[index] = value, index_put_ ---------------------------------------

class _Unknown(Exception):
    """An index part the guard does not model: leave it to PyTorch."""


def _as_index(part):
    """A tensor index part: the part itself, or a list of ints made a tensor."""
    if isinstance(part, torch.Tensor):
        return part
    try:
        t = torch.tensor(part)
    except Exception:
        raise _Unknown(part) from None
    if t.dtype not in (torch.int64, torch.bool):
        raise _Unknown(part)
    return t


def _consumes(part, none_consumes: bool, tensors: dict, k: int) -> int:
    """How many dimensions of the indexed tensor `part` takes."""
    if part is Ellipsis or isinstance(part, bool):
        return 0
    if part is None:
        return 1 if none_consumes else 0
    if isinstance(part, (torch.Tensor, list)):
        t = tensors[k] = _as_index(part)
        return t.dim() if t.dtype in (torch.bool, torch.uint8) else 1
    if isinstance(part, slice) or (hasattr(part, "__index__") and
                                   getattr(part, "ndim", 0) == 0):
        return 1                       # an int (numpy's too), a SymInt
    raise _Unknown(part)               # a NumPy array...: PyTorch's to judge


def _index_ranges(shape, parts, names, none_consumes: bool):
    """_Range items for the integer tensors of an index, each on the dimension
    it indexes. `none_consumes`: None stands for a whole dimension (index_put_'s
    list), not a new one (x[None])."""
    tensors = {}
    consumed = [_consumes(part, none_consumes, tensors, k) for k, part in enumerate(parts)]
    rest = len(shape) - sum(consumed)
    if rest < 0:
        raise _Unknown(parts)          # too many indices: PyTorch says so
    items, dim = [], 0
    for k, part in enumerate(parts):
        if part is Ellipsis:
            dim += rest
            continue
        t = tensors.get(k)
        if t is not None and t.dtype not in (torch.bool, torch.uint8):
            n = shape[dim]
            lo, hi = _bounds("index_put" if none_consumes else "index", n)
            items.append(_Range(names[k], t, lo, hi, why="dimension %d of size %d" % (dim, n)))
        dim += consumed[k]
    return items


def _index_parts(index):
    """The parts of x[index], as PyTorch splits it: a tuple, or a short list
    holding tensors, sequences, slices, None or Ellipsis, is several indices
    (NumPy's rule); anything else is one."""
    if isinstance(index, tuple):
        return index, ["index[%d]" % k for k in range(len(index))]
    if isinstance(index, list) and len(index) < 32 and any(
            isinstance(e, (torch.Tensor, list, tuple, slice)) or e is None or e is Ellipsis
            for e in index):
        return tuple(index), ["index[%d]" % k for k in range(len(index))]
    return (index,), ["index"]


def _check_getitem(self, index, op=None):
    if not _on(self):
        return None
    parts, names = _index_parts(index)
    try:
        items = _index_ranges(tuple(self.shape), parts, names, none_consumes=False)
    except _Unknown:
        return None
    found = _ranges(items, [("x", self)] + [(r.argument, r.t) for r in items])
    if found is not None:
        found["op"] = op or "x[index]"
    return found


def _check_index_put(input, indices, values=None, accumulate=False):
    if not _on(input):
        return None
    parts = tuple(indices)
    names = ["indices[%d]" % k for k in range(len(parts))]
    try:
        items = _index_ranges(tuple(input.shape), parts, names, none_consumes=True)
    except _Unknown:
        return None
    return _ranges(items, [("input", input)] + [(r.argument, r.t) for r in items])


#: Every checked op, by entry-point name (in-place variants share their op's check).
CHECKS = {
    "embedding": _check_embedding,
    "embedding_bag": _check_embedding_bag,
    "nll_loss": _check_nll_loss,
    "cross_entropy": _check_nll_loss,
    "binary_cross_entropy": _check_binary_cross_entropy,
    "one_hot": _check_one_hot,
    "index_select": _index_op("index_select"),
    "gather": _index_op("gather"),
    "scatter": _index_op("scatter"),
    "scatter_add": _index_op("scatter_add"),
    "scatter_reduce": _index_op("scatter_reduce"),
    "index_add": _index_op("index_add"),
    "index_copy": _index_op("index_copy"),
    "index_fill": _index_op("index_fill"),
    "take": _check_take,
    "take_along_dim": _check_take_along_dim,
    "multinomial": _check_multinomial,
    "index_put": _check_index_put,
}

_FUNCTIONAL = ("embedding", "embedding_bag", "nll_loss", "cross_entropy", "binary_cross_entropy",
               "one_hot")
_FUNCTIONS = ("index_select", "gather", "scatter", "scatter_add", "scatter_reduce", "take",
              "take_along_dim", "multinomial", "index_add", "index_copy", "index_fill",
              "index_put", "index_put_")
_METHODS = _FUNCTIONS[:-1] + ("index_add_", "index_copy_", "index_fill_", "index_put_",
                              "scatter_", "scatter_add_", "scatter_reduce_")

__all__ = ["guard", "is_guarding", "GuardError", "GuardIndexError", "GuardValueError"]
