r"""Run a user's PyG model full-batch on a partitioned graph: one shard per rank.

:class:`DistributedGNN` leaves the model's ``forward`` as written. Each rank calls it on its
owned rows (``shard.x``) and its local edges (``shard.edge_index``); hooks on every conv

1. replace the conv's input :math:`X_{O_r}` by ``[owned; halo]`` rows through the
   :class:`~gnnact.distributed.HaloExchange` (point-to-point, with the peers only),
2. for ``GCNConv``/``GCN2Conv`` with ``normalize=True``, pass the global symmetric
   normalisation (of the given ``edge_weight``, if any) as ``edge_weight`` and run the conv
   with ``normalize=False`` for that call
   (:class:`~gnnact.distributed.norm.GlobalGCNNorm`: exact, the single-process weights),
   and give ``GCN2Conv``'s :math:`X^{(0)}` zero halo rows (its term is per target node),
3. keep the owned rows of the output, :math:`[\,\cdot\,]_{O_r}`.

Any other conv (``GINConv``, ``GraphConv``, ``GATv2Conv``, ``TransformerConv``, …: every
``MessagePassing`` layer whose ``x`` may be a ``(source, target)`` pair, PyG's bipartite form)
runs on the pair :math:`(X_{O_r \cup H_r}, X_{O_r})`: the sources are the ``[owned; halo]``
rows, the targets the owned rows only (the local edges point into owned nodes), so the conv
computes exactly the owned outputs, and whatever it applies to its aggregate (GIN's MLP, with
its batch norm) sees the owned rows only. A per-target aggregation over the incoming edges,
which every such conv computes, then equals the single-process one. Convs that take no pair
(``ChebConv``, ``APPNP``, ``SGConv``, …, whose propagation spans several hops or normalises
by source degrees), that aggregate along outgoing edges (``flow="target_to_source"``) or that
take other tensors than ``x``, ``edge_index`` and the shard's edge attributes
(``edge_weight``, ``edge_attr``: the values of the local edges, which are every edge into an
owned node, in order) are refused, with their name.

Every other layer of the model (linear, activation, dropout, a per-row norm) acts row by row
and needs nothing, except batch norm, whose statistics span all nodes: each ``BatchNorm1d``
(PyTorch's, gnnact's, or inside PyG's ``BatchNorm``) runs as
:func:`~gnnact.distributed.sync_batch_norm` while the wrapper is on, with the mean and variance
of all ranks' rows (exact; two ``all_reduce`` of :math:`C` values forward, one of :math:`2C`
backward; in a converted model what it saves for backward is compressed by the model's
saved-tensor pipeline, like any op without a twin). PyG's graph-level norms
(``GraphNorm``, ``PairNorm``, ``LayerNorm(mode="graph")``, …) are refused. Each owned output
row aggregates exactly the messages it aggregates on one process, so at 32 bits
:math:`Y_{O_r}` equals the single-process rows up to float summation order.

**Loss and gradients.** With :math:`T` the training nodes and :math:`T_r = T \cap O_r`,

.. math::
    \mathcal{L} = \frac{1}{|T|} \sum_{i \in T} \ell_i
    = \sum_r \underbrace{\frac{1}{|T|} \sum_{i \in T_r} \ell_i}_{\mathcal{L}_r}, \qquad
    \nabla_\theta \mathcal{L} = \sum_r \nabla_\theta \mathcal{L}_r,

where :math:`\nabla_\theta \mathcal{L}_r` already holds the halo gradients the exchange sent
back. So each rank divides its local loss sum by the global count (:meth:`global_count`) and
the gradients are summed, not averaged, over the ranks (:meth:`all_reduce_gradients`, or
``DistributedDataParallel`` with :func:`sum_gradients_hook`): the step is the single-process
step.
"""

from __future__ import annotations

import functools
import inspect
import re
from typing import Any

import torch
import torch.distributed as dist
import torch_geometric.nn as pyg_nn
from torch import Tensor, nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch_geometric.nn.conv import MessagePassing

