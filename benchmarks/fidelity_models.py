"""The model families of the fidelity suite (:mod:`bench_fidelity`), each written as its users
write it and trained with its own usual recipe: optimizer, schedule, dropout, auxiliary
losses. gnnact plays no part here: the suite converts a copy of each model.

Each family after a PyG example or a published recipe, on a real graph where one fits
(Planetoid, Amazon, heterophilous, from ``$GNNACT_DATA``) and a synthetic one where none does
(graph classification, heterogeneous graphs, a graph transformer's node task):

============  ==============================================================================
family        model and recipe
============  ==============================================================================
gcn           ``examples/gcn.py``: 2 ``GCNConv``, dropout 0.5, Adam 0.01 (weight decay on the
              first layer only); Cora
sage          2 ``SAGEConv`` (256), ``F.relu``/dropout 0.5, Adam 0.01; Amazon Photo
gat           ``examples/gat.py``: ``GATConv`` 8×8 heads, ELU, dropout 0.6, Adam 0.005; Cora
gcnii         ``examples/gcn2_cora.py`` at 16 layers: ``GCN2Conv`` (α 0.1, θ 0.5, shared
              weights), GCN-normalised edge weights, dropout 0.6, two weight decays; Cora
gin           ``examples/mutag_gin.py``: 5 ``GINConv`` with PyG ``MLP`` (BatchNorm),
              ``global_add_pool``, MLP head with dropout, Adam 0.01, batches of 64 graphs
              (``DataLoader``); synthetic graphs whose class is their density
gatv2         ``GATv2Conv`` 8×8 heads, ELU, dropout 0.6, Adam 0.005; CiteSeer
transformer   UniMP-style ``TransformerConv`` (4 heads, ``beta``), ``LayerNorm``, dropout
              0.5, Adam 0.005; Amazon Photo
gps           ``GPSConv`` ×3 (``GINEConv`` + 4-head attention, edge features), Adam 0.005,
              ``ReduceLROnPlateau``; synthetic graph (2,000 nodes)
supergat      ``examples/super_gat.py``: ``SuperGATConv`` MX attention, self-supervised
              attention loss ×4, Adam 0.005; Cora
mixhop        ``examples/mixhop.py``: ``MixHopConv`` ×3 with ``BatchNorm``, dropout 0.7–0.9,
              SGD 0.5 + ``StepLR``; Cora (raw features)
cheb          ``citation/cheb.py``: ``ChebConv`` (K 3), dropout 0.5, Adam 0.01; CiteSeer
deepergcn     4 ``DeepGCNLayer`` res+ blocks of ``GENConv`` (softmax aggregation, learnable
              temperature) with ``LayerNorm``, Adam 0.005; Minesweeper (heterophilous, ROC AUC)
hetero        ``to_hetero`` of a 2-layer ``SAGEConv`` model (``aggr="sum"``), Adam 0.01;
              synthetic paper/author graph
gae           ``examples/autoencoder.py``: GAE with a 2-layer ``GCNConv`` encoder, inner
              product decoder, negative sampling, ``RandomLinkSplit``; Cora (test AUC)
appnp         ``citation/appnp.py``: MLP + ``APPNP`` (K 10, α 0.1), dropout 0.5, Adam 0.01;
              CiteSeer
============  ==============================================================================

A family's ``run`` trains a model for ``epochs`` and returns its metric (test accuracy at the
best validation epoch, or as the recipe reports it), its final training loss, and the calls of
``meter`` that let the suite time each step and weigh what it kept.
"""

from __future__ import annotations

import copy
import math
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import torch_geometric.transforms as T
from torch import Tensor, nn
from torch_geometric.data import Data, HeteroData
from torch_geometric.datasets import Planetoid
from torch_geometric.loader import DataLoader
from torch_geometric.nn import (
    APPNP,
    MLP,
    BatchNorm,
    ChebConv,
    DeepGCNLayer,
    GATConv,
    GATv2Conv,
    GCN2Conv,
    GCNConv,
    GENConv,
    GINConv,
    GINEConv,
    GPSConv,
    LayerNorm,
    Linear,
    MixHopConv,
    SAGEConv,
    SuperGATConv,
    TransformerConv,
    global_add_pool,
    to_hetero,
)
from torch_geometric.nn.conv.gcn_conv import gcn_norm
from torch_geometric.utils import negative_sampling

