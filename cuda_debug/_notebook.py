"""IPython / Jupyter extension: ``%load_ext cuda_debug``.

One magic per mode, each a line magic (``on`` / ``off``: every cell from here on;
alone: switches it, as ``%pdb`` does; each prints its state the same way, ``cuda_watch:
on``) and a cell magic (``%%...``: this cell only):

- ``%cuda_watch on|off`` / ``%%cuda_watch``: ``cuda_debug.watch()``: kernels stay
  asynchronous, and a fault that surfaces later names its launching cell and line.
- ``%cuda_guard on|off`` / ``%%cuda_guard``: ``cuda_debug.guard()``: an index,
  label or probability that would make a kernel assert raises a GuardError in
  its cell, before anything runs, and the kernel lives on.
- ``%cuda_launch_blocking on|off`` / ``%%cuda_launch_blocking [--all-threads]``:
  ``cuda_debug.launch_blocking()``; in line mode every cell from here on (the
  rest of this one included) runs inside a scope, entered before the cell and
  left after it, so CUPTI is free for profilers between cells.
  ``%launch_blocking`` / ``%%launch_blocking`` are its old names (aliases).
- cuda_debug errors render as the short report (what, which kernel, which cell
  line, the device's assert text, which otherwise goes to the kernel's fd 2
  and never reaches the notebook) instead of a long traceback.
- A framework's exception (``torch.AcceleratorError``, CuPy's
  ``CUDADriverError``...) becomes cuda_debug's exception (the one IPython
  keeps: ``sys.last_value``, ``%debug``, ``error_in_exec``) when cuda_debug
  recorded the fault behind it; when it names a sticky error cuda_debug did not
  see, it renders as its first line, where it was reported, and what to do.
- Without a GPU (or CUPTI) the magics say so, once for each reason, and run the
  code without the scope, as ``run`` and the pytest plugin do. Messages name
  the magic as it was typed.

The full traceback stays available: ``import traceback;
traceback.print_exception(sys.last_value)``.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import ast
import contextlib
import sys
from typing import List, Optional

from . import _core, _locations, _options, _report, _sticky
from ._errors import CudaError, GuardError

_RED, _BOLD, _RESET = "\x1b[0;31m", "\x1b[1m", "\x1b[0m"


class _State:
    def __init__(self, shell):
        self.shell = shell
        self.every_cell = False        # %cuda_launch_blocking on
        self.every_cell_name = "cuda_launch_blocking"   # as typed
        self.all_threads = False
        self.cell_scope = None         # the scope of the running cell (every_cell mode)
        self.seq_seen = _core.fault_seq()
        self.custom_exc = False        # our handler is IPython's custom exception handler
        self.watch = None              # the watch() of %cuda_watch on
        self.kept = None               # (framework's exception, ours): the cell's, translated
        self.said = set()              # why a scope could not be had, said once each


_state: Optional[_State] = None


def _make_scope(all_threads: bool = False):
    """The scope the magics enter (a seam for tests without a GPU)."""
    from ._scope import launch_blocking
    return launch_blocking(True, all_threads=all_threads)


# -- rendering ------------------------------------------------------------------------

def _color(shell) -> bool:
    scheme = str(getattr(shell, "colors", "NoColor") or "NoColor")
    return scheme.lower() != "nocolor"


def _cell_label(shell, filename: Optional[str]) -> Optional[str]:
    """``Cell In[3]`` for a notebook cell's code name, else None."""
    if not filename or shell is None:
        return None
    comp = getattr(shell, "compile", None)
    number = getattr(comp, "_filename_map", {}).get(filename)
    if number is not None:
        return "Cell In[%s]" % number
    fmt = getattr(comp, "format_code_name", None)
    if fmt is not None:
        try:
            res = fmt(filename)
        except Exception:
            res = None
        if res:
            return "%s %s" % res
    return None


