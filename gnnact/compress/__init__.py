"""Compressors for :class:`gnnact.compress_saved_tensors` and the policy that assigns them."""

from gnnact.compress.base import Compressed, Compressor
from gnnact.compress.division import Division, DualPrecisionTensor
from gnnact.compress.mesa import Mesa, RegroupedTensor
from gnnact.compress.policy import EXACT, OUTSIDE, Policy, Rule
from gnnact.compress.quantize import Quantize

__all__ = [
    "EXACT",
    "OUTSIDE",
    "Compressed",
    "Compressor",
    "Division",
    "DualPrecisionTensor",
    "Mesa",
    "Policy",
    "Quantize",
    "RegroupedTensor",
    "Rule",
]
