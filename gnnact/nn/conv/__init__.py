"""PyG convolution layers whose context is compressed (same API as ``torch_geometric.nn``)."""

from gnnact.nn.conv.gcn_conv import GCNConv
from gnnact.nn.conv.sage_conv import SAGEConv

__all__ = ["GCNConv", "SAGEConv"]
