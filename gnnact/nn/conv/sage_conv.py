r"""``SAGEConv`` whose context is compressed."""

from __future__ import annotations

from typing import Any, ClassVar

import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.typing import Adj, OptPairTensor, Size

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._lazy import linear_weight
from gnnact.nn.conv.base import CompressedConv, add_into, propagate_sizes
from gnnact.ops.graph import graph_cache_for, is_sparse_tensor

__all__ = ["SAGEConv"]


class SAGEConv(CompressedConv, pyg_nn.SAGEConv):
    r"""The GraphSAGE operator of `"Inductive Representation Learning on Large Graphs"
    <https://arxiv.org/abs/1706.02216>`_, as :class:`torch_geometric.nn.SAGEConv` (same
    arguments, parameters and ``state_dict`` keys), storing its context compressed:

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i + \mathbf{W}_2 \cdot
        \mathrm{mean}_{j \in \mathcal{N}(i)} \mathbf{x}_j.

    It is computed as :math:`\mathbf{W}_1 \mathbf{x}_i + \mathrm{mean}_{j}(\mathbf{W}_2
    \mathbf{x}_j)`, equal up to round-off, so that both linear maps read :math:`\mathbf{x}`.
    Kept for backward: :math:`\mathbf{x}` once, at ``config.bits`` bits (or nothing if it is
    the output of a compressed BatchNorm/ReLU/dropout, which is rebuilt from their context),
    and the cached graph; the aggregation keeps no node features.
    With ``project=True`` the projection's input and a 1-bit ReLU mask are kept as well.
    ``normalize=True`` applies :func:`torch.nn.functional.normalize`, whose context stays in
    full precision.

    Every ``aggr`` PyG accepts is accepted. The compressed path above covers ``"mean"`` (the
    default), ``"sum"`` and ``"add"`` (also as a plain ``MeanAggregation()`` or
    ``SumAggregation()``), for edge indices, sparse adjacencies, bipartite and static graphs
    (``x`` of shape :math:`(B, |\mathcal{V}|, F_{in})`, aggregated as one
    :math:`|\mathcal{V}| \times B F` matrix). Any other aggregation (``"max"``, ``"min"``,
    ``"std"``, ``"softmax"``, ``"lstm"``, an ``MLPAggregation``, a list for
    multi-aggregation, ...), a registered message-passing hook, explain mode or
    ``decomposed_layers > 1`` run PyG's own forward (see ``gnnact.nn.conv.base``); in a
    converted model its context goes through the model's generic saved-tensor pipeline.

    Args:
        in_channels (int or tuple): size of each input sample (``-1`` for lazy
            initialisation), or a pair for bipartite graphs.
        out_channels (int): size of each output sample.
        aggr (str or list or Aggregation, optional): the neighbourhood aggregation, as PyG's.
            (default: :obj:`"mean"`)
        normalize (bool, optional): :math:`\ell_2`-normalise the output. (default: :obj:`False`)
        root_weight (bool, optional): add the transformed root features. (default: :obj:`True`)
        project (bool, optional): project neighbours first. (default: :obj:`False`)
        bias (bool, optional): (default: :obj:`True`)
        config (Config, optional): storage of the context. (default: ``Config()``, 2 bits)
        **kwargs (optional): of :class:`torch_geometric.nn.conv.MessagePassing`
            (``aggr_kwargs``, ``flow``, ...).

    Shapes:
        - **inputs:** node features :math:`(|\mathcal{V}|, F_{in})` (or
          :math:`(B, |\mathcal{V}|, F_{in})`) or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite, edge
          indices :math:`(2, |\mathcal{E}|)` or a sparse ``adj_t``
        - **outputs:** node features :math:`(|\mathcal{V}|, F_{out})` (or
          :math:`(B, |\mathcal{V}|, F_{out})`) or :math:`(|\mathcal{V_t}|, F_{out})` if
          bipartite

    Example:
        >>> conv = gnnact.nn.SAGEConv(16, 32, config=gnnact.Config(bits=2))
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 400))
        >>> conv(x, edge_index).shape
        torch.Size([100, 32])
        >>> conv = gnnact.nn.SAGEConv((16, 8), 32)  # bipartite: 100 sources, 10 targets
        >>> x_dst, edge_index = torch.randn(10, 8), torch.randint(0, 10, (2, 400))
        >>> conv((x, x_dst), edge_index).shape
        torch.Size([10, 32])
    """

    # Set explicitly: PyG generates propagate() from the class source otherwise (DESIGN §7).
    propagate_type: ClassVar[dict] = {"x": OptPairTensor}

    def __init__(self, in_channels: int | tuple[int, int], out_channels: int,
                 aggr: str | list[str] | Aggregation | None = "mean", normalize: bool = False,
                 root_weight: bool = True, project: bool = False, bias: bool = True, *,
                 config: Config | None = None, **kwargs: Any) -> None:
        super().__init__(in_channels, out_channels, aggr=aggr, normalize=normalize,
                         root_weight=root_weight, project=project, bias=bias, **kwargs)
        self._init_gnnact(config)

    def _compiled_shape(self, x: Tensor, *args: Any, **kwargs: Any) -> list[int] | None:
        return [x.size(0), self.out_channels] if x.dim() == 2 else None

    def forward(self, x: Tensor | OptPairTensor, edge_index: Adj, size: Size = None) -> Tensor:
        reduce = self._compressed_reduce()
        if reduce is None or self._takes_pyg_path():
            # PyG's own forward: its other aggregations (max, lstm, MLP, multi-aggregation,
            # ...), hooks and explainers (see gnnact.nn.conv.base).
            return super().forward(x, edge_index, size)
        shared = isinstance(x, Tensor)  # one tensor for both sides: the root term reads it
        if shared:
            x = (x, x)
        cfg = self.config
        x_src, x_dst = x
        if self.project and hasattr(self, "lin"):
            x_src = ops.relu(ops.linear(x_src, self.lin.weight, self.lin.bias, cfg))
        dim = self.node_dim
        n_src, n_dst = propagate_sizes(self, edge_index, size, x_src.size(dim),
                                       None if x_dst is None else x_dst.size(dim))
        # PyG drops a SparseTensor's values here (set_value(None)); torch.sparse keeps them.
        graph = ops.graph_from(edge_index, n_src, n_dst, flow=self.flow,
                               cache=graph_cache_for(self),
                               own_values=not is_sparse_tensor(edge_index), per_edge=False,
                               keep_dst=False)
        if shared and x_src is x[0] and x_src.dim() == 2 and self.node_dim % 2 == 0:
            # One op by row blocks (gnnact.ops.aggregate_linear): two full-size tensors at
            # once in each direction, where the composed ops below hold three.
            weight = linear_weight(self.lin_l, x_src)
            root = linear_weight(self.lin_r, x_src) if self.root_weight else None
            if ops.fuses(x_src, weight, graph.value, graph, root is not None):
                out = ops.aggregate_linear(x_src, graph, weight, self.lin_l.bias, root, None,
                                           reduce, cfg)
                return F.normalize(out, p=2.0, dim=-1) if self.normalize else out
        # mean_j(x_j) W = mean_j(x_j W): transform first, so that this linear map keeps x_src
        # (shared with lin_r, or rebuilt from the previous layer's context) instead of a
        # compressed copy of the aggregate; the bias is added after aggregating, so isolated
        # nodes still get exactly the bias, as in PyG.
        h = ops.linear(x_src, linear_weight(self.lin_l, x_src), None, cfg)
        out = self._aggregate(h, graph, None, reduce, cfg)
        del h  # kept compressed by the linear, if at all: freed before the sums below
        if self.lin_l.bias is not None:
            # In the product's dtype, as inside PyG's lin_l: under autocast a float32 bias
            # would otherwise promote the bfloat16/float16 output to float32.
            out = add_into(out, self.lin_l.bias.to(out.dtype))
        if self.root_weight and x_dst is not None:
            out = add_into(out, ops.linear(x_dst, linear_weight(self.lin_r, x_dst), None, cfg))
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out
