"""A training run under one always-on watch(), as users leave it, with a fault at the end.

Usage:
    python benchmarks/soak.py [--minutes 10] [--json out.json]     # both runs, side by side
    python benchmarks/soak.py --run watched|plain --minutes M      # one run (a child)

Two processes run the same loop at the same time on the same GPU, one inside
one cuda_debug.watch() for the whole run, one without: a transformer training
step (4-layer encoder, d=512, batch 16x256, AdamW) fed by a DataLoader with 2
worker processes; every 200 steps a torch.profiler window of 5 steps (with
schedule=), a CUDA graph captured and replayed 20 times, and a short thread
that launches a few kernels. After M minutes each run indexes an embedding
out of range. The watched run must name that kernel exactly, at its line;
RSS growth (from step 100 on) is printed beside the unwatched run's.

Prints one JSON line per run and a summary last.
"""
import argparse
import json
import os
import subprocess
import sys
import threading
import time


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return 0.0


def one_run(watched, minutes):
    import torch
    import cuda_debug
    from cuda_debug import _core
    from torch.profiler import profile, ProfilerActivity, schedule

    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                             batch_first=True)
    enc = torch.nn.TransformerEncoder(layer, num_layers=4).cuda()
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-4)
    emb = torch.nn.Embedding(10, 512).cuda()
    data = torch.utils.data.TensorDataset(torch.randn(512, 256, 512))
    loader = torch.utils.data.DataLoader(data, batch_size=16, num_workers=2,
                                         persistent_workers=True)

    def step(xb):
        opt.zero_grad(set_to_none=True)
        enc(xb).float().pow(2).mean().backward()
        opt.step()

    def side_thread():
        y = torch.ones(1024, device="cuda")
        for _ in range(10):
            y = y * 1.0001
        torch.cuda.synchronize()

    def graph_round():
        g = torch.cuda.CUDAGraph()
        xs = torch.randn(16, 256, 512, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(2):
                enc(xs)
        torch.cuda.current_stream().wait_stream(s)
        with torch.no_grad(), torch.cuda.graph(g):
            enc(xs)
        for _ in range(20):
            g.replay()

    out = {"run": "watched" if watched else "plain", "steps": 0, "windows": 0, "graphs": 0}
    region = cuda_debug.watch() if watched else None
    if region is not None:
        region.__enter__()
    t_end = time.monotonic() + 60 * minutes
    rss0 = None
    n = 0
    try:
        while time.monotonic() < t_end:
            for (xb,) in loader:
                xb = xb.cuda(non_blocking=True)
                if n and n % 200 == 0:
                    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                                 schedule=schedule(wait=1, warmup=1, active=3)) as p:
                        for _ in range(5):
                            step(xb)
                            p.step()
                    out["windows"] += 1
                    graph_round()
                    out["graphs"] += 1
                    th = threading.Thread(target=side_thread)
                    th.start()
                    th.join()
                step(xb)
                n += 1
                if n == 100:
                    torch.cuda.synchronize()
                    rss0 = rss_mib()
                if time.monotonic() >= t_end:
                    break
        torch.cuda.synchronize()
        out["steps"] = n
        out["rss_growth_mib"] = round(rss_mib() - (rss0 or rss_mib()), 1)
        if watched:
            s = _core.stats()
            out.update(watched=s["watched"], hand_overs=s["hand_overs"],
                       recording=s["launch_hooks"]["recording"], recorded=s["launch_hooks"]["recorded"])
        bad = torch.tensor([12], device="cuda")
        y = emb(bad)  # THE FAULT
        y.sum().item()
        out["fault"] = "not raised"
    except cuda_debug.CudaError as e:
        out.update(fault=type(e).__name__, kernel=e.kernel, exact=e.exact, lineno=e.lineno)
    except Exception as e:
        if region is not None:
            try:
                region.__exit__(type(e), e, e.__traceback__)
            except cuda_debug.CudaError as err:
                e = err
        if isinstance(e, cuda_debug.CudaError):
            out.update(fault=type(e).__name__, kernel=e.kernel, exact=e.exact, lineno=e.lineno)
        else:
            out.update(fault=type(e).__name__)
        region = None
    out["fault_line"] = _fault_line()
    print(json.dumps(out), flush=True)
    os._exit(0)               # the context is dead: no teardown


def _fault_line():
    with open(__file__) as f:
        for i, line in enumerate(f, 1):
            if line.rstrip().endswith("# THE FAULT"):
                return i
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--run", choices=("watched", "plain"))
    ap.add_argument("--json")
    a = ap.parse_args()
    if a.run:
        one_run(a.run == "watched", a.minutes)
        return
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONWARNINGS="ignore")
    procs = {r: subprocess.Popen([sys.executable, __file__, "--run", r, "--minutes", str(a.minutes)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
             for r in ("watched", "plain")}
    res = {}
    for r, p in procs.items():
        out, err = p.communicate(timeout=60 * a.minutes + 300)
        lines = [line for line in out.splitlines() if line.startswith("{")]
        res[r] = json.loads(lines[-1]) if lines else {"error": err[-2000:]}
        print(json.dumps(res[r]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    w, p = res["watched"], res["plain"]
    ok = w.get("fault") == "DeviceAssertError" and w.get("exact") is True and \
        w.get("lineno") == w.get("fault_line")
    print("soak %.1f min: watched %s steps, %s profiler windows, RSS +%s MiB; unwatched %s steps, "
          "RSS +%s MiB; the fault %s" % (
              a.minutes, w.get("steps"), w.get("windows"), w.get("rss_growth_mib"), p.get("steps"),
              p.get("rss_growth_mib"), "named exactly at its line" if ok else "NOT named: %r" % w))


if __name__ == "__main__":
    main()
