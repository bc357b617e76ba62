"""The planner's integer program (:mod:`gnnact.planner.milp`) against brute force."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from gnnact.planner import InfeasibleBudget, Option, solve


def brute_force(options, budget):
    best = None
    for choice in itertools.product(*(range(len(layer)) for layer in options)):
        memory = sum(options[i][c].memory for i, c in enumerate(choice))
        time = sum(options[i][c].time for i, c in enumerate(choice))
        if memory <= budget and (best is None or time < best):
            best = time
    return best


def random_layer(rng):
    size = rng.uniform(1e6, 5e7)  # bytes kept as is
    compute = rng.uniform(1e-4, 5e-3)  # seconds of the layer's forward
    options = [Option("keep", size, 0.0), Option("recompute", 0.1 * size, compute)]
    for bits in (8, 4, 2):
        options.append(Option(f"compress{bits}", size * (bits + 0.125) / 32,
                              rng.uniform(0.5, 1.5) * size / 4e11))
    options.append(Option("swap", 0.0, rng.uniform(0.0, 2.0) * size / 2.5e10))
    return options


@pytest.mark.parametrize("seed", range(12))
def test_exact_optimum_within_budget(seed):
    rng = random.Random(seed)
    options = [random_layer(rng) for _ in range(rng.randint(1, 5))]
    total = sum(layer[0].memory for layer in options)
    budget = rng.uniform(0.05, 1.1) * total
    chosen = solve(options, budget)
    memory = sum(options[i][c].memory for i, c in enumerate(chosen))
    time = sum(options[i][c].time for i, c in enumerate(chosen))
    assert memory <= budget
    assert time == pytest.approx(brute_force(options, budget), rel=1e-9, abs=1e-12)


def test_enough_memory_keeps_everything():
    rng = random.Random(0)
    options = [random_layer(rng) for _ in range(6)]
    budget = sum(layer[0].memory for layer in options)
    assert solve(options, budget) == [0] * 6


def test_infeasible_budget_names_the_smallest_feasible_one():
    options = [[Option("keep", 100, 0), Option("compress", 30, 1)],
               [Option("keep", 50, 0), Option("recompute", 20, 2)]]
    with pytest.raises(InfeasibleBudget, match="smallest feasible budget 50 bytes") as info:
        solve(options, 49)
    assert info.value.smallest == 50
    assert solve(options, 50) == [1, 1]
    with pytest.raises(ValueError, match=r"options\[1\] is empty"):
        solve([[Option("keep", 1, 0)], []], 10)


# ---------------------------------------------------------------------- gnnact.plan


def _resnet():
    import torch
    from models_generic import ResNet18

    torch.manual_seed(0)
    return ResNet18(width=8), torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))


def _grads(model, x, loss_fn, hooks=None):
    import torch

    model.zero_grad()
    if hooks is None:
        loss = loss_fn(model(x))
    else:
        with hooks:
            loss = loss_fn(model(x))
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def test_default_blocks():
    from models_generic import Transformer

    from gnnact.models import build
    from gnnact.planner import default_blocks

    model, _, _ = _resnet()
    assert default_blocks(model) == ["stem.0", "stem.1", *(f"layers.{i}" for i in range(8))]
    assert default_blocks(Transformer()) == ["blocks.0", "blocks.1"]
    assert default_blocks(build("gcn", 16, 4)) == ["convs.0", "convs.1", "convs.2", "bns.0",
                                                    "bns.1"]


def test_plan_keeps_everything_when_memory_suffices():
    import torch
    import torch.nn.functional as F

    import gnnact

    model, x, y = _resnet()
    loss_fn = lambda out: F.cross_entropy(out, y)  # noqa: E731
    expected = _grads(model, x, loss_fn)
    plan = gnnact.plan(model, (x,), 10**9, loss_fn=loss_fn)
    # (the ReLU modules between the blocks keep 1-bit masks: exact)
    assert {r["option"] for r in plan.table()} == {"keep", "mask"} and plan.extra_s == 0
    hooks = plan.apply()
    assert torch.equal(_grads(model, x, loss_fn, hooks), expected)
    # The estimate is the measured context, but for the block outputs the next block's
    # shortcut saves too: charged to both blocks (stored once when both keep them), it errs high.
    assert plan.measured <= plan.memory <= 1.1 * plan.measured
    assert "keep" in plan.summary()


@pytest.mark.parametrize("fraction", [0.35, 0.17])
def test_plan_fits_a_tight_budget(fraction):
    import torch
    import torch.nn.functional as F

    import gnnact

    model, x, y = _resnet()
    loss_fn = lambda out: F.cross_entropy(out, y)  # noqa: E731
    full = gnnact.plan(model, (x,), 10**9, loss_fn=loss_fn).memory
    budget = int(fraction * full)
    plan = gnnact.plan(model, (x,), budget, loss_fn=loss_fn)
    options = {r["option"] for r in plan.table()}
    assert options - {"keep", "mask"} and "swap" not in options  # no swap on the CPU
    assert plan.measured <= budget and plan.extra_s > 0
    expected = _grads(model, x, loss_fn)
    hooks = plan.apply()
    got = _grads(model, x, loss_fn, hooks)
    assert ((got - expected).norm() / expected.norm()).item() < 1.0
    recomputed = [r["block"] for r in plan.table() if r["option"] == "recompute"]
    plan.remove()
    modules = dict(model.named_modules())
    assert all("forward" not in vars(modules[name]) for name in recomputed)
    assert torch.equal(_grads(model, x, loss_fn), expected)


def test_plan_infeasible_budget_and_bad_arguments():
    import torch.nn.functional as F

    import gnnact

    model, x, y = _resnet()
    loss_fn = lambda out: F.cross_entropy(out, y)  # noqa: E731
    with pytest.raises(InfeasibleBudget) as info:
        gnnact.plan(model, (x,), 1000, loss_fn=loss_fn)
    smallest = info.value.smallest
    assert f"{smallest:,.0f}" in str(info.value)
    assert gnnact.plan(model, (x,), smallest, loss_fn=loss_fn).measured <= smallest
    with pytest.raises(ValueError, match="budget_bytes"):
        gnnact.plan(model, (x,), -1)
    with pytest.raises(ValueError, match="blocks"):
        gnnact.plan(model, (x,), 10**9, blocks=["nope"])
    with pytest.raises(ValueError, match="swap"):
        gnnact.plan(model, (x,), 10**9, swap=True)


# ------------------------------------------------- GNNs: measured context within the budget


def _gnn(name, style="module"):
    import torch

    from gnnact.data import synthetic_graph
    from gnnact.models import build

    data = synthetic_graph(300, 6, 16, 4, seed=0)
    torch.manual_seed(0)
    hidden = 8 if name == "gat" else 32
    model = build(name, 16, 4, hidden=hidden, heads=2, style=style).train()
    return model, data


def _loss_fn(data):
    import torch.nn.functional as F

    return lambda out: F.cross_entropy(out[data.train_mask], data.y[data.train_mask])


def _fp32_context(model, data):
    """What plain PyTorch keeps for backward: the 100 % of the budget sweeps."""
    from gnnact.memory import saved_bytes

    loss = _loss_fn(data)(model(data.x, data.edge_index))
    return saved_bytes(loss, exclude=[data.x, data.edge_index])


# The stated tolerance of the estimate: within 1 % of the measured context, or 1 KiB (the
# BatchNorm buffers a recomputed block stops saving; on big graphs the percentage rules).
ESTIMATE_TOLERANCE = (0.01, 1024)


@pytest.fixture
def timings_from_sizes(monkeypatch):
    """Times from sizes, not clocks, so that the options a sweep reaches do not depend on the
    machine's load: compressing costs 1 ns per value, a block's forward 4 ns per value it
    saves (the profiling passes still run)."""
    from gnnact.planner import planner

    def values(shapes) -> int:
        return sum(math.prod(shape) for shape in shapes)

    profile_times = planner._profile_times

    def sized_profile(model, run, blocks, profiles, device, repeats) -> None:
        profile_times(model, run, blocks, profiles, device, repeats)
        for name in blocks:
            profiles[name].forward_s = 4e-9 * values(profiles[name].shapes)

    monkeypatch.setattr(planner, "_profile_times", sized_profile)
    monkeypatch.setattr(planner, "_compress_time",
                        lambda shapes, bits, device, cache: 1e-9 * values(shapes))


@pytest.mark.parametrize("name,style", [("gcn", "module"), ("sage", "module"),
                                        ("gat", "module"), ("gcn", "functional")])
def test_measured_context_never_exceeds_the_budget(name, style, timings_from_sizes):
    import torch

    import gnnact
    from gnnact.memory import saved_bytes

    model, data = _gnn(name, style)
    x, ei = data.x, data.edge_index
    loss_fn = _loss_fn(data)
    full = _fp32_context(model, data)
    seen = set()
    for fraction in (1.0, 0.5, 0.3, 0.2, 0.15, 0.1, 0.07):
        budget = int(fraction * full)
        plan = gnnact.plan(model, (x, ei), budget, loss_fn=loss_fn)
        assert plan.measured <= budget, (fraction, plan.summary())
        seen |= {r["option"] for r in plan.table()}
        # Measured again, in a training step: the same bytes, within the budget.
        hooks = plan.apply()
        with hooks:
            loss = loss_fn(model(x, ei))
        measured = plan.saved_bytes(loss, hooks)
        assert measured == plan.measured <= budget
        assert saved_bytes(loss, exclude=[x, ei]) <= measured  # the graph walk's part
        rel, absolute = ESTIMATE_TOLERANCE
        assert abs(plan.memory - measured) <= max(rel * measured, absolute), plan.summary()
        loss.backward()
        plan.remove()
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and torch.isfinite(g).all() for g in grads)
        model.zero_grad()
    # The sweep reaches recompute and compress, and the ReLU/dropout calls between the blocks
    # keep masks: 7 % of fp32 fits (planning the blocks alone left a third).
    assert "mask" in seen and any(o.startswith("recompute") for o in seen), seen
    assert any(o.startswith("compress") for o in seen), seen


def test_context_between_the_blocks_is_planned(timings_from_sizes):
    import torch
    import torch.nn.functional as F
    import torch_geometric.nn as pyg_nn

    import gnnact

    class Net(torch.nn.Module):  # PyG-example style: functional calls between the convs
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = pyg_nn.GCNConv(16, 64), pyg_nn.GCNConv(64, 4)

        def forward(self, x, edge_index):
            x = F.dropout(x, p=0.5, training=self.training)
            h = self.conv1(x, edge_index)
            x = torch.tanh(h) + F.relu(h)  # tanh keeps its output: planned as a tensor
            x = F.dropout(x, p=0.5, training=self.training)
            return self.conv2(x, edge_index)

    _, data = _gnn("gcn")
    x, ei, loss_fn = data.x, data.edge_index, _loss_fn(data)
    model = Net().train()
    full = gnnact.plan(model, (x, ei), 10**9, loss_fn=loss_fn)
    tensors = [b for b in full.blocks if b.kind == "tensor"]
    assert [b.name for b in tensors] == [":0"]  # tanh's output, saved in the model's forward
    assert tensors[0].saved == 300 * 64 * 4
    masks = {r["block"]: r for r in full.table() if r["option"] == "mask"}
    # F.relu and the second F.dropout on [300, 64], 1 bit each (the first: no gradient)
    assert masks["<model>"]["memory"] == 2 * 300 * 64 // 8
    assert full.measured == full.memory
    lean = gnnact.plan(model, (x, ei), full.memory // 4, loss_fn=loss_fn)
    assert lean.choice[":0"].name.startswith("compress")
    assert lean.measured <= full.memory // 4


def test_infeasible_budget_names_the_smallest_achievable():
    import gnnact

    model, data = _gnn("gcn", "functional")
    x, ei, loss_fn = data.x, data.edge_index, _loss_fn(data)
    full = _fp32_context(model, data)
    with pytest.raises(InfeasibleBudget) as info:
        gnnact.plan(model, (x, ei), full // 100, loss_fn=loss_fn)
    smallest = info.value.smallest
    assert f"budget_bytes={full // 100:,d}" in str(info.value)
    assert f"{smallest:,.0f}" in str(info.value)
    # Well below the third of fp32 that planning the blocks alone reached.
    assert full // 100 < smallest < 0.15 * full
    plan = gnnact.plan(model, (x, ei), int(smallest), loss_fn=loss_fn)
    assert plan.measured <= smallest


def test_planning_leaves_the_model_and_random_streams_as_they_were():
    import torch

    import gnnact

    model, data = _gnn("gcn")
    stats = {k: v.clone() for k, v in model.named_buffers()}
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    gnnact.plan(model, (data.x, data.edge_index), 10**9, loss_fn=_loss_fn(data))
    assert torch.equal(torch.rand(3), expected)
    assert all(torch.equal(v, stats[k]) for k, v in model.named_buffers())
