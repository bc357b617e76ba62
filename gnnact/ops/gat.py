r"""Fused GAT attention whose backward keeps node features, not edge messages.

For :math:`H` heads of :math:`C` channels, source features :math:`X^s \in
\mathbb{R}^{N_s \times H \times C}` and target features :math:`X^d \in \mathbb{R}^{N_d \times H
\times C}` (the same tensor on a non-bipartite graph):

.. math::
    a^s_{j,h} = \langle X^s_{j,h}, \mathbf{a}^s_h \rangle, \qquad
    a^d_{i,h} = \langle X^d_{i,h}, \mathbf{a}^d_h \rangle,

    s_{e,h} = \mathrm{LeakyReLU}\big(a^s_{j,h} + a^d_{i,h} + a^E_{e,h}\big), \qquad
    \alpha_{e,h} = \frac{\exp s_{e,h}}{\sum_{e' \to i} \exp s_{e',h}}, \qquad
    \tilde\alpha_{e,h} = \frac{M_{e,h}}{1 - p} \alpha_{e,h},

    Y_{i,h} = \sum_{e = (j \to i)} \tilde\alpha_{e,h} X^s_{j,h},

with :math:`a^E` optional edge logits (``edge_dim``) and :math:`M` the dropout keep mask
(training only). This is :class:`torch_geometric.nn.GATConv`'s ``edge_updater`` and
``propagate`` in one :class:`torch.autograd.Function`.

**What backward keeps.** PyG's gather → multiply → scatter keeps the gathered messages
:math:`X^s_{\mathrm{src}(e)}`, an :math:`E \times H \times C` tensor, plus :math:`\alpha` and
several :math:`E \times H` intermediates in full precision. Here backward keeps

* :math:`X^s` (:math:`N_s H C` values) at ``config.width`` bits, through the shared packed copy
  of :func:`~gnnact.ops.context.save_context`, and :math:`X^d` likewise only when it is a
  different tensor and :math:`\mathbf{a}^d` needs a gradient;
* while :math:`\mathbf{a}^s` (or, when :math:`X^d` is :math:`X^s`, :math:`\mathbf{a}^d`) needs a
  gradient, a second copy :math:`\tilde X^s` at ``config.width`` bits, rounded independently of
  the first (why: below);
* :math:`\alpha` (before dropout) at ``config.attention`` bits (8 by default: a uniform 4 bits
  collapses GAT, GACT Table 3), quantized as the transposed :math:`H \times E` tensor so that a
  group of :math:`G` = ``config.group_size`` values is :math:`G` consecutive edges of one head:
  :math:`64/G` bits of metadata per value (0.125 at :math:`G=512`); with ``config.per_row`` a
  group is a whole head (Mesa's per-head ranges);
* the LeakyReLU sign mask :math:`[s > 0]` and the dropout keep mask :math:`M`, 1 bit each per
  edge and head;
* :math:`\mathbf{a}^s, \mathbf{a}^d` (parameters, not copied) and the graph (cached once per
  adjacency, shared by every layer).

No :math:`E \times H \times C` tensor is kept: backward re-gathers from the compressed
:math:`\hat X^s` in chunks. Backward, with :math:`G = \nabla Y`:

.. math::
    \nabla X^s_{j,h} &= \sum_{e = (j \to i)} \tilde\alpha_{e,h} G_{i,h}
        + \nabla a^s_{j,h} \mathbf{a}^s_h, \qquad
    \nabla \tilde\alpha_{e,h} = \langle G_{i,h}, \hat X^s_{j,h} \rangle, \qquad
    \nabla\alpha = \frac{M}{1-p} \nabla\tilde\alpha, \\
    \nabla s_{e,h} &= \hat\alpha_{e,h}\Big(\nabla\alpha_{e,h} - \sum_{e' \to i}
        \hat\alpha_{e',h} \nabla\alpha_{e',h}\Big) \cdot (1 \text{ if } s_{e,h} > 0
        \text{ else the slope}), \\
    \nabla a^s_{j,h} &= \sum_{e = (j \to \cdot)} \nabla s_{e,h}, \quad
    \nabla a^d_{i,h} = \sum_{e = (\cdot \to i)} \nabla s_{e,h}, \quad
    \nabla a^E = \nabla s, \\
    \nabla X^d_{i,h} &= \nabla a^d_{i,h} \mathbf{a}^d_h, \quad
    \nabla \mathbf{a}^s_h = \sum_j \nabla a^s_{j,h} \tilde X^s_{j,h}, \quad
    \nabla \mathbf{a}^d_h = \sum_i \nabla a^d_{i,h} \tilde X^d_{i,h},

with :math:`\tilde X^d = \tilde X^s` when :math:`X^d` is :math:`X^s`, else :math:`\hat X^d`.

The first term of :math:`\nabla X^s` does not read :math:`\hat X^s` at all, and
:math:`\nabla X^s, \nabla X^d, \nabla a^E` are linear in it, so with exact :math:`\alpha` they
are unbiased (stochastic rounding). The attention vectors' gradients are products of
:math:`\nabla a^s` or :math:`\nabla a^d`, linear in :math:`\hat X^s`, and of the features of
the same nodes. Were those :math:`\hat X^s` again, the product would carry
:math:`\mathrm{Cov}(\langle G_{i,h}, \hat X^s_{j,h} \rangle, \hat X^s_{j,h,c}) = G_{i,h,c}
\mathrm{Var}[\hat X^s_{j,h,c}]` for every edge :math:`j \to i` (for :math:`\mathbf{a}^d`,
through the self-loops): at 2 bits a bias of the order of the gradient itself (30–40 % of
:math:`\|\nabla \mathbf{a}^s\|` on small random graphs), which cannot be subtracted, since
:math:`\mathrm{Var}` cannot be estimated from one rounding. With :math:`\tilde X^s` rounded
independently, :math:`\mathbb{E}[\nabla a^s \tilde X^s] = \mathbb{E}[\nabla a^s] X^s`: unbiased,
for :math:`N_s H C` values more at ``config.width`` (:mod:`gnnact.ops.gatv2` does the same). A
separate :math:`\hat X^d` is rounded independently of :math:`\hat X^s` already.
:math:`\hat\alpha` enters the softmax backward quadratically, a bias of order
:math:`\mathrm{Var}[\hat\alpha] \le (R/255)^2/4` at 8 bits.

Per-edge tensors given to or returned by the op (:math:`a^E`, the returned
:math:`\tilde\alpha`) are in the **input edge order** of the adjacency the graph was built from
(``edge_index`` column order, or the order of :func:`torch_geometric.utils.to_edge_index` for a
sparse adjacency); internally everything runs in CSR order (edges grouped by target), mapped
through :attr:`Graph.input_perm <gnnact.ops.graph.Graph>`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.utils import softmax

from gnnact.config import Config
from gnnact.ops.blocks import sum_of_products
from gnnact.ops.context import independent_quantize, load_context, records_graph, save_context
from gnnact.ops.draws import keep_mask
from gnnact.ops.graph import Graph, csr_tensor
from gnnact.ops.higher_order import first_order_only
from gnnact.ops.state import eager_op
from gnnact.quant import pack_mask

__all__ = ["gat_attention"]

#: Elements of one transient gathered block ``[edges, H, C]`` in backward's edge dot products
#: (and in the fallback aggregation): bounds the re-gather at 16M values whatever the graph.
CHUNK_ELEMENTS = 1 << 24

# Dtypes that torch's CSR x dense product supports on every device; others (fp16/bf16 on the
# CPU) aggregate through chunked gather + index_add.
_CSR_DTYPES = (torch.float32, torch.float64)

# How the targets' features relate to the sources'.
_SAME, _SEPARATE, _NONE = 0, 1, 2
#: Where X~^s is among what forward keeps (save_context's items).
_TILDE = 7


def _to_csr(edge_tensor: Tensor, graph: Graph) -> Tensor:
    """Reorder a per-edge tensor from input order to CSR order."""
    return graph.to_csr_order(edge_tensor)


def _to_input(edge_tensor: Tensor, graph: Graph) -> Tensor:
    """Reorder a per-edge tensor from CSR order to input order (inverse of :func:`_to_csr`)."""
    return graph.to_input_order(edge_tensor)


def _segment_sum(edge_values: Tensor, graph: Graph) -> Tensor:
    """Sum of a ``[E, H]`` tensor over the incoming edges of each target: ``[N_dst, H]``.

    Edges are grouped by target (CSR), so this is a segmented sum: deterministic, no atomics.
    """
    if graph.num_edges == 0:
        return edge_values.new_zeros(graph.num_dst, *edge_values.shape[1:])
    return torch.segment_reduce(edge_values, "sum", offsets=graph.ptr.long(), axis=0)


def _aggregate(weights_t: Tensor, x: Tensor, graph: Graph, transpose: bool) -> Tensor:
    r"""Per-head weighted sparse product.

    ``transpose=False``: :math:`Y_{i,h} = \sum_{e=(j \to i)} w_{h,e} X_{j,h}` (``x`` is
    ``[N_src, H, C]``, result ``[N_dst, H, C]``); ``transpose=True``: :math:`\sum_{e=(j \to i)}
    w_{h,e} X_{i,h}` into source :math:`j` (``x`` is ``[N_dst, H, C]``). ``weights_t`` is
    ``[H, E]`` in CSR order.
    """
    num_out = graph.num_src if transpose else graph.num_dst
    heads, channels = x.shape[1], x.shape[2]
    weights_t = weights_t.contiguous()  # each head's values one dense row (CSR values)
    # PyG's messages alpha_ij x_j promote: under autocast, float32 attention on bfloat16
    # features aggregates (and returns) float32.
    dtype = torch.promote_types(x.dtype, weights_t.dtype)
    if dtype in _CSR_DTYPES:
        # One CSR x dense product per head: no [E, H, C] transient at all. One head's
        # features at a time ([N, C], a 1/H share), written into its slice of the result:
        # neither a head-major copy of the input nor one of the result exists whole.
        out = x.new_empty(num_out, heads, channels, dtype=dtype)
        # A^T's index once for all heads (the parts the graph does not keep are made here).
        index = graph.transpose_index() if transpose else None
        for h in range(heads):
            out[:, h] = graph.mm(x[:, h].to(dtype).contiguous(), weights_t[h],
                                 transpose=transpose, index=index)
        return out
    out = x.new_zeros(num_out, heads, channels, dtype=dtype)
    gather, scatter = (graph.dst, graph.src) if transpose else (graph.src, graph.dst)
    weights = weights_t.t()
    step = max(1, CHUNK_ELEMENTS // max(1, heads * channels))
    for start in range(0, graph.num_edges, step):
        sl = slice(start, start + step)
        msg = x.index_select(0, gather[sl]) * weights[sl].unsqueeze(-1)
        out.index_add_(0, scatter[sl], msg)
    return out


def _edge_dot(grad: Tensor, x: Tensor, graph: Graph) -> Tensor:
    r""":math:`\langle G_{\mathrm{dst}(e),h}, X_{\mathrm{src}(e),h} \rangle` for every CSR edge,
    ``[E, H]`` (a sampled dense-dense product, SDDMM).

    float32/float64: one :func:`torch.sparse.sampled_addmm` per head, which computes the dot
    products at the graph's nonzeros without materialising any gathered rows. Other dtypes:
    gather both sides in chunks of at most :data:`CHUNK_ELEMENTS` values.
    """
    heads, channels = x.shape[1], x.shape[2]
    num_edges = graph.num_edges
    if num_edges == 0:
        return x.new_zeros(0, heads)
    if x.dtype in _CSR_DTYPES:
        pattern = csr_tensor(graph.ptr, graph.src, x.new_zeros(num_edges),
                       (graph.num_dst, graph.num_src))
        out = x.new_empty(num_edges, heads)
        for h in range(heads):  # one head's [N, C] rows at a time (a 1/H share of each side)
            out[:, h] = torch.sparse.sampled_addmm(pattern, grad[:, h].contiguous(),
                                                   x[:, h].contiguous().t(), beta=0.0).values()
        return out
    out = x.new_empty(num_edges, heads)
    step = max(1, CHUNK_ELEMENTS // max(1, heads * channels))
    src, dst = graph.src, graph.dst
    for start in range(0, num_edges, step):
        sl = slice(start, start + step)
        torch.sum(grad.index_select(0, dst[sl]) * x.index_select(0, src[sl]), dim=-1,
                  out=out[sl])
    return out


class _GATAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, xs: Tensor, xd: Tensor | None, att_src: Tensor,
                att_dst: Tensor | None, a_edge: Tensor | None, graph: Graph, dst_mode: int,
                negative_slope: float, p: float, training: bool, want_alpha: bool,
                config: Config, record: bool) -> Tensor | tuple[Tensor, Tensor]:
        # Unused outputs (the attention weights, when nobody reads them) come back as None.
        ctx.set_materialize_grads(False)
        num_edges, heads = graph.num_edges, xs.size(1)
        x_dst = xs if dst_mode == _SAME else xd

        # Node-level logits, then one gather per side: the E x H x C messages never exist here.
        # The expressions (and their order of additions) are PyG's, so fp64 results agree.
        a_src = (xs * att_src).sum(dim=-1)
        s = a_src.index_select(0, graph.src)
        if x_dst is not None:
            a_dst = (x_dst * att_dst).sum(dim=-1)
            s = s + a_dst.index_select(0, graph.dst)
        if a_edge is not None:
            s = s + _to_csr(a_edge, graph)
        positive = s > 0
        s = F.leaky_relu(s, negative_slope)
        # (An empty graph has nothing to normalise; PyG skips the softmax there too.)
        alpha = softmax(s, ptr=graph.ptr.long(), num_nodes=graph.num_dst) if num_edges else s

        keep = scale = None
        alpha_d = alpha
        if training and p > 0.0:
            if p >= 1.0:  # as F.dropout: zeros, no random draw
                keep = torch.zeros_like(positive)
                alpha_d = alpha * 0.0
            else:
                # Drawn as F.dropout draws it (same dtype, shape and input edge order),
                # so a seeded run reproduces PyG's mask.
                noise = keep_mask(alpha.new_empty(num_edges, heads), p, alpha.dtype)
                noise = _to_csr(noise, graph)
                keep = noise.bool()
                scale = noise.div_(1 - p)
                alpha_d = alpha * scale

        out = _aggregate(alpha_d.t(), xs, graph, transpose=False)

        ctx.graph, ctx.dst_mode = graph, dst_mode
        ctx.negative_slope, ctx.p = negative_slope, p
        ctx.has_edge = a_edge is not None
        ctx.shape_s = xs.shape
        # `record` (grad mode on, some input needs a gradient) rather than needs_input_grad,
        # which stays set under torch.no_grad: evaluation keeps (and quantizes) nothing.
        if record:
            keep_xd = dst_mode == _SEPARATE and ctx.needs_input_grad[3]
            # The attention vectors' gradients multiply grad s, which reads the rounding of
            # X^s, by features of the same nodes: they read a copy rounded independently.
            need_tilde = ctx.needs_input_grad[2] or (dst_mode == _SAME
                                                     and ctx.needs_input_grad[3])
            # alpha.t(): the [H, E] view, so that quantization groups run along the edges of
            # one head (see the module docstring).
            save_context(ctx, config, (xs, config.width, "features"),
                         (xd if keep_xd else None, config.width, "features"),
                         (alpha.t(), config.attention, "attention"),
                         (att_src, 32),
                         (att_dst if x_dst is not None else None, 32),
                         pack_mask(positive),
                         None if keep is None else pack_mask(keep),
                         independent_quantize(xs, config, "features") if need_tilde else None)
        else:
            save_context(ctx, config)

        if not want_alpha:
            return out
        alpha_out = _to_input(alpha_d, graph)
        return out, alpha_out

    @staticmethod
    @first_order_only("GAT attention (gnnact.ops.gat_attention)")
    def backward(ctx: Any, grad_out: Tensor | None, grad_alpha: Tensor | None = None) -> tuple:
        graph: Graph = ctx.graph
        # X~^s (when kept apart) is restored once X^s has gone: two full-size copies of the
        # input never coexist.
        tilde_kept = ctx.gnnact_slots[_TILDE] is not None
        xs_hat, xd_hat, alpha_t, att_src, att_dst, positive, keep, _ = load_context(
            ctx, only=range(_TILDE))
        # float16/bfloat16 in float32 (transients only; autograd rounds each gradient to its
        # input's dtype once): the softmax backward's difference of nearly equal terms lost
        # up to 15% of a 3-layer model's attention gradients in float16, PyG's own autograd
        # under 1% (tests/test_mixed_precision.py).
        dtype = torch.promote_types(xs_hat.dtype, torch.float32)
        xs_hat, xd_hat, alpha_t = (None if t is None else t.to(dtype)
                                   for t in (xs_hat, xd_hat, alpha_t))
        alpha = alpha_t.t()  # [E, H]
        heads = alpha.size(1)
        if grad_out is None:  # only the returned attention weights were used
            grad_out = xs_hat.new_zeros(graph.num_dst, *ctx.shape_s[1:])
        grad_out = grad_out.to(dtype)

        scale = None
        if keep is not None:
            scale = (keep.to(dtype) / (1 - ctx.p)) if ctx.p < 1.0 else keep.to(dtype)
        alpha_d = alpha if scale is None else alpha * scale

        grad_xs = grad_xd = grad_att_src = grad_att_dst = grad_edge = None
        need_xs = ctx.needs_input_grad[0]
        if need_xs:
            grad_xs = _aggregate(alpha_d.t(), grad_out, graph, transpose=True)

        # d alpha~ = <G_i, X^_j>: re-gathered from the compressed X^s in chunks.
        grad_ad = _edge_dot(grad_out, xs_hat, graph)
        # X^s is read no more: X~^s is X^s itself, or its own copy restored now.
        xs_tilde = None if tilde_kept else xs_hat
        del xs_hat
        if xs_tilde is None:
            xs_tilde = load_context(ctx, only=(_TILDE,))[_TILDE].to(dtype)
        if grad_alpha is not None:
            grad_ad = grad_ad + _to_csr(grad_alpha.to(dtype), graph)
        grad_a = grad_ad if scale is None else grad_ad * scale
        # Softmax backward per target and head.
        weighted = alpha * grad_a
        grad_s = weighted - alpha * _segment_sum(weighted, graph).index_select(0, graph.dst)
        grad_s = torch.where(positive, grad_s, grad_s * ctx.negative_slope)

        grad_a_src = grad_s.new_zeros(graph.num_src, heads).index_add_(0, graph.src, grad_s)
        # (grad_xs is _aggregate's result, ours: the products go into it in place, and the
        # attention vectors' gradients sum by row blocks; no full-size product is made.)
        if need_xs:
            grad_xs.addcmul_(grad_a_src.unsqueeze(-1), att_src)
        # X~^s: rounded independently of the X^s that grad_s read (X^s itself at 16/32 bits).
        if ctx.needs_input_grad[2]:
            grad_att_src = sum_of_products(grad_a_src.unsqueeze(-1), xs_tilde, [0]).unsqueeze(0)

        if ctx.dst_mode != _NONE:
            grad_a_dst = _segment_sum(grad_s, graph)
            if ctx.needs_input_grad[3]:
                x_dst_hat = xs_tilde if ctx.dst_mode == _SAME else xd_hat
                grad_att_dst = sum_of_products(grad_a_dst.unsqueeze(-1), x_dst_hat,
                                               [0]).unsqueeze(0)
            if ctx.dst_mode == _SAME and need_xs:
                # X^d is X^s: one input, one gradient.
                grad_xs.addcmul_(grad_a_dst.unsqueeze(-1), att_dst)
            elif ctx.needs_input_grad[1]:
                grad_xd = grad_a_dst.unsqueeze(-1) * att_dst

        if ctx.has_edge and ctx.needs_input_grad[4]:
            grad_edge = _to_input(grad_s, graph)
        return (grad_xs, grad_xd, grad_att_src, grad_att_dst, grad_edge,
                None, None, None, None, None, None, None, None)


def _check_sources(name: str, x: Any, graph: Graph) -> tuple[int, int]:
    """``(H, C)`` of an attention op's source features ``x``, ``[N_src, H, C]`` (checked
    against the graph; a clear error naming ``name`` otherwise)."""
    if not isinstance(x, Tensor) or not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got "
                        f"{getattr(x, 'dtype', type(x).__name__)}")
    if x.dim() != 3:
        raise ValueError(f"{name} must have shape [N_src, H, C], got {tuple(x.shape)}")
    if x.size(0) != graph.num_src:
        raise ValueError(f"{name} has {x.size(0)} rows but the graph has {graph.num_src} "
                         f"source nodes")
    return x.shape[1], x.shape[2]


def _check_targets(name: str, x: Any, source: str | None, heads: int, channels: int,
                   graph: Graph) -> None:
    """An attention op's target features ``x``, ``[N_dst, H, C]``; ``source``: the name of
    the source features when ``x`` is that very tensor."""
    if source is None and (not isinstance(x, Tensor) or x.dim() != 3
                           or tuple(x.shape[1:]) != (heads, channels)):
        got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"{name} must have shape [N_dst, {heads}, {channels}], got {got}")
    if x.size(0) != graph.num_dst:
        what = f"{name} has" if source is None else f"{name} is {source} with"
        raise ValueError(f"{what} {x.size(0)} rows but the graph has {graph.num_dst} target "
                         f"nodes")


def _check_attention_vector(name: str, att: Any, heads: int, channels: int) -> None:
    """An attention vector, ``[1, H, C]``."""
    if not isinstance(att, Tensor) or tuple(att.shape) != (1, heads, channels):
        got = tuple(att.shape) if isinstance(att, Tensor) else att
        raise ValueError(f"{name} must have shape (1, {heads}, {channels}), got {got}")


def _check_dropout(p: float) -> None:
    """A dropout probability in :math:`[0, 1]`."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")


