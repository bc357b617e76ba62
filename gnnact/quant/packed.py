r"""Packed containers for compressed activations.

Layout of a :class:`PackedTensor` with :math:`b \in \{1, \dots, 8\}` bits, for an input of
:math:`n` elements (flattened in row-major order) and group size :math:`G`:

* the flat input is cut into :math:`n_g = \lceil n / G \rceil` groups of :math:`G` consecutive
  elements; the last group may be shorter (and :math:`G` is capped at :math:`n`, so a small
  tensor is a single group of its own size);
* ``codes`` is a ``uint8`` tensor of shape ``[n_g, ceil(G * b / 8)]``: element :math:`j` of a
  group sits in byte :math:`\lfloor jb/8 \rfloor` at bit offset :math:`jb \bmod 8`, least
  significant bits first (with :math:`b` of 3, 5, 6 or 7 a code may straddle two bytes; the
  CUDA kernels implement the byte-aligned 1, 2, 4, 8); the unused tail of the last group (and
  of a group whose :math:`G b` is not a multiple of 8) holds zero bits;
* ``scales`` and ``zeros`` are ``float32`` tensors of shape ``[n_g]``: the group's
  :math:`R / (2^b - 1)` and minimum :math:`Z`.

So the exact number of bytes held is

.. math::
    \text{nbytes} = n_g \left( \left\lceil \frac{G b}{8} \right\rceil + 8 \right),

which for the default :math:`G = 512` is :math:`b + 0.125` bits per element: the 32-bit scale
and 32-bit zero cost :math:`64 / 512 = 0.125` bit per value. Float32 metadata (rather than
ActNN's bfloat16 with :math:`G = 256`) keeps the zero point exact, so a group far from the origin
with a small range is not widened by the rounding of its own minimum.

With ``bits`` of 16 or 32 the tensor passes through: ``codes`` holds the data itself (32: the
input tensor, no copy; 16: a 16-bit copy) and ``scales``/``zeros`` are ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gnnact.names import BYTE_ALIGNED_BITS, QUANT_BITS, SUPPORTED_BITS

__all__ = ["BYTE_ALIGNED_BITS", "DEFAULT_GROUP_SIZE", "QUANT_BITS", "SUPPORTED_BITS", "PackedMask",
           "PackedTensor", "packed_code_bytes", "packed_nbytes"]

#: Default elements per group: float32 scale + zero cost 64 / 512 = 0.125 bit per value.
DEFAULT_GROUP_SIZE = 512


def packed_code_bytes(group_size: int, bits: int) -> int:
    r"""Bytes of codes per group: :math:`\lceil G b / 8 \rceil`."""
    return (group_size * bits + 7) // 8


def packed_nbytes(numel: int, bits: int, group_size: int) -> int:
    r"""Bytes :func:`gnnact.quantize` keeps for ``numel`` values at ``bits`` bits in groups of
    ``group_size`` (a tensor smaller than one group is one group of its own size): codes plus
    a float32 scale and zero per group, :math:`\lceil n / G \rceil (\lceil G b / 8 \rceil + 8)`.
    """
    if numel == 0:
        return 0
    g = min(group_size, numel)
    return -(-numel // g) * (packed_code_bytes(g, bits) + 8)


def _tensors_nbytes(tensors: tuple[Tensor, ...]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass(frozen=True, eq=False)
class PackedTensor:
    r"""A tensor stored as per-group stochastically rounded, bit-packed codes.

    Made by :func:`gnnact.quantize`, restored by :func:`gnnact.dequantize`; see the module
    docstring for the byte layout.

    Args:
        codes (torch.Tensor): ``uint8`` codes ``[num_groups, ceil(group_size * bits / 8)]``,
            or the stored data itself for 16/32 bits.
        scales (torch.Tensor, optional): ``float32`` group scales :math:`R/(2^b-1)`,
            ``[num_groups]``.
        zeros (torch.Tensor, optional): ``float32`` group minima :math:`Z`, ``[num_groups]``.
        bits (int): bits per element: 1 to 8, 16 or 32.
        shape (torch.Size): shape of the original tensor.
        dtype (torch.dtype): dtype of the original tensor (and of the dequantized one).
        group_size (int): elements per group (0 for pass-through).

    Example:
        >>> p = gnnact.quantize(torch.randn(1000, 128), bits=2)
        >>> p.codes.shape, p.scales.shape  # 250 groups of 512 values, 2 bits each
        (torch.Size([250, 128]), torch.Size([250]))
        >>> p.nbytes == p.num_groups * (128 + 8)
        True
        >>> p.dequantize().shape
        torch.Size([1000, 128])
        >>> gnnact.quant.PackedTensor.from_parts(p.tensors(), p.meta).nbytes == p.nbytes
        True
    """

    codes: Tensor
    scales: Tensor | None
    zeros: Tensor | None
    bits: int
    shape: torch.Size
    dtype: torch.dtype
    group_size: int

    @property
    def numel(self) -> int:
        """Number of elements of the original tensor."""
        return self.shape.numel()

    @property
    def num_groups(self) -> int:
        """Number of quantization groups (0 for pass-through)."""
        return 0 if self.scales is None else self.scales.numel()

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def is_passthrough(self) -> bool:
        """``True`` for 16/32 bits, where the data is kept as floating point."""
        return self.bits > 8

    def tensors(self) -> tuple[Tensor, ...]:
        """The tensors this object holds (what :attr:`nbytes` counts)."""
        return tuple(t for t in (self.codes, self.scales, self.zeros) if t is not None)

    @property
    def meta(self) -> tuple:
        """Everything but :meth:`tensors`: with them, :meth:`from_parts` rebuilds ``self``."""
        return (self.bits, self.shape, self.dtype, self.group_size)

    @classmethod
    def from_parts(cls, tensors: tuple[Tensor, ...], meta: tuple) -> PackedTensor:
        """Inverse of (:meth:`tensors`, :attr:`meta`)."""
        parts = (*tensors, *(None,) * (3 - len(tensors)))
        return cls(*parts, *meta)

    def dequantize(self) -> Tensor:
        """:func:`gnnact.dequantize` of ``self``."""
        from gnnact.quant.core import dequantize

        return dequantize(self)

    @property
    def nbytes(self) -> int:
        """Exact bytes held by :attr:`codes`, :attr:`scales` and :attr:`zeros`."""
        return _tensors_nbytes(self.tensors())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedTensor:
        """A copy on ``device`` (``self`` if it is already there)."""
        device = torch.device(device)
        if self.codes.device == device:
            return self

        def move(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return PackedTensor(move(self.codes), move(self.scales), move(self.zeros), self.bits,
                            self.shape, self.dtype, self.group_size)

    def __repr__(self) -> str:
        return (f"PackedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, bits={self.bits}, "
                f"group_size={self.group_size}, nbytes={self.nbytes}, device={self.device})")


@dataclass(frozen=True, eq=False)
class PackedMask:
    r"""A boolean tensor packed to one bit per element.

    Element :math:`i` (row-major) is bit :math:`i \bmod 8` of byte :math:`\lfloor i/8 \rfloor`
    of :attr:`data`, so ``nbytes`` is :math:`\lceil n/8 \rceil`, 8× less than a ``torch.bool``
    tensor. Made by :func:`gnnact.pack_mask`, restored by :func:`gnnact.unpack_mask`.

    Args:
        data (torch.Tensor): ``uint8`` packed bits, ``[ceil(n / 8)]``.
        shape (torch.Size): shape of the original mask.

    Example:
        >>> p = gnnact.pack_mask(torch.tensor([True, False, True]))
        >>> p.data, p.nbytes  # bits 0 and 2 of one byte
        (tensor([5], dtype=torch.uint8), 1)
        >>> gnnact.unpack_mask(p)
        tensor([ True, False,  True])
    """

    data: Tensor
    shape: torch.Size

    @property
    def numel(self) -> int:
        return self.shape.numel()

    @property
    def device(self) -> torch.device:
        return self.data.device

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.data,)

    @property
    def nbytes(self) -> int:
        return _tensors_nbytes(self.tensors())

    def to(self, device: torch.device | str, non_blocking: bool = False) -> PackedMask:
        device = torch.device(device)
        if self.data.device == device:
            return self
        return PackedMask(self.data.to(device, non_blocking=non_blocking), self.shape)

    def __repr__(self) -> str:
        return (f"PackedMask(shape={tuple(self.shape)}, nbytes={self.nbytes}, "
                f"device={self.device})")
