"""The compiled CPU kernels (``gnnact/kernels/quantize_cpu.cpp``, :mod:`gnnact.kernels.cpu`)
against the torch reference, bit for bit: every width and element type, groups that are
constant, non-finite, overflowing, on the grid, holding signed zeros and subnormals, short last
groups and groups that start mid-octet, the mask ops in every mode, calls split among threads;
how ``backend=`` and the mask ops pick them, and what happens without a compiler."""

from __future__ import annotations

import platform
import warnings

import pytest
import torch
from mask_values import assert_same_values, specials

import gnnact
from gnnact.kernels import cpu
from gnnact.quant import backends, reference
from gnnact.quant.packed import QUANT_BITS
from gnnact.quant.rng import hash_uniform

pytestmark = pytest.mark.skipif(not cpu.available(), reason="no C++ compiler on this machine")

# (n, group_size): whole groups of the default size, a short last group, groups of more than
# one piece (2048 elements), groups that start mid-octet and mid-pair (13), groups shorter
# than an octet.
CASES = [(2048, 512), (1500, 512), (5000, 4096), (3 * 2048 + 7, 2500), (999, 13), (70, 100),
         (5, 512), (3, 1)]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _input(n: int, group_size: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=generator) * torch.randint(-8, 8, (n,), generator=generator).exp2()
    g = group_size
    special = {0: 1.5,  # a constant group
               1: torch.arange(g) % 3,  # on the grid at 2 bits
               2: torch.tensor([float("nan")]), 3: torch.tensor([float("inf")]),
               4: torch.tensor([-3e38, 3e38]),  # the range overflows float32
               5: torch.tensor([0.0, -0.0, 1e-40, -1e-40])}  # signed zeros, subnormals
    for k, values in special.items():
        if (k + 1) * g <= n:
            x[k * g:k * g + (values.numel() if torch.is_tensor(values) else g)] = values
    return x.to(dtype)


def _same(got: tuple[torch.Tensor, ...], want: tuple[torch.Tensor, ...]) -> None:
    for a, b in zip(got, want, strict=True):
        if a.is_floating_point():
            assert_same_values(a, b)
        else:
            assert torch.equal(a, b)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bits", QUANT_BITS)
@pytest.mark.parametrize(("n", "group_size"), CASES)
def test_cpu_kernels_equal_reference(n, group_size, bits, dtype):
    """Seeded: the reference's codes, scales and zeros for the hashed noise the CUDA kernels
    compute; dequantized: the reference's values, the sign of zeros included."""
    _check(n, group_size, bits, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("bits", [2, 3])
def test_long_tensors_equal_reference(bits, dtype):
    """More than one chunk of 64Ki elements (bfloat16 is converted chunk by chunk)."""
    _check(3 * (1 << 16) + 5, 512, bits, dtype)


def _check(n: int, group_size: int, bits: int, dtype: torch.dtype) -> None:
    x = _input(n, group_size, dtype, bits * 7 + n)
    seed = 1234 + bits
    want = reference.quantize_groups(x, bits, group_size, noise=hash_uniform(seed, 0, n))
    _same(cpu.quantize_groups(x, bits, group_size, seed=seed), want)
    _same((cpu.dequantize_groups(*want, bits, group_size, n, dtype),),
          (reference.dequantize_groups(*want, bits, group_size, n, dtype),))


@pytest.mark.parametrize("bits", QUANT_BITS)
@pytest.mark.parametrize(("groups", "size"), [(4, 32000), (3, 13), (2, 2100), (5, 64), (1, 3)])
def test_rounding_on_a_grid_equals_reference(groups, size, bits):
    """Mesa's rounding onto running ranges: the reference's codes and clipped counts for the
    hashed noise, values on both sides of the grid, a group of no width, NaN and infinities;
    one call or split among threads."""
    generator = torch.Generator().manual_seed(bits * 100 + size)
    h = 3 * torch.randn(groups, size, generator=generator)
    h[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])[:size]
    levels = (1 << bits) - 1
    zeros = torch.randn(groups, generator=generator) - 1
    invs = levels / (2 + torch.rand(groups, generator=generator))
    if groups > 1:
        invs[-1] = 0.0
    args = (h, zeros, invs, bits, -1e-4 * levels, levels + 1e-4 * levels)
    want = reference.quantize_on_grid(*args, noise=hash_uniform(9, 0, h.numel()))
    assert want[1].sum() > 0  # (some values are clipped)
    _same(cpu.quantize_on_grid(*args, seed=9), want)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch, "get_num_threads", lambda: 3)
        patch.setattr(cpu, "PARALLEL_ELEMENTS", 16)
        _same(cpu.quantize_on_grid(*args, seed=9), want)


