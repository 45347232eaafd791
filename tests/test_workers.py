"""Warm workers on the fake driver: a Python command runs inside a worker that already holds a context,
and behaves as a cold run does (exit codes, exceptions, stdio, environment, signals); state does not leak
from one command to the next; a worker that cannot vouch for its state retires and is replaced."""

import array
import json
import os
import select
import signal
import socket as sk
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, proc_state, report_of, wait_for


def idle_worker(krex):
    return wait_for(lambda: next((w for w in krex.status()["workers"] if w["state"] == "idle"), None), timeout=60,
                    what="an idle warm worker")


def not_ignoring() -> None:
    """A wrapper's start with the forwarded signals at their defaults, whatever the test runner was started with
    (a suite started in the background of a script runs with SIGINT and SIGQUIT ignored)."""
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def patched_wrapper_cmd(patch: str, command: list) -> list:
    """`krex run -- COMMAND` in a wrapper whose run module (`r`, with os and signal imported) PATCH changes first."""
    code = ("import os, signal\nimport krex_ctl.commands.run as r\n" + patch +
            "from krex_ctl.cli import main\nmain()\n")
    return [sys.executable, "-c", code, "run", "--"] + [str(c) for c in command]


def patched_wrapper(krex, tmp_path, patch: str) -> subprocess.CompletedProcess:
    """`krex run -- python S.py` (S.py prints its pid) in a wrapper whose run module PATCH changes first
    (patched_wrapper_cmd): a wrapper stopped at a chosen point of its way to a warm worker."""
    script = tmp_path / "s.py"
    script.write_text("import os; print(os.getpid())\n")
    return subprocess.run(patched_wrapper_cmd(patch, [sys.executable, script]), env=krex.env,
                          capture_output=True, text=True, timeout=60)


def worker_connection(krex):
    """A connection to the one warm worker's socket, as `krex run` makes it (the test standing in for the wrapper)."""
    [path] = (krex.dir / "krex").glob("worker-*.sock")
    s = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
    s.connect(str(path))
    return s


def send_command(s, krex, cwd, code: str, fds: list) -> None:
    """`python -c CODE` sent on a worker connection with fds as its stdin, stdout and stderr."""
    request = json.dumps({"argv": ["-c", code], "env": dict(krex.env), "cwd": str(cwd)}).encode() + b"\n"
    s.sendmsg([request], [(sk.SOL_SOCKET, sk.SCM_RIGHTS, array.array("i", fds).tobytes())])


def answer_of(s) -> dict:
    """The worker's answer on its connection."""
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(65536)
        assert chunk, data
        data += chunk
    return json.loads(data)


def ready_pool(krex, tmp_path) -> dict:
    """A controller with one warm worker (preloading json), its zygote made by a first command and the worker
    idle: the zygote's status."""
    krex.start_controller("--warm-workers", "1", "--worker-preload", "json")
    assert run_py(krex, tmp_path, "pass", name="first.py").returncode == 0
    zygote = wait_for(lambda: next((z for z in krex.status()["zygotes"] if z["ready"]), None), timeout=60,
                      what="a ready zygote")
    idle_worker(krex)
    return zygote


def run_py(krex, tmp_path, code, env=None, name="s.py", **kw):
    script = tmp_path / name
    script.write_text(textwrap.dedent(code))
    return krex.run([sys.executable, str(script)], report=tmp_path / "r.json", env=env, **kw)


