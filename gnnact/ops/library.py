r"""gnnact's layers as PyTorch custom operators, for :func:`torch.compile`.

A converted model's layers run gnnact's ops, whose context lives outside any tensor program:
packed copies shared through the registries of the running
:class:`~gnnact.ops.state.ForwardState`, graphs in a :class:`~gnnact.ops.graph.GraphCache`,
rounding noise from the pass's seeds. Called from a compiled frame, each such op was a graph
break, and a break inside a model's layer loop makes Dynamo give up the whole frame: the
converted model ran eagerly, whatever ``torch.compile`` was asked.

Here a compressed layer's call inside a compiled frame is **one custom operator**,
``gnnact::module_call``, with a fake kernel (the layer's output shape, from
``_compiled_shape``) and an autograd formula (``gnnact::module_backward``). Dynamo traces
through it without a break, and inductor compiles and fuses the model's code around it. At run
time the operator calls the layer eagerly, inside the pass its model's call opened
(:mod:`gnnact.nn.scope`): the same ops, the same registries, the same noise stream, so that a
compiled step computes and keeps what an eager step does, bit for bit. The layer's compressed
context is what its own autograd record keeps, as in eager mode; the graph holds a
*ticket*, a one-element tensor that finds that record in the layer's :class:`Island`, and the
record goes with the ticket: when autograd frees the graph's saved tensors, or when backward
has read it.

.. math::
    \text{forward:}\quad (Y, \tau) = \text{module\_call}(X_1, \dots, X_k, \Theta), \qquad
    \text{backward:}\quad (\nabla X_i, \nabla\Theta) = \text{module\_backward}(\tau,
    \nabla Y),

with :math:`\Theta` the layer's parameters that need a gradient (inputs of the operator so
that the compiled graph routes their gradients) and :math:`\tau` the ticket.

A layer is called this way when every argument is a strided tensor or ``None`` and the layer
knows its output's shape; any other call (a bipartite pair, ``return_attention_weights``,
a ``SparseTensor``) runs as before, as an eager call behind a graph break.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge

from gnnact.ops.context import mark_own
from gnnact.ops.probe import active_probe

__all__ = ["Island", "available", "bind", "call_compiled"]

try:  # opaque objects as custom-operator arguments: PyTorch 2.10 and later
    from torch._library.opaque_object import register_opaque_type
    from torch._opaque_base import OpaqueBase
except ImportError:  # pragma: no cover (older PyTorch: layers break the graph, as before)
    register_opaque_type, OpaqueBase = None, object  # type: ignore[assignment,misc]


class Island(OpaqueBase):  # type: ignore[misc,valid-type]
    """A compressed layer's handle inside compiled graphs: the layer, and the autograd records
    of its calls made through ``gnnact::module_call`` whose backward has not run yet, by
    ticket. Kept on the layer (``module.__dict__``); a copy of the layer gets a handle of its
    own with no records."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module  # (a cycle through the module's __dict__: collected with it)
        self.records: dict[int, tuple] = {}
        self._tickets = itertools.count()

    def __getstate__(self) -> dict:
        return {"module": self.module}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["module"])  # type: ignore[misc]

    def __deepcopy__(self, memo: dict) -> Island:
        import copy

        return Island(copy.deepcopy(self.module, memo))

    def record(self, out: Tensor, inputs: list) -> Tensor:
        """Keep ``out``'s autograd record for backward; the ticket that finds it. In a probe
        pass the probe hooks the record's nodes as it hooks the eager graph's
        (:meth:`NoiseProbe.collect <gnnact.ops.probe.NoiseProbe.collect>`)."""
        key = next(self._tickets)
        probe = active_probe()
        if probe is not None:
            probe.collect(out)
        self.records[key] = (get_gradient_edge(out), inputs, probe)
        ticket = torch.tensor(key)
        # The record lives as long as the ticket (autograd frees it with the graph), and a
        # pipeline around the model keeps the ticket as it is (gnnact's own context).
        weakref.finalize(ticket, self.records.pop, key, None)
        mark_own([ticket])
        return ticket


