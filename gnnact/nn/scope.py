r"""The scope of a converted model: what gnnact does around each of its training forward passes.

:func:`gnnact.convert` swaps the modules it has twins for, and installs a :class:`Scope` on the
model it was given (the *root*). Each forward pass of the root that autograd records (grad mode
on) then runs as one gnnact forward pass:

* a fresh :class:`~gnnact.ops.state.ForwardState`: the registries gnnact's ops share (packed
  copies, derived tensors) belong to this pass alone and are gone when it ends, finished or
  failed; another thread's pass never sees them;
* the pass's rounding seeds, from the model's :class:`~gnnact.quant.rng.PassSeeds`: nothing
  is drawn from PyTorch's generators for them, so under one ``torch.manual_seed`` the
  compressed model draws the dropout masks the original draws;
* the root's graph cache (:class:`~gnnact.ops.graph.GraphCache`): every layer of the model
  builds and keeps one graph per adjacency, for as long as the model and the adjacency live;
* :class:`~gnnact.nn.functional.FunctionalOps`: ``F.relu``, ``x.relu()``, ``F.dropout``,
  ``F.elu``, ``F.linear``, … get what their module twins get (1-bit masks, inputs rebuilt from
  BatchNorm/ReLU/dropout context);
* a :class:`gnnact.compress_saved_tensors` pipeline for everything else autograd saves
  (convs without a twin, PyG's own paths, any other op): compressed at ``config.bits``, while
  parameters, the forward's inputs, gnnact's own context and the loss head (softmax,
  log-softmax, a sigmoid outside message passing, loss functions) pass through, and tanh
  outputs and the sigmoid gates of message passing keep ``config.attention`` bits
  (:data:`~gnnact.nn.functional.EXACT_FUNCTIONS`, :data:`~gnnact.nn.functional.FINE_FUNCTIONS`,
  :data:`~gnnact.nn.functional.GATE_FUNCTIONS`). A pipeline the caller entered around the
  model (offloading, say) stays in charge instead.

* the widths: with the default ``Config()`` (``bits=None``) the scope's
  :class:`~gnnact.adaptive.auto.AutoPrecision` gives each tensor its own, from noise ratios
  measured at probe passes (:mod:`gnnact.ops.probe`); with a fixed ``bits`` it only checks
  them.

A pass whose every tensor stays under the floor (``config.min_bytes``), or (on a GPU, or
with ``config.min_pass_savings``) whose compression saves less than the pass's least savings
(:meth:`Config.min_savings <gnnact.Config.min_savings>`), as a full pass on inputs at least as
large found (:meth:`Scope.small_pass`), runs as PyTorch's: its own state
and the graph cache, no mode and no pipeline (on a small graph they cost as much as the
arithmetic), its layers run as the classes they twin (PyG's or PyTorch's ``forward``; the
convs keep their own in eager mode, which builds their graph once), everything it saves kept
as it is and counted (``PassRecord.as_pytorch``).

Under :func:`torch.compile` the model's own call enters and leaves the pass eagerly; inside the
compiled forward, the children's hooks and the pipeline's module tracking trace to nothing, and
the compressed layers and routed functional calls are custom operators that make their calls
eagerly, inside this pass, at run time (:mod:`gnnact.ops.library`): one graph, no break. A
pass run as PyTorch's is traced as PyTorch's (its layers as the classes they twin): no
operator, and inductor compiles it whole, as it compiles the original model.

A call of one of the model's children made outside the model's own call (a model used through
its methods: GAE's ``encode`` and ``recon_loss``) is a pass too. Evaluation
(``torch.no_grad``) runs the plain forward: nothing is kept, so nothing is done. What the last
training step's passes kept, by module, is what :func:`gnnact.summary` reports (the passes a
step makes before backward reaches them counted together: :meth:`Scope.note_record`).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import math
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.fx import GraphModule
from torch_geometric.nn.conv import MessagePassing

from gnnact.adaptive.auto import AutoPrecision
from gnnact.compress import Policy, Quantize, Rule
from gnnact.config import MIN_BYTES, Config
from gnnact.hooks import SavedEntry, _is_parameter, active_pipeline, compress_saved_tensors
from gnnact.memory import argument_tensors, storage_key, storage_keys
from gnnact.nn._base import _Compressed
from gnnact.nn.functional import CollectingOps, FunctionalOps, Marks
from gnnact.ops.graph import GraphCache, use_graph_cache
from gnnact.ops.library import Island
from gnnact.ops.probe import NoiseProbe, probing
from gnnact.ops.state import forward_pass, inlined_only, not_compiled
from gnnact.quant.rng import PassSeeds

__all__ = ["PassRecord", "Scope", "scope_of"]

_CPU = torch.device("cpu")

#: The attribute of the root module that holds its scope.
ATTRIBUTE = "_gnnact_scope"

_PASS: ContextVar[_Pass | None] = ContextVar("gnnact_scope_pass", default=None)


@dataclass
class PassRecord:
    """What one forward pass of a converted model kept for backward, or the passes of one
    training step together (:meth:`then`).

    Args:
        bytes_by_module (dict[str, int]): module path -> bytes of the context saved while it
            was the innermost running module (each storage counted once, for the first module
            that saved it; parameters and the forward's inputs not counted).
        tensors (dict[str, SavedEntry]): the generic pipeline's tensors, by name.
        graph_cache (int): bytes of the model's graph cache after the pass.
        small (tuple[int, int]): tensors the generic pipeline kept as they are for their size
            (under :attr:`floor`), and their bytes (part of the context).
        as_pytorch (bool): the pass ran as PyTorch's (:meth:`Scope.small_pass`): every tensor
            kept as it is, counted in ``small`` and under ``""`` in ``bytes_by_module`` (no
            module tracking).
        floor (int): the pass's floor, the config's on the device of its inputs
            (:meth:`Config.floor_for <gnnact.Config.floor_for>`).
        min_savings (int): the least its compression must save there
            (:meth:`Config.min_savings <gnnact.Config.min_savings>`; 0: no such rule).
        passes (int): the forward passes counted (several in a step of a model used through
            its children, GAE's ``encode`` and then ``recon_loss``'s decoder call, or of a model
            called twice before backward).
        pytorch_paths (tuple[str, ...]): the modules whose passes ran as PyTorch's (their
            bytes counted under their path).
    """

    bytes_by_module: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, SavedEntry] = field(default_factory=dict)
    graph_cache: int = 0
    small: tuple[int, int] = (0, 0)
    as_pytorch: bool = False
    floor: int = MIN_BYTES
    min_savings: int = 0
    passes: int = 1
    pytorch_paths: tuple[str, ...] = ()

    @property
    def context(self) -> int:
        """Bytes of the context, all modules together (the graph cache not included)."""
        return sum(self.bytes_by_module.values())

    def then(self, later: PassRecord) -> PassRecord:
        """This record and ``later``'s, a pass of the same step: bytes summed by module,
        ``later``'s tensors over this one's of the same name, its graph cache, floor and least
        savings; run as PyTorch's if both were."""
        nbytes = dict(self.bytes_by_module)
        for path, n in later.bytes_by_module.items():
            nbytes[path] = nbytes.get(path, 0) + n
        return PassRecord(nbytes, {**self.tensors, **later.tensors}, later.graph_cache,
                          (self.small[0] + later.small[0], self.small[1] + later.small[1]),
                          self.as_pytorch and later.as_pytorch, later.floor, later.min_savings,
                          self.passes + later.passes,
                          tuple(dict.fromkeys((*self.pytorch_paths, *later.pytorch_paths))))


