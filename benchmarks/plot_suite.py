"""Plots of ``bench_suite.py`` rows: memory against accuracy, and step time against bits.

For each (graph, device) of the newest commit in the rows file:

- ``suite_memory_accuracy_<graph>_<device>.png``: per model, test accuracy (mean ± std over
  seeds) against memory (peak step memory on CUDA, else saved context), one marker per method;
- ``suite_time_bits_<graph>_<device>.png``: per model, step time of gnnact at 2/4/8 bits
  relative to PyG fp32.

Usage::

    python benchmarks/plot_suite.py [--rows benchmarks/results/suite.jsonl] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def newest(rows: list[dict]) -> list[dict]:
    """The rows of the newest commit (by row date)."""
    last = max(rows, key=lambda r: r["date"])["commit"]
    return [r for r in rows if r["commit"] == last]


def plot(rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in newest(rows):
        groups[r["graph"], r["device"]].append(r)
    written = []
    for (graph, device), group in groups.items():
        models = list(dict.fromkeys(r["model"] for r in group))
        fig, axes = plt.subplots(1, len(models), figsize=(4 * len(models), 3.5), squeeze=False)
        for ax, model in zip(axes[0], models, strict=True):
            for r in (r for r in group if r["model"] == model):
                memory = r["peak_bytes"] or r["saved_bytes"]
                if memory:
                    ax.errorbar(memory / 1e6, r["acc_mean"], yerr=r["acc_std"], fmt="o",
                                label=r["method"], capsize=3)
            ax.set_xscale("log")
            ax.set_title(model)
            ax.set_xlabel("peak step memory (MB)" if device.startswith("cuda")
                          else "saved context (MB)")
            ax.set_ylabel("test accuracy (%)")
        axes[0][-1].legend(fontsize=7)
        fig.suptitle(f"{graph} on {device}")
        fig.tight_layout()
        path = out / f"suite_memory_accuracy_{graph}_{device}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(5, 3.5))
        for model in models:
            ref = next((r for r in group if r["model"] == model and r["method"] == "pyg"), None)
            points = sorted((int(r["method"][6:]), r["epoch_ms"]) for r in group
                            if r["model"] == model and r["method"].startswith("gnnact"))
            if ref and points:
                ax.plot([b for b, _ in points], [t / ref["epoch_ms"] for _, t in points],
                        marker="o", label=model)
        ax.axhline(1.0, color="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bits")
        ax.set_ylabel("step time vs PyG fp32")
        ax.set_title(f"{graph} on {device}")
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out / f"suite_time_bits_{graph}_{device}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=Path, default=RESULTS / "suite.jsonl")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"no rows in {args.rows}")
    for path in plot(rows, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
