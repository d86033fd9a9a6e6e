"""``cuda-debug dump``: a watching process's unfinished launches, in the caller's terminal.

How it asks (csrc/hooks/dump_server.c): the first ``watch()`` of a process
starts a thread of cuda_debug's that listens on the abstract Unix socket
``@cuda_debug-dump-<pid>``. ``dump PID`` connects, checks that the listener
is PID (SO_PEERCRED), sends one line and reads back one JSON document
(csrc/report/inflight_doc.c): every stream's oldest unfinished launch, the
text block the dump signal would write, and on request the last launches.
No signal is sent and no memory of the target is read from outside: a process
that has not loaded cuda_debug, or has not opened ``watch()``, has no listener,
so it cannot be reached; the thread answers while the program's threads are
stuck in a CUDA call (with or without the GIL). The target's stderr gets
nothing: the report is the caller's (``kill -USR1 PID`` still writes it there).

Before connecting, the PID is checked: a positive number no larger than
``/proc/sys/kernel/pid_max``, a live process (not a zombie) of the caller's
own user, with cuda_debug's extension in ``/proc/PID/maps``. A process
without cuda_debug whose descendants have it (a torchrun agent) is asked
through them: every rank's report, each line prefixed ``[rank k]``, then one
verdict line (:func:`verdict`).

Also: ``--json`` (:func:`as_json`), ``--trace`` (Chrome/Perfetto trace events:
cuda_debug/_dump_trace.py), ``--job`` (cuda_debug/_dump_job.py: every rank of a job,
through its c10d TCPStore). The command line: cuda_debug/_cli/dump.py.

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import json
import os
import re
import socket
import struct
import time
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from ._untrusted import FORMAT, VERSION, document_problem, loads, printable  # noqa: F401 (ours too)

TIMEOUT_S = 5.0
DOC_MAX = 64 << 20


class DumpError(Exception):
    """Why a process cannot be asked: one line, printed as ``cuda_debug dump: <it>``."""


# -- which process ---------------------------------------------------------------------

_PID_TEXT = re.compile(r"[+-]?[0-9]+\Z")


def pid_max() -> int:
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 4194304              # Linux's PID_MAX_LIMIT


def parse_pid(text: str) -> int:
    """A PID as typed: a positive whole number naming one process, at most
    pid_max. -1 and 0 are refused by name: kill(2) reads them as every process
    the caller may signal and the caller's process group."""
    t = text.strip()
    if not _PID_TEXT.match(t):
        raise DumpError("%r is not a process id: a PID is a positive whole number" % text)
    v = int(t)
    if v == -1 or v == 0:
        raise DumpError("%s is not a process id: a PID is a positive number (to kill(2), %s "
                        "means %s; dump asks one process at a time)"
                        % (t, t, "every process you may signal" if v == -1
                           else "your own process group"))
    if v < 0:
        raise DumpError("%s is not a process id: a PID is a positive number" % t)
    top = pid_max()
    if v > top:
        raise DumpError("%s is not a process id: larger than the largest PID here (%d, "
                        "/proc/sys/kernel/pid_max)" % (t, top))
    return v


