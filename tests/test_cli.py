"""Tests for the ``gnnact`` command line (:mod:`gnnact.cli`)."""

from __future__ import annotations

import json
import runpy
import subprocess
import sys

import pytest
import torch

from gnnact import cli
from gnnact.cli import main
from gnnact.presets import Preset, preset
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
    lines = text.strip().splitlines()
    start = next(i for i, line in enumerate(lines) if line.split("|")[0].strip() == "bits")
    rows = {}
    for line in lines[start + 2:]:  # header, rule
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
    ["--adaptive", "auto"],  # (automatic widths are --bits auto)
    ["--bits", "32,x"],
    ["--model", "gin"],
    ["--epochs", "0"],
    ["--lr", "-1"],
    ["--dropout", "1.0"],
    ["--homophily", "1.5"],
    ["--nodes", "2", "--classes", "3"],
    ["--nodes", "10", "--degree", "20"],
    ["frobnicate"],
    ["--nprocs", "0"],
    ["--exchange-bits", "2"],  # without --nprocs > 1
    ["--nprocs", "2", "--exchange-bits", "9"],
    ["--nprocs", "2", "--adaptive", "2"],
    ["--nprocs", "2", "--device", "cuda"],
    ["--nprocs", "2", "--adj", "csr"],
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


def test_auto_is_convert_with_its_default_config(tmp_path, capsys):
    out = tmp_path / "auto.jsonl"
    assert main([*TINY, "--epochs", "4", "--bits", "32,auto,2", "--out", str(out)]) == 0
    rows = table_rows(capsys.readouterr().out)
    assert list(rows) == ["32", "auto", "2"]
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["bits"] for r in records] == [32, "auto", 2]
    # Measured at the last step: automatic widths by then (at least the 2-bit start).
    assert records[1]["saved_bytes"] >= records[2]["saved_bytes"] > 0


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


def test_nprocs_2_is_the_single_process_run_at_32_bits(tmp_path, capsys):
    """Partitioned over 2 gloo processes, the fp32 run is the single-process run: the same
    test and validation accuracy at every epoch's best. No dropout (each rank draws its own
    masks) and no BatchNorm: a conv bias before BatchNorm has a zero gradient up to float32
    round-off, which Adam turns into lr-sized steps that differ with the summation order."""
    exact = [*TINY, "--epochs", "5", "--dropout", "0", "--no-batchnorm"]
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    assert main([*exact, "--bits", "32", "--out", str(one)]) == 0
    assert "exchanged" not in capsys.readouterr().out
    assert main([*exact, "--bits", "32,2", "--nprocs", "2", "--out", str(two)]) == 0
    text = capsys.readouterr().out
    assert "partitioned over 2 gloo processes" in text.splitlines()[1]
    rows = table_rows(text)
    assert list(rows) == ["32", "2"] and rows["32"][0].strip() == "32"
    (ref,) = [json.loads(line) for line in one.read_text().splitlines()]
    fp32, b2 = [json.loads(line) for line in two.read_text().splitlines()]
    assert (fp32["test_acc"], fp32["best_val_acc"]) == (ref["test_acc"], ref["best_val_acc"])
    assert ref["nprocs"] == 1 and "exchanged_bytes" not in ref
    assert (fp32["nprocs"], fp32["world_size"], fp32["exchange_bits"]) == (2, 2, 32)
    assert b2["exchange_bits"] == 2
    # 2-bit rows: more than 8x fewer halo bytes than 32-bit ones (scales included).
    assert 0 < 8 * b2["exchanged_bytes"] < fp32["exchanged_bytes"]
    assert float(rows["32"][-1]) == pytest.approx(fp32["exchanged_bytes"] / 1e6, abs=1e-3)


# ----------------------------------------------------------------------------- front door


def test_title_names_the_run_and_the_baseline(capsys):
    assert main([*TINY, "--bits", "32,2"]) == 0
    title = capsys.readouterr().out.splitlines()[0]
    assert title.startswith("GCN (3 layers x 16, BatchNorm) on synthetic (300 nodes")
    assert "against the fp32 row (bits 32: plain PyG" in title
    assert main([*TINY, "--bits", "2"]) == 0
    assert "no fp32 row" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("case", ["dataset", "root", "device", "out"])
