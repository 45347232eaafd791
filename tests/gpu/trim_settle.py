"""On a real GPU: is memory the stream-ordered allocator gives back waited for as a free is? A holder process
(workloads/pool_trim.py) under krex run allocates 2 GiB from the default pool, frees and synchronizes it and
stays; then another job's region starts and the report says how long it waited to settle. Modes: keep (the pool
keeps the memory: nothing to wait for), trim (cuMemPoolTrimTo: the shim reports the bytes the reservation shrank
by), sync (the default release threshold: the synchronize gives the memory back, without a trim), drain (the
default threshold, no synchronize: the drain's gives it back), regrow (given back and taken again before the
region, 3 GiB in all), current and revert (the plain allocations from a pool the program made the device's
current one with cuDeviceSetMemPool, and from the default one again after that pool's destroy: the shim must
follow both changes), and PyTorch's cudaMallocAsync backend without and
with torch.cuda.empty_cache() (torch-keep, torch-trim). Its own
controller with settle_ms_per_gib 1000 (2 GiB: about 2 s) and lifecycle_timeout_s 10.
    . tests/gpu/env.sh; python3 tests/gpu/trim_settle.py --out $OUT/trim-settle.json"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REGION = """
from cuda.bindings import driver as d
import krex
assert int(d.cuInit(0)[0]) == 0
dev = d.cuDeviceGet(0)[1]
ctx = d.cuDevicePrimaryCtxRetain(dev)[1]
assert int(d.cuCtxSetCurrent(ctx)[0]) == 0
with krex.region("settle-probe"):
    pass
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="krex-trim-"))
    env = dict(os.environ, KREX_SOCKET=str(work / "krex.sock"))
    cfg = work / "c.json"
    cfg.write_text(json.dumps({"settle_ms_per_gib": 1000, "lifecycle_timeout_s": 10}))
    ctl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--config", str(cfg),
                            "--state-file", str(work / "state")], env=env, stderr=open(work / "ctl.log", "w"))
    rows = []
    try:
        for _ in range(150):
            if (work / "krex.sock").exists():
                break
            time.sleep(0.1)
        for mode in ("keep", "trim", "sync", "drain", "regrow", "current", "revert", "torch-keep", "torch-trim"):
            # both on GPU 0 (krex run would place them apart on a node of several GPUs)
            holder = subprocess.Popen([sys.executable, "-m", "krex_ctl", "run", "--gpu", "0", "--", sys.executable,
                                       str(HERE / "workloads" / "pool_trim.py"), mode],
                                      env={**env, "PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
                                      stdout=subprocess.PIPE, text=True)
            info, ready = {}, False
            for line in holder.stdout:
                if line.startswith("{"):
                    info = json.loads(line)
                if line.strip() == "ready":
                    ready = True
                    break
            if not ready:                          # it ended first (its error is on stderr): no region to judge
                holder.wait()
                rows.append({"mode": mode, "error": f"the holder ended before it was ready (exit {holder.returncode})"})
                print(json.dumps(rows[-1]), flush=True)
                continue
            time.sleep(1.0)                        # the free is at least 1 s old: a settle left is the trim's
            rep = work / f"{mode}.json"
            r = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--gpu", "0", "--report", str(rep), "--",
                                sys.executable, "-c", REGION], env=env, capture_output=True, text=True, timeout=120)
            region = json.loads(rep.read_text())["regions"][0] if rep.exists() else {}
            row = {**info, "mode": mode, "rc": r.returncode, "settle_ms": round(region.get("settle_ns", 0) / 1e6, 1),
                   "wait_ms": round(((region.get("granted_ns") or 0) - region.get("requested_ns", 0)) / 1e6, 1), "clean": region.get("clean"),
                   "stderr": r.stderr[-400:] if r.returncode else ""}
            rows.append(row)
            print(json.dumps(row), flush=True)
            holder.kill()
            holder.wait()
            time.sleep(3.0)                        # the holder's exit settles too: let it pass before the next
    finally:
        ctl.terminate()
        ctl.wait(timeout=30)
    Path(args.out).write_text(json.dumps({"rows": rows, "settle_ms_per_gib": 1000, "host": os.uname().nodename},
                                         indent=1))


if __name__ == "__main__":
    main()
