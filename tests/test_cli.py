"""`krex run`, `krex status`, `krex controller` from the outside: exit codes, reports, one-line errors."""

import json
import os
import signal
import subprocess
import sys
import time

from conftest import SNIP, report_of


def krex_cli(krex, *args, timeout=60, env_extra=None):
    return subprocess.run([sys.executable, "-m", "krex_ctl", *args], env=dict(krex.env, **(env_extra or {})),
                          capture_output=True, text=True, timeout=timeout)


def test_exit_status_passes_through(krex, tmp_path):
    krex.start_controller()
    assert krex.run(["sh", "-c", "exit 3"]).returncode == 3
    out = krex.run(["sh", "-c", "kill -TERM $$"])
    assert out.returncode == 128 + signal.SIGTERM
    assert "krex: command killed by SIGTERM" in out.stderr
    out = krex.run(["no-such-command-krex"])
    assert out.returncode == 127 and out.stderr.strip() == "krex: command not found: no-such-command-krex"
    out = krex.run([tmp_path])
    assert out.returncode == 126 and out.stderr.strip() == f"krex: is a directory: {tmp_path}"
    script = tmp_path / "bad-interpreter"
    script.write_text("#!/no/such/interpreter-krex\n")
    script.chmod(0o755)
    out = krex.run([script])        # the file is there: not "command not found"
    assert out.returncode == 127 and out.stderr.strip() == \
        f"krex: cannot run {script}: its interpreter (the #! line) or loader is missing", out.stderr


def test_report_contract(krex, tmp_path):
    krex.start_controller()
    rep = tmp_path / "r.json"
    out = krex.run([SNIP / "region"], report=rep, env={"SNIPPET_REGIONS": "2", "SNIPPET_N": "3"})
    assert out.returncode == 0, out.stderr
    r = report_of(rep)
    assert r["version"] == 1 and r["exit_code"] == 0
    assert r["command"] == [str(SNIP / "region")]
    assert r["launches"] == 6 and r["context_creations"] == 1 and isinstance(r["waited_ns"], int)
    assert len(r["regions"]) == 2
    for reg in r["regions"]:
        assert reg["name"] == "timed" and reg["gpu"] == [0]
        assert 0 < reg["requested_ns"] <= reg["granted_ns"] <= reg["ended_ns"]
        # where the wait for the grant went (docs/reference/report.md; bench/throughput.py's region_phases_s)
        phases = [reg[f"{k}_ns"] for k in ("queued", "drain", "settle", "freeze", "isolate", "attest")]
        assert all(isinstance(x, int) and x >= 0 for x in phases), reg
        assert sum(phases) <= reg["granted_ns"] - reg["requested_ns"] + 5_000_000, reg


def test_launches_are_summed_over_every_process_of_the_command(krex, tmp_path):
    krex.start_controller()
    rep = tmp_path / "r.json"
    script = f"{SNIP / 'direct'} & {SNIP / 'direct'} & SNIPPET_N=3 {SNIP / 'direct'}; wait"
    out = krex.run(["sh", "-c", script], report=rep)
    assert out.returncode == 0
    r = report_of(rep)
    assert r["launches"] == 13 and r["context_creations"] == 3 and r["processes"] >= 3


