"""PyG convolution layers whose context is compressed (same API as ``torch_geometric.nn``)."""

from gnnact.nn.conv.appnp import APPNP, SGConv
from gnnact.nn.conv.gat_conv import GATConv
from gnnact.nn.conv.gatv2_conv import GATv2Conv
from gnnact.nn.conv.gcn2_conv import GCN2Conv
from gnnact.nn.conv.gcn_conv import GCNConv
from gnnact.nn.conv.sage_conv import SAGEConv

__all__ = ["APPNP", "GATConv", "GATv2Conv", "GCN2Conv", "GCNConv", "SAGEConv", "SGConv"]
