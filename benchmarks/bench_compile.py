"""Training step time under ``torch.compile``: gnnact at 2 bits against PyG fp32, eager and
compiled, with the graph breaks of each.

For each model (gnnact's ``build``, module style) and each variant

* ``pyg``: the PyG model, fp32, eager;
* ``pyg_compiled``: the same under ``torch.compile(backend=...)``;
* ``gnnact2``: ``gnnact.convert(model, Config(bits=2))``, eager;
* ``gnnact2_compiled``: the same under ``torch.compile``: gnnact's ops run as opaque eager calls
  (:func:`gnnact.ops.state.eager_op`), the code between them is compiled;

one row with the median seconds of one training step (forward, cross-entropy on the training
nodes, backward, Adam step), the seconds of the first step (with compilation; less when torch's
on-disk compile caches already hold the graphs), and the graph count and graph breaks
``torch._dynamo.explain`` reports for one training forward pass. The graph is
:func:`gnnact.data.synthetic_graph` (homophilous, random features).

Usage::

    python benchmarks/bench_compile.py [--device cpu] [--models gcn sage] [--nodes 20000]
        [--degree 10] [--features 128] [--hidden 128] [--backend inductor] [--repeats 5]
        [--smoke]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish, median_time

import gnnact
from gnnact.data import synthetic_graph
from gnnact.models import MODELS, build

VARIANTS = ("pyg", "pyg_compiled", "gnnact2", "gnnact2_compiled")


def _step_fn(model: nn.Module, run: nn.Module, data) -> Callable[[], torch.Tensor]:
    opt = torch.optim.Adam(model.parameters(), lr=0.01)

    def step() -> torch.Tensor:
        opt.zero_grad(set_to_none=True)
        out = run(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        return loss.detach()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_variant(name: str, variant: str, data, args, device: torch.device) -> dict:
    torch.manual_seed(0)
    model = build(name, data.num_features, int(data.y.max()) + 1, hidden=args.hidden,
                  layers=args.layers, heads=args.heads, dropout=0.5).to(device).train()
    if variant.startswith("gnnact2"):
        model = gnnact.convert(model, gnnact.Config(bits=2))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(copy.deepcopy(model))(data.x, data.edge_index)
    torch._dynamo.reset()
    compiled = variant.endswith("_compiled")
    run = torch.compile(model, backend=args.backend) if compiled else model
    step = _step_fn(model, run, data)
    t0 = time.perf_counter()
    step()
    _sync(device)
    first = time.perf_counter() - t0
    seconds = median_time(step, device, repeats=args.repeats, warmup=2)
    return {"model": name, "variant": variant, "bits": 2 if "gnnact2" in variant else 32,
            "compiled": compiled, "backend": args.backend if compiled else None,
            "step_seconds": seconds, "first_step_seconds": first,
            "graph_count": explained.graph_count,
            "graph_break_count": explained.graph_break_count,
            "break_reasons": sorted({str(r.reason).splitlines()[0][:120]
                                     for r in explained.break_reasons})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["gcn", "sage"])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--degree", type=float, default=10.0)
    parser.add_argument("--features", type=int, default=128)
    parser.add_argument("--classes", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--heads", type=int, default=3)
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's)")
    parser.add_argument("--smoke", action="store_true", help="a 500-node graph, no results")
    parser.add_argument("--out", type=Path, default=RESULTS / "compile.jsonl")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    nodes = 500 if args.smoke else args.nodes
    data = synthetic_graph(nodes, args.degree, args.features, args.classes, seed=0).to(device)
    env = environment(device)
    rows = []
    for name in args.models:
        for variant in args.variants:
            row = {"bench": "compile", **env, "nodes": nodes, "edges": data.num_edges,
                   "features": args.features, "hidden": args.hidden,
                   "threads": torch.get_num_threads(),
                   **run_variant(name, variant, data, args, device)}
            rows.append(row)
            print(f"{name:6s} {variant:17s} {row['step_seconds'] * 1e3:9.2f} ms/step "
                  f"(first {row['first_step_seconds']:.1f} s)  graphs {row['graph_count']} "
                  f"breaks {row['graph_break_count']}", flush=True)
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
