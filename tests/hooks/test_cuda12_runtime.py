"""CUDA 12's runtime beside CUDA 13's on a real GPU: a library launching with
<<<>>> through the shared libcudart.so.12 (tests/cuda12_runtime/build.sh builds
it into .cu12rt/, or the folder $CD_TEST_CU12RT names), loaded with ctypes
beside PyTorch (cu130 on the H200) or alone, inside watch(); and a second
context (cuCtxCreate) beside PyTorch's primary one.

The launch hooks route one runtime (csrc/hooks/runtime_launch.c: the one
PyTorch's own libraries import, else the first found) and leave a library
bound to another copy alone, its launches its runtime's and CUPTI's: either
way its launches compute the same bits as unwatched, are recorded, and a fault
in its kernel is named at its launching line; stats()["launch_hooks"] says
which way they went (runtime / other_runtime).
"""
import os

import pytest

from conftest import ROOT, needs

pytestmark = pytest.mark.gpu

ENV = "CD_TEST_CU12RT"


@pytest.fixture(scope="module")
def cu12rt():
    where = os.environ.get(ENV) or os.path.join(ROOT, ".cu12rt")
    need = ("libcu12rt.so", "libcudart.so.12", "ctx2.cubin")
    missing = [n for n in need if not os.path.isfile(os.path.join(where, n))]
    if missing:
        pytest.skip("%s (%s, or .cu12rt/ in the checkout) lacks %s: build it with "
                    "tests/cuda12_runtime/build.sh and carry it" % (where, ENV, ", ".join(missing)))
    return os.path.abspath(where)


LIB = """
import ctypes, os, sys
CU12 = sys.argv[1]
FRAMEWORK = sys.argv[2]
if FRAMEWORK == "torch":
    import torch
    warm = torch.ones(4, device="cuda") * 2          # PyTorch's runtime and context first
    torch.cuda.synchronize()
import cuda_debug
from cuda_debug import _core
lib = ctypes.CDLL(os.path.join(CU12, "libcu12rt.so"))
P, I, F, Z = ctypes.c_void_p, ctypes.c_int, ctypes.c_float, ctypes.c_size_t
for name, res, args in [("cu12_runtime_version", I, []), ("cu12_scale_launch", I, [P, I, F, P]),
                        ("cu12_fault", I, [I, P, I, P]), ("cu12_sync", I, []),
                        ("cu12_alloc", P, [Z]), ("cu12_free", I, [P]), ("cu12_h2d", I, [P, P, Z]),
                        ("cu12_d2h", I, [P, P, Z]), ("cu12_stream", P, [])]:
    getattr(lib, name).restype = res
    getattr(lib, name).argtypes = args
N = 4096
host = (ctypes.c_float * N)(*[i * 0.37 - 500.0 for i in range(N)])
buf = lib.cu12_alloc(N * 4)
assert buf, "cudaMalloc through libcudart.so.12 failed"

def lib_cudart():
    # the libcudart.so.12 this library is bound to (PyTorch cu12's own, where it came first)
    found = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libcudart.so.12" in l})
    return [os.path.realpath(p) for p in found]

def hooks():
    return _core.stats()["launch_hooks"]

def describe(e):
    return dict(cls=type(e).__name__, code=e.code, kernel=e.kernel, filename=e.filename,
                lineno=e.lineno, exact=e.exact, text=str(e), likely=e.likely_kernel)
"""


def run_lib(child, cu12rt, framework, code, timeout=180):
    if framework == "torch":
        needs("torch")
    c = child(LIB + code, args=[cu12rt, framework], timeout=timeout)
    assert c.result is not None, c
    return c, c.result


