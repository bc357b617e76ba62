r"""Functional calls inside a converted model's forward, routed to gnnact's ops.

PyG's examples and most user code call activations, dropout and linear maps as functions in
``forward`` (``F.relu(x)``, ``x.relu()``, ``F.dropout(x, p, training=self.training)``), not as
modules :func:`gnnact.convert` could swap. Inside the forward pass of a converted model,
:class:`FunctionalOps` (a :class:`~torch.overrides.TorchFunctionMode`) gives these calls what
their module twins get:

=====================================================  ===================================
call                                                   kept for backward
=====================================================  ===================================
``F.relu``, ``torch.relu``, ``Tensor.relu``,           1-bit mask :math:`[X > 0]`
``relu_`` (and ``inplace=True``)
``F.leaky_relu``, ``F.leaky_relu_``                    1-bit mask :math:`[X > 0]`
``F.elu``, ``F.elu_``                                  1-bit mask, :math:`Y` at ``bits``
``F.dropout``, ``torch.dropout`` (their ``training``)  1-bit keep mask
``F.linear``                                           input at ``bits`` (nothing if it is
                                                       rebuilt from BatchNorm/ReLU/dropout
                                                       context)
``F.batch_norm`` (batch statistics)                    input at ``bits``, mean, inverse std
``x.index_select(dim, index)``, ``x[index]``           ``x`` and ``index`` (rows gathered to
                                                       edges: :mod:`~gnnact.compress.gather`)
ReLU, LeakyReLU and ``+ - * /`` with a number, on      ``f(x)`` and ``index``, ``f`` the
gathered rows (GENConv's ``x_j.relu() + eps``)         call: where those rows are saved
``F.gelu``, ``torch.tanh``, ... (anything else)        what PyTorch saves, at ``bits``
                                                       (the generic pipeline)
=====================================================  ===================================

A call of ReLU, LeakyReLU, ELU or dropout whose input is a *temporary*
(``F.relu(self.bn(x))``, ``F.elu(self.conv1(x, edge_index))``,
``self.conv(x, edge_index).relu()``: a result no name, container, view or saved context
refers to) writes over that input, as ``inplace=True`` would: the caller can never read it
again, so the result is the same and one full-size tensor fewer is alive (PyG's examples nest
these calls; in PyTorch each nesting keeps the inner result alive beside the outer one). What
counts as a temporary is measured, not assumed: see :func:`temporary_counts`.

A call is routed only when autograd records it (grad mode on, an input that needs a gradient),
its arguments are the plain kind gnnact's ops take, and (for the calls that compress,
:data:`FLOORED`) its input has at least the scope's ``config.floor`` bytes
(:attr:`Config.min_bytes <gnnact.Config>`: smaller tensors are kept as they are); otherwise, and
inside gnnact's own ops, PyTorch's function runs unchanged. Everything else saved in the pass
goes through the generic pipeline (:class:`gnnact.compress_saved_tensors`) that the scope
(:mod:`gnnact.nn.scope`) enters alongside. While :func:`~torch.nn.functional.softmax` or
:func:`~torch.nn.functional.log_softmax` or a loss function (:data:`EXACT_FUNCTIONS`) runs,
what it saves stays exact: the loss head and auxiliary losses, by far the most sensitive
context (GACT). A tanh's output, which backward reads nonlinearly (:data:`FINE_FUNCTIONS`), is
kept at ``config.attention`` bits.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnact import ops
from gnnact.compress.gather import gather_record, mark_derived, mark_gathered
from gnnact.config import Config
from gnnact.ops import library
from gnnact.ops.context import overwritable
from gnnact.ops.state import PassMode, inlined_only, not_compiled

__all__ = ["CAPTURED", "EXACT_FUNCTIONS", "FINE_FUNCTIONS", "FLOORED", "GATE_FUNCTIONS",
           "CollectingOps", "FunctionalOps", "Marks", "temporary_counts"]

#: Functions whose saved tensors stay exact: the loss head (a softmax, or a sigmoid outside
#: message passing, :data:`GATE_FUNCTIONS`), and the losses a model computes in its
#: own forward (an auxiliary loss: SuperGAT's attention loss, a regulariser). The loss's
#: context is by far the most sensitive (GACT), and it is small: one value per prediction.
EXACT_FUNCTIONS = frozenset({
    F.softmax, F.log_softmax, torch.softmax, torch.log_softmax, Tensor.softmax,
    Tensor.log_softmax, F.cross_entropy, F.nll_loss,
    F.binary_cross_entropy, F.binary_cross_entropy_with_logits, F.mse_loss, F.l1_loss,
    F.smooth_l1_loss, F.huber_loss, F.kl_div, F.poisson_nll_loss, F.gaussian_nll_loss,
    F.margin_ranking_loss, F.cosine_embedding_loss, F.hinge_embedding_loss, F.soft_margin_loss,
    F.multilabel_soft_margin_loss, F.triplet_margin_loss})

#: Functions whose saved output backward reads nonlinearly (tanh: :math:`1 - \hat y^2`):
#: rounding it biases the gradient by the rounding's variance. Kept at ``config.attention``
#: bits (8 by default), as attention coefficients are.
FINE_FUNCTIONS = frozenset({torch.tanh, F.tanh, Tensor.tanh})

#: A sigmoid is a loss head outside message passing (GAE's decoder ends in one, its loss takes
#: the log of it: exact) and a gate inside it (SuperGAT's attention, ResGatedGraphConv's
#: edge gates: one value per edge, read as :math:`\hat y (1 - \hat y)`, at
#: ``config.attention`` bits as a tanh's output is, and shared with the op that multiplies by
#: it rather than kept a second time in full).
GATE_FUNCTIONS = frozenset({torch.sigmoid, F.sigmoid, Tensor.sigmoid})


@dataclass
class Marks:
    """What runs now inside a converted model's pass: raised while a function of
    :data:`EXACT_FUNCTIONS` (``exact``), :data:`FINE_FUNCTIONS` (``fine``) or
    :data:`GATE_FUNCTIONS` (``gate``) runs; the scope's pipeline keeps what is saved meanwhile
    exact, or at ``config.attention`` bits (a gate: inside message passing, else exact)."""

    exact: int = 0
    fine: int = 0
    gate: int = 0


def _float(x: Any) -> bool:
    # Plain tensors and parameters only: a tensor subclass has its own __torch_function__.
    return (type(x) in (Tensor, nn.Parameter) and x.layout == torch.strided
            and x.is_floating_point())


# The handlers take PyTorch's parameter names (``input`` included), so keyword calls bind.


# (The mask ops take the module's config for its floor only: they keep exact masks.)


def _derived(out: Any, record: tuple | None, fn: Callable[[Tensor], Tensor]) -> Any:
    """``out``, marked as ``fn`` of the gathered rows ``record`` is of, if any
    (:func:`gnnact.compress.gather.mark_derived`): kept as ``fn`` of their source."""
    if record is not None:
        mark_derived(out, record, fn)
    return out


def _relu(cfg: Callable[[str], Config], input: Tensor, inplace: bool = False) -> Any:
    if not _float(input):
        return NotImplemented
    record = gather_record(input)  # (before the call: in place, it changes the input)
    return _derived(ops.relu(input, inplace=inplace, config=cfg("activations")), record,
                    _relu_values)


def _relu_values(x: Tensor) -> Tensor:
    # ops.relu's values, signed zeros and NaNs included: x times the mask [x > 0].
    return torch.mul(x, x > 0)


def _relu_(cfg: Callable[[str], Config], input: Tensor) -> Any:
    return _relu(cfg, input, inplace=True)


def _leaky_relu(cfg: Callable[[str], Config], input: Tensor, negative_slope: float = 0.01,
                inplace: bool = False) -> Any:
    if not _float(input):
        return NotImplemented
    record = gather_record(input)
    return _derived(
        ops.leaky_relu(input, negative_slope, inplace=inplace, config=cfg("activations")),
        record, functools.partial(F.leaky_relu, negative_slope=negative_slope))


def _leaky_relu_(cfg: Callable[[str], Config], input: Tensor,
                 negative_slope: float = 0.01) -> Any:
    return _leaky_relu(cfg, input, negative_slope, inplace=True)


def _elu(cfg: Callable[[str], Config], input: Tensor, alpha: float = 1.0,
         inplace: bool = False) -> Any:
    if not _float(input):
        return NotImplemented
    # (Not marked as a function of gathered rows: its values are not F.elu's, bit for bit.)
    return ops.elu(input, alpha, inplace=inplace, config=cfg("elu"))


def _elu_(cfg: Callable[[str], Config], input: Tensor, alpha: float = 1.0) -> Any:
    return _elu(cfg, input, alpha, inplace=True)


def _dropout(cfg: Callable[[str], Config], input: Tensor, p: float = 0.5, training: bool = True,
             inplace: bool = False) -> Any:
    if not _float(input) or isinstance(p, Tensor):
        return NotImplemented
    return ops.dropout(input, p, training, inplace=inplace, config=cfg("activations"))


def _torch_dropout(cfg: Callable[[str], Config], input: Tensor, p: float, train: bool) -> Any:
    return _dropout(cfg, input, p, train)


def _linear(cfg: Callable[[str], Config], input: Tensor, weight: Tensor,
            bias: Tensor | None = None) -> Any:
    if not (_float(input) and _float(weight) and weight.dim() == 2 and input.dim() >= 1
            and (bias is None or _float(bias))):
        return NotImplemented
    return ops.linear(input, weight, bias, cfg("activations"))


def _index_select(cfg: Callable[[str], Config], input: Tensor, dim: int, index: Tensor,
                  out: Tensor | None = None) -> Any:
    if out is not None or not _float(input) or torch.compiler.is_compiling():
        return NotImplemented
    out = torch.index_select(input, dim, index)
    mark_gathered(out, input, dim, index)
    return out


def _getitem(cfg: Callable[[str], Config], input: Tensor, index: Any) -> Any:
    # Only x[index] with a 1-D integer tensor: the same rows as x.index_select(0, index).
    if (type(index) is not Tensor or index.dtype not in (torch.int64, torch.int32)
            or index.dim() != 1 or not _float(input) or torch.compiler.is_compiling()):
        return NotImplemented
    out = Tensor.__getitem__(input, index)
    mark_gathered(out, input, 0, index)
    return out


def _with_scalar(op: Callable[[Tensor, Any], Tensor]) -> Callable[..., Any]:
    """The handler of an arithmetic operator: applied to gathered rows and a number
    (GENConv's ``msg.relu() + self.eps``), its result is marked as the rows' source with the
    number applied; any other call is PyTorch's."""

    def handler(cfg: Callable[[str], Config], input: Tensor, other: Any = None, *rest: Any,
                **kwargs: Any) -> Any:
        record = (gather_record(input) if type(other) in (int, float) and not rest
                  and not kwargs else None)
        if record is None:
            return NotImplemented
        return _derived(op(input, other), record, functools.partial(_apply, op, other))

    return handler


def _apply(op: Callable[[Tensor, Any], Tensor], other: Any, src: Tensor) -> Tensor:
    return op(src, other)


#: The arithmetic whose results of gathered rows and a number are marked so (``x + 1.0``
#: and ``1.0 + x`` reach a torch function mode as ``Tensor.add(x, 1.0)``).
_SCALAR_OPS = {op: _with_scalar(op) for op in (Tensor.add, Tensor.sub, Tensor.mul, Tensor.div)}


def _batch_norm(cfg: Callable[[str], Config], input: Tensor, running_mean: Tensor | None,
                running_var: Tensor | None, weight: Tensor | None = None,
                bias: Tensor | None = None, training: bool = False, momentum: float = 0.1,
                eps: float = 1e-5) -> Any:
    if not _float(input) or input.dim() < 2 or not training or momentum is None:
        return NotImplemented  # (evaluation is an affine map: PyTorch's op keeps only gamma)
    return ops.batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps,
                          cfg("activations"))


