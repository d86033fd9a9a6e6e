"""The launch hooks never hang or crash their host (SPEC sections 12, 16;
csrc/base/got.c, csrc/hooks/runtime_launch.c), against the fake CUDA driver:
CPU only.

- An object's name is copied inside the loader's walk: another thread's
  dlclose() frees the loader's string, so one kept past dl_iterate_phdr is
  read after it was freed (fake_cuda/phdr_shim.c scribbles each name once
  the walk returns, as that free may).
- A forked child never walks the loaded objects: glibc resets the loader's
  main lock in the child, not the one dl_iterate_phdr takes
  (dl_load_write_lock), so a child forked while another thread was inside a
  walk (or a dlopen/dlclose) would wait for that lock for good at its
  watch() exit (or entry). Its copies of the entries keep pointing at the
  hook, which sends every launch the runtime's way there.

Each case runs in a child: the failures these guard against kill or hang it.
"""
import os
import subprocess

import pytest

from fake_cuda import HERE, cflags, compiler

RT = '''
import ctypes, os, sys
import cuda_debug
from cuda_debug import _core
cudart = ctypes.CDLL(os.path.join(FAKE_DIR, "libfake_cudart.so"), ctypes.RTLD_GLOBAL)
cudart.fake_runtime_calls.restype = ctypes.c_long
rt = ctypes.CDLL(os.path.join(FAKE_DIR, "libfake_rt_user.so"))
rt.fake_rt_launch.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long]
'''


# The runtime's user library opened with RTLD_LAZY (ctypes.CDLL binds every
# entry at once: RTLD_NOW), its launch function taken by dlsym.
LAZY = '''
import ctypes, os, sys
import cuda_debug
from cuda_debug import _core
cudart = ctypes.CDLL(os.path.join(FAKE_DIR, "libfake_cudart.so"), ctypes.RTLD_GLOBAL)
cudart.fake_runtime_calls.restype = ctypes.c_long
libc = ctypes.CDLL(None)
libc.dlopen.restype = libc.dlsym.restype = ctypes.c_void_p
libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
handle = libc.dlopen(os.path.join(FAKE_DIR, "libfake_rt_user.so").encode(), 1)   # RTLD_LAZY
assert handle
class rt:
    fake_rt_launch = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long)(
        libc.dlsym(handle, b"fake_rt_launch"))
'''


