"""The progress line: one line on stderr, rewritten in place, with the
configuration being measured and an ETA. On by default where a person is
watching (stderr is a terminal, or a notebook); off when stderr is piped;
``progress=True/False`` forces it, a callable receives (done, total, text).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md)."""
import math
import sys
import time
from typing import Callable, Optional, Union

ProgressArg = Union[None, bool, Callable[[int, int, str], None]]


def in_notebook() -> bool:
    """True inside a Jupyter kernel (IPython's ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:
        return False
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def is_tty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:
        return False


def format_duration(seconds: float) -> str:
    """``9s``, ``1m05s``, ``2h03m``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return "%ds" % s
    if s < 3600:
        return "%dm%02ds" % (s // 60, s % 60)
    return "%dh%02dm" % (s // 3600, (s % 3600) // 60)


def eta_seconds(done: int, total: int, elapsed: float) -> Optional[float]:
    """Remaining time if the rest goes at the pace so far (None before the first step)."""
    if done <= 0 or total <= 0:
        return None
    return elapsed / done * max(total - done, 0)


def format_line(done: int, total: int, text: str, elapsed: float, width: int = 0) -> str:
    """``[3/48] bf16 rr=on 4096 scope | 12s, ETA 3m10s``, cut to `width` (0: no cut)."""
    eta = eta_seconds(done, total, elapsed)
    line = "[%d/%d] %s | %s, ETA %s" % (min(done + 1, total), total, text,
                                        format_duration(elapsed), format_duration(eta))
    if done >= total:
        line = "[%d/%d] done in %s" % (total, total, format_duration(elapsed))
    if width and len(line) > width:
        line = line[:max(width - 1, 1)] + "…"
    return line


class Progress:
    """`total` steps. ``show(text)`` before a step (the line names what runs
    now), ``step()`` after it, ``close()`` at the end."""

    def __init__(self, total: int, progress: ProgressArg = None, stream=None,
                 prefix: str = ""):
        self.total = max(int(total), 0)
        self.done = 0
        self.prefix = prefix
        self.stream = stream if stream is not None else sys.stderr
        self.callback = progress if callable(progress) else None
        self.in_place = is_tty(self.stream) or in_notebook()
        if self.callback is not None:
            self.enabled = False
        elif progress is None:
            self.enabled = self.in_place
        else:
            self.enabled = bool(progress)
        self.t0 = time.monotonic()
        self._last_len = 0
        self._text = ""

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def _write(self, line: str, final: bool = False) -> None:
        if self.in_place:
            pad = max(self._last_len - len(line), 0)
            self.stream.write("\r" + line + " " * pad + ("\n" if final else ""))
            self._last_len = 0 if final else len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def show(self, text: str) -> None:
        self._text = self.prefix + text
        if self.enabled and self.done < self.total:
            self._write(format_line(self.done, self.total, self._text, self.elapsed,
                                    width=_terminal_width() if self.in_place else 0))

    def step(self, text: Optional[str] = None) -> None:
        self.done = min(self.done + 1, self.total)
        if self.callback is not None:
            self.callback(self.done, self.total, self.prefix + text if text else self._text)

    def close(self) -> None:
        if self.enabled and self.total:
            self._write(format_line(self.done, self.total, self._text, self.elapsed)
                        if self.done < self.total else
                        format_line(self.total, self.total, "", self.elapsed), final=True)


def _terminal_width() -> int:
    try:
        import shutil
        return max(shutil.get_terminal_size((100, 20)).columns - 1, 20)
    except Exception:
        return 99
