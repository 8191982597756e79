#!/usr/bin/env python3
"""Plots an optimizer comparison (the STEM.json `multinorm compare` writes): the compared loss against
tokens and against training time, one line per run, the target (the reference's final loss) dashed
and each run's first crossing marked.

    python3 scripts/plot_comparison.py runs/sweep/comparison.json --out runs/sweep/comparison.png
Uses Debian's python3-matplotlib.
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("comparison")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.comparison) as f:
        c = json.load(f)
    label = {"val_loss": "validation loss", "train_loss": "training loss (trailing mean)"}[c["metric"]]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, xlabel in ((axes[0], "tokens", "tokens"), (axes[1], "seconds", "training time (s)")):
        for run in c["runs"]:
            name = run["name"] + (" (reference)" if run["name"] == c["reference"] else "")
            line, = ax.plot(run[key], run["loss"], marker="o", markersize=3, label=name)
            if run["crossing"]:
                ax.plot([run["crossing"][key]], [c["target"]], marker="x", markersize=10, color=line.get_color())
        ax.axhline(c["target"], linestyle="--", color="gray", linewidth=1, label="target %.4f" % c["target"])
        ax.set(xlabel=xlabel, ylabel=label, title="%s against %s" % (label, xlabel))
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(a.out)


if __name__ == "__main__":
    sys.exit(main())
