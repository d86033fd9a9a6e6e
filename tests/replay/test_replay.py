"""cuda-debug replay on CPU: the command line, the library search, the mapping of
an address to the allocation it missed (from a recorded PyTorch snapshot), the
watch report's replay command, and the whole replay driven by a fake Sanitizer
API (tests/fake_cuda/fake_sanitizer.c) that runs the real C callback and the
same check as the device patch (csrc/replay/check.h).

On a real GPU: the tests at the end of this module (marked gpu).
"""
import json
import os
import pickle
import subprocess
import sys
import textwrap

import pytest

from conftest import PKG_PARENT, ROOT

from cuda_debug import _core, _replay, _replay_command, _replay_memory as mem
import re
from conftest import PKG_PARENT

SAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "replay_samples")
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
A = 0x7f3a12000000           # the small segment of snapshot_synthetic.json
B = 0x7f3a14000000           # the large one


def load_sample(name):
    with open(os.path.join(SAMPLES, name)) as f:
        return json.load(f)


# -- the mapping ---------------------------------------------------------------------

@pytest.fixture
def snap():
    return mem.torch_allocations(load_sample("snapshot_synthetic.json"))


def test_snapshot_blocks(snap):
    live, free, segs = snap
    assert [(a.address, a.size, a.block_size) for a in live] == [
        (A, 1200, 1536), (A + 1536, 1200, 1536), (B, 4194304, 4194304)]
    assert [(s.address, s.size) for s in segs] == [(A, 2 << 20), (B, 20 << 20)]
    assert [(f.address, f.size) for f in free] == [(A + 3072, 2094080), (B + 4194304, 16 << 20)]
    assert live[0].segment == (A, 2 << 20)
    # the innermost frame of the user's code; torch's own frames are passed over
    assert live[0].allocated_at == "train.py:31"
    assert live[1].allocated_at == "train.py:32"
    assert live[2].allocated_at == "model.py:12"


def test_snapshot_without_block_addresses():
    """An older PyTorch gives no block address: the blocks follow each other."""
    s = load_sample("snapshot_synthetic.json")
    for seg in s["segments"]:
        for b in seg["blocks"]:
            del b["address"]
    live, free, _ = mem.torch_allocations(s["segments"])
    assert [a.address for a in live] == [A, A + 1536, B]
    assert free[0].address == A + 3072


def test_valid_ranges_keep_only_live_tensors_inside_segments(snap):
    live, free, segs = snap
    sanitizer = mem.sanitizer_allocations([(A, 2 << 20, 0, 11), (B, 20 << 20, 0, 11),
                                           (0x5000000, 4096, 0, 11)])
    ranges = mem.valid_ranges(sanitizer, live, segs)
    assert ranges == [(0x5000000, 0x5001000), (A, A + 1200), (A + 1536, A + 1536 + 1200),
                      (B, B + 4194304)]
    # without PyTorch: every allocation whole
    assert mem.valid_ranges(sanitizer) == [(0x5000000, 0x5001000), (A, A + (2 << 20)),
                                           (B, B + (20 << 20))]


def test_ranges_merge_and_drop_empty():
    allocs = mem.sanitizer_allocations([(100, 50, 0, 11), (120, 100, 0, 11), (300, 0, 0, 11)])
    assert mem.valid_ranges(allocs) == [(100, 220)]


def test_past_the_end_of_a_tensor_inside_its_segment(snap):
    live, free, segs = snap
    w = mem.locate(A + 1296, 4, live, free, segs)
    assert (w.relation, w.allocation.address, w.distance) == ("past_end", A, 96)
    assert w.container == segs[0]              # in the segment, not in a free block
    text = mem.describe("write", 4, A + 1296, w, (324, 0, 0), (1, 0, 0))
    assert text == ("thread [324,0,0] of block [1,0,0] wrote 4 bytes at 0x%x, 96 bytes past the "
                    "end of a 1,200-byte tensor allocated at train.py:31" % (A + 1296))


def test_right_past_the_end_and_running_past_it(snap):
    live, free, segs = snap
    assert mem.locate(A + 1200, 4, live, free, segs)[:3] == ("past_end", live[0], 0)
    w = mem.locate(A + 1198, 4, live, free, segs)
    assert (w.relation, w.distance) == ("overlaps_end", 2)
    assert "running 2 bytes past the end of a 1,200-byte tensor" in mem.describe(
        "read", 4, A + 1198, w)


def test_before_the_start_of_the_next_tensor(snap):
    live, free, segs = snap
    w = mem.locate(A + 1532, 4, live, free, segs)      # 4 bytes before the second tensor
    assert (w.relation, w.allocation.address, w.distance) == ("before_start", A + 1536, 4)
    assert "4 bytes before the start of a 1,200-byte tensor allocated at train.py:32" in \
        mem.describe("read", 4, A + 1532, w)


def test_in_a_free_block(snap):
    live, free, segs = snap
    w = mem.locate(A + 5000, 4, live, free, segs)
    assert w.relation == "past_end" and w.allocation == live[1]
    assert w.container.kind == mem.FREE_BLOCK
    assert "in a free 2,094,080-byte block of PyTorch's caching allocator" in \
        mem.describe("write", 4, A + 5000, w)


def test_outside_every_segment_near_and_far():
    allocs = mem.sanitizer_allocations([(0x10000000, 256, 0, 11), (0x30000000, 64, 0x8, 13)])
    w = mem.locate(0x10000100 + 96, 4, sanitizer=allocs)
    assert (w.relation, w.allocation.address, w.distance) == ("past_end", 0x10000000, 96)
    assert "96 bytes past the end of a 256-byte allocation" in mem.describe("write", 4,
                                                                         0x10000160, w)
    far = mem.locate(0x10000000 + (64 << 30), 4, sanitizer=allocs)
    assert far.relation == "outside" and far.allocation is None
    assert mem.describe("write", 4, 0x10000000 + (64 << 30), far).endswith(
        ", in no allocation (nor near one)")
    assert mem.locate(0x30000008, 4, sanitizer=allocs).allocation.kind == mem.HOST


def test_shape_and_dtype_of_the_tensor(snap):
    live, _, _ = snap

    class Storage:
        def __init__(self, p):
            self.p = p

        def data_ptr(self):
            return self.p

    class T:                                   # duck-typed torch.Tensor
        is_cuda = True

        def __init__(self, ptr, base, shape, itemsize, dtype):
            self.ptr, self.base, self.shape, self.itemsize, self.dtype = \
                ptr, base, shape, itemsize, dtype

        def untyped_storage(self):
            return Storage(self.base)

        def data_ptr(self):
            return self.ptr

        def numel(self):
            n = 1
            for d in self.shape:
                n *= d
            return n

        def element_size(self):
            return self.itemsize

    view = T(A + 400, A, (10,), 4, "torch.float32")
    whole = T(A, A, (300,), 4, "torch.float32")
    other = T(A + 1536, A + 1536, (300,), 4, "torch.int32")
    got = mem.with_tensor(live[0], [view, other, whole])
    assert (got.shape, got.dtype) == ((300,), "float32")
    assert mem.with_tensor(live[0], [view]).shape == (10,)       # only a view: its shape
    assert mem.with_tensor(live[0], [other]).shape is None        # none of its storage
    w = mem.Where("past_end", got, 96)
    assert "96 bytes past the end of a 1,200-byte tensor (float32[300]) allocated at " \
           "train.py:31" in mem.describe("write", 4, A + 1296, w)


# -- the command a report prints ---------------------------------------------------

