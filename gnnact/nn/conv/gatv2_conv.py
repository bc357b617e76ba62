r"""``GATv2Conv`` whose context is compressed."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import Adj, OptTensor, PairTensor, SparseTensor

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._lazy import linear_weight
from gnnact.nn.conv.attention import attention_graph, attention_output, sparse_edge_features
from gnnact.nn.conv.base import CompressedConv, heads_shape
from gnnact.ops.gatv2 import gatv2_attention

__all__ = ["GATv2Conv"]

#: Aggregations the fused op computes (a weighted sum); PyG's GATv2Conv default is "add".
SUPPORTED_AGGR = ("add", "sum")


class GATv2Conv(CompressedConv, pyg_nn.GATv2Conv):
    r"""The GATv2 operator of `"How Attentive are Graph Attention Networks?"
    <https://arxiv.org/abs/2105.14491>`_, as :class:`torch_geometric.nn.GATv2Conv` (same
    arguments, parameters, ``state_dict`` keys and return values), storing its context
    compressed:

    .. math::
        \mathbf{x}^{\prime}_i = \sum_{j \in \mathcal{N}(i) \cup \{ i \}}
        \alpha_{i,j}\mathbf{\Theta}_{s}\mathbf{x}_{j}, \qquad
        \alpha_{i,j} = \frac{\exp\left(\mathbf{a}^{\top}\mathrm{LeakyReLU}\left(
        \mathbf{\Theta}_{t} \mathbf{x}_i + \mathbf{\Theta}_{s} \mathbf{x}_j
        + \mathbf{\Theta}_{e} \mathbf{e}_{i,j}\right)\right)}
        {\sum_{k \in \mathcal{N}(i) \cup \{ i \}} \exp\left(\mathbf{a}^{\top}
        \mathrm{LeakyReLU}\left(\cdots\right)\right)},

    per head (:math:`\mathbf{\Theta}_{s}` is ``lin_l``, :math:`\mathbf{\Theta}_{t}` is
    ``lin_r``, the same with ``share_weights``), concatenated (``concat=True``) or averaged,
    plus the optional residual projection and bias.

    Kept for backward (:math:`b` = ``config.bits``, :math:`a` = ``config.attention``; see
    ``gnnact.ops.gatv2.gatv2_attention``):

    * the layer input :math:`\mathbf{x}` at :math:`b` bits (or by reference when it is a
      resident input), one packed copy shared by ``lin_l``, ``lin_r`` and ``res`` (restored
      once for the three when :math:`\mathbf{x}` needs no gradient: one product over their
      stacked weights); with bipartite input the target features too;
    * :math:`\mathbf{\Theta}_s\mathbf{x}` (:math:`N \times H C`) at :math:`b` bits twice: the
      shared copy, and one rounded independently that only :math:`\nabla\mathbf{a}` reads
      (one rounding read by both factors of :math:`\nabla\mathbf{a}` would bias it by its
      variance); :math:`\mathbf{\Theta}_t\mathbf{x}` at :math:`b` bits only if it is a
      different tensor (not with ``share_weights`` on one input). Neither extra copy is kept
      while ``att`` needs no gradient;
    * :math:`\alpha` (:math:`E \times H`) at :math:`a` bits (8 by default), the dropout keep
      mask in training (1 bit per edge and head), and the LeakyReLU sign mask, 1 bit per edge,
      head and channel;
    * with ``edge_dim``: the edge features (:math:`E \times D`) at :math:`b` bits (by reference
      when they are the caller's resident tensor, i.e. no self-loops were added), never their
      :math:`E \times H C` projection.

    That is :math:`C + a (+ 1)` bits per edge and head (plus the :math:`a`-bit groups' 8 bytes
    per ``group_size`` values), and :math:`3 C (b + 64/G)` bits per node and head (:math:`2 C
    (\dots)` with shared weights), against PyG's three :math:`E \times H \times C` tensors in
    full precision (the gathered messages, the LeakyReLU input and output: :math:`96 C` bits
    per edge and head in float32) plus :math:`\alpha` and the softmax intermediates. No tensor
    with :math:`E H C` values is kept or materialised whole. With ``config=Config(bits=32)``
    outputs and gradients equal PyG's to float rounding, and in training mode on the CPU the
    dropout mask is drawn as PyG draws it (same seed, same mask).

    The fused op replaces ``edge_updater``/``propagate``. Where they must run, the layer runs
    PyG's own forward instead (compressed by the generic pipeline inside a converted model,
    uncompressed elsewhere): in explain mode (``GNNExplainer`` edge masks) and while PyG
    propagate/message/aggregate/edge-update hooks are registered.

    Args:
        in_channels (int or tuple): size of each input sample (``-1`` for lazy
            initialisation), or a pair for bipartite graphs.
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
        share_weights (bool, optional): one matrix for source and target,
            :math:`\mathbf{\Theta}_{s} = \mathbf{\Theta}_{t}`. (default: :obj:`False`)
        residual (bool, optional): learnable skip connection. (default: :obj:`False`)
        config (Config, optional): storage of the context. (default: ``Config()``, 2 bits)
        **kwargs (optional): of :class:`torch_geometric.nn.conv.MessagePassing`; ``aggr``
            must be ``"add"`` or ``"sum"``.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite, edge
          indices :math:`(2, |\mathcal{E}|)`, ``EdgeIndex``, or a sparse ``adj_t``, edge
          features :math:`(|\mathcal{E}|, D)` *(optional)*
        - **output:** node features :math:`(|\mathcal{V}_t|, H F_{out})` (or :math:`F_{out}`
          when ``concat=False``), and with ``return_attention_weights`` PyG's
          ``(edge_index, alpha)`` pair (or the sparse adjacency holding ``alpha``)

    Raises:
        ValueError: an ``aggr`` other than ``"add"``/``"sum"``.
        TypeError: a ``config`` that is not a :class:`gnnact.Config`.

    Example:
        >>> conv = gnnact.nn.GATv2Conv(16, 8, heads=4, config=gnnact.Config(bits=2))
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 400))
        >>> out, (looped, alpha) = conv(x, edge_index, return_attention_weights=True)
        >>> out.shape  # 4 heads of 8 channels, concatenated
        torch.Size([100, 32])
        >>> alpha.shape == (looped.size(1), 4)  # one coefficient per edge and head
        True
    """

    # Set explicitly: PyG generates propagate() from the class source otherwise (DESIGN §7).
    propagate_type: ClassVar[dict] = {"x": PairTensor, "alpha": Tensor}
    edge_updater_type: ClassVar[dict] = {"x": PairTensor, "edge_attr": OptTensor}

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int, heads: int = 1,
                 concat: bool = True, negative_slope: float = 0.2, dropout: float = 0.0,
                 add_self_loops: bool = True, edge_dim: int | None = None,
                 fill_value: float | Tensor | str = "mean", bias: bool = True,
                 share_weights: bool = False, residual: bool = False, *,
                 config: Config | None = None, **kwargs: Any) -> None:
        aggr = kwargs.get("aggr", "add")
        if not isinstance(aggr, str) or aggr not in SUPPORTED_AGGR:
            raise ValueError(f"gnnact GATv2Conv supports aggr in {SUPPORTED_AGGR}, got {aggr!r}")
        super().__init__(in_channels, out_channels, heads=heads, concat=concat,
                         negative_slope=negative_slope, dropout=dropout,
                         add_self_loops=add_self_loops, edge_dim=edge_dim,
                         fill_value=fill_value, bias=bias, share_weights=share_weights,
                         residual=residual, **kwargs)
        self._init_gnnact(config)

    def _init_gnnact(self, config: Config | None) -> None:
        if config is not None and not isinstance(config, Config):
            raise TypeError(f"config must be a gnnact.Config, got {type(config).__name__}")
        super()._init_gnnact(config)

    @classmethod
    def supports(cls, module: Any) -> bool:
        """Whether a PyG ``GATv2Conv`` can be converted (its aggregation is a sum)."""
        return isinstance(module.aggr, str) and module.aggr in SUPPORTED_AGGR

    @classmethod
    def _adopt(cls, module: pyg_nn.GATv2Conv, config: Config | None) -> GATv2Conv:
        """Turn a PyG ``GATv2Conv`` into this class in place (same parameters and buffers)."""
        if not isinstance(module, pyg_nn.GATv2Conv):
            raise TypeError(f"expected a torch_geometric.nn.GATv2Conv, got "
                            f"{type(module).__name__}")
        if not cls.supports(module):
            raise ValueError(f"gnnact GATv2Conv supports aggr in {SUPPORTED_AGGR}, got "
                             f"{module.aggr!r}")
        return super()._adopt(module, config)

    def _project(self, lin: Any, x: Tensor) -> Tensor:
        """``lin(x)`` keeping ``x`` compressed (shared with every other consumer of ``x``)."""
        return ops.linear(x, linear_weight(lin, x), lin.bias, self.config)

    def _project_all(self, lins: list[Any], x: Tensor) -> list[Tensor]:
        r"""``[lin(x) for lin in lins]``, by one linear map over their stacked weights when
        ``x`` is compressed: each map's backward restored the shared copy of ``x`` on its own
        (on CiteSeer's 49 MB dropped-out features, a second full restore a step); stacked,
        backward restores it once and reads it in one product,
        :math:`\nabla [W_l; W_r] = [\nabla Y_l, \nabla Y_r]^\top \hat X`. Only for an
        ``x`` that needs no gradient (the input features, the largest): :math:`\nabla X` would
        need the stacked weight kept, a copy where the parameters cost nothing. Exact runs
        (``Config(bits=32)``) keep PyG's separate products, and their rounding."""
        if (len(lins) == 1 or x.requires_grad or self.config.exact
                or self.config.keeps(x)):
            return [self._project(lin, x) for lin in lins]
        weights = [linear_weight(lin, x) for lin in lins]
        bias = None
        if any(lin.bias is not None for lin in lins):  # (res has none: zeros in its place)
            bias = torch.cat([w.new_zeros(w.size(0)) if lin.bias is None else lin.bias
                              for lin, w in zip(lins, weights, strict=True)])
        out = ops.linear(x, torch.cat(weights), bias, self.config)
        return list(out.split([w.size(0) for w in weights], dim=-1))

    _compiled_shape = heads_shape

    def forward(  # type: ignore[override]
        self,
        x: Tensor | PairTensor,
        edge_index: Adj,
        edge_attr: OptTensor = None,
        return_attention_weights: bool | None = None,
    ) -> Tensor | tuple[Tensor, tuple[Tensor, Tensor]] | tuple[Tensor, SparseTensor]:
        r"""Runs the forward pass of the module (arguments and return values as PyG's).

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor)): the input node features.
            edge_index (torch.Tensor or SparseTensor): the adjacency.
            edge_attr (torch.Tensor, optional): the edge features. (default: :obj:`None`)
            return_attention_weights (bool, optional): if truthy, also return
                ``(edge_index, alpha)`` (self-loops included), or the sparse adjacency holding
                ``alpha``. (default: :obj:`None`)

        Raises:
            ValueError: missing target features in a pair, edge features on a layer without
                ``edge_dim``, or an adjacency whose size does not match the features (features
                that are not 2-D get PyG's own error).
        """
        static = (x if isinstance(x, Tensor) else x[0]).dim() != 2
        if static or self._takes_pyg_path():
            # PyG's own forward: its error for static graphs, hooks and explainers (see
            # gnnact.nn.conv.base).
            return super().forward(x, edge_index, edge_attr, return_attention_weights)

        H, C = self.heads, self.out_channels
        res: Tensor | None = None
        if isinstance(x, Tensor):
            lins = [self.lin_l, *(() if self.share_weights else (self.lin_r,)),
                    *(() if self.res is None else (self.res,))]
            projected = self._project_all(lins, x)
            if self.res is not None:
                res = projected.pop()
            x_l = projected[0].view(-1, H, C)
            x_r = x_l if self.share_weights else projected[1].view(-1, H, C)
        else:
            x_l, x_r = x
            if x_r is None:
                raise ValueError("GATv2Conv needs target features: got x[1]=None")
            if self.res is not None:
                res = self._project(self.res, x_r)
            x_l = self._project(self.lin_l, x_l).view(-1, H, C)
            x_r = self._project(self.lin_r, x_r).view(-1, H, C)

        want_alpha = bool(return_attention_weights)
        graph, edge_index, edge_attr = attention_graph(
            self, edge_index, edge_attr, None, x_l.size(0), x_r.size(0), want_alpha)
        if edge_attr is None:
            edge_attr = sparse_edge_features(edge_index)
        w_edge = None
        if edge_attr is not None:
            if self.lin_edge is None:
                raise ValueError("GATv2Conv got edge features (edge_attr, or the values of a "
                                 "sparse adjacency) but was built without edge_dim")
            if edge_attr.dim() == 1:
                edge_attr = edge_attr.view(-1, 1)
            w_edge = linear_weight(self.lin_edge, edge_attr)

        result = gatv2_attention(x_l, x_r, self.att, graph, edge_attr=edge_attr, w_edge=w_edge,
                                 negative_slope=self.negative_slope, dropout=self.dropout,
                                 training=self.training, return_attention=want_alpha,
                                 config=self.config)
        return attention_output(self, result, want_alpha, res, edge_index)
