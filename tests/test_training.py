"""The full-batch training loop's reporting: the test metric at the best validation epoch, and
the metrics (accuracy, ROC-AUC as scikit-learn's)."""

from __future__ import annotations

import math
import sys

import pytest
import torch
from torch_geometric.nn.models import GCN

from gnnact.data import synthetic_graph
from gnnact.training import evaluate, metric_of, roc_auc, train_full_batch


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


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_matches_sklearn_with_ties(seed):
    metrics = pytest.importorskip("sklearn.metrics")
    gen = torch.Generator().manual_seed(seed)
    # Scores on a coarse grid: many ties, within and across classes.
    score = torch.randint(0, 5, (200, 4), generator=gen).double() / 4
    target = torch.randint(0, 2, (200, 4), generator=gen)
    expected = sum(metrics.roc_auc_score(target[:, j].numpy(), score[:, j].numpy())
                   for j in range(4)) / 4
    assert roc_auc(score, target) == pytest.approx(expected, abs=1e-12)
    assert roc_auc(score[:, 0], target[:, 0].bool()) == pytest.approx(
        metrics.roc_auc_score(target[:, 0].numpy(), score[:, 0].numpy()), abs=1e-12)


def test_roc_auc_all_tied_is_one_half_and_one_class_columns_skipped():
    target = torch.tensor([[0, 1], [1, 1], [0, 1], [1, 1]])
    assert roc_auc(torch.zeros(4, 2), target) == 0.5  # column 1 has no negative: left out
    assert math.isnan(roc_auc(torch.rand(4), torch.ones(4)))


def test_roc_auc_bad_input_named():
    with pytest.raises(ValueError, match=r"same shape, got \(4,\) and \(4, 1\)"):
        roc_auc(torch.rand(4), torch.ones(4, 1))
    with pytest.raises(ValueError, match="target must be binary"):
        roc_auc(torch.rand(3), torch.tensor([0, 1, 2]))


def test_roc_auc_without_sklearn_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sklearn.metrics", None)
    with pytest.raises(ImportError, match="pip install scikit-learn"):
        roc_auc(torch.rand(4), torch.tensor([0, 1, 0, 1]))
    data = synthetic_graph(50, 4, 8, 2, seed=0)
    data.metric = "rocauc"
    with pytest.raises(ImportError, match="scikit-learn"):  # before any training
        metric_of(data)


def test_binary_rocauc_metric_scores_the_positive_log_odds():
    """A binary dataset with ``metric="rocauc"`` (tolokers) is scored by the ROC-AUC of the
    difference of its two logits, which ranks nodes as the softmax probability does."""
    metrics = pytest.importorskip("sklearn.metrics")
    data = synthetic_graph(300, 6, 8, 2, seed=0)
    data.metric = "rocauc"
    torch.manual_seed(0)
    model = GCN(8, 16, num_layers=2, out_channels=2)
    val, test = evaluate(model, data)
    with torch.no_grad():
        prob = model(data.x, data.edge_index).softmax(-1)[:, 1]
    for value, mask in ((val, data.val_mask), (test, data.test_mask)):
        expected = metrics.roc_auc_score(data.y[mask].numpy(), prob[mask].numpy())
        assert value == pytest.approx(expected, abs=1e-6)


def test_metric_without_data_metric_follows_the_target_shape():
    data = synthetic_graph(50, 4, 8, 2, seed=0)
    logits = torch.tensor([[2.0, 1.0], [0.0, 1.0], [3.0, 0.0]])
    assert metric_of(data)(logits, torch.tensor([0, 0, 0])) == pytest.approx(2 / 3)  # accuracy
    data.y = torch.zeros(50, 2)
    assert metric_of(data)(logits, torch.tensor([[1, 0], [0, 1], [0, 0]])) == 0.625  # ROC-AUC


class _Weighted(torch.nn.Module):
    """Written as PyG's examples write a weighted GCN: ``forward(x, edge_index, edge_weight)``."""

    def __init__(self) -> None:
        super().__init__()
        from torch_geometric.nn import GCNConv

        self.conv1, self.conv2 = GCNConv(8, 16), GCNConv(16, 3)

    def forward(self, x, edge_index, edge_weight=None):
        x = torch.nn.functional.relu(self.conv1(x, edge_index, edge_weight))
        return self.conv2(x, edge_index, edge_weight)


def test_training_loops_pass_edge_attributes_by_keyword():
    import copy

    import gnnact
    from gnnact.memory import saved_bytes
    from gnnact.training import loss_of

    data = synthetic_graph(200, 4, 8, 3, seed=0)
    data.edge_weight = torch.rand(data.num_edges, generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    model = gnnact.convert(_Weighted(), gnnact.Config(bits=32))
    mask = data.train_mask
    want = torch.nn.functional.cross_entropy(
        model(data.x, data.edge_index, edge_weight=data.edge_weight)[mask], data.y[mask])
    got = loss_of(model, data, ("edge_weight",))
    assert torch.equal(got, want)
    assert not torch.equal(loss_of(model, data), want)  # the weights change the loss
    out = model.eval()(data.x, data.edge_index, edge_weight=data.edge_weight)
    acc = (out.argmax(-1) == data.y).float()
    assert evaluate(model, data, edge_attrs=["edge_weight"]) == (
        acc[data.val_mask].mean().item(), acc[data.test_mask].mean().item())
    # The weights stay resident like x: not counted as saved context.
    trained = copy.deepcopy(model)
    result = train_full_batch(trained, data, epochs=2, edge_attrs=("edge_weight",))
    fresh = copy.deepcopy(model).train()
    loss = loss_of(fresh, data, ("edge_weight",))
    assert result.saved_bytes == saved_bytes(
        loss, exclude=[fresh, data.x, data.y, data.edge_index, data.edge_weight])


def test_edge_attributes_bad_names_are_named():
    from gnnact.training import model_inputs, with_layout

    data = synthetic_graph(50, 4, 8, 3, seed=0)
    data.edge_weight = torch.rand(data.num_edges)
    data.node_weight = torch.rand(data.num_nodes)
    with pytest.raises(TypeError, match=r"edge_attrs must be a sequence of names, got the "
                                        r"string 'edge_weight' \(write \('edge_weight',\)\)"):
        model_inputs(data, "edge_weight")
    with pytest.raises(ValueError, match=r"'edge_attr' must name a tensor of data with one row "
                                         r"per edge \(\d+\), got NoneType"):
        model_inputs(data, ["edge_attr"])
    with pytest.raises(ValueError, match=r"'node_weight' must name a tensor of data with one "
                                         r"row per edge \(\d+\), got a tensor of shape \(50,\)"):
        model_inputs(data, ["node_weight"])
    with pytest.raises(ValueError, match="with a sparse adj_t: its values are the edge values"):
        model_inputs(with_layout(data, adj="csr"), ["edge_weight"])
    assert model_inputs(data)[1] == {}
