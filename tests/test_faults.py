"""Faults and bad input: nothing is left stopped, nobody gets in, the controller keeps serving."""

import json
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from conftest import SNIP, proc_state, report_of, stderr_until, wait_for
from krex_ctl.wire import client, frames
from krex_ctl.wire.frames import C, MSG


def raw_client(krex) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(str(krex.socket))
    return s


def read_frame(s: socket.socket):
    hdr = b""
    while len(hdr) < frames.HDR_SIZE:
        chunk = s.recv(frames.HDR_SIZE - len(hdr))
        if not chunk:
            return None
        hdr += chunk
    mtype, length, _ = frames.unpack_header(hdr)
    body = b""
    while len(body) < length:
        body += s.recv(length - len(body))
    return mtype, body


def test_version_mismatch_is_one_clear_sentence(krex):
    krex.start_controller()
    s = raw_client(krex)
    s.sendall(frames.pack(MSG["HELLO"], frames.encode("struct krex_hello", magic=frames.MAGIC, version=99,
                                                    role=C.KREX_ROLE_SHIM, job=0)))
    mtype, body = read_frame(s)
    assert mtype == MSG["ERROR"]
    err = frames.decode("struct krex_error", body)
    assert err.code == C.KREX_ERR_VERSION
    assert f"protocol {frames.VERSION}" in frames.cstr(err.text) and "99" in frames.cstr(err.text)
    assert read_frame(s) is None     # and the connection is closed
    assert krex.status()["controller"]["protocol"] == frames.VERSION


def test_a_gpu_process_of_another_protocol_taints_the_regions_beside_it(krex, tmp_path):
    """A shim of another krex version is refused and runs ungated (it cannot read this controller's gate page):
    the regions beside its life were said exclusive and clean, with its kernels inside them, and the controller
    logged it only at debug level. Now it is remembered as unregistered (every region beside it tainted, as for
    any refused process) and said at warning level. A wrapper or CLI of another version launches nothing."""
    krex.start_controller()

    def hello(role):
        s = raw_client(krex)             # this test's own process stands for the other version's
        s.sendall(frames.pack(MSG["HELLO"], frames.encode("struct krex_hello", magic=frames.MAGIC,
                                                        version=frames.VERSION + 1, role=role, job=0)))
        assert read_frame(s)[0] == MSG["ERROR"] and read_frame(s) is None

    def taints():
        rep = tmp_path / "r.json"
        out = krex.run([SNIP / "region"], report=rep, env={"SNIPPET_REGIONS": "1"})
        assert out.returncode == 0, out.stderr
        [region] = report_of(rep)["regions"]
        return region["taints"]

    hello(C.KREX_ROLE_CLI)
    assert "unregistered" not in taints()
    hello(C.KREX_ROLE_SHIM)
    assert "unregistered" in taints()
    log = krex.ctl_log.read_text()
    assert f"speaks krex protocol {frames.VERSION + 1}, this controller {frames.VERSION}: refused" in log, log


def test_garbage_frames_get_an_error_and_the_controller_lives(krex):
    krex.start_controller()
    rng = random.Random(1234)
    cases = [b"\x00" * 16, b"GET / HTTP/1.1\r\n\r\n",
             struct.pack("<IHHII", frames.MAGIC, MSG["HELLO"], 0, 1 << 30, 0),        # oversized
             struct.pack("<IHHII", frames.MAGIC, MSG["HELLO"], 0, 3, 0) + b"abc",     # truncated struct
             struct.pack("<IHHII", frames.MAGIC, 999, 0, 0, 0)]                      # unknown first type
    cases += [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))) for _ in range(40)]
    for data in cases:
        s = raw_client(krex)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        f = read_frame(s)
        assert f is None or f[0] == MSG["ERROR"]
        s.close()
    st = krex.status()
    assert st["counters"]["bad_frames"] >= 5
    out = krex.run([SNIP / "region"], env={"SNIPPET_REGIONS": "1"})
    assert out.returncode == 0 and "begin=0 end=0" in out.stdout


def test_disconnect_mid_handshake(krex):
    krex.start_controller()
    for n in (1, 8, 17):
        s = raw_client(krex)
        s.sendall(frames.pack(MSG["HELLO"], frames.encode("struct krex_hello", magic=frames.MAGIC,
                                                        version=frames.VERSION, role=2, job=0))[:n])
        s.close()
    assert krex.status()["counters"]["clients_total"] >= 3


