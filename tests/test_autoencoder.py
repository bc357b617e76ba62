"""Graph autoencoders: :func:`gnnact.ops.pair_dot` and :func:`gnnact.ops.pairs.log_sigmoid`
(exact forward, PyG's gradients at 32 bits, unbiased ones at 2, what they keep), and the twins
of ``InnerProductDecoder`` and ``GAE``/``VGAE`` that :func:`gnnact.convert` makes."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn
from torch_geometric import seed_everything
from torch_geometric.nn import GAE, VGAE, GCNConv
from torch_geometric.nn.models.autoencoder import EPS
from torch_geometric.utils import negative_sampling

import gnnact
from gnnact.memory import saved_bytes
from gnnact.nn.scope import scope_of
from gnnact.ops.pairs import log_sigmoid, pair_dot

N, D, E = 200, 16, 1500


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(N, D, generator=gen, dtype=torch.float64)
    return (z, torch.randint(0, N, (2, E), generator=gen),
            torch.randint(0, N, (2, E), generator=gen))


def _pyg_scores(z: torch.Tensor, pairs: torch.Tensor) -> torch.Tensor:
    return (z[pairs[0]] * z[pairs[1]]).sum(dim=1)


def test_pair_dot_is_pygs_at_32_bits() -> None:
    z, pos, neg = _data()
    z.requires_grad_()
    scores = pair_dot(z, [pos, neg], gnnact.Config(bits=32))
    expected = [_pyg_scores(z, pos), _pyg_scores(z, neg)]
    for got, want in zip(scores, expected, strict=True):
        assert torch.equal(got, want)
    g = [torch.randn(E, dtype=torch.float64) for _ in range(2)]
    torch.testing.assert_close(torch.autograd.grad(scores, z, g),
                               torch.autograd.grad(expected, z, g))


def test_pair_dot_keeps_z_once_and_its_gradient_is_unbiased() -> None:
    z, pos, neg = _data()
    z = z.float().requires_grad_()
    expected = torch.autograd.grad([_pyg_scores(z, pos).sum(), 2 * _pyg_scores(z, neg).sum()],
                                   z)[0]
    config = gnnact.Config(bits=2)
    scores = pair_dot(z, [pos, neg], config)
    # z at 2 bits, once for both sets; the pairs are the caller's (excluded). PyG: four
    # [E, D] float32 operands.
    packed = gnnact.quantize(z.detach(), 2, config.group_size)
    assert saved_bytes(scores, exclude=[pos, neg]) == packed.nbytes < N * D // 4 + 200
    grads = []
    for _ in range(400):
        v_pos, v_neg = pair_dot(z, [pos, neg], config)
        grads.append(torch.autograd.grad([v_pos.sum(), 2 * v_neg.sum()], z)[0])
    grads = torch.stack(grads)
    # Each entry's mean within 5 standard errors of PyG's (a few of 3,200 may stray to 4).
    error = (grads.mean(0) - expected).abs() / (grads.std(0) / 20 + 1e-6)
    assert error.max() < 5.5


def test_log_sigmoid_is_pygs_loss_term_keeping_one_value() -> None:
    w = torch.randn(3000, dtype=torch.float64, requires_grad=True)
    for complement in (False, True):
        v = w.sinh()  # (sinh keeps its input w, a leaf: nothing counted beside what we keep)
        got = log_sigmoid(v, EPS, complement)
        s = torch.sigmoid(w.sinh())
        want = torch.log((1 - s if complement else s) + EPS)
        assert torch.equal(got, want)
        assert saved_bytes(got.sum()) == 3000 * 8  # v (PyG: s and s + eps)
        torch.testing.assert_close(torch.autograd.grad(got.sum(), w),
                                   torch.autograd.grad(want.sum(), w))


class _Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = GCNConv(8, 32), GCNConv(32, D)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def _graph(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, 8, generator=gen), torch.randint(0, N, (2, E), generator=gen)


@pytest.mark.parametrize("bits", [32, None])
def test_converted_gae_computes_pygs_loss_and_keeps_less(bits: int | None) -> None:
    """The same loss bit for bit (the same scores, terms and negative samples); at 32 bits
    PyG's gradients too (the decoder and the loss run PyG's own code; the GCN twins sum in
    another order), by default what the twins keep."""
    torch.manual_seed(0)
    ref = GAE(_Encoder())
    model = gnnact.convert(copy.deepcopy(ref), gnnact.Config(bits=bits))
    assert type(model.decoder) is gnnact.nn.InnerProductDecoder
    x, edge_index = _graph()
    losses, kept, grads = [], [], []
    for net in (ref, model):
        seed_everything(1)  # the same negative samples (drawn with Python's random too)
        z = net.encode(x, edge_index)
        loss = net.recon_loss(z, edge_index)
        losses.append(loss)
        kept.append(saved_bytes(loss, exclude=[x, edge_index]))
        loss.backward()
        grads.append([p.grad for p in net.parameters()])
    assert torch.equal(losses[0], losses[1])
    if bits == 32:
        for got, want in zip(grads[1], grads[0], strict=True):
            torch.testing.assert_close(got, want)
    else:
        assert kept[1] < kept[0] / 5


@pytest.mark.parametrize(("min_bytes", "small"), [
    (0, ()),  # both compressed
    (20_000, ("decoder",)),  # the encoder's 25.6 kB conv2 input over the floor, z under it
    (1 << 20, ("encoder", "decoder"))])
def test_a_step_through_encode_and_decoder_is_counted_whole(min_bytes: int,
                                                            small: tuple[str, ...]) -> None:
    # GAE's recipe calls encode, then recon_loss (its decoder): two passes a step, which
    # the scope's record and gnnact.summary count together until backward reaches them
    # (the last pass alone was reported: the decoder's, "0 B, ran as PyTorch's", where the
    # encoder had compressed its layers).
    torch.manual_seed(0)
    model = gnnact.convert(GAE(_Encoder()), gnnact.Config(bits=2, min_bytes=min_bytes))
    x, edge_index = _graph()
    scope = scope_of(model)
    for step in range(3):
        z = model.encode(x, edge_index)
        encoder = scope.last
        loss = model.recon_loss(z, edge_index)
        record = scope.last
        assert (encoder.passes, record.passes) == (1, 2)
        # (under the floor the decoder keeps z as it is: its input, not counted again)
        assert record.context >= encoder.context > 0
        for path, nbytes in encoder.bytes_by_module.items():
            assert record.bytes_by_module[path] >= nbytes
        # From the second step the passes whose tensors were all under the floor run as
        # PyTorch's, each on its own, counted under its module.
        assert record.pytorch_paths == (small if step else ())
        assert record.as_pytorch == (step > 0 and len(small) == 2)
        loss.backward()
    report = gnnact.summary(model)
    assert (report.context, report.passes) == (record.context, 2)
    assert "the last step made 2 forward passes" in str(report)
    handling = {path: {r.handling for r in report.rows if r.path.startswith(path)}
                for path in ("encoder", "decoder")}
    for path, kinds in handling.items():
        assert (kinds == {"pytorch"}) if path in small else ("pytorch" not in kinds)
    # A grad-mode forward that is never run backward ends its step when its output goes:
    # the next pass starts a step of its own.
    model.encode(x, edge_index)
    model.encode(x, edge_index)
    assert scope.last.passes == 1


def test_a_model_called_twice_before_backward_counts_both_calls() -> None:
    # A siamese step: two calls of the same model, one loss.
    torch.manual_seed(0)
    model = gnnact.convert(_Encoder(), gnnact.Config(bits=2, min_bytes=0))
    x, edge_index = _graph()
    scope = scope_of(model)
    for _ in range(2):
        one = model(x, edge_index)
        first = scope.last
        two = model(x.flip(0), edge_index)
        assert (first.passes, scope.last.passes) == (1, 2)
        assert scope.last.context == 2 * first.context > 0
        (one - two).square().sum().backward()
    assert "the last step made 2 forward passes before its backward" in str(
        gnnact.summary(model))


class _VariationalEncoder(_Encoder):
    def __init__(self) -> None:
        super().__init__()
        self.conv_logstd = GCNConv(32, D)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.conv1(x, edge_index).relu()
        return self.conv2(h, edge_index), self.conv_logstd(h, edge_index)


def test_converted_vgae_survives_copies_and_trains() -> None:
    torch.manual_seed(0)
    model = gnnact.convert(VGAE(_VariationalEncoder()))
    # (Before training: PyG's VGAE keeps the last mu and logstd, which deepcopy refuses.)
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert type(copied) is gnnact.nn.VGAE
        assert type(copied.decoder) is gnnact.nn.InnerProductDecoder
        assert scope_of(copied) is not None
    x, edge_index = _graph()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        z = model.encode(x, edge_index)
        neg = negative_sampling(edge_index, N)
        loss = model.recon_loss(z, edge_index, neg) + model.kl_loss() / N
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert losses[-1] < losses[0]