from gnnact.distributed.batchnorm import sync_batch_norm
from gnnact.distributed.exchange import HaloExchange
from gnnact.distributed.norm import GlobalGCNNorm
from gnnact.distributed.shard import GraphShard
from gnnact.quant import DEFAULT_GROUP_SIZE

__all__ = ["DistributedGNN", "sum_gradients_hook"]

# Most specific first: every gnnact twin subclasses its PyG class.
_KINDS: tuple[tuple[type, str], ...] = ((pyg_nn.GCN2Conv, "gcn2"), (pyg_nn.GCNConv, "gcn"),
                                        (pyg_nn.SAGEConv, "sage"), (pyg_nn.GATConv, "gat"))
# Per-edge arguments a conv may take: the shard's own edge attributes (local edges' values).
_EDGE_ARGS = ("edge_weight", "edge_attr")
# PyG norms whose statistics span all nodes in every mode.
_GRAPH_NORMS = tuple(getattr(pyg_nn, name) for name in
                     ("GraphNorm", "InstanceNorm", "PairNorm", "MeanSubtractionNorm",
                      "GraphSizeNorm") if hasattr(pyg_nn, name))


def _takes_pair(module: MessagePassing) -> bool:
    """Whether ``module.forward``'s ``x`` may be a ``(source, target)`` pair (PyG annotates it
    ``Union[Tensor, PairTensor]`` or ``OptPairTensor``; gnnact's twins as strings)."""
    params = inspect.signature(module.forward).parameters
    if "x" not in params or "edge_index" not in params:
        return False
    return re.search(r"Pair|Tuple|tuple", str(params["x"].annotation)) is not None


def _conv_kind(name: str, module: nn.Module) -> str | None:
    for cls, kind in _KINDS:
        if isinstance(module, cls):
            return kind
    if not isinstance(module, MessagePassing):
        return None
    where = f"DistributedGNN: {name} ({type(module).__name__}) is not supported"
    if not _takes_pair(module):
        raise TypeError(f"{where}: it takes no (source, target) pair of features, so its "
                        f"outputs cannot be restricted to this rank's nodes (supported: "
                        f"GCNConv, GCN2Conv, SAGEConv, GATConv, and every conv whose x may be "
                        f"a pair, such as GINConv, GraphConv, GATv2Conv or TransformerConv)")
    if getattr(module, "flow", "source_to_target") != "source_to_target":
        raise TypeError(f"{where}: flow={module.flow!r} aggregates along outgoing edges, which "
                        f"are not all on the rank that owns the node")
    return "pair"


def sum_gradients_hook(process_group: dist.ProcessGroup | None,
                       bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    r"""A ``DistributedDataParallel`` communication hook that sums the gradients over the
    ranks instead of averaging them: :math:`\nabla_\theta \mathcal{L} = \sum_r \nabla_\theta
    \mathcal{L}_r` for a loss already divided by the global count (module docstring).

    Args:
        process_group (torch.distributed.ProcessGroup, optional): DDP's group (the ``state``
            of ``register_comm_hook``; :obj:`None` for the default group).
        bucket (torch.distributed.GradBucket): the bucket DDP hands over.

    Example:
        >>> ddp = DistributedDataParallel(DistributedGNN(model, shard))  # doctest: +SKIP
        >>> ddp.register_comm_hook(None, gnnact.distributed.sum_gradients_hook)
        ... # doctest: +SKIP
    """
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda future: future.value()[0])


# DDP checks a hook's annotations against the classes themselves, and this module's are strings
# (``from __future__ import annotations``).
sum_gradients_hook.__annotations__.update(
    {"bucket": dist.GradBucket, "return": torch.futures.Future[Tensor]})


