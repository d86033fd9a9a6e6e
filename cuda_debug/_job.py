"""``cuda-debug dump --job``: every rank of a torchrun job, from any node, through
the job's own c10d TCPStore (the one torchrun runs at MASTER_ADDR:MASTER_PORT;
cuda_debug runs no server of its own).

Each rank that watches under torchrun (MASTER_ADDR, MASTER_PORT and RANK set)
starts one daemon thread (:func:`start`) with a store client of its own
(cuda_debug/_tcpstore.py: the store's wire protocol, so neither side needs
PyTorch importable). It registers the rank (``cuda_debug/dump/rank/<r>``: pid, host,
world size), then every POLL_S seconds reads the request counter
``cuda_debug/dump/requests`` (one ``add(key, 0)``) and the count of hang
reports its watcher wrote. A new request is answered with the rank's in-flight
document (``cuda_debug/dump/answer/<n>/<r>``: the JSON that ``dump PID`` reads,
csrc/report/inflight_doc.c, built without the GIL); a new hang report is
published as ``cuda_debug/dump/hang/<r>``, so a rank whose Python cannot answer
later (its GIL held forever) still has its last hang report in the store.

``dump --job`` (:func:`ask_job`; cuda_debug/_cli.py prints) adds 1 to the
counter, waits for each registered rank's answer, and prints what ``dump`` of
an agent prints: each rank's report prefixed ``[rank k]``, then the verdict;
for a rank that did not answer, its last hang report when there is one.
"""
import json
import os
import socket
import sys
import threading
import time
from typing import List

from ._untrusted import document_problem, printable

PREFIX = "cuda_debug/dump/"
POLL_S = 2.0
TIMEOUT_S = 10.0
REGISTRATION = "cuda_debug.dump.rank"   # the format of a rank's registration (rank/<r>)
RECENT_MAX = 65536                       # csrc/hooks/dump_server.c RECENT_MAX
WORLD_MAX = 1 << 17                      # ranks a job may have, for dump --job

_started = []


def _store(host: str, port: int, timeout: float):
    from ._tcpstore import Client
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
        params = json.loads(raw)
    except (ValueError, TypeError):
        return 1
    recent = params.get("recent", 1) if isinstance(params, dict) else None
    if not isinstance(recent, int) or isinstance(recent, bool) or not 0 <= recent <= RECENT_MAX:
        return 1
    return recent


def _publish() -> None:
    """The thread's loop. Whatever the store holds, it neither dies nor writes
    to the program's stderr: what it reads is checked (requested_recent, the
    counters are ints by the store's protocol), and anything else going wrong
    costs the connection (a few tries, then none), never the thread."""
    rank, world = _env_int("RANK", -1), _env_int("WORLD_SIZE", 0)
    store, seen, hangs, tries = None, 0, None, 0
    while True:
        try:
            store, seen, hangs, tries = _publish_once(rank, world, store, seen, hangs, tries)
        except Exception:          # never the program's: its stderr gets nothing of ours
            if store is not None:
                try:
                    store.close()
                except Exception:
                    pass
            store = None
        time.sleep(POLL_S)


def _publish_once(rank, world, store, seen, hangs, tries):
    """One poll: register (a few tries), answer a new request, publish a new
    hang report; returns the loop's state."""
    from . import _core
    from ._tcpstore import TooLarge
    env = os.environ
    if hangs is None:
        hangs = _core.hang_state()[1]
    _snapshot_flight_recorder()
    if store is None and tries < 3:
        tries += 1
        try:
            store = _store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), TIMEOUT_S)
            store.set(PREFIX + "rank/%d" % rank, json.dumps(
                {"format": REGISTRATION, "version": 1, "pid": os.getpid(),
                 "host": socket.gethostname(), "world_size": world}))
            seen = int(store.add(PREFIX + "requests", 0))
        except OSError:
            store = None           # not up yet, or gone: a few tries, then none
    if store is not None:
        try:
            n = int(store.add(PREFIX + "requests", 0))
            if n > seen:
                seen = n
                recent = 1
                if store.check([PREFIX + "params/%d" % n]):
                    try:
                        recent = requested_recent(store.get(PREFIX + "params/%d" % n, 4096))
                    except TooLarge:
                        recent = 1         # not dump --job's: the default
                store.set(PREFIX + "answer/%d/%d" % (n, rank), _core.dump_document(recent))
            h = _core.hang_state()[1]
            if h > hangs:
                hangs = h
                store.set(PREFIX + "hang/%d" % rank, _core.dump_document(1))
        except (OSError, ValueError):
            store.close()
            store = None           # the job's store went away (the job ends)
    return store, seen, hangs, tries


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


def _snapshot_flight_recorder() -> None:
    """With TORCH_NCCL_TRACE_BUFFER_SIZE on and NCCL's process group up, hand
    the C core the last collectives: the dump listener sends them with the
    in-flight document (it cannot call Python itself; a snapshot POLL_S old
    at most, from when this thread last had the GIL)."""
    if not flight_recorder_on():
        return
    try:
        if not _flight_recorder_ready():
            return
        entries = flight_recorder_entries(_flight_recorder_json())
    except Exception:              # no NCCL build, no group yet, another format
        return
    from . import _core
    _core.dump_set_extra(json.dumps({"time": time.time(), "entries": entries}).encode())


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
                    r, printable(repr(info.get("format"))), printable(repr(info.get("version"))),
                    REGISTRATION))
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


def _read_json(store, key: str, what: str):
    try:
        return json.loads(store.get(key))
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
    try:
        doc = json.loads(store.get(key))
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
                if doc is not None:
                    docs[r] = doc
                else:
                    bad[r] = why
        time.sleep(0.1)
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
