r"""Dense autograd ops with compressed context: linear, BatchNorm, ReLU/LeakyReLU, dropout.

What each keeps for backward (with :math:`b` = ``config.width``):

============  =====================================================  ========================
op            forward                                                kept
============  =====================================================  ========================
linear        :math:`Y = X W^\top + b`                               :math:`X` at :math:`b`
                                                                     bits (only if :math:`W`
                                                                     needs a gradient; a
                                                                     sparse :math:`X` by
                                                                     reference)
batch_norm    :math:`Y = \gamma (X - \mu) \sigma^{-1} + \beta`       :math:`X` at :math:`b`
                                                                     bits, fp32 :math:`\mu`,
                                                                     :math:`\sigma^{-1}`
relu, leaky   :math:`Y = \max(X, 0)` / :math:`X` or :math:`s X`      1-bit mask
                                                                     :math:`[X > 0]`
elu           :math:`Y = X` / :math:`\alpha(e^X - 1)`                1-bit mask
                                                                     :math:`[X > 0]`,
                                                                     :math:`Y` at :math:`b`
                                                                     bits
dropout       :math:`Y = X \odot M / (1 - p)`                        1-bit mask :math:`M`
============  =====================================================  ========================

Each of relu, leaky_relu, elu and dropout takes ``inplace=True`` as PyTorch's does: the result
is written into the input, which then carries the op's history.

Dropout of an input that needs no gradient (the feature matrix) records nothing itself; an op
that keeps its result keeps a reference to the input and the 1-bit mask instead, and rebuilds
it exactly (:func:`gnnact.ops.context.derive_from_input`).

An input of fewer than ``config.floor`` bytes (:attr:`Config.min_bytes <gnnact.Config>`) is
kept as PyTorch keeps it: each op then runs as PyTorch's (a compressed copy would save next to
nothing and cost time).

Masks are taken from the exact input, never from a rounded copy: stochastic rounding can take a
small positive value to 0 and would silently drop its gradient. A tensor consumed by several of
these ops is quantized once (:func:`gnnact.ops.context.shared_quantize`).
"""

from __future__ import annotations

import itertools
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from gnnact.config import Config
from gnnact.ops.blocks import mean_by_blocks, row_starts, sum_by_blocks, sum_of_products
from gnnact.ops.context import (
    alias_derived,
    derive,
    derive_from_input,
    derived_steps,
    input_bits,
    load_context,
    load_packed_mask,
    mask_mode,
    masked_by_blocks,
    overwritable,
    records_graph,
    remember,
    resident,
    save_context,
    shared_quantize,
    sign_masked,
    transient,
    writable,
)
from gnnact.ops.draws import keep_bits
from gnnact.ops.higher_order import first_order_only
from gnnact.ops.state import eager_op, forward_state
from gnnact.quant import PackedMask, pack_mask
from gnnact.quant.reference import combine_mask

__all__ = ["batch_norm", "dropout", "elu", "leaky_relu", "linear", "relu"]

# Masks are exact; no quantization settings apply to them.
_NO_QUANT = Config(bits=32)
# An op given no config: the defaults (the floor of min_bytes included).
_DEFAULT = Config()


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor | None,
                config: Config) -> Tensor:
        ctx.has_bias = bias is not None
        kept = x if ctx.needs_input_grad[1] else None
        # A sparse x (bag-of-words features) is already its own compact form: kept as is.
        item = kept if x.layout != torch.strided else (kept, input_bits(x, config))
        save_context(ctx, config, item, (weight if ctx.needs_input_grad[0] else None, 32))
        out = F.linear(x, weight, bias)
        # Under autocast F.linear computes in the autocast dtype: backward's products then run
        # in it too, as autocast's own linear backward does (autograd casts each gradient to
        # its input's dtype).
        ctx.dtype = out.dtype
        return out

    @staticmethod
    @first_order_only("compressed linear map (gnnact.ops.linear)")
    def backward(ctx: Any, grad: Tensor) -> tuple:
        x_hat, weight = (None if t is None else t.to(ctx.dtype) for t in load_context(ctx))
        grad = grad.to(ctx.dtype)
        grad_x = grad_w = grad_b = None
        g2 = grad.reshape(-1, grad.size(-1))
        if ctx.needs_input_grad[1] and x_hat.layout != torch.strided:
            # dense @ COO is the fastest of torch's CPU products for G^T X (~4x CSR's).
            grad_w = g2.t() @ x_hat.to_sparse_coo()
        elif ctx.needs_input_grad[1]:
            grad_w = g2.t() @ x_hat.reshape(-1, x_hat.size(-1))
        # The restored input is let go before grad_x is made: the two never coexist at the
        # backward's peak.
        del x_hat
        if ctx.needs_input_grad[0]:
            grad_x = grad @ weight
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = sum_by_blocks(g2, [0])  # (as aggregate_linear's: a bounded staging buffer)
        return grad_x, grad_w, grad_b, None


