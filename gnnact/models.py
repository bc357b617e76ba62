"""The model configurations of EXACT's full-batch benchmarks, built from plain PyG and PyTorch
modules, in two styles with the same parameters (and ``state_dict``):

- ``"module"``: ReLU and dropout as :class:`torch.nn.ReLU` / :class:`torch.nn.Dropout` modules;
- ``"functional"``: as PyG's examples write them, ``F.relu``/``x.relu()`` and
  ``F.dropout(x, p, training=self.training)`` in ``forward``.

:func:`gnnact.convert` compresses both alike (functional calls inside a converted model's
forward get what their module twins get).

Defaults (:func:`build`):

- GCN / SAGE: 3 layers, hidden 256, BatchNorm, ReLU, dropout 0.5.
- GAT: 3 layers, 3 heads x 128 channels (concatenated), BatchNorm, ReLU, dropout 0.5.
- GCNII: 16 layers of width 256, alpha 0.1, theta 0.5, ReLU, dropout 0.5.
"""

from __future__ import annotations

import functools
import itertools

import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import Tensor, nn

from gnnact.names import MODELS, STYLES


class Stack(nn.Module):
    """conv -> BatchNorm -> ReLU -> dropout, repeated; the last conv maps to the classes."""

    def __init__(self, convs: list[nn.Module], hidden: int, dropout: float = 0.5,
                 batchnorm: bool = True) -> None:
        if len(convs) < 2:
            raise ValueError(f"a stack needs at least 2 layers, got {len(convs)}")
        super().__init__()
        self.convs = nn.ModuleList(convs)
        # Without BatchNorm (PyG's Planetoid examples: on 140 training nodes it costs GCN about
        # two points on Cora), an identity in its place keeps one forward for both.
        self.bns = nn.ModuleList([nn.BatchNorm1d(hidden) if batchnorm else nn.Identity()
                                  for _ in convs[:-1]])
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor, adj) -> Tensor:
        # One statement per layer, as PyG's BasicGNN writes it: each name is rebound, so a
        # layer's input is freed once the next one has its output (nested calls would keep
        # every argument alive until the outermost returns: two tensors more at the peak).
        for conv, bn in zip(self.convs[:-1], self.bns, strict=True):
            x = conv(x, adj)
            x = bn(x)
            x = self.act(x)
            x = self.drop(x)
        return self.convs[-1](x, adj)


class FunctionalStack(Stack):
    """:class:`Stack` written as PyG's examples write it: ``F.relu`` and ``F.dropout`` calls."""

    def forward(self, x: Tensor, adj) -> Tensor:
        for conv, bn in zip(self.convs[:-1], self.bns, strict=True):
            x = conv(x, adj)
            x = F.relu(bn(x))
            x = F.dropout(x, p=self.drop.p, training=self.training)
        return self.convs[-1](x, adj)


class GCNII(nn.Module):
    """GCNII (Chen et al. 2020): input and output linear maps around GCN2Conv layers."""

    def __init__(self, f_in: int, hidden: int, classes: int, layers: int = 16,
                 alpha: float = 0.1, theta: float = 0.5, dropout: float = 0.5) -> None:
        super().__init__()
        self.lins = nn.ModuleList([nn.Linear(f_in, hidden), nn.Linear(hidden, classes)])
        self.convs = nn.ModuleList([pyg_nn.GCN2Conv(hidden, alpha, theta, layer + 1)
                                    for layer in range(layers)])
        self.act = nn.ReLU()
        self.drop = nn.Dropout(dropout)

    def drop_input(self, x: Tensor) -> Tensor:
        """Dropout on the input features; on a sparse ``x`` (bag-of-words features, which
        torch's dropout does not take) on its stored values, with the same layout kept."""
        if x.layout == torch.strided:
            return self.drop(x)
        # The indices are x's own, valid by construction: no invariant checks needed.
        if x.layout == torch.sparse_coo:
            x = x.coalesce()
            return torch.sparse_coo_tensor(x.indices(), self.drop(x.values()), x.shape,
                                           is_coalesced=True, check_invariants=False)
        if x.layout == torch.sparse_csr:
            return torch.sparse_csr_tensor(x.crow_indices(), x.col_indices(),
                                           self.drop(x.values()), x.shape,
                                           check_invariants=False)
        raise ValueError(f"x must be dense, sparse COO or sparse CSR, got layout {x.layout}")

    def forward(self, x: Tensor, adj) -> Tensor:
        x = x_0 = self.act(self.lins[0](self.drop_input(x)))
        for conv in self.convs:  # one statement per op: each input is freed when used
            x = self.drop(x)
            x = conv(x, x_0, adj)
            x = self.act(x)
        x = self.drop(x)
        return self.lins[1](x)


