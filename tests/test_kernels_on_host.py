"""``cuda/quantize.cu`` and ``cuda/mask.cu`` run on the CPU (``tests/host_kernels.py``): the
kernels' own source, warp by warp, against the torch path, bit for bit, every element type;
the quantizer both ways the launcher runs it (by 16-byte vectors and element by element), with
given noise and with the seeded hash; the mask ops in every mode, in place and not, on NaN,
infinities, signed zeros and subnormals."""

from __future__ import annotations

import host_kernels
import pytest
import torch
from mask_values import assert_same_values, specials

from gnnact.kernels.quantize import vector_ok
from gnnact.quant import reference
from gnnact.quant.packed import QUANT_BITS
from gnnact.quant.rng import hash_uniform

pytestmark = pytest.mark.skipif(host_kernels.compiler() is None,
                                reason="no C++ compiler to build the kernels for the host")

# (n, group_size): whole groups of the default size, a short last group, groups larger than
# the CACHED octets a lane keeps in registers, groups that do not start on an octet, a group
# shorter than one octet.
CASES = [(2048, 512), (1500, 512), (2 * 1024 + 13, 1024), (1000, 40), (999, 13), (70, 100),
         (5, 512)]


def _input(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, generator=generator) * 3 + 1).to(dtype)
    x[: min(n, 5)] = 2.5  # ties
    return x


DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bits", QUANT_BITS)
@pytest.mark.parametrize(("n", "group_size"), CASES)
def test_host_kernels_equal_reference(n, group_size, bits, dtype):
    x = _input(n, dtype, bits * 31 + n)
    noise = torch.rand(n, generator=torch.Generator().manual_seed(n))
    ways = [False, True] if vector_ok(group_size, x, noise) else [False]
    seed = 1234 + bits
    # The kernels hash a seed into noise as the torch path does on CUDA (on the CPU it
    # draws from torch's generator instead).
    hashed = hash_uniform(seed, 0, n)
    for vec in ways:
        for kwargs, reference_noise in (({"noise": noise}, noise), ({"seed": seed}, hashed)):
            want = reference.quantize_groups(x, bits, group_size, noise=reference_noise)
            got = host_kernels.quantize_groups(x, bits, group_size, vec=vec, grid=2, **kwargs)
            for a, b, what in zip(got, want, ("codes", "scales", "zeros"), strict=True):
                assert torch.equal(a, b), f"{what} differ (vec={vec}, {list(kwargs)})"
            restored = host_kernels.dequantize_groups(*want, bits, group_size, n, dtype,
                                                      vec=vec, grid=2)
            assert torch.equal(restored, reference.dequantize_groups(
                *want, bits, group_size, n, dtype)), f"dequantize differs (vec={vec})"


def _rounded_as_reference(v: torch.Tensor, noise_bits: torch.Tensor, bits: int, zero: float,
                          inv: float) -> torch.Tensor:
    """The reference's codes for values ``v`` with the hash bits ``noise_bits`` (each
    element's 16 bits of its pair's hash: r = (65535 - bits) 2^-16)."""
    u = (v - torch.tensor(zero)) * torch.tensor(inv)
    floor = torch.floor(u)
    r = (0xFFFF - noise_bits).to(torch.float32) * 2.0**-16
    return (floor + (r < u - floor)).clamp_(0, (1 << bits) - 1).to(torch.int64)


def _zero_and_inv(v: torch.Tensor, bits: int) -> tuple[float, float]:
    """The zero and inv the reference takes for a group of the float32 values ``v``: their
    minimum, and levels over their range rounded down."""
    zero = v.min()
    return float(zero), float(reference.inverse_range((v.max() - zero).view(1), bits))


def _hashed_codes(v: torch.Tensor, noise_bits: torch.Tensor, bits: int, zero: float,
                  inv: float) -> torch.Tensor:
    """``round_hashed`` of the kernel source on ``v``, element i taking ``noise_bits[i]``."""
    pad = noise_bits.numel() % 2
    halves = torch.cat([noise_bits, noise_bits.new_zeros(pad)]).view(-1, 2)
    return host_kernels.round_hashed(v, halves[:, 0] | (halves[:, 1] << 16), bits, zero, inv)


