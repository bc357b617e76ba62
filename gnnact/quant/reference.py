r"""Torch implementation of the packed format: the CPU path and the reference for the kernels.

Every function here has a twin with the same signature in :mod:`gnnact.kernels.quantize`
(CuPy, CUDA tensors), and the quantizer one in :mod:`gnnact.kernels.cpu` (compiled, CPU
tensors). Given the same ``noise`` (or, on CUDA, the same ``seed``; the CPU kernels' seeded
noise is the CUDA hash, :func:`gnnact.quant.rng.hash_uniform`) they produce identical codes,
scales and zeros; tests hold them to that.

Quantization of one group :math:`h \in \mathbb{R}^G` at :math:`b` bits, in float32:

.. math::
    Z = \min h, \quad R = \max h - Z, \quad B = 2^b - 1, \quad s = R / B, \\
    u_j = (h_j - Z) \cdot (B / R), \quad
    q_j = \lfloor u_j \rfloor + [\, r_j < u_j - \lfloor u_j \rfloor \,], \qquad
    \hat h_j = q_j s + Z,

with :math:`r_j \sim U[0, 1)` (see :mod:`gnnact.quant.rng`), so :math:`\Pr[q_j = \lfloor u_j
\rfloor + 1] = u_j - \lfloor u_j \rfloor`, :math:`\mathbb{E}[\hat h_j] = h_j` and
:math:`\mathrm{Var}[\hat h_j] = s^2 p (1 - p) \le (R/B)^2 / 4`. A constant group (:math:`R = 0`)
stores codes 0 and dequantizes exactly to :math:`Z`. A group whose range is not finite (it holds
a NaN or an infinity, or :math:`R` overflows float32) stores ``scale = zero = NaN`` and codes 0,
so every element of it dequantizes to NaN: non-finite values propagate, as they would in fp32
training, and never turn into finite numbers.

Each step is one correctly rounded float32 operation (subtract, multiply, floor, compare; for
dequantization multiply then add; :math:`B / R` is rounded down, :func:`inverse_range`, so
that :math:`0 \le u_j \le B`), which the CUDA kernel reproduces with ``__fsub_rn``,
``__fmul_rn`` and ``__fadd_rn`` to rule out FMA contraction. Codes already on the grid
(:math:`u_j` an integer) round trip exactly, whatever the noise.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Iterator

import torch
from torch import Tensor

from gnnact.quant.packed import packed_code_bytes
from gnnact.quant.rng import seeded_uniform, word_stream

__all__ = [
    "BLOCKS",
    "CHUNK_ELEMENTS",
    "MASK_MUL",
    "MASK_SELECT",
    "MASK_ZERO",
    "MIN_BLOCK_ELEMENTS",
    "apply_packed_mask",
    "block_elements",
    "combine_mask",
    "dequantize_groups",
    "inverse_range",
    "pack_codes",
    "pack_mask_bits",
    "quantize_groups",
    "quantize_on_grid",
    "sign_mask",
    "unpack_mask_bits",
]

#: The most elements per chunk of :func:`quantize_groups` and :func:`dequantize_groups`
#: (rounded to whole groups), and per block of gnnact's by-block loops: their float32
#: temporaries are a few times 4 MiB at most, whatever the tensor's size.
CHUNK_ELEMENTS = 1 << 20
#: A chunk's share of its tensor (at most: see :func:`block_elements`).
BLOCKS = 16
#: The fewest elements per chunk.
MIN_BLOCK_ELEMENTS = 1 << 16


def block_elements(numel: int) -> int:
    """Elements per chunk for a tensor of ``numel`` elements: ``numel / BLOCKS`` within
    ``[MIN_BLOCK_ELEMENTS, CHUNK_ELEMENTS]``, a multiple of 8 (so that the chunks of a packed
    1-bit mask start on whole bytes). On a large tensor a chunk of ``CHUNK_ELEMENTS`` is
    nothing beside it; on a small one the same chunk would be a fifth of it, so a chunk is
    also at most a sixteenth (but not so small that per-chunk overhead dominates)."""
    per_chunk = min(CHUNK_ELEMENTS, max(MIN_BLOCK_ELEMENTS, -(-numel // BLOCKS)))
    return -(-per_chunk // 8) * 8


def _bit_shifts(bits: int, device: torch.device) -> Tensor:
    return torch.arange(0, 8, bits, dtype=torch.int32, device=device)


def quantize_groups(x: Tensor, bits: int, group_size: int, *, seed: int | None = None,
                    noise: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    r"""Quantize the flat elements of ``x`` group by group.

    Args:
        x (torch.Tensor): floating-point input; read in row-major order, any shape, non-empty.
        bits (int): 1 to 8 (codes of 3, 5, 6 and 7 bits straddle bytes).
        group_size (int): elements per group :math:`G`.
        seed (int, optional): seed of the noise when ``noise`` is ``None``
            (:func:`gnnact.quant.rng.seeded_uniform`).
        noise (torch.Tensor, optional): float32 uniforms in [0, 1), one per element of ``x``.

    Returns:
        ``(codes, scales, zeros)``: ``uint8 [n_g, ceil(G b / 8)]``, ``float32 [n_g]`` twice.
    """
    n = x.numel()
    num_groups = -(-n // group_size)
    last = n - (num_groups - 1) * group_size  # elements of the last group
    flat = x.reshape(-1)
    # Drawn chunk by chunk, in order: seeded_uniform(seed, n) as integers k = 2^16 r, which the
    # faster rounding of _round_on_grid takes (given noise: the reference's).
    if noise is None:
        draw, rows = word_stream(seed, x.device), _round_on_grid
    else:
        noise = noise.reshape(-1)
        draw, rows = (lambda start, count: noise[start:start + count]), _quantize_rows
    step = max(1, block_elements(n) // group_size)  # groups per chunk
    if num_groups <= step:
        # One chunk (every tensor of up to 64Ki elements): all groups at once, the last padded
        # to a whole group. A few dozen small ops, the fixed cost of quantizing a small tensor.
        return rows(*_padded(flat, draw(0, n), num_groups * group_size, group_size), bits,
                    valid=last)

    codes = torch.empty(num_groups, packed_code_bytes(group_size, bits), dtype=torch.uint8,
                        device=x.device)
    scales = torch.empty(num_groups, dtype=torch.float32, device=x.device)
    zeros = torch.empty_like(scales)
    # Whole groups in chunks of about block_elements(n): the float32 temporaries (u and its
    # fractional part, the input as float32) stay a few MiB however large x is, so quantizing
    # a tensor needs little beyond its packed result. The seeded path keeps them in buffers
    # made once: on the CPU a fresh megabyte a chunk cost a page fault a page (the allocator
    # hands large blocks back to the system), often more than the arithmetic.
    whole = num_groups - (last < group_size)
    buffers = None
    if noise is None:
        span = min(whole, step) * group_size
        # (codes as floats, and the input as float32 when it is not)
        buffers = [torch.empty(span, dtype=torch.float32, device=x.device)
                   for _ in range(1 + (x.dtype != torch.float32))]
    for g0 in range(0, whole, step):
        g1 = min(whole, g0 + step)
        lo, hi = g0 * group_size, g1 * group_size
        h = flat[lo:hi].view(g1 - g0, group_size)
        r = draw(lo, hi - lo).view(g1 - g0, group_size)
        if buffers is None:
            codes[g0:g1], scales[g0:g1], zeros[g0:g1] = rows(h.to(torch.float32), r, bits)
            continue
        q_buf, *h_buf = (b[:hi - lo].view(g1 - g0, group_size) for b in buffers)
        if h_buf:
            h = h_buf[0].copy_(h)
        codes[g0:g1], scales[g0:g1], zeros[g0:g1] = rows(h, r, bits, out=q_buf)
    if whole < num_groups:
        cut = whole * group_size
        h, r = _padded(flat[cut:], draw(cut, n - cut), group_size, group_size)
        codes[whole:], scales[whole:], zeros[whole:] = rows(h, r, bits, valid=last)
    return codes, scales, zeros


def _padded(h: Tensor, r: Tensor, size: int, group_size: int) -> tuple[Tensor, Tensor]:
    """Values ``h`` and their noise ``r`` padded to ``size`` elements, as ``[size / G, G]``,
    the values in float32: values with the last one, so the padding cannot widen the last
    group's range, and noise with zeros."""
    pad = size - h.numel()
    if pad:
        h = torch.cat([h, h[-1:].expand(pad)])
        r = torch.cat([r, r.new_zeros(pad)])
    return h.to(torch.float32).view(-1, group_size), r.view(-1, group_size)


