"""Bounded waits: krex.region(name, timeout=S), krex_region_begin_timeout / KREX_REGION_TIMEOUT in C and
`krex run --region-timeout S`. On timeout the request is cancelled at the controller; Python raises
RegionTimeout, C gets -3, the hooks time unprotected (in strict mode they raise krex.StrictError); the report
marks the region not_granted."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import SNIP, report_of, stderr_until, wait_for


def hold_gpu(krex, seconds=30, release=None):
    """Another job holds GPU 0's region for a while (or until the file release exists): (its Popen), once
    granted."""
    hold = {"SNIPPET_HOLD_FILE": str(release)} if release else {"SNIPPET_HOLD_US": str(int(seconds * 1e6))}
    holder = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_N": "1", **hold})
    wait_for(lambda: any(g["owner"] and g["owner"]["state"] == "held" for g in krex.status()["gpus"]),
             timeout=60, what="the holder's region granted")
    return holder


@contextlib.contextmanager
def gpu_held_after_its_first_region(krex, p, held):
    """For a command p that has a region, then waits for the file held: once its first region is done, another
    job holds GPU 0 and the file is made. Ends p and the holder after the block."""
    holder = None
    try:
        wait_for(lambda: any(j["regions"] for j in krex.status()["jobs"]), timeout=60, what="the first region")
        holder = hold_gpu(krex)
        held.touch()
        yield
    finally:
        p.kill()
        p.wait()
        if holder:
            holder.kill()
            holder.wait()


def unprotected_c_region(krex, timeout_s: str = "0.3", **env):
    """The region snippet under `krex run --region-timeout` while another job holds GPU 0: its wait runs out and it
    runs unprotected (the holder released once the wait is given up; the snippet's context made at once, as the
    context gate would hold it: a wait at a gate, which --region-timeout does not bound, as it does not bound one at
    a launch). (returncode, stdout, stderr with what was said before the release, report)."""
    release = krex.dir / "release"
    holder = hold_gpu(krex, release=release)
    try:
        rep = krex.dir / "c.json"
        full = [sys.executable, "-m", "krex_ctl", "run", "--region-timeout", timeout_s, "--report", str(rep), "--",
                str(SNIP / "region")]
        p = subprocess.Popen(full, env=dict(krex.env, SNIPPET_REGIONS="1", SNIPPET_N="1", KREX_GATE_CONTEXTS="0", **env),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        told = stderr_until(p, "not granted within its timeout")      # never silent; said as the wait is given up
        release.touch()
        out, err = p.communicate(timeout=120)
        return p.returncode, out, told + err, report_of(rep)
    finally:
        holder.kill()
        holder.wait()


def queued(krex) -> int:
    return sum(len(g["queue"]) for g in krex.status()["gpus"])


def test_python_timeout_raises_and_cancels(krex):
    krex.start_controller()
    holder = hold_gpu(krex)
    try:
        rep = krex.dir / "py.json"
        script = krex.dir / "wait.py"
        script.write_text(
            "import krex, sys\n"
            "try:\n"
            "    with krex.region('bounded', timeout=0.5):\n"
            "        print('inside')\n"
            "except krex.RegionTimeout as e:\n"
            "    print('timeout', e)\n"
            "    sys.exit(7)\n")
        r = krex.run([sys.executable, script], report=rep, timeout=120)
        assert r.returncode == 7, (r.stdout, r.stderr)
        assert "timeout krex: region 'bounded' not granted within 0.5 s" in r.stdout and "inside" not in r.stdout
        assert queued(krex) == 0                     # cancelled at the controller: nothing left waiting
        regions = report_of(rep)["regions"]
        assert [x["name"] for x in regions] == ["bounded"]
        assert "not_granted" in regions[0]["taints"] and not regions[0]["exclusive"]
        assert regions[0]["end"] == "cancelled"      # nothing ran in it: RegionTimeout was raised at its begin
    finally:
        holder.kill()
        holder.wait()


def test_c_begin_returns_minus_3_under_region_timeout(krex):
    krex.start_controller()
    rc, out, err, rep = unprotected_c_region(krex, "0.5")
    assert rc == 0, err
    assert "begin=-3" in out and "exclusive=0" in out, out
    assert "not granted within its timeout" in err
    assert queued(krex) == 0
    assert len(rep["regions"]) == 1 and "not_granted" in rep["regions"][0]["taints"], rep["regions"]


def test_the_wait_of_a_region_not_granted_ends_where_its_wait_did(krex):
    """A region not granted within its timeout runs unprotected: the report counted its whole body (1.5 s here) as
    time waited for the region (region_waited_ns, waited_ns). Its wait ends where it was given up."""
    krex.start_controller()
    rc, out, err, rep = unprotected_c_region(krex, SNIPPET_HOLD_US="1500000")
    assert rc == 0, err
    [region] = rep["regions"]
    assert region["ended_ns"] - region["requested_ns"] > 1.5e9, region
    assert region["requested_ns"] + 0.25e9 < region["wait_ended_ns"] < region["ended_ns"] - 1.4e9, region
    assert rep["region_waited_ns"] == region["wait_ended_ns"] - region["requested_ns"], rep["region_waited_ns"]


@pytest.mark.parametrize("how", ["exit", "_exit"])
def test_a_c_program_that_exits_inside_its_unprotected_region_is_reported(krex, how):
    """After -3 a C program timed unprotected and exited without krex_end (returned from main, exit(), _exit()):
    the region was in no record and the report listed no region at all. The shim keeps it at exit."""
    krex.start_controller()
    rc, out, err, rep = unprotected_c_region(krex, SNIPPET_EXIT_INSIDE=how)
    assert rc == 0 and "region 0" not in out, err            # it left before printing its region
    regions = rep["regions"]
    assert len(regions) == 1 and "not_granted" in regions[0]["taints"] and not regions[0]["exclusive"], regions
    assert regions[0]["end"] == "normal", regions       # it timed, unprotected: a strict run fails for it
    assert "not granted" in err


@pytest.mark.parametrize("how", ["exit", "_exit"])
def test_a_c_program_that_exits_inside_its_granted_region_is_reported_once(krex, how):
    krex.start_controller()
    rep = krex.dir / "c.json"
    r = krex.run([SNIP / "region"], report=rep, env={"SNIPPET_REGIONS": "1", "SNIPPET_N": "1",
                                                     "SNIPPET_EXIT_INSIDE": how})
    assert r.returncode == 0, r.stderr
    regions = report_of(rep)["regions"]
    assert len(regions) == 1 and regions[0]["granted_ns"] and regions[0]["recorded_by"] == "controller", regions


def test_hooks_fall_back_to_an_unprotected_timing(krex):
    krex.start_controller()
    holder = hold_gpu(krex)
    try:
        rep = krex.dir / "hook.json"
        script = krex.dir / "hooked.py"
        script.write_text(
            "from krex_hooks._region import around\n"
            "timed = around('bench', lambda: 42)\n"
            "print('result', timed())\n")
        full = [sys.executable, "-m", "krex_ctl", "run", "--region-timeout", "0.3", "--report", str(rep), "--",
                sys.executable, str(script)]
        env = dict(krex.env, PYTHONPATH=f"{krex.env['PYTHONPATH']}:{SNIP.parent.parent / 'hooks'}")
        r = subprocess.run(full, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and "result 42" in r.stdout, r.stderr
        regions = report_of(rep)["regions"]
        assert [x["name"] for x in regions] == ["bench"] and "not_granted" in regions[0]["taints"], regions
        # --strict reaches the hooks (KREX_STRICT=1 in the command): the hooked call raises, nothing is returned
        r = subprocess.run(full[:4] + ["--strict"] + full[4:], env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and "result" not in r.stdout, r.stderr
        assert ("krex.StrictError: krex strict mode (krex run --strict / KREX_STRICT=1): region 'bench' was not "
                "granted within KREX_REGION_TIMEOUT (0.3 s); not returning a timing krex did not protect") in \
            r.stderr.splitlines(), r.stderr
        regions = report_of(rep)["regions"]
        assert [x["name"] for x in regions] == ["bench"] and "not_granted" in regions[0]["taints"], regions
        assert queued(krex) == 0
    finally:
        holder.kill()
        holder.wait()


def test_a_strict_refusal_the_harness_swallows_still_fails_the_run(krex):
    """An autotuner catches a choice's RuntimeError (krex.StrictError is one), drops that choice and goes on: the
    run exited 0 under --strict, its refused region recorded as merely cancelled. Now it is recorded refused and
    `krex run --strict` fails the run for it."""
    krex.start_controller()
    holder = hold_gpu(krex)
    try:
        rep = krex.dir / "swallow.json"
        script = krex.dir / "swallow.py"
        script.write_text(
            "from krex_hooks._region import around\n"
            "timings = {}\n"
            "for choice in ('a', 'b'):\n"
            "    try:\n"
            "        timings[choice] = around('autotune', lambda: 1.0)()\n"
            "    except RuntimeError as e:\n"                   # as an autotuner does with a failed choice
            "        timings[choice] = float('inf')\n"
            "print('picked', min(timings, key=timings.get))\n")
        full = [sys.executable, "-m", "krex_ctl", "run", "--strict", "--region-timeout", "0.3", "--report", str(rep),
                "--", sys.executable, str(script)]
        env = dict(krex.env, PYTHONPATH=f"{krex.env['PYTHONPATH']}:{SNIP.parent.parent / 'hooks'}")
        r = subprocess.run(full, env=env, capture_output=True, text=True, timeout=120)
        assert "picked a" in r.stdout and r.returncode == 5, (r.returncode, r.stderr)
        assert "2 timing(s) refused by strict mode, not granted (autotune)" in r.stderr, r.stderr
        assert [x["end"] for x in report_of(rep)["regions"]] == ["refused", "refused"]
    finally:
        holder.kill()
        holder.wait()


def test_threads_of_a_process_share_its_region_and_its_timeout(krex):
    """A region is the process's: a thread waiting with no timeout beside one whose timeout runs out is told
    the shared wait was given up (RegionTimeout), never left to time unprotected as if granted (before: its
    wait returned as if no controller were there, and its block ran without a word)."""
    krex.start_controller()
    script = krex.dir / "threads.py"
    script.write_text(
        "import json, os, threading, time, krex\n"
        "with krex.region('before'):\n"             # a granted region first: its info must not be taken
        "    pass\n"                                  # for the timed-out one's
        "while not os.path.exists(os.environ['HELD']):\n"
        "    time.sleep(0.05)\n"
        "out, infos = {}, {}\n"
        "def wait(i, timeout):\n"
        "    r = krex.region(f'w{i}', timeout=timeout)\n"
        "    try:\n"
        "        with r:\n"
        "            out[i] = 'ran'\n"
        "    except krex.RegionTimeout as e:\n"
        "        out[i] = str(e)\n"
        "    infos[i] = None if r.info is None else [r.info.name, r.info.granted]\n"
        "a = threading.Thread(target=wait, args=(0, 60))\n"
        "a.start()\n"
        "time.sleep(0.5)\n"
        "b = threading.Thread(target=wait, args=(1, 1.0))\n"
        "b.start()\n"
        "a.join(60)\n"
        "b.join(60)\n"
        "with krex.region('outer', timeout=0.5, on_timeout='unprotected') as o:\n"   # its own block chose
        "    with krex.region('inner'):\n"                                           # to run: one nested in
        "        out['inner'] = 'ran'\n"                                            # it runs too
        "print(json.dumps([out, infos]))\n")
    held = krex.dir / "held"
    p = krex.popen([sys.executable, script], report=krex.dir / "t.json", env={"HELD": str(held)})
    with gpu_held_after_its_first_region(krex, p, held):
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        out, infos = json.loads(stdout)
        assert out["1"] == "krex: region 'w1' not granted within 1 s; the request was cancelled", out
        assert out["0"].startswith("krex: region 'w0' not granted (another thread of this process in the same "
                                   "region gave up its wait"), out          # not "within 60 s": not its own
        assert out["inner"] == "ran", out
        assert not any(i and i[1] for i in infos.values()), infos          # none told it was granted
        assert "for every thread in this process's region" in stderr and queued(krex) == 0
        regions = report_of(krex.dir / "t.json")["regions"]
        assert [x["name"] for x in regions] == ["before", "w0", "outer"], regions
        assert "not_granted" in regions[1]["taints"] and regions[1]["end"] == "cancelled", regions


def test_strict_counts_a_region_that_ran_without_a_grant(krex):
    """One region granted, one that timed out and ran unprotected (on_timeout="unprotected"): the run's timings
    were not all protected, which the summary says and --strict turns into exit status 5 (before, the granted
    one hid the other)."""
    krex.start_controller()
    script = krex.dir / "mixed.py"
    script.write_text(
        "import os, time, krex\n"
        "with krex.region('granted'):\n"
        "    pass\n"
        "while not os.path.exists(os.environ['HELD']):\n"
        "    time.sleep(0.05)\n"
        "with krex.region('unprotected', timeout=0.5, on_timeout='unprotected') as r:\n"
        "    pass\n"
        "print('granted', r.granted)\n")
    held = krex.dir / "held"
    cmd = krex.run_cmd([sys.executable, script])
    p = subprocess.Popen(cmd[:4] + ["--strict"] + cmd[4:], env=dict(krex.env, HELD=str(held)),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with gpu_held_after_its_first_region(krex, p, held):
        out, err = p.communicate(timeout=120)
        assert "granted False" in out, err
        assert "timings not protected: 1 region(s) ran without a grant (unprotected: not_granted)" in err, err
        assert p.returncode == 5, err


def test_a_wait_that_runs_out_while_the_region_drains_is_one_region(krex):
    """The request has left the queue (its region started, draining a neighbour's long kernels) when the timeout
    runs out: the cancel ends that region at the controller, and the report has one record of it, the process's
    own (not_granted), not a second one from the controller that would count the region and its wait twice
    (or say exclusive, where the grant crossed the cancel)."""
    krex.start_controller("--drain-timeout", "20")
    hog = krex.popen([SNIP / "hog"], env={"SNIPPET_STREAMS": "1", "SNIPPET_US": "2000000", "SNIPPET_MS": "8000"})
    try:
        wait_for(lambda: any(c["gpus"] for c in krex.status()["clients"]), timeout=60, what="the neighbour's context")
        time.sleep(0.5)                              # its first kernels are in flight
        rep = krex.dir / "drain.json"
        r = krex.run([sys.executable, "-c",
                      "import krex, sys\n"
                      "try:\n"
                      "    with krex.region('bounded', timeout=0.5):\n"
                      "        pass\n"
                      "except krex.RegionTimeout:\n"
                      "    sys.exit(7)\n"], report=rep, timeout=120)
        assert r.returncode == 7, (r.stdout, r.stderr)
        log = krex.ctl_log.read_text()
        report = report_of(rep)
        regions = report["regions"]
        assert len(regions) == 1, regions
        assert regions[0]["recorded_by"] == "process" and "not_granted" in regions[0]["taints"]
        assert not regions[0]["exclusive"] and regions[0]["end"] == "cancelled"
        assert report["regions_exclusive"] == 0 and "and 1 cancelled before a grant (nothing timed)" in r.stderr, r.stderr
        assert queued(krex) == 0 and not any(g["owner"] for g in krex.status()["gpus"]), log[-2000:]
    finally:
        hog.kill()
        hog.wait()


def test_a_grant_within_the_timeout_is_an_ordinary_region(krex):
    """... and krex.last_region() names it, as r.info does (its name was always empty)."""
    krex.start_controller()
    r = krex.python("import krex\nwith krex.region('quick', timeout=30) as r:\n    pass\n"
                    "print(r.granted, r.exclusive, krex.last_region().name, r.info.name)\n")
    assert r.returncode == 0 and r.stdout.split() == ["True", "True", "quick", "quick"], r.stderr


def test_a_zero_timeout_is_refused_not_never_granted(krex):
    """A grant takes a round trip to the controller: timeout=0 would never be granted, even on an idle GPU, so
    the Python API refuses it (ValueError) and KREX_REGION_TIMEOUT=0 is ignored with a warning (no limit)."""
    krex.start_controller()
    r = krex.python("import krex\ntry:\n    krex.region('z', timeout=0).__enter__()\nexcept ValueError as e:\n"
                    "    print('refused', e)\n")
    assert r.returncode == 0 and r.stdout.startswith("refused timeout must be a number of seconds (at least 0.001"), \
        (r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-c", "import krex\nwith krex.region('z') as r:\n    pass\nprint(r.granted)\n"],
                       env=dict(krex.env, KREX_REGION_TIMEOUT="0.0004"), capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["True"] and "KREX_REGION_TIMEOUT='0.0004' is not a number of seconds" in r.stderr, \
        (r.stdout, r.stderr)


def test_bad_region_timeout_is_one_line_exit_2(krex):
    for args, env in ((["--region-timeout", "soon"], {}), ([], {"KREX_REGION_TIMEOUT": "-1"}),
                      (["--region-timeout", "0"], {}), ([], {"KREX_REGION_TIMEOUT": "0.0004"})):
        r = subprocess.run([sys.executable, "-m", "krex_ctl", "run", *args, "--", "true"],
                           env=dict(krex.env, **env), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("krex: ") and "seconds" in r.stderr


def test_the_c_wrappers_run_unchanged_without_krex(tmp_path):
    """krex.h's functions are weak (NULL without krex): its wrappers, the bounded-wait one included, return -1
    and the program goes on (a direct call of krex_region_begin_timeout crashed with SIGSEGV)."""
    from krex_ctl import paths

    src = tmp_path / "nokrex.c"
    src.write_text('#include <stdio.h>\n#include "krex.h"\n'
                   'int main(void) {\n'
                   '    printf("%d %d %d %d %d\\n", krex_begin("a"), krex_begin_mask("b", 1), '
                   'krex_begin_timeout("c", 0, 100), krex_end(), krex_last_clean());\n'
                   '    return 0;\n}\n')
    exe = tmp_path / "nokrex"
    # the header's directory as the guide finds it (marking-regions.md)
    subprocess.run(["gcc", "-Wall", "-Werror", "-I", str(paths.header_dir()), "-o", str(exe), str(src)], check=True)
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=30,
                         env={"PATH": "/usr/bin:/bin"})
    assert out.returncode == 0 and out.stdout == "-1 -1 -1 -1 -1\n", out


INTERRUPTED_WAIT = """
import os, sys, krex
print(os.getpid(), flush=True)
try:
    with krex.region("waiter"):
        pass
except KeyboardInterrupt:
    print("interrupted", flush=True)
"""


def test_a_region_whose_wait_is_interrupted_says_why_it_is_not_clean(krex, tmp_path):
    """Ctrl-C in the wait for a grant: the region was recorded cancelled, clean false and no taint, where a
    RegionTimeout's cancel says not_granted: a harness that keys on the taints saw an unexplained unclean region."""
    krex.start_controller()
    release = tmp_path / "release"
    holder = hold_gpu(krex, release=release)
    try:
        rep = tmp_path / "i.json"
        script = tmp_path / "i.py"
        script.write_text(INTERRUPTED_WAIT)
        p = krex.popen([sys.executable, str(script)], report=rep)
        pid = int(p.stdout.readline())
        wait_for(lambda: queued(krex) == 1, timeout=60, what="the request queued")
        os.kill(pid, signal.SIGINT)
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0 and out.split() == ["interrupted"], (out, err)
        [r] = report_of(rep)["regions"]
        assert r["end"] == "cancelled" and r["taints"] == ["not_granted"] and not r["clean"], r
        assert "1 cancelled before a grant (nothing timed)" in err, err
        # the same for a C harness's krex_region_end on a request still waiting
        script.write_text("import krex._region as kr\nlib = kr.native.lib()\n"
                          "print(lib.krex_region_request(b'waiter', 0), lib.krex_region_end())\n")
        out = krex.run([sys.executable, str(script)], report=rep)
        assert out.returncode == 0 and out.stdout.split() == ["1", "0"], (out.stdout, out.stderr)
        [r] = report_of(rep)["regions"]
        assert r["end"] == "cancelled" and r["taints"] == ["not_granted"], r
    finally:
        release.touch()
        holder.communicate(timeout=60)
