"""Automatic precision (``gnnact.convert(model)`` with the default ``Config()``): the noise
probes (:mod:`gnnact.ops.probe`), the allocation and self-check
(:mod:`gnnact.adaptive.auto`), what :func:`gnnact.summary` says of them, and converted models
that keep all of it through ``copy.deepcopy`` and pickling."""

from __future__ import annotations

import copy
import gc
import math
import pickle
import statistics
import threading
import warnings
import weakref

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import gnnact
from gnnact.adaptive import AutoPrecision, allocate, variance_factor
from gnnact.adaptive.auto import AUTO_WIDTHS
from gnnact.memory import saved_bytes
from gnnact.nn.scope import scope_of
from gnnact.ops.probe import NoiseProbe, noise_ratio, probing


class Branches(nn.Module):
    """A shared embedding read by two linear maps. ``plain`` fits a target that depends on its
    input, so its weight gradient adds up over rows. ``spiky`` reads the same values with one
    in 256 multiplied by 30: each group's range is the spikes', so 2-bit rounding of the
    ordinary values is far coarser than they are, and its gradient is one its input does not
    explain; rounding noise then dominates that weight's gradient."""

    def __init__(self, plain_rows: int = 8) -> None:
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.plain = nn.Linear(64, 8)
        self.spiky = nn.Linear(64, 8)
        self.plain_rows = plain_rows
        spikes = torch.zeros(64 * 512)
        spikes[::256] = 29.0
        self.register_buffer("spikes", spikes.view(512, 64))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.embed(x))
        wide = h.repeat(self.plain_rows, 1)  # the plain branch's input, plain_rows times larger
        return self.plain(wide * 1.0), self.spiky(h[:512] * (1 + self.spikes))


