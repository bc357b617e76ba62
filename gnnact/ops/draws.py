"""Dropout's keep-mask, drawn as :func:`torch.nn.functional.dropout` draws it on each device,
so that a seeded compressed run reproduces PyTorch's (and PyG's) masks.

On the CPU, ``F.dropout`` fills a tensor with ``bernoulli_(1 - p)``: the generator's stream
does not depend on the dtype, so booleans get the same draws without a full-size float mask.
On a CUDA device ``F.dropout`` runs the fused ``native_dropout`` kernel, whose draws depend on
the tensor's size, dtype and alignment and differ from ``bernoulli_``'s: its own mask is taken.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["keep_mask"]


def keep_mask(like: Tensor, p: float, dtype: torch.dtype = torch.bool) -> Tensor:
    r"""The keep-mask :math:`M \sim \mathrm{Bernoulli}(1 - p)` that ``F.dropout(like, p)``
    draws (``0 < p < 1``), as ``dtype``: the same draws from the same generator state, which
    they advance as ``F.dropout`` does.

    On a CUDA device this runs ``native_dropout`` on ``like`` (only its size, dtype and
    alignment matter): a transient output of ``like``'s size beside the mask.

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
            mask = torch.native_dropout(like, p, True)[1]
            return mask if dtype == torch.bool else mask.to(dtype)
        return torch.empty_like(like, dtype=dtype).bernoulli_(1 - p)
