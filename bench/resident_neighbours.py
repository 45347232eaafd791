"""Why does one Triton kernel time 1-2% slower with other agents on the node than alone, under every policy?

The 16384/0 Triton candidate (bench/candidate.py) has timed +1.2% to +2.3% (median) against its reference in
most freeze-policy runs (docs/measurements/freeze-policy.md: runs 6, 7, 10-13), while cuBLAS's 16384 matmuls
stayed within about 0.5%. Each agent's command is a process that holds a GPU context and memory, compiles on the
CPU, and runs GPU work between the others' regions. This probe times that candidate under krex (`krex run --
candidate.py --region`) alone and beside neighbours that do one of those things at a time:
  alone     nothing else
  resident  N processes under `krex run`, each holding a CUDA context and --hold-gib of GPU memory, idle
  cpu       N processes spinning on the CPU (not under krex)
  churn     N processes under `krex run` allocating and freeing GPU memory (0.25-2 GiB buffers, up to --hold-gib
            each, torch's cache emptied after every free), no kernels: the GPU's memory is laid out differently
            when the candidate allocates, as on a node where agents' commands start and exit all the time
  gpu       N processes under `krex run` running bf16 16384 matmuls back to back (gated and drained in the
            candidate's regions, stopped under the default freeze policy): the GPU's recent load, as the agents'
            work between regions gives it; the cuBLAS reference shows what that load does to any kernel
The conditions alternate round by round (a drift in the GPU's state falls on all of them). Each command times
candidate and reference --repeat times (do_bench, the power-steady harness); the candidate's ratio to the
reference of the same command is the figure that a clock difference between commands does not move.
Prints one JSON line per command and a summary per condition, and rewrites --out after every command (a run cut
short keeps what finished); needs a krex controller (KREX_SOCKET).
    python bench/resident_neighbours.py --out resident.json
    python bench/resident_neighbours.py --from-log resident.log --out resident.json   (the summary of the JSON
                                                                                       lines a run printed)"""

import argparse
import json
import os
import select
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOLDER = """
import sys, time, torch
x = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda")
x.fill_(1); torch.cuda.synchronize()
print("ready", flush=True)
time.sleep(3600)
"""

CHURN = """
import random, sys, time, torch
limit, held = float(sys.argv[1]) * 2**30, []
def size(): return random.randint(1, 8) * 2**28
held.append(torch.empty(size(), dtype=torch.uint8, device="cuda")); torch.cuda.synchronize()
print("ready", flush=True)
while True:
    if held and (sum(x.numel() for x in held) > limit or random.random() < 0.5):
        held.pop(random.randrange(len(held))); torch.cuda.empty_cache()
    else:
        held.append(torch.empty(size(), dtype=torch.uint8, device="cuda"))
    time.sleep(0.02)
"""

BUSY = """
import torch
a = torch.randn(16384, 16384, device="cuda", dtype=torch.bfloat16)
a @ a; torch.cuda.synchronize()
print("ready", flush=True)
while True:
    a @ a
    torch.cuda.synchronize()
"""

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--size", type=int, default=16384)
ap.add_argument("--variant", type=int, default=0)
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--neighbours", type=int, default=7)
ap.add_argument("--hold-gib", type=float, default=8.0,
                help="GPU memory each resident neighbour holds (a churning one: at most)")
ap.add_argument("--conditions", default="alone,resident,cpu")
ap.add_argument("--repeat", type=int, default=3)
ap.add_argument("--warmup-ms", type=float, default=500.0)
ap.add_argument("--min-reps", type=int, default=100)
ap.add_argument("--out", required=True)
ap.add_argument("--from-log", metavar="LOG",
                help="run nothing: summarise the command lines LOG holds (this script's output) into --out")
args = ap.parse_args()


def summarise(rows: list) -> dict:
    """Per condition: the candidate's and reference's medians, the ratio's median and range, and each against alone."""
    summary = {}
    for cond in dict.fromkeys(r["condition"] for r in rows):
        rs = [r for r in rows if r["condition"] == cond]
        cand = [c for r in rs for c in r["candidate_ms"]]
        ref = [c for r in rs for c in r["reference_ms"]]
        ratio = [c for r in rs for c in r["ratio"]]
        summary[cond] = {"candidate_ms_median": statistics.median(cand), "reference_ms_median": statistics.median(ref),
                         "ratio_median": statistics.median(ratio), "ratio_range": [min(ratio), max(ratio)],
                         "timings": len(cand), "commands": len(rs),
                         "kernel_hashes": sorted({str(r["kernel_hash"]) for r in rs})}
    base = summary.get("alone")
    for s in summary.values():
        if base:
            s["candidate_vs_alone_pct"] = round(100 * (s["candidate_ms_median"] / base["candidate_ms_median"] - 1), 3)
            s["reference_vs_alone_pct"] = round(100 * (s["reference_ms_median"] / base["reference_ms_median"] - 1), 3)
            s["ratio_vs_alone_pct"] = round(100 * (s["ratio_median"] / base["ratio_median"] - 1), 3)
    return summary


