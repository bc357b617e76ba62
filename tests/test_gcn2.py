"""Tests for :class:`gnnact.nn.conv.gcn2_conv.GCN2Conv` and :func:`gnnact.ops.gcn2.gcn2_residual`.

* parity with PyG's ``GCN2Conv`` at ``Config(bits=32)`` (float64, outputs and every gradient);
* what a 4-layer GCNII stack keeps at 2 bits, byte for byte, with one packed copy of
  :math:`H^0` shared by all layers (separate weights) or none at all (shared weights);
* unbiasedness of the weight gradients at 2 bits, and an error that shrinks with the bits.
"""

from __future__ import annotations

import math
import weakref

import pytest
import torch
import torch_geometric
from torch import Tensor
from torch_geometric.utils import coalesce, to_torch_csr_tensor

from gnnact import ops
from gnnact.config import Config
from gnnact.memory import breakdown, saved_bytes, saved_tensors
from gnnact.nn.conv.gcn2_conv import GCN2Conv
from gnnact.ops.context import shared_quantize
from gnnact.ops.gcn2 import gcn2_residual
from gnnact.ops.graph import GraphCache, use_graph_cache
from gnnact.quant.packed import packed_code_bytes

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled"),
]

EXACT = Config(bits=32)


N, F, E = 40, 12, 160


def _graph(seed: int = 0, n: int = N, e: int = E) -> Tensor:
    """A random directed graph, coalesced, with a few self-loops (to exercise
    ``add_remaining_self_loops``)."""
    g = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, e), generator=g)
    ei = torch.cat([ei, torch.arange(0, n, 7).repeat(2, 1)], dim=1)
    return coalesce(ei, num_nodes=n)


def _rel(a: Tensor, b: Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-300))


def _pair(**kwargs) -> tuple[torch_geometric.nn.GCN2Conv, GCN2Conv]:
    """PyG's layer and ours, float64, with the same weights."""
    torch.manual_seed(0)
    ref = torch_geometric.nn.GCN2Conv(F, 0.2, **kwargs).double()
    ours = GCN2Conv(F, 0.2, config=EXACT, **kwargs).double()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _run(module, x: Tensor, x_0: Tensor, adj, edge_weight: Tensor | None, target: Tensor):
    """Output and the gradients of x, x_0, edge_weight and the weights for <out, target>."""
    leaves = [x, x_0, *([edge_weight] if edge_weight is not None and
                        edge_weight.requires_grad else []), *module.parameters()]
    out = module(x, x_0, adj, edge_weight)
    grads = torch.autograd.grad((out * target).sum(), leaves)
    return out.detach(), grads


def _inputs(n: int = N, rows0: int | None = None, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, F, generator=g, dtype=torch.float64, requires_grad=True)
    x_0 = torch.randn(rows0 or n, F, generator=g, dtype=torch.float64, requires_grad=True)
    target = torch.randn(n, F, generator=g, dtype=torch.float64)
    return x, x_0, target