def preloading(krex, tmp_path, module: str, source: str, workers: str = "1") -> dict:
    """A controller whose warm workers preload MODULE (SOURCE, in a folder of its own), and the first command of
    that environment run (cold: it asks for the zygote); the environment's variables for the next commands."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / f"{module}.py").write_text(source)
    env = {"PYTHONPATH": os.pathsep.join([krex.env["PYTHONPATH"], str(mods)])}
    krex.start_controller("--warm-workers", workers, "--worker-preload", module)
    assert run_py(krex, tmp_path, "pass", env=env, name="first.py").returncode == 0
    return env


@pytest.fixture
def warm(krex, tmp_path):
    # one worker that runs many commands: what the hygiene between commands must hold up to
    krex.start_controller("--warm-workers", "1", "--worker-preload", "json", "--worker-reuse", "50")
    first = run_py(krex, tmp_path, "print('cold')")           # asks for a worker of this environment
    assert first.returncode == 0 and first.stdout == "cold\n"
    idle_worker(krex)
    return krex


def test_command_runs_in_the_warm_worker_like_a_cold_one(warm, tmp_path):
    worker = idle_worker(warm)
    out = run_py(warm, tmp_path, """
        import os, sys
        print(os.getpid(), os.environ["FOO"], os.getcwd(), sys.argv[1:], __name__)
        print("to stderr", file=sys.stderr)
        sys.exit(3)
    """, env={"FOO": "bar"}, cwd=str(tmp_path))
    assert out.returncode == 3, out.stderr
    pid, foo, cwd, argv, name = out.stdout.split(maxsplit=4)
    assert int(pid) == worker["pid"] and foo == "bar" and cwd == str(tmp_path) and name.strip() == "__main__"
    assert out.stderr == "to stderr\n"
    assert report_of(tmp_path / "r.json")["exit_code"] == 3


def test_uncaught_exception_and_string_exit(warm, tmp_path):
    idle_worker(warm)
    out = run_py(warm, tmp_path, "raise ValueError('boom')")
    assert out.returncode == 1 and "ValueError: boom" in out.stderr and "Traceback" in out.stderr
    idle_worker(warm)
    out = run_py(warm, tmp_path, "import sys; sys.exit('bad input')")
    assert out.returncode == 1 and out.stderr.strip() == "bad input"


def test_module_and_code_forms_and_stdin(warm, tmp_path):
    idle_worker(warm)
    out = warm.run([sys.executable, "-c", "import sys; print(sys.stdin.read().upper())"], input="hello")
    assert out.returncode == 0 and out.stdout.strip() == "HELLO"
    idle_worker(warm)
    out = warm.run([sys.executable, "-m", "json.tool"], input='{"a": 1}')
    assert out.returncode == 0 and json.loads(out.stdout) == {"a": 1}


def test_state_does_not_leak_between_commands(warm, tmp_path):
    idle_worker(warm)
    out = run_py(warm, tmp_path, """
        import os, sys, signal
        sys.path.append("/leaked")
        os.environ["LEAKED"] = "1"
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        import csv
        os.chdir("/")
        import json, random, warnings
        json.dumps = None                      # monkeypatching a module the worker had loaded
        json.leaked = 1
        del json.loads
        warnings.simplefilter("ignore")
        random.seed(1234)
        sys.excepthook = None
    """)
    assert out.returncode == 0, out.stderr
    idle_worker(warm)
    out = run_py(warm, tmp_path, """
        import os, sys, signal, json, random, warnings
        print("/leaked" in sys.path, "LEAKED" in os.environ, signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL,
              "csv" in sys.modules, callable(json.dumps), hasattr(json, "leaked"), callable(json.loads),
              any(f[0] == "ignore" and f[2] is Warning for f in warnings.filters), sys.excepthook is sys.__excepthook__)
        random.seed(1234)
        print(random.random())
    """, name="t.py")
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["False", "False", "True", "False", "True", "False", "True", "False", "True"], out.stderr
    seeded = float(lines[1])
    idle_worker(warm)
    out = run_py(warm, tmp_path, "import random; print(random.random())", name="u.py")
    assert float(out.stdout) != seeded           # the seeded sequence did not carry over


def test_os_exit_and_leaked_threads_retire_the_worker(warm, tmp_path):
    first = idle_worker(warm)["pid"]
    out = run_py(warm, tmp_path, "import os; print('bye', flush=True); os._exit(7)")
    assert out.returncode == 7 and out.stdout == "bye\n"
    second = wait_for(lambda: next((w["pid"] for w in warm.status()["workers"]
                                    if w["state"] == "idle" and w["pid"] != first), None), timeout=60,
                      what="a replacement worker")
    out = run_py(warm, tmp_path, "import threading, time; threading.Thread(target=time.sleep, args=(30,), daemon=True).start()")
    assert out.returncode == 0
    wait_for(lambda: all(w["pid"] != second for w in warm.status()["workers"]), timeout=30, what="retirement")


def test_ctrl_c_reaches_the_command(warm, tmp_path):
    idle_worker(warm)
    script = tmp_path / "sleep.py"
    script.write_text("import time\nprint('ready', flush=True)\ntime.sleep(30)\n")
    p = warm.popen([sys.executable, str(script)])
    assert p.stdout.readline() == "ready\n"
    p.send_signal(signal.SIGINT)
    try:
        out, err = p.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        # once in a suite of two test processes (not reproduced since): say where it stood
        workers = warm.status()["workers"]
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"no exit 30 s after SIGINT; workers {workers}; stderr {err!r}; the controller's log "
                             f"{warm.ctl_log.read_text()[-2000:]!r}")
    assert p.returncode == 130 and "KeyboardInterrupt" in err and "killed by SIGINT" in err, err


def test_only_the_commands_own_threads_take_its_signals(warm, tmp_path):
    """A signal the wrapper passes on goes to the worker's process: a thread of krex's that does not block it (the
    watch on the wrapper's connection) could take it, and the command's main thread, asleep in a long call, would
    not see it until that call returned. Every thread but the command's has the command's signals blocked."""
    worker = idle_worker(warm)["pid"]
    out = run_py(warm, tmp_path, """
        import os
        for tid in sorted(os.listdir("/proc/self/task")):
            status = open(f"/proc/self/task/{tid}/status").read()
            blocked = int(next(x for x in status.splitlines() if x.startswith("SigBlk:")).split()[1], 16)
            print(tid, os.getpid(), blocked)
    """)
    assert out.returncode == 0, out.stderr
    rows = [tuple(int(x) for x in line.split()) for line in out.stdout.splitlines()]
    assert rows[0][1] == worker and len(rows) >= 2, rows   # the command ran warm, beside krex's threads
    mask = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1)) | (1 << (signal.SIGUSR1 - 1))
    for tid, pid, blocked in rows:              # the command's thread has none of them blocked, every other all
        assert blocked & mask == (0 if tid == pid else mask), (tid, pid, hex(blocked))


def test_a_commands_signal_mask_is_not_the_next_ones(warm, tmp_path):
    """A command that blocks SIGTERM (and leaves it so) must not leave the next command in the same worker deaf to
    the SIGTERM its wrapper passes on: the mask is put back with the handlers."""
    worker = idle_worker(warm)["pid"]
    first = run_py(warm, tmp_path, "import os, signal\nsignal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
                                   "os.kill(os.getpid(), signal.SIGTERM)\nprint(os.getpid())")   # left pending
    idle_worker(warm)
    second = run_py(warm, tmp_path, "import os, signal\nprint(os.getpid(), sorted(signal.pthread_sigmask("
                                    "signal.SIG_BLOCK, [])))")
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert int(first.stdout) == worker and second.stdout.split()[0] == str(worker)
    assert "Signals.SIGTERM" not in second.stdout and "15" not in second.stdout.split(None, 1)[1], second.stdout


def test_signals_the_wrapper_ignored_are_ignored_in_the_warm_command_and_not_the_next(warm, tmp_path):
    """A wrapper started with SIGINT and SIGQUIT ignored (what a non-interactive shell does for `cmd &`) starts a
    cold command with them ignored; a warm command too, and the worker's next command has them back."""
    show = ("import os, signal\n"
            "print(os.getpid(), *(signal.getsignal(s) is signal.SIG_IGN for s in (signal.SIGINT, signal.SIGQUIT,\n"
            "                                                                     signal.SIGTERM)))\n")

    def ignoring():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)

    worker = idle_worker(warm)["pid"]
    first = run_py(warm, tmp_path, show, preexec_fn=ignoring)
    idle_worker(warm)
    second = run_py(warm, tmp_path, show, preexec_fn=not_ignoring)
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert first.stdout.split() == [str(worker), "True", "True", "False"], first.stdout
    assert second.stdout.split() == [str(worker), "False", "False", "False"], second.stdout


def test_a_warm_command_does_not_inherit_signals_its_controller_ignored(krex, tmp_path):
    """A controller started with SIGINT and SIGQUIT ignored passes that on to its zygotes and workers; a command
    whose wrapper did not ignore them gets a fresh Python's dispositions (Ctrl-C raises KeyboardInterrupt)."""
    def ignoring():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGQUIT, signal.SIG_IGN)

    krex.start_controller("--warm-workers", "1", "--worker-preload", "json", preexec_fn=ignoring)
    assert run_py(krex, tmp_path, "pass", name="first.py").returncode == 0
    worker = idle_worker(krex)["pid"]
    [zygote] = [z["pid"] for z in krex.status()["zygotes"]]
    with open(f"/proc/{zygote}/status") as f:
        ign = int(next(x for x in f if x.startswith("SigIgn:")).split()[1], 16)
    assert ign & (1 << (signal.SIGQUIT - 1)), hex(ign)         # the pool did inherit SIGQUIT ignored
    out = run_py(krex, tmp_path, "import os, signal\n"
                                 "print(os.getpid(), signal.getsignal(signal.SIGINT) is signal.default_int_handler,\n"
                                 "      signal.getsignal(signal.SIGQUIT) is signal.SIG_DFL)\n", preexec_fn=not_ignoring)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(worker), "True", "True"], out.stdout


