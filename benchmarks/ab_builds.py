"""This tree's launch path against an older build, side by side (issue 16: the
restructure must not move the hot path).

Usage (benchmarks/run_on_gpu.sh ab does all of it):
    python benchmarks/ab_builds.py OUT_DIR

Reads the launch_overhead.py JSON files OUT_DIR/ab_new_<r>.json (this tree)
and OUT_DIR/ab_base_<r>.json (the base tree, on PYTHONPATH), one per round,
written round after round (interleaved), and prints, per configuration and
workload, the median over rounds of each build and their ratio, plus
watch_hang / watch of this tree (the hang watcher's cost, target <= 1.005).
"""
import glob
import json
import os
import statistics
import sys


def medians(files):
    runs = {}
    for path in files:
        with open(path) as f:
            doc = json.load(f)
        for config, rs in doc["runs"].items():
            for r in rs:
                for metric, value in r.items():
                    if isinstance(value, float):
                        runs.setdefault((config, metric), []).append(value)
    return {k: (statistics.median(v), len(v)) for k, v in runs.items()}


def main(argv):
    out = argv[1] if len(argv) > 1 else "."
    new = medians(sorted(glob.glob(os.path.join(out, "ab_new_*.json"))))
    base = medians(sorted(glob.glob(os.path.join(out, "ab_base_*.json"))))
    print("| config | metric | base | this tree | this / base | rounds |")
    print("|---|---|---|---|---|---|")
    for key in sorted(set(new) & set(base)):
        (b, nb), (n, nn) = base[key], new[key]
        print("| %s | %s | %.3f | %.3f | %.3f | %d |" % (key[0], key[1], b, n, n / b, min(nb, nn)))
    for metric in sorted({m for _, m in new}):
        if ("watch_hang", metric) in new and ("watch", metric) in new:
            print("| watch_hang / watch | %s | | | %.4f | %d |" % (
                metric, new[("watch_hang", metric)][0] / new[("watch", metric)][0],
                new[("watch", metric)][1]))
        if ("watch", metric) in new and ("never", metric) in new:
            print("| watch / never | %s | | | %.4f | %d |" % (
                metric, new[("watch", metric)][0] / new[("never", metric)][0],
                new[("never", metric)][1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
