"""Probe (branch replay, rounds 2 and 3): the built `cuda-debug replay` on the H200.

Run from the repo root on the GPU machine, after the install:

    python3 benchmarks/probes/replay_product.py            # ~3-4 minutes
    python3 benchmarks/probes/replay_product.py --only tests,survey   # ~2 minutes

Prints `== name: ...` blocks:

  tests     pytest tests/test_replay_gpu.py -q -rA: the raw kernel past a buffer, run --replay
            of a real illegal address, a PyTorch fill past a tensor inside a cached segment, a
            Triton custom op past its output, a CuPy kernel past its array, no false alarm on
            a transformer step (the failures' output in full)
  survey    every launch of one transformer training step, plus embedding / cross-entropy /
            SDPA / bf16 GEMM launches, instrumented one after the other (observe only: warps
            not exited, calls not failed): how many had an access outside PyTorch's live
            tensors (false alarms, with the kernel, address and the tensor next to it), and what
            an instrumented launch costs (patch + ranges + wait)
  raise     does the culprit's launch call itself fail (the driver-API callbacks enabled at its
            LAUNCH_END): the script catches the exception at the launch and prints where
  cost      benchmarks/replay_cost.py --steps 40 --fault-step 30 --rounds 1 --compute-sanitizer
            (plain vs replay vs compute-sanitizer, wall and loop time)

Writes only under $OUT (or a temp folder).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.environ.get("OUT") or tempfile.mkdtemp(prefix="replay_probe_")

SURVEY = r'''
import json, sys, time
from cuda_debug import _core, _replay
found = _replay.find_library()
ok, err = _core.replay_load(found.path)
calls, last = [], {}

def hook(launch, kernel, grid, block, context, stream, device):
    prev = [r for r in _replay.results() if calls and r.launch == calls[-1]["launch"]]
    if prev:
        r = prev[0]
        calls[-1].update(n_bad=r.n_bad, prepare_ms=round(r.seconds_prepare * 1e3, 3),
                         wait_ms=round(r.seconds_wait * 1e3, 3), failed=r.failed_step, rc=r.rc)
        if r.n_bad:
            inst = r
            a = r.accesses[0]
            calls[-1]["bad"] = dict(access=a.access, size=a.size, space=a.space,
                                    misaligned=a.misaligned, thread=a.thread, block=a.block,
                                    line=_replay.access_line(inst, a, last.get("entry")))
    t0 = time.perf_counter()
    out = _replay._ranges_hook(launch, kernel, grid, block, context, stream, device)
    last["entry"] = _replay._launches.get(launch)
    calls.append(dict(launch=launch, kernel=kernel.decode()[:90],
                      hook_ms=round((time.perf_counter() - t0) * 1e3, 3)))
    return out

rc = _core.replay_subscribe(launch=0, start=0, kernel="", match=_core.REPLAY_MATCH_ANY,
                            max_launches=100000, exit_warp=0, fail_launches=0, ranges=hook)
t0 = time.perf_counter()
note = _replay.record_torch_history()
warm = time.perf_counter() - t0
import torch, torch.nn.functional as F
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 4).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
xb = torch.randn(16, 256, 512, device="cuda")
emb = torch.nn.Embedding(32000, 512).cuda()
ids = torch.randint(0, 32000, (16, 256), device="cuda")
head = torch.nn.Linear(512, 32000).cuda().bfloat16()
for step in range(2):
    opt.zero_grad(set_to_none=True)
    h = model(xb + emb(ids))
    logits = head(h.bfloat16()).float()
    loss = F.cross_entropy(logits.view(-1, 32000), ids.view(-1))
    q = torch.randn(8, 8, 256, 64, device="cuda", dtype=torch.bfloat16)
    a = F.scaled_dot_product_attention(q, q, q, is_causal=True)
    (loss + a.float().mean()).backward()
    opt.step()
torch.cuda.synchronize()
hook(0, b"(end)", (0,0,0), (0,0,0), 0, 0, 0)
calls = calls[:-1]
st = _replay.status()
bad = [c for c in calls if c.get("n_bad")]
print("RESULT " + json.dumps(dict(
    subscribe=rc, warm_snapshot_s=round(warm, 3), warm_in_replay=_replay.warm_seconds, note=note,
    launches=st.launches, instrumented=len(calls), with_bad=len(bad), bad=bad[:12],
    refused=[c for c in calls if c.get("failed")][:5],
    hook_ms_median=sorted(c["hook_ms"] for c in calls)[len(calls) // 2] if calls else None,
    hook_ms_max=max((c["hook_ms"] for c in calls), default=None),
    prepare_ms_median=sorted(c.get("prepare_ms", 0) for c in calls)[len(calls) // 2] if calls else None,
    wait_ms_median=sorted(c.get("wait_ms", 0) for c in calls)[len(calls) // 2] if calls else None,
    kernels_bad=sorted({c["kernel"][:70] for c in bad})[:20])))
'''

RAISE = r'''
import cuda_debug.testing as t
t.empty()
try:
    t.out_of_bounds_write(96)                 # LAUNCH
except Exception as e:
    print("RAISED_AT_LAUNCH", type(e).__name__, flush=True)
    raise
print("NOT_RAISED_AT_LAUNCH", flush=True)
t.empty()
'''


def run(cmd, timeout, env=None, cwd=None):
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)
        return p.returncode, p.stdout, p.stderr, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        return None, e.stdout or "", (e.stderr or "") + "\nTIMEOUT", time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="tests,survey,raise,cost")
    a = ap.parse_args()
    only = a.only.split(",")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if "tests" in only:
        rc, out, err, wall = run([sys.executable, "-m", "pytest", "tests/test_replay_gpu.py", "-vv",
                                  "-rA", "-p", "no:cacheprovider"], 900, env, ROOT)
        print("== tests (rc %s, %.0f s):" % (rc, wall))
        print(out[-20000:])
        print(err[-2000:])
    if "survey" in only:
        path = os.path.join(OUT, "replay_survey.py")
        with open(path, "w") as f:
            f.write(SURVEY)
        rc, out, err, wall = run([sys.executable, path], 400, env)
        res = [l for l in out.splitlines() if l.startswith("RESULT ")]
        print("== survey (rc %s, %.0f s): %s" % (rc, wall, res[-1][7:] if res else "no result"))
        if not res:
            print(err[-4000:])
    if "raise" in only:
        path = os.path.join(OUT, "replay_raise.py")
        with open(path, "w") as f:
            f.write(RAISE)
        rc, out, err, wall = run([sys.executable, "-m", "cuda_debug", "replay", "--kernel",
                                  "write_wild", "--no-torch", path], 120, env)
        print("== raise (rc %s, %.1f s): stdout %r" % (rc, wall, out.strip()))
        print(textwrap.indent(err.strip()[-3000:], "   | "))
    if "cost" in only:
        rc, out, err, wall = run([sys.executable, "benchmarks/replay_cost.py", "--steps", "40",
                                  "--fault-step", "30", "--rounds", "1", "--compute-sanitizer",
                                  "--timeout", "240", "--json",
                                  os.path.join(OUT, "replay_cost.json")], 900, env, ROOT)
        print("== cost (rc %s, %.0f s):" % (rc, wall))
        print(out[-4000:])
        print(err[-3000:])
        try:
            with open(os.path.join(OUT, "replay_cost.json")) as f:
                runs = __import__("json").load(f)["runs"]
            print("   runs:", runs)
        except (OSError, ValueError, KeyError) as e:
            print("   no json:", e)


if __name__ == "__main__":
    main()
