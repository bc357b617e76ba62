"""Conformance of the four conv twins with the PyG classes they replace.

What PyG's own tests of ``GCNConv``, ``SAGEConv``, ``GATConv`` and ``GCN2Conv`` check (and its
static-graph and message-passing hook tests), re-expressed with the class resolved to the gnnact
twin at ``Config(bits=32)`` and compared with PyG's module holding the same ``state_dict``, in
float64: outputs and gradients (inputs and every parameter) equal to round-off, ``repr``, every
adjacency type, lazy initialisation, bipartite input, attention weights, edge features, every
aggregation, each hook kind, explain mode, static graphs, PyG's cache attributes, and PyG's own
errors (same type, same message). TorchScript is the one thing a twin does not do: it raises
one clear error instead.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor, nn
from torch_geometric import EdgeIndex
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks
from torch_geometric.nn.aggr import MeanAggregation, MLPAggregation, SumAggregation
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csc_tensor

import gnnact
from gnnact import Config
from gnnact.nn.conv.base import MESSAGE_PASSING_HOOKS

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
    pytest.mark.filterwarnings("ignore:Sparse CSC tensor support is in beta"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled"),
    pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated"),
    pytest.mark.filterwarnings("ignore:Converting sparse tensor to CSR format"),
]

EXACT = Config(bits=32)
TWINS: dict[type, type] = {
    pyg_nn.GCNConv: gnnact.nn.GCNConv,
    pyg_nn.SAGEConv: gnnact.nn.SAGEConv,
    pyg_nn.GATConv: gnnact.nn.GATConv,
    pyg_nn.GCN2Conv: gnnact.nn.GCN2Conv,
}

N = 6
#: A small directed graph without duplicates or self-loops; targets (row 1) not sorted.
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 3, 0, 2, 5],
                      [1, 0, 1, 2, 3, 4, 5, 5, 3, 0, 2]])
#: Another graph on the same nodes (for the caches: a later call's input they must ignore).
OTHER = torch.tensor([[0, 1, 2, 3, 4], [2, 3, 4, 5, 0]])
#: Bipartite: 6 sources, 3 targets.
BIPARTITE = torch.tensor([[0, 1, 2, 3, 4, 5, 0], [0, 0, 1, 1, 2, 2, 2]])
SPARSE_KINDS = ["csr", "coo"] + (["SparseTensor"] if WITH_TORCH_SPARSE else [])
KINDS = ["edge_index", "EdgeIndex", *SPARSE_KINDS]


# ----------------------------------------------------------------------------- helpers


def features(*shape: int, seed: int = 0) -> Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed),
                       dtype=torch.float64).requires_grad_()


def adjacency(kind: str, ei: Tensor = EDGES, n_src: int = N, n_dst: int = N,
              value: Tensor | None = None) -> Any:
    """``ei`` as each adjacency PyG's layers take (sparse ones as the transposed ``adj_t``)."""
    if kind == "edge_index":
        return ei
    if kind == "EdgeIndex":
        return EdgeIndex(ei, sparse_size=(n_src, n_dst))
    ones = torch.ones(ei.size(1), dtype=torch.float64)
    if kind == "csr":  # as PyG's tests build it: the transpose of a CSC adjacency
        return to_torch_csc_tensor(ei, ones if value is None else value, (n_src, n_dst)).t()
    if kind == "coo":
        return to_torch_coo_tensor(ei, ones if value is None else value,
                                   (n_src, n_dst)).t().coalesce()
    if kind == "SparseTensor":
        return SparseTensor.from_edge_index(ei, value, sparse_sizes=(n_src, n_dst)).t()
    raise AssertionError(kind)


def pair(cls: type, *args: Any, **kwargs: Any) -> tuple[nn.Module, nn.Module]:
    """PyG's module and the twin built with the same arguments (modules among them copied),
    with the same parameters, in float64."""
    torch.manual_seed(0)
    ref = cls(*args, **kwargs).double()
    twin = TWINS[cls](*args, config=EXACT, **copy.deepcopy(kwargs)).double()
    assert type(twin).__name__ == cls.__name__ and isinstance(twin, cls)
    if not _lazy(ref):
        twin.load_state_dict(ref.state_dict())
    return ref, twin


def _lazy(module: nn.Module) -> bool:
    return any(isinstance(p, nn.parameter.UninitializedParameter) for p in module.parameters())


def _dense(value: Any) -> Any:
    if isinstance(value, Tensor) and value.layout != torch.strided:
        return value.to_dense()
    if WITH_TORCH_SPARSE and isinstance(value, SparseTensor):
        return value.to_dense()
    return value


def _leaves(value: Any) -> list[Tensor]:
    """The tensors of a (nested) output, sparse ones as dense."""
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _leaves(v)]
    value = _dense(value)
    assert isinstance(value, Tensor), type(value)
    return [value.as_tensor() if isinstance(value, EdgeIndex) else value]