@eager_op
def gat_attention(xs: Tensor, xd: Tensor | None, att_src: Tensor, att_dst: Tensor | None,
                  graph: Graph, a_edge: Tensor | None = None, negative_slope: float = 0.2,
                  dropout: float = 0.0, training: bool = False, return_attention: bool = False,
                  config: Config | None = None) -> Tensor | tuple[Tensor, Tensor]:
    r"""GAT attention and aggregation in one op (see the module docstring for the math and
    what backward keeps).

    Args:
        xs (torch.Tensor): projected source features :math:`X^s`, ``[N_src, H, C]``.
        xd (torch.Tensor, optional): projected target features :math:`X^d`,
            ``[N_dst, H, C]``; may be ``xs`` itself (kept once), or :obj:`None` for no target
            term (PyG's ``(x_src, None)`` input).
        att_src (torch.Tensor): :math:`\mathbf{a}^s`, ``[1, H, C]``.
        att_dst (torch.Tensor, optional): :math:`\mathbf{a}^d`, ``[1, H, C]`` (unused when
            ``xd`` is :obj:`None`).
        graph (Graph): the adjacency (self-loops already added if wanted).
        a_edge (torch.Tensor, optional): edge logits :math:`a^E`, ``[E, H]``, in input edge
            order.
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
        ValueError: shapes that do not match each other or the graph, or a dropout
            probability outside :math:`[0, 1]`.
        TypeError: non-floating-point features.
    """
    heads, channels = _check_sources("xs", xs, graph)
    _check_attention_vector("att_src", att_src, heads, channels)
    if xd is xs:
        dst_mode = _SAME
        _check_targets("xd", xs, "xs", heads, channels, graph)
        xd = None
    elif xd is None:
        dst_mode = _NONE
        att_dst = None
    else:
        dst_mode = _SEPARATE
        _check_targets("xd", xd, None, heads, channels, graph)
    if dst_mode != _NONE:
        _check_attention_vector("att_dst", att_dst, heads, channels)
    if a_edge is not None and tuple(a_edge.shape) != (graph.num_edges, heads):
        raise ValueError(f"a_edge must have shape ({graph.num_edges}, {heads}), got "
                         f"{tuple(a_edge.shape)}")
    _check_dropout(dropout)
    return _GATAttention.apply(xs, xd, att_src, att_dst, a_edge, graph, dst_mode,
                               float(negative_slope), float(dropout), bool(training),
                               bool(return_attention), config or Config(),
                               records_graph(xs, xd, att_src, att_dst, a_edge))
