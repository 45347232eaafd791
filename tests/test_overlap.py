"""The overlap controls (KREX_OVERLAP, shim/overlap.c) on the fake driver, with real processes: which kernels
get the greatest priority, which get padded shared memory (and so fewer resident blocks), which never, the
fallback when the driver refuses a change, the counts, and `krex run --overlap`."""

import json
import subprocess
import sys

import pytest

from conftest import BUILD, SNIP
from krex_ctl.environ import check_overlap
from krex_ctl.errors import KrexCommandError
from krex_ctl.wire.counters import create_counters, read_counters

SHIM = BUILD / "libkrex.so"
COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"     # what NCCL's kernels are called (a substring of the mangled name)
GEMM = "gemm_regs=64"                                # 64 registers x 256 threads: 4 blocks per SM on the fake GPU
IN_FLIGHT = f"X:{COMM}_long:400000:512:0"            # a communication kernel running for 0.4 s on its own stream


def launch(tmp_path, controls, *launches, env=None):
    """Run the overlap snippet under the shim (no controller: the controls work without one). Returns
    (completed process, trace records {name: fields}, counters)."""
    counters = tmp_path / "counters"
    if counters.exists():
        counters.unlink()
    create_counters(counters)
    trace = tmp_path / "trace"
    trace.unlink(missing_ok=True)
    e = {"LD_PRELOAD": str(SHIM), "KREX_FAKE_TRACE": str(trace), "KREX_COUNTERS": str(counters),
         "KREX_LOG_LEVEL": "error", "KREX_SOCKET": str(tmp_path / "none.sock"), "PATH": "/usr/bin:/bin"}
    if controls is not None:
        e["KREX_OVERLAP"] = controls
    e.update(env or {})
    out = subprocess.run([SNIP / "overlap", *launches], env=e, capture_output=True, text=True, timeout=60)
    records = {}
    for line in trace.read_text().splitlines() if trace.exists() else []:
        _pid, _sid, start, end, rest = line.split(" ", 4)
        name, *fields = rest.split(" ")
        records[name] = dict(f.split("=", 1) for f in fields)
    return out, records, read_counters(counters)


def overlap_counts(totals):
    return {k[len("overlap_"):]: v for k, v in totals.items() if k.startswith("overlap_") and v}


def test_communication_kernels_by_name_get_the_greatest_priority(tmp_path):
    out, rec, c = launch(tmp_path, "priority,noguard", f"X:{COMM}:16:512:81920", f"L:{COMM}_ptr:8:512:0",
                         f"XP:{COMM}_own:8:512:0", "X:ncclSymkDevKernel_AllGather:8:512:0", f"X:{GEMM}:64:256:0",
                         "L:not_nccl_reduce:64:256:0")
    assert out.returncode == 0, out.stdout + out.stderr
    # the fake's priority range is 0 (least) .. -5 (greatest); a cuLaunchKernel became a cuLaunchKernelEx, and a
    # priority the caller gave (-1) is raised to the greatest
    for name in (COMM, f"{COMM}_ptr", f"{COMM}_own", "ncclSymkDevKernel_AllGather"):
        assert rec[name]["prio"] == "-5", (name, rec[name])
    assert rec[COMM]["smem"] == "81920"
    assert rec[GEMM]["prio"] == "0" and rec["not_nccl_reduce"]["prio"] == "0"
    assert overlap_counts(c) == {"prioritized": 4}


