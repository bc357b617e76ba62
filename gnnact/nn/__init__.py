"""Drop-in layers: PyG convs and PyTorch modules that keep their context compressed."""

from gnnact.nn.conv import GCNConv, SAGEConv
from gnnact.nn.convert import convert
from gnnact.nn.modules import BatchNorm1d, Dropout, LeakyReLU, Linear, ReLU

__all__ = [
    "BatchNorm1d",
    "Dropout",
    "GCNConv",
    "LeakyReLU",
    "Linear",
    "ReLU",
    "SAGEConv",
    "convert",
]
