"""Converted models under :func:`torch.compile`: forward and backward run, training follows the
eager run step for step, and a model's compressed layers are custom operators in one captured
graph (``gnnact::call``, :mod:`gnnact.ops.library`: each runs its layer eagerly inside
the pass; the graph cache validates an ``edge_index`` once, when it builds the graph).

The CPU tests use the ``aot_eager`` backend: it runs the captured graphs as the same ATen ops
eager mode runs, so the compiled training run is *bit-identical* to the eager one, at 32 bits
and at 2 bits alike (the quantizer's rounding noise is drawn inside gnnact's ops, eagerly, from
the pass's seeds, which follow the default generator's state, in the same order). Inductor
fuses the code between the ops: a few steps then match within float round-off (32 bits), or
within the spread of the 2-bit rounding noise (a value moved by round-off can round to the
neighbouring level).
"""

from __future__ import annotations

import copy
import gc
import json
import math
import pickle
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
import torch_geometric.nn as pyg_nn
from test_benchmarks import _script
from torch import nn
from torch_geometric.data import Batch
from torch_geometric.nn import MLP, GCNConv, GINConv, SAGEConv, global_add_pool
from torch_geometric.nn import models as pyg_models

import gnnact
from gnnact import Config
from gnnact.data import synthetic_graph
from gnnact.models import build
from gnnact.nn._base import _Compressed
from gnnact.nn.conv import norm as norm_module
from gnnact.nn.scope import scope_of
from gnnact.ops import graph as graph_module
from gnnact.ops.library import ATTRIBUTE

F_IN, CLASSES = 12, 4

MODELS: dict[str, Callable[[], nn.Module]] = {
    "gcn": lambda: build("gcn", F_IN, CLASSES, hidden=16, layers=2),
    "sage": lambda: build("sage", F_IN, CLASSES, hidden=16, layers=2),
    "gat": lambda: build("gat", F_IN, CLASSES, hidden=4, layers=2, heads=2),
    "gcnii": lambda: build("gcnii", F_IN, CLASSES, hidden=16, layers=3),
    "gcn-functional": lambda: build("gcn", F_IN, CLASSES, hidden=16, layers=2,
                                    style="functional"),
    "pyg-GCN": lambda: pyg_models.GCN(F_IN, 16, 2, CLASSES, dropout=0.5),
    "pyg-GraphSAGE": lambda: pyg_models.GraphSAGE(F_IN, 16, 2, CLASSES, dropout=0.5),
    "pyg-GAT": lambda: pyg_models.GAT(F_IN, 8, 2, CLASSES, heads=2, dropout=0.5),
}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def _data(device: str = "cpu"):
    return synthetic_graph(120, 5, F_IN, CLASSES, seed=0).to(device)


def _train(model: nn.Module, data, steps: int, compile_with: str | None,
           seed: int = 100) -> list[float]:
    """Losses of ``steps`` Adam steps; each step's seed (dropout masks, rounding noise) fixed by
    ``seed``."""
    run = model if compile_with is None else torch.compile(model, backend=compile_with)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        torch.manual_seed(seed + step)
        opt.zero_grad()
        out = run(data.x, data.edge_index)
        loss = F.cross_entropy(out[data.train_mask], data.y[data.train_mask])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _pair(name: str, bits: int, device: str = "cpu") -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    model = gnnact.convert(MODELS[name](), Config(bits=bits)).to(device).train()
    return model, copy.deepcopy(model)


# Each compile takes seconds on the CPU: the models that other tests do not cover run by
# default, the rest (same paths, other layers) with the slow tests.
FAST = {"gcn-functional", "pyg-GCN", "pyg-GAT"}


def _models(fast: set[str]) -> list:
    return [name if name in fast else pytest.param(name, marks=pytest.mark.slow)
            for name in MODELS]


@pytest.mark.parametrize("name", _models(FAST))
def test_compiled_training_is_bit_identical_at_2_bits(name):
    data = _data()
    eager, compiled = _pair(name, 2)
    expected = _train(eager, data, 3, None)
    assert _train(compiled, data, 3, "aot_eager") == expected
    for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
        assert torch.equal(p, q)


@pytest.mark.parametrize("name", _models({"gcn"}))
def test_compiled_training_is_bit_identical_at_32_bits(name):
    data = _data()
    eager, compiled = _pair(name, 32)
    assert _train(compiled, data, 3, "aot_eager") == _train(eager, data, 3, None)


