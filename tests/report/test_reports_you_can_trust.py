"""SPEC section 6 ("Reports you can trust") scenarios, against the fake CUDA
driver and CUPTI (tests/fake_cuda), each in a child with a timeout
(a hang is a failure, reported as such).

Each guards a defect seen at commit ddb92d1 (all of these failed there; they
pass since the rewrite of the C core):

- two threads faulting at once: one capture window at a time; the other
  thread's assert text was missing or landed in the winner's report;
- a thread name cut inside a UTF-8 character: UnicodeDecodeError replaced the
  report (the name is now kept as bytes);
- a 1000-line assert flood: a 64 KiB buffer dropped lines silently; now every
  line reaches fd 2 in order and the report's cut is visible;
- glibc error() from another thread during waits: the per-launch swap of
  `stderr` lost lines, misrouted them, or left a stdio lock held; `stderr` is
  now swapped once, for a pass-through stream;
- refusals after a fault: one fault slot, overwritten by the refusal; now a
  ring, refusals counted as consequences;
- a scope entered after an earlier fault: CUPTI_ERROR_NOT_INITIALIZED was
  reported as "CUPTI unavailable", or the fault was blamed on the in-scope
  kernel; now entering drains, and the fault is "before this scope";
- CUPTI refusing the capture-begin ids aborted the subscription;
- a KeyboardInterrupt during scope entry leaked the scope count (CUPTI held
  for good), or left `_libraries`' lock held (the next entry hung);
- no report was written at fault time, so a process killed right after left
  nothing; now C writes it (CUDA_DEBUG_REPORT=0 silences it);
- the driver's assert text printed from a thread of its own, in pieces (seen
  on the H200), and the driver-log clamp; the frame reader itself.

On a real GPU: the tests at the end of this module (marked gpu).
"""
import re
import textwrap
import subprocess

import os

import pytest

from conftest import run_no_hang as run
from conftest import needs


def test_two_threads_faulting_at_once_each_get_their_own_report(fake_child):
    """Two threads in scopes, on their own streams, whose kernels both assert
    before the host notices (A after 0.2 s, B after 0.4 s of running side by
    side): each thread's report names its own kernel and holds its own assert
    text, and not the other's."""
    c = run(fake_child, '''
        import threading
        import cuda_debug
        fake.fake_set_kernel(b"fault_a", 710, -1, b"a_cond_only_in_A", -1, 200000)
        fake.fake_set_assert_site(b"fault_a", b"a.cu", 11, b"fault_a")
        fake.fake_set_kernel(b"fault_b", 710, -1, b"b_cond_only_in_B", -1, 400000)
        fake.fake_set_assert_site(b"fault_b", b"b.cu", 22, b"fault_b")
        barrier = threading.Barrier(2)
        results = {}

        def worker(name):
            s = fake.fake_stream_create()
            try:
                with cuda_debug.launch_blocking():
                    barrier.wait()
                    rc = fake.fake_launch(name, s, 1, 1, 1, 32, 1, 1)    # LAUNCH
                results[name.decode()] = dict(cls=None, rc=rc)
            except BaseException as e:
                results[name.decode()] = dict(cls=type(e).__name__, text=str(e),
                                              kernel=getattr(e, "kernel", None),
                                              msg=getattr(e, "device_message", None),
                                              lineno=getattr(e, "lineno", None))

        ts = [threading.Thread(target=worker, args=(n,)) for n in (b"fault_a", b"fault_b")]
        for t in ts: t.start()
        for t in ts: t.join()
        report(results)
    ''')
    r = c.result
    assert r is not None, c
    for me, other in (("fault_a", "fault_b"), ("fault_b", "fault_a")):
        mine, theirs = me[-1].lower(), other[-1].lower()
        got = r[me]
        assert got["cls"] == "DeviceAssertError", (me, got)
        assert me in (got["kernel"] or ""), (me, got)
        assert "%s_cond_only_in_%s" % (mine, mine.upper()) in (got["msg"] or ""), (me, got)
        assert "%s_cond_only_in_%s" % (theirs, theirs.upper()) not in (got["msg"] or ""), (me, got)
    # the driver's text reached fd 2 too
    assert "a_cond_only_in_A" in c.stderr and "b_cond_only_in_B" in c.stderr


# PyTorch's kernels, as the H200 names them: the index kernel runs a lambda (its
# closure type, "EUl...E_", is in the name) whose assert prints "operator()";
# x * 2 runs a functor (no closure).
INDEX_KERNEL = (b"_ZN2at6native24index_elementwise_kernelILi128ELi4EZNS0_16gpu_index_kernelIZNS0_"
                b"17index_kernel_implINS0_10OpaqueTypeILi4EEEEEvRNS_18TensorIteratorBaseEN3c108"
                b"ArrayRefIlEES9_EUlPcPKclE_EEvS6_S9_S9_RKT_bEUliE_EEvlT1_")
MUL_KERNEL = (b"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_13BinaryFunctorIfffNS0_15"
              b"binary_internal10MulFunctorIfEEEESt5arrayIPcLm3EEEEviT0_T1_")
INDEX_ASSERT = b'-sizes[i] <= index && index < sizes[i] && "index out of bounds"'


