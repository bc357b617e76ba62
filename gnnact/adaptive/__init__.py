"""Adaptive bits: sensitivity-driven per-tensor widths (:class:`Controller`) and the exact
allocator behind it (:func:`allocate`)."""

from gnnact.adaptive.allocator import WIDTHS, allocate, variance_factor
from gnnact.adaptive.controller import CompressedTensor, Controller

__all__ = ["WIDTHS", "CompressedTensor", "Controller", "allocate", "variance_factor"]
