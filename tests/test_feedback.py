"""What a user sees: the waiting line, the freeze line, the summary and 'timings not protected', --strict,
--quiet, the report's run facts, --report -, krex status (text, --watch, privacy, bounds), krex trace and
controller --trace, --metrics, readiness. Real processes, sockets and signals on the fake driver."""

import json
import os
import re
import pty
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import ROOT, SNIP, in_namespace, report_of, stderr_until, wait_for

sys.path.insert(0, str(ROOT))
from krex_ctl import feedback, server_feedback  # noqa: E402
from krex_ctl.wire import ops, trace as trace_format  # noqa: E402

KREX = [sys.executable, "-m", "krex_ctl"]


def krex_cli(krex, *args, env=None, timeout=60, **kw):
    return subprocess.run(KREX + list(args), env=dict(krex.env, **(env or {})), capture_output=True, text=True,
                          timeout=timeout, **kw)


def krex_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("krex:")]


def holder(krex, release: Path, **env):
    """A region under krex run, held until the file release exists (60 s at most), returned once the controller
    granted it: (Popen, its pid)."""
    proc = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_N": "1", "SNIPPET_US": "100",
                                               "SNIPPET_HOLD_FILE": str(release), **env})

    def granted():
        for g in krex.status()["gpus"]:
            o = g["owner"]
            if o is not None and o["state"] == "held":
                return o["pid"]
        return None
    return proc, wait_for(granted, timeout=60, interval=0.05, what="holder granted")


# ---- the summary, the warning, --strict, --quiet ----------------------------------------------------------
def test_launches_without_a_region_are_said_and_strict_fails_the_run(krex, tmp_path):
    """10 launches and no region exited 0 with nothing said."""
    krex.start_controller()
    hog = {"SNIPPET_MS": "200"}
    out = krex.run([SNIP / "hog"], env=hog)
    assert out.returncode == 0, out.stderr
    lines = krex_lines(out.stderr)
    assert any(line.startswith("krex: 0 regions (0 exclusive, 0 clean)") and "launches" in line for line in lines)
    assert any("timings not protected" in line and "no region was granted" in line for line in lines), lines
    for how in ({"args": ["--strict"]}, {"env": {"KREX_STRICT": "1"}}):
        cmd = KREX + ["run", *how.get("args", []), "--", str(SNIP / "hog")]
        out = subprocess.run(cmd, env=dict(krex.env, **hog, **how.get("env", {})), capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == feedback.STRICT_EXIT, out.stderr
        assert "--strict: exit status 5" in out.stderr
    out = krex_cli(krex, "run", "--hooks", "triton", "--", str(SNIP / "hog"), env=hog)
    assert "the hooks triton marked none" in out.stderr, out.stderr
    # the command's own failure is passed through, strict or not
    out = krex_cli(krex, "run", "--strict", "--", "sh", "-c", "exit 3")
    assert out.returncode == 3


def test_protected_regions_give_the_summary_and_strict_passes(krex, tmp_path):
    """A kernel before each region (SNIPPET_PRE_US) is outside it: said in the summary, and not judged (no hooks:
    explicit regions cover what their author chose)."""
    krex.start_controller()
    rep = tmp_path / "r.json"
    out = krex_cli(krex, "run", "--strict", "--report", str(rep), "--", str(SNIP / "region"),
                   env={"SNIPPET_PRE_US": "50"})
    assert out.returncode == 0, out.stderr
    summary = [line for line in krex_lines(out.stderr) if "regions" in line]
    assert summary and summary[0].startswith("krex: 3 regions (3 exclusive, ")
    assert "18 launches (3 outside regions)" in summary[0], summary
    assert "not protected" not in out.stderr
    r = report_of(rep)
    assert r["launches"] == 18 and r["launches_outside_regions"] == 3
    assert r["krex_version"] and r["host"] == os.uname().nodename and r["wall_ns"] > 0 and r["controller"] is True
    assert r["frozen_ns"] == 0 and r["frozen_ns_by_pid"] == {}
    assert all(reg["attestation"]["source"] == "fake" for reg in r["regions"])   # never "nvml" on the fake


GPU_BENCH = """
import ctypes, sys, time
import triton.testing
cuda = ctypes.CDLL("libcuda.so.1")
ctx, mod, fn = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
assert cuda.cuInit(0) == 0 and cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
assert cuda.cuCtxSetCurrent(ctx) == 0 and cuda.cuModuleLoadData(ctypes.byref(mod), b"image") == 0
assert cuda.cuModuleGetFunction(ctypes.byref(fn), mod, b"bench") == 0


def kernel():
    assert cuda.cuLaunchKernel(fn, 10, 1, 1, 1, 1, 1, 0, None, None, None) == 0
    assert cuda.cuCtxSynchronize() == 0


for _ in range(4):          # set-up and a correctness check: outside every region
    kernel()
if sys.argv[1] == "hooked":
    print(triton.testing.do_bench(kernel))      # the hook's region holds every call but the first
else:
    triton.testing.do_bench(lambda: None)       # the hook fires, around no GPU work
    t = time.perf_counter()
    for _ in range(3):                          # the timing that counts, taken by hand: outside
        kernel()
    print(time.perf_counter() - t)
"""


def gpu_bench(krex, tmp_path, mode, *options):
    script = tmp_path / "bench.py"
    script.write_text(GPU_BENCH)
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "harness_fakes"), str(ROOT)]),
           "LD_LIBRARY_PATH": str(ROOT / "build" / "fakes")}
    return krex_cli(krex, "run", *options, "--", sys.executable, str(script), mode, env=env)


def test_strict_with_hooks_fails_a_run_whose_launches_were_all_outside_regions(krex, tmp_path):
    """Hooks asked for, the hook's region granted, and every GPU launch outside it (the benchmark timed by hand):
    --strict let it pass. A job whose hook fired around its kernels is not failed by its set-up launches."""
    krex.start_controller()
    rep = tmp_path / "r.json"
    out = gpu_bench(krex, tmp_path, "hooked", "--strict", "--hooks", "triton", "--report", str(rep))
    assert out.returncode == 0, out.stderr
    summary = [line for line in krex_lines(out.stderr) if "region" in line and "launches" in line]
    assert summary and summary[0].startswith("krex: 1 region (1 exclusive, "), out.stderr
    assert "8 launches (5 outside regions)" in summary[0], summary       # 4 set-up + the first call outside
    assert "not protected" not in out.stderr
    assert report_of(rep)["launches_outside_regions"] == 5
    out = gpu_bench(krex, tmp_path, "by_hand", "--strict", "--hooks", "triton")
    assert out.returncode == feedback.STRICT_EXIT, out.stderr
    [why] = [line for line in krex_lines(out.stderr) if "not protected" in line]
    assert why.startswith("krex: timings not protected: hooks triton were asked for, but all 7 GPU launches "
                          "were outside every region"), why
    out = gpu_bench(krex, tmp_path, "by_hand", "--hooks", "triton")      # not strict: said, status passed through
    assert out.returncode == 0 and "all 7 GPU launches were outside every region" in out.stderr, out.stderr