@pytest.mark.parametrize("framework", ["torch", "alone"])
def test_cu12_launches_compute_the_same_and_stats_say_which_way(child, cu12rt, framework):
    c, r = run_lib(child, cu12rt, framework, """
def work():
    assert lib.cu12_h2d(buf, host, N * 4) == 0
    for a in (1.5, -0.25, 3.0):
        assert lib.cu12_scale_launch(buf, N, a, None) == 0
    out = (ctypes.c_float * N)()
    assert lib.cu12_sync() == 0 and lib.cu12_d2h(out, buf, N * 4) == 0
    return bytes(out)
ref = work()                                        # unwatched
out = dict(version=lib.cu12_runtime_version(), cudart=lib_cudart(),
           torch_cuda=torch.version.cuda if FRAMEWORK == "torch" else None)
with cuda_debug.watch():
    for _ in range(5):
        lib.cu12_scale_launch(buf, N, 1.0, None)    # the context current, the kernel asked
    lib.cu12_sync()
    s0, h0 = _core.stats(), hooks()
    got = [work() for _ in range(10)]               # 30 launches
    s1, h1 = _core.stats(), hooks()
    if FRAMEWORK == "torch":
        x = torch.zeros(1000, device="cuda")
        for _ in range(20):
            x.add_(1)
        torch.cuda.synchronize()
        out["torch_routed"] = hooks()["routed"] - h1["routed"]
        out["x"] = x[0].item()
out.update(same=[g == ref for g in got], changed=ref != bytes(host), hooks=h1,
           routed=h1["routed"] - h0["routed"], watched=s1["watched"] - s0["watched"])
report(out)
""")
    assert r["version"] // 1000 == 12, r
    assert len(r["cudart"]) == 1, r                 # one libcudart.so.12 in the process
    assert r["same"] == [True] * 10 and r["changed"], r
    h = r["hooks"]
    assert r["watched"] >= 30, r                    # recorded, whichever way
    ours = os.path.realpath(h["runtime"]) == r["cudart"][0] if h["runtime"] else False
    if framework == "alone" or r["torch_cuda"].startswith("12."):
        # the only runtime (or PyTorch cu12's, shared by soname): routed through the hooks
        assert h["on"] == 1 and ours, h
        if r["routed"] != 30:
            # or left to the runtime's own function (CUPTI records each), with the
            # driver's reason: it did not take the runtime's kernel handle
            assert r["routed"] == 0 and h["unresolved"] >= 30 and h["unresolved_rc"] != 0, h
        assert h["handed_back"] == 0, h
    else:
        # beside PyTorch cu13: PyTorch's runtime routed, the library left alone and named
        assert h["on"] == 1 and not ours, h
        assert os.path.basename(h["runtime"]) == "libcudart.so.13", h
        assert os.path.realpath(h["other_runtime"]) == r["cudart"][0], h
        assert h["other_runtimes"] >= 1 and r["routed"] == 0, r
    if framework == "torch":
        assert r["x"] == 20.0 and r["torch_routed"] >= 20, r


@pytest.mark.parametrize("framework,mode", [("torch", 1), ("torch", 2), ("alone", 1)])
def test_a_fault_in_a_cu12_kernel_is_named_at_its_line(child, cu12rt, framework, mode):
    c, r = run_lib(child, cu12rt, framework, """
MODE = %d
assert lib.cu12_h2d(buf, host, N * 4) == 0
out = {}
try:
    with cuda_debug.watch():
        for _ in range(40):
            lib.cu12_scale_launch(buf, N, 1.0, None)
        lib.cu12_fault(MODE, buf, N, None)  # CULPRIT
        for _ in range(5):
            lib.cu12_scale_launch(buf, N, 1.0, None)
        cuda_debug.check()
        out["not_raised"] = True
except cuda_debug.CudaError as e:
    out = describe(e)
out["hooks"] = hooks()
report(out)
""" % mode)
    assert "not_raised" not in r, r
    want = {1: ("DeviceAssertError", 710, "cu12_check_index"),
            2: ("IllegalAddressError", 700, "cu12_poke")}[mode]
    assert (r["cls"], r["code"]) == want[:2], r
    # an illegal address has no device text: named, or (among the launches
    # since its stream's last marker) the likeliest, the one never seen finished
    assert want[2] in (r["kernel"] or r["likely"] or ""), r
    assert r["filename"] == c.script and r["lineno"] == c.line_of("# CULPRIT"), r
    assert "%s:%d" % (c.script, c.line_of("# CULPRIT")) in r["text"], r["text"]


