"""Lookups in the global scope under the shim: for every driver name the shim exports, does
dlsym(dlopen(NULL), name) give the shim's wrapper where the driver has the function and NULL where it lacks it
(as without the shim)? Run with the shim preloaded and the driver library's path:

    LD_PRELOAD=build/libkrex.so python3 tests/gpu/global_scope.py LIBCUDA_PATH [--out FILE]

Loads the driver library into the global scope (RTLD_GLOBAL, as a program linked against it has it) and calls
nothing in it. Prints one JSON object; exit 1 when any name is answered wrongly."""

import argparse
import ctypes
import json
import os
import subprocess
import sys


def exports(path: str, prefix: str) -> set:
    out = subprocess.run(["nm", "-D", "--defined-only", path], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines()
            if line.strip() and line.split()[-1].startswith(prefix)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("driver", help="the driver library (libcuda.so.1's path)")
    ap.add_argument("--shim", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "libkrex.so"))
    ap.add_argument("--prefix", default="cu")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if "libkrex" not in os.environ.get("LD_PRELOAD", ""):
        print("global_scope: run with the shim preloaded (LD_PRELOAD=build/libkrex.so)", file=sys.stderr)
        return 2
    shim_names = exports(args.shim, args.prefix)
    driver_names = exports(args.driver, args.prefix)
    ctypes.CDLL(args.driver, mode=ctypes.RTLD_GLOBAL)
    shim = ctypes.CDLL(args.shim)
    scope = ctypes.CDLL(None)
    rows = {"driver_has": 0, "wrapper_given": 0, "driver_lacks": 0, "null_given": 0}
    wrong = []
    for name in sorted(shim_names):
        try:
            got = ctypes.cast(getattr(scope, name), ctypes.c_void_p).value
        except AttributeError:
            got = None
        if name in driver_names:
            mine = ctypes.cast(getattr(shim, name), ctypes.c_void_p).value   # the shim's own export
            rows["driver_has"] += 1
            rows["wrapper_given"] += got == mine
            if got != mine:
                wrong.append([name, "driver has it", "null" if got is None else "not the wrapper"])
        else:
            rows["driver_lacks"] += 1
            rows["null_given"] += got is None
            if got is not None:
                wrong.append([name, "driver lacks it", "a function"])
    result = {"driver": os.path.realpath(args.driver), "shim_names": len(shim_names), **rows, "wrong": wrong,
              "lacked": sorted(shim_names - driver_names)}
    text = json.dumps(result, separators=(",", ":"))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    print(text)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
