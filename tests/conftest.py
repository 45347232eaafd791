"""Fixtures: the native build, and an isolated controller per test with real processes and sockets."""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

import pytest

ROOT = Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
SNIP = BUILD / "snippets"
sys.path.insert(0, str(ROOT))
# the native build first, before anything of krex is imported here: build/krex_ffi.py (the wire declarations,
# krex_ctl/wire/cdefs.py) made by this very interpreter from this tree's header, so that the suite uses it
subprocess.run(["make", "-s", "shim", "fakes", f"PY={sys.executable}"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
from krex_ctl.commands.status import fetch as fetch_status  # noqa: E402
from krex_ctl.embedded import answers  # noqa: E402
from krex_ctl.procs import state as proc_state  # noqa: E402,F401  (tests import it from here)

# A suite started in the background of a non-interactive shell (`make test &`, nohup) inherits SIGINT and SIGQUIT
# (nohup: SIGHUP) ignored, and so would every process a test starts: a Python child then never gets
# KeyboardInterrupt, the tests of Ctrl-C (status --watch, a wrapper interrupted while waiting) hang until their
# timeout, and a wrapper passes on to its warm command that it was started with them ignored. A handler here is
# reset to the default in each exec'd child.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
for _sig in (signal.SIGQUIT, signal.SIGHUP):
    if signal.getsignal(_sig) is signal.SIG_IGN:
        signal.signal(_sig, signal.SIG_DFL)


def wait_for(pred, timeout=10.0, interval=0.02, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def stderr_until(proc, text: str, timeout: float = 60.0) -> str:
    """proc's stderr up to its first whole line with text in it (all of it, if none comes before the stream ends
    or timeout seconds have passed), read from the descriptor (nothing is buffered: proc.communicate() returns the
    rest)."""
    import select

    data, deadline = b"", time.monotonic() + timeout
    while not any(text.encode() in line and line.endswith(b"\n") for line in data.splitlines(True)):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([proc.stderr.fileno()], [], [], left)[0]:
            break
        chunk = os.read(proc.stderr.fileno(), 65536)
        if not chunk:
            break
        data += chunk
    return data.decode(errors="replace")


@pytest.fixture
def short_tmp():
    """A directory of a short path in the system's temporary directory (sockets made a few levels under it stay
    within AF_UNIX's 107 bytes, where ones under tmp_path may not), removed after the test."""
    d = Path(tempfile.mkdtemp(prefix="krex-t-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def new_user_env(tmp_path: Path) -> dict:
    """This environment as a new user's shell has it (no krex variables, no LD_PRELOAD), with krex importable and
    a node registry of the test's own: a controller another test runs beside it (make test runs two at once), or
    anyone's on this machine, must not taint its regions other_controller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "LD_PRELOAD"}
    (tmp_path / "registry").mkdir(exist_ok=True)
    env.update(PYTHONPATH=str(ROOT), KREX_REGISTRY_DIR=str(tmp_path / "registry"))
    return env


def stopped_processes_under(marker: str) -> list[int]:
    """Processes in state T whose command line mentions marker (a test's private directory)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{name}/cmdline").read_bytes().decode(errors="replace")
            env = Path(f"/proc/{name}/environ").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if (marker in cmd or marker in env) and proc_state(int(name)) in ("T", "t"):
            out.append(int(name))
    return out


class Krex:
    """One isolated krex world: its own controller socket, state file, trace file and environment."""

    def __init__(self, tmp: Path):
        self.dir = tmp
        self.socket = tmp / "ctl.sock"
        self.trace = tmp / "trace"
        self.state_file = tmp / "ctl.state"
        self.env = dict(os.environ)
        for k in list(self.env):
            if k.startswith("KREX_") or k == "LD_PRELOAD":
                del self.env[k]
        self.nvml = tmp / "nvml"          # the fake NVML's control file (tests/fakes/fake_nvml.c)
        self.nvml.write_text("")
        self.env.update(KREX_SOCKET=str(self.socket), KREX_FAKE_TRACE=str(self.trace), KREX_LOG_LEVEL="warning",
                        PYTHONPATH=str(ROOT), XDG_RUNTIME_DIR=str(tmp), KREX_NVML=str(BUILD / "fakes" / "libnvidia-ml.so.1"),
                        KREX_FAKE_NVML=str(self.nvml))
        # the tests' commands share GPU 0 as siblings, as devices of their own (a command that names no GPU
        # keeps its caller's CUDA_VISIBLE_DEVICES); the placement tests (test_placement.py) drop it
        self.env["CUDA_VISIBLE_DEVICES"] = "0"
        self.registry = tmp / "registry"  # the node-wide registry of controllers (krex_ctl/registry.py), per test
        self.registry.mkdir()
        self.env["KREX_REGISTRY_DIR"] = str(self.registry)
        # a hog (tests/snippets/hog.c) runs SNIPPET_MS, long enough to outlive what it neighbours on a loaded
        # machine; a test done with its hogs ends them sooner with stop_hogs()
        self.hog_stop = tmp / "hogs.stop"
        self.env["SNIPPET_STOP"] = str(self.hog_stop)
        self.ctl = None
        self.ctl_log = tmp / "controller.log"

    def start_controller(self, *args: str, preexec_fn=None, state_file=None, default_freeze=False,
                         prelude: str = "") -> subprocess.Popen:
        """The controller, with --freeze-policy all unless args choose a policy or default_freeze: these tests
        follow siblings through the freeze whatever work they have in flight (the default, busy, stops only
        those with work left at the drain: test_regions' default-policy test)."""
        log = open(self.ctl_log, "ab")
        cpus = sorted(os.sched_getaffinity(0))
        reserved = [] if any(a.startswith("--reserved-cores") for a in args) else ["--reserved-cores", str(cpus[-1])]
        if not default_freeze and not any(a in ("--freeze-policy", "--no-freeze") for a in args):
            reserved += ["--freeze-policy", "all"]
        # prelude: Python run in the controller's process before it starts (a test's stand-in for what it cannot
        # make happen for real, e.g. a process that stays on its way out)
        launch = ["-c", prelude + "\nfrom krex_ctl.cli import main\nmain()"] if prelude else ["-m", "krex_ctl"]
        self.ctl = subprocess.Popen(
            [sys.executable, *launch, "controller", "--socket", str(self.socket), "--state-file",
             str(state_file or self.state_file), *reserved, *args], env=self.env, stdout=log, stderr=log,
            preexec_fn=preexec_fn)
        wait_for(self.answers, what="controller socket")
        return self.ctl

    def answers(self) -> bool:
        return answers(self.socket)

    def run_cmd(self, cmd, report=None, env=None, **kw) -> list[str]:
        full = [sys.executable, "-m", "krex_ctl", "run"]
        if report:
            full += ["--report", str(report)]
        return full + ["--"] + [str(c) for c in cmd]

    def run(self, cmd, report=None, env=None, timeout=60, **kw) -> subprocess.CompletedProcess:
        e = dict(self.env, **(env or {}))
        return subprocess.run(self.run_cmd(cmd, report), env=e, capture_output=True, text=True, timeout=timeout, **kw)

    def popen(self, cmd, report=None, env=None, **kw) -> subprocess.Popen:
        e = dict(self.env, **(env or {}))
        return subprocess.Popen(self.run_cmd(cmd, report), env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, **kw)

    def python(self, code: str, preload: bool = True, name: str = "script.py") -> subprocess.CompletedProcess:
        """Run Python code under `krex run` (the shim preloaded) or, preload False, as a plain process that
        talks to the controller directly (the region API without the shim)."""
        script = self.dir / name
        script.write_text(code)
        cmd = [sys.executable, str(script)]
        return self.run(cmd) if preload else subprocess.run(cmd, env=self.env, capture_output=True, text=True,
                                                            timeout=60)

    def start_sibling(self, **env) -> tuple:
        """A busy neighbour (the hog snippet) under `krex run`, returned once its shim has registered:
        (the wrapper's Popen, the hog's pid)."""
        before = {c["pid"] for c in self.status()["clients"] if c["role"] == "shim"}
        proc = self.popen([SNIP / "hog"], env=env)
        pid = wait_for(lambda: next((c["pid"] for c in self.status()["clients"]
                                     if c["role"] == "shim" and c["pid"] not in before), None), what="sibling registered")
        return proc, pid

    def stop_hogs(self) -> None:
        """The hogs started with this world's environment stop (before their SNIPPET_MS is up)."""
        self.hog_stop.touch()

    def status(self) -> dict:
        """What `krex status --json` prints, asked from this process: the tests poll it in loops, and a Python
        started per question cost the suite minutes (test_cli runs the command itself)."""
        return json.loads(json.dumps(fetch_status(self.env["KREX_SOCKET"])))

    def held_region(self, report=None, hold_us: Optional[int] = None, *, release=None, cmd=None,
                    **env) -> subprocess.Popen:
        """The region snippet (or cmd) holding one region of one launch (SNIPPET_REGIONS and SNIPPET_N 1 unless
        env says otherwise) for hold_us us or until the file release exists, returned once the controller shows
        a region held."""
        e = {"SNIPPET_REGIONS": "1", "SNIPPET_N": "1",
             **({"SNIPPET_HOLD_US": str(hold_us)} if hold_us is not None else {}),
             **({"SNIPPET_HOLD_FILE": str(release)} if release is not None else {}), **env}
        owner = self.popen(cmd or [SNIP / "region"], report=report, env=e)
        wait_for(lambda: any(g["owner"] and g["owner"]["state"] == "held" for g in self.status()["gpus"]),
                 what="grant")
        return owner

    def trace_lines(self) -> list[tuple]:
        if not self.trace.exists():
            return []
        return [t[:5] for t in self.trace_records()]

    def trace_records(self) -> list[tuple]:
        """Each kernel of the fake driver's trace: pid, stream, start, end, name and a dict of the key=value
        fields after the name (smem, prio, occ, resident)."""
        if not self.trace.exists():
            return []
        out = []
        # a process still running may be writing its line as this reads: what follows the last newline is not
        # a whole line yet
        text = self.trace.read_text()
        for line in text.split("\n")[:-1]:
            pid, sid, start, end, rest = line.split(" ", 4)
            name, *fields = rest.split(" ")
            # a field without "=" was seen once in a clean-clone run under load (not reproduced): say which line
            assert all("=" in f for f in fields), f"a trace line that does not parse: {line!r} in {text[-2000:]!r}"
            out.append((int(pid), int(sid), int(start), int(end), name, dict(f.split("=", 1) for f in fields)))
        return out

    def stop(self) -> None:
        """End the test's krex world: its wrappers still running (a test that failed midway), so that none
        starts a controller again, its controller, then the embedded controllers its wrappers started at its
        socket. Never raises: the fixture's check for stopped processes comes after it."""
        for pid in self.processes(wrappers=True):
            kill(pid, signal.SIGKILL)         # the wrapper's helper takes the command with it (PDEATHSIG)
        if self.ctl and self.ctl.poll() is None:
            self.ctl.send_signal(signal.SIGTERM)
            try:
                self.ctl.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.ctl.kill()
                self.ctl.wait()
        self.stop_started_controllers()

    def processes(self, wrappers: bool = False, socket=None) -> dict:
        """pid -> ppid of the test's controllers (a command line naming its socket, or `socket`), or of its
        `krex run` wrappers (KREX_SOCKET naming it in the environment)."""
        mine, found = os.fsencode(str(socket or self.socket)), {}
        for name in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{name}/cmdline").read_bytes().split(b"\0")
                if wrappers:
                    ours = argv[1:4] == [b"-m", b"krex_ctl", b"run"] and b"KREX_SOCKET=" + mine in \
                        Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
                else:
                    ours = b"controller" in argv and mine in argv
                if ours and proc_state(int(name)) not in (None, "Z"):
                    found[int(name)] = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
        return found

    def stop_started_controllers(self) -> None:
        """End the embedded controllers the test's own commands started: a wrapper whose controller died
        reconnects through ensure_controller, which starts one at the test's socket, and that one would run
        on for its idle time (30 s) after the test. Found by their command line (one may not have registered
        yet when the test ends), each top one asked to stop (its resumer, a fork with the same command line,
        leaves with it), looked for again until none is left; SIGKILL after 5 s."""
        asked: set = set()
        deadline = time.monotonic() + 5
        while (found := self.processes()) and time.monotonic() < deadline:
            for pid, ppid in found.items():
                if ppid not in found and pid not in asked:
                    kill(pid, signal.SIGTERM)
                    asked.add(pid)
            time.sleep(0.05)
        for pid in self.processes():
            kill(pid, signal.SIGKILL)


def kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


@pytest.fixture
def krex(tmp_path):
    k = Krex(tmp_path)
    yield k
    try:
        k.stop()
    finally:
        left = stopped_processes_under(str(tmp_path))
        for pid in left:
            os.kill(pid, signal.SIGCONT)
    assert not left, f"processes left stopped: {left}"


@pytest.fixture
def cpus():
    """The usable CPUs; tests of CPU isolation need two."""
    c = sorted(os.sched_getaffinity(0))
    if len(c) < 2:
        pytest.skip("needs two CPUs")
    return c


def report_of(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def overlaps(trace, regions, name="hog"):
    """Kernels named `name` that ran while one of the regions was held."""
    bad = []
    for pid, sid, start, end, kname in trace:
        if kname != name:
            continue
        for r in regions:
            if r.get("granted_ns") and start < r["ended_ns"] and end > r["granted_ns"]:
                bad.append((pid, sid, start, end, r["name"]))
    return bad


def in_namespace(*flags: str) -> list:
    """The unshare(1) command that runs a test helper in new namespaces (pid: -p, mount: -m), as root or
    in a user namespace of its own; None where neither works here."""
    import shutil

    if not shutil.which("unshare"):
        return None
    for extra in ([] if os.getuid() == 0 else ["-r"], ["-r"]):
        cmd = ["unshare", *extra, *flags]
        if subprocess.run(cmd + ["true"], capture_output=True).returncode == 0:
            return cmd
    return None


# A stand-in controller for tests that script its replies (start_fake_controller): it takes one shim's
# connection; the script appended to it reads each_frame() and answers, welcome() answering a HELLO.
FAKE_CONTROLLER = r'''
import json, os, socket, struct, sys, time
sys.path.insert(0, sys.argv[1])
from krex_ctl.wire import client, frames
from krex_ctl.wire.frames import C, MSG
from krex_ctl.enforce.gate import GatePage
path = sys.argv[2]
gate = GatePage()
lst = client.bind_private(path)
lst.listen(4)
print("ready", flush=True)
c, _ = lst.accept()
buf = b""
def each_frame():
    global buf
    while True:
        while len(buf) >= frames.HDR_SIZE:
            mtype, length, seq = frames.unpack_header(buf)
            if len(buf) < frames.HDR_SIZE + length:
                break
            payload = buf[frames.HDR_SIZE:frames.HDR_SIZE + length]
            buf = buf[frames.HDR_SIZE + length:]
            yield frames.MESSAGES[mtype][0], payload, seq
        data = c.recv(65536)
        if not data:
            return
        buf += data
def send(name, payload, seq):
    c.sendall(frames.pack(MSG[name], payload, seq))
def welcome():
    ro = gate.readonly_fd()
    c.sendmsg([frames.pack(MSG["WELCOME"], frames.encode("struct krex_welcome", magic=frames.MAGIC,
               version=frames.VERSION, client_id=1, job=1, max_gpus=64, gate_stride=64, gate_offset=64,
               has_gate_fd=1, controller_pid=os.getpid()))], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", ro))])
'''


def start_fake_controller(tmp_path: Path, script: str):
    """Run FAKE_CONTROLLER + script; returns it and the environment of a preloaded program that talks to it."""
    (tmp_path / "fake_controller.py").write_text(FAKE_CONTROLLER + script)
    sock = tmp_path / "fake.sock"
    server = subprocess.Popen([sys.executable, str(tmp_path / "fake_controller.py"), str(ROOT), str(sock)],
                              stdout=subprocess.PIPE, text=True)
    assert server.stdout.readline().strip() == "ready"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(KREX_SOCKET=str(sock), LD_PRELOAD=str(BUILD / "libkrex.so"))
    return server, env


def fork_while_held(imports: str, lock: str, child: str) -> str:
    """A script in which another thread holds `lock` while the main thread forks: the child runs `child` (its
    lines print what it did, flushed) and the parent prints `parent` and the child's exit status, having killed
    it after 20 s as hung (a lock copied held into the child is never released there)."""
    body = "\n".join("    " + line for line in child.strip().splitlines())
    return f"""
import os, sys, threading, time
{imports}
held, release = threading.Event(), threading.Event()
def holder():
    with {lock}:
        held.set()
        release.wait(10)
threading.Thread(target=holder, daemon=True).start()
held.wait(10)
pid = os.fork()
if pid == 0:   # the child: the thread holding the lock is not here
{body}
    os._exit(0)
release.set()
for _ in range(200):          # 20 s, then the child is taken as hung
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    done, status = os.waitpid(pid, 0)
print("parent", os.waitstatus_to_exitcode(status))
"""
