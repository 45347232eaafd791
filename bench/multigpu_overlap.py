"""The overlapped all-gather + GEMM on two GPUs, isolated and under krex with busy neighbours on both GPUs
(nvidia-h200-x2):

    python bench/multigpu_overlap.py --out /tmp/krex-out/multigpu.json

Goals (issue 14): overlapped >= 1.3x serial where copy ~ compute; the speedup measured under krex with a
neighbour busy on each GPU within 1% of the isolated one. Rounds alternate isolated and krex runs; each run
is examples/multigpu/ag_gemm.py (one process, both GPUs) and, with --symm, ag_gemm_symm.py under torchrun
(PyTorch's fused_all_gather_matmul). NVLink multicast stays off everywhere (the variables below)."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAFE = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def env() -> dict:
    e = dict(os.environ, **SAFE, PYTHONUNBUFFERED="1")
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return e


def krex(*args) -> list:
    return [sys.executable, "-m", "krex_ctl", "run", *args]


def last_json(text: str) -> dict:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"no result in:\n{text[-2000:]}")


def run_once(cmd: list, timeout: float = 300) -> dict:
    out = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return last_json(out.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--symm", action="store_true", help="also the torchrun fused_all_gather_matmul variant")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    shape = ["--m", str(args.m), "--k", str(args.k), "--n", str(args.n)]
    single = [sys.executable, "examples/multigpu/ag_gemm.py", *shape, "--chunks", str(args.chunks)]
    symm = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "examples/multigpu/ag_gemm_symm.py",
            *shape]
    sock = Path(os.environ.get("KREX_SOCKET", "/tmp/krex-gpu/krex.sock"))
    sock.parent.mkdir(parents=True, exist_ok=True)
    ctl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(sock), "--state-file",
                            str(sock) + ".mg.state"], env=env(), stdout=subprocess.DEVNULL,
                           stderr=open(Path(args.out).with_suffix(".controller.log"), "w"))
    time.sleep(2)
    results = {"isolated": [], "krex": [], "isolated_symm": [], "krex_symm": []}
    try:
        for r in range(args.rounds):
            results["isolated"].append(run_once(single + ["--no-region", "--label", f"isolated{r}"]))
            stop = Path(f"/tmp/krex-gpu/mg-stop-{r}")
            stop.unlink(missing_ok=True)
            ready = [Path(f"/tmp/krex-gpu/mg-ready-{r}-{g}") for g in (0, 1)]
            neighbours = [subprocess.Popen(krex("--gpu", str(g), "--", sys.executable, "bench/contender.py", str(stop),
                                                str(ready[g]), "8192"), env=env(), cwd=ROOT,
                                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for g in (0, 1)]
            deadline = time.monotonic() + 120
            while not all(p.exists() for p in ready) and time.monotonic() < deadline:
                time.sleep(0.1)
            try:
                results["krex"].append(run_once(krex("--gpu", "0,1", "--", *single, "--label", f"krex{r}")))
                if args.symm:
                    results["krex_symm"].append(run_once(krex("--gpu", "0,1", "--", *symm, "--label", f"krex{r}")))
            finally:
                stop.write_text("")
                for p in neighbours:
                    p.wait(120)
            if args.symm:
                results["isolated_symm"].append(run_once(symm + ["--no-region", "--label", f"isolated{r}"]))
    finally:
        ctl.terminate()
        ctl.wait(30)

    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else None

    summary = {}
    for key in ("isolated", "krex", "isolated_symm", "krex_symm"):
        if results[key]:
            summary[key] = {"speedup": med([x["speedup"] for x in results[key]]),
                            "median_ms": {k: med([x["median_ms"][k] for x in results[key]])
                                          for k in results[key][0]["median_ms"]}}
            if "bound" in results[key][0]:
                summary[key]["bound"] = med([x["bound"] for x in results[key]])
                summary[key]["overlap_efficiency"] = med([x["overlap_efficiency"] for x in results[key]])
    if "isolated" in summary and "krex" in summary:
        summary["speedup_under_krex_vs_isolated"] = summary["krex"]["speedup"] / summary["isolated"]["speedup"] - 1
        summary["goal_speedup_1_3"] = summary["isolated"]["speedup"] >= 1.3
        summary["goal_within_1pct"] = abs(summary["speedup_under_krex_vs_isolated"]) <= 0.01
    Path(args.out).write_text(json.dumps({"argv": sys.argv, "results": results, "summary": summary}, indent=1))
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