def test_a_late_ctrl_c_of_one_command_never_reaches_the_next_in_the_same_worker(warm, tmp_path):
    """A worker that stays (--worker-reuse above 1) takes its next command only once the last one's wrapper has
    closed its connection, which the wrapper does after it has stopped passing signals on: a SIGINT passed on in
    between is dropped, not raised in the next command. Here the test is the first command's wrapper, and keeps
    its connection open after the answer while a second `krex run` waits for the same worker."""

    worker = idle_worker(warm)["pid"]
    first = worker_connection(warm)
    devnull = os.open(os.devnull, os.O_RDWR)
    send_command(first, warm, tmp_path, "pass", [devnull] * 3)
    os.close(devnull)
    answer = answer_of(first)
    assert answer["exit_code"] == 0 and not answer["retire"], answer
    script = tmp_path / "next.py"
    script.write_text("import os, time\nprint(os.getpid(), flush=True)\ntime.sleep(0.5)\nprint('done', flush=True)\n")
    second = warm.popen([sys.executable, str(script)])
    try:
        started = select.select([second.stdout], [], [], 2.0)[0]
        assert not started, second.stdout.readline()        # the worker waits for the first wrapper's close
        os.kill(worker, signal.SIGINT)                     # passed on late by the first command's wrapper
        time.sleep(0.2)
    finally:
        first.close()
    out, err = second.communicate(timeout=30)
    assert second.returncode == 0, err
    assert out.split() == [str(worker), "done"], (out, err)                 # the same worker, not interrupted


def test_a_signal_for_a_command_whose_wrapper_was_stopped_never_reaches_the_next(warm, tmp_path):
    """A wrapper stopped (SIGSTOP, Ctrl-Z) as its command ends holds its connection past the worker's wait for its
    close (worker.WRAPPER_CLOSE_S): the worker answers and takes its next command, another wrapper's. Continued
    with a SIGINT and a SIGTERM pending, and slow to take the answer (here its aim(None) waits 1 s), the stopped
    wrapper still passes them on while it has no answer: they belong to its own command, over, and must not reach
    the next one, which finishes undisturbed in the same worker."""
    worker = idle_worker(warm)["pid"]
    (tmp_path / "held.py").write_text("import os, sys\nprint(os.getpid(), flush=True)\nsys.stdin.readline()\n"
                                      "print('done', flush=True)\n")
    slow = ("import time\n"
            "real = r.Forwarder.aim\n"
            "def aim(self, target, *a, **kw):\n"
            "    if target is None:\n"
            "        time.sleep(1.0)\n"      # the answer is read: the signals pending at SIGCONT are taken first
            "    return real(self, target, *a, **kw)\n"
            "r.Forwarder.aim = aim\n")
    first = subprocess.Popen(patched_wrapper_cmd(slow, [sys.executable, tmp_path / "held.py"]), env=warm.env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=not_ignoring)
    second = None
    try:
        assert int(first.stdout.readline()) == worker                    # the first command runs warm
        os.kill(first.pid, signal.SIGSTOP)
        wait_for(lambda: proc_state(first.pid) in ("T", "t"), timeout=30, what="the first wrapper stopped")
        first.stdin.write("go\n")                                      # its command ends; no one reads the answer
        first.stdin.flush()
        assert idle_worker(warm)["pid"] == worker                       # the worker gave up waiting for the close
        second = warm.popen([sys.executable, tmp_path / "held.py"], stdin=subprocess.PIPE, preexec_fn=not_ignoring)
        assert int(second.stdout.readline()) == worker, second.stderr   # the next command, in the same worker
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCONT):
            os.kill(first.pid, sig)
        out, err = first.communicate(timeout=30)
        assert first.returncode == 0 and out == "done\n", (first.returncode, out, err)   # its command's own status
        out, err = second.communicate("go\n", timeout=30)
        assert second.returncode == 0 and out == "done\n", (second.returncode, out, err)
    finally:
        for p in (first, second):
            if p is not None and p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.communicate()
    assert idle_worker(warm)["pid"] == worker                           # and the worker lives on


def test_a_signal_reaches_a_warm_command_busy_in_c_code_at_once(warm, tmp_path):
    """A SIGTERM sent to `krex run` ends a warm command that runs C code holding the interpreter (a regular
    expression that backtracks for hours) at once, as a cold one: the wrapper kill()s the worker, and the kernel
    acts on a signal left at its default whatever the interpreter does; a thread of the worker that had to run
    Python to deliver it would wait for the interpreter."""
    worker = idle_worker(warm)["pid"]
    (tmp_path / "stuck.py").write_text("import os, re\nprint(os.getpid(), flush=True)\n"
                                       "re.match(r'(a+)+$', 'a' * 40 + 'b')\nprint('done')\n")
    p = warm.popen([sys.executable, tmp_path / "stuck.py"], preexec_fn=not_ignoring)
    try:
        assert int(p.stdout.readline()) == worker
        time.sleep(0.5)                                                  # inside the match
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 128 + signal.SIGTERM and "done" not in out, (p.returncode, out, err)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        if proc_state(worker) not in (None, "Z"):
            os.kill(worker, signal.SIGKILL)


def ignored_signals(pid: int) -> set:
    """The signals pid ignores now (/proc/PID/status SigIgn)."""
    with open(f"/proc/{pid}/status") as f:
        mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    return {sig for sig in signal.Signals if mask >> (sig - 1) & 1}


def test_a_signal_after_a_commands_end_is_dropped_and_its_answer_ends_the_connection(warm, tmp_path):
    """From a command's end until its answer has been taken (the wrapper's close) the worker ignores the signals a
    wrapper passes on by kill() (SIGINT has its own handler, worker.Interrupts): one then is late, and killed the
    worker, whose wrapper reported the command killed though it had ended. The answer comes with the end of the
    worker's side of the connection, so a wrapper that has read it sees the end and passes nothing more on
    (signals.answered). Once the wrapper has closed, the idle worker is back at a fresh Python's dispositions."""
    from krex_ctl.worker import LATE

    worker = idle_worker(warm)["pid"]
    s = worker_connection(warm)
    devnull = os.open(os.devnull, os.O_RDWR)
    send_command(s, warm, tmp_path, "pass", [devnull, devnull, devnull])
    os.close(devnull)
    assert answer_of(s)["exit_code"] == 0
    s.settimeout(3.0)                                       # not the worker's close, 5 s later (WRAPPER_CLOSE_S)
    assert s.recv(1) == b""                                 # the worker's side ended with the answer
    assert LATE <= ignored_signals(worker)                  # until the wrapper's close: late signals dropped
    os.kill(worker, signal.SIGTERM)
    s.close()
    assert idle_worker(warm)["pid"] == worker               # it lives on
    # and takes the next command's as a fresh Python would: it puts them back once it sees the close, before it
    # tells the controller it is idle (worker.py); the test's own connection left it listed idle meanwhile, so
    # the check waits for the close to be seen (CI, two suites on two cores: read at once, LATE was still ignored)
    wait_for(lambda: not LATE & ignored_signals(worker), timeout=10, what="the worker's fresh dispositions")
    out = run_py(warm, tmp_path, "import os; print(os.getpid())")
    assert out.returncode == 0 and int(out.stdout) == worker, (out.stdout, out.stderr)


