"""The frame reader (csrc/capture/frame_readers.c): one per Python, chosen at
import; from 3.13 on it reads CPython's own _Py_DebugOffsets table.

- The reader walks the same frames as the interpreter (sys._getframe):
  generators, coroutines in asyncio tasks, threads, exec'd code, recursion,
  frames called from C (a C-stack shim between).
- The launch callback records, in watch mode and at a fault, the frames the
  interpreter has at the launching line.
- The table checker refuses a corrupted cookie, version, free-threaded flag,
  sizes; where no reader applies, watch() warns once, the fd-2 block and
  doctor say so, and the report takes the line from the traceback.
"""
import json
import os
import struct
import subprocess
import sys
import textwrap

import pytest

from cuda_debug import _core

TABLE = sys.version_info >= (3, 13)
EXPECTED_READER = {
    (3, 10): "3.10 frame objects", (3, 11): "3.11 internal frames",
    (3, 12): "3.12 internal frames",
}.get(sys.version_info[:2], "_Py_DebugOffsets v%d.%d" % sys.version_info[:2])


def test_the_reader_for_this_python_is_chosen():
    name = EXPECTED_READER
    import sysconfig
    if TABLE and sysconfig.get_config_var("Py_GIL_DISABLED"):
        name += " (free-threaded)"
    assert _core.FRAME_READER == name
    assert _core.FRAMES_SUPPORTED == 1


# -- the walk against the interpreter's -----------------------------------------------

