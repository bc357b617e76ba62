"""gnnact.distributed: partitioning, shards, the halo exchange and the partitioned model.

The multi-process parts run once per world size (2 and 4 gloo processes, forked: a fresh
interpreter per rank would cost seconds of imports) and hand their results back; the tests
compare them with the single-process run computed here.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch_geometric.data import Data
from torch_geometric.nn import (
    ChebConv,
    GCN2Conv,
    GINConv,
    GINEConv,
    GraphConv,
    PointNetConv,
    TransformerConv,
)
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.nn.models import GAT, GCN, GIN, GraphSAGE

import gnnact
from gnnact.data import synthetic_graph
from gnnact.distributed import (
    DistributedGNN,
    GlobalGCNNorm,
    HaloExchange,
    build_shard,
    metis_available,
    partition_nodes,
    run_local,
    shard_graph,
    sum_gradients_hook,
    train_partitioned,
)
from gnnact.distributed.codec import decode, encode, payload_nbytes
from gnnact.memory import saved_bytes
from gnnact.models import build
from gnnact.nn.scope import scope_of
from gnnact.ops.probe import UNMEASURED_BITS
from gnnact.training import train_full_batch

NUM_NODES, FEATURES, CLASSES = 48, 6, 3
WIDE = 64  # features of the unbiasedness and byte-count exchanges
COPIES, ROUNDS = 50, 8
SAMPLES = COPIES * ROUNDS  # draws averaged by the unbiasedness test
KINDS = ("gcn", "gcn_improved", "gcn_twin", "gcn_batch_norm", "gcn_batch_norm_twin", "sage",
         "sage_twin", "gat", "gcnii",
         # Convs without a dedicated path: run on (source, target) pairs.
         "gin_batch_norm", "gin_batch_norm_twin", "gatv2", "gatv2_twin", "transformer",
         "graphconv_functional", "graphconv_functional_twin",
         # Given the shard's edge attributes: weights (GCN normalises with global weighted
         # degrees), features of the edges (GAT's, GINE's and TransformerConv's edge_dim).
         "gcn_weighted", "gcn_weighted_improved", "gcn_weighted_twin", "gat_edge_attr",
         "gat_edge_attr_twin", "gine", "transformer_edge")
#: The edge attribute each kind is called with (the others take x and edge_index only).
EDGE_ARG = {"gcn_weighted": "edge_weight", "gcn_weighted_improved": "edge_weight",
            "gcn_weighted_twin": "edge_weight", "gat_edge_attr": "edge_attr",
            "gat_edge_attr_twin": "edge_attr", "gine": "edge_attr",
            "transformer_edge": "edge_attr"}
EDGE_DIM = 2
LR, STEPS = 0.3, 2
EPOCHS = 4  # of the partitioned training loop


def make_data() -> Data:
    data = synthetic_graph(NUM_NODES, 4.0, FEATURES, CLASSES, seed=0)
    data.x = data.x.double()
    gen = torch.Generator().manual_seed(2)
    num_edges = data.edge_index.size(1)
    data.edge_weight = torch.rand(num_edges, generator=gen, dtype=torch.float64) + 0.5
    data.edge_attr = torch.randn(num_edges, EDGE_DIM, generator=gen, dtype=torch.float64)
    return data


def edge_kwargs(kind: str, source) -> dict:
    """``{name: source.name}`` of the edge attribute ``kind`` is called with (``source`` the
    whole graph or a shard)."""
    name = EDGE_ARG.get(kind)
    return {} if name is None else {name: getattr(source, name)}


class GCNII(nn.Module):
    """Linear, two GCN2Conv layers on (x, x_0), linear: the GCNII pattern."""

    def __init__(self) -> None:
        super().__init__()
        self.lin0, self.lin1 = nn.Linear(FEATURES, 8), nn.Linear(8, CLASSES)
        self.convs = nn.ModuleList([GCN2Conv(8, alpha=0.1, theta=0.5, layer=i + 1)
                                    for i in range(2)])

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = x_0 = self.lin0(x).relu()
        for conv in self.convs:
            x = conv(x, x_0, edge_index).relu()
        return self.lin1(x)


class FunctionalGraphConv(nn.Module):
    """Written as PyG's examples write models: GraphConv layers, F.relu and F.elu in forward
    (no dropout: its masks are drawn per rank)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GraphConv(FEATURES, 8, aggr="mean")
        self.conv2 = GraphConv(8, CLASSES)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x, edge_index))
        return self.conv2(F.elu(x), edge_index)


