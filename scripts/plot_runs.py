#!/usr/bin/env python3
"""Plots training loss and validation perplexity of one or more runs (their metrics.jsonl).

    python3 scripts/plot_runs.py runs/quickstart [runs/other ...] --out runs/quickstart/curves.png
Uses Debian's python3-matplotlib; writes PNG (or SVG by extension).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(run):
    train, evals = [], []
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            m = json.loads(line)
            (train if m.get("type") == "train" else evals).append(m)
    return train, evals


def smooth(xs, k=10):
    out, acc = [], []
    for x in xs:
        acc.append(x)
        acc = acc[-k:]
        out.append(sum(acc) / len(acc))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--title", default="")
    a = ap.parse_args()
    fig, (l, r) = plt.subplots(1, 2, figsize=(11, 4))
    for run in a.runs:
        train, evals = load(run)
        name = os.path.basename(os.path.normpath(run))
        if train:
            l.plot([m["step"] for m in train], smooth([m["loss"] for m in train]), label=name)
        if evals:
            r.plot([m["step"] for m in evals], [m["val_ppl"] for m in evals], marker="o", label=name)
    l.set(xlabel="update", ylabel="training loss (10-update mean)", title="training loss")
    r.set(xlabel="update", ylabel="validation perplexity", title="validation perplexity", yscale="log")
    for ax in (l, r):
        ax.grid(alpha=0.3)
        ax.legend()
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=110)
    print(a.out)


if __name__ == "__main__":
    sys.exit(main())
