"""Full-batch training step: epoch time and memory of PyG fp32 against gnnact, side by side.

For each model, one process trains the plain PyG model and the same model after
:func:`gnnact.convert` at each bit width, on an ogbn-arxiv-shaped synthetic graph (or
``--nodes``). Per configuration it reports, after ``--warmup`` steps:

- ``epoch_ms``: median of ``--epochs`` training steps (forward, backward, optimizer), timed
  with CUDA events on a GPU and ``perf_counter`` on the CPU;
- ``kept_bytes`` (GPU): ``memory_allocated`` after forward minus before, minus the output;
- ``peak_bytes`` (GPU): ``max_memory_allocated`` over one step, from a reset (gnnact's graph
  cache, built by the warmup, is outside it; ``peak_ratio_vs_pyg`` adds it back);
- ``saved_bytes``: the device-independent graph walk (:func:`gnnact.memory.breakdown`), with
  ``context_bytes`` and ``graph_cache_bytes`` (gnnact's cached graph structure) its parts.

Target on a GPU (DESIGN.md §5): gnnact's epoch time within +10 % of PyG fp32.

Usage::

    python benchmarks/bench_train.py [--device cuda] [--models gcn sage gat gcnii]
        [--bits 2 4] [--shape arxiv|products|reddit] [--nodes N] [--smoke]

A configuration that runs out of GPU memory gets a row with ``"oom": true`` (on the
products-shaped graph, PyG fp32 is expected to); ratios then refer to the first one that fit.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish, median_time, out_of_memory, step_peak_bytes

import gnnact
from gnnact.data import SHAPES, synthetic_like
from gnnact.memory import breakdown
from gnnact.models import MODELS, build
from gnnact.training import adjacency, loss_of


def run(model: torch.nn.Module, data, device: torch.device, epochs: int, warmup: int,
        context: Callable[[], AbstractContextManager] = contextlib.nullcontext) -> dict:
    """One configuration: the bytes its forward pass keeps (graph walk, the graph cache as its
    own line), on a GPU the memory kept after forward and the step's peak, and the median
    step; every forward runs under ``context()`` (autocast, say)."""
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    cuda = device.type == "cuda"

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with context():
            loss = loss_of(model, data)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    result: dict = {}
    # Memory: one instrumented step.
    opt.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
    with context():
        out = model(data.x, adjacency(data))
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
    if cuda:
        torch.cuda.synchronize(device)
        result["kept_bytes"] = (torch.cuda.memory_allocated(device) - before
                                - out.numel() * out.element_size())
    kept = breakdown(loss, exclude=[model, data.x, data.y, adjacency(data)])
    result |= {"saved_bytes": kept.total, "context_bytes": kept.context,
               "graph_cache_bytes": kept.graph_cache, "graph_cache_counted": True}
    del out
    loss.backward()
    opt.step()
    if cuda:
        torch.cuda.synchronize(device)
        result["peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
    del loss
    # Time: median step.
    result["epoch_ms"] = 1e3 * median_time(step, device, repeats=epochs, warmup=0)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["gcn", "sage"])
    parser.add_argument("--bits", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--shape", choices=list(SHAPES), default="arxiv",
                        help="synthetic graph with this dataset's shape")
    parser.add_argument("--nodes", type=int, default=None, help="default: the shape's")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="2,000 nodes, 2 steps, no results")
    parser.add_argument("--out", type=Path, default=RESULTS / "train.jsonl")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.smoke:
        args.nodes, args.epochs, args.warmup = 2_000, 2, 1

    data = synthetic_like(args.shape, num_nodes=args.nodes).to(device)
    classes = SHAPES[args.shape][3]
    env = environment(device)
    rows = []
    for name in args.models:
        base = None
        for bits in [32, *args.bits]:
            torch.manual_seed(0)
            model = build(name, data.num_features, classes).to(device)
            if bits < 32:
                gnnact.convert(model, gnnact.Config(bits=bits))
            row = {"bench": "train_step", **env, "model": name, "bits": bits,
                   "impl": "pyg" if bits == 32 else "gnnact", "graph": args.shape,
                   "num_nodes": data.num_nodes, "num_edges": data.num_edges,
                   "epochs_timed": args.epochs}
            try:
                result = run(model, data, device, args.epochs, args.warmup)
            except RuntimeError as error:  # OutOfMemoryError is one
                if not out_of_memory(error):
                    raise
                # The point of the benchmark on big graphs: record that it does not fit.
                rows.append({**row, "oom": True})
                print(f"{name:6s} {row['impl']:6s} {bits:2d} bits: out of memory")
                del model
                gc.collect()
                torch.cuda.empty_cache()
                continue
            base = base or result
            row.update(result, oom=False)
            row["time_vs_pyg"] = result["epoch_ms"] / base["epoch_ms"]
            row["saved_ratio_vs_pyg"] = base["saved_bytes"] / result["saved_bytes"]
            if "peak_bytes" in result:  # gnnact's graph cache counted
                row["peak_ratio_vs_pyg"] = step_peak_bytes(base) / step_peak_bytes(result)
            rows.append(row)
            mem = (f" kept {result['kept_bytes'] / 2**20:8.1f} MiB peak "
                   f"{result['peak_bytes'] / 2**20:8.1f} MiB" if "peak_bytes" in result else "")
            print(f"{name:6s} {row['impl']:6s} {bits:2d} bits {result['epoch_ms']:9.2f} ms "
                  f"({row['time_vs_pyg']:.2f}x) saved {result['saved_bytes'] / 2**20:8.1f} MiB"
                  + mem)
            del model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
