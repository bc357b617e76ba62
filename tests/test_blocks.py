"""The by-block reductions of :mod:`gnnact.ops.blocks`: the sums torch computes, block by
block, in at least float32 and rounded once; small tensors reduced whole, as torch does."""

from __future__ import annotations

import itertools

import pytest
import torch

from gnnact.ops.blocks import (
    GPU_BLOCK_ELEMENTS,
    element_blocks,
    mean_by_blocks,
    row_starts,
    sum_by_blocks,
    sum_of_products,
)


def _tall(rows: int = 300_000, width: int = 3, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, width, generator=g) * 2 + 1).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("keepdim", [False, True])
def test_sums_and_means_by_blocks_are_torchs(dtype, keepdim):
    a = _tall(dtype=dtype)
    assert len(row_starts(a.size(0), a.size(1))) > 3  # several blocks
    want_sum = a.double().sum([0], keepdim=keepdim)
    got = sum_by_blocks(a, [0], keepdim=keepdim)
    assert got.dtype == dtype and got.shape == want_sum.shape
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2}[dtype]
    torch.testing.assert_close(got.double(), want_sum, rtol=tol, atol=tol * a.size(0))
    mean = mean_by_blocks(a, [0], keepdim=keepdim)
    assert mean.dtype == dtype and mean.shape == want_sum.shape
    torch.testing.assert_close(mean.double(), want_sum / a.size(0), rtol=tol, atol=tol)


def test_small_tensors_are_reduced_whole_exactly_as_torch():
    a = _tall(rows=100)
    assert len(row_starts(100, 3)) <= 2
    assert torch.equal(sum_by_blocks(a, [0]), a.sum([0]))
    assert torch.equal(mean_by_blocks(a, [0], keepdim=True), a.mean([0], keepdim=True))
    assert torch.equal(sum_of_products(a, a, [0]), (a * a).sum([0]))


def test_sum_of_products_by_blocks_is_torchs():
    a, b = _tall(), _tall().flip(0)
    torch.testing.assert_close(sum_of_products(a, b, [0]).double(),
                               (a.double() * b.double()).sum([0]), rtol=1e-5, atol=1e-2)


def test_gpu_blocks_hold_gpu_block_elements_at_least():
    """On a GPU a block holds GPU_BLOCK_ELEMENTS values at least, and a sixteenth of its
    tensor at most (its cost there is the host's, whatever its size): Cora's features are one
    block there and 17 on the CPU; a larger tensor's blocks still cover it row by row. (Only
    the device's type is read.)"""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert len(row_starts(2708, 1433, cpu)) == 18 and row_starts(2708, 1433) == row_starts(
        2708, 1433, cpu)
    assert row_starts(2708, 1433, cuda) == [0, 2708]
    starts = row_starts(169_343, 128, cuda)  # the arxiv shape: 21.7M values
    assert starts[0] == 0 and starts[-1] == 169_343
    sizes = [b - a for a, b in itertools.pairwise(starts)]
    assert len(sizes) == 5 and all(s * 128 >= GPU_BLOCK_ELEMENTS for s in sizes[:-1])
    assert element_blocks(1000, cuda) == [(0, 1000)]
    # Coauthor Physics' features (290M values): 15 blocks on a GPU, not 4Mi-value ones (70).
    starts = row_starts(34_493, 8_415, cuda)
    assert len(starts) - 1 == 15 and all(b % 8 == 0 for b in starts[:-1])
