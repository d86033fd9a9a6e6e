"""``cuda-debug dump`` on the fake driver (CPU, CI): the report in the caller's
terminal from the target's listener thread (csrc/hooks/dump_server.c), also
while the target's main thread is stuck in a CUDA call holding the GIL;
``--json``; a torchrun-agent-like parent with two fake ranks and the verdict;
``--trace`` and CUDA_DEBUG_TRACE as Chrome trace events; the PIDs dump refuses
(nothing signalled or read); two dump signals on two threads at once both
chain."""
import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import Live
from fake_cuda import PRELUDE, child_env
from helpers.cli import cli
from helpers.snippets import AGENT

HEAD = "cuda_debug (watch): unfinished launches of pid %d"
#: A completion marker behind every launch (watch(exact=True)): the launch a
#: report names is the unfinished one, not the first of a window of candidates.
EXACT = {"CUDA_DEBUG_WATCH_EXACT": "1"}

STUCK = '''
import ctypes, os, cuda_debug, cuda_debug.testing as t
fake.fake_set_async(1)
with cuda_debug.watch():
    t.empty()
    t.spin(60)                          # SPIN
    print("READY", flush=True)
    if %r:                              # stuck in a CUDA call that keeps the GIL
        ctypes.PyDLL(os.path.join(FAKE_DIR, "libcuda.so.1")).fake_ctx_sync()
    else:
        cuda_debug.check()              # stuck in cuCtxSynchronize, GIL released
'''


@pytest.mark.parametrize("gil", [False, True], ids=["gil-released", "gil-held"])
def test_dump_prints_the_report_here_while_the_target_is_stuck_in_a_cuda_call(fake_live, gil):
    with fake_live(STUCK % gil, env=dict(EXACT, RANK="3")) as live:
        live.wait_for("READY", name="stdout")
        time.sleep(0.3)
        p = cli("dump", str(live.pid), timeout=30)
        assert p.returncode == 0, p
        for flag in ("--pid", "-p"):                # py-spy's habit: the same report
            q = cli("dump", flag, str(live.pid), timeout=30)
            assert (q.returncode, q.stdout.splitlines()[:2]) == (0, p.stdout.splitlines()[:2]), q
        lines = p.stdout.splitlines()
        assert lines[0] == HEAD % live.pid, p.stdout
        assert lines[1] == "  oldest unfinished launch per stream, oldest first:", p.stdout
        assert lines[2].startswith("  spin on stream 0x0, device 0: unfinished for "), p.stdout
        assert "0 launches queued behind it (launch #2, thread %d)" % live.pid in lines[2]
        assert lines[3] == "    launched at %s:%d in <module>" % (
            live.script, live.line_of("# SPIN")), p.stdout
        assert p.stderr == "", p.stderr
        time.sleep(0.2)
        assert "cuda_debug (watch)" not in live.text(), live   # the target's stderr: nothing
        assert live.proc.poll() is None, live


def test_dump_json_has_the_in_flight_fields_pid_rank_and_time(fake_live):
    # the always-on watch (a marker behind every 16th launch): a window of candidates
    with fake_live('''
        import json, cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        with cuda_debug.watch():
            for _ in range(2):              # past the kernels' first launches (markers each)
                t.spin(0)
                t.empty()
            cuda_debug.check()
            t.spin(60)                      # SPIN
            for _ in range(20):
                t.empty()                   # queued behind it
            mine = [r._asdict() for r in cuda_debug.in_flight()]
            print("MINE " + json.dumps(mine), flush=True)
            cuda_debug.check()
    ''', env={"RANK": "5"}) as live:
        _, line = live.wait_for("MINE ", name="stdout")
        mine = json.loads(line[5:])
        before = time.time()
        p = cli("dump", "--json", str(live.pid), timeout=30)
        after = time.time()
        assert p.returncode == 0, p
        doc = json.loads(p.stdout)
        assert (doc["pid"], doc["rank"], doc["watching"]) == (live.pid, 5, True), doc
        assert before - 1 <= doc["time"] <= after + 1, doc
        assert len(doc["streams"]) == 1, doc
        got, want = doc["streams"][0], mine[0]
        assert set(got) == set(want), (got, want)
        for k in ("kernel", "short", "collective", "graph", "stream", "device", "thread_id",
                  "filename", "lineno", "function", "queue_depth", "seq", "candidates"):
            assert got[k] == want[k], (k, got, want)
        assert got["lineno"] == live.line_of("# SPIN") and got["queue_depth"] == 20, got
        assert got["candidates"] > 1, got
        # the frames as the target sent them; no source line (the file is the
        # target's word: dump never opens it, docs/dump.md)
        assert got["stack"] == [f[:3] + [None] for f in want["stack"]], (got, want)
        assert got["age_s"] >= want["age_s"] and got["thread_name"], got   # the OS name


