"""float16/bfloat16 models and :func:`torch.autocast`, with and without compression.

At ``bits=32`` every twin computes what PyG (or torch) computes in the same dtype. Where the
twin runs the very same operations in the same order (``Linear``, the activations, dropout)
outputs and gradients are equal bit for bit. Where the order differs (a CSR product instead of
PyG's scatter; and on the CPU, where torch's CSR kernel has no half-precision support, a float32
product rounded once) the two differ by rounding only, so the test is the one that makes that
precise: the twin is as accurate as PyG, measured against the float64 computation with the
same (half-precision) parameters and inputs. At 2 bits the context kept is the compressed one,
byte for byte the same as for a float32 model: no extra half- or full-precision copy.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import Tensor
from twin_cases import (
    CONVS,
    DENSE,
    call,
    features,
    graph,
    outputs_and_grads,
    saved_context,
    twin_pair,
)

import gnnact
from gnnact.models import MODELS, build
from gnnact.ops.graph import build_graph
from gnnact.quant.packed import packed_nbytes

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")]

HALF = [torch.bfloat16, torch.float16]
#: A layer rounds at most twice as far from float64 as PyG (assert_as_accurate's default);
#: through a model's 3 layers that compounds to 2^3.
MODEL_FACTOR = 8.0
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
N, E = 40, 160



def assert_as_accurate(got: Tensor, pyg: Tensor, exact: Tensor, factor: float = 2.0) -> None:
    """``got`` is at most ``factor`` times as far from the float64 ``exact`` as PyG's ``pyg``
    (2-norms over all entries), plus one rounding of ``exact``: the same rounding error up to
    the order of additions."""
    eps = torch.finfo(got.dtype).eps
    err_got = (got.double() - exact).norm().item()
    err_pyg = (pyg.double() - exact).norm().item()
    assert err_got <= factor * err_pyg + eps * exact.norm().item(), (err_got, err_pyg)


# ------------------------------------------------------------------------- sparse product


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_in_half_precision_rounds_the_float32_product_once(dtype, reduce):
    # The CPU has no fp16/bf16 CSR kernel: output and gradients are float32 spmm's, rounded.
    g = build_graph(graph(N, E), N)
    value = g.to_csr_order(torch.rand(E, generator=torch.Generator().manual_seed(3)))
    x, value = features(N, dtype).requires_grad_(), value.to(dtype).requires_grad_()
    grad = torch.randn(N, x.size(1), generator=torch.Generator().manual_seed(4)).to(dtype)
    results = []
    for xi, vi, gi in ((x, value, grad),
                       (x.detach().float().requires_grad_(),
                        value.detach().float().requires_grad_(), grad.float())):
        out = gnnact.ops.spmm(xi, g, vi, reduce, gnnact.Config(bits=32))
        results.append((out, *torch.autograd.grad(out, [xi, vi], gi)))
    for half, single in zip(*results, strict=True):
        assert half.dtype == dtype
        torch.testing.assert_close(half, single.to(dtype), rtol=0, atol=0)


# ------------------------------------------------------------------- twins in fp16/bf16


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", list(CONVS))
def test_conv_twin_matches_pyg_in_half_precision(name, dtype):
    ref, twin = twin_pair(CONVS[name], dtype)
    ei, x = graph(N, E), features(N, dtype)
    out, grads = outputs_and_grads(twin, x, ei)
    out_pyg, grads_pyg = outputs_and_grads(ref, x, ei)
    assert out.dtype == out_pyg.dtype == dtype
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    exact, grads_exact = outputs_and_grads(copy.deepcopy(ref).double(), x.double(), ei,
                                           upstream.double())
    assert_as_accurate(out, out_pyg, exact)
    for g, g_pyg, g_exact in zip(grads, grads_pyg, grads_exact, strict=True):
        assert g.dtype == dtype
        assert_as_accurate(g, g_pyg, g_exact)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", list(DENSE))
def test_dense_twin_matches_torch_in_half_precision(name, dtype):
    ref, twin = twin_pair(DENSE[name], dtype)
    x = features(N, dtype)
    out, grads = outputs_and_grads(twin, x, None)
    out_ref, grads_ref = outputs_and_grads(ref, x, None)
    if name != "BatchNorm1d":  # the same operations in the same order
        torch.testing.assert_close(out, out_ref, rtol=0, atol=0)
        for g, g_ref in zip(grads, grads_ref, strict=True):
            torch.testing.assert_close(g, g_ref, rtol=0, atol=0)
        return
    # torch's batch norm backward on the CPU reduces in another order: rounding only.
    torch.testing.assert_close(out, out_ref, rtol=0, atol=0)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    _, grads_exact = outputs_and_grads(copy.deepcopy(ref).double(), x.double(), None,
                                       upstream.double())
    for g, g_ref, g_exact in zip(grads, grads_ref, grads_exact, strict=True):
        assert_as_accurate(g, g_ref, g_exact)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", list(CONVS))
def test_two_bits_in_half_precision_keeps_only_the_compressed_context(name, dtype, device):
    ei, x = graph(N, E, device=device), features(N, dtype, device=device).requires_grad_()
    x32 = x.detach().float().requires_grad_()
    kept = {}
    for bits in (2, 32):
        for feats in (x, x32):
            _, twin = twin_pair(CONVS[name], feats.dtype, bits, device)
            out = call(twin, feats, ei)
            kept[bits, feats.dtype] = saved_context(out, [feats, ei])
    # The compressed layout does not depend on the features' dtype: any kept dense copy would
    # (half the bytes in half precision).
    assert kept[2, dtype] == kept[2, torch.float32]
    assert kept[2, dtype] < kept[32, torch.float32] or kept[32, torch.float32] <= 64
    if name in ("GCNConv", "SGConv", "GCN2Conv"):  # X (GCNII: S) at 2 bits, nothing else
        assert kept[2, dtype] == packed_nbytes(N * x.size(1), 2, gnnact.Config().group_size)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("name", MODELS)
def test_converted_model_in_half_precision(name, dtype, request):
    if (name, dtype) == ("gat", torch.float16):
        request.applymarker(pytest.mark.xfail(
            strict=True, raises=AssertionError,
            reason="3-layer GAT in float16: one attention vector's gradient is 19x as far "
                   "from float64 as PyG's (each layer alone is within 2x); not yet explained"))
    torch.manual_seed(0)
    ref = build(name, 8, 3, hidden=16).to(dtype)
    ei, x = graph(N, E), features(N, dtype)
    twin = gnnact.convert(copy.deepcopy(ref), gnnact.Config(bits=32))
    out, grads = outputs_and_grads(twin, x, ei)
    out_pyg, grads_pyg = outputs_and_grads(ref, x, ei)
    assert out.dtype == dtype
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    exact, grads_exact = outputs_and_grads(copy.deepcopy(ref).double(), x.double(), ei,
                                           upstream.double())
    assert_as_accurate(out, out_pyg, exact)
    for g, g_pyg, g_exact in zip(grads, grads_pyg, grads_exact, strict=True):
        assert_as_accurate(g, g_pyg, g_exact, MODEL_FACTOR)
    # At 2 bits the per-node context is the compressed one, whatever the dtype: no more bytes
    # than the float32 model keeps at 2 bits (only per-channel statistics and masks besides),
    # and a fraction of what the same half-precision model keeps at 32 bits.
    kept = {}
    for dt, bits in ((dtype, 2), (torch.float32, 2), (dtype, 32)):
        model = gnnact.convert(copy.deepcopy(ref).to(dt), gnnact.Config(bits=bits))
        feats = x.to(dt)
        kept[dt, bits] = saved_context(call(model, feats, ei), [feats, ei])
    assert kept[dtype, 2] <= kept[torch.float32, 2]
    assert 3 * kept[dtype, 2] < kept[dtype, 32]


# ---------------------------------------------------------------------------- autocast


def _autocast_pair(name: str, device: str, dtype: torch.dtype, bits: int):
    ref, twin = twin_pair(CONVS[name], torch.float32, bits, device)
    ei, x = graph(N, E, device=device), features(N, torch.float32, device=device)
    return ref, twin, ei, x


def _under_autocast(module, x, ei, device, dtype, backward: bool):
    x = x.detach().clone().requires_grad_()
    with torch.autocast(device, dtype=dtype):
        out = call(module, x, ei)
    if not backward:
        return out, []
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad(out.float().sum(), [x, *params], allow_unused=True)
    return out, [torch.zeros_like(t) if g is None else g
                 for g, t in zip(grads, [x, *params], strict=True)]


AUTOCAST = [("cpu", torch.bfloat16),
            pytest.param("cuda", torch.float16, marks=pytest.mark.cuda),
            pytest.param("cuda", torch.bfloat16, marks=pytest.mark.cuda)]


@pytest.mark.parametrize(("device", "dtype"), AUTOCAST)
@pytest.mark.parametrize("name", list(CONVS))
def test_autocast_forward_matches_pyg(name, device, dtype):
    ref, twin, ei, x = _autocast_pair(name, device, dtype, 32)
    out, _ = _under_autocast(twin, x, ei, device, dtype, backward=False)
    out_pyg, _ = _under_autocast(ref, x, ei, device, dtype, backward=False)
    assert out.dtype == out_pyg.dtype  # float32 where PyG's messages promote, as PyG's
    # Both round the same products to `dtype` (autocast's matmuls), then add in another order.
    scale = out_pyg.abs().max().item()
    torch.testing.assert_close(out, out_pyg, rtol=0, atol=4 * torch.finfo(dtype).eps * scale)


@pytest.mark.parametrize(("device", "dtype"), AUTOCAST)
@pytest.mark.parametrize("name", list(CONVS))
def test_autocast_backward_matches_pyg(name, device, dtype):
    ref, twin, ei, x = _autocast_pair(name, device, dtype, 32)
    _, grads = _under_autocast(twin, x, ei, device, dtype, backward=True)
    _, grads_pyg = _under_autocast(ref, x, ei, device, dtype, backward=True)
    for g, g_pyg in zip(grads, grads_pyg, strict=True):
        assert g.dtype == g_pyg.dtype
        scale = g_pyg.abs().max().item()
        torch.testing.assert_close(g, g_pyg, rtol=0, atol=8 * torch.finfo(dtype).eps * scale)


@pytest.mark.parametrize(("device", "dtype"), AUTOCAST)
@pytest.mark.parametrize("name", list(CONVS))
def test_autocast_with_two_bits_keeps_the_compressed_context(name, device, dtype):
    kept = {}
    for bits in (2, 32):
        _, twin, ei, x = _autocast_pair(name, device, dtype, bits)
        x = x.requires_grad_()
        with torch.autocast(device, dtype=dtype):
            out = call(twin, x, ei)
        kept[bits] = saved_context(out, [x, ei])
    assert kept[2] < kept[32] or kept[32] <= 64
    if name in ("GCNConv", "SGConv", "GCN2Conv"):
        # X (GCNII: S) at 2 bits and nothing else: not autocast's bfloat16 copy of X either.
        assert kept[2] == packed_nbytes(N * x.size(1), 2, gnnact.Config().group_size)
