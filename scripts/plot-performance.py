#!/usr/bin/env python3
"""Draws docs/performance/ratios-<machine>.png from docs/performance/ratios.csv: for each
machine kind, poolserve's speed over each peer's on each workload (above 1: poolserve is
faster; the ratio column is the measured one, taken in interleaved rounds on that machine).

    .venv/bin/python scripts/plot-performance.py    # needs matplotlib
"""
import csv
import os
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "performance")


def main():
    rows = list(csv.DictReader(open(os.path.join(HERE, "ratios.csv"))))
    by_machine = defaultdict(list)
    for row in rows:
        by_machine[row["machine"]].append(row)
    for machine, items in by_machine.items():
        labels = [f"{r['workload']}, {r['precision']}\nvs {r['peer']} ({r['date']})" for r in items]
        ratios = [float(r["ratio"]) for r in items]
        height = 0.55 * len(items) + 1.2
        fig, ax = plt.subplots(figsize=(9, height))
        colors = ["#2a7" if x >= 1 else "#c53" for x in ratios]
        ax.barh(range(len(items)), ratios, color=colors)
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_yticks(range(len(items)), labels, fontsize=7)
        ax.invert_yaxis()
        for i, x in enumerate(ratios):
            ax.text(x, i, f" {x:.2f}×", va="center", fontsize=7)
        ax.set_xlabel("poolserve's speed over the peer's (above 1: poolserve faster)")
        ax.set_title(f"2-core {machine} VM")
        fig.tight_layout()
        name = "ratios-" + machine.lower().replace(" ", "-") + ".png"
        fig.savefig(os.path.join(HERE, name), dpi=100)
        plt.close(fig)
        print(name, len(items), "ratios")


if __name__ == "__main__":
    main()
