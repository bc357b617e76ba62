r"""Batch normalisation with statistics over the nodes of all ranks (any backend, gloo included:
PyTorch's ``SyncBatchNorm`` runs on GPUs only).

For rank :math:`r`'s rows :math:`X_r` of a partition of the :math:`N = \sum_r n_r` rows,
two sums over the ranks (``all_reduce``) give the global statistics, in two passes as on one
process (no :math:`E[x^2] - E[x]^2` cancellation):

.. math::
    \mu = \frac{1}{N} \sum_r \sum_{i} x_{ri}, \qquad
    \sigma^2 = \frac{1}{N} \sum_r \sum_i (x_{ri} - \mu)^2, \qquad
    y_{ri} = \gamma \hat x_{ri} + \beta, \quad \hat x_{ri} = \frac{x_{ri} - \mu}
    {\sqrt{\sigma^2 + \epsilon}}.

Backward sends two more sums, :math:`\sum \nabla y` and :math:`\sum \nabla y \odot \hat x`
(one ``all_reduce`` of :math:`2C` values):

.. math::
    \nabla x_{ri} = \frac{\gamma}{\sqrt{\sigma^2 + \epsilon}} \Big( \nabla y_{ri}
    - \frac{1}{N} \sum \nabla y - \hat x_{ri} \frac{1}{N} \sum \nabla y \odot \hat x \Big),

while :math:`\nabla\gamma` and :math:`\nabla\beta` stay local sums (the gradient all-reduce of
the training step adds them up). Running statistics are updated as
:func:`torch.nn.functional.batch_norm` does, with the global :math:`\mu` and the unbiased
:math:`\sigma^2 N / (N - 1)`, identically on every rank.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

__all__ = ["sync_batch_norm"]


def _sum(tensor: Tensor, group: dist.ProcessGroup | None) -> Tensor:
    dist.all_reduce(tensor, group=group)
    return tensor


class _SyncBatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None, eps: float,
                group: dist.ProcessGroup | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        stats = _sum(torch.cat([x.sum(0), x.new_full((1,), x.size(0))]), group)
        count = stats[-1]
        mean = stats[:-1] / count
        centred = x - mean
        var = _sum((centred * centred).sum(0), group) / count
        invstd = (var + eps).rsqrt()
        x_hat = centred * invstd
        y = x_hat if weight is None else x_hat * weight
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(x_hat, invstd, weight)
        ctx.group, ctx.count, ctx.has_bias = group, float(count), bias is not None
        ctx.mark_non_differentiable(mean, var, count)
        return y, mean, var, count

    @staticmethod
    def backward(ctx: Any, grad: Tensor, *_: Any) -> tuple:
        x_hat, invstd, weight = ctx.saved_tensors
        grad_bias, grad_weight = grad.sum(0), (grad * x_hat).sum(0)  # local: summed later
        sum_dy, sum_dy_xhat = _sum(torch.cat([grad_bias, grad_weight]), ctx.group).chunk(2)
        scale = invstd if weight is None else invstd * weight
        grad_x = scale * (grad - sum_dy / ctx.count - x_hat * (sum_dy_xhat / ctx.count))
        return (grad_x, None if weight is None else grad_weight,
                grad_bias if ctx.has_bias else None, None, None)


def sync_batch_norm(module: nn.modules.batchnorm._BatchNorm, x: Tensor,
                    group: dist.ProcessGroup | None = None) -> Tensor:
    r"""``module(x)`` with the batch statistics of all ranks' rows (module docstring): what
    :class:`~gnnact.distributed.DistributedGNN` runs for every batch norm of the model.

    Where ``module`` uses its running statistics (eval mode with ``track_running_stats``) each
    row is normalised on its own and the module runs as is.

    Args:
        module (torch.nn.BatchNorm1d): the layer (its parameters, buffers, ``eps`` and
            ``momentum``).
        x (torch.Tensor): this rank's rows, ``[n_r, C]``.
        group (torch.distributed.ProcessGroup, optional): the ranks sharing the rows.
            (default: the default group)

    Returns:
        torch.Tensor: ``[n_r, C]``.

    Example:
        >>> bn = torch.nn.BatchNorm1d(16)
        >>> y = gnnact.distributed.sync_batch_norm(bn, x_owned)  # doctest: +SKIP
    """
    if not module.training and module.track_running_stats:
        return type(module).forward(module, x)
    if x.dim() != 2:
        raise ValueError(f"sync_batch_norm takes [num_nodes, channels] rows, got shape "
                         f"{tuple(x.shape)}")
    y, mean, var, count = _SyncBatchNorm.apply(x, module.weight, module.bias, module.eps,
                                               group)
    if module.training and module.track_running_stats:
        with torch.no_grad():
            module.num_batches_tracked.add_(1)
            factor = (1.0 / float(module.num_batches_tracked) if module.momentum is None
                      else module.momentum)
            n = float(count)
            unbiased = var * (n / max(n - 1.0, 1.0))
            module.running_mean.mul_(1 - factor).add_(mean.to(module.running_mean.dtype),
                                                      alpha=factor)
            module.running_var.mul_(1 - factor).add_(unbiased.to(module.running_var.dtype),
                                                     alpha=factor)
    return y