def test_faulthandler_registered_by_one_command_works_in_the_next(warm, tmp_path):
    """faulthandler.register(sig) sets its handler in C, which signal.getsignal does not see: the worker's put-back
    of its handlers must unregister it, or the next command's register of the same signal does nothing (faulthandler
    thinks it is still registered) and the signal kills that command."""
    code = ("import faulthandler, os, signal, sys, time\n"
            "faulthandler.register(signal.SIGUSR1, file=open(os.devnull, 'w'))\n"
            "os.kill(os.getpid(), signal.SIGUSR1)\n"
            "time.sleep(0.1)\n"
            "print(os.getpid(), 'survived')\n")
    worker = idle_worker(warm)["pid"]
    first = run_py(warm, tmp_path, code)
    idle_worker(warm)
    second = run_py(warm, tmp_path, code)
    assert first.stdout.split() == [str(worker), "survived"], (first.returncode, first.stderr)
    assert second.returncode == 0 and second.stdout.split() == [str(worker), "survived"], \
        (second.returncode, second.stderr)


def test_a_signal_passed_on_before_the_command_starts_acts_as_on_a_cold_one(krex, tmp_path):
    """The wrapper passes signals on from the moment its request is sent; a worker that inherited SIGUSR1 ignored
    from its controller must not drop one that comes before the command has its dispositions: a cold command
    would have died of it."""
    krex.start_controller("--warm-workers", "1", "--worker-preload", "json",
                          preexec_fn=lambda: signal.signal(signal.SIGUSR1, signal.SIG_IGN))
    assert run_py(krex, tmp_path, "pass", name="first.py").returncode == 0
    worker = idle_worker(krex)["pid"]
    s = worker_connection(krex)
    devnull = os.open(os.devnull, os.O_RDWR)
    send_command(s, krex, tmp_path, "import time; time.sleep(1); print('ran')", [devnull] * 3)
    os.close(devnull)
    os.kill(worker, signal.SIGUSR1)
    try:
        data = s.recv(65536)
    except ConnectionResetError:      # the worker died with the request unread
        data = b""
    s.close()
    assert data == b"" or json.loads(data).get("signal") == signal.SIGUSR1, data
    wait_for(lambda: proc_state(worker) in (None, "Z"), what="the worker ended by SIGUSR1")


def test_a_wrapper_interrupted_before_its_request_leaves_the_worker_idle(warm, tmp_path):
    """A `krex run` that has a signal pending once it has connected to its worker leaves without sending its
    command (exit 128+N, nothing run); the worker, which the controller had checked out for it, is idle again and
    takes the next command."""
    worker = idle_worker(warm)["pid"]
    p = patched_wrapper(warm, tmp_path, "import time\n"
                                        "real = r.peer_uid\n"
                                        "def peer_uid(s):\n"
                                        "    os.kill(os.getpid(), signal.SIGTERM)\n"
                                        "    time.sleep(0.3)\n"   # its signal thread has it before the request goes
                                        "    return real(s)\n"
                                        "r.peer_uid = peer_uid\n")
    assert p.returncode == 128 + signal.SIGTERM and p.stdout == "" and "before the command started" in p.stderr, \
        (p.returncode, p.stdout, p.stderr)
    assert idle_worker(warm)["pid"] == worker
    out = run_py(warm, tmp_path, "import os; print(os.getpid())", env={"KREX_WARM_WAIT": "0"})
    assert out.returncode == 0 and int(out.stdout) == worker, (out.stdout, out.stderr)


def test_a_worker_whose_wrapper_died_before_connecting_is_replaced(krex, tmp_path):
    """A `krex run` killed (SIGKILL) between the controller's answer naming a worker and its connect to that worker:
    its job ends with the worker checked out for it and never sent a command. The controller kills it (here after
    1 s, pool.ORPHAN_S), its zygote readies another, and the next command runs warm in that one."""
    krex.start_controller("--warm-workers", "1", "--worker-preload", "json",
                          prelude="import krex_ctl.pool as pool\npool.ORPHAN_S = 1.0")
    assert run_py(krex, tmp_path, "pass", name="first.py").returncode == 0
    worker = idle_worker(krex)["pid"]
    p = patched_wrapper(krex, tmp_path, "real = r.Guardian.request\n"
                                        "def request(self, op, *a, **kw):\n"
                                        "    reply = real(self, op, *a, **kw)\n"
                                        "    if op == 'dispatch' and reply and reply.get('socket'):\n"
                                        "        os.kill(os.getpid(), signal.SIGKILL)\n"
                                        "    return reply\n"
                                        "r.Guardian.request = request\n")
    assert p.returncode == -signal.SIGKILL and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    assert [w["state"] for w in krex.status()["workers"] if w["pid"] == worker] == ["busy"]
    wait_for(lambda: proc_state(worker) in (None, "Z"), timeout=30, what="the orphaned worker killed")
    fresh = idle_worker(krex)["pid"]
    assert fresh != worker and "neither idle nor gone" in krex.ctl_log.read_text()
    out = run_py(krex, tmp_path, "import os; print(os.getpid())", env={"KREX_WARM_WAIT": "5"})
    assert out.returncode == 0 and int(out.stdout) == fresh, (out.stdout, out.stderr)


def test_a_warm_command_that_cannot_see_its_wrapper_die_is_killed(krex, tmp_path):
    """A warm command busy in C code that holds the interpreter (a regular expression that backtracks for hours)
    whose `krex run` is killed (SIGKILL): the worker's thread that watches the wrapper cannot run, so the controller
    kills the worker once the job has been over pool.ORPHAN_S (1 s here), as a cold command dies with its wrapper;
    nothing of it is left running."""
    krex.start_controller("--warm-workers", "1", "--worker-preload", "json",
                          prelude="import krex_ctl.pool as pool\npool.ORPHAN_S = 1.0")
    assert run_py(krex, tmp_path, "pass", name="first.py").returncode == 0
    worker = idle_worker(krex)["pid"]
    (tmp_path / "stuck.py").write_text("import os, re\nprint(os.getpid(), flush=True)\n"
                                       "re.match(r'(a+)+$', 'a' * 40 + 'b')\n")
    p = krex.popen([sys.executable, tmp_path / "stuck.py"])
    try:
        assert int(p.stdout.readline()) == worker
        time.sleep(0.5)                      # inside the match (killed before it, the worker's own watch would act)
        p.kill()
        p.communicate()
        wait_for(lambda: "neither idle nor gone" in krex.ctl_log.read_text(), timeout=30, what="the controller's kill")
        wait_for(lambda: proc_state(worker) in (None, "Z"), timeout=30, what="the orphaned worker killed")
    finally:
        if proc_state(worker) not in (None, "Z"):
            os.kill(worker, signal.SIGKILL)


