"""The SIGTERM/SIGABRT reports on the fake driver: a handled
signal does not use up the fault's report nor write torchrun's error file; the
handler leaves errno as it found it; a sibling signal cannot cut a report
mid-write."""
import json
import signal
import textwrap
import time

HANG = '''
import os, signal, time, cuda_debug
fake.fake_set_async(1)
fake.fake_set_kernel(b"hangs_a_while", 0, 0, b"", -1, 60000000)
'''


def hang(code):
    """A child script: async fake streams and a kernel that runs a minute, then `code`."""
    return HANG + textwrap.dedent(code)


def test_a_handled_sigterm_leaves_the_fault_its_report_and_the_error_file(fake_child, tmp_path):
    err_file = tmp_path / "error.json"
    c = fake_child(hang('''
        import cuda_debug.testing as t
        fake.fake_set_kernel(b"busy_3s", 0, 0, b"", -1, 3000000)
        seen = []
        signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
        side = fake.fake_stream_create()
        with cuda_debug.watch():
            fake.fake_launch(b"busy_3s", side, 1, 1, 1, 32, 1, 1)
            os.kill(os.getpid(), signal.SIGTERM)
            while not seen:
                time.sleep(0.01)
            written = os.path.exists(%r)
            t.device_assert()                 # FAULT
            try:
                cuda_debug.check()
            except cuda_debug.CudaError as e:
                report(dict(kind=type(e).__name__, written_at_sigterm=written))
    ''') % str(err_file), env={"TORCHELASTIC_ERROR_FILE": str(err_file)})
    assert c.result == {"kind": "DeviceAssertError", "written_at_sigterm": False}, c
    assert "cuda_debug (watch): SIGTERM while watching" in c.stderr, c.stderr
    # the fault's own C block, after the handled SIGTERM's
    fault = c.stderr.find("cuda_debug (watch): device-side assert")
    assert fault > c.stderr.find("SIGTERM while watching") >= 0, c.stderr
    assert "check_index" in c.stderr[fault:], c.stderr
    msg = json.loads(err_file.read_text())["message"]
    assert msg["message"].startswith("device-side assert"), msg
    assert "SIGTERM" not in msg["extraInfo"]["py_callstack"], msg


def test_a_signal_that_kills_writes_the_error_file_even_after_a_handled_one(fake_child, tmp_path):
    err_file = tmp_path / "error.json"
    c = fake_child(hang('''
        seen = []
        signal.signal(signal.SIGTERM, lambda s, f: seen.append(s))
        with cuda_debug.watch():
            fake.fake_launch(b"hangs_a_while", 0, 1, 1, 1, 32, 1, 1)
            os.kill(os.getpid(), signal.SIGTERM)      # handled: the process goes on
            while not seen:
                time.sleep(0.01)
            written = os.path.exists(%r)
            print("WRITTEN" if written else "NOT WRITTEN", flush=True)
            os.abort()                                # NCCL's watchdog, later: this one kills
    ''') % str(err_file), env={"TORCHELASTIC_ERROR_FILE": str(err_file)})
    assert c.returncode == -signal.SIGABRT, c
    assert "NOT WRITTEN" in c.stdout, c
    # one signal block on stderr (the first); the error file from the signal that killed
    assert c.stderr.count("while watching") == 1, c.stderr
    assert "SIGTERM while watching" in c.stderr, c.stderr
    msg = json.loads(err_file.read_text())["message"]
    assert msg["message"].startswith("SIGABRT while watching"), msg
    assert "hangs_a_while" in msg["extraInfo"]["py_callstack"], msg


def test_the_handler_leaves_errno_as_it_found_it(fake_child):
    c = fake_child(hang('''
        import ctypes
        signal.signal(signal.SIGTERM, lambda s, f: None)
        libc = ctypes.CDLL(None, use_errno=True)
        with cuda_debug.watch():
            fake.fake_launch(b"hangs_a_while", 0, 1, 1, 1, 32, 1, 1)
            saved = os.dup(2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 2)   # the report's write(2) fails: EBADF
            ctypes.set_errno(0)
            getattr(libc, "raise")(signal.SIGTERM)          # the handler runs inside raise()
            err = ctypes.get_errno()
            os.dup2(saved, 2)
        report(dict(errno=err))
    '''))
    assert c.result == {"errno": 0}, c


def test_a_sigterm_during_the_sigabrt_report_does_not_cut_it(fake_live):
    # The child fills its stderr pipe, then aborts: the SIGABRT report blocks in
    # write(2). A SIGTERM sent now must wait for the report, not end the process
    # in the middle of it.
    with fake_live(hang('''
        with cuda_debug.watch():
            fake.fake_launch(b"hangs_a_while", 0, 1, 1, 1, 32, 1, 1)   # LAUNCH
            os.set_blocking(2, False)
            try:
                while True:
                    os.write(2, b"x" * 4096)
            except BlockingIOError:
                pass
            os.set_blocking(2, True)
            print("FULL", flush=True)
            os.kill(os.getpid(), signal.SIGABRT)
            time.sleep(30)
    '''), read_stderr=False) as live:
        live.wait_for("FULL", name="stdout", timeout=60)
        time.sleep(1.0)                       # the SIGABRT report is blocked in write(2)
        live.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        live.start_reading()
        rc = live.finish(timeout=30)
        err = live.text()
        assert rc == -signal.SIGABRT, live
        assert "cuda_debug (watch): SIGABRT while watching" in err, err[-3000:]
        assert "launched at %s:%d" % (live.script, live.line_of("# LAUNCH")) in err, err[-3000:]


def test_a_sigabrt_on_another_thread_while_the_watch_block_is_written_still_leaves_it(
        fake_child, tmp_path):
    """The watch block written at the fault (here: the
    driver logs the sticky error during a synchronize) claims the report, then
    builds and writes it. A SIGABRT on another thread in between (NCCL's
    watchdog) found the report claimed, wrote nothing, and the process died
    with no report at all. The test pauses the writer there (_core.
    _test_report_pause) and aborts from another thread meanwhile: the block
    (and torchrun's error file) must still come out."""
    err_file = tmp_path / "error.json"
    c = fake_child('''
        import os, signal, threading, time
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core

        def watchdog():                      # NCCL's: aborts while the block is written
            time.sleep(0.3)
            signal.pthread_kill(threading.get_ident(), signal.SIGABRT)

        _core._test_report_pause(1.0)
        with cuda_debug.watch():
            t.device_assert()                # FAULT (found by the synchronize below)
            threading.Thread(target=watchdog).start()
            fake.fake_ctx_sync()
            time.sleep(5)
        print("NOT ABORTED", flush=True)
    ''', env={"TORCHELASTIC_ERROR_FILE": str(err_file)})
    assert c.returncode == -signal.SIGABRT, c
    block = c.stderr[c.stderr.index("cuda_debug (watch): device-side assert"):] \
        if "cuda_debug (watch): device-side assert" in c.stderr else ""
    assert "culprit: check_index" in block, c.stderr
    assert "user_script.py:%d" % c.line_of("# FAULT") in block, c.stderr
    msg = json.loads(err_file.read_text())["message"]
    assert msg["message"].startswith("device-side assert"), msg
