"""Where the rounding noise's seeds come from: compression draws nothing from PyTorch's
generators, so a compressed run draws the dropout masks (and every other random number) that
the uncompressed run draws under the same ``torch.manual_seed``, and differs from it by the
rounding alone; runs stay reproducible, and every pass rounds with fresh noise."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch_geometric.nn import GATConv, GCNConv, GraphConv, SAGEConv

import gnnact
from gnnact.ops.draws import keep_bits, keep_mask
from gnnact.quant import unpack_mask
from gnnact.quant.rng import PassSeeds


class PyGStyle(nn.Module):
    """Written as PyG's examples write models: functional dropout and activations, a conv
    with attention dropout, and one without a twin (GraphConv: the generic pipeline)."""

    def __init__(self, f_in: int = 16, hidden: int = 32, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = GCNConv(f_in, hidden)
        self.bn = nn.BatchNorm1d(hidden)
        self.conv2 = SAGEConv(hidden, hidden)
        self.conv3 = GraphConv(hidden, hidden)
        self.conv4 = GATConv(hidden, classes, heads=2, concat=False, dropout=0.3)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.bn(self.conv1(x, edge_index)))
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.elu(self.conv2(x, edge_index))
        x = self.conv3(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv4(x, edge_index)


def _graph(n: int = 400, f_in: int = 16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, f_in, generator=g), torch.randint(0, n, (2, 8 * n), generator=g),
            torch.randint(0, 4, (n,), generator=g))


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(u, v) for u, v in zip(a, b, strict=True))


def _generator_states(device: str) -> torch.Tensor:
    """The default CPU generator's state, and the device's (where its dropout draws)."""
    states = [torch.get_rng_state()]
    if device == "cuda":
        states.append(torch.cuda.get_rng_state())
    return torch.cat(states)


def _train(model: nn.Module, steps: int, seed: int = 1,
           device: str = "cpu") -> tuple[list, list, list]:
    """``steps`` full-batch Adam steps after ``torch.manual_seed(seed)``: the outputs, the
    default generators' states after each step, and the last gradients."""
    x, edge_index, y = (t.to(device) for t in _graph())
    model = model.to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    torch.manual_seed(seed)
    outs, states = [], []
    for _ in range(steps):
        optimizer.zero_grad()
        out = model(x, edge_index)
        F.cross_entropy(out, y).backward()
        optimizer.step()
        outs.append(out.detach())
        states.append(_generator_states(device))
    return outs, states, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("config", [gnnact.Config(bits=2), gnnact.Config(bits=4),
                                    gnnact.Config(bits=2, per_node=True)],
                         ids=["2 bits", "4 bits", "per-node"])
def test_compressed_run_draws_the_uncompressed_runs_masks(config, device):
    torch.manual_seed(0)
    base = PyGStyle()
    pyg_outs, pyg_states, _ = _train(copy.deepcopy(base), 3, device=device)
    model = gnnact.convert(copy.deepcopy(base), config)
    outs, states, _ = _train(model, 3, device=device)
    # The generators are where PyG's run leaves them after every step: the same draws, in
    # order (on a GPU, the CPU one is not touched at all).
    assert _same(states, pyg_states)
    # The first forward (same weights, same masks) is PyG's; the rounding only reaches the
    # gradients, and through them the later steps.
    assert torch.allclose(outs[0], pyg_outs[0], atol=1e-5)
    assert not torch.allclose(outs[2], pyg_outs[2], atol=1e-5)


def test_compressed_runs_are_reproducible_and_every_pass_rounds_afresh():
    torch.manual_seed(0)
    base = PyGStyle()
    *_, grads_a = _train(gnnact.convert(copy.deepcopy(base), gnnact.Config(bits=2)), 2)
    *_, grads_b = _train(gnnact.convert(copy.deepcopy(base), gnnact.Config(bits=2)), 2)
    assert _same(grads_a, grads_b)
    # Another seed: other masks, other noise.
    *_, grads_c = _train(gnnact.convert(copy.deepcopy(base), gnnact.Config(bits=2)), 2,
                         seed=2)
    assert not _same(grads_a, grads_c)


def _gradients(model: nn.Module, x: torch.Tensor, edge_index: torch.Tensor) -> list:
    model.zero_grad()
    model(x, edge_index).square().sum().backward()
    return [p.grad.clone() for p in model.parameters()]


def test_passes_without_random_draws_round_with_different_noise():
    """No dropout anywhere: the default generator does not move between passes, and the pass
    count keeps the noise fresh (the same input and weights, different gradients), while a
    fresh copy under the same seed rounds as the first did."""

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = GCNConv(16, 64), GCNConv(64, 4)

        def forward(self, x, edge_index):
            return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

    x, edge_index, _ = _graph()
    torch.manual_seed(0)
    base = Plain()
    model = gnnact.convert(copy.deepcopy(base), gnnact.Config(bits=2))
    state = torch.get_rng_state()
    first, second = _gradients(model, x, edge_index), _gradients(model, x, edge_index)
    assert torch.equal(torch.get_rng_state(), state)  # nothing drawn
    # (conv2's weight: its gradient reads the rounded input.)
    assert not _same(first, second)
    again = gnnact.convert(copy.deepcopy(base), gnnact.Config(bits=2))
    assert _same(first, _gradients(again, x, edge_index))


