"""``gnnact.convert``: swap PyG convs and PyTorch layers for their compressed twins in place."""

from __future__ import annotations

import dataclasses
import warnings

import torch_geometric.nn as pyg_nn
from torch import nn

from gnnact.config import Config
from gnnact.nn import autoencoder, modules
from gnnact.nn._base import _Compressed
from gnnact.nn.chunked import CHUNKED, chunk_messages
from gnnact.nn.conv import APPNP, GATConv, GATv2Conv, GCN2Conv, GCNConv, SAGEConv, SGConv
from gnnact.nn.scope import Scope

__all__ = ["convert", "register_conversion"]

#: Exact source class -> gnnact class. Subclasses of these are *not* converted: a user's
#: subclass may override forward, which a swap would silently drop.
CONVERSIONS: dict[type[nn.Module], type[_Compressed]] = {
    pyg_nn.GCNConv: GCNConv,
    pyg_nn.SAGEConv: SAGEConv,
    pyg_nn.GATConv: GATConv,
    pyg_nn.GATv2Conv: GATv2Conv,
    pyg_nn.GCN2Conv: GCN2Conv,
    pyg_nn.APPNP: APPNP,
    pyg_nn.SGConv: SGConv,
    pyg_nn.models.InnerProductDecoder: autoencoder.InnerProductDecoder,
    pyg_nn.GAE: autoencoder.GAE,
    pyg_nn.VGAE: autoencoder.VGAE,
    pyg_nn.ARGA: autoencoder.ARGA,
    pyg_nn.ARGVA: autoencoder.ARGVA,
    nn.Linear: modules.Linear,
    nn.BatchNorm1d: modules.BatchNorm1d,
    nn.ReLU: modules.ReLU,
    nn.LeakyReLU: modules.LeakyReLU,
    nn.Dropout: modules.Dropout,
}


def register_conversion(source: type[nn.Module], target: type[_Compressed]) -> None:
    """Make :func:`convert` turn instances of exactly ``source`` into ``target``."""
    CONVERSIONS[source] = target


def convert(model: nn.Module, config: Config | None = None) -> nn.Module:
    r"""Replace, in place, every PyG conv and PyTorch layer that gnnact has a compressed twin
    for, inside any :class:`torch.nn.Module`.

    Converted: :class:`torch_geometric.nn.GCNConv`, :class:`~torch_geometric.nn.SAGEConv`
    (every ``aggr``; those without a compressed path run PyG's own forward),
    :class:`~torch_geometric.nn.GATConv`, :class:`~torch_geometric.nn.GATv2Conv`,
    :class:`~torch_geometric.nn.GCN2Conv`, :class:`~torch_geometric.nn.APPNP`,
    :class:`~torch_geometric.nn.SGConv`, the graph autoencoders
    (:class:`~torch_geometric.nn.GAE`, ``VGAE``, ``ARGA``, ``ARGVA`` and their
    :class:`~torch_geometric.nn.models.InnerProductDecoder`: :mod:`gnnact.nn.autoencoder`),
    :class:`torch.nn.Linear`,
    :class:`~torch.nn.BatchNorm1d`, :class:`~torch.nn.ReLU`, :class:`~torch.nn.LeakyReLU` and
    :class:`~torch.nn.Dropout`; modules already converted get the new ``config``. Only exact
    classes are converted: subclasses (which may override ``forward``) and unknown modules are
    left alone, as are functional calls such as ``F.relu`` inside a ``forward``; what they
    save is compressed by the converted model's scope. PyG convs without a twin run their
    message passing in chunks (``config.chunk_messages``): by feature columns where the
    messages split so (:data:`gnnact.nn.chunked.DECOMPOSABLE`: ``GINConv``, ``GraphConv``,
    ``ChebConv``, …; and the GCN and SAGE twins when they run PyG's own forward, as for
    ``aggr="max"``), by blocks of targets for attention, edge features and networks applied
    per edge (:data:`~gnnact.nn.chunked.BY_TARGET`: ``TransformerConv``, ``GINEConv``,
    ``PNAConv``, ``NNConv``, …).

    The conversion changes each module's class in place: the module objects, their attribute
    names, parameter objects, buffers, hooks and device stay the same, so trained weights are
    kept, ``state_dict`` keys do not change, and an optimizer built before the call keeps
    working. With ``Config(bits=32)`` the converted model computes what the original did.

    With no ``config`` (or ``bits=None``) every compressed tensor gets its own width while the
    model trains, from noise ratios measured inside ordinary training steps
    (:mod:`gnnact.adaptive.auto`); ``Config(bits=b)`` keeps one fixed width. The model's
    scope goes with it through :func:`copy.deepcopy` and pickling, a ``torch.fx``
    ``GraphModule`` (``to_hetero``'s) included.

    Args:
        model (torch.nn.Module): the model (converted itself if it is a supported layer).
        config (Config, optional): storage of the context. (default: ``Config()``: automatic
            widths, 3 bits per value on average, chosen per tensor as the model trains;
            :mod:`gnnact.adaptive.auto`)

    Returns:
        torch.nn.Module: ``model`` itself.

    Example:
        >>> from torch_geometric.nn.models import GCN
        >>> model = GCN(16, 32, num_layers=2, out_channels=4)  # GCNConv, ReLU and Dropout
        >>> gnnact.convert(model, gnnact.Config(bits=2))
        GCN(16, 4, num_layers=2)
        >>> type(model.convs[0]).__module__, model.act
        ('gnnact.nn.conv.gcn_conv', ReLU())
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 400))
        >>> model(x, edge_index).shape
        torch.Size([100, 4])
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if config is not None and not isinstance(config, Config):
        raise TypeError(f"config must be a gnnact.Config, got {type(config).__name__}")
    config = config or Config()
    for name, module in list(model.named_modules()):
        # Each module's config is tagged with its path (unless the caller tagged it): the name
        # per-node precision and gnnact.Controller know its tensors by.
        own = config if config.tag is not None else dataclasses.replace(config,
                                                                        tag=name or "<model>")
        target = CONVERSIONS.get(type(module))
        if isinstance(module, _Compressed):
            module.config = own
        elif target is not None and not target.supports(module):
            warnings.warn(f"gnnact.convert: left {name or 'model'} ({module}) unconverted: "
                          f"not supported by {target.__module__}.{target.__name__}",
                          stacklevel=2)
        elif target is not None:
            target._adopt(module, own)
        if type(module) in CHUNKED:  # (a twin: for when it runs PyG's own forward)
            chunk_messages(module, config.chunk_messages)
    Scope.install(model, config)
    return model