def test_inductor_follows_eager():
    data = _data()
    eager, compiled = _pair("gcn", 32)
    torch.testing.assert_close(_train(compiled, data, 3, "inductor"),
                               _train(eager, data, 3, None), rtol=1e-5, atol=1e-6)
    eager, compiled = _pair("gcn", 2)
    got, expected = _train(compiled, data, 3, "inductor"), _train(eager, data, 3, None)
    # The same noise stream, but round-off in the fused code between the ops can move a value
    # across a rounding threshold (seen: 5e-5 at the third step). That must stay far below what
    # other noise does to the same steps (another seed: 0.05 to 0.17 here).
    other = _train(_pair("gcn", 2)[0], data, 3, None, seed=200)
    spread = max(abs(a - b) for a, b in zip(other, expected, strict=True))
    assert got[0] == pytest.approx(expected[0], rel=1e-5)
    assert max(abs(a - b) for a, b in zip(got, expected, strict=True)) <= 0.05 * spread, (
        got, expected, other)


class _GIN(nn.Module):
    """PyG's GIN recipe in small: ``GINConv`` over PyG ``MLP`` s, ``global_add_pool`` (whose
    ``int(index.max())`` is a graph break: the rest of the frame runs eagerly, inside the
    compiled call)."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList([GINConv(MLP([F_IN if i == 0 else 16, 16, 16]))
                                    for i in range(2)])
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x, edge_index, batch):
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.head(global_add_pool(x, batch))


@pytest.mark.parametrize("min_bytes", [0, None], ids=["full-passes", "small-passes"])
def test_saved_tensor_hooks_never_compiled(min_bytes):
    """Autograd calls the pipeline's (or a small pass's watch's) pack hook from inside the op
    that saves; in the eager part of a compiled frame Dynamo took the hook's own frame for one
    to compile, and inductor failed on it (``torch.compile`` of a converted GIN: AttributeError
    in ``_is_parameter``). No frame Dynamo compiles comes from the hooks; training runs."""
    batch = Batch.from_data_list([synthetic_graph(20, 3, F_IN, CLASSES, seed=i)
                                  for i in range(16)])
    y = torch.arange(16) % CLASSES
    torch.manual_seed(0)
    model = gnnact.convert(_GIN(), Config(bits=2, min_bytes=min_bytes))
    traced: set[str] = set()

    def backend(gm: torch.fx.GraphModule, inputs: list) -> Callable:
        traced.update(str(node.meta.get("stack_trace", "")) for node in gm.graph.nodes)
        return gm.forward

    compiled = torch.compile(model, backend=backend)
    for _ in range(3):
        loss = F.cross_entropy(compiled(batch.x, batch.edge_index, batch.batch), y)
        loss.backward()
        assert torch.isfinite(loss)
    assert traced and not [t for t in traced if "gnnact/hooks.py" in t
                           or "gnnact/nn/scope.py" in t]


# The speed issue's target (issue 44, item 1): Dynamo captures gnnact's ops in its graphs, with
# no graph break. Not yet: every gnnact op is an opaque eager call (``eager_op``), the pass's
# module hooks read a ContextVar, and one break inside PyG's layer loop makes Dynamo run the
# frame eagerly: ``explain`` finds no op at all. Strict, so the day it passes, this says so.
@pytest.mark.parametrize("name", _models({"gcn", "gat", "gcn-functional", "pyg-GCN"}))
def test_dynamo_captures_gnnact_ops_without_breaks(name):
    data = _data()
    model = _pair(name, 2)[0]
    explained = torch._dynamo.explain(model)(data.x, data.edge_index)
    captured = [node for graph in explained.graphs for node in graph.graph.nodes
                if node.target in (torch.ops.gnnact.call,
                                   torch.ops.gnnact.call.default)]
    calls = []
    handles = [m.register_forward_hook(lambda m, i, o: calls.append(m))
               for m in model.modules() if isinstance(m, _Compressed)]
    model(data.x, data.edge_index)
    for handle in handles:
        handle.remove()
    # One graph, every compressed layer's call an operator in it (and, in the functional
    # style, every routed call: F.relu, F.dropout).
    assert explained.graph_count == 1 and explained.graph_break_count == 0, \
        explained.break_reasons
    functional = sum(1 for node in captured if node.args[1])
    assert len(captured) - functional == len(calls) > 0
    assert functional > 0 if "functional" in name else functional == 0


@pytest.mark.parametrize("name", ["gcn", "gcn-functional"])
def test_compiled_pass_keeps_what_eager_keeps(name):
    data = _data()
    eager, compiled = _pair(name, 2)
    _train(compiled, data, 2, "aot_eager")
    _train(eager, data, 2, None)
    kept, expected = scope_of(compiled).last.bytes_by_module, scope_of(eager).last.bytes_by_module
    # Module by module the same bytes, and one 8-byte ticket per recorded call (two convs,
    # BatchNorm, ReLU, dropout), counted for the model (where the functional style's own
    # calls count too).
    assert kept.pop("") == expected.pop("", 0) + 5 * 8
    assert kept == expected


def test_compiled_layer_records_freed_with_the_graph():
    data = _data()
    model = _pair("gcn", 2)[0]
    run = torch.compile(model, backend="aot_eager")
    islands = [m.__dict__[ATTRIBUTE] for m in model.modules() if isinstance(m, _Compressed)]
    out = run(data.x, data.edge_index)
    assert all(island.records for island in islands)
    del out  # never differentiated: the records go with the graph
    gc.collect()
    assert not any(island.records for island in islands)
    out = run(data.x, data.edge_index)
    out.sum().backward(retain_graph=True)
    assert not any(island.records for island in islands)  # read once, freed
    with pytest.raises(RuntimeError, match="a second time"):
        out.sum().backward()


def test_compiled_evaluation_equals_eager():
    data = _data()
    eager, compiled = _pair("gcn", 2)
    run = torch.compile(compiled, backend="aot_eager")
    for model in (eager, compiled):
        model.eval()
    with torch.no_grad():
        assert torch.equal(run(data.x, data.edge_index), eager(data.x, data.edge_index))
    assert not any(m.__dict__[ATTRIBUTE].records for m in compiled.modules()
                   if isinstance(m, _Compressed))


class _Identities(nn.Module):
    """Calls whose output is their input (dropout with ``p=0``) or a view of it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GCNConv(F_IN, 16)
        self.drop = nn.Dropout(0.0)
        self.conv2 = GCNConv(16, CLASSES)

    def forward(self, x, edge_index):
        x = F.dropout(self.conv1(x, edge_index), p=0.0, training=self.training)
        return self.conv2(self.drop(x).relu(), edge_index)


