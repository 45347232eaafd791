"""bench/nccl_overlap.py's summary and goals on made-up numbers (the measurement itself needs two GPUs)."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("nccl_overlap", ROOT / "bench" / "nccl_overlap.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def run(total: dict) -> dict:
    """One variant's result: per case, its total (comm and compute alone 10 ms each)."""
    return {"results": [{"collective": "all_reduce", "mib": 256, "case": c, "gemms": 4, "comm_alone_ms": 10.0,
                         "compute_alone_ms": 10.0, "total_ms": t, "total_ms_all": [t]} for c, t in total.items()]}


def test_a_control_that_cuts_a_quarter_and_beats_no_control_meets_the_goals():
    s = bench.summarize({"serial": run({"balanced": 20.0}), "off": run({"balanced": 16.0}),
                         "priority": run({"balanced": 14.0})})
    case = s["cases"]["all_reduce-256MiB-balanced"]
    assert case["best"] == "priority" and abs(case["best_cut_vs_serial"] - 0.30) < 1e-9
    assert all(s["goals"].values())


def test_a_control_slower_than_no_control_by_more_than_one_percent_fails_its_goal():
    s = bench.summarize({"serial": run({"balanced": 20.0, "comm": 15.0}), "off": run({"balanced": 14.0, "comm": 12.0}),
                         "priority": run({"balanced": 13.0, "comm": 12.5})})
    assert s["goals"]["balanced_best_cut_25.5pct"] and s["goals"]["balanced_best_beats_off"]
    assert not s["goals"]["no_control_1pct_slower_than_off"]
    assert s["cases"]["all_reduce-256MiB-comm"]["worst"] == "priority"


def test_without_serial_or_no_control_a_case_is_not_judged():
    s = bench.summarize({"priority": run({"balanced": 13.0})})
    assert s["cases"] == {} and not s["goals"]["balanced_best_cut_25.5pct"]


def test_every_variant_runs_under_krex_run_with_its_controls(tmp_path):
    args = type("A", (), {"nproc": 2, "sizes": "64", "collectives": "all_reduce", "trials": 3, "gemm_size": 4096})()
    cmd = bench.variant_command(args, "priority+shape=2", "priority,shape=2", tmp_path / "r.json", tmp_path / "o.json")
    assert cmd[1:5] == ["-m", "krex_ctl", "run", "--cold"] and cmd[cmd.index("--overlap") + 1] == "priority,shape=2"
    assert "torch.distributed.run" in cmd and cmd[cmd.index("--mode") + 1] == "overlap"
    assert {n for n, _, _ in bench.VARIANTS} >= {"serial", "off", "priority", "nccl-cga-1", "sm_target=116"}
