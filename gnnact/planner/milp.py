r"""The planner's integer program: one option per layer, least time within a memory budget.

Each layer :math:`i` has options :math:`o` (keep, recompute, compress at some bits, swap), each
with the device memory :math:`m_{io}` it leaves held for backward and the time :math:`t_{io}` it
adds to a step. With binary :math:`x_{io}`,

.. math::
    \min \sum_{i,o} t_{io} x_{io} \quad \text{s.t.} \quad \sum_o x_{io} = 1 \ \forall i,
    \qquad \sum_{i,o} m_{io} x_{io} \le B,

solved exactly with :func:`scipy.optimize.milp` (HiGHS branch and bound). A budget below
:math:`\sum_i \min_o m_{io}` is infeasible: :class:`InfeasibleBudget` names that smallest
feasible budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp

__all__ = ["InfeasibleBudget", "Option", "solve"]


@dataclass(frozen=True)
class Option:
    """One way to treat a layer's saved context: its name, the bytes it leaves held on the
    device until backward, and the seconds it adds to a training step."""

    name: str
    memory: float
    time: float


class InfeasibleBudget(ValueError):
    """No choice of options fits the budget; :attr:`smallest` is the least budget that does."""

    def __init__(self, budget: float, smallest: float) -> None:
        super().__init__(f"budget_bytes={budget:,.0f} is below the smallest feasible budget "
                         f"{smallest:,.0f} bytes (every layer at its leanest option)")
        self.budget = budget
        self.smallest = smallest


def solve(options: Sequence[Sequence[Option]], budget: float) -> list[int]:
    """The index of the chosen option of each layer: least total time with total memory at
    most ``budget``. Among equally fast plans any may be returned.

    Raises:
        InfeasibleBudget: when even the leanest options exceed ``budget``.
        ValueError: when a layer has no option.
    """
    for i, layer in enumerate(options):
        if not layer:
            raise ValueError(f"options[{i}] is empty: every layer needs at least one option")
    smallest = float(sum(min(o.memory for o in layer) for layer in options))
    if smallest > budget:
        raise InfeasibleBudget(budget, smallest)
    if not options:
        return []
    sizes = [len(layer) for layer in options]
    n = sum(sizes)
    memory = np.array([o.memory for layer in options for o in layer], dtype=float)
    time = np.array([o.time for layer in options for o in layer], dtype=float)
    one_each = np.zeros((len(options), n))
    start = 0
    for i, size in enumerate(sizes):
        one_each[i, start:start + size] = 1.0
        start += size
    # Scale memory to O(1) so HiGHS's feasibility tolerance means the same at any byte count.
    scale = max(float(memory.max()), 1.0)
    constraints = [LinearConstraint(one_each, 1.0, 1.0),
                   LinearConstraint(memory[None, :] / scale, -np.inf, budget / scale)]
    result = milp(time, constraints=constraints, integrality=np.ones(n),
                  bounds=Bounds(0.0, 1.0))
    if not result.success:  # cannot happen for a feasible budget; say so loudly if it does
        raise RuntimeError(f"the MILP solver failed: {result.message}")
    x = np.round(result.x).astype(int)
    chosen, start = [], 0
    for size in sizes:
        chosen.append(int(np.argmax(x[start:start + size])))
        start += size
    # HiGHS works to a feasibility tolerance; on the scaled row that is far below one byte,
    # but check the rounded plan against the budget in exact arithmetic all the same.
    used = sum(options[i][c].memory for i, c in enumerate(chosen))
    if used > budget:
        raise RuntimeError(f"the MILP solution uses {used} bytes > budget {budget}")
    return chosen
