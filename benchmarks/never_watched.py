"""What cuda_debug costs against a process that never imported it (issue 45).

Usage:
    python benchmarks/never_watched.py [--rounds 5] [--modes watch,residue,...]
                                       [--json out.json] [--profile]

Every measurement is a fresh child process. Each round runs one `never`
process (cuda_debug never imported: the baseline) and one process per mode,
in an order that rotates from round to round; a mode's ratio in a round is its
time over that round's `never` time (the pair). The table gives, per mode and
workload, the median ratio over the rounds and its range (min-max).

Modes:
    watch      the whole loop inside watch() (the always-on default)
    residue    a watch() entered (some work) and left, then the loop, unwatched
    profiler   inside watch(): a torch.profiler window (3 transformer steps),
               then the loop, still inside the watch
    exact      the whole loop inside watch(exact=True)
    detach     as residue, with CUDA_DEBUG_CUPTI_DETACH=1
    keep       as residue, with CUDA_DEBUG_CUPTI_DETACH=0 (CUPTI unsubscribed,
               left loaded)

Workloads (always_on.py's SETUP, and launch_hooks_ab.py's MLP): tiny
(x.add_(1): us per launch), mlp (4x Linear(1024)+ReLU, batch 8, no_grad: us
per call), transformer (4-layer encoder training step: ms), lm (LM step: ms),
graph (the encoder's inference step captured as a CUDA graph inside the mode's
region, replayed: ms per replay). Each: the best of several blocks.

--inproc N: the one-process view (N rounds, with CUDA_DEBUG_CUPTI_DETACH=1
and =0): blocks timed before cuda_debug is imported, then rounds of a watch()
block and a block after it was left; and what entering a watch() costs after a
detach (CUPTI initialised again).

--profile: one more child, watch() with CUDA_DEBUG_PROFILE=1, that prints per
launch the ns of the launch hooks' route (look-up, the driver's own launch,
the pipeline after it) for tiny ops and the MLP.

Targets (issue 45): watch and profiler: tiny, mlp <= 1.05, transformer <=
1.02, lm <= 1.01, graph <= 1.02; residue tiny <= 1.01; exact tiny, mlp <= 1.10
(an aim). The in-process A/B (launch_hooks_ab.py) is the other view: its
baseline is an unwatched block of a process that watched before.
"""
import argparse
import json
import os
import statistics
import sys
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import always_on  # noqa: E402  (SETUP: the workloads and the timer)

CHILD = always_on.SETUP + textwrap.dedent(r"""
import contextlib
mode = sys.argv[1]
mlp = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024),
                                                          torch.nn.ReLU())]).cuda()
xm = torch.randn(8, 1024, device="cuda")
def infer():
    with torch.no_grad():
        mlp(xm)
for _ in range(2):
    step(); lm_step(); infer()
torch.cuda.synchronize()
if mode != "never":
    import cuda_debug
    from cuda_debug import _core
region = contextlib.nullcontext
if mode in ("residue", "detach", "keep"):
    with cuda_debug.watch():
        for _ in range(2):
            tiny(); step(); infer()
    torch.cuda.synchronize()
elif mode in ("watch", "exact", "profiler", "profile"):
    region = lambda: cuda_debug.watch(exact=mode == "exact")
out = {"mode": mode}
t_in = time.perf_counter()
w = region()
with w:
    out["enter_us"] = (time.perf_counter() - t_in) * 1e6
    if mode == "profiler":
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]):
            for _ in range(3):
                step()
            torch.cuda.synchronize()
    for _ in range(2):
        step(); lm_step(); infer()
    timed(tiny, 2000)
    if mode == "profile":
        st0 = _core.stats()
    out["tiny_us"] = min(timed(tiny, 10000) for _ in range(5)) * 1e6
    if mode == "profile":
        st1 = _core.stats()
    out["mlp_us"] = min(timed(infer, 1000) for _ in range(5)) * 1e6
    if mode == "profile":
        st2 = _core.stats()
        def per(a, b):
            ha, hb = a["launch_hooks"], b["launch_hooks"]
            routed = hb["routed"] - ha["routed"]
            watched = b["watched"] - a["watched"]
            return {"routed": routed, "watched": watched,
                    "lookup_ns": (hb["ns_lookup"] - ha["ns_lookup"]) / max(routed, 1),
                    "driver_launch_ns": (hb["ns_launch"] - ha["ns_launch"]) / max(routed, 1),
                    "pipeline_ns": (b["ns_callback"] - a["ns_callback"]) / max(watched, 1),
                    "record_ns": (b["ns_watch"] - a["ns_watch"]) / max(watched, 1)}
        out["profile"] = {"tiny": per(st0, st1), "mlp": per(st1, st2)}
    out["transformer_ms"] = min(timed(step, 20) for _ in range(3)) * 1e3
    out["lm_ms"] = min(timed(lm_step, 15) for _ in range(3)) * 1e3
    enc.eval()
    static = torch.randn(16, 256, 512, device="cuda")
    with torch.no_grad():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(3):
                enc(static)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_out = enc(static)
    timed(g.replay, 20)
    out["graph_ms"] = min(timed(g.replay, 100) for _ in range(3)) * 1e3
if mode != "never":
    st = _core.stats()
    out["stats"] = {k: st.get(k) for k in ("subscribed", "detaches", "cupti", "hand_overs",
                                           "take_backs", "watched")}
    out["stats"]["routed"] = st["launch_hooks"]["routed"]
    out["stats"]["recording"] = st["launch_hooks"]["recording"]
print("RESULT " + json.dumps(out))
""")