def test_mesa_rounds_with_the_cpu_kernel():
    """Mesa on a float32 CPU tensor takes the kernel (its noise the hash of the seed the
    compression draws); another dtype, the torch path."""
    assert backends.grid_backend(torch.randn(2, 8), 8) is cpu
    assert backends.grid_backend(torch.randn(2, 8, dtype=torch.float64), 8) is reference
    mesa = gnnact.compress.Mesa(bits=4)
    x = torch.randn(2, 4, 16, 16)
    got = mesa.compress(x, "attn", torch.Generator().manual_seed(3))
    seed = torch.randint(0, 2**63 - 1, (1,), generator=torch.Generator().manual_seed(3)).item()
    heads = x.transpose(0, 1).reshape(4, -1)
    low = heads.amin(1)
    inv = 15 / (heads.amax(1) - low)
    codes, _ = reference.quantize_on_grid(heads, low, inv, 4, -15e-4, 15 + 15e-4,
                                          noise=hash_uniform(seed, 0, heads.numel()))
    assert torch.equal(got.packed.codes, codes)


def test_given_noise_rounds_on_the_torch_path():
    x = torch.randn(1000)
    noise = torch.rand(1000)
    _same(cpu.quantize_groups(x, 3, 64, noise=noise),
          reference.quantize_groups(x, 3, 64, noise=noise))


def test_threads_split_a_call_by_whole_groups(monkeypatch):
    """A call split among threads computes what one call computes (the noise is counted from
    each piece's first element, so the pieces need no order)."""
    x = torch.randn(64 * 1000 + 33)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one = cpu.quantize_groups(x, 2, 64, seed=5)
    back = cpu.dequantize_groups(*one, 2, 64, x.numel(), torch.float32)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(cpu, "PARALLEL_ELEMENTS", 1 << 12)
    _same(cpu.quantize_groups(x, 2, 64, seed=5), one)
    _same((cpu.dequantize_groups(*one, 2, 64, x.numel(), torch.float32),), (back,))


def test_auto_takes_the_cpu_kernels_once_they_agree():
    assert backends.select("auto", torch.device("cpu"), 2) is cpu
    assert backends.select("cpu", torch.device("cpu"), 2) is cpu
    assert backends.cpu_kernel_agrees(2)
    x = torch.randn(3000, 70)
    packed = gnnact.quantize(x, 4, generator=torch.Generator().manual_seed(0))
    seed = gnnact.quant.rng.draw_seed(torch.Generator().manual_seed(0))
    noise = hash_uniform(seed, 0, x.numel())
    want = reference.quantize_groups(x, 4, packed.group_size, noise=noise)
    _same((packed.codes, packed.scales, packed.zeros), want)
    assert torch.equal(gnnact.dequantize(packed), gnnact.dequantize(packed, backend="torch"))


@pytest.mark.parametrize("n", [1, 7, 8, 311, 1000, 1247, 5003])
@pytest.mark.parametrize("before", [0, 1, 622, 623, 624, 1000])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.23])
def test_bernoulli_bits_are_bernoulli_draws(n, before, q):
    """The kernel's bits are bernoulli_(q)'s, from any point of the engine's block (its
    twists included), and its state after them is the generator's after bernoulli_."""
    generator = torch.Generator().manual_seed(11)
    torch.empty(before, dtype=torch.int64).random_(generator=generator)  # (one word each)
    start = generator.get_state()
    want = reference.pack_mask_bits(torch.empty(n).bernoulli_(q, generator=generator).bool())
    state = start.clone()
    got = cpu.bernoulli_bits(state, n, q)
    assert torch.equal(got, want)
    assert torch.equal(state, generator.get_state())


def test_bernoulli_bits_refuse_a_state_that_is_not_one():
    state = torch.Generator().get_state()
    state[8:12] = torch.tensor([9999], dtype=torch.int32).view(torch.uint8)  # left > 624
    with pytest.raises(ValueError, match="not an MT19937 state"):
        cpu.bernoulli_bits(state, 10, 0.5)
    with pytest.raises(ValueError, match="q must be in"):
        cpu.bernoulli_bits(torch.Generator().get_state(), 10, 1.5)


