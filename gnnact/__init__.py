"""gnnact: activation compressed training for graph neural networks in PyTorch.

What autograd keeps for backward is stored stochastically rounded to 1–8 bits and bit-packed,
and restored just before backward needs it.
"""

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
