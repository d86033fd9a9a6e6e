"""``cuda-debug dump`` never loses an answer and never prints an attacker's bytes
on the fake driver (CPU):

- a fork while the listener answers does not keep the caller waiting (the answer
  ends by its length, the connection is shut down, the child closes its copies);
- one caller dribbling its request does not hold the listener for the others;
- a name squatted before the target's listener starts does not make it
  undumpable (the listener takes a random name the caller finds among the
  target's own sockets), and the squatter is sent nothing;
- names from the target (kernel, file) reach the terminal sanitised, as the C
  report writes them, and ``--json`` raw;
- the job's store holding nonsense neither kills a rank's ``cuda_debug-job``
  thread nor puts a traceback in its stderr, and ``dump --job`` says in one
  line what it found;
- the store client reads a large value in linear time.
"""
import json
import socket
import struct
import threading
import time

import pytest

from conftest import Live
from fake_cuda import PRELUDE, child_env
from fake_store import FakeStore
from helpers.cli import cli
from helpers.snippets import AGENT        # an agent-like parent of two ranks
from helpers.dump_job import (GOOD, JOB_RANK, answering_rank, dump_job, rank_env, registration,
                              wait_key)

#: a completion marker behind every launch: the unfinished one is named
EXACT = {"CUDA_DEBUG_WATCH_EXACT": "1"}

WATCHING = '''
import os, sys, time, cuda_debug, cuda_debug.testing as t
fake.fake_set_async(1)
with cuda_debug.watch():
    t.spin(60)                                          # SPIN
    print("READY", flush=True)
'''


def listener(pid):
    from cuda_debug import _core
    return b"\0" + _core.dump_listener(pid)[1]


def read_to_eof(s, timeout):
    """Everything until the end of the file, or None at the deadline."""
    out, deadline = bytearray(), time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        s.settimeout(left)
        try:
            b = s.recv(1 << 16)
        except socket.timeout:
            return None
        if not b:
            return bytes(out)
        out += b


def document(answer):
    head, _, body = answer.partition(b"\n")
    assert head == b"cuda_debug dump answer %d" % len(body), answer[:80]
    return json.loads(body)


# -- 5: a fork while the listener answers --------------------------------------------

def test_a_fork_while_the_listener_holds_a_caller_does_not_keep_it_waiting(fake_live, tmp_path):
    """The caller is connected (its request half sent) when the target forks: the
    child, which lives on, holds a copy of the accepted socket. The answer still
    ends (length, then shutdown) within the caller's 5 s."""
    go = tmp_path / "go"
    with fake_live(WATCHING + '''
    while not os.path.exists(%r):
        time.sleep(0.01)
    child = os.fork()
    if child == 0:
        time.sleep(30)                                  # longer than any caller waits
        os._exit(0)
    print("FORKED", child, flush=True)
    time.sleep(60)
''' % str(go), env=EXACT) as live:
        live.wait_for("READY", name="stdout")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(listener(live.pid))
            s.sendall(b"cuda_debug dump ")
            time.sleep(0.1)                             # accepted, its request incomplete
            go.write_text("")
            live.wait_for("FORKED", name="stdout")
            s.sendall(b"1 recent=0\n")
            answer = read_to_eof(s, 5.0)
        finally:
            s.close()
        assert answer is not None, "no end of the answer within 5 s (the forked child's copy)"
        doc = document(answer)
        assert doc["pid"] == live.pid and [e["short"] for e in doc["streams"]] == ["spin"], doc


