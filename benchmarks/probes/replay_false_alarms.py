"""Probe (open question): does the replay's check raise false alarms on real kernels?

    python3 benchmarks/probes/replay_false_alarms.py        # on the GPU machine

Every launch of two steps of a 4-layer transformer with an embedding, a bf16 head,
cross-entropy and SDPA is instrumented one after the other, observe only (warps not
exited, calls not failed), against PyTorch's live tensors as `cuda-debug replay`
checks them. Prints one `RESULT {...}` line: launches instrumented, how many had an
access outside the live tensors (each with its kernel, access and line: a false
alarm, or a finding), and what an instrumented launch costs (hook, patch, wait).

tests/replay/test_replay.py::test_a_clean_kernel_is_not_reported checks 16 launches of
a smaller step; this asks it of every kernel of a wider one. When the answer is in
(benchmarks/RESULTS.md), a test that can fail takes its place and this file goes
(benchmarks/probes/README.md). Taken from replay_product.py's "survey" (git show
413796c:benchmarks/probes/replay_product.py).
"""
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

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


def main():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryDirectory(prefix="replay_probe_") as tmp:
        path = os.path.join(tmp, "replay_survey.py")
        with open(path, "w") as f:
            f.write(SURVEY)
        p = subprocess.run([sys.executable, path], capture_output=True, text=True, timeout=400,
                           env=env)
    res = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    print(res[-1] if res else "no result (rc %s)\n%s" % (p.returncode, p.stderr[-4000:]))
    return 0 if res else 1


if __name__ == "__main__":
    sys.exit(main())
