r"""Public quantizer API: :func:`quantize`, :func:`dequantize`, :func:`pack_mask`,
:func:`unpack_mask`.

These validate their arguments, handle the pass-through widths and empty tensors, and hand the
work to a backend (:mod:`gnnact.quant.backends`): the torch reference
(:mod:`gnnact.quant.reference`, any device) or the CuPy kernels (:mod:`gnnact.kernels.quantize`,
CUDA tensors). Both produce identical results for the same noise. Under :func:`torch.compile`
that work is one custom operator per call (:mod:`gnnact.quant.operators`), which Dynamo
captures in its graph: a compiled function that quantizes and dequantizes has no graph break.
"""

from __future__ import annotations

import torch
from torch import Tensor

from gnnact.quant import operators
from gnnact.quant.backends import Backend, check_name, select
from gnnact.quant.packed import (
    DEFAULT_GROUP_SIZE,
    SUPPORTED_BITS,
    PackedMask,
    PackedTensor,
    packed_code_bytes,
)
from gnnact.quant.rng import draw_seed_tensor

__all__ = ["DEFAULT_GROUP_SIZE", "dequantize", "pack_mask", "quantize", "unpack_mask"]

#: Floating-point dtypes the quantizer takes.
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_backend(backend: str, device: torch.device, bits: int | None = None) -> None:
    """Raise for a ``backend`` that cannot run on ``device``. Eagerly that is
    :func:`~gnnact.quant.backends.select`'s verdict (a CUDA-only backend on the CPU, CuPy
    missing); under :func:`torch.compile` the name only, since the operator selects when it
    runs (a selection checks kernels once per device: host work, not part of a graph)."""
    if not torch.compiler.is_compiling():
        select(backend, device, bits)
    else:
        check_name(backend)


def _check_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    return value


def _check_tensor(name: str, value: object) -> Tensor:
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {value.layout}")
    return value