@eager_op
def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
           config: Config | None = None) -> Tensor:
    r""":math:`Y = X W^\top + b`, keeping :math:`X` compressed for :math:`\nabla W`.

    An ``x`` of fewer than ``config.floor`` bytes (:attr:`Config.min_bytes
    <gnnact.Config>`) is kept as it is: PyTorch's op runs, as in every op here.

    Shapes: ``x [*, in]``, ``weight [out, in]``, ``bias [out]`` → ``[*, out]``. ``x`` may
    also be a 2-D sparse tensor (COO or CSR) that needs no gradient, such as bag-of-words node
    features: it is kept by reference, as the sparse tensor it is, and
    :math:`\nabla W = \nabla Y^\top X` is a sparse product.
    """
    if x.size(-1) != weight.size(1):
        raise ValueError(f"x has {x.size(-1)} features but the weight expects {weight.size(1)}")
    if x.layout != torch.strided and (x.dim() != 2 or x.requires_grad):
        raise ValueError(f"a sparse x must be 2-D and need no gradient, got shape "
                         f"{tuple(x.shape)} with requires_grad={x.requires_grad}")
    if not records_graph(x, weight, bias):
        return transient(F.linear(x, weight, bias))
    config = config or _DEFAULT
    if x.layout == torch.strided and config.keeps(x):
        return F.linear(x, weight, bias)  # below config.floor: PyTorch's op, x kept as is
    return _Linear.apply(x, weight, bias, config)


class _BatchNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor | None, bias: Tensor | None,
                running_mean: Tensor | None, running_var: Tensor | None, momentum: float,
                eps: float, config: Config) -> Tensor:
        # Batch statistics, normalising over every dimension but the channel one (1).
        out, mean, invstd = torch.native_batch_norm(x, weight, bias, running_mean, running_var,
                                                    True, momentum, eps)
        ctx.has_weight, ctx.has_bias = weight is not None, bias is not None
        packed = shared_quantize(x, input_bits(x, config), config)
        kept = x if packed.is_passthrough and packed.codes is x else packed
        # Per-channel statistics, at least float32 (native BN returns float32 for 16-bit inputs).
        save_context(ctx, config, kept, (weight, 32), mean, invstd)
        if kept is packed:  # the output is derived from kept context (picked up by batch_norm)
            ctx.gnnact_base = ((*packed.tensors(), mean, invstd, weight, bias),
                               (packed.bits, type(packed), packed.meta))
        return out

    @staticmethod
    @first_order_only("compressed BatchNorm (gnnact.ops.batch_norm)")
    def backward(ctx: Any, grad: Tensor) -> tuple:
        x_hat, weight, mean, invstd = load_context(ctx)
        shape = [1, -1] + [1] * (grad.dim() - 2)
        dims = [0, *range(2, grad.dim())]
        n = grad.numel() // grad.size(1)
        mean = mean.to(grad.dtype).view(shape)
        invstd = invstd.to(grad.dtype).view(shape)
        # x_hat may be the input itself (16/32 bits keep it as is): then it is never written.
        # The tensors made here are updated in place, in the order and with the rounding of
        # the out-of-place expressions: full-size temporaries add to the step's peak (which
        # is in backward) and on the CPU cost as much as the arithmetic.
        in_place = writable(ctx, x_hat) and torch.result_type(x_hat, mean) == x_hat.dtype
        xn = (x_hat.sub_(mean) if in_place else x_hat - mean).mul_(invstd)
        del x_hat
        # The exact normalised input has zero mean per channel, so sum_n dX_n = 0: a shift
        # before BatchNorm (the bias of the layer before) gets no gradient. Rounding noise
        # breaks that, and Adam blows the leaked noise up to full-size steps that random-walk
        # those biases (and the running means behind them). Centring keeps the sum exactly
        # zero and, being linear, keeps E[xn] unchanged.
        # (By row blocks: a GPU's whole-tensor reduction over rows allocates a staging buffer
        # that grows with the tensor, 132 MiB at SAGE's arxiv-shape step peak on an H200.)
        xn.sub_(mean_by_blocks(xn, dims, keepdim=True))
        sum_g = sum_by_blocks(grad, dims)
        sum_gx = sum_of_products(grad, xn, dims)
        grad_x = None
        if ctx.needs_input_grad[0]:
            scale = invstd if weight is None else invstd * weight.view(shape)
            if grad.dtype == xn.dtype == scale.dtype:
                # (scale / n)(n grad - sum_g - xn sum_gx), written into xn (made here) by
                # row blocks: each element rounded as in that expression, and no full-size
                # tensor beyond grad and xn.
                t = xn.mul_(sum_gx.view(shape))
                factor, sum_g_ = scale / n, sum_g.view(shape)
                starts = row_starts(grad.size(0), grad[:1].numel(), grad.device)
                for r0, r1 in itertools.pairwise(starts):
                    t[r0:r1] = (n * grad[r0:r1]).sub_(sum_g_).sub_(t[r0:r1]).mul_(factor)
                grad_x = t
            else:  # mixed dtypes: promoted where the expression promotes them
                grad_x = scale / n * (n * grad - sum_g.view(shape) - xn * sum_gx.view(shape))
        grad_w = sum_gx if ctx.has_weight and ctx.needs_input_grad[1] else None
        grad_b = sum_g if ctx.has_bias and ctx.needs_input_grad[2] else None
        return grad_x, grad_w, grad_b, None, None, None, None, None


