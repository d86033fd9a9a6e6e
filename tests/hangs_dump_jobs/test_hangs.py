"""Hangs on the fake driver (CPU, CI): watch(hang_after=s) reports a stuck
launch once and the process lives on; the dump signal (SIGUSR1) asks for the
same report, also while the main thread is blocked in a synchronize
(``python -m cuda_debug dump PID``: tests/hangs_dump_jobs/test_dump.py); NCCL launches are
named by their collective; ``cuda_debug.in_flight()`` returns the report's fields.

The fake's ``fake_set_async(1)`` runs each stream's kernels on a thread of
their own, and ``cuda_debug.testing.spin(s)`` keeps one busy for s seconds.

On a real GPU: the tests at the end of this module (marked gpu).
"""
import signal

import pytest

from helpers.cli import cli
import json
import os
import re
import time
from conftest import Live, needs

#: The tests of what each launch's own marker tells (queue depths, one stream's
#: oldest unfinished launch): watch(exact=True)'s per-launch markers.
EXACT = {"CUDA_DEBUG_WATCH_EXACT": "1"}
HEADLINE = "cuda_debug (watch): possible hang"


def test_a_spinning_kernel_is_reported_once_within_seconds_and_the_process_lives(fake_live):
    with fake_live('''
        import time, cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        with cuda_debug.watch(hang_after=1):
            t.spin(4)                                  # SPIN
            print("LAUNCHED %.3f" % time.monotonic(), flush=True)
            cuda_debug.check()                         # the host waits
        print("ALIVE", flush=True)
    ''', env={"RANK": "2"}) as live:
        _, launched = live.wait_for("LAUNCHED", name="stdout")
        t_report, _ = live.wait_for(HEADLINE)
        assert live.finish() == 0, live
        assert t_report - float(launched.split()[1]) < 3.0, live      # hang_after + a step
        assert "ALIVE" in live.text("stdout"), live
        err = live.text()
        assert err.count(HEADLINE) == 1, err           # not again every step
        block = err[err.index("[rank 2] " + HEADLINE):].splitlines()
        assert all(line.startswith("[rank 2] ") for line in block), block
        assert "  spin on stream 0x0, device 0: unfinished for " in block[2], block
        assert "0 launches queued behind it (launch #1, thread" in block[2], block
        assert block[3] == "[rank 2]     launched at %s:%d in <module>" % (
            live.script, live.line_of("# SPIN")), block
        assert "The process goes on" in block[4] and "cuda_debug dump %d" % live.pid in block[4]