def quantize(x: Tensor, bits: int = 2, group_size: int = DEFAULT_GROUP_SIZE, *,
             per_row: bool = False, generator: torch.Generator | None = None,
             noise: Tensor | None = None, backend: Backend = "auto") -> PackedTensor:
    r"""Compress ``x`` to ``bits`` bits per element with per-group min/max affine quantization
    and unbiased stochastic rounding, codes bit-packed densely.

    For a group :math:`h` of :math:`G` consecutive elements (row-major order), with
    :math:`Z = \min h`, :math:`R = \max h - Z` and :math:`B = 2^b - 1`:

    .. math::
        u_j = \frac{(h_j - Z) B}{R}, \quad
        q_j = \lfloor u_j \rfloor + [\, r_j < u_j - \lfloor u_j \rfloor \,], \quad
        r_j \sim U[0, 1), \qquad \hat h_j = q_j \frac{R}{B} + Z,

    so :math:`\mathbb{E}[\hat h_j] = h_j` and :math:`\mathrm{Var}[\hat h_j] \le (R/B)^2/4`.
    What is kept: the codes (:math:`\lceil G b/8 \rceil` bytes per group) and a float32 scale
    :math:`R/B` and zero :math:`Z` per group; see :class:`PackedTensor` for the exact layout and
    byte count (:math:`b + 0.125` bits per value at the default :math:`G = 512`).

    ``bits`` of 16 or 32 pass through: 32 keeps ``x`` itself (no copy: do not modify it in place
    afterwards), 16 keeps ``x`` if it is already 16-bit and a ``bfloat16`` copy otherwise
    (bfloat16 keeps float32's exponent range, so nothing overflows; it rounds to nearest).

    Non-finite values: a group holding a NaN or an infinity (or whose range overflows float32)
    dequantizes to NaN in every element, on every backend; it never becomes finite. Checking for
    them would cost a device-to-host sync, so no error is raised.

    Args:
        x (torch.Tensor): input of dtype float16, bfloat16, float32 or float64, any shape,
            contiguous or not. Arithmetic is done in float32.
        bits (int, optional): 1 to 8 (packed; the CUDA kernels take 1, 2, 4 and 8, other widths
            run on the torch path), 16 or 32 (pass-through). (default: :obj:`2`)
        group_size (int, optional): elements per group :math:`G`; need not divide ``x.numel()``
            (the last group is shorter). A tensor with fewer elements forms one group of its
            own size. (default: :obj:`512`)
        per_row (bool, optional): one group per row of the last dimension (``group_size`` becomes
            ``x.shape[-1]``), as EXACT does for node features. (default: :obj:`False`)
        generator (torch.Generator, optional): draws the 64-bit seed of the rounding noise, for
            reproducibility; the default CPU generator when ``None`` (so
            ``torch.manual_seed`` also makes it reproducible). A CUDA generator costs one sync.
            (default: :obj:`None`)
        noise (torch.Tensor, optional): explicit float32 uniforms in [0, 1), one per element of
            ``x`` (same device); overrides the counter-based noise. Not with ``generator``.
            (default: :obj:`None`)
        backend (str, optional): ``"torch"`` (reference, any device), ``"cupy"`` (CUDA kernels),
            ``"cpu"`` (compiled CPU kernels, :mod:`gnnact.kernels.cpu`) or ``"auto"`` (the
            device's kernels where they build and agree with the reference, else the torch
            path). (default: :obj:`"auto"`)

    Returns:
        :class:`PackedTensor`

    Example:
        >>> x = torch.randn(1000, 128)
        >>> p = gnnact.quantize(x, bits=2)
        >>> p.nbytes  # 250 groups of 512: 128 code bytes + 8 metadata bytes each
        34000
        >>> gnnact.dequantize(p).shape
        torch.Size([1000, 128])
    """
    x = _check_tensor("x", x)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x must be a floating-point tensor ({', '.join(map(str, FLOAT_DTYPES))})"
                        f", got dtype {x.dtype}")
    bits = _check_int("bits", bits)
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits must be one of {SUPPORTED_BITS}, got {bits}")
    group_size = _check_int("group_size", group_size)
    if group_size <= 0:
        raise ValueError(f"group_size must be a positive int, got {group_size}")
    if per_row:
        if x.dim() == 0:
            raise ValueError("per_row=True needs a tensor with at least one dimension, got a "
                             "0-d tensor")
        group_size = max(1, x.shape[-1])
    if noise is not None:
        if generator is not None:
            raise ValueError("pass either generator or noise, not both")
        noise = _check_tensor("noise", noise)
        if noise.numel() != x.numel() or noise.device != x.device or noise.dtype != torch.float32:
            raise ValueError(f"noise must be float32 with x.numel()={x.numel()} elements on "
                             f"{x.device}, got dtype {noise.dtype} with {noise.numel()} elements "
                             f"on {noise.device}")
    _check_backend(backend, x.device, bits)

    if bits == 32:
        return PackedTensor(x, None, None, 32, x.shape, x.dtype, 0)
    if bits == 16:
        kept = x if x.element_size() == 2 else x.to(torch.bfloat16)
        return PackedTensor(kept, None, None, 16, x.shape, x.dtype, 0)

    if x.numel() == 0:
        empty = torch.empty(0, dtype=torch.float32, device=x.device)
        codes = torch.empty((0, packed_code_bytes(group_size, bits)), dtype=torch.uint8,
                            device=x.device)
        return PackedTensor(codes, empty, empty.clone(), bits, x.shape, x.dtype, group_size)
    # A tensor smaller than one group is one group of its own size: no padding bytes.
    group_size = min(group_size, x.numel())
    seed = None if noise is not None else draw_seed_tensor(generator)
    codes, scales, zeros = operators.quantize_groups(x, bits, group_size, backend, seed, noise)
    return PackedTensor(codes, scales, zeros, bits, x.shape, x.dtype, group_size)


