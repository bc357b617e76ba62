"""Models as users write them: functional calls (``F.relu``, ``x.relu()``, ``F.dropout``,
``F.elu``, ``F.linear``) and convs without a twin, inside a converted model's forward. Parity
with PyG at 32 bits, the context at 2 bits, the scope's lifetime."""

from __future__ import annotations

import copy
import io
import math
import sys
import threading

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from torch import nn
from torch.overrides import TorchFunctionMode
from torch_geometric.nn import models as pyg_models

import gnnact
from gnnact import Config, ops
from gnnact.data import synthetic_graph
from gnnact.memory import breakdown, saved_bytes
from gnnact.models import MODELS, build
from gnnact.nn.scope import scope_of

EXACT = Config(bits=32)


def _graph(n: int = 60, e: int = 300, f: int = 12, seed: int = 0,
           dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, f, generator=gen, dtype=dtype)
    return x, torch.randint(0, n, (2, e), generator=gen)


def _small(name: str, style: str, f_in: int = 12, classes: int = 5,
           dropout: float = 0.5) -> nn.Module:
    layers = 4 if name == "gcnii" else 3
    hidden = 4 if name == "gat" else 16
    return build(name, f_in, classes, hidden=hidden, layers=layers, heads=2, style=style,
                 dropout=dropout)


def _run(model: nn.Module, x: torch.Tensor, ei: torch.Tensor, seed: int) -> tuple:
    torch.manual_seed(seed)  # the dropout masks
    out = model(x, ei)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 1),
                    dtype=out.dtype).to(out.device)
    grads = torch.autograd.grad(out, list(model.parameters()), g)
    return out.detach(), grads


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
@pytest.mark.parametrize("name", MODELS)
def test_functional_style_equals_pyg_at_32_bits(name, device):
    x, ei = (t.to(device) for t in _graph())
    torch.manual_seed(0)
    ref = _small(name, "functional").double().train().to(device)
    ours = gnnact.convert(copy.deepcopy(ref), EXACT)
    for seed in (1, 2):
        out, grads = _run(ours, x, ei, seed)
        ref_out, ref_grads = _run(ref, x, ei, seed)
        torch.testing.assert_close(out, ref_out, rtol=1e-9, atol=1e-11)
        for g, r in zip(grads, ref_grads, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-7, atol=1e-10)


@pytest.mark.parametrize("name", MODELS)
def test_functional_style_keeps_what_the_module_style_keeps(name):
    data = synthetic_graph(400, 6, 24, 5, seed=0)
    kept = {}
    for style in ("module", "functional"):
        torch.manual_seed(0)
        model = gnnact.convert(_small(name, style, f_in=24), Config(bits=2))
        torch.manual_seed(1)
        loss = model(data.x, data.edge_index).sum()
        kept[style] = breakdown(loss, exclude=[data.x, data.edge_index])
    # The functional forward gets what the module twins get: within 10 %, graph cache included.
    module, functional = kept["module"], kept["functional"]
    assert functional.total <= 1.1 * module.total, (module, functional)
    assert functional.graph_cache == module.graph_cache


@pytest.mark.parametrize("inplace", [False, True])
def test_functional_calls_become_masks_and_rebuilt_inputs(inplace):
    """In place too (``inplace=True`` writes over the BatchNorm output): the linear map still
    rebuilds its input from the masks and BatchNorm's context."""
    n, f = 300, 32
    x = torch.randn(n, f)
    lin1, lin2, bn = nn.Linear(f, f), nn.Linear(f, f), nn.BatchNorm1d(f)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1, self.bn, self.lin2 = lin1, bn, lin2

        def forward(self, x):
            h = F.relu(self.bn(self.lin1(x)), inplace=inplace)
            h = F.dropout(h, 0.5, training=self.training, inplace=inplace)
            return F.linear(h, self.lin2.weight, self.lin2.bias)

    model = gnnact.convert(Net(), Config(bits=2))
    loss = model(x).sum()
    kept = breakdown(loss, exclude=[x])
    # BatchNorm's input at 2 bits with its statistics, a ReLU mask and a dropout mask; the
    # functional F.linear rebuilds dropout(relu(BN)) from them and keeps nothing.
    packed = math.ceil(n * f / 512) * (128 + 8)
    assert kept.context == packed + 2 * f * 4 + 2 * math.ceil(n * f / 8)
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("call", ["F.relu", "torch.relu", "x.relu", "x.relu_", "inplace",
                                  "leaky", "leaky_", "elu", "elu_", "dropout", "dropout_",
                                  "torch.dropout", "gelu"])