def _train(model: nn.Module, steps: int, seed: int = 0) -> list[dict[str, int]]:
    """Train ``model`` for ``steps``; the scope's widths before each step."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1024, 32, generator=g)
    target = torch.randn(1024 * model.plain_rows, 8, generator=g)
    push = torch.randn(512, 8, generator=g)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scope = scope_of(model)
    seen = []
    for _ in range(steps):
        seen.append(_widths(model))
        a, b = model(x)
        loss = F.mse_loss(a, target) + (b * push).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert scope is not None
    return seen


def _widths(model: nn.Module) -> dict[str, int]:
    out = {name: m.config.width for name, m in model.named_modules()
           if isinstance(m, gnnact.nn.Linear)}
    out.update(scope_of(model).bits)
    return out


# ------------------------------------------------------------------ the probe


def test_noise_ratio_pools_outputs_and_subtracts_the_control() -> None:
    g = (torch.ones(4), torch.ones(2))
    # Only the first output moves: its variance (half the squared difference) over its square.
    assert noise_ratio(g, (torch.ones(4) + 0.5, torch.ones(2))) == pytest.approx(0.5 / 3.5)
    # A control run that moves as much: no rounding noise at all.
    moved = (torch.ones(4) + 0.5, torch.ones(2))
    assert noise_ratio(g, moved, moved) == 0.0
    assert noise_ratio(g, g) == 0.0  # exact rounding
    assert noise_ratio((None,), (torch.ones(1),)) is None
    assert noise_ratio((torch.ones(1),), (torch.ones(1) + 2,)) == math.inf


def test_probe_measures_what_a_broadcast_operand_gets() -> None:
    # messages * alpha.view(-1, H, 1): the messages' rounding reaches alpha's gradient, which
    # the node, run directly, returns in the messages' shape and the engine sums to alpha's.
    # It is measured in alpha's shape (it was skipped, 0, for the shapes' mismatch).
    class Weigh(nn.Module):
        def forward(self, messages: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
            return (messages * 1.0) * alpha.view(-1, 2, 1)

    torch.manual_seed(0)
    messages = torch.randn(4000, 2, 16, requires_grad=True)
    alpha = torch.rand(4000, 2, requires_grad=True)
    probe = NoiseProbe(0)
    model = Weigh()
    with probing(probe), gnnact.compress_saved_tensors(gnnact.Config(bits=2), model=model):
        out = model(messages, alpha)
    probe.collect(out)
    probe.arm()
    out.backward(torch.randn_like(out))
    # Two bits of a normal's range: noise as large as a good part of the gradient it feeds.
    assert max(probe.ratios.values()) > 0.05
    # (Summed to the engine's shape: 1.5 against 1 per row, half the square a variance.)
    assert noise_ratio((torch.ones(2, 1),), (torch.full((2, 3), 0.5),)) == pytest.approx(1 / 7)


def test_probe_measures_the_variance_rounding_adds_to_a_weight_gradient() -> None:
    # y = x W^T: the rounding noise e of x reaches grad W = g^T x_hat as g^T e, whose variance
    # is sum_n ||g_n||^2 sum_j Var[e_nj], with Var[e_nj] = p (1 - p) s^2 for a value p of the
    # way between two levels s apart. The probe's estimate, averaged over passes, matches.
    torch.manual_seed(0)
    lin = gnnact.nn.Linear(64, 16, config=gnnact.Config(bits=2, group_size=64))
    x = torch.randn(256, 64, requires_grad=True)
    g = torch.randn(256, 16)
    packed = gnnact.quantize(x.detach(), 2, group_size=64)
    step = packed.scales.view(-1, 1)
    u = (x.detach().view(-1, 64) - packed.zeros.view(-1, 1)) / step
    frac = u - u.floor()
    var = (frac * (1 - frac) * step**2).view(256, 64)
    expected_var = float((g.pow(2).sum(1, keepdim=True) * var).sum())
    signal = float((g.t() @ x.detach()).pow(2).sum())
    ratios = []
    for seed in range(300):
        probe = NoiseProbe(seed)
        with probing(probe):
            y = lin(x * 1.0)
        probe.collect(y)
        probe.arm()
        y.backward(g)
        ratios.append(probe.ratios["<model>:activations"])
    # ratio = v / (||g_W||^2 - v) with ||g_W||^2 = signal + v on average.
    measured = statistics.fmean(ratios)
    assert measured == pytest.approx(expected_var / signal, rel=0.1)


class Checkpointed(nn.Module):
    """A block under reentrant checkpointing (PyG's DeepGCNLayer's way): its backward runs a
    backward of its own, into the block's parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(32, 32)
        self.inner = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64))
        self.head = nn.Linear(64, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.embed(x))  # (the block's input needs a gradient: it is checkpointed)
        h = torch.utils.checkpoint.checkpoint(self.inner, h, use_reentrant=True)
        return self.head(torch.tanh(h))


def test_a_child_recomputed_in_backward_is_no_step() -> None:
    # Reentrant checkpointing calls the block (a child of the model) again inside backward:
    # that call is no training step of the model.
    model = gnnact.convert(Checkpointed())
    x = torch.randn(256, 32)
    for _ in range(3):
        model(x).sum().backward()
    assert scope_of(model).auto.steps == 3


@pytest.mark.parametrize("make", [Branches, Checkpointed])
def test_a_probe_step_computes_the_step_s_own_gradients(make) -> None:
    # The second runs only measure: a probe step's gradients are bit for bit those of the same
    # step unprobed (same widths, same rounding), checkpointed blocks included (a node whose
    # backward runs a backward of its own is not run twice: it would add to .grad again).
    torch.manual_seed(0)
    model = make()
    grads = []
    for config in (gnnact.Config(), gnnact.Config(bits=2, self_check=False)):
        torch.manual_seed(1)
        other = gnnact.convert(copy.deepcopy(model), config)
        x = torch.randn(512, 32, requires_grad=True)
        for _ in range(2):  # step 1 probes in the automatic model; widths still the start
            other.zero_grad()
            out = other(x)
            sum(o.sum() for o in out).backward() if isinstance(out, tuple) else (
                out.sum().backward())
        grads.append([p.grad.clone() for p in other.parameters()])
    assert scope_of(other).auto is None
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