def test_dump_answers_every_time_while_the_target_forks_again_and_again(fake_live):
    """The issue's case: dumps while the target forks every 20 ms (children that
    outlive the caller's patience); 7 of 40 failed in the review."""
    from cuda_debug import _dump
    many = WATCHING.replace('print("READY"', 'for _ in range(20000): t.empty()\n    print("READY"')
    with fake_live(many + '''
    kids = []
    while True:
        pid = os.fork()
        if pid == 0:
            time.sleep(6)
            os._exit(0)
        kids.append(pid)
        while kids and os.waitpid(kids[0], os.WNOHANG)[0]:
            kids.pop(0)
        time.sleep(0.02)
''') as live:
        live.wait_for("READY", name="stdout")
        failures = []
        for i in range(40):
            try:
                # 20,000 launches each: megabytes, an answer that takes a while
                doc = _dump.ask(live.pid, recent=20000, timeout=5.0)
                assert doc["pid"] == live.pid
            except _dump.DumpError as e:
                failures.append(str(e))
        assert not failures, "%d of 40 dumps failed: %s" % (len(failures), failures[0])


# -- 9: a dribbling caller ------------------------------------------------------------

def test_a_caller_dribbling_its_request_neither_blocks_others_nor_keeps_its_slot(fake_live):
    from cuda_debug import _dump
    with fake_live(WATCHING + '''
    time.sleep(60)
''') as live:
        live.wait_for("READY", name="stdout")
        slow = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        slow.connect(listener(live.pid))
        cut = []

        def dribble():
            t0 = time.monotonic()
            try:
                for c in b"cuda_debug dump 1 recent=0":      # a byte every 1.5 s, no newline
                    slow.sendall(bytes([c]))
                    time.sleep(1.5)
                    if time.monotonic() - t0 > 12:
                        return
            except OSError:
                pass
            cut.append(time.monotonic() - t0)
        t = threading.Thread(target=dribble, daemon=True)
        t.start()
        try:
            time.sleep(0.5)                                  # the listener holds the slow one
            t0 = time.monotonic()
            doc = _dump.ask(live.pid, timeout=5.0)
            took = time.monotonic() - t0
            assert doc["pid"] == live.pid, doc
            assert took < 2.0, "the dump waited %.1f s behind the slow caller" % took
            # its request had one deadline (2 s from its connection), not one per byte:
            # the listener ended it unanswered
            slow.settimeout(6.0)
            try:
                got = slow.recv(1 << 16)
            except ConnectionResetError:
                got = b""
            ended = time.monotonic() - t0 + 0.5
            assert got == b"" and ended < 4.0, (got, ended)
            t.join(10)
            assert cut and cut[0] < 6.0, cut                 # its next bytes were refused
        finally:
            slow.close()


# -- 10: the name squatted before the target started ----------------------------------

def test_a_target_whose_name_was_taken_before_it_started_still_answers(fake_cuda_dir, tmp_path):
    go = tmp_path / "go"
    code = PRELUDE + '''
import os, time
while not os.path.exists(%r):
    time.sleep(0.01)
''' % str(go) + WATCHING + '''
    time.sleep(60)
'''
    with Live(code, env=child_env(fake_cuda_dir)) as live:
        squatter = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            squatter.bind(listener(live.pid))            # before its first watch()
            squatter.listen(8)
            go.write_text("")
            live.wait_for("READY", name="stdout")
            p = cli("dump", "--json", str(live.pid), timeout=60)
            assert p.returncode == 0, p
            assert json.loads(p.stdout)["pid"] == live.pid, p.stdout
            q = cli("dump", str(live.pid), timeout=60)
            assert q.returncode == 0 and "unfinished launches of pid %d" % live.pid in q.stdout, q
            assert "cannot ask this process" not in live.text(), live   # no warning there
            # the squatter was connected to (its pid checked), and sent nothing
            squatter.setblocking(False)
            sent = []
            while True:
                try:
                    c, _ = squatter.accept()
                except BlockingIOError:
                    break
                c.settimeout(2)
                sent.append(c.recv(1 << 16))
                c.close()
            assert sent and all(b == b"" for b in sent), sent
        finally:
            squatter.close()


# -- 6: escape sequences from the target ----------------------------------------------

EVIL = "\x1b]0;x\x07\x1b[2J"
EVIL_SAFE = "?]0;x??[2J"