def test_each_functional_call_is_exact_at_32_bits_and_compressed_at_2(call):
    def act(h: torch.Tensor) -> torch.Tensor:
        return {
            "F.relu": lambda: F.relu(h), "torch.relu": lambda: torch.relu(h),
            "x.relu": lambda: h.relu(), "x.relu_": lambda: h.relu_(),
            "inplace": lambda: F.relu(h, inplace=True),
            "leaky": lambda: F.leaky_relu(h, 0.2), "leaky_": lambda: F.leaky_relu_(h, 0.2),
            "elu": lambda: F.elu(h, 0.7), "elu_": lambda: F.elu_(h, 0.7),
            "dropout": lambda: F.dropout(h, 0.3, training=True),
            "dropout_": lambda: F.dropout(h, 0.3, training=True, inplace=True),
            "torch.dropout": lambda: torch.dropout(h, 0.3, True),
            "gelu": lambda: F.gelu(h),
        }[call]()

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin1, self.lin2 = nn.Linear(16, 64), nn.Linear(64, 8)

        def forward(self, x):
            return self.lin2(act(self.lin1(x)))

    x = torch.randn(200, 16, dtype=torch.float64)
    torch.manual_seed(0)
    ref = Net().double()
    ours = gnnact.convert(copy.deepcopy(ref), EXACT)
    for model in (ours, ref):
        torch.manual_seed(3)
        out = model(x)
        out.pow(2).sum().backward()
    for p, q in zip(ours.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12)
    # At 2 bits the activation keeps a 1-bit mask and the second linear map its input at 2 bits
    # (ELU keeps its output at 2 bits, and the linear map rebuilds its input from that copy).
    # GELU has no op of its own: the generic pipeline keeps its input at 2 bits instead.
    gnnact.convert(ours, Config(bits=2))
    torch.manual_seed(3)
    context = breakdown(ours(x).sum(), exclude=[x]).context
    numel = 200 * 64
    packed = math.ceil(numel / 512) * (128 + 8)
    assert context == (2 * packed if call == "gelu" else math.ceil(numel / 8) + packed)


_ACTS = {"F.relu": F.relu, "x.relu": torch.Tensor.relu, "torch.relu": torch.relu,
         "leaky": lambda h: F.leaky_relu(h, 0.1), "elu": F.elu,
         "dropout": lambda h: F.dropout(h, 0.5, training=True)}


class _Nested(nn.Module):
    """``act(bn(lin(x)))``, the call nested in ``forward`` as PyG's examples nest them
    (``act`` a name of :data:`_ACTS`), or with BatchNorm's output given a name first
    (``named``, handed to ``keep`` as well if given; ``act`` may then be any callable)."""

    def __init__(self, act, named: bool = False, keep=None) -> None:
        super().__init__()
        self.lin, self.bn, self.out = nn.Linear(16, 64), nn.BatchNorm1d(64), nn.Linear(64, 4)
        self.act, self.named, self.keep = act, named, keep

    def forward(self, x):
        if self.named:
            h = self.bn(self.lin(x))
            if self.keep is not None:
                self.keep(h)
            return self.out(_ACTS.get(self.act, self.act)(h))
        # Written out: a helper taking the BatchNorm output would give it a name.
        if self.act == "F.relu":
            y = F.relu(self.bn(self.lin(x)))
        elif self.act == "x.relu":
            y = self.bn(self.lin(x)).relu()
        elif self.act == "torch.relu":
            y = torch.relu(self.bn(self.lin(x)))
        elif self.act == "leaky":
            y = F.leaky_relu(self.bn(self.lin(x)), 0.1)
        elif self.act == "elu":
            y = F.elu(self.bn(self.lin(x)))
        else:
            y = F.dropout(self.bn(self.lin(x)), 0.5, training=True)
        return self.out(y)