def test_interrupts_note_a_sigint_for_the_command_being_taken_and_drop_a_late_one(tmp_path):
    """The worker's SIGINT handler outside commands (worker.Interrupts), in this process: idle with no command
    waiting, dropped; while a command is taken, or idle with one waiting to be taken, noted for it; cleared when
    the worker is idle again; once the listener is closed, dropped without an error."""
    from krex_ctl.worker import Interrupts

    def sigint():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.02)                           # the handler runs in this thread at its next instruction

    before = signal.getsignal(signal.SIGINT)
    listener = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
    listener.bind(str(tmp_path / "w.sock"))
    listener.listen(1)
    try:
        it = Interrupts(listener)
        assert it.command_handler is signal.default_int_handler     # a cold Python's, whatever the worker's was
        sigint()
        assert not it.noted                        # a late one: dropped
        it.taking = True
        sigint()
        assert it.noted                            # the command being taken gets it at its start
        it.idle()
        assert not it.noted and not it.taking
        waiting = sk.socket(sk.AF_UNIX, sk.SOCK_STREAM)
        waiting.connect(str(tmp_path / "w.sock"))
        sigint()
        assert it.noted                            # a command waiting to be taken: its own
        it.idle()
        waiting.close()
        listener.close()
        sigint()
        assert not it.noted
    finally:
        signal.signal(signal.SIGINT, before)
        listener.close()


def test_a_sigint_to_an_idle_worker_is_dropped(warm, tmp_path):
    """A late SIGINT (the wrapper passes its signals on until it has the command's answer) reaching a worker once
    its command is over belongs to no command: the worker stays and runs the next one."""
    worker = idle_worker(warm)["pid"]
    os.kill(worker, signal.SIGINT)
    time.sleep(0.3)
    assert proc_state(worker) not in (None, "Z")
    for _ in range(5):               # and at once after a command's answer, while it tells the controller it is idle
        out = run_py(warm, tmp_path, "import os; print(os.getpid())")
        assert out.returncode == 0 and int(out.stdout) == worker, (out.stdout, out.stderr)
        os.kill(worker, signal.SIGINT)
        idle_worker(warm)
    out = run_py(warm, tmp_path, "import os; print(os.getpid())")
    assert out.returncode == 0 and int(out.stdout) == worker, (out.stdout, out.stderr)


def test_a_sigint_while_the_worker_takes_a_command_is_the_commands(warm, tmp_path):
    """A wrapper passes its signals to the worker once it has sent its command: a SIGINT that reaches the worker
    before the command has started is the command's (KeyboardInterrupt at its start: 130, as a cold command
    killed by SIGINT before its first line), not the end of the worker (which the wrapper reported as status 1)."""

    worker = idle_worker(warm)["pid"]
    # an earlier command's BLAS leaves native threads in the worker that do not block SIGINT: the kernel may hand
    # the signal to one of them (a mask on the worker's own thread would not keep it from the worker's loop)
    out = run_py(warm, tmp_path, "import numpy\na = numpy.ones((512, 512))\nprint((a @ a)[0, 0])")
    assert out.returncode == 0 and idle_worker(warm)["pid"] == worker, out.stderr
    s = worker_connection(warm)
    time.sleep(0.3)                          # accepted: the worker waits for the command
    os.kill(worker, signal.SIGINT)
    time.sleep(0.1)
    r_out, w_out = os.pipe()
    r_err, w_err = os.pipe()
    send_command(s, warm, tmp_path, "print('ran')", [0, w_out, w_err])
    os.close(w_out)
    os.close(w_err)
    result = answer_of(s)
    s.close()
    out, err = os.read(r_out, 65536), os.read(r_err, 65536)
    for fd in (r_out, r_err):
        os.close(fd)
    assert result["signal"] == signal.SIGINT and out == b"" and b"KeyboardInterrupt" in err, (result, out, err)
    assert proc_state(worker) not in (None, "Z")      # the worker took it for the command, and lives on


def test_ineligible_commands_and_cold_run_cold(warm, tmp_path):
    worker = idle_worker(warm)["pid"]
    for cmd, env in (([sys.executable, "-O", "-c", "import os; print(os.getpid())"], None),
                     ([sys.executable, "-c", "import os; print(os.getpid())"], {"CUDA_LAUNCH_BLOCKING": "1"})):
        out = warm.run(cmd, env=env)
        assert int(out.stdout) != worker
    full = [sys.executable, "-m", "krex_ctl", "run", "--cold", "--", sys.executable, "-c", "import os; print(os.getpid())"]
    out = subprocess.run(full, env=warm.env, capture_output=True, text=True, timeout=60)
    assert int(out.stdout) != worker


def test_regions_and_launches_of_a_warm_command_are_in_its_report(krex, tmp_path):
    env = {"LD_LIBRARY_PATH": str(ROOT / "build" / "fakes")}
    krex.start_controller("--warm-workers", "1", "--worker-preload", "json")
    assert run_py(krex, tmp_path, "pass", env=env, name="first.py").returncode == 0
    worker = idle_worker(krex)["pid"]
    out = run_py(krex, tmp_path, """
        import ctypes, os
        import krex
        cuda = ctypes.CDLL("libcuda.so.1")
        ctx, mod, fn = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        assert cuda.cuCtxSetCurrent(ctx) == 0 and cuda.cuModuleLoadData(ctypes.byref(mod), b"image") == 0
        assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"warm_kernel") == 0
        with krex.region("warm_region"):
            for _ in range(5):
                assert cuda.cuLaunchKernel(fn, 10, 1, 1, 1, 1, 1, 0, None, None, None) == 0
            assert cuda.cuCtxSynchronize() == 0
        print(os.getpid())
    """, env=env)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == worker                       # it really ran warm
    rep = report_of(tmp_path / "r.json")
    assert [r["name"] for r in rep["regions"]] == ["warm_region"]
    assert rep["submissions"]["kernels"] == 5


def test_torch_global_settings_are_reset_between_commands(krex, tmp_path):
    pytest.importorskip("torch")
    krex.start_controller("--warm-workers", "1", "--worker-preload", "torch", "--worker-reuse", "50")
    assert run_py(krex, tmp_path, "pass", name="first.py").returncode == 0
    worker = idle_worker(krex)["pid"]
    out = run_py(krex, tmp_path, """
        import os, torch
        torch.set_default_dtype(torch.float64)
        torch.backends.cudnn.benchmark = True
        torch.manual_seed(1234)
        print(os.getpid())
    """)
    assert out.returncode == 0 and int(out.stdout) == worker, out.stderr
    idle_worker(krex)
    out = run_py(krex, tmp_path, """
        import os, sys, torch
        print(os.getpid(), torch.get_default_dtype(), torch.backends.cudnn.benchmark, torch.initial_seed() != 1234,
              "torch._inductor.config" in sys.modules)
    """, name="t.py")
    # the reset itself imports nothing: torch.use_deterministic_algorithms would pull in Inductor (800 modules,
    # 1.4 s here, seconds on the H200), which a cold process never has
    assert out.stdout.split() == [str(worker), "torch.float32", "False", "True", "False"], out.stderr
    idle_worker(krex)
    out = run_py(krex, tmp_path, """
        import torch
        torch.use_deterministic_algorithms(True, warn_only=True)
    """, name="d.py")
    assert out.returncode == 0, out.stderr
    idle_worker(krex)
    out = run_py(krex, tmp_path, """
        import torch
        print(torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    """, name="e.py")
    assert out.stdout.split() == ["False", "False"], out.stderr
    counts = []
    for _ in range(2):                 # the worker's own modules do not change from one command to the next
        idle_worker(krex)
        out = run_py(krex, tmp_path, "import sys; print(len(sys.modules))", name="n.py")
        counts.append(int(out.stdout))
    assert counts[0] == counts[1]


