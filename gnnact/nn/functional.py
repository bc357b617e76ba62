r"""Functional calls inside a converted model's forward, routed to gnnact's ops.

PyG's examples and most user code call activations, dropout and linear maps as functions in
``forward`` (``F.relu(x)``, ``x.relu()``, ``F.dropout(x, p, training=self.training)``), not as
modules :func:`gnnact.convert` could swap. Inside the forward pass of a converted model,
:class:`FunctionalOps` (a :class:`~torch.overrides.TorchFunctionMode`) gives these calls what
their module twins get:

=====================================================  ===================================
call                                                   kept for backward
=====================================================  ===================================
``F.relu``, ``torch.relu``, ``Tensor.relu``,           1-bit mask :math:`[X > 0]`
``relu_`` (and ``inplace=True``)
``F.leaky_relu``, ``F.leaky_relu_``                    1-bit mask :math:`[X > 0]`
``F.elu``, ``F.elu_``                                  1-bit mask, :math:`Y` at ``bits``
``F.dropout``, ``torch.dropout`` (their ``training``)  1-bit keep mask
``F.linear``                                           input at ``bits`` (nothing if it is
                                                       rebuilt from BatchNorm/ReLU/dropout
                                                       context)
``F.batch_norm`` (batch statistics)                    input at ``bits``, mean, inverse std
``F.gelu``, ``torch.tanh``, ... (anything else)        what PyTorch saves, at ``bits``
                                                       (the generic pipeline)
=====================================================  ===================================

A call is routed only when autograd records it (grad mode on, an input that needs a gradient)
and its arguments are the plain kind gnnact's ops take; otherwise, and inside gnnact's own
ops, PyTorch's function runs unchanged. Everything else saved in the pass goes through the
generic pipeline (:class:`gnnact.compress_saved_tensors`) that the scope
(:mod:`gnnact.nn.scope`) enters alongside. While :func:`~torch.nn.functional.softmax` or
:func:`~torch.nn.functional.log_softmax` runs, what it saves stays exact: the loss head, by
far the most sensitive context (GACT).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from gnnact import ops
from gnnact.config import Config

__all__ = ["EXACT_FUNCTIONS", "FunctionalOps"]

#: Functions whose saved tensors stay exact (the loss head).
EXACT_FUNCTIONS = frozenset({F.softmax, F.log_softmax, torch.softmax, torch.log_softmax,
                             Tensor.softmax, Tensor.log_softmax})


def _float(x: Any) -> bool:
    # Plain tensors and parameters only: a tensor subclass has its own __torch_function__.
    return (type(x) in (Tensor, nn.Parameter) and x.layout == torch.strided
            and x.is_floating_point())


# The handlers take PyTorch's parameter names (``input`` included), so keyword calls bind.


def _relu(cfg: Callable[[str], Config], input: Tensor, inplace: bool = False) -> Any:
    return ops.relu(input, inplace=inplace) if _float(input) else NotImplemented


def _relu_(cfg: Callable[[str], Config], input: Tensor) -> Any:
    return ops.relu(input, inplace=True) if _float(input) else NotImplemented


def _leaky_relu(cfg: Callable[[str], Config], input: Tensor, negative_slope: float = 0.01,
                inplace: bool = False) -> Any:
    if not _float(input):
        return NotImplemented
    return ops.leaky_relu(input, negative_slope, inplace=inplace)


def _leaky_relu_(cfg: Callable[[str], Config], input: Tensor,
                 negative_slope: float = 0.01) -> Any:
    return _leaky_relu(cfg, input, negative_slope, inplace=True)


def _elu(cfg: Callable[[str], Config], input: Tensor, alpha: float = 1.0,
         inplace: bool = False) -> Any:
    if not _float(input):
        return NotImplemented
    return ops.elu(input, alpha, inplace=inplace, config=cfg("elu"))


def _elu_(cfg: Callable[[str], Config], input: Tensor, alpha: float = 1.0) -> Any:
    return _elu(cfg, input, alpha, inplace=True)


def _dropout(cfg: Callable[[str], Config], input: Tensor, p: float = 0.5, training: bool = True,
             inplace: bool = False) -> Any:
    if not _float(input) or isinstance(p, Tensor):
        return NotImplemented
    return ops.dropout(input, p, training, inplace=inplace)


def _torch_dropout(cfg: Callable[[str], Config], input: Tensor, p: float, train: bool) -> Any:
    return _dropout(cfg, input, p, train)


def _linear(cfg: Callable[[str], Config], input: Tensor, weight: Tensor,
            bias: Tensor | None = None) -> Any:
    if not (_float(input) and _float(weight) and weight.dim() == 2 and input.dim() >= 1
            and (bias is None or _float(bias))):
        return NotImplemented
    return ops.linear(input, weight, bias, cfg("activations"))


def _batch_norm(cfg: Callable[[str], Config], input: Tensor, running_mean: Tensor | None,
                running_var: Tensor | None, weight: Tensor | None = None,
                bias: Tensor | None = None, training: bool = False, momentum: float = 0.1,
                eps: float = 1e-5) -> Any:
    if not _float(input) or input.dim() < 2 or not training or momentum is None:
        return NotImplemented  # (evaluation is an affine map: PyTorch's op keeps only gamma)
    return ops.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                          cfg("activations"))


#: torch function -> handler(config_for, *args, **kwargs); a handler returns NotImplemented
#: for arguments it does not take, and PyTorch's function runs.
HANDLERS: dict[Callable, Callable] = {
    F.relu: _relu, torch.relu: _relu, Tensor.relu: _relu,
    F.relu_: _relu_, torch.relu_: _relu_, Tensor.relu_: _relu_,
    F.leaky_relu: _leaky_relu, F.leaky_relu_: _leaky_relu_,
    F.elu: _elu, F.elu_: _elu_,
    F.dropout: _dropout, torch.dropout: _torch_dropout,
    F.linear: _linear,
    F.batch_norm: _batch_norm,
}


class FunctionalOps(TorchFunctionMode):
    """Routes the functional calls of :data:`HANDLERS` to gnnact's ops (see the module
    docstring) and marks the calls of :data:`EXACT_FUNCTIONS`.

    Args:
        config_for (callable): ``config_for(role) -> Config``: the configuration of a tensor
            with role ``role`` of the module running now (its tag is that module's path).
        exact (list[int]): a one-element counter, raised while an exact function runs (the
            scope's pipeline keeps what is saved meanwhile exact).
    """

    def __init__(self, config_for: Callable[[str], Config], exact: list[int]) -> None:
        super().__init__()
        self.config_for = config_for
        self.exact = exact

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        handler = HANDLERS.get(func)
        if handler is not None and torch.is_grad_enabled():
            out = handler(self.config_for, *args, **kwargs)
            if out is not NotImplemented:
                return out
        if func in EXACT_FUNCTIONS:
            self.exact[0] += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.exact[0] -= 1
        return func(*args, **kwargs)