def test_processes_without_the_shim_are_said_by_what_was_seen_of_them():
    """On a GPU by NVML: "ran GPU work ... on GPU N"; only asking for regions through a shim it loaded itself (no
    NVML, or not listed): "asked for regions", no GPU named."""
    seen = {"pid": 7, "gpus": [1], "command": ["python3", "w.py"]}
    asked = {"pid": 8, "gpus": [], "command": ["python3", "r.py"]}
    [line] = feedback.unprotected({"processes_without_shim": [seen, asked]}, True)
    assert line.startswith("2 process(es) of the command ran GPU work without krex's shim (pid 7 (python3 w.py) "
                           "on GPU 1 and 1 more;"), line
    [line] = feedback.unprotected({"processes_without_shim": [asked]}, True)
    assert line.startswith("1 process(es) of the command asked for regions without krex's shim (pid 8 (python3 "
                           "r.py);"), line


def test_launches_outside_regions_fail_only_with_hooks_and_only_when_all_are_outside():
    region = {"name": "triton.do_bench", "granted_ns": 2, "exclusive": True, "taints": []}
    rep = {"launches": 7, "launches_outside_regions": 7, "regions": [region]}
    assert feedback.unprotected(rep, True) == []                                      # explicit regions: not judged
    [why] = feedback.unprotected(rep, True, "triton")
    assert why.startswith("hooks triton were asked for, but all 7 GPU launches were outside every region")
    assert feedback.unprotected(dict(rep, launches_outside_regions=6), True, "triton") == []    # one inside: enough
    assert feedback.unprotected({"launches": 7, "regions": [region]}, True, "all") == []       # a shim without the count
    one = feedback.unprotected({"launches": 1, "launches_outside_regions": 1, "regions": [region]}, True, "all")
    assert one[0].startswith("hooks all were asked for, but the one GPU launch was outside every region")
    assert "(7 outside regions)" in feedback.summary(rep) and "launches (" not in feedback.summary({"launches": 0})


def test_the_summary_says_a_region_was_still_open_when_its_process_exited():
    """A region with no end (a crash, os._exit, a forgotten krex_region_end) was exclusive until its process
    exited, but what it timed may be cut short: the summary says so."""
    gone = {"name": "r", "granted_ns": 2, "exclusive": True, "clean": True, "taints": [], "end": "owner_gone"}
    ended = dict(gone, end="normal")
    assert "(2 exclusive, 2 clean, 1 still open when its process exited)" in feedback.summary({"regions": [gone, ended]})
    assert "still open" not in feedback.summary({"regions": [ended]})
    died_waiting = dict(gone, granted_ns=None, exclusive=False, clean=False, taints=["not_granted"])
    assert "still open" not in feedback.summary({"regions": [died_waiting, ended]})


def test_the_summary_counts_a_region_cancelled_before_its_grant_apart():
    """A region cancelled before its grant (krex.RegionTimeout, Ctrl-C in the wait) timed nothing: the summary
    counted it as a region that was not exclusive, which reads as an unprotected timing."""
    granted = {"name": "g", "granted_ns": 2, "exclusive": True, "clean": True, "taints": [], "end": "normal"}
    cancelled = {"name": "c", "granted_ns": None, "exclusive": False, "clean": False, "taints": ["not_granted"],
                 "end": "cancelled"}
    text = feedback.summary({"regions": [granted, cancelled]})
    assert text.startswith("1 region (1 exclusive, 1 clean) and 1 cancelled before a grant (nothing timed), "), text
    ran = dict(cancelled, end="normal")          # ran without a grant: counted, not exclusive
    assert feedback.summary({"regions": [granted, ran]}).startswith("2 regions (1 exclusive, 1 clean, tainted: ")


def test_lost_process_records_are_said_and_fail_strict():
    """Past KREX_LOCAL_REGIONS regions in one job the processes' own records are lost (only counted): one of them
    may be a region that ran without a grant, so the run says so and --strict fails, instead of '1030 regions
    (1030 exclusive)' and exit 0 while the process had been told not_granted."""
    from krex_ctl.wire.frames import C

    granted = {"name": "g", "granted_ns": 2, "exclusive": True, "clean": True, "taints": [], "end": "normal"}
    rep = {"regions": [granted], "launches": 3, "regions_unrecorded_by_processes": 7}
    assert "1 region (1 exclusive, 1 clean), 7 more whose process record was lost" in feedback.summary(rep)
    assert feedback.unprotected(rep, controller=True) == [
        f"7 region record(s) of its processes lost (over {C.KREX_LOCAL_REGIONS} regions in one job): whether those "
        "timings were protected is unknown"]
    assert feedback.unprotected(dict(rep, regions_unrecorded_by_processes=0), controller=True) == []


def test_only_a_region_that_ran_without_a_grant_counts_as_an_unprotected_timing():
    """Beside a granted region: one that ended normally with no grant timed something nobody protected; one
    cancelled (RegionTimeout, a hook's strict refusal) or whose process died waiting timed nothing."""
    granted = {"name": "g", "granted_ns": 2, "exclusive": True, "clean": True, "taints": [], "end": "normal"}
    ran = {"name": "u", "granted_ns": None, "exclusive": False, "clean": False, "taints": ["not_granted"],
           "end": "normal"}
    assert feedback.unprotected({"regions": [granted, ran]}, True) == ["1 region(s) ran without a grant (u: not_granted)"]
    for end in ("cancelled", "owner_gone"):
        assert feedback.unprotected({"regions": [granted, dict(ran, end=end)]}, True) == [], end


def test_a_strict_refusal_is_counted_apart_and_fails_strict():
    """A hooked timing that strict mode refused (nothing timed, but a timing was wanted and not protected): said
    apart from the regions, and --strict fails for it even where the caller caught the StrictError."""
    granted = {"name": "g", "granted_ns": 2, "exclusive": True, "clean": True, "taints": [], "end": "normal"}
    refused = {"name": "inductor.benchmark_gpu", "granted_ns": None, "exclusive": False, "clean": False,
               "taints": ["not_granted"], "end": "refused"}
    rep = {"regions": [granted, refused]}
    assert feedback.summary(rep).startswith("1 region (1 exclusive, 1 clean), 1 refused by strict mode (not granted, "
                                            "nothing timed), "), feedback.summary(rep)
    assert feedback.unprotected(rep, True) == ["1 timing(s) refused by strict mode, not granted (inductor.benchmark_gpu)"]