def _interpreter_walk(skip=1):
    """(code, lasti in code units) innermost first, from sys._getframe."""
    f, out = sys._getframe(skip), []
    while f is not None:
        out.append((f.f_code, f.f_lasti // 2))
        f = f.f_back
    return out


def _probe():
    """The reader's walk and the interpreter's, from the same caller: every
    frame but this one is at the same instruction in both."""
    ours = _core._frame_walk()
    theirs = _interpreter_walk(1)
    return ours, theirs


def _check(pair):
    ours, theirs = pair
    assert len(ours) == len(theirs), (ours, theirs)
    assert ours[0][0] is theirs[0][0] and ours[0][0] is _probe.__code__
    assert ours[1:] == theirs[1:]
    return len(ours)


def _gen():
    yield _probe()


async def _coro():
    import asyncio
    await asyncio.sleep(0)
    return _probe()


def _recurse(n):
    return _recurse(n - 1) if n else _probe()


class _Prop:
    @property
    def value(self):
        return _probe()


def test_walk_equals_the_interpreters_everywhere():
    import asyncio
    import threading
    _check(_probe())
    _check(next(_gen()))
    _check(asyncio.run(_coro()))
    assert _check(_recurse(150)) > 150
    _check(_Prop().value)
    # called from C: sorted's key, map, a class body, a comprehension
    got = []
    sorted([2, 1], key=lambda x: got.append(_probe()) or x)
    list(map(lambda x: got.append(_probe()), [0]))

    class Body:
        got.append(_probe())
    got += [_probe() for _ in range(1)]
    exec(compile("got.append(_probe())", "<string>", "exec"), {"got": got, "_probe": _probe})
    for pair in got:
        _check(pair)
    # another thread
    out = []
    t = threading.Thread(target=lambda: out.append(_probe()))
    t.start()
    t.join()
    _check(out[0])


def test_line_table_reader_agrees_with_co_lines():
    """cd_reader_line (what the fault path records) against co_lines() for
    every instruction of many code objects."""
    import dis
    import inspect
    import json as json_mod
    import textwrap as tw
    codes, seen = [], 0

    def walk(co):
        codes.append(co)
        for c in co.co_consts:
            if inspect.iscode(c):
                walk(c)
    for mod in (json_mod.decoder, tw, dis, inspect):
        walk(compile(open(mod.__file__).read(), mod.__file__, "exec"))
    for co in codes:
        for start, end, line in co.co_lines():
            for off in range(start, end, 2):
                want = -1 if line is None else line
                assert _core._line_of(co, off // 2) == want, (co, off, want)
                seen += 1
    assert seen > 10000
    assert _core._line_of(codes[0], -1) == codes[0].co_firstlineno


# -- the launch callback's records (fake driver) ----------------------------------------

SCENARIOS = r'''
import asyncio, json, os, sys, threading
import cuda_debug
from cuda_debug import _core
lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site-packages")
os.makedirs(lib, exist_ok=True)
with open(os.path.join(lib, "cd_libmod.py"), "w") as f:
    f.write("""
def launch(fake, note, depth=0):
    if depth:
        return launch(fake, note, depth - 1)
    return fake.fake_launch(b"lib_k", 0, 1, 1, 1, 1, 1, 1) or note()
def each(fn, xs):
    return list(map(fn, xs))
class Ctx:
    def __init__(self, fake, note):
        self.fake, self.note = fake, note
    def __enter__(self):
        return launch(self.fake, self.note)
    def __exit__(self, *a):
        return False
""")
sys.path.insert(0, lib)
import cd_libmod

TRUTH = []
def note():
    """The interpreter's frames at the launching line (innermost first)."""
    f, out = sys._getframe(1), []
    while f is not None:
        out.append([f.f_code.co_filename, f.f_code.co_qualname if hasattr(f.f_code, "co_qualname")
                    else f.f_code.co_name, f.f_lineno])
        f = f.f_back
    TRUTH.append(out)

def K():
    return fake.fake_launch(b"k", 0, 1, 1, 1, 1, 1, 1) or note()

def gen():
    yield cd_libmod.launch(fake, note)
async def task():
    await asyncio.sleep(0)
    return cd_libmod.launch(fake, note, 1)
async def main():
    return await asyncio.create_task(task())
def rec(n):
    return rec(n - 1) if n else K()
with cuda_debug.watch():
    K()
    next(gen())
    asyncio.run(main())
    t = threading.Thread(target=K); t.start(); t.join()
    src = "fake.fake_launch(b'k', 0, 1, 1, 1, 1, 1, 1) or note()"
    exec(compile(src, "<string>", "exec"))
    exec(compile(src, "user_exec.py", "exec"))
    rec(40)
    cd_libmod.launch(fake, note)
    cd_libmod.launch(fake, note, 10)
    cd_libmod.launch(fake, note, 80)
    sorted([2, 1], key=lambda x: cd_libmod.launch(fake, note) or x)
    cd_libmod.each(lambda x: cd_libmod.launch(fake, note), [0])
    with cd_libmod.Ctx(fake, note):
        pass
    [K() for _ in range(1)]
    lam = lambda: K()
    lam()
    class Body:
        cd_libmod.launch(fake, note)

recs = [_core.watch_record(s) for s in range(1, _core.watch_seq() + 1)]
out = []
for r in recs:
    if r[2] in (b"k", b"lib_k"):
        out.append(dict(frames=[list(_core.location(i) or ["?", "?", 0, -1]) for i in r[8]],
                        flags=r[9]))
report(dict(reader=getattr(_core, "FRAME_READER", None), records=out, truth=TRUTH))
'''


def _expected(truth, kind):
    """What the watch ring keeps of the interpreter's frames: innermost first
    up to the first user frame, at most RING_FRAMES (the user frame last,
    even when deeper); none when no user frame is within 64."""
    keep, depth = [], 0
    for file, func, line in truth:
        depth += 1
        k = kind(file)
        if len(keep) < _core.RING_FRAMES - 1:
            keep.append([file, func, line, k])
            if k == _core.LOC_USER:
                return keep
        elif k == _core.LOC_USER:
            return keep + [[file, func, line, k]]
        if depth >= 64:
            return keep
    return keep


def test_watch_records_name_the_interpreters_frames(fake_child):
    c = fake_child(SCENARIOS)
    r = c.result
    assert r is not None, c
    assert r["reader"] == _core.FRAME_READER
    assert len(r["records"]) == len(r["truth"]) == 17, r
    kind = _core.file_kind
    for rec, truth in zip(r["records"], r["truth"]):
        want = _expected(truth, kind)
        got = [[f[0], f[1], f[2], f[3]] for f in rec["frames"]]
        assert got == want, (got, truth)
    # the exec'd <string>, the 80-deep library recursion: as described
    assert r["records"][4]["frames"][0][0] == "<string>"
    assert all(f[3] == _core.LOC_LIBRARY for f in r["records"][9]["frames"])


def test_fault_record_frames_are_the_interpreters(fake_child):
    """At a fault, 24 frames innermost first, through a generator and a
    C-called lambda."""
    c = fake_child('''
        import sys, cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        def launch():
            t.device_assert()  # LAUNCH
        def gen():
            yield launch()
        def rec(n):
            return rec(n - 1) if n else sorted([0], key=lambda x: next(gen()))
        try:
            with cuda_debug.launch_blocking():
                rec(3)
        except cuda_debug.DeviceAssertError:
            pass
        rec_ = _core.faults(0)[-1]
        report([list(_core.location(i)) for i in rec_[17]])
    ''')
    frames = c.result
    assert frames is not None, c
    names = [f[1] for f in frames if f[0] == c.script]
    lam = "<lambda>" if sys.version_info < (3, 11) else "rec.<locals>.<lambda>"
    assert names[:3] == ["launch", "gen", lam], frames
    assert names[3:7] == ["rec"] * 4 and names[7] == "<module>", frames
    assert frames[[f[1] for f in frames].index("launch")][2] == c.line_of("# LAUNCH")


# -- refusal ----------------------------------------------------------------------------

@pytest.mark.skipif(not TABLE, reason="_Py_DebugOffsets exists from Python 3.13 on")
def test_the_table_checker_refuses_what_does_not_match():
    table = _core._debug_offsets()
    assert table is not None and table[:8] == b"xdebugpy"
    assert _core._check_debug_offsets(table) is None

    def patched(off, fmt, value):
        b = bytearray(table)
        struct.pack_into(fmt, b, off, value)
        return bytes(b)
    why = _core._check_debug_offsets(b"xdebugpz" + table[8:])
    assert why == '_PyRuntime does not start with the "xdebugpy" cookie'
    version = struct.unpack_from("Q", table, 8)[0]
    assert version == sys.hexversion
    why = _core._check_debug_offsets(patched(8, "Q", version + 1))
    assert why == "the table is for version 0x%08x, the interpreter is 0x%08x" % (
        version + 1, version)
    ft = struct.unpack_from("Q", table, 16)[0]
    why = _core._check_debug_offsets(patched(16, "Q", 1 - ft))
    assert why.startswith("the table says free_threaded=%d, this module was built " % (1 - ft))
    # thread_state.size: after cookie, version, flag, runtime_state (3), interpreter_state
    n_interp = 13 if sys.version_info[:2] == (3, 13) else 16
    ts_size = 24 + 8 * 3 + 8 * n_interp
    why = _core._check_debug_offsets(patched(ts_size, "Q", 12345))
    assert why.startswith("the table's sizeof(PyThreadState) is 12345, the headers say "), why
    why = _core._check_debug_offsets(table[:100])
    assert why.startswith("the table is 100 bytes, the %d.%d layout has " % sys.version_info[:2])
    assert _core._check_debug_offsets(b"") == "no _Py_DebugOffsets table (0 bytes)"


def test_no_table_before_313():
    if TABLE:
        assert _core._debug_offsets() is not None
    else:
        assert _core._debug_offsets() is None
        assert _core._check_debug_offsets(b"xdebugpy" + bytes(300)) == \
            "no _Py_DebugOffsets before Python 3.13"


NONE_ENV = {"CUDA_DEBUG_TEST_FRAME_READER": "none"}


def test_no_reader_warns_once_at_watch_and_the_report_takes_the_traceback(fake_child):
    c = fake_child('''
        import warnings, cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            with cuda_debug.watch():
                pass
            with cuda_debug.watch():
                pass
        msgs = [str(x.message) for x in w]
        try:
            with cuda_debug.launch_blocking():
                t.device_assert()  # LAUNCH
        except cuda_debug.DeviceAssertError as e:
            report(dict(reader=_core.FRAME_READER, supported=_core.FRAMES_SUPPORTED, warnings=msgs,
                        lineno=e.lineno, filename=e.filename))
    ''', env=NONE_ENV)
    r = c.result
    assert r is not None, c
    assert r["reader"] == "none: disabled by CUDA_DEBUG_TEST_FRAME_READER=none"
    assert r["supported"] == 0
    py = "%d.%d" % sys.version_info[:2]
    assert r["warnings"] == [
        "cuda_debug: no frame reader for this Python (%s): disabled by "
        "CUDA_DEBUG_TEST_FRAME_READER=none: watch() reports will name the launching line only "
        "where the framework's exception carries it" % py], r
    assert r["lineno"] == c.line_of("# LAUNCH") and r["filename"] == c.script, r
    block = c.stderr[c.stderr.index("cuda_debug: device-side assert"):]
    assert "  no frame reader for this Python (%s)\n" % py in block, block
    assert "framework thread" not in block


def test_doctor_names_the_reader():
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    for extra, want in (({}, _core.FRAME_READER),
                        (NONE_ENV, "none: disabled by CUDA_DEBUG_TEST_FRAME_READER=none")):
        e = dict(env, **extra)
        text = subprocess.run([sys.executable, "-m", "cuda_debug", "doctor"], env=e,
                              capture_output=True, text=True, timeout=120).stdout
        line = [ln for ln in text.splitlines() if ln.startswith("frame reader")]
        assert line and line[0].split(None, 2)[2] == want, text
        d = json.loads(subprocess.run([sys.executable, "-m", "cuda_debug", "doctor", "--json"],
                                      env=e, capture_output=True, text=True, timeout=120).stdout)
        assert d["frame_reader"] == want


def test_doctor_says_a_free_threaded_build_got_its_gil_back():
    """No free-threaded interpreter here: the row from the facts doctor gathers."""
    import re
    from cuda_debug import _environment
    from cuda_debug._cli import doctor
    d = _environment.full(probe_cupti=False)
    assert d["free_threaded"] == bool(__import__("sysconfig").get_config_var("Py_GIL_DISABLED"))
    d.update(verdict="-", ok=True, free_threaded=False)
    assert "free-threaded" not in doctor._doctor_text(d)
    d.update(free_threaded=True, gil_enabled=True)
    assert re.search(r"^free-threaded\s+GIL re-enabled: cuda_debug._core does not declare itself "
                     r"safe without it$", doctor._doctor_text(d), re.M)
    d.update(gil_enabled=False)
    assert re.search(r"^free-threaded\s+GIL disabled \(PYTHON_GIL=0\)", doctor._doctor_text(d), re.M)
