"""Added cost per launch outside regions: empty-kernel launch rate with and without the shim.

    python bench/launch_overhead.py --bin build/spin_bench --out overhead.json   (real GPU or fake driver)
Alternates the two configurations --repeats times; the shim runs connected to a controller (krex run)."""

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path


def rate(cmd: list) -> dict:
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="spin_bench built against the driver to measure")
    ap.add_argument("--launches", type=int, default=200000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    base = [args.bin, "-e", "-n", str(args.launches)]
    plain, shim = [], []
    for _ in range(args.repeats):
        plain.append(rate(base))
        shim.append(rate([sys.executable, "-m", "krex_ctl", "run", "--"] + base))
    p = statistics.median(r["ns_per_launch"] for r in plain)
    s = statistics.median(r["ns_per_launch"] for r in shim)
    result = {"launches": args.launches, "repeats": args.repeats, "ns_per_launch_plain": p, "ns_per_launch_shim": s,
              "added_ns_per_launch": s - p, "launch_rate_loss": 1 - p / s, "plain": plain, "shim": shim}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k not in ("plain", "shim")}, indent=1))


if __name__ == "__main__":
    main()
