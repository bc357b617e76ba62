"""Message passing in chunks (gnnact.nn.chunked), by feature columns (PyG's results bit for
bit) and by blocks of targets (up to float rounding): messages never whole, installed and
removed by convert, kept by deepcopy and pickle; small messages whole by default.

The graphs here are small, so every test but the default's own lowers the floor under which
calls run whole (``MIN_MESSAGE_BYTES``) to 0."""

from __future__ import annotations

import copy
import io

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch import nn

import gnnact
from gnnact import config as config_module
from gnnact.nn import chunked as chunked_module
from gnnact.nn.chunked import BY_TARGET, DECOMPOSABLE, FeatureChunks, TargetChunks, chunk_messages
from gnnact.peak import PeakMeter

N, F, E = 300, 24, 2400  # 8 edges per node: 8 column blocks of 3


@pytest.fixture(autouse=True)
def chunk_small_messages(request):
    if request.function not in (test_small_messages_run_whole_by_default,
                                test_a_gpus_floor_is_a_share_of_its_memory):
        request.getfixturevalue("small_messages_in_pieces")


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
    if name == "GatedGraphConv":
        return cls(F, num_layers=2)
    if name == "SignedConv":
        return cls(F, F, first_aggr=True)
    return cls(F, F)


def inputs(cls: type, dtype=torch.float32) -> tuple:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(N, F, generator=g, dtype=dtype)
    edge_index = torch.randint(0, N, (2, E), generator=g)
    weight = torch.rand(E, generator=g, dtype=dtype)
    if cls.__name__ in ("GINConv", "MFConv", "ClusterGCNConv"):
        return x, edge_index
    if cls.__name__ == "SignedConv":  # positive and negative edges
        return x, edge_index, edge_index.flip(0)
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


D = 6  # edge features


def make_by_target(cls: type, edge_dim: int | None = D) -> nn.Module:
    """``edge_dim=None``: no linear map inside ``message`` (GINEConv and GENConv add edge
    features as wide as the nodes as they are; the others take none)."""
    torch.manual_seed(0)
    name = cls.__name__
    if name == "TransformerConv":
        return cls(F, 8, heads=3, edge_dim=edge_dim, beta=True)
    if name == "GINEConv":
        return cls(nn.Sequential(nn.Linear(F, F), nn.ReLU(), nn.Linear(F, F)), edge_dim=edge_dim)
    if name == "GENConv":
        return cls(F, F, edge_dim=edge_dim, learn_t=True)
    return cls(F, F, edge_dim=edge_dim)


def _gradients_close(pyg: nn.Module, ours: nn.Module, pyg_run: tuple, our_run: tuple) -> None:
    """The gradients of the input and of every parameter, for the same output gradient, up to
    float summation order over 2,400 edges at the gradient's scale (TransformerConv's key bias
    takes an exact gradient of 0, softmax being shift-invariant: PyG's is round-off)."""
    (x1, want), (x2, got) = pyg_run, our_run
    grad = torch.randn_like(want)
    want_grads = torch.autograd.grad(want, [x1, *pyg.parameters()], grad, allow_unused=True)
    got_grads = torch.autograd.grad(got, [x2, *ours.parameters()], grad, allow_unused=True)
    for a, b in zip(want_grads, got_grads, strict=True):
        if a is None:
            assert b is None
        else:
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5 * max(1.0, a.abs().max()))


#: The classes with an edge_dim argument, tested with and without edge features' linear map.
EDGE_DIM = [c for c in BY_TARGET
            if c.__name__ in ("TransformerConv", "GINEConv", "GENConv", "ResGatedGraphConv")]


