"""What another process writes reaches ``dump`` as data, never as an
instruction (SPEC section 19), on CPU (a fake c10d store, planted answers):

- a frame's file, as another process names it, is rendered as given and never
  opened: not a FIFO (it would hang dump past its --timeout), not /dev/zero
  (read without bound), not a file the caller may read (its first line
  printed);
- the trace file is written through an unpredictable O_EXCL temporary file
  in its folder, then renamed: a link planted at the old predictable name
  (PATH.<pid>.tmp) is not followed; a trace that cannot be written leaves
  nothing behind, says why in one line and fails the command.
"""
import json
import os
import stat
import time

import pytest

from fake_store import FakeStore
from helpers.dump_job import GOOD, answering_rank, dump_job, registration


def stream_at(filename, seq=5):
    """A stream entry whose one frame names `filename` (a user frame)."""
    return {"seq": seq, "stream": 7, "kernel": "k", "short": "k", "collective": None,
            "graph": False, "thread_id": 11, "thread_name": "main", "device": 0,
            "age_ns": 1000, "frames": [[filename, 1, "f", 1]], "queued": 0}


def answer_naming(filename):
    return json.dumps(dict(GOOD, streams=[stream_at(filename)], recent=[
        dict(stream_at(filename), done=0)]))


def planted_file(tmp_path, kind):
    if kind == "a FIFO":
        p = tmp_path / "fifo.py"
        os.mkfifo(p)
        return str(p)
    if kind == "/dev/zero":
        return "/dev/zero"
    p = tmp_path / "secret.py"          # readable by the caller, as /etc/shadow by root
    p.write_text("TOP SECRET 1234\n")
    os.chmod(p, 0o600)
    return str(p)


@pytest.mark.parametrize("mode", [["--json"], [], ["--trace", "TRACE"]],
                         ids=["--json", "text", "--trace"])
@pytest.mark.parametrize("kind", ["a FIFO", "/dev/zero", "a readable file"])
def test_a_frames_file_from_another_process_is_never_opened(tmp_path, kind, mode):
    """Before: linecache read the named file (a FIFO hung dump for good,
    /dev/zero was read without bound, --json printed the file's first line)."""
    name = planted_file(tmp_path, kind)
    mode = [str(tmp_path / "t.json") if m == "TRACE" else m for m in mode]
    with FakeStore() as store:
        store.put("cuda_debug/dump/rank/0", registration())
        t = answering_rank(store, answer_naming(name))
        t0 = time.monotonic()
        p = dump_job(store, *mode)          # 60 s at most: a hang fails here
        t.join(5)
    assert time.monotonic() - t0 < 30, "dump took %.0f s" % (time.monotonic() - t0)
    assert p.returncode == 0, p
    assert "Traceback" not in p.stderr, p.stderr
    assert "TOP SECRET" not in p.stdout + p.stderr
    if mode == ["--json"]:
        out = json.loads(p.stdout)
        (frame,) = out["ranks"][0]["streams"][0]["stack"]
        assert frame == [name, 1, "f", None], frame       # as given, no source line
    if mode and mode[0] == "--trace":
        trace = (tmp_path / "t.json").read_text()
        assert "TOP SECRET" not in trace and name in trace


def test_frames_from_another_process_are_rendered_without_reading_their_files(monkeypatch):
    from cuda_debug import _locations
    import linecache
    opened = []
    monkeypatch.setattr(linecache, "getline", lambda *a, **k: opened.append(a) or "x")
    monkeypatch.setattr(linecache, "getlines", lambda *a, **k: opened.append(a) or ["x"])
    stack = _locations.stack_from_frames([["/etc/shadow", 1, "f", 1], ["/dev/zero", 2, "g", 1]])
    assert [tuple(f) for f in stack] == [("/dev/zero", 2, "g", None), ("/etc/shadow", 1, "f", None)]
    assert stack.format() == ['  File "/dev/zero", line 2, in g\n',
                              '  File "/etc/shadow", line 1, in f\n']
    assert _locations.where(stack) == "/etc/shadow:1 in f"
    assert opened == []


# -- the trace file -------------------------------------------------------------------