def _assert_parity(ref, ours, x, x_0, adj, edge_weight, target):
    out_ref, grads_ref = _run(ref, x, x_0, adj, edge_weight, target)
    out, grads = _run(ours, x, x_0, adj, edge_weight, target)
    assert out.shape == out_ref.shape
    assert _rel(out, out_ref) <= 1e-6
    assert len(grads) == len(grads_ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        assert _rel(g, g_ref) <= 1e-6
    return out


# ----------------------------------------------------------------------------- parity

LAYER_KWARGS = [
    {},
    {"shared_weights": False},
    {"theta": 0.5, "layer": 3},
    {"theta": 0.5, "layer": 3, "shared_weights": False},
    {"add_self_loops": False},
    {"normalize": False},
    {"normalize": False, "shared_weights": False},
    {"aggr": "mean", "shared_weights": False},
    {"flow": "target_to_source", "theta": 1.0, "layer": 1},
]


def _adjacency(kind: str, ei: Tensor, weight: Tensor | None = None):
    if kind == "edge_index":
        return ei
    if kind == "edge_index_obj":
        return torch_geometric.EdgeIndex(ei, sparse_size=(N, N))
    # adj_t: row = target, column = source.
    value = torch.ones(ei.size(1), dtype=torch.float64) if weight is None else weight
    return to_torch_csr_tensor(ei.flip(0), value, size=(N, N))


@pytest.mark.parametrize("kind", ["edge_index", "edge_index_obj", "csr"])
@pytest.mark.parametrize("kwargs", LAYER_KWARGS, ids=lambda k: ",".join(
    f"{a}={b}" for a, b in k.items()) or "default")
def test_parity(kind, kwargs):
    ref, ours = _pair(**kwargs)
    x, x_0, target = _inputs()
    if kind == "csr" and kwargs.get("flow") == "target_to_source":
        for module in (ref, ours):  # PyG rejects a reversed flow for a sparse adj_t: so do we
            with pytest.raises(ValueError, match="target_to_source"):
                module(x, x_0, _adjacency(kind, _graph()))
        return
    _assert_parity(ref, ours, x, x_0, _adjacency(kind, _graph()), None, target)


@pytest.mark.parametrize("normalize", [True, False])
@pytest.mark.parametrize("kind", ["edge_index", "edge_index_obj"])
@pytest.mark.parametrize("weight_grad", [False, True])
def test_parity_edge_weight(normalize, kind, weight_grad):
    ei = _graph()
    ref, ours = _pair(normalize=normalize, shared_weights=False, theta=0.3, layer=2)
    x, x_0, target = _inputs()
    w = torch.rand(ei.size(1), dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    w = (w + 0.5).requires_grad_(weight_grad)
    _assert_parity(ref, ours, x, x_0, _adjacency(kind, ei), w, target)


def test_parity_csr_values():
    # Without normalisation a sparse adj_t contributes its own values (edge_weight is ignored by
    # PyG's fused path, and must be here too).
    ei = _graph()
    w = torch.rand(ei.size(1), dtype=torch.float64) + 0.5
    ref, ours = _pair(normalize=False)
    x, x_0, target = _inputs()
    adj = _adjacency("csr", ei, w)
    _assert_parity(ref, ours, x, x_0, adj, None, target)
    ignored = torch.rand(ei.size(1), dtype=torch.float64)
    _assert_parity(ref, ours, x, x_0, adj, ignored, target)


def test_parity_cached():
    # cached=True: the graph of the first call is used for every later call, whatever the input.
    ref, ours = _pair(cached=True, shared_weights=False)
    x, x_0, target = _inputs()
    first, second = _graph(0), _graph(1)
    out1 = _assert_parity(ref, ours, x, x_0, first, None, target)
    out2 = _assert_parity(ref, ours, x, x_0, second, None, target)
    assert torch.allclose(out1, out2, rtol=0, atol=1e-12)
    ours.reset_parameters()  # clears the cache, as PyG's does
    assert ours._cached_graph is None


def test_parity_longer_x0():
    # PyG uses x_0[:x.size(0)]; the rows past it get a zero gradient.
    for shared in (True, False):
        ref, ours = _pair(shared_weights=shared, theta=0.5, layer=2)
        x, x_0, target = _inputs(rows0=N + 5)
        _assert_parity(ref, ours, x, x_0, _graph(), None, target)


def test_parity_float32_default_config():
    # Not exact any more at 2 bits, but the forward pass reads no compressed tensor: the output
    # is PyG's (only what backward reads is compressed).
    torch.manual_seed(0)
    ref = torch_geometric.nn.GCN2Conv(F, 0.1, theta=0.5, layer=1, shared_weights=False)
    ours = GCN2Conv(F, 0.1, theta=0.5, layer=1, shared_weights=False)
    ours.load_state_dict(ref.state_dict())
    x, x_0 = torch.randn(N, F), torch.randn(N, F)
    assert ours.config == Config()
    assert _rel(ours(x, x_0, _graph()), ref(x, x_0, _graph())) <= 1e-6


# ----------------------------------------------------------------------------- module API


def test_state_dict_keys_and_repr():
    for shared in (True, False):
        ref, ours = _pair(shared_weights=shared, theta=0.5, layer=2)
        assert list(ours.state_dict()) == list(ref.state_dict())
        assert list(ours.state_dict()) == (["weight1"] if shared else ["weight1", "weight2"])
        assert repr(ours) == repr(ref)


def test_propagate_type_beside_pyg():
    # DESIGN §7: with PyG's class name, the generated propagate() must still work for ours and
    # for PyG's own layer, in either construction order.
    ours = GCN2Conv(F, 0.1, config=EXACT)
    ref = torch_geometric.nn.GCN2Conv(F, 0.1)
    assert GCN2Conv.propagate_type == {"x": Tensor, "edge_weight": torch_geometric.typing.OptTensor}
    ei, x = _graph(), torch.randn(N, F)
    w = torch.rand(ei.size(1))
    expected = torch.zeros(N, F).index_add_(0, ei[1], w[:, None] * x[ei[0]])
    for module in (ours, ref):
        assert torch.allclose(module.propagate(ei, x=x, edge_weight=w), expected, atol=1e-6)


def test_adopt_keeps_parameters():
    torch.manual_seed(0)
    module = torch_geometric.nn.GCN2Conv(F, 0.2, theta=0.5, layer=2, shared_weights=False,
                                         cached=True).double()
    reference = torch_geometric.nn.GCN2Conv(F, 0.2, theta=0.5, layer=2, shared_weights=False,
                                            cached=True).double()
    reference.load_state_dict(module.state_dict())
    params = list(module.parameters())
    x, x_0, target = _inputs()
    first, second = _graph(0), _graph(1)
    # PyG caches the normalised first graph; after adoption that cache must still be used.
    module(x, x_0, first)
    reference(x, x_0, first)
    adopted = GCN2Conv._adopt(module, EXACT)
    assert adopted is module and type(module) is GCN2Conv and module.config is EXACT
    assert list(module.parameters()) == params
    assert all(a is b for a, b in zip(module.parameters(), params, strict=True))
    cache = module._cached_edge_index
    _assert_parity(reference, module, x, x_0, second, None, target)
    assert module._cached_edge_index is cache  # PyG's cache, used as PyG uses it


def test_residual_op_checks():
    p, w = torch.randn(5, 4), torch.randn(4, 4)
    with pytest.raises(ValueError, match="rows"):
        gcn2_residual(p, torch.randn(3, 4), w)
    with pytest.raises(ValueError, match="weight2"):
        gcn2_residual(p, torch.randn(5, 4), w, torch.randn(4, 3))


def test_residual_op_gradcheck():
    # Independent of PyG: the op's analytic backward against finite differences.
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
            for _ in range(2)]
    x_0 = torch.randn(8, 3, generator=g, dtype=torch.float64, requires_grad=True)
    w1, w2 = (torch.randn(3, 3, generator=g, dtype=torch.float64, requires_grad=True)
              for _ in range(2))
    p = args[0]
    for weights in ((w1, None), (w1, w2)):
        assert torch.autograd.gradcheck(
            lambda p, x_0, w1, w2=None: gcn2_residual(p, x_0, w1, w2, 0.3, 0.7, EXACT),
            (p, x_0, *(w for w in weights if w is not None)))


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("bipartite", [False, True])
def test_layer_op_is_the_two_ops(shared, bipartite):
    """gcn2_conv (the aggregation inside the residual op) gives the values and gradients of
    spmm followed by gcn2_residual, at 32 bits and, with the same noise, at 2 (the input's
    gradient up to rounding)."""
    from gnnact.ops import gcn2_conv, graph_from

    g = torch.Generator().manual_seed(1)
    n_src, n_dst, f = 40, 30 if bipartite else 40, 8
    edge_index = torch.stack([torch.randint(0, n_src, (160,), generator=g),
                              torch.randint(0, n_dst, (160,), generator=g)])
    graph = graph_from(edge_index, n_src, n_dst)
    x = torch.randn(n_src, f, generator=g, dtype=torch.float64)
    x_0 = torch.randn(n_dst + 3, f, generator=g, dtype=torch.float64)
    w1, w2 = (torch.randn(f, f, generator=g, dtype=torch.float64) for _ in range(2))
    grad = torch.randn(n_dst, f, generator=g, dtype=torch.float64)
    for config in (EXACT, Config(bits=2)):
        results = []
        for fused in (True, False):
            leaves = [t.clone().requires_grad_() for t in (x, x_0, w1, w2)]
            xl, x0l, w1l, w2l = leaves
            torch.manual_seed(5)
            if fused:
                out = gcn2_conv(xl, x0l, graph, w1l, None if shared else w2l, 0.2, 0.6,
                                config=config)
            else:
                out = gcn2_residual(ops.spmm(xl, graph, config=config), x0l, w1l,
                                    None if shared else w2l, 0.2, 0.6, config)
            out.backward(grad)
            results.append((out.detach(), [t.grad for t in leaves]))
        (a, grads_a), (b, grads_b) = results
        assert torch.equal(a, b)
        # The input's gradient is scaled after the transposed product (not before): equal up
        # to rounding; the others bit for bit.
        torch.testing.assert_close(grads_a[0], grads_b[0], rtol=1e-12, atol=1e-12)
        for u, v in zip(grads_a[1:], grads_b[1:], strict=True):
            assert (u is None and v is None) or torch.equal(u, v)
    with pytest.raises(ValueError, match="x has 5 rows"):
        gcn2_conv(torch.randn(5, f), x_0, graph, w1)
    with pytest.raises(ValueError, match="x_0"):
        gcn2_conv(x, x_0[:3], graph, w1)


@pytest.mark.parametrize("shared", [True, False])
def test_layer_op_holds_one_full_size_tensor_fewer(shared):
    """Forward: the aggregate is the op's own, scaled in place and let go once the support is
    made, where spmm's result is held by the caller throughout. Backward: the input's gradient
    is the transposed product of G_1, scaled in place, not of a scaled copy of G_1. Each holds
    one full-size tensor fewer than spmm then gcn2_residual."""
    from gnnact.ops import gcn2_conv, graph_from
    from gnnact.peak import PeakMeter

    n, f = 65_536, 64
    graph = graph_from(torch.randint(0, n, (2, 4 * n)), n, n)
    config = Config(bits=2)
    peaks = {}
    for fused in (True, False):
        x = torch.randn(n, f, requires_grad=True)
        x_0 = torch.randn(n, f, requires_grad=True)
        w1 = torch.randn(f, f, requires_grad=True)
        w2 = None if shared else torch.randn(f, f, requires_grad=True)
        with PeakMeter() as forward:
            if fused:
                out = gcn2_conv(x, x_0, graph, w1, w2, 0.1, 0.5, config=config)
            else:
                out = gcn2_residual(ops.spmm(x, graph, config=config), x_0, w1, w2, 0.1, 0.5,
                                    config)
        grad = torch.randn_like(out)
        with PeakMeter() as backward:
            out.backward(grad)
        peaks[fused] = (forward.peak_bytes, backward.peak_bytes)
    full = n * f * 4
    assert peaks[False][0] - peaks[True][0] > 0.9 * full
    assert peaks[False][1] - peaks[True][1] > 0.9 * full
    assert peaks[True][1] < 2.2 * full  # the input's and x_0's gradients, and G_1


# ----------------------------------------------------------------------------- memory

MEM_N, MEM_F, LAYERS, BITS = 200, 64, 4, 2


def _packed_bytes(numel: int, bits: int, group_size: int) -> int:
    """Bytes of one PackedTensor (see gnnact.quant.packed): groups × (codes + fp32 scale/zero)."""
    g = min(group_size, numel)
    return math.ceil(numel / g) * (packed_code_bytes(g, bits) + 8)


def _stack(shared: bool, config: Config | None, pyg: bool = False):
    """A GCNII stack: x_0 (a leaf, as the output of the input layer would be) to every layer,
    the compressed ReLU between layers (PyG's layers and torch.relu with ``pyg=True``)."""
    torch.manual_seed(0)
    if pyg:
        convs = [torch_geometric.nn.GCN2Conv(MEM_F, 0.1, theta=0.5, layer=i + 1,
                                             shared_weights=shared) for i in range(LAYERS)]
    else:
        convs = [GCN2Conv(MEM_F, 0.1, theta=0.5, layer=i + 1, shared_weights=shared,
                          config=config) for i in range(LAYERS)]
    relu = torch.relu if pyg else ops.relu
    ei = _graph(0, MEM_N, 4 * MEM_N)
    x_0 = torch.randn(MEM_N, MEM_F, requires_grad=True)
    h = x_0
    for i, conv in enumerate(convs):
        h = conv(h, x_0, ei)
        if i < LAYERS - 1:
            h = relu(h)
    return convs, x_0, h.sum()  # SumBackward0 keeps only a size


@pytest.mark.parametrize("shared", [True, False])
def test_stack_saved_bytes(shared):
    config = Config(bits=BITS)
    _, x_0, loss = _stack(shared, config)
    nf = MEM_N * MEM_F
    packed = _packed_bytes(nf, BITS, config.group_size)
    assert packed == 25 * (128 + 8) == 3400  # 12800 values = 25 groups of 512 at 2 bits
    mask = math.ceil(nf / 8)  # one bit per value
    # Per layer: S (shared) or (1-α)ÂH (separate) packed; ReLU masks between layers; H⁰ packed
    # once for the whole stack with separate weights, not at all with shared ones. The SpMMs
    # keep only the graph (not a tensor of the autograd graph), the weights are leaves.
    expected = LAYERS * packed + (LAYERS - 1) * mask + (0 if shared else packed)
    assert expected == (18400 if shared else 21800)
    kept = breakdown(loss)
    assert kept.context == expected
    assert kept.graph_cache > 0  # the one normalised graph all layers share

    # With the leaves: the weights (kept by reference, as parameters) and nothing else; the
    # full-precision x_0 itself is never kept.
    weights = LAYERS * (1 if shared else 2) * MEM_F * MEM_F * 4
    assert breakdown(loss, include_leaves=True).context == expected + weights
    records = saved_tensors(loss, include_leaves=True)
    x0_key = ("cpu", None, x_0.untyped_storage().data_ptr())
    assert all(r.storage != x0_key for r in records)
    # No uncompressed N×F float tensor anywhere: floats are group scales/zeros or F×F weights.
    for r in records:
        if r.dtype.is_floating_point and r.kind == "context":
            assert r.shape in {(25,), (MEM_F, MEM_F)}, r
    codes = {r.storage for r in records if r.dtype == torch.uint8 and len(r.shape) == 2}
    assert len(codes) == LAYERS + (0 if shared else 1)


def test_stack_keeps_one_packed_x0():
    config = Config(bits=BITS)
    _, x_0, loss = _stack(False, config)
    # The cache hands back the packed copy the layers keep (as long as the graph holds it).
    packed_x0 = shared_quantize(x_0, BITS, config)
    key = ("cpu", None, packed_x0.codes.untyped_storage().data_ptr())
    hits = [r for r in saved_tensors(loss) if r.storage == key]
    assert len(hits) == LAYERS  # one reference per layer ...
    assert sum(r.first for r in hits) == 1  # ... to a single storage, counted once
    assert all(r.node == "_GCN2ResidualBackward" for r in hits)
    # Backward itself frees the copy (while `loss` is still referenced), and the next forward
    # pass draws fresh noise.
    ref = weakref.ref(packed_x0.codes)
    del packed_x0, hits
    loss.backward()
    assert ref() is None


def test_stack_exact_keeps_x0_once():
    # At 32 bits the layers keep x_0 itself, all by reference to the one tensor.
    _, x_0, loss = _stack(False, EXACT)
    x0_key = ("cpu", None, x_0.untyped_storage().data_ptr())
    hits = [r for r in saved_tensors(loss, include_leaves=True) if r.storage == x0_key]
    assert len(hits) == LAYERS and sum(r.first for r in hits) == 1


def test_memory_vs_pyg():
    # The same stack in PyG (float32, torch.relu) for scale: ≥ 10× more is kept.
    # The layers share one graph cache, as in a converted model (each stand-alone layer
    # would build its own); it is counted.
    config = Config(bits=BITS)
    with use_graph_cache(GraphCache()):
        _, _, loss = _stack(False, config)
    _, _, pyg_loss = _stack(False, None, pyg=True)
    assert breakdown(loss).graph_cache > 0
    assert saved_bytes(pyg_loss) >= 10 * saved_bytes(loss)


# ----------------------------------------------------------------------------- unbiasedness

U_N, U_F = 120, 24


class _TwoLayers:
    """A 2-layer GCNII at ``bits`` (float64); calling it gives the gradients (weights
    flattened, x, x_0) of <f(x, x_0), R> with the rounding noise drawn from ``seed``."""

    def __init__(self, bits: int, shared: bool) -> None:
        torch.manual_seed(0)
        config = Config(bits=bits, group_size=128)
        self.convs = [GCN2Conv(U_F, 0.2, theta=1.0, layer=i + 1, shared_weights=shared,
                               config=config).double() for i in range(2)]
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(U_N, U_F, generator=g, dtype=torch.float64, requires_grad=True)
        self.x_0 = torch.randn(U_N, U_F, generator=g, dtype=torch.float64, requires_grad=True)
        self.target = torch.randn(U_N, U_F, generator=g, dtype=torch.float64)
        self.ei = _graph(2, U_N, 5 * U_N)

    def __call__(self, seed: int) -> tuple[Tensor, Tensor, Tensor]:
        torch.manual_seed(seed)  # the seed of the stochastic rounding
        c1, c2 = self.convs
        out = c2(ops.relu(c1(self.x, self.x_0, self.ei)), self.x_0, self.ei)
        params = [p for c in self.convs for p in c.parameters()]
        grads = torch.autograd.grad((out * self.target).sum(), [self.x, self.x_0, *params])
        return torch.cat([gr.flatten() for gr in grads[2:]]), grads[0], grads[1]


@pytest.mark.parametrize("shared", [True, False])
def test_unbiased_weight_gradients(shared):
    exact, gx_exact, gx0_exact = _TwoLayers(32, shared)(0)
    model = _TwoLayers(BITS, shared)
    runs = 200
    samples = []
    for k in range(runs):
        gw, gx, gx0 = model(1000 + k)
        # Input gradients read only the weights and the exact 1-bit ReLU masks: no noise.
        assert torch.allclose(gx, gx_exact, rtol=1e-12, atol=1e-12)
        assert torch.allclose(gx0, gx0_exact, rtol=1e-12, atol=1e-12)
        samples.append(gw)
    samples = torch.stack(samples)
    mean = samples.mean(0)
    # Each ∇W = β X̂ᵀG is linear in the stochastically rounded X̂ with E[X̂] = X, so
    # E[∇W] = ∇W_exact. Then E‖mean − exact‖² = tr(Σ)/K (Σ: per-run covariance), estimated by
    # the per-coordinate sample variances. T = ‖mean − exact‖² / (tr(Σ̂)/K) has mean 1. Its
    # spread: rounding noise is independent per element of X̂, so the rows of each ∇W carry
    # independent noise (≥ 2 matrices × 24 rows), giving std(T) ≤ √(2/48) ≈ 0.2 at worst;
    # observed T is 0.99–1.04 over seeds, i.e. far more effective degrees of freedom. The
    # test is seeded, hence deterministic. A bias b adds K‖b‖²/tr(Σ̂) to T: a bias of 7% of
    # the per-run noise norm already adds ≈ 1 at K = 200 and fails T < 1.5.
    trace = samples.var(0, unbiased=True).sum()
    t_stat = float((mean - exact).pow(2).sum() / (trace / runs))
    assert t_stat < 1.5, t_stat
    # Averaging really averages: one run is off by ~√K times more than the mean of K runs
    # (observed ratio 0.97–1.04), which a bias would floor.
    single = float((samples[0] - exact).norm())
    assert float((mean - exact).norm()) < 2 * single / math.sqrt(runs)
    assert _rel(mean, exact) < 0.1 < _rel(samples[0], exact)  # observed 0.04 and 0.55


def test_error_shrinks_with_bits():
    exact = _TwoLayers(32, False)(0)[0]
    errors = {}
    for bits in (1, 2, 4, 8):
        model = _TwoLayers(bits, False)
        errors[bits] = sum(_rel(model(10 + s)[0], exact) for s in range(4)) / 4
    # The rounding step is R/(2^b − 1): each step in bits should cut the error by roughly
    # (2^b' − 1)/(2^b − 1) (3×, 5×, 17×); require clear decreases.
    assert errors[1] > 2 * errors[2] > 4 * errors[4] > 16 * errors[8] > 0, errors
