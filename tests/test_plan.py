"""The planner's integer program (:mod:`gnnact.planner.milp`) against brute force."""

from __future__ import annotations

import itertools
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
    assert {r["option"] for r in plan.table()} == {"keep"} and plan.extra_s == 0
    hooks = plan.apply()
    assert torch.equal(_grads(model, x, loss_fn, hooks), expected)
    assert hooks.saved_bytes == plan.memory  # the estimate is the measured tally
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
    assert options - {"keep"} and "swap" not in options  # no swap on the CPU
    assert plan.memory <= budget and plan.extra_s > 0
    expected = _grads(model, x, loss_fn)
    hooks = plan.apply()
    got = _grads(model, x, loss_fn, hooks)
    assert hooks.saved_bytes <= plan.memory  # recomputed blocks' inputs may be shared
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
    assert gnnact.plan(model, (x,), smallest, loss_fn=loss_fn).memory <= smallest
    with pytest.raises(ValueError, match="budget_bytes"):
        gnnact.plan(model, (x,), -1)
    with pytest.raises(ValueError, match="blocks"):
        gnnact.plan(model, (x,), 10**9, blocks=["nope"])
    with pytest.raises(ValueError, match="swap"):
        gnnact.plan(model, (x,), 10**9, swap=True)
