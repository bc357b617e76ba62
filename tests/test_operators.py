"""The quantizer's custom operators (``torch.ops.gnnact.*``, :mod:`gnnact.quant.operators`):
PyTorch's own operator checks (schema, fake kernels against the real ones, autograd
registration, AOT dispatch with dynamic shapes), and what they are for: the public quantizer
API under :func:`torch.compile` is captured whole (no graph break), computes what it computes
eagerly bit for bit, and a user's autograd function that keeps its input quantized compiles
with ``fullgraph=True`` and gives eager mode's gradients.
"""

from __future__ import annotations

import pytest
import torch

import gnnact
from gnnact.quant import PackedTensor, operators

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _x(n: int = 1037, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(0)).to(dtype)


def _seed(value: int = 7) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.int64)


def _quantize_cases() -> list:
    cases = []
    for bits in (1, 2, 3, 4, 8):
        for group_size in (64, 100, 512):
            cases.append(pytest.param((bits, group_size, torch.float32),
                                      id=f"{bits}bit-G{group_size}"))
    cases += [pytest.param((2, 512, dtype), id=str(dtype))
              for dtype in (torch.bfloat16, torch.float16, torch.float64)]
    return cases


@pytest.mark.parametrize("case", _quantize_cases())
def test_opcheck_quantize_and_dequantize(case):
    bits, group_size, dtype = case
    x = _x(dtype=dtype)
    noise = torch.rand(x.numel(), generator=torch.Generator().manual_seed(1))
    for seed, given in ((_seed(), None), (None, noise)):
        torch.library.opcheck(torch.ops.gnnact.quantize_groups.default,
                              (x, bits, group_size, "auto", seed, given))
        packed = operators.quantize_groups(x, bits, group_size, "auto", seed, given)
        torch.library.opcheck(torch.ops.gnnact.dequantize_groups.default,
                              (*packed, bits, group_size, x.numel(), dtype, "auto"))


@pytest.mark.parametrize("n", [1, 8, 13, 4099])
def test_opcheck_masks(n):
    mask = _x(n) > 0
    torch.library.opcheck(torch.ops.gnnact.pack_mask_bits.default, (mask, "auto"))
    data = operators.pack_mask_bits(mask, "auto")
    torch.library.opcheck(torch.ops.gnnact.unpack_mask_bits.default, (data, n, "auto"))


def test_the_operators_compute_what_the_backend_computes():
    """An operator call and the eager path (which calls the implementation directly) give the
    same bits for the same seed."""
    x = _x().view(61, 17)
    direct = operators.quantize_groups(x, 3, 100, "auto", _seed(), None)
    through = torch.ops.gnnact.quantize_groups(x, 3, 100, "auto", _seed(), None)
    assert all(torch.equal(a, b) for a, b in zip(direct, through, strict=True))
    back = torch.ops.gnnact.dequantize_groups(*through, 3, 100, x.numel(), x.dtype, "auto")
    assert torch.equal(back, operators.dequantize_groups(*direct, 3, 100, x.numel(), x.dtype,
                                                         "auto"))
    mask = x > 0
    data = torch.ops.gnnact.pack_mask_bits(mask, "auto")
    assert torch.equal(data, operators.pack_mask_bits(mask, "auto"))
    assert torch.equal(torch.ops.gnnact.unpack_mask_bits(data, x.numel(), "auto"),
                       mask.view(-1))


