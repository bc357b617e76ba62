r"""The halo exchange: owned rows in, ``[owned; halo]`` rows out, as an autograd op.

For a rank :math:`r` with owned rows :math:`X_{O_r}` (see :mod:`gnnact.distributed.shard`):

.. math::
    \text{forward:}\quad
    \begin{bmatrix} X_{O_r} \\ \hat X_{H_r} \end{bmatrix}, \qquad
    \hat X_{H_{r \leftarrow q}} = Q_b\big(X_{H_{r \leftarrow q}}\big)
    \ \text{received from the owner } q,

    \text{backward:}\quad
    \nabla X_{O_r} = G_{O_r} + \sum_{q} S_{r \to q}^\top\, Q_{b'}\big(G_{H_{q \leftarrow r}}\big),

where :math:`G` is the gradient of the output, :math:`S_{r \to q}` selects the rows peer
:math:`q` needs (``send_index[q]``), the sum is an ``index_add`` (a node in several peers'
halos collects a gradient from each), and :math:`Q_b` is the identity at 32 bits and
:mod:`~gnnact.distributed.codec`'s stochastic rounding otherwise, so that
:math:`\mathbb{E}[Q_b(v)] = v` and both the forward values and the gradients stay unbiased.

Each direction is one ``isend``/``irecv`` pair per peer that has rows to exchange
(point-to-point works on every backend, gloo included; ``all_to_all`` does not), all posted
before any is waited on. :attr:`HaloExchange.stats` counts what this rank sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from gnnact.distributed.codec import check_bits, decode, encode, payload_nbytes
from gnnact.distributed.shard import GraphShard
from gnnact.quant import DEFAULT_GROUP_SIZE
from gnnact.quant.rng import PassSeeds

__all__ = ["ExchangeStats", "HaloExchange"]


@dataclass
class ExchangeStats:
    """What one rank sent: payload bytes and messages, forward (values) and backward
    (gradients), since the last :meth:`HaloExchange.reset_stats`.

    Args:
        forward_bytes (int): payload bytes of the forward exchanges.
        backward_bytes (int): payload bytes of the backward exchanges.
        forward_messages (int): messages sent forward.
        backward_messages (int): messages sent backward.

    Example:
        >>> stats = gnnact.distributed.ExchangeStats(1000, 800, 2, 2)
        >>> stats.total_bytes
        1800
    """

    forward_bytes: int = 0
    backward_bytes: int = 0
    forward_messages: int = 0
    backward_messages: int = 0

    @property
    def total_bytes(self) -> int:
        return self.forward_bytes + self.backward_bytes


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, exchange: HaloExchange) -> Tensor:
        # The exchange object (not its index tensors) is what backward needs: the plan belongs
        # to the shard, not to this step's context.
        ctx.exchange = exchange
        return exchange.gather(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return ctx.exchange.scatter_add(grad), None


class HaloExchange:
    r"""The halo exchange of one :class:`~gnnact.distributed.GraphShard` over a process group
    (module docstring): ``exchange(x)`` maps the owned rows ``x`` (``[num_owned, ...]``) to
    ``[num_local, ...]`` rows, differentiably.

    One object serves every layer: the plan is the shard's, the width is the object's, and
    :attr:`stats` adds up over the layers until :meth:`reset_stats`.

    Args:
        shard (GraphShard): this rank's shard; ``shard.rank`` and ``shard.world_size`` must be
            this process's rank and size in ``group``.
        group (torch.distributed.ProcessGroup, optional): the ranks of the partition.
            (default: the default group)
        bits (int, optional): width of the forward values: 1–8 (stochastic rounding), 16
            (bfloat16) or 32 (exact). (default: :obj:`32`)
        grad_bits (int, optional): width of the backward gradients. (default: ``bits``)
        group_size (int, optional): values per quantization group :math:`G`.
            (default: :obj:`512`)

    Example:
        >>> # in each process of a 2-rank gloo group
        >>> exchange = gnnact.distributed.HaloExchange(shard, bits=2)  # doctest: +SKIP
        >>> x_local = exchange(shard.x)  # [num_owned + num_halo, F]  # doctest: +SKIP
        >>> exchange.stats.forward_bytes  # doctest: +SKIP
        17000
    """

    def __init__(self, shard: GraphShard, group: dist.ProcessGroup | None = None, *,
                 bits: int = 32, grad_bits: int | None = None,
                 group_size: int = DEFAULT_GROUP_SIZE) -> None:
        if not isinstance(shard, GraphShard):
            raise TypeError(f"shard must be a GraphShard, got {type(shard).__name__}")
        self.bits = check_bits("bits", bits)
        self.grad_bits = self.bits if grad_bits is None else check_bits("grad_bits", grad_bits)
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
            raise ValueError(f"group_size must be a positive int, got {group_size!r}")
        world_size, rank = dist.get_world_size(group), dist.get_rank(group)
        if (shard.rank, shard.world_size) != (rank, world_size):
            raise ValueError(f"shard is part {shard.rank} of {shard.world_size}, but this process "
                             f"is rank {rank} of {world_size} in group")
        self.shard, self.group, self.group_size = shard, group, group_size
        # Halo rows of each peer: a contiguous block of [owned; halo], in peer order.
        self._recv_slices: dict[int, slice] = {}
        start = shard.num_owned
        for peer, count in sorted(shard.recv_counts.items()):
            self._recv_slices[peer] = slice(start, start + count)
            start += count
        self.stats = ExchangeStats()
        # Rounding seeds of the exchange's own (not from the default generator, whose stream
        # is the dropout masks'): a fresh stream for each forward call, which its backward
        # continues.
        self._seeds = PassSeeds()
        self._rounding = self._seeds.generator()

    def __call__(self, x: Tensor) -> Tensor:
        if not isinstance(x, Tensor) or x.dim() < 1 or x.size(0) != self.shard.num_owned:
            shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must have num_owned={self.shard.num_owned} rows, got {shape}")
        self._rounding = self._seeds.generator()
        return _Exchange.apply(x, self)

    def reset_stats(self) -> None:
        """Start counting from zero (call it at the start of a step for per-step bytes).

        Example:
            >>> exchange.reset_stats()  # doctest: +SKIP
        """
        self.stats = ExchangeStats()

    # ------------------------------------------------------------------ the two directions

    def gather(self, x: Tensor, bits: int | None = None) -> Tensor:
        """Forward, without autograd: ``[x; halo rows from their owners]`` (at ``bits``, by
        default the object's)."""
        feat = x.shape[1:]
        sends = {peer: x[index] for peer, index in self.shard.send_index.items()}
        shapes = {peer: (s.stop - s.start, *feat) for peer, s in self._recv_slices.items()}
        bits = self.bits if bits is None else check_bits("bits", bits)
        received = self._swap(sends, shapes, x, bits, forward=True)
        return torch.cat([x, *(received[peer] for peer in sorted(received))])

    def scatter_add(self, grad: Tensor) -> Tensor:
        """Backward, without autograd: the owned rows' gradient plus the halo gradients that
        the peers send back."""
        feat = grad.shape[1:]
        sends = {peer: grad[s] for peer, s in self._recv_slices.items()}
        shapes = {peer: (index.numel(), *feat) for peer, index in self.shard.send_index.items()}
        received = self._swap(sends, shapes, grad, self.grad_bits, forward=False)
        out = grad[:self.shard.num_owned].clone()
        for peer in sorted(received):
            out.index_add_(0, self.shard.send_index[peer], received[peer])
        return out

    def _swap(self, sends: dict[int, Tensor], shapes: dict[int, tuple[int, ...]],
              like: Tensor, bits: int, *, forward: bool) -> dict[int, Tensor]:
        """Send ``sends[peer]`` to each peer and receive a ``shapes[peer]`` tensor (dtype and
        device of ``like``) from each, at ``bits``; all receives are posted before the sends
        so no rank waits on another's order."""
        group = self.group or dist.group.WORLD
        dtype = like.dtype
        buffers, requests = {}, []
        for peer, shape in shapes.items():
            numel = torch.Size(shape).numel()
            if numel == 0:  # a zero-width feature: nothing travels
                continue
            buffers[peer] = torch.empty(payload_nbytes(numel, dtype, bits, self.group_size),
                                        dtype=torch.uint8, device=like.device)
            requests.append(dist.irecv(buffers[peer], dist.get_global_rank(group, peer),
                                       group=self.group))
        sent = 0
        payloads = []  # kept alive until the sends complete
        for peer, rows in sends.items():
            if rows.numel() == 0:
                continue
            payload = encode(rows, bits, self.group_size, self._rounding)
            payloads.append(payload)
            sent += payload.numel()
            requests.append(dist.isend(payload, dist.get_global_rank(group, peer),
                                       group=self.group))
        for request in requests:
            request.wait()
        if forward:
            self.stats.forward_bytes += sent
            self.stats.forward_messages += len(payloads)
        else:
            self.stats.backward_bytes += sent
            self.stats.backward_messages += len(payloads)
        out = {peer: decode(buffers[peer], shape, dtype, bits, self.group_size)
               if peer in buffers else like.new_zeros(shape)
               for peer, shape in shapes.items()}
        return out
