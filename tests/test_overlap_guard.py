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
