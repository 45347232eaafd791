"""Where does concurrency lose to serial on this GPU? A search over bench/overlap_proxy.py's s-* cases (GEMM
backend incl. a persistent Triton GEMM, sizes, copy CTAs and copies, and three orders: copy first, GEMMs first,
a pipeline of buckets), each timed without krex or any control: alone, serial and concurrent.

    python bench/overlap_search.py --out $OUT [--cases s-a,s-b] [--reps 10] [--confirm 1.02]

Every case runs once (one process, the cases in turn); the cases whose concurrent total is above serial by
more than --confirm are timed again in a second process, and a case is a loss only when both processes say so
(the same program in two processes differs by a few percent on the H200: docs/measurements/overlap-proxy.md).
Writes OUT/overlap-search.json (every case's numbers and the confirmed losses, worst first) and prints on its
last line the losses to hand on, comma-separated, and the guard epoch for them (the worst loss's communication
launches per repetition; only the losses with that count): what tests/gpu/overlap_search_h200.sh gives
bench/overlap_proxy.py --cases and --guard-epoch."""

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import overlap_proxy as op  # noqa: E402



def run_worker(cases: list, reps: int, result: Path, log: Path, timeout: float) -> list:
    """overlap_proxy's worker over cases in one plain process (no krex); its rows, [] when it failed."""
    cmd = [sys.executable, str(ROOT / "bench" / "overlap_proxy.py"), "--worker", "--cases", ",".join(cases),
           "--reps", str(reps), "--result", str(result), "--modes", ",".join(op.ALL_MODES)]
    env = {**os.environ, **op.SAFE}
    with open(log, "wb") as f:
        try:
            p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
        except subprocess.TimeoutExpired:
            return []
    if p.returncode != 0 or not result.exists():
        return []
    return json.loads(result.read_text())["cases"]


def ratio(row: dict) -> float | None:
    """Concurrent total over serial total (> 1: concurrency loses), None for a failed case."""
    if "error" in row or "serial" not in row or "concurrent" not in row:
        return None
    return row["concurrent"]["total_ms"] / row["serial"]["total_ms"]


def summarize(first: list, second: list, confirm: float) -> dict:
    again = {r["case"]: r for r in second}
    rows = []
    for r in first:
        x = ratio(r)
        y = ratio(again[r["case"]]) if r["case"] in again else None
        row = {"case": r["case"], "concurrent_vs_serial": None if x is None else round(x, 4),
               "again": None if y is None else round(y, 4), "error": r.get("error")}
        if x is not None:
            row.update(serial_ms=round(r["serial"]["total_ms"], 3),
                       concurrent_ms=round(r["concurrent"]["total_ms"], 3),
                       comm_alone_ms=round(r["comm"]["comm_ms"], 3), compute_alone_ms=round(r["compute"]["compute_ms"], 3),
                       comm_stretch=round(r["concurrent"]["comm_ms"] / r["comm"]["comm_ms"], 3),
                       correct=bool(r.get("copy_ok") and r.get("gemm_ok") and r.get("ring_ok")),
                       # repetitions whose enqueueing outlasted the GPU's spin: the host may be in their span
                       overruns=sum(r[m].get("overruns", 0) for m in op.ALL_MODES))
        row["loss"] = bool(x and y and x > confirm and y > confirm and row.get("correct"))
        row["launches"] = r.get("launches")       # the worker's count (Case.chunks): the guard epoch to hand on
        rows.append(row)
    losses = sorted((r for r in rows if r["loss"]), key=lambda r: -min(r["concurrent_vs_serial"], r["again"]))
    # what overlap_proxy's guard needs: one epoch = one repetition's communication launches, one value per process,
    # so the losses handed on are those with the worst one's launch count
    epoch = losses[0]["launches"] if losses else None
    return {"confirm": confirm, "cases": rows, "losses": [r["case"] for r in losses], "guard_epoch": epoch,
            "handed_on": [r["case"] for r in losses if r["launches"] == epoch],
            "failed": [r["case"] for r in rows if r["concurrent_vs_serial"] is None]}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/krex-out"))
    ap.add_argument("--cases", default=",".join(op.SEARCH), help="comma list of overlap_proxy cases (default: s-*)")
    ap.add_argument("--reps", type=int, default=10, help="timed repetitions per measurement (the median is kept)")
    ap.add_argument("--confirm", type=float, default=1.02,
                    help="a case is timed again when concurrent / serial is above this, and a loss when both are")
    ap.add_argument("--timeout", type=float, default=400.0, help="seconds for each worker process")
    args = ap.parse_args(argv)
    cases = args.cases.split(",")
    bad = [c for c in cases if c not in op.ALL_CASES]
    if bad:
        ap.error(f"unknown case {', '.join(bad)}")
    if args.reps < 1 or args.confirm <= 0:
        ap.error("--reps must be >= 1 and --confirm > 0")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    first = run_worker(cases, args.reps, out / "search-1.json", out / "search-1.log", args.timeout)
    if not first:
        raise SystemExit(f"overlap_search: the worker failed (see {out / 'search-1.log'})")
    suspects = [r["case"] for r in first if (ratio(r) or 0) > args.confirm]
    second = run_worker(suspects, args.reps, out / "search-2.json", out / "search-2.log", args.timeout) \
        if suspects else []
    summary = summarize(first, second, args.confirm)
    summary["seconds"] = round(time.monotonic() - t0, 1)
    summary["confirm_failed"] = bool(suspects) and not second   # suspects that could not be timed again
    summary["overruns"] = sum(r.get("overruns", 0) for r in summary["cases"])
    (out / "overlap-search.json").write_text(json.dumps(summary, indent=1))
    for r in sorted(summary["cases"], key=lambda r: -(r["concurrent_vs_serial"] or 0)):
        print(f"{r['case']:40s} {r['concurrent_vs_serial']} {r['again']} "
              f"serial {r.get('serial_ms')} concurrent {r.get('concurrent_ms')} stretch {r.get('comm_stretch')}"
              + (f" ERROR {r['error']}" if r.get("error") else ""))
    if summary["overruns"]:
        print(f"{summary['overruns']} repetitions were enqueued past the GPU's spin (the host may be in their span)")
    print(f"losses: {len(summary['losses'])}; handed on with --guard-epoch {summary['guard_epoch']}:")
    print(",".join(summary["handed_on"]), summary["guard_epoch"] or "")
    if summary["confirm_failed"]:
        raise SystemExit(f"overlap_search: {len(suspects)} suspected losses could not be timed again (see "
                         f"{out / 'search-2.log'}): whether they are losses is not known")


if __name__ == "__main__":
    main()