def test_a_thread_that_meets_another_threads_fault_names_that_fault(fake_child):
    """Another thread's fault is named, not our innocent kernel (a regression of
    3074885, seen 3 of 3 times on the H200): thread A
    in launch_blocking() runs PyTorch's index kernel, which asserts
    ("IndexKernel.cu:111: operator(): ... index out of bounds", printed by the
    driver's own thread); thread B, in its own launch_blocking(), runs x * 2,
    whose wait finds the context dead. B's exception named B's own
    MulFunctor kernel with A's assert text. The kernel the text belongs to is
    the cause: B's report names A's kernel and A's line, and says where B met
    it; B's fd-2 line is a consequence naming A's kernel."""
    c = run(fake_child, '''
        import threading
        import cuda_debug
        INDEX, MUL = %r, %r
        fake.fake_set_async(1)
        fake.fake_set_print_thread(1)
        fake.fake_set_kernel(INDEX, 710, -1, %r, -1, 100000)
        fake.fake_set_assert_site(INDEX, b"/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu",
                                  111, b"operator()")
        fake.fake_set_kernel(MUL, 0, 0, None, 0, 300000)    # in flight when A's dies
        barrier = threading.Barrier(2)
        results = {}

        def worker(name, kernel):
            s = fake.fake_stream_create()
            try:
                with cuda_debug.launch_blocking():
                    barrier.wait()
                    if name == "A":
                        fake.fake_launch(kernel, s, 1, 1, 1, 128, 1, 1)    # LAUNCH_A
                    else:
                        fake.fake_launch(kernel, s, 1, 1, 1, 128, 1, 1)    # LAUNCH_B
                results[name] = None
            except BaseException as e:
                results[name] = dict(cls=type(e).__name__, text=str(e),
                                     kernel=getattr(e, "kernel_mangled", None),
                                     msg=getattr(e, "device_message", None),
                                     lineno=getattr(e, "lineno", None),
                                     met_by=getattr(e, "met_by", None),
                                     tid=threading.get_native_id())

        ts = [threading.Thread(target=worker, args=a) for a in (("A", INDEX), ("B", MUL))]
        for t in ts: t.start()
        for t in ts: t.join()
        report(results)
    ''' % (INDEX_KERNEL, MUL_KERNEL, INDEX_ASSERT))
    r = c.result
    assert r is not None, c
    a, b = r["A"], r["B"]
    for got in (a, b):
        assert got["cls"] == "DeviceAssertError", (got, c.stderr)
        assert got["kernel"] == INDEX_KERNEL.decode(), got          # A's kernel, both
        assert got["lineno"] == c.line_of("# LAUNCH_A"), got         # A's line, both
        assert "index out of bounds" in (got["msg"] or ""), got
        assert "MulFunctor" not in got["text"].splitlines()[0], got["text"]
    assert a["met_by"] is None, a
    assert "(tid %d) at its wait after the launch of vectorized_elementwise_kernel" % b["tid"] \
        in (b["met_by"] or ""), b
    assert "user_script.py:%d" % c.line_of("# LAUNCH_B") in b["met_by"], b
    assert "  met by thread" in b["text"], b["text"]
    # fd 2: A's block names A's kernel; B's line is a consequence naming it too
    assert "cuda_debug: device-side assert (CUDA_ERROR_ASSERT) in index_elementwise_kernel" \
        in c.stderr, c.stderr
    assert "CUDA_ERROR_ASSERT) in vectorized_elementwise_kernel" not in c.stderr, c.stderr
    assert re.search(r"a wait after vectorized_elementwise_kernel<4, .*> failed because the CUDA "
                     r"context was already dead \(thread tid %d\): it met the fault of "
                     r"index_elementwise_kernel<.*> \(thread tid %d\)" % (b["tid"], a["tid"]),
                     c.stderr), c.stderr


def test_an_operator_assert_alone_is_its_kernels_own(fake_child):
    """An "operator()" assert line that the kernel's name does not fit (a
    functor's operator(), no closure type) in a thread of its own: no other
    thread's fault comes, so the text is this kernel's, reported in full."""
    c = run(fake_child, '''
        import cuda_debug
        fake.fake_set_print_thread(1)
        fake.fake_set_kernel(%r, 710, -1, b"functor_cond", -1, 0)
        fake.fake_set_assert_site(%r, b"Functor.cu", 9, b"operator()")
        try:
            with cuda_debug.launch_blocking():
                fake.fake_launch(%r, 0, 1, 1, 1, 32, 1, 1)    # LAUNCH
        except cuda_debug.DeviceAssertError as e:
            report(dict(kernel=e.kernel_mangled, msg=e.device_message, lineno=e.lineno,
                        met_by=e.met_by))
    ''' % (MUL_KERNEL, MUL_KERNEL, MUL_KERNEL))
    r = c.result
    assert r is not None, c
    assert r["kernel"] == MUL_KERNEL.decode() and r["lineno"] == c.line_of("# LAUNCH"), r
    assert "functor_cond" in (r["msg"] or "") and r["met_by"] is None, r
    assert "already dead" not in c.stderr, c.stderr
    assert "CUDA_ERROR_ASSERT) in vectorized_elementwise_kernel" in c.stderr, c.stderr


def test_thread_name_cut_inside_a_utf8_character(fake_child):
    """The OS thread name is 15 bytes: "worker" + 4 x "é" + the first byte of
    a fifth one. The report still comes (no UnicodeDecodeError)."""
    c = run(fake_child, '''
        import threading
        import cuda_debug, cuda_debug.testing as t
        out = {}

        def worker():
            name = ("worker" + "\\u00e9" * 5).encode()          # 16 bytes; the OS keeps 15
            out["set"] = fake.fake_set_thread_name(name, len(name))
            try:
                with cuda_debug.launch_blocking():
                    t.device_assert()                            # LAUNCH
            except BaseException as e:
                out.update(cls=type(e).__name__, text=repr(e)[:300],
                           kernel=getattr(e, "kernel", None), thread=getattr(e, "thread", None),
                           lineno=getattr(e, "lineno", None))

        th = threading.Thread(target=worker); th.start(); th.join()
        report(out)
    ''')
    r = c.result
    assert r is not None, c
    assert r["set"] == 0
    assert r["cls"] == "DeviceAssertError", r
    assert "check_index" in r["kernel"]
    assert r["lineno"] == c.line_of("# LAUNCH")
    assert r["thread"] is None or "worker" in r["thread"]


def test_thread_name_cut_inside_a_utf8_character_is_escaped_on_fd2(fake_child):
    """The fd-2 block written at the fault: the thread name "worke" + 3 x "学"
    + the first byte of a fourth (the OS keeps 15 bytes) is written with that
    byte escaped, so that stderr decodes as strict UTF-8. (At
    e598ab7 the byte 0xe5 went to fd 2 raw.)"""
    c = run(fake_child, """
        import threading
        import cuda_debug, cuda_debug.testing as t

        def worker():
            name = ("worke" + "\\u5b66" * 4).encode()          # 17 bytes; the OS keeps 15
            fake.fake_set_thread_name(name, len(name))
            try:
                with cuda_debug.launch_blocking():
                    t.device_assert()
            except cuda_debug.DeviceAssertError:
                pass

        th = threading.Thread(target=worker); th.start(); th.join()
    """)
    raw = c.stderr_bytes
    text = raw.decode("utf-8")                  # strict: raises on a raw cut character
    block = [l for l in text.splitlines() if ", thread worke" in l]
    assert block, c
    assert "thread worke\u5b66\u5b66\u5b66\\xe5 (tid " in block[0], block