def run_both(ref: nn.Module, twin: nn.Module, *args: Any, grad: tuple[Tensor, ...] = (),
             pyg_path: bool = False, **kwargs: Any) -> Any:
    """``ref`` and ``twin`` on the same input: equal outputs (also index tensors and attention
    weights) and equal gradients of ``grad`` and of every parameter; the twin took PyG's own
    forward if ``pyg_path``, else its compressed path. Returns the twin's output."""
    expected = ref(*args, **kwargs)
    if _lazy(twin):  # materialise (a first call), then take PyG's parameters
        twin(*args, **kwargs)
        twin.load_state_dict(ref.state_dict())
    with counting_propagate(twin) as calls:
        out = twin(*args, **kwargs)
    assert len(calls) == pyg_path, "PyG's path" if pyg_path else "the compressed path"
    got, want = _leaves(out), _leaves(expected)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)
    outputs = [(a, b) for a, b in zip(got, want, strict=True)
               if a.is_floating_point() and a.requires_grad]
    if not outputs:  # (under torch.no_grad)
        return out
    gen = torch.Generator().manual_seed(1)
    weights = [torch.randn(a.shape, generator=gen, dtype=a.dtype) for a, _ in outputs]
    params = [p for p in ref.parameters() if p.requires_grad]
    twin_params = [p for p in twin.parameters() if p.requires_grad]
    assert len(params) == len(twin_params)

    def grads(side: int, wrt: list[Tensor]) -> tuple:
        loss = sum((o[side] * w).sum() for o, w in zip(outputs, weights, strict=True))
        return torch.autograd.grad(loss, wrt, allow_unused=True, retain_graph=True)

    for a, b, t in zip(grads(0, [*grad, *twin_params]), grads(1, [*grad, *params]),
                       [*grad, *params], strict=True):
        torch.testing.assert_close(torch.zeros_like(t) if a is None else a,
                                   torch.zeros_like(t) if b is None else b)
    return out


@contextlib.contextmanager
def counting_propagate(conv: nn.Module) -> Iterator[list[int]]:
    """Counts the calls of ``conv.propagate``: PyG's own forward runs it (once), the twin's
    compressed path never does."""
    calls: list[int] = []
    inner = conv.propagate
    before = conv.__dict__.get("propagate")

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return inner(*args, **kwargs)

    conv.__dict__["propagate"] = counted
    try:
        yield calls
    finally:
        if before is None:
            del conv.__dict__["propagate"]
        else:
            conv.__dict__["propagate"] = before


def same_error(fn_ref: Any, fn_twin: Any) -> BaseException:
    """Both calls raise: the same exception type with the same message. Returns the twin's."""
    with pytest.raises(Exception) as ref_error:
        fn_ref()
    with pytest.raises(Exception) as twin_error:
        fn_twin()
    assert type(twin_error.value) is type(ref_error.value)
    assert str(twin_error.value) == str(ref_error.value)
    return twin_error.value


# ----------------------------------------------------------------------------- repr


@pytest.mark.parametrize(("cls", "args", "kwargs", "text"), [
    (pyg_nn.GCNConv, (16, 32), {}, "GCNConv(16, 32)"),
    (pyg_nn.GCNConv, (-1, 32), {}, "GCNConv(-1, 32)"),
    (pyg_nn.SAGEConv, (8, 32), {}, "SAGEConv(8, 32, aggr=mean)"),
    (pyg_nn.SAGEConv, (8, 32), {"aggr": "sum"}, "SAGEConv(8, 32, aggr=sum)"),
    (pyg_nn.SAGEConv, ((8, 16), 32), {}, "SAGEConv((8, 16), 32, aggr=mean)"),
    (pyg_nn.SAGEConv, (-1, 32), {}, "SAGEConv(-1, 32, aggr=mean)"),
    (pyg_nn.SAGEConv, (8, 32), {"aggr": "lstm"}, "SAGEConv(8, 32, aggr=lstm)"),
    (pyg_nn.SAGEConv, (8, 32), {"aggr": ["mean", "max"]}, "SAGEConv(8, 32, aggr=['mean', 'max'])"),
    (pyg_nn.GATConv, (8, 32), {"heads": 2}, "GATConv(8, 32, heads=2)"),
    (pyg_nn.GATConv, ((8, 16), 32), {"heads": 2}, "GATConv((8, 16), 32, heads=2)"),
    (pyg_nn.GCN2Conv, (16,), {"alpha": 0.2}, "GCN2Conv(16, alpha=0.2, beta=1.0)"),
])
def test_repr_is_pygs(cls, args, kwargs, text):
    ref, twin = pair(cls, *args, **kwargs)
    assert repr(ref) == text
    assert repr(twin) == text and str(twin) == text


