r"""Per-group stochastic quantization, the core compressor (GACT, ActNN)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from gnnact.compress.base import Compressor
from gnnact.config import Config
from gnnact.quant import PackedTensor, quantize

__all__ = ["Quantize"]


@dataclass(frozen=True)
class Quantize(Compressor):
    r"""Per-group min/max quantization with unbiased stochastic rounding
    (:func:`gnnact.quantize`): groups of :math:`G` consecutive values (or one per row of the
    last dimension) keep a float32 scale and zero, every value a :math:`b`-bit code,

    .. math::
        \hat h_j = \left\lfloor \frac{h_j - Z}{s} + u_j \right\rfloor s + Z, \qquad
        \mathbb{E}[\hat h_j] = h_j, \qquad \operatorname{Var}[\hat h_j] \le s^2 / 4,

    :math:`b + 64/G` bits per value. ``bits`` of 16 or 32 keep the tensor uncompressed.

    Args:
        bits (int, optional): 1 to 8, 16 or 32. (default: :obj:`2`)
        group_size (int, optional): :math:`G`. (default: :obj:`512`)
        per_row (bool, optional): one group per row of the last dimension.
            (default: :obj:`False`)
        backend (str, optional): as in :func:`gnnact.quantize`. (default: :obj:`"auto"`)

    Example:
        >>> from gnnact.compress import Quantize
        >>> q = Quantize(bits=4)
        >>> packed = q.compress(torch.randn(1000, 128), "lin:0")  # a PackedTensor
        >>> packed.nbytes  # 250 groups of 512 values: 256 code bytes + 8 bytes each
        66000
        >>> q.with_bits(2)  # what gnnact.Controller does to adapt it
        Quantize(bits=2, group_size=512, per_row=False, backend='auto')
        >>> hooks = gnnact.compress_saved_tensors(policy=gnnact.compress.Policy(default=q))
    """

    bits: int = 2
    group_size: int = 512
    per_row: bool = False
    backend: str = "auto"
    kind = "quantize"
    adaptive = True

    def __post_init__(self) -> None:
        # Config validates widths, group size and backend with the same messages.
        Config(bits=self.bits, group_size=self.group_size, per_row=self.per_row,
               backend=self.backend)

    @classmethod
    def from_config(cls, config: Config) -> Quantize:
        """The compressor with ``config``'s bits, group size, ``per_row`` and backend."""
        return cls(config.width, config.group_size, config.per_row, config.backend)

    @property
    def fmt(self) -> tuple:
        # The format key gnnact's ops use for the same quantization (no per-node precision),
        # so a tensor quantized by an op and saved by a plain torch op is shared.
        return (self.bits, self.group_size, self.per_row, False, self.backend)

    def compress(self, t: Tensor, name: str,
                 generator: torch.Generator | None = None) -> PackedTensor:
        return quantize(t, self.bits, self.group_size, per_row=self.per_row,
                        generator=generator, backend=self.backend)

    def with_bits(self, bits: int) -> Quantize:
        return replace(self, bits=bits)
