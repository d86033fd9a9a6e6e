"""Forked children start with cuda_debug usable, on the fake driver: CPU only.

fork() copies the parent's memory and only the thread that forked. A child
(multiprocessing's "fork" start method, a DataLoader worker, os.fork) starts
with cuda_debug's state defined by csrc/hooks/after_fork.c: every lock free,
no scope or watch() open, no hang watcher thread (the next watch(hang_after=)
starts one), and nothing of the parent's ever reported as the child's (its
launches, faults, assert lines, the written-once flags of the reports and of
torchrun's error file). Each child runs under a deadline: a hang is a failure.
"""
import json
import signal
import textwrap

from conftest import run_no_hang as run

# In the child scripts: a fork child that exits with what it found, and a
# parent that waits for it with a deadline (a hang is reported, not waited for).
HELPERS = '''
import json, os, signal, sys, time, multiprocessing as mp
import cuda_debug
from cuda_debug import _core
L = (1, 1, 1, 32, 1, 1)

def waited(p, seconds=20):
    p.join(seconds)
    if p.is_alive():
        p.kill()
        p.join()
        return "hung"
    return p.exitcode
'''


def script(code):
    return HELPERS + textwrap.dedent(code)


def test_a_fork_child_entering_watch_with_hang_after_does_not_hang(fake_child):
    """The parent's hang watcher waits on its condition variable; six fork
    children each enter watch(hang_after=...) (a DataLoader worker running a
    watched function): before, each blocked for good in pthread_cond_signal
    (6 of 6). The child starts unwatched, with hang_after 0, and gets a
    watcher thread of its own."""
    c = run(fake_child, script('''
        def child(q):
            out = dict(watching=cuda_debug.is_watching(), hang=_core.hang_state()[0],
                       stats_watching=_core.stats()["watching"])
            with cuda_debug.watch(hang_after=2):
                out["inside"] = [cuda_debug.is_watching(), _core.hang_state()[0]]
                fake.fake_launch(b"child_kernel", 0, *L)
                fake.fake_ctx_sync()
            out["after"] = [cuda_debug.is_watching(), _core.hang_state()[0]]
            q.put(out)

        ctx = mp.get_context("fork")
        exits, seen = [], []

        def fork_children(n):
            for i in range(n):
                q = ctx.Queue()
                p = ctx.Process(target=child, args=(q,))
                p.start()
                exits.append(waited(p))
                seen.append(q.get(timeout=1) if exits[-1] == 0 else None)

        with cuda_debug.watch(hang_after=1):          # the watcher thread starts here
            fake.fake_launch(b"parent_kernel", 0, *L)
            fake.fake_ctx_sync()
            fork_children(3)                          # it waits, for a step of 50 ms
            parent_hang = _core.hang_state()[0]
        time.sleep(0.2)
        fork_children(3)                              # it waits, for the next watch()
        report(dict(exits=exits, seen=seen, parent_hang=parent_hang))
    '''), timeout=240)
    r = c.result
    assert r is not None, c
    assert r["exits"] == [0] * 6, (r["exits"], c.stderr[-3000:])
    for s in r["seen"]:
        # forked inside the parent's watch(hang_after=1), or after it: not
        # watching, hang_after 0
        assert s == {"watching": False, "hang": 0, "stats_watching": 0,
                     "inside": [True, 2 * 10 ** 9], "after": [False, 0]}, s
    assert r["parent_hang"] == 10 ** 9, r       # the parent's own watch is left alone


