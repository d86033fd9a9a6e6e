"""What watch() costs inside CUDA graphs: the markers captured behind every node.

Usage:
    python benchmarks/graph_watch.py [--reps 3] [--workloads transformer,tiny]
                                     [--configs never,watch,watch_every1,watch_memop,
                                                watch_nomarkers,prewatch]
                                     [--json out.json]

Each configuration runs in a fresh child process, the configurations are
interleaved, repeated --reps times, and the median is reported. In every
configuration the workload is captured once with torch.cuda.graph and the
graph is replayed; what changes is what surrounds the capture and the replays:

    never            cuda_debug never imported (the baseline: an unwatched replay)
    watch            captured and replayed inside watch(), the defaults: a
                     one-thread marker kernel node behind every K-th kernel node
                     of each stream (CUDA_DEBUG_GRAPH_MARKER_EVERY, default K in
                     cuda_debug/_options.py), the graph a start marker and a memset
                     that clears the markers; each replay is one watch record
    watch_every1     watch with a marker behind every kernel node
                     (CUDA_DEBUG_GRAPH_MARKER_EVERY=1: the per-node mode)
    watch_memop      watch_every1 under CUDA_DEBUG_GRAPH_MARKERS=memop: each marker
                     a stream write (a memory-op node) instead of a kernel
    watch_nomarkers  the same under CUDA_DEBUG_GRAPH_MARKERS=0: the graph as
                     captured unwatched, each replay one watch record (what
                     watching the replays costs without naming nodes)
    prewatch         cuda_debug imported, the graph captured before watch()
                     (adopted: its kernels read at the end of its capture, no
                     markers) and replayed inside watch()

Workloads:
    transformer  the training step of benchmarks/launch_overhead.py (4-layer
                 nn.TransformerEncoder, d=512, batch 16x256, AdamW(capturable=True)),
                 captured whole (zero_grad, forward, backward, step) after warm-up
                 on a side stream; ms per replay. Target: watch / never <= 1.02 (the
                 always-on target for a graph replay).
    tiny         a graph of 200 tiny kernels (x.add_(1)); us per replay, and the
                 marker cost per node: (watch - never) / 200, in us per replay per
                 node.

The last lines are a short table: per configuration the medians, then the
ratios and the per-node cost.
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
if config != "never":
    import cuda_debug
    region = cuda_debug.watch
    with region():                   # CUPTI loaded and released once, like a real user
        torch.zeros(1, device="cuda").add_(1)
else:
    region = contextlib.nullcontext
# prewatch: captured outside watch(), each timed replay loop inside one; else all inside one
outer = contextlib.nullcontext if config == "prewatch" else region
replays = region if config == "prewatch" else contextlib.nullcontext
out = {"config": config}
TINY_NODES = 200

def replay_time(g, n):
    with replays():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            g.replay()
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n

with outer():
    if "tiny" in workloads:
        x = torch.zeros(1, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                x.add_(1)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(TINY_NODES):
                x.add_(1)
        replay_time(g, 200)
        out["tiny_us"] = replay_time(g, 3000) * 1e6
        torch.cuda.synchronize()
        out["tiny_ok"] = float(x[0]) == 3 + TINY_NODES * 3200

    if "transformer" in workloads:
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048,
                                                 batch_first=True)
        tmodel = torch.nn.TransformerEncoder(layer, num_layers=4).cuda()
        topt = torch.optim.AdamW(tmodel.parameters(), lr=1e-4, capturable=True)
        tx = torch.randn(16, 256, 512, device="cuda")
        def tstep():
            topt.zero_grad(set_to_none=True)
            loss = tmodel(tx).float().pow(2).mean()
            loss.backward()
            topt.step()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                tstep()
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        before = cuda_debug._core.graph_stats()["nodes_recorded"] if config != "never" else 0
        with torch.cuda.graph(g):
            tstep()
        if config != "never":
            out["transformer_nodes"] = cuda_debug._core.graph_stats()["nodes_recorded"] - before
        replay_time(g, 5)
        out["transformer_ms"] = replay_time(g, 40) * 1e3
if config != "never":
    st = cuda_debug._core.graph_stats()
    out["graph_stats"] = {k: st[k] for k in ("nodes_marked", "nodes_unmarked", "captures",
                                             "clear_rc", "write_rc", "kernel_rc")}
    out["adopted"] = cuda_debug._graphs.stats()["adopted"]
print("RESULT " + json.dumps(out))
""")

