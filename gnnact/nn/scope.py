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
  parameters, the forward's inputs, gnnact's own context and the softmax/log-softmax head pass
  through. A pipeline the caller entered around the model (offloading, say) stays in charge
  instead.

Evaluation (``torch.no_grad``) runs the plain forward: nothing is kept, so nothing is done.
What the last pass kept, by module, is what :func:`gnnact.summary` reports.
"""

from __future__ import annotations

import contextlib
import dataclasses
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch_geometric.nn.conv import MessagePassing

from gnnact.compress import Policy, Quantize, Rule
from gnnact.config import Config
from gnnact.hooks import SavedEntry, active_pipeline, compress_saved_tensors
from gnnact.memory import argument_tensors, storage_keys
from gnnact.nn.functional import FunctionalOps
from gnnact.ops.graph import GraphCache, use_graph_cache
from gnnact.ops.state import eager_op, forward_pass
from gnnact.quant.rng import PassSeeds

__all__ = ["PassRecord", "Scope", "scope_of"]

#: The attribute of the root module that holds its scope.
ATTRIBUTE = "_gnnact_scope"

_PASS: ContextVar[_Pass | None] = ContextVar("gnnact_scope_pass", default=None)


@dataclass
class PassRecord:
    """What one forward pass of a converted model kept for backward.

    Args:
        bytes_by_module (dict[str, int]): module path -> bytes of the context saved while it
            was the innermost running module (each storage counted once, for the first module
            that saved it; parameters and the forward's inputs not counted).
        tensors (dict[str, SavedEntry]): the generic pipeline's tensors, by name.
        graph_cache (int): bytes of the model's graph cache after the pass.
    """

    bytes_by_module: dict[str, int] = field(default_factory=dict)
    tensors: dict[str, SavedEntry] = field(default_factory=dict)
    graph_cache: int = 0

    @property
    def context(self) -> int:
        """Bytes of the context, all modules together (the graph cache not included)."""
        return sum(self.bytes_by_module.values())


class _Pass:
    """One forward pass of a converted model (see the module docstring)."""

    def __init__(self, scope: Scope, module: nn.Module, args: tuple, kwargs: dict) -> None:
        self.scope = scope
        self.module = module
        self.depth = 1  # converted modules (this one included) running inside the pass
        self.exact = [0]  # raised while a softmax (the loss head) runs
        self.inputs = argument_tensors((args, kwargs))
        self.pipeline: compress_saved_tensors | None = None
        self._stack = contextlib.ExitStack()
        self._token: Any = None

    def enter(self) -> None:
        scope, stack = self.scope, self._stack
        try:
            state = stack.enter_context(forward_pass(scope.row_gradients, seeds=scope.seeds))
            # Only the forward's inputs are resident: any other tensor that needs no gradient
            # (an aggregate of the input features, say) is a temporary. (Restored at the end:
            # the pass may be a pipeline's around the model.)
            stack.callback(setattr, state, "resident", state.resident)
            state.resident = storage_keys(self.inputs)
            stack.enter_context(use_graph_cache(scope.graphs))
            pipeline = active_pipeline()
            if pipeline is None:
                pipeline = scope.pipeline(self.module, self.inputs, self.exact)
                stack.enter_context(pipeline)
                # Its module tracking starts inside the root's call (this hook), after the
                # root's own entry: the root is the running module until it returns.
                pipeline._stack.append(self.module)
            self.pipeline = pipeline
            stack.enter_context(FunctionalOps(self.config_for, self.exact))
        except BaseException:
            stack.close()
            raise
        self._token = _PASS.set(self)

    def exit(self) -> None:
        _PASS.reset(self._token)
        try:
            self._stack.close()
        finally:
            pipeline = self.pipeline
            if pipeline is not None:
                self.scope.last = PassRecord(dict(pipeline.bytes_by_module),
                                             dict(pipeline.tensors),
                                             self.scope.graphs.nbytes())

    def config_for(self, role: str) -> Config:
        """The configuration of a functional op's tensor ``role`` in the module running now."""
        assert self.pipeline is not None
        path = self.pipeline._where()[0]
        return self.scope.config_for(path, role)


class Scope:
    r"""gnnact's part in each training forward pass of a converted model (see the module
    docstring). Installed by :func:`gnnact.convert` on the model it converts
    (:meth:`install`); it lives as long as that model.

    Args:
        config (Config): the storage of the context of functional ops and of the generic
            pipeline (the twins keep their own ``config``).

    Attributes:
        bits (dict[str, int]): widths of single tensors by name (``"<module path>:<role>"``
            for functional ops, ``"<module path>:<index>"`` for the generic pipeline), set by
            :class:`gnnact.Controller`.
        graphs (GraphCache): the model's graph cache.
        seeds (PassSeeds): the source of each pass's rounding seeds.
        last (PassRecord or None): what the last training forward pass kept.
    """

    def __init__(self, config: Config) -> None:
        self.config = config
        self.bits: dict[str, int] = {}
        self.graphs = GraphCache()
        self.row_gradients: dict[tuple, Tensor] = {}
        self.seeds = PassSeeds()
        self.last: PassRecord | None = None
        self._configs: dict[tuple[str, str, int], Config] = {}

    # ------------------------------------------------------------------ installation

    @classmethod
    def install(cls, model: nn.Module, config: Config) -> Scope:
        """Give ``model`` a scope with ``config`` (or ``config`` to the one it has)."""
        scope = scope_of(model)
        if scope is not None:
            scope.config = config
            scope._configs.clear()
            return scope
        scope = cls(config)
        # A plain attribute (not a submodule, parameter or buffer): no state_dict entry.
        object.__setattr__(model, ATTRIBUTE, scope)
        model.register_forward_pre_hook(scope._pre, with_kwargs=True, prepend=True)
        model.register_forward_hook(scope._post, with_kwargs=True, always_call=True)
        return scope

    # Module hooks, not a wrapped forward: they see the module they run for (a replica made by
    # DataParallel included) and survive deepcopy and pickling with the model. Under
    # torch.compile they run eagerly (eager_op): a pass's state is context variables, hooks and
    # a torch function mode, entered here and left in _post, not a tensor program.
    @eager_op
    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        active = _PASS.get()
        if active is not None:  # a converted model inside a converted model: one pass
            active.depth += 1
            return
        if not torch.is_grad_enabled():
            return  # nothing will be kept
        _Pass(self, module, args, kwargs).enter()

    @eager_op
    def _post(self, module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        active = _PASS.get()
        if active is None:
            return
        active.depth -= 1
        if active.depth == 0:
            active.exit()

    # ------------------------------------------------------------------ per pass

    def config_for(self, path: str, role: str) -> Config:
        """The configuration of tensor ``role`` kept by a functional op in module ``path``:
        this scope's, tagged with the path, at the width :attr:`bits` gives it."""
        tag = path or "<model>"
        bits = self.bits.get(f"{tag}:{role}", self.config.bits)
        key = (tag, role, bits)
        config = self._configs.get(key)
        if config is None:
            config = self._configs[key] = dataclasses.replace(self.config, tag=tag, bits=bits)
        return config

    def pipeline(self, model: nn.Module, inputs: list[Tensor],
                 exact: list[int]) -> compress_saved_tensors:
        """The generic pipeline of one pass: the default policy with the softmax head exact."""
        policy = Policy.default_for(self.config, model)
        if policy.default is not None:  # (bits=32 keeps everything exact anyway)
            policy.rules[:0] = [
                Rule(None, where=lambda name, module, t: exact[0] > 0),
                # Attention coefficients of a conv without a twin (GATv2, Transformer, ...):
                # one value per edge and head, at config.attention bits as in the GAT twin
                # (at 2 bits GATv2 stops training, as GAT does in GACT's Table 3).
                Rule(Quantize(self.config.attention, self.config.group_size,
                              backend=self.config.backend), where=_per_edge_and_head)]
        pipeline = compress_saved_tensors(self.config, policy=policy, model=model,
                                          skip=inputs)
        pipeline.bits = self.bits  # the Controller's widths, shared
        return pipeline

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["last"] = None  # a record of one pass, not part of the model
        return state


def _per_edge_and_head(name: str, module: nn.Module | None, t: Tensor) -> bool:
    """Whether ``t``, saved in ``module``, holds one value per edge and head: ``[E, H]`` or
    ``[E, H, 1]`` inside a message-passing layer with ``heads``."""
    heads = getattr(module, "heads", None)
    return (isinstance(module, MessagePassing) and isinstance(heads, int) and t.dim() in (2, 3)
            and t.size(1) == heads and t.numel() == t.size(0) * heads)


def scope_of(model: nn.Module) -> Scope | None:
    """The :class:`Scope` :func:`gnnact.convert` installed on ``model``, or ``None``."""
    return model.__dict__.get(ATTRIBUTE)