from gnnact.data import load_dataset, synthetic_graph

__all__ = ["FAMILIES", "Family", "Meter", "roc_auc"]


class Meter:
    """What a family's training loop reports to the suite: :meth:`forward` with the loss of
    each training step before its backward, :meth:`step` after the optimizer's step."""

    def forward(self, loss: Tensor, inputs: tuple[Tensor, ...] = ()) -> None:
        """``inputs``: the step's own input tensors beyond the family's data (a batch)."""

    def step(self) -> None:
        pass


@dataclass(frozen=True)
class Family:
    """A model family: its data, its model and its training recipe."""

    name: str
    load: Callable[[Path, str, int], object]  # (datasets root, workdir, seed) -> data
    build: Callable[[object], nn.Module]  # data -> model
    train: Callable[[nn.Module, object, int, Meter], tuple[float, float]]  # -> metric, loss
    epochs: int  # the recipe's (or fewer where the CPU is slow)
    quick_epochs: int  # the CI slice's
    metric: str  # "acc" or "auc"
    dataset: str
    # What torch.compile compiles: the model, or for a recipe that calls a method other than
    # forward (GAE's encode), the submodule that method calls.
    compiled: Callable[[nn.Module], nn.Module] = torch.compile


# ------------------------------------------------------------------ data


def _planetoid(name: str, normalize: bool = True) -> Callable[[Path, str, int], Data]:
    def load(root: Path, workdir: str, seed: int) -> Data:
        folder = Path(workdir) / "planetoid"
        if not folder.exists():  # PyG writes processed/ beside raw/: a copy, not the root
            # (without a processed/ cache the collection may carry: this PyG rebuilds it)
            shutil.copytree(root / "planetoid", folder,
                            ignore=shutil.ignore_patterns("processed"))
        transform = T.NormalizeFeatures() if normalize else None
        return Planetoid(str(folder), name, transform=transform)[0]
    return load


def _named(name: str) -> Callable[[Path, str, int], Data]:
    def load(root: Path, workdir: str, seed: int) -> Data:
        data = load_dataset(name, root, seed=seed, download=False, workdir=workdir)
        if data.train_mask.dim() == 2:  # (several given splits: the first)
            data.train_mask, data.val_mask, data.test_mask = (
                m[:, 0] for m in (data.train_mask, data.val_mask, data.test_mask))
        return data
    return load


def _synthetic(num_nodes: int, features: int, classes: int, edge_dim: int = 0
               ) -> Callable[[Path, str, int], Data]:
    def load(root: Path, workdir: str, seed: int) -> Data:
        data = synthetic_graph(num_nodes, 8, features, classes, homophily=0.7,
                               feature_signal=0.7, seed=seed)
        if edge_dim:
            g = torch.Generator().manual_seed(seed + 1)
            data.edge_attr = torch.randn(data.edge_index.size(1), edge_dim, generator=g)
        return data
    return load


def _density_graphs(root: Path, workdir: str, seed: int) -> dict[str, list[Data]]:
    """Graphs of 12–30 nodes, three classes by average degree (2, 3.5, 5), one-hot degree
    features (capped at 10): a graph-classification task a GIN learns but not at once."""
    g = torch.Generator().manual_seed(seed)
    graphs = []
    for i in range(900):
        label = i % 3
        n = int(torch.randint(12, 31, (1,), generator=g))
        m = int(n * (2.0 + 1.5 * label) / 2 * (0.8 + 0.4 * float(torch.rand(1, generator=g))))
        src = torch.randint(0, n, (m,), generator=g)
        dst = torch.randint(0, n, (m,), generator=g)
        keep = src != dst
        edge_index = torch.stack([torch.cat([src[keep], dst[keep]]),
                                  torch.cat([dst[keep], src[keep]])])
        degree = torch.bincount(edge_index[0], minlength=n).clamp(max=10)
        graphs.append(Data(x=F.one_hot(degree, 11).float(), edge_index=edge_index,
                           y=torch.tensor([label])))
    order = torch.randperm(len(graphs), generator=g).tolist()
    graphs = [graphs[i] for i in order]
    return {"train": graphs[:600], "val": graphs[600:750], "test": graphs[750:]}


