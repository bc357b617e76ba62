"""Tensors under ``Config.floor`` (``min_bytes``, by default ``gnnact.config.MIN_BYTES``) are
kept as they are and their ops run as PyTorch's; ``gnnact.summary`` reports them. These tests
run with the floor as shipped (``default_floor``); the rest of the suite compresses every
tensor however small."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import MLP, GATConv, GCNConv, GINConv, global_add_pool

import gnnact
from gnnact import ops
from gnnact.config import MIN_BYTES
from gnnact.memory import saved_bytes
from gnnact.nn.scope import scope_of
from gnnact.ops.context import in_another_form
from gnnact.ops.state import forward_pass

pytestmark = pytest.mark.default_floor


def test_floor_defaults_to_min_bytes_and_is_configurable() -> None:
    assert MIN_BYTES == 256 << 10
    assert gnnact.Config().floor == MIN_BYTES and gnnact.Config(min_bytes=0).floor == 0
    small, large = torch.zeros(MIN_BYTES // 4 - 1), torch.zeros(MIN_BYTES // 4)
    assert gnnact.Config().keeps(small) and not gnnact.Config().keeps(large)
    assert gnnact.Config().keeps(large.half())  # bytes, not values
    assert not gnnact.Config(min_bytes=0).keeps(small)


def test_a_gpus_floor_is_a_share_of_its_memory(monkeypatch) -> None:
    """On a GPU the default floor is a GPU_FLOOR_SHARE-th of its memory (MIN_BYTES at least);
    a config's min_bytes holds on every device. (The device's memory is stubbed: only its size
    is read, and a device's type.)"""
    from gnnact import config as config_module

    monkeypatch.setattr(config_module, "device_memory", lambda device: 141 << 30)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    share = (141 << 30) // config_module.GPU_FLOOR_SHARE
    assert gnnact.Config().floor_for(cuda) == share > 16 << 20  # Cora's features: 15.5 MB
    assert gnnact.Config().floor_for(cpu) == gnnact.Config().floor == MIN_BYTES
    assert gnnact.Config(min_bytes=0).floor_for(cuda) == 0
    assert gnnact.Config(min_bytes=1 << 20).floor_for(cuda) == 1 << 20
    monkeypatch.setattr(config_module, "device_memory", lambda device: 512 << 20)
    assert gnnact.Config().floor_for(cuda) == MIN_BYTES


def test_a_gpus_least_savings_are_a_share_of_its_memory(monkeypatch) -> None:
    """On a GPU a pass whose compression saves less than a GPU_PASS_SHARE-th of its memory
    runs as PyTorch's; not on the CPU, nor where min_bytes is set; min_pass_savings holds
    everywhere."""
    from gnnact import config as config_module

    monkeypatch.setattr(config_module, "device_memory", lambda device: 141 << 30)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    least = gnnact.Config().min_savings(cuda)
    assert least == (141 << 30) // config_module.GPU_PASS_SHARE > 100 << 20
    assert gnnact.Config().min_savings(cpu) == 0
    assert gnnact.Config(min_bytes=0).min_savings(cuda) == 0
    for device in (cuda, cpu):
        assert gnnact.Config(min_pass_savings=1 << 20).min_savings(device) == 1 << 20
        assert gnnact.Config(min_bytes=0, min_pass_savings=7).min_savings(device) == 7
        assert gnnact.Config(min_pass_savings=0).min_savings(device) == 0


def test_a_pass_whose_compression_saves_little_runs_as_pytorch() -> None:
    # 3,000 nodes x 32 hidden: 384 kB activations, over the tensor floor (each compressed in
    # a full pass); compressing them all saves a few MB.
    inputs = _batch(3000)
    torch.manual_seed(0)
    pyg = GIN()

    def converted(savings: int) -> nn.Module:
        return gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=2, self_check=False,
                                                                min_pass_savings=savings))

    full, model = converted(64 << 10), converted(64 << 20)  # 64 KiB, 64 MiB
    for step in range(3):
        _step(full, inputs, step)
        assert not scope_of(full).last.as_pytorch  # it saves more than 64 KiB
        out, grads = _step(model, inputs, step)
        record = scope_of(model).last
        # The first pass is a full one (it compresses, and measures what PyTorch would keep);
        # the next ones run as PyTorch's: the same values and gradients as PyG's.
        assert record.as_pytorch == (step > 0) and record.min_savings == 64 << 20
        if step:
            want, want_grads = _step(pyg, inputs, step)
            assert torch.equal(out, want)
            assert all(torch.equal(a, b) for a, b in zip(grads, want_grads, strict=True))
            assert 2 << 20 < record.context == scope_of(model).small_context[model]
    assert scope_of(full).last.context < record.context / 4  # (what it saves: 2 bits)
    report = gnnact.summary(model)
    assert report.as_pytorch and "compression saved under min_pass_savings (67.1 MB)" in str(
        report)


