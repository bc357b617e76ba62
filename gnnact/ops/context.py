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

An op's input that needs no gradient (the input feature matrix) is kept **by reference** when
``config.resident_inputs`` is set (:func:`input_bits`): it stays resident for the whole
training run anyway, so a packed copy would cost bytes rather than save them. Outputs of
gnnact's ops computed outside autograd (input dropout) are marked :func:`transient` and are
packed like any activation.

With ``config.per_node`` a ``[N, F]`` activation is kept as a
:class:`~gnnact.quant.mixed.MixedPackedTensor` instead (:func:`per_node_quantize`); everything
here handles both packed kinds through their ``tensors()``, ``meta`` and ``from_parts``.

A tensor that is an elementwise function of context other ops already keep costs nothing more.
The output of a compressed BatchNorm, then of ReLU/LeakyReLU/dropout, is such a *derived*
tensor: :math:`z = m_k \circ \dots \circ m_1(\gamma (X - \mu)\sigma^{-1} + \beta)` with the
masks :math:`m_i`. When a later op asks to keep :math:`z` (the next layer's linear map), it keeps
references to :math:`\hat X`, :math:`\mu`, :math:`\sigma^{-1}`, :math:`\gamma`,
:math:`\beta` and the masks instead, the very storages those ops hold, and rebuilds
:math:`\hat z` in backward. :math:`\hat z` is affine in :math:`\hat X` on each mask pattern,
with masks taken from the exact forward pass, so it is unbiased: :math:`\mathbb{E}[\hat z] = z`.
The dropout of a resident input (the feature matrix, :func:`derive_from_input`) is derived
too, from the input itself and its 1-bit mask: rebuilt exactly from one bit a value, where a
2-bit copy would take two and round.
"""

from __future__ import annotations

import contextlib
import math
import weakref
import zlib
from collections.abc import Container, Iterator
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from gnnact.config import Config
from gnnact.memory import storage_key
from gnnact.ops.probe import active_probe, restore
from gnnact.ops.state import ForwardState, OwnRef, forward_state
from gnnact.quant import PackedMask, PackedTensor, pack_mask, quantize, unpack_mask
from gnnact.quant.backends import mask_backend
from gnnact.quant.core import FLOAT_DTYPES
from gnnact.quant.mixed import MixedPackedTensor, allocate_rows, quantize_rows
from gnnact.quant.packed import QUANT_BITS
from gnnact.quant.reference import MASK_MUL, MASK_SELECT, MASK_ZERO, combine_mask

__all__ = ["alias_derived", "apply_mask", "cache_key", "cached", "controlled_noise", "derive",
           "derive_from_input", "derived_steps", "hold_parts", "in_another_form",
           "independent_quantize", "input_bits", "load_context", "mask_mode", "noise_generator",
           "overwritable", "own_context", "per_node_quantize", "pytorch_bytes",
           "records_graph", "release", "remember", "resident", "save_context",
           "shared_quantize", "transient", "width_of"]

def cache_key(x: Tensor) -> tuple[tuple, Tensor]:
    """The key of ``x`` and the object whose identity it rests on: the tensor ``x`` views
    (``x`` itself if it is no view) plus where ``x`` lies in it. A contiguous ``x`` is keyed
    by its offset and length only, whatever its shape: ops often save a fresh view of the same
    data once per consumer (:func:`~torch.nn.functional.linear` flattens a 3-D input, a batched
    matmul a 4-D attention map), and all such views hold the same values in the same order."""
    base = x._base if x._base is not None else x
    if x.is_contiguous():
        return (id(base), (x.storage_offset(), x.numel(), x.dtype)), base
    return (id(base), (x.storage_offset(), tuple(x.shape), x.stride(), x.dtype)), base


@dataclass(frozen=True)
class Reshaped:
    """A shared compressed copy restored in the shape of another view of the same data:
    reshaped, or with ``broadcast`` expanded (a broadcast tensor's values are kept once, see
    :func:`gnnact.compress.lossless.unbroadcast`)."""

    inner: Any
    shape: torch.Size
    broadcast: bool = False

    def tensors(self) -> tuple[Tensor, ...]:
        return self.inner.tensors()

    @property
    def meta(self) -> tuple:
        return (type(self.inner), self.inner.meta, self.shape, self.broadcast)

    @classmethod
    def from_parts(cls, tensors: tuple[Tensor, ...], meta: tuple) -> Reshaped:
        inner_cls, inner_meta, shape, broadcast = meta
        return cls(inner_cls.from_parts(tensors, inner_meta), shape, broadcast)

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes

    def dequantize(self) -> Tensor:
        x = restore(self.inner)
        return x.expand(self.shape) if self.broadcast else x.reshape(self.shape)


# While offloading, ForwardState.held keeps strong references to the tensors behind shared
# copies and derived entries: the offloading hooks move each of them to host memory as soon as
# autograd packs it, and nothing on the device would hold it any more, so the registries' weak
# references would die before the next consumer of the same tensor asked for the shared copy,
# or the next op for a derived tensor's pieces. It would quantize afresh instead: other noise,
# and a second copy. Each entry goes with its registry entry (its tensor died, changed or was
# read by a backward), and all of them when the outermost hold_parts() ends.


def hold_parts() -> contextlib.AbstractContextManager[None]:
    """Inside, the packed copies that :func:`remember` shares and the pieces that
    :func:`derive` records stay alive while the tensor they stand for does, even when nothing
    else on the device references them (:attr:`ForwardState.held
    <gnnact.ops.state.ForwardState>`). :class:`gnnact.compress_saved_tensors` enters it around
    a forward pass that offloads context."""
    return forward_state().hold()


def _release(codes: Tensor, state: ForwardState | None = None) -> None:
    """Stop sharing the packed copy whose codes are ``codes``: a backward pass has read it.
    ``state`` is the forward pass that made it (backward may run in another thread)."""
    state = forward_state() if state is None else state
    for key, entry in list(state.shared.items()):
        if entry[3][0]() is codes:
            del state.shared[key]
            state.held.pop(("cache", key), None)


def _ref(t: Tensor | None) -> weakref.ref | None:
    return None if t is None else weakref.ref(t)


def derive(out: Tensor, source: Tensor | None, kind: str, tensors: tuple, meta: tuple, *,
           source_steps: tuple | None = None) -> None:
    """Record that ``out`` is step ``(kind, tensors, meta)`` applied to ``source`` (``None``:
    a base step, which needs no source). Nothing is recorded if ``source`` is not derived.
    ``source_steps`` stands for ``source`` when an in-place op has overwritten it: its
    :func:`derived_steps`, read before."""
    state = forward_state()
    steps: tuple = ()
    if source_steps is not None:
        steps = source_steps
    elif source is not None:
        found = derived_steps(source)
        if found is None:
            return
        steps = found
    key = id(out)
    out_ref = weakref.ref(out, state.callback("forget_derived", key))
    chain = (*steps, (kind, tuple(map(_ref, tensors)), meta))
    state.derived[key] = (out_ref, out._version, chain)
    # The whole chain: the source's own hold goes when the source dies, before ``out`` does.
    state.keep(("derived", key), (r() for _, refs, _ in chain for r in refs if r is not None))


def derive_from_input(out: Tensor, x: Tensor, kind: str, tensors: tuple, meta: tuple) -> None:
    """Record that ``out`` is step ``(kind, tensors, meta)`` applied to ``x``, a
    :func:`resident` input kept by reference (the input features' dropout: ``x`` and a 1-bit
    mask rebuild it exactly). ``out`` holds ``tensors`` itself: no autograd node keeps
    them (the step ran outside autograd), and they must live as long as ``out`` may be kept."""
    setattr(out, _PIECES, tensors)
    derive(out, None, kind, tensors, meta, source_steps=(("input", (_ref(x),), ()),))


def derived_steps(x: Tensor) -> tuple | None:
    """The steps (weak references) that rebuild ``x`` as it is now, or ``None`` if ``x`` is
    not derived: what an op that overwrites ``x`` reads first, to derive its result from."""
    if _resolve(x) is None:
        return None
    return forward_state().derived[id(x)][2]


def alias_derived(out: Tensor, source: Tensor) -> None:
    """Record ``out`` as rebuilt exactly as ``source`` is (``out`` holds ``source``'s values,
    e.g. an in-place op's result copied back into its input). Nothing if ``source`` is not
    derived."""
    state = forward_state()
    chain = derived_steps(source)
    if chain is None:
        return
    key = id(out)
    state.derived[key] = (weakref.ref(out, state.callback("forget_derived", key)), out._version,
                          chain)
    state.keep(("derived", key), (r() for _, refs, _ in chain for r in refs if r is not None))


def _resolve(x: Tensor) -> list[tuple] | None:
    """The steps that rebuild ``x`` with strong references, or ``None`` if ``x`` is not derived
    (or changed in place, or a piece is gone)."""
    entry = forward_state().derived.get(id(x))
    if entry is None or entry[0]() is not x or entry[1] != x._version:
        return None
    steps = []
    for kind, refs, meta in entry[2]:
        tensors = tuple(None if r is None else r() for r in refs)
        if any(t is None and r is not None for t, r in zip(tensors, refs, strict=True)):
            return None
        steps.append((kind, tensors, meta))
    return steps


def mask_mode(divisor: float, slope: float, dtype: torch.dtype, *,
              backward: bool = False) -> tuple[int, float]:
    r"""The ``gnnact.quant.reference.MASK_*`` mode and its :math:`s` that compute
    :math:`Y = X \odot M / d + s X \odot (1 - M)` as PyTorch's ReLU (:math:`(d, s) = (1, 0)`),
    LeakyReLU (:math:`(1, s)`) and dropout (:math:`(1 - p, 0)`) do, or with ``backward`` its
    gradient as their backward does. Dropout's :math:`s` is F.dropout's scale, a value of
    ``dtype``."""
    if slope != 0.0:
        return MASK_SELECT, slope
    if divisor == 1.0:
        return (MASK_ZERO if backward else MASK_MUL), 1.0
    return MASK_MUL, torch.ones((), dtype=dtype).div_(divisor).item()


def apply_mask(x: Tensor, mask: Tensor, divisor: float, slope: float,
               inplace: bool = False, out: Tensor | None = None) -> Tensor:
    r""":math:`X \odot M / d + s X \odot (1 - M)`, as ReLU, LeakyReLU and dropout compute it,
    for a whole boolean mask; with ``inplace`` written into ``x``, which nothing else may
    read; with ``out``, into ``out``."""
    mode, s = mask_mode(divisor, slope, x.dtype)
    return combine_mask(x, mask, mode, s, out=x if inplace else out)


def _rebuild(steps: list[tuple], state: ForwardState | None) -> Tensor:
    # In place wherever that computes the same bits: this runs in backward, where each
    # full-size temporary adds to the step's peak memory (a GPU's peak is in backward). The
    # dequantized input is a fresh tensor unless its parts are the tensor itself (16/32 bits).
    value: Tensor | None = None
    shared = False  # value is a resident input: the next step writes beside it, not over it
    for kind, tensors, meta in steps:
        if kind == "input":
            (value,), shared = tensors, True
            continue
        if kind == "batch_norm":
            *parts, mean, invstd, weight, bias = tensors
            _, cls, inner = meta
            if state is not None:
                _release(parts[0], state)  # read by a backward: its forward pass is over
            x = restore(cls.from_parts(tuple(parts), inner))
            shape = [1, -1] + [1] * (x.dim() - 2)
            mean = mean.to(x.dtype).view(shape)
            aliased = any(p is not None and p.untyped_storage().data_ptr()
                          == x.untyped_storage().data_ptr() for p in parts)
            value = (x - mean) if aliased else x.sub_(mean)
            value.mul_(invstd.to(x.dtype).view(shape))
            # A weight or bias of another dtype promotes, so that stays out of place.
            if weight is not None:
                w = weight.view(shape)
                value = value.mul_(w) if w.dtype == value.dtype else value * w
            if bias is not None:
                b = bias.view(shape)
                value = value.add_(b) if b.dtype == value.dtype else value + b
        elif kind == "packed":  # a tensor kept quantized by the op that made it (ELU)
            _, cls, inner = meta
            if state is not None:
                _release(tensors[0], state)
            value = restore(cls.from_parts(tuple(tensors), inner))
            if any(value.untyped_storage().data_ptr() == t.untyped_storage().data_ptr()
                   for t in tensors):  # (a pass-through copy is the tensor itself)
                value = value.clone()
        else:  # "mask"
            (data,) = tensors
            shape, divisor, slope = meta
            # In place, by blocks: the whole boolean mask (a quarter of a float32 tensor)
            # never exists beside the rebuilt tensor.
            value = masked_by_blocks(value, PackedMask(data, shape), divisor, slope,
                                     out=None if shared else value)
        shared = False
    assert value is not None
    return value


def records_graph(*tensors: Tensor | None) -> bool:
    """Whether autograd will record an op on ``tensors``: grad mode on and some input needs a
    gradient. Ops skip their context entirely otherwise (evaluation, ``torch.no_grad``)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


_TRANSIENT = "_gnnact_transient"
_PIECES = "_gnnact_pieces"


def transient(out: Tensor) -> Tensor:
    """Mark ``out``, computed outside autograd from a tensor needing no gradient, as a
    temporary: :func:`input_bits` then packs it like any activation. Returns ``out``."""
    if torch.is_grad_enabled() and not out.requires_grad:
        setattr(out, _TRANSIENT, True)
    return out


def resident(x: Tensor) -> bool:
    """Whether ``x`` stays in memory whatever the backward pass keeps, so that keeping it by
    reference costs nothing: it needs no gradient and was not marked :func:`transient`, and,
    inside a forward pass that knows its inputs (a converted model's), it is one of them (or
    a view of one). Elsewhere a tensor that needs no gradient is taken for an input."""
    if x.requires_grad or getattr(x, _TRANSIENT, False):
        return False
    keys = forward_state().resident
    if keys is None or x.layout != torch.strided:
        return True
    return storage_key(x.untyped_storage()) in keys


def input_bits(x: Tensor | None, config: Config) -> int:
    """Bits at which an op keeps its *input* ``x``: 32 (by reference) when ``x`` is
    :func:`resident` and ``config.resident_inputs`` is set, or when it has fewer than
    ``config.floor`` bytes (:attr:`Config.min_bytes <gnnact.Config>`); ``config.width``
    otherwise. Only for tensors passed to ``Function.apply``: inside ``forward`` every tensor
    the op computes itself needs no gradient either."""
    if x is not None and (config.keeps(x) or (config.resident_inputs and resident(x))):
        return 32
    return config.width


class _NoiseControl:
    """Per-tensor rounding noise for :func:`controlled_noise`."""

    def __init__(self, seed: int, perturb: tuple[str | None, str] | None,
                 record: list | None) -> None:
        self.seed, self.perturb, self.record = seed, perturb, record
        self.calls: dict[tuple[str | None, str], int] = {}

    def generator(self, tag: str | None, role: str, x: Tensor, bits: int) -> torch.Generator:
        key = (tag, role)
        index = self.calls.get(key, 0)
        self.calls[key] = index + 1
        if self.record is not None:
            self.record.append((tag, role, x.numel(), tuple(x.shape), bits))
        # The seed depends only on (pass seed, tensor name, role, call index) and on whether
        # this is the tensor being perturbed: every other tensor rounds exactly as in the
        # unperturbed pass.
        word = zlib.crc32(f"{tag}|{role}|{index}".encode())
        seed = (self.seed * 0x9E3779B1 + word) % (2**63 - 1)
        if key == self.perturb:
            seed = (seed + 0x632BE59BD9B4E019) % (2**63 - 1)
        return torch.Generator().manual_seed(seed)


# Per context (thread), like the forward state: another thread's quantizations must not draw
# from (or advance) an estimate's noise.
_NOISE: ContextVar[_NoiseControl | None] = ContextVar("gnnact_noise", default=None)


def noise_generator(tag: str | None, role: str, x: Tensor, bits: int,
                    default: torch.Generator | None = None) -> torch.Generator | None:
    """The generator of tensor ``(tag, role)``'s rounding seed: inside
    :func:`controlled_noise`, its own (and the quantization is recorded); else ``default``
    if given; else the running forward pass's (:attr:`ForwardState.rounding`); else ``None``
    (the default CPU generator)."""
    control = _NOISE.get()
    if control is not None:
        return control.generator(tag, role, x, bits)
    return default if default is not None else forward_state().rounding


@contextlib.contextmanager
def controlled_noise(seed: int, perturb: tuple[str | None, str] | None = None,
                     record: list | None = None) -> Iterator[None]:
    """Within the block, each quantization of a tensor named ``(config.tag, role)`` draws its
    rounding noise from a seed fixed by ``seed``, the name and the call index, so two passes
    with the same ``seed`` round identically; the tensor named ``perturb`` draws different
    noise. ``record`` receives ``(tag, role, numel, shape, bits)`` per quantization. For
    :class:`gnnact.Controller`'s sensitivity estimates."""
    token = _NOISE.set(_NoiseControl(seed, perturb, record))
    try:
        yield
    finally:
        _NOISE.reset(token)


def per_node_quantize(x: Tensor, bits: int, config: Config, role: str,
                      generator: torch.Generator | None) -> MixedPackedTensor:
    r"""``x [N, F]`` at per-row widths averaging ``bits``: row :math:`n` weighs
    :math:`g_n^2 R_n^2`, with :math:`R_n` its range and :math:`g_n` the norm of the gradient
    that reached row :math:`n` of this tensor (same module, role and shape) at the previous
    backward (1 before there was one); see :func:`gnnact.quant.mixed.allocate_rows`."""
    key = (config.tag, role, tuple(x.shape))
    detached = x.detach()
    weights = (detached.amax(1) - detached.amin(1)).double().pow(2)
    # (tag, role, shape) -> row norms of the gradient that reached that tensor at the last
    # backward, in the dict of whoever owns the training run (see ForwardState.row_gradients).
    store = forward_state().row_gradients
    previous = store.get(key)
    if previous is not None and previous.device == x.device:
        weights = weights * previous.double().pow(2)
    if x.requires_grad:
        def remember(grad: Tensor, key: tuple = key) -> None:
            store[key] = grad.detach().norm(dim=1)

        x.register_hook(remember)
    row_bits = allocate_rows(weights, bits, QUANT_BITS)
    return quantize_rows(x, row_bits, avg_bits=bits, generator=generator,
                         backend=config.backend)


def width_of(config: Config, role: str, bits: int) -> int:
    """The width of tensor ``role`` of ``config.tag``, which its op would keep at ``bits``:
    the running pass's own for it when it has one (:attr:`ForwardState.widths
    <gnnact.ops.state.ForwardState>`: a converted model's automatic widths, one per tensor,
    where a twin's config has one for all), else ``bits``. 16/32 bits (inputs kept by
    reference, exact runs) stay as they are."""
    widths = forward_state().widths
    if not widths or bits > 8:
        return bits
    return widths.get(f"{config.tag or '<model>'}:{role}", bits)


def shared_quantize(x: Tensor, bits: int, config: Config,
                    role: str = "activations") -> PackedTensor | MixedPackedTensor:
    """:func:`gnnact.quantize` with ``config``'s grouping (or :func:`per_node_quantize` with
    ``config.per_node``), sharing one copy per tensor. ``role`` names the tensor within its
    module for :func:`controlled_noise` and per-node precision."""
    bits = width_of(config, role, bits)
    fmt = (bits, config.group_size, config.per_row, config.per_node, config.backend)
    # Automatic widths: a tensor another op already keeps is read from that copy, whatever
    # its width (a probe re-runs every node that reads a copy, so the width allocated to the
    # first reader's name covers them all), not kept once more at this op's width.
    packed = cached(x, fmt, any_width=bool(forward_state().widths) and bits <= 8)
    if packed is not None:
        return packed
    generator = noise_generator(config.tag, role, x, bits) if bits <= 8 else None
    if config.per_node and bits <= 8 and x.dim() == 2 and x.size(0) > 1:
        def make(generator: torch.Generator | None, bits: int = bits) -> Any:
            return per_node_quantize(x, bits, config, role, generator)
    else:
        def make(generator: torch.Generator | None, bits: int = bits) -> Any:
            return quantize(x, bits, config.group_size, per_row=config.per_row,
                            generator=generator, backend=config.backend)
    packed = make(generator)
    if not packed.is_passthrough:
        remember(x, fmt, packed)
        _probe(config, role, packed, make)
    return packed


def _probe(config: Config, role: str, packed: Any, make: Any) -> None:
    """Give ``packed`` (tensor ``role`` of ``config.tag``) an alternate in a probe pass
    (:mod:`gnnact.ops.probe`); attention coefficients keep their width."""
    probe = active_probe()
    if probe is not None:
        probe.add(f"{config.tag or '<model>'}:{role}", packed, make,
                  fixed=role == "attention")


def independent_quantize(x: Tensor, config: Config,
                         role: str = "activations") -> PackedTensor | None:
    r"""``x`` at ``config.bits`` with rounding noise of its own, not shared with the copy
    :func:`shared_quantize` keeps: for a gradient that multiplies two factors that both read
    ``x`` (an attention vector's gradient: the edge scores' gradient, which reads the shared
    copy, times the features again). One rounding used twice would give the product a bias of
    :math:`\mathrm{Var}[\hat x]`; two independent ones make it unbiased. ``None`` at 16/32
    bits, which round deterministically (the shared copy then serves). ``role`` names it for
    :func:`controlled_noise` (the features' own role: :class:`gnnact.Controller` then gives
    it their width and counts it in their bytes). ``None`` too under the floor, where the
    shared copy is ``x`` itself (:func:`save_context`)."""
    bits = width_of(config, role, config.width)
    if bits > 8 or config.keeps(x):
        return None

    def make(generator: torch.Generator | None, bits: int = bits) -> PackedTensor:
        return quantize(x, bits, config.group_size, per_row=config.per_row,
                        generator=generator, backend=config.backend)

    packed = make(noise_generator(config.tag, role, x, bits))
    _probe(config, role, packed, make)
    return packed


def cached(x: Tensor, fmt: tuple | None = None, any_width: bool = False) -> Any:
    """The packed copy of this very tensor object (or the same view of the same tensor), at its
    current version, that
    :func:`remember` holds in format ``fmt`` (any format when ``None``; any width, ``fmt[0]``,
    with ``any_width``), or ``None``. The one cache of gnnact's ops and of
    :class:`gnnact.compress_saved_tensors`: a tensor both save is compressed once."""
    key, owner = cache_key(x)
    entry = forward_state().shared.get(key)
    if entry is None:
        return None
    ref, version, cached_fmt, refs, cls, meta = entry
    parts = tuple(r() for r in refs)
    if fmt is not None and any_width:
        fmt, cached_fmt = fmt[1:], cached_fmt[1:]
    if (ref() is not owner or version != x._version or (fmt is not None and cached_fmt != fmt)
            or any(t is None for t in parts)):
        return None
    packed = cls.from_parts(parts, meta)
    return packed if packed.shape == x.shape else Reshaped(packed, x.shape)


def remember(x: Tensor, fmt: tuple, packed: Any) -> None:
    """Share ``packed`` (anything with ``tensors()``, ``meta`` and ``from_parts``) as the copy
    of ``x`` in format ``fmt`` until a backward pass reads it (:func:`release`), ``x`` changes
    or dies, or the packed tensors die. Only weak references are held (outside
    :func:`hold_parts`)."""
    key, owner = cache_key(x)
    state = forward_state()
    x_ref = weakref.ref(owner, state.callback("forget_shared", key))
    refs = tuple(weakref.ref(t) for t in packed.tensors())
    state.shared[key] = (x_ref, x._version, fmt, refs, type(packed), packed.meta)
    state.keep(("cache", key), packed.tensors())


def release(packed: Any, state: ForwardState | None = None) -> None:
    """Stop sharing ``packed``: a backward pass has read it, so its forward pass is over.
    ``state``: the forward pass that shared it (default: this context's)."""
    _release(packed.tensors()[0], state)


def own_context(t: Tensor) -> bool:
    """Whether ``t`` is context a gnnact op keeps, already compressed or deliberately kept as
    is: :class:`gnnact.compress_saved_tensors` passes it through instead of compressing it
    again."""
    return _own_ref(t) is not None


def in_another_form(t: Tensor, floor: int) -> bool:
    """Whether ``t`` is context a gnnact op keeps in a form PyTorch's op would not keep:
    compressed, or kept exactly (as is, or a packed mask) but with ``floor`` bytes or more as
    PyTorch keeps it (a mask: a byte a value). A pass that keeps such a tensor is a full one
    (:meth:`Scope.small_pass <gnnact.nn.scope.Scope.small_pass>`)."""
    ref = _own_ref(t)
    return ref is not None and (not ref.exact or ref.raw_bytes >= floor)


def pytorch_bytes(t: Tensor) -> int:
    """The bytes PyTorch would keep for ``t``, a saved tensor: what a gnnact op's context
    stands for (:class:`~gnnact.ops.state.OwnRef`), else its storage's."""
    ref = _own_ref(t)
    return ref.raw_bytes if ref is not None else t.untyped_storage().nbytes()


def _own_ref(t: Tensor) -> OwnRef | None:
    # ForwardState.own: the tensors save_context handed to autograd (already compressed, or
    # kept as is on purpose). Autograd packs them after the op's forward returns, through
    # whatever saved-tensor hooks are active; a pipeline around gnnact's ops asks here.
    ref = forward_state().own.get(id(t))
    return ref if ref is not None and ref() is t else None


Entry = (tuple[Tensor | None, int] | tuple[Tensor | None, int, str] | PackedTensor | PackedMask
         | Tensor | None)


def save_context(ctx: Any, config: Config, *items: Entry) -> None:
    """Keep ``items`` for backward (see the module docstring); :func:`load_context` returns them
    in order.

    Each item is ``(tensor, bits)`` or ``(tensor, bits, role)`` (quantized through
    :func:`shared_quantize`, kept as is for a pass-through width or under ``config``'s floor
    on its device, or rebuilt from other ops' context if it is derived; ``tensor`` may be
    ``None``), a
    :class:`~gnnact.quant.PackedTensor` (returned dequantized), a
    :class:`~gnnact.quant.PackedMask` (returned unpacked, as ``torch.bool``), a tensor (kept as
    is) or ``None``. Call it at most once per ``ctx``: it calls ``ctx.save_for_backward``.
    """
    tensors: list[Tensor] = []
    # Per tensor, the bytes of the values it stands for as PyTorch would keep them (a
    # compressed or derived one's on one of its tensors: _stands_for), and whether exactly.
    raw: list[tuple[int, bool]] = []
    slots: list[tuple | None] = []
    for item in items:
        if isinstance(item, tuple):
            x, bits, *role = item
            if x is not None and bits <= 8 and config.keeps(x):
                bits = 32  # (under the floor: a copy would save next to nothing, and cost)
            steps = None if x is None or bits > 8 else _resolve(x)
            # A derived tensor: keep what rebuilds it, at the precision its base op chose. (Not
            # a fresh copy at this op's own width: that would add a tensor the base op's width
            # and gnnact.Controller's budget know nothing about. 16/32 bits keep it exact.)
            if steps is not None:
                layout, start = [], len(tensors)
                for kind, parts, meta in steps:
                    layout.append((kind, tuple(t is not None for t in parts), meta))
                    tensors.extend(t for t in parts if t is not None)
                raw.extend(_stands_for(x, tensors[start:]))
                slots.append(("derived", start, layout))
                continue
            if x is not None and bits == 32 and x.dtype in FLOAT_DTYPES:
                item = x  # (what shared_quantize would keep: the tensor itself, by reference)
            else:
                item = None if x is None else shared_quantize(x, bits, config, *role)
                if isinstance(item, PackedTensor) and item.is_passthrough and item.codes is x:
                    item = x
        if item is None:
            slots.append(None)
        elif isinstance(item, Tensor):
            slots.append(("tensor", len(tensors)))
            tensors.append(item)
            raw.append((item.numel() * item.element_size(), True))
        elif isinstance(item, PackedMask):
            slots.append(("mask", len(tensors), item.shape))
            tensors.append(item.data)
            raw.append((math.prod(item.shape), True))
        else:  # PackedTensor or MixedPackedTensor
            parts = item.tensors()
            slots.append(("packed", len(tensors), len(parts), type(item), item.meta))
            tensors.extend(parts)
            raw.extend(_stands_for(item, parts))
    state = forward_state()
    for t, (nbytes, exact) in zip(tensors, raw, strict=True):
        key = id(t)
        ref = state.own.get(key)
        if ref is None or ref() is not t:
            state.own[key] = OwnRef(t, state.callback("forget_own", key), nbytes, exact)
    ctx.save_for_backward(*tensors)
    ctx.gnnact_slots = slots
    # Backward releases shared copies in the pass that made them (it may run in another
    # thread); a weak reference, so that a finished pass's registries are not kept.
    ctx.gnnact_state = weakref.ref(state)


def _stands_for(x: Any, parts: list[Tensor]) -> list[tuple[int, bool]]:
    """:class:`~gnnact.ops.state.OwnRef`'s ``(raw_bytes, exact)`` for the ``parts`` that
    keep ``x`` (a tensor or a packed one) in another form: ``x``'s bytes on the last that is
    no input of the pass (a derived tensor's first part may be the input it derives from, which
    PyTorch keeps by reference as well)."""
    raw = [(0, False)] * len(parts)
    own = [i for i, t in enumerate(parts) if not resident(t)]
    if own:
        raw[own[-1]] = (math.prod(x.shape) * x.dtype.itemsize, False)
    return raw


def load_context(ctx: Any, only: Container[int] | None = None) -> list[Tensor | None]:
    """What :func:`save_context` kept, in order: dequantized, unpacked or as is. With ``only``,
    just those items (the others come back as ``None``): a backward restores a full-size item
    when it needs it, after what it no longer needs has gone, and each item once."""
    saved = ctx.saved_tensors
    state = ctx.gnnact_state()  # None once the pass that saved them is over: nothing to release
    out: list[Tensor | None] = []
    for index, slot in enumerate(ctx.gnnact_slots):
        if only is not None and index not in only:
            out.append(None)
            continue
        if slot is not None and slot[0] == "derived":
            _, position, layout = slot
            steps = []
            for kind, present, meta in layout:
                parts = []
                for here in present:
                    parts.append(saved[position] if here else None)
                    position += here
                steps.append((kind, tuple(parts), meta))
            out.append(_rebuild(steps, state))
            continue
        if slot is None:
            out.append(None)
        elif slot[0] == "tensor":
            out.append(saved[slot[1]])
        elif slot[0] == "mask":
            out.append(unpack_mask(PackedMask(saved[slot[1]], slot[2])))
        else:
            _, start, count, cls, meta = slot
            parts = tuple(saved[start:start + count])
            if state is not None:
                _release(parts[0], state)
            out.append(restore(cls.from_parts(parts, meta)))
    return out


def sign_masked(x: Tensor, slope: float, out: Tensor | None = None
                ) -> tuple[PackedMask, Tensor]:
    """``[x > 0]`` packed, and ReLU's (``slope`` 0) or LeakyReLU's output into ``out`` (a new
    tensor by default; ``x`` itself writes over it): one pass on a GPU
    (:func:`gnnact.quant.backends.mask_backend`), block by block on the torch path, so the whole
    boolean mask never exists beside the output."""
    mode, s = mask_mode(1.0, slope, x.dtype)
    if not x.is_contiguous():
        mask = x > 0
        return pack_mask(mask), combine_mask(x, mask, mode, s, out=out)
    out = torch.empty_like(x) if out is None else out
    data = mask_backend(x).sign_mask(x.view(-1), out.view(-1), mode, s)
    return PackedMask(data, x.shape), out


def masked_by_blocks(x: Tensor, packed: PackedMask, divisor: float, slope: float,
                     out: Tensor | None = None, *, backward: bool = False) -> Tensor:
    """:func:`apply_mask` of a packed mask to ``x`` (with ``backward``, its gradient's
    formula, ``x`` the incoming gradient) into ``out`` (a new tensor by default; ``out=x``
    writes over ``x``, which nothing else may read): one pass on a GPU
    (:func:`gnnact.quant.backends.mask_backend`), block by block on the torch path, without the
    whole boolean mask."""
    mode, s = mask_mode(divisor, slope, x.dtype, backward=backward)
    if not x.is_contiguous():
        return combine_mask(x, unpack_mask(packed), mode, s, out=out)
    out = torch.empty_like(x) if out is None else out
    mask_backend(x).apply_packed_mask(x.view(-1), packed.data, out.view(-1), mode, s)
    return out


def load_packed_mask(ctx: Any, index: int = 0) -> PackedMask:
    """The mask :func:`save_context` kept as item ``index`` (a :class:`PackedMask`), still
    packed: for a backward that unpacks it block by block."""
    slot = ctx.gnnact_slots[index]
    if slot is None or slot[0] != "mask":
        raise TypeError(f"context item {index} is not a packed mask: {slot!r}")
    return PackedMask(ctx.saved_tensors[slot[1]], slot[2])


def overwritable(x: Tensor) -> bool:
    """Whether an op may write its result over ``x`` itself, as autograd lets a function do
    (``mark_dirty``): contiguous, and not a view, whose base would need its history rewritten.
    (Whether anybody else still reads ``x`` is the caller's to know.)"""
    return x.is_contiguous() and x._base is None


def writable(ctx: Any, t: Tensor) -> bool:
    """Whether a backward may write ``t``, a tensor :func:`load_context` returned for ``ctx``:
    ``True`` when it was made for this call (dequantized, unpacked or rebuilt), ``False`` when
    it is one of the tensors kept as is (a 16/32-bit input, which its forward's caller may
    still hold)."""
    ptr = t.untyped_storage().data_ptr()
    return all(s.untyped_storage().data_ptr() != ptr for s in ctx.saved_tensors
               if s is not None)
