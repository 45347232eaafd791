"""A CPU stand-in for bench/candidate.py (tests/test_bench.py): the same arguments and JSON line, a short
busy loop as "compilation" and two timed loops, each in a region when it runs under `krex run`."""

import argparse
import contextlib
import json
import os
import time

T0 = time.monotonic()
ap = argparse.ArgumentParser()
ap.add_argument("--size", type=int, required=True)
ap.add_argument("--variant", type=int, required=True)
ap.add_argument("--nonce", type=int, required=True)
ap.add_argument("--op", choices=("matmul", "sum"), default="matmul")   # as bench/candidate.py; echoed
ap.add_argument("--probe", action="store_true")     # accepted as bench/candidate.py does; nothing to probe
ap.add_argument("--churn", action="store_true")
ap.add_argument("--repeat", type=int, default=1)   # as bench/candidate.py: every timing in *_all_ms
ap.add_argument("--warmup-ms", type=float, default=25.0)   # as bench/candidate.py; echoed in the JSON line
ap.add_argument("--min-reps", type=int, default=0)
ap.add_argument("--timer", choices=("events", "graph"), default="events")   # as bench/candidate.py; echoed
ap.add_argument("--compiler", choices=("triton", "cuda"), default="triton")   # as bench/candidate.py; echoed
ap.add_argument("--scatter-gib", type=float, default=0)   # as bench/candidate.py; echoed in "harness"
ap.add_argument("--holder-gib", type=float, default=0)
args = ap.parse_args()
import krex  # noqa: E402

IMPORT_S = time.monotonic() - T0


def spin(seconds: float) -> float:
    t = time.perf_counter()
    while time.perf_counter() - t < seconds:
        pass
    return (time.perf_counter() - t) * 1e3


region = krex.region if os.environ.get("KREX_JOB") else (lambda name: contextlib.nullcontext())
spin(0.02)                                     # "compile"
timings = {}
check = os.environ.get("KREX_JOB") and os.environ.get("KREX_HOST_BOUND") == "1"   # as bench/candidate.py
for _ in range(max(1, args.repeat)):
    for name in ("candidate", "reference"):
        with region(f"standin.{name}"):
            t = spin(args.size / 1024 * 0.002)
        timings.setdefault(f"{name}_ms", t)
        if args.repeat > 1:
            timings.setdefault(f"{name}_all_ms", []).append(t)
        if check:
            info = krex.last_region()
            timings.setdefault(f"{name}_host_bound", []).append(None if info is None else bool(info.host_bound))
print(json.dumps({"size": args.size, "variant": args.variant, **({"op": "sum"} if args.op == "sum" else {}),
                  "argv_op": args.op,          # what the command line said (a row's "op" also comes from its spec)
                  "nonce": args.nonce, "correct": True, **timings,
                  "harness": {"warmup_ms": args.warmup_ms, "min_reps": args.min_reps, "timer": args.timer,
                              **({"compiler": args.compiler} if args.compiler != "triton" else {}),
                              **({"scatter_gib": args.scatter_gib} if args.scatter_gib else {}),
                              **({"holder_gib": args.holder_gib} if args.holder_gib else {})},
                  "pid": os.getpid(), "ppid": os.getppid(),
                  "compile_s": 0.02, "import_s": round(IMPORT_S, 3), "total_s": round(time.monotonic() - T0, 3),
                  "t0_mono": round(T0, 4), "t_end_mono": round(time.monotonic(), 4)}))   # as bench/candidate.py