def test_a_probe_keeps_no_graph_alive() -> None:
    # A probe pass whose backward never comes (a loss computed and dropped) frees its graph
    # as any other pass does: the hooks hold the probe weakly and find their node as the one
    # autograd runs, so no reference cycle holds the graph until the garbage collector runs.
    model = gnnact.convert(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 8)))
    x = torch.randn(4096, 32)
    model(x).sum().backward()  # step 0
    gc.disable()
    try:
        out = model(x)  # step 1: a probe
        assert scope_of(model).auto._pending is not None
        node = weakref.ref(out.grad_fn)
        del out
        assert node() is None
    finally:
        gc.enable()


# ------------------------------------------------------------------ allocation


def test_allocate_floors_are_requirements() -> None:
    assert allocate([1.0, 5.0], [100, 100], 3, (2, 3, 4), floors=[4, 2]) == [4, 2]
    assert allocate([1.0, 5.0], [100, 100], 4, (2, 3, 4), floors=[3, 2]) == [4, 4]
    with pytest.raises(ValueError, match="floors must give one of"):
        allocate([1.0], [10], 2, (2, 4), floors=[3])


def test_sensitive_tensor_gets_more_bits_and_the_budget_holds() -> None:
    torch.manual_seed(0)
    model = gnnact.convert(Branches(plain_rows=8))
    _train(model, 6)
    auto = scope_of(model).auto
    spiky, plain = auto.tensors["spiky:activations"], auto.tensors["plain:activations"]
    assert spiky.bits > plain.bits >= AUTO_WIDTHS[0]
    assert spiky.ratio_at(2) > auto.max_noise >= spiky.ratio  # it needed them, and has them
    assert spiky.bits >= auto._floor(spiky) > 2
    free = [t for t in auto.tensors.values() if not t.fixed]
    average = sum(t.bits * t.numel for t in free) / sum(t.numel for t in free)
    assert not auto.over_budget and average <= auto.avg_bits
    # The scope carries the widths by name, twins' included (their config stays automatic),
    # and the passes quantize at them: the last probe measured the spiky input at its raised
    # width.
    assert scope_of(model).bits["spiky:activations"] == spiky.bits
    assert model.spiky.config.bits is None and spiky.measured_bits > 2


def test_floors_above_the_budget_win_and_say_so() -> None:
    torch.manual_seed(0)
    # The spiky tensor is half the values, its floor far above a 2.5-bit average.
    model = gnnact.convert(Branches(plain_rows=1), gnnact.Config(avg_bits=2.5))
    _train(model, 6)
    auto = scope_of(model).auto
    assert auto.over_budget and auto.tensors["spiky:activations"].bits >= 4
    assert "bits per value on average" in str(gnnact.summary(model))


def test_widths_change_only_after_probe_steps() -> None:
    torch.manual_seed(0)
    model = gnnact.convert(Branches(), gnnact.Config(adapt_interval=4))
    seen = _train(model, 14)
    probes = scope_of(model).auto.schedule(14)
    assert probes == [1, 2, 4, 8, 12]
    changed = [step for step in range(1, 14) if seen[step] != seen[step - 1]]
    assert changed and all(step - 1 in probes for step in changed)
    assert seen[0] == seen[1]  # step 0 runs at the start widths, and probes nothing


