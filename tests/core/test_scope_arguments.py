"""The arguments of watch(), launch_blocking() and guard(), and check(device=):
the first positional argument is ``enabled`` for all three (``X(False)`` is off),
the decorator forms stay, and a bad value is refused naming the call and the
argument. The regions themselves: against the fake driver, in a child."""
import pytest

import cuda_debug


@pytest.mark.parametrize("region", [cuda_debug.watch, cuda_debug.launch_blocking,
                                    cuda_debug.guard])
def test_the_first_argument_is_enabled_for_all_three(region):
    assert region(False).enabled is False
    assert region(enabled=False).enabled is False
    assert region().enabled is True and region(True).enabled is True
    assert repr(region(False)).startswith("cuda_debug.%s(False" % region.__name__)
    with pytest.raises(TypeError, match=r"%s\(enabled\) must be True or False, not 'yes'"
                       % region.__name__):
        region("yes")
    with pytest.raises(TypeError, match=r"%s\(enabled\) must be True or False, not 3"
                       % region.__name__):
        region(3)


def test_numpy_booleans_are_booleans():
    np = pytest.importorskip("numpy")
    assert cuda_debug.watch(np.False_).enabled is False
    assert cuda_debug.launch_blocking(np.True_).enabled is True


def test_watch_options_are_keywords_and_go_with_a_watch():
    assert cuda_debug.watch(ops=True).ops is True
    assert repr(cuda_debug.watch(ops=True)) == "cuda_debug.watch(ops=True)"
    with pytest.raises(TypeError):
        cuda_debug.watch(True, True)            # ops= is a keyword
    for kw, shown in (({"ops": True}, "ops=True"), ({"exact": True}, "exact=True"),
                      ({"hang_after": 5}, "hang_after=5")):
        with pytest.raises(ValueError, match=r"watch\(False, %s\): .* watch\(False\) is none"
                           % shown):
            cuda_debug.watch(False, **kw)
    off = cuda_debug.watch(False, ops=False, exact=False, hang_after=0)
    assert (off.enabled, off.ops, off.exact, off.hang_after) == (False, False, False, None)


def test_watch_false_decorates_and_copies_as_off():
    @cuda_debug.watch(False)
    def f(n):
        return n + 1

    assert f(1) == 2
    assert isinstance(cuda_debug.watch(False), cuda_debug.watch)
    assert cuda_debug.watch(False)._copy().enabled is False
    assert cuda_debug.watch()._copy().enabled is True


def test_watch_false_opens_nothing_here_without_a_gpu():
    """No GPU is needed for watch(False): it opens nothing (watch() would raise
    CudaUnavailableError here)."""
    with cuda_debug.watch(False) as w:
        assert w.enabled is False and not cuda_debug.is_watching()


def test_watch_false_inside_a_watch_leaves_it_on(fake_child):
    """watch is process-wide: a watch(False) region is no watch of its own and
    ends nothing (docs/watch.md); the bare and called decorator forms watch."""
    c = fake_child('''
        import cuda_debug, cuda_debug.testing as t
        from cuda_debug import _core

        @cuda_debug.watch
        def bare():
            return cuda_debug.is_watching()

        @cuda_debug.watch()
        def called():
            return cuda_debug.is_watching()

        @cuda_debug.watch(False)
        def off():
            return cuda_debug.is_watching()

        out = {"alone": None}
        with cuda_debug.watch(False):
            out["alone"] = (cuda_debug.is_watching(), _core.stats()["watching"])
        with cuda_debug.watch():
            with cuda_debug.watch(False):
                out["inside"] = cuda_debug.is_watching()
                t.empty()
            out["after"] = cuda_debug.is_watching()
            out["off_inside"] = off()
        out.update(bare=bare(), called=called(), off=off(), end=cuda_debug.is_watching())
        report(out)
    ''')
    assert c.returncode == 0, c
    assert c.result == {"alone": [False, 0], "inside": True, "after": True,
                        "off_inside": True, "bare": True, "called": True, "off": False,
                        "end": False}, c.result


@pytest.mark.parametrize("device, message", [
    (10 ** 30, r"check\(device=10{30}\): a device ordinal is a GPU's number"),
    (2 ** 31, r"check\(device=2147483648\): a device ordinal is a GPU's number"),
    (-1, r"check\(device=-1\): a device ordinal is >= 0"),
])
def test_check_refuses_a_device_that_is_no_ordinal(device, message):
    """Not a bare OverflowError from C: check and device named."""
    with pytest.raises(ValueError, match=message):
        cuda_debug.check(device=device)


def test_check_refuses_a_device_of_another_type():
    with pytest.raises(TypeError, match=r"check\(device\) takes a device ordinal \(int\)"):
        cuda_debug.check(device=True)
