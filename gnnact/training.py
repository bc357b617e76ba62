r"""Full-batch node classification: the training loop shared by the CLI and the benchmarks.

One epoch is a training step on the whole graph (forward, loss on the training nodes, backward,
optimizer step) followed by an evaluation pass. :func:`train_full_batch` reports the test metric
at the best validation epoch, the saved context of one forward pass
(:func:`gnnact.memory.saved_bytes`), the median step time and, on CUDA, the peak memory a step
allocates on top of what was resident before it.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Data
from torch_geometric.transforms import ToSparseTensor
from tqdm import tqdm

from gnnact.memory import saved_bytes

__all__ = ["RunResult", "adjacency", "evaluate", "loss_of", "metric_of", "model_inputs",
           "roc_auc", "train_full_batch", "with_layout"]


@dataclass
class RunResult:
    """What one training run measured.

    Args:
        test_acc (float): test metric at the best validation epoch (:func:`metric_of`:
            accuracy, or mean ROC-AUC for multi-label and binary ``rocauc`` targets, or OGB's
            Evaluator's), in [0, 1]; ``nan`` if the validation metric never was a number (a
            ROC-AUC with no split column holding both classes).
        best_val_acc (float): the best validation metric (``nan`` likewise).
        saved_bytes (int, optional): context the last training forward pass keeps for
            backward (at the widths automatic precision settled on), resident tensors (model,
            features, labels, graph) excluded; :obj:`None` when not measured.
        epoch_ms (float): median time of a training step (evaluation excluded), the first
            step (warm-up) left out.
        peak_bytes (int, optional): on CUDA, the most memory a step allocated beyond what was
            allocated before it (activations, gradients, temporaries); :obj:`None` on the CPU.

    Example:
        >>> from gnnact.training import RunResult
        >>> r = RunResult(test_acc=0.71, best_val_acc=0.73, saved_bytes=14056, epoch_ms=2.5,
        ...               peak_bytes=None)
        >>> f"{r.test_acc:.0%} with {r.saved_bytes:,} saved bytes"
        '71% with 14,056 saved bytes'
    """

    test_acc: float
    best_val_acc: float
    saved_bytes: int | None
    epoch_ms: float
    peak_bytes: int | None


def adjacency(data: Data) -> Any:
    r"""What models are called with as the graph: ``data.adj_t`` if the graph has one (PyG's
    convention after :class:`torch_geometric.transforms.ToSparseTensor`: a sparse
    :math:`\mathbf{A}^\top`, a ``torch.sparse_csr`` tensor or a ``SparseTensor``), else
    ``data.edge_index``.

    PyG's convolutions and gnnact's take either. With a sparse ``adj_t``, PyG aggregates by
    sparse-dense matrix products instead of gathering and scattering per edge, which is much
    faster on the CPU.

    Args:
        data (torch_geometric.data.Data): the graph.

    Returns:
        torch.Tensor or SparseTensor: ``data.adj_t`` or ``data.edge_index``.

    Example:
        >>> import torch_geometric.transforms as T
        >>> from gnnact.data import synthetic_graph
        >>> from gnnact.training import adjacency
        >>> data = synthetic_graph(500, 8, 16, 4, seed=0)
        >>> adjacency(data) is data.edge_index
        True
        >>> data = T.ToSparseTensor(layout=torch.sparse_csr)(data)
        >>> adjacency(data).layout
        torch.sparse_csr
    """
    adj_t = getattr(data, "adj_t", None)
    return adj_t if adj_t is not None else data.edge_index


def model_inputs(data: Any, edge_attrs: Sequence[str] = ()) -> tuple[tuple, dict[str, Tensor]]:
    r"""What the training loops call a model with on ``data``: ``(data.x, adjacency(data))``,
    and each edge attribute named in ``edge_attrs`` by keyword, as PyG's examples pass them
    (``model(x, edge_index, edge_weight=data.edge_weight)``; PyG's model classes take
    ``edge_weight`` and ``edge_attr`` so).

    Args:
        data (torch_geometric.data.Data): the graph (or a
            :class:`~gnnact.distributed.GraphShard`, whose edge attributes are its local edges').
        edge_attrs (sequence of str, optional): names of per-edge tensors of ``data`` to pass,
            one row per edge of ``data.edge_index``. (default: :obj:`()`)

    Returns:
        tuple[tuple, dict]: positional and keyword arguments.

    Raises:
        ValueError: a name that is not a per-edge tensor of ``data``, or edge attributes beside
            a sparse ``adj_t`` (whose values are the edge values).

    Example:
        >>> from gnnact.data import synthetic_graph
        >>> from gnnact.training import model_inputs
        >>> data = synthetic_graph(500, 8, 16, 4, seed=0)
        >>> data.edge_weight = torch.rand(data.num_edges)
        >>> args, kwargs = model_inputs(data, ["edge_weight"])
        >>> args[1] is data.edge_index, kwargs["edge_weight"] is data.edge_weight
        (True, True)
    """
    if isinstance(edge_attrs, str):
        raise TypeError(f"edge_attrs must be a sequence of names, got the string "
                        f"{edge_attrs!r} (write ({edge_attrs!r},))")
    adj = adjacency(data)
    kwargs: dict[str, Tensor] = {}
    for name in edge_attrs:
        if adj is not getattr(data, "edge_index", None):
            raise ValueError(f"edge_attrs={list(edge_attrs)!r} with a sparse adj_t: its values "
                             f"are the edge values; keep edge_index to pass {name!r}")
        value = getattr(data, name, None) if isinstance(name, str) else None
        if not isinstance(value, Tensor) or value.dim() == 0 or value.size(0) != adj.size(1):
            got = (f"{type(value).__name__}" if not isinstance(value, Tensor)
                   else f"a tensor of shape {tuple(value.shape)}")
            raise ValueError(f"edge_attrs: {name!r} must name a tensor of data with one row per "
                             f"edge ({adj.size(1)}), got {got}")
        kwargs[name] = value
    return (data.x, adj), kwargs


def with_layout(data: Data, *, adj: str = "edge_index", features: str = "dense") -> Data:
    r"""``data`` with the graph and features laid out for training.

    Args:
        data (torch_geometric.data.Data): the graph, with ``edge_index``.
        adj (str, optional): ``"edge_index"`` keeps it; ``"csr"`` replaces it by ``adj_t``, a
            ``torch.sparse_csr`` :math:`\mathbf{A}^\top` (PyG's
            :class:`~torch_geometric.transforms.ToSparseTensor`), which PyG's convolutions
            aggregate by sparse-dense products, several times faster on the CPU.
            (default: :obj:`"edge_index"`)
        features (str, optional): ``"dense"``, or ``"sparse"`` for ``x`` as a
            ``torch.sparse_csr`` matrix (bag-of-words features: the first layer's product
            then skips the zeros). (default: :obj:`"dense"`)

    Example:
        >>> from gnnact.data import synthetic_graph
        >>> data = with_layout(synthetic_graph(500, 8, 16, 4, seed=0), adj="csr")
        >>> adjacency(data).layout, "edge_index" in data
        (torch.sparse_csr, False)
    """
    if adj not in ("edge_index", "csr"):
        raise ValueError(f"adj must be 'edge_index' or 'csr', got {adj!r}")
    if features not in ("dense", "sparse"):
        raise ValueError(f"features must be 'dense' or 'sparse', got {features!r}")
    if features == "sparse":
        data = data.clone()
        data.x = data.x.to_sparse_csr()
    if adj == "csr":
        data = ToSparseTensor(layout=torch.sparse_csr)(data.clone())
    return data


def loss_of(model: nn.Module, data: Data, edge_attrs: Sequence[str] = ()) -> Tensor:
    r"""Cross-entropy on the training nodes; binary cross-entropy per task if ``y`` is
    ``[N, T]`` (multi-label: ogbn-proteins, Yelp).

    With :math:`\mathbf{Z} = \mathrm{model}(\mathbf{X}, \mathbf{A})` and :math:`\mathcal{T}`
    the training nodes,

    .. math::
        \mathcal{L} = -\frac{1}{|\mathcal{T}|} \sum_{i \in \mathcal{T}}
        \log \operatorname{softmax}(\mathbf{z}_i)_{y_i}

    (or the mean over nodes and tasks of the binary cross-entropy with logits).

    Args:
        model (torch.nn.Module): called as ``model(data.x, adjacency(data))``
            (:func:`adjacency`: ``data.adj_t`` if present, else ``data.edge_index``), with the
            ``edge_attrs`` by keyword (:func:`model_inputs`), returning logits of shape
            ``[N, C]`` (or ``[N, T]``).
        data (torch_geometric.data.Data): with ``x``, ``edge_index`` or ``adj_t``, ``y``
            (``[N]`` class indices, or ``[N, T]`` binary targets) and ``train_mask``.
        edge_attrs (sequence of str, optional): edge attributes of ``data`` passed to the
            model by keyword, e.g. ``("edge_weight",)``. (default: :obj:`()`)

    Returns:
        torch.Tensor: the 0-d loss, with its autograd graph.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> from gnnact.data import synthetic_graph
        >>> from gnnact.training import loss_of
        >>> data = synthetic_graph(500, 8, 16, 4, seed=0)
        >>> model = gnnact.convert(GCN(16, 32, num_layers=2, out_channels=4))
        >>> loss = loss_of(model, data)
        >>> loss.shape
        torch.Size([])
        >>> loss.backward()
    """
    args, kwargs = model_inputs(data, edge_attrs)
    out = model(*args, **kwargs)[data.train_mask]
    if data.y.dim() == 2:
        return F.binary_cross_entropy_with_logits(out, data.y[data.train_mask].float())
    return F.cross_entropy(out, data.y[data.train_mask])


def _accuracy(out: Tensor, y: Tensor) -> float:
    return (out.argmax(dim=-1) == y).float().mean().item()


def _roc_auc_of_logits(out: Tensor, y: Tensor) -> float:
    # A binary target [n] against two logits per node: the positive class's log-odds rank the
    # nodes exactly as its softmax probability does, without saturating to ties.
    if y.dim() == 1 and out.dim() == 2:
        if out.size(1) == 2:
            out = out[:, 1] - out[:, 0]
        elif out.size(1) == 1:
            out = out[:, 0]
    return roc_auc(out, y)


def _ogb_metric(name: str) -> Callable[[Tensor, Tensor], float]:
    from gnnact.data.datasets import _import_ogb

    evaluator = _import_ogb("nodeproppred", f"data.metric={name!r}").Evaluator(name)
    key = evaluator.eval_metric

    def score(out: Tensor, y: Tensor) -> float:
        if key == "acc":  # OGB wants [n, 1] labels and [n, 1] predicted classes
            inputs = {"y_true": y.view(-1, 1), "y_pred": out.argmax(dim=-1, keepdim=True)}
        else:
            both = (y == 1).any(0) & (y == 0).any(0)
            if not bool(both.any()):  # OGB raises here; gnnact's contract is NaN
                return math.nan
            inputs = {"y_true": y, "y_pred": out}
        return float(evaluator.eval({k: v.detach().cpu() for k, v in inputs.items()})[key])

    return score


def metric_of(data: Data) -> Callable[[Tensor, Tensor], float]:
    r"""The metric :func:`evaluate` scores ``data`` by, as ``(out, y) -> float`` on the rows of
    one split, chosen by ``data.metric`` (set by :func:`gnnact.data.load_dataset`):

    * ``"acc"``: accuracy of ``out.argmax(-1)``;
    * ``"rocauc"``: :func:`roc_auc`, the mean over tasks of ``[n, T]`` targets, or of a binary
      ``[n]`` target against two logits (scored by their difference);
    * an OGB dataset name such as ``"ogbn-arxiv"``: that dataset's
      ``ogb.nodeproppred.Evaluator``, so that OGB results are OGB's own numbers. Without the
      ``ogb`` package this raises :class:`ImportError` rather than fall back on gnnact's
      metric (loading an OGB dataset needs ogb too).

    Without ``data.metric``: ``"rocauc"`` if ``data.y`` is ``[N, T]``, else ``"acc"``.

    Args:
        data (torch_geometric.data.Data): the graph, with ``y``.

    Returns:
        callable: ``(out, y) -> float``.

    Raises:
        ValueError: ``data.metric`` is none of the above.
        ImportError: scikit-learn (``"rocauc"``) or ogb (OGB names) is not installed; raised
            here, before any training.

    Example:
        >>> from gnnact.data import synthetic_graph
        >>> from gnnact.training import metric_of
        >>> data = synthetic_graph(100, 4, 8, 3, seed=0)
        >>> metric_of(data)(torch.eye(3)[data.y], data.y)  # one-hot of the labels
        1.0
    """
    name = getattr(data, "metric", None)
    if name is None:
        name = "rocauc" if data.y.dim() == 2 else "acc"
    if name == "acc":
        return _accuracy
    if name == "rocauc":
        _roc_auc_score()  # fail now, not after the first epoch, if scikit-learn is absent
        return _roc_auc_of_logits
    if isinstance(name, str) and name.startswith("ogbn-"):
        return _ogb_metric(name)
    raise ValueError(f"data.metric must be 'acc', 'rocauc' or an OGB dataset name such as "
                     f"'ogbn-arxiv', got {name!r}")


@torch.no_grad()
def evaluate(model: nn.Module, data: Data,
             metric: Callable[[Tensor, Tensor], float] | None = None,
             edge_attrs: Sequence[str] = ()) -> tuple[float, float]:
    """Validation and test metric (:func:`metric_of`: accuracy, mean ROC-AUC over tasks, or
    OGB's Evaluator for OGB datasets). Runs one forward pass under :func:`torch.no_grad` and
    leaves ``model`` in evaluation mode.

    Args:
        model (torch.nn.Module): called as ``model(data.x, adjacency(data))``, with the
            ``edge_attrs`` by keyword.
        data (torch_geometric.data.Data): with ``x``, ``edge_index`` or ``adj_t``, ``y``,
            ``val_mask`` and ``test_mask``.
        metric (callable, optional): ``(out, y) -> float``; :obj:`None`:
            ``metric_of(data)``. (default: :obj:`None`)
        edge_attrs (sequence of str, optional): edge attributes of ``data`` passed to the
            model by keyword (:func:`model_inputs`). (default: :obj:`()`)

    Returns:
        tuple[float, float]: ``(validation metric, test metric)``, each in [0, 1].

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> from gnnact.data import synthetic_graph
        >>> from gnnact.training import evaluate
        >>> data = synthetic_graph(500, 8, 16, 4, seed=0)
        >>> val_acc, test_acc = evaluate(GCN(16, 32, num_layers=2, out_channels=4), data)
        >>> 0.0 <= val_acc <= 1.0 and 0.0 <= test_acc <= 1.0
        True
    """
    metric = metric or metric_of(data)
    model.eval()
    args, kwargs = model_inputs(data, edge_attrs)
    out = model(*args, **kwargs)
    return (metric(out[data.val_mask], data.y[data.val_mask]),
            metric(out[data.test_mask], data.y[data.test_mask]))


def _roc_auc_score() -> Callable:
    # scikit-learn is not a dependency of gnnact: it comes with the [ogb] extra (ogb needs it),
    # which the multi-label ogbn-proteins needs anyway.
    try:
        from sklearn.metrics import roc_auc_score
    except ImportError as error:
        raise ImportError("ROC-AUC needs scikit-learn: pip install scikit-learn (or "
                          "'gnnact[ogb]', which brings it)") from error
    return roc_auc_score


def roc_auc(score: Tensor, target: Tensor) -> float:
    r"""Mean over tasks (columns having both classes, as OGB's evaluator) of the ROC-AUC, by
    scikit-learn's :func:`~sklearn.metrics.roc_auc_score`: tied scores count one half, so
    all-tied scores give 0.5.

    Args:
        score (torch.Tensor): scores (logits or probabilities), ``[n, T]`` (or ``[n]`` for one
            task, such as a binary dataset's positive-class log-odds).
        target (torch.Tensor): binary targets of the same shape (0/1 or boolean).

    Returns:
        float: the mean ROC-AUC, or ``nan`` if no column has both classes.

    Raises:
        ValueError: ``score`` and ``target`` differ in shape, or ``target`` is not 0/1.
        ImportError: scikit-learn is not installed.

    Example:
        >>> from gnnact.training import roc_auc
        >>> roc_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), torch.tensor([0, 0, 1, 1]))
        0.75
        >>> score = torch.tensor([[0.1, 0.9], [0.4, 0.2], [0.8, 0.7]])
        >>> roc_auc(score, torch.tensor([[0, 1], [0, 1], [1, 1]]))  # column 1: no negative
        1.0
        >>> roc_auc(torch.zeros(4), torch.tensor([0, 1, 0, 1]))  # all tied
        0.5
    """
    if score.shape != target.shape:
        raise ValueError(f"score and target must have the same shape, got "
                         f"{tuple(score.shape)} and {tuple(target.shape)}")
    if not bool(((target == 0) | (target == 1)).all()):
        raise ValueError(f"target must be binary (0/1), got values "
                         f"{target.unique().tolist()[:5]}")
    roc_auc_score = _roc_auc_score()
    scores = score.detach().double().cpu().reshape(score.size(0), -1).numpy()
    targets = target.detach().cpu().reshape(target.size(0), -1).bool().numpy()
    aucs = [roc_auc_score(targets[:, j], scores[:, j]) for j in range(targets.shape[1])
            if targets[:, j].any() and not targets[:, j].all()]
    return float(sum(aucs) / len(aucs)) if aucs else math.nan


def train_full_batch(model: nn.Module, data: Data, *, epochs: int, lr: float = 0.01,
                     weight_decay: float = 0.0,
                     step_context: Callable[[], AbstractContextManager] | None = None,
                     before_step: Callable[[], object] | None = None,
                     measure_saved: bool = True, progress: str | None = None,
                     edge_attrs: Sequence[str] = ()) -> RunResult:
    """Train ``model`` on ``data`` (both on one device) with Adam for ``epochs`` epochs.

    Each epoch: one training step on the whole graph (:func:`loss_of`, backward, optimizer
    step), then :func:`evaluate`; the test metric is reported at the best validation epoch
    (the first of equals; ``nan`` if no validation metric was a number).

    Args:
        model (torch.nn.Module): called as ``model(data.x, adjacency(data))``, with the
            ``edge_attrs`` by keyword.
        data (torch_geometric.data.Data): the graph, as :func:`gnnact.data.load_dataset`
            returns it.
        epochs (int): number of epochs.
        lr (float, optional): Adam's learning rate. (default: :obj:`0.01`)
        weight_decay (float, optional): Adam's weight decay. (default: :obj:`0.0`)
        step_context (callable, optional): returns a context manager entered around each
            training forward pass (autocast, ``save_on_cpu``, ``lambda: hooks`` for a
            :class:`gnnact.compress_saved_tensors`, ...). (default: :obj:`None`)
        before_step (callable, optional): called before each training step, outside the
            timing (e.g. ``lambda: controller.adapt(closure)`` for adaptive bits).
            (default: :obj:`None`)
        measure_saved (bool, optional): walk the autograd graph of the last step for
            :attr:`RunResult.saved_bytes` (off for methods whose saved tensors must not be
            unpacked outside backward, such as checkpointing). (default: :obj:`True`)
        progress (str, optional): show a progress bar with this description; :obj:`None`:
            no bar. (default: :obj:`None`)
        edge_attrs (sequence of str, optional): edge attributes of ``data`` passed to the
            model by keyword, e.g. ``("edge_weight",)`` for a model written
            ``forward(self, x, edge_index, edge_weight)`` (:func:`model_inputs`); they stay
            resident like ``data.x``. (default: :obj:`()`)

    Returns:
        RunResult: what the run measured.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> from gnnact.data import synthetic_graph
        >>> from gnnact.training import train_full_batch
        >>> data = synthetic_graph(500, 8, 16, 4, seed=0)
        >>> model = gnnact.convert(GCN(16, 32, num_layers=2, out_channels=4))
        >>> result = train_full_batch(model, data, epochs=5)
        >>> result.saved_bytes > 0, result.peak_bytes  # peak_bytes: CUDA only
        (True, None)
    """
    device = data.x.device
    cuda = device.type == "cuda"
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    edges = model_inputs(data, edge_attrs)[1]  # checked before the first epoch
    resident = [model, data.x, data.y, adjacency(data), *edges.values()]
    context = step_context or contextlib.nullcontext
    metric = metric_of(data)  # once: OGB's Evaluator reads its table of datasets
    # A NaN validation metric never wins; if every one is NaN, both results are NaN rather than
    # a made-up 0.
    best_val, test_at_best = -math.inf, math.nan
    measured: int | None = None
    peak: int | None = None
    times: list[float] = []
    bar = tqdm(range(epochs), desc=progress, unit="epoch", file=sys.stderr,
               disable=progress is None, leave=False)
    for epoch in bar:
        model.train()
        if before_step is not None:
            before_step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            base = torch.cuda.memory_allocated(device)
        start = time.perf_counter()
        with context():
            loss = loss_of(model, data, edge_attrs)
        if measure_saved and epoch == epochs - 1:
            pause = time.perf_counter()
            measured = saved_bytes(loss, exclude=resident)
            start += time.perf_counter() - pause
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize(device)
            step_peak = torch.cuda.max_memory_allocated(device) - base
            peak = step_peak if peak is None else max(peak, step_peak)
        times.append(time.perf_counter() - start)

        val, test = evaluate(model, data, metric, edge_attrs)
        if val > best_val:
            best_val, test_at_best = val, test
        bar.set_postfix(loss=f"{loss.item():.3f}", val=f"{val:.3f}")
    bar.close()
    steady = times[1:] if len(times) > 1 else times
    if best_val == -math.inf:
        best_val = math.nan
    return RunResult(test_acc=test_at_best, best_val_acc=best_val, saved_bytes=measured,
                     epoch_ms=1e3 * statistics.median(steady), peak_bytes=peak)
