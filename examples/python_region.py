"""A Python benchmark that marks its timing with an explicit krex region.

    krex run -- python examples/python_region.py --sizes 8192,16384 --trials 3

Each trial times a bf16 matmul with triton.testing.do_bench inside `krex.region`, after a first call
(JIT, autotuning and allocation stay outside the region). Prints one JSON line per trial. On a machine
without torch+CUDA it says so and exits 0 (the fake-driver demo uses examples/c/spin_bench.c)."""

import argparse
import json
import sys
import time

import krex


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8192", help="comma list of square matmul sizes")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--no-region", action="store_true", help="time without a krex region (baseline)")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    try:
        import torch
        from triton.testing import do_bench
    except ImportError as e:
        print(f"python_region: needs torch and triton ({e.name} missing)", file=sys.stderr)
        return 0
    if not torch.cuda.is_available():
        print("python_region: no CUDA device", file=sys.stderr)
        return 0
    for size in (int(s) for s in args.sizes.split(",")):
        a = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(size, size, device="cuda", dtype=torch.bfloat16)
        fn = lambda: torch.mm(a, b)  # noqa: E731
        fn()
        torch.cuda.synchronize()
        for trial in range(args.trials):
            t0 = time.monotonic()
            if args.no_region:
                q = do_bench(fn, warmup=25, rep=200, quantiles=[0.5, 0.2, 0.8])
            else:
                with krex.region(f"mm{size}"):
                    q = do_bench(fn, warmup=25, rep=200, quantiles=[0.5, 0.2, 0.8])
            print(json.dumps({"label": args.label, "size": size, "trial": trial, "median_ms": q[0], "p20_ms": q[1],
                              "p80_ms": q[2], "wall_s": round(time.monotonic() - t0, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
