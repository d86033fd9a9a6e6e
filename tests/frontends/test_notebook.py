"""The notebook extension (``%load_ext cuda_debug``), executed headless: nbclient
starts a real ipykernel and runs the cells; the outputs are what a notebook shows.

Needs the optional test dependencies ipykernel, nbclient, nbformat.
"""
import os
import re

import pytest

from conftest import PKG_PARENT, gpu_unavailable_reason
from helpers.notebook import Cell

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NO_GPU = gpu_unavailable_reason() is not None


@pytest.fixture
def notebook(tmp_path, monkeypatch):
    """execute([cell sources]) -> [Cell]: one fresh kernel per call."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [PKG_PARENT, os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)

    def execute(sources, timeout=120):
        nb = nbformat.v4.new_notebook(
            cells=[nbformat.v4.new_code_cell(s) for s in sources])
        client = nbclient.NotebookClient(
            nb, timeout=timeout, kernel_name="python3", allow_errors=True,
            resources={"metadata": {"path": str(tmp_path)}})
        client.execute()
        return [Cell(c) for c in nb.cells]
    return execute


# A scope that needs no GPU, to see what the magics do with it.
FAKE_SCOPE = '''
import contextlib, cuda_debug._notebook as _nb
SCOPES = []
@contextlib.contextmanager
def _fake(all_threads=False):
    SCOPES.append(("enter", all_threads)); yield; SCOPES.append(("exit", all_threads))
_nb._make_scope = _fake
'''

FAKE_ASSERT = '''import cuda_debug
raise cuda_debug.DeviceAssertError(
    code=710, kernel="void cuda_debug_testing::check_index<int>(int const*, int)",
    device_message="fault_kernels.cu:14: check_index: block: [0,0,0], thread: [3,0,0] "
                   "Assertion `idx[i] >= 0 && idx[i] < limit` failed.")'''


def test_magics_and_short_reports(notebook):
    cells = notebook([
        "%load_ext cuda_debug",                                       # 1
        "%launch_blocking off",                                       # 2
        FAKE_SCOPE,                                                   # 3
        "%%launch_blocking\nx = 2\nx * 21",                           # 4
        "%%launch_blocking --all-threads\ny = 1\nraise ValueError('boom')",  # 5
        "%launch_blocking on\nSCOPES.clear()",                        # 6
        "SCOPES",                                                     # 7
        "%launch_blocking off",                                       # 8
        "SCOPES[-1]",                                                 # 9
        FAKE_ASSERT,                                                  # 10
        "def f():\n    raise RuntimeError('CUDA error: device-side assert triggered\\n"
        "CUDA kernel errors might be asynchronously reported at some other API call')\nf()",  # 11
        "raise RuntimeError('plain')",                                # 12
        "%launch_blocking sideways",                                  # 13
        "%unload_ext cuda_debug",                                     # 14
        "%launch_blocking",                                           # 15
    ])
    c = {cell.count: cell for cell in cells}
    assert all(cell.ename is None for cell in cells[:4]), cells[:4]
    assert c[2].stdout.strip() == "launch_blocking: off"           # as typed, one form
    # %%launch_blocking: the cell runs in a scope, its last expression is the output
    assert c[4].result == "42"
    # an ordinary error keeps its traceback, with the cell's own line numbers
    assert c[5].ename == "ValueError"
    assert "Cell In[5], line 3" in c[5].tb_text, c[5]
    assert "ValueError: boom" in c[5].tb_text
    # %launch_blocking on: every cell runs in a scope, entered before and left after it
    assert c[6].stdout.strip() == "launch_blocking: on"
    assert c[7].result == "[('exit', False), ('enter', False)]", c[7]
    assert c[8].stdout.strip() == "launch_blocking: off"
    assert c[9].result == "('exit', False)"
    # a cuda_debug error: the short report, not a traceback
    assert c[10].ename == "DeviceAssertError"
    assert c[10].traceback[0] == "DeviceAssertError: device-side assert in check_index<int>"
    assert "  device: fault_kernels.cu:14 block [0,0,0] thread [3,0,0]: Assertion " \
           "`idx[i] >= 0 && idx[i] < limit` failed." in c[10].traceback
    assert len(c[10].traceback) <= 4 and "Traceback" not in c[10].tb_text
    # a framework's sticky error: its first line, where it surfaced, what to do
    assert c[11].ename == "RuntimeError"
    assert c[11].traceback[0] == "RuntimeError: CUDA error: device-side assert triggered"
    assert c[11].traceback[1].startswith("  reported at Cell In[11], line 2 in f:  raise"), c[11]
    assert "CUDA_ERROR_ASSERT (device-side assert triggered): a sticky CUDA error" in c[11].tb_text
    assert "%%cuda_launch_blocking" in c[11].tb_text and "restart" in c[11].tb_text
    assert len(c[11].traceback) <= 6
    # other RuntimeErrors: IPython's usual traceback
    assert c[12].ename == "RuntimeError" and "Cell In[12], line 1" in c[12].tb_text
    assert c[13].ename == "UsageError" or "usage: %launch_blocking" in c[13].stderr, c[13]
    # unloaded: the magic is gone
    assert c[15].ename == "UsageError" or "not found" in c[15].stderr + c[15].tb_text, c[15]


def test_magics_without_a_gpu_say_so_once_and_run_the_code(notebook):
    """The README's rule for every entry point that wraps code: say so once
    and run the code without the scope (they raised, and a %%launch_blocking
    cell's body did not run)."""
    if not NO_GPU:
        pytest.skip("a GPU is usable here")
    cells = notebook(["%load_ext cuda_debug", "%launch_blocking on", "%launch_blocking",
                      "%%launch_blocking\n1 + 1", "%%launch_blocking\n2 + 2", "%cuda_watch on"])
    assert all(cell.ename is None for cell in cells), cells
    assert cells[1].stderr.startswith("cuda_debug: %launch_blocking on runs without "
                                      "launch_blocking(): no CUDA driver"), cells[1]
    assert cells[1].stdout.strip() == cells[2].stdout.strip() == "launch_blocking: off", cells[1:3]
    assert cells[3].result == "2" and cells[4].result == "4", cells[3:5]
    assert cells[3].stderr.startswith("cuda_debug: %%launch_blocking runs without"), cells[3]
    assert cells[4].stderr == "", cells[4]                     # said once
    assert cells[5].stderr.startswith("cuda_debug: %cuda_watch on runs without watch()"), cells[5]
    assert "cuda_watch: off" in cells[5].stdout


# -- GPU --------------------------------------------------------------------------------

def _short_report_ok(cell, ename, head, where):
    assert cell.ename == ename, cell
    assert any(head in line for line in cell.traceback), cell
    assert any(where in line for line in cell.traceback), cell
    assert "Assertion" in cell.tb_text, cell                    # the device's own words
    assert "restart" in cell.tb_text
    assert len(cell.traceback) <= 7 and "Traceback (most recent" not in cell.tb_text, cell


@pytest.mark.gpu
def test_gpu_cell_magic_device_assert(notebook):
    cells = notebook([
        "%load_ext cuda_debug",
        "%%launch_blocking\nimport cuda_debug.testing as t\nt.device_assert()",
    ])
    _short_report_ok(cells[1], "DeviceAssertError",
                     "DeviceAssertError: device-side assert in check_index<int>",
                     "at Cell In[2], line 3:  t.device_assert()")


@pytest.mark.gpu
def test_gpu_line_magic_device_assert(notebook):
    cells = notebook([
        "%load_ext cuda_debug",
        "%launch_blocking on",
        "import cuda_debug.testing as t\nt.device_assert()",
    ])
    assert "launch_blocking: on" in cells[1].stdout, cells[1]
    _short_report_ok(cells[2], "DeviceAssertError",
                     "DeviceAssertError: device-side assert in check_index<int>",
                     "at Cell In[3], line 2:  t.device_assert()")


TORCH_FAULT = ("import torch\nx = torch.zeros(4, device='cuda')\n"
               "i = torch.tensor([10], device='cuda')\ny = x[i]\ntorch.cuda.synchronize()")


@pytest.mark.gpu
def test_gpu_torch_device_assert_in_a_blocking_cell(notebook):
    pytest.importorskip("torch")
    cells = notebook(["%load_ext cuda_debug", "%launch_blocking on", TORCH_FAULT])
    cell = cells[2]
    # torch raises its own error at the launching line; cuda_debug recorded the
    # fault, so the cell shows cuda_debug's report (with the assert text).
    assert any("device-side assert in " in line for line in cell.traceback), cell
    assert any("at Cell In[3], line 4:  y = x[i]" in line for line in cell.traceback), cell
    assert "Assertion" in cell.tb_text, cell
    assert len(cell.traceback) <= 8, cell


@pytest.mark.gpu
def test_gpu_torch_device_assert_without_a_scope(notebook):
    pytest.importorskip("torch")
    cells = notebook(["%load_ext cuda_debug", TORCH_FAULT])
    cell = cells[1]
    assert "CUDA error: device-side assert triggered" in cell.traceback[0], cell
    assert any(line.startswith("  reported at Cell In[2], line") for line in cell.traceback), cell
    assert "%%cuda_launch_blocking" in cell.tb_text and "restart" in cell.tb_text
    assert len(cell.traceback) <= 6, cell


@pytest.mark.gpu
def test_gpu_watch_fault_surfacing_in_a_later_cell_is_kept_as_cuda_debugs(notebook):
    """IPython keeps cuda_debug's error, not torch's AcceleratorError
    (sys.last_value, %debug, error_in_exec)."""
    pytest.importorskip("torch")
    cells = notebook([
        "%load_ext cuda_debug",
        "%cuda_watch on",
        "import torch\nx = torch.zeros(4, device='cuda')\ni = torch.tensor([10], device='cuda')\n"
        "torch.cuda.synchronize()",
        "y = x[i]",
        "torch.cuda.synchronize()",
        "import sys\n(type(sys.last_value).__name__, type(sys.last_value.__cause__).__name__, "
        "sys.last_traceback is sys.last_value.__traceback__)",
    ])
    cell = cells[4]
    assert cell.ename == "DeviceAssertError", cell
    assert any("launched at Cell In[4], line 1:  y = x[i]" in line for line in cell.traceback), cell
    assert "(raised as torch.AcceleratorError: CUDA error: device-side assert triggered)" in \
        cell.tb_text, cell
    assert cells[5].result == "('DeviceAssertError', 'AcceleratorError', True)", cells[5]


def test_relocate_names_the_cell_at_module_level_and_in_functions():
    """Report lines that point into a cell's temp file say ``Cell In[n]``."""
    from cuda_debug import _notebook

    class Compiler:
        _filename_map = {"/tmp/ipykernel_1/3.py": 2}

    class Shell:
        compile = Compiler()

    f = "/tmp/ipykernel_1/3.py"
    assert _notebook._relocate("reported at %s:5" % f, Shell(), f, 5, "<module>") == \
        "reported at Cell In[2], line 5"
    assert _notebook._relocate("at %s:5 in <module>:  x" % f, Shell(), f, 5, "<module>") == \
        "at Cell In[2], line 5:  x"
    assert _notebook._relocate("at %s:5 in g:  x" % f, Shell(), f, 5, "g") == \
        "at Cell In[2], line 5 in g:  x"
    assert _notebook._relocate("at /elsewhere.py:5", Shell(), "/elsewhere.py", 5, "g") == \
        "at /elsewhere.py:5"
