"""Reliability under faults, bad input and load, on the fake driver (CPU only, real processes):
    python bench/reliability.py --out bench/results/reliability.json        (make reliability)
  owner_kill       region owner SIGKILLed inside its region, N times: processes left stopped, and how
                   long until the frozen sibling runs again
  controller_kill  controller SIGKILLed inside a region: the `krex run` guardian resumes its job; and,
                   with no guardian, the restarted controller resumes it from its state file
  fuzz             random, truncated, oversized, wrong-version and unknown frames: controller survival
  load             many clients x many regions with busy neighbours: exclusivity violations in the
                   fake driver's trace, deadlocks, and the distribution of waits
  worker_kill      warm workers killed by signals in the middle of a command: exit statuses as cold
                   runs have them, nothing left stopped, the pool keeps supplying workers
  flood            thousands of connections that never say HELLO, then a command with a busy sibling:
                   is it protected; the controller's CPU and log under a 256-descriptor limit
  stall            the controller stalled (SIGSTOP) past the shim's handshake timeout, again and again,
                   under a region loop: regions in a stall reported unprotected, none in exclusive ones
                   touched by a sibling, how soon regions are granted again
  restart          the controller SIGKILLed under load, again and again: how soon the wrappers have a
                   controller again and regions are exclusive again; sibling kernels in exclusive regions
  interrupt        Ctrl-C while waiting for a region: requests left at the controller, another job's wait
  daemon           a frozen daemon (outside any wrapper's tree) when the controller is SIGKILLed: how soon
                   the resumer has it running
  refused          GPU processes the controller refuses (max_clients) launching beside a region loop: regions
                   reported exclusive while a refused process's kernel ran in them; refused shims registered later
  two_controllers  a second controller (another user's per-user one) with a busy job on the same GPUs: regions
                   of the first reported exclusive while the other's kernels ran in them
  paths            each attack on the socket's files (a file at the socket path, linked log and lock files, a
                   planted lock, a world-writable directory as root): refused in one line, nothing lost
  wrapper_kill     `krex run -- sh -c 'hog; true'` wrappers SIGKILLed: grandchildren left running, counters files left
  memory           one job's regions: the controller's RSS per region while the job runs and after it leaves
  load2            the load goal on 2 fake GPUs: 64 region loops, a quarter with contexts on both GPUs asking regions
                   on either, 20,000 regions in all, a busy neighbour on each GPU: regions reported exclusive with
                   another process's kernel inside on their GPUs (the trace's gpu=), stuck clients, owners seen
                   stopped while holding their region, revoked regions
  gang_repeat      tests/test_gang.py's deadlock-prone set-up (two owners with contexts on both GPUs looping regions
                   on opposite GPUs, freezing on, one single-GPU owner per GPU) under a fresh controller, K times:
                   runs with a deadlock (no progress for 3 s, or a region revoked at its time limit), runs with an
                   owner seen stopped while holding its region
  unconnected      the socket moved away for 3 s, again and again, under a region loop, a busy GPU process started
                   in each window (its connect() fails): regions reported exclusive with its kernels inside, regions
                   tainted unregistered, whether it registered once the socket was back
(--only a,b updates those sections of an existing --out file)"""

import argparse
import json
import os
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
SNIP = ROOT / "build" / "snippets"
SHIM = ROOT / "build" / "libkrex.so"
from krex_ctl.wire import client, frames  # noqa: E402
from krex_ctl.embedded import answers  # noqa: E402
from krex_ctl.procs import state  # noqa: E402
from krex_ctl.wire.frames import C, MSG  # noqa: E402


def wait_until(pred, timeout: float, interval: float = 0.0005):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return time.monotonic()
        time.sleep(interval)
    return None


