"""Shared base of gnnact's drop-in modules."""

from __future__ import annotations

from torch import nn

from gnnact.config import Config

__all__ = ["_Compressed"]


class _Compressed:
    """Mixin: a ``config`` attribute, and in-place adoption of the plain PyTorch module."""

    config: Config

    def _init_gnnact(self, config: Config | None) -> None:
        self.config = config or Config()

    @classmethod
    def supports(cls, module: nn.Module) -> bool:
        """Whether ``module`` (an instance of the parent class) can be converted."""
        return True

    @classmethod
    def _adopt(cls, module: nn.Module, config: Config | None) -> nn.Module:
        """Turn an instance of the parent class into this class in place: same object, same
        parameters and buffers (so optimizers and checkpoints keep working)."""
        module.__class__ = cls
        module._init_gnnact(config)
        return module

    def extra_repr(self) -> str:
        base = super().extra_repr()  # type: ignore[misc]
        return f"{base}, bits={self.config.bits}" if base else f"bits={self.config.bits}"
