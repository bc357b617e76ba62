"""Adaptive bits: the automatic widths of a converted model (:class:`AutoPrecision`, the
default), GACT's explicit sensitivity estimator (:class:`Controller`) and the exact allocator
behind both (:func:`allocate`).

The names load on first use (PEP 562): :mod:`gnnact.nn`'s scope imports
:mod:`gnnact.adaptive.auto`, and :class:`Controller` imports the scope.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gnnact.adaptive.allocator import WIDTHS, allocate, variance_factor
    from gnnact.adaptive.auto import AutoPrecision, TensorWidth
    from gnnact.adaptive.controller import CompressedTensor, Controller

_ATTRIBUTES = {
    "WIDTHS": "gnnact.adaptive.allocator",
    "allocate": "gnnact.adaptive.allocator",
    "variance_factor": "gnnact.adaptive.allocator",
    "AutoPrecision": "gnnact.adaptive.auto",
    "TensorWidth": "gnnact.adaptive.auto",
    "CompressedTensor": "gnnact.adaptive.controller",
    "Controller": "gnnact.adaptive.controller",
}

__all__ = ["WIDTHS", "AutoPrecision", "CompressedTensor", "Controller", "TensorWidth",
           "allocate", "variance_factor"]


def __getattr__(name: str) -> Any:
    if name not in _ATTRIBUTES:
        raise AttributeError(f"module 'gnnact.adaptive' has no attribute {name!r}")
    value = getattr(importlib.import_module(_ATTRIBUTES[name]), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
