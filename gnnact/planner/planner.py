r"""``gnnact.plan``: per-block keep / recompute / compress / swap under a memory budget (Adacc,
with GACT's swap as a fourth choice), with the context between the blocks planned too.

The model is cut into *blocks* (by default the parameterised children of its
``ModuleList``/``Sequential`` containers: a GNN's ``convs.0``, a ResNet's ``layers.3``, a
transformer's ``blocks.1``). One profiling pass measures, per block :math:`i`, what it saves for
backward (:math:`S_i` bytes as is; :math:`S_i(b)` quantized to :math:`b` bits, from the exact
packed formats; ReLU masks :math:`M_i`; what it keeps as is whatever the choice, such as edge
indices, :math:`E_i`), its inputs (:math:`I_i` bytes as is, :math:`I_i(b)` at :math:`b` bits),
its forward time :math:`F_i` and the time :math:`Q_i(b)` to compress and restore its tensors at
:math:`b` bits. Its options are

==============  ===========================  ==============================================
option          device memory held           time added to a step
==============  ===========================  ==============================================
keep            :math:`S_i + M_i + E_i`      0
compress *b*    :math:`S_i(b) + M_i + E_i`   :math:`Q_i(b)`
recompute       :math:`I_i`                  :math:`F_i` (forward again in backward)
recompute *b*   :math:`I_i(b)`               :math:`F_i` + compressing the inputs
swap            :math:`E_i`                  :math:`Q_i(b_{min}) + \max(0, C_i - 2F_i)`
==============  ===========================  ==============================================

where a recomputed block still keeps its inputs (non-reentrant checkpointing saves them, as is
or, for *recompute b*, at :math:`b` bits), and swap (CUDA only) compresses at the narrowest width
and copies out and in (:math:`C_i` at the measured host-device bandwidth), partly hidden behind
the block's backward (about :math:`2F_i`).

Between the blocks (ReLU and dropout modules, and ``F.relu``/``F.dropout`` calls in ``forward``,
as PyG's examples write them) the plan runs ReLU, LeakyReLU and dropout as gnnact's ops, which
keep a lossless 1-bit mask (``mask`` rows of :meth:`Plan.table`) instead of PyTorch's float
tensors; every other floating-point tensor saved there is planned on its own, keep or compress
*b*. What is left (the masks, integer indices, the loss head, kept exact) is the *rest*
:math:`R`, measured. :func:`~gnnact.planner.milp.solve` picks one option per unit with the least
added time such that :math:`R + \sum_i m_i \le B`.

**Keeping its word.** The estimate is a sum of parts; sharing between units (a tensor saved by
two blocks is stored once) makes it err by a few percent either way. So :func:`gnnact.plan`
measures every plan it returns: it installs it and counts the saved context of one forward pass
on the example inputs with :func:`gnnact.memory.saved_bytes` (graph cache included, the example
inputs excluded). When that exceeds the budget, the overshoot is the margin: the solver runs
again with the budget lowered by it, until the measured context fits (:attr:`Plan.measured`,
:attr:`Plan.margin`). The context's size depends only on the shapes, so the pass measures what
training on those inputs keeps. When even the leanest plan, measured, exceeds the budget,
:class:`~gnnact.planner.InfeasibleBudget` names the budget and that smallest achievable one.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils.checkpoint import checkpoint

from gnnact.compress import OUTSIDE, Policy, Quantize, Rule
from gnnact.compress.policy import within
from gnnact.config import Config
from gnnact.hooks import compress_saved_tensors
from gnnact.memory import saved_bytes, storage_keys, tensor_storages
from gnnact.nn.functional import HANDLERS
from gnnact.ops.context import cache_key
from gnnact.planner.milp import InfeasibleBudget, Option, solve
from gnnact.quant.core import DEFAULT_GROUP_SIZE
from gnnact.quant.packed import packed_nbytes

__all__ = ["BlockProfile", "Plan", "default_blocks", "plan"]

#: Calls that keep a 1-bit mask when run as gnnact's ops between the blocks.
_MASK_CALLS = frozenset({F.relu, torch.relu, Tensor.relu, F.relu_, torch.relu_, Tensor.relu_,
                         F.leaky_relu, F.leaky_relu_, F.dropout, torch.dropout})

#: How many more times :func:`plan` re-solves with a lowered budget before it falls back to the
#: leanest plan (each try is one forward pass).
_TRIES = 6


# The mask ops take a configuration for its floor only: between the blocks every mask is kept
# as one (the plan counts on them), whatever its size.
_EVERY_MASK = Config(bits=32, min_bytes=0)


def _mask_config(role: str) -> Config:
    return _EVERY_MASK


class _MaskedGaps(TorchFunctionMode):
    """Runs the ReLU, LeakyReLU and dropout calls made outside the planned blocks (modules or
    functional calls in ``forward``) as gnnact's ops, which keep a 1-bit mask instead of
    PyTorch's float tensors (exact: these backwards read only the mask).

    Not inside the blocks: a recomputed block runs its forward again in backward, outside
    this mode, and must save what it saved the first time. Not in the loss either.
    """

    def __init__(self, hooks: _PlanHooks, blocks: Sequence[str]) -> None:
        super().__init__()
        self.hooks = hooks
        self.blocks = tuple(blocks)
        #: module path -> [bytes PyTorch would keep as is, bytes of the masks], last pass
        self.masks: dict[str, list[int]] = {}

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if func in _MASK_CALLS and torch.is_grad_enabled() and args:
            path = self.hooks._where()[0]
            if path != OUTSIDE and not any(within(path, b) for b in self.blocks):
                x = args[0]
                before = x.grad_fn if isinstance(x, Tensor) else None
                out = HANDLERS[func](_mask_config, *args, **kwargs)
                if out is not NotImplemented:
                    if out.grad_fn is not None and out.grad_fn is not before:
                        tally = self.masks.setdefault(path, [0, 0])
                        tally[0] += x.numel() * x.element_size()
                        tally[1] += math.ceil(x.numel() / 8)
                    return out
        return func(*args, **kwargs)


class _PlanHooks(compress_saved_tensors):
    """A plan's pipeline: :class:`~gnnact.compress_saved_tensors` with the ReLU and dropout
    calls between the blocks keeping 1-bit masks (:class:`_MaskedGaps`)."""

    def __init__(self, config: Config, *, blocks: Sequence[str], **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.gaps = _MaskedGaps(self, blocks)
        #: (name, first saver's path, shape, bytes) of the saves served by a copy made for an
        #: earlier save
        self.shared: list[tuple[str, str | None, tuple[int, ...], int]] = []
        self._first: dict[tuple, str] = {}  # the cache's key -> the path that packed it last

    def _pack(self, t: Tensor) -> Any:
        packed, shared, compact = self.num_packed, self.num_shared, self.num_compact
        out = super()._pack(t)
        if (self.num_packed == packed and self.num_shared == shared) or self.num_compact > compact:
            return out  # (an index or mask kept compact: the same under every option)
        path = self._where()[0]
        key = cache_key(t)[0]  # what gnnact's one cache of compressed copies shares by
        if self.num_packed > packed:
            self._first[key] = path
        else:
            self.shared.append((f"{path}:{self._counts[path] - 1}", self._first.get(key),
                                tuple(t.shape), t.numel() * t.element_size()))
        return out

    def __enter__(self) -> _PlanHooks:
        super().__enter__()
        self.gaps.masks = {}
        try:
            self.gaps.__enter__()
        except BaseException:
            super().__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *args: object) -> None:
        try:
            self.gaps.__exit__(*args)
        finally:
            super().__exit__(*args)


def default_blocks(model: nn.Module) -> list[str]:
    """The parameterised children of the model's ``ModuleList``/``Sequential`` containers, not
    nested in one another (outermost first); the model's direct children if there are none.

    The blocks :func:`gnnact.plan` plans by default.

    Args:
        model (torch.nn.Module): the model.

    Returns:
        list[str]: module paths, in the order of :meth:`torch.nn.Module.named_modules`.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> from gnnact.planner import default_blocks
        >>> default_blocks(GCN(16, 32, num_layers=3, out_channels=4))
        ['convs.0', 'convs.1', 'convs.2']
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(),
        ...                             torch.nn.Linear(8, 2))
        >>> default_blocks(model)  # the ReLU has no parameters
        ['0', '2']
    """
    blocks: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, (nn.ModuleList, nn.Sequential)):
            continue
        if any(name == b or name.startswith(b + ".") for b in blocks):
            continue
        for child_name, child in module.named_children():
            path = f"{name}.{child_name}" if name else child_name
            if any(True for _ in child.parameters()):
                blocks.append(path)
    if not blocks:
        blocks = [n for n, c in model.named_children() if any(True for _ in c.parameters())]
    return blocks


@dataclass
class BlockProfile:
    r"""What one planned unit saves and costs (see the module docstring), as measured by
    :func:`gnnact.plan`'s profiling pass (``Plan.blocks``): a block, or a tensor saved between
    the blocks.

    Args:
        name (str): the block's module path, or the tensor's name (``"<module path>:<index>"``,
            as :class:`gnnact.compress_saved_tensors` names it).
        saved (int, optional): :math:`S_i`, bytes of its compressible tensors as they are.
            (default: :obj:`0`)
        masks (int, optional): :math:`M_i`, bytes of its ReLU masks. (default: :obj:`0`)
        inputs (int, optional): :math:`I_i`, bytes of its inputs as a recomputed block keeps
            them (what checkpointing saves, less the resident inputs). (default: :obj:`0`)
        forward_s (float, optional): :math:`F_i`, its forward time in seconds (median).
            (default: :obj:`0.0`)
        shapes (list[tuple[int, ...]], optional): shapes of its compressible tensors.
            (default: :obj:`[]`)
        compressed (dict[int, int], optional): :math:`S_i(b)`, bytes at :math:`b` bits
            (exact packed sizes). (default: :obj:`{}`)
        compress_s (dict[int, float], optional): :math:`Q_i(b)`, seconds to compress and
            restore its tensors at :math:`b` bits. (default: :obj:`{}`)
        other (int, optional): :math:`E_i`, bytes it keeps as they are whatever is chosen,
            short of recomputing it (integer indices, small statistics). (default: :obj:`0`)
        input_shapes (list[tuple[int, ...]], optional): shapes of its compressible inputs
            (for *recompute b*). (default: :obj:`[]`)
        input_raw (int, optional): bytes of those inputs as they are (part of
            :attr:`inputs`). (default: :obj:`0`)
        kind (str, optional): ``"block"`` (a module) or ``"tensor"`` (a tensor saved between
            the blocks: keep or compress only). (default: :obj:`"block"`)

    Example:
        >>> from gnnact.planner import BlockProfile
        >>> profile = BlockProfile("convs.1", saved=1_024_000, shapes=[(2000, 128)])
        >>> profile.saved + profile.masks + profile.other  # what "keep" leaves on the device
        1024000
    """

    name: str
    saved: int = 0  # S_i: bytes of its compressible tensors as they are
    masks: int = 0  # M_i: bytes of its ReLU masks
    inputs: int = 0  # I_i: bytes of its inputs as checkpointing keeps them
    forward_s: float = 0.0  # F_i
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    compressed: dict[int, int] = field(default_factory=dict)  # S_i(b)
    compress_s: dict[int, float] = field(default_factory=dict)  # Q_i(b)
    other: int = 0  # E_i: kept as is unless recomputed
    input_shapes: list[tuple[int, ...]] = field(default_factory=list)
    input_raw: int = 0
    kind: str = "block"


@dataclass
class Plan:
    """The chosen option of every block (and of every tensor saved between the blocks), the
    profile it came from, and :meth:`apply`.

    Returned by :func:`gnnact.plan`; inspect it (:attr:`memory`, :attr:`measured`,
    :attr:`extra_s`, :meth:`table`, :meth:`summary`) before installing it with :meth:`apply`.

    Args:
        model (torch.nn.Module): the planned model.
        blocks (list[BlockProfile]): the profile of each planned unit: the blocks, then the
            tensors saved between them.
        options (list[list[Option]]): the options offered to each unit (dominated ones
            dropped).
        choice (dict[str, Option]): the chosen option per unit name.
        budget (int): the budget, in bytes.
        rest (int): bytes of the saved context outside the planned units (masks between the
            blocks, integer indices, the loss head), measured.
        skip (list): resident tensors, passed on to :class:`gnnact.compress_saved_tensors`.
        masks (dict[str, tuple[int, int]], optional): per module path between the blocks, the
            bytes its ReLU and dropout calls would keep as PyTorch keeps them and the bytes of
            their 1-bit masks (part of :attr:`rest`). (default: :obj:`{}`)
        measured (int, optional): the saved context the plan kept in a forward pass on the
            example inputs (:meth:`saved_bytes`). (default: :obj:`0`)
        margin (int, optional): bytes the solver held back below the budget: the sum of the
            overshoots measured on earlier tries. (default: :obj:`0`)

    Example:
        >>> import torch.nn.functional as F
        >>> from torch_geometric.nn.models import GCN
        >>> from gnnact.data import synthetic_graph
        >>> data = synthetic_graph(2000, 8, 64, 4, seed=0)
        >>> model = GCN(64, 128, num_layers=3, out_channels=4)
        >>> def loss_fn(out):
        ...     return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        >>> p = gnnact.plan(model, (data.x, data.edge_index), 2 << 20, loss_fn=loss_fn)
        >>> [row["block"] for row in p.table()]  # the ReLU between the convs keeps a mask
        ['convs.0', 'convs.1', 'convs.2', 'act']
        >>> p.measured <= p.budget  # measured on the example inputs
        True
        >>> hooks = p.apply()
        >>> with hooks:
        ...     loss = loss_fn(model(data.x, data.edge_index))
        >>> loss.backward()
        >>> p.remove()  # undo the checkpoint wrappers of recomputed blocks
    """

    model: nn.Module
    blocks: list[BlockProfile]
    options: list[list[Option]]
    choice: dict[str, Option]
    budget: int
    rest: int  # bytes kept outside the planned units, measured
    skip: list[Any]
    masks: dict[str, tuple[int, int]] = field(default_factory=dict)
    measured: int = 0
    margin: int = 0
    _wrapped: dict[str, Callable | None] = field(default_factory=dict, init=False, repr=False)

    @property
    def memory(self) -> int:
        """Estimated saved-context bytes on the device under the plan: :attr:`rest` plus the
        chosen options' memory (the margin not included)."""
        return self.rest + int(sum(o.memory for o in self.choice.values()))

    @property
    def extra_s(self) -> float:
        """Estimated seconds the plan adds to a step."""
        return float(sum(o.time for o in self.choice.values()))

    def table(self) -> list[dict]:
        """One row per planned unit (name, bytes kept as is, chosen option, its memory and
        time), then one per module path between the blocks whose ReLU and dropout calls keep
        masks (option ``"mask"``)."""
        rows = [{"block": b.name, "saved": b.saved + b.masks + b.other,
                 "option": self.choice[b.name].name, "memory": int(self.choice[b.name].memory),
                 "time_s": self.choice[b.name].time} for b in self.blocks]
        rows += [{"block": path or "<model>", "saved": raw, "option": "mask", "memory": packed,
                  "time_s": 0.0} for path, (raw, packed) in self.masks.items()]
        return rows

    def summary(self) -> str:
        """A plain-text table of :meth:`table`, with the totals against the budget."""
        lines = [f"{'block':24s} {'as is':>12s} {'option':>10s} {'kept':>12s} {'+ms':>8s}"]
        for r in self.table():
            lines.append(f"{r['block']:24s} {r['saved']:12,d} {r['option']:>10s} "
                         f"{r['memory']:12,d} {1e3 * r['time_s']:8.2f}")
        lines.append(f"rest (masks included) {self.rest:,d} bytes; total {self.memory:,d} "
                     f"estimated, {self.measured:,d} measured, of {self.budget:,d} budget; "
                     f"+{1e3 * self.extra_s:.2f} ms per step")
        return "\n".join(lines)

    def apply(self) -> compress_saved_tensors:
        """Install the plan: blocks to recompute run under non-reentrant checkpointing (their
        ``forward`` is wrapped; :meth:`remove` undoes it), and the returned pipeline compresses
        or offloads the others' tensors (and the inputs a recomputed block keeps, for
        *recompute b*) and keeps 1-bit masks for the ReLU and dropout calls between the
        blocks. Enter it around each training forward pass."""
        self.remove()
        modules = dict(self.model.named_modules())
        rules, offload = [], []
        for block in self.blocks:
            option = self.choice[block.name]
            names = (block.name,) if block.kind == "tensor" else (block.name, block.name + ".*")
            if option.name.startswith("recompute"):
                module = modules[block.name]
                # (None: the class's forward, restored by deleting the instance attribute)
                self._wrapped[block.name] = vars(module).get("forward")
                module.forward = _checkpointed(module.forward)
                # What the hooks see of a checkpointed block is its inputs, nothing else.
                bits = option.name[9:]
                rules.append(Rule(Quantize(int(bits)) if bits else None, names=names))
            elif option.name.startswith("compress"):
                rules.append(Rule(Quantize(int(option.name[8:])), names=names))
            elif option.name == "swap":
                rules.append(Rule(Quantize(min(block.compressed)), names=names))
                offload.append(block.name)
            else:
                rules.append(Rule(None, names=names))
        blocks = [b.name for b in self.blocks if b.kind == "block"]
        return _PlanHooks(Config(bits=8), blocks=blocks, model=self.model, skip=self.skip,
                          policy=Policy(rules, default=None), offload_paths=offload)

    def saved_bytes(self, loss: Tensor, hooks: compress_saved_tensors) -> int:
        """The saved context of a forward pass that ran under the plan: what
        :func:`gnnact.memory.saved_bytes` counts of ``loss``'s graph (graph cache included,
        the resident inputs excluded), plus what checkpointing keeps of the recomputed blocks'
        inputs, from ``hooks``' tally (:meth:`apply`'s pipeline, entered for that pass).

        A graph walk cannot see those inputs: non-reentrant checkpointing saves them in a node
        outside the loss's graph, reached only through the recomputed nodes' handles. (A
        storage also saved elsewhere may count twice: the measure errs high, never low.)

        Args:
            loss (torch.Tensor): the loss of the pass, before backward.
            hooks (gnnact.compress_saved_tensors): the pipeline :meth:`apply` returned.

        Returns:
            int: bytes.
        """
        recomputed = [name for name, o in self.choice.items() if o.name.startswith("recompute")]
        inputs = sum(nbytes for path, nbytes in hooks.bytes_by_module.items()
                     if any(within(path, name) for name in recomputed))
        return saved_bytes(loss, exclude=self.skip) + inputs

    def remove(self) -> None:
        """Undo :meth:`apply`'s checkpoint wrappers."""
        modules = dict(self.model.named_modules())
        for name, forward in self._wrapped.items():
            if forward is None:
                del modules[name].forward
            else:
                modules[name].forward = forward
        self._wrapped.clear()