def _relocate(text: str, shell, filename, lineno, function) -> str:
    """``at /tmp/ipykernel_1/123.py:3 in <module>:`` -> ``at Cell In[2], line 3:``"""
    label = _cell_label(shell, filename)
    if not label or lineno is None:
        return text
    old = "at %s:%s" % (filename, lineno)
    new = "at %s, line %s" % (label, lineno)
    if function == "<module>" and old + " in <module>" in text:
        old += " in <module>"    # a cell's top level needs no "in <module>"
    return text.replace(old, new, 1)


def render(err: CudaError, shell=None) -> List[str]:
    """The short report of `err` as IPython structured-traceback lines."""
    shell = shell if shell is not None else (_state.shell if _state else None)
    text = "%s: %s" % (type(err).__name__, err)
    text = _relocate(text, shell, err.filename, err.lineno, err.function)
    lines = text.splitlines() or [type(err).__name__]
    if _color(shell):
        name, _, rest = lines[0].partition(":")
        lines[0] = "%s%s%s:%s" % (_RED, name, _RESET, rest)
    if _state is not None and getattr(err, "sticky", False):
        _state.seq_seen = max(_state.seq_seen, _core.fault_seq())
    return lines


def _render_traceback_(self):
    """IPython calls this instead of formatting a traceback (installed on
    CudaError while the extension is loaded)."""
    return render(self)


def _user_frame(tb):
    """(filename, lineno, function, line) of the innermost user frame of `tb`."""
    stack = _locations.stack_from(tb=tb)
    fs = _locations.user_frame(stack)
    if fs is None:
        return None, None, None, None
    return fs.filename, fs.lineno, fs.name, fs.line


def translate(value, tb) -> Optional[CudaError]:
    """cuda_debug's exception for a framework's (chained to it, with its
    traceback) when cuda_debug recorded a new sticky fault behind it or the
    watch ring names one; else None."""
    from ._scope import watch_epoch
    st = _state
    seen = st.seq_seen if st else 0
    err = _report.error_for(value, mark=seen, watch_mark=watch_epoch(), found_at="cell")
    if err is None or not err.sticky:
        return None
    if st:
        st.seq_seen = _core.fault_seq()
    err.__cause__ = value
    return err.with_traceback(tb)


def framework_report(value, tb, shell=None) -> Optional[List[str]]:
    """Short-report lines for a framework's exception that names a sticky
    error cuda_debug did not see (else None: IPython's own traceback). One it
    saw becomes cuda_debug's exception (:func:`translate`)."""
    code = _sticky.sticky_code(value)
    if code is None:
        return None
    filename, lineno, function, line = _user_frame(tb)
    head = _sticky.first_line(value)
    out = [head]
    if filename:
        where = "reported at %s:%s" % (filename, lineno)
        if function and function != "<module>":
            where += " in %s" % function
        where = _relocate(where, shell, filename, lineno, function)
        out.append("  %s%s" % (where, (":  " + line.strip()) if line else ""))
    out += [
        "  %s: a sticky CUDA error. Kernels run asynchronously: the faulting kernel was "
        "launched earlier, not necessarily on this line." % _sticky.describe(code),
        "  To name the kernel, the line and the assert text: restart the kernel, then "
        "%cuda_watch on (kernels stay asynchronous), or run the cell under "
        "%%cuda_launch_blocking.",
        "  " + _errors_restart(),
    ]
    if _color(shell):
        name, _, rest = out[0].partition(":")
        out[0] = "%s%s%s:%s" % (_RED, name, _RESET, rest)
    return out


def _errors_restart() -> str:
    from ._errors import RESTART
    return RESTART