def _read(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            return f.read().decode("utf-8", "replace")
    except OSError:
        return None


def command_of(pid: int) -> str:
    # one line, whatever the command line holds (python -c with newlines in it)
    cmd = " ".join((_read("/proc/%d/cmdline" % pid) or "").replace("\0", " ").split())
    cmd = "".join(c if c.isprintable() else "?" for c in cmd)
    if not cmd:
        return ""
    return " (%s)" % (cmd if len(cmd) <= 80 else cmd[:77] + "...")


class Process(NamedTuple):
    pid: int
    ppid: int
    uid: int                      # real uid
    euid: int
    state: str                    # R, S, D, Z...
    command: str                  # " (cmdline)" or ""


def process(pid: int) -> Process:
    """/proc/PID/status (readable by anyone): DumpError when it is gone."""
    status = _read("/proc/%d/status" % pid)
    if status is None:
        raise DumpError("no process %d" % pid)
    fields = {}
    for line in status.splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    uids = (fields.get("Uid") or "-1 -1").split()
    return Process(pid=pid, ppid=int(fields.get("PPid") or 0), uid=int(uids[0]),
                   euid=int(uids[1]) if len(uids) > 1 else int(uids[0]),
                   state=(fields.get("State") or "?")[:1], command=command_of(pid))


def check_askable(p: Process) -> None:
    """Refuse, with the reason, what dump never asks: a zombie, another user's process."""
    what = "process %d%s" % (p.pid, p.command)
    if p.state in ("Z", "X"):
        raise DumpError("%s is a zombie: it has exited and its parent has not collected it; "
                        "there is nothing to ask" % what)
    me = os.geteuid()
    if me != 0 and (p.uid != me or p.euid != me):
        raise DumpError("%s is another user's (uid %d): dump asks only your own processes; "
                        "nothing was sent to it" % (what, p.euid if p.euid != me else p.uid))


_CORE = re.compile(r"/cuda_debug/_core[^/]*\.so\s*$")


def has_cuda_debug(pid: int) -> Optional[bool]:
    """Is cuda_debug's extension mapped into the process (/proc/PID/maps)?
    None: its map cannot be read."""
    try:
        with open("/proc/%d/maps" % pid, "rb") as f:
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    return any(_CORE.search(line) for line in text.splitlines())


def descendants(pid: int) -> List[int]:
    """Every process below `pid` (children, theirs...), in PID order."""
    kids: Dict[int, List[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        stat = _read("/proc/%s/stat" % name)
        if not stat:
            continue
        try:                        # "pid (comm) state ppid ...": comm may hold anything
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        except (ValueError, IndexError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), ()):
            if c != os.getpid():          # dump itself, run from a shell below the PID
                out.append(c)
            todo.append(c)
    return sorted(out)


def targets(pid: int, children: bool) -> Tuple[List[int], bool]:
    """(the processes to ask for `pid`, whether they are its ranks)."""
    proc = process(pid)
    check_askable(proc)
    has = has_cuda_debug(pid)
    if has is None:
        raise DumpError("not allowed to read /proc/%d/maps (process %d%s is not "
                        "dumpable): not asked" % (pid, pid, proc.command))
    if has and not children:
        return [pid], False
    # The topmost processes with cuda_debug below it (its ranks), not their own
    # children (DataLoader workers forked by a rank have its extension mapped too).
    procs = {}
    for c in descendants(pid):
        try:
            p = process(c)
            check_askable(p)
        except DumpError:
            continue
        if has_cuda_debug(c):
            procs[c] = p
    ranks = [c for c, p in procs.items() if p.ppid not in procs]
    if ranks:
        return ranks, True
    raise DumpError(
        "process %d%s has %s: nothing was sent to it" % (
            pid, proc.command, "no process below it with cuda_debug loaded" if children else
            "not loaded cuda_debug (no cuda_debug/_core in /proc/%d/maps), nor has any process "
            "below it" % pid))


def _is_run(cmdline: List[str]) -> bool:
    """Is this command line ``cuda-debug run ...`` or ``python -m cuda_debug run ...``?"""
    for i, word in enumerate(cmdline[:-1]):
        if cmdline[i + 1] == "run" and (os.path.basename(word) == "cuda-debug" or (
                word == "cuda_debug" and i and cmdline[i - 1] == "-m")):
            return True
    return False


def run_not_watching(pid: int, prog: str) -> Optional[str]:
    """For a process started by ``run`` that does not answer (its dump listener
    is not there): why, since suggesting ``run`` would not help. Else None."""
    from . import _core
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            cmdline = f.read().decode("utf-8", "replace").split("\0")
    except OSError:
        return None
    if not _is_run(cmdline):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(b"\0" + _core.dump_listener(pid)[1])
        return None                           # it listens: the error was another one
    except OSError:
        pass
    finally:
        s.close()
    return ("process %d%s runs under `run`, and does not answer: `run` could not watch "
            "(no usable GPU or CUPTI there: it said so on its stderr, then ran the script "
            "unwatched), or its CUDA_DEBUG_DUMP is off; `%s doctor` says what this machine "
            "lacks" % (pid, command_of(pid), prog))


# -- asking one process ----------------------------------------------------------------

ANSWER_HEAD = b"cuda_debug dump answer "       # csrc/hooks/dump_server.c: then <bytes>\n
UNIX_LISTENING = 0x10000                       # /proc/net/unix Flags: __SO_ACCEPTCON


def _peer_pid(s: socket.socket) -> int:
    return struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                            struct.calcsize("3i")))[0]


