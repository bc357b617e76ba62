"""Autograd functions that keep a compressed context: the layer below :mod:`gnnact.nn`."""

from gnnact.ops.aggregate_linear import aggregate_linear, fuses
from gnnact.ops.context import load_context, save_context, shared_quantize
from gnnact.ops.dense import batch_norm, dropout, elu, leaky_relu, linear, relu
from gnnact.ops.gat import gat_attention
from gnnact.ops.gcn2 import gcn2_conv, gcn2_residual
from gnnact.ops.graph import Graph, graph_from
from gnnact.ops.pairs import pair_dot
from gnnact.ops.spmm import spmm

__all__ = [
    "Graph",
    "aggregate_linear",
    "batch_norm",
    "dropout",
    "elu",
    "fuses",
    "gat_attention",
    "gcn2_conv",
    "gcn2_residual",
    "graph_from",
    "leaky_relu",
    "linear",
    "load_context",
    "pair_dot",
    "relu",
    "save_context",
    "shared_quantize",
    "spmm",
]
