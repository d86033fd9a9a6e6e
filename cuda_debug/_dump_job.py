"""``cuda-debug dump --job``: every rank of a torchrun job, from any node, through
the job's own c10d TCPStore (the one torchrun runs at MASTER_ADDR:MASTER_PORT;
cuda_debug runs no server of its own).

Each rank that watches under torchrun (MASTER_ADDR, MASTER_PORT and RANK set)
starts one daemon thread (:func:`start`) with a store client of its own
(cuda_debug/_dump_tcpstore.py: the store's wire protocol, so neither side needs
PyTorch importable). It registers the rank (``cuda_debug/dump/rank/<r>``: pid, host,
world size), then every POLL_S seconds reads the request counter
``cuda_debug/dump/requests`` (one ``add(key, 0)``) and the count of hang
reports its watcher wrote. A new request is answered with the rank's in-flight
document (``cuda_debug/dump/answer/<n>/<r>``: the JSON that ``dump PID`` reads,
csrc/report/inflight_doc.c, built without the GIL); a new hang report is
published as ``cuda_debug/dump/hang/<r>``, so a rank whose Python cannot answer
later (its GIL held forever) still has its last hang report in the store.

``dump --job`` (:func:`ask_job`; cuda_debug/_cli/dump.py prints) adds 1 to the
counter, waits for each registered rank's answer, and prints what ``dump`` of
an agent prints: each rank's report prefixed ``[rank k]``, then the verdict;
for a rank that did not answer, its last hang report when there is one.

The same thread hands the C core, every POLL_S seconds, what only Python sees
(:func:`_snapshot`): NCCL's flight recorder's last collectives, and which of
the rank's threads wait inside a torch.distributed collective on the CPU
(:func:`cpu_waits`: a gloo collective, or an NCCL one before its kernel is
launched), so that the verdict of a dump can name a rank that has no GPU
launch in flight but waits in a collective (cuda_debug/_dump.py).

PYTEST_DONT_REWRITE: pytest loads this package's plugin in every run (docs/pytest.md).
"""
import json
import os
import socket
import sys
import threading
import time
from typing import List

from ._untrusted import OutOfBounds, document_problem, loads, printable, shown

PREFIX = "cuda_debug/dump/"
POLL_S = 2.0
TIMEOUT_S = 10.0
REGISTRATION = "cuda_debug.dump.rank"   # the format of a rank's registration (rank/<r>)
RECENT_MAX = 65536                       # csrc/hooks/dump_server.c RECENT_MAX
WORLD_MAX = 1 << 17                      # ranks a job may have, for dump --job

_started = []


def _store(host: str, port: int, timeout: float):
    from ._dump_tcpstore import Client
    return Client(host, port, timeout)


def wanted() -> bool:
    """Under torchrun (or anything that sets what it sets)."""
    env = os.environ
    return bool(env.get("MASTER_ADDR") and env.get("MASTER_PORT", "").isdigit() and
                env.get("RANK", "").isdigit())


def start() -> None:
    """The rank's publisher thread (once per process; again in a forked child)."""
    if _started and _started[0] == os.getpid():
        return
    _started[:] = [os.getpid()]
    t = threading.Thread(target=_publish, name="cuda_debug-job", daemon=True)
    t.start()


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name) or default)
    except ValueError:
        return default


def requested_recent(raw) -> int:
    """How many recent launches a request asks for (``params/<n>``: what
    ``dump --job`` wrote, or whatever else anyone who can reach the store put
    there): 0 to RECENT_MAX, else 1."""
    try:
        params = loads(raw, PARAMS_MAX)
    except ValueError:
        return 1
    recent = params.get("recent", 1) if isinstance(params, dict) else None
    if not isinstance(recent, int) or isinstance(recent, bool) or not 0 <= recent <= RECENT_MAX:
        return 1
    return recent


PARAMS_MAX = 4096                  # bytes of a request's params/<n> read
ANSWERS_KEPT = 2                   # a rank's answers left in the store (the newest)
BACKOFF_MAX_S = 60.0               # the longest wait before connecting again


