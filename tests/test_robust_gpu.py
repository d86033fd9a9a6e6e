"""Never crash the host, never lose the report, on a real GPU, in
child processes: the device's assert text is caught from libcuda's own writes
to `stderr` while libc's `stderr` stays libc's; a daemon thread launching
through interpreter shutdown; launches from freed and re-made code objects
recorded at their own lines. The fake-driver versions, and why:
tests/test_fake_driver_robust.py."""
import pytest

from test_fake_driver_robust import FREED_CODE_CHILD, check_freed_code

pytestmark = pytest.mark.gpu


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


def test_gpu_locations_of_freed_code_objects(child):
    c = child(FREED_CODE_CHILD, timeout=120)
    assert c.result is not None, c
    assert c.result["watcher"] == 1, c.result
    check_freed_code(c.result)
