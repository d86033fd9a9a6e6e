"""Replay: which memory a bad access hit or missed, in words.

Functions over plain data (no CUDA call; the user-frame rule is _locations'),
so that they are tested on CPU from recorded samples:

- :func:`torch_allocations` reads a PyTorch caching-allocator snapshot
  (``torch.cuda.memory._snapshot()``, or its ``"segments"`` list) into the live
  tensors' blocks (address, the size the tensor asked for, the Python line that
  allocated it when ``_record_memory_history`` was on), the cached free blocks
  and the segments (what the allocator got from cudaMalloc);
- :func:`valid_ranges` is what the instrumented launch may touch: every
  allocation the Sanitizer API saw, except that inside PyTorch's segments only
  the live tensors' bytes count (an access past a tensor's end that stays
  inside a cached segment is caught too);
- :func:`locate` names, for an address, the allocation it is in or the one it
  missed (past whose end, before whose start, in which free block);
- :func:`describe` writes the one line of the report.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import bisect
import gc
import os
import sys
from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple

#: Kinds of memory an address can belong to (Allocation.kind).
TENSOR = "tensor"                  # a live PyTorch block (a tensor's storage, a workspace)
FREE_BLOCK = "free block"          # cached by PyTorch's allocator, not in use
ALLOCATION = "allocation"          # seen by the Sanitizer API (cudaMalloc, cuMemAlloc, a pool)
HOST = "pinned host memory"
MANAGED = "managed memory"
MODULE = "module variable"         # a __device__ variable of a loaded module
RESERVED = "reserved address range"  # cuMemAddressReserve: mapped or not, it cannot tell

#: How far from an allocation an address still counts as "past its end" /
#: "before its start": the driver maps device memory in 2 MiB pages, so an
#: address farther away than that belongs to no allocation's neighbourhood.
NEAR = 2 << 20


class Allocation(NamedTuple):
    address: int
    size: int                                  # the bytes asked for (a tensor's requested size)
    kind: str                                  # TENSOR, FREE_BLOCK, ALLOCATION, ...
    frames: Tuple[Tuple[str, int, str], ...] = ()   # allocating stack, innermost first
    block_size: Optional[int] = None           # PyTorch's rounded block
    segment: Optional[Tuple[int, int]] = None  # (address, size) of the segment holding it
    stream: Optional[int] = None
    shape: Optional[Tuple[int, ...]] = None
    dtype: Optional[str] = None

    @property
    def end(self) -> int:
        return self.address + self.size

    @property
    def allocated_at(self) -> Optional[str]:
        """``train.py:31`` of the innermost user frame of the allocating stack."""
        fs = user_frame(self.frames)
        return "%s:%d" % (os.path.basename(fs[0]), fs[1]) if fs else None


class Where(NamedTuple):
    """An address relative to the memory around it."""
    relation: str                    # "inside", "past_end", "overlaps_end", "before_start",
    #                                  "outside"
    allocation: Optional[Allocation]  # the one it is in, or the one it missed
    distance: int                    # bytes past the end / before the start; offset if inside
    container: Optional[Allocation] = None   # the free block or segment it landed in


# -- PyTorch's snapshot --------------------------------------------------------

_LIVE = ("active_allocated", "active_awaiting_free", "active_pending_free")


def _frames(raw) -> Tuple[Tuple[str, int, str], ...]:
    out = []
    for f in raw or ():
        try:
            out.append((str(f.get("filename") or "?"), int(f.get("line") or 0),
                        str(f.get("name") or "?")))
        except (AttributeError, TypeError, ValueError):
            continue
    return tuple(out)


def user_frame(frames: Sequence[Tuple[str, int, str]]):
    """The innermost frame of the user's code (the one rule of _locations) in an
    allocating stack (innermost first): the line that made the tensor."""
    from ._locations import is_user_file
    for i, fs in enumerate(frames):
        if fs[0] and is_user_file(fs[0], outermost=i == len(frames) - 1):
            return fs
    return None


def torch_allocations(snapshot) -> Tuple[List[Allocation], List[Allocation], List[Allocation]]:
    """(live blocks, free blocks, segments) of a PyTorch memory snapshot, each
    sorted by address. `snapshot` is ``torch.cuda.memory._snapshot()`` or its
    ``"segments"`` list. A block's address is its own ``address`` key where the
    snapshot has one, else its offset in the segment (older PyTorch)."""
    segments = snapshot.get("segments", ()) if isinstance(snapshot, dict) else snapshot or ()
    live, free, segs = [], [], []
    for s in segments:
        try:
            base, total = int(s["address"]), int(s["total_size"])
        except (KeyError, TypeError, ValueError):
            continue
        seg = (base, total)
        segs.append(Allocation(base, total, ALLOCATION, _frames(s.get("frames")),
                               block_size=total, stream=s.get("stream")))
        at = base
        for b in s.get("blocks") or ():
            try:
                size = int(b["size"])
            except (KeyError, TypeError, ValueError):
                continue
            start = int(b.get("address", at))
            requested = int(b.get("requested_size") or size)
            if b.get("state") in _LIVE:
                live.append(Allocation(start, requested, TENSOR, _frames(b.get("frames")),
                                       block_size=size, segment=seg, stream=s.get("stream")))
            else:
                free.append(Allocation(start, size, FREE_BLOCK, _frames(b.get("frames")),
                                       block_size=size, segment=seg, stream=s.get("stream")))
            at = start + size
    key = lambda a: a.address  # noqa: E731
    return sorted(live, key=key), sorted(free, key=key), sorted(segs, key=key)


# -- what the Sanitizer API saw --------------------------------------------------

#: csrc/replay: the kind of each allocation the Sanitizer's resource callbacks
#: reported (the callback id), and the memory flags that refine it.
SAN_DEVICE, SAN_HOST, SAN_ASYNC, SAN_VIRTUAL = 11, 13, 15, 26
FLAG_MODULE, FLAG_MANAGED, FLAG_HOST_MAPPED, FLAG_HOST_PINNED = 0x1, 0x2, 0x4, 0x8


def sanitizer_allocations(raw: Iterable[Tuple[int, int, int, int]]) -> List[Allocation]:
    """The Sanitizer API's allocation table ((address, size, flags, cbid), as
    _core.replay_allocations() returns it) as Allocations, sorted."""
    out = []
    for address, size, flags, cbid in raw:
        if cbid == SAN_VIRTUAL:
            kind = RESERVED
        elif cbid == SAN_HOST or flags & (FLAG_HOST_MAPPED | FLAG_HOST_PINNED):
            kind = HOST
        elif flags & FLAG_MANAGED:
            kind = MANAGED
        elif flags & FLAG_MODULE:
            kind = MODULE
        else:
            kind = ALLOCATION
        out.append(Allocation(int(address), int(size), kind))
    return sorted(out, key=lambda a: a.address)


def _covered(a: Allocation, segments: List[Allocation], starts: List[int]) -> bool:
    i = bisect.bisect_right(starts, a.address) - 1
    return i >= 0 and segments[i].address <= a.address and a.end <= segments[i].end


def valid_ranges(sanitizer: Sequence[Allocation], live: Sequence[Allocation] = (),
                 segments: Sequence[Allocation] = ()) -> List[Tuple[int, int]]:
    """Sorted, merged [lo, hi) ranges an instrumented kernel may touch: the
    Sanitizer's allocations (not its reserved address ranges) outside PyTorch's
    segments, and inside them only the live blocks' requested bytes."""
    segments = sorted(segments, key=lambda a: a.address)
    starts = [s.address for s in segments]
    # A reserved address range is no memory (the driver reserves large ones).
    spans = [(a.address, a.end) for a in sanitizer
             if a.kind != RESERVED and not _covered(a, segments, starts)]
    spans += [(a.address, a.end) for a in live if a.size > 0]
    spans.sort()
    merged: List[List[int]] = []
    for lo, hi in spans:
        if hi <= lo:
            continue
        if merged and lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    return [(lo, hi) for lo, hi in merged]


