r"""Twins of PyG's graph autoencoders (``GAE``, ``VGAE``, ``ARGA``, ``ARGVA``) and of their
``InnerProductDecoder``, for :func:`gnnact.convert`: the decoder keeps the node embeddings
once (:func:`gnnact.ops.pair_dot`) and ``recon_loss`` keeps one exact value per pair
(:func:`gnnact.ops.pairs.log_sigmoid`).

What each step keeps for backward, for :math:`E` pairs of :math:`d`-dimensional embeddings
:math:`\mathbf{Z} \in \mathbb{R}^{N \times d}`:

* scoring: PyG keeps both gathered operands, :math:`2 E d` values per decoder call; the twin
  keeps :math:`\mathbf{Z}` once, at the op's width, for every set of pairs of the call;
* the loss on the scores: PyG keeps :math:`\sigma(v)` and :math:`\sigma(v) + \epsilon`, two
  values per pair; the twin keeps :math:`v`, one, exactly.

``recon_loss`` scores its positive and its negative pairs in one decoder call, so that
:math:`\mathbf{Z}` is kept once for both, and computes PyG's loss,
:math:`-\overline{\log(\sigma(v^+) + \epsilon)} - \overline{\log(1 - \sigma(v^-) +
\epsilon)}`, with the same values and the same negative samples (drawn as PyG draws them).
With ``Config(bits=32)``, or when the decoder is not the twin (a user's own), both run PyG's
code unchanged.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import models as pyg_models
from torch_geometric.nn.models.autoencoder import EPS
from torch_geometric.utils import negative_sampling

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._base import _Compressed
from gnnact.ops.pairs import log_sigmoid

__all__ = ["ARGA", "ARGVA", "GAE", "VGAE", "InnerProductDecoder"]


class InnerProductDecoder(_Compressed, pyg_models.InnerProductDecoder):
    r""":class:`torch_geometric.nn.models.InnerProductDecoder` keeping :math:`\mathbf{Z}` once:

    .. math::
        v_e = \langle \mathbf{z}_{s_e}, \mathbf{z}_{t_e} \rangle, \qquad
        \nabla \mathbf{z}_i = \sum_{e: s_e = i} \nabla v_e \, \hat{\mathbf{z}}_{t_e}
        + \sum_{e: t_e = i} \nabla v_e \, \hat{\mathbf{z}}_{s_e},

    where :math:`\hat{\mathbf{Z}}` is :math:`\mathbf{Z}` restored from its packed copy. Kept
    for backward: :math:`\mathbf{Z}` at ``config.bits`` bits and the pair indices by reference,
    and :math:`\sigma(v)` exactly with ``sigmoid=True`` (the loss head); PyG keeps both gathered
    operands :math:`\mathbf{z}_{s_e}`, :math:`\mathbf{z}_{t_e}` of every pair. ``edge_index``
    may also be a tuple of ``[2, E_k]`` tensors: their scores come back as a tuple, with
    :math:`\mathbf{Z}` kept once for all (``recon_loss`` scores its positive and negative pairs
    so). ``forward_all`` is PyG's (a dense product, compressed by the converted model's
    generic pipeline).

    Args:
        config (Config, optional): storage of the context. (default: ``Config()``)

    Example:
        >>> decoder = gnnact.nn.InnerProductDecoder(config=gnnact.Config(bits=4))
        >>> z = torch.randn(100, 16, requires_grad=True)
        >>> edge_index = torch.randint(0, 100, (2, 500))
        >>> decoder(z, edge_index, sigmoid=False).shape
        torch.Size([500])
    """

    def __init__(self, *, config: Config | None = None) -> None:
        super().__init__()
        self._init_gnnact(config)

    def forward(self, z: Tensor, edge_index: Tensor | tuple[Tensor, ...],
                sigmoid: bool = True) -> Any:
        pairs = edge_index if isinstance(edge_index, tuple) else (edge_index,)
        if self.config.width == 32:  # PyG's own: exact
            values = tuple(super(InnerProductDecoder, self).forward(z, p, sigmoid=False)
                           for p in pairs)
        else:
            values = ops.pair_dot(z, pairs, self.config)
        if sigmoid:
            values = tuple(torch.sigmoid(v) for v in values)
        return values if isinstance(edge_index, tuple) else values[0]


class _ReconLoss(_Compressed):
    """``recon_loss`` of the autoencoder twins (see the module docstring)."""

    def recon_loss(self, z: Tensor, pos_edge_index: Tensor,
                   neg_edge_index: Tensor | None = None) -> Tensor:
        decoder = self.decoder  # type: ignore[attr-defined]
        if not isinstance(decoder, InnerProductDecoder) or decoder.config.width == 32:
            return super().recon_loss(z, pos_edge_index, neg_edge_index)  # type: ignore[misc]
        if neg_edge_index is None:
            neg_edge_index = negative_sampling(pos_edge_index, z.size(0))
        pos, neg = decoder(z, (pos_edge_index, neg_edge_index), sigmoid=False)
        pos_loss = -log_sigmoid(pos, EPS).mean()
        neg_loss = -log_sigmoid(neg, EPS, complement=True).mean()
        return pos_loss + neg_loss


_ARGS = """
    Args:
        encoder (torch.nn.Module): the encoder, as PyG's.
        decoder (torch.nn.Module, optional): the decoder; PyG's default, an
            :class:`InnerProductDecoder` (which :func:`gnnact.convert` makes the twin above).
            (default: :obj:`None`)
"""
_DISCRIMINATOR = """        discriminator (torch.nn.Module): the discriminator, as PyG's.
"""
_EXAMPLE = """
    Example:
        >>> from torch_geometric.nn import GAE, GCNConv
        >>> model = gnnact.convert(GAE(GCNConv(16, 8)))  # made by convert, not directly
        >>> type(model).__name__, type(model.decoder).__name__
        ('GAE', 'InnerProductDecoder')
        >>> x, edge_index = torch.randn(100, 16), torch.randint(0, 100, (2, 500))
        >>> loss = model.recon_loss(model.encode(x, edge_index), edge_index)
        >>> loss.backward()
"""


def _described(what: str, discriminator: bool = False) -> str:
    args = _ARGS.replace("        decoder (", (_DISCRIMINATOR if discriminator else "")
                         + "        decoder (", 1)
    return (f":class:`torch_geometric.nn.models.{what}` with the reconstruction loss of this "
            f"module (the same values, one exact value kept per pair).\n{args}{_EXAMPLE}")


class GAE(_ReconLoss, pyg_models.GAE):
    __doc__ = _described("GAE")


class VGAE(_ReconLoss, pyg_models.VGAE):
    __doc__ = _described("VGAE")


class ARGA(_ReconLoss, pyg_models.ARGA):
    __doc__ = _described("ARGA", discriminator=True)


class ARGVA(_ReconLoss, pyg_models.ARGVA):
    __doc__ = _described("ARGVA", discriminator=True)
