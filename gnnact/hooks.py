r"""``gnnact.compress_saved_tensors``: compress what autograd saves for backward, for any model.

One :class:`~torch.autograd.graph.saved_tensors_hooks` pipeline (only the innermost pair of
hooks is active, so compression, and later offloading, must be one pipeline): inside the
context every tensor an operation saves for its backward pass goes through a *pack* hook that
stores it compressed, and comes back through an *unpack* hook that restores it when backward
needs it. The forward pass itself stays exact. Which compressor a tensor gets is decided by a
:class:`~gnnact.compress.Policy` from the module that saved it, its name and its shape.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import weakref
from collections.abc import Callable, Iterable
from contextvars import ContextVar, Token
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.modules.module as module_hooks
from torch import Tensor, nn
from torch.nn.modules.module import (
    register_module_forward_hook,
    register_module_forward_pre_hook,
)
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from gnnact.compress import OUTSIDE, Policy
from gnnact.compress.gather import Gathered, gather_source
from gnnact.compress.lossless import (
    INDEX_DTYPES,
    CompactTensor,
    compact,
    two_valued,
    unbroadcast,
)
from gnnact.compress.policy import within
from gnnact.config import Config
from gnnact.memory import argument_tensors, storage_key, storage_keys, tensor_storages
from gnnact.ops.context import (
    Reshaped,
    cache_key,
    cached,
    hold_parts,
    in_another_form,
    noise_generator,
    own_context,
    pytorch_bytes,
    release,
    remember,
    resident,
)
from gnnact.ops.library import TICKET
from gnnact.ops.probe import active_probe, restore
from gnnact.ops.state import ForwardState, forward_pass, inlined_only, not_compiled, own_work
from gnnact.quant import PackedMask, PackedTensor, pack_mask, unpack_mask
from gnnact.quant.core import FLOAT_DTYPES
from gnnact.quant.mixed import MixedPackedTensor
from gnnact.quant.rng import PassSeeds
from gnnact.swap import Offloader, Swapped

__all__ = ["SavedEntry", "active_pipeline", "compress_saved_tensors"]

# The pipeline whose hooks are active in this context (thread): module tracking ignores the
# modules other threads run, and a converted model's scope leaves a user's pipeline in charge.
_ACTIVE: ContextVar[compress_saved_tensors | None] = ContextVar("gnnact_pipeline", default=None)


def active_pipeline() -> compress_saved_tensors | None:
    """The :class:`compress_saved_tensors` whose hooks are active in this context, if any."""
    return _ACTIVE.get()


@inlined_only
def _enter_any(module: nn.Module, args: Any) -> None:
    # Inside a compiled region: nothing (Dynamo cannot read a context variable); what a
    # compiled graph saves counts for the module whose eager call holds it.
    if not torch.compiler.is_compiling():
        pipeline = _ACTIVE.get()
        if pipeline is not None:
            pipeline._enter_module(module)


@inlined_only
def _leave_any(module: nn.Module, args: Any, output: Any) -> None:
    if not torch.compiler.is_compiling():
        pipeline = _ACTIVE.get()
        if pipeline is not None:
            pipeline._leave_module(module)


class _ModuleTracking:
    """The two process-wide module hooks through which the active pipeline (this context's:
    :func:`active_pipeline`) follows the running module: registered while some pipeline is
    active, each time under the ids of their first registration. (A compiled frame guards on
    the keys of PyTorch's global hook dicts: hooks registered anew for each pass, under new
    ids, made Dynamo recompile a converted GIN's forward at every pass until its
    recompilation limit, and run it eagerly from then on.) Process-wide because PyTorch's
    global hooks are; which pipeline they serve is per context."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._ids: tuple[int, int] | None = None

    def acquire(self) -> None:
        with self._lock:
            self._users += 1
            if self._users > 1:
                return
            if self._ids is None:
                self._ids = (register_module_forward_pre_hook(_enter_any).id,
                             register_module_forward_hook(_leave_any, always_call=True).id)
                return
            pre, post = self._ids
            module_hooks._global_forward_pre_hooks[pre] = _enter_any
            module_hooks._global_forward_hooks[post] = _leave_any
            module_hooks._global_forward_hooks_always_called[post] = True

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._ids is not None:
                pre, post = self._ids
                module_hooks._global_forward_pre_hooks.pop(pre, None)
                module_hooks._global_forward_hooks.pop(post, None)
                module_hooks._global_forward_hooks_always_called.pop(post, None)


_TRACKING = _ModuleTracking()


@dataclass(frozen=True)
class _SharedSwap:
    """An offloaded copy read back in the shape of another view of the same data, then
    expanded to ``broadcast`` if given (a broadcast tensor's values are kept once)."""

    item: Swapped
    shape: torch.Size
    broadcast: torch.Size | None = None


@dataclass(frozen=True)
class _Strided:
    """A saved tensor whose values are laid out otherwise than row-major (a transposed view):
    read back in its own strides. A compiled graph's backward checks the strides of what it
    saved; eager ops take any. (``item``, as :class:`_SharedSwap`'s: where
    :func:`gnnact.saved_bytes` finds the tensors.)"""

    item: Any
    stride: tuple[int, ...]


