"""`make demo`'s program on the fake driver: its benchmarks share one GPU with busy neighbours, every region
is exclusive, and no neighbour kernel ran inside one (the demo checks the fake driver's trace itself)."""

import os
import re
import subprocess
import sys

from conftest import ROOT


def test_the_demo_runs_on_the_fake_driver_with_no_neighbour_kernel_inside_a_region():
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_") and k != "LD_PRELOAD"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "demo.py"), "--fake"], env=env,
                         capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "on the FAKE driver" in out.stdout
    # none inside a region reported exclusive (one that could not be proven so says it, with its taint)
    assert re.search(r"\b0 neighbour kernels ran inside any of the \d+ regions reported exclusive", out.stdout), \
        out.stdout[-3000:]
