"""What comes from another process, or from a job's store that anyone who can
reach MASTER_PORT may write: the dump document's shape, checked before any of
it is used (:func:`document_problem`), and text made safe for a terminal
(:func:`printable`, the rule the C report's writer, csrc/report/fd_writer.c,
applies). Used by cuda_debug/_dump.py (``dump PID``) and cuda_debug/_dump_job.py
(``dump --job``); imports nothing of the package.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import json
import math
from typing import Optional

FORMAT = "cuda_debug.dump"
VERSION = 1                       # csrc/report/report.h CD_DOC_VERSION


# -- JSON, bounded ----------------------------------------------------------------------

DEPTH_MAX = 32                    # a document nests 5 deep (doc, streams, entry, frames, frame)
INT_MAX = 1 << 64                 # every integer the C core writes fits in 64 bits


class OutOfBounds(ValueError):
    """JSON beyond what cuda_debug writes: too long, too deep, a number too large."""


def _int(text: str) -> int:
    if len(text) > 21:            # -(2**64) has 21 characters
        raise OutOfBounds("a number of %d digits" % len(text))
    v = int(text)
    if not -INT_MAX < v < INT_MAX:
        raise OutOfBounds("a number beyond 64 bits")
    return v


def _float(text: str) -> float:
    v = float(text)
    if not math.isfinite(v):
        raise OutOfBounds("a number beyond a double (%s...)" % text[:16])
    return v


def _constant(text: str):
    raise OutOfBounds("%s, not a number" % text)


def _depth(text) -> int:
    """How deep `text`'s arrays and objects nest (brackets inside strings do
    not count): without recursion."""
    if isinstance(text, (bytes, bytearray)):
        text = bytes(text).decode("utf-8", "surrogateescape")
    if text.count("[") + text.count("{") <= DEPTH_MAX:
        return 0                  # cannot nest deeper: not scanned
    import re
    deepest = depth = 0
    for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[\[\]{}]', text):
        c = m.group()
        if c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def loads(raw, most: int):
    """JSON that another process wrote, parsed within bounds: at most `most`
    bytes, nesting at most DEPTH_MAX deep, integers of 64 bits, finite
    numbers (no NaN, Infinity, 1e400). OutOfBounds (a ValueError: one line)
    beyond them, ValueError for what is not JSON; never
    RecursionError, never a number too large to print or to make a float."""
    if raw is None:
        raise ValueError("nothing")
    if len(raw) > most:
        raise OutOfBounds("%d bytes, more than %d" % (len(raw), most))
    if _depth(raw) > DEPTH_MAX:
        raise OutOfBounds("arrays or objects nested more than %d deep" % DEPTH_MAX)
    try:
        return json.loads(raw, parse_int=_int, parse_float=_float, parse_constant=_constant)
    except RecursionError:        # not reached after _depth; kept as the promise
        raise OutOfBounds("arrays or objects nested too deep") from None
    except (TypeError, UnicodeDecodeError) as e:
        raise ValueError(str(e)) from None


# -- what a document may hold -----------------------------------------------------------

_STR = (str, type(None))
_INT = (int, type(None))
_LAUNCH = {"seq": int, "stream": int, "kernel": _STR, "short": _STR, "collective": _STR,
           "graph": bool, "thread_id": int, "thread_name": _STR, "device": _INT,
           "age_ns": (int, float), "frames": list}
_TOP = {"pid": int, "rank": _INT, "time": (int, float), "text": _STR, "streams": list,
        "recent": (list, type(None))}
_OPTIONAL = {"rank", "text", "recent"}
# Fields a document may leave out, of one kind when present (null: as absent).
_MAYBE_TOP = {"culprit": int, "watching": bool, "world_size": int}
_MAYBE_STREAM = {"candidates": int, "graph_status": int, "graph_candidates": int,
                 "last_seq": int, "open_seq": int, "cbid": int}
_MAYBE_RECENT = {"done": int}
_WAIT = {"collective": _STR, "backend": _STR, "filename": _STR, "lineno": _INT,
         "function": _STR, "thread_id": _INT, "thread_name": _STR, "since": (int, float)}
_ENTRY = {"seq": (int, str, type(None)), "op": _STR, "state": _STR, "pg": (int, str, type(None))}


def _maybe_problem(d, spec, where) -> Optional[str]:
    for k, t in spec.items():
        v = d.get(k)
        if v is not None and (not isinstance(v, t) or (t is int and isinstance(v, bool))):
            return "%s whose %r is a %s" % (where, k, type(v).__name__)
    return None


def _frames_problem(frames) -> Optional[str]:
    for f in frames:
        if not (isinstance(f, list) and len(f) == 4 and isinstance(f[0], _STR) and
                isinstance(f[1], int) and isinstance(f[2], _STR) and isinstance(f[3], int)):
            return "a frame that is not [file, line, function, kind]"
    return None


def _fields_problem(d, spec, where, optional=()) -> Optional[str]:
    if not isinstance(d, dict):
        return "%s that is not an object" % where
    for k, t in spec.items():
        if k not in d:
            if k in optional:
                continue
            return "%s without %r" % (where, k)
        if not isinstance(d[k], t) or (t is int and isinstance(d[k], bool)):
            return "%s whose %r is a %s" % (where, k, type(d[k]).__name__)
    return None


def shown(value, most: int = 40) -> str:
    """A value another process sent, as a message quotes it: repr, printable,
    at most `most` characters."""
    r = printable(repr(value))
    return r if len(r) <= most else r[:most - 3] + "..."


def document_problem(doc) -> Optional[str]:
    """Why `doc` is not a dump document this cuda_debug can read (one phrase,
    after the sender's name: "sent ..."), or None."""
    if not isinstance(doc, dict):
        return "sent a JSON %s, not a dump document" % type(doc).__name__
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        return ("speaks another version of the dump (%s %s; this cuda_debug reads %s %d): run "
                "the dump of the cuda_debug it runs" % (
                    shown(doc.get("format")), shown(doc.get("version")), FORMAT, VERSION))
    problem = _fields_problem(doc, _TOP, "a document", _OPTIONAL) or \
        _maybe_problem(doc, _MAYBE_TOP, "a document")
    if not problem and doc["pid"] <= 0:
        problem = "a document whose pid is %d" % doc["pid"]
    launches = [("a stream", e, dict(_LAUNCH, queued=int), _MAYBE_STREAM)
                for e in doc["streams"]] if not problem else []
    launches += [("a recent launch", e, _LAUNCH, _MAYBE_RECENT)
                 for e in doc.get("recent") or ()] if not problem else []
    for where, e, spec, maybe in launches:
        problem = _fields_problem(e, spec, where) or _maybe_problem(e, maybe, where) or \
            _frames_problem(e["frames"])
        if not problem and e.get("graph_nodes") is not None:
            nodes = e["graph_nodes"]
            if not isinstance(nodes, list):
                problem = "a graph replay whose nodes are not a list"
            for n in nodes if not problem else ():
                problem = _fields_problem(n, {"node": int, "kernel": _STR, "short": _STR,
                                              "collective": _STR, "frames": list},
                                          "a graph node") or _frames_problem(n["frames"])
                if problem:
                    break
        if problem:
            break
    fr = doc.get("flight_recorder")
    if not problem and fr is not None:
        entries, waits = (fr.get("entries"), fr.get("cpu_waits")) if isinstance(fr, dict) \
            else (None, None)
        if not isinstance(fr, dict) or not isinstance(entries or [], list) or \
                not isinstance(waits or [], list) or \
                not all(isinstance(e, dict) and not _maybe_problem(e, _ENTRY, "")
                        for e in entries or ()) or \
                not all(isinstance(w, dict) and not _maybe_problem(w, _WAIT, "")
                        for w in waits or ()) or \
                not isinstance(fr.get("time", 0), (int, float)) or \
                isinstance(fr.get("time", 0), bool):
            problem = "a flight recorder that is not {time, entries: [...], cpu_waits: [...]}"
    return "sent %s" % problem if problem else None


# -- what reaches a terminal ------------------------------------------------------------

def printable(text: str, newlines: bool = False) -> str:
    """`text` from another process, safe for a terminal, as the C report
    writes such text (csrc/report/fd_writer.c): a control character (escape
    sequences: ESC, CSI, BEL...; C1 controls; format characters such as the
    bidirectional overrides) becomes '?', an undecodable byte (a lone
    surrogate, os.fsdecode's spelling) \\xNN; tabs, and newlines where
    `newlines`, stay."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable() or c == "\t" or (newlines and c == "\n"):
            out.append(c)
        elif "\udc80" <= c <= "\udcff":
            out.append("\\x%02x" % (ord(c) - 0xDC00))
        else:
            out.append("?")
    return "".join(out)