def test_repr_of_torch_twins_and_converted_models():
    layers = [nn.Linear(3, 4), nn.Linear(3, 4, bias=False), nn.BatchNorm1d(5, momentum=None),
              nn.ReLU(), nn.LeakyReLU(0.2), nn.Dropout(0.3)]
    for layer in layers:
        text = repr(layer)
        assert repr(gnnact.convert(layer, Config(bits=2))) == text
    model = pyg_nn.models.GCN(16, 32, num_layers=2, out_channels=4, dropout=0.5)
    text = repr(model), [repr(m) for m in model.modules()]
    gnnact.convert(model, Config(bits=2))
    assert type(model.convs[0]) is gnnact.nn.GCNConv
    assert (repr(model), [repr(m) for m in model.modules()]) == text


# ----------------------------------------------------------------------------- GCNConv


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("weighted", [False, True])
def test_gcn_every_adjacency(kind, weighted):
    ref, twin = pair(pyg_nn.GCNConv, 16, 32)
    x = features(N, 16)
    value = torch.rand(EDGES.size(1), dtype=torch.float64) + 0.1 if weighted else None
    if kind in ("edge_index", "EdgeIndex"):
        w = None if value is None else value.requires_grad_()
        run_both(ref, twin, x, adjacency(kind), w, grad=(x,) if w is None else (x, w))
    else:
        run_both(ref, twin, x, adjacency(kind, value=value), grad=(x,))


@pytest.mark.parametrize("kwargs", [{"improved": True}, {"add_self_loops": False},
                                    {"normalize": False}, {"bias": False},
                                    {"flow": "target_to_source"}])
def test_gcn_options(kwargs):
    ref, twin = pair(pyg_nn.GCNConv, 16, 32, **kwargs)
    x = features(N, 16)
    run_both(ref, twin, x, EDGES, grad=(x,))


def test_gcn_flow_reverses_edges():
    ref, twin = pair(pyg_nn.GCNConv, 16, 32)
    x = features(N, 16)
    out = run_both(ref, twin, x, EDGES)
    twin.flow = "target_to_source"
    torch.testing.assert_close(twin(x, EDGES.flip(0)), out)


def test_gcn_lazy():
    ref, twin = pair(pyg_nn.GCNConv, -1, 32)
    x = features(N, 16)
    run_both(ref, twin, x, EDGES, grad=(x,))
    assert twin.lin.weight.shape == (32, 16)


def test_gcn_sparse_input_features():
    ref, twin = pair(pyg_nn.GCNConv, 16, 32)
    x = torch.sparse_coo_tensor(torch.tensor([[0, 0, 3], [0, 1, 7]]), torch.ones(3),
                                (N, 16), dtype=torch.float64)
    run_both(ref, twin, x, EDGES)


def test_gcn_bipartite_is_pygs_error():
    ref, twin = pair(pyg_nn.GCNConv, 16, 32)
    x = features(N, 16)
    error = same_error(lambda: ref((x, x), EDGES), lambda: twin((x, x), EDGES))
    assert isinstance(error, ValueError) and "bipartite" in str(error)


def test_gcn_empty_graph():
    ref, twin = pair(pyg_nn.GCNConv, 16, 32)
    x = features(N, 16)
    run_both(ref, twin, x, torch.empty(2, 0, dtype=torch.long), grad=(x,))


# ----------------------------------------------------------------------------- SAGEConv


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("project", [False, True])
@pytest.mark.parametrize("aggr", ["mean", "sum"])
def test_sage_every_adjacency(kind, project, aggr):
    ref, twin = pair(pyg_nn.SAGEConv, 8, 32, aggr=aggr, project=project)
    x = features(N, 8)
    run_both(ref, twin, x, adjacency(kind), grad=(x,))
    run_both(ref, twin, x, EDGES, size=(N, N))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("project", [False, True])
def test_sage_bipartite(kind, project):
    ref, twin = pair(pyg_nn.SAGEConv, (8, 16), 32, project=project)
    x_src, x_dst = features(N, 8), features(3, 16, seed=1)
    adj = adjacency(kind, BIPARTITE, N, 3)
    size = (N, 3) if kind == "edge_index" else None
    run_both(ref, twin, (x_src, x_dst), adj, grad=(x_src, x_dst))
    run_both(ref, twin, (x_src, None), adj, size, grad=(x_src,))


def test_sage_size_mismatch_is_pygs_error():
    ref, twin = pair(pyg_nn.SAGEConv, (8, 16), 32)
    x_src, x_dst = features(N, 8), features(3, 16, seed=1)
    same_error(lambda: ref((x_src, x_dst), BIPARTITE, (N, 4)),
               lambda: twin((x_src, x_dst), BIPARTITE, (N, 4)))


def test_sage_lazy():
    ref, twin = pair(pyg_nn.SAGEConv, -1, 32)
    x = features(N, 8)
    run_both(ref, twin, x, EDGES, grad=(x,))
    same_error(lambda: pyg_nn.SAGEConv(-1, 32, project=True),
               lambda: gnnact.nn.SAGEConv(-1, 32, project=True))