def test_gpu_option_pins_the_command(krex, tmp_path):
    krex.start_controller()
    full = [sys.executable, "-m", "krex_ctl", "run", "--gpu", "1", "--report", str(tmp_path / "r.json"), "--",
            str(SNIP / "region")]
    out = subprocess.run(full, env=dict(krex.env, SNIPPET_REGIONS="1"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert report_of(tmp_path / "r.json")["regions"][0]["gpu"] == [1]
    env_probe = [sys.executable, "-m", "krex_ctl", "run", "--gpu", "1", "--", "sh", "-c",
                 "echo $CUDA_VISIBLE_DEVICES $HIP_VISIBLE_DEVICES $KREX_GPU"]
    out = subprocess.run(env_probe, env=krex.env, capture_output=True, text=True, timeout=60)
    # CUDA by the GPU's UUID (the controller knows it from NVML, here the fake one): no CUDA device order
    # or renumbering can make it another GPU
    assert out.stdout.split() == ["GPU-6b726578-0000-0000-0000-000000000001", "1", "1"]
    without_nvml = dict(krex.env, KREX_NVML="/nonexistent/libnvidia-ml.so.1")
    krex.stop()
    krex.env = without_nvml
    krex.start_controller()
    out = subprocess.run(env_probe, env=krex.env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["1", "1", "1"]


def test_bad_cli_input_is_one_line_and_nonzero(krex, tmp_path):
    out = krex_cli(krex, "run", "--gpu", "0", "--gpu", "1", "--", "true")
    assert out.returncode == 2 and out.stderr.strip() == "krex: --gpu given 2 times (0, 1): name the GPUs once, as --gpu 0,1"
    out = krex_cli(krex, "run", "--gpu", "99", "--", "true")
    assert out.returncode == 2 and "--gpu" in out.stderr
    out = krex_cli(krex, "run")
    assert out.returncode == 2
    out = krex_cli(krex)                       # a bare krex: the help as --help has it, no "krex: Usage:"
    assert out.returncode == 2 and out.stderr.startswith("Usage: krex [OPTIONS] COMMAND"), out.stderr
    assert "..." not in out.stderr.split("Commands:")[1], out.stderr      # every command's summary whole
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    out = krex_cli(krex, "controller", "--socket", str(tmp_path / "c.sock"), "--config", str(bad))
    assert out.returncode == 2 and out.stderr.strip().startswith("krex: config") and len(out.stderr.strip().splitlines()) == 1
    bad.write_text(json.dumps({"frobnicate": 1}))
    out = krex_cli(krex, "controller", "--socket", str(tmp_path / "c.sock"), "--config", str(bad))
    assert out.returncode == 2 and "unknown setting 'frobnicate'" in out.stderr
    out = krex_cli(krex, "controller", "--socket", str(tmp_path / "c.sock"), "--reserved-cores", "3-1")
    assert out.returncode == 2 and "'3-1' is not a CPU range: it runs backwards" in out.stderr
    out = krex_cli(krex, "status", "--socket", str(tmp_path / "none.sock"))
    assert out.returncode == 3 and out.stderr.startswith("krex: no krex controller answers at")
    plain = tmp_path / "plain"
    plain.write_text("")
    out = krex_cli(krex, "status", "--socket", str(plain))       # said "(Connection refused)"
    assert out.returncode == 3 and out.stderr.strip() == f"krex: no krex controller answers at {plain} (not a socket)"
    long = tmp_path / ("x" * 120 + ".sock")
    out = krex_cli(krex, "status", "--socket", str(long))        # said "(None)"
    assert out.returncode == 3 and out.stderr.strip().endswith("(AF_UNIX path too long)"), out.stderr
    for command in ("controller", "status"):     # an empty --socket fell back to the default socket without a word
        out = krex_cli(krex, command, "--socket", "")
        assert out.returncode == 2 and out.stderr.strip() == "krex: --socket: the path is empty (an unset variable?)"


def test_status_and_version(krex):
    krex.start_controller()
    out = krex_cli(krex, "status")
    assert out.returncode == 0 and out.stdout.startswith("controller pid")
    assert ", freeze policy all" in out.stdout.splitlines()[0]        # the fixture's (the default is busy)
    assert "0 client(s), 0 job(s)" in out.stdout                    # its own connection is not a client
    st = json.loads(krex_cli(krex, "status", "--json").stdout)
    assert set(st) == {"controller", "gpus", "clients", "client_roles", "jobs", "counters", "workers", "zygotes",
                       "zygotes_failed", "placement", "leaving", "warm_pool_clients", "command_jobs"}
    assert st["client_roles"] == {"cli": 1} and st["warm_pool_clients"] == st["command_jobs"] == 0
    from krex_ctl.config import default_reserved       # the cores the default reserves, shown beside the config's {}
    assert st["controller"]["reserved_cores_default"] == sorted(default_reserved(os.sched_getaffinity(0)))
    out = krex_cli(krex, "--version")
    assert out.returncode == 0 and out.stdout.startswith("krex, version ")


def test_embedded_controller_starts_on_demand_with_private_socket(tmp_path):
    from conftest import new_user_env

    env = dict(new_user_env(tmp_path), XDG_RUNTIME_DIR=str(tmp_path))
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--", str(SNIP / "region")],
                         env=dict(env, SNIPPET_REGIONS="1"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "begin=0 end=0" in out.stdout
    sock = tmp_path / "krex" / "krex.sock"
    assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
    assert oct(os.stat(tmp_path / "krex").st_mode & 0o777) == "0o700"
    st = subprocess.run([sys.executable, "-m", "krex_ctl", "status", "--json"], env=env, capture_output=True,
                        text=True, timeout=30)
    pid = json.loads(st.stdout)["controller"]["pid"]
    os.kill(pid, signal.SIGTERM)


def test_report_of_a_long_job_holds_every_region(krex, tmp_path):
    """More regions than fit one reply frame: the report pages through them."""
    krex.start_controller()
    rep = tmp_path / "r.json"
    out = krex.run([SNIP / "region"], report=rep, env={"SNIPPET_REGIONS": "450", "SNIPPET_N": "1", "SNIPPET_US": "10"},
                   timeout=120)
    assert out.returncode == 0, out.stderr
    regions = report_of(rep)["regions"]
    assert len(regions) == 450
    assert [r["requested_ns"] for r in regions] == sorted(r["requested_ns"] for r in regions)


def test_report_path_is_checked_before_the_command_runs(krex, tmp_path):
    """A report that cannot be written is said before anything runs (it used to run, then fail with rc 0)."""
    krex.start_controller()
    marker = tmp_path / "ran"
    (tmp_path / "a-file").write_text("")
    for bad, why in ((tmp_path / "no" / "such" / "dir" / "r.json", "does not exist"), (tmp_path, "is a directory"),
                     (tmp_path / "a-file" / "r.json", "a-file is not a directory"),
                     ("", "the path is empty")):
        out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--report", str(bad), "--", "sh", "-c",
                              f"touch {marker}; exit 5"], env=krex.env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 2 and not marker.exists()
        assert out.stderr.strip().splitlines() == [out.stderr.strip()] and why in out.stderr
    assert krex.run(["true"], report=tmp_path / "ok.json").returncode == 0
    assert [p.name for p in tmp_path.iterdir() if "krex-check" in p.name] == []   # the trial file went again
    # the value left out: `--report -- cmd` wrote the report to a file named "--", `--report --quiet` to "--quiet"
    for argv in (["--report", "--", "sh", "-c", f"touch {marker}"],
                 ["--report", "--quiet", "--", "sh", "-c", f"touch {marker}"]):
        out = subprocess.run([sys.executable, "-m", "krex_ctl", "run"] + argv, env=krex.env, capture_output=True,
                             text=True, timeout=60, cwd=tmp_path)
        assert out.returncode == 2 and not marker.exists(), out.stderr
        assert "is an option, not a file" in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert not (tmp_path / "--").exists() and not (tmp_path / "--quiet").exists()
    out = subprocess.run([sys.executable, "-m", "krex_ctl", "trace", str(tmp_path / "ok.json"), "-o", "--"],
                         env=krex.env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert out.returncode == 2 and "is an option, not a file" in out.stderr and not (tmp_path / "--").exists()


def test_report_is_not_written_through_a_planted_link(krex, tmp_path):
    """The old `FILE.tmp` name was predictable: a link planted there made krex overwrite its target."""
    krex.start_controller()
    victim = tmp_path / "victim"
    victim.write_text("precious")
    rep = tmp_path / "r.json"
    (tmp_path / "r.json.tmp").symlink_to(victim)
    out = krex.run(["true"], report=rep)
    assert out.returncode == 0, out.stderr
    assert victim.read_text() == "precious" and report_of(rep)["exit_code"] == 0
    assert not list(tmp_path.glob(".r.json.*"))      # no temporary file left behind either


def test_report_never_replaces_a_file_that_is_not_a_report(krex, tmp_path):
    """`--report bench.py` (a typo) used to replace the script with the report, as it replaced any file."""
    krex.start_controller()
    marker = tmp_path / "ran"
    precious = tmp_path / "bench.py"
    precious.write_text("precious\n")
    link = tmp_path / "link.json"
    link.symlink_to(precious)
    for path, why in ((precious, "exists and is not a krex report; not replacing it"),
                      (link, f"is a link to {precious}, which is not a krex report; not writing through it")):
        out = krex.run(["touch", marker], report=path)
        assert out.returncode == 2 and not marker.exists(), out.stderr
        assert out.stderr.strip() == f"krex: --report {path}: {why}"
        assert precious.read_text() == "precious\n"
    rep = tmp_path / "r.json"              # an earlier run's report is replaced, directly or through a link
    assert krex.run(["sh", "-c", "exit 3"], report=rep).returncode == 3
    assert krex.run(["true"], report=rep).returncode == 0 and report_of(rep)["exit_code"] == 0
    link.unlink()
    link.symlink_to(rep)
    assert krex.run(["sh", "-c", "exit 4"], report=link).returncode == 4
    assert link.is_symlink() and report_of(rep)["exit_code"] == 4
    empty = tmp_path / "empty.json"        # mktemp's: nothing in it to lose
    empty.write_text("")
    assert krex.run(["true"], report=empty).returncode == 0 and report_of(empty)["exit_code"] == 0
    late = tmp_path / "late.json"          # made by the command itself after the check: left alone, status 1
    out = krex.run(["sh", "-c", f"echo mine > {late}"], report=late)
    assert out.returncode == 1 and late.read_text() == "mine\n"
    assert f"krex: cannot write the report {late}: exists and is not a krex report" in out.stderr


def test_unknown_option_is_refused_not_run(krex, tmp_path):
    out = krex_cli(krex, "run", "--bogus", "true")
    assert out.returncode == 2 and out.stderr.startswith("krex run: No such option") and "--bogus" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
    out = krex_cli(krex, "run", "--report")          # the parser's error, which came with a bare "krex:"
    assert out.returncode == 2 and out.stderr.strip() == "krex run: Option '--report' requires an argument."
    out = krex_cli(krex, "run", "--gpu", "x", "--", "true")
    assert out.returncode == 2 and out.stderr.strip().startswith("krex: --gpu: 'x' is not a GPU index")
    out = krex_cli(krex, "run", "--overlap", "sm_target=70000", "--", "true")   # the limit is said, not just refused
    assert out.returncode == 2 and out.stderr.strip() == ("krex: --overlap: 'sm_target=70000' is not a comma list of "
                                                          "priority, shape=K (K 1-32), sm_target=N (N 1-65535), noguard")
    help_text = " ".join(krex_cli(krex, "run", "--help").stdout.split())
    assert "sm_target=N, noguard (overrides KREX_OVERLAP" in help_text


def test_bad_krex_variables_stop_the_run(krex, tmp_path):
    krex.start_controller()
    marker = tmp_path / "ran"
    for var, value, message in (("KREX_GATE_CONTEXTS", "false-ish", "KREX_GATE_CONTEXTS must be 1, true, yes or on, or 0"),
                                ("KREX_GPU", "abc", "KREX_GPU: 'abc' is not a GPU index"),
                                ("KREX_HOOKS", "tritonn", "KREX_HOOKS: unknown hook tritonn")):
        out = krex.run(["touch", marker], env={var: value})
        assert out.returncode == 2 and not marker.exists(), (var, out.stderr)
        assert out.stderr.strip() == f"krex: {out.stderr.strip()[6:]}" and message in out.stderr
    # --cold uses no warm worker, but KREX_WARM_WAIT was then not checked at all (rc 0)
    out = krex_cli(krex, "run", "--cold", "--", "touch", str(marker), env_extra={"KREX_WARM_WAIT": "-1"})
    assert out.returncode == 2 and not marker.exists(), out.stderr
    assert out.stderr.strip() == "krex: KREX_WARM_WAIT must be a number of seconds (0 to 3600), not '-1'"


def test_a_shim_that_is_not_krex_s_is_refused(krex, tmp_path):
    """KREX_SHIM at another library (or any file) ran the command with nothing counting its launches: no summary,
    no `timings not protected`, and --strict exited 0."""
    from conftest import BUILD

    krex.start_controller()
    marker = tmp_path / "ran"
    text = tmp_path / "notes.txt"
    text.write_text("not a library\n")
    for shim, why in ((BUILD / "fakes" / "libnvidia-ml.so.1", "does not export krex_shim_loaded"),
                      (text, "not an ELF file"), (tmp_path / "missing.so", "no such file"),
                      (tmp_path, "not a regular file")):
        out = krex_cli(krex, "run", "--strict", "--", "touch", str(marker), env_extra={"KREX_SHIM": str(shim)})
        assert out.returncode == 2 and not marker.exists(), out.stderr
        assert out.stderr.strip() == (f"krex: KREX_SHIM={shim} is not a krex shim: {why}; set it to krex's "
                                      "libkrex.so, or unset it")
    out = krex_cli(krex, "run", "--", str(SNIP / "region"), env_extra={"KREX_SHIM": str(BUILD / "libkrex.so"),
                                                                    "SNIPPET_REGIONS": "1"})
    assert out.returncode == 0 and "krex: 1 region (1 exclusive" in out.stderr, out.stderr
    # a krex shim of another build whose counters file layout differs: it would count nothing in the job's file,
    # and --strict would pass a run of unprotected launches
    older = tmp_path / "libkrex-older.c"
    older.write_text("int krex_shim_loaded(void) { return 1; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(tmp_path / "libkrex-older.so"), str(older)], check=True)
    out = krex_cli(krex, "run", "--strict", "--", "touch", str(marker),
                   env_extra={"KREX_SHIM": str(tmp_path / "libkrex-older.so")})
    assert out.returncode == 2 and not marker.exists(), out.stderr
    assert out.stderr.startswith(f"krex: KREX_SHIM={tmp_path / 'libkrex-older.so'} is a krex shim of another version: "
                                 "its counters file layout is not this krex's (4)"), out.stderr


def test_non_ascii_digits_are_one_line_not_a_traceback(krex, tmp_path):
    """'²'.isdigit() is true, int('²') raises: --gpu ², KREX_GPU=², KREX_WARM_WORKERS=² and a config's "gpus": "²"
    ended in a Python traceback, exit status 1."""
    marker = tmp_path / "ran"
    for args, env, start in ((["--gpu", "²"], {}, "krex: --gpu: '²' is not a GPU index"),
                             (["--gpu", "0,²"], {}, "krex: --gpu: '0,²' is not a GPU index"),
                             ([], {"KREX_GPU": "²"}, "krex: KREX_GPU: '²' is not a GPU index"),
                             ([], {"KREX_GPU": "١"}, "krex: KREX_GPU: '١' is not a GPU index"),
                             ([], {"KREX_WARM_WORKERS": "²"}, "krex: KREX_WARM_WORKERS must be a whole number"),
                             ([], {"KREX_RETRY_TAINTED": "²"}, "krex: KREX_RETRY_TAINTED must be a whole number")):
        out = krex_cli(krex, "run", *args, "--", "touch", str(marker), env_extra=env)
        assert out.returncode == 2 and not marker.exists(), out.stderr
        assert out.stderr.startswith(start) and len(out.stderr.strip().splitlines()) == 1, out.stderr
    cfg = tmp_path / "c.json"
    for setting in ({"gpus": "²"}, {"reserved_cores": "²"}, {"reserved_cores": {"²": "0"}}):
        cfg.write_text(json.dumps(setting))
        out = krex_cli(krex, "controller", "--socket", str(tmp_path / "c.sock"), "--config", str(cfg))
        assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
        assert out.stderr.startswith(f"krex: config {cfg}: {list(setting)[0]}: ") and "invalid literal" not in out.stderr


def test_krex_trace_names_a_malformed_report_and_never_writes_through_a_link_to_a_non_trace(krex, tmp_path):
    """A report whose regions were not region records, and -o at a dangling link, ended in a traceback (exit 1);
    -o at a link to any file wrote through it; -o "" said `-o : is a directory`."""
    rep = tmp_path / "r.json"
    rep.write_text(json.dumps({"version": 1, "command": ["bench"], "exit_code": 0, "regions": [
        {"name": "t", "gpu": [0], "requested_ns": 1000, "granted_ns": 2000, "ended_ns": 3000, "pid": 5}]}))
    out_file = tmp_path / "t.json"
    for regions, where in (([1, 2], "regions[0]"), ([{}], "regions[0]"),
                           ([json.loads(rep.read_text())["regions"][0], {"granted_ns": "x", "ended_ns": 1}],
                            "regions[1]")):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"version": 1, "regions": regions}))
        for args in ([str(bad)], [str(rep), str(bad)]):
            out = krex_cli(krex, "trace", *args, "-o", str(out_file))
            assert out.returncode == 2 and not out_file.exists(), out.stderr
            assert out.stderr.strip() == f"krex: {bad}: not a krex report ({where} is not a region record)"
    precious = tmp_path / "precious.txt"
    precious.write_text("precious\n")
    link = tmp_path / "link.json"
    for target, why in ((tmp_path / "no" / "such", f"is a link to {tmp_path / 'no' / 'such'}, which does not exist"),
                        (precious, f"is a link to {precious}, which is not a krex trace")):
        link.symlink_to(target)
        out = krex_cli(krex, "trace", str(rep), "-o", str(link))
        assert out.returncode == 2 and out.stderr.strip() == f"krex: -o {link}: {why}; not writing through it"
        assert precious.read_text() == "precious\n" and not (tmp_path / "no").exists()
        link.unlink()
    assert krex_cli(krex, "trace", str(rep), "-o", str(out_file)).returncode == 0
    link.symlink_to(out_file)                  # a link to a trace krex wrote: written through
    out = krex_cli(krex, "trace", str(rep), str(rep), "-o", str(link))
    assert out.returncode == 0 and link.is_symlink() and json.loads(out_file.read_text())["otherData"]["reports"] == "2"
    out = krex_cli(krex, "trace", str(rep), "-o", "")
    assert out.returncode == 2 and out.stderr.strip() == ("krex: -o: the path is empty (an unset variable?); '-' is "
                                                          "standard output")


def serve(krex, *args, env=None, log=None):
    """A controller of the test's own, started with args (stopped by stop())."""
    return subprocess.Popen([sys.executable, "-m", "krex_ctl", "controller", "--no-cpu-isolation", *map(str, args)],
                            env=krex.env if env is None else env, stdout=subprocess.DEVNULL,
                            stderr=open(log or krex.dir / "serve.log", "ab"))


def stop(p):
    p.terminate()
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def test_the_config_files_socket_is_served_when_no_flag_or_variable_names_one(krex, tmp_path):
    """The config key `socket` had no effect: the per-user socket was served (and its state file used)."""
    from conftest import answers, wait_for

    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"socket": str(tmp_path / "cfg.sock")}))
    env = {k: v for k, v in krex.env.items() if k != "KREX_SOCKET"}
    for args, extra, served in ((["--config", conf], {}, "cfg.sock"),
                                (["--config", conf], {"KREX_SOCKET": str(tmp_path / "env.sock")}, "env.sock"),
                                (["--socket", tmp_path / "flag.sock", "--config", conf],
                                 {"KREX_SOCKET": str(tmp_path / "env.sock")}, "flag.sock")):
        p = serve(krex, *args, env=dict(env, **extra))
        try:
            wait_for(lambda: answers(tmp_path / served) or p.poll() is not None, what=served)
            assert p.poll() is None and (tmp_path / f"{served}.lock").exists(), (krex.dir / "serve.log").read_text()
            others = {"cfg.sock", "env.sock", "flag.sock"} - {served}
            assert not any((tmp_path / o).exists() for o in others) and not (tmp_path / "krex").exists()
        finally:
            stop(p)


