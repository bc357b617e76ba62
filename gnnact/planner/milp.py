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
    device until backward, and the seconds it adds to a training step.

    Args:
        name (str): ``"keep"``, ``"compress<b>"`` (*e.g.* ``"compress4"``), ``"recompute"`` or
            ``"swap"`` in the plans of :func:`gnnact.plan`; any name for :func:`solve`.
        memory (float): :math:`m_{io}`, bytes held on the device until backward.
        time (float): :math:`t_{io}`, seconds added to a training step.

    Example:
        >>> from gnnact.planner import Option
        >>> Option("compress4", memory=132_000, time=0.002)
        Option(name='compress4', memory=132000, time=0.002)
    """

    name: str
    memory: float
    time: float


class InfeasibleBudget(ValueError):
    r"""No choice of options fits the budget; :attr:`smallest` is the least budget that does.

    Raised by :func:`solve` and :func:`gnnact.plan` when the budget is below
    :math:`\sum_i \min_o m_{io}` (every layer at its leanest option); by :func:`gnnact.plan`
    when the budget is below the saved context of its leanest plan, measured on the example
    inputs. A subclass of :class:`ValueError`.

    Args:
        budget (float): the budget asked for, in bytes (:attr:`budget`).
        smallest (float): the smallest feasible budget, in bytes (:attr:`smallest`).

    Example:
        >>> from gnnact.planner import InfeasibleBudget, Option, solve
        >>> options = [[Option("keep", 100, 0.0), Option("compress2", 30, 1.0)]]
        >>> try:
        ...     solve(options, budget=20)
        ... except InfeasibleBudget as error:
        ...     print(error.smallest)
        30.0
    """

    def __init__(self, budget: float, smallest: float) -> None:
        super().__init__(f"budget_bytes={budget:,.0f} is below the smallest feasible budget "
                         f"{smallest:,.0f} bytes (every layer at its leanest option)")
        self.budget = budget
        self.smallest = smallest


def solve(options: Sequence[Sequence[Option]], budget: float) -> list[int]:
    r"""The index of the chosen option of each layer: least total time with total memory at
    most ``budget``. Among equally fast plans any may be returned.

    Solves the integer program of the module docstring exactly:

    .. math::
        \min \sum_{i,o} t_{io} x_{io} \quad \text{s.t.} \quad \sum_o x_{io} = 1 \
        \forall i, \qquad \sum_{i,o} m_{io} x_{io} \le B, \qquad x_{io} \in \{0, 1\}.

    Args:
        options (Sequence[Sequence[Option]]): per layer :math:`i`, its options :math:`o`.
        budget (float): :math:`B`, the bytes the chosen options may hold in total.

    Returns:
        list[int]: per layer, the index of its chosen option in ``options[i]``.

    Raises:
        InfeasibleBudget: when even the leanest options exceed ``budget``.
        ValueError: when a layer has no option.

    Example:
        >>> from gnnact.planner import Option, solve
        >>> options = [[Option("keep", 100, 0.0), Option("compress2", 30, 1.0)],
        ...            [Option("keep", 50, 0.0), Option("recompute", 20, 2.0)]]
        >>> solve(options, budget=150)  # everything fits
        [0, 0]
        >>> solve(options, budget=130)  # compressing the first layer is the fastest fix
        [1, 0]
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