def test_second_controller_on_the_same_socket_is_refused(krex):
    krex.start_controller()
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(krex.socket)],
                         env=krex.env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 4
    assert out.stderr.strip().splitlines()[-1] == f"krex: another krex controller is already serving {krex.socket}"
    assert krex.answers()


def test_second_controller_with_the_first_ones_metrics_address_is_refused_as_a_second_controller(krex, tmp_path):
    """With the running controller's config (its metrics address among its settings, as the packaged example has),
    a second start on the same socket failed on the port first: exit 2, 'cannot listen', not 4."""
    import socket as socketmod

    with socketmod.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    conf = tmp_path / "controller.json"
    conf.write_text(json.dumps({"metrics": f"127.0.0.1:{port}"}))
    krex.start_controller("--config", str(conf))
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(krex.socket),
                          "--config", str(conf)], env=krex.env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 4, out.stderr
    assert out.stderr.strip().splitlines()[-1] == f"krex: another krex controller is already serving {krex.socket}"
    assert krex.answers()


def test_stale_socket_file_is_replaced(krex):
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(krex.socket))
    s.close()                         # a socket file with nobody behind it
    assert not krex.answers()
    krex.start_controller()
    assert krex.answers()


def shut_unix_sockets(pid: int) -> int:
    """Shut down every Unix socket of a live process from outside (pidfd_getfd, then shutdown): its connection
    to the controller closes as an exec or a dropped connection closes it. How many; None where the kernel
    does not allow it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pidfd = os.pidfd_open(pid)
    n = 0
    try:
        for name in os.listdir(f"/proc/{pid}/fd"):
            try:
                if not os.readlink(f"/proc/{pid}/fd/{name}").startswith("socket:"):
                    continue
            except OSError:
                continue
            fd = libc.syscall(438, pidfd, int(name), 0)          # pidfd_getfd
            if fd < 0:
                return None
            s = socket.socket(fileno=fd)
            if s.family == socket.AF_UNIX:
                s.shutdown(socket.SHUT_RDWR)
                n += 1
            s.close()
    finally:
        os.close(pidfd)
    return n


def test_a_process_whose_connection_closes_while_frozen_is_resumed(krex, tmp_path):
    """Its connection closes while a region has it stopped (an exec, a dropped connection): the region's end
    would no longer resume it (the controller forgot it with its connection), so it is resumed at once, and the
    region it may now launch into is tainted unregistered."""
    krex.start_controller()
    hog, hog_pid = krex.start_sibling(SNIPPET_MS="6000")
    rep = tmp_path / "r.json"
    owner = krex.popen([SNIP / "region"], report=rep, env={"SNIPPET_REGIONS": "1", "SNIPPET_HOLD_US": "3000000"})
    wait_for(lambda: proc_state(hog_pid) in ("T", "t"), what="hog frozen")
    if not shut_unix_sockets(hog_pid):
        krex.stop_hogs()
        os.kill(hog_pid, signal.SIGCONT)
        pytest.skip("this kernel does not let a test take another process's socket (pidfd_getfd)")
    t0 = time.monotonic()
    wait_for(lambda: proc_state(hog_pid) not in ("T", "t"), timeout=2.0, interval=0.01, what="hog resumed")
    assert owner.poll() is None and time.monotonic() - t0 < 2.0    # resumed while the region still holds
    out, err = owner.communicate(timeout=30)
    assert owner.returncode == 0, err
    [r] = report_of(rep)["regions"]
    assert "unregistered" in r["taints"] and not r["exclusive"], r
    krex.stop_hogs()
    hog.communicate(timeout=30)


def test_controller_killed_mid_region_guardians_resume_the_job(krex, tmp_path):
    krex.start_controller()
    hog, hog_pid = krex.start_sibling(SNIPPET_MS="4000")
    owner = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_HOLD_US": "3000000"})
    wait_for(lambda: proc_state(hog_pid) in ("T", "t"), what="hog frozen")
    assert krex.state_file.exists() and hog_pid in [p for p, _ in json.loads(krex.state_file.read_text())["frozen"]]
    t0 = time.monotonic()
    krex.ctl.kill()
    wait_for(lambda: proc_state(hog_pid) not in ("T", "t"), timeout=1.0, interval=0.005, what="guardian resumed hog")
    assert time.monotonic() - t0 < 1.0
    # and back on every CPU it had: the region had moved it off the reserved one, and the controller that would
    # have put it back is gone (the wrapper's own mask then was the reduced one, which stayed for good)
    err = stderr_until(hog, "lost the controller")     # its wrapper's guardian has resumed the job by now
    assert "lost the controller" in err
    everything = os.sched_getaffinity(0)
    time.sleep(1.0)               # unfixed, the reduced mask was there a moment after that line
    assert all(os.sched_getaffinity(int(t)) == everything for t in os.listdir(f"/proc/{hog_pid}/task"))
    out, err = hog.communicate(timeout=30)
    assert hog.returncode == 0
    owner.communicate(timeout=30)
    assert owner.returncode == 0


def test_restarted_controller_resumes_what_its_state_file_lists(krex, tmp_path):
    victim = subprocess.Popen(["sleep", "30"])
    try:
        os.kill(victim.pid, signal.SIGSTOP)
        wait_for(lambda: proc_state(victim.pid) == "T", what="victim stopped")
        from krex_ctl.procs import start_time

        krex.state_file.write_text(json.dumps({"frozen": [[victim.pid, start_time(victim.pid)],
                                                          [victim.pid, 1]]}))   # second entry: a reused pid
        krex.start_controller()
        wait_for(lambda: proc_state(victim.pid) == "S", timeout=5, what="victim resumed")
        assert not krex.state_file.exists()
    finally:
        victim.kill()
        victim.wait()


def test_sibling_that_never_acknowledges_the_drain(krex, tmp_path):
    """A client that registers a context but never answers DRAIN: the region is granted after the bound,
    the laggard is reported, frozen, and resumed at the end."""
    krex.start_controller("--drain-timeout", "0.3")
    from krex_ctl.wire.client import Connection

    mute = Connection(krex.socket, C.KREX_ROLE_SHIM)
    mute.send(MSG["CONTEXT"], frames.encode("struct krex_context", vendor=1, device=0))
    time.sleep(0.1)
    out = krex.run([SNIP / "region"], report=tmp_path / "r.json", env={"SNIPPET_REGIONS": "1"})
    assert out.returncode == 0
    r = json.loads((tmp_path / "r.json").read_text())["regions"][0]
    assert r["drain_timeouts"] == 1 and r["frozen"] == 1
    assert 0.25e9 < r["granted_ns"] - r["requested_ns"] < 2e9
    mute.close()
    assert proc_state(os.getpid()) not in ("T", "t")


def test_only_registered_clients_are_signalled(krex, tmp_path):
    """A process that is neither a client nor in a job is never stopped, even on a busy GPU."""
    krex.start_controller()
    bystander = subprocess.Popen(["sleep", "30"])
    try:
        out = krex.run([SNIP / "region"], env={"SNIPPET_REGIONS": "2", "SNIPPET_HOLD_US": "200000"})
        assert out.returncode == 0
        assert proc_state(bystander.pid) == "S"
        assert os.sched_getaffinity(bystander.pid) == os.sched_getaffinity(0)
    finally:
        bystander.kill()
        bystander.wait()


def test_claimed_job_is_not_trusted(krex, tmp_path):
    """A job is honoured only for descendants of its wrapper: a stranger claiming the id gets a job of
    its own (so it is still drained and frozen like any sibling), a real child gets the wrapper's."""
    krex.start_controller()
    child_code = ("import sys; from krex_ctl.wire.frames import C; from krex_ctl.wire.client import Connection; "
                  "c = Connection(sys.argv[1], C.KREX_ROLE_SHIM, job=int(sys.argv[2])); print(c.job)")
    wrapper_code = ("import subprocess, sys; from krex_ctl.wire.frames import C; from krex_ctl.wire.client import Connection; "
                    "w = Connection(sys.argv[1], C.KREX_ROLE_WRAPPER); print(w.job, flush=True); "
                    "out = subprocess.run([sys.executable, '-c', sys.argv[2], sys.argv[1], str(w.job)], "
                    "capture_output=True, text=True).stdout.strip(); print(out, flush=True); sys.stdin.read()")
    w = subprocess.Popen([sys.executable, "-c", wrapper_code, str(krex.socket), child_code], env=krex.env,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        job = int(w.stdout.readline())
        assert int(w.stdout.readline()) == job            # its descendant is in its job
        from krex_ctl.wire.client import Connection

        stranger = Connection(krex.socket, C.KREX_ROLE_SHIM, job=job)
        assert stranger.job != job                          # we are not its descendant
        stranger.close()
    finally:
        w.communicate("", timeout=10)


def test_one_outstanding_request_per_client(krex):
    krex.start_controller()
    from krex_ctl.wire.client import Connection

    c = Connection(krex.socket, C.KREX_ROLE_PYTHON)
    begin = frames.encode("struct krex_region_begin", gpu_mask=1, requested_ns=1, name="a")
    c.send(MSG["REGION_BEGIN"], begin)
    assert c.recv().name == "REGION_GRANTED"
    c.send(MSG["REGION_BEGIN"], begin)
    f = c.recv()
    assert f.name == "ERROR" and frames.decode("struct krex_error", f.payload).code == C.KREX_ERR_LIMIT
    c.send(MSG["REGION_BEGIN"], frames.encode("struct krex_region_begin", gpu_mask=0, requested_ns=1, name="b"))
    assert frames.decode("struct krex_error", c.recv().payload).code == C.KREX_ERR_GPU
    c.close()


def test_frozen_sibling_that_dies_while_frozen_does_not_break_the_region(krex, tmp_path):
    """A frozen sibling SIGKILLed inside a region: the region still ends cleanly and the others resume."""
    krex.start_controller()
    hogs = [krex.popen([SNIP / "hog"], env={"SNIPPET_MS": "5000"}) for _ in range(2)]
    wait_for(lambda: sum(c["role"] == "shim" for c in krex.status()["clients"]) == 2, what="hogs registered")
    pids = [c["pid"] for c in krex.status()["clients"] if c["role"] == "shim"]
    owner = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "2", "SNIPPET_HOLD_US": "700000"})
    wait_for(lambda: all(proc_state(p) == "T" for p in pids), what="hogs frozen")
    os.kill(pids[0], signal.SIGKILL)
    owner.communicate(timeout=30)
    assert owner.returncode == 0
    wait_for(lambda: proc_state(pids[1]) not in ("T", "t"), timeout=2, what="survivor resumed")
    krex.stop_hogs()
    for h in hogs:
        h.communicate(timeout=30)
    assert krex.status()["gpus"] == [] or all(g["owner"] is None for g in krex.status()["gpus"])