def _undominated(layer: list[Option]) -> list[Option]:
    """Drop options no better in memory and time than an earlier one or strictly worse than a
    later one, so that ties go to the simplest option (keep first)."""
    kept = []
    for i, o in enumerate(layer):
        if any((p.memory <= o.memory and p.time <= o.time)
               and (j < i or p.memory < o.memory or p.time < o.time)
               for j, p in enumerate(layer) if j != i):
            continue
        kept.append(o)
    return kept


def _checkpointed(forward: Callable) -> Callable:
    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _profile_times(model: nn.Module, run: Callable[[], Tensor], blocks: list[str],
                   profiles: dict[str, BlockProfile], device: torch.device,
                   repeats: int) -> None:
    """Forward time per block, from forward hooks (median of ``repeats``)."""
    modules = dict(model.named_modules())
    starts: dict[str, float] = {}
    times: dict[str, list[float]] = {b: [] for b in blocks}
    handles = []
    for name in blocks:
        def pre(module: nn.Module, args: tuple, name: str = name) -> None:
            _synchronize(device)
            starts[name] = time.perf_counter()

        def post(module: nn.Module, args: tuple, out: Any, name: str = name) -> None:
            _synchronize(device)
            times[name].append(time.perf_counter() - starts[name])

        handles += [modules[name].register_forward_pre_hook(pre),
                    modules[name].register_forward_hook(post)]
    try:
        for _ in range(repeats):
            loss = run()
            del loss
    finally:
        for h in handles:
            h.remove()
    for name in blocks:
        profiles[name].forward_s = statistics.median(times[name]) if times[name] else 0.0


