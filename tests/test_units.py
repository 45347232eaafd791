"""Pure logic: the preload environment, the FIFO scheduler, CPU lists and config."""

import pytest

from krex_ctl.config import default_reserved, load, parse_cpu_list
from krex_ctl.environ import HOOKS_DIR, RunOptions, preload_environ
from krex_ctl.errors import KrexCommandError
from krex_ctl.scheduler import Request, list_to_mask, mask_to_list, startable


def opts(**kw):
    return RunOptions(**{"shim": "/opt/krex/libkrex.so", "socket": "/s.sock", "job": 7, **kw})


def test_preload_is_prepended_once():
    env = preload_environ({"LD_PRELOAD": "/usr/lib/libfoo.so:/old/libkrex.so"}, opts())
    assert env["LD_PRELOAD"] == "/opt/krex/libkrex.so /usr/lib/libfoo.so"
    again = preload_environ(env, opts())
    assert again["LD_PRELOAD"] == env["LD_PRELOAD"]
    assert preload_environ({}, opts())["LD_PRELOAD"] == "/opt/krex/libkrex.so"


def test_preload_environ_is_pure_and_sets_the_contract_variables():
    base = {"PATH": "/bin"}
    env = preload_environ(base, opts(counters="/c", gpu=3))
    assert base == {"PATH": "/bin"}
    assert env["KREX_SOCKET"] == "/s.sock" and env["KREX_JOB"] == "7" and env["KREX_COUNTERS"] == "/c"
    assert env["KREX_GPU"] == env["CUDA_VISIBLE_DEVICES"] == env["HIP_VISIBLE_DEVICES"] == "3"
    assert "KREX_HOOKS" not in env and "PYTHONPATH" not in env


def test_hooks_put_the_site_directory_first_once():
    env = preload_environ({"PYTHONPATH": "/a"}, opts(hooks="all"))
    assert env["KREX_HOOKS"] == "all" and env["PYTHONPATH"] == f"{HOOKS_DIR}:/a"
    assert preload_environ(env, opts(hooks="all"))["PYTHONPATH"] == env["PYTHONPATH"]
    assert env["NVTX_INJECTION64_PATH"] == "/opt/krex/libkrex.so"
    assert "NVTX_INJECTION64_PATH" not in preload_environ({}, opts(hooks="triton"))
    assert preload_environ({"NVTX_INJECTION64_PATH": "/nsys.so"}, opts(hooks="nvtx"))["NVTX_INJECTION64_PATH"] == "/nsys.so"


def req(i, gpus):
    return Request(i, list_to_mask(gpus), f"r{i}", i)


def test_scheduler_is_fifo_per_gpu_and_lets_disjoint_gpus_through():
    q = [req(1, [0]), req(2, [0]), req(3, [1])]
    assert [r.id for r in startable(q, 0)] == [1, 3]
    assert [r.id for r in startable(q, list_to_mask([0]))] == [3]


def test_scheduler_never_lets_a_later_request_overtake_on_a_shared_gpu():
    q = [req(1, [0, 1]), req(2, [1]), req(3, [2])]
    assert [r.id for r in startable(q, list_to_mask([0]))] == [3]   # 2 waits behind 1 on GPU 1
    assert mask_to_list(list_to_mask([0, 5, 63])) == [0, 5, 63]


def test_cpu_lists():
    assert parse_cpu_list("0-3,8, 10-11") == [0, 1, 2, 3, 8, 10, 11]
    for bad in ("3-1", "a", "-1"):
        with pytest.raises(ValueError):
            parse_cpu_list(bad)
    assert default_reserved({0}) == []
    assert default_reserved({0, 1}) == [1]
    assert default_reserved(set(range(16))) == [14, 15]


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(KrexCommandError, match="cannot read config"):
        load(str(tmp_path / "missing.json"))
    cfg = load(None, gpus="0-1", reserved_cores="1", region_time_limit_s=5.0)
    assert cfg.gpus == [0, 1] and cfg.reserved_cores == {-1: [1]} and cfg.region_time_limit_s == 5.0
    with pytest.raises(KrexCommandError, match="GPU indices"):
        load(None, gpus="70")
    with pytest.raises(KrexCommandError, match="must be positive"):
        load(None, drain_timeout_s=0)


def test_which_commands_may_run_warm(tmp_path):
    import sys

    from krex_ctl.dispatch import fingerprint, python_command

    script = tmp_path / "b.py"
    script.write_text("pass")
    env = {"PATH": "/usr/bin:/bin"}
    assert python_command([sys.executable, str(script), "--x"], env) == (sys.executable, [str(script), "--x"])
    assert python_command([sys.executable, "-m", "json.tool"], env)[1] == ["-m", "json.tool"]
    assert python_command([sys.executable, "-c", "pass"], env)[1] == ["-c", "pass"]
    for argv in ([sys.executable], [sys.executable, "-O", str(script)], [sys.executable, "-m"],
                 [sys.executable, str(tmp_path / "missing.py")], ["/bin/sh", str(script)]):
        assert python_command(argv, env) is None, argv
    base = {"PATH": "/bin", "HOME": "/root", "CUDA_VISIBLE_DEVICES": "0"}
    assert fingerprint(base) == fingerprint(dict(base, HOME="/tmp", KREX_JOB="9"))     # not read at start-up
    for k, v in (("CUDA_VISIBLE_DEVICES", "1"), ("LD_LIBRARY_PATH", "/x"), ("PYTHONHASHSEED", "0"),
                 ("TORCH_LOGS", "+dynamo"), ("KREX_HOOKS", "all")):
        assert fingerprint(base) != fingerprint(dict(base, **{k: v})), k
