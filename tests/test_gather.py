"""Rows gathered to edges (message passing's lift :math:`x_j = X[\\mathrm{index}]`) kept as their
source and index: :mod:`gnnact.compress.gather` with the generic pipeline."""

from __future__ import annotations

import copy

import pytest
import torch
from torch_geometric.nn import GENConv, TransformerConv

import gnnact
import gnnact.nn.functional as functional
from gnnact import compress_saved_tensors
from gnnact.compress import Policy, Quantize
from gnnact.compress.gather import (
    Gathered,
    gather_record,
    gather_source,
    mark_derived,
    mark_gathered,
)
from gnnact.memory import saved_bytes


def graph(nodes: int = 200, edges: int = 4000, features: int = 16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(nodes, features, generator=g),
            torch.randint(0, nodes, (2, edges), generator=g))


class Net(torch.nn.Module):
    def __init__(self, features: int = 16) -> None:
        super().__init__()
        self.conv1 = TransformerConv(features, 8, heads=2, beta=True)
        self.conv2 = TransformerConv(16, 4, heads=1)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def converted_context(model, x, edge_index) -> int:
    out = model(x, edge_index)
    return saved_bytes(out, exclude=[x, edge_index])


def test_converted_convs_keep_node_rows_not_edge_rows(monkeypatch):
    x, edge_index = graph()
    torch.manual_seed(0)
    base = Net()
    pyg = converted_context(base, x, edge_index)
    model = gnnact.convert(copy.deepcopy(base), gnnact.Config(bits=8))
    with_gathers = converted_context(model, x, edge_index)
    with monkeypatch.context() as patch:
        patch.setattr(functional, "mark_gathered", lambda *args: None)
        without = converted_context(model, x, edge_index)
    # Twenty edges a node: the lifted queries, keys and values were most of it (kept in
    # chunks of edges, many too small to quantize).
    assert with_gathers * 2 < without and with_gathers * 2 < pyg
    # The converted model still trains, its rounding measured as any other tensor's.
    model = gnnact.convert(copy.deepcopy(base))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(4):
        opt.zero_grad()
        loss = model(x, edge_index).square().mean()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
    auto = gnnact.nn.scope.scope_of(model).auto
    assert auto.tensors and all(t.measured is not None for t in auto.tensors.values()
                                if t.name.startswith("conv1:") and not t.fixed)


class SoftmaxNet(torch.nn.Module):
    def __init__(self, features: int = 16) -> None:
        super().__init__()
        self.conv = GENConv(features, features, aggr="softmax", learn_t=True)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


def test_a_temporary_source_lifted_to_edges_is_kept_as_node_rows(monkeypatch):
    """PyG's softmax over edges lifts its per-node sums to the edges
    (``out_sum.index_select(0, index)``) and divides by them: the sums, a temporary gone by
    the time the division's rows are saved, are kept as node rows all the same."""
    x, edge_index = graph()
    model = gnnact.convert(SoftmaxNet(), gnnact.Config(bits=8))
    with_gathers = converted_context(model, x, edge_index)
    with monkeypatch.context() as patch:
        patch.setattr(functional, "mark_gathered", lambda *args: None)
        without = converted_context(model, x, edge_index)
    # One byte a value at 8 bits: 4,000 edge rows of 16 values became 200 node rows (and the
    # index they are gathered by).
    assert without - with_gathers >= 0.75 * 4000 * 16


def _lift_and_multiply(src, index, weight, hooks):
    """``sum(src[index] * weight)`` under ``hooks``."""
    with hooks:
        out = src.index_select(0, index)
        mark_gathered(out, src, 0, index)
        return (out * weight).sum()