def _hetero_graph(root: Path, workdir: str, seed: int) -> HeteroData:
    """Papers (4 classes) written by authors and citing papers of mostly their own class;
    features: class centroids plus noise, weaker for authors."""
    g = torch.Generator().manual_seed(seed)
    papers, authors, classes = 3000, 1500, 4
    y = torch.randint(0, classes, (papers,), generator=g)
    a_y = torch.randint(0, classes, (authors,), generator=g)
    centre = torch.randn(classes, 64, generator=g)
    data = HeteroData()
    data["paper"].x = 0.5 * centre[y] + torch.randn(papers, 64, generator=g)
    data["author"].x = 0.3 * centre[a_y] + torch.randn(authors, 64, generator=g)
    data["paper"].y = y

    def same_class(src_y: Tensor, dst_y: Tensor, count: int) -> Tensor:
        src = torch.randint(0, len(src_y), (count,), generator=g)
        pools = [torch.nonzero(dst_y == c).flatten() for c in range(classes)]
        pick = torch.rand(count, generator=g) < 0.7
        cls = torch.where(pick, src_y[src], torch.randint(0, classes, (count,), generator=g))
        dst = torch.stack([pools[int(c)][int(torch.randint(0, len(pools[int(c)]), (1,),
                                                             generator=g))] for c in cls])
        return torch.stack([src, dst])

    writes = same_class(a_y, y, 9000)
    data["author", "writes", "paper"].edge_index = writes
    data["paper", "rev_writes", "author"].edge_index = writes.flip(0)
    data["paper", "cites", "paper"].edge_index = same_class(y, y, 12000)
    perm = torch.randperm(papers, generator=g)
    for name, part in (("train", perm[:1500]), ("val", perm[1500:2200]),
                       ("test", perm[2200:])):
        mask = torch.zeros(papers, dtype=torch.bool)
        mask[part] = True
        data["paper"][f"{name}_mask"] = mask
    return data


def _link_split(root: Path, workdir: str, seed: int) -> tuple[Data, Data, Data]:
    data = _planetoid("Cora")(root, workdir, seed)
    torch.manual_seed(seed)  # RandomLinkSplit draws from the global generator
    split = T.RandomLinkSplit(num_val=0.05, num_test=0.1, is_undirected=True,
                              split_labels=True, add_negative_train_samples=False)
    return split(data)


# ------------------------------------------------------------------ node classification


def _accuracy(out: Tensor, y: Tensor, mask: Tensor) -> float:
    return float((out[mask].argmax(-1) == y[mask]).float().mean())


def roc_auc(scores: Tensor, labels: Tensor) -> float:
    """ROC AUC of binary ``labels`` by ``scores``: the Mann–Whitney statistic, ties at their
    average rank (scikit-learn's value, without scikit-learn: the GPU machines lack it)."""
    scores, labels = scores.double().flatten().cpu(), labels.flatten().cpu().bool()
    order = scores.argsort()
    ranks = torch.empty_like(scores)
    ranks[order] = torch.arange(1, len(scores) + 1, dtype=torch.float64)
    uniq, inverse, counts = torch.unique(scores, return_inverse=True, return_counts=True)
    mean_rank = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inverse, ranks)
    ranks = (mean_rank / counts)[inverse]
    positives, negatives = int(labels.sum()), int((~labels).sum())
    u = float(ranks[labels].sum()) - positives * (positives + 1) / 2
    return u / (positives * negatives)