def _socket_inodes(pid: int) -> Optional[set]:
    """The inodes of the sockets process `pid` holds (/proc/PID/fd); None
    when its fds cannot be read."""
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:
        return None
    out = set()
    for fd in fds:
        try:
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
        except OSError:
            continue
        if link.startswith("socket:[") and link.endswith("]"):
            out.add(link[8:-1])
    return out


def fallback_names(pid: int, name: bytes, most: int = 16) -> List[bytes]:
    """The names a listener takes when its own (`name`) was taken before it
    started: ``name-<random hex>`` (csrc/hooks/dump_server.c), found among the
    listening abstract sockets (/proc/net/unix) that process `pid` itself
    holds (its /proc/PID/fd); where its fds cannot be read, every listening
    one so named (the caller checks each listener's pid all the same)."""
    mine = _socket_inodes(pid)
    want = "@" + name.decode() + "-"
    out = []
    try:
        with open("/proc/net/unix") as f:
            next(f, None)
            for line in f:
                cols = line.split(None, 7)
                if len(cols) < 8 or not cols[7].startswith(want):
                    continue
                path = cols[7].rstrip("\n")
                tail = path[len(want):]
                try:
                    listening = int(cols[3], 16) & UNIX_LISTENING
                except ValueError:
                    continue
                if listening and re.fullmatch(r"[0-9a-f]{16}", tail) and \
                        (mine is None or cols[6] in mine):
                    out.append(path[1:].encode())
    except OSError:
        return []
    return out[:most]


def _connect(pid: int, name: bytes, what: str, deadline: float) -> socket.socket:
    """A connection to the listener of process `pid`, checked to be that
    process (SO_PEERCRED): its own name first, then a fallback name it holds.
    Nothing is sent to a listener that is another process."""
    impostor = None
    candidates = [name]
    tried_fallback = False
    while candidates:
        n = candidates.pop(0)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.settimeout(max(0.05, min(1.0, deadline - time.monotonic())))
            s.connect(b"\0" + n)
            peer = _peer_pid(s)
        except (ConnectionRefusedError, FileNotFoundError, socket.timeout):
            s.close()
            peer = None
        except OSError as e:
            s.close()
            raise DumpError("%s: %s" % (what, e)) from None
        if peer == pid:
            return s
        if peer is not None:
            s.close()
            impostor = impostor or peer
        if not candidates and not tried_fallback:
            tried_fallback = True
            candidates = fallback_names(pid, name)
    if impostor is not None:
        raise DumpError("the listener named for %s is another process (pid %d): not asked"
                        % (what, impostor))
    raise DumpError("%s has cuda_debug loaded but does not answer: it has not opened "
                    "watch() (python -m cuda_debug run, cuda_debug.watch()) since it "
                    "started, its CUDA_DEBUG_DUMP is off, or it runs in another network "
                    "namespace (a container)" % what)


def _read_answer(s: socket.socket, what: str, deadline: float) -> bytes:
    """The listener's answer: a line with its length, then that many bytes (a
    listener of an older cuda_debug sends the document alone and closes)."""
    buf, want = bytearray(), None
    while want is None or len(buf) < want:
        left = deadline - time.monotonic()
        if left <= 0:
            raise socket.timeout()
        s.settimeout(left)
        b = s.recv(1 << 16)
        if not b:
            if want is None and buf[:1] == b"{":
                return bytes(buf)          # an older listener: the end of the file ends it
            raise DumpError("%s closed the connection %s" % (
                what, "before answering" if want is None and not buf else
                "after %d of %s bytes" % (len(buf), want if want is not None else "?")))
        buf += b
        if want is None and buf[:1] != b"{":
            nl = buf.find(b"\n")
            if nl < 0:
                if len(buf) > 64:
                    raise DumpError("%s answered something that is not a dump (%s...)"
                                    % (what, printable(bytes(buf[:32]).decode("utf-8", "replace"))))
                continue
            head, rest = bytes(buf[:nl]), buf[nl + 1:]
            if not head.startswith(ANSWER_HEAD) or not head[len(ANSWER_HEAD):].isdigit():
                raise DumpError("%s answered something that is not a dump (%s)"
                                % (what, printable(head[:64].decode("utf-8", "replace"))))
            want = int(head[len(ANSWER_HEAD):])
            if want > DOC_MAX:
                raise DumpError("%s would send %d bytes, more than %d MiB: not read"
                                % (what, want, DOC_MAX >> 20))
            buf = rest
        if len(buf) > DOC_MAX:
            raise DumpError("%s sent more than %d MiB: cut" % (what, DOC_MAX >> 20))
    return bytes(buf[:want])