def test_replay_command_for_address_faults_without_assert_text(monkeypatch, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setattr(_replay_command, "prog", "cuda-debug")
    monkeypatch.setattr(_replay_command, "program", None)
    monkeypatch.setattr(_replay_command, "run_watch", True)
    argv = [str(script), "--lr", "3e-4", "two words"]
    cmd = _replay_command.command("_ZN2at6native5fillIfEEvPT_i", 1234, argv)
    assert cmd == ("cuda-debug replay --launch 1234 --kernel _ZN2at6native5fillIfEEvPT_i %s "
                   "--lr 3e-4 'two words'" % script)
    # a report from the user's own watch(): numbers count from there
    monkeypatch.setattr(_replay_command, "run_watch", False)
    assert "--from-watch" in _replay_command.command("k", 7, argv)
    # nothing to name the launch by, or no program to re-run
    assert _replay_command.command(None, None, argv) is None
    assert _replay_command.command("k", 7, ["-c", "x"]) is None
    # under `cuda-debug run -m pkg.mod`
    monkeypatch.setattr(_replay_command, "program", ["-m", "pkg.mod", "--x"])
    assert _replay_command.command("k", 7).endswith("--launch 7 --kernel k --from-watch -m "
                                                    "pkg.mod --x")
    assert _replay_command.wanted(700, None) and _replay_command.wanted(716, "")
    assert not _replay_command.wanted(710, None)          # an assert names its thread itself
    assert not _replay_command.wanted(700, "file.cu:3: k: block: [0,0,0], thread: [1,0,0] "
                                           "Assertion `x` failed.")


def test_configure_is_what_the_replay_command_says(monkeypatch, tmp_path):
    """The command line says once what it runs (configure()); the command follows."""
    for name in ("prog", "program", "run_watch"):          # put back after the test
        monkeypatch.setattr(_replay_command, name, getattr(_replay_command, name))
    _replay_command.configure("cuda-debug", ["-m", "pkg.mod", "--x"], run_watch=True)
    assert _replay_command.command("k", 7) == "cuda-debug replay --launch 7 --kernel k -m " \
                                              "pkg.mod --x"
    _replay_command.configure("python -m cuda_debug", None, run_watch=False)
    script = tmp_path / "train.py"
    script.write_text("")
    assert _replay_command.command("k", 7, [str(script)]) == \
        "python -m cuda_debug replay --launch 7 --kernel k --from-watch %s" % script


def test_run_configures_the_replay_command_with_what_it_runs(tmp_path):
    script = tmp_path / "show.py"
    script.write_text("from cuda_debug import _replay_command as r\n"
                      "print(r.prog, r.program, r.run_watch)\n")
    p = _cli("run", "--no-watch", str(script), "--lr", "1")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "python -m cuda_debug %r False" % [str(script), "--lr", "1"]


def test_the_report_prints_the_replay_command():
    from cuda_debug import IllegalAddressError, DeviceAssertError
    cmd = "cuda-debug replay --launch 5 --kernel _Z4fillPfi train.py"
    e = IllegalAddressError(code=700, kernel="fill(float*, int)", filename="train.py", lineno=3,
                            mechanism="watch", replay_command=cmd, launch_seq=5)
    assert "  to find the thread, the address and the tensor: " + cmd in str(e)
    assert "replay" not in str(DeviceAssertError(code=710, kernel="k"))
    back = pickle.loads(pickle.dumps(e))
    assert (back.replay_command, back.launch_seq) == (cmd, 5)


def test_report_build_adds_the_command_only_where_it_helps(monkeypatch, tmp_path):
    from cuda_debug import _report
    script = tmp_path / "train.py"
    script.write_text("")
    monkeypatch.setattr(_replay_command, "program", [str(script)])
    monkeypatch.setattr(_replay_command, "prog", "cuda-debug")
    monkeypatch.setattr(_replay_command, "run_watch", True)
    f = _report._replay_command_for
    assert "--launch 9 --kernel _Z1kv" in f(700, {"kernel_mangled": "_Z1kv", "launch_seq": 9})
    assert f(710, {"kernel_mangled": "_Z1kv", "launch_seq": 9}) is None
    assert f(700, {"kernel_mangled": "_Z1kv", "launch_seq": 9, "graph_node": 3}) is None
    assert f(700, {"kernel_mangled": "_Z1kv", "launch_api": "cuGraphLaunch"}) is None
    assert f(716, {"kernel_mangled": "_Z1kv"}).endswith("--kernel _Z1kv %s" % script)
    # watch could not tell several launches apart: every one is replayed (not graph ones)
    cmd = f(700, {"kernel_mangled": "_Z1kv", "launch_seq": 9, "exact": False,
                  "candidates": [{"seq": 10}, {"seq": 12, "graph": True}, {"seq": 11}]})
    assert cmd == "cuda-debug replay --launch 9,10,11 %s" % script


# -- the library --------------------------------------------------------------------

def _layout(root, where):
    """A toolkit/wheel-shaped folder: compute-sanitizer and the library."""
    binary = root / where[0]
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\n")
    binary.chmod(0o755)
    lib = root / where[1]
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(b"\x7fELF")
    return str(binary), str(lib)


@pytest.mark.parametrize("where", [
    ("nvidia/cu13/bin/compute-sanitizer", "nvidia/cu13/lib/libsanitizer-public.so"),   # 13.0 wheel
    ("nvidia/cu13/bin/compute-sanitizer",
     "nvidia/cu13/compute-sanitizer/libsanitizer-public.so"),                           # 13.5 wheel
    ("compute-sanitizer/compute-sanitizer", "compute-sanitizer/libsanitizer-public.so"),  # toolkit
])
def test_found_next_to_the_compute_sanitizer_pathfinder_finds(tmp_path, monkeypatch, where):
    from cuda_debug import _libraries
    exe, lib = _layout(tmp_path, where)

    class PF:
        @staticmethod
        def find_nvidia_binary_utility(name):
            assert name == "compute-sanitizer"
            return exe

    monkeypatch.delenv(_replay.ENV, raising=False)
    monkeypatch.setattr(_libraries, "pathfinder", lambda: PF)
    f = _replay.find_library()
    assert f.path == lib and "cuda.pathfinder" in f.how


def test_not_found_says_where_it_looked_and_what_to_install(tmp_path, monkeypatch):
    from cuda_debug import _libraries

    class PF:
        @staticmethod
        def find_nvidia_binary_utility(name):
            return None

    monkeypatch.delenv(_replay.ENV, raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    monkeypatch.setattr(_libraries, "pathfinder", lambda: PF)
    monkeypatch.setattr(_replay, "_site_dirs", lambda: [str(tmp_path / "site")])
    monkeypatch.setattr(_replay, "_toolkit_roots", lambda: [str(tmp_path / "cuda")])  # not the machine's
    f = _replay.find_library()
    assert f.path is None
    msg = _replay.not_found_message(f)
    assert "pip install 'cuda_debug[replay]'" in msg
    assert str(tmp_path / "cuda" / "compute-sanitizer" / "libsanitizer-public.so") in msg
    assert str(tmp_path / "site" / "nvidia" / "cu13" / "lib" / "libsanitizer-public.so") in msg
    assert "find_nvidia_binary_utility('compute-sanitizer'): none" in msg


def test_the_environment_variable_wins(tmp_path, monkeypatch):
    lib = tmp_path / "libsanitizer-public.so"
    lib.write_bytes(b"")
    monkeypatch.setenv(_replay.ENV, str(tmp_path))
    assert _replay.find_library().path == str(lib)
    monkeypatch.setenv(_replay.ENV, str(tmp_path / "nope.so"))
    f = _replay.find_library()
    assert f.path is None and "no such file" in _replay.not_found_message(f)


def test_the_extra_installs_the_wheel():
    text = open(os.path.join(ROOT, "pyproject.toml")).read()
    assert 'replay = ["nvidia-cuda-sanitizer-api' in text


# -- the command line --------------------------------------------------------------------

def _cli(*argv, env=None, timeout=60, cwd=ROOT):
    full = dict(os.environ)
    full["PYTHONPATH"] = PKG_PARENT + os.pathsep + full.get("PYTHONPATH", "")
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "cuda_debug"] + list(argv), capture_output=True,
                          text=True, timeout=timeout, env=full, cwd=cwd)