def test_dropout_masks_take_the_kernel_once_it_agrees(monkeypatch):
    from gnnact.ops import draws

    assert draws.cpu_draws_agree()
    x = torch.ones(3000, 7)
    torch.manual_seed(0)
    calls = []
    original = cpu.bernoulli_bits
    monkeypatch.setattr(cpu, "bernoulli_bits", lambda *a: calls.append(a[1]) or original(*a))
    bits = draws.keep_bits(x, 0.4)
    torch.manual_seed(0)
    assert calls == [x.numel()]
    assert torch.equal(gnnact.quant.unpack_mask(bits), torch.nn.functional.dropout(x, 0.4) != 0)
    # A kernel that does not draw bernoulli_'s numbers is said so, and not used.
    monkeypatch.setattr(draws, "_cpu_draws_match", lambda: False)
    draws.cpu_draws_agree.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="compiled CPU draw is not used"):
            assert not draws.cpu_draws_agree()
        calls.clear()
        torch.manual_seed(0)
        bits = draws.keep_bits(x, 0.4)
        torch.manual_seed(0)
        assert not calls
        assert torch.equal(gnnact.quant.unpack_mask(bits),
                           torch.nn.functional.dropout(x, 0.4) != 0)
    finally:
        draws.cpu_draws_agree.cache_clear()


def test_dropout_masks_follow_a_mode_that_gives_random_ops_their_generator():
    """Under a Controller's seeded_randomness, random ops draw from its generator: the masks
    too (bernoulli_ then, not the kernel, which reads the default generator), and the default
    generator is left alone."""
    from gnnact.adaptive.randomness import seeded_randomness
    from gnnact.ops import draws

    x = torch.ones(3000, 7)
    before = torch.default_generator.get_state()
    with seeded_randomness(5):
        bits = draws.keep_bits(x, 0.4)
    with seeded_randomness(5):
        want = torch.nn.functional.dropout(x, 0.4) != 0
    assert torch.equal(gnnact.quant.unpack_mask(bits), want)
    assert torch.equal(torch.default_generator.get_state(), before)


MODES = [(reference.MASK_MUL, 1.0), (reference.MASK_MUL, 2.0), (reference.MASK_ZERO, 1.0),
         (reference.MASK_SELECT, 0.2)]


@pytest.mark.parametrize(("mode", "s"), MODES)
@pytest.mark.parametrize("n", [1, 8, 1037, 4096 + 5])
def test_mask_kernels_equal_reference(n, mode, s):
    """``sign_mask`` and ``apply_packed_mask``: the torch path's bits and values, NaN,
    infinities, signed zeros and subnormals kept, in place and not, a last byte not full."""
    x = specials(n, torch.float32)
    want = torch.empty_like(x)
    want_bits = reference.sign_mask(x, want, mode, s)
    got = torch.empty_like(x)
    assert torch.equal(cpu.sign_mask(x, got, mode, s), want_bits)
    assert_same_values(got, want)
    in_place = x.clone()
    cpu.sign_mask(in_place, in_place, mode, s)
    assert_same_values(in_place, want)
    bits = torch.randint(0, 256, ((n + 7) // 8,), dtype=torch.uint8,
                         generator=torch.Generator().manual_seed(n))
    want = reference.apply_packed_mask(x, bits, torch.empty_like(x), mode, s)
    assert_same_values(cpu.apply_packed_mask(x, bits, torch.empty_like(x), mode, s), want)
    in_place = x.clone()
    assert cpu.apply_packed_mask(in_place, bits, in_place, mode, s) is in_place
    assert_same_values(in_place, want)


def test_empty_tensors():
    """Nothing to do, and nothing raised: an empty ReLU input, an empty tensor packed."""
    empty = torch.empty(0)
    assert cpu.sign_mask(empty, torch.empty(0), reference.MASK_MUL, 1.0).numel() == 0
    assert cpu.apply_packed_mask(empty, torch.empty(0, dtype=torch.uint8), torch.empty(0),
                                 reference.MASK_ZERO, 1.0).numel() == 0
    codes, scales, zeros = cpu.quantize_groups(empty, 2, 64, seed=1)
    assert codes.shape == (0, 16) and scales.numel() == zeros.numel() == 0
    assert cpu.dequantize_groups(codes, scales, zeros, 2, 64, 0, torch.float32).numel() == 0
    model = gnnact.convert(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()))
    x = torch.empty(0, 4, requires_grad=True)
    model(x).sum().backward()
    assert x.grad.shape == (0, 4)


