r"""GCN normalisation :math:`\hat A = \hat D^{-1/2} (A + I) \hat D^{-1/2}` folded into a cached
:class:`~gnnact.ops.graph.Graph`, shared by ``GCNConv`` and ``GCN2Conv``.

PyG's own :func:`~torch_geometric.nn.conv.gcn_conv.gcn_norm` computes the values, so they equal
PyG's bit for bit; for an ``edge_index`` without weights in float32 or float64 the graph is
built from the edges' keys instead, its values from the in-degrees it sorts out: the same
values in the same edge order (tested), without ``gcn_norm``'s copies of the edge list at the
first call's peak. Constant edge weights (none given, or weights that need no gradient) become
the graph's own values and the result is cached on the adjacency object: a fixed graph is
normalised and sorted into CSR once, across layers and epochs, like PyG's ``cached=True`` but
invalidated by any in-place change. Weights that need a gradient are normalised in every call
(through autograd) and returned separately, for :func:`gnnact.ops.spmm` to differentiate.

What the cached graph keeps: :math:`A` in CSR (int32 where it fits) and the normalised value of
each edge, and only for an asymmetric :math:`\hat A` the transposed structure; on a symmetric
graph (an undirected one, self-loops added) :math:`8E + 4(N+1)` bytes in float32.
The values are kept per edge rather than recomputed from the degrees as row scalings around an
all-ones product (:math:`\hat D^{-1/2} (A+I) \hat D^{-1/2} X`): that saves :math:`4E` bytes
but its two extra passes over the features made one layer slower on the CPU
(``benchmarks/bench_graph_cache.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnnact.ops.blocks import element_blocks
from gnnact.ops.graph import (
    Graph,
    GraphCache,
    build_graph,
    cache_on,
    check_edge_index,
    check_sparse_flow,
    edge_keys,
    is_sparse_adjacency,
    keys_with_self_loops,
)

__all__ = ["normalized_graph"]

#: In-degrees (self-loop included) below this count exactly in float32, as gcn_norm's sum of
#: ones does: the bound of :func:`_normalized_edges`' float32 values.
_EXACT_COUNT = 2**24


def _degree_normalized(dtype: torch.dtype) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    r"""``values_of`` for :meth:`Graph.from_keys`: :math:`\hat d_j^{-1/2} \hat d_i^{-1/2}` for
    each edge :math:`j \to i` in CSR order, as ``gcn_norm`` computes it for unit weights."""

    def values_of(ptr: Tensor, src: Tensor, dst: Tensor) -> Tensor:
        # gcn_norm sums a one per edge into its target's degree: the in-degree, exactly
        # (_lean_normalization holds the degrees below _EXACT_COUNT).
        inv_sqrt = (ptr[1:] - ptr[:-1]).to(dtype).pow_(-0.5)
        inv_sqrt.masked_fill_(inv_sqrt == float("inf"), 0)
        # (gcn_norm's d_j^-1/2 * 1 * d_i^-1/2: the product by one is exact.)
        value = torch.empty(src.numel(), dtype=dtype, device=src.device)
        for a, b in element_blocks(src.numel(), src.device):
            torch.mul(inv_sqrt.index_select(0, src[a:b]), inv_sqrt.index_select(0, dst[a:b]),
                      out=value[a:b])
        return value

    return values_of


def _lean_normalization(edge_index: Tensor, num_nodes: int, flow: str,
                        dtype: torch.dtype) -> bool:
    """Whether :func:`_normalized_edges` gives ``gcn_norm``'s values bit for bit: float32 or
    float64 (a 16-bit sum of ones rounds as the device's scatter rounds it: left to
    ``gcn_norm``), each node's in-degree, self-loop included, below :math:`2^{24}` (where
    float32 still counts exactly), and PyG's default flow."""
    if flow != "source_to_target" or dtype not in (torch.float32, torch.float64):
        return False
    if dtype == torch.float64 or edge_index.size(1) + 1 < _EXACT_COUNT:
        return True
    degree = torch.bincount(edge_index[1], minlength=num_nodes)
    return int(degree.max()) + 1 < _EXACT_COUNT


def _normalized_edges(edge_index: Tensor, num_nodes: int, add_self_loops: bool,
                      dtype: torch.dtype) -> Graph:
    """The graph ``gcn_norm`` followed by :func:`build_graph` makes of an ``edge_index``
    without weights (``source_to_target``), built from the edges' keys: the same edges in the
    same order and the same values bit for bit, without ``gcn_norm``'s int64 copies of the
    edge list and its per-edge temporaries beside the sort (about 45 bytes per edge at the
    build's peak before, 24 now)."""
    src, dst = edge_index

    def keys() -> Tensor:
        if add_self_loops:
            return keys_with_self_loops(src, dst, num_nodes, num_nodes)
        return edge_keys(src, dst, num_nodes)

    return Graph.from_keys(keys, num_nodes, num_nodes, values_of=_degree_normalized(dtype),
                           per_edge=False, keep_dst=False)


