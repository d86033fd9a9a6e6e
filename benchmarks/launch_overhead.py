"""What launch_blocking() costs, side by side with CUDA_LAUNCH_BLOCKING=1.

Usage:
    python benchmarks/launch_overhead.py [--reps 3] [--workloads tiny,resnet50,gemm]
                                         [--variants] [--json out.json]

Each configuration runs in a fresh child process (CUDA_LAUNCH_BLOCKING is only
read when the CUDA context is created, so it needs one anyway), the
configurations are interleaved, repeated --reps times, and the median is
reported. Configurations:

    never      cuda_debug never imported (the async baseline)
    imported   cuda_debug imported, no scope ever entered
    outside    cuda_debug imported, one scope entered and left, work done outside
    scope      the whole workload inside launch_blocking()
    watch      the whole workload inside watch()
    watch_outside  a watch() entered and left once, work done outside
    scope_loss (resnet50 only) only the loss computation inside a scope
    sync_loss  (resnet50 only) no cuda_debug; torch.cuda.synchronize() after the
               loss: the price of any one synchronisation at that point
    env        CUDA_LAUNCH_BLOCKING=1, no cuda_debug
    dispatch   (--extra) torch.profiler ran first (Kineto keeps CUPTI), then the
               whole workload inside launch_blocking(): the dispatch-level fallback
               that synchronises after every op
    watch_ops  (--extra) the whole workload inside watch(ops=True): each launch
               also records its PyTorch op and input shapes
    watch_hang (--extra) the whole workload inside watch(hang_after=60): the hang
               watcher's thread looks at the ring every second (compare with
               watch: target <= 1.005 on the steps; e.g. --configs watch,watch_hang)
    scope_mode (--extra) launch_blocking() plus a pass-through TorchDispatchMode:
               what a per-op dispatch hook for op/inputs would cost (not built:
               the ops come from the native stack at the fault instead)
--variants adds scopes under the debug switches (read once at import) that
take the cost apart: CUDA_DEBUG_WAIT=spin (poll cuStreamQuery instead of
cuStreamSynchronize), CUDA_DEBUG_CAPTURE=off (no assert-text capture),
CUDA_DEBUG_CAPTURE_CHECK=0 (no cuStreamIsCapturing: unsafe with graphs),
CUDA_DEBUG_WAIT=none (CUPTI subscribed, nothing synchronised: the cost of the
subscription alone), CUDA_DEBUG_PROFILE=1 (time spent inside the callback).

Workloads: tiny (x.add_(1), one launch each), transformer (4-layer
nn.TransformerEncoder, d=512, batch 16x256, AdamW), resnet50 (torchvision ResNet-50
training step, batch 32, fp32, SGD), gemm (torch.matmul(a, b, out=c), bf16 1024^3).
The table gives time per unit (us per launch, ms per step, us per matmul) and
the ratios the targets are about: scope/env (<= 1.00), outside/never (<= 1.01),
never/scope_loss (>= 0.97 of async speed).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(r"""
import contextlib, json, os, sys, time
config, workloads = sys.argv[1], sys.argv[2].split(",")
import torch
if config == "dispatch":             # Kineto takes CUPTI, for the rest of the process
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]):
        torch.zeros(1, device="cuda").add_(1)
    import warnings
    warnings.simplefilter("ignore")
if config not in ("never", "env", "sync_loss"):
    import cuda_debug
    from cuda_debug import launch_blocking, watch
    if config != "imported":
        warm = watch if config.startswith("watch") else launch_blocking
        with warm():                 # CUPTI loaded and released once, like a real user
            torch.zeros(1, device="cuda").add_(1)
else:
    import contextlib
    launch_blocking = watch = contextlib.nullcontext
whole = launch_blocking if (config.startswith("scope") and config != "scope_loss") or \
    config == "dispatch" else None
if config == "scope_mode":
    from torch.utils._python_dispatch import TorchDispatchMode
    class PassThrough(TorchDispatchMode):
        @classmethod
        def ignore_compile_internals(cls):
            return True
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))
    @contextlib.contextmanager
    def scope_and_mode():
        with launch_blocking(), PassThrough():
            yield
    whole = scope_and_mode