def test_assert_flood_is_cut_visibly_and_reaches_fd2_in_order(fake_child):
    """1000 assert lines (about 120 KB): the report keeps the first lines and
    says it was cut; nothing hangs; fd 2 gets all 1000 lines, in order."""
    n = 1000
    c = run(fake_child, '''
        import cuda_debug
        fake.fake_set_kernel(b"flood", 710, %d, b"flood_cond", -1, 0)
        out = {}
        try:
            with cuda_debug.launch_blocking():
                fake.fake_launch(b"flood", 0, 1, 1, 1, 32, 1, 1)     # LAUNCH
        except cuda_debug.DeviceAssertError as e:
            out.update(kernel=e.kernel, msg=e.device_message)
        report(out)
    ''' % n)
    r = c.result
    assert r is not None, c
    assert "flood" in r["kernel"]
    msg = r["msg"] or ""
    first = "block: [0,0,0], thread: [3,0,0] Assertion `flood_cond` failed."
    assert first in msg
    kept = msg.count("Assertion `flood_cond` failed.")
    assert 1 <= kept < n, kept
    tail = msg[-300:].lower()
    assert any(w in tail for w in ("truncat", "cut", "more", "omitted", "dropped", "...",
                                   "\u2026")), "the report's cut is not visible: %r" % tail
    # fd 2: every line the driver printed, in order (thread index t -> block t // 1024,
    # thread t % 1024); cuda_debug's own fault-time report quotes the first one
    # on its "device:" line, which is not the driver's.
    driver_lines = "\n".join(l for l in c.stderr.splitlines() if "device: " not in l)
    seen = [int(b) * 1024 + int(t) for b, t in re.findall(
        r"block: \[(\d+),0,0\], thread: \[(\d+),0,0\] Assertion `flood_cond` failed\.",
        driver_lines)]
    assert len(seen) == n, "fd 2 got %d of %d assert lines" % (len(seen), n)
    assert seen == list(range(3, 3 + n))


def test_glibc_error_from_another_thread_during_sync_windows(fake_child):
    """Another thread calls glibc's error() (which locks and unlocks `stderr`)
    3000 times while this thread launches in a scope, then a kernel asserts:
    no hang, every error() line reaches fd 2, none is put into the report."""
    n = 3000
    c = run(fake_child, '''
        import cuda_debug, cuda_debug.testing as t
        fake.fake_set_kernel(b"busy", 0, 0, None, 0, 20)       # 20 us kernels
        out = {"launches": 0}
        fake.fake_glibc_error_from_thread(%d)
        with cuda_debug.launch_blocking():
            while not fake.fake_glibc_error_done(0):
                fake.fake_launch(b"busy", 0, 1, 1, 1, 32, 1, 1)
                out["launches"] += 1
        fake.fake_glibc_error_done(1)
        fake.fake_glibc_error_from_thread(%d)
        try:
            with cuda_debug.launch_blocking():
                for i in range(300):
                    fake.fake_launch(b"busy", 0, 1, 1, 1, 32, 1, 1)
                t.device_assert()                                  # LAUNCH
        except cuda_debug.DeviceAssertError as e:
            out.update(kernel=e.kernel, msg=e.device_message)
        fake.fake_glibc_error_done(1)
        report(out)
    ''' % (n, n), timeout=90)
    r = c.result
    assert r is not None, c
    assert "check_index" in r["kernel"]
    assert "fake glibc error" not in (r["msg"] or ""), "another thread's text in the report"
    assert "Assertion `idx[i] >= 0 && idx[i] < limit` failed." in (r["msg"] or "")
    got = re.findall(r"fake glibc error (\d+) of %d" % n, c.stderr)
    assert len(got) == 2 * n, "fd 2 got %d of %d error() lines" % (len(got), 2 * n)


def test_refusals_after_a_fault_are_consequences_and_the_first_fault_is_named(fake_child):
    """A framework that ignores launch results: the faulting kernel's launch
    returns 710 (synchronised in the scope), two later launches are refused by
    the dead context. The report at scope exit names the first fault (kernel
    and assert text), not the refused launches; if the error counts
    consequences (`consequences`), it counts the two."""
    c = run(fake_child, '''
        import cuda_debug
        fake.fake_set_kernel(b"first_fault", 710, -1, b"first_cond", -1, 0)
        out = {}
        try:
            with cuda_debug.launch_blocking():
                out["rc"] = [fake.fake_launch(b"first_fault", 0, 1, 1, 1, 32, 1, 1),   # LAUNCH
                             fake.fake_launch(b"innocent_one", 0, 1, 1, 1, 32, 1, 1),
                             fake.fake_launch(b"innocent_two", 0, 1, 1, 1, 32, 1, 1)]
        except cuda_debug.StickyCudaError as e:
            out.update(cls=type(e).__name__, kernel=e.kernel, msg=e.device_message,
                       refused=e.launch_refused, text=str(e),
                       consequences=getattr(e, "consequences", None))
        report(out)
    ''')
    r = c.result
    assert r is not None, c
    assert r["rc"] == [710, 710, 710]
    assert r["cls"] == "DeviceAssertError"
    assert "first_fault" in r["kernel"], r
    assert "first_cond" in (r["msg"] or ""), r
    assert not r["refused"]
    assert "innocent" not in r["text"].split("\n")[0]
    if r["consequences"] is not None:
        n = r["consequences"] if isinstance(r["consequences"], int) else len(r["consequences"])
        assert n == 2, r["consequences"]


@pytest.mark.parametrize("device", ["async", "sync"])
def test_scope_entered_after_an_earlier_fault_reports_it_before_the_scope(fake_child, device):
    """A kernel launched outside any scope is about to fault (async: it already
    faulted on the device thread, the host has not looked; sync: it is queued
    and faults when the stream is next drained). Entering a scope reports a
    sticky error "before this scope" - not CudaUnavailableError, and not under
    the in-scope kernel's name."""
    c = run(fake_child, '''
        import time
        import cuda_debug, cuda_debug.testing as t
        if sys.argv[1] == "async":
            fake.fake_set_async(1)
        t.device_assert()                  # outside any scope: returns at once
        time.sleep(0.1)
        out = {"sticky_on_device": fake.fake_sticky()}
        try:
            with cuda_debug.launch_blocking():                  # ENTER
                t.empty()                                       # IN_SCOPE
        except cuda_debug.CudaError as e:
            out.update(cls=type(e).__name__, text=str(e), kernel=e.kernel, lineno=e.lineno,
                       found_at=e.found_at, sticky=isinstance(e, cuda_debug.StickyCudaError))
        report(out)
    ''', args=[device])
    r = c.result
    assert r is not None, c
    assert r["sticky_on_device"] == (710 if device == "async" else 0)
    assert r["cls"] != "CudaUnavailableError", r
    assert r["sticky"] and r["cls"] == "DeviceAssertError", r
    assert "empty" not in (r["kernel"] or ""), "blamed on the in-scope kernel: %r" % r
    assert ("before this scope" in r["text"].lower()
            or "before" in str(r["found_at"] or "").lower()), r
    assert r["lineno"] == c.line_of("# ENTER"), r


