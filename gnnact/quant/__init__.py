"""Quantizer core: the packed format, the torch reference path and the public API."""

from gnnact.quant.core import DEFAULT_GROUP_SIZE, dequantize, pack_mask, quantize, unpack_mask
from gnnact.quant.packed import QUANT_BITS, SUPPORTED_BITS, PackedMask, PackedTensor

__all__ = [
    "DEFAULT_GROUP_SIZE",
    "QUANT_BITS",
    "SUPPORTED_BITS",
    "PackedMask",
    "PackedTensor",
    "dequantize",
    "pack_mask",
    "quantize",
    "unpack_mask",
]