#: torch function -> handler(config_for, *args, **kwargs); a handler returns NotImplemented
#: for arguments it does not take, and PyTorch's function runs.
HANDLERS: dict[Callable, Callable] = {
    F.relu: _relu, torch.relu: _relu, Tensor.relu: _relu,
    F.relu_: _relu_, torch.relu_: _relu_, Tensor.relu_: _relu_,
    F.leaky_relu: _leaky_relu, F.leaky_relu_: _leaky_relu_,
    F.elu: _elu, F.elu_: _elu_,
    F.dropout: _dropout, torch.dropout: _torch_dropout,
    F.linear: _linear,
    F.batch_norm: _batch_norm,
    torch.index_select: _index_select, Tensor.index_select: _index_select,
    Tensor.__getitem__: _getitem,
    **_SCALAR_OPS,
}


#: Calls routed only for inputs of at least ``min_bytes`` (:class:`FunctionalOps`): the ones
#: that compress. (Gathers are marked whatever their source's size: the rows they gather to
#: edges may be many times more.)
FLOORED = frozenset(func for func, handler in HANDLERS.items()
                    if handler not in (_index_select, _getitem, *_SCALAR_OPS.values()))


#: Calls whose handler can write over the input (``inplace=True``), with the ways a caller
#: passes a temporary to each (``take()`` returns it, the call's only reference) and a named
#: tensor (``t``, a local): :func:`temporary_counts` measures both.
_IN_PLACE: dict[Callable, tuple[tuple[Callable, ...], tuple[Callable, ...]]] = {
    F.relu: ((lambda take: F.relu(take()),), (lambda t: F.relu(t),)),
    torch.relu: ((lambda take: torch.relu(take()),), (lambda t: torch.relu(t),)),
    Tensor.relu: ((lambda take: take().relu(), lambda take: Tensor.relu(take())),
                  (lambda t: t.relu(), lambda t: Tensor.relu(t))),
    F.leaky_relu: ((lambda take: F.leaky_relu(take(), 0.2),), (lambda t: F.leaky_relu(t, 0.2),)),
    F.elu: ((lambda take: F.elu(take()),), (lambda t: F.elu(t),)),
    F.dropout: ((lambda take: F.dropout(take(), 0.5, True),
                 lambda take: F.dropout(take(), p=0.5, training=True)),
                (lambda t: F.dropout(t, 0.5, True),)),
}


