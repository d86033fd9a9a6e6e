import pytest
from conftest import needs
"""Leaving the last watch() leaves nothing behind, against the fake driver.

An unsubscribed CUPTI still sits in the driver's API dispatch: on the H100 a
tiny-op loop cost 1.06-1.09x after one watch() was entered and left. So the
last scope to close asks for CUPTI to leave the process: the next launch's
callback, at its API exit (CUPTI's documented place), calls cuptiFinalize,
and the next entry subscribes again (CUPTI initialises anew). Not after
another client used CUPTI (a profiler: its next window would find its CUPTI
state gone): stats()["cupti_residue"] says why the dispatch stays then. The
fake's cuptiFinalize drops every subscription, counts a finalize made outside
an API-exit callback, and counts the next subscribe as a new initialisation.
"""
L = "1, 1, 1, 32, 1, 1"


@pytest.fixture(autouse=True)
def detach_on(monkeypatch):
    """These tests are of the detach, opt-in (CUDA_DEBUG_CUPTI_DETACH=1): the
    children inherit it (a test's own env overrides it)."""
    monkeypatch.setenv("CUDA_DEBUG_CUPTI_DETACH", "1")


def test_the_last_watch_detaches_cupti_and_the_next_watch_takes_it_again(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        t.empty()
        fake.fake_set_kernel(b"bad_k", 710, 1, b"idx < n", -1, 0)
        out = {}
        with cuda_debug.watch():
            fake.fake_launch(b"ok_k", 0, %s)
        s = _core.stats()
        out["after_exit"] = (s["subscribed"], s["cupti_residue"][:8])
        fake.fake_launch(b"ok_k", 0, %s)          # its callback detaches
        s = _core.stats()
        out["after_launch"] = (s["subscribed"], s["detaches"], s["cupti_residue"],
                               fake.fake_cupti_finalizes(), fake.fake_cupti_enabled(-1))
        callbacks = fake.fake_cupti_enabled(-1)
        try:
            with cuda_debug.watch():
                out["inits"] = fake.fake_cupti_inits()
                fake.fake_launch(b"bad_k", 0, %s)
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out["kernel"] = e.kernel
        out["outside_exit"] = fake.fake_cupti_finalizes_outside_exit()
        report(out)
    ''' % (L, L, L))
    r = c.result
    assert r is not None, c
    assert r["after_exit"] == [True, "pending:"], r
    assert r["after_launch"] == [False, 1, "", 1, 0], r
    assert r["inits"] == 1 and r["kernel"] == "bad_k", r
    assert r["outside_exit"] == 0, r


def test_detach_off_keeps_cupti_loaded_and_says_why(fake_child):
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        t.empty()
        with cuda_debug.watch():
            t.empty()
        t.empty()
        s = _core.stats()
        report(dict(sub=s["subscribed"], detaches=s["detaches"], why=s["cupti_residue"],
                    finalizes=fake.fake_cupti_finalizes()))
    ''', env={"CUDA_DEBUG_CUPTI_DETACH": "0"})
    r = c.result
    assert r is not None, c
    assert (r["sub"], r["detaches"], r["finalizes"]) == (False, 0, 0), r
    assert r["why"].startswith("CUDA_DEBUG_CUPTI_DETACH=0"), r


