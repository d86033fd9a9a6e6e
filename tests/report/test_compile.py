"""torch.compile'd functions in reports, on CPU: the call line, not the def line.

TorchDynamo runs a compiled function as a code object of its own making, in
the user's file, under the function's name, whose line is the ``def`` (or
``@torch.compile``) line: a kernel its graph launched was reported there. Such
a frame (its code calls the compiled graph, a global ``__compiled_fn_...``) is
``LOC_COMPILED``: the report names the caller's line (the call of the compiled
function), names the compiled function, and says the source line is unknown
unless Inductor's line map gives one.

- the fake driver (no torch: PyTorch's libraries cannot load beside the fake
  CUPTI) launches from a user-file function that calls ``__compiled_fn_1``, as
  Dynamo's code does, through library frames, in a scope and while watching;
- real TorchDynamo code objects (torch on CPU, no driver): C classifies them,
  and Python picks the caller;
- Inductor's line map read from a real CPU compile.

The GPU side is tests/report/test_reports_you_can_trust.py::test_torch_compile_*.
"""
import pytest

from conftest import needs, run_child

# A stand-in for TorchDynamo's code: `f` calls the graph through a global named
# __compiled_fn_1 (as Dynamo's transformed code does); the graph's frames are
# library code (here a pseudo-file, as Inductor's cache folder is), nested
# deeper than the watch ring keeps, and launch the kernel.
DYNAMO_LIKE = '''
import cuda_debug
LIB = """
def graph(depth):
    if depth:
        return graph(depth - 1)
    return fake.fake_launch(b"triton_poi_fused_index_0", 0, 1, 1, 1, 32, 1, 1)
"""
lib = {"fake": fake}
exec(compile(LIB, "<inductor_like>", "exec"), lib)
globals()["__compiled_fn_1"] = lib["graph"]      # (a name the module code must not hold)

def f(depth):                                    # DEF
    return __compiled_fn_1(depth)               # GRAPH
'''


def _check_compiled(c, r, what):
    call = c.line_of("# CALL")
    assert r["lineno"] == call and r["function"] == "<module>", r
    assert r["compiled"] == "f", r
    # (Dynamo's own frame is at the def line; this stand-in's at its return line)
    assert "\n  torch.compile: inside torch.compile'd f (%s:%d); source line unknown (Inductor's " \
           "generated code for this kernel was not found)\n" % (c.script, c.line_of("# GRAPH")) \
        in r["text"], r["text"]
    block = "launched at %s:%d in <module>, inside torch.compile'd f (its source line is " \
            "unknown)" % (c.script, call)
    assert block in c.stderr, c.stderr
    assert "at %s:%d" % (c.script, c.line_of("# GRAPH")) not in c.stderr + r["text"], \
        (c.stderr, r["text"])


@pytest.mark.parametrize("depth", [0, 6])
def test_launch_blocking_names_the_call_of_a_compiled_function(fake_child, depth):
    c = fake_child(DYNAMO_LIKE + '''
fake.fake_set_kernel(b"triton_poi_fused_index_0", 710, -1, b"index out of bounds", -1, 0)
try:
    with cuda_debug.launch_blocking():
        f(%d)                                    # CALL
except cuda_debug.CudaError as e:
    report(dict(lineno=e.lineno, function=e.function,
                compiled=getattr(e, "compiled_function", None), text=str(e)))
''' % depth)
    assert c.result is not None, c
    _check_compiled(c, c.result, "launch_blocking")