def _counts(t: Tensor) -> tuple[int, int]:
    """``(references to t, references to its storage)``, read first thing in
    :meth:`FunctionalOps.__torch_function__` (a view, a ``detach()``-ed alias or an output its
    op saved for backward holds the storage; a name, a container or a pack hook holds ``t``)."""
    return sys.getrefcount(t), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


class _Probe:
    """The tensor :func:`temporary_counts` passes, and the counts the mode saw for it."""

    def __init__(self) -> None:
        self.tensor: Tensor | None = None
        self.id = 0
        self.seen: list[tuple[int, int]] = []

    def arm(self) -> None:
        self.tensor = torch.zeros(8)
        self.id = id(self.tensor)

    def take(self) -> Tensor:
        """The armed tensor, handed over: the caller's reference is then its only one."""
        t, self.tensor = self.tensor, None
        assert t is not None
        return t


@functools.cache
def temporary_counts() -> dict[Callable, tuple[int, int]]:
    """For each call that can write over its input: the most references, and the storage
    references, that :class:`FunctionalOps` sees for an input the caller passed as a
    temporary. Measured once per interpreter, by passing a tensor both ways through the same
    path (every form of the call): a call is listed only if every named input is seen with
    more references than any temporary. Empty where that cannot be told apart (an
    interpreter that lends references from the stack: CPython 3.14's borrowed loads, or not
    CPython), and then nothing is written over."""
    if (sys.implementation.name != "cpython" or sys.version_info >= (3, 14)
            or not hasattr(torch._C, "_storage_Use_Count")):
        return {}
    probe = _Probe()
    mode = FunctionalOps(lambda role: Config(), Marks())
    mode.probe = probe
    found = {}
    with mode:
        for func, (temporaries, named) in _IN_PLACE.items():
            seen_temporary, seen_named = [], []
            for form in temporaries:
                probe.arm()
                form(probe.take)
                seen_temporary += probe.seen
                probe.seen = []
            for form in named:
                probe.arm()
                form(probe.take())
                seen_named += probe.seen
                probe.seen = []
            refs = {r for r, _ in seen_temporary}
            storages = {u for _, u in seen_temporary}
            if (len(seen_temporary) == len(temporaries) and len(seen_named) == len(named)
                    and len(storages) == 1 and max(refs) < min(r for r, _ in seen_named)):
                found[func] = (max(refs), storages.pop())
    return found


