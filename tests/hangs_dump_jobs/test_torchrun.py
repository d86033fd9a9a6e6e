"""torchrun-facing behaviour on the fake driver (CPU, CI): the rank prefix, the
TORCHELASTIC_ERROR_FILE that torchrun's failure summary reads, and the report
written from a SIGABRT/SIGTERM handler out of the watch ring (NCCL's watchdog
aborts a rank that met a sticky error; torchrun ends the others with SIGTERM).

On a real GPU: the tests at the end of this module (marked gpu).
"""
import json
import signal

import pytest
import os
import subprocess
import sys
from conftest import ROOT, needs

TRAIN = '''
import cuda_debug.testing as t
t.empty()
t.device_assert()
import cuda_debug
cuda_debug.check()
'''


def test_run_under_torchrun_writes_the_error_file_and_prefixes_the_rank(fake_child, tmp_path):
    train = tmp_path / "train.py"
    train.write_text(TRAIN)
    err_file = tmp_path / "error.json"
    c = fake_child('''
        from cuda_debug import _cli
        sys.exit(_cli.main(["run", %r]))
    ''' % str(train), env={"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2",
                             "TORCHELASTIC_ERROR_FILE": str(err_file)})
    assert c.returncode == 3, c
    report = [l for l in c.stderr.splitlines() if "DeviceAssertError: device-side assert" in l]
    assert report and report[-1].startswith("[rank 1] DeviceAssertError"), c.stderr
    assert "[rank 1]   launched at %s:4" % train in c.stderr, c.stderr
    # the C block at the fault is prefixed too
    assert "[rank 1] cuda_debug (watch): device-side assert" in c.stderr, c.stderr
    data = json.loads(err_file.read_text())
    msg = data["message"]
    assert msg["message"].startswith("DeviceAssertError: device-side assert in check_index<int>")
    assert "launched at %s:4" % train in msg["extraInfo"]["py_callstack"]
    assert int(msg["extraInfo"]["timestamp"]) > 0


@pytest.mark.parametrize("sig", ["SIGABRT", "SIGTERM"])
def test_signal_handler_writes_the_watch_report_from_the_ring(fake_child, tmp_path, sig):
    err_file = tmp_path / "error.json"
    c = fake_child('''
        import os, signal, cuda_debug
        fake.fake_set_async(1)
        fake.fake_set_kernel(b"hangs_forever", 0, 0, b"", -1, 60000000)
        with cuda_debug.watch():
            fake.fake_launch(b"hangs_forever", 0, 1, 1, 1, 32, 1, 1)  # LAUNCH
            os.kill(os.getpid(), signal.%s)
            import time; time.sleep(5)
        print("not reached")
    ''' % sig, env={"RANK": "0", "TORCHELASTIC_ERROR_FILE": str(err_file)}, timeout=60)
    assert c.returncode == -getattr(signal, sig), c       # the default action still runs
    assert "not reached" not in c.stdout
    assert "[rank 0] cuda_debug (watch): %s while watching" % sig in c.stderr, c.stderr
    assert "hangs_forever" in c.stderr
    assert "[rank 0]   launched at %s:%d" % (c.script, c.line_of("# LAUNCH")) in c.stderr, c.stderr
    msg = json.loads(err_file.read_text())["message"]
    assert msg["message"].startswith("%s while watching" % sig), msg
    assert "hangs_forever" in msg["extraInfo"]["py_callstack"], msg


def test_signal_handler_chains_to_a_python_handler(fake_child):
    c = fake_child('''
        import os, signal, cuda_debug
        seen = []
        signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
        with cuda_debug.watch():
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(100):
                if seen:
                    break
        report(dict(seen=seen))
    ''')
    assert c.result == {"seen": [int(signal.SIGTERM)]}, c


def test_nccl_kernels_are_not_waited_for_in_a_scope(fake_child):
    c = fake_child('''
        import cuda_debug
        from cuda_debug import _core
        with cuda_debug.launch_blocking():
            fake.fake_launch(b"ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 1, 1, 1, 64, 1, 1)
            fake.fake_launch(b"_Z25ncclKernel_Broadcast_RING", 0, 1, 1, 1, 64, 1, 1)
            a = _core.stats()["synced"]
            fake.fake_launch(b"my_kernel", 0, 1, 1, 1, 64, 1, 1)
            b = _core.stats()["synced"]
        report(dict(a=a, b=b))
    ''')
    assert c.result == {"a": 0, "b": 1}, c


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# torchrun on two GPUs: a device assert on rank 1, in a scope and under watch,
# is reported on rank 1's stderr ([rank 1], kernel, launching line), torchrun's
# failure summary names it as the root cause, and the job ends (no hang).
# ======================================================================================


SCRIPT = os.path.join(ROOT, "benchmarks", "ddp_step.py")


def _two_gpus():
    needs("torch")
    from cuda_debug import _core
    rc, n = _core.device_count()
    if rc or n < 2:
        pytest.skip("needs 2 GPUs (%d here)" % n)
    if not os.path.exists(SCRIPT):
        pytest.skip("benchmarks/ddp_step.py is not here (installed package)")


def _fault_line():
    with open(SCRIPT) as f:
        for i, line in enumerate(f, 1):
            if "# FAULT" in line:
                return i
    raise AssertionError("no # FAULT line")


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["watch", "launch-blocking"])
def test_rank1_device_assert_is_the_root_cause(mode, tmp_path):
    _two_gpus()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", "-m", "cuda_debug", "run"] + (["--launch-blocking"] if mode != "watch" else []) \
        + [SCRIPT, "async", "--fault", "--steps", "10"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    out = p.stdout + p.stderr
    assert p.returncode != 0, out[-4000:]
    assert "[rank 1]" in out and "device-side assert" in out, out[-4000:]
    assert "ddp_step.py:%d" % _fault_line() in out, out[-4000:]
    root = out[out.find("Root Cause"):]
    assert "Root Cause" in out and "device-side assert" in root, out[-4000:]