class _Step:
    """The forward passes of one training step so far (:attr:`record`, merged): open until
    backward reaches the output of one of them, or the graphs of all their outputs are gone
    (a forward never run backward, a grad-mode evaluation), or none has one."""

    __slots__ = ("_live", "open", "record")

    def __init__(self, record: PassRecord) -> None:
        self.record = record
        self.open = True
        self._live = 0  # outputs' graphs watched and not yet gone

    def watch(self, output: Any) -> None:
        """End the step when backward reaches ``output`` (its tensors that have a graph), or
        when all its watched graphs are gone."""
        for t in argument_tensors(output):
            if t.grad_fn is not None:
                reached = _Reached(self)
                t.grad_fn.register_prehook(reached)
                self._live += 1
                weakref.finalize(reached, self._gone)
        if not self._live:  # no graph to run backward through
            self.open = False

    def end(self) -> None:
        self.open = False

    def _gone(self) -> None:
        self._live -= 1
        if self._live <= 0:
            self.open = False


class _Reached:
    """A pass output's node's pre-hook: backward has reached it, the step is over (held by
    the node alone: it goes with the graph)."""

    __slots__ = ("__weakref__", "step")

    def __init__(self, step: _Step) -> None:
        self.step = step

    def __call__(self, grad_outputs: Any) -> None:
        self.step.end()


