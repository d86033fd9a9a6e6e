"""A context reset while (or between) watching, on the fake driver: CPU only.

``cuDevicePrimaryCtxReset`` (what ``cudaDeviceReset`` does) destroys the
primary context and the driver hands back the SAME ``CUcontext`` pointer for
the new one (seen on the H200). The fake does the same (tests/fake_cuda): it
unmaps the old context's pinned allocations, forgets its registrations, and
gives the new context a new id (``cuCtxGetId``, CUPTI's ``contextUid``).

Watch mode once keyed its completion slots by the pointer: after a reset every
marker write failed and reading the slots (``_core.watch_streams``, every
culprit report, the SIGABRT/SIGTERM handler) died with SIGSEGV; the fault
records kept the old pointer as a dead context, so a real fault in the new
context was printed as a one-line consequence.
"""
import signal

import pytest

LAUNCH = "fake.fake_launch(%s, 0, 1, 1, 1, 32, 1, 1)"


def _watch_then_reset(body_after, before=""):
    return '''
        import os, signal
        import cuda_debug
        from cuda_debug import _core
        out = {}
        %s
        with cuda_debug.watch():
            for i in range(5):
                %s
            fake.fake_ctx_sync()
            out["uid_before"] = fake.fake_ctx_uid()
            out["reset"] = fake.fake_primary_ctx_reset()
            out["uid_after"] = fake.fake_ctx_uid()
    ''' % (before, LAUNCH % 'b"fine_old"') + body_after


@pytest.mark.parametrize("resource_callbacks", [True, False])
def test_reading_slots_after_a_reset_never_faults(fake_child, resource_callbacks):
    """With CUPTI's context-destroy callback the old context's slots are
    retired; without it (an older CUPTI) the slots are still our own memory:
    either way the search reads no freed memory, and markers work in the new
    context."""
    c = fake_child(_watch_then_reset('''
            out["incomplete"] = _core.watch_streams(0)      # SIGSEGV before the fix
            for i in range(3):
                %s
            fake.fake_ctx_sync()
            out["incomplete_new"] = _core.watch_streams(0)
            st = _core.stats()
            out["write_rc"] = st["watch_write_rc"]
            out["unmarked"] = st["unmarked"]
            out["done"] = [_core.watch_record(s)[11] for s in range(6, _core.watch_seq() + 1)]
        report(out)
    ''' % (LAUNCH % 'b"fine_new"'), before="fake.fake_refuse_resource(%d)" % (not resource_callbacks)),
        env={"CUDA_DEBUG_WATCH_EXACT": "1"})      # each launch's own marker: `done` per record
    assert c.returncode == 0, c
    r = c.result
    assert r["reset"] == 0 and r["uid_after"] == r["uid_before"] + 1
    assert r["incomplete"] == [] and r["incomplete_new"] == [], r
    assert r["write_rc"] == 0 and r["unmarked"] == 0, r     # markers work in the new context
    assert r["done"] == [True, True, True], r


def test_reset_between_two_watches(fake_child):
    """A fault, then a reset while nothing is subscribed (no callback can say
    so), then another fault: the next watch() finds the new context by its
    id, never writes or reads the freed slots, and does not blame the old
    context's unfinished launch for the new fault."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        out = {}
        t.empty()                    # the primary context retained: check() synchronises it
        fake.fake_set_kernel(b"bad_old", 700, 0, None, 0, 0)
        fake.fake_set_kernel(b"bad_new", 700, 0, None, 0, 0)
        try:
            with cuda_debug.watch():
                for i in range(3):
                    %s
                %s
                %s
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out["old"] = e.kernel
        out["reset"] = fake.fake_primary_ctx_reset()
        try:
            with cuda_debug.watch():
                %s
                %s  # CULPRIT
                %s
                out["incomplete"] = len(_core.watch_streams(0))  # SIGSEGV before the fix
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out.update(kernel=e.kernel, lineno=e.lineno, exact=e.exact)
        out["write_rc"] = _core.stats()["watch_write_rc"]
        report(out)
    ''' % (LAUNCH % 'b"fine_old"', LAUNCH % 'b"bad_old"', LAUNCH % 'b"after_old"',
           LAUNCH % 'b"fine_new"', LAUNCH % 'b"bad_new"', LAUNCH % 'b"after_new"'),
        env={"CUDA_DEBUG_WATCH_EXACT": "1"})      # an illegal address: exact by markers only
    assert c.returncode == 0, c
    r = c.result
    assert r["old"] == "bad_old" and r["reset"] == 0, r
    assert r["incomplete"] == 1, r                # the new context's stream only
    assert r["write_rc"] == 0, r                  # every marker of the new context written
    assert r["kernel"] == "bad_new" and r["lineno"] == c.line_of("# CULPRIT"), r
    assert r["exact"] is True, r


def test_fault_in_the_new_context_is_the_cause_not_a_consequence(fake_child):
    """A fault, a reset, another fault: the second is reported in full (the
    dead-context list is keyed by the context's id, not its pointer)."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        out = {"errors": []}
        for round in range(2):
            try:
                with cuda_debug.launch_blocking():
                    t.device_assert()
            except cuda_debug.CudaError as e:
                out["errors"].append((type(e).__name__, e.kernel, e.consequences))
            fake.fake_primary_ctx_reset()
        report(out)
    ''')
    assert c.returncode == 0, c
    errors = c.result["errors"]
    assert [e[0] for e in errors] == ["DeviceAssertError"] * 2, errors
    assert all("check_index" in e[1] for e in errors), errors
    # the fd-2 block of the second fault is the full one, not a one-line echo
    assert c.stderr.count("cuda_debug: device-side assert (CUDA_ERROR_ASSERT) in check_index") \
        == 2, c.stderr
    assert "already dead" not in c.stderr, c.stderr


def test_signal_report_after_a_reset_reads_no_freed_memory(fake_child):
    """SIGTERM while watching, after a reset: the handler's search of the
    slots ends in the report and the default action, not in SIGSEGV."""
    c = fake_child(_watch_then_reset('''
            fake.fake_set_async(1)
            fake.fake_set_kernel(b"slow_new", 0, 0, None, 0, 2000000)
            %s  # STUCK
            os.kill(os.getpid(), signal.SIGTERM)
    ''' % (LAUNCH % 'b"slow_new"')))
    assert c.returncode == -signal.SIGTERM, c
    assert "cuda_debug (watch): SIGTERM while watching" in c.stderr, c.stderr
    assert "slow_new" in c.stderr, c.stderr
    assert "fine_old" not in c.stderr, c.stderr      # the old context's launches are retired