def test_queue_depth_and_a_later_stuck_launch_reports_again(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        with cuda_debug.watch(hang_after=1):
            t.spin(3)                              # FIRST
            for _ in range(3):
                t.empty()                          # queued behind the spin
            rec = cuda_debug.in_flight()
            cuda_debug.check()
            after = cuda_debug.in_flight()
            t.spin(3)                              # SECOND
            cuda_debug.check()
        report(dict(n=len(rec), short=rec[0].short, depth=rec[0].queue_depth, seq=rec[0].seq,
                    line=rec[0].lineno, fn=rec[0].function, thread=rec[0].thread_name,
                    collective=rec[0].collective, graph=rec[0].graph, after=len(after),
                    age=rec[0].age_s))
    ''', env=EXACT)
    assert c.returncode == 0, c
    r = c.result
    assert (r["n"], r["short"], r["depth"], r["seq"], r["line"], r["fn"], r["thread"]) == \
        (1, "spin", 3, 1, c.line_of("# FIRST"), "<module>", "MainThread"), r
    assert r["collective"] is None and r["graph"] is False and r["after"] == 0, r
    assert 0 <= r["age"] < 1.0, r
    assert c.stderr.count(HEADLINE) == 2, c.stderr
    first, second = c.stderr.split(HEADLINE)[1:]
    assert "3 launches queued behind it (launch #1," in first, first
    assert "launched at %s:%d" % (c.script, c.line_of("# FIRST")) in first, first
    assert "0 launches queued behind it (launch #5," in second, second
    assert "launched at %s:%d" % (c.script, c.line_of("# SECOND")) in second, second


def test_a_long_kernel_on_a_side_stream_is_no_hang_while_the_program_launches(fake_child):
    # The documented rule: the stuck launch must have launches queued behind it
    # on its stream, or the host must have stopped launching (it waits).
    c = fake_child('''
        import time, cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        side = fake.fake_stream_create()
        with cuda_debug.watch(hang_after=1.5):
            t.spin(4, stream=side)                 # SIDE
            t0 = time.monotonic()
            seen = None
            while time.monotonic() - t0 < 3.5:     # the program goes on on its own stream
                t.empty()
                time.sleep(0.05)
                if seen is None and time.monotonic() - t0 > 2.5:
                    seen = [(r.short, r.queue_depth, r.stream == side, round(r.age_s))
                            for r in cuda_debug.in_flight()]
            fake.fake_stream_sync(side)
        report(dict(seen=seen))
    ''', env=EXACT)
    assert c.returncode == 0, c
    assert c.result == {"seen": [["spin", 0, True, 3]]}, c
    assert HEADLINE not in c.stderr, c.stderr


def test_sigusr1_is_answered_while_the_main_thread_is_blocked_in_a_synchronize(fake_child):
    c = fake_child('''
        import os, signal, threading, time, cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        main = threading.get_ident()

        def poke():
            time.sleep(1.0)
            signal.pthread_kill(main, signal.SIGUSR1)     # lands in the main thread's wait

        with cuda_debug.watch():
            t.spin(3)                                    # SPIN
            threading.Thread(target=poke).start()
            cuda_debug.check()                           # blocked in cuCtxSynchronize
        report(dict(alive=True))
    ''')
    assert c.result == {"alive": True}, c
    head = "cuda_debug (watch): SIGUSR1 (pid "
    assert c.stderr.count(head) == 1, c.stderr
    block = c.stderr[c.stderr.index(head):]
    assert "  spin on stream 0x0, device 0: unfinished for 1." in block, block
    assert "launched at %s:%d in <module>" % (c.script, c.line_of("# SPIN")) in block, block
    assert "possible hang" not in c.stderr       # no hang_after: no watcher


@pytest.mark.parametrize("order", ["before", "after"])
def test_a_python_handler_for_the_dump_signal_keeps_running(fake_child, order):
    c = fake_child('''
        import os, signal, time, cuda_debug, cuda_debug.testing as t
        seen = []
        handler = lambda s, f: seen.append(s)
        if %r == "before":
            signal.signal(signal.SIGUSR1, handler)          # the program's own, first
        with cuda_debug.watch():
            if %r == "after":
                signal.signal(signal.SIGUSR1, handler)      # replaces cuda_debug's...
            with cuda_debug.watch():                        # ...which comes back, chained
                t.spin(5)
                os.kill(os.getpid(), signal.SIGUSR1)
                for _ in range(200):
                    if seen:
                        break
                    time.sleep(0.01)
        report(dict(seen=seen))
    ''' % (order, order))
    assert c.result == {"seen": [int(signal.SIGUSR1)]}, c
    assert c.stderr.count("cuda_debug (watch): SIGUSR1 (pid ") == 1, c.stderr


@pytest.mark.parametrize("setting, caught", [("SIGUSR2", ["USR2"]), ("off", [])])
def test_the_dump_signal_is_configurable(fake_child, setting, caught):
    c = fake_child('''
        import os, signal, time, cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        with cuda_debug.watch():
            t.spin(0.1)
        with open("/proc/self/status") as f:
            mask = int([l for l in f if l.startswith("SigCgt:")][0].split()[1], 16)
        caught = [n for n in ("USR1", "USR2") if mask >> (getattr(signal, "SIG" + n) - 1) & 1]
        if caught:
            os.kill(os.getpid(), getattr(signal, "SIG" + caught[0]))
        report(dict(caught=caught, installed=_core.hang_state()[2]))
    ''', env={"CUDA_DEBUG_DUMP_SIGNAL": setting})
    installed = int(getattr(signal, "SIG" + caught[0])) if caught else 0
    assert c.result == {"caught": caught, "installed": installed}, c
    assert ("cuda_debug (watch): SIG%s (pid" % caught[0] in c.stderr) if caught else \
        "cuda_debug (watch)" not in c.stderr, c.stderr


NCCL = {
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL": "all_reduce",
    "_Z%dncclDevKernel_ReduceScatter_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE"
    % len("ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"): "reduce_scatter",
    "ncclKernel_AllGather_RING_LL_Sum_int8_t": "all_gather",
    "ncclDevKernel_Broadcast_RING_LL": "broadcast",
    "ncclDevKernel_Reduce_Sum_f32_RING_LL": "reduce",
    "ncclDevKernel_SendRecv": "send/recv",
    "ncclDevKernel_Generic_4": "collective",
    "my_reduce_kernel": None,
}


def test_nccl_launches_are_named_by_their_collective_and_the_line_that_issued_them(fake_child,
                                                                                    tmp_path):
    # torch.distributed's own function names the collective when it is on the
    # stack (NCCL's generic kernels name none); a library file, as in site-packages.
    c10d = tmp_path / "site-packages" / "torch" / "distributed" / "distributed_c10d.py"
    c10d.parent.mkdir(parents=True)
    c10d.write_text("def all_gather_into_tensor(fake, stream):\n"
                    "    fake.fake_launch(b'ncclDevKernel_Generic', stream, 1, 1, 1, 64, 1, 1)\n")
    c = fake_child('''
        import importlib.util, os, signal, time, cuda_debug
        spec = importlib.util.spec_from_file_location("c10d", %r)
        c10d = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(c10d)
        names = %r
        with cuda_debug.watch():                  # not async: nothing runs until a sync
            for name in names:
                fake.fake_launch(name.encode(), fake.fake_stream_create(), 1, 1, 1, 64, 1, 1)  # EACH
            c10d.all_gather_into_tensor(fake, fake.fake_stream_create())   # ISSUE
            recs = cuda_debug.in_flight()
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.2)
        report([(r.short, r.collective, r.lineno) for r in recs])
    ''' % (str(c10d), list(NCCL)), env=EXACT)
    each, issue = c.line_of("# EACH"), c.line_of("# ISSUE")
    got = c.result
    assert [(v, line) for _, v, line in got] == \
        [(v, each) for v in NCCL.values()] + [("all_gather_into_tensor", issue)], (got, c)
    assert got[1][0] == "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL", got      # demangled
    assert got[-1][0] == "ncclDevKernel_Generic", got
    err = c.stderr
    assert "  all_reduce (ncclDevKernel_AllReduce_Sum_f32_RING_LL) on stream 0x" in err, err
    assert "  all_gather_into_tensor (ncclDevKernel_Generic) on stream 0x" in err, err
    assert "    launched at %s:%d in <module>" % (c.script, issue) in err, err
    assert "  my_reduce_kernel on stream 0x" in err, err


def test_run_hang_after(fake_child, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("import cuda_debug, cuda_debug.testing as t\n"
                      "t.spin(2.5)\n"
                      "cuda_debug.check()\n"
                      "print('DONE')\n")
    c = fake_child('''
        fake.fake_set_async(1)
        from cuda_debug import _cli
        sys.exit(_cli.main(["run", "--hang-after", "1", %r]))
    ''' % str(script))
    assert c.returncode == 0 and "DONE" in c.stdout, c
    assert c.stderr.count(HEADLINE + ": a launch unfinished for longer than hang_after=1.0 s") \
        == 1, c.stderr
    assert "launched at %s:2 in <module>" % script in c.stderr, c.stderr


@pytest.mark.parametrize("args, message", [
    (["--hang-after"], "--hang-after takes a number of seconds > 0"),
    (["--hang-after", "soon"], "--hang-after takes a number of seconds > 0"),
    (["--hang-after", "-3"], "--hang-after takes a number of seconds > 0"),
    (["--hang-after", "1e-12"], "--hang-after 1e-12: 1e-12 s is below 0.1 s, the shortest the "
                                "hang watcher honours (it looks at the launches every 50 ms at "
                                "the shortest); 0 turns it off"),
    (["--hang-after", "0.05"], "--hang-after 0.05: 0.05 s is below 0.1 s"),
    (["--hang-after", "5", "--no-watch"], "--hang-after goes with watching (not with --no-watch)"),
    (["--launch-blocking", "--hang-after", "5"], "(not with --launch-blocking)"),
])
def test_run_hang_after_usage_errors(tmp_path, args, message):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    p = cli("run", *(args + [str(script)]))
    assert p.returncode == 2 and message in p.stderr and "ran" not in p.stdout, p


def test_the_environment_sets_hang_after_and_watch_checks_it(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        errors = []
        for bad in ("soon", -1, True):
            try:
                cuda_debug.watch(hang_after=bad)
            except (TypeError, ValueError) as e:
                errors.append(type(e).__name__)
        w = cuda_debug.watch()
        off = cuda_debug.watch(hang_after=0)
        with w:
            t.spin(2.5)
            cuda_debug.check()
        report(dict(errors=errors, repr=repr(w), off=off.hang_after))
    ''', env={"CUDA_DEBUG_HANG_AFTER": "1"})
    assert c.result == {"errors": ["TypeError", "ValueError", "TypeError"],
                        "repr": "cuda_debug.watch(hang_after=1)", "off": None}, c
    assert c.stderr.count(HEADLINE) == 1, c.stderr


