r"""gnnact's layers and routed functional calls as PyTorch custom operators, for
:func:`torch.compile`.

A converted model's layers run gnnact's ops, whose context lives outside any tensor program:
packed copies shared through the registries of the running
:class:`~gnnact.ops.state.ForwardState`, graphs in a :class:`~gnnact.ops.graph.GraphCache`,
rounding noise from the pass's seeds. Called from a compiled frame, each such op was a graph
break, and a break inside a model's layer loop makes Dynamo give up the whole frame: the
converted model ran eagerly, whatever ``torch.compile`` was asked.

Here a compressed layer's call inside a compiled frame (and a functional call the pass routes,
``F.relu(x)``, ``F.dropout(x, p, training)``: :data:`gnnact.nn.functional.CAPTURED`) is **one
custom operator**, ``gnnact::call``, with a fake kernel (the output's shape: a layer's
``_compiled_shape``) and an autograd formula (``gnnact::call_backward``). Dynamo traces
through it without a break, and inductor compiles and fuses the model's code around it. At run
time the operator makes the call eagerly, inside the pass its model's call opened
(:mod:`gnnact.nn.scope`; a functional call routed by that pass's mode): the same ops, the same
registries, the same noise stream, so that a compiled step computes and keeps what an eager
step does, bit for bit. The compressed context is what the call's own autograd record keeps,
as in eager mode; the graph holds a *ticket*, a one-element tensor that finds that record in
the call's :class:`Island`, and the record goes with the ticket: when autograd frees the
graph's saved tensors, or when backward has read it.

.. math::
    \text{forward:}\quad (Y, \tau) = \text{call}(X_1, \dots, X_k, \Theta), \qquad
    \text{backward:}\quad (\nabla X_i, \nabla\Theta) = \text{call\_backward}(\tau,
    \nabla Y),

with :math:`\Theta` the layer's parameters that need a gradient (inputs of the operator so
that the compiled graph routes their gradients) and :math:`\tau` the ticket (8 bytes, counted
in the pass's context).

A call is made this way when every argument is a strided tensor, ``None`` or a plain constant
(a bool, int, finite float or string) and its output's shape is known; any other (a bipartite
pair, ``return_attention_weights``, a ``SparseTensor``, an in-place call) runs as before, as an
eager call behind a graph break.
"""

from __future__ import annotations

import ast
import functools
import itertools
import math
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn
from torch.autograd.graph import get_gradient_edge

from gnnact.ops.probe import active_probe

__all__ = ["FUNCTIONS", "Island", "available", "bind", "call_function", "call_module"]

try:  # opaque objects as custom-operator arguments: PyTorch 2.10 and later
    from torch._library.opaque_object import register_opaque_type
    from torch._opaque_base import OpaqueBase
except ImportError:  # pragma: no cover (older PyTorch: layers break the graph, as before)
    register_opaque_type, OpaqueBase = None, object  # type: ignore[assignment,misc]


class Island(OpaqueBase):  # type: ignore[misc,valid-type]
    """The handle of a compressed layer (or of a converted model's functional calls) inside
    compiled graphs: the layer, and the autograd records of its calls made through
    ``gnnact::call`` whose backward has not run yet, by ticket. Kept on the layer
    (``module.__dict__``), or on the model's scope; a copy gets a handle of its own with no
    records.

    Args:
        module (torch.nn.Module, optional): the layer. (default: :obj:`None`: functional
            calls)
        route (callable, optional): ``route(func, *args, **kwargs)`` runs a functional call at
            run time (the pass's routing: the operator runs with no torch function mode on
            the stack). (default: :obj:`None`: ``func`` itself)
    """

    def __init__(self, module: nn.Module | None = None,
                 route: Callable[..., Any] | None = None) -> None:
        self.module = module  # (a cycle through the module's __dict__: collected with it)
        self.route = route
        self.records: dict[int, tuple] = {}
        self._tickets = itertools.count()

    def __reduce__(self) -> tuple:
        # Copies and pickles carry neither the layer nor records: a copied or unpickled layer
        # binds a handle of its own (_Compressed.__setstate__). (Inductor pickles a graph's
        # opaque inputs into its cache key: not a whole model.)
        return Island, (None, self.route)

    @property
    def name(self) -> str:
        """What the records are of, for messages."""
        return "a functional call" if self.module is None else type(self.module).__name__

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
        # The record lives as long as the ticket (autograd frees it with the graph); a
        # pipeline around the model keeps the ticket as it is.
        weakref.finalize(ticket, self.records.pop, key, None)
        setattr(ticket, TICKET, True)
        return ticket


