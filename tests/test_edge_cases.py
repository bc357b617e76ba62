"""Empty graphs: no nodes (``x`` of shape ``[0, F]``, ``edge_index`` of shape ``[2, 0]``) and no
edges (``N`` nodes, ``edge_index`` of shape ``[2, 0]``) behave as in PyG for every twin and
converted model: the same output (shape and values) and the same gradients, at ``bits=32`` in
float64; compressed (2 bits), forward and backward run and keep nothing for absent nodes.
"""

from __future__ import annotations

import copy

import pytest
import torch
from twin_cases import CONVS, DENSE, F_IN, call, features, outputs_and_grads, twin_pair

import gnnact
from gnnact.models import MODELS, build
from gnnact.ops.graph import build_graph

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")]

NO_EDGES = torch.empty(2, 0, dtype=torch.long)
#: (nodes, what the case is called): both without edges.
GRAPHS = {"no nodes": 0, "no edges": 7}


def assert_same(twin, ref, x, edge_index) -> None:
    """Equal outputs (shape, dtype, values) and gradients of ``x`` and every parameter."""
    out, grads = outputs_and_grads(twin, x, edge_index)
    out_ref, grads_ref = outputs_and_grads(ref, x, edge_index)
    assert out.shape == out_ref.shape and out.dtype == out_ref.dtype
    torch.testing.assert_close(out, out_ref)
    for g, g_ref in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(g, g_ref)


@pytest.mark.parametrize("case", list(GRAPHS))
@pytest.mark.parametrize("name", list(CONVS))
def test_conv_twin_on_empty_graph(name, case):
    ref, twin = twin_pair(CONVS[name], torch.float64)
    assert_same(twin, ref, features(GRAPHS[case], torch.float64), NO_EDGES)


@pytest.mark.parametrize("case", list(GRAPHS))
@pytest.mark.parametrize("name", list(CONVS))
def test_compressed_conv_on_empty_graph(name, case):
    ref, twin = twin_pair(CONVS[name], torch.float32, bits=2)
    x = features(GRAPHS[case], torch.float32).requires_grad_()
    out = call(twin, x, NO_EDGES)
    assert out.shape == call(ref, x, NO_EDGES).shape
    kept = [r for r in gnnact.memory.saved_tensors(out.sum(), exclude=[x, NO_EDGES])
            if r.kind == "context"]
    if GRAPHS[case] == 0:  # nothing per node to keep (APPNP: autograd's 0-d scalars)
        assert all(r.nbytes == 0 or r.shape == () for r in kept), kept
    out.sum().backward()
    assert x.grad.shape == x.shape


@pytest.mark.parametrize("case", list(GRAPHS))
@pytest.mark.parametrize("name", list(DENSE))
def test_dense_twin_on_no_rows(name, case):
    ref, twin = twin_pair(DENSE[name], torch.float64)
    assert_same(twin, ref, features(GRAPHS[case], torch.float64), None)


@pytest.mark.parametrize("case", list(GRAPHS))
@pytest.mark.parametrize("name", MODELS)
def test_converted_model_on_empty_graph(name, case):
    torch.manual_seed(0)
    ref = build(name, F_IN, 3, hidden=16).double()
    twin = gnnact.convert(copy.deepcopy(ref), gnnact.Config(bits=32))
    assert_same(twin, ref, features(GRAPHS[case], torch.float64), NO_EDGES)


@pytest.mark.parametrize("reduce", ["sum", "mean"])
@pytest.mark.parametrize("nodes", [0, 5])
def test_spmm_without_edges(nodes, reduce):
    # No edge into any node: zeros (PyG's scatter of nothing), and gradients of zeros.
    g = build_graph(NO_EDGES, nodes)
    x = torch.randn(nodes, 2, 3, dtype=torch.float64, requires_grad=True)
    value = torch.empty(0, dtype=torch.float64, requires_grad=True)
    out = gnnact.ops.spmm(x, g, value, reduce, gnnact.Config(bits=2))
    assert torch.equal(out, torch.zeros(nodes, 2, 3, dtype=torch.float64))
    gx, gv = torch.autograd.grad(out.sum(), [x, value])
    assert torch.equal(gx, torch.zeros_like(x)) and gv.shape == (0,)