def test_a_bad_hang_after_in_the_environment_is_warned_about(fake_child):
    c = fake_child('''
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import cuda_debug._options as o
        report(dict(value=o.OPTIONS.hang_after, warned=[str(x.message) for x in w]))
    ''', env={"CUDA_DEBUG_HANG_AFTER": "ten"})
    assert c.result["value"] is None, c
    assert any("CUDA_DEBUG_HANG_AFTER='ten'" in m for m in c.result["warned"]), c


def test_faulthandler_chained_both_ways_runs_each_handler_once(fake_child):
    # faulthandler.register(chain=True) replaces cuda_debug's handler and calls it
    # after its own; the next watch() re-installs cuda_debug's, chained to
    # faulthandler's: each runs once, no endless round.
    c = fake_child('''
        import faulthandler, os, signal, time, cuda_debug, cuda_debug.testing as t
        with cuda_debug.watch():
            faulthandler.register(signal.SIGUSR1, chain=True)
            with cuda_debug.watch():
                t.spin(5)
                os.kill(os.getpid(), signal.SIGUSR1)
                time.sleep(0.2)
        report(dict(alive=True))
    ''')
    assert c.result == {"alive": True}, c
    assert c.stderr.count("cuda_debug (watch): SIGUSR1 (pid ") == 1, c.stderr
    assert c.stderr.count("Current thread") == 1, c.stderr      # faulthandler's stack