def _auc(out: Tensor, y: Tensor, mask: Tensor) -> float:
    return roc_auc(out[mask, 1], y[mask])


def _node_task(make_optimizer: Callable[[nn.Module], torch.optim.Optimizer],
               loss_of: Callable[[nn.Module, Data], Tensor] | None = None,
               scheduler: Callable | None = None, score: Callable = _accuracy,
               call: Callable[[nn.Module, Data], Tensor] | None = None) -> Callable:
    """A full-batch node-classification recipe: the test metric at the best validation
    epoch."""
    call = call or (lambda model, data: model(data.x, data.edge_index))

    def default_loss(model: nn.Module, data: Data) -> Tensor:
        out = call(model, data)
        return F.cross_entropy(out[data.train_mask], data.y[data.train_mask])

    loss_of_ = loss_of or default_loss

    def train(model: nn.Module, data: Data, epochs: int, meter: Meter) -> tuple[float, float]:
        optimizer = make_optimizer(model)
        sched = scheduler(optimizer) if scheduler is not None else None
        best_val, test, loss = -math.inf, 0.0, math.nan
        for _ in range(epochs):
            model.train()
            optimizer.zero_grad()
            loss = loss_of_(model, data)
            meter.forward(loss)
            loss.backward()
            optimizer.step()
            meter.step()
            if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                sched.step(float(loss))
            elif sched is not None:
                sched.step()
            model.eval()
            with torch.no_grad():
                out = call(model, data)
                out = out[0] if isinstance(out, tuple) else out
            val = score(out, data.y, data.val_mask)
            if val > best_val:
                best_val, test = val, score(out, data.y, data.test_mask)
        return test, float(loss)

    return train


def _adam(lr: float, weight_decay: float = 0.0) -> Callable:
    return lambda model: torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)


class GCN(nn.Module):
    def __init__(self, data: Data, hidden: int = 16) -> None:
        super().__init__()
        self.conv1 = GCNConv(data.num_features, hidden, cached=True)
        self.conv2 = GCNConv(hidden, int(data.y.max()) + 1, cached=True)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.conv1(x, edge_index).relu()
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class SAGE(nn.Module):
    def __init__(self, data: Data, hidden: int = 256) -> None:
        super().__init__()
        self.conv1 = SAGEConv(data.num_features, hidden)
        self.conv2 = SAGEConv(hidden, int(data.y.max()) + 1)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class GAT(nn.Module):
    def __init__(self, data: Data, conv: type = GATConv, hidden: int = 8, heads: int = 8
                 ) -> None:
        super().__init__()
        self.conv1 = conv(data.num_features, hidden, heads=heads, dropout=0.6)
        self.conv2 = conv(hidden * heads, int(data.y.max()) + 1, heads=1, concat=False,
                          dropout=0.6)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.6, training=self.training)
        return self.conv2(x, edge_index)


class GCNII(nn.Module):
    def __init__(self, data: Data, hidden: int = 64, layers: int = 16, alpha: float = 0.1,
                 theta: float = 0.5) -> None:
        super().__init__()
        self.lins = nn.ModuleList([Linear(data.num_features, hidden),
                                   Linear(hidden, int(data.y.max()) + 1)])
        self.convs = nn.ModuleList(
            GCN2Conv(hidden, alpha, theta, layer + 1, shared_weights=True, normalize=False)
            for layer in range(layers))

    def forward(self, x: Tensor, edge_index: Tensor, edge_weight: Tensor) -> Tensor:
        x = F.dropout(x, 0.6, training=self.training)
        x = x_0 = self.lins[0](x).relu()
        for conv in self.convs:
            x = F.dropout(x, 0.6, training=self.training)
            x = conv(x, x_0, edge_index, edge_weight).relu()
        x = F.dropout(x, 0.6, training=self.training)
        return self.lins[1](x)


def _gcnii_data(root: Path, workdir: str, seed: int) -> Data:
    data = _planetoid("Cora")(root, workdir, seed)
    data.edge_index, data.edge_weight = gcn_norm(data.edge_index, None, data.num_nodes,
                                                 add_self_loops=True)
    return data