CTX2 = """
import ctypes, os, sys
CU12 = sys.argv[1]
import torch
x = torch.ones(1000, device="cuda")
torch.cuda.synchronize()
import cuda_debug
from cuda_debug import _core, _report
cu = ctypes.CDLL("libcuda.so.1")
P, byref = ctypes.c_void_p, ctypes.byref

def ok(rc, what):
    assert rc == 0, "%s: CUresult %d" % (what, rc)

dev = ctypes.c_int()
ok(cu.cuDeviceGet(byref(dev), 0), "cuDeviceGet")
primary = P()
ok(cu.cuDevicePrimaryCtxRetain(byref(primary), dev), "cuDevicePrimaryCtxRetain")
ctx2 = P()
if hasattr(cu, "cuCtxCreate_v2"):           # CUDA 13 still exports it
    ok(cu.cuCtxCreate_v2(byref(ctx2), 0, dev), "cuCtxCreate_v2")
else:                                       # cuCtxCreate_v4(pctx, CUctxCreateParams*, flags, dev)
    params = (ctypes.c_char * 64)()
    ok(cu.cuCtxCreate_v4(byref(ctx2), params, 0, dev), "cuCtxCreate_v4")
# created current (pushed); PyTorch's work below pops it first
mod = P()
ok(cu.cuModuleLoad(byref(mod), os.path.join(CU12, "ctx2.cubin").encode()), "cuModuleLoad")
fn = {}
for name in ("ctx2_scale", "ctx2_check_index", "ctx2_empty"):
    f = P()
    ok(cu.cuModuleGetFunction(byref(f), mod, name.encode()), name)
    fn[name] = f
s2 = P()
ok(cu.cuStreamCreate(byref(s2), 1), "cuStreamCreate")          # CU_STREAM_NON_BLOCKING
N = 4096
dbuf = ctypes.c_uint64()
ok(cu.cuMemAlloc_v2(byref(dbuf), ctypes.c_size_t(N * 4)), "cuMemAlloc")
host = (ctypes.c_float * N)(*[i * 0.37 - 500.0 for i in range(N)])

def launch(name, *args):
    holders = [a if isinstance(a, ctypes._SimpleCData) else ctypes.c_int(a) for a in args]
    argv = (P * len(holders))(*[ctypes.cast(byref(h), P) for h in holders])
    return cu.cuLaunchKernel(fn[name], (N + 255) // 256, 1, 1, 256, 1, 1, 0, s2, argv, None)  # LAUNCH

def scale3():
    ok(cu.cuMemcpyHtoD_v2(dbuf, host, ctypes.c_size_t(N * 4)), "HtoD")
    # a pageable copy returns before its DMA ends, and s2 does not wait for the
    # legacy stream (non-blocking): the kernels must not start before it
    ok(cu.cuCtxSynchronize(), "sync")
    for a in (1.5, -0.25, 3.0):
        ok(launch("ctx2_scale", dbuf, ctypes.c_int(N), ctypes.c_float(a)), "launch")
    ok(cu.cuStreamSynchronize(s2), "sync")
    out = (ctypes.c_float * N)()
    ok(cu.cuMemcpyDtoH_v2(out, dbuf, ctypes.c_size_t(N * 4)), "DtoH")
    return bytes(out)

def pop():
    c = P()
    ok(cu.cuCtxPopCurrent_v2(byref(c)), "pop")
    assert c.value == ctx2.value
"""


def test_a_second_context_launches_are_recorded_in_it_and_a_fault_there_is_named(child, cu12rt):
    needs("torch")
    c = child(CTX2 + """
out = dict(distinct=ctx2.value != primary.value)
ref = scale3()                                     # unwatched, in the second context
out["changed"] = ref != bytes(host)
try:
    with cuda_debug.watch():
        seq0 = _core.watch_seq()
        got = scale3()                             # CTX2
        pop()
        for _ in range(10):
            x.add_(1)                              # PyTorch's, in its primary context
        torch.cuda.synchronize()
        ok(cu.cuCtxPushCurrent_v2(ctx2), "push")
        got2 = scale3()
        seq1 = _core.watch_seq()
        recs = [_report.watch_record(q) for q in range(seq0 + 1, seq1 + 1)]
        mine = [r for r in recs if r is not None and b"ctx2_scale" in r.kernel]
        out.update(same=[got == ref, got2 == ref], n=len(mine),
                   streams=sorted({r.stream for r in mine}), s2=s2.value,
                   devices=sorted({r.device for r in mine}),
                   others_on_s2=len([r for r in recs if r is not None and r.stream == s2.value
                                     and b"ctx2_scale" not in r.kernel]))
        for _ in range(20):
            launch("ctx2_empty")
        launch("ctx2_check_index", ctypes.c_int(N + 7), ctypes.c_int(N))  # CULPRIT
        launch("ctx2_empty")
        cuda_debug.check()
        out["not_raised"] = True
except cuda_debug.CudaError as e:
    out.update(cls=type(e).__name__, code=e.code, kernel=e.kernel, lineno=e.lineno,
               filename=e.filename, text=str(e))
report(out)
""", args=[cu12rt], timeout=180)
    r = c.result
    assert r is not None, c
    assert r["distinct"] and r["changed"], r
    assert r["same"] == [True, True], r
    # six launches of the second context's kernel, each recorded on its stream
    assert r["n"] == 6 and r["streams"] == [r["s2"]] and r["devices"] == [0], r
    assert r["others_on_s2"] == 0, r
    assert "not_raised" not in r, r
    assert r["cls"] == "DeviceAssertError" and r["code"] == 710, r
    assert "ctx2_check_index" in (r["kernel"] or ""), r
    # the launching line: the innermost of the user's frames, in its launch() helper
    assert r["filename"] == c.script and r["lineno"] == c.line_of("# LAUNCH"), r


