"""Tests for :class:`gnnact.compress_saved_tensors` with plain per-group quantization (the
other compressors, policies and whole models: ``test_generic.py``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch_geometric.nn import GCNConv, SAGEConv

from gnnact import Config, compress_saved_tensors
from gnnact.compress import Policy, Quantize
from gnnact.data import synthetic_graph
from gnnact.memory import saved_bytes
from gnnact.models import build
from gnnact.quant import PackedTensor


def quantized_saved_tensors(bits, group_size=512, *, per_row=False, backend="auto", **kwargs):
    """The pipeline quantizing every candidate tensor at ``bits`` (no exact loss or head)."""
    config = Config(bits=bits, group_size=group_size, per_row=per_row, backend=backend)
    policy = Policy(default=Quantize.from_config(config) if bits != 32 else None)
    return compress_saved_tensors(config, policy=policy, **kwargs)


def spy(hooks: compress_saved_tensors) -> list:
    """Record what the pack hook returns (the base class pushes ``hooks.pack_hook``)."""
    returned: list = []
    pack = hooks.pack_hook

    def recording(t):
        out = pack(t)
        returned.append(out)
        return out

    hooks.pack_hook = recording
    return returned


class Net(torch.nn.Module):
    def __init__(self, conv, channels=16, hidden=64, classes=4):
        super().__init__()
        self.conv1, self.conv2 = conv(channels, hidden), conv(hidden, classes)
        self.bn = torch.nn.BatchNorm1d(hidden)

    def forward(self, x, edge_index):
        h = F.dropout(F.relu(self.bn(self.conv1(x, edge_index))), 0.5, self.training)
        return self.conv2(h, edge_index)


@pytest.fixture(scope="module")
def data():
    return synthetic_graph(600, 6, 16, 4, seed=0)


def forward(model, data, hooks=None):
    """The loss of one step (graph kept), dropout seeded identically every time."""
    model.zero_grad()
    torch.manual_seed(123)

    def run():
        out = model(data.x, data.edge_index)
        return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])

    if hooks is None:
        return run()
    with hooks:
        return run()


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


def test_dedup_packs_once():
    x = torch.randn(64, 128, requires_grad=True)
    hooks = quantized_saved_tensors(8, min_numel=0)
    returned = spy(hooks)
    with hooks:
        y = x * 3  # saves nothing that needs packing (a scalar)
        a, b = y.sin(), y.cos()  # both save y
    assert hooks.num_packed == 1
    packed = [r for r in returned if isinstance(r, PackedTensor)]
    # One copy: the second save holds the very tensors of the first.
    assert len(packed) == 2 and packed[0].codes is packed[1].codes
    assert hooks.num_shared == 1 and hooks.packed_bytes == packed[0].nbytes
    (a + b).sum().backward()
    expected = 3 * (y.detach().cos() - y.detach().sin())
    # 8 bits over a range of ~24: each value is off by at most one step, ~0.1.
    assert ((x.grad - expected).norm() / expected.norm()).item() < 0.05


def test_new_tensor_at_reused_address_is_packed_again():
    hooks = quantized_saved_tensors(8, min_numel=0)
    x = torch.randn(64, 128, requires_grad=True)
    with hooks:
        for _ in range(3):
            y = x * 2
            y.sin()  # graph dropped at once: y's memory is free for the next y
            del y
    # Whatever addresses the allocator handed out (typically the same one), every y is a
    # new tensor and is packed anew.
    assert hooks.num_packed == 3


def test_views_of_the_same_data_share_one_copy():
    x = torch.randn(64, 128, requires_grad=True)
    hooks = quantized_saved_tensors(8, min_numel=0)
    with hooks:
        y = x * 2
        alias = y.view(32, 256)  # same data, same order: one copy, restored in either shape
        transposed = y.t()  # another order: its own copy
        a, b, c = y.sin(), alias.sin(), transposed.sin()  # all graphs stay alive
    assert hooks.num_packed == 2 and hooks.num_shared == 1
    (a.sum() + b.sum() + c.sum()).backward()
    expected = 2 * 3 * y.detach().cos()
    assert ((x.grad - expected).norm() / expected.norm()).item() < 0.05


def test_a_compressed_view_comes_back_in_its_strides():
    # (A compiled graph's backward checks the strides of what it saved.)
    torch.manual_seed(0)
    x = torch.randn(64, 128, requires_grad=True)
    with quantized_saved_tensors(8, min_numel=0) as hooks:
        transposed = (x * 2).t()
        strided = (x * 3).view(8, 8, 128).permute(2, 0, 1)
        a, b = transposed.sin(), strided.sin()
    assert hooks.num_packed == 2
    for out, view in ((a, transposed), (b, strided)):
        restored = out.grad_fn._saved_self
        assert restored.stride() == view.stride()
        # 8 bits: a value's rounding error is at most a 255th of its group's range.
        assert ((restored - view).norm() / view.norm()).item() < 0.03


def test_in_place_change_is_a_new_version():
    hooks = quantized_saved_tensors(8, min_numel=0)
    x = torch.randn(64, 128, requires_grad=True)
    with hooks:
        y = x * 2
        a = y.sin()
        y.mul_(2)  # bumps y._version: same storage, different data
        b = y.sin()
    assert hooks.num_packed == 2
    b.sum().backward()  # b's graph saved the updated y; a's is stale but unused
    del a


def test_parameters_ints_and_skipped_pass_through():
    lin = torch.nn.Linear(128, 64)
    x = torch.randn(100, 128)
    idx = torch.randint(0, 100, (500,))
    hooks = quantized_saved_tensors(2, skip=[lin, x], min_numel=0)
    returned = spy(hooks)
    with hooks:
        h = lin(x)  # saves x (skipped) and weight.t() (a view of a parameter)
        g = h.index_select(0, idx)  # saves idx (int64)
        loss = g.pow(2).sum()  # saves g: compressed
    assert not any(isinstance(r, PackedTensor) and r.shape == x.shape for r in returned)
    assert any(r is idx for r in returned)
    assert hooks.num_packed == 1
    # idx is the only pass-through storage outside `skip` (parameters are never tallied).
    assert hooks.passthrough_bytes == idx.numel() * idx.element_size()
    loss.backward()
    assert lin.weight.grad is not None


def test_leaf_requiring_grad_passes_through():
    w = torch.randn(128, 64, requires_grad=True)
    x = torch.randn(32, 128, requires_grad=True)
    hooks = quantized_saved_tensors(2, min_numel=0)
    returned = spy(hooks)
    with hooks:
        (x @ w).sum()
    assert any(r is w for r in returned) and any(r is x for r in returned)
    assert hooks.num_packed == 0 and hooks.passthrough_bytes == 0


def test_small_tensors_pass_through():
    x = torch.randn(10, 100, requires_grad=True)
    hooks = quantized_saved_tensors(2)  # default min_numel: 4096 > 1000
    with hooks:
        (x * 2).sin()
    assert hooks.num_packed == 0
    assert hooks.passthrough_bytes == 1000 * 4


@pytest.mark.parametrize("conv", [GCNConv, SAGEConv])
def test_bits32_identical_to_no_hooks(conv, data):
    torch.manual_seed(0)
    model = Net(conv)
    loss = forward(model, data)
    reference = saved_bytes(loss, exclude=[model, data.x, data.edge_index])
    loss.backward()
    expected = grads(model)

    hooks = quantized_saved_tensors(32, skip=[model, data.x, data.edge_index])
    loss = forward(model, data, hooks)
    # Same set of storages counted two ways: the hook tally and the graph walk.
    assert hooks.passthrough_bytes == reference > 0
    assert hooks.packed_bytes == 0 and hooks.num_packed == 0
    loss.backward()
    for a, b in zip(expected, grads(model), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("conv", [GCNConv, SAGEConv])
def test_bits8_gradients_close(conv, data):
    torch.manual_seed(0)
    model = Net(conv)
    loss = forward(model, data)
    loss.backward()
    expected = torch.cat([g.flatten() for g in grads(model)])

    hooks = quantized_saved_tensors(8, skip=[model, data.x, data.edge_index],
                                    generator=torch.Generator().manual_seed(0))
    returned = spy(hooks)
    loss = forward(model, data, hooks)
    assert hooks.num_packed > 0
    loss.backward()
    got = torch.cat([g.flatten() for g in grads(model)])
    assert ((got - expected).norm() / expected.norm()).item() < 0.05

    # The tally is the exact size of what was created, counted once per packed object.
    # (A shared copy comes back as a new object around the same tensors; ReLU masks count.)
    distinct = {id(r.tensors()[0]): r for r in returned if not isinstance(r, torch.Tensor)}
    assert len(distinct) == hooks.num_packed
    assert hooks.packed_bytes == sum(p.nbytes for p in distinct.values())
    assert hooks.saved_bytes == hooks.packed_bytes + hooks.passthrough_bytes


def test_compression_ratio_and_reset(data):
    torch.manual_seed(0)
    model = Net(GCNConv)
    loss = forward(model, data)
    fp32 = saved_bytes(loss, exclude=[model, data.x, data.edge_index])
    hooks = quantized_saved_tensors(2, skip=[model, data.x, data.edge_index])
    loss = forward(model, data, hooks)
    first = hooks.saved_bytes
    assert first < fp32 / 2
    hooks.reset_stats()
    assert hooks.saved_bytes == hooks.num_packed == 0
    loss = forward(model, data, hooks)
    assert hooks.saved_bytes == first  # same shapes, same bytes: nothing left from before
    loss.backward()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_non_contiguous_and_half(dtype):
    x = (0.1 * torch.randn(128, 96)).requires_grad_()
    w = torch.randn(128, 64, dtype=dtype, requires_grad=True)
    with quantized_saved_tensors(8, min_numel=0) as hooks:
        a = x.to(dtype).t()  # a transposed view: mm saves it for the gradient of w
        out = (a @ w).sin()
    # a @ w, and a unless it is a view of the leaf x (float32: x.to() is x itself), which
    # lives anyway; w is a leaf that requires grad.
    assert hooks.num_packed == (1 if dtype == torch.float32 else 2)
    out.float().sum().backward()
    with torch.no_grad():
        a, wf = x.t(), w.float()
        expected_x = wf @ (a @ wf).cos().t()
        expected_w = a.t() @ (a @ wf).cos()
    for got, expected in ((x.grad, expected_x), (w.grad.float(), expected_w)):
        assert ((got - expected).norm() / expected.norm()).item() < 0.05


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"bits": 9}, ValueError, "bits"),
    ({"bits": True}, TypeError, "bits"),
    ({"bits": 2, "group_size": 0}, ValueError, "group_size"),
    ({"bits": 2, "min_numel": -1}, ValueError, "min_numel"),
    ({"bits": 2, "backend": "numpy"}, ValueError, "backend"),
])
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        quantized_saved_tensors(**kwargs)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"skip": ["x"]}, "skip|str"),
    ({"config": 2}, "config"),
    ({"policy": "mesa"}, "policy"),
    ({"model": "net"}, "model"),
])
def test_other_types_rejected(kwargs, match):
    with pytest.raises(TypeError, match=match):
        compress_saved_tensors(**kwargs)


@pytest.mark.parametrize("model", ["gcn", "sage"])
def test_saved_bytes_agree_at_32_bits(model):
    # The hook tallies and the graph walk measure the same set of tensors: with hooks that keep
    # every tensor as is, they agree to the byte.
    data = synthetic_graph(400, 5, 8, 3)
    torch.manual_seed(0)
    net = build(model, 8, 3, hidden=16)
    resident = [net, data.x, data.edge_index]

    def loss_of() -> torch.Tensor:
        out = net(data.x, data.edge_index)
        return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])

    torch.manual_seed(1)
    reference = saved_bytes(loss_of(), exclude=resident)
    torch.manual_seed(1)
    with quantized_saved_tensors(32, skip=resident) as hooks:
        loss = loss_of()
    assert hooks.passthrough_bytes == reference == saved_bytes(loss, exclude=resident)
    assert hooks.packed_bytes == 0