EVIL_RANK = PRELUDE + '''
import os, time, cuda_debug, cuda_debug.testing as t
fake.fake_set_async(1)
rank = int(os.environ["RANK"])
AR = b"ncclDevKernel_AllReduce_Sum_f32_RING_LL"
EVIL = %r.encode()
fake.fake_set_kernel(AR, 0, 0, b"", -1, 60000000)
fake.fake_set_kernel(EVIL, 0, 0, b"", -1, 60000000)
with cuda_debug.watch():
    if rank == 1:
        fake.fake_launch(EVIL, 0, 1, 1, 1, 32, 1, 1)   # a compute kernel that stalls
    else:
        fake.fake_launch(AR, 0, 1, 1, 1, 64, 1, 1)
    os.write(1, b"READY %%d\\n" %% rank)
    time.sleep(60)
''' % EVIL

def test_names_from_the_target_reach_the_terminal_sanitised_and_json_raw(fake_cuda_dir, tmp_path):
    rank = tmp_path / ("train%s.py" % EVIL)               # a file name with them too
    rank.write_text(EVIL_RANK)
    with Live(AGENT % str(rank), env=dict(child_env(fake_cuda_dir),
                                          CUDA_DEBUG_WATCH_EXACT="1")) as live:
        live.wait_for("READY 0", name="stdout")
        live.wait_for("READY 1", name="stdout")
        p = cli("dump", str(live.pid), timeout=60)
        assert p.returncode == 0, p
        assert "\x1b" not in p.stdout and "\x07" not in p.stdout, repr(p.stdout)
        v = p.stdout.splitlines()[-1]
        assert v.startswith("verdict: rank 1 stalls the job: rank 1 in %s at %s:" % (
            EVIL_SAFE, str(tmp_path / ("train%s.py" % EVIL_SAFE)))), v
        q = cli("dump", "--json", str(live.pid), timeout=60)
        assert q.returncode == 0, q
        doc = json.loads(q.stdout)
        r1 = doc["ranks"][1]["streams"][0]
        assert r1["kernel"] == EVIL and r1["filename"] == str(rank), r1
        assert EVIL in doc["verdict"], doc["verdict"]
        one = cli("dump", str(doc["ranks"][1]["pid"]), timeout=60)    # one process: its text
        assert one.returncode == 0 and "in <module>" in one.stdout, one
        assert "\x1b" not in one.stdout and EVIL_SAFE in one.stdout, repr(one.stdout)


def test_the_verdict_and_the_prefixed_text_of_a_forged_document_are_sanitised():
    """A document from the job's store is anyone's: every line printed from it."""
    from cuda_debug import _dump

    def doc(rank, kernel, collective, text):
        return {"format": "cuda_debug.dump", "version": 1, "pid": 100 + rank, "rank": rank,
                "time": time.time(), "text": text, "recent": [],
                "flight_recorder": {"time": time.time(), "entries": [
                    {"seq": 1, "op": "all_reduce" + EVIL, "state": "started" + EVIL}]},
                "streams": [dict(seq=1, stream=0, kernel=kernel, short=kernel,
                                 collective=collective, graph=False, thread_id=1,
                                 thread_name="t" + EVIL, device=0, age_ns=2 * 10**9, queued=0,
                                 frames=[["/t/a%s.py" % EVIL, 3, "f" + EVIL, 1]])]}
    docs = [doc(0, "ncclDevKernel_AllReduce", "all_reduce", "line one\n" + EVIL + "two"),
            doc(1, "k" + EVIL, None, "x\udce9y")]
    assert all(_dump.document_problem(d) is None for d in docs)
    lines = _dump.verdict_lines(docs)
    printed = "".join(_dump.prefixed(d) for d in docs) + "\n".join(lines)
    assert "\x1b" not in printed and "\x07" not in printed, repr(printed)
    assert "[rank 0] %stwo\n" % EVIL_SAFE in printed and "[rank 1] x\\xe9y\n" in printed, printed
    assert lines[0].startswith("verdict: rank 1 stalls the job: rank 1 in k%s at /t/a%s.py:3"
                               % (EVIL_SAFE, EVIL_SAFE)), lines[0]
    assert "#1 all_reduce%s started%s" % (EVIL_SAFE, EVIL_SAFE) in lines[1], lines
    assert _dump.report_text(docs[0]) == "line one\n" + EVIL_SAFE + "two"
    assert EVIL in _dump.verdict(docs)                    # --json keeps the raw names


