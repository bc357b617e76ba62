r"""``GCN2Conv`` (GCNII) whose context is compressed."""

from __future__ import annotations

from typing import Any, ClassVar

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import OptTensor

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._base import _Compressed
from gnnact.nn.conv.norm import normalized_graph
from gnnact.ops.gcn2 import gcn2_residual
from gnnact.ops.graph import Graph, build_graph

__all__ = ["GCN2Conv"]

#: Aggregations the compressed SpMM implements (``"add"`` is GCN2Conv's default).
SUPPORTED_AGGR = ("add", "sum", "mean")


class GCN2Conv(_Compressed, pyg_nn.GCN2Conv):
    r"""The GCNII operator from `"Simple and Deep Graph Convolutional Networks"
    <https://arxiv.org/abs/2007.02133>`_, as :class:`torch_geometric.nn.GCN2Conv` (same
    arguments, parameters ``weight1``/``weight2`` and ``state_dict`` keys), storing its context
    compressed:

    .. math::
        \mathbf{X}^{\prime} = \left( (1 - \alpha) \hat{\mathbf{P}}\mathbf{X} +
        \alpha \mathbf{X}^{(0)}\right) \left( (1 - \beta) \mathbf{I} + \beta
        \mathbf{\Theta} \right),

    with :math:`\hat{\mathbf{P}} = \hat{\mathbf{D}}^{-1/2}\hat{\mathbf{A}}
    \hat{\mathbf{D}}^{-1/2}` and :math:`\beta = \log(\theta/\ell + 1)` (1 without
    ``theta``/``layer``). With ``shared_weights=False`` (GCNII*) the two terms get their own
    weights: :math:`\big((1-\alpha)\hat{\mathbf{P}}\mathbf{X}\big)\big((1-\beta)\mathbf{I} +
    \beta\mathbf{\Theta}_1\big) + \big(\alpha\mathbf{X}^{(0)}\big)\big((1-\beta)\mathbf{I} +
    \beta\mathbf{\Theta}_2\big)`.

    Kept for backward (PyG keeps the full-precision support matrix of every layer, plus
    :math:`\alpha\mathbf{X}^{(0)}` in every layer with separate weights, plus the normalised
    edge index and weights):

    * the aggregation :math:`\hat{\mathbf{P}}\mathbf{X}` keeps no node features, only the
      normalised graph, built once per adjacency and cached
      (:math:`\nabla\mathbf{X} = \hat{\mathbf{P}}^\top \nabla(\hat{\mathbf{P}}\mathbf{X})`);
    * shared weights: the support
      :math:`\mathbf{S} = (1-\alpha)\hat{\mathbf{P}}\mathbf{X} + \alpha\mathbf{X}^{(0)}` at
      ``config.bits`` bits (for :math:`\nabla\mathbf{\Theta}`), and nothing of
      :math:`\mathbf{X}^{(0)}`;
    * separate weights: :math:`(1-\alpha)\hat{\mathbf{P}}\mathbf{X}` at ``config.bits`` bits and
      :math:`\mathbf{X}^{(0)}` itself at ``config.bits`` bits, **one packed copy for the whole
      model** when every layer receives the same ``x_0`` object (see
      :func:`gnnact.ops.gcn2_residual`).

    Only an ``edge_weight`` that needs a gradient makes the aggregation keep :math:`\mathbf{X}`
    as well (compressed, for :math:`\nabla w_{ij} = \langle\nabla\mathbf{Y}_i,
    \mathbf{X}_j\rangle`). With ``config=Config(bits=32)`` outputs and gradients equal PyG's.
    The aggregation does not go through :meth:`propagate`, so propagate/message hooks and
    explainers do not see it.

    Args:
        channels (int): size of each input and output sample.
        alpha (float): strength :math:`\alpha` of the initial residual connection.
        theta (float, optional): :math:`\theta` in :math:`\beta = \log(\theta/\ell + 1)`.
            (default: :obj:`None`)
        layer (int, optional): the layer :math:`\ell`. (default: :obj:`None`)
        shared_weights (bool, optional): :obj:`False` for separate weights on the initial
            residual (GCNII*). (default: :obj:`True`)
        cached (bool, optional): cache the normalised graph on the first call, whatever the
            later input. (default: :obj:`False`)
        add_self_loops (bool, optional): (default: :obj:`True`)
        normalize (bool, optional): add self-loops and normalise symmetrically.
            (default: :obj:`True`)
        config (Config, optional): storage of the context. (default: ``Config()``, 2 bits)
        **kwargs (optional): of :class:`torch_geometric.nn.conv.MessagePassing`; ``aggr`` must be
            ``"add"`` (the default), ``"sum"`` or ``"mean"``.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F)`, initial node features
          :math:`(|\mathcal{V}|, F)` (the same tensor for every layer), edge indices
          :math:`(2, |\mathcal{E}|)` or a sparse ``adj_t``, edge weights
          :math:`(|\mathcal{E}|)` *(optional)*
        - **output:** node features :math:`(|\mathcal{V}|, F)`

    Example:
        >>> convs = [gnnact.nn.GCN2Conv(64, alpha=0.1, theta=0.5, layer=i + 1)
        ...          for i in range(4)]
        >>> x_0, edge_index = torch.randn(100, 64), torch.randint(0, 100, (2, 400))
        >>> x = x_0
        >>> for conv in convs:  # the same x_0 object for every layer: one packed copy
        ...     x = conv(x, x_0, edge_index).relu()
        >>> x.shape
        torch.Size([100, 64])
    """

    # Set explicitly: PyG generates propagate() from the class source otherwise (DESIGN §7).
    # Copied from PyG's "# propagate_type: (x: Tensor, edge_weight: OptTensor)".
    propagate_type: ClassVar[dict[str, Any]] = {"x": Tensor, "edge_weight": OptTensor}

    def __init__(self, channels: int, alpha: float, theta: float | None = None,
                 layer: int | None = None, shared_weights: bool = True, cached: bool = False,
                 add_self_loops: bool = True, normalize: bool = True, *,
                 config: Config | None = None, **kwargs: Any) -> None:
        aggr = kwargs.get("aggr", "add")
        if aggr not in SUPPORTED_AGGR:
            raise ValueError(f"gnnact GCN2Conv supports aggr in {SUPPORTED_AGGR}, got {aggr!r}")
        super().__init__(channels, alpha, theta=theta, layer=layer,
                         shared_weights=shared_weights, cached=cached,
                         add_self_loops=add_self_loops, normalize=normalize, **kwargs)
        self._init_gnnact(config)

    def _init_gnnact(self, config: Config | None) -> None:
        super()._init_gnnact(config)
        self._cached_graph: tuple[Graph, Tensor | None] | None = None

    @classmethod
    def supports(cls, module: pyg_nn.GCN2Conv) -> bool:
        """Whether a PyG ``GCN2Conv`` can be converted (its aggregation is supported)."""
        return isinstance(module.aggr, str) and module.aggr in SUPPORTED_AGGR

    @classmethod
    def _adopt(cls, module: pyg_nn.GCN2Conv, config: Config | None) -> GCN2Conv:
        """Turn a PyG ``GCN2Conv`` into this class in place (same parameters and buffers).

        A normalised adjacency PyG already cached (``cached=True``) is taken over on the next
        call, so the layer keeps using the graph it was first called with, as PyG would.
        """
        if not cls.supports(module):
            raise ValueError(f"gnnact GCN2Conv supports aggr in {SUPPORTED_AGGR}, got "
                             f"{module.aggr!r}")
        return super()._adopt(module, config)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self._cached_graph = None

    def _graph(self, edge_index: Any, edge_weight: OptTensor,
               x: Tensor) -> tuple[Graph, Tensor | None]:
        """The (normalised) graph and the edge values that need a gradient (else ``None``)."""
        num_nodes = x.size(self.node_dim)
        if self.normalize and self.cached:
            if self._cached_graph is None:
                self._cached_graph = self._take_over_pyg_cache(num_nodes)
            if self._cached_graph is not None:
                return self._cached_graph
        graph, value = normalized_graph(edge_index, edge_weight, num_nodes, improved=False,
                                        add_self_loops=self.add_self_loops, flow=self.flow,
                                        dtype=x.dtype, normalize=self.normalize)
        if self.normalize and self.cached:
            self._cached_graph = (graph, value)
        return graph, value

    def _take_over_pyg_cache(self, num_nodes: int) -> tuple[Graph, Tensor | None] | None:
        """The graph of a normalisation PyG cached before :meth:`_adopt` (then dropped)."""
        if self._cached_edge_index is not None:
            adj, weight = self._cached_edge_index
            self._cached_edge_index = None
        elif self._cached_adj_t is not None:
            adj, weight = self._cached_adj_t, None
            self._cached_adj_t = None
        else:
            return None
        graph = build_graph(adj, num_nodes, num_nodes, flow=self.flow)
        if weight is not None:
            graph.value = weight.detach()[graph.input_perm]
        return graph, None

    def forward(self, x: Tensor, x_0: Tensor, edge_index: Any,
                edge_weight: OptTensor = None) -> Tensor:
        if x.dim() != 2:
            raise ValueError(f"GCN2Conv expects 2-D node features, got shape {tuple(x.shape)}")
        graph, value = self._graph(edge_index, edge_weight, x)
        p = ops.spmm(x, graph, value, self.aggr, self.config)
        return gcn2_residual(p, x_0, self.weight1, self.weight2, self.alpha, self.beta,
                             self.config)

    def __repr__(self) -> str:
        return f"{super().__repr__()[:-1]}, bits={self.config.bits})"

