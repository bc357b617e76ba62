"""CuPy launchers for ``cuda/quantize.cu`` and ``cuda/mask.cu``.

Same signatures and results as :mod:`gnnact.quant.reference` (given the same ``noise`` or
``seed``), for CUDA tensors.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from gnnact.kernels._cupy import COMPILE_OPTIONS, device_ptr, launch, resident_blocks
from gnnact.quant.packed import QUANT_BITS, packed_code_bytes
from gnnact.quant.philox import VALUES_PER_DRAW, check_draw, keep_probability
from gnnact.quant.rng import split_seed

__all__ = ["COMPILE_OPTIONS", "KERNEL_BITS", "KERNEL_DTYPES", "KERNEL_NAMES",
           "apply_packed_mask", "dequantize_groups", "dropout_keep_bits", "pack_mask_bits",
           "quantize_groups", "sign_mask", "unpack_mask_bits", "vector_ok"]

_DTYPE_NAMES = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16",
                torch.bfloat16: "bf16"}
#: The dtypes every kernel is built for.
KERNEL_DTYPES = tuple(_DTYPE_NAMES)

#: The widths ``cuda/quantize.cu`` implements: all of them. ``backend="cupy"`` sends every
#: width here; ``"auto"`` sends a width here once :func:`gnnact.quant.backends.kernel_agrees` has
#: found its kernel equal to the reference on the device (``tests/test_kernels.py`` checks
#: every width when a GPU is there).
KERNEL_BITS = QUANT_BITS

#: Entry points each source must define (checked by tools/check_kernels.py).
KERNEL_NAMES: dict[str, tuple[str, ...]] = {
    "quantize.cu": tuple(f"{op}_{dt}_{b}" for op in ("quantize", "dequantize")
                         for dt in _DTYPE_NAMES.values() for b in KERNEL_BITS),
    "mask.cu": ("pack_mask", "unpack_mask", "dropout_keep_bits",
                *(f"{op}_{dt}" for op in ("sign_mask", "apply_packed_mask")
                  for dt in _DTYPE_NAMES.values())),
}

_WARPS_PER_BLOCK = 8
_THREADS = 256
#: The lanes that share a group in each op's kernels unless a build sets them (cuda/quantize.cu's
#: QUANTIZE_LANES and DEQUANTIZE_LANES, or LANES for both): a warp takes 32 / lanes groups at
#: once.
_LANES = {"quantize": 16, "dequantize": 32}
#: The octets a lane keeps in registers in each op's kernels unless a build sets them
#: (QUANTIZE_CACHED, DEQUANTIZE_CACHED, or CACHED for both): with :data:`_LANES`, the size of
#: the group a lane's segment keeps whole (8 lanes cached elements).
_CACHED = {"quantize": 4, "dequantize": 2}


def _group_grid(num_groups: int) -> int:
    return max(1, -(-num_groups // _WARPS_PER_BLOCK))


def _define(defines: tuple[str, ...], name: str, default: int) -> int:
    """The value a build's ``defines`` give the setting ``name`` (``default`` if none)."""
    for define in defines:
        key, _, value = define.partition("=")
        if key == name:
            return int(value)
    return default


def _op_setting(op: str, name: str, defines: tuple[str, ...], defaults: dict[str, int]) -> int:
    """The shape setting ``name`` of ``op``'s kernels (``"quantize"`` or ``"dequantize"``) in
    the build ``defines``: its one-op setting (QUANTIZE_<name>, DEQUANTIZE_<name>), else its
    ``name`` (both ops), else ``defaults[op]``."""
    return _define(defines, f"{op.upper()}_{name}", _define(defines, name, defaults[op]))


def _lanes(op: str, defines: tuple[str, ...]) -> int:
    """The lanes that share a group in ``op``'s kernels of the build ``defines``."""
    return _op_setting(op, "LANES", defines, _LANES)


