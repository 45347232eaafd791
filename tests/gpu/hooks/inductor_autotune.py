"""PyTorch Inductor max-autotune of a matmul: Inductor benchmarks its candidate kernels."""
import torch
import torch._inductor.config as cfg
from torch._inductor.runtime import benchmarking

cfg.max_autotune_gemm_backends = "TRITON,ATEN"
cfg.autotune_in_subproc = False
print("set_gpu_benchmark_lock_context:", hasattr(benchmarking, "set_gpu_benchmark_lock_context"), flush=True)
a = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
f = torch.compile(lambda x: x @ x, mode="max-autotune-no-cudagraphs")
f(a)
torch.cuda.synchronize()
print("compiled", flush=True)
