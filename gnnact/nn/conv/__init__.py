"""PyG convolution layers whose context is compressed (same API as ``torch_geometric.nn``)."""

from gnnact.nn.conv.gat_conv import GATConv
from gnnact.nn.conv.gcn2_conv import GCN2Conv
from gnnact.nn.conv.gcn_conv import GCNConv
from gnnact.nn.conv.sage_conv import SAGEConv

__all__ = ["GATConv", "GCN2Conv", "GCNConv", "SAGEConv"]