@pytest.mark.parametrize("depth", [0, 6])
def test_watch_names_the_call_of_a_compiled_function(fake_child, depth):
    """The watch ring keeps 4 frames: the innermost, the compiled function's
    and the user's, however deep the graph's library frames go."""
    c = fake_child(DYNAMO_LIKE + '''
fake.fake_set_async(1)      # the kernel runs 20 ms after its launch was recorded
fake.fake_set_kernel(b"triton_poi_fused_index_0", 710, -1, b"index out of bounds", -1, 20000)
try:
    with cuda_debug.watch():
        f(%d)                                    # CALL
        if fake.fake_ctx_sync():                 # a framework meets the fault later
            raise RuntimeError("CUDA error: device-side assert triggered")
except cuda_debug.CudaError as e:
    report(dict(lineno=e.lineno, function=e.function,
                compiled=getattr(e, "compiled_function", None), text=str(e)))
''' % depth)
    assert c.result is not None, c
    _check_compiled(c, c.result, "watch")


def test_real_dynamo_frames_are_compiled_and_the_caller_is_the_users():
    """Real TorchDynamo code objects (torch on CPU): the frame that runs a
    compiled function, here at a graph break calling an eager function, is
    LOC_COMPILED by C's rule; the user frame of the stack is the call line."""
    needs("torch")
    c = run_child('''
import sys, torch
from cuda_debug import _core, _locations
SEEN = []

@torch._dynamo.disable
def eager(x):
    stack = _locations.stack_from(frame=sys._getframe(1))
    user, compiled = _locations.user_frame(stack), _locations.compiled_frame(stack)
    dyn = [f for f, _ in __import__("traceback").walk_stack(sys._getframe(1))
           if f.f_code.co_name == "f"]
    SEEN.append(dict(user=[user.lineno, user.name], compiled=compiled and compiled.name,
                     kinds=[_core.code_kind(f.f_code) for f in dyn],
                     plain=_core.code_kind(g.__code__)))
    return x

@torch.compile(backend="eager")
def f(x):                 # DEF
    y = x * 2
    eager(y)
    return y + 1

def g():
    pass

f(torch.randn(3))         # CALL
report(SEEN[-1])
''', timeout=240)
    r = c.result
    assert r is not None, c
    import cuda_debug._core as core
    assert r["kinds"] and set(r["kinds"]) == {core.LOC_COMPILED}, r
    assert r["plain"] == core.LOC_USER
    assert r["user"] == [c.line_of("# CALL"), "<module>"], r
    assert r["compiled"] == "f", r


def test_inductors_line_map_gives_the_source_line(tmp_path):
    """A real CPU compile: the line of the generated `call` that runs the
    kernel maps (PyCodeCache's line map) to the last source line the kernel
    fused; the report says it, with the compiled function's name."""
    needs("torch")
    c = run_child('''
import torch, traceback
from cuda_debug import _report

@torch.compile
def f(x, i):              # DEF
    y = x[i] * 2
    return y.sum()        # LAST

f(torch.randn(100), torch.tensor([5]))
from torch._inductor.codecache import PyCodeCache
path = [p for p, m in PyCodeCache.linemaps.items() if m][-1]
lines = open(path).read().splitlines()
kernel = next(l.split(" = ")[0] for l in lines if l.startswith("cpp_fused"))
call = next(n for n, l in enumerate(lines, 1) if l.strip().startswith(kernel + "("))
stack = traceback.StackSummary.from_list([(__file__, 1, "<module>", None),
                                          (path, call, "call", None)])
DEF = next(n for n, l in enumerate(open(__file__).read().splitlines(), 1) if "# DEF" in l)
compiled = traceback.FrameSummary(__file__, DEF, "f", lookup_line=False)
report(dict(text=_report.inductor_provenance(kernel, stack, compiled),
            alone=_report.inductor_provenance(kernel, stack[:1], None)))
''', timeout=240, env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torchinductor_cache")})
    r = c.result
    assert r is not None, c
    assert r["text"].startswith("inside torch.compile'd f (%s:%d); fused up to %s:%d in f:  "
                                "return y.sum()        # LAST (Inductor's line map)"
                                % (c.script, c.line_of("# DEF"), c.script, c.line_of("# LAST"))), r
    # the generated module found without the launching stack (a watch record)
    assert "fused up to %s:%d in f" % (c.script, c.line_of("# LAST")) in r["alone"], r