# -- 7: the store's nonsense and a rank's job thread ----------------------------------

@pytest.mark.parametrize("params", [b'{"recent": null}', b'{"recent": %d}' % 10**30, b"[1, 2]",
                                    b'{"recent": "all"}', b"\xff\xfe", b'{"recent": -5}',
                                    b"x" * 10000],
                         ids=["null", "10**30", "a list", "a string", "not UTF-8", "negative",
                              "10,000 bytes"])
def test_nonsense_in_a_request_neither_kills_the_ranks_job_thread_nor_writes_its_stderr(
        fake_cuda_dir, params):
    with FakeStore() as store:
        with Live(PRELUDE + JOB_RANK, env=rank_env(fake_cuda_dir, store)) as live:
            live.wait_for("READY", name="stdout")
            reg = json.loads(wait_key(store, "cuda_debug/dump/rank/0"))
            assert reg["pid"] == live.pid, reg
            base = int(store.value("cuda_debug/dump/requests") or b"0")
            store.put("cuda_debug/dump/params/%d" % (base + 1), params)
            store.put("cuda_debug/dump/requests", str(base + 1))
            first = json.loads(wait_key(store, "cuda_debug/dump/answer/%d/0" % (base + 1)))
            assert first["pid"] == live.pid and len(first["recent"]) == 1, first  # the default
            # the thread lives on: the next request (a good one) is answered too
            store.put("cuda_debug/dump/params/%d" % (base + 2), b'{"recent": 0}')
            store.put("cuda_debug/dump/requests", str(base + 2))
            second = json.loads(wait_key(store, "cuda_debug/dump/answer/%d/0" % (base + 2)))
            assert second["pid"] == live.pid and second["recent"] == [], second
            assert "Traceback" not in live.text() and "Exception" not in live.text(), live


def test_the_requested_number_of_launches_is_read_within_bounds():
    from cuda_debug import _dump_job as _job
    assert _job.requested_recent(b'{"recent": 7}') == 7
    assert _job.requested_recent(b'{"recent": 65536}') == 65536
    for raw in (b'{"recent": 65537}', b'{"recent": true}', b'{"recent": 1.5}', b"null", b"7",
                b'{"recent": [1]}', None, b""):
        assert _job.requested_recent(raw) == 1, raw


# -- 8: dump --job on the store's nonsense --------------------------------------------

@pytest.mark.parametrize("planted, message", [
    (registration(world_size=10**9), "rank 0's registration gives a world size of 1000000000: "
                                     "not a job's (0 to 131072)"),
    ("[1, 2]", "rank 0's registration is a JSON list, not a cuda_debug registration"),
    ("{not json", "rank 0's registration is not JSON: not written by cuda_debug"),
    (registration(pid=None), "rank 0's registration has no pid, not an int"),
    (registration(pid=10**30), "rank 0's registration holds a number of 31 digits: not written "
                               "by cuda_debug"),
    (registration(pid=1 << 40), "rank 0's registration names pid %d: not a process id" % (1 << 40)),
    (registration(host=["h"]), "rank 0's registration has a list host, not a string"),
    (registration(format="other", version=9), "rank 0's registration is of another version "
                                              "('other' 9; this cuda_debug reads"),
], ids=["world_size 10**9", "a list", "not JSON", "no pid", "pid 10**30", "pid 2**40", "host a list",
        "another version"])
