r"""PyG's ``cached=True`` for ``GCNConv`` and ``GCN2Conv``: the normalised adjacency of the first
call is kept in PyG's own attributes and used for every later call, whatever its input.

As PyG's ``forward`` (with ``normalize=True``): a tensor adjacency (``edge_index``,
``EdgeIndex``, ``torch.sparse`` ``adj_t``) uses ``_cached_edge_index``, the
:func:`~torch_geometric.nn.conv.gcn_conv.gcn_norm` pair ``(edge_index, edge_weight)``; a
``torch_sparse.SparseTensor`` uses ``_cached_adj_t``. A filled attribute is used even with
``cached=False``, and ``reset_parameters()`` (or setting the attribute to ``None``) empties
it. The twin keeps the :class:`~gnnact.ops.graph.Graph` of the attribute's content
(``_cached_graph``, with the object it was built from) and rebuilds it whenever the attribute
holds another object, so it never outlives PyG's cache.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from gnnact.nn.conv.norm import normalized_graph
from gnnact.ops.graph import (
    Graph,
    GraphCache,
    check_edge_index,
    check_sparse_flow,
    is_sparse_tensor,
)
from gnnact.ops.state import eager_op

__all__ = ["gcn_graph"]


def _cache_attribute(adj: Any) -> str | None:
    """The PyG attribute caching the normalisation of ``adj`` (PyG's two branches)."""
    if is_sparse_tensor(adj):
        return "_cached_adj_t"
    return "_cached_edge_index" if isinstance(adj, Tensor) else None


@eager_op
def gcn_graph(conv: Any, adj: Any, edge_weight: Tensor | None, num_nodes: int,
              dtype: torch.dtype, *, improved: bool,
              cache: GraphCache | None = None) -> tuple[Graph, Tensor | None]:
    r"""The graph :math:`\hat A` of ``conv`` (a ``GCNConv`` or ``GCN2Conv`` twin) and the edge
    values that need a gradient (``None`` when constant), honouring PyG's cache attributes
    (see the module docstring); without them, :func:`~gnnact.nn.conv.norm.normalized_graph`.

    Args:
        cache (GraphCache, optional): passed on to
            :func:`~gnnact.nn.conv.norm.normalized_graph`. (default: :obj:`None`)

    Returns:
        ``(graph, value)`` for :func:`gnnact.ops.spmm`.
    """
    attr = _cache_attribute(adj) if conv.normalize else None
    normed = None if attr is None else getattr(conv, attr)
    if attr is not None and normed is None and conv.cached:
        check_sparse_flow(adj, conv.flow)  # before gcn_norm, which would not notice
        if isinstance(adj, Tensor) and adj.layout == torch.strided:
            check_edge_index(adj, num_nodes, num_nodes, flow=conv.flow)  # before it scatters
        normed = gcn_norm(adj, edge_weight, num_nodes, improved, conv.add_self_loops,
                          conv.flow, dtype)
        setattr(conv, attr, normed)
    if normed is None:
        return normalized_graph(adj, edge_weight, num_nodes, improved=improved,
                                add_self_loops=conv.add_self_loops, flow=conv.flow,
                                dtype=dtype, normalize=conv.normalize, cache=cache)
    adj_norm, weight = normed if isinstance(normed, tuple) else (normed, None)
    # Weights that need a gradient (PyG's cache keeps them as computed) take the per-edge path.
    needs_grad = weight is not None and weight.requires_grad and torch.is_grad_enabled()
    entry = conv._cached_graph
    if entry is not None and entry[0] is normed and entry[1] == needs_grad:
        graph = entry[2]
        # (Reordered in each call: a tensor with history is not kept across calls.)
        return graph, graph.to_csr_order(weight) if needs_grad else None
    # The normalised adjacency as is (normalize=False): constant values become the graph's own.
    graph, value = normalized_graph(adj_norm, weight, num_nodes, improved=False,
                                    add_self_loops=False, flow=conv.flow, dtype=dtype,
                                    normalize=False, cache=cache)
    conv._cached_graph = (normed, needs_grad, graph)
    return graph, value
