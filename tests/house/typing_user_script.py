"""A user's script: every public name of cuda_debug, used as the README and
docs/ show it. Never run (it needs a GPU): tests/house/test_import_and_types.py
type-checks it with mypy --strict and pyright (strict), against the installed
package, from outside the checkout. assert_type pins what the checkers infer,
so that a name typed as Any (or Unknown) fails too."""
import os
import pickle
import traceback
from typing import Any, Dict, List, Optional, Tuple

from typing_extensions import assert_type

import cuda_debug
import cuda_debug.bench
import cuda_debug.testing as t
from cuda_debug import bench


# -- watch() (README, docs/watch.md, docs/hangs.md) -------------------------------------------

def train(steps: int) -> float:
    return float(steps)


with cuda_debug.watch():
    train(10)
with cuda_debug.watch(hang_after=60):
    train(10)
with cuda_debug.watch(ops=True) as w:
    assert_type(w, cuda_debug.watch)
    assert_type(w.ops, bool)
    assert_type(w.enabled, bool)
with cuda_debug.watch(False):          # no watch, as guard(False) and launch_blocking(False)
    train(10)
with cuda_debug.watch(enabled=True, exact=True, hang_after=None):
    train(10)


@cuda_debug.watch
def step(n: int) -> int:
    return n


@cuda_debug.watch()
def step2(n: int) -> int:
    return n


assert_type(step(1) + step2(2), int)
assert_type(cuda_debug.is_watching(), bool)


# -- launch_blocking() (README, docs/launch_blocking.md) ---------------------------------------

with cuda_debug.launch_blocking():
    train(1)
    with cuda_debug.launch_blocking(False):
        train(1)
with cuda_debug.launch_blocking(all_threads=True):
    train(1)


@cuda_debug.launch_blocking
def blocked(n: int) -> int:
    return n


@cuda_debug.launch_blocking()
def blocked2(n: int) -> str:
    return str(n)


@cuda_debug.launch_blocking(all_threads=True)
async def blocked3(n: int) -> int:
    return n


assert_type(blocked(1), int)
assert_type(blocked2(1), str)
assert_type(cuda_debug.is_launch_blocking(), bool)
cuda_debug.check()
cuda_debug.check(0)
last: Optional[cuda_debug.CudaError] = cuda_debug.last_error()
assert_type(cuda_debug.last_error(), Optional[cuda_debug.CudaError])


# -- guard() (README, docs/guard.md) --------------------------------------------------------

with cuda_debug.guard():
    train(1)
with cuda_debug.guard(all_threads=True):
    with cuda_debug.guard(False):
        train(1)


@cuda_debug.guard
def guarded(n: int) -> int:
    return n


@cuda_debug.guard()
def guarded2(n: int) -> int:
    return n


assert_type(guarded(1) + guarded2(1), int)
assert_type(cuda_debug.is_guarding(), bool)

try:
    guarded(1)
except cuda_debug.GuardIndexError as g:
    assert_type(g, cuda_debug.GuardIndexError)
    index_error: IndexError = g
    print(g.op, g.argument, g.count, g.numel, g.valid, g.filename, g.lineno, g.function, g.line)
    assert_type(g.op, str)
    assert_type(g.argument, str)
    assert_type(g.values, List[Any])
    assert_type(g.positions, List[Tuple[int, ...]])
    assert_type(g.count, int)
    assert_type(g.numel, int)
    assert_type(g.valid, str)
    assert_type(g.shapes, Optional[List[Dict[str, Any]]])
    assert_type(g.rule, Tuple[str, str])
    assert_type(g.filename, Optional[str])
    assert_type(g.lineno, Optional[int])
    assert_type(g.function, Optional[str])
    assert_type(g.line, Optional[str])
    again = pickle.loads(pickle.dumps(g))
except cuda_debug.GuardValueError as g:
    value_error: ValueError = g
    print(g.op, g.values)
except cuda_debug.GuardError as g:
    print(str(g))


# -- the errors (docs/reports.md) ------------------------------------------------------------

try:
    with cuda_debug.launch_blocking():
        t.device_assert()                 # the README's >>> session