def test_dump_job_on_a_registration_that_is_nonsense_says_so_in_one_line(planted, message):
    with FakeStore() as store:
        store.put("cuda_debug/dump/rank/0", planted)
        t0 = time.monotonic()
        p = dump_job(store)
        assert time.monotonic() - t0 < 30, "it took %.0f s" % (time.monotonic() - t0)
        assert p.returncode == 1, p
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            "python -m cuda_debug dump: --job 127.0.0.1:%d: %s" % (store.port, message)), p.stderr
        assert p.stdout == "", p




@pytest.mark.parametrize("answer, why", [
    ({k: v for k, v in GOOD.items() if k != "pid"}, "sent a document without 'pid'"),
    ([GOOD], "sent a JSON list, not a dump document"),
    (dict(GOOD, version=2), "speaks another version of the dump ('cuda_debug.dump' 2;"),
    (dict(GOOD, streams=[{"seq": 1}]), "sent a stream without 'stream'"),
    (dict(GOOD, time="noon"), "sent a document whose 'time' is a str"),
    ("not json", "sent an answer that is not JSON"),
], ids=["no pid", "a list", "version 2", "a stream without stream", "time a str", "not JSON"])
def test_dump_job_on_an_answer_that_is_nonsense_names_the_rank_and_why(answer, why):
    with FakeStore() as store:
        store.put("cuda_debug/dump/rank/0", registration(host="node\x1b[2J0"))
        t = answering_rank(store, answer if isinstance(answer, str) else json.dumps(answer))
        p = dump_job(store)
        t.join(5)
        assert p.returncode == 1, p
        lines = p.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("python -m cuda_debug dump: rank 0 %s" % why), lines
        assert lines[0].endswith("(pid 4242 on node?[2J0)"), lines   # sanitised
        assert "Traceback" not in p.stderr and p.stdout == "", p


# -- the store client on a large value ------------------------------------------------

class _Dribbler:
    """A socket that hands out a GET answer of n bytes 4 KiB at a time (as a
    network does), counting the calls."""

    def __init__(self, n):
        self.data = memoryview(struct.pack("=Q", n) + b"v" * n)
        self.at = 0

    def sendall(self, b):
        pass

    def recv(self, k):
        k = min(k, 4096, len(self.data) - self.at)
        out = bytes(self.data[self.at:self.at + k])
        self.at += k
        return out


def test_the_store_client_reads_a_large_value_in_linear_time():
    """Concatenating bytes made the read of n bytes in 4 KiB pieces O(n^2): a 32 MiB
    document took 13 s here. Timed against the same read of a value 8 times smaller:
    linear is ~8x, quadratic ~64x."""
    from cuda_debug import _dump_tcpstore as _tcpstore

    def read(n):
        c = _tcpstore.Client.__new__(_tcpstore.Client)
        c.sock = _Dribbler(n)
        t0 = time.perf_counter()
        v = c.get("k")
        assert len(v) == n
        return time.perf_counter() - t0
    small = min(read(2 << 20) for _ in range(3))
    large = min(read(16 << 20) for _ in range(2))
    assert large < 24 * small + 0.05, (small, large)


def test_a_request_made_as_soon_as_a_rank_registers_is_answered(fake_cuda_dir):
    """A client that sees a rank registered and asks at once: the rank's
    count of requests already seen was read after its registration, so a
    request landing in between was taken as answered, and `dump --job` waited
    for an answer that never came (seen under load: the CI's sanitizer step).
    Here the request lands the moment the registration does."""
    with FakeStore() as store:
        def ask_at_registration(key, value):
            if key == b"/cuda_debug/dump/rank/0":
                store.data[b"/cuda_debug/dump/params/1"] = b'{"recent": 1}'
                store.data[b"/cuda_debug/dump/requests"] = b"1"
        store.on_set = ask_at_registration
        with Live(PRELUDE + JOB_RANK, env=rank_env(fake_cuda_dir, store)) as live:
            live.wait_for("READY", name="stdout")
            first = json.loads(wait_key(store, "cuda_debug/dump/answer/1/0", timeout=10.0))
            assert first["pid"] == live.pid, first