def test_cupti_refusing_capture_ids_does_not_break_scopes(fake_child):
    """An older CUPTI does not know cuStreamBeginCaptureToGraph's ids
    (cuptiEnableCallback -> CUPTI_ERROR_INVALID_PARAMETER): scopes still work."""
    c = run(fake_child, '''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        refuse_cbids(["cuStreamBeginCaptureToGraph", "cuStreamBeginCaptureToGraph_ptsz"])
        out = {}
        try:
            with cuda_debug.launch_blocking():
                t.empty()
                out["synced"] = _core.stats()["synced"]
                t.device_assert()                               # LAUNCH
        except cuda_debug.CudaError as e:
            out.update(cls=type(e).__name__, text=str(e), kernel=e.kernel)
        out["active"] = _core.stats()["active"]
        report(out)
    ''')
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError", r
    assert r.get("synced") == 1
    assert "check_index" in r["kernel"]
    assert r["active"] == 0


@pytest.mark.parametrize("where", ["_scope", "package"])
def test_keyboard_interrupt_during_scope_entry_never_leaks_cupti(fake_child, where):
    """KeyboardInterrupt raised at the k-th line event while a scope is being
    entered, for every k - in cuda_debug/_scope.py's frames only, or in any of
    cuda_debug's frames: afterwards no scope is counted as open (`active` == 0:
    CUPTI is given back), the thread does not block, nothing hangs."""
    c = run(fake_child, '''
        import os
        import cuda_debug, cuda_debug.testing as t
        import cuda_debug._scope
        from cuda_debug import _core
        PKG = (cuda_debug._scope.__file__ if sys.argv[1] == "_scope"
               else os.path.dirname(cuda_debug.__file__))
        with cuda_debug.launch_blocking():       # warm-up: libraries loaded, modules imported
            t.empty()

        def enter_with_interrupt_at(k):
            count = [0]
            entered = [False]

            def local(frame, event, arg):
                if event == "line" and not entered[0]:
                    count[0] += 1
                    if count[0] == k:
                        raise KeyboardInterrupt("injected at line event %d" % k)
                return local

            def glob(frame, event, arg):
                return local if frame.f_code.co_filename.startswith(PKG) else None

            interrupted = False
            sys.settrace(glob)
            try:
                with cuda_debug.launch_blocking():
                    entered[0] = True
                    sys.settrace(None)
            except KeyboardInterrupt:
                interrupted = True
            finally:
                sys.settrace(None)
            return interrupted, count[0]

        import faulthandler
        leaks = []
        k = 1
        while k < 500:
            print("TRYING %d" % k, flush=True)
            # a lock left held by the interrupt hangs the next entry: dump and exit
            faulthandler.dump_traceback_later(10, exit=True)
            interrupted, events = enter_with_interrupt_at(k)
            faulthandler.cancel_dump_traceback_later()
            active, state = _core.stats()["active"], _core.thread_state()
            if active or state:
                leaks.append(dict(k=k, active=active, thread_state=state))
                break                       # no way to repair it from here: report
            if not interrupted:
                break
            k += 1
        t.empty()                           # the launch after the last scope: CUPTI detaches
        report(dict(leaks=leaks, points=k - 1, enabled=fake.fake_cupti_enabled(-1)))
    ''', args=[where])
    r = c.result
    if r is None:
        tried = re.findall(r"TRYING (\d+)", c.stdout)
        pytest.fail("scope entry hung after a KeyboardInterrupt at line event %s of an "
                    "earlier entry (a lock left held?):\n%s"
                    % (int(tried[-1]) - 1 if tried else "?", c.stderr[-3000:]))
    assert r["points"] >= 3          # the injection really hit the entry's lines
    assert r["leaks"] == [], "interrupts that left a scope open: %r" % r["leaks"]
    assert r["enabled"] == 0


@pytest.mark.parametrize("death", ["sigkill", "os._exit"])
def test_fault_time_report_survives_immediate_death(fake_child, death):
    """SPEC 6: the C fault path writes one compact block to fd 2 when the fault
    is found (kind, kernel, launching file:line, assert text), before control
    returns: the process killed right after (no Python) still leaves it."""
    c = run(fake_child, '''
        import os, signal
        import cuda_debug
        fake.fake_set_kernel(b"report_probe_kernel", 710, -1, b"probe_cond", -1, 0)
        fake.fake_set_assert_site(b"report_probe_kernel", b"probe.cu", 7, b"devfn")
        with cuda_debug.launch_blocking():
            fake.fake_launch(b"report_probe_kernel", 0, 1, 1, 1, 32, 1, 1)    # LAUNCH
            if sys.argv[1] == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
    ''', args=[death])
    assert c.returncode in (-9, 3), c
    err = c.stderr
    where = "user_script.py:%d" % c.line_of("# LAUNCH")
    assert "report_probe_kernel" in err, "no fault-time report on fd 2:\n" + err[-2000:]
    assert where in err, err[-2000:]
    block = err[max(0, err.find("report_probe_kernel") - 500):err.find(where) + 500]
    assert re.search(r"assert|710", block, re.I), block
    assert "probe_cond" in err


def test_fault_time_report_can_be_silenced(fake_child):
    """CUDA_DEBUG_REPORT=0: no fault-time block on fd 2 (the driver's own assert
    text is still forwarded)."""
    c = run(fake_child, '''
        import os
        import cuda_debug
        fake.fake_set_kernel(b"report_probe_kernel", 710, -1, b"probe_cond", -1, 0)
        fake.fake_set_assert_site(b"report_probe_kernel", b"probe.cu", 7, b"devfn")
        with cuda_debug.launch_blocking():
            fake.fake_launch(b"report_probe_kernel", 0, 1, 1, 1, 32, 1, 1)    # LAUNCH
            os._exit(3)
    ''', env={"CUDA_DEBUG_REPORT": "0"})
    assert c.returncode == 3, c
    assert "report_probe_kernel" not in c.stderr
    assert "user_script.py:%d" % c.line_of("# LAUNCH") not in c.stderr
    assert "probe_cond" in c.stderr