@pytest.mark.parametrize("edge_dim", [D, None], ids=["edge-linear", "edge-added"])
@pytest.mark.parametrize("cls", EDGE_DIM, ids=lambda c: c.__name__)
def test_target_blocks_equal_pyg(cls, edge_dim):
    """Each target meets the same messages in the same order; a block's messages are computed
    in a batch of another size (a linear map of edge features, a vectorised exp or sigmoid
    may round a last bit differently there), and source gradients sum block by block: equal
    up to float rounding."""
    pyg = make_by_target(cls, edge_dim)
    ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
    assert isinstance(ours.propagate, TargetChunks)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(N, F, generator=g)
    edge_index = torch.randint(0, N, (2, E), generator=g)
    edge_attr = torch.randn(E, D if edge_dim else F, generator=g)
    # Without edge_dim, TransformerConv and ResGatedGraphConv take no edge features.
    no_features = edge_dim is None and cls.__name__ in ("TransformerConv", "ResGatedGraphConv")
    args = () if no_features else (edge_attr,)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = pyg(x1, edge_index, *args), ours(x2, edge_index, *args)
    assert ours.propagate.last_chunks == 8  # E / N targets
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    _gradients_close(pyg, ours, (x1, want), (x2, got))


def _more_by_target() -> dict[str, tuple]:
    """The other classes of BY_TARGET: how to build one and call it on (x, edge_index, edge
    attributes of width D)."""
    g = torch.Generator().manual_seed(7)
    pos = torch.randn(N, 3, generator=g)
    normal = torch.nn.functional.normalize(torch.randn(N, 3, generator=g), dim=-1)
    deg = torch.bincount(torch.randint(0, N, (E,), generator=g), minlength=N)
    return {
        "EdgeConv": (lambda: pyg_nn.EdgeConv(nn.Sequential(nn.Linear(2 * F, F), nn.ReLU())),
                     lambda c, x, ei, ea: c(x, ei)),
        "PNAConv": (lambda: pyg_nn.PNAConv(F, F, ["mean", "max", "std"],
                                           ["identity", "amplification"], torch.bincount(deg),
                                           edge_dim=D, towers=2),
                    lambda c, x, ei, ea: c(x, ei, ea)),
        "NNConv": (lambda: pyg_nn.NNConv(F, 8, nn.Linear(D, F * 8), aggr="mean"),
                   lambda c, x, ei, ea: c(x, ei, ea)),
        "CGConv": (lambda: pyg_nn.CGConv(F, dim=D), lambda c, x, ei, ea: c(x, ei, ea)),
        "GMMConv": (lambda: pyg_nn.GMMConv(F, F, dim=D, kernel_size=3),
                    lambda c, x, ei, ea: c(x, ei, ea)),
        "FeaStConv": (lambda: pyg_nn.FeaStConv(F, F, heads=2), lambda c, x, ei, ea: c(x, ei)),
        "PointNetConv": (lambda: pyg_nn.PointNetConv(nn.Linear(F + 3, F), nn.Linear(F, F)),
                         lambda c, x, ei, ea: c(x, pos, ei)),
        "GeneralConv": (lambda: pyg_nn.GeneralConv(F, F, in_edge_channels=D, attention=True,
                                                   heads=2),
                        lambda c, x, ei, ea: c(x, ei, ea)),
        "FiLMConv": (lambda: pyg_nn.FiLMConv(F, F, num_relations=2),
                     lambda c, x, ei, ea: c(x, ei, (ea[:, 0] > 0).long())),
        "PDNConv": (lambda: pyg_nn.PDNConv(F, F, edge_dim=D, hidden_channels=8),
                    lambda c, x, ei, ea: c(x, ei, ea)),
        "AGNNConv": (lambda: pyg_nn.AGNNConv(requires_grad=True), lambda c, x, ei, ea: c(x, ei)),
        "FAConv": (lambda: pyg_nn.FAConv(F, eps=0.2),
                   lambda c, x, ei, ea: c(x, x.detach() * 0.5, ei)),
        "RGATConv": (lambda: pyg_nn.RGATConv(F, 8, num_relations=3, heads=2, edge_dim=D),
                     lambda c, x, ei, ea: c(x, ei, ea[:, 0].abs().long() % 3, ea)),
        "EGConv": (lambda: pyg_nn.EGConv(F, F, aggregators=["sum", "mean", "max", "std"],
                                         num_heads=4, num_bases=2),
                   lambda c, x, ei, ea: c(x, ei)),
        "DNAConv": (lambda: pyg_nn.DNAConv(F, heads=4, groups=2),  # attention over 3 layers
                    lambda c, x, ei, ea: c(torch.stack([x, x * 0.5, x.tanh()], 1), ei)),
        "PointTransformerConv": (lambda: pyg_nn.PointTransformerConv(F, F),
                                 lambda c, x, ei, ea: c(x, pos, ei)),
        "PPFConv": (lambda: pyg_nn.PPFConv(nn.Linear(F + 4, F), nn.Linear(F, F)),
                    lambda c, x, ei, ea: c(x, pos, normal, ei)),
        "PointGNNConv": (lambda: pyg_nn.PointGNNConv(nn.Linear(F, 3), nn.Linear(F + 3, F),
                                                     nn.Linear(F, F)),
                         lambda c, x, ei, ea: c(x, pos, ei)),
        "HEATConv": (lambda: pyg_nn.HEATConv(F, F, num_node_types=2, num_edge_types=3,
                                             edge_type_emb_dim=4, edge_dim=D,
                                             edge_attr_emb_dim=4, heads=2),
                     lambda c, x, ei, ea: c(x, ei, deg % 2, ea[:, 0].abs().long() % 3, ea)),
        "LEConv": (lambda: pyg_nn.LEConv(F, F), lambda c, x, ei, ea: c(x, ei, ea[:, 0])),
    }


