r"""The quantizer and mask primitives as PyTorch custom operators: ``torch.ops.gnnact.*``.

.. code-block:: text

    gnnact::quantize_groups(x, bits, group_size, backend, seed?, noise?) -> (codes, scales, zeros)
    gnnact::dequantize_groups(codes, scales, zeros, bits, group_size, numel, dtype, backend)
    gnnact::pack_mask_bits(mask, backend) -> data
    gnnact::unpack_mask_bits(data, numel, backend) -> mask

Each runs the backend eager mode runs (:func:`gnnact.quant.backends.select`: the torch
reference, or the CUDA kernels once they agree with it) and returns new tensors, the layouts of
:class:`~gnnact.quant.PackedTensor` and :class:`~gnnact.quant.PackedMask`. To
:func:`torch.compile` each is one operator in the captured graph, not a graph break: a *fake*
kernel gives Dynamo and AOTAutograd its outputs' shapes and dtypes without running it, and
inductor fuses the code around it. What changes from call to call is a tensor argument (the
rounding seed is a one-element ``int64`` tensor), so a new seed does not recompile, and for
the same seed or noise a compiled call computes the same bits as an eager one.

The public API (:func:`gnnact.quantize`, :func:`gnnact.dequantize`, :func:`gnnact.pack_mask`,
:func:`gnnact.unpack_mask`) calls the functions below: under :func:`torch.compile` they call
the operators, eagerly the same implementations directly (an operator's dispatch costs about
35 µs a call on the CPU, a tenth of what the torch path takes to quantize a few thousand values,
and a small graph's step makes dozens of such calls).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from gnnact.quant.backends import select
from gnnact.quant.packed import packed_code_bytes

__all__ = ["dequantize_groups", "pack_mask_bits", "quantize_groups", "unpack_mask_bits"]


def _groups(numel: int, group_size: int) -> int:
    return -(-numel // group_size)


def _operator(name: str, fn: Callable) -> torch.library.CustomOpDef:
    """``fn`` registered as ``torch.ops.gnnact.<name>``, returning new tensors. ``fn`` itself
    stays a plain function, the one eager calls take: the registered object dispatches."""
    return torch.library.custom_op(f"gnnact::{name}", fn, mutates_args=())


# ---------------------------------------------------------------------------- quantize

def _quantize_groups(x: Tensor, bits: int, group_size: int, backend: str, seed: Tensor | None,
                     noise: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    impl = select(backend, x.device, bits)
    return impl.quantize_groups(x, bits, group_size, noise=noise,
                                seed=None if seed is None else int(seed.item()))


_quantize_groups_op = _operator("quantize_groups", _quantize_groups)


@_quantize_groups_op.register_fake
def _(x: Tensor, bits: int, group_size: int, backend: str, seed: Tensor | None,
      noise: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    groups = _groups(x.numel(), group_size)
    return (x.new_empty((groups, packed_code_bytes(group_size, bits)), dtype=torch.uint8),
            x.new_empty(groups, dtype=torch.float32), x.new_empty(groups, dtype=torch.float32))


def quantize_groups(x: Tensor, bits: int, group_size: int, backend: str, seed: Tensor | None,
                    noise: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    r"""Codes ``uint8 [n_g, ceil(G b / 8)]``, scales and zeros ``float32 [n_g]`` of the flat
    ``x`` (non-empty, ``bits`` of 1–8, ``group_size`` at most ``x.numel()``), rounded with
    ``noise`` (float32, one per element) or the noise of ``seed`` (``int64 [1]``): what
    :func:`gnnact.quantize` keeps."""
    op = torch.ops.gnnact.quantize_groups if torch.compiler.is_compiling() else _quantize_groups
    return op(x, bits, group_size, backend, seed, noise)


# ---------------------------------------------------------------------------- dequantize

def _dequantize_groups(codes: Tensor, scales: Tensor, zeros: Tensor, bits: int, group_size: int,
                       numel: int, dtype: torch.dtype, backend: str) -> Tensor:
    impl = select(backend, codes.device, bits)
    return impl.dequantize_groups(codes, scales, zeros, bits, group_size, numel, dtype)


_dequantize_groups_op = _operator("dequantize_groups", _dequantize_groups)


@_dequantize_groups_op.register_fake
def _(codes: Tensor, scales: Tensor, zeros: Tensor, bits: int, group_size: int, numel: int,
      dtype: torch.dtype, backend: str) -> Tensor:
    return codes.new_empty(numel, dtype=dtype)


def dequantize_groups(codes: Tensor, scales: Tensor, zeros: Tensor, bits: int, group_size: int,
                      numel: int, dtype: torch.dtype, backend: str) -> Tensor:
    r"""The flat ``numel`` values :math:`\hat h = q s + Z` of :func:`quantize_groups`' output,
    as ``dtype``."""
    op = (torch.ops.gnnact.dequantize_groups if torch.compiler.is_compiling()
          else _dequantize_groups)
    return op(codes, scales, zeros, bits, group_size, numel, dtype, backend)


# ---------------------------------------------------------------------------- masks

def _pack_mask_bits(mask: Tensor, backend: str) -> Tensor:
    return select(backend, mask.device).pack_mask_bits(mask)


_pack_mask_bits_op = _operator("pack_mask_bits", _pack_mask_bits)


@_pack_mask_bits_op.register_fake
def _(mask: Tensor, backend: str) -> Tensor:
    return mask.new_empty(_groups(mask.numel(), 8), dtype=torch.uint8)


def pack_mask_bits(mask: Tensor, backend: str) -> Tensor:
    r"""``uint8 [ceil(n / 8)]``: element :math:`i` of the flat boolean ``mask`` (non-empty) is
    bit :math:`i \bmod 8` of byte :math:`\lfloor i/8 \rfloor`."""
    op = torch.ops.gnnact.pack_mask_bits if torch.compiler.is_compiling() else _pack_mask_bits
    return op(mask, backend)


def _unpack_mask_bits(data: Tensor, numel: int, backend: str) -> Tensor:
    return select(backend, data.device).unpack_mask_bits(data, numel)


_unpack_mask_bits_op = _operator("unpack_mask_bits", _unpack_mask_bits)


@_unpack_mask_bits_op.register_fake
def _(data: Tensor, numel: int, backend: str) -> Tensor:
    return data.new_empty(numel, dtype=torch.bool)


def unpack_mask_bits(data: Tensor, numel: int, backend: str) -> Tensor:
    """The flat ``torch.bool`` mask of ``numel`` elements :func:`pack_mask_bits` packed."""
    op = (torch.ops.gnnact.unpack_mask_bits if torch.compiler.is_compiling()
          else _unpack_mask_bits)
    return op(data, numel, backend)
