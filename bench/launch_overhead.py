"""Added cost per launch (or per stream-ordered allocation), outside regions or inside one, with and without the shim.

    python bench/launch_overhead.py --bin build/spin_bench --out overhead.json   (real GPU or fake driver)
    python bench/launch_overhead.py --bin build/spin_bench --mode alloc --compare-shim old/libkrex.so --out a.json
Alternates the configurations --repeats times; the shim runs connected to a controller (krex run). --mode launch
times empty-kernel launches (spin_bench -e), --mode alloc cuMemAllocAsync + cuMemFreeAsync pairs of 256 bytes
(spin_bench -a: the allocation path, which reads the device's current pool). --compare-shim adds a third
configuration, `krex run` with that libkrex.so (KREX_SHIM), e.g. the shim of an earlier commit. --in-region times the
same loop inside one region (spin_bench -i): the path of a launch while its process holds the GPU; each run under
the shim must have been granted its region, or the script stops."""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

KEY = {"launch": "ns_per_launch", "alloc": "ns_per_allocation"}


def rate(cmd: list, env: dict | None = None) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="spin_bench built against the driver to measure")
    ap.add_argument("--mode", choices=tuple(KEY), default="launch")
    ap.add_argument("--launches", type=int, default=200000, help="launches (or allocations) per run")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--in-region", action="store_true", help="time the loop inside one region (spin_bench -i)")
    ap.add_argument("--compare-shim", default=None, metavar="LIBKREX",
                    help="a second shim to measure the same way (KREX_SHIM), e.g. an earlier commit's build")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.launches < 1 or args.repeats < 1:
        ap.error("--launches and --repeats: 1 or more")
    if args.compare_shim and not Path(args.compare_shim).is_file():
        ap.error(f"--compare-shim: no file {args.compare_shim}")
    key = KEY[args.mode]
    base = [args.bin, "-e" if args.mode == "launch" else "-a", "-n", str(args.launches)]
    base += ["-i"] if args.in_region else []
    wrapped = [sys.executable, "-m", "krex_ctl", "run", "--"] + base
    own = {k: v for k, v in os.environ.items() if k != "KREX_SHIM"}    # the shim krex run finds: this tree's
    runs = {"plain": [], "shim": [], "compare": []}
    for _ in range(args.repeats):
        runs["plain"].append(rate(base))
        runs["shim"].append(rate(wrapped, own))
        if args.compare_shim:
            runs["compare"].append(rate(wrapped, dict(os.environ, KREX_SHIM=os.path.abspath(args.compare_shim))))
    if args.in_region:   # a run whose region was not granted timed the path outside regions
        refused = [r for k in ("shim", "compare") for r in runs[k] if r.get("krex_begin") != 0]
        if refused:
            sys.exit(f"launch_overhead: {len(refused)} run(s) under the shim were not granted their region: "
                     f"{refused[0]}")
    med = {k: statistics.median(r[key] for r in v) for k, v in runs.items() if v}
    spread = {k: [min(r[key] for r in v), max(r[key] for r in v)] for k, v in runs.items() if v}
    result = {"mode": args.mode, "in_region": args.in_region,
              "launches" if args.mode == "launch" else "allocations": args.launches,
              "repeats": args.repeats,
              f"{key}_plain": med["plain"], f"{key}_shim": med["shim"], "added_ns": med["shim"] - med["plain"],
              "spread_ns": spread}
    if args.mode == "launch":   # the keys of the earlier results (bench/results/overhead-*.json)
        result.update(added_ns_per_launch=med["shim"] - med["plain"], launch_rate_loss=1 - med["plain"] / med["shim"])
    if args.compare_shim:
        result.update({"compare_shim": args.compare_shim, f"{key}_compare": med["compare"],
                       "added_ns_compare": med["compare"] - med["plain"]})
    result.update(runs={k: v for k, v in runs.items() if v})
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "runs"}, indent=1))


if __name__ == "__main__":
    main()
