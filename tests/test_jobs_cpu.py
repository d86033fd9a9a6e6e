"""A rank that waits in a gloo (CPU) collective is named, with its Python stack.

A rank blocked in a gloo ``all_reduce`` has no GPU launch in flight: its
watch ring says "nothing unfinished". What says where it is is its Python
stack: the job thread (cuda_debug/_job.py) looks every POLL_S seconds for
threads inside torch.distributed's collectives (torch/distributed/
distributed_c10d.py) and hands them to the dump document; the verdict
(cuda_debug/_dump.py) counts such a rank as waiting in that collective, "on
the CPU". torch is not needed: a stand-in distributed_c10d.py, at a path that
ends as torch's does, plays its part (its functions block as gloo's do, with
the GIL released)."""
import json
import os
import re
import socket
import sys
import threading
import time

import pytest

from conftest import Live, line_of
from fake_cuda import PRELUDE, child_env
from helpers.cli import cli

#: torch/distributed/distributed_c10d.py, as far as cuda_debug can tell: a
#: collective that waits (GIL released) until GO is set, a group's backend.
C10D = '''
import threading, time
GO = threading.Event()
IN = threading.Event()


def get_backend(group=None):
    return "gloo" if group is None else group


def _wait(seconds):
    IN.set()
    GO.wait(seconds)


def all_reduce(tensor, op=None, group=None, async_op=False, seconds=60):
    _wait(seconds)


def all_gather_object(object_list, obj, group=None):
    all_reduce(obj, group=group)               # nested: named by the outer one


def _object_to_tensor(obj):                     # not a collective
    _wait(60)
'''


