r"""What gnnact's autograd functions keep for backward, and how.

:func:`save_context` keeps each tensor a backward needs either

* quantized, as a :class:`~gnnact.quant.PackedTensor` (``bits`` of 1–8, or 16 for a float32
  input), or as a 1-bit :class:`~gnnact.quant.PackedMask`, or
* as the tensor itself (``bits`` of 32, or 16 for a 16-bit input).

Either way every tensor goes through ``ctx.save_for_backward`` and only metadata stays on the
``ctx``. So autograd frees the compressed context when backward has used it, exactly as it frees
its own saved tensors (a ``ctx`` attribute would live on as long as the graph object does: in a
training loop, through the next forward pass), and its version counter still catches an in-place
change of a tensor kept as is.

A tensor consumed by several compressed ops in one forward pass (SAGE's ``lin_l`` and
``lin_r``, a GCNII layer's :math:`H^0`) is quantized **once**: :func:`shared_quantize` returns the
same packed tensors for the same tensor object, version and format, until a backward pass reads
them (or autograd frees them). The next forward pass then quantizes afresh with new noise, even
for a tensor that stays alive across steps (the input features): reusing one rounding across
steps would correlate the noise of successive gradients and bias their average.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import Tensor

from gnnact.config import Config
from gnnact.quant import PackedMask, PackedTensor, dequantize, quantize, unpack_mask

__all__ = ["load_context", "records_graph", "save_context", "shared_quantize"]

# id(tensor) -> (weakref to the tensor, its _version, format, weakrefs to the packed tensors,
# the PackedTensor's metadata). Weak references only: the cache never keeps anything alive;
# the packed tensors live exactly as long as autograd keeps them for some backward.
_CACHE: dict[int, tuple] = {}


def _forget(key: int, ref: weakref.ref) -> None:
    entry = _CACHE.get(key)
    if entry is not None and entry[0] is ref:
        del _CACHE[key]


def _release(codes: Tensor) -> None:
    """Stop sharing the packed copy whose codes are ``codes``: a backward pass has read it."""
    for key, entry in list(_CACHE.items()):
        if entry[3][0]() is codes:
            del _CACHE[key]


def records_graph(*tensors: Tensor | None) -> bool:
    """Whether autograd will record an op on ``tensors``: grad mode on and some input needs a
    gradient. Ops skip their context entirely otherwise (evaluation, ``torch.no_grad``)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def shared_quantize(x: Tensor, bits: int, config: Config) -> PackedTensor:
    """:func:`gnnact.quantize` with ``config``'s grouping, sharing one copy per tensor."""
    fmt = (bits, config.group_size, config.per_row, config.backend)
    key = id(x)
    entry = _CACHE.get(key)
    if entry is not None:
        ref, version, cached_fmt, refs, meta = entry
        parts = [r() for r in refs]
        if (ref() is x and version == x._version and cached_fmt == fmt
                and all(t is not None for t in parts)):
            return PackedTensor(*parts, *meta)
    packed = quantize(x, bits, config.group_size, per_row=config.per_row,
                      backend=config.backend)
    if not packed.is_passthrough:
        x_ref = weakref.ref(x, lambda r, k=key: _forget(k, r))
        refs = tuple(weakref.ref(t) for t in (packed.codes, packed.scales, packed.zeros))
        meta = (packed.bits, packed.shape, packed.dtype, packed.group_size)
        _CACHE[key] = (x_ref, x._version, fmt, refs, meta)
    return packed


Entry = tuple[Tensor | None, int] | PackedMask | Tensor | None


def save_context(ctx: Any, config: Config, *items: Entry) -> None:
    """Keep ``items`` for backward (see the module docstring); :func:`load_context` returns them
    in order.

    Each item is ``(tensor, bits)`` (quantized through :func:`shared_quantize`, or kept as is
    for a pass-through width; ``tensor`` may be ``None``), a :class:`~gnnact.quant.PackedMask`
    (returned unpacked, as ``torch.bool``), a tensor (kept as is) or ``None``. Call it at most
    once per ``ctx``: it calls ``ctx.save_for_backward``.
    """
    tensors: list[Tensor] = []
    slots: list[tuple | None] = []
    for item in items:
        if isinstance(item, tuple):
            x, bits = item
            item = None if x is None else shared_quantize(x, bits, config)
            if isinstance(item, PackedTensor) and item.is_passthrough and item.codes is x:
                item = x
        if item is None:
            slots.append(None)
        elif isinstance(item, Tensor):
            slots.append(("tensor", len(tensors)))
            tensors.append(item)
        elif isinstance(item, PackedMask):
            slots.append(("mask", len(tensors), item.shape))
            tensors.append(item.data)
        else:
            parts = item.tensors()
            slots.append(("packed", len(tensors), len(parts),
                          (item.bits, item.shape, item.dtype, item.group_size)))
            tensors.extend(parts)
    ctx.save_for_backward(*tensors)
    ctx.gnnact_slots = slots


def load_context(ctx: Any) -> list[Tensor | None]:
    """What :func:`save_context` kept, in order: dequantized, unpacked or as is."""
    saved = ctx.saved_tensors
    out: list[Tensor | None] = []
    for slot in ctx.gnnact_slots:
        if slot is None:
            out.append(None)
        elif slot[0] == "tensor":
            out.append(saved[slot[1]])
        elif slot[0] == "mask":
            out.append(unpack_mask(PackedMask(saved[slot[1]], slot[2])))
        else:
            _, start, count, meta = slot
            parts = list(saved[start:start + count])
            if count == 1:  # a 16-bit copy: no scales or zeros
                parts += [None, None]
            _release(parts[0])
            out.append(dequantize(PackedTensor(*parts, *meta)))
    return out
