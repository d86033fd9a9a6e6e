"""A rank that waits in a gloo (CPU) collective is named, with its Python stack.

A rank blocked in a gloo ``all_reduce`` has no GPU launch in flight: its
watch ring says "nothing unfinished". What says where it is is its Python
stack: the job thread (cuda_debug/_dump_job.py) looks every POLL_S seconds for
threads inside torch.distributed's collectives (torch/distributed/
distributed_c10d.py) and hands them to the dump document; the verdict
(cuda_debug/_dump.py) counts such a rank as waiting in that collective, "on
the CPU". torch is not needed: a stand-in distributed_c10d.py, at a path that
ends as torch's does, plays its part (its functions block as gloo's do, with
the GIL released).

On a real GPU: the tests at the end of this module (marked gpu).
"""
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
import functools
import signal
import subprocess
from conftest import PKG_PARENT, Live, needs

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
    from cuda_debug import _dump_job as _job
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
    from cuda_debug import _core, _dump_job as _job
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


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# torchrun jobs on a real GPU: two ranks sharing one GPU, the gloo
# backend for their collectives (CPU), the GPU for their kernels, each rank
# under ``python -m cuda_debug run`` (watch on). Each test starts a real
# ``torchrun --standalone --nproc_per_node 2``.
#
# - a rank that stalls (a kernel that spins) while the other waits in a gloo
#   ``all_reduce``: ``dump <agent pid>`` (every rank, prefixed, and the verdict
#   naming both), ``dump --json --children``, ``dump --job`` through the job's
#   own TCPStore, ``dump --trace`` of every rank in one file;
# - a rank that faults (a device assert: an out-of-range index into an
#   embedding): its ``[rank 1]`` report, its TORCHELASTIC_ERROR_FILE and
#   torchrun's failure summary naming kernel and line, the other rank's exit;
# - a rank that faults and is ended by the agent (SIGTERM) before it waits
#   for the GPU: the report, written by the signal handler from the watch ring,
#   survives, on its stderr and in its error file.
#
# On two GPUs only (skipped with fewer): NCCL, a rank stalled
# in a kernel while the other waits in ``all_reduce``, the verdict and the
# flight recorder's entries of both ranks.
#
# torchrun starts each worker in a session of its own: a job is ended by a
# SIGTERM to torchrun (it ends its workers), then a SIGKILL to every worker by
# its pid (each prints it when ready), whatever happened.
# ======================================================================================


READY_S = 240                       # two ranks import torch, start CUDA and gloo
ENV = {"PYTHONPATH": os.pathsep.join(filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")]))}


@functools.lru_cache(maxsize=None)
def _torch_facts():
    """What torch here has (asked in a child: torch is never imported by the
    test process): {"gloo", "nccl", "cuda", "gpus"}, or {"error": why}."""
    code = ("import json, torch, torch.distributed as d\n"
            "ok = d.is_available()\n"
            "print(json.dumps({'gloo': ok and d.is_gloo_available(),"
            " 'nccl': ok and d.is_nccl_available(), 'cuda': torch.cuda.is_available(),"
            " 'gpus': torch.cuda.device_count()}))\n")
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=180)
    except subprocess.TimeoutExpired:
        return {"error": "importing torch took more than 180 s"}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["rc %d" % p.returncode])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def _needs(backend="gloo", gpus=1):
    needs("torch")
    facts = _torch_facts()
    if "error" in facts:
        pytest.skip("torch does not import here: %s" % facts["error"])
    if not facts[backend]:
        pytest.skip("torch.distributed has no %s backend here" % backend)
    if not facts["cuda"] or facts["gpus"] < gpus:
        pytest.skip("needs %d GPU%s visible to torch (%d here)" % (
            gpus, "s" if gpus > 1 else "", facts["gpus"]))


def _torchrun(tmp, extra=()):
    """The launcher: torchrun, two ranks, each ``python -m cuda_debug run SCRIPT``."""
    logs = tmp / "torchrun_logs"
    logs.mkdir(exist_ok=True)
    return ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
            "--log_dir", str(logs)] + list(extra) + ["-m", "cuda_debug", "run"]


