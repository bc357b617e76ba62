"""Lazy ``in_channels=-1`` support for layers that read a PyG ``Linear``'s weight directly."""

from __future__ import annotations

from torch import Tensor
from torch_geometric.nn.dense.linear import Linear, is_uninitialized_parameter

__all__ = ["linear_weight"]


def linear_weight(lin: Linear, x: Tensor) -> Tensor:
    """``lin.weight``, materialised from ``x`` first if it is still lazy (as ``lin(x)`` would)."""
    if is_uninitialized_parameter(lin.weight):
        lin.initialize_parameters(lin, (x,))
    return lin.weight