class _Publisher:
    """The rank's side of ``dump --job``: its connection to the store, the
    requests it has seen, its answers still in the store."""

    def __init__(self, rank: int, world: int):
        self.rank, self.world = rank, world
        self.store = None
        self.seen = 0              # the newest request taken
        self.hangs = None          # the hang reports counted so far
        self.failures = 0          # connections lost or refused in a row
        self.next_try = 0.0        # time.monotonic() of the next connection attempt
        self.answered = []         # this rank's answer keys in the store, oldest first

    def drop(self) -> None:
        """The connection lost: the next attempt after a wait that doubles
        with each failure in a row (POLL_S, 2 POLL_S... BACKOFF_MAX_S), and is
        never given up (a store that comes back, a long job's hiccups)."""
        if self.store is not None:
            try:
                self.store.close()
            except Exception:
                pass
        self.store = None
        self.failures += 1
        self.next_try = time.monotonic() + min(BACKOFF_MAX_S,
                                               POLL_S * (1 << min(self.failures - 1, 8)))


def _publish() -> None:
    """The thread's loop. Whatever the store holds, it neither dies nor writes
    to the program's stderr: what it reads is data (bounded parses, checked
    values: requested_recent), anything going wrong costs the connection (a
    new one later: _Publisher.drop), never the thread, and never the rank's
    answers to later requests."""
    p = _Publisher(_env_int("RANK", -1), _env_int("WORLD_SIZE", 0))
    while True:
        try:
            _publish_once(p)
        except Exception:          # never the program's: its stderr gets nothing of ours
            p.drop()
        time.sleep(POLL_S)


def _publish_once(p: "_Publisher") -> None:
    """One poll: connect when it is time (registering), answer a new
    request, publish a new hang report."""
    from . import _core
    env = os.environ
    if p.hangs is None:
        p.hangs = _core.hang_state()[1]
    _snapshot()
    if p.store is None and time.monotonic() >= p.next_try:
        try:
            p.store = _store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), TIMEOUT_S)
            # The requests so far, read before the registration is published:
            # a request made once a client sees this rank registered is newer
            # (read after it, a request in between was taken as answered).
            p.seen = int(p.store.add(PREFIX + "requests", 0))
            p.store.set(PREFIX + "rank/%d" % p.rank, json.dumps(
                {"format": REGISTRATION, "version": 1, "pid": os.getpid(),
                 "host": socket.gethostname(), "world_size": p.world}))
        except OSError:
            p.drop()               # not up yet, or gone: again later
            return
    if p.store is None:
        return
    try:
        _poll(p)
    except (OSError, ValueError):
        p.drop()                   # the job's store went away, or spoke nonsense
        return
    p.failures = 0                 # a whole poll: the connection is good


def _poll(p: "_Publisher") -> None:
    from . import _core
    from ._dump_tcpstore import TooLarge
    store = p.store
    n = int(store.add(PREFIX + "requests", 0))
    if n > p.seen:
        p.seen = n
        recent = 1
        if store.check([PREFIX + "params/%d" % n]):
            try:
                recent = requested_recent(store.get(PREFIX + "params/%d" % n, PARAMS_MAX))
            except TooLarge:
                recent = 1         # not dump --job's: the default
        key = PREFIX + "answer/%d/%d" % (n, p.rank)
        store.set(key, _core.dump_document(recent))
        # At most ANSWERS_KEPT answers of this rank stay in the store, whoever
        # asks and however often: the client deletes what it read; a request
        # nobody reads (anyone may add to the counter) is deleted here.
        p.answered.append(key)
        while len(p.answered) > ANSWERS_KEPT:
            store.delete(p.answered.pop(0))
    h = _core.hang_state()[1]
    if h > p.hangs:
        p.hangs = h
        store.set(PREFIX + "hang/%d" % p.rank, _core.dump_document(1))


# -- NCCL's flight recorder ------------------------------------------------------------

FR_KEEP = 8                        # the last collectives kept per snapshot


def flight_recorder_on() -> bool:
    try:
        return int(os.environ.get("TORCH_NCCL_TRACE_BUFFER_SIZE") or 0) > 0
    except ValueError:
        return False


