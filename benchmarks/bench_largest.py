"""The largest graph a model trains on full-batch under a GPU memory cap: PyG fp32 against
gnnact compression and compression + swap.

Random graphs of ``n`` nodes at a fixed average degree (ogbn-products': 50.5 directed edges per
node, 100 features, 47 classes), built directly on the GPU; one training step (forward,
backward, Adam) decides whether ``n`` fits under the cap
(``torch.cuda.set_per_process_memory_fraction``). A geometric bisection finds the largest
``n`` to within ``--tolerance``. Then, for the gnnact methods, one step on a graph of
ogbn-products' size (2,449,029 nodes) reports its peak memory (target: <= 6 GB with swap).

On the CPU the cap is counted rather than enforced by an allocator: a graph fits when its step
completes with a :class:`gnnact.peak.PeakMeter` peak within the cap (every tensor the step
allocates, the graph, the model and Adam's state included, as the GPU's allocator counts
them). A limit on the process's address space, set above the cap, stops a step that could never
fit before it takes the machine's memory (:func:`address_space_limit`). Swap offloads to the
CPU, so there it is measured on a GPU only.

Usage::

    python benchmarks/bench_largest.py --device cuda [--model sage] [--cap-gb 16]
    python benchmarks/bench_largest.py --device cpu --cap-gb 2 [--no-products]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import math
import resource
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish, out_of_memory

import gnnact
from gnnact.env import cuda_index
from gnnact.models import build
from gnnact.ops.graph import build_graph
from gnnact.peak import PeakMeter

METHODS = ("pyg", "gnnact2", "gnnact2_swap")
CPU_METHODS = ("pyg", "gnnact2")  # swap moves context to the CPU: nothing to gain there
PRODUCTS_NODES = 2_449_029


def largest(fits: Callable[[int], bool], lo: int, hi: int, tolerance: float = 0.05) -> int:
    """The largest ``n`` in ``[lo, hi]`` with ``fits(n)`` (0 if not even ``lo`` fits),
    assuming ``fits`` is monotone: bisection on a log scale until ``hi / lo <= 1 + tolerance``.
    """
    if not fits(lo):
        return 0
    if fits(hi):
        return hi
    while hi > lo * (1 + tolerance):
        mid = int(math.sqrt(lo * hi))
        if mid <= lo:
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def random_graph(n: int, degree: float, features: int, classes: int, device: torch.device,
                 seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features, directed edges (``round(n * degree)``, uniform endpoints) and labels."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(n, features, device=device, generator=g)
    edge_index = torch.randint(0, n, (2, round(n * degree)), device=device, generator=g)
    y = torch.randint(0, classes, (n,), device=device, generator=g)
    return x, edge_index, y


def step(method: str, model_name: str, n: int, args: argparse.Namespace) -> int:
    """One training step on a graph of ``n`` nodes; returns its peak memory (bytes): the
    allocator's on a GPU, a :class:`~gnnact.peak.PeakMeter`'s count on the CPU (the graph
    and the model are made inside the step on both)."""
    if args.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(args.device)
        _step(method, model_name, n, args)
        torch.cuda.synchronize(args.device)
        return torch.cuda.max_memory_allocated(args.device)
    with PeakMeter(args.device) as meter:
        _step(method, model_name, n, args)
    return meter.peak_bytes


def _step(method: str, model_name: str, n: int, args: argparse.Namespace) -> None:
    device = args.device
    torch.manual_seed(0)
    x, edge_index, y = random_graph(n, args.degree, args.features, args.classes, device)
    model = build(model_name, args.features, args.classes).to(device)
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    if method != "pyg":
        gnnact.convert(model, gnnact.Config(bits=2))
    if method == "gnnact2_swap":
        hooks = gnnact.compress_saved_tensors(gnnact.Config(bits=2, offload=True), model=model,
                                              skip=[x, edge_index])
        context = lambda: hooks  # noqa: E731
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    with context():
        loss = F.cross_entropy(model(x, edge_index), y)
    loss.backward()
    optimizer.step()


def build_peak(n: int, args: argparse.Namespace) -> tuple[int, int]:
    """The peak memory of building the graph of ``n`` nodes as SAGE's layers do (the cached
    graph included, the inputs not) and that graph's bytes: whether the build, rather than the
    step around it, is what a cap meets first."""
    _, edge_index, _ = random_graph(n, args.degree, args.features, args.classes, args.device)
    build = functools.partial(build_graph, edge_index, n, per_edge=False, keep_dst=False,
                              borrow=True)
    if args.device.type == "cuda":
        torch.cuda.synchronize(args.device)
        torch.cuda.reset_peak_memory_stats(args.device)
        base = torch.cuda.memory_allocated(args.device)
        graph = build()
        torch.cuda.synchronize(args.device)
        return torch.cuda.max_memory_allocated(args.device) - base, graph.nbytes()
    with PeakMeter(args.device) as meter:
        graph = build()
    return meter.peak_bytes, graph.nbytes()


def _vm_bytes() -> int:
    """This process's virtual memory size (``VmSize``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


