"""A GPU process the controller refused (max_clients, per-user limit, out of descriptors) is not invisible:
its shim honours the gate page that came with the refusal and asks again until it is registered, and a
region during which such a process was alive is not reported exclusive (taint `unregistered`)."""

import json
import os
import signal
import subprocess

from conftest import BUILD, SNIP, overlaps, report_of, wait_for

from krex_ctl.wire.client import Connection
from krex_ctl.wire.frames import C


def shim_pids(krex):
    return {c["pid"] for c in krex.status()["clients"] if c["role"] == "shim"}


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
    hog_env = dict(krex.env, LD_PRELOAD=str(BUILD / "libkrex.so"), SNIPPET_SECONDS="30", SNIPPET_US="300",
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
        # a slot frees up: the refused shim keeps asking and is registered
        filler.close()
        wait_for(lambda: hog.pid in shim_pids(krex), timeout=60, what="refused shim registered on retry")
    finally:
        hog.send_signal(signal.SIGKILL)
        _, herr = hog.communicate(timeout=30)
    assert "controller refused us" in herr and "asking again" in herr
    assert herr.count("controller refused us") == 1      # said once, not at every retry


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
