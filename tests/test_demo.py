"""`make demo`'s program on the fake driver: its benchmarks share one GPU with busy neighbours, every region
is exclusive, and no neighbour kernel ran inside one (the demo checks the fake driver's trace itself)."""

import re
import subprocess
import sys

import pytest

from conftest import ROOT, new_user_env


def test_the_demo_runs_on_the_fake_driver_with_no_neighbour_kernel_inside_a_region(tmp_path):
    env = new_user_env(tmp_path)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--fake"], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "on the FAKE driver" in out.stdout
    # none inside a region reported exclusive (one that could not be proven so says it, with its taint)
    assert re.search(r"\b0 neighbour kernels ran inside any of the \d+ regions reported exclusive", out.stdout), \
        out.stdout[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_demo_with_the_lifecycle_gates_on_never_has_a_neighbour_kernel_inside_an_exclusive_region(tmp_path):
    """The demo starts five jobs at once next to regions, with the context and exit gates on (their waiters go as
    a region ends, just as the next one closes the gate): a process's context announcement can be unread when a
    region closes the gate. A region leaves its drain only after a read pass begun after its close, so the
    announcement is read and the process drained first; none is read past the drain (the region would be tainted
    late_context), and no neighbour kernel runs inside a region reported exclusive. Six runs, about 20 s."""
    env = dict(new_user_env(tmp_path), KREX_GATE_CONTEXTS="1", KREX_GATE_EXIT="1", TMPDIR=str(tmp_path))
    for run in range(6):
        out = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--fake"], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, f"run {run}: " + out.stdout[-3000:] + out.stderr[-3000:]
        assert re.search(r"\b0 neighbour kernels ran inside any of the \d+ regions reported exclusive", out.stdout), \
            f"run {run}: " + out.stdout[-3000:]
        assert re.search(r"\bthe controller: \d+ regions granted, .*, 0 regions tainted late_context", out.stdout), \
            f"run {run}: " + out.stdout[-3000:]
    logs = "".join(p.read_text() for p in tmp_path.glob("krex-demo-*/krex.sock.log"))
    assert "read only after the region's drain" not in logs, logs[-3000:]
