"""Inside the kernel, on CPU: a PC offset mapped to its source line offline.

- tests/kernel_lines/lines.cubin: lines.cu built with ``nvcc -lineinfo -cubin
  -arch=sm_90 -O3`` (lines_noinfo.cubin: the same, without -lineinfo); CUPTI's
  cuptiGetSassToSourceCorrelation reads its line table without a GPU (the
  CUDA toolkit's or NVIDIA's wheel's libcupti; skipped where there is none);
- the replay's module images kept from the Sanitizer's module-load callback
  (the fake Sanitizer API runs the real C callback): the culprit's kept, others
  not, the bound held;
- the whole replay: the report's ``in the kernel:`` line, on the exception too;
- nvdisasm's output parsed (the instruction and the inline chain);
- cuda-gdb's output parsed into warp groups, spinning told from waiting at a
  barrier, and the one-line reason when cuda-gdb is missing or ptrace refused.

On a real GPU: the tests at the end of this module (marked gpu).
"""
import glob
import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import PKG_PARENT

from cuda_debug import _kernel_lines as kl, _replay, _warps
import re
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CUBIN = os.path.join(HERE, "kernel_lines", "lines.cubin")
NOINFO = os.path.join(HERE, "kernel_lines", "lines_noinfo.cubin")
SOURCE = os.path.join(HERE, "kernel_lines", "lines.cu")


def _line_of(marker):
    with open(SOURCE) as f:
        return next(i for i, l in enumerate(f.read().splitlines(), 1) if marker in l)


def _real_cupti():
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"] + \
        sorted(glob.glob("/usr/local/cuda-*"), reverse=True)
    import site
    cands = []
    for r in (r for r in roots if r):
        cands += glob.glob(os.path.join(r, "lib*", "libcupti.so*")) + \
            glob.glob(os.path.join(r, "extras", "CUPTI", "lib64", "libcupti.so*"))
    for d in site.getsitepackages():
        cands += glob.glob(os.path.join(d, "nvidia", "*", "lib", "libcupti.so*"))
    import ctypes
    for c in cands:
        try:
            if hasattr(ctypes.CDLL(c), "cuptiGetSassToSourceCorrelation"):
                return c
        except OSError:
            pass
    return None


@pytest.fixture(scope="module")
def cupti():
    path = _real_cupti()
    if path is None:
        pytest.skip("no CUPTI with cuptiGetSassToSourceCorrelation here (the CUDA toolkit's "
                    "or the nvidia-cuda-cupti wheel's)")
    return path


def _image(path):
    with open(path, "rb") as f:
        return f.read()


# -- the line table, by CUPTI --------------------------------------------------------

def test_the_store_of_an_inlined_function_maps_to_its_line(cupti):
    k = kl.lookup(_image(CUBIN), "write_at", 0x80, cupti=cupti, use_nvdisasm=False)
    assert os.path.basename(k.file) == "lines.cu"
    assert k.line == _line_of("line 4: the store")
    assert k.how == "CUPTI" and k.note is None


def test_the_load_of_a_second_kernel_maps_to_its_line(cupti):
    k = kl.lookup(_image(CUBIN), "read_at", 0xa0, cupti=cupti, use_nvdisasm=False)
    assert (os.path.basename(k.file), k.line) == ("lines.cu", _line_of("// line 18"))


def test_the_source_text_is_read_where_the_file_is(cupti, tmp_path, monkeypatch):
    # the cubin names lines.cu relative to the folder it was built in; a file of that
    # name there gives the text (here: the checked-in source, copied to a folder named so)
    k = kl.lookup(_image(CUBIN), "write_at", 0x80, cupti=cupti, use_nvdisasm=False)
    folder = os.path.dirname(k.file)
    if not os.path.isdir(folder):
        pytest.skip("the cubin was built in %s, not here" % folder)
    assert k.source and "p[i] = v;" in k.source


def test_without_line_info_the_function_offset_and_hint(cupti):
    k = kl.lookup(_image(NOINFO), "write_at", 0x80, cupti=cupti, use_nvdisasm=False)
    assert k.file is None and k.line is None
    assert k.note == kl.HINT
    text = kl.text(k, lambda n: n)
    assert text.splitlines()[0] == "in the kernel: write_at+0x80"
    assert "-lineinfo" in text and 'options=("-lineinfo",)' in text and \
        "extra_cuda_cflags" in text


