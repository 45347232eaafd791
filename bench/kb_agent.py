"""One agent command of bench/kernelbench_mix.py: load KernelBench problems and time each with KernelBench's
own timing module (kernelbench.timing.time_execution_with_cuda_event: warm-up, an L2 flush per trial, CUDA
events), as an agent evaluating candidates does. Under `krex run` with KREX_HOOKS=kernelbench each timing
call is a krex region; what krex says of it (exclusive, clean, taints, SM clock) is kept with the time.

    python bench/kb_agent.py --kernelbench .kb --items 1_Square_matrix_multiplication_.py:bf16,... --out x.jsonl

Items are PROBLEM:DTYPE (fp32, bf16, fp16); a problem's inputs are made on the GPU (its get_inputs under
torch's default device), so a command costs seconds of CPU less than KernelBench's host-side randn."""

import argparse
import json
import os
import statistics
import sys
import time

DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}


def load_problem(path: str) -> dict:
    ctx: dict = {}
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ctx)   # as KernelBench's load_original_model_and_inputs does
    return ctx


def make_problem(kernelbench: str, item: str, dev) -> tuple:
    """An item's model and inputs on dev, in the item's dtype, as KernelBench builds them (seed 42, inputs
    made under the device)."""
    import torch
    problem, dtype_name = item.split(":")
    dtype = getattr(torch, DTYPES[dtype_name])
    ctx = load_problem(os.path.join(kernelbench, "level1", problem))
    torch.manual_seed(42)
    with torch.device(dev):
        inputs = [x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
                  for x in ctx["get_inputs"]()]
        init = ctx["get_init_inputs"]()
    return ctx["Model"](*init).to(device=dev, dtype=dtype), inputs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", required=True, help="directory holding kernelbench/timing.py and level1/")
    ap.add_argument("--items", required=True)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()
    sys.path.insert(0, args.kernelbench)
    import torch
    from kernelbench import timing
    try:
        import krex
    except ImportError:
        krex = None
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    t_start = time.monotonic()
    with open(args.out, "a") as out, torch.no_grad():
        for index, item in enumerate(args.items.split(",")):
            model, inputs = make_problem(args.kernelbench, item, dev)
            before = krex.last_region() if krex else None
            times = timing.time_execution_with_cuda_event(model, inputs, num_warmup=args.warmup,
                                                          num_trials=args.trials, verbose=False, device=dev)
            info = krex.last_region() if krex else None
            rec = {"item": item, "index": index, "tag": args.tag, "pid": os.getpid(), "median_ms": statistics.median(times),
                   "mean_ms": statistics.fmean(times), "min_ms": min(times), "times": times,
                   "t": time.monotonic() - t_start}
            key = lambda i: (i.region_id, i.ended_ns) if i is not None else None   # noqa: E731
            if info is not None and key(info) != key(before):
                rec["region"] = {"granted": info.granted, "exclusive": info.exclusive, "clean": info.clean,
                                 "taints": info.taints, "sm_clock_mhz": info.sm_clock_mhz, "id": info.region_id,
                                 "granted_ns": info.granted_ns, "ended_ns": info.ended_ns}
            out.write(json.dumps(rec) + "\n")
            out.flush()
            del model, inputs
            torch.cuda.empty_cache()        # what a harness does between problems: the memory goes back
    return 0


if __name__ == "__main__":
    sys.exit(main())
