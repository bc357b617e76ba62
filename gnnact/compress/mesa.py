r"""Mesa's head-wise 8-bit quantization with running-estimate ranges (Pan et al., 2021)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gnnact.compress.base import Compressor
from gnnact.quant import PackedTensor
from gnnact.quant.backends import grid_backend
from gnnact.quant.packed import QUANT_BITS
from gnnact.quant.rng import draw_seed

__all__ = ["Mesa", "RegroupedTensor"]


@dataclass(frozen=True)
class RegroupedTensor:
    """A tensor of shape :attr:`shape` viewed as ``[a, g, b]`` and quantized as ``g`` groups
    of ``a * b`` values (axis ``g`` first): one group per attention head, or per block of
    channels. What :class:`Mesa` keeps; :meth:`dequantize` restores the tensor of shape
    :attr:`shape`.

    Args:
        packed (gnnact.quant.PackedTensor): the codes of the ``[g, a * b]`` regrouped tensor,
            with one float32 scale and offset per group.
        shape (torch.Size): the shape of the original tensor.
        a (int): the product of the dimensions before the grouped one.
        g (int): the number of groups (heads, or channel blocks).
        b (int): the values per group and leading index (the product of the dimensions after
            the grouped one, or the width of a channel block).

    Example:
        >>> from gnnact.compress import Mesa
        >>> c = Mesa(bits=8).compress(torch.randn(2, 4, 16, 16), "attn:0")  # [B, H, L, L]
        >>> (c.a, c.g, c.b), c.packed.num_groups  # one group per head
        ((2, 4, 256), 4)
        >>> c.dequantize().shape
        torch.Size([2, 4, 16, 16])
    """

    packed: PackedTensor
    shape: torch.Size
    a: int
    g: int
    b: int

    def tensors(self) -> tuple[Tensor, ...]:
        return self.packed.tensors()

    @property
    def meta(self) -> tuple:
        return (self.packed.meta, self.shape, self.a, self.g, self.b)

    @classmethod
    def from_parts(cls, tensors: tuple[Tensor, ...], meta: tuple) -> RegroupedTensor:
        inner, *rest = meta
        return cls(PackedTensor.from_parts(tensors, inner), *rest)

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes

    def dequantize(self) -> Tensor:
        flat = self.packed.dequantize()
        # contiguous(): a reshape of the transposed view can itself be a view with permuted
        # strides, which cuDNN's backward kernels reject (seen on an H100: BatchNorm2d).
        return flat.view(self.g, self.a, self.b).transpose(0, 1).contiguous().view(self.shape)


class Mesa(Compressor):
    r"""Mesa's quantizer: one group per attention head (or per block of channels), with
    ranges tracked as running estimates across steps instead of per-batch statistics.

    A tensor of rank 4 ``[B, H, L, *]`` (queries, keys, values, attention maps, before or after
    softmax) gets one group per head (dimension :obj:`head_dim`); any other tensor one group
    per block of contiguous channels of its last dimension (:obj:`channel_groups` blocks, or
    the largest divisor of the width below that). Group :math:`h` keeps a range
    :math:`\alpha_h` and offset :math:`\beta_h`, updated at every compression of the tensor
    named ``name`` from the current batch,

    .. math::
        \alpha_h \leftarrow \lambda \alpha_h + (1 - \lambda)(\max X_h - \min X_h), \qquad
        \beta_h \leftarrow \lambda \beta_h + (1 - \lambda) \min X_h,

    (initialised from the first batch), and each value becomes

    .. math::
        q = \operatorname{clip}\Bigl(\Bigl\lfloor \frac{(x - \beta_h)(2^b - 1)}{\alpha_h}
            + u \Bigr\rfloor, 0, 2^b - 1\Bigr), \quad u \sim \mathcal{U}[0, 1), \qquad
        \hat x = q \frac{\alpha_h}{2^b - 1} + \beta_h.

    Values inside :math:`[\beta_h, \beta_h + \alpha_h]` are rounded without bias; values
    outside (a range lagging the batch) are clipped, which biases them:
    :meth:`clipped_fraction` reports how many were. What is kept: the packed codes and two
    float32 numbers per group, :math:`b` bits per value plus :math:`64 g` bits.

    Args:
        bits (int, optional): 1 to 8. (default: :obj:`8`, Mesa's choice)
        momentum (float, optional): :math:`\lambda`. (default: :obj:`0.9`)
        head_dim (int, optional): the head dimension of rank-4 tensors. (default: :obj:`1`)
        channel_groups (int, optional): channel blocks of other tensors. (default: :obj:`8`)

    Example:
        >>> from gnnact.compress import Mesa, Policy, Rule
        >>> mesa = Mesa(bits=8)
        >>> c = mesa.compress(torch.randn(2, 4, 16, 16), "attn:0")  # 4 heads: 4 groups
        >>> c.nbytes  # 8 bits per value + 8 bytes per head
        2080
        >>> mesa.clipped_fraction()  # first batch: the ranges are the batch's own
        {'attn:0': 0.0}
        >>> policy = Policy([Rule(mesa, names=("*attn*",), dims=(4,))])
    """

    kind = "mesa"

    def __init__(self, bits: int = 8, momentum: float = 0.9, head_dim: int = 1,
                 channel_groups: int = 8) -> None:
        if isinstance(bits, bool) or bits not in QUANT_BITS:
            raise ValueError(f"Mesa bits must be one of {QUANT_BITS}, got {bits!r}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"Mesa momentum must be in [0, 1), got {momentum!r}")
        if isinstance(head_dim, bool) or not isinstance(head_dim, int) or not -4 <= head_dim < 4:
            raise ValueError(f"Mesa head_dim must be a dimension of a rank-4 tensor (-4 to 3), "
                             f"got {head_dim!r}")
        if not isinstance(channel_groups, int) or channel_groups < 1:
            raise ValueError(f"Mesa channel_groups must be a positive int, got "
                             f"{channel_groups!r}")
        self.bits = bits
        self.momentum = momentum
        self.head_dim = head_dim
        self.channel_groups = channel_groups
        # name -> (alpha, beta, values seen, values clipped) of the last compression
        self.state: dict[str, tuple[Tensor, Tensor, int, Tensor]] = {}

    def __repr__(self) -> str:
        return (f"Mesa(bits={self.bits}, momentum={self.momentum}, head_dim={self.head_dim}, "
                f"channel_groups={self.channel_groups})")

    @property
    def fmt(self) -> tuple:
        return ("mesa", id(self))

    def _layout(self, shape: torch.Size) -> tuple[int, int, int]:
        if len(shape) == 4:
            d = self.head_dim % 4
            return math.prod(shape[:d]), shape[d], math.prod(shape[d + 1:])
        width = shape[-1] if len(shape) else 1
        g = max(k for k in range(1, min(self.channel_groups, width) + 1) if width % k == 0)
        return math.prod(shape) // width, g, width // g

    def compress(self, t: Tensor, name: str,
                 generator: torch.Generator | None = None) -> RegroupedTensor:
        x = t.detach()
        a, g, b = self._layout(x.shape)
        h = x.reshape(a, g, b).transpose(0, 1).reshape(g, a * b).to(torch.float32)
        low = h.amin(dim=1)
        width = h.amax(dim=1) - low
        state = self.state.get(name)
        if state is None or state[0].shape != low.shape or state[0].device != low.device:
            alpha, beta = width, low
        else:
            lam = self.momentum
            alpha = lam * state[0] + (1 - lam) * width
            beta = lam * state[1] + (1 - lam) * low
        levels = (1 << self.bits) - 1
        levels_t = torch.full_like(alpha, float(levels))
        scale = alpha / levels_t
        inv = torch.where(alpha > 0, levels_t / alpha, torch.zeros_like(alpha))
        # (Values a rounding error beyond the range, such as the maximum that defined it, are
        # clamped without counting as clipped.)
        slack = 1e-4 * levels
        rounding = grid_backend(h, self.bits)  # (the CPU kernel: one pass, ten times faster)
        codes, clipped = rounding.quantize_on_grid(h, beta, inv, self.bits, -slack,
                                                   levels + slack, seed=draw_seed(generator))
        self.state[name] = (alpha, beta, h.numel(), clipped.sum())
        packed = PackedTensor(codes, scale, beta, self.bits,
                              torch.Size([g * a * b]), x.dtype, a * b)
        return RegroupedTensor(packed, x.shape, a, g, b)

    def clipped_fraction(self) -> dict[str, float]:
        """Per tensor name, the fraction of values clipped at its last compression."""
        return {name: float(s[3]) / max(s[2], 1) for name, s in self.state.items()}