def _ready(live, n=2):
    """{rank: the fields of its READY line} (pid first), waited for."""
    out = {}
    for r in range(n):
        _, line = live.wait_for("READY %d " % r, name="stdout", timeout=READY_S)
        out[r] = line.split()[2:]
    return out


def _end(live):
    """SIGTERM to torchrun (it ends its workers), then SIGKILL to each worker
    that said READY (in a session of its own: torchrun's group does not hold
    it), then to torchrun's group; then the Live's own exit."""
    if live.proc.poll() is None:
        live.proc.send_signal(signal.SIGTERM)
        try:
            live.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    pids = {int(m) for m in re.findall(r"^READY [0-9]+ ([0-9]+)", live.text("stdout"), re.M)}
    for pid in pids:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    live.kill()
    live.__exit__(None, None, None)


def _gone(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            return "\nState:\tZ" in f.read()
    except OSError:
        return True


def _verdict(stdout):
    """The one verdict line of a dump, after every rank's report (the flight
    recorder's lines, where it is on, follow it)."""
    lines = stdout.splitlines()
    v = [i for i, l in enumerate(lines) if l.startswith("verdict: ")]
    assert len(v) == 1, stdout
    assert all(l.startswith("  flight recorder, ") for l in lines[v[0] + 1:]), stdout
    assert not any(l.startswith("[rank ") for l in lines[v[0]:]), stdout
    return lines[v[0]]


def _ages(text):
    return re.sub(r"for [0-9.]+ s", "for T s", text)


# -- a rank that stalls, the other in a gloo all_reduce ---------------------------------

STALL = '''
import os, time
import torch, torch.distributed as dist
import cuda_debug.testing as t
rank = int(os.environ["RANK"])
torch.cuda.set_device(0)                      # every rank on the one GPU
dist.init_process_group("gloo")               # the collectives on the CPU
x = torch.ones(1 << 10, device="cuda")
y = torch.ones(4)
dist.all_reduce(y)                            # both ranks: gloo is up
torch.cuda.synchronize()
os.write(1, ("READY %d %d %s %s\\n" % (rank, os.getpid(), os.environ["MASTER_ADDR"],
                                       os.environ["MASTER_PORT"])).encode())
if rank == 1:
    t.spin(180, device=0)                     # SPIN: busy while the tests look
    torch.cuda.synchronize()
dist.all_reduce(y)                            # ALLREDUCE: rank 0 waits here for rank 1
'''

#: the verdict of the stalled job, ages left open
STALL_VERDICT = (r"verdict: rank 1 stalls the job: rank 1 in spin at {spin} \(unfinished for "
                 r"[0-9.]+ s\), while rank 0 waits in gloo all_reduce \(rank 0 at {ar}, on the "
                 r"CPU for [0-9.]+ s\)")


class Job:
    def __init__(self, live, ready):
        self.live = live
        self.agent = live.pid
        self.pids = {r: int(f[0]) for r, f in ready.items()}
        self.store = "%s:%s" % (ready[0][1], ready[0][2])
        self.spin = "%s:%d" % (live.script, live.line_of("# SPIN"))
        self.ar = "%s:%d" % (live.script, live.line_of("# ALLREDUCE"))
        self.verdict = STALL_VERDICT.format(spin=re.escape(self.spin), ar=re.escape(self.ar))
        self.first = None               # the first dump that had the gloo verdict
        self.last = None
        self.started = time.time()


@pytest.fixture(scope="module")
def stalled(tmp_path_factory):
    """A job whose rank 1 spins in a kernel while rank 0 waits in a gloo
    all_reduce for it; yielded once rank 0's job thread has seen the wait
    (it looks every 2 s), so that dump's verdict can name it."""
    _needs("gloo")
    tmp = tmp_path_factory.mktemp("stalled")
    t0 = time.time()
    live = Live(STALL, env=ENV, launcher=_torchrun(tmp))
    try:
        ready = _ready(live)
        job = Job(live, ready)
        job.started = t0
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            job.last = p = cli("dump", str(job.agent), timeout=60)
            if p.returncode == 0 and "gloo all_reduce" in p.stdout:
                job.first = p
                break
            time.sleep(1.0)
        yield job
    finally:
        _end(live)


@pytest.mark.gpu
@pytest.mark.xdist_group("stalled_gloo_job")
def test_dump_of_the_agent_names_the_stalled_rank_and_the_one_in_a_gloo_all_reduce(stalled):
    assert stalled.first is not None, "no dump named the gloo all_reduce within 30 s: %r\n%r" % (
        stalled.last, stalled.live)
    p = cli("dump", str(stalled.agent), timeout=60)
    assert p.returncode == 0, p
    lines = p.stdout.splitlines()
    r0 = [l for l in lines if l.startswith("[rank 0] ")]
    r1 = [l for l in lines if l.startswith("[rank 1] ")]
    assert r0[0] == "[rank 0] cuda_debug (watch): unfinished launches of pid %d" % (
        stalled.pids[0]), p.stdout
    assert r0[1].startswith("[rank 0]   no unfinished launch"), p.stdout
    assert r1[0] == "[rank 1] cuda_debug (watch): unfinished launches of pid %d" % (
        stalled.pids[1]), p.stdout
    assert any(l.startswith("[rank 1]   spin on stream 0x0, device 0: unfinished for ")
               for l in r1), p.stdout
    assert "[rank 1]     launched at %s in <module>" % stalled.spin in r1, p.stdout
    assert lines.index(r0[0]) < lines.index(r1[0]), p.stdout
    v = _verdict(p.stdout)
    # before the verdict knew gloo it read: "verdict: a compute kernel does not finish:
    # rank 1 in spin at ...; rank 0 has nothing unfinished"
    assert re.fullmatch(stalled.verdict, v), p.stdout
    assert stalled.live.proc.poll() is None, stalled.live       # nothing was disturbed


@pytest.mark.gpu
@pytest.mark.xdist_group("stalled_gloo_job")
def test_dump_json_children_has_every_rank_and_the_cpu_wait(stalled):
    q = cli("dump", "--json", "--children", str(stalled.agent), timeout=60)
    assert q.returncode == 0, q
    doc = json.loads(q.stdout)
    assert [(r["rank"], r["pid"]) for r in doc["ranks"]] == [
        (0, stalled.pids[0]), (1, stalled.pids[1])], doc
    r0, r1 = doc["ranks"]
    assert r0["streams"] == [] and "cpu_waits" not in r1, doc
    s = r1["streams"][0]
    assert ("%s:%d" % (s["filename"], s["lineno"]), s["short"], s["device"], s["collective"]) \
        == (stalled.spin, "spin", 0, None), s
    assert s["kernel"].startswith("cuda_debug_testing::spin") and s["age_s"] > 0, s
    w = r0["cpu_waits"][0]
    assert (w["collective"], w["backend"], "%s:%d" % (w["filename"], w["lineno"]),
            w["thread_name"]) == ("all_reduce", "gloo", stalled.ar, "MainThread"), w
    assert stalled.started - 5 <= w["since"] <= time.time(), w
    assert re.fullmatch(stalled.verdict, doc["verdict"]), doc["verdict"]


@pytest.mark.gpu
@pytest.mark.xdist_group("stalled_gloo_job")
def test_dump_job_asks_every_rank_through_the_jobs_own_store(stalled):
    # torchrun's store (MASTER_ADDR:MASTER_PORT of the ranks): the ranks registered
    # at their first watch(), and answer within 2 s (their job thread)
    p = cli("dump", "--job", stalled.store, timeout=90,
            env={"MASTER_ADDR": "", "MASTER_PORT": ""})
    assert p.returncode == 0, p
    lines = p.stdout.splitlines()
    heads = [l for l in lines if "cuda_debug (watch): unfinished launches of pid" in l]
    assert heads == ["[rank %d] cuda_debug (watch): unfinished launches of pid %d"
                     % (r, stalled.pids[r]) for r in (0, 1)], p.stdout
    assert "[rank 1]     launched at %s in <module>" % stalled.spin in lines, p.stdout
    v = _verdict(p.stdout)
    assert re.fullmatch(stalled.verdict, v), p.stdout
    q = cli("dump", "--json", "--job", stalled.store, timeout=90)
    assert q.returncode == 0, q
    doc = json.loads(q.stdout)
    assert [r["rank"] for r in doc["ranks"]] == [0, 1] and doc["missing"] == {}, doc
    assert doc["ranks"][0]["cpu_waits"][0]["backend"] == "gloo", doc
    assert _ages(doc["verdict"]) == _ages(v), doc


@pytest.mark.gpu
@pytest.mark.xdist_group("stalled_gloo_job")
def test_dump_trace_writes_every_rank_into_one_timeline(stalled, tmp_path):
    out = tmp_path / "job.json"
    p = cli("dump", "--trace", str(out), str(stalled.agent), timeout=60)
    assert p.returncode == 0, p
    assert re.search(r"[0-9]+ launches of 2 processes written to %s" % re.escape(str(out)),
                     p.stderr), p.stderr
    assert re.fullmatch(stalled.verdict, _verdict(p.stdout)), p.stdout
    events = json.loads(out.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {stalled.pids[r]: "rank %d (pid %d)" % (r, stalled.pids[r])
                     for r in (0, 1)}, names
    runs = [e for e in events if e["ph"] != "M" and e.get("cat") != "launch"]
    by_rank = {r: [e for e in runs if e["pid"] == stalled.pids[r]] for r in (0, 1)}
    assert by_rank[0] and by_rank[1], names
    culprit = [e for e in runs if e["args"].get("culprit")]
    assert len(culprit) == 1 and culprit[0]["pid"] == stalled.pids[1], culprit
    c = culprit[0]
    assert (c["name"], c["ph"], c["args"]["state"], c["args"]["line"]) == (
        "CULPRIT spin", "X", "unfinished", "%s in <module>" % stalled.spin), c
    assert not [e for e in by_rank[0] if e["args"]["state"] == "unfinished"], by_rank[0]
    # one clock for every rank (wall-clock microseconds): all of it since the job started
    lo, hi = (stalled.started - 5) * 1e6, (time.time() + 5) * 1e6
    assert all(lo <= e["ts"] <= hi for e in runs), (lo, hi, runs[:3])
    assert c["ts"] >= max(e["ts"] for e in by_rank[0]) - 1e6, c   # spun after both were up


# -- a rank that faults ----------------------------------------------------------------

FAULT = '''
import os, time
import torch, torch.distributed as dist
import cuda_debug.testing as t
rank = int(os.environ["RANK"])
torch.cuda.set_device(0)
dist.init_process_group("gloo")
table = torch.randn(10, 4, device="cuda")
y = torch.ones(4)
dist.all_reduce(y)
torch.cuda.synchronize()
os.write(1, ("READY %d %d %s\\n" % (rank, os.getpid(),
                                    os.environ["TORCHELASTIC_ERROR_FILE"])).encode())
if rank == 1:
    time.sleep(1.0)
    bad = torch.tensor([100], device="cuda")
    row = torch.nn.functional.embedding(bad, table)           # FAULT: 100 of 10 rows
    print(row.sum().item())                                   # the host waits: it surfaces
elif PEER == "computes":
    t.spin(120, device=0)                                     # busy when rank 1 fails
    torch.cuda.synchronize()
else:
    dist.all_reduce(y)                                        # waits for rank 1
time.sleep(120)
'''


@pytest.mark.gpu
@pytest.mark.parametrize("peer", ["computes", "in_all_reduce"])
def test_a_device_assert_on_rank_1_is_reported_and_ends_the_job(peer, tmp_path):
    """peer "computes": rank 0 is in a kernel when rank 1 fails, so rank 1 is the
    first failure torchrun sees and its root cause. peer "in_all_reduce":
    rank 0's gloo all_reduce fails as rank 1's process goes ("Connection closed
    by peer"), both within a second; torchrun names as root cause the failure
    with the earliest timestamp (in whole seconds; on a tie, the lower rank):
    rank 1's report is then in its summary, first or among the others."""
    _needs("gloo")
    live = Live(FAULT.replace("PEER", repr(peer)), env=ENV, launcher=_torchrun(tmp_path))
    try:
        ready = _ready(live)
        t0 = time.monotonic()
        rc = live.finish(timeout=150)
        took = time.monotonic() - t0
    finally:
        _end(live)
    err, out = live.text(), live.text("stdout")
    fault = "%s:%d" % (live.script, live.line_of("# FAULT"))
    assert rc not in (0, None) and rc != -signal.SIGKILL, live        # ended by itself
    assert took < 90, (took, live)                              # no hang: it ends
    assert all(_gone(int(f[0])) for f in ready.values()), live
    # rank 1's report on its stderr, every line prefixed
    m = re.search(r"^\[rank 1\] DeviceAssertError: device-side assert in (.+)$", err, re.M)
    assert m, err[-6000:]
    kernel = m.group(1).strip()
    assert "[rank 1]   launched at %s" % fault in err, err[-6000:]
    assert "[rank 1] cuda_debug (watch): device-side assert" in err, err[-6000:]  # C, at the fault
    # rank 1's error file (TORCHELASTIC_ERROR_FILE): kernel and line
    with open(ready[1][1]) as f:
        msg = json.load(f)["message"]
    assert msg["message"] == "DeviceAssertError: device-side assert in %s" % kernel, msg
    assert "launched at %s" % fault in msg["extraInfo"]["py_callstack"], msg
    # torchrun's failure summary ("Failures:" the others, then "Root Cause") names it
    full = out + err
    start = min(i for i in (full.find("Failures:"), full.find("Root Cause"), len(full))
                if i >= 0)
    summary = full[start:]
    assert "Root Cause" in summary, full[-6000:]
    assert kernel in summary and "launched at %s" % fault in summary, summary[-6000:]
    assert "Signal 6 (SIGABRT)" not in summary, summary[-6000:]
    if peer == "computes":
        i = summary.find("Root Cause")
        root = summary[i:summary.find("=" * 20, i)]
        assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)", root), summary[-6000:]
        assert "device-side assert in %s" % kernel in root, summary[-6000:]
        assert "launched at %s" % fault in root, summary[-6000:]


SIGTERM_JOB = '''
import os, sys, time
import torch, torch.distributed as dist
rank = int(os.environ["RANK"])
launched = os.path.join(os.environ["JOB_DIR"], "launched")
torch.cuda.set_device(0)
dist.init_process_group("gloo")
table = torch.randn(10, 4, device="cuda")
y = torch.ones(4)
dist.all_reduce(y)
torch.cuda.synchronize()
os.write(1, ("READY %d %d %s\\n" % (rank, os.getpid(),
                                    os.environ["TORCHELASTIC_ERROR_FILE"])).encode())
if rank == 1:
    bad = torch.tensor([100], device="cuda")
    torch.cuda.synchronize()                                  # all done before it
    torch.nn.functional.embedding(bad, table)                 # FAULT: never waited for
    open(launched, "w").close()                               # no CUDA call after it
    time.sleep(120)                                           # until the agent ends it
else:
    while not os.path.exists(launched):
        time.sleep(0.05)
    time.sleep(3.0)                                           # the fault has happened
    sys.exit(7)                                               # so torchrun ends rank 1
'''


@pytest.mark.gpu
def test_a_rank_ended_by_the_agent_after_a_fault_keeps_its_report(tmp_path):
    """Rank 1 faults and never waits for the GPU: no CUDA call tells it. Rank 0
    fails; torchrun ends rank 1 with SIGTERM. The signal handler writes what
    the watch ring knows: the launch that never finished, at its line, on
    rank 1's stderr and in its error file."""
    _needs("gloo")
    live = Live(SIGTERM_JOB, env=dict(ENV, JOB_DIR=str(tmp_path)), launcher=_torchrun(tmp_path))
    try:
        ready = _ready(live)
        rc = live.finish(timeout=150)
    finally:
        _end(live)
    err = live.text()
    fault = "%s:%d" % (live.script, live.line_of("# FAULT"))
    assert rc not in (0, None), live
    assert all(_gone(int(f[0])) for f in ready.values()), live
    r1 = [l for l in err.splitlines() if l.startswith("[rank 1] ")]
    head = [i for i, l in enumerate(r1)
            if l.startswith("[rank 1] cuda_debug (watch): SIGTERM while watching")]
    assert head, err[-6000:]
    block = r1[head[0]:head[0] + 12]
    assert any("launched at %s" % fault in l for l in block), "\n".join(block)
    with open(ready[1][1]) as f:
        msg = json.load(f)["message"]
    assert msg["message"].startswith("SIGTERM while watching"), msg
    assert "launched at %s" % fault in msg["extraInfo"]["py_callstack"], msg


# -- two GPUs, NCCL --------------------------------------------------------------------

NCCL = '''
import os, time
import torch, torch.distributed as dist
import cuda_debug.testing as t
rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)                            # both ranks: the communicator is up
torch.cuda.synchronize()
os.write(1, ("READY %d %d\\n" % (rank, os.getpid())).encode())
if rank == 1:
    t.spin(120, device=1)                     # SPIN
    torch.cuda.synchronize()
dist.all_reduce(x)                            # ALLREDUCE: rank 1 is busy elsewhere
torch.cuda.synchronize()
'''


@pytest.mark.gpu
def test_nccl_a_rank_stalled_in_a_kernel_and_the_flight_recorders_of_both(tmp_path):
    _needs("nccl", gpus=2)
    env = dict(ENV, TORCH_NCCL_TRACE_BUFFER_SIZE="2000")
    live = Live(NCCL, env=env, launcher=_torchrun(tmp_path))
    try:
        ready = _ready(live)
        spin = "%s:%d" % (live.script, live.line_of("# SPIN"))
        ar = "%s:%d" % (live.script, live.line_of("# ALLREDUCE"))
        deadline, p = time.monotonic() + 30, None
        while time.monotonic() < deadline:      # each rank's snapshot: every 2 s
            p = cli("dump", str(live.pid), timeout=60)
            if p.returncode == 0 and p.stdout.count("  flight recorder, rank ") == 2 and \
                    "stalls the job" in p.stdout:
                break
            time.sleep(1.0)
    finally:
        _end(live)
    assert p is not None and p.returncode == 0, p
    lines = p.stdout.splitlines()
    v = _verdict(p.stdout)
    assert re.fullmatch(r"verdict: rank 1 stalls the job: rank 1 in spin at %s \(unfinished "
                        r"for [0-9.]+ s\), while rank 0 waits in all_reduce \(rank 0 at %s\)"
                        % (re.escape(spin), re.escape(ar)), v), p.stdout
    fr = lines[lines.index(v) + 1:]
    assert len(fr) == 2, p.stdout
    seqs = {}
    for r, line in enumerate(fr):
        m = re.fullmatch(r"  flight recorder, rank %d \([0-9]+ s ago\): (.*)" % r, line)
        assert m, p.stdout
        entries = re.findall(r"#([0-9]+) (\S+) (\S+)", m.group(1))
        assert entries and entries[-1][1] == "all_reduce", line
        seqs[r] = int(entries[-1][0])
    assert seqs[0] == seqs[1] + 1, p.stdout     # rank 0 is one all_reduce ahead
