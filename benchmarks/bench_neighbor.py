"""Mini-batch training with PyG's ``NeighborLoader``: saved context per batch, PyG fp32 against
the same model after :func:`gnnact.convert`.

One training step per batch of ``--batches`` batches, on an arxiv-shaped synthetic graph scaled
to ``--nodes`` (the model: ``gnnact.models.build``, 3 layers with BatchNorm, ReLU and dropout,
one sampled neighbourhood per layer). Per configuration the row has the mean and largest saved
context of a batch (:func:`gnnact.memory.breakdown`: gnnact's graph cache of the batch's
adjacency counted, the batch's features, labels and edge index not) and the mean step time.
Both configurations see the same batches (same loader seed).

Needs a sampling backend: pyg-lib, or torch-sparse (the ``sparse`` extra).

Usage::

    python benchmarks/bench_neighbor.py [--models gcn sage] [--bits 2 4] [--nodes 20000]
        [--batch-size 1024] [--fanout 10 10 10] [--batches 5] [--smoke]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish
from torch_geometric.loader import NeighborLoader

import gnnact
from gnnact.data import synthetic_like
from gnnact.memory import breakdown
from gnnact.models import MODELS, build
from gnnact.training import loss_of


def run(model: torch.nn.Module, loader: NeighborLoader, batches: int) -> dict:
    """Saved context and time of one training step per batch, over the first ``batches``."""
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    kept, seconds = [], []
    for i, batch in enumerate(loader):
        if i == batches:
            break
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        loss = loss_of(model, batch)
        pause = time.perf_counter()
        kept.append(breakdown(loss, exclude=[model, batch.x, batch.y, batch.edge_index]).total)
        start += time.perf_counter() - pause
        loss.backward()
        optimizer.step()
        seconds.append(time.perf_counter() - start)
    return {"batches": len(kept), "saved_bytes_mean": statistics.mean(kept),
            "saved_bytes_max": max(kept), "step_ms": 1e3 * statistics.mean(seconds)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["gcn", "sage"])
    parser.add_argument("--bits", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--nodes", type=int, default=20_000, help="nodes of the graph")
    parser.add_argument("--batch-size", type=int, default=1024, help="seed nodes per batch")
    parser.add_argument("--fanout", nargs="+", type=int, default=[10, 10, 10],
                        help="neighbours sampled per layer")
    parser.add_argument("--batches", type=int, default=5, help="batches measured")
    parser.add_argument("--out", type=Path, default=RESULTS / "neighbor.jsonl")
    parser.add_argument("--smoke", action="store_true", help="a tiny run, no rows written")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.batch_size, args.batches, args.fanout = 2_000, 128, 2, [5, 5, 5]
    data = synthetic_like("arxiv", num_nodes=args.nodes, seed=0)
    env = environment("cpu")
    rows = []
    for name in args.models:
        ref = None
        for bits in [32, *args.bits]:
            torch.manual_seed(0)
            model = build(name, data.num_features, int(data.y.max()) + 1,
                          layers=len(args.fanout))
            if bits < 32:
                gnnact.convert(model, gnnact.Config(bits=bits))
            loader = NeighborLoader(data, num_neighbors=args.fanout,
                                    batch_size=args.batch_size, input_nodes=data.train_mask,
                                    shuffle=True, generator=torch.Generator().manual_seed(0))
            result = run(model, loader, args.batches)
            ref = ref or result
            rows.append({"bench": "neighbor", **env, "model": name, "bits": bits,
                         "impl": "pyg" if bits == 32 else "gnnact", "num_nodes": args.nodes,
                         "batch_size": args.batch_size, "fanout": args.fanout, **result,
                         "graph_cache_counted": True,
                         "saved_ratio_vs_pyg": ref["saved_bytes_mean"]
                         / result["saved_bytes_mean"]})
            print(f"{name:5s} {bits:2d} bits: {result['saved_bytes_mean'] / 2**20:8.2f} MiB per "
                  f"batch ({rows[-1]['saved_ratio_vs_pyg']:.1f}x less), "
                  f"{result['step_ms']:.0f} ms per step")
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