class World:
    def __init__(self, tmp: Path, *ctl_args: str, preexec=None, log_level: str = "error"):
        self.preexec, self.log_level = preexec, log_level
        self.tmp = tmp
        tmp.mkdir(parents=True, exist_ok=True)
        self.sock = tmp / "ctl.sock"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "LD_PRELOAD"}
        self.env.update(KREX_SOCKET=str(self.sock), PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p), KREX_LOG_LEVEL="error",
                        KREX_FAKE_TRACE=str(tmp / "trace"), XDG_RUNTIME_DIR=str(tmp),
                        KREX_REGISTRY_DIR=str(tmp / "registry"))
        (tmp / "registry").mkdir(exist_ok=True)
        # every command on GPU 0, as devices of its own (krex run keeps a caller's CUDA_VISIBLE_DEVICES): the
        # scenarios put owners and neighbours on one GPU, and the fake trace, which names no GPU, is read so
        self.env["CUDA_VISIBLE_DEVICES"] = "0"
        # the scenarios follow their neighbours through the freeze, whatever work those have in flight: every
        # sibling is stopped unless ctl_args choose a policy (the controller's default, busy, stops only those
        # with work left at the drain)
        policy = [] if any(a in ("--freeze-policy", "--no-freeze") for a in ctl_args) else ["--freeze-policy", "all"]
        self.ctl_args = (*ctl_args, *policy)
        self.ctl = None
        self.start()

    def start(self):
        cpus = sorted(os.sched_getaffinity(0))
        self.ctl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(self.sock),
                                     "--reserved-cores", str(cpus[-1]), "--log-level", self.log_level, *self.ctl_args],
                                    env=self.env, stdout=subprocess.DEVNULL, stderr=open(self.tmp / "ctl.log", "ab"),
                                    preexec_fn=self.preexec)
        if not wait_until(self.answers, 10, 0.01):
            raise SystemExit("controller did not start")

    def answers(self) -> bool:
        return answers(self.sock)

    def preload(self, cmd, **env):
        """a process under the shim, without a `krex run` wrapper (so without a guardian)"""
        return subprocess.Popen([str(c) for c in cmd], env=dict(self.env, LD_PRELOAD=str(SHIM), **env),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def krex_run(self, cmd, report=None, **env):
        full = [sys.executable, "-m", "krex_ctl", "run"] + (["--report", str(report)] if report else []) + ["--"]
        return subprocess.Popen(full + [str(c) for c in cmd], env=dict(self.env, **env), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)

    def start_if_gone(self):
        if not self.answers():
            self.start()

    def stop(self):
        if self.ctl.poll() is None:
            self.ctl.terminate()
            self.ctl.wait(10)
        if self.answers():        # one a guardian started
            try:
                st = json.loads(subprocess.run([sys.executable, "-m", "krex_ctl", "status", "--json"], env=self.env,
                                               capture_output=True, text=True, timeout=20).stdout)
                os.kill(st["controller"]["pid"], signal.SIGTERM)
            except (ValueError, OSError, subprocess.TimeoutExpired):
                pass


def _connected(pid: int) -> bool:
    """the process holds a Unix socket (its controller connection)"""
    try:
        return any(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:") for fd in os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return False


def stopped_descendants_left(pids) -> list:
    return [p for p in pids if state(p) in ("T", "t")]


def owner_kill(n: int, tmp: Path) -> dict:
    w = World(tmp / "owner_kill")
    hog = w.preload([SNIP / "hog"], SNIPPET_MS=str(10 ** 7), SNIPPET_US="200")
    # the sibling must be registered before the first region, or that region has no one to freeze
    wait_until(lambda: any("krex" in l for l in open(f"/proc/{hog.pid}/maps")) and _connected(hog.pid), 10, 0.01)
    latencies, stuck, grants_missed = [], 0, 0
    for _ in range(n):
        owner = w.preload([SNIP / "region"], SNIPPET_REGIONS="1", SNIPPET_N="1", SNIPPET_HOLD_US="60000000")
        if not wait_until(lambda: state(hog.pid) == "T", 10):
            grants_missed += 1
            owner.kill()
            owner.wait()
            continue
        t0 = time.monotonic()
        owner.kill()
        t1 = wait_until(lambda: state(hog.pid) not in ("T", "t"), 5)
        owner.wait()
        if t1 is None:
            stuck += 1
            os.kill(hog.pid, signal.SIGCONT)
        else:
            latencies.append(t1 - t0)
    alive = hog.poll() is None
    hog.kill()
    hog.wait()
    w.stop()
    return {"iterations": n, "left_stopped": stuck, "grants_missed": grants_missed, "hog_alive": alive,
            "resume_ms": summary_ms(latencies)}


def controller_kill(n: int, tmp: Path) -> dict:
    """The controller SIGKILLed inside a region: a sibling under `krex run` is resumed by its guardian (or the
    resumer, whichever comes first), one without a wrapper by the resumer; neither waits for a restart."""
    guardian, restart = [], []
    stuck = 0
    for i in range(n):
        w = World(tmp / f"ck{i}")
        # A: the sibling runs under `krex run`; its guardian resumes it when the controller dies
        hog_a = w.krex_run([SNIP / "hog"], SNIPPET_MS="30000", SNIPPET_US="200")
        # B: a sibling without a guardian; only the restarted controller (state file) resumes it
        hog_b = w.preload([SNIP / "hog"], SNIPPET_MS="30000", SNIPPET_US="200")
        time.sleep(0.6)
        owner = w.preload([SNIP / "region"], SNIPPET_REGIONS="1", SNIPPET_N="1", SNIPPET_HOLD_US="60000000")
        pid_a = None
        if wait_until(lambda: state(hog_b.pid) == "T", 10):
            kids = [int(p) for p in Path(f"/proc/{hog_a.pid}/task/{hog_a.pid}/children").read_text().split()]
            pid_a = kids[0] if kids else None
            wait_until(lambda: pid_a is None or state(pid_a) == "T", 5)
            t0 = time.monotonic()
            w.ctl.kill()
            w.ctl.wait()
            t1 = wait_until(lambda: pid_a is None or state(pid_a) not in ("T", "t"), 5)
            guardian.append((t1 or t0 + 99) - t0)
            t3 = wait_until(lambda: state(hog_b.pid) not in ("T", "t"), 5)
            restart.append((t3 or t0 + 99) - t0)
            wait_until(w.answers, 10)        # the guardian starts a controller again on the socket
            w.start_if_gone()
        stuck += len(stopped_descendants_left([p for p in (pid_a, hog_b.pid) if p]))
        for p in (owner, hog_b, hog_a):
            p.kill()
            p.wait()
        if pid_a and state(pid_a):
            os.kill(pid_a, signal.SIGKILL)
        w.stop()
    return {"iterations": n, "left_stopped": stuck, "guardian_resume_ms": summary_ms(guardian),
            "resumer_resume_ms": summary_ms(restart)}


def fuzz(frames: int, tmp: Path, seed: int = 1) -> dict:
    """One fuzzed frame per connection (after a valid HELLO on 70% of them), so every frame is parsed."""
    w = World(tmp / "fuzz")
    rng = random.Random(seed)
    hello = frames.encode("struct krex_hello", magic=frames.MAGIC, version=frames.VERSION, role=C.KREX_ROLE_PYTHON, job=0)
    kinds = {"random": 0, "truncated": 0, "oversized": 0, "wrong_version": 0, "unknown_type": 0, "valid_struct": 0}
    rss0 = _rss_kb(w.ctl.pid)
    errors = closed = 0
    t0 = time.monotonic()
    for _ in range(frames):
        k = rng.choice(list(kinds))
        kinds[k] += 1
        if k == "random":
            frame = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 64)))
        elif k == "truncated":
            t = rng.choice(list(frames.MESSAGES))
            frame = struct.pack("<IHHII", frames.MAGIC, t, 0, rng.randint(1, 40), 0) + b"x" * rng.randint(0, 3)
        elif k == "oversized":
            frame = struct.pack("<IHHII", frames.MAGIC, MSG["JSON"], 0, frames.MAX_PAYLOAD + rng.randint(1, 1 << 30), 0)
        elif k == "wrong_version":
            frame = frames.pack(MSG["HELLO"], frames.encode("struct krex_hello", magic=frames.MAGIC,
                                                          version=rng.randint(2, 1 << 31), role=1, job=0))
        elif k == "unknown_type":
            frame = frames.pack(rng.randint(13, 0xFFFF), b"\0" * rng.randint(0, 32))
        else:
            t = rng.choice([MSG["CONTEXT"], MSG["REGION_END"], MSG["DRAINED"], MSG["JSON"], MSG["REGION_BEGIN"]])
            frame = frames.pack(t, bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 96))))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        try:
            s.connect(str(w.sock))
            s.sendall((frames.pack(MSG["HELLO"], hello) if rng.random() < 0.7 else b"") + frame)
            s.shutdown(socket.SHUT_WR)
            while True:
                data = s.recv(65536)
                if not data:
                    closed += 1
                    break
                errors += data.count(struct.pack("<IH", frames.MAGIC, MSG["ERROR"]))
        except OSError:
            closed += 1
        finally:
            s.close()
    elapsed = time.monotonic() - t0
    alive = w.ctl.poll() is None and w.answers()
    rss1 = _rss_kb(w.ctl.pid)
    out = subprocess.run([str(SNIP / "region")], env=dict(w.env, LD_PRELOAD=str(SHIM), SNIPPET_REGIONS="1"),
                         capture_output=True, text=True, timeout=30)
    w.stop()
    return {"frames": frames, "kinds": kinds, "connections_closed": closed, "error_replies": errors,
            "controller_alive": alive, "region_after": "begin=0 end=0" in out.stdout,
            "controller_rss_kb_before": rss0, "controller_rss_kb_after": rss1, "seconds": round(elapsed, 1)}


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def load(clients: int, regions: int, tmp: Path) -> dict:
    w = World(tmp / "load")
    hogs = [w.krex_run([SNIP / "hog"], SNIPPET_MS=str(10 ** 7), SNIPPET_US="300", SNIPPET_STREAMS="2") for _ in range(2)]
    time.sleep(0.8)
    t0 = time.monotonic()
    owners = [w.krex_run([SNIP / "region"], report=w.tmp / f"o{i}.json", SNIPPET_REGIONS=str(regions), SNIPPET_N="1",
                         SNIPPET_US="100") for i in range(clients)]
    deadlocked = 0
    for p in owners:
        try:
            p.wait(timeout=max(600, clients * regions * 0.05))
        except subprocess.TimeoutExpired:
            deadlocked += 1
            p.kill()
    elapsed = time.monotonic() - t0
    for h in hogs:
        h.send_signal(signal.SIGTERM)
        h.wait(30)
    w.stop()
    regs = []
    for i in range(clients):
        f = w.tmp / f"o{i}.json"
        if f.exists():
            regs += json.loads(f.read_text())["regions"]
    spans = sorted((r["granted_ns"], r["ended_ns"]) for r in regs if r["granted_ns"])
    hog_kernels, violations = _trace_hits(w.tmp / "trace", spans)
    overlaps = sum(1 for a, b in zip(spans, spans[1:]) if b[0] < a[1])
    waits = [(r["granted_ns"] - r["requested_ns"]) / 1e6 for r in regs if r["granted_ns"]]
    held = [(r["ended_ns"] - r["granted_ns"]) / 1e6 for r in regs if r["granted_ns"]]
    return {"clients": clients, "regions_per_client": regions, "regions_done": len(regs),
            "regions_expected": clients * regions, "deadlocked_clients": deadlocked, "hog_kernels": hog_kernels,
            "exclusivity_violations": violations, "overlapping_regions": overlaps, "seconds": round(elapsed, 1),
            "revoked": sum(1 for r in regs if r["end"] != "normal"),
            "regions_per_s": round(len(regs) / elapsed, 1), "wait_ms": summary_ms([x / 1e3 for x in waits]),
            "held_ms": summary_ms([x / 1e3 for x in held]),
            "wait_bound_ms": round((clients - 1) * max(held, default=0) + 50, 1)}


