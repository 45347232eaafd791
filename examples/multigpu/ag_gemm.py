"""All-gather + GEMM on two GPUs, one process: serial (gather, then multiply) against overlapped (the peer's
shard arrives in chunks by copy-engine peer copies on a side stream while the local shard, then each
arrived chunk, is multiplied). The multicast-free form of ParallelKittens' AG+GEMM (seeds/002).

    krex run --gpu 0,1 -- python examples/multigpu/ag_gemm.py --m 16384 --k 8192 --n 1024 --chunks 4

Each GPU r holds A_r, rows r*M/2..(r+1)*M/2 of A (M x K), and B_r, its N/2 columns of B (K x N); it
computes C_r = A @ B_r (M x N/2), so it needs the other GPU's rows of A. The timed loop runs inside one krex
region over both GPUs (`krex.region(gpus=[0, 1])`): under krex, neighbours on both GPUs are held off
while it runs. Prints one JSON line: serial and overlapped times, each part alone (the GEMM and the copy:
the bound on the speedup is (Tc + Tm) / max(Tc, Tm)), the speedup and the overlap efficiency, and the
relative error of both results against a float32 reference. Never NVLink multicast: peer copies only, and
the NCCL/PyTorch/NVSHMEM multicast switches are forced off in this process."""

import argparse
import json
import os
import sys
import time

for _var, _val in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
    os.environ[_var] = _val

import krex  # noqa: E402


