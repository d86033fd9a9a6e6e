"""The reports the README shows, produced on a real GPU (a graph fault, a hang).

Usage:
    python benchmarks/readme_demos.py [graph|hang|guard ...]   # default: all

Each demo runs in a child process (a sticky fault kills the CUDA context) from
a folder /tmp/readme_demo, and what the child wrote to stdout and stderr is
printed, headed by the demo's name.
"""
import os
import subprocess
import sys
import textwrap

DEMOS = {
    "graph": '''
        import torch, cuda_debug
        emb = torch.nn.Embedding(1000, 64).cuda()
        tokens = torch.zeros(64, dtype=torch.long, device="cuda")
        g = torch.cuda.CUDAGraph()
        with cuda_debug.watch():
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    out = emb(tokens).relu()           # warm-up outside the capture
            torch.cuda.current_stream().wait_stream(s)
            with torch.cuda.graph(g):
                out = emb(tokens).relu().sum()
            for step in range(3):
                tokens.copy_(torch.randint(0, 1000 if step < 2 else 5000, (64,), device="cuda"))
                g.replay()
                print("step", step, float(out))
    ''',
    "hang": '''
        import time, cuda_debug, cuda_debug.testing as t
        with cuda_debug.watch(hang_after=2):
            t.spin(5)                                  # a kernel that takes 5 s
            t.empty(); t.empty()                       # queued behind it
            cuda_debug.check()                         # the host waits
        print("alive, the spin finished")
    ''',
    "guard": '''
        import torch, cuda_debug
        emb = torch.nn.Embedding(32000, 512).cuda()
        tokens = torch.randint(0, 32000, (16, 256), device="cuda")
        tokens[3, 17] = 32000
        with cuda_debug.guard():
            try:
                emb(tokens)
            except IndexError as e:
                print(type(e).__name__ + ":", e)
        print("next:", float(emb(tokens.clamp(max=31999)).sum()) != 0.0)
    ''',
}


def main(argv):
    names = argv[1:] or list(DEMOS)
    folder = "/tmp/readme_demo"
    os.makedirs(folder, exist_ok=True)
    for name in names:
        path = os.path.join(folder, "%s_demo.py" % name)
        with open(path, "w") as f:
            f.write(textwrap.dedent(DEMOS[name]).lstrip())
        p = subprocess.run([sys.executable, path], capture_output=True, text=True,
                           errors="replace", cwd=folder, timeout=120)
        print("==== %s (exit %d)" % (name, p.returncode))
        print(p.stdout + p.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
