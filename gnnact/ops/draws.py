"""Dropout's keep-mask, drawn as :func:`torch.nn.functional.dropout` draws it on each device,
so that a seeded compressed run reproduces PyTorch's (and PyG's) masks.

On the CPU, ``F.dropout`` fills a tensor with ``bernoulli_(1 - p)``: the generator's stream
does not depend on the dtype, so booleans get the same draws without a full-size float mask.
On a CUDA device ``F.dropout`` runs the fused ``native_dropout`` kernel, whose draws depend on
the tensor's size, dtype and alignment and differ from ``bernoulli_``'s. :func:`keep_bits`
computes that kernel's draws itself where it can (:mod:`gnnact.quant.philox`: float32,
contiguous, 16-byte aligned, a multiple of 4 values), straight into packed bits; elsewhere the
kernel's own mask is taken, beside a transient output of the input's size.

PyTorch's CPU ``bernoulli_`` runs its generator (MT19937) once per element, serially, at
about 15 ns an element: on a CPU the input dropout of a Planetoid model (Cora's 3.9 M
features) is most of its step, for PyTorch and PyG as much as for gnnact. Where the compiled
CPU kernels build (:mod:`gnnact.kernels.cpu`), :func:`keep_bits` and :func:`keep_mask` draw
the same numbers from the same generator state in one tight loop, straight into bits
(``gnnact_bernoulli_bits``: 5 ms for Cora's features where ``bernoulli_`` takes 75-90 ms, one
thread), and leave the generator where
``bernoulli_`` leaves it. Checked once per process against ``bernoulli_`` itself
(:func:`cpu_draws_agree`); tensors under :data:`CPU_DRAW_ELEMENTS` values keep PyTorch's
draw (reading and writing the generator's 5 KB state costs more).
"""

from __future__ import annotations

import functools
import threading

import torch
from torch import Tensor

from gnnact.quant import PackedMask, pack_mask, unpack_mask
from gnnact.quant.philox import VALUES_PER_DRAW, dropout_launch

__all__ = ["CPU_DRAW_ELEMENTS", "cpu_draws_agree", "fused_draws_agree", "keep_bits",
           "keep_mask"]

#: Values from which the CPU draws take the compiled kernel (:func:`cpu_draws_agree`).
CPU_DRAW_ELEMENTS = 1 << 10


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
        if _draws_on_cpu(like):
            bits = _draw_bits_cpu(like.numel(), 1 - p)
            return unpack_mask(PackedMask(bits, like.shape)).to(dtype)
        return torch.empty_like(like, dtype=dtype).bernoulli_(1 - p)