@pytest.mark.parametrize("bits", QUANT_BITS)
def test_hashed_rounding_equals_the_reference_on_every_boundary(bits):
    """The seeded kernels round in integers (a float's bits, no conversion below 8 bits): on
    the boundaries of the reference's q = floor(u) + [r < frac(u)] — frac(u) equal to r, one
    float either side, codes at 0 and at the top level, u at the top level and a float
    below — for noise bits at both ends of their range and between (u never passes the top
    level: the reference's inv is rounded down, test below)."""
    levels = (1 << bits) - 1
    noise = [0, 1, 2, 255, 32767, 32768, 65279, 65534, 65535]
    values, noise_bits = [], []
    for n_bits in noise:
        r = (0xFFFF - n_bits) * 2.0**-16
        for whole in sorted({0, 1, levels // 2, max(levels - 1, 0), levels}):
            at = torch.tensor(whole + r, dtype=torch.float32)  # exact: 8 + 16 bits
            for u in (at, torch.nextafter(at, at + 1), torch.nextafter(at, at - 1),
                      torch.tensor(float(whole)), torch.nextafter(torch.tensor(whole + 1.0),
                                                                  torch.tensor(0.0))):
                values.append(float(u))
                noise_bits.append(n_bits)
        top = torch.tensor(float(levels))
        for u in (top, torch.nextafter(top, top - 1), top - 0.25, torch.tensor(1e-30),
                  torch.tensor(0.0)):
            values.append(float(u))
            noise_bits.append(n_bits)
    v = torch.tensor(values, dtype=torch.float32).clamp_(0, levels)
    n_bits = torch.tensor(noise_bits, dtype=torch.int64)
    assert torch.equal(_hashed_codes(v, n_bits, bits, 0.0, 1.0),
                       _rounded_as_reference(v, n_bits, bits, 0.0, 1.0))

    # Groups as the reference quantizes them (its zero and inv), every noise value.
    generator = torch.Generator().manual_seed(bits)
    for width in (1e-3, 0.7, 3.0, 1234.5):
        low = -0.37 * width
        v = low + width * torch.rand(65536 * 2, generator=generator)
        v[:4] = torch.tensor([low, low + width, low + width, low])
        zero, inv = _zero_and_inv(v, bits)
        n_bits = torch.arange(65536).repeat(2)
        assert torch.equal(_hashed_codes(v, n_bits, bits, zero, inv),
                           _rounded_as_reference(v, n_bits, bits, zero, inv))


#: Builds with other compile-time settings (benchmarks/tune_kernels.py times them): the
#: same results.
VARIANTS = [("CACHED=1",), ("CACHED=4", "MIN_BLOCKS=6"), ("LANES=16", "CACHED=4"),
            ("LANES=8", "CACHED=8"), ("LANES=16", "CACHED=1"),
            ("LANES=32", "CACHED=2", "MIN_BLOCKS=4"),
            ("QUANTIZE_LANES=8", "QUANTIZE_CACHED=8", "QUANTIZE_MIN_BLOCKS=2"),
            ("QUANTIZE_LANES=32", "QUANTIZE_CACHED=2", "DEQUANTIZE_LANES=16",
             "DEQUANTIZE_CACHED=4"),
            ("WORD_STORES=0", "HALF_WORD_STORES=232"),
            ("WORD_STORES=0", "HALF_WORD_STORES=232", "LANES=8", "CACHED=8"),
            # every setting off its default at once: the build CI compiles with NVRTC
            ("LANES=8", "CACHED=8", "MIN_BLOCKS=2", "WORD_STORES=0", "HALF_WORD_STORES=232")]


@pytest.mark.parametrize("defines", VARIANTS, ids=",".join)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bits", [1, 3, 4, 5, 7, 8])
def test_builds_with_other_settings_equal_the_reference(defines, bits, dtype):
    for n, group_size in [(2048, 512), (2 * 1024 + 13, 1024), (999, 13)]:
        x = _input(n, dtype, bits + n)
        x[7] = float("nan") if n == 999 else x[7]  # a non-finite group too
        noise = torch.rand(n, generator=torch.Generator().manual_seed(n))
        vec = vector_ok(group_size, x, noise)
        for kwargs, reference_noise in (({"noise": noise}, noise),
                                        ({"seed": 77}, hash_uniform(77, 0, n))):
            want = reference.quantize_groups(x, bits, group_size, noise=reference_noise)
            got = host_kernels.quantize_groups(x, bits, group_size, vec=vec, grid=3,
                                               defines=defines, **kwargs)
            for a, b in zip(got, want, strict=True):  # NaN scale and zero in a NaN group
                torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
            restored = host_kernels.dequantize_groups(*want, bits, group_size, n, dtype,
                                                      vec=vec, grid=3, defines=defines)
            torch.testing.assert_close(restored, reference.dequantize_groups(
                *want, bits, group_size, n, dtype), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("defines", [(), ("DEQUANTIZE_LANES=16", "DEQUANTIZE_CACHED=1")],
                         ids=lambda d: ",".join(d) or "default")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bits", [1, 2, 3, 5, 6, 7, 8])
def test_dequantize_builds_restore_every_dtype_as_the_reference(bits, dtype, defines):
    """The dequantizer restores by 16-byte chunks: 4 float32 or 2 float64 values, a part of an
    octet's code word (8 for 16-bit types), and reads the 3 and 5-7-bit codes of whole groups
    from a copy in shared memory; so does a build of another shape (two groups a warp, one
    cached chunk a lane). Whole groups (several a warp on a grid of one block), short last
    chunks, groups past the cached chunks, groups not on an octet (element by element)."""
    for n, group_size in [(40 * 512 + 13, 512), (1000, 40), (2 * 1024 + 13, 1024), (999, 13)]:
        x = _input(n, dtype, bits * 7 + n)
        codes = reference.quantize_groups(x, bits, group_size, noise=hash_uniform(5, 0, n))
        want = reference.dequantize_groups(*codes, bits, group_size, n, dtype)
        for vec in [False, True] if vector_ok(group_size, x) else [False]:
            got = host_kernels.dequantize_groups(*codes, bits, group_size, n, dtype, vec=vec,
                                                 grid=1, defines=defines)
            assert torch.equal(got, want), f"n={n}, group_size={group_size}, vec={vec}"


@pytest.mark.parametrize("defines", [(), ("LANES=16",), ("LANES=16", "CACHED=1")],
                         ids=lambda d: ",".join(d) or "default")
@pytest.mark.parametrize("bits", [2, 5])
def test_builds_equal_the_reference_with_several_groups_a_warp(defines, bits):
    """On one block of 8 warps, each warp takes 5 or more groups in turn through the
    grid-stride loops (the last one short), of the size kept in registers and of a larger one
    read twice."""
    for n, group_size in [(40 * 512 + 77, 512), (17 * 1024 + 13, 1024)]:
        x = _input(n, torch.float32, bits + n)
        want = reference.quantize_groups(x, bits, group_size, noise=hash_uniform(3, 0, n))
        got = host_kernels.quantize_groups(x, bits, group_size, seed=3, vec=True, grid=1,
                                           defines=defines)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        restored = host_kernels.dequantize_groups(*want, bits, group_size, n, torch.float32,
                                                  vec=True, grid=1, defines=defines)
        assert torch.equal(restored, reference.dequantize_groups(*want, bits, group_size, n,
                                                                 torch.float32))


@pytest.mark.parametrize("bits", [1, 3, 8])
def test_host_kernels_on_the_launchers_grid_and_a_misaligned_view(bits):
    """The launcher's own grid (one warp per group), and a view one element into its
    allocation, which the launcher sends element by element."""
    base = _input(4 * 512 + 1, torch.float32, bits)
    x = base[1:]
    assert not vector_ok(512, x)
    want = reference.quantize_groups(x, bits, 512, noise=hash_uniform(5, 0, x.numel()))
    got = host_kernels.quantize_groups(x, bits, 512, seed=5, vec=False)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    out = torch.empty(x.numel() + 1)[1:]
    host_kernels.dequantize_groups(*want, bits, 512, x.numel(), torch.float32, vec=False,
                                   out=out)
    assert torch.equal(out, reference.dequantize_groups(*want, bits, 512, x.numel(),
                                                        torch.float32))


@pytest.mark.parametrize("bits", [4, 7])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_host_kernels_keep_non_finite_and_constant_groups_as_the_reference(dtype, bits):
    """A group with a NaN, one with +inf, one with -inf, one whose finite range overflows
    (codes 0, scale and zero NaN; infinite in float16) and a constant one, on the path for
    whole groups of the default size and on the general one (a short last group), with noise
    given and hashed; float16 and bfloat16 take their range two values an instruction. At 7
    bits whole groups store words gathered across lanes (WORD_STORES, HALF_WORD_STORES)."""
    x = torch.randn(5 * 512 + 100, dtype=torch.float64)
    x[3], x[600], x[1100] = float("nan"), float("inf"), float("-inf")
    x[1536], x[1537] = -3e38, 3e38
    x[2048:] = 0.75
    x = x.to(dtype)
    noise = torch.rand(x.numel())
    for kwargs, reference_noise in (({"noise": noise}, noise),
                                    ({"seed": 9}, hash_uniform(9, 0, x.numel()))):
        want = reference.quantize_groups(x, bits, 512, noise=reference_noise)
        got = host_kernels.quantize_groups(x, bits, 512, vec=True, **kwargs)
        assert torch.equal(got[0], want[0])
        assert not got[0][:4].any()
        for a, b in zip(got[1:], want[1:], strict=True):
            torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
        out = host_kernels.dequantize_groups(*got, bits, 512, x.numel(), dtype, vec=True)
        assert out[:2048].isnan().all() and (out[2048:] == 0.75).all()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 31, 33, 1000, 70_001])
@pytest.mark.parametrize("inplace", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("vec", [True, False], ids=["vectors", "elements"])
def test_host_mask_kernels_equal_the_torch_path(dtype, n, inplace, vec):
    """sign_mask (a mask byte per thread) and apply_packed_mask in every mode: ReLU, dropout's
    scale, ReLU's backward, LeakyReLU; by 16-byte vectors and element by element; on a small
    grid, so that the loops stride."""
    x = specials(n, dtype)
    for mode, s in ((reference.MASK_MUL, 1.0), (reference.MASK_MUL, 4.0 / 3.0),
                    (reference.MASK_ZERO, 1.0), (reference.MASK_SELECT, 0.2)):
        want = torch.empty_like(x)
        want_bits = reference.sign_mask(x, want, mode, s)
        got = x.clone() if inplace else torch.full_like(x, float("nan"))
        got_bits = host_kernels.sign_mask(got if inplace else x, got, mode, s, vec=vec, grid=2)
        assert torch.equal(got_bits, want_bits)
        assert_same_values(got, want)
        want = reference.apply_packed_mask(x, want_bits, torch.empty_like(x), mode, s)
        got = x.clone() if inplace else torch.full_like(x, float("nan"))
        host_kernels.apply_packed_mask(got if inplace else x, want_bits, got, mode, s, vec=vec,
                                       grid=2)
        assert_same_values(got, want)


def test_host_build_names_ptx_it_cannot_run():
    """Every inline PTX statement becomes its host twin; one without a twin stops the build."""
    known = 'asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));'
    assert host_kernels.host_source(known) == 'host_ptx("mul.rn.f32 %0, %1, %2;", r, a, b);'
    with pytest.raises(ValueError, match="no host twin for the PTX statement 'add.f32"):
        host_kernels.host_source('asm("add.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));')
    with pytest.raises(ValueError, match="cannot translate"):
        host_kernels.host_source('asm volatile("membar.gl;");')


@pytest.fixture
def launchers_on_host(monkeypatch):
    """gnnact.kernels.quantize's launchers with their launches run on the host."""
    from gnnact.kernels import quantize as kernels

    monkeypatch.setattr(kernels, "launch", host_kernels.launch)
    return kernels


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bits", [1, 3, 8])
def test_launchers_drive_the_kernels_as_on_a_gpu(launchers_on_host, dtype, bits):
    """The Python launchers end to end (their grids, argument order and types, the choice of
    vectors), on an aligned tensor and on a view 1 element in: the reference's results."""
    kernels = launchers_on_host
    base = _input(3 * 512 + 101, dtype, bits)
    for x in (base[:-1], base[1:]):
        noise = torch.rand(x.numel(), generator=torch.Generator().manual_seed(bits))
        got = kernels.quantize_groups(x, bits, 512, noise=noise)
        want = reference.quantize_groups(x, bits, 512, noise=noise)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        seeded = kernels.quantize_groups(x, bits, 512, seed=99)
        hashed = reference.quantize_groups(x, bits, 512, noise=hash_uniform(99, 0, x.numel()))
        assert all(torch.equal(a, b) for a, b in zip(seeded, hashed, strict=True))
        args = (*want, bits, 512, x.numel(), dtype)
        assert torch.equal(kernels.dequantize_groups(*args), reference.dequantize_groups(*args))


@pytest.mark.parametrize("defines", [("LANES=16", "CACHED=4"), ("WAVES=1",),
                                     ("WAVES=2", "LANES=8", "CACHED=8"),
                                     ("WAVES=1", "LANES=16", "CACHED=4")], ids=",".join)
def test_launchers_size_the_grid_for_other_builds(launchers_on_host, defines):
    """A LANES=16 build's warp takes two groups at once (half the blocks); a WAVES=k build's
    grid is capped (on the host at 2 blocks): the launchers' grids cover every group, with the
    reference's results."""
    kernels = launchers_on_host
    cpu = torch.device("cpu")
    assert kernels._grid(100, "quantize_f32_2", cpu, ("LANES=16",)) == 7
    assert kernels._grid(1000, "dequantize_f32_2", cpu, ("LANES=16",)) == 63
    assert kernels._grid(1000, "quantize_f32_2", cpu, ()) == 63  # 16 lanes by default
    assert kernels._grid(1000, "dequantize_f32_2", cpu, ()) == 125  # 32 lanes by default
    assert kernels._grid(1000, "quantize_f32_2", cpu, ("LANES=32",)) == 125
    assert kernels._grid(1000, "quantize_f32_2", cpu, ("WAVES=3",)) == 2
    assert kernels._grid(1000, "dequantize_f32_2", cpu, ("WAVES=0",)) == 125
    with pytest.raises(ValueError, match="WAVES must be >= 0"):
        kernels._grid(1000, "quantize_f32_2", cpu, ("WAVES=-1",))
    x = _input(37 * 512 + 5, torch.float32, 4)
    got = kernels.quantize_groups(x, 4, 512, seed=8, defines=defines)
    want = reference.quantize_groups(x, 4, 512, noise=hash_uniform(8, 0, x.numel()))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    args = (*want, 4, 512, x.numel(), torch.float32)
    assert torch.equal(kernels.dequantize_groups(*args, defines=defines),
                       reference.dequantize_groups(*args))


def test_launchers_know_each_ops_default_shape():
    """The launchers size the grids by cuda/quantize.cu's lanes a group, op by op (and
    tools/sass_counts.py a warp's values by its octets a lane)."""
    from gnnact.kernels import kernel_source_dir
    from gnnact.kernels import quantize as kernels

    source = (kernel_source_dir() / "quantize.cu").read_text()
    for op, lanes in kernels._LANES.items():
        assert f"#define {op.upper()}_LANES {lanes}\n" in source
        assert f"#define {op.upper()}_CACHED {kernels._CACHED[op]}\n" in source
        assert kernels._cached(op, ("CACHED=8",)) == 8
        assert kernels._cached(op, ("CACHED=8", f"{op.upper()}_CACHED=1")) == 1


@pytest.mark.parametrize("view", ["aligned", "misaligned"])
def test_mask_launchers_drive_the_kernels_as_on_a_gpu(launchers_on_host, view):
    kernels = launchers_on_host
    base = specials(1002, torch.float32)
    x = base[:-1] if view == "aligned" else base[1:]
    assert kernels.vector_ok(8, x) == (view == "aligned")
    mask = x > 0
    assert torch.equal(kernels.pack_mask_bits(mask), reference.pack_mask_bits(mask))
    assert torch.equal(kernels.unpack_mask_bits(reference.pack_mask_bits(mask), x.numel()), mask)
    for mode, s in ((reference.MASK_MUL, 1.0), (reference.MASK_SELECT, 0.2)):
        want = torch.empty_like(x)
        bits = reference.sign_mask(x, want, mode, s)
        got = torch.empty_like(x)
        assert torch.equal(kernels.sign_mask(x, got, mode, s), bits)
        assert_same_values(got, want)
        assert_same_values(kernels.apply_packed_mask(x, bits, torch.empty_like(x), mode, s),
                     reference.apply_packed_mask(x, bits, torch.empty_like(x), mode, s))


def test_the_self_checks_pass_kernels_that_agree(launchers_on_host):
    """What backend="auto" runs before it takes a kernel (kernel_agrees, mask_kernels_agree),
    with the host kernels: every width agrees, the seeded hash included, and the mask kernels
    agree on every dtype and mode."""
    from gnnact.quant.backends import kernel_matches, mask_kernels_match

    cpu = torch.device("cpu")
    assert all(kernel_matches(launchers_on_host, cpu, bits) for bits in QUANT_BITS)
    assert mask_kernels_match(launchers_on_host, cpu)