@pytest.mark.parametrize("argv, says", [
    (["replay", "x.py"], "name the culprit: --launch N and/or --kernel NAME"),
    (["replay", "--launch", "0", "x.py"], "--launch takes a whole number > 0"),
    (["replay", "--launch", "ten", "x.py"], "--launch takes a whole number > 0, or up to 64 "
                                            "of them separated by commas, not 'ten'"),
    # what C's "K" would wrap, or take too large, or list twice
    (["replay", "--launch", "18446744073709551618", "x.py"],
     "--launch 18446744073709551618: no launch has the number 18446744073709551618 (watch() "
     "counts launches up to 18446744073709551615)"),
    (["replay", "--launch", str(10 ** 30), "x.py"], "no launch has the number %d" % 10 ** 30),
    (["replay", "--launch", "1,%d" % 2 ** 64, "x.py"], "no launch has the number %d" % 2 ** 64),
    (["replay", "--launch", "2,2,2", "x.py"], "--launch 2,2,2 names launch 2 more than once: "
                                              "each candidate once"),
    (["replay", "--launch", ",".join(map(str, range(1, 66))), "x.py"],
     "--launch takes one launch number, or up to 64 of them separated by commas, not 65"),
    (["replay", "--launch", "-3", "x.py"], "--launch takes a whole number > 0"),
    # compute-sanitizer's spellings, where they do not map
    (["replay", "--launch-skip", "3", "--kernel-name", "k", "x.py"],
     "--launch-skip with a kernel: replay counts every launch of the program"),
    (["replay", "--launch", "3", "--launch-count", "2", "x.py"],
     "--launch-skip and --launch-count count launches as compute-sanitizer does; --launch "
     "names them: one or the other"),
    (["replay", "--kernel-name", "regex:gather.*", "x.py"],
     "--kernel-name regex:gather.*: replay matches a part of the name (as compute-sanitizer's "
     "kns=), not regex"),
    (["replay", "--kernel", "a", "--kernel-name", "b", "x.py"], "--kernel-name is --kernel"),
    (["replay", "--launch-count", "65", "x.py"], "--launch-count 65: at most 64 launches"),
    (["replay", "--launch-skip", "-1", "x.py"], "--launch-skip takes a whole number, not '-1'"),
    (["replay", "--launch", "3"], "a script (or -m module) is required"),
    (["replay", "--kernel", "k", "--window", "4", "x.py"], "--window goes with --launch and "
                                                           "--kernel"),
    (["replay", "--launch", "3", "--max-launches", "2", "x.py"], "--max-launches goes with "
                                                                 "--kernel"),
    (["replay", "--launch", "3", "--bogus", "x.py"], "unknown option --bogus"),
    (["replay", "--launch", "3", "no_such_file.py"], "no such file: no_such_file.py"),
    (["replay", "--kernel"], "--kernel needs a value"),
    (["run", "--replay", "-"], "--replay re-runs the program: not one read from stdin"),
])
def test_usage_errors(argv, says):
    p = _cli(*argv)
    assert p.returncode == 2, p.stderr
    # as run says it, and argparse: the usage, then the command as typed, "error:", once
    assert p.stderr.startswith("usage: python -m cuda_debug %s " % argv[0]), p.stderr
    errors = [line for line in p.stderr.splitlines()
              if line.startswith("python -m cuda_debug %s: error: " % argv[0])]
    assert len(errors) == 1 and says in errors[0], p.stderr
    assert "cuda-debug" not in p.stderr, p.stderr          # the command as typed, only it


@pytest.mark.parametrize("argv, launch, launches, kernel, max_launches", [
    # compute-sanitizer's spellings, as replay's own options (docs/cli.md)
    (["--launch-skip", "9"], 10, (), None, None),
    (["--launch-skip", "9", "--launch-count", "3"], 10, (10, 11, 12), None, None),
    (["--launch-count", "2"], 1, (1, 2), None, None),
    (["--kernel-name", "gather_rows"], None, (), "gather_rows", None),
    (["--kernel-name", "kns=gather_rows", "--launch-count", "5"], None, (), "gather_rows", 5),
    (["--launch", "12", "--kernel-name", "k"], 12, (), "k", None),
    (["--launch", "1_234"], 1234, (), None, None),
    (["--launch", "3,9"], 3, (3, 9), None, None),
])
def test_compute_sanitizer_spellings_map_onto_replays_options(argv, launch, launches, kernel,
                                                              max_launches):
    from cuda_debug import _cli as cli_module
    p = cli_module.parse_replay(argv + ["train.py", "--lr", "1"])
    o = p.opts
    assert (o["launch"], o["launches"], o["kernel"], o["max_launches"]) == \
        (launch, launches, kernel, max_launches)
    assert (p.target, p.args) == ("train.py", ["--lr", "1"])


def test_the_api_refuses_launch_numbers_c_would_wrap():
    """The same rule where a Target reaches C (_replay.start), not only on the command line."""
    for target in (_replay.Target(launch=2 ** 64 + 2, kernel=None),
                   _replay.Target(launch=2, kernel=None, launches=(2, 2, 3)),
                   _replay.Target(launch=0, kernel="k")):
        with pytest.raises(_replay.ReplayError, match="launch"):
            _replay.check_launches(target)
    _replay.check_launches(_replay.Target(launch=2 ** 64 - 1, kernel=None, launches=(1, 2)))


def test_help_and_main_usage():
    p = _cli("replay", "--help")
    assert p.returncode == 0 and "--launch N" in p.stdout and "--from-watch" in p.stdout
    assert "replay --launch N [--kernel K] script.py" in _cli("--help").stdout
    assert "--replay" in _cli("run", "--help").stdout


# -- the whole replay, with the fake Sanitizer API -----------------------------------------

@pytest.fixture(scope="session")
def fake_san():
    sys.path.insert(0, TESTS)
    from fake_cuda import Unavailable
    from fake_cuda.sanitizer import build_sanitizer
    try:
        return build_sanitizer()
    except Unavailable as e:
        pytest.skip("fake Sanitizer API not buildable here: %s" % e)


PRELUDE = textwrap.dedent("""\
    import ctypes, sys
    sys.path.insert(0, %r)
    from fake_cuda.sanitizer import fake_sanitizer
    fk = fake_sanitizer()

    def acc(rows):
        flat = [v for r in rows for v in r]
        return (ctypes.c_uint64 * max(len(flat), 1))(*flat), len(rows)

    def check(rc):              # what a framework does with a failed launch
        if rc:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (%%d)" %% rc)
    """ % TESTS)


def _script(tmp_path, body, name="user_prog.py"):
    path = tmp_path / name
    path.write_text(PRELUDE + textwrap.dedent(body))
    return path


DRIVER = textwrap.dedent("""\
    import json, sys
    import cuda_debug
    from cuda_debug import _cli
    rc = _cli.main(sys.argv[1:])
    e = cuda_debug.last_error()
    out = {"rc": rc}
    if e is not None:
        out.update({k: getattr(e, k) for k in ("code", "mechanism", "kernel", "address", "access",
                   "access_size", "fault_thread", "fault_block", "lineno", "launch_seq")})
        out["allocation"] = e.allocation._asdict() if e.allocation is not None else None
        out["class"] = type(e).__name__
        out["n_bad"] = len(e.bad_accesses or ())
        import pickle
        back = pickle.loads(pickle.dumps(e))        # across processes (xdist, multiprocessing)
        out["pickles"] = (str(back) == str(e) and back.allocation == e.allocation and
                          back.bad_accesses == e.bad_accesses and back.address == e.address)
    print("RESULT " + json.dumps(out, default=str))
    """)


def _replay_child(tmp_path, fake_san, script, *opts, env=None, in_process=False):
    full = {_replay.ENV: fake_san}
    full.update(env or {})
    if not in_process:
        return _cli("replay", "--no-torch", *opts, str(script), env=full, cwd=str(tmp_path))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    e = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e.update(full)
    return subprocess.run([sys.executable, str(driver), "replay", "--no-torch"] + list(opts) +
                          [str(script)], capture_output=True, text=True, timeout=60, env=e,
                          cwd=str(tmp_path))


def _result(p):
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise AssertionError("no result:\n%s\n%s" % (p.stdout, p.stderr))


OOB = """\
    fk.fake_san_alloc(0x10000000, 1200, 0, 11)          # cudaMalloc'd: 300 floats
    fk.fake_san_alloc(0x20000000, 4096, 0, 11)
    a, n = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(300)])
    check(fk.fake_san_launch(b"_Z4fillPfi", 10, 32, a, n))   # launch 1: fine
    b, m = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(324)])
    check(fk.fake_san_launch(b"_Z4fillPfi", 11, 32, b, m))   # launch 2: 24 threads past the end
    print("went on")
"""


