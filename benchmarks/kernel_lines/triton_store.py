import torch, triton, triton.language as tl

@triton.jit
def store_past(p, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(p + offs, 1.0, mask=offs < n + 24)   # STORE

x = torch.zeros(300, device="cuda")
out = torch.empty_like(x)
store_past[(triton.cdiv(x.numel(), 128),)](out, x.numel(), BLOCK=128)
torch.cuda.synchronize()
