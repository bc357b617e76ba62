"""Bytes of gnnact's graph cache per conv, old layout against new, and one layer's speed.

On an ogbn-arxiv-shaped synthetic graph (169,343 nodes, 2,329,596 edges: undirected, stored in
both directions, so the adjacency is symmetric) and, with ``--directed``, on its directed half
(each undirected edge once, from the lower to the higher id: no edge has its reverse). For each
conv (GCN 128 -> 256, SAGE 128 -> 256 mean, GAT 128 -> 3 x 64, GCNII 128 channels), one row per
variant:

* ``new``: the cached graph as gnnact builds it now (what the layer's cache holds);
* ``old``: the layout before this change, rebuilt from the new graph: ``ptr``/``src``/``t_ptr``/
  ``t_dst`` int32, ``t_perm``/``input_perm`` int64, the normalised ``value`` (GCN, GCNII) and the
  cached all-ones vector ``_ones`` (SAGE) float32, the cached per-edge targets ``_dst`` int32
  (GAT), a transposed copy whatever the symmetry; its bytes are also given by that formula
  (``old_layout_bytes``), and the row checks that both agree;
* ``gcn_norm_from_degrees`` (GCN, symmetric graph): no per-edge values at all, the normalisation
  recomputed in each product as row scalings around an all-ones product,
  :math:`\\hat D^{-1/2} (\\hat A (\\hat D^{-1/2} H))`, forward and backward;
* ``gat_keep_dst`` (GAT): the new layout plus the per-edge targets kept (int32) instead of
  derived from the row pointers when read.

Each row has the cache bytes, per edge of the caller's ``edge_index`` (whose own int64 bytes are
``edge_index_bytes``, 16 per edge), the bytes by field, and the median seconds of one training
forward + backward of the layer (``Config()``, 2 bits; one CPU thread unless ``--threads``;
variants timed interleaved, so load from other processes spreads over all of them alike), with
the largest output difference from ``new``.

Usage::

    python benchmarks/bench_graph_cache.py [--kinds gcn sage gat gcn2] [--directed]
        [--repeats 5] [--threads 1] [--nodes 169343] [--smoke]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, environment, finish

import gnnact
from gnnact import ops
from gnnact.data import SHAPES, synthetic_like
from gnnact.ops.graph import Graph, GraphCache, build_graph, csr_tensor, use_graph_cache

KINDS = ("gcn", "sage", "gat", "gcn2")


# ------------------------------------------------------------------------------ old layout

@dataclass(eq=False)
class OldLayoutGraph(Graph):
    """The graph as gnnact kept it before (commit 0d1fb9d): every field always present, the
    all-ones values cached per dtype (``ones``) and read without reordering."""

    ones: Tensor | None = None

    def _values(self, value: Tensor | None, dtype: torch.dtype) -> Tensor:
        if value is not None:
            return value.to(dtype)
        if self.ones is None or self.ones.dtype != dtype:
            self.ones = torch.ones(self.num_edges, dtype=dtype, device=self.device)
        return self.ones


def old_layout(graph: Graph, kind: str) -> OldLayoutGraph:
    """``graph``'s adjacency in the old layout (see the module docstring)."""
    e = graph.num_edges
    t_ptr, t_dst, t_perm = graph.transpose_index()
    if t_perm is None:  # the transposed order of a canonical CSR: a stable sort by source
        t_perm = torch.argsort(graph.src, stable=True)
    # input_perm's content only matters to GAT (GCN/SAGE never read it): the identity stands
    # in where the new graph needs none.
    input_perm = graph.input_perm if graph.input_perm is not None else torch.arange(e)
    old = OldLayoutGraph(graph.num_src, graph.num_dst, graph.ptr.clone(), graph.src.clone(),
                         value=None if graph.value is None else graph.value.float(),
                         t_ptr=t_ptr.clone().int(), t_dst=t_dst.clone().int(),
                         t_perm=t_perm.long(), input_perm=input_perm.long(),
                         targets=graph.dst.int() if kind == "gat" else None)
    if kind == "sage":
        old._values(None, torch.float32)  # the cached _ones
    return old


