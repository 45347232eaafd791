"""Markdown tables of throughput results (bench/throughput.py --out FILE), one per file.
    python bench/report_table.py bench/results/<date>-h200.json [MORE.json ...]   (prints them)
The measurement pages hold these tables in generated blocks: bench/measurement_tables.py rewrites them."""

import argparse
import json


def pct(x: float) -> str:
    return "n/a" if x != x else f"{100 * x:+.2f}%"


def table(data: dict) -> str:
    buckets = ["<0.1ms", "0.1-1ms", "1-10ms", ">10ms"]
    lines = ["| mode | agents | commands | per min | vs cmdlock | " + " | ".join(f"p95 {b}" for b in buckets) + " |",
             "|---|---|---|---|---|" + "---|" * len(buckets)]
    for s in data["summary"]:
        lines.append(f"| {s['mode']} | {s['agents']} | {s['commands']} | {s['commands_per_min']:.1f} | "
                     f"{s['vs_cmdlock'] if s['vs_cmdlock'] is not None else 'n/a'} | "
                     + " | ".join(pct(s["p95_inflation"][b]) for b in buckets) + " |")
    for s in data["summary"]:
        if "amdahl_bound_per_min" in s:
            warm = f"; pool filled in {s['warmup_s']} s before the clock" if "warmup_s" in s else ""
            lines.append(f"\n{s['mode']} x{s['agents']}: Amdahl bound {s['amdahl_bound_per_min']}/min (mean command "
                         f"{s['mean_command_s']} s, mean region time {s['mean_region_held_s']} s per command), "
                         f"reached {100 * s['amdahl_fraction']:.0f}%; mean wait for a region {s['mean_region_wait_s']} s{warm}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+")
    args = ap.parse_args()
    parts = [table(json.load(open(f))) for f in args.results]
    if len(parts) > 1:
        parts = [f"`{f}`:\n\n{t}" for f, t in zip(args.results, parts)]
    print("\n\n".join(parts))


if __name__ == "__main__":
    main()
