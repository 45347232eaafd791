"""GPU hooks under load: each hooked harness runs under `krex run` with KREX_HOOKS while 3 busy
neighbour commands (also under krex) run; records the regions each produced. Usage:
    python bench/hooks_gpu.py --build build/gpu --out hooks-gpu.json"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HOOKS = ROOT / "tests" / "gpu" / "hooks"
sys.path.insert(0, str(ROOT / "bench"))
from fidelity_explicit import start_contenders  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cases = [
        ("triton", "do_bench + do_bench_cudagraph", [sys.executable, str(HOOKS / "do_bench_matmul.py"), "8192", "3"]),
        ("triton", "triton autotuner", [sys.executable, str(HOOKS / "autotune.py")]),
        ("inductor", "inductor max-autotune", [sys.executable, str(HOOKS / "inductor_autotune.py")]),
        ("cupyx", "cupyx.profiler.benchmark", [sys.executable, str(HOOKS / "cupyx_bench.py")]),
        ("nvtx", "torch.cuda.nvtx", [sys.executable, str(HOOKS / "torch_nvtx.py")]),
        ("nvtx", "C++ nvtx3 harness", [str(Path(args.build) / "nvtx_bench")]),
    ]
    results = []
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        procs, stop = start_contenders(3, True, tmp, "hooks")
        try:
            for i, (hook, label, cmd) in enumerate(cases):
                rep = tmp / f"r{i}.json"
                t0 = time.monotonic()
                out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--report", str(rep), "--"] + cmd,
                                     env=dict(os.environ, KREX_HOOKS=hook), capture_output=True, text=True,
                                     timeout=240)
                r = json.loads(rep.read_text()) if rep.exists() else {}
                regions = r.get("regions", [])
                results.append({
                    "hook": hook, "case": label, "exit_code": out.returncode, "wall_s": round(time.monotonic() - t0, 2),
                    "regions": len(regions), "region_names": sorted({x["name"] for x in regions}),
                    "frozen_per_region": [x["frozen"] for x in regions][:20],
                    "held_ms": [round((x["ended_ns"] - x["granted_ns"]) / 1e6, 2) for x in regions][:20],
                    "stdout": out.stdout[-3000:], "stderr": out.stderr[-3000:]})
                print(f"{label:<32} exit {out.returncode} regions {len(regions)} {results[-1]['region_names']}", flush=True)
        finally:
            stop.touch()
            for p in procs:
                p.wait(timeout=60)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
