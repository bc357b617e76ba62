"""Render the committed benchmark rows (``benchmarks/results/*.jsonl``) as reST tables for the
benchmarks page, each with the device, versions, commit and date its rows came from."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

# The suite rows' settings, with the defaults of rows from before each was recorded, as the
# Table-3 script reads them (the repository root is on the path: see conf.py).
from benchmarks.bench_gat_cora import paired
from benchmarks.table3 import controller, settings

# file -> (title, columns as (header, row key or callable))
_TABLES = {
    "saved_bytes.jsonl": ("Saved context, arxiv-shaped graph", [
        ("model", "model"), ("style", lambda r: r.get("style", "module")), ("bits", "bits"),
        ("PyG fp32 MB", lambda r: _mb(r.get("pyg_fp32_bytes"))),
        ("gnnact MB", lambda r: _mb(r.get("gnnact_bytes"))),
        # Rows from before the graph cache was counted say so instead of a size.
        ("of which graph cache MB", lambda r: _mb(r.get("graph_cache_bytes"))
         if r.get("graph_cache_counted") else "not counted"),
        ("ratio", lambda r: _x(r.get("ratio")))]),
    "accuracy.jsonl": ("Accuracy on real graphs", [
        ("dataset", "dataset"), ("model", "model"), ("bits", "bits"),
        ("test acc (%)", lambda r: f"{r['mean']:.2f} ± {r['std']:.2f}"),
        ("Δ vs fp32", lambda r: f"{r['delta_vs_fp32']:+.2f}")]),
    "suite.jsonl": ("Benchmark suite", [
        ("graph", "graph"), ("model", "model"), ("method", "method"), ("epochs", "epochs"),
        ("lr", lambda r: settings(r)[3]),
        ("BN momentum", lambda r: settings(r)[2] or "–"),
        ("estimates", lambda r: _schedule(r) if r["method"].startswith("adaptive") else ""),
        ("test acc (%)", lambda r: f"{r['acc_mean']:.2f} ± {r['acc_std']:.2f}"),
        ("saved MB", lambda r: _mb(r.get("saved_bytes"))),
        ("step ms", lambda r: f"{r['epoch_ms']:.1f}")]),
    "adaptive_ablation.jsonl": ("Adaptive bits: estimate schedule and narrowest width", [
        ("graph", "graph"), ("model", "model"), ("method", "method"), ("epochs", "epochs"),
        ("interval", "adapt_interval"), ("min bits", "min_bits"),
        ("test acc (%)", lambda r: f"{r['acc_mean']:.2f} ± {r['acc_std']:.2f}"),
        ("saved MB", lambda r: _mb(r.get("saved_bytes")))]),
    "generic.jsonl": ("Generic pipeline: CNN and transformer", [
        ("part", "part"), ("model", "model"), ("method", "method"),
        ("saved MB", lambda r: _mb(r.get("saved_bytes"))),
        ("vs fp32", lambda r: _x(r.get("saved_ratio"))),
        ("step vs fp32", lambda r: _x(r.get("step_vs_fp32"))),
        ("test acc (%)",
         lambda r: "" if "mean" not in r else f"{r['mean']:.2f} ± {r['std']:.2f}")]),
    "main_job.jsonl": ("Main job (``python -m gnnact``)", [
        ("model", "model"), ("bits", "bits"), ("test acc", lambda r: _pct(r.get("test_acc"))),
        ("saved MB", lambda r: _mb(r.get("saved_bytes"))),
        ("vs fp32", lambda r: _x(r.get("ratio_vs_fp32")))]),
    "train.jsonl": ("Training step on a GPU: PyG fp32 against gnnact", [
        ("graph", "graph"), ("model", "model"), ("bits", "bits"),
        ("step ms", lambda r: "out of memory" if r.get("oom") else f"{r['epoch_ms']:.1f}"),
        ("vs PyG", lambda r: _x(r.get("time_vs_pyg"))),
        ("peak MB", lambda r: _mb(r.get("peak_bytes"))),
        ("peak lower by", lambda r: _x(r.get("peak_ratio_vs_pyg")))]),
    "swap.jsonl": ("Swap and prefetch (GACT Table 5 shape)", [
        ("graph", "graph"), ("nodes", "num_nodes"), ("method", "method"),
        ("step ms", lambda r: "out of memory" if r.get("oom") else f"{r['epoch_ms']:.1f}"),
        ("peak MB", lambda r: _mb(r.get("peak_bytes")))]),
    "largest.jsonl": ("Largest graph under a memory cap", [
        ("model", "model"), ("method", "method"), ("cap GB", lambda r: r["cap_bytes"] / 2**30),
        ("largest nodes", lambda r: f"{r['largest_nodes']:,}"),
        ("peak MB there", lambda r: _mb(r.get("peak_bytes_at_largest")))]),
    "peak.jsonl": ("What is alive at the peak", [
        ("graph", "graph"), ("model", "model"), ("bits", "bits"),
        ("peak MB", lambda r: _mb(r.get("peak_bytes"))), ("reached at", "at")]),
    "quantize.jsonl": ("Quantizer throughput", [
        ("op", "op"), ("backend", "backend"), ("dtype", "dtype"), ("bits", "bits"),
        ("GB/s", lambda r: f"{r['gbps']:.2f}"), ("share of a copy", "frac_of_copy")]),
}


def _schedule(row: dict) -> str:
    """An adaptive row's estimate schedule: the first and longest gap, in steps."""
    interval, first, _ = controller(row)
    return f"every {interval}" if first is None else f"{first}, doubling to {interval}"