def _normalize(adj: Any, edge_weight: Tensor | None, num_nodes: int, improved: bool,
               add_self_loops: bool, flow: str, dtype: torch.dtype,
               per_edge: bool) -> tuple[Graph, Tensor | None]:
    """Normalise with PyG's ``gcn_norm`` and build the graph: the values are the graph's own
    (constant), or with ``per_edge`` returned separately in CSR order (they need a gradient).
    An ``edge_index`` without weights takes :func:`_normalized_edges`, the same graph
    (``improved`` changes nothing there: PyG's added loops weigh 1 without weights)."""
    if isinstance(adj, Tensor) and adj.layout == torch.strided:
        edge_index = check_edge_index(adj, num_nodes, num_nodes, flow=flow)  # before it scatters
        if edge_weight is None and not per_edge and _lean_normalization(edge_index, num_nodes,
                                                                        flow, dtype):
            return _normalized_edges(edge_index, num_nodes, add_self_loops, dtype), None
    out = gcn_norm(adj, edge_weight, num_nodes, improved, add_self_loops, flow, dtype)
    if isinstance(out, tuple):  # edge_index (or torch.sparse) input: (adjacency, weights)
        adj_norm, weight_norm = out
    else:  # torch_sparse.SparseTensor input
        adj_norm, weight_norm = out, None
    # The normalised adjacency is made in this call: copied (int32), never borrowed.
    options = {"per_edge": per_edge, "keep_dst": False}
    if weight_norm is None:  # a sparse adjacency: the values are inside
        return build_graph(adj_norm, num_nodes, num_nodes, **options), None
    if per_edge:
        graph = build_graph(adj_norm, num_nodes, num_nodes, flow=flow, **options)
        return graph, graph.to_csr_order(weight_norm)
    return build_graph(adj_norm, num_nodes, num_nodes, flow=flow, edge_weight=weight_norm,
                       **options), None


def normalized_graph(adj: Any, edge_weight: Tensor | None, num_nodes: int, *, improved: bool,
                     add_self_loops: bool, flow: str, dtype: torch.dtype,
                     normalize: bool = True,
                     cache: GraphCache | None = None) -> tuple[Graph, Tensor | None]:
    r"""The graph of :math:`\hat A` (or of :math:`A` with ``edge_weight`` when
    ``normalize=False``) and the edge values that need a gradient (``None`` when constant).

    Args:
        cache (GraphCache, optional): where the graph of constant values is kept (a layer's
            :func:`~gnnact.ops.graph.graph_cache_for`). (default: the active cache; with none,
            built afresh)

    Returns:
        ``(graph, value)``: pass both to :func:`gnnact.ops.spmm`; ``value`` (CSR order) is
        ``None`` when the values are constant and live in ``graph.value``.
    """
    check_sparse_flow(adj, flow)  # before gcn_norm, which would not notice
    if is_sparse_adjacency(adj) and not normalize:
        # As PyG's fused path: the adjacency's own values are the weights; edge_weight is unused.
        edge_weight = None
    needs_grad = edge_weight is not None and edge_weight.requires_grad and (
        torch.is_grad_enabled())
    if not normalize:
        # The caller's adjacency: a CSR one is referred to rather than copied (borrow).
        if edge_weight is None:
            return cache_on(adj, ("plain", num_nodes, flow), lambda: build_graph(
                adj, num_nodes, num_nodes, flow=flow, per_edge=False, keep_dst=False,
                borrow=True), cache=cache), None
        if needs_grad:
            graph = cache_on(adj, ("plain_per_edge", num_nodes, flow), lambda: build_graph(
                adj, num_nodes, num_nodes, flow=flow, per_edge=True, keep_dst=False,
                borrow=True), cache=cache)
            if edge_weight.numel() != graph.num_edges:
                raise ValueError(f"edge_weight has {edge_weight.numel()} entries but the graph "
                                 f"has {graph.num_edges} edges")
            return graph, graph.to_csr_order(edge_weight)
        # Constant weights join the cached graph, like the normalised ones below.
        return cache_on(adj, ("plain_weighted", num_nodes, flow), lambda: build_graph(
            adj, num_nodes, num_nodes, flow=flow, edge_weight=edge_weight.detach(),
            per_edge=False, keep_dst=False), also=(edge_weight,), cache=cache), None
    if needs_grad:
        return _normalize(adj, edge_weight, num_nodes, improved, add_self_loops, flow, dtype,
                          per_edge=True)

    def build() -> Graph:
        with torch.no_grad():
            graph, _ = _normalize(adj, edge_weight, num_nodes, improved, add_self_loops, flow,
                                  dtype, per_edge=False)
        return graph

    key = ("gcn_norm", num_nodes, improved, add_self_loops, flow, dtype)
    also = () if edge_weight is None else (edge_weight,)
    return cache_on(adj, key, build, also=also, cache=cache), None