def _gcnii_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam([dict(params=model.convs.parameters(), weight_decay=0.01),
                             dict(params=model.lins.parameters(), weight_decay=5e-4)],
                            lr=0.01)


class Transformer(nn.Module):
    def __init__(self, data: Data, hidden: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.conv1 = TransformerConv(data.num_features, hidden, heads=heads, beta=True)
        self.norm = LayerNorm(hidden * heads)
        self.conv2 = TransformerConv(hidden * heads, int(data.y.max()) + 1, heads=1, beta=True)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.relu(self.norm(self.conv1(x, edge_index)))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class GPS(nn.Module):
    def __init__(self, data: Data, hidden: int = 64, layers: int = 3, heads: int = 4) -> None:
        super().__init__()
        self.node_emb = Linear(data.num_features, hidden)
        self.edge_emb = Linear(data.edge_attr.size(1), hidden)
        self.convs = nn.ModuleList()
        for _ in range(layers):
            mlp = nn.Sequential(Linear(hidden, hidden), nn.ReLU(), Linear(hidden, hidden))
            self.convs.append(GPSConv(hidden, GINEConv(mlp), heads=heads, dropout=0.1,
                                      attn_type="multihead"))
        self.head = Linear(hidden, int(data.y.max()) + 1)

    def forward(self, x: Tensor, edge_index: Tensor, edge_attr: Tensor) -> Tensor:
        x = self.node_emb(x)
        edge_attr = self.edge_emb(edge_attr)
        for conv in self.convs:
            x = conv(x, edge_index, edge_attr=edge_attr)
        return self.head(x)


class SuperGAT(nn.Module):
    def __init__(self, data: Data) -> None:
        super().__init__()
        self.conv1 = SuperGATConv(data.num_features, 8, heads=8, dropout=0.6,
                                  attention_type="MX", edge_sample_ratio=0.8, is_undirected=True)
        self.conv2 = SuperGATConv(64, int(data.y.max()) + 1, heads=8, concat=False,
                                  dropout=0.6, attention_type="MX", edge_sample_ratio=0.8,
                                  is_undirected=True)

    def forward(self, x: Tensor, edge_index: Tensor) -> tuple[Tensor, Tensor]:
        x = F.dropout(x, p=0.6, training=self.training)
        x = F.elu(self.conv1(x, edge_index))
        att_loss = self.conv1.get_attention_loss()
        x = F.dropout(x, p=0.6, training=self.training)
        x = self.conv2(x, edge_index)
        att_loss = att_loss + self.conv2.get_attention_loss()
        return F.log_softmax(x, dim=-1), att_loss


def _supergat_loss(model: nn.Module, data: Data) -> Tensor:
    out, att_loss = model(data.x, data.edge_index)
    return F.nll_loss(out[data.train_mask], data.y[data.train_mask]) + 4.0 * att_loss


class MixHop(nn.Module):
    def __init__(self, data: Data) -> None:
        super().__init__()
        self.conv1 = MixHopConv(data.num_features, 60, powers=[0, 1, 2])
        self.norm1 = BatchNorm(3 * 60)
        self.conv2 = MixHopConv(3 * 60, 60, powers=[0, 1, 2])
        self.norm2 = BatchNorm(3 * 60)
        self.conv3 = MixHopConv(3 * 60, 60, powers=[0, 1, 2])
        self.norm3 = BatchNorm(3 * 60)
        self.lin = Linear(3 * 60, int(data.y.max()) + 1)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.dropout(x, p=0.7, training=self.training)
        x = self.norm1(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.9, training=self.training)
        x = self.norm2(self.conv2(x, edge_index))
        x = F.dropout(x, p=0.9, training=self.training)
        x = self.norm3(self.conv3(x, edge_index))
        x = F.dropout(x, p=0.9, training=self.training)
        return self.lin(x)


def _mixhop_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.5, weight_decay=0.005)