def test_a_triton_assert_naming_no_function_is_the_cause_not_a_consequence(fake_child):
    """Triton's device asserts print ``unknown`` where the function's name goes
    (``/tmp/torchinductor_root/..py:29: unknown: block: [0,0,0], ...``; seen on the
    H200 with a torch.compile'd index out of range). Printed from the driver's
    own thread, they name no kernel: the waiting launch's fault is the cause,
    reported in full at the fault, not "a wait ... failed because the CUDA
    context was already dead"."""
    c = run(fake_child, '''
        import cuda_debug
        fake.fake_set_print_thread(1)
        fake.fake_set_kernel(b"triton_poi_fused_index_mul_sum_0", 710, 2,
                             b"index out of bounds: 0 <= tmp5 < 100", -1, 0)
        fake.fake_set_assert_site(b"triton_poi_fused_index_mul_sum_0",
                                  b"/tmp/torchinductor_root/z7/cz7v.py", 29, b"unknown")
        try:
            with cuda_debug.launch_blocking():
                fake.fake_launch(b"triton_poi_fused_index_mul_sum_0", 0, 1, 1, 1, 32, 1, 1)  # LAUNCH
            cuda_debug.check()
        except cuda_debug.DeviceAssertError as e:
            report(dict(msg=e.device_message, lineno=e.lineno, consequences=e.consequences))
    ''')
    r = c.result
    assert r is not None, c
    assert "index out of bounds: 0 <= tmp5 < 100" in (r["msg"] or ""), r
    assert r["lineno"] == c.line_of("# LAUNCH")
    assert "cuda_debug: device-side assert (CUDA_ERROR_ASSERT) in triton_poi_fused_index_mul_sum_0" \
        in c.stderr, c
    assert "already dead" not in c.stderr, c


def test_assert_text_printed_by_a_driver_thread_reaches_the_report(fake_child):
    """The real driver (H200, CUDA 13) prints the assert text from a thread of
    its own during the wait, not from the waiting thread, one line in several
    writes: the report still
    carries it, taken by the kernel name it gives, and a pretty signature
    (``void ns::check_index(const T *, int, T) [with T = int]``) still names it."""
    c = run(fake_child, '''
        import cuda_debug, cuda_debug.testing as t
        fake.fake_set_print_thread(1)
        fake.fake_set_kernel(b"check_index", 710, -1, b"idx[i] >= 0 && idx[i] < limit", -1, 0)
        fake.fake_set_assert_site(b"check_index", b"fault_kernels.cu", 14,
                                  b"void cuda_debug_testing::check_index(const T *, int, T) "
                                  b"[with T = int]")
        try:
            with cuda_debug.launch_blocking():
                t.device_assert()  # LAUNCH
        except cuda_debug.DeviceAssertError as e:
            report(dict(msg=e.device_message, text=str(e), lineno=e.lineno))
    ''')
    r = c.result
    assert r is not None, c
    assert "Assertion `idx[i] >= 0 && idx[i] < limit` failed." in (r["msg"] or ""), r
    assert "device: fault_kernels.cu:14 block [0,0,0] thread [3,0,0]" in r["text"], r["text"]
    assert r["lineno"] == c.line_of("# LAUNCH")
    # the C block written at the fault has it too
    block = c.stderr[c.stderr.index("cuda_debug: device-side assert"):]
    assert "device: fault_kernels.cu:14: void cuda_debug_testing::check_index" in block, block


def test_frames_read_without_the_gil_name_the_launching_line(fake_child):
    """The fault record carries the launching thread's frames, read in C
    without the GIL (csrc/capture/frames.c, one reader per Python version): innermost
    first, the user's function and line, through library frames."""
    c = run(fake_child, '''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        def inner():
            t.device_assert()  # LAUNCH
        def outer():
            inner()  # CALL
        try:
            with cuda_debug.launch_blocking():
                outer()
        except cuda_debug.DeviceAssertError:
            pass
        rec = _core.faults(0)[-1]
        frames = [_core.location(i) for i in rec[17]]
        report(dict(supported=_core.FRAMES_SUPPORTED, frames=frames, complete=rec[18]))
    ''')
    r = c.result
    assert r is not None, c
    assert r["supported"] == 1
    frames = [tuple(f) for f in r["frames"]]
    # innermost first: cuda_debug.testing (library), then inner, outer, <module>
    lib = frames[0]
    assert lib[0].endswith("testing.py") and lib[3] == 0, frames          # LOC_LIBRARY
    user = [f for f in frames if f[0] == c.script]
    assert [(f[1], f[2]) for f in user][:2] == [
        ("inner", c.line_of("# LAUNCH")), ("outer", c.line_of("# CALL"))], frames
    assert user[2][1] == "<module>" and user[2][2] > c.line_of("# CALL"), frames
    assert all(f[3] == 1 for f in user)                                    # LOC_USER
    assert r["complete"] == 1


def test_driver_log_never_returns_lines_logged_after_the_fault(fake_child):
    """The driver-log ring keeps 64 lines: once more than that were logged after
    a fault, its own lines are gone, and the report must not show the newer
    lines that took their slots (the clamp was against the fault's count, not
    the ring's)."""
    c = run(fake_child, '''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        try:
            with cuda_debug.launch_blocking():
                t.device_assert()
        except cuda_debug.DeviceAssertError as e:
            first = [l for l in e.driver_log if "cuStreamSynchronize" in l]
        for _ in range(100):                      # 100 refusals, each logged by the driver
            fake.fake_launch(b"after_the_fault", 0, 1, 1, 1, 1, 1, 1)
        from cuda_debug import _report
        rec = _report.faults(0)[0]
        report(dict(first=first, log=[l.decode() for l in _core.driver_log(0, rec.log_end)]))
    ''')
    r = c.result
    assert r is not None, c
    assert r["first"], r                     # while fresh, the fault's own line was there
    assert not any("cuLaunchKernel" in line for line in r["log"]), r["log"]


def test_fault_launch_with_an_unknown_kind_says_so(fake_child):
    c = run(fake_child, '''
        from cuda_debug import _core, _libraries
        _libraries.ensure("cuda")
        try:
            _core.fault_launch(kind="no_such_kind")
        except ValueError as e:
            report(dict(error=str(e)))
    ''')
    assert c.result == {"error": "unknown fault kernel kind 'no_such_kind'"}, c


