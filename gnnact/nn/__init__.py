"""Drop-in layers: PyG convs and PyTorch modules that keep their context compressed."""

from gnnact.nn.autoencoder import ARGA, ARGVA, GAE, VGAE, InnerProductDecoder
from gnnact.nn.conv import APPNP, GATConv, GATv2Conv, GCN2Conv, GCNConv, SAGEConv, SGConv
from gnnact.nn.convert import convert
from gnnact.nn.modules import BatchNorm1d, Dropout, LeakyReLU, Linear, ReLU
from gnnact.nn.summary import summary

__all__ = [
    "APPNP",
    "ARGA",
    "ARGVA",
    "GAE",
    "VGAE",
    "BatchNorm1d",
    "Dropout",
    "GATConv",
    "GATv2Conv",
    "GCN2Conv",
    "GCNConv",
    "InnerProductDecoder",
    "LeakyReLU",
    "Linear",
    "ReLU",
    "SAGEConv",
    "SGConv",
    "convert",
    "summary",
]
