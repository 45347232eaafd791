"""A GPU process the controller refused (max_clients, per-user limit, out of descriptors) is not invisible:
its shim honours the gate page that came with the refusal and asks again until it is registered, and a
region during which such a process was alive is not reported exclusive (taint `unregistered`). Nor is one
whose connect() fails outright: it honours the gate file next to the socket (SOCKET.gate), its regions say
so, and a process out of descriptors gets room for the shim's own socket and registers."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from conftest import BUILD, SNIP, answers, overlaps, report_of, wait_for

from krex_ctl.wire.client import Connection
from krex_ctl.wire.frames import C


def shim_pids(krex):
    return {c["pid"] for c in krex.status()["clients"] if c["role"] == "shim"}


def most_inside(trace, regions, pid) -> int:
    """The most kernels of pid on one stream that ran inside one region. A process that waits at a closed
    gate but is drained by nobody carries into a region only what it had queued before the gate closed
    (the hog snippet queues 4 a stream); one that ignores the gate runs on throughout."""
    counts: dict = {}
    for p, sid, start, end, _name in trace:
        if p != pid:
            continue
        for i, r in enumerate(regions):
            if r.get("granted_ns") and start < r["ended_ns"] and end > r["granted_ns"]:
                counts[(i, sid)] = counts.get((i, sid), 0) + 1
    return max(counts.values(), default=0)


def preloaded(krex, cmd, **env):
    return subprocess.Popen([str(c) for c in cmd], env=dict(krex.env, LD_PRELOAD=str(BUILD / "libkrex.so"), **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_refused_process_honours_gates_and_taints(krex, tmp_path):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"max_clients": 3}))
    krex.start_controller("--config", str(cfg))
    go = tmp_path / "go"
    owner = krex.popen([SNIP / "region"], report=tmp_path / "r.json",
                       env={"SNIPPET_REGIONS": "15", "SNIPPET_N": "5", "SNIPPET_US": "2000", "SNIPPET_GAP_US": "3000",
                            "SNIPPET_WAIT_FILE": str(go)})
    wait_for(lambda: len(shim_pids(krex)) == 1, timeout=60, what="owner registered")
    filler = Connection(str(krex.socket), C.KREX_ROLE_PYTHON)      # the controller is full now
    hog_env = dict(krex.env, LD_PRELOAD=str(BUILD / "libkrex.so"), SNIPPET_MS="30000", SNIPPET_US="300",
                   SNIPPET_STREAMS="2")
    hog = subprocess.Popen([str(SNIP / "hog")], env=hog_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    try:
        wait_for(lambda: any(t[4] == "hog" for t in krex.trace_lines()), timeout=60, what="hog launching")
        go.write_text("")
        out, err = owner.communicate(timeout=120)
        assert owner.returncode == 0, err
        regions = report_of(tmp_path / "r.json")["regions"]
        assert len(regions) == 15
        exclusive = [r for r in regions if r["exclusive"]]
        assert overlaps(krex.trace_lines(), exclusive) == []
        # the hog was alive and refused throughout: every region says so
        assert all("unregistered" in r["taints"] and hog.pid in r["unregistered_pids"] for r in regions)
        # and it waited at the closed gates (it ran on through every region when its GPU was never gated)
        assert most_inside(krex.trace_lines(), regions, hog.pid) <= 4
        # a slot frees up: the refused shim keeps asking and is registered
        filler.close()
        wait_for(lambda: hog.pid in shim_pids(krex), timeout=60, what="refused shim registered on retry")
    finally:
        hog.send_signal(signal.SIGKILL)
        _, herr = hog.communicate(timeout=30)
    assert "controller refused us" in herr and "asking again" in herr
    assert herr.count("controller refused us") == 1      # said once, not at every retry


def test_a_process_that_cannot_connect_honours_the_gate_file(krex, tmp_path):
    """The socket moved away for a while, a file in its place (connect() fails; the controller serves on, and
    binds no socket over a file it did not make): a GPU process started then ran free inside another job's
    regions, reported exclusive. Now its shim honours the gate file next to the socket, the controller sees it
    there and reports those regions `unregistered`, and once the socket is back the shim registers (it keeps
    asking) and is drained and frozen like any other."""
    krex.start_controller()
    go = tmp_path / "go"
    owner = krex.popen([SNIP / "region"], report=tmp_path / "r.json",
                       env={"SNIPPET_REGIONS": "3", "SNIPPET_HOLD_US": "300000", "SNIPPET_GAP_US": "50000",
                            "SNIPPET_WAIT_FILE": str(go)})
    wait_for(lambda: len(shim_pids(krex)) == 1, timeout=60, what="owner registered")
    away, placeholder = tmp_path / "away.sock", tmp_path / "placeholder"
    os.link(krex.socket, away)                 # the socket kept, and a file in its place in one rename: never a
    placeholder.write_text("")                 # moment with nothing there (the controller would bind a new one)
    os.rename(placeholder, krex.socket)
    hog = preloaded(krex, [SNIP / "hog"], SNIPPET_MS="30000", SNIPPET_US="300", SNIPPET_STREAMS="2")
    try:
        wait_for(lambda: any(t[0] == hog.pid for t in krex.trace_lines()), timeout=60, what="hog launching")
        go.write_text("")
        out, err = owner.communicate(timeout=120)
        assert owner.returncode == 0, err
        regions = report_of(tmp_path / "r.json")["regions"]
        assert len(regions) == 3
        assert all("unregistered" in r["taints"] and not r["exclusive"] and hog.pid in r["unregistered_pids"]
                   for r in regions), [(r["taints"], r.get("unregistered_pids")) for r in regions]
        assert most_inside(krex.trace_lines(), regions, hog.pid) <= 4
        gate_file = Path(str(krex.socket) + ".gate")
        assert gate_file.stat().st_mode & 0o777 == 0o444 and gate_file.stat().st_uid == os.getuid()
        os.rename(away, krex.socket)
        wait_for(lambda: hog.pid in shim_pids(krex), timeout=30, what="the shim registered once it could")
        res = krex.run([SNIP / "region"], report=tmp_path / "r2.json", env={"SNIPPET_REGIONS": "2",
                                                                             "SNIPPET_HOLD_US": "100000"})
        assert res.returncode == 0, res.stderr
        later = report_of(tmp_path / "r2.json")["regions"]
        assert all(r["exclusive"] and r["frozen"] == 1 for r in later), [(r["taints"], r["frozen"]) for r in later]
        assert overlaps(krex.trace_lines(), later) == []
    finally:
        hog.send_signal(signal.SIGKILL)
        _, herr = hog.communicate(timeout=30)
        if away.exists():
            os.rename(away, krex.socket)
    assert herr.count("honouring its gates") == 1, herr


def test_a_process_out_of_descriptors_registers(krex, tmp_path):
    """Its descriptor table full at its first context (soft limit reached, the hard one higher), the shim's
    socket() failed with EMFILE and the process ran free beside other jobs' exclusive regions. Now the shim
    makes room for its own descriptor past the soft limit: it registers, and is drained and frozen."""
    import resource

    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < 128:
        import pytest

        pytest.skip("the hard descriptor limit leaves no room above the snippet's soft 64")
    krex.start_controller()
    hog = preloaded(krex, [SNIP / "hog"], SNIPPET_FILL_FDS="1", SNIPPET_MS="30000", SNIPPET_US="300")
    try:
        wait_for(lambda: any(t[0] == hog.pid for t in krex.trace_lines()), timeout=60, what="hog launching")
        res = krex.run([SNIP / "region"], report=tmp_path / "r.json", env={"SNIPPET_REGIONS": "3",
                                                                            "SNIPPET_HOLD_US": "100000"})
        assert res.returncode == 0, res.stderr
        regions = report_of(tmp_path / "r.json")["regions"]
        assert hog.pid in shim_pids(krex)
        assert len(regions) == 3 and all(r["exclusive"] and r["frozen"] == 1 for r in regions), \
            [(r["taints"], r["frozen"]) for r in regions]
        assert overlaps(krex.trace_lines(), regions) == []
    finally:
        hog.send_signal(signal.SIGKILL)
        hog.communicate(timeout=30)


def test_unregistered_book():
    """The book of refused processes: alive ones count for every region they overlap, gone ones only for
    regions that began before they were found gone, registered ones from their registration on."""
    from krex_ctl.unregistered import Unregistered

    book = Unregistered()
    p = subprocess.Popen(["sleep", "30"])
    try:
        book.note(p.pid, now_ns=100)
        assert book.during(50, 200) == [p.pid] and book.during(300, 400) == [p.pid]
        book.registered(p.pid, now_ns=500)
        assert book.during(400, 600) == [p.pid]        # it was unregistered until 500
        assert book.during(600, 700) == []
        book.note(p.pid, now_ns=800)                   # refused again (the controller restarted its count)
        assert book.during(900, 1000) == [p.pid]
    finally:
        p.kill()
        p.wait()
    book.check(10**17)                                 # found gone then
    assert book.during(10**18, 10**18 + 1) == []       # later regions are not its business
    book.note(0)
    assert book.refusals == 3


def test_another_controller_on_the_gpu_taints_regions(krex, tmp_path):
    """Two per-user controllers on one GPU (two users without a node controller): neither gates the other's
    processes, so each region while the other has a GPU process says so (other_controller, not exclusive) and
    the controller warns once; while the other has none (before its process came, after it left) regions are
    exclusive (registry.py: the entry's `active` and `idle_since_ns`)."""
    krex.start_controller()
    other_sock = tmp_path / "other.sock"
    other_log = open(tmp_path / "other.log", "ab")
    other = subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--socket", str(other_sock),
                              "--state-file", str(tmp_path / "other.state"), "--no-cpu-isolation"],
                             env=krex.env, stdout=other_log, stderr=other_log)
    try:
        wait_for(lambda: answers(other_sock), timeout=60, what="second controller")
        # while it has no GPU process it cannot have launched anything: regions stay exclusive
        res = krex.run([SNIP / "region"], report=tmp_path / "r0.json", env={"SNIPPET_REGIONS": "2"}, timeout=120)
        assert res.returncode == 0, res.stderr
        assert all(r["exclusive"] for r in report_of(tmp_path / "r0.json")["regions"])
        hog = krex.popen([SNIP / "hog"], env={"KREX_SOCKET": str(other_sock), "SNIPPET_MS": "30000",
                                              "SNIPPET_US": "300"})
        wait_for(lambda: any(t[4] == "hog" for t in krex.trace_lines()), timeout=60, what="hog launching")
        res = krex.run([SNIP / "region"], report=tmp_path / "r.json",
                       env={"SNIPPET_REGIONS": "8", "SNIPPET_US": "2000", "SNIPPET_GAP_US": "2000"}, timeout=120)
        assert res.returncode == 0, res.stderr
        regions = report_of(tmp_path / "r.json")["regions"]
        assert regions and all("other_controller" in r["taints"] and not r["exclusive"] for r in regions)
        assert all(r["other_controllers"][0]["pid"] == other.pid for r in regions)
        assert overlaps(krex.trace_lines(), [r for r in regions if r["exclusive"]]) == []
        log = krex.ctl_log.read_text()
        assert log.count("another krex controller (pid %d" % other.pid) == 1
        assert "only a node controller" in log
        hog.kill()
        hog.communicate(timeout=30)
        # its GPU process gone, a region that begins later is exclusive again, the other controller still up
        entry = next(p for p in krex.registry.iterdir() if p.name.endswith(f"-{other.pid}"))
        wait_for(lambda: json.loads(entry.read_text())["active"] is False, timeout=30, what="other controller idle")
        res = krex.run([SNIP / "region"], report=tmp_path / "r1.json", env={"SNIPPET_REGIONS": "2"}, timeout=120)
        assert all(r["exclusive"] for r in report_of(tmp_path / "r1.json")["regions"])
    finally:
        other.send_signal(signal.SIGTERM)
        other.wait(timeout=30)
    # a clean stop withdraws its entry: regions are exclusive again
    assert not [p for p in krex.registry.iterdir() if str(other.pid) in p.name]
    res = krex.run([SNIP / "region"], report=tmp_path / "r2.json", env={"SNIPPET_REGIONS": "2"})
    assert all(r["exclusive"] for r in report_of(tmp_path / "r2.json")["regions"])


