"""torchrun jobs on a real GPU: two ranks sharing one GPU, the gloo
backend for their collectives (CPU), the GPU for their kernels, each rank
under ``python -m cuda_debug run`` (watch on). Each test starts a real
``torchrun --standalone --nproc_per_node 2``.

- a rank that stalls (a kernel that spins) while the other waits in a gloo
  ``all_reduce``: ``dump <agent pid>`` (every rank, prefixed, and the verdict
  naming both), ``dump --json --children``, ``dump --job`` through the job's
  own TCPStore, ``dump --trace`` of every rank in one file;
- a rank that faults (a device assert: an out-of-range index into an
  embedding): its ``[rank 1]`` report, its TORCHELASTIC_ERROR_FILE and
  torchrun's failure summary naming kernel and line, the other rank's exit;
- a rank that faults and is ended by the agent (SIGTERM) before it waits
  for the GPU: the report, written by the signal handler from the watch ring,
  survives, on its stderr and in its error file.

On two GPUs only (skipped with fewer): NCCL, a rank stalled
in a kernel while the other waits in ``all_reduce``, the verdict and the
flight recorder's entries of both ranks.

torchrun starts each worker in a session of its own: a job is ended by a
SIGTERM to torchrun (it ends its workers), then a SIGKILL to every worker by
its pid (each prints it when ready), whatever happened."""
import functools
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from conftest import PKG_PARENT, Live, needs
from helpers.cli import cli

pytestmark = pytest.mark.gpu

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