def test_the_cu12_runtime_in_a_second_context_is_routed_and_named(child, cu12rt):
    """The CUDA 12 library alone (its runtime the hooks' one), its kernel met in
    the primary context first, then launched in a second one (cuCtxCreate
    current: the runtime uses it): same bits, recorded on the second context's
    stream, the hooks' kernel lookup asked there; a fault there named."""
    c, r = run_lib(child, cu12rt, "alone", """
cu = ctypes.CDLL("libcuda.so.1")
def run(b, stream):
    assert lib.cu12_h2d(b, host, N * 4) == 0
    assert lib.cu12_sync() == 0           # the copy's DMA done: s2 does not wait for it
    for a in (1.5, -0.25, 3.0):
        assert lib.cu12_scale_launch(b, N, a, stream) == 0
    out = (ctypes.c_float * N)()
    assert lib.cu12_sync() == 0 and lib.cu12_d2h(out, b, N * 4) == 0
    return bytes(out)
ref = run(buf, None)                               # primary context, unwatched
with cuda_debug.watch():
    first = run(buf, None)                         # routed: the kernel met in the primary context
dev = ctypes.c_int()
assert cu.cuDeviceGet(ctypes.byref(dev), 0) == 0
ctx2 = ctypes.c_void_p()
if hasattr(cu, "cuCtxCreate_v2"):
    assert cu.cuCtxCreate_v2(ctypes.byref(ctx2), 0, dev) == 0
else:
    assert cu.cuCtxCreate_v4(ctypes.byref(ctx2), (ctypes.c_char * 64)(), 0, dev) == 0
buf2, s2 = lib.cu12_alloc(N * 4), lib.cu12_stream()  # the second context's
assert buf2 and s2
from cuda_debug import _report
out = {}
try:
    with cuda_debug.watch():
        h0 = hooks()
        seq0 = _core.watch_seq()
        got = [run(buf2, s2) for _ in range(5)]
        seq1 = _core.watch_seq()
        h1 = hooks()
        recs = [_report.watch_record(q) for q in range(seq0 + 1, seq1 + 1)]
        mine = [r for r in recs if r is not None and b"cu12_scale" in r.kernel]
        out.update(same=[g == ref for g in got + [first]], n=len(mine), s2=s2,
                   streams=sorted({r.stream for r in mine}), routed=h1["routed"] - h0["routed"],
                   asked=h1["asked"] - h0["asked"], hooks=h1)
        lib.cu12_fault(1, buf2, N, s2)  # CULPRIT
        cuda_debug.check()
        out["not_raised"] = True
except cuda_debug.CudaError as e:
    out.update(describe(e))
report(out)
""")
    assert r["same"] == [True] * 6, r
    assert r["n"] == 15 and r["streams"] == [r["s2"]], r
    # routed (the kernel's lookup asked in the second context), or left to the
    # runtime's own function with the driver's reason (stats()'s "unresolved")
    assert (r["routed"] == 15 and r["asked"] >= 1) or (
        r["routed"] == 0 and r["hooks"]["unresolved"] >= 15), r
    assert "not_raised" not in r, r
    assert r["cls"] == "DeviceAssertError" and "cu12_check_index" in (r["kernel"] or ""), r
    assert r["filename"] == c.script and r["lineno"] == c.line_of("# CULPRIT"), r
