"""The full-batch benchmark suite: memory-saving methods side by side on EXACT's model configs.

Methods (each on the same graph, seeds, initial weights and epochs):

- ``pyg``: plain PyG fp32, the reference;
- ``gnnact2``, ``gnnact4``, ``gnnact8``: the same model after ``gnnact.convert`` at that many
  bits (GAT's attention coefficients at their default 8 bits);
- ``uniform4``: converted with every tensor at 4 bits, GAT's attention included (GACT's "fixed
  4-bit", the configuration that collapsed GAT there);
- ``adaptive2``, ``adaptive3``, ``adaptive4``: converted, with a ``gnnact.Controller`` at that
  average (sensitivities estimated at steps 0, 10, 30 and then every 50; its passes are
  outside the timing);
- ``pernode2``: converted at 2 bits with per-node mixed precision (``Config(per_node=True)``);
- ``amp``: PyG under ``torch.autocast`` in bfloat16 (what mixed precision alone saves);
- ``checkpoint``: PyG with every layer block recomputed in backward
  (``torch.utils.checkpoint``, non-reentrant; BatchNorm running statistics see each block
  twice, as with any checkpointing);
- ``save_on_cpu``: PyG with every saved tensor moved to host memory
  (``torch.autograd.graph.save_on_cpu``; pinned on CUDA).

``--adj csr`` gives every method the graph as a ``torch.sparse_csr`` ``adj_t`` (PyG's
``ToSparseTensor`` convention, :func:`gnnact.training.adjacency`) instead of ``edge_index``: the
same model and math, but PyG's layers then aggregate by sparse matrix products rather than
per-edge gather and scatter, 4-5x faster for GCN and GCNII on the CPU. The rows record it.

``--features sparse`` gives every method the node features as a ``torch.sparse_csr`` tensor:
the same values, but the first layer's product is sparse. Coauthor-Physics' 8,415 bag-of-words
columns are 0.4 % non-zero; dense, its first layer alone takes ~6 s of a CPU step, while PyG's
whole GCN step takes ~2 s with sparse features. The rows record it. (SAGE's PyG layer cannot
aggregate sparse features; gnnact's, which transforms before aggregating, can.)

``--bn-momentum`` sets every BatchNorm's running-statistics momentum (PyTorch's default 0.1).
On graphs whose features are normalised rows over many columns (Amazon-Computers: 767 columns,
first-layer outputs of variance ~1e-4), the running variance needs ~90 steps at 0.1 to forget
its initial 1, and until then evaluation predicts one class for every method alike. A short run
on such a graph needs a larger momentum to say anything; the rows record it.

Per (model, method): test accuracy at the best validation epoch (mean ± std over seeds), saved
context bytes of one forward pass (graph walk; not for ``checkpoint`` and ``save_on_cpu``,
whose saved tensors live outside the graph), median step time and, on CUDA, the peak memory a
step allocates. Rows go to ``benchmarks/results/suite.jsonl``, a markdown table to
``benchmarks/results/suite.md``; ``benchmarks/plot_suite.py`` draws the plots.

Usage::

    python benchmarks/bench_suite.py [--graph synthetic-arxiv | <dataset name>] [--nodes N]
        [--models gcn sage gat gcnii] [--methods pyg gnnact2 ...] [--seeds 0 1 2]
        [--epochs 100] [--adj edge_index | csr] [--features dense | sparse]
        [--bn-momentum 0.1] [--adapt-interval 50] [--first-interval 10 | none]
        [--min-bits 1] [--device cuda] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    ADAPT_INTERVAL,
    FIRST_INTERVAL,
    RESULTS,
    append_rows,
    data_root,
    environment,
    optional_int,
)

import gnnact
from gnnact.data import SHAPES, load_dataset, synthetic_like
from gnnact.models import GCNII, MODELS, Stack, build, has_batchnorm
from gnnact.training import RunResult, loss_of, train_full_batch, with_layout

METHODS = ("pyg", "gnnact2", "gnnact4", "gnnact8", "uniform4", "adaptive2", "adaptive3",
           "adaptive4", "pernode2", "amp", "checkpoint", "save_on_cpu")


class Checkpointed(nn.Module):
    """Runs a :class:`~gnnact.models.Stack` or :class:`~gnnact.models.GCNII` with each layer
    block under :func:`torch.utils.checkpoint.checkpoint`: only block inputs are kept."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Tensor, adj) -> Tensor:
        m = self.model
        if isinstance(m, Stack):
            for conv, bn in zip(m.convs[:-1], m.bns, strict=True):
                x = checkpoint(lambda h, c=conv, b=bn: m.drop(m.act(b(c(h, adj)))), x,
                               use_reentrant=False)
            return m.convs[-1](x, adj)
        if isinstance(m, GCNII):
            x = x_0 = m.act(m.lins[0](m.drop_input(x)))
            for conv in m.convs:
                x = checkpoint(lambda h, c=conv: m.act(c(m.drop(h), x_0, adj)), x,
                               use_reentrant=False)
            return m.lins[1](m.drop(x))
        raise TypeError(f"cannot checkpoint {type(m).__name__}")


