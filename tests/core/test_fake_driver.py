"""cuda_debug against the fake CUDA driver and CUPTI (tests/fake_cuda): CPU only.

The fakes are a libcuda.so.1 and a libcupti.so.13 compiled by the test session
against the real cuda.h / cupti.h and preloaded in a child process, so the
REAL cuda_debug launch callback (csrc/hooks/launch_callback.c) runs on every launch, at
API enter and exit, exactly as CUPTI calls it: this file proves the harness
drives the hot path and the fault path. Every test runs in a child (a sticky
fault kills the context of its process) with a timeout: a hang is a failure.
"""
import os

import pytest

ASSERT_TEXT = ("fault_kernels.cu:14: check_index: block: [0,0,0], thread: [3,0,0] "
               "Assertion `idx[i] >= 0 && idx[i] < limit` failed.")


def test_device_assert_in_scope_names_kernel_line_and_text(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        try:
            with cuda_debug.launch_blocking():
                t.device_assert()                       # LAUNCH
        except cuda_debug.DeviceAssertError as e:
            report(dict(kernel=e.kernel, lineno=e.lineno, filename=e.filename,
                        msg=e.device_message, code=e.code, sticky=e.sticky,
                        text=str(e), fake=fake_stats()))
    ''')
    assert c.returncode == 0, c
    r = c.result
    assert r is not None, c
    assert "check_index" in r["kernel"]
    assert r["lineno"] == c.line_of("# LAUNCH")
    assert r["filename"] == c.script
    assert ASSERT_TEXT in r["msg"]
    assert r["code"] == 710 and r["sticky"]
    assert "check_index" in r["text"] and "user_script.py:%d" % r["lineno"] in r["text"]
    # the real callback ran at enter and exit of the one launch, and synchronised it
    assert r["fake"]["callbacks"] == 2 and r["fake"]["launch_calls"] == 1
    assert r["fake"]["lines_printed"] == 1
    # the driver's text still reached fd 2
    assert ASSERT_TEXT in c.stderr


@pytest.mark.parametrize("fault", ["illegal_address", "trap", "misaligned_address"])
def test_other_sticky_faults_in_scope(fake_child, fault):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        fn, cls, code = t.FAULTS[sys.argv[1]]
        try:
            with cuda_debug.launch_blocking():
                fn()                                    # LAUNCH
        except cuda_debug.CudaError as e:
            report(dict(cls=type(e).__name__, code=e.code, kernel=e.kernel, lineno=e.lineno,
                        want_cls=cls, want_code=code))
    ''', args=[fault])
    r = c.result
    assert r is not None, c
    assert r["cls"] == r["want_cls"] and r["code"] == r["want_code"]
    assert fault.split("_")[0] in r["kernel"] or "wild" in r["kernel"]
    assert r["lineno"] == c.line_of("# LAUNCH")


def test_bad_launch_is_a_launch_error_and_the_context_lives_on(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        out = {}
        try:
            with cuda_debug.launch_blocking():
                t.bad_launch()                          # LAUNCH
        except cuda_debug.LaunchError as e:
            out.update(cls=type(e).__name__, code=e.code, sticky=e.sticky, lineno=e.lineno)
        with cuda_debug.launch_blocking():
            t.empty()                                   # still usable
        cuda_debug.check()
        out["fake"] = fake_stats()
        out["sticky_now"] = fake.fake_sticky()
        report(out)
    ''')
    r = c.result
    assert r is not None, c
    assert r["cls"] == "LaunchError" and r["code"] == 1 and not r["sticky"]
    assert r["lineno"] == c.line_of("# LAUNCH")
    assert r["fake"]["refused"] == 1 and r["fake"]["kernels_run"] == 1
    assert r["sticky_now"] == 0


def test_outside_any_scope_check_finds_the_fault(fake_child):
    c = fake_child('''
        import time
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        t.device_assert()                     # asynchronous: returns, nothing synchronised
        out = dict(synced=_core.stats()["synced"], callbacks=fake_stats()["callbacks"])
        try:
            cuda_debug.check()                # CHECK
        except cuda_debug.StickyCudaError as e:
            out.update(cls=type(e).__name__, code=e.code, lineno=e.lineno)
        report(out)
    ''')
    r = c.result
    assert r is not None, c
    assert r["synced"] == 0 and r["callbacks"] == 0      # not subscribed outside scopes
    assert r["cls"] == "DeviceAssertError" and r["code"] == 710
    assert r["lineno"] == c.line_of("# CHECK")
    assert ASSERT_TEXT in c.stderr                        # printed by the discovering sync


def test_a_launch_after_the_fault_is_refused_with_the_sticky_code(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        out = {}
        try:
            with cuda_debug.launch_blocking():
                try:
                    t.device_assert()
                except cuda_debug.DeviceAssertError as e:
                    out["first"] = e.kernel
                before = fake_stats()
                out["rc"] = fake.fake_launch(b"innocent_kernel", 0, 1, 1, 1, 32, 1, 1)
                after = fake_stats()
        except cuda_debug.StickyCudaError as e:   # the scope reports the dead context at exit
            out["at_exit"] = type(e).__name__
        out["ran"] = after["kernels_run"] - before["kernels_run"]
        out["callbacks"] = after["callbacks"] - before["callbacks"]
        out["active"] = _core.stats()["active"]
        report(out)
    ''')
    r = c.result
    assert r is not None, c
    assert "check_index" in r["first"]
    assert r["rc"] == 710            # refused at the API by the dead context
    assert r["ran"] == 0             # never executed
    assert r["callbacks"] == 2       # the callback saw it (enter + exit, nonzero at exit)
    assert r["active"] == 0
    assert r["at_exit"] == "DeviceAssertError"   # which kernel it names: see the scenarios


