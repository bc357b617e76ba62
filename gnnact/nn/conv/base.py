r"""What the four conv twins share: when to run PyG's own forward instead of the compressed one,
which aggregations have a compressed path, and how that path aggregates along PyG's node
dimension with PyG's size checks.

A twin runs PyG's own ``forward`` (:meth:`CompressedConv._takes_pyg_path`) whenever the
compressed path would change what PyG's user sees:

* a message-passing hook is registered (:data:`MESSAGE_PASSING_HOOKS`): the compressed ops
  replace ``propagate``/``message``/``aggregate``/``edge_updater``, so PyG's hooks would never
  fire;
* explain mode (``GNNExplainer`` and friends inject edge masks into ``message``);
* ``decomposed_layers > 1`` (PyG's inference-time feature decomposition).

Whatever PyG's path saves for backward is compressed by the converted model's generic
saved-tensor pipeline (:class:`gnnact.nn.scope.Scope`), not by the twin.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.nn.aggr import MeanAggregation, SumAggregation
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.typing import Size
from torch_geometric.utils import is_torch_sparse_tensor

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._base import _Compressed, torchscript_unsupported
from gnnact.ops.graph import Graph, check_sparse_flow, is_sparse_tensor

__all__ = ["MESSAGE_PASSING_HOOKS", "CompressedConv", "add_into", "channels_shape", "heads_shape",
           "propagate_sizes"]

#: The hook dictionaries of PyG's :class:`~torch_geometric.nn.conv.MessagePassing` (one per
#: ``register_*_forward_pre_hook`` / ``register_*_forward_hook`` method).
MESSAGE_PASSING_HOOKS: tuple[str, ...] = tuple(
    f"_{stage}_forward_{kind}hooks"
    for stage in ("propagate", "message", "aggregate", "message_and_aggregate", "edge_update")
    for kind in ("pre_", ""))

#: Aggregation modules (exact classes) that :func:`gnnact.ops.spmm` computes, by its reduce.
_COMPRESSED_REDUCE: dict[type, str] = {SumAggregation: "sum", MeanAggregation: "mean"}


def channels_shape(conv: Any, x: Tensor, *args: Any, **kwargs: Any) -> list[int]:
    """``_compiled_shape`` of a conv whose output has ``out_channels`` features per node."""
    return [*x.shape[:-1], conv.out_channels]


def heads_shape(conv: Any, x: Tensor, *args: Any, **kwargs: Any) -> list[int] | None:
    """``_compiled_shape`` of an attention conv: ``heads`` times ``out_channels`` features
    per node when they are concatenated (2-D features only)."""
    out = conv.heads * conv.out_channels if conv.concat else conv.out_channels
    return [x.size(0), out] if x.dim() == 2 else None


class CompressedConv(_Compressed):
    """Mixin of the conv twins (before the PyG class in the bases): the decisions above, and
    the conv-level plumbing of the compressed path."""

    # PyG's generic propagate()/edge_updater(), ahead of the PyG class in the MRO. On the first
    # construction PyG keeps the class's current one as `_orig_propagate` (what explain mode
    # and decomposed_layers > 1 switch to) and installs a generated one, which supports
    # neither; once PyG's own class has been built, the current one it inherits is PyG's
    # generated one, and explain mode would silently drop its edge masks.
    propagate = MessagePassing.propagate
    edge_updater = MessagePassing.edge_updater

    # A conv's own forward builds its graph once per adjacency (the model's graph cache),
    # where PyG's rebuilds it every pass: eager passes run as PyTorch's keep it. (Compiled
    # ones trace PyG's: the cache is eager code.)
    _own_forward_when_small = True

    def _takes_pyg_path(self) -> bool:
        """Whether PyG's own ``forward`` must run: a message-passing hook is registered, explain
        mode is on, or ``decomposed_layers > 1`` (see the module docstring)."""
        conv: Any = self
        return (bool(conv.explain) or conv.decomposed_layers > 1
                or any(getattr(conv, name, None) for name in MESSAGE_PASSING_HOOKS))

    def _compressed_reduce(self) -> str | None:
        """The reduce of :func:`gnnact.ops.spmm` equal to this layer's aggregation (``"sum"``
        for ``"add"``/``"sum"``, ``"mean"``), or ``None`` when it has no compressed path
        (``"max"``, learnable, multi-aggregation, ...)."""
        return _COMPRESSED_REDUCE.get(type(getattr(self, "aggr_module", None)))

    def _aggregate(self, x: Tensor, graph: Graph, value: Tensor | None, reduce: str,
                   config: Config) -> Tensor:
        """:func:`gnnact.ops.spmm` along ``node_dim``: a static graph's ``[B, N, F]`` features
        are aggregated as one ``[N, B F]`` matrix (one product for the batch, whose backward
        still keeps nothing but the graph)."""
        dim = self.node_dim % x.dim()  # type: ignore[attr-defined]
        if dim == 0:
            return ops.spmm(x, graph, value, reduce, config)
        return ops.spmm(x.movedim(dim, 0), graph, value, reduce, config).movedim(0, dim)

    def jittable(self, typing: str | None = None) -> MessagePassing:
        """PyG's (deprecated) preparation for :func:`torch.jit.script`: gnnact layers cannot be
        scripted, so this raises the error :func:`torch.jit.script` would."""
        raise torchscript_unsupported(self)


def add_into(out: Tensor, other: Tensor) -> Tensor:
    """``out + other``, written into ``out`` where that gives the same tensor: ``out`` a fresh
    2-D result that no op keeps (an aggregation's output) of the sum's shape, and ``other``
    of its dtype. A layer's output is then one full-size tensor, not two, at its forward's peak; the
    values are those of ``out + other`` either way (one rounding per element)."""
    # (Plain comparisons: torch.result_type, torch.broadcast_shapes and Tensor._is_view break
    # a torch.compile graph. Autograd refuses an in-place add into a tensor an op keeps.)
    # Only 2-D: an aggregation returns its 2-D result itself, but a batched one ([B, N, F])
    # moved back to PyG's node dimension, a view, which autograd does not let us write.
    same = (out.dim() == 2 and other.dtype == out.dtype
            and (other.shape == out.shape or other.shape == out.shape[-1:]))
    return out.add_(other) if same else out + other


def propagate_sizes(conv: MessagePassing, adj: Any, size: Size, n_src: int | None,
                    n_dst: int | None) -> tuple[int, int]:
    """``(N_src, N_dst)`` as PyG's ``propagate`` infers and checks them: from the adjacency
    (``EdgeIndex`` or sparse ``adj_t``) or ``size``, completed and checked with the feature
    rows ``n_src``/``n_dst`` (``None``: not given); ``N_dst`` defaults to ``N_src``."""
    if isinstance(adj, EdgeIndex):
        dims: list[int | None] = [adj.num_rows, adj.num_cols]
    elif is_torch_sparse_tensor(adj) or is_sparse_tensor(adj):
        check_sparse_flow(adj, conv.flow)
        dims = [adj.size(1), adj.size(0)]
    else:
        dims = list(size) if size is not None else [None, None]
    i, j = (1, 0) if conv.flow == "source_to_target" else (0, 1)
    for dim, rows in ((j, n_src), (i, n_dst)):
        if rows is None:
            continue
        if dims[dim] is None:
            dims[dim] = rows
        elif dims[dim] != rows:
            raise ValueError(f"Encountered tensor with size {rows} in dimension "
                             f"{conv.node_dim}, but expected size {dims[dim]}.")
    src = dims[j]
    if src is None:
        raise ValueError("the number of source nodes is unknown: pass source features or size")
    dst = dims[i]
    return src, src if dst is None else dst