def old_layout_bytes(kind: str, num_nodes: int, num_edges: int) -> int:
    """The old layout's bytes by formula: ``ptr``, ``t_ptr`` (N+1) and ``src``, ``t_dst`` (E)
    int32; ``t_perm``, ``input_perm`` int64; GCN/GCNII ``value`` float32, SAGE ``_ones``
    float32, GAT ``_dst`` int32: 28 bytes per edge plus 8 per node."""
    return 8 * (num_nodes + 1) + (4 + 4 + 8 + 8 + 4) * num_edges


def field_bytes(graph: Graph) -> dict[str, int]:
    return {name: t.untyped_storage().nbytes() for name, t in graph.tensors(borrowed=True)}


# ------------------------------------------------------------------- normalisation variant

class _DegreeScaled(torch.autograd.Function):
    r""":math:`\hat D^{-1/2} \hat A \hat D^{-1/2} H` with :math:`\hat A` all ones (symmetric):
    backward is the same product."""

    @staticmethod
    def forward(ctx: Any, h: Tensor, graph: Graph) -> Tensor:
        ctx.graph = graph
        return _scaled_product(h, graph)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        return _scaled_product(grad, ctx.graph), None


def _scaled_product(h: Tensor, graph: Graph) -> Tensor:
    d = graph.in_degree(h.dtype).pow_(-0.5)
    d.masked_fill_(d == float("inf"), 0.0)
    d = d[:, None]
    a = csr_tensor(graph.ptr, graph.src, torch.ones(1, dtype=h.dtype).expand(graph.num_edges),
                   (graph.num_dst, graph.num_src))
    return (a @ (h * d)).mul_(d)


class DegreeScaledGCN(torch.nn.Module):
    """``conv`` (a gnnact GCNConv) with its aggregation recomputing the normalisation from
    the degrees of ``graph`` (A + I, all ones)."""

    def __init__(self, conv: torch.nn.Module, graph: Graph) -> None:
        super().__init__()
        self.conv, self.graph = conv, graph

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        conv = self.conv
        h = ops.linear(x, conv.lin.weight, None, conv.config)
        return _DegreeScaled.apply(h, self.graph) + conv.bias


# ------------------------------------------------------------------------------- the layers

def make_layer(kind: str, f_in: int) -> tuple[torch.nn.Module, Callable]:
    torch.manual_seed(0)
    if kind == "gcn":
        return gnnact.nn.GCNConv(f_in, 256), lambda m, x, ei: m(x, ei)
    if kind == "sage":
        return gnnact.nn.SAGEConv(f_in, 256), lambda m, x, ei: m(x, ei)
    if kind == "gat":
        return gnnact.nn.GATConv(f_in, 64, heads=3), lambda m, x, ei: m(x, ei)
    if kind == "gcn2":
        return (gnnact.nn.GCN2Conv(f_in, alpha=0.1, theta=0.5, layer=1),
                lambda m, x, ei: m(x, x, ei))
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def with_graph(cache: GraphCache, convert: Callable[[Graph], Graph]) -> GraphCache:
    """A cache holding ``convert(graph)`` under each of ``cache``'s keys (same anchors)."""
    out = GraphCache()
    # (A benchmark's shortcut through the entries: the conv finds the variant under the key
    # it builds, so the layer's own code runs unchanged.)
    out._entries = {key: (ref, version, others, convert(value))
                    for key, (ref, version, others, value) in cache._entries.items()}
    return out


