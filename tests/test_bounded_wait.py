"""Bounded waits: krex.region(name, timeout=S), krex_region_begin_timeout / KREX_REGION_TIMEOUT in C and
`krex run --region-timeout S`. On timeout the request is cancelled at the controller; Python raises
RegionTimeout, C gets -3, the hooks time unprotected (in strict mode they raise krex.StrictError); the report
marks the region not_granted."""

import subprocess
import sys

from conftest import SNIP, report_of, stderr_until, wait_for


def hold_gpu(krex, seconds=30, release=None):
    """Another job holds GPU 0's region for a while (or until the file release exists): (its Popen), once
    granted."""
    hold = {"SNIPPET_HOLD_FILE": str(release)} if release else {"SNIPPET_HOLD_US": str(int(seconds * 1e6))}
    holder = krex.popen([SNIP / "region"], env={"SNIPPET_REGIONS": "1", "SNIPPET_N": "1", **hold})
    wait_for(lambda: any(g["owner"] and g["owner"]["state"] == "held" for g in krex.status()["gpus"]),
             timeout=60, what="the holder's region granted")
    return holder


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
    finally:
        holder.kill()
        holder.wait()


def test_c_begin_returns_minus_3_under_region_timeout(krex):
    krex.start_controller()
    release = krex.dir / "release"
    holder = hold_gpu(krex, release=release)   # its launches after the refusal wait for the holder's region to end
    try:
        rep = krex.dir / "c.json"
        full = [sys.executable, "-m", "krex_ctl", "run", "--region-timeout", "0.5", "--report", str(rep), "--",
                str(SNIP / "region")]
        # its context made at once (the context gate, on by default, would hold it until the holder's region
        # ended: a wait at a gate, which --region-timeout does not bound, as it does not bound one at a launch)
        p = subprocess.Popen(full, env=dict(krex.env, SNIPPET_REGIONS="1", SNIPPET_N="1", KREX_GATE_CONTEXTS="0"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        told = stderr_until(p, "not granted in time")      # never silent; said as the wait is given up
        release.touch()
        out, err = p.communicate(timeout=120)
        r = subprocess.CompletedProcess(full, p.returncode, out, told + err)
        assert r.returncode == 0, r.stderr
        assert "begin=-3" in r.stdout and "exclusive=0" in r.stdout, r.stdout
        assert "not granted in time" in r.stderr
        assert queued(krex) == 0
        regions = report_of(rep)["regions"]
        assert len(regions) == 1 and "not_granted" in regions[0]["taints"], regions
    finally:
        holder.kill()
        holder.wait()


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


def test_a_grant_within_the_timeout_is_an_ordinary_region(krex):
    krex.start_controller()
    r = krex.python("import krex\nwith krex.region('quick', timeout=30) as r:\n    pass\nprint(r.granted, r.exclusive)\n")
    assert r.returncode == 0 and r.stdout.split() == ["True", "True"], r.stderr


def test_bad_region_timeout_is_one_line_exit_2(krex):
    for args, env in ((["--region-timeout", "soon"], {}), ([], {"KREX_REGION_TIMEOUT": "-1"})):
        r = subprocess.run([sys.executable, "-m", "krex_ctl", "run", *args, "--", "true"],
                           env=dict(krex.env, **env), capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert r.stderr.startswith("krex: ") and "seconds" in r.stderr
