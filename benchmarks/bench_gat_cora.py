"""GAT on Cora's public split as PyG's example trains it: PyG fp32 against gnnact, paired by seed.

The model is PyG's ``examples/gat.py``, written as it is there (functional ``F.dropout`` and
``F.elu`` in ``forward``): ``GATConv(F_in, 8, heads=8, dropout=0.6)`` then ``GATConv(64,
classes, heads=1, concat=False, dropout=0.6)``, input and hidden dropout 0.6, Adam at lr 0.005
with weight decay 5e-4, 200 epochs, row-normalised features (``NormalizeFeatures``), public
split. Each epoch is one training step and one evaluation; like the example, a run reports the
test accuracy of the first epoch with the best validation accuracy (and, beside it, the test
accuracy after the last epoch).

A seed draws the initial weights and every dropout mask, and each method runs every seed, so
each seed is a paired comparison with PyG. With ``--rng shared`` (what a user gets) the
rounding seeds come from the converted model's own per-pass stream
(:class:`gnnact.quant.rng.PassSeeds`), which leaves the global generator to the dropout masks:
they are PyG's, and a pair differs only by the rounding noise. (Rows recorded as ``shared``
before that stream existed drew the rounding seeds from the global generator, so from the
first compressed step on their dropout masks differed from PyG's; each row names its commit.)
With ``--rng matched`` every quantization draws from a stream of its own seeded by the run's
seed (:func:`gnnact.ops.context.controlled_noise`): the masks are PyG's too, and the rounding
noise is fixed by the seed, tensor by tensor.

Methods: ``pyg``; ``gnnact<b>`` (``gnnact.convert(model, Config(bits=b))``); and ablations
``gnnact<b>:key=value,...`` with keys

* ``att``: ``attention_bits`` of both convs;
* ``conv1``, ``conv2``: ``bits`` of one conv (its input and its projected features), through
  ``dataclasses.replace(module.config, bits=...)``;
* ``feat``: the projected features that the attention op keeps (both convs), whatever the
  conv's ``bits`` (a wrapper around the conv's call of :func:`gnnact.ops.gat_attention`);
* ``elu``: the ELU output kept by the functional ``F.elu`` (the scope's width for
  ``<model>:elu``);
* ``indep``: ``indep=0`` makes the attention vectors' gradients read the same rounded features
  as the edge scores' gradient, as :mod:`gnnact.ops.gat` did before it kept an independently
  rounded copy for them (biased; a diagnostic, patching the op's private
  ``independent_quantize``).

Rows (one per run) go to ``benchmarks/results/gat_cora.jsonl``; ``--summary`` prints the table
(fp32 against each method: mean ± std, paired difference ± standard error, paired t-test and
Wilcoxon signed-rank p-values) from the rows of a file instead of training.

Usage::

    python benchmarks/bench_gat_cora.py --methods pyg gnnact2 --seeds $(seq 0 29)
    python benchmarks/bench_gat_cora.py --methods pyg gnnact2 --seeds $(seq 0 29) --rng matched
    python benchmarks/bench_gat_cora.py --summary [--rng matched] [--tag TEXT]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.nn import GATConv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, append_rows, data_root, environment, read_rows

import gnnact
from gnnact.data import load_dataset, synthetic_graph
from gnnact.nn.conv import gat_conv as gat_conv_module
from gnnact.nn.scope import scope_of
from gnnact.ops import gat as gat_ops
from gnnact.ops.context import controlled_noise

#: PyG's examples/gat.py.
SETTINGS = {"hidden": 8, "heads": 8, "dropout": 0.6, "lr": 0.005, "weight_decay": 5e-4}
ABLATION_KEYS = ("att", "conv1", "conv2", "feat", "elu", "indep")


class GAT(torch.nn.Module):
    """PyG's ``examples/gat.py`` model, as written there."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 heads: int) -> None:
        super().__init__()
        self.conv1 = GATConv(in_channels, hidden_channels, heads, dropout=0.6)
        # On the Pubmed dataset, use `heads` output heads in `conv2`.
        self.conv2 = GATConv(hidden_channels * heads, out_channels, heads=1, concat=False,
                             dropout=0.6)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        x = self.conv2(x, edge_index)
        return x


def parse_method(method: str) -> tuple[int, dict[str, int]]:
    """``"gnnact2:att=4,feat=32"`` -> ``(2, {"att": 4, "feat": 32})``; ``"pyg"`` -> 32 bits.

    Raises:
        ValueError: an unknown method or ablation key.
    """
    if method == "pyg":
        return 32, {}
    name, _, rest = method.partition(":")
    if not name.startswith("gnnact") or not name[6:].isdigit():
        raise ValueError(f"unknown method {method!r}: pyg, gnnact<bits>[:key=value,...]")
    ablation: dict[str, int] = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        if key not in ABLATION_KEYS or not value.isdigit():
            raise ValueError(f"bad ablation {item!r} in {method!r}: keys {ABLATION_KEYS}")
        ablation[key] = int(value)
    return int(name[6:]), ablation