def test_quiet_keeps_only_the_warning(krex):
    krex.start_controller()
    for how in (["--quiet"], ["-q"]):
        out = krex_cli(krex, "run", *how, "--", str(SNIP / "region"))
        assert out.returncode == 0 and krex_lines(out.stderr) == [], out.stderr
    out = krex_cli(krex, "run", "--", str(SNIP / "hog"), env={"KREX_QUIET": "1", "SNIPPET_MS": "200"})
    lines = krex_lines(out.stderr)
    assert lines and all("timings not protected" in line for line in lines), out.stderr
    out = krex_cli(krex, "run", "--", "true", env={"KREX_QUIET": "maybe"})
    assert out.returncode == 2 and \
        "KREX_QUIET must be 1, true, yes or on, or 0, false, no or off, not 'maybe'" in out.stderr


# ---- waiting, freezing -------------------------------------------------------------------------------------
def test_waiting_and_frozen_commands_are_told_why(krex, tmp_path):
    """A command waiting for the GPU printed nothing for 6.5 s; a neighbour frozen for 3.0 s got no word and its
    report showed no frozen time."""
    krex.start_controller()
    sib_report = tmp_path / "sib.json"
    sibling = krex.popen([SNIP / "hog"], report=sib_report, env={"SNIPPET_MS": "30000"})
    wait_for(lambda: any(c["role"] == "shim" and c["gpus"] for c in krex.status()["clients"]), timeout=60,
             what="hog registered with its context")
    release = tmp_path / "release"
    owner, owner_pid = holder(krex, release)
    # its context made at once, so that it waits in the region queue (the next test: at the context gate)
    waiter = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_N": "1", "KREX_GATE_CONTEXTS": "0"})
    told = stderr_until(waiter, "krex: waiting")      # the holder's region ends once the waiter has been told
    release.touch()
    out, err = waiter.communicate(timeout=120)
    err = told + err
    assert waiter.returncode == 0, err
    waits = [line for line in krex_lines(err) if line.startswith("krex: waiting")]
    assert waits, err
    assert f"held by pid {owner_pid} (" in waits[0] and "region 'timed'" in waits[0] and "for GPU 0" in waits[0]
    assert "1st of 1 in the queue" in waits[0]
    owner.communicate(timeout=60)
    sibling.send_signal(signal.SIGINT)
    _, sib_err = sibling.communicate(timeout=60)
    paused = [line for line in krex_lines(sib_err) if "was paused (frozen)" in line]
    assert paused and f"by pid {owner_pid} (" in paused[0], sib_err
    r = report_of(sib_report)
    assert r["frozen_ns"] >= 1e9 and sum(r["frozen_ns_by_pid"].values()) == r["frozen_ns"]
    assert "frozen " in [line for line in krex_lines(sib_err) if "regions (" in line][0]


