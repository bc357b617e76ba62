"""Plots of ``bench_suite.py`` rows: memory against accuracy, and step time against bits.

For each (graph, device) of the rows, from the newest row of each (model, method), whichever run
it came from (a rerun of some methods replaces only those):

- ``suite_memory_accuracy_<graph>_<device>.png``: one panel per model, test accuracy (mean ±
  std over seeds) against memory (peak step memory on CUDA, else saved context), one marker
  per method, the same marker for a method in every panel (markers are dodged sideways by a
  few percent, so that methods with equal values stay visible);
- ``suite_time_bits_<graph>_<device>.png``: per model, step time of gnnact at its fixed widths
  relative to PyG fp32.

Within a model, each method's row is the newest one run with the PyG row's settings (epochs,
seeds, learning rate, BatchNorm momentum: ``table3.settings``), so that a panel never compares
runs of different settings; a method with no such row is left out.

Usage::

    python benchmarks/plot_suite.py [--rows benchmarks/results/suite.jsonl] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from table3 import settings

RESULTS = Path(__file__).resolve().parent / "results"

#: Methods in legend order, each with its marker and colour (the same in every plot).
METHODS = {
    "pyg": ("o", "black"), "gnnact8": ("^", "#1f77b4"), "gnnact4": ("D", "#2ca02c"),
    "gnnact2": ("s", "#d62728"), "uniform4": ("d", "#17becf"), "adaptive4": ("P", "#9467bd"),
    "adaptive3": ("X", "#8c564b"), "adaptive2": ("*", "#e377c2"), "pernode2": ("p", "#bcbd22"),
    "amp": ("<", "#7f7f7f"), "checkpoint": (">", "#ff7f0e"), "save_on_cpu": ("h", "#aec7e8"),
}


def _style(method: str) -> tuple[str, str]:
    return METHODS.get(method, ("o", "#333333"))


def _order(method: str) -> int:
    return list(METHODS).index(method) if method in METHODS else len(METHODS)


def _model_order(model: str) -> tuple[int, str]:
    order = ("gcn", "sage", "gat", "gcnii")
    return (order.index(model) if model in order else len(order)), model


def newest(rows: list[dict]) -> list[dict]:
    """Per (graph, device, model): the newest PyG row, and per other method the newest row run
    with the PyG row's settings (all newest rows where there is no PyG row)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[r["graph"], r["device"], r["model"]].append(r)
    kept = []
    for group in groups.values():
        refs = [r for r in group if r["method"] == "pyg"]
        same = settings(max(refs, key=lambda r: r["date"])) if refs else None
        best: dict[str, dict] = {}
        for r in group:
            if same is not None and settings(r) != same:
                continue
            if r["method"] not in best or r["date"] >= best[r["method"]]["date"]:
                best[r["method"]] = r
        kept += sorted(best.values(), key=lambda r: _order(r["method"]))
    return kept


def plot(rows: list[dict], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in newest(rows):
        groups[r["graph"], r["device"]].append(r)
    written = []
    for (graph, device), group in groups.items():
        cuda = device.startswith("cuda")
        models = sorted(dict.fromkeys(r["model"] for r in group), key=_model_order)
        fig, axes = plt.subplots(1, len(models), figsize=(max(4.2 * len(models) + 0.8, 9), 4.4),
                                 squeeze=False)
        handles: dict[str, object] = {}
        for ax, model in zip(axes[0], models, strict=True):
            mine = [r for r in group if r["model"] == model]
            ref = next((r for r in mine if r["method"] == "pyg"), None)
            if ref is not None:  # fp32's spread over seeds: a point inside lost nothing
                ax.axhspan(ref["acc_mean"] - ref["acc_std"], ref["acc_mean"] + ref["acc_std"],
                           color="0.92", zorder=0)
            missing = []
            for k, r in enumerate(mine):
                memory = r.get("peak_bytes") if cuda else r.get("saved_bytes")
                if not memory:
                    missing.append(r["method"])
                    continue
                marker, color = _style(r["method"])
                handles[r["method"]] = ax.errorbar(
                    memory / 1e6 * 1.04 ** (k - (len(mine) - 1) / 2), r["acc_mean"],
                    yerr=r["acc_std"], fmt=marker, color=color,
                    markersize=8, capsize=3, label=r["method"])
            ax.set_xscale("log")
            low, high = ax.get_xlim()
            if high / low < 20:  # at least a decade and a bit: labelled major ticks only
                middle = (low * high) ** 0.5
                ax.set_xlim(middle / 20**0.5, middle * 20**0.5)
            low, high = ax.get_xlim()
            subs = (1.0, 2.0, 5.0) if high / low < 300 else (1.0,)  # a few labelled ticks
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_title(f"{model} ({mine[0]['epochs']} epochs, {len(mine[0]['seeds'])} seeds)")
            ax.set_xlabel("peak step memory (MB, log)" if cuda else "saved context (MB, log)")
            ax.grid(True, which="both", alpha=0.3)
            if missing:
                ax.text(0.02, 0.02, "no memory figure: " + ", ".join(missing),
                        transform=ax.transAxes, fontsize=7, color="0.4")
        axes[0][0].set_ylabel("test accuracy (%)")
        methods = sorted(handles, key=_order)
        fig.legend([handles[m] for m in methods], methods, loc="lower center",
                   ncol=min(len(methods), 6), fontsize=9, frameon=False)
        fig.suptitle(f"{graph} on {device}: memory against accuracy (newest row per method; "
                     "grey band: PyG fp32 ± std)")
        fig.tight_layout(rect=(0, 0.06 + 0.05 * ((len(methods) - 1) // 6), 1, 1))
        path = out / f"suite_memory_accuracy_{graph}_{device}.png"
        fig.savefig(path, dpi=120)
        written.append(path)
        plt.close(fig)

        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        widths: set[int] = set()
        for i, model in enumerate(models):
            ref = next((r for r in group if r["model"] == model and r["method"] == "pyg"), None)
            points = sorted((int(r["method"][6:]), r["epoch_ms"]) for r in group
                            if r["model"] == model and r["method"].startswith("gnnact"))
            if ref and points:
                widths |= {b for b, _ in points}
                ax.plot([b for b, _ in points], [t / ref["epoch_ms"] for _, t in points],
                        marker="os^D"[i % 4], markersize=7, label=model)
        low, high = ax.get_ylim()
        ax.set_ylim(min(low, 0.9), max(high, 1.1))  # PyG's line inside, with room for its label
        ax.axhline(1.0, color="gray", lw=0.8, ls="--")
        ax.text(0.01, 1.0, " PyG fp32", transform=ax.get_yaxis_transform(), va="bottom",
                fontsize=8, color="gray")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(widths) or [2, 4, 8], [str(b) for b in sorted(widths) or [2, 4, 8]])
        ax.minorticks_off()
        ax.set_xlabel("bits")
        ax.set_ylabel("step time / PyG fp32 step time")
        ax.set_title(f"{graph} on {device}: step time against bits")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
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
    args.out.mkdir(parents=True, exist_ok=True)
    for path in plot(rows, args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