@pytest.fixture(scope="module")
def phdr_shim(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("shim") / "libphdr_shim.so")
    cmd = [compiler()] + cflags() + ["-shared", "-o", out, os.path.join(HERE, "phdr_shim.c"),
                                     "-ldl"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    return out


def test_an_objects_name_is_not_read_after_the_walk_that_showed_it(fake_child, phdr_shim):
    """The runtime's user library not bound yet (lazy binding: its entry
    points into its own PLT): binding it asks the loader by the object's name,
    after the walk. Read from the loader's string past the walk (freed by a
    dlclose meanwhile: ASan's heap-use-after-free), the name was the shim's
    scribble, and the entry was not taken."""
    if os.environ.get("CD_TEST_SANITIZER"):
        pytest.skip("the sanitizer's runtime interposes dl_iterate_phdr itself; under ASan "
                    "the stress below meets the real race (a dlclose during the walk)")
    preload = " ".join(p for p in (os.environ.get("LD_PRELOAD"), phdr_shim) if p)
    c = fake_child(LAZY + '''
out = {}
with cuda_debug.watch():                      # the library's entry still unbound
    h = _core.stats()["launch_hooks"]
    out["on"], out["entries"], out["why"] = h["on"], h["entries"], h["why_off"]
    r0 = cudart.fake_runtime_calls()
    rt.fake_rt_launch(b"k", 0, 7)
    out["routed"] = _core.stats()["launch_hooks"]["routed"]
    out["runtime"] = cudart.fake_runtime_calls() - r0
report(out)
''', env={"LD_PRELOAD": preload})
    r = c.result
    assert r is not None, c
    assert r["on"] == 1 and r["entries"] >= 1, r
    assert r["routed"] == 7 and r["runtime"] == 0, r


FORK_WHILE_WALKING = '''
import threading, time
out = {}
# Another thread inside dl_iterate_phdr (holding the loader's write lock),
# its callback waiting: the fork happens while it holds the lock.
CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
inside, release = threading.Event(), threading.Event()
def visit(info, size, data):
    inside.set()
    release.wait(60)
    return 1
cb = CB(visit)
libc = ctypes.CDLL(None)
walker = threading.Thread(target=lambda: libc.dl_iterate_phdr(cb, None))
with cuda_debug.watch():
    rt.fake_rt_launch(b"k", 0, 3)
    h = _core.stats()["launch_hooks"]
    out["parent_hooks"] = (h["on"], h["entries"], h["routed"])
    walker.start()
    assert inside.wait(20)
    pid = os.fork()
    if pid == 0:
        try:
            rt.fake_rt_launch(b"k", 0, 2)            # the entries (the parent's) point at us
        except BaseException:
            os._exit(3)
    else:
        release.set()
if pid == 0:                                         # the child left the watch (no walk)
    try:
        with cuda_debug.watch():                     # and entered another (no walk)
            c = cudart.fake_runtime_calls()
            rt.fake_rt_launch(b"k", 0, 4)
            ok = cudart.fake_runtime_calls() - c == 4
            why = _core.stats()["launch_hooks"]["why_off"]
        os._exit(0 if ok and why == "a forked child" else 4)
    except BaseException:
        os._exit(5)
deadline = time.monotonic() + 15
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        out["child"] = os.waitstatus_to_exitcode(status)
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        out["child"] = "hung"
        break
    time.sleep(0.05)
walker.join(20)
with cuda_debug.watch():                             # the parent's hooks: as before
    out["parent_again"] = _core.stats()["launch_hooks"]["on"]
report(out)
'''


def test_a_child_forked_while_another_thread_walks_the_objects_does_not_hang(fake_child):
    """Before: the child's watch() exit restored the entries inside
    dl_iterate_phdr and waited for good on the lock the walking thread held
    at the fork (1 fork in 60-150 in the review; here every time)."""
    c = fake_child(RT + FORK_WHILE_WALKING, timeout=90)
    r = c.result
    assert r is not None, c
    assert r["parent_hooks"][0] == 1 and r["parent_hooks"][2] == 3, r
    assert r["child"] == 0, r
    assert r["parent_again"] == 1, r


REFUSED_WHILE_RECORDING = '''
import time, cuda_debug, cuda_debug.testing as t
from cuda_debug import _dispatch_fallback
fake.fake_set_async(1)                                   # kernels run on a device thread
fake.fake_set_driver_log(0)                              # a driver older than 12.9: no log
t.empty()
fake.fake_set_kernel(b"bad_k", 710, -1, b"idx < n", -1, 0)
out = {}
try:
    with cuda_debug.watch():
        rt.fake_rt_launch(b"ok_k", 0, 3)
        _dispatch_fallback.hand_over()                   # a profiler window opens
        fake.fake_hold_cupti(b"Kineto")
        out["recording"] = _core.stats()["launch_hooks"]["recording"]
        r0 = _core.stats()["refused"]
        rt.fake_rt_launch(b"bad_k", 0, 1)                # LAUNCH
        time.sleep(0.3)                                  # it ran: the context is dead
        for _ in range(3):
            out.setdefault("rcs", []).append(rt.fake_rt_launch(b"ok_k", 0, 1))  # refused: dead
        out["refused"] = _core.stats()["refused"] - r0
        fake.fake_hold_cupti(None)
except cuda_debug.CudaError as e:
    out["kernel"] = e.kernel
report(out)
'''


def test_a_launch_refused_in_the_record_mode_is_counted_and_reported(fake_child):
    """While a profiler holds CUPTI the hooks launch the runtime's way and
    record after the call; a launch the dead context refused was dropped
    there: no refusal counted, no fd-2 block (nothing else writes it on
    drivers older than 12.9)."""
    c = fake_child(RT + REFUSED_WHILE_RECORDING)
    r = c.result
    assert r is not None, c
    assert r["recording"] == 1, r
    assert r["refused"] >= 1, r
    assert "cuda_debug (watch): device-side assert (CUDA_ERROR_ASSERT)" in c.stderr, c.stderr
    assert "found at a launch refused by the dead context" in c.stderr, c.stderr


def test_after_a_context_reset_the_hooks_record_launches_under_the_new_context(fake_child):
    """The hooks keep, per thread, the id of the last context they saw. A
    reset hands back the same CUcontext pointer with a new id: the cached
    id was the dead context's, so the new context's stream appeared twice
    in the hang report and a launch merely queued behind the stuck one was
    named the oldest unfinished."""
    c = fake_child(RT + '''
import cuda_debug.testing as t
fake.fake_set_async(1)
out = {}
with cuda_debug.watch():
    rt.fake_rt_launch(b"ok_k", 0, 3)          # this thread caches the context's id
    out["reset"] = fake.fake_primary_ctx_reset()               # same pointer, new id
    t.spin(8)                                 # STUCK (CUPTI's path: the new id)
    rt.fake_rt_launch(b"ok_k", 0, 4)                           # queued behind it (hooks)
    out["routed"] = _core.stats()["launch_hooks"]["routed"]
    out["in_flight"] = [(r.short or r.kernel, r.stream, r.queue_depth)
                        for r in cuda_debug.in_flight()]
report(out)
''', timeout=90)
    r = c.result
    assert r is not None, c
    assert r["routed"] == 7, r
    assert r["in_flight"] == [["spin", 0, 4]], r


def test_watches_open_and_close_while_the_profiler_hand_over_runs(fake_child):
    """Threads entering and leaving watch() (the hooks wanted or not, CUPTI
    subscribed and given up) while another thread hands CUPTI to a profiler
    and takes it back: run under ThreadSanitizer by .ci/sanitize.sh (plain
    ints written by one and read by the other were data races:
    hooks_wanted, cd_state.capture_cache)."""
    c = fake_child(RT + '''
import threading, time
from cuda_debug import _dispatch_fallback
import cuda_debug.testing as t
t.empty()
stop = time.monotonic() + 2.0
errors = []
def watcher(i):
    try:
        while time.monotonic() < stop:
            _core.set_launch_hooks(i % 2 == 0)
            with cuda_debug.watch():
                rt.fake_rt_launch(b"k", 0, 3)
                t.empty()
    except Exception as e:
        errors.append(repr(e))
def profiler():
    try:
        while time.monotonic() < stop:
            if _dispatch_fallback.hand_over():
                time.sleep(0.001)
                _dispatch_fallback.take_back()
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=watcher, args=(i,)) for i in range(3)]
threads.append(threading.Thread(target=profiler))
for th in threads: th.start()
for th in threads: th.join()
report({"errors": errors})
''', timeout=120)
    r = c.result
    assert r is not None, c
    assert r["errors"] == [], r


STRESS = '''
import _ctypes, shutil, tempfile, threading, time
import cuda_debug.testing as t
seconds = float(sys.argv[1])
folder = tempfile.mkdtemp()
copy = os.path.join(folder, "libfake_rt_user_copy.so")       # a hooked library of its own
shutil.copy(os.path.join(FAKE_DIR, "libfake_rt_user.so"), copy)
libc = ctypes.CDLL(None)
libc.dlopen.restype = libc.dlsym.restype = ctypes.c_void_p
libc.dlopen.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
libc.dlclose.argtypes = [ctypes.c_void_p]
LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long)
# What a child's watch() imports, imported before any thread runs: a child
# forked while the opener thread is inside dlopen/dlclose can dlopen nothing
# (glibc leaves dl_load_write_lock held there: any import of an extension
# module would wait for good, cuda_debug's or not).
with cuda_debug.watch():
    rt.fake_rt_launch(b"k", 0, 1)
stop = time.monotonic() + seconds
out = {"watches": 0, "opened": 0, "forks": 0, "children": [], "errors": []}
def watcher():
    try:
        while time.monotonic() < stop:
            with cuda_debug.watch():
                rt.fake_rt_launch(b"k", 0, 2)
                t.empty()
            out["watches"] += 1
    except Exception as e:
        out["errors"].append(repr(e))
def opener():                                  # dlopen (lazy), launch through it, dlclose
    try:
        while time.monotonic() < stop:
            h = libc.dlopen(copy.encode(), 1)
            if h:
                LAUNCH(libc.dlsym(h, b"fake_rt_launch"))(b"k", 0, 1)
                libc.dlclose(h)
                out["opened"] += 1
    except Exception as e:
        out["errors"].append(repr(e))
def forker():
    try:
        while time.monotonic() < stop:
            pid = os.fork()
            if pid == 0:
                try:
                    with cuda_debug.watch():          # entered and left: no walk
                        rt.fake_rt_launch(b"k", 0, 1)
                finally:
                    os._exit(0)
            deadline = time.monotonic() + 20
            while True:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    out["children"].append(os.waitstatus_to_exitcode(status))
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    out["children"].append("hung")
                    break
                time.sleep(0.005)
            out["forks"] += 1
    except Exception as e:
        out["errors"].append(repr(e))
threads = [threading.Thread(target=watcher) for _ in range(3)]
threads += [threading.Thread(target=opener), threading.Thread(target=forker)]
for th in threads: th.start()
for th in threads: th.join()
shutil.rmtree(folder)
report(out)
'''


@pytest.mark.xfail(strict=False, reason="a rare crash this stress found and that is not yet "
                   "explained: the process died of SIGSEGV once in 4 runs of 25 s (no sanitizer), "
                   "and one forked child of 47 did not exit 0 under ASan; each run still "
                   "reports XPASS or XFAIL with what it saw")
def test_watches_while_a_hooked_library_comes_and_goes_and_the_process_forks(fake_child):
    """The stress of .ci/sanitize.sh (under ASan): threads enter and leave
    watch() (each entry walks or re-applies the entries, each exit restores
    them) while another thread dlopens a hooked library lazily, launches
    through it and dlcloses it, and another forks children that watch and
    exit. Nothing is read after it was freed, no child hangs, no crash.
    CD_TEST_STRESS_S seconds (default 3)."""
    seconds = os.environ.get("CD_TEST_STRESS_S", "3")
    c = fake_child(RT + STRESS, args=[seconds], timeout=float(seconds) + 120)
    r = c.result
    assert r is not None, c
    assert r["errors"] == [], r
    assert r["watches"] > 0 and r["opened"] > 0 and r["forks"] > 0, r
    assert all(code == 0 for code in r["children"]), [c for c in r["children"] if c != 0]


def test_a_child_forked_while_another_thread_enters_watch_can_watch(fake_child):
    """Another thread holds the lock watch() entry takes (it was entering a
    watch at the fork): the child's own watch() must not wait for it."""
    c = fake_child(RT + '''
import threading, time
from cuda_debug import _scope
with cuda_debug.watch():                      # the lock exists
    pass
held, release = threading.Event(), threading.Event()
def holder():
    with _scope._exact_lock:                  # a watch() entering at the fork
        held.set()
        release.wait(30)
th = threading.Thread(target=holder)
th.start()
held.wait(10)
pid = os.fork()
if pid == 0:
    import faulthandler
    faulthandler.dump_traceback_later(10, exit=True)   # a hang: exit 1
    with cuda_debug.watch():
        rt.fake_rt_launch(b"k", 0, 1)
    os._exit(0)
release.set()
th.join()
report({"child": os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])})
''', timeout=60)
    r = c.result
    assert r is not None, c
    assert r["child"] == 0, r