ATTRIBUTE = "_gnnact_island"

if register_opaque_type is not None:
    register_opaque_type(Island, typ="reference")


def available() -> bool:
    """Whether this PyTorch takes an :class:`Island` as a custom operator's argument."""
    return register_opaque_type is not None


def bind(module: nn.Module) -> None:
    """Give ``module`` (a compressed layer) its :class:`Island` if it has none."""
    if available() and not isinstance(module.__dict__.get(ATTRIBUTE), Island):
        module.__dict__[ATTRIBUTE] = Island(module)


class _RecordingGrad:
    """Inside, autograd records again, in a custom operator's kernel (which the dispatcher
    runs with autograd's keys excluded): the layer's own ops build the record backward
    reads."""

    _KEYS = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradFunctionality)
             | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradOther)
             | torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradNestedTensor))

    def __enter__(self) -> None:
        self._guard = torch._C._ForceDispatchKeyGuard(
            torch._C._dispatch_tls_local_include_set(),
            torch._C._dispatch_tls_local_exclude_set() - self._KEYS)
        self._guard.__enter__()
        self._grad = torch.enable_grad()
        self._grad.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._grad.__exit__(*exc)
        self._guard.__exit__(*exc)


def _split(args: list[Tensor], present: list[bool], names: str) -> tuple[list, dict]:
    """The call's positional and keyword arguments: ``args`` where ``present``, ``None``
    elsewhere (an operator's argument list holds tensors only, for their gradients), the
    last ones named by ``names``."""
    given = iter(args)
    args = [next(given) if here else None for here in present]
    keys = names.split(",") if names else []
    cut = len(args) - len(keys)
    return args[:cut], dict(zip(keys, args[cut:], strict=True))


def _parameters(module: nn.Module) -> list[nn.Parameter]:
    return [p for p in module.parameters() if p.requires_grad]


@torch.library.custom_op("gnnact::module_call", mutates_args=())
def module_call(island: Island, args: list[Tensor], present: list[bool], names: str,
                params: list[Tensor], needs: list[bool], grad: bool,
                shape: list[int]) -> list[Tensor]:
    """``island.module(*args)`` eagerly (``present``: where the call has a tensor rather than
    ``None``; ``names``: the keywords of its last arguments, joined by commas),
    in grad mode as traced (``grad``), recorded for backward when an argument (``needs``) or
    a parameter needs a gradient; ``[output, ticket]``."""
    module = island.module
    positional, keywords = _split(args, present, names)
    wanted = [t for t, need in zip(args, needs, strict=True) if need]
    if not (wanted or params):  # nothing to record (in grad mode ops still note what they
        with torch.set_grad_enabled(grad):  # derive from the input: a dropout's mask, say)
            return [_own(module(*positional, **keywords), args), torch.tensor(-1)]
    flipped = [t for t in wanted if not t.requires_grad]
    with _RecordingGrad():
        # The arguments themselves become the record's leaves (not detached aliases): the
        # pass's registries know tensors by identity (shared packed copies, derived tensors).
        for t in flipped:
            t.requires_grad_(True)
        try:
            out = module(*positional, **keywords)
            inputs = [get_gradient_edge(t) for t in [*wanted, *_parameters(module)]]
        finally:
            for t in flipped:
                t.requires_grad_(False)
        if not out.requires_grad:  # nothing reached the output: no record to keep
            return [_own(out, args), torch.tensor(-1)]
        ticket = island.record(out, inputs)
        # Detached in place when it can be, so that it stays the object the pass registered
        # (a BatchNorm output the next layer rebuilds rather than keeps, say). (Inside: the
        # detach is autograd's, a no-op with its keys excluded.)
        if out._base is None:
            out.detach_()
        else:
            out = out.detach()
    return [out, ticket]


def _own(out: Tensor, args: list[Tensor]) -> Tensor:
    """``out`` itself (the object the pass may have registered), or a copy where it is one of
    the arguments (a layer that returns its input: dropout in evaluation), which an
    operator's output may not be."""
    return out.clone() if any(out is t for t in args) else out


