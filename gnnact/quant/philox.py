r"""PyTorch's fused CUDA dropout draws, computed by the torch path: the Philox4x32-10 generator
that curand implements, and how aten's ``fused_dropout_kernel_vec`` (its 4-wide path) maps
elements to draws. The reference of ``cuda/mask.cu``'s ``dropout_keep_bits``, which writes
``F.dropout``'s keep-mask on a GPU straight into packed bits: without the full-size output and
the one-byte-a-value mask that ``native_dropout`` allocates to give it.

The mapping, for ``numel`` values drawn with the generator's ``seed`` and Philox ``offset``:
the launch has :math:`T` threads (:func:`dropout_launch`); value :math:`e` belongs to thread
:math:`t = \lfloor (e \bmod 4T) / 4 \rfloor` in its pass :math:`k = \lfloor e / 4T \rfloor`,
and is lane :math:`e \bmod 4` of Philox's output for the counter
:math:`(\mathit{offset}/4 + k,\ t)` (low and high 64 bits) under the key ``seed``. A lane
:math:`r` becomes :math:`u = \mathrm{fma}(\mathrm{float}(r), 2^{-32}, 2^{-33})` (curand's
uniform in :math:`(0, 1]`), and the value is kept where :math:`u < \mathrm{float}(1 - p)`.
"""

from __future__ import annotations

import struct

import torch
from torch import Tensor

from gnnact.quant.reference import pack_mask_bits

__all__ = ["check_draw", "dropout_keep_bits", "dropout_launch", "keep_probability",
           "philox4x32"]

_M = (0xD2511F53, 0xCD9E8D57)  # the round multipliers
_W = (0x9E3779B9, 0xBB67AE85)  # the key's increments between rounds
_U32 = 0xFFFFFFFF
#: aten's fused dropout launch: threads per block, and values a thread takes per draw.
BLOCK, VALUES_PER_DRAW = 256, 4


def philox4x32(counter: tuple[Tensor, Tensor, Tensor, Tensor],
               key: tuple[int, int]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Philox4x32-10 (Salmon et al., SC 2011) as curand computes it: ten rounds, the key
    raised by the Weyl increments between rounds. ``counter``: four ``int64`` tensors holding
    32-bit words (word 0 lowest); returns the four output words the same way."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for round_ in range(10):
        if round_:
            k0, k1 = (k0 + _W[0]) & _U32, (k1 + _W[1]) & _U32
        # The 64-bit products wrap in int64, but their bit patterns are the exact products'
        # (both factors are below 2^32): the high word is bits 32-63.
        p0, p1 = c0 * _M[0], c2 * _M[1]
        c0, c1, c2, c3 = ((p1 >> 32) & _U32) ^ c1 ^ k0, p1 & _U32, \
            ((p0 >> 32) & _U32) ^ c3 ^ k1, p0 & _U32
    return c0, c1, c2, c3


def dropout_launch(numel: int, sm_count: int, threads_per_sm: int) -> tuple[int, int]:
    """aten's launch of fused dropout for ``numel`` values on a device with ``sm_count``
    multiprocessors of ``threads_per_sm`` threads: ``(threads, increment)``, the threads of
    the grid and what the draw advances the generator's Philox offset by (4 per pass)."""
    if numel <= 0:
        raise ValueError(f"numel must be positive, got {numel}")
    blocks = min(-(-numel // BLOCK), sm_count * (threads_per_sm // BLOCK))
    passes = (numel - 1) // (BLOCK * blocks * VALUES_PER_DRAW) + 1
    return blocks * BLOCK, passes * VALUES_PER_DRAW


def keep_probability(p: float) -> float:
    """:math:`1 - p` as aten compares with it: computed in double, rounded to float32 (by the
    struct module: no tensor made on every dropout)."""
    return struct.unpack("f", struct.pack("f", 1.0 - p))[0]


def check_draw(numel: int, offset: int) -> None:
    """Raises unless ``numel`` is a positive multiple of 4 (the 4-wide path's) and ``offset``
    a multiple of 4 (as the generator keeps it)."""
    if numel <= 0 or numel % VALUES_PER_DRAW:
        raise ValueError(f"numel must be a positive multiple of 4, got {numel}")
    if offset < 0 or offset % 4:
        raise ValueError(f"offset must be a non-negative multiple of 4, got {offset}")


def dropout_keep_bits(numel: int, p: float, seed: int, offset: int, threads: int,
                      device: torch.device | str = "cpu") -> Tensor:
    r"""The keep-mask that ``native_dropout`` draws for ``numel`` float32 values on its 4-wide
    path, packed as :func:`gnnact.pack_mask` packs (``uint8 [ceil(numel / 8)]``), from the
    generator's ``seed`` and Philox ``offset`` (a multiple of 4) and a launch of ``threads``
    threads (:func:`dropout_launch`). ``numel`` is a multiple of 4, as that path requires."""
    check_draw(numel, offset)
    first = torch.arange(0, numel, VALUES_PER_DRAW, dtype=torch.int64, device=device)
    stride = threads * VALUES_PER_DRAW
    thread, counter = (first % stride) // VALUES_PER_DRAW, offset // 4 + first // stride
    words = philox4x32((counter & _U32, counter >> 32, thread & _U32, thread >> 32),
                       (seed & _U32, (seed >> 32) & _U32))
    lanes = torch.stack(words, dim=1).reshape(-1)
    # float(r) * 2^-32 + 2^-33 is exact in float64, so one rounding to float32 gives the
    # fused multiply-add's result.
    uniform = (lanes.to(torch.float32).double() * 2.0**-32 + 2.0**-33).float()
    return pack_mask_bits(uniform < keep_probability(p))
