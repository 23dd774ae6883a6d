#!/usr/bin/python3
"""Plot engine_bench's write amplification against the greedy-GC theory (engine.md table).

    bench/engine_plot.py bench/results/engine-quick.json docs/img/engine-write-amplification.png
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# engine.md: simulated greedy GC, segments of 1024 blocks (u -> write amplification).
THEORY = [(0.50, 1.26), (0.70, 1.88), (0.75, 2.21), (0.80, 2.70), (0.85, 3.54), (0.90, 5.23),
          (0.95, 10.42)]

results = json.load(open(sys.argv[1]))
rows = results["write_amplification"]
fig, ax = plt.subplots(figsize=(6, 3.8))
ax.plot([u for u, _ in THEORY], [a for _, a in THEORY], "--", label="greedy GC theory (engine.md)")
ax.plot([r["utilisation"] for r in rows], [r["write_amplification"] for r in rows], "o-",
        label="sliver engine, measured")
u = results.get("unmap_half")
if u:
    ax.plot([0.9, 0.45], [u["before_wa"], u["after_wa"]], "s:", label="before / after UNMAP of half")
ax.set_xlabel("utilisation (live data / usable capacity)")
ax.set_ylabel("write amplification")
ax.set_yscale("log")
ax.grid(True, which="both", alpha=0.3)
ax.legend()
ax.set_title("Garbage collection under uniform random 4 KiB overwrites")
fig.tight_layout()
fig.savefig(sys.argv[2], dpi=100)