ATTRIBUTE = "_gnnact_island"

#: The attribute that marks a ticket.
TICKET = "_gnnact_ticket"


def _register() -> bool:
    if register_opaque_type is None:
        return False
    try:
        register_opaque_type(Island, typ="reference")
    except (TypeError, ValueError):  # pragma: no cover (an earlier form of the API)
        return False
    return True


_AVAILABLE = _register()


def available() -> bool:
    """Whether this PyTorch takes an :class:`Island` as a custom operator's argument (the
    operators below exist only then; elsewhere a compressed layer breaks the graph)."""
    return _AVAILABLE


def bind(module: nn.Module) -> None:
    """Give ``module`` (a compressed layer) its :class:`Island`, unless it has its own."""
    island = module.__dict__.get(ATTRIBUTE)
    if available() and not (isinstance(island, Island) and island.module is module):
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


#: Functions ``gnnact::call`` calls by name (a converted model's routed functional calls,
#: :mod:`gnnact.nn.functional`): ``name -> function``.
FUNCTIONS: dict[str, Callable[..., Any]] = {}


def _arguments(args: list[Tensor], layout: str, names: str,
               consts: str) -> tuple[list, dict]:
    """The call's positional and keyword arguments from an operator's: one character of
    ``layout`` per argument, ``t`` the next of ``args`` (an operator's tensor list holds
    tensors only, for their gradients), ``n`` ``None``, ``c`` the next of the constants
    (``consts``, a Python literal list); the last ones named by ``names``."""
    tensors = iter(args)
    values = iter(_constants(consts))
    every = [next(tensors) if kind == "t" else None if kind == "n" else next(values)
             for kind in layout]
    keys = names.split(",") if names else []
    cut = len(every) - len(keys)
    return every[:cut], dict(zip(keys, every[cut:], strict=True))


@functools.lru_cache(maxsize=256)
def _constants(consts: str) -> tuple:
    # (A graph's calls repeat the same few: parsed once each.)
    return tuple(ast.literal_eval(consts)) if consts else ()


def _parameters(module: nn.Module | None) -> list[nn.Parameter]:
    return [] if module is None else [p for p in module.parameters() if p.requires_grad]