def test_the_bad_access_is_found_and_named(tmp_path, fake_san):
    script = _script(tmp_path, OOB)
    p = _replay_child(tmp_path, fake_san, script, "--launch", "2", "--kernel", "_Z4fillPfi",
                      in_process=True)
    r = _result(p)
    assert r["rc"] == 3, p.stderr
    assert r["class"] == "IllegalAddressError" and r["mechanism"] == "replay"
    assert (r["address"], r["access"], r["access_size"]) == (0x10000000 + 1200, "write", 4)
    assert (r["fault_thread"], r["fault_block"]) == ([12, 0, 0], [9, 0, 0])
    assert r["allocation"]["address"] == 0x10000000 and r["allocation"]["size"] == 1200
    assert r["launch_seq"] == 2 and r["n_bad"] == 2     # a warp exits at its first bad access
    assert r["pickles"] is True
    line = next(l for l in p.stderr.splitlines() if "thread [12,0,0]" in l)
    assert line.strip() == ("thread [12,0,0] of block [9,0,0] wrote 4 bytes at 0x100004b0, "
                            "right past the end of a 1,200-byte allocation")
    line_no = next(i for i, l in enumerate(script.read_text().splitlines(), 1)
                   if "launch 2: 24 threads past the end" in l)
    assert "launched at %s:%d in <module>" % (script, line_no) in p.stderr
    assert r["lineno"] == line_no
    assert "went on" not in p.stdout                     # it stopped at the launching line
    assert "found by cuda-debug replay: launch #2 instrumented" in p.stderr


def test_only_the_culprit_launch_is_patched(tmp_path, fake_san):
    script = _script(tmp_path, OOB)
    p = _replay_child(tmp_path, fake_san, script, "--launch", "1", "--kernel", "_Z4fillPfi")
    # launch 1 is clean: instrumented; launch 2 (not the culprit, kernel matched: with a kernel
    # name the kernel's later launches are tried too, up to --max-launches) finds it
    assert p.returncode == 3, p.stderr
    assert "found at launch #2, not #1 as in the original run" in p.stderr
    p = _replay_child(tmp_path, fake_san, script, "--launch", "1")
    assert p.returncode == 4, p.stderr       # by number only: launch 1 alone, and it was clean
    assert "ran instrumented (1 launch, from #1, grid [10, 1, 1] block [32, 1, 1]) and made no " \
           "bad access" in p.stderr


def test_the_watch_report_and_the_replay_agree_on_numbers_without_a_kernel(tmp_path, fake_san):
    p = _replay_child(tmp_path, fake_san, _script(tmp_path, OOB), "--launch", "2")
    assert p.returncode == 3, p.stderr
    assert "right past the end of a 1,200-byte allocation" in p.stderr


def test_a_swallowed_failure_is_still_reported(tmp_path, fake_san):
    script = _script(tmp_path, OOB.replace(
        '    check(fk.fake_san_launch(b"_Z4fillPfi", 11, 32, b, m))   # launch 2: 24 threads past '
        'the end\n', '    print("launch 2 returned", fk.fake_san_launch(b"_Z4fillPfi", 11, 32, b, '
        'm))\n    print("launch 3 returned", fk.fake_san_launch(b"_Z5otherv", 1, 32, a, 0))\n'))
    p = _replay_child(tmp_path, fake_san, script, "--launch", "2", "--kernel", "_Z4fillPfi")
    assert p.returncode == 3, p.stderr
    assert "launch 2 returned 700" in p.stdout
    assert "launch 3 returned 700" in p.stdout         # every later launch fails, like a dead context
    assert "went on after the failed launch: it swallowed the error" in p.stderr


def test_torch_live_blocks_catch_an_overrun_inside_a_segment(tmp_path, fake_san):
    """A snapshot (the recorded sample) as PyTorch's allocator would give it: the
    overrun stays inside the cudaMalloc'd segment, so only the live blocks
    show it; the report names the tensor and its allocating line."""
    script = _script(tmp_path, """\
        import json, cuda_debug._replay as r
        with open(%r) as f:
            snap = json.load(f)
        r.snapshot_provider = lambda: snap
        fk.fake_san_alloc(%d, 2 << 20, 0, 11)          # the segment, as cudaMalloc gave it
        a, n = acc([(%d + 4 * i, 4, 2, i) for i in range(324)])
        check(fk.fake_san_launch(b"_ZN2at6native29vectorized_elementwise_kernelE", 11, 32, a, n))
        """ % (os.path.join(SAMPLES, "snapshot_synthetic.json"), A, A))
    p = _replay_child(tmp_path, fake_san, script, "--kernel", "vectorized_elementwise",
                      in_process=True)
    r = _result(p)
    assert r["rc"] == 3, p.stderr
    assert r["allocation"]["kind"] == "tensor" and r["allocation"]["size"] == 1200
    assert r["address"] == A + 1200
    assert "right past the end of a 1,200-byte tensor allocated at train.py:31" in p.stderr


def test_without_torch_the_same_overrun_is_not_seen(tmp_path, fake_san):
    """The control: checked against the segment whole, as compute-sanitizer does."""
    script = _script(tmp_path, """\
        fk.fake_san_alloc(%d, 2 << 20, 0, 11)
        a, n = acc([(%d + 4 * i, 4, 2, i) for i in range(324)])
        check(fk.fake_san_launch(b"_ZN2at6native29vectorized_elementwise_kernelE", 11, 32, a, n))
        """ % (A, A))
    p = _replay_child(tmp_path, fake_san, script, "--kernel", "vectorized_elementwise")
    assert p.returncode == 4, p.stderr
    assert "made no bad access" in p.stderr


@pytest.mark.parametrize("args, says", [
    (["--launch", "9"], "the program returned after 2 launches: launch #9 was never reached"),
    (["--launch", "2", "--kernel", "_Z5otherv"],
     "launch #2 was fill (grid [11, 1, 1] block [32, 1, 1]), not other, and no later launch"),
    (["--kernel", "_Z8not_herev"], "no launch of not_here came (2 launches made"),
])
def test_a_run_that_does_not_repeat_itself_says_so_with_hints(tmp_path, fake_san, args, says):
    body = OOB.replace('check(fk.fake_san_launch(b"_Z4fillPfi", 11, 32, b, m))',
                       'fk.fake_san_launch(b"_Z4fillPfi", 11, 32, a, n)')
    p = _replay_child(tmp_path, fake_san, _script(tmp_path, body), *args)
    assert p.returncode == 4, p.stderr
    assert says in p.stderr
    assert "torch.use_deterministic_algorithms(True)" in p.stderr
    assert "The original report stands." in p.stderr


def test_a_real_fault_in_a_launch_not_instrumented(tmp_path, fake_san):
    script = _script(tmp_path, """\
        fk.fake_san_alloc(0x10000000, 1200, 0, 11)
        a, n = acc([(0x90000000, 4, 2, 0)])
        check(fk.fake_san_launch(b"_Z5otherv", 1, 32, a, n))    # faults: nothing there
        check(fk.fake_san_sync())                              # where it surfaces
        """)
    p = _replay_child(tmp_path, fake_san, script, "--launch", "1", "--kernel", "_Z4fillPfi")
    assert p.returncode == 4, p.stderr
    assert "the program faulted for real, in a launch that was not instrumented: " \
           "CUDA_ERROR_ILLEGAL_ADDRESS" in p.stderr
    assert "launch #1 was other (grid [1, 1, 1] block [32, 1, 1]), not fill" in p.stderr
    assert "cuda_debug run" not in p.stderr        # not the hint of a plain run


def test_the_sanitizer_refusing_to_patch_is_said_plainly(tmp_path, fake_san):
    p = _replay_child(tmp_path, fake_san, _script(tmp_path, OOB), "--launch", "2",
                      env={"FAKE_SAN_FAIL": "sanitizerPatchModule:14"})
    assert p.returncode == 4, p.stderr
    assert ("could not instrument launch #2 (fill): patching the kernel's module "
            "(sanitizerPatchModule) failed: SANITIZER_ERROR_NOT_SUPPORTED") in p.stderr
    assert "The original report stands." in p.stderr


def test_refused_at_the_culprit_is_not_called_another_order(tmp_path, fake_san):
    p = _replay_child(tmp_path, fake_san, _script(tmp_path, OOB), "--launch", "2", "--kernel",
                      "_Z4fillPfi", env={"FAKE_SAN_FAIL": "sanitizerPatchModule:14"})
    assert p.returncode == 4, p.stderr
    assert "could not instrument launch #2 (fill)" in p.stderr
    assert "another order" not in p.stderr


def test_the_subscription_refused(tmp_path, fake_san):
    p = _replay_child(tmp_path, fake_san, _script(tmp_path, OOB), "--launch", "2",
                      env={"FAKE_SAN_FAIL": "sanitizerSubscribe:10"})
    assert p.returncode == 1, p.stderr
    assert "refused the subscription: SANITIZER_ERROR_MAX_LIMIT_REACHED (sanitizerSubscribe): " \
           "another tool (compute-sanitizer, a profiler) holds it" in p.stderr


