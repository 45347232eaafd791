"""A stand-in for bench/contender.py on the fake driver (bench/freeze_policy.py --reference solo-busy):
writes READY, then waits for STOP, as the GPU neighbour would while its matmuls run."""

import sys
import time
from pathlib import Path

stop, ready = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
deadline = time.monotonic() + 600
while not stop.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
