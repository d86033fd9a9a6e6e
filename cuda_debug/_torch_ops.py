"""What PyTorch was doing when a kernel faulted: the ATen operator and the
tensors that reached it (shape, dtype, device; never values).

Two sources, both read only after a fault:

* ``launch_blocking()`` (mechanism "cupti"): the C fault path keeps the
  ``at::_ops::<name>::call`` frames of the launching thread's native stack
  (csrc/capture/native_ops.c), so the operators cost nothing until a fault. The
  inputs are the tensor arguments of the Python call that entered PyTorch,
  read from the live frame of the exception's traceback: the call expression
  at the faulting instruction is parsed and its plain names evaluated in that
  frame (no code runs: names, attributes of plain objects and of modules'
  parameters and buffers only).
* the dispatch fallback (mechanism "dispatch", when another tool holds
  CUPTI): the TorchDispatchMode that synchronises after every op hands the op
  and its arguments over directly (_dispatch_fallback.py).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import linecache
import sys
import threading
from typing import List, Optional, Sequence

MAX_INPUTS = 12


def aten_name(struct: str) -> str:
    """``add_Tensor`` (the C++ struct at::_ops::add_Tensor) -> ``aten::add.Tensor``,
    resolved against PyTorch's operator registry when torch is imported."""
    torch = sys.modules.get("torch")
    aten = getattr(getattr(torch, "ops", None), "aten", None) if torch is not None else None
    if aten is not None:
        candidates = [(struct, "default")] + [
            (struct[:i], struct[i + 1:]) for i in range(len(struct) - 2, 0, -1)
            if struct[i] == "_"]
        for base, overload in candidates:
            try:
                packet = getattr(aten, base)
                if overload in packet.overloads():
                    return "aten::%s" % base if overload == "default" else \
                        "aten::%s.%s" % (base, overload)
            except Exception:
                continue
    return "aten::" + struct


def op_stack(ops: Sequence[str]) -> Optional[List[str]]:
    """The C record's operators (innermost first) as aten names, outermost first."""
    if not ops:
        return None
    return [aten_name(s) for s in reversed(ops)]


def tensor_meta(name: str, value) -> Optional[dict]:
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(value, torch.Tensor):
        return None
    try:
        return {"name": name, "shape": tuple(int(d) for d in value.shape),
                "dtype": str(value.dtype).replace("torch.", ""), "device": str(value.device)}
    except Exception:                      # a subclass without sizes, a fake tensor...
        return None


def metas(pairs) -> Optional[List[dict]]:
    """Input records for (name, value) pairs: tensors, and tensors in lists."""
    out = []
    for name, value in pairs:
        if isinstance(value, (list, tuple)):
            for i, v in enumerate(value[:MAX_INPUTS]):
                m = tensor_meta("%s[%d]" % (name, i), v)
                if m:
                    out.append(m)
        else:
            m = tensor_meta(name, value)
            if m:
                out.append(m)
        if len(out) >= MAX_INPUTS:
            break
    return out or None


# -- the call expression at the faulting instruction ---------------------------

_MISSING = object()


def _lookup(node, frame):
    """The value of a plain name or attribute chain in `frame`, without running
    code (no properties, no __getattr__ except nn.Module's own tables)."""
    import ast              # (ast is a report's: imported here, not with the module)
    if isinstance(node, ast.Name):
        for space in (frame.f_locals, frame.f_globals):
            if node.id in space:
                return space[node.id]
        return _MISSING
    if isinstance(node, ast.Attribute):
        obj = _lookup(node.value, frame)
        if obj is _MISSING:
            return _MISSING
        try:
            d = object.__getattribute__(obj, "__dict__")
        except AttributeError:
            return _MISSING
        if node.attr in d:
            return d[node.attr]
        for table in ("_parameters", "_buffers", "_modules"):      # torch.nn.Module
            t = d.get(table)
            if isinstance(t, dict) and node.attr in t:
                return t[node.attr]
    return _MISSING


def _operands(expr):
    """(source text, node) of the operands of a call, subscript or operator."""
    import ast
    if isinstance(expr, ast.Call):
        nodes = []
        if isinstance(expr.func, ast.Attribute):
            nodes.append(expr.func.value)             # x.index_select(...): x is an input
        nodes += list(expr.args) + [k.value for k in expr.keywords]
        return nodes
    if isinstance(expr, ast.Subscript):
        idx = expr.slice
        return [expr.value] + (list(idx.elts) if isinstance(idx, ast.Tuple) else [idx])
    if isinstance(expr, ast.BinOp):
        return [expr.left, expr.right]
    if isinstance(expr, ast.UnaryOp):
        return [expr.operand]
    if isinstance(expr, ast.AugAssign):
        return [expr.target, expr.value]
    if isinstance(expr, ast.Compare):
        return [expr.left] + list(expr.comparators)
    return []