CONFIGS = ["never", "watch", "watch_every1", "watch_memop", "watch_nomarkers", "prewatch"]
ENV = {"watch_nomarkers": {"CUDA_DEBUG_GRAPH_MARKERS": "0"},
       "watch_every1": {"CUDA_DEBUG_GRAPH_MARKER_EVERY": "1"},
       "watch_memop": {"CUDA_DEBUG_GRAPH_MARKERS": "memop", "CUDA_DEBUG_GRAPH_MARKER_EVERY": "1"}}


def run_child(config, workloads):
    env = dict(os.environ)
    for k in ("CUDA_LAUNCH_BLOCKING", "CUDA_DEBUG_GRAPH_MARKERS", "CUDA_DEBUG_GRAPH_MARKER_EVERY"):
        env.pop(k, None)
    env.update(ENV.get(config, {}))
    p = subprocess.run([sys.executable, "-c", CHILD, config, ",".join(workloads)],
                       capture_output=True, text=True, env=env, timeout=600)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError("child %s failed:\n%s" % (config, p.stderr[-3000:]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--workloads", default="transformer,tiny")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--json")
    a = ap.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from launch_overhead import versions
    workloads, configs = a.workloads.split(","), a.configs.split(",")
    runs = {c: [] for c in configs}
    for rep in range(a.reps):
        for c in configs:
            r = run_child(c, workloads)
            runs[c].append(r)
            print("rep %d %-16s %s" % (rep, c, json.dumps(r)), flush=True)
    metrics = [m for m in ("transformer_ms", "tiny_us") if m in runs[configs[0]][0]]
    med = {c: {m: statistics.median(r[m] for r in rs) for m in metrics if m in rs[0]}
           for c, rs in runs.items()}
    v = versions()
    lines = ["", "GPU %(gpu)s, driver %(driver)s, CUDA %(cuda)s, PyTorch %(torch)s, "
             "cuda_debug %(cuda_debug)s @ %(commit)s; median of %%d runs" % v % a.reps, "",
             "| config | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for c in configs:
        lines.append("| %s | " % c + " | ".join("%.3f" % med[c][m] if m in med[c] else "-"
                                                for m in metrics) + " |")
    lines += ["", "| measure | value |", "|---|---|"]
    if "never" in med:
        for c in configs:
            if c == "never":
                continue
            for m in metrics:
                if m in med[c] and m in med["never"]:
                    lines.append("| %s / never, %s%s | %.3f |" % (
                        c, m, " (target <= 1.02)" if m == "transformer_ms" and
                        c == "watch" else "", med[c][m] / med["never"][m]))
            if "tiny_us" in med[c] and "tiny_us" in med["never"]:
                lines.append("| %s: us per replay per node (200 tiny nodes) | %.3f |" % (
                    c, (med[c]["tiny_us"] - med["never"]["tiny_us"]) / 200))
        for c in ("watch", "watch_every1", "watch_memop"):
            nodes = [r.get("transformer_nodes") for r in runs.get(c, []) if
                     r.get("transformer_nodes")]
            if nodes and "transformer_ms" in med.get(c, {}):
                lines.append("| %s: transformer step nodes; us per replay per node | %d; %.3f |"
                             % (c, nodes[0], (med[c]["transformer_ms"] -
                                              med["never"]["transformer_ms"]) * 1e3 / nodes[0]))
    print("\n".join(lines))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(versions=v, runs=runs, median=med), f, indent=1)


if __name__ == "__main__":
    main()