def test_no_detach_after_a_profiler_used_cupti(fake_child):
    """A profiler window inside a watch (hand-over, CUPTI taken back after):
    leaving the watch unsubscribes but never finalizes CUPTI, and says so."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core, _dispatch_fallback
        t.empty()
        with cuda_debug.watch():
            t.empty()
            _dispatch_fallback.hand_over()
            fake.fake_hold_cupti(b"Kineto")
            t.empty()
            fake.fake_hold_cupti(None)
            back = _dispatch_fallback.take_back()
            t.empty()
        t.empty()
        t.empty()
        s = _core.stats()
        report(dict(back=back, sub=s["subscribed"], detaches=s["detaches"], why=s["cupti_residue"],
                    finalizes=fake.fake_cupti_finalizes()))
    ''')
    r = c.result
    assert r is not None, c
    assert (r["back"], r["sub"], r["detaches"], r["finalizes"]) == (1, False, 0, 0), r
    assert r["why"].startswith("a profiler (torch.profiler/Kineto) used CUPTI"), r


def test_no_detach_after_another_client_held_cupti(fake_child):
    c = fake_child('''
        import warnings
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        t.empty()
        fake.fake_hold_cupti(b"Nsight Systems")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with cuda_debug.watch():          # opens without CUPTI
                t.empty()
        fake.fake_hold_cupti(None)
        with cuda_debug.watch():              # takes it
            t.empty()
            sub = _core.stats()["subscribed"]
        t.empty()
        s = _core.stats()
        report(dict(sub_inside=sub, sub=s["subscribed"], why=s["cupti_residue"],
                    finalizes=fake.fake_cupti_finalizes()))
    ''')
    r = c.result
    assert r is not None, c
    assert (r["sub_inside"], r["sub"], r["finalizes"]) == (True, False, 0), r
    assert r["why"].startswith("another client held CUPTI"), r


def test_watch_entered_and_left_10000_times_from_4_threads_with_detaches(fake_child):
    """4 threads each enter and leave a watch 2,500 times, each launching
    inside and outside it (a launch outside may detach CUPTI; another thread's
    entry takes it back or subscribes again, CUPTI initialised anew). Nothing
    hangs or crashes; every finalize is made at an API exit; the counts agree;
    then a watch names a fault."""
    c = fake_child('''
        import threading
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core
        t.empty()
        fake.fake_set_kernel(b"bad_k", 710, 1, b"idx < n", -1, 0)
        errors = []
        def worker():
            try:
                for i in range(2500):
                    with cuda_debug.watch():
                        t.empty()
                    t.empty()
            except BaseException as e:
                errors.append(repr(e))
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=240)
        hung = sum(th.is_alive() for th in threads)
        t.empty()                                  # a detach asked for last: done here
        s = _core.stats()
        out = dict(errors=errors, hung=hung, watching=s["watching"], sub=s["subscribed"],
                   detaches=s["detaches"], subscribes=s["subscribes"], why=s["cupti_residue"],
                   finalizes=fake.fake_cupti_finalizes(), inits=fake.fake_cupti_inits(),
                   outside=fake.fake_cupti_finalizes_outside_exit(),
                   enabled=fake.fake_cupti_enabled(-1))
        try:
            with cuda_debug.watch():
                fake.fake_launch(b"bad_k", 0, %s)
                cuda_debug.check()
        except cuda_debug.CudaError as e:
            out["kernel"] = e.kernel
        report(out)
    ''' % L, timeout=300)
    r = c.result
    assert r is not None, c
    assert r["errors"] == [] and r["hung"] == 0, r
    assert r["watching"] == 0 and not r["sub"] and r["why"] == "", r
    assert r["enabled"] == 0, r                        # no callback left on in the fake
    assert r["detaches"] >= 1 and r["finalizes"] == r["detaches"], r
    assert r["outside"] == 0, r
    # every detach but the last was followed by a new subscription (CUPTI
    # initialised again); one first subscription before any detach
    assert r["inits"] == r["detaches"] - 1 and r["subscribes"] == r["detaches"], r
    assert r["kernel"] == "bad_k", r


def test_a_profiler_starting_while_the_detach_is_pending_gets_cupti(fake_child):
    """Between the last exit and the next launch the subscription is still ours
    (the detach waits for an API exit): a profiler starting then (the guard
    around Kineto's entry points: hand_over) is given CUPTI at once, and
    nothing finalizes it under the profiler."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core, _dispatch_fallback
        t.empty()
        with cuda_debug.watch():
            t.empty()
        pending = _core.stats()["cupti_residue"][:8]
        _dispatch_fallback.hand_over()            # torch.profiler starting
        fake.fake_hold_cupti(b"Kineto")
        t.empty()
        t.empty()
        s = _core.stats()
        report(dict(pending=pending, sub=s["subscribed"], enabled=fake.fake_cupti_enabled(-1),
                    finalizes=fake.fake_cupti_finalizes(), why=s["cupti_residue"]))
    ''')
    r = c.result
    assert r is not None, c
    assert r["pending"] == "pending:", r
    assert (r["sub"], r["enabled"], r["finalizes"]) == (0, 0, 0), r
    assert r["why"].startswith("a profiler (torch.profiler/Kineto) used CUPTI"), r


import pytest  # noqa: E402

# ======================================================================================
# On a real GPU (every test below carries the gpu marker)
#
# Leaving the last watch() detaches CUPTI (cuptiFinalize), on a real GPU.
#
# Each program runs in its own Python (a sticky fault kills the CUDA context).
# The CPU tests of the same cycle: the tests above.
# ======================================================================================


@pytest.mark.gpu
def test_watches_after_detaches_name_a_fault_at_its_line(child):
    """20 cycles of a watch() with PyTorch (routed) and cuBLAS (CUPTI) launches,
    a launch outside after each (CUPTI detached, initialised again at the next
    entry); then a fault in a watch is named at its line, the kernel exact."""
    needs("torch")
    c = child("""
import torch, cuda_debug
from cuda_debug import _core
emb = torch.nn.Embedding(10, 4).cuda()
bad = torch.tensor([12], device="cuda")
a = torch.randn(64, 64, device="cuda")
x = torch.zeros(1, device="cuda")
torch.cuda.synchronize()
out = {}
for i in range(20):
    with cuda_debug.watch():
        x.add_(1)
        a = (a @ a).clamp_(-1, 1)
    x.add_(1)                                  # its callback detaches CUPTI
    torch.cuda.synchronize()
s = _core.stats()
out.update(detaches=s["detaches"], subscribed=s["subscribed"], residue=s["cupti_residue"],
           routed=s["launch_hooks"]["routed"], x=x.item())
try:
    with cuda_debug.watch():
        y = emb(bad)  # CULPRIT
        for _ in range(40):
            x.add_(1)
        y.sum().item()
except cuda_debug.CudaError as e:
    out.update(kernel=e.kernel, lineno=e.lineno, exact=e.exact)
report(out)
""")
    r = c.result
    assert r is not None, c
    assert r["detaches"] == 20 and not r["subscribed"] and r["residue"] == "", r
    assert r["routed"] >= 20 and r["x"] == 40.0, r
    assert "index" in r["kernel"].lower() and r["exact"] is True, r
    assert r["lineno"] == c.line_of("# CULPRIT"), r


@pytest.mark.gpu
def test_after_a_profiler_window_cupti_stays_and_the_next_window_records(child):
    """A torch.profiler window inside a watch: leaving the watch does not
    finalize CUPTI under Kineto (stats() says why), and a second window, after
    the watch, still records GPU events."""
    needs("torch")
    c = child("""
import warnings, torch, cuda_debug
from cuda_debug import _core
from torch.profiler import profile, ProfilerActivity
x = torch.zeros(1, device="cuda")
torch.cuda.synchronize()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    with cuda_debug.watch():
        x.add_(1)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            x.add_(1)
            torch.cuda.synchronize()
        x.add_(1)
x.add_(1)
torch.cuda.synchronize()
s = _core.stats()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
    for _ in range(5):
        x.add_(1)
    torch.cuda.synchronize()
gpu = len([e for e in p.events() if e.device_type.name == "CUDA"])
report(dict(detaches=s["detaches"], residue=s["cupti_residue"], gpu_events=gpu, x=x.item()))
""")
    r = c.result
    assert r is not None, c
    assert r["detaches"] == 0, r
    assert r["residue"].startswith("a profiler (torch.profiler/Kineto) used CUPTI"), r
    assert r["gpu_events"] >= 5 and r["x"] == 9.0, r
