"""Convs without a twin, in models written as PyG's examples write them: a training step's peak
memory and the saved context, PyG fp32 against gnnact at 2 bits with the messages made whole
and in chunks (:mod:`gnnact.nn.chunked`).

The models (hidden 256 unless the example's own), each after one of PyG's examples:

- ``gin``: 3 ``GINConv`` layers, each with PyG's ``MLP`` (BatchNorm inside), ``x.relu()``
  between (``examples/mutag_gin.py``, node-level);
- ``graphconv``: 2 ``GraphConv`` layers and a linear head, ``F.relu``/``F.dropout``;
- ``cheb``: 2 ``ChebConv`` layers (K=2), ``F.dropout``/``F.relu`` (``citation/cheb.py``);
- ``tag``: 2 ``TAGConv`` layers (``tagcn.py``);
- ``transformer``: 2 ``TransformerConv`` layers, 4 heads, ``LayerNorm`` (UniMP's shape);
- ``agnn``: a linear map, 2 ``AGNNConv`` layers (attention from cosine similarity, the first
  with a fixed temperature), a linear head, ``F.dropout``/``F.relu`` (``citation/agnn.py``,
  hidden 256 for this shape where the example has 16);
- ``deepergcn``: 7 ``DeepGCNLayer`` s of ``GENConv`` (softmax aggregation, learnable
  temperature) with ``LayerNorm``, ``res+`` blocks and 8 edge features
  (``ogbn_proteins_deepgcn.py``).

Methods: ``pyg`` (fp32), and gnnact at 2 bits with the messages made whole
(``gnnact2_whole``), in chunks (``gnnact2``), and in chunks with the integer tensors the model
saves (edge indices it makes itself) at their own width (``gnnact2_wide_index``,
``Config(compact_indices=False)``).

One training step (forward, cross-entropy on the training nodes, backward, Adam) after a
warmup step, on an arxiv-shaped synthetic graph (``--nodes``), measured by
:class:`gnnact.peak.PeakMeter` (the allocator's count on a GPU, counted per op on the CPU).
gnnact's graph cache is built by the warmup and counted on top (``graph_cache_bytes``). The
saved context is :func:`gnnact.memory.breakdown` of the first training forward pass;
``step_s`` the median time of ``--repeats`` further steps.

Usage::

    python benchmarks/bench_no_twin.py [--device cpu] [--models gin transformer]
        [--methods pyg gnnact2] [--nodes 20000] [--repeats 3] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch_geometric.nn as pyg_nn
from _common import RESULTS, environment, finish, median_time, out_of_memory, step_peak_bytes

import gnnact
from gnnact.data import SHAPES, synthetic_like
from gnnact.memory import breakdown
from gnnact.peak import PeakMeter

HIDDEN = 256
EDGE_FEATURES = 8
METHODS = ("pyg", "gnnact2_whole", "gnnact2_wide_index", "gnnact2")


class GIN(nn.Module):
    def __init__(self, f_in: int, classes: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            [pyg_nn.GINConv(pyg_nn.MLP([f_in if i == 0 else HIDDEN, HIDDEN, HIDDEN]))
             for i in range(3)])
        self.mlp = pyg_nn.MLP([HIDDEN, HIDDEN, classes], norm=None, dropout=0.5)

    def forward(self, x, edge_index, edge_attr=None):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.mlp(x)


class GraphConvNet(nn.Module):
    def __init__(self, f_in: int, classes: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = pyg_nn.GraphConv(f_in, HIDDEN), pyg_nn.GraphConv(HIDDEN, HIDDEN)
        self.lin = nn.Linear(HIDDEN, classes)

    def forward(self, x, edge_index, edge_attr=None):
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.conv2(x, edge_index))
        return self.lin(x)


class Cheb(nn.Module):
    def __init__(self, f_in: int, classes: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = pyg_nn.ChebConv(f_in, HIDDEN, K=2), pyg_nn.ChebConv(HIDDEN,
                                                                                   classes, K=2)

    def forward(self, x, edge_index, edge_attr=None):
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class TAG(nn.Module):
    def __init__(self, f_in: int, classes: int) -> None:
        super().__init__()
        self.conv1, self.conv2 = pyg_nn.TAGConv(f_in, HIDDEN), pyg_nn.TAGConv(HIDDEN, classes)

    def forward(self, x, edge_index, edge_attr=None):
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, training=self.training)
        return self.conv2(x, edge_index)


class Transformer(nn.Module):
    def __init__(self, f_in: int, classes: int) -> None:
        super().__init__()
        self.conv1 = pyg_nn.TransformerConv(f_in, HIDDEN // 4, heads=4)
        self.norm = nn.LayerNorm(HIDDEN)
        self.conv2 = pyg_nn.TransformerConv(HIDDEN, classes, heads=1, concat=False)

    def forward(self, x, edge_index, edge_attr=None):
        x = F.relu(self.norm(self.conv1(x, edge_index)))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class AGNN(nn.Module):
    def __init__(self, f_in: int, classes: int) -> None:
        super().__init__()
        self.lin1 = nn.Linear(f_in, HIDDEN)
        self.prop1 = pyg_nn.AGNNConv(requires_grad=False)
        self.prop2 = pyg_nn.AGNNConv(requires_grad=True)
        self.lin2 = nn.Linear(HIDDEN, classes)

    def forward(self, x, edge_index, edge_attr=None):
        x = F.dropout(x, training=self.training)
        x = F.relu(self.lin1(x))
        x = self.prop1(x, edge_index)
        x = self.prop2(x, edge_index)
        x = F.dropout(x, training=self.training)
        return self.lin2(x)


class DeeperGCN(nn.Module):
    def __init__(self, f_in: int, classes: int, layers: int = 7) -> None:
        super().__init__()
        self.node_encoder = nn.Linear(f_in, HIDDEN)
        self.edge_encoder = nn.Linear(EDGE_FEATURES, HIDDEN)
        self.layers = nn.ModuleList()
        for _ in range(layers):
            conv = pyg_nn.GENConv(HIDDEN, HIDDEN, aggr="softmax", t=1.0, learn_t=True,
                                  num_layers=2, norm="layer")
            self.layers.append(pyg_nn.DeepGCNLayer(conv, nn.LayerNorm(HIDDEN), nn.ReLU(),
                                                   block="res+", dropout=0.1))
        self.lin = nn.Linear(HIDDEN, classes)

    def forward(self, x, edge_index, edge_attr=None):
        x = self.node_encoder(x)
        edge_attr = self.edge_encoder(edge_attr)
        x = self.layers[0].conv(x, edge_index, edge_attr)
        for layer in self.layers[1:]:
            x = layer(x, edge_index, edge_attr)
        x = self.layers[0].act(self.layers[0].norm(x))
        x = F.dropout(x, p=0.1, training=self.training)
        return self.lin(x)


MODELS: dict[str, Callable[[int, int], nn.Module]] = {
    "gin": GIN, "graphconv": GraphConvNet, "cheb": Cheb, "tag": TAG,
    "transformer": Transformer, "agnn": AGNN, "deepergcn": DeeperGCN}


def measure(model: nn.Module, data, device: torch.device, repeats: int) -> dict:
    """The saved context of one training forward pass, the peak of one step after a warmup
    step, and the median time of ``repeats`` more steps."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    args = (data.x, data.edge_index, data.edge_attr)

    def loss() -> torch.Tensor:
        out = model(*args)
        return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])

    first = loss()
    saved = breakdown(first, exclude=[model, *args, data.y])
    first.backward()
    optimizer.step()
    del first
    gc.collect()
    optimizer.zero_grad(set_to_none=True)
    with PeakMeter(device) as meter:
        loss().backward()
        optimizer.step()

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss().backward()
        optimizer.step()

    return {"saved_bytes": saved.total, "graph_cache_bytes": saved.graph_cache,
            "peak_bytes": meter.peak_bytes,
            "step_s": median_time(step, device, repeats=repeats, warmup=0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=torch.device, default=torch.device("cpu"))
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS),
                        help="ratios are against pyg when it runs first")
    parser.add_argument("--repeats", type=int, default=3, help="timed steps per method")
    parser.add_argument("--out", type=Path, default=RESULTS / "no_twin.jsonl")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, no rows written")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.repeats = 1_000, 1
    data = synthetic_like("arxiv", num_nodes=args.nodes, seed=0)
    data.edge_attr = torch.randn(data.num_edges, EDGE_FEATURES,
                                 generator=torch.Generator().manual_seed(1))
    data = data.to(args.device)
    classes = SHAPES["arxiv"][3]
    env = environment(args.device)
    rows = []
    for name in args.models:
        base = None
        for method in args.methods:
            torch.manual_seed(0)
            model = MODELS[name](data.num_features, classes).to(args.device)
            if method != "pyg":
                gnnact.convert(model, gnnact.Config(
                    bits=2, chunk_messages=method != "gnnact2_whole",
                    compact_indices=method != "gnnact2_wide_index"))
            try:
                result = measure(model, data, args.device, args.repeats)
            except RuntimeError as error:  # OutOfMemoryError is one
                if not out_of_memory(error):
                    raise
                result = {"oom": True, "saved_bytes": None, "graph_cache_bytes": None,
                          "peak_bytes": None}
            row = {"bench": "no_twin", **env, "model": name, "method": method,
                   "num_nodes": data.num_nodes, "num_edges": data.num_edges, **result}
            if method == "pyg":
                base = row
            elif base is not None and not base.get("oom") and not row.get("oom"):
                row["peak_ratio_vs_pyg"] = round(step_peak_bytes(base) / step_peak_bytes(row), 2)
                row["saved_ratio_vs_pyg"] = round(base["saved_bytes"] / row["saved_bytes"], 2)
            print(f"{name:12s} {method:18s} " + ("out of memory" if row.get("oom") else
                  f"peak {step_peak_bytes(row) / 2**20:9.1f} MiB  "
                  f"saved {row['saved_bytes'] / 2**20:8.1f} MiB  "
                  f"step {row['step_s']:.3f} s"), flush=True)
            rows.append(row)
            del model
            gc.collect()
            if args.device.type == "cuda":
                torch.cuda.empty_cache()
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