def _compress_time(shapes: list[tuple[int, ...]], bits: int, device: torch.device,
                   cache: dict) -> float:
    total = 0.0
    for shape in shapes:
        key = (shape, bits)
        if key not in cache:
            x = torch.randn(shape, device=device)
            quantizer = Quantize(bits)
            quantizer.compress(x, "profile").dequantize()  # warm-up
            _synchronize(device)
            start = time.perf_counter()
            quantizer.compress(x, "profile").dequantize()
            _synchronize(device)
            cache[key] = time.perf_counter() - start
        total += cache[key]
    return total


def _bandwidth(device: torch.device) -> float:
    """Host-device copy bandwidth in bytes per second (pinned, 64 MiB, both ways)."""
    host = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty_like(host, device=device)
    dev.copy_(host, non_blocking=True)
    _synchronize(device)
    start = time.perf_counter()
    dev.copy_(host, non_blocking=True)
    host.copy_(dev, non_blocking=True)
    _synchronize(device)
    return 2 * host.numel() / (time.perf_counter() - start)


def plan(model: nn.Module, example_inputs: Sequence[Any], budget_bytes: int, *,
         loss_fn: Callable[[Any], Tensor] | None = None, blocks: Iterable[str] | None = None,
         widths: Sequence[int] = (8, 4, 2), swap: bool | None = None,
         skip: Iterable[Any] = (), repeats: int = 3) -> Plan:
    r"""Profile ``model`` once on ``example_inputs`` and choose, per block, keep / recompute /
    compress at one of ``widths`` / swap (and keep or compress for each tensor saved between
    the blocks, whose ReLU and dropout calls keep 1-bit masks) so that the saved context fits
    ``budget_bytes`` at the least added step time (see the module docstring). The plan is
    measured on ``example_inputs`` before it is returned, and its measured context
    (:attr:`Plan.measured`) never exceeds the budget. Returns an inspectable :class:`Plan`;
    :meth:`Plan.apply` installs it. The model's buffers and the random number generators come
    out as they went in.

    Args:
        model (torch.nn.Module): the model, in training mode.
        example_inputs (Sequence): positional inputs of ``model``.
        budget_bytes (int): bytes the saved context may hold on the device.
        loss_fn (callable, optional): maps the output to the loss. (default: sum of the
            output)
        blocks (Iterable[str], optional): module paths to plan. (default:
            :func:`default_blocks`)
        widths (Sequence[int], optional): bit widths of the compress options.
            (default: :obj:`(8, 4, 2)`)
        swap (bool, optional): offer swap; needs CUDA. (default: on CUDA)
        skip (Iterable, optional): resident tensors (the input features), as in
            :class:`gnnact.compress_saved_tensors`; the example inputs are always skipped.
            (default: :obj:`()`)
        repeats (int, optional): forward passes timed per block (median). (default: :obj:`3`)

    Raises:
        gnnact.planner.InfeasibleBudget: the budget is below the smallest achievable one, the
            leanest plan's measured context (both named).
        ValueError: a negative budget, a width that is not a supported bit width, a block the
            model does not have, or ``swap=True`` off CUDA.

    Returns:
        Plan: the chosen option of every block and tensor between the blocks.

    Example:
        >>> import torch.nn.functional as F
        >>> from torch_geometric.nn.models import GCN
        >>> from gnnact.data import synthetic_graph
        >>> data = synthetic_graph(2000, 8, 64, 4, seed=0)
        >>> x, edge_index, y, mask = data.x, data.edge_index, data.y, data.train_mask
        >>> model = GCN(64, 128, num_layers=3, out_channels=4)
        >>> p = gnnact.plan(model, (x, edge_index), budget_bytes=2 << 20,
        ...                 loss_fn=lambda out: F.cross_entropy(out[mask], y[mask]))
        >>> p.memory <= 2 << 20  # print(p.summary()) shows the choice per block
        True
        >>> hooks = p.apply()
        >>> with hooks:
        ...     loss = F.cross_entropy(model(x, edge_index)[mask], y[mask])
        >>> loss.backward()
    """
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, (int, float)) or (
            budget_bytes < 0):
        raise ValueError(f"budget_bytes must be a non-negative number, got {budget_bytes!r}")
    for b in widths:
        Config(bits=b)
    loss_fn = loss_fn or (lambda out: out.float().sum())
    names = list(blocks) if blocks is not None else default_blocks(model)
    modules = dict(model.named_modules())
    for name in names:
        if name not in modules:
            raise ValueError(f"blocks names a module the model does not have: {name!r}")
    params = list(model.parameters())
    device = params[0].device if params else torch.device("cpu")
    swap = device.type == "cuda" if swap is None else swap
    if swap and device.type != "cuda":
        raise ValueError("swap=True needs the model on a CUDA device")
    resident = [*skip, *(a for a in example_inputs if isinstance(a, Tensor))]

    def run() -> Tensor:
        return loss_fn(model(*example_inputs))

    # Planning runs the model a few times; the model (BatchNorm statistics) and the random
    # streams (dropout) come out as they went in.
    buffers = {k: v.clone() for k, v in model.named_buffers()}
    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            return _plan(model, run, names, int(budget_bytes), widths, swap, resident,
                         repeats, device)
    finally:
        with torch.no_grad():
            for k, v in model.named_buffers():
                v.copy_(buffers[k])


