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
from test_dump_trust_cpu import GOOD, answering_rank, dump_job, registration


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
    from cuda_debug import _dump
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.chmod(victim, 0o600)
    out = tmp_path / "out.json"
    for name in ("out.json.%d.tmp" % os.getpid(), "out.json.tmp"):
        os.symlink(victim, tmp_path / name)
    before = sorted(os.listdir(tmp_path))
    _dump.write_trace(str(out), [dict(GOOD, recent=[dict(stream_at("/a.py"), done=1)])])
    assert victim.read_text() == "precious\n"
    assert sorted(os.listdir(tmp_path)) == sorted(before + ["out.json"])
    assert json.loads(out.read_text())["traceEvents"]
    assert stat.S_IMODE(os.stat(out).st_mode) == 0o600


def test_the_trace_replaces_a_link_at_its_path_rather_than_writing_through_it(tmp_path):
    from cuda_debug import _dump
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    os.symlink(victim, tmp_path / "out.json")
    _dump.write_trace(str(tmp_path / "out.json"), [GOOD])
    assert victim.read_text() == "precious\n"
    assert not os.path.islink(tmp_path / "out.json")


def test_a_trace_that_cannot_be_written_leaves_nothing_and_fails_dump(tmp_path):
    """--trace naming a folder: before, a traceback (--job) or exit 0 (dump
    PID), and <dir>.<pid>.tmp left in the parent."""
    from cuda_debug import _dump
    target = tmp_path / "a_folder"
    target.mkdir()
    with pytest.raises(OSError):
        _dump.write_trace(str(target), [GOOD])
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