MORE = [c for c in BY_TARGET if c.__name__ in _more_by_target()]


def test_every_class_is_tested():
    assert set(BY_TARGET) == {*EDGE_DIM, *MORE}


@pytest.mark.parametrize("cls", MORE, ids=lambda c: c.__name__)
def test_more_target_blocks_equal_pyg(cls):
    """Networks applied per edge (EdgeConv, PNA's towers, NNConv's edge network), Gaussian
    kernels, relations, self-loops added inside the conv: PyG's results up to float rounding."""
    make, call = _more_by_target()[cls.__name__]
    torch.manual_seed(0)
    pyg = make()
    ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
    assert isinstance(ours.propagate, TargetChunks)
    g = torch.Generator().manual_seed(8)
    x = torch.randn(N, F, generator=g)
    edge_index, edge_attr = torch.randint(0, N, (2, E), generator=g), torch.randn(E, D, generator=g)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = call(pyg, x1, edge_index, edge_attr), call(ours, x2, edge_index, edge_attr)
    assert ours.propagate.last_chunks > 1
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    _gradients_close(pyg, ours, (x1, want), (x2, got))


def test_target_blocks_attention_bipartite_and_isolated_targets():
    """TransformerConv's returned attention is PyG's, in the input edge order; a bipartite
    graph whose targets include some with no edges runs in blocks all the same."""
    pyg = make_by_target(pyg_nn.TransformerConv)
    ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
    g = torch.Generator().manual_seed(5)
    x_src, x_dst = torch.randn(N, F, generator=g), torch.randn(60, F, generator=g)
    edge_index = torch.stack([torch.randint(0, N, (E,), generator=g),
                              torch.randint(0, 50, (E,), generator=g)])  # 50..59: no edges
    edge_attr = torch.randn(E, D, generator=g)
    want, (want_index, want_alpha) = pyg((x_src, x_dst), edge_index, edge_attr,
                                         return_attention_weights=True)
    got, (got_index, got_alpha) = ours((x_src, x_dst), edge_index, edge_attr,
                                       return_attention_weights=True)
    assert ours.propagate.last_chunks > 1
    assert torch.equal(want_index, got_index)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_alpha, want_alpha, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", ["FAConv", "RGATConv"])