class Cheb(nn.Module):
    def __init__(self, data: Data, hidden: int = 16) -> None:
        super().__init__()
        self.conv1 = ChebConv(data.num_features, hidden, K=3)
        self.conv2 = ChebConv(hidden, int(data.y.max()) + 1, K=3)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.conv1(x, edge_index))
        x = F.dropout(x, p=0.5, training=self.training)
        return self.conv2(x, edge_index)


class DeeperGCN(nn.Module):
    def __init__(self, data: Data, hidden: int = 64, layers: int = 4) -> None:
        super().__init__()
        self.encoder = Linear(data.num_features, hidden)
        self.layers = nn.ModuleList()
        for i in range(1, layers + 1):
            conv = GENConv(hidden, hidden, aggr="softmax", t=1.0, learn_t=True, num_layers=2,
                           norm="layer")
            norm = nn.LayerNorm(hidden, elementwise_affine=True)
            self.layers.append(DeepGCNLayer(conv, norm, nn.ReLU(inplace=True), block="res+",
                                            dropout=0.1, ckpt_grad=i % 3))
        self.lin = Linear(hidden, int(data.y.max()) + 1)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = self.layers[0].conv(self.encoder(x), edge_index)
        for layer in self.layers[1:]:
            x = layer(x, edge_index)
        x = self.layers[0].act(self.layers[0].norm(x))
        x = F.dropout(x, p=0.1, training=self.training)
        return self.lin(x)


class APPNPNet(nn.Module):
    def __init__(self, data: Data, hidden: int = 64) -> None:
        super().__init__()
        self.lin1 = Linear(data.num_features, hidden)
        self.lin2 = Linear(hidden, int(data.y.max()) + 1)
        self.prop1 = APPNP(10, 0.1)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = F.dropout(x, p=0.5, training=self.training)
        x = F.relu(self.lin1(x))
        x = F.dropout(x, p=0.5, training=self.training)
        x = self.lin2(x)
        return self.prop1(x, edge_index)


# ------------------------------------------------------------------ graph classification


class GIN(nn.Module):
    def __init__(self, data: dict, hidden: int = 32, layers: int = 5) -> None:
        super().__init__()
        self.convs = nn.ModuleList()
        channels = data["train"][0].num_features
        for _ in range(layers):
            self.convs.append(GINConv(MLP([channels, hidden, hidden])))
            channels = hidden
        self.mlp = MLP([hidden, hidden, 3], norm=None, dropout=0.5)

    def forward(self, x: Tensor, edge_index: Tensor, batch: Tensor) -> Tensor:
        for conv in self.convs:
            x = conv(x, edge_index).relu()
        return self.mlp(global_add_pool(x, batch))


