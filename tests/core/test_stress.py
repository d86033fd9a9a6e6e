"""Stress, against the fake CUDA driver (CPU): many threads, many scopes.

- Scope and watch cycles from 4 threads leave nothing behind: resident
  memory, open file descriptors and CUPTI subscriptions are the same at the
  end as after the first 100 cycles. CD_TEST_STRESS_CYCLES sets the count
  (.ci/run runs 10,000; the default keeps the suite fast).
- 4 threads launching from user and library frames while another opens and
  closes scopes, then a fault: every launch is watched, the fault is reported
  at its line. .ci/sanitize.sh runs this one against the ThreadSanitizer
  build (conftest.run_child fails a test on any sanitizer report).
The GPU version of the first is at the end of this module. Memory is measured three
times (check_cycles): a leak grows the second, longer batch in proportion, the
allocators' slack does not.
"""
import os
import textwrap

import pytest

CYCLES = int(os.environ.get("CD_TEST_STRESS_CYCLES", "1000"))

#: The child's part, shared with tests/core/test_stress.py: `cycles` scope and
#: watch cycles over 4 threads, measured after the first 100 and at the end.
CYCLES_CHILD = '''
    import ctypes, os, sys, threading
    import cuda_debug, cuda_debug.testing as t
    from cuda_debug import _core

    libc = ctypes.CDLL(None)

    class Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                   "usmblks", "fsmblks", "uordblks", "fordblks",
                                                   "keepcost")]

    def heap_in_use():
        # bytes malloc has handed out and not had back, every arena (glibc >= 2.33), or None
        if not hasattr(libc, "mallinfo2"):
            return None
        libc.mallinfo2.restype = Mallinfo2
        m = libc.mallinfo2()
        return m.uordblks + m.hblkhd

    def measure():
        t.empty()                      # the launch after the last scope: CUPTI detaches there
        if hasattr(libc, "malloc_trim"):
            libc.malloc_trim(0)        # free memory given back: RSS is then what is held
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        return dict(rss=rss, heap=heap_in_use(), blocks=sys.getallocatedblocks(),
                    fds=len(os.listdir("/proc/self/fd")),
                    subscribed=subscribed(), active=_core.stats()["active"],
                    watching=_core.stats()["watching"])

    def cycles(n):
        def worker(k):
            for i in range(k):
                with cuda_debug.launch_blocking():
                    t.empty()
                with cuda_debug.watch():
                    t.empty()
        threads = [threading.Thread(target=worker, args=(n // 4,)) for _ in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()

    with cuda_debug.watch():       # the watch ring, a fixed array, resident once
        for i in range(_core.WATCH_RING):
            t.empty()
    cycles(100)
    first = measure()
    batch = (CYCLES - 100) // 3 // 4 * 4
    cycles(batch)                  # N cycles: the allocators' working set settles
    mid = measure()
    cycles(CYCLES - 100 - batch)   # 2N more: a leak grows twice as much here
    last = measure()
    report(dict(first=first, mid=mid, last=last, batch=batch, synced=_core.stats()["synced"],
                watched=_core.stats()["watched"]))
'''