def _operands(seed: int, nodes: int, edges: int):
    """A source of ``nodes`` rows and a weight and random index of ``edges``, all seeded."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(nodes, 8, generator=g, requires_grad=True),
            torch.randn(edges, 8, generator=g, requires_grad=True),
            torch.randint(0, nodes, (edges,), generator=g))


def test_kept_exact_the_source_gives_pytorchs_gradient_bit_for_bit():
    src, weight, index = _operands(1, 50, 600)
    exact = compress_saved_tensors(policy=Policy([], default=None))
    loss = _lift_and_multiply(src.clone(), index, weight, exact)
    # The product saves both operands (the weight a leaf, not counted); the gathered one is
    # kept as 50 rows, not 600.
    assert saved_bytes(loss, exclude=[index]) == 50 * 8 * 4
    loss.backward()
    want_src, want_weight = src.grad.clone(), weight.grad.clone()
    src.grad = weight.grad = None
    loss = (src.index_select(0, index) * weight).sum()
    loss.backward()
    assert torch.equal(src.grad, want_src) and torch.equal(weight.grad, want_weight)


def test_rows_of_one_node_share_one_unbiased_rounding():
    g = torch.Generator().manual_seed(2)
    src = torch.randn(40, 32, generator=g)
    index = torch.randint(0, 40, (400,), generator=g)
    total = torch.zeros(400, 32)
    draws = 300
    for seed in range(draws):
        torch.manual_seed(seed)
        weight = torch.zeros(400, 32, requires_grad=True)
        hooks = compress_saved_tensors(policy=Policy([], default=Quantize(2, group_size=32)))
        loss = _lift_and_multiply(src, index, weight, hooks)
        loss.backward()  # weight.grad: the restored rows
        rows = weight.grad
        # Every edge from node 0 reads the same rounded row.
        from_first = rows[index == index[0]]
        assert torch.equal(from_first, from_first[:1].expand_as(from_first))
        total += rows
    want = src.index_select(0, index)
    # Unbiased: the mean of the draws within 5 standard errors of the exact rows; a 2-bit
    # step is range/3, its rounding variance at most step^2/4.
    step = (src.amax(1) - src.amin(1)).index_select(0, index)[:, None] / 3
    bound = 5 * (step / 2) / draws ** 0.5
    assert ((total / draws - want).abs() <= bound + 1e-6).float().mean() > 0.999


def test_a_selection_of_few_rows_is_kept_as_it_is():
    g = torch.Generator().manual_seed(3)
    src = torch.randn(100, 8, generator=g, requires_grad=True)
    weight = torch.randn(10, 8, generator=g, requires_grad=True)
    index = torch.arange(10)
    hooks = compress_saved_tensors(policy=Policy([], default=None))
    with hooks:
        source = src.clone()
        out = source.index_select(0, index)
        mark_gathered(out, source, 0, index)
        assert gather_source(out, None) is None  # 10 rows of 100, outside message passing
        loss = (out * weight).sum()
    assert saved_bytes(loss, exclude=[index]) == 10 * 8 * 4  # the rows (weight: a leaf)


def test_a_source_changed_in_place_is_not_read_again():
    base, weight, index = _operands(4, 30, 300)
    exact = compress_saved_tensors(policy=Policy([], default=None))
    with exact:
        src = base.clone()
        out = src.index_select(0, index)
        mark_gathered(out, src, 0, index)
        with torch.no_grad():
            src.mul_(2)  # after the gather: out holds the old rows
        assert gather_source(out, None) is None
        loss = (out * weight).sum()
    loss.backward()
    assert torch.equal(weight.grad, base.detach().index_select(0, index))


def test_gathered_reports_the_tensors_that_hold_it():
    src, index = torch.randn(4, 2), torch.arange(4)
    assert Gathered(src, index, 0).tensors() == (src, index)


_LIFTS = {"index_select": lambda h, index: h.index_select(0, index),
          "getitem": lambda h, index: h[index]}

#: Elementwise functions of gathered rows: gathered rows of their source's image too.
_ELEMENTWISE = {"rows": lambda r: r, "r + 1.5": lambda r: r + 1.5, "1.5 + r": lambda r: 1.5 + r,
                "r - 2": lambda r: r - 2.0, "r * 3": lambda r: r * 3.0,
                "3 * r": lambda r: 3.0 * r, "r / 4": lambda r: r / 4.0,
                "relu": lambda r: r.relu(),
                "leaky_relu": lambda r: torch.nn.functional.leaky_relu(r, 0.1)}


@pytest.mark.parametrize("fn", _ELEMENTWISE)
@pytest.mark.parametrize("lift", _LIFTS)
def test_functional_ops_mark_gathers_inside_a_converted_model(lift, fn):
    seen = []

    class Lift(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, index):
            out = _ELEMENTWISE[fn](_LIFTS[lift](self.lin(x), index))
            other = _LIFTS[lift](self.lin(x), index) + torch.ones(())  # (a tensor: not so)
            seen.append((out, gather_source(out, None), gather_source(other, None)))
            return (out * out).sum() + (other * other).sum()

    model = gnnact.convert(Lift(), gnnact.Config(bits=4))
    x, index = torch.randn(5, 4), torch.randint(0, 5, (20,))
    model(x, index).backward()
    out, (src, dim, kept), other = seen[0]
    assert other is None and dim == 0 and kept is index and src.shape == (5, 4)
    # The op's values bit for bit (ReLU's negative inputs give -0.0 there, as in the op).
    bits = src.index_select(dim, kept).view(torch.int32)
    assert torch.equal(bits, out.detach().view(torch.int32))


def test_a_gather_into_a_given_tensor_runs_as_pytorchs():
    class Copy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, index, buffer):
            h = self.lin(x)
            torch.index_select(h.detach(), 0, index, out=buffer)  # (out=: not differentiable)
            return h.square().sum()

    model = gnnact.convert(Copy(), gnnact.Config(bits=4))
    x, index, buffer = torch.randn(5, 4), torch.tensor([4, 0, 0]), torch.empty(3, 4)
    model(x, index, buffer).backward()
    assert torch.equal(buffer, model.lin(x).detach()[index])


class GENNet(torch.nn.Module):
    """DeeperGCN's conv: its messages are ``x_j.relu() + eps``, saved by the softmax
    aggregation's products (``x * t``, ``x * alpha``)."""

    def __init__(self, features: int = 16) -> None:
        super().__init__()
        self.conv = GENConv(features, features, aggr="softmax", t=1.0, learn_t=True)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


