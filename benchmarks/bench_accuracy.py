"""Full-batch accuracy on real graphs: PyG fp32 against gnnact at 4 and 2 bits, over seeds.

Datasets are read by :func:`gnnact.data.load_dataset` from ``$GNNACT_DATA`` (default:
``../shared/datasets`` beside the checkout), copied to a temporary folder first (PyG writes
``processed/`` next to ``raw/``), prepared as the baselines do (row-normalised features for
Amazon, Coauthor, CitationFull). Datasets without a standard split get a random 60/20/20 split
per seed; each seed also draws the initial weights, and fp32 and every bit width share both,
so each seed gives a paired comparison.

Reported per (dataset, model, bits): test accuracy at the best validation epoch, mean ± std over
seeds, and the difference to fp32 (target: within 0.3 points, DESIGN.md §5).

Usage::

    python benchmarks/bench_accuracy.py [--datasets computers dblp physics] [--models gcn sage]
        [--bits 4 2] [--seeds 0 1 2] [--epochs 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, append_rows, data_root, environment

import gnnact
from gnnact.data import load_dataset
from gnnact.models import MODELS, build
from gnnact.training import train_full_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="+", default=["computers", "dblp", "physics"],
                        help="names known to gnnact.data.load_dataset")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["gcn", "sage"])
    parser.add_argument("--bits", nargs="+", type=int, default=[4, 2])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--hidden", type=int, default=None,
                        help="default: gnnact.models.build's (256; GAT 128 per head)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--out", type=Path, default=RESULTS / "accuracy.jsonl")
    args = parser.parse_args(argv)

    device = torch.device(args.device)
    env = environment(device)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.datasets:
            for model_name in args.models:
                acc: dict[int, list[float]] = {b: [] for b in [32, *args.bits]}
                for seed in args.seeds:
                    # Datasets without a standard split get a random one per seed.
                    data = load_dataset(name, data_root(), seed=seed, workdir=tmp,
                                        download=False)
                    classes = int(data.y.max()) + 1
                    data = data.to(device)
                    for bits in acc:
                        torch.manual_seed(seed)
                        model = build(model_name, data.num_features, classes,
                                      hidden=args.hidden).to(device)
                        if bits < 32:
                            gnnact.convert(model, gnnact.Config(bits=bits))
                        t0 = time.perf_counter()
                        run = train_full_batch(model, data, epochs=args.epochs, lr=args.lr,
                                               weight_decay=5e-4, measure_saved=False)
                        acc[bits].append(100 * run.test_acc)
                        print(f"{name:9s} {model_name:5s} seed {seed} {bits:2d} bits "
                              f"{acc[bits][-1]:6.2f}  ({time.perf_counter() - t0:.0f} s)",
                              flush=True)
                rows = []
                for bits, values in acc.items():
                    mean = statistics.mean(values)
                    std = statistics.stdev(values) if len(values) > 1 else 0.0
                    delta = mean - statistics.mean(acc[32])
                    rows.append({"bench": "accuracy", **env, "dataset": name,
                                 "model": model_name, "bits": bits, "seeds": args.seeds,
                                 "epochs": args.epochs, "hidden": args.hidden,
                                 "test_acc": values, "mean": round(mean, 3),
                                 "std": round(std, 3), "delta_vs_fp32": round(delta, 3)})
                    print(f"{name:9s} {model_name:5s} {bits:2d} bits {mean:6.2f} ± {std:.2f} "
                          f"({delta:+.2f} vs fp32)", flush=True)
                append_rows(args.out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
