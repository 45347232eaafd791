"""bench/overlap_proxy.py without a GPU: it imports, parses its arguments, builds each variant's command line,
and its summary, goals and plot come out right on made-up numbers (so a device call is not spent on a bug)."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, str(ROOT / "bench"))
import overlap_proxy as op  # noqa: E402


def case(serial, comm, compute, conc_total, conc_comm, copies=6, ok=True):
    return {"case": None, "copies": copies, "comm": {"total_ms": comm, "comm_ms": comm},
            "compute": {"total_ms": compute, "compute_ms": compute},
            "serial": {"total_ms": serial, "comm_ms": comm, "compute_ms": compute},
            "concurrent": {"total_ms": conc_total, "comm_ms": conc_comm, "compute_ms": conc_total},
            "copy_ok": ok, "gemm_ok": True, "ring_ok": True}


def variant(label, controls, cases, rc=0, fallbacks=0, padded=5):
    out = []
    for name, c in cases.items():
        c = dict(c, case=name)
        out.append(c)
    overlap = {"fallbacks": fallbacks, "padded": padded, "prioritized": 0, "sm_target": 0} if controls else None
    return {"label": label, "controls": controls, "rc": rc, "cases": out,
            "report": {"launches": 10, "exit_code": rc, "overlap": overlap}}


# the numbers measured before without krex (the issue), and what the controls would have to reach
MADE_UP = [
    variant("off", None, {"4096": case(4.44, 0.61 * 6, 1.04 * 6 / 6 * 0.8, 5.29, 4.0),
                          "balanced": case(18.0, 9.0, 9.0, 13.5, 12.0)}),
    variant("priority", "priority", {"4096": case(4.44, 3.66, 0.83, 5.0, 3.9),
                                     "balanced": case(18.0, 9.0, 9.0, 14.0, 11.0)}),
    variant("priority+shape=1", "priority,shape=1", {"4096": case(4.5, 3.66, 0.83, 4.2, 3.8),
                                                     "balanced": case(18.2, 9.0, 9.0, 12.9, 12.5)}),
    variant("priority+sm_target=116", "priority,sm_target=116", {"4096": case(4.6, 3.66, 0.9, 4.3, 3.7),
                                                                 "balanced": case(18.5, 9.0, 9.5, 13.0, 13.2, ok=False)}),
]
TRAIN = [{"label": "train-off-0", "rc": 0, "overlap": "", "step_ms": 10.0, "losses": [1.0, 0.9]},
         {"label": "train-on-0", "rc": 0, "overlap": "priority", "step_ms": 10.05, "losses": [1.0, 0.9]}]


def test_summary_compares_each_variant_with_the_off_serial_and_alone_times():
    s = op.summarize(MADE_UP, TRAIN)
    c4 = s["cases"]["4096"]
    assert c4["serial_ms"] == 4.44 and c4["best"] == "priority+shape=1"
    assert c4["best_vs_serial"] == pytest.approx(4.2 / 4.44)
    row = next(r for r in c4["rows"] if r["variant"] == "off")
    assert row["vs_serial"] > 1 and row["comm_vs_alone"] == pytest.approx(4.0 / 3.66)
    bal = s["cases"]["balanced"]
    assert bal["best"] == "priority+shape=1"           # the faster one computed wrong: never the best
    g = s["goals"]
    assert g["a_case_where_concurrency_loses"] and g["4096_loss_turned_into_win"]
    assert "4096-lt_loss_turned_into_win" not in g                 # a case not measured is no goal
    assert "balanced_loss_turned_into_win" not in g                # concurrency won there without controls
    assert c4["off_vs_serial"] == pytest.approx(5.29 / 4.44) and c4["worst"] == "priority"
    assert c4["worst_vs_off"] == pytest.approx(5.0 / 5.29)
    assert g["balanced_cut_25.5pct_comm_within_1.5x"] is True    # 12.9 / 18 = 0.717, span 12.5 / 9 = 1.39
    assert g["training_on_within_1pct_of_off"] and s["training"]["on_vs_off"] == pytest.approx(1.005)
    assert g["no_launch_lost_or_failed"] is False and s["fallbacks"] == 0   # the wrong GEMM counts as a failure


def test_goals_fail_where_the_numbers_do():
    slow = [MADE_UP[0], variant("shape=2", "shape=2", {"4096": case(4.44, 3.66, 0.83, 4.6, 3.9),
                                                       "balanced": case(18.0, 9.0, 9.0, 12.0, 14.5)}, fallbacks=3)]
    train = [dict(TRAIN[0]), dict(TRAIN[1], step_ms=10.5)]
    s = op.summarize(slow, train)
    g = s["goals"]
    assert not g["4096_loss_turned_into_win"]
    assert not g["balanced_cut_25.5pct_comm_within_1.5x"]       # 0.67 of serial, but the span is 1.61x alone
    assert not g["training_on_within_1pct_of_off"]
    assert s["fallbacks"] == 3 and not g["no_launch_lost_or_failed"]


def steady(case_, total):
    return dict(case_, steady={"total_ms": total, "comm_ms": 1.0, "compute_ms": 1.0, "second_half_median_ms": total,
                               "reps": 128, "filled": 0})


def test_every_control_list_runs_raw_and_guarded():
    labels = {label: controls for label, controls, _ in op.VARIANTS}
    assert labels["shape=4"] == "shape=4,noguard" and labels["guard+shape=4"] == "shape=4"
    assert labels["priority+shape=1+sm_target=116"].endswith(",noguard")
    assert labels["sm_target=116"] == "sm_target=116,noguard" and labels["guard+sm_target=116"] == "sm_target=116"
    assert "guard+stream-priority" not in labels and labels["off"] is None and labels["off-again"] is None
    assert order_last(op.VARIANTS) == "off-again"                              # the floor: off once more, last
    for label, controls in labels.items():
        assert op.guarded(controls) == label.startswith("guard+"), label
    order = [label for label, _, _ in op.VARIANTS]
    assert order.index("guard+shape=4") == order.index("shape=4") + 1          # side by side in one device run
    assert op.GUARD_PERIOD == 128                                              # read from shim/guard_rule.h


def test_a_guarded_variant_gets_its_epoch_and_the_shims_log_at_info(tmp_path):
    _, env = op.launch_cmd("guard+shape=4", "shape=4", ["python", "w.py"], tmp_path, use_krex=True, guard_epoch=6)
    assert env["KREX_OVERLAP_GUARD_EPOCH"] == "6" and env["KREX_LOG_LEVEL"] == "info"
    _, env = op.launch_cmd("shape=4", "shape=4,noguard", ["python", "w.py"], tmp_path, use_krex=True)
    assert "KREX_OVERLAP_GUARD_EPOCH" not in env


def test_guarded_variants_are_judged_on_a_whole_guard_cycle_against_off():
    base = case(18.0, 9.0, 9.0, 13.5, 12.0)
    runs = [variant("off", None, {"balanced": steady(base, 13.6)}),
            variant("shape=4", "shape=4,noguard", {"balanced": case(18.0, 9.0, 9.0, 14.6, 11.0)}),
            dict(variant("guard+shape=4", "shape=4", {"balanced": steady(base, 13.7)}),
                 guard_choices=[[12, "off"]])]
    for r in runs[2]["cases"]:
        r.pop("serial")                         # a guarded variant runs the concurrent pattern only
    s = op.summarize(runs, [])
    bal = s["cases"]["balanced"]
    assert bal["worst_raw"] == "shape=4" and bal["worst_raw_vs_off"] == pytest.approx(14.6 / 13.5)
    assert bal["worst_guarded"] == "guard+shape=4" and bal["worst_guarded_vs_off"] == pytest.approx(13.7 / 13.6)
    row = next(r for r in bal["rows"] if r["variant"] == "guard+shape=4")
    assert row["guarded"] and row["serial_ms_own"] is None
    assert s["goals"]["no_guarded_control_1pct_slower_than_off"] is True
    runs[2]["cases"][0]["steady"]["total_ms"] = 13.9                       # 2.2% slower than off
    assert op.summarize(runs, [])["goals"]["no_guarded_control_1pct_slower_than_off"] is False
    assert "no_guarded_control_1pct_slower_than_off" not in op.summarize(MADE_UP, TRAIN)["goals"]   # no cycle run


def order_last(variants):
    return variants[-1][0]


def test_the_floor_is_off_again_and_inert_controls_are_never_best_or_worst():
    base = case(18.0, 9.0, 9.0, 13.5, 12.0)
    runs = [variant("off", None, {"balanced": steady(base, 13.6)}),
            # shape=4 and shape=2 padded nothing (every GEMM a cluster launch, say): their 12.0 and 14.9 are
            # noise, neither a control's win nor its loss
            variant("shape=4", "shape=4,noguard", {"balanced": case(18.0, 9.0, 9.0, 12.0, 11.0)}, padded=0),
            variant("shape=2", "shape=2,noguard", {"balanced": case(18.0, 9.0, 9.0, 14.9, 11.0)}, padded=0),
            variant("shape=1", "shape=1,noguard", {"balanced": case(18.0, 9.0, 9.0, 13.0, 11.0)}),
            dict(variant("guard+shape=1", "shape=1", {"balanced": steady(base, 13.85)})),
            variant("off-again", None, {"balanced": steady(case(18.0, 9.0, 9.0, 13.77, 12.0), 13.872)})]
    for r in runs[4]["cases"] + runs[5]["cases"]:
        r.pop("serial")
    s = op.summarize(runs, [])
    bal = s["cases"]["balanced"]
    rows = {r["variant"]: r for r in bal["rows"]}
    assert rows["shape=4"]["inert"] and not rows["shape=1"]["inert"] and not rows["off"]["inert"]
    assert bal["best"] == "shape=1" and bal["worst_raw"] == "shape=1" and bal["worst"] != "shape=2"
    assert bal["floor_pct"] == pytest.approx(2.0) and bal["floor_steady_pct"] == pytest.approx(2.0)
    assert bal["best_beyond_floor"] is True                       # 13.0 / 13.5: 3.7% under off, beyond the 2%
    g = s["goals"]
    assert g["no_guarded_control_1pct_slower_than_off"] is False  # 13.85 / 13.6: 1.8% slower
    assert g["no_guarded_control_slower_than_off_beyond_max_1pct_floor"] is True   # within the 2% floor
    without = op.summarize(runs[:5], [])
    assert "no_guarded_control_slower_than_off_beyond_max_1pct_floor" not in without["goals"]
    assert without["cases"]["balanced"]["best_beyond_floor"] is None            # no floor: not known


def test_a_failed_or_missing_variant_is_recorded_not_fatal():
    s = op.summarize([MADE_UP[0], {"label": "shape=1", "controls": "shape=1", "rc": "timeout"}], [])
    assert s["failed_variants"] == ["shape=1"] and s["cases"]["4096"]["best"] is None
    assert op.summarize([], [])["cases"] == {}


def test_plot_of_made_up_numbers(tmp_path):
    pytest.importorskip("matplotlib")
    op.plot(op.summarize(MADE_UP, TRAIN), tmp_path / "overlap.png")
    assert (tmp_path / "overlap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_variant_runs_under_krex_run_or_with_the_shim_preloaded(tmp_path):
    cmd, env = op.launch_cmd("shape=2", "shape=2", ["python", "w.py"], tmp_path, use_krex=True)
    assert cmd[1:] == ["-m", "krex_ctl", "run", "--cold", "--report", str(tmp_path / "shape=2.report.json"),
                       "--overlap", "shape=2", "--", "python", "w.py"]
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert "KREX_OVERLAP" not in env
    cmd, env = op.launch_cmd("off", None, ["python", "w.py"], tmp_path, use_krex=True)
    assert "--overlap" not in cmd
    cmd, env = op.launch_cmd("p", "priority,shape=1", ["python", "w.py"], tmp_path, use_krex=False)
    assert cmd == ["python", "w.py"] and env["KREX_OVERLAP"] == "priority,shape=1"
    assert env["LD_PRELOAD"].split()[0].endswith("build/libkrex.so") and env["TORCH_NCCL_HIGH_PRIORITY"] == "1"
    for _, controls, _ in op.VARIANTS + [(None, op.TRAIN_CONTROLS, None)]:
        if controls:
            from krex_ctl.environ import check_overlap
            check_overlap(controls)                     # every variant's controls pass krex run's check


def test_arguments_and_a_bad_case(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "overlap_proxy.py"), "--cases", "4096,nope"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown case nope" in out.stderr


def test_orchestrator_records_every_variant_when_the_workers_cannot_run(tmp_path):
    """No GPU here: each worker fails (no torch.cuda / cupy); the orchestrator still writes its summary, with every
    variant's failure, and its logs."""
    out = tmp_path / "out"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "overlap_proxy.py"), "--out", str(out), "--no-krex",
                        "--variants", "off,shape=2,guard+shape=2", "--train-rounds", "1", "--timeout", "60",
                        "--budget", "200"],
                       capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin",
                                                                         "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr[-2000:]
    s = json.loads((out / "overlap-summary.json").read_text())
    assert [v["label"] for v in s["variants"]] == ["off", "shape=2", "guard+shape=2"]       # in VARIANTS' order
    assert s["variants"][2]["guard_choices"] == [] and s["guard_epoch"] == op.GUARD_EPOCH
    assert [t["label"] for t in s["train"]] == ["train-off-0", "train-on-0"]
    assert s["launcher"] == "LD_PRELOAD + KREX_OVERLAP" and not s["goals"]["no_launch_lost_or_failed"]
    assert (out / "overlap-logs.tgz").stat().st_size > 0