def chunk_rows(rows: int, chunks: int, align: int = 128) -> list[tuple[int, int]]:
    """[start, end) row ranges of about rows/chunks each, multiples of align except the last."""
    chunks = max(1, min(chunks, rows // align or 1))
    step = max(align, (rows // chunks) // align * align)
    out, start = [], 0
    while start < rows:
        end = rows if len(out) == chunks - 1 else min(rows, start + step)
        out.append((start, end))
        start = end
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=16384, help="rows of A (split across the two GPUs)")
    ap.add_argument("--k", type=int, default=8192)
    ap.add_argument("--n", type=int, default=1024, help="columns of B (split across the two GPUs)")
    ap.add_argument("--chunks", type=int, default=4, help="pieces the peer's shard arrives in")
    ap.add_argument("--iters", type=int, default=20, help="timed repetitions of each variant")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of serial and overlapped")
    ap.add_argument("--no-region", action="store_true", help="time without a krex region")
    ap.add_argument("--label", default="")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("ag_gemm: needs torch", file=sys.stderr)
        return 0
    if torch.cuda.device_count() < 2:
        print(f"ag_gemm: needs 2 GPUs, this process sees {torch.cuda.device_count()}", file=sys.stderr)
        return 0
    devs = [torch.device("cuda", 0), torch.device("cuda", 1)]
    for d, p in ((0, 1), (1, 0)):
        if not torch.cuda.can_device_access_peer(d, p):
            print(f"ag_gemm: GPU {d} cannot access GPU {p} directly; the copies would go through the host",
                  file=sys.stderr)
    m2, k, n2 = args.m // 2, args.k, args.n // 2
    gen = torch.Generator().manual_seed(0)
    a_host = torch.randn(args.m, k, generator=gen, dtype=torch.float32)
    b_host = torch.randn(k, args.n, generator=gen, dtype=torch.float32) / k ** 0.5
    shards = [a_host[r * m2:(r + 1) * m2].to(devs[r], torch.bfloat16) for r in range(2)]
    bs = [b_host[:, r * n2:(r + 1) * n2].to(devs[r], torch.bfloat16).contiguous() for r in range(2)]
    gathered = [torch.empty(args.m, k, device=devs[r], dtype=torch.bfloat16) for r in range(2)]
    outs = [torch.empty(args.m, n2, device=devs[r], dtype=torch.bfloat16) for r in range(2)]
    compute = [torch.cuda.Stream(devs[r]) for r in range(2)]
    copies = [torch.cuda.Stream(devs[r]) for r in range(2)]
    pieces = chunk_rows(m2, args.chunks)

    def peer(r):
        return 1 - r

    def serial():
        for r in range(2):
            with torch.cuda.stream(compute[r]):
                lo = r * m2
                gathered[r][lo:lo + m2].copy_(shards[r])
                po = peer(r) * m2
                gathered[r][po:po + m2].copy_(shards[peer(r)], non_blocking=True)   # peer copy, then
                torch.mm(gathered[r], bs[r], out=outs[r])                          # the whole GEMM

    def overlapped():
        for r in range(2):
            ready = []
            with torch.cuda.stream(copies[r]):                  # the peer's rows, chunk by chunk
                po = peer(r) * m2
                copies[r].wait_stream(compute[r])               # the buffers are free (last iteration done)
                for s, e in pieces:
                    gathered[r][po + s:po + e].copy_(shards[peer(r)][s:e], non_blocking=True)
                    ev = torch.cuda.Event()
                    ev.record(copies[r])
                    ready.append(ev)
            with torch.cuda.stream(compute[r]):                 # meanwhile: our own rows, then each chunk
                lo = r * m2
                torch.mm(shards[r], bs[r], out=outs[r][lo:lo + m2])
                for (s, e), ev in zip(pieces, ready):
                    compute[r].wait_event(ev)
                    torch.mm(gathered[r][po + s:po + e], bs[r], out=outs[r][po + s:po + e])

    def gemm_only():
        for r in range(2):
            with torch.cuda.stream(compute[r]):
                torch.mm(gathered[r], bs[r], out=outs[r])

    def copy_only():
        for r in range(2):
            with torch.cuda.stream(copies[r]):
                po = peer(r) * m2
                gathered[r][po:po + m2].copy_(shards[peer(r)], non_blocking=True)

    def sync():
        for r in range(2):
            torch.cuda.synchronize(devs[r])

    def timed(fn) -> float:
        fn()
        sync()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            fn()
        sync()
        return (time.perf_counter() - t0) / args.iters * 1e3

    def check(fn) -> float:
        for t in outs:
            t.fill_(float("nan"))
        fn()
        sync()
        worst = 0.0
        for r in range(2):
            ref = a_host @ b_host[:, r * n2:(r + 1) * n2]
            got = outs[r].float().cpu()
            worst = max(worst, float((got - ref).norm() / ref.norm()))
        return worst

    err_serial, err_overlap = check(serial), check(overlapped)
    for fn in (serial, overlapped, gemm_only, copy_only):    # warm-up: cuBLAS handles, peer mappings
        fn()
    sync()
    res = {"serial": [], "overlapped": [], "gemm": [], "copy": []}
    region = krex.region("ag_gemm", gpus=[0, 1]) if not args.no_region else None
    if region is not None:
        region.__enter__()
    try:
        for _ in range(args.rounds):
            res["serial"].append(timed(serial))
            res["overlapped"].append(timed(overlapped))
            res["gemm"].append(timed(gemm_only))
            res["copy"].append(timed(copy_only))
    finally:
        if region is not None:
            region.__exit__(None, None, None)
    med = {k: sorted(v)[len(v) // 2] for k, v in res.items()}
    tc, tm, t = med["gemm"], med["copy"], med["overlapped"]
    out = {"label": args.label, "m": args.m, "k": k, "n": args.n, "chunks": len(pieces), "iters": args.iters,
           "rounds": args.rounds, "ms": res, "median_ms": med, "speedup": med["serial"] / t,
           "bound": (tc + tm) / max(tc, tm), "overlap_efficiency": (tc + tm - t) / min(tc, tm),
           "rel_error": {"serial": err_serial, "overlapped": err_overlap},
           "region": None if region is None else {"granted": region.granted, "exclusive": region.exclusive,
                                                  "clean": region.clean, "taints": region.taints}}
    print(json.dumps(out), flush=True)
    ok = all(e < 2e-2 for e in out["rel_error"].values())
    if not ok:
        print(f"ag_gemm: wrong result (relative error {out['rel_error']})", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
