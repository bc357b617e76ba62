"""Swap and prefetch (:mod:`gnnact.swap`) through ``gnnact.compress_saved_tensors``: a no-op on
the CPU; on CUDA, identical gradients, no memory growth and stable stream ordering."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gnnact
from gnnact import Config, compress_saved_tensors
from gnnact.compress import Policy, Quantize
from gnnact.swap import Swapped, _State


def mlp(depth: int = 4, width: int = 256) -> nn.Module:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


def grads(model, x, y, hooks, seed=0):
    model.zero_grad()
    hooks.generator = torch.Generator().manual_seed(seed)  # the same rounding noise each time
    with hooks:
        loss = F.cross_entropy(model(x), y)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def layer_grads(model, data, hooks):
    """The parameter gradients of a gnnact GNN after one pass under ``hooks`` (seed 1)."""
    model.zero_grad()
    torch.manual_seed(1)
    with hooks:
        loss = F.cross_entropy(model(data.x, data.edge_index), data.y)
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def pipeline(model, x, **config):
    return compress_saved_tensors(Config(bits=4, **config), model=model, skip=[x],
                                  policy=Policy(default=Quantize(4)))


def test_offload_is_a_no_op_on_the_cpu():
    torch.manual_seed(0)
    model, x, y = mlp(), torch.randn(64, 256), torch.randint(0, 10, (64,))
    plain = pipeline(model, x)
    offload = pipeline(model, x, offload=True, prefetch_depth=2)
    assert torch.equal(grads(model, x, y, plain), grads(model, x, y, offload))
    assert offload.offloaded_bytes == 0 and offload.saved_bytes == plain.saved_bytes > 0


class CopyingOffloader:
    """Stands in for :class:`gnnact.swap.Offloader` on the CPU (which has no streams): it keeps
    a copy of what it is handed and returns a copy of that copy, so, as with a real offload,
    the tensors handed over are referenced by nothing afterwards."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def new_pass(self) -> None:
        pass

    def offload(self, tensors, rebuild, shape):
        return Swapped([t.clone() for t in tensors], rebuild, self.device, _State(), shape)

    def fetch(self, item):
        return item.rebuild(tuple(h.clone() for h in item.host))


class CopyingHooks(compress_saved_tensors):
    """The offloading pipeline with :class:`CopyingOffloader`, usable on the CPU."""

    def _can_offload(self, t, tensors):
        return all(x.is_contiguous() for x in tensors)

    def _new_offloader(self, device):
        return CopyingOffloader(device)


@pytest.mark.parametrize("name", ["gcn", "sage", "gcnii"])
def test_offloaded_layer_context_keeps_shared_and_derived_copies(name):
    # gnnact's ops share one packed copy per tensor (SAGE's two linear maps, GCNII's H0) and
    # rebuild BatchNorm -> ReLU -> dropout outputs from the pieces BatchNorm keeps, through
    # weak references. Offloaded, those pieces live on only in host memory: without
    # hold_parts() the next op found them gone and quantized afresh (other noise, more bytes),
    # which on an H100 moved the gradients by up to 0.03.
    from gnnact.data import synthetic_graph
    from gnnact.models import build

    data = synthetic_graph(600, 6, 32, 4, seed=0)
    torch.manual_seed(0)
    model = gnnact.convert(build(name, 32, 4, hidden=64), Config(bits=2))

    skip = [data.x, data.edge_index]
    plain = compress_saved_tensors(Config(bits=2), model=model, skip=skip)
    expected = layer_grads(model, data, plain)
    hooks = CopyingHooks(Config(bits=2, offload=True), model=model, skip=skip)
    assert torch.equal(layer_grads(model, data, hooks), expected)
    assert 0 < hooks.offloaded_bytes <= plain.passthrough_bytes


@pytest.mark.parametrize(("kwargs", "error", "match"), [
    ({"prefetch_depth": -1}, ValueError, "prefetch_depth"),
    ({"prefetch_depth": 1.5}, TypeError, "prefetch_depth"),
    ({"offload": 1}, TypeError, "offload")])
def test_bad_config(kwargs, error, match):
    with pytest.raises(error, match=match):
        Config(**kwargs)


@pytest.mark.cuda
@pytest.mark.parametrize("depth", [0, 1, 3])
def test_cuda_gradients_identical_with_and_without_offload(depth):
    torch.manual_seed(0)
    model = mlp().cuda()
    x, y = torch.randn(512, 256, device="cuda"), torch.randint(0, 10, (512,), device="cuda")
    expected = grads(model, x, y, pipeline(model, x))
    hooks = pipeline(model, x, offload=True, prefetch_depth=depth)
    assert torch.equal(grads(model, x, y, hooks), expected)
    assert hooks.offloaded_bytes == hooks.packed_bytes > 0  # (GELU: no ReLU masks)


@pytest.mark.cuda
def test_cuda_gnnact_layers_context_is_offloaded():
    from gnnact.data import synthetic_graph
    from gnnact.models import build

    data = synthetic_graph(2000, 8, 64, 5, seed=0).to("cuda")
    torch.manual_seed(0)
    model = gnnact.convert(build("gcn", 64, 5, hidden=128), Config(bits=2)).cuda()

    skip = [data.x, data.edge_index]
    plain = compress_saved_tensors(Config(bits=2), model=model, skip=skip)
    expected = layer_grads(model, data, plain)
    hooks = compress_saved_tensors(Config(bits=2, offload=True), model=model, skip=skip)
    # Not torch.equal: CUDA's scatter-add (GCN's aggregation and its backward) adds with
    # atomics, so two runs of the same path differ in the last bits (seen on an H100, ~1e-9).
    # A wrong host copy would be off by the 2-bit rounding step, orders of magnitude more.
    torch.testing.assert_close(layer_grads(model, data, hooks), expected, rtol=1e-5, atol=1e-7)
    assert hooks.offloaded_bytes > 0