#: In-degree-sorted edges (LSTM aggregation needs its index sorted).
SORTED = EDGES[:, EDGES[1].argsort(stable=True)]


@pytest.mark.parametrize("aggr", ["max", "min", "std", "var", "softmax", "powermean", "median",
                                  "lstm"])
def test_sage_every_aggregation(aggr):
    ref, twin = pair(pyg_nn.SAGEConv, 8, 32, aggr=aggr)
    x = features(N, 8)
    run_both(ref, twin, x, SORTED, grad=(x,), pyg_path=True)
    if WITH_TORCH_SPARSE:
        run_both(ref, twin, x, adjacency("SparseTensor", SORTED), grad=(x,), pyg_path=True)


def test_sage_lstm_unsorted_is_pygs_error():
    ref, twin = pair(pyg_nn.SAGEConv, 8, 32, aggr="lstm")
    x = features(N, 8)
    error = same_error(lambda: ref(x, EDGES), lambda: twin(x, EDGES))
    assert "'index' tensor is not sorted" in str(error)


def test_sage_mlp_aggregation():
    degree = int(EDGES[1].bincount().max())
    aggr = MLPAggregation(in_channels=8, out_channels=8, max_num_elements=degree, num_layers=1)
    ref, twin = pair(pyg_nn.SAGEConv, 8, 32, aggr=aggr)
    x = features(N, 8)
    run_both(ref, twin, x, SORTED, grad=(x,), pyg_path=True)


@pytest.mark.parametrize("aggr_kwargs", [
    {"mode": "cat"},
    {"mode": "proj", "mode_kwargs": {"in_channels": 8, "out_channels": 16}},
    {"mode": "attn", "mode_kwargs": {"in_channels": 8, "out_channels": 16, "num_heads": 4}},
    {"mode": "sum"},
])
def test_sage_multi_aggregation(aggr_kwargs):
    aggr_kwargs = {**aggr_kwargs, "aggrs_kwargs": [{}, {}, {}, {"learn": True, "t": 1}]}
    ref, twin = pair(pyg_nn.SAGEConv, 8, 32, aggr=["mean", "max", "sum", "softmax"],
                     aggr_kwargs=aggr_kwargs)
    x = features(N, 8)
    run_both(ref, twin, x, EDGES, grad=(x,), pyg_path=True)
    if WITH_TORCH_SPARSE:
        run_both(ref, twin, x, adjacency("SparseTensor"), grad=(x,), pyg_path=True)


@pytest.mark.parametrize("aggr", [MeanAggregation(), SumAggregation()])
def test_sage_plain_aggregation_modules_take_the_compressed_path(aggr):
    ref, twin = pair(pyg_nn.SAGEConv, 8, 32, aggr=aggr)
    x = features(N, 8)
    run_both(ref, twin, x, EDGES, grad=(x,))


# ----------------------------------------------------------------------------- GATConv


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("residual", [False, True])
def test_gat_every_adjacency(kind, residual):
    ref, twin = pair(pyg_nn.GATConv, 8, 32, heads=2, residual=residual)
    x = features(N, 8)
    run_both(ref, twin, x, adjacency(kind), grad=(x,))
    if kind == "edge_index":
        run_both(ref, twin, x, EDGES, size=(N, N))


@pytest.mark.parametrize("kind", KINDS)
def test_gat_return_attention_weights(kind):
    ref, twin = pair(pyg_nn.GATConv, 8, 32, heads=2)
    x = features(N, 8)
    out = run_both(ref, twin, x, adjacency(kind), return_attention_weights=True, grad=(x,))
    loops = EDGES.size(1) + N
    if kind == "SparseTensor":
        assert out[1].sizes() == [N, N, 2] and out[1].nnz() == loops
    elif kind in ("csr", "coo"):
        assert out[1][0].shape == (N, N, 2) and out[1][0]._nnz() == loops
    else:
        assert out[1][0].shape == (2, loops) and out[1][1].shape == (loops, 2)
        alpha = out[1][1].detach()
        assert float(alpha.min()) >= 0 and float(alpha.max()) <= 1


@pytest.mark.parametrize("kind", KINDS)
def test_gat_bipartite(kind):
    ref, twin = pair(pyg_nn.GATConv, (8, 16), 32, heads=2, residual=True)
    x_src, x_dst = features(N, 8), features(3, 16, seed=1)
    adj = adjacency(kind, BIPARTITE, N, 3)
    size = (N, 3) if kind == "edge_index" else None
    run_both(ref, twin, (x_src, x_dst), adj, size=size, grad=(x_src, x_dst))
    run_both(ref, twin, (x_src, None), adj, size=(N, 3) if size else None, grad=(x_src,))


