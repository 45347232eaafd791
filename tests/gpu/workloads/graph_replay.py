"""CUDA graph: capture K kernels once, replay R times: R graph launches must be seen, captures not run."""
import torch

from _count import delta, emit, shim_counts

K, R = 20, 100
x = torch.zeros(1 << 16, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        x.add_(1.0)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
before = shim_counts()
with torch.cuda.graph(g):
    for _ in range(K):
        x.add_(1.0)
mid = shim_counts()
for _ in range(R):
    g.replay()
torch.cuda.synchronize()
after = shim_counts()
cap, rep = delta(before, mid), delta(mid, after)
emit(workload="cuda graph replay", expected=R, profiler=None, shim=rep["graphs"],
     captured_seen=cap["captured"], captured_expected=K, kernels_during_replay=rep["kernels"],
     value=float(x[0]), value_expected=3 + K * R)
