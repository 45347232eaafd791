"""Is a kernel of bench/candidate.py stable enough for a fidelity run: does it take one time in every process, or
levels that move between processes (a 16384 matmul at the power cap: docs/measurements/freeze-policy.md)?

Per kernel of --kernels ([OP@]SIZE/VARIANT, as a --mix names them, without weights), --procs processes one after
another, alone on the GPU (no krex), each timing candidate and reference --repeat times with the power-steady
harness (500 ms warm-up, >= 100 repetitions). Per kernel and kind: the median, the spread of the processes'
medians (max / min - 1, %), the largest spread within one process, and the p95 of |timing / the other processes'
median - 1| (%): what a floor from two isolated passes would see. A failed command is kept with its stderr's tail
and the run goes on; the exit status is 1 when any failed.
    python3 tests/gpu/stability.py --kernels sum@128/0,sum@1024/1 --procs 2 --out stability.json"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
from throughput import BUCKETS, OPS, bucket, gib, p95, parse_size, size_ok, spec_of, timings  # noqa: E402


def parse_kernels(text: str, ap) -> list:
    out = []
    for item in filter(None, text.split(",")):
        size, slash, variant = item.partition("/")
        try:
            op, tok, _ = parse_size(size)
            spec = spec_of(tok, int(variant))
        except ValueError:
            ap.error(f"--kernels: [OP@]SIZE/VARIANT,..., not {item!r}")
        if not slash or not size_ok(op, spec["size"]) or not 0 <= spec["variant"] <= 3 or ("@" in size and op not in OPS):
            ap.error(f"--kernels: [OP@]SIZE/VARIANT,... (OP sum, a sum's SIZE 1-2048 or a multiple of 2048, "
                     f"variants 0-3), not {item!r}")
        out.append((item, spec))
    if not out:
        ap.error("--kernels: none given")
    return out


def summarise(name: str, rows: list) -> dict:
    out = {"kernel": name, "processes": len(rows)}
    for kind in ("candidate", "reference"):
        per = [ts for ts in (timings(r, kind) for r in rows) if ts]
        if not per:
            continue
        meds = [statistics.median(ts) for ts in per]
        dev = []          # each timing against the median of the other processes' timings
        for i, ts in enumerate(per):
            others = [t for j, o in enumerate(per) if j != i for t in o]
            if others:
                m = statistics.median(others)
                dev += [abs(t / m - 1) * 100 for t in ts]
        allt = [t for ts in per for t in ts]
        out[kind] = {"median_ms": round(statistics.median(allt), 4), "bucket": bucket(statistics.median(allt)),
                     "process_medians_ms": [round(m, 4) for m in meds],
                     "across_pct": round((max(meds) / min(meds) - 1) * 100, 3),
                     "within_pct": round(max((max(ts) / min(ts) - 1) * 100 for ts in per), 3),
                     "p95_vs_others_pct": round(p95(dev), 3) if dev else None, "timings": len(allt)}
    return out


HOLDER = """
import sys, torch
sizes, held, total = [64, 256, 128, 512], [], 0
while total < GIB * 1024:
    n = sizes[len(held) % 4]
    held.append(torch.empty(n << 20, dtype=torch.uint8, device="cuda"))
    total += n