def prepare(method: str, model: nn.Module, data, device: torch.device, *,
            adapt_interval: int = ADAPT_INTERVAL, first_interval: int | None = FIRST_INTERVAL,
            min_bits: int = 1) -> tuple[nn.Module, dict]:
    """The model to train and the keyword arguments of :func:`train_full_batch` for
    ``method``; an adaptive method's controller estimates on the schedule of ``first_interval``
    and ``adapt_interval`` (:meth:`gnnact.Controller.schedule`) and chooses widths of at least
    ``min_bits``."""
    if method == "pyg":
        return model, {}
    if method.startswith("uniform"):  # every tensor at these bits, GAT's attention included
        bits = int(method[7:])
        return gnnact.convert(model, gnnact.Config(bits=bits, attention_bits=bits)), {}
    if method.startswith("gnnact"):
        return gnnact.convert(model, gnnact.Config(bits=int(method[6:]))), {}
    if method.startswith("pernode"):
        config = gnnact.Config(bits=int(method[7:]), per_node=True)
        return gnnact.convert(model, config), {}
    if method.startswith("adaptive"):
        bits = int(method[8:])
        gnnact.convert(model, gnnact.Config(bits=bits))
        widths = tuple(w for w in gnnact.adaptive.WIDTHS if w >= min_bits)
        controller = gnnact.Controller(model, avg_bits=bits, adapt_interval=adapt_interval,
                                       first_interval=first_interval,
                                       widths=widths)
        return model, {"before_step": lambda: controller.adapt(lambda: loss_of(model, data))}
    if method == "amp":
        return model, {"step_context": lambda: torch.autocast(device.type, dtype=torch.bfloat16)}
    if method == "checkpoint":
        return Checkpointed(model), {"measure_saved": False}
    if method == "save_on_cpu":
        pin = device.type == "cuda"
        return model, {"step_context": lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin),
                       "measure_saved": False}
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


def load_graph(name: str, nodes: int | None, seed: int, workdir: str, adj: str = "edge_index",
               features: str = "dense"):
    """The graph, with ``adj_t`` (a ``torch.sparse_csr`` tensor) in place of ``edge_index`` if
    ``adj == "csr"``, and ``x`` as a ``torch.sparse_csr`` tensor if ``features == "sparse"``."""
    if name.startswith("synthetic-"):
        data = synthetic_like(name.removeprefix("synthetic-"), num_nodes=nodes, seed=0)
    else:
        data = load_dataset(name, data_root(), seed=seed, workdir=workdir, download=False)
    return with_layout(data, adj=adj, features=features)