def test_a_fork_while_another_thread_holds_every_lock(fake_child, tmp_path):
    """A thread of the parent holds every lock the child handler resets (the
    scope lock, the contexts', the string arena's, loc_lock, ctx_lock,
    graph_lock, exec_lock, the tee's, the driver log's, fault_lock, the report
    lock, the hang watcher's, the benchmarks', the replay's; _core._test_fork_hold) while
    the main thread forks. The child then takes each of them: a watch with a
    hang watcher, new kernel names and code locations, a new context entry, a
    graph captured and instantiated, a fault in a scope (its record, its assert
    lines through the tee, the driver log), check() of device 0, the dump
    signal, the benchmarks' buffers, the replay's status. Before, the first of them spun or
    blocked for good."""
    out_file = tmp_path / "child.json"
    c = run(fake_child, script('''
        import ctypes

        def child_body():
            out = {}
            s = fake.fake_stream_create()
            with cuda_debug.watch(hang_after=5):                  # sub_lock, the watcher's
                fake.fake_launch(b"kernel_named_in_the_child", s, *L)   # intern, loc, ctx
                fake.fake_begin_capture(s)                         # graph_lock
                fake.fake_launch(b"captured_in_the_child", s, *L)
                g = ctypes.c_size_t()
                fake.fake_end_capture(s, ctypes.byref(g))          # exec_lock (instantiated)
                fake.fake_graph_launch(g.value, s)
                fake.fake_stream_sync(s)
                os.kill(os.getpid(), signal.SIGUSR1)               # the report lock
            out["check"] = cuda_debug.check(0)                     # retain_lock
            out["release"] = _core.bench_release(0)                # bench_lock
            out["replay"] = _core.replay_status()[0]               # the replay's locks
            fake.fake_set_kernel(b"child_assert", 710, -1, b"cond_of_the_child", -1, 0)
            try:
                with cuda_debug.launch_blocking():                 # fault_lock, tee, log
                    fake.fake_launch(b"child_assert", 0, *L)
            except cuda_debug.DeviceAssertError as e:
                out["fault"] = [e.kernel, e.device_message]
            return out

        def child_main():
            import faulthandler
            faulthandler.dump_traceback_later(25, exit=False)   # where it hangs, if it does
            signal.alarm(30)                    # a hang: the child dies of SIGALRM
            try:
                out = child_body()
            except BaseException as e:
                out = {"error": repr(e)}
            with open(sys.argv[1], "w") as f:
                json.dump(out, f)
            os._exit(0)

        with cuda_debug.launch_blocking():        # the tee, the driver log, a context
            fake.fake_launch(b"parent_blocking", 0, *L)
        with cuda_debug.watch(hang_after=1):     # forked inside the parent's watch
            fake.fake_launch(b"parent_kernel", 0, *L)
            _core._test_fork_hold(True)
            pid = os.fork()
            if pid == 0:
                child_main()
            _core._test_fork_hold(False)
        _, status = os.waitpid(pid, 0)
        got = None
        if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
            with open(sys.argv[1]) as f:
                got = json.load(f)
        report(dict(signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None, child=got))
    '''), args=[str(out_file)], timeout=120)
    r = c.result
    assert r is not None, c
    assert r["signal"] is None, (r, c.stderr[-3000:])      # SIGALRM: the child hung
    got = r["child"]
    assert got and "error" not in got, (got, c.stderr[-3000:])
    assert got["check"] is None and isinstance(got["release"], int), got
    assert got["replay"] == 0, got             # no launches instrumented in the child
    assert got["fault"][0] == "child_assert", got
    assert "cond_of_the_child" in got["fault"][1], got
    assert "cuda_debug (watch): SIGUSR1 (pid" in c.stderr, c.stderr[-3000:]