def test_sibling_that_exits_during_the_drain_does_not_hold_it_up(krex, tmp_path):
    krex.start_controller("--drain-timeout", "10")
    from krex_ctl.wire.client import Connection

    mute = Connection(krex.socket, C.KREX_ROLE_SHIM)
    mute.send(MSG["CONTEXT"], frames.encode("struct krex_context", vendor=1, device=0))
    time.sleep(0.1)
    owner = krex.popen([SNIP / "region"], report=tmp_path / "r.json", env={"SNIPPET_REGIONS": "1"})
    wait_for(lambda: any(g["owner"] and g["owner"]["state"] == "draining" for g in krex.status()["gpus"]),
             what="region draining")
    mute.close()                                   # the sibling goes away without acknowledging
    owner.communicate(timeout=30)
    r = json.loads((tmp_path / "r.json").read_text())["regions"][0]
    assert r["drain_timeouts"] == 0 and r["granted_ns"] - r["requested_ns"] < 5e9


def test_socket_group_and_mode(krex, tmp_path):
    import grp

    group = grp.getgrgid(os.getgid()).gr_name
    krex.start_controller("--socket-group", group)
    st = os.stat(krex.socket)
    assert oct(st.st_mode & 0o777) == "0o660" and st.st_gid == os.getgid()
    krex.stop()
    krex.start_controller("--socket-group", "4242")    # a gid with no name (a Kubernetes supplementalGroups one)
    st = os.stat(krex.socket)
    assert oct(st.st_mode & 0o777) == "0o660" and st.st_gid == 4242
    krex.stop()
    for bad in ("4294967295", "99999999999", "\u00b2"):      # -1 to chown (no change), too large, not ASCII
        out = subprocess.run([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(tmp_path / "g.sock"),
                              "--socket-group", bad], env=krex.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and len(out.stderr.splitlines()) == 1 and "--socket-group" in out.stderr, out
        assert not (tmp_path / "g.sock").exists()


def test_client_limit(krex, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"max_clients": 2}))
    krex.start_controller("--config", str(cfg))
    from krex_ctl.wire.client import Connection

    held = [Connection(krex.socket, C.KREX_ROLE_PYTHON) for _ in range(2)]
    with pytest.raises(Exception, match="limit of 2 clients"):
        Connection(krex.socket, C.KREX_ROLE_PYTHON)
    for c in held:
        c.close()


