r"""Message passing in chunks, for PyG convs that have no compressed twin.

A PyG conv without a twin (``GINConv``, ``TransformerConv``, …) builds its messages edge by
edge: for ``message(x_j) = x_j`` PyG gathers
:math:`\mathbf{M} = \mathbf{X}_{\mathrm{src}} \in \mathbb{R}^{E \times F}` before it sums the
rows into their targets. Nothing of :math:`\mathbf{M}` waits for backward (the gather and the
sum keep only the edge indices), so compressing the context does not touch it, yet it is the
step's peak: :math:`E/N` full-size node tensors at once, 13 on ogbn-arxiv, 50 on
ogbn-products. ``propagate`` is run in :math:`k` pieces of about one node tensor of messages
each (on a GPU, of the floor's bytes at least: :func:`most_pieces`), one of two ways.

**By feature columns** (:class:`FeatureChunks`, the classes in :data:`DECOMPOSABLE`). When
the message and the aggregation act on every feature column on its own,

.. math::
    \mathrm{propagate}(\mathbf{X}) = \big[\,\mathrm{propagate}(\mathbf{X}_{:, C_1})
    \;\big|\; \cdots \;\big|\; \mathrm{propagate}(\mathbf{X}_{:, C_k})\,\big],
    \qquad k = \lceil E / N_{\mathrm{src}} \rceil \text{ (at most } F\text{)}.

Every output value is the same sum over the same edges in the same order, so the result and
its gradient equal PyG's bit for bit. This is PyG's own feature decomposition
(``decomposed_layers``), which fails on ``(source, target)`` pairs, as ``GINConv`` and
``GraphConv`` pass ``x``.

**By blocks of targets** (:class:`TargetChunks`, the classes in :data:`BY_TARGET`). Attention,
edge features and networks applied per edge mix the columns, but every message is still made
edge by edge and every target aggregates only its own: with the edges stably sorted by
target, each block of targets runs with the edges into it,
:math:`k = \lceil E / N_{\mathrm{dst}} \rceil`. Each target meets the same messages in the
same order, but a block's messages are computed in a batch of another size (a network
applied per edge, a vectorised exponential can round a last bit differently there) and the
gradients of source-side tensors are summed block by block: the result, the attention a conv
returns and the gradients equal PyG's up to float rounding.

:func:`gnnact.convert` installs the one that fits as the ``propagate`` of every conv of those
exact classes (``Config.chunk_messages``). Sparse adjacencies (``adj_t``) take PyG's fused
path, which makes no messages, and are left alone.

**Only where the messages are large.** Pieces are not free: each one runs PyG's gather and
scatter over every edge, on narrower rows, and on the CPU a ``GINConv`` (64 features, 8 edges a
node) stepped 2.1-3.2× slower in 8 column pieces than whole at every size from 1 to 62 MiB of
messages (``benchmarks/bench_chunks.py``). A call whose messages (:math:`E` times the
widest per-node row of its arguments) are under the floor runs whole (:func:`message_floor`:
:data:`MIN_MESSAGE_BYTES` on the CPU, a :data:`GPU_MEMORY_SHARE`-th of a GPU's memory): it adds
at most that much to the step's peak, a fraction of a percent of the device's memory. On a GPU
a piece holds the floor's bytes at least (:func:`most_pieces`), since its cost there is the
host's (PyG's gather, scatter and softmax launched again for each, forward and backward):
Amazon Photo's Transformer, its first conv's 244 MB of messages in 32 pieces of 7.6 MB,
stepped 15× slower than PyG's on an H200 (2.7× whole). On the CPU pieces of about a node
tensor's messages are the faster (they stay in its caches). ``gnnact.summary`` reports each
conv's last call as ``whole`` or in pieces.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
import torch_geometric.nn as pyg_nn
import torch_geometric.nn.aggr as pyg_aggr
from torch import Tensor
from torch_geometric.nn import MessagePassing

from gnnact.config import device_floor
from gnnact.nn.conv import GCNConv, SAGEConv
from gnnact.nn.conv.base import MESSAGE_PASSING_HOOKS

__all__ = ["BY_TARGET", "CHUNKED", "DECOMPOSABLE", "GPU_MEMORY_SHARE", "MIN_MESSAGE_BYTES",
           "PER_COLUMN_AGGREGATIONS", "TWINS", "FeatureChunks", "TargetChunks", "chunk_messages",
           "message_floor", "most_pieces"]

#: Message bytes below which a call runs whole on the CPU.
MIN_MESSAGE_BYTES = 64 << 20
#: On a GPU, the floor is this share of its memory (1.1 GB on an H200), :data:`MIN_MESSAGE_BYTES`
#: at least; a piece holds the floor's bytes there.
GPU_MEMORY_SHARE = 128


def most_pieces(size: int, floor: int, device: torch.device) -> int:
    """The most pieces ``size`` bytes of messages on ``device`` run in: 1 (whole) under
    ``floor``; on a GPU, as many as leave each piece ``floor`` bytes (a piece's cost there is
    the host's: few large ones); on the CPU any number, as the conv's edges and nodes allow
    (pieces of about a node tensor's messages stay in its caches: Amazon Photo's Transformer
    stepped 0.57x PyG's in 32 pieces of 7.6 MB, 1.09x in 3 of 81 MB)."""
    if size < floor:
        return 1
    return size // floor if device.type == "cuda" and floor else size


def message_floor(device: torch.device) -> int:
    """Message bytes below which a call on ``device`` runs whole, and on a GPU the least a piece
    holds (the default of :attr:`FeatureChunks.min_bytes` and :attr:`TargetChunks.min_bytes`):
    :data:`MIN_MESSAGE_BYTES`, on a GPU a :data:`GPU_MEMORY_SHARE`-th of its memory if that is
    more (none with a share of 0)."""
    return device_floor(device, MIN_MESSAGE_BYTES, GPU_MEMORY_SHARE)


def _classes(*names: str) -> tuple[type[MessagePassing], ...]:
    """The named PyG conv classes this PyG version has."""
    return tuple(getattr(pyg_nn, n) for n in names if hasattr(pyg_nn, n))


#: PyG convs whose ``message`` scales the source rows by per-edge scalars at most and whose
#: aggregation and ``update`` act per feature column, so that ``propagate`` splits by columns
#: (exact classes: a subclass may override ``message``).
DECOMPOSABLE: tuple[type[MessagePassing], ...] = _classes(
    "GINConv", "GraphConv", "ChebConv", "TAGConv", "ARMAConv", "ClusterGCNConv", "MFConv",
    "LGConv", "SSGConv", "MixHopConv", "SimpleConv", "WLConvContinuous", "GatedGraphConv",
    "SignedConv")

#: gnnact's twins whose PyG path (taken for an aggregation without a compressed path, such as
#: ``aggr="max"``) splits by columns as the classes of :data:`DECOMPOSABLE` do.
TWINS = (GCNConv, SAGEConv)

#: Aggregations (exact classes) that reduce every feature column on its own, with no
#: parameter per column: a column block aggregates as the whole does.
PER_COLUMN_AGGREGATIONS: tuple[type, ...] = tuple(
    getattr(pyg_aggr, n) for n in ("SumAggregation", "MeanAggregation", "MaxAggregation",
                                   "MinAggregation", "MulAggregation", "StdAggregation",
                                   "VarAggregation", "MedianAggregation")
    if hasattr(pyg_aggr, n))

#: PyG convs whose messages mix feature columns (attention, edge features, a network applied
#: per edge) but are computed edge by edge and aggregated per target with PyG's own
#: ``aggregate`` and ``update``: ``propagate`` splits by blocks of targets
#: (:class:`TargetChunks`).
BY_TARGET: tuple[type[MessagePassing], ...] = _classes(
    "TransformerConv", "GINEConv", "GENConv", "ResGatedGraphConv", "EdgeConv", "PNAConv",
    "NNConv", "CGConv", "GMMConv", "FeaStConv", "PointNetConv", "GeneralConv", "FiLMConv",
    "PDNConv", "AGNNConv", "FAConv", "RGATConv", "EGConv", "DNAConv", "PointTransformerConv",
    "PPFConv", "PointGNNConv", "HEATConv", "LEConv")


#: Every class :func:`gnnact.convert` runs in chunks.
CHUNKED: tuple[type[MessagePassing], ...] = (*DECOMPOSABLE, *TWINS, *BY_TARGET)


class _Chunks:
    """What both ways of splitting share: the conv, when to split, the call of PyG's own
    ``propagate``."""

    classes: tuple[type[MessagePassing], ...] = ()

    def __init__(self, conv: MessagePassing) -> None:
        if type(conv) not in self.classes:
            raise TypeError(f"conv must be one of {[c.__name__ for c in self.classes]}, got "
                            f"{type(conv).__name__}")
        self.conv = conv
        self.last_chunks: int | None = None  # no call yet
        self.min_bytes: int | None = None  # (the device's floor: message_floor)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.conv).__name__})"

    def _args(self, suffix: str) -> list[str]:
        """Names of the ``propagate`` arguments ``message`` reads with ``suffix`` (``x`` for
        ``x_j``)."""
        conv = self.conv
        return sorted({a[:-2] for a in conv.inspector.get_param_names(
            "message", exclude=conv.special_args) if a.endswith(suffix)})

    def floor(self, device: torch.device) -> int:
        """Message bytes below which a call on ``device`` runs whole, and on a GPU the least a
        piece holds: ``min_bytes`` when set, else :func:`message_floor` (``device``)."""
        return message_floor(device) if self.min_bytes is None else self.min_bytes

    def _most_pieces(self, edge_index: Any, kwargs: dict[str, Any]) -> int:
        """The most pieces a call runs in: 1 (whole) for a sparse adjacency (PyG's fused path
        makes no messages), messages under the floor (:meth:`message_bytes`, :meth:`floor`),
        explain mode, a registered message-passing hook (so that it sees what PyG would show
        it), or tracing by torch.compile; else :func:`most_pieces`."""
        conv = self.conv
        if (not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided
                or bool(conv.explain)
                or any(getattr(conv, h, None) for h in MESSAGE_PASSING_HOOKS)
                or torch.compiler.is_compiling()):
            return 1
        device = edge_index.device
        return most_pieces(self.message_bytes(edge_index, kwargs), self.floor(device), device)

    def message_bytes(self, edge_index: Tensor, kwargs: dict[str, Any]) -> int:
        """The size of a call's messages, as :math:`E` rows of its widest argument row (a
        node's or an edge's values): what PyG makes at once when the call runs whole."""
        row = 0
        for value in kwargs.values():
            for t in value if isinstance(value, (tuple, list)) else (value,):
                if isinstance(t, Tensor) and t.dim() > 1 and t.size(0):
                    row = max(row, t.numel() // t.size(0) * t.element_size())
        return edge_index.size(1) * row

    def _propagate(self, edge_index: Any, size: Any, kwargs: dict[str, Any]) -> Any:
        # PyG's propagate as the class defines it (the instance's is this object).
        return type(self.conv).propagate(self.conv, edge_index, size=size, **kwargs)

    def __call__(self, edge_index: Any, size: Any = None, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling():
            # A call traced by torch.compile runs whole and leaves `last_chunks` as it is:
            # set inside a higher-order op's subgraph (a block under torch.utils.checkpoint,
            # as DeepGCNLayer's ckpt_grad makes), the attribute was a side effect Dynamo
            # cannot keep, and broke the graph there.
            return self._propagate(edge_index, size, kwargs)
        return self._chunked(edge_index, size, kwargs)

    def _chunked(self, edge_index: Any, size: Any, kwargs: dict[str, Any]) -> Any:
        """An eager call, in as many blocks as it takes (noted in ``last_chunks``)."""
        raise NotImplementedError


class FeatureChunks(_Chunks):
    r"""A conv's ``propagate`` run on column blocks of its source-side tensors (see the
    module docstring): installed as the conv's ``propagate`` attribute, called as PyG's.

    Args:
        conv (MessagePassing): a conv of a class in :data:`DECOMPOSABLE` or :data:`TWINS`.

    Attributes:
        last_chunks (int or None): blocks of the last eager call (1: run whole; ``None``:
            no call yet). A call inside a compiled frame runs whole and leaves it as it is.
        min_bytes (int or None): messages below this many bytes run whole, and on a GPU a
            piece holds this many at least (:obj:`None`, the default: :func:`message_floor` of
            the call's device).

    Example:
        >>> from torch_geometric.nn import GINConv
        >>> from gnnact.nn.chunked import chunk_messages
        >>> conv = GINConv(torch.nn.Linear(16, 16))
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 800))
        >>> want = conv(x, edge_index)
        >>> chunk_messages(conv)
        >>> conv.propagate.min_bytes = 0  # (51 KiB of messages: whole by default)
        >>> torch.equal(conv(x, edge_index), want), conv.propagate.last_chunks
        (True, 8)
    """

    classes = (*DECOMPOSABLE, *TWINS)

    def blocks(self, edge_index: Any, kwargs: dict[str, Any]) -> int:
        """How many column blocks a call with these arguments runs in: 1 (whole) for a sparse
        adjacency, messages under ``min_bytes``, an aggregation that mixes columns (LSTM,
        attention, several aggregations concatenated), no source tensor, or fewer edges than
        source nodes."""
        most = self._most_pieces(edge_index, kwargs)
        if (most == 1
                or type(getattr(self.conv, "aggr_module", None)) not in PER_COLUMN_AGGREGATIONS):
            return 1
        widths, rows = set(), 0
        for name in self._args("_j"):
            source = _source(kwargs.get(name))
            if not isinstance(source, Tensor) or source.dim() < 2:
                return 1
            widths.add(source.size(-1))
            rows = max(rows, source.size(self.conv.node_dim))
        if len(widths) != 1 or rows == 0:
            return 1
        return max(1, min(most, widths.pop(), math.ceil(edge_index.size(1) / rows)))

    def _chunked(self, edge_index: Any, size: Any, kwargs: dict[str, Any]) -> Any:
        k = self.blocks(edge_index, kwargs)
        self.last_chunks = k
        if k == 1:
            return self._propagate(edge_index, size, kwargs)
        names = self._args("_j")
        step = math.ceil(_source(kwargs[names[0]]).size(-1) / k)
        # torch.split: one autograd node for all blocks, whose backward concatenates their
        # gradients once (slicing would make a full-size zero gradient per block).
        pieces = {n: _split(kwargs[n], step) for n in names}
        self.last_chunks = len(pieces[names[0]])
        outs = [self._propagate(edge_index, size,
                                {**kwargs, **{n: p[i] for n, p in pieces.items()}})
                for i in range(self.last_chunks)]
        return torch.cat(outs, dim=-1)


class TargetChunks(_Chunks):
    r"""A conv's ``propagate`` run on blocks of target nodes, each with the edges into it
    (edges stably sorted by target, so every target meets its edges in their order): about
    :math:`N_{\mathrm{dst}}` edges per block, :math:`k = \lceil E / N_{\mathrm{dst}} \rceil`
    blocks. Target-side arguments (``query_i``) are sliced to the block, per-edge ones
    (``edge_attr``) gathered to its edges, source-side ones (``key_j``) passed whole. The
    attention a conv leaves in ``_alpha`` for ``return_attention_weights`` is put back in the
    input edge order.

    Args:
        conv (MessagePassing): a conv of a class in :data:`BY_TARGET`.

    Attributes:
        last_chunks (int or None): blocks of the last eager call (1: run whole; ``None``:
            no call yet). A call inside a compiled frame runs whole and leaves it as it is.
        min_bytes (int or None): messages below this many bytes run whole, and on a GPU a
            piece holds this many at least (:obj:`None`, the default: :func:`message_floor` of
            the call's device).

    Example:
        >>> from torch_geometric.nn import TransformerConv
        >>> from gnnact.nn.chunked import chunk_messages
        >>> conv = TransformerConv(16, 8, heads=2)
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 800))
        >>> want = conv(x, edge_index)
        >>> chunk_messages(conv)
        >>> conv.propagate.min_bytes = 0  # (small messages: whole by default)
        >>> torch.allclose(conv(x, edge_index), want), conv.propagate.last_chunks
        (True, 8)
    """

    classes = BY_TARGET

    def blocks(self, edge_index: Any, kwargs: dict[str, Any], size: Any = None) -> int:
        """How many target blocks a call with these arguments runs in: 1 (whole) for a sparse
        adjacency, messages under ``min_bytes``, the reverse flow, or fewer edges than
        targets."""
        return self._blocks(edge_index, self._targets(kwargs, size), kwargs)

    def _blocks(self, edge_index: Any, targets: int | None, kwargs: dict[str, Any]) -> int:
        most = self._most_pieces(edge_index, kwargs)
        if most == 1 or self.conv.flow != "source_to_target" or not targets:
            return 1
        return max(1, min(most, targets, math.ceil(edge_index.size(1) / targets)))

    def _targets(self, kwargs: dict[str, Any], size: Any) -> int | None:
        """The number of target nodes, from ``size`` or a target-side argument."""
        if size is not None and size[1] is not None:
            return int(size[1])
        for name in (*self._args("_i"), *self._args("_j")):
            value = kwargs.get(name)
            target = value[1] if isinstance(value, (tuple, list)) else value
            if isinstance(target, Tensor):
                return target.size(self.conv.node_dim)
        return None

    def _chunked(self, edge_index: Any, size: Any, kwargs: dict[str, Any]) -> Any:
        conv = self.conv
        targets = self._targets(kwargs, size)
        k = self._blocks(edge_index, targets, kwargs)
        self.last_chunks = k
        if k == 1:
            return self._propagate(edge_index, size, kwargs)
        num_edges = edge_index.size(1)
        sources = self._args("_j")
        target_args = self._args("_i")
        first = _source(kwargs[sources[0]]) if sources else None
        num_src = (size[0] if size is not None and size[0] is not None
                   else first.size(conv.node_dim) if isinstance(first, Tensor) else targets)
        dst, order = torch.sort(edge_index[1], stable=True)
        # ptr[t]: the first sorted edge into target t; blocks of targets with ~E/k edges each.
        ptr = torch.searchsorted(dst, torch.arange(targets + 1, device=dst.device))
        bounds = torch.searchsorted(ptr, torch.linspace(0, num_edges, k + 1, device=dst.device)
                                    .to(ptr.dtype)).clamp_(max=targets).tolist()
        bounds[0], bounds[-1] = 0, targets
        # Where each block's edges start, read to the host at once (one sync, not two a block).
        starts = ptr[torch.tensor(bounds, device=ptr.device)].tolist()
        per_edge = [n for n, v in kwargs.items() if n not in (*sources, *target_args)
                    and isinstance(v, Tensor) and v.dim() > 0 and v.size(0) == num_edges]
        outs, alphas = [], []
        for (t0, t1), (e0, e1) in zip(itertools.pairwise(bounds), itertools.pairwise(starts),
                                      strict=True):
            if t1 <= t0:
                continue
            edges = order[e0:e1]
            block = torch.stack([edge_index[0].index_select(0, edges), dst[e0:e1] - t0])
            args = dict(kwargs)
            for name in {*sources, *target_args}:  # the block's target rows; sources whole
                value = kwargs[name]
                if isinstance(value, (tuple, list)):
                    src, tgt = value
                elif name in target_args:  # read at targets (and at sources if in both)
                    src, tgt = (value if name in sources else None), value
                else:
                    continue
                if isinstance(tgt, Tensor):
                    tgt = tgt.narrow(conv.node_dim, t0, t1 - t0)
                args[name] = (src, tgt)
            for name in per_edge:
                args[name] = kwargs[name].index_select(0, edges)
            outs.append(self._propagate(block, (num_src, t1 - t0), args))
            alpha = getattr(conv, "_alpha", None)
            alphas.append(alpha if isinstance(alpha, Tensor) and alpha.size(0) == e1 - e0
                          else None)
        self.last_chunks = len(outs)
        if alphas and all(a is not None for a in alphas):
            # Back in the input edge order, for return_attention_weights: through the inverse
            # of the sort's permutation, made in one scatter (not a second sort).
            inverse = torch.empty_like(order)
            inverse[order] = torch.arange(order.numel(), device=order.device)
            conv._alpha = torch.cat(alphas).index_select(0, inverse)
        return torch.cat(outs, dim=conv.node_dim)


def _source(value: Any) -> Any:
    return value[0] if isinstance(value, (tuple, list)) else value


def _split(value: Any, step: int) -> list[Any]:
    """Column blocks of a source-side argument; of a ``(source, target)`` pair, pairs of a
    source block and the whole target (read by ``_i`` arguments, if any, never split)."""
    if isinstance(value, (tuple, list)):
        return [(block, value[1]) for block in torch.split(value[0], step, dim=-1)]
    return list(torch.split(value, step, dim=-1))


def chunk_messages(conv: MessagePassing, enabled: bool = True) -> None:
    """Run ``conv``'s message passing in chunks (:class:`FeatureChunks` for a class in
    :data:`DECOMPOSABLE` or :data:`TWINS`, :class:`TargetChunks` for one in
    :data:`BY_TARGET`), or, with ``enabled=False``, whole again (PyG's own ``propagate``)."""
    installed = isinstance(conv.__dict__.get("propagate"), _Chunks)
    if enabled and not installed:
        chunks = FeatureChunks if type(conv) in FeatureChunks.classes else TargetChunks
        conv.propagate = chunks(conv)
    elif not enabled and installed:
        del conv.propagate
