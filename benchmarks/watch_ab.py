"""What watch() costs, measured A/B inside one process (no process-to-process noise).

Usage:
    python benchmarks/watch_ab.py [--rounds 10] [--json out.json]

Alternates, round after round, the same work outside and inside
cuda_debug.watch(): the tiny-op loop (x.add_(1)) and a transformer training
step (4-layer nn.TransformerEncoder, d=512, batch 16x256, AdamW). Reports the
median time of each and the ratio watch / plain (targets: <= 1.35 tiny,
<= 1.05 step), plus the callback's own time per launch (CUDA_DEBUG_PROFILE=1
set by this script) and whether every launch got its completion marker.
Outside-watch vs never-imported needs separate processes: launch_overhead.py.
"""
import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("CUDA_DEBUG_PROFILE", "1")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    import cuda_debug
    from cuda_debug import _core

    x = torch.zeros(1, device="cuda")
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                             batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=4).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    xb = torch.randn(16, 256, 512, device="cuda")

    def tiny():
        x.add_(1)

    def step():
        opt.zero_grad(set_to_none=True)
        model(xb).float().pow(2).mean().backward()
        opt.step()

    def timed(fn, n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / n

    for _ in range(3):
        step()
    with cuda_debug.watch():
        step()
    res = {"tiny": {"plain": [], "watch": []}, "step": {"plain": [], "watch": []}}
    st0 = _core.stats()
    for r in range(a.rounds):
        for mode in (("plain", "watch") if r % 2 == 0 else ("watch", "plain")):
            ctx = cuda_debug.watch() if mode == "watch" else None
            if ctx:
                ctx.__enter__()
            res["tiny"][mode].append(timed(tiny, 5000) * 1e6)
            res["step"][mode].append(timed(step, 15) * 1e3)
            if ctx:
                ctx.__exit__(None, None, None)
    st = _core.stats()
    watched = st["watched"] - st0["watched"]
    out = {k: {m: statistics.median(v) for m, v in d.items()} for k, d in res.items()}
    out["ratio"] = {k: out[k]["watch"] / out[k]["plain"] for k in ("tiny", "step")}
    out["ns_watch_per_launch"] = (st["ns_watch"] - st0["ns_watch"]) / max(1, watched)
    out["ns_callback_per_launch"] = (st["ns_callback"] - st0["ns_callback"]) / max(1, watched)
    out["ns_marker_per_launch"] = (st["ns_marker"] - st0["ns_marker"]) / max(1, watched)
    out["watched"] = watched
    out["unmarked"] = st["unmarked"] - st0["unmarked"]
    out["watch_alloc_rc"], out["watch_write_rc"] = st["watch_alloc_rc"], st["watch_write_rc"]
    out["capture_ids_refused"] = st["capture_ids_refused"]
    out["interned_bytes"] = st["interned_bytes"]
    print("tiny us: plain %.2f watch %.2f (x%.3f);  step ms: plain %.2f watch %.2f (x%.3f)" % (
        out["tiny"]["plain"], out["tiny"]["watch"], out["ratio"]["tiny"],
        out["step"]["plain"], out["step"]["watch"], out["ratio"]["step"]))
    print("callback ns/launch %.0f (watch part %.0f, of which the marker write %.0f); watched %d "
          "unmarked %d alloc_rc %d write_rc %d capture_ids_refused %d" % (
              out["ns_callback_per_launch"], out["ns_watch_per_launch"],
              out["ns_marker_per_launch"], watched,
              out["unmarked"], out["watch_alloc_rc"], out["watch_write_rc"],
              out["capture_ids_refused"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(rounds=a.rounds, raw=res, **out), f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
