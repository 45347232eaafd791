"""Dispatch latency of a Python command that imports torch: cold (`krex run --cold`) vs a warm worker.
    python bench/warm_vs_cold.py --out bench/results/warm-vs-cold-cpu.json [--repeats 7] [--concurrent 8]
Runs its own controller with --warm-workers; alternates cold and warm runs; with --concurrent N also
starts N commands at once each way (node-serialized context creation shows there on a GPU)."""

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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from krex_ctl.embedded import answers  # noqa: E402
from throughput import wait_idle  # noqa: E402

SCRIPT = ("import torch\nready = torch.cuda.is_initialized()\n"
          "x = torch.ones(1024, device='cuda' if torch.cuda.is_available() else 'cpu')\n"
          "print(float(x.sum()), 'context_ready' if ready else 'context_new')\n")


ERR = subprocess.DEVNULL        # the commands' stderr (--logs DIR: DIR/warm-vs-cold-commands.log)


def timed(cmd, env) -> float:
    t0 = time.monotonic()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=ERR, timeout=300)
    return time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--concurrent", type=int, default=0)
    ap.add_argument("--logs", default=None, help="directory for the controller's and the commands' logs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    global ERR
    logs = Path(args.logs) if args.logs else None
    if logs:
        ERR = open(logs / "warm-vs-cold-commands.log", "ab")
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        script = tmp / "bench_import_torch.py"
        script.write_text(SCRIPT)
        env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") or k == "KREX_REGISTRY_DIR"}
        env.update(KREX_SOCKET=str(tmp / "ctl.sock"), XDG_RUNTIME_DIR=str(tmp),
                   PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
        workers = max(1, args.concurrent)
        ctl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(tmp / "ctl.sock"),
                                "--warm-workers", str(workers), "--worker-preload", "torch,triton"], env=env,
                               stderr=open((logs or tmp) / "warm-vs-cold-controller.log", "wb"))
        deadline = time.monotonic() + 30
        while not answers(tmp / "ctl.sock"):
            if ctl.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the controller did not start (see {(logs or tmp) / 'warm-vs-cold-controller.log'})")
            time.sleep(0.05)
        run = [sys.executable, "-m", "krex_ctl", "run", "--"]
        cold_cmd = [sys.executable, "-m", "krex_ctl", "run", "--cold", "--", sys.executable, str(script)]
        warm_cmd = run + [sys.executable, str(script)]
        timed(warm_cmd, env)                               # asks the pool for this environment (runs cold)
        cold, warm = [], []
        for _ in range(args.repeats):
            wait_idle(env, 1, 300)
            warm.append(timed(warm_cmd, env))
            cold.append(timed(cold_cmd, env))
        result = {"script": SCRIPT, "repeats": args.repeats, "cold_s": cold, "warm_s": warm,
                  "cold_median_s": statistics.median(cold), "warm_median_s": statistics.median(warm),
                  "speedup": statistics.median(cold) / statistics.median(warm)}
        if args.concurrent:
            for mode, cmd in (("cold", cold_cmd), ("warm", warm_cmd)):
                if mode == "warm":
                    wait_idle(env, args.concurrent, 300)
                t0 = time.monotonic()
                procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=ERR)
                         for _ in range(args.concurrent)]
                for p in procs:
                    p.wait()
                result[f"concurrent_{mode}_wall_s"] = time.monotonic() - t0
        for mode, cmd in (("cold", cold_cmd), ("warm", warm_cmd)):   # what each path ran on
            if mode == "warm":
                wait_idle(env, 1, 300)
            rep = tmp / f"{mode}.json"
            full = cmd[:4] + ["--report", str(rep)] + cmd[4:]
            out = subprocess.run(full, env=env, capture_output=True, text=True, check=True, timeout=300).stdout.split()
            r = json.loads(rep.read_text())
            result[f"{mode}_check"] = {"output": out, "context_creations": r["context_creations"],
                                       "launches": r["launches"]}
        ctl.terminate()
        ctl.wait(30)
    result["host"] = os.uname().nodename
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if not isinstance(v, list)}, indent=1))


if __name__ == "__main__":
    main()