def worker_kill(n: int, tmp: Path) -> dict:
    """Warm workers killed in the middle of a command by a signal, n times, alternating with normal warm
    commands: the wrapper's exit status must be 128+N as for a cold command, nothing may stay stopped, and
    the zygote must keep supplying workers (how long until the next warm command has run)."""
    w = World(tmp / "worker_kill", "--warm-workers", "2", "--worker-preload", "json")
    fakes = {"LD_LIBRARY_PATH": str(ROOT / "build" / "fakes")}
    ready = "import os, sys; print(os.getppid(), os.getpid(), flush=True); sys.stdin.readline()"
    first = w.krex_run([sys.executable, "-c", "pass"], **fakes)
    first.communicate(timeout=60)
    zygote = None
    wrong_status, cold, recover = 0, 0, []
    kinds = [signal.SIGKILL, signal.SIGSEGV, signal.SIGTERM, signal.SIGABRT]
    for i in range(n):
        p = subprocess.Popen([sys.executable, "-m", "krex_ctl", "run", "--", sys.executable, "-c", ready],
                             env=dict(w.env, **fakes), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        ppid, pid = (int(x) for x in p.stdout.readline().split())
        zygote = zygote or ppid
        if ppid != zygote:
            cold += 1                                # no worker came within KREX_WARM_WAIT
        sig = kinds[i % len(kinds)]
        t0 = time.monotonic()
        os.kill(pid, sig)
        p.stdin.close()
        p.wait(60)
        if p.returncode != 128 + sig:
            wrong_status += 1
        ok = w.krex_run([sys.executable, "-c", "import os; print(os.getppid())"], **fakes)
        ok.communicate(timeout=60)
        if ok.returncode == 0:
            recover.append(time.monotonic() - t0)
    left = [int(x) for x in subprocess.run(["pgrep", "-f", "krex_ctl.worker"], capture_output=True,
                                           text=True).stdout.split()]
    stopped = stopped_descendants_left(left)
    zygote_alive = zygote is not None and state(zygote) is not None
    w.stop()
    gone = wait_until(lambda: not any(state(x) for x in left), 15, 0.05) is not None
    return {"iterations": n, "wrong_exit_status": wrong_status, "ran_cold": cold, "left_stopped": len(stopped),
            "zygote_alive_after": zygote_alive, "pool_gone_after_controller_stop": gone,
            "next_command_ms": summary_ms(recover)}


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_per_s(pid: int, settle_s: float = 0.5, window_s: float = 2.0) -> float:
    """CPU seconds pid uses per second over window_s, after settle_s for what was under way to pass."""
    time.sleep(settle_s)
    c0 = _cpu_s(pid)
    time.sleep(window_s)
    return round((_cpu_s(pid) - c0) / window_s, 3)


def _idle_connections(sock: Path, n: int) -> list:
    """n connections that never send anything (each connect blocks until the controller takes it: a Python
    timeout would make it non-blocking, and a full backlog then fails it at once with EAGAIN)."""
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(str(sock))
        except OSError:
            s.close()
            continue
        out.append(s)
    return out


def flood(n: int, tmp: Path) -> dict:
    import resource

    out = {"idle_connections": n}
    w = World(tmp / "flood")
    hog = w.krex_run([SNIP / "hog"], SNIPPET_MS="60000", SNIPPET_US="200")
    time.sleep(0.8)
    idle = _idle_connections(w.sock, n)
    out["connected"] = len(idle)
    out["controller_cpu_s_per_s"] = _cpu_per_s(w.ctl.pid)
    rep = w.tmp / "r.json"
    owner = w.krex_run([SNIP / "region"], report=rep, SNIPPET_REGIONS="3")
    owner.communicate(timeout=120)
    regions = json.loads(rep.read_text())["regions"] if rep.exists() else []
    out["command_regions"] = len(regions)
    out["command_regions_exclusive_with_sibling_frozen"] = sum(r["exclusive"] and r["frozen"] == 1 for r in regions)
    st = json.loads(subprocess.run([sys.executable, "-m", "krex_ctl", "status", "--json"], env=w.env,
                                   capture_output=True, text=True, timeout=30).stdout)
    out["refused_connections"] = st["counters"]["refused_connections"]
    for s in idle:
        s.close()
    hog.kill()
    hog.wait()
    w.stop()
    # the same under a 256-descriptor limit: no busy loop on a listener it cannot serve, a bounded log
    lim = World(tmp / "flood256", preexec=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256)),
                log_level="info")
    log = lim.tmp / "ctl.log"
    idle = _idle_connections(lim.sock, n)
    out["fd256_connected"] = len(idle)
    out["fd256_controller_cpu_s_per_s"] = _cpu_per_s(lim.ctl.pid)
    for s in idle:
        s.close()
    r = subprocess.run([str(SNIP / "region")], env=dict(lim.env, LD_PRELOAD=str(SHIM), SNIPPET_REGIONS="1"),
                       capture_output=True, text=True, timeout=60)
    out["fd256_region_after"] = "begin=0 end=0" in r.stdout
    lim.stop()
    out["fd256_log_lines"] = len(log.read_text().splitlines())
    return out


def _trace_hits(trace: Path, spans: list) -> tuple[int, int]:
    """(hog kernels, those that ran inside one of the spans)"""
    import bisect

    spans = sorted(spans)
    starts = [a for a, _ in spans]
    hits = total = 0
    if not trace.exists():
        return 0, 0
    for line in trace.read_text().splitlines():
        _pid, _sid, s, e, name = line.split(" ")[:5]   # key=value fields may follow the name
        if name != "hog":
            continue
        total += 1
        s, e = int(s), int(e)
        i = bisect.bisect_left(starts, e)
        if any(s < spans[j][1] and e > spans[j][0] for j in range(max(0, i - 2), min(len(spans), i + 1))):
            hits += 1
    return total, hits


