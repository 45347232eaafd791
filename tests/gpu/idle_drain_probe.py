"""tests/gpu/idle_drain_probe.py: which siblings does the busy freeze policy stop on a real GPU, with and without
CPU load on the host? (The drain's idle answer, shim/drain.c: a process that submitted nothing since its last
context-wide synchronize answers with no GPU time, however long its synchronize took.)

    python3 tests/gpu/idle_drain_probe.py --out $OUT/idle-drain.json [--old-shim PATH] [--regions 12] [--hogs 32]

For each shim (this tree's build/libkrex.so, and PATH when given) and each load (none, then --hogs busy-looping
processes outside krex), a fresh controller (the default policy, busy) and four torch siblings under `krex run`:
  busy      bf16 8192 matmuls in batches of four, each batch waited for on its stream (work in flight at most drains)
  synced    a few matmuls, torch.cuda.synchronize() (context-wide), then asleep
  unsynced  a few matmuls, waited for on their stream only, then asleep (busy until a drain synchronizes it)
  never     a context and its memory (torch.empty), no kernel, asleep
then an owner under `krex run` takes --regions regions one after the other and, inside each, reads the siblings'
process states (T: stopped). The JSON gives, per case, how many regions found each sibling stopped, and the
owner's regions as its report records them (frozen, exclusive, taints)."""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_controller import RUN, controller, keep_log, proc_state, wait_or_kill  # noqa: E402
KINDS = ("busy", "synced", "unsynced", "never")
HOG = "while True: pass  # krex-idle-drain-hog"     # the script's pkill names it


def sibling(kind: str, ready: str) -> int:
    import torch
    if kind == "never":                   # memory, no kernel: torch.empty launches nothing
        a = b = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    else:
        a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
        torch.cuda.synchronize()
    if kind in ("synced", "unsynced"):
        for _ in range(4):
            torch.mm(a, b)
        if kind == "synced":
            torch.cuda.synchronize()
        else:
            torch.cuda.current_stream().synchronize()
    Path(ready).write_text(str(os.getpid()))
    end = time.monotonic() + 600
    while time.monotonic() < end and not Path(ready + ".stop").exists():
        if kind == "busy":
            for _ in range(4):
                torch.mm(a, b)
            torch.cuda.current_stream().synchronize()
        else:
            time.sleep(0.05)
    return 0


def owner(pids: str, regions: int, out: str) -> int:
    import torch
    import krex
    who = dict(kv.split("=") for kv in pids.split(","))
    x = torch.randn(1 << 20, device="cuda")
    torch.cuda.synchronize()
    seen = []
    for i in range(regions):
        with krex.region("idle-drain"):
            states = {kind: proc_state(pid) for kind, pid in who.items()}
            x.sum().item()
        seen.append(states)
        time.sleep(0.3)
    Path(out).write_text(json.dumps(seen))
    return 0


def wait_file(path: Path, timeout: float, procs) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text():
            return True
        if any(p.poll() is not None for p in procs):
            return False
        time.sleep(0.1)
    return False


def case(shim: str, hogs: int, regions: int, tmp: Path) -> dict:
    with controller(tmp, shim) as env:
        if env is None:
            return {"error": "the controller did not start within 30 s; see its log"}
        return case_with(env, hogs, regions, tmp)


def case_with(env: dict, hogs: int, regions: int, tmp: Path) -> dict:
    hog_procs, sibs = [], {}
    try:
        with open(tmp / "siblings.log", "ab") as log:
            for kind in KINDS:
                ready = tmp / f"{kind}.ready"
                sibs[kind] = (subprocess.Popen(RUN + ["--", sys.executable, __file__, "sibling", "--kind", kind,
                                                      "--ready", str(ready)], env=env, stdout=log, stderr=log), ready)
        pids = {}
        for kind, (p, ready) in sibs.items():
            if not wait_file(ready, 120, [p]):
                return {"error": f"sibling {kind} did not get ready (rc {p.poll()}); see siblings.log"}
            pids[kind] = int(ready.read_text())
        hog_procs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(hogs)]
        time.sleep(2 if hogs else 0.5)
        report, seen = tmp / "owner-report.json", tmp / "owner-seen.json"
        try:
            o = subprocess.run(RUN + ["--report", str(report), "--", sys.executable, __file__, "owner", "--pids",
                                      ",".join(f"{k}={v}" for k, v in pids.items()), "--regions", str(regions),
                                      "--out", str(seen)], env=env, capture_output=True, text=True, timeout=300)
        except subprocess.TimeoutExpired:
            return {"error": "the owner did not finish within 300 s"}
        if o.returncode != 0:
            return {"error": f"owner rc {o.returncode}: {o.stderr[-2000:]}"}
        states = json.loads(seen.read_text())
        regs = json.loads(report.read_text()).get("regions", [])
        return {
            "stopped_regions": {k: sum(1 for s in states if s.get(k) in ("T", "t")) for k in KINDS},
            "first_region_stopped": [k for k in KINDS if states and states[0].get(k) in ("T", "t")],
            "regions": len(states),
            "report_frozen": [r.get("frozen") for r in regs],
            "report_exclusive": sum(1 for r in regs if r.get("exclusive")),
            "report_taints": sorted({t for r in regs for t in (r.get("taints") or [])}),
            "states": states,
        }
    finally:
        for p in hog_procs:
            p.kill()
        for p in hog_procs:
            p.wait()
        for kind, (p, ready) in sibs.items():
            Path(str(ready) + ".stop").touch()
        for kind, (p, ready) in sibs.items():
            wait_or_kill(p)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd")
    s = sub.add_parser("sibling")
    s.add_argument("--kind", choices=KINDS, required=True)
    s.add_argument("--ready", required=True)
    o = sub.add_parser("owner")
    o.add_argument("--pids", required=True)
    o.add_argument("--regions", type=int, default=12)
    o.add_argument("--out", required=True)
    ap.add_argument("--out", default="idle-drain.json")
    ap.add_argument("--old-shim", default="", help="an earlier libkrex.so to compare (KREX_SHIM)")
    ap.add_argument("--regions", type=int, default=12)
    ap.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 8))
    ap.add_argument("--logs", default="", help="keep each case's controller log in this directory")
    a = ap.parse_args()
    if a.cmd == "sibling":
        return sibling(a.kind, a.ready)
    if a.cmd == "owner":
        return owner(a.pids, a.regions, a.out)
    result = {"argv": sys.argv, "hogs": a.hogs, "cases": []}
    shims = [("this tree", "")] + ([("old", a.old_shim)] if a.old_shim else [])
    for name, shim in shims:
        for hogs in (0, a.hogs):
            with tempfile.TemporaryDirectory(prefix="krex-idle-drain-") as d:
                t0 = time.monotonic()
                r = case(shim, hogs, a.regions, Path(d))
                r.update(shim=name, hogs=hogs, seconds=round(time.monotonic() - t0, 1))
                keep_log(Path(d), a.logs, f"{name}-hogs{hogs}")
            result["cases"].append(r)
            print(json.dumps({k: v for k, v in r.items() if k != "states"}), flush=True)
            Path(a.out).write_text(json.dumps(result, indent=1))
    return 0 if all("error" not in c for c in result["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
