"""Pure logic: the preload environment, the FIFO scheduler, CPU lists and config."""

import json
import signal

import pytest

from krex_ctl.config import default_reserved, load, parse_cpu_list
from krex_ctl.environ import HOOKS_DIR, RunOptions, preload_environ
from krex_ctl.errors import KrexCommandError
from krex_ctl.policy.scheduler import Request, list_to_mask, mask_to_list, startable


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
    env = preload_environ(base, opts(counters="/c", gpus=[3], job_root=42))
    assert base == {"PATH": "/bin"}
    assert env["KREX_SOCKET"] == "/s.sock" and env["KREX_JOB"] == "7" and env["KREX_COUNTERS"] == "/c"
    assert env["KREX_GPU"] == env["CUDA_VISIBLE_DEVICES"] == env["HIP_VISIBLE_DEVICES"] == "3"
    assert env["KREX_JOB_ROOT"] == "42"
    assert "KREX_HOOKS" not in env
    assert env["PYTHONPATH"] == str(HOOKS_DIR) and env["KREX_PACKAGE_DIR"]   # the region API reaches any Python
    assert "KREX_COUNTERS" not in preload_environ({"KREX_COUNTERS": "/stale"}, opts())   # none made: none passed on


def test_strict_reaches_the_command():
    """krex run --strict did not tell the command: the hooks, which read KREX_STRICT, never saw it."""
    assert preload_environ({}, opts(strict=True))["KREX_STRICT"] == "1"
    assert "KREX_STRICT" not in preload_environ({}, opts())
    assert preload_environ({"KREX_STRICT": "0"}, opts())["KREX_STRICT"] == "0"    # the caller's own, as it was


def test_several_gpus_by_uuid_where_known():
    env = preload_environ({}, opts(gpus=[0, 1], gpu_uuids=["GPU-a", "GPU-b"]))
    assert env["KREX_GPU"] == "0,1" and env["HIP_VISIBLE_DEVICES"] == "0,1"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert preload_environ({}, opts(gpus=[0, 1], gpu_uuids=["GPU-a", None]))["CUDA_VISIBLE_DEVICES"] == "0,1"


def test_hooks_put_the_site_directory_first_once():
    env = preload_environ({"PYTHONPATH": "/a"}, opts(hooks="all"))
    assert env["KREX_HOOKS"] == "all" and env["PYTHONPATH"] == f"{HOOKS_DIR}:/a"
    assert preload_environ(env, opts(hooks="all"))["PYTHONPATH"] == env["PYTHONPATH"]
    assert env["NVTX_INJECTION64_PATH"] == "/opt/krex/libkrex.so"
    assert "NVTX_INJECTION64_PATH" not in preload_environ({}, opts(hooks="triton"))
    assert preload_environ({"NVTX_INJECTION64_PATH": "/nsys.so"}, opts(hooks="nvtx"))["NVTX_INJECTION64_PATH"] == "/nsys.so"
    # another copy of the shim (a Slurm prolog's): the preloaded one's, whose wrappers see the launches
    other = preload_environ({"NVTX_INJECTION64_PATH": "/usr/local/lib/krex/libkrex.so"}, opts(hooks="nvtx"))
    assert other["NVTX_INJECTION64_PATH"] == "/opt/krex/libkrex.so"


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
    for bad, why in (("3-1", "'3-1' is not a CPU range: it runs backwards"), ("a", "'a' is not a CPU index"),
                     ("-1", "'-1' is not a CPU index"), ("0-", "'0-' is not a CPU index"),
                     ("1-2-3", "'1-2-3' is not a CPU index"), ("0x1", "'0x1' is not")):
        with pytest.raises(ValueError, match=why):
            parse_cpu_list(bad)
    assert default_reserved({0}) == []
    assert default_reserved({0, 1}) == [1]
    assert default_reserved(set(range(16))) == [14, 15]


def test_config_errors_are_clear(tmp_path):
    with pytest.raises(KrexCommandError, match="cannot read config"):
        load(str(tmp_path / "missing.json"))
    (tmp_path / "c.json").write_text('{"region_time_limit": 5}')
    with pytest.raises(KrexCommandError, match="unknown setting 'region_time_limit' .did you mean 'region_time_limit_s'"):
        load(str(tmp_path / "c.json"))
    cfg = load(None, gpus="0-1", reserved_cores="1", region_time_limit_s=5.0)
    assert cfg.gpus == [0, 1] and cfg.reserved_cores == {-1: [1]} and cfg.region_time_limit_s == 5.0
    with pytest.raises(KrexCommandError, match="GPU indices"):
        load(None, gpus="70")
    with pytest.raises(KrexCommandError, match="--drain-timeout: must be a finite number above 0"):
        load(None, drain_timeout_s=0)


