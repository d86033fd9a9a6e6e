"""The frame reader's cost per launch, on CPU: watch() with the fake CUDA driver
(tests/fake_cuda), CUDA_DEBUG_PROFILE=1, nanoseconds in the watch recorder per
launch (_core.stats(): ns_watch / watched; the walk of the launching thread's
frames and their interning are most of it), for launches whose walk reads 2,
12 and 64 Python frames (library frames above the user's). Best of 25 rounds
of 5,000 launches, in a fresh child process.

    python benchmarks/frame_walk.py [TREE]     # TREE: a cuda_debug checkout, built
                                               # for this Python (default: this one)

Prints {"frames": ns per launch, ...} and the frame reader. A shared machine is
noisy: run it several times, A/B alternating, before trusting a difference.
"""
import json
import os
import subprocess
import sys
import tempfile
import textwrap

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))

CHILD = textwrap.dedent('''
    import json, os, sys
    import cuda_debug
    from cuda_debug import _core
    lib = os.path.join(os.path.dirname(os.path.abspath(__file__)), "site-packages")
    os.makedirs(lib, exist_ok=True)
    with open(os.path.join(lib, "cd_walklib.py"), "w") as f:
        f.write("def launch(fake, depth, n):\\n"
                "    if depth:\\n"
                "        return launch(fake, depth - 1, n)\\n"
                "    for _ in range(n):\\n"
                "        fake.fake_launch(b'k', 0, 1, 1, 1, 1, 1, 1)\\n")
    sys.path.insert(0, lib)
    import cd_walklib
    out = {}
    for depth, frames in ((0, 2), (10, 12), (70, 64)):   # the walk stops at 64 frames
        best = None
        for _ in range(25):
            with cuda_debug.watch():
                s0 = _core.stats()
                cd_walklib.launch(fake, depth, 5000)
                s1 = _core.stats()
            ns = (s1["ns_watch"] - s0["ns_watch"]) / (s1["watched"] - s0["watched"])
            best = ns if best is None else min(best, ns)
        out[frames] = round(best, 1)
    print("RESULT " + json.dumps(dict(ns_per_launch=out, reader=getattr(_core, "FRAME_READER", "?"))))
''')


def main():
    tree = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else ROOT)
    import fake_cuda
    folder = fake_cuda.build()
    with tempfile.TemporaryDirectory(prefix="cuda_debug_walk_") as d:
        script = os.path.join(d, "walk.py")
        with open(script, "w") as f:
            f.write(fake_cuda.PRELUDE + CHILD)
        env = dict(os.environ, PYTHONPATH=tree, CUDA_DEBUG_PROFILE="1",
                   **fake_cuda.child_env(folder))
        p = subprocess.run([sys.executable, script], capture_output=True, text=True, env=env,
                           cwd=tree, timeout=600)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if not line:
        sys.exit(p.stderr[-3000:])
    print("Python %s, %s: %s" % (sys.version.split()[0], tree, json.loads(line[0][7:])))


if __name__ == "__main__":
    main()