if config == "watch" or config.startswith("watch_"):
    whole = watch if config != "watch_outside" else None
if config == "watch_ops":
    whole = lambda: watch(ops=True)
if config == "watch_hang":
    whole = lambda: watch(hang_after=60)
region = whole or contextlib.nullcontext
out = {"config": config, "env": os.environ.get("CUDA_LAUNCH_BLOCKING"),
       "wait": os.environ.get("CUDA_DEBUG_WAIT"), "capture": os.environ.get("CUDA_DEBUG_CAPTURE")}

def timed(fn, n):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with region():
        for _ in range(n):
            fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n

if config not in ("never", "env", "sync_loss", "imported"):   # entering + leaving a scope
    t0 = time.perf_counter()
    for _ in range(200):
        with launch_blocking():
            pass
    out["scope_cycle_us"] = (time.perf_counter() - t0) / 200 * 1e6

if "tiny" in workloads:
    x = torch.zeros(1, device="cuda")
    timed(lambda: x.add_(1), 2000)
    out["tiny_us"] = timed(lambda: x.add_(1), 20000) * 1e6

if "gemm" in workloads:
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(1024, 1024, device="cuda", dtype=torch.bfloat16)
    timed(lambda: torch.matmul(a, b, out=c), 200)
    out["gemm_us"] = timed(lambda: torch.matmul(a, b, out=c), 3000) * 1e6

if "transformer" in workloads:
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                             batch_first=True)
    tmodel = torch.nn.TransformerEncoder(layer, num_layers=4).cuda()
    topt = torch.optim.AdamW(tmodel.parameters(), lr=1e-4)
    tx = torch.randn(16, 256, 512, device="cuda")
    def tstep():
        topt.zero_grad(set_to_none=True)
        loss = tmodel(tx).float().pow(2).mean()
        loss.backward()
        topt.step()
    timed(tstep, 5)
    out["transformer_ms"] = timed(tstep, 30) * 1e3

if "resnet50" in workloads:
    import torchvision
    model = torchvision.models.resnet50().cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    crit = torch.nn.CrossEntropyLoss()
    xb = torch.randn(32, 3, 224, 224, device="cuda")
    yb = torch.randint(0, 1000, (32,), device="cuda")
    @contextlib.contextmanager
    def synchronized():                  # what any one sync at the loss costs
        yield
        torch.cuda.synchronize()
    loss_region = {"scope_loss": launch_blocking, "sync_loss": synchronized}.get(
        config, contextlib.nullcontext)
    def step():
        opt.zero_grad(set_to_none=True)
        y = model(xb)
        with loss_region():
            loss = crit(y, yb)
        loss.backward()
        opt.step()
    timed(step, 8)
    out["resnet50_ms"] = timed(step, 25) * 1e3
if config not in ("never", "env", "sync_loss"):
    st = cuda_debug._core.stats()
    out["stats"] = {k: st[k] for k in ("synced", "watched", "unmarked", "subscribes", "ns_wait",
                                       "ns_callback") if k in st}