def _call(island: Island, fn: str, args: list[Tensor], layout: str, names: str, consts: str,
          params: list[Tensor], needs: list[bool], grad: bool,
          shape: list[int]) -> list[Tensor]:
    """``island.module(...)`` (``fn`` empty) or ``FUNCTIONS[fn](...)`` eagerly, on the
    arguments :func:`_arguments` puts together, in grad mode as traced (``grad``), recorded
    for backward when an argument (``needs``) or a parameter (``params``, the module's) needs
    a gradient; ``[output, ticket]``."""
    if not fn:
        target = island.module
    elif island.route is None:
        target = FUNCTIONS[fn]
    else:
        target = functools.partial(island.route, FUNCTIONS[fn])
    if sum(t.grad_fn is not None for t in args) > 1:
        # A backend that runs the graph's ops on the caller's tensors (backend="eager") hands
        # over arguments with their history. Where one argument's may lead to another's (x
        # and x_0 of GCN2Conv), the record starts at detached aliases: its backward would
        # run on through the layers between them (spending their records) and count the
        # gradient of the earlier one twice. (A single one stays itself, for the registries.)
        args = [t.detach().requires_grad_() if t.grad_fn is not None else t for t in args]
    positional, keywords = _arguments(args, layout, names, consts)
    wanted = [t for t, need in zip(args, needs, strict=True) if need]
    if not (wanted or params):  # nothing to record (in grad mode ops still note what they
        with torch.set_grad_enabled(grad):  # derive from the input: a dropout's mask, say)
            return [_own(target(*positional, **keywords), args), torch.tensor(-1)]
    flipped = [t for t in wanted if not t.requires_grad]
    with _RecordingGrad():
        # The arguments themselves become the record's leaves (not detached aliases): the
        # pass's registries know tensors by identity (shared packed copies, derived tensors).
        for t in flipped:
            t.requires_grad_(True)
        try:
            # (A copy of an argument, recorded while the argument still needs its gradient.)
            out = _own(target(*positional, **keywords), args)
            inputs = [get_gradient_edge(t)
                      for t in [*wanted, *_parameters(None if fn else island.module)]]
        finally:
            for t in flipped:
                t.requires_grad_(False)
        if not out.requires_grad:  # nothing reached the output: no record to keep
            return [out, torch.tensor(-1)]
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
    """``out`` itself (the object the pass may have registered), or a contiguous copy where it
    is one of the arguments or a view of one (a layer that returns its input: dropout in
    evaluation, or with ``p=0``), which an operator's output may not be, or is not contiguous
    (the fake kernel's output is: inductor checks the strides)."""
    ptr = out.untyped_storage().data_ptr()
    if any(t.untyped_storage().data_ptr() == ptr for t in args):
        return out.clone(memory_format=torch.contiguous_format)
    return out.contiguous()


def _call_fake(island: Island, fn: str, args: list[Tensor], layout: str, names: str,
               consts: str, params: list[Tensor], needs: list[bool], grad: bool,
               shape: list[int]) -> list[Tensor]:
    x = args[0]
    return [x.new_empty(shape), x.new_empty((), dtype=torch.int64)]


def _call_backward(island: Island, ticket: Tensor, grad: Tensor, shapes: list[int],
                   ranks: list[int]) -> list[Tensor]:
    """The gradients of the arguments that needed one, then of the parameters, from the
    record ``ticket`` finds (read once: its buffers are freed)."""
    record = island.records.pop(int(ticket), None)
    if record is None:
        raise RuntimeError(
            f"gnnact: backward through {island.name} a second time, or after its record was "
            f"freed: a compressed layer's record is read once (call backward once per forward "
            f"pass)")
    out_edge, inputs, probe = record
    if probe is not None:  # (it ends with the backward pass this one runs inside)
        probe.finish_with_backward()
    grads = torch.autograd.grad([out_edge], inputs, [grad], allow_unused=True)
    out, taken = [], {grad.untyped_storage().data_ptr()}
    for g, size in zip(grads, _shapes(shapes, ranks), strict=True):
        if g is None:
            g = grad.new_zeros(size)
        elif g.untyped_storage().data_ptr() in taken:  # (an identity's gradient: its input)
            g = g.clone()
        taken.add(g.untyped_storage().data_ptr())
        out.append(g)
    return out


def _call_backward_fake(island: Island, ticket: Tensor, grad: Tensor, shapes: list[int],
                        ranks: list[int]) -> list[Tensor]:
    return [grad.new_empty(size) for size in _shapes(shapes, ranks)]


def _shapes(flat: list[int], ranks: list[int]) -> list[list[int]]:
    starts = [0, *itertools.accumulate(ranks)]
    return [flat[a:b] for a, b in itertools.pairwise(starts)]


