r"""Drop-in ``torch.nn`` layers with compressed context, for :func:`gnnact.convert`.

Each is a subclass of the PyTorch module it replaces, with the same constructor (plus
``config``), parameters, buffers and ``state_dict`` keys:

================  ===============================================================
module            kept for backward
================  ===============================================================
``Linear``        input at ``config.bits`` bits (PyTorch: the full input)
``BatchNorm1d``   input at ``config.bits`` bits + per-channel mean and inverse std
``ReLU``          1-bit mask (PyTorch: the full output)
``LeakyReLU``     1-bit mask (PyTorch: the full input)
``Dropout``       1-bit mask (PyTorch: a byte per element)
================  ===============================================================
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from gnnact import ops
from gnnact.config import Config
from gnnact.nn._base import _Compressed, same_shape

__all__ = ["BatchNorm1d", "Dropout", "LeakyReLU", "Linear", "ReLU"]


class Linear(_Compressed, nn.Linear):
    r""":class:`torch.nn.Linear` keeping its input at ``config.bits`` bits:

    .. math::
        \mathbf{Y} = \mathbf{X} \mathbf{W}^\top + \mathbf{b}, \qquad
        \nabla \mathbf{W} = \nabla \mathbf{Y}^\top \hat{\mathbf{X}}, \qquad
        \nabla \mathbf{X} = \nabla \mathbf{Y} \mathbf{W},

    where :math:`\hat{\mathbf{X}}` is :math:`\mathbf{X}` restored from its packed copy
    (:func:`gnnact.quantize`, unbiased), so :math:`\nabla \mathbf{W}` is unbiased and
    :math:`\nabla \mathbf{X}` exact. Kept for backward: :math:`\mathbf{X}` at ``config.bits``
    bits, only if the weight needs a gradient (one packed copy shared with every other gnnact op
    that keeps the same tensor; an input that needs no gradient, such as the feature matrix, is
    kept by reference with ``config.resident_inputs``), and a reference to :math:`\mathbf{W}`.
    PyTorch's layer keeps :math:`\mathbf{X}` in full precision.

    Args:
        in_features (int): size of each input sample.
        out_features (int): size of each output sample.
        bias (bool, optional): learn an additive bias :math:`\mathbf{b}`.
            (default: :obj:`True`)
        device (torch.device, optional): device of the parameters. (default: :obj:`None`)
        dtype (torch.dtype, optional): dtype of the parameters. (default: :obj:`None`)
        config (gnnact.Config, optional): storage of the context.
            (default: ``Config()``, 2 bits)

    Shapes:
        - **input:** :math:`(*, F_{in})`
        - **output:** :math:`(*, F_{out})`

    Example:
        >>> lin = gnnact.nn.Linear(128, 64, config=gnnact.Config(bits=2))
        >>> x = torch.randn(1000, 128, requires_grad=True)
        >>> y = lin(x)
        >>> y.shape
        torch.Size([1000, 64])
        >>> gnnact.memory.saved_bytes(y)  # x at 2 bits: 250 groups of 128 + 8 bytes
        34000
        >>> y.sum().backward()
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None, *, config: Config | None = None) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self._init_gnnact(config)

    def forward(self, x: Tensor) -> Tensor:
        return ops.linear(x, self.weight, self.bias, self.config)

    def _compiled_shape(self, x: Tensor) -> list[int]:
        return [*x.shape[:-1], self.out_features]


