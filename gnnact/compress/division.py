r"""DIVISION's dual precision: a pooled low-frequency part in 16 bits plus a 2-bit residual
(Wang et al., 2023)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnact.compress.base import Compressor
from gnnact.config import Config
from gnnact.quant import PackedTensor, quantize

__all__ = ["Division", "DualPrecisionTensor"]


def _upsample(low: Tensor, kernel: tuple[int, ...], shape: torch.Size) -> Tensor:
    """Nearest upsampling of the pooled ``low`` back to ``shape`` (pooled dims last)."""
    out = low
    for i, k in enumerate(kernel):
        dim = len(shape) - len(kernel) + i
        out = out.repeat_interleave(k, dim=dim).narrow(dim, 0, shape[dim])
    return out


@dataclass(frozen=True)
class DualPrecisionTensor:
    r""":attr:`low`, the block averages in 16 bits, and :attr:`high`, the quantized residual:
    what :class:`Division` keeps of a tensor :math:`H`. :meth:`dequantize` returns

    .. math::
        \hat H = \operatorname{Up}(H^L) + \hat H^H

    (nearest upsampling of the block averages plus the dequantized residual) in :attr:`dtype`.

    Args:
        low (torch.Tensor): the block averages :math:`H^L` in ``float16`` or ``bfloat16``: the
            shape of :math:`H` with each pooled dimension of size :math:`s` reduced to
            :math:`\lceil s / B \rceil`.
        high (gnnact.quant.PackedTensor): the residual :math:`H^H`, quantized with one group per
            slice over the pooled dimensions, as a ``[slices, pooled values]`` matrix.
        shape (torch.Size): the shape of :math:`H`.
        kernel (tuple[int, ...]): the block size along each pooled dimension.
        dtype (torch.dtype): the dtype of :math:`H` (and of the restored tensor).

    Example:
        >>> from gnnact.compress import Division
        >>> c = Division(block=8, bits=2).compress(torch.randn(32, 16, 28, 28), "conv:0")
        >>> c.low.shape, c.kernel
        (torch.Size([32, 16, 4, 4]), (8, 8))
        >>> c.dequantize().shape
        torch.Size([32, 16, 28, 28])
    """

    low: Tensor
    high: PackedTensor
    shape: torch.Size
    kernel: tuple[int, ...]
    dtype: torch.dtype

    def tensors(self) -> tuple[Tensor, ...]:
        return (self.low, *self.high.tensors())

    @property
    def meta(self) -> tuple:
        return (self.high.meta, self.shape, self.kernel, self.dtype)

    @classmethod
    def from_parts(cls, tensors: tuple[Tensor, ...], meta: tuple) -> DualPrecisionTensor:
        inner, *rest = meta
        return cls(tensors[0], PackedTensor.from_parts(tensors[1:], inner), *rest)

    @property
    def nbytes(self) -> int:
        return self.low.numel() * self.low.element_size() + self.high.nbytes

    def dequantize(self) -> Tensor:
        up = _upsample(self.low.to(torch.float32), self.kernel, self.shape)
        return (up + self.high.dequantize().view(self.shape)).to(self.dtype)


@dataclass(frozen=True)
class Division(Compressor):
    r"""DIVISION's compressor: the low-frequency component (LFC), block averages, kept in 16
    bits; the high-frequency residual (HFC) quantized to a few bits.

    For a tensor :math:`H` the pooled dimensions are the last two of a rank-4 tensor (the
    spatial map of a conv input ``[N, C, H, W]``) and the last one otherwise (the feature axis
    of a linear input, DIVISION's MLP variant). With block :math:`B` (clipped to each pooled
    size; a partial block at the edge averages what it covers),

    .. math::
        H^L = \operatorname{AvgPool}_B(H)\ \text{(float16)}, \qquad
        H^H = H - \operatorname{Up}(H^L), \qquad
        \hat H = \operatorname{Up}(H^L) + \hat H^H,

    where :math:`\hat H^H` is :math:`H^H` stochastically rounded to :math:`Q` bits with one
    min/scale pair per slice over the pooled dimensions (per sample and channel), so
    :math:`\mathbb{E}[\hat H] = H`: the residual is taken against the *stored* 16-bit LFC.
    What is kept: :math:`H^L` (:math:`2/B^2` bytes per value for a map, :math:`2/B` for a
    vector) and :math:`Q` bits per value plus a float32 min and scale per slice. (DIVISION
    stores the pair in float16; float32 keeps the rounding of the scale from breaking the
    unbiasedness.)

    Args:
        block (int, optional): :math:`B`. (default: :obj:`8`)
        bits (int, optional): :math:`Q`, 1 to 8. (default: :obj:`2`)
        low_dtype (torch.dtype, optional): ``torch.float16`` or ``torch.bfloat16`` (for
            activations beyond float16's range). (default: :obj:`torch.float16`)
        backend (str, optional): the residual's quantizer backend. (default: :obj:`"auto"`)

    Example:
        >>> from gnnact.compress import Division, Policy
        >>> division = Division(block=8, bits=2)
        >>> c = division.compress(torch.randn(32, 16, 28, 28), "conv:0")  # [N, C, H, W]
        >>> c.nbytes  # 4x4 float16 averages + 2 bits and 8 bytes per 28x28 map
        120832
        >>> hooks = gnnact.compress_saved_tensors(policy=Policy(default=division))
    """

    block: int = 8
    bits: int = 2
    low_dtype: torch.dtype = torch.float16
    backend: str = "auto"
    kind = "division"
    adaptive = True

    def __post_init__(self) -> None:
        if isinstance(self.block, bool) or not isinstance(self.block, int) or self.block < 1:
            raise ValueError(f"Division block must be a positive int, got {self.block!r}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or self.bits > 8:
            raise ValueError(f"Division bits must be one of 1 to 8, got {self.bits!r}")
        if self.low_dtype not in (torch.float16, torch.bfloat16):
            raise ValueError(f"Division low_dtype must be torch.float16 or torch.bfloat16, got "
                             f"{self.low_dtype!r}")
        Config(bits=self.bits, backend=self.backend)

    @property
    def fmt(self) -> tuple:
        return ("division", self.block, self.bits, self.low_dtype, self.backend)

    def compress(self, t: Tensor, name: str,
                 generator: torch.Generator | None = None) -> DualPrecisionTensor:
        x = t.detach()
        shape = x.shape
        spatial = 2 if x.dim() == 4 else 1
        if x.dim() == 0:
            raise ValueError("Division needs a tensor with at least one dimension, got a 0-d "
                             "tensor")
        sizes = x.shape[-spatial:]
        kernel = tuple(min(self.block, s) for s in sizes)
        flat = x.reshape(-1, 1, *sizes).to(torch.float32)
        pool = F.avg_pool2d if spatial == 2 else F.avg_pool1d
        low = pool(flat, kernel, kernel, ceil_mode=True).to(self.low_dtype)
        low = low.view(*x.shape[:-spatial], *low.shape[2:])
        high = x.to(torch.float32) - _upsample(low.to(torch.float32), kernel, x.shape)
        packed = quantize(high.reshape(-1, sizes.numel()), self.bits, per_row=True,
                          generator=generator, backend=self.backend)
        return DualPrecisionTensor(low, packed, shape, kernel, t.dtype)

    def with_bits(self, bits: int) -> Division:
        return replace(self, bits=bits)