def test_no_image_or_not_a_cubin_says_so():
    assert "was not kept" in kl.lookup(None, "k", 0x10).note
    assert "not loaded as a cubin" in kl.lookup(b"\x50\xed\x55\xba" + b"\0" * 60, "k", 0x10).note
    assert kl.lookup(b"", "k", None) is None


def test_a_text_with_a_line_and_its_inline_chain():
    k = kl.KernelLine("write_at", 0x80, "/src/lines.cu", 4, "p[i] = v;",
                      (("/src/lines.cu", 11, "write_at"),), "STG.E [R2.64], R5", "nvdisasm", None)
    assert kl.text(k, str) == ("in the kernel: /src/lines.cu:4  p[i] = v;\n"
                               "  inlined at /src/lines.cu:11 in write_at")


# nvdisasm -gi -c of lines.cubin (nvdisasm 13.5), the store's part
NVDISASM = """\
\t.section\t.text.write_at,"ax",@progbits
.text.write_at:
\t//## File "/src/lines.cu", line 7
        /*0000*/                   LDC R1, c[0x0][0x28] ;
.L_x_4:
        /*0070*/               @P0 EXIT ;
\t//## File "/src/lines.cu", line 4 inlined at "/src/lines.cu", line 11
\t//## File "/src/lines.cu", line 11
        /*0080*/                   LDC.64 R2, c[0x0][0x210] ;
\t//## File "/src/lines.cu", line 11
        /*00b0*/                   IMAD R5, R0, UR4, RZ ;
\t//## File "/src/lines.cu", line 4 inlined at "/src/lines.cu", line 11
\t//## File "/src/lines.cu", line 11
        /*00d0*/                   IMAD.WIDE R2, R5, 0x4, R2 ;
        /*00e0*/                   STG.E desc[UR4][R2.64], R7 ;
.L_x_5:
\t//## File "/src/lines.cu", line 12
        /*00f0*/                   EXIT ;
"""


def test_nvdisasm_output_gives_the_instruction_and_the_chain():
    insn, lines = kl.parse_nvdisasm(NVDISASM, "write_at", 0xe0)
    assert insn == "STG.E desc[UR4][R2.64], R7"
    assert lines == [("/src/lines.cu", 4, 'inlined at "/src/lines.cu", line 11'),
                     ("/src/lines.cu", 11, "")]
    assert kl.parse_nvdisasm(NVDISASM, "write_at", 0xb0)[1] == [("/src/lines.cu", 11, "")]
    assert kl.parse_nvdisasm(NVDISASM, "read_at", 0xe0) is None


def test_real_nvdisasm_adds_the_instruction_and_inline_chain(cupti):
    exe = kl.find_nvdisasm()
    if exe is None:
        pytest.skip("no nvdisasm here (the CUDA toolkit's or the nvidia-cuda-nvdisasm wheel's)")
    k = kl.lookup(_image(CUBIN), "write_at", 0xe0, cupti=cupti, nvdisasm=exe)
    assert k.instruction.startswith("STG.E")
    assert k.line == _line_of("line 4: the store")
    assert [(os.path.basename(f), n) for f, n, _ in k.inlined] == [
        ("lines.cu", _line_of("line 11: the call"))]
    assert k.how == "CUPTI and nvdisasm"


def test_source_line_reads_only_regular_files(tmp_path):
    f = tmp_path / "k.cu"
    f.write_text("a\n  b = c[i];  \n")
    assert kl.source_line(str(f), 2) == "b = c[i];"
    assert kl.source_line(str(f), 3) is None
    assert kl.source_line(str(tmp_path), 1) is None
    assert kl.source_line("/dev/zero", 1) is None
    assert kl.source_line(str(tmp_path / "missing.cu"), 1) is None


