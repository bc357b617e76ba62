"""Inputs and comparisons shared by the GAT and GATv2 tests: random graphs with duplicate edges
and self-loops, float64 features, relative errors."""

from __future__ import annotations

import torch
from torch import Tensor

#: Nodes, feature width and edges of the default graph.
N, F_IN, E = 24, 6, 90


def edges(seed: int = 0, n_src: int = N, n_dst: int = N, e: int = E) -> Tensor:
    """Random directed edges in random order (duplicates and self-loops included)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, n_src, (e,), generator=g),
                        torch.randint(0, n_dst, (e,), generator=g)])


def feats(rows: int, cols: int, seed: int = 1) -> Tensor:
    """Standard normal float64 features, ``[rows, cols]``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, cols, generator=g, dtype=torch.float64)


def rel(a: Tensor, b: Tensor) -> float:
    """``|a - b| / |b|`` (Frobenius norms)."""
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-300))
