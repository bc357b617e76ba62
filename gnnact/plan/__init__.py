"""Memory planning: per-layer keep / recompute / compress / swap under a budget (Adacc)."""

from gnnact.plan.milp import InfeasibleBudget, Option, solve

__all__ = ["InfeasibleBudget", "Option", "solve"]
