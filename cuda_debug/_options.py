"""The CUDA_DEBUG_* switches: read once, when cuda_debug is imported, checked,
and handed to the C core before the first scope or watch opens.

    CUDA_DEBUG_REPORT=1|0          write the compact report to fd 2 at the fault (default 1)
    CUDA_DEBUG_CAPTURE=on|off      catch the device's assert text through a pass-through
                                   stderr (default on)
    CUDA_DEBUG_WAIT=sync|spin|none how a scope waits for a launch (none: measurements only)
    CUDA_DEBUG_PROFILE=0|1         time the launch callback (_core.stats())
    CUDA_DEBUG_CAPTURE_CHECK=1|0   0 skips the graph-capture check (measurements only)
    CUDA_DEBUG_WATCH_OPS=0|1       watch() records each launch's PyTorch op and input
                                   shapes, as watch(ops=True) (default 0)
    CUDA_DEBUG_GUARD=0|1           `python -m cuda_debug run` and pytest run inside
                                   cuda_debug.guard(), as run --guard / --cuda-guard
                                   (default 0)
    CUDA_DEBUG_COMMIT=...          the commit benchmarks record (benchmarks/ only)

An unknown name or value is warned about at import, naming the valid ones, and
the default is used. The warning points at the line that imported cuda_debug.

This module is imported by ``import cuda_debug``: it imports nothing that a bare
interpreter has not loaded already (``os``); ``warnings`` only to warn.
"""
import os
import sys

_BOOL = {"1": True, "0": False, "on": True, "off": False, "true": True, "false": False,
         "yes": True, "no": False}
_CHOICES = {
    "CUDA_DEBUG_REPORT": (_BOOL, True),
    "CUDA_DEBUG_CAPTURE": (_BOOL, True),
    "CUDA_DEBUG_WAIT": ({"sync": 0, "spin": 1, "none": 2}, 0),
    "CUDA_DEBUG_PROFILE": (_BOOL, False),
    "CUDA_DEBUG_CAPTURE_CHECK": (_BOOL, True),
    "CUDA_DEBUG_WATCH_OPS": (_BOOL, False),
    "CUDA_DEBUG_GUARD": (_BOOL, False),
}
_FREE = ("CUDA_DEBUG_COMMIT",)


class Options:
    """The checked switches (a plain class: ``typing.NamedTuple`` would cost
    ``import typing``, several ms, at every ``import cuda_debug``)."""

    __slots__ = ("report", "capture", "wait", "profile", "capture_check", "watch_ops", "guard")

    def __init__(self, report: bool, capture: bool, wait: int, profile: bool,
                 capture_check: bool, watch_ops: bool, guard: bool = False):
        self.report, self.capture, self.wait = report, capture, wait
        self.profile, self.capture_check, self.watch_ops = profile, capture_check, watch_ops
        self.guard = guard

    def __repr__(self):
        return "Options(%s)" % ", ".join("%s=%r" % (k, getattr(self, k)) for k in self.__slots__)


_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_IMPORTLIB = os.path.join(os.path.dirname(os.path.abspath(os.__file__)), "importlib") + os.sep


def _outside_frame():
    """The innermost frame of the caller that is neither cuda_debug's nor the
    import system's (``<frozen importlib._bootstrap>``, ``importlib/``): the
    line that imported cuda_debug, where a setting warning belongs."""
    frame = sys._getframe(1)
    while frame.f_back is not None:
        name = frame.f_code.co_filename
        if not (name.startswith("<frozen importlib") if name.startswith("<") else
                os.path.abspath(name).startswith((_PACKAGE, _IMPORTLIB))):
            break
        frame = frame.f_back
    return frame


def _warn(message: str) -> None:
    """A RuntimeWarning at the caller's line outside cuda_debug and importlib
    (what ``warnings.warn(stacklevel=...)`` does, with the level found by walking
    the frames: it depends on how cuda_debug was reached)."""
    import warnings
    frame = _outside_frame()
    g = frame.f_globals
    warnings.warn_explicit(message, RuntimeWarning, frame.f_code.co_filename, frame.f_lineno,
                           module=g.get("__name__", "<string>"),
                           registry=g.setdefault("__warningregistry__", {}))


def read(environ=os.environ) -> Options:
    values = {}
    for name, (table, default) in _CHOICES.items():
        raw = environ.get(name)
        if raw is None or raw == "":
            values[name] = default
            continue
        key = raw.strip().lower()
        if key not in table:
            _warn("cuda_debug: %s=%r is not one of %s; using the default (%s)"
                  % (name, raw, "|".join(table), _default_name(table, default)))
            values[name] = default
        else:
            values[name] = table[key]
    known = set(_CHOICES) | set(_FREE)
    for name in environ:
        if name.startswith("CUDA_DEBUG_") and name not in known:
            _warn("cuda_debug: unknown setting %s (known: %s)" % (name, ", ".join(sorted(known))))
    return Options(report=values["CUDA_DEBUG_REPORT"], capture=values["CUDA_DEBUG_CAPTURE"],
                   wait=values["CUDA_DEBUG_WAIT"], profile=values["CUDA_DEBUG_PROFILE"],
                   capture_check=values["CUDA_DEBUG_CAPTURE_CHECK"],
                   watch_ops=values["CUDA_DEBUG_WATCH_OPS"],
                   guard=values["CUDA_DEBUG_GUARD"])


def _default_name(table, default) -> str:
    for k, v in table.items():
        if v == default:
            return k
    return str(default)


OPTIONS = read()
_applied = False


def apply() -> None:
    """Hand the options to the C core (once, before the first scope opens)."""
    global _applied
    if _applied:
        return
    from . import _core
    _core.set_options(wait=OPTIONS.wait, capture=OPTIONS.capture, profile=OPTIONS.profile,
                      capture_check=OPTIONS.capture_check)
    _applied = True
