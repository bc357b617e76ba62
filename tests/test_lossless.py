"""Indices and masks autograd keeps are stored exactly in fewer bytes
(:mod:`gnnact.compress.lossless`, ``Config.compact_indices``): round trips, byte counts, and
models written as PyG's examples write them, whose backward must not change by a bit."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import ChebConv, GINConv, TransformerConv

import gnnact
from gnnact.compress import Policy
from gnnact.compress.lossless import CompactTensor, compact, two_valued, unbroadcast
from gnnact.memory import saved_bytes, saved_tensors, storage_keys
from gnnact.nn.scope import scope_of

# ------------------------------------------------------------------ compact / unbroadcast

@pytest.mark.parametrize(("dtype", "lo", "hi", "stored", "offset"), [
    (torch.int64, 0, 255, torch.uint8, 0),
    (torch.int64, -300, 300, torch.int16, 0),
    (torch.int64, 0, 169_342, torch.int32, 0),           # ogbn-arxiv's node ids
    (torch.int64, 100_000, 100_255, torch.uint8, 100_000),  # a block of sorted targets
    (torch.int64, -(2**40), -(2**40) + 30_000, torch.int16, -(2**40)),
    (torch.int32, 5, 200, torch.uint8, 0),
    (torch.int32, 0, 2**31 - 1, None, 0),                # needs its own width
    (torch.int16, -5, 5, torch.uint8, -5),
    (torch.int64, -(2**62), 2**62, None, 0),
])
def test_integers_round_trip_in_the_narrowest_dtype(dtype, lo, hi, stored, offset) -> None:
    g = torch.Generator().manual_seed(0)
    t = torch.randint(lo, hi, (3, 1001), generator=g, dtype=dtype)
    t[0, 0], t[-1, -1] = lo, hi
    c = compact(t)
    if stored is None:
        assert c is None
        return
    assert (c.data.dtype, c.offset) == (stored, offset)
    assert c.nbytes == t.numel() * c.data.element_size()
    restored = c.dequantize()
    assert restored.dtype == dtype and torch.equal(restored, t)
    rebuilt = CompactTensor.from_parts(c.tensors(), c.meta)
    assert torch.equal(rebuilt.dequantize(), t)


@pytest.mark.parametrize("shape", [(1,), (7,), (8,), (13, 5), (4, 3, 9)])
def test_booleans_round_trip_at_one_bit(shape) -> None:
    t = torch.rand(shape, generator=torch.Generator().manual_seed(1)) > 0.5
    c = compact(t)
    assert c.bits == 1 and c.nbytes == -(-t.numel() // 8)
    assert torch.equal(c.dequantize(), t)


def test_views_round_trip_and_empty_tensors_are_left_alone() -> None:
    edge_index = torch.randint(0, 1000, (2, 5000))
    for view in (edge_index[1], edge_index.t()[:, 0], edge_index[:, ::3]):
        assert torch.equal(compact(view).dequantize(), view)
    assert compact(torch.zeros(0, dtype=torch.long)) is None


def test_unbroadcast_keeps_each_value_once() -> None:
    index = torch.arange(10).view(-1, 1, 1).expand(10, 4, 64)  # a scatter's saved index
    core = unbroadcast(index)
    assert core.shape == (10, 1, 1) and torch.equal(core.expand(index.shape), index)
    plain = torch.arange(12).view(3, 4)
    assert unbroadcast(plain) is not plain and unbroadcast(plain).shape == plain.shape
    one = torch.arange(3).view(3, 1).expand(3, 1)  # size 1: nothing to cut
    assert unbroadcast(one).shape == (3, 1)


@pytest.mark.parametrize("bad", [torch.randn(4), torch.zeros(4, dtype=torch.uint8), [1, 2]])
def test_other_inputs_are_refused(bad) -> None:
    with pytest.raises(TypeError, match="^t must be a strided tensor of"):
        compact(bad)
    if not isinstance(bad, torch.Tensor) or not bad.is_floating_point():
        with pytest.raises(TypeError, match="^t must be a strided floating-point tensor"):
            two_valued(bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_two_valued_floats_round_trip_at_one_bit(dtype) -> None:
    g = torch.Generator().manual_seed(2)
    keep = torch.rand(7, 333, generator=g) > 0.1
    dropout = keep.to(dtype) / 0.9  # PyTorch's CPU dropout mask: {0, 1/(1-p)}
    causal = torch.zeros(7, 333, dtype=dtype).masked_fill(~keep, float("-inf"))
    constant = torch.full((7, 333), 3.5, dtype=dtype)
    for t in (dropout, causal, constant, dropout.t()):
        c = two_valued(t)
        assert c.bits == 1 and c.nbytes == -(-t.numel() // 8)
        restored = c.dequantize()
        assert restored.dtype == dtype and torch.equal(restored, t)
        assert torch.equal(CompactTensor.from_parts(c.tensors(), c.meta).dequantize(), t)
    three = dropout.clone()
    three[0, 0] = 0.5
    nan = dropout.clone()
    nan[0, 0] = float("nan")
    assert two_valued(three) is None and two_valued(nan) is None
    assert two_valued(torch.zeros(0, dtype=dtype)) is None


@pytest.mark.parametrize("at", [0, 4095, 4096, 14_999])
def test_two_valued_reads_past_its_first_values(at) -> None:
    # Beyond the first 4096 values that turn most tensors down, every value is checked: a
    # third value anywhere (or a NaN) and there is no one-bit copy.
    g = torch.Generator().manual_seed(3)
    mask = (torch.rand(5000, 3, generator=g) > 0.5).float() * 2.0
    assert torch.equal(two_valued(mask).dequantize(), mask)
    for odd in (0.5, float("nan")):
        t = mask.clone()
        t.view(-1)[at] = odd
        assert two_valued(t) is None
        assert two_valued(t.t()) is None  # (not contiguous: read whole at once)


# ------------------------------------------------------------------ the pipeline

class WithLinear(nn.Module):
    """A linear map of width ``f``; each test writes the forward around it."""

    def __init__(self, f: int) -> None:
        super().__init__()
        self.lin = nn.Linear(f, f)


class LoopedSum(WithLinear):
    """An aggregation written as PyG writes it, over an edge index it makes itself (self-loops
    added): the scatter keeps the targets broadcast to [E + N, F], the gather the sources."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        loops = torch.arange(x.size(0), device=x.device).repeat(2, 1)
        ei = torch.cat([edge_index, loops], dim=1)
        h = self.lin(x).tanh()
        msg = h.index_select(0, ei[0])
        out = torch.zeros_like(h).scatter_add(0, ei[1].view(-1, 1).expand_as(msg), msg)
        return out.sum()