def stall(n: int, tmp: Path) -> dict:
    """n stalls of 3 s (past the shim's 2 s handshake timeout), each met by a new GPU process that connects
    during the stall and runs a region every 100 ms: its regions in the stall must be reported unprotected,
    and it must be granted regions again once the controller answers."""
    from krex_ctl.wire.counters import create_counters, read_local_regions

    w = World(tmp / "stall")
    hog = w.krex_run([SNIP / "hog"], SNIPPET_MS=str(10 ** 7), SNIPPET_US="300", SNIPPET_STREAMS="2")
    time.sleep(0.8)
    recs, back, unreported = [], [], 0
    for i in range(n):
        counters = w.tmp / f"owner{i}.counters"
        create_counters(counters)
        w.ctl.send_signal(signal.SIGSTOP)
        owner = w.preload([SNIP / "region"], KREX_JOB="999", KREX_COUNTERS=str(counters), SNIPPET_REGIONS="50",
                          SNIPPET_GAP_US="100000", SNIPPET_N="1", SNIPPET_US="500")
        time.sleep(3.0)
        w.ctl.send_signal(signal.SIGCONT)
        resumed = time.monotonic_ns()
        owner.wait(timeout=120)
        mine, _ = read_local_regions(counters)
        unreported += 50 - len(mine)
        recs += mine
        later = [r["granted_ns"] for r in mine if r["flags"] & C.KREX_REGION_EXCLUSIVE and r["granted_ns"] > resumed]
        if later:
            back.append((min(later) - resumed) / 1e9)
    excl = [r for r in recs if r["flags"] & C.KREX_REGION_EXCLUSIVE]
    total, hits = _trace_hits(w.tmp / "trace", [(r["granted_ns"], r["ended_ns"]) for r in excl])
    hog.kill()
    hog.wait()
    w.stop()
    return {"stalls": n, "regions": len(recs), "exclusive": len(excl),
            "unprotected_reported": sum(bool(r["taints"] & C.KREX_TAINT_NOT_GRANTED) for r in recs),
            "unreported": unreported, "hog_kernels": total, "hog_kernels_in_exclusive_regions": hits,
            "granted_again_after_resume_ms": summary_ms(back)}


def restart(n: int, tmp: Path) -> dict:
    """The controller SIGKILLed n times under a region loop with a busy sibling, both under `krex run`."""
    w = World(tmp / "restart")
    hog = w.krex_run([SNIP / "hog"], SNIPPET_MS=str(10 ** 7), SNIPPET_US="300", SNIPPET_STREAMS="2")
    time.sleep(0.8)
    rep = w.tmp / "r.json"
    regions = n * 40 + 20     # a region every ~100 ms, a kill every ~4 s
    owner = w.krex_run([SNIP / "region"], report=rep, SNIPPET_REGIONS=str(regions), SNIPPET_GAP_US="100000",
                       SNIPPET_N="1", SNIPPET_US="500")
    time.sleep(1.5)
    kills, back, pids = [], [], []
    for _ in range(n):
        st = json.loads(subprocess.run([sys.executable, "-m", "krex_ctl", "status", "--json"], env=w.env,
                                       capture_output=True, text=True, timeout=30).stdout)
        pid = st["controller"]["pid"]
        os.kill(pid, signal.SIGKILL)
        kills.append(time.monotonic())
        wait_until(lambda: not w.answers(), 5, 0.0002)         # the old one is gone
        t = wait_until(w.answers, 15, 0.002)                     # a guardian has started another
        back.append((t or kills[-1] + 99) - kills[-1])
        pids.append(pid)
        # past the 2 s after a restart in which regions are not exclusive (unregistered.RECONNECT_GRACE_S)
        time.sleep(4.0)
    owner.wait(timeout=regions * 0.3 + 60)
    recs = json.loads(rep.read_text())["regions"] if rep.exists() else []
    excl = [r for r in recs if r["exclusive"] and r.get("granted_ns")]
    total, hits = _trace_hits(w.tmp / "trace", [(r["granted_ns"], r["ended_ns"]) for r in excl])
    exclusive_again = []
    for t in kills:
        later = [r["granted_ns"] / 1e9 for r in excl if r["granted_ns"] / 1e9 > t]
        if later:
            exclusive_again.append(min(later) - t)
    hog.kill()
    hog.wait()
    w.ctl = subprocess.Popen(["true"])
    w.stop()
    return {"kills": n, "regions": len(recs), "regions_expected": regions, "exclusive": len(excl),
            "not_exclusive_reported": len(recs) - len(excl), "hog_kernels": total,
            "hog_kernels_in_exclusive_regions": hits, "controller_again_ms": summary_ms(back),
            "exclusive_region_again_ms": summary_ms(exclusive_again)}


def interrupt(n: int, tmp: Path) -> dict:
    """Ctrl-C n times while waiting behind another job's region."""
    w = World(tmp / "interrupt")
    code = ("import sys, time, krex\nprint('w', flush=True)\ntry:\n    with krex.region('x'):\n        pass\n"
            "except KeyboardInterrupt:\n    print('i', flush=True)\n    time.sleep(5)\n")
    ghosts, waits = 0, []
    for _ in range(n):
        holder = w.preload([SNIP / "region"], SNIPPET_REGIONS="1", SNIPPET_HOLD_US="800000")
        wait_until(lambda: _status(w)["gpus"] and any(g["owner"] for g in _status(w)["gpus"]), 10, 0.01)
        p = subprocess.Popen([sys.executable, "-c", code], env=dict(w.env, LD_PRELOAD=str(SHIM)), stdout=subprocess.PIPE,
                             text=True)
        p.stdout.readline()
        wait_until(lambda: sum(len(g["queue"]) for g in _status(w)["gpus"]) == 1, 10, 0.01)
        p.send_signal(signal.SIGINT)
        p.stdout.readline()
        ghosts += sum(len(g["queue"]) for g in _status(w)["gpus"])
        holder.wait(30)
        t0 = time.monotonic()
        r = subprocess.run([str(SNIP / "region")], env=dict(w.env, LD_PRELOAD=str(SHIM), SNIPPET_REGIONS="1"),
                           capture_output=True, text=True, timeout=60)
        if "begin=0" in r.stdout:
            waits.append(time.monotonic() - t0)
        p.kill()
        p.wait()
    w.stop()
    return {"interrupts": n, "requests_left_behind": ghosts, "next_job_region_ms": summary_ms(waits)}


def _status(w) -> dict:
    return json.loads(subprocess.run([sys.executable, "-m", "krex_ctl", "status", "--json"], env=w.env,
                                     capture_output=True, text=True, timeout=30).stdout)


def daemon(n: int, tmp: Path) -> dict:
    latencies, stuck = [], 0
    for i in range(n):
        w = World(tmp / f"daemon{i}")
        pidfile = w.tmp / "d.pid"
        launch = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--", "sh", "-c",
                                 f"setsid sh -c 'echo $$ > {pidfile}; exec {SNIP / 'hog'}' </dev/null >/dev/null "
                                 "2>&1 & exit 0"], env=dict(w.env, SNIPPET_MS="30000"), timeout=60)
        wait_until(lambda: pidfile.exists() and pidfile.read_text().strip(), 10, 0.01)
        d = int(pidfile.read_text())
        wait_until(lambda: any(c["pid"] == d and c["gpus"] for c in _status(w)["clients"]), 10, 0.01)
        owner = w.preload([SNIP / "region"], SNIPPET_REGIONS="1", SNIPPET_HOLD_US="60000000")
        if wait_until(lambda: state(d) == "T", 10):
            t0 = time.monotonic()
            w.ctl.kill()
            w.ctl.wait()
            t1 = wait_until(lambda: state(d) not in ("T", "t"), 5)
            if t1 is None:
                stuck += 1
                os.kill(d, signal.SIGCONT)
            else:
                latencies.append(t1 - t0)
        owner.kill()
        owner.wait()
        os.kill(d, signal.SIGKILL)
        w.stop()
        del launch
    return {"iterations": n, "left_stopped": stuck, "resumed_ms": summary_ms(latencies)}


