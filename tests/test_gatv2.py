"""Tests for :class:`gnnact.nn.GATv2Conv` and :func:`gnnact.ops.gatv2.gatv2_attention`.

* parity with PyG's ``GATv2Conv`` at ``Config(bits=32)`` in float64 (outputs, attention
  weights, the gradient of the inputs, of the edge features and of every parameter) across
  heads, concat, share_weights, bipartite input, self-loops and fill values, edge features,
  residual, bias, lazy sizes, every adjacency type, dropout (eval and seeded training);
* ``gradcheck`` of the fused op, and the same results whatever the edge chunk size;
* what the layer keeps at 2 bits, byte for byte, with no ``E x H x C`` tensor (PyG keeps
  several);
* unbiasedness of the weight gradients at 2 bits;
* input features that need no gradient restored once for ``lin_l``, ``lin_r`` and ``res``;
* ``gnnact.convert`` on PyG's ``GAT(v2=True)``: the twin is swapped in, keeps several times
  less than the generic pipeline did, and trains.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
import torch_geometric.transforms as T
from attention_helpers import F_IN, E, N
from attention_helpers import edges as _edges
from attention_helpers import feats as _feats
from attention_helpers import rel as _rel
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.data import Data
from torch_geometric.nn.models import GAT
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import (
    add_self_loops,
    remove_self_loops,
    to_torch_coo_tensor,
    to_torch_csr_tensor,
)

import gnnact
from gnnact.config import Config
from gnnact.data import synthetic_graph
from gnnact.memory import breakdown, saved_tensors
from gnnact.nn.conv.gatv2_conv import GATv2Conv
from gnnact.nn.convert import CONVERSIONS
from gnnact.ops import dense
from gnnact.ops import gatv2 as gatv2_ops
from gnnact.ops.blocks import GPU_BLOCK_ELEMENTS
from gnnact.ops.gatv2 import gatv2_attention
from gnnact.ops.graph import Graph, graph_cache_for
from gnnact.quant.packed import packed_code_bytes

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled"),
]

EXACT = Config(bits=32)
TOL = 1e-6


def _pair(config: Config = EXACT, **kwargs) -> tuple[pyg_nn.GATv2Conv, GATv2Conv]:
    """A PyG layer and a gnnact copy of it (same parameter values), both float64."""
    torch.manual_seed(0)
    ref = pyg_nn.GATv2Conv(**kwargs).double()
    with torch.no_grad():  # the bias starts at zero: make every parameter count
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return ref, GATv2Conv._adopt(copy.deepcopy(ref), config)


def _alpha(result) -> Tensor:
    att = result[1]
    return att[1] if isinstance(att, tuple) else att.storage.value()


def _run(module, x, adj, edge_attr: Tensor | None = None, seed: int = 0, **kwargs):
    """Forward with a fixed random output weighting (and the attention weights in the loss
    when returned), backward; returns (result, grads of inputs and parameters)."""
    xs = tuple(t.clone().requires_grad_() for t in (x if isinstance(x, tuple) else (x,)))
    ea = None if edge_attr is None else edge_attr.clone().requires_grad_()
    torch.manual_seed(seed)
    result = module(xs if isinstance(x, tuple) else xs[0], adj, ea, **kwargs)
    out = result[0] if isinstance(result, tuple) else result
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(7),
                    dtype=out.dtype).to(out.device)
    loss = (out * w).sum()
    if isinstance(result, tuple):
        alpha = _alpha(result)
        loss = loss + (alpha * torch.linspace(-1, 1, alpha.numel(), dtype=alpha.dtype,
                                           device=alpha.device)
                       .view_as(alpha)).sum()
    loss.backward()
    grads = {f"x{i}": t.grad for i, t in enumerate(xs)}
    if ea is not None:
        grads["edge_attr"] = ea.grad
    grads.update({name: p.grad for name, p in module.named_parameters()})
    return result, grads


def _assert_parity(ref, ours, x, adj, edge_attr=None, **kwargs) -> tuple:
    r_ref, g_ref = _run(ref, x, adj, edge_attr, **kwargs)
    r_our, g_our = _run(ours, x, adj, edge_attr, **kwargs)
    out_ref = r_ref[0] if isinstance(r_ref, tuple) else r_ref
    out_our = r_our[0] if isinstance(r_our, tuple) else r_our
    assert out_our.shape == out_ref.shape and out_our.dtype == out_ref.dtype
    assert _rel(out_our, out_ref) <= TOL
    if isinstance(r_ref, tuple):
        assert _rel(_alpha(r_our), _alpha(r_ref)) <= TOL
    assert g_ref.keys() == g_our.keys()
    for name, g in g_ref.items():
        assert (g is None) == (g_our[name] is None), name
        if g is not None:
            assert _rel(g_our[name], g) <= TOL, name
    return r_ref, r_our


# ------------------------------------------------------------------------ parity


@pytest.mark.parametrize("heads,concat", [(1, True), (3, True), (3, False)])
@pytest.mark.parametrize("share_weights", [False, True])
@pytest.mark.parametrize("loops", [True, False])
def test_parity_basic(heads, concat, share_weights, loops):
    ref, ours = _pair(in_channels=F_IN, out_channels=4, heads=heads, concat=concat,
                      share_weights=share_weights, add_self_loops=loops)
    _assert_parity(ref, ours, _feats(N, F_IN), _edges(), return_attention_weights=True)


@pytest.mark.cuda
def test_parity_on_cuda():
    ref, ours = _pair(in_channels=F_IN, out_channels=4, heads=3)
    ref, ours = ref.cuda(), ours.cuda()
    _assert_parity(ref, ours, _feats(N, F_IN).cuda(), _edges().cuda(),
                   return_attention_weights=True)


def test_parity_target_to_source_flow():
    ref, ours = _pair(in_channels=F_IN, out_channels=4, heads=3, flow="target_to_source")
    _assert_parity(ref, ours, _feats(N, F_IN), _edges(), return_attention_weights=True)


def _adjacencies(ei: Tensor, n: int = N) -> dict:
    data = T.ToSparseTensor()(Data(edge_index=ei, num_nodes=n))
    return {
        "edge_index": ei,
        "EdgeIndex": EdgeIndex(ei, sparse_size=(n, n)),
        "csr": to_torch_csr_tensor(ei.flip(0), size=(n, n)),
        "coo": to_torch_coo_tensor(ei.flip(0), size=(n, n)),
        # a torch_sparse.SparseTensor where torch-sparse is installed, a torch.sparse CSR
        # tensor otherwise (DESIGN §7)
        "ToSparseTensor": data.adj_t,
    }


@pytest.mark.parametrize("kind", ["edge_index", "EdgeIndex", "csr", "coo", "ToSparseTensor"])
@pytest.mark.parametrize("loops", [True, False])
def test_parity_adjacency_and_attention_weights(kind, loops):
    ref, ours = _pair(in_channels=F_IN, out_channels=4, heads=3, add_self_loops=loops)
    adj = _adjacencies(_edges())[kind]
    r_ref, r_our = _assert_parity(ref, ours, _feats(N, F_IN), adj,
                                  return_attention_weights=True)
    att_ref, att_our = r_ref[1], r_our[1]
    if isinstance(att_ref, tuple):  # (edge_index or adjacency with alpha, alpha)
        adj_ref, adj_our = att_ref[0], att_our[0]
        assert type(adj_our) is type(adj_ref)
        if adj_ref.layout == torch.strided:
            assert torch.equal(adj_our, adj_ref)
        else:
            assert adj_our.layout == adj_ref.layout
            assert _rel(adj_our.values(), adj_ref.values()) <= TOL
    else:  # a torch_sparse.SparseTensor holding alpha
        assert type(att_our) is type(att_ref)
        assert torch.equal(att_our.storage.row(), att_ref.storage.row())
        assert torch.equal(att_our.storage.col(), att_ref.storage.col())
    # return_attention_weights=False returns the output alone, as PyG does.
    assert isinstance(ours(_feats(N, F_IN), adj, return_attention_weights=False), Tensor)


def test_parity_bipartite():
    n_dst = 11
    ei = _edges(n_dst=n_dst)
    x = (_feats(N, F_IN), _feats(n_dst, 5, seed=2))
    # Separate source/target weights and a residual from the targets.
    ref, ours = _pair(in_channels=(F_IN, 5), out_channels=4, heads=3, residual=True)
    _assert_parity(ref, ours, x, ei)
    _assert_parity(ref, ours, x, to_torch_csr_tensor(ei.flip(0), size=(n_dst, N)),
                   return_attention_weights=True)
    # Shared weights on a pair of same-width features: two different projected tensors.
    ref, ours = _pair(in_channels=F_IN, out_channels=4, heads=2, concat=False,
                      share_weights=True)
    _assert_parity(ref, ours, (_feats(N, F_IN), _feats(n_dst, F_IN, seed=3)), ei,
                   return_attention_weights=True)


@pytest.mark.parametrize("fill_value", ["mean", "add", 0.5])
@pytest.mark.parametrize("loops", [True, False])
def test_parity_edge_features(fill_value, loops):
    # The gradient of the edge features themselves is compared too.
    ref, ours = _pair(in_channels=F_IN, out_channels=4, heads=3, edge_dim=3,
                      fill_value=fill_value, add_self_loops=loops)
    _assert_parity(ref, ours, _feats(N, F_IN), _edges(), _feats(E, 3, seed=4),
                   return_attention_weights=True)
    # One-dimensional edge features with edge_dim=1, and shared weights.
    ref, ours = _pair(in_channels=F_IN, out_channels=4, heads=2, edge_dim=1,
                      fill_value=fill_value, add_self_loops=loops, share_weights=True)
    _assert_parity(ref, ours, _feats(N, F_IN), _edges(), _feats(E, 1, seed=5).view(-1))


def _with_edge_features(kind: str) -> Tensor | SparseTensor:
    """A sparse adjacency (``adj_t``) of :func:`_edges` holding 3-D edge features as values."""
    if kind == "SparseTensor" and not WITH_TORCH_SPARSE:
        pytest.skip("torch-sparse is not installed")
    ei, ea = _edges(), _feats(E, 3, seed=4)
    if kind == "SparseTensor":
        return SparseTensor(row=ei[1], col=ei[0], value=ea, sparse_sizes=(N, N))
    to_sparse = to_torch_coo_tensor if kind == "coo" else to_torch_csr_tensor
    return to_sparse(ei.flip(0), edge_attr=ea, size=(N, N))


@pytest.mark.parametrize("kind", ["coo", "csr", "SparseTensor"])
def test_parity_edge_features_from_sparse_values(kind):
    # PyG's propagate reads the edge features from a sparse adjacency's (2-D) values.
    adj = _with_edge_features(kind)
    ref, ours = _pair(in_channels=F_IN, out_channels=4, heads=3, edge_dim=3,
                      add_self_loops=False)
    # (Without return_attention_weights: PyG's set_sparse_value fails on a hybrid COO.)
    _assert_parity(ref, ours, _feats(N, F_IN), adj)


@pytest.mark.parametrize("kind", ["coo", "csr", "SparseTensor"])
def test_graph_keeps_no_copy_of_the_edge_features(kind):
    """The edge features a sparse adjacency carries are read by the op, not copied into the
    cached graph (its structure and the attention's permutations only)."""
    adj = _with_edge_features(kind)
    conv = GATv2Conv(F_IN, 4, heads=3, edge_dim=3, add_self_loops=False,
                     config=Config(bits=2)).double()
    conv(_feats(N, F_IN), adj)
    (graph,) = graph_cache_for(conv).values()
    assert graph.value is None


def test_graph_derives_its_targets():
    """Like GATConv's, the graph keeps no per-edge targets: the op finds those of each block
    of edges in the row pointers (outputs and gradients as PyG's, tested above)."""
    conv = GATv2Conv(F_IN, 4, heads=2, config=Config(bits=2)).double()
    x, edge_index = _feats(N, F_IN).requires_grad_(), _edges()
    conv(x, edge_index).sum().backward()
    (graph,) = graph_cache_for(conv).values()  # (kept while edge_index lives)
    assert graph.targets is None
    # ptr and t_ptr; src, t_perm and input_perm (the edges are neither sorted nor symmetric)
    assert graph.nbytes() == 2 * 4 * (N + 1) + 3 * 4 * graph.num_edges


def test_parity_residual_no_bias_and_eval_dropout():
    ref, ours = _pair(in_channels=F_IN, out_channels=5, heads=2, residual=True, bias=False,
                      dropout=0.6, negative_slope=0.1)
    ref.eval()
    ours.eval()
    _assert_parity(ref, ours, _feats(N, F_IN), _edges())
    ref, ours = _pair(in_channels=F_IN, out_channels=5, heads=3, concat=False, residual=True,
                      share_weights=True)
    _assert_parity(ref, ours, _feats(N, F_IN), _edges())


def test_training_dropout_matches_pyg_and_reproduces():
    ref, ours = _pair(in_channels=F_IN, out_channels=4, heads=3, dropout=0.5, edge_dim=2)
    x, ei, ea = _feats(N, F_IN), _edges(), _feats(E, 2, seed=6)
    # The keep mask is drawn as F.dropout draws it on the CPU: same seed, same mask as PyG.
    _assert_parity(ref, ours, x, ei, ea, seed=3, return_attention_weights=True)
    _, (_, alpha) = ours(x, ei, ea, return_attention_weights=True)
    assert (alpha == 0).any() and (alpha > 1).any()  # dropped and rescaled by 1 / (1 - p)
    # At 2 bits too, a seed reproduces the pass (mask and rounding noise), another does not.
    ours.config = Config(bits=2)
    runs = [_run(ours, x, ei, ea, seed=s)[1] for s in (11, 11, 12)]
    assert all(torch.equal(runs[0][k], runs[1][k]) for k in runs[0])
    assert not torch.equal(runs[0]["x0"], runs[2]["x0"])
    # p = 1 drops everything (no random draw, as F.dropout): only the bias remains.
    ours.dropout = 1.0
    out = ours(x, ei, ea)
    assert torch.allclose(out, ours.bias.expand_as(out))


def test_lazy_in_channels():
    x, ei = _feats(N, F_IN), _edges()
    ours = GATv2Conv(-1, 4, heads=2, residual=True, config=EXACT).double()
    out = ours(x, ei)
    assert out.shape == (N, 8) and ours.lin_l.weight.shape == (8, F_IN)
    ref = pyg_nn.GATv2Conv(F_IN, 4, heads=2, residual=True).double()
    ref.load_state_dict(ours.state_dict())
    _assert_parity(ref, ours, x, ei)
    # Bipartite lazy sizes.
    ours = GATv2Conv((-1, -1), 4, heads=2, config=EXACT).double()
    out = ours((x, _feats(11, 5, seed=2)), _edges(n_dst=11))
    assert out.shape == (11, 8) and ours.lin_r.weight.shape == (8, 5)


def test_state_dict_constructor_adopt_and_convert():
    torch.manual_seed(0)
    ref = pyg_nn.GATv2Conv((F_IN, 5), 4, heads=3, edge_dim=2, residual=True)
    torch.manual_seed(0)
    ours = GATv2Conv((F_IN, 5), 4, heads=3, edge_dim=2, residual=True,
                     config=Config(bits=4))
    assert ours.config == Config(bits=4) and isinstance(ours, pyg_nn.GATv2Conv)
    sd_ref, sd_our = ref.state_dict(), ours.state_dict()
    assert list(sd_ref) == list(sd_our)
    assert all(torch.equal(sd_ref[k], sd_our[k]) for k in sd_ref)
    assert repr(ours) == "GATv2Conv((6, 5), 4, heads=3)"
    # share_weights: lin_r is lin_l, as in PyG (one parameter, one state_dict entry each).
    shared = GATv2Conv(F_IN, 4, share_weights=True)
    assert shared.lin_r is shared.lin_l
    assert list(shared.state_dict()) == list(pyg_nn.GATv2Conv(F_IN, 4,
                                                              share_weights=True).state_dict())
    # _adopt converts in place and keeps the very Parameter objects; convert uses it.
    params = dict(ref.named_parameters())
    model = torch.nn.Sequential(ref)
    gnnact.convert(model, Config(bits=2))
    assert type(ref) is GATv2Conv and ref.config.bits == 2
    assert all(p is params[k] for k, p in ref.named_parameters())
    assert GATv2Conv._adopt(pyg_nn.GATv2Conv(F_IN, 4), None).config == Config()
    with pytest.raises(TypeError, match="config"):
        GATv2Conv(F_IN, 4, config=2)
    with pytest.raises(TypeError, match="GATv2Conv"):
        GATv2Conv._adopt(torch.nn.Linear(2, 2), None)
    # Only a sum aggregation is fused: other aggr values are refused, and left to PyG
    # (with a warning) by convert.
    with pytest.raises(ValueError, match="aggr"):
        GATv2Conv(F_IN, 4, aggr="mean")
    mean = torch.nn.Sequential(pyg_nn.GATv2Conv(F_IN, 4, aggr="mean"))
    with pytest.warns(UserWarning, match="unconverted"):
        gnnact.convert(mean)
    assert type(mean[0]) is pyg_nn.GATv2Conv


def test_pyg_path_generated_propagate_and_hooks():
    # DESIGN §7: PyG compiles propagate()/edge_updater() per class name; with the types set
    # explicitly, PyG's own forward runs on the subclass and agrees.
    torch.manual_seed(0)
    ours = GATv2Conv(F_IN, 4, heads=3, edge_dim=2, config=EXACT).double()
    x, ei, ea = _feats(N, F_IN), _edges(), _feats(E, 2)
    expected = pyg_nn.GATv2Conv.forward(ours, x, ei, ea)
    assert _rel(ours(x, ei, ea), expected) <= TOL
    ref = pyg_nn.GATv2Conv(F_IN, 4, heads=3, edge_dim=2).double()
    ref.load_state_dict(ours.state_dict())
    assert _rel(ref(x, ei, ea), expected) <= TOL
    # A registered PyG hook needs PyG's message passing: the layer runs it, and the hook sees
    # the E x H x C messages.
    seen = []
    handle = ours.register_message_forward_hook(lambda m, inp, out: seen.append(out.shape))
    assert _rel(ours(x, ei, ea), expected) <= TOL
    assert seen and seen[0][1:] == (3, 4)
    handle.remove()
    ours(x, ei, ea)
    assert len(seen) == 1  # the fused path again


def test_errors_and_empty_graph():
    ours = GATv2Conv(F_IN, 4, heads=2, config=Config(bits=2)).double()
    # Static-graph features take PyG's path: PyG's own error.
    static = _feats(N, F_IN).view(N, 2, 3)
    with pytest.raises(AssertionError):
        pyg_nn.GATv2Conv(F_IN, 4, heads=2).double()(static, _edges())
    with pytest.raises(AssertionError):
        ours(static, _edges())
    with pytest.raises(ValueError, match="target features"):
        ours((_feats(N, F_IN), None), _edges())
    with pytest.raises(ValueError, match="edge_dim"):
        ours(_feats(N, F_IN), _edges(), _feats(E, 2))
    with pytest.raises(ValueError, match="size"):
        ours(_feats(N, F_IN), to_torch_csr_tensor(_edges(), size=(N + 1, N + 1)))
    with pytest.raises(ValueError, match="edge_index"):
        ours(_feats(N, F_IN), _edges(n_src=N + 5, n_dst=N + 5))
    if WITH_TORCH_SPARSE:  # as PyG: no self-loop edge features for a SparseTensor
        adj = SparseTensor.from_edge_index(_edges(), sparse_sizes=(N, N))
        with pytest.raises(NotImplementedError, match="SparseTensor"):
            GATv2Conv(F_IN, 4, edge_dim=2).double()(_feats(N, F_IN), adj)
    # No edges at all: the output is the bias, gradients are zero.
    empty = GATv2Conv(F_IN, 4, heads=2, add_self_loops=False, config=Config(bits=2)).double()
    x = _feats(N, F_IN).requires_grad_()
    out = empty(x, torch.empty(2, 0, dtype=torch.long))
    out.sum().backward()
    assert torch.equal(out, empty.bias.expand_as(out).detach())
    assert torch.count_nonzero(x.grad) == 0


# ------------------------------------------------------------------------ the op


def _op_inputs(seed: int = 0, n_src: int = 9, n_dst: int = 7, e: int = 30, heads: int = 2,
               channels: int = 3, dim: int = 2):
    g = torch.Generator().manual_seed(seed)
    ei = torch.stack([torch.randint(0, n_src, (e,), generator=g),
                      torch.randint(0, n_dst, (e,), generator=g)])
    graph = Graph.from_coo(ei[0], ei[1], n_src, n_dst)

    def t(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64).requires_grad_()

    return (graph, t(n_src, heads, channels), t(n_dst, heads, channels),
            t(1, heads, channels), t(e, dim), t(heads * channels, dim))


def test_op_gradcheck():
    graph, x_l, x_r, att, ea, w_e = _op_inputs()

    def separate(x_l, x_r, att, ea, w_e):
        return gatv2_attention(x_l, x_r, att, graph, edge_attr=ea, w_edge=w_e,
                               negative_slope=0.3, return_attention=True, config=EXACT)

    assert torch.autograd.gradcheck(separate, (x_l, x_r, att, ea, w_e), fast_mode=True)
    # x_r is x_l (one tensor, a gradient from both sides), no edge features.
    square, x_s, _, att_s, _, _ = _op_inputs(n_dst=9)
    assert torch.autograd.gradcheck(
        lambda x, a: gatv2_attention(x, x, a, square, return_attention=True, config=EXACT),
        (x_s, att_s), fast_mode=True)

    def dropped(x_l, att, w_e):  # dropout in training, the mask fixed by the seed
        torch.manual_seed(0)
        return gatv2_attention(x_l, x_r.detach(), att, graph, edge_attr=ea.detach(),
                               w_edge=w_e, dropout=0.4, training=True, config=EXACT)

    assert torch.autograd.gradcheck(dropped, (x_l, att, w_e), fast_mode=True)


def test_op_chunking_does_not_change_results(monkeypatch):
    # One head of 3 channels: 3 mask bits per edge, so chunks of 8 edges end on byte
    # boundaries only because chunk starts are multiples of 8 edges.
    graph, x_l, x_r, att, ea, w_e = _op_inputs(e=61, heads=1, channels=3)

    def run():
        for t in (x_l, x_r, att, ea, w_e):
            t.grad = None
        out, alpha = gatv2_attention(x_l, x_r, att, graph, edge_attr=ea, w_edge=w_e,
                                     return_attention=True, config=EXACT)
        (out.sum() + (alpha * alpha).sum()).backward()
        return [out, alpha] + [t.grad.clone() for t in (x_l, x_r, att, ea, w_e)]

    whole = run()
    monkeypatch.setattr(gatv2_ops, "CHUNK_ELEMENTS", 1)  # 8 edges per chunk: 8 chunks
    assert len(list(gatv2_ops._chunks(61, 3, graph.num_dst, torch.device("cpu")))) == 8
    chunked = run()
    for a, b in zip(chunked, whole, strict=True):
        assert _rel(a, b) <= 1e-12


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("rows", [10, 2_000, 10**6])
def test_op_chunks_stay_below_half_a_node_tensor(rows, device):
    """Chunks of at most CHUNK_ELEMENTS values, and of half a node tensor on a small graph
    (not below MIN_CHUNK_ELEMENTS, on a GPU GPU_BLOCK_ELEMENTS), starting at multiples of 8
    edges, covering every edge. (A device's type is all that is read: no GPU needed.)"""
    per_edge, num_edges = 3 * 128, 50_003
    least = GPU_BLOCK_ELEMENTS if device == "cuda" else gatv2_ops.MIN_CHUNK_ELEMENTS
    limit = min(gatv2_ops.CHUNK_ELEMENTS, max(least, rows * per_edge // 2))
    chunks = list(gatv2_ops._chunks(num_edges, per_edge, rows, torch.device(device)))
    assert all(sl.start % 8 == 0 and (sl.stop - sl.start) * per_edge <= limit for sl in chunks)
    # As large as allowed: every chunk but the last holds `limit` values within 8 edges.
    assert all((sl.stop - sl.start + 8) * per_edge > limit for sl in chunks[:-1])
    assert [sl.start for sl in chunks[1:]] == [sl.stop for sl in chunks[:-1]]
    assert chunks[0].start == 0 and chunks[-1].stop == num_edges


def test_op_validation():
    graph, x_l, x_r, att, ea, w_e = _op_inputs()
    with pytest.raises(ValueError, match="x_l has 7 rows"):
        gatv2_attention(x_r, x_r, att, graph)
    with pytest.raises(ValueError, match="x_r has 9 rows"):
        gatv2_attention(x_l, x_l.detach().clone(), att, graph)
    with pytest.raises(ValueError, match="x_r must have shape"):
        gatv2_attention(x_l, None, att, graph)
    with pytest.raises(ValueError, match="att must"):
        gatv2_attention(x_l, x_r, att[:, :1], graph)
    with pytest.raises(ValueError, match="w_edge=None"):
        gatv2_attention(x_l, x_r, att, graph, edge_attr=ea)
    with pytest.raises(ValueError, match="edge_attr must"):
        gatv2_attention(x_l, x_r, att, graph, edge_attr=ea[:-1], w_edge=w_e)
    with pytest.raises(ValueError, match="w_edge must"):
        gatv2_attention(x_l, x_r, att, graph, edge_attr=ea, w_edge=w_e[:-1])
    with pytest.raises(ValueError, match="dropout"):
        gatv2_attention(x_l, x_r, att, graph, dropout=1.5)
    with pytest.raises(TypeError, match="floating"):
        gatv2_attention(x_l.long(), x_r, att, graph)


def test_half_precision_fallback_paths():
    # bf16 has no CPU sparse CSR product: the chunked gather/scatter paths run instead.
    graph, *tensors = _op_inputs()
    args = [t.detach().bfloat16().requires_grad_() for t in tensors]
    ref_args = [t.detach().float().requires_grad_() for t in args]
    out = gatv2_attention(*args[:3], graph, edge_attr=args[3], w_edge=args[4],
                          config=Config(bits=8))
    out.float().sum().backward()
    ref = gatv2_attention(*ref_args[:3], graph, edge_attr=ref_args[3], w_edge=ref_args[4],
                          config=EXACT)
    ref.sum().backward()
    assert out.dtype == torch.bfloat16
    assert _rel(out.float(), ref) < 2e-2
    for a, r in zip(args, ref_args, strict=True):
        assert a.grad.dtype == torch.bfloat16 and _rel(a.grad.float(), r.grad) < 5e-2


# ------------------------------------------------------------------------ memory


def _packed(n: int, bits: int, group: int = 512) -> int:
    """Bytes of ``quantize(t, bits, group)`` for ``n`` values (PackedTensor's layout):
    groups of ``min(G, n)``, each ``ceil(G b / 8)`` code bytes + float32 scale and zero."""
    g = min(group, n)
    return math.ceil(n / g) * (packed_code_bytes(g, bits) + 8)


def _looped(ei: Tensor, n: int) -> int:
    return add_self_loops(remove_self_loops(ei)[0], num_nodes=n)[0].size(1)


def test_saved_bytes_exact_and_no_edge_tensors():
    n, f, heads, c, e, d = 40, 16, 3, 8, 300, 4
    x, ei, ea = _feats(n, f), _edges(n_src=n, n_dst=n, e=e), _feats(e, d, seed=3)
    e_loop = _looped(ei, n)
    ehc = e_loop * heads * c
    torch.manual_seed(0)
    ref = pyg_nn.GATv2Conv(f, c, heads=heads).double()

    def context(out: Tensor, *exclude: Tensor) -> int:
        return breakdown(out.sum(), exclude=[x, ei, *exclude]).context

    # PyG keeps E x H x C tensors: the messages x_j, the LeakyReLU input and its output.
    pyg_records = saved_tensors(ref(x, ei).sum(), exclude=[x])
    assert sum(math.prod(r.shape) == ehc for r in pyg_records if r.first) >= 3

    ours = GATv2Conv._adopt(copy.deepcopy(ref), Config(bits=2))
    out = ours(x, ei)
    # X^l at 2 bits, twice (the shared copy, and one rounded independently for grad att),
    # X^r at 2 bits, alpha [H, E] at 8 bits, the LeakyReLU mask at 1 bit per edge, head and
    # channel; att is a parameter and x a resident input (kept by the linear maps by
    # reference): nothing else.
    x_hat = _packed(n * heads * c, 2)
    per_edge = _packed(e_loop * heads, 8) + math.ceil(ehc / 8)
    assert context(out) == 3 * x_hat + per_edge
    records = [r for r in saved_tensors(out.sum(), exclude=[x, ei]) if r.kind == "context"]
    assert all(math.prod(r.shape) != ehc and r.nbytes < ehc for r in records)

    # Shared weights: X^r is X^l, not kept again. Without resident inputs x is packed too
    # (once, for lin_l and the residual alike).
    shared = GATv2Conv(f, c, heads=heads, share_weights=True, residual=True,
                       config=Config(bits=2, resident_inputs=False)).double()
    assert context(shared(x, ei)) == 2 * x_hat + per_edge + _packed(n * f, 2)
    # A frozen att needs neither the second copy of X^l nor X^r. (att itself, no longer a
    # graph leaf, is excluded by hand: a parameter lives on anyway.)
    ours.att.requires_grad_(False)
    assert context(ours(x, ei), ours.att) == x_hat + per_edge
    ours.att.requires_grad_(True)

    # Training with dropout adds the 1-bit keep mask per edge and head; edge features add
    # E x D at 2 bits (with self-loops they are a temporary made by the layer, so packed),
    # never their E x H x C projection.
    edged = GATv2Conv(f, c, heads=heads, edge_dim=d, dropout=0.3,
                      config=Config(bits=2)).double().train()
    out = edged(x, ei, ea)
    assert context(out, ea) == (3 * x_hat + per_edge + math.ceil(e_loop * heads / 8)
                                + _packed(e_loop * d, 2))
    records = [r for r in saved_tensors(out.sum(), exclude=[x, ei, ea]) if r.kind == "context"]
    assert all(math.prod(r.shape) != ehc and r.nbytes < ehc for r in records)
    # The caller's edge features without added self-loops: resident, kept by reference.
    edged.add_self_loops = False
    assert context(edged(x, ei, ea), ea) == (
        3 * x_hat + _packed(e * heads, 8) + math.ceil(e * heads * c / 8)
        + math.ceil(e * heads / 8))

    # Against PyG: three E x H x C float64 tensors and more, over 50x what the twin keeps
    # (C + 8 bits per edge and head here, against PyG's 3 x 64 C and its E x H tensors).
    pyg_context = context(ref(x, ei))
    assert pyg_context > 3 * ehc * 8
    assert pyg_context > 50 * context(ours(x, ei))


# ------------------------------------------------------------------------ unbiasedness


def _z_scores(share_weights: bool, names: tuple[str, ...], n: int = 200,
              first: int = 0) -> tuple[Tensor, float]:
    r""":math:`z_k = (\bar g_k - g^*_k)\sqrt n/\hat\sigma_k` of the gradients ``names`` over
    ``n`` seeded 2-bit passes (seeds ``first`` to ``first + n - 1``) against the exact ones
    (eval mode: no dropout noise), and the error of their mean relative to that of one pass."""
    n_nodes = 24
    x, ei = _feats(n_nodes, 6), _edges(n_src=n_nodes, n_dst=n_nodes, e=96)
    ea = _feats(96, 2, seed=8)
    torch.manual_seed(0)
    module = GATv2Conv(6, 4, heads=3, edge_dim=2, share_weights=share_weights).double().eval()
    w = torch.randn(n_nodes, 12, generator=torch.Generator().manual_seed(3),
                    dtype=torch.float64)

    def grads(config: Config, seed: int) -> Tensor:
        module.config = config
        module.zero_grad()
        torch.manual_seed(seed)  # the rounding noise of every quantize() call
        (module(x, ei, ea) * w).sum().backward()
        params = dict(module.named_parameters())
        return torch.cat([params[k].grad.flatten() for k in names])

    exact = grads(EXACT, 0)
    samples = torch.stack([grads(Config(bits=2), s) for s in range(first, first + n)])
    mean, std = samples.mean(0), samples.std(0)
    assert (std > 0).all()  # every element is noisy: the test has power everywhere
    shrink = float((mean - exact).norm()) / float((samples[0] - exact).norm())
    return (mean - exact) * math.sqrt(n) / std, shrink


@pytest.mark.parametrize("share_weights", [False, True])
def test_gradients_unbiased_at_2_bits(share_weights):
    r"""The mean of n = 200 seeded 2-bit gradients of ``att``, ``lin_l``, ``lin_r`` and
    ``lin_edge`` (attention coefficients at 8 bits) approaches the exact one as
    :math:`1/\sqrt{n}`.

    With the resident input :math:`x` kept exactly, the weight gradients are linear in the
    rounded :math:`\hat X^l` and edge features (the LeakyReLU mask is exact), and
    :math:`\nabla\mathbf{a}` multiplies :math:`\nabla s` (from :math:`\hat X^l`) by :math:`z`
    rebuilt from an independently rounded copy. So with unbiased rounding each :math:`z_k` is
    Student-t (199 dof): the mean of :math:`z_k^2` stays near 1 (bound 1.5; a bias of half a
    standard error everywhere would give 1.25 + noise) and :math:`\max|z_k| < 5`
    (:math:`P(|t| > 5) \approx 10^{-6}`). The known bias, :math:`\hat\alpha` entering the
    softmax backward twice, is of order :math:`(1/255)^2` relative, far below the standard
    error. The :math:`z_k` of one batch share its passes' noise and are correlated, so one
    batch's mean of :math:`z_k^2` spreads widely (0.66-1.58 in four runs with other seeds and
    shared weights): the bound holds the mean over four independent batches (spread about
    half as wide).
    """
    names = ("att", "lin_l.weight", "lin_r.weight", "lin_edge.weight")
    names = names if not share_weights else names[:2] + names[3:]
    batches = [_z_scores(share_weights, names, first=200 * b) for b in range(4)]
    z = torch.stack([z for z, _ in batches])
    shrink = batches[0][1]
    assert float(z.pow(2).mean()) < 1.5
    assert float(z.abs().max()) < 5.0
    # The error of the mean is the single-sample error shrunk by ~sqrt(n) (here ~14x).
    assert shrink < 0.25


def test_att_gradient_needs_the_independent_copy(monkeypatch):
    # Rebuilding z from the shared copy of X^l, which grad s reads too, biases grad att by
    # Cov(<G_i, X^_j>, X^_j) = G_i Var[X^_j]: the same test sees it at once.
    monkeypatch.setattr(gatv2_ops, "independent_quantize", lambda *args: None)
    z, _ = _z_scores(False, ("att",))
    assert float(z.pow(2).mean()) > 10


# ------------------------------------------------------------------------ models


def _gat_v2_model(f_in: int, classes: int, **kwargs) -> torch.nn.Module:
    return GAT(f_in, 48, 3, classes, heads=3, v2=True, **kwargs)  # 3 heads x 16 channels


def test_convert_pyg_gat_v2_model(monkeypatch):
    data = synthetic_graph(400, 10, 16, 4, seed=0)
    x, ei, y = data.x, data.edge_index, data.y
    torch.manual_seed(0)
    model = _gat_v2_model(16, 4).double()
    twin = gnnact.convert(copy.deepcopy(model), EXACT)
    assert all(type(conv) is GATv2Conv for conv in twin.convs)
    assert list(twin.state_dict()) == list(model.state_dict())

    # Config(bits=32): the converted model computes what PyG's does, gradients included.
    def step(m: torch.nn.Module) -> list[Tensor]:
        m.zero_grad()
        F.cross_entropy(m(x.double(), ei), y).backward()
        return [m(x.double(), ei)] + [p.grad for p in m.parameters()]

    for a, b in zip(step(twin), step(model), strict=True):
        assert _rel(a, b) <= TOL

    # Saved context at 2 bits (float32): the twin against the generic pipeline, which is what
    # convert did for GATv2Conv before it had a twin.
    model = model.float()
    with monkeypatch.context() as patch:
        patch.delitem(CONVERSIONS, pyg_nn.GATv2Conv)
        generic = gnnact.convert(copy.deepcopy(model), Config(bits=2))
    assert all(type(conv) is pyg_nn.GATv2Conv for conv in generic.convs)
    twin = gnnact.convert(copy.deepcopy(model), Config(bits=2))

    def context(m: torch.nn.Module) -> int:
        torch.manual_seed(0)
        return breakdown(F.cross_entropy(m(x, ei), y), exclude=[x, ei]).context

    fp32, ours, baseline = context(model), context(twin), context(generic)
    # (The generic pipeline keeps the lifted x_i, x_j as node rows and an index since
    # gnnact.compress.gather: at least 3x the twin's before, 2.5x now.)
    assert baseline >= 2 * ours, (baseline, ours)
    assert fp32 >= 40 * ours, (fp32, ours)


def test_converted_gat_v2_trains():
    data = synthetic_graph(300, 8, 16, 4, seed=1)
    torch.manual_seed(0)
    model = gnnact.convert(_gat_v2_model(16, 4, dropout=0.2), Config(bits=2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(15):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.x, data.edge_index)[data.train_mask],
                               data.y[data.train_mask])
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < 0.7 * losses[0], losses


@pytest.mark.parametrize("residual", [False, True])
def test_input_features_restored_once_for_both_projections(monkeypatch, residual):
    """At 2 bits, on features that need no gradient, ``lin_l``, ``lin_r`` (and ``res``) are one
    linear map over their stacked weights: backward restores ``x`` once, where each map
    restored it; the values are the separate maps' (same packed copy of ``x``) up to float
    summation order."""
    config = Config(bits=2, min_bytes=0)
    _, ours = _pair(config, in_channels=F_IN, out_channels=4, heads=3, residual=residual)
    ours = ours.float()
    x, ei = _feats(N, F_IN).float(), _edges()
    restores = []
    original = GATv2Conv._project

    def run() -> tuple[Tensor, list[Tensor]]:
        ours.zero_grad()
        torch.manual_seed(0)
        out = ours(x, ei)
        out.pow(2).sum().backward()
        return out, [p.grad.clone() for p in ours.parameters()]

    def count(load):  # the linear maps' restores of their context
        def spy(ctx, *args, **kwargs):
            restores.append(ctx)
            return load(ctx, *args, **kwargs)
        return spy

    monkeypatch.setattr(dense, "load_context", count(dense.load_context))
    out, grads = run()
    stacked = len(restores)
    restores.clear()
    monkeypatch.setattr(GATv2Conv, "_project_all",
                        lambda self, lins, x: [original(self, lin, x) for lin in lins])
    ref_out, ref_grads = run()
    assert (stacked, len(restores)) == (1, 3 if residual else 2)
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)
    for g, h in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, h, rtol=1e-5, atol=1e-5)
    # Where x needs a gradient, the maps stay separate: the stacked weight would be kept.
    monkeypatch.undo()
    monkeypatch.setattr(dense, "load_context", count(dense.load_context))
    restores.clear()
    ours(x.clone().requires_grad_(), ei).sum().backward()
    assert len(restores) == (3 if residual else 2)
