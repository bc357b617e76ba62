"""``cuda/quantize.cu`` run on the CPU (``tests/host_kernels.py``): the kernels' own source,
warp by warp, against the torch reference, bit for bit, both ways the launcher runs them (by
16-byte vectors and element by element), with given noise and with the seeded hash."""

from __future__ import annotations

import host_kernels
import pytest
import torch

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


@pytest.mark.parametrize("dtype", list(host_kernels.HOST_DTYPES))
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


def test_host_kernels_keep_non_finite_and_constant_groups_as_the_reference():
    x = torch.randn(4 * 512)
    x[3], x[600], x[1100] = float("nan"), float("inf"), float("-inf")
    x[1536:] = 0.75
    noise = torch.rand(x.numel())
    want = reference.quantize_groups(x, 4, 512, noise=noise)
    got = host_kernels.quantize_groups(x, 4, 512, noise=noise, vec=True)
    assert torch.equal(got[0], want[0])
    for a, b in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(a, b, equal_nan=True, rtol=0, atol=0)
    out = host_kernels.dequantize_groups(*got, 4, 512, x.numel(), torch.float32, vec=True)
    assert out[:1536].isnan().all() and (out[1536:] == 0.75).all()
