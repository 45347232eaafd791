"""Does a timing depend on what the GPU ran before it, once the clock is back at its peak?

Under krex the regions of many agents follow each other back to back. The clock settle (docs/design/clock-settle.md)
makes each region start at the peak SM clock, yet in the Ray fleet's H200 run 7 the 0.1-10 ms kernels of a
shared node had regions whose lowest clock was ~1650 MHz against ~1950 alone. The hypothesis: the power limiter
averages over a window, so a region that follows a heavy one starts at the peak clock and is clamped sooner.

Per trial, in one process with nothing else on the GPU: a heavy load (bf16 16384 matmuls for each of --heavy-ms),
then each of --gaps ms idle, then the clock brought to --settle-pct of its peak the way krex's settle does it
(short kernels until NVML reads it), then one timing of the probe (bf16 8192 matmul, CUDA events around --reps
launches, the median), with NVML's SM clock, power and temperature before the timing, and the lowest clock and
the clock event reasons sampled during it. A gap of --cold-ms with no heavy load first is the reference. A short
and a long heavy load tell a fast memory (the power limiter's) from a slow one (the GPU's temperature). Prints
one JSON line per trial and a summary per heavy load and gap.
With --krex, run under `krex run --report REPORT`: each timing is a krex region and krex's own settle (the canary
after the grant, shim/settle.c) replaces the probe's NVML one; `--join REPORT` then adds each region's settle
outcome (status, waited, first clock) and sm_clock_mhz from the report to the result file.
    python bench/power_history.py --out power-history.json
    krex run --report r.json -- python bench/power_history.py --krex --out ph-krex.json
    python bench/power_history.py --join r.json --out ph-krex.json"""

import argparse
import json
import statistics
import threading
import time

import torch
import pynvml

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--gaps", default="0,50,200,500,1000,2000", help="idle ms after the heavy load, comma-separated")
ap.add_argument("--heavy-ms", default="300,3000", help="the heavy load's lengths before a trial, comma-separated")
ap.add_argument("--cold-ms", type=float, default=3000.0, help="idle before a reference trial (no heavy load)")
ap.add_argument("--trials", type=int, default=3, help="trials per heavy load and gap")
ap.add_argument("--size", type=int, default=8192, help="the probe matmul's size")
ap.add_argument("--reps", type=int, default=60, help="probe launches per timing")
ap.add_argument("--settle-pct", type=float, default=98.0)
ap.add_argument("--krex", action="store_true", help="time each trial in a krex region, settled by krex")
ap.add_argument("--join", metavar="REPORT", help="add the regions of this krex run report to --out, then exit")
ap.add_argument("--out", required=True)
args = ap.parse_args()

if args.join:
    with open(args.out) as f:
        res = json.load(f)
    with open(args.join) as f:
        regions = {r.get("name"): r for r in json.load(f).get("regions", [])}
    if not any("region" in row for row in res["rows"]):
        raise SystemExit(f"power_history: {args.out} was not made with --krex: no regions to join")
    for row in res["rows"]:
        if "region" not in row:
            continue
        r = regions.get(row["region"], {})
        row["krex"] = {"clock_settle": r.get("clock_settle"), "sm_clock_mhz": r.get("sm_clock_mhz"),
                       "taints": r.get("taints"), "exclusive": r.get("exclusive"),
                       "granted": bool(r.get("granted_ns"))}
    for key, rs in res["summary"].items():
        settles = [s for row in res["rows"] if row.get("case") == key and row.get("krex", {}).get("granted")
                   for s in (row["krex"]["clock_settle"] or [])]
        statuses = sorted({s.get("status") for s in settles})
        rs["krex_settle"] = {k: sum(s.get("status") == k for s in settles) for k in statuses}
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    raise SystemExit(0)

pynvml.nvmlInit()
dev = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
peak = pynvml.nvmlDeviceGetMaxClockInfo(dev, pynvml.NVML_CLOCK_SM)


def clock() -> int:
    return pynvml.nvmlDeviceGetClockInfo(dev, pynvml.NVML_CLOCK_SM)


def power_w() -> float:
    return pynvml.nvmlDeviceGetPowerUsage(dev) / 1000.0


def reasons() -> int:
    return pynvml.nvmlDeviceGetCurrentClocksEventReasons(dev)


