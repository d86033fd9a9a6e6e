"""The notebook extension in IPython's own InteractiveShell, in a child with
the fake CUDA driver (CPU): what IPython keeps of a cell's exception, and the
magics without a usable GPU. (tests/frontends/test_notebook.py runs real kernels.)"""
import pytest

from conftest import needs, run_child

SHELL = '''
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance()
def cell(source):
    return shell.run_cell(source, store_history=True)
cell("%load_ext cuda_debug")
'''


def test_watch_a_fault_surfacing_in_a_later_cell_is_kept_as_cuda_debugs(fake_child):
    """%cuda_watch on; a kernel launched in one cell faults; a framework's
    error surfaces in a later cell. IPython keeps cuda_debug's exception
    (sys.last_value, sys.last_traceback for %debug, the cell's
    ExecutionResult.error_in_exec), chained to the framework's, as a scope's
    would be (not the framework's)."""
    needs("IPython")
    c = fake_child(SHELL + '''
shell.user_ns["fake"] = fake
cell("%cuda_watch on")
cell("fake.fake_set_async(1)\\nfake.fake_set_kernel(b'bad_k', 710, -1, b'i < n', -1, 20000)")
cell("x = 1\\nfake.fake_launch(b'bad_k', 0, 1, 1, 1, 32, 1, 1)")            # In[4], line 2
r = cell("rc = fake.fake_ctx_sync()\\nif rc:\\n    raise RuntimeError('CUDA error: device-side "
         "assert triggered')")                                             # In[5]
e = r.error_in_exec
frames = []
t = sys.last_traceback
while t is not None:
    frames.append([t.tb_frame.f_code.co_filename, t.tb_lineno]); t = t.tb_next
report(dict(cls=type(e).__name__, last=type(sys.last_value).__name__,
            same=sys.last_value is e, cause=repr(e.__cause__), lineno=getattr(e, "lineno", None),
            cell5=shell.compile._filename_map.get(frames[-1][0]) if frames else None,
            tb_line=frames[-1][1] if frames else None))
''')
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError" and r["last"] == "DeviceAssertError", r
    assert r["same"] is True, r
    assert r["cause"] == "RuntimeError('CUDA error: device-side assert triggered')", r
    assert r["lineno"] == 2, r
    # %debug walks sys.last_traceback: the frames of the cell where it surfaced
    assert r["cell5"] == 5 and r["tb_line"] == 3, r
    out = c.stdout
    assert "DeviceAssertError\x1b[0m: device-side assert in bad_k" in out or \
        "DeviceAssertError: device-side assert in bad_k" in out, out
    assert "  launched at Cell In[4], line 2:  fake.fake_launch(" in out, out
    assert "(raised as RuntimeError: CUDA error: device-side assert triggered)" in out, out


def test_magics_without_a_gpu_say_so_once_and_run_the_code():
    """No driver: each magic says so (once for the same reason) and the code
    runs without the scope, as `run` and the pytest plugin do (they must not
    raise, and a %%launch_blocking cell's body still runs)."""
    needs("IPython")
    c = run_child(SHELL + '''
import cuda_debug
from cuda_debug import _libraries
try:
    _libraries.ensure(_libraries.CUDA)
    report("a driver is usable here")
except cuda_debug.CudaUnavailableError:
    rs = [cell("%launch_blocking on"), cell("y = 1"), cell("%launch_blocking"),
          cell("%%launch_blocking\\nran = 20\\nran + 22"), cell("%%launch_blocking\\nagain = 1"),
          cell("%cuda_watch on"), cell("%cuda_watch")]
    report(dict(errors=[repr(r.error_in_exec) for r in rs if not r.success],
                results=[r.result for r in rs], ran=shell.user_ns.get("ran"),
                again=shell.user_ns.get("again")))
''')
    r = c.result
    assert r is not None, c
    if r == "a driver is usable here":
        pytest.skip(r)
    assert r["errors"] == [], r
    assert r["ran"] == 20 and r["again"] == 1 and 42 in r["results"], r
    said = [l for l in c.stderr.splitlines() if l.startswith("cuda_debug: ")]
    heads = ["cuda_debug: %launch_blocking on runs without launch_blocking(): no CUDA driver",
             "cuda_debug: %%launch_blocking runs without launch_blocking(): no CUDA driver",
             "cuda_debug: %cuda_watch on runs without watch(): no CUDA driver"]
    assert len(said) == 3 and all(l.startswith(h) for l, h in zip(said, heads)), c.stderr
    assert c.stdout.count("launch_blocking: off") == 2, c.stdout     # on, alone: both refused
    assert c.stdout.count("cuda_watch: off") == 2, c.stdout
