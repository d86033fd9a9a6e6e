"""``dump --job`` on random and hostile values for every key it reads from the
job's store (SPEC section 19): a rank's registration (``rank/<r>``), its
answer (``answer/<n>/<r>``), its last hang report (``hang/<r>``), the request
counter, and, on the rank's side, a request's ``params/<n>``. Whatever is
there: no traceback (one line, exit 1, or the report), no hang, no file
opened, memory bounded.

Two layers: the documents, mutated key by key and at random, through
everything ``dump --job`` does with one (the checks, the text, --json, the
verdict, the trace events), in this process with every open() watched; then
the command itself against a fake store holding the hostile values.
"""
import builtins
import copy
import io
import json
import os
import random
import time
import tracemalloc

import pytest

from fake_store import FakeStore
from helpers.dump_job import answering_rank, dump_job, registration

FRAME = ["/w/train.py", 12, "step", 1]


def launch(seq, **kw):
    e = {"seq": seq, "stream": 7, "device": 0, "kernel": "_Z4spinv", "short": "spin",
         "collective": None, "graph": False, "thread_id": 11, "thread_name": "main",
         "age_ns": 2_000_000_000, "frames": [list(FRAME), ["/w/lib.py", 3, "f", 2]]}
    e.update(kw)
    return e


def document(rank=0):
    """A document as a rank's C core writes it (csrc/report/inflight_doc.c), every
    optional part present."""
    return {
        "format": "cuda_debug.dump", "version": 1, "pid": 4242 + rank, "rank": rank,
        "world_size": 2, "time": 1700000000.5, "watching": True, "hang_after_ns": 0,
        "dump_signal": 10, "scanned": 3, "newest_age_ns": 5, "streams_cut": 0, "culprit": 3,
        "text": "cuda_debug: 1 stream\n  spin at /w/train.py:12\n",
        "flight_recorder": {"time": 1700000000.0,
                            "entries": [{"seq": 4, "op": "allreduce", "state": "started",
                                         "pg": 0}],
                            "cpu_waits": [{"collective": "all_reduce", "backend": "gloo",
                                           "filename": "/w/train.py", "lineno": 9,
                                           "function": "step", "thread_id": 11,
                                           "thread_name": "main", "since": 1699999990.0}]},
        "streams": [dict(launch(3, last_seq=3, cbid=307, candidates=2, open_seq=3), queued=1),
                    dict(launch(5, stream=9, graph=True, collective="all_reduce",
                                graph_status=4, graph_candidates=1,
                                graph_nodes=[{"node": 2, "kernel": "k", "short": "k",
                                              "collective": None, "frames": [list(FRAME)]}]),
                         queued=0)],
        "recent": [launch(1, done=1), launch(2, done=0), launch(3, done=-1)],
    }


# Values JSON can carry (within the bounds dump --job parses: cuda_debug/_untrusted.py)
HOSTILE = [None, True, False, 0, -1, 1, 2 ** 63 - 1, -(2 ** 63), 2 ** 64 - 1, 0.5, -1e308,
           1e308, "", "x", "\x1b[2J\x07", "\udcff", "a" * 5000, "/dev/zero", "/etc/shadow",
           [], [None], [[[]]], [1, 2, 3, 4, 5], {}, {"a": {}}, {"seq": []},
           [["/dev/zero", 1, "f", 1]], [[1, 2, 3]]]


