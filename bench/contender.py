"""A busy neighbour for the fidelity benchmarks: bf16 matmuls back to back until a stop file appears.
Writes READY_FILE once it is running, so the measurement starts against a loaded GPU."""

import os
import sys
import time

import torch

stop, ready = sys.argv[1], sys.argv[2]
size = int(sys.argv[3]) if len(sys.argv) > 3 else 8192
a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
n = 0
deadline = time.monotonic() + 600
while not os.path.exists(stop) and time.monotonic() < deadline:
    for _ in range(4):
        torch.mm(a, a)
    torch.cuda.synchronize()
    n += 4
    if n == 8:
        open(ready, "w").close()
print(f"contender {os.getpid()}: {n} matmuls", file=sys.stderr)
