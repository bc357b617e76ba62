r"""Bit allocation: the per-tensor widths that minimise the compression variance under a memory
budget (GACT, Liu et al. 2022, §4.2).

With :math:`S(b) = (2^b - 1)^{-2}` the variance factor of :math:`b`-bit stochastic rounding and
:math:`c_l` the sensitivity of tensor :math:`l` (:math:`D_l` values), the gradient's compression
variance is :math:`\sum_l c_l S(b_l)`, and :func:`allocate` solves

.. math::
    \min_{b_l \in \mathcal{B}} \sum_l c_l S(b_l) \quad \text{s.t.} \quad
    \sum_l b_l D_l \le \bar b \sum_l D_l

exactly (a multiple-choice knapsack, by dynamic programming over a grid of the budget).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import reduce

import numpy as np

from gnnact.quant.packed import QUANT_BITS

__all__ = ["WIDTHS", "allocate", "variance_factor"]

# The packed widths the quantizer stores.
WIDTHS: tuple[int, ...] = QUANT_BITS

# The budget grid has at most this many cells, so the dynamic program costs
# O(len(sizes) * len(widths) * _GRID) whatever the tensor sizes.
_GRID = 1 << 15


def variance_factor(bits: int) -> float:
    r""":math:`S(b) = (2^b - 1)^{-2}`: the variance of :math:`b`-bit stochastic rounding relative
    to 1 bit, at a fixed range.

    A range :math:`R` split into :math:`2^b - 1` steps of :math:`s = R / (2^b - 1)` gives a
    rounding variance of at most :math:`s^2/4 = S(b) R^2/4` per value.

    Args:
        bits (int): the width :math:`b \ge 1`.

    Returns:
        float: :math:`S(b)`.

    Example:
        >>> from gnnact.adaptive import variance_factor
        >>> variance_factor(1), variance_factor(2), variance_factor(4)
        (1.0, 0.1111111111111111, 0.0044444444444444444)
    """
    return (2**bits - 1) ** -2.0


def allocate(sensitivity: Sequence[float], sizes: Sequence[int], avg_bits: float,
             widths: Sequence[int] = WIDTHS,
             floors: Sequence[int] | None = None) -> list[int]:
    r"""Widths :math:`b_l \in` ``widths`` minimising :math:`\sum_l c_l S(b_l)` subject to
    :math:`\sum_l b_l D_l \le \bar b \sum_l D_l` (and :math:`b_l \ge f_l` with ``floors``).

    The bits above the smallest width are counted on a grid of :math:`u` values (:math:`u` the
    greatest common divisor of the sizes, or coarser so that the largest possible total spans
    at most :math:`2^{15}` cells), each tensor's cost rounded **up**: the result never exceeds
    the budget (all-smallest always fits), is the exact optimum when the sizes are multiples of
    :math:`u`, and the optimum only improves as ``avg_bits`` grows (same grid). Ties go to
    fewer bits.

    Args:
        sensitivity (Sequence[float]): :math:`c_l \ge 0` per tensor.
        sizes (Sequence[int]): :math:`D_l > 0`, values per tensor.
        avg_bits (float): :math:`\bar b`, at least ``min(widths)``.
        widths (Sequence[int], optional): the allowed widths. (default: :data:`WIDTHS`)
        floors (Sequence[int], optional): :math:`f_l`, the least width of each tensor (a
            width of ``widths``). When the floors alone exceed the budget they are the
            result: a floor is a requirement, the budget a goal. (default: :obj:`None`)

    Returns:
        list[int]: :math:`b_l` per tensor.

    Raises:
        ValueError: if the lengths differ, a sensitivity is negative or not finite, a size is
            not a positive integer, a width is below 1, a floor is not one of ``widths``, or
            ``avg_bits`` is below the smallest width.

    Example:
        >>> from gnnact.adaptive import allocate
        >>> allocate([1.0, 100.0], [1000, 1000], avg_bits=2)  # more bits where it matters
        [1, 3]
        >>> allocate([1.0, 1.0, 5.0], [100, 100, 200], avg_bits=3, widths=(2, 4, 8))
        [2, 2, 4]
        >>> allocate([1.0, 100.0], [1000, 1000], avg_bits=2, floors=[4, 1])  # a requirement
        [4, 1]
    """
    if len(sensitivity) != len(sizes):
        raise ValueError(f"sensitivity has {len(sensitivity)} entries but sizes has "
                         f"{len(sizes)}")
    widths = sorted(set(widths))
    if not widths or widths[0] < 1:
        raise ValueError(f"widths must be positive, got {widths}")
    if any(not (c >= 0 and math.isfinite(c)) for c in sensitivity):
        raise ValueError(f"sensitivity must be finite and non-negative, got {list(sensitivity)}")
    if any(int(d) != d or d <= 0 for d in sizes):
        raise ValueError(f"sizes must be positive integers, got {list(sizes)}")
    if not avg_bits >= widths[0]:
        raise ValueError(f"avg_bits must be at least the smallest width {widths[0]}, "
                         f"got {avg_bits}")
    if floors is not None:
        if len(floors) != len(sizes) or any(f not in widths for f in floors):
            raise ValueError(f"floors must give one of {widths} per tensor, got {list(floors)}")
    else:
        floors = [widths[0]] * len(sizes)
    if not sizes:
        return []
    if avg_bits >= widths[-1]:
        return [widths[-1]] * len(sizes)
    sizes = [int(d) for d in sizes]
    total = sum(sizes)
    # Count the bits *above* the smallest width, so that all-smallest always fits.
    low, span = widths[0], widths[-1] - widths[0]
    unit = reduce(math.gcd, sizes)
    if span * total // unit > _GRID:
        unit = math.ceil(span * total / _GRID)
    capacity = min(math.floor((avg_bits - low) * total / unit + 1e-9), span * total // unit)
    weights = [[math.ceil((b - low) * d / unit) for b in widths] for d in sizes]
    costs = [[c * variance_factor(b) for b in widths] for c in sensitivity]
    if sum(w[widths.index(f)] for w, f in zip(weights, floors, strict=True)) > capacity:
        return list(floors)  # the floors alone take the budget (or more)

    # best[w]: least variance of the tensors so far within w cells; choice[l][w] the width.
    inf = float("inf")
    best = np.zeros(capacity + 1)
    choices = []
    for weight, cost, floor in zip(weights, costs, floors, strict=True):
        new = np.full(capacity + 1, inf)
        pick = np.full(capacity + 1, -1, dtype=np.int64)
        for k in range(len(widths) - 1, -1, -1):  # fewer bits win ties (visited last)
            if weight[k] > capacity or widths[k] < floor:
                continue
            cand = np.full(capacity + 1, inf)
            cand[weight[k]:] = best[:capacity + 1 - weight[k]] + cost[k]
            better = cand <= new
            new[better], pick[better] = cand[better], k
        best = new
        choices.append(pick)
    # Walk back from the full budget.
    out, w = [], capacity
    for weight, pick in zip(reversed(weights), reversed(choices), strict=True):
        k = int(pick[w])
        out.append(widths[k])
        w -= weight[k]
    return out[::-1]