def test_socket_mode_and_group_combine_from_the_file_and_the_command_line(krex, tmp_path):
    """A config's socket_group left the socket 0600 (the group could not use it); --socket-group on the command
    line (as packaging/krex-controller.service passes it) replaced the config's socket_mode with 0660."""
    from conftest import answers, wait_for

    import grp

    group = grp.getgrgid(os.getgid()).gr_name
    conf = tmp_path / "c.json"
    for setting, args, mode in (({"socket_group": group}, [], 0o660),
                                ({"socket_mode": "0640"}, ["--socket-group", group], 0o640)):
        conf.write_text(json.dumps(setting))
        sock = tmp_path / "g.sock"
        p = serve(krex, "--socket", sock, "--config", conf, *args)
        try:
            wait_for(lambda: answers(sock) or p.poll() is not None, what="controller")
            assert p.poll() is None and oct(os.stat(sock).st_mode & 0o777) == oct(mode), setting
        finally:
            stop(p)


def test_the_config_files_log_level_wins_over_krex_log_level(krex, tmp_path):
    """KREX_LOG_LEVEL was copied into --log-level, which overrides the file's log_level; a bad value was named
    as --log-level, which nobody had given."""
    from conftest import answers, wait_for

    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"log_level": "debug"}))
    sock, log = tmp_path / "l.sock", tmp_path / "l.log"
    p = serve(krex, "--socket", sock, "--config", conf, env=dict(krex.env, KREX_LOG_LEVEL="error"), log=log)
    try:
        wait_for(lambda: answers(sock) or p.poll() is not None, what="controller")
        # the file's debug, not the variable's error: INFO lines are logged
        wait_for(lambda: f"INFO: serving {sock}" in log.read_text() or p.poll() is not None, what="log line")
        assert p.poll() is None
    finally:
        stop(p)
    out = krex_cli(krex, "controller", "--socket", str(sock), env_extra={"KREX_LOG_LEVEL": "loud"})
    assert out.returncode == 2 and out.stderr.strip() == ("krex: KREX_LOG_LEVEL: must be one of error, warning, "
                                                          "info, debug, not 'loud'")