# -- what dump refuses -------------------------------------------------------------------

@pytest.mark.parametrize("text, message", [
    ("-1", "-1 is not a process id: a PID is a positive number (to kill(2), -1 means every "
           "process you may signal"),
    ("0", "0 is not a process id: a PID is a positive number (to kill(2), 0 means your own "
          "process group"),
    ("-7", "-7 is not a process id: a PID is a positive number"),
    ("99999999999999999999", "99999999999999999999 is not a process id: larger than the "
                             "largest PID here"),
    ("12ab", "'12ab' is not a process id: a PID is a positive whole number"),
    ("", "'' is not a process id"),
])
def test_a_pid_that_names_no_single_process_is_refused_and_nothing_is_sent(text, message):
    # the dump runs in a session of its own with a bystander: kill(0, ...) would end it
    code = ("import os, subprocess, sys, time\n"
            "b = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
            "time.sleep(0.3)\n"
            "from cuda_debug import _cli\n"
            "rc = _cli.main(['dump', %r])\n"
            "time.sleep(0.3)\n"
            "print('BYSTANDER', b.poll())\n"
            "b.kill()\n"
            "sys.exit(rc)\n" % text)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       start_new_session=True, env=_env())
    assert p.returncode == 1, p
    assert len(p.stderr.splitlines()) == 1 and p.stderr.startswith("python -m cuda_debug dump: "), p
    assert message in p.stderr, p.stderr
    assert "Traceback" not in p.stderr, p.stderr
    assert "BYSTANDER None" in p.stdout, p          # alive: nothing was signalled


def _env(**kw):
    from helpers.cli import cli_env
    return cli_env(kw)


def test_a_process_without_cuda_debug_is_not_signalled_even_with_a_handler_of_its_own():
    # a plain program whose SIGUSR1 handler ends it is never signalled
    prog = subprocess.Popen([sys.executable, "-c", textwrap.dedent('''
        import signal, sys, time
        signal.signal(signal.SIGUSR1, lambda s, f: sys.exit(9))
        print("READY", flush=True)
        time.sleep(60)
    ''')], stdout=subprocess.PIPE, text=True)
    try:
        assert prog.stdout.readline().strip() == "READY"
        p = cli("dump", str(prog.pid))
        assert p.returncode == 1, p
        assert p.stdout == "", p
        assert len(p.stderr.splitlines()) == 1, p.stderr
        assert "process %d (" % prog.pid in p.stderr, p.stderr
        assert "has not loaded cuda_debug" in p.stderr and "nothing was sent" in p.stderr, p
        time.sleep(0.3)
        assert prog.poll() is None, "the program got a signal"
    finally:
        prog.kill()
        prog.wait()


def test_a_process_with_cuda_debug_that_never_watched_does_not_answer(fake_live):
    with fake_live('''
        import time, cuda_debug._core
        print("READY", flush=True)
        time.sleep(60)
    ''') as live:
        live.wait_for("READY", name="stdout")
        p = cli("dump", str(live.pid))
        assert p.returncode == 1 and len(p.stderr.splitlines()) == 1, p
        assert "has cuda_debug loaded but does not answer: it has not opened watch()" in p.stderr
        assert live.proc.poll() is None
        # another process that took the name cannot answer for it
        from cuda_debug import _core
        squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            squatter.bind(b"\0" + _core.dump_listener(live.pid)[1])
            squatter.listen(1)
            p = cli("dump", str(live.pid))
            assert p.returncode == 1 and len(p.stderr.splitlines()) == 1, p
            assert "the listener named for process %d (" % live.pid in p.stderr, p
            assert "is another process (pid %d): not asked" % os.getpid() in p.stderr, p
        finally:
            squatter.close()