def test_a_controller_that_died_holding_cores_has_the_masks_put_back_by_the_next(krex, tmp_path, cpus):
    """GPU processes with the shim alone (Slurm's preload mode, a pod without krex run): no wrapper repairs their
    CPU masks. A controller SIGKILLed while a region held a reserved core left the owner confined to it and the
    others off it for good (the saved masks were only in its memory); the next one puts them back at its start."""
    import signal as sig

    from conftest import ROOT, SNIP, wait_for

    krex.start_controller("--reserved-cores", str(cpus[-1]), "--no-freeze")   # the other process moved, not stopped
    shim_only = dict(krex.env, LD_PRELOAD=str(ROOT / "build" / "libkrex.so"))
    other = subprocess.Popen([SNIP / "hog"], env=dict(shim_only, SNIPPET_STREAMS="0", SNIPPET_MS="60000"))
    release = tmp_path / "release"
    owner = subprocess.Popen([SNIP / "region"], env=dict(shim_only, SNIPPET_REGIONS="1", SNIPPET_HOLD_FILE=str(release)),
                             stdout=subprocess.DEVNULL)
    try:
        wait_for(lambda: os.sched_getaffinity(owner.pid) == {cpus[-1]} and cpus[-1] not in os.sched_getaffinity(other.pid),
                 timeout=60, what="the region's isolation")
        from krex_ctl.wire import runtime

        wait_for(lambda: len(runtime.read_affinity(str(krex.socket))) >= 2, what="the saved masks written (each second)")
        krex.ctl.send_signal(sig.SIGKILL)
        krex.ctl.wait()
        krex.start_controller("--reserved-cores", str(cpus[-1]), "--no-freeze")
        wait_for(lambda: os.sched_getaffinity(owner.pid) == set(cpus) == os.sched_getaffinity(other.pid),
                 timeout=30, what="the masks put back")
        # (said just after it puts them back: read once the line is there)
        wait_for(lambda: "put back the CPU masks of" in krex.ctl_log.read_text(), timeout=10, what="its log line")
    finally:
        release.touch()
        krex.stop_hogs()
        for p in (owner, other):
            p.kill()
            p.wait()


