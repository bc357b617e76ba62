"""Double backward (``create_graph=True``, then differentiating the gradient again): every
compressed op either gives PyG's / PyTorch's second-order gradients or refuses with one clear
error naming it, at every width; never a silently different number (issue 21).

Refused: the ops whose backward reads compressed context (linear, BatchNorm, ELU, GAT and
GATv2 attention, GCNII's residual map, aggregation with learnable edge values). Exact: the mask
ops (ReLU, LeakyReLU, dropout: linear in the gradient, with an exact mask) and aggregation with
fixed edge values (:math:`A^\\top G`), hence APPNP. The generic saved-tensor pipeline keeps
every second-order path (autograd re-attaches the history of a restored tensor).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor, nn

import gnnact
from gnnact import Config, ops
from gnnact.ops.gatv2 import gatv2_attention
from gnnact.ops.graph import Graph
from gnnact.ops.higher_order import first_order_only

N, F_IN = 10, 4
EDGES = torch.randint(0, N, (2, 36), generator=torch.Generator().manual_seed(0))
REFUSED = "does not support double backward (create_graph=True)"
BITS = [32, 2]
Result = list[Tensor] | RuntimeError


def features(rows: int = N, cols: int = F_IN, seed: int = 1) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=gen, dtype=torch.float64).requires_grad_()


class OnGraph(nn.Module):
    """A conv applied to the fixed test graph, so that every case is ``module(x)``."""

    def __init__(self, conv: nn.Module, initial: bool = False) -> None:
        super().__init__()
        self.conv, self.initial = conv, initial

    def forward(self, x: Tensor) -> Tensor:
        if self.initial:  # GCN2Conv(x, x_0, edge_index)
            return self.conv(x, x, EDGES)
        return self.conv(x, EDGES)


class FunctionalMLP(nn.Module):
    """Functional calls between linear maps, as users write them."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(F_IN, 8), nn.Linear(8, 3)

    def forward(self, x: Tensor) -> Tensor:
        h = F.dropout(F.relu(self.lin1(x)), 0.5, training=self.training)
        return self.lin2(F.elu(h))


class Functional(nn.Module):
    """One functional activation on ``tanh(x)`` (curved, so the second order reaches it)."""

    def __init__(self, act: str) -> None:
        super().__init__()
        self.act = act

    def forward(self, x: Tensor) -> Tensor:
        h = torch.tanh(x)
        if self.act == "relu":
            return F.relu(h)
        if self.act == "leaky_relu":
            return F.leaky_relu(h, 0.1)
        if self.act == "dropout":
            return F.dropout(h, 0.5, training=self.training)
        return F.elu(h)


LAYERS: dict[str, Callable[[], nn.Module]] = {
    "GCNConv": lambda: OnGraph(pyg_nn.GCNConv(F_IN, 3)),
    "SAGEConv": lambda: OnGraph(pyg_nn.SAGEConv(F_IN, 3)),
    "GATConv": lambda: OnGraph(pyg_nn.GATConv(F_IN, 3, heads=2)),
    "GATv2Conv": lambda: OnGraph(pyg_nn.GATv2Conv(F_IN, 3, heads=2)),
    "GCN2Conv": lambda: OnGraph(pyg_nn.GCN2Conv(F_IN, alpha=0.2, theta=0.5, layer=1), True),
    "GCN2Conv-separate": lambda: OnGraph(pyg_nn.GCN2Conv(F_IN, alpha=0.2, theta=0.5, layer=1,
                                                         shared_weights=False), True),
    "APPNP": lambda: OnGraph(pyg_nn.APPNP(K=3, alpha=0.1)),
    "SGConv": lambda: OnGraph(pyg_nn.SGConv(F_IN, 3, K=2)),
    "Linear": lambda: nn.Linear(F_IN, 3),
    "BatchNorm1d": lambda: nn.BatchNorm1d(F_IN),
    "ReLU": nn.ReLU,
    "LeakyReLU": lambda: nn.LeakyReLU(0.1),
    "Dropout": lambda: nn.Dropout(0.5),
    "functional-mlp": FunctionalMLP,
    "functional-relu": lambda: Functional("relu"),
    "functional-leaky_relu": lambda: Functional("leaky_relu"),
    "functional-dropout": lambda: Functional("dropout"),
    "functional-elu": lambda: Functional("elu"),
}
#: Exact at every width: their backward reads nothing compressed.
EXACT = {"APPNP", "ReLU", "LeakyReLU", "Dropout", "functional-relu", "functional-leaky_relu",
         "functional-dropout"}