@pytest.mark.parametrize("act", sorted(_ACTS))
def test_a_nested_call_writes_over_its_temporary(act):
    """``F.relu(self.bn(h))``: nothing but the call refers to BatchNorm's output, so the call
    writes over it (one full-size tensor alive, not two); the values and gradients are those of
    the same model with the output named (not written over) and, at 32 bits, PyTorch's."""
    from gnnact.peak import PeakMeter

    x = torch.randn(4096, 16, dtype=torch.float64)
    torch.manual_seed(0)
    ref = _Nested(act).double()
    results = {}
    for name in ("pytorch", "nested", "named"):
        model = copy.deepcopy(ref)
        model.named = name == "named"
        if name != "pytorch":
            gnnact.convert(model, EXACT)
        torch.manual_seed(1)
        with PeakMeter() as meter:
            out = model(x)
        out.pow(2).sum().backward()
        results[name] = (meter.peak_bytes, out, [p.grad for p in model.parameters()])
    full = 4096 * 64 * 8
    for name in ("nested", "named"):
        torch.testing.assert_close(results[name][1], results["pytorch"][1], rtol=0, atol=0)
        for g, r in zip(results[name][2], results["pytorch"][2], strict=True):
            torch.testing.assert_close(g, r, rtol=1e-9, atol=1e-10)
    # Named: the linear output, BatchNorm's and the activation's are alive at once at 32 bits
    # (BatchNorm keeps its input, the last linear map its); nested: one fewer.
    assert results["named"][0] - results["nested"][0] > 0.9 * full


def test_nothing_the_caller_can_still_read_is_written_over():
    """A named input, an input a forward hook kept, a detached alias of it, an output its op
    saved for backward (exp), a leaf: each stays as it was, and backward runs."""
    x = torch.randn(256, 16)
    kept = []
    model = gnnact.convert(_Nested("F.relu", named=True, keep=kept.append), Config(bits=2))
    model(x).sum().backward()
    assert kept[0].min() < 0  # BatchNorm's output, not ReLU's
    kept.clear()
    model.named = False
    hook = model.bn.register_forward_hook(lambda m, i, o: kept.append(o.detach()))
    model(x).sum().backward()
    assert kept[0].min() < 0
    hook.remove()
    model.named = True  # with act a callable, given BatchNorm's output by name
    model.keep = None
    model.act = lambda h: F.relu(torch.exp(h))  # exp keeps its output for its backward
    model(x).sum().backward()
    leaves = []
    model.act = lambda h: F.relu(leaves.append(torch.randn(256, 64, requires_grad=True))
                                 or leaves[0]) + h
    model(x).sum().backward()
    assert leaves[0].grad is not None and leaves[0].min() < 0
    model.act = lambda h: F.relu(torch.randn(256, 64, requires_grad=True)) + h  # a leaf
    model(x).sum().backward()


def test_elu_gradient_is_unbiased():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(100, 24, generator=gen, dtype=torch.float64, requires_grad=True)
    w = torch.randn(24, 6, generator=gen, dtype=torch.float64)
    g = torch.randn(100, 6, generator=gen, dtype=torch.float64)
    exact = torch.autograd.grad(F.elu(x, 0.8) @ w, x, g)[0]
    config = Config(bits=2, group_size=64)
    grads = torch.stack([torch.autograd.grad(ops.elu(x, 0.8, config=config) @ w, x, g)[0]
                         for _ in range(400)])
    mean, stderr = grads.mean(0), grads.std(0) / math.sqrt(len(grads))
    # The rounding only reaches the gradient through Y + alpha on X <= 0: unbiased (up to the
    # float32 scale and zero of the packed groups).
    assert ((mean - exact).abs() <= 5 * stderr + 1e-6 * exact.abs()).float().mean() > 0.99
    assert not torch.equal(grads[0], exact)  # (it is compressed)


def test_softmax_head_stays_exact_and_generic_tensors_are_compressed():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = pyg_nn.GraphConv(16, 32)  # no twin: the generic pipeline
            self.lin = nn.Linear(32, 4)

        def forward(self, x, ei):
            h = torch.tanh(self.conv(x, ei))  # tanh keeps its output: compressed, 2 bits
            return F.log_softmax(self.lin(h), dim=-1)

    x, ei = _graph(n=500, e=3000, f=16, dtype=torch.float32)
    model = gnnact.convert(Net(), Config(bits=2))
    out = model(x, ei)
    record = scope_of(model).last
    kinds = {name: entry.kind for name, entry in record.tensors.items()}
    assert "quantize" in kinds.values()
    assert all(entry.kind == "exact" for entry in record.tensors.values()
               if entry.shape == (500, 4))  # log_softmax's output
    out.sum().backward()