def _exclusive_hits(trace: Path, regs: list, foreign_pids=None) -> tuple[int, int]:
    """(regions reported exclusive with another process's kernel inside, such kernels)"""
    spans = [(r["granted_ns"], r["ended_ns"]) for r in regs if r.get("granted_ns") and r.get("exclusive")]
    own = {p for r in regs for p in r.get("pids", [])}
    bad_regions, bad_kernels = set(), 0
    if not trace.exists():
        return 0, 0
    for line in trace.read_text().splitlines():
        pid, _sid, start, end = line.split(" ", 4)[:4]
        pid, start, end = int(pid), int(start), int(end)
        if pid in own or (foreign_pids is not None and pid not in foreign_pids):
            continue
        for i, (g, e) in enumerate(spans):
            if start < e and end > g:
                bad_regions.add(i)
                bad_kernels += 1
    return len(bad_regions), bad_kernels


def refused(n: int, tmp: Path) -> dict:
    """Two fake GPUs; the controller takes max_clients: a region loop per GPU fills it, then refused hogs
    (preloaded, no wrapper) launch on both GPUs while the loops run n regions each."""
    cfg = tmp / "refused.json"
    cfg.write_text(json.dumps({"max_clients": 4}))
    w = World(tmp / "refused", "--config", str(cfg))
    go = w.tmp / "go"
    # both fake GPUs visible (World's commands see GPU 0 alone)
    owners = [w.krex_run([SNIP / "region"], report=w.tmp / f"o{g}.json", SNIPPET_REGIONS=str(n), SNIPPET_N="2",
                         SNIPPET_US="300", SNIPPET_DEVICE=str(g), SNIPPET_WAIT_FILE=str(go), CUDA_VISIBLE_DEVICES="0,1")
              for g in range(2)]
    time.sleep(3)
    hogs = [w.preload([SNIP / "hog"], SNIPPET_MS=str(10 ** 7), SNIPPET_US="200", SNIPPET_DEVICE=str(g),
                      CUDA_VISIBLE_DEVICES="0,1") for g in range(2)]
    time.sleep(1)
    go.write_text("")
    for p in owners:
        try:
            p.wait(timeout=max(300, n * 0.5))
        except subprocess.TimeoutExpired:
            p.kill()
    registered = wait_until(lambda: _all_connected([h.pid for h in hogs]), 30, 0.1) is not None
    for h in hogs:
        h.kill()
        h.wait()
    w.stop()
    regs = [r for g in range(2) if (w.tmp / f"o{g}.json").exists() for r in json.loads((w.tmp / f"o{g}.json").read_text())["regions"]]
    bad, kernels = _exclusive_hits(w.tmp / "trace", regs, {h.pid for h in hogs})
    return {"regions": len(regs), "exclusive": sum(r["exclusive"] for r in regs),
            "most_refused_kernels_in_a_region_per_stream": _most_inside(w.tmp / "trace", regs, {h.pid for h in hogs}),
            "tainted_unregistered": sum("unregistered" in r["taints"] for r in regs),
            "exclusive_with_refused_kernels": bad, "refused_kernels_in_exclusive": kernels,
            "refused_registered_after": registered}


def _most_inside(trace: Path, regs: list, pids: set) -> int:
    """The most kernels one stream of those processes ran inside one region, on the region's GPUs: a process
    that waits at closed gates but is drained by nobody carries in only what it had queued (the hog: 4)."""
    import bisect

    spans = sorted((r["granted_ns"], r["ended_ns"], i) for i, r in enumerate(regs) if r.get("granted_ns"))
    starts = [a for a, _, _ in spans]
    counts: dict = {}
    if not trace.exists():
        return 0
    for line in trace.read_text().splitlines():
        pid, sid, start, end, rest = line.split(" ", 4)
        if int(pid) not in pids:
            continue
        start, end = int(start), int(end)
        gpu = next((int(f[4:]) for f in rest.split(" ")[1:] if f.startswith("gpu=")), None)
        j = bisect.bisect_left(starts, end)
        for a, b, i in spans[max(0, j - 4):j]:
            if start < b and end > a and (gpu is None or gpu in regs[i]["gpu"]):
                counts[(i, pid, sid)] = counts.get((i, pid, sid), 0) + 1
    return max(counts.values(), default=0)


def _all_connected(pids) -> bool:
    return all(_connected(p) for p in pids)


def two_controllers(n: int, tmp: Path) -> dict:
    w = World(tmp / "two")
    other = tmp / "two" / "other.sock"
    octl = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(other), "--state-file",
                             str(tmp / "two" / "other.state"), "--no-cpu-isolation", "--log-level", "error"],
                            env=w.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: answers(other), 20, 0.01)
    hog = w.krex_run([SNIP / "hog"], KREX_SOCKET=str(other), SNIPPET_MS=str(10 ** 7), SNIPPET_US="200")
    time.sleep(1)
    owner = w.krex_run([SNIP / "region"], report=w.tmp / "o.json", SNIPPET_REGIONS=str(n), SNIPPET_N="2",
                       SNIPPET_US="300")
    owner.wait(timeout=max(300, n))
    hog.kill()
    hog.wait()
    octl.terminate()
    octl.wait(20)
    w.stop()
    regs = json.loads((w.tmp / "o.json").read_text())["regions"] if (w.tmp / "o.json").exists() else []
    bad, kernels = _exclusive_hits(w.tmp / "trace", regs)
    return {"regions": len(regs), "tainted_other_controller": sum("other_controller" in r["taints"] for r in regs),
            "exclusive_with_foreign_kernels": bad, "foreign_kernels_in_exclusive": kernels}


def paths(n: int, tmp: Path) -> dict:
    """Each attack once (n is ignored): the controller's or `krex run`'s answer, and whether anything was lost."""
    d = tmp / "paths"
    d.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "LD_PRELOAD"}
    env.update(PYTHONPATH=str(ROOT), XDG_RUNTIME_DIR=str(d), KREX_REGISTRY_DIR=str(d))

    def ctl(sock):
        return subprocess.run([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(sock), "--state-file",
                               str(d / "s.state"), "--no-cpu-isolation"], env=env, capture_output=True, text=True, timeout=60)

    def run(sock):
        return subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--", "true"], env=dict(env, KREX_SOCKET=str(sock)),
                              capture_output=True, text=True, timeout=60)

    out = {}

    def judge(name, r, kept):
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("krex: ")]
        out[name] = {"exit": r.returncode, "one_line": len(lines) == 1 and "Traceback" not in r.stderr,
                     "nothing_lost": kept(), "line": lines[0] if lines else r.stderr[-200:]}

    f = d / "data.txt"
    f.write_text("precious")
    judge("controller_socket_at_a_file", ctl(f), lambda: f.read_text() == "precious")
    judge("run_socket_at_a_file", run(f), lambda: f.read_text() == "precious")
    secret = d / "secret"
    secret.write_text("secret")
    os.chmod(secret, 0o600)
    rt = d / "rt"
    rt.mkdir(mode=0o700)
    (rt / "krex.sock.log").symlink_to(secret)
    judge("run_log_linked", run(rt / "krex.sock"), lambda: secret.read_text() == "secret")
    (rt / "krex.sock.log").unlink()
    (rt / "krex.sock.lock").symlink_to(secret)
    judge("controller_lock_linked", ctl(rt / "krex.sock"), lambda: secret.read_text() == "secret")
    (rt / "krex.sock.lock").unlink()
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, time\n"
                               f"fd = os.open({str(rt / 'krex.sock.lock')!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    holder.stdout.readline()
    judge("controller_lock_planted", ctl(rt / "krex.sock"), lambda: True)
    holder.kill()
    holder.wait()
    if os.geteuid() == 0:
        ww = d / "ww"
        ww.mkdir()
        os.chmod(ww, 0o777)
        judge("node_controller_world_writable_dir", ctl(ww / "krex.sock"), lambda: True)
    out["all_refused_in_one_line_nothing_lost"] = all(v["one_line"] and v["nothing_lost"] for v in out.values()
                                                      if isinstance(v, dict))
    return out


