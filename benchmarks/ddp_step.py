"""A DDP training step under torchrun: async, in a scope, under watch, and with
CUDA_LAUNCH_BLOCKING=1; or a device assert on rank 1 (the tests' fault program).

Usage:
    python benchmarks/ddp_step.py --compare [--gpus 2] [--steps 50]
        runs torchrun --standalone --nproc_per_node N once per mode and prints ms/step
    torchrun --standalone --nproc_per_node 2 benchmarks/ddp_step.py MODE [--fault]
        MODE: async | scope | watch (the step inside launch_blocking() / watch());
        --fault: rank 1 indexes past an embedding at step 3 (a device assert)

Model: 3 Linear(2048, 2048) layers with ReLU, batch 64, SGD, DistributedDataParallel
over NCCL; time per step of rank 0, median of 5 blocks after 10 warm-up steps.
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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", nargs="?", choices=["async", "scope", "watch"])
    ap.add_argument("--fault", action="store_true")
    ap.add_argument("--compare", action="store_true")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()
    if a.compare:
        compare(a.gpus, a.steps)
    else:
        worker(a.mode or "async", a.steps, a.fault)


if __name__ == "__main__":
    main()
