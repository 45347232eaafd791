"""Unmodified-style script: times a bf16 matmul with triton.testing.do_bench and do_bench_cudagraph.
No krex import: under KREX_HOOKS=triton the hook alone marks the regions."""
import json
import sys

import torch
from triton.testing import do_bench, do_bench_cudagraph

size, trials = int(sys.argv[1]), int(sys.argv[2])
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
fn = lambda: torch.mm(a, a)  # noqa: E731
for t in range(trials):
    q = do_bench(fn, warmup=25, rep=200, quantiles=[0.5, 0.2, 0.8])
    print(json.dumps({"fn": "do_bench", "size": size, "trial": t, "median_ms": q[0]}), flush=True)
g = do_bench_cudagraph(fn, rep=50)
print(json.dumps({"fn": "do_bench_cudagraph", "size": size, "mean_ms": g}), flush=True)
