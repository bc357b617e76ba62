r"""``APPNP`` and ``SGConv``: propagation by powers of the normalised adjacency, whose backward
needs nothing but the graph."""

from __future__ import annotations

from typing import Any, ClassVar

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import OptTensor

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._base import same_shape
from gnnact.nn._lazy import linear_weight
from gnnact.nn.conv.base import CompressedConv, channels_shape
from gnnact.nn.conv.norm import normalized_graph
from gnnact.ops.graph import Graph, graph_cache_for

__all__ = ["APPNP", "SGConv"]


def _graph(conv: Any, edge_index: Any, edge_weight: OptTensor, x: Tensor,
           normalize: bool = True) -> tuple[Graph, Tensor | None]:
    r"""The normalised graph :math:`\hat A` of ``conv``'s adjacency, as its PyG class
    normalises it (``gcn_norm`` without ``improved``)."""
    return normalized_graph(edge_index, edge_weight, x.size(0), improved=False,
                            add_self_loops=conv.add_self_loops, flow=conv.flow,
                            dtype=x.dtype, normalize=normalize, cache=graph_cache_for(conv))


class APPNP(CompressedConv, pyg_nn.APPNP):
    r"""The approximate personalised propagation of `"Predict then Propagate: Graph Neural
    Networks meet Personalized PageRank" <https://arxiv.org/abs/1810.05997>`_, as
    :class:`torch_geometric.nn.APPNP` (same arguments and results), keeping no node features
    for backward:

    .. math::
        \mathbf{X}^{(0)} = \mathbf{X}, \qquad
        \mathbf{X}^{(k)} = (1 - \alpha) \hat{\mathbf{A}} \mathbf{X}^{(k-1)} + \alpha
        \mathbf{X}^{(0)}, \qquad
        \nabla \mathbf{X}^{(k-1)} = (1 - \alpha) \hat{\mathbf{A}}^\top \nabla \mathbf{X}^{(k)}.

    Kept for backward: the normalised graph, once per adjacency in the model's graph cache; no
    tensor with a value per node or edge. PyG's layer keeps the gathered messages and the edge
    weights of each of the :math:`K` steps. With ``dropout > 0`` in training (dropout on the
    edge weights, different in every step), static-graph ``[B, N, F]`` features or a PyG
    message-passing hook registered, the layer runs PyG's own forward, whose context the
    converted model's generic pipeline compresses.

    Args:
        K (int): number of propagation steps :math:`K`.
        alpha (float): teleport probability :math:`\alpha`.
        dropout (float, optional): dropout of the edge weights in training.
            (default: :obj:`0.0`)
        cached (bool, optional): normalise the graph of the first call only, as PyG.
            (default: :obj:`False`)
        add_self_loops (bool, optional): (default: :obj:`True`)
        normalize (bool, optional): symmetric normalisation. (default: :obj:`True`)
        config (Config, optional): storage of the context. (default: ``Config()``, 2 bits)
        **kwargs (optional): of :class:`torch_geometric.nn.conv.MessagePassing`.

    Example:
        >>> prop = gnnact.nn.APPNP(K=10, alpha=0.1)
        >>> x = torch.randn(100, 16, requires_grad=True)
        >>> edge_index = torch.randint(0, 100, (2, 400))
        >>> out = prop(x, edge_index)
        >>> # 20 float64 scalars (the products by alpha and 1 - alpha), no node features:
        >>> gnnact.memory.breakdown(out.sum()).context
        160
    """

    propagate_type: ClassVar[dict] = {"x": Tensor, "edge_weight": OptTensor}

    def __init__(self, K: int, alpha: float, dropout: float = 0.0, cached: bool = False,
                 add_self_loops: bool = True, normalize: bool = True, *,
                 config: Config | None = None, **kwargs: Any) -> None:
        super().__init__(K, alpha, dropout=dropout, cached=cached,
                         add_self_loops=add_self_loops, normalize=normalize, **kwargs)
        self._init_gnnact(config)

    def _init_gnnact(self, config: Config | None) -> None:
        super()._init_gnnact(config)
        self._cached_graph: tuple[Graph, Tensor | None] | None = None

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self._cached_graph = None

    _compiled_shape = staticmethod(same_shape)

    def forward(self, x: Tensor, edge_index: Any, edge_weight: OptTensor = None) -> Tensor:
        if ((self.dropout > 0 and self.training) or x.dim() != 2
                or self._compressed_reduce() != "sum" or self._takes_pyg_path()):
            return super().forward(x, edge_index, edge_weight)
        if self.normalize and self.cached and self._cached_graph is not None:
            graph, value = self._cached_graph  # as PyG: the first call's graph, whatever now
        else:
            graph, value = _graph(self, edge_index, edge_weight, x, self.normalize)
            if self.normalize and self.cached:
                self._cached_graph = (graph, value)
        h = x
        for _ in range(self.K):
            x = ops.spmm(x, graph, value, "sum", self.config)
            x = x * (1 - self.alpha)  # (PyG's order of operations: the same round-off)
            x = x + self.alpha * h
        return x