def save(rows: list, **extra) -> dict:
    """Write --out whole or not at all (a SIGTERM can come in the middle of a write): a temporary file, renamed."""
    summary = summarise(rows)
    tmp = f"{args.out}.tmp"
    with open(tmp, "w") as f:
        json.dump({"args": None if args.from_log else vars(args), "rows": rows, "summary": summary, **extra}, f,
                  separators=(",", ":"))
    os.replace(tmp, args.out)
    return summary


if args.from_log:
    try:
        text = Path(args.from_log).read_text()
    except OSError as e:
        sys.exit(f"resident_neighbours: cannot read {args.from_log}: {e.strerror}")
    rows, broken = [], 0
    for ln in text.splitlines():
        if ln.startswith('{"round"'):
            try:
                rows.append(json.loads(ln))
            except json.JSONDecodeError:     # the line being written when the run was stopped
                broken += 1
    if not rows:
        sys.exit(f"resident_neighbours: {args.from_log} holds no command lines")
    if broken:
        print(f"resident_neighbours: {broken} command line(s) cut short, left out", file=sys.stderr)
    # the run's own options are not in the log ("args": null); its rows say their conditions and rounds
    for cond, s in save(rows, from_log=args.from_log, lines_left_out=broken).items():
        print(cond, json.dumps(s))
    sys.exit(0)
if not os.environ.get("KREX_SOCKET"):
    sys.exit("resident_neighbours: KREX_SOCKET is not set (start a krex controller first)")
KREX = [sys.executable, "-m", "krex_ctl", "run", "--quiet", "--"]
signal.signal(signal.SIGTERM, lambda *_: sys.exit("resident_neighbours: terminated"))   # the finally stops them


def start(cond: str, procs: list) -> None:
    """Start cond's neighbours into procs (the caller stops them, also when this fails) and wait until every
    process holding memory says it is ready (60 s each at most)."""
    for _ in range(args.neighbours if cond != "alone" else 0):
        if cond in ("resident", "churn", "gpu"):
            script = {"resident": HOLDER, "churn": CHURN, "gpu": BUSY}[cond]
            procs.append(subprocess.Popen(KREX + [sys.executable, "-c", script, str(args.hold_gib)],
                                          stdout=subprocess.PIPE, text=True))
        elif cond == "cpu":
            procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        else:
            sys.exit(f"resident_neighbours: unknown condition {cond}")
    for p in procs:
        if p.stdout is None:
            continue
        ready, _, _ = select.select([p.stdout], [], [], 60.0)
        if not ready or p.stdout.readline().strip() != "ready":
            sys.exit(f"resident_neighbours: a {cond} neighbour did not start (exit {p.poll()})")


def stop(procs: list) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


rows = []
conds = args.conditions.split(",")
for rnd in range(args.rounds):
    for cond in conds:
        procs: list = []
        try:
            start(cond, procs)
            t0 = time.monotonic()
            out = subprocess.run(KREX + [sys.executable, str(ROOT / "bench" / "candidate.py"), "--size",
                                         str(args.size), "--variant", str(args.variant), "--nonce", str(1000 + rnd),
                                         "--region", "--repeat", str(args.repeat), "--warmup-ms",
                                         str(args.warmup_ms), "--min-reps", str(args.min_reps), "--probe"],
                                 capture_output=True, text=True, timeout=300)
        finally:
            stop(procs)
        line = next((ln for ln in reversed(out.stdout.splitlines()) if ln.startswith("{")), None)
        if out.returncode != 0 or line is None:
            print(out.stderr[-2000:], file=sys.stderr)
            sys.exit(f"resident_neighbours: the candidate failed ({out.returncode}) in round {rnd}, {cond}")
        res = json.loads(line)
        cand = res.get("candidate_all_ms") or [res["candidate_ms"]]
        ref = res.get("reference_all_ms") or [res["reference_ms"]]
        if len(cand) != len(ref):
            sys.exit(f"resident_neighbours: {len(cand)} candidate timings against {len(ref)} reference ones")
        row = {"round": rnd, "condition": cond, "wall_s": round(time.monotonic() - t0, 2), "candidate_ms": cand,
               "reference_ms": ref, "ratio": [c / r for c, r in zip(cand, ref)],
               **{k: res.get(k) for k in ("kernel_hash", "cudagraph_ms", "back_to_back_ms", "launch_us", "cpus")}}
        rows.append(row)
        print(json.dumps(row), flush=True)
        save(rows)

for cond, s in save(rows).items():
    print(cond, json.dumps(s), flush=True)
