"""The full-batch training loop's reporting: the test metric at the best validation epoch."""

from __future__ import annotations

import math

import torch
from torch_geometric.nn.models import GCN

from gnnact.data import synthetic_graph
from gnnact.training import train_full_batch


def test_nan_validation_metric_is_reported_not_hidden():
    """Multi-label targets whose validation columns hold one class only: ROC-AUC is NaN every
    epoch, so the run reports NaN, not a test metric of 0."""
    data = synthetic_graph(300, 6, 8, 3, seed=0)
    data.y = torch.zeros(data.num_nodes, 2, dtype=torch.long)
    data.y[data.train_mask, 0] = torch.arange(int(data.train_mask.sum())) % 2
    torch.manual_seed(0)
    result = train_full_batch(GCN(8, 16, num_layers=2, out_channels=2), data, epochs=2)
    assert math.isnan(result.test_acc) and math.isnan(result.best_val_acc)


def test_best_epoch_is_taken_even_at_zero_accuracy():
    """A validation metric of 0 still selects an epoch: the test metric is that epoch's."""
    data = synthetic_graph(300, 6, 8, 3, seed=0)
    data.y[data.val_mask] = 3  # a class the model has no output for: validation accuracy 0
    torch.manual_seed(0)
    result = train_full_batch(GCN(8, 16, num_layers=2, out_channels=3), data, epochs=3)
    assert result.best_val_acc == 0.0 and result.test_acc > 0.0