@pytest.mark.parametrize("setting, value, message", [
    ("region_time_limit_s", "inf", "--region-time-limit: must be a finite number"),
    ("region_time_limit_s", "nan", "--region-time-limit: must be a finite number"),
    ("region_time_limit_s", "1e10", "--region-time-limit: must be a finite number above 0 and at most 86400"),
    ("drain_timeout_s", "nan", "--drain-timeout: must be a finite number"),
    ("gpus", "", "--gpus: no GPU given"),
    ("gpus", "abc", "--gpus: 'abc' is not a GPU index or range (a list such as 0-3,8)"),
    ("reserved_cores", "0-", "--reserved-cores: '0-' is not a CPU index or range"),
    ("socket_mode", "0", "--socket-mode: 0o0 must be at most 0777 and let the owner read and write"),
    ("socket_mode", "abc", "--socket-mode: must be an octal mode"),
    ("socket_mode", "0666", "--socket-mode: 0o666 would let every user"),
    ("reserved_cores", "9999", "--reserved-cores: CPU 9999 is not usable here"),
    ("log_level", "bogus", "--log-level: must be one of error, warning, info, debug, not 'bogus'"),
    ("warm_workers", "x", "--warm-workers: must be a whole number"),
    ("owner_cpus", "mine", "--owner-cpus: must be one of reserved, own-and-reserved, not 'mine'"),
])
def test_every_bad_flag_is_named(setting, value, message):
    with pytest.raises(KrexCommandError) as e:
        load(None, **{setting: value})
    assert str(e.value).startswith(message) and e.value.exit_code == 2


@pytest.mark.parametrize("setting, value, message", [
    ("max_clients", "x", "max_clients: must be a JSON number, not the string 'x'"),
    ("max_clients", "12", "max_clients: must be a JSON number, not the string '12'"),
    ("max_clients", 0, "max_clients: must be between 1 and"),
    ("max_clients", -1, "max_clients: must be between 1 and"),
    ("max_clients", 1.5, "max_clients: must be a whole number"),
    ("region_time_limit_s", "abc", "region_time_limit_s: must be a JSON number, not the string 'abc'"),
    ("region_time_limit_s", "60", "region_time_limit_s: must be a JSON number, not the string '60'"),
    ("region_time_limit_s", [60], "region_time_limit_s: must be a number"),
    ("freeze", "yes", "freeze: must be true or false"),
    ("owner_cpus", "all", "owner_cpus: must be one of reserved, own-and-reserved, not 'all'"),
    ("gpus", [0, "1"], "gpus: must be a list of GPU indices"),
    ("socket_mode", 660, 'socket_mode: the JSON number 660 is decimal (0o1224); write the mode as a string, "0660"'),
    ("drain_timeout_s", True, "drain_timeout_s: must be a number, not true"),
    ("freeze", None, "freeze: must be true or false, not null"),
    ("log_level", None, "log_level: must be one of error, warning, info, debug, not null"),
    ("socket_group", "no-such-group-krex", "socket_group: no group named 'no-such-group-krex' on this node"),
])
def test_every_bad_config_key_is_named(tmp_path, setting, value, message):
    import json

    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({setting: value}))
    with pytest.raises(KrexCommandError) as e:
        load(str(cfg))
    assert str(e.value).startswith(f"config {cfg}: {message}") and e.value.exit_code == 2


