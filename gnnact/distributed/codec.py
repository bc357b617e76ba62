r"""One message of the halo exchange: a tensor as a flat ``uint8`` payload and back.

With ``bits`` :math:`b \in 1 \dots 8` the payload is :func:`gnnact.quantize`'s
:class:`~gnnact.quant.PackedTensor` of the rows (groups of :math:`G` consecutive values,
stochastic rounding, so :math:`\mathbb{E}[\hat x] = x` and
:math:`\mathrm{Var}[\hat x_j] \le (R/(2^b-1))^2/4` for a group of range :math:`R`), laid out as
the :math:`n_g` float32 scales, then the :math:`n_g` float32 zeros, then the codes:

.. math::
    \text{bytes} = n_g \left( \left\lceil \frac{G b}{8} \right\rceil + 8 \right), \qquad
    n_g = \lceil n / G \rceil,

for :math:`n` values (:func:`~gnnact.quant.packed.packed_nbytes`). With 16 bits it is the
bfloat16 copy (``float16``/``bfloat16`` input as is), with 32 the values themselves in their own
dtype, exact. The receiver knows the shape, dtype, width and group size, so no header is sent:
it allocates exactly :func:`payload_nbytes` bytes and receives into them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gnnact.quant import DEFAULT_GROUP_SIZE, PackedTensor, dequantize, quantize
from gnnact.quant.packed import packed_code_bytes, packed_nbytes

__all__ = ["EXCHANGE_BITS", "check_bits", "decode", "encode", "payload_nbytes"]

#: Widths of the exchange: packed 1–8, bfloat16 16, exact 32.
EXCHANGE_BITS = (1, 2, 3, 4, 5, 6, 7, 8, 16, 32)


def check_bits(name: str, value: object) -> int:
    """``value`` if it is one of :data:`EXCHANGE_BITS`, else an error naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in EXCHANGE_BITS:
        raise ValueError(f"{name} must be one of {EXCHANGE_BITS}, got {value!r}")
    return value


def _wire_dtype(dtype: torch.dtype, bits: int) -> torch.dtype:
    if bits == 16 and torch.empty((), dtype=dtype).element_size() != 2:
        return torch.bfloat16
    return dtype


def payload_nbytes(numel: int, dtype: torch.dtype, bits: int,
                   group_size: int = DEFAULT_GROUP_SIZE) -> int:
    """Bytes of the payload of ``numel`` values of ``dtype`` at ``bits`` (module docstring).

    Args:
        numel (int): values in the message.
        dtype (torch.dtype): their dtype.
        bits (int): one of :data:`EXCHANGE_BITS`.
        group_size (int, optional): :math:`G`. (default: :obj:`512`)

    Example:
        >>> from gnnact.distributed.codec import payload_nbytes
        >>> payload_nbytes(1000 * 64, torch.float32, 2)  # 125 groups of 128 + 8 bytes
        17000
        >>> payload_nbytes(1000 * 64, torch.float32, 32)
        256000
    """
    if bits > 8:
        return numel * torch.empty((), dtype=_wire_dtype(dtype, bits)).element_size()
    return packed_nbytes(numel, bits, group_size)


def encode(x: Tensor, bits: int, group_size: int = DEFAULT_GROUP_SIZE,
           generator: torch.Generator | None = None) -> Tensor:
    """``x`` as a flat ``uint8`` payload at ``bits`` (module docstring).

    Args:
        x (torch.Tensor): a floating-point tensor, non-empty.
        bits (int): one of :data:`EXCHANGE_BITS`.
        group_size (int, optional): :math:`G`. (default: :obj:`512`)
        generator (torch.Generator, optional): source of the rounding seed.
            (default: the default CPU generator)

    Example:
        >>> from gnnact.distributed.codec import decode, encode
        >>> x = torch.randn(100, 8)
        >>> payload = encode(x, 4)
        >>> payload.dtype, payload.numel()  # 2 groups: 256 + 8 bytes each
        (torch.uint8, 528)
        >>> decode(payload, x.shape, x.dtype, 4).shape
        torch.Size([100, 8])
    """
    packed = quantize(x.contiguous(), bits, group_size, generator=generator)
    if packed.is_passthrough:
        return packed.codes.contiguous().view(-1).view(torch.uint8)
    # Scales and zeros first: their float32 views then start at a 4-byte aligned offset.
    return torch.cat([packed.scales.view(torch.uint8), packed.zeros.view(torch.uint8),
                      packed.codes.view(-1)])


def decode(payload: Tensor, shape: torch.Size | tuple[int, ...], dtype: torch.dtype, bits: int,
           group_size: int = DEFAULT_GROUP_SIZE) -> Tensor:
    """The tensor of shape ``shape`` and dtype ``dtype`` that :func:`encode` sent.

    Args:
        payload (torch.Tensor): the ``uint8`` payload, :func:`payload_nbytes` bytes.
        shape (torch.Size): the shape of the tensor sent.
        dtype (torch.dtype): its dtype.
        bits (int): the width it was sent at.
        group_size (int, optional): :math:`G`. (default: :obj:`512`)

    Example:
        >>> from gnnact.distributed.codec import decode, encode
        >>> x = torch.randn(10, 4, dtype=torch.float64)
        >>> torch.equal(decode(encode(x, 32), x.shape, x.dtype, 32), x)  # exact
        True
    """
    shape = torch.Size(shape)
    numel = shape.numel()
    if payload.numel() != payload_nbytes(numel, dtype, bits, group_size):
        raise ValueError(f"payload has {payload.numel()} bytes, expected "
                         f"{payload_nbytes(numel, dtype, bits, group_size)} for {numel} values "
                         f"of {dtype} at {bits} bits")
    if bits > 8:
        return payload.view(_wire_dtype(dtype, bits)).view(shape).to(dtype)
    g = min(group_size, numel)  # quantize caps the group at the tensor's size
    n_g = -(-numel // g)
    scales = payload[:4 * n_g].view(torch.float32)
    zeros = payload[4 * n_g:8 * n_g].view(torch.float32)
    codes = payload[8 * n_g:].view(n_g, packed_code_bytes(g, bits))
    return dequantize(PackedTensor(codes, scales, zeros, bits, shape, dtype, g))
