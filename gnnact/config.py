"""``gnnact.Config``: how the context of compressed layers is stored."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from gnnact.quant.backends import BACKENDS
from gnnact.quant.core import DEFAULT_GROUP_SIZE, _check_int
from gnnact.quant.packed import SUPPORTED_BITS

__all__ = ["AUTO_START", "GPU_FLOOR_SHARE", "GPU_PASS_SHARE", "MIN_BYTES", "Config",
           "device_floor", "device_memory"]

#: The width every tensor starts at with automatic widths (``bits=None``), until the first
#: probe; also the width of a layer used on its own with such a config.
AUTO_START = 2

#: Bytes below which a tensor is kept as it is (``Config.min_bytes=None``): 256 KiB, 64Ki
#: float32 values. Compressing a tensor costs a fixed time (its op's bookkeeping and the
#: quantizer's calls: 0.5–0.7 ms on a CPU core with the torch quantizer, 118–124 µs with the
#: compiled one) plus a time per value (9–13 ns, and 2.5–3.6 ns); below 33–60K values
#: (130–240 kB) the fixed part is the larger either way (``benchmarks/bench_floor.py``, rows
#: ``floor.jsonl``: 256 KiB is the power of two above), and the bytes at stake, at most 256
#: KiB a tensor, are negligible beside any device's memory.
MIN_BYTES = 256 << 10

#: On a GPU the floor is this share of its memory (36 MiB on an H200, 20 MiB on an 80 GB H100),
#: :data:`MIN_BYTES` at least. There a compressed tensor's fixed cost is the host's (the op's
#: bookkeeping, the kernels' launches: about as long as the GPU takes to read 100 MB), and a
#: small graph's step is nothing but such costs: Cora's converted GCN, its 15.5 MB features
#: compressed, stepped 1.9x PyG's on an H200 (the blocks of its backward already sized for the
#: device), where its whole context is a ten-thousandth of the device's memory. A hundred
#: tensors under this floor hold 2.4 % of it.
GPU_FLOOR_SHARE = 4096

#: On a GPU a pass whose compression saves less than this share of its memory (140 MiB on an
#: H200, 80 MiB on an 80 GB H100) runs as PyTorch's (``Config.min_pass_savings=None``): it
#: would free under 0.1 % of the device, and there its cost is the host's, which a graph of
#: that size does not hide (about 1.6 ms of bookkeeping and launches a compressed layer:
#: CiteSeer's converted GCN, saving 45 MB, stepped 1.9x PyG's on an H200; Amazon Photo's
#: TransformerConv, its 813 MB of context every tensor under the tensor floor, saving
#: nothing, 2.7x). A pass that frees more is compressed as ever (a GCN on an ogbn-arxiv-sized
#: graph saves ~0.5 GB, and stepped 0.79x PyG's): those are the graphs gnnact is for.
GPU_PASS_SHARE = 1024


@functools.cache
def device_memory(device: torch.device) -> int:
    """Bytes of memory of the GPU ``device`` (read once per device)."""
    return torch.cuda.get_device_properties(device).total_memory


def device_floor(device: torch.device, least: int, share: int) -> int:
    """``least`` bytes, on a GPU a ``share``-th of its memory if that is more (``least`` with a
    share of 0): the floors of :meth:`Config.floor_for` and of
    :func:`gnnact.nn.chunked.message_floor`."""
    if device.type != "cuda" or not share:
        return least
    return max(least, device_memory(device) // share)


@dataclass(frozen=True)
class Config:
    r"""How gnnact layers and ops store what backward needs.

    Args:
        bits (int, optional): bits per value of compressed activations (layer inputs, BatchNorm
            inputs): 1 to 8, or 16/32 to keep them uncompressed, the same for every tensor.
            ``Config(bits=32)`` reproduces PyG exactly. :obj:`None` chooses the widths
            automatically in a model converted by :func:`gnnact.convert`: each compressed
            tensor gets its own width, ``avg_bits`` on average, and more wherever its
            rounding noise is not small against the gradient it feeds
            (:mod:`gnnact.adaptive.auto`); they start at 2 bits, and used on its own (a
            gnnact layer or a :class:`gnnact.compress_saved_tensors` outside a converted
            model) it stores at 2 bits (:attr:`width`). (default: :obj:`None`)
        group_size (int, optional): quantization group size :math:`G`; scale and zero cost
            :math:`64/G` bits per value. (default: :obj:`512`)
        per_row (bool, optional): one group per node row instead of :math:`G` consecutive
            values. (default: :obj:`False`)
        attention_bits (int, optional): bits of GAT's per-head attention coefficients. When
            :obj:`None`: 8 while ``bits`` is at most 8 (a fixed 4 bits collapses GAT, GACT
            Table 3), else ``bits``, so that ``Config(bits=32)`` is exact. (default: :obj:`None`)
        backend (str, optional): ``"auto"``, ``"torch"``, ``"cupy"`` or ``"cpu"``, as in
            :func:`gnnact.quantize`. (default: :obj:`"auto"`)
        resident_inputs (bool, optional): keep a tensor that needs no gradient and does not
            come out of autograd (the input feature matrix) by reference instead of as a packed
            copy: it stays in memory anyway, so a copy would add bytes, not save them, and the
            first layer's weight gradient stays exact. Outputs of gnnact's own ops on such a
            tensor (input dropout, say) are temporaries and are still packed. Set it to
            :obj:`False` when such inputs are other temporaries, e.g. features computed under
            :func:`torch.no_grad` by a frozen encoder. (default: :obj:`True`)
        per_node (bool, optional): per-node mixed precision (ActNN's per-sample allocation,
            nodes as samples): each row of a ``[N, F]`` activation gets its own width, ``bits``
            on average, from the norm of the gradient that reached it at the previous step
            times its range; rows with no gradient get 1 bit. Costs one group per row and a
            4-byte row index. Off until measured to help (see the README).
            (default: :obj:`False`)
        tag (str, optional): the name this module's compressed tensors go by (its path in the
            model), for per-node precision and :class:`gnnact.Controller`; set by
            :func:`gnnact.convert`. (default: :obj:`None`)
        offload (bool, optional): in :class:`gnnact.compress_saved_tensors`, move the
            compressed context (gnnact layers' included) to pinned host memory during forward
            and prefetch it back during backward (:mod:`gnnact.swap`). CUDA tensors only; a
            no-op on the CPU. (default: :obj:`False`)
        prefetch_depth (int, optional): with :obj:`offload`, how many saved items backward
            copies in ahead of the one it reads. (default: :obj:`1`)
        chunk_messages (bool, optional): :func:`gnnact.convert` runs the message passing of
            PyG convs without a twin in chunks, so that their :math:`E \times F` messages never
            exist whole where they are large (from
            :data:`gnnact.nn.chunked.MIN_MESSAGE_BYTES`, 64 MiB; smaller ones are made whole,
            as pieces cost time): by feature columns (``GINConv``,
            ``GraphConv``, ``ChebConv``, …; outputs and gradients are PyG's bit for bit) or by
            blocks of targets (``TransformerConv``, ``GINEConv``, ``PNAConv``, ``NNConv``,
            …: :data:`gnnact.nn.chunked.BY_TARGET`; equal to PyG's up to float rounding).
            (default: :obj:`True`)
        avg_bits (float, optional): with ``bits=None``, the average bits per compressed value
            that the automatic widths (2 to 8 bits each) aim at, from 2 to 8.
            (default: :obj:`3.0`)
        max_noise (float, optional): with ``bits=None``, the largest ratio of a tensor's
            rounding noise to the gradient it feeds (:mod:`gnnact.adaptive.auto`) that a width
            may leave: a tensor above it gets more bits, beyond ``avg_bits`` if need be.
            (default: :obj:`0.25`)
        adapt_interval (int, optional): with ``bits=None``, the longest gap, in training
            steps, between two measurements of the noise ratios; the first ones come sooner
            (after 1, 2, 4, … steps). (default: :obj:`100`)
        self_check (bool, optional): with a fixed ``bits``, measure each tensor's noise ratio
            at step 10 and every ``adapt_interval`` steps after, and warn where it exceeds
            ``max_noise`` (the widths stay as they are). (default: :obj:`True`)
        compact_indices (bool, optional): in :class:`gnnact.compress_saved_tensors` (and so in
            a converted model), keep the integer and boolean tensors autograd saves (a
            scatter's edge targets, a gather's sources, masks) exactly in fewer bytes: once per
            broadcast, in the narrowest integer dtype that holds them, booleans at one bit
            (:mod:`gnnact.compress.lossless`). Backward computes the same. Not with ``bits``
            of 32, which keeps everything as it is. (default: :obj:`True`)
        min_bytes (int, optional): a tensor of fewer bytes is kept as it is, and the op that
            saves it runs as PyTorch's: its compressed copy would save next to nothing and
            cost time (the quantizer's fixed cost outweighs its per-value cost below 170–240
            kB on a CPU core). :func:`gnnact.summary` reports how many tensors a step kept
            so, and their bytes. :obj:`0` compresses every tensor. (default: :obj:`None`:
            :data:`MIN_BYTES`, 256 KiB; on a GPU a :data:`GPU_FLOOR_SHARE`-th of its memory if
            that is more, 36 MiB on an H200: :meth:`floor_for`)
        min_pass_savings (int, optional): a pass of a converted model whose compression
            saves fewer bytes (its context as PyTorch keeps it, less gnnact's) runs as
            PyTorch's on inputs no larger (its first pass, a full one, measures both; a pass
            run so whose context grows by as much, with a tensor over ``min_bytes``, sends
            the next back to full ones).
            :obj:`0`: a pass runs as PyTorch's only when every tensor is under
            ``min_bytes``. (default: :obj:`None`: on a GPU a :data:`GPU_PASS_SHARE`-th of
            its memory, 140 MiB on an H200, unless ``min_bytes`` is set; :obj:`0` on the
            CPU, where a compressed step runs about as fast as PyTorch's:
            :meth:`min_savings`)

    Raises:
        TypeError: if a field has the wrong type (``per_row="yes"``, ``bits=2.0``, a
            :obj:`bool` for an int).
        ValueError: if a field has an unsupported value (``bits=9``, ``group_size=0``,
            ``backend="numba"``).

    Example:
        >>> gnnact.Config().width  # automatic: 2 bits until a converted model adapts them
        2
        >>> config = gnnact.Config(bits=4, group_size=256)
        >>> config.attention  # attention_bits=None: 8 bits while bits is at most 8
        8
        >>> gnnact.Config(bits=32).exact  # nothing quantized: layers match PyG
        True
        >>> model = gnnact.convert(torch.nn.Sequential(torch.nn.Linear(16, 8)), config)
        >>> model[0].config.bits, model[0].config.tag
        (4, '0')
    """

    bits: int | None = None
    group_size: int = DEFAULT_GROUP_SIZE
    per_row: bool = False
    attention_bits: int | None = None
    backend: str = "auto"
    resident_inputs: bool = True
    per_node: bool = False
    tag: str | None = None
    offload: bool = False
    prefetch_depth: int = 1
    chunk_messages: bool = True
    compact_indices: bool = True
    avg_bits: float = 3.0
    max_noise: float = 0.25
    adapt_interval: int = 100
    self_check: bool = True
    min_bytes: int | None = None
    min_pass_savings: int | None = None

    def __post_init__(self) -> None:
        # Every field, at construction: a wrong value fails here, naming the field, not deep
        # inside a forward pass (or, for a flag, is silently taken as true: per_row="no").
        for name in ("bits", "attention_bits"):
            value = getattr(self, name)
            if value is None:
                continue
            if _check_int(f"Config.{name}", value) not in SUPPORTED_BITS:
                raise ValueError(f"Config.{name} must be one of {SUPPORTED_BITS}, got {value!r}")
        if _check_int("Config.group_size", self.group_size) <= 0:
            raise ValueError(f"Config.group_size must be a positive int, got {self.group_size!r}")
        for name in ("avg_bits", "max_noise"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"Config.{name} must be a float, got {value!r} "
                                f"({type(value).__name__})")
        if not 2 <= self.avg_bits <= 8:  # (the automatic widths are 2 to 8 bits)
            raise ValueError(f"Config.avg_bits must be in [2, 8], got {self.avg_bits!r}")
        if not (self.max_noise > 0 and math.isfinite(self.max_noise)):
            raise ValueError(f"Config.max_noise must be positive and finite, got "
                             f"{self.max_noise!r}")
        if _check_int("Config.adapt_interval", self.adapt_interval) < 1:
            raise ValueError(f"Config.adapt_interval must be a positive int, got "
                             f"{self.adapt_interval!r}")
        if _check_int("Config.prefetch_depth", self.prefetch_depth) < 0:
            raise ValueError(f"Config.prefetch_depth must be a non-negative int, got "
                             f"{self.prefetch_depth!r}")
        for name in ("min_bytes", "min_pass_savings"):
            value = getattr(self, name)
            if value is not None and _check_int(f"Config.{name}", value) < 0:
                raise ValueError(f"Config.{name} must be a non-negative int or None, got "
                                 f"{value!r}")
        for name in ("per_row", "resident_inputs", "per_node", "offload", "chunk_messages",
                     "compact_indices", "self_check"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise TypeError(f"Config.{name} must be a bool, got {value!r} "
                                f"({type(value).__name__})")
        for name in ("tag", "backend"):
            value = getattr(self, name)
            if not (isinstance(value, str) or (name == "tag" and value is None)):
                kind = "a str or None" if name == "tag" else "a str"
                raise TypeError(f"Config.{name} must be {kind}, got {value!r} "
                                f"({type(value).__name__})")
        if self.backend not in BACKENDS:
            raise ValueError(f"Config.backend must be one of {BACKENDS}, got {self.backend!r}")

    @property
    def automatic(self) -> bool:
        """``True`` when the widths are chosen automatically (``bits=None``)."""
        return self.bits is None

    @property
    def width(self) -> int:
        """The bits per value the ops store at: ``bits``, or 2 when automatic (the width a
        converted model starts every tensor at, before its first probe; it adapts them)."""
        return self.bits if self.bits is not None else AUTO_START

    @property
    def attention(self) -> int:
        """The resolved bit width of attention coefficients."""
        if self.attention_bits is not None:
            return self.attention_bits
        return 8 if self.width <= 8 else self.width

    @property
    def floor(self) -> int:
        """Bytes below which a tensor on the CPU is kept as it is: ``min_bytes``, or
        :data:`MIN_BYTES` (:meth:`floor_for` any device)."""
        return MIN_BYTES if self.min_bytes is None else self.min_bytes

    def floor_for(self, device: torch.device) -> int:
        """Bytes below which a tensor on ``device`` is kept as it is: ``min_bytes``, or
        :data:`MIN_BYTES`, on a GPU a :data:`GPU_FLOOR_SHARE`-th of its memory if that is
        more (none with a share of 0)."""
        if self.min_bytes is not None:
            return self.min_bytes
        return device_floor(device, MIN_BYTES, GPU_FLOOR_SHARE)

    def min_savings(self, device: torch.device) -> int:
        """The fewest bytes a pass's compression must save on ``device``, or it runs as
        PyTorch's, whatever its tensors' sizes: ``min_pass_savings``, or on a GPU a
        :data:`GPU_PASS_SHARE`-th of its memory unless ``min_bytes`` is set (0 elsewhere:
        the tensors' floor decides alone)."""
        if self.min_pass_savings is not None:
            return self.min_pass_savings
        if self.min_bytes is not None:
            return 0
        return device_floor(device, 0, GPU_PASS_SHARE)

    def keeps(self, x: Tensor) -> bool:
        """Whether ``x`` is below the floor of its device (:meth:`floor_for`): kept as it is,
        its op run as PyTorch's."""
        return x.numel() * x.element_size() < self.floor_for(x.device)

    @property
    def exact(self) -> bool:
        """``True`` when nothing is quantized: layers then match PyG exactly."""
        return self.width == 32 and self.attention == 32
