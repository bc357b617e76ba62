r"""``gnnact.plan``: per-block keep / recompute / compress / swap under a memory budget (Adacc,
with GACT's swap as a fourth choice).

The model is cut into *blocks* (by default the parameterised children of its
``ModuleList``/``Sequential`` containers: a GNN's ``convs.0``, a ResNet's ``layers.3``, a
transformer's ``blocks.1``). One profiling pass measures, per block :math:`i`, what it saves for
backward (:math:`S_i` bytes as is; :math:`S_i(b)` quantized to :math:`b` bits, from the exact
packed formats; ReLU masks :math:`M_i`), the bytes of its inputs :math:`I_i`, its forward time
:math:`F_i` and the time :math:`Q_i(b)` to compress and restore its tensors at :math:`b` bits.
Its options are

=============  ======================  ==================================================
option          device memory held      time added to a step
=============  ======================  ==================================================
keep            :math:`S_i + M_i`       0
compress *b*    :math:`S_i(b) + M_i`    :math:`Q_i(b)`
recompute       :math:`I_i`             :math:`F_i` (forward again in backward)
swap            0                       :math:`Q_i(b_{min}) + \max(0, C_i - 2F_i)`
=============  ======================  ==================================================

where swap (CUDA only) compresses at the narrowest width and copies out and in
(:math:`C_i` at the measured host-device bandwidth), partly hidden behind the block's backward
(about :math:`2F_i`). :func:`~gnnact.planner.milp.solve` picks one option per block with the
least added time such that :math:`\sum_i m_i \le B - S_{\text{rest}}`, the budget less what
tensors outside the blocks keep. When everything fits, the plan keeps everything.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from gnnact.compress import Policy, Quantize, Rule
from gnnact.compress.policy import within
from gnnact.config import Config
from gnnact.hooks import compress_saved_tensors
from gnnact.planner.milp import InfeasibleBudget, Option, solve
from gnnact.quant.core import DEFAULT_GROUP_SIZE
from gnnact.quant.packed import packed_nbytes

__all__ = ["BlockProfile", "Plan", "default_blocks", "plan"]


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
    r"""What one block saves and costs (see the module docstring), as measured by
    :func:`gnnact.plan`'s profiling pass (``Plan.blocks``).

    Args:
        name (str): the block's module path.
        saved (int, optional): :math:`S_i`, bytes of its compressible tensors as they are.
            (default: :obj:`0`)
        masks (int, optional): :math:`M_i`, bytes of its ReLU masks. (default: :obj:`0`)
        inputs (int, optional): :math:`I_i`, bytes of its inputs that need a gradient.
            (default: :obj:`0`)
        forward_s (float, optional): :math:`F_i`, its forward time in seconds (median).
            (default: :obj:`0.0`)
        shapes (list[tuple[int, ...]], optional): shapes of its compressible tensors.
            (default: :obj:`[]`)
        compressed (dict[int, int], optional): :math:`S_i(b)`, bytes at :math:`b` bits
            (exact packed sizes). (default: :obj:`{}`)
        compress_s (dict[int, float], optional): :math:`Q_i(b)`, seconds to compress and
            restore its tensors at :math:`b` bits. (default: :obj:`{}`)

    Example:
        >>> from gnnact.planner import BlockProfile
        >>> profile = BlockProfile("convs.1", saved=1_024_000, shapes=[(2000, 128)])
        >>> profile.saved + profile.masks  # what "keep" leaves on the device
        1024000
    """

    name: str
    saved: int = 0  # S_i: bytes of its compressible tensors as they are
    masks: int = 0  # M_i: bytes of its ReLU masks
    inputs: int = 0  # I_i: bytes of its inputs that need a gradient
    forward_s: float = 0.0  # F_i
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    compressed: dict[int, int] = field(default_factory=dict)  # S_i(b)
    compress_s: dict[int, float] = field(default_factory=dict)  # Q_i(b)


@dataclass
class Plan:
    """The chosen option of every block, the profile it came from, and :meth:`apply`.

    Returned by :func:`gnnact.plan`; inspect it (:attr:`memory`, :attr:`extra_s`,
    :meth:`table`, :meth:`summary`) before installing it with :meth:`apply`.

    Args:
        model (torch.nn.Module): the planned model.
        blocks (list[BlockProfile]): the profile of each block.
        options (list[list[Option]]): the options offered to each block (dominated ones
            dropped).
        choice (dict[str, Option]): the chosen option per block path.
        budget (int): the budget, in bytes.
        rest (int): bytes kept by tensors outside the blocks.
        skip (list): resident tensors, passed on to :class:`gnnact.compress_saved_tensors`.

    Example:
        >>> import torch.nn.functional as F
        >>> from torch_geometric.nn.models import GCN
        >>> from gnnact.data import synthetic_graph
        >>> data = synthetic_graph(2000, 8, 64, 4, seed=0)
        >>> model = GCN(64, 128, num_layers=3, out_channels=4)
        >>> def loss_fn(out):
        ...     return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        >>> p = gnnact.plan(model, (data.x, data.edge_index), 2 << 20, loss_fn=loss_fn)
        >>> [row["block"] for row in p.table()]
        ['convs.0', 'convs.1', 'convs.2']
        >>> p.memory <= p.budget
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
    rest: int  # bytes kept by tensors outside the blocks
    skip: list[Any]
    _wrapped: dict[str, Callable | None] = field(default_factory=dict, init=False, repr=False)

    @property
    def memory(self) -> int:
        """Estimated saved-context bytes on the device under the plan."""
        return self.rest + int(sum(o.memory for o in self.choice.values()))

    @property
    def extra_s(self) -> float:
        """Estimated seconds the plan adds to a step."""
        return float(sum(o.time for o in self.choice.values()))

    def table(self) -> list[dict]:
        """One row per block: name, bytes kept as is, chosen option, its memory and time."""
        return [{"block": b.name, "saved": b.saved + b.masks, "option": self.choice[b.name].name,
                 "memory": int(self.choice[b.name].memory), "time_s": self.choice[b.name].time}
                for b in self.blocks]

    def summary(self) -> str:
        """A plain-text table of :meth:`table`, with the totals against the budget."""
        lines = [f"{'block':24s} {'as is':>12s} {'option':>10s} {'kept':>12s} {'+ms':>8s}"]
        for r in self.table():
            lines.append(f"{r['block']:24s} {r['saved']:12,d} {r['option']:>10s} "
                         f"{r['memory']:12,d} {1e3 * r['time_s']:8.2f}")
        lines.append(f"outside the blocks {self.rest:,d} bytes; total {self.memory:,d} of "
                     f"{self.budget:,d} budget; +{1e3 * self.extra_s:.2f} ms per step")
        return "\n".join(lines)

    def apply(self) -> compress_saved_tensors:
        """Install the plan: blocks to recompute run under non-reentrant checkpointing (their
        ``forward`` is wrapped; :meth:`remove` undoes it), and the returned pipeline compresses
        or offloads the others' tensors. Enter it around each training forward pass."""
        self.remove()
        modules = dict(self.model.named_modules())
        rules, offload = [], []
        for block in self.blocks:
            option = self.choice[block.name]
            names = (block.name, block.name + ".*")
            if option.name == "recompute":
                module = modules[block.name]
                # (None: the class's forward, restored by deleting the instance attribute)
                self._wrapped[block.name] = vars(module).get("forward")
                module.forward = _checkpointed(module.forward)
                rules.append(Rule(None, names=names))
            elif option.name.startswith("compress"):
                rules.append(Rule(Quantize(int(option.name[8:])), names=names))
            elif option.name == "swap":
                rules.append(Rule(Quantize(min(block.compressed)), names=names))
                offload.append(block.name)
            else:
                rules.append(Rule(None, names=names))
        return compress_saved_tensors(Config(bits=8), model=self.model, skip=self.skip,
                                      policy=Policy(rules, default=None), offload_paths=offload)

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
    """Forward time and input bytes per block, from forward hooks (median of ``repeats``)."""
    modules = dict(model.named_modules())
    starts: dict[str, float] = {}
    times: dict[str, list[float]] = {b: [] for b in blocks}
    handles = []
    for name in blocks:
        def pre(module: nn.Module, args: tuple, name: str = name) -> None:
            profiles[name].inputs = sum(a.numel() * a.element_size() for a in args
                                        if isinstance(a, Tensor) and a.requires_grad)
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
    compress at one of ``widths`` / swap so that the saved context fits ``budget_bytes`` at
    the least added step time (see the module docstring). Returns an inspectable
    :class:`Plan`; :meth:`Plan.apply` installs it.

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
        gnnact.planner.InfeasibleBudget: the budget is below the smallest feasible one (named).
        ValueError: a negative budget, a width that is not a supported bit width, a block the
            model does not have, or ``swap=True`` off CUDA.

    Returns:
        Plan: the chosen option of every block.

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

    profiles = {n: BlockProfile(n) for n in names}
    # What every block saves: everything compressible quantized, to see shapes and names.
    hooks = compress_saved_tensors(Config(bits=8), model=model, skip=resident,
                                   policy=Policy(default=Quantize(8)))
    with hooks:
        loss = run()
    del loss
    rest = hooks.passthrough_bytes
    for entry in hooks.tensors.values():
        path = entry.name.rsplit(":", 1)[0]
        owner = next((n for n in names if within(path, n)), None)
        if owner is None:
            rest += entry.raw_bytes if entry.kind != "relu_mask" else entry.nbytes
        elif entry.kind == "relu_mask":
            profiles[owner].masks += entry.nbytes
        else:
            profiles[owner].saved += entry.raw_bytes
            profiles[owner].shapes.append(entry.shape)
    _profile_times(model, run, names, profiles, device, repeats)
    timings: dict = {}
    bandwidth = _bandwidth(device) if swap else 0.0
    options = []
    for name in names:
        p = profiles[name]
        layer = [Option("keep", p.saved + p.masks, 0.0)]
        for b in widths:
            p.compressed[b] = sum(packed_nbytes(math.prod(s), b, DEFAULT_GROUP_SIZE)
                                  for s in p.shapes)
            p.compress_s[b] = _compress_time(p.shapes, b, device, timings)
            layer.append(Option(f"compress{b}", p.compressed[b] + p.masks, p.compress_s[b]))
        layer.append(Option("recompute", p.inputs, p.forward_s))
        if swap:
            narrow = min(widths)
            copy_s = 2 * p.compressed[narrow] / bandwidth
            layer.append(Option("swap", 0.0, p.compress_s[narrow]
                                + max(0.0, copy_s - 2 * p.forward_s)))
        options.append(_undominated(layer))
    try:
        chosen = solve(options, budget_bytes - rest)
    except InfeasibleBudget as error:  # name the budget of the whole context, not the blocks'
        raise InfeasibleBudget(budget_bytes, error.smallest + rest) from None
    choice = {name: options[i][c] for i, (name, c) in enumerate(zip(names, chosen,
                                                                      strict=True))}
    return Plan(model, [profiles[n] for n in names], options, choice, int(budget_bytes), rest,
                resident)