def test_no_library_found(tmp_path):
    p = _cli("replay", "--launch", "2", str(_script(tmp_path, OOB)),
             env={_replay.ENV: str(tmp_path / "missing.so")}, cwd=str(tmp_path))
    assert p.returncode == 1
    assert "python -m cuda_debug replay: NVIDIA's Sanitizer API (libsanitizer-public.so) was " \
           "not found, and replay needs it." in p.stderr                  # once, as typed
    assert "pip install 'cuda_debug[replay]'" in p.stderr
    assert "missing.so (no such file)" in p.stderr


def test_not_a_sanitizer_library(tmp_path):
    bogus = tmp_path / "libsanitizer-public.so"
    bogus.write_bytes(open("/bin/true", "rb").read() if os.path.exists("/bin/true") else b"x")
    p = _cli("replay", "--launch", "2", str(_script(tmp_path, OOB)),
             env={_replay.ENV: str(bogus)}, cwd=str(tmp_path))
    assert p.returncode == 1
    assert "cannot open NVIDIA's Sanitizer API at %s" % bogus in p.stderr
    assert "The original report stands." in p.stderr


def test_results_are_named_from_raw_records():
    """_core.replay_results() tuples, as C returns them, named (a recorded sample)."""
    raw = load_sample("replay_results_sample.json")
    insts = _replay.results([tuple(t) for t in raw])
    i = insts[0]
    assert i.n_bad == len(i.accesses) == 2
    a = i.accesses[0]
    assert (a.access, a.space, a.misaligned, a.thread, a.block, a.size) == (
        "write", "global", False, (12, 0, 0), (9, 0, 0), 4)
    assert a.pc_offset == 0x40
    assert i.accesses[1].misaligned and i.accesses[1].access == "read"
    assert _replay.access_kind(_core.REPLAY_ACCESS_READ | _core.REPLAY_ACCESS_WRITE) == "atomic"


# -- csrc/replay/sanitizer_api.h against the real headers ---------------------------------

# (our struct, the real struct, the fields replay/ reads)
STRUCTS = [
    ("Sanitizer_LaunchData", ["context", "stream", "hStream", "module", "function",
                              "functionName", "gridDim_x", "gridDim_z", "blockDim_x",
                              "blockDim_z", "clusterDim_z", "gridId", "hLaunch", "device",
                              "apiContext", "apiStream", "hApiStream"]),
    ("Sanitizer_CallbackData", ["callbackSite", "functionName", "functionParams",
                                "functionReturnValue", "symbolName", "context"]),
    ("Sanitizer_ResourceMemoryData", ["address", "size", "context", "device", "stream",
                                      "hStream", "memoryPool", "flags", "permissions",
                                      "visibility", "sourceDevice"]),
    ("Sanitizer_ResourceModuleData", ["context", "module", "cubinSize", "pCubin", "library"]),
    ("Sanitizer_ResourceVirtualRange", ["address", "size"]),
]
# (our constant, the real one)
CONSTANTS = [
    ("CD_SAN_DOMAIN_DRIVER_API", "SANITIZER_CB_DOMAIN_DRIVER_API"),
    ("CD_SAN_DOMAIN_RESOURCE", "SANITIZER_CB_DOMAIN_RESOURCE"),
    ("CD_SAN_DOMAIN_LAUNCH", "SANITIZER_CB_DOMAIN_LAUNCH"),
    ("CD_SAN_DOMAIN_GRAPHS", "SANITIZER_CB_DOMAIN_GRAPHS"),
    ("CD_SAN_API_EXIT", "SANITIZER_API_EXIT"),
    ("CD_SAN_LAUNCH_BEGIN", "SANITIZER_CBID_LAUNCH_BEGIN"),
    ("CD_SAN_LAUNCH_END", "SANITIZER_CBID_LAUNCH_END"),
    ("CD_SAN_GRAPHS_LAUNCH_BEGIN", "SANITIZER_CBID_GRAPHS_LAUNCH_BEGIN"),
    ("CD_SAN_INSTRUCTION_GLOBAL_MEMORY_ACCESS", "SANITIZER_INSTRUCTION_GLOBAL_MEMORY_ACCESS"),
    ("CD_SAN_INSTRUCTION_SHARED_MEMORY_ACCESS", "SANITIZER_INSTRUCTION_SHARED_MEMORY_ACCESS"),
    ("CD_SAN_INSTRUCTION_MEMCPY_ASYNC", "SANITIZER_INSTRUCTION_MEMCPY_ASYNC"),
    ("CD_SAN_MEMORY_FLAG_MODULE", "SANITIZER_MEMORY_FLAG_MODULE"),
    ("CD_SAN_MEMORY_FLAG_MANAGED", "SANITIZER_MEMORY_FLAG_MANAGED"),
    ("CD_SANITIZER_ERROR_NOT_INITIALIZED", "SANITIZER_ERROR_NOT_INITIALIZED"),
    ("CD_SANITIZER_ERROR_NOT_COMPATIBLE", "SANITIZER_ERROR_NOT_COMPATIBLE"),
    ("CD_ACCESS_READ", "SANITIZER_MEMORY_DEVICE_FLAG_READ"),
    ("CD_ACCESS_WRITE", "SANITIZER_MEMORY_DEVICE_FLAG_WRITE"),
    ("CD_ACCESS_ATOMSYS", "SANITIZER_MEMORY_DEVICE_FLAG_ATOMSYS"),
] + [("CD_SAN_RESOURCE_" + n, "SANITIZER_CBID_RESOURCE_" + n) for n in (
    "MODULE_LOADED", "MODULE_UNLOAD_STARTING", "DEVICE_MEMORY_ALLOC", "DEVICE_MEMORY_FREE",
    "HOST_MEMORY_ALLOC", "HOST_MEMORY_FREE", "MEMORY_ALLOC_ASYNC", "MEMORY_FREE_ASYNC",
    "VIRTUAL_RESERVE", "VIRTUAL_RELEASE")]


def _real_sanitizer_includes():
    """Folders holding NVIDIA's sanitizer.h: $CD_TEST_SANITIZER_INCLUDE (several,
    os.pathsep), else next to the library the replay would use."""
    env = os.environ.get("CD_TEST_SANITIZER_INCLUDE")
    if env:
        return [d for d in env.split(os.pathsep) if d]
    f = _replay.find_library()
    if not f.path:
        return []
    d = os.path.dirname(f.path)
    return [p for p in (os.path.join(d, "include"), os.path.join(d, "..", "include"))
            if os.path.exists(os.path.join(p, "sanitizer.h"))][:1]


def _layout_program(header_side):
    lines = ["#include <stddef.h>", "#include <stdio.h>"]
    if header_side == "real":
        lines += ["#include <sanitizer.h>", '#include "replay/check.h"']
    else:
        lines += ['#include "replay/sanitizer_api.h"', '#include "replay/check.h"']
    lines.append("int main(void) {")
    for name, fields in STRUCTS:
        for f in fields:
            lines.append('    printf("%s.%s %%zu %%zu\\n", offsetof(%s, %s), sizeof(((%s *)0)->%s));'
                         % (name, f, name, f, name, f))
    for ours, real in CONSTANTS:
        lines.append('    printf("%s %%lld\\n", (long long)%s);'
                     % (ours, ours if header_side == "ours" else real))
    if header_side == "ours":
        lines.append('#define CBID(name, id) printf("cbid %s %d\\n", name, id);')
        lines.append("    CD_SAN_LAUNCH_CBIDS(CBID)")
    else:
        for n in ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx",
                  "cuLaunchKernelEx_ptsz", "cuLaunchCooperativeKernel",
                  "cuLaunchCooperativeKernel_ptsz"):
            lines.append('    printf("cbid %s %%d\\n", (int)SANITIZER_CBID_DRIVER_API_%s);' % (n, n))
    lines += ["    return 0;", "}"]
    return "\n".join(lines) + "\n"


