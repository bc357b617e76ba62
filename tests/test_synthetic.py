"""Tests for :func:`gnnact.data.synthetic_graph`."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv
from torch_geometric.utils import coalesce, contains_self_loops, is_undirected

from gnnact.data import synthetic_graph

KEYS = ("x", "y", "edge_index", "train_mask", "val_mask", "test_mask")




@pytest.fixture(scope="module")
def graph():
    return synthetic_graph(5000, 10, 16, 5, homophily=0.7, seed=3)


def test_determinism():
    a = synthetic_graph(500, 6, 8, 3, seed=7)
    b = synthetic_graph(500, 6, 8, 3, seed=7)
    c = synthetic_graph(500, 6, 8, 3, seed=8)
    for key in KEYS:
        assert torch.equal(a[key], b[key]), key
    for key in ("x", "y", "edge_index", "train_mask"):
        assert a[key].shape != c[key].shape or not torch.equal(a[key], c[key]), key


def test_dtypes_and_shapes(graph):
    assert graph.x.dtype == torch.float32 and graph.x.shape == (5000, 16)
    assert graph.y.dtype == torch.int64 and graph.y.shape == (5000,)
    assert graph.edge_index.dtype == torch.int64 and graph.edge_index.size(0) == 2
    assert int(graph.y.min()) == 0 and int(graph.y.max()) == 4
    counts = torch.bincount(graph.y)
    assert int(counts.max() - counts.min()) <= 1  # balanced classes
    for key in ("train_mask", "val_mask", "test_mask"):
        assert graph[key].dtype == torch.bool and graph[key].shape == (5000,)


def test_structure(graph):
    ei = graph.edge_index
    assert is_undirected(ei, num_nodes=5000)
    assert not contains_self_loops(ei)
    assert torch.equal(coalesce(ei, num_nodes=5000), ei)  # sorted, no duplicates


def test_degree_and_homophily(graph):
    ei = graph.edge_index
    assert ei.size(1) / 5000 == pytest.approx(10, rel=0.03)
    same = (graph.y[ei[0]] == graph.y[ei[1]]).float().mean().item()
    assert same == pytest.approx(0.7, abs=0.02)
    # Every node gets its own sampled edges, so none is isolated at this degree.
    assert int(torch.bincount(ei[0], minlength=5000).min()) > 0


@pytest.mark.parametrize("homophily", [0.0, 1.0])
def test_homophily_extremes(homophily):
    g = synthetic_graph(2000, 8, 4, 4, homophily=homophily)
    same = (g.y[g.edge_index[0]] == g.y[g.edge_index[1]]).float().mean().item()
    assert same == homophily
    assert not contains_self_loops(g.edge_index)


def test_masks(graph):
    total = graph.train_mask.long() + graph.val_mask.long() + graph.test_mask.long()
    assert bool((total == 1).all())  # disjoint and covering
    assert int(graph.train_mask.sum()) == 3000
    assert int(graph.val_mask.sum()) == 1000


def test_small_and_empty():
    g = synthetic_graph(10, 0, 3, 2)
    assert g.edge_index.shape == (2, 0) and g.edge_index.dtype == torch.int64
    g = synthetic_graph(3, 1.5, 2, 3)  # classes of one node: no same-class partner exists
    assert not contains_self_loops(g.edge_index)
    assert is_undirected(g.edge_index, num_nodes=3)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"num_nodes": 0}, "num_nodes"),
    ({"num_nodes": 2.5}, "num_nodes"),
    ({"num_nodes": 3}, "num_nodes .3. must be at least num_classes"),
    ({"avg_degree": -1.0}, "avg_degree"),
    ({"avg_degree": 99.0}, "avg_degree"),
    ({"avg_degree": float("nan")}, "avg_degree"),
    ({"num_features": 0}, "num_features"),
    ({"num_classes": 1}, "num_classes"),
    ({"homophily": 1.5}, "homophily"),
    ({"feature_signal": -0.1}, "feature_signal"),
    ({"train_ratio": 0.9, "val_ratio": 0.1}, "train_ratio \\+ val_ratio"),
    ({"val_ratio": -0.1}, "val_ratio"),
    ({"seed": "1"}, "seed"),
])
def test_bad_arguments(kwargs, match):
    args = {"num_nodes": 100, "avg_degree": 4.0, "num_features": 8, "num_classes": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        synthetic_graph(**args)


def _fit(model, forward, data, epochs=60):
    """Full-batch Adam; test accuracy at the best validation accuracy."""
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    best_val = best_test = 0.0
    for _ in range(epochs):
        opt.zero_grad()
        F.cross_entropy(forward()[data.train_mask], data.y[data.train_mask]).backward()
        opt.step()
        with torch.no_grad():
            correct = forward().argmax(-1) == data.y
        val = correct[data.val_mask].float().mean().item()
        if val > best_val:
            best_val, best_test = val, correct[data.test_mask].float().mean().item()
    return best_test


def test_gcn_beats_linear():
    data = synthetic_graph(1500, 8, 16, 4, seed=1)
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 4)
    acc_linear = _fit(linear, lambda: linear(data.x), data)
    gcn = GCNConv(16, 4)
    acc_gcn = _fit(gcn, lambda: gcn(data.x, data.edge_index), data)
    # The features alone are informative but noisy; averaging neighbours removes most noise.
    assert 0.35 < acc_linear < 0.75
    assert acc_gcn > acc_linear + 0.15
