"""Command line: ``gnnact train`` (the default) compares fp32 PyG training with compressed runs.

Example::

    python -m gnnact                         # GCN on the default synthetic graph: 32,auto
    gnnact train --dataset cora --root ~/data --bits 32,auto,2
    gnnact train --model sage --bits 32,2 --epochs 50 --out results.jsonl
    gnnact train --dataset ogbn-arxiv --root ~/data --device cuda --bits 32,2
    gnnact train --bits 32,2 --nprocs 2      # partitioned over 2 local gloo processes

Settings left unset come from the dataset's preset (:func:`gnnact.presets.preset`). Arguments
are parsed before torch and PyG load, so ``--help`` and argument errors answer at once; a
user's error (unknown dataset, missing files, CUDA unavailable, an unwritable ``--out``) ends
in one line on stderr and exit status 2, as argparse's own errors do.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gnnact.names import MODELS, QUANT_BITS, SUPPORTED_BITS
from gnnact.presets import Preset, preset

#: ``--bits`` for ``gnnact.convert(model)`` with its default config: automatic widths.
AUTO = "auto"

if TYPE_CHECKING:
    from torch_geometric.data import Data

    from gnnact.training import RunResult

__all__ = ["main"]

_COMMANDS = ("train",)
_PRESET = "(default: the dataset's preset)"


class _UsageError(Exception):
    """A mistake in what the user asked for: reported in one line, exit status 2."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``gnnact`` console script and of ``python -m gnnact``.

    Args:
        argv (Sequence[str], optional): the arguments without the program name; by default
            ``sys.argv[1:]``. Without a subcommand, ``train`` is assumed.

    Returns:
        int: 0 on success, 2 on a user's error (argument errors exit through :mod:`argparse`
        with status 2).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in (*_COMMANDS, "-h", "--help"):
        argv = ["train", *argv]
    parser = _parser()
    args = parser.parse_args(argv)
    if args.dataset == "synthetic":
        if args.nodes < args.classes:
            parser.error(f"--nodes ({args.nodes}) must be at least --classes ({args.classes})")
        if args.degree >= args.nodes - 1:
            parser.error(f"--degree ({args.degree}) must be below --nodes - 1 "
                         f"({args.nodes - 1})")
    if args.nprocs == 1 and args.exchange_bits is not None:
        parser.error(f"--exchange-bits ({args.exchange_bits}) needs --nprocs > 1: a single "
                     f"process exchanges nothing")
    if args.nprocs > 1:
        for given, why in ((args.adaptive, "--adaptive"),
                           (not args.device.startswith("cpu"), f"--device {args.device}"),
                           (args.adj == "csr", "--adj csr"),
                           (args.features_layout == "sparse", "--features-layout sparse")):
            if given:
                parser.error(f"--nprocs {args.nprocs} does not support {why}: the partitioned "
                             f"runs are gloo processes on the CPU, over edge_index and dense "
                             f"features, at fixed bits")
    try:
        return _train(args)
    except _UsageError as error:
        print(f"gnnact: error: {error}", file=sys.stderr)
        return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gnnact", description="Activation compressed training for GNNs.")
    sub = parser.add_subparsers(dest="command", metavar="{train}")
    train = sub.add_parser(
        "train", help="train fp32 PyG and compressed runs side by side (the default)",
        description="Train a PyG model full-batch on a dataset (default: a synthetic graph) "
                    "once per bit width: bits=32 is plain PyG, lower widths run the same model "
                    "(same seed) after gnnact.convert, its context compressed. Prints test "
                    "accuracy at the best validation epoch, saved-context bytes (gnnact's "
                    "graph cache counted), peak memory (CUDA) and epoch time against fp32. "
                    "Model and optimiser settings not given come from the dataset's preset "
                    "(the usual setting for its family: Cora GCN 2x64, 200 epochs, weight "
                    "decay 5e-4; the synthetic graph 3x128, 40 epochs).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    data = train.add_argument_group("data")
    data.add_argument("--dataset", default="synthetic",
                      help="'synthetic' (the --nodes/--degree/... options) or a name known to "
                           "gnnact.data.load_dataset: cora, citeseer, pubmed, computers, photo, "
                           "cs, physics, dblp, ogbn-arxiv, reddit, flickr, tolokers, ...")
    data.add_argument("--root", type=Path, default=None,
                      help="datasets root (default: $GNNACT_DATA, else "
                           "~/.cache/gnnact/datasets)")
    data.add_argument("--workdir", type=Path, default=None,
                      help="copy the dataset here first and load the copy (for read-only "
                           "roots)")
    data.add_argument("--split", type=_nonnegative_int, default=0,
                      help="which given split, for datasets with several")
    data.add_argument("--adj", choices=("edge_index", "csr"), default=None,
                      help=f"the graph as PyG's edge_index or a sparse CSR adj_t {_PRESET}")
    data.add_argument("--features-layout", choices=("dense", "sparse"), default=None,
                      help=f"node features dense or as a sparse CSR matrix {_PRESET}")
    synthetic = train.add_argument_group("synthetic graph (--dataset synthetic)")
    synthetic.add_argument("--nodes", type=_positive(int), default=10_000, help="nodes")
    synthetic.add_argument("--degree", type=_positive(float), default=10.0,
                           help="average degree")
    synthetic.add_argument("--features", type=_positive(int), default=64,
                           help="feature columns")
    synthetic.add_argument("--classes", type=_positive(int), default=8, help="classes")
    # Below synthetic_graph's 0.8: there a 3-layer GCN reaches ~99 % and every bit width looks
    # alike; at 0.6 fp32 is not saturated, so the cost of compression shows in the accuracy.
    synthetic.add_argument("--homophily", type=_unit, default=0.6,
                           help="fraction of same-class edges")
    synthetic.add_argument("--feature-signal", type=_nonnegative, default=1.0,
                           help="class-centroid scale of the features (noise std is 1)")
    model = train.add_argument_group("model and training")
    model.add_argument("--model", choices=MODELS, default="gcn", help="the PyG model")
    model.add_argument("--layers", type=_positive(int), default=None,
                       help=f"conv layers {_PRESET}")
    model.add_argument("--hidden", type=_positive(int), default=None,
                       help=f"hidden width; GAT: channels per head {_PRESET}")
    model.add_argument("--heads", type=_positive(int), default=None,
                       help=f"GAT's attention heads {_PRESET}")
    model.add_argument("--dropout", type=_fraction, default=None,
                       help=f"dropout probability {_PRESET}")
    model.add_argument("--batchnorm", action=argparse.BooleanOptionalAction, default=None,
                       help=f"BatchNorm after each hidden conv (GCN, SAGE, GAT) {_PRESET}")
    model.add_argument("--bn-momentum", type=_unit, default=None,
                       help=f"BatchNorm momentum {_PRESET}")
    model.add_argument("--epochs", type=_positive(int), default=None,
                       help=f"full-batch training steps {_PRESET}")
    model.add_argument("--lr", type=_positive(float), default=None,
                       help=f"Adam's learning rate {_PRESET}")
    model.add_argument("--weight-decay", type=_nonnegative, default=None,
                       help=f"Adam's weight decay {_PRESET}")
    model.add_argument("--seed", type=int, default=0,
                       help="seed of the weights, dropout and random splits")
    compression = train.add_argument_group("compression")
    compression.add_argument("--bits", type=_bits_list(SUPPORTED_BITS, auto=True),
                             default=[32, AUTO],
                             help="comma-separated bit widths, each one of "
                                  f"{', '.join(map(str, SUPPORTED_BITS))} or '{AUTO}'; 32 is "
                                  f"plain PyG, '{AUTO}' gnnact.convert's default (each "
                                  "tensor's width chosen as it trains), the others fixed")
    compression.add_argument("--adaptive", type=_bits_list(QUANT_BITS), default=[],
                             help="also train with gnnact.Controller at these average bits "
                                  "(comma-separated; 1-8)")
    compression.add_argument("--adapt-interval", type=_positive(int), default=50,
                             help="longest gap between the controller's sensitivity estimates "
                                  "(it estimates at steps 0, 10, 30, ... up to this gap)")
    compression.add_argument("--group-size", type=_positive(int), default=512,
                             help="values that share one scale and zero point")
    compression.add_argument("--exchange-bits", type=int, choices=SUPPORTED_BITS, default=None,
                             metavar="BITS",
                             help="with --nprocs > 1: width of the halo rows the ranks "
                                  "exchange, one of "
                                  f"{', '.join(map(str, SUPPORTED_BITS))} (32 exact, 16 "
                                  "bfloat16, 1-8 stochastic rounding); default: each run's "
                                  "--bits (32 for the fp32 and the auto rows)")
    run = train.add_argument_group("run")
    run.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    run.add_argument("--out", type=Path, default=None,
                     help="append one JSON row per run to this file")
    run.add_argument("--threads", type=_positive(int), default=None,
                     help="CPU threads for torch (default: torch's choice); with --nprocs, "
                          "per process (default: torch's choice divided by --nprocs)")
    run.add_argument("--nprocs", type=_positive(int), default=1,
                     help="partition the graph over this many local gloo processes "
                          "(gnnact.distributed: METIS if available, else contiguous ids) and "
                          "train each run full-batch on them; the table adds the halo bytes "
                          "exchanged per step")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    return parser


def _bits_list(allowed: tuple[int, ...], auto: bool = False) -> Any:
    def parse(text: str) -> list[int | str]:
        tokens = [b.strip() for b in text.split(",") if b.strip()]
        try:
            bits = [b if auto and b == AUTO else int(b) for b in tokens]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected comma-separated integers{f' or {AUTO!r}' if auto else ''}, got "
                f"{text!r}") from None
        bad = [b for b in bits if b != AUTO and b not in allowed]
        if not bits or bad:
            raise argparse.ArgumentTypeError(
                f"each bit width must be one of {allowed}{f' or {AUTO!r}' if auto else ''}, "
                f"got {text!r}")
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


