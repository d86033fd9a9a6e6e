"""cuda-debug replay on a GPU, with NVIDIA's Sanitizer API (the CUDA toolkit's, or the
cuda_debug[replay] wheel's). Each program runs in its own process: the replay
subscribes before CUDA starts, and an original run may kill its context.

- a raw driver kernel (cuda_debug.testing) writing 96 bytes past a 256-byte
  cuMemAlloc'd buffer: silent on its own, named by the replay;
- a real illegal address: `run --replay` prints the report with the replay
  command, then replays it;
- a PyTorch op writing past a tensor's end inside a caching-allocator segment
  (a fill over a storage made too long), and a Triton custom op storing 24
  elements past its output: the tensor named, its shape, dtype and line;
- a CuPy RawKernel past its array (no PyTorch: the allocation only).
"""
import os
import re
import subprocess
import sys
import textwrap

import pytest

from conftest import PKG_PARENT

pytestmark = pytest.mark.gpu


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