def test_registry_entries_are_checked():
    """A planted entry (a link, a stranger's file naming a dead or foreign pid, junk) is never taken for a
    live controller of more than it proves; nor is a SIGKILLed controller not yet reaped (a zombie: every
    region after a restart was tainted other_controller by its predecessor while that one was unreaped)."""
    import tempfile

    from krex_ctl import procs, registry

    zombie = subprocess.Popen(["true"])
    wait_for(lambda: procs.state(zombie.pid) == "Z", what="a zombie")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d)
        (p / "krex-controller-0-1").symlink_to("/etc/passwd")
        (p / "krex-controller-0-2").write_text("junk")
        (p / "krex-controller-0-3").write_text(json.dumps({"pid": 1, "start": 12345, "uid": os.getuid() + 1,
                                                           "socket": "x", "gpus": [0]}))
        (p / "krex-controller-0-4").write_text(json.dumps({"pid": os.getpid(), "start": 1, "uid": os.getuid(),
                                                           "socket": "x", "gpus": [0]}))   # wrong start time
        (p / "krex-controller-0-5").write_text(json.dumps({"pid": zombie.pid, "start": procs.start_time(zombie.pid),
                                                           "uid": os.getuid(), "socket": "x", "gpus": [0]}))
        os.environ["KREX_REGISTRY_DIR"] = d
        try:
            reg = registry.Registry("/nowhere", [0], node=False)
            assert reg.others(1) == []
        finally:
            del os.environ["KREX_REGISTRY_DIR"]
            zombie.wait()


