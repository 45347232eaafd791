"""A stand-in for bench/contender.py on the fake driver (bench/freeze_policy.py --reference solo-busy):
writes READY, then waits for STOP, as the GPU neighbour would while its matmuls run. With NEIGHBOUR_MARK set it
appends "start JOB LOAD" and "stop JOB LOAD" there (KREX_JOB: the krex run it runs under; LOAD: its third
argument, bench/freeze_policy.py --neighbour-load, or -)."""

import os
import sys
import time
from pathlib import Path

stop, ready = Path(sys.argv[1]), Path(sys.argv[2])
mark = os.environ.get("NEIGHBOUR_MARK")


def note(what: str) -> None:
    if mark:
        with open(mark, "a") as f:
            f.write(f"{what} {os.environ.get('KREX_JOB', '-')} {sys.argv[3] if len(sys.argv) > 3 else '-'}\n")


note("start")
ready.touch()
deadline = time.monotonic() + 600
while not stop.exists() and time.monotonic() < deadline:
    time.sleep(0.05)
note("stop")
