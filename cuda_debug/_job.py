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

PREFIX = "cuda_debug/dump/"
POLL_S = 2.0
TIMEOUT_S = 10.0

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


def _publish() -> None:
    from . import _core
    env = os.environ
    rank, world = int(env["RANK"]), int(env.get("WORLD_SIZE") or 0)
    store, seen, hangs = None, 0, _core.hang_state()[1]
    tries = 0
    while True:
        _snapshot_flight_recorder()
        if store is None and tries < 3:
            tries += 1
            try:
                store = _store(env["MASTER_ADDR"], int(env["MASTER_PORT"]), TIMEOUT_S)
                store.set(PREFIX + "rank/%d" % rank, json.dumps(
                    {"pid": os.getpid(), "host": socket.gethostname(), "world_size": world}))
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
                        recent = int(json.loads(store.get(PREFIX + "params/%d" % n))
                                     .get("recent", 1))
                    store.set(PREFIX + "answer/%d/%d" % (n, rank), _core.dump_document(recent))
                h = _core.hang_state()[1]
                if h > hangs:
                    hangs = h
                    store.set(PREFIX + "hang/%d" % rank, _core.dump_document(1))
            except (OSError, ValueError):
                store.close()
                store = None           # the job's store went away (the job ends)
        time.sleep(POLL_S)


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


def _ask(store, host, port, recent, timeout):
    registered = {}
    if store.check([PREFIX + "rank/0"]):
        first = json.loads(store.get(PREFIX + "rank/0"))
        registered[0] = first
        world = int(first.get("world_size") or 1)
    else:
        world = int(os.environ.get("WORLD_SIZE") or 0)
    for r in range(1, world):
        if store.check([PREFIX + "rank/%d" % r]):
            registered[r] = json.loads(store.get(PREFIX + "rank/%d" % r))
    if not registered:
        raise LookupError("no rank of the job at %s:%d has registered with cuda_debug (ranks "
                          "register at their first watch(), under torchrun with PyTorch "
                          "imported)" % (host, port))
    n = int(store.add(PREFIX + "requests", 1))
    store.set(PREFIX + "params/%d" % n, json.dumps({"recent": recent}))
    docs, missing, deadline = {}, {}, time.monotonic() + timeout + POLL_S
    while len(docs) < len(registered) and time.monotonic() < deadline:
        for r in registered:
            key = PREFIX + "answer/%d/%d" % (n, r)
            if r not in docs and store.check([key]):
                docs[r] = json.loads(store.get(key))
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
            hang = json.loads(store.get(PREFIX + "hang/%d" % r))
        missing[r] = ("did not answer within %.0f s (pid %s on %s)" % (
            timeout + POLL_S, info.get("pid"), info.get("host")), hang)
    return [docs[r] for r in sorted(docs)], missing