def test_the_trace_does_not_follow_a_link_planted_at_a_predictable_name(tmp_path):
    """Another user plants PATH.<pid>.tmp -> a file of the writer's: it stays
    as it was, and so does every other name in the folder but PATH."""
    from cuda_debug import _dump_trace
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.chmod(victim, 0o600)
    out = tmp_path / "out.json"
    for name in ("out.json.%d.tmp" % os.getpid(), "out.json.tmp"):
        os.symlink(victim, tmp_path / name)
    before = sorted(os.listdir(tmp_path))
    _dump_trace.write_trace(str(out), [dict(GOOD, recent=[dict(stream_at("/a.py"), done=1)])])
    assert victim.read_text() == "precious\n"
    assert sorted(os.listdir(tmp_path)) == sorted(before + ["out.json"])
    assert json.loads(out.read_text())["traceEvents"]
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600


def test_the_trace_replaces_a_link_at_its_path_rather_than_writing_through_it(tmp_path):
    from cuda_debug import _dump_trace
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "out.json")
    _dump_trace.write_trace(str(tmp_path / "out.json"), [GOOD])
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(tmp_path / "out.json")


def test_a_trace_that_cannot_be_written_leaves_nothing_and_fails_dump(tmp_path):
    """--trace naming a folder: before, a traceback (--job) or exit 0 (dump
    PID), and <dir>.<pid>.tmp left in the parent."""
    from cuda_debug import _dump_trace
    target = tmp_path / "a_folder"
    target.mkdir()
    with pytest.raises(OSError):
        _dump_trace.write_trace(str(target), [GOOD])
    assert os.listdir(tmp_path) == ["a_folder"] and os.listdir(target) == []
    with FakeStore() as store:
        store.put("cuda_debug/dump/rank/0", registration())
        t = answering_rank(store, json.dumps(GOOD))
        p = dump_job(store, "--trace", str(target))
        t.join(5)
    assert p.returncode == 1, p
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "python -m cuda_debug dump: --trace %s: not written: " % target), lines
    assert os.listdir(tmp_path) == ["a_folder"] and os.listdir(target) == []


# -- the store: what a rank leaves there, what stops it answering ----------------------

from conftest import Live                                   # noqa: E402
from fake_cuda import PRELUDE                               # noqa: E402
from helpers.dump_job import JOB_RANK, rank_env, wait_key  # noqa: E402


def ask(store, n, params):
    store.put("cuda_debug/dump/params/%d" % n, params)
    store.put("cuda_debug/dump/requests", str(n))


def test_a_rank_keeps_at_most_two_answers_in_the_store_whoever_asks(fake_cuda_dir):
    """Anyone can add to the request counter with a 40-byte write, asking for
    65536 launches: each answer (up to 25 MB) stayed in the store for good
    (5 requests: 111.6 MB after 14 s). Now a rank deletes its answers but the
    newest two, and dump --job deletes what it read."""
    with FakeStore() as store:
        with Live(PRELUDE + JOB_RANK, env=rank_env(fake_cuda_dir, store)) as live:
            live.wait_for("READY", name="stdout")
            wait_key(store, "cuda_debug/dump/rank/0")
            base = int(store.value("cuda_debug/dump/requests") or b"0")
            for n in range(base + 1, base + 6):
                ask(store, n, b'{"recent": 65536}')
                wait_key(store, "cuda_debug/dump/answer/%d/0" % n)
            time.sleep(0.5)
            answers = store.keys("cuda_debug/dump/answer/")
            assert answers == ["cuda_debug/dump/answer/%d/0" % n for n in (base + 4, base + 5)], \
                answers


def test_dump_job_leaves_nothing_of_its_request_in_the_store():
    with FakeStore() as store:
        store.put("cuda_debug/dump/rank/0", registration())
        t = answering_rank(store, json.dumps(GOOD))
        p = dump_job(store)
        t.join(5)
        assert p.returncode == 0, p
        assert store.keys("cuda_debug/dump/answer/") == [], store.keys()
        assert store.keys("cuda_debug/dump/params/") == [], store.keys()


