"""Never crash the host, never lose the report, against the fake
CUDA driver, each in a child with a timeout.

Each guards a defect that a sanitizer review found (each test failed before
its fix; the daemon-thread one under the AddressSanitizer build of .ci/run):

- a daemon thread launching while the interpreter shuts down: its thread state
  was read after the finalizer freed it (frames are read no more once the
  interpreter's atexit hooks ran);
- the native op walk unwinding into a stale frame chain (greenlet, a fiber's
  stack): it crashed before the fault's report was written (now the report
  comes first, and the walk stays on the thread's own stack, below Python);
- replacing libc's `stderr` broke freopen, fileno, isatty, dup2 and
  Py_FatalError's output (now only libcuda's own reference to `stderr` is
  pointed at the tee);
- code objects freed and their addresses reused: launches were recorded at an
  old code object's line (now evicted or checked by content); the kernel-name
  cache had the same problem with a module reloaded at the same address.

On a real GPU: the tests at the end of this module (marked gpu).
"""
import os
import pty
import re
import select
import subprocess
import sys
import textwrap

import pytest

from conftest import ROOT, run_no_hang as run




# -- interpreter shutdown -------------------------------------------------------------

def test_daemon_thread_launching_through_interpreter_shutdown(fake_child):
    """A daemon thread launches (under watch(), so every launch reads its
    frames) in a loop that never returns to Python while the main thread
    exits: the interpreter frees the daemon's thread state meanwhile, and the
    frame reader must not touch it (ASan: heap-use-after-free in the frame
    walk, before the fix)."""
    for attempt in range(3):
        c = run(fake_child, '''
            import threading, time
            import cuda_debug
            from cuda_debug import _core
            fake.fake_set_kernel(b"busy", 0, 0, None, 0, 0)
            started = threading.Event()

            def loop():
                started.set()
                while True:
                    fake.fake_launch_loop(b"busy", 20)      # LAUNCH

            w = cuda_debug.watch()
            w.__enter__()                                   # open through the shutdown
            threading.Thread(target=loop, daemon=True).start()
            started.wait()
            time.sleep(0.05)
            report(dict(watched=_core.stats()["watched"]))
        ''')
        assert c.returncode == 0, c
        assert c.result and c.result["watched"] > 0, c


# -- the native op walk ---------------------------------------------------------------

def _stale_frames_supported():
    import platform
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the fake's stale-frame trampoline is x86-64 assembly")


def test_fault_on_a_fiber_stack_is_reported_and_does_not_crash(fake_child):
    """A kernel launched (from inside ATen ops) on a stack of a fiber's own,
    whose base frame is stale, faults in a scope: the report is written, the
    exception raised, and the native stack is not walked (off the thread's own
    stack nothing bounds the walk); before the fix the walk crashed in the
    unwinder before any report."""
    _stale_frames_supported()
    c = run(fake_child, '''
        import cuda_debug
        fake.fake_set_kernel(b"indexSelectSmallIndex", 710, 1, b"fiber_cond", -1, 0)
        try:
            with cuda_debug.launch_blocking():
                rc = fake.fake_launch_on_fiber(b"indexSelectSmallIndex")
        except cuda_debug.DeviceAssertError as e:
            report(dict(kernel=e.kernel, op_stack=e.op_stack, msg=e.device_message))
    ''')
    assert c.returncode == 0, c
    assert c.result is not None, c
    assert c.result["kernel"] == "indexSelectSmallIndex"
    assert "fiber_cond" in c.result["msg"]
    assert c.result["op_stack"] is None, c.result      # not walked
    assert "cuda_debug: device-side assert (CUDA_ERROR_ASSERT) in indexSelectSmallIndex" in c.stderr