def test_a_process_run_without_a_gpu_is_not_told_to_use_run(tmp_path):
    """`cuda-debug run` without a GPU runs the script unwatched: dump says so,
    not "open watch() (python -m cuda_debug run, ...)"."""
    from helpers.cli import NO_GPU, cli_env
    if not NO_GPU:
        pytest.skip("a GPU is usable here: run watches, and dump gets its answer")
    sleeper = tmp_path / "train.py"
    sleeper.write_text("import time\nprint('READY', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-m", "cuda_debug", "run", str(sleeper)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=cli_env({"CUDA_DEBUG_DUMP": "on"}))
    try:
        assert proc.stdout.readline() == "READY\n"
        p = cli("dump", str(proc.pid))
        assert p.returncode == 1 and len(p.stderr.splitlines()) == 1, p
        assert p.stderr.startswith("python -m cuda_debug dump: process %d (" % proc.pid), p
        assert "runs under `run`, and does not answer: `run` could not watch (no usable GPU or " \
               "CUPTI there" in p.stderr, p
        assert "python -m cuda_debug doctor" in p.stderr and "watch() (" not in p.stderr, p
    finally:
        proc.kill()
        proc.communicate()


@pytest.mark.parametrize("args, says", [
    ((), "a PID is required (or --job)"),
    (("--last", "0", "12"), "--last takes 1 to 65536 launches"),
    (("--job", "h:1", "--pid", "12"), "--job asks the ranks through the job's store: no PID"),
])
def test_dump_usage_errors_say_the_command_as_typed_in_argparses_form(args, says):
    p = cli("dump", *args)
    assert (p.returncode, p.stdout) == (2, ""), p
    usage, error = p.stderr.splitlines()[0], p.stderr.splitlines()[-1]
    assert usage.startswith("usage: python -m cuda_debug dump "), p.stderr
    assert error.startswith("python -m cuda_debug dump: error: " + says), p.stderr


def test_no_such_process_and_a_zombie_are_refused():
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    p = cli("dump", str(dead.pid))
    assert p.returncode == 1 and p.stderr == "python -m cuda_debug dump: no process %d\n" % dead.pid, p
    # a zombie: a parent that does not collect its exited child
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent('''
        import os, time
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        print(pid, flush=True)
        time.sleep(60)
    ''')], stdout=subprocess.PIPE, text=True)
    try:
        zombie = int(parent.stdout.readline())
        for _ in range(100):
            with open("/proc/%d/status" % zombie) as f:
                if "\nState:\tZ" in f.read():
                    break
            time.sleep(0.05)
        p = cli("dump", str(zombie))
        assert p.returncode == 1, p
        assert "process %d" % zombie in p.stderr and "is a zombie" in p.stderr, p.stderr
        assert len(p.stderr.splitlines()) == 1, p.stderr
    finally:
        parent.kill()
        parent.wait()


AS_NOBODY = textwrap.dedent('''
    import os, socket, sys
    import argparse, gettext, json, locale, shutil, struct, traceback   # before giving up root:
    from cuda_debug import _cli, _core, _dump, _hangs, _locations   # root's files, after
    from cuda_debug._cli import dump
    dump._dump_parser("x").format_help()
    pid, who = int(sys.argv[1]), sys.argv[2]
    child = os.fork()
    if child == 0:
        if who == "nobody":
            try:
                os.setgid(65534)
                os.setuid(65534)
            except OSError:             # a user namespace that maps only root (CI's no-toolkit step)
                print("NO OTHER USER", flush=True)
                os._exit(0)
        rc = _cli.main(["dump", str(pid)])
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)   # past dump's own checks
        s.settimeout(10)
        s.connect(b"\\0" + _core.dump_listener(pid)[1])
        try:
            s.sendall(b"cuda_debug dump 1 recent=0\\n")
            got = len(s.recv(65536))
        except (ConnectionResetError, BrokenPipeError):   # closed unanswered
            got = 0
        print("RC %d GOT %d BYTES" % (rc, got), flush=True)
        os._exit(0)
    os.waitpid(child, 0)
''')


def test_another_users_process_is_refused_by_dump_and_by_the_listener(fake_live):
    if os.geteuid() != 0:
        p = cli("dump", "1")                  # pid 1 is root's: another user's, for us
        assert p.returncode == 1 and "is another user's (uid 0)" in p.stderr, p
        return
    with fake_live(STUCK % False, env=EXACT) as live:
        live.wait_for("READY", name="stdout")
        for who in ("nobody", "root"):
            p = subprocess.run([sys.executable, "-c", AS_NOBODY, str(live.pid), who],
                               capture_output=True, text=True, timeout=60, env=_env())
            if who == "nobody":
                if "NO OTHER USER" in p.stdout:
                    pytest.skip("no other user to become here (a user namespace mapping only root)")
                assert "RC 1 GOT 0 BYTES" in p.stdout, p     # refused, and no answer
                assert "process %d (" % live.pid in p.stderr, p.stderr
                assert "is another user's (uid 0): dump asks only your own processes" in \
                    p.stderr, p.stderr
            else:
                assert "RC 0 GOT " in p.stdout and "GOT 0 BYTES" not in p.stdout, p
                assert HEAD % live.pid in p.stdout, p


