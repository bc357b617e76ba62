r"""Sparse-dense matrix product whose backward needs nothing but the graph.

.. math::
    Y = A X \quad(\text{sum}), \qquad Y = D^{-1} A X \quad(\text{mean}),

with :math:`A` a :class:`~gnnact.ops.graph.Graph` (values: the graph's own, or ``value``).
Backward: :math:`\nabla X = A^\top \nabla Y` (mean: :math:`A^\top D^{-1} \nabla Y`) through
:math:`A` itself when it is symmetric, else the transposed CSR, so a constant adjacency keeps
**no node features** for backward, only the structure it already holds. Only when ``value``
needs a gradient, :math:`\nabla a_{ij} = \langle \nabla Y_i, X_j \rangle` needs :math:`X`,
which is then kept compressed (``config.bits``).

Dtypes as PyG's messages :math:`a_{ij} x_j`: the result has :math:`X`'s dtype promoted with
the values' (float32 under :func:`torch.autocast` on half-precision features), whatever
autocast is active. float16/bfloat16 on the CPU, where torch's CSR product has no kernel, are
computed in float32 and rounded once (:meth:`~gnnact.ops.graph.Graph.mm`), forward and
backward; nothing but transients is in float32.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from gnnact.config import Config
from gnnact.ops.context import (
    input_bits,
    load_context,
    records_graph,
    save_context,
    transient,
)
from gnnact.ops.graph import Graph, sparse_compute_dtype
from gnnact.ops.higher_order import first_order_only
from gnnact.ops.state import eager_op

__all__ = ["spmm"]


def inv_degree(graph: Graph, dtype: torch.dtype) -> Tensor:
    r"""The mean's :math:`D^{-1}`: one over each target's in-degree (1 for no edges)."""
    return graph.in_degree(dtype).clamp_(min=1).reciprocal_()


def _rows(x: Tensor) -> Tensor:
    """``x`` as a 2-D ``[rows, features]`` matrix; spelled out rather than ``-1``, which an
    empty graph's 0 rows leave ambiguous."""
    return x.reshape(x.size(0), math.prod(x.shape[1:]))


def _aggregate(x: Tensor, graph: Graph, value: Tensor | None, mean: bool) -> Tensor:
    edge_value = graph.value if value is None else value
    # D^{-1} in float32 at least: applied before the single rounding of a half-precision result.
    scale = inv_degree(graph, torch.promote_types(x.dtype, torch.float32)) if mean else None
    y = graph.mm(_rows(x), edge_value, scale=scale)
    # A 2-D result is returned as is, not as a view: the layer may then add its bias into it
    # (autograd forbids writing a view made inside a custom Function).
    return y if x.dim() == 2 else y.view(graph.num_dst, *x.shape[1:])


def aggregate(x: Tensor, graph: Graph, value: Tensor | None = None) -> Tensor:
    """:math:`A X` (sum), a new tensor (what :func:`spmm` computes, outside autograd)."""
    return _aggregate(x, graph, value, mean=False)


def aggregate_grad(grad: Tensor, graph: Graph, value: Tensor | None,
                   feature_shape: torch.Size) -> Tensor:
    r""":math:`\nabla X = A^\top \nabla Y` of a sum :math:`Y = A X` with constant edge values
    (the graph's own if ``value`` is ``None``); fp16/bf16 on the CPU in float32 (see
    :meth:`~gnnact.ops.graph.Graph.mm`), rounded by autograd to the input's dtype."""
    g = _rows(grad)
    g = g.to(sparse_compute_dtype(g.dtype, g.device))
    edge_value = graph.value if value is None else value
    return graph.mm(g, edge_value, transpose=True).view(graph.num_src, *feature_shape)


class _SpMM(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, value: Tensor | None, graph: Graph, mean: bool,
                config: Config) -> Tensor:
        ctx.graph, ctx.mean, ctx.feature_shape = graph, mean, x.shape[1:]
        need_x = value is not None and ctx.needs_input_grad[1]
        x2 = _rows(x) if need_x else None
        save_context(ctx, config, (x2, input_bits(x, config)), (value, 32))
        return _aggregate(x, graph, value, mean)

    @staticmethod
    # With edge values that need no gradient, backward is A^T G: linear in G with the exact
    # graph, so it is differentiable as written. The edge values' gradient reads X rounded.
    @first_order_only("sparse aggregation (gnnact.ops.spmm) with learnable edge values",
                      exact=lambda ctx: not ctx.needs_input_grad[1])
    def backward(ctx: Any, grad: Tensor) -> tuple:
        graph: Graph = ctx.graph
        x_hat, value = load_context(ctx)
        # fp16/bf16 on the CPU: the products in float32 (see Graph.mm); autograd rounds the
        # gradients to the inputs' dtypes once.
        g = _rows(grad)
        g = g.to(sparse_compute_dtype(g.dtype, g.device))
        edge_value = graph.value if value is None else value
        grad_x = grad_value = None
        if ctx.mean and edge_value is None and not ctx.needs_input_grad[1]:
            # A^T D^{-1} G with D^{-1} in the matrix's entries: no scaled copy of G, a
            # full-size tensor at the backward's peak otherwise.
            if ctx.needs_input_grad[0]:
                grad_x = graph.mm(g, transpose=True, col_scale=inv_degree(graph, g.dtype))
                grad_x = grad_x.view(graph.num_src, *ctx.feature_shape)
            return grad_x, None, None, None, None
        if ctx.mean:
            g = g * inv_degree(graph, g.dtype)[:, None]
        if ctx.needs_input_grad[0]:
            grad_x = aggregate_grad(g, graph, value, ctx.feature_shape)
        if ctx.needs_input_grad[1]:
            # E x F transient (not kept): one gather of each side per edge.
            grad_value = (g.index_select(0, graph.dst)
                          * x_hat.index_select(0, graph.src)).sum(dim=-1)
        return grad_x, grad_value, None, None, None


@eager_op
def spmm(x: Tensor, graph: Graph, value: Tensor | None = None, reduce: str = "sum",
         config: Config | None = None) -> Tensor:
    r"""Aggregate neighbour features: :math:`Y = A X` (``"sum"``) or :math:`D^{-1} A X`
    (``"mean"``).

    Args:
        x (torch.Tensor): source features ``[N_src, *]``.
        graph (Graph): the adjacency.
        value (torch.Tensor, optional): edge values in CSR order ``[E]``, replacing the graph's
            own; when it requires grad, :math:`X` is kept compressed for its gradient.
        reduce (str, optional): ``"sum"`` or ``"mean"``. (default: :obj:`"sum"`)
        config (Config, optional): storage of the kept features. (default: ``Config()``)

    Returns:
        ``[N_dst, *]``.

    Saved for backward: the graph (already held by its cache) and, only when ``value`` needs a
    gradient, ``value`` and a compressed copy of :math:`X`.
    """
    if reduce not in ("sum", "add", "mean"):
        raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
    if x.size(0) != graph.num_src:
        raise ValueError(f"x has {x.size(0)} rows but the graph has {graph.num_src} source nodes")
    if value is not None and value.numel() != graph.num_edges:
        raise ValueError(f"value has {value.numel()} entries but the graph has "
                         f"{graph.num_edges} edges")
    if value is not None and value is not graph.value and not graph.per_edge:
        raise ValueError("value: this graph was built for its own edge values only "
                         "(per_edge=False); build it with per_edge=True for per-call values")
    mean = reduce == "mean"
    if not records_graph(x, value):
        return transient(_aggregate(x, graph, value, mean))
    return _SpMM.apply(x, value, graph, mean, config or Config())
