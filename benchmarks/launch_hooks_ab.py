"""What watch() costs with and without the runtime launch hooks, A/B in one process.

Usage:
    python benchmarks/launch_hooks_ab.py [--rounds 40] [--step-rounds 12] [--json out.json]
        [--no-profiler-phase]

Each round times the same work once per variant, in an order that rotates
from round to round: no watch; watch() (the always-on mode) with the launch
hooks (csrc/hooks/runtime_launch.c: PyTorch's launches past CUPTI) and
without (CUDA_DEBUG_LAUNCH_HOOKS=0: every launch through CUPTI's callback);
watch(exact=True) (its launches go through CUPTI either way). A variant's ratio in a round is its time
over the round's unwatched time; the table gives the median ratio over the
rounds, and the 25-75% range. Work: the tiny-op loop (x.add_(1), 3,000
launches a block), a transformer training step (4-layer encoder, d=512,
batch 16x256, AdamW; --steps a block), an LM step (Embedding(32000, 512),
that encoder, a Linear head, cross-entropy; --steps/2 a block), launch-bound
inference (a 4-layer MLP, width 1024, batch 8, no_grad; 200 calls a block) and
a graph replay (that encoder's inference step captured as a CUDA graph: the
unwatched variant replays one captured outside any watch, the watched ones a
capture made inside watch(), with its markers).

Then, unless --no-profiler-phase, a torch.profiler window (3 steps) and the
same work again, plain against watch(): Kineto keeps CUPTI after it stops, so
this is what the rest of a run that profiled once costs (the launch hooks'
record mode: PyTorch's launches recorded without CUPTI).

Targets (issues 26, 35): always-on tiny <= 1.05, MLP <= 1.05, step <= 1.02,
LM <= 1.01, graph <= 1.02, the same after a profiler window; exact tiny <= 1.10
(an aim).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

VARIANTS = ("plain", "watch", "watch_cupti", "exact")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--step-rounds", type=int, default=12)
    ap.add_argument("--steps", type=int, default=20, help="steps a block")
    ap.add_argument("--json")
    ap.add_argument("--no-profiler-phase", action="store_true")
    a = ap.parse_args()
    import cuda_debug
    from cuda_debug import _core
    import always_on
    w = {}
    exec(always_on.SETUP, w)             # the workloads and timer always_on.py measures
    torch, tiny, step, lm_step, timed = (w[k] for k in ("torch", "tiny", "step", "lm_step",
                                                        "timed"))
    mlp = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024),
                                                              torch.nn.ReLU())]).cuda()
    xm = torch.randn(8, 1024, device="cuda")

    def infer():
        with torch.no_grad():
            mlp(xm)

    enc, xb = w["enc"], w["xb"]

    def capture():
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(3):
                enc(xb)
        torch.cuda.current_stream().wait_stream(s)
        with torch.no_grad(), torch.cuda.graph(g):
            enc(xb)
        torch.cuda.synchronize()
        return g

    g_plain = capture()
    with cuda_debug.watch():
        g_watch = capture()
    graphs = {"plain": g_plain.replay, "watch": g_watch.replay}

    def replay_plain():
        graphs["plain"]()

    def replay_watched():
        graphs["watch"]()

    def run(variant, fn, n):
        if fn is replay_plain and variant != "plain":
            fn = replay_watched
        if variant == "plain":
            return timed(fn, n)
        os.environ["CUDA_DEBUG_LAUNCH_HOOKS"] = "0" if variant.endswith("_cupti") else "1"
        with cuda_debug.watch(exact=variant.startswith("exact")):
            hooks = _core.stats()["launch_hooks"]
            t = timed(fn, n)
        want = not variant.endswith("_cupti")   # exact: on, its launches not routed
        if bool(hooks["on"]) != want:
            sys.exit("%s: launch hooks on=%s (%s)" % (variant, hooks["on"], hooks["why_off"]))
        return t

    for _ in range(3):
        step()
        lm_step()
        timed(tiny, 500)
    for v in VARIANTS[1:]:
        run(v, step, 1)
    st0 = _core.stats()
    res = {}
    works = (("tiny", tiny, 3000, a.rounds, 1e6), ("mlp", infer, 200, a.rounds, 1e6),
             ("step", step, a.steps, a.step_rounds, 1e3),
             ("lm", lm_step, max(1, a.steps // 2), a.step_rounds, 1e3),
             ("graph", replay_plain, 50, a.step_rounds, 1e3))

    def q(vals, f):
        s = sorted(vals)
        return s[min(len(s) - 1, int(f * len(s)))]

    def measure(variants):
        out = {}
        for work, fn, n, rounds, unit in works:
            times = {v: [] for v in variants}
            for r in range(rounds):
                k = r % len(variants)
                for v in variants[k:] + variants[:k]:
                    times[v].append(run(v, fn, n) * unit)
            ratios = {v: [t / p for t, p in zip(times[v], times["plain"])] for v in variants[1:]}
            out[work] = {"unit": "us" if unit == 1e6 else "ms",
                         "median": {v: statistics.median(times[v]) for v in variants},
                         "ratio": {v: statistics.median(rs) for v, rs in ratios.items()},
                         "ratio_iqr": {v: [q(rs, 0.25), q(rs, 0.75)] for v, rs in ratios.items()},
                         "rounds": rounds}
        return out

    res.update(measure(VARIANTS))
    st = _core.stats()
    res["routed"] = st["launch_hooks"]["routed"] - st0["launch_hooks"]["routed"]
    res["watched"] = st["watched"] - st0["watched"]
    res["handed_back"] = st["launch_hooks"]["handed_back"]
    res["entries"] = st["launch_hooks"]["entries"]
    res["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                       "gpu": torch.cuda.get_device_name(), "commit": os.environ.get(
                           "CUDA_DEBUG_COMMIT", "")}
    names = [w[0] for w in works]
    if not a.no_profiler_phase:
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            for _ in range(3):
                step()
            torch.cuda.synchronize()
        after = measure(("plain", "watch"))
        hooks = _core.stats()["launch_hooks"]
        res["after_profiler"] = after
        res["after_profiler_hooks"] = {"recording": hooks["recording"],
                                       "recorded": hooks["recorded"],
                                       "subscribed": _core.stats()["subscribed"]}
    print("%-14s" % "variant" + "".join("%22s" % w for w in names))
    rows = [(v, res, v) for v in VARIANTS[1:]]
    if "after_profiler" in res:
        rows.append(("after_profiler", res["after_profiler"], "watch"))
    for label, r, v in rows:
        print("%-14s" % label + "".join("  %6.3f (%.3f-%.3f)" % (r[w]["ratio"][v],
                                                                *r[w]["ratio_iqr"][v])
                                       for w in names))
    print("plain: tiny %.2f us, mlp %.1f us, step %.2f ms, lm %.2f ms, graph %.2f ms; routed %d "
          "of %d watched launches%s" % (
              res["tiny"]["median"]["plain"], res["mlp"]["median"]["plain"],
              res["step"]["median"]["plain"], res["lm"]["median"]["plain"],
              res["graph"]["median"]["plain"], res["routed"], res["watched"],
              "; after the profiler: %s" % res["after_profiler_hooks"]
              if "after_profiler" in res else ""))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