def test_fault_below_a_stale_frame_chain_keeps_its_ops_and_does_not_crash(fake_child):
    """Python code run by C below a stale frame chain on the thread's own
    stack (what greenlet does) launches from inside ATen ops and faults: the
    walk stops at the Python interpreter, so it finds the ops and never
    unwinds into the stale frames (which crashed it before)."""
    _stale_frames_supported()
    c = run(fake_child, '''
        import ctypes
        import cuda_debug
        fake.fake_set_kernel(b"indexSelectSmallIndex", 710, 1, b"stale_cond", -1, 0)
        out = {}

        @ctypes.CFUNCTYPE(None)
        def below():
            try:
                with cuda_debug.launch_blocking():
                    fake.fake_aten_embedding(b"indexSelectSmallIndex")     # LAUNCH
            except cuda_debug.DeviceAssertError as e:
                out.update(kernel=e.kernel, op_stack=e.op_stack, lineno=e.lineno)

        out["rc"] = fake.fake_call_below_stale_frame(ctypes.cast(below, ctypes.c_void_p))
        report(out)
    ''')
    assert c.returncode == 0, c
    r = c.result
    assert r is not None and r["rc"] == 0, c
    assert r["op_stack"] == ["aten::embedding", "aten::index_select"], r
    assert r["lineno"] == c.line_of("# LAUNCH")


def test_fault_in_a_greenlet_does_not_crash(fake_child):
    """The same with a real greenlet started at one stack depth and resumed
    at another (its frames above the bootstrap are then stale: the unwinder
    crashed there, seen with Python 3.10)."""
    pytest.importorskip("greenlet")
    c = run(fake_child, '''
        import greenlet
        import cuda_debug
        fake.fake_set_kernel(b"indexSelectSmallIndex", 710, 1, b"greenlet_cond", -1, 0)
        main = greenlet.getcurrent()
        out = {}

        def body():
            main.switch()
            try:
                with cuda_debug.launch_blocking():
                    fake.fake_aten_embedding(b"indexSelectSmallIndex")
            except cuda_debug.DeviceAssertError as e:
                out.update(kernel=e.kernel, op_stack=e.op_stack)

        g = greenlet.greenlet(body)
        g.switch()

        def deeper(n):
            return deeper(n - 1) if n else g.switch()

        deeper(20)
        report(out)
    ''')
    assert c.returncode == 0, c
    assert c.result and c.result["op_stack"] == ["aten::embedding", "aten::index_select"], c


def test_report_comes_before_the_op_walk(fake_child):
    """The fault's block is on fd 2 before the native stack is walked: the ops
    follow in a line of their own, naming the thread of the block above."""
    c = run(fake_child, '''
        import cuda_debug
        fake.fake_set_kernel(b"indexSelectSmallIndex", 710, 1, b"order_cond", -1, 0)
        try:
            with cuda_debug.launch_blocking():
                fake.fake_aten_embedding(b"indexSelectSmallIndex")
        except cuda_debug.DeviceAssertError as e:
            report(dict(tid=int(e.thread.rsplit("tid ", 1)[1].rstrip(")"))))
    ''')
    assert c.result is not None, c
    err = c.stderr
    block = err.index("cuda_debug: device-side assert (CUDA_ERROR_ASSERT) in indexSelectSmallIndex")
    restart = err.index("The CUDA context is now unusable", block)
    ops = err.index("cuda_debug: op aten::embedding > aten::index_select", block)
    assert restart < ops, err
    assert "(the fault above, thread tid %d)" % c.result["tid"] in err[ops:].splitlines()[0]


# -- libc's stderr stays libc's --------------------------------------------------------

_AFTER_WATCH = '''
    import ctypes, os
    import cuda_debug, cuda_debug.testing as t
    from cuda_debug import _core
    libc = ctypes.CDLL(None, use_errno=True)
    libc.fileno.argtypes = [ctypes.c_void_p]
    libc.freopen.restype = ctypes.c_void_p
    libc.freopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_void_p]
    libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    libc.fflush.argtypes = [ctypes.c_void_p]
    stderr = lambda: ctypes.c_void_p.in_dll(libc, "stderr").value
    with cuda_debug.watch():
        t.empty()
    with cuda_debug.launch_blocking():
        t.empty()
    assert _core.stats()["stderr_tee"] == 1, _core.stats()["stderr_tee"]
'''