def _kept_and_grad(model: LoopedSum, x, edge_index, hooks=None):
    with hooks if hooks is not None else contextlib.nullcontext():
        loss = model(x, edge_index)
    records = [r for r in saved_tensors(loss, exclude=[model, x, edge_index]) if r.first]
    loss.backward()
    grad, model.lin.weight.grad = model.lin.weight.grad, None
    return records, grad


def _plain_and_compact(model: WithLinear, x, edge_index):
    """What ``model`` keeps without hooks and under hooks that keep floats exact (no policy
    compresses them: only the indices change form), the weight gradient unchanged."""
    plain, expected = _kept_and_grad(model, x, edge_index)
    hooks = gnnact.compress_saved_tensors(policy=Policy(default=None), model=model)
    records, grad = _kept_and_grad(model, x, edge_index, hooks)
    assert torch.equal(grad, expected)
    return plain, records, hooks


def test_pipeline_keeps_indices_compact_and_backward_unchanged() -> None:
    n, e, f = 3000, 20_000, 32
    torch.manual_seed(0)
    x, edge_index = torch.randn(n, f), torch.randint(0, n, (2, e))
    plain, records, hooks = _plain_and_compact(LoopedSum(f), x, edge_index)
    # Sources and targets, (E + N) int16 values each (3,000 nodes), instead of the [2, E + N]
    # int64 edge index; the caller's edge index (the model's argument) is not copied.
    assert hooks.bytes_by_kind["index"] == 2 * (e + n) * 2
    assert [r.nbytes for r in records if not r.dtype.is_floating_point] == [(e + n) * 2] * 2
    assert [r.nbytes for r in plain if not r.dtype.is_floating_point] == [2 * (e + n) * 8]
    # The tallies count it all (and x, kept by reference: no skip= names it).
    assert hooks.saved_bytes == sum(r.nbytes for r in records) + x.numel() * 4
    assert {entry.kind for entry in hooks.tensors.values()} >= {"index", "exact"}