def paths(obj, at=()):
    """Every (path) to a value in obj, containers included."""
    yield at
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from paths(v, at + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from paths(v, at + (i,))


def put(obj, path, value):
    obj = copy.deepcopy(obj)
    if not path:
        return value
    parent = obj
    for p in path[:-1]:
        parent = parent[p]
    if value is _DELETE:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return obj


_DELETE = object()


def render(docs, hangs=()):
    """Everything dump --job does with the documents it accepted (cuda_debug/
    _cli.py _dump_job): --json, the text, the verdict lines, the trace."""
    from cuda_debug import _dump, _dump_trace
    out = [json.dumps({"ranks": [_dump.as_json(d) for d in docs],
                       "last_hang_reports": [_dump.as_json(h) for h in hangs],
                       "verdict": _dump.verdict(list(docs) + list(hangs))}, indent=2)]
    out += [_dump.prefixed(d) for d in docs]
    out += [_dump.prefixed(h, "(its last hang report, %.0f s ago)\n" % (
        time.time() - float(h["time"])) + (h.get("text") or "")) for h in hangs]
    out += _dump.verdict_lines(list(docs) + list(hangs))
    out.append(json.dumps(_dump_trace.trace_events(docs)))
    return sum(len(s) for s in out)


def through_dump(raw: bytes):
    """What dump --job makes of one answer: (None, why) or the rendered size."""
    from cuda_debug import _dump, _untrusted
    try:
        doc = _untrusted.loads(raw, 64 << 20)
    except ValueError:
        return "not JSON"
    problem = _dump.document_problem(doc)
    if problem:
        assert "\n" not in problem and len(problem) < 1000, problem[:300]
        return problem
    return render([doc, document(1)], [doc])


@pytest.fixture
def no_open(monkeypatch):
    """Every open() of this process recorded (the test fails on any). The
    modules dump uses are imported first (their own files)."""
    through_dump(json.dumps(document()).encode())
    opened = []

    def refuse(name):
        def f(*a, **k):
            opened.append((name, a[:1]))
            raise AssertionError("%s(%r) while rendering another process's document" % (name, a[:1]))
        return f
    for mod, name in ((builtins, "open"), (io, "open"), (os, "open")):
        monkeypatch.setattr(mod, name, refuse(name))
    return opened


def test_every_key_of_a_document_with_every_hostile_value(no_open):
    """Each value of the document (every level) replaced by each hostile value,
    and deleted: checked and rendered without an exception, a file opened, or
    output out of proportion to the document."""
    base = document()
    assert isinstance(through_dump(json.dumps(base).encode()), int)   # the good one renders
    n = 0
    t0 = time.monotonic()
    for path in list(paths(base)):
        for value in HOSTILE + [_DELETE] if path else HOSTILE:
            doc = put(base, path, value)
            raw = json.dumps(doc).encode()
            try:
                size = through_dump(raw)
            except Exception as e:
                raise AssertionError("%s = %.80r: %s: %.300s" % (
                    "/".join(map(str, path)), value, type(e).__name__, e)) from None
            if isinstance(size, int):
                assert size < 200 * len(raw) + 100000, (path, value, size)
            n += 1
    assert n > 2000 and no_open == []
    assert time.monotonic() - t0 < 120, "%d documents took %.0f s" % (n, time.monotonic() - t0)


def random_value(rng, depth=0):
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, -1, 1, 7, 2 ** 63 - 1, -(2 ** 63), 2 ** 64 - 1, rng.randrange(-10**6, 10**6)])
    if kind == 3:
        return rng.choice([0.0, -0.5, 1e308, -1e308, 1e-300, rng.random() * 1e9])
    if kind in (4, 5):
        return "".join(rng.choice("ab/\x1b\x07\n\t%s{}[]\\\"\udcff\u202e") for _ in range(rng.randrange(12)))
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    if kind == 7:
        keys = ["seq", "stream", "frames", "time", "entries", "cpu_waits", "since", "node", "x"]
        return {rng.choice(keys): random_value(rng, depth + 1) for _ in range(rng.randrange(4))}
    return [list(FRAME)]


def test_random_documents(no_open):
    """Several values replaced at once, at random (seeded)."""
    rng = random.Random(43)
    base = document()
    all_paths = list(paths(base))[1:]
    for i in range(3000):
        doc = base
        for _ in range(rng.randrange(1, 5)):
            live = [p for p in all_paths if _exists(doc, p)]
            if not live:
                break
            doc = put(doc, rng.choice(live), random_value(rng))
        raw = json.dumps(doc).encode()
        try:
            through_dump(raw)
        except Exception as e:
            raise AssertionError("case %d: %s: %.300s\n%.1500r" % (i, type(e).__name__, e, raw)) from None
    assert no_open == []


def _exists(doc, path):
    for p in path:
        if isinstance(doc, dict) and p in doc:
            doc = doc[p]
        elif isinstance(doc, list) and isinstance(p, int) and p < len(doc):
            doc = doc[p]
        else:
            return False
    return True