def test_a_state_file_nobody_can_write_or_another_controller_writes_is_refused(krex, tmp_path):
    """A --state-file in a missing directory was taken: no freeze could be recorded, so freezing was off for the
    node with an error in the log alone. One a live controller writes was taken too: the second controller
    resumed the first one's frozen processes inside its region and removed its record."""
    from conftest import answers, wait_for

    missing = tmp_path / "nodir" / "k.state"
    out = krex_cli(krex, "controller", "--socket", str(tmp_path / "a.sock"), "--state-file", str(missing))
    assert out.returncode == 2 and out.stderr.strip() == \
        f"krex: the state file {missing}: the directory {missing.parent} does not exist"
    assert not (tmp_path / "a.sock").exists() and not (tmp_path / "a.sock.lock").exists()
    out = krex_cli(krex, "controller", "--socket", str(missing.parent / "k.sock"))   # the state file beside it:
    assert out.returncode == 2 and out.stderr.strip() == \
        f"krex: the socket {missing.parent / 'k.sock'}: the directory {missing.parent} does not exist"
    state = tmp_path / "shared.state"
    sock = tmp_path / "first.sock"
    p = serve(krex, "--socket", sock, "--state-file", state, log=tmp_path / "first.log")
    try:
        wait_for(lambda: answers(sock), what="the first controller")
        assert krex_cli(krex, "status", "--socket", str(sock)).returncode == 0    # past its start (and its resume)
        # nobody frozen: no state file, yet the first controller owns the name (it was taken then)
        out = krex_cli(krex, "controller", "--socket", str(tmp_path / "second.sock"), "--state-file", str(state))
        assert out.returncode == 2 and out.stderr.strip() == (
            f"krex: --state-file {state}: the controller pid {p.pid} records its frozen processes there; each "
            "controller needs a state file of its own"), out.stderr
        assert not (tmp_path / "second.sock").exists()
        state.write_text(json.dumps({"controller_pid": p.pid, "frozen": [[os.getpid(), None]]}))   # as it writes
        state.chmod(0o600)
        out = krex_cli(krex, "controller", "--socket", str(tmp_path / "second.sock"), "--state-file", str(state))
        assert out.returncode == 2 and out.stderr.strip() == (
            f"krex: --state-file {state}: the controller pid {p.pid} records its frozen processes there; each "
            "controller needs a state file of its own"), out.stderr
        assert json.loads(state.read_text())["controller_pid"] == p.pid      # its record left as it was
    finally:
        stop(p)


