"""Quantizer core on the torch path: format, exactness, statistics, edge cases, bad input."""

from __future__ import annotations

import dataclasses
import itertools
import math

import pytest
import torch

import gnnact
from gnnact.quant import DEFAULT_GROUP_SIZE, PackedTensor, reference
from gnnact.quant.packed import packed_code_bytes

QBITS = (1, 2, 3, 4, 5, 6, 7, 8)


def expected_nbytes(numel: int, bits: int, group_size: int) -> int:
    """The documented formula: n_g * (ceil(G b / 8) + 8), G capped at n."""
    g = min(group_size, numel)
    num_groups = -(-numel // g)
    return num_groups * ((g * bits + 7) // 8 + 8)


def test_default_group_size_costs_an_eighth_of_a_bit():
    # float32 scale + zero per group = 64 bits; 64 / 512 = 0.125 bit per value.
    assert DEFAULT_GROUP_SIZE == 512
    x = torch.randn(4 * DEFAULT_GROUP_SIZE)
    for bits in QBITS:
        p = gnnact.quantize(x, bits=bits)
        assert p.nbytes * 8 / x.numel() == bits + 0.125


@pytest.mark.parametrize("bits", QBITS)
@pytest.mark.parametrize("shape,group_size", [((1000, 128), 512), ((7, 13), 5), ((3, 5, 17), 64),
                                              ((1,), 512), ((513,), 512), ((100, 37), 37)])
def test_nbytes_formula(bits, shape, group_size):
    x = torch.randn(shape)
    p = gnnact.quantize(x, bits=bits, group_size=group_size)
    n = x.numel()
    assert p.nbytes == expected_nbytes(n, bits, group_size)
    g = min(group_size, n)
    assert p.codes.shape == (-(-n // g), packed_code_bytes(g, bits))
    assert p.codes.dtype == torch.uint8
    assert p.scales.dtype == p.zeros.dtype == torch.float32


@pytest.mark.parametrize("bits", QBITS)
def test_hand_worked_packing(bits):
    # One group [0, R]: codes q_j land on the grid exactly, so the bytes are known in advance.
    levels = (1 << bits) - 1
    q = torch.tensor([0, levels, 1 % (levels + 1), levels // 2] * 4, dtype=torch.int64)
    x = q.to(torch.float32) * 0.5  # R = levels / 2, B / R = 2: all exact
    p = gnnact.quantize(x, bits=bits, generator=torch.Generator().manual_seed(0))
    # The group's bit stream, code j in bits [j b, (j + 1) b), little-endian bytes (codes of
    # 3, 5, 6, 7 bits straddle bytes).
    stream = sum(int(v) << (j * bits) for j, v in enumerate(q))
    expected = list(stream.to_bytes(packed_code_bytes(q.numel(), bits), "little"))
    assert p.codes.flatten().tolist() == expected
    assert p.scales.tolist() == [0.5] and p.zeros.tolist() == [0.0]


@pytest.mark.parametrize("bits", QBITS)
@pytest.mark.parametrize("group_size", [24, 13])  # whole 8-code blocks, and not
def test_packing_layout_and_every_byte_value(bits, group_size):
    # Random codes in several groups: each group's bytes are its own little-endian bit stream
    # (however the width is packed), and they unpack to the same codes.
    from gnnact.quant import reference

    q = torch.randint(0, 1 << bits, (5, group_size), generator=torch.Generator().manual_seed(1))
    codes = reference.pack_codes(q.to(torch.float32), bits)
    for row, packed in zip(q.tolist(), codes.tolist(), strict=True):
        stream = sum(v << (j * bits) for j, v in enumerate(row))
        assert packed == list(stream.to_bytes(packed_code_bytes(group_size, bits), "little"))
    ones, zeros = torch.ones(5), torch.zeros(5)
    out = reference.dequantize_groups(codes, ones, zeros, bits, group_size, q.numel(),
                                      torch.float32)
    assert torch.equal(out, q.flatten().to(torch.float32))
    if 8 % bits == 0:  # every byte value, through the byte-aligned unpacking
        per_byte = 8 // bits
        codes = torch.arange(256, dtype=torch.uint8)[:, None]
        out = reference.dequantize_groups(codes, torch.ones(256), torch.zeros(256), bits,
                                          per_byte, 256 * per_byte, torch.float32)
        expected = [(v >> (k * bits)) & ((1 << bits) - 1) for v in range(256)
                    for k in range(per_byte)]
        assert out.tolist() == expected


def test_hand_worked_stochastic_rounding():
    # u = [0, 0.9, 1.8, 3]; q = floor(u) + [r < frac(u)].
    x = torch.tensor([0.0, 0.3, 0.6, 1.0])
    p = gnnact.quantize(x, bits=2, noise=torch.tensor([0.5, 0.05, 0.25, 0.9]))
    # codes [0, 1, 2, 3] -> 0 | 1 << 2 | 2 << 4 | 3 << 6
    assert p.codes.flatten().tolist() == [228]
    p = gnnact.quantize(x, bits=2, noise=torch.tensor([0.5, 0.95, 0.85, 0.9]))
    assert p.codes.flatten().tolist() == [0 | 0 << 2 | 1 << 4 | 3 << 6]


@pytest.mark.parametrize("bits", QBITS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_round_trip_exact_on_grid(bits, dtype):
    gen = torch.Generator().manual_seed(bits)
    levels = (1 << bits) - 1
    num_groups, group_size = 6, 96
    q = torch.randint(0, levels + 1, (num_groups, group_size), generator=gen)
    q[:, 0], q[:, 1] = 0, levels  # every group spans its full range
    scale = 2.0 ** torch.randint(-3, 2, (num_groups, 1), generator=gen).to(torch.float32)
    zero = torch.randint(-4, 4, (num_groups, 1), generator=gen).to(torch.float32) * scale
    if dtype == torch.bfloat16:
        zero.zero_()  # bfloat16 holds 8 significant bits: q * s is exact, q * s + Z may not be
    x = (q * scale + zero).to(dtype)
    assert torch.equal(x.to(torch.float32), q * scale + zero)  # the grid is representable
    for trial in range(3):
        p = gnnact.quantize(x, bits=bits, group_size=group_size,
                            generator=torch.Generator().manual_seed(trial))
        out = gnnact.dequantize(p)
        assert out.dtype == dtype and out.shape == x.shape
        assert torch.equal(out, x)


@pytest.mark.parametrize("bits", QBITS)
def test_inverse_range_is_rounded_down_so_no_u_passes_the_top_level(bits):
    """B/R is the largest float whose exact product with R is at most B (the quotient rounded
    down, also where B/R overflows float32), so u = (h - Z) B/R, rounded, never exceeds B:
    the kernels round without a clamp."""
    levels = (1 << bits) - 1
    gen = torch.Generator().manual_seed(bits)
    rng = torch.cat([torch.rand(20000, generator=gen) * 10.0 ** torch.randint(
        -30, 30, (20000,), generator=gen), torch.tensor([1e-45, 1e-40, 1e-38, 3e-38, 1.0, 3.0,
                                                         3.4e38, 0.0, float("nan")])]
                    ).to(torch.float32)
    inv = reference.inverse_range(rng, bits)
    assert reference.inverse_range(torch.tensor([float("inf")]), bits).item() == 0.0
    positive = rng > 0
    assert torch.equal(inv[~positive], torch.zeros_like(inv[~positive]))
    r, i = rng[positive].double(), inv[positive]
    assert bool((i.double() * r <= levels).all())
    above = torch.nextafter(i, torch.full_like(i, float("inf")))
    assert bool((above.double() * r > levels).all())
    assert bool(((rng[positive] * i) <= levels).all())  # the top value's u, float32
    assert bool((inv[:20000] < levels / rng[:20000]).any())  # some are below to nearest


@pytest.mark.parametrize("bits", QBITS)
def test_unbiased_and_variance_bound(bits):
    gen = torch.Generator().manual_seed(1)
    group_size, num_groups, draws = 64, 8, 3000
    x = torch.randn(num_groups * group_size, generator=gen) * 3 + 1
    groups = x.view(num_groups, group_size)
    step = ((groups.amax(1) - groups.amin(1)) / ((1 << bits) - 1))[:, None].expand_as(groups)
    step = step.reshape(-1).double()

    total = torch.zeros_like(x, dtype=torch.float64)
    total_sq = torch.zeros_like(total)
    for d in range(draws):
        p = gnnact.quantize(x, bits=bits, group_size=group_size,
                            generator=torch.Generator().manual_seed(1000 + d))
        out = gnnact.dequantize(p).double()
        total += out
        total_sq += out * out
    mean = total / draws
    var = total_sq / draws - mean * mean

    # Unbiased: the mean of `draws` samples with per-element variance <= step^2/4 lies within
    # 5 standard errors step / (2 sqrt(draws)) of x (plus float32 rounding of the grid).
    tol = 5 * step / (2 * math.sqrt(draws)) + 1e-5 * x.abs().double().max()
    assert ((mean - x.double()).abs() <= tol).all()
    # Per-element variance <= (R/B)^2 / 4, with room for the sampling error of a variance.
    bound = step**2 / 4
    assert (var <= bound * (1 + 5 * math.sqrt(2 / draws)) + 1e-12).all()
    # And it is p(1-p) step^2, not zero: the rounding is really stochastic.
    assert var.mean() > 0.5 * (step**2 / 6).mean()


def test_variance_shrinks_with_bits():
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(4096, generator=gen)
    errors = []
    for bits in QBITS:
        out = gnnact.dequantize(gnnact.quantize(x, bits=bits, generator=gen))
        errors.append(((out - x) ** 2).mean().item())
    assert errors == sorted(errors, reverse=True)
    # Each extra bit roughly halves the step, so MSE drops by ~4x per bit (>= 2x here).
    for a, b in itertools.pairwise(errors):
        assert b < a / 2


def test_reproducible_with_generator_and_manual_seed():
    x = torch.randn(3000)
    a = gnnact.quantize(x, bits=2, generator=torch.Generator().manual_seed(7))
    b = gnnact.quantize(x, bits=2, generator=torch.Generator().manual_seed(7))
    c = gnnact.quantize(x, bits=2, generator=torch.Generator().manual_seed(8))
    assert torch.equal(a.codes, b.codes)
    assert not torch.equal(a.codes, c.codes)
    torch.manual_seed(3)
    d = gnnact.quantize(x, bits=2)
    torch.manual_seed(3)
    e = gnnact.quantize(x, bits=2)
    assert torch.equal(d.codes, e.codes)


def test_explicit_noise_zero_rounds_up_and_near_one_rounds_down():
    # q = floor(u) + [r < frac(u)]: r = 0 takes every fractional u up, r -> 1 takes it down.
    x = torch.linspace(-1, 1, 1000)
    up = gnnact.quantize(x, bits=2, noise=torch.zeros(1000))
    down = gnnact.quantize(x, bits=2, noise=torch.full((1000,), 1 - 2**-24))
    hi, lo = gnnact.dequantize(up), gnnact.dequantize(down)
    assert (lo <= x + 1e-6).all() and (hi >= x - 1e-6).all()
    assert (hi - lo <= up.scales[0] * (1 + 1e-6)).all()


def test_per_row_groups():
    x = torch.randn(50, 37) * torch.arange(1, 51).float()[:, None]  # rows of very different range
    p = gnnact.quantize(x, bits=4, per_row=True)
    assert p.group_size == 37 and p.num_groups == 50
    assert p.nbytes == 50 * (math.ceil(37 * 4 / 8) + 8)
    torch.testing.assert_close(p.zeros, x.amin(1))
    torch.testing.assert_close(p.scales, (x.amax(1) - x.amin(1)) / 15)
    # Per-row groups track each row's range: error <= that row's step.
    err = (gnnact.dequantize(p) - x).abs()
    assert (err <= p.scales[:, None] * (1 + 1e-5)).all()


def test_constant_groups_are_exact():
    x = torch.cat([torch.full((512,), 3.25), torch.zeros(512), torch.full((100,), -7.0)])
    for bits in QBITS:
        p = gnnact.quantize(x, bits=bits)
        assert torch.equal(gnnact.dequantize(p), x)
        assert (p.scales == 0).all()


def test_empty_tensor():
    for shape in [(0,), (0, 16), (5, 0)]:
        x = torch.empty(shape)
        p = gnnact.quantize(x, bits=2)
        assert p.nbytes == 0 and p.num_groups == 0
        out = gnnact.dequantize(p)
        assert out.shape == x.shape and out.dtype == x.dtype
        p = gnnact.quantize(x, bits=2, per_row=True)
        assert gnnact.dequantize(p).shape == x.shape


def test_size_not_divisible_by_group_size():
    x = torch.randn(1000)
    p = gnnact.quantize(x, bits=8, group_size=300)
    assert p.num_groups == 4
    assert (gnnact.dequantize(p) - x).abs().max() <= p.scales.max()
    # The last (short) group's range is its own, not widened by padding.
    assert p.zeros[-1] == x[900:].min() and p.scales[-1] * 255 == pytest.approx(
        (x[900:].max() - x[900:].min()).item(), rel=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes(dtype):
    x = torch.randn(2048).to(dtype)
    p = gnnact.quantize(x, bits=4)
    out = gnnact.dequantize(p)
    assert out.dtype == dtype and p.dtype == dtype
    assert p.nbytes == expected_nbytes(2048, 4, 512)
    step = p.scales.repeat_interleave(512).to(torch.float64)
    assert ((out.double() - x.double()).abs() <= step * 1.01 + 1e-2).all()


def test_non_contiguous_input_matches_contiguous():
    base = torch.randn(64, 96)
    x = base.t()  # non-contiguous view
    noise = torch.rand(x.numel())
    a = gnnact.quantize(x, bits=2, noise=noise)
    b = gnnact.quantize(x.contiguous(), bits=2, noise=noise)
    assert torch.equal(a.codes, b.codes) and torch.equal(a.scales, b.scales)
    assert torch.equal(gnnact.dequantize(a), gnnact.dequantize(b))
    assert gnnact.dequantize(a).shape == x.shape


def test_non_finite_values_propagate_as_nan():
    # Decision: propagate (no sync, no raise). Any group holding NaN or +-Inf reads back as NaN
    # in every element; other groups are untouched.
    x = torch.randn(4 * 512)
    x[3] = float("nan")
    x[600] = float("inf")
    x[1100] = float("-inf")
    for bits in QBITS:
        out = gnnact.dequantize(gnnact.quantize(x, bits=bits))
        assert out[:1536].isnan().all()
        assert out[1536:].isfinite().all()
        assert (out[1536:] - x[1536:]).abs().max() <= (x[1536:].max() - x[1536:].min())
    # A range that overflows float32 is non-finite too.
    big = torch.tensor([-3e38, 3e38, 0.0])
    assert gnnact.dequantize(gnnact.quantize(big, bits=8)).isnan().all()


def test_pass_through_bits():
    x = torch.randn(10, 10)
    p32 = gnnact.quantize(x, bits=32)
    assert p32.codes is x and p32.scales is None and p32.nbytes == 400
    assert gnnact.dequantize(p32) is x
    p16 = gnnact.quantize(x, bits=16)
    assert p16.codes.dtype == torch.bfloat16 and p16.nbytes == 200
    out = gnnact.dequantize(p16)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, x, rtol=2**-8, atol=0)
    h = torch.randn(8, dtype=torch.float16)
    assert gnnact.quantize(h, bits=16).codes is h


def test_packed_tensor_is_frozen_and_moves():
    p = gnnact.quantize(torch.randn(100), bits=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.bits = 4
    assert p.to("cpu") is p
    m = p.to("meta")
    assert isinstance(m, PackedTensor) and m.device.type == "meta"
    assert m.nbytes == p.nbytes and m.bits == 2 and m.shape == p.shape
    assert "bits=2" in repr(p)


@pytest.mark.parametrize("shape", [(37,), (8,), (3, 5, 7), (1,), (0,), (4, 0)])
def test_mask_round_trip(shape):
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(shape, generator=gen) > 0.5
    p = gnnact.pack_mask(mask)
    assert p.nbytes == math.ceil(mask.numel() / 8)
    out = gnnact.unpack_mask(p)
    assert out.dtype == torch.bool and torch.equal(out, mask)


def test_mask_bit_layout():
    mask = torch.tensor([1, 0, 0, 0, 0, 0, 0, 1, 0, 1], dtype=torch.bool)
    assert gnnact.pack_mask(mask).data.tolist() == [0b10000001, 0b10]
    assert gnnact.pack_mask(mask.view(2, 5)[:, 1:].t()).shape == (4, 2)  # non-contiguous


@pytest.mark.parametrize("bits", [2, 3])
def test_cupy_backend_needs_a_cuda_tensor(bits):
    with pytest.raises(ValueError, match="backend='cupy' needs a CUDA tensor, got a tensor on cpu"):
        gnnact.quantize(torch.randn(10), bits=bits, backend="cupy")


@pytest.mark.parametrize("bad_bits", [0, 9, 12, 64, -1])
def test_unsupported_bits(bad_bits):
    with pytest.raises(ValueError, match=f"bits must be one of .* got {bad_bits}"):
        gnnact.quantize(torch.randn(8), bits=bad_bits)


def test_bad_arguments_name_argument_and_value():
    x = torch.randn(8)
    with pytest.raises(TypeError, match="bits must be an int, got 2.0"):
        gnnact.quantize(x, bits=2.0)
    with pytest.raises(TypeError, match="bits must be an int, got True"):
        gnnact.quantize(x, bits=True)
    for g in (0, -4):
        with pytest.raises(ValueError, match=f"group_size must be a positive int, got {g}"):
            gnnact.quantize(x, group_size=g)
    with pytest.raises(TypeError, match="group_size must be an int"):
        gnnact.quantize(x, group_size=1.5)
    for dtype in (torch.int64, torch.int8, torch.bool, torch.complex64):
        with pytest.raises(TypeError, match=f"x must be a floating-point tensor.*{dtype}"):
            gnnact.quantize(torch.zeros(4, dtype=dtype))
    with pytest.raises(TypeError, match="x must be a torch.Tensor, got list"):
        gnnact.quantize([1.0, 2.0])
    with pytest.raises(TypeError, match="layout"):
        gnnact.quantize(torch.eye(3).to_sparse())
    with pytest.raises(ValueError, match="per_row=True needs"):
        gnnact.quantize(torch.tensor(1.0), per_row=True)
    with pytest.raises(ValueError, match="noise must be float32 with x.numel\\(\\)=8"):
        gnnact.quantize(x, noise=torch.rand(7))
    with pytest.raises(ValueError, match="either generator or noise"):
        gnnact.quantize(x, noise=torch.rand(8), generator=torch.Generator())
    with pytest.raises(ValueError, match="backend must be one of .* got 'triton'"):
        gnnact.quantize(x, backend="triton")
    with pytest.raises(ValueError, match="backend='cupy' needs a CUDA tensor"):
        gnnact.quantize(x, backend="cupy")
    with pytest.raises(TypeError, match="packed must be a PackedTensor, got Tensor"):
        gnnact.dequantize(x)
    with pytest.raises(TypeError, match="mask must be a torch.bool tensor, got dtype"):
        gnnact.pack_mask(x)
    with pytest.raises(TypeError, match="packed must be a PackedMask"):
        gnnact.unpack_mask(x)


@pytest.mark.parametrize("bits", QBITS)
@pytest.mark.parametrize("group_size", [64, 100])
def test_chunked_quantization_equals_one_pass(monkeypatch, bits, group_size):
    """Chunks (of whole groups, with the noise stream continued) change nothing: the codes,
    scales and zeros of a tensor many chunks long, and its dequantized values, equal those of
    one pass."""
    from gnnact.quant import reference

    x = torch.randn(37, 91)  # 3,367 elements: a short last group at both group sizes
    one = reference.quantize_groups(x, bits, group_size, seed=7)
    whole = reference.dequantize_groups(*one, bits, group_size, x.numel(), torch.float32)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 3 * group_size)  # 11+ chunks
    chunked = reference.quantize_groups(x, bits, group_size, seed=7)
    for a, b in zip(one, chunked, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(whole, reference.dequantize_groups(*chunked, bits, group_size,
                                                          x.numel(), torch.float32))
    noise = torch.rand(x.numel())
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", 1 << 20)
    given = reference.quantize_groups(x, bits, group_size, noise=noise)
    monkeypatch.setattr(reference, "CHUNK_ELEMENTS", group_size)
    for a, b in zip(given, reference.quantize_groups(x, bits, group_size, noise=noise),
                    strict=True):
        assert torch.equal(a, b)


def test_quantizing_needs_little_beyond_its_result():
    """The float32 temporaries of the torch path are bounded by the chunk, not the tensor:
    quantizing 64 MiB of float32 at 2 bits allocates under its packed size plus 6 chunks."""
    from gnnact.peak import PeakMeter
    from gnnact.quant.reference import CHUNK_ELEMENTS

    x = torch.randn(4096, 4096)
    with PeakMeter() as meter:
        packed = gnnact.quantize(x, bits=2)
    assert meter.end_bytes == packed.nbytes
    assert meter.peak_bytes < packed.nbytes + 6 * 4 * CHUNK_ELEMENTS < x.nbytes // 2
    with PeakMeter() as meter:
        restored = gnnact.dequantize(packed)
    assert meter.end_bytes == restored.nbytes
    assert meter.peak_bytes < restored.nbytes + 6 * 4 * CHUNK_ELEMENTS


@pytest.mark.parametrize("bits", QBITS)
@pytest.mark.parametrize("group_size", [64, 100, 256])
def test_seeded_rounding_equals_the_reference_given_its_noise(bits, group_size):
    """A seeded quantization (noise on the 2^-16 grid, rounded as ceil(u - r) in fewer passes)
    gives the reference's codes, scales and zeros for that same noise, bit for bit, constant and
    non-finite groups, values on and off the grid, and a short last group included."""
    from gnnact.quant.rng import seeded_uniform

    gen = torch.Generator().manual_seed(bits * 1000 + group_size)
    n = 20 * group_size + 17
    x = torch.randn(n, generator=gen) * torch.randint(-12, 12, (n,), generator=gen).float().exp2()
    x[:group_size] = 1.5  # a constant group
    x[2 * group_size:3 * group_size] = torch.arange(group_size) % ((1 << bits) - 1)  # on the grid
    x[5 * group_size + 3] = float("nan")
    x[7 * group_size + 1] = float("inf")
    x[9 * group_size:9 * group_size + 2] = torch.tensor([-3e38, 3e38])  # the range overflows
    for seed in (1, 99):
        noise = seeded_uniform(seed, n)
        assert torch.equal(noise * 65536, (noise * 65536).floor()) and noise.max() < 1
        seeded = reference.quantize_groups(x, bits, group_size, seed=seed)
        given = reference.quantize_groups(x, bits, group_size, noise=noise)
        for a, b in zip(seeded, given, strict=True):
            assert torch.equal(a.nan_to_num(-1.0), b.nan_to_num(-1.0))
