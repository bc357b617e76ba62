r"""Which implementation runs a quantizer or mask primitive: the torch reference
(``gnnact.quant.reference``, any device), the CuPy kernels (``gnnact.kernels.quantize``, CUDA
tensors) or the compiled CPU kernels (``gnnact.kernels.cpu``, CPU tensors), each checked once
per device and width against the reference before ``"auto"`` takes it.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Literal

import torch
from torch import Tensor

from gnnact.env import cuda_index
from gnnact.quant import reference
from gnnact.quant.packed import DEFAULT_GROUP_SIZE, QUANT_BITS
from gnnact.quant.rng import hash_uniform

__all__ = ["BACKENDS", "Backend", "check_name", "cpu_grid_kernel_agrees", "cpu_kernel_agrees",
           "cpu_kernels_built", "cpu_mask_kernels_agree", "grid_backend", "kernel_agrees",
           "kernel_matches", "mask_backend", "mask_kernels_agree", "mask_kernels_match",
           "select"]

#: The type of a ``backend=`` argument.
Backend = Literal["auto", "torch", "cupy", "cpu"]

#: What ``backend=`` takes.
BACKENDS = ("auto", "torch", "cupy", "cpu")


def check_name(backend: str) -> None:
    """Raise a ``ValueError`` naming ``backend`` unless it is one of :data:`BACKENDS`."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")


def select(backend: str, device: torch.device, bits: int | None = None) -> ModuleType:
    """The module implementing ``quantize_groups`` & co. for ``backend`` on ``device`` (and
    ``bits``). ``"auto"`` takes the kernels of the device (CuPy's on a CUDA device, the
    compiled CPU kernels on the CPU) for each width once :func:`kernel_agrees` has checked it
    there, else the torch reference."""
    check_name(backend)
    if backend == "torch" or (backend == "auto" and device.type not in ("cuda", "cpu")):
        return reference
    if backend == "cpu" or (backend == "auto" and device.type == "cpu"):
        return _cpu_kernels(backend, device, bits)
    from gnnact.kernels import cupy_available

    if backend == "cupy":
        if device.type != "cuda":
            raise ValueError(f"backend='cupy' needs a CUDA tensor, got a tensor on {device}")
        from gnnact.kernels._cupy import require_cupy

        require_cupy()
    # 16 and 32 bits keep the tensor as it is: no kernel to check.
    elif not cupy_available() or (bits in QUANT_BITS
                                  and not kernel_agrees(cuda_index(device), bits)):
        return reference
    from gnnact.kernels import quantize as kernels

    return kernels


def _cpu_kernels(backend: str, device: torch.device, bits: int | None) -> ModuleType:
    """:func:`select` of ``"cpu"``, or of ``"auto"`` on the CPU."""
    from gnnact.kernels import cpu

    if backend == "cpu":
        if device.type != "cpu":
            raise ValueError(f"backend='cpu' needs a CPU tensor, got a tensor on {device}")
        cpu.library()  # (raises, saying why, where it cannot be built)
        return cpu
    if not cpu_kernels_built() or (bits in QUANT_BITS and not cpu_kernel_agrees(bits)):
        return reference
    return cpu


@functools.cache
def cpu_kernels_built() -> bool:
    """Whether the compiled CPU kernels (:mod:`gnnact.kernels.cpu`) build and load in this
    process: tried once; where they do not (no C++ compiler, a failed build), a warning says
    why and that quantization runs on the torch path on the CPU."""
    from gnnact.kernels import cpu

    return _self_check(lambda: cpu.library() is not None, "the compiled CPU kernels are not used",
                       "quantization runs on the torch path on the CPU (same format, 3-5x "
                       "slower; the rounding noise drawn from another stream)")


@functools.cache
def cpu_kernel_agrees(bits: int) -> bool:
    """:func:`kernel_agrees` for the compiled CPU kernels: checked once per width in a
    process."""
    from gnnact.kernels import cpu

    return _self_check(lambda: kernel_matches(cpu, torch.device("cpu"), bits),
                       f"the {bits}-bit compiled CPU kernel is not used",
                       f"{bits}-bit quantization runs on the torch path on the CPU (same "
                       f"format, slower)")


