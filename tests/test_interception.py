"""One snippet program per entry path into the fake drivers: the shim must see exactly the submissions
made (kernels, graph launches, copies, other), no more, no fewer."""

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT, SNIP, report_of

CUDA_MODES = ["direct", "dlsym", "dlsym-versioned", "dlsym-next", "procaddr-v1", "procaddr-v2",
              "procaddr-v2-nullstatus", "procaddr-ptsz", "procaddr-self", "capture", "all-kinds", "dlsym-default"]


def expected(stdout: str) -> dict:
    m = re.search(r"expect (.*)", stdout)
    assert m, stdout
    return {k: int(v) for k, v in (kv.split("=") for kv in m.group(1).split())}


def check(krex, cmd, tmp_path):
    rep = tmp_path / "r.json"
    out = krex.run(cmd, report=rep)
    assert out.returncode == 0, out.stderr
    want = expected(out.stdout)
    got = report_of(rep)["submissions"]
    assert got == want, f"{cmd}: shim saw {got}, program made {want}"
    # none of these programs opens a region: every counted submission was made outside one
    assert report_of(rep)["launches_outside_regions"] == report_of(rep)["launches"]
    return report_of(rep)


@pytest.mark.parametrize("mode", CUDA_MODES)
def test_cuda_entry_path(krex, tmp_path, mode):
    krex.start_controller()
    cmd = [SNIP / "direct"] if mode == "direct" else [SNIP / "paths", mode]
    if mode == "direct":
        out = krex.run(cmd, report=tmp_path / "r.json", env={"SNIPPET_N": "6"})
        assert out.returncode == 0, out.stderr
        rep = report_of(tmp_path / "r.json")
        assert rep["submissions"]["kernels"] == 6 and rep["launches"] == 6
        assert rep["context_creations"] == 1
        return
    check(krex, cmd, tmp_path)


def test_launch_from_library_constructor(krex, tmp_path):
    """A DT_NEEDED library launches in its constructor, before main and before any shim set-up."""
    krex.start_controller()
    check(krex, [SNIP / "ctor_main"], tmp_path)


@pytest.mark.parametrize("mode", ["direct", "dlsym", "procaddr", "more-direct", "more-dlsym", "more-procaddr",
                                  "capture-spt"])
def test_hip_entry_path(krex, tmp_path, mode):
    """more-*: HIP's 2D, 3D, peer, symbol, array and batch copies, its memsets of every width and shape (each
    synchronous and asynchronous form, each _spt twin HIP exports), its stream memory operations and its
    multi-device and pre-configured launches, by the linked name, by dlsym and by hipGetProcAddress: each counted
    once, in its kind (hip_paths.c's MORE_CALLS, written apart from the shim's list)."""
    krex.start_controller()
    check(krex, [SNIP / "hip_paths", mode], tmp_path)


def test_every_further_hip_submission_waits_at_another_jobs_closed_gate(krex, tmp_path):
    """Each call of hip_paths' MORE_CALLS, made by a thread of its own while another job's region holds the GPU
    (its gate closed, nobody frozen), returns only after the region ended: none of them runs ungated beside a
    timing. And each is counted."""
    krex.start_controller("--no-freeze")
    go = tmp_path / "go"
    proc = krex.popen([SNIP / "hip_paths", "more-gated", go], report=tmp_path / "r.json")
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read()
    owner = krex.held_region(tmp_path / "own.json", 1500000)
    go.write_text("")
    out, err = proc.communicate(timeout=60)
    owner.communicate(timeout=30)
    assert proc.returncode == 0, err
    [region] = report_of(tmp_path / "own.json")["regions"]
    done = {name: int(t) for name, t in re.findall(r"^done (\S+) (\d+)$", out, re.M)}
    assert len(done) == sum(expected(out).values()), out
    assert [n for n, t in done.items() if t < region["ended_ns"]] == [], "ran inside another job's region"
    rep = report_of(tmp_path / "r.json")
    assert rep["submissions"] == expected(out) and rep["gate_waited_ns"] > 0


def test_counts_without_controller(krex, tmp_path):
    """Fail open: no controller anywhere, the command still runs, is counted and says so once."""
    env = {"KREX_SOCKET": str(tmp_path / "missing" / "ctl.sock")}
    out = krex.run([SNIP / "direct"], report=tmp_path / "r.json", env=env)
    assert out.returncode == 0
    assert "running without region exclusivity" in out.stderr
    assert report_of(tmp_path / "r.json")["submissions"]["kernels"] == 5