# One process, the lowest-noise view: blocks timed before cuda_debug is
# imported (never watched), then rounds of [a watch() block, a block after it
# was left (one launch first: the detach)], and finally the entry cost of a
# watch() after a detach (CUPTI initialised again) against one that takes a
# pending subscription back.
INPROC = always_on.SETUP + textwrap.dedent(r"""
mlp = torch.nn.Sequential(*[m for _ in range(4) for m in (torch.nn.Linear(1024, 1024),
                                                          torch.nn.ReLU())]).cuda()
xm = torch.randn(8, 1024, device="cuda")
def infer():
    with torch.no_grad():
        mlp(xm)
rounds = int(sys.argv[1])
WORK = [("tiny_us", tiny, 10000, 1e6), ("mlp_us", infer, 1000, 1e6)]
def block():
    return {w: min(timed(fn, n) for _ in range(3)) * u for w, fn, n, u in WORK}
for _ in range(2):
    step(); infer(); timed(tiny, 2000)
before = [block() for _ in range(rounds)]
import cuda_debug
from cuda_debug import _core
watch, after = [], []
for r in range(rounds):
    with cuda_debug.watch():
        timed(tiny, 200)
        watch.append(block())
    tiny(); torch.cuda.synchronize()   # the launch after the last watch: CUPTI detaches
    after.append(block())
st = _core.stats()
# entry cost: after a detach (a launch between) and with the subscription kept
enter = {"detached": [], "taken_back": []}
for i in range(20):
    tiny(); torch.cuda.synchronize()
    t0 = time.perf_counter(); w = cuda_debug.watch(); w.__enter__()
    enter["detached"].append((time.perf_counter() - t0) * 1e6)
    tiny(); w.__exit__(None, None, None)
    torch.cuda.synchronize()
    t0 = time.perf_counter(); w = cuda_debug.watch(); w.__enter__()
    enter["taken_back"].append((time.perf_counter() - t0) * 1e6)
    tiny(); w.__exit__(None, None, None)
# a cycle as a training loop with a watch() per step would do: enter, 20 tiny ops, leave,
# one launch outside (the detach), against the same without the watch
def cycle(watched):
    if watched:
        with cuda_debug.watch():
            for _ in range(20):
                tiny()
    else:
        for _ in range(20):
            tiny()
    tiny()
    torch.cuda.synchronize()
cyc = {}
for watched in (False, True, False, True):
    cyc.setdefault(watched, []).append(timed(lambda: cycle(watched), 200) * 1e6)
print("RESULT " + json.dumps({"before": before, "watch": watch, "after": after,
                              "detaches": st["detaches"], "residue": st["cupti_residue"],
                              "subscribed": st["subscribed"], "enter_us": enter,
                              "cycle_us": {"plain": min(cyc[False]), "watch": min(cyc[True])}}))
""")

MODES = ["watch", "residue", "profiler", "exact"]
WORK = [("tiny_us", "tiny op"), ("mlp_us", "MLP inference"), ("transformer_ms", "transformer step"),
        ("lm_ms", "LM step"), ("graph_ms", "graph replay")]
TARGETS = {"watch": {"tiny_us": 1.05, "mlp_us": 1.05, "transformer_ms": 1.02, "lm_ms": 1.01,
                     "graph_ms": 1.02},
           "residue": {"tiny_us": 1.01}, "exact": {"tiny_us": 1.10, "mlp_us": 1.10}}
TARGETS["profiler"] = TARGETS["watch"]
TARGETS["detach"] = TARGETS["keep"] = TARGETS["residue"]


def child(mode, base):
    import _common
    env = dict(base)
    if mode == "detach":
        env["CUDA_DEBUG_CUPTI_DETACH"] = "1"
    elif mode == "keep":
        env["CUDA_DEBUG_CUPTI_DETACH"] = "0"
    elif mode == "profile":
        env["CUDA_DEBUG_PROFILE"] = "1"
    return _common.child_result(PIN + [sys.executable, "-c", CHILD, mode], env, 600, mode)


#: Every child on the same CPUs (--cpu) with address-space randomisation off:
#: fresh processes of one mode moved +-30% without (the H100, first run).
PIN = []


