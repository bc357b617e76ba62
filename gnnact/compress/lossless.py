r"""Exact storage of the integer and boolean tensors autograd keeps: indices and masks.

What a PyG conv without a twin saves besides activations is mostly indices: the scatter of
its aggregation keeps the target of every edge, :math:`E` ``int64`` values broadcast over the
feature columns (a view of a ``[2, E]`` edge index that the conv made itself, when it adds
self-loops or normalises, so that 16 bytes per edge stay alive), and a gather keeps the sources.
Next to activations at 2 bits they are a third of the context of a ``ChebConv`` model.
Quantization cannot touch them; an exact copy in fewer bytes can:

* a tensor broadcast along a dimension (stride 0) is kept once, not once per column;
* integers are kept in the narrowest of ``uint8``, ``int16`` and ``int32`` that holds their
  range :math:`[\min, \max]`, or their span :math:`\max - \min` after subtracting the
  minimum (the targets of a block of edges sorted by target span the block);
* booleans are kept at one bit each (:func:`gnnact.pack_mask`), and so are floating-point
  tensors that hold two values only (:func:`two_valued`: a dropout mask, which PyTorch's CPU
  dropout saves as :math:`\{0, 1/(1-p)\}` floats, or an additive attention mask).

Restoring gives the same values, dtype and shape, so backward computes what it computed
without compression, bit for bit. Choosing the width reads the minimum and maximum (and
:func:`two_valued` whether every value is one of them): on a GPU that is one synchronisation
per tensor compacted or checked.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gnnact.quant import PackedMask, pack_mask, unpack_mask

__all__ = ["INDEX_DTYPES", "CompactTensor", "compact", "two_valued", "unbroadcast"]

#: Dtypes :func:`compact` stores in fewer bytes.
INDEX_DTYPES = (torch.bool, torch.int16, torch.int32, torch.int64)

# Narrow dtypes in order of width: the first that holds the values is used.
_NARROW = (torch.uint8, torch.int16, torch.int32)


@dataclass(frozen=True)
class CompactTensor:
    r"""An integer or boolean tensor kept exactly in fewer bytes, made by :func:`compact`.

    Args:
        data (torch.Tensor): the values, flattened: ``value - offset`` in a narrower integer
            dtype, or the packed bits of a boolean tensor (of ``value == values[1]`` for a
            two-valued one).
        dtype (torch.dtype): the original dtype.
        shape (torch.Size): the original shape.
        offset (int, optional): what was subtracted from every value. (default: :obj:`0`)
        values (tuple[float, float], optional): the two values of a two-valued floating-point
            tensor, bit 0 and bit 1. (default: :obj:`None`)

    Example:
        >>> from gnnact.compress.lossless import compact
        >>> index = torch.arange(100_000, 105_000)  # int64: 40,000 bytes
        >>> c = compact(index)
        >>> c.data.dtype, c.offset, c.nbytes  # the span fits 16 bits
        (torch.int16, 100000, 10000)
        >>> torch.equal(c.dequantize(), index)
        True
    """

    data: Tensor
    dtype: torch.dtype
    shape: torch.Size
    offset: int = 0
    values: tuple[float, float] | None = None

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    @property
    def bits(self) -> int:
        """Bits kept per value."""
        return 1 if self.is_mask else 8 * self.data.element_size()

    @property
    def is_mask(self) -> bool:
        """Whether one bit per value is kept (a boolean or two-valued tensor)."""
        return self.dtype == torch.bool or self.values is not None

    @property
    def meta(self) -> tuple:
        return (self.dtype, self.shape, self.offset, self.values)

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.data,)

    @classmethod
    def from_parts(cls, tensors: tuple[Tensor, ...], meta: tuple) -> CompactTensor:
        return cls(tensors[0], *meta)

    def dequantize(self) -> Tensor:
        """The original tensor (contiguous), exactly."""
        if self.is_mask:
            bits = unpack_mask(PackedMask(self.data, self.shape))
            if self.values is None:
                return bits
            lo, hi = (torch.tensor(v, dtype=self.dtype, device=bits.device)
                      for v in self.values)
            return torch.where(bits, hi, lo)
        out = self.data.to(self.dtype)
        if self.offset:
            out += self.offset  # (a fresh tensor: in place is safe)
        return out.reshape(self.shape)


def unbroadcast(t: Tensor) -> Tensor:
    """The view of ``t`` with every broadcast dimension (stride 0, size > 1) cut to size 1:
    the values ``t`` holds, once each; ``unbroadcast(t).expand(t.shape)`` equals ``t``.

    Example:
        >>> index = torch.arange(4).view(-1, 1).expand(4, 64)  # what a scatter saves
        >>> unbroadcast(index).shape
        torch.Size([4, 1])
    """
    cut = tuple(slice(0, 1) if n > 1 and s == 0 else slice(None)
                for n, s in zip(t.shape, t.stride(), strict=True))
    return t[cut]


def _narrow(lo: int, hi: int, itemsize: int) -> tuple[torch.dtype, int] | None:
    """The narrowest dtype of :data:`_NARROW` (narrower than ``itemsize`` bytes) that holds
    ``[lo, hi]`` directly, else the span ``hi - lo`` after subtracting ``lo``; ``None`` when
    neither fits."""
    for dtype in _NARROW:
        info = torch.iinfo(dtype)
        if info.bits // 8 >= itemsize:
            break
        if info.min <= lo and hi <= info.max:
            return dtype, 0
        if hi - lo <= info.max:
            return dtype, lo
    return None


def compact(t: Tensor) -> CompactTensor | None:
    r"""``t`` (a boolean or integer tensor of :data:`INDEX_DTYPES`) stored exactly in fewer
    bytes, or ``None`` when its values need its own width. Broadcast dimensions are not cut
    here: pass :func:`unbroadcast` ``(t)``.

    Args:
        t (torch.Tensor): the tensor, any shape, contiguous or not.

    Returns:
        CompactTensor or None: the copy; ``copy.dequantize()`` equals ``t``.

    Raises:
        TypeError: if ``t`` is not a strided tensor of :data:`INDEX_DTYPES`.
    """
    if not isinstance(t, Tensor) or t.layout != torch.strided or t.dtype not in INDEX_DTYPES:
        what = f"{t.dtype} ({t.layout})" if isinstance(t, Tensor) else type(t).__name__
        raise TypeError(f"t must be a strided tensor of {INDEX_DTYPES}, got {what}")
    t = t.detach()
    if t.dtype == torch.bool:
        return CompactTensor(pack_mask(t).data, t.dtype, t.shape)
    if t.numel() == 0:
        return None
    lo, hi = (int(v) for v in torch.aminmax(t))  # (one synchronisation on a GPU)
    narrow = _narrow(lo, hi, t.element_size())
    if narrow is None:
        return None
    dtype, offset = narrow
    data = (t - offset if offset else t).reshape(-1).to(dtype)
    return CompactTensor(data, t.dtype, t.shape, offset)


#: Values :func:`two_valued` reads first, to turn most tensors down without a full read.
_SAMPLE = 4096


def _two_values(t: Tensor) -> tuple[Tensor, Tensor, Tensor] | None:
    """``(lo, hi, t == hi)`` when every value of ``t`` is its minimum or its maximum, else
    ``None`` (a NaN equals nothing)."""
    lo, hi = torch.aminmax(t)
    upper = t == hi
    return (lo, hi, upper) if bool((upper | (t == lo)).all()) else None


def two_valued(t: Tensor) -> CompactTensor | None:
    r"""A floating-point ``t`` that holds at most two distinct values, stored exactly at one
    bit per value (plus the two values), or ``None`` when it holds more (or a NaN). Reads
    ``t`` twice: its minimum and maximum, then whether every value is one of them (a contiguous
    ``t`` after the same test on its first few thousand values: most tensors fail there).

    Args:
        t (torch.Tensor): a strided floating-point tensor.

    Returns:
        CompactTensor or None: the copy; ``copy.dequantize()`` equals ``t``.

    Raises:
        TypeError: if ``t`` is not a strided floating-point tensor.

    Example:
        >>> from gnnact.compress.lossless import two_valued
        >>> mask = torch.nn.functional.dropout(torch.ones(1000), p=0.1)  # {0, 1/0.9}
        >>> c = two_valued(mask)
        >>> c.nbytes, torch.equal(c.dequantize(), mask)
        (125, True)
        >>> two_valued(torch.randn(1000)) is None
        True
    """
    if not isinstance(t, Tensor) or t.layout != torch.strided or not t.is_floating_point():
        what = f"{t.dtype} ({t.layout})" if isinstance(t, Tensor) else type(t).__name__
        raise TypeError(f"t must be a strided floating-point tensor, got {what}")
    t = t.detach()
    if t.numel() == 0:
        return None
    if t.numel() > _SAMPLE and t.is_contiguous() and _two_values(t.view(-1)[:_SAMPLE]) is None:
        # Three values among the first few: no full read. (What a compiled graph saves needs
        # no gradient, as a mask does: each of its tensors is asked, most hold many values.)
        return None
    found = _two_values(t)
    if found is None:
        return None
    lo, hi, upper = found  # (upper: the bits kept)
    return CompactTensor(pack_mask(upper).data, t.dtype, t.shape, values=(lo.item(), hi.item()))