def test_sanitizer_api_h_matches_the_real_headers(tmp_path):
    """Every field replay/ reads sits where NVIDIA's headers put it, every
    number it uses is theirs (checked against each header folder found:
    $CD_TEST_SANITIZER_INCLUDE, or the installed Sanitizer's)."""
    from conftest import need_source_tree
    import shutil
    root = need_source_tree("csrc/replay/sanitizer_api.h")
    incs = _real_sanitizer_includes()
    if not incs:
        pytest.skip("no NVIDIA sanitizer.h here (install cuda_debug[replay], or set "
                    "CD_TEST_SANITIZER_INCLUDE)")
    sys.path.insert(0, os.path.join(root, "cuda_debug"))
    try:
        import _cuda_headers
    finally:
        sys.path.pop(0)
    cuda_dirs, _ = _cuda_headers.find()
    if not cuda_dirs:
        pytest.skip("no cuda.h here (the real sanitizer.h includes it)")
    cc = shutil.which(os.environ.get("CC") or "cc") or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")

    def run(side, inc):
        src = tmp_path / ("%s.c" % side)
        src.write_text(_layout_program(side))
        exe = tmp_path / side
        flags = ["-I" + os.path.join(root, "csrc")] + (
            ["-I" + inc] + ["-I" + d for d in cuda_dirs] if side == "real" else [])
        p = subprocess.run([cc, "-std=gnu11", "-o", str(exe), str(src)] + flags,
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        return subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout

    ours = run("ours", None)
    for inc in incs:
        assert run("real", inc) == ours, "csrc/replay/sanitizer_api.h differs from %s" % inc


# -- scopes inside a replay; run --replay -------------------------------------------------

def test_watch_in_the_script_does_nothing_and_counts_from_its_entry(tmp_path, fake_san):
    """In a replay the Sanitizer holds the tools interface: the script's watch()
    and launch_blocking() open nothing (no ToolConflictError), and with
    --from-watch the launch numbers count from the script's first watch()."""
    script = _script(tmp_path, """\
        import cuda_debug
        fk.fake_san_alloc(0x10000000, 1200, 0, 11)
        a, n = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(300)])
        b, m = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(301)])
        check(fk.fake_san_launch(b"_Z4fillPfi", 10, 32, a, n))      # before watch: not counted
        with cuda_debug.launch_blocking():
            check(fk.fake_san_launch(b"_Z4fillPfi", 10, 32, a, n))  # not counted either
        with cuda_debug.watch():
            print("watching", cuda_debug.is_watching())
            check(fk.fake_san_launch(b"_Z4fillPfi", 10, 32, a, n))  # watch's launch 1
            check(fk.fake_san_launch(b"_Z4fillPfi", 10, 32, b, m))  # watch's launch 2: the culprit
        """)
    p = _replay_child(tmp_path, fake_san, script, "--launch", "2", "--from-watch")
    assert p.returncode == 3, p.stderr
    assert "found by cuda-debug replay: launch #2 instrumented" in p.stderr
    assert "right past the end of a 1,200-byte allocation" in p.stderr
    assert "ToolConflictError" not in p.stderr
    # counted from the start instead, launch #2 is the clean one inside launch_blocking()
    p = _replay_child(tmp_path, fake_san, script, "--launch", "2")
    assert p.returncode == 4 and "made no bad access" in p.stderr, p.stderr


def test_run_replay_prints_the_report_then_replays(tmp_path, fake_child, fake_san):
    """run --replay: the original run (watch, the fake driver) dies of an
    illegal address; its report, with the replay command, is printed and
    kept; the replay runs in a fresh process and says what it found (here:
    nothing, the fake driver's launches are not the fake Sanitizer's). The
    replay's fresh process finds the fakes through LD_LIBRARY_PATH only."""
    from fake_cuda import real_cuda_found_first
    reason = real_cuda_found_first()
    if reason:
        pytest.skip(reason)
    inner = tmp_path / "prog.py"
    inner.write_text(textwrap.dedent("""\
        from fake_cuda.child import fake
        for _ in range(2):                  # past the kernels' first launches (markers each)
            fake.fake_launch(b"_Z2okv", 0, 1, 1, 1, 32, 1, 1)
            fake.fake_launch(b"_Z4fillPfi", 0, 1, 1, 1, 32, 1, 1)
        fake.fake_ctx_sync()
        fake.fake_set_kernel(b"_Z4fillPfi", 700, 0, None, 0, 0)
        fake.fake_launch(b"_Z2okv", 0, 1, 1, 1, 32, 1, 1)
        fake.fake_launch(b"_Z4fillPfi", 0, 1, 1, 1, 32, 1, 1)   # CULPRIT
        rc = fake.fake_ctx_sync()
        if rc:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        """))
    c = fake_child('''
        import sys
        from cuda_debug import _cli
        sys.path.insert(0, %r)
        rc = _cli.main(["run", "--replay", %r])
        print("RESULT {\\"rc\\": %%d}" %% rc)
    ''' % (TESTS, str(inner)), env={_replay.ENV: fake_san,
                                    "PYTHONPATH": TESTS + os.pathsep + PKG_PARENT},
        preload=False, ld_library_path=True)
    assert c.result == {"rc": 3}, c.stderr
    err = c.stderr
    # the always-on watch could not tell the two launches apart: both are replayed
    assert "IllegalAddressError: illegal memory access in one of 2 launches, the likeliest ok" \
        in err
    assert "or fill launched at %s:8" % inner in err
    cmd = "to find the thread, the address and the tensor: "
    assert cmd in err
    command = err.split(cmd, 1)[1].splitlines()[0]
    assert command.endswith("replay --launch 5,6 %s" % inner), command
    assert "cuda_debug run: replaying it to find the thread, the address and the allocation" in err
    assert err.index(cmd) < err.index("cuda_debug run: replaying it")      # the report first
    assert "instrumenting the 2 candidate launches #5, #6" in err
    assert "none of the candidates #5, #6 came" in err


def test_the_last_instrumented_launches_are_kept(tmp_path, fake_san):
    """More launches instrumented than C keeps (a ring of the last ones): the
    bad one, the last, is still there."""
    assert _core.REPLAY_RESULTS < 20
    script = _script(tmp_path, """\
        fk.fake_san_alloc(0x10000000, 1200, 0, 11)
        a, n = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(300)])
        b, m = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(301)])
        for _ in range(19):
            check(fk.fake_san_launch(b"_Z4fillPfi", 10, 32, a, n))
        check(fk.fake_san_launch(b"_Z4fillPfi", 10, 32, b, m))      # the 20th
        """)
    p = _replay_child(tmp_path, fake_san, script, "--kernel", "_Z4fillPfi", "--max-launches",
                      "20")
    assert p.returncode == 3, p.stderr
    assert "found by cuda-debug replay: launch #20 instrumented" in p.stderr
    p = _replay_child(tmp_path, fake_san, script, "--kernel", "_Z4fillPfi", "--max-launches",
                      "19")
    assert p.returncode == 4 and "19 launches, from #1" in p.stderr, p.stderr


def test_pytorch_history_starts_when_the_program_imports_torch(tmp_path, fake_san):
    """The replay records PyTorch's allocations from the program's own `import
    torch` on (not before: what the program sets up before importing it, such
    as CUDA_VISIBLE_DEVICES, still counts), then takes the first snapshot."""
    pkg = tmp_path / "fakemods" / "torch"
    (pkg / "cuda").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from . import cuda\n")
    (pkg / "cuda" / "__init__.py").write_text("from . import memory\n")
    (pkg / "cuda" / "memory.py").write_text(textwrap.dedent("""\
        import os
        calls = []
        def _record_memory_history(enabled=None, context=None, stacks=None):
            calls.append(("record", enabled, context, stacks, os.environ.get("SET_BY_PROG")))
        def _snapshot():
            calls.append(("snapshot",))
            return {"segments": []}
        """))
    script = _script(tmp_path, """\
        import os
        os.environ["SET_BY_PROG"] = "before import"
        import torch
        print("RESULT " + __import__("json").dumps(torch.cuda.memory.calls))
        """)
    full = {_replay.ENV: fake_san, "PYTHONPATH": str(tmp_path / "fakemods") + os.pathsep +
            PKG_PARENT}
    p = _cli("replay", "--launch", "1", str(script), env=full, cwd=str(tmp_path))
    assert p.returncode == 4, p.stderr          # nothing launched: not reached
    assert _result(p) == [["record", "state", "state", "python", "before import"],
                          ["snapshot"]]
    p = _cli("replay", "--launch", "1", "--no-torch", str(script), env=full, cwd=str(tmp_path))
    assert _result(p) == []


def test_calls_fail_only_after_a_bad_access_and_waits_too(tmp_path, fake_san):
    """The driver-API callbacks (they cost a training step ~15%) are enabled only
    when a bad access is found; then that launch, every later one, and the
    waits fail, as on a dead context."""
    script = _script(tmp_path, """\
        import json
        fk.fake_san_alloc(0x10000000, 1200, 0, 11)
        a, n = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(300)])
        b, m = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(301)])
        for _ in range(3):
            check(fk.fake_san_launch(b"_Z4fillPfi", 10, 32, a, n))
        before = fk.stats()["driver_callbacks"]
        sync_before = fk.fake_san_sync()
        rc = fk.fake_san_launch(b"_Z4fillPfi", 10, 32, b, m)
        after = [rc, fk.fake_san_sync(), fk.fake_san_launch(b"_Z4fillPfi", 10, 32, a, n)]
        print("RESULT " + json.dumps([before, sync_before, after]))
        """)
    p = _replay_child(tmp_path, fake_san, script, "--kernel", "_Z4fillPfi")
    assert p.returncode == 3, p.stderr
    assert _result(p) == [0, 0, [700, 700, 700]]


def test_reserved_address_ranges_are_no_memory(tmp_path, fake_san):
    """The driver reserves large address ranges (measured on the H200: every
    overrun fell inside one): an access there is still outside every
    allocation, whether the ranges come from Python or, when Python's hook
    fails, from the C table."""
    body = """\
        import cuda_debug._replay as r
        FAIL
        fk.fake_san_alloc(0x7f0000000000, 1 << 36, 0, 26)     # a reservation
        fk.fake_san_alloc(0x7f0000200000, 1200, 0, 11)
        a, n = acc([(0x7f0000200000 + 4 * i, 4, 2, i) for i in range(301)])
        check(fk.fake_san_launch(b"_Z4fillPfi", 10, 32, a, n))
        """
    for fail, says in (("", "found by"), ("r.snapshot_provider = lambda: 1 / 0",
                                          "the live tensors could not be read: "
                                          "ZeroDivisionError"),
                       # Python's hook fails whole: C checks against its own table
                       ("r._core.replay_allocations = lambda: 1 / 0", "the live tensors "
                                                                      "could not be read")):
        script = _script(tmp_path, body.replace("FAIL", fail or "pass"))
        p = _replay_child(tmp_path, fake_san, script, "--kernel", "fill")
        assert p.returncode == 3, p.stderr
        assert says in p.stderr
        assert "wrote 4 bytes at 0x7f00002004b0" in p.stderr
        if "replay_allocations" not in fail:
            assert "right past the end of a 1,200-byte allocation" in p.stderr


def test_a_launch_from_a_thread_without_python_frames():
    """PyTorch's autograd threads launch from C++: C calls the hook with no
    Python frame under it (as _thread.start_new_thread calls its function). It
    still keeps the launch's memory (and gives the ranges)."""
    import _thread
    import time as _time
    import cuda_debug._replay as r
    r._launches.clear()
    _thread.start_new_thread(r._ranges_hook, (7, b"k", (1, 1, 1), (1, 1, 1), 0, 0, 0))
    for _ in range(500):
        if 7 in r._launches:
            break
        _time.sleep(0.01)
    entry = r._launches.pop(7, None)
    assert entry is not None and entry["stack"] == [] and entry["error"] is None


def test_several_candidates_are_each_instrumented(tmp_path, fake_san):
    """The always-on watch names up to K candidates (a completion marker behind
    every K-th launch): the replay instruments each, whatever its kernel."""
    script = _script(tmp_path, """\
        fk.fake_san_alloc(0x10000000, 1200, 0, 11)
        a, n = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(300)])
        b, m = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(301)])
        check(fk.fake_san_launch(b"_Z3onev", 10, 32, a, n))       # 1
        check(fk.fake_san_launch(b"_Z3twov", 10, 32, a, n))       # 2
        check(fk.fake_san_launch(b"_Z5threev", 10, 32, b, m))     # 3: the bad one
        """)
    p = _replay_child(tmp_path, fake_san, script, "--launch", "1,3")
    assert p.returncode == 3, p.stderr
    assert "instrumenting the 2 candidate launches #1, #3" in p.stderr
    assert "illegal memory access in three" in p.stderr
    assert "found by cuda-debug replay: launch #3 instrumented" in p.stderr
    p = _replay_child(tmp_path, fake_san, script, "--launch", "1,2")
    assert p.returncode == 4, p.stderr
    assert "the candidates #1, #2 ran instrumented (2 of 2) and made no bad access" in p.stderr
    p = _replay_child(tmp_path, fake_san, script, "--launch", "1,3", "--kernel", "three")
    assert p.returncode == 2 and "no --kernel, --window or --max-launches" in p.stderr
    p = _replay_child(tmp_path, fake_san, script, "--launch", "1,x")
    assert p.returncode == 2 and "up to 64 of them separated by commas" in p.stderr


def test_reads_go_through_pinned_memory_where_pageable_memory_is_refused(tmp_path, fake_san):
    """The H200's Sanitizer refused every pageable destination of the copy back
    (so does the fake): the replay falls back to pinned host memory of the
    Sanitizer's own, and tries that first for the next launch."""
    script = _script(tmp_path, OOB)
    p = _replay_child(tmp_path, fake_san, script, "--kernel", "_Z4fillPfi",
                      env={"CUDA_DEBUG_REPLAY_TRACE": "1"})
    assert p.returncode == 3, p.stderr
    assert "right past the end of a 1,200-byte allocation" in p.stderr
    trace = [l for l in p.stderr.splitlines() if l.startswith("cuda_debug replay trace: copy")]
    refused = [l for l in trace if "by the launch's stream: 1" in l]
    took = [l for l in trace if "by pinned host memory: 0" in l]
    assert len(refused) == 1, trace      # launch 1 found the way; launch 2 went straight there
    assert len(took) == 3, trace         # launch 1's state; launch 2's state and its records
    assert trace.index(refused[0]) < trace.index(took[0])


LONG_OVERRUN = """\
    fk.fake_san_alloc(0x10000000, 1200, 0, 11)
    # 200 threads, one per warp, each writing one float past the end: the device
    # met the highest addresses first, so its first 64 records are the far end
    a, n = acc([(0x10000000 + 1200 + 4 * (199 - i), 4, 2, 32 * i) for i in range(200)])
    check(fk.fake_san_launch(b"_Z4fillPfi", 200, 32, a, n))   # LAUNCH
"""


def test_a_long_overrun_is_named_at_its_start(tmp_path, fake_san):
    """More bad accesses than are kept: the ones kept are the two ends of the run,
    and the lead is the first byte past the end (not the first the device met)."""
    script = _script(tmp_path, LONG_OVERRUN)
    p = _replay_child(tmp_path, fake_san, script, "--kernel", "_Z4fillPfi", in_process=True)
    r = _result(p)
    assert r["rc"] == 3, p.stderr
    assert r["address"] == 0x10000000 + 1200, p.stderr
    assert (r["fault_thread"], r["fault_block"]) == ([0, 0, 0], [199, 0, 0])
    assert r["n_bad"] == 64
    assert ("thread [0,0,0] of block [199,0,0] wrote 4 bytes at 0x100004b0, right past the end "
            "of a 1,200-byte allocation") in p.stderr
    assert "(200 bad accesses in all, by at least 64 threads seen, at 0x100004b0..0x100007d0)" \
        in p.stderr


def test_an_underrun_is_named_at_the_start_it_missed(tmp_path, fake_san):
    """Bad accesses that end right below an allocation (a negative index): the
    lead is the highest, 4 bytes before its start, not the first the device met."""
    script = _script(tmp_path, """\
        fk.fake_san_alloc(0x10000000, 1200, 0, 11)
        fk.fake_san_alloc(0x10010000, 1200, 0, 11)
        a, n = acc([(0x10010000 - 4 * (100 - i), 4, 1, 32 * i) for i in range(100)])
        check(fk.fake_san_launch(b"_Z4readPfi", 100, 32, a, n))   # LAUNCH
        """)
    p = _replay_child(tmp_path, fake_san, script, "--kernel", "_Z4readPfi", in_process=True)
    r = _result(p)
    assert r["rc"] == 3, p.stderr
    assert r["address"] == 0x10010000 - 4, p.stderr
    assert r["allocation"]["address"] == 0x10010000
    assert "read 4 bytes at 0x1000fffc, 4 bytes before the start of a 1,200-byte allocation" \
        in p.stderr


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# cuda-debug replay on a GPU, with NVIDIA's Sanitizer API (the CUDA toolkit's, or the
# cuda_debug[replay] wheel's). Each program runs in its own process: the replay
# subscribes before CUDA starts, and an original run may kill its context.
#
# - a raw driver kernel (cuda_debug.testing) writing 96 bytes past a 256-byte
#   cuMemAlloc'd buffer: silent on its own, named by the replay;
# - a real illegal address: `run --replay` prints the report with the replay
#   command, then replays it;
# - a PyTorch op writing past a tensor's end inside a caching-allocator segment
#   (a fill over a storage made too long), and a Triton custom op storing 24
#   elements past its output: the tensor named, its shape, dtype and line;
# - a CuPy RawKernel past its array (no PyTorch: the allocation only).
# ======================================================================================


@pytest.fixture(scope="module", autouse=True)
def sanitizer():
    from cuda_debug import _replay
    found = _replay.find_library()
    if not found.path:
        pytest.skip(_replay.not_found_message(found))
    return found.path


def _run(tmp_path, body, *argv, name="prog.py", timeout=300):
    script = tmp_path / name
    script.write_text(textwrap.dedent(body))
    env = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "cuda_debug"] + list(argv) + [str(script)],
                       capture_output=True, text=True, timeout=timeout, env=env,
                       cwd=str(tmp_path))
    return p, script