def test_cupti_held_by_another_tool_is_a_tool_conflict(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        out = {}
        fake.fake_hold_cupti(b"torch.profiler (Kineto)")
        try:
            with cuda_debug.launch_blocking():
                pass
        except cuda_debug.ToolConflictError as e:
            out.update(cls=type(e).__name__, text=str(e), holder=e.extra.get("holder"))
        out["active_after_conflict"] = _core.stats()["active"]
        fake.fake_hold_cupti(None)              # the profiler lets go
        with cuda_debug.launch_blocking():
            t.empty()
        out["synced"] = _core.stats()["synced"]
        out["subscribed_after"] = fake.fake_cupti_enabled(-1)
        report(out)
    ''')
    r = c.result
    assert r is not None, c
    assert r["cls"] == "ToolConflictError"
    assert "torch.profiler (Kineto)" in r["text"] and r["holder"] == "torch.profiler (Kineto)"
    assert r["active_after_conflict"] == 0
    assert r["synced"] == 1
    assert r["subscribed_after"] == 0        # CUPTI given back at the outermost exit


def test_synced_counts_launches_in_scopes_only(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        t.empty()
        with cuda_debug.launch_blocking():
            for _ in range(5):
                t.empty()
            with cuda_debug.launch_blocking(False):      # opted out: not synchronised
                t.empty()
            with cuda_debug.launch_blocking():           # nested: one subscription
                t.empty()
        t.empty()
        cuda_debug.check()
        s = _core.stats()
        report(dict(synced=s["synced"], subscribes=s["subscribes"], active=s["active"],
                    fake=fake_stats(), enabled=fake.fake_cupti_enabled(-1)))
    ''')
    r = c.result
    assert r is not None, c
    assert r["synced"] == 6
    assert r["subscribes"] == 1 and r["active"] == 0 and r["enabled"] == 0
    assert r["fake"]["kernels_run"] == 9
    assert r["fake"]["callbacks"] == 2 * 7    # the 7 launches made while subscribed


def test_launch_blocking_waits_for_the_kernel_with_an_async_device(fake_child):
    """fake_set_async(1): a device thread runs the kernels, so a launch returns
    at once; inside a scope the callback waits for the 0.3 s kernel."""
    c = fake_child('''
        import time
        import cuda_debug, cuda_debug.testing as t
        fake.fake_set_async(1)
        t0 = time.perf_counter(); t.spin(0.3); t_async = time.perf_counter() - t0
        cuda_debug.check()
        with cuda_debug.launch_blocking():
            t0 = time.perf_counter(); t.spin(0.3); t_sync = time.perf_counter() - t0
        report(dict(t_async=t_async, t_sync=t_sync))
    ''')
    r = c.result
    assert r is not None, c
    assert r["t_async"] < 0.2     # did not wait (the first launch also loads the module)
    assert r["t_sync"] >= 0.29


