"""The benchmark suite end to end on tiny graphs: smoke mode, result rows, summary, plots."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
TOOLS = BENCH.parent / "tools"


def _script(name: str, folder: Path = BENCH):
    """The script ``folder/<name>.py`` (a benchmark, or with ``TOOLS`` a tool) as a module."""
    sys.path.insert(0, str(folder))
    spec = importlib.util.spec_from_file_location(name, folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run_suite(suite, tmp_path, *args: str) -> list[dict]:
    """The rows of a suite run on a 300-node graph, 2 epochs, seed 0, with ``args``."""
    out = tmp_path / "suite.jsonl"
    assert suite.main(["--nodes", "300", "--epochs", "2", "--seeds", "0", *args, "--out",
                       str(out), "--summary", str(tmp_path / "suite.md")]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_suite_smoke_writes_nothing(tmp_path, capsys):
    suite = _script("bench_suite")
    out, summary = tmp_path / "suite.jsonl", tmp_path / "suite.md"
    assert suite.main(["--smoke", "--models", "gcn", "gat", "--out", str(out),
                       "--summary", str(summary)]) == 0
    text = capsys.readouterr().out
    for method in suite.METHODS:
        assert f"| gcn | {method} |" in text and f"| gat | {method} |" in text
    assert not out.exists() and not summary.exists()


def test_suite_rows_summary_and_plots(tmp_path):
    pytest.importorskip("matplotlib")
    suite, plots = _script("bench_suite"), _script("plot_suite")
    out, summary = tmp_path / "suite.jsonl", tmp_path / "suite.md"
    assert suite.main(["--nodes", "300", "--epochs", "2", "--seeds", "0", "1", "--models",
                       "gcn", "--methods", "pyg", "gnnact2", "amp", "checkpoint", "--out",
                       str(out), "--summary", str(summary)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["method"] for r in rows] == ["pyg", "gnnact2", "amp", "checkpoint"]
    for r in rows:
        assert r["seeds"] == [0, 1] and len(r["test_acc"]) == 2 and r["commit"]
        assert r["num_nodes"] == 300 and r["epoch_ms"] > 0 and r["peak_bytes"] is None
    pyg, packed, amp, ckpt = rows
    # (gnnact's graph cache counted: on 300 nodes it is a larger share than on real graphs)
    assert pyg["saved_bytes"] > 15 * packed["saved_bytes"] > 0
    assert pyg["saved_bytes"] > amp["saved_bytes"] > 0 and ckpt["saved_bytes"] is None
    assert "| synthetic-arxiv | gcn | gnnact2 |" in summary.read_text()
    written = plots.plot(rows, tmp_path)
    assert [p.name for p in written] == ["suite_memory_accuracy_synthetic-arxiv_cpu.png",
                                         "suite_time_bits_synthetic-arxiv_cpu.png"]
    assert all(p.stat().st_size > 5_000 for p in written)


def test_suite_csr_adjacency(tmp_path):
    """``--adj csr``: every method gets the same graph as a sparse ``adj_t``, the loss is the one
    ``edge_index`` gives, and the rows say which form ran (and the BatchNorm momentum)."""
    import torch

    import gnnact
    from gnnact.models import build
    from gnnact.training import adjacency, loss_of

    suite = _script("bench_suite")
    with_csr = suite.load_graph("synthetic-arxiv", 300, 0, str(tmp_path), "csr")
    plain = suite.load_graph("synthetic-arxiv", 300, 0, str(tmp_path))
    assert adjacency(with_csr).layout == torch.sparse_csr and "edge_index" not in with_csr
    assert adjacency(plain) is plain.edge_index and with_csr.num_edges == plain.num_edges
    for name in ("gcn", "gat", "gcnii"):
        torch.manual_seed(0)
        model = build(name, plain.num_features, int(plain.y.max()) + 1).eval()
        torch.testing.assert_close(loss_of(model, with_csr), loss_of(model, plain))

    rows = _run_suite(suite, tmp_path, "--models", "gcn", "--methods", "pyg", "gnnact2",
                      "--adj", "csr", "--bn-momentum", "0.5")
    assert [(r["method"], r["adj"], r["bn_momentum"]) for r in rows] == [
        ("pyg", "csr", 0.5), ("gnnact2", "csr", 0.5)]
    assert rows[0]["saved_bytes"] > 10 * rows[1]["saved_bytes"] > 0
    model = build("gcn", 8, 3)  # conversion keeps the momentum the suite sets before it
    model.bns[0].momentum = 0.5
    assert gnnact.convert(model).bns[0].momentum == 0.5
    with pytest.raises(SystemExit):  # no bfloat16 sparse CSR product on the CPU
        suite.main(["--smoke", "--methods", "amp", "--adj", "csr"])


def test_suite_sparse_features(tmp_path):
    """``--features sparse``: the same features as a sparse CSR ``x``, the same loss, recorded."""
    import torch

    from gnnact.models import build
    from gnnact.training import loss_of

    suite = _script("bench_suite")
    sparse = suite.load_graph("synthetic-arxiv", 300, 0, str(tmp_path), "csr", "sparse")
    plain = suite.load_graph("synthetic-arxiv", 300, 0, str(tmp_path), "csr")
    assert sparse.x.layout == torch.sparse_csr
    torch.testing.assert_close(sparse.x.to_dense(), plain.x)
    torch.manual_seed(0)
    model = build("gcnii", plain.num_features, int(plain.y.max()) + 1).eval()
    torch.testing.assert_close(loss_of(model, sparse), loss_of(model, plain))
    rows = _run_suite(suite, tmp_path, "--models", "gcnii", "--methods", "pyg", "adaptive2",
                      "--adj", "csr", "--features", "sparse")
    assert [(r["method"], r["features"], r["first_interval"]) for r in rows] == [
        ("pyg", "sparse", 10), ("adaptive2", "sparse", 10)]


def test_saved_bytes_adaptive_rows(tmp_path):
    """One estimate per model serves every budget: each budget's widths keep its average, a
    larger budget keeps more bytes, and 2 bits on average keeps no more than 2 bits each."""
    bench = _script("bench_saved_bytes")
    out = tmp_path / "saved.jsonl"
    assert bench.main(["--nodes", "1500", "--models", "gat", "--bits", "2", "--adaptive", "2",
                       "4", "--out", str(out)]) == 0
    fixed, ad2, ad4 = (json.loads(line) for line in out.read_text().splitlines())
    assert (fixed["bits"], ad2["adaptive_avg_bits"], ad4["adaptive_avg_bits"]) == (2, 2, 4)
    assert ad2["estimate_passes"] == ad4["estimate_passes"] == len(ad2["widths"]) + 1
    assert ad2["estimate_s"] == ad4["estimate_s"]  # the same estimate
    assert ad2["gnnact_bytes"] <= fixed["gnnact_bytes"] < ad4["gnnact_bytes"]
    assert ad2["pyg_fp32_bytes"] == fixed["pyg_fp32_bytes"]
    assert set(ad2["widths"].values()) - set(range(1, 9)) == set()
    assert sorted(ad2["widths"]) == sorted(ad4["widths"])


def test_saved_bytes_writes_each_model_when_done(tmp_path, monkeypatch):
    """A model that fails (or is stopped) after another finished costs only its own rows."""
    bench = _script("bench_saved_bytes")
    out = tmp_path / "saved.jsonl"
    build = bench.build

    def build_or_fail(name, *args, **kwargs):
        if name == "gat":
            raise RuntimeError("stopped")
        return build(name, *args, **kwargs)

    monkeypatch.setattr(bench, "build", build_or_fail)
    with pytest.raises(RuntimeError, match="stopped"):
        bench.main(["--nodes", "1500", "--models", "gcn", "gat", "--bits", "2", "4",
                    "--out", str(out)])
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["model"], r["bits"]) for r in rows] == [("gcn", 2), ("gcn", 4)]


def test_table3_compares_like_with_like():
    """Changes against fp32 of the same model, epochs and seeds; the newest row wins."""
    table3 = _script("table3")

    def row(model, method, acc, date, epochs=100, saved=100):
        return {"bench": "suite", "graph": "g", "model": model, "method": method,
                "acc_mean": acc, "acc_std": 0.5, "epochs": epochs, "seeds": [0, 1, 2],
                "saved_bytes": saved, "graph_cache_counted": True, "date": date}

    def scheduled(r, first=10, interval=50, min_bits=1):
        return {**r, "adapt_interval": interval, "first_interval": first, "min_bits": min_bits}

    rows = [row("gcn", "pyg", 80.0, "2026-01-01"), row("gcn", "adaptive2", 79.0, "2026-01-01",
                                                         saved=4),
            row("gcn", "adaptive2", 80.25, "2026-01-02", saved=5),   # newer: replaces it
            row("gcn", "adaptive3", 70.0, "2026-01-03", epochs=50),  # another length: not used
            {**row("gcn", "adaptive4", 70.0, "2026-01-03"), "bn_momentum": 0.5},  # neither
            {**row("gcn", "gnnact4", 70.0, "2026-01-03"), "lr": 0.05},  # nor another rate
            row("gat", "uniform4", 60.0, "2026-01-01")]              # no fp32 row: no line
    lines = table3.table(rows, "g", table3.LEGACY).splitlines()
    assert len(lines) == 3
    assert lines[2] == "| GCN | 100 | 0.01 | 0.1 | 80.00 ± 0.50 | – | – | – | – | +0.25 | 20.0× |"
    # At the scheduled controller settings the legacy row stands in, marked, until a row of
    # those settings exists; another schedule or width never does.
    lines = table3.table(rows, "g").splitlines()
    assert lines[2].endswith("| +0.25† | 20.0× |") and lines[-1].startswith("† estimates")
    rows += [scheduled(row("gcn", "adaptive2", 80.1, "2026-01-01", saved=4)),
             scheduled(row("gcn", "adaptive2", 75.0, "2026-01-05"), first=None, interval=10),
             scheduled(row("gcn", "adaptive2", 75.0, "2026-01-05"), min_bits=2),
             scheduled(row("gcn", "uniform4", 81.0, "2026-01-05"), first=None)]  # not adaptive
    lines = table3.table(rows, "g").splitlines()
    assert lines[2] == ("| GCN | 100 | 0.01 | 0.1 | 80.00 ± 0.50 | – | +1.00 | – | – | +0.10 "
                        "| 25.0× |")
    assert len(lines) == 3
    # GCNII has no BatchNorm: no momentum shown, and rows that recorded one (as the suite did
    # before it wrote None for such models) compare with rows that did not.
    rows += [{**row("gcnii", "pyg", 70.0, "2026-01-01"), "bn_momentum": None},
             {**row("gcnii", "gnnact4", 70.5, "2026-01-01"), "bn_momentum": 0.5}]
    assert table3.table(rows, "g").splitlines()[3] == (
        "| GCNII | 100 | 0.01 | – | 70.00 ± 0.50 | +0.50 | – | – | – | – | – |")
    # A suite row from before the graph cache was counted is marked ‡ ...
    rows.append({**scheduled(row("gcn", "adaptive2", 80.1, "2026-01-06", saved=8)),
                 "graph_cache_counted": False})
    lines = table3.table(rows, "g").splitlines()
    assert lines[2].endswith("| 12.5×‡ |") and lines[-1].startswith("‡ context without")
    # ... and a bench_saved_bytes row of the same graph, model, adjacency and features (at 2
    # bits, module style) gives the ratio instead; one of another adjacency does not.
    saved = [{"bench": "saved_bytes", "graph": "g", "model": "gcn", "style": "module",
              "bits": 2, "adj": "edge_index", "features": "dense", "ratio": 12.34,
              "date": "2026-01-07"},
             {"bench": "saved_bytes", "graph": "g", "model": "gcn", "style": "module",
              "bits": 2, "adj": "csr", "features": "dense", "ratio": 99.0,
              "date": "2026-01-08"}]
    lines = table3.table(rows, "g", saved=saved).splitlines()
    assert lines[2].endswith("| 12.3× |") and not lines[-1].startswith("‡")


def test_generic_rows(tmp_path, capsys):
    pytest.importorskip("sklearn")
    bench = _script("bench_generic")
    out = tmp_path / "generic.jsonl"
    assert bench.main(["--smoke", "--methods", "quantize2", "--out", str(out)]) == 0
    assert not out.exists()
    assert bench.main(["--parts", "digits", "--models", "transformer", "--methods", "quantize2",
                       "--epochs", "1", "--seeds", "0", "--out", str(out)]) == 0
    fp32, q2 = (json.loads(line) for line in out.read_text().splitlines())
    assert fp32["saved_ratio"] == 1.0 and q2["saved_ratio"] > 5 and q2["epochs"] == 1
    assert 0 <= q2["mean"] <= 100 and q2["commit"]
    assert bench.main(["--parts", "bytes", "--models", "transformer", "--methods", "quantize2",
                       "division", "--smoke", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    for method in ("fp32", "quantize2"):
        assert f"cnn          {method:10s}" in text
    # fp32 is always measured first: the ratios are against it, side by side.
    assert "transformer  fp32" in text.split("transformer  quantize2")[0]
    rows = bench.bytes_rows(bench.main.__globals__["argparse"].Namespace(
        models=["transformer"], methods=["fp32", "quantize2"], device=bench.torch.device("cpu"),
        smoke=True), {"commit": "x"})
    fp32, q2 = rows
    assert fp32["saved_ratio"] == 1.0 and q2["saved_ratio"] > 8
    assert q2["bytes_by_kind"]["quantize"] > 0 and q2["step_ms"] > 0
    # The VGG's max pools keep an argmax per output: in 8 or 16 bits, not 64; PyTorch's
    # encoder layers keep dropout masks (floats on the CPU) at one bit, not two.
    rows = bench.bytes_rows(bench.main.__globals__["argparse"].Namespace(
        models=["vgg", "torch_transformer"], methods=["fp32", "default2_wide_index", "default2"],
        device=bench.torch.device("cpu"), smoke=True), {"commit": "x"})
    for (_, wide, compact), kind in zip((rows[:3], rows[3:]), ("index", "mask"), strict=True):
        assert kind not in wide["bytes_by_kind"] and compact["bytes_by_kind"][kind] > 0
        assert compact["saved_bytes"] < wide["saved_bytes"] / 1.3


def test_largest_bisection():
    bench = _script("bench_largest")
    calls = []

    def fits(n):
        calls.append(n)
        return n <= 123_456

    found = bench.largest(fits, 1_000, 10_000_000, tolerance=0.01)
    assert 123_456 / 1.01 <= found <= 123_456 and len(calls) < 30
    assert bench.largest(lambda n: False, 10, 100) == 0
    assert bench.largest(lambda n: True, 10, 100) == 100


def test_swap_and_largest_smoke(capsys):
    swap, largest = _script("bench_swap"), _script("bench_largest")
    assert swap.main(["--smoke", "--device", "cpu", "--epochs", "1"]) == 0
    assert largest.main(["--smoke", "--device", "cpu", "--methods", "pyg", "gnnact2_swap"]) == 0
    text = capsys.readouterr().out
    for method in swap.METHODS:
        assert method in text
    assert "prefetch_hidden_share" in text and "gnnact2_swap: one step" in text
    with pytest.raises(SystemExit):
        swap.main(["--device", "cpu"])  # offloading needs a GPU outside smoke runs
    # 1 ms of 4 ms of copies exposed without prefetch, 0.5 ms with it
    times = {"gnnact2": 28.0, "gnnact2_swap": 29.0, "gnnact2_swap_prefetch": 28.5}
    row = swap.summarize({m: {"epoch_ms": t} for m, t in times.items()}, copy=4.0)
    assert row["prefetch_hidden_share"] == 0.5
    assert row["copy_hidden_share_without_prefetch"] == 0.75
    assert row["copy_hidden_share_with_prefetch"] == 0.875


def test_largest_under_a_counted_cap_on_the_cpu(tmp_path, capsys):
    largest = _script("bench_largest")
    out = tmp_path / "largest.jsonl"
    cap = 0.03  # GiB: a few hundred nodes for PyG fp32, thousands at 2 bits
    assert largest.main(["--device", "cpu", "--cap-gb", str(cap), "--lo", "100",
                         "--no-products", "--out", str(out)]) == 0
    rows = {r["method"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"pyg", "gnnact2"}  # swap is a GPU measurement
    for row in rows.values():
        assert row["cap_by"] == "meter" and row["cap_bytes"] == int(cap * 2**30)
        assert 0 < row["peak_bytes_at_largest"] <= row["cap_bytes"]
        assert "products_peak_bytes" not in row
    assert rows["gnnact2"]["largest_nodes"] > 5 * rows["pyg"]["largest_nodes"]
    # The graph's build at that size, measured alone: the graph plus at most 24 B per edge
    # (bench_largest's degree: 50.5 edges per node), below the whole step's peak.
    gnnact2 = rows["gnnact2"]
    edges = round(gnnact2["largest_nodes"] * gnnact2["degree"])
    assert 0 < gnnact2["graph_bytes"] < gnnact2["graph_build_peak_bytes"] <= 24 * edges + 10**5
    assert gnnact2["graph_build_peak_bytes"] < gnnact2["peak_bytes_at_largest"]
    assert "graph_build_peak_bytes" not in rows["pyg"]
    with pytest.raises(SystemExit):
        largest.main(["--device", "cpu", "--methods", "gnnact2_swap"])


def test_address_space_limit_stops_an_allocation_and_is_lifted():
    torch = pytest.importorskip("torch")
    largest = _script("bench_largest")
    common = _script("_common")
    with pytest.raises(RuntimeError) as error, largest.address_space_limit(2**28):
        torch.empty(2**31, dtype=torch.uint8)
    assert common.out_of_memory(error.value)
    assert torch.empty(2**29, dtype=torch.uint8).numel() == 2**29  # the limit is gone


def test_profile_peak_replays_the_allocator_trace():
    peak = _script("profile_peak")
    frame = {"filename": "/x/site-packages/gnnact/ops/context.py", "line": 7, "name": "f"}
    other = {"filename": "/usr/lib/python3/threading.py", "line": 1, "name": "run"}
    events = [
        {"action": "free_completed", "addr": 99, "size": 50},  # allocated before the trace
        {"action": "alloc", "addr": 1, "size": 100, "frames": [other, frame]},
        {"action": "alloc", "addr": 2, "size": 30, "frames": [other]},
        {"action": "free_requested", "addr": 1, "size": 100},  # not yet given back
        {"action": "alloc", "addr": 3, "size": 20, "frames": [frame]},
        {"action": "free_completed", "addr": 1, "size": 100},
        {"action": "alloc", "addr": 4, "size": 60, "frames": []},
    ]
    top, at, alive = peak.peak_live(events)
    assert top == 150 and at == "gnnact/ops/context.py:7 f"
    assert alive == [("gnnact/ops/context.py:7 f", 120, 2), ("other", 30, 1)]
    # The largest allocations alive at the peak, with their frames (innermost first).
    assert peak.largest_at_peak(events, 2, depth=1) == [
        {"bytes": 100, "frames": ["threading.py:1 run"]}, {"bytes": 30, "frames": [
            "threading.py:1 run"]}]
    with pytest.raises(SystemExit):
        peak.main(["--device", "meta"])


def test_quantize_throughput_runs_from_its_command_line():
    """bench_quantize.py as gpu_all.sh runs it (its argument defaults read gnnact's constants),
    quantizers and mask ops alike."""
    import subprocess

    # A process of its own, as gpu_all.sh starts it: only what the script imports is loaded.
    run = subprocess.run([sys.executable, str(BENCH / "bench_quantize.py"), "--device", "cpu",
                          "--smoke", "--bits", "2"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert all(op in run.stdout for op in ("quantize", "sign_mask", "apply_packed_mask"))


def test_profile_peak_counts_on_the_cpu(tmp_path):
    """On the CPU the step runs under gnnact.peak.PeakMeter: a PyG row and a 2-bit row with
    the sites alive at the peak adding up to it, for the model as gnnact.models writes it, as
    PyG's examples write it (F.relu, F.dropout) and as PyG's own model class."""
    peak = _script("profile_peak")
    out = tmp_path / "peak.jsonl"
    assert peak.main(["--device", "cpu", "--models", "gcn", "--bits", "32", "2", "--nodes",
                      "3000", "--warmup", "1", "--top", "100", "--styles", "module",
                      "functional", "pyg", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["style"], r["bits"]) for r in rows] == [
        (style, bits) for style in ("module", "functional", "pyg") for bits in (32, 2)]
    for pyg, ours in zip(rows[::2], rows[1::2], strict=True):
        # gnnact's graph cache (built in the warmup, outside the measured peak) is counted.
        assert pyg["graph_cache_bytes"] == 0 < ours["graph_cache_bytes"]
        assert ours["peak_ratio_vs_fp32"] == round(
            pyg["peak_bytes"] / (ours["peak_bytes"] + ours["graph_cache_bytes"]), 2) > 3
        for row in (pyg, ours):
            assert sum(nbytes for _, nbytes, _ in row["alive"]) == row["peak_bytes"]


def test_neighbor_loader_rows(tmp_path, capsys):
    if not any(importlib.util.find_spec(m) for m in ("pyg_lib", "torch_sparse")):
        pytest.skip("NeighborLoader needs pyg-lib or torch-sparse (the sparse extra)")
    bench = _script("bench_neighbor")
    out = tmp_path / "neighbor.jsonl"
    assert bench.main(["--smoke", "--models", "gcn", "--bits", "2", "--out", str(out)]) == 0
    assert not out.exists()  # smoke runs write nothing
    assert bench.main(["--models", "gcn", "--bits", "2", "--nodes", "1500", "--batch-size",
                       "64", "--fanout", "4", "4", "--batches", "2", "--out", str(out)]) == 0
    pyg, ours = [json.loads(line) for line in out.read_text().splitlines()]
    assert (pyg["bits"], ours["bits"], ours["batches"]) == (32, 2, 2)
    assert ours["saved_ratio_vs_pyg"] > 4 and ours["graph_cache_counted"]


@pytest.mark.usefixtures("small_messages_in_pieces")  # (1,500 nodes: small messages)
def test_no_twin_rows(tmp_path, capsys):
    """Models written as PyG's examples write them, with convs that have no twin: rows per
    method, and the messages in chunks lower the step's peak below the whole-message run."""
    bench = _script("bench_no_twin")
    out = tmp_path / "no_twin.jsonl"
    assert bench.main(["--models", "gin", "transformer", "--nodes", "1500", "--repeats", "1",
                       "--out", str(out)]) == 0
    rows = {(r["model"], r["method"]): r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {(m, method) for m in ("gin", "transformer") for method in bench.METHODS}
    for model in ("gin", "transformer"):
        whole, chunked = rows[model, "gnnact2_whole"], rows[model, "gnnact2"]
        assert chunked["peak_bytes"] < whole["peak_bytes"] / 2
        assert chunked["peak_ratio_vs_pyg"] > 2 and chunked["saved_ratio_vs_pyg"] > 5
        assert chunked["saved_bytes"] <= rows[model, "gnnact2_wide_index"]["saved_bytes"]
        assert all(r["step_s"] > 0 for r in rows.values())


def test_distributed_rows(tmp_path, capsys):
    """Two gloo ranks against one on a small arxiv-shaped graph: a 2-bit exchange sends over
    8x fewer bytes than a 32-bit one, and every row names its backend and its shares."""
    bench = _script("bench_distributed")
    out = tmp_path / "distributed.jsonl"
    assert bench.main(["--nodes", "1500", "--world-sizes", "1", "2", "--bits", "32", "2",
                       "--model", "gin", "--method", "contiguous", "--steps", "1",
                       "--warmup", "0", "--out", str(out)]) == 0
    rows = {(r["world_size"], r["exchange_bits"]): r
            for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {(1, 32), (1, 2), (2, 32), (2, 2)}
    assert all(r["backend"] == "gloo" and r["model"] == "gin" for r in rows.values())
    assert rows[(1, 32)]["exchanged_bytes_total"] == 0
    assert rows[(2, 32)]["exchanged_bytes_total"] > 8 * rows[(2, 2)]["exchanged_bytes_total"]
    assert len(rows[(2, 2)]["peak_over_share"]) == 2
    assert "k=2 bits= 2" in capsys.readouterr().out


def test_evidence_table_from_rows(tmp_path, capsys):
    """evidence.py: the newest row of each kind against its target, with its commit; a
    missing benchmark is a line saying so."""
    evidence = _script("evidence")

    def write(name: str, *rows: dict) -> None:
        with (tmp_path / name).open("a") as f:
            for row in rows:
                f.write(json.dumps({"device": "cuda", **row}) + "\n")

    q = {"bench": "quantize_throughput", "backend": "cupy", "dtype": "float32", "bits": 3}
    write("quantize.jsonl",
          {**q, "op": "quantize", "frac_of_copy": 0.5, "commit": "old", "date": "1"},
          {**q, "op": "quantize", "frac_of_copy": 0.6, "kernel_frac_of_copy": 0.8,
           "commit": "new", "date": "2"},
          {**q, "op": "quantize", "backend": "torch", "frac_of_copy": 0.01, "commit": "new",
           "date": "2"},
          {**q, "op": "quantize", "device": "cpu", "frac_of_copy": 0.01, "commit": "new",
           "date": "3"},
          {"bench": "mask_throughput", "backend": "cupy", "op": "sign_mask",
           "dtype": "float32", "frac_of_copy": 0.75, "kernel_frac_of_copy": 0.85,
           "commit": "new", "date": "2"})
    p = {"bench": "peak", "graph": "arxiv", "num_nodes": 169343, "commit": "c", "date": "1",
         "peak_bytes": 2**30}
    write("peak.jsonl", {**p, "model": "gcn", "bits": 32},
          {**p, "model": "gcn", "bits": 2, "peak_ratio_vs_fp32": 12.5},
          {**p, "model": "sage", "style": "pyg", "bits": 2, "peak_ratio_vs_fp32": 8.0})
    largest = {"bench": "largest", "cap_bytes": 16 * 2**30, "commit": "c", "date": "1"}
    write("largest.jsonl", {**largest, "method": "pyg", "largest_nodes": 100_000},
          {**largest, "method": "gnnact2", "largest_nodes": 1_600_000,
           "graph_build_peak_bytes": 3 * 2**30, "peak_bytes_at_largest": 15 * 2**30})
    assert evidence.main([str(tmp_path)]) == 0
    text = capsys.readouterr().out
    # The kernel's own fraction is the target's; one call's (host included) beside it.
    assert "quantize   3 bits float32    80.0% ( 60.0%)  ok      new" in text
    assert "50.0%" not in text and "1.0%" not in text  # older, torch-path and CPU rows
    assert "sign_mask         float32    85.0% ( 75.0%)  new" in text
    assert "gcn    module     169,343 nodes    1024 MiB   12.5x  ok" in text
    assert "sage   pyg        169,343 nodes    1024 MiB    8.0x  BELOW" in text
    assert "PyG 100,000 nodes, 2 bits 1,600,000 (16.0x)  ok c" in text
    assert "the graph's build alone 3,072 MiB, the whole step 15,360 MiB" in text
    assert "swap on GCNII: no rows" in text


def test_tune_kernels_reads_variants_and_refuses_a_cpu(capsys):
    """tune_kernels.py: each variant a set of NAME=VALUE defines (checked before any build);
    without a CUDA device it says so."""
    tune = _script("tune_kernels")
    assert tune.parse_variant("CACHED=1, MIN_BLOCKS=6") == ("CACHED=1", "MIN_BLOCKS=6")
    assert tune.parse_variant("") == ()
    # A build that changes one kernel is timed on that op alone.
    assert tune.timed_ops(()) == ("quantize", "dequantize")
    assert tune.timed_ops(("WORD_STORES=0",)) == ("quantize",)
    assert tune.timed_ops(("WORD_STORES=0", "MIN_BLOCKS=6")) == ("quantize", "dequantize")
    # one op's shape, by its prefix
    assert tune.timed_ops(("QUANTIZE_HALF_MIN_BLOCKS=3", "WORD_STORES=0")) == ("quantize",)
    assert tune.timed_ops(("DEQUANTIZE_LANES=16", "DEQUANTIZE_CACHED=1")) == ("dequantize",)
    assert tune.timed_ops(("DEQUANTIZE_LANES=16", "QUANTIZE_LANES=8")) == ("quantize",
                                                                             "dequantize")
    with pytest.raises(ValueError, match="NAME=VALUE"):
        tune.parse_variant("CACHED")
    # A removed variant's name (or a typo) would build the default and time it against itself.
    assert tune.parse_variant("WAVES=2, HALF_WORD_STORES=0") == ("WAVES=2", "HALF_WORD_STORES=0")
    with pytest.raises(ValueError, match=r"\['PREFETCH'\] are not settings"):
        tune.parse_variant("PREFETCH=1,LANES=8")
    with pytest.raises(ValueError, match=r"\['CODES_FIRST'\] are not settings"):
        tune.parse_variant("CODES_FIRST=1")
    with pytest.raises(SystemExit):
        tune.main(["--variants", "cached=1"])
    assert "--variants: defines must be NAME=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tune.main(["--device", "cpu"])
    assert "--device cpu: the kernels need a CUDA device" in capsys.readouterr().err


def test_check_kernels_builds_a_variant():
    """tools/check_kernels.py --define: the sources compile with another setting (NVRTC), as
    CI checks the build tune_kernels.py compares."""
    import subprocess

    run = subprocess.run([sys.executable, str(TOOLS / "check_kernels.py"),
                          "--arch", "90", "--define", "LANES=8", "--define", "CACHED=8"],
                         capture_output=True, text=True, timeout=600)
    if "NVRTC" not in run.stdout:
        pytest.skip(f"no NVRTC here: {run.stderr[-300:]}")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "all compiled" in run.stdout


def test_sass_counts_classes_a_listing_by_pipe(capsys):
    """tools/sass_counts.py: instructions of a cuobjdump listing by the pipe that issues them
    (predicated ones too; NOP padding not at all); bad widths refused by name."""
    tool = _script("sass_counts", TOOLS)
    listing = """
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   IMAD.WIDE.U32 R12, R3, UR4, R12 ;
        /*0020*/                   LOP3.LUT R26, R18, 0xffff, R21, 0xea, !PT ;
        /*0030*/                   FFMA.FTZ.RP R22, R27, 65536, R26 ;
        /*0040*/              @!P1 BRA 0x6f0 ;
        /*0050*/                   F2I.U32.CEIL.NTZ R3, R4 ;
        /*0060*/                   SHFL.BFLY PT, R3, R14, 0x10, 0x1f ;
        /*0070*/                   EXIT ;
        /*0080*/                   NOP;
    """
    assert tool.count_sass(listing) == {"total": 8, "fma": 2, "alu": 1, "conv": 1, "mem": 1,
                                        "shfl": 1, "other": 2}
    with pytest.raises(SystemExit):
        tool.main(["--bits", "9"])
    assert "--bits must be in 1..8" in capsys.readouterr().err


def test_sass_counts_of_the_seeded_quantizer(tmp_path):
    """End to end (nvcc and cuobjdump): a warp's whole-group pass of the bfloat16 2-bit
    quantizer (two groups of 512 in the default shape), a row of its counts; seeded rounding
    issues no conversion."""
    tool = _script("sass_counts", TOOLS)
    if tool.find_tool("nvcc") is None or tool.find_tool("cuobjdump") is None:
        pytest.skip("needs nvcc and cuobjdump (pip install nvidia-cuda-cuobjdump "
                    "nvidia-cuda-nvdisasm)")
    report = tmp_path / "sass.jsonl"
    assert tool.main(["--dtypes", "bfloat16", "--bits", "2", "--report", str(report)]) == 0
    row = json.loads(report.read_text())
    assert row["dtype"] == "bfloat16" and row["bits"] == 2 and row["group_size"] == 512
    assert row["device_name"] == "static SASS, sm_90" and row["commit"]
    assert row["values"] == 1024 and row["conv"] == 0 and 300 < row["total"] < 800


NCU_SAMPLE = Path(__file__).resolve().parent / "data" / "ncu_raw_sample.csv"


def test_profile_kernels_summarizes_an_ncu_raw_page(tmp_path):
    """profile_kernels.py --summarize: a row a kernel of Nsight Compute's raw page (an H200's,
    cut to the columns it reads), with the sectors its bytes fill beside those the L2 saw and
    the stall reasons' shares; device and versions from the rows of the same device call."""
    prof = _script("profile_kernels")
    env = {"device": "cuda", "device_name": "NVIDIA H200", "commit": "b0e8e85"}
    by = {r["kernel"]: r for r in prof.summarize(NCU_SAMPLE, env, 1 << 26, 512)}
    assert set(by) == {"quantize_bf16_2", "dequantize_f32_1"}
    q, d = by["quantize_bf16_2"], by["dequantize_f32_1"]
    assert (q["op"], q["dtype"], q["bits"], q["device_name"]) == (
        "quantize", "bfloat16", 2, "NVIDIA H200")
    assert (q["duration_us"], q["registers"], q["grid"]) == (69.536, 64, 16384)
    assert q["warp_instructions_per_group"] == 394.0  # 51,642,368 over 131,072 groups
    assert q["ideal_read_sectors"] == 2**26 * 2 // 32 == q["l2_read_sectors"]
    assert d["ideal_write_sectors"] == 2**26 * 4 // 32  # float32 values written
    assert d["l2_write_sectors"] > 1.6 * d["ideal_write_sectors"]  # half-filled sectors
    shares = list(d["stall_share"].values())
    assert next(iter(d["stall_share"])) == "long_scoreboard"
    assert shares == sorted(shares, reverse=True) and 0 < sum(shares) <= 1

    rows_file = tmp_path / "quantize.jsonl"
    rows_file.write_text(json.dumps({"device": "cuda", "device_name": "NVIDIA H200",
                                     "commit": "b0e8e85", "op": "quantize"}) + "\n")
    out = tmp_path / "kernel_profile.jsonl"
    assert prof.main(["--summarize", str(NCU_SAMPLE), "--env-from", str(rows_file),
                      "--out", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["commit"] for r in written] == ["b0e8e85", "b0e8e85"]
    assert all(r["bench"] == "kernel_profile" and "op" in r for r in written)


def test_profile_kernels_names_bad_input(tmp_path):
    prof = _script("profile_kernels")
    with pytest.raises(argparse.ArgumentTypeError, match="'quantize:float32:9'"):
        prof.parse_kernel("quantize:float32:9")
    with pytest.raises(argparse.ArgumentTypeError, match="'copy:float32:2'"):
        prof.parse_kernel("copy:float32:2")
    assert prof.parse_kernel("dequantize:bfloat16:5")[2] == 5
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="not ncu's raw page"):
        prof.summarize(other, {}, 1 << 20, 512)


def test_speed_rows_pair_each_variant_with_pyg(tmp_path, capsys):
    bench = _script("bench_speed")
    out = tmp_path / "speed.jsonl"
    assert bench.main(["--smoke", "--cases", "hetero", "--out", str(out)]) == 0
    assert not out.exists()  # smoke runs write nothing
    assert bench.main(["--cases", "gin", "--rounds", "2", "--steps", "2", "--out", str(out)]) == 0
    rows = {r["variant"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"pyg", "gnnact"}
    assert rows["pyg"]["ratio"] == 1.0 and rows["gnnact"]["error"] is None
    # GIN's epoch is several batches: one epoch a round, every step after the first round.
    assert rows["gnnact"]["steps"] == rows["pyg"]["steps"] >= 2
    assert rows["gnnact"]["ratio"] == rows["gnnact"]["step_ms"] / rows["pyg"]["step_ms"]
    # What the converted model's last step did (the tests compress every tensor: a full one).
    assert rows["pyg"]["as_pytorch"] is rows["pyg"]["context_bytes"] is None
    assert rows["gnnact"]["as_pytorch"] is False and rows["gnnact"]["context_bytes"] > 0
    out.unlink()
    assert bench.main(["--cases", "gae", "--fixed2", "--rounds", "2", "--steps", "2",
                       "--out", str(out)]) == 0
    rows = {r["variant"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert set(rows) == {"pyg", "gnnact", "gnnact_fixed2"}
    # The warm-up round runs through the automatic widths' first probes (one step an epoch).
    assert rows["gnnact"]["warmup_epochs"] == bench.WARMUP_STEPS and rows["gnnact"]["steps"] == 2
    assert rows["gnnact"]["ratio_fixed2"] == (rows["gnnact"]["step_ms"]
                                              / rows["gnnact_fixed2"]["step_ms"])
    with pytest.raises(SystemExit):
        bench.main(["--rounds", "1"])  # the first round only warms up


def test_speed_compiles_what_a_recipe_calls():
    """GAE's recipe calls ``encode``, never the module: its compiled variants compile the
    encoder (torch.compile of the model compiled nothing the recipe ran); the others, the
    model."""
    import torch
    from torch_geometric.nn import GAE

    bench = _script("bench_speed")
    model = GAE(torch.nn.Linear(4, 4))
    compiled = bench.make_variant(model, "pyg_compiled", bench.CASES["gae"].compiled)
    assert type(compiled) is GAE
    assert isinstance(compiled.encoder, torch._dynamo.eval_frame.OptimizedModule)
    assert bench.CASES["gcn"].compiled is torch.compile


def test_chunk_rows_time_pieces_against_whole(tmp_path):
    import torch

    bench = _script("bench_chunks")
    out = tmp_path / "chunks.jsonl"
    assert bench.main(["--smoke", "--out", str(out)]) == 0 and not out.exists()
    row = bench.bench(300, torch.device("cpu"), 2)
    assert row["pieces"] == 8 and row["message_mib"] == round(2400 * 64 * 4 / 2**20, 2)
    assert row["pieces_peak_mib"] < row["whole_peak_mib"]  # what the pieces are for
    assert row["pieces_over_whole"] > 0 and row["whole_ms"] > 0


@pytest.mark.default_floor  # (rows report the shipped floor)
def test_floor_rows_fit_the_cost_of_a_compressed_tensor(tmp_path):
    bench = _script("bench_floor")
    out = tmp_path / "floor.jsonl"
    assert bench.main(["--smoke", "--out", str(out)]) == 0 and not out.exists()
    assert bench.main(["--sizes", "4096", "65536", "--bits", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r.get("numel"), r.get("fit", False)) for r in rows] == [
        (4096, False), (65536, False), (None, True)]
    assert all(r["native_us"] > 0 and r["compressed_us"] > 0 for r in rows[:2])
    assert rows[2]["min_bytes"] == 256 << 10 and rows[2]["ns_per_value"] is not None
    # The fit goes through both points: c0 + kappa n at each size is its overhead.
    c0, kappa = rows[2]["fixed_us"], rows[2]["ns_per_value"] / 1e3
    for r in rows[:2]:
        assert abs(c0 + kappa * r["numel"] - r["overhead_us"]) < 0.2 + 1e-3 * abs(r["overhead_us"])
    assert bench.fit([1, 2, 3], [5.0, 7.0, 9.0]) == pytest.approx((3.0, 2.0))


def test_quantizer_ab_checks_both_give_the_same_codes(tmp_path):
    ab = _script("ab_quantize")
    root = BENCH.parent
    out = tmp_path / "ab.jsonl"
    assert ab.main(["--base", str(root), "--sizes", "1000", "--bits", "2", "3",
                    "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["numel"], r["bits"]) for r in rows] == [(1000, 2), (1000, 3)]
    assert all(r["quantize_base_us"] > 0 and r["dequantize_head_us"] > 0 for r in rows)