def _line(script, marker):
    return next(i for i, l in enumerate(script.read_text().splitlines(), 1) if marker in l)


@pytest.mark.gpu
def test_raw_kernel_past_a_buffer(tmp_path):
    p, script = _run(tmp_path, """\
        import cuda_debug.testing as t
        t.empty()
        t.out_of_bounds_write(96)        # LAUNCH
        print("went on")
        """, "replay", "--kernel", "write_wild", "--no-torch")
    assert p.returncode == 3, p.stderr
    assert "IllegalAddressError: illegal memory access in write_wild" in p.stderr
    assert "launched at %s:%d" % (script, _line(script, "# LAUNCH")) in p.stderr
    assert re.search(r"thread \[0,0,0\] of block \[0,0,0\] wrote 4 bytes at 0x[0-9a-f]+, 96 "
                     r"bytes past the end of a 256-byte allocation", p.stderr), p.stderr
    assert "went on" not in p.stdout


@pytest.mark.gpu
def test_run_replay_of_a_real_illegal_address(tmp_path):
    """The whole path: watch names the kernel and prints the replay command;
    --replay runs it; the wild store is stopped and named."""
    p, script = _run(tmp_path, """\
        import cuda_debug, cuda_debug.testing as t
        for _ in range(5):
            t.empty()
        t.illegal_address()              # LAUNCH
        cuda_debug.check()
        """, "run", "--replay")
    assert p.returncode == 3, p.stderr
    err = p.stderr
    cmd = re.search(r"to find the thread, the address and the tensor: (.*)", err)
    assert cmd, err
    # exact (launch 6, its kernel), or the always-on watch's candidates (6 among them)
    assert re.search(r"replay --launch (6 --kernel _ZN18cuda_debug_testing10write_wildEPix|"
                     r"[\d,]*\b6\b)", cmd.group(1)), cmd.group(1)
    replay = err.split("cuda_debug run: replaying it", 1)[1]
    assert "IllegalAddressError: illegal memory access in write_wild" in replay
    assert "launched at %s:%d" % (script, _line(script, "# LAUNCH")) in replay
    assert re.search(r"thread \[0,0,0\] of block \[0,0,0\] wrote 4 bytes at 0x100, in no "
                     r"allocation", replay), replay
    assert "found by cuda-debug replay: launch #6 instrumented" in replay