def test_a_child_terminated_while_the_parent_watches_writes_nothing(fake_child, tmp_path):
    """The parent watches, with a launch unfinished (the fake runs it only
    when its stream is synchronised) and TORCHELASTIC_ERROR_FILE set; a fork
    child that never watched is stopped by terminate() (SIGTERM). Before, the
    child wrote "SIGTERM while watching ... culprit: parent_kernel" about the
    parent's launch, and torchrun's error file: a false root cause. Now it
    writes nothing and dies of the SIGTERM."""
    err_file = tmp_path / "error.json"
    c = run(fake_child, script('''
        def child():
            time.sleep(60)

        ctx = mp.get_context("fork")
        with cuda_debug.watch():
            fake.fake_launch(b"parent_kernel", 0, *L)    # unfinished while the child lives
            p = ctx.Process(target=child)
            p.start()
            time.sleep(0.5)
            p.terminate()
            code = waited(p)
            print("CHILD GONE", flush=True)
            in_flight = [f.kernel for f in cuda_debug.in_flight()]
        report(dict(code=code, file=os.path.exists(os.environ["TORCHELASTIC_ERROR_FILE"]),
                    parent_in_flight=in_flight))
    '''), env={"TORCHELASTIC_ERROR_FILE": str(err_file),
              "CUDA_DEBUG_WATCH_EXACT": "1"})   # the parent's launch has a marker of its own
    r = c.result
    assert r is not None, c
    assert r["code"] == -signal.SIGTERM, r
    assert r["file"] is False, (r, err_file.read_text() if err_file.exists() else None)
    assert "parent_kernel" not in c.stderr and "cuda_debug (watch)" not in c.stderr, c.stderr
    assert r["parent_in_flight"] == ["parent_kernel"], r    # the parent's own view is intact


def test_a_watching_child_reports_its_own_launches_never_the_parents(fake_child, tmp_path):
    """Forked while the parent watches with a launch unfinished and after a
    fault the parent recorded: in the child, last_error() is None, in_flight()
    empty; its own watch() records its own launches, and its dump signal and
    SIGTERM reports name only those (its own kernel, never parent_kernel)."""
    err_file = tmp_path / "error.json"
    c = run(fake_child, script('''
        import cuda_debug.testing as t

        def child(q):
            out = dict(last_error=repr(cuda_debug.last_error()),
                       in_flight=[f.kernel for f in cuda_debug.in_flight()])
            with cuda_debug.watch():
                fake.fake_launch(b"child_kernel", 0, *L)          # unfinished
                out["own"] = [f.kernel for f in cuda_debug.in_flight()]
                os.kill(os.getpid(), signal.SIGUSR1)              # the dump report
                time.sleep(0.2)
                q.put(out)
                time.sleep(60)                                    # SIGTERM comes here

        try:
            with cuda_debug.launch_blocking():
                t.device_assert()                                 # a fault of the parent's
        except cuda_debug.DeviceAssertError:
            pass
        fake.fake_reset()                                         # the context alive again
        parent_last = type(cuda_debug.last_error()).__name__
        ctx = mp.get_context("fork")
        with cuda_debug.watch():
            fake.fake_launch(b"parent_kernel", 0, *L)             # unfinished
            q = ctx.Queue()
            p = ctx.Process(target=child, args=(q,))
            p.start()
            seen = q.get(timeout=20)
            p.terminate()
            code = waited(p)
        report(dict(seen=seen, code=code, parent_last=parent_last,
                    file=json.load(open(os.environ["TORCHELASTIC_ERROR_FILE"]))
                    if os.path.exists(os.environ["TORCHELASTIC_ERROR_FILE"]) else None))
    '''), env={"TORCHELASTIC_ERROR_FILE": str(err_file),
              "CUDA_DEBUG_WATCH_EXACT": "1"})   # unfinished launches with markers of their own
    r = c.result
    assert r is not None, c
    assert r["parent_last"] == "DeviceAssertError", r
    assert r["seen"] == {"last_error": "None", "in_flight": [], "own": ["child_kernel"]}, r
    assert r["code"] == -signal.SIGTERM, r
    dump = c.stderr[c.stderr.index("cuda_debug (watch): SIGUSR1"):]
    assert "child_kernel" in dump.split("cuda_debug (watch): SIGTERM")[0], c.stderr
    term = c.stderr[c.stderr.index("cuda_debug (watch): SIGTERM while watching"):]
    assert "child_kernel" in term, c.stderr
    assert "parent_kernel" not in c.stderr, c.stderr
    # the child died of the SIGTERM: torchrun's file says what the child watched
    assert r["file"] is not None and "child_kernel" in r["file"]["message"]["extraInfo"][
        "py_callstack"], r
    assert "parent_kernel" not in json.dumps(r["file"]), r