def _profile(model: nn.Module, run: Callable[[], Tensor], names: list[str],
             resident: list[Any]) -> tuple[list[BlockProfile], int, dict]:
    """The profiling pass: what every block and every tensor between the blocks saves (all of
    it quantized to 8 bits, to see shapes and names), what each block's inputs would cost a
    recomputed block, and the measured rest. Returns the units, the rest and the masks."""
    profiles = {n: BlockProfile(n) for n in names}
    modules = dict(model.named_modules())
    skip_keys = storage_keys(resident)
    # The loss head stays exact (GACT): part of the rest.
    hooks = _PlanHooks(Config(bits=8), blocks=names, model=model, skip=resident,
                       policy=Policy([Rule(None, names=(OUTSIDE,))], default=Quantize(8)))

    def inputs(module: nn.Module, args: tuple, kwargs: dict, name: str) -> None:
        # What non-reentrant checkpointing saves of a recomputed block: its tensor arguments
        # (kwargs travel in a closure, not saved), through the hooks, less the resident ones.
        profile, seen = profiles[name], set()
        profile.inputs, profile.input_shapes, profile.input_raw = 0, [], 0
        for a in args:
            if not isinstance(a, Tensor) or _is_leaf_parameter(a):
                continue
            if isinstance(hooks._compressible(a), Tensor):  # (not kept as is for its size)
                profile.input_shapes.append(tuple(a.shape))
                profile.input_raw += a.numel() * a.element_size()
            for _, _, nbytes, key in tensor_storages(a, ""):
                if key not in skip_keys and key not in seen:
                    seen.add(key)
                    profile.inputs += nbytes

    handles = [modules[n].register_forward_pre_hook(
        lambda m, a, k, n=n: inputs(m, a, k, n), with_kwargs=True) for n in names]
    try:
        with hooks:
            loss = run()
        measured = saved_bytes(loss, exclude=resident)
    finally:
        for h in handles:
            h.remove()
    del loss
    gaps: dict[str, BlockProfile] = {}
    planned = 0  # bytes of the profiled pass that belong to a planned unit
    packed = dict.fromkeys(names, 0)
    for entry in hooks.tensors.values():
        path = entry.name.rsplit(":", 1)[0]
        owner = next((n for n in names if within(path, n)), None)
        if entry.kind in ("exact", "index", "mask") or (owner is None
                                                          and entry.kind == "relu_mask"):
            # The loss head, a mask the hooks made between the blocks, and the indices and
            # masks kept compact under every option: the block's "other" bytes, or the rest.
            continue
        planned += entry.nbytes
        if owner is None:  # saved between the blocks: planned on its own
            gaps[entry.name] = BlockProfile(entry.name, saved=entry.raw_bytes,
                                            shapes=[entry.shape], kind="tensor")
            continue
        packed[owner] += entry.nbytes
        if entry.kind == "relu_mask":
            profiles[owner].masks += entry.nbytes
        else:
            profiles[owner].saved += entry.raw_bytes
            profiles[owner].shapes.append(entry.shape)
    # A tensor saved by several units is stored once only if they store it alike (the same
    # compressed copy, or exact). Charging it to every unit that saves it errs high, which
    # keeps the estimate on the safe side of the measured context.
    def unit(path: str) -> str | None:
        return next((n for n in names if within(path, n)), None)

    for name, first, shape, nbytes in hooks.shared:
        path = name.rsplit(":", 1)[0]
        owner = unit(path)
        if owner is not None and first is not None and unit(first) == owner:
            continue  # shared inside one block: stored as that block chooses, once
        if owner is None and path != OUTSIDE:
            gaps[name] = BlockProfile(name, saved=nbytes, shapes=[shape], kind="tensor")
        elif owner is not None:
            profiles[owner].saved += nbytes
            profiles[owner].shapes.append(shape)
    # What a block keeps as is (indices, statistics): the hooks' tally by module, less what
    # they compressed there. It goes when the block is recomputed.
    for path, nbytes in hooks.bytes_by_module.items():
        owner = next((n for n in names if within(path, n)), None)
        if owner is not None:
            profiles[owner].other += nbytes
    for name in names:
        profiles[name].other -= packed[name]
        planned += profiles[name].other
    masks = {path: (raw, nbytes) for path, (raw, nbytes) in hooks.gaps.masks.items()}
    return [*(profiles[n] for n in names), *gaps.values()], measured - planned, masks