def _dense(t: Tensor) -> bool:
    """Whether ``t``'s strides are a permutation of row-major ones: no gaps, no overlap."""
    expected = 1
    for size, stride in sorted(((n, s) for n, s in zip(t.shape, t.stride(), strict=True)
                                if n != 1), key=lambda item: item[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _laid_out(saved: Any, t: Tensor) -> Any:
    """What the pack hook returns for ``t``: ``saved``, read back in ``t``'s strides when they
    are a permutation of row-major ones (and ``saved`` is not ``t`` itself)."""
    if (saved is t or t.layout != torch.strided or t.is_contiguous()
            or not _dense(t)):
        return saved
    return _Strided(saved, t.stride())


# The format key of compact index copies in gnnact's cache of shared copies.
_INDEX_FMT = ("index",)


def _broadcast(saved: Any, core: Tensor, t: Tensor) -> Any:
    """What the pack hook returns for ``t`` when ``saved`` keeps the values of ``core``
    (:func:`~gnnact.compress.lossless.unbroadcast` of ``t``): ``saved`` itself, or ``saved``
    read back broadcast to ``t``'s shape."""
    if core.shape == t.shape:
        return saved
    if isinstance(saved, (Swapped, _SharedSwap)):  # offloaded
        item = saved.item if isinstance(saved, _SharedSwap) else saved
        return _SharedSwap(item, core.shape, t.shape)
    return Reshaped(saved, t.shape, broadcast=True)


def _as_tensor(parts: tuple[Tensor, ...]) -> Tensor:
    return parts[0]


def _from_parts(cls: type, meta: tuple, parts: tuple[Tensor, ...]) -> Any:
    return cls.from_parts(parts, meta)


def _compress(compressor: Any, core: Tensor, name: str, generator: torch.Generator | None,
              bits: int | None = None) -> Any:
    """``core`` compressed by ``compressor`` (at ``bits``: a probe pass's second copy) with
    noise from ``generator``."""
    if bits is not None and bits != compressor.bits:
        compressor = compressor.with_bits(bits)
    with torch.no_grad():
        return compressor.compress(core.detach(), name, generator)


def _relu_mask(shape: torch.Size, dtype: torch.dtype, parts: tuple[Tensor, ...]) -> ReluMask:
    return ReluMask(PackedMask(parts[0], shape), dtype)


@dataclass(frozen=True)
class ReluMask:
    """A ReLU output kept as the 1-bit mask :math:`[y > 0]`, all its backward reads; restored as
    that mask in ``dtype`` (0 or 1), which gives ReLU's backward the same result."""

    mask: PackedMask
    dtype: torch.dtype

    def tensors(self) -> tuple[Tensor, ...]:
        return self.mask.tensors()

    @property
    def nbytes(self) -> int:
        return self.mask.nbytes

    def dequantize(self) -> Tensor:
        return unpack_mask(self.mask).to(self.dtype)


@dataclass
class SavedEntry:
    """What the pipeline did with the tensor :attr:`name` the last time it was saved."""

    name: str
    kind: str  # the compressor's kind, or "exact"
    shape: tuple[int, ...]
    bits: int | None
    nbytes: int
    adaptive: bool  # whether gnnact.Controller may change its width
    raw_bytes: int = 0  # the tensor's own size


class compress_saved_tensors(torch.autograd.graph.saved_tensors_hooks):
    r"""Context manager that stores every floating-point tensor saved for backward
    compressed, as its :class:`~gnnact.compress.Policy` decides.

    The default policy (:meth:`~gnnact.compress.Policy.default_for`) quantizes with
    ``config``'s bits and grouping (:class:`~gnnact.compress.Quantize`): a saved tensor
    :math:`\mathbf{h}` of :math:`n` values is cut into groups of :math:`G`, each keeping a float32
    minimum :math:`Z` and scale :math:`s = (\max - Z) / (2^b - 1)`, every value a :math:`b`-bit
    code by unbiased stochastic rounding,

    .. math::
        \hat{h}_j = \left\lfloor \frac{h_j - Z}{s} + u_j \right\rfloor s + Z, \quad
        u_j \sim \mathcal{U}[0, 1), \qquad \mathbb{E}[\hat{h}_j] = h_j,
        \quad \operatorname{Var}[\hat h_j] \le s^2 / 4,

    so backward sees an unbiased estimate, and the gradient stays unbiased for operations whose
    backward is linear in what they saved. It keeps
    :math:`n_g (\lceil G b / 8 \rceil + 8) \approx n (b/8 + 8/G)` bytes instead of :math:`4n`.
    Rank-4 tensors saved inside attention get :class:`~gnnact.compress.Mesa` (8 bits, one group
    per head, running ranges); the loss and the classifier head's input stay exact.

    These pass through as they are (the hook returns the tensor itself):

    * sparse tensors, tensor subclasses, 0-d tensors, integer and boolean tensors
      other than those below, and floating-point tensors of fewer than
      :obj:`min_numel` elements or the floor's bytes (``config.floor_for`` their device,
      :attr:`Config.min_bytes <gnnact.Config>`; counted in :attr:`num_small` and
      :attr:`small_bytes`), an integer or boolean one only if its storage holds fewer than
      :obj:`min_numel` float32 values' bytes, a
      broadcast tensor counting the values it holds once (per-channel
      statistics such as BatchNorm's mean and :math:`1/\sigma`: their error reaches every
      gradient of the layer, and compressing them saves little);
    * parameters (leaves that require grad) and views of them (the ``weight.t()`` that
      :func:`~torch.nn.functional.linear` saves), and tensors whose storage belongs to
      :obj:`skip` or to :obj:`model` (buffers such as BatchNorm's running statistics);
    * with ``config.resident_inputs``, the inputs (tensors that need no gradient in the
      arguments of :obj:`model`'s call): they stay in memory anyway, so a compressed copy
      would add bytes, not save them. Until :obj:`model` is called, or without :obj:`model`,
      every tensor that needs no gradient is taken for an input; after, one the model makes
      (a dropout mask, an index) is a temporary and is stored compressed;
    * the context of gnnact's own ops (:mod:`gnnact.nn` layers in the same model): it is
      compressed already, never twice;
    * tensors the policy keeps exact.

    A :class:`~torch.nn.ReLU` module's own output, saved by that module, becomes a 1-bit mask
    (:obj:`relu_masks`). With ``config.compact_indices``, integer and boolean tensors (a
    scatter's edge targets, a gather's sources, a max pool's argmax, masks) are kept exactly in
    fewer bytes (:func:`~gnnact.compress.lossless.compact`: a broadcast tensor once, integers
    in the narrowest dtype that holds them, booleans at one bit), counted as ``"index"`` and
    ``"mask"``; so are floating-point tensors the model makes that need no gradient and hold
    two values only (:func:`~gnnact.compress.lossless.two_valued`: a dropout mask on the CPU,
    ``"mask"``), whatever the policy says (the values stay exact). Tensors saved outside the
    model (the loss's labels) are left alone. Rows gathered from a tensor (message passing's
    lift to edges, marked by a converted model's
    :class:`~gnnact.nn.functional.FunctionalOps`) are kept as that tensor, stored as any
    other, and the index: :mod:`gnnact.compress.gather`.

    With ``config.offload`` every CUDA tensor the pipeline compresses, and the context of
    gnnact's ops (already compressed), is moved to pinned host memory during forward and
    prefetched back ``config.prefetch_depth`` items ahead during backward (:mod:`gnnact.swap`,
    which states the stream-ordering invariants); :attr:`offloaded_bytes` counts what left the
    device. Pass the input features in :obj:`skip`: kept by reference, they are not offloaded.
    On the CPU nothing moves.

    A tensor saved by several operations (a ReLU output that the next layer saves too, the
    input of the query, key and value projections) is compressed **once**: the copy is shared,
    through gnnact's one cache of compressed copies (:func:`gnnact.ops.context.cached`, weak
    references only), with every later save of the same tensor object at the same version, by
    these hooks or by gnnact's ops, until a backward pass reads it.

    Each tensor gets a name, ``"<module path>:<index>"``: the innermost module of
    :obj:`model` running when it was saved (:data:`~gnnact.compress.OUTSIDE` outside the model;
    without :obj:`model`, the class names of the running modules) and the count of that
    module's saves so far in the context. Policies match these names, :attr:`tensors` reports
    by them, and :class:`gnnact.Controller` (``hooks=``) adapts the width of each
    :class:`~gnnact.compress.Quantize`-compressed tensor by name through :attr:`bits`.

    The tallies count what the saved context costs, over distinct objects, since the hooks
    were created or :meth:`reset_stats` was last called: :attr:`packed_bytes` (compressed
    copies created), :attr:`passthrough_bytes` (distinct storages kept as they are, gnnact ops'
    context included, without those of :obj:`skip`, :obj:`model` and parameters: the set
    :func:`gnnact.memory.saved_bytes` counts with ``exclude=skip``), :attr:`num_packed`,
    :attr:`num_shared` (saves served by an existing copy), :attr:`num_compact` (saves of
    those kept exactly in fewer bytes, new or shared), :attr:`num_small` and
    :attr:`small_bytes` (distinct storages of floating-point tensors kept as they are for
    their size, and their bytes, part of :attr:`passthrough_bytes`), :attr:`over_floor`
    (whether anything saved other than parameters and skipped storages had the floor's
    bytes or more, or was context of gnnact's ops in another form than PyTorch's, or was no
    plain strided tensor), :attr:`pytorch_bytes` (with :attr:`count_pytorch` set: the bytes
    PyTorch itself would have kept of the same, each storage once), :attr:`bytes_by_kind`,
    :attr:`bytes_by_module` (the same bytes by the module path that saved them first: what
    :func:`gnnact.summary` reports) and :attr:`offloaded_bytes`.

    The block is one forward pass (:func:`gnnact.ops.state.forward_pass`): what gnnact's ops
    share inside it is dropped when it ends, and the module tracking ignores modules that
    other threads run meanwhile. A model converted by :func:`gnnact.convert` inside the block
    leaves this pipeline in charge of what its pass saves.

    With :func:`torch.utils.checkpoint.checkpoint` inside the context (either mode), each
    checkpointed region's inputs are saved through these hooks and compressed (GACT's CB1);
    what the region saves inside is kept by checkpointing (run under no grad, or through its
    own innermost hooks) and recomputed in backward from the restored inputs, outside the
    context.

    Args:
        config (Config, optional): bits, grouping, backend and ``resident_inputs`` of the
            default policy. ``Config(bits=32)`` keeps everything exact: bit-identical to no
            hooks. (default: ``Config()``, 2 bits)
        policy (Policy, optional): which tensors get which compressor.
            (default: ``Policy.default_for(config, model)``, see
            :meth:`~gnnact.compress.Policy.default_for`)
        model (torch.nn.Module, optional): the model, for module paths in tensor names and
            policies; its parameters and buffers pass through. (default: :obj:`None`)
        skip (Iterable[torch.Tensor or torch.nn.Module], optional): tensors, and modules (all
            their parameters and buffers), whose storages pass through uncompressed and
            untallied (*e.g.* the input features). They must stay alive while the hooks are in
            use: they are recognized by storage address. (default: :obj:`()`)
        min_numel (int, optional): tensors with fewer elements pass through.
            (default: :obj:`4096`)
        relu_masks (bool, optional): keep what a :class:`~torch.nn.ReLU` module saves of its
            own output as a 1-bit mask :math:`[y > 0]`, all its backward reads (ActNN),
            instead of compressing the values: rounding would zero small positive values and
            drop their gradient. A later op that saves the same output for its values (the
            next layer) compresses them as usual. (``F.relu`` calls inside other modules are
            not told apart from their consumers: their outputs are compressed as values.) Not
            with ``config.bits`` of 32. (default: :obj:`True`)
        offload_paths (Iterable[str], optional): module paths whose tensors (and their
            submodules') are offloaded as with ``config.offload``, which offloads all.
            (default: :obj:`()`)
        generator (torch.Generator, optional): source of the rounding-noise seeds. By
            default each block (a forward pass) draws them from a stream of its own
            (:class:`~gnnact.quant.rng.PassSeeds`) and leaves the global generators' streams
            alone: dropout masks and every other random draw are the uncompressed run's.
            (default: :obj:`None`)

    Example:
        >>> import torch.nn.functional as F
        >>> model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
        ...                             torch.nn.Linear(256, 256), torch.nn.ReLU(),
        ...                             torch.nn.Linear(256, 10))
        >>> x, y = torch.randn(512, 64), torch.randint(0, 10, (512,))
        >>> hooks = gnnact.compress_saved_tensors(gnnact.Config(bits=4), model=model,
        ...                                       skip=[x])
        >>> with hooks:
        ...     loss = F.cross_entropy(model(x), y)
        >>> loss.backward()
        >>> {name: entry.kind for name, entry in hooks.tensors.items() if name[0] != "<"}
        {'1:0': 'relu_mask', '2:0': 'quantize', '3:0': 'relu_mask', '4:0': 'exact'}
        >>> hooks.bytes_by_kind["quantize"]  # layer 2's input: 131,072 values at 4 bits
        67584
        >>> hooks.saved_bytes  # the saved context, in bytes (the head's input stays exact)
        649220
    """

    def __init__(
        self,
        config: Config | None = None,
        *,
        policy: Policy | None = None,
        model: nn.Module | None = None,
        skip: Iterable[Tensor | nn.Module] = (),
        min_numel: int = 4096,
        relu_masks: bool = True,
        offload_paths: Iterable[str] = (),
        generator: torch.Generator | None = None,
    ) -> None:
        if config is None:
            config = Config()
        if not isinstance(config, Config):
            raise TypeError(f"config must be a gnnact.Config, got {config!r}")
        if policy is not None and not isinstance(policy, Policy):
            raise TypeError(f"policy must be a gnnact.compress.Policy, got {policy!r}")
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if isinstance(min_numel, bool) or not isinstance(min_numel, int) or min_numel < 0:
            raise ValueError(f"min_numel must be a non-negative int, got {min_numel!r}")
        self.config = config
        self.model = model
        self.policy = policy if policy is not None else Policy.default_for(config, model)
        self.min_numel = min_numel
        self.offload_paths = tuple(offload_paths)
        # Exact mode stays exact to the bit: no masks either.
        self.relu_masks = relu_masks and config.width != 32
        self.compact_indices = config.compact_indices and config.width != 32
        self.generator = generator
        self._seeds = PassSeeds()
        self._offloaders: dict[torch.device, Offloader] = {}
        # cache key -> (weakref to the owner, its version, weakref to the Swapped item)
        self._swapped: dict[tuple, tuple] = {}
        # One walk of the model for its paths and its tensors (a pass makes a pipeline: each
        # walk cost ~0.1 ms a GIN step, storage_keys(model) walking twice more).
        self._paths: dict[int, str] = {}
        own: list[Tensor] = []
        for path, module in model.named_modules() if model is not None else ():
            self._paths[id(module)] = path
            own.extend(t for t in (*module._parameters.values(), *module._buffers.values())
                       if t is not None)
        self._skip = storage_keys([*skip, *own])
        self._stack: list[nn.Module] = []
        self._inputs: set[tuple] = set()
        self._handles: list[Any] = []
        self._region = contextlib.ExitStack()  # the forward pass (and hold_parts())
        self._state: weakref.ref[ForwardState] | None = None
        self._token: Token | None = None
        self.bits: dict[str, int] = {}  # tensor name -> width, set by gnnact.Controller
        # Whether to total what PyTorch would keep (pytorch_bytes): set by a converted
        # model's pass that may run as PyTorch's when compression saves little
        # (Config.min_savings).
        self.count_pytorch = False
        self.reset_stats()
        # Autograd calls the hooks from inside the op that saves, which may run in the eager
        # part of a torch.compile-d model: Dynamo would take each hook's frame for one to
        # compile (and inductor failed on what it traced of _pack: a converted GIN compiled).
        # They are host bookkeeping: run as they are (Dynamo's mark on their code, not
        # torch.compiler.disable's wrapper: 0.8 us on each of a step's saves and restores).
        super().__init__(self._pack_outside_mode, self._unpack)

    def reset_stats(self) -> None:
        """Zero the tallies and forget what was seen, *e.g.* before measuring one forward."""
        self.packed_bytes = 0
        self.passthrough_bytes = 0
        self.num_packed = 0
        self.num_shared = 0
        self.num_compact = 0
        self.num_small = 0
        self.small_bytes = 0
        self.over_floor = False
        self.pytorch_bytes: float = 0
        self._counted: set[tuple] = set()
        self.offloaded_bytes = 0
        self.bytes_by_kind: dict[str, int] = {}
        self.bytes_by_module: dict[str, int] = {}
        self.tensors: dict[str, SavedEntry] = {}
        self._passed: set[Any] = set()
        self._counts: dict[str, int] = {}

    @property
    def saved_bytes(self) -> int:
        """:attr:`packed_bytes` + :attr:`passthrough_bytes`."""
        return self.packed_bytes + self.passthrough_bytes

    # ------------------------------------------------------------------ module tracking

    def __enter__(self) -> compress_saved_tensors:
        if self._handles:
            raise RuntimeError("this compress_saved_tensors is already active: enter it once "
                               "(with Controller(hooks=...), the closure must not enter it)")
        self._counts = {}  # indices restart with every forward pass
        self._inputs = set()  # storage keys of the model's arguments in this pass
        for offloader in self._offloaders.values():
            offloader.new_pass()
        # Forget the host copies autograd has dropped since.
        self._swapped = {k: v for k, v in self._swapped.items() if v[2]() is not None}
        self._stack = []
        _TRACKING.acquire()
        self._handles = [_TRACKING]
        if self.model is not None:  # (module hooks run after the global ones)
            self._handles.append(self.model.register_forward_pre_hook(self._model_called,
                                                                      with_kwargs=True))
        # The block is one forward pass (joining an enclosing one): what gnnact's ops share in
        # it is gone when it ends.
        state = self._region.enter_context(forward_pass(seeds=self._seeds))
        self._state = weakref.ref(state)
        # The model's call sets the pass's inputs (_model_called); the block may join an
        # enclosing pass, whose own is restored at the end.
        self._region.callback(setattr, state, "resident", state.resident)
        if self.config.offload or self.offload_paths:
            # gnnact ops share packed copies through weak references; offloading leaves nothing
            # on the device to back them (see gnnact.ops.context.hold_parts).
            self._region.enter_context(hold_parts())
        self._token = _ACTIVE.set(self)
        super().__enter__()
        return self

    def __exit__(self, *args: object) -> None:
        super().__exit__(*args)
        if self._token is not None:
            _ACTIVE.reset(self._token)
            self._token = None
        self._region.close()
        for handle in self._handles:
            if handle is _TRACKING:
                handle.release()
            else:
                handle.remove()
        self._handles = []
        self._stack = []

    # Called by the process-wide module hooks (_ModuleTracking) while this pipeline is the
    # active one.
    def _enter_module(self, module: nn.Module) -> None:
        self._stack.append(module)

    def _model_called(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if torch.compiler.is_compiling():
            return
        if _ACTIVE.get() is self and self._stack == [module]:
            # The model's own call (after _enter_module): its arguments are the pass's inputs,
            # resident whatever backward keeps; any other tensor that needs no gradient (a
            # dropout mask, a max pool's argmax) is a temporary of the pass. (A pass that knew
            # its inputs already, a converted model's, keeps its own.)
            self._inputs |= storage_keys(argument_tensors((args, kwargs)))
            state = self._state() if self._state is not None else None
            if state is not None and state.resident is None:
                state.resident = self._inputs  # (the live set: later calls add to it)

    def _leave_module(self, module: nn.Module) -> None:
        if self._stack and self._stack[-1] is module:
            self._stack.pop()

    def _where(self) -> tuple[str, nn.Module | None]:
        """The path and object of the innermost running module of the model."""
        if self.model is None:
            if not self._stack:
                return OUTSIDE, None
            return ".".join(type(m).__name__ for m in self._stack), self._stack[-1]
        for module in reversed(self._stack):
            path = self._paths.get(id(module))
            if path is not None:
                return path, module
        return OUTSIDE, None

    # ------------------------------------------------------------------ hooks

    @not_compiled
    def _pack_outside_mode(self, t: Tensor) -> Any:
        # Autograd calls the hook inside the op that saves: the pack is gnnact's own work, not
        # the model's calls a converted model's mode routes (gnnact.ops.state.own_work).
        with own_work():
            if self.count_pytorch:
                self._count_pytorch(t)
            return _laid_out(self._pack(t), t)

    def _count_pytorch(self, t: Tensor) -> None:
        """Add the bytes PyTorch would keep for ``t`` to :attr:`pytorch_bytes` (each storage
        once; parameters, skipped storages and tickets left out; a tensor that is not plain
        and strided makes it infinite: such a pass never runs as PyTorch's)."""
        if type(t) is not Tensor or t.layout != torch.strided:
            if type(t) is not nn.Parameter:
                self.pytorch_bytes = math.inf
            return
        key = _storage_key(t)
        if (key not in self._skip and key not in self._counted and not _is_parameter(t)
                and not getattr(t, TICKET, False)):
            self._counted.add(key)
            self.pytorch_bytes += pytorch_bytes(t)

    def _pack(self, t: Tensor) -> Any:
        if getattr(t, TICKET, False):
            # A compiled graph's handle on a layer's record (gnnact.ops.library): kept and
            # counted, neither compressed context nor a reason for full passes.
            self._pass(t, self._where()[0])
            return t
        if self.compact_indices and t.dtype in INDEX_DTYPES and self._storable(t):
            saved = self._compact(t, unbroadcast(t), compact)
            if saved is None:
                self._pass(t, self._where()[0])
                return t
            return saved
        if type(t) is Tensor and t.layout == torch.strided:
            storage = t.untyped_storage()
            nbytes = storage.nbytes()
            floor = self.config.floor_for(t.device)
            if nbytes < floor and t.dtype in FLOAT_DTYPES:
                # Below the floor with all its storage: kept as is, whatever else holds (the
                # common case of a small graph, so checked first and cheaply).
                self._pass_small(t, storage, nbytes)
                return t
            if not self.over_floor and (nbytes >= floor or (t.dtype not in FLOAT_DTYPES
                                                            and in_another_form(t, floor))):
                self.over_floor = self._owned_by_pass(t, storage)
        elif type(t) is not nn.Parameter:  # (a sparse tensor, a subclass: not told apart)
            self.over_floor = True
        path, module = self._where()
        source = gather_source(t, module)
        if source is not None:  # rows gathered to edges: kept as their source and index
            src, dim, index = source
            return Gathered(self._pack(src), self._pack(index), dim)
        core = self._compressible(t)  # (a broadcast tensor's values, once each)
        if core is _SMALL:
            self._pass(t, path, small=True)
            return t
        if core is None:
            self._pass(t, path)
            if (own_context(t) and self._offloads(path)
                    and _storage_key(t) not in self._skip):
                # gnnact ops' context, compressed already: offloaded like the pipeline's own
                return self._swap(t, (t,), _as_tensor)
            return t
        if self.compact_indices and not t.requires_grad:
            # Made by the model and needing no gradient: a mask, most likely (PyTorch's CPU
            # dropout saves its mask as floats), kept exactly at one bit if it has two values.
            saved = self._compact(t, core, two_valued)
            if saved is not None:
                return saved
        index = self._counts.get(path, 0)
        self._counts[path] = index + 1
        name = f"{path}:{index}"
        if self._relu_saves_output(t):
            mask = ReluMask(pack_mask(t.detach() > 0), t.dtype)
            self.num_packed += 1
            self.packed_bytes += mask.nbytes
            self._tally(path, mask.nbytes)
            self._record(name, "relu_mask", t, 1, mask.nbytes, False)
            if self._offloads(path) and t.is_cuda:
                return self._swap(t, mask.tensors(), functools.partial(
                    _relu_mask, mask.shape, t.dtype), share=False)
            return mask
        compressor = self.policy.choose(name, module, t)
        # The policy's default compressor gets the widths a converted model's scope allocates;
        # a rule's choice (the attention coefficients', say) keeps its own.
        allocated = compressor is not None and compressor is self.policy.default
        if compressor is not None and compressor.adaptive and name in self.bits:
            compressor = compressor.with_bits(self.bits[name])
        if compressor is None or compressor.bits == 32:
            # (Even if an earlier op keeps a compressed copy: exact is what the policy asks.)
            self._record(name, "exact", t, None, 0, False)
            self._pass(t, path)
            return t
        shared = self._shared_copy(core)
        if shared is not None:
            self.num_shared += 1
            return _broadcast(shared, core, t)
        generator = noise_generator(path, str(index), core, compressor.bits or 8,
                                    self.generator)
        packed = _compress(compressor, core, name, generator)
        probe = active_probe()
        if probe is not None and isinstance(packed, (PackedTensor, MixedPackedTensor)):
            probe.add(name, packed, functools.partial(_compress, compressor, core, name),
                      fixed=not allocated, finer=compressor.adaptive)
        if isinstance(packed, PackedTensor) and _storage_key(packed.codes) == _storage_key(core):
            self._pass(t, path)  # 16 bits of a 16-bit tensor: its own storage, no copy
            return t
        self.num_packed += 1
        self.packed_bytes += packed.nbytes
        self._tally(path, packed.nbytes)
        self._record(name, compressor.kind, t, compressor.bits, packed.nbytes,
                     compressor.adaptive)
        if self._offloads(path) and t.is_cuda:
            return _broadcast(self._swap(core, packed.tensors(), functools.partial(
                _from_parts, type(packed), packed.meta)), core, t)
        remember(core, compressor.fmt, packed)
        return _broadcast(packed, core, t)

    def _compact(self, t: Tensor, core: Tensor,
                 make: Callable[[Tensor], CompactTensor | None]) -> Any:
        """``t`` kept exactly in fewer bytes by ``make`` (:func:`compact` for an index or a
        boolean mask, :func:`two_valued` for a float mask) applied to ``core``, its values once
        each (:func:`unbroadcast`), one copy of its values shared by
        every save of them (the feature blocks of a chunked conv save one edge index broadcast
        to each block's width); ``None`` when ``make`` finds nothing to gain, or for a small
        tensor or one saved outside the model (the loss's labels: inputs)."""
        path = self._where()[0]
        # Small means small in bytes too: a chunked conv's pieces save a few thousand int64
        # indices each (as many bytes as min_numel float32 values), and a slice of a large
        # storage, saved as it is, would keep all of it alive.
        nbytes = t.untyped_storage().nbytes()
        if path == OUTSIDE or (core.numel() < self.min_numel and nbytes < 4 * self.min_numel):
            return None
        # On a GPU an exact copy costs what a quantized one does, the host's launches and, for
        # an index, a read of its range to the host (a sync): not for bytes the floor calls
        # negligible. (On the CPU, whose floor is the quantizer's cost, it is cheap: made at
        # any size.)
        if t.is_cuda and nbytes < self.config.floor_for(t.device):
            return None
        saved = self._shared_copy(core, _INDEX_FMT)
        if saved is not None:
            self.num_shared += 1
        else:
            packed = make(core)
            if packed is None:
                return None
            kind = "mask" if packed.is_mask else "index"
            key = f"{path}:{kind}"
            index = self._counts.get(key, 0)
            self._counts[key] = index + 1
            self.num_packed += 1
            self.packed_bytes += packed.nbytes
            self._tally(path, packed.nbytes)
            self._record(f"{key}{index}", kind, t, packed.bits, packed.nbytes, False)
            if self._offloads(path) and core.is_cuda:
                saved = self._swap(core, packed.tensors(), functools.partial(
                    _from_parts, CompactTensor, packed.meta))
            else:
                remember(core, _INDEX_FMT, packed)
                saved = packed
        self.num_compact += 1
        return _broadcast(saved, core, t)

    def _shared_copy(self, core: Tensor, fmt: tuple | None = None) -> Any:
        """The copy an earlier save already made of ``core``'s values: offloaded, or in
        gnnact's cache of shared copies (in format ``fmt``; any when ``None``)."""
        shared = self._shared_swap(core) if self._swapped else None
        return shared if shared is not None else cached(core, fmt)

    @not_compiled
    def _unpack(self, saved: Any) -> Tensor:
        if isinstance(saved, _Strided):
            values = self._unpack(saved.item)
            out = values.new_empty_strided(values.shape, saved.stride)
            return out.copy_(values)
        if isinstance(saved, Gathered):
            return self._unpack(saved.source).index_select(saved.dim, self._unpack(saved.index))
        shape = broadcast = None
        if isinstance(saved, _SharedSwap):
            saved, shape, broadcast = saved.item, saved.shape, saved.broadcast
        if isinstance(saved, Swapped):
            saved = self._offloaders[saved.device].fetch(saved)
        elif not isinstance(saved, Tensor):
            state = self._state() if self._state is not None else None
            if state is not None:  # read by a backward: its forward pass is over
                release(saved, state)
        if not isinstance(saved, Tensor):
            with torch.no_grad():
                saved = restore(saved)
        if shape is not None:
            saved = saved.reshape(shape)
        return saved if broadcast is None else saved.expand(broadcast)

    # ------------------------------------------------------------------ offload

    def _offloads(self, path: str) -> bool:
        """Whether the tensors of module ``path`` go to host memory."""
        return self.config.offload or any(within(path, p) for p in self.offload_paths)

    def _swap(self, t: Tensor, tensors: tuple[Tensor, ...],
              rebuild: Callable[[tuple[Tensor, ...]], Any], share: bool = True) -> Any:
        """Offload ``tensors``, what keeps ``t`` for backward, to pinned host memory (CUDA
        only; on the CPU ``rebuild(tensors)`` is kept as is). With ``share``, one host copy
        serves every save of ``t`` (not for a ReLU mask: later saves need the values)."""
        if not self._can_offload(t, tensors):
            return rebuild(tensors)
        shared = self._shared_swap(t) if share else None
        if shared is not None:
            return shared
        offloader = self._offloaders.get(t.device)
        if offloader is None:
            offloader = self._offloaders[t.device] = self._new_offloader(t.device)
            offloader.new_pass()
        item = offloader.offload(tensors, rebuild, t.shape)
        self.offloaded_bytes += item.nbytes
        if share:
            key, owner = cache_key(t)
            self._swapped[key] = (weakref.ref(owner), t._version, weakref.ref(item))
        return item

    def _can_offload(self, t: Tensor, tensors: tuple[Tensor, ...]) -> bool:
        """Whether ``tensors`` (what keeps ``t``) can go to host memory: CUDA and contiguous."""
        return t.is_cuda and all(x.is_contiguous() for x in tensors)

    def _new_offloader(self, device: torch.device) -> Offloader:
        return Offloader(device, self.config.prefetch_depth)

    def _shared_swap(self, t: Tensor) -> Any:
        """The host copy already made for this tensor (or another view of its data)."""
        key, owner = cache_key(t)
        entry = self._swapped.get(key)
        if entry is None or entry[0]() is not owner or entry[1] != t._version:
            return None
        item = entry[2]()
        if item is None:
            return None
        return item if item.shape == t.shape else _SharedSwap(item, t.shape)

    def _relu_saves_output(self, t: Tensor) -> bool:
        """Whether ``t`` is being saved by the :class:`~torch.nn.ReLU` module that made it:
        ReLU's backward reads only ``t > 0``, so a 1-bit mask restores it exactly, whereas
        rounding would turn small positive values into zeros and drop their gradient. (Only
        inside the module itself: the same output saved later by a consumer needs its values,
        and a consumer's save may be the first one these hooks see, e.g. after a checkpointed
        region whose ReLU saved through checkpointing's hooks.)"""
        return (self.relu_masks and bool(self._stack) and isinstance(self._stack[-1], nn.ReLU)
                and t.grad_fn is not None and t.grad_fn.name() == "ReluBackward0")

    def _compressible(self, t: Tensor) -> Tensor | object | None:
        """The values of ``t`` to compress, once each (:func:`unbroadcast`); ``None`` when
        ``t`` may not be compressed at all (see the class docstring), :data:`_SMALL` when it
        is too small to (a broadcast tensor counts the values it holds)."""
        if t.dtype not in FLOAT_DTYPES or not self._storable(t):
            return None
        core = unbroadcast(t)
        if core.numel() < self.min_numel or self.config.keeps(core):
            return _SMALL
        return core

    def _storable(self, t: Tensor) -> bool:
        """Whether the pipeline may store ``t`` in another form: a strided tensor of the
        model's own (no input, parameter, skipped storage or gnnact op's context)."""
        if t.layout != torch.strided or t.dim() == 0 or is_traceable_wrapper_subclass(t):
            return False
        if self.config.resident_inputs and resident(t):
            return False
        return (not _is_parameter(t) and not own_context(t)
                and _storage_key(t) not in self._skip)

    def _tally(self, path: str, nbytes: int) -> None:
        self.bytes_by_module[path] = self.bytes_by_module.get(path, 0) + nbytes

    def _pass(self, t: Tensor, path: str, small: bool = False) -> None:
        """Tally the storages of a tensor that is saved as is (saved in module ``path``;
        ``small``: for its size, :meth:`_pass_small` for the common case)."""
        if _is_parameter(t):  # saved_bytes leaves graph leaves out too
            return
        for _, _, nbytes, key in tensor_storages(t, "saved"):
            if self._count_passed(key, nbytes, path, t.dtype in FLOAT_DTYPES) and small:
                self.num_small += 1
                self.small_bytes += nbytes

    def _pass_small(self, t: Tensor, storage: torch.UntypedStorage, nbytes: int) -> None:
        """:meth:`_pass` for a plain strided float tensor kept for its size (``storage``: its
        own, of ``nbytes``), counted in :attr:`num_small` unless it is other context of
        gnnact's ops (statistics: an input a twin keeps as is needs a gradient)."""
        if nbytes == 0 or _is_parameter(t):
            return
        if (self._count_passed(storage_key(storage), nbytes, None, True)
                and (t.requires_grad or not own_context(t))):
            self.num_small += 1
            self.small_bytes += nbytes

    def _owned_by_pass(self, t: Tensor, storage: torch.UntypedStorage) -> bool:
        """Whether ``t`` (saved, at or above the floor, or compressed context of gnnact's ops)
        is the pass's own: no parameter, input or other skipped storage."""
        return not _is_parameter(t) and storage_key(storage) not in self._skip

    def _count_passed(self, key: tuple, nbytes: int, path: str | None, exact: bool) -> bool:
        """Tally one storage kept as is (``path``: the module that saved it, ``None`` for
        the running one; ``exact``: floating-point values); ``False`` if it was counted
        already or is skipped."""
        if key in self._skip or key in self._passed:
            return False
        self._passed.add(key)
        self.passthrough_bytes += nbytes
        self._tally(self._where()[0] if path is None else path, nbytes)
        if exact:
            self.bytes_by_kind["exact"] = self.bytes_by_kind.get("exact", 0) + nbytes
        return True

    def _record(self, name: str, kind: str, t: Tensor, bits: int | None, nbytes: int,
                adaptive: bool) -> None:
        self.tensors[name] = SavedEntry(name, kind, tuple(t.shape), bits, nbytes, adaptive,
                                        t.numel() * t.element_size())
        if nbytes:
            self.bytes_by_kind[kind] = self.bytes_by_kind.get(kind, 0) + nbytes


# What _compressible returns for a tensor kept as is for its size.
_SMALL = object()


def _is_parameter(t: Tensor) -> bool:
    """A leaf that requires grad (a parameter), or a view of one (``weight.t()``)."""
    base = t._base if t._base is not None else t
    return base.is_leaf and base.requires_grad


def _storage_key(t: Tensor) -> tuple[str, int | None, int]:
    # The same key as gnnact.memory uses, so `skip` and `exclude` mean the same storages.
    return storage_key(t.untyped_storage())