@contextlib.contextmanager
def feature_bits(bits: int | None) -> Iterator[None]:
    """Within the block, converted ``GATConv`` layers keep their projected features at
    ``bits`` (their input and attention coefficients as their config says)."""
    if bits is None:
        yield
        return
    original = gat_conv_module.gat_attention

    def patched(*args: Any, config: gnnact.Config | None = None, **kwargs: Any) -> Any:
        config = config or gnnact.Config()
        return original(*args, config=dataclasses.replace(
            config, bits=bits, attention_bits=config.attention), **kwargs)

    gat_conv_module.gat_attention = patched
    try:
        yield
    finally:
        gat_conv_module.gat_attention = original


@contextlib.contextmanager
def shared_rounding(enabled: bool) -> Iterator[None]:
    """Within the block (if ``enabled``), the GAT op keeps no independent copy of its
    features: the attention vectors' gradients read the copy the edge scores' gradient reads."""
    if not enabled:
        yield
        return
    original = gat_ops.independent_quantize
    gat_ops.independent_quantize = lambda *args: None
    try:
        yield
    finally:
        gat_ops.independent_quantize = original


def build_model(data: Data, method: str, seed: int) -> GAT:
    """The seeded model for ``method``, converted and configured."""
    bits, ablation = parse_method(method)
    torch.manual_seed(seed)
    classes = int(data.y.max()) + 1
    model = GAT(data.num_features, SETTINGS["hidden"], classes, SETTINGS["heads"])
    if method == "pyg":
        return model
    gnnact.convert(model, gnnact.Config(bits=bits, attention_bits=ablation.get("att")))
    for name in ("conv1", "conv2"):
        if name in ablation:
            conv = getattr(model, name)
            conv.config = dataclasses.replace(conv.config, bits=ablation[name])
    if "elu" in ablation:
        scope = scope_of(model)
        assert scope is not None
        scope.bits["<model>:elu"] = ablation["elu"]
    return model


def accuracies(model: GAT, data: Data) -> list[float]:
    """Train, validation and test accuracy (evaluation mode, no gradient)."""
    model.eval()
    with torch.no_grad():
        pred = model(data.x, data.edge_index).argmax(dim=-1)
    return [int((pred[mask] == data.y[mask]).sum()) / int(mask.sum())
            for mask in (data.train_mask, data.val_mask, data.test_mask)]


def train(data: Data, method: str, seed: int, epochs: int, rng: str) -> dict:
    """One run of PyG's example loop; returns the run's numbers."""
    model = build_model(data, method, seed)
    optimizer = torch.optim.Adam(model.parameters(), lr=SETTINGS["lr"],
                                 weight_decay=SETTINGS["weight_decay"])
    _, ablation = parse_method(method)
    # Matched: quantization noise from per-tensor streams seeded by the run's seed.
    noise = (controlled_noise(seed) if rng == "matched" and method != "pyg"
             else contextlib.nullcontext())
    best_val = test_at_best = 0.0
    best_epoch = 0
    accs = [0.0, 0.0, 0.0]
    t0 = time.perf_counter()
    with noise, feature_bits(ablation.get("feat")), shared_rounding(ablation.get("indep") == 0):
        for epoch in range(1, epochs + 1):
            model.train()
            optimizer.zero_grad()
            out = model(data.x, data.edge_index)
            loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
            loss.backward()
            optimizer.step()
            accs = accuracies(model, data)
            if accs[1] > best_val:
                best_val, test_at_best, best_epoch = accs[1], accs[2], epoch
    return {"test_acc": round(100 * test_at_best, 2), "final_test_acc": round(100 * accs[2], 2),
            "best_val_acc": round(100 * best_val, 2), "best_epoch": best_epoch,
            "final_train_acc": round(100 * accs[0], 2), "final_loss": round(loss.item(), 5),
            "seconds": round(time.perf_counter() - t0, 1)}


def paired(base: dict[int, float], other: dict[int, float]) -> dict:
    """Mean ± std of ``other`` and the paired difference to ``base`` over their common seeds:
    mean ± standard error, paired t-test and Wilcoxon signed-rank two-sided p-values."""
    from scipy import stats

    seeds = sorted(set(base) & set(other))
    diffs = [other[s] - base[s] for s in seeds]
    n = len(seeds)
    row = {"n": n, "mean": statistics.mean(other[s] for s in seeds) if n else math.nan,
           "std": statistics.stdev(other[s] for s in seeds) if n > 1 else math.nan,
           "diff": statistics.mean(diffs) if n else math.nan,
           "se": statistics.stdev(diffs) / math.sqrt(n) if n > 1 else math.nan,
           "t_p": math.nan, "wilcoxon_p": math.nan}
    if n > 1 and any(diffs):
        row["t_p"] = float(stats.ttest_rel([other[s] for s in seeds],
                                           [base[s] for s in seeds]).pvalue)
        row["wilcoxon_p"] = float(stats.wilcoxon(diffs).pvalue)
    return row


