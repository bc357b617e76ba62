r"""``SAGEConv`` whose context is compressed."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import OptPairTensor, Size

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._base import _Compressed
from gnnact.nn._lazy import linear_weight
from gnnact.ops.graph import is_sparse_tensor

__all__ = ["SAGEConv"]

#: Aggregations computed by a sparse product (whose backward keeps nothing but the graph).
SUPPORTED_AGGR = ("sum", "add", "mean")


class SAGEConv(_Compressed, pyg_nn.SAGEConv):
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
    full precision. Only ``aggr`` of ``"mean"``, ``"sum"`` or ``"add"`` is supported.

    Args:
        in_channels (int or tuple): size of each input sample, or a pair for bipartite graphs.
        out_channels (int): size of each output sample.
        aggr (str, optional): ``"mean"``, ``"sum"`` or ``"add"``. (default: :obj:`"mean"`)
        normalize (bool, optional): :math:`\ell_2`-normalise the output. (default: :obj:`False`)
        root_weight (bool, optional): add the transformed root features. (default: :obj:`True`)
        project (bool, optional): project neighbours first. (default: :obj:`False`)
        bias (bool, optional): (default: :obj:`True`)
        config (Config, optional): storage of the context. (default: ``Config()``, 2 bits)
        **kwargs (optional): of :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **inputs:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))` if bipartite, edge
          indices :math:`(2, |\mathcal{E}|)` or a sparse ``adj_t``
        - **outputs:** node features :math:`(|\mathcal{V}|, F_{out})` or
          :math:`(|\mathcal{V_t}|, F_{out})` if bipartite

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
                 aggr: str = "mean", normalize: bool = False, root_weight: bool = True,
                 project: bool = False, bias: bool = True, *, config: Config | None = None,
                 **kwargs: Any) -> None:
        if aggr not in SUPPORTED_AGGR:
            raise ValueError(f"gnnact SAGEConv supports aggr in {SUPPORTED_AGGR}, got {aggr!r}")
        super().__init__(in_channels, out_channels, aggr=aggr, normalize=normalize,
                         root_weight=root_weight, project=project, bias=bias, **kwargs)
        self._init_gnnact(config)

    @classmethod
    def supports(cls, module: pyg_nn.SAGEConv) -> bool:
        """Whether a PyG ``SAGEConv`` can be converted (its aggregation is supported)."""
        return isinstance(module.aggr, str) and module.aggr in SUPPORTED_AGGR

    @classmethod
    def _adopt(cls, module: pyg_nn.SAGEConv, config: Config | None) -> SAGEConv:
        """Turn a PyG ``SAGEConv`` into this class in place (same parameters and buffers)."""
        if not cls.supports(module):
            raise ValueError(f"gnnact SAGEConv supports aggr in {SUPPORTED_AGGR}, got "
                             f"{module.aggr!r}")
        return super()._adopt(module, config)

    def forward(self, x: Tensor | OptPairTensor, edge_index: Any, size: Size = None) -> Tensor:
        if isinstance(x, Tensor):
            x = (x, x)
        cfg = self.config
        x_src, x_dst = x
        if self.project and hasattr(self, "lin"):
            x_src = ops.relu(ops.linear(x_src, self.lin.weight, self.lin.bias, cfg))
        num_dst = x_dst.size(0) if x_dst is not None else (
            size[1] if size is not None else x_src.size(0))
        if size is not None and size[0] is not None and size[0] != x_src.size(0):
            raise ValueError(f"size[0]={size[0]} does not match the {x_src.size(0)} rows of the "
                             f"source features")
        graph = ops.graph_from(edge_index, x_src.size(0), num_dst, flow=self.flow)
        if is_sparse_tensor(edge_index) and graph.value is not None:
            # PyG drops a SparseTensor's values here (set_value(None)); torch.sparse keeps them.
            graph = dataclasses.replace(graph, value=None)
        # mean_j(x_j) W = mean_j(x_j W): transform first, so that this linear map keeps x_src
        # (shared with lin_r, or rebuilt from the previous layer's context) instead of a
        # compressed copy of the aggregate; the bias is added after aggregating, so isolated
        # nodes still get exactly the bias, as in PyG.
        h = ops.linear(x_src, linear_weight(self.lin_l, x_src), None, cfg)
        out = ops.spmm(h, graph, None, self.aggr, cfg)
        if self.lin_l.bias is not None:
            out = out + self.lin_l.bias
        if self.root_weight and x_dst is not None:
            out = out + ops.linear(x_dst, linear_weight(self.lin_r, x_dst), None, cfg)
        if self.normalize:
            out = F.normalize(out, p=2.0, dim=-1)
        return out

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, "
                f"aggr={self.aggr}, bits={self.config.bits})")
