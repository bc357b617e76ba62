r"""Message passing in feature chunks, for PyG convs that have no compressed twin.

A PyG conv without a twin (``GINConv``, ``GraphConv``, ``ChebConv``, …) builds its messages
edge by edge: for ``message(x_j) = x_j`` PyG gathers
:math:`\mathbf{M} = \mathbf{X}_{\mathrm{src}} \in \mathbb{R}^{E \times F}` before it sums the
rows into their targets. Nothing of :math:`\mathbf{M}` waits for backward (the gather and the
sum keep only the edge indices), so compressing the context does not touch it, yet it is the
step's peak: :math:`E/N` full-size node tensors at once, 13 on ogbn-arxiv, 50 on
ogbn-products.

When the message and the aggregation act on every feature column on its own, the conv's
``propagate`` can run on :math:`k` column blocks of its source-side tensors,

.. math::
    \mathrm{propagate}(\mathbf{X}) = \big[\,\mathrm{propagate}(\mathbf{X}_{:, C_1})
    \;\big|\; \cdots \;\big|\; \mathrm{propagate}(\mathbf{X}_{:, C_k})\,\big],

each block's messages :math:`E \times F/k`, with :math:`k = \lceil E / N_{\mathrm{src}} \rceil`
(at most :math:`F`): a block's messages are about one node tensor. Every output value is the
same sum over the same edges in the same order, so the result, and its gradient, equal PyG's
bit for bit. This is PyG's own feature decomposition (``decomposed_layers``), which fails on
``(source, target)`` pairs, as ``GINConv`` and ``GraphConv`` pass ``x``.

:func:`gnnact.convert` installs :class:`FeatureChunks` as the ``propagate`` of every conv of a
class in :data:`DECOMPOSABLE` (``Config.chunk_messages``). Sparse adjacencies (``adj_t``) take
PyG's fused path, which makes no messages, and are left alone.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric.nn import MessagePassing

__all__ = ["DECOMPOSABLE", "FeatureChunks", "chunk_messages"]


def _classes(*names: str) -> tuple[type[MessagePassing], ...]:
    """The named PyG conv classes this PyG version has."""
    return tuple(getattr(pyg_nn, n) for n in names if hasattr(pyg_nn, n))


#: PyG convs whose ``message`` scales the source rows by per-edge scalars at most and whose
#: aggregation and ``update`` act per feature column, so that ``propagate`` splits by columns
#: (exact classes: a subclass may override ``message``).
DECOMPOSABLE: tuple[type[MessagePassing], ...] = _classes(
    "GINConv", "GraphConv", "ChebConv", "TAGConv", "ARMAConv", "ClusterGCNConv", "MFConv",
    "LGConv", "SSGConv", "MixHopConv", "SimpleConv", "WLConvContinuous")


class FeatureChunks:
    r"""A conv's ``propagate`` run on column blocks of its source-side tensors (see the
    module docstring): installed as the conv's ``propagate`` attribute, called as PyG's.

    Args:
        conv (MessagePassing): a conv of a class in :data:`DECOMPOSABLE`.

    Attributes:
        last_chunks (int): blocks of the last call (1: run whole).

    Example:
        >>> from torch_geometric.nn import GINConv
        >>> from gnnact.nn.chunked import chunk_messages
        >>> conv = GINConv(torch.nn.Linear(16, 16))
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 800))
        >>> want = conv(x, edge_index)
        >>> chunk_messages(conv)
        >>> torch.equal(conv(x, edge_index), want), conv.propagate.last_chunks
        (True, 8)
    """

    def __init__(self, conv: MessagePassing) -> None:
        if type(conv) not in DECOMPOSABLE:
            raise TypeError(f"conv must be one of {[c.__name__ for c in DECOMPOSABLE]}, got "
                            f"{type(conv).__name__}")
        self.conv = conv
        self.last_chunks = 1

    def __repr__(self) -> str:
        return f"FeatureChunks({type(self.conv).__name__})"

    def _sources(self) -> list[str]:
        """Names of the ``propagate`` arguments the messages gather (``x`` for ``x_j``)."""
        return sorted({a[:-2] for a in self.conv.inspector.get_param_names("message")
                       if a.endswith("_j")})

    def blocks(self, edge_index: Any, kwargs: dict[str, Any]) -> int:
        """How many column blocks a call with these arguments runs in: 1 (whole) for a sparse
        adjacency, no source tensor, or fewer edges than source nodes."""
        conv = self.conv
        if (not isinstance(edge_index, Tensor) or edge_index.layout != torch.strided
                or conv.explain or torch.compiler.is_compiling()):
            return 1
        widths, rows = set(), 0
        for name in self._sources():
            value = kwargs.get(name)
            source = value[0] if isinstance(value, (tuple, list)) else value
            if not isinstance(source, Tensor) or source.dim() < 2:
                return 1
            widths.add(source.size(-1))
            rows = max(rows, source.size(conv.node_dim))
        if len(widths) != 1 or rows == 0:
            return 1
        return max(1, min(widths.pop(), math.ceil(edge_index.size(1) / rows)))

    def __call__(self, edge_index: Any, size: Any = None, **kwargs: Any) -> Any:
        propagate = type(self.conv).propagate  # PyG's, as the class defines it
        k = self.blocks(edge_index, kwargs)
        self.last_chunks = k
        if k == 1:
            return propagate(self.conv, edge_index, size=size, **kwargs)
        names = self._sources()
        width = next(_source(kwargs[n]).size(-1) for n in names)
        step = math.ceil(width / k)
        # torch.split: one autograd node for all blocks, whose backward concatenates their
        # gradients once (slicing would make a full-size zero gradient per block).
        pieces = {n: _split(kwargs[n], step) for n in names}
        self.last_chunks = len(next(iter(pieces.values())))
        outs = [propagate(self.conv, edge_index, size=size,
                          **{**kwargs, **{n: p[i] for n, p in pieces.items()}})
                for i in range(self.last_chunks)]
        return torch.cat(outs, dim=-1)


def _source(value: Any) -> Tensor:
    return value[0] if isinstance(value, (tuple, list)) else value


def _split(value: Any, step: int) -> list[Any]:
    """Column blocks of a source-side argument; of a ``(source, target)`` pair, pairs of a
    source block and the whole target (read by ``_i`` arguments, if any, never split)."""
    if isinstance(value, (tuple, list)):
        return [(block, value[1]) for block in torch.split(value[0], step, dim=-1)]
    return list(torch.split(value, step, dim=-1))


def chunk_messages(conv: MessagePassing, enabled: bool = True) -> None:
    """Run ``conv``'s message passing in feature chunks (:class:`FeatureChunks`), or, with
    ``enabled=False``, whole again (PyG's own ``propagate``)."""
    if enabled:
        if not isinstance(conv.__dict__.get("propagate"), FeatureChunks):
            conv.propagate = FeatureChunks(conv)
    elif isinstance(conv.__dict__.get("propagate"), FeatureChunks):
        del conv.propagate
