"""Message passing in feature chunks (gnnact.nn.chunked): PyG's results bit for bit, messages
never whole, installed and removed by convert, kept by deepcopy and pickle."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch import nn

import gnnact
from gnnact.nn.chunked import DECOMPOSABLE, FeatureChunks, chunk_messages
from gnnact.peak import PeakMeter

N, F, E = 300, 24, 2400  # 8 edges per node: 8 column blocks of 3


def make(cls: type) -> nn.Module:
    torch.manual_seed(0)
    name = cls.__name__
    if name == "GINConv":
        return cls(nn.Sequential(nn.Linear(F, F), nn.ReLU(), nn.Linear(F, F)), train_eps=True)
    if name == "ChebConv":
        return cls(F, F, K=3)
    if name == "SSGConv":
        return cls(F, F, alpha=0.1)
    if name in ("LGConv", "SimpleConv", "WLConvContinuous"):
        return cls()
    return cls(F, F)


def inputs(cls: type, dtype=torch.float32) -> tuple:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g, dtype=dtype)
    edge_index = torch.randint(0, N, (2, E), generator=g)
    weight = torch.rand(E, generator=g, dtype=dtype)
    if cls.__name__ in ("GINConv", "MFConv", "ClusterGCNConv"):
        return x, edge_index
    return x, edge_index, weight


@pytest.mark.parametrize("cls", DECOMPOSABLE, ids=lambda c: c.__name__)
def test_converted_conv_equals_pyg_bit_for_bit_in_chunks(cls):
    pyg = make(cls)
    ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
    assert isinstance(ours.propagate, FeatureChunks)
    (x, *rest) = inputs(cls)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = pyg(x1, *rest), ours(x2, *rest)
    assert ours.propagate.last_chunks > 1  # the messages were made in column blocks
    assert torch.equal(want, got)
    grad = torch.randn_like(want)
    # allow_unused: ARMAConv's weights of the layers after its first (num_layers=1: unused)
    want_grads = torch.autograd.grad(want, [x1, *pyg.parameters()], grad, allow_unused=True)
    got_grads = torch.autograd.grad(got, [x2, *ours.parameters()], grad, allow_unused=True)
    for a, b in zip(want_grads, got_grads, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def test_pairs_and_bipartite_graphs_equal_pyg():
    g = torch.Generator().manual_seed(2)
    x_src, x_dst = torch.randn(N, F, generator=g), torch.randn(50, F, generator=g)
    edge_index = torch.stack([torch.randint(0, N, (E,), generator=g),
                              torch.randint(0, 50, (E,), generator=g)])
    for pyg in (make(pyg_nn.GraphConv), make(pyg_nn.GINConv)):
        ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
        assert torch.equal(ours((x_src, x_dst), edge_index), pyg((x_src, x_dst), edge_index))
        assert ours.propagate.last_chunks == 8  # E / N_src blocks


def test_sparse_adjacency_and_few_edges_run_whole():
    from torch_geometric.utils import to_torch_csr_tensor

    pyg = make(pyg_nn.GraphConv)
    ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
    x, edge_index, _ = inputs(pyg_nn.GraphConv)
    adj_t = to_torch_csr_tensor(edge_index.flip(0), size=(N, N))
    assert torch.allclose(ours(x, adj_t), pyg(x, adj_t))
    assert ours.propagate.last_chunks == 1  # PyG's fused path makes no messages
    few = edge_index[:, : N // 2]
    assert torch.equal(ours(x, few), pyg(x, few)) and ours.propagate.last_chunks == 1


def test_messages_never_exist_whole():
    """GIN at 2 bits: the step's peak stays below the E x F messages PyG makes at once, and
    below a quarter of the unchunked step's peak."""
    n, f, e = 2_000, 64, 32_000
    g = torch.Generator().manual_seed(3)
    x, edge_index = torch.randn(n, f, generator=g), torch.randint(0, n, (2, e), generator=g)
    messages = e * f * 4
    peaks = {}
    for chunked in (True, False):
        torch.manual_seed(0)
        model = pyg_nn.models.GIN(f, f, num_layers=2, out_channels=8)
        gnnact.convert(model, gnnact.Config(bits=2, chunk_messages=chunked))
        model(x, edge_index).sum().backward()  # the graph cache and the like: built once
        with PeakMeter() as meter:
            model(x, edge_index).sum().backward()
        peaks[chunked] = meter.peak_bytes
    assert peaks[False] > messages > 2 * peaks[True]


def test_convert_installs_and_removes_and_copies_keep_it():
    model = nn.ModuleList([make(pyg_nn.GINConv), nn.Linear(F, F)])
    gnnact.convert(model, gnnact.Config(bits=32))
    conv = model[0]
    assert isinstance(conv.propagate, FeatureChunks) and conv.propagate.conv is conv
    x, edge_index = inputs(pyg_nn.GINConv)
    want = conv(x, edge_index)
    for other in (copy.deepcopy(model), _pickled(model)):
        assert other[0].propagate.conv is other[0]  # bound to the copy, not the original
        assert torch.equal(other[0](x, edge_index), want)
        assert other[0].propagate.last_chunks == 8
    gnnact.convert(model, gnnact.Config(bits=32, chunk_messages=False))
    assert "propagate" not in conv.__dict__  # PyG's own propagate again
    assert torch.equal(conv(x, edge_index), want)
    chunk_messages(conv)
    chunk_messages(conv)  # once is enough
    assert isinstance(conv.__dict__["propagate"], FeatureChunks)


def _pickled(model: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_only_decomposable_convs_and_bad_config_named():
    with pytest.raises(TypeError, match="conv must be one of .*GINConv.*, got GATConv"):
        FeatureChunks(pyg_nn.GATConv(F, F))
    with pytest.raises(TypeError, match="Config.chunk_messages must be a bool, got 'yes'"):
        gnnact.Config(chunk_messages="yes")
    # A subclass may override message: left whole.
    class Sub(pyg_nn.GINConv):
        pass

    sub = gnnact.convert(Sub(nn.Linear(F, F)))
    assert "propagate" not in sub.__dict__