def wrapper_kill(n: int, tmp: Path) -> dict:
    w = World(tmp / "wkill")
    left, trees = 0, 0
    for i in range(n):
        p = w.krex_run(["sh", "-c", f"{SNIP / 'hog'}; true"], SNIPPET_MS=str(10 ** 7), SNIPPET_US="200")
        from krex_ctl.procs import descendants
        if wait_until(lambda: any(_comm(q) == "hog" for q in descendants(p.pid)), 60, 0.01) is None:
            p.kill()
            continue
        tree = descendants(p.pid)
        p.kill()
        p.wait()
        trees += 1
        wait_until(lambda: not any(state(q) not in (None, "Z", "X") for q in tree), 10, 0.01)
        alive = [q for q in tree if state(q) not in (None, "Z", "X")]
        left += len(alive)
        for q in alive:
            os.kill(q, signal.SIGKILL)
    counters_left_before_next_start = len(list((w.tmp / "krex").glob("job-*.counters")))
    subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--", "true"], env=w.env, capture_output=True, timeout=60)
    counters_left = len(list((w.tmp / "krex").glob("job-*.counters")))
    w.stop()
    return {"wrappers_killed": trees, "processes_left_running": left,
            "counters_files_before_next_start": counters_left_before_next_start,
            "counters_files_after_next_start": counters_left}


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def memory(n: int, tmp: Path) -> dict:
    w = World(tmp / "mem")
    time.sleep(0.5)
    rss0 = _rss_kb(w.ctl.pid)
    p = w.krex_run([SNIP / "region"], report=w.tmp / "m.json", SNIPPET_REGIONS=str(n), SNIPPET_N="1", SNIPPET_US="10")
    p.wait(timeout=max(600, n * 0.05))
    rss1 = _rss_kb(w.ctl.pid)
    regs = json.loads((w.tmp / "m.json").read_text())["regions"] if (w.tmp / "m.json").exists() else []
    w.stop()
    return {"regions": n, "reported": len(regs), "rss_before_kb": rss0, "rss_after_job_kb": rss1,
            "bytes_per_region": round((rss1 - rss0) * 1024 / max(1, n), 1)}


def _trace_kernels(trace: Path) -> list:
    """(pid, start_ns, end_ns, gpu) of each kernel in the fake driver's trace; gpu None where the line names
    none (a trace from before the fake wrote gpu=: then the kernel counts for every GPU)"""
    out = []
    if not trace.exists():
        return out
    for line in trace.read_text().splitlines():
        pid, _sid, start, end, rest = line.split(" ", 4)
        gpu = next((int(f[4:]) for f in rest.split(" ")[1:] if f.startswith("gpu=")), None)
        out.append((int(pid), int(start), int(end), gpu))
    return out


def _foreign_in_exclusive(kernels: list, regs: list) -> tuple[int, int]:
    """(regions reported exclusive with another process's kernel inside on one of the region's GPUs, such
    kernels): whatever that process was (a neighbour, another owner, an unregistered one)"""
    import bisect

    by_gpu: dict = {}
    for i, r in enumerate(regs):
        if r.get("granted_ns") and r.get("exclusive"):
            for g in r["gpu"]:
                by_gpu.setdefault(g, []).append((r["granted_ns"], r["ended_ns"], i))
    for spans in by_gpu.values():
        spans.sort()
    starts = {g: [a for a, _, _ in spans] for g, spans in by_gpu.items()}
    members = [set(r.get("pids", [])) | {r.get("pid")} for r in regs]
    bad_regions, bad_kernels = set(), 0
    for pid, start, end, gpu in kernels:
        hit = False
        for g in (by_gpu if gpu is None else (gpu,)):
            spans = by_gpu.get(g)
            if not spans:
                continue
            j = bisect.bisect_left(starts[g], end) - 1
            # spans on one GPU do not overlap (overlapping_regions counts it if they do): a few back suffice
            for a, b, i in spans[max(0, j - 3):j + 1]:
                if start < b and end > a and pid not in members[i]:
                    bad_regions.add(i)
                    hit = True
        bad_kernels += hit
    return len(bad_regions), bad_kernels


def _overlapping_on_a_gpu(regs: list) -> int:
    """pairs of granted regions that share a GPU and were held at the same time"""
    n = 0
    by_gpu: dict = {}
    for r in regs:
        if r.get("granted_ns"):
            for g in r["gpu"]:
                by_gpu.setdefault(g, []).append((r["granted_ns"], r["ended_ns"]))
    for spans in by_gpu.values():
        spans.sort()
        n += sum(1 for a, b in zip(spans, spans[1:]) if b[0] < a[1])
    return n


def _frozen_while_holding_records(regs: list) -> int:
    """from the records alone: regions whose members another region, held at the same time, froze"""
    held = sorted((r["granted_ns"], r["ended_ns"], set(r.get("pids", [])), set(r.get("frozen_pids", [])))
                  for r in regs if r.get("granted_ns"))
    n = 0
    for k, (a0, a1, _pa, fa) in enumerate(held):
        if not fa:
            continue
        for b0, b1, pb, _fb in held:
            if b0 < a1 and b1 > a0 and fa & pb:
                n += 1
    return n


class FrozenOwnerWatch:
    """Samples the controller's status every interval: a region owner or member in state T while the same
    region is still its own at the next look is counted (region id, pid) once: frozen while holding."""

    def __init__(self, sock: Path, interval: float = 0.1):
        import threading

        self.sock, self.interval = sock, interval
        self.seen: set = set()
        self.samples = 0
        self.stop_ev = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def holders(self, conn) -> dict:
        from krex_ctl.wire import ops

        st = conn.request(ops.STATUS, timeout=10)
        out = {}
        for g in st.get("gpus", []):
            o = g.get("owner")
            if o and o.get("state") == "held":
                for pid in set(o.get("members", [])) | {o["pid"]}:
                    out[pid] = o["region"]
        return out

    def run(self) -> None:
        conn = None
        while not self.stop_ev.wait(self.interval):
            try:
                conn = conn or client.Connection(str(self.sock), C.KREX_ROLE_CLI, timeout=5)
                now = self.holders(conn)
                self.samples += 1
                stopped = {p: r for p, r in now.items() if state(p) in ("T", "t")}
                if stopped:
                    again = self.holders(conn)
                    self.seen |= {(r, p) for p, r in stopped.items() if again.get(p) == r}
            except Exception:       # the controller went away (end of a run) or answered late
                if conn is not None:
                    conn.close()
                conn = None

    def close(self) -> int:
        self.stop_ev.set()
        self.thread.join(15)
        return len(self.seen)