def test_mask_kernels_split_among_threads(monkeypatch):
    x = torch.randn(8 * 5000 + 3)
    one, one_bits = torch.empty_like(x), None
    monkeypatch.setattr(torch, "get_num_threads", lambda: 1)
    one_bits = cpu.sign_mask(x, one, reference.MASK_MUL, 2.0)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 3)
    monkeypatch.setattr(cpu, "PARALLEL_ELEMENTS", 1 << 10)
    got = torch.empty_like(x)
    assert torch.equal(cpu.sign_mask(x, got, reference.MASK_MUL, 2.0), one_bits)
    assert_same_values(got, one)
    assert_same_values(cpu.apply_packed_mask(x, one_bits, torch.empty_like(x),
                                             reference.MASK_MUL, 2.0), one)


def test_mask_ops_take_the_kernels_for_float32_only():
    assert backends.cpu_mask_kernels_agree()
    assert backends.mask_backend(torch.randn(4)) is cpu
    assert backends.mask_backend(torch.randn(4, dtype=torch.float64)) is reference


def test_cpu_backend_needs_a_cpu_tensor():
    with pytest.raises(ValueError, match="backend='cpu' needs a CPU tensor, got a tensor on meta"):
        backends.select("cpu", torch.device("meta"), 2)


def test_a_kernel_width_outside_1_to_8_is_refused():
    with pytest.raises(ValueError, match="bits must be in 1-8"):
        cpu.quantize_groups(torch.randn(100), 9, 64, seed=1)


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """The library and the backend checks forgotten for the test (and again after it)."""
    monkeypatch.setenv("GNNACT_CACHE", str(tmp_path))
    caches = (cpu.library, cpu.available, cpu.compiler_version, backends.cpu_kernels_built,
              backends.cpu_mask_kernels_agree)
    for fn in caches:
        fn.cache_clear()
    yield tmp_path
    for fn in caches:
        fn.cache_clear()


@pytest.mark.parametrize("flag", ["-mbmi2", "-mno-bmi2"])
def test_both_ways_of_packing_codes_equal_reference(fresh_build, monkeypatch, flag):
    # Built with BMI2 (x86), a block's codes are packed and unpacked by pext and pdep;
    # without (or on AMD cores before Zen 3), by the SWAR steps: the same codes either way.
    if platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip(f"{flag} is an x86 flag; this machine is {platform.machine()}")
    monkeypatch.setattr(cpu, "FLAGS", (*cpu.FLAGS, flag))
    for bits in QUANT_BITS:
        _check(3000, 512, bits, torch.float32)
        _check(77, 13, bits, torch.float32)


def test_the_build_is_kept_for_later_processes(fresh_build):
    cpu.library()
    built = list(fresh_build.glob("quantize_cpu-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    cpu.library.cache_clear()
    cpu.library()  # (a later process: loads, builds nothing)
    assert list(fresh_build.glob("*")) == built and built[0].stat().st_mtime_ns == stamp


def test_a_cache_that_cannot_be_written_builds_elsewhere(fresh_build, monkeypatch):
    blocked = fresh_build / "file"
    blocked.write_text("")  # (a file where the cache's folder would be)
    monkeypatch.setenv("GNNACT_CACHE", str(blocked / "cache"))
    lib = cpu.library()
    assert "gnnact-cpu-" in lib._name and not (blocked / "cache").exists()


def test_without_a_compiler_auto_says_so_and_keeps_the_torch_path(fresh_build, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-compiler-gnnact")
    with pytest.raises(RuntimeError, match="CXX='no-such-compiler-gnnact' is not an executable"):
        backends.select("cpu", torch.device("cpu"), 2)
    with pytest.warns(RuntimeWarning, match="compiled CPU kernels are not used.*torch path"):
        assert backends.select("auto", torch.device("cpu"), 2) is reference
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once a process
        assert backends.select("auto", torch.device("cpu"), 4) is reference
    x = torch.randn(5000)
    restored = gnnact.dequantize(gnnact.quantize(x, 8))
    assert (restored - x).abs().max() < 0.1
    assert backends.mask_backend(x) is reference