def test_a_config_key_given_twice_and_a_group_that_cannot_connect_are_told(tmp_path, capsys):
    """json keeps the last of two equal keys without a word; a group given a socket it may not write to cannot
    connect (0600 or 0640 with socket_group was taken silently)."""
    cfg = tmp_path / "c.json"
    cfg.write_text('{"region_time_limit_s": 60, "freeze": true, "region_time_limit_s": 5}')
    with pytest.raises(KrexCommandError) as e:
        load(str(cfg))
    assert str(e.value) == f"config {cfg}: the setting 'region_time_limit_s' is given twice" and e.value.exit_code == 2
    cfg.write_text('{"freeze": false, "freeze_policy": "all"}')       # taken: --json said "all", the text "none"
    with pytest.raises(KrexCommandError, match="freeze false and freeze_policy 'all' disagree"):
        load(str(cfg))
    assert load(str(cfg), freeze=True, freeze_policy="all").freeze_policy == "all"   # flags: --freeze-policy wins
    cfg.write_text('{"freeze": false, "freeze_policy": "none"}')
    assert load(str(cfg)).freeze is False
    cfg.write_text('{"socket_mode": 432}')                      # a JSON number is decimal, as documented: 0660
    assert load(str(cfg)).socket_mode == 0o660
    cfg.write_text('{"socket_group": "0", "socket_mode": "0640"}')
    assert load(str(cfg)).socket_mode == 0o640
    assert "socket_mode 0640 with socket_group 0: the group's members cannot connect" in capsys.readouterr().err
    cfg.write_text('{"socket_group": "0"}')
    assert load(str(cfg)).socket_mode == 0o660 and capsys.readouterr().err == ""


def test_state_file_parsing():
    from krex_ctl.wire.runtime import parse_state

    assert parse_state('{"frozen": [[123, 456], [124, null]]}') == [(123, 456), (124, None)]
    for bad in ("[]", "{nope", '{"frozen": {}}', '{"frozen": [[1, 2]]}', '{"frozen": [["a", 1]]}', '"x"'):
        assert parse_state(bad) is None, bad


def test_environment_is_checked_before_a_run():
    from krex_ctl.environ import check_environment

    check_environment({"KREX_GATE_CONTEXTS": "true", "KREX_GATE_EXIT": "0", "KREX_GPU": "0,1", "KREX_HOOKS": "all"})
    check_environment({"KREX_GATE_LIFECYCLE_WAIT": "2.5"})
    for env, message in (({"KREX_GATE_CONTEXTS": "maybe"}, "KREX_GATE_CONTEXTS must be 1, true, yes or on, or 0, false"),
                         ({"KREX_GATE_LIFECYCLE_WAIT": "-1"}, "KREX_GATE_LIFECYCLE_WAIT must be a number of seconds"),
                         ({"KREX_GATE_LIFECYCLE_WAIT": "4000"}, "KREX_GATE_LIFECYCLE_WAIT must be a number of seconds"),
                         ({"KREX_GPU": "abc"}, "KREX_GPU: 'abc' is not a GPU index"),
                         ({"KREX_LOG_LEVEL": "loud"}, "KREX_LOG_LEVEL must be one of"),
                         ({"KREX_HOOKS": "triton,nope"}, "KREX_HOOKS: unknown hook nope"),
                         ({"KREX_WARM_WORKERS": "-3"}, "KREX_WARM_WORKERS must be a whole number"),
                         ({"KREX_HOST_BOUND": "maybe"}, "KREX_HOST_BOUND must be 1, true, yes or on, or 0, false")):
        with pytest.raises(KrexCommandError, match=message) as e:
            check_environment(env)
        assert e.value.exit_code == 2


def test_every_flag_the_shim_reads_is_checked_before_a_run():
    """a flag the shim would only warn about (and take its default) is refused by `krex run` first"""
    import re

    from conftest import ROOT
    from krex_ctl.environ import FLAG_VARS

    read = {m for f in (ROOT / "shim").glob("*.c") for m in re.findall(r'krex_env_flag\("(KREX_\w+)"', f.read_text())}
    assert read and read <= set(FLAG_VARS), read - set(FLAG_VARS)


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


def test_gate_waits_are_read_from_the_counters_and_a_dead_waiters_mark_is_ignored(tmp_path):
    """The wrapper's view of its processes blocked at a closed gate (shim/gate.c marks the slot): a live
    process's wait with its GPUs; the mark a process killed at a gate left behind is not a wait."""
    import os
    import subprocess

    from krex_ctl.wire.counters import create_counters, gate_waits
    from krex_ctl.wire.frames import ffi

    path = tmp_path / "counters"
    create_counters(path, slots=4)
    dead = subprocess.Popen(["true"])
    dead.wait()
    data = bytearray(path.read_bytes())
    buf = ffi.from_buffer(data)
    hdr = ffi.cast("struct krex_counters_hdr *", buf)
    slots = ffi.cast("struct krex_counter_slot *", buf + ffi.sizeof("struct krex_counters_hdr"))
    hdr.next_slot = 3
    slots[0].pid, slots[0].gate_wait_since_ns, slots[0].gate_wait_gpus, slots[0].gate_waiters = os.getpid(), 5, 0b101, 1
    slots[1].pid, slots[1].gate_wait_since_ns, slots[1].gate_wait_gpus = dead.pid, 7, 0b1     # killed at the gate
    slots[2].pid = os.getpid()                                                                  # not waiting
    path.write_bytes(bytes(data))
    assert gate_waits(path) == [{"pid": os.getpid(), "since_ns": 5, "gpus": [0, 2]}]