def ask(pid: int, recent: int = 0, timeout: float = TIMEOUT_S) -> dict:
    """The document of process `pid`'s dump listener (checked first with
    check_askable and has_cuda_debug). DumpError when it cannot answer."""
    from . import _core
    _, name = _core.dump_listener(pid)
    what = "process %d%s" % (pid, command_of(pid))
    deadline = time.monotonic() + timeout
    s = _connect(pid, name, what, deadline)
    try:
        s.sendall(b"cuda_debug dump %d recent=%d\n" % (VERSION, max(0, int(recent))))
        raw = _read_answer(s, what, deadline)
    except socket.timeout:
        raise DumpError("%s did not answer within %.0f s" % (what, timeout)) from None
    except OSError as e:
        raise DumpError("%s: %s" % (what, e)) from None
    finally:
        s.close()
    try:
        doc = loads(raw, DOC_MAX)
    except ValueError as e:
        raise DumpError("%s sent a document that is not JSON (%s)" % (what, e)) from None
    problem = document_problem(doc)
    if problem:
        raise DumpError("%s %s" % (what, problem))
    return doc


def report_text(doc: dict) -> str:
    """The document's text block, for a terminal."""
    return printable(doc.get("text") or "", newlines=True)


def local_document(recent: int = 0) -> dict:
    """This process's own document (the one its listener sends)."""
    from . import _core
    return json.loads(_core.dump_document(recent))


def records(doc: dict):
    """The document's streams as cuda_debug.InFlight records, oldest first."""
    from . import _hangs, _locations
    return [_hangs.record(seq=e["seq"], stream=e["stream"], kernel=e["kernel"] or "",
                          short=e["short"], collective=e["collective"], graph=e["graph"],
                          thread_id=e["thread_id"], thread_name=e["thread_name"],
                          device=e["device"], stack=_locations.stack_from_frames(e["frames"]),
                          age_ns=e["age_ns"], queued=e["queued"],
                          candidates=e.get("candidates", 1), **_graph_fields(e))
            for e in doc.get("streams", ())]


def _graph_fields(e: dict) -> dict:
    """A graph replay's candidates from the document (inflight_doc.c)."""
    if not e.get("graph") or e.get("graph_nodes") is None:
        return {}
    from . import _graph_names, _locations
    nodes = tuple(dict(node=n["node"], kernel=n["kernel"] or "", short=n["short"],
                       collective=n["collective"], annotation=None,
                       captured_at=_locations.where(_locations.stack_from_frames(n["frames"])))
                  for n in e["graph_nodes"])
    status = e.get("graph_status")
    return {"graph_nodes": nodes,
            "graph_note": None if nodes else _graph_names.GRAPH_NOTES.get(status)}


def as_json(doc: dict) -> dict:
    """``dump --json`` of one process: pid, rank, time, and one object per
    stream with the fields of cuda_debug.in_flight()'s records."""
    streams = []
    for r in records(doc):
        d = r._asdict()
        d["stack"] = [list(f) for f in d["stack"]]
        streams.append(d)
    out = {"pid": doc["pid"], "rank": doc.get("rank"), "time": doc["time"],
           "watching": doc.get("watching"), "streams": streams}
    extra = doc.get("flight_recorder")
    if isinstance(extra, dict):
        if "entries" in extra:
            out["flight_recorder"] = {k: v for k, v in extra.items() if k != "cpu_waits"}
        if extra.get("cpu_waits"):
            out["cpu_waits"] = extra["cpu_waits"]
    return out


def label(doc: dict) -> str:
    return "rank %d" % doc["rank"] if doc.get("rank") is not None else "pid %d" % doc["pid"]


