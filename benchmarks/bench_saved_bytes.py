"""Saved-context bytes of EXACT's model configurations: PyG fp32 against gnnact at 1/2/4/8 bits.

Device-independent (``gnnact.memory.saved_bytes`` walks the autograd graph), so it runs on the
CPU. One training-mode forward pass per configuration on an ogbn-arxiv-shaped synthetic graph
(169,343 nodes, ~1.17M undirected edges stored in both directions, 128 features, 40 classes);
the loss is cross-entropy on the training nodes. The input features, labels and edge index are
excluded from both sides (they stay resident whatever the model keeps). Targets at 2 bits
(DESIGN.md §5): GCN/SAGE >= 24x, GAT >= 10x, GCNII >= 16x.

Usage::

    python benchmarks/bench_saved_bytes.py [--models gcn sage gat gcnii] [--bits 1 2 4 8]
        [--adaptive 2 3 4] [--nodes 169343] [--smoke]
"""

from __future__ import annotations

import argparse
import gc
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish

import gnnact
from gnnact.data import SHAPES, synthetic_like
from gnnact.memory import saved_bytes
from gnnact.models import MODELS, build


def measure(model: torch.nn.Module, data, exclude: list) -> int:
    model.train()
    torch.manual_seed(0)
    out = model(data.x, data.edge_index)
    loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    nbytes = saved_bytes(loss, exclude=exclude)
    del out, loss
    gc.collect()
    return nbytes


def measured_row(model: torch.nn.Module, data, exclude: list, fp32: int, env: dict,
                 name: str, label: str, **fields) -> dict:
    """Measure the converted ``model``, print one line, and return its result row (``fields``
    say how it was compressed)."""
    packed = measure(model, data, exclude)
    ratio = fp32 / packed
    print(f"{name:6s} {label}  {packed / 2**20:10.1f} MiB  {ratio:6.2f}x")
    return {"bench": "saved_bytes", **env, "model": name, **fields,
            "num_nodes": data.num_nodes, "num_edges": data.num_edges,
            "num_features": data.num_features, "pyg_fp32_bytes": fp32,
            "gnnact_bytes": packed, "ratio": round(ratio, 3)}


def adaptive_rows(name: str, model: torch.nn.Module, data, exclude: list, fp32: int,
                  budgets: list[float], env: dict) -> list[dict]:
    """One :class:`gnnact.Controller` estimate, then its widths and the saved bytes at each
    average budget. :math:`c_l` is normalised by :math:`S(b_l)`, so it does not depend on the
    widths it was measured at; one estimate serves every budget (4 bits: noise well above fp32
    rounding, yet small enough for the gradient to respond linearly)."""
    gnnact.convert(model, gnnact.Config(bits=4))
    controller = gnnact.Controller(model, avg_bits=min(budgets))
    controller.estimate(lambda: F.cross_entropy(
        model(data.x, data.edge_index)[data.train_mask], data.y[data.train_mask]))
    print(f"{name:6s} estimate: {len(controller.tensors)} tensors, {controller.last_passes} "
          f"passes, {controller.last_cost_s:.0f} s")
    rows = []
    for avg in budgets:
        controller.avg_bits = float(avg)
        widths = controller.assign()
        rows.append(measured_row(model, data, exclude, fp32, env, name, f"adaptive {avg:g}",
                                 bits=None, adaptive_avg_bits=avg, widths=widths,
                                 estimate_passes=controller.last_passes,
                                 estimate_s=round(controller.last_cost_s, 2)))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--bits", nargs="*", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--adaptive", nargs="*", type=float, default=[],
                        help="also these average budgets with gnnact.Controller (one "
                             "sensitivity estimate per model on this graph, then the widths "
                             "of each budget)")
    parser.add_argument("--nodes", type=int, default=SHAPES["arxiv"][0])
    parser.add_argument("--smoke", action="store_true", help="a 2,000-node graph, no results")
    parser.add_argument("--out", type=Path, default=RESULTS / "saved_bytes.jsonl")
    args = parser.parse_args(argv)

    data = synthetic_like("arxiv", num_nodes=2_000 if args.smoke else args.nodes)
    classes = SHAPES["arxiv"][3]
    exclude = [data.x, data.y, data.edge_index]
    env = environment(torch.device("cpu"))
    for name in args.models:
        rows = []
        torch.manual_seed(0)
        model = build(name, data.num_features, classes)
        fp32 = measure(model, data, exclude)
        print(f"{name:6s} PyG fp32 {fp32 / 2**20:10.1f} MiB")
        for bits in args.bits:
            config = gnnact.Config(bits=bits)
            gnnact.convert(model, config)
            rows.append(measured_row(model, data, exclude, fp32, env, name, f"{bits:2d} bits",
                                     bits=bits, attention_bits=config.attention))
        if args.adaptive:
            rows += adaptive_rows(name, model, data, exclude, fp32, args.adaptive, env)
        # Each model's rows are written as soon as they exist: one slow model (a GCNII
        # estimate on the full arxiv shape runs for an hour on a CPU) must not cost the others.
        finish(args.out, rows, smoke=args.smoke)
        del model
        gc.collect()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
