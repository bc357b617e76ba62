"""PyG layers with a gnnact twin, built once each way for the dtype and edge-case tests
(``test_mixed_precision.py``, ``test_edge_cases.py``): PyG's module and its
:func:`gnnact.convert` copy (same ``state_dict``), run on the same input."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor, nn

import gnnact

F_IN = 8

#: Name -> PyG module factory, for every conv with a twin (``F_IN`` features in).
CONVS: dict[str, Callable[[], nn.Module]] = {
    "GCNConv": lambda: pyg_nn.GCNConv(F_IN, 6),
    "SAGEConv": lambda: pyg_nn.SAGEConv(F_IN, 6),
    "GATConv": lambda: pyg_nn.GATConv(F_IN, 3, heads=2),
    "GATv2Conv": lambda: pyg_nn.GATv2Conv(F_IN, 3, heads=2),
    "GCN2Conv": lambda: pyg_nn.GCN2Conv(F_IN, alpha=0.2, theta=0.5, layer=2),
    "APPNP": lambda: pyg_nn.APPNP(K=3, alpha=0.1),
    "SGConv": lambda: pyg_nn.SGConv(F_IN, 6, K=2),
}

#: Name -> torch module factory, for the dense twins (``F_IN`` features in and out).
DENSE: dict[str, Callable[[], nn.Module]] = {
    "Linear": lambda: nn.Linear(F_IN, 6),
    "BatchNorm1d": lambda: nn.BatchNorm1d(F_IN),
    "ReLU": nn.ReLU,
    "LeakyReLU": lambda: nn.LeakyReLU(0.1),
    "Dropout": lambda: nn.Dropout(0.3),
}


def twin_pair(factory: Callable[[], nn.Module], dtype: torch.dtype, bits: int = 32,
              device: str = "cpu") -> tuple[nn.Module, nn.Module]:
    """PyG's (or torch's) module and its converted copy at ``bits``, in ``dtype`` on
    ``device``, training mode."""
    torch.manual_seed(0)
    ref = factory().to(device, dtype).train()
    twin = gnnact.convert(copy.deepcopy(ref), gnnact.Config(bits=bits))
    assert type(twin).__module__.startswith("gnnact"), type(twin)
    return ref, twin


def call(module: nn.Module, x: Tensor, edge_index: Tensor | None) -> Tensor:
    """``module`` on ``x`` (GCNII's initial features: ``x`` itself), seeded for dropout."""
    torch.manual_seed(1)
    if edge_index is None:
        return module(x)
    if isinstance(module, pyg_nn.GCN2Conv):
        return module(x, x, edge_index)
    return module(x, edge_index)


def outputs_and_grads(module: nn.Module, x: Tensor, edge_index: Tensor | None,
                      upstream: Tensor | None = None) -> tuple[Tensor, list[Tensor]]:
    """The output and the gradients of ``x`` and every parameter (zeros where unused) of
    ``<output, upstream>`` (``upstream`` fixed random when ``None``)."""
    x = x.detach().clone().requires_grad_()
    out = call(module, x, edge_index)
    if upstream is None:
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out)
    params = [p for p in module.parameters() if p.requires_grad]
    grads = torch.autograd.grad((out * upstream).sum(), [x, *params], allow_unused=True)
    return out.detach(), [torch.zeros_like(t) if g is None else g
                          for g, t in zip(grads, [x, *params], strict=True)]


def graph(num_nodes: int, num_edges: int, seed: int = 0, device: str = "cpu") -> Tensor:
    """A random ``edge_index`` (no self-loops, possibly repeated edges)."""
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, num_nodes, (num_edges,), generator=gen)
    dst = (src + torch.randint(1, max(2, num_nodes), (num_edges,), generator=gen)) % max(
        1, num_nodes)
    return torch.stack([src, dst]).to(device)


def features(num_nodes: int, dtype: torch.dtype, seed: int = 0,
             device: str = "cpu") -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(num_nodes, F_IN, generator=gen).to(device, dtype)


def saved_context(out: Tensor, exclude: list[Any]) -> int:
    """Context bytes (graph cache apart) the autograd graph of ``out`` keeps."""
    return gnnact.memory.breakdown(out.float().sum(), exclude=exclude).context