class Transformer(nn.Module):
    def __init__(self, edge_dim: int | None = None) -> None:
        super().__init__()
        self.conv1 = TransformerConv(FEATURES, 4, heads=2, edge_dim=edge_dim)
        self.conv2 = TransformerConv(8, CLASSES, heads=2, concat=False, beta=True,
                                     edge_dim=edge_dim)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                edge_attr: torch.Tensor | None = None) -> torch.Tensor:
        x = self.conv1(x, edge_index, edge_attr).relu()
        return self.conv2(x, edge_index, edge_attr)


class GINE(nn.Module):
    """GINEConv layers, whose messages read the edges' features."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = GINEConv(nn.Sequential(nn.Linear(FEATURES, 8), nn.ReLU(), nn.Linear(8, 8)),
                              edge_dim=EDGE_DIM)
        self.conv2 = GINEConv(nn.Linear(8, CLASSES), edge_dim=EDGE_DIM)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor,
                edge_attr: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x, edge_index, edge_attr).relu(), edge_index, edge_attr)


def make_model(kind: str) -> nn.Module:
    torch.manual_seed(0)
    if kind == "gcnii":
        model = GCNII()
    elif kind.startswith("gin_"):  # batch norm inside each GINConv's MLP and after it
        model = GIN(FEATURES, 8, 2, CLASSES, norm="batch_norm")
    elif kind.startswith("gatv2"):
        model = GAT(FEATURES, 4, 2, CLASSES, heads=2, v2=True)
    elif kind == "transformer":
        model = Transformer()
    elif kind == "transformer_edge":
        model = Transformer(edge_dim=EDGE_DIM)
    elif kind == "gine":
        model = GINE()
    elif kind.startswith("gat_edge_attr"):
        model = GAT(FEATURES, 4, 2, CLASSES, heads=2, edge_dim=EDGE_DIM)
    elif kind.startswith("graphconv"):
        model = FunctionalGraphConv()
    elif kind.startswith("gcn"):
        model = GCN(FEATURES, 8, 2, CLASSES, improved=kind.endswith("improved"),
                    norm="batch_norm" if "batch_norm" in kind else None)
    elif kind.startswith("sage"):
        model = GraphSAGE(FEATURES, 8, 2, CLASSES)
    else:
        model = GAT(FEATURES, 4, 2, CLASSES, heads=2)
    if kind.endswith("_twin"):
        gnnact.convert(model, gnnact.Config(bits=32))
    return model.double()


def train(model: nn.Module, x, edge_index, y, mask, count, after_backward=lambda: None,
          edge: dict | None = None):
    """Loss, output and gradients of the first step, parameters and buffers after STEPS SGD
    steps; the loss is the sum over ``mask`` divided by ``count`` (the global number of
    nodes); ``edge``: the edge attributes the model is called with."""
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    first = None
    for _ in range(STEPS):
        opt.zero_grad()
        out = model(x, edge_index, **(edge or {}))
        loss = F.cross_entropy(out[mask], y[mask], reduction="sum") / count
        loss.backward()
        after_backward()
        if first is None:
            grads = {n: p.grad.clone() for n, p in model.named_parameters()}
            first = (loss.detach().clone(), out.detach(), grads)
        opt.step()
    return (*first, {n: t.clone() for n, t in model.state_dict().items()})


# ------------------------------------------------------------------- the ranks' side

def _exact(shard, group) -> dict:
    results = {}
    for kind in KINDS:
        model = DistributedGNN(make_model(kind), shard, group)
        mask = shard.train_mask
        loss, out, grads, params = train(model, shard.x, shard.edge_index, shard.y, mask,
                                         model.global_count(mask), model.all_reduce_gradients,
                                         edge_kwargs(kind, shard))
        results[kind] = {"loss": model.all_reduce(loss), "out": out,
                         "grads": {n.removeprefix("module."): g for n, g in grads.items()},
                         "params": {n.removeprefix("module."): p for n, p in params.items()}}
        model.remove()
    return results


def _unbiased(shard, group) -> dict:
    x = torch.randn(NUM_NODES, WIDE, generator=torch.Generator().manual_seed(1))
    grad = torch.randn(shard.num_local, WIDE,
                       generator=torch.Generator().manual_seed(100 + shard.rank))
    exact, quantized = HaloExchange(shard, group), HaloExchange(shard, group, bits=2)
    owned = x[shard.owned]
    # COPIES side by side in each of ROUNDS exchanges: every value is rounded with noise of
    # its own, so these are SAMPLES independent draws (one exchange costs ~20 ms of gloo
    # latency on a loaded 2-core machine, whatever its size).
    mean_x = sum(quantized.gather(owned.repeat(1, COPIES)).view(-1, COPIES, WIDE).sum(1)
                 for _ in range(ROUNDS)) / SAMPLES
    mean_g = sum(quantized.scatter_add(grad.repeat(1, COPIES)).view(-1, COPIES, WIDE).sum(1)
                 for _ in range(ROUNDS)) / SAMPLES
    g_range = torch.stack([grad.max(), -grad.min()])
    dist.all_reduce(g_range, op=dist.ReduceOp.MAX, group=group)
    return {"x_exact": exact.gather(owned), "x_once": quantized.gather(owned), "x_mean": mean_x,
            "x_range": float(x.max() - x.min()),
            "g_exact": exact.scatter_add(grad), "g_mean": mean_g,
            "g_range": float(g_range.sum())}


def _bytes(shard, group) -> dict:
    x = torch.randn(shard.num_owned, WIDE, requires_grad=True)
    stats = {}
    for bits in (32, 2):
        exchange = HaloExchange(shard, group, bits=bits)
        exchange(x).sum().backward()
        stats[bits] = exchange.stats
    return stats


def _ddp(shard, group) -> dict:
    """The DDP recipe: a converted model, the halo on a group of its own, gradients summed."""
    halo_group = dist.new_group(list(range(dist.get_world_size())))
    torch.manual_seed(shard.rank)  # different initial weights: DDP must broadcast rank 0's
    model = gnnact.convert(GCN(FEATURES, 8, 2, CLASSES, dropout=0.5), gnnact.Config(bits=2))
    ddp = DistributedDataParallel(DistributedGNN(model, shard, halo_group, exchange_bits=2,
                                                 broadcast_parameters=False))
    ddp.register_comm_hook(None, sum_gradients_hook)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.05)
    x, mask = shard.x.float(), shard.train_mask
    count = ddp.module.global_count(mask)
    first = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    for _ in range(3):
        opt.zero_grad()
        out = ddp(x, shard.edge_index)
        F.cross_entropy(out[mask], shard.y[mask], reduction="sum").div(count).backward()
        opt.step()
    flat = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    return {"params": gathered, "moved": float((flat - first).abs().max()),
            "bytes": ddp.module.exchange.stats}


def _train_gin(shard, group, config: gnnact.Config, exchange_bits: int,
               steps: int) -> tuple[nn.Module, list[float], int]:
    """A GIN (a conv with no twin: the generic pipeline keeps its context; 256 wide, as the
    pipeline leaves tensors of fewer than 4,096 values as they are) converted with ``config``
    and trained on the pairs for ``steps`` Adam steps: the model, the global loss of each step
    and what the first step keeps."""
    torch.manual_seed(0)
    model = gnnact.convert(GIN(FEATURES, 256, 2, CLASSES, norm="batch_norm"), config)
    dmodel = DistributedGNN(model, shard, group, exchange_bits=exchange_bits)
    opt = torch.optim.Adam(dmodel.parameters(), lr=0.05)
    x, mask = shard.x.float(), shard.train_mask
    count = dmodel.global_count(mask)
    losses, saved = [], 0
    for step in range(steps):
        opt.zero_grad()
        out = dmodel(x, shard.edge_index)
        loss = F.cross_entropy(out[mask], shard.y[mask], reduction="sum") / count
        if step == 0:
            saved = saved_bytes(loss, exclude=[x])
        loss.backward()
        dmodel.all_reduce_gradients()
        opt.step()
        losses.append(float(dmodel.all_reduce(loss.detach().clone())))
    dmodel.remove()
    return model, losses, saved


def _compressed_pairs(shard, group) -> dict:
    """The GIN at 32 and at 2 bits (context and exchange): what it keeps, and its losses."""
    result = {}
    for bits in (32, 2):
        _, result[f"losses{bits}"], result[f"saved{bits}"] = _train_gin(
            shard, group, gnnact.Config(bits=bits), bits, steps=6)
    return result


def _automatic(shard, group) -> dict:
    """The GIN converted with the default Config(): automatic widths, probes inside backward,
    on each rank (a probe runs no collective twice)."""
    model, losses, _ = _train_gin(shard, group, gnnact.Config(), 8, steps=12)
    auto = scope_of(model).auto
    return {"losses": losses, "probes": auto.probes,
            "tensors": {name: (t.bits, t.measured, t.unmeasurable)
                        for name, t in auto.tensors.items()}}


def _norm(shard, group) -> dict:
    norm = GlobalGCNNorm(HaloExchange(shard, group))
    ids = torch.cat([shard.owned, shard.halo])  # local id -> global id
    return {"edges": ids[norm.edge_index], "weight": norm.edge_weight(torch.float32)}


def _errors(shard, group) -> dict:
    messages = {}
    plain = GCN(FEATURES, 8, 2, CLASSES, norm="batch_norm").double()
    DistributedGNN(plain, shard).remove()
    bn = plain.norms[0].module
    messages["removed"] = ("forward" not in vars(bn) and not plain.convs[0]._forward_pre_hooks
                           and not plain.convs[0]._forward_hooks)
    model = DistributedGNN(GCN(FEATURES, 8, 2, CLASSES).double(), shard)
    try:
        model(shard.x, shard.edge_index.clone())
    except ValueError as error:
        messages["edge_index"] = str(error)
    try:  # weights, but not the shard's own (a copy: nothing says it is in local order)
        model(shard.x, shard.edge_index, edge_weight=shard.edge_weight.clone())
    except ValueError as error:
        messages["edge_weight"] = str(error)
    model = DistributedGNN(PointNetConv(nn.Linear(FEATURES + 2, 8)).double(), shard)
    try:
        model(shard.x, shard.x[:, :2], shard.edge_index)
    except ValueError as error:
        messages["pos"] = str(error)
    return messages


def make_stack() -> nn.Module:
    """gnnact's GCN stack with BatchNorm and no dropout (dropout draws its masks per rank)."""
    torch.manual_seed(0)
    return build("gcn", FEATURES, CLASSES, hidden=8, layers=3, dropout=0.0).double()