def test_a_pass_run_as_pytorch_whose_context_grows_by_the_savings_sends_the_next_back() -> None:
    x = torch.randn(100, 16, requires_grad=True)

    def passes(config: gnnact.Config, widths: list[int]) -> nn.Module:
        model = gnnact.convert(Widening(), config)
        for width in [16, 16, *widths]:  # a full pass, then the first run as PyTorch's
            model.width = width
            model(x).sum().backward()
        return model

    config = gnnact.Config(bits=2, self_check=False, min_pass_savings=1 << 20)
    # A tanh output of 100 x 1024 floats: 400 kB, over the tensor floor (alone that would
    # send the next pass back), under the savings.
    model = passes(config, [1024])
    scope = scope_of(model)
    assert scope.last.as_pytorch and model in scope.small_inputs
    assert scope.small_context[model] < scope.last.context
    model.width = 4096  # 1.6 MB more than the first pass run so: over them too
    model(x).sum().backward()
    assert scope.last.as_pytorch and model not in scope.small_inputs
    model(x).sum().backward()
    assert not scope.last.as_pytorch
    # Every tensor under the floor (1 GiB here): the pass stays small however much it grows.
    model = passes(dataclasses.replace(config, min_bytes=1 << 30, min_pass_savings=1), [4096])
    assert scope_of(model).last.as_pytorch and model in scope_of(model).small_inputs


@pytest.mark.parametrize("rows", [100, 4096])  # 25 KiB and 1 MiB inputs
def test_ops_run_as_pytorch_below_the_floor_only(rows: int) -> None:
    x = torch.randn(rows, 64, requires_grad=True)
    weight = torch.randn(32, 64, requires_grad=True)
    small = rows * 64 * 4 < MIN_BYTES
    y = ops.relu(ops.linear(x, weight))
    # Below the floor PyTorch's nodes (ReLU keeps its output), above gnnact's.
    assert (y.grad_fn.name() == "ReluBackward0") == small
    assert ("_Linear" in y.grad_fn.next_functions[0][0].name()) != small
    z = ops.dropout(x * 1.0, 0.5)
    assert ("_Masked" in z.grad_fn.name()) != small
    # gnnact keeps x at 2 bits above the floor: fewer bytes than the input itself.
    kept = saved_bytes(ops.linear(x * 1.0, weight, None, gnnact.Config(bits=2)), exclude=[weight])
    assert (kept >= rows * 64 * 4) == small


class GIN(nn.Module):
    def __init__(self, channels: int = 11, hidden: int = 32) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            GINConv(MLP([c, hidden, hidden])) for c in (channels, hidden, hidden))
        self.head = MLP([hidden, hidden, 3], norm=None, dropout=0.5)

    def forward(self, x, edge_index, batch):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.head(global_add_pool(x, batch))