def test_the_search_cases_are_cases_the_worker_and_the_orchestrator_take():
    assert len(op.SEARCH) == 72 and not set(op.SEARCH) & set(op.CASES)
    assert all(name in op.ALL_CASES for name in op.SEARCH)
    orders = {(s["compute_first"], s["pipeline"]) for s in op.SEARCH.values()}
    assert orders == {(False, False), (True, False), (False, True)}      # copy first, GEMMs first, pipeline
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "overlap_proxy.py"), "--cases",
                        "s-cublas-4096x6-c16x1-pipe,nope"], capture_output=True, text=True)
    assert p.returncode == 2 and "unknown case nope" in p.stderr and "s-cublas" not in p.stderr


@pytest.mark.parametrize("gemms,copies", [(6, 1), (6, 2), (24, 1), (24, 2), (7, 3)])
def test_a_pipeline_moves_the_same_bytes_in_one_bucket_per_gemm_covering_the_source(gemms, copies):
    c = op.Case.__new__(op.Case)
    c.spec, c.copies = {"gemms": gemms, "pipeline": True}, copies
    whole = op.COPY_BYTES // 16
    chunks = c.chunks()
    assert len(chunks) == gemms and all(0 <= off and off + n <= whole for off, n in chunks)
    assert copies * whole <= sum(n for _, n in chunks) < copies * whole + gemms     # the same bytes, rounded up
    covered, end = sorted(chunks), 0
    for off, n in covered:
        assert off <= end            # no gap: every word of src is copied, so the copy check holds
        end = max(end, off + n)
    assert end == whole
    c.spec = {"gemms": gemms}
    assert c.chunks() == [(0, whole)] * copies                  # not a pipeline: whole copies