_MARKS: dict[Callable, str] = {**dict.fromkeys(EXACT_FUNCTIONS, "exact"),
                               **dict.fromkeys(FINE_FUNCTIONS, "fine"),
                               **dict.fromkeys(GATE_FUNCTIONS, "gate")}

#: What the mode does anything with inside a compiled frame; every other call is traced as
#: is (gathers too: their handlers take none there).
_ROUTED = (frozenset(HANDLERS) | frozenset(_MARKS)) - {torch.index_select, Tensor.index_select,
                                                       Tensor.__getitem__, *_SCALAR_OPS}

#: Routed calls that run as one ``gnnact::call`` inside a compiled frame (no graph break), by
#: the name the operator calls them by: those whose output has their input's shape, and
#: ``F.linear``. (The losses run eagerly behind a break; so do in-place calls.)
CAPTURED: dict[Callable, str] = {
    F.relu: "F.relu", torch.relu: "torch.relu", Tensor.relu: "Tensor.relu",
    F.leaky_relu: "F.leaky_relu", F.elu: "F.elu", F.dropout: "F.dropout",
    torch.dropout: "torch.dropout", F.linear: "F.linear", F.batch_norm: "F.batch_norm",
    F.softmax: "F.softmax", F.log_softmax: "F.log_softmax", torch.softmax: "torch.softmax",
    torch.log_softmax: "torch.log_softmax", Tensor.softmax: "Tensor.softmax",
    Tensor.log_softmax: "Tensor.log_softmax", torch.tanh: "torch.tanh", F.tanh: "F.tanh",
    Tensor.tanh: "Tensor.tanh", torch.sigmoid: "torch.sigmoid", F.sigmoid: "F.sigmoid",
    Tensor.sigmoid: "Tensor.sigmoid"}
