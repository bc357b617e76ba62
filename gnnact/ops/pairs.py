r"""Scores of node pairs for link prediction, keeping the node embeddings once.

PyG's :class:`~torch_geometric.nn.models.InnerProductDecoder` scores a pair :math:`(s, t)` by
:math:`v = \langle \mathbf{z}_s, \mathbf{z}_t \rangle`, written
``(z[src] * z[dst]).sum(dim=1)``: autograd keeps both gathered operands, :math:`2 E d` values
for :math:`E` pairs, where :math:`\mathbf{Z}` itself has :math:`N d`; a GAE's step scores its
positive and its negative pairs, four such tensors. :func:`pair_dot` keeps
:math:`\mathbf{Z}` once, at the op's width, for every set of pairs of the call, and the pair
indices by reference:

.. math::
    v_e = \langle \mathbf{z}_{s_e}, \mathbf{z}_{t_e} \rangle, \qquad
    \nabla \mathbf{z}_i = \sum_{e: s_e = i} \nabla v_e \, \hat{\mathbf{z}}_{t_e}
    + \sum_{e: t_e = i} \nabla v_e \, \hat{\mathbf{z}}_{s_e},

unbiased (linear in :math:`\hat{\mathbf{Z}}`).

:func:`log_sigmoid` computes the two terms of PyG's reconstruction loss,
:math:`\log(\sigma(v) + \epsilon)` and :math:`\log(1 - \sigma(v) + \epsilon)`, as PyG writes
them (the same values), keeping :math:`v` exactly: one value per pair, where autograd keeps two
(:math:`\sigma(v)` for the sigmoid, :math:`\sigma(v) + \epsilon` for the log). The loss is the
most sensitive context there is (GACT): it stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from gnnact.config import Config
from gnnact.ops.context import input_bits, load_context, records_graph, save_context
from gnnact.ops.higher_order import first_order_only
from gnnact.ops.state import eager_op

__all__ = ["log_sigmoid", "pair_dot"]


def _dot(z: Tensor, src: Tensor, dst: Tensor) -> Tensor:
    return (z[src] * z[dst]).sum(dim=1)  # (PyG's expression: the same values)


class _PairDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: Tensor, config: Config, *indices: Tensor) -> tuple[Tensor, ...]:
        save_context(ctx, config, (z, input_bits(z, config)), *indices)
        return tuple(_dot(z, indices[i], indices[i + 1]) for i in range(0, len(indices), 2))

    @staticmethod
    @first_order_only("pair scores (gnnact.ops.pair_dot)")
    def backward(ctx: Any, *grads: Tensor) -> tuple:
        z_hat, *indices = load_context(ctx)
        grad_z = torch.zeros_like(z_hat)
        for grad, i in zip(grads, range(0, len(indices), 2), strict=True):
            src, dst = indices[i], indices[i + 1]
            grad = grad.unsqueeze(1).to(z_hat.dtype)
            grad_z.index_add_(0, src, grad * z_hat[dst])
            grad_z.index_add_(0, dst, grad * z_hat[src])
        return (grad_z, None, *(None for _ in indices))


def _check_pairs(z: Tensor, edge_index: Tensor) -> None:
    if z.dim() != 2:
        raise ValueError(f"z must be [num_nodes, channels], got shape {tuple(z.shape)}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2 or edge_index.is_floating_point():
        raise ValueError(f"edge_index must be an integer tensor [2, num_pairs], got "
                         f"{edge_index.dtype} of shape {tuple(edge_index.shape)}")


@eager_op
def pair_dot(z: Tensor, edge_index: Sequence[Tensor], config: Config | None = None
             ) -> tuple[Tensor, ...]:
    r""":math:`v_e = \langle \mathbf{z}_{s_e}, \mathbf{z}_{t_e} \rangle` for each set of pairs
    in ``edge_index`` (integer tensors ``[2, E_k]``, row 0 the sources), keeping ``z`` once at
    ``config``'s width and the indices by reference (see the module docstring).

    Returns:
        tuple[torch.Tensor, ...]: the scores ``[E_k]`` of each set, in order.

    Example:
        >>> z = torch.randn(100, 16, requires_grad=True)
        >>> pos, neg = torch.randint(0, 100, (2, 500)), torch.randint(0, 100, (2, 500))
        >>> config = gnnact.Config(bits=4, min_bytes=0)  # (z is 6 kB: under the default floor)
        >>> v_pos, v_neg = gnnact.ops.pair_dot(z, [pos, neg], config)
        >>> torch.allclose(v_pos, (z[pos[0]] * z[pos[1]]).sum(dim=1))
        True
        >>> # z once, at 4 bits with its groups' ranges (PyG: four [500, 16] float32 tensors)
        >>> gnnact.memory.saved_bytes([v_pos, v_neg], exclude=[pos, neg])
        1056
    """
    for pairs in edge_index:
        _check_pairs(z, pairs)
    if not records_graph(z):
        return tuple(_dot(z, pairs[0], pairs[1]) for pairs in edge_index)
    indices = [t for pairs in edge_index for t in (pairs[0], pairs[1])]
    return _PairDot.apply(z, config or Config(), *indices)


class _LogSigmoid(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, v: Tensor, eps: float, complement: bool) -> Tensor:
        ctx.save_for_backward(v)
        ctx.eps, ctx.complement = eps, complement
        s = torch.sigmoid(v)
        return torch.log((1 - s if complement else s) + eps)  # (as PyG writes it)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        (v,) = ctx.saved_tensors
        s = torch.sigmoid(v)
        slope = s * (1 - s)
        if ctx.complement:
            return -grad * slope / (1 - s + ctx.eps), None, None
        return grad * slope / (s + ctx.eps), None, None


@eager_op
def log_sigmoid(v: Tensor, eps: float, complement: bool = False) -> Tensor:
    r""":math:`\log(\sigma(v) + \epsilon)`, or with ``complement``
    :math:`\log(1 - \sigma(v) + \epsilon)`, elementwise, keeping :math:`v` exactly:

    .. math::
        \nabla v = \nabla y \, \frac{\sigma(v)(1 - \sigma(v))}{\sigma(v) + \epsilon}
        \quad\text{or}\quad
        -\nabla y \, \frac{\sigma(v)(1 - \sigma(v))}{1 - \sigma(v) + \epsilon}.

    Example:
        >>> v = torch.randn(1000, requires_grad=True).sinh()
        >>> y = gnnact.ops.pairs.log_sigmoid(v, 1e-15)
        >>> torch.equal(y, torch.log(torch.sigmoid(v) + 1e-15))
        True
        >>> gnnact.memory.saved_bytes(y.sum())  # v, once (autograd: sigmoid(v) and its sum)
        4000
    """
    if not records_graph(v):
        s = torch.sigmoid(v)
        return torch.log((1 - s if complement else s) + eps)
    return _LogSigmoid.apply(v, eps, complement)