def prefixed(doc: dict, text: Optional[str] = None) -> str:
    """The report's text, each line prefixed ``[rank k]`` (``[pid N]`` without a
    rank), for a terminal (printable())."""
    pfx = "[%s] " % label(doc)
    text = doc.get("text") or "" if text is None else text
    return "".join(pfx + printable(line) + "\n" for line in text.splitlines())


# -- one verdict for many ranks -------------------------------------------------------

def _where(r) -> str:
    if r.filename:
        return "%s:%s" % (r.filename, r.lineno)
    return "no Python line"


def _what(r) -> str:
    if r.graph and r.graph_node is not None:
        name = "%s (%s)" % (r.collective, r.short) if r.collective else r.short or r.kernel
        return "%s, node %d of a CUDA graph%s" % (
            name, r.graph_node, " (one of %d nodes)" % len(r.graph_nodes)
            if len(r.graph_nodes) > 1 else "")
    if r.graph:
        return "a CUDA graph replay"
    if r.collective:
        return "%s (%s)" % (r.collective, r.short or r.kernel)
    return r.short or r.kernel or "?"


def _last_launch(doc: dict):
    recent = doc.get("recent") or []
    if not recent:
        return None
    from . import _hangs, _locations
    e = recent[-1]
    return _hangs.record(seq=e["seq"], stream=e["stream"], kernel=e["kernel"] or "",
                         short=e["short"], collective=e["collective"], graph=e["graph"],
                         thread_id=e["thread_id"], thread_name=e["thread_name"],
                         device=e["device"], stack=_locations.stack_from_frames(e["frames"]),
                         age_ns=e["age_ns"], queued=0)


class CpuWait(NamedTuple):
    """A rank that waits in a torch.distributed collective on the CPU, with no
    GPU launch in flight (a gloo collective; cuda_debug/_dump_job.py cpu_waits)."""
    collective: str
    backend: Optional[str]
    filename: Optional[str]
    lineno: Optional[int]
    age_s: float                  # seen there since, up to the dump
    stale_s: float                # how old the rank's snapshot was at the dump
    short: str = ""
    kernel: str = ""
    graph: bool = False


def cpu_wait(doc: dict) -> Optional[CpuWait]:
    """The oldest collective a thread of the rank waits in on the CPU, from the
    snapshot its job thread hands down (doc["flight_recorder"]["cpu_waits"]),
    or None."""
    extra = doc.get("flight_recorder")
    waits = extra.get("cpu_waits") if isinstance(extra, dict) else None
    if not isinstance(waits, list) or not waits or not isinstance(waits[0], dict):
        return None
    w = waits[0]
    try:
        now, snap, since = float(doc["time"]), float(extra["time"]), float(w["since"])
        lineno = w.get("lineno")
        if not w.get("collective"):
            return None
        return CpuWait(collective=str(w["collective"]),
                       backend=str(w["backend"]) if w.get("backend") else None,
                       filename=str(w["filename"]) if w.get("filename") else None,
                       lineno=int(lineno) if lineno is not None else None,
                       age_s=max(0.0, now - since), stale_s=max(0.0, now - snap))
    except (KeyError, TypeError, ValueError):
        return None


def _coll(r) -> str:
    """The collective a rank waits in: NCCL's (its kernel), or "gloo all_reduce"."""
    if isinstance(r, CpuWait) and r.backend:
        return "%s %s" % (r.backend, r.collective)
    return r.collective


def _at(n: str, r) -> str:
    """"rank k at file:line" of a waiting rank; ", on the CPU for N s" for a CpuWait."""
    if not isinstance(r, CpuWait):
        return "%s at %s" % (n, _where(r))
    return "%s at %s, on the CPU for %.1f s%s" % (
        n, _where(r), r.age_s, " (its last snapshot %.0f s before this dump)" % r.stale_s
        if r.stale_s > 6.0 else "")


def _names(labels: Sequence[str]) -> str:
    labels = list(labels)
    if len(labels) == 1:
        return labels[0]
    nums = [l.split(" ", 1)[1] for l in labels]
    kind = "ranks" if all(l.startswith("rank ") for l in labels) else "processes"
    return "%s %s" % (kind, ", ".join(nums))


