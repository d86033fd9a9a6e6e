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
    CUDA_DEBUG_COMMIT=...          the commit benchmarks record (benchmarks/ only)
    CUDA_DEBUG_TEST_FRAME_READER=none  tests only: run as if this Python had no frame
                                   reader (read by the C core when it is imported)

An unknown name or value is warned about at import, naming the valid ones, and
the default is used.
"""
import os
import warnings
from typing import NamedTuple

_BOOL = {"1": True, "0": False, "on": True, "off": False, "true": True, "false": False,
         "yes": True, "no": False}
_CHOICES = {
    "CUDA_DEBUG_REPORT": (_BOOL, True),
    "CUDA_DEBUG_CAPTURE": (dict(_BOOL, stdio=True), True),
    "CUDA_DEBUG_WAIT": ({"sync": 0, "spin": 1, "none": 2}, 0),
    "CUDA_DEBUG_PROFILE": (_BOOL, False),
    "CUDA_DEBUG_CAPTURE_CHECK": (_BOOL, True),
    "CUDA_DEBUG_WATCH_OPS": (_BOOL, False),
}
_FREE = ("CUDA_DEBUG_COMMIT", "CUDA_DEBUG_TEST_FRAME_READER")


class Options(NamedTuple):
    report: bool
    capture: bool
    wait: int
    profile: bool
    capture_check: bool
    watch_ops: bool


def read(environ=os.environ) -> Options:
    values = {}
    for name, (table, default) in _CHOICES.items():
        raw = environ.get(name)
        if raw is None or raw == "":
            values[name] = default
            continue
        key = raw.strip().lower()
        if key not in table:
            warnings.warn("cuda_debug: %s=%r is not one of %s; using the default (%s)"
                          % (name, raw, "|".join(table), _default_name(table, default)),
                          RuntimeWarning, stacklevel=3)
            values[name] = default
        else:
            values[name] = table[key]
    known = set(_CHOICES) | set(_FREE)
    for name in environ:
        if name.startswith("CUDA_DEBUG_") and name not in known:
            warnings.warn("cuda_debug: unknown setting %s (known: %s)"
                          % (name, ", ".join(sorted(known))), RuntimeWarning, stacklevel=3)
    return Options(report=values["CUDA_DEBUG_REPORT"], capture=values["CUDA_DEBUG_CAPTURE"],
                   wait=values["CUDA_DEBUG_WAIT"], profile=values["CUDA_DEBUG_PROFILE"],
                   capture_check=values["CUDA_DEBUG_CAPTURE_CHECK"],
                   watch_ops=values["CUDA_DEBUG_WATCH_OPS"])


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
