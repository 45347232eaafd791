"""Processes of the job outside any block beside the job's region, on a real GPU (KREX_MSG_BESIDE, the kin drain).

    python3 tests/gpu/beside_probe.py --out beside.json          (on the GPU machine, after `make shim`)

`krex run` commands, each with a report: `alone`, a timing process alone (its regions: exclusive);
`sibling`, the same timing process beside a sibling process of the same command (`sh -c "SIBLING & TIMER;
wait"`) that runs torch matmuls outside any block the whole time (its regions: shared_gpu, not exclusive);
`child`, the timing process starting that load as its own child inside each region while it times matmuls of
its own (a parent timing beside a child's kernels: shared_gpu, unless the child's first GPU activity, its context's
creation, came after the parent's synchronize ended its timing: exclusive then, since protocol 5); `waits`, the parent starting the load as its
child inside each region and launching nothing itself (the documented pattern of a process and the child it
times: exclusive); `queued`, a sibling that queues ~200 matmuls just before each region and launches nothing
during it (drained at the region's start: exclusive, the timing as alone's, the record's kin_busy_us the wait).
Prints one line per case and writes every region's taints. CASES=queued,waits,alone: only those (`alone` is the
reference for `queued`'s timings: keep it in the same call)."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

LOAD = """
import sys, time, torch
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
end = time.monotonic() + float(sys.argv[1])
n = 0
while time.monotonic() < end:
    for _ in range(8):
        a @ a
    torch.cuda.synchronize()
    n += 8
print("load", n, "matmuls", flush=True)
"""

QUEUE = """
import pathlib, sys, time, torch
flag = sys.argv[1]
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
a @ a
torch.cuda.synchronize()
for i in range(4):
    while not pathlib.Path(f"{flag}.go{i}").exists():
        time.sleep(0.002)
    for _ in range(200):
        a @ a                        # queued in a few ms, hundreds of ms of GPU work
    pathlib.Path(f"{flag}.q{i}").touch()
    torch.cuda.synchronize()
print("queued 4 x 200 matmuls", flush=True)
"""

TIMER = """
import json, pathlib, subprocess, sys, time, torch, krex
mode, load, flag = sys.argv[1], sys.argv[2], sys.argv[3]
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    a @ a
torch.cuda.synchronize()
time.sleep(1.5)                      # the sibling's load is under way by now
out = []
for i in range(4):
    if mode == "queued":             # the sibling queues its work, then the region starts at once
        pathlib.Path(f"{flag}.go{i}").touch()
        while not pathlib.Path(f"{flag}.q{i}").exists():
            time.sleep(0.001)
    t0 = time.monotonic()
    with krex.region(f"t{i}") as r:
        waited = time.monotonic() - t0
        child = subprocess.Popen([sys.executable, load, "0.3"]) if mode in ("child", "waits") else None
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(20 if mode != "waits" else 0):
            a @ a
        e.record()
        torch.cuda.synchronize()
        if child:
            child.wait()
    out.append({"ms": s.elapsed_time(e) / 20, "exclusive": r.exclusive, "taints": r.taints,
                "grant_wait_s": round(waited, 4)})
    time.sleep(0.2)
print("REGIONS " + json.dumps(out), flush=True)
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    td = Path(tempfile.mkdtemp(prefix="beside-"))
    (td / "load.py").write_text(LOAD)
    (td / "timer.py").write_text(TIMER)
    (td / "queuer.py").write_text(QUEUE)   # not queue.py: it would shadow the stdlib's queue (sys.path[0])
    py, load, timer, queue, flag = (sys.executable, str(td / "load.py"), str(td / "timer.py"), str(td / "queuer.py"),
                                    str(td / "flag"))
    cases = {"queued": ["sh", "-c", f"'{py}' '{queue}' '{flag}' & '{py}' '{timer}' queued '{load}' '{flag}'; wait"],
             "waits": [py, timer, "waits", load, flag],
             "alone": [py, timer, "alone", load, flag],
             "sibling": ["sh", "-c", f"'{py}' '{load}' 12 & '{py}' '{timer}' sibling '{load}' '{flag}'; wait"],
             "child": [py, timer, "child", load, flag]}
    only = [c for c in os.environ.get("CASES", "").split(",") if c]
    cases = {k: v for k, v in cases.items() if not only or k in only}
    result = {}
    for name, cmd in cases.items():
        rep = td / f"{name}.json"
        p = subprocess.run([py, "-m", "krex_ctl", "run", "--report", str(rep), "--"] + cmd, capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"))
        lines = [x for x in p.stdout.splitlines() if x.startswith("REGIONS ")]
        regions = json.loads(lines[-1][8:]) if lines else []
        report = json.loads(rep.read_text()) if rep.exists() else {}
        result[name] = {"exit": p.returncode, "regions": regions, "stderr_tail": p.stderr[-1500:],
                        "report_regions": [{k: r.get(k) for k in ("name", "exclusive", "taints", "pids", "kin_busy_us",
                                                                  "others_busy_us", "drain_ns")}
                                           for r in report.get("regions", [])]}
        kin = [r.get("kin_busy_us") or 0 for r in result[name]["report_regions"]]
        print(f"{name}: exit {p.returncode}; regions (exclusive, taints, ms, grant wait s): "
              + "; ".join(f"{r['exclusive']} {','.join(r['taints']) or '-'} {r['ms']:.3f} {r['grant_wait_s']}"
                          for r in regions) + f"; kin_busy_us {kin}")
        print("  " + (p.stderr.strip().splitlines() or [""])[-1])
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