class BatchNorm1d(_Compressed, nn.BatchNorm1d):
    r""":class:`torch.nn.BatchNorm1d` keeping its input at ``config.bits`` bits and the batch
    statistics in (at least) float32 (see :func:`gnnact.ops.batch_norm`):

    .. math::
        \mathbf{Y} = \gamma \odot \frac{\mathbf{X} - \mu}{\sqrt{\sigma^2 + \epsilon}}
        + \beta,

    per channel, with the batch mean :math:`\mu` and (biased) variance :math:`\sigma^2` in
    training and the running estimates in evaluation; the running estimates are updated as
    PyTorch updates them. Kept for backward in training: :math:`\mathbf{X}` at ``config.bits``
    bits (shared with the other gnnact ops that keep it) plus the float32 :math:`\mu` and
    :math:`1/\sqrt{\sigma^2 + \epsilon}` (:math:`C` values each) and a reference to
    :math:`\gamma`. In evaluation the layer is an affine map and PyTorch's own op runs.

    Args:
        num_features (int): number of channels :math:`C`.
        eps (float, optional): :math:`\epsilon`, added to the variance. (default: :obj:`1e-5`)
        momentum (float, optional): weight of the batch statistics in the running estimates;
            :obj:`None` for a cumulative average. (default: :obj:`0.1`)
        affine (bool, optional): learn :math:`\gamma` and :math:`\beta`.
            (default: :obj:`True`)
        track_running_stats (bool, optional): keep running estimates for evaluation.
            (default: :obj:`True`)
        device (torch.device, optional): device of the parameters and buffers.
            (default: :obj:`None`)
        dtype (torch.dtype, optional): dtype of the parameters and buffers.
            (default: :obj:`None`)
        config (gnnact.Config, optional): storage of the context.
            (default: ``Config()``, 2 bits)

    Shapes:
        - **input:** :math:`(N, C)` or :math:`(N, C, L)`
        - **output:** the same as the input

    Example:
        >>> bn = gnnact.nn.BatchNorm1d(64, config=gnnact.Config(bits=2))
        >>> x = torch.randn(1000, 64, requires_grad=True)
        >>> y = bn(x)
        >>> y.shape
        torch.Size([1000, 64])
        >>> y.sum().backward()
        >>> int(bn.num_batches_tracked)
        1
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device: Any = None,
                 dtype: Any = None, *, config: Config | None = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype)
        self._init_gnnact(config)

    _compiled_shape = staticmethod(same_shape)

    def forward(self, x: Tensor) -> Tensor:
        # The same bookkeeping as torch.nn.modules.batchnorm._BatchNorm.forward.
        self._check_input_dim(x)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        keep = not self.training or self.track_running_stats
        return ops.batch_norm(x, self.running_mean if keep else None,
                              self.running_var if keep else None, self.weight, self.bias,
                              use_batch, factor, self.eps, self.config)


class ReLU(_Compressed, nn.ReLU):
    r""":class:`torch.nn.ReLU` keeping a 1-bit mask instead of its output:

    .. math::
        \mathbf{Y} = \max(\mathbf{X}, 0), \qquad
        \nabla \mathbf{X} = \nabla \mathbf{Y} \odot [\mathbf{X} > 0].

    Kept for backward: the mask :math:`[\mathbf{X} > 0]` packed to one bit per element
    (:func:`gnnact.pack_mask`), taken from the exact input, so the gradient is exact; PyTorch
    keeps the full output. The output is computed out of place.

    Args:
        inplace (bool, optional): accepted for compatibility and ignored.
            (default: :obj:`False`)
        config (gnnact.Config, optional): the module's configuration, as for the other
            gnnact layers; the mask is exact whatever ``config.bits``. (default: ``Config()``)

    Shapes:
        - **input:** :math:`(*)`
        - **output:** :math:`(*)`, the same shape

    Example:
        >>> relu = gnnact.nn.ReLU()
        >>> x = torch.randn(4000, 64, requires_grad=True)  # (1 MB: above Config.floor)
        >>> y = relu(x)
        >>> gnnact.memory.saved_bytes(y)  # 256,000 mask bits
        32000
        >>> y.sum().backward()
    """

    def __init__(self, inplace: bool = False, *, config: Config | None = None) -> None:
        super().__init__(inplace)
        self._init_gnnact(config)

    _compiled_shape = staticmethod(same_shape)

    def forward(self, x: Tensor) -> Tensor:
        return ops.relu(x, config=self.config)


class LeakyReLU(_Compressed, nn.LeakyReLU):
    r""":class:`torch.nn.LeakyReLU` keeping a 1-bit mask instead of its input:

    .. math::
        \mathbf{Y} = \mathbf{X} \odot [\mathbf{X} > 0] + s\,\mathbf{X} \odot
        [\mathbf{X} \le 0], \qquad
        \nabla \mathbf{X} = \nabla \mathbf{Y} \odot \big([\mathbf{X} > 0] +
        s\,[\mathbf{X} \le 0]\big).

    Kept for backward: the mask :math:`[\mathbf{X} > 0]` packed to one bit per element, taken
    from the exact input, so the gradient is exact; PyTorch keeps the full input.

    Args:
        negative_slope (float, optional): the slope :math:`s` for negative inputs.
            (default: :obj:`0.01`)
        inplace (bool, optional): accepted for compatibility and ignored.
            (default: :obj:`False`)
        config (gnnact.Config, optional): the module's configuration, as for the other
            gnnact layers; the mask is exact whatever ``config.bits``. (default: ``Config()``)

    Shapes:
        - **input:** :math:`(*)`
        - **output:** :math:`(*)`, the same shape

    Example:
        >>> act = gnnact.nn.LeakyReLU(0.2)
        >>> x = torch.randn(4000, 64, requires_grad=True)  # (1 MB: above Config.floor)
        >>> y = act(x)
        >>> gnnact.memory.saved_bytes(y)  # 256,000 mask bits
        32000
        >>> y.sum().backward()
    """

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False, *,
                 config: Config | None = None) -> None:
        super().__init__(negative_slope, inplace)
        self._init_gnnact(config)

    _compiled_shape = staticmethod(same_shape)

    def forward(self, x: Tensor) -> Tensor:
        return ops.leaky_relu(x, self.negative_slope, config=self.config)


class Dropout(_Compressed, nn.Dropout):
    r""":class:`torch.nn.Dropout` keeping its keep-mask in 1 bit:

    .. math::
        \mathbf{Y} = \frac{\mathbf{X} \odot \mathbf{M}}{1 - p}, \qquad
        \nabla \mathbf{X} = \frac{\nabla \mathbf{Y} \odot \mathbf{M}}{1 - p}, \qquad
        \mathbf{M} \sim \mathrm{Bernoulli}(1 - p),

    in training mode; in evaluation mode (or with :math:`p = 0`) the input is returned as is.
    Kept for backward: :math:`\mathbf{M}` packed to one bit per element (PyTorch keeps a byte
    per element). On the CPU the mask is drawn exactly as :class:`torch.nn.Dropout` draws it,
    so a seeded run reproduces PyTorch's (see :func:`gnnact.ops.dropout`).

    Args:
        p (float, optional): probability :math:`p` of zeroing an element. (default: :obj:`0.5`)
        inplace (bool, optional): accepted for compatibility and ignored.
            (default: :obj:`False`)
        config (gnnact.Config, optional): the module's configuration, as for the other
            gnnact layers; the mask is exact whatever ``config.bits``. (default: ``Config()``)

    Shapes:
        - **input:** :math:`(*)`
        - **output:** :math:`(*)`, the same shape

    Example:
        >>> drop = gnnact.nn.Dropout(p=0.5)
        >>> x = torch.randn(4000, 64, requires_grad=True)  # (1 MB: above Config.floor)
        >>> y = drop(x)
        >>> gnnact.memory.saved_bytes(y)  # 256,000 mask bits
        32000
        >>> drop.eval()(x) is x  # evaluation: identity
        True
    """

    def __init__(self, p: float = 0.5, inplace: bool = False, *,
                 config: Config | None = None) -> None:
        super().__init__(p, inplace)
        self._init_gnnact(config)

    _compiled_shape = staticmethod(same_shape)

    def forward(self, x: Tensor) -> Tensor:
        return ops.dropout(x, self.p, self.training, config=self.config)

