"""Hangs on a real GPU: a spinning kernel reported by
watch(hang_after) while the process lives on; ``dump PID`` on a process
waiting in torch.cuda.synchronize(); two ranks under torchrun, one of which
never issues the all_reduce the other waits in.

Every child runs with hard deadlines (conftest.Live) and its process group is
killed on the way out, whatever happened."""
import json
import os
import re
import signal
import time

import pytest

from conftest import Live, needs
from helpers.cli import cli

pytestmark = pytest.mark.gpu

HEADLINE = "cuda_debug (watch): possible hang"


def test_a_spinning_kernel_is_reported_within_10_s_and_the_process_lives():
    with Live('''
        import time, cuda_debug, cuda_debug.testing as t
        with cuda_debug.watch(hang_after=5):
            t.spin(9)                                           # SPIN
            print("LAUNCHED %.3f" % time.monotonic(), flush=True)
            cuda_debug.check()                                  # the host waits
        print("ALIVE", flush=True)
    ''') as live:
        _, launched = live.wait_for("LAUNCHED", name="stdout", timeout=60)
        t_report, _ = live.wait_for(HEADLINE, timeout=20)
        assert t_report - float(launched.split()[1]) <= 10.0, live
        assert live.proc.poll() is None, live                   # alive at the report
        assert live.finish(timeout=60) == 0, live
        assert "ALIVE" in live.text("stdout"), live
        err = live.text()
        assert err.count(HEADLINE) == 1, err
        assert "a launch unfinished for longer than hang_after=5.0 s" in err, err
        assert "  spin on stream 0x0, device 0: unfinished for 5." in err, err
        assert "    launched at %s:%d in <module>" % (live.script, live.line_of("# SPIN")) in err


@pytest.mark.parametrize("exact", [True, False], ids=["exact", "default"])
def test_dump_pid_names_the_kernel_a_process_waits_for_in_synchronize(exact):
    """Exactly, in the default mode too: the spin is the newest unfinished
    launch, and a kernel's first launches get a marker each."""
    needs("torch")
    with Live('''
        import torch, cuda_debug, cuda_debug.testing as t
        torch.zeros(1, device="cuda")         # torch's primary context: cuda_debug's kernels share it
        with cuda_debug.watch(exact=EXACT):   # exact: a marker behind each launch
            for _ in range(100):
                t.empty()
            t.spin(8)                                           # SPIN
            print("READY", flush=True)
            torch.cuda.synchronize()                            # WAIT
        print("ALIVE", flush=True)
    '''.replace("EXACT", repr(exact))) as live:
        live.wait_for("READY", name="stdout", timeout=90)
        time.sleep(1.0)                                         # inside synchronize() now
        p = cli("dump", str(live.pid), timeout=60)
        q = cli("dump", "--json", str(live.pid), timeout=60)
        assert p.returncode == 0 and q.returncode == 0, (p, q)
        lines = p.stdout.splitlines()
        assert lines[0] == "cuda_debug (watch): unfinished launches of pid %d" % live.pid, p
        assert lines[2].startswith("  spin on stream 0x0, device 0: unfinished for "), p
        assert lines[3] == "    launched at %s:%d in <module>" % (
            live.script, live.line_of("# SPIN")), p
        doc = json.loads(q.stdout)
        s = doc["streams"][0]
        assert (doc["pid"], s["short"], s["lineno"], s["device"]) == (
            live.pid, "spin", live.line_of("# SPIN"), 0), doc
        assert s["kernel"].startswith("cuda_debug_testing::spin"), doc
        assert "cuda_debug (watch)" not in live.text(), live    # its stderr: nothing
        # nothing interrupted synchronize(): the process goes on when the kernel ends
        assert live.finish(timeout=60) == 0, live
        assert "ALIVE" in live.text("stdout"), live


TWO_RANKS = '''
import os, torch, torch.distributed as dist
import cuda_debug, cuda_debug.testing as t
rank = int(os.environ["RANK"])
torch.cuda.set_device(rank)
dist.init_process_group("nccl")
x = torch.ones(1 << 20, device="cuda")
dist.all_reduce(x)                    # both ranks: the communicator is up
torch.cuda.synchronize()
print("rank %d ready" % rank, flush=True)
with cuda_debug.watch(hang_after=3):
    if rank == 0:
        dist.all_reduce(x)            # RANK0: rank 1 never joins it
    else:
        t.spin(60, device=rank)       # RANK1: busy elsewhere, never issues it
    torch.cuda.synchronize()
'''


def _two_gpus():
    needs("torch")
    from cuda_debug import _core, _libraries
    _libraries.ensure(_libraries.CUDA)
    rc, n = _core.device_count()
    if rc or n < 2:
        pytest.skip("needs 2 GPUs (%d here)" % n)


def _end_torchrun(live):
    """SIGTERM to torchrun (it ends its workers), then SIGKILL to every
    worker named by a report ("dump PID") and to the process group."""
    if live.proc.poll() is None:
        live.proc.send_signal(signal.SIGTERM)
        try:
            live.proc.wait(20)
        except Exception:
            pass
    for pid in set(re.findall(r"cuda_debug dump (\d+)", live.text())):
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    live.kill()


def test_the_rank_that_never_issued_the_all_reduce_is_visible():
    _two_gpus()
    with Live(TWO_RANKS, launcher=["-m", "torch.distributed.run", "--standalone",
                                   "--nproc_per_node", "2"]) as live:
        try:
            live.wait_for("rank 0 ready", name="stdout", timeout=120)
            live.wait_for("rank 1 ready", name="stdout", timeout=30)
            live.wait_for("[rank 0] " + HEADLINE, timeout=30)
            live.wait_for("[rank 1] " + HEADLINE, timeout=30)
            time.sleep(1.0)                                   # the rest of both blocks
            agent = cli("dump", str(live.pid), timeout=60)   # torchrun's own pid
        finally:
            _end_torchrun(live)
        err = live.text()
        r0 = [l for l in err.splitlines() if l.startswith("[rank 0] ")]
        r1 = [l for l in err.splitlines() if l.startswith("[rank 1] ")]
        assert any(re.match(r"\[rank 0\]   all_reduce \(.*\) on stream 0x[0-9a-f]+, device 0: "
                            r"unfinished for ", l) for l in r0), err[-4000:]
        assert "[rank 0]     launched at %s:%d in <module>" % (
            live.script, live.line_of("# RANK0")) in r0, err[-4000:]
        assert any(l.startswith("[rank 1]   spin on stream 0x0, device 1: unfinished for ")
                   for l in r1), err[-4000:]
        assert "[rank 1]     launched at %s:%d in <module>" % (
            live.script, live.line_of("# RANK1")) in r1, err[-4000:]
        assert not any("all_reduce" in l for l in r1), err[-4000:]   # rank 1 never issued it
        assert agent.returncode == 0, agent
        verdict = agent.stdout.splitlines()[-1]
        assert verdict.startswith("verdict: rank 1 stalls the job: rank 1 in spin at %s:%d" % (
            live.script, live.line_of("# RANK1"))), agent.stdout
        assert "while rank 0 waits in all_reduce (rank 0 at %s:%d)" % (
            live.script, live.line_of("# RANK0")) in verdict, agent.stdout
