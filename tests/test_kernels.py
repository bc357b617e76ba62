"""CuPy kernels against the torch reference (``-m cuda``: needs a GPU and CuPy), plus the CPU-side
checks of the loader that run everywhere."""

from __future__ import annotations

import warnings

import pytest
import torch

import gnnact
from gnnact.kernels import kernel_source_dir
from gnnact.kernels.quantize import KERNEL_NAMES
from gnnact.quant import reference

QBITS = (1, 2, 4, 8)
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


def test_kernel_sources_are_found_and_declare_their_entry_points():
    folder = kernel_source_dir()
    assert sorted(p.name for p in folder.glob("*.cu")) == sorted(KERNEL_NAMES)
    for filename, names in KERNEL_NAMES.items():
        source = (folder / filename).read_text()
        for name in names:
            # quantize_<dt>_<bits> come from a macro; the others are spelled out.
            stem = name.rsplit("_", 2)[0] if name.startswith(("quantize_", "dequantize_")) else name
            assert stem in source


def test_auto_backend_on_cpu_uses_reference_without_importing_cupy():
    import subprocess
    import sys

    code = ("import sys, torch, gnnact; p = gnnact.quantize(torch.randn(100), bits=2); "
            "gnnact.dequantize(p); gnnact.unpack_mask(gnnact.pack_mask(torch.ones(9) > 0)); "
            "assert 'cupy' not in sys.modules, 'cupy imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


cuda = pytest.mark.cuda


@cuda
@pytest.mark.parametrize("bits", QBITS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,group_size,per_row", [
    ((4096, 128), 512, False),     # default grouping
    ((1000, 37), 512, True),       # odd per-row groups: 37 * b bits, not byte aligned
    ((33, 100), 300, False),       # last group short
    ((5,), 512, False),            # one tiny group
    ((20000,), 1 << 15, False),    # group larger than a warp's stride many times over
])
def test_kernel_equals_reference_given_same_noise(bits, dtype, shape, group_size, per_row):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = (torch.randn(shape, device="cuda", generator=gen) * 3 + 1).to(dtype)
    x.view(-1)[:7] = 2.5  # a few ties
    noise = torch.rand(x.numel(), device="cuda", generator=gen)
    a = gnnact.quantize(x, bits, group_size, per_row=per_row, noise=noise, backend="cupy")
    b = gnnact.quantize(x, bits, group_size, per_row=per_row, noise=noise, backend="torch")
    assert torch.equal(a.codes, b.codes)
    assert torch.equal(a.scales, b.scales)
    assert torch.equal(a.zeros, b.zeros)
    da = gnnact.dequantize(a, backend="cupy")
    db = gnnact.dequantize(b, backend="torch")
    assert da.dtype == dtype and torch.equal(da, db)


@cuda
@pytest.mark.parametrize("bits", QBITS)
def test_kernel_seeded_noise_equals_torch_on_cuda(bits):
    x = torch.randn(3, 70001, device="cuda")
    g1 = torch.Generator().manual_seed(11)
    g2 = torch.Generator().manual_seed(11)
    a = gnnact.quantize(x, bits=bits, generator=g1, backend="cupy")
    b = gnnact.quantize(x, bits=bits, generator=g2, backend="torch")
    assert torch.equal(a.codes, b.codes)


@cuda
@pytest.mark.parametrize("bits", [3, 5, 6, 7])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("n", "group_size"), [
    (4096, 512), (5000, 512), (1000, 100), (999, 13), (17, 7), (9, 1), (3, 8)])
def test_straddling_width_kernels_equal_reference(bits, dtype, n, group_size):
    from gnnact.kernels import quantize as kernels

    x = (torch.randn(n, device="cuda") * 3).to(dtype)
    noise = torch.rand(n, device="cuda")
    ref = reference.quantize_groups(x, bits, group_size, noise=noise)
    got = kernels.quantize_groups(x, bits, group_size, noise=noise)
    for a, b in zip(got, ref, strict=True):
        assert torch.equal(a, b)
    seeded = kernels.quantize_groups(x, bits, group_size, seed=12345)
    assert torch.equal(seeded[0], reference.quantize_groups(x, bits, group_size, seed=12345)[0])
    args = (*ref, bits, group_size, n, dtype)
    assert torch.equal(kernels.dequantize_groups(*args), reference.dequantize_groups(*args))