def _segment(code, lasti: int) -> Optional[str]:
    """The source text of the instruction at lasti (Python >= 3.11 positions)."""
    if not hasattr(code, "co_positions") or lasti < 0:
        return None
    try:
        pos = list(code.co_positions())[lasti // 2]
    except (IndexError, ValueError):
        return None
    line, end_line, col, end_col = pos
    if None in pos:
        return None
    lines = [linecache.getline(code.co_filename, n).encode("utf-8")
             for n in range(line, end_line + 1)]
    if not lines or not lines[0]:
        return None
    if len(lines) == 1:
        text = lines[0][col:end_col]
    else:
        text = lines[0][col:] + b"".join(lines[1:-1]) + lines[-1][:end_col]
    return text.decode("utf-8", "replace")


def _parse(segment: str):
    import ast
    try:
        return ast.parse("(%s\n)" % segment, mode="eval").body
    except SyntaxError:
        pass
    try:
        body = ast.parse(segment.strip()).body
    except SyntaxError:
        return None
    if len(body) == 1:
        stmt = body[0]
        return stmt.value if isinstance(stmt, ast.Expr) else stmt
    return None


def call_inputs(tb) -> Optional[List[dict]]:
    """The tensor arguments of the call that raised, in the innermost frame of
    the traceback `tb` (the Python call into PyTorch's C++)."""
    import ast
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    segment = _segment(frame.f_code, tb.tb_lasti)
    expr = _parse(segment) if segment else None
    if expr is None:
        return None
    pairs = []
    for node in _operands(expr):
        starred = isinstance(node, ast.Starred)
        target = node.value if starred else node
        value = _lookup(target, frame)
        if value is _MISSING:
            continue
        name = ast.unparse(target)
        if len(name) > 60:
            name = name[:57] + "..."
        if starred and isinstance(value, dict):
            pairs += list(value.items())
        else:
            pairs.append(("*" + name if starred else name, value))
    return metas(pairs)


def format_inputs(inputs: Optional[Sequence[dict]]) -> str:
    """``weight: float32[10, 4], input: int64[2] on cuda:0`` (one device named once)."""
    if not inputs:
        return ""
    devices = {i["device"] for i in inputs}
    one = len(devices) == 1
    parts = ["%s: %s[%s]%s" % (i["name"], i["dtype"], ", ".join(map(str, i["shape"])),
                               "" if one else " " + i["device"]) for i in inputs]
    return ", ".join(parts) + (" on %s" % devices.pop() if one else "")


# -- watch(ops=True): the op each launch was made in ------------------------------
#
# watch() finds a fault long after its launch, when the launching C++ stack is
# gone. With ops=True a TorchDispatchMode on the entering thread (and, through
# PyTorch's thread-local state, its autograd threads) hands out a token per op
# call, keeps (op, tensor shapes) in a ring under that token and puts the
# token in the thread's C slot (_core.set_op), which every watch record copies.
# It costs a Python call per op (measured in benchmarks/RESULTS.md), hence opt-in.

_OP_RING = 1 << 16
_op_ring: list = [None] * _OP_RING         # token & mask -> (token, func, tensor args)
_tokens = None                             # itertools.count, made on first use
_recorder_cls = None


def _recorder_class():
    global _recorder_cls, _tokens
    if _recorder_cls is not None:
        return _recorder_cls
    import itertools
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from . import _core
    _tokens = itertools.count(1)
    set_op, ring, mask, Tensor = _core.set_op, _op_ring, _OP_RING - 1, torch.Tensor

    class RecordOps(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls):
            return True

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            token = next(_tokens) & 0xFFFFFFFF
            # Plain tuples of ints, dtypes and devices only: the garbage
            # collector stops tracking them, so 65,536 of them cost no GC time.
            ring[token & mask] = (token, func, tuple([
                (i, tuple(a.shape), a.dtype, a.device) for i, a in enumerate(args)
                if isinstance(a, Tensor)]))
            set_op(token)
            try:
                return func(*args, **(kwargs or {}))
            finally:
                set_op(0)

    _recorder_cls = RecordOps
    return _recorder_cls


def schema_name(func) -> str:
    schema = getattr(func, "_schema", None)
    if schema is None:
        return str(func)
    return schema.name + ("." + schema.overload_name if schema.overload_name else "")


def arg_name(func, i: int) -> str:
    """The schema's name of positional argument i of an OpOverload (``arg<i>`` if unknown)."""
    schema = getattr(func, "_schema", None)
    args = schema.arguments if schema is not None else ()
    return args[i].name if i < len(args) else "arg%d" % i


def recorded_op(token: int):
    """(op name, inputs) recorded under a watch record's op token, or None
    (no op, or overwritten by 65,536 later ops)."""
    if not token:
        return None
    entry = _op_ring[token & (_OP_RING - 1)]
    if entry is None or entry[0] != token:
        return None
    _, func, tensors = entry
    inputs = [{"name": arg_name(func, i),
               "shape": tuple(int(d) for d in shape),
               "dtype": str(dtype).replace("torch.", ""), "device": str(device)}
              for i, shape, dtype, device in tensors]
    return schema_name(func), inputs or None


class ThreadMode:
    """A TorchDispatchMode held by nested scopes of one thread: pushed by the
    outermost, popped when it closes; inner ones only count."""

    def __init__(self, mode_class, local):
        self._local = local
        self._mode = None if getattr(local, "depth", 0) else mode_class()
        if self._mode is not None:
            self._mode.__enter__()
        local.depth = getattr(local, "depth", 0) + 1

    def close(self):
        self._local.depth -= 1
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None


_recording = threading.local()


def start_recording() -> ThreadMode:
    """watch(ops=True)'s hold on this thread."""
    return ThreadMode(_recorder_class(), _recording)
