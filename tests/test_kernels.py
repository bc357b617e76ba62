"""CuPy kernels against the torch reference (``-m cuda``: needs a GPU and CuPy), plus the CPU-side
checks of the loader that run everywhere."""

from __future__ import annotations

import warnings

import pytest
import torch
from mask_values import assert_same_values, specials
from test_benchmarks import _script

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
            # quantize_<dt>_<bits> and the mask ops' <op>_<dt> come from macros (NAME##_...);
            # the others are spelled out.
            if name.startswith(("quantize_", "dequantize_")):
                stem = name.rsplit("_", 2)[0]
            elif name.startswith(("sign_mask_", "apply_packed_mask_")):
                stem = name.rsplit("_", 1)[0]
            else:
                stem = name
            assert stem in source


def test_kernel_sources_read_with_their_includes():
    """A source's ``#include "x.cuh"`` lines are replaced by those files' text: what NVRTC
    compiles is one self-contained program."""
    from gnnact.kernels._cupy import kernel_source

    for filename in KERNEL_NAMES:
        text = kernel_source(filename)
        assert not [line for line in text.splitlines() if line.startswith("#include")]
        assert "struct F16" in text and "typedef long long i64" in text


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
    from gnnact.quant.backends import kernel_agrees, select

    device = torch.device("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a disagreeing kernel would warn
        assert kernel_agrees(torch.cuda.current_device(), bits)
    from gnnact.kernels import quantize as kernels

    assert select("auto", device, bits) is kernels
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
@pytest.mark.parametrize("bits", QBITS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_kernels_on_misaligned_views_equal_reference(bits, dtype):
    """A view 1 element into an allocation (and codes 1 group in) is not 16-byte aligned: the
    kernels then go element by element (vector_ok is false) and give the same results."""
    from gnnact.kernels import quantize as kernels

    base = (torch.randn(4 * 512 + 1, device="cuda") * 3).to(dtype)
    x = base[1:]
    assert not kernels.vector_ok(512, x) and kernels.vector_ok(512, base[:-1])
    noise = torch.rand(x.numel(), device="cuda")
    got = kernels.quantize_groups(x, bits, 512, noise=noise)
    want = reference.quantize_groups(x, bits, 512, noise=noise)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
    # Groups of 8 have `bits` code bytes: codes from the second group on start misaligned.
    codes, scales, zeros = (t[1:] for t in reference.quantize_groups(x, bits, 8, noise=noise))
    assert not kernels.vector_ok(8, codes)
    args = (codes, scales, zeros, bits, 8, x.numel() - 8, dtype)
    assert torch.equal(kernels.dequantize_groups(*args), reference.dequantize_groups(*args))


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


# ----------------------------------------------------------------------------- mask ops

_MASK_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _pytorch_forward(x: torch.Tensor, op: str, keep: torch.Tensor | None) -> torch.Tensor:
    """PyTorch's own forward of ``op`` (dropout: F.dropout's arithmetic with mask ``keep``,
    p = 0.25)."""
    if op == "relu":
        return x * (x > 0)  # torch.relu's result, the sign of x * 0 included
    if op == "leaky_relu":
        return torch.nn.functional.leaky_relu(x, 0.2)
    return x * (keep.to(x.dtype) / 0.75)


@pytest.mark.parametrize("dtype", _MASK_DTYPES)
@pytest.mark.parametrize("n", [1, 31, 33, 1000, 70_001])
@pytest.mark.parametrize("inplace", [False, True])
def test_mask_ops_torch_path_is_pytorch(dtype, n, inplace):
    """gnnact.quant.reference.sign_mask / apply_packed_mask (the torch path every kernel is
    checked against): [x > 0] packed as pack_mask packs it, and each mode bit for bit what
    PyTorch's ReLU, LeakyReLU and dropout compute, forward and backward, NaN and -0.0
    included."""
    from gnnact.ops.context import mask_mode
    from gnnact.quant import reference as ref

    x = specials(n, dtype)
    for op, slope, divisor in (("relu", 0.0, 1.0), ("leaky_relu", 0.2, 1.0)):
        mode, s = mask_mode(divisor, slope, dtype)
        out = x.clone() if inplace else torch.empty_like(x)
        data = ref.sign_mask(out if inplace else x, out, mode, s)
        assert torch.equal(data, gnnact.pack_mask(x > 0).data)
        assert_same_values(out, _pytorch_forward(x, op, None))
    keep = torch.rand(n, generator=torch.Generator().manual_seed(1)) > 0.25
    data = gnnact.pack_mask(keep).data
    grad = specials(n, dtype).flip(0)
    for op, slope, divisor in (("relu", 0.0, 1.0), ("leaky_relu", 0.2, 1.0),
                               ("dropout", 0.0, 0.75)):
        mask = (x > 0) if op != "dropout" else keep
        packed = gnnact.pack_mask(mask).data
        if op == "dropout":
            mode, s = mask_mode(divisor, slope, dtype)
            out = x.clone() if inplace else torch.empty_like(x)
            ref.apply_packed_mask(out if inplace else x, data, out, mode, s)
            assert_same_values(out, _pytorch_forward(x, op, keep))
        # Backward: what PyTorch's backward of each op gives for the incoming gradient.
        want = {"relu": torch.where(mask, grad, 0.0),
                "leaky_relu": torch.where(mask, grad, grad * 0.2),
                "dropout": grad * (mask.to(dtype) / 0.75)}[op]
        mode, s = mask_mode(divisor, slope, dtype, backward=True)
        out = grad.clone() if inplace else torch.empty_like(grad)
        ref.apply_packed_mask(out if inplace else grad, packed, out, mode, s)
        assert_same_values(out, want)


@cuda
@pytest.mark.parametrize("dtype", _MASK_DTYPES)
@pytest.mark.parametrize("n", [1, 31, 33, 1000, 1_000_003])
@pytest.mark.parametrize("inplace", [False, True])
def test_mask_kernels_equal_the_torch_path(dtype, n, inplace):
    """cuda/mask.cu's sign_mask and apply_packed_mask against the torch path on the same
    GPU, every mode, in place and not (mask_kernels_agree checks the same before "auto" uses
    them)."""
    from gnnact.kernels import quantize as kernels
    from gnnact.quant import reference as ref
    from gnnact.quant.backends import mask_kernels_agree

    assert mask_kernels_agree(0)
    x = specials(n, dtype, "cuda")
    for mode, s in ((ref.MASK_MUL, 1.0), (ref.MASK_MUL, 4.0 / 3.0), (ref.MASK_ZERO, 1.0),
                    (ref.MASK_SELECT, 0.2)):
        want = torch.empty_like(x)
        want_bits = ref.sign_mask(x, want, mode, s)
        got = x.clone() if inplace else torch.empty_like(x)
        got_bits = kernels.sign_mask(got if inplace else x, got, mode, s)
        assert torch.equal(got_bits, want_bits)
        assert_same_values(got, want)
        want = ref.apply_packed_mask(x, want_bits, torch.empty_like(x), mode, s)
        got = x.clone() if inplace else torch.empty_like(x)
        kernels.apply_packed_mask(got if inplace else x, want_bits, got, mode, s)
        assert_same_values(got, want)


@cuda
def test_mask_ops_on_a_gpu_take_the_kernels_and_equal_pytorch():
    """ReLU, LeakyReLU and dropout on a GPU: "auto" sends them to the fused kernels, and the
    results and gradients are PyTorch's (dropout with its own mask)."""
    from gnnact.quant import backends

    x = torch.randn(4096, 64, device="cuda", requires_grad=True)
    assert backends.mask_backend(x.detach()) is not backends.reference
    for op in (gnnact.ops.relu, lambda t: gnnact.ops.leaky_relu(t, 0.2)):
        g = torch.randn(4096, 64, device="cuda")
        ours = op(x * 1.0)
        (ours_grad,) = torch.autograd.grad(ours, x, g)
        ref = torch.relu(x) if op is gnnact.ops.relu else torch.nn.functional.leaky_relu(x, 0.2)
        (ref_grad,) = torch.autograd.grad(ref, x, g)
        assert torch.equal(ours, ref) and torch.equal(ours_grad, ref_grad)
    out = gnnact.ops.dropout(x * 1.0, 0.5, training=True)
    kept = out != 0
    torch.testing.assert_close(out[kept], (x * 2.0)[kept], rtol=0, atol=0)


def test_a_kernel_that_disagrees_or_fails_is_named_and_left_unused():
    """The self-check behind kernel_agrees and mask_kernels_agree: a kernel that differs from
    the torch path, or fails to compile or launch, is not used, with a warning saying why."""
    from gnnact.quant.backends import _self_check

    assert _self_check(lambda: True, "unused", "instead")
    with pytest.warns(RuntimeWarning, match="gnnact: k is not used: its results differ from "
                      "the torch path; t runs instead"):
        assert not _self_check(lambda: False, "k is not used", "t runs instead")

    def broken() -> bool:
        raise RuntimeError("no kernel image")

    with pytest.warns(RuntimeWarning, match="it failed: RuntimeError: no kernel image"):
        assert not _self_check(broken, "k is not used", "t runs instead")


@cuda
# Builds tune_kernels.py times too (CuPy's disk cache then compiles each once).
@pytest.mark.parametrize("defines", [tuple(v.split(","))
                                     for v in _script("tune_kernels").VARIANTS], ids=",".join)
def test_builds_tune_kernels_times_equal_the_reference_on_the_gpu(defines):
    """The builds benchmarks/tune_kernels.py compares, on the device (their grids from the
    kernel's own registers where WAVES caps them): the reference's results, with given noise
    and seeded."""
    from gnnact.kernels import quantize as kernels
    from gnnact.kernels._cupy import resident_blocks

    blocks = resident_blocks("quantize.cu", "quantize_f32_4", torch.device("cuda"), 256,
                             defines)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert blocks % sms == 0 and sms <= blocks <= 8 * sms
    x = torch.randn(3 * 2**20 + 77, device="cuda")
    noise = torch.rand(x.numel(), device="cuda")
    for bits in (2, 5, 8):
        got = kernels.quantize_groups(x, bits, 512, noise=noise, defines=defines)
        want = reference.quantize_groups(x, bits, 512, noise=noise)
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        seeded = kernels.quantize_groups(x, bits, 512, seed=99, defines=defines)
        assert all(torch.equal(a, b) for a, b in zip(
            seeded, reference.quantize_groups(x, bits, 512, seed=99), strict=True))
        args = (*want, bits, 512, x.numel(), torch.float32)
        assert torch.equal(kernels.dequantize_groups(*args, defines=defines),
                           reference.dequantize_groups(*args))
