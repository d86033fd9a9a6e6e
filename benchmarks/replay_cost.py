"""What reaching a fault at launch #N costs under `cuda-debug replay`, against the plain run.

Usage:
    python benchmarks/replay_cost.py [--steps 60] [--fault-step 50] [--rounds 3]
                                     [--compute-sanitizer] [--json out.json]

The program: a transformer training loop (4-layer nn.TransformerEncoder, d=512, batch
16x256, AdamW, seeded) that, before step S, launches a kernel storing through a wild
pointer (cuda_debug.testing.illegal_address: a real illegal address, 700), then waits.
`cuda-debug run` runs it once first: its report names the culprit and prints the replay
command (launch N, kernel K). Then, in fresh processes, interleaved, `--rounds` times:

  plain     python prog.py              wall time until it dies of the fault
  replay    python -m cuda_debug replay --launch N --kernel K prog.py
                                        wall time until its report (the fault named)
  sanitizer compute-sanitizer --kernel-name kns=write_wild --launch-skip 0
            --launch-count 1 python prog.py   (with --compute-sanitizer; NVIDIA's CLI)

Each program also prints the time of its loop up to the fault ("loop"): the cost per
step, without the process start and the imports. Reports the median of each, the ratios
to plain (the target for replay: <= 3x the plain run; compute-sanitizer was measured at
40-73x per step), and whether the replay named the fault (thread, address).
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from _common import environment

PROGRAM = '''\
import sys, time
import torch
import cuda_debug.testing as t
steps, fault = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 4).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
xb = torch.randn(16, 256, 512, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
for i in range(steps):
    if i == fault:
        torch.cuda.synchronize()
        print("LOOP_S %.4f" % (time.perf_counter() - t0), flush=True)
        t.illegal_address()                      # the culprit
        torch.cuda.synchronize()
    opt.zero_grad(set_to_none=True)
    model(xb).float().pow(2).mean().backward()
    opt.step()
print("no fault", flush=True)
'''


def timed(cmd, env, timeout):
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"wall": None, "loop": None, "rc": None, "out": "timeout"}
    wall = time.perf_counter() - t0
    m = re.search(r"LOOP_S ([\d.]+)", p.stdout)
    return {"wall": wall, "loop": float(m.group(1)) if m else None, "rc": p.returncode,
            "out": p.stdout + p.stderr, "tail": (p.stdout + p.stderr)[-1500:]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--fault-step", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compute-sanitizer", action="store_true")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json")
    a = ap.parse_args()
    work = tempfile.mkdtemp(prefix="cuda_debug_replay_cost_")
    prog = os.path.join(work, "prog.py")
    with open(prog, "w") as f:
        f.write(PROGRAM)
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    args = [prog, str(a.steps), str(a.fault_step)]
    py = sys.executable

    first = timed([py, "-m", "cuda_debug", "run"] + args, env, a.timeout)
    m = re.search(r"replay --launch (\d+) --kernel (\S+)", first["out"])
    if not m:
        sys.exit("the watch report printed no replay command:\n%s" % first["out"][-3000:])
    launch, kernel = m.group(1), m.group(2)
    print("culprit: launch #%s, kernel %s (from `cuda-debug run`)" % (launch, kernel))
    variants = {
        "plain": [py] + args,
        "replay": [py, "-m", "cuda_debug", "replay", "--launch", launch, "--kernel", kernel]
                  + args,
    }
    if a.compute_sanitizer:
        from cuda_debug import _libraries
        pf = _libraries.pathfinder()
        exe = (pf.find_nvidia_binary_utility("compute-sanitizer") if pf else None) or \
            shutil.which("compute-sanitizer")
        if exe:
            variants["sanitizer"] = [exe, "--kernel-name", "kns=write_wild", "--launch-skip", "0",
                                     "--launch-count", "1", "--print-limit", "1",
                                     "--show-backtrace", "no", py] + args
        else:
            print("compute-sanitizer not found: left out")
    runs = {k: [] for k in variants}
    for rnd in range(a.rounds):
        for name, cmd in variants.items():
            r = timed(cmd, env, a.timeout)
            runs[name].append(r)
            print("round %d %-9s wall %s loop %s rc %s" % (
                rnd + 1, name, "%.2f s" % r["wall"] if r["wall"] else "-",
                "%.3f s" % r["loop"] if r["loop"] is not None else "-", r["rc"]), flush=True)
    named = [bool(re.search(r"wrote 4 bytes at 0x100, in no allocation", r["out"]))
             for r in runs["replay"]]

    def med(name, key):
        vals = [r[key] for r in runs[name] if r[key] is not None]
        return statistics.median(vals) if vals else None

    rows = []
    base_wall, base_loop = med("plain", "wall"), med("plain", "loop")
    for name in variants:
        wall, loop = med(name, "wall"), med(name, "loop")
        rows.append({"variant": name, "wall_s": wall, "loop_s": loop,
                     "wall_ratio": wall / base_wall if wall and base_wall else None,
                     "loop_ratio": loop / base_loop if loop and base_loop else None})
    print("\n%-10s %10s %8s %10s %8s" % ("variant", "wall s", "x plain", "loop s", "x plain"))
    for r in rows:
        print("%-10s %10s %8s %10s %8s" % (
            r["variant"], "%.2f" % r["wall_s"] if r["wall_s"] else "-",
            "%.2f" % r["wall_ratio"] if r["wall_ratio"] else "-",
            "%.3f" % r["loop_s"] if r["loop_s"] else "-",
            "%.2f" % r["loop_ratio"] if r["loop_ratio"] else "-"))
    print("replay named the fault (thread, address): %d of %d runs" % (sum(named), len(named)))
    print("steps %d, fault before step %d (launch #%s)" % (a.steps, a.fault_step, launch))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"environment": environment(), "launch": int(launch), "kernel": kernel,
                       "steps": a.steps, "fault_step": a.fault_step, "rows": rows,
                       "named": named, "runs": {k: [{kk: vv for kk, vv in r.items()
                                                     if kk != "out"} for r in v]
                                                 for k, v in runs.items()}}, f, indent=1)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
