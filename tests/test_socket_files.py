"""The files next to a controller's socket: krex removes only a stale socket of its own, never a file it did
not create, and refuses planted lock and log files and a world-writable directory with one line."""

import fcntl
import os
import signal
import socket
import struct
import subprocess
import sys

import pytest

from conftest import ROOT, wait_for


def controller(krex, sock, *args, timeout=60):
    return subprocess.run([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(sock), "--state-file",
                           str(krex.dir / "s.state"), "--no-cpu-isolation", *args], env=krex.env, capture_output=True,
                          text=True, timeout=timeout)


def one_krex_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("krex: ") and "Traceback" not in stderr, stderr
    return lines[0]


def test_controller_never_unlinks_a_regular_file_at_its_socket_path(krex, tmp_path):
    """... nor leaves a PATH.lock next to what it refused (`--socket /tmp/rd`, a directory, made /tmp/rd.lock)."""
    f = tmp_path / "data.txt"
    f.write_text("precious\n")
    d = tmp_path / "dir"
    d.mkdir()
    for path, kind in ((f, "a regular file"), (d, "a directory")):
        r = controller(krex, path)
        assert r.returncode == 2
        assert f"is {kind}, not a socket" in one_krex_line(r.stderr)
        assert not (tmp_path / f"{path.name}.lock").exists()
    assert f.read_text() == "precious\n"


def test_krex_run_with_krex_socket_at_a_file_keeps_it_and_says_so_at_once(krex, tmp_path):
    f = tmp_path / "data.txt"
    f.write_text("precious\n")
    r = krex.run(["true"], env={"KREX_SOCKET": str(f)})
    assert r.returncode == 0
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("krex: ")]
    assert len(line) == 1, r.stderr
    assert line[0] == (f"krex: cannot start a controller at {f}: it exists and is a regular file, not a socket; "
                       "running without region exclusivity")
    assert f.read_text() == "precious\n"
    assert not (tmp_path / "data.txt.lock").exists() and not (tmp_path / "data.txt.log").exists()   # none made


def test_a_stale_socket_is_replaced_and_a_clean_stop_removes_only_its_own(krex, tmp_path):
    sock = tmp_path / "s.sock"
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(sock))
    stale.close()                                     # a socket nobody answers at: stale
    krex.socket = sock
    krex.env["KREX_SOCKET"] = str(sock)
    ctl = krex.start_controller()
    krex.status()                                     # serving (its signal handlers are in place)
    ctl.send_signal(signal.SIGTERM)
    assert ctl.wait(timeout=30) in (0, -signal.SIGTERM)
    assert not sock.exists()                          # its own socket is removed at a clean stop
    ctl = krex.start_controller()
    krex.status()
    sock.unlink()
    sock.write_text("put there later\n")              # not its socket any more
    ctl.send_signal(signal.SIGTERM)
    assert ctl.wait(timeout=30) in (0, -signal.SIGTERM)
    assert sock.read_text() == "put there later\n"


def test_the_gate_file_is_ours_alone(krex, tmp_path):
    """SOCKET.gate (the gate page for processes that cannot connect): a planted file or link there is refused
    in one line and left as it was; a dead controller's is replaced; a clean stop removes it."""
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    sock, gate = d / "krex.sock", d / "krex.sock.gate"
    gate.write_text("precious\n")
    r = controller(krex, sock)
    assert r.returncode == 2 and "not a krex gate file" in one_krex_line(r.stderr)
    assert gate.read_text() == "precious\n"
    assert not (d / "krex.sock.lock").exists()        # refused: the lock file its start made is gone with it
    gate.unlink()
    target = tmp_path / "target"
    target.write_text("kept\n")
    gate.symlink_to(target)
    r = controller(krex, sock)
    assert r.returncode == 2 and "symbolic link" in one_krex_line(r.stderr)
    assert target.read_text() == "kept\n"
    gate.unlink()
    krex.socket = sock
    krex.env["KREX_SOCKET"] = str(sock)
    ctl = krex.start_controller()
    krex.status()
    st = gate.lstat()
    assert st.st_mode & 0o777 == 0o444 and st.st_uid == os.geteuid() and gate.is_file() and not gate.is_symlink()
    ctl.kill()
    ctl.wait()
    assert gate.exists()                              # a dead controller's
    ctl = krex.start_controller()
    krex.status()
    assert struct.unpack_from("=4I", gate.read_bytes())[3] == ctl.pid   # replaced: the header names this one
    ctl.send_signal(signal.SIGTERM)
    assert ctl.wait(timeout=30) in (0, -signal.SIGTERM)
    assert not gate.exists()


# the resumer, forked as the controller starts, slowed between its fork and its closing of what it inherited (a
# loaded machine does that: its copies of the listening socket and the lock outlived a SIGKILLed controller)
SLOW_RESUMER = """
import os, time
_closerange, _controller = os.closerange, os.getpid()
def closerange(lo, hi):
    if os.getpid() != _controller:
        time.sleep(0.5)
    _closerange(lo, hi)
os.closerange = closerange
"""