def second_order(module: nn.Module, objective: str, seed: int = 0) -> Result:
    """``d/d(x, params) |d loss / dx|^2`` (``None`` as zeros), or the error raised."""
    x = features()
    torch.manual_seed(seed)  # the same dropout masks on both sides
    try:
        out = module(x)
        loss = out.sum() if objective == "sum" else out.pow(2).sum()
        (g,) = torch.autograd.grad(loss, x, create_graph=True)
        g.pow(2).sum().backward()
    except RuntimeError as error:
        return error
    return [torch.zeros_like(t) if t.grad is None else t.grad for t in [x, *module.parameters()]]


def assert_not_silent(ours: Result, ref: Result) -> str:
    """Ours equals the reference, or is the clear refusal, or the reference's own error."""
    if isinstance(ours, RuntimeError):
        message = str(ours)
        if isinstance(ref, RuntimeError) and message == str(ref):
            return "same error"  # (a linear map: PyTorch's gradient has no graph either)
        assert REFUSED in message and message.startswith("gnnact's "), message
        return "refused"
    if isinstance(ref, RuntimeError):
        # PyTorch's gradient is a constant (dropout's): it has no graph to differentiate,
        # while gnnact's (shared with ReLU, whose PyTorch gradient has one) differentiates to
        # zeros. The same answer: nothing depends on the inputs.
        assert "does not require grad" in str(ref), ref
        assert all(not t.any() for t in ours), "PyTorch's gradient is constant, gnnact's not"
        return "equal"
    assert len(ours) == len(ref)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)
    return "equal"


@pytest.mark.parametrize("objective", ["sum", "square"])
@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("name", list(LAYERS))
def test_twin_double_backward_is_exact_or_refused(name: str, bits: int, objective: str):
    torch.manual_seed(0)
    ref = LAYERS[name]().double()
    twin = gnnact.convert(copy.deepcopy(ref), Config(bits=bits))
    converted = [m for m in twin.modules() if type(m).__module__.startswith("gnnact")]
    assert converted or name.startswith("functional"), "nothing was converted"
    outcome = assert_not_silent(second_order(twin, objective), second_order(ref, objective))
    if name in EXACT:
        assert outcome in ("equal", "same error"), outcome
    else:
        assert outcome == "refused", outcome


def test_functional_calls_run_gnnact_ops():
    """(The functional cases above do test gnnact's ops: the converted model dispatches them.)"""
    twin = gnnact.convert(Functional("relu"), Config(bits=2))
    out = twin(features())
    assert type(out.grad_fn).__name__ != "ReluBackward0"


# ----------------------------------------------------------------------------- single ops


def _graph() -> Graph:
    return Graph.from_coo(EDGES[0], EDGES[1], N, N)


def _gat(x: Tensor, config: Config) -> Tensor:
    gen = torch.Generator().manual_seed(2)
    xs = x.view(N, 2, 2)
    att = [torch.randn(1, 2, 2, generator=gen, dtype=x.dtype).requires_grad_() for _ in "sd"]
    return ops.gat_attention(xs, xs, att[0], att[1], _graph(), config=config)


def _gatv2(x: Tensor, config: Config) -> Tensor:
    att = torch.randn(1, 2, 2, generator=torch.Generator().manual_seed(2), dtype=x.dtype)
    xl = x.view(N, 2, 2)
    return gatv2_attention(xl, xl, att.requires_grad_(), _graph(), config=config)


def _gcn2(x: Tensor, config: Config) -> Tensor:
    w = torch.randn(F_IN, F_IN, dtype=x.dtype, generator=torch.Generator().manual_seed(2))
    return ops.gcn2_residual(x, x, w.requires_grad_(), alpha=0.2, beta=0.5, config=config)


def _linear(x: Tensor, config: Config) -> Tensor:
    w = torch.randn(3, F_IN, dtype=x.dtype, generator=torch.Generator().manual_seed(2))
    return ops.linear(x, w.requires_grad_(), config=config)


def _spmm_learnable(x: Tensor, config: Config) -> Tensor:
    graph = _graph()
    value = torch.rand(graph.num_edges, dtype=x.dtype).requires_grad_()
    return ops.spmm(x, graph, value, config=config)