def test_retired_workers_are_waited_for(warm, tmp_path):
    first = idle_worker(warm)["pid"]
    out = run_py(warm, tmp_path, "import os; os._exit(0)")
    assert out.returncode == 0
    from conftest import proc_state

    wait_for(lambda: proc_state(first) is None, timeout=10, what="the retired worker reaped (no zombie)")


def test_a_worker_killed_by_a_signal_reports_as_a_cold_run_and_is_replaced(warm, tmp_path):
    first = idle_worker(warm)["pid"]
    crash = "import os, signal, sys; print('started', os.getpid(), flush=True); os.kill(os.getpid(), signal.SIGSEGV)"
    out = run_py(warm, tmp_path, crash)
    assert out.stdout.split() == ["started", str(first)], out.stderr       # it ran warm
    assert out.returncode == 128 + signal.SIGSEGV and "killed by SIGSEGV" in out.stderr, out.stderr
    cold = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--cold", "--", sys.executable, "-c", crash],
                          env=warm.env, capture_output=True, text=True, timeout=60)
    assert cold.returncode == out.returncode and "killed by SIGSEGV" in cold.stderr
    second = wait_for(lambda: next((w["pid"] for w in warm.status()["workers"]
                                    if w["state"] == "idle" and w["pid"] != first), None), timeout=60,
                      what="a replacement worker")
    out = run_py(warm, tmp_path, "import os; print(os.getpid())", name="t.py")
    assert out.returncode == 0 and int(out.stdout) == second


def test_a_reused_pool_never_grows_past_its_size_while_workers_are_busy(warm, tmp_path):
    """With --worker-reuse above 1 a worker comes back after its command: busy ones count, no spare is
    readied (it would stay idle beside it, holding a context)."""
    worker = idle_worker(warm)["pid"]
    script = tmp_path / "hold.py"
    script.write_text("import sys\nprint('ready', flush=True)\nsys.stdin.readline()\n")
    p = warm.popen([sys.executable, str(script)], stdin=subprocess.PIPE)
    assert p.stdout.readline() == "ready\n"
    time.sleep(2.0)                                 # two pool ticks: a growing pool would have started one
    assert [(w["pid"], w["state"]) for w in warm.status()["workers"]] == [(worker, "busy")]
    p.communicate("go\n", timeout=30)
    assert p.returncode == 0
    assert idle_worker(warm)["pid"] == worker       # reused


def test_a_reused_worker_hooks_every_commands_timing_not_only_the_first(warm, tmp_path):
    """A hook's target first imported by a command is dropped from the worker with the command's other modules;
    the next command in the same worker imports it again and its timing is hooked again (a region), not unhooked
    without a word."""
    env = {"KREX_HOOKS": "triton",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "harness_fakes"), warm.env["PYTHONPATH"]])}
    code = """
        import os, sys
        import triton.testing
        triton.testing.do_bench(lambda: None)
        print(os.getpid())
    """
    assert run_py(warm, tmp_path, code, env=env, name="first.py").returncode == 0   # this environment's zygote
    pids = []
    for n in range(2):    # the fixture's worker and this environment's, both idle
        wait_for(lambda: [w["state"] for w in warm.status()["workers"]] == ["idle", "idle"], timeout=60,
                 what="this environment's worker idle")
        out = run_py(warm, tmp_path, code, env=env, name=f"c{n}.py")
        assert out.returncode == 0, out.stderr
        pids.append(int(out.stdout))
        assert [r["name"] for r in report_of(tmp_path / "r.json")["regions"]] == ["triton.do_bench"], n
    workers = {w["pid"] for w in warm.status()["workers"]}
    assert pids[0] == pids[1] and pids[0] in workers     # the same worker ran both: the second was hooked again


