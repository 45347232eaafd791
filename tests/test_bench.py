"""The GPU benchmarks' harnesses end to end on CPU, with a stand-in candidate (so a device call is not spent
on a harness bug): bench/throughput.py runs every kind of mode, krex modes record regions, the warm-worker
mode really runs warm and the JSON has what the measurement pages' tables are made from; bench/warm_probe.py
alternates cold, warm and churned runs as asked; bench/warm_vs_cold.py measures both paths."""

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

import pytest

from conftest import ROOT, new_user_env


def bench_env(tmp_path) -> dict:
    return dict(new_user_env(tmp_path), XDG_RUNTIME_DIR=str(tmp_path))


def test_throughput_harness_runs_every_kind_of_mode(tmp_path):
    env = bench_env(tmp_path)
    out = tmp_path / "result.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "throughput.py"), "--candidate",
                        str(ROOT / "tests" / "snippets" / "candidate_standin.py"), "--plan",
                        "isolated:1,cmdlock:2,krex:2,krexwarm:2,krexwarmbusy:2,krexwarmprewait:2,krexnofreeze:2,isolated:1",
                        "--specs", "3",
                        "--budget", "60",
                        "--logs", str(tmp_path), "--out", str(out)], env=env, capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    summary = {(s["mode"], s["agents"]): s for s in data["summary"]}
    assert [r["failed"] for r in data["runs"]] == [0] * 8
    assert summary[("krex", 2)]["commands"] == summary[("krexwarm", 2)]["commands"] == 3
    for mode in ("krexwarm", "krexwarmbusy", "krexwarmprewait"):
        assert summary[(mode, 2)]["warm_commands"] == 3             # the pool served every command, the third on a refill
    argv = {r["mode"]: r.get("controller_argv", []) for r in data["runs"]}
    assert "--warm-workers" in argv["krexwarmbusy"] and "--freeze-policy busy" in " ".join(argv["krexwarmbusy"])
    assert "--freeze-policy all" in " ".join(argv["krexwarm"]) and "--freeze-policy all" in " ".join(argv["krex"])
    assert "--no-freeze" in argv["krexnofreeze"] and "--freeze-policy" not in argv["krexnofreeze"]
    # every mode names its lifecycle prewait: the controller's default is 400 ms (100 from run 31), these modes keep 0
    assert all("--lifecycle-prewait-ms 0" in " ".join(a) for m, a in argv.items() if a and m != "krexwarmprewait"), argv
    assert "--warm-workers" in argv["krexwarmprewait"] and \
        "--freeze-policy busy --lifecycle-prewait-ms 400" in " ".join(argv["krexwarmprewait"])
    for mode in ("krex", "krexwarm", "krexwarmbusy", "krexnofreeze"):
        run = next(r for r in data["runs"] if r["mode"] == mode)
        assert all(r["regions"] == 2 and r["region_held_s"] > 0 for r in run["rows"]), run["rows"]
        assert summary[(mode, 2)]["amdahl_fraction"] > 0
        assert 0 < run["node_cpu_busy_pct"] <= 100 and run["controller_cpu_s"] > 0, mode   # warm modes' too
    assert summary[("cmdlock", 2)]["vs_cmdlock"] == 1.0
    table = subprocess.run([sys.executable, str(ROOT / "bench" / "report_table.py"), str(out)], capture_output=True,
                           text=True, check=True).stdout
    assert "| krexwarm | 2 | 3 |" in table


def test_warm_probe_alternates_cold_warm_and_churned_runs(tmp_path):
    out = tmp_path / "probe.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "warm_probe.py"), "--candidate",
                        str(ROOT / "tests" / "snippets" / "candidate_standin.py"), "--pairs", "2", "--churn",
                        "--worker-reuse", "2", "--out", str(out)], env=bench_env(tmp_path), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["cold", "warm", "churn"] * 2
    assert all(r["exit"] == 0 and "candidate_ms" in r for r in rows)
    warm = [r for r in rows if r["mode"] == "warm"]
    cold = [r for r in rows if r["mode"] != "warm"]
    assert len({r["ppid"] for r in warm}) == 1                     # all forked by the one zygote
    assert warm[0]["pid"] == warm[1]["pid"]                          # --worker-reuse 2: the same worker twice
    assert not {r["ppid"] for r in warm} & {r["ppid"] for r in cold}  # cold ones are children of their wrappers


def test_warm_vs_cold_reports_both_paths(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "wvc.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "warm_vs_cold.py"), "--repeats", "1", "--concurrent", "2",
                        "--logs", str(tmp_path), "--out", str(out)], env=bench_env(tmp_path), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["warm_median_s"] < r["cold_median_s"] and r["concurrent_warm_wall_s"] > 0
    assert r["cold_check"]["output"][0] == r["warm_check"]["output"][0] == "1024.0"


@pytest.mark.parametrize("in_region", [False, True])
def test_launch_overhead_times_the_launch_path_outside_regions_and_inside_one(tmp_path, in_region):
    """bench/launch_overhead.py on the fake driver: both configurations give a rate; with --in-region every run
    under the shim was granted its region (spin_bench -i says so in its line) and the plain runs had none."""
    out = tmp_path / "overhead.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "launch_overhead.py"), "--bin",
                        str(ROOT / "build" / "snippets" / "spin_bench"), "--launches", "2000", "--repeats", "2",
                        "--out", str(out)] + (["--in-region"] if in_region else []),
                       env=bench_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["in_region"] is in_region and r["ns_per_launch_plain"] > 0 and r["ns_per_launch_shim"] > 0
    assert [x["in_region"] for x in r["runs"]["shim"]] == [int(in_region)] * 2
    assert [x["krex_begin"] for x in r["runs"]["shim"]] == [0 if in_region else -1] * 2
    assert [x["krex_begin"] for x in r["runs"]["plain"]] == [-1] * 2


def test_multigpu_example_plans_chunks_and_needs_two_gpus(tmp_path):
    """The overlapped AG+GEMM example on a machine without two GPUs: it says so and exits 0 (its timing runs
    on nvidia-h200-x2, bench/multigpu_overlap.py); its chunking covers the shard exactly."""
    import subprocess
    import sys

    sys.path.insert(0, str(ROOT / "examples" / "multigpu"))
    from ag_gemm import chunk_rows

    for rows, chunks in ((8192, 4), (8192, 3), (1000, 4), (64, 8)):
        pieces = chunk_rows(rows, chunks)
        assert pieces[0][0] == 0 and pieces[-1][1] == rows and len(pieces) <= chunks
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
    for script in ("ag_gemm.py", "ag_gemm_symm.py"):
        out = subprocess.run([sys.executable, str(ROOT / "examples" / "multigpu" / script), "--help"],
                             capture_output=True, text=True, timeout=60, env={"PYTHONPATH": str(ROOT), "PATH": "/bin"})
        assert out.returncode == 0 and "usage" in out.stdout


def test_kernelbench_mix_harness_end_to_end(tmp_path, short_tmp):
    """bench/kernelbench_mix.py with a CPU stand-in agent and the disturbers that run on the fake driver: every
    mode runs, krex modes carry region records, the analysis has buckets, the noise floor and throughput."""
    env = bench_env(tmp_path)
    env["LD_LIBRARY_PATH"] = str(ROOT / "build" / "fakes")
    env["KREX_NVML"] = str(ROOT / "build" / "fakes" / "libnvidia-ml.so.1")
    env["KBMIX_TMP"] = str(short_tmp)      # its controllers' sockets and logs, which it keeps
    out = tmp_path / "mix.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "kernelbench_mix.py"), "--agent",
                        str(ROOT / "tests" / "snippets" / "kb_standin.py"), "--item-list",
                        "3_a:fp32,5_b:fp32,30_c:fp32,150_d:fp32", "--agents", "2", "--commands", "1", "--items", "2",
                        "--trials", "3", "--modes", "isolated,solo,naive,krex,krexnf,krexdist,isolated2,solo2,solok,solok2,solokown",
                        "--disturbers",
                        "ctx,alloc", "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["notes"]["buckets"] == {"0.1-1ms": ["3_a:fp32", "5_b:fp32"], "1-10ms": ["30_c:fp32"],
                                        ">10ms": ["150_d:fp32"]}
    for mode in ("naive", "krex", "krexnf", "krexdist"):
        assert data["analysis"][mode]["n"] == 4, mode
    assert all("region" in r and r["region"]["granted"] for r in data["raw"]["krex"])
    assert not any("region" in r for r in data["raw"]["naive"])
    assert set(data["noise_floor_p95"]) == {"0.1-1ms", "1-10ms", ">10ms"}
    assert data["commands_per_min"]["krex"] > 0 and data["krex_vs_naive_throughput"] > 0
    assert set(data["notes"]["krexdist_disturber_events"]) == {"ctx", "alloc"}
    # every shared measurement has its solo twins (same agent, command, position), two passes of them
    assert len(data["raw"]["solo"]) == len(data["raw"]["solo2"]) == 4
    assert all(data["analysis_vs_solo"][m]["n"] == 4 for m in ("naive", "krex", "krexnf", "krexdist"))
    assert set(data["noise_floor_solo_p95"]) <= {"0.1-1ms", "1-10ms", ">10ms"}
    # solok: the same twins alone under krex (their own controller): each timing a granted region; a
    # reference family of its own, with the leave-one-out floor (a pass against the other pass)
    assert len(data["raw"]["solok"]) == len(data["raw"]["solok2"]) == 4
    assert all(r["region"]["granted"] and r["region"]["exclusive"] for r in data["raw"]["solok"])
    assert not any("region" in r for r in data["raw"]["solo"])
    assert "solok" not in data["analysis"] and data["analysis_vs_solok"]["krex"]["n"] == 4
    assert data["hand_offs"]["solok"]["regions"] == 4
    # solokown: solok with krexown's controller options, a family of its own (one pass: no floor)
    assert data["analysis_vs_solokown"]["krex"]["n"] == 4 and "noise_floor_solokown_loo_p95" not in data
    assert data["krexnf_vs_naive_throughput"] > 0 and "krexdist_vs_naive_throughput" not in data
    for fam in ("solo", "solok"):
        loo, plain = data[f"noise_floor_{fam}_loo_p95"], data[f"noise_floor_{fam}_p95"]
        assert set(loo) == set(plain) and all(loo[b] >= plain[b] for b in loo), (fam, loo, plain)
    ft = data["first_trials"]["krex"]       # the 0.1-1 ms items' first trials (trials 3)
    assert ft["n"] > 0 and len(ft["median"]) == len(ft["p90"]) == 3
    # --reanalyse: the same analysis from the written measurements, nothing run
    again = tmp_path / "again.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "kernelbench_mix.py"), "--reanalyse", str(out), "--out",
                        str(again)], env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr[-3000:]
    redone = json.loads(again.read_text())
    assert redone["analysis_vs_solok"] == data["analysis_vs_solok"] and redone["argv"] == data["argv"]
    # the table (OUT.md, printed last too): a row per shared mode and reference, the floors where there are two passes
    md = again.with_suffix(".md").read_text()
    assert md == out.with_suffix(".md").read_text() and md in p.stdout
    row = next(line for line in md.splitlines() if line.startswith("| krex | solok |"))
    assert row.count("%") >= 6 and f"{data['analysis_vs_solok']['krex']['flagged']} of 4" in row


def test_kernelbench_mix_floors_compare_a_pass_with_the_other_passes():
    """The leave-one-out floor is each pass against the median of the other passes (two passes: their gap);
    the plain floor, a pass against a median it is part of, is at most that."""
    sys.path.insert(0, str(ROOT / "bench"))
    import kernelbench_mix as km

    def rec(mode, ms, index=0):
        return {"tag": f"{mode}-a0-c0", "index": index, "item": "x:fp32", "median_ms": ms}

    baseline = {"x:fp32": 0.5}
    two = {"solo": [rec("solo", 1.0)], "solo2": [rec("solo2", 1.1)]}
    loo = km.noise_floor_loo(two, ["solo", "solo2"], km.twin_key, baseline)["0.1-1ms"]
    assert loo == pytest.approx([0.1 / 1.1, 0.1])           # 1.0 against 1.1, 1.1 against 1.0
    twins, _ = km.passes(two, ["solo", "solo2"], km.twin_key)
    plain = km.noise_floor(two, ["solo", "solo2"], km.twin_key, twins, baseline)["0.1-1ms"]
    assert plain == pytest.approx([0.05 / 1.05, 0.05 / 1.05]) and max(plain) < min(loo)
    three = dict(two, solo3=[rec("solo3", 1.3)])
    loo3 = km.noise_floor_loo(three, ["solo", "solo2", "solo3"], km.twin_key, baseline)["0.1-1ms"]
    # three passes: each against the median of the other two (1.1 and 1.3, 1.0 and 1.3, 1.0 and 1.1)
    assert loo3 == pytest.approx([abs(1.0 / 1.2 - 1), abs(1.1 / 1.15 - 1), abs(1.3 / 1.05 - 1)])
    assert [km.family(m) for m in ("solo", "solo2", "solok", "solok12", "solokown2")] == \
        ["solo", "solo", "solok", "solok", "solokown"]


