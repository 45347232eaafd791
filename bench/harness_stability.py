"""How repeatable is one kernel timing on this GPU, alone, with nothing else on it? The fidelity goals judge
timings against a floor; a harness whose back-to-back timings of the same kernel in the same process differ by
more than the goal cannot show it met (on the H200, bench/freeze_policy.py's candidates, timed with
do_bench(warmup=25, rep=100), had one process's two timings of a 1-10 ms kernel up to 15% apart).

Per bf16 matmul size, in this one process, --calls back-to-back timings with an idle gap between them (as a
command's compile leaves the GPU idle between its timings), each way:
  - default: do_bench(warmup=25, rep=100, median), the usual harness (7 reps of a 13 ms matmul);
  - stable: do_bench with at least --reps repetitions (rep = max(100 ms, reps x the kernel's time)) after a
    --warmup-ms warm-up, so that the GPU's clock and power have settled before the first timed repetition.
For each: the timings, max / min - 1 (the spread), and the SM clock and power just before each timing (NVML).
Run it in two processes for the spread across processes as well:
    python3 bench/harness_stability.py --out a.json && python3 bench/harness_stability.py --out b.json"""

import argparse
import json
import time

SIZES = (2048, 4096, 8192, 16384)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)))
    ap.add_argument("--calls", type=int, default=4, help="back-to-back timings per size and way")
    ap.add_argument("--gap", type=float, default=1.0, help="idle seconds between two timings")
    ap.add_argument("--reps", type=int, default=100, help="stable: at least this many timed repetitions")
    ap.add_argument("--warmup-ms", type=float, default=500.0, help="stable: warm-up before the timed repetitions")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch
    from triton.testing import do_bench
    try:
        import pynvml
        pynvml.nvmlInit()
        nv = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        probe = lambda: {"sm_mhz": pynvml.nvmlDeviceGetClockInfo(nv, pynvml.NVML_CLOCK_SM),  # noqa: E731
                         "watts": round(pynvml.nvmlDeviceGetPowerUsage(nv) / 1000, 1)}
    except Exception as e:  # no NVML: timings only
        print(f"harness_stability: no NVML ({e}); clocks not sampled")
        probe = lambda: {}  # noqa: E731

    out = {"gpu": torch.cuda.get_device_name(), "args": vars(args), "sizes": {}}
    for n in (int(x) for x in args.sizes.split(",")):
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        fn = lambda: torch.mm(a, b)  # noqa: E731
        t0 = do_bench(fn, warmup=5, rep=20, return_mode="median")
        ways = {"default": dict(warmup=25, rep=100),
                "stable": dict(warmup=args.warmup_ms, rep=max(100.0, args.reps * t0))}
        row = {"kernel_ms": t0}
        for way, kw in ways.items():
            ts, probes = [], []
            for _ in range(args.calls):
                time.sleep(args.gap)
                probes.append(probe())
                ts.append(do_bench(fn, return_mode="median", **kw))
            row[way] = {"timings_ms": ts, "spread_pct": (max(ts) / min(ts) - 1) * 100, "before": probes,
                        "reps": round(kw["rep"] / t0)}
        out["sizes"][str(n)] = row
        print(n, f"{t0:.4f} ms", " ".join(f"{w}: spread {row[w]['spread_pct']:.2f}% ({row[w]['reps']} reps)"
                                         for w in ways), flush=True)
        del a, b
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