def _train_gin(model: nn.Module, data: dict, epochs: int, meter: Meter) -> tuple[float, float]:
    g = torch.Generator().manual_seed(0)
    loaders = {name: DataLoader(graphs, batch_size=64, shuffle=name == "train", generator=g)
               for name, graphs in data.items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    device = next(model.parameters()).device

    def accuracy(loader: DataLoader) -> float:
        model.eval()
        right = total = 0
        with torch.no_grad():
            for batch in loader:
                batch = batch.to(device)
                pred = model(batch.x, batch.edge_index, batch.batch).argmax(-1)
                right += int((pred == batch.y).sum())
                total += batch.num_graphs
        return right / total

    best_val, test, loss = -math.inf, 0.0, math.nan
    for _ in range(epochs):
        model.train()
        for batch in loaders["train"]:
            batch = batch.to(device)
            optimizer.zero_grad()
            out = model(batch.x, batch.edge_index, batch.batch)
            loss = F.cross_entropy(out, batch.y)
            meter.forward(loss, (batch.x, batch.edge_index, batch.batch))
            loss.backward()
            optimizer.step()
            meter.step()
        val = accuracy(loaders["val"])
        if val > best_val:
            best_val, test = val, accuracy(loaders["test"])
    return test, float(loss)


# ------------------------------------------------------------------ heterogeneous


class HeteroGNN(nn.Module):
    def __init__(self, hidden: int = 64, classes: int = 4) -> None:
        super().__init__()
        self.conv1 = SAGEConv((-1, -1), hidden)
        self.conv2 = SAGEConv((-1, -1), classes)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = self.conv1(x, edge_index).relu()
        return self.conv2(x, edge_index)


def _build_hetero(data: HeteroData) -> nn.Module:
    # On the data's device: the lazy shapes are initialised by a call (a model built on the
    # CPU failed there on a GPU's data).
    model = to_hetero(HeteroGNN(), data.metadata(), aggr="sum").to(data["paper"].x.device)
    with torch.no_grad():  # initialise the lazy shapes
        model(data.x_dict, data.edge_index_dict)
    return model


def _train_hetero(model: nn.Module, data: HeteroData, epochs: int,
                  meter: Meter) -> tuple[float, float]:
    paper = data["paper"]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    best_val, test, loss = -math.inf, 0.0, math.nan
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        out = model(data.x_dict, data.edge_index_dict)["paper"]
        loss = F.cross_entropy(out[paper.train_mask], paper.y[paper.train_mask])
        meter.forward(loss)
        loss.backward()
        optimizer.step()
        meter.step()
        model.eval()
        with torch.no_grad():
            out = model(data.x_dict, data.edge_index_dict)["paper"]
        val = _accuracy(out, paper.y, paper.val_mask)
        if val > best_val:
            best_val, test = val, _accuracy(out, paper.y, paper.test_mask)
    return test, float(loss)


# ------------------------------------------------------------------ link prediction


class GCNEncoder(nn.Module):
    def __init__(self, in_channels: int, out_channels: int = 16) -> None:
        super().__init__()
        self.conv1 = GCNConv(in_channels, 2 * out_channels)
        self.conv2 = GCNConv(2 * out_channels, out_channels)

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        x = self.conv1(x, edge_index).relu()
        return self.conv2(x, edge_index)


def _build_gae(data: tuple[Data, Data, Data]) -> nn.Module:
    from torch_geometric.nn import GAE

    return GAE(GCNEncoder(data[0].num_features))


def _compiled_encoder(model: nn.Module) -> nn.Module:
    """``model`` with its encoder compiled: the recipe calls ``encode``, not ``forward``."""
    model.encoder = torch.compile(model.encoder)
    return model


def _train_gae(model: nn.Module, data: tuple[Data, Data, Data], epochs: int,
               meter: Meter) -> tuple[float, float]:
    train_data, val_data, test_data = data
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)

    def auc(split: Data) -> float:
        model.eval()
        with torch.no_grad():
            z = model.encode(split.x, split.edge_index)
            pos = model.decode(z, split.pos_edge_label_index, sigmoid=True)
            neg = model.decode(z, split.neg_edge_label_index, sigmoid=True)
        return roc_auc(torch.cat([pos, neg]), torch.cat([torch.ones_like(pos),
                                                         torch.zeros_like(neg)]))

    best_val, test, loss = -math.inf, 0.0, math.nan
    for _ in range(epochs):
        model.train()
        optimizer.zero_grad()
        z = model.encode(train_data.x, train_data.edge_index)
        neg = negative_sampling(train_data.edge_index, z.size(0),
                                train_data.pos_edge_label_index.size(1))
        loss = model.recon_loss(z, train_data.pos_edge_label_index, neg)
        meter.forward(loss, (neg,))  # the step's sampled pairs: its input, as a batch is
        loss.backward()
        optimizer.step()
        meter.step()
        val = auc(val_data)
        if val > best_val:
            best_val, test = val, auc(test_data)
    return test, float(loss)


# ------------------------------------------------------------------ the families


def _with_weight(model: nn.Module, data: Data) -> Tensor:
    return model(data.x, data.edge_index, data.edge_weight)


def _with_edge_attr(model: nn.Module, data: Data) -> Tensor:
    return model(data.x, data.edge_index, data.edge_attr)