def verdict(docs: Sequence[dict]) -> str:
    """One line for a job: the rank that stalls it (its oldest unfinished
    launch is a compute kernel while the others wait in a collective: that
    rank, kernel and line), or the collective some ranks have not joined
    (each rank's line), or that the ranks disagree on the collective. A rank
    with nothing unfinished on the GPU whose Python waits in a collective (a
    gloo one: :func:`cpu_wait`) counts as waiting in it, "on the CPU"."""
    oldest = []
    for doc in docs:
        recs = records(doc)        # else: a collective waited for on the CPU (gloo)?
        oldest.append((label(doc), recs[0] if recs else cpu_wait(doc), doc))
    compute = [(n, r) for n, r, _ in oldest if r is not None and not r.collective]
    waiting = [(n, r) for n, r, _ in oldest if r is not None and r.collective]
    idle = [(n, d) for n, r, d in oldest if r is None]
    if not compute and not waiting:
        return "verdict: no %s has an unfinished launch: the job is not stuck on the GPU" % (
            "rank" if len(docs) > 1 else "process")
    colls = sorted({_coll(r) for _, r in waiting})
    if compute and waiting:
        stall = "; ".join("%s in %s at %s (unfinished for %.1f s)"
                          % (n, _what(r), _where(r), r.age_s) for n, r in compute)
        wait = "; ".join(_at(n, r) for n, r in waiting)
        return "verdict: %s stall%s the job: %s, while %s wait%s in %s (%s)" % (
            _names([n for n, _ in compute]), "s" if len(compute) == 1 else "", stall,
            _names([n for n, _ in waiting]), "s" if len(waiting) == 1 else "",
            " / ".join(colls), wait)
    if waiting and idle:
        lines = []
        for n, d in idle:
            last = _last_launch(d)
            lines.append("%s has nothing unfinished%s" % (
                n, "; its last launch: %s at %s" % (_what(last), _where(last)) if last else
                " (no launch recorded)"))
        return "verdict: %s not joined %s: %s wait%s in it (%s); %s" % (
            "a collective was" if len(colls) > 1 else "%s was" % colls[0],
            "by " + _names([n for n, _ in idle]), _names([n for n, _ in waiting]),
            "s" if len(waiting) == 1 else "",
            "; ".join(_at(n, r) for n, r in waiting), "; ".join(lines))
    if waiting and len(colls) > 1:
        return "verdict: the ranks wait in different collectives: %s" % "; ".join(
            "%s in %s at %s" % (n, _coll(r), _where(r)) for n, r in waiting)
    if waiting:
        if all(isinstance(r, CpuWait) for _, r in waiting):   # one backend: one name
            hint = "the network or %s itself: TORCH_DISTRIBUTED_DEBUG=DETAIL says more" % (
                waiting[0][1].backend or "the backend")
        else:
            hint = "the network or NCCL itself: NCCL_DEBUG=INFO says more"
        return ("verdict: every rank waits in %s (%s): all joined it and it does not finish "
                "(%s)" % (colls[0], "; ".join(_at(n, r) for n, r in waiting), hint))
    busy = "; ".join("%s in %s at %s (unfinished for %.1f s)" % (n, _what(r), _where(r), r.age_s)
                     for n, r in compute)
    if idle:
        return "verdict: %s: %s; %s %s nothing unfinished" % (
            "a compute kernel does not finish", busy, _names([n for n, _ in idle]),
            "has" if len(idle) == 1 else "have")
    return "verdict: no collective is waited for: %s" % busy


def flight_recorder_lines(docs: Sequence[dict]) -> List[str]:
    """Per rank whose NCCL flight recorder is on (TORCH_NCCL_TRACE_BUFFER_SIZE):
    its last collectives, sequence number, op and state."""
    out = []
    for doc in docs:
        fr = doc.get("flight_recorder") or {}
        entries = fr.get("entries") or []
        if not entries:
            continue
        out.append("  flight recorder, %s (%.0f s ago): %s" % (
            label(doc), max(0.0, float(doc["time"]) - float(fr.get("time") or doc["time"])),
            ", ".join("#%s %s %s" % (e.get("seq"), e.get("op"), e.get("state"))
                      for e in entries)))
    return out


def verdict_lines(docs: Sequence[dict]) -> List[str]:
    """The verdict, then the flight recorders' last collectives where they are
    on: lines for a terminal (the names in them are the targets': printable())."""
    return [printable(line) for line in [verdict(docs)] + flight_recorder_lines(docs)]


RECENT_DEFAULT = 2000
