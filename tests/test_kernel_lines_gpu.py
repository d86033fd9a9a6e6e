"""Inside the kernel, on a GPU: the faulting access's source line from
``cuda-debug replay``, and where a hung kernel's warps are from ``dump
--warps`` (cuda-gdb attached for a moment), the process alive.

Every program runs in its own process (a fault kills its context; the replay
subscribes before CUDA starts).
"""
import os
import re
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import PKG_PARENT

pytestmark = pytest.mark.gpu


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
    from cuda_debug import _warps
    exe, _ = _warps.find_cuda_gdb()
    if exe is None:
        pytest.skip("no cuda-gdb here")
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


def test_dump_tells_a_barrier_from_spinning(tmp_path):
    pytest.importorskip("cupy")
    d, (rc, out, err), _ = _dump_warps(tmp_path, BARRIER_CUPY)
    w = _warps_of(d)
    states = {g["line"]: g["state"] for g in w["groups"]}
    assert states.get(_src_line(BARRIER_CUPY, "// BARRIER")) == "at a barrier", w
    assert "spinning" in states.values(), w
    assert rc == 0 and "finished" in out, err


def test_dump_without_cuda_gdb_says_why(tmp_path):
    pytest.importorskip("cupy")
    d, (rc, out, err), _ = _dump_warps(tmp_path, SPIN_CUPY, seconds=4, need_gdb=False, extra_env={
        "CUDA_DEBUG_CUDA_GDB": str(tmp_path / "no-cuda-gdb")})
    w = _warps_of(d)
    assert w["groups"] == [] and w["note"].startswith("warps: cuda-gdb was not found"), w
    assert "\n" not in w["note"]
    assert "kernel" in d.stdout                 # the report without it stands
    assert rc == 0, err


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