@functools.cache
def kernel_agrees(device_index: int, bits: int) -> bool:
    """Whether the CUDA kernels for ``bits`` reproduce the torch reference
    (``gnnact.quant.reference``) on GPU ``device_index``, bit for bit: checked once per device
    and width in a process: quantize and dequantize of 1,061 float32 values in groups of 64 and
    of 512 (the default size, which the kernels take by a path compiled for it), the last one
    short, with fixed noise and with the seeded hash, in groups of 13, which the kernels
    take element by element rather than by 16-byte vectors, and of the same values in
    bfloat16 and float16.
    ``backend="auto"`` sends a width to the kernels only when they agree; otherwise it warns,
    naming the width, and keeps it on the torch path (the same format, slower).
    ``backend="cupy"`` calls the kernels unchecked.

    Example:
        >>> from gnnact.quant.backends import kernel_agrees
        >>> kernel_agrees(0, 3)  # doctest: +SKIP
        True
    """
    from gnnact.kernels import quantize as kernels

    device = torch.device("cuda", device_index)
    return _self_check(lambda: kernel_matches(kernels, device, bits),
                       f"the {bits}-bit CUDA kernel is not used on cuda:{device_index}",
                       f"{bits}-bit quantization runs on the torch path there (same format, "
                       f"slower)")


def kernel_matches(kernels: ModuleType, device: torch.device, bits: int) -> bool:
    """:func:`kernel_agrees`'s check of the launchers in ``kernels`` on ``device`` against the
    reference on the CPU (its seeded noise being the hash the kernels compute, as the
    reference draws it on CUDA)."""
    generator = torch.Generator().manual_seed(0)
    values = torch.randn(2 * DEFAULT_GROUP_SIZE + 37, generator=generator)
    fixed = torch.rand(values.numel(), generator=generator)

    def agree(group_size: int, noise: Tensor | None, seed: int | None,
              dtype: torch.dtype = torch.float32) -> bool:
        x = values.to(dtype)
        reference_noise = noise if noise is not None else hash_uniform(seed, 0, x.numel())
        want = reference.quantize_groups(x, bits, group_size, noise=reference_noise)
        got = kernels.quantize_groups(x.to(device), bits, group_size, seed=seed,
                                      noise=None if noise is None else noise.to(device))
        back = kernels.dequantize_groups(*got, bits, group_size, x.numel(), dtype)
        return (all(torch.equal(a, b.cpu()) for a, b in zip(want, got, strict=True))
                and torch.equal(back.cpu(), reference.dequantize_groups(
                    *want, bits, group_size, x.numel(), dtype)))

    # float16 and bfloat16 too: the kernels take their range pass on packed pairs.
    return (agree(64, fixed, None) and agree(64, None, 7) and agree(13, fixed, None)
            and agree(DEFAULT_GROUP_SIZE, fixed, None) and agree(DEFAULT_GROUP_SIZE, None, 7)
            and agree(DEFAULT_GROUP_SIZE, None, 7, torch.bfloat16)
            and agree(DEFAULT_GROUP_SIZE, None, 7, torch.float16))


def _self_check(check: Callable[[], bool], unused: str, instead: str) -> bool:
    """``check()``'s verdict on a kernel; when it disagrees or fails (a kernel that does not
    compile or launch), a warning saying ``unused``, why, and what runs ``instead``."""
    try:
        agree = check()
        why = "its results differ from the torch path"
    except Exception as e:  # say so, keep going on the torch path
        agree, why = False, f"it failed: {type(e).__name__}: {e}"
    if not agree:
        warnings.warn(f"gnnact: {unused}: {why}; {instead}", RuntimeWarning, stacklevel=4)
    return agree


def mask_backend(x: Tensor) -> ModuleType:
    """The module implementing ``sign_mask`` and ``apply_packed_mask`` for ``x``: the device's
    kernels (one pass each: CUDA's with CuPy, the compiled CPU kernels for float32) once
    :func:`mask_kernels_agree` has checked them there, else the torch path
    (``gnnact.quant.reference``, block by block)."""
    if x.device.type == "cpu":
        from gnnact.kernels import cpu

        if x.dtype in cpu.KERNEL_DTYPES and cpu_kernels_built() and cpu_mask_kernels_agree():
            return cpu
        return reference
    from gnnact.kernels import cupy_available

    if x.device.type != "cuda" or not cupy_available():
        return reference
    from gnnact.kernels import quantize as kernels

    if x.dtype not in kernels.KERNEL_DTYPES or not mask_kernels_agree(cuda_index(x.device)):
        return reference
    return kernels


def grid_backend(h: Tensor, bits: int) -> ModuleType:
    """The module implementing ``quantize_on_grid`` (Mesa's rounding onto running ranges) for
    ``h``: the compiled CPU kernels for a float32 CPU tensor once
    :func:`cpu_grid_kernel_agrees` has checked them, else the torch path (on CUDA too)."""
    if h.device.type == "cpu" and h.dtype == torch.float32 and cpu_kernels_built():
        from gnnact.kernels import cpu

        if cpu_grid_kernel_agrees(bits):
            return cpu
    return reference


