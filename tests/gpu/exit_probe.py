"""tests/gpu/exit_probe.py: what the controller's attestation sees of a process with a GPU context while it exits.

A krex command's shim connects to the controller before the driver opens its device files, so at exit its
connection (a lower fd) closes before its GPU context is torn down. Between the two, NVML still lists the
process. This probe measures that window on a real GPU: each child connects to a Unix socket of the probe's own
(before CUDA is initialized, as the shim does), makes a context and takes memory with PyTorch, and exits.
Meanwhile the probe polls NVML's compute processes and, for every listed child whose connection has closed, reads
what krex_ctl/enforce/attest.py reads: /proc/PID/environ (readable, empty or an error), the state and the
PF_EXITING flag of /proc/PID/stat.

    python3 tests/gpu/exit_probe.py --children 30 --parallel 3 --gib 1 --out exit-probe.json

With --krex the children run under `krex run` beside a controller of the probe's own (--log-level debug) and
connect to nothing else: the probe reads, from the controller's log, when and why it dropped each child's shim
(its connection closed: "disconnected"; its pidfd said it exited: "process exited") and compares that with the
last time NVML listed the child. A drop on "disconnected" that NVML outlives is where the controller's lifecycle
barrier lets a region start while that child's context is still being torn down.
"""

import argparse
import json
import os
from statistics import median
import re
import selectors
import socket
import subprocess
import sys
import tempfile
import threading
import time

CHILD = r"""
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(str(os.getpid()).encode() + b"\n")
import torch
x = torch.empty(int(float(sys.argv[2]) * (1 << 30)), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
time.sleep(0.2)
"""

CHILD_KREX = r"""
import sys, time
import torch
x = torch.empty(int(float(sys.argv[1]) * (1 << 30)), dtype=torch.uint8, device="cuda")
x.fill_(1)
torch.cuda.synchronize()
time.sleep(0.2)
"""

PF_EXITING = 0x4
DROP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) .*client \d+ \(pid (\d+)\) dropped: (.*)$")


EXITED = re.compile(r"^(\S+ \S+) krex-controller\[\d+\] DEBUG: client \d+ \(pid (\d+)\), followed since its "
                    r"connection closed, has exited")


