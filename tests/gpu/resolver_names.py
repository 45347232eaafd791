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
import os
import subprocess
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
    ap.add_argument("--shim", default="build/libkrex.so",
                    help="the shim whose exported names the answers are checked against (nm -D)")
    args = ap.parse_args()
    if "libkrex" in os.environ.get("LD_PRELOAD", ""):
        sys.exit("resolver_names: run it without krex (LD_PRELOAD has libkrex): the answers would be krex's wrappers")
    try:
        cuda = ctypes.CDLL(args.lib)
    except OSError as e:
        sys.exit(f"resolver_names: cannot load {args.lib}: {e}")
    nm = subprocess.run(["nm", "-D", "--defined-only", args.shim], capture_output=True, text=True)
    hooked = {ln.split()[-1] for ln in nm.stdout.splitlines() if ln.strip()} if nm.returncode == 0 else None
    if hooked is None:
        print(f"resolver_names: cannot read {args.shim}'s names; the answers are not checked against them")
    libc = ctypes.CDLL(None)
    libc.dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(DlInfo)]
    if cuda.cuInit(0) != 0:
        sys.exit("resolver_names: cuInit failed")
    if not hasattr(cuda, "cuGetProcAddress_v2"):
        sys.exit("resolver_names: this driver has no cuGetProcAddress_v2 (older than CUDA 12.0)")
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
                row.update(named=(info.dli_sname or b"").decode() if ok else None, exact=exact,
                           library=(info.dli_fname or b"").decode() if ok else None)
                if "libkrex" in (row["library"] or ""):
                    sys.exit("resolver_names: an answer is krex's own wrapper: run it without krex")
                # the shim routes by this name: one it does not wrap goes to the caller unwrapped, or, where the
                # name is not exact, the requested name's wrapper is handed out
                row["shim_wraps"] = None if hooked is None or not row["named"] else row["named"] in hooked
            rows.append(row)
            if rc == 0 and not p.value:    # no function at that version (status 2: VERSION_NOT_SUFFICIENT)
                row["no_answer"] = True
            print(f"{name:36s} {ver:6d} {'ptsz' if flags else '    '} rc={rc} status={st.value} -> "
                  f"{'(no function)' if row.get('no_answer') else row.get('named')} "
                  f"{'exact' if row.get('exact') else 'NOT EXACT' if 'exact' in row else ''}"
                  f"{'' if row.get('shim_wraps') in (True, None) else ' NOT WRAPPED'}", flush=True)
    # a function handed out that dladdr cannot name exactly: the shim's fallback (a NULL answer is not one: the
    # shim hands NULL back as the driver did)
    answers = [r for r in rows if r.get("rc") == 0 and not r.get("no_answer")]
    fallbacks = [r for r in answers if not r.get("exact")]
    unwrapped = [r for r in rows if r.get("shim_wraps") is False]
    with open(args.out, "w") as f:
        json.dump({"lib": args.lib, "rows": rows, "answers": len(answers),
                   "no_function": sum(1 for r in rows if r.get("no_answer")),
                   "errors": sum(1 for r in rows if r["rc"] != 0),
                   "not_named_exactly": len(fallbacks), "not_wrapped": len(unwrapped)}, f, indent=1)
    print(f"{len(answers)} functions handed out, {sum(1 for r in rows if r.get('no_answer'))} queries answered with "
          f"none, {sum(1 for r in rows if r['rc'] != 0)} refused; "
          f"not named exactly (the shim's fallback): {len(fallbacks)}; named but not wrapped by the shim: {len(unwrapped)}")


if __name__ == "__main__":
    main()
