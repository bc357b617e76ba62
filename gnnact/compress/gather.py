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

Rows that an elementwise function makes of gathered ones are gathered rows too:
:math:`f(X[\mathrm{index}]) = f(X)[\mathrm{index}]` for :math:`f` a ReLU or LeakyReLU, or a
number added, subtracted, multiplied or divided by (:func:`mark_derived`, by the same
mode). GENConv's messages, :math:`\mathrm{relu}(x_j) + \epsilon`, which its softmax
aggregation's products save twice, are kept as :math:`\mathrm{relu}(X) + \epsilon` (made
when autograd saves them) and the index: DeeperGCN's context on Minesweeper, 19.2 MB → 15.8
MB.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn import MessagePassing

__all__ = ["Gathered", "gather_record", "gather_source", "mark_derived", "mark_gathered"]

# The attribute of a gathered tensor that records where its rows come from.
_SOURCE = "_gnnact_gathered"

_INDEX_DTYPES = (torch.int64, torch.int32)


class _Source:
    """Where a gathered tensor's rows come from: ``base()`` (the tensor gathered from, or
    ``None`` once it is gone or changed), or ``fn`` of it for rows an elementwise function
    made of gathered ones, made when first asked (what autograd saves) and kept with the
    rows."""

    __slots__ = ("_base", "_fn", "_made", "numel")

    def __init__(self, base: Callable[[], Tensor | None], fn: Callable[[Tensor], Tensor] | None,
                 numel: int) -> None:
        self._base, self._fn, self._made, self.numel = base, fn, None, numel

    def get(self) -> Tensor | None:
        if self._made is not None:
            return self._made
        base = self._base()
        if base is None or self._fn is None:
            return base
        with torch.no_grad():
            self._made = self._fn(base)
        return self._made


def _fresh(ref: Callable[[], Tensor | None], version: int) -> Tensor | None:
    src = ref()
    return src if src is not None and src._version == version else None


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
    source = _Source(functools.partial(_fresh, ref, src._version), None, src.numel())
    setattr(out, _SOURCE, (source, dim, index, out._version))


def gather_record(t: Any) -> tuple | None:
    """What :func:`mark_gathered` or :func:`mark_derived` recorded of ``t``, if ``t`` has not
    changed since (to hand to :func:`mark_derived`, read before an in-place call)."""
    record = getattr(t, _SOURCE, None) if type(t) is Tensor else None
    return record if record is not None and t._version == record[3] else None


def mark_derived(out: Tensor, record: tuple | None, fn: Callable[[Tensor], Tensor]) -> None:
    r"""Record that ``out`` is ``fn`` of a gathered tensor whose record is ``record``
    (:func:`gather_record`), ``fn`` elementwise (``relu``, a scalar added, ...): ``out`` is
    then gathered from ``fn(src)`` by the same index (GENConv's messages,
    :math:`\mathrm{relu}(x_j) + \epsilon = (\mathrm{relu}(X) + \epsilon)[j]`), which the
    pipeline keeps instead of ``out``, made when autograd saves ``out``. Only where ``out``
    has more values than the source.

    Example:
        >>> x, index = torch.randn(3, 2), torch.tensor([0, 2, 2, 1, 0])
        >>> rows = x.index_select(0, index)
        >>> mark_gathered(rows, x, 0, index)
        >>> out = rows.relu() + 1.0
        >>> mark_derived(out, gather_record(rows), lambda s: s.relu() + 1.0)
        >>> src, dim, kept = gather_source(out, None)
        >>> torch.equal(src.index_select(dim, kept), out)
        True
    """
    if (record is None or type(out) is not Tensor or not out.is_floating_point()
            or out.dim() == 0):
        return
    source, dim, index, _ = record
    # Only rows that outnumber their source's: each derived source is made on its own (a
    # conv run in blocks of edges would make one for every block).
    if dim >= out.dim() or out.size(dim) != index.numel() or out.numel() <= source.numel:
        return
    setattr(out, _SOURCE, (_Source(source.get, fn, source.numel), dim, index, out._version))


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
    source, dim, index, own_version = record
    if t._version != own_version or (not isinstance(module, MessagePassing)
                                     and t.numel() <= source.numel):
        return None
    src = source.get()
    return None if src is None else (src, dim, index)


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