def _batch(nodes: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(nodes, 11, generator=g)
    edge_index = torch.randint(0, nodes, (2, 4 * nodes), generator=g)
    batch = torch.arange(nodes) * 16 // nodes
    return x, edge_index, batch


def _step(model: nn.Module, inputs: tuple, seed: int = 0) -> tuple[torch.Tensor, list]:
    torch.manual_seed(seed)
    out = model(*inputs)
    F.cross_entropy(out, torch.arange(16) % 3).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    return out, grads


def test_small_batch_trains_as_pyg_and_summary_says_why() -> None:
    inputs = _batch(500)  # 500 x 32 activations: 64 KB each
    torch.manual_seed(0)
    pyg = GIN()
    model = gnnact.convert(copy.deepcopy(pyg))  # the default: automatic widths
    counted = set()
    for step in range(4):
        out, grads = _step(pyg, inputs, step)
        ours, our_grads = _step(model, inputs, step)
        # Nothing is rounded: the same values and gradients as PyG's, bit for bit.
        assert torch.equal(out, ours)
        for a, b in zip(grads, our_grads, strict=True):
            assert torch.equal(a, b)
        record = scope_of(model).last
        # The first step ran with gnnact's mode and pipeline, and found every tensor under
        # the floor: the next ones on inputs no larger run as PyTorch's.
        assert record.as_pytorch == (step > 0)
        assert record.tensors == {}  # no tensor went through a compressor
        assert record.small[0] > 10 and 0 < record.small[1] == record.context
        # Both kinds of pass count the same tensors (parameters, inputs, buffers left out).
        counted.add(record.small)
    assert len(counted) == 1
    report = gnnact.summary(model)
    assert report.small == record.small and report.min_bytes == MIN_BYTES
    assert f"{record.small[0]} tensors" in str(report) and "ran as PyTorch's" in str(report)
    assert {row.handling for row in report.rows} == {"pytorch"}
    # With nothing to measure, the automatic widths' probe ended with its step's backward:
    # later full steps do not join it (a probe's pass collects every call's result).
    auto = scope_of(model).auto
    assert auto._pending is None or auto._pending.done
    # A larger batch runs in full again, and raises the sizes smaller batches are held to;
    # each input's largest count counts (more edges in one batch, more nodes in another).
    scope = scope_of(model)
    x, edge_index, batch = _batch(600)
    for inputs, full in (((x, edge_index, batch), True), (_batch(500), False),
                         ((x, edge_index[:, :1000], batch), False)):
        _step(model, inputs)
        assert scope.last.as_pytorch != full and scope.small_inputs[model] == (600 * 11, 4800, 600)
    _step(model, (x[:300], edge_index[:, :2000] // 2, torch.arange(300) * 16 // 300))
    assert scope.last.as_pytorch


class GAT(nn.Module):
    """PyG's GATConv with attention dropout: its fused op keeps the LeakyReLU's sign and the
    dropout's keep mask packed to 1 bit."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GATConv(11, 8, heads=4, dropout=0.6)
        self.conv2 = GATConv(32, 3, heads=1, dropout=0.6)

    def forward(self, x, edge_index, batch):
        x = F.elu(self.conv1(F.dropout(x, 0.6, self.training), edge_index))
        return global_add_pool(self.conv2(x, edge_index), batch)


def test_packed_masks_under_the_floor_let_passes_run_as_pytorch() -> None:
    # Every tensor of the pass is under the floor; its GAT layers' fused op keeps its masks
    # packed (exact, not another form of what PyTorch keeps: a byte a value under the floor
    # too), and its rounded copies of the features are not made (the exact ones serve).
    inputs = _batch(200)
    torch.manual_seed(0)
    model = gnnact.convert(GAT())
    for step in range(3):
        _step(model, inputs, step)
        assert scope_of(model).last.as_pytorch == (step > 0)
        assert scope_of(model).last.tensors == {}


def test_exact_context_is_judged_by_the_bytes_pytorch_keeps() -> None:
    x = torch.randn(1000, requires_grad=True)
    config = gnnact.Config(bits=2, min_bytes=0)
    with forward_pass():
        (mask,) = ops.relu(x * 1.0, config=config).grad_fn.saved_tensors
        w = torch.randn(5, 100, requires_grad=True)
        codes = [t for t in ops.linear(x.view(10, 100), w, None,
                                       config).grad_fn.saved_tensors if t.dtype == torch.uint8]
        # A packed mask of 1000 values: 1000 bytes as a boolean mask.
        assert mask.dtype == torch.uint8 and mask.numel() == 125
        assert not in_another_form(mask, 1001) and in_another_form(mask, 1000)
        # 2-bit codes are another form at any floor; a tensor no op kept, none.
        assert codes and all(in_another_form(t, 1 << 30) for t in codes)
        assert not in_another_form(x, 0)


class Widening(nn.Module):
    """A tanh of 100 x ``width`` values: a tensor that does not grow with the forward's
    inputs."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(1, 4)
        self.width = 16

    def forward(self, x):
        return self.lin(x.repeat(1, self.width // 16).tanh().sum(1, keepdim=True))


def test_a_pass_run_as_pytorch_that_meets_a_large_tensor_sends_the_next_back() -> None:
    model = gnnact.convert(Widening(), gnnact.Config(bits=2, self_check=False))
    x = torch.randn(100, 16, requires_grad=True)
    scope = scope_of(model)
    model(x).sum().backward()
    assert scope.small_inputs[model] == (1600,)
    model.width = 1024  # a tanh output of 100 x 1024 floats: 400 kB, over the floor
    out = model(x)
    # Kept as it is (exact), and the next pass is a full one that compresses it.
    assert scope.last.as_pytorch and model not in scope.small_inputs
    assert saved_bytes(out, exclude=[x, model]) >= 100 * 1024 * 4
    out.sum().backward()
    out = model(x)
    assert not scope.last.as_pytorch and scope.last.tensors
    assert saved_bytes(out, exclude=[x, model]) < 100 * 1024 * 4 / 2  # (tanh: 8 bits)


def test_min_bytes_zero_compresses_small_tensors_again() -> None:
    inputs = _batch(500)
    torch.manual_seed(0)
    pyg = GIN()
    config = gnnact.Config(bits=2, min_bytes=0, self_check=False)
    model = gnnact.convert(copy.deepcopy(pyg), config)
    kept = saved_bytes(model(*inputs), exclude=list(inputs))
    default = gnnact.convert(copy.deepcopy(pyg), gnnact.Config(bits=2, self_check=False))
    assert 4 * kept < saved_bytes(default(*inputs), exclude=list(inputs))
    assert scope_of(model).last.small[0] < scope_of(default).last.small[0]


def test_twin_keeps_a_small_input_as_is() -> None:
    # GCNConv's twin keeps its input at 2 bits above the floor; under it, as is: the
    # gradients are those of the exact conversion.
    g = torch.Generator().manual_seed(1)
    x = torch.randn(200, 16, generator=g)
    edge_index = torch.randint(0, 200, (2, 800), generator=g)
    torch.manual_seed(0)
    net = _Twin()
    exact = gnnact.convert(copy.deepcopy(net), gnnact.Config(bits=32))
    small = gnnact.convert(copy.deepcopy(net), gnnact.Config(bits=2, self_check=False))
    grads = []
    for model in (exact, small):
        model(x, edge_index).square().sum().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


class _Twin(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.conv = GCNConv(16, 8)

    def forward(self, x, edge_index):
        return self.conv(self.lin(x), edge_index)