# -- where an address is -----------------------------------------------------------

def _containing(address: int, items: Sequence[Allocation],
                starts: List[int]) -> Optional[Allocation]:
    i = bisect.bisect_right(starts, address) - 1
    if i >= 0 and address < items[i].end:
        return items[i]
    return None


def locate(address: int, size: int, live: Sequence[Allocation] = (),
           free: Sequence[Allocation] = (), segments: Sequence[Allocation] = (),
           sanitizer: Sequence[Allocation] = ()) -> Where:
    """Where the `size`-byte access at `address` is: inside an allocation, or
    past the end of the one below it / before the start of the one above it
    (within the same segment for PyTorch's blocks, within NEAR bytes
    otherwise), or outside everything."""
    live = sorted(live, key=lambda a: a.address)
    others = sorted((a for a in sanitizer), key=lambda a: a.address)
    segments = sorted(segments, key=lambda a: a.address)
    seg_starts = [s.address for s in segments]
    seg = _containing(address, segments, seg_starts)
    if seg is not None:
        # Inside one of PyTorch's segments: the tensors around it name it.
        free = sorted(free, key=lambda a: a.address)
        in_free = _containing(address, free, [f.address for f in free])
        mine = [a for a in live if a.segment == (seg.address, seg.size)]
        where = _between(address, size, mine)
        return where._replace(container=in_free or seg) if where.relation != "inside" else \
            where._replace(container=seg)
    # Outside PyTorch's segments: the Sanitizer's allocations (and live blocks
    # of a snapshot that has no segments) around it, within NEAR bytes.
    around = sorted(others + [t for t in live if t.segment is None], key=lambda a: a.address)
    where = _between(address, size, around)
    if where.relation in ("past_end", "before_start") and where.distance >= NEAR:
        return Where("outside", None, 0)
    return where