def test_the_tee_switch_is_set_before_the_first_scope_only(fake_child):
    """set_options(tee_stderr=False) (CUDA_DEBUG_CAPTURE=0): no stderr tee is
    installed when CUPTI is taken; the switches do not change while a scope
    holds CUPTI."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core, _options
        _options.apply()                          # the import-time switches, once
        _core.set_options(tee_stderr=False, profile=True)
        busy = None
        with cuda_debug.watch():
            t.empty()
            try:
                _core.set_options(tee_stderr=True)
            except RuntimeError as e:
                busy = str(e)
        st = _core.stats()
        report(dict(tee=st["stderr_tee"], busy=busy, ns_watch=st["ns_watch"],
                    watched=st["watched"]))
    ''')
    r = c.result
    assert r is not None, c
    assert r["tee"] == 0, r
    assert r["busy"] and "cannot change" in r["busy"], r
    assert r["watched"] >= 1 and r["ns_watch"] > 0, r      # profile=True took too


def test_fileno_of_stderr_is_2_after_a_scope(fake_child):
    c = run(fake_child, _AFTER_WATCH + '''
    report(dict(fileno=libc.fileno(stderr())))
    ''')
    assert c.result == {"fileno": 2}, c


def test_freopen_of_stderr_works_after_a_scope(fake_child, tmp_path):
    path = str(tmp_path / "err.txt")
    c = run(fake_child, _AFTER_WATCH + '''
    fp = libc.freopen(%r.encode(), b"w", stderr())
    libc.fputs(b"into the file\\n", stderr())
    libc.fflush(stderr())
    report(dict(ok=bool(fp), same=fp == stderr()))
    ''' % path)
    assert c.returncode == 0, c
    assert c.result == {"ok": True, "same": True}, c
    assert open(path).read() == "into the file\n"


def test_dup2_onto_fileno_of_stderr_works_after_a_scope(fake_child, tmp_path):
    path = str(tmp_path / "err.txt")
    c = run(fake_child, _AFTER_WATCH + '''
    fd = os.open(%r, os.O_WRONLY | os.O_CREAT)
    os.dup2(fd, libc.fileno(stderr()))
    libc.fputs(b"through fd 2\\n", stderr())
    libc.fflush(stderr())
    os.write(2, b"and os.write\\n")
    report(dict(done=1))
    ''' % path)
    assert c.result == {"done": 1}, c
    assert open(path).read() == "through fd 2\nand os.write\n"


def _run_on_a_tty(fake_cuda_dir, code, timeout=60):
    """Run `code` (with the fake prelude) with fd 2 on a pseudo-terminal:
    (returncode, stdout, what fd 2 got)."""
    from fake_cuda import PRELUDE, child_env
    import conftest
    source = conftest._PRELUDE + PRELUDE + textwrap.dedent(code)
    env = dict(os.environ)
    env.update(child_env(fake_cuda_dir))
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", source], stdout=subprocess.PIPE,
                         stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    got = b""
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            p.kill()
            pytest.fail("the child hung")
        try:
            chunk = os.read(master, 4096)
        except OSError:            # EIO: the child closed its end
            break
        if not chunk:
            break
        got += chunk
    out = p.communicate(timeout=timeout)[0].decode()
    os.close(master)
    return p.returncode, out, got.decode("utf-8", "replace")


def test_isatty_of_stderr_agrees_with_fd_2_after_a_scope(fake_cuda_dir):
    rc, out, err = _run_on_a_tty(fake_cuda_dir, _AFTER_WATCH + '''
    report(dict(c=bool(libc.isatty(libc.fileno(stderr()))), py=os.isatty(2)))
    ''')
    assert rc == 0, err
    assert 'RESULT {"c": true, "py": true}' in out, (out, err)


def test_py_fatal_error_prints_after_a_scope(fake_child):
    """Py_FatalError writes to fileno(stderr): after a scope it still prints
    the message and the threads' tracebacks (it printed nothing before)."""
    c = run(fake_child, _AFTER_WATCH + '''
    ctypes.pythonapi.Py_FatalError.argtypes = [ctypes.c_char_p]
    def in_a_function():
        ctypes.pythonapi.Py_FatalError(b"fatal_marker_17")
    in_a_function()
    ''')
    assert c.returncode != 0
    assert "Fatal Python error" in c.stderr and "fatal_marker_17" in c.stderr, c
    assert "in_a_function" in c.stderr, c          # the traceback