def fake_c10d(tmp_path, name="fake_c10d"):
    """The stand-in, loaded from .../torch/distributed/distributed_c10d.py."""
    import importlib.util
    folder = tmp_path / "site" / "torch" / "distributed"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "distributed_c10d.py"
    path.write_text(C10D)
    spec = importlib.util.spec_from_file_location(name, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _here(marker):
    with open(__file__) as f:
        return "%s:%d" % (__file__, line_of(f.read(), marker))


def test_cpu_waits_name_the_collective_its_backend_and_the_calling_line(tmp_path):
    from cuda_debug import _job
    c10d = fake_c10d(tmp_path)
    ready = threading.Event()

    def plain():
        ready.wait(30)
        c10d.GO.wait(30)                        # waits, but not in a collective

    def helper():
        c10d._object_to_tensor(1)               # inside c10d, not in a collective

    def nested():
        c10d.all_gather_object([], 1, group="mygroup")           # NESTED

    threads = [threading.Thread(target=plain, name="plain"),
               threading.Thread(target=helper, name="helper")]
    try:
        for t in threads:
            t.start()
        assert c10d.IN.wait(10)
        assert _job.cpu_waits() == [], "a thread in no collective was listed"
        c10d.IN.clear()
        threads.append(threading.Thread(
            target=lambda: c10d.all_reduce(None), name="reducer"))   # ALLREDUCE
        threads[-1].start()
        assert c10d.IN.wait(10)
        t0 = time.time()
        first = _job.cpu_waits(now=t0)
        assert len(first) == 1, first
        w = first[0]
        assert (w["collective"], w["backend"], w["thread_name"], w["since"]) == (
            "all_reduce", "gloo", "reducer", t0), w
        assert "%s:%d" % (w["filename"], w["lineno"]) == _here("# ALLREDUCE"), w
        assert w["function"] == "<lambda>" and w["thread_id"] == threads[-1].native_id, w
        # seen again later: since stays when it was first seen
        c10d.IN.clear()
        threads.append(threading.Thread(target=nested, name="nested"))
        threads[-1].start()
        assert c10d.IN.wait(10)
        again = _job.cpu_waits(now=t0 + 4)
        assert [(x["collective"], x["backend"], x["since"]) for x in again] == [
            ("all_reduce", "gloo", t0), ("all_gather_object", "mygroup", t0 + 4)], again
        assert "%s:%d" % (again[1]["filename"], again[1]["lineno"]) == _here("# NESTED")
        json.dumps(again)                       # what the dump document carries
    finally:
        ready.set()
        c10d.GO.set()
        for t in threads:
            t.join(10)
    assert _job.cpu_waits() == []


def test_the_snapshot_hands_the_waits_down_and_takes_them_back(tmp_path, monkeypatch):
    from cuda_debug import _core, _job
    c10d = fake_c10d(tmp_path)
    calls = []
    monkeypatch.setattr(_core, "dump_set_extra", calls.append)
    monkeypatch.setattr(_job, "flight_recorder_on", lambda: False)
    _job._snapshot()
    assert calls == [], calls                   # nothing to say: nothing said
    t = threading.Thread(target=lambda: c10d.all_reduce(None, seconds=30))
    t.start()
    try:
        assert c10d.IN.wait(10)
        _job._snapshot()
        doc = json.loads(calls[-1])
        assert [w["collective"] for w in doc["cpu_waits"]] == ["all_reduce"], doc
        assert abs(doc["time"] - time.time()) < 5 and "entries" not in doc, doc
    finally:
        c10d.GO.set()
        t.join(10)
    _job._snapshot()
    assert calls[-1] == b"", calls              # the wait ended: the document's null again
    n = len(calls)
    _job._snapshot()
    assert len(calls) == n, calls


# -- the verdict ---------------------------------------------------------------------------

def _doc(rank, streams=(), waits=None, t=1000.0, snap=None, recent=()):
    d = {"pid": 100 + rank, "rank": rank, "time": t, "recent": list(recent), "streams": [
        dict(seq=i + 1, stream=0, kernel=k, short=k, collective=c, graph=False,
             thread_id=1, thread_name=None, device=0, age_ns=2 * 10**9, queued=0,
             frames=[["/t/train.py", line, "step", 1]]) for i, (k, c, line) in
        enumerate(streams)]}
    if waits is not None:
        d["flight_recorder"] = {"time": t - 0.5 if snap is None else snap, "cpu_waits": waits}
    return d


def _wait(line=20, since=996.0, backend="gloo", collective="all_reduce"):
    return {"collective": collective, "backend": backend, "filename": "/t/train.py",
            "lineno": line, "function": "step", "thread_id": 7, "thread_name": "MainThread",
            "since": since}


SPIN = ("spin", None, 13)
AR = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all_reduce", 40)


def test_the_verdict_names_the_rank_waiting_in_a_gloo_collective():
    from cuda_debug import _dump
    v = _dump.verdict
    # before: rank 0 had "nothing unfinished"; the stall was not seen as one
    assert v([_doc(0), _doc(1, [SPIN])]) == (
        "verdict: a compute kernel does not finish: rank 1 in spin at /t/train.py:13 "
        "(unfinished for 2.0 s); rank 0 has nothing unfinished")
    assert v([_doc(0, waits=[_wait()]), _doc(1, [SPIN])]) == (
        "verdict: rank 1 stalls the job: rank 1 in spin at /t/train.py:13 (unfinished for "
        "2.0 s), while rank 0 waits in gloo all_reduce (rank 0 at /t/train.py:20, on the CPU "
        "for 4.0 s)")
    # a collective not joined: rank 1 has nothing unfinished and is in no collective
    last = dict(_doc(1, [("empty", None, 9)])["streams"][0], done=1)
    assert v([_doc(0, waits=[_wait()]), _doc(1, recent=[last])]) == (
        "verdict: gloo all_reduce was not joined by rank 1: rank 0 waits in it (rank 0 at "
        "/t/train.py:20, on the CPU for 4.0 s); rank 1 has nothing unfinished; its last "
        "launch: empty at /t/train.py:9")
    # every rank in it
    assert v([_doc(0, waits=[_wait()]), _doc(1, waits=[_wait(since=999.0)])]) == (
        "verdict: every rank waits in gloo all_reduce (rank 0 at /t/train.py:20, on the CPU "
        "for 4.0 s; rank 1 at /t/train.py:20, on the CPU for 1.0 s): all joined it and it "
        "does not finish (the network or gloo itself: TORCH_DISTRIBUTED_DEBUG=DETAIL says "
        "more)")
    # different collectives: one on the GPU (NCCL), one on the CPU
    assert v([_doc(0, [AR]), _doc(1, waits=[_wait(30, collective="barrier")])]) == (
        "verdict: the ranks wait in different collectives: rank 0 in all_reduce at "
        "/t/train.py:40; rank 1 in gloo barrier at /t/train.py:30")
    # the backend unknown; a snapshot that is old at the dump says so
    assert v([_doc(0, waits=[_wait(backend=None)], snap=980.0), _doc(1, [SPIN])]).endswith(
        "while rank 0 waits in all_reduce (rank 0 at /t/train.py:20, on the CPU for 4.0 s "
        "(its last snapshot 20 s before this dump))")
    # a launch unfinished on the GPU comes first: the rank's own kernel holds it up
    assert v([_doc(0, [AR]), _doc(1, [SPIN], waits=[_wait()])]).startswith(
        "verdict: rank 1 stalls the job: rank 1 in spin at /t/train.py:13")


@pytest.mark.parametrize("extra", [
    "x", [], {"time": 1.0}, {"time": 1.0, "cpu_waits": "x"}, {"time": 1.0, "cpu_waits": [1]},
    {"time": "soon", "cpu_waits": [_wait()]}, {"time": 1.0, "cpu_waits": [{"since": 1.0}]},
    {"time": 1.0, "cpu_waits": [dict(_wait(), since=None)]},
    {"time": 1.0, "cpu_waits": [dict(_wait(), lineno="x")]},
    {"time": 1.0, "cpu_waits": [dict(_wait(), collective="")]},
])
def test_a_cpu_wait_that_makes_no_sense_is_left_out(extra):
    from cuda_debug import _dump
    d = _doc(0)
    d["flight_recorder"] = extra
    assert _dump.cpu_wait(d) is None
    assert _dump.verdict([d, _doc(1, [SPIN])]).startswith(
        "verdict: a compute kernel does not finish: rank 1 in spin"), extra


def test_dump_json_carries_the_cpu_waits_apart_from_the_flight_recorder():
    from cuda_debug import _dump
    d = _doc(0, waits=[_wait()])
    out = _dump.as_json(d)
    assert out["cpu_waits"] == [_wait()] and "flight_recorder" not in out, out
    d["flight_recorder"]["entries"] = [{"seq": 1, "op": "all_reduce", "state": "completed",
                                        "pg": 0}]
    out = _dump.as_json(d)
    assert out["flight_recorder"] == {"time": 999.5, "entries": d["flight_recorder"]["entries"]}
    assert out["cpu_waits"] == [_wait()], out
    assert _dump.flight_recorder_lines([d]) == [
        "  flight recorder, rank 0 (0 s ago): #1 all_reduce completed"]


# -- a job: an agent-like parent, two fake ranks, one of them in a gloo all_reduce ---------

RANK = PRELUDE + '''
import importlib.util, os, time, cuda_debug, cuda_debug.testing as t
spec = importlib.util.spec_from_file_location("fake_c10d", %r)
c10d = importlib.util.module_from_spec(spec)
spec.loader.exec_module(c10d)
fake.fake_set_async(1)
rank = int(os.environ["RANK"])
with cuda_debug.watch():
    t.empty()
    if rank == 1:
        t.spin(60)                                     # COMPUTE
        os.write(1, b"READY 1\\n")
        time.sleep(60)
    else:
        os.write(1, b"READY 0\\n")   # one write: the two ranks share the agent's stdout
        c10d.all_reduce(None)                          # GLOO
'''

AGENT = '''
import os, subprocess, sys
procs = [subprocess.Popen([sys.executable, %r],
                          env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2"))
         for r in range(2)]
for p in procs:
    p.wait()
'''


def _closed_port():
    """A port of 127.0.0.1 nobody listens on (the job thread's store is not up:
    it tries, is refused, and goes on without one)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_dump_of_an_agent_names_the_rank_waiting_in_a_gloo_all_reduce(fake_cuda_dir, tmp_path):
    c10d = tmp_path / "site" / "torch" / "distributed" / "distributed_c10d.py"
    c10d.parent.mkdir(parents=True)
    c10d.write_text(C10D)
    rank = tmp_path / "rank.py"
    rank.write_text(RANK % str(c10d))
    src = rank.read_text()
    compute = "%s:%d" % (rank, line_of(src, "# COMPUTE"))
    gloo = "%s:%d" % (rank, line_of(src, "# GLOO"))
    env = dict(child_env(fake_cuda_dir), CUDA_DEBUG_WATCH_EXACT="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(_closed_port()))
    with Live(AGENT % str(rank), env=env) as live:
        live.wait_for("READY 0", name="stdout", timeout=60)
        live.wait_for("READY 1", name="stdout", timeout=60)
        deadline = time.monotonic() + 30
        while True:                    # the job thread looks every 2 s
            p = cli("dump", str(live.pid), timeout=60)
            assert p.returncode == 0, p
            v = p.stdout.splitlines()[-1]
            if "gloo" in v or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert re.fullmatch(
            r"verdict: rank 1 stalls the job: rank 1 in spin at %s \(unfinished for [0-9.]+ s\), "
            r"while rank 0 waits in gloo all_reduce \(rank 0 at %s, on the CPU for [0-9.]+ s\)"
            % (re.escape(compute), re.escape(gloo)), v), p.stdout
        assert "[rank 1]     launched at %s in <module>" % compute in p.stdout, p.stdout
        q = cli("dump", "--children", "--json", str(live.pid), timeout=60)
        assert q.returncode == 0, q
        doc = json.loads(q.stdout)
        r0, r1 = doc["ranks"]
        assert r0["streams"] == [] and r1["streams"][0]["short"] == "spin", doc
        w = r0["cpu_waits"][0]
        assert (w["collective"], w["backend"], "%s:%d" % (w["filename"], w["lineno"]),
                w["thread_name"]) == ("all_reduce", "gloo", gloo, "MainThread"), w
        assert "cpu_waits" not in r1 and "gloo all_reduce" in doc["verdict"], doc
