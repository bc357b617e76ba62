r"""Fused GATv2 attention whose backward keeps node features and a 1-bit mask, not edge tensors.

For :math:`H` heads of :math:`C` channels, source features :math:`X^l \in \mathbb{R}^{N_s \times
H \times C}` and target features :math:`X^r \in \mathbb{R}^{N_d \times H \times C}` (the same
tensor with shared weights on a non-bipartite graph), per edge :math:`e = (j \to i)` and head
:math:`h`:

.. math::
    z_{e,h} = X^r_{i,h} + X^l_{j,h} + (\mathbf{E}_e W_e^\top)_h, \qquad
    s_{e,h} = \big\langle \mathbf{a}_h, \mathrm{LeakyReLU}(z_{e,h}) \big\rangle,

    \alpha_{e,h} = \frac{\exp s_{e,h}}{\sum_{e' \to i} \exp s_{e',h}}, \qquad
    \tilde\alpha_{e,h} = \frac{M_{e,h}}{1 - p} \alpha_{e,h}, \qquad
    Y_{i,h} = \sum_{e = (j \to i)} \tilde\alpha_{e,h} X^l_{j,h},

with optional edge features :math:`\mathbf{E} \in \mathbb{R}^{E \times D}` and their projection
:math:`W_e \in \mathbb{R}^{HC \times D}` (``edge_dim``), and :math:`M` the dropout keep mask
(training only). This is :class:`torch_geometric.nn.GATv2Conv`'s ``edge_updater`` and
``propagate`` in one :class:`torch.autograd.Function`.

**What backward keeps.** PyG's layer keeps several :math:`E \times H \times C` tensors in full
precision: the gathered messages :math:`X^l_j` (for :math:`\nabla\tilde\alpha`), the LeakyReLU
input :math:`z` and its output (for :math:`\nabla\mathbf{a}`), plus :math:`\alpha` and the
softmax intermediates. Here backward keeps

* :math:`X^l` (:math:`N_s H C` values) at ``config.width`` bits, through the shared packed copy
  of :func:`~gnnact.ops.context.save_context`, for :math:`\nabla\tilde\alpha`;
* when :math:`\mathbf{a}` needs a gradient, what :math:`\nabla\mathbf{a}` rebuilds
  :math:`z` from: a second, independently rounded copy :math:`\tilde X^l` at ``config.width``
  bits (see below why), and :math:`X^r` at ``config.width`` bits when it is a different tensor
  (with shared weights on one input, :math:`\tilde X^l` stands for both);
* :math:`\alpha` (before dropout) at ``config.attention`` bits (8 by default), quantized as the
  transposed :math:`H \times E` tensor so that a group is consecutive edges of one head;
* the LeakyReLU sign mask :math:`m = [z > 0]`, 1 bit per edge, head and channel, taken from the
  exact :math:`z` of the forward pass; the dropout keep mask :math:`M`, 1 bit per edge and head;
* with edge features: :math:`\mathbf{E}` (:math:`E \times D`) at ``config.width`` bits (or by
  reference when it is a resident input, :func:`~gnnact.ops.context.input_bits`), never the
  :math:`E \times HC` projection;
* :math:`\mathbf{a}` and :math:`W_e` (parameters, not copied) and the graph (cached).

No :math:`E \times H \times C` tensor is kept, and none is materialised whole: forward and
backward walk the edges in chunks of at most :data:`CHUNK_ELEMENTS` values per temporary
(and at most half a node tensor).
Backward, with :math:`G = \nabla Y` and :math:`k_{e,h,c} = m_{e,h,c} + \sigma (1 - m_{e,h,c})`
(:math:`\sigma` the negative slope):

.. math::
    \nabla\tilde\alpha_{e,h} &= \langle G_{i,h}, \hat X^l_{j,h} \rangle, \qquad
    \nabla\alpha = \frac{M}{1-p} \nabla\tilde\alpha, \qquad
    \nabla s_{e,h} = \hat\alpha_{e,h}\Big(\nabla\alpha_{e,h} - \sum_{e' \to i}
        \hat\alpha_{e',h} \nabla\alpha_{e',h}\Big), \\
    \nabla z_{e,h} &= \nabla s_{e,h} \, \mathbf{a}_h \odot k_{e,h}, \qquad
    \nabla \mathbf{a}_h = \sum_e \nabla s_{e,h} \, \tilde z_{e,h} \odot k_{e,h}, \qquad
    \tilde z_{e,h} = \hat X^r_{i,h} + \tilde X^l_{j,h} + (\hat{\mathbf{E}}_e W_e^\top)_h, \\
    \nabla X^l_{j,h} &= \sum_{e = (j \to i)} \big(\tilde\alpha_{e,h} G_{i,h}
        + \nabla z_{e,h}\big), \qquad
    \nabla X^r_{i,h} = \sum_{e = (\cdot \to i)} \nabla z_{e,h}, \qquad
    \nabla W_e = \sum_e \nabla z_e^\top \hat{\mathbf{E}}_e, \qquad
    \nabla \mathbf{E}_e = \nabla z_e W_e.

:math:`\mathrm{LeakyReLU}(z) = z \odot k` is rebuilt from restored node features and the exact
mask, so it is linear in the rounded values. :math:`\nabla z` reads no rounded feature at all,
and :math:`\nabla X^l, \nabla X^r, \nabla W_e, \nabla\mathbf{E}` are linear in :math:`\hat X^l`
and :math:`\hat{\mathbf{E}}`: with stochastic rounding they are unbiased up to the second-order
effect of :math:`\hat\alpha` (as in :mod:`gnnact.ops.gat`). :math:`\nabla\mathbf{a}` is a
product of :math:`\nabla s`, linear in :math:`\hat X^l`, and of the rebuilt :math:`z`: were
:math:`z` rebuilt from :math:`\hat X^l` too, the product would carry
:math:`\mathrm{Cov}(\langle G_i, \hat X^l_j \rangle, \hat X^l_{j,c}) = G_{i,c}
\mathrm{Var}[\hat X^l_{j,c}]`, a bias of the order of the gradient itself at 2 bits (and
:math:`\mathrm{Var}` cannot be estimated from one rounding). With :math:`\tilde X^l` rounded
independently, :math:`\mathbb{E}[\nabla s \, \tilde z] = \mathbb{E}[\nabla s] \, z` and
:math:`\nabla\mathbf{a}` is unbiased as well, for :math:`N_s H C` values more at ``config.width``.

Per-edge tensors given to or returned by the op (:math:`\mathbf{E}`, the returned
:math:`\tilde\alpha`) are in the **input edge order** of the adjacency the graph was built from;
internally everything runs in CSR order (edges grouped by target), mapped through
:attr:`Graph.input_perm <gnnact.ops.graph.Graph>`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import softmax

from gnnact.config import Config
from gnnact.ops.blocks import GPU_BLOCK_ELEMENTS
from gnnact.ops.context import (
    independent_quantize,
    input_bits,
    load_context,
    records_graph,
    save_context,
)
from gnnact.ops.draws import keep_mask
from gnnact.ops.gat import (
    _aggregate,
    _check_attention_vector,
    _check_dropout,
    _check_sources,
    _check_targets,
    _edge_dot,
    _segment_sum,
    _to_csr,
    _to_input,
)
from gnnact.ops.graph import Graph
from gnnact.ops.higher_order import first_order_only
from gnnact.ops.state import eager_op
from gnnact.quant import PackedMask, pack_mask, unpack_mask

__all__ = ["CHUNK_ELEMENTS", "gatv2_attention"]

#: Values of one transient ``[edges, H, C]`` block (z, its LeakyReLU, their gradients): the
#: edges are processed in chunks of at most this many values (and at least 8 edges).
CHUNK_ELEMENTS = 1 << 24
MIN_CHUNK_ELEMENTS = 1 << 16


def _chunks(num_edges: int, per_edge: int, rows: int, device: torch.device) -> Iterator[slice]:
    """Edge slices of at most :data:`CHUNK_ELEMENTS` values, and at most half a node tensor
    (``rows`` nodes; at least :data:`MIN_CHUNK_ELEMENTS`, on a GPU
    :data:`~gnnact.ops.blocks.GPU_BLOCK_ELEMENTS`): on a small graph a fixed size
    would make each of a chunk's temporaries larger than the node tensors. Each starts at a
    multiple of 8 edges, so it starts on a byte boundary of the packed ``[E, H, C]`` mask."""
    least = GPU_BLOCK_ELEMENTS if device.type == "cuda" else MIN_CHUNK_ELEMENTS
    limit = min(CHUNK_ELEMENTS, max(least, rows * per_edge // 2))
    step = max(8, limit // max(1, per_edge) // 8 * 8)
    for start in range(0, num_edges, step):
        yield slice(start, min(start + step, num_edges))


def _mask_bytes(sl: slice, per_edge: int) -> slice:
    """The bytes of the packed ``[E, H, C]`` mask that hold the edges of ``sl``."""
    return slice(sl.start * per_edge // 8, math.ceil(sl.stop * per_edge / 8))


def _edge_rows(edge_attr: Tensor, graph: Graph, sl: slice) -> Tensor:
    """Rows of the input-order ``edge_attr`` for the CSR edges ``sl``."""
    perm = graph.input_perm
    return edge_attr[sl] if perm is None else edge_attr.index_select(0, perm[sl])


def _pre_activation(x_l: Tensor, x_r: Tensor, edge_attr: Tensor | None, w_edge: Tensor | None,
                    graph: Graph, sl: slice, dst: Tensor) -> Tensor:
    r""":math:`z = X^r_i + X^l_j (+ \mathbf{E} W_e^\top)` for the CSR edges ``sl`` (whose
    targets are ``dst``), ``[n, H, C]``: PyG's ``x_i + x_j`` then ``+ lin_edge(edge_attr)``,
    so fp64 agrees."""
    z = x_r.index_select(0, dst) + x_l.index_select(0, graph.src[sl])
    if edge_attr is not None:
        z = z + F.linear(_edge_rows(edge_attr, graph, sl), w_edge).view_as(z)
    return z


class _GATv2Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x_l: Tensor, x_r: Tensor | None, att: Tensor,
                edge_attr: Tensor | None, w_edge: Tensor | None, graph: Graph, same: bool,
                negative_slope: float, p: float, training: bool, want_alpha: bool,
                config: Config, record: bool) -> Tensor | tuple[Tensor, Tensor]:
        # Unused outputs (the attention weights, when nobody reads them) come back as None.
        ctx.set_materialize_grads(False)
        num_edges, heads, channels = graph.num_edges, x_l.size(1), x_l.size(2)
        per_edge = heads * channels
        x_dst = x_l if same else x_r
        assert x_dst is not None

        # Logits chunk by chunk: each [n, H, C] block lives only for its chunk, and its sign
        # mask is packed at once (1 bit per value) into one buffer (when backward will run).
        logits = x_l.new_empty(num_edges, heads)
        mask = torch.empty(math.ceil(num_edges * per_edge / 8), dtype=torch.uint8,
                           device=x_l.device) if record else None
        for sl in _chunks(num_edges, per_edge, graph.num_dst, x_l.device):
            z = _pre_activation(x_l, x_dst, edge_attr, w_edge, graph, sl, graph.dst_of(sl))
            if mask is not None:
                mask[_mask_bytes(sl, per_edge)] = pack_mask(z > 0).data
            z = F.leaky_relu(z, negative_slope)
            torch.sum(z * att, dim=-1, out=logits[sl])
        # (An empty graph has nothing to normalise; PyG skips the softmax there too.)
        alpha = (softmax(logits, ptr=graph.ptr.long(), num_nodes=graph.num_dst) if num_edges
                 else logits)

        keep = None
        alpha_d = alpha
        if training and p > 0.0:
            if p >= 1.0:  # as F.dropout: zeros, no random draw
                keep = torch.zeros(num_edges, heads, dtype=torch.bool, device=alpha.device)
                alpha_d = alpha * 0.0
            else:
                # Drawn as F.dropout draws it (same dtype, shape and input edge order),
                # so a seeded run reproduces PyG's mask.
                noise = keep_mask(alpha.new_empty(num_edges, heads), p, alpha.dtype)
                noise = _to_csr(noise, graph)
                keep = noise.bool()
                alpha_d = alpha * noise.div_(1 - p)

        out = _aggregate(alpha_d.t(), x_l, graph, transpose=False)

        ctx.graph, ctx.same = graph, same
        ctx.negative_slope, ctx.p = negative_slope, p
        ctx.has_edge = edge_attr is not None
        ctx.shape_l = x_l.shape
        # `record` (grad mode on, some input needs a gradient) rather than needs_input_grad,
        # which stays set under torch.no_grad: evaluation keeps (and quantizes) nothing.
        if record:
            need_att = ctx.needs_input_grad[2]
            need_w_edge = ctx.has_edge and ctx.needs_input_grad[4]
            # X^r, X~^l and E are read only by grad att (z~) and grad W_e (E^).
            keep_xr = not same and need_att
            keep_edge = ctx.has_edge and (need_att or need_w_edge)
            copy = independent_quantize(x_l, config, "features") if need_att else None
            save_context(ctx, config, (x_l, config.width, "features"), copy,
                         (x_r if keep_xr else None, config.width, "features"),
                         (alpha.t(), config.attention, "attention"),
                         (att, 32),
                         (edge_attr if keep_edge else None, input_bits(edge_attr, config),
                          "edge_attr"),
                         (w_edge if ctx.has_edge else None, 32),
                         # Kept as the packed bytes: backward unpacks it chunk by chunk.
                         mask,
                         None if keep is None else pack_mask(keep))
        else:
            save_context(ctx, config)

        if not want_alpha:
            return out
        return out, _to_input(alpha_d, graph)

    @staticmethod
    @first_order_only("GATv2 attention (gnnact.ops.gatv2_attention)")
    def backward(ctx: Any, grad_out: Tensor | None, grad_alpha: Tensor | None = None) -> tuple:
        graph: Graph = ctx.graph
        (x_l_hat, x_l_tilde, x_r_hat, alpha_t, att, edge_hat, w_edge, mask,
         keep) = load_context(ctx)
        # float16/bfloat16 (model or autocast) in float32, transients only, as GAT's backward
        # (gnnact.ops.gat): autograd rounds each gradient to its input's dtype once.
        dtype = torch.promote_types(x_l_hat.dtype, torch.float32)
        x_l_hat, x_l_tilde, x_r_hat, alpha_t = (None if t is None else t.to(dtype)
                                                for t in (x_l_hat, x_l_tilde, x_r_hat, alpha_t))
        alpha = alpha_t.t()  # [E, H]
        heads, channels = ctx.shape_l[1], ctx.shape_l[2]
        per_edge = heads * channels
        if grad_out is None:  # only the returned attention weights were used
            grad_out = x_l_hat.new_zeros(graph.num_dst, heads, channels)
        grad_out = grad_out.to(dtype)
        need_xl, need_xr, need_att, need_edge, need_w_edge = ctx.needs_input_grad[:5]
        need_edge = ctx.has_edge and need_edge
        need_w_edge = ctx.has_edge and need_w_edge

        scale = None
        if keep is not None:
            scale = (keep.to(dtype) / (1 - ctx.p)) if ctx.p < 1.0 else keep.to(dtype)
        alpha_d = alpha if scale is None else alpha * scale

        # The aggregation's own term: reads no rounded feature.
        grad_xl = (_aggregate(alpha_d.t(), grad_out, graph, transpose=True) if need_xl
                   else None)
        grad_xr = x_l_hat.new_zeros(graph.num_dst, heads, channels) if need_xr else None

        # d alpha~ = <G_i, X^l_j>, from the restored X^l, then the softmax backward.
        grad_ad = _edge_dot(grad_out, x_l_hat, graph)
        if grad_alpha is not None:
            grad_ad = grad_ad + _to_csr(grad_alpha.to(dtype), graph)
        grad_a = grad_ad if scale is None else grad_ad * scale
        weighted = alpha * grad_a
        grad_s = weighted - alpha * _segment_sum(weighted, graph).index_select(0, graph.dst)

        grad_att = x_l_hat.new_zeros(heads, channels) if need_att else None
        grad_w_edge = torch.zeros_like(w_edge, dtype=dtype) if need_w_edge else None
        # (Autograd casts each gradient to its input's dtype.)
        grad_edge = (grad_s.new_empty(graph.num_edges, w_edge.size(1)) if need_edge
                     else None)
        if x_l_tilde is None:  # 16/32 bits: no rounding noise to keep apart
            x_l_tilde = x_l_hat
        x_r_hat = x_l_tilde if ctx.same else x_r_hat
        slope = ctx.negative_slope
        for sl in _chunks(graph.num_edges, per_edge, graph.num_dst, grad_s.device):
            n = sl.stop - sl.start
            positive = unpack_mask(PackedMask(mask[_mask_bytes(sl, per_edge)],
                                              torch.Size((n, heads, channels))))
            g_s = grad_s[sl].unsqueeze(-1)
            # This block's targets, found once for every use below.
            dst = (graph.dst_of(sl) if need_att or need_xr or (need_xl and ctx.same)
                   else None)
            if need_att:
                # LeakyReLU(z)~ = z~ (m + slope (1 - m)): linear in the rounded features, whose
                # X~^l noise is independent of the X^l noise in grad_s.
                z_tilde = _pre_activation(x_l_tilde, x_r_hat, edge_hat, w_edge, graph, sl,
                                          dst)
                z_tilde = torch.where(positive, z_tilde, z_tilde * slope)
                grad_att += (g_s * z_tilde).sum(0)
            if not (need_xl or need_xr or need_edge or need_w_edge):
                continue
            grad_z = g_s * att  # d s / d LeakyReLU(z), then through the exact mask
            grad_z = torch.where(positive, grad_z, grad_z * slope)
            if need_xl:
                grad_xl.index_add_(0, graph.src[sl], grad_z)
                if ctx.same:  # X^r is X^l: one input, one gradient
                    grad_xl.index_add_(0, dst, grad_z)
            if need_xr:
                grad_xr.index_add_(0, dst, grad_z)
            if need_edge or need_w_edge:
                flat = grad_z.reshape(n, per_edge)
                if need_w_edge:
                    grad_w_edge += flat.t() @ _edge_rows(edge_hat, graph, sl).to(dtype)
                if need_edge:
                    rows = sl if graph.input_perm is None else graph.input_perm[sl]
                    grad_edge[rows] = flat @ w_edge.to(dtype)

        if grad_att is not None:
            grad_att = grad_att.unsqueeze(0).to(att.dtype)
        return (grad_xl, grad_xr, grad_att, grad_edge, grad_w_edge,
                None, None, None, None, None, None, None, None)


@eager_op
def gatv2_attention(x_l: Tensor, x_r: Tensor, att: Tensor, graph: Graph,
                    edge_attr: Tensor | None = None, w_edge: Tensor | None = None,
                    negative_slope: float = 0.2, dropout: float = 0.0, training: bool = False,
                    return_attention: bool = False, config: Config | None = None
                    ) -> Tensor | tuple[Tensor, Tensor]:
    r"""GATv2 attention and aggregation in one op (see the module docstring for the math and
    what backward keeps).

    Args:
        x_l (torch.Tensor): projected source features :math:`X^l`, ``[N_src, H, C]``.
        x_r (torch.Tensor): projected target features :math:`X^r`, ``[N_dst, H, C]``; may be
            ``x_l`` itself (shared weights: one gradient, no copy of its own).
        att (torch.Tensor): the attention vector :math:`\mathbf{a}`, ``[1, H, C]``.
        graph (Graph): the adjacency (self-loops already added if wanted).
        edge_attr (torch.Tensor, optional): edge features :math:`\mathbf{E}`, ``[E, D]``, in
            input edge order. (default: :obj:`None`)
        w_edge (torch.Tensor, optional): their projection :math:`W_e`, ``[H C, D]``; required
            with ``edge_attr``. (default: :obj:`None`)
        negative_slope (float, optional): LeakyReLU slope. (default: :obj:`0.2`)
        dropout (float, optional): dropout probability :math:`p` on :math:`\alpha`.
            (default: :obj:`0.0`)
        training (bool, optional): apply dropout. (default: :obj:`False`)
        return_attention (bool, optional): also return :math:`\tilde\alpha`. (default:
            :obj:`False`)
        config (Config, optional): storage of the context. (default: ``Config()``)

    Returns:
        ``[N_dst, H, C]``, and with ``return_attention`` also :math:`\tilde\alpha`
        (``[E, H]``, input edge order, differentiable).

    Raises:
        ValueError: shapes that do not match each other or the graph, edge features without
            their projection, or a dropout probability outside :math:`[0, 1]`.
        TypeError: non-floating-point features.

    Example:
        >>> from gnnact.ops.gatv2 import gatv2_attention
        >>> from gnnact.ops.graph import Graph
        >>> src, dst = torch.randint(0, 10, (2, 40))
        >>> graph = Graph.from_coo(src, dst, 10, 10)
        >>> x_l = torch.randn(10, 2, 4, requires_grad=True)  # 2 heads of 4 channels
        >>> att = torch.randn(1, 2, 4, requires_grad=True)
        >>> out = gatv2_attention(x_l, x_l, att, graph, config=gnnact.Config(bits=2))
        >>> out.shape
        torch.Size([10, 2, 4])
    """
    heads, channels = _check_sources("x_l", x_l, graph)
    same = x_r is x_l
    _check_targets("x_r", x_r, "x_l" if same else None, heads, channels, graph)
    _check_attention_vector("att", att, heads, channels)
    if edge_attr is not None:
        if w_edge is None:
            raise ValueError("edge_attr needs its projection w_edge, got w_edge=None")
        if edge_attr.dim() != 2 or edge_attr.size(0) != graph.num_edges:
            raise ValueError(f"edge_attr must have shape [{graph.num_edges}, D], got "
                             f"{tuple(edge_attr.shape)}")
        if tuple(w_edge.shape) != (heads * channels, edge_attr.size(1)):
            raise ValueError(f"w_edge must have shape ({heads * channels}, "
                             f"{edge_attr.size(1)}), got {tuple(w_edge.shape)}")
    else:
        w_edge = None
    _check_dropout(dropout)
    return _GATv2Attention.apply(x_l, None if same else x_r, att, edge_attr, w_edge, graph,
                                 same, float(negative_slope), float(dropout), bool(training),
                                 bool(return_attention), config or Config(),
                                 records_graph(x_l, x_r, att, edge_attr, w_edge))
