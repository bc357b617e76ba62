r"""``GATConv`` whose context is compressed."""

from __future__ import annotations

from typing import Any, ClassVar

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import Adj, OptPairTensor, OptTensor, Size, SparseTensor

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._lazy import linear_weight
from gnnact.nn.conv.attention import attention_graph, attention_output, sparse_edge_features
from gnnact.nn.conv.base import CompressedConv, heads_shape
from gnnact.ops.gat import gat_attention

__all__ = ["GATConv"]


class GATConv(CompressedConv, pyg_nn.GATConv):
    r"""The graph attentional operator of `"Graph Attention Networks"
    <https://arxiv.org/abs/1710.10903>`_, as :class:`torch_geometric.nn.GATConv` (same
    arguments, parameters, ``state_dict`` keys and return values), storing its context
    compressed:

    .. math::
        \mathbf{x}^{\prime}_i = \alpha_{i,i}\mathbf{\Theta}_{t}\mathbf{x}_{i} +
        \sum_{j \in \mathcal{N}(i)} \alpha_{i,j}\mathbf{\Theta}_{s}\mathbf{x}_{j},
        \qquad
        \alpha_{i,j} = \frac{\exp\left(\mathrm{LeakyReLU}\left(
        \mathbf{a}^{\top}_{s} \mathbf{\Theta}_{s}\mathbf{x}_j + \mathbf{a}^{\top}_{t}
        \mathbf{\Theta}_{t}\mathbf{x}_i + \mathbf{a}^{\top}_{e} \mathbf{\Theta}_{e}
        \mathbf{e}_{i,j}\right)\right)}{\sum_{k \in \mathcal{N}(i) \cup \{ i \}}
        \exp\left(\mathrm{LeakyReLU}\left(\cdots\right)\right)},

    per head, concatenated (``concat=True``) or averaged, plus the optional residual
    projection and bias.

    Kept for backward (:math:`b` = ``config.bits``, :math:`a` = ``config.attention``):

    * the layer input :math:`\mathbf{x}` at :math:`b` bits, one packed copy shared by
      :math:`\mathbf{\Theta}` (``lin``) and the residual projection (``res``); with bipartite
      input the target features too;
    * the projected features :math:`\mathbf{\Theta}_s\mathbf{x}` (:math:`N \times H C`) at
      :math:`b` bits, and :math:`\mathbf{\Theta}_t\mathbf{x}` only if it is a different tensor;
    * :math:`\alpha` (:math:`E \times H`) at :math:`a` bits (8 by default) in groups of
      consecutive edges of one head, and two 1-bit masks per edge and head (LeakyReLU sign,
      dropout keep mask in training);
    * with ``edge_dim``: the edge features (:math:`E \times D`) at :math:`b` bits (the
      attention vector is folded into the edge weight, :math:`\mathbf{a}_e^\top
      \mathbf{\Theta}_e`, so no :math:`E \times H C` edge projection is kept either).

    PyG's layer keeps the gathered messages :math:`\mathbf{\Theta}_s \mathbf{x}_j` for every
    edge (:math:`E \times H C` in full precision) plus :math:`\alpha` and its intermediates;
    here no tensor with :math:`E H C` values is kept (see :func:`gnnact.ops.gat_attention`). With
    ``config=Config(bits=32)`` outputs and gradients equal PyG's to float rounding, and in
    training mode on the CPU the dropout mask is drawn as PyG draws it (same seed, same mask).

    The fused op replaces ``edge_updater``/``propagate``; the layer runs PyG's own forward
    instead when PyG's would show the difference: a registered message-passing hook, explain
    mode (``GNNExplainer`` edge masks), ``decomposed_layers > 1``, an ``aggr`` other than
    ``"add"``/``"sum"`` (see ``gnnact.nn.conv.base``), and ``x`` of shape
    :math:`(B, |\mathcal{V}|, F)`, which PyG rejects ("Static graphs not supported").

    Args:
        in_channels (int or tuple): size of each input sample (``-1`` for lazy
            initialisation), or a pair for bipartite graphs (separate source/target weights).
        out_channels (int): size of each output sample per head.
        heads (int, optional): number of attention heads :math:`H`. (default: :obj:`1`)
        concat (bool, optional): concatenate the heads (else average them).
            (default: :obj:`True`)
        negative_slope (float, optional): LeakyReLU slope. (default: :obj:`0.2`)
        dropout (float, optional): dropout probability of the attention coefficients.
            (default: :obj:`0.0`)
        add_self_loops (bool, optional): (default: :obj:`True`)
        edge_dim (int, optional): edge feature dimensionality. (default: :obj:`None`)
        fill_value (float or torch.Tensor or str, optional): edge features of the added
            self-loops, as in PyG. (default: :obj:`"mean"`)
        bias (bool, optional): (default: :obj:`True`)
        residual (bool, optional): learnable skip connection. (default: :obj:`False`)
        config (Config, optional): storage of the context. (default: ``Config()``, 2 bits)
        **kwargs (optional): of :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite, edge
          indices :math:`(2, |\mathcal{E}|)`, ``EdgeIndex``, or a sparse ``adj_t``, edge
          features :math:`(|\mathcal{E}|, D)` *(optional)*
        - **output:** node features :math:`(|\mathcal{V}_t|, H F_{out})` (or :math:`F_{out}`
          when ``concat=False``), and with ``return_attention_weights`` PyG's
          ``(edge_index, alpha)`` pair (or the sparse adjacency holding ``alpha``)

    Example:
        >>> conv = gnnact.nn.GATConv(16, 8, heads=4, config=gnnact.Config(bits=2))
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 400))
        >>> out, (looped, alpha) = conv(x, edge_index, return_attention_weights=True)
        >>> out.shape  # 4 heads of 8 channels, concatenated
        torch.Size([100, 32])
        >>> alpha.shape == (looped.size(1), 4)  # one coefficient per edge and head
        True
    """

    # Set explicitly: PyG generates propagate() from the class source otherwise (DESIGN §7).
    propagate_type: ClassVar[dict] = {"x": OptPairTensor, "alpha": Tensor}
    edge_updater_type: ClassVar[dict] = {"alpha": OptPairTensor, "edge_attr": OptTensor}

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: int | None = None,
                 fill_value: float | Tensor | str = "mean", bias: bool = True,
                 residual: bool = False, *, config: Config | None = None,
                 **kwargs: Any) -> None:
        super().__init__(in_channels, out_channels, heads=heads, concat=concat,
                         negative_slope=negative_slope, dropout=dropout,
                         add_self_loops=add_self_loops, edge_dim=edge_dim,
                         fill_value=fill_value, bias=bias, residual=residual, **kwargs)
        self._init_gnnact(config)

    @classmethod
    def _adopt(cls, module: pyg_nn.GATConv, config: Config | None) -> GATConv:
        """Turn a PyG ``GATConv`` into this class in place (same parameters and buffers)."""
        if not isinstance(module, pyg_nn.GATConv):
            raise TypeError(f"expected a torch_geometric.nn.GATConv, got "
                            f"{type(module).__name__}")
        return super()._adopt(module, config)

    def _project(self, lin: Any, x: Tensor) -> Tensor:
        """``lin(x)`` keeping ``x`` compressed (shared with every other consumer of ``x``)."""
        return ops.linear(x, linear_weight(lin, x), lin.bias, self.config)

    def _edge_logits(self, edge_attr: Tensor) -> Tensor:
        r""":math:`a^E_{e,h} = \langle \mathbf{\Theta}_e \mathbf{e}_e, \mathbf{a}_{e,h}\rangle`
        as one :math:`D \to H` linear map, so that only :math:`\mathbf{e}` (:math:`E \times
        D`) is kept, compressed, instead of the :math:`E \times H C` projection."""
        H, C = self.heads, self.out_channels
        if edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        weight = linear_weight(self.lin_edge, edge_attr)
        folded = (weight.view(H, C, -1) * self.att_edge.view(H, C, 1)).sum(dim=1)  # [H, D]
        return ops.linear(edge_attr, folded, None, self.config)

    _compiled_shape = heads_shape

    def forward(  # type: ignore[override]
        self,
        x: Tensor | OptPairTensor,
        edge_index: Adj,
        edge_attr: OptTensor = None,
        size: Size = None,
        return_attention_weights: bool | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]] | tuple[Tensor, SparseTensor]:
        r"""Runs the forward pass of the module (arguments and return values as PyG's).

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): the input node features.
            edge_index (torch.Tensor or SparseTensor): the adjacency.
            edge_attr (torch.Tensor, optional): the edge features. (default: :obj:`None`)
            size ((int, int), optional): the shape of the adjacency. (default: :obj:`None`)
            return_attention_weights (bool, optional): if truthy, also return
                ``(edge_index, alpha)`` (self-loops included), or the sparse adjacency holding
                ``alpha``. (default: :obj:`None`)
        """
        static = (x if isinstance(x, Tensor) else x[0]).dim() != 2
        if static or self._compressed_reduce() != "sum" or self._takes_pyg_path():
            # PyG's own forward: its error for static graphs, its other aggregations, hooks
            # and explainers (see gnnact.nn.conv.base).
            return super().forward(x, edge_index, edge_attr, size, return_attention_weights)

        H, C = self.heads, self.out_channels
        res: Tensor | None = None
        if isinstance(x, Tensor):
            if self.res is not None:
                res = self._project(self.res, x)
            if self.lin is not None:
                x_src = x_dst = self._project(self.lin, x).view(-1, H, C)
            else:
                x_src = self._project(self.lin_src, x).view(-1, H, C)
                x_dst = self._project(self.lin_dst, x).view(-1, H, C)
        else:
            x_src, x_dst = x
            if x_dst is not None and self.res is not None:
                res = self._project(self.res, x_dst)
            lin_src = self.lin if self.lin is not None else self.lin_src
            lin_dst = self.lin if self.lin is not None else self.lin_dst
            x_src = self._project(lin_src, x_src).view(-1, H, C)
            if x_dst is not None:
                x_dst = self._project(lin_dst, x_dst).view(-1, H, C)

        want_alpha = bool(return_attention_weights)
        graph, edge_index, edge_attr = attention_graph(
            self, edge_index, edge_attr, size, x_src.size(0),
            None if x_dst is None else x_dst.size(0), want_alpha)

        a_edge = None
        if self.lin_edge is not None and graph.num_edges > 0:
            if edge_attr is None:
                edge_attr = sparse_edge_features(edge_index)
            if edge_attr is not None:
                a_edge = self._edge_logits(edge_attr)

        result = gat_attention(x_src, x_dst, self.att_src, self.att_dst, graph, a_edge=a_edge,
                               negative_slope=self.negative_slope, dropout=self.dropout,
                               training=self.training, return_attention=want_alpha,
                               config=self.config)
        return attention_output(self, result, want_alpha, res, edge_index)

