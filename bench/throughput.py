"""Concurrent agent benchmarking on one GPU: throughput against command-granular locking, and the
timing inflation of every measured kernel against its isolated median.

Agents (threads here, each running one candidate command at a time as a separate process:
bench/candidate.py, a Triton matmul variant compiled, checked and timed with do_bench against
torch.mm) work through the same list of candidate specs in each mode:
  isolated  one agent, nothing else on the GPU (the ground truth per kernel; run twice, interleaved,
            for the noise floor)
  naive     N agents at once, no coordination
  cmdlock   N agents, each whole command under an exclusive flock (command-granular exclusivity)
  krex      N agents, each command under `krex run` with KREX_HOOKS=triton (region-granular)
Kernel mix (matmul sizes, fp16): 1024 and 2048 (< 0.1 ms), 4096 (0.1-1 ms), 8192 (1-10 ms),
16384 (> 10 ms), drawn 15/15/25/30/15 %.
    python bench/throughput.py --plan isolated:1,naive:8,cmdlock:8,krex:8,isolated:1 --out results.json"""

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIX = [(1024, 0.15), (2048, 0.15), (4096, 0.25), (8192, 0.30), (16384, 0.15)]
BUCKETS = [("<0.1ms", 0, 0.1), ("0.1-1ms", 0.1, 1), ("1-10ms", 1, 10), (">10ms", 10, 1e9)]


def make_specs(n: int, seed: int) -> list[dict]:
    """Every size once (so every bucket has data), then draws from the mix; shuffled, seeded."""
    rng = random.Random(seed)
    sizes = [s for s, _ in MIX]
    weights = [w for _, w in MIX]
    drawn = sizes[:n] + rng.choices(sizes, weights, k=max(0, n - len(sizes)))
    rng.shuffle(drawn)
    return [{"size": s, "variant": i % 4} for i, s in enumerate(drawn)]


def run_mode(mode: str, agents: int, specs: list, budget_s: float, tmp: Path, nonce_base: int) -> dict:
    todo = list(enumerate(specs))
    rows, lock = [], threading.Lock()
    t_start = time.monotonic()

    def agent(aid: int) -> None:
        while True:
            with lock:
                if not todo or time.monotonic() - t_start > budget_s:
                    return
                idx, spec = todo.pop(0)
            nonce = nonce_base + idx
            cmd = [sys.executable, str(ROOT / "bench" / "candidate.py"), "--size", str(spec["size"]),
                   "--variant", str(spec["variant"]), "--nonce", str(nonce)]
            env = dict(os.environ)
            report = tmp / f"{mode}-{agents}-{idx}.json"
            if mode == "cmdlock":
                cmd = ["flock", str(tmp / "gpu.lock")] + cmd
            elif mode == "krex":
                cmd = [sys.executable, "-m", "krex_ctl", "run", "--report", str(report), "--"] + cmd
                env["KREX_HOOKS"] = "triton"
            t0 = time.monotonic()
            out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
            t1 = time.monotonic()
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            row = {"idx": idx, "agent": aid, **spec, "exit": out.returncode, "start_s": t0 - t_start,
                   "wall_s": t1 - t0}
            if lines:
                row.update(json.loads(lines[-1]))
            else:
                row["stderr"] = out.stderr[-2000:]
            if report.exists():
                rep = json.loads(report.read_text())
                regs = rep["regions"]
                row["regions"] = len(regs)
                row["region_held_s"] = sum((r["ended_ns"] - r["granted_ns"]) / 1e9 for r in regs)
                row["region_wait_s"] = sum((r["granted_ns"] - r["requested_ns"]) / 1e9 for r in regs)
                row["drain_s"] = sum(r.get("drain_ns", 0) / 1e9 for r in regs)
                row["gate_wait_s"] = rep["gate_waited_ns"] / 1e9
            with lock:
                rows.append(row)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = max((r["start_s"] + r["wall_s"] for r in rows), default=0.0)
    ok = [r for r in rows if r.get("exit") == 0 and "candidate_ms" in r]
    return {"mode": mode, "agents": agents, "wall_s": wall, "commands": len(ok), "failed": len(rows) - len(ok),
            "commands_per_min": 60 * len(ok) / wall if wall else 0.0, "rows": rows}


