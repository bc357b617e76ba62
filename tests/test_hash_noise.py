"""The counter-based rounding noise of the CUDA path (:func:`gnnact.quant.rng.hash_uniform`):
its definition written out once more, element by element, and its statistics — uniform 16-bit
values, no correlation between neighbours, octets or seeds, and stochastic rounding with it
unbiased within its variance bound. The kernels reproduce it bit for bit
(``tests/test_kernels_on_host.py``); these tests are about the noise itself."""

from __future__ import annotations

import math

import pytest
import torch

from gnnact.quant import reference
from gnnact.quant.rng import hash_uniform, split_seed


def _mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x21F0AAAD) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x735A2D97) & 0xFFFFFFFF
    return x ^ (x >> 15)


def _noise_of(seed: int, i: int) -> float:
    """r_i as rng.py's docstring defines it, with Python integers."""
    s0, s1 = split_seed(seed)
    j, o = i >> 1, i >> 3
    phi = ((j & 3) * 0x9E3779B9) & 0xFFFFFFFF
    g = _mix32(_mix32((o & 0xFFFFFFFF) ^ s0) ^ (o >> 32) ^ s1 ^ phi)
    return (0xFFFF - ((g >> (16 * (i & 1))) & 0xFFFF)) * 2.0**-16


@pytest.mark.parametrize("seed", [0, 1, 2**32 + 5, 2**63 - 25])
def test_noise_is_its_definition(seed):
    for start in (0, 3, 2**32 - 5, 2**35 - 11, 2**40 + 1):
        got = hash_uniform(seed, start, 24)
        want = torch.tensor([_noise_of(seed, start + k) for k in range(24)])
        assert torch.equal(got, want), (seed, start)


def _chi_square(values: torch.Tensor, bins: int) -> float:
    counts = torch.bincount(values, minlength=bins).double()
    expected = values.numel() / bins
    return float(((counts - expected) ** 2 / expected).sum())


@pytest.mark.parametrize("seed", [7, 2**40 + 3])
def test_noise_is_uniform_over_its_16_bits(seed):
    n = 1 << 20
    bits16 = (hash_uniform(seed, 0, n) * 2**16).to(torch.int64)
    assert int(bits16.min()) >= 0 and int(bits16.max()) <= 0xFFFF
    # chi-square with 255 degrees of freedom: mean 255, sd 22.6; 6 sd above the mean fails.
    for what, values in (("high byte", bits16 >> 8), ("low byte", bits16 & 0xFF),
                         ("even elements", bits16[0::2] >> 8), ("odd elements", bits16[1::2] >> 8),
                         ("k = 3 pairs", bits16.view(-1, 8)[:, 6:].reshape(-1) >> 8)):
        assert _chi_square(values, 256) < 255 + 6 * 22.6, what


def _correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_noise_of_neighbours_octets_and_seeds_is_uncorrelated():
    n = 1 << 20
    r = hash_uniform(11, 0, n)
    bound = 6 / math.sqrt(n)  # 6 standard errors of a correlation of independent values
    for lag in (1, 2, 7, 8, 9, 64):
        assert abs(_correlation(r[:-lag], r[lag:])) < bound, f"lag {lag}"
    # The two values of one hash, and the pairs of one octet (they share its inner mix).
    pairs = r.view(-1, 8)
    assert abs(_correlation(pairs[:, 0], pairs[:, 1])) < 6 / math.sqrt(n // 8)
    for k in range(1, 4):
        assert abs(_correlation(pairs[:, 0], pairs[:, 2 * k])) < 6 / math.sqrt(n // 8), k
    # Seeds that differ in one bit of either word, as successive passes' seeds may.
    for other in (12, 11 ^ (1 << 31), 11 + (1 << 32)):
        assert abs(_correlation(r, hash_uniform(other, 0, n))) < bound, other


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_rounding_with_the_hash_is_unbiased_within_its_variance_bound(bits):
    generator = torch.Generator().manual_seed(bits)
    group_size, draws = 64, 2000
    x = torch.randn(4 * group_size, generator=generator) * 3 + 1
    groups = x.view(-1, group_size)
    step = ((groups.amax(1) - groups.amin(1)) / ((1 << bits) - 1))[:, None].expand_as(groups)
    step = step.reshape(-1).double()
    total = torch.zeros_like(x, dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for d in range(draws):
        codes = reference.quantize_groups(x, bits, group_size,
                                          noise=hash_uniform(1000 + 7919 * d, 0, x.numel()))
        out = reference.dequantize_groups(*codes, bits, group_size, x.numel(),
                                          torch.float32).double()
        total += out
        total_sq += out * out
    mean = total / draws
    var = total_sq / draws - mean * mean
    assert ((mean - x.double()).abs() <= 5 * step / (2 * math.sqrt(draws)) + 1e-5).all()
    assert (var <= step**2 / 4 * (1 + 5 * math.sqrt(2 / draws)) + 1e-12).all()