def make_weighted() -> nn.Module:
    """PyG's GCN class, which takes ``edge_weight`` by keyword, converted."""
    torch.manual_seed(0)
    return gnnact.convert(GCN(FEATURES, 8, 2, CLASSES).double(), gnnact.Config(bits=32))


def _train(shard, group) -> dict:
    out = {}
    for name, make, edge_attrs in (("stack", make_stack, ()),
                                   ("weighted", make_weighted, ("edge_weight",))):
        model = DistributedGNN(make(), shard, group)
        result = train_partitioned(model, epochs=EPOCHS, lr=LR, edge_attrs=edge_attrs)
        params = {n.removeprefix("module."): p for n, p in model.state_dict().items()}
        model.remove()
        out[name] = {"result": result, "params": params}
    return out


def _worker(rank: int, world_size: int, data: Data, tasks: tuple[str, ...]) -> dict:
    shard = shard_graph(data, method="random", seed=world_size)
    run = {"exact": _exact, "unbiased": _unbiased, "bytes": _bytes, "ddp": _ddp,
           "errors": _errors, "norm": _norm, "train": _train, "pairs": _compressed_pairs,
           "auto": _automatic}
    return {"shard": shard, **{task: run[task](shard, None) for task in tasks}}


@pytest.fixture(scope="module")
def data() -> Data:
    return make_data()