def bucket(ms: float) -> str:
    return next(name for name, lo, hi in BUCKETS if lo <= ms < hi)


def p95(xs: list) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))] if xs else float("nan")


def analyse(runs: list) -> dict:
    iso_runs = [r for r in runs if r["mode"] == "isolated"]
    truth: dict = {}
    for r in iso_runs:
        for row in r["rows"]:
            if "candidate_ms" in row:
                for k in ("candidate", "reference"):
                    truth.setdefault((row["size"], row["variant"], k), []).append(row[f"{k}_ms"])
    iso = {key: statistics.median(v) for key, v in truth.items()}
    summary = []
    for r in runs:
        infl: dict = {name: [] for name, _, _ in BUCKETS}
        for row in r["rows"]:
            if "candidate_ms" not in row:
                continue
            for k in ("candidate", "reference"):
                ref = iso.get((row["size"], row["variant"], k))
                if ref:
                    infl[bucket(ref)].append(row[f"{k}_ms"] / ref - 1)
        ok = [row for row in r["rows"] if "candidate_ms" in row]
        s = {"mode": r["mode"], "agents": r["agents"], "commands": r["commands"], "failed": r["failed"],
             "wall_s": round(r["wall_s"], 2), "commands_per_min": round(r["commands_per_min"], 2),
             "p95_inflation": {b: p95(v) for b, v in infl.items()},
             "median_inflation": {b: (statistics.median(v) if v else float("nan")) for b, v in infl.items()},
             "kernels": {b: len(v) for b, v in infl.items()}}
        if r["mode"] == "krex" and ok:
            t_cmd = statistics.mean(row["total_s"] for row in ok)
            held = statistics.mean(row.get("region_held_s", 0) for row in ok)
            iso_t = statistics.mean(row["total_s"] for x in iso_runs for row in x["rows"] if "total_s" in row) \
                if iso_runs else t_cmd
            bound = min(r["agents"] / iso_t, 1 / held) * 60 if held else float("nan")
            s.update(mean_command_s=round(t_cmd, 3), mean_region_held_s=round(held, 3),
                     amdahl_bound_per_min=round(bound, 2), amdahl_fraction=round(r["commands_per_min"] / bound, 3),
                     mean_region_wait_s=round(statistics.mean(row.get("region_wait_s", 0) for row in ok), 3),
                     mean_drain_s=round(statistics.mean(row.get("drain_s", 0) for row in ok), 4))
        summary.append(s)
    base = {s["agents"]: s["commands_per_min"] for s in summary if s["mode"] == "cmdlock"}
    for s in summary:
        ref = base.get(s["agents"]) or (next(iter(base.values())) if base else None)
        s["vs_cmdlock"] = round(s["commands_per_min"] / ref, 3) if ref else None
    return {"summary": summary, "isolated_medians": {f"{k[0]}/{k[1]}/{k[2]}": v for k, v in iso.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", default="isolated:1,naive:8,cmdlock:8,krex:8,krex:4,krex:16,isolated:1")
    ap.add_argument("--specs", type=int, default=16)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--budget", type=float, default=100.0, help="seconds per mode before agents stop taking work")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    specs = make_specs(args.specs, args.seed)
    runs = []
    with tempfile.TemporaryDirectory() as td:
        for i, step in enumerate(args.plan.split(",")):
            mode, agents = step.split(":")
            r = run_mode(mode, int(agents), specs, args.budget, Path(td), nonce_base=1000 * (i + 1))
            runs.append(r)
            print(f"{mode}:{agents}: {r['commands']} commands ({r['failed']} failed) in {r['wall_s']:.1f} s = "
                  f"{r['commands_per_min']:.1f}/min", flush=True)
    result = {"specs": specs, "plan": args.plan, "runs": runs, **analyse(runs),
              "env": {"python": sys.version, "argv": sys.argv}}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))


if __name__ == "__main__":
    main()
