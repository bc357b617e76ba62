"""Message passing in pieces against whole, by message size: the price that sets
``gnnact.nn.chunked.MIN_MESSAGE_BYTES``.

A PyG ``GINConv`` (64 features, 8 edges a node: 8 column pieces when chunked) steps forward and
backward whole and in pieces, taking turns, on graphs whose messages grow from about 1 to 62
MiB. Each row gives both medians and their ratio; the step peak of each (``PeakMeter``) shows
what the pieces save.

Usage::

    python benchmarks/bench_chunks.py [--device cpu|cuda] [--rounds R] [--smoke]

Rows are appended to ``benchmarks/results/chunks.jsonl`` (or ``--out``).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch
from torch_geometric.nn import GINConv

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish, median_time

from gnnact.nn import chunked
from gnnact.peak import PeakMeter

FEATURES, DEGREE = 64, 8


def _step(conv: torch.nn.Module, x: torch.Tensor, edge_index: torch.Tensor) -> None:
    conv(x, edge_index).sum().backward()


def bench(nodes: int, device: torch.device, rounds: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, FEATURES, generator=gen).to(device).requires_grad_()
    edge_index = torch.randint(0, nodes, (2, DEGREE * nodes), generator=gen).to(device)
    whole = GINConv(torch.nn.Linear(FEATURES, FEATURES)).to(device)
    pieces = copy.deepcopy(whole)
    chunked.chunk_messages(pieces)
    pieces.propagate.min_bytes = 0  # in pieces at every size
    times: dict[str, list[float]] = {"whole": [], "pieces": []}
    peaks = {}
    for name, conv in (("whole", whole), ("pieces", pieces)):
        _step(conv, x, edge_index)  # (warm up)
        with PeakMeter(device) as meter:
            _step(conv, x, edge_index)
        peaks[name] = meter.peak_bytes
    for _ in range(rounds):
        for name, conv in (("whole", whole), ("pieces", pieces)):
            times[name].append(median_time(lambda c=conv: _step(c, x, edge_index), device,
                                           repeats=1, warmup=0))
    w, p = statistics.median(times["whole"]), statistics.median(times["pieces"])
    messages = edge_index.size(1) * FEATURES * 4
    return {"bench": "chunks", **environment(device), "conv": "GINConv", "nodes": nodes,
            "edges": edge_index.size(1), "features": FEATURES,
            "message_mib": round(messages / 2**20, 2), "pieces": pieces.propagate.last_chunks,
            "whole_ms": round(1e3 * w, 3), "pieces_ms": round(1e3 * p, 3),
            "pieces_over_whole": round(p / w, 3),
            "whole_peak_mib": round(peaks["whole"] / 2**20, 2),
            "pieces_peak_mib": round(peaks["pieces"] / 2**20, 2)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--smoke", action="store_true", help="one small graph, no result file")
    parser.add_argument("--out", type=Path, default=RESULTS / "chunks.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sizes = [500] if args.smoke else [500, 2000, 8000, 32000]
    rows = []
    for nodes in sizes:
        row = bench(nodes, device, 2 if args.smoke else args.rounds)
        rows.append(row)
        print(f"{row['message_mib']:8.2f} MiB  whole {row['whole_ms']:9.2f} ms  "
              f"{row['pieces']} pieces {row['pieces_ms']:9.2f} ms  ({row['pieces_over_whole']}x)  "
              f"peak {row['whole_peak_mib']} -> {row['pieces_peak_mib']} MiB", flush=True)
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