def test_the_resumer_holds_a_process_before_it_is_stopped(tmp_path):
    """A controller killed between a SIGSTOP and the resumer's hold left that process stopped (the resumer
    never knew of it): the hold goes first, and a process that could not be stopped is held all the same
    (a SIGCONT to it does nothing)."""
    import signal
    from types import SimpleNamespace

    from krex_ctl.enforce.freeze import Freezer

    order = []

    class Fd:
        def __init__(self, pid, ok=True):
            self.pid, self.fd, self.ok, self.start_time = pid, 100 + pid, ok, 1

        def signal(self, sig):
            order.append(("signal", self.pid, sig))
            return self.ok

    f = Freezer(str(tmp_path / "state"), lambda *a: None)
    f.resumer = SimpleNamespace(hold=lambda rid, fds: order.append(("hold", rid, tuple(fds))))
    a, b, gone = (SimpleNamespace(pid=p, pidfd=Fd(p, ok)) for p, ok in ((1, True), (2, True), (3, False)))
    held, skipped = f.freeze(7, [b, gone], [a], [a])
    assert order == [("hold", 7, (101, 102, 103)), ("signal", 2, signal.SIGSTOP), ("signal", 3, signal.SIGSTOP)]
    assert held == [a, b] and skipped == ""


def test_a_departed_client_on_its_way_out_is_not_a_foreign_process(monkeypatch):
    """NvmlAttestor: a pid NVML lists that is no client and not under the shim is foreign, unless it is a client
    that disconnected lately: on its way out (its connection closes before its GPU context, and its environment
    is gone by then, so krex_managed cannot tell) its teardown is lifecycle work, a taint when it is another
    job's; exited (every thread a zombie: its files closed), NVML's listing is stale. One that disconnected and
    runs on is judged as any process (here: foreign)."""
    from types import SimpleNamespace

    from krex_ctl.enforce import attest

    class Nv:
        count = 1

        def uuid(self, g): return b"GPU-real"
        def reasons(self, g): return 0
        def sm_clock(self, g): return 1980
        def temperature(self, g): return 40
        def processes(self, g): return {4242: 1 << 20}
        def xid_events(self): return []
        def sm_clock_samples(self, g, since): return []

    departed = {}
    state, managed = {"v": "exiting"}, {"v": False}
    monkeypatch.setattr(attest, "krex_managed", lambda pid: managed["v"])
    monkeypatch.setattr(attest.procs, "exit_state", lambda pid, started: state["v"] if started == 7 else "running")
    cfg = SimpleNamespace(busy_before_us=1000.0, clock_drop_pct=0.0)
    a = attest.NvmlAttestor(Nv(), cfg, lambda: set(), lambda: departed)

    def taints(job=1, own=(), between=None):
        region = SimpleNamespace(taints=0, others_busy_us=0, clock_settle=[], attest_start=a.snapshot(1),
                                 job=SimpleNamespace(id=job), own=[SimpleNamespace(id=j) for j in own])
        if between:
            between()                                             # what changes while the region is held
        r = a.finish(region, 0)
        g = r.details["gpus"]["0"]
        return r.record()["taints"], g["foreign_pids"], g["leaving_pids"]

    assert taints() == (["foreign_process"], [4242], [])          # never a client
    departed[4242] = (7, frozenset({2}))
    assert taints() == (["lifecycle"], [], [4242])                # another job's client on its way out
    assert taints(job=2) == ([], [], [])                          # the region's own job's
    assert taints(own=(1, 2)) == ([], [], [])                     # the command its warm worker runs
    state["v"] = "exited"
    assert taints() == ([], [], [])                               # its files closed: a stale listing
    state["v"] = "running"
    assert taints() == (["foreign_process"], [4242], [])          # a client that runs on
    departed[4242] = (8, frozenset({2}))
    state["v"] = "exiting"
    assert taints() == (["foreign_process"], [4242], [])          # the pid is another process's now
    departed[4242] = (7, frozenset({2}))                          # on its way out at the grant, exited by
    assert taints(between=lambda: state.update(v="exited")) == (["lifecycle"], [], [4242])   # the end: in it
    del departed[4242]                                            # a stranger at the grant, gone by the end
    state["v"] = "running"
    assert taints(between=lambda: managed.update(v=True)) == (["foreign_process"], [4242], [])