def test_assert_text_still_captured_from_the_drivers_writes(fake_child):
    """The driver's own `stderr` writes still reach the report and fd 2, from
    the waiting thread and from a thread of the driver's; libc's `stderr`
    written by others is not in the report."""
    c = run(fake_child, '''
        import ctypes
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        libc = ctypes.CDLL(None)
        libc.fputs.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
        err = ctypes.c_void_p.in_dll(libc, "stderr").value
        out = {}
        for thread in (0, 1):
            fake.fake_reset()
            fake.fake_set_print_thread(thread)
            fake.fake_set_kernel(b"check_index", 710, -1, b"cond_%d" % thread, -1, 0)
            try:
                with cuda_debug.launch_blocking():
                    libc.fputs(b"not the driver's\\n", err)
                    t.device_assert()
            except cuda_debug.DeviceAssertError as e:
                out[thread] = e.device_message
        report(dict(out=out, tee=_core.stats()["stderr_tee"]))
    ''')
    r = c.result
    assert r is not None, c
    assert r["tee"] == 1
    for thread in ("0", "1"):
        assert "Assertion `cond_%s` failed." % thread in r["out"][thread], r
        assert "not the driver's" not in r["out"][thread]
    assert c.stderr.count("not the driver's") == 2
    assert "Assertion `cond_1` failed." in c.stderr


def test_stderr_references_are_found_in_the_drivers_relocations(fake_child):
    """The fake driver refers to `stderr` (fprintf(stderr, ...)) and the fake
    CUPTI does not (it writes with dprintf): the relocation walk finds it only
    in the former."""
    c = run(fake_child, '''
        import os
        from cuda_debug import _core
        report(dict(cuda=_core.stderr_references(os.path.join(FAKE_DIR, "libcuda.so.1")),
                    cupti=_core.stderr_references(os.path.join(FAKE_DIR, "libcupti.so.13"))))
    ''')
    assert c.result is not None, c
    assert c.result["cuda"] >= 1 and c.result["cupti"] == 0, c.result


def test_doctor_says_whether_the_assert_text_is_captured(fake_child):
    c = run(fake_child, '''
        from cuda_debug import _environment
        from cuda_debug._cli import doctor
        d = _environment.full(probe_cupti=False)
        report(dict(a=d["assert_text"], line=doctor._assert_text_line(d["assert_text"]),
                    off=doctor._assert_text_line(dict(d["assert_text"], state="off")),
                    none=doctor._assert_text_line(dict(d["assert_text"], state="not_captured"))))
    ''')
    r = c.result
    assert r is not None, c
    assert r["a"] == {"state": "captured", "capture_setting": "on", "stderr_references": 1}, r
    assert r["line"].startswith("captured from libcuda's writes to stderr"), r
    assert r["off"].startswith("not captured: CUDA_DEBUG_CAPTURE=off"), r
    assert r["none"].startswith("not captured: libcuda has no reference to stderr"), r


# -- locations of freed code objects ----------------------------------------------------

#: 40 code objects compiled under one file name, run once under watch() and
#: freed (an edited notebook cell run again and again): the line each launch
#: was recorded at, and the one its code had (tests/core/test_robust.py too).
FREED_CODE_CHILD = '''
    import gc
    import cuda_debug, cuda_debug.testing as t
    from cuda_debug import _core, _report
    out = []
    with cuda_debug.watch():
        for i in range(40):
            blank, stmts = i % 5, (i // 5) % 3
            src = "\\n" * blank + "x = 1\\n" * stmts + "t.empty()\\n"
            before = _core.watch_seq()
            exec(compile(src, "cell.py", "exec"), {"t": t})
            gc.collect()
            rec = _report.watch_record(before + 1)
            got = [loc[2] for loc in map(_core.location, rec.frames)
                   if loc and loc[0] == "cell.py"]
            out.append((blank + stmts + 1, got[0] if got else None))
    report(dict(out=out, watcher=_core.stats()["code_watcher"]))
'''


def check_freed_code(r):
    assert r is not None
    wrong = [(i, want, got) for i, (want, got) in enumerate(r["out"]) if want != got]
    assert not wrong, "%d of 40 launches at the wrong line (index, want, got): %s" % (
        len(wrong), wrong)


