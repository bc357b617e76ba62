"""The CI slice of the fidelity suite (``benchmarks/bench_fidelity.py``): a few model families,
written and trained as their users do, in PyG fp32 and after ``gnnact.convert(model)`` with no
config, on paired seeds, at the suite's quick epochs. Each family must stay within the
tolerance its seeds allow, and keep less context than fp32. The whole suite (every family,
its recipe's epochs, three seeds) runs from ``benchmarks/gpu_all.sh`` and writes
``benchmarks/results/fidelity.jsonl``."""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import SHARED

import gnnact.config

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_fidelity  # noqa: E402
from fidelity_models import FAMILIES, roc_auc  # noqa: E402

SLICE = ("gcn", "gat", "gin", "hetero", "gae", "supergat", "mixhop")
SEEDS = (0, 1)


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    # Real graphs for most families: skipped without ../shared/datasets (or $GNNACT_DATA).
    if not (SHARED / "planetoid").is_dir():
        pytest.skip(f"no datasets at {SHARED}")
    threads = torch.get_num_threads()
    out: list[dict] = []
    # Every tensor compressed however small, as in the rest of the suite (this module-wide
    # fixture is set up before the per-test one): under the default floor GIN's batches keep
    # all theirs as they are, and train as PyG's bit for bit (tests/test_floor.py).
    try:
        with tempfile.TemporaryDirectory() as workdir, pytest.MonkeyPatch.context() as patch:
            patch.setattr(gnnact.config, "MIN_BYTES", 0)
            for name in SLICE:
                family = FAMILIES[name]
                for seed in SEEDS:
                    out += bench_fidelity.run(family, seed, ["pyg", "auto"],
                                              family.quick_epochs, SHARED,
                                              torch.device("cpu"), workdir)
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.parametrize("family", SLICE)
def test_default_convert_keeps_fp32_quality(rows: list[dict], family: str) -> None:
    mine = {(r["seed"], r["config"]): r for r in rows if r["family"] == family}
    fp32 = [100 * mine[(s, "pyg")]["value"] for s in SEEDS]
    diffs = [100 * mine[(s, "auto")]["value"] - f for s, f in zip(SEEDS, fp32, strict=True)]
    # What the seeds allow: their own spread in fp32, twice, and a point for the short runs.
    tolerance = 1.0 + 2 * statistics.pstdev(fp32)
    assert statistics.fmean(diffs) >= -tolerance, (family, fp32, diffs)
    for s in SEEDS:
        auto = mine[(s, "auto")]
        assert auto["context_bytes"] < mine[(s, "pyg")]["context_bytes"] / 2
        assert auto["avg_bits"] is not None and auto["widths"]


def test_summary_table(rows: list[dict]) -> None:
    text = bench_fidelity.summarize(rows)
    assert all(name in text for name in SLICE) and "vs fp32" in text


def test_roc_auc_counts_ties_at_their_average_rank() -> None:
    scores = torch.tensor([0.1, 0.4, 0.4, 0.8, 0.2, 0.4])
    labels = torch.tensor([0, 1, 0, 1, 0, 1])
    # Pairs (positive, negative) ordered right: 0.4>0.1, 0.4>0.2, 0.4=0.4 (half), twice, and
    # 0.8 above all three negatives: (2 * 2.5 + 3) / 9.
    assert roc_auc(scores, labels) == pytest.approx(8 / 9)
    assert roc_auc(torch.arange(4.0), torch.tensor([0, 0, 1, 1])) == 1.0