def test_target_blocks_return_attention_in_edge_order(name):
    """FAConv (self-loops added inside) and RGATConv return the attention PyG returns."""
    pyg = _more_by_target()[name][0]()
    ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
    g = torch.Generator().manual_seed(9)
    x = torch.randn(N, F, generator=g)
    edge_index, edge_attr = torch.randint(0, N, (2, E), generator=g), torch.randn(E, D, generator=g)
    if name == "FAConv":
        def run(conv):
            return conv(x, x * 0.5, edge_index, return_attention_weights=True)
    else:
        def run(conv):
            return conv(x, edge_index, edge_attr[:, 0].abs().long() % 3, edge_attr,
                        return_attention_weights=True)
    (want, (want_index, want_alpha)), (got, (got_index, got_alpha)) = run(pyg), run(ours)
    assert ours.propagate.last_chunks > 1
    assert torch.equal(want_index, got_index)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got_alpha, want_alpha, rtol=1e-6, atol=1e-7)


def test_target_blocks_keep_messages_whole_nowhere():
    """TransformerConv at 2 bits: the step's peak stays below the E x H x C messages (and the
    same-sized attention products) PyG makes at once."""
    n, e = 2_000, 32_000
    g = torch.Generator().manual_seed(6)
    x, edge_index = torch.randn(n, 64, generator=g), torch.randint(0, n, (2, e), generator=g)
    peaks = {}
    for chunked in (True, False):
        torch.manual_seed(0)
        model = pyg_nn.TransformerConv(64, 16, heads=4)
        gnnact.convert(model, gnnact.Config(bits=2, chunk_messages=chunked))
        model(x, edge_index).sum().backward()
        with PeakMeter() as meter:
            model(x, edge_index).sum().backward()
        peaks[chunked] = meter.peak_bytes
    messages = e * 64 * 4
    assert peaks[False] > 4 * peaks[True] and messages > peaks[True]


def test_chunks_pick_the_way_by_class():
    assert isinstance(gnnact.convert(make(pyg_nn.GINConv)).propagate, FeatureChunks)
    assert isinstance(gnnact.convert(make_by_target(pyg_nn.GINEConv)).propagate, TargetChunks)
    with pytest.raises(TypeError, match="conv must be one of .*TransformerConv.*, got GINConv"):
        TargetChunks(make(pyg_nn.GINConv))


def test_twins_on_pygs_path_and_columns_mixed_or_hooked():
    """SAGE with aggr="max" runs PyG's own forward: its messages in column blocks, PyG's
    result bit for bit. An aggregation with a parameter per column, or a registered hook, runs
    whole (and as PyG)."""
    g = torch.Generator().manual_seed(9)
    x, edge_index = torch.randn(N, F, generator=g), torch.randint(0, N, (2, E), generator=g)
    torch.manual_seed(0)
    pyg = pyg_nn.SAGEConv(F, F, aggr="max")
    ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
    assert isinstance(ours.propagate, FeatureChunks)
    assert torch.equal(ours(x, edge_index), pyg(x, edge_index))
    assert ours.propagate.last_chunks == 8
    torch.manual_seed(0)
    pyg = pyg_nn.GraphConv(F, F, aggr=pyg_nn.aggr.SoftmaxAggregation(learn=True, channels=F))
    ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
    assert torch.equal(ours(x, edge_index), pyg(x, edge_index))
    assert ours.propagate.last_chunks == 1  # a temperature per column: whole
    pyg, ours = make(pyg_nn.GINConv), gnnact.convert(make(pyg_nn.GINConv),
                                                     gnnact.Config(bits=32))
    seen = []
    ours.register_message_forward_hook(lambda module, inputs, out: seen.append(out.shape))
    assert torch.equal(ours(x, edge_index), pyg(x, edge_index))
    assert ours.propagate.last_chunks == 1 and seen == [(E, F)]  # the hook saw PyG's messages