def test_more_streams_than_the_report_holds_are_counted(fake_child):
    c = fake_child('''
        import os, signal, time, cuda_debug
        with cuda_debug.watch():                  # not async: nothing runs until a sync
            for _ in range(70):
                fake.fake_launch(b"k", fake.fake_stream_create(), 1, 1, 1, 32, 1, 1)
            n = len(cuda_debug.in_flight())
            os.kill(os.getpid(), signal.SIGUSR1)
            time.sleep(0.2)
        report(dict(n=n))
    ''', env=EXACT)
    assert c.result == {"n": 64}, c
    assert c.stderr.count("  k on stream 0x") == 32, c.stderr
    assert "  and 32 more streams\n" in c.stderr, c.stderr
    assert "  and 6 unfinished launches on streams beyond the 64 followed\n" in c.stderr, c.stderr


@pytest.mark.parametrize("value", [1e-12, 1e-9, 0.01, 0.0999])
def test_a_hang_after_shorter_than_the_watcher_honours_is_refused(value):
    """watch(hang_after=1e-12) is not rounded to 0 ns (which means off: silently
    no hang report). Below 0.1 s (two of the
    watcher's shortest steps) it is refused, saying why; 0.1 is taken."""
    import cuda_debug
    with pytest.raises(ValueError) as e:
        cuda_debug.watch(hang_after=value)
    assert str(e.value) == ("watch(hang_after=%r): %g s is below 0.1 s, the shortest the hang "
                            "watcher honours (it looks at the launches every 50 ms at the "
                            "shortest); 0 turns it off" % (value, value)), e.value
    assert cuda_debug.watch(hang_after=0.1).hang_after == 0.1