print("RESULT " + json.dumps(out))
""")

BASE = ["never", "imported", "outside", "scope", "env", "watch", "watch_outside"]
VARIANTS = {
    "scope_spin": {"CUDA_DEBUG_WAIT": "spin"},
    "scope_nocapture": {"CUDA_DEBUG_CAPTURE": "off"},
    "scope_nocheck": {"CUDA_DEBUG_CAPTURE_CHECK": "0"},      # unsafe with graphs: measuring only
    "scope_nowait": {"CUDA_DEBUG_WAIT": "none"},             # CUPTI subscribed, nothing synced
    "scope_profile": {"CUDA_DEBUG_PROFILE": "1"},            # time spent inside the callback
}


def run_child(config, workloads):
    env = dict(os.environ)
    for k in ("CUDA_LAUNCH_BLOCKING", "CUDA_DEBUG_WAIT", "CUDA_DEBUG_CAPTURE",
              "CUDA_DEBUG_CAPTURE_CHECK", "CUDA_DEBUG_PROFILE"):
        env.pop(k, None)
    if config == "env":
        env["CUDA_LAUNCH_BLOCKING"] = "1"
    env.update(VARIANTS.get(config, {}))
    import _common
    return _common.child_result([sys.executable, "-c", CHILD, config, ",".join(workloads)],
                                env, 600, config)


def versions():
    import torch
    import cuda_debug
    from cuda_debug import _core, _libraries
    _libraries.ensure("cuda")
    info = _core.device_info(0)
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                         text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    return dict(gpu=info[0] if isinstance(info, tuple) else "?",
                driver=_core.driver_version(), torch=torch.__version__,
                cuda=torch.version.cuda, cuda_debug=cuda_debug.__version__,
                commit=os.environ.get("CUDA_DEBUG_COMMIT") or rev.stdout.strip() or "?")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workloads", default="tiny,transformer,resnet50,gemm")
    ap.add_argument("--variants", action="store_true")
    ap.add_argument("--extra", default="", help="comma-separated variants to add, e.g. scope_profile")
    ap.add_argument("--configs", help="run only these (comma-separated)")
    ap.add_argument("--json")
    a = ap.parse_args()
    workloads = a.workloads.split(",")
    configs = list(BASE)
    if "resnet50" in workloads:
        configs += ["scope_loss", "sync_loss"]
    if a.variants:
        configs += list(VARIANTS)
    configs += [c for c in a.extra.split(",") if c and c not in configs]
    if a.configs:
        configs = a.configs.split(",")
    runs = {c: [] for c in configs}
    for rep in range(a.reps):
        for c in configs:
            r = run_child(c, workloads)
            runs[c].append(r)
            print("rep %d %-20s %s %s" % (rep, c, {k: round(v, 2) for k, v in r.items()
                                                    if isinstance(v, float)},
                                          r.get("stats") or ""), flush=True)
    metrics = [m for m in ("tiny_us", "transformer_ms", "resnet50_ms", "gemm_us")
               if any(m in r for rs in runs.values() for r in rs)]
    med = {c: {m: statistics.median(r[m] for r in rs) for m in metrics if m in rs[0]}
           for c, rs in runs.items()}
    v = versions()
    lines = ["GPU %(gpu)s, driver %(driver)s, CUDA %(cuda)s, PyTorch %(torch)s, "
             "cuda_debug %(cuda_debug)s @ %(commit)s; median of %%d runs" % v % a.reps, "",
             "| config | " + " | ".join(metrics) + " |",
             "|---" * (len(metrics) + 1) + "|"]
    for c in configs:
        lines.append("| %s | " % c + " | ".join("%.2f" % med[c][m] if m in med[c] else "-"
                                                for m in metrics) + " |")
    lines += ["", "| ratio | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    ratios = {}
    for name, num, den in [("scope / env (target <= 1.00)", "scope", "env"),
                           ("watch / never (target <= 1.05 steps, 1.35 tiny)", "watch", "never"),
                           ("env / never", "env", "never"),
                           ("watch_outside / never (target <= 1.01)", "watch_outside", "never"),
                           ("outside / never (target <= 1.01)", "outside", "never"),
                           ("imported / never", "imported", "never"),
                           ("scope_loss / never (target <= 1.031)", "scope_loss", "never"),
                           ("sync_loss / never", "sync_loss", "never"),
                           ("dispatch / scope (fallback vs CUPTI)", "dispatch", "scope"),
                           ("dispatch / env", "dispatch", "env"),
                           ("scope_mode / scope (per-op hook)", "scope_mode", "scope"),
                           ("watch_ops / never", "watch_ops", "never"),
                           ("watch_ops / watch", "watch_ops", "watch"),
                           ("watch_hang / watch (target <= 1.005)", "watch_hang", "watch")] + \
            [("%s / %s" % (c, "never" if c.startswith("watch") else "env"), c,
              "never" if c.startswith("watch") else "env") for c in configs if c in VARIANTS]:
        if num not in med or den not in med:
            continue
        row = []
        for m in metrics:
            if m in med[num] and m in med[den]:
                ratios[(name, m)] = med[num][m] / med[den][m]
                row.append("%.3f" % ratios[(name, m)])
            else:
                row.append("-")
        lines.append("| %s | " % name + " | ".join(row) + " |")
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(versions=v, runs=runs, median=med), f, indent=1)


if __name__ == "__main__":
    main()