# -- a job: an agent-like parent and two fake ranks --------------------------------------

RANK = PRELUDE + '''
import os, time, cuda_debug, cuda_debug.testing as t
fake.fake_set_async(1)
rank = int(os.environ["RANK"])
STALLER, IDLE = %d, %d
AR = b"ncclDevKernel_AllReduce_Sum_f32_RING_LL"
fake.fake_set_kernel(AR, 0, 0, b"", -1, 60000000)
with cuda_debug.watch():
    t.empty()                                          # EMPTY
    if rank == STALLER:
        t.spin(60)                                     # COMPUTE
    if rank != IDLE:
        fake.fake_launch(AR, 0, 1, 1, 1, 64, 1, 1)     # ALLREDUCE
    if rank == 0:                                      # a DataLoader worker, say: not a rank
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
    os.write(1, b"READY %%d\\n" %% rank)   # one write: the two ranks share the agent's stdout
    time.sleep(60)
'''



def job(fake_cuda_dir, tmp_path, staller, idle):
    rank = tmp_path / "rank.py"
    rank.write_text(RANK % (staller, idle))
    live = Live(AGENT % str(rank), env=dict(child_env(fake_cuda_dir), **EXACT))
    live.rank_script = str(rank)
    live.rank_source = rank.read_text()
    return live


def rank_line(live, marker):
    from conftest import line_of
    return "%s:%d" % (live.rank_script, line_of(live.rank_source, marker))


def test_dump_of_an_agent_names_the_rank_that_stalls_the_job(fake_cuda_dir, tmp_path):
    with job(fake_cuda_dir, tmp_path, staller=1, idle=-1) as live:
        live.wait_for("READY 0", name="stdout")
        live.wait_for("READY 1", name="stdout")
        p = cli("dump", str(live.pid), timeout=60)
        assert p.returncode == 0, p
        lines = p.stdout.splitlines()
        r0 = [l for l in lines if l.startswith("[rank 0] ")]
        r1 = [l for l in lines if l.startswith("[rank 1] ")]
        assert r0[0].startswith("[rank 0] cuda_debug (watch): unfinished launches of pid "), lines
        assert "[rank 0]   all_reduce (ncclDevKernel_AllReduce_Sum_f32_RING_LL) on stream 0x0" \
            in r0[2], lines
        assert r0[3] == "[rank 0]     launched at %s in <module>" % rank_line(live, "# ALLREDUCE")
        assert r1[2].startswith("[rank 1]   spin on stream 0x0, device 0: unfinished for "), lines
        assert "1 launch queued behind it" in r1[2], lines
        assert r1[3] == "[rank 1]     launched at %s in <module>" % rank_line(live, "# COMPUTE")
        assert lines.index(r0[0]) < lines.index(r1[0]) and lines[-1].startswith("verdict: "), lines
        v = lines[-1]
        assert v.startswith("verdict: rank 1 stalls the job: rank 1 in spin at %s (unfinished "
                            "for " % rank_line(live, "# COMPUTE")), v
        assert v.endswith("while rank 0 waits in all_reduce (rank 0 at %s)"
                          % rank_line(live, "# ALLREDUCE")), v
        # --children --json: the same, as data
        q = cli("dump", "--children", "--json", str(live.pid), timeout=60)
        assert q.returncode == 0, q
        doc = json.loads(q.stdout)
        assert [r["rank"] for r in doc["ranks"]] == [0, 1], doc
        assert doc["ranks"][1]["streams"][0]["short"] == "spin", doc
        assert doc["ranks"][0]["streams"][0]["collective"] == "all_reduce", doc
        ages = lambda t: re.sub(r"unfinished for [0-9.]+ s", "unfinished for T s", t)
        assert ages(doc["verdict"]) == ages(v), doc