def _cached(op: str, defines: tuple[str, ...]) -> int:
    """The octets a lane keeps in registers in ``op``'s kernels of the build ``defines``."""
    return _op_setting(op, "CACHED", defines, _CACHED)


def _grid(num_groups: int, kernel: str, device: torch.device,
          defines: tuple[str, ...]) -> int:
    """Blocks for ``num_groups`` groups: a warp of ``kernel`` takes ``32 / LANES`` groups at
    once (2 to quantize and 1 to dequantize by default: :data:`_LANES`); a WAVES=k build gets
    at most k times the blocks of ``kernel`` that ``device`` holds at once (2 on the CPU, where
    tests run the kernels on the host), so that each warp takes several groups in turn: no
    block waits on its slowest warp to free its place, and the kernel's set-up is paid once
    for many groups."""
    op = kernel.partition("_")[0]
    segments = 32 // _lanes(op, defines)
    grid = _group_grid(-(-num_groups // segments))
    waves = _define(defines, "WAVES", 0)
    if waves < 0:
        raise ValueError(f"WAVES must be >= 0 (0: a block for every 8 warps' groups), got {waves}")
    if not waves:
        return grid
    if device.type != "cuda":
        return min(grid, 2)
    return min(grid, waves * resident_blocks("quantize.cu", kernel, device, _THREADS, defines))


def vector_ok(group_size: int, *tensors: Tensor | None) -> bool:
    """Whether the kernels may load and store whole octets (8 elements) with 16-byte vector
    accesses (and ``cuda/quantize.cu`` an octet's code bytes with one access): every group
    starts on an octet (``group_size % 8 == 0``; the mask ops pass 8) and every buffer is
    16-byte aligned. torch's own allocations are; a view into the middle of one (``x[1:]``)
    need not be, and then the kernels access element by element, with the same results."""
    return group_size % 8 == 0 and all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


def _dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"the CUDA kernels support {list(_DTYPE_NAMES)}, got {dtype}") from None


def quantize_groups(x: Tensor, bits: int, group_size: int, *, seed: int | None = None,
                    noise: Tensor | None = None, defines: tuple[str, ...] = ()
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """Kernel twin of :func:`gnnact.quant.reference.quantize_groups` (``defines``: a build of
    ``cuda/quantize.cu`` with other compile-time settings, for tuning; same results)."""
    x = x.contiguous()
    n = x.numel()
    num_groups = -(-n // group_size)
    bytes_per_group = packed_code_bytes(group_size, bits)
    codes = torch.empty((num_groups, bytes_per_group), dtype=torch.uint8, device=x.device)
    scales = torch.empty(num_groups, dtype=torch.float32, device=x.device)
    zeros = torch.empty(num_groups, dtype=torch.float32, device=x.device)
    if noise is not None:
        noise = noise.reshape(-1).to(torch.float32).contiguous()
    s0, s1 = split_seed(seed or 0)
    kernel = f"quantize_{_dtype_name(x.dtype)}_{bits}"
    launch("quantize.cu", kernel, x.device, _grid(num_groups, kernel, x.device, defines),
           _THREADS,
           (device_ptr(x), device_ptr(noise), device_ptr(codes), device_ptr(scales),
            device_ptr(zeros), np.int64(n), np.int64(group_size), np.int64(num_groups),
            np.int64(bytes_per_group), np.uint32(s0), np.uint32(s1),
            np.int32(vector_ok(group_size, x, noise, codes))), defines)
    return codes, scales, zeros


def dequantize_groups(codes: Tensor, scales: Tensor, zeros: Tensor, bits: int, group_size: int,
                      numel: int, dtype: torch.dtype, *, defines: tuple[str, ...] = ()
                      ) -> Tensor:
    """Kernel twin of :func:`gnnact.quant.reference.dequantize_groups` (``defines`` as for
    :func:`quantize_groups`)."""
    out = torch.empty(numel, dtype=dtype, device=codes.device)
    codes = codes.contiguous()
    num_groups, bytes_per_group = codes.shape
    kernel = f"dequantize_{_dtype_name(dtype)}_{bits}"
    launch("quantize.cu", kernel, codes.device, _grid(num_groups, kernel, codes.device, defines),
           _THREADS,
           (device_ptr(codes), device_ptr(scales.contiguous()),
            device_ptr(zeros.contiguous()), device_ptr(out), np.int64(numel),
            np.int64(group_size), np.int64(num_groups), np.int64(bytes_per_group),
            np.int32(vector_ok(group_size, codes, out))), defines)
    return out


def pack_mask_bits(mask: Tensor) -> Tensor:
    """Kernel twin of :func:`gnnact.quant.reference.pack_mask_bits`."""
    flat = mask.reshape(-1).contiguous().view(torch.uint8)
    n = flat.numel()
    nbytes = -(-n // 8)
    out = torch.empty(nbytes, dtype=torch.uint8, device=mask.device)
    launch("mask.cu", "pack_mask", mask.device, max(1, -(-nbytes // _THREADS)), _THREADS,
           (device_ptr(flat), device_ptr(out), np.int64(n), np.int64(nbytes)))
    return out


def unpack_mask_bits(data: Tensor, numel: int) -> Tensor:
    """Kernel twin of :func:`gnnact.quant.reference.unpack_mask_bits`."""
    out = torch.empty(numel, dtype=torch.bool, device=data.device)
    launch("mask.cu", "unpack_mask", data.device, max(1, -(-numel // _THREADS)), _THREADS,
           (device_ptr(data.contiguous()), device_ptr(out), np.int64(numel)))
    return out


def dropout_keep_bits(numel: int, p: float, seed: int, offset: int, threads: int,
                      device: torch.device | str = "cuda") -> Tensor:
    """Kernel twin of :func:`gnnact.quant.philox.dropout_keep_bits`: one thread per output
    byte (two Philox draws)."""
    check_draw(numel, offset)
    device = torch.device(device)
    nbytes = -(-numel // 8)
    out = torch.empty(nbytes, dtype=torch.uint8, device=device)
    launch("mask.cu", "dropout_keep_bits", device, max(1, -(-nbytes // _THREADS)), _THREADS,
           (device_ptr(out), np.int64(numel), np.int64(nbytes), np.uint32(seed & 0xFFFFFFFF),
            np.uint32((seed >> 32) & 0xFFFFFFFF), np.int64(offset // 4),
            np.int64(threads * VALUES_PER_DRAW), np.float32(keep_probability(p))))
    return out


def octet_grid(n: int) -> int:
    """Blocks for one thread per octet (8 elements, one mask byte) of ``n`` elements."""
    return max(1, -(-n // (8 * _THREADS)))


def sign_mask(x: Tensor, out: Tensor, mode: int, s: float) -> Tensor:
    """Kernel twin of :func:`gnnact.quant.reference.sign_mask`: one pass over ``x``, each
    thread an octet and its mask byte."""
    n = x.numel()
    data = torch.empty((n + 7) // 8, dtype=torch.uint8, device=x.device)
    launch("mask.cu", f"sign_mask_{_dtype_name(x.dtype)}", x.device, octet_grid(n), _THREADS,
           (device_ptr(x), device_ptr(out), device_ptr(data), np.int64(n), np.int32(mode),
            np.float64(s), np.int32(vector_ok(8, x, out))))
    return data


def apply_packed_mask(x: Tensor, data: Tensor, out: Tensor, mode: int, s: float) -> Tensor:
    """Kernel twin of :func:`gnnact.quant.reference.apply_packed_mask`: one pass."""
    n = x.numel()
    launch("mask.cu", f"apply_packed_mask_{_dtype_name(x.dtype)}", x.device, octet_grid(n),
           _THREADS, (device_ptr(x), device_ptr(data.contiguous()), device_ptr(out),
                      np.int64(n), np.int32(mode), np.float64(s),
                      np.int32(vector_ok(8, x, out))))
    return out