def summarize(rows: list[dict], key: str = "test_acc") -> str:
    """A Markdown table of every method against ``pyg``, paired by seed. PyG's runs use no
    quantization noise, so they serve every rng mode and tag; a later row of the same
    (method, seed, rng, tag) replaces an earlier one."""
    base: dict[int, float] = {}
    runs: dict[tuple[str, str, str], dict[int, float]] = {}
    for r in rows:
        if r["method"] == "pyg":
            base[r["seed"]] = r[key]
        else:
            runs.setdefault((r["rng"], r.get("tag") or "", r["method"]), {})[r["seed"]] = r[key]
    lines = [f"| rng | tag | method | seeds | {key} (%) | paired Δ vs pyg (pt) | t-test p "
             "| Wilcoxon p |", "|---|---|---|---|---|---|---|---|"]
    if base:
        lines.append(f"| | | pyg | {len(base)} | {statistics.mean(base.values()):.2f} ± "
                     f"{statistics.stdev(base.values()) if len(base) > 1 else 0.0:.2f} | | | |")
    for (rng, tag, method), values in sorted(runs.items()):
        if not base:
            lines.append(f"| {rng} | {tag} | {method} | {len(values)} | "
                         f"{statistics.mean(values.values()):.2f} | | | |")
            continue
        s = paired(base, values)
        lines.append(f"| {rng} | {tag} | {method} | {s['n']} | {s['mean']:.2f} ± "
                     f"{s['std']:.2f} | {s['diff']:+.2f} ± {s['se']:.2f} | "
                     f"{s['t_p']:.3g} | {s['wilcoxon_p']:.3g} |")
    return "\n".join(lines)


def gat_cora_rows(path: Path) -> list[dict]:
    """This benchmark's rows in the JSONL file ``path``."""
    return [r for r in read_rows(path) if r.get("bench") == "gat_cora"]


def load(args: argparse.Namespace, tmp: str) -> Data:
    if args.smoke:
        return synthetic_graph(300, 8, 16, 4, seed=0)
    return load_dataset("cora", args.root, download=False, workdir=tmp)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", nargs="+", default=["pyg", "gnnact2"],
                        help="pyg, gnnact<bits>, gnnact<bits>:key=value,... "
                             f"(keys: {', '.join(ABLATION_KEYS)})")
    parser.add_argument("--seeds", nargs="+", type=int, default=list(range(30)))
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--rng", choices=("shared", "matched"), default="shared",
                        help="rounding seeds from the model's per-pass stream (shared, what "
                             "a user gets) or from per-tensor streams seeded by the run's "
                             "seed (matched); both leave PyG's dropout masks")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--root", type=Path, default=None,
                        help="datasets root (default: $GNNACT_DATA or ../shared/datasets)")
    parser.add_argument("--tag", default="", help="free text stored in each row")
    parser.add_argument("--out", type=Path, default=RESULTS / "gat_cora.jsonl")
    parser.add_argument("--summary", action="store_true",
                        help="print the table from the rows of --out and exit")
    parser.add_argument("--metric", default="test_acc",
                        choices=("test_acc", "final_test_acc", "best_val_acc"))
    parser.add_argument("--smoke", action="store_true",
                        help="a 300-node synthetic graph, 2 epochs; writes nothing")
    args = parser.parse_args(argv)
    for method in args.methods:
        parse_method(method)  # fail early
    if args.summary:
        print(summarize(gat_cora_rows(args.out), args.metric))
        return 0
    if args.smoke:
        args.epochs = min(args.epochs, 2)
    args.root = args.root or data_root()
    torch.set_num_threads(args.threads)
    env = environment("cpu")
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = load(args, tmp)
        for seed in args.seeds:
            for method in args.methods:
                result = train(data, method, seed, args.epochs, args.rng)
                bits, ablation = parse_method(method)
                row = {"bench": "gat_cora", **env, "dataset": "smoke" if args.smoke else "cora",
                       "method": method, "bits": bits, "ablation": ablation, "seed": seed,
                       "rng": args.rng, "tag": args.tag, "epochs": args.epochs,
                       "settings": {**SETTINGS, "threads": args.threads}, **result}
                rows.append(row)
                if not args.smoke:  # row by row: an interrupted sweep keeps what it ran
                    append_rows(args.out, [row])
                print(f"seed {seed:3d} {method:24s} test@best-val {result['test_acc']:6.2f} "
                      f"final {result['final_test_acc']:6.2f} (epoch {result['best_epoch']}, "
                      f"{result['seconds']:.0f} s)", flush=True)
    if args.smoke:
        print(summarize(rows, args.metric))
        return 0
    print(f"{len(rows)} rows -> {args.out}")
    print(summarize(gat_cora_rows(args.out), args.metric))  # with the file's earlier runs (PyG's)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