def test_a_controller_removes_the_entries_of_its_users_controllers_that_are_gone(tmp_path, monkeypatch):
    """A SIGKILLed controller's registry entry stayed (/dev/shm by default) until a controller of the same pid
    announced itself; the next controller of the same user removes it, and nothing else: not a live one's, not a
    file that is no entry, not a link, not another user's."""
    from krex_ctl import procs, registry

    uid = os.getuid()
    gone = subprocess.Popen(["true"])
    gone.wait()
    monkeypatch.setenv("KREX_REGISTRY_DIR", str(tmp_path))
    entry = {"uid": uid, "socket": "x", "gpus": [0]}
    (tmp_path / f"krex-controller-{uid}-{gone.pid}").write_text(json.dumps(dict(entry, pid=gone.pid, start=1)))
    live = tmp_path / f"krex-controller-{uid}-{os.getppid()}"
    live.write_text(json.dumps(dict(entry, pid=os.getppid(), start=procs.start_time(os.getppid()))))
    (tmp_path / f"krex-controller-{uid}-3").write_text("junk")
    (tmp_path / f"krex-controller-{uid}-4").symlink_to(tmp_path / f"krex-controller-{uid}-{gone.pid}")
    (tmp_path / f"krex-controller-{uid + 1}-5").write_text(json.dumps(dict(entry, uid=uid + 1, pid=gone.pid, start=1)))
    reg = registry.Registry("/nowhere", [0], node=False)
    reg.announce()
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == sorted([f"krex-controller-{uid}-{os.getpid()}", live.name, f"krex-controller-{uid}-3",
                           f"krex-controller-{uid}-4", f"krex-controller-{uid + 1}-5"]), left
    reg.withdraw()
    assert not (tmp_path / f"krex-controller-{uid}-{os.getpid()}").exists()


