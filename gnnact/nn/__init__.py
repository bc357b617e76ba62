"""Drop-in layers: PyG convs and PyTorch modules that keep their context compressed."""

from gnnact.nn.conv import GATConv, GCN2Conv, GCNConv, SAGEConv
from gnnact.nn.convert import convert
from gnnact.nn.modules import BatchNorm1d, Dropout, LeakyReLU, Linear, ReLU

__all__ = [
    "BatchNorm1d",
    "Dropout",
    "GATConv",
    "GCN2Conv",
    "GCNConv",
    "LeakyReLU",
    "Linear",
    "ReLU",
    "SAGEConv",
    "convert",
]
