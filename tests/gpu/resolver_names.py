"""What the driver's resolver hands out, named: for each (name, version, per-thread flag) ask
cuGetProcAddress_v2 (the real libcuda.so.1, no krex in the process) and name the answer with dladdr.
The shim routes a resolver answer by that name (shim/resolve.c, krex_route); where dladdr cannot name it
exactly, the shim falls back to the requested name, which is wrong for a base name whose versioned answer has
another signature (cuMemPrefetchAsync at 13000 is _v2's). This says whether that fallback is ever taken on a
real driver. Prints one line per query and writes --out (JSON).
    python3 tests/gpu/resolver_names.py --out resolver-names.json"""

import argparse
import ctypes
import json
import sys

QUERIES = [("cuMemPrefetchAsync", v) for v in (8000, 12000, 12020, 13000)] + [
    ("cuMemPrefetchBatchAsync", 13000), ("cuMemDiscardBatchAsync", 13000),
    ("cuMemDiscardAndPrefetchBatchAsync", 13000), ("cuMemcpyBatchAsync", 12080), ("cuMemcpyBatchAsync", 13000),
    ("cuStreamBeginCapture", 10000), ("cuStreamBeginCapture", 13000), ("cuLaunchHostFunc", 10000),
    ("cuLaunchHostFunc", 13000), ("cuCtxSynchronize", 2000), ("cuCtxSynchronize", 13000),
    ("cuLaunchKernel", 4000), ("cuLaunchKernelEx", 11060), ("cuGraphLaunch", 10000), ("cuMemcpyAsync", 4000),
    ("cuMemcpyHtoDAsync", 3020), ("cuEventRecord", 2000), ("cuStreamSynchronize", 2000)]


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p), ("dli_sname", ctypes.c_char_p),
                ("dli_saddr", ctypes.c_void_p)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--lib", default="libcuda.so.1")
    args = ap.parse_args()
    try:
        cuda = ctypes.CDLL(args.lib)
    except OSError as e:
        sys.exit(f"resolver_names: cannot load {args.lib}: {e}")
    libc = ctypes.CDLL(None)
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    if cuda.cuInit(0) != 0:
        sys.exit("resolver_names: cuInit failed")
    gpa = cuda.cuGetProcAddress_v2
    gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64,
                    ctypes.POINTER(ctypes.c_int)]
    rows = []
    for name, ver in QUERIES:
        for flags in (0, 2):          # CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM
            p, st = ctypes.c_void_p(), ctypes.c_int(-1)
            rc = gpa(name.encode(), ctypes.byref(p), ver, flags, ctypes.byref(st))
            row = {"name": name, "version": ver, "per_thread": bool(flags), "rc": rc, "status": st.value}
            if rc == 0 and p.value:
                info = DlInfo()
                ok = libc.dladdr(p, ctypes.byref(info))
                exact = bool(ok and info.dli_saddr == p.value)
                row.update(named=(info.dli_sname or b"").decode() if ok else None, exact=exact)
            rows.append(row)
            print(f"{name:36s} {ver:6d} {'ptsz' if flags else '    '} rc={rc} -> {row.get('named')} "
                  f"{'exact' if row.get('exact') else 'NOT EXACT' if 'exact' in row else ''}", flush=True)
    fallbacks = [r for r in rows if r.get("rc") == 0 and not r.get("exact")]
    with open(args.out, "w") as f:
        json.dump({"lib": args.lib, "rows": rows, "not_named_exactly": len(fallbacks)}, f, indent=1)
    print(f"answers not named exactly (the shim's fallback): {len(fallbacks)} of {sum(r['rc'] == 0 for r in rows)}")


if __name__ == "__main__":
    main()