def _pyg_model(kind: str, f_in: int, classes: int) -> nn.Module:
    hidden = 64
    if kind == "GCN":
        return pyg_models.GCN(f_in, hidden, 3, classes, dropout=0.5, norm="batch_norm")
    if kind == "GraphSAGE":
        return pyg_models.GraphSAGE(f_in, hidden, 3, classes, dropout=0.5, norm="batch_norm")
    if kind == "GAT":
        return pyg_models.GAT(f_in, 16, 3, classes, dropout=0.5, heads=4, norm="batch_norm")
    if kind == "GIN":
        return pyg_models.GIN(f_in, hidden, 3, classes, dropout=0.5, norm="batch_norm")
    if kind == "GATv2":
        return pyg_models.GAT(f_in, 16, 3, classes, dropout=0.5, heads=4, v2=True,
                              norm="batch_norm")
    if kind == "APPNP":
        class APPNPNet(nn.Module):  # as PyG's citation/appnp.py example writes it
            def __init__(self):
                super().__init__()
                self.lin1, self.lin2 = nn.Linear(f_in, hidden), nn.Linear(hidden, classes)
                self.prop = pyg_nn.APPNP(10, 0.1)

            def forward(self, x, ei):
                x = F.dropout(x, p=0.5, training=self.training)
                x = F.relu(self.lin1(x))
                x = F.dropout(x, p=0.5, training=self.training)
                return self.prop(self.lin2(x), ei)

        return APPNPNet()
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["GCN", "GraphSAGE", "GAT", "GIN", "GATv2", "APPNP"])
def test_pyg_models_converted_train_and_keep_6x_less(kind):
    data = synthetic_graph(800, 8, 32, 5, seed=0)
    exclude = [data.x, data.edge_index]
    torch.manual_seed(0)
    model = _pyg_model(kind, 32, 5)
    torch.manual_seed(1)
    fp32 = saved_bytes(F.cross_entropy(model(data.x, data.edge_index), data.y), exclude=exclude)
    gnnact.convert(model, Config(bits=2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(8):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data.x, data.edge_index), data.y)
        if step == 0:
            ours = saved_bytes(loss, exclude=exclude)  # graph cache counted
        loss.backward()
        optimizer.step()
        losses.append(float(loss))
    assert fp32 >= 6 * ours, (kind, fp32, ours)
    assert losses[-1] < losses[0]


def test_evaluation_and_no_grad_run_plain_and_keep_nothing():
    x, ei = _graph(dtype=torch.float32)
    model = gnnact.convert(_small("gcn", "functional"), Config(bits=2))
    scope = scope_of(model)
    with torch.no_grad():
        model(x, ei)
    assert scope.last is None  # no pass: nothing would be kept
    model.eval()
    out = model(x, ei)  # grad mode: a pass, without dropout
    assert scope.last is not None and out.requires_grad


