r"""``gnnact.summary``: every module of a converted model, how its context is kept, and how
many bytes it kept in the last training step."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn
from torch_geometric.nn import MessagePassing

from gnnact.compress.policy import within
from gnnact.nn._base import _Compressed
from gnnact.nn.chunked import _Chunks
from gnnact.nn.conv.base import CompressedConv
from gnnact.nn.scope import scope_of

__all__ = ["Summary", "SummaryRow", "TensorRow", "summary"]


@dataclass(frozen=True)
class SummaryRow:
    r"""One module of a :class:`Summary`.

    Args:
        path (str): its path in the model (``""`` for the model itself).
        type (str): its class name.
        handling (str): ``"twin"`` (a gnnact layer: its own compressed ops), ``"generic"``
            (PyTorch's and PyG's ops through the scope's saved-tensor pipeline, functional
            activations and dropout as 1-bit masks; also a twin that takes PyG's own forward,
            for a registered PyG hook, say), ``"exempt"`` (everything it saved was kept exact
            on purpose: the softmax head, or ``bits=32``), ``"none"`` (saved nothing in the
            last step), or ``"pytorch"`` (the last step, or the pass of the step that ran
            it, ran as PyTorch's, every tensor under ``min_bytes``:
            :meth:`gnnact.nn.scope.Scope.small_pass`).
        bits (int): the width its activations are kept at (with automatic widths, the widest
            of its tensors').
        nbytes (int or None): bytes of the context it saved in the last training step (its
            own, not its submodules'); ``None`` before the first one, or where it ran as
            PyTorch's.
        messages (str, optional): for a message-passing layer, how its edge messages were
            made in its last call: ``"fused"`` (a twin's compressed path: none, or edge
            chunks inside its op), ``"k pieces"`` (:mod:`gnnact.nn.chunked`), ``"whole"``
            (an :math:`E \times F` tensor at once), ``"–"`` before the first call; ``""``
            for other modules. (default: ``""``)
    """

    path: str
    type: str
    handling: str
    bits: int
    nbytes: int | None
    messages: str = ""


@dataclass(frozen=True)
class TensorRow:
    r"""One compressed tensor of a :class:`Summary` (see :mod:`gnnact.adaptive.auto`).

    Args:
        name (str): ``"<module path>:<role or index>"``.
        values (int): values quantized under the name in the last probe step.
        bits (int): its width.
        ratio (float or None): its rounding noise against the gradient it feeds, at
            ``bits`` (:mod:`gnnact.ops.probe`); ``None`` before a probe measured it.
        reason (str): why it has its width.
    """

    name: str
    values: int
    bits: int
    ratio: float | None
    reason: str


@dataclass(frozen=True)
class Summary:
    """The result of :func:`summary`: one :class:`SummaryRow` per module, the totals of the
    last training step (``None`` before the first one) and, once a probe step has measured
    them, one :class:`TensorRow` per compressed tensor with its width and noise ratio;
    ``small``: the tensors the last step kept as they are for their size (fewer bytes than
    ``min_bytes``, :attr:`Config.min_bytes <gnnact.Config>`) and their bytes, part of
    ``context``; ``as_pytorch``: the last step ran as PyTorch's; ``min_pass_savings``: the
    least a step's compression must save, or it runs as PyTorch's (:meth:`Config.min_savings
    <gnnact.Config.min_savings>`; 0: no such rule); ``passes``: the forward passes of the
    step, counted together (a model used through its children makes several, GAE's
    ``encode`` and then its decoder, and so does a model called twice before backward);
    ``pytorch_paths``: the modules whose passes ran as PyTorch's."""

    rows: tuple[SummaryRow, ...]
    context: int | None
    graph_cache: int | None
    tensors: tuple[TensorRow, ...] = ()
    average_bits: float | None = None
    small: tuple[int, int] = (0, 0)
    min_bytes: int = 0
    as_pytorch: bool = False
    min_pass_savings: int = 0
    passes: int = 1
    pytorch_paths: tuple[str, ...] = ()

    def __str__(self) -> str:
        width = max([len("module")] + [len(r.path or "(model)") for r in self.rows])
        kind = max([len("type")] + [len(r.type) for r in self.rows])
        lines = [f"{'module':{width}s}  {'type':{kind}s}  {'handling':8s}  {'bits':>4s}  "
                 f"{'kept (last step)':>16s}  messages"]
        for r in self.rows:
            kept = "–" if r.nbytes is None else _size(r.nbytes)
            lines.append(f"{r.path or '(model)':{width}s}  {r.type:{kind}s}  {r.handling:8s}  "
                         f"{r.bits:4d}  {kept:>16s}  {r.messages}".rstrip())
        if self.context is None:
            lines.append("no training step yet: run one forward pass in training to measure")
        else:
            lines.append(f"context {_size(self.context)}, graph cache "
                         f"{_size(self.graph_cache or 0)}, total "
                         f"{_size(self.context + (self.graph_cache or 0))}")
            if self.small[0]:
                lines.append(f"kept as is for their size: {self.small[0]} tensors, "
                             f"{_size(self.small[1])} (min_bytes {_size(self.min_bytes)})")
            if self.as_pytorch:
                why = ("every tensor under min_bytes" if not self.min_pass_savings else
                       f"compression saved under min_pass_savings "
                       f"({_size(self.min_pass_savings)}), or every tensor was under "
                       f"min_bytes")
                lines.append(f"the last step ran as PyTorch's: {why}, as a full step on "
                             f"inputs as large found")
            elif self.pytorch_paths:
                names = ", ".join(p or "(model)" for p in self.pytorch_paths)
                lines.append(f"passes run as PyTorch's (as a full pass on inputs as large "
                             f"found): {names}")
            if self.passes > 1:
                lines.append(f"the last step made {self.passes} forward passes before its "
                             f"backward, counted together")
        if self.tensors:
            width = max(len("tensor"), *(len(t.name) for t in self.tensors))
            lines.append("")
            lines.append(f"{'tensor':{width}s}  {'values':>10s}  {'bits':>4s}  {'noise':>8s}  why")
            for t in self.tensors:
                ratio = "–" if t.ratio is None else f"{t.ratio:.2g}"
                lines.append(f"{t.name:{width}s}  {t.values:10,d}  {t.bits:4d}  {ratio:>8s}  "
                             f"{t.reason}")
            if self.average_bits is not None:
                lines.append(f"{self.average_bits:.2f} bits per value on average")
        return "\n".join(lines)


def _messages(module: nn.Module, pyg_path: bool) -> str:
    """How a message-passing layer made its edge messages in its last call (see
    :class:`SummaryRow`); ``pyg_path``: a twin that runs PyG's own forward."""
    if not isinstance(module, MessagePassing):
        return ""
    if isinstance(module, CompressedConv) and not pyg_path:
        return "fused"
    chunks = module.__dict__.get("propagate")
    if not isinstance(chunks, _Chunks):
        return "whole"
    if chunks.last_chunks is None:
        return "–"
    return f"{chunks.last_chunks} pieces" if chunks.last_chunks > 1 else "whole"


def _size(nbytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def summary(model: nn.Module) -> Summary:
    r"""Every module of a model converted by :func:`gnnact.convert`, how gnnact keeps its
    context (twin, generic pipeline, exempt) and at how many bits, the bytes each kept in the
    last training forward pass, with the graph cache on its own line, and for message-passing
    layers how their edge messages were made (a layer that made them whole says so).

    Args:
        model (torch.nn.Module): the converted model (the one :func:`gnnact.convert` was
            given).

    Returns:
        Summary: printable; ``rows``, ``context`` and ``graph_cache`` hold the figures.

    Raises:
        ValueError: if ``model`` was not converted.

    Example:
        >>> import torch.nn.functional as F
        >>> from torch_geometric.nn import GCNConv, GraphConv
        >>> class Net(torch.nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv1, self.conv2 = GCNConv(16, 32), GraphConv(32, 4)
        ...     def forward(self, x, edge_index):
        ...         x = F.dropout(F.relu(self.conv1(x, edge_index)), training=self.training)
        ...         return self.conv2(x, edge_index)
        >>> model = gnnact.convert(Net(), gnnact.Config(bits=2, min_bytes=0))
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 400))
        >>> model(x, edge_index).sum().backward()
        >>> print(gnnact.summary(model))  # doctest: +ELLIPSIS
        module             type            handling  bits  kept (last step)  messages
        (model)            Net             generic      2             800 B
        conv1              GCNConv         twin         2               0 B  fused
        conv1.aggr_module  SumAggregation  none         2               0 B
        conv1.lin          Linear          none         2               0 B
        conv2              GraphConv       none         2               0 B  whole
        conv2.aggr_module  SumAggregation  none         2               0 B
        conv2.lin_rel      Linear          generic      2             952 B
        conv2.lin_root     Linear          generic      2             952 B
        context 2.7 kB, graph cache ... kB, total ... kB

    The model's own 800 bytes are the 1-bit masks of ``F.relu`` and ``F.dropout``; ``conv1``
    keeps nothing (its input, the caller's ``x``, is kept by reference, and its aggregation
    needs only the graph) and makes no edge messages; ``GraphConv`` has no twin, its two
    linear maps keep their inputs at 2 bits through the generic pipeline, and it made its
    :math:`400 \times 32` messages whole (they are far under
    :data:`gnnact.nn.chunked.MIN_MESSAGE_BYTES`). ``min_bytes=0`` compresses this toy graph's
    tensors; by default each, under 256 KiB, would be kept as it is, and a last line would
    count them (``kept as is for their size: … tensors, … (min_bytes 262.1 kB)``; a tensor
    of fewer than 4,096 values is kept so whatever the floor).
    """
    scope = scope_of(model)
    if scope is None:
        raise ValueError(f"model ({type(model).__name__}) was not converted: call "
                         f"gnnact.convert(model) first")
    record = scope.last
    saved: dict[str, list[str]] = {}  # module path -> kinds of its generic tensors
    if record is not None:
        for name, entry in record.tensors.items():
            saved.setdefault(name.rsplit(":", 1)[0], []).append(entry.kind)
    # With automatic widths a module's tensors each have their own: the widest is shown.
    widest: dict[str, int] = {}
    if scope.auto is not None and scope.auto.adapt:
        for t in scope.auto.tensors.values():
            tag = t.name.rsplit(":", 1)[0]
            widest[tag] = max(widest.get(tag, 0), t.bits)
    rows = []
    for path, module in model.named_modules():
        nbytes = None if record is None else record.bytes_by_module.get(path, 0)
        kinds = saved.get(path, [])
        # A twin that takes PyG's own forward (a hook registered, an aggregation without a
        # compressed path, ...) saves through the generic pipeline instead of its ops, and
        # makes PyG's messages.
        pyg_path = isinstance(module, CompressedConv) and (
            module._takes_pyg_path() or module._compressed_reduce() is None)
        if isinstance(module, _Compressed):
            bits = module.config.width
            generic = pyg_path or any(kind != "exact" for kind in kinds)
            handling = "generic" if generic else "twin"
        else:
            bits = scope.config.width
            if kinds and all(kind == "exact" for kind in kinds):
                handling = "exempt"
            elif record is not None and not nbytes and not kinds:
                handling = "none"
            else:
                handling = "generic"
        if record is not None and (record.as_pytorch or any(
                not p or within(path, p) for p in record.pytorch_paths)):
            handling, nbytes = "pytorch", None  # (no module tracking in such a pass)
        bits = widest.get(path or "<model>", bits)
        rows.append(SummaryRow(path, type(module).__name__, handling, bits, nbytes,
                               _messages(module, pyg_path)))
    tensors: tuple[TensorRow, ...] = ()
    average = None
    if scope.auto is not None:
        tensors = tuple(TensorRow(t.name, t.numel, t.bits, t.ratio, t.reason)
                        for t in scope.auto.tensors.values())
        average = scope.auto.average_bits
    if record is None:
        return Summary(tuple(rows), None, None, tensors, average)
    return Summary(tuple(rows), record.context, record.graph_cache, tensors, average,
                   record.small, record.floor, record.as_pytorch, record.min_savings,
                   record.passes, record.pytorch_paths)