def test_messages_made_elementwise_of_gathered_rows_are_kept_as_node_rows(monkeypatch):
    x, edge_index = graph()
    torch.manual_seed(0)
    exact = gnnact.convert(GENNet(), gnnact.Config(bits=32))

    def step() -> tuple[int, list[torch.Tensor]]:
        xr = x.clone().requires_grad_()
        out = exact(xr, edge_index)
        kept = saved_bytes(out, exclude=[xr, edge_index])
        exact.zero_grad()
        out.square().sum().backward()
        return kept, [xr.grad, *(p.grad.clone() for p in exact.parameters())]

    kept, grads = step()
    with monkeypatch.context() as patch:
        patch.setattr(functional, "mark_derived", lambda *args: None)
        without, want = step()
    # relu(x_j) + eps, 4,000 edge rows of 16 float32 values, became relu(X) + eps, 200 node
    # rows, gathered again in backward: the same values, the same gradients bit for bit.
    assert without - kept >= (4000 - 200) * 16 * 4
    for a, b in zip(grads, want, strict=True):
        assert torch.equal(a, b)


def test_elementwise_functions_of_gathered_rows_are_gathered_from_their_source():
    src, index = torch.randn(6, 3), torch.tensor([5, 0, 0, 2, 4, 1, 1, 3])
    rows = src.index_select(0, index)
    mark_gathered(rows, src, 0, index)
    record = gather_record(rows)
    rows.relu_()  # in place: the record read before still says where the rows came from
    assert gather_record(rows) is None
    mark_derived(rows, record, torch.relu)
    out = rows * 2.0 + 0.5
    mark_derived(out, gather_record(rows), lambda s: s.relu() * 2.0 + 0.5)
    made, dim, kept = gather_source(out, None)
    assert made.shape == src.shape and kept is index
    assert torch.equal(made.index_select(dim, kept), out)
    assert gather_source(out, None)[0] is made  # made once
    # A source changed since: nothing to make it from.
    again = src.index_select(0, index)
    mark_gathered(again, src, 0, index)
    derived = again.relu()
    mark_derived(derived, gather_record(again), torch.relu)
    src.add_(1.0)
    assert gather_source(derived, None) is None
    # Fewer rows than the source (a block of a conv run in blocks): kept as they are, not
    # as a source made for each block.
    few = src.index_select(0, index[:3])
    mark_gathered(few, src, 0, index[:3])
    made = few.relu()
    mark_derived(made, gather_record(few), torch.relu)
    assert gather_record(made) is None
