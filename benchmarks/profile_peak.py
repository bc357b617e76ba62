"""Where a training step's peak memory goes: the allocations alive at the peak, by source line.

One full-batch step (forward, backward, optimizer) of each model, after ``--warmup`` steps, under
PyTorch's allocator history (``torch.cuda.memory._record_memory_history``). Replaying the
recorded allocations and frees gives the peak above what was allocated before the step (model,
optimizer state, graph) and what was alive then, grouped by the innermost frame in gnnact, PyG
or this folder. Swap only lowers a peak made of saved context, so this says what a lower peak
would take.

Usage::

    python benchmarks/profile_peak.py --device cuda [--models sage] [--bits 2] [--shape arxiv]
        [--nodes N] [--top 12]
    python benchmarks/profile_peak.py --device cpu --models gcn sage gat gcnii --bits 32 2 \
        --nodes 20000 [--styles module functional pyg]

Each model in up to three styles (``--styles``, as in ``bench_saved_bytes.py``): ``module``
(:mod:`gnnact.models` as written), ``functional`` (the same model written as PyG's examples
write it, ``F.relu`` and ``F.dropout`` in ``forward``) and ``pyg`` (PyG's own
``torch_geometric.nn.models`` class, where there is one: GCN, SAGE, GAT; GATv2 and GIN, whose
convs have no twin and exist in this style only), each converted by :func:`gnnact.convert` as
a user would convert it.

Rows (``peak.jsonl``): the traced peak, ``max_memory_allocated`` over the same step for
comparison (32 bits: the PyG model unconverted), ``graph_cache_bytes`` (gnnact's graph cache,
built by the warmup and alive through the step, outside the measured peak), and
``peak_ratio_vs_fp32`` on the other rows when 32 is among ``--bits`` (peaks with the graph
cache counted), the site of the allocation that reached the peak, and the
``--top`` sites by bytes alive at the peak. On the CPU, whose allocator keeps no history, the
step runs under :class:`gnnact.peak.PeakMeter` (``sites=True``): the same peak and sites,
counted per op (``count`` is then 1 per site; the site is the innermost frame and the op).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import PYG_MODELS, RESULTS, environment, finish, pyg_model, step_peak_bytes

import gnnact
from gnnact.data import SHAPES, synthetic_like
from gnnact.env import cuda_index
from gnnact.memory import breakdown
from gnnact.models import MODELS, STYLES, build
from gnnact.peak import PeakMeter
from gnnact.training import loss_of

ROOTS = ("gnnact/", "torch_geometric/", "benchmarks/")


def site(frames: list[dict], roots: tuple[str, ...] = ROOTS) -> str:
    """``file:line function`` of the innermost frame under one of ``roots`` (``"other"``)."""
    for frame in frames:  # innermost first
        name = frame.get("filename", "")
        for root in roots:
            if root in name:
                return f"{root}{name.split(root, 1)[1]}:{frame.get('line')} {frame.get('name')}"
    return "other"


def _replay(events: Iterable[dict]) -> tuple[int, dict | None, list[dict]]:
    """Replay allocator events (``alloc`` / ``free_completed``, as in the snapshot's
    ``device_traces``): the peak of the bytes allocated since the first event, the allocation
    that reached it, and the allocations alive then. Frees of blocks allocated before the
    trace began are ignored."""
    live: dict[int, dict] = {}
    current = peak = 0
    at: dict | None = None
    alive_at_peak: list[dict] = []
    for event in events:
        action = event["action"]
        if action == "alloc":
            live[event["addr"]] = event
            current += event["size"]
            if current > peak:
                peak, at, alive_at_peak = current, event, list(live.values())
        elif action == "free_completed":
            entry = live.pop(event["addr"], None)
            if entry is not None:
                current -= entry["size"]
    return peak, at, alive_at_peak


def peak_live(events: Iterable[dict], site_of: Callable[[list[dict]], str] = site
              ) -> tuple[int, str | None, list[tuple[str, int, int]]]:
    """:func:`_replay`'s peak, the site of the allocation that reached it, and
    ``(site, bytes, count)`` of what was alive then, largest first."""
    peak, at, alive = _replay(events)
    by_site: dict[str, list[int]] = {}
    for event in alive:
        totals = by_site.setdefault(site_of(event.get("frames") or []), [0, 0])
        totals[0] += event["size"]
        totals[1] += 1
    ranked = sorted(((w, b, n) for w, (b, n) in by_site.items()), key=lambda r: -r[1])
    return peak, None if at is None else site_of(at.get("frames") or []), ranked


def largest_at_peak(events: Iterable[dict], count: int, depth: int = 16) -> list[dict]:
    """The ``count`` largest allocations alive at :func:`_replay`'s peak: bytes and the
    ``depth`` innermost frames, C++ ones included where the history recorded them (``--stacks``
    names the operator that allocated, where a Python line alone does not)."""
    _, _, alive = _replay(events)
    return [{"bytes": e["size"],
             "frames": [f"{f.get('filename', '?').rsplit('/', 1)[-1]}:{f.get('line')} "
                        f"{f.get('name')}" for f in (e.get("frames") or [])[:depth]]}
            for e in sorted(alive, key=lambda e: -e["size"])[:count]]


def profile_step(model: torch.nn.Module, data, device: torch.device, warmup: int,
                 stacks: int = 0) -> dict:
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss_of(model, data).backward()
        opt.step()

    model.train()
    for _ in range(warmup):
        step()
    # gnnact's graph cache, built by the warmup: alive through the measured step, not counted
    # in its peak (above what existed before it).
    cache = breakdown(loss_of(model, data), exclude=[data.x]).graph_cache
    if device.type == "cpu":  # no allocator history: count by dispatch (gnnact.peak)
        with PeakMeter(sites=True) as meter:
            step()
        ranked = [(where, nbytes, 1) for where, nbytes in meter.at_peak.items()]
        return {"traced_peak_bytes": meter.peak_bytes, "peak_bytes": meter.peak_bytes,
                "graph_cache_bytes": cache, "at": ranked[0][0] if ranked else None,
                "alive": ranked}
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.memory._record_memory_history(max_entries=2_000_000,
                                             stacks="all" if stacks else "python")
    try:
        step()
        torch.cuda.synchronize(device)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    events = snapshot["device_traces"][cuda_index(device)]
    peak, at, ranked = peak_live(events)
    result = {"traced_peak_bytes": peak,
              "peak_bytes": torch.cuda.max_memory_allocated(device) - before,
              "graph_cache_bytes": cache, "at": at, "alive": ranked}
    if stacks:
        result["largest_at_peak"] = largest_at_peak(events, stacks)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=torch.device, default=torch.device("cuda"))
    parser.add_argument("--models", nargs="+", choices=list(dict.fromkeys([*MODELS, *PYG_MODELS])),
                        default=["sage"])
    parser.add_argument("--bits", nargs="+", type=int, default=[2])
    parser.add_argument("--styles", nargs="+", choices=[*STYLES, "pyg"], default=["module"],
                        help="how the model is written (pyg: torch_geometric.nn.models)")
    parser.add_argument("--shape", choices=list(SHAPES), default="arxiv")
    parser.add_argument("--nodes", type=int, default=None, help="default: the shape's")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--stacks", type=int, default=0, metavar="N",
                        help="on a GPU, the N largest allocations alive at the peak with their "
                             "stacks, C++ frames included (slower to record)")
    parser.add_argument("--out", type=Path, default=RESULTS / "peak.jsonl")
    args = parser.parse_args(argv)
    if args.device.type not in ("cpu", "cuda"):
        parser.error(f"--device {args.device}: expected cpu or cuda")
    data = synthetic_like(args.shape, num_nodes=args.nodes).to(args.device)
    env = environment(args.device)
    rows = []
    classes = SHAPES[args.shape][3]
    for name in args.models:
        for style in args.styles:
            if name not in (PYG_MODELS if style == "pyg" else MODELS):
                continue  # no such model in this style
            for bits in args.bits:
                torch.manual_seed(0)
                model = (pyg_model(name, data.num_features, classes) if style == "pyg"
                         else build(name, data.num_features, classes, style=style))
                model = model.to(args.device)
                if bits < 32:
                    gnnact.convert(model, gnnact.Config(bits=bits))
                result = profile_step(model, data, args.device, args.warmup, args.stacks)
                result["alive"] = result["alive"][:args.top]
                row = {"bench": "peak", **env, "model": name, "style": style, "bits": bits,
                       "graph": args.shape, "num_nodes": data.num_nodes, **result}
                fp32 = [r for r in rows
                        if r["model"] == name and r["style"] == style and r["bits"] == 32]
                if bits < 32 and fp32:  # PyG fp32's peak over this one (graph cache counted)
                    row["peak_ratio_vs_fp32"] = round(step_peak_bytes(fp32[0])
                                                      / step_peak_bytes(result), 2)
                rows.append(row)
                print(f"{name} {style} {bits} bits: peak {result['peak_bytes'] / 2**20:.1f} MiB "
                      f"(traced {result['traced_peak_bytes'] / 2**20:.1f}) + graph cache "
                      f"{result['graph_cache_bytes'] / 2**20:.1f} MiB, reached at "
                      f"{result['at']}")
                for where, nbytes, count in result["alive"]:
                    print(f"  {nbytes / 2**20:9.1f} MiB  {count:4d}x  {where}")
                for alloc in result.get("largest_at_peak", []):
                    print(f"  {alloc['bytes'] / 2**20:9.1f} MiB  <- "
                          + " <- ".join(alloc["frames"]))
                del model
    return finish(args.out, rows)


if __name__ == "__main__":
    raise SystemExit(main())
