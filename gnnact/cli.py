"""Command line: ``gnnact train`` (the default) compares fp32 PyG training with compressed runs.

Example::

    python -m gnnact                         # GCN on the default synthetic graph, bits 32,8,4,2
    gnnact train --model sage --bits 32,2 --epochs 50 --out results.jsonl
    gnnact train --dataset ogbn-arxiv --root ~/data --device cuda --bits 32,2
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch_geometric.data import Data

from gnnact.adaptive import Controller
from gnnact.config import Config
from gnnact.data import load_dataset, synthetic_graph
from gnnact.env import environment
from gnnact.models import MODELS, build
from gnnact.nn import convert
from gnnact.quant.packed import QUANT_BITS, SUPPORTED_BITS
from gnnact.training import RunResult, loss_of, train_full_batch

__all__ = ["main"]

_COMMANDS = ("train",)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gnnact`` console script and of ``python -m gnnact``.

    Args:
        argv (Sequence[str], optional): the arguments without the program name; by default
            ``sys.argv[1:]``. Without a subcommand, ``train`` is assumed.

    Returns:
        int: 0 on success (argument errors exit through :mod:`argparse` with status 2).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*_COMMANDS, "-h", "--help"):
        argv = ["train", *argv]
    parser = _parser()
    args = parser.parse_args(argv)
    if args.dataset != "synthetic":
        return _train(args)
    if args.nodes < args.classes:
        parser.error(f"--nodes ({args.nodes}) must be at least --classes ({args.classes})")
    if args.degree >= args.nodes - 1:
        parser.error(f"--degree ({args.degree}) must be below --nodes - 1 ({args.nodes - 1})")
    return _train(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnact", description="Activation compressed training for GNNs.")
    sub = parser.add_subparsers(dest="command", metavar="{train}")
    train = sub.add_parser(
        "train", help="train fp32 PyG and compressed runs side by side (the default)",
        description="Train a PyG model full-batch on a dataset (default: a synthetic graph) "
                    "once per bit width: bits=32 is plain PyG, lower widths run the same model "
                    "(same seed) after gnnact.convert, its context compressed. Prints "
                    "accuracy, saved-context bytes, peak memory (CUDA) and epoch time against "
                    "fp32.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    train.add_argument("--model", choices=MODELS, default="gcn")
    train.add_argument("--dataset", default="synthetic",
                       help="'synthetic' (the --nodes/--degree/... options) or a name known to "
                            "gnnact.data.load_dataset: ogbn-arxiv, reddit, flickr, cora, "
                            "computers, dblp, ...")
    train.add_argument("--root", type=Path, default=None,
                       help="datasets root (default: $GNNACT_DATA, else "
                            "~/.cache/gnnact/datasets)")
    train.add_argument("--workdir", type=Path, default=None,
                       help="copy the dataset here first and load the copy (read-only roots)")
    train.add_argument("--split", type=int, default=0,
                       help="which given split, for datasets with several")
    train.add_argument("--device", type=torch.device, default=torch.device("cpu"),
                       help="cpu, cuda, cuda:1, ...")
    train.add_argument("--bits", type=_bits_list(SUPPORTED_BITS), default=[32, 8, 4, 2],
                       help="comma-separated bit widths, each one of "
                            f"{', '.join(map(str, SUPPORTED_BITS))}")
    train.add_argument("--adaptive", type=_bits_list(QUANT_BITS), default=[],
                       help="also train with gnnact.Controller at these average bits "
                            "(comma-separated; 1-8)")
    train.add_argument("--adapt-interval", type=_positive(int), default=50,
                       help="steps between the controller's sensitivity estimates")
    train.add_argument("--layers", type=_positive(int), default=None,
                       help="default: 3 (GCN, SAGE, GAT), 16 (GCNII)")
    train.add_argument("--hidden", type=_positive(int), default=128,
                       help="hidden width (GAT: per head, 3 heads)")
    train.add_argument("--dropout", type=_fraction, default=0.5)
    # 40 epochs on 10,000 nodes: the default run (4 bit widths, 3-layer GCN) takes about
    # 2 minutes on a 2-core machine, near convergence for fp32.
    train.add_argument("--epochs", type=_positive(int), default=40)
    train.add_argument("--lr", type=_positive(float), default=0.01)
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--group-size", type=_positive(int), default=512)
    train.add_argument("--nodes", type=_positive(int), default=10_000,
                       help="nodes of the synthetic graph")
    train.add_argument("--degree", type=_positive(float), default=10.0,
                       help="average degree of the synthetic graph")
    train.add_argument("--features", type=_positive(int), default=64)
    train.add_argument("--classes", type=_positive(int), default=8)
    # Below synthetic_graph's 0.8: there a 3-layer GCN reaches ~99 % and every bit width looks
    # alike; at 0.6 fp32 is not saturated, so the cost of compression shows in the accuracy.
    train.add_argument("--homophily", type=_unit, default=0.6,
                       help="fraction of same-class edges of the synthetic graph")
    train.add_argument("--feature-signal", type=_nonnegative, default=1.0,
                       help="class-centroid scale of the synthetic features (noise std is 1)")
    train.add_argument("--out", type=Path, default=None,
                       help="append one JSON row per bit width to this file")
    train.add_argument("--threads", type=_positive(int), default=None,
                       help="CPU threads for torch (default: torch's choice)")
    train.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def _bits_list(allowed: tuple[int, ...]) -> Any:
    def parse(text: str) -> list[int]:
        try:
            bits = [int(b) for b in text.split(",") if b.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers, got {text!r}") from None
        bad = [b for b in bits if b not in allowed]
        if not bits or bad:
            raise argparse.ArgumentTypeError(
                f"each bit width must be one of {allowed}, got {text!r}")
        return list(dict.fromkeys(bits))  # keep order, drop repeats

    parse.__name__ = "bits"
    return parse


def _positive(kind: type) -> Any:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind.__name__}, got {text!r}") from None
        if not (value > 0 and math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def _unit(text: str) -> float:
    value = _float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text!r}")
    return value


def _nonnegative(text: str) -> float:
    value = _float(text)
    if not value >= 0.0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {text!r}")
    return value


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected float, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be finite, got {text!r}")
    return value


def _fraction(text: str) -> float:
    value = _float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return value


def _train(args: argparse.Namespace) -> int:
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.dataset == "synthetic":
        data = synthetic_graph(args.nodes, args.degree, args.features, args.classes,
                               homophily=args.homophily, feature_signal=args.feature_signal,
                               seed=args.seed)
    else:
        data = load_dataset(args.dataset, args.root, split=args.split, seed=args.seed,
                            workdir=args.workdir)
        args.features = data.num_features
        args.classes = data.y.size(1) if data.y.dim() == 2 else int(data.y.max()) + 1
    data = data.to(args.device)

    results = [_run(args, data, bits) for bits in args.bits]
    results += [_run(args, data, avg, adaptive=True) for avg in args.adaptive]

    ref = next((r for label, _, _, r in results if label == "32"), None)
    print(_table(results, ref))
    if args.out is not None:
        _append_rows(args, data, results, ref)
    return 0


def _run(args: argparse.Namespace, data: Data, bits: int,
         adaptive: bool = False) -> tuple[str, int, bool, RunResult]:
    """Train one model at ``bits``: 32 trains the plain PyG model, below that the same model
    (same initial weights and dropout masks) after :func:`gnnact.convert`; ``adaptive`` adds a
    :class:`~gnnact.Controller` with ``bits`` as its average. Returns (label, bits, adaptive,
    result)."""
    torch.manual_seed(args.seed)
    model = build(args.model, args.features, args.classes, hidden=args.hidden,
                  layers=args.layers, dropout=args.dropout).to(args.device)
    label = f"adaptive {bits}" if adaptive else str(bits)
    before_step = None
    if bits < 32:
        convert(model, Config(bits=bits, group_size=args.group_size))
    if adaptive:
        controller = Controller(model, avg_bits=bits, adapt_interval=args.adapt_interval)
        before_step = lambda: controller.adapt(lambda: loss_of(model, data))  # noqa: E731
    progress = None if args.no_progress else f"{args.model} {label:>10}"
    return label, bits, adaptive, train_full_batch(model, data, epochs=args.epochs, lr=args.lr,
                                                   before_step=before_step, progress=progress)


def _table(results: list[tuple[str, int, bool, RunResult]], ref: RunResult | None) -> str:
    header = ("bits", "test acc @ best val (%)", "saved context (MB)", "ratio vs fp32",
              "epoch time (ms)", "time vs fp32", "acc vs fp32 (pt)", "peak step memory (MB)",
              "peak vs fp32")
    rows = [header]
    for label, _, _, r in results:
        rows.append((
            label,
            f"{100 * r.test_acc:.2f}",
            f"{r.saved_bytes / 1e6:.2f}",
            f"{ref.saved_bytes / r.saved_bytes:.2f}x" if ref and r.saved_bytes else "n/a",
            f"{r.epoch_ms:.1f}",
            f"{r.epoch_ms / ref.epoch_ms:.2f}x" if ref else "n/a",
            f"{100 * (r.test_acc - ref.test_acc):+.2f}" if ref else "n/a",
            "n/a (CPU)" if r.peak_bytes is None else f"{r.peak_bytes / 1e6:.1f}",
            f"{r.peak_bytes / ref.peak_bytes:.2f}x"
            if ref and r.peak_bytes and ref.peak_bytes else "n/a",
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _append_rows(args: argparse.Namespace, data: Data,
                 results: list[tuple[str, int, bool, RunResult]], ref: RunResult | None) -> None:
    common = {
        "command": "train",
        "model": args.model,
        "layers": args.layers,
        "hidden": args.hidden,
        "dataset": args.dataset,
        "num_nodes": data.num_nodes,
        "num_edges": data.num_edges,
        "num_features": data.num_features,
        "num_classes": args.classes,
        "homophily": args.homophily,
        "feature_signal": args.feature_signal,
        "epochs": args.epochs,
        "lr": args.lr,
        "dropout": args.dropout,
        "seed": args.seed,
        "group_size": args.group_size,
        "threads": torch.get_num_threads(),
        **environment(args.device),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("a") as f:
        for _, bits, adaptive, r in results:
            row = {**common, "bits": bits, "adaptive": adaptive, **asdict(r),
                   "ratio_vs_fp32": ref.saved_bytes / r.saved_bytes if ref and r.saved_bytes
                   else None,
                   "time_vs_fp32": r.epoch_ms / ref.epoch_ms if ref else None}
            f.write(json.dumps(row) + "\n")
