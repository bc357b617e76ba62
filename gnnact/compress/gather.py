r"""Gathered rows kept as their source and index.

Message passing lifts node features to edges, :math:`x_j = X[\mathrm{index}]`
(``src.index_select(node_dim, index)`` in :class:`~torch_geometric.nn.conv.MessagePassing`, or
``x[index]``), and a message that multiplies two lifted tensors (TransformerConv's
:math:`q_i \cdot k_j` and :math:`\alpha_{ij} v_j`, SuperGAT's :math:`x_i \cdot x_j`) has autograd
save them: :math:`E` rows each, where :math:`X` has :math:`N`. On a graph with thirty edges a node
that is thirty times the node tensor, once per lifted operand.

A gathered tensor is recorded when it is made (:func:`mark_gathered`, by the converted model's
:class:`~gnnact.nn.functional.FunctionalOps`); when autograd saves it, the generic pipeline keeps
:math:`X` (compressed as any other tensor, one copy shared by every gather of it) and the index
(the graph's own, or a compact copy) instead, and backward gathers again:

.. math::
    \hat x_j = \hat X[\mathrm{index}], \qquad \mathbb{E}[\hat x_j] = X[\mathrm{index}] = x_j .

Each row is as unbiased and as noisy as a rounded copy of :math:`x_j` would be; rows gathered
from the same node share their rounding, which the noise probes measure as they measure any
other tensor's (:mod:`gnnact.ops.probe`). Quantizing :math:`N` rows instead of :math:`E` also
costs less in forward.

Gathers inside message passing are kept so (a conv run in chunks lifts a block of edges at a
time: each block's gather may be smaller than its source, their sum is not), and elsewhere
those that grow their source (more rows out than in): a gather that selects a few rows
(``x[train_idx]``) is kept as it is.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing

__all__ = ["Gathered", "gather_source", "mark_gathered"]

# The attribute of a gathered tensor that records where its rows come from.
_SOURCE = "_gnnact_gathered"

_INDEX_DTYPES = (torch.int64, torch.int32)


def mark_gathered(out: Tensor, src: Tensor, dim: int, index: Tensor) -> None:
    """Record that ``out`` is ``src.index_select(dim, index)`` (``index`` 1-D). ``src`` is held
    for as long as ``out`` lives when ``out`` is the larger (a temporary source then still
    serves), weakly otherwise (the record is stale once it is gone); the index strongly (it is
    a row of the graph, or a piece of one).

    Args:
        out (torch.Tensor): the gathered tensor.
        src (torch.Tensor): the tensor gathered from.
        dim (int): the dimension gathered along.
        index (torch.Tensor): ``int64`` or ``int32`` indices, 1-D.

    Example:
        >>> x, index = torch.randn(3, 2), torch.tensor([0, 2, 2, 1, 0])
        >>> out = x.index_select(0, index)
        >>> mark_gathered(out, x, 0, index)
        >>> src, dim, kept = gather_source(out, None)  # 5 rows of 3: worth it anywhere
        >>> src is x, dim, kept is index
        (True, 0, True)
    """
    if (type(out) is not Tensor or type(src) is not Tensor or type(index) is not Tensor
            or index.dim() != 1 or index.dtype not in _INDEX_DTYPES):
        return
    dim = dim % src.dim()
    # A gather that grows its source holds it: a source made for the gather alone (softmax's
    # per-node sums lifted to edges, ``out_sum.index_select(0, index)``) is gone by the time
    # autograd saves the rows, and held it costs less than the rows. Others are held weakly.
    ref = (lambda: src) if out.numel() > src.numel() else weakref.ref(src)
    setattr(out, _SOURCE, (ref, src._version, dim, index, out._version))


def gather_source(t: Tensor, module: nn.Module | None) -> tuple[Tensor, int, Tensor] | None:
    """``(src, dim, index)`` with ``t == src.index_select(dim, index)``, if :func:`mark_gathered`
    recorded ``t``, neither tensor changed since, and keeping ``src`` and ``index`` is worth it
    for ``t`` saved in ``module`` (see the module docstring); else ``None``.

    Args:
        t (torch.Tensor): a tensor autograd saves.
        module (torch.nn.Module, optional): the innermost module running as it is saved.

    Example:
        >>> x, index = torch.randn(4, 2), torch.tensor([3])
        >>> out = x.index_select(0, index)
        >>> mark_gathered(out, x, 0, index)
        >>> gather_source(out, None) is None  # one row of four, outside message passing
        True
    """
    record = getattr(t, _SOURCE, None)
    if record is None:
        return None
    ref, version, dim, index, own_version = record
    src = ref()
    if src is None or src._version != version or t._version != own_version:
        return None
    if not isinstance(module, MessagePassing) and t.numel() <= src.numel():
        return None
    return src, dim, index


@dataclass(frozen=True)
class Gathered:
    """What the pipeline keeps for a gathered tensor: ``source`` and ``index`` as the pipeline
    keeps them (each a tensor, or a packed or compact copy), and the dimension gathered.

    Args:
        source (Any): the source as kept.
        index (Any): the index as kept.
        dim (int): the dimension gathered along.

    Example:
        >>> x, index = torch.randn(3, 2), torch.tensor([0, 2, 2, 1])
        >>> len(Gathered(x, index, 0).tensors())
        2
    """

    source: Any
    index: Any
    dim: int

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors that hold it (the memory accounting counts their storages)."""
        return _parts(self.source) + _parts(self.index)


def _parts(saved: Any) -> tuple[Tensor, ...]:
    if isinstance(saved, Tensor):
        return (saved,)
    tensors = getattr(saved, "tensors", None)
    return tuple(tensors()) if callable(tensors) else ()