def load2(clients: int, total_regions: int, tmp: Path, stuck_s: float = 30.0) -> dict:
    """The load goal on 2 fake GPUs: `clients` region loops under `krex run` (a quarter of them holding
    contexts on both GPUs, asking regions on GPU 0 or GPU 1 in turn, the rest on one GPU, half on each),
    total_regions regions in all, a busy neighbour launching on each GPU. Counts regions reported exclusive
    with another process's kernel inside on one of their GPUs (the trace's gpu= field), overlapping regions,
    clients without progress for stuck_s, owners seen stopped while holding their region, revoked regions."""
    w = World(tmp / "load2")
    both = max(1, clients // 4)
    hogs = [w.krex_run([SNIP / "hog"], CUDA_VISIBLE_DEVICES=str(g), SNIPPET_MS=str(10 ** 7), SNIPPET_US="300",
                       SNIPPET_STREAMS="2") for g in range(2)]
    time.sleep(1.0)
    owners, outs = [], []
    for i in range(clients):
        n = total_regions // clients + (1 if i < total_regions % clients else 0)
        env = dict(SNIPPET_REGIONS=str(n), SNIPPET_N="1", SNIPPET_US="100")
        if i < both:      # contexts on both GPUs, regions on GPU i % 2 (the other GPU's context stays held)
            g = i % 2
            env.update(CUDA_VISIBLE_DEVICES="0,1", SNIPPET_DEVICE=str(g), SNIPPET_ALSO_DEVICE=str(1 - g),
                       SNIPPET_GPUS=str(g))
        else:
            env.update(CUDA_VISIBLE_DEVICES=str(i % 2), SNIPPET_DEVICE="0")
        out = w.tmp / f"o{i}.out"
        outs.append(out)
        full = [sys.executable, "-m", "krex_ctl", "run", "--report", str(w.tmp / f"o{i}.json"), "--", str(SNIP / "region")]
        owners.append(subprocess.Popen(full, env=dict(w.env, **env), stdout=open(out, "w"), stderr=subprocess.DEVNULL))
    t0 = time.monotonic()
    watch = FrozenOwnerWatch(w.sock, 0.2)
    last = [(0, t0)] * clients
    stuck, longest_stall = set(), 0.0
    deadline = t0 + max(900, total_regions * 0.1)
    while time.monotonic() < deadline and any(p.poll() is None for p in owners):
        time.sleep(1.0)
        now = time.monotonic()
        for i, p in enumerate(owners):
            if p.poll() is not None:
                continue
            size = outs[i].stat().st_size
            if size != last[i][0]:
                last[i] = (size, now)
            stall = now - last[i][1]
            longest_stall = max(longest_stall, stall)
            if stall > stuck_s:
                stuck.add(i)
    unfinished = [i for i, p in enumerate(owners) if p.poll() is None]
    for i in unfinished:
        owners[i].kill()
        owners[i].wait()
    elapsed = time.monotonic() - t0
    frozen_seen = watch.close()
    for h in hogs:
        h.send_signal(signal.SIGTERM)
        h.wait(30)
    w.stop()
    regs, two_gpu = [], 0
    for i in range(clients):
        f = w.tmp / f"o{i}.json"
        if f.exists():
            mine = json.loads(f.read_text())["regions"]
            regs += mine
            two_gpu += len(mine) if i < both else 0
    kernels = _trace_kernels(w.tmp / "trace")
    bad_regions, bad_kernels = _foreign_in_exclusive(kernels, regs)
    granted = [r for r in regs if r["granted_ns"]]
    waits = [(r["granted_ns"] - r["requested_ns"]) / 1e9 for r in granted]
    return {"clients": clients, "two_gpu_owners": both, "gpus": 2, "regions_expected": total_regions,
            "regions_done": len(regs), "exclusive": sum(bool(r["exclusive"]) for r in regs),
            "two_gpu_owner_regions": two_gpu,
            "kernels_traced": len(kernels), "kernels_without_gpu": sum(k[3] is None for k in kernels),
            "exclusive_with_foreign_kernels": bad_regions, "foreign_kernels_in_exclusive": bad_kernels,
            "overlapping_regions": _overlapping_on_a_gpu(regs), "stuck_clients": len(stuck),
            "unfinished_clients": len(unfinished), "longest_stall_s": round(longest_stall, 1),
            "owners_seen_frozen_while_holding": frozen_seen, "status_samples": watch.samples,
            "frozen_while_holding_by_records": _frozen_while_holding_records(regs),
            "revoked": sum(1 for r in regs if r["end"] == "time_limit"),
            "not_normal_end": sum(1 for r in regs if r["end"] != "normal"),
            "taints": _taint_counts(regs), "seconds": round(elapsed, 1),
            "regions_per_s": round(len(regs) / max(elapsed, 1e-9), 1), "wait_ms": summary_ms(waits)}


def unconnected(n: int, tmp: Path, window_s: float = 3.0) -> dict:
    """n times: the socket moved away for window_s (connect() fails with ENOENT; the controller serves on) while
    a region loop of another job runs, and a busy GPU process started in the window; then the socket back.
    Counts regions reported exclusive with that process's kernels inside, regions tainted unregistered, and
    whether each process registered once it could."""
    w = World(tmp / "unconnected")
    rep = w.tmp / "r.json"
    owner = w.krex_run([SNIP / "region"], report=rep, SNIPPET_REGIONS=str(10 ** 6), SNIPPET_N="1", SNIPPET_US="500",
                       SNIPPET_GAP_US="20000")
    time.sleep(2.0)
    away = w.tmp / "away.sock"
    hogs, registered, windows = [], 0, []
    for _ in range(n):
        os.rename(w.sock, away)
        t0 = time.monotonic_ns()
        hog = w.preload([SNIP / "hog"], SNIPPET_MS=str(10 ** 7), SNIPPET_US="300", SNIPPET_STREAMS="2")
        hogs.append(hog)
        time.sleep(window_s)
        os.rename(away, w.sock)
        windows.append((t0, time.monotonic_ns()))
        registered += wait_until(lambda: _connected(hog.pid), 10, 0.01) is not None
        time.sleep(1.0)
    owner.send_signal(signal.SIGINT)
    try:
        owner.wait(60)
    except subprocess.TimeoutExpired:
        owner.kill()
    for h in hogs:
        h.kill()
        h.wait()
    w.stop()
    regs = json.loads(rep.read_text())["regions"] if rep.exists() else []
    kernels = [k for k in _trace_kernels(w.tmp / "trace") if k[0] in {h.pid for h in hogs}]
    bad_regions, bad_kernels = _foreign_in_exclusive(kernels, regs)
    in_window = [r for r in regs if r.get("granted_ns") and any(a < r["ended_ns"] and r["granted_ns"] < b
                                                               for a, b in windows)]
    return {"windows": n, "window_s": window_s, "regions": len(regs), "regions_in_windows": len(in_window),
            "in_windows_tainted_unregistered": sum("unregistered" in r["taints"] for r in in_window),
            "exclusive": sum(bool(r["exclusive"]) for r in regs), "unconnected_kernels": len(kernels),
            "exclusive_with_unconnected_kernels": bad_regions, "unconnected_kernels_in_exclusive": bad_kernels,
            "registered_after_window": registered}


def _taint_counts(regs: list) -> dict:
    out: dict = {}
    for r in regs:
        for t in r.get("taints", []):
            out[t] = out.get(t, 0) + 1
    return out


def gang_repeat(runs: int, tmp: Path, regions: int = 10, stuck_s: float = 3.0) -> dict:
    """The deadlock-prone set-up of tests/test_gang.py, runs times, each under a fresh controller: two owners
    with contexts on both fake GPUs looping regions on opposite GPUs, freezing on, and one single-GPU owner
    on each GPU. A run deadlocks when no owner makes progress for stuck_s or a region is revoked at its time
    limit; a run has a frozen owner when an owner was seen stopped while holding its region."""
    from krex_ctl.wire.counters import create_counters, read_local_regions

    stats = {"runs": runs, "runs_with_deadlock": 0, "runs_with_revoked_region": 0, "runs_with_no_progress": 0,
             "runs_with_owner_frozen": 0, "regions": 0,
             "regions_expected": runs * 4 * regions, "exclusive": 0, "exclusive_with_foreign_kernels": 0,
             "overlapping_regions": 0}
    walls = []
    for k in range(runs):
        w = World(tmp / f"gang{k}", "--region-time-limit", "2")
        t0 = time.monotonic()
        procs, outs, counters = [], [], []
        specs = [dict(CUDA_VISIBLE_DEVICES="0,1", SNIPPET_DEVICE=str(g), SNIPPET_ALSO_DEVICE=str(1 - g),
                      SNIPPET_GPUS=str(g)) for g in (0, 1)] + \
                [dict(CUDA_VISIBLE_DEVICES=str(g), SNIPPET_DEVICE="0") for g in (0, 1)]
        for i, spec in enumerate(specs):
            c = w.tmp / f"o{i}.counters"
            create_counters(c)
            counters.append(c)
            outs.append(w.tmp / f"o{i}.out")
            procs.append(subprocess.Popen([str(SNIP / "region")], stdout=open(outs[-1], "w"), stderr=subprocess.DEVNULL,
                                          env=dict(w.env, LD_PRELOAD=str(SHIM), KREX_COUNTERS=str(c),
                                                   SNIPPET_REGIONS=str(regions), SNIPPET_N="2", SNIPPET_US="5000",
                                                   SNIPPET_GAP_US="1000", **spec)))
        watch = FrozenOwnerWatch(w.sock, 0.02)
        last, stalled = (-1, time.monotonic()), False
        while any(p.poll() is None for p in procs):
            time.sleep(0.05)
            size = sum(o.stat().st_size for o in outs)
            if size != last[0]:
                last = (size, time.monotonic())
            elif time.monotonic() - last[1] > stuck_s:
                stalled = True
                break
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
        frozen = watch.close()
        w.stop()
        walls.append(time.monotonic() - t0)
        recs = [dict(r, pids=[r["pid"]]) for c in counters for r in read_local_regions(c)[0]]
        regs = [{"gpu": [g for g in range(64) if r["gpu_mask"] >> g & 1], "granted_ns": r["granted_ns"] or None,
                 "ended_ns": r["ended_ns"], "pid": r["pid"], "pids": r["pids"],
                 "exclusive": bool(r["flags"] & C.KREX_REGION_EXCLUSIVE)} for r in recs]
        revoked = sum(r["end_reason"] == C.KREX_END_TIME_LIMIT for r in recs)
        bad, _ = _foreign_in_exclusive(_trace_kernels(w.tmp / "trace"), regs)
        stats["runs_with_deadlock"] += bool(stalled or revoked)
        stats["runs_with_revoked_region"] += bool(revoked)
        stats["runs_with_no_progress"] += stalled
        stats["runs_with_owner_frozen"] += bool(frozen)
        stats["regions"] += len(regs)
        stats["exclusive"] += sum(r["exclusive"] for r in regs)
        stats["exclusive_with_foreign_kernels"] += bad
        stats["overlapping_regions"] += _overlapping_on_a_gpu(regs)
    stats["run_s"] = summary_ms(walls)
    stats["run_s"] = {k: (round(v / 1e3, 2) if k != "n" else v) for k, v in stats["run_s"].items()}
    return stats


def summary_ms(xs: list) -> dict:
    if not xs:
        return {"n": 0}
    xs = sorted(x * 1e3 for x in xs)
    return {"n": len(xs), "median": round(statistics.median(xs), 3), "p95": round(xs[int(0.95 * (len(xs) - 1))], 3),
            "max": round(xs[-1], 3)}


SECTIONS = {   # name -> how to run it with the command line's counts
    "owner_kill": lambda a, tmp: owner_kill(a.owner_kills, tmp),
    "controller_kill": lambda a, tmp: controller_kill(a.controller_kills, tmp),
    "fuzz": lambda a, tmp: fuzz(a.fuzz_frames, tmp),
    "load": lambda a, tmp: load(a.load_clients, a.load_regions, tmp),
    "worker_kill": lambda a, tmp: worker_kill(a.worker_kills, tmp),
    "flood": lambda a, tmp: flood(a.flood_connections, tmp),
    "stall": lambda a, tmp: stall(a.stalls, tmp),
    "restart": lambda a, tmp: restart(a.restarts, tmp),
    "interrupt": lambda a, tmp: interrupt(a.interrupts, tmp),
    "daemon": lambda a, tmp: daemon(a.daemons, tmp),
    "refused": lambda a, tmp: refused(a.refused_regions, tmp),
    "two_controllers": lambda a, tmp: two_controllers(a.two_controller_regions, tmp),
    "paths": lambda a, tmp: paths(0, tmp),
    "wrapper_kill": lambda a, tmp: wrapper_kill(a.wrapper_kills, tmp),
    "memory": lambda a, tmp: memory(a.memory_regions, tmp),
    "load2": lambda a, tmp: load2(a.load2_clients, a.load2_regions, tmp),
    "gang_repeat": lambda a, tmp: gang_repeat(a.gang_runs, tmp),
    "unconnected": lambda a, tmp: unconnected(a.unconnected_windows, tmp),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--owner-kills", type=int, default=1000)
    ap.add_argument("--controller-kills", type=int, default=20)
    ap.add_argument("--fuzz-frames", type=int, default=100000)
    ap.add_argument("--load-clients", type=int, default=64)
    ap.add_argument("--load-regions", type=int, default=1000)
    ap.add_argument("--worker-kills", type=int, default=100)
    ap.add_argument("--flood-connections", type=int, default=4100)
    ap.add_argument("--stalls", type=int, default=10)
    ap.add_argument("--restarts", type=int, default=10)
    ap.add_argument("--interrupts", type=int, default=50)
    ap.add_argument("--daemons", type=int, default=20)
    ap.add_argument("--refused-regions", type=int, default=2000)
    ap.add_argument("--two-controller-regions", type=int, default=2000)
    ap.add_argument("--wrapper-kills", type=int, default=20)
    ap.add_argument("--memory-regions", type=int, default=20000)
    ap.add_argument("--load2-clients", type=int, default=64)
    ap.add_argument("--load2-regions", type=int, default=20000, help="regions in all, over the clients")
    ap.add_argument("--gang-runs", type=int, default=100)
    ap.add_argument("--unconnected-windows", type=int, default=10)
    ap.add_argument("--only", default=",".join(SECTIONS))
    ap.add_argument("--out", required=True)
    ap.add_argument("--keep", default=None,
                    help="a directory for the scenarios' files (controller logs, reports), kept; else a temporary one")
    args = ap.parse_args()
    subprocess.run(["make", "-s", "shim", "fakes"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    out = {}
    if Path(args.out).exists() and args.only != ap.get_default("only"):
        out = json.loads(Path(args.out).read_text())      # a partial run updates its sections only
    out.update(machine={"cpus": os.cpu_count(), "host": os.uname().nodename}, argv=sys.argv)
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(args.keep or td)
        tmp.mkdir(parents=True, exist_ok=True)
        for name in args.only.split(","):
            t0 = time.monotonic()
            out[name] = SECTIONS[name](args, tmp)
            out[name]["wall_s"] = round(time.monotonic() - t0, 1)
            print(name, json.dumps(out[name]), flush=True)
    Path(args.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
