"""pytest fixtures for the fake CUDA driver (re-exported by tests/conftest.py).

    fake_cuda_dir   session: build the fakes once (skip, with the reason, when
                    no C compiler or no CUDA headers), return their folder;
    fake_child      run_child(code, ...) with the fakes preloaded in the child:
                    fake_child(code, env=None, timeout=60, args=(), preload=True,
                               ld_library_path=False) -> conftest.Child
    fake_live       fake_live(code, env=None, args=(), read_stderr=True) -> conftest.Live:
                    a child that runs while the test signals it or reads its output
"""
import pytest

from . import PRELUDE, Unavailable, build, child_env


@pytest.fixture(scope="session")
def fake_cuda_dir():
    try:
        return build()
    except Unavailable as e:
        from conftest import short_reason
        pytest.skip("fake CUDA driver not buildable here: %s" % short_reason(str(e)))


@pytest.fixture
def fake_child(fake_cuda_dir):
    from conftest import run_child

    def run(code, env=None, timeout=60, args=(), preload=True, ld_library_path=False):
        full = child_env(fake_cuda_dir, preload=preload, ld_library_path=ld_library_path)
        full.update(env or {})
        return run_child(code, env=full, timeout=timeout, args=args, prelude=PRELUDE)

    return run


@pytest.fixture
def fake_live(fake_cuda_dir):
    """fake_live(code, env=None, args=(), read_stderr=True) -> conftest.Live: a
    child with the fakes preloaded that runs while the test talks to it."""
    from conftest import Live

    def start(code, env=None, args=(), read_stderr=True):
        full = child_env(fake_cuda_dir)
        full.update(env or {})
        return Live(code, env=full, prelude=PRELUDE, args=args, read_stderr=read_stderr)

    return start
