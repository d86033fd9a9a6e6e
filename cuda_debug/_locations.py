"""Which frames are the user's, and stacks as ``traceback.StackSummary``.

One rule, one implementation: ``csrc/capture/frames.c`` (``cd_file_kind``)
classifies a file name as user code, library code or a pseudo-file, when the
C launch callback first sees a code location, and Python asks the same
function (``_core.file_kind``), so the fd-2 block written by C and the Python
exception always agree. The rule:

- ``<stdin>``, ``<ipython-input-...>``, ``<ipython-...>``: user code;
  ``<string>`` (``python -c``, but also code made with ``exec``): the user's only
  as the outermost frame; any other ``<...>`` (``<frozen runpy>``, FX's
  ``<eval_with_key>``): library;
- Cython sources (``.pyx``, ``.pxd``, ``.pxi``, reported as relative paths):
  library;
- a path with ``site-packages`` or ``dist-packages`` in it: library;
- the path resolved (a relative one against the current folder, symbolic links
  followed) inside a library folder (:func:`library_prefixes`): library;
- anything else, a relative ``train.py`` included: user code;
- but a code object of a user file that TorchDynamo made to run a
  ``torch.compile``'d function (it calls the compiled graph, a global named
  ``__compiled_fn_...``): ``LOC_COMPILED``. Its line is the ``def`` (or
  ``@torch.compile``) line, none the user wrote; the user's line is its
  caller's. C classifies code objects too (``_core.code_kind``).

Python hands the folders to C once (:func:`configure`).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import os
import sys
import traceback
import types
from typing import Optional

from . import _core

#: Pseudo-files that hold the user's own code (interactive input).
USER_PSEUDO = ("<stdin>", "<ipython-input-", "<ipython-")


def library_prefixes():
    """Folders whose code is library code: the standard library, every
    site-packages, cuda_debug itself, and where PyTorch Inductor writes its
    generated code."""
    import site
    import sysconfig
    import tempfile
    paths = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        p = sysconfig.get_paths().get(key)
        if p:
            paths.add(p)
    try:
        paths.update(site.getsitepackages())
    except AttributeError:
        pass
    paths.add(os.path.dirname(os.path.abspath(__file__)))
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not inductor:
        try:
            import getpass
            inductor = os.path.join(tempfile.gettempdir(), "torchinductor_" + getpass.getuser())
        except Exception:
            inductor = None
    if inductor:
        paths.add(inductor)
    real = {os.path.realpath(p) for p in paths}
    return sorted(real, key=len, reverse=True)


_configured = False


def configure():
    """Give C the library folders and user pseudo-files, once per process
    (before the first scope; C keeps the first configuration)."""
    global _configured
    if not _configured:
        _core.configure_frames(library_prefixes(), list(USER_PSEUDO))
        _configured = True


def file_kind(filename):
    """``_core.LOC_USER``, ``LOC_LIBRARY`` or ``LOC_PSEUDO`` (``<string>``)."""
    configure()
    return _core.file_kind(filename or "")


def is_user_file(filename, outermost=False):
    """Is `filename` the user's code? (The rule is in the module docstring.)
    ``<string>`` counts only as the `outermost` frame."""
    kind = file_kind(filename)
    return kind == _core.LOC_USER or (outermost and kind == _core.LOC_PSEUDO)


class Frame(traceback.FrameSummary):
    """A FrameSummary that knows its kind, as C gave it (``LOC_COMPILED``
    cannot be told from the file name)."""
    __slots__ = ("kind",)

    def __init__(self, filename, lineno, name, kind, **kw):
        super().__init__(filename, lineno, name, lookup_line=False, **kw)
        self.kind = kind


def frame_kind(fs):
    """The kind of a FrameSummary (its own, else its file's)."""
    kind = getattr(fs, "kind", None)
    return file_kind(fs.filename) if kind is None else kind


def is_user_frame(fs, outermost=False):
    kind = frame_kind(fs)
    return kind == _core.LOC_USER or (outermost and kind == _core.LOC_PSEUDO)


def stack_from(tb=None, frame=None):
    """The stack of a traceback (the frames above its first frame, then the
    traceback down to where it was raised), or of `frame`; outermost first."""
    pairs = []
    if tb is not None:
        outer = list(traceback.walk_stack(tb.tb_frame.f_back))
        pairs = outer[::-1] + list(traceback.walk_tb(tb))
    elif frame is not None:
        pairs = list(traceback.walk_stack(frame))[::-1]
    stack = traceback.StackSummary.extract(pairs, lookup_lines=True)
    for i, (f, _) in enumerate(pairs):
        if _core.code_kind(f.f_code) == _core.LOC_COMPILED:
            fs = stack[i]
            stack[i] = Frame(fs.filename, fs.lineno, fs.name, _core.LOC_COMPILED, line=fs.line)
    return stack


def holds_line(tb, filename, lineno):
    """Does the traceback `tb` pass through line `lineno` of `filename`?"""
    return any(f.f_code.co_filename == filename and n == lineno
               for f, n in traceback.walk_tb(tb))


def traceback_through(outer: Optional[types.TracebackType],
                      inner: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    """The traceback `inner` (of an exception caught in some frame) with the
    entries of `outer` (a later exception that passed through that frame)
    above that frame: the path from the user's outermost frame down to where
    `inner` was raised."""
    import types
    above = []
    t = outer
    while t is not None and t.tb_frame is not inner.tb_frame:
        above.append(t)
        t = t.tb_next
    if t is None:
        return inner
    for e in reversed(above):
        inner = types.TracebackType(inner, e.tb_frame, e.tb_lasti, e.tb_lineno)
    return inner


def location(loc_id):
    """(filename, function, lineno, kind) of a C location id, or None."""
    return _core.location(loc_id)


def stack_from_ids(ids):
    """A StackSummary (outermost first) from C location ids (innermost first)."""
    entries = []
    for loc_id in reversed(ids):
        loc = location(loc_id)
        if loc is None:
            continue
        filename, function, lineno, kind = loc
        entries.append(Frame(filename or "?", lineno, function or "?", kind))
    stack = traceback.StackSummary.from_list(entries)
    for fs in stack:
        fs.line                       # linecache, now (the file may change later)
    return stack


def stack_from_frames(frames):
    """A StackSummary (outermost first) from (filename, lineno, function, kind)
    entries, innermost first: the frames another process's C core resolved
    and sent (cuda_debug/_dump.py), classified there, by that process's rule.
    Rendered as given: the file is another process's word (SPEC section 19),
    never opened or read here (no linecache: a FIFO would hang the caller,
    /dev/zero fill its memory, a file the caller may read and the sender may
    not would be printed), so a frame has no source line (``line`` None)."""
    return traceback.StackSummary.from_list(
        [ForeignFrame(f or "?", n, fn or "?", k) for f, n, fn, k in reversed(frames)])


class ForeignFrame(Frame):
    """A frame another process sent: its file is a name, not a file of ours
    (no source line is looked up for it)."""
    __slots__ = ()

    def __init__(self, filename, lineno, name, kind):
        super().__init__(filename, lineno, name, kind, line="")

    @property
    def line(self):
        return None


def user_frame(stack, complete=True):
    """The innermost frame of user code (else the outermost frame a
    torch.compile'd function ran in; else the last one)."""
    n = len(stack)
    for i in range(n - 1, -1, -1):
        if is_user_frame(stack[i], outermost=complete and i == 0):
            return stack[i]
    compiled = [fs for fs in stack if frame_kind(fs) == _core.LOC_COMPILED]
    return compiled[0] if compiled else stack[-1] if n else None


def compiled_frame(stack, complete=True):
    """The frame TorchDynamo ran for a torch.compile'd function inside the
    user frame of `stack` (the launch happened in its compiled graph), or None."""
    n = len(stack)
    for i in range(n - 1, -1, -1):
        fs = stack[i]
        if frame_kind(fs) == _core.LOC_COMPILED:
            return fs
        if is_user_frame(fs, outermost=complete and i == 0):
            return None
    return None


def where(stack):
    """"file:line in function" of the user frame of `stack` (by the frames'
    kinds: a frame TorchDynamo ran is not the user's), None without one; a
    module's frame without "in <module>"."""
    fs = user_frame(stack) if stack else None
    if fs is None:
        return None
    s = "%s:%s" % (fs.filename, fs.lineno)
    if fs.name and fs.name != "<module>":
        s += " in %s" % fs.name
    return s


def merged_ids(frames, inner=()):
    """A record's frame ids (innermost first) with `inner`, more of the launching
    thread's innermost ids (a graph node's), merged in before the record's outer
    ones (the torch.compile'd frame, the user's)."""
    return tuple(inner) + tuple(i for i in frames if i not in inner) if inner else tuple(frames)


def current_frame(depth: int = 1) -> "types.FrameType":
    """The caller's frame, `depth` levels above the function calling this."""
    return sys._getframe(depth + 1)
