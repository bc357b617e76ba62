"""Memory planning: per-block keep / recompute / compress / swap under a budget (Adacc)."""

from gnnact.planner.milp import InfeasibleBudget, Option, solve
from gnnact.planner.planner import BlockProfile, Plan, default_blocks, plan

__all__ = ["BlockProfile", "InfeasibleBudget", "Option", "Plan", "default_blocks", "plan",
           "solve"]