def test_requests_nested_thousands_deep_never_stop_a_rank_answering(fake_cuda_dir):
    """"[" * 4000 as a request's params raised RecursionError in the rank,
    which dropped its store connection; reconnections were counted and never
    reset, so after 3 such requests the rank never answered again."""
    with FakeStore() as store:
        with Live(PRELUDE + JOB_RANK, env=rank_env(fake_cuda_dir, store)) as live:
            live.wait_for("READY", name="stdout")
            wait_key(store, "cuda_debug/dump/rank/0")
            base = int(store.value("cuda_debug/dump/requests") or b"0")
            for i in range(1, 5):                   # each answered, as a request of none
                ask(store, base + i, b"[" * 4000)
                doc = json.loads(wait_key(store, "cuda_debug/dump/answer/%d/0" % (base + i),
                                          timeout=10.0))
                assert len(doc["recent"]) == 1, doc
            ask(store, base + 5, b'{"recent": 0}')
            doc = json.loads(wait_key(store, "cuda_debug/dump/answer/%d/0" % (base + 5)))
            assert doc["pid"] == live.pid and doc["recent"] == [], doc
            assert "Traceback" not in live.text(), live


def test_json_from_another_process_is_parsed_within_bounds():
    from cuda_debug import _untrusted
    for raw, why in [(b"[" * 4000, "nested more than 32 deep"),
                     (b'{"a": %d}' % 10**400, "a number of 401 digits"),
                     (b'{"a": %d}' % (1 << 64), "a number beyond 64 bits"),
                     (b"1e400", "a number beyond a double"), (b"[NaN]", "NaN, not a number"),
                     (b"-Infinity", "-Infinity, not a number"),
                     (b"x" * 100, "100 bytes, more than 99")]:
        with pytest.raises(_untrusted.OutOfBounds, match=why.replace("*", r"\*")):
            _untrusted.loads(raw, 99 if len(raw) == 100 else 1 << 20)
    with pytest.raises(ValueError):
        _untrusted.loads(b"\xff\xfe", 100)
    deep_string = b'{"s": "' + b"[" * 5000 + b'", "t": [[1]]}'
    assert _untrusted.loads(deep_string, 1 << 20) == {"s": "[" * 5000, "t": [[1]]}
    assert _untrusted.loads(b'[-18446744073709551615, 1.5e300]', 100) == \
        [-18446744073709551615, 1.5e300]


def test_a_rank_answers_after_any_number_of_store_hiccups(fake_cuda_dir):
    """Connections lost were counted and never reset: after 3 in a job's
    life the rank never connected again. Here the store drops every
    connection 4 times; the rank comes back each time (it registers again)
    and answers."""
    with FakeStore() as store:
        registered = []
        store.on_set = lambda key, value: registered.append(key) \
            if key == b"/cuda_debug/dump/rank/0" else None
        with Live(PRELUDE + JOB_RANK, env=rank_env(fake_cuda_dir, store)) as live:
            live.wait_for("READY", name="stdout")
            wait_key(store, "cuda_debug/dump/rank/0")
            for i in range(4):
                seen = len(registered)
                store.drop_connections()
                deadline = time.monotonic() + 20
                while len(registered) == seen:
                    assert time.monotonic() < deadline, "not back after %d hiccups" % (i + 1)
                    time.sleep(0.05)
            n = int(store.value("cuda_debug/dump/requests") or b"0") + 1
            ask(store, n, b'{"recent": 0}')
            doc = json.loads(wait_key(store, "cuda_debug/dump/answer/%d/0" % n))
            assert doc["pid"] == live.pid, doc


# -- smaller: what the C core embeds, what replay takes -------------------------------

def test_the_extra_every_dump_document_embeds_must_be_a_json_object():
    """dump_set_extra took any bytes and every later document embedded them
    (a document that is not JSON: no dump of the process parsed again)."""
    from cuda_debug import _core, _dump
    try:
        for bad in (b"{not json", b"[1, 2]", b'{"a": 1', b"\xff", b"1"):
            with pytest.raises(ValueError, match="not a JSON object"):
                _core.dump_set_extra(bad)
            assert _dump.document_problem(_dump.local_document(0)) is None
        _core.dump_set_extra(b'{"time": 1.0, "entries": []}')
        assert _dump.local_document(0)["flight_recorder"] == {"time": 1.0, "entries": []}
    finally:
        _core.dump_set_extra(b"")
    assert _dump.local_document(0).get("flight_recorder") is None


@pytest.mark.parametrize("raw", ["1,,2", "1,", ",3", " , "])
def test_replay_launch_candidates_with_an_empty_item_are_refused(raw):
    """`--launch 1,,2` dropped the empty item silently (a candidate the user
    meant to give, left out)."""
    from cuda_debug._cli import UsageError, replay
    with pytest.raises(UsageError, match="has an empty item"):
        replay._launch_value("--launch", raw)
    assert replay._launch_value("--launch", "1, 2") == (1, 2)