@contextlib.contextmanager
def address_space_limit(extra: int):
    """Let the process map at most ``extra`` more bytes inside the block: an allocation past
    that fails with PyTorch's "can't allocate memory" error instead of taking the machine's
    memory. Only the soft limit is lowered, and restored on exit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_bytes() + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def fits(method: str, model_name: str, cap: int,
         args: argparse.Namespace) -> Callable[[int], bool]:
    """Whether one step on ``n`` nodes fits under ``cap`` bytes: on a GPU, whether the
    allocator (capped by the caller) ran out; on the CPU, whether the step's counted peak is
    within ``cap``, under an address-space limit of twice ``cap`` that stops a step that could
    never fit."""

    def probe(n: int) -> bool:
        limit = (contextlib.nullcontext() if args.device.type == "cuda"
                 else address_space_limit(2 * cap))
        try:
            with limit:
                peak = step(method, model_name, n, args)
            ok = args.device.type == "cuda" or peak <= cap
        except RuntimeError as error:  # OutOfMemoryError is one
            if not out_of_memory(error):
                raise
            ok = False
        gc.collect()
        if args.device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"  {method:14s} {n:>12,d} nodes: {'fits' if ok else 'out of memory'}", flush=True)
        return ok

    return probe


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", type=torch.device, default=torch.device(
        "cuda" if torch.cuda.is_available() else "cpu"))
    parser.add_argument("--model", default="sage")
    parser.add_argument("--methods", nargs="+", choices=METHODS,
                        help=f"default: {' '.join(METHODS)} (CPU: {' '.join(CPU_METHODS)})")
    parser.add_argument("--cap-gb", type=float, default=16.0)
    parser.add_argument("--degree", type=float, default=50.5)
    parser.add_argument("--features", type=int, default=100)
    parser.add_argument("--classes", type=int, default=47)
    parser.add_argument("--lo", type=int, default=50_000)
    parser.add_argument("--hi", type=int, default=40_000_000)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--no-products", dest="products", action="store_false",
                        help="skip the step on a graph of ogbn-products' size")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, no cap: one step per method at --lo nodes; no rows")
    parser.add_argument("--out", type=Path, default=RESULTS / "largest.jsonl")
    args = parser.parse_args(argv)
    cpu = args.device.type != "cuda"
    args.methods = args.methods or list(CPU_METHODS if cpu and not args.smoke else METHODS)
    env = environment(args.device)
    if args.smoke:
        args.lo = min(args.lo, 2_000)
        for method in args.methods:
            step(method, args.model, args.lo, args)
            print(f"{method}: one step at {args.lo} nodes")
        return finish(args.out, [], smoke=True)
    if args.device.type not in ("cuda", "cpu"):
        parser.error(f"--device must be cuda or cpu, got {args.device}")
    if cpu and "gnnact2_swap" in args.methods:
        parser.error("gnnact2_swap offloads to the CPU: measure it with --device cuda")
    cap = int(args.cap_gb * 2**30)
    if cpu:
        # Every node holds at least its features and its edges (int64 pairs): a larger graph
        # cannot fit, and needs no step to say so.
        resident = 4 * args.features + 16 * args.degree
        args.hi = max(args.lo, min(args.hi, int(cap / resident)))
    else:
        index = cuda_index(args.device)
        total = torch.cuda.get_device_properties(index).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), index)
    rows = []
    for method in args.methods:
        n = largest(fits(method, args.model, cap, args), args.lo, args.hi, args.tolerance)
        peak = step(method, args.model, n, args) if n else None
        row = {"bench": "largest", **env, "model": args.model, "method": method,
               "cap_bytes": cap, "cap_by": "meter" if cpu else "allocator",
               "degree": args.degree, "features": args.features,
               "largest_nodes": n, "peak_bytes_at_largest": peak}
        if method != "pyg" and n:
            row["graph_build_peak_bytes"], row["graph_bytes"] = build_peak(n, args)
            gc.collect()
        if method != "pyg" and args.products:
            try:
                # Outside the cap on the CPU (the meter counts, nothing stops it there).
                row["products_peak_bytes"] = step(method, args.model, PRODUCTS_NODES, args)
            except RuntimeError as error:  # OutOfMemoryError is one
                if not out_of_memory(error):
                    raise
                row["products_peak_bytes"] = None  # does not fit under the cap
            gc.collect()
            if not cpu:
                torch.cuda.empty_cache()
        rows.append(row)
        print(row, flush=True)
    return finish(args.out, rows)


if __name__ == "__main__":
    sys.exit(main())
