"""What a region's attestation costs the hand-off on this machine: the controller's NVML snapshot at the grant
and its judgement at the end, timed in-process (the controller makes the same calls), per GPU.
    python bench/nvml_cost.py --repeats 200"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from krex_ctl import nvml  # noqa: E402
from krex_ctl.enforce import attest  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--out")
    args = ap.parse_args()
    nv = nvml.open_nvml()
    if nv is None:
        print("nvml_cost: no NVML here", file=sys.stderr)
        return 1
    att = attest.NvmlAttestor(nv, SimpleNamespace(clock_drop_pct=3.0, busy_before_us=1000.0), lambda: set())
    start, end = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter_ns()
        snap = att.snapshot(1)
        t1 = time.perf_counter_ns()
        region = SimpleNamespace(attest_start=snap, taints=0, others_busy_us=0)
        res = att.finish(region, 0)
        t2 = time.perf_counter_ns()
        start.append((t1 - t0) / 1e3)
        end.append((t2 - t1) / 1e3)
    calls = {}
    for name, fn in (("reasons", lambda: nv.reasons(0)), ("violation", lambda: nv.violation_ns(0, 0)),
                     ("sm_clock", lambda: nv.sm_clock(0)), ("samples", lambda: nv.sm_clock_samples(0, 0)),
                     ("energy", lambda: nv.energy_mj(0)), ("temperature", lambda: nv.temperature(0)),
                     ("processes", lambda: nv.processes(0)), ("xid", lambda: nv.xid_events())):
        ts = []
        for _ in range(50):
            t0 = time.perf_counter_ns()
            fn()
            ts.append((time.perf_counter_ns() - t0) / 1e3)
        calls[name] = round(statistics.median(ts), 1)
    out = {"gpus": nv.count, "snapshot_us": {"median": round(statistics.median(start), 1), "max": round(max(start), 1)},
           "finish_us": {"median": round(statistics.median(end), 1), "max": round(max(end), 1)},
           "call_median_us": calls, "last": res.record()}
    print(json.dumps(out, indent=1))
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