def temperature() -> int:
    return pynvml.nvmlDeviceGetTemperature(dev, pynvml.NVML_TEMPERATURE_GPU)


H = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
A = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
B = torch.randn(args.size, args.size, device="cuda", dtype=torch.bfloat16)
tiny = torch.zeros(1024, device="cuda")
for _ in range(3):
    H @ H, A @ B
torch.cuda.synchronize()


def heavy(ms: float) -> None:
    end = time.monotonic() + ms / 1000.0
    while time.monotonic() < end:
        for _ in range(4):
            H @ H
        torch.cuda.synchronize()


def settle() -> tuple:
    """Short kernels until NVML reads the clock at settle-pct of the peak (at most 300 ms): (ms waited, clock)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.3:
        c = clock()
        if c >= peak * args.settle_pct / 100.0:
            return (time.monotonic() - t0) * 1000.0, c
        for _ in range(50):
            tiny.add_(1)
        torch.cuda.synchronize()
    return (time.monotonic() - t0) * 1000.0, clock()


def timing(name: str) -> dict:
    if not args.krex:
        return timed()
    import krex
    with krex.region(name) as r:
        row = timed()
    return {**row, "region": name, "granted": r.granted, "region_sm_clock_mhz": r.sm_clock_mhz}


def timed() -> dict:
    lowest, seen, stop = [peak], [0], threading.Event()

    def sample():
        while not stop.is_set():
            lowest[0] = min(lowest[0], clock())
            seen[0] |= reasons()
            time.sleep(0.002)

    before_mhz, before_w, before_c = clock(), power_w(), temperature()
    t = threading.Thread(target=sample)
    t.start()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(args.reps)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(args.reps)]
    for s, e in zip(start, end):
        s.record()
        A @ B
        e.record()
    torch.cuda.synchronize()
    stop.set()
    t.join()
    ms = statistics.median(s.elapsed_time(e) for s, e in zip(start, end))
    return {"ms": ms, "clock_before_mhz": before_mhz, "power_before_w": round(before_w, 1), "temperature_before_c":
            before_c, "lowest_mhz": lowest[0], "reasons_during": hex(seen[0])}


rows = []
gaps = [float(g) for g in args.gaps.split(",")]
cases = [("cold", 0.0)] + [(float(h), g) for h in args.heavy_ms.split(",") for g in gaps]
for trial in range(args.trials):
    for heavy_ms, gap in cases:
        if heavy_ms == "cold":
            time.sleep(args.cold_ms / 1000.0)
        else:
            heavy(heavy_ms)
            time.sleep(gap / 1000.0)
        waited, at = settle() if not args.krex else (0.0, clock())
        key = "cold" if heavy_ms == "cold" else f"heavy {heavy_ms:g} ms, gap {gap:g} ms"
        row = {"trial": trial, "heavy_ms": heavy_ms, "gap_ms": gap, "case": key, "settle_ms": round(waited, 1),
               "settled_mhz": at, **timing(f"t{trial} {key}")}
        rows.append(row)
        print(json.dumps(row), flush=True)

cold = statistics.median(r["ms"] for r in rows if r["heavy_ms"] == "cold")
summary = {}
for heavy_ms, gap in cases:
    rs = [r for r in rows if (r["heavy_ms"], r["gap_ms"]) == (heavy_ms, gap)]
    key = "cold" if heavy_ms == "cold" else f"heavy {heavy_ms:g} ms, gap {gap:g} ms"
    summary[key] = {"median_ms": statistics.median(r["ms"] for r in rs),
                    "vs_cold_pct": round(100 * (statistics.median(r["ms"] for r in rs) / cold - 1), 2),
                    "worst_vs_cold_pct": round(100 * (max(r["ms"] for r in rs) / cold - 1), 2),
                    "lowest_mhz": statistics.median(r["lowest_mhz"] for r in rs),
                    "power_before_w": statistics.median(r["power_before_w"] for r in rs),
                    "temperature_before_c": statistics.median(r["temperature_before_c"] for r in rs),
                    "settle_ms": statistics.median(r["settle_ms"] for r in rs)}
    print(key, json.dumps(summary[key]))
with open(args.out, "w") as f:
    json.dump({"args": vars(args), "peak_mhz": peak, "gpu": pynvml.nvmlDeviceGetName(dev), "rows": rows,
               "summary": summary, "torch": torch.__version__}, f, indent=1)