class _Pass:
    """One forward pass of a converted model (see the module docstring)."""

    def __init__(self, scope: Scope, root: nn.Module, module: nn.Module, args: tuple,
                 kwargs: dict) -> None:
        self.scope = scope
        self.root = root  # the converted model
        self.module = module  # the module whose call is the pass: the root or a child
        self.depth = 1  # calls of ``module`` running (it may call itself)
        self.marks = Marks()  # raised while a loss head (exact) or a tanh (fine) runs
        self.inputs = argument_tensors((args, kwargs))
        # The floor of its tensors, and the least its compression must save (on a GPU), on
        # the device of its inputs.
        device = self.inputs[0].device if self.inputs else _CPU
        self.floor = scope.config.floor_for(device)
        self.savings = scope.config.min_savings(device)
        self.pipeline: compress_saved_tensors | None = None
        self.enclosing: compress_saved_tensors | None = None  # the caller's pipeline, if any
        self.watch: _Watch | None = None  # a pass run as PyTorch's
        self.mode: FunctionalOps | None = None  # routes the functional calls
        self.probe: NoiseProbe | None = None
        self._stack = contextlib.ExitStack()
        self._token: Any = None

    def enter(self) -> None:
        scope, stack = self.scope, self._stack
        try:
            if scope.small_pass(self.module, self.inputs):
                self._enter_as_pytorch()
                self._token = _PASS.set(self)
                return
            self.probe = scope.begin_step()
            stack.enter_context(probing(self.probe))
            state = stack.enter_context(forward_pass(scope.row_gradients, seeds=scope.seeds))
            # Only the forward's inputs are resident: any other tensor that needs no gradient
            # (an aggregate of the input features, say) is a temporary. (Restored at the end:
            # the pass may be a pipeline's around the model.)
            stack.callback(setattr, state, "resident", state.resident)
            state.resident = storage_keys(self.inputs)
            if scope.auto is not None and scope.auto.adapt:  # one width per tensor, by name
                stack.callback(setattr, state, "widths", state.widths)
                state.widths = scope.bits
            stack.enter_context(use_graph_cache(scope.graphs))
            pipeline = self.enclosing = active_pipeline()
            if pipeline is None:
                pipeline = scope.pipeline(self.root, self.inputs, self.marks)
                pipeline.count_pytorch = self.savings > 0
                stack.enter_context(pipeline)
                # Its module tracking starts inside the module's call (this hook), after the
                # module's own entry: it is the running module until it returns.
                pipeline._stack.append(self.module)
            self.pipeline = pipeline
            self.mode = stack.enter_context(
                FunctionalOps(self.config_for, self.marks, self.floor, scope.island)
                if self.probe is None
                else CollectingOps(self.config_for, self.marks, self.probe.collect, self.floor,
                                   scope.island))
        except BaseException:
            stack.close()
            raise
        self._token = _PASS.set(self)

    def _enter_as_pytorch(self) -> None:
        """A pass whose every tensor stays under the floor (:meth:`Scope.small_pass`): no
        mode and no pipeline, only the pass's state, the graph cache and a watch on what is
        saved (:class:`_Watch`)."""
        stack, scope = self._stack, self.scope
        state = stack.enter_context(forward_pass(scope.row_gradients, seeds=scope.seeds))
        stack.callback(setattr, state, "resident", state.resident)
        state.resident = storage_keys(self.inputs)
        stack.enter_context(use_graph_cache(scope.graphs))
        # Under a least savings its context may grow by as much over the first such pass's
        # (after a full one: any, that pass's judgement; what PyTorch keeps, more than gnnact's
        # ops stand for, is only measured here).
        limit = None
        if self.savings:
            first = scope.small_context.get(self.module)
            limit = math.inf if first is None else first + self.savings
        self.watch = _Watch(self.floor, limit, state.resident, scope.buffer_owners(self.root))
        stack.enter_context(self.watch)
        # Its layers run as the classes they twin (traced so under torch.compile; eagerly the
        # convs keep their own forward), but one with a forward hook of its own, which the
        # twinned forward would skip. (Flags on the modules: a second thread running the same
        # model at once would see them.)
        layers = [m for m in scope.twin_layers(self.module) if not _own_hooks(m)]
        for layer in layers:
            layer.__dict__[_AS_PYTORCH] = True
        stack.callback(_clear_as_pytorch, layers)

    def exit(self, output: Any = None) -> None:
        _PASS.reset(self._token)
        try:
            self._stack.close()
            if self.probe is not None:  # backward re-runs the nodes that read its tensors
                self.probe.collect(output)
                self.probe.arm()
        finally:
            pipeline, watch = self.pipeline, self.watch
            if watch is not None:
                count, nbytes, over = watch.finish()
                if over:  # sizes the full passes did not bound: full passes again
                    self.scope.small_inputs.pop(self.module, None)
                    self.scope.small_context.pop(self.module, None)
                elif self.savings:
                    self.scope.small_context.setdefault(self.module, nbytes)
                path = self.scope.path_of(self.root, self.module)
                self.scope.note_record(
                    PassRecord({path: nbytes}, {}, self.scope.graphs.nbytes(), (count, nbytes),
                               as_pytorch=True, floor=self.floor, min_savings=self.savings,
                               pytorch_paths=(path,)), output)
            elif pipeline is not None:
                # (A caller's pipeline counts every pass it wraps: its record is the total.)
                self.scope.note_record(
                    PassRecord(dict(pipeline.bytes_by_module), dict(pipeline.tensors),
                               self.scope.graphs.nbytes(),
                               (pipeline.num_small, pipeline.small_bytes), floor=self.floor,
                               min_savings=self.savings),
                    output, merge=pipeline is not self.enclosing)
                if pipeline is not self.enclosing:
                    # Small: every tensor under the floor as PyTorch keeps it, or compression
                    # saving less than the least savings.
                    small = (self.floor > 0 and not pipeline.over_floor
                             and pipeline.num_packed + pipeline.num_compact == 0)
                    if self.savings:
                        small |= (pipeline.pytorch_bytes - pipeline.saved_bytes
                                  < self.savings)
                    self.scope.note_pass(self.module, self.inputs, small)

    def config_for(self, role: str) -> Config:
        """The configuration of a functional op's tensor ``role`` in the module running now."""
        assert self.pipeline is not None
        path = self.pipeline._where()[0]
        return self.scope.config_for(path, role)