def test_summary_says_how_messages_were_made():
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gcn, self.gin = pyg_nn.GCNConv(F, F), make(pyg_nn.GINConv)
            self.supergat = pyg_nn.SuperGATConv(F, F)  # in neither list: whole

        def forward(self, x, edge_index):
            return self.supergat(self.gin(self.gcn(x, edge_index), edge_index), edge_index)

    model = gnnact.convert(Net())
    before = {r.path: r.messages for r in gnnact.summary(model).rows}
    assert (before["gcn"], before["gin"], before["supergat"]) == ("fused", "–", "whole")
    x, edge_index = inputs(pyg_nn.GINConv)
    model(x, edge_index).sum().backward()
    rows = {r.path: r.messages for r in gnnact.summary(model).rows}
    assert (rows["gcn"], rows["gin"], rows["supergat"]) == ("fused", "8 pieces", "whole")
    assert rows["gin.nn"] == "" and "messages" in str(gnnact.summary(model)).splitlines()[0]


@pytest.mark.parametrize("cls", [pyg_nn.GINConv, pyg_nn.TransformerConv])
def test_small_messages_run_whole_by_default(cls):
    """Under MIN_MESSAGE_BYTES of messages (E rows of the widest argument row) a call runs
    whole, with PyG's result; at or above an instance's min_bytes, in pieces; the summary
    says which."""
    x, edge_index = inputs(cls)[:2]
    pyg = make(cls)
    want = pyg(x, edge_index)
    ours = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=32))
    chunks = ours.propagate
    assert chunks.min_bytes is None
    assert chunks.floor(x.device) == chunked_module.MIN_MESSAGE_BYTES >= 1 << 20
    assert torch.equal(ours(x, edge_index), want) and chunks.last_chunks == 1
    assert "whole" in str(gnnact.summary(ours))
    size = chunks.message_bytes(edge_index, {"x": x})
    assert size == E * F * 4
    chunks.min_bytes = size
    assert torch.allclose(ours(x, edge_index), want, atol=1e-6) and chunks.last_chunks == 8
    assert "8 pieces" in str(gnnact.summary(ours))


def test_a_gpus_pieces_hold_the_floor():
    """Over the floor, a GPU's call runs in pieces of the floor's bytes at least (their cost
    there is the host's); the CPU's in as many as the conv's edges and nodes allow (about a
    node tensor's messages each). Under it, whole on both."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    floor = 64 << 20
    assert chunked_module.most_pieces(floor - 1, floor, cuda) == 1
    assert chunked_module.most_pieces(floor - 1, floor, cpu) == 1
    assert chunked_module.most_pieces(3 * floor + 5, floor, cuda) == 3
    assert chunked_module.most_pieces(3 * floor + 5, floor, cpu) >= 3 * floor
    assert chunked_module.most_pieces(1000, 0, cuda) >= 1000  # (a floor of 0: any number)


def test_a_gpus_floor_is_a_share_of_its_memory(monkeypatch):
    """On a GPU messages run whole up to a GPU_MEMORY_SHARE-th of its memory (MIN_MESSAGE_BYTES
    at least); the CPU's floor is MIN_MESSAGE_BYTES. (The device's memory is stubbed: only
    its size is read.)"""
    monkeypatch.setattr(config_module, "device_memory", lambda device: 141 << 30)
    cuda = torch.device("cuda")
    assert chunked_module.message_floor(cuda) == (141 << 30) // chunked_module.GPU_MEMORY_SHARE
    assert chunked_module.message_floor(cuda) > 1 << 30
    assert chunked_module.message_floor(torch.device("cpu")) == chunked_module.MIN_MESSAGE_BYTES
    monkeypatch.setattr(config_module, "device_memory", lambda device: 4 << 30)
    assert chunked_module.message_floor(cuda) == chunked_module.MIN_MESSAGE_BYTES
