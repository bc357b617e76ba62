"""The README's results table, from the committed rows: per model, the context kept for
backward on the ogbn-arxiv shape (gnnact's graph cache counted), the step's peak memory and time
on a GPU, and the accuracy change at adaptive 2 bits on GACT's Table 3 graphs.

Sources (newest row of each kind, any commit):

- ``saved_bytes.jsonl``: ``bench_saved_bytes.py`` on the arxiv shape, models as
  :mod:`gnnact.models` writes them, 2 bits;
- ``peak.jsonl``: ``profile_peak.py --device cuda`` on the arxiv shape, the step's peak of
  the models as :mod:`gnnact.models` writes them, PyG fp32 (32 bits) against gnnact at 2 bits,
  graph cache counted;
- ``train.jsonl``: ``bench_train.py --device cuda``, the step time of PyG fp32 against gnnact
  at 2 bits;
- ``suite.jsonl``: the Table 3 runs, adaptive 2 bits against fp32, picked as
  ``benchmarks/table3.py`` picks them (same run settings, the controller's default schedule).

``tests/test_docs.py`` checks that the README holds exactly this script's output.

Usage::

    python benchmarks/headline.py [--results benchmarks/results]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ADAPT_INTERVAL, FIRST_INTERVAL, RESULTS, read_rows, step_peak_bytes
from table3 import MODELS, pick, settings

GRAPHS = {"dblp": "DBLP", "computers": "Computers", "physics": "Physics"}


def _newest(rows: list[dict], **match: object) -> dict | None:
    found = [r for r in rows if all(r.get(k) == v for k, v in match.items())]
    return max(found, key=lambda r: r["date"]) if found else None


def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def headline(results: Path = RESULTS) -> str:
    """The markdown table and its caption."""
    saved, train = read_rows(results / "saved_bytes.jsonl"), read_rows(results / "train.jsonl")
    peaks = [r for r in read_rows(results / "peak.jsonl") if r.get("bench") == "peak"
             and r.get("device") == "cuda" and r.get("graph") == "arxiv"
             and r.get("num_nodes") == 169_343 and r.get("style", "module") == "module"]
    suite = [r for r in read_rows(results / "suite.jsonl") if r.get("bench") == "suite"]
    lines = ["| model | kept for backward: PyG fp32 → gnnact 2 bits | step peak: PyG fp32 → "
             "gnnact 2 bits | step time | accuracy change at adaptive 2 bits (points; "
             + ", ".join(GRAPHS.values()) + ") |",
             "|---|---|---|---|---|"]
    peak_devices, time_devices = set(), set()
    for model, label in MODELS.items():
        # (Rows of the default graph, the arxiv shape, name it "synthetic-arxiv" or nothing.)
        kept = _newest([r for r in saved if r.get("graph") in (None, "synthetic-arxiv")
                        and r.get("graph_cache_counted")], model=model, style="module", bits=2)
        pyg = _newest(train, model=model, impl="pyg", graph="arxiv", oom=False)
        ours = _newest(train, model=model, impl="gnnact", bits=2, graph="arxiv", oom=False)
        pyg_peak = _newest(peaks, model=model, bits=32)
        ours_peak = _newest(peaks, model=model, bits=2)
        if None in (kept, pyg, ours, pyg_peak, ours_peak):
            continue
        time_devices.add(ours["device_name"])
        peak_devices.add(ours_peak["device_name"])
        deltas = []
        for graph in GRAPHS:
            rows = [r for r in suite if r["graph"] == graph]
            ref = _newest([r for r in rows if r["model"] == model], method="pyg")
            row = None if ref is None else pick(rows, model, "adaptive2", settings(ref),
                                                (ADAPT_INTERVAL, FIRST_INTERVAL, 1))[0]
            deltas.append("–" if row is None else f"{row['acc_mean'] - ref['acc_mean']:+.2f}")
        lines.append(
            f"| {label} | {_mib(kept['pyg_fp32_bytes'])} → {_mib(kept['gnnact_bytes'])} "
            f"({kept['ratio']:.1f}× less) | {_mib(step_peak_bytes(pyg_peak))} → "
            f"{_mib(step_peak_bytes(ours_peak))} "
            f"({step_peak_bytes(pyg_peak) / step_peak_bytes(ours_peak):.1f}× lower) "
            f"| {pyg['epoch_ms']:.1f} → {ours['epoch_ms']:.1f} ms | {' / '.join(deltas)} |")
    caption = (
        "ogbn-arxiv-shaped graph (169,343 nodes, 2.3M edges, 128 features); EXACT's models "
        "(GCN and SAGE 3×256 with BatchNorm, GAT 3 layers × 3 heads × 128, GCNII 16×256). "
        "Kept for backward: what autograd holds after one training forward pass, gnnact's "
        "graph cache included. Step peak: one training step on "
        f"{', '.join(sorted(peak_devices))}, graph cache included. Step time: "
        f"{', '.join(sorted(time_devices))}. Accuracy: test accuracy at the best validation epoch, "
        "mean of 3 seeds, adaptive 2 bits minus fp32 (positive: better than fp32).")
    return "\n".join(lines) + "\n\n" + caption + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=RESULTS, help="the rows' folder")
    print(headline(parser.parse_args(argv).results), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