def test_trial_modes_summary_groups_trials_by_what_they_followed():
    """bench/trial_modes' summary (the GPU part needs torch and a GPU): the share of trials over 2% above
    the fastest, the host times of slow and quick trials, and each trial's time grouped by output address."""
    sys.path.insert(0, str(ROOT / "bench"))
    import trial_modes

    rows = [{"item": "m:bf16", "trial": i, "ms": 0.2 if i % 4 == 0 else 0.1, "out_ptr": i % 2, "sm_mhz": 1980,
             "reasons": 0, "proc": 0, "cpu": 3, "host_flush_us": 20.0, "host_launch_us": 90.0 if i % 4 == 0 else 50.0}
            for i in range(8)]
    s = trial_modes.summary(rows)["m:bf16"]
    assert s["fastest_ms"] == 0.1 and s["n"] == 8 and s["slow_share"] == 0.25
    assert s["host_us_median"] == {"slow": {"host_flush_us": 20.0, "host_launch_us": 90.0},
                                   "quick": {"host_flush_us": 20.0, "host_launch_us": 50.0}}
    assert s["by"]["out_ptr"] == [["1", 4, 0.0], ["0", 4, 0.5]]     # every slow trial had the even address


def _free_ports(n: int) -> int:
    """A base port with n free consecutive ports above it."""
    import random
    import socket
    for _ in range(50):
        base = random.randrange(20000, 60000)
        try:
            socks = [socket.create_server(("127.0.0.1", base + i)) for i in range(n)]
        except OSError:
            continue
        for s in socks:
            s.close()
        return base
    raise RuntimeError("no free ports")


def test_freeze_policy_harness_end_to_end(tmp_path):
    """bench/freeze_policy.py with the CPU stand-in: every policy's mode runs under its own controller, the
    two isolated passes give the floor, and the table names every policy (the numbers mean nothing here).
    Each controller serves --metrics: its page, scraped after the mode, counts the regions the reports hold."""
    out, md = tmp_path / "fp.json", tmp_path / "fp.md"
    nvml = tmp_path / "nvml"        # the fake NVML's control file: empty, every GPU at its default 1980 MHz
    nvml.write_text("")
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--candidate",
                        str(ROOT / "tests" / "snippets" / "candidate_standin.py"), "--scales", "2", "--budget", "30",
                        "--specs", "2", "--repeat", "2", "--reference-repeat", "3", "--warmup-ms", "500", "--min-reps", "100", "--timer", "graph",
                        "--scatter-gib", "1", "--reference-holder-gib", "2", "--nonce-offset", "500000",
                        "--mix", "2048:0.5,sum@1024/0:0.5", "--reference-processes-for", "sum@1024/0=2",
                        # the stand-in's CPU loops vary with the machine's load: no kernel left out as unstable
                        "--stable-pct", "1000",
                        "--host-bound-check", "--controller-args", "--region-gap-ms 1",
                        "--logs", str(tmp_path), "--out", str(out), "--md", str(md),
                        "--metrics-port", str(_free_ports(5)), "--reference", "solo,solo-busy",
                        "--neighbour", str(ROOT / "tests" / "snippets" / "neighbour_standin.py"),
                        "--neighbour-load", "sum@1024"],
                       env=dict(bench_env(tmp_path), NEIGHBOUR_MARK=str(tmp_path / "neighbour"),
                                KREX_NVML=str(ROOT / "build" / "fakes" / "libnvidia-ml.so.1"),   # regions attested
                                KREX_FAKE_NVML=str(nvml)),
                       capture_output=True, text=True, timeout=400)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [(r["policy"], r["agents"]) for r in data["rows"]] == [("naive", 2), ("all", 2), ("none", 2), ("busy", 2)]
    assert all(r["failed"] == 0 and r["commands"] == 2 for r in data["rows"])
    assert set(data["floors_pct"]) == {"<0.1ms", "0.1-1ms", "1-10ms", ">10ms"}
    rows = next(r for r in data["runs"] if r["mode"] == "krexbusy")["rows"]
    argvs = [" ".join(run["controller_argv"]) for run in data["runs"] if run["mode"].startswith("krex")]
    assert argvs and all(" --region-gap-ms 1" in a for a in argvs), argvs   # --controller-args reaches every one
    assert all(len(r["candidate_all_ms"]) == 2 and r["regions"] == 4 for r in rows), rows
    # --mix sum@1024/0: that command ran the memory-bound op (the stand-in echoes --op), and it is its own kernel
    # (argv_op: what the stand-in's command line said; a row's "op" is also copied from its spec)
    assert sorted((r["argv_op"], r["size"]) for r in rows) == [("matmul", 2048), ("sum", 1024)], rows
    assert [r["variant"] for r in rows if r.get("op")] == [0], rows
    busy = next(r for r in data["rows"] if r["policy"] == "busy")
    assert {"sum@1024/0/candidate", "sum@1024/0/reference"} <= set(busy["per_kernel"]), busy["per_kernel"]
    # which side each p95 of |inflation| comes from: the signed 5th and 95th percentiles, in the table too
    tails = {b: t for b, t in busy["signed_p5_p95_pct"].items() if t}
    assert tails and all(lo <= hi and max(-lo, hi) <= busy["p95_abs_inflation_pct"][b] + 0.005 + 1e-9  # rounded
                         for b, (lo, hi) in tails.items()), (tails, busy["p95_abs_inflation_pct"])
    assert "signed inflation, 5th and 95th percentiles" in md.read_text()
    refs = [r for run in data["runs"] if run["mode"] == "krexsolo" for r in run["rows"]]
    assert refs and all(len(r["candidate_all_ms"]) == 3 for r in refs), refs   # --reference-repeat
    for run in (r for r in data["runs"] if r["mode"] in ("krexsolo", "krexsolobusy")):   # --reference-processes-for
        assert sorted(r["argv_op"] for r in run["rows"]) == ["matmul", "sum", "sum"], run["rows"]
    # passed through: the timing options to every command, --reference-holder-gib to the reference passes' only
    assert all(r["harness"] == {"warmup_ms": 500.0, "min_reps": 100, "timer": "graph", "scatter_gib": 1.0}
               for r in rows), rows
    holders = {run["mode"]: {r["harness"].get("holder_gib") for r in run["rows"]} for run in data["runs"]}
    nonces = [r["nonce"] for run in data["runs"] for r in run["rows"]]
    assert nonces and min(nonces) >= 501000 and len(set(nonces)) == len(nonces), nonces   # --nonce-offset
    assert holders.pop("krexsolo") == holders.pop("krexsolobusy") == {2.0}, holders
    assert "krexbusy" in holders and all(v == {None} for v in holders.values()), holders
    assert all(r["harness"] == {"warmup_ms": 500.0, "min_reps": 100, "timer": "graph", "scatter_gib": 1.0,
                                "holder_gib": 2.0} for r in refs), refs
    # each region's lowest SM clock from its attestation (the fake NVML's 1980 MHz), summed up per mode
    assert all(r["region_clocks_mhz"] == [1980] * 4 and r["region_taints"] == [] for r in rows), rows
    # where the waits for a grant went, per hand-off phase (the report's *_ns), summed over each command's regions
    assert all(set(r["region_phases_s"]) == {"queued", "drain", "settle", "freeze", "isolate", "attest"}
               and min(r["region_phases_s"].values()) >= 0 for r in rows), rows
    assert data["region_clock_mhz"]["krexbusy:2"] == {"median": 1980, "p10": 1980, "regions": 8}
    # a reference's two passes: one summary of both (not the second alone)
    assert data["region_clock_mhz"]["krexsolo:1"]["regions"] == sum(len(r["region_clocks_mhz"]) for r in refs)
    # each region's previous_region, from the controller's record: two agents' regions follow each other on GPU 0
    prev = [p for r in rows for p in r["region_previous"] if p is not None]
    assert prev and all(len(p) == 4 and p[0] >= 0 and p[1] > 0 and p[2] == 1980 for p in prev), rows
    assert "lowest SM clock per region (MHz; median, 10th percentile, regions): " in md.read_text()
    # a command's wall time split at the stand-in's monotonic start and end: before its body (wrapper, interpreter),
    # its body, after it (exit, report); the report's frozen time beside the waits
    assert all(0 < r["before_s"] < r["wall_s"] and 0 < r["after_s"] < r["wall_s"] and "t0_mono" not in r
               and r["before_s"] + r["total_s"] + r["after_s"] == pytest.approx(r["wall_s"], abs=0.01)
               and r["frozen_s"] >= 0 for r in rows), rows
    ph = data["command_phases_s"]["krexbusy:2"]
    assert ph["commands"] == 2 and ph["wall"] == pytest.approx(statistics.fmean(r["wall_s"] for r in rows), abs=0.002)
    assert ph["before"] + ph["import"] + ph["inside"] + ph["after"] == pytest.approx(ph["wall"], abs=0.02), ph
    assert set(data["command_phases_s"]) == {f"{r['mode']}:{r['agents']}" for r in data["runs"]}   # naive too
    assert "a command's wall time, mean s (wall / before / import / inside / after" in md.read_text()
    cpu = data["cpu_use"]            # what each shared mode cost the node's CPUs, its controller's apart
    assert set(cpu) == {"naive:2", "krex:2", "krexnofreeze:2", "krexbusy:2"}, cpu
    assert all(0 < c["node_cpu_busy_pct"] <= 100 for c in cpu.values()) and "controller_cpu_s" not in cpu["naive:2"]
    assert all(0 < c["controller_cpu_s"] < c["wall_s"] for k, c in cpu.items() if k != "naive:2"), cpu
    assert "the node's CPUs while each mode ran (busy %" in md.read_text()
    assert "| busy | 2 |" in md.read_text()
    assert "per kernel: median signed inflation" in md.read_text()
    # --host-bound-check: every krex command's timings say whether their region was host-bound (the stand-in
    # launches nothing: none), and each krex policy has the judgement without them beside its own
    assert all(len(r["candidate_host_bound"]) == 2 and not any(r["candidate_host_bound"]) for r in rows), rows
    assert all(r.get("host_bound_timings") == 0 and r["without_host_bound"]["kernels"] == r["kernels"]
               for r in data["rows"] if r["policy"] != "naive")
    assert "less 0 host-bound timings" in md.read_text()
    for r in data["rows"]:          # per kernel: the same timings the buckets count, split by kernel
        assert r["per_kernel"] and sum(k["n"] for k in r["per_kernel"].values()) == sum(r["kernels"].values()), r
    modes = [r["mode"] for r in data["runs"]]
    assert data["reference"] == "krexsolo" and modes[:2] == ["krexsolo", "krexsolobusy"]
    assert modes[-2:] == ["krexsolobusy", "krexsolo"]          # each reference's second pass, in reverse order
    assert set(data["also"]) == {"krexsolobusy"} and "against the krexsolobusy reference:" in md.read_text()
    assert set(data["rows"][0]["median_signed_pct"]) == set(data["floors_pct"])
    # the neighbour ran under krex run, once for each solo-busy pass, and was stopped each time
    marks = (tmp_path / "neighbour").read_text().split("\n")[:-1]
    assert [m.split()[0] for m in marks] == ["start", "stop"] * 2 and all(m.split()[1] != "-" for m in marks)
    assert all(m.split()[2] == "sum@1024" for m in marks), marks          # --neighbour-load reaches it
    for run in (r for r in data["runs"] if r["mode"].startswith("krex")):
        m = run["metrics"]            # cumulative: krexsolo's second pass counts its first one's regions too
        n = sum(r["regions"] for x in data["runs"] if x["mode"] == run["mode"] and x is not run
                for r in x["rows"] if data["runs"].index(x) < data["runs"].index(run))
        assert m["krex_regions_granted_total"] == n + sum(r["regions"] for r in run["rows"]), m
        assert m["krex_region_hold_seconds_count"] == m["krex_regions_granted_total"], m
        assert "events:fair_share_waits" in m and "events:process_sample_us" in m, m   # what the loop did
        assert m["handover:drain"] > 0 and "events:lifecycle_prewaits" in m, m    # the gates closed before grants
        assert m.get("krex_regions_not_exclusive_total", 0) == 0, m
        assert (tmp_path / f"metrics-{run['mode']}-{run['agents']}.prom").exists()
    # --smi: nvidia-smi's samples (UTC, as the device script runs it), split by the modes' times: two in krexbusy's
    # run, one of them at the software power cap (0x4), one before the plan; the header skipped, an [N/A] clock
    # and power counted as a sample without them
    busy_run = next(r for r in data["runs"] if r["mode"] == "krexbusy")
    stamp = lambda t: time.strftime("%Y/%m/%d %H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1000):03d}"  # noqa: E731
    t0, t1 = busy_run["started_unix"], busy_run["ended_unix"]
    smi = tmp_path / "smi.csv"
    smi.write_text("timestamp, clocks.current.sm [MHz], power.draw [W], temperature.gpu, clocks_event_reasons.active\n"
                   f"{stamp(t0 - 100)}, 1980 MHz, 100.00 W, 40, 0x0000000000000000\n"
                   f"{stamp(t0 + 0.3 * (t1 - t0))}, 1500 MHz, 699.50 W, 60, 0x0000000000000004\n"
                   f"{stamp(t0 + 0.6 * (t1 - t0))}, 1980 MHz, 650.00 W, 60, 0x0000000000000000\n"
                   f"{stamp(t0 + 0.7 * (t1 - t0))}, [N/A], [N/A], 60, 0x0000000000000000\n"
                   f"{stamp(t0 + 0.8 * (t1 - t0))}, 1980 MHz, 600.00 W, 60, [N/A]\n")
    again = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--reanalyse", str(out),
                            "--smi", str(smi), "--out", str(tmp_path / "again.json")], env=bench_env(tmp_path),
                           capture_output=True, text=True, timeout=60)
    redone = json.loads((tmp_path / "again.json").read_text())
    assert again.returncode == 0 and redone["rows"] == data["rows"], again.stderr
    assert redone["argv"] == data["argv"] and "--smi" in redone["reanalysed_argv"]   # the run's command line stays
    power = redone["power_by_mode"]
    assert power["krexbusy:2#1"] == {"samples": 3, "capped": 1, "sm_mhz_min": 1500, "watts_max": 699.5}, power
    # judged as the run judged (its --reference solo,solo-busy, from its stored argv), not by the default
    assert redone["reference"] == data["reference"] == "krexsolo" and set(redone["also"]) == {"krexsolobusy"}
    # bench/reduce_result.py keeps the modes' times to the millisecond (7 digits would cut them to 1000 s)
    small = tmp_path / "small.json"
    small.write_text(json.dumps(redone))
    assert subprocess.run([sys.executable, str(ROOT / "bench" / "reduce_result.py"), str(small)],
                          capture_output=True, timeout=60).returncode == 0
    kept = json.loads(small.read_text())["runs"]
    assert [r["started_unix"] for r in kept] == [round(r["started_unix"], 3) for r in redone["runs"]]
    assert power["krexsolo:1#1"]["samples"] == 0 and "krexsolo:1#2" in power and "naive:2#1" in power
    assert "GPU power while each mode ran" in again.stdout and "krexbusy:2#1 3/1/1500/699.5" in again.stdout


