"""A DDP training step under torchrun: async, in a scope, under watch, and with
CUDA_LAUNCH_BLOCKING=1; watch against unwatched A/B in one run; or a device
assert on rank 1 (the tests' fault program).

Usage:
    python benchmarks/ddp_step.py --compare [--gpus 2] [--steps 50]
        runs torchrun --standalone --nproc_per_node N once per mode and prints ms/step
    python benchmarks/ddp_step.py --gloo-shared [--nproc 2] [--rounds 10] [--steps 20]
        one torchrun whose ranks share one GPU (cuda:0), DDP over gloo (the
        collectives on the CPU): the A/B below (issue 39, item 2)
    python benchmarks/ddp_step.py --ab [--backend nccl] [--nproc 2] [--rounds 10] [--steps 20]
        the same A/B with one GPU per rank (NCCL: two GPUs; `--shared` puts every
        rank on cuda:0)
    torchrun --standalone --nproc_per_node 2 benchmarks/ddp_step.py MODE [--fault]
        MODE: async | scope | watch (the step inside launch_blocking() / watch());
        --fault: rank 1 indexes past an embedding at step 3 (a device assert)

Model: 3 Linear(W, W) layers with ReLU (W = --width, 2048), batch 64, SGD,
DistributedDataParallel; --compare: NCCL, time per step of rank 0, median of 5
blocks after 10 warm-up steps.

The A/B (--ab, --gloo-shared), in the style of launch_hooks_ab.py: one job, one
process per rank; each round times a block of --steps steps once per variant,
in an order that rotates from round to round (every rank runs the same
schedule): unwatched, watch() (the always-on mode) and watch(exact=True) (a
completion marker behind every launch). Each block opens its variant, runs one
untimed step, waits for the GPU, meets the other ranks at a barrier, then
times its steps to the GPU's end. A variant's ratio in a round is its time over
that round's unwatched time, on rank 0; printed: the median ratio over the
rounds and the 25-75% range, then a one-line summary last. The collective sets
the pace of every rank, so this is the per-rank cost of the hooks and markers
beside a collective, not a multi-GPU figure where the ranks share one GPU.
"""
import argparse
import os
import statistics
import subprocess
import sys
import time


