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
from gnnact.nn._base import _Compressed

__all__ = ["BatchNorm1d", "Dropout", "LeakyReLU", "Linear", "ReLU"]


class Linear(_Compressed, nn.Linear):
    r""":class:`torch.nn.Linear` keeping its input at ``config.bits`` bits:
    :math:`Y = X W^\top + b`, :math:`\nabla W = \nabla Y^\top \hat X`."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None, *, config: Config | None = None) -> None:
        super().__init__(in_features, out_features, bias, device, dtype)
        self._init_gnnact(config)

    def forward(self, x: Tensor) -> Tensor:
        return ops.linear(x, self.weight, self.bias, self.config)


class BatchNorm1d(_Compressed, nn.BatchNorm1d):
    r""":class:`torch.nn.BatchNorm1d` keeping its input at ``config.bits`` bits and the batch
    statistics in (at least) float32 (see :func:`gnnact.ops.batch_norm`)."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device: Any = None,
                 dtype: Any = None, *, config: Config | None = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype)
        self._init_gnnact(config)

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
    """:class:`torch.nn.ReLU` keeping a 1-bit mask (``inplace`` is accepted and ignored)."""

    def __init__(self, inplace: bool = False, *, config: Config | None = None) -> None:
        super().__init__(inplace)
        self._init_gnnact(config)

    def forward(self, x: Tensor) -> Tensor:
        return ops.relu(x)


class LeakyReLU(_Compressed, nn.LeakyReLU):
    """:class:`torch.nn.LeakyReLU` keeping a 1-bit mask (``inplace`` is ignored)."""

    def __init__(self, negative_slope: float = 0.01, inplace: bool = False, *,
                 config: Config | None = None) -> None:
        super().__init__(negative_slope, inplace)
        self._init_gnnact(config)

    def forward(self, x: Tensor) -> Tensor:
        return ops.leaky_relu(x, self.negative_slope)


class Dropout(_Compressed, nn.Dropout):
    """:class:`torch.nn.Dropout` keeping its keep-mask in 1 bit (``inplace`` is ignored)."""

    def __init__(self, p: float = 0.5, inplace: bool = False, *,
                 config: Config | None = None) -> None:
        super().__init__(p, inplace)
        self._init_gnnact(config)

    def forward(self, x: Tensor) -> Tensor:
        return ops.dropout(x, self.p, self.training)