def _mb(value) -> str:
    return "" if value is None else f"{value / 1e6:.1f}"


def _x(value) -> str:
    return "" if value is None else f"{value:.2f}x"


def _pct(value) -> str:
    if value is None:
        return ""
    return f"{100 * value:.2f}" if value <= 1 else f"{value:.2f}"


def _cell(row: dict, key) -> str:
    try:
        value = key(row) if callable(key) else row.get(key, "")
    except (KeyError, TypeError):
        value = ""
    return str("" if value is None else value).replace("|", "/")


def _table(rows: list[dict], columns: list) -> list[str]:
    header = [h for h, _ in columns]
    return _list_table([header, *([_cell(r, k) for _, k in columns] for r in rows)])


def _list_table(rows: list[list[str]]) -> list[str]:
    """A reST list-table, the first row the header."""
    lines = [".. list-table::", "   :header-rows: 1", ""]
    for cells in rows:
        lines.append(f"   * - {cells[0] or ' '}")
        lines += [f"     - {c or ' '}" for c in cells[1:]]
    return lines


def _gat_cora(rows: list[dict]) -> list[str]:
    """``gat_cora.jsonl`` as paired comparisons with PyG: one line per (rng, code, method),
    for the test accuracy at the best validation epoch (PyG's example) and after the last."""
    metrics = ("test_acc", "final_test_acc")
    base = {m: {r["seed"]: r[m] for r in rows if r["method"] == "pyg"} for m in metrics}
    runs: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["method"] != "pyg":
            runs.setdefault((r["rng"], r.get("tag") or "", r["method"]), []).append(r)
    columns = ["rng", "code", "method", "seeds"]
    for label in ("test at best val", "final test"):
        columns += [f"{label} (%)", "paired Δ vs PyG (pt)", "t-test p"]
    pyg = ["", "", "pyg", str(len(base["test_acc"]))]
    for m in metrics:
        pyg += [_mean_std(list(base[m].values())), "", ""]
    body = [pyg]
    for (rng, tag, method), group in sorted(runs.items()):
        line = [rng, tag, method, ""]
        for m in metrics:
            s = paired(base[m], {r["seed"]: r[m] for r in group})
            line[3] = str(s["n"])
            line += [f"{s['mean']:.2f} ± {s['std']:.2f}", f"{s['diff']:+.2f} ± {s['se']:.2f}",
                     f"{s['t_p']:.3g}"]
        body.append(line)
    return _list_table([columns, *body])


def _mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {std:.2f}"


#: Files rendered by their own function (rows of all runs together) instead of by run.
_SUMMARIES = {"gat_cora.jsonl": ("GAT on Cora (PyG's example), paired by seed with PyG",
                                 _gat_cora)}


def write_tables(results: Path, out: Path) -> Path:
    """Write ``out/benchmarks_tables.rst``: one section per result file, rows grouped by the
    run (device, commit, date) they came from."""
    out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    for name, (title, columns) in _TABLES.items():
        path = results / name
        if not path.exists():
            continue
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        lines += [title, "-" * len(title), "", f"From ``benchmarks/results/{name}``.", ""]
        runs: dict[tuple, list[dict]] = {}
        for r in rows:
            runs.setdefault((r.get("device_name", "?"), r.get("commit", "?"),
                             r.get("date", "?")[:10], r.get("torch", "?")), []).append(r)
        for (device, commit, date, torch_version), group in runs.items():
            lines += [f"**{device}**, torch {torch_version}, commit ``{commit}``, {date}:", ""]
            lines += [*_table(group, columns), ""]
    for name, (title, render) in _SUMMARIES.items():
        path = results / name
        if path.exists():
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            lines += [title, "-" * len(title), "", f"From ``benchmarks/results/{name}``.", "",
                      *render(rows), ""]
    target = out / "benchmarks_tables.rst"
    target.write_text("\n".join(lines) + "\n")
    return target