def _nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected int, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {text!r}")
    return value


def _resolve(args: argparse.Namespace, dataset: str) -> Preset:
    """The run's settings: the dataset's preset with every option the user gave on top."""
    base = preset(dataset, args.model)
    given = {"features": args.features_layout}
    given |= {f.name: getattr(args, f.name) for f in fields(Preset) if f.name != "features"}
    return Preset(**{f.name: getattr(base, f.name) if given[f.name] is None else given[f.name]
                     for f in fields(Preset)})


def _device(text: str) -> Any:
    import torch

    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise _UsageError(f"--device {text!r}: {error}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise _UsageError(f"--device {text}: CUDA is not available on this machine (torch "
                          f"{torch.__version__}); use --device cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise _UsageError(f"--device {text}: this machine has {torch.cuda.device_count()} "
                          f"CUDA device(s)")
    return device


def _check_out(out: Path | None) -> None:
    """Fail before training, not after it, when ``--out`` cannot be appended to."""
    if out is None:
        return
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("a"):
            pass
    except OSError as error:
        raise _UsageError(f"--out {str(out)!r}: {error.strerror or error}") from None


def _load(args: argparse.Namespace, settings: Preset) -> Data:
    from gnnact.data import DatasetNotFoundError, load_dataset, synthetic_graph
    from gnnact.training import with_layout

    if args.dataset == "synthetic":
        data = synthetic_graph(args.nodes, args.degree, args.features, args.classes,
                               homophily=args.homophily, feature_signal=args.feature_signal,
                               seed=args.seed)
    else:
        try:
            data = load_dataset(args.dataset, args.root, split=args.split, seed=args.seed,
                                workdir=args.workdir)
        except (DatasetNotFoundError, ValueError, OSError) as error:
            raise _UsageError(" ".join(str(error).split())) from None  # one line
        args.features = data.num_features
        args.classes = data.y.size(1) if data.y.dim() == 2 else int(data.y.max()) + 1
    return with_layout(data, adj=settings.adj, features=settings.features)


def _train(args: argparse.Namespace) -> int:
    device = _device(args.device)
    _check_out(args.out)
    from gnnact.data import canonical_name

    try:
        dataset = "synthetic" if args.dataset == "synthetic" else canonical_name(args.dataset)
    except ValueError as error:
        raise _UsageError(str(error)) from None
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    settings = _resolve(args, dataset)
    if args.nprocs > 1:  # the exchange works on edge_index; shards slice dense rows
        settings = replace(settings, adj="edge_index", features="dense")
    data = _load(args, settings).to(device)
    if args.nprocs > 1:
        results = _run_partitioned(args, settings, data)
    else:
        results = [_run(args, settings, data, bits) for bits in args.bits]
        results += [_run(args, settings, data, avg, adaptive=True) for avg in args.adaptive]

    ref = next((r for label, _, _, r in results if label == "32"), None)
    print(_title(args, settings, data, ref is not None))
    print(_table(results, ref, _metric_label(data)))
    if args.out is not None:
        _append_rows(args, settings, data, device, results, ref)
    return 0


def _run(args: argparse.Namespace, settings: Preset, data: Data, bits: int | str,
         adaptive: bool = False) -> tuple[str, int | str, bool, RunResult]:
    """Train one model at ``bits``: 32 trains the plain PyG model, below that the same model
    (same initial weights and dropout masks) after :func:`gnnact.convert` (``"auto"``: with its
    default config, automatic widths); ``adaptive`` adds a
    :class:`~gnnact.Controller` with ``bits`` as its average. Returns (label, bits, adaptive,
    result)."""
    from gnnact import Controller
    from gnnact.training import loss_of, train_full_batch

    model = _model(args, settings, bits, data.x.device)
    label = f"adaptive {bits}" if adaptive else str(bits)
    before_step = None
    if adaptive:
        controller = Controller(model, avg_bits=bits, adapt_interval=args.adapt_interval)
        before_step = lambda: controller.adapt(lambda: loss_of(model, data))  # noqa: E731
    progress = None if args.no_progress else f"{args.model} {label:>10}"
    result = train_full_batch(model, data, epochs=settings.epochs, lr=settings.lr,
                              weight_decay=settings.weight_decay, before_step=before_step,
                              progress=progress)
    return label, bits, adaptive, result


def _model(args: argparse.Namespace, settings: Preset, bits: int | str, device: Any) -> Any:
    """The run's model at ``bits``, seeded with ``--seed``: plain PyG at 32, converted below
    (``"auto"``: automatic widths)."""
    import torch

    from gnnact import Config, convert
    from gnnact.models import build

    torch.manual_seed(args.seed)
    model = build(args.model, args.features, args.classes, hidden=settings.hidden,
                  layers=settings.layers, heads=settings.heads, dropout=settings.dropout,
                  batchnorm=settings.batchnorm).to(device)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.momentum = settings.bn_momentum
    if bits == AUTO:
        convert(model, Config(group_size=args.group_size))
    elif bits < 32:
        convert(model, Config(bits=bits, group_size=args.group_size))
    return model


def _partition_method() -> str:
    from gnnact.distributed import metis_available

    return "metis" if metis_available() else "contiguous"


def _run_partitioned(args: argparse.Namespace, settings: Preset,
                     data: Data) -> list[tuple[str, int | str, bool, RunResult]]:
    """Every ``--bits`` run on ``--nprocs`` local gloo processes; per run, the ranks' results
    combined: the whole graph's metrics (the same on every rank), the largest rank's saved
    context and the slowest rank's epoch time, the halo bytes all ranks sent per step."""
    import torch

    from gnnact.distributed import run_local

    threads = args.threads or max(1, torch.get_num_threads() // args.nprocs)
    ranks = run_local(_partitioned_rank, args.nprocs, args, settings, data, threads=threads)
    results = []
    for i, bits in enumerate(args.bits):
        per = [r[i] for r in ranks]
        combined = replace(per[0], saved_bytes=max(r.saved_bytes for r in per),
                           epoch_ms=max(r.epoch_ms for r in per),
                           exchanged_bytes=sum(r.exchanged_bytes for r in per))
        results.append((str(bits), bits, False, combined))
    return results


def _partitioned_rank(rank: int, world_size: int, args: argparse.Namespace, settings: Preset,
                      data: Data) -> list[RunResult]:
    """One rank's share of every ``--bits`` run (a module-level function: ``run_local``
    pickles it by name)."""
    import torch

    from gnnact.distributed import DistributedGNN, shard_graph, train_partitioned
    from gnnact.training import metric_of

    metric = metric_of(data)  # the whole graph's (data.metric), before the shard drops it
    shard = shard_graph(data, method=_partition_method(), seed=args.seed)
    del data
    results = []
    for bits in args.bits:
        model = _model(args, settings, bits, "cpu")
        if rank:  # rank 0 goes on with the single-process stream; the others draw their own
            torch.manual_seed(args.seed + 1_000_003 * rank)
        exchange_bits = _exchange_bits(args, bits)
        dmodel = DistributedGNN(model, shard, exchange_bits=exchange_bits,
                                group_size=args.group_size)
        progress = None if args.no_progress else f"{args.model} {bits:>10}"
        results.append(train_partitioned(dmodel, epochs=settings.epochs, lr=settings.lr,
                                         weight_decay=settings.weight_decay, metric=metric,
                                         progress=progress))
        dmodel.remove()
    return results


def _exchange_bits(args: argparse.Namespace, bits: int | str) -> int:
    """The halo width of a partitioned run at ``bits``: ``--exchange-bits``, else the run's
    own (exact for ``"auto"``, whose widths are the activations')."""
    if args.exchange_bits is not None:
        return args.exchange_bits
    return 32 if bits == AUTO else int(bits)


def _title(args: argparse.Namespace, settings: Preset, data: Data, has_fp32: bool) -> str:
    """What was trained, and what the ratios compare with."""
    from gnnact.models import build

    # The preset may leave depth and width to the model's defaults: read them off a small build.
    model = build(args.model, 2, 2, hidden=settings.hidden, layers=settings.layers,
                  heads=settings.heads, batchnorm=settings.batchnorm)
    first = model.lins[0] if hasattr(model, "lins") else model.convs[0]
    width = getattr(first, "out_channels", getattr(first, "out_features", None))
    shape = f"{len(model.convs)} layers x {width}"
    if args.model == "gat":
        shape += f" x {settings.heads} heads"
    baseline = ("ratios and differences are against the fp32 row (bits 32: plain PyG, "
                "nothing compressed)" if has_fp32 else "no fp32 row (add 32 to --bits for one)")
    title = (f"{args.model.upper()} ({shape}{', BatchNorm' if settings.batchnorm else ''}) "
             f"on {args.dataset} ({data.num_nodes:,} nodes, {data.num_edges:,} edges), "
             f"{settings.epochs} epochs at lr {settings.lr:g}, weight decay "
             f"{settings.weight_decay:g}; {baseline}")
    if args.nprocs > 1:
        width = ("each run's bits" if args.exchange_bits is None
                 else f"{args.exchange_bits} bits")
        title += (f"\npartitioned over {args.nprocs} gloo processes ({_partition_method()}), "
                  f"halo exchanged at {width}; saved context and epoch time: the largest "
                  f"rank's; exchanged: all ranks' halo bytes per training step")
    return title


def _metric_label(data: Data) -> str:
    """What the accuracy column holds: ``data.metric`` (see :func:`gnnact.training.metric_of`)
    in words."""
    metric = getattr(data, "metric", "acc")
    # Multi-label targets (ogbn-proteins, Yelp) are scored by ROC-AUC, OGB's or not.
    label = "test ROC-AUC" if metric == "rocauc" or data.y.dim() == 2 else "test acc"
    return f"{label} (OGB Evaluator)" if metric.startswith("ogbn") else label


def _table(results: list[tuple[str, int | str, bool, RunResult]], ref: RunResult | None,
           metric: str = "test acc") -> str:
    header = ("bits", f"{metric} @ best val (%)", "saved context (MB)", "ratio vs fp32",
              "epoch time (ms)", "time vs fp32", "acc vs fp32 (pt)", "peak step memory (MB)",
              "peak vs fp32")
    # Partitioned runs (gnnact.distributed.PartitionedRunResult) add their halo traffic.
    exchanged = all(hasattr(r, "exchanged_bytes") for *_, r in results)
    if exchanged:
        header += ("exchanged (MB/step)",)
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
            *([f"{r.exchanged_bytes / 1e6:.3f}"] if exchanged else []),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [" | ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def _append_rows(args: argparse.Namespace, settings: Preset, data: Data, device: Any,
                 results: list[tuple[str, int | str, bool, RunResult]],
                 ref: RunResult | None) -> None:
    import torch

    from gnnact.env import environment

    common = {
        "command": "train",
        "model": args.model,
        "dataset": args.dataset,
        "num_nodes": data.num_nodes,
        "num_edges": data.num_edges,
        "num_features": data.num_features,
        "num_classes": args.classes,
        **asdict(settings),
        "seed": args.seed,
        "group_size": args.group_size,
        "threads": torch.get_num_threads(),
        "nprocs": args.nprocs,
        **environment(device),
    }
    if args.nprocs > 1:
        common["partition"] = _partition_method()
    if args.dataset == "synthetic":
        common |= {"homophily": args.homophily, "feature_signal": args.feature_signal}
    with args.out.open("a") as f:
        for _, bits, adaptive, r in results:
            row = {**common, "bits": bits, "adaptive": adaptive, **asdict(r),
                   **({"exchange_bits": _exchange_bits(args, bits)} if args.nprocs > 1
                      else {}),
                   "ratio_vs_fp32": ref.saved_bytes / r.saved_bytes if ref and r.saved_bytes
                   else None,
                   "time_vs_fp32": r.epoch_ms / ref.epoch_ms if ref else None}
            f.write(json.dumps(row) + "\n")