library.FUNCTIONS.update({name: func for func, name in CAPTURED.items()})

# Where an in-place flag sits among the positional arguments.
_INPLACE_AT = {F.relu: 1, F.leaky_relu: 2, F.elu: 2, F.dropout: 3}


def _captured(island: library.Island, func: Callable, args: tuple, kwargs: dict) -> Any:
    """``func(*args, **kwargs)`` as ``gnnact::call``, or ``NotImplemented``."""
    at = _INPLACE_AT.get(func)
    if kwargs.get("inplace") or (at is not None and len(args) > at and args[at]):
        return NotImplemented  # (an operator's output may not be its input)
    x = args[0] if args else None
    if not isinstance(x, Tensor):
        return NotImplemented
    shape = list(x.shape)
    if func is F.linear:
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        if not isinstance(weight, Tensor) or weight.dim() != 2:
            return NotImplemented
        shape[-1] = weight.size(0)
    return library.call_function(island, CAPTURED[func], args, kwargs, shape)


class FunctionalOps(PassMode):
    """Routes the functional calls of :data:`HANDLERS` to gnnact's ops (see the module
    docstring) and marks the calls of :data:`EXACT_FUNCTIONS` and :data:`FINE_FUNCTIONS`.

    Args:
        config_for (callable): ``config_for(role) -> Config``: the configuration of a tensor
            with role ``role`` of the module running now (its tag is that module's path).
        marks (Marks): raised while an exact or a fine function runs.
        min_bytes (int, optional): a call of :data:`FLOORED` whose input has fewer bytes
            runs as PyTorch's (its context kept as is: :attr:`gnnact.Config.floor`).
            (default: :obj:`0`)
        island (Island, optional): where the calls of :data:`CAPTURED` inside a compiled
            frame keep their records (:mod:`gnnact.ops.library`); without one they break the
            graph. (default: :obj:`None`)
    """

    def __init__(self, config_for: Callable[[str], Config], marks: Marks,
                 min_bytes: int = 0, island: library.Island | None = None) -> None:
        super().__init__()
        self.config_for = config_for
        self.marks = marks
        self.min_bytes = min_bytes
        self.island = island
        self.probe: _Probe | None = None  # set by temporary_counts only

    # Inside a compiled frame Dynamo inlines this for every torch call it traces: the calls
    # gnnact neither routes nor marks are traced as they are (the compiled graph's own saved
    # tensors go through the pass's pipeline at run time); those of CAPTURED become one
    # gnnact::call each, which routes them eagerly at run time (gnnact.ops.library); the rest
    # run eagerly, routed as in eager mode, behind a graph break. Never compiled as a frame of
    # its own: called from eager code, it routes.
    @inlined_only
    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        if torch.compiler.is_compiling():
            if func not in _ROUTED:
                return func(*args, **(kwargs or {}))
            if func in CAPTURED and self.island is not None:
                out = _captured(self.island, func, args, kwargs or {})
                if out is not NotImplemented:
                    return out
        return self._route(func, types, args, kwargs)

    # Under torch.compile, Dynamo compiled this dispatcher for the functions it routed,
    # recompiled it for each new one, and a converted GCN compiled on CiteSeer after one on
    # Cora in the same process then failed in ``x.dim()`` (RuntimeError: Boolean value of
    # Tensor with more than one value; bench_speed.py, the Physics and arxiv-shape cases after
    # Computers alike). It routes calls: nothing to compile. A mark on the code (Dynamo's
    # ``skip``), not torch.compiler.disable's wrapper, which costs ~5 µs on each of the ~700
    # calls of a GIN step, eager or not.
    @not_compiled
    def _route(self, func: Callable, types: Any, args: tuple = (),
               kwargs: dict | None = None) -> Any:
        # Counted before anything here refers to the input (temporary_counts counts here too).
        counts = (_counts(args[0]) if func in _IN_PLACE and args and type(args[0]) is Tensor
                  else None)
        if counts is not None and self.probe is not None and id(args[0]) == self.probe.id:
            self.probe.seen.append(counts)
            return args[0]
        kwargs = kwargs or {}
        handler = HANDLERS.get(func)
        if handler is not None and func in FLOORED:
            x = args[0] if args else kwargs.get("input")
            if type(x) is Tensor and x.numel() * x.element_size() < self.min_bytes:
                handler = None  # (checked here: the handler's own checks cost more)
        if handler is not None and torch.is_grad_enabled():
            given = kwargs
            if counts is not None and not kwargs.get("inplace") and _temporary(func, args[0],
                                                                                  counts):
                given = {**kwargs, "inplace": True}
            out = handler(self.config_for, *args, **given)
            if out is not NotImplemented:
                return out
        mark = _MARKS.get(func)
        if mark is None:
            return func(*args, **kwargs)
        setattr(self.marks, mark, getattr(self.marks, mark) + 1)
        try:
            return func(*args, **kwargs)
        finally:
            setattr(self.marks, mark, getattr(self.marks, mark) - 1)