def _flight_recorder_ready() -> bool:
    """torch.distributed imported (never imported for this) and its group up."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_initialized()


def _flight_recorder_json() -> bytes:
    from torch._C._distributed_c10d import _dump_nccl_trace_json
    return _dump_nccl_trace_json(includeCollectives=True, onlyActive=False)


def flight_recorder_entries(raw) -> List[dict]:
    """The last collectives of a flight-recorder dump (torch's JSON form:
    {"entries": [{"collective_seq_id", "profiling_name", "state", "pg_id"...}]}):
    (seq, op, state, process group), oldest first."""
    doc = json.loads(raw)
    out = []
    for e in doc.get("entries") or ():
        if e.get("is_p2p"):
            continue
        op = str(e.get("profiling_name") or "?")
        out.append({"seq": e.get("collective_seq_id"), "op": op.split(":", 1)[-1],
                    "state": e.get("state"), "pg": e.get("pg_id")})
    return out[-FR_KEEP:]


def _flight_recorder_snapshot():
    """With TORCH_NCCL_TRACE_BUFFER_SIZE on and NCCL's process group up: the
    last collectives (flight_recorder_entries), else None."""
    if not flight_recorder_on():
        return None
    try:
        if not _flight_recorder_ready():
            return None
        return flight_recorder_entries(_flight_recorder_json())
    except Exception:              # no NCCL build, no group yet, another format
        return None


_extra_set = []


def _snapshot() -> None:
    """Hand the C core what only Python can see: NCCL's flight recorder's last
    collectives ("entries") and the torch.distributed collectives that threads
    wait in on the CPU ("cpu_waits", :func:`cpu_waits`). The dump listener
    sends them with the in-flight document, under "flight_recorder" (it cannot
    call Python itself: a snapshot POLL_S old at most, from when this thread
    last had the GIL)."""
    extra = {"time": time.time()}
    entries = _flight_recorder_snapshot()
    if entries is not None:
        extra["entries"] = entries
    try:
        waits = cpu_waits()
    except Exception:              # a frame we cannot read: say nothing of it
        waits = []
    if waits:
        extra["cpu_waits"] = waits
    from . import _core
    if len(extra) > 1:
        _core.dump_set_extra(json.dumps(extra).encode())
        _extra_set[:] = [True]
    elif _extra_set:               # a wait that ended: not shown any more
        _core.dump_set_extra(b"")
        _extra_set[:] = []


# -- collectives waited for on the CPU (gloo; any backend before its GPU launch) ----------

#: torch.distributed's Python functions that wait for the other ranks (a
#: process group's collectives, point-to-point, barriers, groups' creation).
C10D_WAITS = frozenset("""
    all_reduce all_reduce_coalesced all_reduce_multigpu all_gather all_gather_into_tensor
    all_gather_object all_gather_coalesced all_gather_multigpu _all_gather_base broadcast
    broadcast_object_list broadcast_multigpu reduce reduce_multigpu reduce_scatter
    reduce_scatter_tensor reduce_scatter_multigpu _reduce_scatter_base all_to_all
    all_to_all_single gather gather_object scatter scatter_object_list barrier
    monitored_barrier send recv send_object_list recv_object_list batch_isend_irecv
    new_group new_subgroups init_process_group destroy_process_group