@cuda
@pytest.mark.parametrize("bits", range(1, 9))
def test_auto_dispatches_each_width_to_its_checked_kernel(bits):
    """backend="auto" checks each width's kernel once against the reference, then sends that
    width to it: the same codes as the torch path, from the kernel."""
    from gnnact.quant.core import _backend, kernel_agrees

    device = torch.device("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a disagreeing kernel would warn
        assert kernel_agrees(torch.cuda.current_device(), bits)
    from gnnact.kernels import quantize as kernels

    assert _backend("auto", device, bits) is kernels
    x = torch.randn(10_000, device=device)
    seed = torch.Generator(device="cuda").manual_seed(3)
    auto = gnnact.quantize(x, bits, generator=seed)
    torch_path = gnnact.quantize(x, bits, generator=torch.Generator(device="cuda").manual_seed(3),
                                 backend="torch")
    assert torch.equal(auto.codes, torch_path.codes)


@cuda
def test_kernel_non_finite_and_constant_groups_match_reference():
    x = torch.randn(4 * 512, device="cuda")
    x[3], x[600], x[1100] = float("nan"), float("inf"), float("-inf")
    x[1536:] = 0.75  # constant group
    noise = torch.rand(x.numel(), device="cuda")
    a = gnnact.quantize(x, 4, noise=noise, backend="cupy")
    b = gnnact.quantize(x, 4, noise=noise, backend="torch")
    assert torch.equal(a.codes, b.codes)
    torch.testing.assert_close(a.scales, b.scales, equal_nan=True, rtol=0, atol=0)
    torch.testing.assert_close(a.zeros, b.zeros, equal_nan=True, rtol=0, atol=0)
    out = gnnact.dequantize(a, backend="cupy")
    assert out[:1536].isnan().all() and (out[1536:] == 0.75).all()


@cuda
def test_kernel_non_contiguous_input_and_empty():
    base = torch.randn(256, 384, device="cuda")
    x = base.t()
    noise = torch.rand(x.numel(), device="cuda")
    a = gnnact.quantize(x, 2, noise=noise, backend="cupy")
    b = gnnact.quantize(x.contiguous(), 2, noise=noise, backend="torch")
    assert torch.equal(a.codes, b.codes)
    e = gnnact.quantize(torch.empty(0, 8, device="cuda"), 2, backend="cupy")
    assert gnnact.dequantize(e, backend="cupy").shape == (0, 8)


@cuda
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000, 123457])
def test_mask_kernels_equal_reference(n):
    mask = torch.rand(n, device="cuda") > 0.3
    a = gnnact.pack_mask(mask, backend="cupy")
    b = gnnact.pack_mask(mask, backend="torch")
    assert torch.equal(a.data, b.data)
    assert torch.equal(gnnact.unpack_mask(a, backend="cupy"), mask)


@cuda
def test_kernels_run_on_torch_current_stream():
    # Produce x on a side stream and quantize there without synchronizing: only a launch on
    # torch's current stream (the side stream) is ordered after the producer.
    side = torch.cuda.Stream()
    noise = torch.rand(1 << 22, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        x = torch.randn(1 << 22, device="cuda")
        x.mul_(2).add_(1)
        p = gnnact.quantize(x, 2, noise=noise, backend="cupy")
        out = gnnact.dequantize(p, backend="cupy")
    side.synchronize()
    ref = reference.quantize_groups(x, 2, 512, noise=noise)
    assert torch.equal(p.codes, ref[0])
    assert torch.equal(out, reference.dequantize_groups(*ref, 2, 512, x.numel(), x.dtype))


@cuda
def test_kernel_statistics_unbiased():
    x = torch.randn(64 * 512, device="cuda")
    total = torch.zeros_like(x, dtype=torch.float64)
    draws = 2000
    for d in range(draws):
        p = gnnact.quantize(x, 2, generator=torch.Generator().manual_seed(d), backend="cupy")
        total += gnnact.dequantize(p, backend="cupy").double()
    step = p.scales.repeat_interleave(512).double()
    assert ((total / draws - x.double()).abs() <= 5 * step / (2 * draws**0.5) + 1e-6).all()