def test_exit_state_reads_every_thread(tmp_path):
    """procs.exit_state on a /proc of the test's own: every thread must be exiting, a zombie or killed."""
    from krex_ctl import procs

    def proc(pid, threads, start=7):
        """threads: tid -> (state letter, flags, SigPnd mask)"""
        (tmp_path / str(pid) / "task").mkdir(parents=True)
        main = threads[min(threads)]
        tail = " ".join(["1", "1", "1", "0", "-1", str(main[1])] + ["0"] * 12 + [str(start)])
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (x y) {main[0]} {tail}\n")
        for tid, (st, flags, pnd) in threads.items():
            d = tmp_path / str(pid) / "task" / str(tid)
            d.mkdir()
            tail = " ".join(["1", "1", "1", "0", "-1", str(flags)] + ["0"] * 12 + [str(start)])
            (d / "stat").write_text(f"{tid} (x y) {st} {tail}\n")
            (d / "status").write_text(f"Name:\tx\nSigPnd:\t{pnd:016x}\nShdPnd:\t0000000000000000\n")

    kill = 1 << 8
    proc(1, {1: ("R", 0, 0)})
    proc(2, {2: ("D", procs.PF_EXITING, 0), 3: ("S", 0, kill)})        # the main thread exiting, one killed
    proc(4, {4: ("Z", procs.PF_EXITING, 0), 5: ("S", 0, 0)})           # the main thread alone has exited
    proc(6, {6: ("Z", procs.PF_EXITING, 0), 7: ("R", procs.PF_EXITING, 0)})
    proc(8, {8: ("Z", procs.PF_EXITING, 0)})
    state = {pid: procs.exit_state(pid, 7, str(tmp_path)) for pid in (1, 2, 4, 6, 8, 9)}
    assert state == {1: "running", 2: "exiting", 4: "running", 6: "exiting", 8: "exited", 9: "exited"}, state
    assert procs.exit_state(2, 8, str(tmp_path)) == "running"         # another process has the pid now
    assert procs.exit_state(2, None, str(tmp_path)) == "exiting"      # whatever process has it


def test_only_a_connection_closed_on_the_way_out_keeps_its_pidfd(monkeypatch):
    """server.leaving_pidfd: the pidfd the lifecycle barrier follows, only for a GPU client with a context whose
    connection closed ("disconnected") while its process is exiting and has not exited."""
    from types import SimpleNamespace

    from krex_ctl import server
    from krex_ctl.wire.frames import C

    exiting = {"v": True}
    monkeypatch.setattr(server.procs, "exiting", lambda pid, started: exiting["v"])
    pidfd = SimpleNamespace(start_time=5, exited=lambda: False)
    c = SimpleNamespace(role=C.KREX_ROLE_SHIM, devices=1, pid=9, pidfd=pidfd)
    assert server.leaving_pidfd(c, "disconnected") is pidfd
    assert server.leaving_pidfd(c, "process exited") is None
    assert server.leaving_pidfd(SimpleNamespace(**{**c.__dict__, "devices": 0}), "disconnected") is None
    assert server.leaving_pidfd(SimpleNamespace(**{**c.__dict__, "role": C.KREX_ROLE_CLI}), "disconnected") is None
    done = SimpleNamespace(start_time=5, exited=lambda: True)
    assert server.leaving_pidfd(SimpleNamespace(**{**c.__dict__, "pidfd": done}), "disconnected") is None   # exited
    exiting["v"] = False
    assert server.leaving_pidfd(c, "disconnected") is None              # runs on


def test_a_departed_processs_jobs_gather_over_its_connections():
    """Controller.note_departed: a warm worker's connections are dropped one by one, and the pool forgets the
    command it served at the first; the jobs asked before that stay with the pid (same start time only)."""
    from types import SimpleNamespace

    from krex_ctl import server

    ctl = SimpleNamespace(departed={}, DEPARTED_S=60.0)
    worker = SimpleNamespace(pid=5, pidfd=SimpleNamespace(start_time=9))
    server.Controller.note_departed(ctl, worker, frozenset({10, 20}))     # its control connection, serving job 20
    server.Controller.note_departed(ctl, worker, frozenset({10}))         # its shim's, the command forgotten
    assert ctl.departed[5][2] == {10, 20}
    reused = SimpleNamespace(pid=5, pidfd=SimpleNamespace(start_time=11))
    server.Controller.note_departed(ctl, reused, frozenset({30}))         # another process with the pid
    assert ctl.departed[5][2] == {30}


