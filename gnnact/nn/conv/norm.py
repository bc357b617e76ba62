r"""GCN normalisation :math:`\hat A = \hat D^{-1/2} (A + I) \hat D^{-1/2}` folded into a cached
:class:`~gnnact.ops.graph.Graph`, shared by ``GCNConv`` and ``GCN2Conv``.

PyG's own :func:`~torch_geometric.nn.conv.gcn_conv.gcn_norm` computes the values, so they equal
PyG's bit for bit. Constant edge weights (none given, or weights that need no gradient) become
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

from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnnact.ops.graph import (
    Graph,
    GraphCache,
    build_graph,
    cache_on,
    check_edge_index,
    check_sparse_flow,
    is_sparse_adjacency,
)

__all__ = ["normalized_graph"]


def _normalize(adj: Any, edge_weight: Tensor | None, num_nodes: int, improved: bool,
               add_self_loops: bool, flow: str, dtype: torch.dtype,
               per_edge: bool) -> tuple[Graph, Tensor | None]:
    """Normalise with PyG's ``gcn_norm`` and build the graph: the values are the graph's own
    (constant), or with ``per_edge`` returned separately in CSR order (they need a gradient)."""
    if isinstance(adj, Tensor) and adj.layout == torch.strided:
        check_edge_index(adj, num_nodes, num_nodes, flow=flow)  # before gcn_norm scatters
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
