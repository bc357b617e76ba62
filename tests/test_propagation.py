"""gnnact.nn.APPNP and SGConv: parity with PyG at 32 bits, nothing but the graph kept by the
propagation, PyG's path where the twin has none (edge dropout, static graphs), conversion."""

from __future__ import annotations

import copy

import pytest
import torch
import torch_geometric.nn as pyg_nn

import gnnact
from gnnact import Config
from gnnact.memory import breakdown

EXACT = Config(bits=32)
N, E, F_IN = 40, 200, 6


def _inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(N, F_IN, generator=gen, dtype=torch.float64, requires_grad=True)
    return x, torch.randint(0, N, (2, E), generator=gen)


def _parity(ours: torch.nn.Module, ref: torch.nn.Module, *inputs) -> None:
    x = inputs[0]
    out, expected = ours(*inputs), ref(*inputs)
    torch.testing.assert_close(out, expected, rtol=1e-9, atol=1e-11)
    g = torch.randn_like(out)
    params = [x, *ours.parameters()]
    got = torch.autograd.grad(out, params, g)
    want = torch.autograd.grad(expected, [x, *ref.parameters()], g)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kwargs", [{}, {"normalize": False}, {"add_self_loops": False},
                                    {"cached": True}])
def test_appnp_equals_pyg(kwargs):
    x, ei = _inputs()
    w = torch.rand(E, dtype=torch.float64)
    ref = pyg_nn.APPNP(K=5, alpha=0.2, **kwargs)
    ours = gnnact.nn.APPNP(K=5, alpha=0.2, config=EXACT, **kwargs)
    for _ in range(2):  # (cached: the second call reuses the first graph)
        _parity(ours, ref, x, ei)
        _parity(ours, ref, x, ei, w)


def test_appnp_keeps_only_the_graph_and_runs_pyg_with_edge_dropout():
    x, ei = _inputs()
    prop = gnnact.nn.APPNP(K=10, alpha=0.1, config=Config(bits=2))
    kept = breakdown(prop(x, ei).sum(), exclude=[x, ei])
    # No node features: only the two scalar factors PyTorch's multiplications keep per step.
    assert kept.context == 10 * 2 * x.element_size()
    assert kept.graph_cache > 0
    prop.dropout = 0.5  # dropout on the edge weights in every step: PyG's path
    torch.manual_seed(0)
    out = prop(x, ei)
    ref = pyg_nn.APPNP(K=10, alpha=0.1, dropout=0.5)
    torch.manual_seed(0)
    torch.testing.assert_close(out, ref(x, ei))


@pytest.mark.parametrize("K", [1, 3])
def test_sgconv_equals_pyg(K):
    x, ei = _inputs()
    torch.manual_seed(0)
    ref = pyg_nn.SGConv(F_IN, 4, K=K).double()
    ours = gnnact.nn.SGConv(F_IN, 4, K=K, config=EXACT).double()
    ours.load_state_dict(ref.state_dict())
    _parity(ours, ref, x, ei)


def test_sgconv_keeps_the_propagated_features_at_bits():
    x, ei = _inputs()
    conv = gnnact.nn.SGConv(F_IN, 4, K=2, config=Config(bits=2)).double()
    kept = breakdown(conv(x, ei).sum(), exclude=[x, ei])
    assert kept.context == 1 * (60 + 8)  # 240 values in one group: 60 code bytes + 8


def test_convert_swaps_appnp_and_sgconv_in_place():
    model = torch.nn.ModuleDict({"prop": pyg_nn.APPNP(3, 0.1), "sg": pyg_nn.SGConv(4, 2)})
    state = copy.deepcopy(model.state_dict())
    gnnact.convert(model)
    assert type(model["prop"]) is gnnact.nn.APPNP and type(model["sg"]) is gnnact.nn.SGConv
    assert model.state_dict().keys() == state.keys()
