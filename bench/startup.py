"""What `krex run` adds to a command's start and end: a Python command that prints its monotonic clock at once
and exits, run plainly, under `krex run`, and under `krex run` with KREX_HOOKS=triton (the hooks load in the
command's interpreter at its start; krex's region API only with a hook's target, which this command never
imports), alternating, --repeats times each.

    python bench/startup.py --repeats 20 --out startup.json       (real GPU or fake driver; no GPU work)

Per mode, medians and 90th percentiles in ms of the wall time (start to exit, as the caller sees it) and of
`before` (start to the command's first line: the wrapper, the interpreter, the hooks): what a benchmark command
loses before its body runs. `krex run` talks to a controller of the script's own (a socket in a temporary
directory), as a node's commands do. The result says whether the wire declarations came compiled
(build/krex_ffi.py, krex_ctl/wire/cdefs.py) or were parsed at import."""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BODY = "import time; print(time.monotonic())"
MODES = ("plain", "krex", "krex+hooks")


def once(mode: str, env: dict) -> tuple:
    cmd = [sys.executable, "-c", BODY]
    if mode != "plain":
        cmd = [sys.executable, "-m", "krex_ctl", "run", "-q", "--"] + cmd
    t0 = time.monotonic()
    out = subprocess.run(cmd, env=dict(env, KREX_HOOKS="triton") if mode == "krex+hooks" else env,
                         capture_output=True, text=True, check=True, timeout=60)
    t1 = time.monotonic()
    body = float(out.stdout.split()[-1])
    return (t1 - t0) * 1e3, (body - t0) * 1e3


def summary(values: list) -> dict:
    q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
    return {"median": round(statistics.median(values), 1), "p90": round(q[8], 1), "n": len(values)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error("--repeats: 1 or more")
    sys.path.insert(0, str(ROOT))
    from krex_ctl import paths
    from krex_ctl.wire import frames

    compiled = paths.compiled_ffi()
    tmp = Path(tempfile.mkdtemp(prefix="krex-startup-"))
    sock = tmp / "c.sock"
    env = dict(os.environ, KREX_SOCKET=str(sock),
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p))
    env.pop("KREX_HOOKS", None)
    log = open(tmp / "controller.log", "wb")
    ctl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(sock)], env=env,
                           stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not sock.exists():
            if ctl.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the controller did not start (see {tmp / 'controller.log'})")
            time.sleep(0.05)
        for mode in MODES:                 # one of each first: page caches, the controller's first job
            once(mode, env)
        walls = {m: [] for m in MODES}
        befores = {m: [] for m in MODES}
        for _ in range(args.repeats):
            for mode in MODES:
                w, b = once(mode, env)
                walls[mode].append(w)
                befores[mode].append(b)
    finally:
        ctl.terminate()
        ctl.wait(30)
    shutil.rmtree(tmp, ignore_errors=True)   # the controller's log: kept only when the controller did not start
    result = {"repeats": args.repeats, "python": sys.version.split()[0],
              "declarations": "compiled" if compiled.is_file() and "cffi.api" not in type(frames.ffi).__module__
              else "parsed at import",
              "modes": {m: {"wall_ms": summary(walls[m]), "before_ms": summary(befores[m])} for m in MODES}}
    plain = result["modes"]["plain"]
    for m in MODES[1:]:
        mine = result["modes"][m]
        mine["added_wall_ms"] = round(mine["wall_ms"]["median"] - plain["wall_ms"]["median"], 1)
        mine["added_before_ms"] = round(mine["before_ms"]["median"] - plain["before_ms"]["median"], 1)
    Path(args.out).write_text(json.dumps(result, separators=(",", ":")) + "\n")   # bench/results keeps it as is
    print(json.dumps(result))


if __name__ == "__main__":
    main()