def _is_leaf_parameter(t: Tensor) -> bool:
    base = t._base if t._base is not None else t
    return base.is_leaf and base.requires_grad


def _options(p: BlockProfile, widths: Sequence[int], swap: bool, bandwidth: float,
             device: torch.device, timings: dict) -> list[Option]:
    """The options of one unit (module docstring), dominated ones dropped."""
    kept = p.masks + p.other
    layer = [Option("keep", p.saved + kept, 0.0)]
    for b in widths:
        p.compressed[b] = sum(packed_nbytes(math.prod(s), b, DEFAULT_GROUP_SIZE)
                              for s in p.shapes)
        p.compress_s[b] = _compress_time(p.shapes, b, device, timings)
        layer.append(Option(f"compress{b}", p.compressed[b] + kept, p.compress_s[b]))
    if p.kind == "block":
        layer.append(Option("recompute", p.inputs, p.forward_s))
        for b in widths:
            small = sum(packed_nbytes(math.prod(s), b, DEFAULT_GROUP_SIZE)
                        for s in p.input_shapes)
            layer.append(Option(f"recompute{b}", p.inputs - p.input_raw + small,
                                p.forward_s + _compress_time(p.input_shapes, b, device,
                                                             timings)))
        if swap:
            narrow = min(widths)
            copy_s = 2 * p.compressed[narrow] / bandwidth
            layer.append(Option("swap", p.other, p.compress_s[narrow]
                                + max(0.0, copy_s - 2 * p.forward_s)))
    return _undominated(layer)