def test_watch_records_the_configuration_of_every_launch_api(fake_child):
    """Watch records read grid/block through the same parser as fault records,
    for cuLaunchKernel, cuLaunchKernelEx and cooperative launches alike."""
    c = run(fake_child, '''
        import cuda_debug
        from cuda_debug import _core
        with cuda_debug.watch():
            fake.fake_launch(b"plain_k", 0, 2, 1, 1, 32, 1, 1)
            fake.fake_launch_ex(b"ex_k", 0, 3, 1, 1, 64, 1, 1)
            fake.fake_launch_cooperative(b"coop_k", 0, 4, 1, 1, 128, 1, 1)
        recs = [_core.watch_record(s) for s in range(1, _core.watch_seq() + 1)]
        report([[r[2].decode(), list(r[3]), list(r[4])] for r in recs])
    ''')
    assert c.result == [["plain_k", [2, 1, 1], [32, 1, 1]], ["ex_k", [3, 1, 1], [64, 1, 1]],
                        ["coop_k", [4, 1, 1], [128, 1, 1]]], c


# `python -m cuda_debug run train.py`, run from the script's folder: the file
# name in the code objects is the relative "train.py", which is the user's
# code (at e598ab7 the C rule called every relative path
# library code, and the fd-2 block said "(library code: no frame of yours was
# found)" or named a frame outside the script).
_RUN_RELATIVE = '''
    import os, runpy
    os.chdir(%r)
    sys.argv = ["cuda_debug", "run", "train.py"]
    runpy.run_module("cuda_debug", run_name="__main__", alter_sys=True)   # python -m cuda_debug
'''

_TRAIN = {
    "fault": """import cuda_debug, cuda_debug.testing as t
t.empty()
t.device_assert()                               # LAUNCH
cuda_debug.check()
""",
    "sigterm": """import os, signal, time
from fake_cuda.child import fake
fake.fake_set_async(1)
fake.fake_set_kernel(b"hangs_forever", 0, 0, b"", -1, 60000000)
fake.fake_launch(b"hangs_forever", 0, 1, 1, 1, 32, 1, 1)     # LAUNCH
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(5)
print("not reached")
""",
}


@pytest.mark.parametrize("what", ["fault", "sigterm"])
def test_run_relative_script_path_is_the_users_code_in_the_fd2_block(fake_child, tmp_path, what):
    source = _TRAIN[what]
    (tmp_path / "train.py").write_text(source)
    c = run(fake_child, _RUN_RELATIVE % str(tmp_path))
    lineno = [i for i, l in enumerate(source.splitlines(), 1) if "# LAUNCH" in l][0]
    head = "cuda_debug (watch): device-side assert" if what == "fault" else \
        "cuda_debug (watch): SIGTERM while watching"
    lines = c.stderr.splitlines()
    starts = [i for i, l in enumerate(lines) if l.startswith(head)]
    assert starts, c
    block = lines[starts[0]:starts[0] + 8]
    launched = [l for l in block if l.startswith("  launched at ")]
    # `run` gives the script its absolute path, as `python train.py` does (3.9+)
    assert launched, block
    where = launched[0][len("  launched at "):]
    assert where.endswith("train.py:%d in <module>" % lineno), block
    assert os.path.samefile(where.rsplit(":", 1)[0], str(tmp_path / "train.py")), block
    assert "library code" not in c.stderr, c
    if what == "sigterm":
        assert c.returncode == -15 and "not reached" not in c.stdout, c
    else:
        assert c.returncode == 3, c


# A framework's teardown meets the dead context inside its `except` block and
# raises a second error (Lightning's trainer.fit does): the scope converts
# that later exception. (Its traceback once ended at the teardown.)
# the user must get the traceback through the launching line, the framework's
# exception from the launch in the chain, and the later one named as a
# consequence.
_LATER = {
    "same_frame": '''
        with cuda_debug.launch_blocking():
            try:
                check(fake.fake_launch(b"bad_label", 0, 1, 1, 1, 32, 1, 1))   # LAUNCH
            except RuntimeError:
                raise ValueError("teardown failed too")                      # LATER
    ''',
    "nested": '''
        def training_step():
            check(fake.fake_launch(b"bad_label", 0, 1, 1, 1, 32, 1, 1))   # LAUNCH

        def teardown():
            raise ValueError("teardown failed too")                      # LATER

        def fit():
            try:
                training_step()                                          # STEP
            except BaseException:
                teardown()                                               # TEARDOWN
                raise

        with cuda_debug.launch_blocking():
            fit()                                                        # FIT
    ''',
}


@pytest.mark.parametrize("shape", sorted(_LATER))
def test_a_later_exception_from_an_except_block_is_reported_as_a_consequence(fake_child, shape):
    body = textwrap.indent(textwrap.dedent(_LATER[shape]), "    ")
    c = run(fake_child, textwrap.dedent('''
        import pickle, traceback
        import cuda_debug
        fake.fake_set_kernel(b"bad_label", 710, -1, b"t >= 0 && t < n_classes", -1, 0)

        def check(rc):
            if rc:
                raise RuntimeError("CUDA error: device-side assert triggered (%d)" % rc)

        try:
        ''') + body + textwrap.dedent('''
        except BaseException as e:
            report(dict(cls=type(e).__name__, lineno=e.lineno, text=str(e),
                        tb=[[f.filename, f.lineno, f.name]
                            for f in traceback.extract_tb(e.__traceback__)],
                        cause=repr(e.__cause__), context=repr(e.__context__),
                        later=getattr(e, "later_exception", None),
                        again=str(pickle.loads(pickle.dumps(e)))))
        '''))
    r = c.result
    assert r is not None, c
    launch, later = c.line_of("# LAUNCH"), c.line_of("# LATER")
    assert r["cls"] == "DeviceAssertError" and r["lineno"] == launch, r
    lines = [(f[0], f[1]) for f in r["tb"]]
    # the traceback reaching the user goes through the launching line and ends
    # where the framework raised there
    assert (c.script, launch) in lines, r["tb"]
    assert r["tb"][-1][2] == "check", r["tb"]
    assert (c.script, later) not in lines, r["tb"]
    if shape == "nested":
        tail = [l for l in lines if l[0] == c.script][-4:]
        assert tail == [(c.script, c.line_of(m)) for m in ("# FIT", "# STEP", "# LAUNCH")] + \
            [(c.script, c.line_of('raise RuntimeError("CUDA error'))], r["tb"]
    # the framework's exception from the launch is the cause; the later one
    # the context, and the report says it is a consequence
    assert r["cause"].startswith("RuntimeError('CUDA error: device-side assert"), r
    assert r["context"] == "ValueError('teardown failed too')", r
    where = "%s:%d in %s" % (c.script, later, "teardown" if shape == "nested" else "<module>")
    assert r["later"] == "ValueError: teardown failed too, raised at %s" % where, r
    assert "  later: ValueError: teardown failed too, raised at %s, while handling this " \
           "fault: a consequence, not the cause" % where in r["text"].splitlines(), r["text"]
    assert r["again"] == r["text"]


# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# Reports you can trust (SPEC 6), on a real GPU, in child processes: the
# traceback ends at the launching line, swallowed faults keep their line, two
# threads each get their own report, hostile thread names, faults before a
# scope, the report written at fault time, generated code is library code.
# ======================================================================================


CATCH = """
import cuda_debug, traceback
def describe(e):
    tb = traceback.extract_tb(e.__traceback__)
    return dict(cls=type(e).__name__, code=e.code, kernel=e.kernel, filename=e.filename,
                lineno=e.lineno, text=str(e), before=e.before_scope,
                tb_last=[tb[-1].filename, tb[-1].lineno] if tb else None,
                tb_lines=[f.lineno for f in tb if f.filename == __file__],
                device_message=e.device_message, consequences=e.consequences)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("form", ["with", "decorator"])
def test_traceback_ends_at_the_launching_line(child, form):
    needs("torch")
    body = """
import torch, torch.nn.functional as F
logits = torch.randn(4, 3, device="cuda")
target = torch.tensor([0, 1, 7, 2], device="cuda")
torch.cuda.synchronize()
def step():
    return F.cross_entropy(logits, target)  # LAUNCH
"""
    if form == "with":
        body += """
try:
    with cuda_debug.launch_blocking():
        step()
except cuda_debug.CudaError as e:
    report(describe(e))
"""
    else:
        body += """
step = cuda_debug.launch_blocking()(step)
try:
    step()
except cuda_debug.CudaError as e:
    report(describe(e))
"""
    c = child(CATCH + body)
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError" and r["lineno"] == c.line_of("# LAUNCH"), r
    assert c.line_of("# LAUNCH") == r["tb_lines"][-1], r      # the printed traceback ends there


@pytest.mark.gpu
def test_swallowed_fault_names_its_line(child):
    needs("torch")
    c = child(CATCH + """
import torch
x = torch.zeros(4, device="cuda")
i = torch.tensor([9], device="cuda")
torch.cuda.synchronize()
try:
    with cuda_debug.launch_blocking():
        try:
            y = x[i]  # LAUNCH
        except Exception:
            pass
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    assert r is not None, c
    assert r["lineno"] == c.line_of("# LAUNCH"), r


@pytest.mark.gpu
def test_two_threads_in_scopes_each_get_their_report(child):
    needs("torch")
    c = child(CATCH + """
import threading, time, torch
import cuda_debug.testing as t
out = {}
go = threading.Event()
def faulty():
    try:
        with cuda_debug.launch_blocking():
            go.wait()
            t.device_assert()  # LAUNCH
    except BaseException as e:
        out["faulty"] = describe(e) if isinstance(e, cuda_debug.CudaError) else repr(e)
def healthy():
    x = torch.ones(1 << 20, device="cuda")
    try:
        with cuda_debug.launch_blocking():
            go.set()
            for _ in range(2000):
                x.add_(1)
    except BaseException as e:
        out["healthy"] = describe(e) if isinstance(e, cuda_debug.CudaError) else repr(e)
a, b = threading.Thread(target=faulty), threading.Thread(target=healthy)
a.start(); b.start(); a.join(); b.join()
report(out)
""")
    r = c.result
    assert r is not None, c
    f = r["faulty"]
    assert isinstance(f, dict) and f["cls"] == "DeviceAssertError", r
    assert "check_index" in f["kernel"] and f["lineno"] == c.line_of("# LAUNCH"), f
    assert "Assertion" in (f["device_message"] or ""), f
    h = r.get("healthy")
    assert isinstance(h, dict) and h["cls"] == "DeviceAssertError", r   # the cause, named
    assert "check_index" in (h["kernel"] or ""), h


@pytest.mark.gpu
def test_a_thread_meeting_another_threads_index_assert_names_that_kernel(child):
    """Another thread's fault is named (3 of 3 runs named ours before): thread A in launch_blocking() indexes
    out of range (PyTorch's index kernel: its assert prints "operator()");
    thread B, in its own launch_blocking(), runs x * 2 until its wait finds
    the context dead. B's report names A's index kernel and A's line and says
    where B met it, never B's MulFunctor kernel with A's text."""
    needs("torch")
    c = child(CATCH + """
import threading, torch
out = {}
go = threading.Event()
x = torch.zeros(1 << 20, device="cuda")
i = torch.tensor([1 << 22], device="cuda")
y = torch.ones(1 << 24, device="cuda")
torch.cuda.synchronize()
def faulty():
    try:
        with cuda_debug.launch_blocking():
            go.wait()
            x[i]  # LAUNCH_A
    except BaseException as e:
        out["A"] = describe(e) if isinstance(e, cuda_debug.CudaError) else repr(e)
def healthy():
    try:
        with cuda_debug.launch_blocking():
            go.set()
            for _ in range(20000):
                y * 2  # LAUNCH_B
    except BaseException as e:
        out["B"] = dict(describe(e), met_by=e.met_by) if isinstance(e, cuda_debug.CudaError) \
            else repr(e)
a, b = threading.Thread(target=faulty), threading.Thread(target=healthy)
a.start(); b.start(); a.join(); b.join()
report(out)
""")
    r = c.result
    assert r is not None, c
    a, b = r.get("A"), r.get("B")
    assert isinstance(a, dict) and a["cls"] == "DeviceAssertError", r
    assert "index" in a["kernel"] and a["lineno"] == c.line_of("# LAUNCH_A"), a
    assert isinstance(b, dict) and b["cls"] == "DeviceAssertError", r
    assert "MulFunctor" not in (b["kernel"] or ""), b
    assert b["kernel"] == a["kernel"] and b["lineno"] == c.line_of("# LAUNCH_A"), b
    assert "index out of bounds" in (b["device_message"] or ""), b
    assert "user_script.py:%d" % c.line_of("# LAUNCH_B") in (b["met_by"] or ""), b
    print(b["text"])                  # the two-thread report, for the lead's note