def test_the_search_calls_a_loss_only_what_both_processes_show():
    import overlap_search as osr

    def row(name, conc, serial=4.0, ok=True, copies=1):
        launches = 24 if name.endswith("-pipe") else copies      # as the worker counts them (Case.chunks)
        return dict(case(serial, 3.0, 1.0, conc, 3.5, copies=copies, ok=ok), case=name, launches=launches)

    a, b, c, d = ("s-cublas-4096x6-c16x1-first", "s-cublas-4096x6-c16x2-first", "s-cublas-2048x24-c16x1-pipe",
                  "s-cublaslt-4096x6-c66x1-late")
    first = [row(a, 4.4), row(b, 4.6, copies=2), row(c, 4.8), row(d, 4.2, ok=False), {"case": "x", "error": "OOM"}]
    second = [row(a, 4.3), row(b, 4.02, copies=2), row(c, 4.5), row(d, 4.3, ok=False)]
    s = osr.summarize(first, second, 1.02)
    by = {r["case"]: r for r in s["cases"]}
    assert by[a]["loss"] and by[c]["loss"]
    assert not by[b]["loss"]                  # 1.15 then 1.005: not confirmed by the second process
    assert not by[d]["loss"]                  # a wrong copy is never a loss
    assert s["failed"] == ["x"] and by["x"]["loss"] is False
    assert s["losses"] == [c, a]              # worst first, by the smaller of the two ratios (1.125, 1.075)
    # the guard epoch of the worst (a 24-GEMM pipeline: 24 launches a repetition); a (1 launch) is not handed on
    assert s["guard_epoch"] == 24 and s["handed_on"] == [c]
    assert osr.ratio({"case": "y", "error": "x"}) is None


def test_the_search_says_so_when_its_suspects_could_not_be_timed_again(tmp_path, monkeypatch):
    """A confirming process that failed is no verdict: the result says confirm_failed and the search exits
    non-zero, where every suspect would have read as 'not a loss'."""
    import overlap_search as osr

    name = "s-cublas-4096x6-c16x1-first"
    first = [dict(case(4.0, 3.0, 1.0, 4.6, 3.5, copies=1), case=name)]
    calls = iter([first, []])
    monkeypatch.setattr(osr, "run_worker", lambda *a, **k: next(calls))
    with pytest.raises(SystemExit) as e:
        osr.main(["--out", str(tmp_path), "--cases", name])
    assert "could not be timed again" in str(e.value)
    data = json.loads((tmp_path / "overlap-search.json").read_text())
    assert data["confirm_failed"] and data["losses"] == [] and data["cases"][0]["again"] is None