del held[::2]
torch.cuda.synchronize()
torch.cuda.empty_cache()            # the freed pieces back to the driver: holes between the held ones
print("ready", sum(t.numel() for t in held) >> 20, total - (sum(t.numel() for t in held) >> 20), flush=True)
sys.stdin.read()
"""


def start_holder(gib: float):
    """A process holding GPU memory in pieces with holes between them, until its stdin closes (--hold-seeded's
    holders are bench/candidate.py --holder-gib's, each command's own)."""
    p = subprocess.Popen([sys.executable, "-c", HOLDER.replace("GIB", repr(gib))],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("ready"):
        p.kill()
        raise SystemExit(f"stability: the memory holder did not start ({line.strip()!r})")
    _, held, holes = line.split()
    print(f"holder: {held} MiB held in pieces, {holes} MiB given back between them", flush=True)
    return p


def stop_holder(p) -> None:
    p.stdin.close()                    # the holder ends when its stdin does
    p.wait(timeout=60)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernels", default="sum@128/0,sum@128/1,sum@1024/0,sum@1024/1,sum@8192/0,sum@8192/1,"
                                          "sum@49152/0,sum@49152/1")
    ap.add_argument("--procs", type=int, default=2, help="processes per kernel, one after another")
    ap.add_argument("--repeat", type=int, default=2, help="timings per kind per process")
    ap.add_argument("--deadline", type=float, default=0, help="> 0: start no process after this many seconds")
    ap.add_argument("--timer", choices=("events", "graph"), default="events", help="bench/candidate.py --timer")
    ap.add_argument("--hold-gib", type=float, default=0,
                    help="> 0: first a holder process takes this much GPU memory in pieces of 64, 256, 128 and 512 "
                         "MiB in turn and gives the 64 and 128 MiB ones back, the rest held until the end: the kernels' inputs land between other "
                         "processes' memory, as on a GPU shared by many (does where they land move a time?)")
    ap.add_argument("--hold-seeded", action="store_true",
                    help="with --hold-gib: a new holder for each command, bench/candidate.py --holder-gib G (its "
                         "pieces, 32-512 MiB, and the half it frees drawn with the command's nonce as the seed, "
                         "cuda-python): every process's inputs land in another pattern (do the processes then take "
                         "levels?); stability run 3 had the same draws in a torch process started before the command")
    ap.add_argument("--scatter-gib", type=gib, default=0,
                    help="> 0: bench/candidate.py --scatter-gib G in every process: each places its own inputs "
                         "between memory it takes and half gives back (seeded by its nonce), without a holder")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    kernels = parse_kernels(args.kernels, ap)
    if args.procs < 1 or args.repeat < 1:
        ap.error("--procs and --repeat: 1 or more")
    if args.hold_seeded and args.hold_gib <= 0:
        ap.error("--hold-seeded needs --hold-gib G")
    holder = start_holder(args.hold_gib) if args.hold_gib > 0 and not args.hold_seeded else None
    t0, rows, failed = time.monotonic(), {}, 0
    for p in range(args.procs):          # a round of every kernel, then the next: not one kernel's processes in a row
        for i, (name, spec) in enumerate(kernels):
            if args.deadline and time.monotonic() - t0 > args.deadline:
                break
            nonce = 7000 + 100 * p + i
            cmd = [sys.executable, str(ROOT / "bench" / "candidate.py"), "--size", str(spec["size"]),
                   "--variant", str(spec["variant"]), "--nonce", str(nonce), "--repeat", str(args.repeat),
                   "--warmup-ms", "500", "--min-reps", "100", "--timer", args.timer] + \
                (["--op", spec["op"]] if spec.get("op") else []) + \
                (["--scatter-gib", str(args.scatter_gib)] if args.scatter_gib else []) + \
                (["--holder-gib", str(args.hold_gib)] if args.hold_seeded else [])
            t = time.monotonic()
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
                out, err, rc = r.stdout, r.stderr, r.returncode
            except subprocess.TimeoutExpired as e:         # kept as a failed command; the run goes on
                text = lambda b: b.decode(errors="replace") if isinstance(b, bytes) else (b or "")  # noqa: E731
                out, err, rc = text(e.stdout), text(e.stderr) + "\nstability: killed after 300 s", 124
            lines = [x for x in out.splitlines() if x.startswith("{")]
            row = json.loads(lines[-1]) if lines else {}
            row.update(kernel=name, process=p, exit=rc, wall_s=round(time.monotonic() - t, 2))
            if rc or not lines:
                failed += 1
                row["stderr"] = err[-1500:]
            rows.setdefault(name, []).append(row)
            print(json.dumps({k: row.get(k) for k in ("kernel", "process", "exit", "wall_s", "candidate_all_ms",
                                                      "reference_all_ms", "correct", "holder_mib")}), flush=True)
    if holder is not None:
        stop_holder(holder)
    summary = [summarise(name, [r for r in rs if r.get("exit") == 0 and "candidate_ms" in r])
               for name, rs in rows.items()]
    for s in summary:
        print("summary " + json.dumps(s), flush=True)
    Path(args.out).write_text(json.dumps({"argv": sys.argv, "hold_gib": args.hold_gib, "hold_seeded": args.hold_seeded, "scatter_gib": args.scatter_gib, "buckets": [b for b, _, _ in BUCKETS], "failed": failed,
                                          "summary": summary, "rows": rows}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