def test_a_region_for_two_gpus_waiting_for_one_is_told_what_it_waits_for(krex, tmp_path):
    """A region for GPUs 0 and 1 waits while another job holds GPU 1: at GPU 0, which no region holds (kept free
    for it), the line names GPU 1 and its holder. Before, it said GPU 0 was "held by a region being handed over",
    which nothing was, for as long as the wait lasted."""
    krex.env.pop("CUDA_VISIBLE_DEVICES", None)
    krex.env["KREX_FAKE_GPUS"] = "2"
    krex.env["KREX_WARM_WORKERS"] = "0"
    krex.start_controller()
    release = tmp_path / "release"
    proc = subprocess.Popen(KREX + ["run", "--gpu", "1", "--", str(SNIP / "region")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(krex.env, SNIPPET_REGIONS="1", SNIPPET_N="1", SNIPPET_US="100",
                                     SNIPPET_HOLD_FILE=str(release)))
    owner_pid = wait_for(lambda: next((g["owner"]["pid"] for g in krex.status()["gpus"]
                                       if g["owner"] and g["owner"]["state"] == "held"), None), timeout=60,
                         what="GPU 1 held")
    gang = subprocess.Popen(KREX + ["run", "--gpu", "0,1", "--", str(SNIP / "region")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env=dict(krex.env, SNIPPET_REGIONS="1", SNIPPET_N="1", SNIPPET_US="100"))
    told = stderr_until(gang, "for GPU 0")
    release.touch()
    out, err = gang.communicate(timeout=120)
    proc.communicate(timeout=60)
    line = next(x for x in krex_lines(told + err) if x.startswith("krex: waiting") and "for GPU 0" in x)
    assert "handed over" not in line and f"waits for GPU 1, held by pid {owner_pid} (" in line, line
    assert feedback.wait_line({"kind": "region", "gpu": 0, "name": "r", "place": 1, "queued": 1, "since_s": 2.0,
                               "holder": None, "fair_share": True}) == \
        "waiting 2.0 s for GPU 0 (region 'r'): free; 1st of 1 in the queue, waiting for its job's fair share of the GPU"


def test_a_pause_is_told_once_with_every_region_that_froze_the_process():
    """A process frozen by one region after another (back-to-back regions, resumed and frozen again between two
    polls) is one pause, told once when it is over with each holder: it was one line per region, the first
    'still paused by ...', 12 lines in 12 s of 0.5 s regions. Two regions that froze it one after the other were
    one entry per pid before that, the 8 s freeze told as the second's, 'at least 0.1 s by pid <the second's
    owner>'. A pause that goes on is told after 10 s, and every 10 s."""
    import io

    def by(pid, name):
        return {"pid": pid, "uid": os.getuid(), "region": name, "command": "bench"}

    def reply(*frozen, total=0):
        return {"waits": [], "frozen": [dict(f, gpu=[0]) for f in frozen], "frozen_ns": {"901": total}}

    out = io.StringIO()
    w = feedback.Watcher("unused.sock", 1, feedback.Feedback(out=out))
    first = {"pid": 901, "region_id": 7, "since_s": 8.0, "by": by(812, "long")}
    second = {"pid": 901, "region_id": 8, "since_s": 0.1, "by": by(813, "next")}
    w.take(reply(first, total=int(8e9)))
    w.take(reply(dict(first, since_s=8.4), total=int(8.4e9)))
    assert out.getvalue() == ""                                      # one freeze going on: nothing yet
    w.take(reply(second, total=int(8.6e9)))
    assert out.getvalue() == ""                                      # frozen again by another: the same pause
    w.take(reply(total=int(8.7e9)))
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert "at least 8.7 s on GPU 0 by 2 regions: pid 812 (" in lines[0] and "region 'long'" in lines[0], lines
    assert ") x1, pid 813 (" in lines[0] and lines[0].endswith("; resumed; 8.7 s frozen in all"), lines
    # a controller that sends no region id: the holder tells the freezes apart
    out = io.StringIO()
    w = feedback.Watcher("unused.sock", 1, feedback.Feedback(out=out))
    w.take(reply({k: v for k, v in first.items() if k != "region_id"}))
    w.take(reply({k: v for k, v in second.items() if k != "region_id"}))
    w.take(reply())
    assert "by 2 regions: pid 812 (" in out.getvalue() and ", pid 813 (" in out.getvalue(), out.getvalue()
    # 24 regions of one holder, 0.5 s each, polled at 0.5 s: one line 10 s in, one when it is over
    out = io.StringIO()
    w = feedback.Watcher("unused.sock", 1, feedback.Feedback(out=out))
    t0 = 1000.0
    for i in range(24):
        w.frozen_ns = {901: int((i + 1) * 0.5e9)}
        w.follow_pauses({(901, 20 + i): {"pid": 901, "region_id": 20 + i, "since_s": 0.5, "gpu": [1],
                                         "by": by(812, "bench")}}, t0 + i * 0.5 + 0.5)
    ongoing = out.getvalue().splitlines()
    assert len(ongoing) == 1, ongoing
    assert "has been paused (frozen) 10.0 s so far on GPU 1, by pid 812 (" in ongoing[0], ongoing
    assert ongoing[0].endswith(" (its 20th region in a row)"), ongoing
    w.frozen_ns = {901: int(12.1e9)}
    w.follow_pauses({}, t0 + 12.6)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2, lines
    assert "at least 12.1 s on GPU 1 by 24 regions: pid 812 (" in lines[1] and lines[1].count("pid 812") == 1, lines
    assert ") x24; resumed; 12.1 s frozen in all" in lines[1], lines


def test_a_command_held_at_the_context_gate_is_told_why(krex, tmp_path):
    """The context gate (on by default) holds a process's first context while another job's region holds its GPU;
    the controller does not know that process's GPUs yet, so its wrapper finds the wait in the job's counters and
    says it with the holder, as for any closed gate."""
    krex.start_controller()
    release = tmp_path / "release"
    owner, owner_pid = holder(krex, release)
    waiter = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_N": "1"})
    told = stderr_until(waiter, "krex: waiting")
    release.touch()
    out, err = waiter.communicate(timeout=120)
    err = told + err
    assert waiter.returncode == 0, err
    waits = [line for line in krex_lines(err) if line.startswith("krex: waiting")]
    assert waits and "at GPU 0's closed gate" in waits[0] and f"held by pid {owner_pid} (" in waits[0], err
    assert "region 'timed'" in waits[0]
    owner.communicate(timeout=60)
    assert "region 0 begin=0" in out and "exclusive=1" in out           # its own region came after the holder's


# ---- the report's destination ----------------------------------------------------------------------------
def test_report_to_stdout_and_through_devices_and_links(krex, tmp_path):
    """--report /dev/stdout replaced the link with a regular file; --report /dev/null made a regular file."""
    krex.start_controller()
    out = krex_cli(krex, "run", "--report", "-", "--", "true")
    assert out.returncode == 0 and json.loads(out.stdout)["exit_code"] == 0
    out = krex_cli(krex, "run", "--report", "/dev/stdout", "--", "true")
    assert out.returncode == 0 and json.loads(out.stdout)["exit_code"] == 0
    assert os.path.islink("/dev/stdout") or not os.path.isfile("/dev/stdout")
    out = krex_cli(krex, "run", "--report", "/dev/null", "--", "true")
    assert out.returncode == 0 and not os.path.isfile("/dev/null") and Path("/dev/null").is_char_device()
    target = tmp_path / "target.json"
    target.write_text("")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    out = krex_cli(krex, "run", "--report", str(link), "--", "true")
    assert out.returncode == 0 and link.is_symlink() and json.loads(target.read_text())["exit_code"] == 0


# ---- KREX_SOCKET where no controller can be started ------------------------------------------------------
def test_socket_in_a_missing_directory_runs_unprotected_with_one_line_and_strict_fails(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "LD_PRELOAD"}
    env.update(KREX_SOCKET=str(tmp_path / "no" / "such" / "krex.sock"), PYTHONPATH=str(ROOT),
               XDG_RUNTIME_DIR=str(tmp_path))
    marker = tmp_path / "ran"
    out = subprocess.run(KREX + ["run", "--", "touch", str(marker)], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and marker.exists() and "Traceback" not in out.stderr
    assert "does not exist; running without region exclusivity" in out.stderr
    out = subprocess.run(KREX + ["run", "--strict", "--", str(SNIP / "region")], env=env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == feedback.STRICT_EXIT and "timings not protected: no controller" in out.stderr
    assert "timings not protected: no controller (cannot start a controller at" in out.stderr, out.stderr   # why


def test_socket_in_a_directory_that_cannot_be_written_is_one_line(tmp_path):
    """It died with a PermissionError traceback and the command never ran."""
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    marker = tmp_path / "ran"
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "LD_PRELOAD"}
    env.update(KREX_SOCKET=str(ro / "krex.sock"), PYTHONPATH=str(ROOT), XDG_RUNTIME_DIR=str(tmp_path))
    cmd = KREX + ["run", "--", "touch", str(marker)]
    if os.getuid() == 0:      # root writes anywhere: the directory is made read-only in a mount namespace
        ns = in_namespace("-m")
        if ns is None:
            pytest.skip("no mount namespace here")
        cmd = ns + ["sh", "-c", f"mount --bind {ro} {ro} && mount -o remount,bind,ro {ro} && exec \"$@\"", "sh", *cmd]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    assert "Traceback" not in out.stderr, out.stderr
    assert out.returncode == 0 and marker.exists()
    assert "cannot create files in" in out.stderr and "running without region exclusivity" in out.stderr


# ---- krex status --------------------------------------------------------------------------------------------
def test_status_text_names_user_command_and_uuid(krex, tmp_path):
    krex.start_controller()
    owner, pid = holder(krex, tmp_path / "release")
    out = krex_cli(krex, "status")
    assert out.returncode == 0, out.stderr
    gpu0 = [line for line in out.stdout.splitlines() if line.startswith("GPU 0")][0]
    assert "GPU-6b726578-" in gpu0 and f"of pid {pid} (" in gpu0 and "snippets/region" in gpu0
    import pwd
    assert pwd.getpwuid(os.getuid()).pw_name in gpu0
    (tmp_path / "release").touch()
    owner.communicate(timeout=60)


def test_status_names_the_processes_a_region_gates(krex, tmp_path):
    """Under the default policy an idle neighbour is not frozen: `krex status` lists it as gated on the held GPU
    (its GPU work would wait there), and the frozen busy one as frozen."""
    krex.start_controller("--freeze-policy", "busy")
    idle, idle_pid = krex.start_sibling(SNIPPET_STREAMS="0", SNIPPET_MS="60000")
    owner, pid = holder(krex, tmp_path / "release")
    out = krex_cli(krex, "status")
    gpu0 = [line for line in out.stdout.splitlines() if line.startswith("GPU 0")][0]
    gated = [line for line in out.stdout.splitlines() if line.strip().startswith("gated")]
    assert "1 gated" in gpu0 and gated == [f"    gated (their GPU work waits for the region): pids {idle_pid}"], out.stdout
    (tmp_path / "release").touch()
    owner.communicate(timeout=60)
    assert "gated" not in krex_cli(krex, "status").stdout
    krex.stop_hogs()
    idle.communicate(timeout=30)


def test_status_watch_redraws_plain_text_when_not_a_terminal(krex):
    krex.start_controller()
    p = subprocess.Popen(KREX + ["status", "--watch", "0.2"], env=krex.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.0)
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert out.count("controller pid") >= 2 and "---" in out, (out, err)
    assert p.returncode == 0 and "Traceback" not in err
    # a reader that stops reading (`krex status --watch | head -1`): it ends at once, status 0, nothing said
    p = subprocess.Popen(KREX + ["status", "--watch", "0.2"], env=krex.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("controller pid")
    p.stdout.close()
    assert p.wait(timeout=30) == 0 and p.stderr.read() == ""


def test_status_watch_goes_on_through_a_controller_restart(krex):
    """--watch ended (exit 3) at the first poll a restarting controller missed; with its heartbeat fresh it says
    so and goes on, and shows the controller again once it is back."""
    first = krex.start_controller("--restart-grace", "20").pid
    p = subprocess.Popen(KREX + ["status", "--watch", "0.2"], env=krex.env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    seen = []

    def shows(pred, timeout=30.0) -> bool:
        """Read the watch's lines until one matches (each step waits for what it shows, not for a set time: on a
        loaded machine its first frame came after a fixed 1-s sleep had passed)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = p.stdout.readline()
            if not line:
                return False
            seen.append(line)
            if pred(line):
                return True
        return False

    try:
        assert shows(lambda line: line.startswith(f"controller pid {first} ")), seen
        krex.ctl.send_signal(signal.SIGTERM)
        krex.ctl.wait(timeout=30)
        assert shows(lambda line: "may be restarting" in line), seen
        assert p.poll() is None
        second = krex.start_controller("--restart-grace", "20").pid
        assert shows(lambda line: line.startswith(f"controller pid {second} ")), seen
    finally:
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
    assert p.returncode == 0 and "Traceback" not in err, (seen, out, err)


def test_status_watch_draws_a_live_table_on_a_terminal(krex, tmp_path):
    """In a pseudo-terminal: rich's table (box drawing), refreshed, with the holder's row."""
    krex.start_controller()
    owner, pid = holder(krex, tmp_path / "release")
    master, slave = pty.openpty()
    p = subprocess.Popen(KREX + ["status", "--watch", "0.3"], env=dict(krex.env, COLUMNS="160", TERM="xterm"),
                         stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    data = b""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not (str(pid).encode() in data and data.count(b"krex controller") >= 1
                                                 and b"held" in data):
        r, _, _ = select.select([master], [], [], 0.5)
        if r:
            try:
                data += os.read(master, 65536)
            except OSError:
                break
    p.send_signal(signal.SIGINT)
    p.wait(timeout=30)
    os.close(master)
    (tmp_path / "release").touch()
    owner.communicate(timeout=60)
    text = data.decode(errors="replace")
    assert str(pid) in text and "held" in text, text[-2000:]
    assert any(ch in text for ch in "\u2501\u2500\u2503\u2502"), text[-2000:]    # rich's box drawing
    assert "Traceback" not in text


def test_the_terminal_view_shows_the_warm_worker_pools_as_the_text_does():
    """The pools, running and stopped, in rich's view (a sysadmin watching a node) as in the plain text."""
    from rich.console import Console

    from krex_ctl.commands import status

    st = {"controller": {"pid": 1, "socket": "/s", "uptime_s": 3.0, "protocol": 1, "config": {}},
          "gpus": [{"gpu": 0, "owner": None, "queue": [], "clients": []}], "clients": [], "jobs": [], "counters": {},
          "zygotes": [{"gpu": 0, "pid": 4242, "forks": True}],
          "workers": [{"gpu": 0, "state": "idle"}, {"gpu": 0, "state": "busy"}, {"gpu": 0, "state": "idle"}],
          "zygotes_failed": [{"gpu": 1, "python": "/usr/bin/python3", "environments": 2}],
          "leaving": [{"pid": 77, "uid": 0, "gpus": [0]}]}
    console = Console(record=True, width=160)
    console.print(status.table(st))
    view = console.export_text()
    text = "\n".join(status.lines(st))
    for line in ("warm workers for GPU 0: zygote pid 4242 (forks); 2 idle, 1 busy",
                 "warm workers for GPU 1 (/usr/bin/python3): stopped for 2 environment(s)"):
        assert line in text and line in view, (line, view)
    assert "1 process(es) closed their connection on their way out: pids 77;" in text
    assert "on their way out: pids 77;" in view


def test_status_counts_the_warm_worker_pool_apart_from_commands():
    """Every connection of a warm worker or zygote (no `krex run` started them) is a job of its own: with two idle
    workers and nothing running, `krex status` said '5 client(s), 5 job(s)' and listed each idle worker twice, as
    two jobs of one pid."""
    from rich.console import Console

    from krex_ctl.commands import status

    worker = ["/usr/bin/python3", "-m", "krex_ctl.worker"]
    st = {"controller": {"pid": 1, "socket": "/s", "uptime_s": 3.0, "protocol": 1, "config": {}},
          "gpus": [{"gpu": 0, "owner": None, "queue": [], "clients": [11, 12, 30]}],
          "clients": [{"pid": 10, "role": "python", "job": 2}, {"pid": 11, "role": "shim", "job": 5},
                      {"pid": 11, "role": "python", "job": 6}, {"pid": 12, "role": "shim", "job": 8},
                      {"pid": 30, "role": "shim", "job": 9}, {"pid": 31, "role": "cli", "job": None}],
          "jobs": [{"job": 2, "root_pid": 10, "uid": 0, "command": worker, "gpus": [], "warm_pool": True},
                   {"job": 5, "root_pid": 11, "uid": 0, "command": worker, "gpus": [], "warm_pool": True},
                   {"job": 6, "root_pid": 11, "uid": 0, "command": worker, "gpus": []},   # a controller before warm_pool
                   {"job": 8, "root_pid": 12, "uid": 0, "command": worker, "gpus": [], "warm_pool": True},
                   {"job": 9, "root_pid": 30, "uid": 0, "command": ["python3", "bench.py"], "gpus": [0]}],
          "counters": {}, "zygotes": [{"gpu": 0, "pid": 10, "forks": True}],
          "workers": [{"gpu": 0, "pid": 11, "state": "idle"}, {"gpu": 0, "pid": 12, "state": "idle"}]}
    text = "\n".join(status.lines(st))
    assert "1 client(s) (and 4 of the warm-worker pool), 1 job(s)" in text, text
    assert "job 9 of" in text and "krex_ctl.worker" not in text, text
    console = Console(record=True, width=160)
    console.print(status.table(st))
    assert "1 client(s) (and 4 of the warm-worker pool), 1 job(s)" in console.export_text()
    # a node with more of each than a reply lists: counted before the lists are cut
    big = dict(st, clients=[{"pid": 1000 + i, "role": "shim", "job": 9} for i in range(300)] + st["clients"],
               workers=[{"gpu": 0, "pid": 1000 + i, "state": "idle"} for i in range(250)] + st["workers"],
               jobs=[{"job": 100 + i, "root_pid": 1000 + i, "uid": 0, "command": worker, "gpus": [], "warm_pool": True}
                     for i in range(250)] + st["jobs"])
    seen = server_feedback.bound_status(json.loads(json.dumps(big)), asker_uid=0)
    assert seen["omitted"]["clients"] > 0 and seen["omitted"]["jobs"] > 0
    assert status.clients_line(seen) == "51 client(s) (and 254 of the warm-worker pool), 2 job(s)", status.clients_line(seen)


def test_status_hides_other_users_commands_and_stays_bounded():
    """One client could break `krex status` for everyone (a reply over 64 KiB: bad frame), and --json showed
    every user other users' argv (an --api-token=...)."""
    st = {"controller": {}, "gpus": [{"gpu": 0, "owner": {"job": 1, "command_argv": ["b", "--api-token=x"]},
                                      "queue": [{"region": i} for i in range(1000)], "clients": list(range(900))}],
          "clients": [{"id": i, "pid": i, "uid": 7, "role": "cli", "job": None, "gpus": []} for i in range(900)],
          "jobs": [{"job": 1, "uid": 7, "command": ["b", "--api-token=x"]}] +
                  [{"job": i, "uid": 7, "command": ["x" * 1010] * 63} for i in range(2, 70)],
          "counters": {}}
    other = server_feedback.bound_status(json.loads(json.dumps(st)), asker_uid=8)
    assert other["jobs"][0]["command"] is None and other["gpus"][0]["owner"]["command"] is None
    assert "api-token" not in json.dumps(other)
    assert len(json.dumps(other)) <= ops.STATUS_MAX_BYTES and other["omitted"]["gpu0_queue"] == 800
    from krex_ctl.commands.status import clients_line       # counted before the cut: it said "0 client(s)"
    st2 = dict(st, clients=st["clients"] + [{"id": 1000, "pid": 1000, "uid": 7, "role": "shim", "job": 1, "gpus": [0]}])
    assert clients_line(server_feedback.bound_status(json.loads(json.dumps(st2)), asker_uid=7)) == \
        "1 client(s) (and 899 connection(s) of krex's own: krex status, krex run's progress lines), 69 job(s)"
    same = server_feedback.bound_status(json.loads(json.dumps(st)), asker_uid=7)
    assert same["jobs"][0]["command"] == ["b", "--api-token=x"]
    assert server_feedback.bound_status(json.loads(json.dumps(st)), asker_uid=0)["jobs"][0]["command"]


def test_a_huge_argv_runs_and_status_still_answers(krex, tmp_path):
    """argv over 64 KiB made `krex run` fail without running it; a command of 63 x 1010 characters made the
    status reply too large."""
    krex.start_controller()
    owner, _ = holder(krex, tmp_path / "release")
    big = [krex_cli(krex, "run", "--", "sh", "-c", "exit 0", *(["y" * 1010] * 63))]
    huge = krex_cli(krex, "run", "--", "sh", "-c", "exit 4", *(["z" * 4096] * 40))
    assert big[0].returncode == 0 and huge.returncode == 4, huge.stderr
    p = subprocess.Popen(KREX + ["run", "--", "sleep", "3", *(["w" * 1010] * 63)], env=krex.env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: any(len(j.get("command") or []) > 2 for j in krex.status()["jobs"]), timeout=60,
             what="the big command's job")
    out = krex_cli(krex, "status")
    assert out.returncode == 0 and "bad frame" not in out.stderr, out.stderr
    p.communicate(timeout=60)
    (tmp_path / "release").touch()
    owner.communicate(timeout=60)


# ---- traces --------------------------------------------------------------------------------------------------
PHASES = {"B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "R", "c"}


def check_trace_event_format(data) -> list:
    """The Trace Event Format's rules krex's events must keep (JSON Object Format, traceEvents): every event
    a dict with name, ph of the spec's phases, integer pid (and tid), ts a number in microseconds (metadata
    needs none), X events a dur >= 0, M events one of the spec's metadata names with args."""
    assert isinstance(data, dict) and isinstance(data["traceEvents"], list)
    assert data.get("displayTimeUnit", "ms") in ("ms", "ns")
    events = data["traceEvents"]
    for ev in events:
        assert isinstance(ev, dict) and isinstance(ev.get("name"), str) and ev.get("ph") in PHASES, ev
        assert isinstance(ev.get("pid"), int) and isinstance(ev.get("tid", 0), int), ev
        if ev["ph"] == "M":
            assert ev["name"] in ("process_name", "process_labels", "process_sort_index", "thread_name",
                                  "thread_sort_index") and isinstance(ev["args"], dict)
            continue
        assert isinstance(ev["ts"], (int, float)) and ev["ts"] >= 0, ev
        if ev["ph"] == "X":
            assert isinstance(ev["dur"], (int, float)) and ev["dur"] >= 0, ev
        if ev["ph"] == "i":
            assert ev.get("s", "t") in ("g", "p", "t")
        assert isinstance(ev.get("args", {}), dict)
    json.dumps(data, allow_nan=False)      # no NaN or Infinity: strict JSON, as the UI's parser wants
    return events


def test_krex_trace_turns_a_report_into_a_perfetto_trace(krex, tmp_path):
    krex.start_controller()
    sib_report, rep = tmp_path / "sib.json", tmp_path / "r.json"
    sibling = krex.popen([SNIP / "hog"], report=sib_report, env={"SNIPPET_MS": "30000"})
    wait_for(lambda: any(c["role"] == "shim" and c["gpus"] for c in krex.status()["clients"]), timeout=60, what="hog")
    out = krex.run([SNIP / "region"], report=rep)
    assert out.returncode == 0, out.stderr
    sibling.send_signal(signal.SIGINT)
    sibling.communicate(timeout=60)
    trace = tmp_path / "trace.json"
    out = krex_cli(krex, "trace", str(rep), "-o", str(trace))
    assert out.returncode == 0, out.stderr
    events = check_trace_event_format(json.loads(trace.read_text()))
    regions = [e for e in events if e["ph"] == "X" and e["pid"] == trace_format.GPU_PID_BASE]
    assert [e["name"] for e in regions] == ["timed"] * 3 and all(e["args"]["exclusive"] for e in regions)
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] in ("process_name", "thread_name")}
    assert {"GPU 0", "regions", "wait", "handoff"} <= names
    assert any(e["name"].startswith("frozen for") for e in events)   # the hog was frozen in each region
    assert any(e["name"] == "drain" for e in events)
    # two reports on one timeline; a report that is none; an existing file that is not ours stays
    out = krex_cli(krex, "trace", str(rep), str(sib_report), "-o", "-")
    assert out.returncode == 0 and check_trace_event_format(json.loads(out.stdout))
    precious = tmp_path / "precious.json"
    precious.write_text("mine")
    out = krex_cli(krex, "trace", str(rep), "-o", str(precious))
    assert out.returncode == 2 and precious.read_text() == "mine" and out.stderr.startswith("krex: -o ")
    out = krex_cli(krex, "trace", str(precious), "-o", str(tmp_path / "t2.json"))
    assert out.returncode == 2 and "not a JSON file" in out.stderr and "Traceback" not in out.stderr


def test_controller_trace_and_metrics(krex, tmp_path):
    """krex controller --trace FILE appends every region; --metrics serves Prometheus text."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    ctl_trace = tmp_path / "ctl-trace.json"
    krex.start_controller("--trace", str(ctl_trace), "--metrics", f"127.0.0.1:{port}")
    wait_for(lambda: ctl_trace.exists() and ctl_trace.read_text() == "[", what="the trace's opening bracket")
    assert ctl_trace.stat().st_mode & 0o777 == 0o600      # every job's command line: its owner's alone
    out = krex.run([SNIP / "region"])
    assert out.returncode == 0, out.stderr
    events = check_trace_event_format(trace_format.load(str(ctl_trace)))   # readable while the controller runs
    assert sum(1 for e in events if e["ph"] == "X" and e["name"] == "timed") == 3

    def scrape():
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            return r.read().decode()
    text = wait_for(lambda: (lambda t: t if 'krex_queue_length{gpu="0"}' in t else None)(scrape()), timeout=30,
                    interval=0.2, what="metrics sampled")
    assert 'krex_regions_granted_total{gpu="0"} 3.0' in text
    assert 'krex_region_wait_seconds_count{gpu="0"} 3.0' in text and "krex_region_hold_seconds_bucket" in text
    assert 'krex_queue_length{gpu="0"}' in text and 'krex_frozen_processes{gpu="0"}' in text
    # the hand-offs before the grants, per phase (each region waits for a read pass in its drain: never 0)
    drain = re.search(r'krex_region_handover_seconds_total\{gpu="0",phase="drain"\} ([0-9.e+-]+)', text)
    assert drain and float(drain.group(1)) > 0, text
    # the event counters krex status lists, e.g. a region waiting for its fair share (none here)
    text = wait_for(lambda: (lambda t: t if 'krex_controller_events_total{event="regions_granted"} 3.0' in t
                             else None)(scrape()), timeout=30, interval=0.2, what="event counters sampled")
    assert 'krex_controller_events_total{event="fair_share_waits"} 0.0' in text
    assert 'krex_controller_events_total{event="clients_total"}' in text
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics?name[]=krex_controller_events_total",
                                timeout=10) as r:            # a scrape of this metric alone finds it
        only = r.read().decode()
    assert 'krex_controller_events_total{event="regions_granted"} 3.0' in only and "krex_queue_length" not in only
    for path in ("/", "/metricsx", "/favicon.ico", "/api/v1/query"):     # only /metrics serves them
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10)
        assert e.value.code == 404 and b"/metrics" in e.value.read(), path
    # a region held now: how long, for an alert on one stuck toward its time limit (0 once it ended)
    held = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_HOLD_US": "4000000"})

    def held_s():
        m = re.search(r'krex_region_held_seconds\{gpu="0"\} ([0-9.e+-]+)', scrape())
        return m and float(m.group(1)) >= 1.0 and float(m.group(1))
    assert 1.0 <= wait_for(held_s, timeout=30, interval=0.2, what="a region held for a second") < 30
    held.communicate(timeout=60)
    assert wait_for(lambda: 'krex_region_held_seconds{gpu="0"} 0.0' in scrape(), timeout=30, interval=0.2,
                    what="no region held")
    krex.stop()
    data = json.loads(ctl_trace.read_text())     # closed at the end: a complete JSON array
    assert isinstance(data, list)


def test_controller_trace_never_replaces_a_file_and_metrics_address_is_checked(krex, tmp_path):
    """A bad --trace or --metrics is refused in one line before the controller binds its socket: no socket
    files, no registry entry, no trace file made (the next start finds no 'controller served here before')."""
    precious = tmp_path / "precious"
    precious.write_text("mine")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    for args, why in ((["--metrics", "nowhere"], "is not HOST:PORT"),
                      (["--metrics", "127.0.0.1:99999"], "port in 1-65535"),
                      (["--trace", str(tmp_path / "no" / "t.json")], "No such file"),
                      (["--metrics", f"127.0.0.1:{port}"], "cannot listen"),
                      (["--metrics", f"127.0.0.1:{port}", "--trace", str(tmp_path / "t.json")], "cannot listen")):
        out = krex_cli(krex, "controller", "--socket", str(tmp_path / "c.sock"), *args)
        assert out.returncode == 2 and why in out.stderr and len(out.stderr.splitlines()) == 1, out.stderr
        assert not list(tmp_path.glob("c.sock*")) and not list(krex.registry.iterdir()), args
    taken.close()
    assert precious.read_text() == "mine" and not (tmp_path / "t.json").exists()
    krex.start_controller()                      # the socket is served: a second controller's trace file goes again
    out = krex_cli(krex, "controller", "--socket", str(krex.socket), "--trace", str(tmp_path / "t.json"))
    assert out.returncode == 4 and not (tmp_path / "t.json").exists(), out.stderr


def test_a_trace_file_that_exists_is_kept_and_the_regions_go_to_a_new_one(krex, tmp_path):
    """A restarted node controller's config names the trace file its predecessor wrote: that file is kept as it
    is, and the regions go to the first free name with .1, .2, ... before the extension (a restart loop never
    follows from it); a file that is not regular (a FIFO) is written as it is."""
    from krex_ctl.wire import trace

    precious = tmp_path / "regions.json"
    precious.write_text("mine")
    (tmp_path / "regions.1.json").write_text("an earlier run's")
    sink = trace.Sink(str(precious))
    assert sink.path == str(tmp_path / "regions.2.json") and sink.created
    sink.region({"id": 1, "name": "r", "gpus": [0], "granted_ns": 1000, "ended_ns": 2000, "exclusive": True,
                 "taints": [], "pid": 5})
    sink.close()
    assert precious.read_text() == "mine" and (tmp_path / "regions.1.json").read_text() == "an earlier run's"
    assert json.loads((tmp_path / "regions.2.json").read_text())
    krex.start_controller("--trace", str(precious), "--log-level", "info")
    wait_for(lambda: (tmp_path / "regions.3.json").exists(), what="the new trace file")
    krex.status()           # its loop serves, its SIGTERM handler in place (it answers once bound, before that)
    krex.ctl.terminate()
    krex.ctl.wait()
    assert precious.read_text() == "mine" and json.loads((tmp_path / "regions.3.json").read_text()) == []
    assert f"trace: {precious} exists (a previous run's); the regions go to {tmp_path / 'regions.3.json'}" in \
        krex.ctl_log.read_text()


def test_controller_says_ready_to_systemd(krex, tmp_path):
    """Type=notify: READY=1 on NOTIFY_SOCKET once the socket serves."""
    path = tmp_path / "notify"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(str(path))
    s.settimeout(60)
    krex.env["NOTIFY_SOCKET"] = str(path)
    krex.start_controller()
    msg = s.recv(4096).decode()
    assert "READY=1" in msg.splitlines() and krex.answers()
    s.close()


def test_frozen_time_counted_by_a_controller_that_went_away_is_kept():
    """A controller that went away while it had the command's process frozen took its count of that time with it:
    the next controller's replies have no freeze and count from nothing, and the line and the summary said
    'resumed; 0.0 s frozen in all' and 'frozen 0.00 s' after 'paused (frozen) at least 1.5 s'. What the lost
    controller counted is kept and added to what the next one counts; the next one is asked about the job it gave
    the wrapper (it numbers jobs anew: the old id may be another command's there), and nothing is asked while the
    wrapper has no controller."""
    import io

    def reply(*frozen, total=None):
        return {"waits": [], "frozen": [dict(f, gpu=[0]) for f in frozen],
                "frozen_ns": {} if total is None else {"901": int(total * 1e9)}}

    wrapper = {"losses": 0, "job": 2}
    replies, asked = [], []

    class Asked(feedback.Watcher):
        def request(self, job):
            asked.append(job)
            return replies.pop(0)

    out = io.StringIO()
    w = Asked("unused.sock", 2, feedback.Feedback(out=out), source=lambda: (wrapper["losses"], wrapper["job"]))
    freeze = {"pid": 901, "region_id": 3, "since_s": 1.5, "by": {"pid": 812, "uid": os.getuid(), "region": "r"}}
    replies += [reply(freeze, total=1.5), reply(dict(freeze, since_s=1.6), total=1.6)]
    w.take(w.ask())
    w.take(w.ask())
    assert out.getvalue() == "" and asked == [2, 2]
    wrapper.update(losses=1, job=None)       # the controller is gone: the guardian resumed the job's processes
    w.take(w.ask())
    assert asked == [2] * 2 and out.getvalue().splitlines()[-1].endswith("; resumed; 1.6 s frozen in all")
    wrapper["job"] = 1                        # connected again: job 1 of the controller that took its place
    replies += [reply(dict(freeze, region_id=1, since_s=0.5), total=0.5), reply(total=0.7)]
    w.take(w.ask())
    w.take(w.ask())
    assert asked == [2, 2, 1, 1]
    assert out.getvalue().splitlines()[-1].endswith("; resumed; 2.3 s frozen in all"), out.getvalue()
    assert w.totals() == {901: int(2.3e9)}
    wrapper.update(losses=2, job=3)          # lost and connected again between two polls
    replies.append(reply(total=0.2))
    w.take(w.ask())
    assert w.totals() == {901: int(2.5e9)} and asked[-1] == 3

def test_status_names_the_command_of_a_region_owner_no_wrapper_started(krex, tmp_path):
    """A process under the shim with no `krex run` (a Slurm task the prolog preloaded) holding a region: `krex
    status` showed its command empty ('alice: ;'), where its job's line had it."""
    krex.start_controller()
    release = tmp_path / "release"
    env = dict(krex.env, LD_PRELOAD=str(ROOT / "build" / "libkrex.so"), SNIPPET_REGIONS="1", SNIPPET_N="1",
               SNIPPET_HOLD_FILE=str(release))
    for k in ("KREX_JOB", "KREX_COUNTERS"):
        env.pop(k, None)
    p = subprocess.Popen([str(SNIP / "region")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        owner = wait_for(lambda: next((g["owner"] for g in krex.status()["gpus"]
                                       if g["owner"] and g["owner"]["state"] == "held"), None), what="its region")
        assert owner["command"] and owner["command"][0].endswith("snippets/region"), owner
        [job] = [j for j in krex.status()["jobs"] if j["job"] == owner["job"]]
        assert job["gpus"] == [] and job["context_gpus"] == [0], job     # no wrapper declared it; its context's
        out = subprocess.run(KREX + ["status"], env=krex.env, capture_output=True, text=True, timeout=30)
        assert "snippets/region" in out.stdout.split("region ", 1)[1], out.stdout
    finally:
        release.touch()
        p.communicate(timeout=60)