def test_fixed_width_is_checked_not_changed() -> None:
    torch.manual_seed(0)
    model = gnnact.convert(Branches(), gnnact.Config(bits=2))
    assert scope_of(model).auto.schedule(250) == [10, 110, 210]
    with pytest.warns(RuntimeWarning, match=r"spiky:activations at 2 bits .* Raise Config\.bits"):
        seen = _train(model, 12)
    assert all(w == seen[0] for w in seen) and model.spiky.config.bits == 2
    assert "needs more bits" in scope_of(model).auto.tensors["spiky:activations"].reason
    quiet = gnnact.convert(Branches(), gnnact.Config(bits=2, self_check=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _train(quiet, 12)
    assert scope_of(quiet).auto is None


def test_exact_and_start_widths() -> None:
    assert scope_of(gnnact.convert(Branches(), gnnact.Config(bits=32))).auto is None
    model = gnnact.convert(Branches())
    assert model.spiky.config.width == 2 and model.spiky.config.bits is None
    seen = _train(model, 1)  # one step: no probe yet, the start widths
    assert set(seen[0].values()) == {2}


def test_summary_lists_widths_ratios_and_reasons() -> None:
    torch.manual_seed(0)
    model = gnnact.convert(Branches())
    _train(model, 3)
    summary = gnnact.summary(model)
    rows = {t.name: t for t in summary.tensors}
    assert {"plain:activations", "spiky:activations"} <= set(rows)
    assert rows["spiky:activations"].ratio is not None
    text = str(summary)
    assert "noise" in text and rows["spiky:activations"].reason in text
    assert "bits per value on average" in text


def test_two_threads_share_nothing() -> None:
    # Two models trained at once in two threads end where each ends trained alone.
    def models() -> dict[int, nn.Module]:
        out = {}
        for key in (0, 1):
            torch.manual_seed(key)
            out[key] = gnnact.convert(Branches())
        return out

    def run(model: nn.Module, out: dict, key: int) -> None:
        _train(model, 5, seed=key)
        out[key] = (_widths(model), [p.detach().clone() for p in model.parameters()])

    alone: dict = {}
    for key, model in models().items():
        run(model, alone, key)
    together: dict = {}
    threads = [threading.Thread(target=run, args=(model, together, key))
               for key, model in models().items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key in (0, 1):
        assert together[key][0] == alone[key][0]
        for a, b in zip(together[key][1], alone[key][1], strict=True):
            assert torch.equal(a, b)


def test_variance_scales_with_the_width() -> None:
    # The floor rule rests on r(b) = r(b') S(b) / S(b'): check it against two probes.
    t = gnnact.adaptive.TensorWidth("a:0", 10, 4, measured=0.9, measured_bits=2)
    assert t.ratio == pytest.approx(0.9 * variance_factor(4) / variance_factor(2))
    auto = AutoPrecision(gnnact.Config(max_noise=0.25))
    assert auto._floor(t) == 3  # 0.9 * 9 / 49 = 0.165


def test_a_sigmoid_head_stays_exact_and_tanh_keeps_eight_bits() -> None:
    # Backward reads their outputs nonlinearly: a sigmoid ending a model (GAE's decoder, whose
    # loss takes its log) is the loss head, kept exact; a tanh's output keeps the attention
    # coefficients' width.
    class Heads(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = nn.Linear(32, 64)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            h = self.lin(x)
            return torch.sigmoid(h * 2.0), torch.tanh(h * 3.0)

    model = gnnact.convert(Heads(), gnnact.Config(bits=2))
    a, b = model(torch.randn(512, 32))
    (a.log().sum() + b.sum()).backward()
    saved = {entry.kind: entry.bits for entry in scope_of(model).last.tensors.values()}
    assert saved == {"exact": None, "quantize": 8}


# ------------------------------------------------------------------ copies


class Plain(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.seq(x)


class Functional(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(32, 128)
        self.b = nn.Linear(128, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(F.dropout(F.gelu(self.a(x)), 0.5, self.training))


def _hetero():
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import SAGEConv, to_hetero

    class GNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = SAGEConv((-1, -1), 64)
            self.conv2 = SAGEConv((-1, -1), 8)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["paper"].x = torch.randn(600, 32, generator=g)
    data["author"].x = torch.randn(300, 32, generator=g)
    writes = torch.stack([torch.randint(0, 300, (2000,), generator=g),
                          torch.randint(0, 600, (2000,), generator=g)])
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev", "author"].edge_index = writes.flip(0)
    model = to_hetero(GNN(), data.metadata(), aggr="sum")
    with torch.no_grad():
        model(data.x_dict, data.edge_index_dict)
    inputs = (data.x_dict, data.edge_index_dict)
    return model, inputs, [*data.x_dict.values(), *data.edge_index_dict.values()]


def _loss(model: nn.Module, inputs: tuple) -> torch.Tensor:
    out = model(*inputs)
    return sum(o.sum() for o in out.values()) if isinstance(out, dict) else out.sum()


@pytest.mark.parametrize("kind", ["plain", "functional", "to_hetero"])
def test_copies_keep_their_compression(kind: str) -> None:
    torch.manual_seed(0)
    if kind == "to_hetero":
        model, inputs, data = _hetero()
    else:
        model = Plain() if kind == "plain" else Functional()
        inputs = (torch.randn(2048, 32),)
        data = list(inputs)
    reference = copy.deepcopy(model)
    gnnact.convert(model)
    for _ in range(3):  # a probe step has set widths
        _loss(model, inputs).backward()
    kept = saved_bytes(_loss(model, inputs), exclude=data)
    fp32 = saved_bytes(_loss(reference, inputs), exclude=data)
    assert kept < fp32 / 4
    for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        assert scope_of(other) is not None and scope_of(other) is not scope_of(model)
        assert scope_of(other).auto.widths == scope_of(model).auto.widths
        assert saved_bytes(_loss(other, inputs), exclude=data) == kept
        # The copy's passes are its own: training it leaves the original's scope alone.
        steps = scope_of(model).auto.steps
        _loss(other, inputs).backward()
        assert scope_of(model).auto.steps == steps


def test_a_tensor_two_twins_read_is_kept_once_whatever_their_widths() -> None:
    # to_hetero's conv2.author__writes__paper and conv2.paper__rev__author both read the
    # paper and the author features: one copy, at the first reader's width (a probe re-runs
    # both readers on it), not a second at the other's.
    model, inputs, data = _hetero()
    gnnact.convert(model)
    scope = scope_of(model)
    scope.auto._next_probe = 10**9  # no probe step: the widths set below stay
    kept = {}
    for first, second in [(4, 4), (2, 2), (4, 2)]:
        scope.set_widths({"conv2.author__writes__paper:activations": first,
                          "conv2.paper__rev__author:activations": second})
        kept[first, second] = saved_bytes(_loss(model, inputs), exclude=data)
    assert kept[2, 2] < kept[4, 4]
    assert kept[4, 2] in (kept[4, 4], kept[2, 2])


def test_a_model_used_through_its_methods_is_compressed() -> None:
    # GAE calls its encoder and decoder, never its own forward: each call is a pass.
    from torch_geometric.nn import GAE, GCNConv

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = GCNConv(32, 64), GCNConv(64, 16)

        def forward(self, x, edge_index):
            return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)

    g = torch.Generator().manual_seed(0)
    x, edge_index = torch.randn(500, 32, generator=g), torch.randint(0, 500, (2, 4000),
                                                                      generator=g)
    torch.manual_seed(0)
    reference = GAE(Encoder())
    model = gnnact.convert(copy.deepcopy(reference))

    def loss(m: nn.Module) -> torch.Tensor:
        return m.recon_loss(m.encode(x, edge_index), edge_index)

    fp32 = saved_bytes(loss(reference), exclude=[x, edge_index])
    assert saved_bytes(loss(model), exclude=[x, edge_index]) < fp32 / 3
    # The encoder's call and the decoder's (the twin's recon_loss scores the positive and the
    # negative pairs in one call).
    assert scope_of(model).auto.steps == 2
    # A probe joins every pass until its backward: probes that begin at a decoder's pass and
    # at an encoder's both come, and the encoder's tensors are measured too.
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(6):
        optimizer.zero_grad()
        loss(model).backward()
        optimizer.step()
    tensors = scope_of(model).auto.tensors
    assert any(name.startswith("encoder.") and t.measured is not None
               for name, t in tensors.items())
    assert any(name.startswith("decoder") and t.measured is not None
               for name, t in tensors.items())
