#!/usr/bin/env python3
"""Draw a krex trace's timeline (krex trace / krex controller --trace JSON) as a PNG with matplotlib.

    python3 tests/gpu/render_trace.py TRACE.json OUT.png [--title TEXT]

One row per track: each GPU's regions (green: exclusive and clean, orange: exclusive with a taint, red: not
exclusive), then per process its waits (grey), hand-off phases (blue), frozen time (purple) and clock settles
(yellow). Times in seconds from the first event. Only the standard library and matplotlib (no krex import),
so it runs wherever the trace is."""

import argparse
import json
import sys


def load(path):
    text = open(path).read().strip()
    if text.startswith("["):          # JSON array format, the closing ] optional
        body = text.rstrip().rstrip(",")
        return json.loads(body if body.endswith("]") else body + "]")
    return json.loads(text)["traceEvents"]


COLORS = {"wait": "#9e9e9e", "handoff": "#1f77b4", "frozen": "#7b3fa0", "clock_settle": "#e6b800"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--title", default="")
    args = ap.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        print("render_trace: needs matplotlib (pip install matplotlib)", file=sys.stderr)
        return 2
    events = load(args.trace)
    names = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            names[e["pid"]] = e["args"]["name"]
    thread_names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in events
                    if e.get("ph") == "M" and e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X"]
    if not spans:
        print("render_trace: no complete events in the trace", file=sys.stderr)
        return 1
    t0 = min(e["ts"] for e in spans)
    tracks = sorted({(e["pid"], e.get("tid", 0)) for e in spans},
                    key=lambda k: (0 if names.get(k[0], "").startswith("GPU") else 1, names.get(k[0], ""), k))
    row = {k: i for i, k in enumerate(tracks)}
    fig, ax = plt.subplots(figsize=(14, 0.45 * len(tracks) + 1.6))
    for e in spans:
        y = row[(e["pid"], e.get("tid", 0))]
        cat = e.get("cat", "")
        if cat.startswith("region"):
            a = e.get("args", {})
            color = "#d62728" if not a.get("exclusive") else ("#2ca02c" if a.get("clean") else "#ff7f0e")
        else:
            color = COLORS.get(cat, "#555555")
        start, dur = (e["ts"] - t0) / 1e6, max(e.get("dur", 0), 1) / 1e6
        ax.broken_barh([(start, dur)], (y - 0.4, 0.8), facecolors=color, edgecolors="none")
    ax.set_yticks(range(len(tracks)))
    ax.set_yticklabels([f"{names.get(p, p)[:48]} / {thread_names.get((p, t), t)}" for p, t in tracks], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("seconds")
    ax.grid(axis="x", alpha=0.3)
    ax.set_title(args.title or f"krex trace: {args.trace}", fontsize=9)
    ax.legend(handles=[Patch(color="#2ca02c", label="region, exclusive and clean"),
                       Patch(color="#ff7f0e", label="region, exclusive, tainted"),
                       Patch(color="#d62728", label="region, not exclusive")]
              + [Patch(color=c, label=k.replace("_", " ")) for k, c in COLORS.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.08 if len(tracks) > 6 else -0.2), ncol=7, fontsize=7,
              frameon=False)
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)
    print(f"render_trace: {len(spans)} spans on {len(tracks)} tracks -> {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
