"""The planner's integer program (:mod:`gnnact.plan.milp`) against brute force."""

from __future__ import annotations

import itertools
import random

import pytest

from gnnact.plan import InfeasibleBudget, Option, solve


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