def inverse_range(rng: Tensor, bits: int) -> Tensor:
    """:math:`B / R` of groups with float32 ranges ``rng``, rounded down (0 where :math:`R`
    is 0 or NaN). Rounded down, no :math:`u_j = (h_j - Z) B / R` of a group exceeds :math:`B`
    (rounded to nearest, one could by a rounding), so no code needs a clamp, and the kernels
    have none."""
    rng64 = rng.double()
    exact = torch.full_like(rng64, float((1 << bits) - 1)) / rng64
    inv = exact.float()  # rounded to nearest
    # The float64 quotient tells whether that rounded up: B (8 bits) over R (24 bits) is
    # either a float32 or at least 2^-48 (relative) from every float32, far beyond float64's
    # rounding. Where it did, the float below is the quotient rounded down: one less in the
    # bits of a positive float32 (FLT_MAX below infinity). (R = 0 gives an infinite quotient,
    # NaN a NaN: both stored as 0.)
    inv.view(torch.int32).sub_((inv > exact).to(torch.int32))
    return inv.nan_to_num_(nan=0.0, posinf=0.0)


def _group_statistics(low: Tensor, high: Tensor, bits: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(scale, inverse range, zero)`` of groups with ends ``low`` and ``high``:
    :math:`s = R / B`, :math:`B / R` rounded down (:func:`inverse_range`) and :math:`Z`, NaN
    scale and zero where the range is not finite."""
    rng = high - low
    # R - R: +0 where R is finite, NaN where it is not. Subtracting a +0 changes no float (a
    # -0 stays -0), so it only puts the NaN where it belongs; tensor-tensor ops only (an op
    # with a Python scalar costs a few microseconds more, on a few elements).
    nan_unless_finite = rng - rng
    # Tensor / tensor division: a scalar divisor may be turned into a multiplication by its
    # reciprocal, which rounds differently from the kernel's division.
    scale = (rng / torch.full_like(rng, float((1 << bits) - 1))).sub_(nan_unless_finite)
    return scale, inverse_range(rng, bits), low - nan_unless_finite


def _quantize_rows(h: Tensor, r: Tensor, bits: int, valid: int | None = None,
                   out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`quantize_groups` of the groups ``h [n_g, G]`` (float32, not written) with noise
    ``r``; codes past column ``valid`` of the last group are stored as 0 (padding). ``out``
    (float32, ``h``'s shape), if given, holds the codes as floats."""
    levels = (1 << bits) - 1
    scale, inv, zero = _group_statistics(h.amin(dim=1), h.amax(dim=1), bits)

    # u = (h - Z) * B/R, then q = floor(u) + [r < u - floor(u)]. Comparing with the exact
    # fractional part (Sterbenz: u - floor(u) is exact) rather than flooring the rounded sum
    # u + r keeps codes on the grid exact and P[round up] = frac(u) to within 2^-24.
    # u >= 0, so frac(u) = u - trunc(u) = u - floor(u), and u - frac(u) = floor(u), both exact
    # (torch.floor has a ~15 ms fixed cost per call on some CPU builds; frac has none).
    u = torch.sub(h, zero[:, None], out=out)
    u.mul_(inv[:, None])
    frac = torch.frac(u)
    q = u.sub_(frac)
    q.add_(r < frac)
    # NaN only arises in non-finite groups (zero is NaN there): they store code 0.
    q = torch.nan_to_num_(q, nan=0.0).clamp_(0, levels)
    return _packed(q, bits, valid), scale, zero


def _round_on_grid(h: Tensor, k: Tensor, bits: int, valid: int | None = None,
                   out: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    r""":func:`_quantize_rows` for noise on the :math:`2^{-16}` grid, given as the integers
    :math:`k = 2^{16} r` (:func:`~gnnact.quant.rng.word_stream`), bit for bit, in fewer passes
    over memory: a reduction for each end of each group, and :math:`q = \lceil u - r \rceil`
    for :math:`\lfloor u \rfloor + [r < u - \lfloor u \rfloor]`. The two are equal for real
    numbers, and :math:`u - r` is exact in float32 here: with :math:`0 \le u < 2^8`, :math:`r`
    is a multiple of :math:`u`'s last place, so for :math:`u \ge r` the difference is one with
    magnitude at most :math:`u`; for :math:`u < r` it lies in :math:`(-1, 0)`, rounded or not,
    and its ceiling is 0. No clamp is needed: :math:`0 \le u \le B` (:func:`inverse_range`).
    :math:`r = 2^{-16} k` is exact too, fused into the subtraction or not."""
    # (Two reductions, not torch.aminmax: along rows of a group, CPU aminmax runs about ten
    # times slower than amin and amax together.)
    scale, inv, zero = _group_statistics(h.amin(dim=1), h.amax(dim=1), bits)
    q = torch.sub(h, zero[:, None], out=out)
    q.mul_(inv[:, None]).sub_(k, alpha=2.0**-16).ceil_()
    bad = scale.isnan()
    if bad.any():
        q[bad] = 0.0  # (NaN there: non-finite groups store code 0)
    return _packed(q, bits, valid), scale, zero


def _packed(q: Tensor, bits: int, valid: int | None) -> Tensor:
    """:func:`pack_codes` of ``q`` with the codes past column ``valid`` of its last row (the
    padding of a short last group) set to 0 first."""
    if valid is not None and valid < q.shape[1]:
        q[-1, valid:] = 0
    return pack_codes(q, bits)


@functools.cache
def _places(count: int, shift: int, device: torch.device) -> Tensor:
    r"""``float32 [count]``: :math:`2^{k \cdot \mathrm{shift}}`, the places of ``count``
    codes of ``shift`` bits in a word, lowest first (read only)."""
    return torch.exp2(torch.arange(count, dtype=torch.float32, device=device) * shift)


def pack_codes(q: Tensor, bits: int) -> Tensor:
    """Codes ``q [n_g, G]`` (integral float32 values in :math:`[0, 2^b - 1]`) bit-packed per
    group: ``uint8 [n_g, ceil(G b / 8)]``, the layout :func:`dequantize_groups` reads."""
    num_groups, group_size = q.shape
    bytes_per_group = packed_code_bytes(group_size, bits)
    if 8 % bits:
        if group_size % 8 == 0:
            return _pack_blocks(q, bits)
        return _pack_stream(q, bits, bytes_per_group)
    per_byte = 8 // bits
    width = bytes_per_group * per_byte
    if width != group_size:
        q = torch.cat([q, q.new_zeros(num_groups, width - group_size)], dim=1)
    if bits != 8:
        # byte = sum_k q_k 2^(k b): a float32 mat-vec with powers of two is exact (integers
        # below 256, exact even in TF32) and runs on every device, unlike integer matmul.
        q = q.reshape(num_groups * bytes_per_group, per_byte) @ _places(per_byte, bits, q.device)
    return _to_bytes(q.reshape(num_groups, bytes_per_group))


#: Values from which :func:`_to_bytes` converts through int32 on the CPU.
_LONG_CONVERSION = 1 << 15


def _to_bytes(v: Tensor) -> Tensor:
    """Integral float32 values in [0, 255] as ``uint8``. On the CPU a long tensor goes through
    int32: float32 to uint8 has no vectorised path there, and the two conversions take half
    its time (a small tensor converts directly: one op less)."""
    if v.device.type == "cpu" and v.numel() >= _LONG_CONVERSION:
        v = v.to(torch.int32)
    return v.to(torch.uint8)


def quantize_on_grid(h: Tensor, zeros: Tensor, invs: Tensor, bits: int, low: float,
                     high: float, *, seed: int | None = None,
                     noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
    r"""Round each row of ``h`` onto a grid it was not measured on (Mesa's running ranges,
    :class:`gnnact.compress.Mesa`): row :math:`g` with offset :math:`Z_g` and inverse step
    :math:`v_g`,

    .. math::
        u = (h - Z_g)\, v_g, \qquad
        q = \lfloor \bar u \rfloor + [\, r < \bar u - \lfloor \bar u \rfloor \,], \quad
        \bar u = \operatorname{clip}(u, 0, 2^b - 1),

    unbiased for values inside the grid; a value with :math:`u` below ``low`` or above
    ``high`` is counted as clipped (a NaN gets code 0).

    Args:
        h (torch.Tensor): float32 ``[n_g, G]``, one group a row.
        zeros (torch.Tensor): float32 ``[n_g]``, :math:`Z_g`.
        invs (torch.Tensor): float32 ``[n_g]``, :math:`v_g` (0 for a group of no width).
        bits (int): 1 to 8.
        low (float): clipped below this :math:`u`.
        high (float): clipped above this :math:`u`.
        seed (int, optional): seed of the noise when ``noise`` is ``None``
            (:func:`gnnact.quant.rng.seeded_uniform`).
        noise (torch.Tensor, optional): float32 uniforms in [0, 1), one per value of ``h``.

    Returns:
        ``(codes, clipped)``: ``uint8 [n_g, ceil(G b / 8)]`` (the layout of
        :func:`quantize_groups`) and ``int64 [n_g]``, the values clipped in each row.
    """
    levels = (1 << bits) - 1
    u = (h - zeros[:, None]) * invs[:, None]
    clipped = ((u < low) | (u > high)).sum(1)
    u.clamp_(0, levels)
    frac = torch.frac(u)
    if noise is None:
        noise = seeded_uniform(seed, u.numel(), u.device)
    q = u.sub_(frac).add_(noise.view_as(u) < frac).nan_to_num_(0.0)
    return pack_codes(q, bits), clipped


def dequantize_groups(codes: Tensor, scales: Tensor, zeros: Tensor, bits: int, group_size: int,
                      numel: int, dtype: torch.dtype) -> Tensor:
    r"""Inverse of :func:`quantize_groups`: :math:`\hat h = q s + Z`, flat, ``numel`` elements.

    Args:
        codes (torch.Tensor): ``uint8 [n_g, ceil(G b / 8)]``.
        scales (torch.Tensor): ``float32 [n_g]``.
        zeros (torch.Tensor): ``float32 [n_g]``.
        bits (int): 1 to 8.
        group_size (int): elements per group :math:`G`.
        numel (int): number of elements of the original tensor.
        dtype (torch.dtype): dtype of the result.
    """
    num_groups = codes.shape[0]
    step = max(1, block_elements(numel) // group_size)
    if num_groups <= step and numel == num_groups * group_size and dtype == torch.float32:
        # One chunk of whole groups (a small tensor): the values are the result.
        return _dequantize_rows(codes, scales, zeros, bits, group_size).reshape(-1)
    out = torch.empty(numel, dtype=dtype, device=codes.device)
    # In chunks of about block_elements(numel), written into the result: the unpacked codes (int64
    # for the widths that straddle bytes) never exist for the whole tensor at once.
    for g0 in range(0, num_groups, step):
        g1 = min(num_groups, g0 + step)
        values = _dequantize_rows(codes[g0:g1], scales[g0:g1], zeros[g0:g1], bits, group_size)
        lo = g0 * group_size
        hi = min(numel, g1 * group_size)
        out[lo:hi] = values.reshape(-1)[:hi - lo]
        del values  # before the next chunk's are made
    return out


#: Packed code bytes below which :func:`_dequantize_rows` unpacks two and four codes a byte
#: with one gather from a table (a few ops) rather than a shift-and-mask per code (faster per
#: byte on long rows, more ops).
GATHER_BYTES = 1 << 12


def _dequantize_rows(codes: Tensor, scales: Tensor, zeros: Tensor, bits: int,
                     group_size: int) -> Tensor:
    """:math:`q s + Z` of whole groups: float32 ``[n_g, G]``."""
    num_groups = codes.shape[0]
    if bits == 8:
        q = codes.to(torch.float32)
    elif 8 % bits:
        if group_size % 8 == 0:
            q = _unpack_blocks(codes, bits, group_size)
        else:
            q = _unpack_stream(codes, bits, group_size).to(torch.float32)
    elif bits == 1 or codes.numel() <= GATHER_BYTES:
        # One gather from a 256-entry table of each byte's codes, as float32: half the time of
        # eight shifts for one bit.
        table = _byte_codes(bits, codes.device)
        q = table.index_select(0, codes.reshape(-1).to(torch.int32)).view(num_groups, -1)
    else:
        # Two or four codes a byte on long rows: one shift-and-mask of the bytes per code,
        # written as float32 into its column (2-4x faster than the table's gather of such
        # short rows).
        flat = codes.reshape(-1)
        per_byte, mask = 8 // bits, (1 << bits) - 1
        q = torch.empty(flat.numel(), per_byte, dtype=torch.float32, device=codes.device)
        for k in range(per_byte):
            q[:, k] = (flat >> (k * bits)) & mask
        q = q.view(num_groups, -1)
    # q is a fresh float32 tensor: scale and shift it in place (multiply, then add, each
    # rounded, as the kernel does).
    return q[:, :group_size].mul_(scales[:, None]).add_(zeros[:, None])


@functools.cache
def _byte_codes(bits: int, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    """``[256, 8 / b]`` of ``dtype``: the codes byte value :math:`v` holds, lowest bits first.
    Built once per width, device and dtype (read only: callers gather from it)."""
    values = torch.arange(256, dtype=torch.int32, device=device)[:, None]
    return ((values >> _bit_shifts(bits, device)) & ((1 << bits) - 1)).to(dtype)


def _sum_of_shifted(columns: Tensor, shift: int) -> Tensor:
    r""":math:`\sum_k c_k 2^{k \cdot \mathrm{shift}}` of the rows of ``columns [M, K]``
    (non-negative integral float32 values below :math:`2^{\mathrm{shift}}`), as ``int32 [M]``
    up to 31 bits, ``int64 [M]`` above. Each float32 mat-vec sums at most 24 bits, where it is
    exact; wider sums are put together from such pieces.
    (A float32 mat-vec runs at memory speed on every device; int64 shifts of every code, or a
    conversion to float64, cost about ten times as much on the CPU.)"""
    per_piece = max(1, 24 // shift)
    dtype = torch.int32 if columns.shape[1] * shift <= 31 else torch.int64
    weights = _places(min(per_piece, columns.shape[1]), shift, columns.device)
    total = None
    for k in range(0, columns.shape[1], per_piece):
        piece = columns[:, k:k + per_piece]
        part = (piece @ weights[:piece.shape[1]]).to(dtype)
        total = part if total is None else total | (part << (k * shift))
    return total


def _pack_blocks(q: Tensor, bits: int) -> Tensor:
    r""":func:`_pack_stream` for groups of whole blocks of 8 codes (:math:`G` a multiple of 8):
    each block fills exactly :math:`b` bytes, the bytes of the :math:`8b`-bit word
    :math:`\sum_k q_k 2^{kb}`."""
    num_groups = q.shape[0]
    word = _sum_of_shifted(q.view(-1, 8), bits)
    out = torch.empty(word.shape[0], bits, dtype=torch.uint8, device=q.device)
    for j in range(bits):
        out[:, j] = word >> (8 * j)  # (to uint8: the low byte)
    return out.view(num_groups, -1)


@functools.cache
def _piece_codes(bits: int, per_piece: int, device: torch.device) -> Tensor:
    """``float32 [2^(per_piece b), per_piece]``: the codes a ``per_piece b``-bit piece of a
    block holds, lowest bits first (read only: gathered from)."""
    values = torch.arange(1 << (per_piece * bits), dtype=torch.int32, device=device)[:, None]
    shifts = torch.arange(per_piece, dtype=torch.int32, device=device) * bits
    return ((values >> shifts) & ((1 << bits) - 1)).to(torch.float32)


def _unpack_blocks(codes: Tensor, bits: int, group_size: int) -> Tensor:
    """Inverse of :func:`_pack_blocks`: ``float32 [n_g, G]``, the block's word cut in pieces
    of four codes (two above 3 bits), each piece's codes one row of a table of at most
    :math:`2^{14}` rows (a gather, as the byte-aligned widths' unpacking)."""
    num_groups = codes.shape[0]
    word = _sum_of_shifted(codes.view(-1, bits).to(torch.float32), 8)
    per_piece = 4 if bits == 3 else 2
    width = per_piece * bits
    index = torch.empty(word.shape[0], 8 // per_piece, dtype=word.dtype, device=codes.device)
    for p in range(8 // per_piece):
        index[:, p] = (word >> (p * width)) & ((1 << width) - 1)
    table = _piece_codes(bits, per_piece, codes.device)
    return table.index_select(0, index.view(-1)).view(num_groups, group_size)


def _pack_stream(q: Tensor, bits: int, bytes_per_group: int) -> Tensor:
    """Codes ``q [n_g, G]`` (integral floats) as each group's LSB-first bit stream, code
    :math:`j` in bits :math:`[jb, (j+1)b)`: the layout of the byte-aligned widths, here for
    widths whose codes straddle bytes (3, 5, 6, 7)."""
    num_groups = q.shape[0]
    planes = (q.to(torch.int32)[:, :, None] >> torch.arange(bits, device=q.device)) & 1
    stream = planes.view(num_groups, -1)
    pad = bytes_per_group * 8 - stream.shape[1]
    if pad:
        stream = torch.cat([stream, stream.new_zeros(num_groups, pad)], dim=1)
    return _to_bytes((stream.view(-1, 8).to(torch.float32) @ _places(8, 1, q.device)
                      ).view(num_groups, -1))


def _unpack_stream(codes: Tensor, bits: int, group_size: int) -> Tensor:
    """Inverse of :func:`_pack_stream`: ``int32 [n_g, G]``."""
    num_groups = codes.shape[0]
    stream = (codes.to(torch.int32)[:, :, None] >> _bit_shifts(1, codes.device)) & 1
    planes = stream.view(num_groups, -1)[:, :group_size * bits].view(num_groups, group_size, bits)
    return (planes << torch.arange(bits, dtype=torch.int32, device=codes.device)).sum(dim=2)


#: ``sum_k 2^(56 - 7k)``: multiplying the little-endian 64-bit word of eight 0/1 bytes by it puts
#: byte :math:`k` in bit :math:`56 + k` (the partial products land on distinct bits, none of
#: the others in bits 56-63, so nothing carries there).
_GATHER_BITS = 0x0102040810204080


def pack_mask_bits(mask: Tensor) -> Tensor:
    r"""Pack a boolean tensor (row-major) into ``uint8 [ceil(n / 8)]``, bit :math:`i \bmod 8` of
    byte :math:`\lfloor i / 8 \rfloor` holding element :math:`i`."""
    flat = mask.reshape(-1).view(torch.uint8)  # 0 or 1 per byte, no copy
    pad = -flat.numel() % 8
    if pad or flat.storage_offset() % 8:  # (an int64 view needs whole, aligned words)
        flat = torch.cat([flat, flat.new_zeros(pad)])
    if sys.byteorder == "little":
        # Each byte of the packed mask is the top byte of one int64 product: ~8x faster on
        # the CPU than seven shift-and-or passes over the bytes. By blocks, so that the int64
        # products (as many bytes as the mask) never exist whole.
        words = flat.view(torch.int64)
        out = torch.empty(words.numel(), dtype=torch.uint8, device=words.device)
        step = max(1, block_elements(flat.numel()) // 8)
        for lo in range(0, words.numel(), step):
            out[lo:lo + step] = (words[lo:lo + step] * _GATHER_BITS).bitwise_right_shift_(56)
        return out
    columns = flat.view(-1, 8)
    out = columns[:, 0].clone()
    for k in range(1, 8):
        out |= columns[:, k] << k
    return out


def unpack_mask_bits(data: Tensor, numel: int) -> Tensor:
    """Inverse of :func:`pack_mask_bits`: a flat ``torch.bool`` tensor of ``numel`` elements
    (one gather from a 256-entry table of each byte's eight bits as one int64 word: 2-3x
    faster than gathering rows of eight bools)."""
    table = _byte_codes(1, data.device, torch.bool).view(torch.int64).view(-1)
    return table.index_select(0, data.to(torch.int32)).view(torch.bool)[:numel]


#: How a mask op meets a value :math:`v` with its mask bit :math:`m`; each is the branch
#: PyTorch's own op takes, bit for bit:
#:
#: - ``MASK_MUL``: :math:`v \cdot (m\,?\,s : 0)`, ReLU's forward (:math:`s = 1`) and
#:   dropout's forward and backward (:math:`s` the dtype's :math:`1/(1-p)`);
#: - ``MASK_ZERO``: :math:`m\,?\,v : +0`, ReLU's backward (``torch.where(mask, grad, 0)``);
#: - ``MASK_SELECT``: :math:`m\,?\,v : v s`, LeakyReLU's forward and backward (:math:`s` the
#:   slope).
MASK_MUL, MASK_ZERO, MASK_SELECT = 0, 1, 2


def _mask_blocks(n: int) -> Iterator[slice]:
    """Consecutive slices of ``n`` elements, :func:`block_elements` each (a multiple of 8:
    every block starts on a whole byte of a packed mask)."""
    step = block_elements(n)
    for lo in range(0, n, step):
        yield slice(lo, min(n, lo + step))


def combine_mask(v: Tensor, m: Tensor, mode: int, s: float, out: Tensor | None = None) -> Tensor:
    """``mode``'s combination of ``v`` with the boolean mask ``m`` (same shape), into ``out``
    (which may be ``v``) if given."""
    if mode == MASK_SELECT:
        return torch.where(m, v, v * s, out=out)
    if mode == MASK_ZERO:
        return torch.where(m, v, v.new_zeros(()), out=out)
    # v * 1 is exact, and v * 0 * s keeps the sign of v * 0 since s > 0. (Not where(): a NaN
    # input must stay NaN, as in torch.relu; s is a value of v's dtype, as F.dropout's scale.)
    out = torch.mul(v, m, out=out)
    return out if s == 1.0 else out.mul_(s)


def sign_mask(x: Tensor, out: Tensor, mode: int, s: float) -> Tensor:
    """Pack :math:`[x > 0]` (``x`` flat and contiguous) and write ``mode``'s combination of ``x``
    with it into ``out`` (flat, ``x`` itself for in place), block by block: neither the whole
    boolean mask nor a second output exists. Returns the packed mask, ``uint8 [ceil(n/8)]``
    (:func:`pack_mask_bits`' layout)."""
    n = x.numel()
    data = torch.empty((n + 7) // 8, dtype=torch.uint8, device=x.device)
    for block in _mask_blocks(n):
        m = x[block] > 0
        data[block.start // 8:(block.stop + 7) // 8] = pack_mask_bits(m)
        combine_mask(x[block], m, mode, s, out=out[block])
    return data


def apply_packed_mask(x: Tensor, data: Tensor, out: Tensor, mode: int, s: float) -> Tensor:
    """``mode``'s combination of ``x`` (flat, contiguous) with the packed mask ``data`` into
    ``out`` (flat, ``x`` itself for in place), block by block; returns ``out``."""
    n = x.numel()
    for block in _mask_blocks(n):
        m = unpack_mask_bits(data[block.start // 8:(block.stop + 7) // 8], block.stop - block.start)
        combine_mask(x[block], m, mode, s, out=out[block])
    return out