def test_ray_fleet_fidelity_against_the_same_run_floor():
    """bench/ray_fleet.py's fidelity: the first and last pergpu passes give each kernel's reference and the
    floor; a bimodal kernel is left out; a krex evaluation counts only when all its regions were clean."""
    sys.path.insert(0, str(ROOT / "bench"))
    import ray_fleet

    def row(size, variant, cand, ref, regions=None):
        r = {"size": size, "variant": variant, "candidate_all_ms": cand, "reference_all_ms": ref,
             "candidate_ms": cand[0], "reference_ms": ref[0]}
        if regions is not None:
            r["regions"] = [{"exclusive": c, "clean": c} for c in regions]
        return r

    runs = [{"mode": "pergpu", "rows": [row(2048, 0, [0.050], [0.040]), row(8192, 0, [2.0], [1.0])]},
            {"mode": "krex", "rows": [row(2048, 0, [0.0505] * 3, [0.040] * 3, [True, True]),
                                      row(8192, 0, [2.02] * 3, [9.9] * 3, [True, True]),
                                      row(8192, 0, [9.0] * 3, [9.0] * 3, [True, False])]},   # tainted: left out
            {"mode": "pergpu", "rows": [row(2048, 0, [0.0501], [0.0401]), row(8192, 0, [2.002], [1.5])]}]
    f = ray_fleet.fidelity(runs)
    assert f["unstable"] == ["8192/0/reference"]                # 1.0 then 1.5 ms: bimodal, left out
    assert f["floor_kernels"] == {"<0.1ms": 2, "0.1-1ms": 0, "1-10ms": 1, ">10ms": 0}
    k = f["modes"]["krex#1"]
    assert k["kernels"] == {"<0.1ms": 6, "0.1-1ms": 0, "1-10ms": 3, ">10ms": 0}
    # each timing against each pass's median (2.0 and 2.002), the floor's own statistic
    assert k["p95_abs_inflation_pct"]["1-10ms"] == pytest.approx(abs(2.02 / 2.0 - 1) * 100)
    assert not k["enough_kernels"] and not k["fidelity_goal"]    # empty buckets: no goal
    assert set(k["per_kernel"]) == {"2048/0/candidate", "2048/0/reference", "8192/0/candidate"}
    assert k["per_kernel"]["8192/0/candidate"]["n"] == 3            # the clean evaluation's three timings
    assert ray_fleet.fidelity(runs[:2]) == {}                   # one pass: no floor, no figure


def test_the_floor_is_the_judged_statistic_taken_in_the_reference_passes():
    """The floor of a bucket is the p95 of |one timing / the other pass's median - 1| over the stable kernels'
    timings in both passes (the statistic a judged timing gets), not the p95 over kernels of the pass medians'
    difference; the older floor and one process's repeat spread are kept beside it."""
    sys.path.insert(0, str(ROOT / "bench"))
    import throughput as T

    p1 = [{"size": 8192, "variant": 0, "candidate_all_ms": [2.0, 2.2], "reference_all_ms": [1.0, 1.0]}]
    p2 = [{"size": 8192, "variant": 0, "candidate_all_ms": [2.1, 2.1], "reference_all_ms": [1.01, 1.01]}]
    ref = T.reference_passes([p1, p2], stable_pct=2.0)
    assert ref["floor_timings"]["1-10ms"] == 8 and ref["floor_kernels"]["1-10ms"] == 2
    # candidate: medians 2.1 and 2.1, so the medians' floor is 0, but its single timings are 4.8% off
    worst = abs(2.0 / 2.1 - 1) * 100
    assert ref["floors_pct"]["1-10ms"] == pytest.approx(worst)
    assert ref["floors_medians_pct"]["1-10ms"] == pytest.approx(1.0)      # the reference kernel's 1.01 / 1.0
    assert ref["repeat_spread_pct"]["1-10ms"] == pytest.approx(10.0)       # 2.2 / 2.0 in one process


def test_reference_processes_put_a_per_process_level_into_the_floor():
    """--reference-processes K: each distinct spec runs in K commands a reference pass, one round after another.
    A kernel that takes a level per process (cuBLAS at 16384 sat 1.27% apart in run 17's two reference processes)
    shows in the floor only as far as the passes' processes differ: with one process a pass at the same level the
    floor is 0; with two a pass, at two levels, the floor holds the level's difference, as the shared modes'
    many processes do; a bad K is refused with exit 2."""
    sys.path.insert(0, str(ROOT / "bench"))
    import throughput as T

    specs = [{"size": 2048, "variant": v} for v in (1, 0, 1)]
    assert T.reference_specs(specs, 2) == [{"size": 2048, "variant": 0}, {"size": 2048, "variant": 1}] * 2
    assert T.reference_specs(specs) == T.distinct(specs)            # REFERENCE_PROCESSES: 1 unless set
    # --reference-processes-for: more commands for some kernels, each round still all of them before the next
    mix = [(2048, 1.0), (("sum@128", 0), 1.0)]
    ap = argparse.ArgumentParser()
    counts = T.parse_kernel_counts("sum@128/0=3,2048/1=2", ap, "--reference-processes-for", mix, 2)
    assert counts == {("sum@128", 0): 3, (2048, 1): 2}
    specs = [{"size": 2048, "variant": 0}, {"size": 2048, "variant": 1}, {"size": 128, "variant": 0, "op": "sum"}]
    T.REFERENCE_PROCESSES_FOR.update(counts)
    try:
        assert [T.kernel_of(s) for s in T.reference_specs(specs)] == [
            (2048, 0), (2048, 1), ("sum@128", 0), (2048, 1), ("sum@128", 0), ("sum@128", 0)]
    finally:
        T.REFERENCE_PROCESSES_FOR.clear()
    row = lambda ms: {"size": 16384, "variant": 1, "reference_all_ms": [ms] * 3}   # noqa: E731
    one = T.reference_passes([[row(13.22)], [row(13.22)]], stable_pct=2.0)
    two = T.reference_passes([[row(13.22), row(13.39)], [row(13.22), row(13.39)]], stable_pct=2.0)
    assert one["floors_pct"][">10ms"] == pytest.approx(0.0) and one["floor_timings"][">10ms"] == 6
    assert two["floor_timings"][">10ms"] == 12 and two["floors_pct"][">10ms"] > 0.5   # about half the 1.3% gap
    for bench in ("freeze_policy.py", "ray_fleet.py"):
        for bad, says in ((["--reference-processes", "0"], "--reference-processes: 1 or more"),
                          (["--reference-holder-gib", "-1"], "--reference-holder-gib: GiB, 0 or more, not -1.0"),
                          (["--scatter-gib", "inf"], "--scatter-gib: GiB, 0 or more, not inf"),
                          (["--min-reps", "-100"], "--min-reps: 0 or more, not -100")):
            p = subprocess.run([sys.executable, str(ROOT / "bench" / bench), *bad, "--out", "/nonexistent/never.json"],
                               capture_output=True, text=True, timeout=60)
            assert p.returncode == 2 and says in p.stderr.strip().splitlines()[-1], (bench, bad, p.stderr)
    # --compiler cuda builds the sum candidate with nvcc: a mix with a matmul is refused (ray_fleet's default mix too)
    for bench, mix in (("freeze_policy.py", ["--mix", "2048:0.5,sum@128/0:0.5"]), ("ray_fleet.py", [])):
        p = subprocess.run([sys.executable, str(ROOT / "bench" / bench), "--compiler", "cuda", *mix,
                            "--out", "/nonexistent/never.json"], capture_output=True, text=True, timeout=60)
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 2 and last.endswith("--compiler cuda: the mix's kernels must all be sum@SIZE (the "
                                                   "matmul candidate is Triton's)"), (bench, last)
    ap = argparse.ArgumentParser()
    T.add_timing_options(ap, "command")
    assert T.timing_args(ap, ap.parse_args([]))[-2:] == ["--timer", "events"]        # triton: nothing added
    assert T.timing_args(ap, ap.parse_args(["--compiler", "cuda"]))[-2:] == ["--compiler", "cuda"]
    T.check_compiler(ap, ap.parse_args(["--compiler", "cuda"]), T.parse_mix("sum@128/0:0.5,sum@8192:0.5", ap))
    for bad, says in (("sum@128/0=0", "K 1 or more, not 'sum@128/0=0'"), ("sum@128=2", "not 'sum@128=2'"),
                      ("4096/0=2", "4096/0 is not a kernel of the mix"), ("2048/2=2", "2048/2 is not a kernel of the mix"),
                      ("2048/0=2,2048/0=3", "2048/0 named twice"), ("sum@x/0=2", "not 'sum@x/0=2'")):
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--mix", "2048:0.5,sum@128/0:0.5",
                            "--reference-processes-for", bad, "--out", "/nonexistent/never.json"],
                           capture_output=True, text=True, timeout=60)
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 2 and "error: --reference-processes-for: " in last and last.endswith(says), (bad, last)
    for bad in ("sum@x", "0", "mm@8192", ""):
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--neighbour-load", bad,
                            "--out", "/nonexistent/never.json"], capture_output=True, text=True, timeout=60)
        last = p.stderr.strip().splitlines()[-1]
        assert p.returncode == 2 and last.endswith(f"--neighbour-load: SIZE (a matmul's, e.g. 8192) or sum@MIB (e.g. "
                                                   f"sum@1024), not {bad!r}"), (bad, last)


