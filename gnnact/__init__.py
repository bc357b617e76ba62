"""gnnact: activation compressed training for graph neural networks in PyTorch.

What autograd keeps for backward is stored stochastically rounded to 1–8 bits and bit-packed,
and restored just before backward needs it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# The names below load on first use (PEP 562): ``import gnnact`` itself imports neither torch
# nor PyG, so that the command line answers ``--help`` and argument errors at once.
if TYPE_CHECKING:  # what type checkers and IDEs see
    from gnnact import adaptive, compress, memory, nn, ops
    from gnnact.adaptive import Controller
    from gnnact.config import Config
    from gnnact.hooks import compress_saved_tensors
    from gnnact.nn import convert, summary
    from gnnact.planner import plan
    from gnnact.quant import (
        PackedMask,
        PackedTensor,
        dequantize,
        pack_mask,
        quantize,
        unpack_mask,
    )

__version__ = "0.1.0"

_SUBMODULES = ("adaptive", "compress", "distributed", "memory", "nn", "ops")
_ATTRIBUTES = {
    "Config": "gnnact.config",
    "Controller": "gnnact.adaptive",
    "PackedMask": "gnnact.quant",
    "PackedTensor": "gnnact.quant",
    "compress_saved_tensors": "gnnact.hooks",
    "convert": "gnnact.nn",
    "dequantize": "gnnact.quant",
    "pack_mask": "gnnact.quant",
    "plan": "gnnact.planner",
    "quantize": "gnnact.quant",
    "summary": "gnnact.nn",
    "unpack_mask": "gnnact.quant",
}

__all__ = [
    "Config",
    "Controller",
    "PackedMask",
    "PackedTensor",
    "__version__",
    "adaptive",
    "compress",
    "compress_saved_tensors",
    "convert",
    "dequantize",
    "memory",
    "nn",
    "ops",
    "pack_mask",
    "plan",
    "quantize",
    "summary",
    "unpack_mask",
]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        value = importlib.import_module(f"gnnact.{name}")
    elif name in _ATTRIBUTES:
        value = getattr(importlib.import_module(_ATTRIBUTES[name]), name)
    else:
        raise AttributeError(f"module 'gnnact' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