def test_freeze_policy_on_the_command_line_wins_over_freeze_false_in_the_file(krex, tmp_path):
    from conftest import answers, wait_for

    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"freeze": False}))
    sock = tmp_path / "f.sock"
    p = serve(krex, "--socket", sock, "--config", conf, "--freeze-policy", "all", log=tmp_path / "f.log")
    try:
        wait_for(lambda: answers(sock), what="controller")
        out = krex_cli(krex, "status", "--socket", str(sock))
        assert out.returncode == 0 and out.stdout.splitlines()[0].endswith("freeze policy all"), out.stdout
    finally:
        stop(p)


def test_an_unknown_socket_group_from_the_config_file_is_not_blamed_on_a_flag(krex, tmp_path):
    conf = tmp_path / "g.json"
    conf.write_text(json.dumps({"socket_group": "no-such-group-krex"}))
    out = krex_cli(krex, "controller", "--socket", str(tmp_path / "g.sock"), "--config", str(conf))
    assert out.returncode == 2 and out.stderr.strip() == (f"krex: config {conf}: socket_group: no group named "
                                                          "'no-such-group-krex' on this node")


def test_reserved_cores_of_a_gpu_not_managed_are_named_at_start(krex, tmp_path):
    from conftest import answers, wait_for

    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"gpus": "0", "reserved_cores": {"1": str(sorted(os.sched_getaffinity(0))[-1])}}))
    sock, log = tmp_path / "r.sock", tmp_path / "r.log"
    p = serve(krex, "--socket", sock, "--config", conf, log=log)
    try:
        wait_for(lambda: answers(sock) or p.poll() is not None, what="controller")
        assert p.poll() is None
        assert ("WARNING: reserved_cores names GPU(s) 1, which this controller does not manage (gpus 0): not used"
                in log.read_text())
    finally:
        stop(p)