def log_time(text: str) -> float:
    """A controller log line's time (its asctime, millisecond resolution) as wall time."""
    import datetime

    return datetime.datetime.strptime(text, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def exits(log: str) -> dict:
    """pid -> wall time at which the controller saw a followed process exit (its pidfd)."""
    return {int(m.group(2)): log_time(m.group(1)) for m in map(EXITED.match, log.splitlines()) if m}


def drops(log: str) -> dict:
    """pid -> (wall time, reason) of the controller's first drop of that pid's client."""
    out: dict = {}
    for line in log.splitlines():
        m = DROP.match(line)
        if m and int(m.group(2)) not in out:
            out[int(m.group(2))] = (log_time(m.group(1)), m.group(3))
    return out


def proc_view(pid: int) -> dict:
    """What the attestation reads of the process now."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        fields = data[data.rindex(b")") + 2:].split()
        state, flags = fields[0].decode(), int(fields[6])
    except (OSError, ValueError, IndexError):
        return {"gone": True}
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = "readable" if f.read() else "empty"
    except OSError as e:
        env = f"error {e.errno}"
    return {"state": state, "exiting": bool(flags & PF_EXITING), "environ": env}


def poller(dev, period_ms: float, clock, seen, done: threading.Event) -> threading.Thread:
    """A started thread that lists NVML's compute processes on dev every period_ms until done, calling
    seen(pid, clock()) for each."""
    import pynvml

    def poll() -> None:
        while not done.is_set():
            try:
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(dev)
            except pynvml.NVMLError:
                procs = []
            now = clock()
            for p in procs:
                seen(p.pid, now)
            time.sleep(period_ms / 1e3)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    return t


def run_children(argv: list, n: int, parallel: int, env=None) -> None:
    """n processes of argv, parallel at a time, each started 0.3 s after the one before."""
    running: list = []
    started = 0
    while started < n or running:
        running = [p for p in running if p.poll() is None]
        while len(running) < parallel and started < n:
            running.append(subprocess.Popen(argv, env=env))
            started += 1
            time.sleep(0.3)
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--children", type=int, default=30)
    ap.add_argument("--parallel", type=int, default=3)
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--poll-ms", type=float, default=0.5)
    ap.add_argument("--krex", action="store_true", help="the children under krex run, a controller of the probe's own")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.krex:
        return krex_probe(args)
    import pynvml

    pynvml.nvmlInit()
    dev = pynvml.nvmlDeviceGetHandleByIndex(0)
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "probe.sock")
    lis = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lis.bind(path)
    lis.listen(64)
    t0 = time.monotonic()
    closed: dict[int, float] = {}        # pid -> when its connection closed
    seen: dict[int, list] = {}           # pid -> (t, view) while listed after its connection closed
    last_listed: dict[int, float] = {}
    done = threading.Event()

    def serve() -> None:
        sel = selectors.DefaultSelector()
        sel.register(lis, selectors.EVENT_READ, None)
        pids: dict = {}
        while not done.is_set():
            for key, _ in sel.select(0.05):
                if key.data is None:
                    c, _ = lis.accept()
                    sel.register(c, selectors.EVENT_READ, "c")
                    pids[c] = None
                    continue
                c = key.fileobj
                b = c.recv(64)
                if b and pids[c] is None:
                    pids[c] = int(b.split(b"\n")[0])
                elif not b:
                    if pids[c] is not None:
                        closed[pids[c]] = time.monotonic() - t0
                    sel.unregister(c)
                    c.close()

    def listed(pid: int, now: float) -> None:
        last_listed[pid] = now
        if pid in closed:
            seen.setdefault(pid, []).append((round(now - closed[pid], 5), proc_view(pid)))

    threads = [threading.Thread(target=serve, daemon=True),
               poller(dev, args.poll_ms, lambda: time.monotonic() - t0, listed, done)]
    threads[0].start()
    try:
        run_children([sys.executable, "-c", CHILD, path, str(args.gib)], args.children, args.parallel)
        time.sleep(1.0)
    finally:
        done.set()
        for t in threads:
            t.join()
    children = []
    for pid, t in sorted(closed.items(), key=lambda kv: kv[1]):
        views = seen.get(pid, [])
        children.append({
            "pid": pid, "listed_after_close_ms": round(1e3 * (last_listed.get(pid, t) - t), 2) if views else 0.0,
            "samples": len(views),
            "environ_unreadable_not_zombie": sum(1 for _, v in views if not v.get("gone") and v["environ"] != "readable"
                                                 and v["state"] not in ("Z", "X")),
            "of_those_exiting": sum(1 for _, v in views if not v.get("gone") and v["environ"] != "readable"
                                    and v["state"] not in ("Z", "X") and v["exiting"]),
            "views": sorted({json.dumps(v, sort_keys=True) for _, v in views}),
        })
    listed = [c for c in children if c["samples"]]
    summary = {
        "children": len(children), "listed_after_their_connection_closed": len(listed),
        "with_environ_unreadable_while_not_zombie": sum(1 for c in listed if c["environ_unreadable_not_zombie"]),
        "samples_environ_unreadable_not_zombie": sum(c["environ_unreadable_not_zombie"] for c in listed),
        "of_those_pf_exiting": sum(c["of_those_exiting"] for c in listed),
        "listed_after_close_ms_max": max((c["listed_after_close_ms"] for c in listed), default=0.0),
        "listed_after_close_ms_median": median([c["listed_after_close_ms"] for c in listed]) if listed else 0.0,
    }
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "children": children, "argv": sys.argv}, f, indent=1)
    print(json.dumps(summary))
    return 0


def krex_probe(args) -> int:
    import pynvml

    pynvml.nvmlInit()
    dev = pynvml.nvmlDeviceGetHandleByIndex(0)
    tmp = tempfile.mkdtemp()
    env = dict(os.environ, KREX_SOCKET=os.path.join(tmp, "k.sock"))
    log = os.path.join(tmp, "controller.log")
    last_listed: dict[int, float] = {}
    first_listed: dict[int, float] = {}
    done = threading.Event()

    def listed(pid: int, now: float) -> None:
        first_listed.setdefault(pid, now)
        last_listed[pid] = now

    with open(log, "w") as logf:
        ctl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", env["KREX_SOCKET"],
                                "--state-file", os.path.join(tmp, "state"), "--log-level", "debug"], env=env,
                               stdout=logf, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 30
            while not os.path.exists(env["KREX_SOCKET"]):
                if time.monotonic() > deadline or ctl.poll() is not None:
                    raise SystemExit(f"the controller did not come up: {open(log).read()[-2000:]}")
                time.sleep(0.05)
            t = poller(dev, args.poll_ms, time.time, listed, done)    # wall time, as the controller's log has it
            run_children([sys.executable, "-m", "krex_ctl", "run", "--", sys.executable, "-c", CHILD_KREX,
                          str(args.gib)], args.children, args.parallel, env)
            time.sleep(1.0)
        finally:
            done.set()
            ctl.terminate()
            ctl.wait(timeout=30)
    t.join()
    text = open(log).read()
    followed = [int(m.group(1)) for m in re.finditer(r"\(pid (\d+)\) closed its connection on its way out", text)]
    dropped, exited = drops(text), exits(text)
    children = []
    for pid in sorted(last_listed, key=lambda p: first_listed[p]):
        if pid not in dropped:
            continue
        t, why = dropped[pid]
        children.append({"pid": pid, "dropped": why, "listed_after_drop_ms": round(1e3 * (last_listed[pid] - t), 1),
                         "followed_until_it_exited": pid in followed,
                         # NVML's last listing against the exit the controller saw (negative: it stopped first)
                         **({"listed_after_exit_ms": round(1e3 * (last_listed[pid] - exited[pid]), 1)}
                            if pid in exited else {})})
    by = {}
    for c in children:
        by.setdefault(c["dropped"], []).append(c["listed_after_drop_ms"])
    summary = {"children": len(children), "not_dropped_by_the_log": sorted(set(last_listed) - set(dropped)),
               "by_reason": {k: {"n": len(v), "listed_after_drop_ms_min": min(v), "median": median(v),
                                 "max": max(v)} for k, v in by.items()},
               "followed_until_they_exited": sum(c["followed_until_it_exited"] for c in children),
               **({"listed_after_exit_ms": {"n": len(after), "min": min(after), "median": median(after),
                                            "max": max(after)}}
                  if (after := [c["listed_after_exit_ms"] for c in children if "listed_after_exit_ms" in c]) else {}),
               "note": "the log's times have millisecond resolution; NVML polled every --poll-ms"}
    with open(args.out, "w") as f:
        json.dump({"summary": summary, "children": children, "argv": sys.argv,
                   "log_tail": text.splitlines()[-20:]}, f, indent=1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