def test_graph_kernel_nodes_of_communication_kernels_get_the_priority(tmp_path):
    out, rec, c = launch(tmp_path, "priority,noguard", f"G:{COMM}:4:512:0", f"G:{GEMM}:4:256:0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert rec[COMM]["prio"] == "-5" and rec[GEMM]["prio"] == "0"
    assert overlap_counts(c) == {"prioritized": 1}


def test_shape_pads_compute_kernels_to_fewer_resident_blocks(tmp_path):
    grid = 2000                                          # more blocks than fit at once
    _, off, _ = launch(tmp_path, None, IN_FLIGHT, f"L:{GEMM}:{grid}:256:0", f"X:{GEMM}_ex:{grid}:256:1024")
    assert off[GEMM] == {"smem": "0", "prio": "0", "occ": "4", "resident": str(4 * 132), "gpu": "0"}
    out, on, c = launch(tmp_path, "shape=2,noguard", IN_FLIGHT, f"L:{GEMM}:{grid}:256:0", f"X:{GEMM}_ex:{grid}:256:1024")
    assert out.returncode == 0, out.stdout + out.stderr
    for name in (GEMM, f"{GEMM}_ex"):
        assert on[name]["occ"] == "2" and int(on[name]["resident"]) == 2 * 132 < int(off[name]["resident"])
        # padded past a third of the SM's 228 KiB (with the 1 KiB each block reserves): 2 fit, 3 do not
        assert 3 * (int(on[name]["smem"]) + 1024) > 233472 >= 2 * (int(on[name]["smem"]) + 1024)
    assert overlap_counts(c) == {"padded": 2, "skip_communication": 1}
    # shape=1: one block per SM, above 48 KiB: the function's limit was raised first
    _, one, _ = launch(tmp_path, "shape=1,noguard", IN_FLIGHT, f"L:{GEMM}:{grid}:256:0")
    assert one[GEMM]["occ"] == "1" and int(one[GEMM]["smem"]) > 48 * 1024


def test_shape_pads_only_while_communication_is_in_flight_on_another_stream(tmp_path):
    # no communication at all; then a short one that has ended; then one on the same stream (it ends first)
    _, rec, c = launch(tmp_path, "shape=2,noguard", f"L:{GEMM}:2000:256:0")
    assert rec[GEMM]["occ"] == "4" and overlap_counts(c) == {"skip_idle": 1}
    _, rec, c = launch(tmp_path, "shape=2,noguard", f"X:{COMM}:1000:512:0", "SLEEP:100", f"L:{GEMM}:2000:256:0")
    assert rec[GEMM]["occ"] == "4" and overlap_counts(c) == {"skip_idle": 1, "skip_communication": 1}
    _, rec, c = launch(tmp_path, "shape=2,noguard", IN_FLIGHT, f"L:{GEMM}:2000:256:0", env={"SNIPPET_ONE_STREAM": "1"})
    assert rec[GEMM]["occ"] == "4" and overlap_counts(c) == {"skip_idle": 1, "skip_communication": 1}


def test_kernels_that_are_never_padded(tmp_path):
    out, rec, c = launch(tmp_path, "shape=2,noguard", IN_FLIGHT, "C:coop:8:256:0", "XC:coop_ex:8:256:0",
                         "XK:clustered:8:256:0", "L:built_cluster_k:8:256:0", "L:big_smem=90000:64:256:0",
                         "L:noname_kernel:64:256:0", "CAP:captured_first:64:256:0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert all(r["smem"] == "0" for r in rec.values()), rec
    assert overlap_counts(c) == {"skip_communication": 1, "skip_cooperative": 2, "skip_cluster": 2,
                                 "skip_at_or_below": 1, "skip_unnamed": 1, "skip_unchecked": 1}


def test_a_change_the_driver_refuses_falls_back_to_the_original_launch(tmp_path):
    out, rec, c = launch(tmp_path, "shape=2,priority,noguard", f"X:{COMM}:400000:512:0", f"L:{GEMM}:300:256:0",
                         f"L:{GEMM}_b:300:256:0", env={"KREX_FAKE_REFUSE_SMEM_ABOVE": "50000"})
    assert out.returncode == 0, out.stdout + out.stderr          # no launch lost or failed
    assert out.stdout.split() == ["X", COMM, "0", "L", GEMM, "0", "L", f"{GEMM}_b", "0"]
    assert rec[GEMM]["smem"] == "0" and rec[f"{GEMM}_b"]["smem"] == "0"
    assert overlap_counts(c) == {"fallbacks": 2, "prioritized": 1, "skip_communication": 1}
    # a refused padding is not tried again: the second launch of the same function goes as asked at once
    out, rec, c = launch(tmp_path, "shape=2,noguard", f"X:{COMM}:400000:512:0", f"LL:{GEMM}:300:256:0",
                         env={"KREX_FAKE_REFUSE_SMEM_ABOVE": "50000"})
    assert out.returncode == 0, out.stdout + out.stderr
    assert overlap_counts(c) == {"fallbacks": 1, "skip_unchecked": 1, "skip_communication": 1}


def test_a_launch_that_fails_as_asked_still_fails_and_is_no_fallback(tmp_path):
    out, _, c = launch(tmp_path, "shape=2,noguard", IN_FLIGHT, f"L:{GEMM}:300:2048:0")  # 2048 threads: invalid either way
    assert out.returncode == 1 and out.stdout.split()[-3:] == ["L", GEMM, "1"]
    assert "fallbacks" not in overlap_counts(c)


def test_sm_target_goes_on_every_cublaslt_matmul_descriptor(tmp_path):
    out, _, c = launch(tmp_path, "sm_target=116,noguard", "LT", "LT")
    assert out.stdout.split() == ["LT", "sm_target", "116"] * 2
    assert overlap_counts(c) == {"sm_target": 2}
    # under the guard, none before the first communication launch (the controls are off until an exploration)
    out, _, c = launch(tmp_path, "sm_target=116", "LT")
    assert out.stdout.split() == ["LT", "sm_target", "0"] and overlap_counts(c) == {}
    out, _, _ = launch(tmp_path, None, "LT")
    assert out.stdout.split() == ["LT", "sm_target", "0"]


def test_controls_off_or_unreadable_change_nothing(tmp_path):
    args = (f"X:{COMM}:16:512:0", f"L:{GEMM}:2000:256:0", "LT")
    for controls in (None, "", "bogus,shape=0"):
        out, rec, c = launch(tmp_path, controls, *args)
        assert out.returncode == 0
        assert rec[COMM]["prio"] == "0" and rec[GEMM]["smem"] == "0" and rec[GEMM]["occ"] == "4"
        assert overlap_counts(c) == {}
        assert out.stdout.split()[-1] == "0"        # the SM count target untouched


@pytest.mark.parametrize("spec,ok", [("priority", True), ("shape=2", True), ("priority,shape=1,sm_target=116", True),
                                     ("shape=32", True), ("shape=0", False), ("shape=33", False), ("shape=", False),
                                     ("sm_target=0", False), ("sm_target=70000", False), ("prio", False), ("", False),
                                     ("priority,", False), ("shape=2 ", False), ("noguard", True),
                                     ("priority,shape=1,noguard", True), ("noguard=1", False), ("guard", False)])
def test_check_overlap(spec, ok):
    if ok:
        assert check_overlap(spec) == spec
    else:
        with pytest.raises(KrexCommandError) as e:
            check_overlap(spec)
        assert e.value.exit_code == 2 and "--overlap" in str(e.value)


def test_krex_run_overlap_reports_what_each_control_did(krex, tmp_path):
    krex.start_controller()
    rep = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "krex_ctl", "run", "--overlap", "priority,shape=2,noguard", "--report", str(rep), "--",
           str(SNIP / "overlap"), f"X:{COMM}:300000:512:0", f"L:{GEMM}:500:256:0", "C:coop:8:256:0"]
    out = subprocess.run(cmd, env=krex.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    r = json.loads(rep.read_text())
    assert r["launches"] == 3
    ov = r["overlap"]
    assert ov["controls"] == "priority,shape=2,noguard"
    assert (ov["prioritized"], ov["padded"], ov["fallbacks"], ov["sm_target"]) == (1, 1, 0, 0)
    assert (ov["guard_off_epochs"], ov["guard_on_epochs"]) == (0, 0)
    assert ov["skipped"]["communication"] == 1 and ov["skipped"]["cooperative"] == 1
    assert sum(ov["skipped"].values()) == 2
    by_name = {t[4]: t[5] for t in krex.trace_records()}
    assert by_name[COMM]["prio"] == "-5" and by_name[GEMM]["occ"] == "2"
    # without controls: no overlap section, nothing changed
    out = subprocess.run(cmd[:4] + cmd[6:], env=krex.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "overlap" not in json.loads(rep.read_text())


def test_guarded_controls_that_never_ran_an_epoch_are_said_to_have_stayed_off(krex, tmp_path):
    krex.start_controller()
    cmd = [sys.executable, "-m", "krex_ctl", "run", "--overlap", "sm_target=116", "--", str(SNIP / "overlap"),
           f"L:{GEMM}:500:256:0", "LT"]
    out = subprocess.run(cmd, env=krex.env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-3:] == ["LT", "sm_target", "0"]
    assert "no communication kernel ended a guard epoch, so every control stayed off" in out.stderr
    cmd[5] = "sm_target=116,noguard"                 # asked to apply them anyway: applied, and nothing to say
    out = subprocess.run(cmd, env=krex.env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split()[-3:] == ["LT", "sm_target", "116"] and "guard epoch" not in out.stderr


def test_a_bad_overlap_list_is_refused_before_anything_runs(krex, tmp_path):
    marker = tmp_path / "ran"
    base = [sys.executable, "-m", "krex_ctl", "run"]
    out = subprocess.run(base + ["--overlap", "shape=two", "--", "touch", str(marker)], env=krex.env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and not marker.exists()
    assert out.stderr.strip().splitlines()[-1].startswith("krex: --overlap: 'shape=two' is not a comma list")
    out = subprocess.run(base + ["--", "touch", str(marker)], env=dict(krex.env, KREX_OVERLAP="priority,fast"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and not marker.exists() and "KREX_OVERLAP" in out.stderr


def test_priority_sets_torch_nccl_high_priority_unless_the_caller_chose():
    from krex_ctl.environ import RunOptions, preload_environ

    opts = RunOptions(shim="/x/libkrex.so", socket="/s", job=1, overlap="priority,shape=2")
    assert preload_environ({}, opts)["TORCH_NCCL_HIGH_PRIORITY"] == "1"
    assert preload_environ({"TORCH_NCCL_HIGH_PRIORITY": "0"}, opts)["TORCH_NCCL_HIGH_PRIORITY"] == "0"
    env = preload_environ({}, RunOptions(shim="/x/libkrex.so", socket="/s", job=1, overlap="shape=2"))
    assert env["KREX_OVERLAP"] == "shape=2" and "TORCH_NCCL_HIGH_PRIORITY" not in env
