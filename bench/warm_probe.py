"""Why a kernel times differently in a warm worker than in a cold command: the same candidate
(bench/candidate.py --probe) alternately cold (`krex run --cold`), warm and, with --churn, cold after
allocating, freeing and emptying GPU memory first, one at a time, each printing
its do_bench median, CPU cost per launch, gap-free and CUDA-graph timings, compiled kernel hash, and its
threads (all of which a region pins to the reserved cores) and how many of them burn CPU while it sleeps.
    python bench/warm_probe.py --size 4096 --variant 0 --pairs 3 --out bench/results/warm-probe-h200.json"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from throughput import Controllers, wait_idle  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096)
    ap.add_argument("--variant", type=int, default=0)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--no-cpu-isolation", action="store_true",
                    help="controller without CPU isolation (does pinning the worker's threads cause the shift?)")
    ap.add_argument("--churn", action="store_true",
                    help="also a cold command that first allocates, frees and empties GPU memory (mode 'churn')")
    ap.add_argument("--worker-reuse", type=int, default=None,
                    help="commands per warm worker (the controller's default, 1, gives each command a fresh one)")
    ap.add_argument("--candidate", default=str(ROOT / "bench" / "candidate.py"),
                    help="the candidate command's script (a stand-in for dry runs)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as td:
        extra = (["--no-cpu-isolation"] if args.no_cpu_isolation else []) + \
            (["--worker-reuse", str(args.worker_reuse)] if args.worker_reuse else [])
        ctls = Controllers(Path(td), [("krexwarm", 1)], Path(td), tuple(extra))
        try:
            env, _ = ctls.get("krexwarm", 1)
            modes = ["cold", "warm"] + (["churn"] if args.churn else [])
            for i in range(len(modes) * args.pairs):
                mode = modes[i % len(modes)]
                if mode == "warm":
                    wait_idle(env, 1, 120)
                cmd = [sys.executable, "-m", "krex_ctl", "run"] + (["--cold"] if mode != "warm" else []) + [
                    "--", sys.executable, os.path.abspath(args.candidate), "--size", str(args.size),
                    "--variant", str(args.variant), "--nonce", str(100 + i), "--probe"] + (
                    ["--churn"] if mode == "churn" else [])
                out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
                line = [x for x in out.stdout.splitlines() if x.startswith("{")]
                row = {"mode": mode, "exit": out.returncode, **(json.loads(line[-1]) if line else {"stderr": out.stderr[-1500:]})}
                rows.append(row)
                print(json.dumps(row), flush=True)
        finally:
            ctls.stop()
    Path(args.out).write_text(json.dumps({"argv": sys.argv, "rows": rows, "host": os.uname().nodename}, indent=1))


if __name__ == "__main__":
    main()