except cuda_debug.DeviceAssertError as e:
    assert_type(e.code, Optional[int])
    assert_type(e.name, Optional[str])
    assert_type(e.description, Optional[str])
    assert_type(e.sticky, bool)
    assert_type(e.kernel, Optional[str])
    assert_type(e.grid, Optional[Tuple[int, int, int]])
    assert_type(e.block, Optional[Tuple[int, int, int]])
    assert_type(e.shared_mem, Optional[int])
    assert_type(e.stream, Optional[int])
    assert_type(e.device, Optional[int])
    assert_type(e.filename, Optional[str])
    assert_type(e.lineno, Optional[int])
    assert_type(e.function, Optional[str])
    assert_type(e.line, Optional[str])
    assert_type(e.launch_stack, Optional[traceback.StackSummary])
    assert_type(e.device_message, Optional[str])
    assert_type(e.driver_log, Optional[List[str]])
    assert_type(e.op, Optional[str])
    assert_type(e.op_stack, Optional[List[str]])
    assert_type(e.inputs, Optional[List[Dict[str, Any]]])
    assert_type(e.found_at, Optional[str])
    assert_type(e.mechanism, Optional[str])
    assert_type(e.exact, Optional[bool])
    assert_type(e.candidates, Optional[List[Any]])
    assert_type(e.surfaced_at, Optional[str])
    assert_type(e.recent_launches, Optional[List[Any]])
    assert_type(e.later_exception, Optional[str])
    assert_type(e.compiled_function, Optional[str])
    assert_type(e.provenance, Optional[str])
    assert_type(e.graph_node, Optional[int])
    assert_type(e.captured_at, Optional[str])
    assert_type(e.replayed_at, Optional[str])
    assert_type(e.before_scope, Optional[bool])
    assert_type(e.consequences, Optional[int])
    if e.launch_stack is not None:
        print(traceback.format_list(e.launch_stack))
    err: cuda_debug.StickyCudaError = e
    base: RuntimeError = e
except (cuda_debug.IllegalAddressError, cuda_debug.LaunchFailureError,
        cuda_debug.MisalignedAddressError, cuda_debug.IllegalInstructionError,
        cuda_debug.InvalidAddressSpaceError, cuda_debug.InvalidPcError,
        cuda_debug.HardwareStackError, cuda_debug.LaunchTimeoutError) as e:
    print(e.kernel, e.code)
except cuda_debug.LaunchError as e:
    print(e.grid, e.block)
except cuda_debug.CudaUnavailableError as e:
    assert_type(e.missing, Optional[str])
except cuda_debug.ToolConflictError as e:
    assert_type(e.holder, Optional[str])
except cuda_debug.StickyCudaError as e:
    print(e.kernel)
except cuda_debug.CudaError as e:
    print(e.name, e.description)

fn, cls_name, code = t.FAULTS["device_assert"]
fn()
t.illegal_address()
t.trap()
t.misaligned_address(device=0, stream=0)
t.bad_launch()
t.empty()
t.spin(0.5)


# -- in_flight() (docs/hangs.md) -------------------------------------------------------------

for r in cuda_debug.in_flight():
    assert_type(r, cuda_debug.InFlight)
    print(r.short, r.collective, os.path.basename(r.filename or ""), r.lineno, round(r.age_s, 1),
          r.queue_depth, r.seq)
    assert_type(r.kernel, Optional[str])
    assert_type(r.graph, bool)
    assert_type(r.stream, int)
    assert_type(r.device, Optional[int])
    assert_type(r.thread_id, int)
    assert_type(r.thread_name, Optional[str])
    assert_type(r.function, Optional[str])
    assert_type(r.stack, List[Tuple[str, int, str, Optional[str]]])


# -- bench (docs/bench.md) -----------------------------------------------------------------

res = cuda_debug.bench.gemm(sizes=[1024, 4096, 8192], dtypes=["fp32", "tf32", "fp16", "bf16"],
                            modes=["async", "sync", "scope", "launch_blocking"], flags="sweep")
assert_type(res, bench.GemmResult)
print(res.array["slowdown"])
print(res.table())
res.plot("gemm.png")
res.to_csv("gemm.csv")
res.to_json("gemm.json")
lat = cuda_debug.bench.launch_latency()
assert_type(lat, bench.LatencyResult)
print(lat.table())
