r"""GCN's symmetric normalisation with global degrees, for a partitioned graph.

``GCNConv`` and ``GCN2Conv`` weigh the edge :math:`j \to i` by

.. math::
    \hat w_{ji} = \hat d_j^{-1/2}\, w_{ji}\, \hat d_i^{-1/2}, \qquad
    \hat d_i = \sum_{j} w_{ji} \ \text{ over the edges into } i \text{ plus its self-loop},

with :math:`w` the given edge weights (or 1) and one self-loop per node from PyG's
``add_remaining_self_loops``, all as PyG's ``gcn_norm`` does (without edge weights the loops
weigh 1 even with ``improved=True``: PyG applies the fill value of 2 only to given weights). On
a shard, the degree of an owned node is complete (every edge into it is local), but a halo
node's is not (its other in-edges live on its owner). So the owned degrees are computed locally
and sent once, exactly (32 bits), through the halo exchange, and the weights :math:`\hat w` of
the owned nodes' in-edges are computed with the very operations of PyG's ``gcn_norm``, in the
input's dtype: they equal the single-process weights bit for bit. The conv then runs with
``normalize=False`` and these as ``edge_weight``.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.utils import add_remaining_self_loops, scatter

from gnnact.distributed.exchange import HaloExchange

__all__ = ["GlobalGCNNorm"]


class GlobalGCNNorm:
    r"""The normalised local edges of a shard for one GCN configuration (module docstring).

    Collective: every rank of the exchange's group builds it at the same point (one exchange
    of the owned degrees, :math:`8 \sum_q |S_{r \to q}|` bytes).

    Args:
        exchange (HaloExchange): the shard's exchange (its width is not used: degrees travel
            at 32 bits).
        improved (bool, optional): self-loops of weight 2. (default: :obj:`False`)
        add_self_loops (bool, optional): add them at all. (default: :obj:`True`)
        edge_weight (torch.Tensor, optional): :math:`w` of the shard's local edges
            (``shard.edge_weight``); ones if :obj:`None`.

    Example:
        >>> norm = GlobalGCNNorm(exchange)  # doctest: +SKIP
        >>> conv(x_local, norm.edge_index, norm.edge_weight(x_local.dtype))  # doctest: +SKIP
    """

    def __init__(self, exchange: HaloExchange, *, improved: bool = False,
                 add_self_loops: bool = True, edge_weight: Tensor | None = None) -> None:
        shard = exchange.shard
        n_owned, n_local = shard.num_owned, shard.num_local
        edge_index = shard.edge_index
        if edge_weight is not None and edge_weight.shape != (edge_index.size(1),):
            raise ValueError(f"edge_weight must have one value per local edge, "
                             f"[{edge_index.size(1)}], got {tuple(edge_weight.shape)}")
        if add_self_loops:
            # gcn_norm's own call. Without edge weights the loops carry no fill value, so they
            # weigh 1 like every edge (improved=True changes nothing in PyG 2.8 then); with
            # them, a node's own loop keeps its weight and the others get the fill value.
            # An owned node's in-edges are all local, so its loop is what it is on one process.
            edge_index, edge_weight = add_remaining_self_loops(
                edge_index, edge_weight, 2.0 if improved else 1.0, n_local)
        if edge_weight is None:
            # Degrees are integer sums: float64 holds them exactly, whatever dtype comes later.
            weight = torch.ones(edge_index.size(1), dtype=torch.float64,
                                device=edge_index.device)
        else:  # in the weights' dtype, as gcn_norm sums them (edges into a node in order)
            weight = edge_weight
        deg = scatter(weight, edge_index[1], 0, dim_size=n_local, reduce="sum")
        self.degree = exchange.gather(deg[:n_owned, None], bits=32)[:, 0]
        # The halo nodes' own self-loops point into the halo, whose outputs are dropped.
        keep = edge_index[1] < n_owned
        self.edge_index, self._weight = edge_index[:, keep], weight[keep]
        self._weighted = edge_weight is not None
        self._cache: dict[torch.dtype, Tensor] = {}

    def edge_weight(self, dtype: torch.dtype) -> Tensor:
        r""":math:`\hat w` of :attr:`edge_index` in ``dtype`` (computed once per dtype; with
        given edge weights, in their dtype whatever ``dtype``, as ``gcn_norm`` computes it).

        Args:
            dtype (torch.dtype): the features' dtype (PyG normalises in it).

        Example:
            >>> norm.edge_weight(torch.float32).shape == norm.edge_index[0].shape
            ... # doctest: +SKIP
            True
        """
        if self._weighted:
            dtype = self._weight.dtype
        if dtype not in self._cache:
            # gcn_norm's own steps: deg.pow_(-0.5), inf -> 0, dis[row] * w * dis[col].
            dis = self.degree.to(dtype).pow_(-0.5)
            dis.masked_fill_(dis == float("inf"), 0)
            row, col = self.edge_index
            self._cache[dtype] = dis[row] * self._weight.to(dtype) * dis[col]
        return self._cache[dtype]
