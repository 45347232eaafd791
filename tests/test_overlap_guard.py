"""The overlap guard (shim/guard.c, shim/guard_rule.c): its schedule and decision rule alone (the guard_rule
snippet, compiled from the shim's own source), then real processes on the fake driver, where occupancy costs or
saves time (KREX_FAKE_OCC_US): the guard settles on off where padding makes compute slower and on where it makes
it faster, `noguard` keeps the raw controls, and a program without communication kernels is left alone."""

import subprocess

import pytest

from conftest import SNIP

RULE = SNIP / "guard_rule"


def rule(*args: str) -> str:
    out = subprocess.run([str(RULE), *args], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def constants() -> dict:
    words = rule("constants").split()
    return {k: float(v) for k, v in zip(words[::2], words[1::2])}


def choose(off, on) -> tuple[str, float]:
    arm, margin = rule("choose", ",".join(map(str, off)), ",".join(map(str, on))).split()
    return arm, float(margin)


def test_the_exploration_is_abba_with_a_settling_epoch_after_each_switch():
    # o/i: off/on, not measured; 0/1 measured; x: exploits the arm chosen
    assert rule("schedule", "0") == "o00i1111o00" + "x" * 117
    assert rule("schedule", "1") == "i11o0000i11" + "x" * 117       # a cycle that exploited on explores off


def test_the_exploration_costs_under_one_percent_where_on_is_up_to_25_percent_slower():
    c = constants()
    on_share = rule("schedule", "0").count("1") / c["period"] + rule("schedule", "0").count("i") / c["period"]
    assert on_share == 5 / 128
    for slower in (0.08, 0.25):          # 8%: the worst control measured on the H200
        assert slower * on_share < 0.01


@pytest.mark.parametrize("off,on,arm", [
    ([4, 4, 4, 4], [2, 2, 2, 2], "on"),                        # on clearly faster
    ([4, 4, 4, 4], [3.9, 3.9, 3.9, 3.9], "on"),                # 2.5% faster, no spread: beyond the 1% margin
    ([4, 4, 4, 4], [3.98, 3.98, 3.98, 3.98], "off"),           # 0.5% faster: within the margin
    ([4, 4, 4, 4], [4, 4, 4, 4], "off"),                       # a tie: off
    ([4, 4, 4, 4], [4.4, 4.4, 4.4, 4.4], "off"),               # on slower
    ([4, 4.6, 3.6, 4.4], [3.9, 3.9, 3.9, 3.9], "off"),         # 7% faster, but off's middle samples are 10% apart
    ([4, 4, 4, 40], [3, 3, 3, 3], "on"),                       # one stray epoch does not decide
    ([4, 4, 4, 4], [3, 3, 3, 0], "off"),                       # an epoch not read: off
    ([4, 4, 4, 4], [3, -1, 3, 3], "off"),                      # an epoch lost: off
])
def test_on_only_when_its_median_is_faster_than_off_by_more_than_the_noise(off, on, arm):
    got, margin = choose(off, on)
    assert got == arm
    assert margin >= constants()["min_margin"]


# ---- the guard in real processes, on the fake driver

from conftest import BUILD                                           # noqa: E402
from krex_ctl.wire.counters import create_counters, read_counters    # noqa: E402

SHIM = BUILD / "libkrex.so"
COMM = "ncclDevKernel_AllReduce_Sum_f32_RING_LL"
GEMM = "gemm_regs=64"            # 4 blocks per SM on the fake GPU; shape=1 pads it to 1 (`occ=1` in the trace)
E = 4                            # communication launches per epoch: a cycle of 128 epochs is 512 iterations
N = 520                          # iterations: one cycle and two epochs of the next (130 epochs)
LOOP = f"LOOP:{N}:{COMM}:200:{GEMM}:400"      # each: a 200 us collective beside a 400 us GEMM, then a sync


def run(tmp_path, controls, *args, occ_us=None, epoch=E, extra=None):
    """The overlap snippet under the shim (no controller needed), the guard's decisions logged. Returns (completed
    process, the trace's kernels in completion order as (name, fields), counters)."""
    counters, trace = tmp_path / "counters", tmp_path / "trace"
    counters.unlink(missing_ok=True)
    trace.unlink(missing_ok=True)
    create_counters(counters)
    env = {"LD_PRELOAD": str(SHIM), "KREX_FAKE_TRACE": str(trace), "KREX_COUNTERS": str(counters),
           "KREX_LOG_LEVEL": "info", "KREX_SOCKET": str(tmp_path / "none.sock"), "PATH": "/usr/bin:/bin",
           "KREX_OVERLAP_GUARD_EPOCH": str(epoch)}
    if controls is not None:
        env["KREX_OVERLAP"] = controls
    if occ_us:
        env["KREX_FAKE_OCC_US"] = occ_us
    env.update(extra or {})
    out = subprocess.run([str(SNIP / "overlap"), *args], env=env, capture_output=True, text=True, timeout=120)
    kernels = []
    for line in trace.read_text().splitlines() if trace.exists() else []:
        name, *fields = line.split(" ", 4)[4].split(" ")
        kernels.append((name, dict(f.split("=", 1) for f in fields)))
    return out, kernels, read_counters(counters)


def gemms(kernels):
    return [f for name, f in kernels if name == GEMM]


def modelled_us(kernels, permille):
    """The fake's model time of the GEMMs: gridDimX us, scaled by KREX_FAKE_OCC_US at the traced occupancy (no
    wall clock: the same for every run of one schedule)."""
    return sum(400 * permille.get(int(f["occ"]), 1000) / 1000 for f in gemms(kernels))


def guard(c):
    return c["overlap_guard_off_epochs"], c["overlap_guard_on_epochs"]


def test_where_padding_makes_compute_slower_the_guard_settles_on_off(tmp_path):
    out, kernels, c = run(tmp_path, "shape=1", LOOP, "EVENTS", occ_us="1:1200")
    assert out.returncode == 0, out.stdout + out.stderr
    # 130 epochs: on only for the exploration's 5 (epochs 3-7 of the first cycle), off for every other one
    assert guard(c) == (125, 5)
    # the padded GEMMs are exactly those of epochs 3-7: the schedule is a function of the launch count alone (the
    # ranks of one collective program explore in lockstep); an epoch begins with its first communication launch,
    # so the GEMM after communication launch i (from 0) is in epoch i // E
    padded = [i for i, f in enumerate(gemms(kernels)) if f["occ"] == "1"]
    assert padded == list(range(3 * E, 8 * E)) and c["overlap_padded"] == 5 * E
    assert "the controls are off until epoch 128" in out.stderr
    # the cost against no control: the exploration's 20 padded GEMMs, under 1% of the GEMMs' model time here
    _, plain, _ = run(tmp_path, None, LOOP, occ_us="1:1200")
    _, raw, _ = run(tmp_path, "shape=1,noguard", LOOP, occ_us="1:1200")
    table = {1: 1200}
    assert modelled_us(kernels, table) / modelled_us(plain, table) < 1.01
    assert modelled_us(raw, table) / modelled_us(plain, table) == pytest.approx(1.2)
    timing = int(out.stdout.split()[-3])
    assert timing == 11                   # the exploration's boundary events, made once and kept


# Choosing on takes epoch times that say so, and the fake's events are wall clock: a CPU busy with other work
# delays each wake-up of the fake's stream threads and of the program (a few per iteration) by up to a scheduler
# slice, and an epoch then lasts milliseconds longer, tens of them at worst (measured on 2 busy cores). Two such
# epochs among an arm's four samples widen that arm's spread, the margin, past what on gains, and the guard keeps
# off, as it should on noise. So the fast case is made large against that noise: epochs of one iteration (the
# fewest wake-ups per epoch), a 10 ms collective beside a 100 ms GEMM that padding makes 10 ms (KREX_FAKE_OCC_US
# 1:100): on is 10 ms an epoch, off 100 ms, and on is still chosen with a margin up to about 90%.
FAST_N = 130                     # iterations, each an epoch (E = 1): one cycle and two epochs of the next
FAST_LOOP = f"LOOP:{FAST_N}:{COMM}:10000:{GEMM}:100000"


def test_where_padding_makes_compute_faster_the_guard_settles_on_on(tmp_path):
    out, kernels, c = run(tmp_path, "shape=1", FAST_LOOP, occ_us="1:100", epoch=1)
    assert out.returncode == 0, out.stdout + out.stderr
    off, on = guard(c)
    assert off + on == FAST_N and off <= 12 and on >= 110       # off: the exploration's 6, and until the choice
    assert "the controls are on until epoch 128" in out.stderr
    assert all(f["occ"] == "1" for f in gemms(kernels)[-100:])  # and it stays on into the next cycle (A is on)
    assert c["overlap_padded"] == sum(f["occ"] == "1" for f in gemms(kernels))


def test_the_exploration_toggles_priority_too(tmp_path):
    # 44 communication launches: epochs 0-10, the exploration; the prioritized ones are those of epochs 3-7
    out, kernels, c = run(tmp_path, "priority", f"LOOP:44:{COMM}:100:{GEMM}:100")
    assert out.returncode == 0, out.stdout + out.stderr
    prio = [i for i, (name, f) in enumerate(k for k in kernels if k[0] == COMM) if f["prio"] == "-5"]
    assert prio == list(range(3 * E, 8 * E)) and c["overlap_prioritized"] == 5 * E
    assert guard(c) == (6, 5)


def test_the_exploration_toggles_sm_target_on_the_descriptors_made_in_its_on_epochs(tmp_path):
    # a descriptor made per iteration, as PyTorch makes one per matmul call: those of epochs 3-7 get the target
    out, _, c = run(tmp_path, "sm_target=116", f"LOOP:44:{COMM}:100:{GEMM}:100", extra={"SNIPPET_LOOP_LT": "1"})
    assert out.returncode == 0, out.stdout + out.stderr
    targeted = [int(line.split()[1]) for line in out.stdout.splitlines() if line.startswith("LT_TARGET")]
    assert targeted == list(range(3 * E, 8 * E)) and c["overlap_sm_target"] == 5 * E
    assert all(line.split()[2] == "116" for line in out.stdout.splitlines() if line.startswith("LT_TARGET"))
    assert guard(c) == (6, 5)
    out, _, c = run(tmp_path, "sm_target=116,noguard", f"LOOP:44:{COMM}:100:{GEMM}:100", extra={"SNIPPET_LOOP_LT": "1"})
    assert sum(line.startswith("LT_TARGET") for line in out.stdout.splitlines()) == 44 == c["overlap_sm_target"]


def test_noguard_keeps_the_raw_controls(tmp_path):
    out, kernels, c = run(tmp_path, "shape=1,noguard", LOOP, "EVENTS", occ_us="1:1200")
    assert out.returncode == 0, out.stdout + out.stderr
    assert all(f["occ"] == "1" for f in gemms(kernels)) and c["overlap_padded"] == N
    assert guard(c) == (0, 0) and "overlap guard" not in out.stderr
    assert out.stdout.split()[-4:-2] == ["timing", "0"]        # no timing event made


def test_a_program_without_communication_is_left_alone(tmp_path):
    out, kernels, c = run(tmp_path, "priority,shape=1", f"LOOP:200:-:0:{GEMM}:100", "EVENTS")
    assert out.returncode == 0, out.stdout + out.stderr
    assert all(f["occ"] == "4" and f["smem"] == "0" for f in gemms(kernels)) and len(gemms(kernels)) == 200
    assert {k: v for k, v in c.items() if k.startswith("overlap_") and v} == {}
    assert out.stdout.split()[-4:] == ["timing", "0", "untimed", "0"]    # no event made at all


def test_krex_run_reports_the_guards_epochs_and_checks_its_epoch_length(krex, tmp_path):
    import json
    import sys

    krex.start_controller()
    rep = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "krex_ctl", "run", "--overlap", "shape=1", "--report", str(rep), "--",
           str(SNIP / "overlap"), LOOP]
    env = dict(krex.env, KREX_OVERLAP_GUARD_EPOCH=str(E), KREX_FAKE_OCC_US="1:1200")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    ov = json.loads(rep.read_text())["overlap"]
    assert ov["controls"] == "shape=1" and (ov["guard_off_epochs"], ov["guard_on_epochs"]) == (125, 5)
    assert ov["padded"] == 5 * E
    marker = tmp_path / "ran"
    for bad in ("0", "65536", "x", "4 "):
        out = subprocess.run([sys.executable, "-m", "krex_ctl", "run", "--", "touch", str(marker)],
                             env=dict(krex.env, KREX_OVERLAP_GUARD_EPOCH=bad), capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and not marker.exists(), bad
        assert out.stderr.strip().splitlines() == [
            f"krex: KREX_OVERLAP_GUARD_EPOCH must be a whole number from 1 to 65535, not {bad!r}"]


def test_the_shim_alone_warns_of_a_bad_epoch_length_and_takes_16(tmp_path):
    out, _, c = run(tmp_path, "shape=1", f"LOOP:44:{COMM}:50:{GEMM}:50", epoch="0")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "KREX_OVERLAP_GUARD_EPOCH=0 is not a whole number from 1 to 65535; using 16" in out.stderr
    assert guard(c) == (2, 0)                 # 44 launches: epochs 0 and 1 of 16 ended, both off