def pin(cpu):
    """Where this machine allows them (a container may refuse the personality
    call or those CPUs): each tried once on `true`, left out if it fails."""
    import shutil
    import subprocess
    global PIN

    def works(cmd):
        try:
            return subprocess.run(cmd + ["true"], capture_output=True, timeout=10).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False
    if cpu and shutil.which("taskset") and works(["taskset", "-c", cpu]):
        PIN = ["taskset", "-c", cpu]
    if shutil.which("setarch") and works(["setarch", os.uname().machine, "-R"]):
        PIN = ["setarch", os.uname().machine, "-R"] + PIN
    print("children run as: %s" % (" ".join(PIN) or "(not pinned)"), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--json")
    ap.add_argument("--cpu", default="2,3", help="pin the children to these CPUs ('': no)")
    ap.add_argument("--inproc", type=int, default=0, metavar="ROUNDS",
                    help="also the one-process view, this many rounds, for detach=1 and 0")
    a = ap.parse_args()
    pin(a.cpu)
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("CUDA_DEBUG_") and k != "CUDA_LAUNCH_BLOCKING"}
    if os.environ.get("CUDA_DEBUG_COMMIT"):
        base["CUDA_DEBUG_COMMIT"] = os.environ["CUDA_DEBUG_COMMIT"]
    modes = a.modes.split(",")
    order = ["never"] + modes
    runs = {m: [] for m in order}
    for r in range(a.rounds):
        k = r % len(order)
        for m in order[k:] + order[:k]:
            got = child(m, base)
            runs[m].append(got)
            print("round %d %-8s %s %s" % (r + 1, m, {w: round(got[w], 4) for w, _ in WORK
                                                      if w in got},
                                          got.get("stats", "")), flush=True)
    prof = child("profile", base) if a.profile else None
    inproc = {}
    for detach in ("1", "0") if a.inproc else ():
        env = dict(base, CUDA_DEBUG_CUPTI_DETACH=detach)
        import _common
        inproc[detach] = _common.child_result(PIN + [sys.executable, "-c", INPROC, str(a.inproc)],
                                              env, 600, "inproc")
    import _common
    import torch  # noqa: F401  (the environment records its version)
    env = _common.environment()
    print("\nGPU %s, driver %s, CUDA %s, torch %s, commit %s; %d rounds, each mode against "
          "the same round's never-imported process" % (
              env.get("gpu"), env.get("driver"), env.get("driver_cuda"), env.get("torch"),
              env.get("git_commit"), a.rounds))
    never = {w: statistics.median(x[w] for x in runs["never"]) for w, _ in WORK}
    print("never imported: " + ", ".join("%s %.4g" % (w, never[w]) for w, _ in WORK))
    print("\n| mode | " + " | ".join(n for _, n in WORK) + " |")
    print("|---|" + "---|" * len(WORK))
    table = {}
    for m in modes:
        cells = []
        for w, _ in WORK:
            rs = [x[w] / n[w] for x, n in zip(runs[m], runs["never"])]
            med = statistics.median(rs)
            table.setdefault(m, {})[w] = {"median": med, "min": min(rs), "max": max(rs)}
            tgt = TARGETS.get(m, {}).get(w)
            mark = "" if tgt is None else (" ok" if med <= tgt else " MISS(%.2f)" % tgt)
            cells.append("%.3f (%.3f-%.3f)%s" % (med, min(rs), max(rs), mark))
        print("| %s | %s |" % (m, " | ".join(cells)))
    enters = {m: statistics.median(x["enter_us"] for x in runs[m]) for m in modes}
    print("\nwatch entry (the first, us, median): %s" % {m: round(v) for m, v in enters.items()})
    if prof:
        print("\nprofile (CUDA_DEBUG_PROFILE=1, per launch): %s" % json.dumps(prof.get("profile")))
    for detach, got in inproc.items():
        print("\nOne process, CUDA_DEBUG_CUPTI_DETACH=%s, %d rounds; median ratio (min-max) to the "
              "median of the blocks before cuda_debug was imported:" % (detach, a.inproc))
        for w, _ in WORK[:2]:
            b = statistics.median(x[w] for x in got["before"])
            cells = []
            for k in ("watch", "after"):
                rs = [x[w] / b for x in got[k]]
                cells.append("%s %.3f (%.3f-%.3f)" % (k, statistics.median(rs), min(rs), max(rs)))
            print("  %s: before %.4g; %s" % (w, b, "; ".join(cells)))
        e = got["enter_us"]
        print("  watch() entry, us (median of 20): after a detach %.0f, subscription taken back "
              "%.0f; a cycle of 20 tiny ops + 1: plain %.1f us, in a watch() %.1f us; detaches %d, "
              "residue %r" % (statistics.median(e["detached"]), statistics.median(e["taken_back"]),
                              got["cycle_us"]["plain"], got["cycle_us"]["watch"], got["detaches"],
                              got["residue"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"env": env, "runs": runs, "table": table, "profile": prof,
                       "inproc": inproc}, f, indent=1)


if __name__ == "__main__":
    main()
