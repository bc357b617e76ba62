r"""``GCN2Conv`` (GCNII) whose context is compressed."""

from __future__ import annotations

from typing import Any, ClassVar

import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.typing import Adj, OptTensor

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._base import same_shape
from gnnact.nn.conv.base import CompressedConv
from gnnact.nn.conv.gcn_cache import gcn_graph
from gnnact.ops.gcn2 import gcn2_conv, gcn2_residual
from gnnact.ops.graph import Graph, graph_cache_for

__all__ = ["GCN2Conv"]


class GCN2Conv(CompressedConv, pyg_nn.GCN2Conv):
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

    The compressed path covers ``aggr`` of ``"add"`` (the default), ``"sum"`` and ``"mean"``.
    Any other ``aggr``, a registered message-passing hook, explain mode or
    ``decomposed_layers > 1`` run PyG's own forward (see ``gnnact.nn.conv.base``), and so
    does ``x`` of shape :math:`(B, |\mathcal{V}|, F)`, which PyG's layer rejects (its dense
    products take matrices only). ``cached=True`` fills ``_cached_edge_index`` /
    ``_cached_adj_t`` as PyG does (see ``gnnact.nn.conv.gcn_cache``); a cache PyG filled
    before :func:`gnnact.convert` is used as PyG would use it.

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
        **kwargs (optional): of :class:`torch_geometric.nn.conv.MessagePassing`.

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
        super().__init__(channels, alpha, theta=theta, layer=layer,
                         shared_weights=shared_weights, cached=cached,
                         add_self_loops=add_self_loops, normalize=normalize, **kwargs)
        self._init_gnnact(config)

    def _init_gnnact(self, config: Config | None) -> None:
        super()._init_gnnact(config)
        self._cached_graph: tuple[Any, bool, Graph] | None = None

    def reset_parameters(self) -> None:
        super().reset_parameters()  # empties PyG's cache, and so the graph built from it
        self._cached_graph = None

    _compiled_shape = staticmethod(same_shape)

    def forward(self, x: Tensor, x_0: Tensor, edge_index: Adj,
                edge_weight: OptTensor = None) -> Tensor:
        reduce = self._compressed_reduce()
        if x.dim() != 2 or reduce is None or self._takes_pyg_path():
            # PyG's own forward: its other aggregations, hooks and explainers (see
            # gnnact.nn.conv.base), and its error for static graphs (x of shape [B, N, F]).
            return super().forward(x, x_0, edge_index, edge_weight)
        graph, value = gcn_graph(self, edge_index, edge_weight, x.size(self.node_dim), x.dtype,
                                 improved=False, cache=graph_cache_for(self))
        if reduce in ("sum", "add"):  # the aggregation inside: P scaled in place
            return gcn2_conv(x, x_0, graph, self.weight1, self.weight2, self.alpha, self.beta,
                             value, self.config)
        p = ops.spmm(x, graph, value, reduce, self.config)
        return gcn2_residual(p, x_0, self.weight1, self.weight2, self.alpha, self.beta,
                             self.config)