def keep_bits(like: Tensor, p: float) -> PackedMask:
    r""":func:`keep_mask`, packed to one bit a value: the mask ``F.dropout(like, p)`` draws.

    On a CUDA device, for a float32 ``like`` that is contiguous, 16-byte aligned and of a
    multiple of 4 values (where ``native_dropout`` takes its 4-wide path), with CuPy, the
    draws are computed from the generator's seed and Philox offset straight into bits
    (``cuda/mask.cu``'s ``dropout_keep_bits``), and the offset is advanced as
    ``native_dropout`` advances it: :math:`n/8` bytes in all, where drawing through
    ``native_dropout`` holds :math:`5n` (its output and a byte a value) at once. Used once
    :func:`fused_draws_agree` has found the kernel equal to ``native_dropout`` on the device.

    Example:
        >>> x = torch.ones(1000)
        >>> _ = torch.manual_seed(0)
        >>> bits = keep_bits(x, 0.5)
        >>> _ = torch.manual_seed(0)
        >>> from gnnact.quant import unpack_mask
        >>> torch.equal(unpack_mask(bits), torch.nn.functional.dropout(x, 0.5) > 0)
        True
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must be in (0, 1) to draw a mask, got {p}")
    if _computes_draws(like) and fused_draws_agree(like.device.index):
        return PackedMask(_draw_bits(like.numel(), p, like.device), like.shape)
    if _draws_on_cpu(like):
        return PackedMask(_draw_bits_cpu(like.numel(), 1 - p), like.shape)
    return pack_mask(keep_mask(like, p))


def _computes_draws(like: Tensor) -> bool:
    """Whether ``native_dropout`` takes the 4-wide path that :mod:`gnnact.quant.philox`
    reproduces for ``like``, and the generator can be read and advanced here (not while a
    CUDA graph is captured or a function compiled)."""
    from gnnact.kernels import cupy_available

    return (like.is_cuda and like.dtype == torch.float32 and like.numel() > 0
            and like.numel() % VALUES_PER_DRAW == 0 and like.is_contiguous()
            and like.data_ptr() % 16 == 0 and not torch.compiler.is_compiling()
            and not torch.cuda.is_current_stream_capturing() and _default_generator_draws()
            and cupy_available())


def _default_generator_draws() -> bool:
    """Whether a random ATen op called here draws from its device's default generator: no
    dispatch mode is active but ones that declare they leave random ops alone
    (``transparent_to_randomness``). A mode may give them another generator (a
    :class:`gnnact.Controller`'s estimation passes: :mod:`gnnact.adaptive.randomness`), which
    draws computed from the default generator's state would not follow."""
    if not torch._C._len_torch_dispatch_stack():
        return True
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    return all(getattr(mode, "transparent_to_randomness", False)
               for mode in _get_current_dispatch_mode_stack())


# The generator's offset is read and then advanced in two calls: one lock for all of gnnact's
# draws keeps two threads' from overlapping (PyTorch's own draws take the generator's lock).
_ADVANCE = threading.Lock()


def _draw_bits(numel: int, p: float, device: torch.device) -> Tensor:
    """The packed keep-mask of ``numel`` float32 values from ``device``'s default generator,
    which then stands where ``native_dropout`` would have left it."""
    from gnnact.kernels import quantize as kernels

    generator = torch.cuda.default_generators[device.index]
    properties = torch.cuda.get_device_properties(device)
    threads, increment = dropout_launch(numel, properties.multi_processor_count,
                                        properties.max_threads_per_multi_processor)
    with _ADVANCE:
        seed, offset = generator.initial_seed(), generator.get_offset()
        generator.set_offset(offset + increment)
    return kernels.dropout_keep_bits(numel, p, seed, offset, threads, device)


# Cached per process: a fact about this build of PyTorch and this device, not about a model.
@functools.cache
def fused_draws_agree(device_index: int) -> bool:
    """Whether ``dropout_keep_bits`` draws what ``native_dropout`` draws on GPU
    ``device_index``, and leaves the generator where it does: checked once per device in a
    process, on sizes below and above the launch's grid cap (one pass and several), with the
    generator's state put back afterwards. Where it does not (or the kernel does not build),
    a warning says so and the masks are drawn through ``native_dropout``: the same masks."""
    from gnnact.quant.backends import _self_check

    return _self_check(lambda: _draws_match(device_index),
                       f"dropout_keep_bits is not used on cuda:{device_index}",
                       "dropout's masks are drawn through native_dropout there (the same masks, "
                       "with a transient of 5 bytes a value)")


def _draws_match(device_index: int) -> bool:
    device = torch.device("cuda", device_index)
    generator = torch.cuda.default_generators[device_index]
    state = generator.get_state()
    try:
        for numel, p in ((1 << 10, 0.5), (3 * (1 << 16) + 4, 0.1), ((1 << 22) + 4, 0.77)):
            x = torch.zeros(numel, device=device)
            start = generator.get_offset()
            want = pack_mask(torch.native_dropout(x, p, True)[1])
            after = generator.get_offset()
            generator.set_offset(start)
            got = _draw_bits(numel, p, device)
            if generator.get_offset() != after or not torch.equal(got, want.data):
                return False
        return True
    finally:
        generator.set_state(state)


def _draws_on_cpu(like: Tensor) -> bool:
    """Whether ``like``'s mask is drawn by the compiled CPU kernel: a contiguous CPU tensor
    of at least :data:`CPU_DRAW_ELEMENTS` values (``F.dropout`` draws in the order of its
    input's memory: a transposed one's elements take the draws in another order), outside a
    function being compiled, where ``bernoulli_`` would draw from the default generator, the
    kernel builds and draws what it draws."""
    from gnnact.kernels import cpu

    return (like.device.type == "cpu" and like.numel() >= CPU_DRAW_ELEMENTS
            and like.is_contiguous() and not torch.compiler.is_compiling()
            and _default_generator_draws()
            and cpu.available() and cpu_draws_agree())


def _draw_bits_cpu(numel: int, q: float) -> Tensor:
    """The packed keep bits of ``numel`` draws of ``bernoulli_(q)`` from the default CPU
    generator, which then stands where ``bernoulli_`` would have left it."""
    from gnnact.kernels import cpu

    generator = torch.default_generator
    with _ADVANCE:  # (read, drawn from and written back as one step: see _ADVANCE)
        state = generator.get_state()
        bits = cpu.bernoulli_bits(state, numel, q)
        generator.set_state(state)
    return bits


# Cached per process: a fact about this build of PyTorch, not about a model.
@functools.cache
def cpu_draws_agree() -> bool:
    """Whether the compiled CPU kernel draws what ``bernoulli_`` draws and leaves the
    generator where it does: checked once per process on a few sizes and probabilities,
    from a state in the middle of a block of the engine and across its twists, with the
    generator's state put back afterwards. Where it does not, a warning says so and the
    masks are drawn by ``bernoulli_``: the same masks, slower."""
    from gnnact.quant.backends import _self_check

    return _self_check(_cpu_draws_match, "the compiled CPU draw is not used",
                       "dropout's masks are drawn by bernoulli_ (the same masks)")


def _cpu_draws_match() -> bool:
    generator = torch.default_generator
    state = generator.get_state()
    try:
        generator.manual_seed(20261129)
        for numel, p in ((1, 0.5), (1000, 0.5), (4099, 0.1), ((1 << 16) + 3, 0.77)):
            torch.rand(numel % 7 + 1)  # (start inside a block)
            start = generator.get_state()
            want = pack_mask(torch.empty(numel).bernoulli_(1 - p).bool()).data
            after = generator.get_state()
            generator.set_state(start)
            if not (torch.equal(_draw_bits_cpu(numel, 1 - p), want)
                    and torch.equal(generator.get_state(), after)):
                return False
        return True
    finally:
        generator.set_state(state)