@eager_op
def batch_norm(x: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5,
               config: Config | None = None) -> Tensor:
    r""":func:`torch.nn.functional.batch_norm` keeping its input compressed.

    In training mode (batch statistics) the input is kept at ``config.width`` bits with the
    float32 batch mean and inverse std; backward is

    .. math::
        \nabla X = \frac{\gamma \sigma^{-1}}{n}\Big(n \nabla Y - \sum \nabla Y
        - \hat X_n \sum \nabla Y \odot \hat X_n\Big), \qquad
        \hat X_n = (\hat X - \mu)\sigma^{-1} - \overline{(\hat X - \mu)\sigma^{-1}},

    centred per channel like the exact :math:`X_n`, so that :math:`\sum_n \nabla X_n = 0`
    holds exactly, as it does without compression.

    With running statistics (evaluation) it is an affine map that keeps nothing but
    :math:`\gamma`, so PyTorch's own op is used.
    """
    # (An empty batch has no statistics to keep: torch's BatchNorm returns it empty.)
    if not training or x.numel() == 0 or not records_graph(x, weight, bias):
        return transient(F.batch_norm(x, running_mean, running_var, weight, bias, training,
                                      momentum, eps))
    config = config or _DEFAULT
    if config.keeps(x):
        return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    out = _BatchNorm.apply(x, weight, bias, running_mean, running_var, momentum, eps, config)
    _record_derived(out, None, "batch_norm")
    return out


def _record_derived(out: Tensor, source: Tensor | None, kind: str,
                    source_steps: tuple | None = None) -> None:
    """Register ``out`` as derived from context its op keeps (the op left the pieces on its
    ``ctx`` as ``gnnact_base``; they are dropped from there so the ``ctx`` holds no tensor).
    ``source_steps``: ``source``'s steps read before an in-place op overwrote it."""
    ctx = out.grad_fn
    base = getattr(ctx, "gnnact_base", None)
    if base is not None:
        del ctx.gnnact_base
        derive(out, source, kind, *base, source_steps=source_steps)