def _route_in_pass(func: Any, *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` as the running pass's mode routes it (a functional call of a
    compiled frame, run by ``gnnact::call``, sees no mode on the stack)."""
    active = _PASS.get()
    if active is None or active.mode is None:
        return func(*args, **kwargs)
    return active.mode._route(func, (), args, kwargs)


def _same(t: Any) -> Any:
    return t


class _Watch(torch.autograd.graph.saved_tensors_hooks):
    """What a pass run as PyTorch's saves: kept as it is, whatever its size; counted (each
    storage once; parameters, the inputs' storages ``skip`` and the buffers of the modules
    ``owners`` left out, as a full pass leaves them) by :meth:`finish`, which also says
    whether one of them has ``floor`` bytes or more (with a ``limit``: and they have more than
    ``limit`` bytes together; either keeps a pass small), or one is no plain strided tensor."""

    def __init__(self, floor: int, limit: float | None, skip: set[tuple],
                 owners: list[nn.Module]) -> None:
        super().__init__(self._pack, _same)
        self.floor, self.limit, self.skip, self.owners = floor, limit, skip, owners
        self._saved: list[Tensor] = []

    # Autograd calls it for each tensor it saves, a hundred a small graph's step, eagerly
    # (never compiled by Dynamo: it may run inside a compiled call): it only notes the tensor
    # (autograd holds it until backward anyway), and finish() sorts them out in one loop.
    @not_compiled
    def _pack(self, t: Tensor) -> Tensor:
        self._saved.append(t)
        return t

    def finish(self) -> tuple[int, int, bool]:
        """``(count, bytes, over)`` of what the pass saved."""
        saved, self._saved = self._saved, []
        odd = False
        seen: dict[tuple, tuple[int, bool]] = {}  # storage -> (bytes, a leaf needing no grad)
        for t in saved:
            if type(t) is not Tensor or t.layout != torch.strided:
                odd |= not isinstance(t, nn.Parameter)
                continue
            if _is_parameter(t):
                continue
            storage = t.untyped_storage()
            key = storage_key(storage)
            if key not in seen and key not in self.skip:
                seen[key] = (storage.nbytes(), t.grad_fn is None and not t.requires_grad)
        if any(leaf for _, leaf in seen.values()):  # (the buffers as they are now)
            buffers = {storage_key(b.untyped_storage())
                       for m in self.owners for b in m._buffers.values() if b is not None}
            seen = {key: entry for key, entry in seen.items()
                    if not (entry[1] and key in buffers)}
        sizes = [nbytes for nbytes, _ in seen.values()]
        total = sum(sizes)
        over = (any(n >= self.floor for n in sizes)
                and (self.limit is None or total > self.limit))
        return len(sizes), total, odd or over


class Scope:
    r"""gnnact's part in each training forward pass of a converted model (see the module
    docstring). Installed by :func:`gnnact.convert` on the model it converts
    (:meth:`install`); it lives as long as that model.

    Args:
        config (Config): the storage of the context of functional ops and of the generic
            pipeline (the twins keep their own ``config``).

    Attributes:
        bits (dict[str, int]): widths of single tensors by name (``"<module path>:<role>"``
            for functional ops and twins, ``"<module path>:<index>"`` for the generic
            pipeline), set by :attr:`auto` or by :class:`gnnact.Controller`.
        auto (AutoPrecision or None): the automatic widths (or, with a fixed ``bits``, their
            check); ``None`` for ``bits=32``, ``self_check=False`` or under a
            :class:`gnnact.Controller`.
        graphs (GraphCache): the model's graph cache.
        seeds (PassSeeds): the source of each pass's rounding seeds.
        island (Island): the records of the routed functional calls that compiled frames make
            as custom operators (:mod:`gnnact.ops.library`).
        last (PassRecord or None): what the last training step's forward passes kept (one
            pass, or several merged: :meth:`note_record`).
        small_inputs (WeakKeyDictionary): for the module whose call makes a pass (the model,
            or a child called on its own), the largest element count of each input of its
            full passes that kept every tensor under the floor; its passes on inputs no larger
            run as PyTorch's (:meth:`small_pass`).
        small_context (WeakKeyDictionary): for such a module, under a least savings
            (:meth:`Config.min_savings <gnnact.Config.min_savings>`), the context of its first
            pass run as PyTorch's since its last full one: a later one's may exceed it by
            less than the savings.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.auto: AutoPrecision | None = None
        self.bits: dict[str, int] = {}
        self.graphs = GraphCache()
        self.row_gradients: dict[tuple, Tensor] = {}
        self.seeds = PassSeeds()
        # The records of functional calls inside compiled frames, routed as in eager mode.
        self.island = Island(route=_route_in_pass)
        self.last: PassRecord | None = None
        self._step: _Step | None = None
        self._paths: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()
        self.small_inputs: weakref.WeakKeyDictionary[nn.Module, tuple[int, ...]] = (
            weakref.WeakKeyDictionary())
        self.small_context: weakref.WeakKeyDictionary[nn.Module, int] = (
            weakref.WeakKeyDictionary())
        self._buffer_owners: weakref.WeakKeyDictionary[nn.Module, list[nn.Module]] = (
            weakref.WeakKeyDictionary())
        self._twin_layers: weakref.WeakKeyDictionary[nn.Module, list[nn.Module]] = (
            weakref.WeakKeyDictionary())
        self._configs: dict[tuple[str, str, int], Config] = {}

    # ------------------------------------------------------------------ installation

    @classmethod
    def install(cls, model: nn.Module, config: Config) -> Scope:
        """Give ``model`` a scope with ``config`` (or ``config`` to the one it has)."""
        scope = scope_of(model)
        if scope is not None:
            scope.config = config
            scope.small_inputs.clear()
            scope.small_context.clear()
            scope._buffer_owners.clear()
            scope._twin_layers.clear()
            scope._paths.clear()
            scope._configs.clear()
            scope.bits.clear()
            scope._automate(model)
            return scope
        scope = cls(config)
        scope._automate(model)
        scope._attach(model)
        return scope

    def _attach(self, model: nn.Module) -> None:
        """Make this the scope of ``model``: its attribute and its hooks."""
        # A plain attribute (not a submodule, parameter or buffer): no state_dict entry.
        object.__setattr__(model, ATTRIBUTE, self)
        # The model's own call is a pass, and so is a call of one of its children made
        # outside it: a model used through its methods (GAE's encode, recon_loss) never calls
        # its own forward. (Not for a GraphModule, called through its forward: fx pickles it
        # by its own rules, which a child's reference to it would send round in circles.)
        children = () if isinstance(model, GraphModule) else model.children()
        for module, root in ((model, None), *((child, model) for child in children)):
            if not any(_is_scope_hook(h) for h in module._forward_pre_hooks.values()):
                module.register_forward_pre_hook(functools.partial(self._pre, root=root),
                                                  with_kwargs=True, prepend=True)
                module.register_forward_hook(functools.partial(self._post, root=root),
                                             with_kwargs=True, always_call=True)
        if isinstance(model, GraphModule):
            _keep_through_copies(model)

    # Module hooks, not a wrapped forward: they see the module they run for (a replica made by
    # DataParallel included) and survive deepcopy and pickling with the model. A pass's state is
    # context variables, hooks and a torch function mode, entered and left eagerly (not eager_op,
    # which takes the pass's mode off the stack while it runs: these push and pop it). Under
    # torch.compile the model's own call enters it eagerly, and the children's calls inside the
    # compiled forward are part of that pass: their hooks trace to nothing, so the forward is
    # one graph (gnnact's ops in it as custom operators, gnnact.ops.library).
    @inlined_only
    def _pre(self, module: nn.Module, args: tuple, kwargs: dict, *,
             root: nn.Module | None = None) -> None:
        if root is not None and torch.compiler.is_compiling():
            return
        self._enter(module, args, kwargs, root)

    @torch.compiler.disable
    def _enter(self, module: nn.Module, args: tuple, kwargs: dict,
               root: nn.Module | None) -> None:
        active = _PASS.get()
        if active is not None:  # inside a pass (of this model, or of an enclosing one)
            if module is active.module:
                active.depth += 1
            return
        if not torch.is_grad_enabled():
            return  # nothing will be kept
        if root is not None and torch._C._current_autograd_node() is not None:
            return  # a child recomputed inside backward (reentrant checkpointing): no step
        _Pass(self, module if root is None else root, module, args, kwargs).enter()

    @inlined_only
    def _post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any, *,
              root: nn.Module | None = None) -> None:
        if root is not None and torch.compiler.is_compiling():
            return
        self._exit(module, output)

    @torch.compiler.disable
    def _exit(self, module: nn.Module, output: Any) -> None:
        active = _PASS.get()
        if active is None or module is not active.module:
            return
        active.depth -= 1
        if active.depth == 0:
            active.exit(output)

    def _automate(self, model: nn.Module) -> None:
        """Give the scope its :class:`~gnnact.adaptive.auto.AutoPrecision`: allocating the
        widths when ``config`` is automatic (``bits=None``), only checking them when they are
        fixed (``config.self_check``); none when nothing is quantized."""
        self.auto = None
        config = self.config
        if config.automatic or (config.self_check and config.width <= 8):
            self.auto = AutoPrecision(self.config)

    # ------------------------------------------------------------------ per pass

    def small_pass(self, module: nn.Module, inputs: list[Tensor]) -> bool:
        """Whether a pass of ``module`` with ``inputs`` runs as PyTorch's: its full passes
        kept every tensor under the floor and stored nothing in another form (or saved less
        than the least savings by compressing) on inputs at
        least as large, element count by element count (:attr:`small_inputs`), and no
        pipeline of the caller's is active. Its tensors then stay under the floor too, as they
        grow with the inputs (node tensors with the node features, edge tensors with the
        edges); a pass that finds one that does not (a dense batch, sized by its largest
        graph) keeps it as it is and sends the next passes back to full ones
        (:class:`_Watch`).

        The mode and the pipeline of a full pass cost a small graph's step as much as its
        arithmetic (a GIN on 64 small graphs: 5 ms of a 10 ms step on a CPU core), for
        nothing when every tensor is kept as it is."""
        ref = self.small_inputs.get(module)
        return (ref is not None and len(inputs) == len(ref) and active_pipeline() is None
                and all(t.numel() <= n for t, n in zip(inputs, ref, strict=True)))

    def twin_layers(self, model: nn.Module) -> list[nn.Module]:
        """The gnnact layers of ``model`` whose class twins one with a ``forward`` (PyG's or
        PyTorch's) to run in passes run as PyTorch's, found once."""
        layers = self._twin_layers.get(model)
        if layers is None:
            layers = self._twin_layers[model] = [
                m for m in model.modules()
                if isinstance(m, _Compressed) and m._twinned_forward is not None]
        return layers

    def note_record(self, record: PassRecord, output: Any, merge: bool = True) -> None:
        """Make ``record`` (a pass that returned ``output``) part of :attr:`last`: merged
        into the step's passes so far while backward has not reached them (a model used
        through its children: GAE's ``encode`` and ``recon_loss``), else (or without
        ``merge``) the first of a new step."""
        step = self._step
        if merge and step is not None and step.open:
            step.record = step.record.then(record)
        else:
            step = self._step = _Step(record)
        step.watch(output)
        self.last = step.record

    def path_of(self, root: nn.Module, module: nn.Module) -> str:
        """The path of ``module`` in ``root`` (``""`` for the root itself), found once."""
        path = self._paths.get(module)
        if path is None:
            path = self._paths[module] = next(
                (name for name, m in root.named_modules() if m is module), "")
        return path

    def buffer_owners(self, model: nn.Module) -> list[nn.Module]:
        """The modules of ``model`` that have buffers, found once (a pass run as PyTorch's
        reads their buffers as they are then, to leave them out of its count)."""
        owners = self._buffer_owners.get(model)
        if owners is None:
            owners = self._buffer_owners[model] = [m for m in model.modules() if m._buffers]
        return owners

    def note_pass(self, module: nn.Module, inputs: list[Tensor], small: bool) -> None:
        """After a full pass of ``module`` with ``inputs``: if it was ``small`` (everything
        under the floor, nothing stored in another form; or compression saving less than the
        least savings), raise :attr:`small_inputs` to its sizes where they are larger (batches
        of small graphs vary in nodes and edges alike), its next pass run as PyTorch's
        measuring :attr:`small_context` anew; if it was not and its sizes are within them,
        forget them."""
        sizes = tuple(t.numel() for t in inputs)
        ref = self.small_inputs.get(module)
        if small:
            self.small_inputs[module] = (sizes if ref is None or len(ref) != len(sizes)
                                         else tuple(map(max, sizes, ref)))
            self.small_context.pop(module, None)
        elif (not small and ref is not None and len(ref) == len(sizes)
              and all(a <= b for a, b in zip(sizes, ref, strict=True))):
            del self.small_inputs[module]
            self.small_context.pop(module, None)

    def begin_step(self) -> NoiseProbe | None:
        """At the start of a training forward pass: with automatic precision, the widths of
        the last probe given to the scope, and this pass's probe if it is one
        (:meth:`AutoPrecision.begin <gnnact.adaptive.auto.AutoPrecision.begin>`)."""
        if self.auto is None:
            return None
        allocations = self.auto.allocations
        probe = self.auto.begin()
        if self.auto.allocations != allocations:
            self.set_widths(self.auto.widths)
        return probe

    def set_widths(self, widths: dict[str, int]) -> None:
        """Give each tensor of ``widths`` (``"<module path>:<role>"``) its width: functional
        ops and the generic pipeline read :attr:`bits` by name, and so do twins in a pass with
        automatic widths (:attr:`ForwardState.widths <gnnact.ops.state.ForwardState>`)."""
        if any(self.bits.get(name) != bits for name, bits in widths.items()):
            self.bits.update(widths)
            self._configs.clear()

    def config_for(self, path: str, role: str) -> Config:
        """The configuration of tensor ``role`` kept by a functional op in module ``path``:
        this scope's, tagged with the path, at the width :attr:`bits` gives it."""
        tag = path or "<model>"
        bits = self.bits.get(f"{tag}:{role}", self.config.width)
        key = (tag, role, bits)
        config = self._configs.get(key)
        if config is None:
            config = self._configs[key] = dataclasses.replace(self.config, tag=tag, bits=bits)
        return config

    def pipeline(self, model: nn.Module, inputs: list[Tensor],
                 marks: Marks) -> compress_saved_tensors:
        """The generic pipeline of one pass: the default policy with the loss head exact and
        tanh outputs at ``config.attention`` bits (:class:`~gnnact.nn.functional.Marks`)."""
        policy = Policy.default_for(self.config, model)
        if policy.default is not None:  # (bits=32 keeps everything exact anyway)
            fine = Quantize(self.config.attention, self.config.group_size,
                            backend=self.config.backend)
            policy.rules[:0] = [
                Rule(fine, where=lambda name, module, t: marks.gate > 0
                     and isinstance(module, MessagePassing)),
                Rule(None, where=lambda name, module, t: marks.exact > 0 or marks.gate > 0),
                Rule(fine, where=lambda name, module, t: marks.fine > 0),
                # Attention coefficients of a conv without a twin (GATv2, Transformer, ...):
                # one value per edge and head, at config.attention bits as in the GAT twin
                # (at 2 bits GATv2 stops training, as GAT does in GACT's Table 3).
                Rule(fine, where=_per_edge_and_head)]
        pipeline = compress_saved_tensors(self.config, policy=policy, model=model,
                                          skip=inputs)
        pipeline.bits = self.bits  # the Controller's widths, shared
        return pipeline

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["last"] = state["_step"] = None  # a record of one step, not part of the model
        # (Of these very modules: not picklable, and a copy has modules of its own.)
        for name in ("small_inputs", "small_context", "_buffer_owners", "_twin_layers",
                     "_paths"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("island", Island(route=_route_in_pass))  # (pickled before)
        self.small_inputs = weakref.WeakKeyDictionary()
        self.small_context = weakref.WeakKeyDictionary()
        self._buffer_owners = weakref.WeakKeyDictionary()
        self._twin_layers = weakref.WeakKeyDictionary()
        self._paths = weakref.WeakKeyDictionary()
        self.__dict__.setdefault("_step", None)


# A module's hooks and attributes go with it through copy.deepcopy and pickle. A
# torch.fx.GraphModule (what to_hetero returns) is rebuilt from its graph instead, which
# keeps neither: its copies would run without a scope, keeping their context uncompressed.
# fx gives every GraphModule a class of its own, so that class gets the two methods that put a
# copy of the scope back on the copy.


def _keep_through_copies(model: GraphModule) -> None:
    cls = type(model)
    if cls.__dict__.get("__deepcopy__") is not _graph_module_deepcopy:
        cls.__deepcopy__ = _graph_module_deepcopy
        cls.__reduce__ = _graph_module_reduce


def _graph_module_deepcopy(self: GraphModule, memo: dict) -> GraphModule:
    scope = scope_of(self)
    copied = GraphModule.__deepcopy__(self, memo)
    if scope is not None:
        copy.deepcopy(scope, memo)._attach(copied)
    return copied


def _graph_module_reduce(self: GraphModule) -> tuple:
    rebuild, args = GraphModule.__reduce__(self)
    return _rebuild_graph_module, (rebuild, args, scope_of(self))


def _rebuild_graph_module(rebuild: Any, args: tuple, scope: Scope | None) -> GraphModule:
    """Unpickle a converted GraphModule: fx's own rebuild, then its scope put back."""
    model = rebuild(*args)
    if scope is not None:
        scope._attach(model)
    return model


def _per_edge_and_head(name: str, module: nn.Module | None, t: Tensor) -> bool:
    """Whether ``t``, saved in ``module``, holds one value per edge and head: ``[E, H]`` or
    ``[E, H, 1]`` inside a message-passing layer with ``heads``."""
    heads = getattr(module, "heads", None)
    return (isinstance(module, MessagePassing) and isinstance(heads, int) and t.dim() in (2, 3)
            and t.size(1) == heads and t.numel() == t.size(0) * heads)


#: The flag of a layer in a pass run as PyTorch's (:attr:`_Compressed._gnnact_as_pytorch`).
_AS_PYTORCH = "_gnnact_as_pytorch"


def _clear_as_pytorch(layers: list[nn.Module]) -> None:
    for layer in layers:
        layer.__dict__.pop(_AS_PYTORCH, None)


def _own_hooks(module: nn.Module) -> bool:
    """Whether ``module`` has forward hooks other than a :class:`Scope`'s."""
    return not all(map(_is_scope_hook, (*module._forward_pre_hooks.values(),
                                        *module._forward_hooks.values())))


def _is_scope_hook(hook: Any) -> bool:
    """Whether ``hook`` is a :class:`Scope`'s (a copy of a child keeps the hooks it had)."""
    return isinstance(getattr(getattr(hook, "func", None), "__self__", None), Scope)


def scope_of(model: nn.Module) -> Scope | None:
    """The :class:`Scope` :func:`gnnact.convert` installed on ``model``, or ``None``."""
    return model.__dict__.get(ATTRIBUTE)
