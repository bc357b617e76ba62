"""GACT's Table 3 shape from the suite's rows: per graph and model, fp32 accuracy, the change in
points of each compressed method against it, and the saved-context ratio at the lowest average.

The ratio comes from ``bench_saved_bytes.py --graph <graph>`` rows (graph cache counted) of the
same model, adjacency and features where there is one, else from the suite's own rows (marked
‡ when they predate counting the graph cache).

It reads ``benchmarks/results/suite.jsonl`` (written by ``bench_suite.py``) and prints one
markdown table per graph. The fp32 (``pyg``) row of a (graph, model) is its newest; each
method's change is taken from its newest row of the same run settings (:func:`settings`), so
that a rerun replaces an older one and a run of other settings is never compared. An adaptive
method's row must also have been run with the controller settings asked for (:func:`controller`;
by default the suite's defaults); failing that, a row from before the estimate schedule existed
(estimates at step 0 and every 50 steps) is shown, marked †. A method with no such row shows
``–``.

Usage::

    python benchmarks/table3.py [--graphs dblp computers] [--rows benchmarks/results/suite.jsonl]
        [--adapt-interval 50] [--first-interval 10 | none] [--min-bits 1]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ADAPT_INTERVAL, FIRST_INTERVAL, RESULTS, optional_int

from gnnact.models import has_batchnorm

# (method, column heading): GACT's fixed 4 bits is ``uniform4`` (attention at 4 bits too);
# ``gnnact4`` keeps GAT's attention at its default 8 bits.
COLUMNS = (("gnnact4", "fixed 4"), ("uniform4", "uniform 4"), ("adaptive4", "adaptive 4"),
           ("adaptive3", "adaptive 3"), ("adaptive2", "adaptive 2"))
MODELS = {"gcn": "GCN", "sage": "SAGE", "gat": "GAT", "gcnii": "GCNII"}


# The controller settings of rows from before the estimate schedule existed (and before
# --adapt-interval and --min-bits): estimates at step 0 and every 50 steps, widths from 1 bit.
LEGACY = (50, None, 1)


def settings(row: dict) -> tuple:
    """What must match for two rows to be compared: epochs, seeds, BatchNorm momentum (None for
    a model without BatchNorm) and learning rate (rows from before these were recorded ran at
    0.1 and 0.01)."""
    momentum = row.get("bn_momentum", 0.1) if has_batchnorm(row["model"]) else None
    return row["epochs"], tuple(row["seeds"]), momentum, row.get("lr", 0.01)


def controller(row: dict) -> tuple:
    """An adaptive row's controller settings: longest and first gap between estimates, and the
    narrowest width (rows from before these were recorded: :data:`LEGACY`)."""
    if "first_interval" not in row:
        return row.get("adapt_interval", 50), None, row.get("min_bits", 1)
    return row["adapt_interval"], row["first_interval"], row["min_bits"]


def pick(rows: list[dict], model: str, method: str, same: tuple,
         wanted: tuple) -> tuple[dict | None, str]:
    """The newest row of ``model`` and ``method`` with run settings ``same`` (and, if adaptive,
    controller settings ``wanted``, else :data:`LEGACY` marked ``"†"``), and its mark."""
    def newest(keep) -> dict | None:
        found = [r for r in rows if r["model"] == model and r["method"] == method
                 and settings(r) == same and keep(r)]
        return max(found, key=lambda r: r["date"]) if found else None

    if not method.startswith("adaptive"):
        return newest(lambda r: True), ""
    row = newest(lambda r: controller(r) == wanted)
    if row is not None or wanted == LEGACY:
        return row, ""
    row = newest(lambda r: controller(r) == LEGACY)
    return row, "" if row is None else "†"


def saved_ratio(saved: list[dict], ref: dict) -> str | None:
    """PyG fp32's saved context over gnnact's at 2 bits, graph cache counted, for the graph,
    model, adjacency and features of the suite row ``ref``: the newest such ``bench_saved_bytes``
    row of ``saved`` (one forward pass; adaptive 2 keeps the bytes of fixed 2, since the
    allocator spends the whole budget), or ``None``."""
    found = [r for r in saved if r.get("graph") == ref["graph"] and r["model"] == ref["model"]
             and r.get("style", "module") == "module" and r.get("bits") == 2
             and r.get("adj") == (ref.get("adj") or "edge_index")
             and r.get("features") == (ref.get("features") or "dense")]
    return f"{max(found, key=lambda r: r['date'])['ratio']:.1f}×" if found else None


def table(rows: list[dict], graph: str,
          wanted: tuple = (ADAPT_INTERVAL, FIRST_INTERVAL, 1),
          saved: list[dict] | None = None) -> str:
    """The markdown table of ``graph``: one line per model with an fp32 row; adaptive methods
    at controller settings ``wanted`` (:func:`controller`); the saved-context ratio from
    ``bench_saved_bytes`` rows ``saved`` (:func:`saved_ratio`) where there is one."""
    rows = [r for r in rows if r.get("bench") == "suite" and r["graph"] == graph]
    lines = ["| model | epochs | lr | BN momentum | fp32 | " + " | ".join(h for _, h in COLUMNS)
             + " | saved context at adaptive 2 |",
             "|---|---|---|---|---|" + "---|" * len(COLUMNS) + "---|"]
    marked = uncounted = False
    for model, label in MODELS.items():
        refs = [r for r in rows if r["model"] == model and r["method"] == "pyg"]
        if not refs:
            continue
        ref = max(refs, key=lambda r: r["date"])
        same = settings(ref)
        cells = []
        for method, _ in COLUMNS:
            r, mark = pick(rows, model, method, same, wanted)
            marked |= bool(mark)
            cells.append("–" if r is None else f"{r['acc_mean'] - ref['acc_mean']:+.2f}{mark}")
        ratio = saved_ratio(saved or [], ref)
        if ratio is None:  # no bench_saved_bytes row: the suite's own, if it has one
            low, _ = pick(rows, model, "adaptive2", same, wanted)
            ratio = ("–" if low is None or not low["saved_bytes"] or not ref["saved_bytes"]
                     else f"{ref['saved_bytes'] / low['saved_bytes']:.1f}×")
            if low is not None and not low.get("graph_cache_counted"):
                ratio += "‡"
                uncounted = True
        lines.append(f"| {label} | {ref['epochs']} | {same[3]} | {same[2] or '–'} | "
                     f"{ref['acc_mean']:.2f} ± {ref['acc_std']:.2f} | "
                     + " | ".join(cells) + f" | {ratio} |")
    if marked:
        lines.append("\n† estimates at step 0 and every 50 steps (run before the schedule "
                     "existed)")
    if uncounted:
        lines.append("\n‡ context without gnnact's graph cache (a row from before it was "
                     "counted): the ratio with it counted is lower")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graphs", nargs="+", default=["dblp", "computers", "physics"])
    parser.add_argument("--rows", type=Path, default=RESULTS / "suite.jsonl")
    parser.add_argument("--saved", type=Path, default=RESULTS / "saved_bytes.jsonl",
                        help="bench_saved_bytes rows: the saved-context ratios")
    parser.add_argument("--adapt-interval", type=int, default=ADAPT_INTERVAL)
    parser.add_argument("--first-interval", type=optional_int, default=FIRST_INTERVAL)
    parser.add_argument("--min-bits", type=int, default=1)
    args = parser.parse_args(argv)
    rows = [json.loads(line) for line in args.rows.read_text().splitlines() if line.strip()]
    saved = ([json.loads(line) for line in args.saved.read_text().splitlines() if line.strip()]
             if args.saved.exists() else [])
    wanted = (args.adapt_interval, args.first_interval, args.min_bits)
    for graph in args.graphs:
        print(f"### {graph}\n\n{table(rows, graph, wanted, saved)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