def _plan(model: nn.Module, run: Callable[[], Tensor], names: list[str], budget: int,
          widths: Sequence[int], swap: bool, resident: list[Any], repeats: int,
          device: torch.device) -> Plan:
    units, rest, masks = _profile(model, run, names, resident)
    _profile_times(model, run, names, {u.name: u for u in units}, device, repeats)
    timings: dict = {}
    bandwidth = _bandwidth(device) if swap else 0.0
    options = [_options(u, widths, swap, bandwidth, device, timings) for u in units]
    lean = [min(range(len(layer)), key=lambda i, layer=layer: layer[i].memory)
            for layer in options]

    def measured_plan(chosen: list[int], margin: int) -> Plan:
        choice = {u.name: options[i][c] for i, (u, c) in enumerate(zip(units, chosen,
                                                                         strict=True))}
        plan = Plan(model, units, options, choice, budget, rest, resident, masks, 0, margin)
        hooks = plan.apply()
        try:
            with hooks:
                loss = run()
            plan.measured = plan.saved_bytes(loss, hooks)
        finally:
            plan.remove()
        return plan

    # Solve, measure, and solve again with the budget lowered by the overshoot until the
    # measured context fits; the leanest plan is the last resort.
    margin = 0
    for _ in range(_TRIES):
        try:
            chosen = solve(options, budget - rest - margin)
        except InfeasibleBudget:
            break
        result = measured_plan(chosen, margin)
        if result.measured <= budget:
            return result
        if chosen == lean:
            break
        margin += result.measured - budget
    result = measured_plan(lean, margin)
    if result.measured > budget:
        raise InfeasibleBudget(budget, result.measured)
    return result
