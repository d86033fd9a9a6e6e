"""What watch() costs with and without the runtime launch hooks, A/B in one process.

Usage:
    python benchmarks/launch_hooks_ab.py [--rounds 40] [--step-rounds 12] [--json out.json]

Each round times the same work once per variant, in an order that rotates
from round to round: no watch; watch() (the always-on mode) with the launch
hooks (csrc/hooks/runtime_launch.c: PyTorch's launches past CUPTI) and
without (CUDA_DEBUG_LAUNCH_HOOKS=0: every launch through CUPTI's callback);
watch(exact=True) (its launches go through CUPTI either way). A variant's ratio in a round is its time
over the round's unwatched time; the table gives the median ratio over the
rounds, and the 25-75% range. Work: the tiny-op loop (x.add_(1), 3,000
launches a block), a transformer training step (4-layer encoder, d=512,
batch 16x256, AdamW; --steps a block) and an LM step (Embedding(32000, 512),
that encoder, a Linear head, cross-entropy; --steps/2 a block). Targets
(issue 26): always-on tiny <= 1.05, step <= 1.02, LM <= 1.01; exact step <= 1.05.
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
    a = ap.parse_args()
    import cuda_debug
    from cuda_debug import _core
    import always_on
    w = {}
    exec(always_on.SETUP, w)             # the workloads and timer always_on.py measures
    torch, tiny, step, lm_step, timed = (w[k] for k in ("torch", "tiny", "step", "lm_step",
                                                        "timed"))

    def run(variant, fn, n):
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
    for work, fn, n, rounds, unit in (("tiny", tiny, 3000, a.rounds, 1e6),
                                      ("step", step, a.steps, a.step_rounds, 1e3),
                                      ("lm", lm_step, max(1, a.steps // 2), a.step_rounds, 1e3)):
        times = {v: [] for v in VARIANTS}
        for r in range(rounds):
            k = r % len(VARIANTS)
            for v in VARIANTS[k:] + VARIANTS[:k]:
                times[v].append(run(v, fn, n) * unit)
        ratios = {v: [t / p for t, p in zip(times[v], times["plain"])] for v in VARIANTS[1:]}

        def q(vals, f):
            s = sorted(vals)
            return s[min(len(s) - 1, int(f * len(s)))]
        res[work] = {"unit": "us" if unit == 1e6 else "ms",
                     "median": {v: statistics.median(times[v]) for v in VARIANTS},
                     "ratio": {v: statistics.median(rs) for v, rs in ratios.items()},
                     "ratio_iqr": {v: [q(rs, 0.25), q(rs, 0.75)] for v, rs in ratios.items()},
                     "rounds": rounds}
    st = _core.stats()
    res["routed"] = st["launch_hooks"]["routed"] - st0["launch_hooks"]["routed"]
    res["watched"] = st["watched"] - st0["watched"]
    res["handed_back"] = st["launch_hooks"]["handed_back"]
    res["entries"] = st["launch_hooks"]["entries"]
    res["versions"] = {"torch": torch.__version__, "cuda": torch.version.cuda,
                       "gpu": torch.cuda.get_device_name(), "commit": os.environ.get(
                           "CUDA_DEBUG_COMMIT", "")}
    works = ("tiny", "step", "lm")
    print("%-12s" % "variant" + "".join("%22s" % w for w in works))
    for v in VARIANTS[1:]:
        print("%-12s" % v + "".join("  %6.3f (%.3f-%.3f)" % (res[w]["ratio"][v],
                                                              *res[w]["ratio_iqr"][v])
                                     for w in works))
    print("plain: tiny %.2f us, step %.2f ms, lm %.2f ms; routed %d of %d watched launches" % (
        res["tiny"]["median"]["plain"], res["step"]["median"]["plain"],
        res["lm"]["median"]["plain"], res["routed"], res["watched"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
