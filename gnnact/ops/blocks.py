"""Row blocks of the by-block loops in backward (and in the fused forward): blocks of about
``gnnact.quant.reference.block_elements`` values (a sixteenth of the tensor, within 64Ki and
1Mi values), so that a loop over a full-size tensor holds one block's temporaries at a time,
a small share of the tensor."""

from __future__ import annotations

import itertools

import torch
from torch import Tensor

from gnnact.quant.reference import block_elements

__all__ = ["element_blocks", "row_starts", "sum_of_products"]


def row_starts(rows: int, width: int) -> list[int]:
    """Boundaries ``[0, r_1, ..., rows]`` of row blocks of a ``[rows, width]`` tensor, each
    of about ``gnnact.quant.reference.block_elements`` values (at least one row)."""
    step = max(1, block_elements(rows * width) // max(1, width))
    return [*range(0, rows, step), rows]


def element_blocks(n: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive blocks of about
    ``gnnact.quant.reference.block_elements(n)`` values covering ``range(n)`` (a flat
    tensor's :func:`row_starts`)."""
    return list(itertools.pairwise(row_starts(n, 1)))


def sum_of_products(a: Tensor, b: Tensor, dims: list[int]) -> Tensor:
    """``(a * b).sum(dims)`` (``dims`` including 0) over row blocks (:func:`row_starts`): the
    product, broadcast to full size, never exists whole (it would be a full-size temporary at
    a backward's peak). Blocks are summed in at least float32, as torch sums a 16-bit tensor,
    and rounded once at the end."""
    dtype = torch.result_type(a, b)
    rows = max(a.size(0), b.size(0))
    starts = row_starts(rows, max(a[:1].numel(), b[:1].numel()))
    if len(starts) <= 2:
        return (a * b).sum(dims)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    total: Tensor | None = None
    for r0, r1 in itertools.pairwise(starts):
        part = (a[r0:r1] * b[r0:r1]).sum(dims, dtype=acc)
        total = part if total is None else total.add_(part)
    assert total is not None
    return total.to(dtype)
