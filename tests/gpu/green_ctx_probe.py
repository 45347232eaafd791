"""tests/gpu/green_ctx_probe.py: does another job's region wait for work queued in a green context?

    python3 tests/gpu/green_ctx_probe.py --bin build/gpu/green_probe --out $OUT/green-ctx.json [--old-shim PATH]

For each shim (this tree's, and PATH when given): a controller with its defaults; under `krex run`,
tests/gpu/green_probe.cu queues LAUNCHES spin kernels of MS ms on all SMs in a green context, synchronizes only its
primary context and idles; an owner under `krex run`, set up before, then asks for one region at once and,
inside it, reads the prober's process state. The JSON gives, per shim: when the green kernels began and ended, the region's request, grant and
end (CLOCK_MONOTONIC ns, the report's), how many milliseconds of green work ran inside the region, whether the
prober was stopped, and the region's record (exclusive, frozen, taints)."""

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_controller import ROOT, RUN, controller, keep_log, proc_state, wait_or_kill  # noqa: E402


def owner(go: str, out: str) -> int:
    import torch
    import krex
    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    print("ready", flush=True)
    while not Path(go).exists():
        time.sleep(0.001)
    pid = int(Path(go).read_text())
    with krex.region("green"):
        state = proc_state(pid)
        x.sum().item()
    Path(out).write_text(json.dumps({"state": state}))
    return 0


def case(binary: str, shim: str, launches: int, ms: int, blocks: int, tmp: Path) -> dict:
    with controller(tmp, shim) as env:
        if env is None:
            return {"error": "the controller did not start within 30 s"}
        return case_with(env, binary, launches, ms, blocks, tmp)


def case_with(env: dict, binary: str, launches: int, ms: int, blocks: int, tmp: Path) -> dict:
    stop, prober, own = tmp / "stop", None, None
    report, seen, go = tmp / "owner.json", tmp / "seen.json", tmp / "go"
    try:
        # the owner first, ready to ask for its region the moment the prober has queued its green work
        own = subprocess.Popen(RUN + ["--report", str(report), "--", sys.executable, __file__, "owner", "--go",
                                      str(go), "--out", str(seen)], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
        if own.stdout.readline().strip() != "ready":
            return {"error": "the owner did not get ready"}
        with open(tmp / "prober.log", "ab") as log:
            prober = subprocess.Popen(RUN + ["--", binary, str(launches), str(ms), str(blocks), str(stop)], env=env,
                                      stdout=subprocess.PIPE, stderr=log, text=True)
        idle = prober.stdout.readline().split()
        if not idle or idle[0] != "idle":
            return {"error": f"the prober did not get idle (rc {prober.poll()}); see prober.log"}
        tmp_go = tmp / "go.tmp"
        tmp_go.write_text(idle[5] if len(idle) > 5 else str(prober.pid))   # the prober's own pid, not its wrapper's
        tmp_go.rename(go)
        try:
            _, err = own.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            return {"error": "the owner did not finish within 120 s"}
        if own.returncode != 0:
            return {"error": f"owner rc {own.returncode}: {err[-2000:]}"}
        stop.touch()
        rest, _ = prober.communicate(timeout=60)
        green = next((ln.split() for ln in rest.splitlines() if ln.startswith("green ")), None)
        if green is None:
            return {"error": f"no green line from the prober (rc {prober.returncode}): {rest[-500:]}"}
        g0, g1 = int(green[1]), int(green[2])
        (r,) = json.loads(report.read_text())["regions"]
        inside = max(0, min(g1, r["ended_ns"]) - max(g0, r["granted_ns"])) / 1e6
        return {
            "sms": int(idle[3]) if len(idle) > 3 else None, "idle_ns": int(idle[1]),
            "green_start_ns": g0, "green_end_ns": g1, "green_ms": round((g1 - g0) / 1e6, 1),
            "requested_ns": r["requested_ns"], "granted_ns": r["granted_ns"], "ended_ns": r["ended_ns"],
            "grant_wait_ms": round((r["granted_ns"] - r["requested_ns"]) / 1e6, 1),
            "green_ms_inside_region": round(inside, 1),
            "prober_stopped_in_region": json.loads(seen.read_text())["state"] in ("T", "t"),
            "region": {k: r.get(k) for k in ("exclusive", "clean", "frozen", "taints")},
        }
    finally:
        stop.touch()
        go.touch()          # an owner still waiting for its go goes on (and ends)
        for p in (prober, own):
            if p is not None:
                wait_or_kill(p)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    o = sub.add_parser("owner")
    o.add_argument("--go", required=True)
    o.add_argument("--out", required=True)
    ap.add_argument("--bin", default=str(ROOT / "build" / "gpu" / "green_probe"))
    ap.add_argument("--out", default="green-ctx.json")
    ap.add_argument("--old-shim", default="", help="an earlier libkrex.so to compare (KREX_SHIM)")
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--ms", type=int, default=200)
    ap.add_argument("--blocks", type=int, default=264)
    ap.add_argument("--logs", default="")
    a = ap.parse_args()
    if a.cmd == "owner":
        return owner(a.go, a.out)
    result = {"argv": sys.argv, "cases": []}
    for name, shim in [("this tree", "")] + ([("old", a.old_shim)] if a.old_shim else []):
        with tempfile.TemporaryDirectory(prefix="krex-green-") as d:
            r = case(a.bin, shim, a.launches, a.ms, a.blocks, Path(d))
            r["shim"] = name
            keep_log(Path(d), a.logs, name)
        result["cases"].append(r)
        print(json.dumps(r), flush=True)
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0 if all("error" not in c for c in result["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
