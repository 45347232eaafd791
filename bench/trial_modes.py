"""Why one KernelBench problem's trials fall into modes (conv_transposed_3D 68: 33.7 or 35.7 ms within one
process, alone too): KernelBench's timing loop (its clear_l2_cache, CUDA events, a synchronize per trial)
with, after each trial, the output tensor's address and NVML's SM clock, temperature, power and clock event
reasons, and the host time of the L2 flush and of the launch (start event, the model, end event), in fresh
processes one after another (--pin: on those CPUs only, as krex's CPU isolation puts a region owner;
--pin-main: the main thread alone there, the process's other threads on the other CPUs). A mode
that follows the output's address is memory placement, one that follows the clock the power state, one that
follows the host launch time a GPU waiting for its CPU inside the timed window.

    python bench/trial_modes.py --kernelbench .kb --items 68_conv_transposed_3D__square_input__asymmetric_kernel.py:fp32 \
        --procs 3 --trials 60 --out /tmp/krex-out/trial-modes.json

Not a krex measurement: nothing here runs under krex."""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(args) -> None:
    sys.path.insert(0, args.kernelbench)
    sys.path.insert(0, str(ROOT / "bench"))
    import pynvml
    import torch
    from kernelbench import timing
    from kb_agent import make_problem
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    torch.zeros(1, device=dev)
    if args.pin or args.pin_main:   # every thread on these CPUs (as krex's CPU isolation does to an owner), or
        spec = args.pin or args.pin_main    # the main thread there and the others on the remaining CPUs
        cpus = {int(c) for part in spec.split(",") for c in
                (range(int(part.split("-")[0]), int(part.split("-")[-1]) + 1))}
        rest = os.sched_getaffinity(0) - cpus
        for tid in map(int, os.listdir("/proc/self/task")):
            os.sched_setaffinity(tid, cpus if args.pin or tid == os.getpid() else rest)
    libc = ctypes.CDLL(None)      # sched_getcpu: the CPU the main thread is on after the trial
    rows = []
    with torch.no_grad():
        for item in args.items.split(","):
            model, inputs = make_problem(args.kernelbench, item, dev)
            for _ in range(3):
                model(*inputs)
                torch.cuda.synchronize()
            torch.cuda.empty_cache()       # as time_execution_with_cuda_event does after its warm-up
            out = None
            for trial in range(args.trials):
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                t0 = time.perf_counter()
                timing.clear_l2_cache(device=dev)
                t1 = time.perf_counter()
                start.record()
                out = model(*inputs)
                end.record()
                t2 = time.perf_counter()
                torch.cuda.synchronize()
                rows.append({"item": item, "trial": trial, "ms": start.elapsed_time(end),
                             "host_flush_us": (t1 - t0) * 1e6, "host_launch_us": (t2 - t1) * 1e6,
                             "cpu": libc.sched_getcpu(),
                             "out_ptr": out.data_ptr() if isinstance(out, torch.Tensor) else None,
                             "sm_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM),
                             "mem_mhz": pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM),
                             "temp_c": pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU),
                             "power_w": pynvml.nvmlDeviceGetPowerUsage(h) / 1000,
                             "reasons": pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)})
            del model, inputs, out
            torch.cuda.empty_cache()
    Path(args.rows).write_text(json.dumps(rows))


def summary(rows: list) -> dict:
    """Per item: the trials' times by output address and by SM clock (median, count), fastest first. Every
    trial counts, the first one too (KernelBench's own loop drops one)."""
    res = {}
    for item in sorted({r["item"] for r in rows}):
        rs = [r for r in rows if r["item"] == item]
        fast = min(r["ms"] for r in rs)
        by = {}
        slow = [r for r in rs if r["ms"] > 1.02 * fast]
        quick = [r for r in rs if r["ms"] <= 1.02 * fast]
        host = {name: {k: round(statistics.median(r[k] for r in group), 1) for k in ("host_flush_us", "host_launch_us")}
                for name, group in (("slow", slow), ("quick", quick)) if group}
        for key in ("out_ptr", "sm_mhz", "reasons", "proc", "cpu"):
            groups = {}
            for r in rs:
                groups.setdefault(str(r[key]), []).append(r["ms"])
            by[key] = sorted(([k, len(v), round(statistics.median(v) / fast - 1, 4)] for k, v in groups.items()),
                             key=lambda g: g[2])
        res[item] = {"fastest_ms": fast, "n": len(rs), "slow_share": round(sum(r["ms"] > 1.02 * fast for r in rs) / len(rs), 3),
                     "host_us_median": host, "by": by}
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", default=str(ROOT / ".kb"))
    ap.add_argument("--items", required=True, help="PROBLEM:DTYPE,... (as bench/kb_agent.py)")
    ap.add_argument("--procs", type=int, default=3, help="fresh processes, one after another")
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--pin", help="CPUs (e.g. 14-15) every thread of each process is pinned to after CUDA starts")
    ap.add_argument("--pin-main", help="CPUs the main thread alone is pinned to (the other threads: the rest)")
    ap.add_argument("--out")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rows", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for p in range(args.procs):
            path = Path(tmp) / f"rows{p}.json"
            r = subprocess.run([sys.executable, __file__, "--child", "--kernelbench", args.kernelbench, "--items",
                                args.items, "--trials", str(args.trials), "--rows", str(path),
                                *(["--pin", args.pin] if args.pin else []),
                                *(["--pin-main", args.pin_main] if args.pin_main else [])],
                               capture_output=True, text=True, timeout=300)
            if r.returncode:
                print(f"trial_modes: process {p} failed: {r.stderr.strip().splitlines()[-1:]}", file=sys.stderr)
                return 1
            rows += [dict(x, proc=p) for x in json.loads(path.read_text())]
    res = {"argv": sys.argv, "summary": summary(rows), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(res, indent=1))
    print(json.dumps(res["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