OPS: dict[str, tuple[Callable[[Tensor, Config], Tensor], str]] = {
    "linear": (_linear, "linear map (gnnact.ops.linear)"),
    "batch_norm": (lambda x, c: ops.batch_norm(x, None, None, training=True, config=c),
                   "BatchNorm (gnnact.ops.batch_norm)"),
    "elu": (lambda x, c: ops.elu(x, config=c), "ELU (gnnact.ops.elu)"),
    "gat_attention": (_gat, "GAT attention"),
    "gatv2_attention": (_gatv2, "GATv2 attention"),
    "gcn2_residual": (_gcn2, "GCNII initial-residual map"),
    "spmm-learnable": (_spmm_learnable, "sparse aggregation (gnnact.ops.spmm)"),
}


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("name", list(OPS))
def test_op_refuses_naming_itself_and_keeps_its_first_order(name: str, bits: int):
    fn, op = OPS[name]
    config = Config(bits=bits)
    x = features()
    torch.manual_seed(0)
    plain = torch.autograd.grad(fn(x, config).pow(2).sum(), x)[0]
    torch.manual_seed(0)
    # create_graph=True itself works (nothing is refused until a gradient is differentiated),
    # with the same first-order gradient as without it.
    (g,) = torch.autograd.grad(fn(x, config).pow(2).sum(), x, create_graph=True)
    if bits == 32:
        torch.testing.assert_close(g.detach(), plain, rtol=0, atol=0)
    assert g.requires_grad  # even with a constant incoming gradient: never silently constant
    with pytest.raises(RuntimeError, match=r"^gnnact's .*does not support double backward") as e:
        g.pow(2).sum().backward()
    assert op in str(e.value)
    # A constant incoming gradient (out.sum()): still refused, not silently missing terms.
    (g,) = torch.autograd.grad(fn(x, config).sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match=REFUSED.replace("(", r"\(").replace(")", r"\)")):
        g.pow(2).sum().backward()


@pytest.mark.parametrize("bits", BITS)
@pytest.mark.parametrize("reduce", ["sum", "mean"])
def test_spmm_with_fixed_values_is_exact(bits: int, reduce: str):
    graph = _graph()
    value = torch.rand(graph.num_edges, dtype=torch.float64)
    dense = graph.matrix(value, torch.float64).to_dense()
    if reduce == "mean":
        degree = torch.bincount(EDGES[1], minlength=N).clamp_min(1)  # edges, duplicates too
        dense = dense / degree[:, None]

    def run(spmm: Callable[[Tensor], Tensor]) -> Tensor:
        x = features()
        (g,) = torch.autograd.grad(torch.tanh(spmm(x)).pow(2).sum(), x, create_graph=True)
        g.pow(2).sum().backward()
        return x.grad

    got = run(lambda x: ops.spmm(x, graph, value, reduce=reduce, config=Config(bits=bits)))
    torch.testing.assert_close(got, run(lambda x: dense @ x), rtol=1e-9, atol=1e-11)


def test_first_order_only_helper():
    calls = []

    class Cube(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: Tensor) -> Tensor:
            ctx.save_for_backward(x)
            return x ** 3

        @staticmethod
        @first_order_only("cube")
        def backward(ctx, grad: Tensor) -> Tensor:
            calls.append(torch.is_grad_enabled())  # computed without recording, always
            (x,) = ctx.saved_tensors
            return 3 * x * x * grad

    x = features()
    (g,) = torch.autograd.grad(Cube.apply(x).sum(), x)
    assert not g.requires_grad
    (h,) = torch.autograd.grad(Cube.apply(x).sum(), x, create_graph=True)
    torch.testing.assert_close(h.detach(), g, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="^gnnact's cube does not support double backward"):
        h.sum().backward()
    assert calls == [False, False]


# ----------------------------------------------------------------------------- generic pipeline


def _mlp_second_order(model: nn.Module, x: Tensor, hooks: gnnact.compress_saved_tensors | None
                      ) -> list[Tensor]:
    for t in [x, *model.parameters()]:
        t.grad = None
    if hooks is None:
        loss = model(x).pow(2).sum()
    else:
        with hooks:
            loss = model(x).pow(2).sum()
    (g,) = torch.autograd.grad(loss, x, create_graph=True)
    g.pow(2).sum().backward()
    return [x.grad, *(p.grad for p in model.parameters())]


@pytest.mark.parametrize("bits", [32, 8])
def test_compress_saved_tensors_keeps_every_second_order_path(bits: int):
    """The unpack hook's restored tensor gets the saved tensor's history back from autograd,
    so no second-order term is lost: exact at 32 bits, and off by about the rounding error
    (not by a missing term) at 8."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 8), nn.Softplus())
    model = model.double()
    x = torch.randn(64, 32, dtype=torch.float64, requires_grad=True)
    want = _mlp_second_order(model, x, None)
    hooks = gnnact.compress_saved_tensors(Config(bits=bits), model=model, min_numel=1)
    got = _mlp_second_order(model, x, hooks)
    assert hooks.num_packed == (0 if bits == 32 else 2)
    tol = 0.0 if bits == 32 else 0.05
    for a, b in zip(got, want, strict=True):
        assert float((a - b).norm() / b.norm()) <= tol