def test_rendering_a_large_hostile_document_stays_within_bounds(no_open):
    """The largest answer dump --job reads (64 MiB): memory for the rendering in
    proportion to it, never a copy per frame of a file's contents."""
    doc = document()
    doc["recent"] = [launch(i, done=1, frames=[["/dev/zero", i, "f" * 50, 1]] * 30)
                     for i in range(3000)]
    raw = json.dumps(doc).encode()
    tracemalloc.start()
    try:
        through_dump(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 60 * len(raw), (peak, len(raw))


# -- the command, on what the store holds ------------------------------------------

STORE_CASES = {
    "registration nested": ("rank/0", b"[" * 100000),
    "registration 10**400": ("rank/0", b'{"pid": %d, "host": "h", "world_size": 1}' % 10**400),
    "registration NaN pid": ("rank/0", b'{"pid": NaN, "host": "h", "world_size": 1}'),
    "registration unhashable": ("rank/0", b'{"pid": 1, "host": {"a": 1}, "world_size": [1]}'),
    "registration huge": ("rank/0", b'{"pid": 1, "host": "' + b"h" * (1 << 20) + b'"}'),
    "registration not UTF-8": ("rank/0", b"\xff\xfe{}"),
    "answer nested": ("answer", b"[" * 100000),
    "answer 10**400": ("answer", json.dumps(dict(document(), time=1)).replace(
        '"time": 1', '"time": 1%s' % ("0" * 400)).encode()),
    "answer 1e400 age": ("answer", json.dumps(document()).replace(
        '"age_ns": 2000000000', '"age_ns": 2e400').encode()),
    "answer unhashable status": ("answer", json.dumps(document()).replace(
        '"graph_status": 4', '"graph_status": [4]').encode()),
    "answer unhashable done": ("answer", json.dumps(document()).replace(
        '"done": 1', '"done": {}').encode()),
    "answer empty": ("answer", b""),
    "hang nested": ("hang", b"{" * 5000),
    "hang 10**400": ("hang", b'{"format": "cuda_debug.dump", "version": 1, "pid": %d}' % 10**400),
    "requests not a number": ("requests", b"many"),
}


@pytest.mark.parametrize("case", sorted(STORE_CASES))
def test_dump_job_on_a_hostile_store_says_so_in_a_line_or_reports(case, tmp_path):
    where, value = STORE_CASES[case]
    trace = tmp_path / "t.json"
    with FakeStore() as store:
        store.put("cuda_debug/dump/rank/0", value if where == "rank/0" else registration())
        if where == "requests":
            store.put("cuda_debug/dump/requests", value)
        if where == "hang":
            store.put("cuda_debug/dump/hang/0", value)
        # (no rank answers while the counter is nonsense: the fake rank reads it too)
        t = answering_rank(store, value if where == "answer" else json.dumps(document())) \
            if where != "requests" else None
        t0 = time.monotonic()
        p = dump_job(store, "--trace", str(trace))
        if t is not None:
            t.join(5)
    took = time.monotonic() - t0
    assert took < 30, took
    assert "Traceback" not in p.stderr and "Error:" not in p.stderr, p.stderr
    assert p.returncode in (0, 1), p
    if p.returncode == 1:
        assert p.stderr.count("\n") <= 2, p.stderr      # the rank's line (and the trace's)
    assert os.listdir(tmp_path) in ([], ["t.json"]), os.listdir(tmp_path)


def test_a_requests_params_random_and_hostile_are_read_as_a_number_of_launches():
    """The rank's side: whatever params/<n> holds, requested_recent answers a
    number of launches (0 to RECENT_MAX; else the default, 1), never raises."""
    from cuda_debug import _dump_job as _job
    rng = random.Random(7)
    cases = [b"[" * 4000, b"{" * 4000, b'{"recent": %d}' % 10**400, b'{"recent": 1e400}',
             b'{"recent": NaN}', b"\xff" * 10, b"", b'{"recent": {"a": []}}', b"x" * 5000]
    for _ in range(2000):
        cases.append(json.dumps({rng.choice(["recent", "x"]): random_value(rng)}).encode())
        cases.append(bytes(rng.randrange(256) for _ in range(rng.randrange(40))))
    for raw in cases:
        n = _job.requested_recent(raw)
        assert isinstance(n, int) and 0 <= n <= _job.RECENT_MAX, (raw[:80], n)
