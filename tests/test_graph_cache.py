"""gnnact's graph cache: who owns it (a layer, or an outer owner through ``use_graph_cache``),
its lifetime (weak keys, in-place invalidation, empty copies), and what a cached graph holds:
exact byte counts per conv for symmetric and asymmetric graphs, at most the caller's own int64
``edge_index``, with outputs and gradients still PyG's at 32 bits."""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import pickle
import threading

import pytest
import torch
import torch_geometric.nn as pyg_nn
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.typing import WITH_TORCH_SPARSE
from torch_geometric.utils import coalesce, to_torch_csr_tensor, to_undirected

import gnnact
from gnnact import Config, ops
from gnnact.ops.graph import (
    Graph,
    GraphCache,
    active_graph_cache,
    build_graph,
    cache_on,
    csr_tensor,
    graph_cache_for,
    graph_from,
    use_graph_cache,
)
from gnnact.peak import PeakMeter

EXACT = Config(bits=32)
N, F = 40, 6


def _edges(symmetric: bool, n: int = N, per_node: int = 8, seed: int = 0) -> Tensor:
    """A coalesced edge_index without self-loops, ``per_node * n`` edges (about, when
    symmetric): average degree high enough that GAT's added self-loops stay within budget."""
    gen = torch.Generator().manual_seed(seed)
    ei = torch.randint(0, n, (2, per_node * n), generator=gen)
    ei = ei[:, ei[0] != ei[1]]
    if symmetric:
        return to_undirected(ei[:, : ei.size(1) // 2], num_nodes=n)
    ei = coalesce(ei, num_nodes=n)
    assert not torch.equal(to_undirected(ei, num_nodes=n), ei)
    return ei


def _x(n: int = N, f: int = F, seed: int = 1) -> Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=gen, dtype=torch.float64, requires_grad=True)


# The four convs: (PyG layer, gnnact twin, call). GCNII's x_0 is a second input.
X0 = _x(seed=2)
KINDS = {
    "gcn": (lambda: pyg_nn.GCNConv(F, 5), lambda: gnnact.nn.GCNConv(F, 5, config=EXACT),
            lambda conv, x, adj: conv(x, adj)),
    "sage": (lambda: pyg_nn.SAGEConv(F, 5), lambda: gnnact.nn.SAGEConv(F, 5, config=EXACT),
             lambda conv, x, adj: conv(x, adj)),
    "gat": (lambda: pyg_nn.GATConv(F, 3, heads=2),
            lambda: gnnact.nn.GATConv(F, 3, heads=2, config=EXACT),
            lambda conv, x, adj: conv(x, adj)),
    "gcn2": (lambda: pyg_nn.GCN2Conv(F, alpha=0.2, theta=0.5, layer=2),
             lambda: gnnact.nn.GCN2Conv(F, alpha=0.2, theta=0.5, layer=2, config=EXACT),
             lambda conv, x, adj: conv(x, X0.to(x.device), adj)),
}


def _pair(kind: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    make_ref, make_ours, _ = KINDS[kind]
    torch.manual_seed(0)
    ref = make_ref().double()
    ours = make_ours().double()
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def _only_graph(conv: torch.nn.Module) -> Graph:
    (graph,) = graph_cache_for(conv).values()
    assert isinstance(graph, Graph)
    return graph


# ------------------------------------------------------------------------------------ owners

def test_layers_share_the_active_cache_and_own_one_otherwise():
    ei, x = _edges(True), _x()
    layers = [gnnact.nn.GCNConv(F, F, config=Config(bits=2)).double() for _ in range(3)]
    shared = GraphCache()
    with use_graph_cache(shared):
        assert active_graph_cache() is shared
        h = x
        for conv in layers:
            h = conv(h, ei)
        h.sum().backward()
    assert active_graph_cache() is None
    # One graph for the three layers, built once; no layer made a cache of its own.
    assert len(shared) == 1
    assert all("_gnnact_graphs" not in conv.__dict__ for conv in layers)
    (graph,) = shared.values()
    assert shared.nbytes() == graph.nbytes() > 0

    # Without an outer owner each layer keeps its own, reused across calls.
    for _ in range(2):
        h = x
        for conv in layers:
            h = conv(h, ei)
    own = [_only_graph(conv) for conv in layers]
    assert len({id(g) for g in own}) == 3 and graph not in own
    layers[0](x, ei)
    assert _only_graph(layers[0]) is own[0]


@pytest.mark.parametrize("kind", ["sage", "gat", "gcn2"])
def test_every_conv_honours_the_active_cache(kind):
    _, ours = _pair(kind)
    call = KINDS[kind][2]
    ei, x = _edges(False), _x()
    cache = GraphCache()
    with use_graph_cache(cache):
        call(ours, x, ei)
        call(ours, x, ei)
    assert len(cache) == 1 and "_gnnact_graphs" not in ours.__dict__


def test_two_threads_with_their_own_caches_share_nothing():
    ei, x = _edges(True), _x()
    caches = [GraphCache(), GraphCache()]
    seen: list[GraphCache | None] = [None, None]
    both_inside = threading.Barrier(2)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            conv = gnnact.nn.GCNConv(F, F, config=Config(bits=2)).double()
            with use_graph_cache(caches[i]):
                both_inside.wait(timeout=30)  # both active at once, each sees its own
                seen[i] = active_graph_cache()
                conv(x, ei).sum().backward()
                both_inside.wait(timeout=30)
        except BaseException as e:  # (re-raised in the main thread)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert seen == caches and active_graph_cache() is None
    (g0,), (g1,) = caches[0].values(), caches[1].values()
    assert g0 is not g1
    storages = [{t.untyped_storage().data_ptr() for _, t in g.tensors()} for g in (g0, g1)]
    assert not storages[0] & storages[1]


def test_dead_adjacency_frees_its_entry():
    cache = GraphCache()
    ei = _edges(True)
    graph = cache.get(ei, ("k",), functools.partial(build_graph, ei, N))
    assert len(cache) == 1 and cache.nbytes() == graph.nbytes()
    del ei, graph
    gc.collect()
    assert len(cache) == 0 and cache._entries == {} and cache.nbytes() == 0
    # A layer's own cache too: its entry goes with the adjacency.
    conv = gnnact.nn.SAGEConv(F, F, config=Config(bits=2)).double()
    ei = _edges(True)
    conv(_x(), ei)
    assert len(graph_cache_for(conv)) == 1
    del ei
    gc.collect()
    assert len(graph_cache_for(conv)) == 0


def test_in_place_change_invalidates():
    cache = GraphCache()
    ei, w = _edges(True), torch.rand(_edges(True).size(1), dtype=torch.float64)
    builds = []

    def build() -> Graph:
        builds.append(1)
        return build_graph(ei, N, edge_weight=w, per_edge=False, keep_dst=False)

    first = cache.get(ei, ("k",), build, also=(w,))
    assert cache.get(ei, ("k",), build, also=(w,)) is first and len(builds) == 1
    w.mul_(2)  # the `also` object changes
    second = cache.get(ei, ("k",), build, also=(w,))
    assert second is not first and len(builds) == 2
    torch.testing.assert_close(second.value, 2 * first.value)
    ei[0, 0] = ei[0, 0]  # the anchor changes (same values, new version)
    assert cache.get(ei, ("k",), build, also=(w,)) is not second and len(builds) == 3
    assert len(cache) == 1  # replaced, not added

    # Through a layer: an edited edge_index gives a new graph and PyG's output.
    ref, ours = _pair("gcn")
    x = _x()
    ours(x, ei)
    old = _only_graph(ours)
    ei[1, :5] = (ei[1, :5] + 1) % N
    torch.testing.assert_close(ours(x, ei), ref(x, ei), rtol=1e-10, atol=1e-12)
    assert _only_graph(ours) is not old


def test_uncacheable_anchor_and_no_cache_build_afresh():
    builds = []

    def build() -> int:
        builds.append(1)
        return len(builds)

    cache = GraphCache()
    assert cache.get(3, ("k",), build) == 1 and cache.get(3, ("k",), build) == 2  # int: no weakref
    assert len(cache) == 0
    ei = _edges(True)
    assert cache_on(ei, ("k",), build) == 3 and cache_on(ei, ("k",), build) == 4  # no cache
    with use_graph_cache(cache):
        assert cache_on(ei, ("k",), build) == 5 and cache_on(ei, ("k",), build) == 5
    assert graph_from(ei, N) is not graph_from(ei, N)  # no cache, none active: afresh
    with pytest.raises(TypeError, match="GraphCache"), use_graph_cache({}):  # type: ignore
        pass


def test_copies_and_pickles_are_empty():
    ei = _edges(True)
    cache = GraphCache()
    cache.get(ei, ("k",), lambda: build_graph(ei, N))
    for other in (copy.copy(cache), copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        assert isinstance(other, GraphCache) and len(other) == 0 and other.nbytes() == 0
    assert len(cache) == 1
    cache.clear()
    assert len(cache) == 0

    conv = gnnact.nn.GCNConv(F, F, config=Config(bits=2)).double()
    conv(_x(), ei)
    assert len(graph_cache_for(conv)) == 1
    assert not any("graphs" in k for k in conv.state_dict())
    for twin in (copy.deepcopy(conv), pickle.loads(pickle.dumps(conv))):
        assert len(graph_cache_for(twin)) == 0
        torch.testing.assert_close(twin(_x(), ei), conv(_x(), ei))


# ------------------------------------------------------------------------------------ layout

def _formula(kind: str, symmetric: bool, n: int, e_user: int, value_size: int) -> int:
    """Bytes of the cached graph, int32 indices. GCN/GCNII: A + I in CSR and one normalised
    value per edge (+ t_ptr and t_perm when not symmetric); SAGE: A in CSR (+ t_ptr, t_dst);
    GAT: A + I in CSR, t_perm and input_perm for the attention values (+ t_ptr)."""
    ptr = 4 * (n + 1)
    if kind == "sage":
        return ptr + 4 * e_user if symmetric else 2 * ptr + 8 * e_user
    e = e_user + n  # the self-loops GCN and GAT add
    if kind in ("gcn", "gcn2"):
        return ptr + (4 + value_size) * e if symmetric else 2 * ptr + (8 + value_size) * e
    return ptr + 12 * e if symmetric else 2 * ptr + 12 * e


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_graph_bytes_exact_and_within_the_users_edge_index(kind, symmetric, dtype):
    ei = _edges(symmetric)
    _, ours = _pair(kind)
    ours.to(dtype)
    KINDS[kind][2](ours, _x().to(dtype), ei)
    graph = _only_graph(ours)
    assert graph.symmetric is symmetric
    assert all(t.dtype == (dtype if name == "value" else torch.int32)
               for name, t in graph.tensors())
    assert graph.targets is None  # per-edge targets are derived when read
    # (GCN's normalised values are in the features' dtype)
    assert graph.nbytes() == _formula(kind, symmetric, N, ei.size(1), dtype.itemsize)
    if dtype == torch.float32:  # at most the caller's own int64 edge_index
        assert graph.nbytes() <= ei.numel() * ei.element_size()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("kind", list(KINDS))
def test_outputs_and_gradients_equal_pyg(kind, symmetric, device):
    ei = _edges(symmetric).to(device)
    ref, ours = (conv.to(device) for conv in _pair(kind))
    call = KINDS[kind][2]
    ones = torch.ones(ei.size(1), dtype=torch.float64, device=device)
    for adj in (ei, to_torch_csr_tensor(ei.flip(0), ones, size=(N, N))):
        x = _x().detach().to(device).requires_grad_()
        out, expected = call(ours, x, adj), call(ref, x, adj)
        torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
        g = torch.randn_like(out)
        ours_grads = torch.autograd.grad(out, [x, *ours.parameters()], g)
        ref_grads = torch.autograd.grad(expected, [x, *ref.parameters()], g)
        for a, b in zip(ours_grads, ref_grads, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_symmetry_needs_symmetric_values_too():
    ei = _edges(True)
    w = torch.rand(ei.size(1), dtype=torch.float64)
    w_sym = w + w[_reverse(ei)]  # w(i, j) = w(j, i)
    for weights, symmetric in ((w_sym, True), (w, False)):
        graph = build_graph(ei, N, edge_weight=weights, per_edge=False, keep_dst=False)
        assert graph.symmetric is symmetric
        assert (graph.t_perm is None) is symmetric
        dense = graph.matrix(graph.value, torch.float64).to_dense()
        torch.testing.assert_close(graph.matrix_t(graph.value, torch.float64).to_dense(),
                                   dense.t())


def _reverse(ei: Tensor) -> Tensor:
    """Index of the reverse of each edge of a coalesced symmetric edge_index."""
    key = ei[0] * N + ei[1]
    order = torch.argsort(key)
    return order[torch.searchsorted(key[order], ei[1] * N + ei[0])]


@pytest.mark.parametrize("symmetric", [True, False])
def test_per_edge_values_transpose_and_reorder(symmetric):
    ei = _edges(symmetric)
    graph = graph_from(ei, N)  # the default: per-call values supported, targets kept
    assert graph.input_perm is not None and graph.t_perm is not None
    v = torch.rand(graph.num_edges, dtype=torch.float64)
    dense = graph.matrix(v, torch.float64).to_dense()
    torch.testing.assert_close(graph.matrix_t(v, torch.float64).to_dense(), dense.t())
    w = torch.rand(ei.size(1), dtype=torch.float64)
    assert torch.equal(graph.to_input_order(graph.to_csr_order(w)), w)
    expected = torch.zeros(N, N, dtype=torch.float64).index_put_((ei[1], ei[0]), w, accumulate=True)
    torch.testing.assert_close(graph.matrix(graph.to_csr_order(w), torch.float64).to_dense(),
                               expected)
    lean = build_graph(ei, N, per_edge=False, keep_dst=False)
    assert torch.equal(lean.dst, graph.targets)  # derived from ptr
    assert lean.t_perm is None and lean.input_perm is None
    with pytest.raises(ValueError, match="per_edge"):
        ops.spmm(_x(), lean, v)
    with pytest.raises(ValueError, match="per_edge"):
        lean.to_csr_order(w)


def test_all_ones_values_are_not_kept_and_read_through_a_stride0_view():
    ei = _edges(False)
    adj_t = to_torch_csr_tensor(ei.flip(0), size=(N, N))  # values: ones
    graph = build_graph(adj_t, N, per_edge=False, keep_dst=False)
    assert graph.value is None
    ones = graph.matrix(None, torch.float64).values()
    assert ones.stride() == (0,) and ones.numel() == graph.num_edges
    x = _x().detach()
    full = csr_tensor(graph.ptr, graph.src, torch.ones(graph.num_edges, dtype=torch.float64),
                      (N, N))
    assert torch.equal(graph.matrix(None, torch.float64) @ x, full @ x)


# ------------------------------------------------------------------------------- borrowing

def _borrowed_adjacencies(ei: Tensor) -> dict:
    ones = torch.ones(ei.size(1), dtype=torch.float64)
    out = {"csr": to_torch_csr_tensor(ei.flip(0), ones, size=(N, N)),
           "EdgeIndex": EdgeIndex(ei, sparse_size=(N, N)).sort_by("col", stable=True)[0]}
    if WITH_TORCH_SPARSE:
        from torch_sparse import SparseTensor

        out["SparseTensor"] = SparseTensor(row=ei[1], col=ei[0], sparse_sizes=(N, N))
    return out


@pytest.mark.parametrize("symmetric", [True, False])
def test_sage_refers_to_the_callers_csr(symmetric):
    ei = _edges(symmetric)
    for name, adj in _borrowed_adjacencies(ei).items():
        ref, ours = _pair("sage")
        x = _x()
        torch.testing.assert_close(ours(x, adj), ref(x, adj), rtol=1e-10, atol=1e-12)
        graph = _only_graph(ours)
        assert set(graph.borrowed) == {"ptr", "src"}, name
        if name == "csr":
            assert graph.ptr.data_ptr() == adj.crow_indices().data_ptr()
            assert graph.src.data_ptr() == adj.col_indices().data_ptr()
        elif name == "SparseTensor":
            assert graph.src.data_ptr() == adj.storage.col().data_ptr()
        else:
            assert (graph.src.untyped_storage().data_ptr()
                    == adj.as_tensor().untyped_storage().data_ptr())
        # gnnact's own bytes: nothing when symmetric, the int32 transposed CSR otherwise.
        assert graph.nbytes() == (0 if symmetric else 4 * (N + 1) + 4 * ei.size(1))
        assert graph.nbytes(borrowed=True) > graph.nbytes()
        assert graph_cache_for(ours).nbytes() == graph.nbytes()


def test_unsorted_csr_is_copied():
    ei = _edges(False)
    adj_t = to_torch_csr_tensor(ei.flip(0), size=(N, N))
    crow, col = adj_t.crow_indices(), adj_t.col_indices().clone()
    col[crow[3]:crow[4]] = col[crow[3]:crow[4]].flip(0)  # row 3 listed backwards
    assert crow[4] - crow[3] > 1
    shuffled = torch.sparse_csr_tensor(crow, col, adj_t.values(), (N, N))
    graph = build_graph(shuffled, N, borrow=True)
    assert graph.borrowed == () and graph.src.dtype == torch.int32
    torch.testing.assert_close(graph.matrix(None, torch.float64).to_dense(),
                               shuffled.to_dense().double())
    v = torch.rand(graph.num_edges, dtype=torch.float64)  # in the caller's order
    torch.testing.assert_close(
        graph.matrix(graph.to_csr_order(v), torch.float64).to_dense(),
        torch.sparse_csr_tensor(crow, col, v, (N, N)).to_dense())


# ------------------------------------------------------------------------- building a graph


def _reference_graph(src: Tensor, dst: Tensor, num_src: int, num_dst: int,
                     value: Tensor | None, per_edge: bool, keep_dst: bool) -> dict:
    """What :meth:`Graph.from_coo` must hold, written the plain way (argsort and gathers,
    every index int64, narrowed at the end)."""
    perm = torch.argsort(dst * num_src + src, stable=True)
    src_s, dst_s = src[perm], dst[perm]
    value = None if value is None else value[perm]
    if value is not None and bool((value == 1).all()):
        value = None
    ptr = torch.cat([torch.zeros(1, dtype=torch.long),
                     torch.bincount(dst_s, minlength=num_dst).cumsum(0)])
    t_perm = torch.argsort(src_s, stable=True)
    t_ptr = torch.cat([torch.zeros(1, dtype=torch.long),
                       torch.bincount(src_s, minlength=num_src).cumsum(0)])
    t_dst = dst_s[t_perm]
    symmetric = (num_src == num_dst and torch.equal(t_ptr, ptr) and torch.equal(t_dst, src_s)
                 and (value is None or torch.equal(value[t_perm], value)))
    keep_perm = per_edge or (value is not None and not symmetric)
    in_order = torch.equal(perm, torch.arange(src.numel()))
    fields = {"ptr": ptr, "src": src_s, "value": value,
              "t_ptr": None if symmetric else t_ptr,
              "t_dst": None if symmetric or keep_perm else t_dst,
              "t_perm": t_perm if keep_perm else None,
              "input_perm": perm if per_edge and not in_order else None,
              "targets": dst_s if keep_dst else None}
    return {k: v if v is None or v.is_floating_point() else v.int() for k, v in fields.items()}


@pytest.mark.parametrize("sizes", [(40, 40), (25, 60), (60, 25)])
@pytest.mark.parametrize("order", ["random", "csr"])
@pytest.mark.parametrize("values", ["none", "random", "ones"])
@pytest.mark.parametrize("per_edge,keep_dst", [(True, True), (True, False), (False, False)])
def test_built_graph_is_the_plain_sort(sizes, order, values, per_edge, keep_dst):
    """The CSR and transposed structure read back from sorted int64 keys, by blocks, equal
    the plain argsort-and-gather build, field by field and dtype by dtype (multi-edges,
    bipartite shapes, input already in CSR order, per-edge values)."""
    _check_build("cpu", sizes, order, values, per_edge, keep_dst)


@pytest.mark.cuda
@pytest.mark.parametrize("values", ["none", "random"])
@pytest.mark.parametrize("per_edge,keep_dst", [(True, True), (False, False)])
def test_built_graph_is_the_plain_sort_on_cuda(values, per_edge, keep_dst):
    _check_build("cuda", (25, 60), "random", values, per_edge, keep_dst)


def _check_build(device: str, sizes: tuple[int, int], order: str, values: str, per_edge: bool,
                 keep_dst: bool) -> None:
    num_src, num_dst = sizes
    gen = torch.Generator().manual_seed(sum(sizes))
    src = torch.randint(0, num_src, (500,), generator=gen)
    dst = torch.randint(0, num_dst, (500,), generator=gen)
    if order == "csr":
        perm = torch.argsort(dst * num_src + src, stable=True)
        src, dst = src[perm], dst[perm]
    value = {"none": None, "random": torch.rand(500, generator=gen, dtype=torch.float64),
             "ones": torch.ones(500)}[values]
    expected = _reference_graph(src, dst, num_src, num_dst, value, per_edge, keep_dst)
    src, dst = src.to(device), dst.to(device)
    value = None if value is None else value.to(device)
    graph = Graph.from_coo(src, dst, num_src, num_dst, value, per_edge=per_edge,
                           keep_dst=keep_dst)
    for name, want in expected.items():
        got = getattr(graph, name)
        assert (got is None) == (want is None), name
        if want is not None:
            assert got.dtype == want.dtype and torch.equal(got.cpu(), want), name
    # int32 endpoints build the same graph
    same = Graph.from_coo(src.int(), dst.int(), num_src, num_dst, value, per_edge=per_edge,
                          keep_dst=keep_dst)
    assert all(torch.equal(a, b) for (_, a), (_, b) in
               zip(graph.tensors(), same.tensors(), strict=True))


@pytest.mark.parametrize("per_edge", [False, True])
def test_building_holds_24_bytes_per_edge(per_edge):
    """Building the graph of an asymmetric ``edge_index`` holds at most 24 bytes per edge
    beside it (int64 keys, their sorted copy and the sort's permutation; everything else
    int32 and made by blocks), where argsort and gathers of int64 copies held 40."""
    n, e = 2_000, 400_000
    gen = torch.Generator().manual_seed(0)
    ei = torch.randint(0, n, (2, e), generator=gen)
    with PeakMeter(torch.device("cpu")) as meter:
        graph = build_graph(ei, n, per_edge=per_edge, keep_dst=False)
    assert not graph.symmetric
    assert meter.peak_bytes <= 24 * e + 64 * (n + 1)
    assert meter.peak_bytes > 16 * e  # (the keys and their sorted copy at least: measured)


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("kind", list(KINDS))
def test_int64_indices_past_the_int32_range(kind, symmetric, monkeypatch):
    """Graphs whose nodes or edges do not fit int32 keep int64 indices (shown here with the
    limit lowered to 10): the same outputs and gradients as PyG, every index tensor int64."""
    import gnnact.ops.graph as graph_module

    monkeypatch.setattr(graph_module, "_INT32_MAX", 10)
    ei = _edges(symmetric)
    ref, ours = _pair(kind)
    call = KINDS[kind][2]
    x = _x()
    out, expected = call(ours, x, ei), call(ref, x, ei)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad(out, [x, *ours.parameters()], g),
                    torch.autograd.grad(expected, [x, *ref.parameters()], g), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    graph = _only_graph(ours)
    assert graph.symmetric is symmetric
    assert all(t.dtype == torch.int64 for name, t in graph.tensors() if name != "value")


def _assert_same_graph(ours: Graph, expected: Graph) -> None:
    """Every field of two graphs equal, tensors in value and dtype."""
    for field in dataclasses.fields(Graph):
        got, want = getattr(ours, field.name), getattr(expected, field.name)
        if isinstance(want, Tensor):
            assert got.dtype == want.dtype and torch.equal(got, want), field.name
        else:
            assert got == want, field.name


def _gcn_norm_graph(ei: Tensor, n: int, loops: bool, improved: bool,
                    dtype: torch.dtype) -> Graph:
    """The GCN graph as PyG's gcn_norm and the plain build make it."""
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    adj, weight = gcn_norm(ei, None, n, improved, loops, "source_to_target", dtype)
    return build_graph(adj, n, edge_weight=weight, per_edge=False, keep_dst=False)


@pytest.mark.parametrize("shape", ["random", "undirected", "hub", "empty"])
@pytest.mark.parametrize("loops", [True, False])
@pytest.mark.parametrize("improved", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gcn_graph_from_keys_is_gcn_norms(shape, loops, improved, dtype):
    """An edge_index without weights is normalised from the keys it sorts (its in-degrees),
    not through gcn_norm's copies of the edge list: every field of the graph, values
    included, equals gcn_norm's followed by the plain build, bit for bit (multi-edges,
    self-loops in the input, a hub, isolated nodes, no edges)."""
    from gnnact.nn.conv.norm import normalized_graph

    n = 60
    gen = torch.Generator().manual_seed(3)
    ei = torch.randint(0, n, (2, 0 if shape == "empty" else 700), generator=gen)
    if shape == "undirected":
        ei = to_undirected(ei, num_nodes=n)
    elif shape == "hub":
        ei = torch.cat([ei, torch.stack([torch.randint(0, n, (500,), generator=gen),
                                         torch.zeros(500, dtype=torch.long)])], dim=1)
    ours, value = normalized_graph(ei, None, n, improved=improved, add_self_loops=loops,
                                   flow="source_to_target", dtype=dtype)
    assert value is None
    expected = _gcn_norm_graph(ei, n, loops, improved, dtype)
    _assert_same_graph(ours, expected)


def test_gcn_graph_takes_gcn_norm_past_exact_counts(monkeypatch):
    """Past the in-degree that float32 counts exactly (lowered here to 100), and for 16-bit
    values, the graph is gcn_norm's; below it, it is built from the keys. Equal either way."""
    import gnnact.nn.conv.norm as norm

    from_keys = norm._normalized_edges
    built: list[torch.dtype] = []

    def spy(edge_index, num_nodes, loops, dtype):
        built.append(dtype)
        return from_keys(edge_index, num_nodes, loops, dtype)

    monkeypatch.setattr(norm, "_EXACT_COUNT", 100)
    monkeypatch.setattr(norm, "_normalized_edges", spy)
    n = 60
    gen = torch.Generator().manual_seed(4)
    spread = torch.stack([torch.randint(0, n, (600,), generator=gen),
                          torch.arange(600) % n])  # in-degree 10 everywhere
    hub = torch.cat([spread, torch.stack([torch.arange(150) % n,
                                          torch.zeros(150, dtype=torch.long)])], dim=1)
    for ei, dtype, from_keys_expected in [(spread, torch.float32, True),
                                          (hub, torch.float32, False),
                                          (hub, torch.float64, True),
                                          (spread, torch.float16, False)]:
        built.clear()
        ours, _ = norm.normalized_graph(ei, None, n, improved=False, add_self_loops=True,
                                        flow="source_to_target", dtype=dtype)
        assert bool(built) is from_keys_expected
        expected = _gcn_norm_graph(ei, n, True, False, dtype)
        assert all(torch.equal(a, b) for (_, a), (_, b) in
                   zip(ours.tensors(), expected.tensors(), strict=True))


@pytest.mark.parametrize("loops", [True, False])
def test_gcn_graph_build_holds_24_bytes_per_edge(loops):
    """Normalising and building GCN's graph of an edge_index holds about 24 bytes per edge
    (where gcn_norm's copies of the edge list and the build beside them held about 45)."""
    from gnnact.nn.conv.norm import normalized_graph

    n, e = 2_000, 400_000
    ei = torch.randint(0, n, (2, e), generator=torch.Generator().manual_seed(0))
    with PeakMeter(torch.device("cpu")) as meter:
        graph, _ = normalized_graph(ei, None, n, improved=False, add_self_loops=loops,
                                    flow="source_to_target", dtype=torch.float32)
    assert not graph.symmetric
    assert meter.peak_bytes <= 24 * (e + n) + 64 * (n + 1)


@pytest.mark.parametrize("keep_dst", [False, True])  # GATConv's options, GATv2Conv's
@pytest.mark.parametrize("sizes", [(40, 40), (40, 25), (25, 40)])
def test_attention_graph_with_loops_from_keys(sizes, keep_dst):
    """GAT's and GATv2's graph of an edge_index whose self-loops PyG replaces is built from
    the edges' keys: equal, field by field, to the graph of PyG's looped edge_index
    (bipartite sizes too, loops on the first min(N_src, N_dst) nodes)."""
    from gnnact.nn.conv.attention import _with_self_loops, looped_graph

    n_src, n_dst = sizes
    loops = min(sizes)
    gen = torch.Generator().manual_seed(5)
    ei = torch.stack([torch.randint(0, n_src, (300,), generator=gen),
                      torch.randint(0, n_dst, (300,), generator=gen)])
    ei[1, :40] = ei[0, :40].clamp(max=n_dst - 1)  # some loops in the input
    ours = looped_graph(ei, loops, n_src, n_dst, "source_to_target", None, per_edge=True,
                        keep_dst=keep_dst)
    looped, _ = _with_self_loops(ei, None, None, loops)
    expected = build_graph(looped, n_src, n_dst, per_edge=True, keep_dst=keep_dst)
    _assert_same_graph(ours, expected)


def test_derived_targets_are_the_rows_in_four_bytes_per_edge():
    """The per-edge targets a graph derives from its row pointers (not kept) equal
    ``repeat_interleave``'s, empty rows first, last and between included, in the index
    dtype; deriving them holds the result alone (``repeat_interleave`` also made an int64
    index of every edge)."""
    gen = torch.Generator().manual_seed(6)
    for n in (0, 1, 7, 300):
        counts = torch.randint(0, 4, (n,), generator=gen) * (torch.rand(n, generator=gen) > 0.3)
        counts[:1] = 0  # an empty first row
        ptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
        e = int(ptr[-1])
        graph = Graph(n, n, ptr.int(), torch.zeros(e, dtype=torch.int32))
        expected = torch.arange(n, dtype=torch.int32).repeat_interleave(counts)
        assert graph.dst.dtype == torch.int32 and torch.equal(graph.dst, expected)
    n, e = 1_000, 200_000
    src, dst = torch.randint(0, n, (2, e), generator=gen)
    graph = Graph.from_coo(src, dst, n, n, per_edge=False, keep_dst=False)
    with PeakMeter(torch.device("cpu")) as meter:
        targets = graph.dst
    assert torch.equal(targets, dst.sort().values.int())
    assert meter.peak_bytes <= 4 * (e + 1) + 8 * n


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_targets_of_a_block_of_edges(dtype):
    """``Graph.dst_of(slice)``: the targets of a block of CSR edges, found in the row
    pointers, equal that block of :attr:`Graph.dst` (empty rows anywhere, empty and whole
    blocks), in the index dtype; kept targets are sliced."""
    gen = torch.Generator().manual_seed(7)
    n = 300
    counts = torch.randint(0, 4, (n,), generator=gen) * (torch.rand(n, generator=gen) > 0.3)
    counts[:1] = counts[-1:] = 0
    ptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)]).to(dtype)
    e = int(ptr[-1])
    graph = Graph(n, n, ptr, torch.zeros(e, dtype=dtype))
    whole = graph.dst
    for a, b in [(0, e), (0, 0), (e, e), (5, 6), (17, e - 3), (e - 1, e)]:
        block = graph.dst_of(slice(a, b))
        assert block.dtype == dtype and torch.equal(block, whole[a:b])
    kept = dataclasses.replace(graph, targets=whole)
    assert torch.equal(kept.dst_of(slice(17, 40)), whole[17:40])


def test_reverse_edge_type_shares_the_forward_types_structure():
    """``ToUndirected``'s ``rev_*`` edge type is its forward type flipped: its graph is the
    forward graph's transpose, made of the same tensors (nothing more cached), and SAGE
    aggregates over it exactly as over a graph built on its own."""
    gen = torch.Generator().manual_seed(0)
    writes = torch.stack([torch.randint(0, 30, (200,), generator=gen),
                          torch.randint(0, 50, (200,), generator=gen)])
    rev = writes.flip(0)
    cache = GraphCache()
    forward = graph_from(writes, 30, 50, cache=cache, per_edge=False, keep_dst=False)
    backward = graph_from(rev, 50, 30, cache=cache, per_edge=False, keep_dst=False)
    alone = build_graph(rev, 50, 30, per_edge=False, keep_dst=False)
    assert backward.src is forward.t_dst and backward.t_dst is forward.src
    for name in ("ptr", "src", "t_ptr", "t_dst"):
        assert torch.equal(getattr(backward, name), getattr(alone, name))
    assert cache.nbytes() == forward.nbytes()
    # Not a flip of it (one edge differs): built on its own.
    other = rev.clone()
    other[0, 0] = (other[0, 0] + 1) % 50
    assert graph_from(other, 50, 30, cache=cache, per_edge=False, keep_dst=False).src is not (
        forward.t_dst)

    x_src = torch.randn(50, F, dtype=torch.float64, requires_grad=True)
    x_dst = torch.randn(30, F, dtype=torch.float64)
    ref = pyg_nn.SAGEConv((F, F), 4).double()
    conv = gnnact.nn.SAGEConv((F, F), 4, config=EXACT).double()
    conv.load_state_dict(ref.state_dict())
    with use_graph_cache(cache):
        out = conv((x_src, x_dst), rev)
    assert len(cache) == 3  # writes, rev (the transpose of writes), other
    expected = ref((x_src, x_dst), rev)
    torch.testing.assert_close(out, expected)
    g = torch.randn_like(out)
    torch.testing.assert_close(torch.autograd.grad(out, x_src, g),
                               torch.autograd.grad(expected, x_src, g))


def test_sparse_products_warn_nothing_in_a_fresh_process():
    # PyTorch's "sparse CSR support is in beta" warning (once a process) is silenced when
    # gnnact.ops.graph is imported, not around every product: a fresh process that turns
    # warnings into errors runs a product.
    import subprocess
    import sys

    code = ("import torch, gnnact.ops.graph as g; "
            "graph = g.graph_from(torch.tensor([[0, 1], [1, 0]]), 2); "
            "print(graph.mm(torch.ones(2, 3)).sum().item())")
    run = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "6.0"