def test_a_kernel_left_out_by_name_leaves_the_judgement_and_the_floor_and_is_named(tmp_path):
    """--leave-out SIZE/VARIANT/KIND (a diagnosis: the reading without one kernel): the kernel leaves the floor
    and the judged timings alike, is listed apart from the unstable ones, and the table names it; a malformed
    name is refused with exit status 2 before anything is read."""
    sys.path.insert(0, str(ROOT / "bench"))
    import throughput as T

    p1 = [{"size": 8192, "variant": 0, "candidate_all_ms": [2.0, 2.2], "reference_all_ms": [1.0, 1.0]}]
    p2 = [{"size": 8192, "variant": 0, "candidate_all_ms": [2.1, 2.1], "reference_all_ms": [1.0, 1.0]}]
    ref = T.reference_passes([p1, p2], stable_pct=2.0, leave_out=("8192/0/candidate",))
    assert set(ref["stable"]) == {(8192, 0, "reference")}
    assert ref["left_out"] == ["8192/0/candidate"] and ref["unstable"] == []
    assert ref["floor_timings"]["1-10ms"] == 4 and ref["floors_pct"]["1-10ms"] == pytest.approx(0.0)
    rows = [{"size": 8192, "variant": 0, "candidate_all_ms": [3.0] * 2, "reference_all_ms": [1.0] * 2}]
    assert T.judge(rows, ref)["kernels"]["1-10ms"] == 2           # the reference's two timings, not the 3.0 ms
    # a memory-bound kernel by its mix name
    s1 = [{"size": 1024, "variant": 0, "op": "sum", "candidate_all_ms": [0.3], "reference_all_ms": [0.25]}]
    ref = T.reference_passes([s1, s1], stable_pct=2.0, leave_out=("sum@1024/0/candidate",))
    assert set(ref["stable"]) == {("sum@1024", 0, "reference")} and ref["left_out"] == ["sum@1024/0/candidate"]
    for name in ("16384/0", "mul@1024/0/candidate", "sum@1024/0"):
        bad = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--reanalyse", "x.json",
                              "--leave-out", name, "--out", str(tmp_path / "o.json")], capture_output=True, text=True)
        assert bad.returncode == 2 and f"--leave-out: {name} is not [OP@]SIZE/VARIANT" in bad.stderr, bad.stderr
    # a result that cannot be read: one line, exit status 2
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--reanalyse",
                          str(tmp_path / "none.json"), "--leave-out", "sum@1024/0/candidate",
                          "--out", str(tmp_path / "o.json")], capture_output=True, text=True)
    assert bad.returncode == 2 and "--reanalyse: cannot read" in bad.stderr.strip().splitlines()[-1], bad.stderr
    assert not (tmp_path / "o.json").exists()
    # a result whose rows bench/reduce_result.py --drop-rows took: one line naming where the whole one is
    (tmp_path / "kept.json").write_text(json.dumps({"runs": [{"mode": "naive", "agents": 8, "commands": 3}],
                                                    "reduced_from": {"whole": "git show abc:bench/results/x.json"}}))
    for bench in ("freeze_policy.py", "ray_fleet.py"):
        bad = subprocess.run([sys.executable, str(ROOT / "bench" / bench), "--reanalyse", str(tmp_path / "kept.json"),
                              "--out", str(tmp_path / "o.json")], capture_output=True, text=True, timeout=60)
        last = bad.stderr.strip().splitlines()[-1]
        assert bad.returncode == 2 and last.endswith("keeps its summary only, not its runs' rows; the whole result: "
                                                     "git show abc:bench/results/x.json"), (bench, bad.stderr)


def _specs_of(T, mix: list) -> list:
    """40 specs drawn from MIX (bench/throughput.py's make_specs, seed 11, 2 variants), the module's mix restored."""
    saved = T.MIX[:]
    try:
        T.MIX[:] = mix
        return T.make_specs(40, 11, 2)
    finally:
        T.MIX[:] = saved


def test_a_mix_entry_can_pin_a_size_to_one_variant(tmp_path):
    """--mix SIZE/VARIANT:WEIGHT: every command of that size times that variant (a kernel whose time moves with
    where its operands land is left out of the mix); plain sizes still take turns over the variants; a bad or
    repeated entry is refused with exit status 2 before anything runs."""
    sys.path.insert(0, str(ROOT / "bench"))
    import argparse

    import throughput as T

    ap = argparse.ArgumentParser()
    mix = T.parse_mix("2048:0.5,16384/1:0.5", ap)
    assert mix == [(2048, 0.5), ((16384, 1), 0.5)]
    assert T.parse_mix("8192/0:0.1,8192/1:0.3", ap) == [((8192, 0), 0.1), ((8192, 1), 0.3)]
    specs = _specs_of(T, mix)
    assert {(s["size"], s["variant"]) for s in specs if s["size"] == 16384} == {(16384, 1)}
    assert {s["variant"] for s in specs if s["size"] == 2048} == {0, 1}
    assert {(s["size"], s["variant"]) for s in T.distinct(specs)} == {(2048, 0), (2048, 1), (16384, 1)}
    for script, bad in (("freeze_policy.py", "16384/4:0.2"), ("freeze_policy.py", "16384/1:0.2,16384/1:0.1"),
                        ("freeze_policy.py", "16384/x:0.2"), ("freeze_policy.py", "16384:0.2,16384/1:0.2"),
                        ("freeze_policy.py", "16384/1:0.2,16384:0.2"), ("ray_fleet.py", "8192/1:0")):
        p = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--mix", bad,
                            "--out", str(tmp_path / "o.json")], capture_output=True, text=True)
        assert p.returncode == 2 and "--mix: [OP@]SIZE[/VARIANT]:WEIGHT" in p.stderr, (script, bad, p.stderr)
    assert not (tmp_path / "o.json").exists()


def test_a_mix_entry_can_name_the_memory_bound_op(tmp_path):
    """--mix sum@N[/VARIANT]:WEIGHT: bench/candidate.py --op sum --size N. Its specs carry the op, its kernels
    are named sum@N/VARIANT apart from the matmul of the same size, matmuls sort first, the floor keys them
    apart; an unknown op, a size 0 or a sum size both plain and pinned is refused with exit status 2."""
    sys.path.insert(0, str(ROOT / "bench"))
    import argparse

    import throughput as T

    ap = argparse.ArgumentParser()
    mix = T.parse_mix("1024:0.3,sum@1024/1:0.3,sum@128:0.4", ap)
    assert mix == [(1024, 0.3), (("sum@1024", 1), 0.3), ("sum@128", 0.4)]
    specs = _specs_of(T, mix)
    assert {T.kernel_of(s) for s in specs} == {(1024, 0), (1024, 1), ("sum@1024", 1), ("sum@128", 0), ("sum@128", 1)}
    assert all(s.get("op") == "sum" for s in specs if isinstance(T.kernel_of(s)[0], str))
    assert not any("op" in s for s in specs if isinstance(T.kernel_of(s)[0], int))
    assert [T.kernel_of(s) for s in T.distinct(specs)] == [(1024, 0), (1024, 1), ("sum@128", 0), ("sum@128", 1),
                                                            ("sum@1024", 1)]
    # the floor: a matmul and a sum of the same size and variant are two kernels
    p1 = [{"size": 1024, "variant": 1, "candidate_all_ms": [1.0], "reference_all_ms": [1.0]},
          {"size": 1024, "variant": 1, "op": "sum", "candidate_all_ms": [0.3], "reference_all_ms": [0.25]}]
    p2 = [{"size": 1024, "variant": 1, "candidate_all_ms": [1.0], "reference_all_ms": [1.0]},
          {"size": 1024, "variant": 1, "op": "sum", "candidate_all_ms": [0.3], "reference_all_ms": [0.25]}]
    floor = T.reference_passes([p1, p2], 2.0)
    assert floor["stable"] == {(1024, 1, "candidate"): 1.0, (1024, 1, "reference"): 1.0,
                               ("sum@1024", 1, "candidate"): 0.3, ("sum@1024", 1, "reference"): 0.25}, floor
    for bad in ("mul@1024:0.2", "sum@0:0.2", "sum@1024:0.2,sum@1024/1:0.2", "sum@x:0.2", "@1024:0.2", "sum@3000:0.2"):
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--mix", bad,
                            "--out", str(tmp_path / "o.json")], capture_output=True, text=True)
        assert p.returncode == 2 and "--mix: [OP@]SIZE[/VARIANT]:WEIGHT" in p.stderr, (bad, p.stderr)
    assert not (tmp_path / "o.json").exists()
    timing = argparse.ArgumentParser()
    T.add_timing_options(timing, "command")
    assert "--fresh-inputs" in T.timing_args(timing, timing.parse_args(["--fresh-inputs"]))   # to every command
    assert "--fresh-inputs" not in T.timing_args(timing, timing.parse_args([]))
    for script, mix in (("freeze_policy.py", "2048:0.5,sum@128/0:0.5"), ("ray_fleet.py", "8192/1:1")):
        p = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--mix", mix, "--fresh-inputs",
                            "--out", str(tmp_path / "o.json")], capture_output=True, text=True)
        assert p.returncode == 2 and "--fresh-inputs: the mix's kernels must all be sum@SIZE" in p.stderr, p.stderr
    # bench/candidate.py refuses what it cannot run before it imports torch (one line, exit status 2)
    for extra, says in ((["--op", "sum", "--size", "3000"], "1-2048 or a multiple of 2048, not 3000"),
                        (["--op", "sum", "--size", "0"], "1-2048 or a multiple of 2048, not 0"),
                        (["--op", "sum", "--size", "1024", "--probe"], "are for --op matmul"),
                        (["--op", "sum", "--size", "1024", "--fixed-out"], "are for --op matmul"),
                        (["--holder-gib", "-1"], "--holder-gib: GiB, 0 or more, not -1.0"),
                        (["--scatter-gib", "-2"], "--scatter-gib: GiB, 0 or more, not -2.0"),
                        (["--scatter-gib", "nan"], "--scatter-gib: GiB, 0 or more, not nan"),
                        (["--compiler", "cuda"], "--compiler cuda: for --op sum"),
                        (["--fresh-inputs"], "--fresh-inputs: for --op sum"),
                        (["--compiler", "nvcc"], "invalid choice: 'nvcc'")):
        argv = ["--variant", "0", "--nonce", "1", "--size", "1"] + extra     # the last --size wins
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "candidate.py")] + argv, capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 2 and says in p.stderr.strip().splitlines()[-1], (extra, p.stderr)


def test_the_goal_interval_tells_a_miss_beyond_noise_from_one_within_it():
    """excess_interval: a 90% bootstrap interval of how far a bucket's p95 is past the floor + 0.25. Judged
    timings drawn like the floor's straddle the goal; ones shifted by 2% lie past it at both ends; a handful
    of timings gives a wide interval; the same input gives the same interval; judge() reports it per bucket."""
    import random

    sys.path.insert(0, str(ROOT / "bench"))
    import throughput as T

    rng = random.Random(3)
    floor = [abs(rng.gauss(0, 1)) for _ in range(200)]
    alike = [[abs(rng.gauss(0, 1)), abs(rng.gauss(0, 1))] for _ in range(200)]
    shifted = [[abs(rng.gauss(2, 1)), abs(rng.gauss(2, 1))] for _ in range(200)]
    lo, hi = T.excess_interval(alike, floor)
    assert lo < 0 and hi < 1.0                                 # not past the goal beyond noise
    lo2, hi2 = T.excess_interval(shifted, floor)
    assert lo2 > 0.5
    few = T.excess_interval(alike[:8], floor[:8])
    assert few[1] - few[0] > hi - lo
    assert T.excess_interval(alike, floor) == [lo, hi]

    p1 = [{"size": 8192, "variant": 0, "candidate_all_ms": [2.0, 2.02], "reference_all_ms": [1.0, 1.0]}]
    p2 = [{"size": 8192, "variant": 0, "candidate_all_ms": [2.01, 2.0], "reference_all_ms": [1.0, 1.01]}]
    ref = T.reference_passes([p1, p2], stable_pct=2.0)
    rows = [{"size": 8192, "variant": 0, "candidate_all_ms": [2.2] * 6, "reference_all_ms": [1.0] * 6}]
    j = T.judge(rows, ref)
    assert j["excess_ci_points"]["1-10ms"][0] > 5           # 10% slow against a floor under 1%
    assert j["excess_ci_points"]["<0.1ms"] is None           # nothing judged there


