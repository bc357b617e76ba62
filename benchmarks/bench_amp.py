"""Mixed precision with and without compression: saved context and step time of PyG fp32, PyG
under ``torch.autocast`` (AMP), and both after :func:`gnnact.convert` at 2 bits.

One training step per configuration on an ogbn-arxiv-shaped synthetic graph (arxiv's degree,
128 features, 40 classes), scaled down by ``--nodes`` so that the CPU run takes a minute or
two. Per model (:mod:`gnnact.models`, 3 layers, hidden 256) and method:

- ``fp32``: PyG as written; ``fp32+2bit``: converted, ``Config(bits=2)``;
- ``amp``: PyG under ``torch.autocast(device, --amp-dtype)`` (bfloat16 on the CPU, float16 on
  a GPU by default); ``amp+2bit``: converted, under the same autocast.

Reported: ``saved_bytes`` (:func:`gnnact.memory.breakdown` after the forward pass: the context
plus gnnact's graph cache, counted, as ``bench_saved_bytes.py`` counts it; the model, the
features, labels and adjacency excluded), ``epoch_ms`` (median of ``--epochs`` steps: forward,
backward, Adam) and, on a GPU, ``peak_bytes`` (``max_memory_allocated`` over one step).

Usage::

    python benchmarks/bench_amp.py [--device cpu|cuda] [--models gcn sage gat gcnii]
        [--amp-dtype bfloat16|float16] [--nodes 10000] [--epochs 3] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish
from bench_train import run

import gnnact
from gnnact.data import SHAPES, synthetic_like
from gnnact.models import MODELS, build

#: method -> (autocast on, bits)
METHODS: dict[str, tuple[bool, int]] = {
    "fp32": (False, 32), "fp32+2bit": (False, 2), "amp": (True, 32), "amp+2bit": (True, 2),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=["gcn", "sage"])
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--amp-dtype", choices=("bfloat16", "float16"), default=None,
                        help="autocast dtype (default: bfloat16 on the CPU, float16 on a GPU)")
    parser.add_argument("--nodes", type=int, default=10_000,
                        help="nodes of the arxiv-shaped synthetic graph")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="2,000 nodes, 1 step, no results")
    parser.add_argument("--out", type=Path, default=RESULTS / "amp.jsonl")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if args.smoke:
        args.nodes, args.epochs, args.warmup = 2_000, 1, 0
    amp_name = args.amp_dtype or ("bfloat16" if device.type == "cpu" else "float16")
    amp_dtype = getattr(torch, amp_name)

    data = synthetic_like("arxiv", num_nodes=args.nodes).to(device)
    env = environment(device)
    rows = []
    for name in args.models:
        base: dict[str, dict] = {}
        for method in args.methods:
            amp, bits = METHODS[method]
            torch.manual_seed(0)
            model = build(name, data.num_features, SHAPES["arxiv"][3]).to(device)
            if bits < 32:
                gnnact.convert(model, gnnact.Config(bits=bits))

            def context(amp: bool = amp) -> contextlib.AbstractContextManager:
                return (torch.autocast(device.type, dtype=amp_dtype) if amp
                        else contextlib.nullcontext())

            result = run(model, data, device, args.epochs, args.warmup, context)
            if bits == 32:
                base["amp" if amp else "fp32"] = result
            row = {"bench": "amp", **env, "model": name, "method": method, "bits": bits,
                   "autocast": amp_name if amp else None, "graph": "synthetic-arxiv",
                   "num_nodes": data.num_nodes, "num_edges": data.num_edges,
                   "epochs_timed": args.epochs, **result}
            for ref in ("fp32", "amp"):
                if ref in base:
                    row[f"saved_ratio_vs_{ref}"] = round(
                        base[ref]["saved_bytes"] / result["saved_bytes"], 3)
                    row[f"time_vs_{ref}"] = round(result["epoch_ms"] / base[ref]["epoch_ms"], 3)
            rows.append(row)
            print(f"{name:6s} {method:10s} saved {result['saved_bytes'] / 2**20:8.2f} MiB "
                  f"(graph cache {result['graph_cache_bytes'] / 2**20:.2f}) "
                  f"{result['epoch_ms']:9.1f} ms")
            del model
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    raise SystemExit(main())
