"""The compressor interface of :class:`gnnact.compress_saved_tensors`."""

from __future__ import annotations

import abc
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["Compressed", "Compressor"]


class Compressed(Protocol):
    """What a compressor returns: restorable, byte-counted and splittable into tensors (so that
    gnnact's one cache of shared copies can hold it by weak references)."""

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
    :meth:`with_bits` when :attr:`adaptive` is set."""

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