def _setup(ctx: Any, inputs: tuple, output: list[Tensor]) -> None:
    island, _fn, args, _layout, _names, _consts, params, needs, _grad, _shape = inputs
    ctx.island = island
    ctx.needs = needs
    ctx.num_params = len(params)
    wanted = [t for t, need in zip(args, needs, strict=True) if need]
    ctx.ranks = [t.dim() for t in [*wanted, *params]]
    ctx.shapes = [s for t in [*wanted, *params] for s in t.shape]
    ctx.save_for_backward(output[1])


def _backward(ctx: Any, grads: list[Tensor]) -> tuple:
    (ticket,) = ctx.saved_tensors
    got = iter(call_backward(ctx.island, ticket, grads[0], ctx.shapes, ctx.ranks))
    arg_grads = [next(got) if need else None for need in ctx.needs]
    params = [next(got) for _ in range(ctx.num_params)]
    return None, None, arg_grads, None, None, None, params, None, None, None


if _AVAILABLE:
    call = torch.library.custom_op("gnnact::call", _call, mutates_args=())
    call.register_fake(_call_fake)
    call_backward = torch.library.custom_op("gnnact::call_backward", _call_backward,
                                            mutates_args=())
    call_backward.register_fake(_call_backward_fake)
    call.register_autograd(_backward, setup_context=_setup)


_CONSTANTS = (bool, int, float, str)


def _make_call(island: Island, fn: str, args: tuple, kwargs: dict, shape: list[int] | None,
               params: list[nn.Parameter]) -> Any:
    """``gnnact::call`` of these arguments, or ``NotImplemented`` when it does not take them:
    every argument a strided tensor, ``None`` or a plain constant, the first a tensor, and
    the gradients it needs of ``x``'s dtype and device (its backward's fake kernel gives
    every gradient ``x``'s)."""
    every = [*args, *kwargs.values()]
    if not _AVAILABLE or shape is None or not args or not isinstance(args[0], Tensor):
        return NotImplemented
    layout, given, consts = [], [], []
    for value in every:
        if isinstance(value, Tensor):
            if value.layout != torch.strided:
                return NotImplemented
            layout.append("t")
            given.append(value)
        elif value is None:
            layout.append("n")
        elif isinstance(value, _CONSTANTS) and (not isinstance(value, float)
                                                or math.isfinite(value)):
            layout.append("c")
            consts.append(value)
        else:
            return NotImplemented
    grad = torch.is_grad_enabled()
    needs = [t.requires_grad and grad for t in given]
    x = args[0]
    if any(t.dtype != x.dtype or t.device != x.device
           for t, need in zip(given, needs, strict=True) if need) or any(
            p.dtype != x.dtype or p.device != x.device for p in params):
        return NotImplemented
    out, _ = torch.ops.gnnact.call(island, fn, given, "".join(layout), ",".join(kwargs),
                                   repr(consts) if consts else "", params, needs, grad,
                                   list(shape))
    return out


def call_module(module: nn.Module, args: tuple, kwargs: dict) -> Any:
    """``module(*args, **kwargs)`` inside a compiled frame, as ``gnnact::call``; or
    ``NotImplemented`` when the call is not one it takes (see the module docstring)."""
    island = module.__dict__.get(ATTRIBUTE)
    if island is None or not args or not isinstance(args[0], Tensor):
        return NotImplemented  # (before the shape: a bipartite pair has none)
    params = _parameters(module) if torch.is_grad_enabled() else []
    return _make_call(island, "", args, kwargs, module._compiled_shape(*args, **kwargs),
                      params)


def call_function(island: Island, fn: str, args: tuple, kwargs: dict,
                  shape: list[int] | None) -> Any:
    """``FUNCTIONS[fn](*args, **kwargs)`` inside a compiled frame, as ``gnnact::call``
    recorded in ``island`` (its output's shape ``shape``); or ``NotImplemented``."""
    return _make_call(island, fn, args, kwargs, shape, [])