def test_region_clocks_summarise_the_attested_regions():
    sys.path.insert(0, str(ROOT / "bench"))
    import throughput as T

    rows = [{"region_clocks_mhz": [1980, 1440, 1440, None]}, {"region_clocks_mhz": [1530] * 8}, {"regions": 0}]
    assert T.region_clocks(rows) == {"median": 1530, "p10": 1440, "regions": 11}
    assert T.region_clocks([{"region_clocks_mhz": [None]}, {}]) is None     # none attested, or an older result


def test_ray_fleet_summary_has_the_regions_clocks():
    """bench/ray_fleet.py's summary of a krex mode: its regions' lowest SM clocks (from their attestation),
    as freeze_policy reports them; none for a mode outside krex."""
    sys.path.insert(0, str(ROOT / "bench"))
    import ray_fleet

    row = {"size": 2048, "variant": 0, "candidate_ms": 0.03, "reference_ms": 0.03, "wall_s": 5.0}
    runs = [{"mode": "pergpu", "agents": 1, "num_gpus": 1, "commands": 1, "failed": 0, "wall_s": 5.0,
             "commands_per_min": 12.0, "rows": [dict(row)]},
            {"mode": "krex", "agents": 8, "num_gpus": 0.125, "commands": 2, "failed": 0, "wall_s": 5.0,
             "commands_per_min": 24.0, "counters": {},
             "rows": [dict(row, regions=[{"exclusive": True, "clean": True, "sm_clock_mhz": [1440, 1980]},
                                         {"exclusive": True, "clean": True, "sm_clock_mhz": None}]),
                      dict(row, regions=[{"exclusive": True, "clean": True, "sm_clock_mhz": [1980, 1980]}])]}]
    pergpu, krex = ray_fleet.analyse(runs)
    assert krex["region_clock_mhz"] == {"median": 1980, "p10": 1440, "regions": 2}
    assert krex["regions"] == 3 and "region_clock_mhz" not in pergpu


