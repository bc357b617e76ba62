"""Shared base of gnnact's drop-in modules."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from gnnact.config import Config
from gnnact.ops import library
from gnnact.ops.state import inlined_only, under_dynamo

__all__ = ["_Compressed", "same_shape", "torchscript_unsupported"]


def torchscript_unsupported(module: nn.Module) -> TypeError:
    """The error for compiling a gnnact layer with TorchScript, naming the layer."""
    cls = type(module)
    return TypeError(f"TorchScript is not supported by gnnact layers: cannot script {module!r} "
                     f"({cls.__module__}.{cls.__qualname__}): its forward runs gnnact's autograd "
                     f"Functions on compressed tensors, in eager mode only. Script the model "
                     f"as it was before gnnact.convert instead")


def same_shape(x: torch.Tensor, *args: Any, **kwargs: Any) -> list[int]:
    """``_compiled_shape`` of a layer whose output has its input's shape."""
    return list(x.shape)


def _check_config(config: object) -> None:
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a gnnact.Config, got {type(config).__name__}")


@torch.compiler.disable
def _call_eagerly(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    return nn.Module.__call__(module, *args, **kwargs)


class _Compressed:
    """Mixin: a ``config`` attribute, and in-place adoption of the plain PyTorch module.

    The ``repr`` is the parent class's, unchanged (the storage is what :func:`gnnact.summary`
    reports).
    """

    config: Config
    #: Raised by a pass of the layer's model that runs as PyTorch's (every tensor under the
    #: floor, :meth:`gnnact.nn.scope.Scope.small_pass`): the layer then runs as the class it
    #: twins (:attr:`_twinned_forward`; a compiled frame traces it, for inductor to compile).
    _gnnact_as_pytorch: bool = False
    #: The ``forward`` of the class this one twins (PyG's or PyTorch's), or ``None``.
    _twinned_forward: Callable[..., Any] | None = None
    #: Whether an eager pass run as PyTorch's still calls this class's own ``forward``.
    _own_forward_when_small: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        plain = (base.__dict__.get("forward") for base in cls.__mro__
                 if not issubclass(base, _Compressed) and issubclass(base, nn.Module))
        # (A user's subclass with a forward of its own keeps it: none to run instead.)
        own = any("forward" in base.__dict__ and not base.__module__.startswith("gnnact.")
                  for base in cls.__mro__ if issubclass(base, _Compressed))
        cls._twinned_forward = None if own else next((f for f in plain if f is not None), None)

    def _init_gnnact(self, config: Config | None) -> None:
        _check_config(config)
        self.config = config or Config()
        library.bind(self)  # type: ignore[arg-type]

    @classmethod
    def supports(cls, module: nn.Module) -> bool:
        """Whether ``module`` (an instance of the parent class) can be converted."""
        return True

    @classmethod
    def _adopt(cls, module: nn.Module, config: Config | None) -> nn.Module:
        """Turn an instance of the parent class into this class in place: same object, same
        parameters and buffers (so optimizers and checkpoints keep working)."""
        _check_config(config)  # before the swap: a bad config leaves the module as it was
        module.__class__ = cls
        module._init_gnnact(config)
        return module

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)  # type: ignore[misc]
        library.bind(self)  # type: ignore[arg-type]  # (a copy's handle is its own)

    @inlined_only
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # In a pass run as PyTorch's, the twinned class's forward (the pass flags only layers
        # that have one and no hooks but the scope's, which do nothing inside a pass); traced
        # inside a compiled frame. Otherwise, inside a compiled frame: one custom operator
        # (gnnact.ops.library), which calls this very module eagerly at run time.
        compiling = torch.compiler.is_compiling()
        if self._gnnact_as_pytorch and (compiling or not self._own_forward_when_small):
            return self._twinned_forward(*args, **kwargs)  # type: ignore[misc]
        if compiling:
            out = library.call_module(self, args, kwargs)  # type: ignore[arg-type]
            if out is not NotImplemented:
                return out
        if compiling or under_dynamo():
            # A call the operator does not take (a bipartite pair, say), or one a graph break
            # left to eager mode inside a compiled region: made eagerly, Dynamo off (it would
            # compile the layer's forward in pieces between gnnact's ops, once per size).
            return _call_eagerly(self, args, kwargs)
        return super().__call__(*args, **kwargs)  # type: ignore[misc]

    def _compiled_shape(self, *args: Any, **kwargs: Any) -> list[int] | None:
        """The shape of this layer's output for these arguments, for
        ``gnnact::call``'s fake kernel; ``None``: not called that way."""
        return None

    def __prepare_scriptable__(self) -> nn.Module:
        # torch.jit.script calls this on the module and on each of its submodules before
        # compiling anything: one clear error instead of a failure deep inside an op.
        raise torchscript_unsupported(self)  # type: ignore[arg-type]