def test_a_triton_kernel_compiled_elsewhere_gets_this_runs_line(tmp_path, monkeypatch):
    """Triton's cache keys a kernel by its source: a cubin compiled from another
    file (or before the lines above it changed) names that file; the line is
    moved to where the loaded JITFunction defines it."""
    import types
    old = tmp_path / "old.py"
    old.write_text("import triton\n@triton.jit\ndef k(p):\n    store(p)\n")
    new = tmp_path / "new.py"
    new.write_text("import triton\n\n\n# moved\n@triton.jit\ndef k(p):\n    store(p)\n")

    class JITFunction:
        def __init__(self, fn):
            self.fn = fn
    ns = {}
    exec(compile("\n" * 5 + "def k(p):\n    pass\n", str(new), "exec"), ns)
    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = JITFunction
    user = types.ModuleType("user_kernels")
    user.k = JITFunction(ns["k"])
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    monkeypatch.setitem(sys.modules, "user_kernels", user)
    k = kl.KernelLine("k", 0x40, str(old), 4, "store(p)", (), None, "CUPTI", None)
    moved = _replay._triton_moved(k)
    assert (moved.file, moved.line, moved.source) == (str(new), 7, "store(p)")
    old.unlink()                             # the file it came from is gone: said
    kept = _replay._triton_moved(k)
    assert kept.line == 4 and "Triton's cache" in kept.note


# -- the replay keeps the culprit module's image ------------------------------------------

@pytest.fixture(scope="module")
def fake_san():
    sys.path.insert(0, HERE)
    from fake_cuda import Unavailable
    from fake_cuda.sanitizer import build_sanitizer
    try:
        return build_sanitizer()
    except Unavailable as e:
        pytest.skip("fake Sanitizer API not buildable here: %s" % e)


PRELUDE = """\
import ctypes, json, sys
sys.path.insert(0, %r)
from fake_cuda.sanitizer import fake_sanitizer
fk = fake_sanitizer()

def acc(rows):
    flat = [v for r in rows for v in r]
    return (ctypes.c_uint64 * max(len(flat), 1))(*flat), len(rows)

def check(rc):
    if rc:
        raise RuntimeError("CUDA error: an illegal memory access was encountered (%%d)" %% rc)
""" % HERE

DRIVER = """\
import json, sys
import cuda_debug
from cuda_debug import _cli, _core
rc = _cli.main(sys.argv[1:])
e = cuda_debug.last_error()
line = (e.replay or {}).get("kernel_line") if e is not None else None
print("RESULT " + json.dumps({"rc": rc, "kernel_line": line,
                             "images": _core.replay_image_stats()}))
"""


def _replay_child(tmp_path, fake_san, body, *opts, env=None):
    script = tmp_path / "prog.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    e = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e[_replay.ENV] = fake_san
    e.update(env or {})
    p = subprocess.run([sys.executable, str(driver), "replay", "--no-torch"] + list(opts) +
                       [str(script)], capture_output=True, text=True, timeout=60, env=e,
                       cwd=str(tmp_path))
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return p, json.loads(line[7:])
    raise AssertionError("no result:\n%s\n%s" % (p.stdout, p.stderr))


# The fake records an access's PC as the function's start + 0x40 + 16 x its index:
# the fifth access (index 4) is at offset 0x80, the store of lines.cu line 4.
WILD = """\
fk.fake_san_module(b"write_at", open(%r, "rb").read(), %d)
fk.fake_san_module(b"other", b"\\x7fELF" + b"\\0" * 4000, 4004)
fk.fake_san_alloc(0x10000000, 1200, 0, 11)
a, n = acc([(0x10000000 + 4 * i, 4, 2, i) for i in range(4)] + [(0x10000000 + 4 * 400, 4, 2, 4)])
check(fk.fake_san_launch(b"write_at", 1, 32, a, n))
print("went on")
""" % (CUBIN, os.path.getsize(CUBIN))


def test_the_replay_names_the_line_of_the_bad_access(tmp_path, fake_san, cupti):
    p, r = _replay_child(tmp_path, fake_san, WILD, "--kernel", "write_at",
                         env={"CUDA_HOME": os.path.dirname(os.path.dirname(cupti))})
    assert r["rc"] == 3, p.stderr
    k = r["kernel_line"]
    assert k and k["offset"] == 0x80, p.stderr
    assert (os.path.basename(k["file"]), k["line"]) == ("lines.cu", _line_of("line 4: the store"))
    assert "in the kernel: %s:%d" % (k["file"], k["line"]) in p.stderr
    assert r["images"] == [1, os.path.getsize(CUBIN)]      # "other" holds no "write_at"