def test_launch_apis_ex_cooperative_and_graph_replay(fake_child):
    """Every launch API the callback hooks: cuLaunchKernelEx and the cooperative
    launch get their fault written into their own return value; a launch on a
    capturing stream is not synchronised and the capture stays valid; a graph
    replay that faults fails at cuGraphLaunch."""
    c = fake_child('''
        import ctypes
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        out = {}
        fake.fake_set_kernel(b"ex_fault", 710, -1, b"ex < n", -1, 0)
        try:
            with cuda_debug.launch_blocking():
                out["ex_ok"] = fake.fake_launch_ex(b"ex_fine", 0, 1, 1, 1, 64, 1, 1)
                out["coop_ok"] = fake.fake_launch_cooperative(b"coop_fine", 0, 1, 1, 1, 64, 1, 1)
                s = fake.fake_stream_create()
                out["begin"] = fake.fake_begin_capture(s)
                out["captured_launch"] = fake.fake_launch(b"ex_fault", s, 1, 1, 1, 32, 1, 1)
                out["status_during"] = fake.fake_capture_status(s)
                g = ctypes.c_size_t()
                out["end"] = fake.fake_end_capture(s, ctypes.byref(g))
                out["skipped_capture"] = _core.stats()["skipped_capture"]
                out["replay"] = fake.fake_graph_launch(g.value, s)
        except cuda_debug.DeviceAssertError as e:     # raised at scope exit: sticky
            out["at_exit"] = e.launch_api
        raws = _core.faults(0)
        out["fault_cbid"] = raws[-1][4] if raws else None
        out["sticky"] = fake.fake_sticky()
        report(out)
    ''')
    r = c.result
    assert r is not None, c
    assert r["ex_ok"] == 0 and r["coop_ok"] == 0
    assert r["begin"] == 0 and r["captured_launch"] == 0
    assert r["status_during"] == 1            # CU_STREAM_CAPTURE_STATUS_ACTIVE: not synced
    assert r["end"] == 0 and r["skipped_capture"] == 1
    assert r["replay"] == 710                 # the replayed kernel faulted; the callback said so
    assert r["fault_cbid"] == 514             # CUPTI_DRIVER_TRACE_CBID_cuGraphLaunch
    assert r["at_exit"] == "cuGraphLaunch"
    assert r["sticky"] == 710


def test_launch_ex_fault_is_written_into_its_return_value(fake_child):
    c = fake_child('''
        import cuda_debug
        from cuda_debug import _core
        fake.fake_set_kernel(b"ex_fault", 710, -1, b"ex < n", -1, 0)
        with cuda_debug.launch_blocking():
            rc = fake.fake_launch_ex(b"ex_fault", 0, 2, 1, 1, 64, 1, 1)     # LAUNCH
        ''' + '''
        report(dict(rc=rc))
    ''')
    # The scope raises at exit (sticky, swallowed by the "framework"), but rc came first.
    assert "DeviceAssertError" in c.stderr, c
    assert "ex < n" in c.stderr


def test_ld_library_path_finds_the_fakes(fake_child):
    from fake_cuda import real_cuda_found_first
    reason = real_cuda_found_first()
    if reason:
        pytest.skip(reason)
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _libraries
        try:
            with cuda_debug.launch_blocking():
                t.device_assert()
        except cuda_debug.DeviceAssertError as e:
            report(dict(kernel=e.kernel, cuda=_libraries.status("cuda").how,
                        path=_libraries.status("cuda").path,
                        cupti=_libraries.status("cupti").path))
    ''', preload=False, ld_library_path=True)
    r = c.result
    assert r is not None, c
    assert "check_index" in r["kernel"]
    assert r["cuda"] == "system loader"
    assert "cuda_debug_fake_" in r["path"] and "cuda_debug_fake_" in r["cupti"]


def test_driver_log_lines_reach_the_report(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        try:
            with cuda_debug.launch_blocking():
                t.device_assert()
        except cuda_debug.DeviceAssertError as e:
            report(dict(log=e.driver_log))
    ''')
    r = c.result
    assert r is not None, c
    assert any("Returning 710 (CUDA_ERROR_ASSERT) from cuStreamSynchronize" in line
               for line in r["log"]), r


def test_fake_stream_write_value_and_pinned_memory(fake_child):
    """The fake itself (what watch mode will rely on): cuStreamWriteValue32 into
    cuMemHostAlloc memory lands in host memory in stream order; after a fault
    the later writes never execute, and the memory stays readable."""
    c = fake_child('''
        import ctypes
        lib = ctypes.CDLL(FAKE_DIR + "/libcuda.so.1")
        p = ctypes.c_void_p(); d = ctypes.c_uint64()
        assert lib.cuMemHostAlloc(ctypes.byref(p), ctypes.c_size_t(64), 3) == 0
        assert lib.cuMemHostGetDevicePointer_v2(ctypes.byref(d), p, 0) == 0
        slots = (ctypes.c_uint32 * 16).from_address(p.value)
        s = fake.fake_stream_create()
        fake.fake_set_kernel(b"boom", 700, 0, None, 0, 0)
        for i, name in enumerate([b"ok0", b"ok1", b"boom", b"ok3"]):
            assert fake.fake_launch(name, s, 1, 1, 1, 1, 1, 1) == 0
            assert lib.cuStreamWriteValue32_v2(ctypes.c_void_p(s), ctypes.c_uint64(d.value + 4 * i),
                                               ctypes.c_uint32(i + 1), 0) == 0
        before = list(slots[:4])
        rc = fake.fake_stream_sync(s)
        report(dict(before=before, after=list(slots[:4]), rc=rc, st=fake_stats(),
                    same=d.value == p.value))
    ''')
    r = c.result
    assert r is not None, c
    assert r["same"]
    assert r["before"] == [0, 0, 0, 0]        # nothing ran before the sync (sync mode)
    assert r["after"] == [1, 2, 0, 0]          # the faulting kernel's slot and later stay 0
    assert r["rc"] == 700
    assert r["st"]["writes"] == 2 and r["st"]["dropped"] == 3


