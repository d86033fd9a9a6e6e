"""Probe round 2 (issue 27): the marker topologies' replay cost (round 1's S4 failed
on a node with no dependents), leaf markers at a fault again, and the reduce-overhead
report of this build.

Command (repo root, after `python3 -m pip install --no-build-isolation --no-deps -e .`):

    python benchmarks/probes/graphs_facts2.py          # ~70 s on the H200

Prints lines tagged S4 / S6 / S7, then `JSON {...}` ($OUT/graphs_facts2.json too).

  S4 (graphs_facts.py's, fixed): the 200-tiny-kernel graph and the transformer
     training step graph cloned and edited with the graph API, each variant
     instantiated and replayed, 2 rounds interleaved: none; chain1 / chain4 /
     chain8 (a one-thread marker kernel between a kernel and its successors, behind
     every 1st / 4th / 8th kernel); leaf (a marker depending on each kernel,
     nothing on it); leafchain (each marker on its kernel and the previous marker);
     chain8+leafchain. ms per replay, ratio to none, us per kernel node.
  S6 leaf markers at a fault: 60-kernel chain, node 37 an index_select with a bad
     index, no clearing memset; child processes (chain1 once, leafchain twice):
     the first kernel whose marker is missing (37: exact).
  S7 torch.compile(mode="reduce-overhead") under watch() with this build: the ring
     records of the graph replays and the node records (frames, kinds as C gave
     them), then a child that replays with a bad index: the exception's kernel,
     node, replayed_at, captured_at, recorded_at, filename:lineno, provenance.
"""
import json
import os
import subprocess
import sys
import textwrap
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import graphs_facts as P  # noqa: E402

T0 = time.perf_counter()


@P.section("S7")
def s7():
    import torch
    import cuda_debug
    from cuda_debug import _core, _locations, _report
    src = textwrap.dedent('''
    import torch
    @torch.compile(mode="reduce-overhead")
    def f(w, i):
        return w[i] * 2  # SOURCE
    ''')
    path = os.path.join(os.environ.get("OUT") or ".", "s7_compiled.py")
    with open(path, "w") as fh:
        fh.write(src)
    ns = {"__file__": path}
    exec(compile(src, path, "exec"), ns)
    f = ns["f"]
    w = torch.randn(100, 8, device="cuda")
    good = torch.zeros(4, dtype=torch.long, device="cuda")
    good2 = torch.ones(4, dtype=torch.long, device="cuda")
    with cuda_debug.watch():
        s0 = _core.watch_seq()
        for _ in range(4):
            f(w, good)
        torch.cuda.synchronize()
        s1 = _core.watch_seq()
        f(w, good2)
        torch.cuda.synchronize()
        s2 = _core.watch_seq()

    def frames(ids):
        return ["%s:%d %s k%d" % (os.path.basename(x.filename)[:28], x.lineno, x.name,
                                  _locations.frame_kind(x)) for x in _locations.stack_from_ids(ids)]
    for seq in range(s0 + 1, s2 + 1):
        r = _report.watch_record(seq)
        if r is not None and r.flags & _core.WATCH_GRAPH:
            d = _report._launch_dict(r)
            P.say("S7", "replay #%d (%s) frames" % (seq, "after" if seq > s1 else "first calls"),
                  frames(r.frames), "-> where", d["where"])
    for gi in range(0, 4096):
        got = _core.graph_node(gi)
        if got is None:
            continue
        rec = _report.WatchRecord(*got[0])
        d = _report._launch_dict(rec, inner=got[4])
        P.say("S7", "node", got[1], rec.kernel.decode()[:40], "record", frames(rec.frames))
        P.say("S7", "   inner", frames(got[4]), "-> where", d["where"])
    child = textwrap.dedent('''
    import json, torch, cuda_debug
    @torch.compile(mode="reduce-overhead")
    def f(w, i):
        return w[i] * 2  # SOURCE
    w = torch.randn(100, 8, device="cuda")
    good = torch.zeros(4, dtype=torch.long, device="cuda")
    bad = torch.full((4,), 1000, dtype=torch.long, device="cuda")
    try:
        with cuda_debug.watch():
            for _ in range(4):
                y = f(w, good)  # CALL
            torch.cuda.synchronize()
            y = f(w, bad)  # BAD CALL
            torch.cuda.synchronize()
    except cuda_debug.CudaError as e:
        print("RESULT " + json.dumps(dict(kernel=e.kernel, node=e.graph_node,
              replayed_at=e.replayed_at, captured_at=e.captured_at, recorded_at=e.recorded_at,
              where="%s:%s" % (e.filename, e.lineno), provenance=e.provenance, exact=e.exact,
              text=str(e))))
    ''')
    cpath = os.path.join(os.environ.get("OUT") or ".", "s7_child.py")
    with open(cpath, "w") as fh:
        fh.write(child)
    p = subprocess.run([sys.executable, cpath], capture_output=True, text=True, timeout=240)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if line:
        r = json.loads(line[0][7:])
        for k, v in r.items():
            P.say("S7", "fault:", k, "=", v if k != "text" else "")
        for t in r["text"].splitlines():
            P.say("S7", "  |", t)
    else:
        P.say("S7", "fault child failed:", p.stderr[-1500:])
    P.say("S7", "child stderr block:")
    for t in p.stderr.splitlines():
        if "cuda_debug" in t or "captured at" in t or "replayed at" in t or "culprit" in t:
            P.say("S7", "  >", t[:300])
    P.OUT["S7"] = line[0][7:] if line else p.stderr[-1500:]


@P.section("S6")
def s6():
    here = os.path.dirname(os.path.abspath(__file__))
    res = []
    for v in ["chain1", "leafchain", "leafchain"]:
        p = subprocess.run([sys.executable, "-c", P.RACE_CHILD, v, here], capture_output=True,
                           text=True, timeout=60)
        line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
        if not line:
            P.say("S6", v, "child failed:", p.stderr[-400:])
            continue
        r = json.loads(line[0][7:])
        res.append(r)
        P.say("S6", json.dumps(r))
    P.OUT["S6"] = res


def main():
    P.s1()
    P.s2()
    P.s4()
    s6()
    s7()
    P.say("END", "%.1f s" % (time.perf_counter() - T0))
    text = json.dumps(P.OUT, default=str)
    print("JSON " + text)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "graphs_facts2.json"), "w") as fh:
            fh.write(text)


if __name__ == "__main__":
    main()