def test_a_kernel_without_line_info_gets_the_hint(tmp_path, fake_san, cupti):
    body = WILD.replace(repr(CUBIN), repr(NOINFO)).replace(
        str(os.path.getsize(CUBIN)), str(os.path.getsize(NOINFO)))
    p, r = _replay_child(tmp_path, fake_san, body, "--kernel", "write_at",
                         env={"CUDA_HOME": os.path.dirname(os.path.dirname(cupti))})
    assert r["rc"] == 3, p.stderr
    assert r["kernel_line"]["line"] is None
    assert "in the kernel: write_at+0x80" in p.stderr
    assert "build it with -lineinfo" in p.stderr


def test_module_images_stay_bounded(tmp_path, fake_san):
    body = """\
    big = b"\\x7fELF" + b"write_at" + b"\\0" * (20 << 20)
    for i in range(12):
        fk.fake_san_module(b"k%d" % i, big, len(big))
    print("RESULT " + json.dumps(list(__import__("cuda_debug")._core.replay_image_stats())))
    fk.fake_san_module(b"k11", None, 0)                 # unloaded: dropped
    print("RESULT " + json.dumps(list(__import__("cuda_debug")._core.replay_image_stats())))
    """
    script = tmp_path / "prog.py"
    script.write_text(PRELUDE + textwrap.dedent(body))
    e = dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    e[_replay.ENV] = fake_san
    p = subprocess.run([sys.executable, "-m", "cuda_debug", "replay", "--no-torch", "--kernel",
                        "write_at", str(script)], capture_output=True, text=True, timeout=60,
                       env=e, cwd=str(tmp_path))
    got = [json.loads(l[7:]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    assert len(got) == 2, p.stderr
    n, size = got[0]
    assert n == 3 and size <= 64 << 20                  # 3 x 20 MiB fit in 64 MiB
    assert got[1][0] == 2


# -- cuda-gdb --------------------------------------------------------------------------

def _gdb_sample(n):
    with open(os.path.join(HERE, "kernel_lines", "cuda_gdb_barrier_look%d.txt" % n)) as f:
        return f.read()


# What the second look adds for each PC of the first: the instruction before and at
# it (x/2i PC-16), and the line of the one before (info line *PC-16).
X_I = """\
   0x7f8cfb7ac3a0 <barrier_wait+416>:\tBAR.SYNC.DEFER_BLOCKING 0x0
   0x7f8cfb7ac3b0 <barrier_wait+432>:\tSTG.E desc[UR4][R2.64],R7
Line 11 of "/tmp/tmpm693w9ef/0bf4.cubin.cu" starts at address 0x7f8cfb7ac390 <barrier_wait+400> \
and ends at 0x7f8cfb7ac3b0 <barrier_wait+432>.
"""


def test_two_looks_tell_spinning_from_a_barrier():
    """cuda-gdb's two looks at the barrier kernel on the H100 (CuPy, -lineinfo): half of
    each block waits at __syncthreads() (line 11; cuda-gdb shows the PC after the
    barrier, line 12), the other half spins in a clock64() loop (lines 7-8)."""
    one = _warps.Look(_warps.parse_threads(_gdb_sample(1)), _warps.parse_kernels(_gdb_sample(1)),
                      {}, 0.96, None, "")
    raw2 = _gdb_sample(2) + X_I
    two = _warps.Look(_warps.parse_threads(raw2), _warps.parse_kernels(raw2),
                      _warps.parse_instructions(raw2), 1.52, None, raw2,
                      _warps.parse_info_lines(raw2))
    assert one.kernels == {0: "barrier_wait()"}
    assert [(g.line, g.threads) for g in one.groups] == [(12, 64), (7, 32), (7, 32), (12, 64),
                                                         (7, 64)]
    rows = _warps.states(one, two)
    got = {(r["line"], r["state"]): r["warps"] for r in rows}
    assert got == {(11, "at a barrier"): 4, (7, "spinning"): 4}
    barrier = next(r for r in rows if r["state"] == "at a barrier")
    assert barrier["instruction"].startswith("BAR.SYNC")
    text = _warps.lines({"groups": rows, "kernels": two.kernels, "seconds": [0.96, 1.52],
                         "note": None})
    assert text[0].startswith("4 warps (128 threads) at a barrier at /tmp/tmpm693w9ef/0bf4.cubin"
                              ".cu:11 in barrier_wait [BAR.SYNC")
    assert text[1].startswith("4 warps (128 threads) spinning at ")
    assert text[-1] == "(cuda-gdb attached, read and detached: 1.0 + 1.5 s; the process ran on)"


def test_a_warp_that_stayed_elsewhere_is_waiting_and_one_look_says_nothing():
    one = _warps.Look(_warps.parse_threads(_gdb_sample(1)), {}, {}, 1.0, None, "")
    rows = _warps.states(one, one)
    assert {r["state"] for r in rows} == {"waiting"}
    assert {r["state"] for r in _warps.states(_warps.Look([], {}, {}, 0, None, ""), one)} == {""}


def test_no_cuda_gdb_says_why_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setenv(_warps.EXE_ENV, str(tmp_path / "cuda-gdb"))
    d = _warps.warps(os.getpid())
    assert d["groups"] == [] and d["note"].startswith("warps: cuda-gdb was not found")
    assert "\n" not in d["note"] and "install" in d["note"]


def test_ptrace_scope_and_other_users_are_named(monkeypatch):
    if os.geteuid() == 0:
        pytest.skip("root may attach to anything")
    assert _warps.ptrace_refusal(1) is not None         # init: another user's


def test_dump_warps_without_cuda_gdb_says_why_and_the_report_stands(fake_live, tmp_path):
    """dump --warps on the fake driver: cuda-gdb not found gives one line (text) or
    the note (--json); without --warps nothing attaches and no "warps" is there."""
    from helpers.cli import cli
    with fake_live('''
        import cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        with cuda_debug.watch(exact=True):
            t.spin(60)                      # SPIN
            print("READY", flush=True)
            cuda_debug.check()
    ''') as live:
        live.wait_for("READY", name="stdout")
        env = {"CUDA_DEBUG_CUDA_GDB": str(tmp_path / "cuda-gdb")}
        p = cli("dump", "--warps", "--json", str(live.pid), env=env, timeout=30)
        assert p.returncode == 0, p
        doc = json.loads(p.stdout)
        assert doc["streams"] and doc["warps"]["groups"] == [], doc
        assert doc["warps"]["note"].startswith("warps: cuda-gdb was not found"), doc
        p = cli("dump", str(live.pid), env=dict(env, CUDA_DEBUG_WARPS="1"), timeout=30)
        assert p.returncode == 0, p
        assert "unfinished" in p.stdout
        assert "\n  warps: cuda-gdb was not found (looked in $CUDA_DEBUG_CUDA_GDB=" in p.stdout
        p = cli("dump", "--json", str(live.pid), env=env, timeout=30)
        assert "warps" not in json.loads(p.stdout)


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# Inside the kernel, on a GPU: the faulting access's source line from
# ``cuda-debug replay``, and where a hung kernel's warps are from ``dump
# --warps`` (cuda-gdb attached for a moment), the process alive.
#
# Every program runs in its own process (a fault kills its context; the replay
# subscribes before CUDA starts).
# ======================================================================================


def _env():
    return dict(os.environ, PYTHONPATH=PKG_PARENT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                PYTHONUNBUFFERED="1")


def _write(tmp_path, body, name="prog.py"):
    script = tmp_path / name
    script.write_text(textwrap.dedent(body))
    return script


def _line(script, marker):
    return next(i for i, l in enumerate(script.read_text().splitlines(), 1) if marker in l)


def _src_line(body, marker):
    """The line of `marker` in the CUDA source string of `body` (``src = r'''``
    starts line 1 of it)."""
    rows = textwrap.dedent(body).splitlines()
    start = next(i for i, l in enumerate(rows) if "r'''" in l)
    return next(i for i, l in enumerate(rows) if marker in l) - start + 1


def _run_replay(tmp_path, body, *opts, timeout=300):
    from cuda_debug import _replay as r
    if not r.find_library().path:
        pytest.skip(r.not_found_message(r.find_library()))
    script = _write(tmp_path, body)
    p = subprocess.run([sys.executable, "-m", "cuda_debug", "replay"] + list(opts) +
                       [str(script)], capture_output=True, text=True, timeout=timeout,
                       env=_env(), cwd=str(tmp_path))
    return p, script


@pytest.mark.gpu
def test_triton_wild_store_names_the_store_line(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    p, script = _run_replay(tmp_path, """\
        import torch, triton, triton.language as tl

        @triton.jit
        def store_past(p, n, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(p + offs, 1.0, mask=offs < n + 24)   # STORE

        x = torch.zeros(300, device="cuda")
        store_past[(triton.cdiv(x.numel(), 128),)](x, x.numel(), BLOCK=128)
        torch.cuda.synchronize()
        """, "--kernel", "store_past")
    assert p.returncode == 3, p.stderr
    assert "in the kernel: %s:%d" % (script, _line(script, "# STORE")) in p.stderr, p.stderr
    assert "tl.store(p + offs, 1.0" in p.stderr


@pytest.mark.gpu
def test_cupy_lineinfo_bad_index_names_the_cu_line(tmp_path):
    pytest.importorskip("cupy")
    p, _ = _run_replay(tmp_path, CUPY_BAD, "--kernel", "cupy_past", "--no-torch")
    assert p.returncode == 3, p.stderr
    m = re.search(r"in the kernel: (\S+):(\d+)", p.stderr)
    assert m, p.stderr
    assert int(m.group(2)) == _src_line(CUPY_BAD, "// BAD INDEX")


CUPY_BAD = """\
        import cupy as cp
        src = r'''
        extern "C" __global__ void cupy_past(float *p, int n)
        {
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n)
                p[i * 3] = 1.0f;        // BAD INDEX
        }
        '''
        k = cp.RawKernel(src, "cupy_past", options=("-lineinfo",))
        x = cp.zeros(300, dtype=cp.float32)
        k((2,), (256,), (x, cp.int32(300)))
        cp.cuda.Device().synchronize()
        """


@pytest.mark.gpu
def test_inductor_kernel_names_its_line_and_the_model_line(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("triton")
    p, script = _run_replay(tmp_path, """\
        import torch
        import torch._inductor.config as cfg
        cfg.assert_indirect_indexing = False       # no device assert: a wild load

        def f(x, idx):
            return x[idx] * 2.0                    # MODEL

        g = torch.compile(f)
        x = torch.randn(300, device="cuda")
        idx = torch.arange(300, device="cuda")
        g(x, idx)
        torch.cuda.synchronize()
        idx[7] = 10 ** 7                           # a wild index, not checked by Inductor
        g(x, idx)
        torch.cuda.synchronize()
        """, "--kernel", "triton_", "--max-launches", "8",
        timeout=400)
    if p.returncode == 4 and "made no bad access" in p.stderr:
        pytest.skip("Inductor checked the index here (device assert): no wild access")
    assert p.returncode == 3, p.stderr
    m = re.search(r"in the kernel: (\S*torchinductor\S*\.py):(\d+)", p.stderr)
    assert m, p.stderr
    assert "tl.load" in p.stderr.split("in the kernel:", 1)[1].splitlines()[0]
    assert "torch.compile:" in p.stderr and ":%d" % _line(script, "# MODEL") in p.stderr


@pytest.mark.gpu
def test_pytorch_kernel_without_line_info_gets_function_offset_and_hint(tmp_path):
    torch = pytest.importorskip("torch")
    if not hasattr(torch._C, "_construct_storage_from_data_pointer"):
        pytest.skip("this PyTorch has no _construct_storage_from_data_pointer")
    p, _ = _run_replay(tmp_path, """\
        import torch
        x = torch.zeros(300, device="cuda")
        torch.cuda.synchronize()
        long = torch._C._construct_storage_from_data_pointer(x.data_ptr(), x.device, 1600)
        bad = torch.empty(0, device="cuda").set_(long, 0, (400,), (1,))
        bad.fill_(7.0)
        torch.cuda.synchronize()
        """, "--kernel", "FillFunctor", "--max-launches", "8")
    assert p.returncode == 3, p.stderr
    m = re.search(r"in the kernel: (\S.*)\+0x([0-9a-f]+)", p.stderr)
    assert m, p.stderr
    assert "build it with -lineinfo" in p.stderr


# -- hangs: dump --warps ---------------------------------------------------------------

SPIN_CUPY = """\
    import cupy as cp, os, sys
    src = r'''
    extern "C" __global__ void spin(float *out, long long cycles)
    {
        long long t0 = clock64();
        float acc = 0.0f;
        while (clock64() - t0 < cycles) {
            acc += 1.0f;                    // SPIN
        }
        out[threadIdx.x] = acc;
    }
    '''
    k = cp.RawKernel(src, "spin", options=("-lineinfo",))
    out = cp.zeros(256, dtype=cp.float32)
    k((4,), (128,), (out, cp.int64(int(sys.argv[1]) * 1_800_000_000)))
    open(sys.argv[2], "w").write("ready")
    cp.cuda.Device().synchronize()
    print("finished", float(out[0]) > 0)
    """

BARRIER_CUPY = """\
    import cupy as cp, os, sys
    src = r'''
    extern "C" __global__ void barrier_wait(float *out, long long cycles)
    {
        float acc = 0.0f;
        if (threadIdx.x >= 64) {
            long long t0 = clock64();
            while (clock64() - t0 < cycles) {
                acc += 1.0f;
            }
        }
        __syncthreads();                    // BARRIER
        out[threadIdx.x] = acc;
    }
    '''
    k = cp.RawKernel(src, "barrier_wait", options=("-lineinfo",))
    out = cp.zeros(256, dtype=cp.float32)
    k((2,), (128,), (out, cp.int64(int(sys.argv[1]) * 1_800_000_000)))
    open(sys.argv[2], "w").write("ready")
    cp.cuda.Device().synchronize()
    print("finished")
    """

SPIN_TRITON = """\
    import torch, triton, triton.language as tl, sys

    @triton.jit
    def spin_tl(p, n):
        acc = tl.load(p + tl.arange(0, 128))
        for i in range(n):
            acc = acc * 1.0000001 + 1.0          # SPIN
        tl.store(p + tl.arange(0, 128), acc)

    x = torch.zeros(128, device="cuda")
    spin_tl[(4,)](x, 1)
    torch.cuda.synchronize()
    spin_tl[(4,)](x, int(sys.argv[1]) * 300_000_000)
    open(sys.argv[2], "w").write("ready")
    torch.cuda.synchronize()
    print("finished")
    """


def _cuda_gdb():
    import ctypes
    from cuda_debug import _warps
    exe, _ = _warps.find_cuda_gdb()
    if exe is None:
        pytest.skip("no cuda-gdb here")
    ctypes.CDLL("libcuda.so.1")                 # (a GPU test: the driver is here)
    why = _warps.backend_missing(os.getpid())
    if why:
        pytest.skip(why)
    return exe


def _dump_warps(tmp_path, body, seconds=12, extra_env=None, need_gdb=True):
    """Run `body` under cuda-debug run; once its kernel runs, dump --warps --json
    it; return (dump's result, the program's result, script)."""
    if need_gdb:
        _cuda_gdb()
    script = _write(tmp_path, body)
    ready = tmp_path / "ready"
    prog = subprocess.Popen([sys.executable, "-m", "cuda_debug", "run", str(script), str(seconds),
                             str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=_env(), cwd=str(tmp_path))
    try:
        for _ in range(240):
            if ready.exists() or prog.poll() is not None:
                break
            time.sleep(0.25)
        assert ready.exists(), prog.communicate(timeout=60)
        time.sleep(1.0)
        env = _env()
        env.update(extra_env or {})
        d = subprocess.run([sys.executable, "-m", "cuda_debug", "dump", "--warps", "--json",
                            str(prog.pid)], capture_output=True, text=True, timeout=120, env=env)
        out, err = prog.communicate(timeout=seconds * 4 + 60)
    finally:
        if prog.poll() is None:      # the test's own child, if it went wrong
            prog.kill()
            prog.wait()
    return d, (prog.returncode, out, err), script


def _warps_of(d):
    import json
    assert d.returncode == 0, d.stderr
    doc = json.loads(d.stdout)
    return doc["warps"]


@pytest.mark.gpu
def test_dump_names_the_spinning_line_of_a_cupy_kernel_and_the_process_finishes(tmp_path):
    pytest.importorskip("cupy")
    d, (rc, out, err), _ = _dump_warps(tmp_path, SPIN_CUPY)
    w = _warps_of(d)
    assert w["note"] is None, w
    loop = {_src_line(SPIN_CUPY, "// SPIN"), _src_line(SPIN_CUPY, "while (clock64()")}
    spin = [g for g in w["groups"] if g["state"] == "spinning"]
    assert spin and {g["line"] for g in spin} <= loop, w
    assert sum(g["warps"] for g in spin) == 16            # 4 blocks x 4 warps
    assert rc == 0 and "finished True" in out, err        # detached: it ran on


@pytest.mark.gpu
def test_dump_names_the_spinning_line_of_a_triton_kernel(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    d, (rc, out, err), script = _dump_warps(tmp_path, SPIN_TRITON)
    w = _warps_of(d)
    assert w["note"] is None, w
    spin = [g for g in w["groups"] if g["state"] == "spinning"]
    assert spin, w
    assert all(os.path.basename(g["file"] or "") == "prog.py" for g in spin), w
    assert _line(script, "# SPIN") in {g["line"] for g in spin} or \
        _line(script, "for i in range(n)") in {g["line"] for g in spin}, w
    assert rc == 0 and "finished" in out, err


@pytest.mark.gpu
def test_dump_tells_a_barrier_from_spinning(tmp_path):
    pytest.importorskip("cupy")
    d, (rc, out, err), _ = _dump_warps(tmp_path, BARRIER_CUPY)
    w = _warps_of(d)
    states = {g["line"]: g["state"] for g in w["groups"]}
    assert states.get(_src_line(BARRIER_CUPY, "// BARRIER")) == "at a barrier", w
    assert "spinning" in states.values(), w
    assert rc == 0 and "finished" in out, err


@pytest.mark.gpu
def test_dump_without_cuda_gdb_says_why(tmp_path):
    pytest.importorskip("cupy")
    d, (rc, out, err), _ = _dump_warps(tmp_path, SPIN_CUPY, seconds=4, need_gdb=False, extra_env={
        "CUDA_DEBUG_CUDA_GDB": str(tmp_path / "no-cuda-gdb")})
    w = _warps_of(d)
    assert w["groups"] == [] and w["note"].startswith("warps: cuda-gdb was not found"), w
    assert "\n" not in w["note"]
    assert "kernel" in d.stdout                 # the report without it stands
    assert rc == 0, err


@pytest.mark.gpu
def test_hang_after_report_shows_where_the_warps_are_and_the_process_finishes(tmp_path):
    """run --hang-after 1 with CUDA_DEBUG_WARPS=1: below the hang report, the
    process's own cuda-gdb look names the spinning line; it detaches and the
    program finishes its work."""
    pytest.importorskip("cupy")
    _cuda_gdb()
    script = _write(tmp_path, SPIN_CUPY)
    p = subprocess.run([sys.executable, "-m", "cuda_debug", "run", "--hang-after", "1",
                        str(script), "8", str(tmp_path / "ready")], capture_output=True,
                       text=True, timeout=180, env=dict(_env(), CUDA_DEBUG_WARPS="1"),
                       cwd=str(tmp_path))
    assert p.returncode == 0 and "finished True" in p.stdout, p.stderr[-3000:]
    err = p.stderr
    assert "possible hang" in err, err[-3000:]
    after = err[err.index("where the stuck kernel's warps are"):]
    assert "spinning at" in after, after
    loop = {_src_line(SPIN_CUPY, "// SPIN"), _src_line(SPIN_CUPY, "while (clock64()")}
    assert any(".cu:%d " % n in after for n in loop), after


def test_no_attach_without_the_drivers_debugger_back_end(tmp_path):
    """cuda-gdb cannot read a GPU without the driver's CUDA debugger back-end
    (libcudadebugger.so.1, beside libcuda.so.1); an attach made anyway crashed
    the target on an H100: without it, one line says so and nothing attaches.
    Beside the libcuda the process loaded, or through the loader's cache."""
    from cuda_debug import _warps
    with_it, without = tmp_path / "with", tmp_path / "without"
    for d in (with_it, without):
        d.mkdir()
        (d / "libcuda.so.1").write_text("")
    (with_it / "libcudadebugger.so.1").write_text("")

    def maps(folder):
        return ("7f0000000000-7f0000001000 r-xp 00000000 08:01 42   %s/libcuda.so.1\n"
                "7f0000002000-7f0000003000 r--p 00000000 08:01 43   /usr/lib/libc.so.6\n" % folder)
    assert _warps.backend_missing(1, maps(with_it)) is None
    import ctypes.util
    if ctypes.util.find_library("cudadebugger") is None:       # (a driver here would have it)
        why = _warps.backend_missing(1, maps(without))
        assert why.startswith("the driver's CUDA debugger back-end (libcudadebugger.so.1) is "
                              "not installed beside %s/libcuda.so.1" % without), why
    assert "has not loaded the CUDA driver" in _warps.backend_missing(1, "7f-7f r-xp 0 0:0 1 /x\n")