@pytest.mark.parametrize("text", ["long", "non_utf8", "nul"])
def test_hostile_assert_text_does_not_crash(fake_child, text):
    """64 KiB of assert text, undecodable bytes, an embedded NUL (the driver's
    printf stops there): the report comes, with what could be kept."""
    c = fake_child('''
        import cuda_debug
        kind = sys.argv[1]
        cond = {"long": b"L" * 65536, "non_utf8": b"bad \\xff\\xfe\\xc3 bytes",
                "nul": b"before_nul\\0after_nul"}[kind]
        fake.fake_set_kernel(b"hostile", 710, -1, cond, len(cond), 0)
        try:
            with cuda_debug.launch_blocking():
                fake.fake_launch(b"hostile", 0, 1, 1, 1, 32, 1, 1)
        except cuda_debug.DeviceAssertError as e:
            report(dict(kernel=e.kernel, msg=e.device_message, text=str(e)))
    ''', args=[text])
    r = c.result
    assert r is not None, c
    assert "hostile" in r["kernel"]
    msg = r["msg"] or ""
    if text == "long":
        assert msg.startswith("fake_kernels.cu:42: hostile:") and "LLLL" in msg
    elif text == "non_utf8":
        assert "bad " in msg and " bytes" in msg
    else:
        assert "before_nul" in msg and "after_nul" not in msg


def test_cupti_is_never_called_before_the_driver_initialised(fake_child):
    """CUPTI 13 called on a machine whose driver does not initialise (the
    nvidia-cuda-cupti wheel of a PyTorch install, no GPU) recursed until the
    stack overflowed: `cuda-debug doctor` died of SIGSEGV. The fake CUPTI
    aborts the same way when called before a successful cuInit."""
    c = fake_child('''
        fake.fake_set_init_result(100)             # CUDA_ERROR_NO_DEVICE
        import cuda_debug
        from cuda_debug import _core, _environment
        d = _environment.full()
        try:
            with cuda_debug.launch_blocking():
                pass
            entered = "yes"
        except cuda_debug.CudaUnavailableError as e:
            entered = e.missing
        report(dict(init=d["init"], cupti=d["cupti"]["found"], version=d["cupti_version"],
                    text=_core.cupti_result_string(39), entered=entered))
    ''')
    assert c.returncode == 0, c
    r = c.result
    assert r["init"]["code"] == 100 and r["cupti"] is True
    assert r["version"] is None and r["text"] is None
    assert r["entered"] == "gpu"


def test_a_block_entered_without_a_reference_stays_open_until_exited(fake_child):
    """``cuda_debug.watch().__enter__()`` (the notebook idiom of
    ``torch.no_grad().__enter__()``) keeps the scope open (it once kept no
    reference, so the scope handle was freed, and the watch closed, on the same
    line: is_watching() was False on the next). The same for launch_blocking() (guard()'s entry lived on in
    its thread's stack already). Each stays open until exited: through the
    object __enter__ returned, or at the end of the process."""
    c = fake_child('''
        import gc
        import cuda_debug
        L = (1, 1, 1, 32, 1, 1)
        out = {}
        cuda_debug.watch().__enter__()
        gc.collect()
        out["watching"] = cuda_debug.is_watching()
        fake.fake_launch(b"recorded_while_watching", 0, *L)
        out["recorded"] = cuda_debug._core.stats()["watched"]
        cuda_debug.launch_blocking().__enter__()
        gc.collect()
        out["blocking"] = cuda_debug.is_launch_blocking()
        g = cuda_debug.guard().__enter__()
        gc.collect()
        out["guarding"] = cuda_debug.is_guarding()
        g.__exit__(None, None, None)
        w = cuda_debug.watch()
        held = w.__enter__()
        del w
        gc.collect()
        held.__exit__(None, None, None)
        out["after_one_exit"] = cuda_debug._core.stats()["watching"]
        report(out)
    ''')
    assert c.result == {"watching": True, "recorded": 1, "blocking": True, "guarding": True,
                        "after_one_exit": 1}, c
