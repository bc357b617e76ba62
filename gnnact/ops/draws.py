"""Dropout's keep-mask, drawn as :func:`torch.nn.functional.dropout` draws it on each device,
so that a seeded compressed run reproduces PyTorch's (and PyG's) masks.

On the CPU, ``F.dropout`` fills a tensor with ``bernoulli_(1 - p)``: the generator's stream
does not depend on the dtype, so booleans get the same draws without a full-size float mask.
On a CUDA device ``F.dropout`` runs the fused ``native_dropout`` kernel, whose draws depend on
the tensor's size, dtype and alignment and differ from ``bernoulli_``'s: its own mask is taken.
That kernel also writes an output of the input's size; for a float32 input it runs on a
float16 stand-in of the same size where that draws the same mask (checked once per device),
which halves that transient: at a layer's dropout it is the largest block alive.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

__all__ = ["keep_mask"]


def keep_mask(like: Tensor, p: float, dtype: torch.dtype = torch.bool) -> Tensor:
    r"""The keep-mask :math:`M \sim \mathrm{Bernoulli}(1 - p)` that ``F.dropout(like, p)``
    draws (``0 < p < 1``), as ``dtype``: the same draws from the same generator state, which
    they advance as ``F.dropout`` does.

    On a CUDA device this runs ``native_dropout`` on a tensor of ``like``'s size (only its
    size, dtype and alignment matter): a transient output beside the mask, in float16 where
    ``like`` is float32 and the kernel draws the same for both (:func:`_stand_in`).

    Example:
        >>> x = torch.ones(1000)
        >>> _ = torch.manual_seed(0)
        >>> mask = keep_mask(x, 0.5)
        >>> _ = torch.manual_seed(0)
        >>> torch.equal(mask, torch.nn.functional.dropout(x, 0.5) > 0)
        True
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1) to draw a mask, got {p}")
    with torch.no_grad():
        if like.is_cuda and like.numel() > 0:  # where F.dropout takes the fused kernel
            mask = torch.native_dropout(_stand_in(like), p, True)[1]
            return mask if dtype == torch.bool else mask.to(dtype)
        return torch.empty_like(like, dtype=dtype).bernoulli_(1 - p)


def _stand_in(like: Tensor) -> Tensor:
    """What ``native_dropout`` runs on to draw ``like``'s mask: a fresh float16 tensor of its
    shape where ``like`` is float32, contiguous and 16-byte aligned (as fresh tensors are, so
    both get the kernel's widest loads) and the two draw the same on this device; else
    ``like``. Float16's comparison type is float32's (float64's is not), so the same uniform
    draws give the same mask wherever the kernel reads both alike."""
    if (like.dtype != torch.float32 or not like.is_contiguous() or like.data_ptr() % 16
            or torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing()
            or not _float16_draws_match(like.device.index or 0)):
        return like
    return torch.empty(like.shape, dtype=torch.float16, device=like.device)


# Cached per process: a fact about this build of PyTorch and this device, not about a model.
@functools.cache
def _float16_draws_match(device_index: int) -> bool:
    """Whether ``native_dropout`` draws the same mask for a float32 and a float16 tensor of
    one size on this device, tried on sizes that take its 4-, 2- and 1-wide paths over several
    grid strides; the generator's state is put back afterwards."""
    device = torch.device("cuda", device_index)
    state = torch.cuda.get_rng_state(device)
    try:
        for numel in ((1 << 22) + 4, (1 << 20) + 2, (1 << 20) + 1):
            masks = []
            for dtype in (torch.float32, torch.float16):
                torch.cuda.set_rng_state(state, device)
                masks.append(torch.native_dropout(
                    torch.zeros(numel, dtype=dtype, device=device), 0.5, True)[1])
            if not torch.equal(*masks):
                return False
        return True
    finally:
        torch.cuda.set_rng_state(state, device)