class CollectingOps(FunctionalOps):
    """:class:`FunctionalOps` that also hands every call's result to ``collect`` (a probe
    pass's :meth:`NoiseProbe.collect <gnnact.ops.probe.NoiseProbe.collect>`: backward finds
    the nodes to run again from these). A class of its own, so that other passes pay
    nothing for it."""

    def __init__(self, config_for: Callable[[str], Config], marks: Marks,
                 collect: Callable[[Any], None], min_bytes: int = 0,
                 island: library.Island | None = None) -> None:
        super().__init__(config_for, marks, min_bytes, island)
        self.collect = collect

    @not_compiled  # (as FunctionalOps._route)
    def _route(self, func: Callable, types: Any, args: tuple = (),
               kwargs: dict | None = None) -> Any:
        out = super()._route(func, types, args, kwargs)
        self.collect(out)
        return out


def _temporary(func: Callable, x: Tensor, counts: tuple[int, int]) -> bool:
    """Whether ``x``, the input of ``func`` seen with ``counts``, is a temporary that the call
    may write over: referred to no more than a temporary is (:func:`temporary_counts`), its
    storage its own, and an in-place op allowed on it (an autograd result, not a leaf,
    contiguous, not a view)."""
    known = temporary_counts().get(func)
    return (known is not None and counts[0] <= known[0] and counts[1] == known[1]
            and x.grad_fn is not None and overwritable(x) and not torch.compiler.is_compiling())
