"""Tests for :mod:`gnnact.memory`.

Every expected byte count is worked out by hand from the shapes (fp32 = 4 bytes, int64 = 8),
never by walking the graph a second way. The counts depend on what each torch/PyG op saves
for backward; the comments say which node saves what.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gnnact.memory import SavedRecord, saved_bytes, saved_tensors
from gnnact.quant.packed import PackedMask, PackedTensor

pytestmark = [
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
    pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled"),
]


# ----------------------------------------------------------------------------- MLP


def _mlp(n: int = 64):
    torch.manual_seed(0)
    x = torch.randn(n, 32)  # input data: no grad, so not a graph leaf
    model = nn.Sequential(nn.Linear(32, 48), nn.ReLU(), nn.Linear(48, 10))
    return x, model, model(x).sum()


def test_mlp_exact_bytes():
    n = 64
    x, model, loss = _mlp(n)
    # AddmmBackward0 (layer 1): mat1 = x (W1 needs grad); mat2 = W1ᵀ is not saved, x needs no grad.
    # ReluBackward0: result h, [n, 48].
    # AddmmBackward0 (layer 2): mat1 = h (same storage, counted once), mat2 = W2ᵀ (a view of
    #   the leaf W2, excluded by default).
    # SumBackward0 saves only sizes.
    x_bytes, h_bytes, w2_bytes = n * 32 * 4, n * 48 * 4, 48 * 10 * 4
    assert saved_bytes(loss) == x_bytes + h_bytes == 20480
    assert saved_bytes(loss, exclude=[x]) == h_bytes
    assert saved_bytes(loss, exclude=x) == h_bytes  # a single tensor is accepted too
    # With leaves, the saved W2ᵀ view counts its whole storage; W1 and the biases are not saved.
    assert saved_bytes(loss, include_leaves=True) == x_bytes + h_bytes + w2_bytes
    # An explicit exclusion wins over include_leaves.
    assert saved_bytes(loss, include_leaves=True, exclude=[model]) == x_bytes + h_bytes


def test_mlp_records():
    n = 64
    x, _, loss = _mlp(n)
    records = saved_tensors(loss)
    assert all(isinstance(r, SavedRecord) for r in records)
    summary = [(r.node, r.attr, r.shape, r.nbytes, r.first) for r in records]
    assert summary == [
        ("AddmmBackward0", "_saved_mat1", (n, 48), n * 48 * 4, True),
        ("ReluBackward0", "_saved_result", (n, 48), n * 48 * 4, False),
        ("AddmmBackward0", "_saved_mat1", (n, 32), n * 32 * 4, True),
    ]
    assert records[0].storage == records[1].storage
    assert records[2].storage == ("cpu", None, x.untyped_storage().data_ptr())
    assert saved_bytes(loss) == sum(r.nbytes for r in records if r.first)
    # Excluded storages do not appear in the list.
    assert [r.attr for r in saved_tensors(loss, exclude=[x])] == ["_saved_mat1", "_saved_result"]


def test_view_counts_whole_storage():
    a = torch.randn(10, 10)
    w = torch.randn(1, 10, requires_grad=True)
    # MulBackward0 saves self = a[:1] (for w's gradient): a view keeps all 100 floats alive.
    assert saved_bytes((a[:1] * w).sum()) == 100 * 4


def test_several_outputs_share_storages():
    x = torch.randn(8, 4, requires_grad=True)
    h = x.exp()  # ExpBackward0 saves its result h: 128 bytes
    out1, out2 = h.sum(), h.sin().sum()  # SinBackward0 saves self = h again
    assert saved_bytes(out1) == 8 * 4 * 4
    assert saved_bytes([out1, out2]) == 8 * 4 * 4
    assert saved_bytes((out1, out2), include_leaves=True) == 8 * 4 * 4  # x itself is not saved


def test_deep_graph_is_walked_iteratively():
    depth = 5000  # far past Python's recursion limit
    y = x = torch.randn(3, requires_grad=True)
    for _ in range(depth):
        y = y.sin()  # SinBackward0 saves its input
    # Inputs of the sin nodes: the leaf x (excluded) and depth - 1 intermediates of 12 bytes.
    assert saved_bytes(y) == (depth - 1) * 3 * 4
    assert saved_bytes(y, include_leaves=True) == depth * 3 * 4
    del x


# ------------------------------------------------------------- custom autograd.Function


class _KeepPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, inp: Tensor, packed: PackedTensor, mask: PackedMask) -> Tensor:
        ctx.save_for_backward(inp)
        ctx.packed = packed
        ctx.mask = mask
        # The same objects again, inside containers: must not be counted twice.
        ctx.again = (packed, {"p": packed, "m": [mask]})
        ctx.bits = packed.bits  # not a tensor: ignored
        ctx.variable = inp  # a ctx attribute, not an AccumulateGrad leaf: still counted once
        return inp * 2

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad * 2, None, None


def _packed() -> tuple[PackedTensor, PackedMask]:
    packed = PackedTensor(codes=torch.zeros(4, 16, dtype=torch.uint8), scales=torch.zeros(4),
                          zeros=torch.zeros(4), bits=2, shape=torch.Size([4, 64]),
                          dtype=torch.float32, group_size=64)
    mask = PackedMask(torch.zeros(8, dtype=torch.uint8), torch.Size([64]))
    return packed, mask


def test_custom_function_packed_ctx():
    packed, mask = _packed()
    packed_bytes = 4 * 16 + 4 * 4 + 4 * 4  # codes uint8 [4, 16] + scales + zeros (fp32 [4])
    assert packed.nbytes == packed_bytes == 96
    mask_bytes = 8
    leaf = torch.randn(8, 8, requires_grad=True)
    inp = leaf.exp()  # ExpBackward0 saves its result: the same storage as saved_tensors[0]
    out = _KeepPacked.apply(inp, packed, mask)
    inp_bytes = 8 * 8 * 4
    assert saved_bytes(out) == inp_bytes + packed_bytes + mask_bytes == 360

    records = saved_tensors(out)
    assert {r.attr for r in records if r.first} == {
        "saved_tensors[0]", "packed.codes", "packed.scales", "packed.zeros", "mask.data"}
    # Repeats: variable, again[0].* (3), again[1]['p'].* (3), again[1]['m'][0].data, and
    # ExpBackward0's result.
    assert sum(not r.first for r in records) == 9
    assert [r.node for r in records][-1] == "ExpBackward0"
    assert {r.node for r in records[:-1]} == {"_KeepPackedBackward"}

    assert saved_bytes(out, exclude=[packed]) == inp_bytes + mask_bytes
    assert saved_bytes(out, exclude=[inp]) == packed_bytes + mask_bytes
    out.sum().backward()  # the walk leaves the graph intact
    assert leaf.grad is not None


def _keep_in_ctx(obj) -> Tensor:
    """Output of a custom Function that stores ``obj`` as a ``ctx`` attribute."""

    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, inp):
            ctx.obj = obj
            return inp.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad

    return Keep.apply(torch.randn(3, requires_grad=True))


# A 4 × 4 matrix with two full 2 × 2 diagonal blocks, built from its parts so that every part
# owns exactly its own storage: nnz = 8, fp32 values, int64 indices.
_ROW = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
_COL = torch.tensor([0, 1, 0, 1, 2, 3, 2, 3])
_PTR = torch.tensor([0, 2, 4, 6, 8])
_BPTR, _BIDX = torch.tensor([0, 1, 2]), torch.tensor([0, 1])


@pytest.mark.parametrize(("make", "expected"), [
    # indices [2, nnz] + values [nnz]
    (lambda: torch.sparse_coo_tensor(torch.stack([_ROW, _COL]), torch.ones(8), (4, 4)),
     2 * 8 * 8 + 8 * 4),
    # crow [rows + 1] + col [nnz] + values [nnz]
    (lambda: torch.sparse_csr_tensor(_PTR.clone(), _COL.clone(), torch.ones(8), (4, 4)),
     5 * 8 + 8 * 8 + 8 * 4),
    # ccol [cols + 1] + row [nnz] + values [nnz] (the matrix is symmetric)
    (lambda: torch.sparse_csc_tensor(_PTR.clone(), _COL.clone(), torch.ones(8), (4, 4)),
     5 * 8 + 8 * 8 + 8 * 4),
    # crow [2 + 1] + col [2 blocks] + values [2, 2, 2]
    (lambda: torch.sparse_bsr_tensor(_BPTR.clone(), _BIDX.clone(), torch.ones(2, 2, 2), (4, 4)),
     3 * 8 + 2 * 8 + 2 * 2 * 2 * 4),
    (lambda: torch.sparse_bsc_tensor(_BPTR.clone(), _BIDX.clone(), torch.ones(2, 2, 2), (4, 4)),
     3 * 8 + 2 * 8 + 2 * 2 * 2 * 4),
], ids=["coo", "csr", "csc", "bsr", "bsc"])
def test_sparse_layouts_in_ctx(make, expected: int):
    adj = make()
    out = _keep_in_ctx(adj)
    assert saved_bytes(out) == expected
    assert saved_bytes(out, exclude=[adj]) == 0


def test_csr_from_dense_keeps_coo_index():
    # Converted from dense, torch's col_indices is a view (offset nnz) of the COO index
    # [2, nnz], which it keeps alive: crow [5] + index [2, 8] + values [8].
    adj = torch.block_diag(torch.ones(2, 2), torch.ones(2, 2)).to_sparse_csr()
    assert saved_bytes(_keep_in_ctx(adj)) == 5 * 8 + 2 * 8 * 8 + 8 * 4


# ------------------------------------------------------------------------ sparse ops


def test_sparse_mm_saves_sparse_operand():
    # 5 × 6 CSR matrix with nnz = 6, built by hand.
    crow = torch.tensor([0, 2, 3, 3, 5, 6])
    col = torch.tensor([0, 3, 1, 2, 5, 4])
    adj = torch.sparse_csr_tensor(crow, col, torch.ones(6), (5, 6))
    x = torch.randn(6, 3, requires_grad=True)
    out = torch.sparse.mm(adj, x).sum()
    # SparseAddmmBackward0 saves mat1 = adj (for x's gradient); x needs no saving.
    assert saved_bytes(out) == 6 * 8 + 6 * 8 + 6 * 4
    assert [r.attr for r in saved_tensors(out)] == [
        "_saved_mat1.crow_indices", "_saved_mat1.col_indices", "_saved_mat1.values"]
    assert saved_bytes(out, exclude=[adj]) == 0


def test_sparse_coo_leaf():
    adj = torch.eye(5, 6).to_sparse().requires_grad_()  # coalesced, nnz = 5
    x = torch.randn(6, 3, requires_grad=True)
    out = torch.sparse.mm(adj, x).sum()
    # Both operands are saved, both are leaves.
    assert saved_bytes(out) == 0
    assert saved_bytes(out, include_leaves=True) == (2 * 5 * 8 + 5 * 4) + 6 * 3 * 4


# ------------------------------------------------------------------------------ PyG


def _graph(n: int, e: int, f: int, c: int):
    torch.manual_seed(0)
    # e distinct directed edges without self loops, so that GCN's self loops make e + n.
    pairs = torch.randperm(n * (n - 1))[:e]
    row, k = pairs // (n - 1), pairs % (n - 1)
    col = k + (k >= row).long()
    return torch.randn(n, f), torch.stack([row, col]), torch.randint(0, c, (n,))


def _gcn_loss(x, adj, y, hidden, classes):
    from torch_geometric.nn import GCNConv

    torch.manual_seed(1)
    conv1, conv2 = GCNConv(x.size(1), hidden), GCNConv(hidden, classes)
    out = conv2(F.relu(conv1(x, adj)), adj)
    return F.cross_entropy(out, y)


N, E, FEAT, HIDDEN, CLASSES = 50, 200, 16, 32, 4


def _gcn_common_bytes(n, f, h, c):
    # MmBackward0 of lin1: its input x [n, f] (for W1's gradient; the lin runs before propagate).
    # ReluBackward0: h [n, hidden], also saved by MmBackward0 of lin2 (W2ᵀ saved there is a leaf).
    # LogSoftmaxBackward0 / NllLossBackward0: log-probabilities [n, c] (one storage), the target
    #   y [n] int64 and total_weight, a 0-dim fp32 tensor.
    x_bytes, y_bytes = n * f * 4, n * 8
    return x_bytes, y_bytes, n * h * 4 + n * c * 4 + 4


def test_gcn_edge_index_exact_bytes():
    x, edge_index, y = _graph(N, E, FEAT, CLASSES)
    loss = _gcn_loss(x, edge_index, y, HIDDEN, CLASSES)
    x_bytes, y_bytes, rest = _gcn_common_bytes(N, FEAT, HIDDEN, CLASSES)
    # Per layer (gcn_norm runs again in every layer, cached=False), with m = e + n edges after
    # add_remaining_self_loops:
    #   IndexSelectBackward0 saves row (x_j = x[row]) and ScatterAddBackward0 saves col
    #   (expanded); both are views of the new [2, m] int64 edge_index: 16 m bytes.
    #   MulBackward0 saves the normalized edge weight [m, 1] fp32 (x_j · w: only w is kept,
    #   the gathered messages x_j [m, F] are NOT saved): 4 m bytes.
    m = E + N
    per_layer = 2 * m * 8 + m * 4
    assert saved_bytes(loss) == x_bytes + y_bytes + rest + 2 * per_layer == 20804
    assert saved_bytes(loss, exclude=[x, y]) == rest + 2 * per_layer


def test_gcn_csr_adjacency_exact_bytes():
    x, edge_index, y = _graph(N, E, FEAT, CLASSES)
    adj_t = torch.sparse_coo_tensor(edge_index.flip(0), torch.ones(E), (N, N))
    adj_t = adj_t.coalesce().to_sparse_csr()
    loss = _gcn_loss(x, adj_t, y, HIDDEN, CLASSES)
    x_bytes, y_bytes, rest = _gcn_common_bytes(N, FEAT, HIDDEN, CLASSES)
    # Per layer: SparseAddmmBackward0 saves the normalized CSR adjacency with self loops
    # (a new one per layer): crow [n + 1] int64, values [m] fp32, and col [m] int64, which is
    # a view of a [2, m] int64 COO index (gcn_norm builds the matrix in COO and converts), so
    # that the whole [2, m] storage stays alive: no saving over the edge_index path.
    m = E + N
    per_layer = (N + 1) * 8 + 2 * m * 8 + m * 4
    assert saved_bytes(loss) == x_bytes + y_bytes + rest + 2 * per_layer
    assert saved_bytes(loss, exclude=[x, y, adj_t]) == rest + 2 * per_layer


def test_gcn_edge_index_subclass():
    from torch_geometric import EdgeIndex

    x, edge_index, y = _graph(N, E, FEAT, CLASSES)
    ei = EdgeIndex(edge_index, sparse_size=(N, N)).sort_by("col")[0]
    loss = _gcn_loss(x, ei, y, HIDDEN, CLASSES)
    x_bytes, y_bytes, rest = _gcn_common_bytes(N, FEAT, HIDDEN, CLASSES)
    # Same as a plain edge_index: the saved row is a PyG ``Index`` wrapper whose ``_data`` is a
    # view of the [2, m] storage that ScatterAddBackward0 also saves.
    m = E + N
    assert saved_bytes(loss) == x_bytes + y_bytes + rest + 2 * (2 * m * 8 + m * 4)


def test_edge_index_caches_are_counted():
    from torch_geometric import EdgeIndex

    n, e = 4, 5
    ei = EdgeIndex(torch.tensor([[0, 0, 1, 2, 3], [1, 2, 2, 3, 0]]), sparse_size=(n, n),
                   sort_order="row")

    out = _keep_in_ctx(ei)
    assert saved_bytes(out) == 2 * e * 8  # only the [2, e] data so far
    ei.get_csr()
    ei.get_csc()
    # Now also rowptr [n + 1], colptr [n + 1], the permutation [e] and the column-sorted
    # (row, col) pair ``_T_index`` [e] each, which __tensor_flatten__ leaves out. The caches
    # are attributes of the object the graph holds, so the same graph now keeps more.
    assert saved_bytes(out) == 2 * e * 8 + 2 * (n + 1) * 8 + 3 * e * 8


# ---------------------------------------------------------------------- bad input


def test_freed_graph_raises():
    x = torch.randn(4, requires_grad=True)
    loss = x.exp().sum()
    loss.backward(retain_graph=True)
    assert saved_bytes(loss) == 4 * 4  # ExpBackward0's result survives with retain_graph
    loss.backward()
    with pytest.raises(RuntimeError, match="before backward, or use retain_graph=True"):
        saved_bytes(loss)

    out = _KeepPacked.apply(x * 1, *_packed())
    out.sum().backward()
    with pytest.raises(RuntimeError, match="retain_graph=True"):
        saved_tensors(out)


def test_bad_output_type():
    with pytest.raises(TypeError, match=r"'output'.*element 1 is int"):
        saved_bytes([torch.zeros(1), 3])
    with pytest.raises(TypeError, match=r"'output'.*not str"):
        saved_bytes("loss")
    with pytest.raises(TypeError, match=r"'output'.*not NoneType"):
        saved_bytes(None)
    with pytest.raises(TypeError, match=r"'exclude'.*got str"):
        saved_bytes(torch.zeros(1), exclude=["x"])


def test_no_grad_fn_is_zero():
    assert saved_bytes(torch.randn(3)) == 0
    assert saved_bytes(torch.randn(3, requires_grad=True), include_leaves=True) == 0
    assert saved_tensors([]) == []
    with torch.no_grad():
        assert saved_bytes(torch.randn(3, requires_grad=True).exp()) == 0