def run_kind(kind: str, x: Tensor, ei: Tensor, repeats: int, symmetric: bool) -> list[dict]:
    layer, call = make_layer(kind, x.size(1))
    layer.train()
    new = GraphCache()
    with use_graph_cache(new):
        reference = call(layer, x, ei)
    (graph,) = new.values()
    variants: dict[str, tuple[Any, GraphCache, Graph]] = {"new": (layer, new, graph)}
    old = with_graph(new, lambda g: old_layout(g, kind))
    variants["old"] = (layer, old, old.values()[0])
    if kind == "gcn" and symmetric:
        plain = build_graph(graph_structure(graph), graph.num_src, per_edge=False,
                            keep_dst=False)
        variants["gcn_norm_from_degrees"] = (DegreeScaledGCN(layer, plain), GraphCache(), plain)
    if kind == "gat":
        kept = with_graph(new, lambda g: dataclasses.replace(g, targets=g.dst.int()))
        variants["gat_keep_dst"] = (layer, kept, kept.values()[0])

    def step(name: str) -> Callable[[], None]:
        module, cache, _ = variants[name]

        def run() -> None:
            with use_graph_cache(cache):
                out = call(module, x, ei)
            out.sum().backward()
            layer.zero_grad(set_to_none=True)

        return run

    times: dict[str, list[float]] = {name: [] for name in variants}
    diffs: dict[str, float] = {}
    for name, (module, cache, _) in variants.items():
        with torch.no_grad(), use_graph_cache(cache):
            diffs[name] = float((call(module, x, ei) - reference).abs().max())
        step(name)()  # warm-up
    for _ in range(repeats):
        for name in variants:
            run = step(name)
            t0 = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - t0)

    num_nodes, e_user = x.size(0), ei.size(1)
    old_formula = old_layout_bytes(kind, num_nodes, graph.num_edges)
    rows = []
    for name, (_, _, g) in variants.items():
        nbytes = g.nbytes()
        fields = field_bytes(g)
        if name == "old":
            nbytes = sum(fields.values())
            assert nbytes == old_formula, (nbytes, old_formula)
        rows.append({
            "kind": kind, "variant": name, "symmetric": symmetric,
            "transposed_copy": g.t_ptr is not None, "num_nodes": num_nodes, "num_edges": e_user,
            "graph_edges": g.num_edges, "edge_index_bytes": ei.numel() * ei.element_size(),
            "cache_bytes": nbytes, "bytes_per_edge": round(nbytes / e_user, 3),
            "old_layout_bytes": old_formula,
            "old_layout_bytes_per_edge": round(old_formula / e_user, 3),
            "fields": fields, "seconds": round(statistics.median(times[name]), 4),
            "seconds_all": [round(t, 4) for t in times[name]], "repeats": repeats,
            "max_abs_diff_vs_new": diffs[name]})
    return rows


def graph_structure(graph: Graph) -> Tensor:
    """The edge_index of ``graph``'s own structure (A + I for GCN)."""
    return torch.stack([graph.src.long(), graph.dst.long()])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    parser.add_argument("--directed", action="store_true",
                        help="also the directed half of the graph (asymmetric)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: on a shared machine two threads wait "
                             "a scheduler tick in every small parallel op)")
    parser.add_argument("--nodes", type=int, default=SHAPES["arxiv"][0])
    parser.add_argument("--smoke", action="store_true", help="a 2,000-node graph, no results")
    parser.add_argument("--out", type=Path, default=RESULTS / "graph_cache.jsonl")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    data = synthetic_like("arxiv", num_nodes=2_000 if args.smoke else args.nodes)
    graphs = {"arxiv": (data.edge_index, True)}
    if args.directed:
        ei = data.edge_index
        graphs["arxiv-directed"] = (ei[:, ei[0] < ei[1]].contiguous(), False)
    env = environment("cpu")
    rows = []
    for graph_name, (ei, symmetric) in graphs.items():
        for kind in args.kinds:
            for row in run_kind(kind, data.x, ei, args.repeats, symmetric):
                row = {"bench": "graph_cache", **env, "graph": graph_name,
                       "threads": torch.get_num_threads(), **row}
                rows.append(row)
                print(f"{graph_name:15s} {kind:5s} {row['variant']:22s} "
                      f"{row['cache_bytes'] / 2**20:8.2f} MiB {row['bytes_per_edge']:6.2f} B/edge "
                      f"(old {row['old_layout_bytes_per_edge']:.2f})  {row['seconds']:.3f} s",
                      flush=True)
    return finish(args.out, rows, smoke=args.smoke)


if __name__ == "__main__":
    sys.exit(main())
