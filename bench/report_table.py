"""Markdown table of a throughput result (bench/throughput.py --out FILE) for the README.
    python bench/report_table.py bench/results/<date>-h200.json"""

import json
import sys


def pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:+.2f}%"


def main() -> None:
    data = json.load(open(sys.argv[1]))
    buckets = ["<0.1ms", "0.1-1ms", "1-10ms", ">10ms"]
    print("| mode | agents | commands | per min | vs cmdlock | " + " | ".join(f"p95 {b}" for b in buckets) + " |")
    print("|---|---|---|---|---|" + "---|" * len(buckets))
    for s in data["summary"]:
        print(f"| {s['mode']} | {s['agents']} | {s['commands']} | {s['commands_per_min']:.1f} | "
              f"{s['vs_cmdlock'] if s['vs_cmdlock'] is not None else 'n/a'} | "
              + " | ".join(pct(s["p95_inflation"][b]) for b in buckets) + " |")
    for s in data["summary"]:
        if "amdahl_bound_per_min" in s:
            print(f"\nkrex x{s['agents']}: Amdahl bound {s['amdahl_bound_per_min']}/min (mean command "
                  f"{s['mean_command_s']} s, mean region time {s['mean_region_held_s']} s per command), reached "
                  f"{100 * s['amdahl_fraction']:.0f}%; mean wait for a region {s['mean_region_wait_s']} s")


if __name__ == "__main__":
    main()
