"""Timing fidelity of a krex region (explicit, or marked by the do_bench hook) against busy neighbours.

Modes, interleaved over --rounds: isolated (no neighbours), naive (3 neighbours, no krex), krex (the
same 3 neighbours and the benchmark all under `krex run`, the benchmark's do_bench inside a region).
Writes raw rows and per-mode medians as JSON (--out). Usage:
    python bench/fidelity_explicit.py --out bench/results/fidelity-explicit.json"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KREX = [sys.executable, "-m", "krex_ctl"]


def start_contenders(n: int, under_krex: bool, tmp: Path, tag: str) -> tuple[list, Path]:
    stop = tmp / f"stop-{tag}"
    procs = []
    for i in range(n):
        ready = tmp / f"ready-{tag}-{i}"
        cmd = [sys.executable, str(ROOT / "bench" / "contender.py"), str(stop), str(ready)]
        procs.append((subprocess.Popen((KREX + ["run", "--"] if under_krex else []) + cmd), ready))
    deadline = time.monotonic() + 120
    while not all(r.exists() for _, r in procs):
        if time.monotonic() > deadline:
            raise SystemExit("contenders did not start")
        time.sleep(0.1)
    return [p for p, _ in procs], stop


def measure(sizes: str, trials: int, under_krex: bool, label: str, report: Path, via: str = "region") -> list[dict]:
    """via region: the script's explicit krex.region; via hook: an unmarked do_bench, KREX_HOOKS=triton."""
    cmd = [sys.executable, str(ROOT / "examples" / "python_region.py"), "--sizes", sizes, "--trials", str(trials),
           "--label", label]
    env = dict(os.environ)
    if under_krex:
        cmd = KREX + ["run", "--report", str(report), "--"] + cmd
    if not under_krex or via == "hook":
        cmd.append("--no-region")
    if under_krex and via == "hook":
        env["KREX_HOOKS"] = "triton"
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    sys.stderr.write(out.stderr)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="4096,8192,16384")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--contenders", type=int, default=3)
    ap.add_argument("--via", choices=("region", "hook"), default="region",
                    help="how the krex mode marks its region: explicit krex.region, or the do_bench hook")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows, reports = [], []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for rnd in range(args.rounds):
            for mode in ("isolated", "naive", "krex"):
                procs, stop = ([], None)
                if mode != "isolated":
                    procs, stop = start_contenders(args.contenders, mode == "krex", tmp, f"{mode}{rnd}")
                rep = tmp / f"report-{rnd}.json"
                try:
                    got = measure(args.sizes, args.trials, mode == "krex", mode, rep, args.via)
                finally:
                    if stop:
                        stop.touch()
                    for p in procs:
                        p.wait(timeout=60)
                for r in got:
                    r.update(mode=mode, round=rnd)
                rows += got
                if mode == "krex" and rep.exists():
                    reports.append(json.loads(rep.read_text()))
                print(f"round {rnd} {mode}: " + ", ".join(f"{r['size']}:{r['median_ms']:.4f}" for r in got), flush=True)
    summary = {}
    for size in sorted({r["size"] for r in rows}):
        iso = statistics.median(r["median_ms"] for r in rows if r["size"] == size and r["mode"] == "isolated")
        summary[size] = {"isolated_ms": iso}
        for mode in ("naive", "krex"):
            m = statistics.median(r["median_ms"] for r in rows if r["size"] == size and r["mode"] == mode)
            summary[size][f"{mode}_ms"] = m
            summary[size][f"{mode}_vs_isolated"] = m / iso
    result = {"summary": summary, "rows": rows, "krex_reports": reports,
              "env": {"python": sys.version, "host": os.uname().nodename, "argv": sys.argv}}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