def dequantize(packed: PackedTensor, *, backend: Backend = "auto") -> Tensor:
    r"""Restore a tensor from :func:`quantize`: :math:`\hat h_j = q_j s + Z` per group.

    Args:
        packed (PackedTensor): the compressed tensor.
        backend (str, optional): as in :func:`quantize`. (default: :obj:`"auto"`)

    Returns:
        torch.Tensor: a tensor of ``packed.shape`` and ``packed.dtype`` on ``packed.device``
        (for 32 bits, the very tensor that was passed to :func:`quantize`).

    Example:
        >>> x = torch.randn(1000, 128)
        >>> x_hat = gnnact.dequantize(gnnact.quantize(x, bits=4))
        >>> x_hat.shape, x_hat.dtype
        (torch.Size([1000, 128]), torch.float32)
        >>> bool((x_hat - x).mean().abs() < 1e-2)  # unbiased: the errors average out
        True
        >>> gnnact.dequantize(gnnact.quantize(x, bits=32)) is x  # pass-through
        True
    """
    if not isinstance(packed, PackedTensor):
        raise TypeError(f"packed must be a PackedTensor, got {type(packed).__name__}")
    if packed.bits == 32:
        return packed.codes
    if packed.bits == 16:
        return packed.codes.to(packed.dtype)
    _check_backend(backend, packed.device, packed.bits)
    if packed.numel == 0:
        return torch.empty(packed.shape, dtype=packed.dtype, device=packed.device)
    flat = operators.dequantize_groups(packed.codes, packed.scales, packed.zeros, packed.bits,
                                       packed.group_size, packed.numel, packed.dtype, backend)
    return flat.view(packed.shape)


def pack_mask(mask: Tensor, *, backend: Backend = "auto") -> PackedMask:
    r"""Pack a boolean tensor to one bit per element (:math:`\lceil n/8 \rceil` bytes).

    Element :math:`i` of the flattened mask (row-major) becomes bit :math:`i \bmod 8` of byte
    :math:`\lfloor i/8 \rfloor`. Used for what ReLU, LeakyReLU and dropout need in backward:
    the sign or keep mask, exactly (8× less than a ``torch.bool`` tensor).

    Args:
        mask (torch.Tensor): ``torch.bool`` tensor, any shape, contiguous or not.
        backend (str, optional): as in :func:`quantize`. (default: :obj:`"auto"`)

    Returns:
        :class:`~gnnact.quant.PackedMask`: ``data`` of ``uint8`` and shape
        ``[ceil(mask.numel() / 8)]``, ``shape`` of ``mask.shape``.

    Example:
        >>> mask = torch.rand(1000, 64) > 0.5
        >>> packed = gnnact.pack_mask(mask)
        >>> packed.nbytes  # 64,000 bits
        8000
        >>> torch.equal(gnnact.unpack_mask(packed), mask)
        True
    """
    mask = _check_tensor("mask", mask)
    if mask.dtype != torch.bool:
        raise TypeError(f"mask must be a torch.bool tensor, got dtype {mask.dtype}")
    _check_backend(backend, mask.device)
    if mask.numel() == 0:
        return PackedMask(torch.empty(0, dtype=torch.uint8, device=mask.device), mask.shape)
    return PackedMask(operators.pack_mask_bits(mask, backend), mask.shape)


def unpack_mask(packed: PackedMask, *, backend: Backend = "auto") -> Tensor:
    r"""Restore the ``torch.bool`` tensor packed by :func:`pack_mask`, exactly: element
    :math:`i` is bit :math:`i \bmod 8` of byte :math:`\lfloor i/8 \rfloor` of ``packed.data``.

    Args:
        packed (gnnact.quant.PackedMask): the packed mask.
        backend (str, optional): as in :func:`quantize`. (default: :obj:`"auto"`)

    Returns:
        torch.Tensor: a ``torch.bool`` tensor of ``packed.shape`` on ``packed.device``.

    Example:
        >>> mask = torch.tensor([[True, False, True], [False, False, True]])
        >>> gnnact.unpack_mask(gnnact.pack_mask(mask))
        tensor([[ True, False,  True],
                [False, False,  True]])
    """
    if not isinstance(packed, PackedMask):
        raise TypeError(f"packed must be a PackedMask, got {type(packed).__name__}")
    _check_backend(backend, packed.device)
    if packed.numel == 0:
        return torch.empty(packed.shape, dtype=torch.bool, device=packed.device)
    return operators.unpack_mask_bits(packed.data, packed.numel, backend).view(packed.shape)