def test_shim_alone_without_controller(tmp_path):
    """LD_PRELOAD without krex run and with no controller: one warning line, everything passes through."""
    import os
    import subprocess

    from conftest import BUILD

    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(LD_PRELOAD=str(BUILD / "libkrex.so"), KREX_SOCKET=str(tmp_path / "none.sock"))
    out = subprocess.run([SNIP / "direct"], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "launched 5" in out.stdout
    assert out.stderr.count("no controller at") == 1


def test_the_shim_names_a_bad_log_level_once(tmp_path):
    """KREX_LOG_LEVEL=loud (or ERR) was taken as warning without a word, where every other variable the shim
    cannot read is named in one warning."""
    import os
    import subprocess

    from conftest import BUILD

    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(LD_PRELOAD=str(BUILD / "libkrex.so"), KREX_SOCKET=str(tmp_path / "none.sock"))
    for value in ("loud", "ERR"):
        out = subprocess.run([SNIP / "direct"], env=dict(env, KREX_LOG_LEVEL=value), capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0 and "launched 5" in out.stdout
        assert out.stderr.count(f"warning: KREX_LOG_LEVEL={value} is not a log level (error, warning, info, debug): "
                                "warning used") == 1, out.stderr
        assert out.stderr.count("no controller at") == 1     # the level used: warning
    for value in ("WARNING", "error"):
        out = subprocess.run([SNIP / "direct"], env=dict(env, KREX_LOG_LEVEL=value), capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0 and "KREX_LOG_LEVEL" not in out.stderr, out.stderr


def test_more_processes_than_counter_slots_are_all_counted(tmp_path):
    """Past the last slot processes share slots; the job's sums stay exact and nothing is printed."""
    import os
    import subprocess

    from conftest import BUILD
    from krex_ctl.wire.counters import create_counters, read_counters

    counters = tmp_path / "job.counters"
    create_counters(counters, slots=2)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(LD_PRELOAD=str(BUILD / "libkrex.so"), KREX_SOCKET=str(tmp_path / "none.sock"),
               KREX_COUNTERS=str(counters), KREX_LOG_LEVEL="warning")
    for _ in range(5):
        out = subprocess.run([SNIP / "direct"], env=env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0 and "counters" not in out.stderr, out.stderr
    totals = read_counters(counters)
    assert totals["processes"] == 5 and totals["kernels"] == 25 and totals["contexts"] == 5


def test_launches_outside_regions_are_counted_in_the_process_slot(tmp_path):
    """The counter slot's outside_regions: of each region's four kernels, the one launched before the begin is
    outside, the three between begin and end inside (a region no controller granted is open all the same); a
    process with no region counts all of its launches there."""
    import os
    import subprocess

    from conftest import BUILD
    from krex_ctl.wire.counters import create_counters, read_counters

    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(LD_PRELOAD=str(BUILD / "libkrex.so"), KREX_SOCKET=str(tmp_path / "none.sock"), KREX_LOG_LEVEL="error")
    for name, cmd, extra, kernels, outside in (
            ("region", SNIP / "region", {"SNIPPET_REGIONS": "2", "SNIPPET_N": "3", "SNIPPET_US": "10",
                                         "SNIPPET_PRE_US": "10"}, 8, 2),
            ("direct", SNIP / "direct", {}, 5, 5)):
        counters = tmp_path / f"{name}.counters"
        create_counters(counters)
        out = subprocess.run([cmd], env=dict(env, KREX_COUNTERS=str(counters), **extra), capture_output=True,
                             text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        totals = read_counters(counters)
        assert (totals["kernels"], totals["outside_regions"]) == (kernels, outside), (name, totals)


def test_global_scope_lookup_gives_null_for_what_the_driver_lacks(tmp_path):
    """tests/gpu/global_scope.py on the fake driver (which lacks about half the names the shim exports): with the
    shim preloaded, a lookup in the global scope gives the wrapper for every name the driver has, NULL for the
    others, as without the shim. The same script runs on the GPU machine (run_all.sh's globalscope step)."""
    out = tmp_path / "g.json"
    r = subprocess.run([sys.executable, str(ROOT / "tests" / "gpu" / "global_scope.py"),
                        str(BUILD / "fakes" / "libcuda.so.1"), "--out", str(out)],
                       env=dict(os.environ, LD_PRELOAD=str(BUILD / "libkrex.so"), KREX_LOG_LEVEL="error"),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    got = json.loads(out.read_text())
    assert got["wrong"] == [] and got["driver_lacks"] > 20 and got["driver_has"] > 50
    assert got["null_given"] == got["driver_lacks"] and got["wrapper_given"] == got["driver_has"]
    assert "cuLaunchGrid" in got["lacked"]