def test_a_failed_pass_leaves_nothing_behind():
    from gnnact.hooks import active_pipeline
    from gnnact.ops.state import _STATE

    class Broken(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            F.relu(self.lin(x))
            raise RuntimeError("boom")

    model = gnnact.convert(Broken(), Config(bits=2))
    before = _STATE.get()
    with pytest.raises(RuntimeError, match="boom"):
        model(torch.randn(4, 8))
    assert _STATE.get() is before and active_pipeline() is None
    assert torch.overrides._get_current_function_mode() is None  # the mode is gone too
    # The next pass works and the ops work outside it.
    model.lin(torch.randn(4, 8, requires_grad=True)).relu().sum().backward()


def test_nested_converted_models_run_one_pass():
    inner = gnnact.convert(nn.Sequential(nn.Linear(8, 8), nn.ReLU()), Config(bits=2))

    class Outer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner, self.lin = inner, nn.Linear(8, 2)

        def forward(self, x):
            return self.lin(F.relu(self.inner(x)))

    outer = gnnact.convert(Outer(), Config(bits=4))
    outer(torch.randn(5, 8)).sum().backward()
    assert scope_of(outer).last is not None and scope_of(inner).last is None


def _caller_module(skip: int) -> str:
    """The module of the first frame ``skip`` frames up that is not PyTorch's own."""
    frame = sys._getframe(skip)
    while frame is not None and frame.f_globals.get("__name__", "").startswith("torch."):
        frame = frame.f_back
    return frame.f_globals.get("__name__", "") if frame is not None else ""


class _Seen(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.callers: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.callers.append(_caller_module(2))
        return func(*args, **(kwargs or {}))


def test_the_pass_mode_routes_the_models_calls_not_gnnacts_own_work(monkeypatch):
    """gnnact's quantization, packing and pack hooks run with the pass's mode off the stack
    (gnnact.ops.state.own_work): the mode sees the model's calls only. A mode the user enters
    above it still sees everything."""
    from gnnact.nn import functional as functional_module

    seen: list[str] = []
    routed = functional_module.FunctionalOps.__torch_function__

    def counting(self, func, types, args=(), kwargs=None):
        seen.append(_caller_module(2))
        return routed(self, func, types, args, kwargs)

    monkeypatch.setattr(functional_module.FunctionalOps, "__torch_function__", counting)
    user = _Seen()

    class Net(nn.Module):  # a twin (GCNConv), a conv without one, and functional calls
        def __init__(self):
            super().__init__()
            self.conv1 = pyg_nn.GCNConv(12, 16)
            self.conv2 = pyg_nn.LEConv(16, 16)
            self.lin = nn.Linear(16, 3)

        def forward(self, x, ei):
            h = F.dropout(F.relu(self.conv1(x, ei)), 0.5, self.training)
            h = self.conv2(h, ei).relu()
            with user:  # above the pass's mode
                return self.lin(h)

    x, ei = _graph(dtype=torch.float32)
    model = gnnact.convert(Net(), Config(bits=2))
    model(x, ei).sum().backward()
    assert scope_of(model).last.context > 0  # compressed: gnnact's work ran
    ours = [m for m in seen if m.startswith("gnnact.")]
    # What the mode sees: the model's calls (this test's, PyG's), and gnnact's code that
    # runs as the model's (the chunked message passing, a twin's forward and the shape checks
    # it calls); never the quantizer, the packing, the pack hook or the ops' bookkeeping.
    assert any(m.startswith("torch_geometric") for m in seen) and __name__ in seen
    assert not [m for m in ours if m.split(".")[1] in ("quant", "compress", "hooks", "memory")
                or m in ("gnnact.ops.context", "gnnact.ops.state")], sorted(set(ours))
    assert any(m.startswith("gnnact.quant") for m in user.callers)  # the Linear's input


def test_converted_model_survives_deepcopy_pickle_and_state_dict():
    x, ei = _graph(dtype=torch.float32)
    model = gnnact.convert(_small("gcn", "functional"), Config(bits=2))
    model(x, ei).sum().backward()
    clone = copy.deepcopy(model)
    assert scope_of(clone) is not scope_of(model) and scope_of(clone) is not None
    buffer = io.BytesIO()
    torch.save(model, buffer)
    loaded = torch.load(io.BytesIO(buffer.getvalue()), weights_only=False)
    for m in (clone, loaded):
        m(x, ei).sum().backward()
        assert scope_of(m).last is not None
    assert set(model.state_dict()) == set(_small("gcn", "functional").state_dict())


def test_two_threads_train_two_models_as_one_thread_does():
    # Rounding noise from per-tensor seeds (controlled_noise, per thread) and no dropout: each
    # run is deterministic, so any state one thread's pass leaks into the other's (a shared
    # copy, a derived entry, the noise control) changes the losses.
    from gnnact.ops.context import controlled_noise

    data = synthetic_graph(300, 6, 16, 4, seed=0)

    def model(seed: int) -> nn.Module:  # built in the main thread: the global RNG is shared
        torch.manual_seed(seed)
        return gnnact.convert(_small("gcn", "functional", f_in=16, classes=4, dropout=0.0),
                              Config(bits=2))

    def train(model: nn.Module, seed: int, out: dict,
              barrier: threading.Barrier | None = None) -> None:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        losses = []
        for step in range(6):
            if barrier is not None:
                barrier.wait()  # the two threads' passes interleave
            optimizer.zero_grad()
            with controlled_noise(seed * 100 + step):
                loss = F.cross_entropy(model(data.x, data.edge_index), data.y)
            loss.backward()
            optimizer.step()
            losses.append(float(loss))
        out[seed] = losses

    alone: dict = {}
    for seed in (0, 1):
        train(model(seed), seed, alone)
    together: dict = {}
    barrier = threading.Barrier(2)
    models = {seed: model(seed) for seed in (0, 1)}
    threads = [threading.Thread(target=train, args=(models[seed], seed, together, barrier))
               for seed in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone


def test_controller_adapts_functional_and_generic_tensors_through_the_scope():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = pyg_nn.GCNConv(16, 32)  # twin
            self.conv2 = pyg_nn.GraphConv(32, 32)  # generic
            self.lin = nn.Linear(32, 4)

        def forward(self, x, ei):
            h = F.relu(self.conv1(x, ei))
            h = torch.tanh(self.conv2(h, ei))  # tanh's output: a generic tensor
            return self.lin(F.dropout(h, 0.2, training=self.training))

    data = synthetic_graph(300, 6, 16, 4, seed=0)
    torch.manual_seed(0)
    model = gnnact.convert(Net(), Config(bits=2))
    controller = gnnact.Controller(model, avg_bits=3)

    def closure():
        return F.cross_entropy(model(data.x, data.edge_index), data.y)

    controller.adapt(closure)
    names = set(controller.tensors)
    assert any(":" in n and n.rsplit(":", 1)[1].isdigit() for n in names)  # generic
    assert "conv2.lin_rel:activations" in names  # a functional F.linear in a PyG Linear
    scope = scope_of(model)
    assert {n for n in names if n.split(":")[0] not in controller.modules} <= set(scope.bits)
    model(data.x, data.edge_index)  # the next pass takes the widths
    generic = {n: e.bits for n, e in scope.last.tensors.items() if e.adaptive}
    assert all(generic[n] == scope.bits[n] for n in generic if n in scope.bits)


@pytest.mark.parametrize("name", MODELS)
def test_saved_bytes_agrees_with_the_independent_meter(name):
    # ../shared/tools/meter.py: an independent walk of the autograd graph (every storage a node
    # holds, through dataclasses: gnnact's graph cache included).
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "shared" / "tools" / "meter.py"
    if not path.is_file():
        pytest.skip(f"no independent meter at {path}")
    spec = importlib.util.spec_from_file_location("meter", path)
    meter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(meter)
    data = synthetic_graph(400, 6, 24, 5, seed=0)
    torch.manual_seed(0)
    model = gnnact.convert(_small(name, "functional", f_in=24), Config(bits=2))
    torch.manual_seed(1)
    loss = F.cross_entropy(model(data.x, data.edge_index), data.y)
    ours = saved_bytes(loss, exclude=[data.x, data.edge_index])
    theirs = meter.saved_storage_bytes(
        loss, exclude=[data.x, data.edge_index, *model.parameters(), *model.buffers()])
    assert ours == theirs


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)])
def test_input_dropout_is_rebuilt_from_the_input_and_its_mask(device):
    """``F.dropout`` of the input features (which need no gradient): the first linear map keeps
    a reference to the input and a 1-bit mask, not a rounded copy, and its weight gradient is
    PyTorch's bit for bit under the same seed."""
    n, f = 1000, 300

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(f, 16)

        def forward(self, x):
            return self.lin(F.dropout(x, 0.5, training=self.training))

    x, g = torch.randn(n, f, device=device), torch.randn(n, 16, device=device)
    ref = Net().to(device)
    model = gnnact.convert(copy.deepcopy(ref), Config(bits=2, self_check=False))
    grads, kept = [], []
    for net in (ref, model):
        torch.manual_seed(1)
        loss = (net(x) * g).sum()
        kept.append(breakdown(loss, exclude=[x, g]).context)
        loss.backward()
        grads.append(net.lin.weight.grad)
    assert torch.equal(grads[0], grads[1])
    assert kept == [4 * n * f, math.ceil(n * f / 8)]  # PyTorch: the dropout output in full


def test_sigmoid_is_a_gate_inside_message_passing_and_a_loss_head_outside():
    """SuperGAT's attention multiplies by a sigmoid: its output is kept once at
    ``config.attention`` bits (shared with the product that reads it again). A sigmoid outside
    message passing (GAE's decoder, a loss head) stays exact."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = pyg_nn.SuperGATConv(16, 8, heads=4, attention_type="MX")
            self.lin = nn.Linear(32, 8)

        def forward(self, x, ei):
            return torch.sigmoid(self.lin(self.conv(x, ei))).sum()

    x, ei = _graph(n=600, e=6000, f=16, dtype=torch.float32)
    model = gnnact.convert(Net(), Config(bits=2, self_check=False))
    model.train()
    model(x, ei).backward()
    tensors = scope_of(model).last.tensors.values()
    per_edge = [e for e in tensors if len(e.shape) == 2 and e.shape[0] > 6000
                and e.shape[1] == 4]  # one value per edge (and self-loop) and head
    assert per_edge and all(e.bits == 8 for e in per_edge)
    assert all(e.kind != "exact" for e in per_edge)
    head = [e for e in tensors if e.shape == (600, 8)]
    assert head and all(e.kind == "exact" for e in head)
