"""PNG of a throughput result: commands/min per mode vs agents, and inflation per bucket and mode.
    python bench/plot_throughput.py RESULT.json OUT.png   (needs matplotlib)"""

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

data = json.load(open(sys.argv[1]))
fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
for mode in ("naive", "cmdlock", "krex", "krexwarm", "krexnofreeze"):
    pts = sorted((s["agents"], s["commands_per_min"]) for s in data["summary"] if s["mode"] == mode)
    if pts:
        ax1.plot(*zip(*pts), marker="o", label=mode)
iso = [s["commands_per_min"] for s in data["summary"] if s["mode"] == "isolated"]
if iso:
    ax1.axhline(iso[0], color="gray", ls=":", label="isolated (1 agent)")
ax1.set_xlabel("agents")
ax1.set_ylabel("commands / min")
ax1.legend()
ax1.set_title("throughput")
buckets = ["<0.1ms", "0.1-1ms", "1-10ms", ">10ms"]
modes = [s for s in data["summary"] if s["mode"] in ("naive", "cmdlock", "krex", "krexwarm", "krexnofreeze", "isolated")]
w = 0.8 / max(1, len(modes))
for i, s in enumerate(modes):
    ax2.bar([b + i * w for b in range(len(buckets))], [100 * s["p95_inflation"][b] for b in buckets], w,
            label=f"{s['mode']} x{s['agents']}")
ax2.set_xticks([b + 0.4 - w / 2 for b in range(len(buckets))])
ax2.set_xticklabels(buckets)
ax2.set_yscale("symlog")
ax2.set_ylabel("p95 inflation vs isolated median (%)")
ax2.legend(fontsize=7)
ax2.set_title("timing inflation")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=110)
