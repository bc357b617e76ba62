r"""Per-node mixed precision: a ``[N, F]`` tensor whose rows carry their own bit widths.

ActNN's per-sample allocation (Chen et al. 2021, §3.3) with nodes as samples. Row :math:`n`,
quantized on its own (one group per row, range :math:`R_n`) at :math:`b_n` bits, adds
:math:`\propto w_n S(b_n)` to the gradient's variance, where :math:`S(b) = (2^b - 1)^{-2}` and
:math:`w_n = g_n^2 R_n^2` with :math:`g_n` the norm of the gradient reaching that row (from the
previous step). :func:`allocate_rows` minimises :math:`\sum_n w_n S(b_n)` subject to
:math:`\sum_n b_n \le \bar b N`; rows with no gradient or no range get the smallest width.

:class:`MixedPackedTensor` keeps, per width in use, the rows' indices (``int32``) and a
:class:`~gnnact.quant.PackedTensor` of those rows with one group per row: a row of :math:`F`
values at :math:`b` bits costs :math:`\lceil F b / 8 \rceil + 8 + 4` bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from gnnact.quant.core import dequantize, quantize
from gnnact.quant.packed import QUANT_BITS, PackedTensor

__all__ = ["MixedPackedTensor", "allocate_rows", "quantize_rows"]


def allocate_rows(weights: Tensor, avg_bits: float,
                  widths: tuple[int, ...] = QUANT_BITS) -> Tensor:
    r"""Per-row widths minimising :math:`\sum_n w_n S(b_n)` subject to
    :math:`\sum_n b_n \le \bar b N`, by bisection on the Lagrange multiplier :math:`\lambda`
    of :math:`\min_b w_n S(b) + \lambda b` (each row independently), then spending what the
    budget has left on the rows that gain most from one more width step. Returns ``int64
    [N]``."""
    w = weights.detach().double().reshape(-1)
    n = w.numel()
    ws = torch.tensor(sorted(widths), dtype=torch.float64, device=w.device)
    if n == 0:
        return torch.empty(0, dtype=torch.int64, device=w.device)
    if avg_bits >= ws[-1]:
        return torch.full((n,), int(ws[-1]), dtype=torch.int64, device=w.device)
    budget = avg_bits * n
    factor = (torch.exp2(ws) - 1) ** -2

    def widths_at(lam: float) -> Tensor:
        return (w[:, None] * factor[None, :] + lam * ws[None, :]).argmin(dim=1)

    if float(w.max()) <= 0.0:  # no weight anywhere: the smallest width (and nothing to rank)
        return torch.full((n,), int(ws[0]), dtype=torch.int64, device=w.device)
    # Above the largest weight every row takes the smallest width: w (S(1) - S(b)) < w < λ.
    lo, hi = 0.0, float(w.max()) + 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if float(ws[widths_at(mid)].sum()) <= budget:
            hi = mid
        else:
            lo = mid
    index = widths_at(hi)
    # Rows tie at the multiplier: spend the rest greedily, best variance drop per bit first.
    spare = budget - float(ws[index].sum())
    up = (index + 1).clamp(max=len(ws) - 1)
    cost = ws[up] - ws[index]
    gain = torch.where(cost > 0, w * (factor[index] - factor[up]) / cost.clamp(min=1),
                       torch.zeros_like(w))
    order = torch.argsort(gain, descending=True)
    spent = torch.cumsum(cost[order], 0)
    take = order[(spent <= spare) & (gain[order] > 0)]
    index[take] = up[take]
    return ws[index].to(torch.int64)


@dataclass(frozen=True, eq=False)
class MixedPackedTensor:
    """A ``[N, F]`` tensor stored row by row at per-row bit widths (see the module docstring).

    Args:
        rows (tuple[torch.Tensor, ...]): ``int32`` row indices, one tensor per width in use.
        parts (tuple[PackedTensor, ...]): those rows packed, one group per row.
        bits (int): the average budget the widths were allocated for.
        shape (torch.Size): ``[N, F]``.
        dtype (torch.dtype): dtype of the original tensor.
    """

    rows: tuple[Tensor, ...]
    parts: tuple[PackedTensor, ...]
    bits: int
    shape: torch.Size
    dtype: torch.dtype

    is_passthrough = False

    def tensors(self) -> tuple[Tensor, ...]:
        """Per width: the row indices, codes, scales and zeros."""
        return tuple(t for idx, p in zip(self.rows, self.parts, strict=True)
                     for t in (idx, *p.tensors()))

    @property
    def meta(self) -> tuple:
        return (self.bits, self.shape, self.dtype,
                tuple((p.bits, p.shape, p.group_size) for p in self.parts))

    @classmethod
    def from_parts(cls, tensors: tuple[Tensor, ...], meta: tuple) -> MixedPackedTensor:
        bits, shape, dtype, layout = meta
        rows, parts = [], []
        for k, (b, part_shape, group) in enumerate(layout):
            idx, codes, scales, zeros = tensors[4 * k:4 * k + 4]
            rows.append(idx)
            parts.append(PackedTensor(codes, scales, zeros, b, part_shape, dtype, group))
        return cls(tuple(rows), tuple(parts), bits, shape, dtype)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def dequantize(self) -> Tensor:
        out = torch.empty(self.shape, dtype=self.dtype, device=self.rows[0].device
                          if self.rows else "cpu")
        for idx, part in zip(self.rows, self.parts, strict=True):
            out[idx.long()] = dequantize(part)
        return out


def quantize_rows(x: Tensor, row_bits: Tensor, *, avg_bits: int,
                  generator: torch.Generator | None = None,
                  backend: str = "auto") -> MixedPackedTensor:
    """Quantize each row of ``x [N, F]`` at ``row_bits[n]`` bits, one group per row."""
    if x.dim() != 2:
        raise ValueError(f"x must be [N, F], got shape {tuple(x.shape)}")
    if row_bits.shape != (x.size(0),):
        raise ValueError(f"row_bits must have shape ({x.size(0)},), got "
                         f"{tuple(row_bits.shape)}")
    rows, parts = [], []
    for b in torch.unique(row_bits).tolist():
        idx = torch.nonzero(row_bits == b).view(-1)
        parts.append(quantize(x[idx], int(b), per_row=True, generator=generator,
                              backend=backend))
        rows.append(idx.to(torch.int32))
    return MixedPackedTensor(tuple(rows), tuple(parts), avg_bits, x.shape, x.dtype)
