"""CUDA 12's CUPTI on a real GPU: a scope fault, a watch fault and the pytest
plugin with ``libcupti.so.12`` (the ``nvidia-cuda-cupti-cu12`` wheel, named by
``$CD_TEST_CUPTI12_WHEEL``: tests/cuda12_wheel.py) opened with RTLD_GLOBAL
before anything else, as a PyTorch cu12 build has it; and doctor saying so.
A CUDA 13 driver (>= 580) serves CUDA 12 clients.

Each runs twice: with cuda_debug's own fault kernels (CUPTI 12 is then the only
CUPTI in the process, and cuda_debug must bind it, the already-loaded copy),
and with PyTorch imported after the preload. A PyTorch built for CUDA 12 needs
libcupti.so.12 and so shares the preloaded copy; one built for CUDA 13 (the
H200's) also brings libcupti.so.13, and with two CUPTIs loaded the newest
soname wins (cuda_debug/_libraries.py SONAMES): the test asserts whichever
rule applies to the PyTorch it finds, from the libraries mapped in the child.
"""
import json
import os

import pytest

from conftest import PKG_PARENT, needs
from cuda12_wheel import cupti12  # noqa: F401  (fixture)
from helpers.plugin import PLUGIN_ARGS

pytestmark = pytest.mark.gpu
pytest_plugins = ("pytester",)

FRAMEWORKS = ["kernels", "torch"]


def preload(lib):
    return ("import ctypes, os\n"
            "_cupti12 = ctypes.CDLL(%r, mode=os.RTLD_GLOBAL)  # before torch, as a cu12 build has it\n"
            % lib)


FACTS = """
import cuda_debug
def cupti_facts():
    from cuda_debug import _core, _libraries
    lib = _libraries.status("cupti")
    mapped = sorted({l.split()[-1] for l in open("/proc/self/maps") if "/libcupti.so" in l})
    return dict(cupti_path=lib.path if lib else None, cupti_how=lib.how if lib else None,
                cupti_version=_core.cupti_version(), mapped=mapped)
def describe(e):
    return dict(cls=type(e).__name__, code=e.code, kernel=e.kernel, filename=e.filename,
                lineno=e.lineno, mechanism=e.mechanism, text=str(e), **cupti_facts())
"""

SETUP = {
    "kernels": "import cuda_debug.testing as t\n",
    "torch": ("import torch\n"
              "emb = torch.nn.Embedding(10, 4).cuda()\n"
              "bad = torch.tensor([12], device='cuda')\n"
              "torch.cuda.synchronize()\n"),
}
CULPRIT = {"kernels": "t.device_assert()", "torch": "y = emb(bad)"}
KERNEL = {"kernels": "check_index", "torch": "index"}


def check_cupti(r, cupti12, framework):
    """cuda_debug bound an already-loaded CUPTI: the preloaded CUDA 12 one,
    unless a CUDA 13 PyTorch brought libcupti.so.13 as well (the newest wins)."""
    mapped = [os.path.realpath(p) for p in r["mapped"]]
    assert os.path.realpath(cupti12.lib) in mapped, r
    assert r["cupti_how"] == "already loaded", r
    thirteen = [p for p in mapped if os.path.basename(p) == "libcupti.so.13"]
    if framework == "kernels":
        assert mapped == [os.path.realpath(cupti12.lib)], r
    if thirteen:
        assert os.path.realpath(r["cupti_path"]) == thirteen[0], r
        assert r["cupti_version"] >= 130000, r
    else:
        assert os.path.samefile(r["cupti_path"], cupti12.lib), r
        assert r["cupti_version"] == cupti12.api_version, r


