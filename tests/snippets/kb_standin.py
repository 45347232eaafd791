"""A CPU stand-in for bench/kb_agent.py (tests/test_bench.py): the same arguments and JSON lines, each item
"timed" by a busy loop as long as its name says (PROBLEM:DTYPE, the problem's leading number in tenths of a
millisecond), inside a krex region under `krex run`, with what krex said of the region. The loop runs and is
timed in this thread's CPU time, so that a loaded machine (the suite runs in two processes) does not move an
item into another length bucket."""

import argparse
import json
import os
import statistics
import time

import krex

ap = argparse.ArgumentParser()
ap.add_argument("--kernelbench")
ap.add_argument("--items", required=True)
ap.add_argument("--trials", type=int, default=5)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--out", required=True)
ap.add_argument("--tag", default="")
args = ap.parse_args()
with open(args.out, "a") as out:
    for index, item in enumerate(args.items.split(",")):
        ms = int(item.split("_")[0]) / 10
        with krex.region("kernelbench.time_execution_with_cuda_event") if os.environ.get("KREX_JOB") else \
                open(os.devnull) as r:
            times = []
            for _ in range(args.trials):
                t = time.thread_time()
                while time.thread_time() - t < ms / 1e3:
                    pass
                times.append((time.thread_time() - t) * 1e3)
        rec = {"item": item, "index": index, "tag": args.tag, "pid": os.getpid(), "median_ms": statistics.median(times),
               "mean_ms": statistics.fmean(times), "min_ms": min(times), "times": times, "t": 0}
        if isinstance(r, krex.region) and r.info is not None:
            rec["region"] = {"granted": r.granted, "exclusive": r.exclusive, "clean": r.clean, "taints": r.taints,
                             "sm_clock_mhz": r.sm_clock_mhz}
        out.write(json.dumps(rec) + "\n")
