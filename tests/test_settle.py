"""The clock settle (shim/settle.c): after its grant a region waits, on its own GPU, until the SM clock read by
the canary kernel is back at its peak (on the fake GPU: the `clock` line of the fake NVML's control file), at
most --clock-settle-ms; what happened is in the region's record, and a clock that did not come back taints it."""

import threading
import time

from conftest import SNIP, report_of, wait_for


def one_region(krex, tmp_path, during=None, **env):
    rep = tmp_path / "r.json"
    p = krex.popen([SNIP / "region"], report=rep, env={"SNIPPET_REGIONS": "1", **env})
    if during is not None:
        during()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err
    return out.strip(), report_of(rep)


def spins(krex):
    return [t for t in krex.trace_lines() if t[4] == "krex_spin"]


def test_a_region_at_peak_clock_goes_on_after_one_canary(krex, tmp_path):
    krex.start_controller()
    line, rep = one_region(krex, tmp_path)
    [r] = rep["regions"]
    [s] = r["clock_settle"]
    assert s["status"] == "at_once" and s["spins"] == 1 and s["first_mhz"] == 1980 and s["target_mhz"] == 1940
    assert s["waited_ms"] < 500                                      # at once: no second canary (room for a loaded machine)
    assert r["clean"] and "clean=1" in line
    canary = spins(krex)
    timed = [t for t in krex.trace_lines() if t[4] == "timed"]
    assert len(canary) == 1 and canary[0][0] == timed[0][0]          # in the region owner's process ...
    assert canary[0][3] <= min(t[2] for t in timed)                  # ... before its timed work
    assert rep["submissions"]["kernels"] == rep["launches"] == 5        # not counted as the command's work


def test_the_canary_is_built_before_the_region_is_asked_for(krex, tmp_path):
    """loading the canary's PTX is a JIT (~75 ms on the H200): paid before the request, not inside the region"""
    krex.start_controller()
    line, rep = one_region(krex, tmp_path, KREX_FAKE_JIT_MS="1000")
    [r] = rep["regions"]
    [s] = r["clock_settle"]
    assert s["status"] == "at_once" and s["waited_ms"] < 500
    assert (r["ended_ns"] - r["granted_ns"]) / 1e6 < 800


def test_the_settle_does_not_wait_for_the_callers_own_queued_work(krex, tmp_path):
    """the canary has its own stream: a kernel the caller left running on the legacy stream does not hold up the
    begin (a synchronous copy would have waited for it)"""
    krex.start_controller()
    line, rep = one_region(krex, tmp_path, SNIPPET_PRE_US="1000000")
    begin_ms = float(line.split("begin_ms=")[1].split()[0])
    [r] = rep["regions"]
    assert r["clock_settle"][0]["status"] == "at_once" and begin_ms < 600


def test_a_region_waits_for_the_clock_to_come_back(krex, tmp_path):
    krex.nvml.write_text("clock 0 1500\n")
    krex.start_controller("--clock-settle-ms", "3000")     # room for a slow machine; the clock comes back first
    back = {}

    def recover():
        wait_for(lambda: spins(krex), what="the first canary")
        time.sleep(0.15)
        back["t"] = time.monotonic_ns()
        krex.nvml.write_text("clock 0 1980\n")

    t = threading.Thread(target=recover)
    t.start()
    line, rep = one_region(krex, tmp_path)
    t.join()
    [r] = rep["regions"]
    [s] = r["clock_settle"]
    assert s["status"] == "waited" and s["first_mhz"] == 1500 and s["last_mhz"] == 1980 and s["spins"] > 1
    assert 150 <= s["waited_ms"] < 3000
    assert r["clean"] and r["taints"] == []
    timed = [t for t in krex.trace_lines() if t[4] == "timed"]
    assert min(t[2] for t in timed) > back["t"]                      # the timed work began only after


def test_a_clock_that_stays_low_taints_the_region(krex, tmp_path):
    krex.nvml.write_text("clock 0 1500\n")
    krex.start_controller("--clock-settle-ms", "80", "--clock-settle-pct", "90")
    line, rep = one_region(krex, tmp_path)
    [r] = rep["regions"]
    [s] = r["clock_settle"]
    assert s["status"] == "timed_out" and s["target_mhz"] == 1782 and s["last_mhz"] == 1500
    assert 80 <= s["waited_ms"] < 1000
    assert r["taints"] == ["clock_low"] and r["exclusive"] and not r["clean"]
    assert "exclusive=1 clean=0 taints=4096" in line                 # krex_region_last says so too
    counters = krex.status()["counters"]                             # the node's admin sees it in krex status
    assert counters["clock_settle_timed_out"] == 1 and counters["clock_settle_waited"] == 0


def test_no_settle_when_it_is_off(krex, tmp_path):
    krex.nvml.write_text("clock 0 1500\n")
    krex.start_controller("--clock-settle-ms", "0")
    line, rep = one_region(krex, tmp_path)
    [r] = rep["regions"]
    assert "clock_settle" not in r and r["clean"] and spins(krex) == []


def test_a_python_region_without_a_context_is_not_settled(krex, tmp_path):
    krex.start_controller()
    rep = tmp_path / "r.json"
    script = tmp_path / "p.py"
    script.write_text("import krex\nwith krex.region('py'):\n    pass\n")
    import sys
    out = krex.run([sys.executable, str(script)], report=rep)
    assert out.returncode == 0, out.stderr
    [r] = report_of(rep)["regions"]
    assert [s["status"] for s in r["clock_settle"]] == ["unmeasured"] and r["clean"]
