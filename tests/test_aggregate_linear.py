"""gnnact.ops.aggregate_linear: GCN's and SAGE's layer in one op by row blocks, against the
dense expression (exact at 32 bits), its memory, and the by-block loops of the mask ops."""

from __future__ import annotations

import pytest
import torch

import gnnact
from gnnact import Config, ops
from gnnact.ops.context import apply_mask, masked_by_blocks
from gnnact.peak import PeakMeter
from gnnact.quant import pack_mask, unpack_mask
from gnnact.quant.reference import block_elements

EXACT = Config(bits=32)
# 3,000 rows of 48: three row blocks of 65,536 values (gnnact.ops.blocks.row_starts).
N_SRC, N_DST, F_IN, E = 3_000, 2_200, 48, 12_000


def _dense(graph: gnnact.ops.Graph, value: torch.Tensor | None, mean: bool) -> torch.Tensor:
    """P as a dense matrix: A with its edge values (CSR order), rows scaled by 1/deg for mean."""
    a = graph.matrix(value, torch.float64).to_dense()
    if mean:
        a = a / graph.in_degree(torch.float64).clamp(min=1)[:, None]
    return a


def _case(square: bool, f_out: int, with_value: bool, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    n_dst = N_SRC if square else N_DST
    edge_index = torch.stack([torch.randint(0, N_SRC, (E,), generator=gen),
                              torch.randint(0, n_dst, (E,), generator=gen)])
    graph = ops.graph_from(edge_index, N_SRC, n_dst)
    value = torch.rand(E, dtype=torch.float64, generator=gen) if with_value else None
    x = torch.randn(N_SRC, F_IN, dtype=torch.float64, generator=gen, requires_grad=True)
    w = torch.randn(f_out, F_IN, dtype=torch.float64, generator=gen, requires_grad=True)
    b = torch.randn(f_out, dtype=torch.float64, generator=gen, requires_grad=True)
    root = (torch.randn(f_out, F_IN, dtype=torch.float64, generator=gen, requires_grad=True)
            if square else None)
    return graph, value, x, w, b, root


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("square", [True, False], ids=["root", "bipartite"])
@pytest.mark.parametrize("f_out", [96, 16], ids=["widening", "narrowing"])
@pytest.mark.parametrize("with_value", [False, True], ids=["ones", "values"])
def test_equals_the_dense_expression_at_32_bits(reduce, square, f_out, with_value):
    """Y = P X W^T + b (+ X W_r^T) and every gradient, to float64 round-off, whichever order
    the forward takes (aggregate first when widening, transform first when narrowing)."""
    graph, value, x, w, b, root = _case(square, f_out, with_value)
    csr_value = None if value is None else graph.to_csr_order(value)
    out = ops.aggregate_linear(x, graph, w, b, root, csr_value, reduce, EXACT)
    p = _dense(graph, csr_value, reduce == "mean")
    ref = p @ x @ w.t() + b + (x @ root.t() if root is not None else 0)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    inputs = [t for t in (x, w, b, root) if t is not None]
    got = torch.autograd.grad(out, inputs, grad)
    want = torch.autograd.grad(ref, inputs, grad)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-11, atol=1e-11)


def test_inputs_without_gradients_and_no_recording():
    graph, _, x, w, b, root = _case(True, 64, False)
    expected = ops.aggregate_linear(x, graph, w, b, root, None, "mean", EXACT)
    # Features that need no gradient (a first layer): only the weights' gradients.
    x_const = x.detach()
    out = ops.aggregate_linear(x_const, graph, w, b, root, None, "mean", Config(bits=2))
    gw, gr = torch.autograd.grad(out.sum(), [w, root])
    assert gw.shape == w.shape and gr.shape == root.shape
    with torch.no_grad():
        torch.testing.assert_close(
            ops.aggregate_linear(x, graph, w, b, root, None, "mean", EXACT), expected,
            rtol=0, atol=0)