def _custom_exc(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler for RuntimeError (frameworks raise
    subclasses of it): our exception and report when there is one (the
    exception IPython keeps: sys.last_value, %debug, the cell's
    ExecutionResult.error_in_exec, as a scope's would be); else IPython's own."""
    stb = None
    if not isinstance(value, CudaError):
        try:
            err = translate(value, tb)
        except Exception:
            err = None
        if err is not None:
            lines = render(err, shell) + ["  (raised as %s)" % _sticky.first_line(value)]
            err._render_traceback_ = lambda: lines
            if _state is not None:
                _state.kept = (value, err)      # for the ExecutionResult (_post_run_cell)
            shell.showtraceback((type(err), err, tb), tb_offset=tb_offset)
            return None
        try:
            stb = framework_report(value, tb, shell)
        except Exception:
            stb = None
    if stb is not None:
        try:
            value._render_traceback_ = lambda: stb   # showtraceback uses it
        except Exception:
            shell._showtraceback(etype, value, stb)
            return None
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    return None


# -- magics ---------------------------------------------------------------------------

#: the magics' names: (line and cell magic, its old names)
LAUNCH_BLOCKING = ("cuda_launch_blocking", ("launch_blocking",))
WATCH = ("cuda_watch", ())
GUARD = ("cuda_guard", ())


# the words the CUDA_DEBUG_* switches take (_options._BOOL): one vocabulary
_ON = tuple(w for w, on in _options._BOOL.items() if on)
_OFF = tuple(w for w, on in _options._BOOL.items() if not on)


def _switch(words: List[str], name: str, now: bool, more: str = "") -> bool:
    """The state a line magic's words ask for: on, off, or alone the other one
    (as %pdb toggles). UsageError for anything else."""
    from IPython.core.error import UsageError
    if not words:
        return not now
    if len(words) == 1 and words[0].lower() in _ON + _OFF:
        return words[0].lower() in _ON
    raise UsageError("usage: %%%s [on|off]%s (alone: switches it)" % (name, more))


def state_line(name: str, on: bool, detail: Optional[str] = None) -> str:
    """What every line magic prints once it ran, in one form: ``cuda_watch: on``
    (the magic as typed; `detail` in parentheses after "on")."""
    return "%s: %s" % (name, ("on (%s)" % detail if detail else "on") if on else "off")


def _status(name: str = LAUNCH_BLOCKING[0]) -> str:
    on = _state is not None and _state.every_cell
    return state_line(name, on, "all threads" if on and _state.all_threads else None)


def _running_cell_number(shell) -> int:
    """The In[n] of the cell running now: the number IPython cached the cell's
    code under, found from the frame that runs it. (``shell.execution_count``
    is n in IPython 8 but n + 1 in IPython 9 while the cell runs.)"""
    fmap = getattr(shell.compile, "_filename_map", {})
    f = sys._getframe(1)
    while f is not None:
        n = fmap.get(f.f_code.co_filename)
        if n is not None:
            return n
        f = f.f_back
    return shell.execution_count


def _entered(scope, magic: str) -> bool:
    """Enter `scope`; where it cannot be had (no GPU, no CUPTI, a profiler
    holds it) say so once and return False: the code then runs without it,
    the rule of every entry point that wraps code (``run``, the plugin)."""
    from ._errors import CudaUnavailableError, ToolConflictError
    try:
        scope.__enter__()
        return True
    except (CudaUnavailableError, ToolConflictError) as e:
        text = "cuda_debug: %s runs without %s: %s" % (
            magic, getattr(scope, "_what", "a scope"), e)
        if _state is not None and text not in _state.said:
            _state.said.add(text)
            print(text, file=sys.stderr)
        return False


@contextlib.contextmanager
def _scope_or_not(scope, magic: str):
    """`with scope:` where it can be had, else the body alone (said once)."""
    if not _entered(scope, magic):
        yield
        return
    try:
        yield
    except BaseException as e:
        if not scope.__exit__(type(e), e, e.__traceback__):
            raise
    else:
        scope.__exit__(None, None, None)


def _run_cell_body(shell, cell: str, all_threads: bool, scope=None, magic="%%launch_blocking"):
    """Run a cell's body in a scope; its last expression is the magic's value
    (displayed as Out[n]). Line numbers are the cell's, magic line included."""
    number = _running_cell_number(shell)
    source = shell.transform_cell(cell)
    source = "\n" + source       # line 1 of the cell is the %%launch_blocking line
    name = shell.compile.cache(source, number)
    tree = shell.compile.ast_parse(source, filename=name)
    tree = shell.transform_ast(tree)
    if tree is None:
        return None
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = shell.compile(ast.Module(tree.body, type_ignores=[]), name, "exec")
    tail = shell.compile(last, name, "eval") if last is not None else None
    ns = shell.user_ns
    with _scope_or_not(scope if scope is not None else _make_scope(all_threads), magic):
        exec(body, shell.user_global_ns, ns)
        if tail is not None:
            return eval(tail, shell.user_global_ns, ns)
    return None


def _launch_blocking_magic(line: str, cell: Optional[str] = None,
                           name: str = LAUNCH_BLOCKING[0]):
    """%cuda_launch_blocking on|off (every cell) / %%cuda_launch_blocking
    [--all-threads] (one cell) / %cuda_launch_blocking (switches it). Old name:
    %launch_blocking."""
    from IPython.core.error import UsageError
    shell = _state.shell
    words = line.split()
    all_threads = "--all-threads" in words
    words = [w for w in words if w != "--all-threads"]
    if cell is not None:
        if words:
            raise UsageError("%%%%%s takes only --all-threads, not %s" % (name, " ".join(words)))
        return _run_cell_body(shell, cell, all_threads, magic="%%" + name)
    # alone it switches (with --all-threads alone: on, for every thread)
    on = True if all_threads and not words else \
        _switch(words, name, _state.every_cell, " [--all-threads]")
    if on:
        if _state.every_cell and _state.all_threads != all_threads:
            _exit_cell_scope()
        _state.all_threads = all_threads
        _state.every_cell_name = name
        if _state.cell_scope is None:
            scope = _make_scope(all_threads)
            if _entered(scope, "%%%s on" % name):
                _state.cell_scope = scope  # the rest of this cell too
        _state.every_cell = _state.cell_scope is not None
    else:
        _state.every_cell = False
        _exit_cell_scope()
    print(_status(name))
    return None


def _enter_cell_scope():
    scope = _make_scope(_state.all_threads)
    scope.__enter__()
    _state.cell_scope = scope


def _exit_cell_scope():
    scope, _state.cell_scope = _state.cell_scope, None
    if scope is not None:
        scope.__exit__(None, None, None)


def _pre_run_cell(*args):
    if _state is None or not _state.every_cell or _state.cell_scope is not None:
        return
    try:
        _enter_cell_scope()
    except CudaError as e:
        _state.every_cell = False
        print("cuda_debug: %%%s is now off: %s: %s" % (_state.every_cell_name, type(e).__name__, e),
              file=sys.stderr)


def _post_run_cell(*args):
    if _state is None:
        return
    kept, _state.kept = _state.kept, None
    result = args[0] if args else None
    if kept is not None and getattr(result, "error_in_exec", None) is kept[0]:
        result.error_in_exec = kept[1]
    if _state.cell_scope is None:
        return
    try:
        _exit_cell_scope()
    except CudaError as e:
        # A fault whose exception the cell swallowed: say it now.
        _state.shell.showtraceback((type(e), e, e.__traceback__))


def _cuda_watch_magic(line: str, cell: Optional[str] = None, name: str = WATCH[0]):
    """%cuda_watch on|off: keep cuda_debug.watch() open across cells (kernels
    stay asynchronous; a fault that surfaces in any later cell names its
    launching cell and line). %%cuda_watch watches one cell. %cuda_watch alone
    switches it, as %pdb does."""
    from IPython.core.error import UsageError
    words = line.split()
    if cell is not None:
        if words:
            raise UsageError("%%%%%s takes no arguments, not %s" % (name, " ".join(words)))
        from ._scope import watch
        return _run_cell_body(_state.shell, cell, False, scope=watch(), magic="%%" + name)
    if _switch(words, name, _state.watch is not None):
        if _state.watch is None:
            from ._scope import watch
            scope = watch()
            if _entered(scope, "%%%s on" % name):
                _state.watch = scope
    else:
        scope, _state.watch = _state.watch, None
        if scope is not None:
            scope.__exit__(None, None, None)
    print(state_line(name, _state.watch is not None))
    return None


_guard_region = None            # the guard() of %cuda_guard on


def _cuda_guard_magic(line: str, cell: Optional[str] = None, name: str = GUARD[0]):
    """%cuda_guard on|off: keep cuda_debug.guard() open across cells (the
    listed ops check their inputs; a bad one raises GuardError in its cell and
    nothing is launched). %%cuda_guard guards one cell. %cuda_guard alone
    switches it, as %pdb does."""
    global _guard_region
    from IPython.core.error import UsageError
    from ._guard import guard
    words = line.split()
    if cell is not None:
        if words:
            raise UsageError("%%%%%s takes no arguments, not %s" % (name, " ".join(words)))
        return _run_cell_body(_state.shell, cell, False, scope=guard(), magic="%%" + name)
    on = _switch(words, name, _guard_region is not None)
    if on and _guard_region is None:
        _guard_region = guard()
        _guard_region.__enter__()
    elif not on and _guard_region is not None:
        region, _guard_region = _guard_region, None
        region.__exit__(None, None, None)
    print(state_line(name, _guard_region is not None))
    return None


def _render_guard_(self):
    return render(self)


# -- load / unload --------------------------------------------------------------------

_MAGICS = ((_launch_blocking_magic, LAUNCH_BLOCKING), (_cuda_watch_magic, WATCH),
           (_cuda_guard_magic, GUARD))


def _as_typed(fn, typed: str):
    """`fn` registered under the name `typed`: its messages name it so."""
    def magic(line: str, cell: Optional[str] = None):
        return fn(line, cell, name=typed)
    magic.__name__ = magic.__qualname__ = typed
    magic.__doc__ = fn.__doc__
    return magic


def magic_names() -> List[str]:
    """Every magic the extension registers (each a line and a cell magic)."""
    return [typed for _, (name, aliases) in _MAGICS for typed in (name,) + aliases]


def load(ipython) -> None:
    global _state
    if _state is not None and _state.shell is ipython:
        return
    _state = _State(ipython)
    for fn, (name, aliases) in _MAGICS:
        for typed in (name,) + aliases:
            ipython.register_magic_function(_as_typed(fn, typed), "line_cell", typed)
    CudaError._render_traceback_ = _render_traceback_
    GuardError._render_traceback_ = _render_guard_
    if not ipython.custom_exceptions:
        ipython.set_custom_exc((RuntimeError,), _custom_exc)
        _state.custom_exc = True
    ipython.events.register("pre_run_cell", _pre_run_cell)
    ipython.events.register("post_run_cell", _post_run_cell)


def unload(ipython) -> None:
    global _state
    if _state is None:
        return
    try:
        _exit_cell_scope()
        if _state.watch is not None:
            _state.watch.__exit__(None, None, None)
    finally:
        for event, fn in (("pre_run_cell", _pre_run_cell), ("post_run_cell", _post_run_cell)):
            try:
                ipython.events.unregister(event, fn)
            except ValueError:
                pass
        if _state.custom_exc:
            ipython.set_custom_exc((), None)
        if "_render_traceback_" in CudaError.__dict__:
            del CudaError._render_traceback_
        _unload_guard(ipython.magics_manager.magics)
        magics = ipython.magics_manager.magics
        for typed in magic_names():
            magics["line"].pop(typed, None)
            magics["cell"].pop(typed, None)
        _state = None


def _unload_guard(magics) -> None:
    global _guard_region
    region, _guard_region = _guard_region, None
    if region is not None:
        region.__exit__(None, None, None)
    if "_render_traceback_" in GuardError.__dict__:
        del GuardError._render_traceback_