@functools.cache
def cpu_grid_kernel_agrees(bits: int) -> bool:
    """Whether the compiled CPU kernel of ``quantize_on_grid`` reproduces the torch path for
    ``bits``, given the same noise: rows of 37 and of 2,100 values (more than a piece of the
    kernel's), values on both sides of the grid and a NaN; checked once per width in a process,
    with a warning where it does not (Mesa then rounds on the torch path)."""
    from gnnact.kernels import cpu

    def check() -> bool:
        generator = torch.Generator().manual_seed(0)
        levels = (1 << bits) - 1
        for groups, size in ((3, 37), (2, 2100)):
            h = 3 * torch.randn(groups, size, generator=generator)
            h[0, 1] = float("nan")
            zeros, invs = torch.full((groups,), -1.0), torch.full((groups,), levels / 2.5)
            invs[-1] = 0.0  # (a group of no width)
            got = cpu.quantize_on_grid(h, zeros, invs, bits, -0.01, levels + 0.01, seed=7)
            want = reference.quantize_on_grid(h, zeros, invs, bits, -0.01, levels + 0.01,
                                              noise=hash_uniform(7, 0, h.numel()))
            if not all(torch.equal(a, b) for a, b in zip(got, want, strict=True)):
                return False
        return True

    return _self_check(check, f"the {bits}-bit compiled CPU kernel of Mesa's rounding is not "
                       "used", "Mesa rounds on the torch path on the CPU (same format, slower)")


def _same_values(a: Tensor, b: Tensor) -> bool:
    """Equal values, the sign of zeros included, and NaN where NaN."""
    nan = a.isnan()
    return (torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])
            and torch.equal(a[~nan].signbit(), b[~nan].signbit()))


@functools.cache
def mask_kernels_agree(device_index: int) -> bool:
    """Whether the fused mask kernels (``cuda/mask.cu``: ``sign_mask``, ``apply_packed_mask``)
    reproduce the torch path on GPU ``device_index`` for every dtype they take and every mode,
    in place and not (values with NaN, infinities, signed zeros and subnormals, a length that
    is no multiple of 32): checked once per device in a process. Where they do not, the mask
    ops stay on the torch path there, with a warning naming why
    (:func:`cpu_mask_kernels_agree`: the same for the compiled CPU kernels).

    Example:
        >>> from gnnact.quant.backends import mask_kernels_agree
        >>> mask_kernels_agree(0)  # doctest: +SKIP
        True
    """
    from gnnact.kernels import quantize as kernels

    device = torch.device("cuda", device_index)
    return _self_check(lambda: mask_kernels_match(kernels, device),
                       f"the fused mask kernels are not used on cuda:{device_index}",
                       _MASKS_INSTEAD)


@functools.cache
def cpu_mask_kernels_agree() -> bool:
    """:func:`mask_kernels_agree` for the compiled CPU kernels (float32): checked once in a
    process."""
    from gnnact.kernels import cpu

    return _self_check(lambda: mask_kernels_match(cpu, torch.device("cpu")),
                       "the compiled CPU mask kernels are not used", _MASKS_INSTEAD)


_MASKS_INSTEAD = ("ReLU, LeakyReLU and dropout run on the torch path there (same results, more "
                  "passes)")


def mask_kernels_match(kernels: ModuleType, device: torch.device) -> bool:
    """:func:`mask_kernels_agree`'s check of the mask launchers in ``kernels`` against the
    torch path, both on ``device``."""
    base = torch.randn(1000 + 37, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    # Subnormals of float32 and bfloat16 (1e-40) and of float16 (1e-5 after rounding), which
    # a kernel compiled with -ftz=true would flush.
    base[:10] = torch.tensor([float("nan"), 0.0, -0.0, float("inf"), -float("inf"), 1.0,
                              1e-40, -1e-40, 1e-5 / 2**5, -1e-5 / 2**5], dtype=torch.float64)
    modes = ((reference.MASK_MUL, 1.0), (reference.MASK_MUL, 2.0),
             (reference.MASK_ZERO, 1.0), (reference.MASK_SELECT, 0.2))
    for dtype in kernels.KERNEL_DTYPES:
        x = base.to(device, dtype)
        for mode, s in modes:
            want = torch.empty_like(x)
            want_bits = reference.sign_mask(x, want, mode, s)
            got = torch.empty_like(x)
            got_bits = kernels.sign_mask(x, got, mode, s)
            in_place = x.clone()
            kernels.sign_mask(in_place, in_place, mode, s)
            applied = kernels.apply_packed_mask(x, want_bits, torch.empty_like(x), mode, s)
            want_applied = reference.apply_packed_mask(x, want_bits, torch.empty_like(x),
                                                       mode, s)
            if not (torch.equal(got_bits, want_bits) and all(
                    _same_values(a, b) for a, b in ((got, want), (in_place, want),
                                                    (applied, want_applied)))):
                return False
    return True