def test_locations_stay_true_when_code_objects_are_freed_and_reused(fake_child):
    """Each launch is recorded at the line its own code had, though the
    addresses of the code objects, their file names and their first lines
    are reused (the code objects' entries are retired as they are freed)."""
    c = run(fake_child, FREED_CODE_CHILD)
    assert c.result is not None, c
    assert c.result["watcher"] == 1, c.result
    check_freed_code(c.result)


def test_locations_of_freed_code_objects_with_no_code_watcher_left(fake_child):
    """Python 3.12+ gives an interpreter eight code watchers: with all taken
    before cuda_debug is imported, freed code objects are told from new ones
    at their addresses by their contents, and the launches are still recorded
    at their lines."""
    if sys.version_info < (3, 12):
        pytest.skip("code watchers are Python 3.12+ (before, the deallocator is wrapped)")
    c = run(fake_child, textwrap.dedent('''
        import ctypes
        WATCHER = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.c_void_p)
        keep = [WATCHER(lambda event, code: 0) for _ in range(8)]
        ctypes.pythonapi.PyCode_AddWatcher.argtypes = [WATCHER]
        taken = sorted(ctypes.pythonapi.PyCode_AddWatcher(w) for w in keep)
        assert taken == list(range(8)), taken
    ''') + textwrap.dedent(FREED_CODE_CHILD))
    assert c.result is not None, c
    assert c.result["watcher"] == 0, c.result
    check_freed_code(c.result)


@pytest.mark.parametrize("unload_events", [True, False])
def test_kernel_name_of_a_module_reloaded_at_the_same_address(fake_child, unload_events):
    """A module unloaded and another loaded where it was: CUPTI's symbolName
    pointer is the same and the names share their first 32 bytes; the watch
    record names the kernel that ran, whether CUPTI tells of the unload (the
    name is then checked again after it only) or not (checked at each launch)."""
    c = run(fake_child, '''
        import cuda_debug
        from cuda_debug import _core, _report
        fake.fake_refuse_resource(%d)
        old = b"kernel_with_a_long_common_prefix_" + b"A" * 20
        new = b"kernel_with_a_long_common_prefix_" + b"B" * 20
        names = []
        with cuda_debug.watch():
            for name in (old, None, new):
                if name is None:
                    assert fake.fake_rename_function(old, new) == 0
                    continue
                before = _core.watch_seq()
                fake.fake_launch(name, 0, 1, 1, 1, 32, 1, 1)
                names.append(_report.watch_record(before + 1).kernel.decode())
        report(names)
    ''' % (not unload_events))
    assert c.result is not None, c
    assert c.result == ["kernel_with_a_long_common_prefix_" + "A" * 20,
                        "kernel_with_a_long_common_prefix_" + "B" * 20], c.result


# -- file names ---------------------------------------------------------------------------

NAMED_FILE = '''
import os, re, cuda_debug
import cuda_debug.testing as t
fake.fake_set_kernel(b"named_file_kernel", 710, -1, b"cond", -1, 0)
name = sys.argv[1] if sys.argv[1:] else None

def run_in(filename):
    """A launch from a function whose code says it is in `filename`."""
    g = {"fake": fake}
    exec(compile("def launch():\\n    fake.fake_launch(b'named_file_kernel', 0, 1, 1, 1, 32, 1, 1)\\n",
                 filename, "exec"), g)
    try:
        with cuda_debug.launch_blocking():
            g["launch"]()
    except cuda_debug.DeviceAssertError as e:
        return e
'''


