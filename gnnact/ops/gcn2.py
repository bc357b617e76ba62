r"""GCNII's initial residual and identity mapping as one op with a compressed context.

Given the aggregated features :math:`\mathbf{P} = \hat{\mathbf{P}}\mathbf{H}` (``[M, F]``, from
:func:`gnnact.ops.spmm`), the initial features :math:`\mathbf{H}^{(0)}` (``[N_0 \ge M, F]``, of
which the first :math:`M` rows are used, as PyG's ``x_0[:x.size(0)]``), :math:`\alpha` and
:math:`\beta`, the op computes, with :math:`\mathbf{X} = (1-\alpha)\mathbf{P}` and
:math:`\mathbf{X}_0 = \alpha\mathbf{H}^{(0)}`:

* shared weights (GCNII):

  .. math::
      \mathbf{S} = \mathbf{X} + \mathbf{X}_0, \qquad
      \mathbf{Y} = (1-\beta)\,\mathbf{S} + \beta\,\mathbf{S}\mathbf{W}_1;

* separate weights (GCNII*):

  .. math::
      \mathbf{Y} = (1-\beta)\,\mathbf{X} + \beta\,\mathbf{X}\mathbf{W}_1
      + (1-\beta)\,\mathbf{X}_0 + \beta\,\mathbf{X}_0\mathbf{W}_2.

Backward, with :math:`\mathbf{G} = \nabla\mathbf{Y}` and
:math:`\mathbf{G}_k = (1-\beta)\mathbf{G} + \beta\,\mathbf{G}\mathbf{W}_k^\top`:

* shared: :math:`\nabla\mathbf{P} = (1-\alpha)\mathbf{G}_1`,
  :math:`\nabla\mathbf{H}^{(0)}_{:M} = \alpha\,\mathbf{G}_1`,
  :math:`\nabla\mathbf{W}_1 = \beta\,\mathbf{S}^\top\mathbf{G}`;
* separate: :math:`\nabla\mathbf{P} = (1-\alpha)\mathbf{G}_1`,
  :math:`\nabla\mathbf{H}^{(0)}_{:M} = \alpha\,\mathbf{G}_2`,
  :math:`\nabla\mathbf{W}_1 = \beta\,\mathbf{X}^\top\mathbf{G}`,
  :math:`\nabla\mathbf{W}_2 = \alpha\beta\,\mathbf{H}^{(0)\top}_{:M}\mathbf{G}`

(rows of :math:`\mathbf{H}^{(0)}` past :math:`M` get a zero gradient).

So what is kept (each only if the weight gradient that reads it is needed) is

* shared: :math:`\mathbf{S}` at ``config.width`` bits — :math:`\mathbf{H}^{(0)}` is not kept at
  all, since :math:`\mathbf{S}` already holds its contribution;
* separate: :math:`\mathbf{X}` at ``config.width`` bits and :math:`\mathbf{H}^{(0)}` **itself**
  (never :math:`\alpha\mathbf{H}^{(0)}`, a new tensor in every layer) through
  :func:`~gnnact.ops.context.save_context`, whose per-tensor cache makes every layer that
  receives the same ``x_0`` object share **one** packed copy; :math:`\alpha` is applied in
  backward;
* the weights themselves (parameters, not copies) for :math:`\nabla\mathbf{P}` and
  :math:`\nabla\mathbf{H}^{(0)}`.

The input gradients :math:`\nabla\mathbf{P}` and :math:`\nabla\mathbf{H}^{(0)}` read no
activation, so they are exact; only :math:`\nabla\mathbf{W}_k` sees the stochastic rounding,
and linearly, so it is unbiased. The forward pass replays PyG's operations (``mul``, ``add``,
``addmm``) in PyG's order, so ``Config(bits=32)`` gives PyG's output bit for bit.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import Tensor

from gnnact.config import Config
from gnnact.ops.blocks import row_starts
from gnnact.ops.context import load_context, records_graph, save_context
from gnnact.ops.graph import Graph
from gnnact.ops.higher_order import first_order_only
from gnnact.ops.spmm import aggregate, aggregate_grad, spmm
from gnnact.ops.state import eager_op

__all__ = ["gcn2_conv", "gcn2_residual"]


def _identity_map_grad(grad: Tensor, weight: Tensor, beta: float) -> Tensor:
    r""":math:`(1-\beta)\mathbf{G} + \beta\,\mathbf{G}\mathbf{W}^\top` (``beta=0`` in addmm
    ignores the input, exactly as the forward's addmm did)."""
    return torch.addmm(grad, grad, weight.t(), beta=1.0 - beta, alpha=beta)


def _cast(tensors: tuple, dtype: torch.dtype) -> list:
    """Each tensor of ``tensors`` (``None`` kept) in ``dtype``."""
    return [None if t is None else t.to(dtype) for t in tensors]


def _pad_rows(grad: Tensor, rows: int) -> Tensor:
    """``grad`` (the first rows of an ``[rows, F]`` input's gradient), zero-padded to ``rows``."""
    if grad.size(0) == rows:
        return grad
    out = grad.new_zeros((rows, *grad.shape[1:]))
    out[: grad.size(0)] = grad
    return out


class _GCN2Residual(torch.autograd.Function):
    r"""The residual and identity map of :func:`gcn2_residual`; with a ``graph``, the
    aggregation :math:`\mathbf{P} = \hat{\mathbf{P}}\mathbf{H}` first, from the first input
    :math:`\mathbf{H}` (:func:`gcn2_conv`): :math:`\mathbf{P}` is then this op's own, and
    :math:`(1-\alpha)\mathbf{P}` is made in place (as PyG's ``x.mul_(1 - alpha)``), so the
    forward never holds both."""

    @staticmethod
    def forward(ctx: Any, p: Tensor, x_0: Tensor, weight1: Tensor, weight2: Tensor | None,
                alpha: float, beta: float, config: Config, record: bool,
                graph: Graph | None = None, value: Tensor | None = None) -> Tensor:
        ctx.graph, ctx.value, ctx.feature_shape = graph, value, p.shape[1:]
        own = graph is not None
        if own:
            p = aggregate(p, graph, value)
        m = p.size(0)
        # A view of the first M rows only for the arithmetic; what is kept below is x_0 itself,
        # so that every layer finds the same object in the shared quantization cache.
        h0 = x_0 if x_0.size(0) == m else x_0[:m]
        # `record` (grad mode on, some input needs a gradient) gates all of them:
        # needs_input_grad stays set under torch.no_grad, where nothing is to be kept.
        need_p, need_h0, need_w1 = (record and n for n in ctx.needs_input_grad[:3])
        need_w2 = record and weight2 is not None and ctx.needs_input_grad[3]
        # The same operations in the same order as PyG (x.mul_(1 - alpha); alpha * x_0), so
        # that 32-bit results are PyG's to the last bit. alpha * h0 is a transient: never kept.
        x = p.mul_(1.0 - alpha) if own else p * (1.0 - alpha)
        del p
        if weight2 is None:
            # x += alpha * h0 by row blocks: the same two roundings per element, without a
            # full-size alpha * h0 beside x at the forward's peak.
            for r0, r1 in itertools.pairwise(row_starts(m, h0[:1].numel(), h0.device)):
                x[r0:r1].add_(alpha * h0[r0:r1])
            s = x
            out = torch.addmm(s, s, weight1, beta=1.0 - beta, alpha=beta)
            save_context(ctx, config, (s if need_w1 else None, config.width),
                         (weight1 if need_p or need_h0 else None, 32))
        else:
            x0 = alpha * h0
            out = torch.addmm(x, x, weight1, beta=1.0 - beta, alpha=beta)
            out = out + torch.addmm(x0, x0, weight2, beta=1.0 - beta, alpha=beta)
            save_context(ctx, config, (x if need_w1 else None, config.width),
                         (x_0 if need_w2 else None, config.width),
                         (weight1 if need_p else None, 32),
                         (weight2 if need_h0 else None, 32))
        ctx.shared = weight2 is None
        ctx.alpha, ctx.beta, ctx.x0_rows = alpha, beta, x_0.size(0)
        # The dtype addmm computed in (bfloat16/float16 under autocast, whatever the inputs'):
        # backward's products run in it too, as autocast's own addmm backward does.
        ctx.dtype = out.dtype
        return out

    @staticmethod
    @first_order_only("GCNII initial-residual map (gnnact.ops.gcn2)")
    def backward(ctx: Any, grad: Tensor) -> tuple:
        alpha, beta = ctx.alpha, ctx.beta
        need_p, need_h0, need_w1, need_w2 = ctx.needs_input_grad[:4]
        grad_p = grad_h0 = grad_w1 = grad_w2 = None
        # (Autograd casts each gradient back to its input's dtype.)
        grad = grad.to(ctx.dtype)
        if ctx.shared:
            s_hat, weight1 = _cast(load_context(ctx), ctx.dtype)
            # The restored S is let go before the input gradients are made, and G_1 is scaled
            # in place last: the gradient G, G_1 and one more full-size tensor at most, where
            # S, G_1 and both scaled copies would coexist.
            if need_w1:
                grad_w1 = (s_hat.t() @ grad).mul_(beta)
            del s_hat
            if need_p or need_h0:
                g1 = _identity_map_grad(grad, weight1, beta)
                grad_p = _grad_p(ctx, g1, alpha, last=not need_h0) if need_p else None
                grad_h0 = _pad_rows(g1.mul_(alpha), ctx.x0_rows) if need_h0 else None
        else:
            x_hat, h0_hat, weight1, weight2 = _cast(load_context(ctx), ctx.dtype)
            if need_w1:
                grad_w1 = (x_hat.t() @ grad).mul_(beta)
            if need_w2:
                h0_hat = h0_hat[: grad.size(0)]
                grad_w2 = (h0_hat.t() @ grad).mul_(alpha * beta)
            del x_hat, h0_hat  # before the input gradients are made
            if need_p:
                grad_p = _grad_p(ctx, _identity_map_grad(grad, weight1, beta), alpha, last=True)
            if need_h0:
                grad_h0 = _pad_rows(_identity_map_grad(grad, weight2, beta).mul_(alpha),
                                    ctx.x0_rows)
        return grad_p, grad_h0, grad_w1, grad_w2, None, None, None, None, None, None


def _grad_p(ctx: Any, g1: Tensor, alpha: float, last: bool) -> Tensor:
    r""":math:`\nabla\mathbf{P} = (1-\alpha)\mathbf{G}_1`, or with the aggregation inside
    (:func:`gcn2_conv`) the input's :math:`(1-\alpha)\hat{\mathbf{P}}^\top\mathbf{G}_1`: the
    product first and scaled in place, so that no scaled copy of :math:`\mathbf{G}_1` sits
    beside it. ``last``: nothing reads ``g1`` after this, which may then be scaled itself."""
    if ctx.graph is None:
        return g1.mul_(1.0 - alpha) if last else g1 * (1.0 - alpha)
    return aggregate_grad(g1, ctx.graph, ctx.value, ctx.feature_shape).mul_(1.0 - alpha)


@eager_op
def gcn2_residual(p: Tensor, x_0: Tensor, weight1: Tensor, weight2: Tensor | None = None,
                  alpha: float = 0.1, beta: float = 1.0, config: Config | None = None) -> Tensor:
    r"""GCNII's initial residual plus identity mapping (see the module docstring):
    :math:`\mathbf{Y} = \mathbf{S}\big((1-\beta)\mathbf{I} + \beta\mathbf{W}_1\big)` with
    :math:`\mathbf{S} = (1-\alpha)\mathbf{P} + \alpha\mathbf{H}^{(0)}` (``weight2=None``), or
    the GCNII* form with :math:`\mathbf{W}_2` applied to :math:`\alpha\mathbf{H}^{(0)}`.

    Args:
        p (torch.Tensor): aggregated features :math:`\hat{\mathbf{P}}\mathbf{H}`, ``[M, F]``.
        x_0 (torch.Tensor): initial features :math:`\mathbf{H}^{(0)}`, ``[N_0, F]`` with
            :math:`N_0 \ge M` (the first :math:`M` rows are used). Pass the **same tensor
            object** to every layer: its compressed copy is then made and kept once.
        weight1 (torch.Tensor): :math:`\mathbf{W}_1`, ``[F, F]`` (applied as
            :math:`\mathbf{S}\mathbf{W}_1`, not transposed, as in PyG).
        weight2 (torch.Tensor, optional): :math:`\mathbf{W}_2` for separate weights.
        alpha (float): :math:`\alpha`.
        beta (float): :math:`\beta`.
        config (Config, optional): storage of the kept activations. (default: ``Config()``)

    Returns:
        ``[M, F]``.

    Saved for backward: :math:`\mathbf{S}` (shared) or :math:`(1-\alpha)\mathbf{P}` and the
    shared copy of :math:`\mathbf{H}^{(0)}` (separate) at ``config.width`` bits, and the weights.
    """
    _check("p", p, p.size(0), x_0, weight1, weight2)
    return _GCN2Residual.apply(p, x_0, weight1, weight2, float(alpha), float(beta),
                               config or Config(), records_graph(p, x_0, weight1, weight2))


def _check(name: str, p: Tensor, rows: int, x_0: Tensor, weight1: Tensor,
           weight2: Tensor | None) -> None:
    """Shapes of :func:`gcn2_residual`'s (``p`` with ``rows`` aggregated rows) or
    :func:`gcn2_conv`'s (``x``) arguments, each named in the error."""
    if p.dim() != 2 or x_0.dim() != 2:
        raise ValueError(f"{name} and x_0 must be 2-D, got shapes {tuple(p.shape)} and "
                         f"{tuple(x_0.shape)}")
    if x_0.size(0) < rows or x_0.size(1) != p.size(1):
        raise ValueError(f"x_0 {tuple(x_0.shape)} must have at least the {rows} rows and "
                         f"exactly the {p.size(1)} columns of the aggregated features")
    for wname, w in (("weight1", weight1), ("weight2", weight2)):
        if w is not None and tuple(w.shape) != (p.size(1), p.size(1)):
            raise ValueError(f"{wname} must be [{p.size(1)}, {p.size(1)}], got "
                             f"{tuple(w.shape)}")


@eager_op
def gcn2_conv(x: Tensor, x_0: Tensor, graph: Graph, weight1: Tensor,
              weight2: Tensor | None = None, alpha: float = 0.1, beta: float = 1.0,
              value: Tensor | None = None, config: Config | None = None) -> Tensor:
    r"""A GCNII layer: :func:`gnnact.ops.spmm` (sum) and :func:`gcn2_residual` in one op,
    :math:`\mathbf{P} = \hat{\mathbf{P}}\mathbf{X}` then the residual and identity map. The
    same values, context and weight gradients as the two ops. :math:`\mathbf{P}` is the op's
    own, scaled in place and let go once the support is made, so the forward holds one
    full-size tensor fewer; backward computes :math:`\nabla\mathbf{X} = (1-\alpha)
    \hat{\mathbf{P}}^\top\mathbf{G}_1` as the product first, scaled in place (equal to the
    two ops' up to rounding), so no scaled copy of :math:`\mathbf{G}_1` is made either.

    Args:
        x (torch.Tensor): node features ``[N_src, F]``.
        x_0 (torch.Tensor): initial features, as in :func:`gcn2_residual`.
        graph (Graph): the normalised adjacency :math:`\hat{\mathbf{P}}`.
        weight1, weight2, alpha, beta, config: as in :func:`gcn2_residual`.
        value (torch.Tensor, optional): edge values in CSR order replacing the graph's own;
            constant (one that needs a gradient takes the two ops, whose aggregation keeps
            :math:`\mathbf{X}` for it).

    Returns:
        ``[N_dst, F]``.
    """
    if x.size(0) != graph.num_src:
        raise ValueError(f"x has {x.size(0)} rows but the graph has {graph.num_src} source nodes")
    if value is not None and value.requires_grad and torch.is_grad_enabled():
        return gcn2_residual(spmm(x, graph, value, "sum", config), x_0, weight1, weight2,
                             alpha, beta, config)
    _check("x", x, graph.num_dst, x_0, weight1, weight2)
    return _GCN2Residual.apply(x, x_0, weight1, weight2, float(alpha), float(beta),
                               config or Config(), records_graph(x, x_0, weight1, weight2),
                               graph, value)
