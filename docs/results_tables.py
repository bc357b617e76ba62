"""Render the committed benchmark rows (``benchmarks/results/*.jsonl``) as reST tables.

Two kinds of output, both under ``docs/_generated`` (written by ``conf.py`` at every build):

- ``benchmarks_tables.rst``: every row of every file, grouped by the run (device, torch
  version, commit, date) it came from: the benchmarks page;
- ``results_<name>.rst``: one curated table each for the results page (:data:`RESULTS`): the
  newest row per configuration, pivoted for reading, with the file, devices and dates it came
  from. The Table-3 tables are ``benchmarks/table3.py``'s own output, converted to reST.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

# The suite rows' settings, with the defaults of rows from before each was recorded, as the
# Table-3 script reads them (the repository root is on the path: see conf.py).
from benchmarks._common import step_peak_bytes
from benchmarks.bench_gat_cora import paired
from benchmarks.table3 import controller, settings
from benchmarks.table3 import table as table3

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
    "generic.jsonl": ("Generic pipeline: CNNs and transformer", [
        ("part", "part"), ("model", "model"), ("method", "method"),
        ("saved MB", lambda r: _mb(r.get("saved_bytes"))),
        ("vs fp32", lambda r: _x(r.get("saved_ratio"))),
        ("step vs fp32", lambda r: _x(r.get("step_vs_fp32"))),
        ("test acc (%)",
         lambda r: "" if "mean" not in r else f"{r['mean']:.2f} ± {r['std']:.2f}")]),
    "fidelity.jsonl": ("Accuracy at the default: model families, paired seeds", [
        ("family", "family"), ("seed", "seed"), ("config", "config"),
        ("metric (%)", lambda r: f"{100 * r['value']:.2f}"),
        ("final loss", lambda r: f"{r['final_loss']:.4f}"),
        ("context MB", lambda r: _mb(r.get("context_bytes"))),
        ("bits", lambda r: "" if r.get("avg_bits") is None else f"{r['avg_bits']:.2f}"),
        ("step ms", lambda r: f"{r['step_ms']:.1f}")]),
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
        ("graph", "graph"), ("nodes", "num_nodes"), ("model", "model"),
        ("style", lambda r: r.get("style", "module")), ("bits", "bits"),
        ("peak MB", lambda r: _mb(r.get("peak_bytes"))),
        ("graph cache MB", lambda r: _mb(r.get("graph_cache_bytes"))),
        ("PyG fp32 over this", lambda r: _x(r.get("peak_ratio_vs_fp32"))),
        ("reached at", "at")]),
    "distributed.jsonl": ("Partitioned full-batch training (gloo, one machine)", [
        ("model", "model"), ("nodes", "num_nodes"), ("parts", "method"), ("k", "world_size"),
        ("exchange bits", "exchange_bits"),
        ("exchanged MB/step", lambda r: _mb(r.get("exchanged_bytes_total"))),
        ("saved MB/rank", lambda r: _mb(r.get("saved_bytes_max"))),
        ("step peak MB/rank", lambda r: _mb(r.get("step_peak_bytes_max"))),
        ("peak / share", lambda r: "" if not r.get("peak_over_share")
         else f"{max(r['peak_over_share']):.2f}"),
        ("step s", "step_seconds_max")]),
    "neighbor.jsonl": ("NeighborLoader: saved context per batch", [
        ("model", "model"), ("impl", "impl"), ("bits", "bits"), ("batch", "batch_size"),
        ("fanout", lambda r: "-".join(map(str, r["fanout"]))),
        ("saved MB/batch", lambda r: _mb(r.get("saved_bytes_mean"))),
        ("vs PyG", lambda r: _x(r.get("saved_ratio_vs_pyg")))]),
    "quantize.jsonl": ("Quantizer throughput", [
        ("op", "op"), ("backend", "backend"), ("dtype", "dtype"), ("bits", "bits"),
        ("GB/s", lambda r: f"{r['gbps']:.2f}"), ("share of a copy", "frac_of_copy")]),
    "kernel_profile.jsonl": ("Kernels under Nsight Compute (benchmarks/profile_kernels.py)", [
        ("kernel", "kernel"), ("µs", "duration_us"), ("DRAM %", "dram_pct"),
        ("L2 %", "l2_pct"), ("issue %", "issue_pct"), ("warps active %", "occupancy_pct"),
        ("registers", "registers"), ("warp instructions a group", "warp_instructions_per_group"),
        ("L2 sector writes / needed",
         lambda r: f"{r['l2_write_sectors'] / r['ideal_write_sectors']:.2f}"),
        ("first stall reasons", lambda r: ", ".join(
            f"{k} {v:.0%}" for k, v in list(r.get("stall_share", {}).items())[:3]))]),
    "sass_counts.jsonl": ("Quantizer instructions of a warp's whole-group pass "
                          "(tools/sass_counts.py)", [
        ("build", lambda r: ", ".join(r["defines"]) or "default"), ("dtype", "dtype"),
        ("bits", "bits"), ("group", "group_size"),
        ("values", lambda r: r.get("values", r["group_size"])),  # one group before 16 lanes
        ("total", "total"), ("fma", "fma"),
        ("alu", "alu"), ("conv", "conv"), ("mem", "mem"), ("shfl", "shfl"),
        ("other", "other")]),
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
    write_results(results, out)
    return target


# ----------------------------------------------------------------------------------------------
# Curated tables of the results page


def _rows(results: Path, name: str) -> list[dict]:
    path = results / name
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _newest(rows: list[dict], key) -> dict[tuple, dict]:
    """The newest row (by date) per ``key(row)``, in the order the keys first appear."""
    found: dict[tuple, dict] = {}
    for r in rows:
        k = key(r)
        if k not in found or r["date"] >= found[k]["date"]:
            found[k] = r
    return found


def _source(name: str, rows) -> list[str]:
    """Where the rows of a table came from: the file, the devices, torch versions and dates."""
    rows = list(rows)
    if not rows:
        return [f"No rows in ``benchmarks/results/{name}`` yet.", ""]
    devices = ", ".join(dict.fromkeys(r.get("device_name", "?") for r in rows))
    torch_versions = ", ".join(dict.fromkeys(r.get("torch", "?") for r in rows))
    dates = sorted(r.get("date", "?")[:10] for r in rows)
    when = dates[0] if dates[0] == dates[-1] else f"{dates[0]} to {dates[-1]}"
    return [f"*Rows from* ``benchmarks/results/{name}``: {devices}; torch {torch_versions}; "
            f"{when}.", ""]


_ORDER = {m: i for i, m in enumerate(("gcn", "sage", "gat", "gatv2", "gcnii", "gin"))}
_LABEL = {"gcn": "GCN", "sage": "SAGE", "gat": "GAT", "gatv2": "GATv2", "gcnii": "GCNII",
          "gin": "GIN"}
_METHODS = ("pyg", "gnnact8", "gnnact4", "gnnact2", "uniform4", "adaptive4", "adaptive3",
            "adaptive2", "pernode2", "amp", "checkpoint", "save_on_cpu")


def _model_key(model: str):
    return _ORDER.get(model, len(_ORDER)), model


def _mib(value) -> str:
    return "" if value is None else f"{value / 2**20:,.1f}"


def _arxiv_shape(r: dict) -> bool:
    return r.get("graph") in (None, "synthetic-arxiv")


def _saved_bytes(results: Path) -> list[str]:
    """Saved context on the arxiv shape: PyG fp32 and gnnact's ratio at 1, 2, 4 and 8 bits."""
    name = "saved_bytes.jsonl"
    rows = [r for r in _rows(results, name) if _arxiv_shape(r) and r.get("graph_cache_counted")
            and r.get("style", "module") == "module" and r.get("adaptive_avg_bits") is None]
    best = _newest(rows, lambda r: (r["model"], r["bits"]))
    models = sorted({m for m, _ in best}, key=_model_key)
    widths = sorted({b for _, b in best})
    body = []
    for m in models:
        cells = [best.get((m, b)) for b in widths]
        ref = next(r for r in cells if r is not None)
        body.append([_LABEL.get(m, m), _mib(ref["pyg_fp32_bytes"]),
                     *[_x1(r["ratio"]) if r else "–" for r in cells],
                     _mib(ref["graph_cache_bytes"])])
    header = ["model", "PyG fp32 (MiB)", *[f"gnnact {b} bit{'s' * (b > 1)}" for b in widths],
              "of which graph cache (MiB)"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _x1(value) -> str:
    return "" if value is None else f"{value:.1f}×"


def _x3(value) -> str:
    """A ratio to three significant digits: 1.23×, 12.3×."""
    return "" if value is None else f"{value:.3g}×"


_DATASETS = {"dblp": "DBLP", "computers": "Amazon-Computers", "physics": "Coauthor-Physics",
             "cora": "Cora"}


#: How a model is written (the benchmarks' ``style``), in table order.
_STYLES = {"module": "gnnact.models (modules)", "functional": "F.relu / F.dropout",
           "pyg": "PyG's model class"}


def _saved_styles(results: Path) -> list[str]:
    """The same models written three ways (modules, functional calls, PyG's model classes)."""
    name = "saved_bytes.jsonl"
    styles = _STYLES
    rows = [r for r in _rows(results, name) if _arxiv_shape(r) and r.get("graph_cache_counted")
            and r.get("style") in styles and r.get("adaptive_avg_bits") is None
            and r["bits"] in (2, 4)]
    best = _newest(rows, lambda r: (r["model"], r["style"], r["bits"]))
    keys = sorted({(m, s) for m, s, _ in best},
                  key=lambda k: (_model_key(k[0]), list(styles).index(k[1])))
    body = [[_LABEL.get(m, m), styles[s], _mib(best[m, s, 2]["pyg_fp32_bytes"]),
             *[_x1(best[m, s, b]["ratio"]) if (m, s, b) in best else "–" for b in (2, 4)]]
            for m, s in keys if (m, s, 2) in best]
    header = ["model", "written as", "PyG fp32 (MiB)", "gnnact 2 bits", "gnnact 4 bits"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _saved_adaptive(results: Path) -> list[str]:
    """Adaptive widths on the arxiv shape: the ratio at each average, and the estimate's cost."""
    name = "saved_bytes.jsonl"
    rows = [r for r in _rows(results, name) if _arxiv_shape(r)
            and r.get("adaptive_avg_bits") is not None]
    # Prefer rows that count the graph cache; a model with none of those shows its older rows.
    counted = _newest([r for r in rows if r.get("graph_cache_counted")],
                      lambda r: (r["model"], r["adaptive_avg_bits"]))
    older = _newest(rows, lambda r: (r["model"], r["adaptive_avg_bits"]))
    best = {k: counted.get(k, v) for k, v in older.items()}
    models = sorted({m for m, _ in best}, key=_model_key)
    averages = sorted({a for _, a in best}, reverse=True)
    body, uncounted = [], False
    for m in models:
        cells = []
        for a in averages:
            r = best.get((m, a))
            mark = "" if r is None or r.get("graph_cache_counted") else "‡"
            uncounted |= bool(mark)
            cells.append("–" if r is None else _x1(r["ratio"]) + mark)
        r = next(best[m, a] for a in averages if (m, a) in best)
        passes = r.get("estimate_passes")
        cost = "" if passes is None else (f"{passes - 1} tensors, {passes} passes, "
                                          f"{r['estimate_s']:,.0f} s")
        body.append([_LABEL.get(m, m), *cells, cost])
    header = ["model", *[f"adaptive {a:g}" for a in averages], "estimate (CPU)"]
    lines = [*_source(name, best.values()), *_list_table([header, *body]), ""]
    if uncounted:
        lines += ["‡ a row from before the graph cache was counted: the ratio with it counted is "
                  "lower.", ""]
    return lines


def _markdown(text: str) -> list[str]:
    """A markdown table (and the note paragraphs after it) as a reST list-table."""
    table, notes = [], []
    for line in text.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-:") for c in cells):
                table.append(cells)
        elif line.strip():
            notes.append(line.strip())
    lines = [*_list_table(table), ""]
    for note in notes:
        lines += [note, ""]
    return lines


def _table3(results: Path, graph: str) -> list[str]:
    """GACT's Table 3 shape on ``graph``: ``benchmarks/table3.py``'s selection and layout."""
    rows = [r for r in _rows(results, "suite.jsonl") if r.get("graph") == graph]
    saved = _rows(results, "saved_bytes.jsonl")
    if not any(r["method"] == "pyg" for r in rows):
        return ["No rows yet.", ""]
    return [*_source("suite.jsonl", rows), *_markdown(table3(rows, graph, saved=saved))]


def _suite(results: Path, graph: str, device: str) -> list[str]:
    """The suite on one graph and device: the newest row per (model, method), against PyG."""
    name = "suite.jsonl"
    rows = [r for r in _rows(results, name) if r["graph"] == graph and r["device"] == device]
    best = _newest(rows, lambda r: (r["model"], r["method"]))
    keys = sorted(best, key=lambda k: (_model_key(k[0]), _METHODS.index(k[1])
                                       if k[1] in _METHODS else len(_METHODS)))
    cuda = device.startswith("cuda")
    header = ["model", "method", "test acc (%)", "Δ vs PyG (pt)", "saved context (MB)",
              "vs PyG", "step (ms)", "vs PyG", *(["peak (MB)", "vs PyG"] if cuda else [])]
    body = []
    for m, method in keys:
        r, ref = best[m, method], best.get((m, "pyg"))
        line = [_LABEL.get(m, m), method, f"{r['acc_mean']:.2f} ± {r['acc_std']:.2f}",
                "" if ref is None else f"{r['acc_mean'] - ref['acc_mean']:+.2f}",
                _mb(r.get("saved_bytes")),
                _ratio(ref and ref.get("saved_bytes"), r.get("saved_bytes")),
                f"{r['epoch_ms']:.1f}", _ratio(r["epoch_ms"], ref and ref["epoch_ms"])]
        if cuda:
            line += [_mb(r.get("peak_bytes")),
                     _ratio(ref and ref.get("peak_bytes"), r.get("peak_bytes"))]
        body.append(line)
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _ratio(a, b) -> str:
    return "" if not a or not b else f"{a / b:.2f}×"


def _accuracy(results: Path) -> list[str]:
    """Accuracy on real graphs: fp32 and each width, mean ± std over seeds, change vs fp32."""
    name = "accuracy.jsonl"
    best = _newest(_rows(results, name), lambda r: (r["dataset"], r["model"], r["bits"]))
    pairs = list(dict.fromkeys((d, m) for d, m, _ in best))
    widths = sorted({b for _, _, b in best if b != 32}, reverse=True)
    body = []
    for d, m in pairs:
        ref = best.get((d, m, 32))
        cells = []
        for b in widths:
            r = best.get((d, m, b))
            cells.append("–" if r is None else f"{r['mean']:.2f} ± {r['std']:.2f} "
                         f"({r['delta_vs_fp32']:+.2f})")
        seeds = len((ref or best[d, m, widths[0]])["test_acc"])
        body.append([_DATASETS.get(d, d), _LABEL.get(m, m), str(seeds),
                     str((ref or {}).get("epochs", "")),
                     "–" if ref is None else f"{ref['mean']:.2f} ± {ref['std']:.2f}", *cells])
    header = ["dataset", "model", "seeds", "epochs", "PyG fp32", *[f"gnnact {b} bits"
                                                                   for b in widths]]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _main_job(results: Path) -> list[str]:
    """The main job's newest run."""
    name = "main_job.jsonl"
    rows = _rows(results, name)
    if not rows:
        return _source(name, rows)
    last = max(rows, key=lambda r: r["date"])
    run = [r for r in rows if r["commit"] == last["commit"] and r["date"][:10]
           == last["date"][:10]]
    body = [["fp32 (PyG)" if r["bits"] == 32 else f"{r['bits']} bits", _pct(r["test_acc"]),
             _mb(r["saved_bytes"]), _x1(r["ratio_vs_fp32"])] for r in run]
    return [*_source(name, run), *_list_table([["GCN", "test acc (%)", "saved context (MB)",
                                                "vs fp32"], *body])]


def _throughput(row: dict) -> str:
    """GB/s of one call and its share of a copy; with the kernel's own share where the row
    timed the GPU's work alone (``kernel_frac_of_copy``)."""
    text = f"{row['gbps']:,.1f} ({100 * row['frac_of_copy']:.0f} %"
    if row.get("kernel_frac_of_copy") is not None:
        text += f"; kernel {100 * row['kernel_frac_of_copy']:.0f} %"
    return text + ")"


def _quantize(results: Path) -> list[str]:
    """Quantizer throughput: GB/s per width, and its share of a plain copy of the same bytes."""
    name = "quantize.jsonl"
    rows = [r for r in _rows(results, name) if r.get("bench", "quantize_throughput")
            == "quantize_throughput"]
    best = _newest(rows, lambda r: (r["device"], r["dtype"], r["backend"], r["op"], r["bits"]))
    widths = sorted({k[-1] for k in best})
    keys = list(dict.fromkeys(k[:-1] for k in best))
    body = []
    for k in keys:
        some = next(best[(*k, b)] for b in widths if (*k, b) in best)
        cells = []
        for b in widths:
            r = best.get((*k, b))
            cells.append("–" if r is None else _throughput(r))
        body.append([some["device_name"], k[1], k[2], k[3], f"{some['numel']:,}",
                     f"{some['copy_gbps']:,.0f}", *cells])
    header = ["device", "dtype", "backend", "op", "values", "copy GB/s",
              *[f"{b} bits GB/s (of copy)" for b in widths]]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _mask_ops(results: Path) -> list[str]:
    """The mask ops' throughput (a mask made from signs; a packed mask applied) per mode
    (``mul``: ReLU's forward and dropout, ``zero``: ReLU's backward, ``select``: LeakyReLU's),
    kernels against the torch path, per device and dtype: GB/s and its share of a plain
    copy."""
    name = "quantize.jsonl"
    rows = [r for r in _rows(results, name) if r.get("bench") == "mask_throughput"]
    if not rows:
        return ["No rows yet: ``bench_quantize.py`` writes them (``bench: mask_throughput``); "
                "the kernels' first rows await a GPU (``benchmarks/gpu_all.sh tests``)."]
    def mode(r: dict) -> str:
        # (Rows before the modes were timed apart are ReLU's forward's, ``mul``; the dropout
        # draw has none.)
        return r.get("mode") or ("–" if r["op"] == "dropout_draw" else "mul")

    best = _newest(rows, lambda r: (r["device"], r["dtype"], r["backend"], r["op"], mode(r)))
    body = [[r["device_name"], k[1], k[2], k[3], k[4], f"{r['numel']:,}", _throughput(r)]
            for k, r in best.items()]
    header = ["device", "dtype", "backend", "op", "mode", "values", "GB/s (of copy)"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _generic(results: Path) -> list[str]:
    """The generic pipeline on CNNs and a transformer, per device: bytes, time, digits."""
    name = "generic.jsonl"
    best = _newest(_rows(results, name), lambda r: (r["device"], r["part"], r["model"],
                                                     r["method"]))
    methods = {"fp32": "fp32", "quantize4": "quantize 4", "quantize2": "quantize 2",
               "mesa": "Mesa 8", "division": "DIVISION 8/2", "default4": "default policy, 4",
               "default2": "default policy, 2",
               "default2_wide_index": "default policy, 2, indices at their own width"}
    lines = []
    for device in dict.fromkeys(k[0] for k in best):
        cuda = device.startswith("cuda")
        keys = [k for k in best if k[0] == device and k[1] == "bytes"]
        header = ["model", "method", "saved context vs fp32", "step vs fp32",
                  *(["peak lower by"] if cuda else []), "digits test acc (%)", "digits ratio"]
        body = []
        for k in keys:
            r, digits = best[k], best.get((device, "digits", k[2], k[3]))
            saved = (f"{r['saved_bytes'] / 1e6:.1f} MB" if k[3] == "fp32"
                     else _x3(r["saved_ratio"]))
            line = [k[2], methods.get(k[3], k[3]), saved, _x3(r.get("step_vs_fp32"))]
            if cuda:
                line.append(_x3(r.get("peak_ratio")))
            line += ["" if digits is None else f"{digits['mean']:.2f} ± {digits['std']:.2f}",
                     "" if digits is None else _x3(digits["saved_ratio"])]
            body.append(line)
        rows = [best[k] for k in best if k[0] == device]
        lines += [*_source(name, rows), *_list_table([header, *body]), ""]
    return lines


def _train(results: Path) -> list[str]:
    """One training step on a GPU: PyG fp32 against gnnact, newest row per configuration."""
    name = "train.jsonl"
    best = _newest(_rows(results, name), lambda r: (r["graph"], r["model"], r["impl"],
                                                     r["bits"]))
    keys = sorted(best, key=lambda k: (k[0], _model_key(k[1]), k[2] != "pyg", k[3]))
    body = [[k[0], _LABEL.get(k[1], k[1]), "PyG fp32" if k[2] == "pyg" else f"gnnact {k[3]} bits",
             "out of memory" if best[k].get("oom") else f"{best[k]['epoch_ms']:.1f}",
             _x3(best[k].get("time_vs_pyg")), _mib(best[k].get("peak_bytes")),
             _x3(best[k].get("peak_ratio_vs_pyg"))] for k in keys]
    header = ["graph", "model", "method", "step (ms)", "vs PyG", "peak (MiB)", "peak lower by"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _swap(results: Path) -> list[str]:
    """Swap and prefetch: step time and peak per method, then the copy summary per graph."""
    name = "swap.jsonl"
    rows = _rows(results, name)
    best = _newest([r for r in rows if r["method"] != "summary"],
                   lambda r: (r["graph"], r["num_nodes"], r.get("model"), r["method"]))
    body = [[k[0], f"{k[1]:,}", _LABEL.get(k[2], k[2] or ""), k[3],
             "out of memory" if best[k].get("oom") else f"{best[k]['epoch_ms']:.1f}",
             "" if best[k].get("oom") else _mib(best[k].get("peak_bytes"))] for k in best]
    header = ["graph", "nodes", "model", "method", "step (ms)", "peak (MiB)"]
    lines = [*_source(name, best.values()), *_list_table([header, *body]), ""]
    summary = _newest([r for r in rows if r["method"] == "summary"
                       and r.get("copy_ms_exposed_without_prefetch") is not None],
                      lambda r: (r["graph"], r["num_nodes"]))
    if summary:
        body = [[k[0], f"{k[1]:,}", _x1(r.get("swap_speedup_vs_fp32_swap")) or "–",
                 f"{r['copy_ms_exposed_without_prefetch']:.1f}",
                 f"{r['copy_ms_exposed_with_prefetch']:.1f}"] for k, r in summary.items()]
        header = ["graph", "nodes", "gnnact swap vs PyG save_on_cpu (speed-up)",
                  "copy ms exposed, no prefetch", "copy ms exposed, prefetch"]
        lines += [*_list_table([header, *body]), ""]
    return lines


def _largest(results: Path) -> list[str]:
    """Newest row per device, model, method and cap; "vs PyG" against PyG's row of the same
    device, model and cap. A GPU's cap is its allocator's; the CPU's is counted (the
    step's :class:`~gnnact.peak.PeakMeter` peak)."""
    name = "largest.jsonl"
    best = _newest(_rows(results, name),
                   lambda r: (r["device_name"], r["model"], r["method"], r["cap_bytes"]))
    base = {(k[0], k[1], k[3]): r["largest_nodes"] for k, r in best.items() if k[2] == "pyg"}
    body = []
    for (device, model, method, cap), r in best.items():
        pyg = base.get((device, model, cap))
        how = "counted" if r.get("cap_by") == "meter" else "allocator"
        products = ("–" if "products_peak_bytes" not in r  # not measured
                    else _mib(r["products_peak_bytes"]) or "out of memory")
        body.append([device, _LABEL.get(model, model), method, f"{cap / 2**30:g} ({how})",
                     f"{r['largest_nodes']:,}", _x1(r["largest_nodes"] / pyg) if pyg else "",
                     _mib(r.get("peak_bytes_at_largest")),
                     _mib(r.get("graph_build_peak_bytes")) or "–", products])
    header = ["device", "model", "method", "cap (GiB)", "largest graph (nodes)", "vs PyG",
              "peak there (MiB)", "graph build alone (MiB)", "peak at products' size (MiB)"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _no_twin(results: Path) -> list[str]:
    """Models with convs that have no twin: step peak and saved context, PyG fp32 against
    gnnact 2 bits with the messages made whole and in chunks (newest row per device, model
    and method)."""
    name = "no_twin.jsonl"
    best = _newest(_rows(results, name), lambda r: (r["device_name"], r["num_nodes"],
                                                    r["model"], r["method"]))
    labels = {"pyg": "PyG fp32", "gnnact2_whole": "2 bits, messages whole",
              "gnnact2_wide_index": "2 bits, chunks, indices at their own width",
              "gnnact2": "2 bits, messages in chunks"}
    body = [[k[0], f"{k[1]:,}", k[2], labels.get(k[3], k[3]),
             "out of memory" if r.get("oom") else _mib(step_peak_bytes(r)),
             _x1(r.get("peak_ratio_vs_pyg")) or "–", _mib(r["saved_bytes"]) or "–",
             _x1(r.get("saved_ratio_vs_pyg")) or "–",
             f"{r['step_s']:.3f}" if r.get("step_s") else "–"] for k, r in best.items()]
    header = ["device", "nodes", "model", "method", "step peak, graph cache included (MiB)",
              "lower than PyG by", "saved context (MiB)", "less than PyG by", "step (s)"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _fidelity(results: Path) -> list[str]:
    """Accuracy at the default: per family (newest run of each device, family, seed and
    configuration), fp32 and ``gnnact.convert(model)`` with no config on paired seeds, the
    fixed 2 bits beside them, the fixed 8 bits control where run (what a perturbation alone
    moves the metric by on those seeds), context and step time (of these runs, and of
    ``bench_speed.py --fixed2``, which takes turns with fixed 2 bits)."""
    name = "fidelity.jsonl"
    best = _newest(_rows(results, name), lambda r: (r["device_name"], r["family"], r["seed"],
                                                   r["config"]))
    groups: dict[tuple, dict] = {}
    for (device, family, seed, config), r in best.items():
        groups.setdefault((device, family), {}).setdefault(config, {})[seed] = r
    # Steps of runs one after the other swing with the load on the cores; bench_speed's
    # --fixed2 takes turns with fixed 2 bits in the same rounds (newest such row per family).
    turns = {k: r["ratio_fixed2"] for k, r in _newest(
        [r for r in _rows(results, "speed.jsonl") if r.get("ratio_fixed2")],
        lambda r: (r["device_name"], r["case"])).items()}
    body = []
    for (device, family), by in groups.items():
        fp32 = by.get("pyg", {})
        auto = by.get("auto", {})
        seeds = sorted(set(fp32) & set(auto))
        if not seeds:
            continue
        first = auto[seeds[0]]

        def paired(config: str, fp32=fp32, by=by, seeds=seeds) -> str:
            runs = by.get(config, {})
            diffs = [100 * (runs[s]["value"] - fp32[s]["value"]) for s in seeds if s in runs]
            if not diffs:
                return "–"
            spread = statistics.stdev(diffs) if len(diffs) > 1 else 0.0
            return f"{statistics.fmean(diffs):+.2f} ± {spread:.2f}"

        ratios = [fp32[s]["context_bytes"] / auto[s]["context_bytes"] for s in seeds
                  if auto[s].get("context_bytes")]
        fixed = by.get("fixed2", {})
        steady = [auto[s]["steady_step_ms"] / fixed[s]["steady_step_ms"] for s in seeds
                  if s in fixed]
        firsts = [auto[s]["first_step_ms"] / fixed[s]["first_step_ms"] for s in seeds
                  if s in fixed]
        bits = [auto[s]["avg_bits"] for s in seeds if auto[s].get("avg_bits") is not None]
        body.append([
            device, family, first["dataset"], first["metric"], str(first["epochs"]),
            str(len(seeds)), f"{100 * statistics.fmean(fp32[s]['value'] for s in seeds):.2f}",
            paired("auto"), paired("fixed2"), paired("fixed8"),
            _x1(statistics.fmean(ratios)) if ratios else "–",
            f"{statistics.fmean(bits):.2f}" if bits else "–",
            # (two decimals: the targets are 1.15x and 1.5x)
            f"{statistics.fmean(steady):.2f}×" if steady else "–",
            f"{turns[device, family]:.2f}×" if (device, family) in turns else "–",
            f"{statistics.fmean(firsts):.2f}×" if firsts else "–"])
    if not body:
        return [f"No rows in ``benchmarks/results/{name}`` yet.", ""]
    header = ["device", "family", "data", "metric", "epochs", "seeds", "fp32 (%)",
              "default convert − fp32 (points)", "fixed 2 bits − fp32",
              "fixed 8 bits − fp32 (control)", "context below fp32",
              "bits per value", "steady step / fixed 2 bits",
              "step / fixed 2 bits, taking turns", "first step / fixed 2 bits"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _pass_kind(row: dict | None) -> str:
    """How a converted variant's last step ran (rows since the field: ``as_pytorch``)."""
    if row is None or row.get("as_pytorch") is None:
        return "–"
    return "as PyTorch's" if row["as_pytorch"] else "compressed"


def _speed(results: Path) -> list[str]:
    """Step time, PyG fp32 against ``gnnact.convert(model)`` (eager, and compiled where
    measured; automatic widths against a fixed 2 bits where measured), per case (newest run
    of each device, case, variant and thread count)."""
    name = "speed.jsonl"
    best = _newest(_rows(results, name), lambda r: (r["device_name"], r["threads"], r["case"],
                                                   r["variant"]))
    cases: dict[tuple, dict] = {}
    for (device, threads, case, variant), r in best.items():
        cases.setdefault((device, threads, case), {})[variant] = r

    def ms(r) -> str:
        if r is None:
            return "–"
        if r.get("error"):
            return r["error"].split(":")[0]
        # (A variant whose recipe never called the module: GAE's compiled one, its recipe
        # calling encode and recon_loss.)
        return "no step" if r["step_ms"] is None else f"{r['step_ms']:.1f}"

    body = []
    for (device, threads, case), by in cases.items():
        pyg, ours = by.get("pyg"), by.get("gnnact")
        compiled = by.get("gnnact_compiled")
        fixed = ours.get("ratio_fixed2") if ours else None
        body.append([device, str(threads), case, (pyg or ours)["dataset"], ms(pyg), ms(ours),
                     _x(ours.get("ratio")) if ours else "–", _pass_kind(ours),
                     ms(by.get("pyg_compiled")), ms(compiled),
                     _x(compiled.get("ratio_compiled")) if compiled else "–",
                     _x(fixed) if fixed is not None else "–"])
    if not body:
        return [f"No rows in ``benchmarks/results/{name}`` yet.", ""]
    header = ["device", "threads", "case", "data", "PyG step (ms)", "gnnact step (ms)",
              "gnnact / PyG", "gnnact's step", "PyG compiled (ms)", "gnnact compiled (ms)",
              "compiled: gnnact / PyG", "gnnact / gnnact at 2 bits"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _graph_cache(results: Path) -> list[str]:
    """Bytes per edge of the graph cache each conv kind keeps, against the caller's int64
    ``edge_index`` (16 bytes per edge), one thread."""
    name = "graph_cache.jsonl"
    rows = [r for r in _rows(results, name) if r["variant"] == "new" and r.get("threads") == 1]
    best = _newest(rows, lambda r: (r["graph"], r["kind"]))
    body = [[k[0], k[1], "yes" if r["symmetric"] else "no", f"{r['bytes_per_edge']:.1f}",
             _mib(r["cache_bytes"])] for k, r in best.items()]
    header = ["graph", "conv kind", "symmetric", "bytes per edge", "cache (MiB)"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _ablation(results: Path) -> list[str]:
    name = "adaptive_ablation.jsonl"
    rows = _rows(results, name)
    body = [[r["graph"], _LABEL.get(r["model"], r["model"]), r["method"], str(r["epochs"]),
             f"every {r['adapt_interval']}", str(r["min_bits"]),
             f"{r['acc_mean']:.2f} ± {r['acc_std']:.2f}"] for r in rows]
    header = ["graph", "model", "method", "epochs", "estimates", "min bits", "test acc (%)"]
    return [*_source(name, rows), *_list_table([header, *body])]


#: The results page's tables: file stem under ``_generated`` -> renderer of the results folder.
def _peak(results: Path) -> list[str]:
    """A step's peak, PyG fp32 against gnnact 2 bits, per device, model and the way the model
    is written (newest rows; rows before the style was recorded are ``module``)."""
    name = "peak.jsonl"
    best = _newest(_rows(results, name), lambda r: (r["device"], r["graph"], r["num_nodes"],
                                                     r["model"], r.get("style", "module"),
                                                     r["bits"]))
    keys = sorted({k[:5] for k in best},
                  key=lambda k: (k[0], k[1], k[2], _model_key(k[3]), list(_STYLES).index(k[4])))
    body = []
    for k in keys:
        pyg, ours = best.get((*k, 32)), best.get((*k, 2))
        if ours is None:
            continue
        cache = ours.get("graph_cache_bytes")
        body.append([ours["device_name"], f"{k[1]} ({k[2]:,} nodes)", _LABEL.get(k[3], k[3]),
                     _STYLES[k[4]],
                     "–" if pyg is None else _mib(step_peak_bytes(pyg)),
                     _mib(step_peak_bytes(ours)), "–" if cache is None else _mib(cache),
                     "–" if pyg is None else _x1(step_peak_bytes(pyg) / step_peak_bytes(ours)),
                     ours.get("at") or ""])
    header = ["device", "graph", "model", "written as", "PyG fp32 (MiB)",
              "gnnact 2 bits, graph cache included (MiB)", "of which graph cache (MiB)",
              "lower by", "2-bit peak reached at"]
    return [*_source(name, [r for r in best.values()]), *_list_table([header, *body])]


def _distributed(results: Path) -> list[str]:
    """Partitioned training: per (model, nodes, parts, k, exchange bits), the newest row that
    has a step peak."""
    name = "distributed.jsonl"
    rows = [r for r in _rows(results, name) if r.get("bench") == "distributed"
            and r.get("step_peak_bytes_max") is not None]
    best = _newest(rows, lambda r: (r["model"], r["num_nodes"], r["method"], r["world_size"],
                                    r["exchange_bits"]))
    keys = sorted(best, key=lambda k: (_model_key(k[0]), k[1], k[2], k[3], -k[4]))
    body = [[_LABEL.get(k[0], k[0]), f"{k[1]:,}", k[2], str(k[3]), str(k[4]),
             f"{r['exchanged_bytes_total'] / 1e6:.1f}", _mib(r["saved_bytes_max"]),
             _mib(r["step_peak_bytes_max"]),
             "" if not r.get("peak_over_share") else f"{max(r['peak_over_share']):.2f}",
             f"{r['step_seconds_max']:.2f}"] for k, r in ((k, best[k]) for k in keys)]
    header = ["model", "nodes", "parts", "k", "exchange bits", "exchanged MB/step",
              "saved MiB/rank", "step peak MiB/rank", "peak / share", "step (s)"]
    return [*_source(name, best.values()), *_list_table([header, *body])]


def _distributed_accuracy(results: Path) -> list[str]:
    """Test accuracy of k ranks against one process, paired by seed (the newest run per
    seed), mean over the seeds."""
    name = "distributed.jsonl"
    rows = [r for r in _rows(results, name) if r.get("bench") == "distributed_accuracy"]
    best = _newest(rows, lambda r: (r["graph"], r["world_size"], r["exchange_bits"], r["seed"]))
    single = {(k[0], k[3]): r["test_acc"] for k, r in best.items() if k[1] == 1}
    runs: dict[tuple, list[tuple[float, float]]] = {}
    for k, r in best.items():
        if k[1] > 1 and (k[0], k[3]) in single:
            runs.setdefault(k[:3], []).append((single[(k[0], k[3])], r["test_acc"]))
    body = []
    for (graph, k, bits), pairs in runs.items():
        one = [100 * a for a, _ in pairs]
        many = [100 * b for _, b in pairs]
        diffs = [b - a for a, b in zip(one, many, strict=True)]
        spread = f" ± {statistics.stdev(diffs):.2f}" if len(diffs) > 1 else ""
        body.append([graph, str(k), str(bits), str(len(pairs)), _mean_std(one), _mean_std(many),
                     f"{statistics.mean(diffs):+.2f}{spread}"])
    header = ["graph", "k", "exchange bits", "seeds", "one process (%)", "k ranks (%)",
              "difference (points, mean ± std over the seeds)"]
    return [*_source(name, rows), *_list_table([header, *body])]


RESULTS = {
    "saved_bytes": _saved_bytes,
    "saved_styles": _saved_styles,
    "saved_adaptive": _saved_adaptive,
    **{f"table3_{g}": (lambda results, g=g: _table3(results, g))
       for g in ("dblp", "computers", "physics")},
    "adaptive_ablation": _ablation,
    "accuracy": _accuracy,
    "suite_cora": lambda results: _suite(results, "cora", "cpu"),
    "suite_gpu_physics": lambda results: _suite(results, "physics", "cuda"),
    "suite_gpu_arxiv": lambda results: _suite(results, "synthetic-arxiv", "cuda"),
    "main_job": _main_job,
    "quantize": _quantize,
    "mask_ops": _mask_ops,
    "generic": _generic,
    "train": _train,
    "swap": _swap,
    "largest": _largest,
    "no_twin": _no_twin,
    "fidelity": _fidelity,
    "speed": _speed,
    "graph_cache": _graph_cache,
    "peak": _peak,
    "distributed": _distributed,
    "distributed_accuracy": _distributed_accuracy,
    "gat_cora": lambda results: _gat_cora(_rows(results, "gat_cora.jsonl")),
}


def write_results(results: Path, out: Path) -> list[Path]:
    """Write ``out/results_<name>.rst`` for every table of :data:`RESULTS`."""
    written = []
    for stem, render in RESULTS.items():
        target = out / f"results_{stem}.rst"
        target.write_text("\n".join(render(results)) + "\n")
        written.append(target)
    return written