def _between(address: int, size: int, items: Sequence[Allocation]) -> Where:
    """The access against sorted, disjoint `items`: inside one (or running past
    its end), else past the end of the nearest one below or before the start of
    the nearest one above, whichever is closer (below on a tie)."""
    starts = [a.address for a in items]
    i = bisect.bisect_right(starts, address) - 1
    below = items[i] if i >= 0 else None
    if below is not None and address < below.end:
        if address + size <= below.end:
            return Where("inside", below, address - below.address)
        return Where("overlaps_end", below, address + size - below.end)
    above = items[i + 1] if i + 1 < len(items) else None
    d_below = address - below.end if below is not None else None
    d_above = above.address - address if above is not None else None
    if d_below is not None and (d_above is None or d_below <= d_above):
        return Where("past_end", below, d_below)
    if d_above is not None:
        return Where("before_start", above, d_above)
    return Where("outside", None, 0)


def with_tensor(a: Optional[Allocation], tensors=None) -> Optional[Allocation]:
    """`a` with the shape and dtype of the live tensor whose storage it is, when
    one can be found (`tensors`: the candidates; default every tensor the
    garbage collector tracks). The tensor whose data starts at the block and
    fills its requested size wins; else the largest view of that storage."""
    if a is None or a.kind != TENSOR:
        return a
    if tensors is None:
        torch = sys.modules.get("torch")
        if torch is None:
            return a
        tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    best = None
    for t in tensors:
        try:
            if not t.is_cuda or t.untyped_storage().data_ptr() != a.address:
                continue
            nbytes = t.numel() * t.element_size()
            score = (t.data_ptr() == a.address and nbytes == a.size,
                     t.data_ptr() == a.address, nbytes)
            if best is None or score > best[0]:
                best = (score, tuple(int(d) for d in t.shape),
                        str(t.dtype).replace("torch.", ""))
        except Exception:          # a tensor subclass, a meta tensor: not ours to judge
            continue
    if best is None:
        return a
    return a._replace(shape=best[1], dtype=best[2])


# -- the report line ----------------------------------------------------------------

ACCESS_WORDS = {"read": "read", "write": "wrote", "atomic": "did an atomic on"}
SPACES = {1: "global", 2: "shared", 3: "global", 4: "local"}


def _n(v: int) -> str:
    return "{:,}".format(v)


def _bytes(v: int) -> str:
    return "%s byte%s" % (_n(v), "" if v == 1 else "s")


