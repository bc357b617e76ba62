"""Double backward of gnnact's autograd functions: refused with one clear error.

A compressed op's backward reads activations kept rounded (or rebuilt from other ops'
context), and it computes its gradients outside autograd with in-place arithmetic. Run with
``create_graph=True`` it would record a graph through the dequantized copies, which carry no
history: the second-order gradients would silently miss every term through them (GAT at 32 bits
came out 26–56 % off PyG), or trip over the in-place updates (BatchNorm). Even an exact copy
could not give unbiased higher-order gradients once rounded, so these ops refuse instead.

:func:`first_order_only` marks such a ``backward``. It always computes the gradients without
recording (as ``create_graph=False`` does), so first-order results are unchanged. Under
``create_graph=True`` it attaches them to a node whose backward raises a :class:`RuntimeError`
naming the op: an error only if something actually differentiates through them, and never a
silently missing term. Unlike :func:`torch.autograd.function.once_differentiable`, it attaches
that node even when no incoming gradient requires grad: the second-order terms through the
op's saved context (its weights, its input) would otherwise vanish without a word.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch._C import _functions

__all__ = ["first_order_only", "refusal"]

_Backward = TypeVar("_Backward", bound=Callable[..., Any])


def refusal(op: str) -> str:
    """The error message for differentiating through the backward of gnnact's ``op`` (a
    human-readable name, e.g. ``"GAT attention"``)."""
    return (f"gnnact's {op} does not support double backward (create_graph=True): its backward "
            f"reads context kept compressed and runs outside autograd, so its gradients cannot "
            f"be differentiated again. Compute higher-order gradients with the original PyG / "
            f"PyTorch layer instead of gnnact's twin.")


def _carrier(t: Tensor | None) -> Tensor | None:
    """A tensor with ``t``'s data that requires grad, for the refusing node to hang on (as in
    :func:`~torch.autograd.function.once_differentiable`)."""
    return None if t is None else t.detach().requires_grad_()


def first_order_only(op: str, exact: Callable[[Any], bool] | None = None
                     ) -> Callable[[_Backward], _Backward]:
    """Decorate the ``backward`` of an autograd function whose gradients may not be
    differentiated again: under ``create_graph=True`` they come back attached to a node that
    raises ``RuntimeError(refusal(op))`` when a later backward reaches it.

    Args:
        op (str): the op's name in the error message.
        exact (callable, optional): ``exact(ctx)`` is true for a call whose backward is
            differentiable as written (it reads nothing compressed and records cleanly): that
            call's backward then runs as is, recorded under ``create_graph=True``.
            (default: :obj:`None`, never)

    Example:
        >>> class _Square(torch.autograd.Function):
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         ctx.save_for_backward(x)
        ...         return x * x
        ...     @staticmethod
        ...     @first_order_only("square")
        ...     def backward(ctx, grad):
        ...         (x,) = ctx.saved_tensors
        ...         return 2 * x * grad
        >>> x = torch.ones(2, requires_grad=True)
        >>> (g,) = torch.autograd.grad(_Square.apply(x).sum(), x, create_graph=True)
        >>> g.sum().backward()
        Traceback (most recent call last):
        ...
        RuntimeError: gnnact's square does not support double backward (create_graph=True): ...
    """
    message = refusal(op).encode()

    def decorate(backward: _Backward) -> _Backward:
        @functools.wraps(backward)
        def wrapper(ctx: Any, *grads: Any) -> Any:
            if exact is not None and torch.is_grad_enabled() and exact(ctx):
                return backward(ctx, *grads)
            # Never recorded: first-order results are exactly those of create_graph=False, and
            # the in-place updates in backward cannot clash with a graph.
            with torch.no_grad():
                outputs = backward(ctx, *grads)
            if not torch.is_grad_enabled():  # create_graph=False: nothing to guard
                return outputs
            single = not isinstance(outputs, tuple)
            items = (outputs,) if single else outputs
            # (The node passes an undefined gradient, None, through as None.)
            result = _functions.DelayedError(message, len(items))(*map(_carrier, items))
            if not isinstance(result, tuple):  # one output comes back bare
                result = (result,)
            return result[0] if single else result

        return wrapper  # type: ignore[return-value]

    return decorate
