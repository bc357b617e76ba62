"""The compressor interface of :class:`gnnact.compress_saved_tensors`."""

from __future__ import annotations

import abc
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["Compressed", "Compressor"]


class Compressed(Protocol):
    """What a compressor returns: restorable, byte-counted and splittable into tensors (so that
    gnnact's one cache of shared copies can hold it by weak references).

    A protocol (structural type), not a class to instantiate or derive from:
    :class:`~gnnact.quant.PackedTensor`, :class:`~gnnact.compress.DualPrecisionTensor` and
    :class:`~gnnact.compress.RegroupedTensor` satisfy it. An object of this kind has

    * ``nbytes`` (int): the exact bytes its tensors hold;
    * ``tensors()``: the tensors it holds, and ``meta``: everything else (hashable), such
      that ``type(c).from_parts(c.tensors(), c.meta)`` rebuilds ``c``;
    * ``dequantize()``: the restored tensor, of the shape and dtype of the compressed one.

    Example:
        >>> from gnnact.compress import Quantize
        >>> c = Quantize(bits=4).compress(torch.randn(64, 128), "h")
        >>> c.nbytes  # 16 groups of 512 values: 256 code bytes + 8 bytes each
        4224
        >>> rebuilt = type(c).from_parts(c.tensors(), c.meta)
        >>> torch.equal(rebuilt.dequantize(), c.dequantize())
        True
    """

    @property
    def nbytes(self) -> int: ...

    @property
    def meta(self) -> tuple: ...

    def tensors(self) -> tuple[Tensor, ...]: ...

    def dequantize(self) -> Tensor: ...

    @classmethod
    def from_parts(cls, tensors: tuple[Tensor, ...], meta: tuple) -> Any: ...


class Compressor(abc.ABC):
    """Stores one saved tensor compressed and restores it for backward.

    Subclasses set :attr:`kind` and implement :meth:`compress`; :attr:`fmt` identifies the
    format, so that a tensor already compressed in this format is shared, not compressed
    again. :attr:`bits` is the width :class:`gnnact.Controller` may change through
    :meth:`with_bits` when :attr:`adaptive` is set. A :class:`~gnnact.compress.Policy` assigns
    compressors to saved tensors; :class:`gnnact.compress_saved_tensors` calls
    :meth:`compress` in the pack hook and the result's ``dequantize()`` in the unpack hook.

    Class attributes:

    * ``kind`` (str): a short name, the key in ``bytes_by_kind`` of
      :class:`gnnact.compress_saved_tensors`. (default: :obj:`"compressor"`)
    * ``bits`` (int, optional): bits per value; 32 makes the pipeline keep the tensor as is.
      (default: :obj:`None`)
    * ``adaptive`` (bool): whether :meth:`with_bits` works. (default: :obj:`False`)

    Example:
        >>> from gnnact.compress import Compressor, Policy
        >>> class BFloat16(Compressor):  # keep saved tensors in bfloat16
        ...     kind, bits = "bfloat16", 16
        ...     @property
        ...     def fmt(self):
        ...         return ("bfloat16",)
        ...     def compress(self, t, name, generator=None):
        ...         return gnnact.quantize(t, bits=16)
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(),
        ...                             torch.nn.Linear(64, 1))
        >>> hooks = gnnact.compress_saved_tensors(policy=Policy(default=BFloat16()))
        >>> with hooks:
        ...     loss = model(torch.randn(2048, 64)).sum()
        >>> loss.backward()
        >>> hooks.bytes_by_kind["bfloat16"]  # the Tanh output: 131,072 values, 2 bytes each
        262144
    """

    kind: str = "compressor"
    bits: int | None = None
    adaptive: bool = False  # whether with_bits works: gnnact.Controller may adapt it

    @abc.abstractmethod
    def compress(self, t: Tensor, name: str,
                 generator: torch.Generator | None = None) -> Compressed:
        """Compress ``t`` (detached), the tensor named ``name``; the rounding noise comes from
        ``generator`` (the global generator when ``None``)."""

    @property
    @abc.abstractmethod
    def fmt(self) -> tuple:
        """A hashable description of the format."""

    def with_bits(self, bits: int) -> Compressor:
        """The same compressor at ``bits`` bits per value."""
        raise TypeError(f"{type(self).__name__} has no adaptive width")