def test_a_compacted_ray_fleet_result_gives_the_same_analyses(tmp_path):
    """bench/reduce_result.py cuts each region of a bench/ray_fleet.py result to what the analyses read (ids, pids
    and timestamps go, hold_ms stays), and `ray_fleet.py --reanalyse` recomputes summary and fidelity from it."""
    sys.path.insert(0, str(ROOT / "bench"))
    import ray_fleet

    def region(clock, clean=True):
        return {"name": "triton.do_bench", "gpu": [0], "requested_ns": 1, "granted_ns": 2_000_000,
                "ended_ns": 9_500_000, "pid": 7, "pids": [7], "region_id": 3, "exclusive": True, "clean": clean,
                "taints": [] if clean else ["lifecycle"], "sm_clock_mhz": [clock, 1980], "host_bound": False}

    def row(ms, regions=None):
        r = {"size": 8192, "variant": 0, "candidate_ms": ms, "reference_ms": ms / 2, "candidate_all_ms": [ms, ms],
             "reference_all_ms": [ms / 2, ms / 2], "wall_s": 5.0, "exit": 0}
        return dict(r, regions=regions) if regions is not None else r

    ref = {"mode": "pergpukrex", "agents": 8, "num_gpus": 1.0, "commands": 1, "failed": 0, "wall_s": 5.0,
           "commands_per_min": 12.0, "counters": {}}
    runs = [dict(ref, rows=[row(2.0, [region(1950)])]),
            {"mode": "krex", "agents": 8, "num_gpus": 0.125, "commands": 2, "failed": 0, "wall_s": 5.0,
             "commands_per_min": 24.0, "counters": {},
             "rows": [row(2.0 / 3 * 3.03, [region(1650)]), row(2.2, [region(1500, clean=False)])]},
            dict(ref, rows=[row(2.001, [region(1965)])])]
    whole = tmp_path / "whole.json"
    whole.write_text(json.dumps({"plan": [r["mode"] for r in runs], "specs": [], "runs": runs,
                                 "summary": ray_fleet.analyse(runs),
                                 "fidelity": ray_fleet.fidelity(runs, reference="pergpukrex")}, indent=1))
    small = tmp_path / "small.json"
    small.write_text(whole.read_text())
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "reduce_result.py"), str(small)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(small.read_text())
    assert "compacted" in data and small.stat().st_size < whole.stat().st_size
    kept = data["runs"][1]["rows"][1]["regions"][0]
    assert kept == {"exclusive": True, "clean": False, "taints": ["lifecycle"], "sm_clock_mhz": [1500, 1980],
                    "host_bound": False, "granted_ms": 0.0, "hold_ms": 7.5}
    again = subprocess.run([sys.executable, str(ROOT / "bench" / "ray_fleet.py"), "--reanalyse", str(small),
                            "--reference", "pergpukrex"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    out = json.loads(again.stdout)
    def flat(x, key=""):          # the compacted file's floats have 7 significant digits
        if isinstance(x, dict):
            return {k: v for n, y in x.items() for k, v in flat(y, f"{key}/{n}").items()}
        if isinstance(x, list):
            return {k: v for n, y in enumerate(x) for k, v in flat(y, f"{key}/{n}").items()}
        return {key: x}

    expected = flat(json.loads(whole.read_text())["fidelity"])
    assert flat(out["fidelity"]) == {k: pytest.approx(v, rel=1e-5) if isinstance(v, float) else v
                                     for k, v in expected.items()}
    assert out["fidelity"]["modes"]["krex#1"]["kernels"]["1-10ms"] == 4     # the tainted evaluation left out
    assert [s["region_clock_mhz"] for s in out["summary"]] == [s["region_clock_mhz"] for s in data["summary"]]
    # --drop-rows: the rows go, each run's totals, the summary and the fidelity stay; only with the commit
    rowless = tmp_path / "rowless.json"
    rowless.write_text(whole.read_text())
    refused = subprocess.run([sys.executable, str(ROOT / "bench" / "reduce_result.py"), "--drop-rows", str(rowless)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "--commit" in refused.stderr and rowless.read_text() == whole.read_text()
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "reduce_result.py"), "--drop-rows", "--commit",
                           "abc", str(rowless)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    data = json.loads(rowless.read_text())
    assert [sorted(r) for r in data["runs"]] == [sorted(k for k in r if k != "rows") for r in runs]
    assert data["summary"] == json.loads(whole.read_text())["summary"]
    assert data["reduced_from"] == {"commit": "abc", "path": str(rowless), "dropped": ["runs[].rows"],
                                    "whole": f"git show abc:{rowless}"}
    # a kernelbench_mix result still needs the commit that holds the whole file
    kb = tmp_path / "kb.json"
    kb.write_text(json.dumps({"raw": [1], "analysis": {}}))
    refused = subprocess.run([sys.executable, str(ROOT / "bench" / "reduce_result.py"), str(kb)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode != 0 and "--commit" in refused.stderr and json.loads(kb.read_text())["raw"] == [1]
    # an overlap_proxy result loses its per-variant dump, told by its cases_spec (a "variants" key alone stays)
    ov = tmp_path / "ov.json"
    ov.write_text(json.dumps({"cases": {"4096": {"rows": []}}, "cases_spec": {}, "variants": [{"label": "off"}]}))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "reduce_result.py"), "--commit", "abc", str(ov)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    reduced = json.loads(ov.read_text())
    assert "variants" not in reduced and reduced["cases"] == {"4096": {"rows": []}}
    assert reduced["reduced_from"]["dropped"] == ["variants"]
    keep = tmp_path / "keep.json"
    keep.write_text(json.dumps({"variants": {"serial": 1.0}}))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "reduce_result.py"), str(keep)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and json.loads(keep.read_text()) == {"variants": {"serial": 1.0}}, done.stderr
    # --round: any result's floats rounded to 7 significant digits, nothing dropped (not even "rows")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": [], "p95": [1.0000000123, 15.519776344299316], "n": 3}, indent=1))
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "reduce_result.py"), "--round", str(other)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(other.read_text()) == {"rows": [], "p95": [1.0, 15.51978], "n": 3}


def test_per_kernel_names_the_kernel_that_makes_a_tail():
    """throughput.per_kernel: per stable kernel of the clean rows, its reference, how many timings, their median,
    lowest and highest inflation, and how many lie more than 5% off; unstable kernels and unclean rows are not
    there. freeze_policy's table prints it per mode."""
    sys.path.insert(0, str(ROOT / "bench"))
    import throughput as T

    stable = {(2048, 1, "candidate"): 0.030, (2048, 1, "reference"): 0.028}     # ms
    rows = [{"size": 2048, "variant": 1, "candidate_all_ms": [0.030, 0.075], "reference_all_ms": [0.028, 0.0281],
             "candidate_host_bound": [False, True], "ok": True},
            {"size": 2048, "variant": 1, "candidate_all_ms": [0.0303, 0.0297], "reference_all_ms": [0.0279, 0.028],
             "ok": True},
            {"size": 2048, "variant": 1, "candidate_all_ms": [9.0], "reference_all_ms": [9.0], "ok": False},
            {"size": 4096, "variant": 0, "candidate_all_ms": [0.2], "reference_all_ms": [0.2], "ok": True}]
    got = T.per_kernel(rows, stable, clean=lambda r: r["ok"])
    assert list(got) == ["2048/1/reference", "2048/1/candidate"]             # by reference time; 4096 unstable
    c = got["2048/1/candidate"]
    assert c["n"] == 4 and c["far"] == 1 and c["max_pct"] == pytest.approx(150.0)
    assert c["min_pct"] == pytest.approx(-1.0) and c["median_pct"] == pytest.approx(0.5)
    assert got["2048/1/reference"]["far"] == 0 and got["2048/1/reference"]["n"] == 4
    assert c["host_bound"] == 1 and got["2048/1/reference"]["host_bound"] == 0
    # two commands: the spread within one (0.030 and 0.075: 150 points) and of their medians (75 and 0)
    assert c["commands"] == 2 and c["within_pct"] == pytest.approx(150.0) and c["between_pct"] == pytest.approx(75.0)
    r = got["2048/1/reference"]   # medians +0.18 and -0.18 (0.028, 0.0281 / 0.0279, 0.028): within 0.36, across 0.36
    assert r["within_pct"] == pytest.approx(0.357, abs=0.01) and r["between_pct"] == pytest.approx(0.357, abs=0.01)
    one = T.per_kernel(rows[:1], stable)                                     # one command: no spreads
    assert "within_pct" not in one["2048/1/candidate"]
    # the timing whose region was host-bound (KREX_HOST_BOUND) left out on request, and only then
    kept = [t for key, _, t in T.stable_timings(rows, stable, lambda r: r["ok"], skip_host_bound=True)
            if key == (2048, 1, "candidate")]
    assert sorted(kept) == [0.0297, 0.030, 0.0303]
    assert len([1 for key, _, _ in T.stable_timings(rows, stable, lambda r: r["ok"]) if key[2] == "candidate"]) == 4


def test_resident_neighbours_summarises_a_run_cut_short_from_its_log(tmp_path):
    """A device call's time limit can stop bench/resident_neighbours.py before it writes its summary; the command
    lines it printed are enough: --from-log makes the summary (per condition, against alone) from them."""
    def row(rnd, cond, cand, ref):
        return json.dumps({"round": rnd, "condition": cond, "wall_s": 1.0, "candidate_ms": cand, "reference_ms": ref,
                           "ratio": [c / r for c, r in zip(cand, ref)], "kernel_hash": "h"})
    log = tmp_path / "resident.log"
    log.write_text("\n".join([row(0, "alone", [10.0, 10.2], [8.0, 8.0]), "krex: command killed by SIGTERM",
                              row(0, "gpu", [9.8, 9.8], [8.0, 8.0]), row(1, "alone", [10.1], [8.0]),
                              row(1, "gpu", [9.0], [8.0])[:30]]) + "\n")    # the last line cut short
    out = tmp_path / "r.json"
    script = str(ROOT / "bench" / "resident_neighbours.py")
    p = subprocess.run([sys.executable, script, "--from-log", str(log), "--out", str(out)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "1 command line(s) cut short" in p.stderr, p.stderr
    data = json.loads(out.read_text())
    assert data["args"] is None and data["lines_left_out"] == 1 and not (tmp_path / "r.json.tmp").exists()
    s = data["summary"]
    assert s["alone"]["timings"] == 3 and s["alone"]["commands"] == 2 and s["alone"]["candidate_ms_median"] == 10.1
    assert s["gpu"]["candidate_vs_alone_pct"] == round(100 * (9.8 / 10.1 - 1), 3)
    assert s["gpu"]["ratio_vs_alone_pct"] == round(100 * ((9.8 / 8.0) / (10.1 / 8.0) - 1), 3)
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    p = subprocess.run([sys.executable, script, "--from-log", str(empty), "--out", str(tmp_path / "x.json")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "holds no command lines" in p.stderr and not (tmp_path / "x.json").exists()


def test_a_compacted_freeze_policy_result_gives_the_same_table(tmp_path):
    """bench/reduce_result.py drops what a freeze_policy.py row repeats (its first timings, region count, timer and
    nonce) only where the row or run says it again: filling them back gives every row as it was, a row that says
    something else keeps it, and `freeze_policy.py --reanalyse` gives the same analysis and table from the
    compacted file as from the whole one (run 15, a committed result)."""
    src = ROOT / "bench" / "results" / "freeze-policy-h200-run15.json"
    whole, small = tmp_path / "whole.json", tmp_path / "small.json"
    data = json.loads(src.read_text())
    if "compacted" in data:       # the committed file is compacted: rebuild what the compaction dropped
        for run in data["runs"]:
            for r in run["rows"]:
                r.setdefault("candidate_ms", r["candidate_all_ms"][0])
                r.setdefault("reference_ms", r["reference_all_ms"][0])
                r.setdefault("regions", len(r["regions_clean"]))
                r.setdefault("timer", run.get("timer", "events"))
                r.setdefault("nonce", run["nonce_base"] + r["idx"])
            run.pop("nonce_base")
            run.pop("timer", None)
        del data["compacted"]
    odd = data["runs"][1]["rows"]
    odd[0]["nonce"] += 1                    # off the run's pattern: every nonce of that run stays
    odd[1]["candidate_ms"] += 0.5           # not the first of its timings: kept
    odd[2]["regions"] += 1                  # not the count of its region records: kept
    odd[3]["timer"] = "graph"               # not the run's timer: kept
    whole.write_text(json.dumps(data, separators=(",", ":")))
    small.write_text(whole.read_text())
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "reduce_result.py"), str(small)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    c = json.loads(small.read_text())
    assert "compacted" in c and small.stat().st_size < 0.95 * whole.stat().st_size
    assert not {"candidate_ms", "reference_ms", "regions", "timer", "nonce"} & set(c["runs"][0]["rows"][0])
    assert c["runs"][0]["nonce_base"] == 1000 and "nonce_base" not in c["runs"][1]
    assert all(r["timer"] == "events" for r in c["runs"])             # kept in the run: argv may be rewritten
    kept = c["runs"][1]["rows"]
    assert all("nonce" in r for r in kept) and "candidate_ms" in kept[1] and "regions" in kept[2]
    assert kept[3]["timer"] == "graph" and "timer" not in kept[4]
    for run, orig in zip(c["runs"], data["runs"]):                     # filled back: every row as it was
        for r, o in zip(run["rows"], orig["rows"]):
            full = {"candidate_ms": r["candidate_all_ms"][0], "reference_ms": r["reference_all_ms"][0],
                    "regions": len(r["regions_clean"]), "timer": run["timer"],
                    **({"nonce": run["nonce_base"] + r["idx"]} if "nonce_base" in run else {}), **r}
            assert full == o
    out = {}
    for name, f in (("whole", whole), ("small", small)):
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--reanalyse", str(f),
                               "--reference", "solo-busy", "--out", str(tmp_path / f"{name}.out.json")],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        res = json.loads((tmp_path / f"{name}.out.json").read_text())
        out[name] = ({k: v for k, v in res.items() if k not in ("runs", "argv", "reanalysed_argv")}, done.stdout)
    assert out["whole"] == out["small"]
    assert "| busy | 8 | 66 |" in out["small"][1]

def _holder_source() -> str:
    """bench/candidate.py's HOLDER script, as --holder-gib runs it in a child process."""
    import ast

    tree = ast.parse((ROOT / "bench" / "candidate.py").read_text())
    return next(node.value.value for node in tree.body if isinstance(node, ast.Assign)
                and getattr(node.targets[0], "id", None) == "HOLDER")


def test_the_holder_takes_a_seeded_pattern_and_holds_it_until_its_stdin_closes():
    """bench/candidate.py --holder-gib's child process on the fake driver, through cuda-python as on the GPU: it
    takes G GiB in pieces drawn with the seed, frees a random half, says so on one line and holds the rest until
    its stdin closes; the same seed gives the same pattern, another seed another."""
    pytest.importorskip("cuda.bindings", reason="cuda-python is not installed (pip install 'krex[cuda]')")
    env = dict(os.environ, LD_LIBRARY_PATH=str(ROOT / "build" / "fakes"))
    env.pop("LD_PRELOAD", None)
    lines = []
    for seed in (7, 7, 8):
        p = subprocess.Popen([sys.executable, "-c", _holder_source(), "1", str(seed)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            word, held, freed = p.stdout.readline().split()
            assert word == "ready" and int(held) > 0 and int(freed) > 0, (word, held, freed)
            assert 1024 <= int(held) + int(freed) < 1024 + 512          # 1 GiB in pieces of at most 512 MiB
            time.sleep(0.3)
            assert p.poll() is None, p.stderr.read()                   # holding
        finally:
            p.stdin.close()
        assert p.wait(timeout=30) == 0, p.stderr.read()
        lines.append((int(held), int(freed)))
    assert lines[0] == lines[1] != lines[2], lines


def test_a_candidate_never_leaves_its_holder_behind(tmp_path):
    """A holder that cannot start is one line with its reason and a failed candidate before torch is imported
    (without cuda-python: refused at once, exit 2); a candidate that fails after its holder started (here: no
    triton, or no GPU for torch) leaves no holder running, alone or run by bench/ray_fleet.py's evaluate (runpy,
    in a Ray worker). All on the fake driver, whatever driver the machine has."""
    psutil = pytest.importorskip("psutil")
    nonce = 424000000 + os.getpid() % 100000 * 10     # this run's own: another session's holder is not counted
    argv = [sys.executable, str(ROOT / "bench" / "candidate.py"), "--op", "sum", "--size", "128", "--variant", "0",
            "--holder-gib", "1"]
    fakes = dict({k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
                 LD_LIBRARY_PATH=str(ROOT / "build" / "fakes"))
    p = subprocess.run(argv + ["--nonce", str(nonce)], capture_output=True, text=True, timeout=120,
                       env=dict(fakes, KREX_FAKE_GPUS="0"))
    try:
        have = bool(importlib.util.find_spec("cuda.bindings") or importlib.util.find_spec("cuda.cuda"))
    except ImportError:
        have = False
    if not have:
        assert p.returncode == 2 and "needs cuda-python" in p.stderr.strip().splitlines()[-1], p.stderr
        return                                                          # the rest needs cuda-python
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 1 and last.startswith("candidate: the --holder-gib process failed (exit 1: failed "), \
        p.stderr[-2000:]                                                # no GPU: the holder's reason, one line

    def holders(n):
        return [q.pid for q in psutil.process_iter(["cmdline"]) if str(n) in (q.info["cmdline"] or [])]

    p = subprocess.run(argv + ["--nonce", str(nonce + 1)], capture_output=True, text=True, timeout=120, env=fakes)
    assert p.returncode != 0, p.stdout[-2000:]
    deadline = time.monotonic() + 10
    while holders(nonce + 1) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not holders(nonce + 1)
    script = (f"import json, sys, psutil; sys.path[:0] = [{str(ROOT / 'bench')!r}]; import ray_fleet\n"
              f"row = ray_fleet.evaluate({str(ROOT / 'bench' / 'candidate.py')!r}, "
              f"{{'size': 128, 'variant': 0, 'op': 'sum'}}, {nonce + 2}, ['--holder-gib', '1'])\n"
              "print(json.dumps({'exit': row['exit'], 'children': len(psutil.Process().children())}))")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=fakes)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["exit"] != 0 and out["children"] == 0, out


def test_startup_bench_times_each_mode_and_says_which_declarations_it_had(tmp_path):
    """bench/startup.py: plain, krex and krex+hooks alternate against a controller of its own; each mode's wall
    and time to the command's first line, the krex modes' additions over plain, and the declarations compiled
    (build/krex_ffi.py, which `make shim` wrote)."""
    out = tmp_path / "startup.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "startup.py"), "--repeats", "3", "--out", str(out)],
                       env=dict(bench_env(tmp_path), KREX_NVML=str(ROOT / "build" / "fakes" / "libnvidia-ml.so.1")),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["declarations"] == "compiled" and data["repeats"] == 3
    assert set(data["modes"]) == {"plain", "krex", "krex+hooks"}
    for m, v in data["modes"].items():
        assert v["wall_ms"]["n"] == v["before_ms"]["n"] == 3
        assert 0 < v["before_ms"]["median"] < v["wall_ms"]["median"], (m, v)
    assert all(data["modes"][m]["added_before_ms"] > 0 for m in ("krex", "krex+hooks")), data


def test_freeze_policy_reanalysis_splits_a_cut_plans_one_reference_pass(tmp_path):
    """A plan cut before its last isolated pass has no floor (one pass: no kernel is stable, nothing is judged).
    `--reanalyse --split-reference` makes the one pass two, by process (each kernel's commands in turn), and the
    table says so; the split result reanalyses to the same table without the option, and a result with two passes
    is refused."""
    def row(size, ms, clean=None):
        r = {"op": "sum", "size": size, "variant": 0, "exit": 0, "candidate_all_ms": ms, "reference_all_ms": ms}
        return {**r, **({"regions_clean": [clean]} if clean is not None else {})}

    ref_rows = [row(128, [0.05, 0.0501]), row(128, [0.0502, 0.0501]), row(128, [0.0501, 0.05]),
                row(128, [0.0502, 0.0502]), row(8192, [2.0, 2.001]), row(8192, [2.002, 2.001])]
    busy_rows = [row(128, [0.0503, 0.0501], True), row(8192, [2.003, 2.0], True)]
    run = lambda mode, agents, rows: {"mode": mode, "agents": agents, "wall_s": 10.0, "commands": len(rows),  # noqa
                                      "failed": 0, "commands_per_min": 6.0 * len(rows), "rows": rows,
                                      "started_unix": 1.0, "ended_unix": 11.0}
    cut = tmp_path / "cut.json"
    cut.write_text(json.dumps({"partial": True, "argv": ["freeze_policy.py", "--reference", "solo-busy"],
                               "runs": [run("krexsolobusy", 1, ref_rows), run("krexbusy", 16, busy_rows)]}))
    fp = [sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--reanalyse"]
    plain = subprocess.run(fp + [str(cut), "--out", str(tmp_path / "plain.json")], capture_output=True, text=True,
                           timeout=60)
    assert plain.returncode == 0 and json.loads((tmp_path / "plain.json").read_text())["floor_timings"]["<0.1ms"] == 0
    split = subprocess.run(fp + [str(cut), "--split-reference", "--out", str(tmp_path / "split.json")],
                           capture_output=True, text=True, timeout=60)
    assert split.returncode == 0, split.stderr
    made = json.loads((tmp_path / "split.json").read_text())
    passes = [r for r in made["runs"] if r["mode"] == "krexsolobusy"]
    assert made["reference_split"] and [(r["commands"], r["split_from_one_pass"]) for r in passes] == [(3, 1), (3, 2)]
    assert [[x["candidate_all_ms"] for x in p["rows"]] for p in passes] == [
        [[0.05, 0.0501], [0.0501, 0.05], [2.0, 2.001]], [[0.0502, 0.0501], [0.0502, 0.0502], [2.002, 2.001]]]
    assert made["floor_timings"]["<0.1ms"] == 16 and made["rows"][0]["kernels"]["<0.1ms"] > 0
    assert "one pass split by process" in split.stdout
    again = subprocess.run(fp + [str(tmp_path / "split.json"), "--out", str(tmp_path / "again.json")],
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and again.stdout == split.stdout
    twice = subprocess.run(fp + [str(tmp_path / "split.json"), "--split-reference", "--out", str(tmp_path / "x.json")],
                           capture_output=True, text=True, timeout=60)
    assert twice.returncode == 2 and "2 passes of krexsolobusy, not one" in twice.stderr


def test_freeze_policy_deadline_foresees_a_gpu_bound_modes_tail():
    """--deadline shrinks a shared mode's budget by the time its commands in flight take after it: one command's
    wall time alone, or where the GPU is the limit agents x its regions' hold (run 29 ran 77 s past a 240-s budget
    at 16 agents, which the fixed 20 s allowed for did not foresee, and the last reference pass was cut)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import freeze_policy as fp
    finally:
        sys.path.remove(str(ROOT / "bench"))
    ref = [{"rows": [{"exit": 0, "wall_s": 10.0, "region_held_s": 3.0}, {"exit": 0, "wall_s": 12.0, "region_held_s": 3.2},
                     {"exit": 1, "wall_s": 500.0, "region_held_s": 90.0}]}]
    assert fp.expected_tail(ref, 16) == pytest.approx(16 * 3.1 * fp.HELD_SHARED)
    assert fp.expected_tail(ref, 1) == pytest.approx(max(fp.TAIL_S, 11.0))
    assert fp.expected_tail([{"rows": [{"exit": 0, "wall_s": 40.0, "region_held_s": 0.5}]}], 4) == 40.0
    assert fp.expected_tail([], 16) == fp.TAIL_S


def freeze_policy_standin(tmp_path, *args: str, timeout: int = 200) -> subprocess.CompletedProcess:
    """bench/freeze_policy.py on the candidate stand-in with --reference none (throughput only), its logs and its
    result (tmp_path/fp.json) in tmp_path."""
    return subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--candidate",
                           str(ROOT / "tests" / "snippets" / "candidate_standin.py"), "--repeat", "1",
                           "--reference", "none", *args, "--logs", str(tmp_path), "--out", str(tmp_path / "fp.json")],
                          env=bench_env(tmp_path), capture_output=True, text=True, timeout=timeout)


def test_freeze_policy_reference_none_is_throughput_only(tmp_path):
    """--reference none: no reference passes (commands too long to run alone twice, a CUDA build each), the shared
    modes only; the rows give throughput against naive sharing and no fidelity, no policy is called best. none
    with another reference is one line and exit status 2."""
    out = tmp_path / "fp.json"
    p = freeze_policy_standin(tmp_path, "--scales", "2", "--budget", "4", "--specs", "2", "--policies", "busy+prewait")
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [r["mode"] for r in data["runs"]] == ["naive", "krexprewait"]
    rows = {r["policy"]: r for r in data["rows"]}
    assert set(rows) == {"naive", "busy+prewait"} and rows["naive"]["vs_naive"] == 1.0
    assert rows["busy+prewait"]["commands"] >= 2 and rows["busy+prewait"]["vs_naive"] > 0
    assert not rows["busy+prewait"]["fidelity_goal"] and data["best_policy"] is None
    assert "| busy+prewait | 2 |" in p.stdout and "no reference passes (--reference none)" in p.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--reference", "none,solo",
                          "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "none stands alone" in bad.stderr.strip().splitlines()[-1], bad.stderr
    assert not (tmp_path / "x.json").exists()


def test_freeze_policy_stagger_starts_every_modes_agents_alike_and_out_of_step(tmp_path):
    """--stagger S: each shared mode's agent takes its first command after a delay of its own in [0, S], the same
    delays in every mode (the run lists them); a value outside [0, budget) is one line and exit status 2."""
    out = tmp_path / "fp.json"
    p = freeze_policy_standin(tmp_path, "--scales", "3", "--budget", "6", "--specs", "3", "--policies", "busy+prewait",
                              "--stagger", "3")
    assert p.returncode == 0, p.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    delays = [r["stagger_s"] for r in runs]
    assert len(runs) == 2 and delays[0] == delays[1] and len(delays[0]) == 3, delays
    assert all(0 <= d <= 3 for d in delays[0]) and len(set(delays[0])) == 3, delays
    for r in runs:      # an agent's first command starts after its delay
        for aid, d in enumerate(delays[0]):
            starts = [row["start_s"] for row in r["rows"] if row["agent"] == aid]
            assert not starts or min(starts) >= d, (r["mode"], aid, d, starts)
    for bad in ("-1", "6"):
        q = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--budget", "6", "--stagger", bad,
                            "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60)
        assert q.returncode == 2 and "--stagger:" in q.stderr.strip().splitlines()[-1], q.stderr
    assert not (tmp_path / "x.json").exists()


def test_freeze_policy_stagger_under_a_deadline_keeps_every_agent(tmp_path):
    """--stagger with --deadline (the device script always passes it): a budget the deadline cut below an agent's
    delay left that agent no time to take work (it woke past the budget), so a mode of N agents ran fewer, and
    modes whose budgets the deadline cut apart lost different shares of their agents' time to the stagger. Each
    agent takes work for the mode's budget from its own start: every agent runs in every mode."""
    out = tmp_path / "fp.json"
    p = freeze_policy_standin(tmp_path, "--scales", "3", "--budget", "20", "--specs", "400", "--policies",
                              "busy+prewait", "--stagger", "10", "--deadline", "30")
    assert p.returncode == 0, p.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [r["mode"] for r in runs] == ["naive", "krexprewait"]
    for r in runs:
        assert r["budget_s"] < max(r["stagger_s"]), (r["budget_s"], r["stagger_s"])   # the case: a cut budget
        ran = {row["agent"] for row in r["rows"]}
        assert ran == {0, 1, 2}, (r["mode"], r["budget_s"], r["stagger_s"], sorted(ran))


def test_freeze_policy_prewait_ms_sets_busy_prewaits_bound(tmp_path):
    """--prewait-ms is what busy+prewait's controller gets as --lifecycle-prewait-ms (the other modes keep
    theirs); 0 or less is one line and exit status 2 (that mode would be busy under another name)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import throughput as T
    finally:
        sys.path.remove(str(ROOT / "bench"))
    before = {m: list(a) for m, a in T.FREEZE_ARGS.items()}
    try:
        T.set_prewait_ms(250)
        prewaiting = ("krexprewait", "krexwarmprewait")    # the second in the warm workers
        for mode in prewaiting:
            assert T.FREEZE_ARGS[mode] == ["--freeze-policy", "busy", "--lifecycle-prewait-ms", "250"], mode
        assert "krexwarmprewait" in T.WARM_MODES and "krexprewait" not in T.WARM_MODES
        assert {m: a for m, a in T.FREEZE_ARGS.items() if m not in prewaiting} == \
            {m: a for m, a in before.items() if m not in prewaiting}
    finally:
        T.FREEZE_ARGS.clear()
        T.FREEZE_ARGS.update(before)
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--prewait-ms", "0",
                        "--policies", "busy+prewait", "--out", str(tmp_path / "x.json")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--prewait-ms: more than 0" in p.stderr.strip().splitlines()[-1], p.stderr
    assert not (tmp_path / "x.json").exists()


def test_levels_wider_under_sharing_are_told_from_a_shift_and_from_chance():
    """Each command's median inflation of a kernel it timed more than once is its level (where its inputs
    landed, its history); freeze_policy.py compares the spread of those levels in each mode with the reference
    processes' (T.wider_levels: levels of as many timings on both sides, a permutation test of the ratio of
    standard deviations, each side centred on its own median, Holm-adjusted over a mode's kernels), in the
    result's "levels" and a line under the table."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import freeze_policy as fp
        import throughput as T
    finally:
        sys.path.remove(str(ROOT / "bench"))
    import random

    rng = random.Random(3)

    def command(level, n=3, size=1024, clean=True):
        """A command of sum@SIZE/0 whose candidate sits at LEVEL percent above 1 ms, timed n times."""
        ms = [1.0 * (1 + (level + rng.gauss(0, 0.05)) / 100) for _ in range(n)]
        return {"size": size, "variant": 0, "op": "sum", "candidate_all_ms": ms, "reference_all_ms": [2.0] * n,
                "candidate_ms": ms[0], "reference_ms": 2.0, "regions_clean": [clean] * (2 * n), "exit": 0}

    def lv(levels, n=2):
        return [[x] * n for x in levels]       # each command's timings all at its level

    alone = [rng.gauss(0, 0.3) for _ in range(20)]
    wide = [rng.gauss(0, 1.0) for _ in range(30)]
    same = [rng.gauss(0, 0.3) for _ in range(30)]
    shifted = [x + 2.0 for x in same]
    stable = {("sum@1024", 0, "candidate"): 1.0}
    key = ("sum@1024", 0, "candidate")
    rows = [command(x) for x in wide] + [command(5.0, n=1), command(9.0, clean=False)]
    clean = lambda row: all(row["regions_clean"])   # noqa: E731
    levels = T.command_levels(rows, stable, clean)   # one timing: no level; a row clean() refuses: none either
    assert len(levels[key]) == 30 and all(len(x) == 3 for x in levels[key])
    assert statistics.median(levels[key][0]) == pytest.approx(wide[0], abs=0.2)
    assert len(T.command_levels(rows, stable)[key]) == 31
    w = T.wider_levels(lv(wide), lv(alone))
    assert w["p_wider"] < 0.01 and w["sd_pct"] > 2 * w["reference_sd_pct"] and w["commands"] == 30, w
    assert T.wider_levels(lv(alone), lv(wide))["p_wider"] > 0.5                      # one-sided: narrower is not
    assert T.wider_levels(lv(same), lv(alone))["p_wider"] > 0.05
    assert T.wider_levels(lv(same), lv(alone)) == T.wider_levels(lv(same), lv(alone))   # seeded
    s = T.wider_levels(lv(shifted), lv(alone))            # a shift is not a wider spread, and is said apart
    assert s["p_wider"] > 0.05 and s["median_shift_pct"] == pytest.approx(2.0, abs=0.3)
    assert T.wider_levels(lv([0.0] * 5), lv([0.0] * 5))["p_wider"] == 1.0          # ties: no spread is no flag
    assert T.wider_levels(lv(wide[:2]), lv(alone)) is None and T.wider_levels(lv(wide), lv(alone[:2])) is None
    # as many timings on both sides: timings past the other side's two move no level
    third = [[x, x, x + 50.0, x + 50.0] for x in same]
    assert T.wider_levels(third, lv(alone)) == T.wider_levels(lv(same), lv(alone))
    assert T.wider_levels(third, lv(alone))["timings_each"] == 2
    nan = T.wider_levels(lv(same + [float("nan")] * 3), lv(alone))                   # non-finite levels left out
    assert nan["commands"] == 30 and nan["p_wider"] == T.wider_levels(lv(same), lv(alone))["p_wider"]
    assert T.holm({"a": 0.01, "b": 0.04, "c": 0.03}) == {"a": 0.03, "c": 0.06, "b": 0.06}
    # through freeze_policy's analysis and table: the reference processes are the reference mode's rows
    runs = [{"mode": "krexsolobusy", "agents": 1, "commands": 10, "failed": 0, "commands_per_min": 1.0,
             "rows": [command(x, n=2) for x in alone[:10]]},
            {"mode": "krexprewait", "agents": 16, "commands": 30, "failed": 0, "commands_per_min": 1.0,
             "rows": [command(x) for x in wide]},
            {"mode": "krexsolobusy", "agents": 1, "commands": 10, "failed": 0, "commands_per_min": 1.0,
             "rows": [command(x, n=2) for x in alone[10:]]}]
    result = fp.analyse(runs, 1000.0, "krexsolobusy")
    row = next(r for r in result["rows"] if r["mode"] == "krexprewait")
    got = row["levels"]["sum@1024/0/candidate"]
    assert got["reference_processes"] == 20 and got["commands"] == 30 and got["p_wider"] < 0.01, got
    assert got["p_wider_holm"] == pytest.approx(min(1.0, len(row["levels"]) * got["p_wider"]), abs=1e-4)
    line = next(ln for ln in fp.table(result).splitlines() if ln.startswith("per-process levels"))
    assert "busy+prewait:16 sum@1024/0/candidate" in line and f"p={got['p_wider']:.3f}" in line, line


def test_freeze_policy_reference_none_keeps_to_the_deadline(tmp_path, monkeypatch):
    """--reference none --deadline (the device script always passes --deadline): with no reference pass first, the
    first shared mode took the whole --budget (the deadline was applied only once a run had been made), and every
    mode's tail was foreseen as the fixed 20 s, though a command here takes 45 s (a CUDA build each): the plan ran
    past its deadline. A stand-in for run_mode and a clock that each mode advances by its budget and one command."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import freeze_policy as fp
    finally:
        sys.path.remove(str(ROOT / "bench"))
    now = [0.0]

    class Ctls:
        def __init__(self, *a, **k): pass
        def scrape(self, mode): return ""
        def stop(self, mode=None): pass

    def run_mode(mode, n, specs, budget, tmp, nonce, ctls):
        now[0] += budget + 45.0                      # the commands in flight at the budget's end finish
        return {"mode": mode, "agents": n, "commands": n, "failed": 0, "commands_per_min": 1.0,
                "wall_s": budget + 45.0, "rows": [{"idx": i, "size": 2048, "variant": 0, "exit": 0, "wall_s": 45.0}
                                                  for i in range(n)]}
    monkeypatch.setattr(fp.T, "run_mode", run_mode)
    monkeypatch.setattr(fp.T, "Controllers", Ctls)
    monkeypatch.setattr(fp, "time", argparse.Namespace(monotonic=lambda: now[0]))   # fp's clock only
    monkeypatch.setattr(sys, "argv", ["freeze_policy.py", "--reference", "none", "--scales", "8", "--policies", "busy",
                                      "--budget", "200", "--deadline", "300", "--out", str(tmp_path / "fp.json")])
    fp.main()
    runs = json.loads((tmp_path / "fp.json").read_text())["runs"]
    assert [r["mode"] for r in runs] == ["naive", "krexbusy"]
    assert runs[0]["budget_s"] < 200 and now[0] <= 300, ([r["budget_s"] for r in runs], now[0])


def test_freeze_policy_reference_none_refuses_a_plan_that_measures_nothing(tmp_path):
    """--reference none with --skip-naive: no reference (no fidelity) and no naive sharing (no throughput against
    it): nothing the plan runs would be measured against anything; and options of the reference passes it does not
    run did nothing, silently. One line and exit status 2 each, nothing written."""
    short = ["--candidate", str(ROOT / "tests" / "snippets" / "candidate_standin.py"), "--scales", "1", "--specs", "1",
             "--budget", "1", "--policies", "busy", "--logs", str(tmp_path)]   # were it accepted: a short plan
    for extra, said in ((["--skip-naive"], "--skip-naive: no reference passes and no naive sharing"),
                        (["--reference-processes", "3", "--neighbour-load", "sum@1024"],
                         "runs no reference passes: --reference-processes, --neighbour-load would do nothing")):
        p = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--reference", "none", *extra,
                            *short, "--out", str(tmp_path / "x.json")], env=bench_env(tmp_path), capture_output=True,
                           text=True, timeout=120)
        assert p.returncode == 2 and said in p.stderr.strip().splitlines()[-1], p.stderr
        assert not (tmp_path / "x.json").exists()


def test_freeze_policy_reference_none_table_claims_no_floor_and_no_verdict(tmp_path):
    """A --reference none result's table: no floor rows (they read "floor (None x2, ...)", all "-") and no goal
    verdict ("not met" on every row, naive's too, where no timing was judged)."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import freeze_policy as fp
    finally:
        sys.path.remove(str(ROOT / "bench"))
    rows = [{"idx": i, "size": 2048, "variant": 0, "exit": 0, "wall_s": 1.0, "candidate_ms": 0.05,
             "reference_ms": 0.05, "regions_clean": [True, True]} for i in range(2)]
    runs = [{"mode": m, "agents": 2, "commands": 2, "failed": 0, "commands_per_min": c, "wall_s": 1.0, "rows": rows}
            for m, c in (("naive", 10.0), ("krexbusy", 8.0))]
    md = fp.table(fp.analyse(runs, 2.0, None))
    assert "None" not in md.split("best:")[0] and "floor" not in md, md
    assert "not met" not in md and "| busy | 2 | 2 | 0.80 |" in md, md


def test_freeze_policy_rounds_alternate_the_modes_and_pool_each_modes_throughput(tmp_path, monkeypatch):
    """--rounds R: each scale's shared modes R times, every other round reversed (naive, busy | busy, naive), so that
    a node's drift over the plan (run 53: the builds took 43 s at its start, 51 s later) weighs on both alike; each
    run is judged against its own round's naive, and each mode's throughput is also given over its rounds together
    (commands over wall time summed). 0 rounds, or an odd number above 1 (ABA: unbalanced), is one line
    and exit status 2."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import freeze_policy as fp
    finally:
        sys.path.remove(str(ROOT / "bench"))
    order = []
    walls = iter([100.0, 120.0, 110.0, 90.0])        # naive, busy | busy, naive: the node slower mid-plan

    class Ctls:
        def __init__(self, *a, **k): pass
        def scrape(self, mode): return ""
        def stop(self, mode=None): pass

    def run_mode(mode, n, specs, budget, tmp, nonce, ctls):
        order.append((mode, nonce))
        wall = next(walls)
        return {"mode": mode, "agents": n, "commands": 10, "failed": 0, "commands_per_min": 600.0 / wall,
                "wall_s": wall, "rows": []}
    monkeypatch.setattr(fp.T, "run_mode", run_mode)
    monkeypatch.setattr(fp.T, "Controllers", Ctls)
    monkeypatch.setattr(sys, "argv", ["freeze_policy.py", "--reference", "none", "--scales", "4", "--policies", "busy",
                                      "--rounds", "2", "--out", str(tmp_path / "fp.json"), "--md", str(tmp_path / "fp.md")])
    fp.main()
    assert [m for m, _ in order] == ["naive", "krexbusy", "krexbusy", "naive"]
    assert len({nonce for _, nonce in order}) == 4                     # a build of its own in every run
    data = json.loads((tmp_path / "fp.json").read_text())
    assert [r["round"] for r in data["runs"]] == [0, 0, 1, 1]
    by_round = {(r["policy"], r["round"]): r["vs_naive"] for r in data["rows"]}
    assert by_round[("busy", 0)] == round(100 / 120, 4) and by_round[("busy", 1)] == round(90 / 110, 4)
    pooled = {r["policy"]: r for r in data["pooled"]}
    assert pooled["busy"]["vs_naive"] == round(190 / 230, 4) and pooled["busy"]["commands"] == 20   # 20 in 230 s, 190
    assert pooled["busy"]["wall_s"] == 230.0 and pooled["naive"]["wall_s"] == 190.0
    assert pooled["busy"]["vs_naive_rounds"] == [round(100 / 120, 4), round(90 / 110, 4)]
    assert pooled["busy"]["budgets_s"] == [30.0, 30.0]
    busy2 = next(r for r in data["rows"] if r["policy"] == "busy" and r["round"] == 1)
    busy2["metrics"] = {"krex_regions_granted_total": 3.0}
    assert "controller metrics after busy:4#2 (cumulative" in fp.table({**data, "rows": [busy2]})
    md = (tmp_path / "fp.md").read_text()
    assert "different budgets" not in md
    data["pooled"][1]["budgets_s"] = [30.0, 12.5]        # as if --deadline had cut the second round's
    assert "different budgets (--deadline cut some): naive:4 30, 30 s; busy:4 30, 12.5 s" in fp.table(data)
    assert "| busy (round 2) | 4 | 10 | 0.82 |" in md and "| naive (round 1) | 4 | 10 | 1.00 |" in md, md
    assert "| busy, 2 rounds together (each round: 0.83, 0.82) | 4 | 20 | 0.83 |" in md, md
    for n in ("0", "3"):
        bad = subprocess.run([sys.executable, str(ROOT / "bench" / "freeze_policy.py"), "--rounds", n,
                              "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and "--rounds:" in bad.stderr.strip().splitlines()[-1], bad.stderr
    assert not (tmp_path / "x.json").exists()


def _fp():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import freeze_policy as fp
    finally:
        sys.path.remove(str(ROOT / "bench"))
    return fp


class _Ctls:
    def __init__(self, *a, **k): pass
    def scrape(self, mode): return ""
    def stop(self, mode=None): pass


def test_freeze_policy_rounds_cut_short_pair_each_run_only_with_its_own_rounds_naive(tmp_path, monkeypatch):
    """A plan cut by the device script's timeout in round 2 (busy, naive: naive is last) leaves busy's round 2
    without its naive. --reanalyse of the partial JSON must not judge it against round 1's naive, and the pooled
    ratio must not set two busy rounds against one naive round (ABBA broken)."""
    fp = _fp()
    walls = iter([100.0, 120.0, 110.0])                # naive r1, busy r1 | busy r2, then the timeout

    def run_mode(mode, n, specs, budget, tmp, nonce, ctls):
        try:
            wall = next(walls)
        except StopIteration:
            raise SystemExit("timeout")                  # as `timeout $LIMIT` ends the plan
        return {"mode": mode, "agents": n, "commands": 10, "failed": 0, "commands_per_min": 600.0 / wall,
                "wall_s": wall, "rows": []}
    monkeypatch.setattr(fp.T, "run_mode", run_mode)
    monkeypatch.setattr(fp.T, "Controllers", _Ctls)
    out = tmp_path / "fp.json"
    monkeypatch.setattr(sys, "argv", ["freeze_policy.py", "--reference", "none", "--scales", "4", "--policies", "busy",
                                      "--rounds", "2", "--out", str(out)])
    with pytest.raises(SystemExit):
        fp.main()
    assert json.loads(out.read_text())["partial"]
    monkeypatch.setattr(sys, "argv", ["freeze_policy.py", "--reanalyse", str(out), "--out", str(tmp_path / "re.json")])
    fp.main()
    data = json.loads((tmp_path / "re.json").read_text())
    row = next(r for r in data["rows"] if r["policy"] == "busy" and r["round"] == 1)
    pooled = next(r for r in data["pooled"] if r["policy"] == "busy")
    assert row["vs_naive"] == pooled["vs_naive_rounds"][1], (row["vs_naive"], pooled["vs_naive_rounds"])
    assert pooled["vs_naive"] == round(100 / 120, 4), pooled      # only the round that has both


def test_freeze_policy_rounds_keep_each_rounds_cpu_use(tmp_path):
    """cpu_use per run: keyed MODE:AGENTS alone, the second round overwrote the first."""
    fp = _fp()
    runs = [{"mode": m, "agents": 4, "round": k, "commands": 10, "failed": 0, "commands_per_min": 6.0, "wall_s": 100.0,
             "rows": [], "node_cpu_busy_pct": busy} for m, k, busy in
            (("naive", 0, 50.0), ("krexbusy", 0, 60.0), ("krexbusy", 1, 70.0), ("naive", 1, 80.0))]
    cpu = fp.analyse(runs, 2.0, None)["cpu_use"]
    assert len(cpu) == 4, cpu


def test_freeze_policy_rounds_budget_note_only_for_unequal_budgets_within_a_scale():
    """Each scale's modes had like budgets (scale 8's all cut alike to 5 s): its pooled ratios compare like with like."""
    fp = _fp()
    runs = [{"mode": m, "agents": n, "round": k, "commands": 10, "failed": 0, "commands_per_min": 6.0, "wall_s": 100.0,
             "rows": [], "budget_s": b} for n, b in ((4, 30.0), (8, 5.0)) for k in (0, 1) for m in ("naive", "krexbusy")]
    md = fp.table(fp.analyse(runs, 2.0, None))
    assert "different budgets" not in md, md


def test_freeze_policy_rounds_run_for_real_with_a_warm_pool_restarted_each_round(tmp_path):
    """--rounds 2 end to end on the fake driver: naive, warm | warm, naive, the warm mode's controller (stopped after
    each run, its idle workers' contexts would taint the next run's regions) started and filled again for its second
    round; every command a candidate of its own (no nonce twice), each row in its round, pooled figures for both."""
    out = tmp_path / "fp.json"
    p = freeze_policy_standin(tmp_path, "--scales", "2", "--budget", "3", "--specs", "4", "--policies",
                              "busy+warm+prewait", "--rounds", "2", timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    data = json.loads(out.read_text())
    assert [(r["mode"], r["round"]) for r in data["runs"]] == [("naive", 0), ("krexwarmprewait", 0),
                                                                ("krexwarmprewait", 1), ("naive", 1)]
    nonces = [row["nonce"] for r in data["runs"] for row in r["rows"]]
    assert len(nonces) == len(set(nonces)) and all(r["commands"] >= 2 for r in data["runs"]), nonces
    warm = [r for r in data["runs"] if r["mode"] == "krexwarmprewait"]
    assert all(row.get("regions_clean") and all(row["regions_clean"]) for r in warm for row in r["rows"])
    # each round's pool filled before its clock, and its commands ran in its workers
    assert all(r["warmup_s"] > 0 and r["workers_replaced"] >= 1 for r in warm), \
        [(r["warmup_s"], r["workers_replaced"]) for r in warm]
    pooled = {r["policy"]: r for r in data["pooled"]}
    assert pooled["busy+warm+prewait"]["rounds"] == 2 and pooled["busy+warm+prewait"]["vs_naive"] > 0
    assert "(round 2)" in p.stdout and "2 rounds together" in p.stdout