def test_a_killed_controllers_socket_and_lock_go_with_it(krex, tmp_path):
    """Once a controller that answered is SIGKILLed and reaped, nothing listens at its socket and its lock is
    free: no process it forked (its resumer) still holds them. A connection that reached a copy held on would
    be reset when that copy closed (a `krex status` right after a new controller's start, seen once in CI), and
    a controller started meanwhile found the lock held or the old socket answering (exit status 4)."""
    import fcntl

    ctl = krex.start_controller(prelude=SLOW_RESUMER)
    krex.status()
    ctl.kill()
    ctl.wait()
    assert not krex.answers()
    fd = os.open(str(krex.socket) + ".lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)


def test_a_live_socket_is_not_taken_over(krex, tmp_path):
    krex.start_controller()
    r = controller(krex, krex.socket)
    assert r.returncode == 4 and "already serving" in one_krex_line(r.stderr)
    assert krex.answers()


def test_a_linked_lock_or_log_file_is_refused_and_its_target_untouched(krex, tmp_path):
    target = tmp_path / "root-only"
    target.write_text("secret\n")
    os.chmod(target, 0o600)
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    (d / "krex.sock.lock").symlink_to(target)
    r = controller(krex, d / "krex.sock")
    assert r.returncode == 2 and "symbolic link" in one_krex_line(r.stderr)
    (d / "krex.sock.lock").unlink()
    (d / "krex.sock.log").symlink_to(target)
    r = krex.run(["true"], env={"KREX_SOCKET": str(d / "krex.sock")})
    assert r.returncode == 0
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("krex: ")]
    assert len(line) == 1 and "log file" in line[0] and "symbolic link" in line[0], r.stderr
    assert target.read_text() == "secret\n"


def test_a_planted_lock_is_named_not_taken_for_a_controller(krex, tmp_path):
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    lock = d / "krex.sock.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                               f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
                               "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        r = controller(krex, d / "krex.sock")
        assert r.returncode == 4
        line = one_krex_line(r.stderr)
        assert f"held by pid {holder.pid}" in line and "no controller answers" in line
    finally:
        holder.kill()
        holder.wait()


def test_a_lock_file_open_to_others_is_refused(krex, tmp_path):
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    lock = d / "krex.sock.lock"
    lock.write_text("")
    os.chmod(lock, 0o644)          # another user could open it, and flock it
    r = controller(krex, d / "krex.sock")
    assert r.returncode == 2 and "open to other users" in one_krex_line(r.stderr)


@pytest.mark.skipif(os.geteuid() != 0, reason="the directory rule is a node controller's (root's)")
def test_a_node_controller_refuses_a_world_writable_directory(krex, tmp_path):
    d = tmp_path / "open"
    d.mkdir()
    os.chmod(d, 0o777)
    r = controller(krex, d / "krex.sock")
    assert r.returncode == 2 and "writable by every user" in one_krex_line(r.stderr)
    assert not (d / "krex.sock.lock").exists()


def test_a_socket_path_too_long_for_an_embedded_controller_is_said_at_once(krex, tmp_path):
    d = tmp_path / ("x" * 60) / ("y" * 60)
    d.mkdir(parents=True)
    r = krex.run(["true"], env={"KREX_SOCKET": str(d / "krex.sock")})
    assert r.returncode == 0
    line = [ln for ln in r.stderr.splitlines() if ln.startswith("krex: ")]
    assert len(line) == 1 and "107 bytes" in line[0] and "does not answer" not in line[0], r.stderr


def test_a_link_swapped_in_after_the_bind_is_never_followed(tmp_path, monkeypatch):
    """The socket's mode comes from the umask at its bind and its group from an lchown: someone who may write the
    socket's directory and swaps a link to another file in right after the bind changes nothing of that file (a
    chown and chmod by path made a root-only file the socket group's, 0660); the start is refused instead."""
    from types import SimpleNamespace

    from krex_ctl import server
    from krex_ctl.errors import KrexCommandError
    from krex_ctl.wire import client

    victim = tmp_path / "victim"
    victim.write_text("secret\n")
    victim.chmod(0o600)
    path = tmp_path / "krex.sock"
    bind = client.bind_private

    def bind_then_swap(p, mode=0o600):
        sock = bind(p, mode)
        os.unlink(p)
        os.symlink(victim, p)            # what a racing writer of the directory does
        return sock

    monkeypatch.setattr(client, "bind_private", bind_then_swap)
    with pytest.raises(KrexCommandError, match="replaced by something else"):
        server.listen_at(SimpleNamespace(socket_group=str(os.getgid() + 1 if os.getuid() == 0 else os.getgid()),
                                         socket_mode=0o660), str(path))
    st = victim.stat()
    assert st.st_mode & 0o777 == 0o600 and st.st_gid == os.getgid() and victim.read_text() == "secret\n"
    monkeypatch.setattr(client, "bind_private", bind)
    sock = server.listen_at(SimpleNamespace(socket_group=None, socket_mode=0o660), str(tmp_path / "ok.sock"))
    try:
        assert (tmp_path / "ok.sock").stat().st_mode & 0o777 == 0o660
    finally:
        sock.close()
