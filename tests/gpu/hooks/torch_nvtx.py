"""torch.cuda.nvtx ranges named krex* (NVTX injection through the shim)."""
import torch

a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
a @ a
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("krex_torch_nvtx")
for _ in range(10):
    a @ a
torch.cuda.synchronize()
torch.cuda.nvtx.range_pop()
torch.cuda.nvtx.range_push("not_a_region")
torch.cuda.nvtx.range_pop()
print("done", flush=True)
