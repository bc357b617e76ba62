"""Names and bit widths, without importing torch: the command line parses its arguments
against these before it loads anything heavy (``gnnact --help`` answers in well under a
second)."""

from __future__ import annotations

__all__ = ["BYTE_ALIGNED_BITS", "MODELS", "QUANT_BITS", "STYLES", "SUPPORTED_BITS"]

#: Bit widths stored as packed integer codes (a dense LSB-first bit stream per group).
QUANT_BITS = (1, 2, 3, 4, 5, 6, 7, 8)
#: The widths whose codes never straddle a byte; the CUDA kernels implement these.
BYTE_ALIGNED_BITS = (1, 2, 4, 8)
#: Every accepted bit width: the packed ones plus the 16/32-bit pass-through.
SUPPORTED_BITS = (*QUANT_BITS, 16, 32)
#: The models of :func:`gnnact.models.build`.
MODELS = ("gcn", "sage", "gat", "gcnii")
#: The ways :func:`gnnact.models.build` writes a model's forward.
STYLES = ("module", "functional")