@pytest.mark.parametrize(("edge_dim", "fill_value"), [(1, 0.5), (1, "mean"), (4, 0.5),
                                                      (4, "mean")])
def test_gat_edge_features(edge_dim, fill_value):
    ref, twin = pair(pyg_nn.GATConv, 8, 32, heads=2, edge_dim=edge_dim, fill_value=fill_value)
    x = features(N, 8)
    shape = (EDGES.size(1),) if edge_dim == 1 else (EDGES.size(1), edge_dim)
    edge_attr = features(*shape, seed=2)
    run_both(ref, twin, x, EDGES, edge_attr, grad=(x, edge_attr))
    if WITH_TORCH_SPARSE:  # edge features and self-loops on a SparseTensor: PyG refuses
        adj = SparseTensor.from_edge_index(EDGES, edge_attr.detach(), (N, N)).t()
        error = same_error(lambda: ref(x, adj), lambda: twin(x, adj))
        assert isinstance(error, NotImplementedError)


def test_gat_empty_graph():
    ref, twin = pair(pyg_nn.GATConv, 8, 32, heads=2)
    out = run_both(ref, twin, torch.randn(0, 8, dtype=torch.float64),
                   torch.empty(2, 0, dtype=torch.long))
    assert out.shape == (0, 64)


def test_gat_lazy():
    ref, twin = pair(pyg_nn.GATConv, -1, 32, heads=2)
    x = features(N, 8)
    run_both(ref, twin, x, EDGES, grad=(x,))


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_gat_other_aggregations(aggr):
    ref, twin = pair(pyg_nn.GATConv, 8, 32, heads=2, aggr=aggr)
    x = features(N, 8)
    run_both(ref, twin, x, EDGES, grad=(x,), pyg_path=True)


# ----------------------------------------------------------------------------- GCN2Conv


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("shared_weights", [True, False])
def test_gcn2_every_adjacency(kind, weighted, shared_weights):
    ref, twin = pair(pyg_nn.GCN2Conv, 16, alpha=0.2, theta=0.5, layer=2,
                     shared_weights=shared_weights)
    x, x_0 = features(N, 16), features(N, 16, seed=1)
    value = torch.rand(EDGES.size(1), dtype=torch.float64) + 0.1 if weighted else None
    if kind in ("edge_index", "EdgeIndex"):
        run_both(ref, twin, x, x_0, adjacency(kind), value, grad=(x, x_0))
    else:
        run_both(ref, twin, x, x_0, adjacency(kind, value=value), grad=(x, x_0))


@pytest.mark.parametrize("kwargs", [{"normalize": False}, {"add_self_loops": False},
                                    {"aggr": "mean"}, {"aggr": "min"}])
def test_gcn2_options(kwargs):
    ref, twin = pair(pyg_nn.GCN2Conv, 16, alpha=0.2, **kwargs)
    x, x_0 = features(N, 16), features(N, 16, seed=1)
    if kwargs.get("aggr") != "min":
        run_both(ref, twin, x, x_0, EDGES, grad=(x, x_0))
        return
    # PyG's GCN2Conv scales the aggregate in place, which a min/max aggregation's backward
    # needs: its forward runs, its backward fails, and so do the twin's (PyG's path).
    with torch.no_grad():
        run_both(ref, twin, x, x_0, EDGES, pyg_path=True)
    out_ref, out_twin = ref(x, x_0, EDGES), twin(x, x_0, EDGES)
    error = same_error(lambda: out_ref.sum().backward(), lambda: out_twin.sum().backward())
    assert isinstance(error, RuntimeError) and "inplace operation" in str(error)


# ----------------------------------------------------------------------------- every aggr