@pytest.mark.cuda
def test_cuda_no_memory_growth_over_100_steps():
    torch.manual_seed(0)
    model = mlp().cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(1024, 256, device="cuda"), torch.randint(0, 10, (1024,), device="cuda")
    hooks = pipeline(model, x, offload=True)
    device, pinned = [], []
    for _ in range(100):
        optimizer.zero_grad()
        with hooks:
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        torch.cuda.synchronize()
        offloader = next(iter(hooks._offloaders.values()))
        device.append(torch.cuda.memory_allocated())
        pinned.append(offloader.pool.allocated_bytes)
    # No growth: later steps hold no more than the early ones (on an H100 the last step held
    # 1.7 MB less than the third) and the pinned pool stops at one pass's worth.
    assert max(device[10:]) <= max(device[:10])
    assert pinned[-1] == pinned[2] > 0


@pytest.mark.cuda
def test_cuda_stream_ordering_stress_is_deterministic():
    # Many small layers: copies out, copies in and compute interleave densely.
    torch.manual_seed(0)
    model = mlp(depth=48, width=64).cuda()
    x, y = torch.randn(4096, 64, device="cuda"), torch.randint(0, 10, (4096,), device="cuda")
    expected = grads(model, x, y, pipeline(model, x))
    for depth in (1, 4):
        hooks = pipeline(model, x, offload=True, prefetch_depth=depth)
        for _ in range(3):
            assert torch.equal(grads(model, x, y, hooks), expected)


# ---------------------------------------------------------------------- ordering, without a GPU


class _Log:
    def __init__(self):
        self.ops = []
        self.events = 0


class _Event:
    def __init__(self, log):
        self.log, self.id = log, log.events
        log.events += 1

    def record(self, stream):
        self.log.ops.append(("record", stream.name, self.id))

    def query(self):
        return True


class _Stream:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def wait_stream(self, other):
        self.log.ops.append(("wait_stream", self.name, other.name))

    def wait_event(self, event):
        self.log.ops.append(("wait_event", self.name, event.id))


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch.cuda's streams and events replaced by recorders, so that the Offloader's order of
    operations can be checked on the CPU (the copies themselves are synchronous there)."""
    import contextlib

    import gnnact.swap as swap

    log = _Log()
    names = iter(["copy_out", "copy_in"])
    compute = _Stream(log, "compute")
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: _Stream(log, next(names)))
    monkeypatch.setattr(torch.cuda, "Event", lambda: _Event(log))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.Tensor, "record_stream",
                        lambda t, s: log.ops.append(("record_stream", s.name, t.data_ptr())),
                        raising=False)
    monkeypatch.setattr(swap, "_pinned_empty", lambda n: torch.empty(n, dtype=torch.uint8))
    return log


def test_offloader_round_trip_prefetch_and_ordering(fake_cuda):
    import gc

    from gnnact.swap import Offloader

    log = fake_cuda
    offloader = Offloader(torch.device("cpu"), prefetch_depth=2)
    offloader.new_pass()
    originals = [torch.randn(100 + i, 8) for i in range(5)]
    items = [offloader.offload((t.clone(),), lambda parts: parts[0], t.shape)
             for t in originals]
    out_events = [i.state.last_event.id for i in items]
    # invariant 1: every copy-out waits for the compute stream first
    assert log.ops.count(("wait_stream", "copy_out", "compute")) == 5
    # backward reads in reverse: reading item 4 prefetches items 3 and 2
    assert torch.equal(offloader.fetch(items[4]), originals[4])
    assert items[3].restored is not None and items[2].restored is not None
    assert items[1].restored is None
    for k in (3, 2, 1, 0):
        assert torch.equal(offloader.fetch(items[k]), originals[k])
    for k, item in enumerate(items):
        # invariant 3: the copy-in of item k waited on its copy-out event
        assert ("wait_event", "copy_in", out_events[k]) in log.ops
        # invariant 4: the compute stream waited on its copy-in event before reading
        in_event = item.state.last_event.id
        assert ("wait_event", "compute", in_event) in log.ops
        assert log.ops.index(("record", "copy_in", in_event)) < log.ops.index(
            ("wait_event", "compute", in_event))
    # a second reader of the same item copies in again
    assert torch.equal(offloader.fetch(items[0]), originals[0])
    # invariant 5: dead items give their buffers back with their last event; a new pass
    # reuses them (no new pinned memory) after waiting on that event
    allocated = offloader.pool.allocated_bytes
    last = [item.state.last_event.id for item in items]
    del items, item
    gc.collect()
    assert offloader.pool.free_bytes == allocated
    offloader.new_pass()
    again = [offloader.offload((t.clone(),), lambda parts: parts[0], t.shape)
             for t in originals]
    assert offloader.pool.allocated_bytes == allocated
    assert all(("wait_event", "copy_out", e) in log.ops for e in last)
    assert torch.equal(offloader.fetch(again[2]), originals[2])