TORCH_FILL = """\
    import torch
    x = torch.zeros(300, device="cuda")                 # ALLOC x
    y = torch.ones(300, device="cuda")
    torch.cuda.synchronize()
    # a storage that claims 1,600 bytes over x's 1,200: a fill runs past x's end,
    # inside the caching allocator's segment (nothing faults)
    long = torch._C._construct_storage_from_data_pointer(x.data_ptr(), x.device, 1600)
    bad = torch.empty(0, device="cuda").set_(long, 0, (400,), (1,))
    bad.fill_(7.0)                                      # LAUNCH
    torch.cuda.synchronize()
    print("y", y.sum().item())
    """


@pytest.mark.gpu
def test_pytorch_op_past_a_tensor_inside_a_cached_segment(tmp_path):
    torch = pytest.importorskip("torch")
    if not hasattr(torch._C, "_construct_storage_from_data_pointer"):
        pytest.skip("this PyTorch has no _construct_storage_from_data_pointer")
    p, script = _run(tmp_path, TORCH_FILL, "replay", "--kernel", "FillFunctor",
                     "--max-launches", "8")
    assert p.returncode == 3, p.stderr
    assert "launched at %s:%d" % (script, _line(script, "# LAUNCH")) in p.stderr
    m = re.search(r"wrote (?:4|8|16) bytes at 0x[0-9a-f]+, (right|[\d,]+ bytes) past the end of "
                  r"a 1,200-byte tensor \(float32\[300\]\) allocated at prog.py:(\d+)", p.stderr)
    assert m, p.stderr
    assert int(m.group(2)) == _line(script, "# ALLOC x")
    assert "y 300.0" not in p.stdout                    # stopped at the fill


@pytest.mark.gpu
def test_triton_custom_op_past_its_output(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    p, script = _run(tmp_path, """\
        import torch, triton, triton.language as tl

        @triton.jit
        def store_past(p, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(p + offs, 1.0, mask=offs < n + 24)   # 24 elements too many

        @torch.library.custom_op("cd_test::ones_like_past", mutates_args=())
        def ones_like_past(x: torch.Tensor) -> torch.Tensor:
            out = torch.empty_like(x)                     # ALLOC out
            store_past[(triton.cdiv(x.numel(), 128),)](out, x.numel(), BLOCK=128)
            return out

        x = torch.zeros(300, device="cuda")
        y = ones_like_past(x)                             # LAUNCH
        torch.cuda.synchronize()
        """, "replay", "--kernel", "store_past")
    assert p.returncode == 3, p.stderr
    assert "illegal memory access in store_past" in p.stderr
    m = re.search(r"of block \[2,0,0\] wrote (?:4|8|16) bytes at 0x[0-9a-f]+, (right|[\d,]+ bytes) "
                  r"past the end of a 1,200-byte tensor \(float32\[300\]\) allocated at "
                  r"prog.py:(\d+)", p.stderr)
    assert m, p.stderr
    assert int(m.group(2)) == _line(script, "# ALLOC out")


@pytest.mark.gpu
def test_cupy_raw_kernel_past_its_array(tmp_path):
    pytest.importorskip("cupy")
    p, script = _run(tmp_path, """\
        import cupy as cp
        k = cp.RawKernel(r'''extern "C" __global__ void cupy_past(float *p, int n) {
            int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) p[i] = 1.0f; }''',
            "cupy_past")
        x = cp.zeros(300, dtype=cp.float32)
        k((8,), (256,), (x, cp.int32(300 + 1024)))      # LAUNCH
        cp.cuda.Device().synchronize()
        """, "replay", "--kernel", "cupy_past", "--no-torch")
    assert p.returncode == 3, p.stderr
    assert "launched at %s:%d" % (script, _line(script, "# LAUNCH")) in p.stderr
    assert re.search(r"wrote 4 bytes at 0x[0-9a-f]+, (right|[\d,]+ bytes) past the end of a "
                     r"[\d,]+-byte allocation", p.stderr), p.stderr


@pytest.mark.gpu
def test_a_clean_kernel_is_not_reported(tmp_path):
    """The check has no false alarm on real kernels: a replay targeting the
    kernels of a transformer step finds nothing and says the run did not repeat."""
    pytest.importorskip("torch")
    p, script = _run(tmp_path, """\
        import torch
        layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
        model = torch.nn.TransformerEncoder(layer, 2).cuda()
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(8, 128, 512, device="cuda")
        for _ in range(2):
            opt.zero_grad()
            model(x).float().pow(2).mean().backward()
            opt.step()
        torch.cuda.synchronize()
        """, "replay", "--kernel", "_Z", "--max-launches", "16")
    assert p.returncode == 4, p.stderr
    assert "made no bad access" in p.stderr