@pytest.mark.parametrize("bits", [8, 2])
def test_compressed_gradients_follow_the_restored_input(bits):
    """At b bits the weight gradients read X within one quantization step: their error is
    bounded by what one step per element can do; the input gradient reads no X at all."""
    graph, _, x, w, b, root = _case(True, 64, False)
    grad = torch.randn(N_SRC, 64, dtype=torch.float64)
    exact = torch.autograd.grad(ops.aggregate_linear(x, graph, w, b, root, None, "sum", EXACT),
                                [x, w, root], grad)
    got = torch.autograd.grad(
        ops.aggregate_linear(x, graph, w, b, root, None, "sum", Config(bits=bits)),
        [x, w, root], grad)
    torch.testing.assert_close(got[0], exact[0], rtol=1e-12, atol=1e-12)
    step = float(x.detach().max() - x.detach().min()) / (2**bits - 1)
    t = graph.mm(grad, transpose=True)
    for g, e, factor in ((got[1], exact[1], t), (got[2], exact[2], grad)):
        bound = step * factor.abs().sum(0)[:, None]  # |sum_i f_i (x_hat - x)_ij| per entry
        assert bool(((g - e).abs() <= bound).all())
        assert not torch.equal(g, e)


def test_errors():
    graph, _, x, w, b, _ = _case(True, 64, False)
    with pytest.raises(ValueError, match="x has 48 features but the weight expects 10"):
        ops.aggregate_linear(x, graph, w[:, :10], b)
    with pytest.raises(ValueError, match="reduce must be 'sum' or 'mean', got 'max'"):
        ops.aggregate_linear(x, graph, w, b, reduce="max")
    with pytest.raises(ValueError, match="not one it computes"):
        ops.aggregate_linear(x.half(), graph, w.half(), b)


# ----------------------------------------------------------------------------------- memory

ROWS, WIDTH = 65_536, 128  # one tensor: 32 MiB of float32


@pytest.mark.parametrize("conv", ["gcn", "sage"])
def test_a_layer_holds_two_full_size_tensors_each_way(conv):
    """Forward: the output and a block (the input exists before); backward: the restored
    input, which the input gradient overwrites, and a block (the incoming gradient exists
    before) — where the composed ops held the product, the aggregate and the gradient too."""
    from torch_geometric.nn import GCNConv, SAGEConv

    torch.manual_seed(0)
    x = torch.randn(ROWS, WIDTH, requires_grad=True)
    edge_index = torch.randint(0, ROWS, (2, 4 * ROWS))
    layer = (GCNConv if conv == "gcn" else SAGEConv)(WIDTH, WIDTH)
    layer = gnnact.convert(layer, Config(bits=2))
    layer(x, edge_index)  # builds and caches the graph
    with PeakMeter() as forward:
        out = layer(x, edge_index)
    assert forward.peak_bytes < 1.2 * x.nbytes
    grad = torch.randn_like(out)
    with PeakMeter() as backward:
        out.backward(grad)
    grads = x.grad.nbytes + sum(p.grad.nbytes for p in layer.parameters())
    assert backward.end_bytes == grads  # the input gradient is the restored input's storage
    assert backward.peak_bytes < 1.2 * x.nbytes


# ------------------------------------------------------------------------ by-block masks

@pytest.mark.parametrize(("divisor", "slope"), [(1.0, 0.0), (1.0, 0.01), (0.5, 0.0)],
                         ids=["relu", "leaky", "dropout"])
def test_masks_by_blocks_are_the_whole_tensor_expression(divisor, slope):
    """The rebuild applies a packed mask block by block, in place: the same bits as applying
    the whole unpacked mask (a size that is no multiple of a block or of 8)."""
    n = 5 * block_elements(300_001) + 13
    x = torch.randn(n)
    x[::97] = float("nan")  # NaN stays NaN, -0.0 keeps its sign
    x[1::89] = -0.0
    mask = torch.rand(n) > 0.3
    packed = pack_mask(mask)
    want = apply_mask(x.clone(), unpack_mask(packed), divisor, slope)
    value = x.clone().view(n, 1)
    got = masked_by_blocks(value, pack_mask(mask.view(n, 1)), divisor, slope, out=value)
    assert got is value
    assert torch.equal(got.view(-1).view(torch.int32), want.view(torch.int32))


@pytest.mark.parametrize("op", ["relu", "leaky_relu", "dropout"])
def test_mask_backward_by_blocks_equals_pytorch(op):
    n = 400_003
    x = torch.randn(n, requires_grad=True)
    grad = torch.randn(n)
    torch.manual_seed(5)
    if op == "dropout":
        ours = ops.dropout(x, 0.3, training=True)
        torch.manual_seed(5)
        ref = torch.nn.functional.dropout(x, 0.3, training=True)
    else:
        ours = getattr(ops, op)(x)
        ref = getattr(torch.nn.functional, op)(x)
    assert torch.equal(ours, ref)
    (g_ours,) = torch.autograd.grad(ours, x, grad)
    (g_ref,) = torch.autograd.grad(ref, x, grad)
    assert torch.equal(g_ours, g_ref)
