r"""The state of one forward pass: the registries gnnact's ops share while it runs.

A forward pass of a compressed model needs a little shared bookkeeping: which tensors already
have a packed copy (so that every consumer keeps the same one), which tensors can be rebuilt
from context other ops keep (*derived* tensors), which saved tensors are gnnact's own context
(so that :class:`gnnact.compress_saved_tensors` does not compress them twice), and, while
context is offloaded, strong references that keep shared pieces alive. All of it belongs to
**one forward pass**: a :class:`ForwardState`.

Which state an op uses is found through a :class:`~contextvars.ContextVar`, so it is per thread
(and per asyncio task): two models training in two threads never see each other's entries.

* :func:`forward_pass` opens a fresh state for a block and drops it at the end. The forward
  pass of a model converted by :func:`gnnact.convert`, and every
  :class:`gnnact.compress_saved_tensors` block, run in one; nested blocks share the outer one.
  Everything the pass registered is gone when it ends, whether it finished or failed.
* Ops called outside such a block (gnnact layers used on their own) use the calling
  context's own state, created on first use. Its entries hold weak references only and
  disappear with the tensors they describe.

Nothing here holds a tensor strongly except :attr:`ForwardState.held`, filled only inside
:meth:`ForwardState.hold` (while offloading) and emptied when that ends.

Under :func:`torch.compile` every op that reads or writes these registries runs eagerly, as one
opaque call (:func:`eager_op`): Dynamo compiles the code between gnnact's ops. A compressed
layer called from a compiled frame runs all of its ops inside one custom operator instead
(:mod:`gnnact.ops.library`), with no graph break.

A converted model's pass also runs under a torch function mode (a :class:`PassMode`,
:class:`gnnact.nn.functional.FunctionalOps`) that routes the model's functional calls to
gnnact's ops. gnnact's own work inside the pass (an op's quantization and packing, a saved
tensor's pack hook) runs with that mode taken off the stack (:class:`own_work`): the mode has
nothing to route there, and dispatching each of those calls through a Python mode cost more
than a small graph's whole step.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from gnnact.quant.rng import PassSeeds

__all__ = ["ForwardState", "OwnRef", "PassMode", "eager_op", "forward_pass", "forward_state",
           "inlined_only", "not_compiled", "own_work", "under_dynamo"]

_F = TypeVar("_F", bound=Callable[..., Any])


def eager_op(fn: _F) -> _F:
    """``fn``, run eagerly as one opaque call inside a :func:`torch.compile`-d model.

    gnnact's ops keep their context outside any graph: bit-packed codes found again through the
    weak registries of the running :class:`ForwardState`, graphs kept in a
    :class:`~gnnact.ops.graph.GraphCache`, rounding noise drawn from a seed read on the host.
    None of that is a tensor program Dynamo can trace (it would break the graph inside the op
    and compile the op's internals frame by frame, once per dtype and shape). As an opaque call
    the op computes and keeps exactly what it does eagerly (same bits, same noise stream), and
    the model's code between the ops is compiled. Eager or compiled, the op runs as
    :class:`own_work`: the pass's mode does not see its calls.
    """

    @functools.wraps(fn)
    def op(*args: Any, **kwargs: Any) -> Any:
        with own_work():
            return fn(*args, **kwargs)

    return torch.compiler.disable(op)  # type: ignore[return-value]


#: ``fn`` itself, never compiled by Dynamo, as a frame of its own or inside another (a graph
#: break where a compiled frame calls it); the frames it calls may be. For code eager mode
#: runs for every call or saved tensor: Dynamo's frame-skipping mark (private,
#: ``torch._dynamo.decorators.skip``), not :func:`torch.compiler.disable`'s wrapper, which
#: costs ~0.5 µs a call (where a PyTorch lacks the mark, the wrapper does the same).
not_compiled = getattr(torch._dynamo.decorators, "skip", torch.compiler.disable)


_callback = getattr(torch._C._dynamo.eval_frame, "get_eval_frame_callback", lambda: None)


def under_dynamo() -> bool:
    """Whether this code runs eagerly inside a compiled region (a graph break's eager part):
    Dynamo then offers each Python frame it calls to be compiled on its own. (Its frame
    callback is set; private: where a PyTorch lacks the getter, ``False``.)"""
    return _callback() is not None


def inlined_only(fn: _F) -> _F:
    """``fn``, never compiled by Dynamo as a frame of its own, yet traced into the frames it
    compiles. For the code of gnnact's hooks and dispatchers, which eager code calls for every
    module or torch call: compiled as frames, each call would pay Dynamo's guards, and a
    dispatcher compiled for one call would stand in for the eager one (which routes).
    (Dynamo's ``skip_code``, private: where a PyTorch lacks it, ``fn`` is left as it is.)"""
    skip = getattr(torch._dynamo.eval_frame, "skip_code", None)
    if skip is not None:
        skip(fn.__code__)
    return fn


class PassMode(TorchFunctionMode):
    """The torch function mode a converted model's pass runs under
    (:class:`gnnact.nn.functional.FunctionalOps`): what :class:`own_work` takes off the
    stack."""


class own_work:  # (a context manager named as torch.no_grad is)
    """Inside, the running :class:`PassMode`, when it is the innermost torch function mode,
    is off the stack: gnnact's own tensor calls go straight to PyTorch. A mode above it (a
    user's, :class:`torch.device` as a context) stays, and so does the pass's own then.

    A class, not a generator: it is entered for every op and every saved tensor.
    """

    __slots__ = ("mode",)

    def __enter__(self) -> None:
        depth = torch._C._len_torch_function_stack()
        top = torch._C._get_function_stack_at(depth - 1) if depth else None
        self.mode = (torch._C._pop_torch_function_stack()
                     if isinstance(top, PassMode) and not torch.compiler.is_compiling()
                     else None)

    def __exit__(self, *exc: object) -> None:
        if self.mode is not None:
            torch._C._push_on_torch_function_stack(self.mode)


class OwnRef(weakref.ref):
    """A weak reference to a tensor a gnnact op handed to autograd, and what it stands for:
    :attr:`raw_bytes`, the bytes of the values it keeps as PyTorch's op would keep them (a
    tensor kept as is: its own; a packed mask: a byte a value; a compressed copy or a derived
    tensor: the original's on its last part that is no input of the pass, 0 on the others),
    and whether it keeps them :attr:`exact`."""

    __slots__ = ("exact", "raw_bytes")

    def __new__(cls, t: Tensor, callback: Any, raw_bytes: int, exact: bool) -> OwnRef:
        return super().__new__(cls, t, callback)

    def __init__(self, t: Tensor, callback: Any, raw_bytes: int, exact: bool) -> None:
        super().__init__(t, callback)
        self.raw_bytes, self.exact = raw_bytes, exact


@dataclass(eq=False)
class ForwardState:
    """The registries of one forward pass (see the module docstring).

    Args:
        shared (dict): cache key of a tensor -> its packed copy, as weak references:
            ``(weakref to the tensor or the base it views, its _version, format, weakrefs to
            the packed tensors, the packed class, its metadata)``.
        derived (dict): ``id`` of a derived tensor -> ``(weakref to it, its _version, steps)``,
            each step ``(kind, weakrefs to its tensors (or None), metadata)``.
        own (dict): ``id`` -> :class:`OwnRef` of the tensors gnnact's ops handed to autograd.
        held (dict): strong references behind ``shared``/``derived`` entries, only inside
            :meth:`hold`.
        row_gradients (dict): ``(tag, role, shape)`` -> row norms of the gradient that reached
            that tensor at the last backward (per-node precision); the owner of a longer
            lifetime (a converted model) passes its own dict so that they carry over steps.
        resident (set, optional): storage keys ``(device type, index, data_ptr)`` of the
            pass's inputs, when the pass knows them (a converted model's): only those, of the
            tensors that need no gradient, are kept by reference; any other is a temporary
            of the pass and is packed. ``None``: every such tensor is taken for an input.
        rounding (torch.Generator, optional): the source of this pass's rounding seeds
            (:class:`gnnact.quant.rng.PassSeeds`), when its owner gives one; ``None``: the
            default CPU generator, as a direct :func:`gnnact.quantize` call draws them.
        widths (dict, optional): ``"<tag>:<role>"`` -> the width of that tensor in this pass,
            overriding the op's own (a converted model's automatic widths,
            :mod:`gnnact.adaptive.auto`); ``None``: each op's config decides.
    """

    shared: dict[tuple, tuple] = field(default_factory=dict)
    derived: dict[int, tuple] = field(default_factory=dict)
    own: dict[int, OwnRef] = field(default_factory=dict)
    held: dict[tuple, tuple[Tensor, ...]] = field(default_factory=dict)
    row_gradients: dict[tuple, Tensor] = field(default_factory=dict)
    resident: set[tuple] | None = None
    rounding: torch.Generator | None = None
    widths: dict[str, int] | None = None
    holding: int = 0
    scoped: bool = False  # opened by forward_pass (else the context's own)

    # ------------------------------------------------------------------ holding

    @contextlib.contextmanager
    def hold(self) -> Iterator[None]:
        """Inside, the pieces behind ``shared`` and ``derived`` entries stay alive as long as
        the tensor they stand for does (:func:`gnnact.ops.context.hold_parts`)."""
        self.holding += 1
        try:
            yield
        finally:
            self.holding -= 1
            if not self.holding:
                self.held.clear()

    def keep(self, key: tuple, tensors: Iterable[Tensor | None]) -> None:
        """Hold ``tensors`` under ``key`` while :meth:`hold` is active."""
        if self.holding:
            self.held[key] = tuple(t for t in tensors if t is not None)

    # ------------------------------------------------------------------ weak callbacks

    def forget_shared(self, key: tuple, ref: weakref.ref) -> None:
        entry = self.shared.get(key)
        if entry is not None and entry[0] is ref:
            del self.shared[key]
            self.held.pop(("cache", key), None)

    def forget_derived(self, key: int, ref: weakref.ref) -> None:
        entry = self.derived.get(key)
        if entry is not None and entry[0] is ref:
            del self.derived[key]
            self.held.pop(("derived", key), None)

    def forget_own(self, key: int, ref: weakref.ref) -> None:
        if self.own.get(key) is ref:
            del self.own[key]

    def callback(self, method: str, key: Any) -> Any:
        """A weakref callback calling ``method(key, ref)`` on this state while it lives: the
        callback must not keep the state alive (a long-lived tensor would keep a finished
        pass's registries)."""
        state = weakref.ref(self)

        def call(ref: weakref.ref) -> None:
            alive = state()
            if alive is not None:
                getattr(alive, method)(key, ref)

        return call


_STATE: ContextVar[ForwardState | None] = ContextVar("gnnact_forward_state", default=None)


def forward_state() -> ForwardState:
    """The state of the forward pass running in this context: the innermost
    :func:`forward_pass`, else this context's own (created on first use)."""
    state = _STATE.get()
    if state is None:
        state = ForwardState()
        _STATE.set(state)
    return state


@contextlib.contextmanager
def forward_pass(row_gradients: dict | None = None, *, seeds: PassSeeds | None = None,
                 fresh: bool = False) -> Iterator[ForwardState]:
    """Run the block in a forward pass of its own: a fresh :class:`ForwardState`, dropped at
    the end (also on an exception). Inside another :func:`forward_pass` the block joins the
    outer one (and its rounding seeds) unless ``fresh`` is set.

    Args:
        row_gradients (dict, optional): the dict per-node precision reads and writes, owned by
            the caller so that it outlives the pass. (default: a new dict)
        seeds (PassSeeds, optional): the caller's source of per-pass rounding seeds: the
            pass's quantizations then draw none from the default generator.
            (default: :obj:`None`, they do)
        fresh (bool, optional): start a new pass even inside another one.
            (default: :obj:`False`)
    """
    outer = _STATE.get()
    if outer is not None and outer.scoped and not fresh:
        yield outer
        return
    state = ForwardState(row_gradients={} if row_gradients is None else row_gradients,
                         scoped=True, rounding=None if seeds is None else seeds.generator())
    token = _STATE.set(state)
    try:
        yield state
    finally:
        _STATE.reset(token)