def test_dump_of_an_agent_names_the_collective_a_rank_has_not_joined(fake_cuda_dir, tmp_path):
    with job(fake_cuda_dir, tmp_path, staller=-1, idle=1) as live:
        live.wait_for("READY 0", name="stdout")
        live.wait_for("READY 1", name="stdout")
        time.sleep(0.3)
        p = cli("dump", str(live.pid), timeout=60)
        assert p.returncode == 0, p
        lines = p.stdout.splitlines()
        assert lines[5].startswith("[rank 1]   no unfinished launch (the last of the 1 launches "
                                   "in the watch ring was "), lines
        v = lines[-1]
        assert v == ("verdict: all_reduce was not joined by rank 1: rank 0 waits in it (rank 0 "
                     "at %s); rank 1 has nothing unfinished; its last launch: empty at %s"
                     % (rank_line(live, "# ALLREDUCE"), rank_line(live, "# EMPTY"))), v


def test_verdicts_of_ranks_that_agree_or_disagree_on_the_collective():
    from cuda_debug import _dump

    def doc(rank, *streams):
        return {"pid": 100 + rank, "rank": rank, "recent": [], "streams": [
            dict(seq=i + 1, stream=0, kernel=k, short=k, collective=c, graph=False,
                 thread_id=1, thread_name=None, device=0, age_ns=2 * 10**9, queued=0,
                 frames=[["/t/train.py", line, "step", 1]]) for i, (k, c, line) in
            enumerate(streams)]}
    ar = ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "all_reduce", 40)
    bc = ("ncclDevKernel_Broadcast_RING_LL", "broadcast", 50)
    assert _dump.verdict([doc(0, ar), doc(1, ar)]) == (
        "verdict: every rank waits in all_reduce (rank 0 at /t/train.py:40; rank 1 at "
        "/t/train.py:40): all joined it and it does not finish (the network or NCCL itself: "
        "NCCL_DEBUG=INFO says more)")
    assert _dump.verdict([doc(0, ar), doc(1, bc)]) == (
        "verdict: the ranks wait in different collectives: rank 0 in all_reduce at "
        "/t/train.py:40; rank 1 in broadcast at /t/train.py:50")
    assert _dump.verdict([doc(0), doc(1)]) == \
        "verdict: no rank has an unfinished launch: the job is not stuck on the GPU"


# -- a timeline --------------------------------------------------------------------------

# The Trace Event Format's JSON object form (what chrome://tracing, Perfetto and
# torch.profiler's export read), for the phases dump writes.
TRACE_SCHEMA = {
    "type": "object", "required": ["traceEvents"],
    "properties": {
        "displayTimeUnit": {"enum": ["ms", "ns"]},
        "traceEvents": {"type": "array", "items": {
            "type": "object", "required": ["ph", "name", "pid", "tid"],
            "properties": {"ph": {"enum": ["X", "i", "M"]}, "name": {"type": "string"},
                           "cat": {"type": "string"}, "pid": {"type": "integer"},
                           "tid": {"type": "integer"}, "ts": {"type": "number"},
                           "dur": {"type": "number", "minimum": 0}, "s": {"enum": ["t", "p", "g"]},
                           "args": {"type": "object"}},
            "allOf": [
                {"if": {"properties": {"ph": {"const": "X"}}},
                 "then": {"required": ["ts", "dur"]}},
                {"if": {"properties": {"ph": {"const": "i"}}},
                 "then": {"required": ["ts", "s"]}},
                {"if": {"properties": {"ph": {"const": "M"}}},
                 "then": {"required": ["args"], "properties": {"name": {"enum": [
                     "process_name", "thread_name", "thread_sort_index"]}}}},
            ]}},
    }}


