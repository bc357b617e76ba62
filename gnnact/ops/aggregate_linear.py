r"""A linear map and a fixed aggregation in one op, by row blocks: the layer of GCN and SAGE.

.. math::
    Y = P\,X W^\top + \mathbf{1} b^\top \;\big[+\, X W_r^\top\big], \qquad
    P = A \ (\text{sum}) \ \text{or}\ D^{-1} A \ (\text{mean}),

with :math:`A` a :class:`~gnnact.ops.graph.Graph` whose edge values need no gradient (GCN's
normalised weights, or ones) and the root term :math:`X W_r^\top` (SAGE) only for a square
graph (:math:`X` is both sides). Kept for backward: :math:`X` at ``config.bits`` bits (only if
a weight needs a gradient; rebuilt instead when another op's context already holds it), the
weights, and the graph its cache holds anyway.

Composed of :func:`~gnnact.ops.linear` and :func:`~gnnact.ops.spmm`, the same layer holds
three full-size tensors at once in each direction: forward :math:`X`, :math:`X W^\top` and
:math:`Y`; backward the incoming :math:`\nabla Y`, :math:`P^\top \nabla Y` and the restored
:math:`\hat X` (and :math:`\nabla X`). Here every product is taken by blocks of about
:func:`~gnnact.ops.blocks.row_starts` rows, so a step holds two:

* forward, by blocks :math:`\beta` of target rows, :math:`Y_\beta = (P_\beta X) W^\top + b
  + X_\beta W_r^\top` (aggregate first; when :math:`W` narrows the features, :math:`X W^\top`
  first as PyG's GCN does, a narrow temporary);
* backward, by blocks :math:`\sigma` of source rows, with :math:`T_\sigma = (P^\top)_\sigma
  \nabla Y`:

  .. math::
      \nabla W \mathrel{+}= T_\sigma^\top \hat X_\sigma, \quad
      \nabla W_r \mathrel{+}= \nabla Y_\sigma^\top \hat X_\sigma, \quad
      \nabla X_\sigma = T_\sigma W + \nabla Y_\sigma W_r,

  :math:`\nabla X_\sigma` written over :math:`\hat X_\sigma` once read (a restored copy is
  this op's own), so that :math:`\nabla X` takes no memory of its own.

The values are the composed ops' up to float summation order (the weight gradients are sums
over blocks).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import torch
from torch import Tensor

from gnnact.config import Config
from gnnact.ops.blocks import row_starts, sum_by_blocks
from gnnact.ops.context import input_bits, load_context, records_graph, save_context, writable
from gnnact.ops.graph import Graph
from gnnact.ops.higher_order import first_order_only
from gnnact.ops.spmm import inv_degree
from gnnact.ops.state import eager_op

__all__ = ["aggregate_linear", "fuses"]


def _forward(x: Tensor, weight: Tensor, bias: Tensor | None, root: Tensor | None,
             value: Tensor | None, graph: Graph, mean: bool) -> Tensor:
    scale = inv_degree(graph, x.dtype) if mean else None
    n_out = weight.size(0)
    if n_out < x.size(1):  # narrowing: X W^T first, a narrow temporary
        out = graph.mm(x @ weight.t(), value, scale=scale)
    else:
        out = x.new_empty(graph.num_dst, n_out)
        starts = row_starts(graph.num_dst, x.size(1), x.device)
        for rows, edges in zip(pairwise(starts), pairwise(graph.edge_offsets(starts)),
                               strict=True):
            block = graph.mm_rows(x, rows, edges, value, scale=scale)
            torch.mm(block, weight.t(), out=out[rows[0]:rows[1]])
            del block  # before the next block's: one block's temporaries at a time
    if root is not None:
        out.addmm_(x, root.t())
    if bias is not None:
        out.add_(bias)
    return out


class _AggregateLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None, root: Tensor | None,
                value: Tensor | None, graph: Graph, mean: bool, config: Config) -> Tensor:
        ctx.graph, ctx.mean = graph, mean
        ctx.has_bias = bias is not None
        keep_x = ctx.needs_input_grad[1] or ctx.needs_input_grad[3]  # for dW, dW_r
        keep_w = ctx.needs_input_grad[0]  # for dX
        save_context(ctx, config, (x if keep_x else None, input_bits(x, config)),
                     (weight if keep_w else None, 32), (root if keep_w else None, 32), value)
        return _forward(x, weight, bias, root, graph.value if value is None else value, graph,
                        mean)

    @staticmethod
    @first_order_only("compressed aggregation and linear map (gnnact.ops.aggregate_linear)")
    def backward(ctx: Any, grad: Tensor) -> tuple:
        graph: Graph = ctx.graph
        x_hat, weight, root, value = load_context(ctx)
        value = graph.value if value is None else value  # (the graph's own is not kept twice)
        need_x, need_w, need_b, need_r = (ctx.needs_input_grad[i] for i in range(4))
        grad = grad.contiguous()
        n_in = x_hat.size(1) if x_hat is not None else weight.size(1)
        grad_w = grad.new_zeros(grad.size(1), n_in) if need_w else None
        grad_r = grad.new_zeros(grad.size(1), n_in) if need_r else None
        grad_x = None
        if need_x:
            grad_x = (x_hat if x_hat is not None and writable(ctx, x_hat)
                      else grad.new_empty(graph.num_src, n_in))
        index = graph.transpose_index()
        col_scale = inv_degree(graph, grad.dtype) if ctx.mean else None
        g, v = grad, None if ctx.mean else value
        if ctx.mean and value is not None:  # A^T D^-1 G with edge values: D^-1 on G
            g, col_scale, v = grad * col_scale[:, None], None, value
        starts = row_starts(graph.num_src, max(grad.size(1), n_in), grad.device)
        offsets = graph.edge_offsets(starts, transpose=True, index=index)
        for (r0, r1), edges in zip(pairwise(starts), pairwise(offsets), strict=True):
            t = graph.mm_rows(g, (r0, r1), edges, v, transpose=True, col_scale=col_scale,
                              index=index)
            if need_w:
                grad_w.addmm_(t.t(), x_hat[r0:r1])
            if need_r:
                grad_r.addmm_(grad[r0:r1].t(), x_hat[r0:r1])
            if need_x:  # after the reads of x_hat's rows: grad_x may be written over them
                block = t @ weight
                if root is not None:
                    block.addmm_(grad[r0:r1], root)
                grad_x[r0:r1] = block
                del block
            del t
        # By row blocks: a GPU's whole-tensor reduction over rows allocates a staging buffer
        # that grows with the tensor (132 MiB here at SAGE's arxiv-shape peak on an H200).
        grad_b = sum_by_blocks(grad, [0]) if ctx.has_bias and need_b else None
        return grad_x, grad_w, grad_b, grad_r, None, None, None, None


def fuses(x: Tensor, weight: Tensor, value: Tensor | None, graph: Graph,
          root: bool = False) -> bool:
    """Whether :func:`aggregate_linear` takes this layer: 2-D strided float32/float64
    features of the weight's dtype, no autocast (whose per-op dtypes the composed ops follow),
    edge values that need no gradient, and a square graph for a root term."""
    return (x.dim() == 2 and x.layout == torch.strided and x.dtype == weight.dtype
            and x.dtype in (torch.float32, torch.float64)
            and not torch.is_autocast_enabled(x.device.type)
            and (value is None or not value.requires_grad)
            and x.size(0) == graph.num_src
            and (not root or graph.num_src == graph.num_dst))


@eager_op
def aggregate_linear(x: Tensor, graph: Graph, weight: Tensor, bias: Tensor | None = None,
                     root_weight: Tensor | None = None, value: Tensor | None = None,
                     reduce: str = "sum", config: Config | None = None) -> Tensor:
    r""":math:`Y = P X W^\top + b + X W_r^\top` by row blocks (see the module docstring).

    Args:
        x (torch.Tensor): node features ``[N_src, in]`` (:func:`fuses` says which).
        graph (Graph): the adjacency, ``[N_dst, N_src]``.
        weight (torch.Tensor): :math:`W`, ``[out, in]``.
        bias (torch.Tensor, optional): :math:`b`, ``[out]``.
        root_weight (torch.Tensor, optional): :math:`W_r`, ``[out, in]`` (square graphs).
        value (torch.Tensor, optional): edge values in CSR order, needing no gradient
            (default: the graph's own).
        reduce (str, optional): ``"sum"`` or ``"mean"``. (default: :obj:`"sum"`)
        config (Config, optional): storage of the kept :math:`X`. (default: ``Config()``)

    Returns:
        ``[N_dst, out]``.
    """
    if reduce not in ("sum", "add", "mean"):
        raise ValueError(f"reduce must be 'sum' or 'mean', got {reduce!r}")
    for w in (weight, root_weight):
        if w is not None and x.size(-1) != w.size(1):
            raise ValueError(f"x has {x.size(-1)} features but the weight expects {w.size(1)}")
    if not fuses(x, weight, value, graph, root_weight is not None):
        raise ValueError("aggregate_linear: this layer is not one it computes (see fuses())")
    mean = reduce == "mean"
    if not records_graph(x, weight, bias, root_weight):
        return _forward(x, weight, bias, root_weight, graph.value if value is None else value,
                        graph, mean)
    return _AggregateLinear.apply(x, weight, bias, root_weight, value, graph, mean,
                                  config or Config())