class _Masked(torch.autograd.Function):
    r""":math:`Y = X \odot M / d + s X \odot (1 - M)` for a mask :math:`M` packed to 1 bit,
    which is what it keeps. ReLU is :math:`(d, s) = (1, 0)`, LeakyReLU :math:`(1, s)`, dropout
    :math:`(1 - p, 0)`. Each branch does what PyTorch's own kernel does, bit for bit, block by
    block (no whole boolean mask beside the input and the output). With ``inplace`` the
    result is written over :math:`X` (marked dirty): no second full-size tensor."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, packed: PackedMask | None, divisor: float,
                slope: float, inplace: bool) -> Tensor:
        out = x if inplace else None
        if packed is None:  # the sign of X, made with the output (one pass on a GPU)
            packed, out = sign_masked(x, slope, out)
        else:
            out = masked_by_blocks(x, packed, divisor, slope, out=out)
        if inplace:
            ctx.mark_dirty(x)
        save_context(ctx, _NO_QUANT, packed)
        ctx.divisor, ctx.slope = divisor, slope
        ctx.gnnact_base = ((packed.data,), (packed.shape, divisor, slope))
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        if torch.is_grad_enabled() or grad.dim() == 0 or not grad.is_contiguous():
            # Double backward (and the odd layout): as written, with the whole mask.
            (mask,) = load_context(ctx)
            out = combine_mask(grad, mask, *mask_mode(ctx.divisor, ctx.slope, grad.dtype,
                                                      backward=True))
        else:
            # The same values in one pass on a GPU, by blocks on the torch path: neither the
            # boolean mask nor a float copy of it is ever a full-size temporary at the
            # backward's peak.
            out = masked_by_blocks(grad, load_packed_mask(ctx), ctx.divisor, ctx.slope,
                                   backward=True)
        # Double backward (create_graph=True) is exact as written at every width: this is
        # linear in the gradient, the mask is exact, and d/dX of it is 0 almost everywhere. With
        # a constant incoming gradient nothing here is recorded, though, where PyTorch's ReLU
        # (and dropout) still returns a differentiable gradient that differentiates to zeros:
        # a graph leaf of its own gives that zero (no path to X) rather than an error.
        if torch.is_grad_enabled() and not out.requires_grad:
            out = out.detach().requires_grad_()
        return out, None, None, None, None


def _masked(x: Tensor, packed: PackedMask | None, divisor: float, slope: float,
            inplace: bool = False) -> Tensor:
    """:class:`_Masked` (``packed`` ``None``: the sign of ``x``), derived from ``x``'s
    context; ``inplace`` writes over ``x`` where
    autograd lets a function do so (contiguous, not a view: a view's base would need its
    history rewritten), else computes beside it and copies back, as PyTorch's in-place ops
    promise the same result either way."""
    if inplace and not overwritable(x):
        return _into(x, _masked(x, packed, divisor, slope))
    steps = derived_steps(x) if inplace else None  # read before x is overwritten
    out = _Masked.apply(x, packed, divisor, slope, inplace)
    _record_derived(out, x, "mask", steps)
    return out


class _CopyInto(torch.autograd.Function):
    """``x.copy_(y)`` in place, marking ``x`` dirty: ``x`` then carries ``y``'s history (its
    old value gets no gradient from here, as after any in-place overwrite). Keeps nothing."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, y: Tensor) -> Tensor:
        x.copy_(y)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple:
        return None, grad


def _into(x: Tensor, out: Tensor) -> Tensor:
    """An in-place op's result: ``out`` written into ``x`` (derived as ``out`` is)."""
    x = _CopyInto.apply(x, out)
    alias_derived(x, out)
    return x


@eager_op
def relu(x: Tensor, inplace: bool = False, config: Config | None = None) -> Tensor:
    """ReLU keeping a 1-bit mask :math:`[X > 0]` (``config`` gives only the floor,
    :attr:`Config.min_bytes <gnnact.Config>`)."""
    if not records_graph(x) or (config or _DEFAULT).keeps(x):
        return transient(F.relu(x, inplace=inplace))
    return _masked(x, None, 1.0, 0.0, inplace)


@eager_op
def leaky_relu(x: Tensor, negative_slope: float = 0.01, inplace: bool = False,
               config: Config | None = None) -> Tensor:
    """LeakyReLU keeping a 1-bit mask :math:`[X > 0]` (``config``: as :func:`relu`'s)."""
    if not records_graph(x) or (config or _DEFAULT).keeps(x):
        return transient(F.leaky_relu(x, negative_slope, inplace=inplace))
    return _masked(x, None, 1.0, float(negative_slope), inplace)


