r"""Full-batch node classification on a partitioned graph: the epoch of
:func:`gnnact.training.train_full_batch` (a training step, then an evaluation pass) run by
every rank on its shard.

Each training step is the recipe of :class:`~gnnact.distributed.DistributedGNN`: the local loss
sum over the owned training nodes divided by the global count, backward (which sends the halo
gradients back), :meth:`~gnnact.distributed.DistributedGNN.all_reduce_gradients`, Adam's step.
The evaluation gathers the validation and test rows' logits of all ranks and scores them with
the metric of the whole graph (:func:`gnnact.training.metric_of`), so every rank reports the
single-process numbers of the model it holds.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from gnnact.distributed.model import DistributedGNN
from gnnact.memory import saved_bytes
from gnnact.training import RunResult, metric_of, model_inputs

__all__ = ["PartitionedRunResult", "train_partitioned"]


@dataclass
class PartitionedRunResult(RunResult):
    """:class:`gnnact.training.RunResult` of one rank, with its halo traffic.

    ``test_acc`` and ``best_val_acc`` are the whole graph's (the same on every rank);
    ``saved_bytes`` and ``epoch_ms`` are this rank's.

    Args:
        test_acc (float): the whole graph's test metric at the best validation epoch.
        best_val_acc (float): the whole graph's best validation metric.
        saved_bytes (int, optional): this rank's saved context after the first forward pass
            (model, features, labels and local edges excluded); :obj:`None` when not measured.
        epoch_ms (float): this rank's median training step time, the first step left out.
        peak_bytes (int, optional): :obj:`None` (the ranks run on the CPU).
        exchanged_bytes (int): halo payload bytes this rank sent in one training step
            (features forward plus gradients backward, all convs; the last step's).
        world_size (int): the number of ranks.

    Example:
        >>> r = gnnact.distributed.PartitionedRunResult(0.9, 0.91, 14056, 2.5, None, 4096, 2)
        >>> f"{r.test_acc:.0%}, {r.exchanged_bytes:,} bytes sent per step"
        '90%, 4,096 bytes sent per step'
    """

    exchanged_bytes: int
    world_size: int


def _local_loss(out: Tensor, y: Tensor, mask: Tensor, count: int) -> Tensor:
    r""":math:`\mathcal{L}_r`: the sum over this rank's training rows divided by the global count
    (:func:`gnnact.training.loss_of`'s mean, split over the ranks; multi-label targets are also
    divided by their number of tasks, as the mean over nodes and tasks)."""
    out, y = out[mask], y[mask]
    if y.dim() == 2:
        loss = F.binary_cross_entropy_with_logits(out, y.float(), reduction="sum")
        return loss / (count * y.size(1))
    return F.cross_entropy(out, y, reduction="sum") / count


@torch.no_grad()
def _evaluate(model: DistributedGNN, metric: Callable[[Tensor, Tensor], float],
              edge_attrs: Sequence[str]) -> tuple[float, float]:
    """Validation and test metric of the whole graph: every rank's rows gathered, then scored
    once (ROC-AUC and OGB's Evaluator do not split into per-rank sums)."""
    shard = model.shard
    model.eval()
    args, kwargs = model_inputs(shard, edge_attrs)
    out = model(*args, **kwargs)
    masks = (shard.val_mask, shard.test_mask)
    mine = [(out[m], shard.y[m]) for m in masks]
    gathered: list = [None] * dist.get_world_size(model.group)
    dist.all_gather_object(gathered, mine, group=model.group)
    return tuple(metric(torch.cat([r[i][0] for r in gathered]),  # type: ignore[return-value]
                        torch.cat([r[i][1] for r in gathered])) for i in range(2))


def train_partitioned(model: DistributedGNN, *, epochs: int, lr: float = 0.01,
                      weight_decay: float = 0.0,
                      metric: Callable[[Tensor, Tensor], float] | None = None,
                      measure_saved: bool = True, progress: str | None = None,
                      edge_attrs: Sequence[str] = ()) -> PartitionedRunResult:
    r"""Train a :class:`~gnnact.distributed.DistributedGNN` on its shard with Adam for
    ``epochs`` epochs; collective (every rank of the model's group calls it).

    Each epoch: one training step (local loss sum / global count, backward,
    :meth:`~gnnact.distributed.DistributedGNN.all_reduce_gradients`, optimizer step), then the
    validation and test metric of the whole graph; the test metric is reported at the best
    validation epoch, as :func:`gnnact.training.train_full_batch` does. At 32-bit exchange and
    without dropout the run is the single-process run up to float summation order; dropout
    draws its masks per rank.

    Args:
        model (DistributedGNN): the wrapped model; its shard holds ``x``, ``y``,
            ``train_mask``, ``val_mask`` and ``test_mask``.
        epochs (int): number of epochs.
        lr (float, optional): Adam's learning rate. (default: :obj:`0.01`)
        weight_decay (float, optional): Adam's weight decay. (default: :obj:`0.0`)
        metric (callable, optional): ``(out, y) -> float``, e.g.
            ``gnnact.training.metric_of(data)`` of the whole graph (which knows
            ``data.metric``); :obj:`None`: accuracy, or ROC-AUC for ``[N, T]`` targets.
            (default: :obj:`None`)
        measure_saved (bool, optional): walk the first step's autograd graph for this rank's
            saved context. (default: :obj:`True`)
        progress (str, optional): a progress bar with this description on the group's rank 0;
            :obj:`None`: none. (default: :obj:`None`)
        edge_attrs (sequence of str, optional): edge attributes of the shard passed to the
            model by keyword, e.g. ``("edge_weight",)`` (the shard's own, its local edges'
            values: :func:`gnnact.training.model_inputs`). (default: :obj:`()`)

    Returns:
        PartitionedRunResult: this rank's.

    Example:
        >>> # in each of k processes, after torch.distributed.init_process_group("gloo", ...)
        >>> dmodel = DistributedGNN(model, shard_graph(data), exchange_bits=2)  # doctest: +SKIP
        >>> result = train_partitioned(dmodel, epochs=50, metric=metric_of(data))
        ... # doctest: +SKIP
        >>> result.test_acc, result.exchanged_bytes  # doctest: +SKIP
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be a positive int, got {epochs!r}")
    if not isinstance(model, DistributedGNN):
        raise TypeError(f"model must be a DistributedGNN, got {type(model).__name__}")
    shard = model.shard
    metric = metric or metric_of(shard)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    mask = shard.train_mask
    count = model.global_count(mask)
    args, kwargs = model_inputs(shard, edge_attrs)
    resident = [model, shard.x, shard.y, shard.edge_index, *kwargs.values()]
    best_val, test_at_best = -math.inf, math.nan  # as train_full_batch: NaN never wins
    measured: int | None = None
    times: list[float] = []
    sent = 0
    rank0 = dist.get_rank(model.group) == 0
    bar = tqdm(range(epochs), desc=progress, unit="epoch", file=sys.stderr,
               disable=progress is None or not rank0, leave=False)
    for epoch in bar:
        model.train()
        optimizer.zero_grad(set_to_none=True)
        model.exchange.reset_stats()
        start = time.perf_counter()
        loss = _local_loss(model(*args, **kwargs), shard.y, mask, count)
        if measure_saved and epoch == 0:
            pause = time.perf_counter()
            measured = saved_bytes(loss, exclude=resident)
            start += time.perf_counter() - pause
        loss.backward()
        model.all_reduce_gradients()
        optimizer.step()
        times.append(time.perf_counter() - start)
        sent = model.exchange.stats.total_bytes

        val, test = _evaluate(model, metric, edge_attrs)
        if val > best_val:
            best_val, test_at_best = val, test
        bar.set_postfix(val=f"{val:.3f}")
    bar.close()
    steady = times[1:] if len(times) > 1 else times
    return PartitionedRunResult(
        test_acc=test_at_best, best_val_acc=math.nan if best_val == -math.inf else best_val,
        saved_bytes=measured, epoch_ms=1e3 * statistics.median(steady), peak_bytes=None,
        exchanged_bytes=sent, world_size=dist.get_world_size(model.group))