class SGConv(CompressedConv, pyg_nn.SGConv):
    r"""The simple graph convolution of `"Simplifying Graph Convolutional Networks"
    <https://arxiv.org/abs/1902.07153>`_, as :class:`torch_geometric.nn.SGConv` (same
    arguments, parameters and ``state_dict`` keys):

    .. math::
        \mathbf{X}^{\prime} = \hat{\mathbf{A}}^K \mathbf{X} \mathbf{\Theta}.

    Kept for backward: :math:`\hat{\mathbf{A}}^K \mathbf{X}` at ``config.bits`` bits (for
    :math:`\nabla\mathbf{\Theta}`) and the normalised graph, once per adjacency in the model's
    graph cache; the :math:`K` propagation steps keep nothing. With ``cached=True`` the
    propagated features of the first call are reused, as in PyG. Static-graph ``[B, N, F]``
    features and a registered PyG message-passing hook take PyG's own forward, under the
    converted model's generic pipeline.

    Args:
        in_channels (int): size of each input sample (``-1`` for lazy initialisation).
        out_channels (int): size of each output sample.
        K (int, optional): number of hops :math:`K`. (default: :obj:`1`)
        cached (bool, optional): cache :math:`\hat{\mathbf{A}}^K \mathbf{X}` of the first
            call. (default: :obj:`False`)
        add_self_loops (bool, optional): (default: :obj:`True`)
        bias (bool, optional): (default: :obj:`True`)
        config (Config, optional): storage of the context. (default: ``Config()``, 2 bits)
        **kwargs (optional): of :class:`torch_geometric.nn.conv.MessagePassing`.

    Example:
        >>> conv = gnnact.nn.SGConv(16, 4, K=2)
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 400))
        >>> conv(x, edge_index).shape
        torch.Size([100, 4])
    """

    propagate_type: ClassVar[dict] = {"x": Tensor, "edge_weight": OptTensor}

    def __init__(self, in_channels: int, out_channels: int, K: int = 1, cached: bool = False,
                 add_self_loops: bool = True, bias: bool = True, *,
                 config: Config | None = None, **kwargs: Any) -> None:
        super().__init__(in_channels, out_channels, K=K, cached=cached,
                         add_self_loops=add_self_loops, bias=bias, **kwargs)
        self._init_gnnact(config)

    _compiled_shape = channels_shape

    def forward(self, x: Tensor, edge_index: Any, edge_weight: OptTensor = None) -> Tensor:
        if x.dim() != 2 or self._compressed_reduce() != "sum" or self._takes_pyg_path():
            return super().forward(x, edge_index, edge_weight)
        if self._cached_x is None:
            graph, value = _graph(self, edge_index, edge_weight, x)
            for _ in range(self.K):
                x = ops.spmm(x, graph, value, "sum", self.config)
            if self.cached:
                self._cached_x = x
        else:
            x = self._cached_x.detach()
        return ops.linear(x, linear_weight(self.lin, x), self.lin.bias, self.config)
