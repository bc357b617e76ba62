"""Swap and prefetch on a GNN (GACT Table 5): fp32 + ``save_on_cpu`` against compressed swap,
with and without prefetch, side by side in one run.

SAGE 3x256 (or ``--model``, e.g. GCNII's 16 layers, whose saved context is large next to one
layer's backward temporaries) on an ogbn-arxiv-shaped synthetic graph (or
``--shape``/``--nodes``), full batch. Methods:

- ``pyg``: PyG fp32, context kept on the GPU (the reference);
- ``pyg_save_on_cpu``: PyG fp32 with ``torch.autograd.graph.save_on_cpu(pin_memory=True)``;
- ``gnnact2``: converted, 2 bits, kept on the GPU;
- ``gnnact2_swap``: 2 bits, offloaded to pinned host memory, copied back on demand
  (``prefetch_depth=0``);
- ``gnnact2_swap_prefetch``: the same with one item prefetched ahead (``prefetch_depth=1``).

Per method: median step time (CUDA events, after warm-up), peak step memory and what stays
allocated after forward. Derived, in the ``summary`` row: compressed swap's speed-up over fp32
swap (target >= 2.5x) and the share of copy time prefetch hides,
``1 - (t_prefetch - t_kept) / (t_swap - t_kept)`` (target >= 80 %). Since the copies overlap
queued compute even without prefetch, the row also gives the time of the copies themselves
(``copy_ms``: one step's offloaded bytes out to pinned memory and back, alone on the GPU) and
the share of it that stays hidden, ``1 - (t_swap - t_kept) / copy_ms``, with and without
prefetch.

Usage::

    python benchmarks/bench_swap.py --device cuda [--model sage] [--shape arxiv] [--nodes N]
        [--epochs 20]
    python benchmarks/bench_swap.py --smoke          # CPU, tiny graph: offload is a no-op
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish, median_time, out_of_memory

import gnnact
from gnnact.data import SHAPES, synthetic_like
from gnnact.models import MODELS, build

METHODS = ("pyg", "pyg_save_on_cpu", "gnnact2", "gnnact2_swap", "gnnact2_swap_prefetch")


def prepare(method: str, data, classes: int, device: torch.device, model_name: str = "sage"
            ) -> tuple[torch.nn.Module, Callable[[], contextlib.AbstractContextManager]]:
    """The model of ``method`` and the context its forward passes run in."""
    torch.manual_seed(0)
    model = build(model_name, data.num_features, classes).to(device)
    if method == "pyg":
        return model, contextlib.nullcontext
    if method == "pyg_save_on_cpu":
        pin = device.type == "cuda"
        return model, lambda: torch.autograd.graph.save_on_cpu(pin_memory=pin)
    gnnact.convert(model, gnnact.Config(bits=2))
    if method == "gnnact2":
        return model, contextlib.nullcontext
    depth = 1 if method.endswith("prefetch") else 0
    hooks = gnnact.compress_saved_tensors(
        gnnact.Config(bits=2, offload=True, prefetch_depth=depth), model=model,
        skip=[data.x, data.edge_index])
    return model, lambda: hooks


def measure(model, context, data, device: torch.device, epochs: int, warmup: int) -> dict:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    cuda = device.type == "cuda"

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        with context():
            out = model(data.x, data.edge_index)
            loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        optimizer.step()

    for _ in range(warmup):
        step()
    result: dict = {}
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        optimizer.zero_grad(set_to_none=True)
        with context():
            out = model(data.x, data.edge_index)
            loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        torch.cuda.synchronize(device)
        result["kept_bytes"] = (torch.cuda.memory_allocated(device) - before
                                - out.numel() * out.element_size())
        del out
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize(device)
        result["peak_bytes"] = torch.cuda.max_memory_allocated(device) - before
        del loss
    result["epoch_ms"] = 1e3 * median_time(step, device, repeats=epochs, warmup=0)
    return result


def copy_ms(nbytes: int, device: torch.device) -> float:
    """Milliseconds to copy ``nbytes`` to pinned host memory and back, alone on the GPU."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def round_trip() -> None:
        host.copy_(dev, non_blocking=True)
        dev.copy_(host, non_blocking=True)

    return 1e3 * median_time(round_trip, device, repeats=20)


