r"""``GCNConv`` whose context is compressed."""

from __future__ import annotations

from typing import Any, ClassVar

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import Adj, OptTensor

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._lazy import linear_weight
from gnnact.nn.conv.base import CompressedConv, add_into, channels_shape
from gnnact.nn.conv.gcn_cache import gcn_graph
from gnnact.ops.graph import graph_cache_for

__all__ = ["GCNConv"]


class GCNConv(CompressedConv, pyg_nn.GCNConv):
    r"""The graph convolution of `"Semi-supervised Classification with Graph Convolutional
    Networks" <https://arxiv.org/abs/1609.02907>`_, as :class:`torch_geometric.nn.GCNConv`
    (same arguments, parameters and ``state_dict`` keys), storing its context compressed:

    .. math::
        \mathbf{X}^{\prime} = \hat{\mathbf{D}}^{-1/2} \hat{\mathbf{A}}
        \hat{\mathbf{D}}^{-1/2} \mathbf{X} \mathbf{\Theta} + \mathbf{b}.

    Kept for backward: :math:`\mathbf{X}` at ``config.bits`` bits (for
    :math:`\nabla\mathbf{\Theta}`) and the normalised graph, which is built once per adjacency
    and cached; the aggregation itself keeps no node features
    (:math:`\nabla(\mathbf{X}\mathbf{\Theta}) = \hat{A}^\top \nabla \mathbf{X}'`). PyG's layer
    keeps :math:`\mathbf{X}` in full precision plus the normalised edge index and weights of
    every layer. With ``config=Config(bits=32)`` the outputs and gradients equal PyG's.

    The compressed path covers ``aggr`` of ``"add"`` (the default), ``"sum"`` and ``"mean"``,
    and static graphs (``x`` of shape :math:`(B, |\mathcal{V}|, F_{in})`, aggregated as one
    :math:`|\mathcal{V}| \times B F` matrix). Any other ``aggr``, a registered
    message-passing hook, explain mode or ``decomposed_layers > 1`` run PyG's own forward (see
    ``gnnact.nn.conv.base``). ``cached=True`` fills ``_cached_edge_index`` /
    ``_cached_adj_t`` as PyG does (see ``gnnact.nn.conv.gcn_cache``).

    Args:
        in_channels (int): size of each input sample (``-1`` for lazy initialisation).
        out_channels (int): size of each output sample.
        improved (bool, optional): :math:`\hat{A} = A + 2I`. (default: :obj:`False`)
        cached (bool, optional): cache the normalised graph on the first call, whatever the
            later input. (default: :obj:`False`)
        add_self_loops (bool, optional): (default: ``normalize``)
        normalize (bool, optional): symmetric normalisation. (default: :obj:`True`)
        bias (bool, optional): (default: :obj:`True`)
        config (Config, optional): storage of the context. (default: ``Config()``, 2 bits)
        **kwargs (optional): of :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`(B, |\mathcal{V}|, F_{in})`, edge indices :math:`(2, |\mathcal{E}|)` or a
          sparse ``adj_t``, edge weights :math:`(|\mathcal{E}|)` *(optional)*
        - **output:** node features :math:`(|\mathcal{V}|, F_{out})` or
          :math:`(B, |\mathcal{V}|, F_{out})`

    Example:
        >>> conv = gnnact.nn.GCNConv(16, 32, config=gnnact.Config(bits=2))
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 400))
        >>> conv(x, edge_index).shape
        torch.Size([100, 32])
        >>> import torch_geometric
        >>> gnnact.convert(torch_geometric.nn.GCNConv(16, 32))  # a PyG layer, in place
        GCNConv(16, 32)
    """

    # Set explicitly: PyG generates propagate() from the class source otherwise (DESIGN §7).
    propagate_type: ClassVar[dict] = {"x": Tensor, "edge_weight": OptTensor}

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False,
                 cached: bool = False, add_self_loops: bool | None = None,
                 normalize: bool = True, bias: bool = True, *, config: Config | None = None,
                 **kwargs: Any) -> None:
        super().__init__(in_channels, out_channels, improved=improved, cached=cached,
                         add_self_loops=add_self_loops, normalize=normalize, bias=bias, **kwargs)
        self._init_gnnact(config)

    def _init_gnnact(self, config: Config | None) -> None:
        super()._init_gnnact(config)
        self._cached_graph = None

    def reset_parameters(self) -> None:
        super().reset_parameters()  # empties PyG's cache, and so the graph built from it
        self._cached_graph = None

    _compiled_shape = channels_shape

    def forward(self, x: Tensor, edge_index: Adj, edge_weight: OptTensor = None) -> Tensor:
        reduce = self._compressed_reduce()
        if isinstance(x, (tuple, list)) or reduce is None or self._takes_pyg_path():
            # PyG's own forward: its error for bipartite input, its other aggregations, and
            # its hooks and explainers (see gnnact.nn.conv.base).
            return super().forward(x, edge_index, edge_weight)
        graph, value = gcn_graph(self, edge_index, edge_weight, x.size(self.node_dim), x.dtype,
                                 improved=self.improved, cache=graph_cache_for(self))
        weight = linear_weight(self.lin, x)
        if x.dim() == 2 and self.node_dim % 2 == 0 and ops.fuses(x, weight, value, graph):
            # One op by row blocks (gnnact.ops.aggregate_linear): two full-size tensors at
            # once in each direction, where the composed ops below hold three.
            return ops.aggregate_linear(x, graph, weight, self.bias, None, value, reduce,
                                        self.config)
        h = ops.linear(x, weight, None, self.config)
        out = self._aggregate(h, graph, value, reduce, self.config)
        del h  # kept compressed by the linear, if at all: freed before the bias is added
        if self.bias is not None:
            out = add_into(out, self.bias)
        return out