def test_the_shortest_hang_after_is_two_of_the_watchers_steps():
    from cuda_debug import _core, _options
    assert _options.HANG_AFTER_MIN == 2 * _core.HANG_STEP_MIN_NS / 1e9
    with pytest.raises(ValueError):             # C: never 0 (off) by rounding
        _core.set_hang_after(1e-12)


def test_a_hang_after_too_short_in_the_environment_is_refused(fake_child):
    c = fake_child('''
        import warnings
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            import cuda_debug._options as o
        report(dict(value=o.OPTIONS.hang_after, warned=[str(x.message) for x in w]))
    ''', env={"CUDA_DEBUG_HANG_AFTER": "1e-12"})
    assert c.result["value"] is None, c
    assert "cuda_debug: CUDA_DEBUG_HANG_AFTER='1e-12' refused: 1e-12 s is below 0.1 s, the " \
           "shortest the hang watcher honours (it looks at the launches every 50 ms at the " \
           "shortest); 0 turns it off; the hang report is off" in c.result["warned"], c


def test_hang_after_with_warps_looks_where_the_warps_are_below_the_report(fake_live, tmp_path):
    """watch(hang_after=1) with CUDA_DEBUG_WARPS=1: after the hang report, a
    thread of the process has its cuda-gdb look twice (here a stand-in that
    prints two real H100 looks at a barrier kernel, without the instruction
    cuda-gdb disassembles) and writes where the warps
    are below it; the process goes on and finishes. Without the setting, no look."""
    import os
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "kernel_lines")
    gdb = tmp_path / "cuda-gdb"
    gdb.write_text('#!/bin/sh\nn=$(cat "$0.count" 2>/dev/null || echo 0)\n'
                   'echo $((n + 1)) > "$0.count"\n'
                   'if [ "$n" = 0 ]; then cat %s; else cat %s; fi\n'
                   % (os.path.join(here, "cuda_gdb_barrier_look1.txt"),
                      os.path.join(here, "cuda_gdb_barrier_look2.txt")))
    gdb.chmod(0o755)
    code = '''
        import cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        with cuda_debug.watch(hang_after=1):
            t.spin(4)                                  # SPIN
            cuda_debug.check()                         # the host waits
        print("ALIVE", flush=True)
    '''
    env = {"CUDA_DEBUG_CUDA_GDB": str(gdb)}
    with fake_live(code, env=dict(env, CUDA_DEBUG_WARPS="1")) as live:
        live.wait_for(HEADLINE)
        live.wait_for("cuda_debug: where the stuck kernel's warps are")
        assert live.finish() == 0, live
        err = live.text()
        after = err[err.index("cuda_debug: where the stuck kernel's warps are"):]
        assert "4 warps (128 threads) spinning at " in after and ".cu:7 in barrier_wait" in after, after
        assert ".cu:12 in barrier_wait" in after, after            # the others, stopped
        assert err.index(HEADLINE) < err.index("where the stuck kernel's warps are"), err
        assert "ALIVE" in live.text("stdout"), live
    with fake_live(code, env=env) as live:
        live.wait_for(HEADLINE)
        assert live.finish() == 0, live
        assert "warps are" not in live.text(), live
        assert not (tmp_path / "cuda-gdb.count").exists() or \
            (tmp_path / "cuda-gdb.count").read_text().strip() == "2"


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# Hangs on a real GPU: a spinning kernel reported by
# watch(hang_after) while the process lives on; ``dump PID`` on a process
# waiting in torch.cuda.synchronize(); two ranks under torchrun, one of which
# never issues the all_reduce the other waits in.
#
# Every child runs with hard deadlines (conftest.Live) and its process group is
# killed on the way out, whatever happened.
# ======================================================================================


HEADLINE = "cuda_debug (watch): possible hang"


@pytest.mark.gpu
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


@pytest.mark.gpu
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


@pytest.mark.gpu
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