def summary(rows: list[dict]) -> str:
    """A markdown table of the rows, one line per (model, method)."""
    lines = ["| graph | model | method | test acc (%) | Δ vs pyg (pt) | saved context (MB) | "
             "vs pyg | step (ms) | vs pyg | peak step memory (MB) | vs pyg |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    ref = {(r["graph"], r["model"]): r for r in rows if r["method"] == "pyg"}

    def ratio(r: dict, key: str, invert: bool = False) -> str:
        base = ref.get((r["graph"], r["model"]), {}).get(key)
        if not base or not r.get(key):
            return "–"
        return f"{(base / r[key]) if invert else (r[key] / base):.2f}x"

    for r in rows:
        base = ref.get((r["graph"], r["model"]))
        delta = f"{r['acc_mean'] - base['acc_mean']:+.2f}" if base else "–"
        saved = f"{r['saved_bytes'] / 1e6:.1f}" if r["saved_bytes"] else "–"
        peak = f"{r['peak_bytes'] / 1e6:.1f}" if r["peak_bytes"] else "–"
        lines.append(f"| {r['graph']} | {r['model']} | {r['method']} | {r['acc_mean']:.2f} ± "
                     f"{r['acc_std']:.2f} | {delta} | {saved} | "
                     f"{ratio(r, 'saved_bytes', True)} | {r['epoch_ms']:.1f} | "
                     f"{ratio(r, 'epoch_ms')} | {peak} | {ratio(r, 'peak_bytes', True)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--graph", default="synthetic-arxiv",
                        help=f"synthetic-{{{','.join(SHAPES)}}} or a gnnact.data dataset name")
    parser.add_argument("--nodes", type=int, default=None, help="scale a synthetic graph")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--epochs", type=int, default=100)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--adj", choices=("edge_index", "csr"), default="edge_index",
                        help="the graph as edge_index, or as a torch.sparse_csr adj_t")
    parser.add_argument("--features", choices=("dense", "sparse"), default="dense",
                        help="the node features as a dense or a torch.sparse_csr tensor")
    parser.add_argument("--bn-momentum", type=float, default=0.1,
                        help="momentum of every BatchNorm's running statistics")
    parser.add_argument("--adapt-interval", type=int, default=ADAPT_INTERVAL,
                        help="the longest gap between an adaptive method's sensitivity "
                             "estimates, in steps")
    parser.add_argument("--first-interval", type=optional_int,
                        default=FIRST_INTERVAL,
                        help="the first gap, doubling up to --adapt-interval; 'none': every "
                             "--adapt-interval steps from the start")
    parser.add_argument("--min-bits", type=int, default=1,
                        help="the narrowest width an adaptive method may choose")
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"))
    parser.add_argument("--smoke", action="store_true",
                        help="a 1,500-node graph, 3 epochs, one seed; no results written")
    parser.add_argument("--out", type=Path, default=RESULTS / "suite.jsonl")
    parser.add_argument("--summary", type=Path, default=RESULTS / "suite.md")
    args = parser.parse_args(argv)
    if not 1 <= args.min_bits <= 8:
        parser.error(f"--min-bits must be in 1..8, got {args.min_bits}")
    if args.adj == "csr" and "amp" in args.methods and args.device.type == "cpu":
        parser.error("--methods amp needs --adj edge_index on the CPU: torch has no bfloat16 "
                     "sparse CSR product there")
    if args.smoke:
        args.nodes, args.epochs, args.seeds = 1_500, 3, args.seeds[:1]

    env = environment(args.device)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for model_name in args.models:
            runs: dict[str, list[RunResult]] = {m: [] for m in args.methods}
            for seed in args.seeds:
                data = load_graph(args.graph, args.nodes, seed, tmp, args.adj,
                                  args.features).to(args.device)
                classes = data.y.size(1) if data.y.dim() == 2 else int(data.y.max()) + 1
                for method in args.methods:
                    torch.manual_seed(seed)
                    base = build(model_name, data.num_features, classes).to(args.device)
                    for module in base.modules():
                        if isinstance(module, nn.modules.batchnorm._BatchNorm):
                            module.momentum = args.bn_momentum
                    model, kwargs = prepare(method, base, data, args.device,
                                            adapt_interval=args.adapt_interval,
                                            first_interval=args.first_interval,
                                            min_bits=args.min_bits)
                    run = train_full_batch(model, data, epochs=args.epochs, lr=args.lr,
                                           **kwargs)
                    runs[method].append(run)
                    print(f"{model_name:6s} {method:12s} seed {seed}  acc "
                          f"{100 * run.test_acc:6.2f}  step {run.epoch_ms:8.1f} ms", flush=True)
            new = []
            for method, results in runs.items():
                accs = [100 * r.test_acc for r in results]
                new.append({
                    "bench": "suite", **env, "graph": args.graph, "num_nodes": data.num_nodes,
                    "num_edges": data.num_edges, "adj": args.adj, "features": args.features,
                    # None where the model has no BatchNorm for the momentum to act on
                    "bn_momentum": args.bn_momentum if has_batchnorm(model_name) else None,
                    "adapt_interval": args.adapt_interval,
                    "first_interval": args.first_interval, "min_bits": args.min_bits,
                    "model": model_name,
                    "method": method,
                    "seeds": args.seeds, "epochs": args.epochs, "lr": args.lr, "test_acc": accs,
                    "acc_mean": statistics.mean(accs),
                    "acc_std": statistics.stdev(accs) if len(accs) > 1 else 0.0,
                    "saved_bytes": results[0].saved_bytes, "graph_cache_counted": True,
                    "epoch_ms": statistics.mean(r.epoch_ms for r in results),
                    "peak_bytes": None if results[0].peak_bytes is None
                    else max(r.peak_bytes or 0 for r in results),
                })
            rows += new
            if not args.smoke:  # each model's rows as soon as they exist
                append_rows(args.out, new)
    table = summary(rows)
    print(table)
    if not args.smoke:
        args.summary.write_text(f"Commit {env['commit']}, {env['device_name']}, torch "
                                f"{env['torch']}, {env['date']}\n\n{table}")
    print(f"{len(rows)} rows -> {args.out}" if not args.smoke else "smoke run: no rows written")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