@pytest.fixture(scope="module")
def ranks2(data) -> list[dict]:
    return run_local(_worker, 2, data, ("exact", "unbiased", "bytes", "ddp", "errors", "train",
                                        "pairs", "auto"), start_method="fork", timeout_s=60)


@pytest.fixture(scope="module")
def ranks4(data) -> list[dict]:
    return run_local(_worker, 4, data, ("exact", "unbiased", "bytes", "norm"),
                     start_method="fork", timeout_s=60)


# ---------------------------------------------------------------------- partitioning

@pytest.mark.parametrize("method", ["contiguous", "random"])
@pytest.mark.parametrize("k", [1, 3, 7])
def test_partition_is_balanced_and_deterministic(method, k):
    edge_index = torch.randint(0, 50, (2, 200))
    parts = partition_nodes(edge_index, 50, k, method, seed=3)
    counts = torch.bincount(parts, minlength=k)
    assert parts.shape == (50,) and int(parts.max()) == k - 1
    assert set(counts.tolist()) <= {50 // k, -(-50 // k)}
    assert torch.equal(parts, partition_nodes(edge_index, 50, k, method, seed=3))


def test_partition_errors():
    edge_index = torch.tensor([[0, 1], [1, 2]])
    with pytest.raises(ValueError, match="num_parts must be in .*got 4"):
        partition_nodes(edge_index, 3, 4, "contiguous")
    with pytest.raises(ValueError, match="method must be one of .*'spectral'"):
        partition_nodes(edge_index, 3, 2, "spectral")
    with pytest.raises(ValueError, match=r"outside \[0, num_nodes=2\)"):
        partition_nodes(edge_index, 2, 2, "contiguous")
    if not metis_available():
        with pytest.raises(ValueError, match="method='metis' needs METIS"):
            partition_nodes(edge_index, 3, 2, "metis")


@pytest.mark.skipif(not metis_available(), reason="no METIS (torch-sparse or pymetis)")
def test_metis_partition_cuts_fewer_edges_than_random():
    data = synthetic_graph(400, 6.0, 4, 4, seed=0, homophily=0.99)
    src, dst = data.edge_index

    def cut(parts):
        return int((parts[src] != parts[dst]).sum())

    assert cut(partition_nodes(data.edge_index, 400, 4)) < cut(
        partition_nodes(data.edge_index, 400, 4, "random"))


@pytest.mark.parametrize("k", [2, 3, 5])
def test_shards_cover_the_graph_exactly(data, k):
    parts = partition_nodes(data.edge_index, NUM_NODES, k, "random", seed=k)
    shards = [build_shard(data, parts, r) for r in range(k)]
    owned = torch.cat([s.owned for s in shards])
    assert torch.equal(owned.sort().values, torch.arange(NUM_NODES))  # each node once
    edges = set()
    for s in shards:
        assert torch.equal(s.x, data.x[s.owned]) and torch.equal(s.y, data.y[s.owned])
        ids = torch.cat([s.owned, s.halo])  # local id -> global id
        src, dst = ids[s.edge_index]
        assert bool((dst == s.owned[s.edge_index[1]]).all())  # every edge into an owned node
        edges |= set(zip(src.tolist(), dst.tolist(), strict=True))
        # The halo is exactly the remote sources of edges into owned nodes, by owner then id.
        into = parts[data.edge_index[1]] == s.rank
        # The edge attributes follow the local edges, in the original order; the attributes
        # are listed by name (every rank in the same order, whatever its string hashing).
        assert list(s.edge_attrs) == ["edge_attr", "edge_weight"]
        assert list(s.node_attrs) == sorted(s.node_attrs)
        for name in ("edge_weight", "edge_attr"):
            assert torch.equal(getattr(s, name), data[name][into])
        remote = data.edge_index[0][into][parts[data.edge_index[0][into]] != s.rank]
        assert torch.equal(s.halo.sort().values, remote.unique())
        owners = parts[s.halo]
        assert torch.equal(owners, owners.sort().values)
        assert s.recv_counts == {q: int((owners == q).sum()) for q in owners.unique().tolist()}
        # What each peer sends is what this shard stores for it, in the same order.
        start = s.num_owned
        for q, count in sorted(s.recv_counts.items()):
            sent = shards[q].owned[shards[q].send_index[s.rank]]
            assert torch.equal(sent, s.halo[start - s.num_owned:start - s.num_owned + count])
            start += count
    assert edges == set(zip(*data.edge_index.tolist(), strict=True))
    assert sum(s.edge_index.size(1) for s in shards) == data.edge_index.size(1)


# ----------------------------------------------------------------------------- codec

@pytest.mark.parametrize("bits", [1, 2, 3, 8, 16, 32])
def test_codec_round_trip_and_bytes(bits):
    x = torch.randn(37, 29)
    payload = encode(x, bits, 256)
    assert payload.dtype == torch.uint8
    assert payload.numel() == payload_nbytes(x.numel(), x.dtype, bits, 256)
    restored = decode(payload, x.shape, x.dtype, bits, 256)
    assert restored.shape == x.shape and restored.dtype == x.dtype
    if bits == 32:
        assert torch.equal(restored, x) and payload.numel() == 4 * x.numel()
    elif bits == 16:
        assert torch.equal(restored, x.bfloat16().float())
    else:  # within one quantization step of the value, per group of 256
        groups = x.flatten().split(256)
        step = torch.cat([(g.max() - g.min()).expand(g.numel()) for g in groups]) / (2**bits - 1)
        assert bool(((restored - x).flatten().abs() <= step * (1 + 1e-5)).all())
        n_g = -(-x.numel() // 256)
        assert payload.numel() == n_g * (math.ceil(256 * bits / 8) + 8)


def test_codec_rejects_a_wrong_payload():
    with pytest.raises(ValueError, match="payload has 10 bytes, expected 16"):
        decode(torch.zeros(10, dtype=torch.uint8), (2, 2), torch.float32, 32)


def test_argument_errors(data):
    parts = partition_nodes(data.edge_index, NUM_NODES, 2, "contiguous")
    shard = build_shard(data, parts, 0)
    with pytest.raises(ValueError, match="bits must be one of .*got 0"):
        HaloExchange(shard, bits=0)
    with pytest.raises(ValueError, match="grad_bits must be one of .*got 12"):
        HaloExchange(shard, grad_bits=12)
    with pytest.raises(ValueError, match=r"rank must be an int in \[0, 2\), got 2"):
        build_shard(data, parts, 2)
    with pytest.raises(AttributeError, match="no attribute or node attribute 'z'"):
        _ = shard.z
    with pytest.raises(TypeError, match="<model> \\(ChebConv\\) is not supported: it takes "
                       "no \\(source, target\\) pair"):
        DistributedGNN(ChebConv(FEATURES, 8, K=2), shard)
    with pytest.raises(TypeError, match="flow='target_to_source' aggregates along outgoing"):
        DistributedGNN(GINConv(nn.Linear(FEATURES, 8), flow="target_to_source"), shard)
    with pytest.raises(ValueError, match="message-passing layer"):
        DistributedGNN(nn.Linear(FEATURES, 8), shard)
    with pytest.raises(TypeError, match="norms.0 \\(GraphNorm\\) normalises over all nodes"):
        DistributedGNN(GCN(FEATURES, 8, 2, norm="graph_norm"), shard)
    with pytest.raises(TypeError, match="norms.0 \\(LayerNorm\\) normalises over all nodes"):
        DistributedGNN(GCN(FEATURES, 8, 2, norm="layer_norm", norm_kwargs={"mode": "graph"}),
                       shard)


# ------------------------------------------------------------- k ranks = one process

def _reference(data: Data, kind: str):
    model = make_model(kind)
    mask = data.train_mask
    return train(model, data.x, data.edge_index, data.y, mask, int(mask.sum()),
                 edge=edge_kwargs(kind, data))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("world", ["ranks2", "ranks4"])
def test_exact_at_32_bits(request, data, world, kind):
    ranks = request.getfixturevalue(world)
    loss, out, grads, params = _reference(data, kind)
    for rank in ranks:
        got = rank["exact"][kind]
        # float64: only the summation order differs from the single process.
        torch.testing.assert_close(got["loss"], loss, rtol=1e-12, atol=0)
        torch.testing.assert_close(got["out"], out[rank["shard"].owned], rtol=1e-10, atol=1e-12)
        for name, grad in grads.items():
            torch.testing.assert_close(got["grads"][name], grad, rtol=1e-10, atol=1e-12)
        for name, param in params.items():
            torch.testing.assert_close(got["params"][name], param, rtol=1e-10, atol=1e-12)


@pytest.mark.cuda
def test_nccl_on_a_gpu_is_the_single_process_step(data, tmp_path):
    """The partitioned model on CUDA tensors under NCCL: one rank (NCCL wants a GPU per rank,
    and the test machine has one), its shard moved with GraphShard.to; every all-reduce
    (loss count, gradients, synchronised BatchNorm) goes through NCCL. At 32 bits the step is
    the single-process one."""
    device = torch.device("cuda")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0,
                            world_size=1)
    try:
        shard = shard_graph(data, method="contiguous").to(device)
        assert shard.edge_index.device.type == "cuda" and shard.x.device.type == "cuda"
        for kind in ("gcn", "gcn_batch_norm_twin", "sage_twin", "gat", "gcnii"):
            loss, out, grads, _ = _reference(data, kind)
            model = DistributedGNN(make_model(kind).to(device), shard)
            mask = shard.train_mask
            got = train(model, shard.x, shard.edge_index, shard.y, mask,
                        model.global_count(mask), model.all_reduce_gradients)
            torch.testing.assert_close(got[0].cpu(), loss, rtol=1e-10, atol=0)
            torch.testing.assert_close(got[1].cpu(), out[shard.owned.cpu()], rtol=1e-9,
                                       atol=1e-12)
            for name, grad in got[2].items():
                torch.testing.assert_close(grad.cpu(), grads[name.removeprefix("module.")],
                                           rtol=1e-9, atol=1e-12)
            model.remove()
    finally:
        dist.destroy_process_group()


def test_shards_move_between_devices(data):
    shard = build_shard(data, partition_nodes(data.edge_index, NUM_NODES, 2, "contiguous"), 0)
    moved = shard.to("meta")
    tensors = [moved.owned, moved.halo, moved.edge_index, *moved.send_index.values(),
               *moved.node_attrs.values()]
    assert all(t.is_meta for t in tensors)
    assert shard.edge_index.device.type == "cpu"  # the original stays
    assert (moved.rank, moved.recv_counts) == (shard.rank, shard.recv_counts)
    with pytest.raises(ValueError, match="backend must be 'gloo' or 'nccl', got 'mpi'"):
        run_local(_worker, 1, data, (), backend="mpi")


@pytest.mark.parametrize("world", ["ranks2", "ranks4"])
def test_two_bit_exchange_is_unbiased(request, world):
    """Stochastic rounding puts each received value x̂ in [lo, lo + s], s = R_group / 3 <= R / 3
    (R: the range over all values sent), with E[x̂] = x and Var[x̂] <= s² / 4. Per value,
    Hoeffding bounds the mean of n independent draws: P(|mean - x| > t) <= 2 exp(-2 n t² / s²);
    over all M values with a 1e-6 failure probability, t = s sqrt(ln(2M / 1e-6) / (2n)). Rounding
    to nearest would miss values by up to s / 2, several times t."""
    ranks = request.getfixturevalue(world)
    k = len(ranks)
    for rank in ranks:
        n_owned = rank["shard"].num_owned
        for key, width in (("x", 1), ("g", k - 1)):  # a gradient sums up to k - 1 peers' rows
            exact, mean = rank["unbiased"][f"{key}_exact"], rank["unbiased"][f"{key}_mean"]
            if key == "x":
                # The own rows are passed through, never rounded.
                assert torch.equal(rank["unbiased"]["x_once"][:n_owned], exact[:n_owned])
                exact, mean = exact[n_owned:], mean[n_owned:]
            assert exact.numel() > 0
            s = width * rank["unbiased"][f"{key}_range"] / 3
            t = s * math.sqrt(math.log(2 * exact.numel() / 1e-6) / (2 * SAMPLES))
            err = (mean - exact).abs()
            assert float(err.max()) <= t, (key, float(err.max()), t)
            # All errors together: their mean has standard deviation <= s / (2 sqrt(M n)).
            bound = 6 * s / (2 * math.sqrt(exact.numel() * SAMPLES))
            assert abs(float((mean - exact).mean())) <= bound


@pytest.mark.parametrize("world", ["ranks2", "ranks4"])
def test_two_bit_exchange_sends_over_8x_fewer_bytes(request, world):
    for rank in request.getfixturevalue(world):
        shard, stats = rank["shard"], rank["bytes"]
        sent = [index.numel() * WIDE for index in shard.send_index.values()]
        received = [count * WIDE for count in shard.recv_counts.values()]

        def packed(n):  # groups of min(512, n) values: 2-bit codes + float32 scale and zero
            g = min(512, n)
            return -(-n // g) * (-(-g * 2 // 8) + 8)

        assert stats[32].forward_bytes == 4 * sum(sent)
        assert stats[32].backward_bytes == 4 * sum(received)
        assert stats[2].forward_bytes == sum(map(packed, sent))
        assert stats[2].backward_bytes == sum(map(packed, received))
        assert stats[2].forward_messages == stats[32].forward_messages == len(sent)
        assert 8 * stats[2].total_bytes <= stats[32].total_bytes


def test_global_gcn_normalisation_is_bitwise_pyg(data, ranks4):
    """Each rank's edge weights equal PyG's gcn_norm on the whole graph, bit for bit, and the
    ranks' edges together are the whole normalised graph (self-loops included)."""
    edge_index, weight = gcn_norm(data.edge_index, None, NUM_NODES, dtype=torch.float32)
    key = edge_index[0] * NUM_NODES + edge_index[1]
    key, order = key.sort()
    keys = []
    for rank in ranks4:
        src, dst = rank["norm"]["edges"]
        mine = src * NUM_NODES + dst
        assert torch.equal(rank["norm"]["weight"], weight[order][torch.searchsorted(key, mine)])
        keys.append(mine)
    assert torch.equal(torch.cat(keys).sort().values, key)


def test_ddp_recipe_keeps_ranks_identical(ranks2):
    for rank in ranks2:
        first, *others = rank["ddp"]["params"]
        for other in others:
            assert torch.equal(first, other)
        assert rank["ddp"]["moved"] > 0  # the steps did change the parameters
        assert rank["ddp"]["bytes"].backward_bytes > 0  # the halo gradients travelled


@pytest.mark.parametrize("name", ["stack", "weighted"])
def test_train_partitioned_is_train_full_batch(data, ranks2, name):
    # weighted: the model is called with the shard's edge weights (edge_attrs), as the whole
    # graph's run is with the graph's: the same run at 32 bits.
    make, edge_attrs = {"stack": (make_stack, ()),
                        "weighted": (make_weighted, ("edge_weight",))}[name]
    model = make()
    ref = train_full_batch(model, data, epochs=EPOCHS, lr=LR, edge_attrs=edge_attrs)
    for rank in ranks2:
        got = rank["train"][name]["result"]
        # The whole graph's metrics from the gathered rows: the single-process numbers.
        assert (got.test_acc, got.best_val_acc) == (ref.test_acc, ref.best_val_acc)
        assert got.world_size == 2 and got.exchanged_bytes > 0 and got.saved_bytes > 0
        # BatchNorm's running stats included. atol: a conv bias before BatchNorm has a zero
        # gradient up to round-off, which Adam scales by 1 / (sqrt(v) + 1e-8) into ~1e-8 steps.
        for key, value in model.state_dict().items():
            torch.testing.assert_close(rank["train"][name]["params"][key], value, rtol=1e-10,
                                       atol=1e-6)
    if edge_attrs:  # the weights did count: without them the run differs
        unweighted = make()
        train_full_batch(unweighted, data, epochs=EPOCHS, lr=LR)
        assert not all(torch.allclose(a, b) for a, b in zip(
            unweighted.state_dict().values(), model.state_dict().values(), strict=True))


def test_train_partitioned_errors(data):
    with pytest.raises(TypeError, match="model must be a DistributedGNN, got GCN"):
        train_partitioned(GCN(FEATURES, 8, 2, CLASSES), epochs=1)
    with pytest.raises(ValueError, match="epochs must be a positive int, got 0"):
        train_partitioned(None, epochs=0)


def test_convs_without_a_twin_train_compressed_on_pairs(ranks2):
    """A converted GIN at 2 bits (context and exchange): its context shrinks as on one
    process, the ranks agree on the global loss, and it falls."""
    first, second = (rank["pairs"] for rank in ranks2)
    assert first["losses2"] == second["losses2"] and first["losses32"] == second["losses32"]
    for result in (first, second):
        assert result["saved2"] * 5 < result["saved32"]
        assert result["losses2"][-1] < 0.9 * result["losses2"][0]
        assert all(math.isfinite(loss) for loss in result["losses2"])


def test_automatic_widths_train_on_pairs(ranks2):
    """Default Config() under DistributedGNN: probes re-run local nodes only (a re-run of the
    synchronised batch norm's backward would wait for the other rank), the batch norms' inputs
    are kept at UNMEASURED_BITS, the rest measured; the ranks agree on the loss, and it falls."""
    first, second = (rank["auto"] for rank in ranks2)
    assert first["losses"] == second["losses"]
    assert first["losses"][-1] < 0.9 * first["losses"][0]
    for result in (first, second):
        assert result["probes"] >= 3
        tensors = result["tensors"]
        assert {name for name, (_, _, unmeasurable) in tensors.items() if unmeasurable}
        for bits, measured, unmeasurable in tensors.values():
            assert (bits == UNMEASURED_BITS) if unmeasurable else (measured is not None)


def test_errors_in_the_ranks(ranks2):
    for rank in ranks2:
        messages = rank["errors"]
        assert "edge_index must be shard.edge_index itself" in messages["edge_index"]
        assert messages["edge_weight"].startswith(
            "DistributedGNN: convs.0 (GCNConv): edge_weight must be one of the shard's edge "
            "attributes itself, the values of its local edges in shard.edge_index's order "
            "(shard.edge_attr, shard.edge_weight), got (")
        assert messages["pos"] == ("DistributedGNN: <model> (PointNetConv): only x and "
                                   "edge_index are exchanged, got the tensor argument(s) pos")
        assert messages["removed"]  # remove() leaves the model as it was


# ------------------------------------------------------------------- documentation

@pytest.mark.parametrize("name", gnnact.distributed.__all__)
def test_public_api_is_documented(name):
    """The project's API documentation rule (tests/test_docstrings.py) for this package."""
    import test_docstrings as rules

    obj = getattr(gnnact.distributed, name)
    if not callable(obj):
        return
    doc = rules._doc(obj)
    assert "Example" in doc
    missing = [arg for arg in rules._parameters(obj)
               if not re.search(rf"^\s*\**{re.escape(arg)} \(", doc, re.MULTILINE)]
    assert not missing, f"{name}: no 'name (type): ...' entry for {missing}"