def test_user_errors_are_one_line_and_exit_2(case, tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    argv, expected = {
        "dataset": (["--dataset", "no-such-graph"], "unknown dataset 'no-such-graph'; known:"),
        "root": (["--dataset", "cora", "--root", str(tmp_path / "empty")],
                 "cora: 8 file(s) missing"),
        "device": (["--device", "cuda:7"], "--device cuda:7: "),
        "out": (["--out", str(not_a_dir / "rows.jsonl")], f"--out '{not_a_dir / 'rows.jsonl'}'"),
    }[case]
    if case == "device" and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    assert main([*TINY, *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gnnact: error: "), captured.err
    assert expected in lines[0]


def test_user_error_from_the_console_has_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gnnact", "--dataset", "no-such-graph"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1


def test_help_and_argument_errors_load_no_torch():
    """``--help`` and argparse's errors answer before torch or PyG is imported (the wall time
    is measured in benchmarks/bench_cli.py, not here)."""
    code = ("import sys\nfrom gnnact.cli import main\n"
            "for argv in (['--help'], ['train', '--help'], ['--bits', '9']):\n"
            "    try:\n        main(argv)\n    except SystemExit as e:\n"
            "        assert e.code == (2 if '--bits' in argv else 0), e.code\n"
            "heavy = [m for m in ('torch', 'torch_geometric', 'numpy') if m in sys.modules]\n"
            "assert not heavy, heavy\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_every_option_has_help():
    parser = cli._parser()
    train = parser._subparsers._group_actions[0].choices["train"]
    for action in train._actions:
        assert action.help, f"{action.option_strings} has no help text"


def test_import_gnnact_is_lazy():
    code = ("import sys, gnnact\nassert 'torch' not in sys.modules\n"
            "assert {'Config', 'convert', 'nn', 'plan'} <= set(dir(gnnact))\n"
            "assert gnnact.Config(bits=2).bits == 2 and gnnact.nn.GCNConv\n"
            "assert all(getattr(gnnact, name) is not None for name in gnnact.__all__)\n"
            "try:\n    gnnact.nope\nexcept AttributeError as e:\n    assert 'nope' in str(e)\n"
            "else:\n    raise SystemExit('no AttributeError')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr


def test_presets_and_overrides():
    assert preset("synthetic", "gcn") == Preset()
    cora = preset("cora", "gcn")
    assert (cora.layers, cora.hidden, cora.batchnorm, cora.epochs, cora.weight_decay) == (
        2, 64, False, 200, 5e-4)
    gat = preset("cora", "gat")
    assert (gat.hidden, gat.heads, gat.dropout, gat.lr) == (8, 8, 0.6, 0.005)
    assert preset("physics", "gcn").features == "sparse" and preset("dblp", "gat").epochs == 100
    assert preset("computers", "gcnii").lr == 0.05 and preset("ogbn-arxiv", "sage").adj == "csr"
    args = cli._parser().parse_args(["train", "--model", "gcn", "--epochs", "7",
                                     "--no-batchnorm", "--features-layout", "sparse"])
    got = cli._resolve(args, "computers")
    assert (got.epochs, got.batchnorm, got.features, got.adj, got.lr) == (
        7, False, "sparse", "csr", 0.01)


@pytest.mark.slow
def test_cora_trains_to_its_usual_accuracy(shared_datasets, tmp_path, capsys):
    """Out of the box, fp32 GCN on Cora's public split reaches PyG's example accuracy (~81 %)."""
    out = tmp_path / "cora.jsonl"
    assert main(["--dataset", "cora", "--root", str(shared_datasets), "--workdir",
                 str(tmp_path), "--bits", "32", "--no-progress", "--out", str(out)]) == 0
    (record,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert record["epochs"] == 200 and record["layers"] == 2 and not record["batchnorm"]
    assert record["test_acc"] >= 0.79