def test_convert_converts_every_aggregation_without_warning():
    model = nn.ModuleList([
        pyg_nn.SAGEConv(8, 8, aggr="max"), pyg_nn.SAGEConv(8, 8, aggr="lstm"),
        pyg_nn.SAGEConv(8, 8, aggr=["mean", "std"]), pyg_nn.GCNConv(8, 8, aggr="mean"),
        pyg_nn.GATConv(8, 8, aggr="max"), pyg_nn.GCN2Conv(8, 0.1, aggr="max")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gnnact.convert(model, EXACT)
    assert [type(m).__module__.split(".")[0] for m in model] == ["gnnact"] * len(model)


@pytest.mark.parametrize("aggr", ["mean", "max"])
def test_gcn_other_aggregations(aggr):
    ref, twin = pair(pyg_nn.GCNConv, 16, 32, aggr=aggr)
    x = features(N, 16)
    run_both(ref, twin, x, EDGES, grad=(x,), pyg_path=aggr == "max")


# ----------------------------------------------------------------------------- static graphs


@pytest.mark.parametrize(("cls", "args", "kwargs"), [
    (pyg_nn.GCNConv, (8, 16), {}),
    (pyg_nn.GCNConv, (8, 16), {"aggr": "mean"}),
    (pyg_nn.SAGEConv, (8, 16), {}),
    (pyg_nn.SAGEConv, (8, 16), {"aggr": "sum", "project": True}),
    (pyg_nn.SAGEConv, (8, 16), {"aggr": "max"}),
])
def test_static_graph(cls, args, kwargs):
    ref, twin = pair(cls, *args, **kwargs)
    x = features(3, N, 8)
    weight = torch.rand(EDGES.size(1), dtype=torch.float64, requires_grad=True)
    extra = (weight,) if cls is pyg_nn.GCNConv else ()
    out = run_both(ref, twin, x, EDGES, *extra, grad=(x, *extra),
                   pyg_path=kwargs.get("aggr") == "max")
    assert out.shape == (3, N, 16)
    # As PyG's static-graph test: a batch of copies of the graph, one after the other.
    batch = torch.cat([EDGES + i * N for i in range(3)], dim=1)
    batch_extra = (weight.repeat(3),) if extra else ()
    flat = twin(x.reshape(3 * N, 8), batch, *batch_extra)
    torch.testing.assert_close(out.reshape(3 * N, 16), flat)


@pytest.mark.parametrize("cls", [pyg_nn.GCNConv, pyg_nn.SAGEConv])
def test_static_graph_with_sparse_adjacency(cls):
    # PyG's fused sparse products take matrices only; the twin aggregates [B, N, F] anyway.
    ref, twin = pair(cls, 8, 16)
    x = features(3, N, 8)
    expected = ref(x, EDGES)
    for kind in SPARSE_KINDS:
        torch.testing.assert_close(twin(x, adjacency(kind)), expected)


def test_static_graph_gat_is_pygs_error():
    ref, twin = pair(pyg_nn.GATConv, 8, 16)
    x = features(3, N, 8)
    error = same_error(lambda: ref(x, EDGES), lambda: twin(x, EDGES))
    assert isinstance(error, AssertionError)
    assert str(error) == "Static graphs not supported in 'GATConv'"
    same_error(lambda: ref((x, x), EDGES), lambda: twin((x, x), EDGES))


def test_static_graph_gcn2_is_pygs_error():
    ref, twin = pair(pyg_nn.GCN2Conv, 8, alpha=0.2)
    x = features(3, N, 8)
    same_error(lambda: ref(x, x, EDGES), lambda: twin(x, x, EDGES))
    same_error(lambda: ref(x, x[0], EDGES), lambda: twin(x, x[0], EDGES))


# ----------------------------------------------------------------------------- cached=True


def _gcn_pair(cls: type, **kwargs: Any) -> tuple[nn.Module, nn.Module]:
    if cls is pyg_nn.GCNConv:
        return pair(cls, 8, 16, **kwargs)
    return pair(cls, 8, alpha=0.2, **kwargs)


def _call(conv: nn.Module, x: Tensor, adj: Any) -> Tensor:
    return conv(x, x, adj) if isinstance(conv, pyg_nn.GCN2Conv) else conv(x, adj)


def _assert_same_cache(ref: nn.Module, twin: nn.Module) -> None:
    for name in ("_cached_edge_index", "_cached_adj_t"):
        a, b = getattr(twin, name), getattr(ref, name)
        assert (a is None) == (b is None), name
        if a is not None:
            for u, v in zip(_leaves(a), _leaves(b), strict=True):
                torch.testing.assert_close(u, v)


@pytest.mark.parametrize("cls", [pyg_nn.GCNConv, pyg_nn.GCN2Conv])
def test_cached_fills_pygs_attributes(cls):
    ref, twin = _gcn_pair(cls, cached=True)
    x = features(N, 8)
    first = run_both(ref, twin, *((x, x) if cls is pyg_nn.GCN2Conv else (x,)), EDGES,
                     grad=(x,))
    assert isinstance(twin._cached_edge_index, tuple) and twin._cached_adj_t is None
    _assert_same_cache(ref, twin)
    # Later calls use the first graph, whatever their (tensor) adjacency, as PyG's.
    for adj in (OTHER, adjacency("csr", OTHER)):
        torch.testing.assert_close(_call(twin, x, adj), first)
        torch.testing.assert_close(_call(ref, x, adj), first)
    if WITH_TORCH_SPARSE:  # a SparseTensor has its own cache
        adj = adjacency("SparseTensor")
        torch.testing.assert_close(_call(twin, x, adj), _call(ref, x, adj))
        _assert_same_cache(ref, twin)
        assert twin._cached_adj_t is not None
        torch.testing.assert_close(_call(twin, x, adjacency("SparseTensor", OTHER)), first)


@pytest.mark.parametrize("cls", [pyg_nn.GCNConv, pyg_nn.GCN2Conv])
def test_cached_is_cleared_as_pygs(cls):
    ref, twin = _gcn_pair(cls, cached=True)
    x = features(N, 8)
    first = _call(twin, x, EDGES)
    _call(ref, x, EDGES)
    # Emptying the attribute empties the twin's own cache: the next call normalises anew.
    twin._cached_edge_index = ref._cached_edge_index = None
    other = _call(twin, x, OTHER)
    torch.testing.assert_close(other, _call(ref, x, OTHER))
    assert not torch.allclose(other, first)
    _assert_same_cache(ref, twin)
    # reset_parameters() empties both attributes, as PyG's.
    state = copy.deepcopy(ref.state_dict())
    for conv in (ref, twin):
        conv.reset_parameters()
        assert conv._cached_edge_index is None and conv._cached_adj_t is None
        conv.load_state_dict(state)
        torch.testing.assert_close(_call(conv, x, EDGES), first)
    # A filled attribute is used even with cached=False, as PyG's forward uses it.
    twin.cached = ref.cached = False
    torch.testing.assert_close(_call(twin, x, OTHER), first)
    torch.testing.assert_close(_call(ref, x, OTHER), first)


@pytest.mark.parametrize("cls", [pyg_nn.GCNConv, pyg_nn.GCN2Conv])
def test_cached_by_pyg_before_convert_is_kept(cls):
    ref, _ = _gcn_pair(cls, cached=True)
    x = features(N, 8)
    first = _call(ref, x, EDGES)
    cache = ref._cached_edge_index
    gnnact.convert(ref, EXACT)
    assert type(ref) is TWINS[cls] and ref._cached_edge_index is cache
    torch.testing.assert_close(_call(ref, x, OTHER), first)


@pytest.mark.parametrize("cls", [pyg_nn.GCNConv, pyg_nn.GCN2Conv])
def test_not_cached_fills_nothing(cls):
    ref, twin = _gcn_pair(cls)
    x = features(N, 8)
    for conv in (ref, twin):
        _call(conv, x, EDGES)
        assert conv._cached_edge_index is None and conv._cached_adj_t is None


# ----------------------------------------------------------------------------- hooks


#: conv -> (constructor, forward arguments); PyG's fused path (message_and_aggregate hooks) runs
#: on sparse adjacencies, its edge updater (edge_update hooks) in GATConv only.
HOOKED: dict[str, Any] = {
    "GCNConv": (lambda: pair(pyg_nn.GCNConv, 8, 16), lambda x, adj: (x, adj)),
    "SAGEConv": (lambda: pair(pyg_nn.SAGEConv, 8, 16), lambda x, adj: (x, adj)),
    "GATConv": (lambda: pair(pyg_nn.GATConv, 8, 16, heads=2), lambda x, adj: (x, adj)),
    "GCN2Conv": (lambda: pair(pyg_nn.GCN2Conv, 8, alpha=0.2), lambda x, adj: (x, x, adj)),
}
#: "_propagate_forward_pre_hook", ...: what MessagePassing.register<kind> registers.
HOOK_KINDS = [name[:-1] for name in MESSAGE_PASSING_HOOKS]


def test_hook_list_is_pygs():
    registers = {name[len("register"):] for name in dir(pyg_nn.MessagePassing)
                 if name.startswith("register_") and name not in dir(nn.Module)}
    assert registers == set(HOOK_KINDS)
    conv = pyg_nn.GCNConv(2, 2)
    assert all(isinstance(getattr(conv, name), dict) for name in MESSAGE_PASSING_HOOKS)


def _register(conv: nn.Module, kind: str, calls: list) -> Any:
    """A hook of ``kind`` that records its call and changes what it sees (a pre-hook returns
    nothing; a forward hook returns its output plus one), so the output shows it ran."""
    if kind.endswith("pre_hook"):
        def hook(module: nn.Module, inputs: tuple) -> None:
            assert module is conv
            calls.append(kind)
    else:
        def hook(module: nn.Module, inputs: tuple, output: Tensor) -> Tensor:
            assert module is conv
            calls.append(kind)
            return output + 1
    return getattr(conv, f"register{kind}")(hook)


def _where_pyg_fires(conv: str, kind: str) -> set[str]:
    """The adjacencies on which PyG's own forward calls hooks of ``kind``: its fused product
    (``message_and_aggregate``) runs on sparse ones except in GATConv, which alone has an edge
    updater."""
    stage = kind[1:].removesuffix("_pre_hook").removesuffix("_hook").removesuffix("_forward")
    both = {"edge_index", "sparse"}
    if stage == "propagate":
        return both
    if stage == "edge_update":
        return both if conv == "GATConv" else set()
    if conv == "GATConv":
        return both if stage in ("message", "aggregate") else set()
    return {"sparse"} if stage == "message_and_aggregate" else {"edge_index"}


@pytest.mark.parametrize("kind", HOOK_KINDS)
@pytest.mark.parametrize("conv", list(HOOKED))
def test_every_hook_kind_fires(conv, kind):
    make, inputs = HOOKED[conv]
    ref, twin = make()
    x = features(N, 8)
    sparse = "SparseTensor" if WITH_TORCH_SPARSE else "csr"
    fired = set()
    for name, adj in (("edge_index", EDGES), ("sparse", adjacency(sparse))):
        ref_calls: list[str] = []
        twin_calls: list[str] = []
        handles = [_register(ref, kind, ref_calls), _register(twin, kind, twin_calls)]
        run_both(ref, twin, *inputs(x, adj), grad=(x,), pyg_path=True)
        assert twin_calls == ref_calls  # as often as PyG's, with the same effect on the output
        if ref_calls:
            fired.add(name)
        for handle in handles:
            handle.remove()
        run_both(ref, twin, *inputs(x, adj), grad=(x,))  # without: the compressed path
    assert fired == _where_pyg_fires(conv, kind)


@pytest.mark.parametrize("conv", list(HOOKED))
def test_hooks_fire_on_each_path_as_in_pyg(conv):
    # Every kind at once: the twin's hooks fire exactly as PyG's, in the same order.
    make, inputs = HOOKED[conv]
    ref, twin = make()
    x = features(N, 8)
    ref_calls: list[str] = []
    twin_calls: list[str] = []
    for kind in HOOK_KINDS:
        _register(ref, kind, ref_calls)
        _register(twin, kind, twin_calls)
    run_both(ref, twin, *inputs(x, EDGES), grad=(x,), pyg_path=True)
    assert twin_calls == ref_calls and "_propagate_forward_hook" in ref_calls
    assert "_message_forward_pre_hook" in ref_calls
    assert ("_edge_update_forward_hook" in ref_calls) == (conv == "GATConv")
    if WITH_TORCH_SPARSE and conv != "GATConv":
        ref_calls.clear()
        twin_calls.clear()
        run_both(ref, twin, *inputs(x, adjacency("SparseTensor")), grad=(x,), pyg_path=True)
        assert twin_calls == ref_calls and "_message_and_aggregate_forward_hook" in ref_calls


# ----------------------------------------------------------------------------- explain, decomposed


@pytest.mark.parametrize("conv", list(HOOKED))
def test_explain_mode_edge_mask(conv):
    make, inputs = HOOKED[conv]
    ref, twin = make()
    x = features(N, 8)
    mask = torch.randn(EDGES.size(1), dtype=torch.float64, requires_grad=True)
    set_masks(ref, mask, EDGES)
    set_masks(twin, mask, EDGES)
    run_both(ref, twin, *inputs(x, EDGES), grad=(x, mask), pyg_path=True)
    clear_masks(twin)
    clear_masks(ref)
    run_both(ref, twin, *inputs(x, EDGES), grad=(x,))


@pytest.mark.parametrize("conv", list(HOOKED))
def test_decomposed_layers(conv):
    make, inputs = HOOKED[conv]
    ref, twin = make()
    x = features(N, 8)
    expected = twin(*inputs(x, EDGES))
    ref.decomposed_layers = twin.decomposed_layers = 2
    if conv in ("SAGEConv", "GATConv"):  # PyG cannot split their (source, target) pairs
        error = same_error(lambda: ref(*inputs(x, EDGES)), lambda: twin(*inputs(x, EDGES)))
        assert isinstance(error, AttributeError) and "chunk" in str(error)
    else:
        out = run_both(ref, twin, *inputs(x, EDGES), grad=(x,), pyg_path=True)
        torch.testing.assert_close(out, expected)


# ----------------------------------------------------------------------------- TorchScript


@pytest.mark.parametrize("module", [
    lambda: gnnact.nn.GCNConv(8, 16), lambda: gnnact.nn.SAGEConv(8, 16),
    lambda: gnnact.nn.GATConv(8, 16, heads=2), lambda: gnnact.nn.GCN2Conv(8, 0.2),
    lambda: gnnact.nn.Linear(3, 4), lambda: gnnact.nn.ReLU(),
])
def test_torchscript_is_refused_clearly(module):
    layer = module()
    pattern = (rf"TorchScript is not supported by gnnact layers: cannot script "
               rf"{type(layer).__name__}\(.*\) \({type(layer).__module__}\.")
    with pytest.raises(TypeError, match=pattern):
        torch.jit.script(layer)
    with pytest.raises(TypeError, match=pattern):  # inside a model too
        torch.jit.script(nn.Sequential(nn.Identity(), layer))
    if isinstance(layer, pyg_nn.MessagePassing):  # PyG's deprecated preparation for it
        with pytest.raises(TypeError, match=pattern):
            layer.jittable()


def test_torchscript_still_scripts_pyg_layers():
    # The refusal belongs to the twins: PyG's own class is untouched.
    conv = pyg_nn.GCNConv(8, 16)
    x = torch.randn(N, 8)
    torch.testing.assert_close(torch.jit.script(conv)(x, EDGES), conv(x, EDGES))
