"""A timeline of the last launches: Chrome/Perfetto trace events (the JSON
object format torch.profiler exports), from the documents cuda_debug/_dump.py
reads (``dump --trace``, ``dump --job --trace``) or this process's own ring at
its first sticky fault (CUDA_DEBUG_TRACE, from cuda_debug/_report.py). Open
the file in ui.perfetto.dev or chrome://tracing.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import json
import os
import sys
from typing import Dict, List, Optional, Sequence

from . import _dump
from ._untrusted import VERSION


def trace_events(docs: Sequence[dict], culprit: Optional[Dict[int, int]] = None) -> dict:
    """Chrome/Perfetto trace events (the JSON object format torch.profiler
    exports) of the documents' last launches: per process (one per rank) a
    track per stream and one per launching thread; each launch is an event
    with its kernel (a collective named as such) and Python line. The ring
    records when a launch was made and whether its completion marker came
    back, not when it ran: a finished launch is an instant on its stream's
    track, an unfinished one a slice from its launch to the dump, the culprit
    (per process: `culprit` {pid: seq}, else its oldest unfinished launch)
    named so. Timestamps are wall-clock microseconds, so ranks line up."""
    events = []
    culprit = culprit or {}
    for doc in docs:
        pid = doc["pid"]
        t_doc = float(doc["time"]) * 1e6
        bad = culprit.get(pid, doc.get("culprit"))
        unfinished = {e["seq"]: e for e in doc.get("streams", ())}
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": "%s (pid %d)" % (_dump.label(doc), pid)}})
        launches = list(doc.get("recent") or [])
        seen = {e["seq"] for e in launches}
        launches += [e for s, e in unfinished.items() if s not in seen]
        launches.sort(key=lambda e: e["seq"])
        tracks: Dict[tuple, int] = {}
        threads: Dict[int, bool] = {}
        for e in launches:
            key = (e["stream"], e["device"], e["thread_id"] if e["stream"] == 2 else 0)
            if key not in tracks:
                tracks[key] = tid = 1000000000 + len(tracks)
                events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                               "args": {"name": "stream %#x%s" % (
                                   e["stream"], " (device %d)" % e["device"]
                                   if e["device"] is not None and e["device"] >= 0 else "")}})
                events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                               "args": {"sort_index": len(tracks)}})
            if e["thread_id"] not in threads:
                threads[e["thread_id"]] = True
                events.append({"ph": "M", "name": "thread_name", "pid": pid,
                               "tid": e["thread_id"], "args": {"name": "thread %s (tid %d)" % (
                                   e.get("thread_name") or "?", e["thread_id"])}})
        for e in launches:
            from . import _locations
            stack = _locations.stack_from_frames(e["frames"])
            fs = _locations.user_frame(stack, complete=False)
            line = "%s:%s in %s" % (fs.filename, fs.lineno, fs.name) if fs else None
            name = "a CUDA graph replay" if e["graph"] else \
                "%s (%s)" % (e["collective"], e["short"]) if e["collective"] else \
                (e["short"] or e["kernel"] or "?")
            state = "unfinished" if e["seq"] in unfinished else \
                {1: "finished", 0: "unfinished", -1: "unknown", -2: "context gone"}.get(
                    e.get("done"), "unknown")
            is_culprit = e["seq"] == bad
            cat = "graph" if e["graph"] else "collective" if e["collective"] else "kernel"
            args = {"seq": e["seq"], "kernel": e["kernel"], "line": line, "state": state,
                    "stream": "%#x" % e["stream"], "thread_id": e["thread_id"]}
            if e["collective"]:
                args["collective"] = e["collective"]
            if is_culprit:
                args["culprit"] = True
                name = "CULPRIT " + name
            if e["seq"] in unfinished:
                args["queued_behind"] = unfinished[e["seq"]]["queued"]
            ts = t_doc - e["age_ns"] / 1e3
            key = (e["stream"], e["device"], e["thread_id"] if e["stream"] == 2 else 0)
            track = tracks[key]
            if state == "unfinished":
                events.append({"ph": "X", "name": name, "cat": cat + ",unfinished", "pid": pid,
                               "tid": track, "ts": ts, "dur": max(t_doc - ts, 1.0),
                               "args": args})
            else:
                events.append({"ph": "i", "s": "t", "name": name, "cat": cat, "pid": pid,
                               "tid": track, "ts": ts, "args": args})
            events.append({"ph": "i", "s": "t", "name": "launch " + name, "cat": "launch",
                           "pid": pid, "tid": e["thread_id"], "ts": ts,
                           "args": {"seq": e["seq"], "line": line, "stream": args["stream"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"producer": "cuda_debug dump", "version": VERSION}}


def write_trace(path: str, docs: Sequence[dict], culprit: Optional[Dict[int, int]] = None) -> None:
    """The trace events of `docs`, written to `path` whole or not at all: into
    a temporary file of an unpredictable name in `path`'s folder, created
    with O_CREAT | O_EXCL | O_NOFOLLOW, mode 0600 (tempfile.mkstemp: never
    another user's file or a link planted there), then renamed over `path`
    (a link at `path` is replaced, not followed). OSError (the temporary
    file removed) when it cannot be written, or `path` is a folder."""
    import tempfile
    data = json.dumps(trace_events(docs, culprit))
    if os.path.isdir(path):
        raise IsADirectoryError(21, "a folder, not a file to write", path)
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".cuda_debug-trace-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


_FAULT_TRACE: List[str] = []


def trace_at_fault(culprit_seq: int) -> None:
    """CUDA_DEBUG_TRACE=path: the ring's last launches as a trace, at the
    first sticky fault reported while watching (once per process)."""
    from . import _options
    path = _options.OPTIONS.trace
    if not path or _FAULT_TRACE:
        return
    _FAULT_TRACE.append(path)
    try:
        doc = _dump.local_document(_dump.RECENT_DEFAULT)
        write_trace(path, [doc], {doc["pid"]: culprit_seq} if culprit_seq else None)
    except (OSError, ValueError) as e:
        sys.stderr.write("cuda_debug: CUDA_DEBUG_TRACE=%s: the trace was not written: %s\n"
                         % (path, e))