class ChunkedSum(WithLinear):
    """An aggregation by pieces of a sorted copy of the edge list, as a chunked conv runs:
    each piece's gather and scatter save a few thousand indices, views of the copy."""

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        ei = edge_index[:, torch.argsort(edge_index[1])]  # the model's own copy
        h = self.lin(x).tanh()
        out = torch.zeros_like(h)
        for piece in ei.split(2500, dim=1):
            msg = h.index_select(0, piece[0])
            out = out.scatter_add(0, piece[1].view(-1, 1).expand_as(msg), msg)
        return out.sum()


def test_small_pieces_of_indices_are_kept_compact() -> None:
    """Fewer than ``min_numel`` indices each, but as many bytes as ``min_numel`` floats, and
    slices of one large copy: kept compact, which lets the copy go."""
    n, e, f = 3000, 20_000, 16
    torch.manual_seed(0)
    x, edge_index = torch.randn(n, f), torch.randint(0, n, (2, e))
    plain, records, _ = _plain_and_compact(ChunkedSum(f), x, edge_index)
    assert [r.nbytes for r in plain if not r.dtype.is_floating_point] == [2 * e * 8]
    assert sum(r.nbytes for r in records if not r.dtype.is_floating_point) == 2 * e * 2


def test_pipeline_off_at_32_bits_and_by_config() -> None:
    n, e, f = 3000, 20_000, 32
    x, edge_index = torch.randn(n, f), torch.randint(0, n, (2, e))
    model = LoopedSum(f)
    for config in (gnnact.Config(bits=32), gnnact.Config(compact_indices=False)):
        hooks = gnnact.compress_saved_tensors(config, model=model)
        with hooks:
            model(x, edge_index)
        assert "index" not in hooks.bytes_by_kind


def storage_key(t: torch.Tensor) -> tuple:
    (key,) = storage_keys(t)
    return key


def _cnn() -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(16 * 8 * 8, 10))


def test_max_pool_argmax_kept_in_16_and_8_bits() -> None:
    # A max pool keeps the argmax of every output as int64: in this CNN, 8 bytes for each
    # 2-bit activation, most of its context. The argmax of a 32 x 32 map fits 16 bits, of a
    # 16 x 16 map 8 bits.
    torch.manual_seed(0)
    cnn, images = _cnn(), torch.randn(32, 3, 32, 32)
    labels = torch.randint(0, 10, (32,))
    F.cross_entropy(cnn(images), labels).backward()
    expected = [p.grad.clone() for p in cnn.parameters()]
    cnn.zero_grad(set_to_none=True)
    kept = {}
    for compact_indices in (False, True):
        config = gnnact.Config(compact_indices=compact_indices)
        hooks = gnnact.compress_saved_tensors(config, policy=Policy(default=None), model=cnn)
        with hooks:
            loss = F.cross_entropy(cnn(images), labels)
        kept[compact_indices] = saved_bytes(loss, exclude=[cnn, images, labels])
        loss.backward()
        for p, grad in zip(cnn.parameters(), expected, strict=True):
            assert torch.equal(p.grad, grad)
        cnn.zero_grad(set_to_none=True)
    pooled = 32 * 16 * (16 * 16 + 8 * 8)  # argmax values of the two pools
    assert hooks.bytes_by_kind["index"] == 32 * 16 * (16 * 16 * 2 + 8 * 8)
    assert kept[False] - kept[True] == 8 * pooled - hooks.bytes_by_kind["index"]


def test_the_models_arguments_stay_by_reference() -> None:
    # An index the model is called with is resident: a copy would add bytes. One it makes
    # from it (the reversed index) is its own.
    class Gather(WithLinear):
        def forward(self, x, index):
            h = self.lin(x)
            return h.index_select(0, index).sum() + h.index_select(0, index.flip(0)).sum()

    model, x, index = Gather(8), torch.randn(100, 8), torch.randint(0, 100, (10_000,))
    for call in (lambda: model(x, index), lambda: model(x, index=index)):
        hooks = gnnact.compress_saved_tensors(model=model)
        with hooks:
            loss = call()
        records = [r for r in saved_tensors(loss, exclude=[model, x]) if r.first]
        assert sorted(str(r.dtype) for r in records
                      if not r.dtype.is_floating_point) == ["torch.int64", "torch.uint8"]
        assert hooks.bytes_by_kind["index"] == 10_000  # only the flipped one: 8 bits each
        loss.backward()