def _what(a: Allocation) -> str:
    """``a 1,200-byte tensor (float32[300]) allocated at train.py:31``."""
    noun = {TENSOR: "tensor", FREE_BLOCK: "free block of PyTorch's caching allocator",
            ALLOCATION: "allocation", HOST: "pinned host allocation",
            MANAGED: "managed allocation", MODULE: "__device__ variable",
            RESERVED: "reserved address range"}.get(a.kind, a.kind)
    s = "a %s-byte %s" % (_n(a.size), noun)
    if a.shape is not None and a.dtype:
        s += " (%s[%s])" % (a.dtype, ", ".join(str(d) for d in a.shape))
    if a.allocated_at:
        s += " allocated at " + a.allocated_at
    return s


def describe(access: str, size: int, address: int, where: Where,
             thread: Sequence[int] = (), block: Sequence[int] = ()) -> str:
    """``thread [300,0,0] of block [1,0,0] wrote 4 bytes at 0x7f..., 96 bytes past
    the end of a 1,200-byte tensor (float32[300]) allocated at train.py:31``."""
    who = ""
    if thread:
        who = "thread [%s]" % ",".join(str(v) for v in thread)
        if block:
            who += " of block [%s]" % ",".join(str(v) for v in block)
        who += " "
    s = "%s%s %s at 0x%x" % (who, ACCESS_WORDS.get(access, access), _bytes(size), address)
    a = where.allocation
    if where.relation == "inside" and a is not None:
        s += ", %s into %s" % (_bytes(where.distance), _what(a))
    elif where.relation == "past_end" and a is not None and where.distance == 0:
        s += ", right past the end of %s" % _what(a)
    elif where.relation == "past_end" and a is not None:
        s += ", %s past the end of %s" % (_bytes(where.distance), _what(a))
    elif where.relation == "overlaps_end" and a is not None:
        s += ", running %s past the end of %s" % (_bytes(where.distance), _what(a))
    elif where.relation == "before_start" and a is not None:
        s += ", %s before the start of %s" % (_bytes(where.distance), _what(a))
    else:
        s += ", in no allocation (nor near one)"
    c = where.container
    if c is not None and c.kind == FREE_BLOCK:
        s += ", in a free %s-byte block of PyTorch's caching allocator" % _n(c.size)
    return s


def kernel_line_text(d: dict) -> str:
    """``in the kernel: file:line  text`` (and the inline chain), or the
    function, offset, instruction and how to get a line (_kernel_lines)."""
    from . import _kernel_lines
    fields = {f: d.get(f) for f in _kernel_lines.KernelLine._fields}
    fields["inlined"] = tuple(tuple(i) for i in d.get("inlined") or ())
    fields["offset"] = fields["offset"] or 0
    fields["function"] = fields["function"] or "?"
    k = _kernel_lines.KernelLine(**fields)
    return _kernel_lines.text(k)


def report_lines(err) -> List[str]:
    """The replay's lines of the short report (_errors.format_report, for an
    error whose mechanism is "replay"): the access, the others, what was not
    known, and how it was found."""
    r = getattr(err, "replay", None) or {}
    lines = []
    if getattr(err, "access_text", None):
        lines.append(err.access_text)
    if r.get("kernel_line"):
        lines += kernel_line_text(r["kernel_line"]).splitlines()
    if r.get("more"):
        lines.append(r["more"])
    if not r.get("torch") and r.get("torch_note"):
        lines.append("(%s: tensors are not named, only the allocations the Sanitizer saw)"
                     % r["torch_note"])
    if r.get("hook_error"):
        lines.append("(the live tensors could not be read: %s; checked against every "
                     "allocation instead)" % r["hook_error"])
    orig, n = r.get("original_launch"), r.get("launch") or 0
    if orig and orig != n:
        lines.append("found at launch #%s, not #%s as in the original run: the launches came in "
                     "another order (not deterministic)" % (_n(n), _n(orig)))
    lines.append("found by cuda-debug replay: launch #%s instrumented with NVIDIA's Sanitizer "
                 "API; the access was stopped before it happened" % _n(n))
    return lines