""".split())
C10D_FILE = os.path.join("torch", "distributed", "distributed_c10d.py")
_FRAMES_MAX = 32                   # innermost frames looked at, per thread
_seen = {}                         # (thread, frame id, collective, line): (since, backend)


def cpu_waits(frames=None, now=None) -> List[dict]:
    """The threads whose Python is inside one of torch.distributed's
    collectives (C10D_WAITS, in torch/distributed/distributed_c10d.py) right
    now: a rank blocked in a gloo collective (the CPU backend) has no GPU
    launch in flight, and neither has one whose NCCL collective waits on the
    CPU (its communicator's creation). One dict per thread: "collective",
    "backend" (of its group, when torch says), "filename"/"lineno"/"function"
    of the line that called it (the innermost frame of user code outside
    torch), "thread_id" (the OS's), "thread_name", "since" (when this
    thread was first found there, time.time()). Oldest first. `frames`:
    sys._current_frames() (tests)."""
    now = time.time() if now is None else now
    frames = sys._current_frames() if frames is None else frames
    me = threading.get_ident()
    threads = {t.ident: t for t in threading.enumerate()}
    out, keep = [], {}
    for ident, frame in frames.items():
        if ident == me:
            continue
        found = _c10d_frame(frame)
        if found is None:
            continue
        c10d, user = found
        t = threads.get(ident)
        key = (ident, id(c10d), c10d.f_code.co_name, user.f_code.co_filename, user.f_lineno)
        since, backend = keep[key] = _seen.get(key) or (now, _backend(c10d))
        out.append({"collective": c10d.f_code.co_name.lstrip("_"), "backend": backend,
                    "filename": user.f_code.co_filename, "lineno": user.f_lineno,
                    "function": user.f_code.co_name,
                    "thread_id": getattr(t, "native_id", None) or ident,
                    "thread_name": t.name if t is not None else None, "since": since})
    _seen.clear()
    _seen.update(keep)
    out.sort(key=lambda w: w["since"])
    return out


def _c10d_frame(frame):
    """(frame, caller) for a thread inside a collective: the outermost frame of
    one of C10D_WAITS below the thread's innermost frame of user code (the
    frames between are torch's, or the standard library's and other packages'),
    and that frame of user code (else the frame that called the collective);
    None for a thread that is not in one."""
    from . import _locations
    tail = os.sep + C10D_FILE
    found, torch_dir, f, n = None, None, frame, 0
    while f is not None and n < _FRAMES_MAX:
        name = f.f_code.co_filename
        if name.endswith(tail):
            torch_dir = name[:-len(C10D_FILE)]                        # .../torch/
            if f.f_code.co_name in C10D_WAITS:
                found = f
        elif (torch_dir is None or not name.startswith(torch_dir)) and \
                _locations.is_user_file(name):
            break                  # the user's code: the caller (or a hook it runs)
        f, n = f.f_back, n + 1
    if found is None:
        return None
    if f is None or n >= _FRAMES_MAX:
        return found, found.f_back or found
    return found, f


def _backend(c10d_frame):
    """The backend of the group the collective runs on ("gloo", "nccl"...):
    torch.distributed.get_backend of its `group` argument, or None."""
    try:
        get_backend = c10d_frame.f_globals.get("get_backend")
        group = c10d_frame.f_locals.get("group")
        b = get_backend(group) if get_backend is not None else None
        return str(b).lower() if b is not None else None
    except Exception:              # no group yet (init_process_group), torch's own errors
        return None


def address(given: str):
    if given:
        host, _, port = given.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError("--job %s: HOST:PORT (the job's MASTER_ADDR:MASTER_PORT)" % given)
        return host.strip("[]"), int(port)
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not host or not port or not port.isdigit():
        raise ValueError("--job: no store address: give HOST:PORT (the job's MASTER_ADDR:"
                         "MASTER_PORT), or run it where MASTER_ADDR and MASTER_PORT are set")
    return host, int(port)


def ask_job(host: str, port: int, recent: int = 1, timeout: float = TIMEOUT_S):
    """(documents of the ranks that answered, {rank: why not} for the others)."""
    with _store(host, port, timeout) as store:
        return _ask(store, host, port, recent, timeout)


class JobError(LookupError):
    """What the job's store holds is not what cuda_debug's ranks write: one line."""


def registration_problem(info, r: int):
    """Why rank r's registration (``rank/<r>``) is not one, or None."""
    if not isinstance(info, dict):
        return "rank %d's registration is a JSON %s, not a cuda_debug registration" % (
            r, type(info).__name__)
    if info.get("format", REGISTRATION) != REGISTRATION or info.get("version", 1) != 1:
        return ("rank %d's registration is of another version (%s %s; this cuda_debug reads %s "
                "1): run the dump of the cuda_debug the job runs" % (
                    r, shown(info.get("format")), shown(info.get("version")), REGISTRATION))
    for key, kinds in (("pid", int), ("world_size", int), ("host", str)):
        v = info.get(key)
        if not isinstance(v, kinds) or isinstance(v, bool):
            return "rank %d's registration has %s %s, not a%s" % (
                r, "no" if v is None else "a %s" % type(v).__name__, key,
                "n int" if kinds is int else " string")
    if not 0 < info["pid"] < 1 << 31:
        return "rank %d's registration names pid %d: not a process id" % (r, info["pid"])
    if not 0 <= info["world_size"] <= WORLD_MAX:
        return ("rank %d's registration gives a world size of %d: not a job's (0 to %d)"
                % (r, info["world_size"], WORLD_MAX))
    return None


REGISTRATION_MAX = 4096           # bytes of a rank's registration read
DOC_MAX = 64 << 20                # bytes of a rank's answer read (cuda_debug/_dump.py's)


def _read_json(store, key: str, what: str):
    from ._dump_tcpstore import TooLarge
    try:
        return loads(store.get(key, REGISTRATION_MAX), REGISTRATION_MAX)
    except TooLarge:
        raise JobError("%s is longer than %d bytes: not written by cuda_debug"
                       % (what, REGISTRATION_MAX)) from None
    except OutOfBounds as e:
        raise JobError("%s holds %s: not written by cuda_debug" % (what, e)) from None
    except ValueError:
        raise JobError("%s is not JSON: not written by cuda_debug" % what) from None


def _registration(store, r: int):
    info = _read_json(store, PREFIX + "rank/%d" % r, "rank %d's registration" % r)
    problem = registration_problem(info, r)
    if problem:
        raise JobError(problem)
    return info


def _answer(store, key: str, r: int):
    """Rank r's document (an answer or its hang report), or (None, why not)."""
    from ._dump_tcpstore import TooLarge
    try:
        doc = loads(store.get(key, DOC_MAX), DOC_MAX)
    except TooLarge:
        return None, "sent an answer longer than %d MiB" % (DOC_MAX >> 20)
    except OutOfBounds as e:
        return None, "sent an answer that holds %s" % e
    except ValueError:
        return None, "sent an answer that is not JSON"
    problem = document_problem(doc)
    if problem:
        return None, problem
    return doc, None


def _ask(store, host, port, recent, timeout):
    registered = {}
    deadline = time.monotonic() + timeout + POLL_S
    if store.check([PREFIX + "rank/0"]):
        first = _registration(store, 0)
        registered[0] = first
        world = max(first["world_size"], 1)
    else:
        world = _env_int("WORLD_SIZE", 0)
        if not 0 <= world <= WORLD_MAX:
            raise JobError("WORLD_SIZE=%d here: not a job's size (0 to %d)" % (world, WORLD_MAX))
    for r in range(1, world):
        if time.monotonic() > deadline:
            raise JobError("reading %d ranks' registrations took longer than %.0f s"
                           % (world, timeout + POLL_S))
        if store.check([PREFIX + "rank/%d" % r]):
            registered[r] = _registration(store, r)
    if not registered:
        raise LookupError("no rank of the job at %s:%d has registered with cuda_debug (ranks "
                          "register at their first watch(), under torchrun with PyTorch "
                          "imported)" % (host, port))
    n = int(store.add(PREFIX + "requests", 1))
    store.set(PREFIX + "params/%d" % n, json.dumps({"recent": recent}))
    docs, bad, missing = {}, {}, {}
    deadline = time.monotonic() + timeout + POLL_S
    while len(docs) + len(bad) < len(registered) and time.monotonic() < deadline:
        for r in registered:
            key = PREFIX + "answer/%d/%d" % (n, r)
            if r not in docs and r not in bad and store.check([key]):
                doc, why = _answer(store, key, r)
                store.delete(key)          # read: the store keeps nothing of this request
                if doc is not None:
                    docs[r] = doc
                else:
                    bad[r] = why
        time.sleep(0.1)
    store.delete(PREFIX + "params/%d" % n)
    for r in range(max(world, max(registered) + 1)):
        if r in docs:
            continue
        if r not in registered:
            missing[r] = ("not registered (it has not opened watch(), or runs without "
                          "cuda_debug)", None)
            continue
        info = registered[r]
        hang = None
        if store.check([PREFIX + "hang/%d" % r]):
            hang, _ = _answer(store, PREFIX + "hang/%d" % r, r)
        where = "pid %d on %s" % (info["pid"], printable(info["host"]))
        missing[r] = ("%s (%s)" % (bad[r], where) if r in bad else
                      "did not answer within %.0f s (%s)" % (timeout + POLL_S, where), hang)
    return [docs[r] for r in sorted(docs)], missing