@pytest.mark.gpu
def test_thread_name_cut_inside_utf8(child):
    c = child(CATCH + """
import ctypes, threading
import cuda_debug.testing as t
libc = ctypes.CDLL(None)
out = {}
def work():
    libc.prctl(15, "ééééééé€".encode()[:15])    # PR_SET_NAME, cut inside a character
    try:
        with cuda_debug.launch_blocking():
            t.device_assert()  # LAUNCH
    except cuda_debug.CudaError as e:
        out.update(describe(e)); out["thread"] = "\\ufffd" in e.thread or "é" in e.thread
th = threading.Thread(target=work); th.start(); th.join()
report(out)
""")
    r = c.result
    assert r is not None and r["cls"] == "DeviceAssertError", c
    assert r["lineno"] == c.line_of("# LAUNCH") and r["thread"], r


@pytest.mark.gpu
def test_fault_before_a_scope_is_not_blamed_on_it(child):
    c = child(CATCH + """
import cuda_debug.testing as t
t.spin(0.2)
t.device_assert()  # EARLIER
try:
    with cuda_debug.launch_blocking():  # ENTER
        t.empty()
except cuda_debug.CudaError as e:
    report(describe(e))
""")
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError" and r["before"] is True, r
    assert "before this scope" in r["text"], r["text"]
    assert "CUPTI" not in r["text"]


@pytest.mark.gpu
def test_report_written_at_fault_time_survives_os_exit(child):
    c = child("""
import os, cuda_debug, cuda_debug.testing as t
with cuda_debug.launch_blocking():
    try:
        t.device_assert()  # LAUNCH
    except Exception:
        os._exit(7)
""")
    assert c.returncode == 7, c
    assert "cuda_debug: device-side assert (CUDA_ERROR_ASSERT) in check_index<int>" in c.stderr, c
    assert "launched at %s:%d" % (c.script, c.line_of("# LAUNCH")) in c.stderr, c.stderr
    assert "Assertion `idx[i] >= 0 && idx[i] < limit` failed." in c.stderr
    silenced = child(c.source.split("\n", 2)[2], env={"CUDA_DEBUG_REPORT": "0"})
    assert "cuda_debug: device-side assert" not in silenced.stderr, silenced


COMPILED = """
import torch
@torch.compile
def f(x, i):
    return (x[i] * 2).sum()  # SOURCE
x = torch.randn(100, device="cuda")
i = torch.tensor([5], device="cuda")
f(x, i)
torch.cuda.synchronize()
i.fill_(500)
try:
    with cuda_debug.%s():
        f(x, i)  # LAUNCH
        torch.cuda.synchronize()
except cuda_debug.CudaError as e:
    report(dict(describe(e), compiled=e.compiled_function))
"""


@pytest.mark.gpu
@pytest.mark.parametrize("scope", ["launch_blocking", "watch"])
def test_torch_compile_names_the_call_and_the_compiled_function(child, scope):
    """A bad index inside a torch.compile'd function is located at the call
    line (once: the @torch.compile line, TorchDynamo's frame), the compiled
    function named, and the source line Inductor's line map gives (the last
    node the kernel fused: the same line here) or "source line unknown"; never the decorator or def line, never Inductor's generated code."""
    needs("torch")
    c = child(CATCH + COMPILED % scope, timeout=300)
    r = c.result
    assert r is not None, c
    assert r["kernel"].startswith("triton_"), r
    assert r["filename"] == c.script and r["lineno"] == c.line_of("# LAUNCH"), r
    assert r["compiled"] == "f", r
    head = "\n  torch.compile: inside torch.compile'd f (%s:" % c.script
    assert head in r["text"], r["text"]
    source = "fused up to %s:%d in f:  return (x[i] * 2).sum()  # SOURCE (Inductor's line map)" \
        % (c.script, c.line_of("# SOURCE"))
    assert source in r["text"] or "source line unknown" in r["text"], r["text"]
    # Inductor's source nodes: from the generated module in the launching stack
    # (launch_blocking); the watch ring keeps 4 frames, so there the loaded
    # module that defines the kernel is looked up (or its absence said)
    assert "Source Nodes: [" in r["text"] or (
        scope == "watch" and "generated code for this kernel was not found" in r["text"]), \
        r["text"]
    for marker in ("@torch.compile", "def f(x, i)"):
        assert "%s:%d in " % (c.script, c.line_of(marker)) not in r["text"] + c.stderr, \
            (marker, r["text"], c.stderr)
    # the fd-2 block written at the fault names the call too
    assert "launched at %s:%d in <module>, inside torch.compile'd f" % (
        c.script, c.line_of("# LAUNCH")) in c.stderr, c.stderr


LATER = """
import torch, torch.nn.functional as F
logits = torch.randn(4, 3, device="cuda")
target = torch.tensor([0, 1, 7, 2], device="cuda")
torch.cuda.synchronize()
def training_step():
    return F.cross_entropy(logits, target)  # LAUNCH
def fit():
    try:
        training_step()
    except BaseException:
        torch.cuda.synchronize()  # TEARDOWN: the dead context raises again
        raise
try:
    with cuda_debug.launch_blocking():
        fit()
except cuda_debug.CudaError as e:
    report(dict(describe(e), later=e.later_exception, cause=type(e.__cause__).__name__,
                context=type(e.__context__).__name__))
"""


@pytest.mark.gpu
def test_a_later_exception_from_teardown_is_a_consequence(child):
    """A second error in a teardown, as Lightning's trainer.fit raises it: the teardown in
    the except block meets the dead context and raises again. The traceback
    still ends at the launching line; the cause is torch's error from the
    launch; the later one is named as a consequence."""
    needs("torch")
    c = child(CATCH + LATER)
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError" and r["lineno"] == c.line_of("# LAUNCH"), r
    assert c.line_of("# LAUNCH") in r["tb_lines"], r
    assert c.line_of("# TEARDOWN") not in r["tb_lines"], r
    assert r["cause"] == "AcceleratorError" and r["context"] == "AcceleratorError", r
    # named where it was raised: torch.cuda.synchronize, called by the teardown
    assert r["later"] and r["later"].startswith("torch.AcceleratorError: CUDA error"), r
    assert r["later"].endswith(" in synchronize"), r
    assert "\n  later: torch.AcceleratorError: CUDA error" in r["text"], r["text"]
    assert " in synchronize, while handling this fault: a consequence, not the cause" in \
        r["text"], r["text"]