def run_fault(child, cupti12, framework, opening, surface=""):
    """The framework's fault under `opening` (launch_blocking() or watch()),
    in a child with CUDA 12's CUPTI preloaded: the child, its report."""
    if framework == "torch":
        needs("torch")
    c = child(FACTS + SETUP[framework] + """
try:
    with %s:
        %s  # CULPRIT
        %s
        print("not reached")
except cuda_debug.CudaError as e:
    report(describe(e))
""" % (opening, CULPRIT[framework], surface), prelude=preload(cupti12.lib), timeout=180)
    r = c.result
    assert r is not None, c
    assert r["cls"] == "DeviceAssertError" and r["code"] == 710, r
    assert r["filename"] == c.script and r["lineno"] == c.line_of("# CULPRIT"), r
    assert KERNEL[framework] in r["kernel"].lower(), r
    assert "not reached" not in c.stdout
    check_cupti(r, cupti12, framework)
    return c, r


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_scope_fault_with_cupti12(child, cupti12, framework):
    _, r = run_fault(child, cupti12, framework, "cuda_debug.launch_blocking()")
    assert r["mechanism"] == "cupti", r


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_watch_fault_with_cupti12(child, cupti12, framework):
    surface = {"kernels": "cuda_debug.check()", "torch": "y.sum().item()"}
    c, r = run_fault(child, cupti12, framework, "cuda_debug.watch()", surface[framework])
    assert r["mechanism"] == "watch", r
    assert "launched at %s:%d" % (c.script, c.line_of("# CULPRIT")) in r["text"], r["text"]


PLUGIN_TESTS = {
    "kernels": """import cuda_debug.testing as t

def test_1():
    pass

def test_2():
    t.device_assert()  # CULPRIT

def test_3():
    pass
""",
    "torch": """import torch

def test_1():
    pass

def test_2():
    emb = torch.nn.Embedding(10, 4).cuda()
    bad = torch.tensor([12], device="cuda")
    y = emb(bad)  # CULPRIT
    torch.cuda.synchronize()

def test_3():
    pass
""",
}


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_pytest_plugin_with_cupti12(pytester, monkeypatch, cupti12, framework):
    """--cuda-launch-blocking with CUDA 12's CUPTI preloaded by the conftest:
    the sticky fault is named at its line, the session stops, and the CUPTI
    bound is the one check_cupti expects."""
    if framework == "torch":
        needs("torch")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [PKG_PARENT,
                                                                   os.environ.get("PYTHONPATH")])))
    monkeypatch.delenv("CUDA_LAUNCH_BLOCKING", raising=False)
    facts = pytester.path / "facts.json"
    pytester.makeconftest(preload(cupti12.lib) + FACTS + """
import json
def pytest_sessionfinish(session):
    with open(%r, "w") as f:
        json.dump(cupti_facts(), f)
""" % str(facts))
    source = PLUGIN_TESTS[framework]
    pytester.makepyfile(test_c12=source)
    result = pytester.runpytest_subprocess(*PLUGIN_ARGS, "-p", "no:cacheprovider",
                                           "--cuda-launch-blocking", timeout=240)
    result.assert_outcomes(passed=1, failed=1)          # test_3 did not run
    line = next(i for i, l in enumerate(source.splitlines(), 1) if "# CULPRIT" in l)
    result.stdout.fnmatch_lines([
        "E  *at *test_c12.py:%d in test_2:*" % line,          # the failure's own report
        "*= cuda_debug: sticky CUDA error =*",
        "test_c12.py::test_2 failed: it poisoned the CUDA context:",
        "  DeviceAssertError: device-side assert in *(its report is in the failure above)",
        "pytest stopped after test_c12.py::test_2: 1 test not run*",
    ])
    check_cupti(json.loads(facts.read_text()), cupti12, framework)


def test_doctor_names_the_preloaded_cupti12(child, cupti12):
    c = child("""
import cuda_debug._cli as cli
rc = cli.main(["doctor"])
report(dict(rc=rc))
""", prelude=preload(cupti12.lib), timeout=120)
    assert c.result == {"rc": 0}, c
    rows = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip()
            for line in c.stdout.splitlines() if "  " in line and not line.startswith("RESULT")}
    from cuda_debug._environment import cupti_version_str
    assert rows["CUPTI"] == "%s: %s (already loaded)" % (cupti_version_str(cupti12.api_version),
                                                        cupti12.lib), c.stdout
    assert rows["CUPTI free"] == "yes: launch_blocking() subscribed and let go", c.stdout