def test_the_shim_check_reads_exports_from_the_file_and_never_raises_on_its_content(tmp_path):
    """krex_ctl/elf.py: krex run's check of KREX_SHIM. A library that does not export krex_shim_loaded, and any
    cut-off or garbled copy of the shim, is named as not a shim; nothing is loaded."""
    from conftest import BUILD
    from krex_ctl import elf

    shim = (BUILD / "libkrex.so").read_bytes()
    assert elf.missing_export(str(BUILD / "libkrex.so"), "krex_shim_loaded") is None
    assert elf.missing_export(str(BUILD / "libkrex.so"), "krex_no_such_symbol") == "does not export krex_no_such_symbol"
    assert elf.missing_export(str(BUILD / "fakes" / "libcuda.so.1"), "krex_shim_loaded") == \
        "does not export krex_shim_loaded"
    cut = tmp_path / "cut.so"
    for size in (0, 4, 63, 64, 4096, len(shim) // 2, len(shim) - 100):
        cut.write_bytes(shim[:size])
        assert elf.missing_export(str(cut), "krex_shim_loaded") is not None, size
    garbled = bytearray(shim)
    garbled[0x28:0x30] = b"\xff" * 8          # e_shoff past the end of the file
    cut.write_bytes(bytes(garbled))
    assert elf.missing_export(str(cut), "krex_shim_loaded") is not None
    with pytest.raises(FileNotFoundError):
        elf.missing_export(str(tmp_path / "none.so"), "krex_shim_loaded")


def test_counts_and_gpu_lists_take_ascii_digits_only(tmp_path):
    """'²'.isdigit() is true but int('²') raises (a traceback, exit 1); int('١') is 1, which the shim refuses.
    Every such value is one line naming what was given, exit status 2."""
    from krex_ctl.environ import check_environment, parse_gpus

    for bad in ("²", "0,²", "١", "1_0"):
        with pytest.raises(KrexCommandError, match="is not a GPU index") as e:
            parse_gpus(bad)
        assert e.value.exit_code == 2
    for env in ({"KREX_GPU": "١"}, {"KREX_WARM_WORKERS": "²"}, {"KREX_RETRY_TAINTED": "²"},
                {"KREX_RETRY_TAINTED": "٣"}):
        with pytest.raises(KrexCommandError, match=list(env)[0]) as e:
            check_environment(env)
        assert e.value.exit_code == 2
    for setting, why in (({"gpus": "²"}, "gpus: '²' is not a GPU index"),
                         ({"gpus": "0-١"}, "gpus: '0-١' is not a GPU index"),
                         ({"reserved_cores": "²"}, "reserved_cores: '²' is not a CPU index"),
                         ({"reserved_cores": {"²": "0"}}, "reserved_cores: '²' is not a GPU index"),
                         ({"warm_workers": "١"}, "warm_workers: must be a JSON number, not the string '١'"),
                         ({"worker_reuse": "1_0"}, "worker_reuse: must be a JSON number, not the string '1_0'"),
                         ({"drain_timeout_s": "١"}, "drain_timeout_s: must be a JSON number, not the string '١'"),
                         ({"metrics": "127.0.0.1:٩٤٦٤"}, "metrics: '127.0.0.1:٩٤٦٤' is not HOST:PORT")):
        f = tmp_path / "c.json"
        f.write_text(json.dumps(setting))
        with pytest.raises(KrexCommandError) as e:
            load(str(f))
        assert e.value.exit_code == 2 and str(e.value).startswith(f"config {f}: {why}"), str(e.value)
        assert "invalid literal" not in str(e.value)
    for flags, why in (({"warm_workers": "١"}, "--warm-workers: must be a whole number, not '١'"),   # a flag's text
                       ({"worker_reuse": "1_0"}, "--worker-reuse: must be a whole number, not '1_0'"),
                       ({"drain_timeout_s": "١"}, "--drain-timeout: must be a number, not '١'")):
        with pytest.raises(KrexCommandError) as e:
            load(None, **flags)
        assert e.value.exit_code == 2 and str(e.value).startswith(why), str(e.value)


def test_hooked_retries_take_ascii_digits_from_0_to_64_and_never_raise(monkeypatch, capsys):
    """KREX_RETRY_TAINTED is read inside a hooked timing: '²' raised ValueError there, and 1000 was taken."""
    from krex_hooks import _region

    getattr(_region, "_warned_retries", set()).clear()
    for value, n in (("", 0), ("0", 0), ("3", 3), ("64", 64)):
        monkeypatch.setenv("KREX_RETRY_TAINTED", value)
        assert _region.retries() == n
    assert capsys.readouterr().err == ""
    for value in ("²", "٣", "65", "1000", "-1", "1_0", "x"):
        monkeypatch.setenv("KREX_RETRY_TAINTED", value)
        assert _region.retries() == 0 and _region.retries() == 0
        assert capsys.readouterr().err == (f"krex: KREX_RETRY_TAINTED={value!r} is not a whole number from 0 to 64: "
                                           "no measurement is taken again\n")      # once per value


def test_a_socket_group_from_the_file_or_a_flag_defaults_the_mode_to_0660_and_keeps_a_given_mode(tmp_path):
    """The mode's default followed only --socket-group (a group from the file left the socket 0600, unusable by
    the group), and --socket-group replaced the file's socket_mode with 0660."""
    f = tmp_path / "c.json"
    for setting, flags, mode in (({}, {}, 0o600), ({"socket_group": "0"}, {}, 0o660), ({}, {"socket_group": "0"}, 0o660),
                                 ({"socket_mode": "0640"}, {"socket_group": "0"}, 0o640),
                                 ({"socket_mode": "0640", "socket_group": "0"}, {}, 0o640),
                                 ({"socket_mode": "0640"}, {"socket_group": "0", "socket_mode": "0600"}, 0o600),
                                 ({"socket_group": "0"}, {"socket_mode": "0600"}, 0o600)):
        f.write_text(json.dumps(setting))
        assert load(str(f), **flags).socket_mode == mode, (setting, flags)


def test_log_level_comes_from_the_flag_then_the_file_then_the_default_given_then_info(tmp_path):
    """krex controller passes KREX_LOG_LEVEL as such a default: it used to be a --log-level flag, over the
    file's log_level, and a bad value was blamed on --log-level."""
    f = tmp_path / "c.json"
    env = {"log_level": ("error", "KREX_LOG_LEVEL")}
    f.write_text(json.dumps({"log_level": "debug"}))
    assert load(str(f), defaults=env).log_level == "debug"
    assert load(str(f), defaults=env, log_level="warning").log_level == "warning"
    assert load(None, defaults=env).log_level == "error"
    assert load(None, defaults={"log_level": (None, "KREX_LOG_LEVEL")}).log_level == "info"
    with pytest.raises(KrexCommandError, match=r"^KREX_LOG_LEVEL: must be one of error, warning, info, debug, "
                                               r"not 'loud'$"):
        load(None, defaults={"log_level": ("loud", "KREX_LOG_LEVEL")})


def test_gpu_indices_of_the_config_file_are_0_to_63(tmp_path):
    """"gpus": [-1] was taken (the controller then warned of a GPU -1 the node does not have), and a reserved_cores
    entry for GPU 99 without a word."""
    f = tmp_path / "c.json"
    for setting, why in (({"gpus": [-1]}, "gpus: GPU indices must be in 0..63, not -1"),
                         ({"gpus": [0, 64]}, "gpus: GPU indices must be in 0..63, not 0,64"),
                         ({"reserved_cores": {"99": "0"}}, "reserved_cores: GPU 99: GPU indices must be in 0..63")):
        f.write_text(json.dumps(setting))
        with pytest.raises(KrexCommandError) as e:
            load(str(f))
        assert e.value.exit_code == 2 and str(e.value) == f"config {f}: {why}"
    f.write_text(json.dumps({"gpus": [0, 63]}))
    assert load(str(f)).gpus == [0, 63]


def test_region_timeout_and_lifecycle_wait_are_read_as_the_shim_reads_them():
    """krex run took KREX_REGION_TIMEOUT=1_0 (Python's float()), which the shim's strtod ignores with a warning (the
    wait was then unbounded), and refused KREX_GATE_LIFECYCLE_WAIT=1e3, which the shim takes. Every value krex run
    takes, the shim takes (shim/region.c, shim/gate.c: strtod over the whole value, then the range)."""
    import ctypes

    from krex_ctl.environ import check_environment, check_region_timeout

    libc = ctypes.CDLL(None)
    libc.strtod.restype, libc.strtod.argtypes = ctypes.c_double, [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]

    def shim_takes(value: str, high: float, low: float = 0.0) -> bool:
        raw = value.encode()
        end = ctypes.c_char_p()
        s = libc.strtod(raw, ctypes.byref(end))
        return not end.value and s >= low and s <= high      # *end == '\0': the whole value read

    def run_takes(check, value) -> bool:
        try:
            check(value)
            return True
        except KrexCommandError:
            return False

    values = ["10", "1.5", ".5", "5.", "1e3", "1E-2", "+3", "0", "-0", "1_0", " 1", "1 ", "inf", "nan", "1e999", "-1",
              "86401", "3601", "١", "1,5", "e3", "1e", "2e3"]
    for v in values:
        took = run_takes(lambda x: check_region_timeout(x, "KREX_REGION_TIMEOUT"), v)
        assert not took or shim_takes(v, 86400, 0.001), v    # the shim's least, as krex run's: 0 is never granted
        waited = run_takes(lambda x: check_environment({"KREX_GATE_LIFECYCLE_WAIT": x}), v)
        assert not waited or shim_takes(v, 3600), v
    for v in ("10", "1.5", ".5", "1e3", "1E-2", "1e-3"):   # what the shim takes, written plainly: taken
        assert run_takes(lambda x: check_region_timeout(x, "KREX_REGION_TIMEOUT"), v), v
    for v in ("1e3", "3600", ".5"):
        assert run_takes(lambda x: check_environment({"KREX_GATE_LIFECYCLE_WAIT": x}), v), v


def test_an_orphaned_warm_worker_is_killed_unless_its_wrapper_came_back_as_a_new_job():
    """pool.release_orphans: a worker checked out for a job that has been gone ORPHAN_S is killed once (through its
    control connection's pidfd); one whose wrapper the controller dropped and which reconnected (a new job with the
    same root process: pid and start time) serves that job now and is left alone."""
    from types import SimpleNamespace

    from krex_ctl import pool

    signalled = []

    class Pidfd:
        def signal(self, sig):
            signalled.append(sig)
            return True

    def job(jid, root=(500, 7)):
        return SimpleNamespace(id=jid, root_pid=root[0], root_start=root[1])

    p = pool.WorkerPool(SimpleNamespace(warm_workers=1), "/nonexistent.sock")
    old, new = job(1), job(2)
    w = pool.Worker(pid=900, key=(0, "python", "fp"), client=SimpleNamespace(pidfd=Pidfd()), state="busy",
                    serving=old)
    p.workers.append(w)
    for t in (0.0, pool.ORPHAN_S + 1):
        p.release_orphans({2: new}, 100.0 + t)              # the same root, reconnected as job 2
    assert w.serving is new and not signalled and w.orphaned_at is None
    for t in (0.0, pool.ORPHAN_S - 1):
        p.release_orphans({3: job(3, root=(501, 7))}, 200.0 + t)
    assert not signalled                                     # gone, but not for long enough yet
    for t in (pool.ORPHAN_S, pool.ORPHAN_S + 5):
        p.release_orphans({3: job(3, root=(501, 7))}, 200.0 + t)
    assert signalled == [signal.SIGKILL]                     # killed once


def test_maps_library_says_unknown_for_a_process_without_maps():
    """A process whose main thread has exited while another runs reads an empty /proc/PID/maps: that is not a
    process without the shim (find_unshimmed reported such a shimmed process as shimless)."""
    import os
    import subprocess
    import sys
    import time

    from krex_ctl import procs

    start, inode = procs.maps_library(os.getpid(), b"libc")      # where: a child forked without exec shares it
    assert start > 0 and inode > 0
    assert procs.maps_library(os.getpid(), b"no-such-library-name") is False
    code = ("import ctypes, threading, time\nthreading.Thread(target=time.sleep, args=(30,), daemon=False).start()\n"
            "print('ready', flush=True)\nctypes.CDLL(None).pthread_exit(None)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while procs.maps_library(p.pid, b"libc") is not None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procs.maps_library(p.pid, b"libc") is None and p.poll() is None
    finally:
        p.kill()
        p.wait()
    assert procs.maps_library(p.pid, b"libc") is None                     # gone
    assert procs.parent(os.getpid()) == os.getppid()