class DistributedGNN(nn.Module):
    r"""``model`` run on this rank's :class:`~gnnact.distributed.GraphShard`, with a halo
    exchange before each conv (see the module docstring for what is computed).

    ``forward`` takes the model's own arguments, with ``shard.x`` for the features and
    ``shard.edge_index`` (that very tensor) for the edges, and returns the owned rows. The
    model is held as ``self.module`` (so ``state_dict`` keys gain ``module.``, as with
    ``DistributedDataParallel``); :meth:`remove` takes the hooks off again. Construction is
    collective: all ranks of ``group`` build their wrapper at the same point (parameters and
    buffers are broadcast from the group's rank 0, GCN degrees exchanged once).

    Supported convs: PyG's ``GCNConv``, ``GCN2Conv``, ``SAGEConv``, ``GATConv`` and gnnact's
    twins, and every other conv whose ``x`` may be a ``(source, target)`` pair (``GINConv``,
    ``GraphConv``, ``GATv2Conv``, ``TransformerConv``, …; module docstring), before or after
    :func:`gnnact.convert`; homogeneous input (``x`` a tensor), ``edge_weight`` and
    ``edge_attr`` only as the shard's own edge attributes (``shard.edge_weight``: the values of
    its local edges; GCN's normalisation then uses the global weighted degrees), no
    ``return_attention_weights``. Any other conv is refused at
    construction, with its name and why, as are PyG's norms over all nodes (``GraphNorm``,
    ``PairNorm``, ``InstanceNorm``, ``LayerNorm(mode="graph")``, …); batch norms run
    synchronised (:func:`~gnnact.distributed.sync_batch_norm`) until :meth:`remove`.

    Args:
        model (torch.nn.Module): a PyG model (e.g. ``torch_geometric.nn.models.GCN``).
        shard (GraphShard): this rank's share of the graph.
        group (torch.distributed.ProcessGroup, optional): the ranks of the partition (a group
            of its own keeps the halo traffic apart from DDP's). (default: the default group)
        exchange_bits (int, optional): width of the exchanged features: 1–8 (stochastic
            rounding, unbiased), 16 (bfloat16) or 32 (exact). (default: :obj:`32`)
        grad_bits (int, optional): width of the exchanged gradients.
            (default: ``exchange_bits``)
        group_size (int, optional): values per quantization group of a message.
            (default: :obj:`512`)
        broadcast_parameters (bool, optional): copy rank 0's parameters and buffers to every
            rank. (default: :obj:`True`)

    Example:
        >>> # in each of k processes, after torch.distributed.init_process_group("gloo", ...)
        >>> shard = gnnact.distributed.shard_graph(data, method="contiguous")  # doctest: +SKIP
        >>> model = gnnact.convert(GCN(128, 256, 3, 40), gnnact.Config(bits=2))  # doctest: +SKIP
        >>> dmodel = gnnact.distributed.DistributedGNN(model, shard, exchange_bits=2)
        ... # doctest: +SKIP
        >>> out = dmodel(shard.x, shard.edge_index)  # doctest: +SKIP
        >>> m = shard.train_mask  # doctest: +SKIP
        >>> loss = F.cross_entropy(out[m], shard.y[m], reduction="sum") / dmodel.global_count(m)
        ... # doctest: +SKIP
        >>> loss.backward(); dmodel.all_reduce_gradients(); optimizer.step()  # doctest: +SKIP
        >>> dmodel.exchange.stats.total_bytes  # sent by this rank this step  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, shard: GraphShard,
                 group: dist.ProcessGroup | None = None, *, exchange_bits: int = 32,
                 grad_bits: int | None = None, group_size: int = DEFAULT_GROUP_SIZE,
                 broadcast_parameters: bool = True) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        convs: list[tuple[str, nn.Module, str]] = []
        norms: list[nn.Module] = []
        for name, module in model.named_modules():
            name = name or "<model>"
            graph_layer_norm = (isinstance(module, pyg_nn.LayerNorm)
                                and getattr(module, "mode", None) == "graph")
            if isinstance(module, _GRAPH_NORMS) or graph_layer_norm:
                raise TypeError(f"DistributedGNN: {name} ({type(module).__name__}) normalises "
                                f"over all nodes, which are spread over the ranks; it is not "
                                f"supported")
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                norms.append(module)
            kind = _conv_kind(name, module)
            if kind is not None:
                convs.append((name, module, kind))
        if not convs:
            raise ValueError("DistributedGNN: model has no message-passing layer: there is "
                             "nothing to exchange")
        self.module = model
        self.shard, self.group = shard, group
        self.exchange = HaloExchange(shard, group, bits=exchange_bits, grad_bits=grad_bits,
                                     group_size=group_size)
        self._norms: dict[tuple[bool, bool, int | None], GlobalGCNNorm] = {}
        # One per (improved, self-loops) and edge weights a GCN conv may be given: none, or
        # any one-value-per-edge attribute of the shard (collective: the same on every rank).
        weights = [None, *(shard.edge_attrs[k] for k in sorted(shard.edge_attrs)
                           if shard.edge_attrs[k].dim() == 1)]
        for _, module, kind in convs:
            for weight in weights:
                key = self._norm_key(module, kind, weight)
                if key is not None and key not in self._norms:
                    self._norms[key] = GlobalGCNNorm(self.exchange, improved=key[0],
                                                     add_self_loops=key[1], edge_weight=weight)
        self.exchange.reset_stats()  # the degrees are set-up, not per-step traffic
        self._suspended: list[nn.Module] = []  # convs running with normalize=False right now
        self._handles = []
        for name, module, kind in convs:
            self._handles.append(module.register_forward_pre_hook(
                self._make_pre_hook(name, kind), with_kwargs=True))
            self._handles.append(module.register_forward_hook(
                self._make_hook(name), always_call=True))
        # Batch norms run synchronised: an instance attribute shadows the class's forward
        # until remove().
        self._batch_norms = norms
        for module in norms:
            module.forward = functools.partial(sync_batch_norm, module, group=group)
        if broadcast_parameters:
            src = dist.get_global_rank(group or dist.group.WORLD, 0)
            for tensor in [*model.parameters(), *model.buffers()]:
                dist.broadcast(tensor.data, src=src, group=group)

    @staticmethod
    def _norm_key(module: nn.Module, kind: str, edge_weight: Tensor | None = None
                  ) -> tuple[bool, bool, int | None] | None:
        if kind not in ("gcn", "gcn2") or not module.normalize:
            return None
        return (kind == "gcn" and module.improved, bool(module.add_self_loops),
                None if edge_weight is None else id(edge_weight))

    def remove(self) -> None:
        """Take the hooks off the model and give its batch norms their own forward back (the
        model then runs single-process again).

        Example:
            >>> dmodel.remove()  # doctest: +SKIP
        """
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module in self._batch_norms:
            del module.forward
        self._batch_norms = []

    # ----------------------------------------------------------------------- the hooks

    def _make_pre_hook(self, name: str, kind: str) -> Any:
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            return self._before_conv(name, kind, module, args, kwargs)

        return hook

    def _make_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: tuple, output: Any) -> Any:
            return self._after_conv(name, module, output)

        return hook

    def _before_conv(self, name: str, kind: str, module: nn.Module, args: tuple,
                     kwargs: dict) -> tuple[tuple, dict]:
        shard = self.shard
        where = f"DistributedGNN: {name} ({type(module).__name__})"
        bound = inspect.signature(module.forward).bind(*args, **kwargs)
        a = bound.arguments
        x = a["x"]
        if not isinstance(x, Tensor) or x.dim() != 2 or x.size(0) != shard.num_owned:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"{where}: x must be the {shard.num_owned} owned rows "
                             f"[num_owned, F], got {shape}")
        if a["edge_index"] is not shard.edge_index:
            raise ValueError(f"{where}: edge_index must be shard.edge_index itself (the local "
                             f"edges the exchange and the normalisation are built for)")
        for arg in ("size", "return_attention_weights"):
            if a.get(arg) not in (None, False):
                raise ValueError(f"{where}: {arg} is not supported, got {a[arg]!r}")
        edge_values = {}
        for arg in _EDGE_ARGS:
            value = a.get(arg)
            if value is None:
                continue
            if not any(value is t for t in shard.edge_attrs.values()):
                shape = tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__
                names = (", ".join(f"shard.{k}" for k in sorted(shard.edge_attrs))
                         or f"it has none: shard a Data with {arg}")
                raise ValueError(f"{where}: {arg} must be one of the shard's edge attributes "
                                 f"itself, the values of its local edges in shard.edge_index's "
                                 f"order ({names}), got {shape}")
            edge_values[arg] = value
        if kind == "pair":
            extra = [k for k, v in a.items() if isinstance(v, Tensor)
                     and k not in ("x", "edge_index", *edge_values)]
            if extra:
                raise ValueError(f"{where}: only x and edge_index are exchanged, got the "
                                 f"tensor argument(s) {', '.join(extra)}")
            # Sources: [owned; halo]; targets: the owned rows themselves.
            a["x"] = (self.exchange(x), x)
            return bound.args, bound.kwargs
        a["x"] = self.exchange(x)
        if kind == "gcn2":
            x_0 = a["x_0"]
            if not isinstance(x_0, Tensor) or x_0.shape != x.shape:
                raise ValueError(f"{where}: x_0 must have the shape of x, {tuple(x.shape)}")
            # alpha * x_0 is added per target row: the halo rows' outputs are dropped anyway.
            a["x_0"] = torch.cat([x_0, x_0.new_zeros(shard.num_halo, x_0.size(1))])
        key = self._norm_key(module, kind, edge_values.get("edge_weight"))
        if key is not None:
            norm = self._norms[key]
            a["edge_index"], a["edge_weight"] = norm.edge_index, norm.edge_weight(x.dtype)
            module.normalize = False  # for this call only: restored by _after_conv
            self._suspended.append(module)
        return bound.args, bound.kwargs

    def _after_conv(self, name: str, module: nn.Module, output: Any) -> Any:
        if module in self._suspended:  # also when the conv raised (always_call)
            self._suspended.remove(module)
            module.normalize = True
        if output is None:
            return None
        if not isinstance(output, Tensor):
            raise TypeError(f"DistributedGNN: {name} returned {type(output).__name__}, "
                            f"expected a tensor")
        return output[:self.shard.num_owned]

    # --------------------------------------------------------------------- the model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    # -------------------------------------------------------------- loss and gradients

    def all_reduce(self, tensor: Tensor) -> Tensor:
        """Sum of ``tensor`` over the ranks (in place, returned), e.g. the global loss
        :math:`\\sum_r \\mathcal{L}_r` from each rank's detached :math:`\\mathcal{L}_r`.

        Args:
            tensor (torch.Tensor): this rank's value.

        Example:
            >>> dmodel.all_reduce(loss.detach().clone())  # the global loss  # doctest: +SKIP
        """
        dist.all_reduce(tensor, group=self.group)
        return tensor

    def global_count(self, mask: Tensor) -> int:
        """Number of ``True`` entries of ``mask`` over all ranks: :math:`|T|`.

        Args:
            mask (torch.Tensor): a boolean mask of this rank's owned nodes.

        Example:
            >>> dmodel.global_count(shard.train_mask)  # doctest: +SKIP
            1000
        """
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            raise TypeError(f"mask must be a boolean tensor, got {getattr(mask, 'dtype', mask)}")
        return int(self.all_reduce(mask.sum().reshape(1).long()))

    def all_reduce_gradients(self) -> None:
        r"""Sum every parameter's gradient over the ranks, in one message:
        :math:`\nabla_\theta \mathcal{L} = \sum_r \nabla_\theta \mathcal{L}_r` (a missing
        gradient counts as zero, so all ranks reduce the same buffer).

        Example:
            >>> loss.backward(); dmodel.all_reduce_gradients()  # doctest: +SKIP
        """
        params = [p for p in self.module.parameters() if p.requires_grad]
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = _flatten_dense_tensors([p.grad for p in params])
        self.all_reduce(flat)
        for p, g in zip(params, _unflatten_dense_tensors(flat, [p.grad for p in params]),
                        strict=True):
            p.grad.copy_(g)