def test_a_child_a_warm_command_forks_ends_with_the_script_not_in_the_worker(warm, tmp_path):
    """A child of os.fork() that reaches the end of the script exits there, as in a cold process: it does not
    return into the worker's loop and answer the wrapper before the command's parent has finished."""
    worker = idle_worker(warm)["pid"]
    out = run_py(warm, tmp_path, """
        import os, time
        pid = os.fork()
        if pid:
            time.sleep(1.5)
            _, status = os.waitpid(pid, 0)
            print("parent", os.getpid(), os.waitstatus_to_exitcode(status), flush=True)
        else:
            print("child", flush=True)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["child", "parent", str(worker), "0"], out.stdout
    idle_worker(warm)


def test_by_default_each_command_gets_a_worker_forked_for_it(krex, tmp_path):
    krex.start_controller("--warm-workers", "2", "--worker-preload", "json")
    assert run_py(krex, tmp_path, "pass", name="first.py").returncode == 0
    # forks is None while the zygote starts, then whether it forks
    zygote = wait_for(lambda: next((z for z in krex.status()["zygotes"] if z["forks"] is not None), None), timeout=60,
                      what="a zygote started")
    assert zygote["forks"] is True
    pids = []
    for i in range(3):
        wait_for(lambda: sum(w["state"] == "idle" for w in krex.status()["workers"]) == 2, timeout=60,
                 what="two idle workers")
        out = run_py(krex, tmp_path, "import os, sys; print(os.getpid(), os.getppid(), 'json' in sys.modules)",
                     name=f"p{i}.py")
        pid, ppid, preloaded = out.stdout.split()
        assert int(ppid) == zygote["pid"] and preloaded == "True", out.stderr   # forked, modules already there
        pids.append(int(pid))
    assert len(set(pids)) == 3                        # a fresh process each time
    from conftest import proc_state

    wait_for(lambda: all(proc_state(p) is None for p in pids), timeout=10, what="used workers reaped")


def test_a_zygote_that_cannot_fork_safely_starts_workers_as_new_interpreters(krex, tmp_path):
    env = preloading(krex, tmp_path, "spins", "import threading, time\n"
                     "threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n")
    zygote = wait_for(lambda: next((z for z in krex.status()["zygotes"] if z["ready"]), None), timeout=60,
                      what="a ready zygote")
    assert zygote["forks"] is False                   # a Python thread runs in it: forking could deadlock
    idle_worker(krex)
    out = run_py(krex, tmp_path, "import os, sys; print(os.getppid(), 'spins' in sys.modules)", env=env, name="p.py")
    assert out.stdout.split() == [str(zygote["pid"]), "True"], out.stderr


def test_losing_the_controller_loses_no_command_and_leaves_no_worker(krex, tmp_path):
    krex.start_controller("--warm-workers", "2", "--worker-preload", "json")
    assert run_py(krex, tmp_path, "pass", name="first.py").returncode == 0
    zygote = wait_for(lambda: next((z for z in krex.status()["zygotes"] if z["ready"]), None), timeout=60,
                      what="a ready zygote")
    wait_for(lambda: len(krex.status()["workers"]) == 2, timeout=60, what="two workers")
    workers = [w["pid"] for w in krex.status()["workers"]]
    script = tmp_path / "slow.py"
    script.write_text("import sys, time\nprint('ready', flush=True)\nsys.stdin.readline()\nprint('finished')\n")
    p = krex.popen([sys.executable, str(script)], stdin=subprocess.PIPE)
    assert p.stdout.readline() == "ready\n"
    krex.ctl.kill()                                   # the controller dies while the command runs warm
    krex.ctl.wait()
    out, err = p.communicate("go\n", timeout=30)
    assert p.returncode == 0 and out == "finished\n", err
    for pid in [zygote["pid"]] + workers:             # the idle worker left, the busy one after its command
        wait_for(lambda pid=pid: proc_state(pid) is None, timeout=15, what=f"pool process {pid} gone")


def test_a_command_waits_for_the_next_worker_rather_than_starting_cold(krex, tmp_path):
    zygote = ready_pool(krex, tmp_path)
    (tmp_path / "long.py").write_text("import os, time\nprint(os.getppid(), flush=True)\ntime.sleep(1)\n")
    first = krex.popen([sys.executable, str(tmp_path / "long.py")])
    assert int(first.stdout.readline()) == zygote["pid"]        # the only worker is busy for a second
    out = run_py(krex, tmp_path, "import os; print(os.getppid())", name="b.py")
    assert int(out.stdout) == zygote["pid"], out.stderr            # it waited for the next one
    first.communicate(timeout=30)
    out = run_py(krex, tmp_path, "import os; print(os.getppid())", env={"KREX_WARM_WAIT": "soon"}, name="x.py")
    assert out.returncode == 2 and out.stderr.strip() == "krex: KREX_WARM_WAIT must be a number of seconds (0 to 3600), not 'soon'"


def test_a_busy_worker_leaves_a_spare_ready_and_at_most_twice_the_pool_live(krex, tmp_path):
    zygote = ready_pool(krex, tmp_path)
    (tmp_path / "held.py").write_text("import os, sys\nprint(os.getppid(), flush=True)\nsys.stdin.readline()\n")
    held = []
    for n in range(2):                 # each takes the pool's one spare; the zygote readies another at once
        held.append(krex.popen([sys.executable, str(tmp_path / "held.py")], stdin=subprocess.PIPE))
        assert int(held[-1].stdout.readline()) == zygote["pid"]        # it ran warm
        if n == 0:
            idle_worker(krex)          # a spare while the first command still runs (not after it exits)
    time.sleep(1.0)                    # two busy: no third is started (at most twice the pool alive)
    assert [w["state"] for w in krex.status()["workers"]] == ["busy", "busy"]
    out = run_py(krex, tmp_path, "import os; print(os.getppid())", env={"KREX_WARM_WAIT": "0.5"}, name="c.py")
    assert out.returncode == 0 and int(out.stdout) != zygote["pid"], out.stderr   # cold
    for p in held:
        p.communicate("go\n", timeout=30)
        assert p.returncode == 0
    idle_worker(krex)


@pytest.mark.parametrize("workers", ["0", "1"])
def test_the_controller_tells_a_wrapper_whether_to_ask_for_a_warm_worker(krex, workers):
    from krex_ctl.wire import ops
    from krex_ctl.wire.client import Connection
    from krex_ctl.wire.frames import C

    krex.start_controller("--warm-workers", workers, "--worker-preload", "json")
    conn = Connection(str(krex.socket), C.KREX_ROLE_WRAPPER)
    try:   # without a pool the wrapper sends no dispatch request (one round trip and a hash less per command)
        assert conn.request(ops.JOB_COMMAND, command=["python", "x.py"], gpus=[0])["warm"] is (workers == "1")
    finally:
        conn.close()


def test_workers_that_cannot_start_stop_the_zygote_and_commands_run_cold(krex, tmp_path):
    env = preloading(krex, tmp_path, "nofork", "import os\nos.register_at_fork(after_in_child=lambda: os._exit(5))\n",
                     workers="2")
    wait_for(lambda: "went away" in krex.ctl_log.read_text(), timeout=60, what="the zygote giving up")
    assert "3 warm workers in a row died before they were ready" in krex.ctl_log.read_text()
    out = run_py(krex, tmp_path, "print('ran')", env=env, name="p.py")
    assert out.returncode == 0 and out.stdout == "ran\n", out.stderr
    time.sleep(1.5)
    assert not krex.status()["zygotes"] and not krex.status()["workers"]    # not restarted: no start loop
    assert [z["gpu"] for z in krex.status()["zygotes_failed"]] == [0]     # the status says so


def test_an_idle_worker_frozen_in_a_region_is_resumed_when_the_controller_dies(krex, tmp_path):
    from conftest import SNIP

    env = {"LD_LIBRARY_PATH": str(ROOT / "build" / "fakes")}
    krex.start_controller("--warm-workers", "1", "--worker-preload", "json")
    assert run_py(krex, tmp_path, "pass", env=env, name="first.py").returncode == 0
    worker = idle_worker(krex)["pid"]                # it holds a context on GPU 0: a sibling of any region
    release = tmp_path / "release"                   # the region is held until the worker has been resumed
    owner = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_HOLD_FILE": str(release)})
    wait_for(lambda: proc_state(worker) in ("T", "t"), what="the idle worker frozen by the region")
    krex.ctl.kill()                                  # no guardian has the worker in its tree: the zygote resumes it
    wait_for(lambda: proc_state(worker) not in ("T", "t"), timeout=5, what="the worker resumed")
    release.touch()
    owner.communicate(timeout=30)
    wait_for(lambda: proc_state(worker) is None, timeout=15, what="the idle worker gone with the controller")


@pytest.mark.parametrize("lib", ["libcuda.so.1", "libamdhip64.so"])
def test_a_worker_holds_a_context_before_its_first_command(krex, tmp_path, lib):
    only = tmp_path / "driver"                        # a node with just this one driver
    only.mkdir()
    (only / lib).symlink_to(ROOT / "build" / "fakes" / lib)
    env = {"LD_LIBRARY_PATH": str(only)}
    krex.start_controller("--warm-workers", "1", "--worker-preload", "json")
    assert run_py(krex, tmp_path, "pass", env=env, name="first.py").returncode == 0
    worker = idle_worker(krex)["pid"]
    shim = [c for c in krex.status()["clients"] if c["pid"] == worker and c["role"] == "shim"]
    assert shim and shim[0]["gpus"] == [0], krex.status()["clients"]


def test_a_warm_commands_own_gpu_children_are_not_frozen_by_its_region(krex, tmp_path):
    from conftest import SNIP

    env = {"LD_LIBRARY_PATH": str(ROOT / "build" / "fakes")}
    krex.start_controller("--warm-workers", "1", "--worker-preload", "json")
    assert run_py(krex, tmp_path, "pass", env=env, name="first.py").returncode == 0
    worker = idle_worker(krex)["pid"]
    out = run_py(krex, tmp_path, f"""
        import os, subprocess, time
        import krex
        from krex_ctl.procs import state
        stop = {str(tmp_path / "hog.stop")!r}
        child = subprocess.Popen([{str(SNIP / "hog")!r}], env=dict(os.environ, SNIPPET_MS="3000", SNIPPET_US="200",
                                                                   SNIPPET_STOP=stop), stdout=subprocess.DEVNULL)
        time.sleep(0.5)                               # registered and launching under the wrapper's job
        with krex.region("mine"):
            time.sleep(0.3)
            print(os.getpid(), state(child.pid))
        open(stop, "w").close()                       # the hog is done with
        child.wait()
    """, env=env)
    pid, child_state = out.stdout.splitlines()[-1].split()
    assert int(pid) == worker, out.stderr
    assert child_state not in ("T", "t")              # same command, same job: never its own sibling


@pytest.mark.parametrize("driver", ["none", "fake", "fake-no-gpu"])
def test_a_worker_retains_its_context_through_whatever_bindings_are_installed(tmp_path, driver):
    """retain_primary_context with cuda-python installed (the `cuda` extra, as on a GPU node) and no CUDA driver
    to load (an AMD node, a CPU machine): no GPU, warm for imports (""), as without cuda-python; it had raised,
    so every warm worker died before it was ready. With the fake driver: its context (""), or the driver's error
    when it has no GPU."""
    try:
        import importlib.util

        if importlib.util.find_spec("cuda.bindings") is None:
            pytest.skip("cuda-python is not installed (pip install 'krex[cuda]')")
    except ImportError:
        pytest.skip("cuda-python is not installed (pip install 'krex[cuda]')")
    empty = tmp_path / "nolib"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "KREX_FAKE_GPUS")}
    env["LD_LIBRARY_PATH"] = str(empty if driver == "none" else ROOT / "build" / "fakes")
    if driver == "fake-no-gpu":
        env["KREX_FAKE_GPUS"] = "0"
    code = ("import ctypes, json\n"
            "try:\n    ctypes.CDLL('libcuda.so.1'); real = True\nexcept OSError:\n    real = False\n"
            "from krex_ctl.worker import retain_primary_context\n"
            "print(json.dumps([real, retain_primary_context()]))")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                       env=dict(env, PYTHONPATH=str(ROOT)))
    assert p.returncode == 0, p.stderr[-2000:]
    found, said = json.loads(p.stdout.strip().splitlines()[-1])
    if driver == "none" and found:
        pytest.skip("this machine has a CUDA driver the loader finds")
    assert said == ("CUDA driver error 101" if driver == "fake-no-gpu" else ""), said   # 101: no device 0


def test_a_zygote_that_stops_is_in_the_status_and_commands_run_cold(krex, tmp_path):
    """A preloaded module that ends the process: the zygote dies before it is ready, is not started again, and
    `krex status` says that this environment's commands run cold; they do, and succeed."""
    env = preloading(krex, tmp_path, "dies", "import os\nos._exit(3)\n")
    failed = wait_for(lambda: krex.status()["zygotes_failed"], timeout=60, what="a stopped zygote")
    assert [(z["gpu"], z["environments"]) for z in failed] == [(0, 1)] and failed[0]["python"], failed
    assert not krex.status()["zygotes"]
    out = run_py(krex, tmp_path, "import sys; print('dies' in sys.modules)", env=env, name="again.py")
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr   # cold: nothing preloaded in it
    assert not krex.status()["workers"]
    text = subprocess.run([sys.executable, "-m", "krex_ctl", "status"], env=krex.env, capture_output=True,
                          text=True, timeout=30)
    assert "warm workers for GPU 0" in text.stdout and "stopped for 1 environment(s)" in text.stdout, text.stdout


def test_krex_warm_workers_for_a_controller_that_already_serves_is_said_not_ignored(krex, tmp_path):
    """KREX_WARM_WORKERS configures a controller `krex run` starts; with one already serving (here without
    workers) the command runs cold, and `krex run` says why in one line rather than nothing. Asking for what
    it has already says nothing."""
    krex.start_controller()
    for asked, said in (("2", True), ("0", False)):
        out = subprocess.run(krex.run_cmd([sys.executable, "-c", "print('ran')"]),
                             env={**krex.env, "KREX_WARM_WORKERS": asked}, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout == "ran\n", out.stderr
        line = (f"krex: KREX_WARM_WORKERS={asked} applies to a controller krex run starts; the one at {krex.socket} "
                f"(pid {krex.ctl.pid}) already serves with 0 warm workers per GPU")
        assert (line in out.stderr) == said, out.stderr


def test_a_child_of_a_warm_command_without_the_shim_is_said(warm, tmp_path):
    """A warm command runs in a worker, a child of the controller's pool, not under its wrapper: a child it starts
    with LD_PRELOAD dropped, on a GPU (NVML), was nobody's to the look for shimless processes, and the run said
    nothing. The worker busy with the command roots the walk: the run says it, the report names it."""
    worker = idle_worker(warm)["pid"]
    pidfile, go, rep = tmp_path / "child.pid", tmp_path / "go", tmp_path / "warm.json"
    script = tmp_path / "spawns.py"
    script.write_text(textwrap.dedent(f"""
        import os, subprocess
        print(os.getpid())
        subprocess.run(["env", "-u", "LD_PRELOAD", "sh", "-c",
                        "echo $$ > {pidfile}; while [ ! -e {go} ]; do sleep 0.05; done"], check=True)
    """))
    p = warm.popen([sys.executable, str(script)], report=rep)
    child = wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() and int(pidfile.read_text()),
                     what="the child's pid")
    warm.nvml.write_text(f"process 0 {child} 1000\n")
    wait_for(lambda: "without krex's shim" in warm.ctl_log.read_text(), what="the controller's line")
    go.touch()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0 and int(out.split()[0]) == worker, (out, err)          # it ran warm
    assert f"1 process(es) of the command ran GPU work without krex's shim (pid {child} (sh -c echo" in err, err
    [bare] = report_of(rep)["processes_without_shim"]
    assert bare["pid"] == child and bare["gpus"] == [0], bare
    assert "Traceback" not in warm.ctl_log.read_text(), warm.ctl_log.read_text()[-3000:]