def worker(mode: str, steps: int, fault: bool) -> None:
    import torch
    import torch.distributed as dist
    import cuda_debug
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    dev = torch.device("cuda", local)
    model = torch.nn.Sequential(*[m for _ in range(3) for m in (torch.nn.Linear(2048, 2048),
                                                                  torch.nn.ReLU())]).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(64, 2048, device=dev)
    table = torch.randn(10, 4, device=dev)
    region = {"scope": cuda_debug.launch_blocking, "watch": cuda_debug.watch}.get(mode)

    def step(i):
        opt.zero_grad(set_to_none=True)
        loss = ddp(x).pow(2).mean()
        if fault and rank == 1 and i == 3:
            bad = torch.tensor([100], device=dev)
            loss = loss + torch.nn.functional.embedding(bad, table).sum()  # FAULT
        loss.backward()
        opt.step()

    def run(n, start):
        if region is None:
            for i in range(n):
                step(start + i)
        else:
            with region():
                for i in range(n):
                    step(start + i)
        torch.cuda.synchronize()

    run(10, 0)
    times = []
    for b in range(5):
        t0 = time.perf_counter()
        run(steps // 5, 10 + b * (steps // 5))
        times.append((time.perf_counter() - t0) / (steps // 5) * 1e3)
    if rank == 0:
        print("RESULT %s %.3f" % (mode, statistics.median(times)), flush=True)
    dist.destroy_process_group()


VARIANTS = ("plain", "watch", "exact")


def worker_ab(backend: str, shared: bool, rounds: int, steps: int, width: int,
              variants) -> None:
    """One rank of the A/B (see the module's docstring); rank 0 prints a RESULT line."""
    import contextlib
    import json
    import torch
    import torch.distributed as dist
    import cuda_debug
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    index = 0 if shared else local
    torch.cuda.set_device(index)
    dist.init_process_group(backend)
    dev = torch.device("cuda", index)
    model = torch.nn.Sequential(*[m for _ in range(3) for m in (torch.nn.Linear(width, width),
                                                                  torch.nn.ReLU())]).to(dev)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[index])
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    x = torch.randn(64, width, device=dev)

    def step():
        opt.zero_grad(set_to_none=True)
        ddp(x).pow(2).mean().backward()
        opt.step()

    def region(variant):
        if variant == "plain":
            return contextlib.nullcontext()
        return cuda_debug.watch(exact=variant == "exact")

    def block(variant, n):
        with region(variant):
            step()                  # untimed: a new watch asks for each kernel once
            torch.cuda.synchronize()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(n):
                step()
            torch.cuda.synchronize()
            return (time.perf_counter() - t0) / n * 1e3

    for _ in range(5):
        step()
    for v in variants:
        block(v, 2)
    times = {v: [] for v in variants}
    for r in range(rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:
            times[v].append(block(v, steps))
    if rank == 0:
        print("RESULT " + json.dumps({
            "times_ms": times, "backend": backend, "shared": shared, "ranks":
            dist.get_world_size(), "rounds": rounds, "steps": steps, "width": width,
            "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                         "gpu": torch.cuda.get_device_name(dev),
                         "commit": os.environ.get("CUDA_DEBUG_COMMIT", "")}}), flush=True)
    dist.destroy_process_group()


def _q(vals, f):
    s = sorted(vals)
    return s[min(len(s) - 1, int(f * len(s)))]


def ab(backend: str, shared: bool, nproc: int, rounds: int, steps: int, width: int,
       variants, json_path=None) -> int:
    """Start the A/B job under torchrun, print its table, then one summary line."""
    import json
    here = os.path.abspath(__file__)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(nproc), here, "--ab-worker", "--backend", backend, "--rounds", str(rounds),
           "--steps", str(steps), "--width", str(width), "--variants", ",".join(variants)] + \
        (["--shared"] if shared else [])
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    found = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    if p.returncode != 0 or not found:
        print(p.stdout[-3000:], p.stderr[-6000:])
        print("ddp_step --ab: the job failed (rc %d)" % p.returncode)
        return 1
    res = json.loads(found[-1][len("RESULT "):])
    times = res["times_ms"]
    ratios = {v: [t / b for t, b in zip(times[v], times["plain"])] for v in variants
              if v != "plain"}
    res["median_ms"] = {v: statistics.median(ts) for v, ts in times.items()}
    res["ratio"] = {v: statistics.median(rs) for v, rs in ratios.items()}
    res["ratio_iqr"] = {v: [_q(rs, 0.25), _q(rs, 0.75)] for v, rs in ratios.items()}
    where = "sharing cuda:0" if shared else "one GPU each"
    ver = res["versions"]
    print("DDP step, %d ranks %s (%s), 3 Linear(%d) layers, batch 64; %d rounds of %d steps; "
          "%s, torch %s, CUDA %s" % (res["ranks"], where, backend, width, rounds, steps,
                                     ver["gpu"], ver["torch"], ver["cuda"]))
    print("| variant | ms/step (median) | ratio to unwatched (median, 25-75%) |")
    print("|---|---|---|")
    names = {"plain": "unwatched", "watch": "`watch()` (always on)",
             "exact": "`watch(exact=True)`"}
    for v in variants:
        print("| %s | %.3f | %s |" % (names[v], res["median_ms"][v], "1" if v == "plain" else
                                      "%.3f (%.3f-%.3f)" % (res["ratio"][v],
                                                            *res["ratio_iqr"][v])))
    if json_path:
        with open(json_path, "w") as f:
            json.dump(res, f, indent=1)
    flag = "--gloo-shared" if backend == "gloo" and shared else "--ab --backend %s%s" % (
        backend, " --shared" if shared else "")
    print("ddp_step %s: %s of unwatched %.2f ms/step (%d ranks %s, %s; %d rounds x %d steps)" % (
        flag, ", ".join("%s %.3fx (%.3f-%.3f)" % (v, res["ratio"][v], *res["ratio_iqr"][v])
                        for v in variants if v != "plain"),
        res["median_ms"]["plain"], res["ranks"], where, backend, rounds, steps))
    return 0


def compare(gpus: int, steps: int) -> None:
    here = os.path.abspath(__file__)
    out = {}
    for mode, env in [("async", {}), ("scope", {}), ("watch", {}),
                      ("CUDA_LAUNCH_BLOCKING=1", {"CUDA_LAUNCH_BLOCKING": "1"})]:
        e = dict(os.environ, **env)
        arg = "async" if mode.startswith("CUDA") else mode
        p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            "--nproc_per_node", str(gpus), here, arg, "--steps", str(steps)],
                           capture_output=True, text=True, env=e, timeout=300)
        ms = [l.split()[2] for l in p.stdout.splitlines() if l.startswith("RESULT")]
        out[mode] = float(ms[0]) if ms else None
        if not ms:
            print(p.stdout[-2000:], p.stderr[-3000:])
    base = out.get("async")
    print("| mode | ms/step | vs async |\n|---|---|---|")
    for mode, ms in out.items():
        print("| %s | %s | %s |" % (mode, "%.3f" % ms if ms else "-",
                                    "%.3f" % (ms / base) if ms and base else "-"))


def main():
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("mode", nargs="?", choices=["async", "scope", "watch"])
    ap.add_argument("--fault", action="store_true")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--steps", type=int, default=None,
                    help="steps: --compare's total (50), the A/B's per block (20)")
    ap.add_argument("--ab", action="store_true", help="watch vs unwatched in one job")
    ap.add_argument("--gloo-shared", action="store_true",
                    help="the A/B with every rank on cuda:0 and DDP over gloo")
    ap.add_argument("--backend", choices=["gloo", "nccl"], default=None)
    ap.add_argument("--shared", action="store_true", help="the A/B: every rank on cuda:0")
    ap.add_argument("--nproc", type=int, default=2, help="the A/B's ranks")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--width", type=int, default=2048)
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="of %s, comma-separated (plain is always run)" % ",".join(VARIANTS))
    ap.add_argument("--json", help="the A/B: write its times and ratios here")
    ap.add_argument("--ab-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    variants = ["plain"] + [v for v in a.variants.split(",") if v in VARIANTS and v != "plain"]
    if a.gloo_shared:
        a.ab, a.shared, a.backend = True, True, a.backend or "gloo"
    if a.ab_worker:
        worker_ab(a.backend or "nccl", a.shared, a.rounds, a.steps or 20, a.width, variants)
    elif a.ab:
        sys.exit(ab(a.backend or "nccl", a.shared, a.nproc, a.rounds, a.steps or 20, a.width,
                    variants, a.json))
    elif a.compare:
        compare(a.gpus, a.steps or 50)
    else:
        worker(a.mode or "async", a.steps or 50, a.fault)


if __name__ == "__main__":
    main()
