"""``gnnact.plan`` over a sweep of budgets: the budget, the plan's estimate, the measured saved
context and the training step's time.

One model (default: :func:`gnnact.models.build`'s 3-layer GCN, hidden 256, BatchNorm, ReLU and
dropout 0.5) on an ogbn-arxiv-shaped synthetic graph scaled to ``--nodes``. The 100 % of the
sweep is the fp32 context: what plain PyTorch keeps for backward
(:func:`gnnact.memory.saved_bytes`, the inputs excluded). For each fraction of it, one row:
the plan's options, its estimate (``estimate_bytes``), the context it kept in a training
forward pass (``measured_bytes``: :meth:`gnnact.planner.Plan.saved_bytes`, the graph walk plus
the inputs checkpointing keeps), the margin the planner held back, the estimated added time,
the seconds ``gnnact.plan`` took, and the median seconds of one training step (forward +
backward) under the plan. A budget below the smallest achievable gives a row with
``infeasible`` and that smallest budget. A first row (``fraction`` null) times the plain step.

Usage::

    python benchmarks/bench_plan.py [--model gcn] [--style module] [--nodes 20000]
        [--fractions 1 0.5 0.3 0.2 0.15 0.1 0.05 0.02] [--repeats 5] [--threads 1] [--smoke]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish, median_time

import gnnact
from gnnact.data import synthetic_like
from gnnact.memory import saved_bytes
from gnnact.models import MODELS, STYLES, build
from gnnact.planner import InfeasibleBudget

FRACTIONS = (1.0, 0.5, 0.3, 0.2, 0.15, 0.1, 0.05, 0.02)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=MODELS, default="gcn")
    parser.add_argument("--style", choices=STYLES, default="module")
    parser.add_argument("--nodes", type=int, default=20_000)
    parser.add_argument("--fractions", type=float, nargs="+", default=list(FRACTIONS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: the machine is shared)")
    parser.add_argument("--smoke", action="store_true", help="a 2,000-node graph, no results")
    parser.add_argument("--out", type=Path, default=RESULTS / "plan.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device("cpu")

    data = synthetic_like("arxiv", num_nodes=2_000 if args.smoke else args.nodes)
    x, ei, y, mask = data.x, data.edge_index, data.y, data.train_mask
    torch.manual_seed(0)
    model = build(args.model, x.size(1), int(y.max()) + 1, style=args.style).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the step's work, not learning

    def loss_fn(out: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out[mask], y[mask])

    def step(hooks: gnnact.compress_saved_tensors | None = None) -> None:
        optimizer.zero_grad()
        if hooks is None:
            loss = loss_fn(model(x, ei))
        else:
            with hooks:
                loss = loss_fn(model(x, ei))
        loss.backward()
        optimizer.step()

    full = saved_bytes(loss_fn(model(x, ei)), exclude=[x, ei])
    base = {"bench": "plan", **environment("cpu"), "model": args.model, "style": args.style,
            "nodes": data.num_nodes, "edges": data.num_edges,
            "threads": torch.get_num_threads(), "fp32_bytes": full}
    plain_s = median_time(step, device, repeats=args.repeats)
    rows = [{**base, "fraction": None, "budget_bytes": None, "measured_bytes": full,
             "step_s": plain_s}]
    print(f"fp32 context {full / 2**20:.2f} MiB, plain step {plain_s:.3f} s", flush=True)
    for fraction in args.fractions:
        budget = int(fraction * full)
        start = time.perf_counter()
        try:
            plan = gnnact.plan(model, (x, ei), budget, loss_fn=loss_fn, skip=[x, ei])
        except InfeasibleBudget as error:
            rows.append({**base, "fraction": fraction, "budget_bytes": budget,
                         "infeasible": True, "smallest_bytes": int(error.smallest),
                         "smallest_fraction": error.smallest / full})
            print(f"{fraction:5.2f} infeasible: smallest {error.smallest / full:.3f} of fp32",
                  flush=True)
            continue
        plan_s = time.perf_counter() - start
        hooks = plan.apply()
        try:
            step_s = median_time(lambda hooks=hooks: step(hooks), device, repeats=args.repeats)
        finally:
            plan.remove()
        row = {**base, "fraction": fraction, "budget_bytes": budget, "infeasible": False,
               "estimate_bytes": plan.memory, "measured_bytes": plan.measured,
               "margin_bytes": plan.margin, "rest_bytes": plan.rest,
               "error": (plan.memory - plan.measured) / plan.measured,
               "options": {r["block"]: r["option"] for r in plan.table()},
               "estimated_extra_s": plan.extra_s, "plan_s": plan_s, "step_s": step_s}
        rows.append(row)
        print(f"{fraction:5.2f} budget {budget / 2**20:7.2f} MiB  estimate "
              f"{plan.memory / 2**20:7.2f}  measured {plan.measured / 2**20:7.2f}  "
              f"step {step_s:.3f} s  {sorted(set(row['options'].values()))}", flush=True)
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