class FunctionalGCNII(GCNII):
    """:class:`GCNII` written as PyG's ``gcn2_cora`` example writes it (``F.dropout`` and
    ``x.relu()`` calls; dense features only)."""

    def forward(self, x: Tensor, adj) -> Tensor:
        p = self.drop.p
        x = F.dropout(x, p, training=self.training)
        x = x_0 = self.lins[0](x).relu()
        for conv in self.convs:
            x = F.dropout(x, p, training=self.training)
            x = conv(x, x_0, adj)
            x = x.relu()
        x = F.dropout(x, p, training=self.training)
        return self.lins[1](x)


def build(name: str, f_in: int, classes: int, *, hidden: int | None = None,
          layers: int | None = None, heads: int = 3, dropout: float = 0.5,
          style: str = "module", batchnorm: bool = True) -> nn.Module:
    """One of :data:`MODELS`, in one of :data:`STYLES`; ``hidden`` and ``layers`` default to
    EXACT's sizes (GAT: ``hidden`` channels per head). ``batchnorm=False`` leaves the
    BatchNorm out of GCN, SAGE and GAT (GCNII has none)."""
    if style not in STYLES:
        raise ValueError(f"style must be one of {STYLES}, got {style!r}")
    model = _build(name, f_in, classes, hidden=hidden, layers=layers, heads=heads,
                   dropout=dropout, batchnorm=batchnorm)
    if style == "functional":  # the same modules and parameters, another forward
        model.__class__ = FunctionalStack if isinstance(model, Stack) else FunctionalGCNII
    return model


def _build(name: str, f_in: int, classes: int, *, hidden: int | None, layers: int | None,
           heads: int, dropout: float, batchnorm: bool) -> nn.Module:
    if name in ("gcn", "sage"):
        hidden, layers = hidden or 256, layers or 3
        conv = pyg_nn.GCNConv if name == "gcn" else pyg_nn.SAGEConv
        dims = [f_in] + [hidden] * (layers - 1) + [classes]
        return Stack([conv(a, b) for a, b in itertools.pairwise(dims)], hidden, dropout,
                     batchnorm)
    if name == "gat":
        hidden, layers = hidden or 128, layers or 3
        dims = [f_in] + [hidden * heads] * (layers - 2)  # inputs of the hidden layers
        convs = [pyg_nn.GATConv(a, hidden, heads=heads) for a in dims]
        convs.append(pyg_nn.GATConv(hidden * heads, classes, heads=heads, concat=False))
        return Stack(convs, hidden * heads, dropout, batchnorm)
    if name == "gcnii":
        return GCNII(f_in, hidden or 256, classes, layers=layers or 16, dropout=dropout)
    raise ValueError(f"model must be one of {MODELS}, got {name!r}")


@functools.cache
def has_batchnorm(name: str) -> bool:
    """Whether :func:`build` gives model ``name`` BatchNorm layers (GCN, SAGE, GAT: yes;
    GCNII: no), so that a BatchNorm setting means something for it. Read off a tiny build, so
    that it stays true when :func:`build` changes."""
    return any(isinstance(module, nn.modules.batchnorm._BatchNorm)
               for module in build(name, 2, 2, hidden=2, layers=2).modules())