def check_cycles(r, cycles):
    """What both versions assert about the child's report. Memory is measured
    after malloc_trim(0) after 100 cycles (first), N more (mid) and 2N more
    (last): a leak of b bytes a cycle grows the second batch by 2Nb, twice
    the first; the allocators' slack (arenas of 4 threads, pages first touched)
    settles in the first. So: what malloc holds (mallinfo2) and Python's
    object count may not grow over the second batch beyond a few bytes a
    cycle, nor resident memory beyond its slack unless it grew less there
    than in proportion."""
    first, mid, last = r["first"], r["mid"], r["last"]
    assert r["synced"] == cycles and r["watched"] >= cycles + 65536, r
    assert last["fds"] == first["fds"], r
    assert last["subscribed"] == first["subscribed"] == 0, r
    assert last["active"] == last["watching"] == 0, r
    # (AddressSanitizer keeps freed memory back: .ci/sanitize.sh says so in CD_TEST_SANITIZER.)
    if os.environ.get("CD_TEST_SANITIZER") == "asan":
        return
    second = cycles - 100 - r["batch"]
    kib = lambda b: "%+d KiB" % (b // 1024)
    growth = "first batch (%d cycles) %s, second (%d) %s; C heap %s, %s; Python blocks %+d, %+d" % (
        r["batch"], kib(mid["rss"] - first["rss"]), second, kib(last["rss"] - mid["rss"]),
        kib((mid["heap"] or 0) - (first["heap"] or 0)), kib((last["heap"] or 0) - (mid["heap"] or 0)),
        mid["blocks"] - first["blocks"], last["blocks"] - mid["blocks"])
    # what malloc holds: a leak of 8 bytes a cycle over the second batch is above this
    if last["heap"] is not None:
        assert last["heap"] - mid["heap"] < max(16 << 10, 8 * second), "C heap grew: " + growth
    # Python objects: one leaked per 64 cycles is above this
    assert last["blocks"] - mid["blocks"] < max(64, second // 64), "Python objects grew: " + growth
    # resident memory (a leak outside malloc: mmap, pages of a static table):
    # 20 bytes a cycle over the second batch of 10,000 cycles is above 128 KiB,
    # unless the second batch grew less than its share (a leak grows it twice
    # the first; slack that settles, less)
    rss1, rss2 = mid["rss"] - first["rss"], last["rss"] - mid["rss"]
    assert rss2 < 128 << 10 or rss2 < 1.5 * max(rss1, 0), "resident memory grew: " + growth
    assert last["rss"] - first["rss"] < 1 << 20, "resident memory grew: " + growth


def test_scope_and_watch_cycles_leave_nothing_behind(fake_child):
    if CYCLES < 200:
        pytest.skip("CD_TEST_STRESS_CYCLES=%d: fewer than 200 cycles" % CYCLES)
    c = fake_child("CYCLES = %d\nsubscribed = lambda: fake.fake_cupti_enabled(-1)\n" % CYCLES
                   + textwrap.dedent(CYCLES_CHILD), timeout=600)
    assert c.result is not None, c
    check_cycles(c.result, CYCLES)


def test_threads_launch_while_scopes_open_and_close_then_a_fault(fake_child):
    """4 threads launch (from deep in a library's code, and from their own),
    watched, while a fifth opens and closes launch_blocking() scopes; then one
    thread faults in a scope. Every launch is in the watch ring, each at its
    thread's line; the fault is reported at its line. The 4 threads first meet
    each of 256 library call chains together (a barrier), the moment that
    ThreadSanitizer caught the frame classifier's race at (code_kind filled
    its entry after another thread could claim it)."""
    c = fake_child('''
        import os, sys, tempfile, threading
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core, _report
        # a library (its folder is a site-packages) that calls back 4 frames deep,
        # 256 ways: the walk classifies those frames by their code objects
        N = 256
        lib = os.path.join(tempfile.mkdtemp(), "site-packages")
        os.mkdir(lib)
        with open(os.path.join(lib, "deep_lib.py"), "w") as f:
            for i in range(N):
                f.write("def a%d(f): return b%d(f)\\ndef b%d(f): return c%d(f)\\n"
                        "def c%d(f): return d%d(f)\\ndef d%d(f): return f()\\n" % ((i,) * 7))
            f.write("chains = [%s]\\n" % ", ".join("a%d" % i for i in range(N)))
        sys.path.insert(0, lib)
        import deep_lib
        fake.fake_set_kernel(b"busy", 0, 0, None, 0, 0)
        together = threading.Barrier(4)
        stop = threading.Event()
        counts = [0] * 4

        def library_launch(i):
            deep_lib.chains[i % N](t.empty)                             # LIBRARY

        def launcher(k):
            for i in range(N):
                together.wait()
                library_launch(i)
            i = 0
            while not stop.is_set():
                if k % 2:
                    library_launch(i)
                else:
                    fake.fake_launch(b"busy", 0, 1, 1, 1, 32, 1, 1)     # USER
                counts[k] += 1
                i += 1

        def scoper():
            # at most 8000 scopes: under load this thread alone launched up to
            # 60,000 times before the others' 4000, and the ring (65,536) wrapped
            for _ in range(8000):
                if stop.is_set():
                    break
                with cuda_debug.launch_blocking():
                    fake.fake_launch(b"busy", 0, 1, 1, 1, 32, 1, 1)     # SCOPED

        with cuda_debug.watch():
            start = _core.watch_seq()
            threads = [threading.Thread(target=launcher, args=(k,)) for k in range(4)]
            threads.append(threading.Thread(target=scoper))
            for th in threads:
                th.start()
            while sum(counts) < 4000:
                pass
            stop.set()
            for th in threads:
                th.join()
            end = _core.watch_seq()
            lines = {}
            for seq in range(start + 1, end + 1):
                rec = _report.watch_record(seq)
                user = [l for l in map(_core.location, rec.frames) if l and l[3] == _core.LOC_USER]
                line = user[0][2] if user else None
                lines[line] = lines.get(line, 0) + 1
            try:
                with cuda_debug.launch_blocking():
                    t.device_assert()                                    # FAULT
            except cuda_debug.DeviceAssertError as e:
                fault = dict(lineno=e.lineno, kernel=e.kernel)
        report(dict(counts=counts, launched=end - start, lines=lines, fault=fault))
    ''', timeout=300)
    r = c.result
    assert r is not None, c
    assert r["launched"] >= sum(r["counts"]) + 4 * 256, r
    lines = {int(k) if k != "null" else None: v for k, v in r["lines"].items()}
    # each launch is recorded at its own line (a library launch at the line that
    # called the library)
    assert set(lines) == {c.line_of("# LIBRARY"), c.line_of("# USER"), c.line_of("# SCOPED")}, lines
    assert lines[c.line_of("# LIBRARY")] >= r["counts"][1] + r["counts"][3] + 4 * 256, lines
    assert lines[c.line_of("# USER")] >= r["counts"][0] + r["counts"][2], lines
    assert r["fault"]["lineno"] == c.line_of("# FAULT"), r
    assert "check_index" in r["fault"]["kernel"]


# ======================================================================================
# On a real GPU
#
# Stress on the GPU: 10,000 scope and watch cycles from 4 threads (an empty
# kernel each) leave nothing behind: resident memory, open file descriptors and
# CUPTI subscriptions are the same at the end as after the first 100 cycles;
# memory is measured after 100, N and 2N more (check_cycles: malloc_trim, then
# mallinfo2, Python's object count, resident memory), so that a leak, which
# grows the longer second batch in proportion, is told from allocator slack.
# The fake-driver version, and what the child does: the tests above.
# ======================================================================================


GPU_CYCLES = int(os.environ.get("CD_TEST_STRESS_CYCLES", "10000"))


@pytest.mark.gpu
def test_gpu_scope_and_watch_cycles_leave_nothing_behind(child):
    c = child("CYCLES = %d\nfrom cuda_debug import _core as _c\n"
              "subscribed = lambda: int(_c.stats()['subscribed'])\n" % GPU_CYCLES
              + textwrap.dedent(CYCLES_CHILD), timeout=300)
    assert c.result is not None, c
    check_cycles(c.result, GPU_CYCLES)