def test_krex_run_warns_of_another_users_controller(krex, tmp_path):
    """`krex run` says in one line that another user's per-user controller runs here (on a node controller it
    said regions were exclusive only of this user's work)."""
    if os.getuid() != 0:
        import pytest

        pytest.skip("needs root to plant another user's registry entry")
    from krex_ctl import procs

    krex.start_controller()
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        entry = krex.registry / f"krex-controller-4242-{sleeper.pid}"
        entry.write_text(json.dumps({"pid": sleeper.pid, "start": procs.start_time(sleeper.pid), "uid": 4242,
                                     "socket": "/tmp/krex-4242/krex.sock", "gpus": [0, 1], "node": False}))
        os.chown(entry, 4242, 4242)
        res = krex.run(["true"])
        assert res.returncode == 0
        lines = [ln for ln in res.stderr.splitlines() if "another user's krex controller" in ln]
        assert len(lines) == 1 and "uid 4242" in lines[0] and lines[0].startswith("krex: ")
        # the test's controller is root's, a node controller: not "exclusive only of this user's work"
        assert "a per-user one, runs beside this node's controller" in lines[0], lines[0]
    finally:
        sleeper.kill()
        sleeper.wait()


def test_krex_run_beside_its_own_users_controller_imports_no_psutil(krex):
    """The other-users check looks up the liveness of other users' entries only: the wrapper's own controller's
    entry costs it no psutil import (~12 ms of every command's start here, more on a GPU node); a controller
    without warm workers says so, and a Python command's wrapper then hashes no environment for one."""
    krex.start_controller()
    wait_for(lambda: any(p.name.startswith("krex-controller-") for p in krex.registry.iterdir()), timeout=10,
             what="the controller's own registry entry")
    res = subprocess.run([sys.executable, "-X", "importtime", "-m", "krex_ctl", "run", "-q", "--", sys.executable,
                          "-c", "pass"], env=krex.env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and " krex_ctl.cli" in res.stderr, res.stderr[-2000:]
    assert "psutil" not in res.stderr and "hashlib" not in res.stderr


def test_a_live_gpu_client_dropped_by_the_controller_taints_the_regions_it_overlaps(krex, tmp_path):
    """A GPU client the controller drops while it lives (here a malformed frame) loses its registration: its
    shim fails open and may launch until it connects again, unread by any drain. The regions it overlaps are
    tainted unregistered, naming it, as a refused process's are."""
    krex.start_controller()
    shim = Connection(str(krex.socket), C.KREX_ROLE_SHIM)         # this test's process, as a shim would be
    shim.sock.sendall(b"\xff" * 64)                               # not a frame: the controller drops it
    shim.sock.settimeout(30)
    while shim.sock.recv(4096):                                   # its error reply, then the close
        pass
    out = krex.run([SNIP / "region"], report=tmp_path / "r.json", env={"SNIPPET_REGIONS": "2"})
    assert out.returncode == 0, out.stderr
    regions = report_of(tmp_path / "r.json")["regions"]
    assert len(regions) == 2
    assert all("unregistered" in r["taints"] and os.getpid() in r["unregistered_pids"] and not r["exclusive"]
               for r in regions), regions
