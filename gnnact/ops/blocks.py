"""Row blocks of the by-block loops in backward (and in the fused forward): blocks of about
``gnnact.quant.reference.block_elements`` values (a sixteenth of the tensor, within 64Ki and
1Mi values), so that a loop over a full-size tensor holds one block's temporaries at a time,
a small share of the tensor. On a GPU a block holds :data:`GPU_BLOCK_ELEMENTS` values at least,
and a sixteenth of the tensor at most (see there)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import Tensor

from gnnact.quant.reference import BLOCKS, block_elements

__all__ = ["GPU_BLOCK_ELEMENTS", "element_blocks", "mean_by_blocks", "row_starts",
           "sum_by_blocks", "sum_of_products"]

#: The fewest values of a block on a GPU (16 MiB of float32), where a tensor is cut into
#: ``BLOCKS`` blocks at most (``CHUNK_ELEMENTS`` does not bound them there). A block's cost on a
#: GPU is mostly the host's: its slices, a sparse matrix's construction and a few kernel
#: launches, 0.1-0.3 ms whatever its size, while the GPU runs a block of this size in about as
#: long. Blocks of a CPU's size (64Ki-1Mi values) left an H200 idle: Cora's GCN (16 blocks a
#: backward) stepped 2.8x PyG's, Coauthor Physics' (70 blocks of 4Mi values) 5.3x. A block's
#: temporaries stay about a sixteenth of its tensor.
GPU_BLOCK_ELEMENTS = 1 << 22


def row_starts(rows: int, width: int, device: torch.device | None = None) -> list[int]:
    """Boundaries ``[0, r_1, ..., rows]`` of row blocks of a ``[rows, width]`` tensor, each
    of about ``gnnact.quant.reference.block_elements`` values (at least one row); on a GPU
    ``device``, as many blocks of equal rows (a multiple of 8) as leave each
    :data:`GPU_BLOCK_ELEMENTS` values or a sixteenth of the tensor, whichever is more."""
    numel = rows * width
    if device is not None and device.type == "cuda":
        blocks = max(1, numel // max(GPU_BLOCK_ELEMENTS, -(-numel // BLOCKS)))
        step = -(-rows // blocks // 8) * 8 if blocks > 1 else rows
    else:
        step = block_elements(numel) // max(1, width)
    return [*range(0, rows, max(1, step)), rows]


def element_blocks(n: int, device: torch.device | None = None) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive blocks of about
    ``gnnact.quant.reference.block_elements(n)`` values covering ``range(n)`` (a flat
    tensor's :func:`row_starts` on ``device``)."""
    return list(itertools.pairwise(row_starts(n, 1, device)))


def _sum_over_blocks(part: Callable[[int, int], Tensor], rows: int, width: int,
                     dims: list[int], dtype: torch.dtype, keepdim: bool,
                     device: torch.device) -> Tensor | None:
    """The sum over ``dims`` (including 0) of ``part(r0, r1)`` for the row blocks of a
    ``[rows, width]`` tensor, summed in at least float32 (as torch sums a 16-bit tensor) and
    rounded to ``dtype`` once; ``None`` when the tensor is one or two blocks (the caller
    then reduces it whole, as torch would)."""
    starts = row_starts(rows, width, device)
    if len(starts) <= 2:
        return None
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    total: Tensor | None = None
    for r0, r1 in itertools.pairwise(starts):
        block = part(r0, r1).sum(dims, keepdim=keepdim, dtype=acc)
        total = block if total is None else total.add_(block)
    assert total is not None
    return total.to(dtype)


def sum_of_products(a: Tensor, b: Tensor, dims: list[int]) -> Tensor:
    """``(a * b).sum(dims)`` (``dims`` including 0) over row blocks (:func:`row_starts`): the
    product, broadcast to full size, never exists whole (it would be a full-size temporary at
    a backward's peak). Blocks are summed in at least float32, as torch sums a 16-bit tensor,
    and rounded once at the end."""
    rows = max(a.size(0), b.size(0))
    total = _sum_over_blocks(lambda r0, r1: a[r0:r1] * b[r0:r1], rows,
                             max(a[:1].numel(), b[:1].numel()), dims,
                             torch.result_type(a, b), keepdim=False, device=a.device)
    return (a * b).sum(dims) if total is None else total


def sum_by_blocks(a: Tensor, dims: list[int], *, keepdim: bool = False) -> Tensor:
    """``a.sum(dims, keepdim)`` (``dims`` including 0) over row blocks: each reduction sees
    one block, so whatever the device's reduction allocates beside its input is a block's
    share, not the tensor's. Summed in at least float32 and rounded once."""
    total = _sum_over_blocks(lambda r0, r1: a[r0:r1], a.size(0), a[:1].numel(), dims,
                             a.dtype, keepdim, a.device)
    return a.sum(dims, keepdim=keepdim) if total is None else total


def mean_by_blocks(a: Tensor, dims: list[int], *, keepdim: bool = False) -> Tensor:
    """``a.mean(dims, keepdim)`` (``dims`` including 0) as :func:`sum_by_blocks` sums."""
    if len(row_starts(a.size(0), a[:1].numel(), a.device)) <= 2:
        return a.mean(dims, keepdim=keepdim)
    return sum_by_blocks(a, dims, keepdim=keepdim).div_(math.prod(a.size(d) for d in dims))
