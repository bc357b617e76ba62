r"""What gnnact's autograd functions keep for backward, and how.

:func:`save_context` stores each tensor a backward needs either

* quantized, as a :class:`~gnnact.quant.PackedTensor` held by the ``ctx`` (the compressed
  case: ``bits`` of 1–8, or 16 for a float32 input), or
* as the tensor itself through ``ctx.save_for_backward`` (``bits`` of 32, or 16 for a 16-bit
  input), so that autograd's version counter still catches an in-place change of a saved
  tensor, exactly as in PyTorch's own layers.

A tensor consumed by several compressed ops in one forward pass (SAGE's ``lin_l`` and
``lin_r``, a GCNII layer's :math:`H^0`) is quantized **once**: :func:`shared_quantize` returns the
same :class:`~gnnact.quant.PackedTensor` for the same tensor object, version and format, until a
backward pass reads that copy (or the graph holding it is freed). The next forward pass then
quantizes afresh with new noise, even for a tensor that stays alive across steps (the input
features): reusing one rounding across steps would correlate the noise of successive gradients
and bias their average.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from gnnact.config import Config
from gnnact.quant import PackedTensor, dequantize, quantize

__all__ = ["load_context", "records_graph", "save_context", "shared_quantize"]

# id(tensor) -> (weakref to the tensor, its _version, format, weakref to the packed copy). Weak
# references only: the cache never keeps a tensor or a packed copy alive.
_CACHE: dict[int, tuple[weakref.ref, int, tuple, weakref.ref]] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _CACHE.get(key)
    if entry is not None and (entry[0] is ref or entry[3] is ref):
        del _CACHE[key]


def _release(packed: PackedTensor) -> None:
    """Stop sharing ``packed``: a backward pass has read it, so its forward pass is over."""
    for key, entry in list(_CACHE.items()):
        if entry[3]() is packed:
            del _CACHE[key]


def records_graph(*tensors: Tensor | None) -> bool:
    """Whether autograd will record an op on ``tensors``: grad mode on and some input needs a
    gradient. Ops skip their context entirely otherwise (evaluation, ``torch.no_grad``)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def shared_quantize(x: Tensor, bits: int, config: Config) -> PackedTensor:
    """:func:`gnnact.quantize` with ``config``'s grouping, sharing one copy per tensor."""
    fmt = (bits, config.group_size, config.per_row)
    key = id(x)
    entry = _CACHE.get(key)
    if entry is not None:
        ref, version, cached_fmt, packed_ref = entry
        packed = packed_ref()
        if ref() is x and version == x._version and cached_fmt == fmt and packed is not None:
            return packed
    packed = quantize(x, bits, config.group_size, per_row=config.per_row,
                      backend=config.backend)
    if not packed.is_passthrough:
        x_ref = weakref.ref(x, lambda r, k=key: _forget(k, r))
        packed_ref = weakref.ref(packed, lambda r, k=key: _forget(k, r))
        _CACHE[key] = (x_ref, x._version, fmt, packed_ref)
    return packed


def save_context(ctx: Any, config: Config, *items: tuple[Tensor | None, int]) -> None:
    """Keep each ``(tensor, bits)`` of ``items`` for backward (see the module docstring).

    Must be called at most once per ``ctx`` (it calls ``ctx.save_for_backward``).
    """
    slots: list[Any] = []
    direct: list[Tensor] = []
    for x, bits in items:
        if x is None:
            slots.append(None)
            continue
        packed = shared_quantize(x, bits, config)
        if packed.is_passthrough and packed.codes is x:
            slots.append(len(direct))
            direct.append(x)
        else:
            slots.append(packed)
    ctx.save_for_backward(*direct)
    ctx.gnnact_context = slots


def load_context(ctx: Any) -> list[Tensor | None]:
    """The tensors :func:`save_context` kept, in order (dequantized where they were packed)."""
    direct = ctx.saved_tensors
    out: list[Tensor | None] = []
    for slot in ctx.gnnact_context:
        if slot is None:
            out.append(None)
        elif isinstance(slot, int):
            out.append(direct[slot])
        else:
            _release(slot)
            out.append(dequantize(slot, backend="auto"))
    return out
