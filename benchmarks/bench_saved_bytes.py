"""Saved-context bytes of EXACT's model configurations: PyG fp32 against gnnact at 1/2/4/8 bits.

Device-independent (``gnnact.memory.breakdown`` walks the autograd graph), so it runs on the
CPU. One training-mode forward pass per configuration on an ogbn-arxiv-shaped synthetic graph
(169,343 nodes, ~1.17M undirected edges stored in both directions, 128 features, 40 classes),
or with ``--graph`` on a real one (``--adj``/``--features`` as in ``bench_suite.py``, whose
Table-3 rows ``table3.py`` restates with these); the loss is cross-entropy on the training
nodes. The input features, labels and edge index are
excluded from both sides (they stay resident whatever the model keeps); gnnact's graph cache is
counted, and reported as its own column. Each model in up to three styles (``--styles``):

- ``module``: :mod:`gnnact.models` as written, ReLU and dropout as modules;
- ``functional``: the same model written as PyG's examples write it (``F.relu``, ``F.dropout``);
- ``pyg``: PyG's own ``torch_geometric.nn.models`` (``GCN``, ``GraphSAGE``, ``GAT`` (also with
  ``v2=True``: GATv2Conv, which has no twin), ``GIN``; 3 layers, hidden 256 (GAT 3 heads x 128),
  BatchNorm, dropout 0.5).

Targets at 2 bits, functional style: GCN >= 16x, SAGE >= 20x, GAT >= 40x, GCNII >= 20x.

Usage::

    python benchmarks/bench_saved_bytes.py [--models gcn sage gat gcnii gin]
        [--styles module functional pyg] [--bits 1 2 4 8] [--adaptive 2 3 4]
        [--nodes 169343] [--graph dblp --adj csr --features sparse] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PYG_MODELS, RESULTS, environment, finish, pyg_model
from bench_suite import load_graph

import gnnact
from gnnact.data import SHAPES
from gnnact.memory import SavedBytes, breakdown
from gnnact.models import MODELS, STYLES, build
from gnnact.training import adjacency


def measure(model: torch.nn.Module, data, exclude: list) -> SavedBytes:
    model.train()
    torch.manual_seed(0)
    out = model(data.x, adjacency(data))
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    nbytes = breakdown(loss, exclude=exclude)
    del out, loss
    gc.collect()
    return nbytes


def measured_row(model: torch.nn.Module, data, exclude: list, fp32: int, env: dict,
                 name: str, label: str, **fields) -> dict:
    """Measure the converted ``model``, print one line, and return its result row (``fields``
    say how it was compressed)."""
    kept = measure(model, data, exclude)
    ratio = fp32 / kept.total
    print(f"{name:6s} {fields.get('style', ''):10s} {label}  {kept.total / 2**20:10.1f} MiB "
          f"(graph cache {kept.graph_cache / 2**20:.1f})  {ratio:6.2f}x")
    return {"bench": "saved_bytes", **env, "model": name, **fields,
            "num_nodes": data.num_nodes, "num_edges": data.num_edges,
            "num_features": data.num_features, "pyg_fp32_bytes": fp32,
            "gnnact_bytes": kept.total, "context_bytes": kept.context,
            "graph_cache_bytes": kept.graph_cache, "graph_cache_counted": True,
            "ratio": round(ratio, 3)}


def adaptive_rows(name: str, model: torch.nn.Module, data, exclude: list, fp32: int,
                  budgets: list[float], env: dict, style: str) -> list[dict]:
    """One :class:`gnnact.Controller` estimate, then its widths and the saved bytes at each
    average budget. :math:`c_l` is normalised by :math:`S(b_l)`, so it does not depend on the
    widths it was measured at; one estimate serves every budget (4 bits: noise well above fp32
    rounding, yet small enough for the gradient to respond linearly)."""
    gnnact.convert(model, gnnact.Config(bits=4))
    controller = gnnact.Controller(model, avg_bits=min(budgets))
    controller.estimate(lambda: F.cross_entropy(
        model(data.x, adjacency(data))[data.train_mask], data.y[data.train_mask]))
    print(f"{name:6s} estimate: {len(controller.tensors)} tensors, {controller.last_passes} "
          f"passes, {controller.last_cost_s:.0f} s")
    rows = []
    for avg in budgets:
        controller.avg_bits = float(avg)
        widths = controller.assign()
        rows.append(measured_row(model, data, exclude, fp32, env, name, f"adaptive {avg:g}",
                                 style=style, bits=None, adaptive_avg_bits=avg, widths=widths,
                                 estimate_passes=controller.last_passes,
                                 estimate_s=round(controller.last_cost_s, 2)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted({*MODELS, *PYG_MODELS}),
                        default=list(MODELS))
    parser.add_argument("--styles", nargs="+", choices=[*STYLES, "pyg"], default=["module"],
                        help="how the model is written (pyg: torch_geometric.nn.models; "
                             "models without a PyG class, or without a gnnact.models build, "
                             "are skipped in that style)")
    parser.add_argument("--bits", nargs="*", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--adaptive", nargs="*", type=float, default=[],
                        help="also these average budgets with gnnact.Controller (one "
                             "sensitivity estimate per model on this graph, then the widths "
                             "of each budget)")
    parser.add_argument("--nodes", type=int, default=SHAPES["arxiv"][0],
                        help="nodes of the synthetic graph")
    parser.add_argument("--graph", default="synthetic-arxiv",
                        help="synthetic-arxiv or a gnnact.data dataset name (from "
                             "$GNNACT_DATA or ../shared/datasets)")
    parser.add_argument("--adj", choices=("edge_index", "csr"), default="edge_index",
                        help="the graph as edge_index, or as a torch.sparse_csr adj_t")
    parser.add_argument("--features", choices=("dense", "sparse"), default="dense",
                        help="the node features as a dense or a torch.sparse_csr tensor")
    parser.add_argument("--smoke", action="store_true", help="a 2,000-node graph, no results")
    parser.add_argument("--out", type=Path, default=RESULTS / "saved_bytes.jsonl")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        data = load_graph(args.graph, 2_000 if args.smoke else args.nodes, 0, tmp, args.adj,
                          args.features)
    classes = int(data.y.max()) + 1
    exclude = [data.x, data.y, adjacency(data)]
    env = {**environment(torch.device("cpu")), "graph": args.graph, "adj": args.adj,
           "features": args.features}
    for name in args.models:
        for style in args.styles:
            if name not in (PYG_MODELS if style == "pyg" else MODELS):
                continue  # no such model in this style
            rows = []
            torch.manual_seed(0)
            model = (pyg_model(name, data.num_features, classes) if style == "pyg"
                     else build(name, data.num_features, classes, style=style))
            fp32 = measure(model, data, exclude).total
            print(f"{name:6s} {style:10s} PyG fp32 {fp32 / 2**20:10.1f} MiB")
            for bits in args.bits:
                config = gnnact.Config(bits=bits)
                gnnact.convert(model, config)
                rows.append(measured_row(model, data, exclude, fp32, env, name,
                                         f"{bits:2d} bits", style=style, bits=bits,
                                         attention_bits=config.attention))
            if args.adaptive:
                rows += adaptive_rows(name, model, data, exclude, fp32, args.adaptive, env,
                                      style)
            # Each model's rows are written as soon as they exist: one slow model (a GCNII
            # estimate on the full arxiv shape runs for an hour on a CPU) must not cost the
            # others.
            finish(args.out, rows, smoke=args.smoke)
            del model
            gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
