import torch
x = torch.zeros(300, device="cuda")
torch.cuda.synchronize()
long = torch._C._construct_storage_from_data_pointer(x.data_ptr(), x.device, 1600)
bad = torch.empty(0, device="cuda").set_(long, 0, (400,), (1,))
bad.fill_(7.0)
torch.cuda.synchronize()
