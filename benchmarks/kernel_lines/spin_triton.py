import torch, triton, triton.language as tl, os, sys

@triton.jit
def spin_tl(p, n):
    acc = tl.load(p + tl.arange(0, 128))
    for i in range(n):
        acc = acc * 1.0000001 + 1.0          # SPIN
    tl.store(p + tl.arange(0, 128), acc)

x = torch.zeros(128, device="cuda")
spin_tl[(4,)](x, 1)
torch.cuda.synchronize()
spin_tl[(4,)](x, int(sys.argv[1]) * 300_000_000)
open(sys.argv[2], "w").write(str(os.getpid()))
torch.cuda.synchronize()
print("triton spin done")