def test_compiled_identities_train_as_eager():
    data = _data()
    torch.manual_seed(0)
    eager = gnnact.convert(_Identities(), Config(bits=2))
    compiled = copy.deepcopy(eager)
    assert _train(compiled, data, 3, "aot_eager") == _train(eager, data, 3, None)


class _Bipartite(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = SAGEConv(F_IN, CLASSES)

    def forward(self, x, edge_index):
        return self.conv((x, x[:60]), edge_index[:, edge_index[1] < 60])


def test_layer_called_with_a_pair_runs_eagerly_and_trains_as_eager():
    data = _data()
    torch.manual_seed(0)
    eager = gnnact.convert(_Bipartite(), Config(bits=2))
    compiled = copy.deepcopy(eager)
    run = torch.compile(compiled, backend="aot_eager")
    for call in (eager, run):
        torch.manual_seed(1)
        call(data.x, data.edge_index).square().sum().backward()
    assert torch.equal(eager.conv.lin_l.weight.grad, compiled.conv.lin_l.weight.grad)


def test_hetero_model_trains_compiled_as_eager():
    # to_hetero's convs are called with pairs: each runs eagerly, whole (measured faster, at
    # 3,000 and at 30,000 papers, than one gnnact::call each in one graph: docs/results.rst).
    from torch_geometric.data import HeteroData
    from torch_geometric.nn import to_hetero

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1, self.conv2 = SAGEConv((-1, -1), 16), SAGEConv((-1, -1), CLASSES)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    g = torch.Generator().manual_seed(0)
    data = HeteroData()
    data["paper"].x = torch.randn(80, F_IN, generator=g)
    data["author"].x = torch.randn(40, 6, generator=g)
    data["author", "writes", "paper"].edge_index = torch.stack(
        [torch.randint(0, 40, (200,), generator=g), torch.randint(0, 80, (200,), generator=g)])
    data["paper", "rev_writes", "author"].edge_index = \
        data["author", "writes", "paper"].edge_index.flip(0)
    data["paper", "cites", "paper"].edge_index = torch.randint(0, 80, (2, 300), generator=g)
    torch.manual_seed(0)
    model = to_hetero(Net(), data.metadata(), aggr="sum")
    with torch.no_grad():
        model(data.x_dict, data.edge_index_dict)
    eager = gnnact.convert(model, Config(bits=2))
    compiled = copy.deepcopy(eager)
    run = torch.compile(compiled, backend="aot_eager")
    for _ in range(2):
        for call in (eager, run):
            torch.manual_seed(1)
            call(data.x_dict, data.edge_index_dict)["paper"].square().sum().backward()
    for p, q in zip(eager.parameters(), compiled.parameters(), strict=True):
        if p.grad is None:  # (off the loss's path: AOTAutograd's backward gives zeros)
            assert q.grad is None or not q.grad.any()
        else:
            assert torch.equal(p.grad, q.grad)


def test_a_call_left_to_eager_mode_is_not_compiled_in_pieces():
    # The pair call breaks the graph and runs eagerly; Dynamo, still watching there, compiled
    # the SAGE twin's own forward as frames of their own, in pieces between gnnact's ops
    # (to_hetero's models: a set of pieces per edge type, slower than eager mode).
    data = _data()
    torch.manual_seed(0)
    model = gnnact.convert(_Bipartite(), Config(bits=2))
    traced: list[str] = []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> Callable:
        traced.extend(str(node.meta.get("stack_trace", "")) for node in gm.graph.nodes)
        return gm.forward

    run = torch.compile(model, backend=backend)
    for _ in range(2):
        run(data.x, data.edge_index).square().sum().backward()
    assert not [t for t in traced if "gnnact/nn/conv" in t]


class _Checkpointed(nn.Module):
    """DeeperGCN's blocks as PyG's example builds them: ``ckpt_grad`` runs each under
    ``torch.utils.checkpoint`` (a higher-order op to Dynamo)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(F_IN, 16)
        self.layers = nn.ModuleList(
            pyg_nn.DeepGCNLayer(pyg_nn.GENConv(16, 16, aggr="softmax", learn_t=True),
                                nn.LayerNorm(16), nn.ReLU(), block="res+", ckpt_grad=True)
            for _ in range(2))
        self.out = nn.Linear(16, CLASSES)

    def forward(self, x, edge_index):
        x = self.lin(x)
        for layer in self.layers:
            x = layer(x, edge_index)
        return self.out(x)


def test_checkpointed_blocks_compile_to_one_graph():
    # The chunked propagate of GENConv noted its blocks on itself, a side effect inside the
    # checkpoint's subgraph: a graph break per block.
    data = _data()
    torch.manual_seed(0)
    model = gnnact.convert(_Checkpointed(), Config(bits=2)).train()
    explained = torch._dynamo.explain(model)(data.x, data.edge_index)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, \
        explained.break_reasons
    torch._dynamo.reset()
    run = torch.compile(model, backend="aot_eager")
    loss = run(data.x, data.edge_index).square().mean()
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for p in model.parameters())


class _Gelu(nn.Module):
    """Two linear maps around a function the pass does not route (F.gelu)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(F_IN, 32), nn.Linear(32, CLASSES)

    def forward(self, x, edge_index):
        return self.lin2(F.gelu(self.lin1(x)))


def test_compiled_probe_passes_measure_what_eager_ones_do():
    # Automatic widths probe the first steps: the probe hooks the layers' records inside the
    # compiled graph as it hooks the eager graph, and ends with the outer backward.
    data = _data()
    widths = []
    for compile_with in (None, "aot_eager"):
        torch.manual_seed(0)
        model = gnnact.convert(_Gelu())
        losses = _train(model, data, 4, compile_with)
        auto = scope_of(model).auto
        assert all(math.isfinite(loss) for loss in losses) and not auto.failures
        widths.append(auto.tensors)
    assert widths[0] == widths[1] and all(t.measured is not None for t in widths[0].values())


def _gin_batch():
    batch = Batch.from_data_list([synthetic_graph(20, 3, F_IN, CLASSES, seed=i)
                                  for i in range(16)])
    return batch, torch.arange(16) % CLASSES


def _train_gin(model: nn.Module, steps: int, compile_with: Callable | str | None) -> list[float]:
    batch, y = _gin_batch()
    run = model if compile_with is None else torch.compile(model, backend=compile_with)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for step in range(steps):
        torch.manual_seed(step)
        opt.zero_grad()
        loss = F.cross_entropy(run(batch.x, batch.edge_index, batch.batch), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.default_floor
def test_small_pass_traces_the_layers_as_pytorch():
    # Every tensor of this GIN stays under the default floor: after its first (full) pass,
    # its passes run as PyTorch's, and a compiled frame traces its layers (Linear and
    # BatchNorm1d twins) as PyTorch's: no gnnact::call in those graphs, for inductor to
    # compile whole, and the same training as eager mode's.
    torch.manual_seed(0)
    eager = gnnact.convert(_GIN(), Config(bits=2))
    compiled = copy.deepcopy(eager)
    calls: list[int] = []

    def backend(gm: torch.fx.GraphModule, inputs: list) -> Callable:
        calls.append(sum(node.target in (torch.ops.gnnact.call, torch.ops.gnnact.call.default)
                         for node in gm.graph.nodes))
        return torch._dynamo.backends.debugging.aot_eager(gm, inputs)

    assert _train_gin(compiled, 4, backend) == _train_gin(eager, 4, None)
    assert scope_of(compiled).last.as_pytorch and scope_of(eager).last.as_pytorch
    # The first pass's graphs hold the layers' operators, the small passes' none.
    assert calls[0] > 0 and calls[-1] == 0 and len(calls) > 1
    layers = [m for m in compiled.modules() if isinstance(m, _Compressed)]
    assert layers and not any("_gnnact_as_pytorch" in m.__dict__ for m in layers)


@pytest.mark.default_floor
def test_small_pass_keeps_a_hooked_layer_an_operator():
    # A layer with a forward hook of its own stays one operator in a small pass (its twinned
    # forward, traced, would leave the hook out): the hook runs every step.
    torch.manual_seed(0)
    model = gnnact.convert(_GIN(), Config(bits=2))
    seen = []
    model.head.register_forward_hook(lambda m, i, o: seen.append(o.shape))
    _train_gin(model, 3, "aot_eager")
    assert scope_of(model).last.as_pytorch and len(seen) == 3


def test_a_subclass_with_its_own_forward_is_never_run_as_the_twinned_class():
    class Doubled(gnnact.nn.Linear):
        def forward(self, x):
            return 2 * super().forward(x)

    class Plain(gnnact.nn.Linear):
        pass

    assert Doubled._twinned_forward is None
    assert Plain._twinned_forward is nn.Linear.forward
    assert gnnact.nn.GCNConv._twinned_forward is GCNConv.forward


@pytest.mark.parametrize("name", ["gcnii", "gcn"])
def test_eager_backend_trains_as_eager(name):
    # backend="eager" runs the graph's ops on the caller's tensors, history and all: GCN2Conv's
    # x and x_0 come with theirs (one leads to the other), and its record starts at aliases.
    data = _data()
    eager, compiled = _pair(name, 2)
    assert _train(compiled, data, 3, "eager") == _train(eager, data, 3, None)


def test_copies_get_their_own_island():
    model = _pair("gcn", 2)[0]
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
        for m in copied.modules():
            if isinstance(m, _Compressed):
                assert m.__dict__[ATTRIBUTE].module is m


def test_edge_index_checked_when_the_graph_is_built(monkeypatch):
    data = _data()
    model = torch.compile(_pair("gcn", 2)[0], backend="aot_eager")
    checked = []
    original = graph_module.check_edge_index
    # (GCN's normalisation checks it before it builds; other graphs in build_graph.)
    for module in (graph_module, norm_module):
        monkeypatch.setattr(module, "check_edge_index",
                            lambda *args, **kwargs: checked.append(1) or original(*args, **kwargs))
    for _ in range(3):
        model(data.x, data.edge_index).sum().backward()
    assert len(checked) == 1  # one graph, built in the first pass, kept by the model
    bad = data.edge_index.clone()
    bad[0, 0] = data.num_nodes
    with pytest.raises(ValueError, match="edge_index holds node indices"):
        model(data.x, bad)


@pytest.mark.cuda
@pytest.mark.parametrize("name", ["gcn", "sage", "pyg-GAT"])
def test_compiled_training_cuda(name):
    data = _data("cuda")
    eager, compiled = _pair(name, 32, "cuda")
    torch.testing.assert_close(_train(compiled, data, 3, "inductor"),
                               _train(eager, data, 3, None), rtol=1e-4, atol=1e-5)
    # 2 bits: the rounding noise is the kernels' counter hash of a seed drawn in the (eager)
    # op, the same as eagerly; GPU sums may still differ in the last bit between runs and move
    # a value across a rounding threshold, so within 1e-3 (another seed moves them by ~5 %).
    eager, compiled = _pair(name, 2, "cuda")
    torch.testing.assert_close(_train(compiled, data, 3, "inductor"),
                               _train(eager, data, 3, None), rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_bench_compile_rows(tmp_path):
    bench = _script("bench_compile")
    out = tmp_path / "compile.jsonl"
    assert bench.main(["--nodes", "300", "--models", "gcn", "--backend", "aot_eager",
                       "--repeats", "1", "--variants", "gnnact2", "gnnact2_compiled",
                       "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["variant"], r["compiled"], r["bits"]) for r in rows] == [
        ("gnnact2", False, 2), ("gnnact2_compiled", True, 2)]
    for row in rows:
        assert row["bench"] == "compile" and row["step_seconds"] > 0
        assert isinstance(row["graph_break_count"], int)  # what explain reported, recorded
