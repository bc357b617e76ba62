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


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"prefetch_depth": -1}, "prefetch_depth"), ({"prefetch_depth": 1.5}, "prefetch_depth"),
    ({"offload": 1}, "offload")])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
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

    def run(hooks):
        model.zero_grad()
        torch.manual_seed(1)
        with hooks:
            loss = F.cross_entropy(model(data.x, data.edge_index), data.y)
        loss.backward()
        return torch.cat([p.grad.flatten() for p in model.parameters()])

    skip = [data.x, data.edge_index]
    expected = run(compress_saved_tensors(Config(bits=2), model=model, skip=skip))
    hooks = compress_saved_tensors(Config(bits=2, offload=True), model=model, skip=skip)
    assert torch.equal(run(hooks), expected)
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
    assert device[-1] == device[2] and pinned[-1] == pinned[2] > 0


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