class _ELU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, alpha: float, config: Config, role: str,
                inplace: bool) -> Tensor:
        mask = pack_mask(x > 0)
        if inplace:  # written over X (marked dirty): no second full-size tensor
            ctx.mark_dirty(x)
            out = F.elu(x, alpha, inplace=True)
        else:
            out = F.elu(x, alpha)
        ctx.alpha = alpha
        packed = shared_quantize(out, config.width, config, role)
        ctx.packed = not (packed.is_passthrough and packed.codes is out)
        if not ctx.packed:  # 16/32 bits: the output itself
            save_context(ctx, _NO_QUANT, mask, out)
        else:
            save_context(ctx, _NO_QUANT, mask, packed)
            ctx.gnnact_base = ((*packed.tensors(),), (packed.bits, type(packed), packed.meta),
                               packed)
        return out

    @staticmethod
    @first_order_only("compressed ELU (gnnact.ops.elu)")
    def backward(ctx: Any, grad: Tensor) -> tuple:
        mask, out_hat = load_context(ctx)
        # dY/dX = 1 on X > 0, alpha e^X = Y + alpha elsewhere: linear in the kept Y, so the
        # gradient stays unbiased with Y rounded.
        # (A restored copy is ours to overwrite; the output itself is not.)
        slope = out_hat.add_(ctx.alpha) if ctx.packed else out_hat + ctx.alpha
        return torch.where(mask, grad, grad * slope), None, None, None, None


@eager_op
def elu(x: Tensor, alpha: float = 1.0, inplace: bool = False, config: Config | None = None,
        role: str = "elu") -> Tensor:
    r"""ELU keeping a 1-bit mask :math:`[X > 0]` and its output :math:`Y` at ``config.width``
    bits: :math:`\nabla X = \nabla Y \odot ([X > 0] + (\hat Y + \alpha)[X \le 0])`, unbiased.
    The packed :math:`Y` is shared with the next op that keeps :math:`Y` (a linear map), and a
    mask op on :math:`Y` (dropout) leaves a tensor that op rebuilds instead of keeping."""
    config = config or _DEFAULT
    if not records_graph(x) or config.keeps(x):
        return transient(F.elu(x, alpha, inplace=inplace))
    if inplace and not overwritable(x):
        # As _masked: a view (or odd layout) gets the result beside it, copied back.
        return _into(x, elu(x, alpha, False, config, role))
    out = _ELU.apply(x, float(alpha), config, role, inplace)
    base = getattr(out.grad_fn, "gnnact_base", None)
    if base is not None:
        del out.grad_fn.gnnact_base
        tensors, meta, packed = base
        derive(out, None, "packed", tensors, meta)
        remember(out, (packed.bits, config.group_size, config.per_row, config.per_node,
                       config.backend), packed)
    return out


def _resident_in_pass(x: Tensor) -> bool:
    """Whether ``x`` is an input of the converted model's training pass that runs now (it needs
    no gradient, and the pass records a graph and knows its inputs)."""
    return (torch.is_grad_enabled() and x.layout == torch.strided
            and forward_state().resident is not None and resident(x))


def _input_dropout(x: Tensor, p: float) -> Tensor:
    r"""``F.dropout(x, p)`` of an input ``x`` (the feature matrix), outside autograd, recorded
    as derived from ``x`` and its 1-bit keep-mask: an op that keeps the result (the first
    layer's linear map, for :math:`\nabla W`) keeps a reference to ``x`` and the mask, rebuilt
    exactly in backward, instead of a rounded copy of the result at its own width."""
    keep = keep_bits(x, p)
    with torch.no_grad():
        out = masked_by_blocks(x, keep, 1.0 - p, 0.0)
    derive_from_input(out, x, "mask", (keep.data,), (keep.shape, 1.0 - p, 0.0))
    return transient(out)


@eager_op
def dropout(x: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False,
            config: Config | None = None) -> Tensor:
    r"""Dropout keeping its keep-mask :math:`M \sim \mathrm{Bernoulli}(1-p)` in 1 bit
    (``config``: as :func:`relu`'s; an input of the model's pass is masked outside autograd
    whatever its size, see :func:`_input_dropout`).

    The mask is drawn exactly as :func:`torch.nn.functional.dropout` draws it, on the CPU and
    on a GPU (:func:`gnnact.ops.draws.keep_bits`), so a seeded run reproduces PyTorch's.
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    if p < 1.0 and not inplace and _resident_in_pass(x):
        return _input_dropout(x, p)
    if p == 1.0 or not records_graph(x) or (config or _DEFAULT).keeps(x):
        return transient(F.dropout(x, p, training, inplace))
    # F.dropout's draws (gnnact.ops.draws), packed before the output is made (on a GPU
    # computed straight into bits; the whole draw is one call, as F.dropout's).
    keep = keep_bits(x, p)
    return _masked(x, keep, 1.0 - p, 0.0, inplace)