def check_trace(data):
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.validate(data, TRACE_SCHEMA)
    # slices on one track nest (a viewer draws them as a stack), never cross
    by_track = {}
    for e in data["traceEvents"]:
        if e["ph"] == "X":
            by_track.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_track.values():
        spans.sort()
        for (a0, a1), (b0, b1) in zip(spans, spans[1:]):
            assert b1 <= a1 + 1e-3 or b0 >= a1, spans
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in data["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    return names


def test_dump_trace_writes_chrome_trace_events(fake_live, tmp_path):
    out = tmp_path / "out.json"
    with fake_live('''
        import cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        AR = b"ncclDevKernel_AllReduce_Sum_f32_RING_LL"
        fake.fake_set_kernel(AR, 0, 0, b"", -1, 60000000)      # the peer never joins
        side = fake.fake_stream_create()
        with cuda_debug.watch():
            for _ in range(3):
                t.empty()                                   # EMPTY
            fake.fake_launch(AR, side, 1, 1, 1, 64, 1, 1)   # COLLECTIVE
            t.spin(60)                                      # SPIN
            t.empty()                                       # QUEUED
            print("READY", flush=True)
            cuda_debug.check()
    ''', env=EXACT) as live:
        live.wait_for("READY", name="stdout")
        time.sleep(0.3)
        p = cli("dump", "--trace", str(out), str(live.pid), timeout=30)
        assert p.returncode == 0, p
        assert "6 launches of 1 process written to %s" % out in p.stderr, p.stderr
    data = json.loads(out.read_text())
    names = check_trace(data)
    ev = [e for e in data["traceEvents"] if e["ph"] != "M" and e["cat"] != "launch"]
    assert [e["args"]["seq"] for e in ev] == [1, 2, 3, 4, 5, 6], ev
    assert [e["ph"] for e in ev] == ["i", "i", "i", "X", "X", "X"], ev
    assert [e["args"]["state"] for e in ev] == ["finished"] * 3 + ["unfinished"] * 3, ev
    coll, spin, queued = ev[3], ev[4], ev[5]
    assert coll["cat"] == "collective,unfinished" and coll["args"]["collective"] == "all_reduce"
    assert coll["name"] == "CULPRIT all_reduce (ncclDevKernel_AllReduce_Sum_f32_RING_LL)", coll
    assert coll["args"]["culprit"] is True and "culprit" not in spin["args"], ev
    assert spin["name"] == "spin" and spin["args"]["line"] == "%s:%d in <module>" % (
        live.script, live.line_of("# SPIN")), spin
    assert spin["args"]["queued_behind"] == 1 and queued["ts"] >= spin["ts"], ev
    assert names[(live.pid, spin["tid"])] == "stream 0x0 (device 0)", names
    assert names[(live.pid, coll["tid"])].startswith("stream 0x"), names
    assert spin["tid"] != coll["tid"], ev
    launches = [e for e in data["traceEvents"] if e.get("cat") == "launch"]
    assert len(launches) == 6 and {e["tid"] for e in launches} == {live.pid}, launches
    assert names[(live.pid, live.pid)].startswith("thread "), names


def test_cuda_debug_trace_writes_the_trace_at_a_fault(fake_child, tmp_path):
    out = tmp_path / "fault.json"
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        with cuda_debug.watch():
            t.empty()
            t.device_assert()                  # FAULT
            t.empty()
            try:
                cuda_debug.check()
            except cuda_debug.DeviceAssertError as e:
                report(dict(kernel=e.kernel))
    ''', env=dict(EXACT, CUDA_DEBUG_TRACE=str(out)))
    assert c.result and "check_index" in c.result["kernel"], c
    data = json.loads(out.read_text())
    check_trace(data)
    ev = [e for e in data["traceEvents"] if e["ph"] != "M" and e["cat"] != "launch"]
    culprit = [e for e in ev if e["args"].get("culprit")]
    assert len(culprit) == 1 and culprit[0]["name"].startswith("CULPRIT check_index"), ev
    assert culprit[0]["args"]["line"] == "%s:%d in <module>" % (c.script, c.line_of("# FAULT"))
    assert [e["args"]["state"] for e in ev] == ["finished", "unfinished", "unfinished"], ev


# -- the dump signal: two threads at once -------------------------------------------------

def test_two_dump_signals_on_two_threads_at_once_both_chain(fake_child):
    # a C handler there before cuda_debug's counts its calls
    # and takes 0.3 s; the second thread's signal lands while the first is in it.
    c = fake_child('''
        import signal, threading, time, cuda_debug, cuda_debug.testing as t
        fake.fake_count_signal(signal.SIGUSR1, 300000)
        ids, go = [], threading.Barrier(3)
        def worker():
            ids.append(threading.get_ident())
            go.wait()
            time.sleep(2)
        with cuda_debug.watch():
            t.spin(0.01)
            threads = [threading.Thread(target=worker) for _ in range(2)]
            for th in threads:
                th.start()
            go.wait()
            signal.pthread_kill(ids[0], signal.SIGUSR1)
            time.sleep(0.1)
            signal.pthread_kill(ids[1], signal.SIGUSR1)
            for th in threads:
                th.join()
        report(dict(calls=fake.fake_signal_calls()))
    ''')
    assert c.result == {"calls": 2}, c
    assert c.stderr.count("cuda_debug (watch): SIGUSR1 (pid ") == 2, c.stderr


# -- a job of two nodes: two agent-like parents sharing one TCPStore ---------------------

JOB_RANK = PRELUDE + '''
import json, os, time, cuda_debug, cuda_debug.testing as t
from cuda_debug import _dump_job as _job
fake.fake_set_async(1)
rank = int(os.environ["RANK"])
# NCCL's flight recorder, as torch's _dump_nccl_trace_json() writes it (no NCCL here)
_job._flight_recorder_ready = lambda: True
_job._flight_recorder_json = lambda: json.dumps({"version": "2.10", "entries": [
    {"collective_seq_id": 41, "profiling_name": "nccl:all_reduce", "state": "completed",
     "pg_id": 0, "is_p2p": False},
    {"collective_seq_id": 42, "profiling_name": "nccl:all_reduce",
     "state": "scheduled" if rank == 2 else "started", "pg_id": 0, "is_p2p": False}]})
AR = b"ncclDevKernel_AllReduce_Sum_f32_RING_LL"
fake.fake_set_kernel(AR, 0, 0, b"", -1, 60000000)
with cuda_debug.watch():
    t.empty()
    if rank == 2:
        t.spin(60)                                     # COMPUTE
    fake.fake_launch(AR, 0, 1, 1, 1, 64, 1, 1)         # ALLREDUCE
    os.write(1, b"READY %d\\n" % rank)   # one write: the two ranks share the agent's stdout
    time.sleep(60)
'''

NODE = '''
import os, subprocess, sys
node = int(sys.argv[1])
procs = [subprocess.Popen([sys.executable, %r], env=dict(
    os.environ, RANK=str(2 * node + r), LOCAL_RANK=str(r), WORLD_SIZE="4", GROUP_RANK=str(node)))
    for r in range(2)]
for p in procs:
    p.wait()
'''


def test_dump_job_reads_every_rank_of_two_nodes_through_the_jobs_store(fake_cuda_dir, tmp_path):
    pytest.importorskip("torch")
    from datetime import timedelta
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30),
                     wait_for_workers=False)            # what torchrun's agent hosts
    rank = tmp_path / "rank.py"
    rank.write_text(JOB_RANK)
    env = dict(child_env(fake_cuda_dir), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
               TORCH_NCCL_TRACE_BUFFER_SIZE="2000", **EXACT)
    nodes = [Live(NODE % str(rank), env=env, args=[str(n)]) for n in range(2)]
    try:
        for r in range(4):
            nodes[r // 2].wait_for("READY %d" % r, name="stdout", timeout=60)
        deadline = time.monotonic() + 30
        while not store.check(["cuda_debug/dump/rank/%d" % r for r in range(4)]):
            assert time.monotonic() < deadline, "the ranks did not register"
            time.sleep(0.2)
        p = cli("dump", "--job", "127.0.0.1:%d" % store.port, env={"MASTER_ADDR": "",
                                                                     "MASTER_PORT": ""},
                timeout=60)
        assert p.returncode == 0, p
        lines = p.stdout.splitlines()
        heads = [l for l in lines if "cuda_debug (watch): unfinished launches of pid" in l]
        assert [h.split("]")[0] for h in heads] == ["[rank %d" % r for r in range(4)], lines
        from conftest import line_of
        src = rank.read_text()
        compute = "%s:%d" % (rank, line_of(src, "# COMPUTE"))
        ar = "%s:%d" % (rank, line_of(src, "# ALLREDUCE"))
        assert "[rank 2]     launched at %s in <module>" % compute in lines, lines
        v = [l for l in lines if l.startswith("verdict: ")]
        assert len(v) == 1 and lines.index(v[0]) == len(lines) - 5, lines
        v = v[0]
        fr = lines[-4:]
        for r in range(4):
            assert re.fullmatch(r"  flight recorder, rank %d \([0-9]+ s ago\): #41 all_reduce "
                                r"completed, #42 all_reduce %s" % (
                                    r, "scheduled" if r == 2 else "started"), fr[r]), fr
        assert v.startswith("verdict: rank 2 stalls the job: rank 2 in spin at %s" % compute), v
        assert v.endswith("while ranks 0, 1, 3 wait in all_reduce (rank 0 at %s; rank 1 at %s; "
                          "rank 3 at %s)" % (ar, ar, ar)), v
        # MASTER_ADDR/MASTER_PORT from the environment, --json
        q = cli("dump", "--job", "--json", env={"MASTER_ADDR": "127.0.0.1",
                                                "MASTER_PORT": str(store.port)}, timeout=60)
        assert q.returncode == 0, q
        doc = json.loads(q.stdout)
        assert [d["rank"] for d in doc["ranks"]] == [0, 1, 2, 3] and doc["missing"] == {}, doc
        assert doc["ranks"][2]["flight_recorder"]["entries"][-1] == {
            "seq": 42, "op": "all_reduce", "state": "scheduled", "pg": 0}, doc
    finally:
        for n in nodes:
            n.__exit__(None, None, None)


def test_dump_job_without_an_address_is_a_usage_error():
    p = cli("dump", "--job", env={"MASTER_ADDR": "", "MASTER_PORT": ""})
    assert p.returncode == 2, p
    assert "--job: no store address: give HOST:PORT" in p.stderr, p
    p = cli("dump", "--job", "nowhere")
    assert p.returncode == 2 and "HOST:PORT" in p.stderr, p


HANG_RANK = PRELUDE + '''
import ctypes, os, time, cuda_debug, cuda_debug.testing as t
fake.fake_set_async(1)
rank = int(os.environ["RANK"])
with cuda_debug.watch(hang_after=0.5):
    t.spin(60)                                         # SPIN
    time.sleep(2 * 2.0 + 1.5)                          # a hang report, published
    print("READY", rank, flush=True)
    if rank == 1:                                      # its Python can answer no more
        ctypes.PyDLL(os.path.join(FAKE_DIR, "libcuda.so.1")).fake_ctx_sync()
    time.sleep(60)
'''


def test_dump_job_shows_the_last_hang_report_of_a_rank_that_cannot_answer(fake_cuda_dir,
                                                                           tmp_path):
    pytest.importorskip("torch")
    from datetime import timedelta
    from torch.distributed import TCPStore
    store = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30),
                     wait_for_workers=False)
    rank = tmp_path / "rank.py"
    rank.write_text(HANG_RANK)
    env = dict(child_env(fake_cuda_dir), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(store.port),
               **EXACT)
    with Live(NODE % str(rank), env=env, args=["0"]) as node:
        for r in range(2):
            node.wait_for("READY %d" % r, name="stdout", timeout=60)
        assert store.check(["cuda_debug/dump/hang/1"]), "rank 1 published no hang report"
        p = cli("dump", "--job", "127.0.0.1:%d" % store.port, "--timeout", "2", timeout=60)
        assert p.returncode == 1, p
        assert "python -m cuda_debug dump: rank 1 did not answer within 4 s (pid " in p.stderr, p
        assert "; its last hang report follows" in p.stderr, p
        assert "python -m cuda_debug dump: rank 2" in p.stderr and "not registered" in p.stderr, p
        out = p.stdout.splitlines()
        assert out[0].startswith("[rank 0] cuda_debug (watch): unfinished launches of pid "), out
        i = out.index([l for l in out if l.startswith("[rank 1] (its last hang report, ")][0])
        assert out[i + 1].startswith("[rank 1] cuda_debug (watch): unfinished launches of pid "), out
        from conftest import line_of
        assert "[rank 1]     launched at %s:%d in <module>" % (
            rank, line_of(rank.read_text(), "# SPIN")) in out, out


def test_a_forked_child_answers_for_itself_and_the_parent_still_answers(fake_live):
    with fake_live('''
        import os, time, cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        with cuda_debug.watch():
            t.spin(60)                                  # PARENT
            pid = os.fork()
            if pid == 0:
                import faulthandler
                faulthandler.dump_traceback_later(20)   # where it hangs, if it does
                with cuda_debug.watch():                # its own listener, under its pid
                    print("CHILD", os.getpid(), flush=True)
                    time.sleep(60)
                os._exit(0)
            print("PARENT", os.getpid(), flush=True)
            time.sleep(60)
    ''') as live:
        _, child = live.wait_for("CHILD", name="stdout")
        live.wait_for("PARENT", name="stdout")
        child = int(child.split()[1])
        p = cli("dump", "--json", str(live.pid))
        c = cli("dump", "--json", str(child))
        assert p.returncode == 0 and c.returncode == 0, (p, c)
        assert json.loads(p.stdout)["pid"] == live.pid, p
        assert json.loads(c.stdout)["pid"] == child, c
