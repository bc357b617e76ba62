r"""GCN normalisation :math:`\hat A = \hat D^{-1/2} (A + I) \hat D^{-1/2}` folded into a cached
:class:`~gnnact.ops.graph.Graph`, shared by ``GCNConv`` and ``GCN2Conv``.

PyG's own :func:`~torch_geometric.nn.conv.gcn_conv.gcn_norm` computes the values, so they equal
PyG's bit for bit. Constant edge weights (none given, or weights that need no gradient) become
the graph's own values and the result is cached on the adjacency object: a fixed graph is
normalised and sorted into CSR once, across layers and epochs, like PyG's ``cached=True`` but
invalidated by any in-place change. Weights that need a gradient are normalised in every call
(through autograd) and returned separately, for :func:`gnnact.ops.spmm` to differentiate.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnnact.ops.graph import (
    Graph,
    build_graph,
    cache_on,
    check_edge_index,
    check_sparse_flow,
    is_sparse_adjacency,
)

__all__ = ["normalized_graph"]


def _normalize(adj: Any, edge_weight: Tensor | None, num_nodes: int, improved: bool,
               add_self_loops: bool, flow: str, dtype: torch.dtype) -> tuple[Graph, Tensor | None]:
    if isinstance(adj, Tensor) and adj.layout == torch.strided:
        check_edge_index(adj, num_nodes, num_nodes, flow=flow)  # before gcn_norm scatters
    out = gcn_norm(adj, edge_weight, num_nodes, improved, add_self_loops, flow, dtype)
    if isinstance(out, tuple):  # edge_index (or torch.sparse) input: (adjacency, weights)
        adj_norm, weight_norm = out
    else:  # torch_sparse.SparseTensor input
        adj_norm, weight_norm = out, None
    if weight_norm is None:
        graph = build_graph(adj_norm, num_nodes, num_nodes)
        return graph, None
    graph = build_graph(adj_norm, num_nodes, num_nodes, flow=flow)
    return graph, weight_norm[graph.input_perm]


def normalized_graph(adj: Any, edge_weight: Tensor | None, num_nodes: int, *, improved: bool,
                     add_self_loops: bool, flow: str, dtype: torch.dtype,
                     normalize: bool = True) -> tuple[Graph, Tensor | None]:
    r"""The graph of :math:`\hat A` (or of :math:`A` with ``edge_weight`` when
    ``normalize=False``) and the edge values that need a gradient (``None`` when constant).

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
        graph = cache_on(adj, ("plain", num_nodes, flow),
                         lambda: build_graph(adj, num_nodes, num_nodes, flow=flow))
        if edge_weight is None:
            return graph, None
        if edge_weight.numel() != graph.num_edges:
            raise ValueError(f"edge_weight has {edge_weight.numel()} entries but the graph has "
                             f"{graph.num_edges} edges")
        if needs_grad:
            return graph, edge_weight[graph.input_perm]
        # Constant weights join the cached graph, like the normalised ones below.
        return cache_on(adj, ("plain_weighted", num_nodes, flow), lambda: dataclasses.replace(
            graph, value=edge_weight.detach()[graph.input_perm]), also=(edge_weight,)), None
    if needs_grad:
        return _normalize(adj, edge_weight, num_nodes, improved, add_self_loops, flow, dtype)

    def build() -> Graph:
        with torch.no_grad():
            graph, value = _normalize(adj, edge_weight, num_nodes, improved, add_self_loops,
                                      flow, dtype)
        if value is not None:
            graph.value = value
        return graph

    key = ("gcn_norm", num_nodes, improved, add_self_loops, flow, dtype)
    also = () if edge_weight is None else (edge_weight,)
    return cache_on(adj, key, build, also=also), None