def test_compress_saved_tensors_draws_nothing_from_the_default_generator():
    def run(hooks_for) -> tuple[torch.Tensor, list]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Dropout(0.3),
                              nn.Linear(256, 256), nn.GELU(), nn.Dropout(0.3),
                              nn.Linear(256, 8))
        x = torch.randn(256, 64)
        torch.manual_seed(5)
        hooks = hooks_for(model, x)
        with hooks:
            loss = model(x).square().mean()
        loss.backward()
        return torch.get_rng_state(), [p.grad for p in model.parameters()]

    plain_state, plain_grads = run(lambda model, x: contextlib.nullcontext())
    state, grads = run(lambda model, x: gnnact.compress_saved_tensors(
        gnnact.Config(bits=2), model=model, skip=[x]))
    assert torch.equal(state, plain_state)
    assert not torch.equal(grads[0], plain_grads[0])  # (compressed: rounded context)
    # A generator given by the caller is the one the seeds come from.
    generator = torch.Generator().manual_seed(3)
    before = generator.get_state()
    state, _ = run(lambda model, x: gnnact.compress_saved_tensors(
        gnnact.Config(bits=2), model=model, skip=[x], generator=generator))
    assert torch.equal(state, plain_state)
    assert not torch.equal(generator.get_state(), before)


def test_pass_seeds_read_the_default_generator_without_advancing_it():
    torch.manual_seed(7)
    seeds = PassSeeds()
    state = torch.get_rng_state()
    first = [seeds.next_seed() for _ in range(3)]
    assert torch.equal(torch.get_rng_state(), state)
    assert len(set(first)) == 3 and all(0 <= s < 2**63 for s in first)
    torch.manual_seed(7)
    assert PassSeeds().next_seed() == first[0]
    torch.rand(1)  # the generator moved: a pass from the new state
    moved = PassSeeds().next_seed()
    assert moved not in first
    # A generator per pass, seeded with that pass's seed.
    torch.manual_seed(7)
    a, b = PassSeeds().generator(), torch.Generator().manual_seed(first[0])
    assert torch.equal(torch.rand(4, generator=a), torch.rand(4, generator=b))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1000, 37), (7,), (3, 5, 11)])
def test_keep_mask_is_the_mask_f_dropout_draws(device, dtype, shape):
    like = torch.ones(shape, dtype=dtype, device=device)
    torch.manual_seed(3)
    mask = keep_mask(like, 0.3)
    after = _generator_states(device)
    torch.manual_seed(3)
    want = F.dropout(like, 0.3) != 0
    assert mask.dtype == torch.bool and torch.equal(mask, want)
    assert torch.equal(after, _generator_states(device))
    torch.manual_seed(3)
    assert torch.equal(keep_mask(like, 0.3, dtype), want.to(dtype))
    with pytest.raises(ValueError, match="p must be in"):
        keep_mask(like, 1.0)



@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("shape", [(169343, 256), (1 << 22,), (1000, 37), (1024,), (333, 4),
                                   (3, 5, 11), (7,)])
@pytest.mark.parametrize("p", [0.5, 0.1, 0.77])
def test_keep_bits_are_the_mask_f_dropout_draws_and_move_the_generator_alike(device, shape, p):
    """keep_bits: F.dropout's mask, packed, with the generator left where F.dropout leaves it
    (the next draw is the same). On a GPU a float32 tensor of a multiple of 4 values is drawn
    straight into bits (the sizes above and below the launch's grid cap); the others, and a
    view that is not 16-byte aligned, through native_dropout. On the CPU, from 1,024 values,
    by the compiled kernel (where it builds), below by bernoulli_."""
    if device == "cpu" and shape[0] > 1 << 22:
        shape = (1 << 20, 3)  # (F.dropout's own draws, the reference, take seconds)
    flat = torch.ones(torch.Size(shape).numel() + 4, device=device)
    views = [flat[:-4].view(shape), flat[1:-3].view(shape)]  # aligned, 4 bytes in
    if len(shape) == 2:  # F.dropout draws in the order of its input's memory
        views.append(flat[:-4].view(shape[::-1]).t())
    for like in views:
        torch.manual_seed(3)
        bits = keep_bits(like, p)
        after = torch.rand(5, device=device)
        torch.manual_seed(3)
        want = F.dropout(like, p) != 0
        assert bits.shape == like.shape
        assert torch.equal(unpack_mask(bits), want)
        assert torch.equal(after, torch.rand(5, device=device))


@pytest.mark.cuda
def test_keep_bits_draw_on_a_gpu_without_full_size_transients():
    """On the GPU the draws are computed (fused_draws_agree found the kernel equal to
    native_dropout there): a layer's dropout holds n / 8 bytes more, not 5n."""
    from gnnact.ops.draws import fused_draws_agree

    assert fused_draws_agree(torch.cuda.current_device())
    x = torch.ones(169343, 256, device="cuda")
    keep_bits(x, 0.5)  # the kernel built and the check made before the count
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    bits = keep_bits(x, 0.5)
    grown = torch.cuda.max_memory_allocated() - base
    assert bits.nbytes == x.numel() // 8
    assert grown <= x.numel() // 8 + (1 << 20), grown
