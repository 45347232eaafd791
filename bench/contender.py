"""A busy neighbour for the fidelity benchmarks: GPU work back to back until a stop file appears.
Writes READY_FILE once it is running, so the measurement starts against a loaded GPU.

    contender.py STOP READY [LOAD]   LOAD: SIZE (bf16 SIZE x SIZE matmuls, the default 8192: the GPU at its power
                                     cap) or sum@MIB (torch.sum over MIB MiB of float32: memory-bound, as the
                                     memory-bound mix's kernels are)"""

import os
import sys
import time

import torch

stop, ready = sys.argv[1], sys.argv[2]
load = sys.argv[3] if len(sys.argv) > 3 else "8192"
if load.startswith("sum@"):
    x = torch.empty(int(load[4:]) * 2**20 // 4, device="cuda", dtype=torch.float32).uniform_()
    step = lambda: torch.sum(x)   # noqa: E731
else:
    a = torch.randn(int(load), int(load), device="cuda", dtype=torch.bfloat16)
    step = lambda: torch.mm(a, a)   # noqa: E731
n = 0
deadline = time.monotonic() + 600
while not os.path.exists(stop) and time.monotonic() < deadline:
    for _ in range(4):
        step()
    torch.cuda.synchronize()
    n += 4
    if n == 8:
        open(ready, "w").close()
print(f"contender {os.getpid()}: {n} steps of {load}", file=sys.stderr)
