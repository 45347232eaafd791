"""A SIGKILLed `krex run` wrapper leaves nothing of its command behind: not its grandchildren on the GPU
(krex-exec is a subreaper that kills the whole tree when the wrapper dies), not its counters file (the next
`krex run` removes those of dead wrappers)."""

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import SNIP, wait_for

from krex_ctl.procs import descendants


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] not in "ZX"
    except OSError:
        return False


def named(pids, comm):
    out = []
    for p in pids:
        try:
            if open(f"/proc/{p}/comm").read().strip() == comm:
                out.append(p)
        except OSError:
            pass
    return out


HARNESS = """
import ctypes, os, signal, subprocess, sys, time
sys.path.insert(0, sys.argv[1])
from krex_ctl.procs import descendants
# orphans of the command come to this process (not to init, whatever init does with them)
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0   # PR_SET_CHILD_SUBREAPER
def proc_file(q, name):    # "" once q is gone (a short-lived process of the tree can end between two reads)
    try:
        with open(f"/proc/{q}/{name}") as f:
            return f.read()
    except OSError:
        return ""
p = subprocess.Popen(sys.argv[2:])
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    tree = descendants(p.pid)
    names = [proc_file(q, "comm").strip() for q in tree]
    if "hog" in names and os.path.exists(os.environ["KREX_FAKE_TRACE"]):
        break
    time.sleep(0.05)
tree = descendants(p.pid)
p.kill()
p.wait()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    while True:          # reap what was orphaned to us
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                break
        except ChildProcessError:
            break
    left = [q for q in tree if (proc_file(q, "stat").rsplit(") ", 1) + ["Z"])[1][:1] not in ("", "Z", "X")]
    if not left:
        break
    time.sleep(0.05)
print("LEFT", left, flush=True)
for q in left:
    os.kill(q, signal.SIGKILL)
"""


def test_sigkill_of_the_wrapper_takes_grandchildren_with_it(krex, tmp_path):
    """`krex run -- sh -c 'prog; true'`: prog, a grandchild, used to go on launching under init."""
    from conftest import ROOT

    krex.start_controller()
    cmd = [sys.executable, "-c", HARNESS, str(ROOT)] + krex.run_cmd(
        ["sh", "-c", f"{SNIP / 'hog'}; true"])
    env = dict(krex.env, SNIPPET_MS="60000", SNIPPET_US="200")
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=180)
    assert "LEFT []" in r.stdout, (r.stdout, r.stderr)


def test_background_children_outlive_a_command_that_ends_normally(krex, tmp_path):
    """As without krex: the command's own end does not kill what it left running in the background."""
    krex.start_controller()
    flag = tmp_path / "bg-done"
    r = krex.run(["sh", "-c", f"(sleep 1; touch {flag}) & exit 3"])
    assert r.returncode == 3
    wait_for(flag.exists, timeout=30, what="background child finished")


def test_signals_and_exit_status_pass_through_the_supervisor(krex, tmp_path):
    krex.start_controller()
    r = krex.run([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"])
    assert r.returncode == 128 + signal.SIGTERM and "SIGTERM" in r.stderr
    r = krex.run(["no-such-command-krex"])
    assert r.returncode == 127 and "command not found" in r.stderr
    script = "import time, sys, signal\nsignal.signal(signal.SIGUSR1, lambda *a: sys.exit(7))\ntime.sleep(60)\n"
    p = krex.popen([sys.executable, "-c", script])
    wait_for(lambda: any("time.sleep(60)" in open(f"/proc/{c}/cmdline").read().replace("\0", " ")
                         for c in descendants(p.pid)), what="command started")
    time.sleep(0.5)
    p.send_signal(signal.SIGUSR1)
    p.communicate(timeout=30)
    assert p.returncode == 7


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT])
def test_a_signal_ignored_at_the_start_stays_ignored(krex, tmp_path, sig):
    """`nohup krex run ...` (SIGHUP ignored), or a non-interactive shell's `krex run ... &` (SIGINT ignored): the
    wrapper took the signal anyway (a blocked signal is kept pending even when ignored) and the helper had reset
    the command's disposition to the default, so a hang-up killed a command that runs on without krex."""
    krex.start_controller()
    script = "import sys, time\nprint('ready', flush=True)\ntime.sleep(2)\nprint('survived', flush=True)\n"

    def ignore():
        signal.signal(sig, signal.SIG_IGN)

    p = krex.popen([sys.executable, "-c", script], preexec_fn=ignore, start_new_session=True)
    assert p.stdout.readline().strip() == "ready"
    os.killpg(p.pid, sig)            # to the whole job, the command included, as a hang-up reaches it
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and out.strip() == "survived", (p.returncode, out, err)


def test_stale_counters_files_are_removed_at_the_next_start(krex, tmp_path):
    krex.start_controller()
    rundir = tmp_path / "krex"
    for _ in range(3):
        p = krex.popen(["sleep", "60"])
        wait_for(lambda: named(descendants(p.pid), "sleep"), timeout=60, what="command started")
        p.kill()
        p.wait()
    left = list(rundir.glob("job-*.counters"))
    assert len(left) == 1                     # each start removed the file the wrapper before it left
    live = rundir / f"job-{os.getpid()}-keepme.counters"      # a live pid's: kept
    live.write_bytes(left[0].read_bytes()[:64])
    other = rundir / "job-999999999-notours.counters"          # not a counters file: kept
    other.write_text("data")
    r = krex.run(["true"])
    assert r.returncode == 0, r.stderr
    assert sorted(rundir.glob("job-*.counters")) == sorted([live, other])
