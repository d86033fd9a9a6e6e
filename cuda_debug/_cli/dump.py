"""``cuda-debug dump``: the command line of cuda_debug/_dump.py (one process,
or a torchrun agent's ranks), cuda_debug/_dump_job.py (``--job``) and
cuda_debug/_dump_trace.py (``--trace``): what to ask, and what it prints.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import argparse
import json
import os
import sys
from typing import List, Optional

from .common import EXIT_ERROR, MODULE_PROG, UsageError, _exit_status, _parser, _usage_error


def _dump_parser(prog: str = MODULE_PROG) -> argparse.ArgumentParser:
    p = _parser(prog, "dump",
        "Print, here, every stream's oldest unfinished launch of processes that "
        "watch (%s run, cuda_debug.watch()): kernel or NCCL collective, launching "
        "line, age, launches queued behind it. The process answers from a thread "
        "of cuda_debug's, also while its Python threads are stuck in a CUDA call; "
        "no signal is sent, and its stderr gets nothing. A PID without cuda_debug "
        "whose child processes have it (a torchrun agent) is asked through them: "
        "each rank's report, then one verdict line. Exit status 0 when every "
        "process answered, 1 otherwise, 2 on a usage error." % prog)
    p.add_argument("pid", nargs="*", help="the process (several: each rank; a torchrun agent: "
                                          "its ranks)")
    p.add_argument("-p", "--pid", dest="pid_option", metavar="PID", action="append",
                   default=[], help="a process, as py-spy takes it (py-spy dump --pid PID): "
                                    "the same as PID")
    p.add_argument("--json", action="store_true",
                   help="print JSON instead: pid, rank, time, and one object per stream with "
                        "the fields of cuda_debug.in_flight() (several processes: "
                        "{\"ranks\": [...], \"verdict\": ...})")
    p.add_argument("--children", action="store_true",
                   help="ask the processes below each PID (its ranks), not the PID itself")
    p.add_argument("--trace", metavar="OUT.json",
                   help="also write the last launches as Chrome/Perfetto trace events (open in "
                        "ui.perfetto.dev or chrome://tracing)")
    p.add_argument("--last", metavar="N", type=int, default=None,
                   help="launches per process in the trace (default %d)" % 2000)
    p.add_argument("--job", metavar="HOST:PORT", nargs="?", const="",
                   help="every rank of a torchrun job, on any node, through the job's c10d "
                        "TCPStore (default: MASTER_ADDR:MASTER_PORT here); needs torch")
    p.add_argument("--timeout", metavar="S", type=float, default=None,
                   help="seconds to wait for each answer (default 5; --job: 10)")
    p.add_argument("--warps", action="store_true", default=None,
                   help="also where each running kernel's warps are (source line, how many, "
                        "spinning or at a barrier): cuda-gdb attaches for about a second, "
                        "twice, and detaches; the process runs on (default: CUDA_DEBUG_WARPS)")
    return p


def parse_dump(argv: List[str], parser: Optional[argparse.ArgumentParser] = None
               ) -> argparse.Namespace:
    """dump's command line, checked: argparse's own errors exit (SystemExit 2,
    said on stderr), ours raise UsageError. ``ns.pid``: the PIDs as typed
    (positional and --pid)."""
    ns = (parser or _dump_parser()).parse_args(argv)
    ns.pid = list(ns.pid) + list(ns.pid_option)
    if ns.last is not None and not 1 <= ns.last <= 65536:
        raise UsageError("--last takes 1 to 65536 launches")
    if ns.timeout is not None and not 0 < ns.timeout <= 3600:
        raise UsageError("--timeout takes seconds, more than 0 (at most 3600)")
    if ns.job is not None and (ns.pid or ns.children):
        raise UsageError("--job asks the ranks through the job's store: no PID, no --children")
    if ns.job is None and not ns.pid:
        raise UsageError("a PID is required (or --job)")
    return ns


def _say(where: str, message: str) -> None:
    """One line on stderr headed by the command as typed (``cuda-debug dump: ...``)."""
    sys.stderr.write("%s: %s\n" % (where, message))


def dump_main(argv: List[str], prog: str = MODULE_PROG) -> int:
    p = _dump_parser(prog)
    try:
        ns = parse_dump(argv, p)
    except SystemExit as e:
        return _exit_status(e.code)
    except UsageError as e:
        return _usage_error(p, str(e))
    from .. import _dump
    where = p.prog
    if ns.job is not None:
        from .. import _dump_job as _job
        try:
            host, port = _job.address(ns.job)
        except ValueError as e:
            return _usage_error(p, str(e))
        return _dump_job(host, port, where, as_json=ns.json, trace=ns.trace, last=ns.last,
                         timeout=ns.timeout)
    try:
        pids = [_dump.parse_pid(t) for t in ns.pid]
    except _dump.DumpError as e:
        _say(where, str(e))
        return EXIT_ERROR
    status, targets, ranked = 0, [], bool(ns.children) or len(pids) > 1
    for pid in pids:
        try:
            found, agent = _dump.targets(pid, ns.children)
        except _dump.DumpError as e:
            _say(where, str(e))
            status = EXIT_ERROR
            continue
        ranked = ranked or agent
        targets += [t for t in found if t not in targets]
    recent = (ns.last or _dump.RECENT_DEFAULT) if ns.trace else 1 if ranked else 0
    docs = []
    for pid in targets:
        try:
            docs.append(_dump.ask(pid, recent=recent, timeout=ns.timeout or _dump.TIMEOUT_S))
        except _dump.DumpError as e:
            _say(where, _dump.run_not_watching(pid, prog) or str(e))
            status = EXIT_ERROR
    docs.sort(key=lambda d: (d.get("rank") is None, d.get("rank") or 0, d["pid"]))
    # the user's say (--warps, CUDA_DEBUG_WARPS): it stops the process for a moment.
    # _warps is imported only then (a dump that drops its privileges reads no more files)
    if ns.warps or (ns.warps is None and os.environ.get("CUDA_DEBUG_WARPS", "").strip()):
        from .. import _warps
        if _warps.allowed(ns.warps):
            for d in docs:
                d["warps"] = _warps.warps(d["pid"])
    try:
        _print_dump(docs, ranked, ns.json)
        sys.stdout.flush()
    except BrokenPipeError:        # `dump PID | head`: the reader had enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return status
    if ns.trace and docs and not _write_dump_trace(ns.trace, docs, where):
        status = EXIT_ERROR
    return status


def _dump_job(host: str, port: int, where: str, as_json: bool = False,
              trace: Optional[str] = None, last: Optional[int] = None,
              timeout: Optional[float] = None) -> int:
    from .. import _dump, _dump_job as _job
    recent = (last or _dump.RECENT_DEFAULT) if trace else 1
    import time
    try:
        docs, missing = _job.ask_job(host, port, recent, timeout or _job.TIMEOUT_S)
    except (LookupError, OSError, ValueError) as e:
        _say(where, "--job %s:%d: %s" % (host, port, e))
        return EXIT_ERROR
    for r, (why, hang) in sorted(missing.items()):
        _say(where, "rank %d %s%s" % (r, why, "; its last hang report follows" if hang else ""))
    hangs = [hang for _, (_, hang) in sorted(missing.items()) if hang]
    if as_json:
        out = {"ranks": [_dump.as_json(d) for d in docs],
               "missing": {str(r): why for r, (why, _) in missing.items()},
               "last_hang_reports": [_dump.as_json(h) for h in hangs],
               "verdict": _dump.verdict(docs + hangs) if docs or hangs else None}
        print(json.dumps(out, indent=2))
    else:
        for d in docs:
            sys.stdout.write(_dump.prefixed(d))
        for h in hangs:
            sys.stdout.write(_dump.prefixed(h, "(its last hang report, %.0f s ago)\n" % (
                time.time() - float(h["time"])) + (h.get("text") or "")))
        if docs or hangs:
            for line in _dump.verdict_lines(docs + hangs):
                print(line)
    if trace and docs and not _write_dump_trace(trace, docs, where):
        return EXIT_ERROR
    return EXIT_ERROR if missing else 0


def _print_dump(docs, ranked: bool, as_json: bool) -> None:
    from .. import _dump
    if as_json:
        if ranked:
            out = {"ranks": [_with_warps(_dump.as_json(d), d) for d in docs],
                   "verdict": _dump.verdict(docs) if docs else None,
                   "flight_recorder": _dump.flight_recorder_lines(docs)}
        else:
            out = _with_warps(_dump.as_json(docs[0]), docs[0]) if docs else None
        if out is not None:
            print(json.dumps(out, indent=2))
        return
    for d in docs:
        sys.stdout.write(_dump.prefixed(d) if ranked else _dump.report_text(d))
        if "warps" in d:
            from .. import _warps
            text = "".join("  " + line + "\n" for line in _warps.lines(d["warps"]))
            text = "warps (cuda-gdb, two looks):\n" + text
            sys.stdout.write(_dump.prefixed(d, text) if ranked else text)
    if ranked and docs:
        for line in _dump.verdict_lines(docs):
            print(line)


def _with_warps(out: dict, doc: dict) -> dict:
    if "warps" in doc:
        out["warps"] = doc["warps"]
    return out


def _write_dump_trace(path: str, docs, where: str = MODULE_PROG + " dump") -> bool:
    """The trace written (said on stderr, with where); False (why, said) when not."""
    from .. import _dump_trace
    try:
        _dump_trace.write_trace(path, docs)
    except OSError as e:
        _say(where, "--trace %s: not written: %s" % (path, e.strerror or e))
        return False
    n = sum(len(d.get("recent") or ()) for d in docs)
    _say(where, "%d launches of %d process%s written to %s (open it in ui.perfetto.dev or "
                "chrome://tracing)" % (n, len(docs), "" if len(docs) == 1 else "es", path))
    return True