@pytest.mark.parametrize("case", ["long", "latin1", "both"])
def test_file_names_are_kept_as_python_spells_them(fake_child, tmp_path, case):
    """A path of 1,500 bytes (a real file: PATH_MAX is 4,096) and a non-UTF-8
    name (os.fsdecode: b'caf\\xe9' is 'caf\\udce9'): before, the name was cut to
    1,020 characters, silently, and the undecodable bytes became U+FFFD, in
    the fd-2 block and in .filename. Now .filename is the name Python has
    (the code object's co_filename) and the block holds every byte (an
    undecodable one escaped, \\xe9)."""
    folder = bytes(tmp_path).rstrip(b"/")
    if case in ("long", "both"):
        for i in range(8):
            folder += b"/" + (b"d%d_" % i) + b"x" * 180
    os.makedirs(folder, exist_ok=True)
    leaf = b"caf\xe9.py" if case in ("latin1", "both") else b"cafe.py"
    path = folder + b"/" + leaf
    with open(path, "wb") as f:
        f.write(b"")
    c = run(fake_child, NAMED_FILE + '''
e = run_in(os.fsdecode(os.fsencode(name)))
report(dict(filename=os.fsencode(e.filename).hex(), lineno=e.lineno,
            stack=[os.fsencode(f.filename).hex() for f in e.launch_stack]))
''', args=[os.fsdecode(path)])
    r = c.result
    assert r is not None, c
    assert bytes.fromhex(r["filename"]) == path, (len(bytes.fromhex(r["filename"])), len(path))
    assert r["lineno"] == 2, r
    shown = path.decode("utf-8", "backslashreplace")      # \xe9, as the block escapes it
    block = c.stderr[c.stderr.index("cuda_debug: device-side assert"):]
    assert "launched at %s:2 in launch" % shown in block, (shown[-80:], block[:3000])


def test_a_file_name_longer_than_kept_is_cut_visibly(fake_child):
    """A code object's file name of 6,000 bytes (no file system has it; exec of
    compile(src, name)): kept as its start, "...", and its end (the file name),
    4,095 bytes at most, in .filename and in the fd-2 block; never cut
    silently."""
    c = run(fake_child, NAMED_FILE + '''
long_name = "/start_of_the_path/" + "p" * 6000 + "/end_of_the_path.py"
e = run_in(long_name)
report(dict(filename=e.filename, n=len(long_name)))
''')
    r = c.result
    assert r is not None, c
    f = r["filename"]
    assert f.startswith("/start_of_the_path/ppp") and f.endswith("ppp/end_of_the_path.py"), f[:40]
    assert "p...p" in f and len(f.encode()) <= 4095 < r["n"], len(f)
    block = c.stderr[c.stderr.index("cuda_debug: device-side assert"):]
    assert "launched at " + f + ":2 in launch" in block, block[:300]


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# Never crash the host, never lose the report, on a real GPU, in
# child processes: the device's assert text is caught from libcuda's own writes
# to `stderr` while libc's `stderr` stays libc's; a daemon thread launching
# through interpreter shutdown; launches from freed and re-made code objects
# recorded at their own lines. The fake-driver versions, and why:
# the tests above.
# ======================================================================================


@pytest.mark.gpu
def test_gpu_assert_text_is_caught_and_libc_stderr_is_left_alone(child):
    c = child('''
        import ctypes
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        libc = ctypes.CDLL(None)
        libc.fileno.argtypes = [ctypes.c_void_p]
        err = ctypes.c_void_p.in_dll(libc, "stderr").value
        try:
            with cuda_debug.launch_blocking():
                t.device_assert()                         # LAUNCH
        except cuda_debug.DeviceAssertError as e:
            report(dict(msg=e.device_message, lineno=e.lineno, tee=_core.stats()["stderr_tee"],
                        fileno=libc.fileno(err)))
    ''', timeout=120)
    r = c.result
    assert r is not None, c
    assert r["tee"] == 1, r                  # libcuda's reference to stderr was found
    assert r["fileno"] == 2, r               # libc's stderr is libc's
    assert "Assertion `idx[i] >= 0 && idx[i] < limit` failed." in (r["msg"] or ""), r
    assert r["lineno"] == c.line_of("# LAUNCH")
    assert c.stderr.count("Assertion `idx[i] >= 0 && idx[i] < limit` failed.") >= 2, c.stderr


@pytest.mark.gpu
def test_gpu_daemon_thread_launching_through_interpreter_shutdown(child):
    c = child('''
        import threading, time
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core

        def loop():
            while True:
                t.empty()

        w = cuda_debug.watch()
        w.__enter__()
        threading.Thread(target=loop, daemon=True).start()
        time.sleep(0.3)
        report(dict(watched=_core.stats()["watched"]))
    ''', timeout=120)
    assert c.returncode == 0, c
    assert c.result and c.result["watched"] > 100, c


@pytest.mark.gpu
def test_gpu_locations_of_freed_code_objects(child):
    c = child(FREED_CODE_CHILD, timeout=120)
    assert c.result is not None, c
    assert c.result["watcher"] == 1, c.result
    check_freed_code(c.result)