def test_sigusr1_and_sigusr2_leave_the_controller_serving(krex):
    """Their default action killed the controller (rc 138), leaving its socket behind: they mean nothing to it."""
    krex.start_controller()
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        krex.ctl.send_signal(sig)
    time.sleep(0.5)
    assert krex.ctl.poll() is None and krex.answers()
    log = krex.ctl_log.read_text()
    assert "SIGUSR1 received: ignored" in log and "SIGUSR2 received: ignored" in log, log[-2000:]


def test_the_resumer_takes_stray_signals_quietly_and_names_itself(krex):
    """SIGUSR1 to the resumer (`pkill -USR1 -f 'krex controller'` reaches it: it has the controller's arguments)
    wrote to the controller's signal wakeup descriptor, closed in it: a traceback in the controller's log. It
    ignores such signals, and its name (comm) says what it is."""
    krex.start_controller()
    pid = krex.status()["controller"]["resumer_pid"]
    assert pid and open(f"/proc/{pid}/comm").read().strip() == "krex-resumer"
    for sig in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGTERM, signal.SIGHUP):
        os.kill(pid, sig)
    time.sleep(0.5)
    assert proc_state(pid) not in (None, "Z"), proc_state(pid)
    log = krex.ctl_log.read_text()
    assert "Exception ignored" not in log and "Traceback" not in log, log[-2000:]