def _round_trip(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    packed = gnnact.quantize(x, bits=2, group_size=64)
    mask = gnnact.pack_mask(x > 0)
    return gnnact.dequantize(packed), packed.codes, gnnact.unpack_mask(mask), mask.data


def test_dynamo_captures_the_public_api_without_a_break():
    x = _x().view(61, 17)
    explained = torch._dynamo.explain(_round_trip)(x)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1
    code = explained.graphs[0].code
    for op in ("quantize_groups", "dequantize_groups", "pack_mask_bits", "unpack_mask_bits"):
        assert f"torch.ops.gnnact.{op}" in code, code


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_round_trip_is_bit_identical(backend):
    """Compiled or not, the same seed (drawn from the default generator inside the graph as
    eagerly) gives the same codes, values and masks."""
    x = _x().view(61, 17)
    torch.manual_seed(3)
    want = _round_trip(x)
    torch.manual_seed(3)
    got = torch.compile(_round_trip, backend=backend, fullgraph=True)(x)
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    # A new seed is a new input of the same graph, not a recompilation.
    torch.manual_seed(4)
    other = torch.compile(_round_trip, backend=backend, fullgraph=True)(x)
    assert not torch.equal(other[1], want[1])


def test_a_new_seed_does_not_recompile():
    x = _x().view(61, 17)
    counter = torch._dynamo.testing.CompileCounter()
    run = torch.compile(_round_trip, backend=counter, fullgraph=True)
    for seed in range(3):
        torch.manual_seed(seed)
        run(x)
    assert counter.frame_count == 1


class _CompressedLinear(torch.autograd.Function):
    """:math:`y = x W^\\top`, keeping :math:`x` at 4 bits for :math:`\\nabla W`: what a user
    writes with gnnact's quantizer."""

    @staticmethod
    def forward(ctx, x, weight):
        packed = gnnact.quantize(x, bits=4)
        ctx.save_for_backward(weight, *packed.tensors())
        ctx.meta = packed.meta
        return x @ weight.t()

    @staticmethod
    def backward(ctx, grad):
        weight, *parts = ctx.saved_tensors
        x_hat = PackedTensor.from_parts(tuple(parts), ctx.meta).dequantize()
        return grad @ weight, grad.t() @ x_hat


def _loss(x, weight):
    return _CompressedLinear.apply(x, weight).relu().square().sum()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_a_users_compressed_function_compiles_whole(backend):
    x = torch.randn(300, 20, requires_grad=True)
    weight = torch.randn(8, 20, requires_grad=True)
    torch.manual_seed(1)
    want = torch.autograd.grad(_loss(x, weight), (x, weight))
    assert torch._dynamo.explain(_loss)(x, weight).graph_break_count == 0
    torch.manual_seed(1)
    got = torch.autograd.grad(torch.compile(_loss, backend=backend, fullgraph=True)(x, weight),
                              (x, weight))
    # aot_eager runs the same ATen ops; inductor fuses the products around the operators,
    # whose rounding is the same (same seed): only float summation order may differ.
    if backend == "aot_eager":
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    else:
        for a, b in zip(got, want, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_bad_backend_is_named_under_compile():
    run = torch.compile(lambda x: gnnact.quantize(x, backend="tpu").codes, backend="eager")
    with pytest.raises(Exception, match="backend must be one of"):
        run(_x())


@pytest.mark.cuda
@pytest.mark.parametrize("bits", [1, 2, 3, 4, 8])
def test_operators_on_a_gpu(bits):
    """On a GPU the operators run what eager calls run (the CUDA kernels once they agree with
    the reference): PyTorch's operator checks, and a compiled round trip equal to the eager one
    for the same seed."""
    x = _x(4099).cuda().view(-1, 1)
    torch.library.opcheck(torch.ops.gnnact.quantize_groups.default,
                          (x, bits, 512, "auto", _seed(), None))
    packed = operators.quantize_groups(x, bits, 512, "auto", _seed(), None)
    torch.library.opcheck(torch.ops.gnnact.dequantize_groups.default,
                          (*packed, bits, 512, x.numel(), x.dtype, "auto"))

    def round_trip(t):
        return gnnact.dequantize(gnnact.quantize(t, bits=bits))

    torch.manual_seed(5)
    want = round_trip(x)
    torch.manual_seed(5)
    assert torch.equal(torch.compile(round_trip, backend="inductor", fullgraph=True)(x), want)