def summarize(results: dict[str, dict], copy: float | None = None) -> dict:
    """Compressed swap's speed-up over fp32 swap, the share of copy time prefetch hides, and
    (given ``copy``, the copies' own milliseconds) the share of it hidden at all."""
    t = {m: r["epoch_ms"] for m, r in results.items()}
    row: dict = {}
    if "pyg_save_on_cpu" in t and "gnnact2_swap_prefetch" in t:
        row["swap_speedup_vs_fp32_swap"] = t["pyg_save_on_cpu"] / t["gnnact2_swap_prefetch"]
    if {"gnnact2", "gnnact2_swap", "gnnact2_swap_prefetch"} <= t.keys():
        exposed = t["gnnact2_swap"] - t["gnnact2"]
        row["copy_ms_exposed_without_prefetch"] = exposed
        row["copy_ms_exposed_with_prefetch"] = t["gnnact2_swap_prefetch"] - t["gnnact2"]
        row["prefetch_hidden_share"] = (
            1 - row["copy_ms_exposed_with_prefetch"] / exposed if exposed > 0 else None)
        if copy:
            row["copy_ms"] = copy
            row["copy_hidden_share_without_prefetch"] = 1 - exposed / copy
            row["copy_hidden_share_with_prefetch"] = (
                1 - row["copy_ms_exposed_with_prefetch"] / copy)
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=torch.device, default=torch.device(
        "cuda" if torch.cuda.is_available() else "cpu"))
    parser.add_argument("--model", choices=MODELS, default="sage")
    parser.add_argument("--shape", choices=list(SHAPES), default="arxiv")
    parser.add_argument("--nodes", type=int, default=None)
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="2,000 nodes, 2 steps, no rows")
    parser.add_argument("--out", type=Path, default=RESULTS / "swap.jsonl")
    args = parser.parse_args(argv)
    if args.smoke:
        args.nodes, args.epochs, args.warmup = 2_000, 2, 1
    elif args.device.type != "cuda":
        parser.error("swap needs a CUDA device (on the CPU offloading is a no-op); use --smoke")
    data = synthetic_like(args.shape, num_nodes=args.nodes).to(args.device)
    classes = SHAPES[args.shape][3]
    env = environment(args.device)
    rows, results = [], {}
    offloaded = 0
    for method in args.methods:
        model, context = prepare(method, data, classes, args.device, args.model)
        row = {"bench": "swap", **env, "model": args.model, "method": method, "graph": args.shape,
               "num_nodes": data.num_nodes, "num_edges": data.num_edges,
               "epochs_timed": args.epochs}
        try:
            results[method] = measure(model, context, data, args.device, args.epochs,
                                      args.warmup)
            row.update(results[method], oom=False)
            hooks = context()
            if getattr(hooks, "offloaded_bytes", 0):
                # every step offloads the same: warm-up, the instrumented step, the timed ones
                row["offloaded_bytes"] = hooks.offloaded_bytes // (args.warmup + 1 + args.epochs)
                offloaded = row["offloaded_bytes"]
        except RuntimeError as error:  # OutOfMemoryError is one
            if not out_of_memory(error):
                raise
            row["oom"] = True
        rows.append(row)
        peak = row.get("peak_bytes")
        print(f"{method:24s} " + ("out of memory" if row["oom"] else
              f"{row['epoch_ms']:9.2f} ms" + (f"  peak {peak / 2**20:9.1f} MiB" if peak else "")),
              flush=True)
        del model, context
        gc.collect()
        if args.device.type == "cuda":
            torch.cuda.empty_cache()
    summary = summarize(results, copy_ms(offloaded, args.device)
                        if offloaded and args.device.type == "cuda" else None)
    rows.append({"bench": "swap", **env, "model": args.model, "method": "summary",
                 "graph": args.shape,
                 "num_nodes": data.num_nodes, **summary})
    print(summary)
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
