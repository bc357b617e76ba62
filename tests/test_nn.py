"""gnnact.nn GCNConv / SAGEConv, the torch-layer twins and convert: parity with PyG at 32 bits,
unbiasedness when compressed, exact saved bytes, conversion semantics, bad input."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import nn
from torch_geometric import EdgeIndex
from torch_geometric.typing import WITH_TORCH_SPARSE
from torch_geometric.utils import to_torch_csr_tensor

import gnnact
from gnnact import Config, ops
from gnnact.memory import breakdown, saved_bytes, saved_tensors

EXACT = Config(bits=32)
N, E, F_IN, F_OUT = 30, 120, 8, 6


def graph_inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, F_IN, generator=gen, dtype=torch.float64)
    ei = torch.randint(0, N, (2, E), generator=gen)
    return x, ei


def adjacency(kind: str, ei: torch.Tensor, n_src: int = N, n_dst: int = N):
    if kind == "edge_index":
        return ei
    if kind == "EdgeIndex":
        return EdgeIndex(ei, sparse_size=(n_src, n_dst))
    if kind == "csr":  # PyG's adj_t convention: rows are targets
        ones = torch.ones(ei.size(1), dtype=torch.float64)
        return to_torch_csr_tensor(ei.flip(0), ones, size=(n_dst, n_src))
    if kind == "SparseTensor":
        from torch_sparse import SparseTensor

        return SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(n_dst, n_src))
    raise AssertionError(kind)


ADJ_KINDS = ["edge_index", "EdgeIndex", "csr", pytest.param(
    "SparseTensor", marks=pytest.mark.skipif(not WITH_TORCH_SPARSE, reason="no torch-sparse"))]


def assert_parity(ours: nn.Module, ref: nn.Module, inputs: tuple, ref_inputs: tuple | None = None,
                  grads_of: tuple = ()) -> None:
    """Forward and gradients (inputs in ``grads_of`` and every parameter) within 1e-6 rel."""
    ours.load_state_dict(ref.state_dict())
    out, expected = ours(*inputs), ref(*(ref_inputs or inputs))
    torch.testing.assert_close(out, expected, rtol=1e-6, atol=1e-12)
    g = torch.randn_like(out)
    ours_grads = torch.autograd.grad(out, [*grads_of, *ours.parameters()], g)
    ref_grads = torch.autograd.grad(expected, [*grads_of, *ref.parameters()], g)
    for a, b in zip(ours_grads, ref_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("kind", ADJ_KINDS)
@pytest.mark.parametrize("kwargs", [{}, {"improved": True}, {"cached": True},
                                    {"add_self_loops": False},
                                    {"normalize": False, "add_self_loops": False},
                                    {"bias": False}])
def test_gcn_parity(kind, kwargs):
    if kind == "SparseTensor" and not kwargs.get("normalize", True):
        pytest.skip("PyG's unnormalized SparseTensor path uses its stored values only")
    x, ei = graph_inputs()
    x.requires_grad_()
    adj = adjacency(kind, ei)
    ref = pyg_nn.GCNConv(F_IN, F_OUT, **kwargs).double()
    ours = gnnact.nn.GCNConv(F_IN, F_OUT, config=EXACT, **kwargs).double()
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert_parity(ours, ref, (x, adj), grads_of=(x,))
    if kwargs.get("cached"):  # second call reuses the cached graph
        assert_parity(ours, ref, (x, adj), grads_of=(x,))


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("weight_grad", [False, True])
def test_gcn_parity_with_edge_weight(normalize, weight_grad):
    x, ei = graph_inputs(1)
    x.requires_grad_()
    w = torch.rand(E, dtype=torch.float64, requires_grad=weight_grad)
    kwargs = {"normalize": normalize, "add_self_loops": normalize}
    ref = pyg_nn.GCNConv(F_IN, F_OUT, **kwargs).double()
    ours = gnnact.nn.GCNConv(F_IN, F_OUT, config=EXACT, **kwargs).double()
    grads_of = (x, w) if weight_grad else (x,)
    assert_parity(ours, ref, (x, ei, w), grads_of=grads_of)


@pytest.mark.parametrize("kind", ADJ_KINDS)
@pytest.mark.parametrize("kwargs", [{}, {"aggr": "sum"}, {"root_weight": False},
                                    {"project": True}, {"normalize": True}, {"bias": False}])
def test_sage_parity(kind, kwargs):
    x, ei = graph_inputs(2)
    x.requires_grad_()
    adj = adjacency(kind, ei)
    ref = pyg_nn.SAGEConv(F_IN, F_OUT, **kwargs).double()
    ours = gnnact.nn.SAGEConv(F_IN, F_OUT, config=EXACT, **kwargs).double()
    assert list(ours.state_dict()) == list(ref.state_dict())
    assert_parity(ours, ref, (x, adj), grads_of=(x,))


@pytest.mark.parametrize("kind", ["edge_index", "csr"])
def test_sage_bipartite_parity(kind):
    gen = torch.Generator().manual_seed(3)
    x_src = torch.randn(N, F_IN, dtype=torch.float64, generator=gen, requires_grad=True)
    x_dst = torch.randn(12, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    ei = torch.stack([torch.randint(0, N, (E,), generator=gen),
                      torch.randint(0, 12, (E,), generator=gen)])
    adj = adjacency(kind, ei, N, 12)
    ref = pyg_nn.SAGEConv((F_IN, 5), F_OUT).double()
    ours = gnnact.nn.SAGEConv((F_IN, 5), F_OUT, config=EXACT).double()
    size = (N, 12) if kind == "edge_index" else None
    assert_parity(ours, ref, ((x_src, x_dst), adj, size), grads_of=(x_src, x_dst))


def test_gcn_constant_edge_weight_keeps_no_edge_tensor():
    x, ei = graph_inputs()
    x.requires_grad_()
    w = torch.rand(E, dtype=torch.float64)  # constant: folded into the cached graph
    for normalize in (True, False):
        conv = gnnact.nn.GCNConv(F_IN, F_OUT, normalize=normalize, add_self_loops=normalize,
                                 config=Config(bits=2)).double()
        for _call in range(2):  # the second call reuses the cached graph
            loss = conv(x, ei, w).sum()
            kept = breakdown(loss, exclude=[x])
            assert kept.context == packed(N * F_IN)  # and the graph, in the cache line
            assert kept.graph_cache > 0


def test_sparse_adjacency_rejects_reversed_flow():
    x, ei = graph_inputs()
    conv = gnnact.nn.GCNConv(F_IN, F_OUT, flow="target_to_source").double()
    with pytest.raises(ValueError, match='Flow direction "target_to_source" is invalid'):
        conv(x, adjacency("csr", ei))


def test_lazy_in_channels():
    x, ei = graph_inputs()
    conv = gnnact.nn.GCNConv(-1, F_OUT).double()
    assert conv(x, ei).shape == (N, F_OUT)
    assert conv.lin.weight.shape == (F_OUT, F_IN)


def two_layer(conv_cls, config=None):
    kwargs = {} if config is None else {"config": config}
    torch.manual_seed(0)
    return nn.ModuleList([conv_cls(F_IN, 16, **kwargs), conv_cls(16, 4, **kwargs)]).double()


def run(convs, x, ei, target):
    h = ops.relu(convs[0](x, ei))
    return F.cross_entropy(convs[1](h, ei), target)


@pytest.mark.parametrize("conv_cls", [gnnact.nn.GCNConv, gnnact.nn.SAGEConv])
def test_two_bit_gradients_are_unbiased_and_variance_shrinks_with_bits(conv_cls):
    x, ei = graph_inputs(4)
    target = torch.randint(0, 4, (N,), generator=torch.Generator().manual_seed(0))
    exact = two_layer(conv_cls, EXACT)
    loss = run(exact, x, ei, target)
    g_exact = torch.cat([g.flatten() for g in torch.autograd.grad(loss, exact.parameters())])

    draws = 400
    variances = {}
    for bits in (2, 4):
        model = two_layer(conv_cls, Config(bits=bits, group_size=64))
        samples = []
        for d in range(draws):
            torch.manual_seed(100 + d)
            loss = run(model, x, ei, target)
            samples.append(torch.cat([g.flatten() for g in
                                      torch.autograd.grad(loss, model.parameters())]))
        s = torch.stack(samples)
        mean, std = s.mean(0), s.std(0)
        # The forward pass is exact, so only backward is stochastic: the gradient is linear in
        # each independent rounding, hence unbiased; 5 standard errors per coordinate (1e-12
        # for coordinates that do not see any rounded tensor).
        assert ((mean - g_exact).abs() <= 5 * std / math.sqrt(draws) + 1e-12).all()
        variances[bits] = s.var(0).sum().item()
        assert variances[bits] > 0
    assert variances[4] < variances[2] / 4


def test_constant_adjacency_spmm_keeps_zero_activation_bytes():
    x, ei = graph_inputs()
    x.requires_grad_()
    graph = ops.graph_from(ei, N)
    for reduce in ("sum", "mean"):
        y = ops.spmm(x, graph, reduce=reduce, config=Config(bits=2))
        kept = breakdown(y.sum())
        assert kept.context == 0 and kept.graph_cache > 0
        assert {r.kind for r in saved_tensors(y.sum())} == {"graph_cache"}
    # Edge values that need a gradient make it keep x, compressed.
    w = torch.rand(graph.num_edges, dtype=torch.float64, requires_grad=True)
    y = ops.spmm(x, graph, w, config=Config(bits=2))
    p = gnnact.quantize(x.detach(), bits=2)
    assert breakdown(y.sum()).context == p.nbytes


def packed(numel: int, bits: int = 2, group: int = 512) -> int:
    g = min(group, numel)
    return -(-numel // g) * ((g * bits + 7) // 8 + 8)


class GCN3(nn.Module):
    """EXACT's GCN: 3 layers, BatchNorm, ReLU, dropout."""

    def __init__(self, f_in: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.convs = nn.ModuleList([pyg_nn.GCNConv(f_in, hidden), pyg_nn.GCNConv(hidden, hidden),
                                    pyg_nn.GCNConv(hidden, classes)])
        self.bns = nn.ModuleList([nn.BatchNorm1d(hidden), nn.BatchNorm1d(hidden)])
        self.act, self.drop = nn.ReLU(), nn.Dropout(0.5)

    def forward(self, x, adj):
        for conv, bn in zip(self.convs[:-1], self.bns, strict=True):
            x = self.drop(self.act(bn(conv(x, adj))))
        return self.convs[-1](x, adj)


def test_resident_inputs_kept_by_reference_temporaries_packed():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(600, 16, generator=gen)
    lin = gnnact.nn.Linear(16, 8, config=Config(bits=2))
    ref = nn.Linear(16, 8)
    ref.load_state_dict(lin.state_dict())
    # The input x needs no gradient: kept as is (no bytes beyond x), so grad W is exact.
    out = lin(x)
    records = saved_tensors(out.sum())
    assert [r.shape for r in records if r.first] == [(600, 16)]
    assert saved_bytes(out.sum(), exclude=[x]) == 0
    torch.testing.assert_close(torch.autograd.grad(out.sum(), lin.weight)[0],
                               torch.autograd.grad(ref(x).sum(), ref.weight)[0])
    # Input dropout outside autograd makes a temporary: packed like any activation.
    drop = gnnact.nn.Dropout(0.5)
    assert saved_bytes(lin(drop(x)).sum()) == packed(600 * 16)
    # A gnnact op's output under no_grad is not marked (nothing keeps it).
    with torch.no_grad():
        assert not hasattr(drop(x), "_gnnact_transient")
    # Without resident inputs, x itself is packed too.
    lin.config = Config(bits=2, resident_inputs=False)
    assert saved_bytes(lin(x).sum(), exclude=[x]) == packed(600 * 16)
    with pytest.raises(TypeError, match="resident_inputs"):
        Config(resident_inputs=1)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_sparse_input_features_kept_by_reference(layout, device):
    """A sparse x (bag-of-words features) goes through gnnact's linear map as it is: the same
    output and weight gradient as dense, the sparse tensor itself the only thing kept."""
    gen = torch.Generator().manual_seed(0)
    dense = torch.rand(200, 40, generator=gen) * (torch.rand(200, 40, generator=gen) < 0.1)
    dense = dense.to(device)
    x = dense.to_sparse() if layout == torch.sparse_coo else dense.to_sparse_csr()
    lin = gnnact.nn.Linear(40, 8, config=Config(bits=2)).to(device)
    out, ref = lin(x), lin(dense)
    torch.testing.assert_close(out, ref)
    g = torch.randn(200, 8, generator=gen).to(device)
    for got, want in zip(torch.autograd.grad(out, list(lin.parameters()), g),
                         torch.autograd.grad(ref, list(lin.parameters()), g), strict=True):
        torch.testing.assert_close(got, want)
    assert saved_bytes(lin(x).sum(), exclude=[x]) == 0
    parts = ((x.indices(), x.values()) if layout == torch.sparse_coo
             else (x.crow_indices(), x.col_indices(), x.values()))
    # Not excluded: x's values and indices, exactly; nothing densified.
    assert saved_bytes(lin(x).sum()) == sum(t.untyped_storage().nbytes() for t in parts)
    with pytest.raises(ValueError, match="sparse x must be 2-D and need no gradient"):
        lin(x.clone().requires_grad_())


def test_has_batchnorm_matches_the_built_models():
    from gnnact.models import MODELS, has_batchnorm

    assert {name: has_batchnorm(name) for name in MODELS} == {
        "gcn": True, "sage": True, "gat": True, "gcnii": False}


@pytest.mark.parametrize("name", ["gcn", "sage", "gat", "gcnii"])
def test_models_take_sparse_features(name):
    """Every model, PyG's and converted, gives the loss and gradients of dense features when
    given them as a sparse CSR tensor (GCNII's input dropout acts on the stored values); PyG's
    SAGE cannot aggregate sparse features, gnnact's (which transforms first) can."""
    from gnnact.data import synthetic_graph
    from gnnact.models import build
    from gnnact.training import loss_of

    data = synthetic_graph(200, 6, 30, 4, seed=0)
    data.x = data.x * (torch.rand_like(data.x) < 0.2)
    sparse = data.clone()
    sparse.x = data.x.to_sparse_csr()
    for convert in ([True] if name == "sage" else [False, True]):
        torch.manual_seed(0)
        model = build(name, 30, 4, hidden=16, **({"layers": 3} if name == "gcnii" else {}))
        if convert:
            gnnact.convert(model, EXACT)
        params = list(model.parameters())
        results = []
        model.drop.p = 0.0  # dropout draws differ between the layouts
        for d in (data, sparse):
            loss = loss_of(model, d)
            results.append((loss, torch.autograd.grad(loss, params)))
        torch.testing.assert_close(results[0], results[1])
    model = gnnact.convert(build(name, 30, 4, hidden=16), Config(bits=2))
    if name == "gcnii":  # input dropout zeroes stored values, scales the rest by 1 / (1 - p)
        dropped = model.drop_input(sparse.x)
        assert dropped.layout == torch.sparse_csr
        kept = dropped.values() != 0
        torch.testing.assert_close(dropped.values()[kept], 2 * sparse.x.values()[kept])
        assert 0.3 < kept.float().mean() < 0.7
    loss_of(model, sparse).backward()  # trains at 2 bits with dropout
    assert all(p.grad is not None for p in model.parameters())


def test_gcn3_saved_bytes_exact_formula():
    n, f_in, hidden, classes = 1000, 64, 256, 7
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(n, f_in, generator=gen)
    ei = torch.randint(0, n, (2, 8000), generator=gen)
    model = gnnact.convert(GCN3(f_in, hidden, classes), Config(bits=2))
    loss = model(x, ei).sum()
    nh = n * hidden
    per_hidden_layer = (packed(nh)                 # BatchNorm input
                        + 2 * hidden * 4           # batch mean and inverse std
                        + 2 * math.ceil(nh / 8))   # ReLU and dropout masks
    # The first linear map keeps its input x by reference (resident: it needs no gradient); the
    # inputs of the other two are dropout(relu(BN)) outputs, rebuilt from the BatchNorm input,
    # statistics and masks above: no extra bytes.
    expected = 2 * per_hidden_layer
    kept = breakdown(loss, exclude=[x])
    assert kept.context == expected
    # One graph for the three layers: the cache line is one normalised graph's structure.
    assert 0 < kept.graph_cache <= 16 * (8000 + n)
    # Without resident inputs the first linear map keeps x packed.
    gnnact.convert(model, Config(bits=2, resident_inputs=False))
    assert breakdown(model(x, ei).sum(), exclude=[x]).context == expected + packed(n * f_in)
    # Nothing of size E but the graph cache's structure.
    assert all(r.shape[0] not in (8000, 8000 + n) for r in saved_tensors(loss, exclude=[x])
               if r.kind == "context")


@pytest.mark.parametrize("act", ["relu", "leaky_relu"])
def test_derived_linear_input_is_rebuilt_unbiased(act):
    # BN -> activation -> dropout -> linear: the linear map keeps no copy of its input but
    # rebuilds it from the BN input (2 bits), statistics and masks. Only W's gradient is taken,
    # g^T z_hat, which is linear in the rounding: its error against g^T z of the same forward
    # pass (z exact) must average to zero.
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 16, generator=gen, dtype=torch.float64)
    w_bn = torch.rand(16, generator=gen, dtype=torch.float64, requires_grad=True)
    b_bn = torch.randn(16, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(8, 16, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(200, 8, generator=gen, dtype=torch.float64)
    config = Config(bits=2, group_size=64)
    errors = []
    for d in range(300):
        torch.manual_seed(d)
        h = ops.batch_norm(x, None, None, w_bn, b_bn, training=True, config=config)
        h = ops.relu(h) if act == "relu" else ops.leaky_relu(h, 0.1)
        z = ops.dropout(h, 0.3)
        out = ops.linear(z, weight, None, config)
        (grad_w,) = torch.autograd.grad(out, weight, g)
        errors.append(grad_w - g.t() @ z.detach())
    e = torch.stack(errors)
    mean, std = e.mean(0), e.std(0)
    live = (z != 0).any(0)  # a feature the activation zeroes everywhere carries no noise
    assert (std[:, live] > 0).all()  # the rebuilt input really is stochastic ...
    assert (mean.abs() <= 5 * std / math.sqrt(len(errors)) + 1e-12).all()  # ... and unbiased


def test_compressed_batchnorm_input_gradient_sums_to_zero():
    # Exact BatchNorm: sum_n dX_n = 0 per channel, so a bias just before it gets no gradient.
    # Rounding noise must not break that (Adam would turn leaked noise into full-size steps).
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 32, generator=gen, dtype=torch.float64).mul(0.05).requires_grad_()
    bias = torch.zeros(32, dtype=torch.float64, requires_grad=True)
    weight = torch.rand(32, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(300, 32, generator=gen, dtype=torch.float64)
    out = ops.batch_norm(x + bias, None, None, weight, None, training=True,
                         config=Config(bits=2))
    grad_x, grad_bias = torch.autograd.grad(out, (x, bias), g)
    assert grad_x.abs().max() > 1
    assert grad_bias.abs().max() < 1e-9 * grad_x.abs().max()


@pytest.mark.parametrize("bits", [2, 16, 32])
def test_batchnorm_backward_leaves_its_input_alone(bits):
    # At 16 and 32 bits BatchNorm keeps its input itself, and its backward works in place on
    # what it computes: the input and the incoming gradient must come out unchanged.
    x = torch.randn(64, 8, dtype=torch.float32).requires_grad_()
    g = torch.randn(64, 8)
    x0, g0 = x.detach().clone(), g.clone()
    weight = torch.rand(8, requires_grad=True)
    out = ops.batch_norm(x, None, None, weight, None, training=True,
                         config=Config(bits=bits))
    grad_x, grad_w = torch.autograd.grad(out, (x, weight), g)
    assert torch.equal(x.detach(), x0) and torch.equal(g, g0)
    if bits == 32:  # the exact gradient, up to the centring's rounding
        ref = torch.nn.functional.batch_norm(x, None, None, weight, None, training=True)
        ref_x, ref_w = torch.autograd.grad(ref, (x, weight), g)
        torch.testing.assert_close(grad_x, ref_x)
        torch.testing.assert_close(grad_w, ref_w)


def test_convert_keeps_weights_objects_and_outputs():
    torch.manual_seed(0)
    x, ei = graph_inputs()
    model = GCN3(F_IN, 16, 3).double()
    params_before = list(model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model.eval()
    expected = model(x, ei)
    keys = list(model.state_dict())
    assert gnnact.convert(model, EXACT) is model
    assert type(model.convs[0]) is gnnact.nn.GCNConv
    assert type(model.bns[0]) is gnnact.nn.BatchNorm1d
    assert type(model.act) is gnnact.nn.ReLU and type(model.drop) is gnnact.nn.Dropout
    assert all(a is b for a, b in zip(model.parameters(), params_before, strict=True))
    assert list(model.state_dict()) == keys
    torch.testing.assert_close(model(x, ei), expected, rtol=1e-12, atol=1e-12)
    # Training still updates the very parameters the optimizer holds.
    model.train()
    before = model.convs[0].lin.weight.detach().clone()
    model(x, ei).sum().backward()
    opt.step()
    assert not torch.equal(model.convs[0].lin.weight, before)


def test_convert_train_mode_parity_with_dropout_and_batchnorm():
    x, ei = graph_inputs()
    torch.manual_seed(0)
    ref = GCN3(F_IN, 16, 3).double()
    torch.manual_seed(0)
    ours = gnnact.convert(GCN3(F_IN, 16, 3).double(), EXACT)
    torch.manual_seed(7)
    a = ref(x, ei)
    torch.manual_seed(7)
    b = ours(x, ei)
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-12)
    g = torch.randn_like(a)
    for p, q in zip(torch.autograd.grad(b, list(ours.parameters()), g),
                    torch.autograd.grad(a, list(ref.parameters()), g), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-12)
    for p, q in zip(ours.buffers(), ref.buffers(), strict=True):  # running statistics
        torch.testing.assert_close(p, q)


def test_convert_nested_unknown_and_unsupported_modules():
    class MyConv(pyg_nn.GCNConv):  # a user's subclass may override forward: left alone
        pass

    model = nn.Sequential(
        nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)),
        nn.ModuleDict({"conv": pyg_nn.SAGEConv(4, 4), "mine": MyConv(4, 4)}),
        pyg_nn.SAGEConv(4, 4, aggr="max"),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every SAGEConv converts, whatever its aggr
        gnnact.convert(model, Config(bits=4))
    assert type(model[0][0]) is gnnact.nn.Linear and model[0][0].config.bits == 4
    assert type(model[0][1]) is nn.LayerNorm
    assert type(model[1]["conv"]) is gnnact.nn.SAGEConv
    assert type(model[1]["mine"]) is MyConv
    assert type(model[2]) is gnnact.nn.SAGEConv and model[2].aggr == "max"
    # Converting again re-configures.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        gnnact.convert(model, Config(bits=8))
    assert model[1]["conv"].config.bits == 8
    # A bare supported layer converts itself.
    lin = nn.Linear(3, 3)
    assert gnnact.convert(lin) is lin and isinstance(lin, gnnact.nn.Linear)


def test_no_grad_and_eval_keep_nothing_and_match():
    x, ei = graph_inputs()
    model = gnnact.convert(GCN3(F_IN, 16, 3).double(), Config(bits=2)).eval()
    with torch.no_grad():
        out = model(x, ei)
    assert out.grad_fn is None
    ref = GCN3(F_IN, 16, 3).double().eval()
    ref.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(out, ref(x, ei))


@pytest.mark.parametrize("name", ["gcn", "sage", "gat", "gcnii"])
def test_no_grad_quantizes_nothing(name, monkeypatch):
    # needs_input_grad stays set under torch.no_grad: every op must still skip its context.
    from gnnact.models import build
    from gnnact.ops import context

    calls = []
    real = context.quantize
    monkeypatch.setattr(context, "quantize", lambda *a, **k: calls.append(1) or real(*a, **k))
    x, ei = graph_inputs()
    model = gnnact.convert(build(name, F_IN, 3, hidden=8, layers=3), Config(bits=2)).double()
    with torch.no_grad():
        model(x, ei)
    assert calls == []
    model(x, ei).sum()  # and with grad, it does quantize
    assert calls


def test_bad_input_raises_clear_errors():
    x, ei = graph_inputs()
    conv = gnnact.nn.GCNConv(F_IN, F_OUT)
    with pytest.raises(ValueError, match=r"edge_index holds node indices in \[0, 29\] but the "
                                         r"graph has 20 source"):
        conv(x[:20].float(), ei)
    with pytest.raises(ValueError, match="Encountered tensor with size 20 in dimension -2, "
                                         "but expected size 30"):  # PyG's message
        gnnact.nn.SAGEConv(F_IN, F_OUT)(x[:20].float(), adjacency("csr", ei))
    with pytest.raises(ValueError, match="x has 8 features but the weight expects 5"):
        gnnact.nn.GCNConv(5, F_OUT)(x.float(), ei)
    with pytest.raises(ValueError, match="edge_index must be an integer tensor of shape"):
        conv(x.float(), ei.float())
    with pytest.raises(ValueError, match=r"Config.bits must be one of .* got 9"):
        Config(bits=9)
    with pytest.raises(ValueError, match="Config.group_size must be a positive int, got 0"):
        Config(group_size=0)
    with pytest.raises(ValueError, match="Config.backend must be one of"):
        Config(backend="numba")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module, got str"):
        gnnact.convert("model")
    with pytest.raises(TypeError, match="config must be a gnnact.Config, got int"):
        gnnact.convert(nn.Linear(2, 2), 2)
    with pytest.raises(ValueError, match="a tuple of node features"):
        conv((x.float(), x.float()), ei)