@module_call.register_fake
def _(island: Island, args: list[Tensor], present: list[bool], names: str,
      params: list[Tensor], needs: list[bool], grad: bool, shape: list[int]) -> list[Tensor]:
    x = args[0]
    return [x.new_empty(shape), x.new_empty((), dtype=torch.int64)]


@torch.library.custom_op("gnnact::module_backward", mutates_args=())
def module_backward(island: Island, ticket: Tensor, grad: Tensor, shapes: list[int],
                    ranks: list[int]) -> list[Tensor]:
    """The gradients of the arguments that needed one, then of the parameters, from the
    record ``ticket`` finds (read once: its buffers are freed)."""
    record = island.records.pop(int(ticket), None)
    if record is None:
        raise RuntimeError(
            f"gnnact: backward through {type(island.module).__name__} a second time, or after "
            f"its record was freed: a compressed layer's record is read once (call backward "
            f"once per forward pass)")
    out_edge, inputs, probe = record
    if probe is not None:  # (it ends with the backward pass this one runs inside)
        probe.finish_with_backward()
    grads = torch.autograd.grad([out_edge], inputs, [grad], allow_unused=True)
    sizes = _shapes(shapes, ranks)
    return [grad.new_zeros(size) if g is None else g
            for g, size in zip(grads, sizes, strict=True)]


@module_backward.register_fake
def _(island: Island, ticket: Tensor, grad: Tensor, shapes: list[int],
      ranks: list[int]) -> list[Tensor]:
    return [grad.new_empty(size) for size in _shapes(shapes, ranks)]


def _shapes(flat: list[int], ranks: list[int]) -> list[list[int]]:
    starts = [0, *itertools.accumulate(ranks)]
    return [flat[a:b] for a, b in itertools.pairwise(starts)]


def _setup(ctx: Any, inputs: tuple, output: list[Tensor]) -> None:
    island, args, _present, _names, params, needs, _grad, _shape = inputs
    ctx.island = island
    ctx.needs = needs
    ctx.num_params = len(params)
    wanted = [t for t, need in zip(args, needs, strict=True) if need]
    ctx.ranks = [t.dim() for t in [*wanted, *params]]
    ctx.shapes = [s for t in [*wanted, *params] for s in t.shape]
    ctx.save_for_backward(output[1])


def _backward(ctx: Any, grads: list[Tensor]) -> tuple:
    (ticket,) = ctx.saved_tensors
    got = iter(module_backward(ctx.island, ticket, grads[0], ctx.shapes, ctx.ranks))
    arg_grads = [next(got) if need else None for need in ctx.needs]
    return (None, arg_grads, None, None, [next(got) for _ in range(ctx.num_params)], None,
            None, None)


module_call.register_autograd(_backward, setup_context=_setup)


def call_compiled(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    """``module(*args, **kwargs)`` inside a compiled frame, as ``gnnact::module_call``; or
    ``NotImplemented`` when the call is not one it takes (see the module docstring)."""
    island = module.__dict__.get(ATTRIBUTE)
    if island is None:
        return NotImplemented
    tensors = [*args, *kwargs.values()]
    if not tensors or not isinstance(args[0], Tensor) or any(
            t is not None and (not isinstance(t, Tensor) or t.layout != torch.strided)
            for t in tensors):
        return NotImplemented
    shape = module._compiled_shape(*args, **kwargs)
    if shape is None:
        return NotImplemented
    params = _parameters(module) if torch.is_grad_enabled() else []
    given = [t for t in tensors if t is not None]
    needs = [t.requires_grad and torch.is_grad_enabled() for t in given]
    x = args[0]
    if any(t.dtype != x.dtype or t.device != x.device
           for t, need in zip(given, needs, strict=True) if need) or any(
            p.dtype != x.dtype or p.device != x.device for p in params):
        return NotImplemented  # (the backward's fake kernel gives every gradient x's dtype)
    out, _ = torch.ops.gnnact.module_call(island, given, [t is not None for t in tensors],
                                          ",".join(kwargs), params, needs,
                                          torch.is_grad_enabled(), list(shape))
    return out