def _gcn_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.Adam([dict(params=model.conv1.parameters(), weight_decay=5e-4),
                             dict(params=model.conv2.parameters(), weight_decay=0)], lr=0.01)


FAMILIES: dict[str, Family] = {f.name: f for f in [
    Family("gcn", _planetoid("Cora"), GCN, _node_task(_gcn_optimizer), 200, 60, "acc",
           "Cora"),
    Family("sage", _named("photo"), SAGE, _node_task(_adam(0.01)), 100, 20, "acc", "Photo"),
    Family("gat", _planetoid("Cora"), GAT, _node_task(_adam(0.005, 5e-4)), 200, 40, "acc",
           "Cora"),
    Family("gcnii", _gcnii_data, GCNII, _node_task(_gcnii_optimizer, call=_with_weight), 300,
           40, "acc", "Cora"),
    Family("gin", _density_graphs, GIN, _train_gin, 30, 4, "acc", "synthetic graphs"),
    Family("gatv2", _planetoid("CiteSeer"), lambda d: GAT(d, conv=GATv2Conv),
           _node_task(_adam(0.005, 5e-4)), 200, 40, "acc", "CiteSeer"),
    Family("transformer", _named("photo"), Transformer, _node_task(_adam(0.005, 5e-4)), 100,
           20, "acc", "Photo"),
    Family("gps", _synthetic(2000, 32, 6, edge_dim=8), GPS,
           _node_task(_adam(0.005), call=_with_edge_attr,
                      scheduler=lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(
                          o, mode="min", factor=0.5, patience=20, min_lr=1e-5)),
           60, 10, "acc", "synthetic (2,000 nodes)"),
    Family("supergat", _planetoid("Cora"), SuperGAT,
           _node_task(_adam(0.005, 5e-4), loss_of=_supergat_loss), 300, 60, "acc", "Cora"),
    Family("mixhop", _planetoid("Cora", normalize=False), MixHop,
           _node_task(_mixhop_optimizer,
                      scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 40, 0.01)),
           100, 30, "acc", "Cora (raw features)"),
    Family("cheb", _planetoid("CiteSeer"), Cheb, _node_task(_adam(0.01, 5e-4)), 200, 40,
           "acc", "CiteSeer"),
    Family("deepergcn", _named("minesweeper"), DeeperGCN, _node_task(_adam(0.005),
                                                                      score=_auc),
           100, 20, "auc", "Minesweeper"),
    Family("hetero", _hetero_graph, _build_hetero, _train_hetero, 100, 20, "acc",
           "synthetic heterogeneous"),
    Family("gae", _link_split, _build_gae, _train_gae, 200, 40, "auc", "Cora links",
           compiled=_compiled_encoder),
    Family("appnp", _planetoid("CiteSeer"), APPNPNet, _node_task(_adam(0.01, 5e-4)), 200, 40,
           "acc", "CiteSeer"),
]}


def load(family: Family, root: Path, seed: int, workdir: str | None = None,
         device: torch.device | str = "cpu") -> object:
    """The family's data for ``seed``, read below ``root`` (copied to ``workdir`` first), on
    ``device`` (graph-classification batches move there one by one)."""
    data = family.load(root, workdir or tempfile.mkdtemp(), seed)
    if isinstance(data, (Data, HeteroData)):
        return data.to(device)
    if isinstance(data, tuple):
        return tuple(d.to(device) for d in data)
    return data


def data_tensors(data: object) -> list[Tensor]:
    """Every tensor of the family's data: the inputs, which live whatever backward keeps."""
    if isinstance(data, (Data, HeteroData)):
        return [v for store in data.stores for v in store.values() if isinstance(v, Tensor)]
    if isinstance(data, tuple):
        return [t for d in data for t in data_tensors(d)]
    return []


def clone(model: nn.Module) -> nn.Module:
    """A copy with the same weights (the suite converts one and keeps the other)."""
    return copy.deepcopy(model)
