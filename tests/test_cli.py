"""Tests for the ``gnnact`` command line (:mod:`gnnact.cli`)."""

from __future__ import annotations

import json
import runpy
import sys

import pytest
import torch

from gnnact.cli import main
from gnnact.training import roc_auc

TINY = ["--nodes", "300", "--degree", "4", "--features", "8", "--classes", "3", "--hidden", "16",
        "--epochs", "2", "--no-progress"]

ROW_KEYS = {
    "model", "layers", "hidden", "num_nodes", "num_edges", "num_features", "num_classes",
    "bits", "test_acc", "best_val_acc", "saved_bytes", "ratio_vs_fp32", "epoch_ms",
    "time_vs_fp32", "torch", "torch_geometric", "date", "commit", "device_name", "group_size",
    "seed", "epochs", "lr",
}




def table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.strip().splitlines()[2:]:  # header, rule
        cells = [c.strip() for c in line.split("|")]
        rows[cells[0]] = cells
    return rows


@pytest.mark.parametrize("model", ["gcn", "sage", "gat", "gcnii"])
def test_train_table_and_jsonl(model, tmp_path, capsys):
    out = tmp_path / "results" / "run.jsonl"
    layers = ["--layers", "3"] if model == "gcnii" else []
    assert main(["train", *TINY, *layers, "--model", model, "--bits", "32,8,2",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "test acc" in text and "saved context (MB)" in text and "time vs fp32" in text
    rows = table_rows(text)
    assert list(rows) == ["32", "8", "2"]
    assert rows["32"][3] == "1.00x"

    lines = out.read_text().splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    for record in records:
        assert ROW_KEYS - set(record) == set()
        assert record["model"] == model and record["num_nodes"] == 300
        assert 0.0 <= record["test_acc"] <= 1.0
    fp32, b8, b2 = records
    assert [r["bits"] for r in records] == [32, 8, 2]
    assert fp32["ratio_vs_fp32"] == 1.0
    assert fp32["saved_bytes"] > b8["saved_bytes"] > b2["saved_bytes"] > 0

    # Appending: a second run adds rows.
    assert main([*TINY, "--bits", "32", "--out", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 4


def test_default_subcommand_and_no_fp32(capsys):
    assert main([*TINY, "--epochs", "1", "--bits", "4"]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["4"]
    assert rows["4"][3] == "n/a"  # no fp32 run to compare with


@pytest.mark.parametrize("argv", [
    ["--bits", "9"],
    ["--adaptive", "16"],
    ["--bits", "32,x"],
    ["--model", "gin"],
    ["--epochs", "0"],
    ["--lr", "-1"],
    ["--dropout", "1.0"],
    ["--homophily", "1.5"],
    ["--nodes", "2", "--classes", "3"],
    ["--nodes", "10", "--degree", "20"],
    ["frobnicate"],
])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert "error" in capsys.readouterr().err


def test_python_dash_m(monkeypatch, capsys):
    # `python -m gnnact` runs gnnact/__main__.py; run it in-process (a subprocess pays the
    # torch import again).
    monkeypatch.setattr(sys, "argv", ["gnnact", "--help"])
    with pytest.raises(SystemExit) as info:
        runpy.run_module("gnnact", run_name="__main__")
    assert info.value.code == 0
    assert "train" in capsys.readouterr().out


def test_train_on_a_real_dataset(shared_datasets, tmp_path, capsys):
    out = tmp_path / "cora.jsonl"
    assert main(["--dataset", "Cora", "--root", str(shared_datasets), "--workdir",
                 str(tmp_path), "--epochs", "3",
                 "--hidden", "16", "--bits", "32,2", "--no-progress", "--out", str(out)]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["32", "2"] and rows["2"][7] == "n/a (CPU)"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["dataset"] for r in records] == ["Cora", "Cora"]
    assert records[0]["num_nodes"] == 2708 and records[0]["num_features"] == 1433


def test_roc_auc_matches_sklearn():
    metrics = pytest.importorskip("sklearn.metrics")
    gen = torch.Generator().manual_seed(0)
    target = torch.rand(200, 5, generator=gen) < 0.3
    score = torch.randn(200, 5, generator=gen) + target.float()
    target[:, 4] = False  # a task with one class only is skipped, as OGB does
    expected = sum(metrics.roc_auc_score(target[:, t].numpy(), score[:, t].numpy())
                   for t in range(4)) / 4
    assert abs(roc_auc(score, target) - expected) < 1e-12


def test_adaptive_runs_beside_fixed_bits(tmp_path, capsys):
    out = tmp_path / "a.jsonl"
    assert main([*TINY, "--epochs", "3", "--bits", "32,2", "--adaptive", "2,3",
                 "--adapt-interval", "2", "--out", str(out)]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["32", "2", "adaptive 2", "adaptive 3"]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["bits"], r["adaptive"]) for r in records] == [(32, False), (2, False), (2, True),
                                                           (3, True)]
    assert records[3]["saved_bytes"] > records[2]["saved_bytes"] > 0