def test_cpu_dropout_masks_kept_at_one_bit_backward_unchanged() -> None:
    # PyTorch's own encoder layer: on the CPU its dropouts save float masks {0, 1/(1-p)},
    # which need no gradient. Made by the model, they are temporaries, not inputs: kept at one
    # bit, exactly, instead of 32 bits by reference.
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.1, batch_first=True)
    model = nn.Sequential(layer, nn.Flatten(0, 1), nn.Linear(64, 5)).train()
    x, y = torch.randn(8, 32, 64), torch.randint(0, 5, (8 * 32,))

    def grads(hooks=None):
        torch.manual_seed(1)  # the same dropout masks
        with hooks if hooks is not None else contextlib.nullcontext():
            loss = F.cross_entropy(model(x), y)
        kept = saved_bytes(loss, exclude=[model, x, y])
        loss.backward()
        out = [p.grad.clone() for p in model.parameters()]
        model.zero_grad(set_to_none=True)
        return out, kept

    expected, kept_plain = grads()
    hooks = gnnact.compress_saved_tensors(policy=Policy(default=None), model=model)
    got, kept = grads(hooks)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)
    masks = [t for t in hooks.tensors.values() if t.kind == "mask"]
    # Attention weights [8, 4, 32, 32], feed-forward [8, 32, 128], two residuals [8, 32, 64]
    assert sorted(t.shape for t in masks) == sorted([(8, 4, 32, 32), (8, 32, 128),
                                                     (8, 32, 64), (8, 32, 64)])
    assert hooks.bytes_by_kind["mask"] == sum(8 * 32 * n // 8 for n in (4 * 32, 128, 64, 64))
    assert kept_plain - kept == sum(t.raw_bytes - t.nbytes for t in masks)


def test_tensors_the_model_makes_are_not_taken_for_inputs() -> None:
    # Before the model is called, every tensor that needs no gradient is taken for an input
    # (kept by reference); once it is called, only its arguments are.
    class Scaled(WithLinear):
        def forward(self, x, scale):
            h = self.lin(x)
            noise = torch.rand(h.shape)  # made here, no gradient, many values
            return (h * scale).sum() + (h * noise).sum()

    model, x, scale = Scaled(64), torch.randn(128, 64), torch.rand(128, 64)
    hooks = gnnact.compress_saved_tensors(model=model)
    with hooks:
        loss = model(x, scale)
    records = {(r.node, r.attr): r for r in saved_tensors(loss, exclude=[model, x])}
    kept = [r for r in records.values() if r.dtype == torch.float32 and r.nbytes >= 128 * 64 * 4]
    assert [r.storage for r in kept] == [storage_key(scale)]  # the argument, by reference
    assert any(e.kind == "quantize" and e.shape == (128, 64) for e in hooks.tensors.values())
    loss.backward()


def test_broadcast_floats_compressed_once() -> None:
    # A tensor broadcast over columns (a per-row scale, as a mean aggregation saves its
    # 1 / degree) holds one value per row: compressed, it costs one packed value per row.
    class RowScaled(WithLinear):
        def forward(self, x):
            scale = torch.rand(x.size(0), 1).expand(-1, 64)  # made here: a temporary
            return (self.lin(x) * scale).sum()

    torch.manual_seed(0)
    model, x = RowScaled(64), torch.randn(8192, 64)
    hooks = gnnact.compress_saved_tensors(gnnact.Config(bits=8), model=model)
    with hooks:
        loss = model(x)
    # (The product's backward reads only the scale: the linear map's output is not kept.)
    (scale,) = [e for e in hooks.tensors.values() if e.kind == "quantize"]
    assert scale.shape == (8192, 64)
    assert scale.nbytes == 16 * (512 + 8)  # 8,192 codes of 8 bits, 16 groups of 512
    loss.backward()
    assert torch.isfinite(model.lin.weight.grad).all()


# ------------------------------------------------------------------ converted PyG models

class Cheb(nn.Module):  # as PyG's examples/citation/cheb.py writes it
    def __init__(self, f_in: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = ChebConv(f_in, hidden, K=2)
        self.conv2 = ChebConv(hidden, classes, K=2)

    def forward(self, x, edge_index):
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class Transformer(nn.Module):  # UniMP's shape: messages in blocks of targets
    def __init__(self, f_in: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = TransformerConv(f_in, hidden // 4, heads=4)
        self.conv2 = TransformerConv(hidden, classes, heads=1)

    def forward(self, x, edge_index):
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class GIN(nn.Module):  # no edge index of its own: everything it saves views the input
    def __init__(self, f_in: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.conv1 = GINConv(nn.Sequential(nn.Linear(f_in, hidden), nn.ReLU()))
        self.conv2 = GINConv(nn.Linear(hidden, classes))

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _step(model: nn.Module, x, edge_index, y):
    torch.manual_seed(3)  # the same dropout masks and rounding streams in every run
    out = model(x, edge_index)
    loss = F.cross_entropy(out, y)
    kept = saved_bytes(loss, exclude=[model, x, edge_index])
    loss.backward()
    return out.detach(), kept, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("cls", [Cheb, Transformer, GIN])
@pytest.mark.usefixtures("small_messages_in_pieces")
def test_converted_models_keep_less_and_compute_the_same(cls) -> None:
    torch.manual_seed(0)
    # TransformerConv's blocks of targets have about one edge per node (5,000 indices each:
    # more than min_numel)
    n = 5000
    x, edge_index = torch.randn(n, 32), torch.randint(0, n, (2, 50_000))
    y = torch.randint(0, 5, (n,))
    model = cls(32, 64, 5)
    off = gnnact.convert(copy.deepcopy(model),
                         gnnact.Config(bits=2, compact_indices=False))
    on = gnnact.convert(copy.deepcopy(model), gnnact.Config(bits=2))
    out_off, kept_off, grads_off = _step(off, x, edge_index, y)
    out_on, kept_on, grads_on = _step(on, x, edge_index, y)
    # Same rounding noise, same indices: the step is the same to the bit.
    assert torch.equal(out_on, out_off)
    for a, b in zip(grads_on, grads_off, strict=True):
        assert torch.equal(a, b)
    tensors = scope_of(on).last.tensors
    indices = [t for t in tensors.values() if t.kind == "index"]
    if cls is GIN:  # views of the caller's edge index stay by reference: nothing to add
        assert not indices and kept_on == kept_off
        return
    # Node ids (5,000) in 16 bits, TransformerConv's edge permutation (50,000) in 32.
    assert indices and all(t.bits <= 32 and t.nbytes <= t.raw_bytes // 2 for t in indices)
    # Cheb: the Laplacian's [2, E + N] int64 index was a third of the context.
    assert kept_off / kept_on > (1.3 if cls is Cheb else 1.03)


@pytest.mark.usefixtures("small_messages_in_pieces")
def test_chunked_feature_blocks_share_one_copy() -> None:
    # ChebConv runs its propagation in feature blocks (gnnact.nn.chunked), each saving the
    # same targets broadcast to its width: one copy serves them all.
    torch.manual_seed(0)
    n = 2000
    x, edge_index = torch.randn(n, 32), torch.randint(0, n, (2, 30_000))  # several blocks
    e = int((edge_index[0] != edge_index[1]).sum()) + n  # the Laplacian's: loops replaced
    model = gnnact.convert(Cheb(32, 64, 5), gnnact.Config(bits=2))
    model(x, edge_index).sum().backward()
    indices = [t for t in scope_of(model).last.tensors.values() if t.kind == "index"]
    # conv2's propagation (conv1's input needs no gradient): its targets and its sources,
    # once each, although every feature block saved them.
    assert len(indices) == 2
    assert sum(t.nbytes for t in indices) == 2 * e * 2


@pytest.mark.cuda
def test_offloaded_indices_round_trip_on_cuda() -> None:
    n, e, f = 3000, 20_000, 32
    device = torch.device("cuda")
    torch.manual_seed(0)
    x = torch.randn(n, f, device=device)
    edge_index = torch.randint(0, n, (2, e), device=device)
    model = LoopedSum(f).to(device)
    _, expected = _kept_and_grad(model, x, edge_index)
    hooks = gnnact.compress_saved_tensors(gnnact.Config(offload=True),
                                          policy=Policy(default=None), model=model)
    _, grad = _kept_and_grad(model, x, edge_index, hooks)
    assert torch.equal(grad, expected)
    assert hooks.bytes_by_kind["index"] == 2 * (e + n) * 2
    assert hooks.offloaded_bytes >= hooks.bytes_by_kind["index"]
