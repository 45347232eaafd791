"""All-gather + GEMM under torchrun, one rank a GPU: NCCL's all_gather_into_tensor then the GEMM, against
PyTorch's fused_all_gather_matmul (symmetric memory: copy-engine peer copies and signal pads, no NVLink
multicast: TORCH_SYMM_MEM_DISABLE_MULTICAST=1 and NCCL_NVLS_ENABLE=0 are forced in this process).

    krex run --gpu 0,1 -- torchrun --nproc_per_node 2 examples/multigpu/ag_gemm_symm.py --m 16384 --k 8192 --n 2048

Each rank holds M/2 rows of A and its N/2 columns of B and computes A @ B_r. Each rank times inside a krex
region with no GPUs named: the first rank's request covers every GPU of the job (both), the other rank's
joins it (a gang), so neighbours on both GPUs are held off. Rank 0 prints one JSON line."""

import argparse
import json
import os
import sys
import time

for _var, _val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_var] = _val

import krex  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=16384)
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--n", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-region", action="store_true")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    try:
        import torch
        import torch.distributed as dist
        from torch.distributed._symmetric_memory import enable_symm_mem_for_group
    except ImportError as e:
        print(f"ag_gemm_symm: needs torch with symmetric memory ({e})", file=sys.stderr)
        return 0
    if "RANK" not in os.environ:
        print("ag_gemm_symm: run it under torchrun --nproc_per_node 2", file=sys.stderr)
        return 2
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)))
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", device_id=dev)
    group = dist.group.WORLD
    enable_symm_mem_for_group(group.group_name)
    ms, ns = args.m // world, args.n // world
    gen = torch.Generator().manual_seed(rank)
    a_shard = torch.randn(ms, args.k, generator=gen).to(dev, torch.bfloat16)
    b = (torch.randn(args.k, ns, generator=gen) / args.k ** 0.5).to(dev, torch.bfloat16)
    gathered = torch.empty(args.m, args.k, device=dev, dtype=torch.bfloat16)

    def baseline():
        dist.all_gather_into_tensor(gathered, a_shard, group=group)
        return torch.mm(gathered, b)

    def fused():
        _ag, outs = torch.ops.symm_mem.fused_all_gather_matmul(a_shard, [b], gather_dim=0,
                                                               group_name=group.group_name)
        return outs[0]

    ref = baseline()
    got = fused()
    torch.cuda.synchronize()
    err = float((got.float() - ref.float()).norm() / ref.float().norm())

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
        torch.cuda.synchronize()
        dist.barrier()
        return (time.perf_counter() - t0) / args.iters * 1e3

    for fn in (baseline, fused):
        timed(fn)
    region = None if args.no_region else krex.region("ag_gemm_symm")
    if region is not None:
        region.__enter__()
    dist.barrier()                       # both ranks are inside the one region
    res = {"baseline": [], "fused": []}
    try:
        for _ in range(args.rounds):
            res["baseline"].append(timed(baseline))
            res["fused"].append(timed(fused))
    finally:
        if region is not None:
            region.__exit__(None, None, None)
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    if rank == 0:
        print(json.dumps({"label": args.label, "m": args.m, "k": args.k, "n": args.n, "world": world, "ms": res,
                          "median_ms": med, "speedup": med["baseline"] / med["fused"], "rel_error": err,
                          "region": None if region is None else {"granted": region.granted,
                                                                 "exclusive": region.exclusive,
                                                                 "clean": region.clean}}), flush=True)
    dist.destroy_process_group()
    return 0 if err < 2e-2 else 1


if __name__ == "__main__":
    sys.exit(main())