def test_gate_flags_accept_words(krex, tmp_path):
    """KREX_GATE_CONTEXTS=false used to switch the gate on (anything but "0" did): with the context, memory and
    exit gates off in words, a process that only makes a context and allocates is done while another job's
    region is still held."""
    krex.start_controller()
    release = tmp_path / "release"           # the other job's region is held until the test is done with it
    hold = krex.held_region(release=release, SNIPPET_N="5")
    out = krex.run([SNIP / "churn"], env={"KREX_GATE_CONTEXTS": "false", "KREX_GATE_MEMORY": "off",
                                          "KREX_GATE_EXIT": "no", "SNIPPET_MB": "1", "SNIPPET_MS": "0"})
    assert out.returncode == 0, out.stderr
    assert any(g["owner"] and g["owner"]["state"] == "held" for g in krex.status()["gpus"])   # it did not wait
    release.touch()
    hold.communicate(timeout=30)


def test_sigint_to_the_wrapper_alone_reaches_the_command(krex, tmp_path):
    """A SIGINT sent to the wrapper (not from a terminal) used to be ignored: the command ran on."""
    krex.start_controller()
    script = "import time, sys\ntry:\n    time.sleep(60)\nexcept KeyboardInterrupt:\n    sys.exit(42)\n"
    p = krex.popen([sys.executable, "-c", script])
    from conftest import wait_for

    wait_for(lambda: any("time.sleep(60)" in open(f"/proc/{c}/cmdline").read().replace("\0", " ")
                         for c in _children(p.pid)), what="command started")
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=20)
    assert p.returncode == 42, err


def _children(pid):
    from krex_ctl.procs import descendants

    return descendants(pid)


def test_sigkill_of_the_wrapper_takes_the_command_with_it(krex, tmp_path):
    krex.start_controller()
    p = krex.popen(["sleep", "60"])
    from conftest import proc_state, wait_for

    kids = wait_for(lambda: [c for c in _children(p.pid) if open(f"/proc/{c}/comm").read().strip() == "sleep"],
                    what="command started")
    p.kill()
    p.wait()
    # gone or a zombie (proc_state: None once /proc has no entry; no window between a check and a read)
    wait_for(lambda: proc_state(kids[0]) in (None, "Z"), timeout=5, what="command gone")


def test_status_names_the_cores_a_gpu_without_an_entry_of_its_own_reserves(krex):
    """`--reserved-cores 0` (every GPU's): status said the default's cores beside the config's {"*": [0]}."""
    cpu = sorted(os.sched_getaffinity(0))[0]
    krex.start_controller("--reserved-cores", str(cpu))
    st = json.loads(krex_cli(krex, "status", "--json").stdout)
    assert st["controller"]["config"]["reserved_cores"] == {"*": [cpu]}
    assert st["controller"]["reserved_cores_default"] == [cpu]
